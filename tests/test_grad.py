"""Differentiation: grad / value_and_grad / stop_gradient.

- every differentiable op's vjp rule against jax.vjp of the op's own jax emission, on its example
  instance and on random shapes;
- float64 finite differences on the reference backend over random differentiable programs
  (tests/progen.py, Generator(grad=True).grad_program());
- the oracle: the xla backend's gradients come from jax.value_and_grad, not from our backward ops;
- located errors for every way to misuse grad.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import progen
import pytest
import test_vjp as TV
from gradcheck import check_finite_differences

import spmdlang
from spmdlang.errors import SpmdError
from spmdlang.inputs import random_inputs
from spmdlang.ir import registry
from spmdlang.ir import types as T
from spmdlang.ir.registry import Grad
from spmdlang.ir.types import TensorType

GLOBAL = sorted(n for n, op in registry.OPS.items() if not op.local_only)
DIFFERENTIABLE = [n for n in GLOBAL if callable(registry.get(n).vjp)]

# operands that must stay in a domain: (op, operand index) -> sampler(rng, shape)
_POSITIVE = {("log", 0), ("sqrt", 0), ("rsqrt", 0), ("pow", 0), ("log1p", 0)}
_AWAY = {("div", 1), ("mod", 1)}


def _parse_type(text: str) -> TensorType:
    dt, dims = text.split("[")
    dims = dims.rstrip("]").strip()
    return TensorType(dt, tuple(int(d) for d in dims.split(",")) if dims else ())


def _sample(rng, name, i, t: TensorType, n_axis=None):
    if T.is_int(t.dtype):
        hi = n_axis or 8
        return rng.integers(-1, hi + 1, size=t.shape).astype(T.np_dtype(t.dtype))
    if t.dtype == "bool":
        return rng.random(t.shape) < 0.5
    a = rng.standard_normal(t.shape)
    if (name, i) in _POSITIVE:
        a = np.abs(a) + 0.5
    if (name, i) in _AWAY:
        a = np.sign(a + 1e-9) * (np.abs(a) + 0.5)
    return a.astype(np.float64)


def _f64(t: TensorType) -> TensorType:
    return TensorType("f64", t.shape) if T.is_float(t.dtype) else t


def _random_instance(name, rng):
    """A random-shape instance for ops whose example generalises: elementwise ones and reductions."""
    op = registry.get(name)
    types, attrs = op.example
    if op.family.value == "elementwise":
        shape = tuple(int(n) for n in rng.integers(1, 6, size=rng.integers(0, 4)))
        return tuple(f"{t.split('[')[0]}[{', '.join(map(str, shape))}]" for t in types), attrs
    if name in ("reduce_sum", "reduce_max", "reduce_min", "reduce_prod"):
        rank = int(rng.integers(1, 4))
        shape = tuple(int(n) for n in rng.integers(1, 6, size=rank))
        axes = tuple(sorted({int(a) for a in rng.integers(0, rank, size=rng.integers(1, rank + 1))}))
        return (f"f32[{', '.join(map(str, shape))}]",), {"axes": axes}
    return None


def _vjp_case(name, types_text, attrs, seed):
    jax = pytest.importorskip("jax")
    with jax.enable_x64(True):
        _vjp_case_x64(jax, name, types_text, attrs, seed)


def _vjp_case_x64(jax, name, types_text, attrs, seed):
    opdef = registry.get(name)
    rng = np.random.default_rng(seed)
    types = [_f64(_parse_type(t)) for t in types_text]
    n_axis = None
    if name in ("take", "take_along_axis", "scatter_add"):
        n_axis = types[0].shape[attrs["axis"]]
    arrays = [_sample(rng, name, i, t, n_axis) for i, t in enumerate(types)]
    result_types = opdef.infer_types(types, TV._frozen(attrs))
    cts = [rng.standard_normal(t.shape).astype(np.float64) if T.is_float(t.dtype) else None for t in result_types]
    ours, _ = TV.ours(name, arrays, attrs, cts)
    want = TV.jax_vjp(TV.emission(name, attrs, result_types), arrays, cts, result_types)
    for i in (i for i, t in enumerate(types) if T.is_float(t.dtype)):
        np.testing.assert_allclose(ours[i], want[i], rtol=1e-9, atol=1e-9,
                                   err_msg=f"{name} operand {i} {types_text} {dict(attrs)}")


@pytest.mark.parametrize("name", DIFFERENTIABLE)
def test_vjp_matches_jax_on_the_example(name):
    types, attrs = registry.get(name).example
    _vjp_case(name, types, attrs, 0)


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in DIFFERENTIABLE if _random_instance(n, np.random.default_rng(0))])
def test_vjp_matches_jax_on_random_shapes(name):
    for seed in range(2):
        inst = _random_instance(name, np.random.default_rng(100 + seed))
        _vjp_case(name, *inst, seed)


@pytest.mark.parametrize("name,types,attrs", [
    ("slice", ("f32[9, 7]",), {"starts": (1, 0), "stops": (9, 7), "steps": (3, 2)}),
    ("pad", ("f32[3, 4]",), {"lo": (2, 0), "hi": (1, 3), "value": 1.5}),
    ("concat", ("f32[2, 3]", "f32[2, 5]", "f32[2, 1]"), {"axis": 1}),
    ("einsum", ("f32[3, 4, 5]", "f32[5, 6]"), {"spec": "abc,cd->db"}),
    ("einsum", ("f32[3, 4]",), {"spec": "ab->a"}),
    ("einsum", ("f32[3, 4]", "f32[4]"), {"spec": "ab,b->"}),
    ("take", ("f32[6, 3]", "i32[2, 4]"), {"axis": 0}),
    ("take", ("f32[6, 3]", "i32[5]"), {"axis": 1}),
    ("take_along_axis", ("f32[3, 6, 2]", "i32[3, 4, 2]"), {"axis": 1}),
    ("scatter_add", ("f32[5, 3]", "i32[4]", "f32[5, 4]"), {"axis": 1}),
    ("cumsum", ("f32[4, 5]",), {"axis": 0, "reverse": True}),
    ("cumprod", ("f32[3, 5]",), {"axis": 1, "reverse": True}),
    ("cummax", ("f32[3, 5]",), {"axis": 0, "reverse": True}),
    ("top_k", ("f32[3, 7]",), {"k": 4}),
    ("sort", ("f32[5, 3]",), {"axis": 0}),
    ("pool", ("f32[2, 7, 3]",), {"reduce": "max", "window": (3,), "strides": (2,), "padding": ((1, 1),)}),
    ("pool", ("f32[2, 5, 4, 3]",), {"reduce": "sum", "window": (2, 3), "strides": (1, 2),
                                    "padding": ((0, 1), (1, 1))}),
    ("conv", ("f32[2, 7, 3]", "f32[3, 3, 4]"), {"strides": (2,), "padding": ((1, 1),)}),
    ("conv", ("f32[1, 9, 8, 2]", "f32[3, 2, 2, 3]"), {"strides": (2, 3), "padding": ((0, 0), (1, 0))}),
    ("conv", ("f32[2, 6, 5, 3]", "f32[2, 3, 3, 2]"), {"strides": (1, 1), "padding": ((0, 0), (0, 0))}),
    ("conv", ("f32[1, 4, 4, 1]", "f32[4, 4, 1, 2]"), {"strides": (3, 1), "padding": ((2, 1), (0, 3))}),
    # rhs_dilation, lhs_dilation (explicit, even negative padding), groups incl. depthwise, 1-D/2-D/3-D
    ("conv", ("f32[2, 9, 3]", "f32[3, 3, 4]"), {"strides": (1,), "padding": ((1, 2),), "rhs_dilation": (2,)}),
    ("conv", ("f32[2, 11, 3]", "f32[3, 3, 4]"), {"strides": (2,), "padding": ((0, 1),), "rhs_dilation": (3,)}),
    ("conv", ("f32[2, 5, 3]", "f32[3, 3, 2]"), {"strides": (1,), "padding": ((2, 2),), "lhs_dilation": (2,)}),
    ("conv", ("f32[1, 5, 4, 2]", "f32[3, 2, 2, 3]"), {"strides": (2, 1), "padding": ((1, 2), (0, -1)),
                                                     "lhs_dilation": (2, 3)}),
    ("conv", ("f32[2, 8, 6]", "f32[3, 2, 6]"), {"strides": (2,), "padding": ((1, 0),), "groups": 3}),
    ("conv", ("f32[1, 7, 6, 4]", "f32[3, 3, 1, 8]"), {"strides": (1, 2), "padding": ((1, 1), (0, 1)),
                                                     "groups": 4}),
    ("conv", ("f32[2, 6, 5, 4]", "f32[2, 3, 2, 6]"), {"strides": (2, 1), "padding": ((1, 0), (2, 1)),
                                                     "lhs_dilation": (1, 2), "rhs_dilation": (2, 1), "groups": 2}),
    ("conv", ("f32[1, 5, 4, 6, 2]", "f32[2, 2, 3, 2, 3]"), {"strides": (1, 2, 1), "padding": ((0, 1), (1, 1), (0, 0)),
                                                           "rhs_dilation": (2, 1, 1)}),
    ("conv", ("f32[1, 4, 5, 4, 3]", "f32[2, 2, 2, 1, 3]"), {"strides": (2, 1, 2), "padding": ((1, 0), (0, 1), (1, 1)),
                                                           "lhs_dilation": (1, 2, 1), "groups": 3}),
    ("conv", ("f32[4, 7, 2]", "f32[3, 2, 6]"), {"strides": (2,), "padding": ((1, 1),), "batch_groups": 2}),
    ("dynamic_slice", ("f32[6, 5]", "i32[]", "i32[]"), {"sizes": (3, 5)}),
    ("dynamic_slice", ("f32[6, 5, 2]", "i32[]", "i32[]", "i32[]"), {"sizes": (1, 2, 2)}),
    ("dynamic_update_slice", ("f32[6, 5]", "f32[2, 3]", "i32[]", "i32[]"), {}),
    ("broadcast_in_dim", ("f32[3, 1]",), {"shape": (2, 3, 4), "dims": (1, 2)}),
    ("reduce_prod", ("f32[3, 4, 2]",), {"axes": (0, 2)}),
    ("roll", ("f32[5, 3]",), {"shift": -7, "axis": 0}),
    ("transpose", ("f32[2, 3, 4]",), {"perm": (1, 2, 0)}),
])
def test_vjp_matches_jax_on_more_instances(name, types, attrs):
    _vjp_case(name, types, attrs, 1)


def _run_vjp_with_ties(name, x, attrs):
    """Our vjp of a one-operand op on x with a unit cotangent vs jax.vjp, ties in x kept."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    src = {"reduce_max": "max(x, axis={a})", "reduce_min": "min(x, axis={a})"}[name].format(a=attrs)
    c = spmdlang.compile(f"mesh [p=1]\nfunc f(x: f64[{', '.join(map(str, x.shape))}]) -> f64[] "
                         f"{{ return sum(sin({src})) }}\nfunc main(x: f64[{', '.join(map(str, x.shape))}]) -> "
                         f"f64[{', '.join(map(str, x.shape))}] {{ return grad(f, x) }}")
    ours = c.run({"x": x}, backend="ref")[0]
    fn = {"reduce_max": jnp.max, "reduce_min": jnp.min}[name]
    with jax.enable_x64(True):
        want = jax.grad(lambda v: jnp.sum(jnp.sin(fn(v, axis=attrs))))(jnp.asarray(x))
    np.testing.assert_allclose(ours, np.asarray(want), rtol=1e-12)


