"""Weak types, as jax: a value computed only from Python literals (`abs(3) + 0.5`, `exp(1)`) stays
weakly typed and takes the dtype of the tensor it meets, as a literal would (issue 27:
`pow(abs(3) + 0.5, x)` with a bf16 x was an f32, so a bf16 result was refused). Each case is
checked against jax's own result dtype and values, on ref, sim and jax."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import spmdlang

# (spmdlang expression, the same in jax); x: bf16[4], h: f16[4], y: f32[4], n: i64[4], c: bool[4]
CASES = [
    ("pow(abs(3) + 0.5, x)", lambda x, h, y, n, c: jnp.power(jnp.abs(3) + 0.5, x)),
    ("exp(1) + h", lambda x, h, y, n, c: jnp.exp(1) + h),
    ("x * (abs(2) - 1)", lambda x, h, y, n, c: x * (jnp.abs(2) - 1)),
    ("maximum(abs(-2.5), x)", lambda x, h, y, n, c: jnp.maximum(jnp.abs(-2.5), x)),
    ("abs(3) / 2 + x", lambda x, h, y, n, c: jnp.abs(3) / 2 + x),
    ("-sqrt(4.0) * x", lambda x, h, y, n, c: -jnp.sqrt(4.0) * x),
    ("where(c, exp(1), x)", lambda x, h, y, n, c: jnp.where(c, jnp.exp(1), x)),
    ("exp(abs(1)) * h", lambda x, h, y, n, c: jnp.exp(jnp.abs(1)) * h),
    ("(abs(2) + 1) * n", lambda x, h, y, n, c: (jnp.abs(2) + 1) * n),
    ("cast(abs(3), f32) + x", lambda x, h, y, n, c: jnp.abs(3).astype(jnp.float32) + x),  # a cast is strong
    ("abs(3) + 0.5 + y", lambda x, h, y, n, c: jnp.abs(3) + 0.5 + y),
    ("abs(3) + x", lambda x, h, y, n, c: jnp.abs(3) + x),
    ("abs(3) < x", lambda x, h, y, n, c: jnp.abs(3) < x),
    ("sin(1.5) * x + y", lambda x, h, y, n, c: jnp.sin(1.5) * x + y),
]

NAMES = {jnp.dtype(jnp.bfloat16): "bf16", jnp.dtype(jnp.float16): "f16", jnp.dtype(jnp.float32): "f32",
         jnp.dtype(jnp.int64): "i64", jnp.dtype(jnp.bool_): "bool"}


def _inputs():
    rng = np.random.default_rng(0)
    return {"x": rng.uniform(0.5, 2, 4).astype(ml_dtypes.bfloat16), "h": rng.uniform(0.5, 2, 4).astype(np.float16),
            "y": rng.uniform(0.5, 2, 4).astype(np.float32), "n": np.arange(4, dtype=np.int64),
            "c": np.array([True, False, True, False])}


@pytest.mark.parametrize("expr, fn", CASES, ids=[e for e, _ in CASES])
def test_weak_values_take_the_tensors_dtype_as_jax(expr, fn):
    ins = _inputs()
    with jax.enable_x64(True):  # n is i64
        want = np.asarray(fn(**{k: jnp.asarray(v) for k, v in ins.items()}))
    dt = NAMES[want.dtype]
    src = f"""mesh [r=2]
func main(x: bf16[4] {{r}}, h: f16[4], y: f32[4] {{r}}, n: i64[4], c: bool[4]) -> {dt}[4] {{
  return {expr}
}}
"""
    c = spmdlang.compile(src)  # a wrong dtype is refused: the result type is declared as jax's
    for b in ("ref", "sim", "jax"):
        (got,) = c.run(ins, backend=b)
        assert got.dtype == want.dtype, b
        np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64), rtol=1e-2,
                                   err_msg=f"{b}: {expr}")


def test_a_literal_only_expression_is_f32_alone():
    """Weak values meeting nothing strong keep jax's default dtypes (f32, i32)."""
    c = spmdlang.compile("""mesh [r=2]
func main(x: bf16[4]) -> (f32[], i32[], bf16[4]) {
  a = abs(3) + 0.5
  b = abs(-3) * 2
  return a, b, a * x
}
""")
    a, b, ax = c.run({"x": np.ones(4, ml_dtypes.bfloat16)})
    assert (a.dtype, float(a), b.dtype, int(b), ax.dtype) == (np.float32, 3.5, np.int32, 6, ml_dtypes.bfloat16)
