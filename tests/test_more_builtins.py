"""The "more builtins" of the language, partitioned: each against numpy on ref, and every backend
(sim, jax, xla) against ref, on even and uneven splits of the dims they work along and of others.

The plans are asserted too: which collectives run and how many bytes they move, so that a builtin
that quietly gathers what it need not fails here even when its numbers are right.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import spmdlang
from spmdlang.ir.verify import verify

ALL = ("ref", "sim", "jax", "xla")
f32 = np.float32


def erf(x):
    return np.vectorize(math.erf)(np.asarray(x, np.float64))


def run_sharded(src: str, inputs: dict, want, backends=ALL, tol=1e-5):
    """Compile `src`, check ref against numpy `want` (an array or a tuple) and every backend
    against ref on the same inputs; returns the compiled program for plan assertions."""
    c = spmdlang.compile(src)
    verify(c.spmd.program)
    got = c.run(inputs, backend="ref")
    wants = list(want) if isinstance(want, tuple) else [want]
    assert len(got) == len(wants)
    for i, (g, w) in enumerate(zip(got, wants)):
        w = np.asarray(w)
        assert g.shape == w.shape and g.dtype == w.dtype, (i, g.shape, g.dtype, w.shape, w.dtype)
        if w.dtype.kind == "f":
            np.testing.assert_allclose(g, w, rtol=tol, atol=tol, err_msg=f"result {i}")
        else:
            np.testing.assert_array_equal(g, w, err_msg=f"result {i}")
    d = c.diff(inputs, backends=list(backends))
    assert d["ok"], f"{d['results']}\n{src}\n{c.spmd_ir}"
    return c


def kinds(c) -> list[str]:
    return [e.kind for e in c.spmd.ledger]


def total_bytes(c) -> float:
    return sum(e.bytes_per_device for e in c.spmd.ledger)


# mesh size, rows, spec: even and uneven splits, of the first (worked) dim and of the other
LAYOUTS = [(2, 8, "{p, _}"), (3, 7, "{p, _}"), (3, 7, "{_, p}"), (4, 6, "{_, p}"), (3, 7, "{_, _}")]


# ---------------------------------------------------------------------------------- elementwise


def _elementwise_ref(x, y, i, j):
    g = 0.5 * x * (1 + erf(x / np.sqrt(2)))
    t = np.clip(g + erf(x) + np.log1p(np.abs(x)) + np.expm1(np.tanh(x)) + np.square(x), -1.0, 2.0)
    jj = np.where(j == 0, 1, j)
    return (t.astype(f32), np.floor_divide(x, y), np.mod(x, y),
            np.where(j == 0, 0, i // jj).astype(np.int32), np.where(j == 0, 0, i % jj).astype(np.int32))


@pytest.mark.parametrize("k, n, spec", LAYOUTS)
def test_elementwise_builtins_sharded(k, n, spec):
    rng = np.random.default_rng(k * n)
    x = rng.standard_normal((n, 5)).astype(f32)
    y = rng.choice([-1.5, -0.5, 0.75, 2.0], (n, 5)).astype(f32)
    i = rng.integers(-9, 9, (n, 5)).astype(np.int32)
    j = rng.integers(-3, 4, (n, 5)).astype(np.int32)  # zeros included
    src = f"""mesh [p={k}]
func main(x: f32[{n}, 5] {spec}, y: f32[{n}, 5] {spec}, i: i32[{n}, 5] {spec}, j: i32[{n}, 5])
    -> (f32[{n}, 5] {spec}, f32[{n}, 5], f32[{n}, 5] {spec}, i32[{n}, 5] {spec}, i32[{n}, 5]) {{
  t = clip(gelu(x, approximate=false) + erf(x) + log1p(abs(x)) + expm1(tanh(x)) + square(x), -1.0, 2.0)
  return t, x // y, x % y, i // j, i % j
}}
"""
    c = run_sharded(src, {"x": x, "y": y, "i": i, "j": j}, _elementwise_ref(x, y, i, j))
    # elementwise: nothing moves except what the unsplit parameter j and results ask for
    assert all(e.kind == "all_gather" for e in c.spmd.ledger)


def test_static_floordiv_and_mod_fold_where_a_static_integer_stands():
    src = """mesh [p=2]
