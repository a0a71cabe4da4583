"""Elementwise primitives: unary math, binary arithmetic and comparisons, select, cast.

Operands share one shape, except rank-0 operands (scalars), which broadcast; the frontend makes
every other broadcast explicit with `broadcast_in_dim`, so the sharding rule is one pass factor per
dim. Low-precision floats compute in f32 and round back, as XLA does on CPU.
"""

from __future__ import annotations

import math

import numpy as np

from ..ir import types as T
from ..ir.types import TensorType
from ..partition.factors import elementwise_rule
from . import extremes
from .registry import Family, Grad, PartialMode, Takes, check, no_flops, register, set_vjp


def _same_shape(types) -> tuple[int, ...]:
    shapes = {t.shape for t in types if t.rank}
    if len(shapes) > 1:  # (the message only when it is an error: this runs for every op built)
        check(False, "operand shapes differ: " + " vs ".join(str(t) for t in types))
    return shapes.pop() if shapes else ()


def _elementwise_rule(operands, results, attrs):
    return elementwise_rule([t.shape for t in operands], results[0].shape, len(results))


# ---------------------------------------------------------------------------------- unary

_erf64 = np.frompyfunc(math.erf, 1, 1)


def _erf_inv(x):
    """XLA's f32 erf_inv polynomial (ops/random.py's, which `normal` draws with) for f32 (lower
    precisions compute in f32, as XLA does on CPU); f64 (under x64) to f64 rounding, as XLA's."""
    if np.asarray(x).dtype == np.float64:
        from scipy.special import erfinv

        return erfinv(x)
    from .random import _erf_inv32

    return _erf_inv32(np.asarray(x, np.float32))


def _erf(x):
    """numpy has no erf; math.erf per element, in f64 (jax's is accurate to f32 rounding)."""
    return np.asarray(_erf64(np.asarray(x, np.float64)), np.float64)


_FLOAT_UNARY = {
    "exp": (np.exp, "jnp.exp({0})", "e to the x"),
    "log": (np.log, "jnp.log({0})", "natural logarithm"),
    "sqrt": (np.sqrt, "jnp.sqrt({0})", "square root"),
    "rsqrt": (lambda x: 1.0 / np.sqrt(x), "jax.lax.rsqrt({0})", "1 / sqrt(x)"),
    "tanh": (np.tanh, "jnp.tanh({0})", "hyperbolic tangent"),
    "sigmoid": (lambda x: 0.5 * (np.tanh(0.5 * x) + 1.0), "jax.nn.sigmoid({0})", "logistic 1 / (1 + exp(-x))"),
    "gelu": (lambda x: 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi).astype(x.dtype)
                                               * (x + 0.044715 * x * x * x))),
             "jax.nn.gelu({0}, approximate=True)", "GELU, tanh approximation"),
    "gelu_erf": (lambda x: 0.5 * x * (1.0 + _erf(x / np.sqrt(2.0))), "jax.nn.gelu({0}, approximate=False)",
                 "GELU, exact erf form: x * (1 + erf(x / sqrt 2)) / 2"),
    "erf": (_erf, "jax.lax.erf({0})", "error function"),
    "erf_inv": (lambda x: _erf_inv(x), "jax.lax.erf_inv({0})", "inverse error function on (-1, 1) (+-inf at +-1)"),
    "log1p": (np.log1p, "jnp.log1p({0})", "log(1 + x), accurate near 0"),
    "expm1": (np.expm1, "jnp.expm1({0})", "exp(x) - 1, accurate near 0"),
    "sin": (np.sin, "jnp.sin({0})", "sine"),
    "cos": (np.cos, "jnp.cos({0})", "cosine"),
    "floor": (np.floor, "jnp.floor({0})", "round toward -inf"),
    "ceil": (np.ceil, "jnp.ceil({0})", "round toward +inf"),
    "round": (np.round, "jnp.round({0})", "round to the nearest integer, halves to even (jnp.round)"),
    # jax.nn's activations whose derivatives jax defines by custom rules (the others are
    # compositions in frontend/nn.py)
    "softplus": (lambda x: np.logaddexp(x, np.zeros((), x.dtype)), "jax.nn.softplus({0})",
                 "log(1 + exp(x)), as jax.nn.softplus (logaddexp(x, 0))"),
    "relu6": (lambda x: np.minimum(np.maximum(x, np.zeros((), x.dtype)), np.asarray(6, x.dtype)),
              "jax.nn.relu6({0})", "min(max(x, 0), 6), as jax.nn.relu6"),
}
_NUMERIC_UNARY = {
    "neg": (np.negative, "-{0}", "-x (linear: a pending sum passes through)"),
    "abs": (np.abs, "jnp.abs({0})", "absolute value"),
    "sign": (lambda x: np.where(x == 0, x, np.sign(x)), "jnp.sign({0})",  # (XLA's: a zero keeps its sign)
             "-1, 0 or 1 by the sign of x"),
    "relu": (lambda x: np.maximum(x, np.zeros((), x.dtype)), "jax.nn.relu({0})", "max(x, 0)"),
    "square": (np.square, "jnp.square({0})", "x * x"),
}


