"""The verifier runs after every pass and catches what each pass must never produce."""

from __future__ import annotations

import pytest

import spmdlang
from spmdlang import cli
from spmdlang.ir import verify as V
from spmdlang.ir.core import Op, Value
from spmdlang.ir.mesh import Sharding
from spmdlang.ir.types import TensorType

SRC = """mesh [a=2, b=2]
func main(x: f32[8, 6] {a, _}, w: f32[6, 4] {_, b}) -> f32[8, 4] {
  return x @ w
}
"""


def test_every_pass_is_verified(monkeypatch):
    calls = []
    for name in ("verify", "verify_shardings", "verify_spmd"):
        real = getattr(V, name)
        monkeypatch.setattr(V, name, lambda *a, _real=real, _name=name: (calls.append(_name), _real(*a)))
    c = spmdlang.compile(SRC, verify=True)
    _ = c.spmd
    # lowering, simplify; propagate; partition and finish (verify_spmd verifies the program too)
    assert calls == ["verify", "verify", "verify_shardings", "verify_spmd", "verify", "verify_spmd", "verify"]
    calls.clear()
    _ = spmdlang.compile(SRC, verify=False).spmd
    assert calls == []


def test_environment_switch(monkeypatch):
    monkeypatch.setenv("SPMDLANG_VERIFY", "0")
    assert not spmdlang.compile(SRC).verify
    monkeypatch.setenv("SPMDLANG_VERIFY", "1")
    assert spmdlang.compile(SRC).verify


def test_cli_verify_flag(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPMDLANG_VERIFY", "0")
    f = tmp_path / "p.spmd"
    f.write_text(SRC)
    seen = []
    real = V.verify_spmd
    monkeypatch.setattr(V, "verify_spmd", lambda s: (seen.append(1), real(s)))
    assert cli.main(["compile", str(f), "--target", "spmd", "--verify"]) == 0
    assert seen


def _spmd():
    return spmdlang.compile(SRC, verify=False).spmd


def _with_op(prog, op, at=0):
    ops = list(prog.ops)
    ops.insert(at, op)
    return prog.replace(ops=tuple(ops))


def test_collective_in_a_global_program():
    prog = spmdlang.compile(SRC, verify=False).canonical
    x = prog.params[0].value
    bad = _with_op(prog, Op("all_reduce", (x,), (Value(x.type),), {"axes": ("a",), "reduce": "sum"}))
    with pytest.raises(V.VerifyError, match="per-partition op in a global program"):
        V.verify(bad)


def test_constraint_left_in_a_per_partition_program():
    prog = _spmd().program
    x = prog.params[0].value
    bad = _with_op(prog, Op("shard", (x,), (Value(x.type),), {"sharding": Sharding(((), ()))}))
    with pytest.raises(V.VerifyError, match="global-only op left"):
        V.verify(bad)


@pytest.mark.parametrize("attrs, message", [
    ({"axes": ("c",), "dim": 0, "group": 2}, "not distinct axes"),
    ({"axes": ("a", "a"), "dim": 0, "group": 4}, "not distinct axes"),
    ({"axes": ("a",), "dim": 0, "group": 4}, "group 4 but axes"),
    ({"axes": ("a",), "dim": 2, "group": 2}, "dim 2 out of range"),
])
def test_collective_attributes_agree_with_the_mesh(attrs, message):
    prog = _spmd().program
    x = prog.params[0].value
    t = x.type.with_shape((x.type.shape[0] * attrs["group"],) + x.type.shape[1:]) if attrs["dim"] == 0 else x.type
    bad = _with_op(prog, Op("all_gather", (x,), (Value(t),), attrs))
    with pytest.raises(V.VerifyError, match=message):
        V.verify(bad)


def test_result_type_disagrees_with_the_shape_rule():
    prog = _spmd().program
    x = prog.params[0].value
    bad = _with_op(prog, Op("neg", (x,), (Value(TensorType("f32", (1,))),)))
    with pytest.raises(V.VerifyError, match="rule says"):
        V.verify(bad)


def test_local_shapes_agree_with_the_shardings():
    from dataclasses import replace

    spmd = _spmd()
    V.verify_spmd(spmd)
    wrong = (Sharding(((), ())),) + spmd.in_shardings[1:]  # x is [4, 6] per device, not [8, 6]
    with pytest.raises(V.VerifyError, match="parameter 0: local"):
        V.verify_spmd(replace(spmd, in_shardings=wrong))
    with pytest.raises(V.VerifyError, match="pending sum at the program's boundary"):
        V.verify_spmd(replace(spmd, out_shardings=(Sharding((("a",), ()), ("b",)),)))


def test_shardings_are_well_formed():
    c = spmdlang.compile(SRC, verify=False)
    sh = dict(c.propagation.shardings)
    V.verify_shardings(c.canonical, sh)
    x = c.canonical.params[0].value
    for bad, message in [(Sharding((("a",),)), "1 dims for rank 2"), (Sharding((("z",), ())), "lacks"),
                         (Sharding((("a",), ("a",))), "twice"), (Sharding((("a",), ()), ("b",)), "pending sum")]:
        with pytest.raises(V.VerifyError, match=message):
            V.verify_shardings(c.canonical, {**sh, x: bad})
