"""Values of the frontend that are not tensors, and the checks on them shared by lowering and builtins.

Expressions evaluate to a `Value` (a tensor in the IR) or to a static Python value (int, float,
bool, str, list, spec, `StaticType`, `Dtype`); these helpers describe, check and convert the latter.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np

from ..errors import SpmdError
from ..ir import types as T
from ..ir.core import Value
from ..ir.types import TensorType
from . import ast as A


@dataclass(frozen=True)
class StaticType:
    """A type written as an argument, e.g. zeros(f32[4, 8])."""

    type: TensorType


@dataclass(frozen=True)
class Dtype:
    """A dtype written as an argument, e.g. cast(x, bf16)."""

    name: str


@dataclass(frozen=True)
class StructType:
    """A declared struct, stacked `lead` times: `Block[L]` is StructType("Block", (L,))."""

    name: str
    lead: tuple[int, ...] = ()

    def __str__(self) -> str:
        return f"{self.name}[{', '.join(map(str, self.lead))}]" if self.lead else self.name


@dataclass(frozen=True, eq=False)
class StructValue:
    """A value of a struct type: its fields in declaration order, each a tensor or a struct."""

    type: StructType
    fields: tuple[tuple[str, object], ...]

    def field(self, name: str):
        return dict(self.fields)[name]

    def leaves(self, prefix: str = "") -> list[tuple[str, Value]]:
        """(dotted path, tensor) of every leaf, depth-first in declaration order."""
        out = []
        for name, v in self.fields:
            path = f"{prefix}.{name}" if prefix else name
            out.extend(v.leaves(path) if isinstance(v, StructValue) else [(path, v)])
        return out


def is_value(v) -> bool:
    """A run-time value: a tensor or a struct of tensors."""
    return isinstance(v, (Value, StructValue))


def did_you_mean(name: str, options) -> str:
    import difflib

    close = difflib.get_close_matches(name, list(options), n=1)
    return f"; did you mean '{close[0]}'?" if close else ""


# the index values of `loop` statements being lowered: a static use of one gets its own message
LOOP_INDICES: weakref.WeakSet = weakref.WeakSet()

# values computed only from Python literals (jax's weakly typed values, e.g. `abs(3) + 0.5`): they
# meet a tensor as a literal would, taking its dtype (`pow(abs(3) + 0.5, x)` is bf16 for a bf16 x)
WEAK: weakref.WeakSet = weakref.WeakSet()


def is_weak(v) -> bool:
    """A Python number, or a value computed only from them."""
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) or (isinstance(v, Value) and v in WEAK)


def loop_index_note(value) -> str:
    if isinstance(value, Value) and value in LOOP_INDICES:
        return (f"; '{value.name}' is the index of a `loop`, an i32[] value known only at run time "
                "(use `for` to unroll with a static integer)")
    return ""


def static_int(value, span, what="value") -> int:
    if isinstance(value, Value) and value in LOOP_INDICES:
        raise SpmdError(f"{what} must be a static integer{loop_index_note(value)}", span)
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpmdError(f"{what} must be a static integer, got {describe(value)}", span)
    return value


def scalar_value(v, dtype: str, span, what="") -> bool | int | float:
    """A static number as a Python value of `dtype`; integers must fit it (numpy would overflow at
    run time), floats must be integral for an int dtype."""
    if dtype == "bool":
        return bool(v)
    if T.is_float(dtype):
        try:
            return float(v)
        except OverflowError:
            raise SpmdError(f"{what}the integer {_short(v)} is too large for {dtype}", span) from None
    if isinstance(v, float):
        if v != v or v in (float("inf"), float("-inf")) or v != int(v):
            raise SpmdError(f"{what}{v} is not an integer and cannot be a {dtype} value", span)
    info = np.iinfo(T.np_dtype(dtype))
    if not info.min <= int(v) <= info.max:
        raise SpmdError(f"{what}{_short(int(v))} does not fit {dtype} (range {info.min}..{info.max})", span)
    return int(v)


def _short(n: int) -> str:
    text = str(n)
    return text if len(text) <= 24 else f"{text[:3]}...({len(text)} digits)"


def float_for(dtype: str) -> str:
    """The float dtype an int (or bool) computes in where a float is needed: i64 -> f64, else f32."""
    return dtype if T.is_float(dtype) else "f64" if T.itemsize(dtype) == 8 else "f32"


def describe(value) -> str:
    """What a value is, as error messages name it."""
    for kind, text in _DESCRIPTIONS:
        if isinstance(value, kind):
            return text(value)
    return type(value).__name__


# the first kind a value is an instance of describes it (bool before int: a bool is an int)
_DESCRIPTIONS = (
    (Value, lambda v: f"a tensor {v.type}{loop_index_note(v)}"),
    (StructValue, lambda v: f"a struct {v.type}"),
    (bool, lambda v: "a bool"),
    (int, lambda v: f"the integer {v}"),
    (float, lambda v: f"the number {v}"),
    (str, lambda v: "a string"),
    (tuple, lambda v: (f"the {len(v)} results of a call (unpack them first: `a, b = f(...)`)"
                       if v and all(isinstance(x, (Value, StructValue)) for x in v) else "a list")),
    (list, lambda v: "a list"),
    (StaticType, lambda v: f"the type {v.type}"),
    (Dtype, lambda v: f"the dtype {v.name}"),
    (A.SpecExpr, lambda v: "a sharding spec"),
)
