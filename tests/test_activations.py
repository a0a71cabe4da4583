"""jax.nn's activations against jax.nn itself: values on every backend (ref, sim, jax, xla), with x
unsplit, split evenly and unevenly, and gradients against jax.grad of the jax.nn function, ties
included (0, +-1, 6 on the grid); ints, bf16, and misuse as located errors."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import spmdlang
from spmdlang.errors import SpmdError

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
nn = jax.nn

# (spmdlang expression of x, the jax.nn function of x)
ACTIVATIONS = [
    ("sigmoid(x)", nn.sigmoid),
    ("softplus(x)", nn.softplus),
    ("log_sigmoid(x)", nn.log_sigmoid),
    ("silu(x)", nn.silu),
    ("swish(x)", nn.swish),
    ("relu6(x)", nn.relu6),
    ("hard_tanh(x)", nn.hard_tanh),
    ("leaky_relu(x)", nn.leaky_relu),
    ("leaky_relu(x, negative_slope=0.2)", lambda x: nn.leaky_relu(x, negative_slope=0.2)),
    ("elu(x)", nn.elu),
    ("elu(x, alpha=0.5)", lambda x: nn.elu(x, alpha=0.5)),
    ("celu(x)", nn.celu),
    ("celu(x, alpha=2.0)", lambda x: nn.celu(x, alpha=2.0)),
    ("selu(x)", nn.selu),
    ("glu(x)", nn.glu),
    ("glu(x, axis=0)", lambda x: nn.glu(x, axis=0)),
    ("log_softmax(x)", nn.log_softmax),
    ("log_softmax(x, axis=0)", lambda x: nn.log_softmax(x, axis=0)),
    ("log_softmax(x, axis=[0, 1])", lambda x: nn.log_softmax(x, axis=(0, 1))),
    ("softmax(x)", nn.softmax),
    ("softmax(x, axis=0)", lambda x: nn.softmax(x, axis=0)),
    ("softmax(x, axis=[0, 1])", lambda x: nn.softmax(x, axis=(0, 1))),
    ("standardize(x)", nn.standardize),
    ("standardize(x, axis=0, epsilon=0.1)", lambda x: nn.standardize(x, axis=0, epsilon=0.1)),
]
IDS = [e for e, _ in ACTIVATIONS]
SPECS = ["", " {a, _}", " {a, b}", " {(a, b), _}"]  # unsplit, split on 2, on 2 x 2, on 4 (uneven: 6 rows)


def _x(rng, shape=(6, 10)) -> np.ndarray:
    """Normal values at scale 4 (both sides of relu6's 6), with every kink on the first row."""
    x = (4 * rng.standard_normal(shape)).astype(np.float32)
    x.flat[:8] = [0.0, 6.0, 1.0, -1.0, -0.0, 7.0, -3.0, 0.5]
    return x


def _result_type(want) -> str:
    return f"f32[{', '.join(map(str, want.shape))}]"


@pytest.mark.parametrize("expr, fn", ACTIVATIONS, ids=IDS)
def test_values_equal_jax_nn_on_every_backend_split_or_not(expr, fn):
    x = _x(np.random.default_rng(0))
    want = np.asarray(fn(jnp.asarray(x)))
    for spec in SPECS:
        src = f"mesh [a=2, b=2]\nfunc main(x: f32[6, 10]{spec}) -> {_result_type(want)} {{ return {expr} }}"
        c = spmdlang.compile(src)
        # the jax backends (one jit each) on the uneven split of 6 rows over 4
        for backend in ("ref", "sim", "jax", "xla") if spec == SPECS[-1] else ("ref", "sim"):
            got = c.run({"x": x}, backend=backend)[0]
            np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6, err_msg=f"{expr}{spec} on {backend}")


