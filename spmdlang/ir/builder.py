"""Appends ops to a growing list, running each op's shape rule; used by lowering and partitioning."""

from __future__ import annotations

from ..errors import ShapeError, Span, SpmdError
from ..limits import check_attrs, check_type
from ..memo import Memo
from . import registry
from .core import Op, Value, freeze

# shape rules' answers: (kind, operand types, attributes) -> result types, for attributes of plain
# values (each keyed with its type: 1, 1.0 and True are equal as keys); the partitioner's plans
# build the same local ops, and repeated layers the same global ones
_TYPES = Memo(1 << 15)
_PLAIN = (str, int, float, bool, type(None))


def _attr_key(value):
    kind = type(value)
    if kind in _PLAIN:
        return kind, value
    if kind is tuple:
        out = []
        for v in value:
            k = _attr_key(v)
            if k is None:
                return None
            out.append(k)
        return tuple, tuple(out)
    return None


def _rule_key(kind: str, operand_types: tuple, attrs) -> tuple | None:
    """The memo key of a shape rule's question, or None where some attribute is not a plain value."""
    items = []
    for name, value in attrs.items():
        k = _attr_key(value)
        if k is None:
            return None
        items.append((name, k))
    return kind, operand_types, tuple(items)


class Builder:
    def __init__(self):
        self.ops: list[Op] = []
        self.backward = False  # set while differentiating: new ops are marked as backward ops

    def emit_op(self, kind: str, operands, attrs=None, span: Span | None = None, names=None,
                blame=None) -> tuple[Value, ...]:
        """Append an op; `blame` maps operand indices and attribute names to the spans where the
        source wrote them, so a shape-rule error points at the argument it is about."""
        attrs = freeze(attrs)
        operand_types = tuple([v.type for v in operands])
        key = _rule_key(kind, operand_types, attrs)
        types = _TYPES.get(key) if key is not None else None
        if types is None:
            opdef = registry.get(kind)
            check_attrs(kind, attrs, span)
            try:
                types = opdef.infer_types(operand_types, attrs)
            except ShapeError as e:
                raise SpmdError(str(e), (blame or {}).get(e.blame) or span) from None
            for t in types:
                check_type(t, span)
            if key is not None:  # (checked: a question answered before passed its checks)
                _TYPES.put(key, types)
        names = names or [None] * len(types)
        results = tuple([Value(t, n) for t, n in zip(types, names)])
        self.ops.append(Op(kind, tuple(operands), results, attrs, span, self.backward))
        return results

    def emit(self, kind: str, *operands: Value, span: Span | None = None, name: str | None = None,
             blame=None, **attrs) -> Value:
        """Emit a single-result op; attrs as keywords."""
        (v,) = self.emit_op(kind, operands, attrs, span, [name], blame)
        return v
