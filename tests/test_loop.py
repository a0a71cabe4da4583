"""`loop`: compiled once (one body in the IR whatever the trip count), carried values, captures,
propagation and partitioning across the body, the backends, `explain`, and the errors."""

from __future__ import annotations

import re

import numpy as np
import pytest

import spmdlang
from spmdlang.ir.core import LOOP, Loop, Op, Region, Value, all_ops
from spmdlang.ir.types import TensorType
from spmdlang.ir.verify import VerifyError, verify

STACK = """
mesh [data=2, model=2]
const L = 4
func main(x: f32[8, 16] {data, _}, w: f32[16, 16] {_, model}) -> (f32[8, 16], f32[]) {
  acc = 0.0
  loop l in range(L) {
    h = relu(x @ w)
    x = x + h * 0.5
    acc = acc + sum(h)
  }
  return x, acc
}
"""


def numpy_stack(x, w, n):
    acc = np.float32(0)
    for _ in range(n):
        h = np.maximum(x @ w, 0)
        x = x + h * np.float32(0.5)
        acc = acc + h.sum()
    return x, acc


def inputs(seed=0, **shapes):
    rng = np.random.default_rng(seed)
    return {k: (rng.standard_normal(s) * 0.3).astype(np.float32) for k, s in shapes.items()}


def loops(prog):
    return [op for op in all_ops(prog.ops) if op.kind == LOOP]


def test_body_is_compiled_once_whatever_the_trip_count():
    small = spmdlang.compile(STACK, consts={"L": 2})
    big = spmdlang.compile(STACK, consts={"L": 200})
    assert len(list(all_ops(small.program.ops))) == len(list(all_ops(big.program.ops)))
    (loop,) = loops(big.program)
    assert (loop.attrs["start"], loop.attrs["stop"]) == (0, 200)


