"""The builtins of the language: signatures, argument checking, and lowering to primitives.

This is the one place where composites (mean, softmax, logsumexp, one_hot, ...) are expanded into
op-table primitives; everything downstream sees primitives only. A lowering gets the `Lowerer` as
`ctx` (lower.py imports this module; this module never imports lower.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from .. import ops as _ops  # noqa: F401  (registers the op table the elementwise builtins are read from)
from ..errors import ShapeError, Span, SpmdError
from ..ir import registry
from ..ir import types as T
from ..ir.core import Value
from ..ir.registry import Named, Takes
from ..ir.types import TensorType
from ..ops.contract import conv_attrs, conv_output_size, parse_einsum
from . import ast as A
from .values import (
    WEAK,
    Dtype,
    StaticType,
    StructValue,
    describe,
    did_you_mean,
    float_for,
    is_weak,
    loop_index_note,
    scalar_value,
)

_REQUIRED = object()


class Kind(Named):
    """What a builtin parameter takes; declared as the text after the colon ("x:tensor")."""

    tensor = "tensor"  # a tensor or a static scalar (the lowering makes it a constant where needed)
    tensors = "tensors"  # a non-empty list of tensors, [a, b]
    rest = "tensors*"  # the last parameter: every remaining positional argument, each a tensor
    any = "any"  # any value; the lowering checks it
    spec = "spec"  # a sharding spec written in place, {data, _}
    int = "int"  # a static integer
    number = "number"  # a static int, float or bool
    axes = "axes"  # a static integer, a list of them, or None
    ints = "ints"  # a list of static integers
    bool = "bool"
    dtype = "dtype"  # a dtype name: the lowering gets the name
    type = "type"  # a tensor type such as f32[4, 8]: the lowering gets the TensorType
    str = "str"


@dataclass(frozen=True)
class Builtin:
    name: str
    params: tuple[tuple[str, Kind, Any], ...]  # (name, kind, default)
    lower: Callable
    doc: str = ""
    pick: Callable | None = None  # (ctx, call, env) -> the Builtin of this call, where a name has two signatures


BUILTINS: dict[str, Builtin] = {}


def builtin(name: str, *params: str, doc: str = ""):
    """Declare a builtin. Params are "name:kind" or "name:kind=default" (default as text)."""
    parsed = []
    for p in params:
        head, has_default, default = p.partition("=")
        pname, _, kind = head.partition(":")
        parsed.append((pname, Kind(kind), _parse_default(default) if has_default else _REQUIRED))

    def register(fn):
        BUILTINS[name] = Builtin(name, tuple(parsed), fn, doc)
        return fn

    return register


def _parse_default(text: str):
    if text in ("None", "true", "false"):
        return {"None": None, "true": True, "false": False}[text]
    for number in (int, float):
        try:
            return number(text)
        except ValueError:
            pass
    return text


# ---------------------------------------------------------------------------------- argument binding


@dataclass
class Args:
    """Bound arguments: values by parameter name and the span of each."""

    values: dict[str, Any]
    spans: dict[str, Span]
    call: A.Call

    def __getitem__(self, k):
        return self.values[k]

    def span(self, k) -> Span:
        return self.spans.get(k, self.call.span)


def call_builtin(ctx, b: Builtin, node: A.Call, env, on_struct=None) -> Any:
    """Bind the call's arguments and lower it; with a struct argument, `on_struct` lowers it instead."""
    if b.pick is not None:
        b = b.pick(ctx, node, env)
    names = [p[0] for p in b.params]
    variadic = b.params and b.params[-1][1] == Kind.rest
    values: dict[str, Any] = {}
    spans: dict[str, Span] = {}
    if not variadic and len(node.args) > len(names):
        raise SpmdError(f"{b.name}() takes at most {len(names)} argument(s) ({', '.join(names)}), "
                        f"got {len(node.args)}", node.args[len(names)].span)
    for i, a in enumerate(node.args):
        if variadic and i >= len(names) - 1:
            values.setdefault(names[-1], []).append(_eval_arg(ctx, b, Kind.tensor, a, env, names[-1]))
            spans.setdefault(names[-1], a.span)
            continue
        pname, kind, _ = b.params[i]
        values[pname] = _eval_arg(ctx, b, kind, a, env, pname)
        spans[pname] = a.span
    for kw in node.kwargs:
        if kw.name not in names:
            raise SpmdError(f"{b.name}() has no argument '{kw.name}'" + did_you_mean(kw.name, names), kw.span)
        if kw.name in values:
            raise SpmdError(f"argument '{kw.name}' of {b.name}() given twice", kw.span)
        kind = dict((p[0], p[1]) for p in b.params)[kw.name]
        values[kw.name] = _eval_arg(ctx, b, kind, kw.value, env, kw.name)
        spans[kw.name] = kw.value.span
    for pname, kind, default in b.params:
        if pname not in values:
            if kind == Kind.rest:
                raise SpmdError(f"{b.name}() needs at least one tensor argument", node.span)
            if default is _REQUIRED:
                raise SpmdError(f"{b.name}() is missing argument '{pname}'", node.span)
            values[pname] = default
    if on_struct is not None and any(isinstance(v, StructValue) for v in values.values()):
        return on_struct(ctx, b, node, values, spans)  # leafwise (frontend/structs.py)
    return b.lower(ctx, node.span, Args(values, spans, node))


def _static_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass(frozen=True)
class _Check:
    """An argument of one kind: what it accepts, what it must be (said with `{got}` for what it
    was), and what the lowering gets of it."""

    accepts: Callable[[Any], bool]
    must_be: str
    convert: Callable[[Any], Any] = lambda v: v


_CHECKS = {
    Kind.tensor: _Check(lambda v: isinstance(v, (Value, int, float, bool, StructValue)), "a tensor, got {got}"),
    Kind.tensors: _Check(lambda v: isinstance(v, list) and bool(v) and all(isinstance(x, Value) for x in v),
                         "a non-empty list of tensors, e.g. [a, b]"),
    Kind.int: _Check(_static_int, "a static integer, got {got}"),
    Kind.number: _Check(lambda v: isinstance(v, (int, float, bool)), "a number, got {got}"),
    Kind.axes: _Check(lambda v: v is None or all(_static_int(x) for x in (v if isinstance(v, list) else [v])),
                      "an integer or a list of integers, got {got}"),
    Kind.ints: _Check(lambda v: isinstance(v, list) and all(_static_int(x) for x in v),
                      "a list of integers, e.g. [4, 8], got {got}"),
    Kind.bool: _Check(lambda v: isinstance(v, bool), "true or false, got {got}"),
    Kind.dtype: _Check(lambda v: isinstance(v, Dtype), f"a dtype ({', '.join(T.DTYPES)}), got {{got}}",
                       lambda v: v.name),
    Kind.type: _Check(lambda v: isinstance(v, StaticType), "a type such as f32[4, 8], got {got}", lambda v: v.type),
    Kind.str: _Check(lambda v: isinstance(v, str), "a string, got {got}"),
}


def _eval_arg(ctx, b: Builtin, kind: Kind, node, env, pname):
    where = f"argument '{pname}' of {b.name}()"
    if kind == Kind.spec:
        if not isinstance(node, A.SpecExpr):
            raise SpmdError(f"{where} must be a sharding spec such as {{data, _}}", node.span)
        return node
    if isinstance(node, A.Name) and node.id == "None" and _takes_none(b, pname, kind):
        return None  # `axis=None`, `stride=None`: the argument's "all" / "same as its default"
    v = ctx.expr(node, env)
    check = _CHECKS.get(kind)
    if check is None:  # Kind.any
        return v
    if not check.accepts(v):
        raise SpmdError(f"{where} must be {check.must_be.format(got=describe(v))}", node.span)
    return check.convert(v)


