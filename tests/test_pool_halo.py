"""Pools and strided windows on images split by rows (issue 25): a row split carries through a
pool (its input and output rows are one factor, as a conv's), each output shard reads the input
rows its windows reach (a halo from the neighbours, none where a 2x2 stride-2 pool's blocks line
up), and a sum pool's gradient is a sum pool of the cotangent dilated by the strides, windowed
the same way. Never an all_gather of the activations for a pool, on even and uneven splits, in the
forward and the backward pass; every backend equal to the numpy reference and to jax's autodiff
(the xla backend differentiates with jax.value_and_grad).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import spmdlang
from spmdlang.ir.core import result_names

ROOT = Path(__file__).resolve().parent.parent
MNIST = ROOT / "programs" / "train_mnist_cnn.spmd"
SMALL = {"N": 2, "C1": 4, "C2": 8, "D": 16}


def _gathers(c, axis="rows"):
    return [(e.kind.value, e.op, e.reason) for e in c.spmd.ledger
            if e.kind.value in ("all_gather", "all_to_all") and axis in e.axes]


def test_mnist_step_pools_move_nothing_and_send_fewer_bytes_than_xla():
    """flax's mnist step on [rows=8] (28 rows in blocks of 4, 14 in blocks of 2, 7 in blocks of
    1): the pools and their gradients need no collective; the one gather is the flatten's of the
    7 pooled rows; fewer bytes and collectives than XLA's GSPMD (its compiled HLO, recorded in
    the plan ledger). Before, the second pool gathered its 14 rows and the total was 667,776 B."""
    c = spmdlang.compile(str(MNIST))
    assert not [e for e in c.spmd.ledger if e.op in ("pool", "select_and_scatter_add")]
    assert _gathers(c) == [("all_gather", "reshape", _gathers(c)[0][2])]
    assert "%b" in _gathers(c)[0][2]
    ours = sum(e.bytes_per_device for e in c.spmd.ledger)
    golden = json.loads((ROOT / "tests" / "golden" / "plans.json").read_text())["entries"]
    xla = next(e["xla"] for e in golden
               if (e["program"], e["size"], e["mesh"]) == ("programs/train_mnist_cnn", "default", "rows=8"))
    assert ours <= xla["bytes"] and len(c.spmd.ledger) <= xla["collectives"], (ours, xla)
    assert ours == 350_336


def test_mnist_step_has_no_conflict_between_a_pools_input_and_output_rows():
    """The message that used to come with the first pool ("... dim 1 (rows) and a f32[8, 14, 14,
    32] temporary dim 1 (rows) are different dimensions of the op but share rows ...")."""
    c = spmdlang.compile(str(MNIST))
    assert not c.propagation.conflicts, c.propagation.conflicts


@pytest.mark.parametrize("rows, hw", [(8, 12), (3, 12), (5, 12), (8, 20), (5, 28)])
def test_mnist_step_matches_ref_and_jax_autodiff_on_uneven_row_splits(rows, hw):
    """12 rows over 8 (6 pooled rows in blocks of 1, then 3 whose windows reach 2 shards on),
    over 5 (blocks of 3, then 2: misaligned), 20 over 8 (blocks of 3, pooled in blocks of 2:
    every shard's window shifted), 28 over 5. The simulator poisons the padding of uneven shards
    with NaN, so a missing mask shows."""
    c = spmdlang.compile(str(MNIST), mesh={"rows": rows}, consts={**SMALL, "HW": hw})
    report = c.diff(backends=("sim", "jax", "xla"), seed=1)
    assert report["ok"], [r for r in report["results"] if not r["ok"]]
    assert not [e for e in c.spmd.ledger if e.op in ("pool", "select_and_scatter_add")
                and e.kind.value != "collective_permute"]
    pools = [g for g in _gathers(c) if g[1] in ("pool", "select_and_scatter_add")
             or "for pool" in g[2] or "for select_and_scatter_add" in g[2]]
    assert not pools, pools