def test_max_and_min_share_ties_as_jax_does():
    x = np.array([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, -1.0], [-1.0, -1.0, 5.0, -1.0]])
    for name in ("reduce_max", "reduce_min"):
        for axis in (0, 1):
            _run_vjp_with_ties(name, x, axis)


def test_maximum_and_minimum_ties_split_in_half_as_jax():
    c = spmdlang.compile("mesh [p=1]\nfunc f(a: f32[4], b: f32[4]) -> f32[] { return sum(maximum(a, b) + "
                         "3.0 * minimum(a, b)) }\nfunc main(a: f32[4], b: f32[4]) -> (f32[4], f32[4]) "
                         "{ ga, gb = grad(f, a, b, argnums=[0, 1])\n return ga, gb }")
    a = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    b = np.array([1.0, 5.0, 3.0, 0.0], np.float32)
    ga, gb = c.run({"a": a, "b": b}, backend="ref")
    np.testing.assert_array_equal(ga, [2.0, 3.0, 2.0, 1.0])
    np.testing.assert_array_equal(gb, [2.0, 1.0, 2.0, 3.0])
    assert c.diff({"a": a, "b": b})["ok"]


# ---------------------------------------------------------------------------------- finite differences


def _f64_source(src: str) -> str:
    """The program in f64, but jax.random's draws (f32, bf16 or f16 only, as jax draws them
    without x64) stay f32 and are cast: a draw passes no gradient anyway."""
    src = re.sub(r"\b(f32|bf16)\b", "f64", src)
    return re.sub(r"\b((?:uniform|normal)\(.*?)\bf64(\[[^\]]*\][^)]*\))", r"cast(\1f32\2, f64)", src)


