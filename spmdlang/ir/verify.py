"""The IR verifier: SSA order, known ops, and every op's types agree with its shape rule.

Tests run it after every pass; a failure here is a compiler bug, never a user error.
"""

from __future__ import annotations

from . import registry
from .core import Program


class VerifyError(AssertionError):
    pass


def verify(prog: Program) -> None:
    defined = {p.value for p in prog.params}
    for i, op in enumerate(prog.ops):
        where = f"op #{i} ({op.kind})"
        if op.kind not in registry.OPS:
            raise VerifyError(f"{where}: unknown op")
        opdef = registry.OPS[op.kind]
        if opdef.local_only and not prog.local:
            raise VerifyError(f"{where}: per-partition op in a global program")
        for v in op.operands:
            if v not in defined:
                raise VerifyError(f"{where}: operand {v!r} used before definition")
        try:
            types = opdef.infer_types([v.type for v in op.operands], op.attrs)
        except Exception as e:  # noqa: BLE001  (any failure is a verifier finding)
            raise VerifyError(f"{where}: shape rule rejects the op: {e}") from e
        got = tuple(r.type for r in op.results)
        if types != got:
            raise VerifyError(f"{where}: results typed {list(map(str, got))}, rule says {list(map(str, types))}")
        for r in op.results:
            if r in defined:
                raise VerifyError(f"{where}: {r!r} defined twice")
            defined.add(r)
    for r in prog.results:
        if r.value not in defined:
            raise VerifyError(f"result {r.value!r} is not defined")