CHAINS = [
    # first layer, second layer (on the first's output), rows, mesh
    ('avg_pool(x, 2)', 'conv(a, k, padding="SAME")', 28, 8),
    ('max_pool(x, 2)', 'conv(a, k, padding="SAME")', 20, 8),  # blocks of 3, pooled in blocks of 2
    ('avg_pool(x, 3, 2, "SAME")', 'avg_pool(a, 2)', 13, 3),  # overlapping windows, uneven
    ('max_pool(x, [2, 2], 3)', 'conv(a, k, padding="SAME")', 17, 4),  # rows no window reads
    ('conv(x, k0, stride=2, padding="SAME")', 'avg_pool(a, 2, 1, "SAME")', 14, 3),  # strided conv
    ('avg_pool(x, 2, 1)', 'max_pool(a, 3, 2, [[1, 1], [0, 1]])', 11, 4),
]


def _chain(first, second, rows, mesh):
    return f"""mesh [rows={mesh}]
func loss(k0: f32[3, 3, 4, 4], k: f32[3, 3, 4, 4], x: f32[2, {rows}, 6, 4]) -> f32[] {{
  a = relu({first})
  b = {second}
  return sum(b * b)
}}
func main(k0: f32[3, 3, 4, 4], k: f32[3, 3, 4, 4], x: f32[2, {rows}, 6, 4] {{_, rows, _, _}})
    -> (f32[], f32[3, 3, 4, 4], f32[3, 3, 4, 4], f32[2, {rows}, 6, 4] {{_, rows, _, _}}) {{
  l, g0, g, gx = value_and_grad(loss, k0, k, x, argnums=[0, 1, 2])
  return l, g0, g, gx
}}
"""


@pytest.mark.parametrize("first, second, rows, mesh", CHAINS, ids=[f"{c[0][:8]}-{c[1][:8]}-{c[2]}-{c[3]}"
                                                                    for c in CHAINS])
def test_pool_and_strided_window_chains_keep_rows_split(first, second, rows, mesh):
    """A pool feeding a conv or another pool (and a strided conv feeding a pool), differentiated:
    the rows stay split through both layers and back, halos only; every backend equals the
    reference and jax's autodiff. (Before, a pool's input and output rows were two factors that
    could not both take the axis: a conflict, and a gather of the pooled rows.)"""
    c = spmdlang.compile(_chain(first, second, rows, mesh))
    assert not c.propagation.conflicts, c.propagation.conflicts
    # (a kernel gradient of a few rows may still gather them where that is cheaper than halos)
    pools = [g for g in _gathers(c) if g[1] in ("pool", "select_and_scatter_add")
             or "for pool" in g[2] or "for select_and_scatter_add" in g[2]]
    assert not pools, pools
    report = c.diff(backends=("sim", "jax", "xla"), seed=2)
    assert report["ok"], [r for r in report["results"] if not r["ok"]]


def test_sum_pool_gradient_is_a_dilated_sum_pool():
    """avg_pool's gradient in the global program: one pool of the cotangent with lhs_dilation the
    strides (its transpose), no conv; the jax module spreads it with lax.pad's interior padding."""
    c = spmdlang.compile(_chain('avg_pool(x, 2)', 'avg_pool(a, 3, 2, "SAME")', 28, 8))
    assert "lhs_dilation=[2, 2]" in c.ir
    assert "groups=" not in c.ir  # no one-hot depthwise conv
    assert "jax.lax.pad(" in c.jax_source