def finite_difference_check(seed: int, points: int = 3, eps: float = 1e-6) -> None:
    gen = progen.Generator(progen.RandomChooser(seed), max_devices=8, grad=True)
    # finite differences see through stop_gradient (it is the identity): compare without it
    src = _f64_source(gen.grad_program()).replace("stop_gradient(", "(")
    c = spmdlang.compile(src)
    loss = spmdlang.compile(src, entry="loss")
    inputs = random_inputs(c.program, seed)
    outs = c.run(inputs, backend="ref")
    m = re.search(r"argnums=\[([\d, ]+)\]", src)
    argnums = [int(x) for x in m.group(1).split(",")]
    check_finite_differences(loss, inputs, argnums, outs[-len(argnums):], np.random.default_rng(seed), points, eps,
                             context=f"seed {seed}:\n{src}\n")


@pytest.mark.parametrize("seed", range(40))
def test_gradients_match_finite_differences(seed):
    finite_difference_check(seed)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(40, 400))
def test_gradients_match_finite_differences_more(seed):
    finite_difference_check(seed)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(3, 40))
def test_random_grad_programs_agree_with_jax_autodiff_more(seed):
    test_random_grad_programs_agree_with_jax_autodiff(seed)


@pytest.mark.parametrize("seed", range(3))
def test_random_grad_programs_agree_with_jax_autodiff(seed):
    """ref, sim and jax run our backward ops; xla differentiates with jax.value_and_grad."""
    pytest.importorskip("jax")
    src = progen.Generator(progen.RandomChooser(1000 + seed), max_devices=8, grad=True).grad_program()
    assert spmdlang.compile(src).diff()["ok"], src