def _unary_infer(name, allowed):
    def infer(operands, attrs):
        (x,) = operands
        if T.kind(x.dtype) not in allowed:
            check(False, f"{name} needs a {' or '.join(sorted(allowed))} operand, got {x}"
                  + ("; cast it first, e.g. cast(x, f32)" if "float" in allowed else ""))
        return x

    return infer


def _unary_numpy(fn):
    def run(x):
        return np.asarray(fn(T.widen(x))).astype(x.dtype)

    return run


def _template(text):
    return lambda args, attrs, out: text.format(*args)


def _lax_local(fn, jax_emit, when=lambda dtype: True, scalars=True):
    """Our module's form of an elementwise op whose jnp form only promotes and broadcasts before
    binding one jax.lax primitive: that primitive, `fn`, where every operand has the result's shape
    or (with `scalars`: jax.lax's binary ops broadcast them as jnp does) rank 0, and `when` holds of
    the operands' dtype (equal by the op's type rule); else `jax_emit`."""
    def emit(args, attrs, out):
        types = attrs["operand_types"]
        if any(t.shape != out[0].shape and (t.rank or not scalars) for t in types) or not when(types[-1].dtype):
            return jax_emit(args, attrs, out)
        return f"jax.lax.{fn}({', '.join(args)})"

    return emit


# the elementwise ops that are one jax.lax primitive of the same name in jnp's form; unsigned ints
# excepted where jnp treats them apart (abs: x itself)
_LAX_UNARY = {"exp", "log", "sqrt", "tanh", "log1p", "expm1", "sin", "cos", "floor", "ceil", "abs", "sign", "square",
              "neg"}
_LAX_BINARY = {"add": "add", "sub": "sub", "mul": "mul", "maximum": "max", "minimum": "min"}
_LAX_LOGICAL = {"logical_and": "bitwise_and", "logical_or": "bitwise_or"}  # on bools, what jnp's bind


def _signed(dtype) -> bool:
    return dtype != "u32"


_UNARY_EXAMPLE = (("f32[4, 8]",), {})

# FLOPs per element where XLA's cost_analysis() counts other than one (the op table's default), on
# the module the jax backends emit (measured per op, jax 0.10.2): a transcendental counts none (XLA
# reports it apart, as "transcendentals"); an op jax expands counts the ops it becomes (sigmoid:
# negate, add, divide; gelu's tanh form: 8; the erf form's polynomial: 64); integer floor division
# and remainder with their sign fix-ups; a cast is one convert (or select)
PER_ELEMENT_FLOPS = {"exp": 0, "log": 0, "atan2": 0, "sqrt": 0, "rsqrt": 0, "tanh": 0, "erf": 0, "log1p": 0, "expm1": 0,
                     "sin": 0, "cos": 0, "sigmoid": 3, "gelu": 8, "gelu_erf": 64, "softplus": 6,
                     "floordiv": 13, "mod": 8, "cast": 1}


def _per_element(name):
    n = PER_ELEMENT_FLOPS.get(name)
    return None if n is None else (lambda operands, results, attrs: n * results[0].size)

# gelu is the builtin gelu(x, approximate=true), gelu_erf its approximate=false: no builtin of their own
_NOT_BUILTINS = {"gelu", "gelu_erf"}

for _name, (_fn, _jax, _doc) in _FLOAT_UNARY.items():
    register(_name, doc=_doc, infer=_unary_infer(_name, {"float"}), numpy=_unary_numpy(_fn), flops=_per_element(_name),
             rule=_elementwise_rule, jax=_template(_jax),
             jax_local=_lax_local(_name, _template(_jax)) if _name in _LAX_UNARY else None,
             family=Family.elementwise, example=_UNARY_EXAMPLE, builtin=None if _name in _NOT_BUILTINS else Takes.float)
