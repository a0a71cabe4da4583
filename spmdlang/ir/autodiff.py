"""Reverse-mode differentiation of the global program (grad, value_and_grad), before propagation.

`differentiate` walks the forward ops of one inlined function backwards from its scalar output and
appends the backward pass as ordinary ops of the op table: each op's `vjp` rule (next to its other
rules in spmdlang.ops) maps its result cotangents to operand cotangents. Propagation, the
partitioner, every backend, `explain` and `bench` then see nothing special. Backward ops carry the
span of the forward op they come from and `Op.backward`.

The backward IR is kept small as it is built: a zero cotangent is `None` (no op, no add of zeros),
and only ops on a path from a differentiated input to the output get cotangents (no dead ones).
"""

from __future__ import annotations

from ..errors import Span, SpmdError
from . import registry
from . import types as T
from .builder import Builder
from .core import LOOP, Op, Value
from .registry import Grad
from .types import TensorType


def differentiable(v: Value) -> bool:
    return T.is_float(v.type.dtype)


class Differentiator:
    """What a vjp rule builds with: ops appended to the builder, marked backward, at the span of the
    forward op being differentiated."""

    def __init__(self, b: Builder):
        self.b = b
        self.span: Span | None = None

    # ---- emission
    def emit(self, kind: str, *operands: Value, **attrs) -> Value:
        (v,) = self.emit_multi(kind, *operands, **attrs)
        return v

    def emit_multi(self, kind: str, *operands: Value, **attrs) -> tuple[Value, ...]:
        saved, self.b.backward = self.b.backward, True
        try:
            return self.b.emit_op(kind, operands, attrs, self.span)
        finally:
            self.b.backward = saved

    def const(self, value, dtype: str) -> Value:
        """A rank-0 constant (elementwise ops broadcast rank-0 operands)."""
        if T.is_int(dtype):
            value = int(value)
        elif T.is_float(dtype):
            value = float(value)
        return self.emit("full", dtype=dtype, shape=(), value=value)

    def full(self, value, t: TensorType) -> Value:
        return self.emit("full", dtype=t.dtype, shape=tuple(t.shape), value=float(value) if T.is_float(t.dtype)
                         else value)

    def zeros(self, t: TensorType) -> Value:
        return self.full(0.0 if T.is_float(t.dtype) else 0, t)

    def like(self, value, v: Value) -> Value:
        """A constant of v's dtype, rank 0."""
        return self.const(value, v.type.dtype)

    def broadcast(self, v: Value, shape) -> Value:
        """v (rank 0, or trailing-aligned as numpy) to `shape`."""
        shape = tuple(shape)
        if v.type.shape == shape:
            return v
        off = len(shape) - v.type.rank
        return self.emit("broadcast_in_dim", v, shape=shape, dims=tuple(range(off, len(shape))))

    def add(self, a: Value | None, b: Value | None) -> Value | None:
        if a is None:
            return b
        if b is None:
            return a
        return self.emit("add", a, b)

    def mul(self, a: Value, b: Value) -> Value:
        return self.emit("mul", a, b)

    def neg(self, a: Value) -> Value:
        return self.emit("neg", a)

    def select(self, c: Value, a: Value, b: Value) -> Value:
        return self.emit("select", c, a, b)

    def unbroadcast(self, c: Value | None, v: Value) -> Value | None:
        """An elementwise op's cotangent for operand v: a rank-0 operand that broadcast gets the sum."""
        if c is None or c.type.shape == v.type.shape:
            return c
        return self.emit("reduce_sum", c, axes=tuple(range(c.type.rank)))

    def sum_to(self, ct: Value, t: TensorType, dims) -> Value:
        """The transpose of broadcast_in_dim(x: t, shape=ct.shape, dims): sum the dims that were
        added or stretched from 1, then put x's shape back."""
        shape = ct.type.shape
        keep = {d for i, d in enumerate(dims) if t.shape[i] == shape[d]}
        axes = tuple(d for d in range(len(shape)) if d not in keep)
        out = self.emit("reduce_sum", ct, axes=axes) if axes else ct
        if out.type.shape != t.shape:
            out = self.emit("reshape", out, shape=tuple(t.shape))
        return out

    # ---- nested differentiation (rules that expand an op into simpler ones and differentiate those)
    def vjp_of(self, build, inputs: list[Value], ct) -> list[Value | None]:
        """Emit `build(*inputs)` (backward-marked ops: a forward expansion), then differentiate it:
        the cotangents of `inputs` for the cotangent `ct` of its result."""
        start = len(self.b.ops)
        saved, self.b.backward = self.b.backward, True
        try:
            out = build(*inputs)
        finally:
            self.b.backward = saved
        ops = list(self.b.ops[start:])
        return backward_pass(self, ops, list(inputs), [(out, ct)])


def backward_pass(d: Differentiator, ops: list[Op], inputs: list[Value], seeds) -> list[Value | None]:
    """Cotangents of `inputs` given cotangents `seeds` [(value, ct)] of values computed by `ops`."""
    depends = {v for v in inputs if differentiable(v)}
    for op in ops:
        if any(v in depends for v in op.operands):
            depends.update(r for r in op.results if differentiable(r))
    needed = {v for v, _ in seeds}
    active = []
    for op in reversed(ops):
        if any(r in needed for r in op.results) and any(v in depends for v in op.operands):
            active.append(op)
            needed.update(op.operands)
    cts: dict[Value, Value] = {}
    for v, ct in seeds:
        if v in depends and ct is not None:
            cts[v] = d.add(cts.get(v), ct)
    saved = d.span
    try:
        for op in active:
            outs = [cts.pop(r, None) for r in op.results]
            if all(c is None for c in outs):
                continue
            if op.kind == LOOP:  # the reverse loop (residuals stacked per iteration) is not built yet
                raise SpmdError("grad: differentiating through a `loop` is not supported yet; unroll it with "
                                "`for` to differentiate it", op.span)
            opdef = registry.get(op.kind)
            rule = opdef.vjp
            if rule == Grad.none:
                continue
            if rule is None or rule == Grad.unsupported:
                raise SpmdError(f"grad: differentiating {op.kind} is not supported yet", op.span)
            d.span = op.span
            got = rule(d, op, outs[0] if len(outs) == 1 else tuple(outs))
            for v, c in zip(op.operands, got):
                if c is None or v not in depends:
                    continue
                assert c.type == v.type, (op.kind, c.type, v.type)
                cts[v] = d.add(cts.get(v), c)
    finally:
        d.span = saved
    return [cts.get(v) for v in inputs]
