"""jax.nn's activations as builtins, each written as jax.nn writes it (jax/_src/nn/functions.py),
with the ops jax's definition uses, so that differentiating those ops gives jax's derivative:
log_softmax's shift by a stop_gradient max, elu's inner where, standardize's mean(x^2) - mean(x)^2
clipped at 0. sigmoid, softplus and relu6 are ops of the table (ops/elementwise.py): jax gives
softplus and relu6 custom derivatives that no composition reproduces at 0 and at 6.

Ints compute in floats as jax.nn's do (hard_tanh, written with weak integer bounds, keeps them).
"""

from __future__ import annotations

from ..errors import SpmdError
from ..ir import types as T
from ..ir.core import Value
from .builtins import BUILTINS, Args, _expand_back, builtin, mean_over, norm_axes, norm_axis, tensor
from .values import float_for

# jax.nn.selu's constants
SELU_ALPHA = 1.6732632423543772848170429916717
SELU_SCALE = 1.0507009873554804934193349852946


def _float(ctx, args, span) -> Value:
    x = tensor(ctx, args, "x", "f32")
    return x if T.is_float(x.type.dtype) else ctx.cast(x, float_for(x.type.dtype), span)


def _where(ctx, span, args, cond, a, b):
    """jnp.where(cond, a, b), through the where builtin (its broadcasting and weak scalars)."""
    return BUILTINS["where"].lower(ctx, span, Args({"cond": cond, "a": a, "b": b}, {}, args.call))


def _op(ctx, span, kind, *operands):
    return ctx.binary(kind, *operands, span) if len(operands) == 2 else ctx.b.emit(kind, *operands, span=span)


@builtin("silu", "x:tensor", doc="x * sigmoid(x), as jax.nn.silu")
@builtin("swish", "x:tensor", doc="x * sigmoid(x), as jax.nn.swish (= silu)")
def _silu(ctx, span, args):
    x = _float(ctx, args, span)
    return _op(ctx, span, "mul", x, _op(ctx, span, "sigmoid", x))


@builtin("log_sigmoid", "x:tensor", doc="-softplus(-x), as jax.nn.log_sigmoid")
def _log_sigmoid(ctx, span, args):
    x = _float(ctx, args, span)
    return _op(ctx, span, "neg", _op(ctx, span, "softplus", _op(ctx, span, "neg", x)))


@builtin("hard_tanh", "x:tensor", doc="where(x > 1, 1, where(x < -1, -1, x)), as jax.nn.hard_tanh")
def _hard_tanh(ctx, span, args):
    x = tensor(ctx, args, "x", "f32")
    if x.type.dtype == "bool":
        raise SpmdError(f"hard_tanh needs a numeric tensor, got {x.type}", args.span("x"))
    inner = _where(ctx, span, args, _op(ctx, span, "lt", x, -1), -1, x)
    return _where(ctx, span, args, _op(ctx, span, "gt", x, 1), 1, inner)


@builtin("leaky_relu", "x:tensor", "negative_slope:tensor=0.01",
         doc="where(x >= 0, x, negative_slope * x), as jax.nn.leaky_relu")
def _leaky_relu(ctx, span, args):
    x = _float(ctx, args, span)
    slope = ctx.binary("mul", args["negative_slope"], x, span, args.span("negative_slope"), args.span("x"))
    return _where(ctx, span, args, _op(ctx, span, "ge", x, 0.0), x, slope)


def _elu(ctx, span, args, x, alpha):
    """jax.nn.elu: where(x > 0, x, alpha * expm1(where(x > 0, 0, x))); the inner where keeps exp
    of large positive x out of the gradient."""
    pos = _op(ctx, span, "gt", x, 0.0)
    neg = _op(ctx, span, "expm1", _where(ctx, span, args, pos, 0.0, x))
    return _where(ctx, span, args, pos, x, ctx.binary("mul", alpha, neg, span, args.span("alpha"), span))


@builtin("elu", "x:tensor", "alpha:tensor=1.0", doc="x if x > 0 else alpha * (exp(x) - 1), as jax.nn.elu")
def _elu_builtin(ctx, span, args):
    return _elu(ctx, span, args, _float(ctx, args, span), args["alpha"])


