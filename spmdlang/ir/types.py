"""Dtypes and tensor types of the IR."""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

import ml_dtypes
import numpy as np

# name -> (numpy dtype, jax.numpy name, kind, bytes). Kind orders promotion: bool < int < float.
_DTYPES = {
    "bool": (np.dtype(np.bool_), "jnp.bool_", "bool", 1),
    "i32": (np.dtype(np.int32), "jnp.int32", "int", 4),
    "i64": (np.dtype(np.int64), "jnp.int64", "int", 8),
    "u32": (np.dtype(np.uint32), "jnp.uint32", "int", 4),  # random keys and bits (jax.random's raw keys)
    "bf16": (np.dtype(ml_dtypes.bfloat16), "jnp.bfloat16", "float", 2),
    "f16": (np.dtype(np.float16), "jnp.float16", "float", 2),
    "f32": (np.dtype(np.float32), "jnp.float32", "float", 4),
    "f64": (np.dtype(np.float64), "jnp.float64", "float", 8),
}
DTYPES = tuple(_DTYPES)


def is_dtype(name: str) -> bool:
    return name in _DTYPES


def np_dtype(dtype: str) -> np.dtype:
    return _DTYPES[dtype][0]


def jnp_dtype(dtype: str) -> str:
    return _DTYPES[dtype][1]


def kind(dtype: str) -> str:
    return _DTYPES[dtype][2]


def itemsize(dtype: str) -> int:
    return _DTYPES[dtype][3]


def is_float(dtype: str) -> bool:
    return kind(dtype) == "float"


def is_int(dtype: str) -> bool:
    return kind(dtype) == "int"


def np_is_float(dt) -> bool:
    """numpy reports ml_dtypes' bfloat16 as kind 'V', not 'f'."""
    dt = np.dtype(dt)
    return dt.kind == "f" or dt.name == "bfloat16"


def np_is_narrow_float(dt) -> bool:
    """Floats below 32 bits: numpy math on them is done in f32 and rounded back, as XLA does."""
    return np_is_float(dt) and np.dtype(dt).itemsize < 4


def widen(x: np.ndarray) -> np.ndarray:
    """Half floats (f16, bf16) as f32, where the reference computes and accumulates them (as XLA
    does on CPU); every other array as is. Callers round the result back to the input's dtype."""
    return x.astype(np.float32) if np_is_narrow_float(x.dtype) else x


def promote(a: str, b: str) -> str:
    """jax-like promotion between two tensor dtypes: bool < int < float, wider wins; bf16+f16 -> f32."""
    if a == b:
        return a
    ka, kb = kind(a), kind(b)
    rank = {"bool": 0, "int": 1, "float": 2}
    if rank[ka] != rank[kb]:
        return a if rank[ka] > rank[kb] else b
    if {a, b} == {"bf16", "f16"}:
        return "f32"
    if {a, b} == {"i32", "u32"}:
        return "i32"  # jax without x64: int64 canonicalised to int32
    return a if itemsize(a) >= itemsize(b) else b


@dataclass(frozen=True)
class TensorType:
    """A dtype and a static shape."""

    dtype: str
    shape: tuple[int, ...]

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * itemsize(self.dtype)

    def with_shape(self, shape) -> TensorType:
        return TensorType(self.dtype, tuple(shape))

    def with_dtype(self, dtype: str) -> TensorType:
        return TensorType(dtype, self.shape)

    def __str__(self) -> str:
        return f"{self.dtype}[{', '.join(map(str, self.shape))}]"

    @staticmethod
    def parse(text: str) -> TensorType:
        """The inverse of str(): "f32[4, 8]" -> TensorType("f32", (4, 8))."""
        dtype, _, rest = text.strip().partition("[")
        dims = rest.rstrip("]").strip()
        return TensorType(dtype, tuple(int(d) for d in dims.split(",")) if dims else ())
