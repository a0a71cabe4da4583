"""Ops whose output depends on neighbouring shards: conv windows, pad, slice, roll, concat, and the
pipeline's rotation. Every case checks sim == ref (with padding poisoned) and the collective plan:
along a split dim these move data with collective_permutes only, never by gathering the dim --
at every size (a gathered dim holds memory that windows do not, and the two directions of an
exchange overlap). Only where the windows would send more than gathering does one all_gather win.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

import spmdlang

ROOT = Path(__file__).resolve().parent.parent
ROW = 2048  # elements per row of the moved dim: enough that gathering whole shards is expensive


def plan(src: str, mesh=None):
    c = spmdlang.compile(src, mesh=mesh)
    d = c.diff(backends=["ref", "sim"])
    assert d["ok"], f"{d['results']}\n{src}\n{c.spmd_ir}"
    return Counter(e.kind for e in c.spmd.ledger), c


def only_permutes(kinds: Counter) -> bool:
    return set(kinds) <= {"collective_permute"}


# ---------------------------------------------------------------------------------- conv


@pytest.mark.parametrize("n,k,stride,padding", [
    (32, 2, 1, '"SAME"'), (33, 2, 1, '"SAME"'), (31, 4, 2, '"SAME"'), (40, 4, 1, '"VALID"'),
    (29, 3, 2, "[[2, 1]]"), (64, 8, 3, '"SAME"'),
])
def test_conv1d_split_spatially_is_only_permutes(n, k, stride, padding):
    src = f"""mesh [t={k}]
func main(x: f32[8, {n}, 64] {{_, t, _}}, w: f32[5, 64, 64]) -> f32[8, {{out}}, 64] {{_, t, _}} {{
  return conv(x, w, stride={stride}, padding={padding})
}}"""
    out = _conv_out(n, 5, stride, padding)
    kinds, _ = plan(src.replace("{out}", str(out)))
    assert only_permutes(kinds) and kinds["collective_permute"] >= 1, kinds


def _conv_out(n, window, stride, padding):
    if padding == '"SAME"':
        return -(-n // stride)
    if padding == '"VALID"':
        return (n - window) // stride + 1
    lo, hi = (int(v) for v in padding.strip("[]").split(","))
    return (n + lo + hi - window) // stride + 1


@pytest.mark.parametrize("h,w,mesh", [(16, 16, "a=2, b=2"), (17, 15, "a=3, b=2"), (9, 9, "a=1, b=4")])
def test_conv2d_split_on_both_spatial_dims_is_only_permutes(h, w, mesh):
    kinds, _ = plan(f"""mesh [{mesh}]
func main(x: f32[4, {h}, {w}, 32] {{_, a, b, _}}, k: f32[3, 3, 32, 32]) -> f32[4, {h}, {w}, 32] {{_, a, b, _}} {{
  return conv(x, k)
}}""")
    assert only_permutes(kinds), kinds


def test_conv_halo_sends_only_the_halo_rows():
    _, c = plan("""mesh [a=4]
func main(x: f32[8, 64, 64] {_, a, _}, k: f32[3, 64, 64]) -> f32[8, 64, 64] {_, a, _} {
  return conv(x, k)
}""")
    # a 3-wide SAME window needs one row from each neighbour: 2 permutes of one [8, 1, 64] row
    assert [e.kind for e in c.spmd.ledger] == ["collective_permute"] * 2
    assert all(e.bytes_per_device == 8 * 1 * 64 * 4 for e in c.spmd.ledger)


def test_conv_batch_and_feature_splits_are_local():
    kinds, _ = plan("""mesh [d=2, m=2]
func main(x: f32[4, 10, 3] {d, _, _}, k: f32[3, 3, 6] {_, _, m}) -> f32[4, 10, 6] {d, _, m} {
  return conv(x, k)
}""")
    assert not kinds


# ---------------------------------------------------------------------------------- pad / slice / roll


@pytest.mark.parametrize("n,k,lo,hi", [(16, 4, 2, 1), (13, 4, 2, 1), (12, 3, 0, 5), (7, 2, 1, 1)])
def test_pad_along_a_split_dim_is_only_permutes(n, k, lo, hi):
    kinds, _ = plan(f"""mesh [x={k}]