def _takes_none(b: Builtin, pname: str, kind: Kind) -> bool:
    """`None` is a value of optional axes (every dim: `softmax(x, axis=None)`) and of arguments
    whose default is None; a required axis (expand_dims') takes none."""
    default = next((p[2] for p in b.params if p[0] == pname), _REQUIRED)
    return default is None or (kind == Kind.axes and default is not _REQUIRED)


def tensor(ctx, args: Args, name: str, dtype: str | None = None) -> Value:
    v = args[name]
    return v if isinstance(v, Value) else ctx.materialize(v, args.span(name), dtype)


def norm_axis(axis: int, rank: int, span: Span, what="axis") -> int:
    if not -rank <= axis < rank:
        raise SpmdError(f"{what} {axis} is out of range for rank {rank}", span)
    return axis % rank


def norm_axes(axes, rank: int, span: Span) -> tuple[int, ...]:
    if axes is None:
        return tuple(range(rank))
    items = axes if isinstance(axes, list) else [axes]
    out = tuple(norm_axis(a, rank, span) for a in items)
    if len(set(out)) != len(out):
        raise SpmdError(f"axis {axes} names a dimension twice", span)
    return tuple(sorted(out))


# ---------------------------------------------------------------------------------- sharding


@builtin("shard", "x:tensor", "spec:spec", doc="sharding constraint (GSPMD mesh_split)")
def _shard(ctx, span, args):
    x = tensor(ctx, args, "x")
    sharding = ctx.sharding_of(args["spec"], x.type, allow_open=True)
    return ctx.b.emit("shard", x, span=span, sharding=sharding)


# ---------------------------------------------------------------------------------- differentiation


def _lowered_by_grad(ctx, span, args):  # pragma: no cover - Lowerer.expr_Call lowers them (frontend/grad.py)
    raise AssertionError("grad and value_and_grad are lowered by frontend.grad.lower_grad")


builtin("grad", "f:any", "args:tensors*", doc="gradients of a scalar function (frontend/grad.py)")(_lowered_by_grad)
builtin("value_and_grad", "f:any", "args:tensors*",
        doc="value and gradients of a scalar function (frontend/grad.py)")(_lowered_by_grad)


@builtin("stop_gradient", "x:tensor", doc="x, with no gradient flowing back through it")
def _stop_gradient(ctx, span, args):
    return ctx.b.emit("stop_gradient", tensor(ctx, args, "x"), span=span)


# ---------------------------------------------------------------------------------- elementwise


def _elementwise(name, takes: Takes, prim=None):
    """The builtin `name(x)` of one op of the table; ints go to floats for a float-only op, as numpy."""
    def lower(ctx, span, args):
        x = args["x"]
        weak = is_weak(x)  # of a literal (or a value computed from literals only): weakly typed, as in jax
        if not isinstance(x, Value):
            x = ctx.materialize(x, args.span("x"), "f32" if takes == Takes.float else None)
        if takes == Takes.float and T.is_int(x.type.dtype):
            x = ctx.cast(x, float_for(x.type.dtype), span)  # numpy computes float functions of ints in floats
        out = ctx.b.emit(prim or name, x, span=span)
        if weak and T.kind(out.type.dtype) != "bool":
            WEAK.add(out)
        return out

    return lower


def _binary(name):
    def lower(ctx, span, args):
        return ctx.binary(name, args["a"], args["b"], span, args.span("a"), args.span("b"))

    return lower


# the ops of the table that are builtins of their own name (OpDef.builtin): exp(x), maximum(a, b), ...
ELEMENTWISE_BUILTINS: list[str] = []  # their names (structs map them over leaves)
for _op in registry.OPS.values():
    if _op.builtin is not None:  # elementwise, with no attributes (registry._validate)
        if len(_op.example[0]) == 1:
            builtin(_op.name, "x:tensor")(_elementwise(_op.name, _op.builtin))
        else:
            builtin(_op.name, "a:tensor", "b:tensor")(_binary(_op.name))
        ELEMENTWISE_BUILTINS.append(_op.name)


@builtin("gelu", "x:tensor", "approximate:bool=true",
         doc="GELU; approximate=true is the tanh form, false the exact erf form")
def _gelu(ctx, span, args):
    return _elementwise("gelu", Takes.float, "gelu" if args["approximate"] else "gelu_erf")(ctx, span, args)


@builtin("clip", "x:tensor", "lo:tensor", "hi:tensor", doc="minimum(maximum(x, lo), hi), as numpy")
def _clip(ctx, span, args):
    low = ctx.binary("maximum", args["x"], args["lo"], span, args.span("x"), args.span("lo"))
    return ctx.binary("minimum", low, args["hi"], span, span, args.span("hi"))


@builtin("where", "cond:tensor", "a:tensor", "b:tensor")
def _where(ctx, span, args):
    c = args["cond"]
    if isinstance(c, (int, float)) and not isinstance(c, bool):
        c = bool(c != 0)  # as jnp.where: any dtype, nonzero (NaN included) is true
    if isinstance(c, Value) and c.type.dtype != "bool":
        c = ctx.binary("ne", c, 0, args.span("cond"))
    (a, b), dt, shape = ctx.unify([args["a"], args["b"]], [args.span("a"), args.span("b")], span)
    c = c if isinstance(c, Value) else ctx.materialize(c, args.span("cond"))
    shape = ctx.broadcast_shapes([c.type.shape, shape], span)
    parts = [ctx.broadcast_to(v, shape, span) if v.type.rank else v for v in (c, a, b)]
    if shape and not any(v.type.rank for v in parts):
        parts[1] = ctx.broadcast_to(parts[1], shape, span)
    return ctx.b.emit("select", *parts, span=span, blame={0: args.span("cond")})


@builtin("cast", "x:tensor", "dtype:dtype")
def _cast(ctx, span, args):
    x = tensor(ctx, args, "x")
    return ctx.b.emit("cast", x, span=span, dtype=args["dtype"])


@builtin("bitcast_convert_type", "x:tensor", "dtype:dtype")
def _bitcast(ctx, span, args):
    x = tensor(ctx, args, "x")
    return ctx.b.emit("bitcast_convert_type", x, span=span, dtype=args["dtype"], blame={"dtype": args.span("dtype")})


# ---------------------------------------------------------------------------------- reductions


def _keep(ctx, v, shape, axes, keepdims, span):
    if not keepdims:
        return v
    out = tuple(1 if i in axes else n for i, n in enumerate(shape))
    return ctx.b.emit("reshape", v, span=span, shape=out)


def mean_over(ctx, x: Value, axes, span, blame=None) -> Value:
    """jnp.mean of x over axes (dropped): an int x in its float; a bf16 or f16 x summed and divided
    in f32 and rounded once (rounding the sum, then the quotient, differs by an ulp, which a
    cancelling mean(x^2) - mean^2 amplifies)."""
    if T.is_int(x.type.dtype):
        x = ctx.cast(x, float_for(x.type.dtype), span)
    dt = x.type.dtype
    wide = ctx.cast(x, "f32", span) if dt in ("bf16", "f16") else x
    count = 1
    for a in axes:
        count *= x.type.shape[a]
    out = ctx.b.emit("reduce_sum", wide, span=span, axes=axes, **({"blame": blame} if blame else {}))
    out = ctx.b.emit("div", out, ctx.materialize(float(count), span, out.type.dtype), span=span)
    return ctx.cast(out, dt, span) if wide is not x else out


def _reduce(kind):
    def lower(ctx, span, args):
        x = tensor(ctx, args, "x")
        axes = norm_axes(args["axis"], x.type.rank, args.span("axis"))
        dt = x.type.dtype
        if dt == "bool":
            x = ctx.cast(x, "i32", span)
        blame = {"axes": args.span("axis")}
        if kind == "mean":
            out = mean_over(ctx, x, axes, span, blame)
        else:
            out = ctx.b.emit(f"reduce_{kind}", x, span=span, axes=axes, blame=blame)
        if dt == "bool" and kind in ("max", "min"):
            out = ctx.cast(out, "bool", span)
        return _keep(ctx, out, x.type.shape, axes, args["keepdims"], span)

    return lower