@pytest.mark.parametrize("expr, fn", ACTIVATIONS, ids=IDS)
def test_gradients_equal_jax_grad_of_jax_nn(expr, fn):
    """grad of sum(c * f(x)) on ref against jax.grad, in f32, at the kinks too; `diff` then holds
    every backend to ref, xla's being jax's own differentiation of the emitted forward."""
    rng = np.random.default_rng(1)
    x = _x(rng)
    y = np.asarray(fn(jnp.asarray(x)))
    c = rng.standard_normal(y.shape).astype(np.float32)
    want = np.asarray(jax.grad(lambda v: jnp.sum(c * fn(v)))(jnp.asarray(x)))
    shape = _result_type(y)
    src = (f"mesh [a=2, b=2]\nfunc f(x: f32[6, 10], c: {shape}) -> f32[] {{ return sum(c * {expr}) }}\n"
           f"func main(x: f32[6, 10] {{(a, b), _}}, c: {shape}) -> f32[6, 10] {{ return grad(f, x, c) }}\n")
    prog = spmdlang.compile(src)
    got = prog.run({"x": x, "c": c}, backend="ref")[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=expr)
    report = prog.diff({"x": x, "c": c}, backends=["ref", "sim", "jax", "xla"])
    assert report["ok"], report


def test_kinks_get_jax_custom_derivatives():
    """relu6 passes no gradient at 0 and 6 (jax's custom_jvp), softplus has 1/2 at 0, elu alpha
    at 0, hard_tanh 1 at +-1 (its where keeps x there), celu 1 at 0 (maximum's and minimum's ties
    split in half)."""
    x = np.array([0.0, 6.0, 1.0, -1.0], np.float32)
    src = ("mesh [a=2]\nfunc f(x: f32[4]) -> f32[] {\n"
           "  return sum(relu6(x) + 10.0 * softplus(x) + 100.0 * elu(x, alpha=0.5) + 1000.0 * hard_tanh(x)"
           " + 10000.0 * celu(x))\n}\n"
           "func main(x: f32[4] {a}) -> f32[4] { return grad(f, x) }\n")
    got = spmdlang.compile(src).run({"x": x})[0]
    want = np.asarray(jax.grad(lambda v: jnp.sum(nn.relu6(v) + 10 * nn.softplus(v) + 100 * nn.elu(v, 0.5)
                                                 + 1000 * nn.hard_tanh(v) + 10000 * nn.celu(v)))(x))
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert got[0] == 0 + 10 * 0.5 + 100 * 0.5 + 1000 + 10000


def test_ints_compute_in_floats_and_hard_tanh_keeps_them():
    src = ("mesh [a=2]\nfunc main(n: i32[6] {a}) -> (f32[6], f32[6], f32[6], i32[6]) {\n"
           "  return relu6(n), silu(n), log_softmax(n), hard_tanh(n)\n}\n")
    n = np.array([-3, -1, 0, 1, 6, 9], np.int32)
    got = spmdlang.compile(src).run({"n": n})
    want = [nn.relu6(n), nn.silu(n.astype(np.float32)), nn.log_softmax(n.astype(np.float32)), nn.hard_tanh(n)]
    for g, w in zip(got, want):
        assert g.dtype == np.asarray(w).dtype
        np.testing.assert_allclose(g, np.asarray(w), rtol=1e-6)


def test_bf16_stays_bf16_and_follows_jax():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 6)).astype(ml_dtypes.bfloat16)
    src = ("mesh [a=2]\nfunc main(x: bf16[4, 6] {a, _}) -> (bf16[4, 6], bf16[4, 6], bf16[4, 3]) {\n"
           "  return softplus(x), standardize(x), glu(x)\n}\n")
    c = spmdlang.compile(src)
    want = [nn.softplus(x), nn.standardize(x), nn.glu(x)]
    for backend in ("ref", "sim", "jax"):
        for g, w in zip(c.run({"x": x}, backend=backend), want):
            assert g.dtype == ml_dtypes.bfloat16
            np.testing.assert_allclose(g.astype(np.float32), np.asarray(w, np.float32), rtol=3e-2, atol=3e-2)