func main(a: f32[{n}, {ROW}] {{x, _}}) -> f32[{n + lo + hi}, {ROW}] {{x, _}} {{
  return pad(a, [[{lo}, {hi}], [0, 0]], value=1.5)
}}""")
    assert only_permutes(kinds), kinds


@pytest.mark.parametrize("n,k,start,stop,step", [(16, 4, 1, 16, 2), (16, 4, 3, 12, 1), (13, 3, 0, 13, 3),
                                                 (20, 4, 5, 19, 1)])
def test_slice_along_a_split_dim_is_only_permutes(n, k, start, stop, step):
    m = -(-(stop - start) // step)
    kinds, _ = plan(f"""mesh [x={k}]
func main(a: f32[{n}, {ROW}] {{x, _}}) -> f32[{m}, {ROW}] {{x, _}} {{
  return a[{start}:{stop}:{step}, :]
}}""")
    assert only_permutes(kinds), kinds


@pytest.mark.parametrize("n,k,shift", [(16, 4, 1), (16, 4, 3), (16, 4, -1), (16, 4, 9), (12, 3, 4)])
def test_roll_of_an_evenly_split_dim(n, k, shift):
    kinds, _ = plan(f"""mesh [x={k}]
func main(a: f32[{n}, {ROW}] {{x, _}}) -> f32[{n}, {ROW}] {{x, _}} {{
  return roll(a, {shift}, 0)
}}""")
    assert only_permutes(kinds), kinds
    c = n // k
    # shard i takes its window from shards i + q, q in {floor(-s/c), that + 1 if s is not a
    # multiple of c}; each q that is not the shard itself (mod k) is one collective_permute
    s = shift % n
    qs = {(-s) // c} | ({(-s) // c + 1} if s % c else set())
    assert kinds["collective_permute"] == sum(q % k != 0 for q in qs), kinds


@pytest.mark.parametrize("n,k,shift", [(13, 4, 1), (13, 4, 7), (11, 3, -1), (10, 3, 12)])
def test_roll_of_an_unevenly_split_dim(n, k, shift):
    """Two windows (the wrapped part and the shifted part): up to three permutes, which pay off
    once rows are large (here 64 KB each) against gathering the dim."""
    row = 8 * ROW
    kinds, _ = plan(f"""mesh [x={k}]
func main(a: f32[{n}, {row}] {{x, _}}) -> f32[{n}, {row}] {{x, _}} {{
  return roll(a, {shift}, 0)
}}""")
    assert only_permutes(kinds), kinds


def test_windows_moving_more_than_the_dim_fall_back_to_one_gather():
    """An uneven rotation of 5 rows over 2 shards: two windows send 4 rows in 2 permutes; one
    all_gather sends 3."""
    kinds, c = plan(f"""mesh [x=2]
func main(a: f32[5, {ROW}] {{x, _}}) -> f32[5, {ROW}] {{x, _}} {{
  return roll(a, 2, 0)
}}""")
    assert kinds == Counter({"all_gather": 1})


def test_a_window_that_only_reaches_padding_needs_no_communication():
    """pad([[3, 3]]) of 7 rows over 2 shards: shard 0's output is 3 pad rows + its own 4 rows,
    shard 1's is its own 3 rows + 3 pad rows. Clipped to the real rows, no shard needs a byte
    of its neighbour's (a hull of the unclipped windows would have moved a whole shard)."""
    kinds, _ = plan(f"""mesh [x=2]
func main(a: f32[7, {ROW}] {{x, _}}) -> f32[13, {ROW}] {{x, _}} {{
  return pad(a, [[3, 3], [0, 0]])
}}""")
    assert not kinds


def test_rotation_written_as_slices_and_concat_is_one_permute():
    kinds, c = plan(f"""mesh [x=4]
func main(a: f32[16, {ROW}] {{x, _}}) -> f32[16, {ROW}] {{x, _}} {{
  return concat([a[13:16], a[0:13]], 0)
}}""")
    assert kinds == Counter({"collective_permute": 1})
    assert "roll" in c.spmd_ir


def test_concat_along_a_split_dim():
    kinds, _ = plan(f"""mesh [x=4]
func main(a: f32[10, {ROW}] {{x, _}}, b: f32[7, {ROW}] {{x, _}}) -> f32[17, {ROW}] {{x, _}} {{
  return concat([a, b], 0)
}}""")
    assert set(kinds) <= {"collective_permute", "all_gather"}