for _name, (_fn, _jax, _doc) in _NUMERIC_UNARY.items():
    register(_name, doc=_doc, infer=_unary_infer(_name, {"float", "int"}), numpy=_unary_numpy(_fn),
             rule=_elementwise_rule, jax=_template(_jax),
             jax_local=_lax_local(_name, _template(_jax), _signed) if _name in _LAX_UNARY else None,
             family=Family.elementwise, example=_UNARY_EXAMPLE,
             partial=PartialMode.additive if _name == "neg" else None, builtin=Takes.numeric)
register("logical_not", doc="boolean not", infer=_unary_infer("logical_not", {"bool"}), numpy=np.logical_not,
         rule=_elementwise_rule, jax=_template("jnp.logical_not({0})"), family=Family.elementwise,
         example=(("bool[4, 8]",), {}), builtin=Takes.bool)


def _cast_infer(operands, attrs):
    (x,) = operands
    return x.with_dtype(attrs["dtype"])


def _cast_numpy(x, *, dtype):
    target = T.np_dtype(dtype)
    if target.kind in "iu" and T.np_is_float(x.dtype):
        # float -> int truncates toward zero; NaN/inf (e.g. poisoned padding) must not warn
        with np.errstate(invalid="ignore"):
            return np.trunc(np.nan_to_num(x.astype(np.float64), nan=0)).clip(
                np.iinfo(target).min, np.iinfo(target).max).astype(target)
    return x.astype(target)


def _cast_jax(args, attrs, out):
    """x.astype(dtype); a bool to a float as a select of 1 and 0: XLA rewrites a multiply by a
    converted bool into a select, so cast(b, f32) * NaN would be 0 where b is false, not NaN
    (numpy's and IEEE's answer); a select is not rewritten so."""
    x, dt = args[0], T.jnp_dtype(attrs["dtype"])
    if not T.is_float(attrs["dtype"]):
        return f"{x}.astype({dt})"
    return f"(jnp.where({x}, jnp.ones((), {dt}), jnp.zeros((), {dt})) if {x}.dtype == jnp.bool_ else {x}.astype({dt}))"


def _cast_jax_local(args, attrs, out):
    """Our module knows x's dtype when it emits: only the branch _cast_jax picks while tracing, and
    its select as jax.lax.select of two filled arrays (jnp.where traces as a nested jit, which jax
    lowers as a function of its own)."""
    x, dt = args[0], T.jnp_dtype(attrs["dtype"])
    if T.is_float(attrs["dtype"]) and attrs["operand_types"][0].dtype == "bool":
        shape = tuple(out[0].shape)
        return f"jax.lax.select({x}, jax.lax.full({shape!r}, 1, {dt}), jax.lax.full({shape!r}, 0, {dt}))"
    return f"{x}.astype({dt})"


register("cast", doc="convert to `dtype` (floats to ints truncate toward zero, saturating)",
         flops=_per_element("cast"), infer=_cast_infer, numpy=_cast_numpy, rule=_elementwise_rule,
         jax=_cast_jax, jax_local=_cast_jax_local,
         family=Family.elementwise, example=(("f32[4, 8]",), {"dtype": "i32"}))


def _bitcast_infer(operands, attrs):
    (x,) = operands
    dt = attrs["dtype"]
    check(T.itemsize(x.dtype) == T.itemsize(dt) and "bool" not in (x.dtype, dt),
          f"bitcast_convert_type: {x.dtype} and {dt} are not of one width; cast converts values", blame="dtype")
    return x.with_dtype(dt)


register("bitcast_convert_type", doc="the bits of x read as `dtype`, of the same width (jax.lax.bitcast_convert_type)",
         flops=no_flops, infer=_bitcast_infer,
         numpy=lambda x, *, dtype: np.asarray(x).copy(order="C").view(T.np_dtype(dtype)),
         rule=_elementwise_rule, vjp=Grad.none, family=Family.elementwise,
         jax=lambda a, attrs, out: f"jax.lax.bitcast_convert_type({a[0]}, {T.jnp_dtype(attrs['dtype'])})",
         example=(("f32[4, 8]",), {"dtype": "u32"}))


