"""numpy's max and min as XLA computes them, signed zeros included.

XLA's maximum of +0.0 and -0.0 is +0.0 and its minimum -0.0, whichever operand comes first; so are
jax's max and min reductions, cummax, max pools and scatter_max. numpy's answer depends on the
operands' order (np.maximum(0.0, -0.0) is -0.0, np.maximum(-0.0, 0.0) is +0.0), so the reference
and the mesh simulator settle a zero result here: +0.0 for a max where any +0.0 took part, -0.0
for a min where any -0.0 did. NaN propagates as in numpy; integers have one zero and pass through.
"""

from __future__ import annotations

import numpy as np

from ..ir import types as T


def _signed(dtype) -> bool:
    return np.dtype(dtype).kind == "f" or T.np_is_narrow_float(np.dtype(dtype))


def _zero_of(kind: str, x):
    """Where x is the zero that decides a zero result: +0.0 for max, -0.0 for min."""
    return (x == 0) & (np.signbit(x) if kind == "min" else ~np.signbit(x))


def _settle(kind: str, r, decided):
    """r with its zeros made +0.0 (max) or -0.0 (min) where `decided`, the other zero elsewhere."""
    if not (r == 0).any():
        return r
    lean, other = (-0.0, 0.0) if kind == "min" else (0.0, -0.0)
    zeros = np.where(decided, np.asarray(lean, r.dtype), np.asarray(other, r.dtype))
    return np.where(r == 0, zeros, r).astype(r.dtype)


def elementwise(kind: str, a, b):
    """maximum(a, b) or minimum(a, b)."""
    r = np.asarray((np.maximum if kind == "max" else np.minimum)(a, b))
    if not _signed(r.dtype):
        return r
    a, b = np.asarray(a), np.asarray(b)
    return _settle(kind, r, _zero_of(kind, a) | _zero_of(kind, b))


def maximum(a, b):
    return elementwise("max", a, b)


def minimum(a, b):
    return elementwise("min", a, b)


def reduce(kind: str, x, axis):
    """max or min of x over `axis` (an int or a tuple of ints)."""
    r = np.asarray((np.max if kind == "max" else np.min)(x, axis=axis))
    if not _signed(r.dtype):
        return r
    return _settle(kind, r, np.any(_zero_of(kind, x), axis=axis))


def accumulate(kind: str, x, axis: int):
    """The running max or min of x along `axis` (cummax / cummin)."""
    r = (np.maximum if kind == "max" else np.minimum).accumulate(x, axis=axis, dtype=x.dtype)
    if not _signed(r.dtype):
        return r
    return _settle(kind, r, np.logical_or.accumulate(_zero_of(kind, x), axis=axis))


def scatter(kind: str, target, ids, updates) -> None:
    """target[ids] = max/min(target[ids], updates), in place along dim 0 (repeated ids combine)."""
    decided = _zero_of(kind, target) if _signed(target.dtype) else None
    (np.maximum if kind == "max" else np.minimum).at(target, ids, updates)
    if decided is not None:
        np.logical_or.at(decided, ids, _zero_of(kind, updates))
        target[...] = _settle(kind, target, decided)