def test_tiny_windows_that_move_more_than_a_gather_take_one_gather():
    """concat([a, a]) of 8 elements over 4: the windows would send more than gathering a (24
    bytes); gathering holds the 8 elements the windows would hold anyway."""
    kinds, c = plan("""mesh [x=4]
func main(a: f32[8] {x}) -> f32[16] {x} {
  return concat([a, a], 0)
}""")
    assert kinds == Counter({"all_gather": 1})
    assert c.spmd.ledger[0].bytes_per_device == 3 * 2 * 4


# ---------------------------------------------------------------------------------- B1: small halos


def _ledger(c):
    return sorted((e.kind, tuple(e.axes), int(e.bytes_per_device)) for e in c.spmd.ledger)


def test_b1_small_same_conv_is_two_permutes_not_a_gather():
    """3x3 SAME conv on f32[2, 32, 32, 8] {_, h, _, _} over [h=2] (32 KB per device): one row each
    way, 2 x 2,048 bytes, as XLA does; it used to gather the whole image (32,768 bytes)."""
    _, c = plan("""mesh [h=2]
func main(x: f32[2, 32, 32, 8] {_, h, _, _}, w: f32[3, 3, 8, 8]) -> f32[2, 32, 32, 8] {_, h, _, _} {
  return conv(x, w, padding="SAME")
}""")
    assert _ledger(c) == [("collective_permute", ("h",), 2048)] * 2


def test_b1_tiny_conv1d_is_two_permutes():
    """A 1-D conv on [2, 32, 3] {_, h, _} over [h=4] (192 bytes per device): 2 x 24 bytes."""
    _, c = plan("""mesh [h=4]
func main(x: f32[2, 32, 3] {_, h, _}, w: f32[3, 3, 3]) -> f32[2, 32, 3] {_, h, _} {
  return conv(x, w, padding="SAME")
}""")
    assert _ledger(c) == [("collective_permute", ("h",), 24)] * 2


def test_b1_strided_7x7_conv_is_two_permutes():
    """Stride-2 7x7 SAME conv over [x=2]: 2 rows from below, 3 from above (XLA: 1,536 + 2,304)."""
    _, c = plan("""mesh [x=2]
func main(x: f32[2, 32, 32, 3] {_, x, _, _}, w: f32[7, 7, 3, 8]) -> f32[2, 16, 16, 8] {_, x, _, _} {
  return conv(x, w, stride=2, padding="SAME")
}""")
    assert _ledger(c) == [("collective_permute", ("x",), 1536), ("collective_permute", ("x",), 2304)]


