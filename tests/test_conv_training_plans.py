"""Kernel gradients of spatially split convs partition as GSPMD does: a contraction over the
window. The kernel-gradient conv correlates the input (its spatial dims split over an axis) with
the output cotangent as its kernel (the cotangent's spatial dims, split alike, are the window).
Each shard correlates its cotangent rows with its input rows plus a halo from the next shards, and
the small kernel gradient is a pending sum over the spatial axis, settled with the data-parallel
all-reduce. Never a whole-image all_gather, and an unannotated kernel stays replicated.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import spmdlang

ROOT = Path(__file__).resolve().parent.parent


def _program(nsp, win, stride, rhs_dil, padding, spatial, mesh="data=2, h=3", n=4, c=3, f=5):
    """d/dw of sum(conv(x, w) * t) with x split {data, h, _...}: the kernel gradient alone."""
    from spmdlang.ops.contract import conv_output_size

    out = [conv_output_size(spatial[i], win[i], stride[i], *padding[i], 1, rhs_dil[i]) for i in range(nsp)]
    dims = lambda xs: ", ".join(str(s) for s in xs)  # noqa: E731
    xl = ", ".join(["data", "h"] + ["_"] * nsp)
    pad = "[" + ", ".join(f"[{lo}, {hi}]" for lo, hi in padding) + "]"
    return f"""mesh [{mesh}]
