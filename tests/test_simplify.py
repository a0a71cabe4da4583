"""ir.simplify's algebraic identities: the ops go, every element stays bit for bit what numpy computes
for the expression as written (NaN, infinities and the sign of zero included), on ref, sim and jax;
backward passes lose their `x ** 1` and name their cotangents after the forward values."""

from __future__ import annotations

import numpy as np
import pytest

import spmdlang
from spmdlang.ir.core import all_ops

SPECIALS = np.array([np.nan, -np.nan, np.inf, -np.inf, -0.0, 0.0, 1.5, -2.25, 3e38, 1e-45, -7.0, 0.5],
                    dtype=np.float32)

# (expression, what numpy computes for it, op kinds the canonical program must no longer have)
IDENTITIES = [
    ("a ** 1.0", lambda a: np.power(a, np.float32(1.0)), {"pow"}),
    ("a * 1.0", lambda a: a * np.float32(1.0), {"mul"}),
    ("1.0 * a", lambda a: np.float32(1.0) * a, {"mul"}),
    ("a / 1.0", lambda a: a / np.float32(1.0), {"div"}),
    ("a - 0.0", lambda a: a - np.float32(0.0), {"sub"}),
    ("a + -0.0", lambda a: a + np.float32(-0.0), {"add"}),
    ("-(-a)", lambda a: np.negative(np.negative(a)), {"neg"}),
    ("where(a > 0.0, a, a)", lambda a: a, {"select"}),
    ("cast(a, f32)", lambda a: a, {"cast"}),
    ("reshape(reshape(a, [24]), [4, 6])", lambda a: a, {"reshape"}),
    ("transpose(transpose(a))", lambda a: a, {"transpose"}),
    ("a * (3.0 - 2.0)", lambda a: a * (np.float32(3.0) - np.float32(2.0)), {"mul", "sub"}),
]


def _program(expr: str) -> str:
    return f"mesh [x=2, y=2]\nfunc main(a: f32[4, 6] {{x, y}}) -> f32[4, 6] {{x, y}} {{\n  return {expr}\n}}\n"


def _bits(x):
    return np.asarray(x, np.float32).view(np.int32)


def _same(got, want) -> bool:
    """Bit for bit, except that any NaN matches any NaN (payloads are not part of the semantics)."""
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    nan = np.isnan(want)
    return bool(np.array_equal(np.isnan(got), nan) and np.array_equal(_bits(got)[~nan], _bits(want)[~nan]))


@pytest.mark.parametrize("expr,numpy,gone", IDENTITIES, ids=[e for e, _, _ in IDENTITIES])
def test_identity_goes_and_keeps_every_bit(expr, numpy, gone):
    c = spmdlang.compile(_program(expr))
    kinds = {op.kind for op in all_ops(c.canonical.ops)}
    assert not kinds & gone, c.canonical
    a = np.resize(SPECIALS, (4, 6))
    want = numpy(a)
    for backend in ("ref", "sim", "jax"):
        (got,) = c.run({"a": a}, backend=backend)
        assert _same(got, want), (backend, got, want)


def test_adding_positive_zero_is_kept():
    """-0.0 + 0.0 is +0.0: x + 0.0 is not x (1 / x would flip from -inf to +inf). (XLA's own
    algebraic simplifier does fold it, so the jax backends give -inf here whatever we emit.)"""
    c = spmdlang.compile(_program("1.0 / (a + 0.0)"))
    assert "add" in {op.kind for op in c.canonical.ops}
    a = np.full((4, 6), -0.0, np.float32)
    for backend in ("ref", "sim"):
        (got,) = c.run({"a": a}, backend=backend)
        assert np.all(got == np.inf), (backend, got)


def test_backward_pass_simplified_and_named():
    """train_mlp's backward pass used to compute jnp.power(t, 1.0) and name every cotangent tN."""
    c = spmdlang.compile("programs/train_mlp.spmd")
    pows = [op for op in all_ops(c.canonical.ops) if op.kind == "pow"]
    assert len(pows) == 1, c.canonical  # the forward (h @ w2 - y) ** 2; its derivative's ** 1 is gone
    src = c.jax_source
    assert src.count("jnp.power(") == 1
    assert "    d_h = jax.lax.dot_general(" in src  # the cotangent of h, named after it
    assert "jnp.full((), " not in src  # scalars are written as jnp.float32(2.0)
    d = c.diff(c.random_inputs(0), backends=["ref", "sim", "jax", "xla"])
    assert d["ok"], d["results"]


def test_cse_merges_ops_that_differ_only_in_hints_keeping_a_hint_all_share():
    """reduce_max's `shift` hint (the op table's `hints`): logsumexp's max and a plain max of the
    same values are one op, a plain one (the plain max's users need NaN kept); two shifts stay a
    shift."""
    src = ("mesh [r=2]\nfunc main(x: f32[4, 8] {_, r}) -> (f32[4], f32[4]) {\n"
           "  return logsumexp(x, axis=1), {other}\n}\n")
    both = spmdlang.compile(src.replace("{other}", "max(x, 1)"))
    maxes = [op for op in all_ops(both.canonical.ops) if op.kind == "reduce_max"]
    assert len(maxes) == 1 and not maxes[0].attrs.get("shift")
    shifts = spmdlang.compile(src.replace("{other}", "logsumexp(x, axis=1) * 2.0"))
    maxes = [op for op in all_ops(shifts.canonical.ops) if op.kind == "reduce_max"]
    assert len(maxes) == 1 and maxes[0].attrs.get("shift")
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    x[1, 3] = np.nan
    assert both.diff({"x": x}, backends=["ref", "sim", "jax"])["ok"]