# ---------------------------------------------------------------------------------- the oracle and the IR


MLP = """mesh [data=2, model=2]
func loss(w1: f32[8, 16], w2: f32[16, 8], x: f32[4, 8], y: f32[4, 8]) -> f32[] {
  return mean((relu(x @ w1) @ w2 - y) ** 2)
}
func main(w1: f32[8, 16] {_, model}, w2: f32[16, 8] {model, _}, x: f32[4, 8] {data, _},
          y: f32[4, 8] {data, _}) -> (f32[], f32[8, 16], f32[16, 8]) {
  l, g1, g2 = value_and_grad(loss, w1, w2, x, y, argnums=[0, 1])
  return l, w1 - 0.1 * g1, w2 - 0.1 * g2
}
"""


def test_xla_oracle_differentiates_with_jax():
    c = spmdlang.compile(MLP)
    src = c.xla_source
    assert "jax.value_and_grad(_grad_fn0, argnums=(0, 1))" in src
    body = src.split("def body", 1)[1].split("IN_SPECS", 1)[0]
    # none of our backward einsums: jax computes the gradients, and value_and_grad's value too
    # (the forward is not run a second time for it): the two einsums of the differentiated function
    assert body.count("jnp.einsum") == 2
    assert "    l, (" in body and "= jax.value_and_grad(" in body
    assert c.diff()["ok"]