for _k in ("sum", "max", "min", "mean", "prod"):
    builtin(_k, "x:tensor", "axis:axes=None", "keepdims:bool=false")(_reduce(_k))


def _arg(kind):
    def lower(ctx, span, args):
        x = tensor(ctx, args, "x")
        rank = x.type.rank
        if x.type.dtype == "bool":
            x = ctx.cast(x, "i32", span)
        if args["axis"] is None:
            x = ctx.b.emit("reshape", x, span=span, shape=(x.type.size,))
            axis = 0
        else:
            if isinstance(args["axis"], list):
                raise SpmdError(f"{kind} takes a single axis", args.span("axis"))
            axis = norm_axis(args["axis"], x.type.rank, args.span("axis"))
        out = ctx.b.emit(kind, x, span=span, axis=axis, blame={"axis": args.span("axis")})
        if args["keepdims"] and args["axis"] is None:  # numpy: every dim kept, as size 1
            out = ctx.b.emit("reshape", out, span=span, shape=(1,) * rank)
        elif args["keepdims"]:
            out = _keep(ctx, out, x.type.shape, (axis,), True, span)
        return out

    return lower


builtin("argmax", "x:tensor", "axis:axes=None", "keepdims:bool=false")(_arg("argmax"))
builtin("argmin", "x:tensor", "axis:axes=None", "keepdims:bool=false")(_arg("argmin"))


def _along_axis(kind, keeps_bool, *attrs):
    """Lowering of a builtin that works along one axis of a tensor of rank >= 1 (scans, sorts):
    bool is computed in i32 (counts and products of bools are ints, as numpy's are) and cast back
    where the result keeps x's values (`keeps_bool`); `attrs` are passed on as given."""
    def lower(ctx, span, args):
        x = tensor(ctx, args, "x")
        if x.type.rank == 0:
            raise SpmdError(f"{kind} needs a tensor of rank >= 1, got {x.type}", args.span("x"))
        axis = norm_axis(args["axis"], x.type.rank, args.span("axis"))
        dt = x.type.dtype
        if dt == "bool":
            x = ctx.cast(x, "i32", span)
        out = ctx.b.emit(kind, x, span=span, axis=axis, **{a: args[a] for a in attrs})
        return ctx.cast(out, "bool", span) if dt == "bool" and keeps_bool else out

    return lower


for _k in ("cumsum", "cumprod", "cummax"):
    builtin(_k, "x:tensor", "axis:int", "reverse:bool=false",
            doc=f"inclusive {_k[3:]} scan along `axis`")(_along_axis(_k, _k == "cummax", "reverse"))


def _expand_back(ctx, v, shape, axes, span):
    """A reduction's result broadcast back over the reduced axes (keepdims + broadcast in one op)."""
    kept = tuple(i for i in range(len(shape)) if i not in axes)
    return ctx.b.emit("broadcast_in_dim", v, span=span, shape=tuple(shape), dims=kept)


@builtin("softmax", "x:tensor", "axis:axes=-1",
         doc="exp(x - max) / sum(exp(x - max)), the max under stop_gradient (jax.nn.softmax)")
def _softmax(ctx, span, args):
    x = tensor(ctx, args, "x")
    if not T.is_float(x.type.dtype):
        x = ctx.cast(x, float_for(x.type.dtype), span)
    axes = norm_axes(args["axis"], x.type.rank, args.span("axis"))
    # the shift under stop_gradient, as jax.nn.softmax has it: the same values, and a backward pass
    # without the max's tangent (exactly zero: the shift cancels in the ratio), which cost a
    # reduction, a count of the ties and, where the axis is split, more communication
    m = ctx.b.emit("stop_gradient", ctx.b.emit("reduce_max", x, span=span, axes=axes, shift=True), span=span)
    m = _expand_back(ctx, m, x.type.shape, axes, span)
    e = ctx.b.emit("exp", ctx.b.emit("sub", x, m, span=span), span=span)
    s = _expand_back(ctx, ctx.b.emit("reduce_sum", e, span=span, axes=axes), x.type.shape, axes, span)
    return ctx.b.emit("div", e, s, span=span)


@builtin("logsumexp", "x:tensor", "axis:axes=-1", "keepdims:bool=false",
         doc="max + log(sum(exp(x - max))), the max under stop_gradient and +-inf treated as 0 (jax.nn.logsumexp)")
def _logsumexp(ctx, span, args):
    x = tensor(ctx, args, "x")
    if not T.is_float(x.type.dtype):
        x = ctx.cast(x, float_for(x.type.dtype), span)
    axes = norm_axes(args["axis"], x.type.rank, args.span("axis"))
    m = ctx.b.emit("reduce_max", x, span=span, axes=axes, shift=True)
    # rows that are all -inf would give -inf - -inf = nan, rows holding +inf inf - inf = nan: shift
    # those by 0 instead (-inf and inf, as jax.nn.logsumexp gives)
    infinite = ctx.binary("eq", ctx.b.emit("abs", m, span=span), float("inf"), span)
    m = ctx.b.emit("select", infinite, ctx.materialize(0.0, span, m.type.dtype), m, span=span)
    # the shift under stop_gradient, as jax.nn.logsumexp has it: the value is the same, and the
    # gradient is softmax(x) exactly, without a sum over the axis for d(max) (1 - sum(softmax) = 0)
    # that costs a vocab-parallel loss one more all_reduce in its backward pass
    m = ctx.b.emit("stop_gradient", m, span=span)
    e = ctx.b.emit("exp", ctx.b.emit("sub", x, _expand_back(ctx, m, x.type.shape, axes, span), span=span), span=span)
    out = ctx.b.emit("add", ctx.b.emit("log", ctx.b.emit("reduce_sum", e, span=span, axes=axes), span=span), m,
                     span=span)
    return _keep(ctx, out, x.type.shape, axes, args["keepdims"], span)


# ---------------------------------------------------------------------------------- contractions


@builtin("einsum", "spec:str", "operands:tensors*")
def _einsum(ctx, span, args):
    ops = args["operands"]
    for v in ops:
        if not isinstance(v, Value):
            raise SpmdError(f"einsum operands must be tensors, got {describe(v)}", span)
    dt = ops[0].type.dtype
    for v in ops[1:]:
        dt = T.promote(dt, v.type.dtype)
    ops = [ctx.cast(v, dt, span) for v in ops]
    spec = args["spec"].replace(" ", "")
    if len(ops) <= 2:
        return ctx.b.emit("einsum", *ops, span=span, spec=spec)
    try:
        ins, out = parse_einsum(spec, [v.type.rank for v in ops])
    except ShapeError as e:
        raise SpmdError(str(e), span) from None
    sizes: dict[str, int] = {}
    for letters, v in zip(ins, ops):
        for c, n in zip(letters, v.type.shape):
            if sizes.setdefault(c, n) != n:
                raise SpmdError(f'einsum "{spec}": index {c} is {sizes[c]} in one operand and {n} in another', span)
    # one op: partitioning picks the order of pairwise contractions (ops/contract.py)
    return ctx.b.emit("einsum", *ops, span=span, spec=spec)


def _per_spatial_dim(args, what: str, v, nsp: int, name: str) -> list[int]:
    """A window/stride argument: one positive integer for every spatial dim, or a list of nsp."""
    items = v if isinstance(v, list) else [v] * nsp
    if len(items) != nsp or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in items):
        raise SpmdError(f"{name} {what} must be a positive integer or a list of {nsp}", args.span(what))
    return items