# ---------------------------------------------------------------------------------- binary


def _int_pow(a, b):
    """Integer powers; a negative exponent truncates 1 / a**|b| toward zero, as C does (numpy
    raises): 1 for a base of 1, +-1 for -1, 0 otherwise."""
    neg = np.where(a == 1, 1, np.where(a == -1, np.where(b % 2 == 0, 1, -1), 0))
    return np.where(b < 0, neg, np.power(a, np.maximum(b, 0)))


_ARITH = {
    "add": (np.add, "({0} + {1})", PartialMode.additive, "a + b"),
    "sub": (np.subtract, "({0} - {1})", PartialMode.additive, "a - b"),
    "mul": (np.multiply, "({0} * {1})", PartialMode.multilinear, "a * b"),
    "div": (np.divide, "({0} / {1})", PartialMode.multilinear, "a / b; ints floor-divide, and x / 0 is 0"),
    "maximum": (extremes.maximum, "jnp.maximum({0}, {1})", None, "the larger of a and b (+0.0 above -0.0)"),
    "minimum": (extremes.minimum, "jnp.minimum({0}, {1})", None, "the smaller of a and b (-0.0 below +0.0)"),
    "pow": (np.power, "jnp.power({0}, {1})", None, "a ** b; int powers with b < 0 truncate toward zero"),
    "floordiv": (np.floor_divide, "jnp.floor_divide({0}, {1})", None,
                 "a // b, floor division as numpy (ints: x // 0 is 0)"),
    "mod": (np.mod, "jnp.remainder({0}, {1})", None, "a % b with the sign of b, as numpy (ints: x % 0 is 0)"),
}
# comparisons: name -> (numpy, jax, doc), jax and doc written with the operator's symbol
_COMPARE = {name: (fn, f"({{0}} {sym} {{1}})", f"a {sym} b") for name, fn, sym in (
    ("lt", np.less, "<"), ("le", np.less_equal, "<="), ("gt", np.greater, ">"),
    ("ge", np.greater_equal, ">="), ("eq", np.equal, "=="), ("ne", np.not_equal, "!="))}
_LOGICAL = {
    "logical_and": (np.logical_and, "jnp.logical_and({0}, {1})", "boolean and"),
    "logical_or": (np.logical_or, "jnp.logical_or({0}, {1})", "boolean or"),
}


def _binary_infer(name, allowed, result_dtype=None):
    def infer(operands, attrs):
        a, b = operands
        if a.dtype != b.dtype:
            check(False, f"{name}: operand dtypes differ: {a} vs {b}")
        if T.kind(a.dtype) not in allowed:
            check(False, f"{name} needs {' or '.join(sorted(allowed))} operands, got {a}")
        return TensorType(result_dtype or a.dtype, _same_shape(operands))

    return infer


def _arith_numpy(name, fn):
    def run(a, b):
        if name == "div" and a.dtype.kind in "iu":
            out = np.floor_divide(a, np.where(b == 0, 1, b))
            return np.where(b == 0, 0, out).astype(a.dtype)
        if name == "pow" and a.dtype.kind in "iu":
            return _int_pow(a, b).astype(a.dtype)
        if name in ("floordiv", "mod") and a.dtype.kind in "iu":
            return np.where(b == 0, 0, fn(a, np.where(b == 0, 1, b))).astype(a.dtype)
        with np.errstate(divide="ignore", invalid="ignore"):
            out = np.asarray(fn(T.widen(a), T.widen(b)))
        if name == "pow":  # numpy takes -0.0 ** 0.5 as sqrt's -0.0; C's and XLA's pow give +0.0 (y not odd)
            wb = T.widen(b)
            odd = (np.mod(wb, 2) == 1) & (np.floor(wb) == wb)
            out = np.where((out == 0) & (wb > 0) & ~odd, np.abs(out), out)
        return out.astype(a.dtype)

    return run


def _arith_jax(name, text):
    def emit(args, attrs, out):
        if T.is_int(out[0].dtype) and name == "div":
            return f"jnp.where({args[1]} == 0, 0, {args[0]} // jnp.where({args[1]} == 0, 1, {args[1]}))"
        if T.is_int(out[0].dtype) and name in ("floordiv", "mod"):
            a, b = args
            return f"jnp.where({b} == 0, 0, {text.format(a, f'jnp.where({b} == 0, 1, {b})')})"
        if T.is_int(out[0].dtype) and name == "pow":
            a, b = args
            neg = f"jnp.where({a} == 1, 1, jnp.where({a} == -1, jnp.where({b} % 2 == 0, 1, -1), 0))"
            return (f"jnp.where({b} < 0, {neg}, jnp.power({a}, jnp.maximum({b}, 0)))"
                    f".astype({T.jnp_dtype(out[0].dtype)})")
        return text.format(*args)

    return emit