@pytest.mark.parametrize("backend", ["ref", "sim"])
def test_carries_match_numpy(backend):
    c = spmdlang.compile(STACK)
    ins = inputs(x=(8, 16), w=(16, 16))
    x, acc = c.run(ins, backend=backend)
    ex, eacc = numpy_stack(ins["x"], ins["w"], 4)
    np.testing.assert_allclose(x, ex, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(acc, eacc, rtol=1e-5)


def test_range_start_stop_and_empty_range():
    src = """
mesh [x=2]
func main(a: f32[4] {x}) -> f32[4] {
  loop i in range(2, 5) { a = a * 2.0 + cast(i, f32) }
  loop j in range(3, 3) { a = a * 100.0 }
  return a
}
"""
    c = spmdlang.compile(src)
    a = np.arange(4, dtype=np.float32)
    want = a.copy()
    for i in range(2, 5):
        want = want * 2 + i
    for backend in ("ref", "sim"):
        np.testing.assert_allclose(c.run({"a": a}, backend=backend)[0], want)


def test_names_first_bound_in_the_body_are_local():
    src = """
mesh [x=2]
func main(a: f32[4] {x}) -> f32[4] {
  loop i in range(3) {
    t = a * 2.0
    a = t
  }
  return t
}
"""
    with pytest.raises(spmdlang.SpmdError, match="unknown name 't'") as e:
        spmdlang.compile(src)
    assert e.value.line == 8


def test_nested_loops_and_calls_in_the_body():
    src = """
mesh [x=2]
func step(a: f32[4], b: f32[4]) -> f32[4] { return a + b }
func main(a: f32[4] {x}, b: f32[4]) -> f32[4] {
  loop i in range(3) {
    loop j in range(2) { a = step(a, b) }
    a = a * 0.5
  }
  return a
}
"""
    c = spmdlang.compile(src)
    a, b = np.arange(4, dtype=np.float32), np.ones(4, np.float32)
    want = a.copy()
    for _ in range(3):
        want = (want + 2 * b) * 0.5
    assert len(loops(c.program)) == 2
    for backend in ("ref", "sim"):
        np.testing.assert_allclose(c.run({"a": a, "b": b}, backend=backend)[0], want)


GOLDEN_IR = """\
# global program, mesh [data=2, model=2]
func @main(%x: f32[8, 16] {data, _}, %w: f32[16, 16] {_, model}) -> (f32[8, 16], f32[]) {
  %acc = full() {dtype="f32", shape=[], value=0.0} : f32[]  # line 6
  %x.1, %acc.1 = loop(%x, %acc, %w) {start=0, stop=4} : f32[8, 16], f32[]  # line 6
    body(%l: i32[], %x.2: f32[8, 16], %acc.2: f32[], %w.1: f32[16, 16]) {
      %0 = einsum(%x.2, %w.1) {spec="mk,kn->mn"} : f32[8, 16]  # line 7
      %h = relu(%0) : f32[8, 16]  # line 7
      %1 = full() {dtype="f32", shape=[], value=0.5} : f32[]  # line 8
      %2 = mul(%h, %1) : f32[8, 16]  # line 8
      %x.3 = add(%x.2, %2) : f32[8, 16]  # line 8
      %3 = reduce_sum(%h) {axes=[0, 1]} : f32[]  # line 9
      %acc.3 = add(%acc.2, %3) : f32[]  # line 9
      yield %x.3, %acc.3
    }
  return %x.1, %acc.1
}
"""


def test_ir_text_golden():
    assert spmdlang.compile(STACK).ir == GOLDEN_IR


def test_carry_has_one_sharding_and_the_body_is_partitioned_once():
    c = spmdlang.compile(STACK)
    sh = c.propagation.shardings
    (loop,) = loops(c.canonical)
    lp = Loop(loop)
    for p, nxt, out in zip(lp.carries, lp.body.results, loop.results):
        assert sh[p] == sh[nxt] == sh[out]
    (local,) = loops(c.spmd.program)
    assert len(local.regions[0].ops) < 20


def test_shard_inside_the_body_holds_on_every_iteration():
    src = """
mesh [a=2, b=2]
func main(x: f32[8, 8], w: f32[8, 8]) -> f32[8, 8] {
  loop i in range(3) {
    x = shard(x @ w, {a, b})
  }
  return x
}
"""
    c = spmdlang.compile(src)
    (loop,) = loops(c.canonical)
    lp = Loop(loop)
    sh = c.propagation.shardings
    assert str(sh[lp.carries[0]]) == "{a, b}" and str(sh[loop.results[0]]) == "{a, b}"
    ins = inputs(x=(8, 8), w=(8, 8))
    want = ins["x"]
    for _ in range(3):
        want = want @ ins["w"]
    np.testing.assert_allclose(c.run(ins, backend="sim")[0], want, rtol=1e-5, atol=1e-5)


def test_reshard_before_the_back_edge_is_charged_per_iteration():
    # the body ends with x laid out {b, a} while the carry is {a, b}: the carry is resharded on
    # every iteration, and explain counts it L times
    src = """
mesh [a=2, b=2]
const L = 5
func main(x: f32[8, 8] {a, b}) -> f32[8, 8] {a, b} {
  loop i in range(L) {
    x = shard(x * 2.0, {b, a})
  }
  return x
}
"""
    c = spmdlang.compile(src)
    r = c.explain_report()
    inside = [x for x in r["collectives"] if x.get("trip_count") == 5]
    assert inside, r["collectives"]
    total = sum(x["bytes_per_device"] * x.get("trip_count", 1) for x in r["collectives"])
    assert r["totals"]["bytes_per_device"] == total
    assert r["totals"]["collectives"] == sum(x.get("trip_count", 1) for x in r["collectives"])
    x = np.arange(64, dtype=np.float32).reshape(8, 8)
    np.testing.assert_allclose(c.run({"x": x}, backend="sim")[0], x * 32)


def test_reshard_of_a_loop_invariant_capture_is_hoisted():
    # w is laid out {model, _} outside but the body needs it whole: one all_gather before the
    # loop, none inside it
    src = """
mesh [model=4]
func main(x: f32[8, 16], w: f32[16, 16] {model, _}) -> f32[8, 16] {
  loop i in range(6) {
    x = tanh(shard(x, {_, _}) @ shard(w, {_, _}))
  }
  return x
}
"""
    c = spmdlang.compile(src)
    r = c.explain_report()
    gathers = [x for x in r["collectives"] if x["kind"] == "all_gather"]
    assert len(gathers) == 1 and "trip_count" not in gathers[0], r["collectives"]
    (loop,) = loops(c.spmd.program)
    assert not [op for op in all_ops(loop.regions[0].ops) if op.kind == "all_gather"]
    ins = inputs(x=(8, 16), w=(16, 16))
    want = ins["x"]
    for _ in range(6):
        want = np.tanh(want @ ins["w"])
    np.testing.assert_allclose(c.run(ins, backend="sim")[0], want, rtol=1e-5, atol=1e-5)


def test_jax_and_xla_emit_fori_loop():
    c = spmdlang.compile(STACK)
    for src in (c.jax_source, c.xla_source):  # the body's function, called with the loop's captures
        assert re.search(r"jax\.lax\.fori_loop\(0, 4, (lambda loop0_i, loop0_carry: )?loop0\b", src), src
    assert c.diff(backends=("sim", "jax", "xla"))["ok"]


def test_uneven_mesh():
    c = spmdlang.compile(STACK, mesh={"data": 3, "model": 3})
    ins = inputs(x=(8, 16), w=(16, 16))
    x, acc = c.run(ins, backend="sim")
    ex, eacc = numpy_stack(ins["x"], ins["w"], 4)
    np.testing.assert_allclose(x, ex, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(acc, eacc, rtol=1e-5)


# ---------------------------------------------------------------------------------- errors


def error_of(src):
    with pytest.raises(spmdlang.SpmdError) as e:
        spmdlang.compile(src)
    return e.value


def test_carried_type_change_is_a_located_error():
    e = error_of("""
mesh [x=2]
func main(a: f32[4]) -> f32[4] {
  loop i in range(3) {
    a = sum(a)
  }
  return a
}
""")
    assert "carried through the loop as f32[4]" in e.message and "f32[]" in e.message
    assert (e.line, e.col) == (5, 5)


def test_loop_index_where_a_static_integer_is_needed():
    e = error_of("""
mesh [x=2]
func main(a: f32[4]) -> f32[4] {
  loop i in range(3) {
    a = roll(a, i, 0)
  }
  return a
}
""")
    assert "index of a `loop`" in e.message and "use `for`" in e.message
    assert e.line == 5
    e = error_of("""
mesh [x=2]
func main(a: f32[4]) -> f32[4] {
  loop i in range(3) {
    for j in range(i) { a = a + 1.0 }
  }
  return a
}
""")
    assert "index of a `loop`" in e.message and e.line == 5


def test_return_in_a_loop_and_bad_ranges():
    e = error_of("""
mesh [x=2]
func main(a: f32[4]) -> f32[4] {
  loop i in range(3) { return a }
  return a
}
""")
    assert "return inside a loop" in e.message and e.line == 4
    e = error_of("""
mesh [x=2]
func main(a: f32[4]) -> f32[4] {
  loop i in range(0, 6, 2) { a = a + 1.0 }
  return a
}
""")
    assert "1 or 2 arguments" in e.message and (e.line, e.col) == (4, 25)


def test_loop_is_a_keyword():
    e = error_of("""
mesh [x=2]
func main(a: f32[4]) -> f32[4] {
  loop = a
  return loop
}
""")
    assert e.line == 4


def test_verifier_rejects_a_carry_whose_type_changes():
    c = spmdlang.compile(STACK)
    prog = c.program
    i, j = [k for k, op in enumerate(prog.ops) if op.kind == LOOP][0], 0
    loop = prog.ops[i]
    body: Region = loop.regions[0]
    bad = Value(TensorType("f32", (8, 8)))
    op = Op("full", (), (bad,), {"dtype": "f32", "shape": (8, 8), "value": 0.0})
    new_body = body.replace(ops=body.ops + (op,), results=(bad,) + body.results[1:])
    ops = list(prog.ops)
    ops[i] = loop.replace(regions=(new_body,))
    with pytest.raises(VerifyError, match="not loop-invariant"):
        verify(prog.replace(ops=tuple(ops)))
    assert j == 0


# ---------------------------------------------------------------------------------- hoisting


def test_accumulated_partial_sums_are_settled_once_after_the_loop():
    c = spmdlang.compile(STACK)
    r = c.explain_report()
    reduces = [x for x in r["collectives"] if x["kind"] == "all_reduce"]
    assert len(reduces) == 1 and "trip_count" not in reduces[0], r["collectives"]
    (loop,) = loops(c.spmd.program)
    assert not [op for op in all_ops(loop.regions[0].ops) if op.kind == "all_reduce"]
    after = list(c.spmd.program.ops)[list(c.spmd.program.ops).index(loop) + 1:]
    assert [op.kind for op in after if op.kind == "all_reduce"] == ["all_reduce"]


ACC_INIT = """
mesh [data=2, model=2]
func main(x: f32[8, 16] {data, _}, w: f32[16, 16] {_, model}) -> (f32[], f32[]) {
  acc = mean(x) * 3.0
  other = sum(x)
  loop l in range(5) {
    acc = acc + sum(tanh(x @ w) * cast(l, f32))
    other = other * 0.5 + sum(tanh(x @ w) * cast(l + 1, f32))
  }
  return acc, other
}
"""


def test_accumulation_with_a_nonzero_start_and_one_that_cannot_be_deferred():
    c = spmdlang.compile(ACC_INIT)
    r = c.explain_report()
    looped = [x for x in r["collectives"] if x["kind"] == "all_reduce" and x.get("trip_count") == 5]
    assert len(looped) == 1, r["collectives"]  # `other` is scaled every iteration: summed in the loop
    ins = inputs(x=(8, 16), w=(16, 16))
    acc, other = np.float32(ins["x"].mean() * 3), ins["x"].sum()
    for i in range(5):
        acc = acc + (np.tanh(ins["x"] @ ins["w"]) * i).sum()
        other = other * 0.5 + (np.tanh(ins["x"] @ ins["w"]) * (i + 1)).sum()
    for backend in ("sim", "jax"):
        got = c.run(ins, backend=backend)
        np.testing.assert_allclose(got[0], acc, rtol=1e-4)
        np.testing.assert_allclose(got[1], other, rtol=1e-4)


NESTED = """
mesh [a=2, b=2]
func main(x: f32[8, 6] {a, _}, w: f32[6, 6] {b, _}) -> (f32[8, 6], i32[]) {
  k = 0
  loop i in range(3) {
    loop j in range(1, 3) {
      x = tanh(shard(x, {a, _}) @ shard(w, {_, _})) + cast(i * j, f32) * 0.1
      k = k + j
    }
  }
  return x, k
}
"""


def test_nested_loops_hoist_to_the_outermost_and_run_on_every_backend():
    # the inner body reads the outer index (a capture) and w, whose gather leaves both loops
    c = spmdlang.compile(NESTED)
    r = c.explain_report()
    assert [(x["kind"], x.get("trip_count", 1)) for x in r["collectives"]] == [("all_gather", 1)]
    assert c.diff(backends=("sim", "jax", "xla"))["ok"]
    ins = inputs(x=(8, 6), w=(6, 6))
    x, k = ins["x"], 0
    for i in range(3):
        for j in range(1, 3):
            x = np.tanh(x @ ins["w"]) + np.float32(i * j * 0.1)
            k += j
    got = c.run(ins, backend="sim")
    np.testing.assert_allclose(got[0], x, rtol=1e-5, atol=1e-5)
    assert got[1] == k


# ---------------------------------------------------------------------------------- random loops


def random_loop_programs(first_seed, count, max_devices=16):
    """The first `count` programs with a loop from seeds first_seed, first_seed + 1, ..."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from progen import Generator, RandomChooser

    seed = first_seed
    while count:
        src = Generator(RandomChooser(seed), max_devices=max_devices, loops=True).program()
        if "loop " in src:
            count -= 1
            yield seed, src
        seed += 1


def test_random_loops_on_the_simulator():
    from test_differential import check_program

    for _seed, src in random_loop_programs(500_000, 25):
        check_program(src)


def test_random_loops_on_jax():
    for seed, src in random_loop_programs(600_000, 8):
        c = spmdlang.compile(src)
        tol = 3e-2 if "bf16" in src else None
        d = c.diff(backends=["ref", "jax"], rtol=tol, atol=tol)
        assert d["ok"], f"seed {seed}: {d['results']}\n{src}"


def test_a_loop_too_long_to_interpret_is_a_located_error():
    c = spmdlang.compile("""
mesh [x=2]
func main(a: f32[4] {x}) -> f32[4] {
  loop i in range(1000000000) { a = a * 0.5 }
  return a
}
""")
    assert len(list(all_ops(c.program.ops))) == 3  # compiling is instant, whatever the trip count
    for backend in ("ref", "sim"):
        with pytest.raises(spmdlang.SpmdError, match="once per iteration") as e:
            c.run({"a": np.ones(4, np.float32)}, backend=backend)
        assert e.value.line == 4


def test_stacked_weights_indexed_at_the_loop_index():
    # w[l] on an unsplit layer dim is a local read; on a layer dim split over `stage` each shard
    # reads the layer in place if it holds it and the shards are summed: once per iteration
    src = """
mesh [stage=2, model=2]
func main(x: f32[8, 16], w: f32[6, 16, 16] {SPEC}) -> f32[8, 16] {
  loop l in range(6) {
    x = tanh(x @ w[l])
  }
  return x
}
"""
    ins = inputs(x=(8, 16), w=(6, 16, 16))
    want = ins["x"]
    for i in range(6):
        want = np.tanh(want @ ins["w"][i])
    for spec, per_iteration in (("_, _, model", set()), ("stage, _, model", {("all_reduce", ("stage",))})):
        c = spmdlang.compile(src.replace("SPEC", spec))
        r = c.explain_report()
        looped = {(x["kind"], tuple(x["axes"])) for x in r["collectives"] if x.get("trip_count") == 6}
        assert per_iteration <= looped and not any(k == "all_reduce" and "stage" not in a for k, a in looped), looped
        np.testing.assert_allclose(c.run(ins, backend="sim")[0], want, rtol=1e-5, atol=1e-5)


def test_loop_invariant_work_and_its_communication_leave_the_loop():
    src = """
mesh [model=4]
func main(x: f32[8, 16], w: f32[16, 16] {model, _}, b: f32[16]) -> f32[8, 16] {
  loop i in range(6) {
    v = shard(w * 2.0 + 1.0, {_, _})
    x = tanh(x @ v + b * 0.5) + cast(i, f32) * 0.01
  }
  return x
}
"""
    c = spmdlang.compile(src)
    r = c.explain_report()
    assert [(x["kind"], x.get("trip_count", 1)) for x in r["collectives"]] == [("all_gather", 1)]
    (loop,) = loops(c.canonical)
    body_kinds = [op.kind for op in loop.regions[0].ops]
    assert body_kinds.count("mul") == 1  # only cast(i) * 0.01 stays: it reads i
    assert not [k for k in body_kinds if k == "shard"]
    ins = inputs(x=(8, 16), w=(16, 16), b=(16,))
    want = ins["x"]
    for i in range(6):
        want = np.tanh(want @ (ins["w"] * 2 + 1) + ins["b"] * 0.5) + np.float32(i * 0.01)
    np.testing.assert_allclose(c.run(ins, backend="sim")[0], want, rtol=1e-5, atol=1e-5)


def test_autoshard_searches_a_loop():
    """The loop body is searched once (tests/test_autoshard.py has the rest); the plan compiles
    and runs."""
    from spmdlang.autoshard import autoshard

    r = autoshard(STACK, runners_up=0)
    c = spmdlang.compile(r.source)
    assert loops(c.canonical) and c.diff(backends=("sim",))["ok"]


def test_grad_through_a_loop_equals_grad_through_the_unrolled_for():
    src = """
mesh [x=2]
func loss(w: f32[4, 4], a: f32[4]) -> f32[] {
  loop i in range(3) { a = tanh(w @ a) }
  return sum(a)
}
func main(w: f32[4, 4] {x, _}, a: f32[4]) -> (f32[4, 4], f32[4]) {
  gw, ga = grad(loss, w, a, argnums=[0, 1])
  return gw, ga
}
"""
    looped = spmdlang.compile(src)
    unrolled = spmdlang.compile(src.replace("loop i in range(3)", "for i in range(3)"))
    ins = inputs(w=(4, 4), a=(4,))
    for got, want in zip(looped.run(ins, backend="sim"), unrolled.run(ins, backend="ref")):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
