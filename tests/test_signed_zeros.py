"""Signed zeros as jax computes them, on ref, sim and jax, split (evenly and not) and unsplit.

XLA's maximum of +0.0 and -0.0 is +0.0 and its minimum -0.0 whichever operand comes first (numpy's
depends on the order), and so are jax's max/min reductions, cummax, max pools and scatter_max;
jax's cumsum starts from +0.0; jnp.cumprod keeps a product's sign. A zero's sign is invisible to
`diff` (|+0 - -0| = 0) until something divides by it, so these compare sign bits against jax.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import spmdlang

BACKENDS = ("ref", "sim", "jax")

# (source, oracle): x and y are f32[2, 7] mixing +-0.0 with a few other values
OPS = [
    ("maximum(x, y)", jnp.maximum),
    ("maximum(y, x)", lambda x, y: jnp.maximum(y, x)),
    ("minimum(x, y)", jnp.minimum),
    ("minimum(y, x)", lambda x, y: jnp.minimum(y, x)),
    ("max(x, 1)", lambda x, y: jnp.max(x, 1)),
    ("min(x, 1)", lambda x, y: jnp.min(x, 1)),
    ("max(y, 0)", lambda x, y: jnp.max(y, 0)),
    ("cummax(x, 1)", lambda x, y: jax.lax.cummax(x, 1)),
    ("cummax(y, 1, reverse=true)", lambda x, y: jax.lax.cummax(y, 1, reverse=True)),
    ("cumsum(x, 1)", lambda x, y: jnp.cumsum(x, 1)),
    ("cumprod(y, 1)", lambda x, y: jnp.cumprod(y, 1)),
    ("cumprod(y, 1, reverse=true)", lambda x, y: jax.lax.cumprod(y, 1, reverse=True)),
]


def _inputs():
    x = np.array([[-0.0, 0.0, -0.0, -0.0, 0.0, -1.0, -0.0],
                  [-0.0, -0.0, -0.0, -0.0, -0.0, -0.0, -0.0]], np.float32)
    y = np.array([[0.0, -0.0, -0.0, 2.0, -0.0, -0.0, 0.0],
                  [-0.0, -3.0, 0.0, -0.5, -2.0, 0.0, -1.0]], np.float32)
    return x, y


def _same(got, want, what):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, what
    assert np.array_equal(got, want) and np.signbit(got).tolist() == np.signbit(want).tolist(), \
        f"{what}: got {got.tolist()} (sign bits {np.signbit(got).tolist()}), want {want.tolist()}"


@pytest.mark.parametrize("spec, mesh", [("_, r", "r=3"), ("_, r", "r=7"), ("r, _", "r=2"), ("_, _", "r=3")])
def test_signed_zeros_of_extremes_and_scans_as_jax(spec, mesh):
    x, y = _inputs()
    wants = [np.asarray(fn(jnp.asarray(x), jnp.asarray(y))) for _, fn in OPS]
    results = ", ".join(f"f32{list(w.shape)}" for w in wants)
    src = (f"mesh [{mesh}]\nfunc main(x: f32[2, 7] {{{spec}}}, y: f32[2, 7] {{{spec}}}) -> ({results}) {{\n"
           + "".join(f"  r{i} = {s}\n" for i, (s, _) in enumerate(OPS))
           + f"  return {', '.join(f'r{i}' for i in range(len(OPS)))}\n}}\n")
    c = spmdlang.compile(src)
    for b in BACKENDS:
        for (s, _), got, want in zip(OPS, c.run({"x": x, "y": y}, backend=b), wants):
            _same(got, want, f"{b}: {s} {{{spec}}} on [{mesh}]")


def test_zero_constants_of_both_signs_stay_apart():
    """`x + 0.0` and `minimum(x, -0.0)` in one program: two constants, not one (the common
    subexpressions merged them, 0.0 == -0.0, and minimum(x, -0.0) of x = 0 came out +0.0)."""
    x = np.array([0.0, 1.0, 2.0, 3.0], np.float32)
    c = spmdlang.compile("mesh [a=2]\nfunc main(x: f32[4] {a}) -> (f32[4], f32[4]) {\n"
                         "  return x + 0.0, 1.0 / minimum(x, -0.0)\n}\n")
    want = np.asarray(1.0 / jnp.minimum(jnp.asarray(x), -0.0))
    for b in BACKENDS:
        _same(c.run({"x": x}, backend=b)[1], want, b)


def test_max_pool_and_scatter_extremes_of_signed_zeros_as_jax():
    """A max pool's window and scatter_max / scatter_min's repeated ids meet zeros of both signs in
    either order; rows split unevenly over 3."""
    img = np.array([-0.0, 0.0, -0.0, -0.0, 0.0, -0.0, -0.0, -1.0], np.float32).reshape(1, 8, 1, 1)
    table = np.array([-0.0, 0.0, -0.0, 0.0, 1.0], np.float32)
    ids = np.array([0, 1, 2, 3, 0, 2, 3], np.int32)
    upd = np.array([0.0, -0.0, -0.0, 0.0, -0.0, 0.0, -0.0], np.float32)
    pool = np.asarray(jax.lax.reduce_window(jnp.asarray(img), -jnp.inf, jax.lax.max, (1, 2, 1, 1), (1, 1, 1, 1),
                                            "VALID"))
    smax = np.asarray(jnp.asarray(table).at[ids].max(jnp.asarray(upd)))
    smin = np.asarray(jnp.asarray(table).at[ids].min(jnp.asarray(upd)))
    c = spmdlang.compile("mesh [r=3]\nfunc main(img: f32[1, 8, 1, 1] {_, r, _, _}, t: f32[5], ids: i32[7], "
                         "u: f32[7]) -> (f32[1, 7, 1, 1], f32[5], f32[5]) {\n"
                         "  return max_pool(img, [2, 1], 1), scatter_max(t, ids, u), scatter_min(t, ids, u)\n}\n")
    for b in BACKENDS:
        for got, want, what in zip(c.run({"img": img, "t": table, "ids": ids, "u": upd}, backend=b),
                                   (pool, smax, smin), ("max_pool", "scatter_max", "scatter_min")):
            _same(got, want, f"{b}: {what}")
