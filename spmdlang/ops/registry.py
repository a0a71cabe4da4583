"""Helpers for op-table entries; the registry itself (OpDef, register, get) is spmdlang.ir.registry."""

from __future__ import annotations

from ..errors import ShapeError
from ..ir.registry import OPS, Family, Grad, OpDef, PartialMode, ReduceKind, Stage, Takes, get, register, set_vjp

__all__ = ["OPS", "Family", "Grad", "OpDef", "PartialMode", "ReduceKind", "Stage", "Takes", "check", "get",
           "no_flops", "operand_flops", "py_literal", "register", "set_vjp"]


def no_flops(operands, results, attrs) -> int:
    """Data movement, constants, collectives: no arithmetic."""
    return 0


def operand_flops(operands, results, attrs) -> int:
    """Reductions: one operation per input element."""
    return operands[0].size


def py_literal(value) -> str:
    """A Python expression for a constant in emitted code (inf and nan have no literal)."""
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return f'float("{value}")'
    return repr(value)


def check(cond: bool, message: str, blame: int | str | None = None) -> None:
    """Shape rules call this; the IR builder turns the ShapeError into a located SpmdError, at the
    operand (index) or attribute (name) `blame` names when it knows where that was written."""
    if not cond:
        raise ShapeError(message, blame)
