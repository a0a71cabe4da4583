"""NaN and infinities in every reduction, arg-reduction, scan, sort and selection, on ref, sim
and jax, split and unsplit, evenly and unevenly, against jax.numpy / jax.lax on the whole array
as the oracle (issue 27: sim's argmax gave 2^31 - 1 for a NaN on a split dim, the jax backend's
max dropped it, top_k ranked NaN smallest).

jax's semantics, followed everywhere: max/min propagate NaN, argmax/argmin give the first NaN,
sort/argsort put NaNs last in index order, cummax propagates from the first NaN, top_k ranks NaN
above +inf (spmdlang whatever the NaN's sign bit; jax.lax.top_k ranks a negative NaN below -inf).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import spmdlang

BACKENDS = ("ref", "sim", "jax")
NAN, INF = np.float32(np.nan), np.float32(np.inf)

# (source, oracle on the global array, exact?)
OPS = [
    ("max(x, 1)", lambda x: jnp.max(x, 1), True),
    ("min(x, 1)", lambda x: jnp.min(x, 1), True),
    ("max(x, 0)", lambda x: jnp.max(x, 0), True),
    ("min(x)", jnp.min, True),
    ("argmax(x, 1)", lambda x: jnp.argmax(x, 1).astype(jnp.int32), True),
    ("argmin(x, 1)", lambda x: jnp.argmin(x, 1).astype(jnp.int32), True),
    ("argmax(x, 0)", lambda x: jnp.argmax(x, 0).astype(jnp.int32), True),
    ("argmax(x)", lambda x: jnp.argmax(x).astype(jnp.int32), True),
    ("sum(x, 1)", lambda x: jnp.sum(x, 1), False),
    ("mean(x, 0)", lambda x: jnp.mean(x, 0), False),
    ("prod(x, 1)", lambda x: jnp.prod(x, 1), False),
    ("cumsum(x, 1)", lambda x: jnp.cumsum(x, 1), False),
    ("cumprod(x, 1, reverse=true)", lambda x: jax.lax.cumprod(x, 1, reverse=True), False),
    ("cummax(x, 1)", lambda x: jax.lax.cummax(x, 1), True),
    ("cummax(x, 1, reverse=true)", lambda x: jax.lax.cummax(x, 1, reverse=True), True),
    ("cummax(x, 0)", lambda x: jax.lax.cummax(x, 0), True),
    ("sort(x, 1)", lambda x: jnp.sort(x, 1), True),
    ("argsort(x, 1)", lambda x: jnp.argsort(x, 1, stable=True).astype(jnp.int32), True),
    ("sort(x, 0)", lambda x: jnp.sort(x, 0), True),
    ("argsort(x, 0)", lambda x: jnp.argsort(x, 0, stable=True).astype(jnp.int32), True),
    ("logsumexp(x, axis=1)", lambda x: jax.nn.logsumexp(x, axis=1), False),
    ("softmax(x, axis=1)", lambda x: jax.nn.softmax(x, axis=1), False),
    ("top_k(x, 2)[0]", lambda x: jax.lax.top_k(x, 2)[0], True),
    ("top_k(x, 2)[1]", lambda x: jax.lax.top_k(x, 2)[1], True),
]


def _inputs(n: int, dtype) -> np.ndarray:
    """Rows: a NaN at the end (the padded shard's), inf and NaN in the middle, all -inf, -inf and
    two NaNs, +-inf only, and plain numbers; a column of NaN along dim 0 (NaNs positive: see
    test_top_k_ranks_every_nan_above_inf for negative ones)."""
    x = np.random.default_rng(n).standard_normal((6, n)).astype(np.float32)
    x[0, n - 1] = NAN
    x[1, 0], x[1, n // 2] = INF, NAN
    x[2, :] = -INF
    x[3, 1 % n], x[3, n - 1], x[3, 0] = -INF, NAN, NAN
    x[4, :] = np.where(np.arange(n) % 2, INF, -INF)
    return x.astype(dtype)


def _program(n: int, spec: str, mesh: str, dtype: str, x: np.ndarray) -> tuple[str, list]:
    results, lines, wants = [], [], []
    for i, (src, fn, _) in enumerate(OPS):
        if src.startswith("top_k"):
            lines.append(f"  v{i}, i{i} = top_k(x, 2)")
            name = f"v{i}" if src.endswith("[0]") else f"i{i}"
        else:
            lines.append(f"  r{i} = {src}")
            name = f"r{i}"
        with jax.enable_x64(dtype == "f64"):
            want = np.asarray(fn(jnp.asarray(x)))
        wants.append(want)
        dt = "i32" if want.dtype == np.int32 else dtype
        results.append((name, f"{dt}{list(want.shape)}"))
    src = (f"mesh [{mesh}]\nfunc main(x: {dtype}[6, {n}] {{{spec}}}) -> ({', '.join(t for _, t in results)}) {{\n"
           + "\n".join(lines) + f"\n  return {', '.join(r for r, _ in results)}\n}}\n")
    return src, wants


def _check(got, want, exact, what):
    assert got.shape == want.shape and got.dtype == want.dtype, what
    if exact:
        same = (got == want) | (np.isnan(got.astype(np.float64)) & np.isnan(want.astype(np.float64)))
        assert same.all(), f"{what}: got {got.tolist()}, want {want.tolist()}"
    else:
        tol = 5e-2 if got.itemsize < 4 else 1e-5  # bf16: cancellation in the sums, rounded once per step
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol,
                                   equal_nan=True, err_msg=what)


@pytest.mark.parametrize("n, spec, mesh, dtype", [
    (7, "_, r", "r=3", "f32"),  # uneven split of the reduced / scanned / sorted dim
    (6, "r, _", "r=3", "f32"),  # dim 0 split (its 6 rows evenly)
    (2, "_, r", "r=3", "f32"),  # more shards than elements: a whole shard of padding
    (7, "_, _", "r=3", "f32"),  # unsplit
    (5, "a, b", "a=2, b=2", "f32"),  # both dims split, unevenly
    (7, "_, r", "r=3", "bf16"),  # narrow floats through the NaN-keeping all-reduce
    (7, "_, (a, b)", "a=2, b=2", "f64"),  # 64-bit keys
])
def test_nan_and_inf_as_jax(n, spec, mesh, dtype):
    x = _inputs(n, {"f32": np.float32, "bf16": ml_dtypes.bfloat16, "f64": np.float64}[dtype])
    src, wants = _program(n, spec, mesh, dtype, x)
    c = spmdlang.compile(src)
    for b in BACKENDS:
        outs = c.run({"x": x}, backend=b)
        for (op, _, exact), got, want in zip(OPS, outs, wants):
            _check(np.asarray(got), want, exact, f"{b}: {op} on {dtype}[6, {n}] {{{spec}}}")


def test_top_k_ranks_every_nan_above_inf():
    """A NaN with its sign bit set (what 0/0 and inf - inf give on CPUs) ranks as a positive one:
    above +inf, ties among NaNs to the lower index, on every backend and layout."""
    x = np.array([[1.0, -NAN, INF, NAN, 2.0, -INF, -NAN]], np.float32)
    assert np.signbit(x[0, 1]) and not np.signbit(x[0, 3])
    src = """mesh [r=3]
func main(x: f32[1, 7] {_, S}, y: f32[1, 7] {_, S}) -> (f32[1, 5], i32[1, 5], f32[1, 7], f32[1, 3], i32[1, 3]) {
  v, i = top_k(x, 5)
  w, j = top_k(0.0 / y, 3)
  return v, i, sort(x), w, j
}
"""
    y = np.array([[1.0, 0.0, -1.0, 0.0, NAN, -NAN, 1.0]], np.float32)
    for spec in ("r", "_"):
        c = spmdlang.compile(src.replace("S", spec))
        for b in BACKENDS:
            v, i, s, w, j = (np.asarray(o) for o in c.run({"x": x, "y": y}, backend=b))
            assert i.tolist() == [[1, 3, 6, 2, 4]], (b, spec)
            assert np.isnan(v[0, :3]).all() and v[0, 3:].tolist() == [INF, 2.0]
            assert s[0, :4].tolist() == [-INF, 1.0, 2.0, INF] and np.isnan(s[0, 4:]).all()
            assert j.tolist() == [[1, 3, 4]], (b, spec)  # 0/0 (a negative NaN on x86) and the input NaNs
    # the oracle for positive NaNs, and why every NaN is made positive first
    got = jax.lax.top_k(jnp.asarray(x), 5)
    assert np.asarray(got[1]).tolist() != [[1, 3, 6, 2, 4]]
    assert np.asarray(jax.lax.top_k(jnp.where(jnp.isnan(x), jnp.nan, x), 5)[1]).tolist() == [[1, 3, 6, 2, 4]]


def test_nan_times_a_cast_bool_stays_nan():
    """0 * NaN is NaN (IEEE, numpy); XLA rewrites a multiply by a converted bool into a select
    that gives 0 (docs/known_xla_issues.md #9). The gradient of a min whose result is NaN
    multiplies such a mask by a NaN share: NaN everywhere, as jax's own eager pullback gives."""
    src = """mesh [r=3]
func f(x: f32[7]) -> f32[] {
  return min(x)
}
func main(x: f32[7] {r}, y: f32[7] {r}) -> (f32[7], f32[7]) {
  return cast(x > 0.0, f32) * y, grad(f, x)
}
"""
    x = np.array([1.0, -1.0, NAN, 2.0, 0.5, -3.0, 4.0], np.float32)
    y = np.full(7, NAN, np.float32)
    want = np.asarray(jax.grad(jnp.min)(jnp.asarray(x)))
    assert np.isnan(want).all()
    c = spmdlang.compile(src)
    for b in BACKENDS:
        prod, g = (np.asarray(o) for o in c.run({"x": x, "y": y}, backend=b))
        assert np.isnan(prod).all() and np.isnan(g).all(), (b, prod, g)


@pytest.mark.parametrize("src, fn", [
    ("logsumexp(x, axis=1)", lambda x: jax.nn.logsumexp(x, axis=1)),
    ("softmax(x, axis=1)", lambda x: jax.nn.softmax(x, axis=1)),
    ("log_softmax(x, axis=1)", lambda x: jax.nn.log_softmax(x, axis=1)),
])
@pytest.mark.parametrize("n, spec, mesh", [(7, "_, r", "r=3"), (5, "a, (b, r)", "a=2, b=2, r=1"), (2, "_, r", "r=3")])
def test_a_shifts_max_alone_is_xlas_all_reduce_and_still_nan_as_jax(src, fn, n, spec, mesh):
    """A max that only shifts (logsumexp, softmax, log_softmax: it cancels from the result) is
    all-reduced by XLA's own pmax, which drops NaN on CPU: a row holding a NaN is NaN whatever the
    shift, so every backend still gives jax's values, NaN and infinities included."""
    x = _inputs(n, np.float32)
    want = np.asarray(fn(jnp.asarray(x)))
    c = spmdlang.compile(f"mesh [{mesh}]\nfunc main(x: f32[6, {n}] {{{spec}}}) -> f32{list(want.shape)} "
                         f"{{ return {src} }}\n")
    assert "def all_reduce" not in c.jax_source  # (the helper with NaN-keeping keys)
    if n > 2:  # (2 elements over 3 shards are gathered, not reduced shard by shard)
        assert "jax.lax.pmax(jax.lax.stop_gradient(" in c.jax_source
    for b in BACKENDS + ("xla",):
        _check(np.asarray(c.run({"x": x}, backend=b)[0]), want, False, f"{b}: {src} {{{spec}}}")


@pytest.mark.parametrize("src, fn, collective", [
    ("argmax(x, 1)", lambda x: jnp.argmax(x, 1).astype(jnp.int32), "pmax"),
    ("argmin(x, 1)", lambda x: jnp.argmin(x, 1).astype(jnp.int32), "pmin"),
])
@pytest.mark.parametrize("n, spec, mesh", [(7, "_, r", "r=3"), (5, "a, (b, r)", "a=2, b=2, r=1"), (9, "_, r", "r=4")])
def test_a_split_argmax_alone_is_xlas_all_reduce_and_still_the_first_nan(src, fn, collective, n, spec, mesh):
    """The shards' extremes of a split argmax / argmin are all-reduced by XLA's own pmax / pmin,
    which drops NaN on CPU: a shard holding a NaN ranks its first NaN's index before every other
    without that extreme, so every backend gives jax's first NaN, infinities and ties included."""
    x = _inputs(n, np.float32)
    x[5, n // 3], x[5, n - 2] = NAN, NAN  # two shards hold NaNs: the first one's index wins
    want = np.asarray(fn(jnp.asarray(x)))
    c = spmdlang.compile(f"mesh [{mesh}]\nfunc main(x: f32[6, {n}] {{{spec}}}) -> i32{list(want.shape)} "
                         f"{{ return {src} }}\n")
    assert "def all_reduce" not in c.jax_source  # (the helper with NaN-keeping keys)
    assert f"jax.lax.{collective}(jax.lax.stop_gradient(" in c.jax_source
    for b in BACKENDS + ("xla",):
        _check(np.asarray(c.run({"x": x}, backend=b)[0]), want, True, f"{b}: {src} {{{spec}}}")


def test_top_k_ranks_plus_zero_above_minus_zero_as_jax():
    """jax.lax.top_k orders floats totally: +0.0 above -0.0 (ties between equal zeros to the lower
    index), values with their signs, on every backend and layout, split over shards or not."""
    x = np.array([[-0.0, 0.0, -1.0, -0.0, 0.0, -0.0, 2.0]], np.float32)
    want_v, want_i = (np.asarray(a) for a in jax.lax.top_k(jnp.asarray(x), 5))
    assert want_i.tolist() == [[6, 1, 4, 0, 3]]
    for spec in ("r", "_"):
        c = spmdlang.compile(f"mesh [r=3]\nfunc main(x: f32[1, 7] {{_, {spec}}}) -> (f32[1, 5], i32[1, 5]) "
                             "{\n  v, i = top_k(x, 5)\n  return v, i\n}\n")
        for b in BACKENDS:
            v, i = (np.asarray(o) for o in c.run({"x": x}, backend=b))
            assert i.tolist() == want_i.tolist() and np.signbit(v).tolist() == np.signbit(want_v).tolist(), (b, spec)


def test_signed_zeros_of_sign_pow_and_fmod_as_jax():
    """sign(-0.0) is -0.0 and -0.0 ** 0.5 is +0.0 (C's and XLA's pow; numpy's takes it as sqrt's
    -0.0) on every backend, as jax; lax.rem (jnp.fmod) of a zero result keeps the dividend's sign."""
    x = np.array([0.0, -0.0, -0.0, 0.0, -2.0, 3.0, -0.0], np.float32)
    y = np.array([0.5, 0.5, 3.0, 2.0, 1.0, 0.5, 2.0], np.float32)
    want = [np.asarray(jnp.sign(x)), np.asarray(x ** y)]
    c = spmdlang.compile("mesh [r=3]\nfunc main(x: f32[7] {r}, y: f32[7] {r}) -> (f32[7], f32[7]) {\n"
                         "  return sign(x), pow(x, y)\n}\n")
    for b in BACKENDS:
        for got, w in zip(c.run({"x": x, "y": y}, backend=b), want):
            got = np.asarray(got)
            np.testing.assert_allclose(got, w, rtol=1e-6)  # (pow: within an ulp of jax's)
            assert np.signbit(got).tolist() == np.signbit(w).tolist(), b
    a, d = np.array([-3.0, 3.0, -3.5], np.float32), np.array([1.5, -1.5, 2.0], np.float32)
    imp = spmdlang.from_jax(jnp.fmod, a, d)
    got = np.asarray(imp.unflatten(imp.compile().run(imp.flatten(a, d), backend="ref")))
    assert np.signbit(got).tolist() == np.signbit(np.asarray(jnp.fmod(a, d))).tolist() == [True, False, True]