def test_backward_ops_are_marked_and_located():
    c = spmdlang.compile(MLP)
    ops = c.program.ops
    back = [op for op in ops if op.backward]
    assert back and all(op.span is not None for op in back)
    assert {op.span.line for op in back if op.kind == "einsum"} == {3}
    # no dead cotangents: the gradients of x and y (not asked for) are not computed
    assert all(op.kind != "einsum" or op.result.type.shape in ((16, 8), (8, 16), (4, 16)) for op in back)


def test_explain_says_which_collectives_are_backward():
    c = spmdlang.compile(MLP)
    from spmdlang.explain import explain_report

    report = explain_report(c)
    passes = {x["pass"] for x in report["collectives"]}
    assert "backward" in passes or "both" in passes, report["collectives"]
    assert passes <= {"forward", "backward", "both"}


def test_shard_on_a_forward_value_constrains_its_cotangent():
    src = """mesh [data=2, model=2]
func loss(w: f32[8, 16], x: f32[4, 8]) -> f32[] {
  h = shard(x @ w, {data, model})
  return sum(tanh(h))
}
func main(w: f32[8, 16], x: f32[4, 8]) -> f32[8, 16] { return grad(loss, w, x) }
"""
    c = spmdlang.compile(src)
    shards = [op for op in c.program.ops if op.kind == "shard"]
    assert [op.backward for op in shards] == [False, True]
    assert shards[0].attrs["sharding"] == shards[1].attrs["sharding"]
    assert c.diff()["ok"]


def test_stop_gradient_blocks_and_same_value_twice_gets_partials():
    src = """mesh [p=2]
func f(a: f32[4], b: f32[4]) -> f32[] { return sum(a * b + stop_gradient(a * a)) }
func main(x: f32[4]) -> (f32[], f32[4], f32[4]) {
  l, ga, gb = value_and_grad(f, x, x, argnums=[0, 1])
  return l, ga, gb
}
"""
    c = spmdlang.compile(src)
    x = np.arange(4, dtype=np.float32)
    l, ga, gb = c.run({"x": x}, backend="ref")
    np.testing.assert_allclose(ga, x)
    np.testing.assert_allclose(gb, x)
    assert c.diff({"x": x})["ok"]


def test_grad_of_a_function_that_ignores_its_argument_is_zero():
    src = """mesh [p=2]
func f(a: f32[4], b: f32[4]) -> f32[] { return sum(b) }
func main(x: f32[4], y: f32[4]) -> f32[4] { return grad(f, x, y) }
"""
    c = spmdlang.compile(src)
    np.testing.assert_array_equal(c.run({"x": np.ones(4, np.float32), "y": np.ones(4, np.float32)},
                                        backend="ref")[0], np.zeros(4))
    assert c.diff()["ok"]


# ---------------------------------------------------------------------------------- errors


