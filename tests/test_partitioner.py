"""The partitioner's rooms (partition.emitter, strategies, loops, settlement) behind the one
entry point `partition`, which reads the propagation it is given and writes nothing into it."""

from __future__ import annotations

import spmdlang
from spmdlang.partition.spmd import partition
from spmdlang.partition.strategies import FactorPlan

# three operands: the einsum's custom step plans its intermediates (trial, step) as it goes;
# the mesh's axis of size one is dropped from the layouts the partitioner plans
CHAIN = """mesh [a=2, b=2, c=1]
func main(x: f32[8, 6] {a, _}, y: f32[6, 4] {_, b}, z: f32[4, 10]) -> f32[8, 10] {
  return einsum("ij,jk,kl->il", x, y, z)
}
"""


def test_partition_is_pure():
    c = spmdlang.compile(CHAIN, verify=True)
    prop = c.propagation
    before = dict(prop.shardings)
    first = partition(c.canonical, prop)
    assert prop.shardings == before  # no value added, none replanned
    second = partition(c.canonical, prop)
    assert [(e.kind, e.axes, e.bytes_per_device) for e in first.ledger] == [
        (e.kind, e.axes, e.bytes_per_device) for e in second.ledger]
    assert c.diff(backends=("sim",))["ok"]


def test_a_factor_plan_ranks_by_score_then_work():
    plan = lambda score, work: FactorPlan(score, work, {}, [], [], [], None)  # noqa: E731
    assert plan(1.0, 5.0).key < plan(1.0, 6.0).key < plan(2.0, 0.0).key