@pytest.mark.parametrize("n,out", [(16, 19), (64, 67)])
def test_b1_pad_of_a_split_dim_is_permutes(n, out):
    """pad([[2, 1]]) over [x=4]: a few rows each way; it used to gather the dim."""
    _, c = plan(f"""mesh [x=4]
func main(a: f32[{n}, 16] {{x, _}}) -> f32[{out}, 16] {{x, _}} {{
  return pad(a, [[2, 1], [0, 0]])
}}""")
    kinds = Counter(e.kind for e in c.spmd.ledger)
    assert kinds == Counter({"collective_permute": 2}), kinds
    assert sum(e.bytes_per_device for e in c.spmd.ledger) < 3 * (n // 4) * 16 * 4


# ---------------------------------------------------------------------------------- no communication


@pytest.mark.parametrize("v,k", [(16, 4), (13, 4)])
def test_one_hot_split_on_classes_needs_no_collective(v, k):
    kinds, _ = plan(f"""mesh [c={k}]
func main(ids: i32[6]) -> f32[6, {v}] {{_, c}} {{
  return one_hot(ids, {v})
}}""")
    assert not kinds


# ---------------------------------------------------------------------------------- pipeline


def test_pipeline_is_one_permute_per_step():
    kinds, c = plan(str(ROOT / "programs" / "pipeline.spmd"))
    steps = 8 + 4 - 1  # M + S - 1; the last step's roll is dead and removed
    assert kinds["collective_permute"] == steps - 1
    assert kinds["all_reduce"] == 1 and set(kinds) == {"collective_permute", "all_reduce"}


@pytest.mark.parametrize("mesh", [{"stage": 2, "data": 3}, {"stage": 4, "data": 1}])
def test_pipeline_on_other_meshes(mesh):
    plan(str(ROOT / "programs" / "pipeline.spmd"), mesh=mesh)


# ---------------------------------------------------------------------------------- B5: shared halos


def test_b5_shifted_slices_of_a_padded_tensor_share_one_exchange():
    """A depthwise conv written as 7 shifted slices of pad(x) (Conformer): one 3-row exchange each
    way (2 permutes, 2 x 3 rows x 64 channels x 2 batch x 4 B) covers every slice; the pad's own
    halo is dead. Each slice used to do its own (12 permutes, 17,920 B; XLA the same)."""
    _, c = plan(str(ROOT / "benchmarks" / "patterns" / "shifted_slices.spmd"))
    assert _ledger(c) == [("collective_permute", ("t",), 3 * 64 * 2 * 4)] * 2


@pytest.mark.parametrize("n,k", [(32, 4), (29, 3), (10, 4)])
def test_b5_shifted_slices_without_a_pad(n, k):
    """Three shifted slices of an unpadded tensor: one exchange (at most one permute each way)."""
    kinds, c = plan(f"""mesh [t={k}]
func main(x: f32[{n}, 16] {{t, _}}) -> f32[{n - 2}, 16] {{t, _}} {{
  return x[0:{n - 2}] + 2.0 * x[1:{n - 1}] + 3.0 * x[2:{n}]
}}""")
    assert set(kinds) <= {"collective_permute"} and kinds["collective_permute"] <= 2, kinds


# ---------------------------------------------------------------------------------- B3: reshape halos


def test_b3_reshape_merging_dims_under_an_uneven_split_is_one_permute():
    """f32[600, 7, 10] {_, x, _} -> f32[600, 14, 5] {_, x, _} on [x=2]: shard 0 holds 4 rows of 10
    (40 elements) and needs 7 rows of 5 (35): 5 elements x 600 cross the border, one permute of
    12,000 B (XLA's ReshapeMergeDimsWithHaloExchange does the same); it used to gather 96,000 B."""
    _, c = plan(str(ROOT / "benchmarks" / "patterns" / "reshape_merge_halo.spmd"))
    assert _ledger(c) == [("collective_permute", ("x",), 12000)]


@pytest.mark.parametrize("src,dst,mesh,want", [
    ("f32[4, 14, 5] {_, x, _}", "f32[4, 7, 10] {_, x, _}", "x=2", {"collective_permute"}),
    ("f32[10, 6] {x, _}", "f32[15, 4] {x, _}", "x=4", {"collective_permute"}),
    ("f32[9, 7, 2] {x, _, _}", "f32[21, 6] {x, _}", "x=3", set()),  # the borders coincide: local
])
def test_b3_reshape_across_uneven_borders_is_only_permutes(src, dst, mesh, want):
    shape = dst.split("]")[0].split("[")[1]
    kinds, _ = plan(f"""mesh [{mesh}]
func main(a: {src}) -> {dst} {{
  return reshape(a, [{shape}]) * 2.0
}}""")
    assert set(kinds) == want, kinds


@pytest.mark.parametrize("latency", [0.0, 16.0, 45_000.0, 450_000.0])
@pytest.mark.parametrize("src", ["halo_conv2d", "halo_conv1d", "halo_strided_conv"])
def test_spatial_partitioning_never_gathers_the_image_at_any_latency(monkeypatch, latency, src):
    """From no latency to ten times TPU v4's alpha * beta per step: a spatially split conv exchanges
    halos, never gathers the image (the memory spatial partitioning exists to save)."""
    from spmdlang.partition import cost, reshard

    monkeypatch.setattr(cost, "LATENCY_BYTES", latency)
    reshard._plan_reshard.cache_clear()
    try:
        for consts in ({}, {"N": 2, "HW": 8} if src != "halo_conv1d" else {"T": 8}):
            c = spmdlang.compile(str(ROOT / "benchmarks" / "patterns" / f"{src}.spmd"), consts=consts)
            assert {e.kind for e in c.spmd.ledger} == {"collective_permute"}, (latency, consts, c.spmd.ledger)
    finally:
        reshard._plan_reshard.cache_clear()