@pytest.mark.parametrize("body,message,col", [
    ("return grad(g, x)", "the first argument of grad() must be a function of this file, got 'g'", 15),
    ("return grad(sum, x)", "the first argument of grad() must be a function of this file, got 'sum'", 15),
    ("return grad(x, x)", "the first argument of grad() must be a function of this file, got a tensor", 15),
    ("return grad(two, x)", "grad() needs a function with one result, a float scalar; 'two' declares 2", 15),
    ("return grad(vec, x)", "grad() needs a function whose result is a float scalar such as f32[]; 'vec' returns "
     "f32[4]", 15),
    ("return grad(f, x, argnums=[1])", "argnums: 1 is out of range for a function of 1 argument(s)", 29),
    ("return grad(f, x, argnums=[0, 0])", "argnums: argument 0 is named twice", 29),
    ("return grad(f, x, argnums=[])", "argnums must be a non-empty list of argument indices", 29),
    ("return grad(f, x, wrt=[0])", "grad() has no argument 'wrt'", 21),
    ("return grad(h, x, i)", "grad(): argument 1 ('i') is i32[4]; only float arguments can be differentiated", 21),
    ("return grad()", "grad() needs a function and its arguments", 10),
    ("return grad(f)", "missing argument 'a' of 'f'", 10),
    ("return grad(f, x, argnums=[0], argnums=[0])", "argument 'argnums' of grad() given twice", 34),
    ("return grad(k)", "grad(): the function takes no arguments to differentiate", 15),
    ("return grad(f, x, argnums=[x])", "argnums must be a non-empty list of argument indices", 29),
    ("return grad(r, x)", "recursive call to 'r'", (7, 41)),  # at the inner call
])
def test_grad_misuse_is_a_located_error(body, message, col):
    src = (f"mesh [p=2]\nfunc f(a: f32[4]) -> f32[] {{ return sum(a) }}\n"
           f"func two(a: f32[4]) -> (f32[], f32[]) {{ return sum(a), sum(a) }}\n"
           f"func vec(a: f32[4]) -> f32[4] {{ return a }}\n"
           f"func h(a: f32[4], i: i32[4]) -> f32[] {{ return sum(a * cast(i, f32)) }}\n"
           f"func k() -> f32[] {{ return 1.0 }}\n"
           f"func r(a: f32[4]) -> f32[] {{ return sum(grad(r, a)) }}\n"
           f"func main(x: f32[4], i: i32[4]) -> f32[4] {{\n  {body}\n}}\n")
    src = src.replace("grad(h, x, i)", "grad(h, x, i, argnums=[1])")
    with pytest.raises(SpmdError) as e:
        spmdlang.compile(src)
    assert message in e.value.message
    assert (e.value.span.line, e.value.span.col) == (col if isinstance(col, tuple) else (9, col))


def test_an_op_without_a_rule_is_a_located_error(monkeypatch):
    """Grad.unsupported (an op whose derivative is not written yet) fails at the op, not later."""
    monkeypatch.setitem(registry.OPS, "conv", dataclasses.replace(registry.get("conv"), vjp=Grad.unsupported))
    src = ("mesh [p=2]\nfunc f(x: f32[1, 5, 5, 2], w: f32[3, 3, 2, 4]) -> f32[] {\n"
           "  return sum(conv(x, w))\n}\n"
           "func main(x: f32[1, 5, 5, 2], w: f32[3, 3, 2, 4]) -> f32[3, 3, 2, 4] {\n"
           "  return grad(f, x, w, argnums=[1])\n}\n")
    with pytest.raises(SpmdError) as e:
        spmdlang.compile(src)
    assert "differentiating conv is not supported yet" in e.value.message
    assert (e.value.span.line, e.value.span.col) == (3, 14)


def test_every_global_op_declares_its_gradient():
    missing = [n for n in GLOBAL if registry.get(n).vjp is None]
    assert not missing, f"give these ops a vjp rule or vjp=Grad.none / Grad.unsupported: {missing}"
    assert all(callable(registry.get(n).vjp) or registry.get(n).vjp in (Grad.none, Grad.unsupported)
               for n in GLOBAL)


def test_the_xla_baseline_of_a_grad_whose_argument_the_function_never_reads():
    """grad(loss, w, c * 2.0) where loss ignores c (dropout at rate 0 ignoring its key): our dead
    code removal drops `c * 2.0`, and the xla baseline's value_and_grad call named it (NameError).
    A `return` of a call with several results returns those results."""
    src = """mesh [x=2]
func loss(w: f32[4], c: f32[4]) -> f32[] {
  return sum(w * w)
}
func both(w: f32[4], c: f32[4]) -> (f32[], f32[4]) {
  return value_and_grad(loss, w, c * 2.0)
}
func pair(w: f32[4], c: f32[4]) -> (f32[], f32[4]) {
  return both(w, c)
}
func main(w: f32[4] {x}, c: f32[4]) -> (f32[4], f32[], f32[4]) {
  l, g = pair(w, c)
  return grad(loss, w, c * 2.0), l, g
}
"""
    c = spmdlang.compile(src)
    w = np.arange(4, dtype=np.float32)
    report = c.diff({"w": w, "c": np.ones(4, np.float32)})
    assert report["ok"], report
    got = c.run({"w": w, "c": np.ones(4, np.float32)}, backend="ref")
    assert [np.asarray(g).tolist() for g in got] == [(2 * w).tolist(), float((w * w).sum()), (2 * w).tolist()]