_BINARY_EXAMPLE = (("f32[4, 8]", "f32[4, 8]"), {})

# the arithmetic the language writes as operators (a + b, a // b) is no builtin of its own name
_ARITH_BUILTINS = {"maximum", "minimum", "pow"}

for _name, (_fn, _jax, _partial, _doc) in _ARITH.items():
    register(_name, doc=_doc, infer=_binary_infer(_name, {"float", "int"}), numpy=_arith_numpy(_name, _fn),
             flops=_per_element(_name), rule=_elementwise_rule, jax=_arith_jax(_name, _jax),
             jax_local=(_lax_local(_LAX_BINARY[_name], _arith_jax(_name, _jax)) if _name in _LAX_BINARY else
                        _lax_local("div", _arith_jax(_name, _jax), T.is_float) if _name == "div" else None),
             family=Family.elementwise,
             partial=_partial, partial_operands=(0,) if _name == "div" else None, example=_BINARY_EXAMPLE,
             builtin=Takes.numeric if _name in _ARITH_BUILTINS else None)
register("atan2", doc="the angle of the point (b, a) in (-pi, pi]: atan(a / b) in b's half-plane (jax.lax.atan2)",
         infer=_binary_infer("atan2", {"float"}), numpy=lambda a, b: np.arctan2(T.widen(a), T.widen(b)).astype(a.dtype),
         flops=_per_element("atan2"), rule=_elementwise_rule, jax=_template("jax.lax.atan2({0}, {1})"),
         family=Family.elementwise, example=_BINARY_EXAMPLE, builtin=Takes.float)
for _name, (_fn, _jax, _doc) in _COMPARE.items():
    register(_name, doc=_doc, infer=_binary_infer(_name, {"float", "int", "bool"}, "bool"), numpy=_fn,
             rule=_elementwise_rule, jax=_template(_jax), jax_local=_lax_local(_name, _template(_jax)),
             family=Family.elementwise, example=_BINARY_EXAMPLE)
for _name, (_fn, _jax, _doc) in _LOGICAL.items():
    register(_name, doc=_doc, infer=_binary_infer(_name, {"bool"}), numpy=_fn, rule=_elementwise_rule,
             jax=_template(_jax), jax_local=_lax_local(_LAX_LOGICAL[_name], _template(_jax)),
             family=Family.elementwise, example=(("bool[4, 8]", "bool[4, 8]"), {}), builtin=Takes.bool)


def _select_infer(operands, attrs):
    c, a, b = operands
    if c.dtype != "bool":
        check(False, f"where: the condition must be bool, got {c}", blame=0)
    if a.dtype != b.dtype:
        check(False, f"where: branch dtypes differ: {a} vs {b}")
    return TensorType(a.dtype, _same_shape(operands))


def _select_jax_local(args, attrs, out):
    """jax.lax.select, rank-0 branches broadcast first (a rank-0 condition selects whole branches):
    what jnp.where traces to for branches of one dtype."""
    shape = tuple(out[0].shape)
    ops = [a if i == 0 or t.shape == shape else f"jax.lax.broadcast_in_dim({a}, {shape}, ())"
           for i, (a, t) in enumerate(zip(args, attrs["operand_types"]))]
    return f"jax.lax.select({', '.join(ops)})"


register("select", doc="where(cond, a, b): a where cond holds, else b",
         infer=_select_infer, numpy=lambda c, a, b: np.where(c, a, b).astype(a.dtype),
         rule=_elementwise_rule, jax=_template("jnp.where({0}, {1}, {2})"),
         jax_local=_select_jax_local, family=Family.elementwise,
         example=(("bool[4, 8]", "f32[4, 8]", "f32[4, 8]"), {}))


# ---------------------------------------------------------------------------------- derivatives
# Each rule gets (d: ir.autodiff.Differentiator, op, ct) and returns one cotangent per operand, as
# jax's own rules (jax/_src/lax/lax.py) define them; rank-0 operands that broadcast get summed.