def _window_padding(args, shape, window, strides, name: str) -> list[tuple[int, int]]:
    """`padding` of a windowed op: "SAME" (jax's split: the extra element at the end), "VALID", or
    explicit [lo, hi] pairs, one per spatial dim."""
    pad, nsp = args["padding"], len(shape)
    if pad in ("SAME", "VALID"):
        padding = []
        for n, k, s in zip(shape, window, strides):
            total = 0 if pad == "VALID" else max((-(-n // s) - 1) * s + k - n, 0)
            padding.append((total // 2, total - total // 2))
        return padding
    if isinstance(pad, list) and len(pad) == nsp and all(
            isinstance(p, list) and len(p) == 2 and all(isinstance(q, int) and not isinstance(q, bool) and q >= 0
                                                         for q in p) for p in pad):
        return [tuple(p) for p in pad]
    raise SpmdError(f'{name} padding must be "SAME", "VALID" or [[lo, hi]] x {nsp} of non-negative integers',
                    args.span("padding"))


@builtin("conv", "x:tensor", "w:tensor", "stride:any=1", "padding:any=SAME", "lhs_dilation:any=1",
         "rhs_dilation:any=1", "groups:any=1")
def _conv(ctx, span, args):
    x, w = tensor(ctx, args, "x"), tensor(ctx, args, "w")
    nsp = x.type.rank - 2
    if nsp not in (1, 2, 3):
        raise SpmdError(f"conv supports 1-D, 2-D and 3-D inputs [N, spatial..., C]; got {x.type}", args.span("x"))
    if w.type.rank != nsp + 2:
        raise SpmdError(f"conv kernel must be [window..., C, F] with {nsp} window dim(s), got {w.type}",
                        args.span("w"))
    strides = _per_spatial_dim(args, "stride", args["stride"], nsp, "conv")
    lhs = _per_spatial_dim(args, "lhs_dilation", args["lhs_dilation"], nsp, "conv")
    rhs = _per_spatial_dim(args, "rhs_dilation", args["rhs_dilation"], nsp, "conv")
    groups = args["groups"]
    if not isinstance(groups, int) or isinstance(groups, bool) or groups < 1:
        raise SpmdError("conv groups must be a positive integer", args.span("groups"))
    c, f = x.type.shape[-1], w.type.shape[-1]
    if c % groups:
        raise SpmdError(f"conv: {c} input channels do not divide into {groups} groups", args.span("groups"))
    if f % groups:
        raise SpmdError(f"conv: {f} output features (the kernel's last dim) do not divide into {groups} groups",
                        args.span("groups"))
    if groups > 1 and w.type.shape[-2] != c // groups:
        raise SpmdError(f"conv: with groups={groups} the kernel must be [window..., {c // groups}, F] "
                        f"({c} channels / {groups} groups), got {w.type}", args.span("w"))
    if any(d > 1 for d in lhs) and args["padding"] in ("SAME", "VALID"):
        raise SpmdError("conv with lhs_dilation > 1 (a transposed conv) needs explicit padding [[lo, hi], ...]",
                        args.span("padding") if "padding" in args.spans else args.span("lhs_dilation"))
    window = [(k - 1) * r + 1 for k, r in zip(w.type.shape[:nsp], rhs)]
    padding = _window_padding(args, x.type.shape[1:-1], window, strides, "conv")
    dt = T.promote(x.type.dtype, w.type.dtype)
    dt = float_for(dt)
    x, w = ctx.cast(x, dt, span), ctx.cast(w, dt, span)
    return ctx.b.emit("conv", x, w, span=span, **conv_attrs(strides, padding, lhs, rhs, groups))


def _pool(kind):
    def lower(ctx, span, args):
        x = tensor(ctx, args, "x")
        nsp = x.type.rank - 2
        name = f"{kind}_pool"
        if nsp < 1 or x.type.dtype == "bool":
            raise SpmdError(f"{name} needs a numeric [N, spatial..., C] input, got {x.type}", args.span("x"))

        window = _per_spatial_dim(args, "window", args["window"], nsp, name)
        stride = window if args["stride"] is None else args["stride"]
        strides = _per_spatial_dim(args, "stride", stride, nsp, name)
        shape = x.type.shape[1:-1]
        # avg_pool's lhs_dilation spreads the input (zeros between elements), as conv's does
        lhs = [1] * nsp if kind == "max" else _per_spatial_dim(args, "lhs_dilation", args["lhs_dilation"], nsp, name)
        if any(d > 1 for d in lhs) and args["padding"] in ("SAME", "VALID"):
            raise SpmdError(f"{name} with lhs_dilation > 1 needs explicit padding [[lo, hi], ...]",
                            args.span("padding") if "padding" in args.spans else args.span("lhs_dilation"))
        padding = _window_padding(args, shape, window, strides, name)
        for n, k, s, (lo, hi), d in zip(shape, window, strides, padding, lhs):
            if conv_output_size(n, k, s, lo, hi, d) < 1:
                raise SpmdError(f"{name}: window {k} does not fit spatial dim {n}", span)
        if kind == "avg" and T.is_int(x.type.dtype):
            x = ctx.cast(x, float_for(x.type.dtype), span)
        extra = {"lhs_dilation": tuple(lhs)} if any(d > 1 for d in lhs) else {}
        out = ctx.b.emit("pool", x, span=span, reduce="max" if kind == "max" else "sum", window=tuple(window),
                         strides=tuple(strides), padding=tuple(padding), **extra)
        if kind == "avg":
            size = 1
            for k in window:
                size *= k
            out = ctx.b.emit("div", out, ctx.materialize(float(size), span, out.type.dtype), span=span)
        return out

    return lower


builtin("max_pool", "x:tensor", "window:any", "stride:any=None", "padding:any=VALID",
        doc="max over windows of the spatial dims of [N, spatial..., C]")(_pool("max"))
builtin("avg_pool", "x:tensor", "window:any", "stride:any=None", "padding:any=VALID", "lhs_dilation:any=1",
        doc="avg over windows of the spatial dims of [N, spatial..., C] (lhs_dilation: zeros between "
            "input elements)")(_pool("avg"))


@builtin("max_pool_grad", "x:tensor", "ct:tensor", "window:any", "stride:any=None", "padding:any=VALID",
         doc="the gradient of max_pool(x, window, stride, padding) for the cotangent ct of its result: each "
             "window's ct at the window's first maximum (jax's select_and_scatter_add)")
def _max_pool_grad(ctx, span, args):
    x, ct = tensor(ctx, args, "x"), tensor(ctx, args, "ct")
    nsp = x.type.rank - 2
    if nsp < 1 or not T.is_float(x.type.dtype):
        raise SpmdError(f"max_pool_grad needs a float [N, spatial..., C] input, got {x.type}", args.span("x"))
    window = _per_spatial_dim(args, "window", args["window"], nsp, "max_pool_grad")
    stride = window if args["stride"] is None else args["stride"]
    strides = _per_spatial_dim(args, "stride", stride, nsp, "max_pool_grad")
    shape = x.type.shape[1:-1]
    padding = _window_padding(args, shape, window, strides, "max_pool_grad")
    out = [conv_output_size(n, k, s, lo, hi) for n, k, s, (lo, hi) in zip(shape, window, strides, padding)]
    if any(m < 1 for m in out):
        raise SpmdError(f"max_pool_grad: window {list(window)} does not fit {x.type}", span)
    want = (x.type.shape[0], *out, x.type.shape[-1])
    if tuple(ct.type.shape) != want:
        raise SpmdError(f"max_pool_grad: ct must be shaped as the pool's result {list(want)}, got {ct.type}",
                        args.span("ct"))
    ct = ctx.cast(ct, x.type.dtype, span)
    return ctx.b.emit("select_and_scatter_add", ct, x, span=span, window=tuple(window), strides=tuple(strides),
                      padding=tuple(padding))


# ---------------------------------------------------------------------------------- layout


@builtin("transpose", "x:tensor", "perm:any=None")
def _transpose(ctx, span, args):
    x = tensor(ctx, args, "x")
    perm = args["perm"]
    if perm is None:
        perm = list(range(x.type.rank))[::-1]
    if not isinstance(perm, list) or not all(isinstance(p, int) and not isinstance(p, bool) for p in perm):
        raise SpmdError("transpose: perm must be a list of integers", args.span("perm"))
    perm = [norm_axis(p, x.type.rank, args.span("perm")) for p in perm] if len(perm) == x.type.rank else perm
    if sorted(perm) != list(range(x.type.rank)):
        raise SpmdError(f"transpose: {args['perm']} is not a permutation of {x.type.rank} dims", args.span("perm"))
    if perm == list(range(x.type.rank)):
        return x
    return ctx.b.emit("transpose", x, span=span, perm=tuple(perm))


@builtin("reshape", "x:tensor", "shape:ints")
def _reshape(ctx, span, args):
    x = tensor(ctx, args, "x")
    shape = list(args["shape"])
    if shape.count(-1) > 1:
        raise SpmdError("reshape: only one -1 is allowed", args.span("shape"))
    if any(n < -1 for n in shape):
        raise SpmdError(f"reshape: bad size in {shape}", args.span("shape"))
    if -1 in shape:
        known = 1
        for n in shape:
            if n != -1:
                known *= n
        if known == 0 or x.type.size % known:
            raise SpmdError(f"reshape: cannot reshape {x.type} ({x.type.size} elements) to {shape}", args.span("shape"))
        shape[shape.index(-1)] = x.type.size // known
    if tuple(shape) == x.type.shape:
        return x
    return ctx.b.emit("reshape", x, span=span, shape=tuple(shape), blame={"shape": args.span("shape")})


@builtin("broadcast_to", "x:tensor", "shape:ints")
def _broadcast_to(ctx, span, args):
    x = tensor(ctx, args, "x")
    shape = tuple(args["shape"])
    if any(n < 0 for n in shape):
        raise SpmdError(f"broadcast_to: bad shape {list(shape)}", args.span("shape"))
    if x.type.rank == 0 and shape:
        return ctx.b.emit("broadcast_in_dim", x, span=span, shape=shape, dims=())
    return ctx.broadcast_to(x, shape, span)


@builtin("expand_dims", "x:tensor", "axis:axes")
def _expand_dims(ctx, span, args):
    x = tensor(ctx, args, "x")
    axes = args["axis"] if isinstance(args["axis"], list) else [args["axis"]]
    rank = x.type.rank + len(axes)
    axes = norm_axes(axes, rank, args.span("axis"))
    dims = iter(x.type.shape)
    shape = tuple(1 if i in axes else next(dims) for i in range(rank))
    return ctx.b.emit("reshape", x, span=span, shape=shape)


@builtin("squeeze", "x:tensor", "axis:axes=None")
def _squeeze(ctx, span, args):
    x = tensor(ctx, args, "x")
    if args["axis"] is None:
        axes = tuple(i for i, n in enumerate(x.type.shape) if n == 1)
    else:
        axes = norm_axes(args["axis"], x.type.rank, args.span("axis"))
        for a in axes:
            if x.type.shape[a] != 1:
                raise SpmdError(f"squeeze: dimension {a} of {x.type} has size {x.type.shape[a]}, not 1",
                                args.span("axis"))
    if not axes:
        return x
    return ctx.b.emit("reshape", x, span=span, shape=tuple(n for i, n in enumerate(x.type.shape) if i not in axes))


@builtin("concat", "xs:tensors", "axis:int=0")
def _concat(ctx, span, args):
    xs = args["xs"]
    dt = xs[0].type.dtype
    for v in xs[1:]:
        dt = T.promote(dt, v.type.dtype)
    rank = xs[0].type.rank
    if rank == 0:
        raise SpmdError("concat: cannot concatenate scalars", args.span("xs"))
    axis = norm_axis(args["axis"], rank, args.span("axis"))
    xs = [ctx.cast(v, dt, span) for v in xs]
    if len(xs) == 1:
        return xs[0]
    return ctx.b.emit("concat", *xs, span=span, axis=axis, blame=dict.fromkeys(range(len(xs)), args.span("xs")))


@builtin("pad", "x:tensor", "widths:any", "value:number=0")
def _pad(ctx, span, args):
    x = tensor(ctx, args, "x")
    w = args["widths"]
    if isinstance(w, list) and len(w) == 2 and all(_static_int(q) for q in w):
        w = [w]  # one [lo, hi] for every dim, as numpy.pad's (lo, hi)
    ok = isinstance(w, list) and all(
        isinstance(p, list) and len(p) == 2 and all(isinstance(q, int) and not isinstance(q, bool) for q in p)
        for p in w)
    if not ok:
        raise SpmdError("pad: widths must be [[lo, hi], ...] of integers, or one [lo, hi] for every dim",
                        args.span("widths"))
    if len(w) == 1 and x.type.rank != 1:
        w = w * x.type.rank
    if len(w) != x.type.rank:
        raise SpmdError(f"pad: {len(w)} [lo, hi] pair(s) for {x.type} of rank {x.type.rank}", args.span("widths"))
    value = scalar_value(args["value"], x.type.dtype, args.span("value"), "pad: value ")
    if all(p == [0, 0] for p in w):
        return x
    return ctx.b.emit("pad", x, span=span, lo=tuple(p[0] for p in w), hi=tuple(p[1] for p in w), value=value,
                      blame={"lo": args.span("widths")})


@builtin("roll", "x:tensor", "shift:any", "axis:any=None")
def _roll(ctx, span, args):
    x = tensor(ctx, args, "x")
    shift, axis = args["shift"], args["axis"]
    if axis is None:
        flat = ctx.b.emit("reshape", x, span=span, shape=(x.type.size,)) if x.type.rank != 1 else x
        out = _roll(ctx, span, Args({"x": flat, "shift": shift, "axis": 0}, args.spans, args.call))
        return ctx.b.emit("reshape", out, span=span, shape=x.type.shape) if x.type.rank != 1 else out
    shifts = shift if isinstance(shift, list) else [shift]
    axes = axis if isinstance(axis, list) else [axis]
    if len(shifts) != len(axes) or not all(isinstance(s, int) and not isinstance(s, bool) for s in shifts + axes):
        note = "".join(loop_index_note(v) for v in shifts + axes)
        raise SpmdError(f"roll: shift and axis must be integers (or lists of equal length){note}", span)
    out = x
    for s, a in zip(shifts, axes):
        a = norm_axis(a, x.type.rank, args.span("axis"))
        n = x.type.shape[a]
        if n and s % n:
            out = ctx.b.emit("roll", out, span=span, shift=s % n, axis=a)
    return out


@builtin("take", "table:tensor", "ids:tensor", "axis:int=0")
def _take(ctx, span, args):
    table = tensor(ctx, args, "table")
    ids = args["ids"]
    if isinstance(ids, list):
        raise SpmdError("take: ids must be a tensor or a single integer", args.span("ids"))
    ids = tensor(ctx, args, "ids", "i32" if isinstance(ids, int) and not isinstance(ids, bool) else None)
    if table.type.rank == 0:
        raise SpmdError("take: the table must have rank >= 1", args.span("table"))
    axis = norm_axis(args["axis"], table.type.rank, args.span("axis"))
    return ctx.b.emit("take", table, ids, span=span, axis=axis, blame={0: args.span("table"), 1: args.span("ids")})


@builtin("top_k", "x:tensor", "k:int", doc="values and i32 indices of the k largest along the last axis")
def _top_k(ctx, span, args):
    x = tensor(ctx, args, "x")
    if x.type.rank == 0:
        raise SpmdError(f"top_k needs a tensor of rank >= 1, got {x.type}", args.span("x"))
    if not 1 <= args["k"] <= x.type.shape[-1]:
        raise SpmdError(f"top_k: k = {args['k']} must be in [1, {x.type.shape[-1]}] for {x.type}", args.span("k"))
    dt = x.type.dtype
    if dt == "bool":
        x = ctx.cast(x, "i32", span)
    vals, ids = ctx.b.emit_op("top_k", [x], {"k": args["k"]}, span)
    return ctx.cast(vals, "bool", span) if dt == "bool" else vals, ids


@builtin("take_along_axis", "x:tensor", "ids:tensor", "axis:int")
def _take_along_axis(ctx, span, args):
    x, ids = tensor(ctx, args, "x"), tensor(ctx, args, "ids")
    if not T.is_int(ids.type.dtype):
        raise SpmdError(f"take_along_axis: ids must be integers, got {ids.type}", args.span("ids"))
    if x.type.rank == 0 or ids.type.rank != x.type.rank:
        raise SpmdError(f"take_along_axis: ids {ids.type} must have the rank of {x.type} (>= 1)", args.span("ids"))
    axis = norm_axis(args["axis"], x.type.rank, args.span("axis"))
    for d, (a, b) in enumerate(zip(x.type.shape, ids.type.shape)):
        if d != axis and a != b:
            raise SpmdError(f"take_along_axis: ids {ids.type} and {x.type} differ in dim {d}", args.span("ids"))
    if x.type.shape[axis] == 0:
        raise SpmdError("take_along_axis: cannot gather from an empty dimension", args.span("x"))
    return ctx.b.emit("take_along_axis", x, ids, span=span, axis=axis)


builtin("sort", "x:tensor", "axis:int=-1", doc="ascending along axis, stable")(_along_axis("sort", True))
builtin("argsort", "x:tensor", "axis:int=-1",
        doc="i32 indices that sort along axis, stable")(_along_axis("argsort", False))


def _scatter(name: str):
    def lower(ctx, span, args):
        x = tensor(ctx, args, "x")
        ids = tensor(ctx, args, "ids", "i32")
        if not T.is_int(ids.type.dtype):
            raise SpmdError(f"{name}: ids must be integers, got {ids.type}", args.span("ids"))
        if x.type.rank == 0 or x.type.dtype == "bool":
            raise SpmdError(f"{name} needs a numeric table of rank >= 1, got {x.type}", args.span("x"))
        axis = norm_axis(args["axis"], x.type.rank, args.span("axis"))
        want = x.type.shape[:axis] + ids.type.shape + x.type.shape[axis + 1:]
        upd = args["updates"]
        if not isinstance(upd, Value):
            upd = ctx.broadcast_to(ctx.materialize(upd, args.span("updates"), x.type.dtype), want, span)
        if upd.type.shape != want:
            raise SpmdError(f"{name}: updates must have shape {list(want)} (x.shape[:axis] + ids.shape + "
                            f"x.shape[axis+1:]), got {upd.type}", args.span("updates"))
        return ctx.b.emit(name, x, ids, ctx.cast(upd, x.type.dtype, span), span=span, axis=axis)

    return lower


for _name in ("scatter_add", "scatter_max", "scatter_min"):
    builtin(_name, "x:tensor", "ids:tensor", "updates:tensor", "axis:int=0")(_scatter(_name))


def _starts(ctx, args, x: Value, name: str) -> list:
    """`starts`: one integer scalar per dim of x, each a static integer or an integer scalar value."""
    starts = args["starts"]
    where = args.span("starts")
    if not isinstance(starts, list):
        raise SpmdError(f"{name}: starts must be a list with one integer scalar per dim, e.g. [t, 0], got "
                        f"{describe(starts)}", where)
    if len(starts) != x.type.rank:
        raise SpmdError(f"{name}: {len(starts)} start(s) for {x.type} of rank {x.type.rank}; give one per dim",
                        where)
    for i, s in enumerate(starts):
        if isinstance(s, Value):
            if s.type.rank != 0 or not T.is_int(s.type.dtype):
                raise SpmdError(f"{name}: start {i} must be an integer scalar, got {s.type}", where)
        elif isinstance(s, bool) or not isinstance(s, int):
            raise SpmdError(f"{name}: start {i} must be an integer scalar, got {describe(s)}", where)
        elif not -2**63 <= s < 2**63:
            raise SpmdError(f"{name}: start {i} ({_short_int(s)}) does not fit in 64 bits", where)
    return starts


def _short_int(n: int) -> str:
    text = str(n)
    return text if len(text) <= 24 else f"{text[:3]}...({len(text)} digits)"


def _start_value(ctx, s: Value, n: int, m: int, span) -> Value:
    """A value start as the i32 the IR's window ops take: a wider start is clamped into [0, n - m]
    in its own width first, so that 2^32 + 1 is past the end, not 1 (as jax.lax clamps an i64 start)."""
    if T.itemsize(s.type.dtype) > 4:
        lo, hi = ctx.materialize(0, span, s.type.dtype), ctx.materialize(n - m, span, s.type.dtype)
        s = ctx.b.emit("minimum", ctx.b.emit("maximum", s, lo, span=span), hi, span=span)
    return ctx.cast(s, "i32", span)


def dynamic_window(ctx, x: Value, starts, sizes, span) -> Value:
    """x's window of `sizes` at `starts` (static integers or integer scalar values), each start
    clamped into [0, n - size]. The dims with a value start and a window smaller than the dim go to
    one dynamic_slice first (so that a static part slices the smaller result); static starts
    become a static slice."""
    shape = x.type.shape
    dynamic = [isinstance(s, Value) and m < n for s, n, m in zip(starts, shape, sizes)]
    out = x
    if any(dynamic):
        ops = [_start_value(ctx, s, n, m, span) if dyn else ctx.materialize(0, span, "i32")
               for s, dyn, n, m in zip(starts, dynamic, shape, sizes)]
        out = ctx.b.emit("dynamic_slice", x, *ops, span=span,
                         sizes=tuple(m if dyn else n for m, n, dyn in zip(sizes, shape, dynamic)))
    lo, hi = [0] * x.type.rank, list(out.type.shape)
    for d, (s, n, m) in enumerate(zip(starts, shape, sizes)):
        if not dynamic[d] and m < n:
            lo[d] = min(max(s, 0), n - m) if isinstance(s, int) else 0
            hi[d] = lo[d] + m
    if (lo, hi) != ([0] * x.type.rank, list(out.type.shape)):
        out = ctx.b.emit("slice", out, span=span, starts=tuple(lo), stops=tuple(hi), steps=(1,) * x.type.rank)
    return out


@builtin("dynamic_slice", "x:tensor", "starts:any", "sizes:ints",
         doc="the window of static `sizes` at `starts` (integer scalars, static or values), clamped to fit")
def _dynamic_slice(ctx, span, args):
    x = tensor(ctx, args, "x")
    starts = _starts(ctx, args, x, "dynamic_slice")
    sizes = args["sizes"]
    if len(sizes) != x.type.rank:
        raise SpmdError(f"dynamic_slice: {len(sizes)} size(s) for {x.type} of rank {x.type.rank}; give one per dim",
                        args.span("sizes"))
    for d, (m, n) in enumerate(zip(sizes, x.type.shape)):
        if not 0 <= m <= n:
            raise SpmdError(f"dynamic_slice: size {m} of dim {d} does not fit in {x.type} (0 <= size <= {n})",
                            args.span("sizes"))
    return dynamic_window(ctx, x, starts, sizes, span)


@builtin("dynamic_update_slice", "x:tensor", "update:tensor", "starts:any",
         doc="x with `update` written at `starts` (integer scalars, static or values), clamped to fit")
def _dynamic_update_slice(ctx, span, args):
    x = tensor(ctx, args, "x")
    upd = tensor(ctx, args, "update", x.type.dtype)
    if upd.type.rank != x.type.rank or any(m > n for m, n in zip(upd.type.shape, x.type.shape)):
        raise SpmdError(f"dynamic_update_slice: the update {upd.type} does not fit in {x.type} (same rank, "
                        "no dim larger)", args.span("update"))
    if upd.type.dtype != x.type.dtype:
        raise SpmdError(f"dynamic_update_slice: the update is {upd.type.dtype} but x is {x.type.dtype}; cast it",
                        args.span("update"))
    starts = _starts(ctx, args, x, "dynamic_update_slice")
    ops = [_start_value(ctx, s, n, m, span) if isinstance(s, Value)
           else ctx.materialize(min(max(s, 0), n - m), span, "i32")
           for s, n, m in zip(starts, x.type.shape, upd.type.shape)]
    return ctx.b.emit("dynamic_update_slice", x, upd, *ops, span=span)


@builtin("one_hot", "ids:tensor", "n:int", "dtype:dtype=f32")
def _one_hot(ctx, span, args):
    ids = tensor(ctx, args, "ids", "i32")
    if not T.is_int(ids.type.dtype):
        raise SpmdError(f"one_hot: ids must be integers, got {ids.type}", args.span("ids"))
    n = args["n"]
    if n < 0:
        raise SpmdError(f"one_hot: n must be non-negative, got {n}", args.span("n"))
    shape = ids.type.shape + (n,)
    wide = ctx.b.emit("broadcast_in_dim", ids, span=span, shape=shape, dims=tuple(range(ids.type.rank)))
    idx = ctx.b.emit("iota", span=span, dtype=ids.type.dtype, shape=shape, axis=len(shape) - 1)
    return ctx.cast(ctx.b.emit("eq", wide, idx, span=span), args["dtype"], span)


# ---------------------------------------------------------------------------------- random numbers


def _seed(ctx, args) -> Value:
    seed = args["seed"]
    if isinstance(seed, bool) or not isinstance(seed, (int, Value)):
        raise SpmdError(f"the seed must be an integer scalar, got {describe(seed)}", args.span("seed"))
    if isinstance(seed, int):
        if not -2**31 <= seed < 2**32:
            raise SpmdError(f"the seed {seed} does not fit in 32 bits", args.span("seed"))
        return ctx.materialize(seed - 2**32 if seed >= 2**31 else seed, args.span("seed"), "i32")
    if seed.type.rank != 0 or not T.is_int(seed.type.dtype):
        raise SpmdError(f"the seed must be an integer scalar, got {seed.type}", args.span("seed"))
    if seed.type.dtype != "i32":  # narrowing would draw 2^32 + 5 as 5, silently
        raise SpmdError(f"the seed is a 32-bit integer, got {seed.type}: cast it to i32 (that keeps its low "
                        "32 bits)", args.span("seed"))
    return seed


def _draw(ctx, span, seed: Value, shape, dist: str, dtype: str) -> Value:
    """Draws for every element of `shape`, each a function of (seed, its global linear index)."""
    size = 1
    for n in shape:
        size *= n
    if size >= 2**31:
        raise SpmdError(f"random draws index elements in i32: {list(shape)} has too many", span)
    counter = None
    stride = 1
    for axis in range(len(shape) - 1, -1, -1):
        pos = ctx.b.emit("iota", span=span, dtype="i32", shape=tuple(shape), axis=axis)
        if stride != 1:
            pos = ctx.b.emit("mul", pos, ctx.materialize(stride, span, "i32"), span=span)
        counter = pos if counter is None else ctx.b.emit("add", counter, pos, span=span)
        stride *= shape[axis]
    if counter is None:  # a scalar: index 0
        counter = ctx.materialize(0, span, "i32")
    return ctx.b.emit("random", seed, counter, span=span, dist=dist, dtype=dtype)


def _random(dist):
    def lower(ctx, span, args):
        t: TensorType = args["type"]
        if not T.is_float(t.dtype):
            raise SpmdError(f"random_{dist} draws floats, got {t}", args.span("type"))
        return _draw(ctx, span, _seed(ctx, args), t.shape, dist, t.dtype)

    return lower


builtin("random_uniform", "seed:tensor", "type:type", doc="uniform in [0, 1), by (seed, element index)")(
    _random("uniform"))
builtin("random_normal", "seed:tensor", "type:type", doc="standard normal, by (seed, element index)")(
    _random("normal"))


@builtin("dropout", "x:tensor", "rate:number", "seed:tensor",
         doc="keep each element with probability 1 - rate, scaled by 1 / (1 - rate)")
def _dropout(ctx, span, args):
    x = tensor(ctx, args, "x")
    rate = args["rate"]
    if not 0 <= rate < 1:
        raise SpmdError(f"dropout: rate must be in [0, 1), got {rate}", args.span("rate"))
    if not T.is_float(x.type.dtype):
        raise SpmdError(f"dropout needs a float tensor, got {x.type}", args.span("x"))
    seed = _seed(ctx, args)
    if rate == 0:
        return x
    u = _draw(ctx, span, seed, x.type.shape, "uniform", "f32")
    keep = ctx.b.emit("ge", u, ctx.materialize(float(rate), span, "f32"), span=span)
    scaled = ctx.b.emit("mul", x, ctx.materialize(1.0 / (1.0 - rate), span, x.type.dtype), span=span)
    zero = ctx.materialize(0.0, span, x.type.dtype)
    if x.type.rank:
        zero = ctx.b.emit("broadcast_in_dim", zero, span=span, shape=x.type.shape, dims=())
    return ctx.b.emit("select", keep, scaled, zero, span=span)


# ---------------------------------------------------------------------------------- jax.random
# Keys are jax's raw threefry keys (u32[2]); the draws are ops/random.py's random_draw, which
# every backend computes as jax.random does (jax_threefry_partitionable=True).

KEY = TensorType("u32", (2,))


def _key(ctx, args, name: str = "key") -> Value:
    k = args[name]
    if not isinstance(k, Value) or k.type != KEY:
        raise SpmdError(f"{name} must be a random key u32[2] (from prng_key, random_split or fold_in), "
                        f"got {k.type if isinstance(k, Value) else describe(k)}", args.span(name))
    return k


def _u32_scalar(ctx, args, name: str, lo: int) -> Value:
    """A static integer in [lo, 2**32) as a u32 constant (wrapped), or an integer scalar value cast to u32."""
    v = args[name]
    if isinstance(v, int) and not isinstance(v, bool):
        if not lo <= v < 2**32:
            raise SpmdError(f"{v} does not fit in 32 bits (range {lo}..{2**32 - 1})", args.span(name))
        return ctx.materialize(v % 2**32, args.span(name), "u32")
    if not isinstance(v, Value) or v.type.rank != 0 or v.type.dtype not in ("i32", "u32"):
        raise SpmdError(f"{name} must be an i32 or u32 scalar, got {v.type if isinstance(v, Value) else describe(v)}",
                        args.span(name))
    return ctx.cast(v, "u32", args.span(name))


def random_draw(ctx, span, key: Value, dist: str, shape, dtype: str = "f32", *data, **params) -> Value:
    """ops/random.py's random_draw; params: minval and maxval (uniform), p (bernoulli)."""
    size = 1
    for n in shape:
        size *= n
    if size >= 2**32:
        raise SpmdError(f"random draws of 2**32 elements or more are not supported: {list(shape)}", span)
    return ctx.b.emit("random_draw", key, *data, span=span, dist=dist, dtype=dtype, shape=tuple(shape),
                      **{k: float(v) for k, v in params.items()})


@builtin("prng_key", "seed:tensor", doc="jax.random.PRNGKey(seed): the raw u32[2] threefry key [0, seed mod 2**32]")
def _prng_key(ctx, span, args):
    lo = _u32_scalar(ctx, args, "seed", -2**31)
    hi = ctx.b.emit("full", span=span, dtype="u32", shape=(1,), value=0)
    return ctx.b.emit("concat", hi, ctx.b.emit("reshape", lo, span=span, shape=(1,)), span=span, axis=0)


@builtin("random_split", "key:tensor", "n:int=2", doc="jax.random.split(key, n): u32[n, 2], n new keys")
def _random_split(ctx, span, args):
    if args["n"] < 0:
        raise SpmdError(f"random_split: n must be non-negative, got {args['n']}", args.span("n"))
    return random_draw(ctx, span, _key(ctx, args), "split", (args["n"],), "u32")


@builtin("fold_in", "key:tensor", "data:tensor", doc="jax.random.fold_in(key, data): a new key")
def _fold_in(ctx, span, args):
    return random_draw(ctx, span, _key(ctx, args), "fold_in", (), "u32", _u32_scalar(ctx, args, "data", 0))


def _draw_type(args, dtypes, what) -> TensorType:
    t: TensorType = args["type"]
    if t.dtype not in dtypes:
        raise SpmdError(f"{what} draws {' or '.join(dtypes)}, got {t}", args.span("type"))
    return t


@builtin("random_bits", "key:tensor", "type:type", doc="jax.random.bits(key, shape): u32 random bits")
def _random_bits(ctx, span, args):
    t = _draw_type(args, ("u32",), "random_bits")
    return random_draw(ctx, span, _key(ctx, args), "bits", t.shape, "u32")


@builtin("uniform", "key:tensor", "type:type", "minval:number=0", "maxval:number=1",
         doc="jax.random.uniform(key, shape, dtype, minval, maxval)")
def _uniform(ctx, span, args):
    t = _draw_type(args, ("f32", "bf16", "f16"), "uniform")
    return random_draw(ctx, span, _key(ctx, args), "uniform", t.shape, t.dtype,
                       minval=args["minval"], maxval=args["maxval"])


@builtin("normal", "key:tensor", "type:type", doc="jax.random.normal(key, shape, dtype)")
def _normal(ctx, span, args):
    t = _draw_type(args, ("f32", "bf16", "f16"), "normal")
    return random_draw(ctx, span, _key(ctx, args), "normal", t.shape, t.dtype)


@builtin("bernoulli", "key:tensor", "p:tensor", "type:type", doc="jax.random.bernoulli(key, p, shape): bool")
def _bernoulli(ctx, span, args):
    t = _draw_type(args, ("bool",), "bernoulli")
    p = args["p"]
    if not isinstance(p, Value):
        if isinstance(p, StructValue) or isinstance(p, bool):
            raise SpmdError(f"argument 'p' of bernoulli() must be a number or a float tensor, got {describe(p)}",
                            args.span("p"))
        return random_draw(ctx, span, _key(ctx, args), "bernoulli", t.shape, "f32", p=p)
    # a tensor p, as jax: uniform(key, shape, p's dtype) < p, p broadcast to the shape
    if not T.is_float(p.type.dtype):
        raise SpmdError(f"argument 'p' of bernoulli() must be a number or a float tensor, got {p.type}", args.span("p"))
    draw = random_draw(ctx, span, _key(ctx, args), "uniform", t.shape, p.type.dtype, minval=0.0, maxval=1.0)
    if p.type.shape != t.shape:
        p = ctx.broadcast_to(p, t.shape, args.span("p"))
    return ctx.b.emit("lt", draw, p, span=span)


def _dropout_key(ctx, span, args):
    """flax's nn.Dropout with this key: mask = jax.random.bernoulli(key, 1 - rate, x.shape),
    select(mask, x / (1 - rate), 0); rate 0 is x, rate 1 zeros."""
    key = _key(ctx, args)
    x = tensor(ctx, args, "x")
    rate = args["rate"]
    if not 0 <= rate <= 1:
        raise SpmdError(f"dropout: rate must be in [0, 1], got {rate}", args.span("rate"))
    if not T.is_float(x.type.dtype):
        raise SpmdError(f"dropout needs a float tensor, got {x.type}", args.span("x"))
    if rate == 0:
        return x
    zero = ctx.materialize(0.0, span, x.type.dtype)
    if x.type.rank:
        zero = ctx.b.emit("broadcast_in_dim", zero, span=span, shape=x.type.shape, dims=())
    if rate == 1:
        return zero
    keep = 1.0 - rate
    mask = random_draw(ctx, span, key, "bernoulli", x.type.shape, "f32", p=keep)
    scaled = ctx.b.emit("div", x, ctx.materialize(keep, span, x.type.dtype), span=span)
    return ctx.b.emit("select", mask, scaled, zero, span=span)


_DROPOUT_SEED = BUILTINS.pop("dropout")  # version 2's dropout(x, rate, seed)
builtin("dropout", "key:tensor", "x:tensor", "rate:number",
        doc="flax's nn.Dropout with a key: x / (1 - rate) where jax.random.bernoulli(key, 1 - rate) holds, else 0; "
            "also dropout(x, rate, seed) (version 2)")(_dropout_key)


def _pick_dropout(ctx, node: A.Call, env) -> Builtin:
    """dropout(key, x, rate) when its first argument is a key (u32[2]) or `key=` is given;
    version 2's dropout(x, rate, seed) otherwise."""
    names = {kw.name for kw in node.kwargs}
    if "key" in names:  # positional arguments are then x and rate: dropout(x, 0.1, key=k)
        return _DROPOUT_KEYWORD
    if "seed" in names or not node.args:
        return _DROPOUT_SEED
    arg = node.args[0]
    if isinstance(arg, A.Name) and arg.id in env:
        first = env[arg.id]
    else:
        first = ctx.expr(arg, env)  # evaluated again by the call; the unused copy is dropped
    return BUILTINS["dropout"] if isinstance(first, Value) and first.type == KEY else _DROPOUT_SEED


_DROPOUT_KEYWORD = replace(BUILTINS["dropout"], params=tuple(BUILTINS["dropout"].params[i] for i in (1, 2, 0)))
BUILTINS["dropout"] = replace(BUILTINS["dropout"], pick=_pick_dropout)


# ---------------------------------------------------------------------------------- bitwise (u32 keys and bits)

def _bitwise(name):
    def lower(ctx, span, args):
        if not isinstance(args["a"], Value) and not isinstance(args["b"], Value):
            raise SpmdError(f"{name} needs a tensor operand (cast a literal, e.g. cast(9, u32))", span)
        return ctx.binary(name, args["a"], args["b"], span, args.span("a"), args.span("b"))

    return lower


for _n in ("bitwise_and", "bitwise_or", "bitwise_xor", "left_shift", "right_shift"):
    builtin(_n, "a:tensor", "b:tensor")(_bitwise(_n))


# ---------------------------------------------------------------------------------- constants


@builtin("iota", "type:type", "axis:int=0")
def _iota(ctx, span, args):
    t: TensorType = args["type"]
    if t.rank == 0:
        raise SpmdError("iota needs a shape of rank >= 1", args.span("type"))
    axis = norm_axis(args["axis"], t.rank, args.span("axis"))
    return ctx.b.emit("iota", span=span, dtype=t.dtype, shape=t.shape, axis=axis, blame={"dtype": args.span("type")})


def _filled(value):
    def lower(ctx, span, args):
        t: TensorType = args["type"]
        v = args.values.get("value", value)
        v = scalar_value(v, t.dtype, args.span("value"), "full: ")
        return ctx.b.emit("full", span=span, dtype=t.dtype, shape=t.shape, value=v)

    return lower


builtin("zeros", "type:type")(_filled(0))
builtin("ones", "type:type")(_filled(1))
builtin("full", "type:type", "value:number")(_filled(None))

