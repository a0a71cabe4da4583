"""The op table checks itself: every entry is whole, `register` rejects one that is not, rules
print in Shardy's notation, and `spmdlang ops` lists every primitive with its rule and doc."""

from __future__ import annotations

import json

import numpy as np
import pytest

from spmdlang import cli
from spmdlang.ir import registry
from spmdlang.ir.registry import Family, OpTableError, PartialMode, ReduceKind, Stage
from spmdlang.ir.types import TensorType

GLOBAL = [op for op in registry.OPS.values() if not op.local_only]


@pytest.mark.parametrize("op", list(registry.OPS.values()), ids=lambda op: op.name)
def test_every_entry_is_whole(op):
    assert op.doc and "\n" not in op.doc
    assert isinstance(op.family, Family) and isinstance(op.stage, Stage)
    assert op.jax is not None
    if op.local_only:
        assert op.numpy is not None or op.simulate is not None
    else:
        assert op.rule is not None and op.numpy is not None and op.example is not None


@pytest.mark.parametrize("op", GLOBAL, ids=lambda op: op.name)
def test_example_infers_runs_and_has_a_rule(op):
    """Each entry's example is a valid instance: its types infer, numpy runs on it and gives those
    types, and its rule has one entry per dim of every operand and result."""
    texts, attrs = op.example
    operands = [TensorType.parse(t) for t in texts]
    results = op.infer_types(operands, attrs)
    rng = np.random.default_rng(0)
    from spmdlang.ir.types import np_dtype

    arrays = [rng.integers(1, 4, t.shape).astype(np_dtype(t.dtype)) for t in operands]
    got = op.evaluate(arrays, attrs)
    assert [(g.shape, str(g.dtype)) for g in got] == [(t.shape, str(np_dtype(t.dtype))) for t in results]
    rule = op.rule(operands, list(results), attrs)
    assert [len(t) for t in rule.tensors] == [t.rank for t in operands] + [t.rank for t in results]


def _entry(**over):
    fields = dict(doc="a test op", family=Family.elementwise, infer=lambda ops, attrs: ops[0],
                  numpy=lambda x: x, rule=lambda ops, res, attrs: None, jax=lambda a, attrs, out: a[0],
                  example=(("f32[2]",), {}))
    fields.update(over)
    return fields


@pytest.mark.parametrize("over, message", [
    ({"reduce_kind": ReduceKind.sum}, "reduce_fill"),
    ({"reduce_fill": lambda dtype: 0}, "reduce_fill"),
    ({"rule": None}, "factor rule"),
    ({"numpy": None}, "numpy"),
    ({"jax": None}, "jax emission"),
    ({"doc": ""}, "one-line doc"),
    ({"doc": "two\nlines"}, "one-line doc"),
    ({"family": "elementwize"}, "family 'elementwize' is not one of"),
    ({"partial": "linear"}, "partial 'linear' is not one of"),
    ({"partial_operands": (0,)}, "partial_operands without a partial mode"),
    ({"example": None}, "example"),
    ({"jax_helper": "def x(): pass"}, "jax helper is called by its jax_local"),
    ({"jax_helper": "def x(): pass", "jax_local": lambda a, attrs, out: f"x({a[0]})"}, "function named"),
    ({"stage": Stage.local}, "never partitioned"),
    ({"constraint": True}, "global programs only"),
    ({"colour": "red"}, "unexpected keyword"),
    ({"builtin": "floats"}, "builtin 'floats' is not one of"),
    ({"builtin": "float", "example": (("f32[2]",), {"k": 1})}, "no attributes"),
    ({"builtin": "float", "family": Family.layout}, "is elementwise"),
])
def test_register_rejects_incomplete_entries(over, message):
    with pytest.raises(OpTableError, match=message):
        registry.register("test_incomplete_op", **_entry(**over))
    assert "test_incomplete_op" not in registry.OPS


def test_the_builtins_of_an_op_name_come_from_the_table():
    """An entry with `builtin` is the builtin of its name, one tensor per operand, and a float-only
    one computes ints in floats (as numpy does); gelu_erf, without it, is no builtin."""
    import spmdlang
    from spmdlang.frontend.builtins import BUILTINS

    declared = [op for op in registry.OPS.values() if op.builtin is not None]
    assert {"exp", "relu", "logical_not", "maximum", "pow", "logical_and"} <= {op.name for op in declared}
    for op in declared:
        params = [(p[0], str(p[1])) for p in BUILTINS[op.name].params]
        assert params == ([("x", "tensor")] if len(op.example[0]) == 1 else [("a", "tensor"), ("b", "tensor")])
    assert "gelu_erf" not in BUILTINS and "add" not in BUILTINS
    ir = spmdlang.compile("mesh [d=2]\nfunc main(x: i32[4]) -> f32[4] { return exp(x) }").ir
    assert "cast" in ir and "exp" in ir


def test_register_rejects_a_second_entry_of_a_name():
    with pytest.raises(OpTableError, match="registered twice"):
        registry.register("add", **_entry())


def test_enums_stand_for_their_strings():
    """Members compare, hash and format as the strings they replaced, so texts do not change."""
    assert ReduceKind.max == "max" and hash(ReduceKind.max) == hash("max") and f"{ReduceKind.max}" == "max"
    assert {"sum": 1}[ReduceKind.sum] == 1 and json.dumps(PartialMode.additive) == '"additive"'
    assert registry.get("reduce_max").reduce_kind == "max"


def test_factor_rule_prints_in_shardy_notation():
    matmul = registry.get("einsum")
    a, b = TensorType("f32", (8, 16)), TensorType("f32", (16, 4))
    rule = matmul.rule([a, b], list(matmul.infer_types([a, b], {"spec": "ij,jk->ik"})), {"spec": "ij,jk->ik"})
    assert str(rule) == "([i, j], [j, k]) -> ([i, k]) reduction={j}"
    assert rule.sizes_text() == "{i=8, j=16, k=4}"


def test_ops_command_lists_every_primitive(capsys):
    assert cli.main(["ops"]) == 0
    text = capsys.readouterr().out
    names = [line.split()[0] for line in text.splitlines() if line and not line.startswith(" ")]
    assert names == list(registry.OPS)
    assert "([i, j], [j, k]) -> ([i, k]) reduction={j}" in text
    assert cli.main(["ops", "--json"]) == 0
    entries = json.loads(capsys.readouterr().out)
    assert [e["name"] for e in entries] == list(registry.OPS)
    for e in entries:
        assert e["doc"] == registry.get(e["name"]).doc
        assert (e["rule"] is None) == registry.get(e["name"]).local_only