@builtin("selu", "x:tensor", doc="scale * elu(x, alpha) with jax.nn.selu's constants")
def _selu(ctx, span, args):
    return ctx.binary("mul", SELU_SCALE, _elu(ctx, span, args, _float(ctx, args, span), SELU_ALPHA), span)


@builtin("celu", "x:tensor", "alpha:tensor=1.0",
         doc="max(x, 0) + alpha * expm1(min(x, 0) / alpha), as jax.nn.celu")
def _celu(ctx, span, args):
    x, alpha = _float(ctx, args, span), args["alpha"]
    inner = ctx.binary("div", _op(ctx, span, "minimum", x, 0.0), alpha, span, span, args.span("alpha"))
    scaled = ctx.binary("mul", alpha, _op(ctx, span, "expm1", inner), span, args.span("alpha"), span)
    return _op(ctx, span, "add", _op(ctx, span, "maximum", x, 0.0), scaled)


@builtin("glu", "x:tensor", "axis:int=-1", doc="a * sigmoid(b) of x's halves a, b along axis, as jax.nn.glu")
def _glu(ctx, span, args):
    x = _float(ctx, args, span)
    if x.type.rank == 0:
        raise SpmdError(f"glu needs a tensor of rank >= 1, got {x.type}", args.span("x"))
    axis = norm_axis(args["axis"], x.type.rank, args.span("axis"))
    n = x.type.shape[axis]
    if n % 2:
        raise SpmdError(f"glu splits axis {axis} in halves; its size {n} is odd ({x.type})", args.span("x"))

    def half(lo):
        starts = tuple(lo if d == axis else 0 for d in range(x.type.rank))
        stops = tuple(lo + n // 2 if d == axis else m for d, m in enumerate(x.type.shape))
        return ctx.b.emit("slice", x, span=span, starts=starts, stops=stops, steps=(1,) * x.type.rank)

    return _op(ctx, span, "mul", half(0), _op(ctx, span, "sigmoid", half(n // 2)))


@builtin("log_softmax", "x:tensor", "axis:axes=-1",
         doc="x - max - log(sum(exp(x - max))), the max under stop_gradient, as jax.nn.log_softmax")
def _log_softmax(ctx, span, args):
    x = _float(ctx, args, span)
    axes = norm_axes(args["axis"], x.type.rank, args.span("axis"))
    m = ctx.b.emit("stop_gradient", ctx.b.emit("reduce_max", x, span=span, axes=axes, shift=True), span=span)
    shifted = _op(ctx, span, "sub", x, _expand_back(ctx, m, x.type.shape, axes, span))
    total = ctx.b.emit("reduce_sum", _op(ctx, span, "exp", shifted), span=span, axes=axes)
    return _op(ctx, span, "sub", shifted, _expand_back(ctx, _op(ctx, span, "log", total), x.type.shape, axes, span))


def _mean(ctx, span, x, axes):
    """jnp.mean(x, axes, keepdims=True)."""
    return _expand_back(ctx, mean_over(ctx, x, axes, span), x.type.shape, axes, span)


@builtin("standardize", "x:tensor", "axis:axes=-1", "epsilon:tensor=1e-5",
         doc="(x - mean) * rsqrt(max(mean(x^2) - mean^2, 0) + epsilon), as jax.nn.standardize")
def _standardize(ctx, span, args):
    x = _float(ctx, args, span)
    axes = norm_axes(args["axis"], x.type.rank, args.span("axis"))
    mean = _mean(ctx, span, x, axes)
    var = _op(ctx, span, "sub", _mean(ctx, span, _op(ctx, span, "square", x), axes), _op(ctx, span, "square", mean))
    var = _op(ctx, span, "maximum", 0.0, var)  # jnp.clip(var, 0): the fast formula can go negative
    eps = ctx.binary("add", var, args["epsilon"], span, span, args.span("epsilon"))
    return _op(ctx, span, "mul", _op(ctx, span, "sub", x, mean), _op(ctx, span, "rsqrt", eps))
