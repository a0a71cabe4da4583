"""Resharding before the ops that make a value, where its consumer wants it in another layout
(partition/consumer.py): a slice then a roll along a split dim, then a shard() to replicated,
is one all_gather of the input and local work, not a halo exchange per op and a gather after;
where moving the ops would cost more (a contraction that would run replicated), the reshard
stays where it is cheapest. Every case checks ref, sim and jax on uneven splits."""

from __future__ import annotations

from pathlib import Path

import pytest

import spmdlang
from spmdlang.ir.verify import verify
from spmdlang.partition.reshard import step_bytes

ROOT = Path(__file__).resolve().parent.parent
PATTERN = ROOT / "benchmarks" / "patterns" / "consumer_layout.spmd"
F32 = 4


def compiled(src, mesh=None, consts=None):
    c = spmdlang.compile(src, mesh=mesh, consts=consts)
    verify(c.spmd.program)
    d = c.diff(backends=["ref", "sim", "jax"])
    assert d["ok"], f"backends differ: {d['results']}\n{c.spmd_ir}"
    return c


def kinds(c) -> list[str]:
    return [str(e.kind) for e in c.spmd.ledger]


@pytest.mark.parametrize("rows,mesh,chunk", [
    (13, {"x": 8, "y": 1}, (2, 4)),   # 13 rows over 8: shards of 2, 2, ..., 1, 0
    (64, {"x": 8, "y": 1}, (8, 4)),
    (10, {"x": 4, "y": 2}, (3, 2)),   # columns stay split over y
])
def test_slice_roll_then_replicated_is_one_gather_of_the_input(rows, mesh, chunk):
    c = compiled(str(PATTERN), mesh=mesh, consts={"R": rows, "C": 4})
    # before: a halo permute for the slice, 2-4 for the roll, and an all_gather of the result
    assert kinds(c) == ["all_gather"], c.spmd_ir
    (g,) = c.spmd.ledger
    assert g.axes == ("x",)
    assert g.bytes_per_device == step_bytes("all_gather", mesh["x"], chunk[0] * chunk[1] * F32)


def test_a_chain_with_two_consumers_that_agree_moves_too():
    c = compiled("""mesh [t=4]
func main(x: f32[11, 6] {t, _}) -> (f32[9, 6], f32[9, 6]) {
  y = roll(x[2:, :] * 3.0, -2, 0)
  return shard(y, {_, _}) + 1.0, exp(shard(y, {_, _}))
}""")
    assert kinds(c) == ["all_gather"]
    assert c.spmd.ledger[0].bytes_per_device == step_bytes("all_gather", 4, 3 * 6 * F32)


def test_a_use_that_wants_a_split_slices_the_consumers_layout():
    # one use wants y replicated, the other split as propagation made it: y is made replicated
    # (one gather of x, local slice and roll), and the split use takes its rows locally
    c = compiled("""mesh [t=4]
func main(x: f32[15, 8] {t, _}) -> (f32[14, 8], f32[14, 8] {t, _}) {
  y = roll(x[1:, :], 1, 0)
  return shard(y, {_, _}), y
}""")
    assert kinds(c) == ["all_gather"]
    assert c.spmd.ledger[0].bytes_per_device == step_bytes("all_gather", 4, 4 * 8 * F32)


def test_a_contraction_before_the_moves_stays_sharded():
    # the roll runs in the consumer's layout (h gathered once), the einsum keeps its rows split:
    # running it replicated would gather x (as many bytes as h) and multiply 4x the FLOPs
    c = compiled("""mesh [t=4]
func main(x: f32[30, 64] {t, _}, w: f32[64, 64]) -> f32[30, 64] {
  h = x @ w
  return shard(roll(h, 3, 0), {_, _})
}""")
    assert kinds(c) == ["all_gather"]
    (g,) = c.spmd.ledger
    assert "%h" in g.reason and g.bytes_per_device == step_bytes("all_gather", 4, 8 * 64 * F32)
    einsum = next(op for op in c.spmd.program.ops if op.kind == "einsum")
    assert einsum.operands[0].type.shape == (8, 64)


def test_a_replicated_result_of_a_pad_is_gathered_first():
    # a result (not a shard()) that wants the value replicated: the pad runs on the gathered input
    c = compiled("""mesh [t=8]
func main(x: f32[21, 3] {t, _}) -> f32[25, 3] {_, _} {
  return pad(x, [[2, 2], [0, 0]], value=1.0) * 2.0
}""")
    assert kinds(c) == ["all_gather"]
    assert c.spmd.ledger[0].bytes_per_device == step_bytes("all_gather", 8, 3 * 3 * F32)