def _unary_vjp(local):
    """A unary derivative from ct, the operand x and the result y: (d, ct, x, y) -> ct_x."""
    def vjp(d, op, ct):
        return (local(d, ct, op.operands[0], op.result),)

    return vjp


def _sqrt2pi_exp(d, x):
    """exp(-x^2 / 2) / sqrt(2 pi), the standard normal density."""
    e = d.emit("exp", d.mul(d.mul(x, x), d.like(-0.5, x)))
    return d.mul(e, d.like(1.0 / math.sqrt(2.0 * math.pi), x))


def _gelu_tanh(d, ct, x, y):
    c, k = math.sqrt(2.0 / math.pi), 0.044715
    x2 = d.mul(x, x)
    u = d.mul(d.like(c, x), d.emit("add", x, d.mul(d.like(k, x), d.mul(x2, x))))
    t = d.emit("tanh", u)
    du = d.mul(d.like(c, x), d.emit("add", d.like(1.0, x), d.mul(d.like(3 * k, x), x2)))
    dt = d.emit("sub", d.like(1.0, x), d.mul(t, t))
    grad = d.emit("add", d.mul(d.like(0.5, x), d.emit("add", d.like(1.0, x), t)),
                  d.mul(d.mul(d.like(0.5, x), x), d.mul(dt, du)))
    return d.mul(ct, grad)


def _gelu_erf(d, ct, x, y):
    cdf = d.mul(d.like(0.5, x), d.emit("add", d.like(1.0, x),
                                       d.emit("erf", d.mul(x, d.like(1.0 / math.sqrt(2.0), x)))))
    return d.mul(ct, d.emit("add", cdf, d.mul(x, _sqrt2pi_exp(d, x))))


def _softplus(d, ct, x, y):
    """jax's logaddexp rule (softplus is logaddexp(x, 0)): ct * exp(x - y), +inf replaced by 0."""
    def finite(v):
        return d.select(d.emit("eq", v, d.like(math.inf, v)), d.zeros(v.type), v)

    return d.mul(ct, d.emit("exp", d.emit("sub", finite(x), finite(y))))


_UNARY_VJP = {
    "exp": lambda d, ct, x, y: d.mul(ct, y),
    "log": lambda d, ct, x, y: d.emit("div", ct, x),
    "sqrt": lambda d, ct, x, y: d.mul(ct, d.emit("div", d.like(0.5, x), y)),
    "rsqrt": lambda d, ct, x, y: d.mul(ct, d.mul(d.like(-0.5, x), d.emit("div", y, x))),
    "tanh": lambda d, ct, x, y: d.mul(ct, d.emit("sub", d.like(1.0, y), d.mul(y, y))),
    "sigmoid": lambda d, ct, x, y: d.mul(ct, d.mul(y, d.emit("sub", d.like(1.0, y), y))),
    "gelu": _gelu_tanh,
    "gelu_erf": _gelu_erf,
    "erf": lambda d, ct, x, y: d.mul(ct, d.mul(d.like(2.0 / math.sqrt(math.pi), x),
                                               d.emit("exp", d.neg(d.mul(x, x))))),
    # jax: g * sqrt(pi) / 2 * exp(ans ** 2)
    "erf_inv": lambda d, ct, x, y: d.mul(ct, d.mul(d.like(math.sqrt(math.pi) / 2.0, y), d.emit("exp", d.mul(y, y)))),
    "log1p": lambda d, ct, x, y: d.emit("div", ct, d.emit("add", x, d.like(1.0, x))),
    "expm1": lambda d, ct, x, y: d.mul(ct, d.emit("add", y, d.like(1.0, y))),
    "sin": lambda d, ct, x, y: d.mul(ct, d.emit("cos", x)),
    "cos": lambda d, ct, x, y: d.neg(d.mul(ct, d.emit("sin", x))),
    "neg": lambda d, ct, x, y: d.neg(ct),
    # jax: select(x >= 0, g, -g); relu (a custom_jvp): select(x > 0, g, 0)
    "abs": lambda d, ct, x, y: d.select(d.emit("ge", x, d.like(0.0, x)), ct, d.neg(ct)),
    "relu": lambda d, ct, x, y: d.select(d.emit("gt", x, d.like(0.0, x)), ct, d.zeros(ct.type)),
    "softplus": _softplus,
    # jax.nn.relu6's custom_jvp: select((x > 0) & (x < 6), g, 0)
    "relu6": lambda d, ct, x, y: d.select(d.emit("logical_and", d.emit("gt", x, d.like(0.0, x)),
                                                 d.emit("lt", x, d.like(6.0, x))), ct, d.zeros(ct.type)),
    "square": lambda d, ct, x, y: d.mul(ct, d.mul(d.like(2.0, x), x)),
}
for _name in ("floor", "ceil", "round", "sign", "logical_not"):
    set_vjp(_name, Grad.none)
