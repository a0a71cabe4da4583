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


def test_the_pipeline_runs_its_named_passes_lazily_verifying_each():
    from dataclasses import replace

    from spmdlang.partition import pipeline as P

    assert [p.name for p in P.PASSES] == ["canonicalize", "shard_weight_updates", "propagate", "partition", "finish"]
    seen = []
    passes = tuple(replace(p, check=lambda s, _p=p: (seen.append(_p.name), _p.check(s))) for p in P.PASSES)
    pipe = P.Pipeline(spmdlang.compile(CHAIN).program, verify=True, weight_axis="a", passes=passes)
    pipe.stage("canonical")
    assert seen == ["canonicalize", "shard_weight_updates"]  # nothing past the stage asked for
    spmd = pipe.stage("spmd")
    assert seen == ["canonicalize", "shard_weight_updates", "propagate", "partition", "finish"]
    assert pipe.stage("spmd") is spmd  # each pass runs once
    off = P.Pipeline(spmdlang.compile(CHAIN).program, verify=False, passes=passes)
    off.stage("spmd")
    assert len(seen) == 5  # verification off: no verifier ran


def test_rewrite_regions_keeps_what_it_did_not_change():
    from spmdlang.ir.core import LOOP, rewrite_regions

    c = spmdlang.compile("programs/stack_scan.spmd")
    loop = next(op for op in c.canonical.ops if op.kind == LOOP)
    assert rewrite_regions(loop, lambda r: list(r.ops)) is loop
    shorter = rewrite_regions(loop, lambda r: list(r.ops[:-1]))
    assert shorter is not loop and shorter.regions[0].ops == loop.regions[0].ops[:-1]
    assert shorter.regions[0].results == loop.regions[0].results
