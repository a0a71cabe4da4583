"""Appends ops to a growing list, running each op's shape rule; used by lowering and partitioning."""

from __future__ import annotations

from ..errors import ShapeError, Span, SpmdError
from ..limits import check_attrs, check_type
from . import registry
from .core import Op, Value, freeze


class Builder:
    def __init__(self):
        self.ops: list[Op] = []
        self.backward = False  # set while differentiating: new ops are marked as backward ops

    def emit_op(self, kind: str, operands, attrs=None, span: Span | None = None, names=None,
                blame=None) -> tuple[Value, ...]:
        """Append an op; `blame` maps operand indices and attribute names to the spans where the
        source wrote them, so a shape-rule error points at the argument it is about."""
        opdef = registry.get(kind)
        attrs = freeze(attrs)
        check_attrs(kind, attrs, span)
        try:
            types = opdef.infer_types([v.type for v in operands], attrs)
        except ShapeError as e:
            raise SpmdError(str(e), (blame or {}).get(e.blame) or span) from None
        for t in types:
            check_type(t, span)
        names = names or [None] * len(types)
        results = tuple(Value(t, n) for t, n in zip(types, names))
        self.ops.append(Op(kind, tuple(operands), results, attrs, span, self.backward))
        return results

    def emit(self, kind: str, *operands: Value, span: Span | None = None, name: str | None = None,
             blame=None, **attrs) -> Value:
        """Emit a single-result op; attrs as keywords."""
        (v,) = self.emit_op(kind, operands, attrs, span, [name], blame)
        return v