def test_bf16_means_sum_and_divide_in_f32_as_jnp_mean():
    """standardize's mean(x^2) - mean^2 cancels: values near 1 with a small spread. jnp.mean sums and
    divides a bf16 in f32 and rounds once; rounding the sum first (campaign seed 33117) gave the jax
    module a variance 1.8x too small. ref and sim equal jax op by op bit for bit, split over rows or
    not; the jax module equals jitted jax (XLA's fusion keeps f32 between bf16 ops, in jax.nn's
    jitted standardize as in our module)."""
    x = (1 + 0.15 * np.random.default_rng(3).standard_normal((6, 5))).astype(ml_dtypes.bfloat16)
    src = ("mesh [a=4]\nfunc main(x: bf16[6, 5] {a, _}) -> (bf16[6, 5], bf16[6], bf16[5]) {\n"
           "  return standardize(x, epsilon=0.01), mean(x, axis=1), mean(x * x, axis=0)\n}\n")
    c = spmdlang.compile(src)
    def want(x):
        return [nn.standardize(x, epsilon=0.01), jnp.mean(x, axis=1), jnp.mean(x * x, axis=0)]

    with jax.disable_jit():
        op_by_op = want(x)
    for backend, expected in (("ref", op_by_op), ("sim", op_by_op), ("jax", jax.jit(want)(x))):
        for g, w in zip(c.run({"x": x}, backend=backend), expected):
            assert g.dtype == ml_dtypes.bfloat16
            if backend == "jax":  # XLA fuses our module as it fuses jax's: the same roundings
                np.testing.assert_allclose(g.astype(np.float32), np.asarray(w, np.float32), rtol=1e-2)
            else:
                np.testing.assert_array_equal(g.astype(np.float32), np.asarray(w, np.float32), err_msg=backend)


def test_hyperparameters_take_consts_and_tensors():
    src = ("mesh [a=2]\nconst SLOPE = 0.3\nconst ALPHA = 2.0 * SLOPE\n"
           "func main(x: f32[4, 6] {a, _}, s: f32[6]) -> (f32[4, 6], f32[4, 6], f32[4, 6]) {\n"
           "  return leaky_relu(x, SLOPE), elu(x, alpha=ALPHA), standardize(x, epsilon=s)\n}\n")
    rng = np.random.default_rng(3)
    x, s = rng.standard_normal((4, 6)).astype(np.float32), rng.uniform(0.1, 1, 6).astype(np.float32)
    got = spmdlang.compile(src).run({"x": x, "s": s})
    mean = x.mean(-1, keepdims=True)
    var = np.maximum((x * x).mean(-1, keepdims=True) - mean * mean, 0)
    want = [nn.leaky_relu(x, 0.3), nn.elu(x, 0.6), (x - mean) / np.sqrt(var + s)]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, np.asarray(w), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("body, at, fragment", [
    ("glu(x)", "x)", "its size 5 is odd"),
    ("glu(x, axis=2)", "2)", "axis 2 is out of range for rank 2"),
    ("log_softmax(x, axis=[0, 0])", "[0, 0]", "names a dimension twice"),
    ("hard_tanh(x > 0.0)", "> 0.0", "hard_tanh needs a numeric tensor"),
    ("elu(x, beta=1.0)", "beta", "elu() has no argument 'beta'"),
    ("log_softmx(x)", "log_softmx", "did you mean 'log_softmax'"),
])
def test_misuse_is_a_located_error(body, at, fragment):
    src = f"mesh [a=2]\nfunc main(x: f32[4, 5]) -> f32[4, 5] {{\n  return {body}\n}}\n"
    with pytest.raises(SpmdError) as info:
        spmdlang.compile(src)
    e = info.value
    assert (e.line, e.col) == (3, src.splitlines()[2].index(at) + 1), e.render()
    assert fragment in e.message, e.render()