const N = 9
func main(x: f32[4, N] {p, _}) -> f32[4, N // 2 + N % 4] {
  return x[:, 0:N // 2 + N % 4]
}
"""
    x = np.arange(36, dtype=f32).reshape(4, 9)
    run_sharded(src, {"x": x}, x[:, :5], backends=("ref", "sim"))


@pytest.mark.parametrize("expr", ["N // 0", "N % (N - 9)"])
def test_static_division_by_zero_is_a_located_error(expr):
    src = f"mesh [p=2]\nconst N = 9\nfunc main(x: f32[4, N]) -> f32[4, 1] {{\n  return x[:, 0:{expr}]\n}}\n"
    with pytest.raises(spmdlang.SpmdError, match="static division by zero") as e:
        spmdlang.compile(src)
    assert ":4:" in str(e.value)


# ---------------------------------------------------------------------------------- scans


def _scan(fn, x, axis, reverse):
    y = np.flip(x, axis) if reverse else x
    y = fn(y, axis=axis, dtype=x.dtype)
    return np.flip(y, axis) if reverse else y


@pytest.mark.parametrize("k, n, spec", LAYOUTS)
@pytest.mark.parametrize("reverse", [False, True])
def test_scans_sharded(k, n, spec, reverse):
    rng = np.random.default_rng(k * n + reverse)
    x = rng.standard_normal((n, 5)).astype(f32)
    i = rng.integers(-3, 4, (n, 5)).astype(np.int32)
    b = rng.random((n, 5)) < 0.5
    r = "true" if reverse else "false"
    src = f"""mesh [p={k}]
func main(x: f32[{n}, 5] {spec}, i: i32[{n}, 5] {spec}, b: bool[{n}, 5] {spec})
    -> (f32[{n}, 5] {spec}, f32[{n}, 5], i32[{n}, 5] {spec}, i32[{n}, 5], f32[{n}, 5] {spec}, i32[{n}, 5]) {{
  return cumsum(x, 0, {r}), cumprod(1.0 + 0.1 * x, 0, {r}), cumprod(i, 0, {r}), cummax(i, 0, {r}), \\
    cummax(x, 1, {r}), cumsum(b, 0, {r})
}}
""".replace("\\\n    ", "")
    want = (_scan(np.add.accumulate, x, 0, reverse), _scan(np.multiply.accumulate, 1 + f32(0.1) * x, 0, reverse),
            _scan(np.multiply.accumulate, i, 0, reverse), _scan(np.maximum.accumulate, i, 0, reverse),
            _scan(np.maximum.accumulate, x, 1, reverse), _scan(np.add.accumulate, b.astype(np.int32), 0, reverse))
    run_sharded(src, {"x": x, "i": i, "b": b}, want)


@pytest.mark.parametrize("n", [64, 255])
@pytest.mark.parametrize("kind", ["cumsum", "cumprod", "cummax"])
def test_scan_along_a_split_dim_gathers_one_total_per_row_and_shard(n, kind):
    """One all_gather of k totals per row: the bytes grow with the shards, never with the row."""
    from spmdlang.partition.reshard import step_bytes

    src = f"""mesh [p=4]
func main(x: f32[6, {n}] {{_, p}}) -> f32[6, {n}] {{_, p}} {{
  return {kind}(x, 1)
}}
"""
    c = spmdlang.compile(src)
    verify(c.spmd.program)
    assert kinds(c) == ["all_gather"]
    assert c.spmd.ledger[0].axes == ("p",)
    assert total_bytes(c) == step_bytes("all_gather", 4, 6 * 1 * 4)
    d = c.diff(backends=["ref", "sim"])
    assert d["ok"], d["results"]


def test_scan_along_an_unsplit_dim_is_local():
    c = spmdlang.compile("""mesh [p=3]
func main(x: f32[7, 9] {p, _}) -> f32[7, 9] {p, _} {
  return cumsum(x, 1) + cummax(x, -1, reverse=true)
}
""")
    assert kinds(c) == []


# ---------------------------------------------------------------------------------- top_k, sort


def _top_k(x, k):
    key = -(x.astype(np.float64) if x.dtype.kind == "f" else x.astype(np.int64))
    order = np.argsort(key, axis=-1, kind="stable")[..., :k]
    return np.take_along_axis(x, order, -1), order.astype(np.int32)


@pytest.mark.parametrize("k, n, spec", [(2, 8, "{p, _}"), (2, 8, "{_, p}"), (3, 7, "{_, p}"), (4, 9, "{_, p}"),
                                        (3, 7, "{p, _}")])
@pytest.mark.parametrize("top", [1, 3, 5])
def test_top_k_sharded(k, n, spec, top):
    rng = np.random.default_rng(n * top)
    x = rng.standard_normal((5, n)).astype(f32)
    i = rng.integers(-2, 3, (5, n)).astype(np.int32)  # many ties across shards
    src = f"""mesh [p={k}]
func main(x: f32[5, {n}] {spec}, i: i32[5, {n}] {spec})
    -> (f32[5, {top}], i32[5, {top}], i32[5, {top}], i32[5, {top}]) {{
  v, vi = top_k(x, {top})
  w, wi = top_k(i, {top})
  return v, vi, w, wi
}}
"""
    run_sharded(src, {"x": x, "i": i}, _top_k(x, top) + _top_k(i, top))


@pytest.mark.parametrize("n", [64, 256])
@pytest.mark.parametrize("top", [2, 4])
def test_top_k_along_a_split_dim_moves_k_candidates_per_shard(n, top):
    """Two all_gathers (values, global indices) of k per row and shard: bytes scale with k x shards,
    not with the row."""
    from spmdlang.partition.reshard import step_bytes

    c = spmdlang.compile(f"""mesh [p=4]
func main(x: f32[6, {n}] {{_, p}}) -> (f32[6, {top}], i32[6, {top}]) {{
  v, i = top_k(x, {top})
  return v, i
}}
""")
    verify(c.spmd.program)
    assert kinds(c) == ["all_gather", "all_gather"]
    assert total_bytes(c) == 2 * step_bytes("all_gather", 4, 6 * top * 4)
    d = c.diff(backends=["ref", "sim"])
    assert d["ok"], d["results"]


@pytest.mark.parametrize("k, n, spec", LAYOUTS)
def test_sort_argsort_sharded(k, n, spec):
    rng = np.random.default_rng(n)
    x = rng.integers(-3, 3, (n, 6)).astype(f32)  # ties: stability shows
    src = f"""mesh [p={k}]
func main(x: f32[{n}, 6] {spec}) -> (f32[{n}, 6], i32[{n}, 6] {spec}, f32[{n}, 6], i32[{n}, 6]) {{
  return sort(x), argsort(x), sort(x, 0), argsort(x, axis=0)
}}
"""
    want = (np.sort(x, -1), np.argsort(x, -1, kind="stable").astype(np.int32),
            np.sort(x, 0), np.argsort(x, 0, kind="stable").astype(np.int32))
    run_sharded(src, {"x": x}, want)


def test_sort_gathers_only_its_split_sorted_dim_and_explain_says_so():
    c = spmdlang.compile("""mesh [p=2, q=3]
func main(x: f32[8, 9] {p, q}) -> f32[8, 9] {p, _} {
  return sort(x, 1)
}
""")
    assert [(e.kind, e.axes) for e in c.spmd.ledger] == [("all_gather", ("q",))]
    assert "a split sorted dim is gathered whole" in c.spmd.ledger[0].reason
    import json

    assert "a split sorted dim is gathered whole" in json.dumps(c.explain_report())


# ---------------------------------------------------------------------------------- take_along_axis


@pytest.mark.parametrize("k, n, spec", LAYOUTS)
def test_take_along_axis_sharded(k, n, spec):
    rng = np.random.default_rng(n + k)
    x = rng.standard_normal((n, 6)).astype(f32)
    i0 = rng.integers(-2, n + 2, (4, 6)).astype(np.int32)
    i1 = rng.integers(-2, 8, (n, 3)).astype(np.int32)
    src = f"""mesh [p={k}]
func main(x: f32[{n}, 6] {spec}, i0: i32[4, 6], i1: i32[{n}, 3] {spec}) -> (f32[4, 6], f32[{n}, 3] {spec}) {{
  return take_along_axis(x, i0, 0), take_along_axis(x, i1, 1)
}}
"""
    want = (np.take_along_axis(x, np.clip(i0, 0, n - 1), 0), np.take_along_axis(x, np.clip(i1, 0, 5), 1))
    run_sharded(src, {"x": x, "i0": i0, "i1": i1}, want)


@pytest.mark.parametrize("n", [60, 240])
def test_take_along_a_split_axis_is_a_masked_lookup_and_one_all_reduce(n):
    """Like a vocab-split take: no gather of x, one all_reduce of the (small) result."""
    from spmdlang.partition.reshard import step_bytes

    c = spmdlang.compile(f"""mesh [p=4]
func main(x: f32[8, {n}] {{_, p}}, i: i32[8, 2]) -> f32[8, 2] {{
  return take_along_axis(x, i, 1)
}}
""")
    verify(c.spmd.program)
    assert kinds(c) == ["all_reduce"]
    assert total_bytes(c) == step_bytes("all_reduce", 4, 8 * 2 * 4)
    d = c.diff(backends=["ref", "sim"])
    assert d["ok"], d["results"]


def test_take_along_an_unsplit_axis_is_local():
    c = spmdlang.compile("""mesh [p=3]
func main(x: f32[7, 9] {p, _}, i: i32[7, 4] {p, _}) -> f32[7, 4] {p, _} {
  return take_along_axis(x, i, 1)
}
""")
    assert kinds(c) == []


# ---------------------------------------------------------------------------------- scatter_add


def _scatter(x, ids, u, axis=0):
    out = np.moveaxis(x.copy(), axis, 0)
    flat = ids.reshape(-1)
    uu = np.moveaxis(u.reshape(x.shape[:axis] + (-1,) + x.shape[axis + 1:]), axis, 0)
    keep = (flat >= 0) & (flat < x.shape[axis])
    np.add.at(out, flat[keep], uu[keep])
    return np.moveaxis(out, 0, axis)


@pytest.mark.parametrize("k, n, tspec, ispec", [(2, 8, "{p, _}", "{_}"), (3, 7, "{p, _}", "{_}"),
                                                (3, 7, "{_, _}", "{p}"), (2, 8, "{_, p}", "{_}"),
                                                (4, 7, "{_, _}", "{p}"), (3, 7, "{_, p}", "{p}")])
def test_scatter_add_sharded(k, n, tspec, ispec):
    rng = np.random.default_rng(n * k)
    x = rng.standard_normal((n, 5)).astype(f32)
    ids = rng.integers(-1, n + 1, (7,)).astype(np.int32)  # out of range both ways: dropped
    u = rng.standard_normal((7, 5)).astype(f32)
    uspec = "{" + ispec[1:-1] + ", _}"
    src = f"""mesh [p={k}]
func main(x: f32[{n}, 5] {tspec}, ids: i32[7] {ispec}, u: f32[7, 5] {uspec}, t: f32[5, {n}])
    -> (f32[{n}, 5] {tspec}, f32[{n}, 5], f32[5, {n}] {{_, p}}) {{
  s = scatter_add(x, ids, u)
  return s, s * 2.0, scatter_add(t, ids, transpose(u), axis=1)
}}
"""
    t = rng.standard_normal((5, n)).astype(f32)
    s = _scatter(x, ids, u)
    run_sharded(src, {"x": x, "ids": ids, "u": u, "t": t}, (s, s * 2, _scatter(t, ids, u.T, 1)))


def test_scatter_add_into_a_table_split_along_the_scattered_axis_needs_no_communication():
    c = spmdlang.compile("""mesh [p=4]
func main(x: f32[50, 8] {p, _}, ids: i32[16], u: f32[16, 8]) -> f32[50, 8] {p, _} {
  return scatter_add(x, ids, u)
}
""")
    verify(c.spmd.program)
    assert kinds(c) == []
    d = c.diff(backends=["ref", "sim"])
    assert d["ok"], d["results"]


def test_scatter_add_from_batch_split_updates_is_a_pending_sum_settled_by_a_reduce_scatter():
    """Ids and updates split over the batch: the table's result is partial over p; the consumer
    wants it split on rows, so one reduce_scatter settles it (no all_reduce, no gather)."""
    c = spmdlang.compile("""mesh [p=4]
func main(x: f32[48, 8] {_, _}, ids: i32[16] {p}, u: f32[16, 8] {p, _}) -> f32[48, 8] {p, _} {
  return scatter_add(x, ids, u)
}
""")
    verify(c.spmd.program)
    assert [(e.kind, e.axes) for e in c.spmd.ledger] == [("reduce_scatter", ("p",))]
    d = c.diff(backends=["ref", "sim"])
    assert d["ok"], d["results"]


@pytest.mark.parametrize("rows, batch, plan", [(16, 4096, "updates"), (4096, 8, "table")])
def test_scatter_add_picks_its_plan_by_the_cost_model(rows, batch, plan):
    """Table and updates split over the same axis: either the table keeps its split and the ids and
    updates are gathered, or the updates keep theirs and the table is gathered, scattered into as a
    pending sum and reduce-scattered back. Many updates into a small table: the second (the table
    moves, twice); a big table and few updates: the first (the updates move)."""
    src = f"""mesh [p=4]
func main(x: f32[{rows}, 8] {{p, _}}, ids: i32[{batch}] {{p}}, u: f32[{batch}, 8] {{p, _}})
    -> f32[{rows}, 8] {{p, _}} {{
  return scatter_add(x, ids, u)
}}
"""
    rng = np.random.default_rng(rows)
    x = rng.standard_normal((rows, 8)).astype(f32)
    ids = rng.integers(-1, rows + 1, (batch,)).astype(np.int32)
    u = rng.standard_normal((batch, 8)).astype(f32)
    c = run_sharded(src, {"x": x, "ids": ids, "u": u}, _scatter(x, ids, u), backends=("ref", "sim"), tol=1e-4)
    table, updates = rows * 8 * 4, batch * 9 * 4
    if plan == "updates":
        assert kinds(c) == ["all_gather", "reduce_scatter"]  # the table, both ways: 2 x 3/4 of it
        assert total_bytes(c) == 2 * table * 3 / 4 < updates * 3 / 4
    else:
        assert sorted(kinds(c)) == ["all_gather", "all_gather"]  # ids and updates
        assert total_bytes(c) == updates * 3 / 4 < table * 3 / 4


def test_jax_module_names_never_collide_with_a_parameter_named_like_a_temporary():
    src = """mesh [p=2]
func main(t2: f32[4, 6] {p, _}, t1: f32[4, 6]) -> f32[4, 6] {
  return sort(t2 * 2.0 + t1, 0)
}
"""
    a = np.arange(24, dtype=f32).reshape(4, 6)
    run_sharded(src, {"t2": a, "t1": -a}, np.sort(a, 0), backends=("ref", "jax"))


# ---------------------------------------------------------------------------------- many-operand einsum


def test_three_operand_einsum_contracts_the_cheapest_pair_first():
    """GShard's dispatch: x[s, m] d[s, e, c] w[e, m, h] -> [e, c, h]. The global program keeps one
    einsum; partitioning contracts the FLOP-cheapest pair x with d (s*m*e*c) first, not d with w
    (every order moves the same bytes here); each pairwise step partitions on its own:
    data-parallel s becomes one all_reduce of the (e, c, h) result over data."""
    src = """mesh [data=2, expert=2]
func main(x: f32[8, 6] {data, _}, d: f32[8, 4, 3] {data, expert, _}, w: f32[4, 6, 5] {expert, _, _})
    -> f32[4, 3, 5] {expert, _, _} {
  return einsum("sm,sec,emh->ech", x, d, w)
}
"""
    rng = np.random.default_rng(0)
    x, d, w = (rng.standard_normal(s).astype(f32) for s in ((8, 6), (8, 4, 3), (4, 6, 5)))
    c = run_sharded(src, {"x": x, "d": d, "w": w}, np.einsum("sm,sec,emh->ech", x, d, w), tol=1e-4)
    assert [op.attrs["spec"] for op in c.program.ops if op.kind == "einsum"] == ["sm,sec,emh->ech"]
    specs = [op.attrs["spec"] for op in c.spmd.program.ops if op.kind == "einsum"]
    assert specs == ["sm,sec->mec", "emh,mec->ech"]
    assert [(e.kind, e.axes) for e in c.spmd.ledger] == [("all_reduce", ("data",))]


def _dispatch(order: str | None, out: str = "{expert, _, model}") -> str:
    """GShard's dispatch into the expert layer, x[s, m] d[s, e, c] w[e, m, h] -> [e, c, h], with the
    hidden dim split over `model` and the result laid out as `out`: as one einsum, or written
    pairwise with the given first pair."""
    head = f"""mesh [data=2, expert=2, model=2]
func main(x: f32[16, 512] {{_, model}}, d: f32[16, 8, 16] {{data, expert, _}}, w: f32[8, 512, 512] {{expert, _, model}})
    -> f32[8, 16, 512] {out} {{
"""
    if order is None:
        return head + '  return einsum("sm,sec,emh->ech", x, d, w)\n}\n'
    if order == "xd":
        return head + '  t = einsum("sm,sec->mec", x, d)\n  return einsum("emh,mec->ech", w, t)\n}\n'
    return head + '  t = einsum("sm,emh->seh", x, w)\n  return einsum("sec,seh->ech", d, t)\n}\n'


def _dispatch_inputs():
    rng = np.random.default_rng(3)
    inputs = {"x": rng.standard_normal((16, 512)).astype(f32), "d": rng.standard_normal((16, 8, 16)).astype(f32),
              "w": rng.standard_normal((8, 512, 512)).astype(f32) / 32}
    return inputs, np.einsum("sm,sec,emh->ech", *inputs.values())


def _einsum_specs(c) -> list[str]:
    return [op.attrs["spec"] for op in c.spmd.program.ops if op.kind == "einsum"]


def test_many_operand_einsum_order_weighs_communication_not_only_flops():
    """The FLOPs-greedy order contracts x with d first (s*m*e*c = 1M multiply-adds against 33.5M
    for x with w; both orders total the same FLOPs). The order is chosen by what partitioning
    makes of each (ops.contract.chain_order: every order planned as a small program, its
    consumer-layout second plan included, ranked by modelled step time). Written out by hand,
    x with d first moves the fewest bytes, 18,432 (consumer-layout planning gathers x and d
    before the first einsum instead of its [m, e, c] result after), but its [m, e, c] then
    carries no `data` split, so the 33.5M multiply-adds of the contraction with w run replicated
    over `data`: twice the FLOPs per device, 8.9 us modelled against 6.2 us for x with w first,
    which keeps `data` on s and moves 43,008. The chooser takes x with w, as the cheaper plan."""
    from spmdlang.ops.contract import contraction_orders
    from spmdlang.partition.cost import flops
    from spmdlang.partition.spmd import step_time

    sizes = {"s": 16, "m": 512, "e": 8, "c": 16, "h": 512}
    assert next(contraction_orders(["sm", "sec", "emh"], "ech", sizes)) == [(0, 1, "mec")]  # FLOPs-greedy
    inputs, want = _dispatch_inputs()
    c = run_sharded(_dispatch(None), inputs, want, backends=("ref", "sim", "jax"), tol=1e-3)
    flops_first = spmdlang.compile(_dispatch("xd"))
    by_hand = spmdlang.compile(_dispatch("xw"))
    assert _einsum_specs(c) == ["sm,emh->seh", "sec,seh->ech"]
    assert total_bytes(c) == total_bytes(by_hand) == 43008
    assert total_bytes(flops_first) == 18432
    assert flops(flops_first.spmd.program) == 2 * flops(c.spmd.program)
    assert step_time(c.spmd) == pytest.approx(step_time(by_hand.spmd))
    assert step_time(c.spmd) < 0.75 * step_time(flops_first.spmd)


def test_many_operand_einsum_order_foresees_consumer_layout_planning():
    """The same dispatch with the result's c split over `data`: now the FLOPs-greedy order is the
    cheapest once partitioned. Consumer-layout planning runs x with d in the layout the second
    einsum wants its [m, e, c] in ({_, expert, data}: x gathered over model, 16 KB, d's s-to-c
    all_to_all, 1 KB) and nothing moves after: 17,408 B per device, 8.9M FLOPs, 5.6 us. Ranking
    the orders by a per-step estimate without that second plan had picked a plan leaving a
    pending sum over `data` on [m, e, c] and then regathering it over `model` (65,536 B, 6.6 us);
    x with w first moves 17,408 B too, but with twice the FLOPs (8.6 us)."""
    from spmdlang.partition.cost import flops
    from spmdlang.partition.spmd import step_time

    inputs, want = _dispatch_inputs()
    out = "{expert, data, model}"
    c = run_sharded(_dispatch(None, out), inputs, want, backends=("ref", "sim", "jax"), tol=1e-3)
    flops_first = spmdlang.compile(_dispatch("xd", out))
    other = spmdlang.compile(_dispatch("xw", out))
    assert _einsum_specs(c) == ["sm,sec->mec", "emh,mec->ech"]
    assert total_bytes(c) == total_bytes(flops_first) == 17408
    assert sorted((e.kind, e.axes, e.bytes_per_device) for e in c.spmd.ledger) == [
        ("all_gather", ("model",), 16384), ("all_to_all", ("data",), 1024)]
    assert flops(c.spmd.program) == flops(flops_first.spmd.program)
    assert step_time(c.spmd) == pytest.approx(step_time(flops_first.spmd))
    assert step_time(c.spmd) < 0.75 * step_time(other.spmd)


@pytest.mark.parametrize("k", [2, 3])
def test_many_operand_einsum_sharded(k):
    rng = np.random.default_rng(k)
    a, b, cc, e = (rng.standard_normal(s).astype(f32) for s in ((7, 4), (4, 5), (5, 6), (6, 3)))
    src = f"""mesh [p={k}]
func main(a: f32[7, 4] {{p, _}}, b: f32[4, 5] {{_, p}}, c: f32[5, 6], e: f32[6, 3] {{p, _}}) -> f32[7, 3] {{p, _}} {{
  return einsum("ij,jk,kl,lm->im", a, b, c, e)
}}
"""
    run_sharded(src, {"a": a, "b": b, "c": cc, "e": e}, a @ b @ cc @ e, tol=1e-4)


def test_many_operand_einsum_with_a_scalar_intermediate():
    """Two scalars contract to a scalar (",->"): a pairwise step whose output has no indices,
    planned by the order chooser as one of its candidates (found by a random spec sweep)."""
    rng = np.random.default_rng(5)
    a, s, t = rng.standard_normal((5, 3)).astype(f32), np.float32(1.5), np.float32(-0.5)
    src = """mesh [p=2, q=3]
func main(a: f32[5, 3] {p, _}, s: f32[], t: f32[]) -> f32[3, 5] {p, _} {
  return einsum("ed,,->de", a, s, t)
}
"""
    run_sharded(src, {"a": a, "s": s, "t": t}, (a * s * t).T, tol=1e-5)


# ---------------------------------------------------------------------------------- pooling


def _pool(x, window, stride, padding, kind):
    from test_builtins import pool_ref

    return pool_ref(x, window, stride, padding, kind)


@pytest.mark.parametrize("k, h, spec", [(2, 8, "{_, p, _, _}"), (3, 11, "{_, p, _, _}"), (3, 11, "{p, _, _, _}"),
                                        (4, 9, "{_, _, p, _}"), (2, 10, "{_, _, _, p}")])
def test_pools_sharded(k, h, spec):
    rng = np.random.default_rng(k * h)
    x = rng.standard_normal((3, h, 6, 2)).astype(f32)
    out1 = (3, h, 6, 2)
    m2 = (h + 2 - 3) // 2 + 1
    src = f"""mesh [p={k}]
func main(x: f32[3, {h}, 6, 2] {spec})
    -> (f32[3, {h}, 6, 2] {spec}, f32[3, {m2}, 3, 2] {spec}, f32[3, {h // 2}, 3, 2]) {{
  return max_pool(x, 3, 1, "SAME"), avg_pool(x, 3, 2, [[1, 1], [1, 0]]), avg_pool(x, 2)
}}
"""
    want = (_pool(x, [3, 3], [1, 1], [(1, 1), (1, 1)], "max"), _pool(x, [3, 3], [2, 2], [(1, 1), (1, 0)], "avg"),
            _pool(x, [2, 2], [2, 2], [(0, 0), (0, 0)], "avg"))
    assert want[0].shape == out1
    run_sharded(src, {"x": x}, want, tol=1e-5)


def test_overlapping_max_pool_on_a_split_image_exchanges_only_halo_rows():
    """A 3x3 stride-1 window over H split 4 ways: one row from each neighbour (collective_permutes
    of one [N, 1, W, C] row each), never the image; -inf past the edges."""
    c = spmdlang.compile("""mesh [h=4]
func main(x: f32[4, 256, 64, 16] {_, h, _, _}) -> f32[4, 256, 64, 16] {_, h, _, _} {
  return max_pool(x, 3, 1, "SAME")
}
""")
    verify(c.spmd.program)
    row = 4 * 64 * 16 * 4
    assert kinds(c) == ["collective_permute"] * 2
    assert total_bytes(c) == 2 * row
    small = spmdlang.compile("""mesh [h=4]
func main(x: f32[2, 16, 6, 3] {_, h, _, _}) -> f32[2, 16, 6, 3] {_, h, _, _} {
  return max_pool(x, 3, 1, "SAME")
}
""")
    d = small.diff(backends=["ref", "sim", "jax"])
    assert d["ok"], d["results"]


def test_non_overlapping_pool_on_a_split_image_is_local():
    c = spmdlang.compile("""mesh [h=4]
func main(x: f32[2, 64, 16, 8] {_, h, _, _}) -> f32[2, 32, 8, 8] {_, h, _, _} {
  return avg_pool(x, 2) + max_pool(x, [2, 2])
}
""")
    assert kinds(c) == []


# ---------------------------------------------------------------------------------- random numbers


RANDOM = """{mesh}
func main(x: f32[13, 7] {spec}, s: i32[]) -> (f32[13, 7] {spec}, f32[13, 7], f32[13, 7] {spec}) {{
  return random_uniform(s, f32[13, 7]), random_normal(s + 1, f32[13, 7]), dropout(x, 0.4, s * 3)
}}
"""


def test_random_bits_are_the_same_on_every_mesh_and_backend():
    """Each element is a function of (seed, its global index): bitwise-equal uniforms and dropout on
    four meshes and all four backends; normals to float rounding (log/cos of f32)."""
    x = np.arange(91, dtype=f32).reshape(13, 7) + 1
    inputs = {"x": x, "s": np.array(12345, np.int32)}
    first = None
    for mesh, spec in (("mesh [p=1]", "{_, _}"), ("mesh [p=3]", "{p, _}"), ("mesh [p=2, q=2]", "{p, q}"),
                       ("mesh [p=4, q=2]", "{q, p}")):
        c = spmdlang.compile(RANDOM.format(mesh=mesh, spec=spec))
        assert kinds(c) == [] or all(e.reason.endswith("for the result") for e in c.spmd.ledger)
        for backend in ALL:
            got = c.run(inputs, backend=backend)
            first = first or got
            assert np.array_equal(got[0], first[0]), (mesh, backend)
            assert np.array_equal(got[2], first[2]), (mesh, backend)
            np.testing.assert_allclose(got[1], first[1], rtol=1e-5, atol=1e-5)
    assert np.all((first[2] == 0) | np.isclose(first[2], x / f32(0.6)))


def test_random_draws_need_no_communication():
    c = spmdlang.compile("""mesh [p=4, q=2]
func main(x: f32[64, 30] {p, q}) -> f32[64, 30] {p, q} {
  return dropout(x, 0.1, 7) + random_normal(3, f32[64, 30])
}
""")
    assert kinds(c) == []


def test_random_statistics_on_a_million_draws():
    c = spmdlang.compile("""mesh [p=1]
func main() -> (f32[1000, 1000], f32[1000, 1000], f32[1000, 1000]) {
  return random_uniform(2024, f32[1000, 1000]), random_normal(7, f32[1000, 1000]), \\
    dropout(ones(f32[1000, 1000]), 0.3, 5)
}
""".replace("\\\n    ", ""))
    u, z, d = c.run({}, backend="ref")
    n = u.size
    assert 0 <= u.min() and u.max() < 1
    assert abs(u.mean() - 0.5) < 3 * np.sqrt(1 / 12 / n) + 1e-4
    assert abs(u.var() - 1 / 12) < 1e-3
    s = np.sort(u.ravel().astype(np.float64))
    ks = max(np.max(np.arange(1, n + 1) / n - s), np.max(s - np.arange(n) / n))
    assert ks < 1.63 / np.sqrt(n)  # Kolmogorov-Smirnov at the 1% level
    assert abs(z.mean()) < 5 / np.sqrt(n) and abs(z.var() - 1) < 5e-3
    assert abs((d == 0).mean() - 0.3) < 2e-3 and abs(d.mean() - 1) < 5e-3


def test_different_seeds_give_different_draws():
    c = spmdlang.compile("""mesh [p=2]
func main(s: i32[]) -> (f32[8], f32[8]) {
  return random_uniform(s, f32[8]), random_uniform(s + 1, f32[8])
}
""")
    a, b = c.run({"s": np.array(0, np.int32)}, backend="ref")
    assert not np.array_equal(a, b)


def test_three_operand_einsum_under_random_layouts():
    """The order search and its pairwise steps under random layouts of all three operands, pending
    sums included, on an even and an uneven instance (sim vs ref, as the exhaustive sweep)."""
    import itertools

    import test_sweep as S

    from spmdlang.ir.types import TensorType

    rng = np.random.default_rng(5)
    for texts, spec in ((("f32[4, 6]", "f32[6, 2]", "f32[2, 4]"), "ij,jk,kl->il"),
                        (("f32[3, 5]", "f32[3, 2, 3]", "f32[2, 5, 3]"), "sm,sec,emh->ech")):
        types = [TensorType.parse(t) for t in texts]
        combos = list(itertools.product(*(list(S.layouts(t)) for t in types)))
        for i in rng.choice(len(combos), 30, replace=False):
            S.check("einsum", texts, {"spec": spec}, combos[i], rng)


# ---------------------------------------------------------------------------------- where, any condition dtype


@pytest.mark.parametrize("k, n, spec", LAYOUTS)
@pytest.mark.parametrize("dtype", ["f32", "i32", "bf16"])
def test_where_takes_a_condition_of_any_dtype_as_jnp_where(k, n, spec, dtype):
    """Nonzero is true, NaN included (NaN != 0), on every backend and on uneven splits; the numbers
    come from jnp.where itself."""
    import jax.numpy as jnp

    src = (f"mesh [p={k}]\nfunc main(c: {dtype}[{n}, 5] {spec}, a: f32[{n}, 5] {spec}, b: f32[{n}, 5]) -> f32[{n}, 5] "
           "{\n  return where(c, a, b)\n}\n")
    rng = np.random.default_rng(k * 10 + n)
    cond = rng.choice([0.0, 1.0, -2.5, 0.25], size=(n, 5))
    if dtype != "i32":
        cond[0, :3] = [np.nan, np.inf, -0.0]
    np_dtype = {"f32": np.float32, "i32": np.int32, "bf16": jnp.bfloat16}[dtype]
    cond = cond.astype(np_dtype)
    a, b = rng.standard_normal((2, n, 5)).astype(f32)
    want = np.asarray(jnp.where(jnp.asarray(cond), a, b))
    if dtype != "i32":
        assert want[0, 0] == a[0, 0] and want[0, 1] == a[0, 1] and want[0, 2] == b[0, 2]  # NaN, inf: true; -0: false
    run_sharded(src, {"c": cond, "a": a, "b": b}, want)


def test_where_takes_a_number_as_condition():
    src = ("mesh [p=2]\nfunc main(a: f32[4] {p}, b: f32[4]) -> (f32[4], f32[4]) {\n"
           "  return where(2, a, b), where(0.0, a, b)\n}\n")
    a, b = np.arange(4, dtype=f32), -np.arange(4, dtype=f32)
    run_sharded(src, {"a": a, "b": b}, (a, b))


def test_where_with_a_float_condition_differentiates_as_jax():
    """No gradient flows into the condition; the branches get theirs where it is nonzero (the xla
    backend differentiates with jax.grad, so diff compares with jax's own)."""
    import jax
    import jax.numpy as jnp

    src = ("mesh [p=2]\nfunc f(c: f32[6], a: f32[6]) -> f32[] {\n  return sum(where(c, a * a, 2.0 * c))\n}\n"
           "func main(c: f32[6] {p}, a: f32[6]) -> (f32[6], f32[6]) {\n"
           "  gc, ga = grad(f, c, a, argnums=[0, 1])\n  return gc, ga\n}\n")
    c = np.array([0.0, 1.5, np.nan, 0.0, -2.0, 3.0], f32)
    a = np.arange(6, dtype=f32)
    want = jax.grad(lambda c, a: jnp.sum(jnp.where(c, a * a, 2.0 * c)), argnums=(0, 1))(c, a)
    run_sharded(src, {"c": c, "a": a}, tuple(np.asarray(w) for w in want))


def test_axis_none_is_written_as_in_jax():
    """`axis=None` (and perm=None) as the builtin table writes them: every dim, as jax's."""
    import jax
    import jax.numpy as jnp

    a = np.random.default_rng(3).standard_normal((5, 3)).astype(f32)
    src = """mesh [x=2]
func main(a: f32[5, 3] {x, _}) -> (f32[5, 3], f32[3, 5], f32[5, 3], i32[], f32[5, 3], f32[], f32[5, 3]) {
  return softmax(a, axis=None), transpose(a, perm=None), roll(a, 2, axis=None), argmax(a, axis=None),
    log_softmax(a, axis=None), sum(a, axis=None), squeeze(a, axis=None)
}
"""
    want = (jax.nn.softmax(a, axis=None), a.T, jnp.roll(a, 2, axis=None), np.int32(np.argmax(a, axis=None)),
            jax.nn.log_softmax(a, axis=None), a.sum(), a)
    run_sharded(src, {"a": a}, tuple(np.asarray(w) for w in want))
    with pytest.raises(spmdlang.SpmdError, match="unknown name 'None'"):  # a required axis takes none
        spmdlang.compile("mesh [x=2]\nfunc main(a: f32[2, 3]) -> f32[1, 2, 3] { return expand_dims(a, None) }\n")


def test_pad_with_one_lo_hi_pair_pads_every_dim():
    a = np.arange(12, dtype=f32).reshape(4, 3)
    src = """mesh [x=3]
func main(a: f32[4, 3] {x, _}) -> (f32[7, 6], f32[7, 6]) {
  return pad(a, [1, 2]), pad(a, [[1, 2]], value=-1.0)
}
"""
    # (XLA's baseline pads 4 rows over 3 shards with a -1 wrong: an upstream disagreement)
    run_sharded(src, {"a": a}, (np.pad(a, (1, 2)), np.pad(a, (1, 2), constant_values=-1)),
                backends=("ref", "sim", "jax"))


def test_empty_operands_over_split_dims():
    """No rows: a concat of empty slices of a split dim (its halo window has no pieces), a take
    of no ids and a reshape of an empty array (no factors to share) compile and run everywhere."""
    a = np.arange(18, dtype=f32).reshape(6, 3)
    src = """mesh [x=2]
func main(a: f32[6, 3] {x, _}, ids: i32[0]) -> (f32[0, 3], f32[0, 3], f32[3, 0]) {
  return take(a, ids), concat([a[0:0, :], a[3:3, :]], axis=0), reshape(a[2:2, :], [3, 0])
}
"""
    run_sharded(src, {"a": a, "ids": np.zeros(0, np.int32)},
                (np.zeros((0, 3), f32), np.zeros((0, 3), f32), np.zeros((3, 0), f32)))
    # an empty strided slice of a split dim (jax's gradient of cumprod, associative_scan): its
    # window was of length -1
    src = """mesh [x=2]
func main(a: f32[6, 3] {x, _}) -> (f32[0, 3], f32[0, 3], f32[6, 3]) {
  return a[2:2:2, :], a[6:6:3, :], a * 2.0
}
"""
    run_sharded(src, {"a": a}, (np.zeros((0, 3), f32), np.zeros((0, 3), f32), a * 2))
    # a scan along an empty split dim: its per-shard totals were a slice of no rows
    src = """mesh [x=2]
func main(a: f32[0, 3] {x, _}) -> (f32[0, 3], f32[0, 3]) {
  return cumsum(a, 0), cumprod(a, 0, reverse=true) + cummax(a, 0)
}
"""
    run_sharded(src, {"a": np.zeros((0, 3), f32)}, (np.zeros((0, 3), f32), np.zeros((0, 3), f32)))


def test_a_pass_that_raised_raises_again(monkeypatch):
    """A compile whose partitioning failed fails the same way when asked again (the pipeline went
    on past the failed pass, and the next run raised AttributeError on its missing stage)."""
    import spmdlang.partition.pipeline as pipeline
    from spmdlang.errors import SpmdError

    def broken(canonical, propagation):
        raise SpmdError("the partitioner failed")

    monkeypatch.setattr(pipeline, "partition", broken)
    c = spmdlang.compile("mesh [x=2]\nfunc main(a: f32[4] {x}) -> f32[4] { return a * 2.0 }\n")
    for backend in ("sim", "jax", "sim"):
        with pytest.raises(SpmdError, match="the partitioner failed"):
            c.run({"a": np.ones(4, f32)}, backend=backend)


def test_scatter_max_gradient_at_a_nan_no_update_reaches_and_an_empty_trailing_dim():
    """The gradient of scatter_max passes x's cotangent where no update lands, a NaN of x too (it
    was dropped: x == out is false for NaN), as jax's; a table with an empty dim after the
    scattered one runs on every backend, the xla baseline too (its reshape divided by zero)."""
    import jax
    import jax.numpy as jnp

    src = """mesh [a=2]
func loss(x: f32[4], ids: i32[3], u: f32[3]) -> f32[] {
  return sum(scatter_max(x, ids, u) * (iota(f32[4]) + 1.0))
}
func main(x: f32[4] {a}, ids: i32[3], u: f32[3]) -> f32[4] {
  return grad(loss, x, ids, u)
}"""
    x, u = np.array([np.nan, 1.0, np.nan, 2.0], f32), np.array([0.5, 0.7, 3.0], f32)
    ids = np.array([2, 2, 3], np.int32)
    want = np.asarray(jax.grad(lambda x: jnp.sum(x.at[ids].max(u) * jnp.arange(1.0, 5.0)))(x))
    assert want.tolist() == [1.0, 2.0, 0.0, 0.0]
    c = spmdlang.compile(src)
    for b in ("ref", "sim", "jax"):
        assert np.asarray(c.run({"x": x, "ids": ids, "u": u}, backend=b)[0]).tolist() == want.tolist(), b
    empty = spmdlang.compile("mesh [a=2, b=3]\nfunc main(x: f32[7, 0] {a, b}, i: i32[3], u: f32[3, 0]) -> "
                             "(f32[7, 0], f32[7, 0]) {\n  return scatter_max(x, i, u), scatter_add(x, i, u)\n}\n")
    report = empty.diff()
    assert report["ok"], report


def test_atan2_and_its_gradient_as_jax():
    """atan2(a, b) on rows split unevenly over 3, signed zeros and ints included, its gradient
    (b / (a^2 + b^2), -a / (a^2 + b^2)) against jax.grad, and jnp.arctan2 imported by from_jax."""
    import jax
    import jax.numpy as jnp

    src = ("mesh [r=3]\nfunc loss(a: f32[2, 7], b: f32[2, 7]) -> f32[] {\n"
           "  return sum(atan2(a, b) * atan2(b, 2.0))\n}\n"
           "func main(a: f32[2, 7] {_, r}, b: f32[2, 7] {_, r}, i: i32[7]) -> (f32[2, 7], f32[7], f32[2, 7], "
           "f32[2, 7]) {\n  l, ga, gb = value_and_grad(loss, a, b, argnums=[0, 1])\n"
           "  return atan2(a, b), atan2(i, 3), ga, gb\n}\n")
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((2, 7)).astype(np.float32) for _ in range(2))
    a[0, :3], b[0, :3] = [-0.0, 0.0, -0.0], [-1.0, -1.0, 0.0]
    i = np.arange(-3, 4, dtype=np.int32)
    ga, gb = jax.grad(lambda a, b: jnp.sum(jnp.arctan2(a, b) * jnp.arctan2(b, 2.0)), (0, 1))(a, b)
    want = [jnp.arctan2(a, b), jnp.arctan2(i, 3).astype(jnp.float32), ga, gb]
    c = spmdlang.compile(src)
    for backend in ("ref", "sim", "jax"):
        for got, w in zip(c.run({"a": a, "b": b, "i": i}, backend=backend), want):
            np.testing.assert_allclose(np.asarray(got), np.asarray(w), rtol=1e-5, atol=1e-6)
            assert np.signbit(np.asarray(got)).tolist() == np.signbit(np.asarray(w)).tolist(), backend
    imp = spmdlang.from_jax(lambda a, b: jnp.arctan2(a, b) * 2.0, a, b)
    got = imp.unflatten(imp.compile().run(imp.flatten(a, b), backend="ref"))
    np.testing.assert_allclose(np.asarray(got), np.asarray(jnp.arctan2(a, b) * 2.0), rtol=1e-6)