func loss(w: f32[{dims(win)}, {c}, {f}], x: f32[{n}, {dims(spatial)}, {c}], t: f32[{n}, {dims(out)}, {f}]) -> f32[] {{
  return sum(conv(x, w, stride={list(stride)}, padding={pad}, rhs_dilation={list(rhs_dil)}) * t)
}}
func main(w: f32[{dims(win)}, {c}, {f}], x: f32[{n}, {dims(spatial)}, {c}] {{{xl}}},
          t: f32[{n}, {dims(out)}, {f}] {{{xl}}}) -> f32[{dims(win)}, {c}, {f}] {{
  return grad(loss, w, x, t)
}}
"""


CASES = [
    # nsp, window, stride, rhs_dilation, padding, spatial, mesh
    (2, (3, 3), (1, 1), (1, 1), ((1, 1), (1, 1)), (12, 12), "data=2, h=3"),
    (2, (3, 3), (1, 1), (1, 1), ((1, 1), (1, 1)), (14, 14), "data=2, h=3"),  # uneven
    (2, (3, 3), (1, 1), (2, 2), ((2, 2), (2, 2)), (6, 6), "data=2, h=3"),  # atrous
    (2, (3, 2), (2, 1), (1, 1), ((1, 1), (0, 1)), (13, 7), "data=2, h=3"),  # strided, uneven
    (2, (3, 3), (2, 2), (2, 1), ((0, 0), (1, 1)), (11, 9), "data=2, h=4"),  # strided and dilated, VALID rows
    (1, (5,), (1,), (1,), ((2, 2),), (20,), "data=2, h=4"),
    (1, (3,), (3,), (1,), ((0, 0),), (17,), "data=1, h=3"),  # the last rows reach no window
    (3, (3, 3, 3), (1, 1, 1), (1, 1, 1), ((1, 1), (1, 1), (1, 1)), (8, 6, 6), "data=2, h=3"),
]


def _kernel_grad_convs(c):
    """The ledger entries of the kernel-gradient conv: gathers over h (whole images) must not be there."""
    return [e for e in c.spmd.ledger if e.op == "conv" and e.backward]


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}d-{c[5]}-{c[6]}" for c in CASES])
def test_kernel_gradient_is_halo_plus_partial_sum(case):
    nsp, win, stride, rhs_dil, padding, spatial, mesh = case
    c = spmdlang.compile(_program(nsp, win, stride, rhs_dil, padding, spatial, mesh))
    inputs = c.random_inputs(3)
    ref = c.run(inputs, backend="ref")[0]
    got = c.run(inputs, backend="sim")[0]
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(ref).max())))
    assert np.abs(ref).max() > 0.1  # a real gradient, not a vanishing one
    kinds = {(e.kind, e.axes) for e in c.spmd.ledger}
    # no all_gather (or all_to_all) over the spatial axis anywhere: halos and one combined all-reduce
    assert not [e for e in c.spmd.ledger if e.kind in ("all_gather", "all_to_all") and "h" in e.axes], kinds
    # the convs exchange halos only (none where the windows do not overlap: stride >= window)
    assert {e.kind for e in _kernel_grad_convs(c)} <= {"collective_permute"}, kinds
    if stride[0] < win[0]:
        assert any(e.kind == "collective_permute" and e.axes == ("h",) for e in _kernel_grad_convs(c)), kinds
    reduces = [e for e in c.spmd.ledger if e.kind == "all_reduce"]
    assert len(reduces) == 1 and "h" in reduces[0].axes, kinds
    # the halo is bounded by the output window, not the image
    halo = sum(e.bytes_per_device for e in _kernel_grad_convs(c) if e.kind == "collective_permute")
    x_bytes = 4 * 4 * np.prod(spatial) * 3
    assert halo < x_bytes / 2


def test_cnn_training_step_keeps_kernels_replicated_and_beats_xla_bytes():
    """benchmarks/patterns/train_cnn.spmd: the kernels stay replicated, the kernel gradients are
    halos plus the one all-reduce, and the plan sends no whole-image gather."""
    c = spmdlang.compile((ROOT / "benchmarks" / "patterns" / "train_cnn.spmd").read_text())
    s = c.shardings
    for name in ("w1", "w2"):
        assert not any(s[name].dims), (name, s[name])
    gathers = [e for e in c.spmd.ledger if e.kind == "all_gather" and "h" in e.axes]
    assert not gathers, [(e.reason, e.bytes_per_device) for e in gathers]
    assert sum(e.bytes_per_device for e in c.spmd.ledger) <= 14_000


POOLS = [
    # kind, spatial, window, stride, padding, mesh
    ("max", "14, 14", "2", "2", '"VALID"', "data=2, h=3"),  # uneven: 14 rows and 7 pooled rows over 3
    ("max", "13, 6", "3", "2", '"SAME"', "data=2, h=4"),  # overlapping windows, padded with -inf
    ("avg", "10, 7", "[2, 3]", "[2, 1]", '"SAME"', "data=1, h=3"),
    ("max", "9, 4, 4", "2", "2", '"VALID"', "data=2, h=3"),  # 3-D, the odd last row in no window
]


@pytest.mark.parametrize("case", POOLS, ids=[f"{c[0]}-{c[1]}-{c[5]}" for c in POOLS])
def test_pool_gradient_stays_local_plus_halo_on_uneven_splits(case):
    """max_pool's and avg_pool's input gradients with the rows split unevenly: halos only (a max
    pool's is select_and_scatter_add, halos of the input and of the cotangent; a sum pool's
    cotangent goes back as a sum pool dilated by the strides), matching ref and jax's autodiff
    (the xla backend), relu's zeros making max ties whose cotangent goes to the first maximum."""
    kind, spatial, window, stride, padding, mesh = case
    nsp = spatial.count(",") + 1
    lay = ", ".join(["data", "h"] + ["_"] * nsp)
    src = f"""mesh [{mesh}]
func loss(x: f32[4, {spatial}, 3], t: f32[4, {spatial}, 3]) -> f32[] {{
  p = {kind}_pool(relu(x), {window}, {stride}, {padding})
  return sum(p * p) + sum(x * t)
}}
func main(x: f32[4, {spatial}, 3] {{{lay}}}, t: f32[4, {spatial}, 3] {{{lay}}}) -> f32[4, {spatial}, 3] {{{lay}}} {{
  return grad(loss, x, t)
}}
"""
    c = spmdlang.compile(src)
    report = c.diff(backends=("sim", "xla"), seed=1)
    assert report["ok"], report["results"]
    gathers = [(e.kind, e.reason) for e in c.spmd.ledger if e.kind in ("all_gather", "all_to_all")]
    assert not gathers, gathers
