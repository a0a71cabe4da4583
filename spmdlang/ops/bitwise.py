"""Bitwise and shift primitives on integers (u32 random keys and bits, as jax.numpy's).

Elementwise like ops/elementwise.py: operands share a shape or are rank 0. Shifts by a count
outside [0, bits) give 0 (left, unsigned right) or the sign (signed right), as XLA's shifts do;
numpy's own results there are undefined.
"""

from __future__ import annotations

import numpy as np

from ..ir import types as T
from ..ir.types import TensorType
from ..partition.factors import elementwise_rule
from .registry import Family, Grad, check, register


def _shape(types) -> tuple[int, ...]:
    """The operands' one shape; rank-0 operands broadcast (the frontend made the rest explicit)."""
    shapes = {t.shape for t in types if t.rank}
    check(len(shapes) <= 1, "operand shapes differ: " + " vs ".join(str(t) for t in types))
    return shapes.pop() if shapes else ()


def _rule(operands, results, attrs):
    return elementwise_rule([t.shape for t in operands], results[0].shape)


def _infer(name, allowed):
    def infer(operands, attrs):
        a, b = operands
        check(a.dtype == b.dtype, f"{name}: operand dtypes differ: {a} vs {b}")
        check(T.kind(a.dtype) in allowed, f"{name} needs {' or '.join(sorted(allowed))} operands, got {a}")
        return TensorType(a.dtype, _shape(operands))

    return infer


def _in_range(a, b):
    """Where the count b is a valid shift of a's dtype, and the count made safe elsewhere."""
    bits = a.dtype.itemsize * 8
    b = np.asarray(b)
    ok = (b >= 0) & (b < bits) if b.dtype.kind == "i" else b < bits
    return ok, np.where(ok, b, 0).astype(a.dtype)


def _shift_left(a, b):
    ok, s = _in_range(a, b)
    return np.where(ok, np.left_shift(a, s), 0).astype(a.dtype)


def _shift_right(a, b):
    ok, s = _in_range(a, b)
    fill = np.where(a < 0, -1, 0) if a.dtype.kind == "i" else 0
    return np.where(ok, np.right_shift(a, s), fill).astype(a.dtype)


_BITWISE = {
    "bitwise_and": (np.bitwise_and, "({0} & {1})", {"int", "bool"}, "a & b, bit by bit"),
    "bitwise_or": (np.bitwise_or, "({0} | {1})", {"int", "bool"}, "a | b, bit by bit"),
    "bitwise_xor": (np.bitwise_xor, "({0} ^ {1})", {"int", "bool"}, "a ^ b, bit by bit"),
    "left_shift": (_shift_left, "jnp.left_shift({0}, {1})", {"int"}, "a << b (0 where b is not in [0, bits))"),
    "right_shift": (_shift_right, "jnp.right_shift({0}, {1})", {"int"},
                    "a >> b: logical for unsigned, arithmetic for signed a (as numpy)"),
}

for _name, (_fn, _jax, _kinds, _doc) in _BITWISE.items():
    register(_name, doc=_doc, infer=_infer(_name, _kinds),
             numpy=lambda a, b, _fn=_fn: np.asarray(_fn(a, b)).astype(a.dtype),
             rule=_rule, jax=lambda args, attrs, out, _jax=_jax: _jax.format(*args),
             family=Family.elementwise, vjp=Grad.none, example=(("u32[4, 8]", "u32[4, 8]"), {}))
