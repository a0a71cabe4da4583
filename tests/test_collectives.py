"""The collective table (ir.collectives) is the one place a collective kind is declared: it agrees
with the op table, the cost model reads it, the verifier enforces its attributes, and the HLO
reader parses XLA's opcodes through it."""

from __future__ import annotations

import json

import pytest

import spmdlang
from spmdlang.backend_jax.hlo import collectives as hlo_collectives
from spmdlang.ir import registry
from spmdlang.ir import verify as V
from spmdlang.ir.collectives import COLLECTIVES, CollectiveKind, latency_steps, step_bytes
from spmdlang.ir.core import Op, Value
from spmdlang.ir.names import OpName
from spmdlang.ir.registry import Family
from spmdlang.partition import cost


def test_the_table_and_the_op_table_name_the_same_collectives():
    in_op_table = {name for name, op in registry.OPS.items() if op.family == Family.collective}
    assert in_op_table == {str(k) for k in COLLECTIVES}
    assert set(COLLECTIVES) == set(CollectiveKind)


def test_compared_op_names_are_op_table_entries():
    for name in OpName:
        assert name in registry.OPS, name


def test_kinds_print_as_their_names():
    k = CollectiveKind.ALL_GATHER
    assert (f"{k}", str(k), json.dumps({"kind": k})) == ("all_gather", "all_gather", '{"kind": "all_gather"}')


@pytest.mark.parametrize("kind, steps, sent", [
    ("all_gather", 3, 300.0), ("all_reduce", 6, 150.0), ("reduce_scatter", 3, 75.0),
    ("all_to_all", 3, 75.0), ("collective_permute", 1, 100.0), ("shard_slice", 0, 0.0),
])
def test_cost_formulas_come_from_the_table(kind, steps, sent):
    assert latency_steps(kind, 4) == steps and step_bytes(kind, 4, 100.0) == sent
    assert cost.latency_steps(kind, 1) == 0  # a group of one waits for nobody
    assert cost.collective_cost(kind, 4, sent) == sent + cost.LATENCY_BYTES * steps


def test_the_verifier_holds_a_collective_to_its_attributes():
    spmd = spmdlang.compile("mesh [a=2]\nfunc main(x: f32[8] {a}) -> f32[8] {\n  return x\n}\n",
                            verify=False).spmd
    prog = spmd.program
    x = prog.params[0].value
    good = Op("all_gather", (x,), (Value(x.type.with_shape((8,))),), {"axes": ("a",), "dim": 0, "group": 2})
    V.verify(prog.replace(ops=(good,)))
    extra = good.replace(attrs={**good.attrs, "reduce": "sum"})
    with pytest.raises(V.VerifyError, match="but a all_gather carries"):
        V.verify(prog.replace(ops=(extra,)))


def test_hlo_opcodes_and_operand_bytes_come_from_the_table():
    text = """ENTRY %main (p: f32[8]) -> f32[16] {
  %ag = f32[16]{0} all-gather(f32[8]{0} %p), replica_groups={{0,1}}, dimensions={0}
  %rs = f32[4]{0} reduce-scatter(f32[8]{0} %p), replica_groups={{0,1}}, dimensions={0}
  %ar = f32[8]{0} all-reduce(f32[8]{0} %p), replica_groups={{0,1}}
  %aa = f32[8]{0} all-to-all(f32[8]{0} %p), replica_groups={{0,1}}, dimensions={0}
  %cp = f32[8]{0} collective-permute(f32[8]{0} %p), source_target_pairs={{0,1},{1,0}}
}"""
    got = [(c["kind"], c["group"], c["bytes_per_device"]) for c in hlo_collectives(text)]
    # every operand is f32[8] (32 bytes): the reader recovers it from each result's shape
    assert got == [("all_gather", 2, 32.0), ("reduce_scatter", 2, 16.0), ("all_reduce", 2, 32.0),
                   ("all_to_all", 2, 16.0), ("collective_permute", 1, 32)]