def test_mnist_program_is_flaxs_mnist_training_step():
    """programs/train_mnist_cnn.spmd on [rows=8] (jax backend, our per-partition module) equals
    flax's examples/mnist CNN stepped with optax.sgd(0.1, momentum=0.9), run by jax on one device:
    the same loss, new parameters and new momentum, from a momentum that is not zero."""
    jax = pytest.importorskip("jax")
    pytest.importorskip("flax")
    import mnist_model as mm

    n = 4
    rng = np.random.default_rng(0)
    images = rng.standard_normal((n, 28, 28, 1)).astype(np.float32)
    labels = rng.integers(0, 10, n).astype(np.int32)
    params = mm.cnn.init(jax.random.PRNGKey(0), images)["params"]
    trace = jax.tree_util.tree_map(lambda a: 0.01 * rng.standard_normal(a.shape).astype(np.float32), params)
    opt_state = mm.tx.init(params)
    opt_state = (opt_state[0]._replace(trace=trace),) + tuple(opt_state[1:])
    loss, new_params, new_state = mm.train_step(params, opt_state, images, labels)

    c = spmdlang.compile(str(MNIST), consts={"N": n})
    leaf = lambda tree, f: np.asarray(tree[mm.FIELDS[f][0]][mm.FIELDS[f][1]])  # noqa: E731
    inputs = {"x": images, "labels": labels}
    for f in mm.FIELDS:
        inputs[f"p.{f}"], inputs[f"m.{f}"] = leaf(params, f), leaf(trace, f)
    got = dict(zip(result_names(c.program), c.run(inputs, backend="jax")))
    np.testing.assert_allclose(got["return0"], loss, rtol=1e-5)
    for f in mm.FIELDS:
        np.testing.assert_allclose(got[f"return1.{f}"], leaf(new_params, f), rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(got[f"return2.{f}"], leaf(new_state[0].trace, f), rtol=1e-4, atol=1e-6)


def test_avg_pool_lhs_dilation_keyword(tmp_path):
    """avg_pool(..., lhs_dilation=d): zeros between the input elements, then the pool, on rows split
    unevenly (5 over 2), every backend equal to numpy; bad values are errors at the argument."""
    path = tmp_path / "dil.spmd"
    path.write_text("mesh [rows=2]\n\nfunc main(x: f32[2, 5, 4, 3] {_, rows, _, _}) -> f32[2, 11, 8, 3] {\n"
                    "  return avg_pool(x, 2, 1, [[1, 2], [1, 1]], lhs_dilation=2)\n}\n")
    c = spmdlang.compile(str(path))
    x = np.random.default_rng(0).standard_normal((2, 5, 4, 3)).astype(np.float32)
    d = np.zeros((2, 9, 7, 3), np.float32)
    d[:, ::2, ::2] = x
    p = np.pad(d, [(0, 0), (1, 2), (1, 1), (0, 0)])
    want = sum(p[:, i:i + 11, j:j + 8] for i in range(2) for j in range(2)) / 4
    for b in ("ref", "sim"):
        np.testing.assert_allclose(np.asarray(c.run({"x": x}, backend=b)[0]), want, rtol=1e-6, atol=1e-6)
    assert "lhs_dilation=[2, 2]" in c.ir
    for call, msg in [("avg_pool(x, 2, 1, [[1, 2], [1, 1]], lhs_dilation=0)", "must be a positive integer"),
                      ("avg_pool(x, 2, 1, lhs_dilation=2)", "needs explicit padding")]:
        line = f"  return {call}"
        path.write_text(f"mesh [rows=2]\n\nfunc main(x: f32[2, 5, 4, 3]) -> f32[2, 11, 8, 3] {{\n{line}\n}}\n")
        with pytest.raises(spmdlang.SpmdError) as e:
            spmdlang.compile(str(path))
        col = line.index("lhs_dilation=") + len("lhs_dilation=") + 1  # at the value
        assert f"{path}:4:{col}: error: avg_pool" in str(e.value) and msg in str(e.value), str(e.value)


def test_int_max_pool_on_jax_with_x64_on():
    """An i32 max pool is lax.reduce_window with an init of its own dtype: a Python int init is an
    i64 once a module has enabled x64 (campaign seeds 701, 728, 1193 crashed so in a worker that
    had run a 64-bit program before), and reduce_window refuses the mixed dtypes."""
    src = """mesh [p=2]
func main(x: i32[6, 8, 3] {p, _, _}, n: i64[2]) -> (i32[6, 4, 3], i64[2]) {
  return max_pool(x, 1, 2, "VALID"), n + 1
}
"""
    c = spmdlang.compile(src)
    x = np.random.default_rng(0).integers(-2**31, 2**31 - 1, (6, 8, 3)).astype(np.int32)
    inputs = {"x": x, "n": np.array([2**40, -3], np.int64)}
    want = c.run(inputs, backend="ref")
    for b in ("sim", "jax"):
        for g, w in zip(c.run(inputs, backend=b), want):
            np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("padding,lhs", [("[[1, 2], [1, 1]]", 2), ("[[3, 0], [0, 4]]", 3), ("[[2, 3], [1, 2]]", 2)])
def test_avg_pool_lhs_dilation_gradient_with_windows_in_the_padding(padding, lhs):
    """The gradient of an lhs-dilated avg_pool whose padding reaches a window's size or more (its
    transposition's padding negative) was an internal error ("no gradient for this lhs-dilated
    pool"); it is the pool of the cotangent padded less, its outputs sliced. Rows split unevenly
    (5 over 2), every backend against jax.grad."""
    jax = pytest.importorskip("jax")
    src = (f"mesh [rows=2]\nfunc loss(x: f32[2, 5, 4, 3], w: f32[2, 5, 4, 3]) -> f32[] {{\n"
           f"  return sum(avg_pool(x * w, 2, 1, {padding}, lhs_dilation={lhs}) ** 2)\n}}\n"
           "func main(x: f32[2, 5, 4, 3] {_, rows, _, _}, w: f32[2, 5, 4, 3]) -> f32[2, 5, 4, 3] {\n"
           "  return grad(loss, x, w)\n}\n")
    c = spmdlang.compile(src, filename="pool_grad.spmd")
    rng = np.random.default_rng(0)
    x, w = (rng.standard_normal((2, 5, 4, 3)).astype(np.float32) for _ in range(2))
    pads = [(0, 0)] + [tuple(p) for p in json.loads(padding)] + [(0, 0)]

    def loss(x):
        s = jax.lax.reduce_window(x * w, 0.0, jax.lax.add, (1, 2, 2, 1), (1, 1, 1, 1), pads,
                                  base_dilation=(1, lhs, lhs, 1))
        return jax.numpy.sum((s / 4) ** 2)

    want = np.asarray(jax.grad(loss)(x))
    for b in ("ref", "sim", "jax"):
        np.testing.assert_allclose(np.asarray(c.run({"x": x, "w": w}, backend=b)[0]), want, rtol=1e-4, atol=1e-5)


def test_a_max_pools_gradient_reuses_its_forward_halos():
    """grad of conv -> relu -> max_pool with rows split: the backward pass needs the halos the
    forward pass exchanged (of the input, through a transpose of its size-1 dims, and of relu's
    output). They are sent once: 6 collectives, what XLA runs of our module (explain listed 9,
    three of them copies XLA merged), and every backend agrees with the reference."""
    c = spmdlang.compile("mesh [h=2]\nfunc loss(k: f32[3, 1, 1, 1], x: f32[1, 10, 4, 1]) -> f32[] {\n"
                         "  z = max_pool(relu(conv(x, k, padding=\"SAME\")), 2)\n  return sum(z * z)\n}\n"
                         "func main(k: f32[3, 1, 1, 1], x: f32[1, 10, 4, 1] {_, h, _, _})\n"
                         "    -> (f32[], f32[3, 1, 1, 1]) {\n"
                         "  l, g = value_and_grad(loss, k, x, argnums=[0])\n  return l, g\n}\n")
    kinds = [e["kind"] for e in c.explain_report()["collectives"]]
    assert len(kinds) == 6 and kinds.count("collective_permute") == 5, kinds
    inputs = c.random_inputs(0)
    ref = c.run(inputs, backend="ref")
    for backend in ("sim", "jax"):
        for got, want in zip(c.run(inputs, backend=backend), ref):
            np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)