for _name, _rule in _UNARY_VJP.items():
    set_vjp(_name, _unary_vjp(_rule))


def _cast_vjp(d, op, ct):
    (x,) = op.operands
    return (d.emit("cast", ct, dtype=x.type.dtype) if T.is_float(x.type.dtype) else None,)


def _balanced(d, x, ans, y):
    """jax's tie rule for max/min: 1 where x attains the result alone, 1/2 where both do, else 0."""
    one, half, zero = d.like(1.0, x), d.like(0.5, x), d.like(0.0, x)
    both = d.select(d.emit("eq", y, ans), d.broadcast(half, ans.type.shape), d.broadcast(one, ans.type.shape))
    return d.select(d.emit("eq", x, ans), both, d.broadcast(zero, ans.type.shape))


def _full_shape(d, v, shape):
    return d.broadcast(v, shape) if v.type.shape != tuple(shape) else v


def _binary_vjp(name):
    def vjp(d, op, ct):
        a, b = op.operands
        y = op.result
        shape = y.type.shape
        if name == "add":
            ca, cb = ct, ct
        elif name == "sub":
            ca, cb = ct, d.neg(ct)
        elif name == "mul":
            ca, cb = d.mul(ct, b), d.mul(ct, a)
        elif name == "div":
            ca = d.emit("div", ct, b)
            cb = d.mul(d.mul(d.neg(ct), a), d.emit("div", d.like(1.0, b), d.mul(b, b)))
        elif name in ("maximum", "minimum"):
            fa, fb = _full_shape(d, a, shape), _full_shape(d, b, shape)
            ca, cb = d.mul(ct, _balanced(d, fa, y, fb)), d.mul(ct, _balanced(d, fb, y, fa))
        elif name == "pow":
            ca = d.mul(ct, d.mul(b, d.emit("pow", a, d.emit("sub", b, d.like(1.0, b)))))
            safe = d.select(d.emit("eq", a, d.like(0.0, a)), _full_shape(d, d.like(1.0, a), a.type.shape), a)
            cb = d.mul(ct, d.mul(d.emit("log", safe), y))
        elif name == "atan2":  # d/da = b / (a^2 + b^2), d/db = -a / (a^2 + b^2), as jax's
            r = d.emit("add", d.mul(a, a), d.mul(b, b))
            ca, cb = d.mul(ct, d.emit("div", b, r)), d.mul(ct, d.emit("div", d.neg(a), r))
        elif name == "mod":  # jnp.remainder(a, b) = a - floor(a / b) * b
            ca = ct
            cb = d.neg(d.mul(ct, d.emit("floor", d.emit("div", a, b))))
        else:
            raise AssertionError(name)
        return d.unbroadcast(ca, a), d.unbroadcast(cb, b)

    return vjp


for _name in (*_ARITH, "atan2"):
    set_vjp(_name, Grad.none if _name == "floordiv" else _binary_vjp(_name))
for _name in (*_COMPARE, *_LOGICAL):
    set_vjp(_name, Grad.none)
set_vjp("cast", _cast_vjp)


def _select_vjp(d, op, ct):
    c, a, b = op.operands
    z = d.zeros(ct.type)
    cc = c if c.type.shape == ct.type.shape else d.broadcast(c, ct.type.shape)
    return None, d.unbroadcast(d.select(cc, ct, z), a), d.unbroadcast(d.select(cc, z, ct), b)


set_vjp("select", _select_vjp)

register("stop_gradient", doc="x, with no gradient flowing back through it", infer=lambda ops, attrs: ops[0],
         numpy=lambda x: x.copy(), rule=_elementwise_rule, jax=_template("jax.lax.stop_gradient({0})"),
         family=Family.elementwise, partial=PartialMode.additive, flops=no_flops, vjp=Grad.none,
         example=_UNARY_EXAMPLE)
