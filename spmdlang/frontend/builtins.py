"""The builtins of the language: signatures, argument checking, and lowering to primitives.

This is the one place where composites (mean, softmax, logsumexp, one_hot, ...) are expanded into
op-table primitives; everything downstream sees primitives only. A lowering gets the `Lowerer` as
`ctx` (lower.py imports this module; this module never imports lower.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import Span, SpmdError
from ..ir import types as T
from ..ir.core import Value
from ..ir.types import TensorType
from . import ast as A
from .values import Dtype, StaticType, describe, did_you_mean, float_for, scalar_value

_REQUIRED = object()


@dataclass(frozen=True)
class Builtin:
    name: str
    params: tuple[tuple[str, str, Any], ...]  # (name, kind, default)
    lower: Callable
    doc: str = ""


BUILTINS: dict[str, Builtin] = {}


def builtin(name: str, *params: str, doc: str = ""):
    """Declare a builtin. Params are "name:kind" or "name:kind=default" (default as text)."""
    parsed = []
    for p in params:
        head, has_default, default = p.partition("=")
        pname, _, kind = head.partition(":")
        parsed.append((pname, kind, _parse_default(default) if has_default else _REQUIRED))

    def register(fn):
        BUILTINS[name] = Builtin(name, tuple(parsed), fn, doc)
        return fn

    return register


def _parse_default(text: str):
    if text in ("None", "true", "false"):
        return {"None": None, "true": True, "false": False}[text]
    try:
        return int(text)
    except ValueError:
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


def call_builtin(ctx, b: Builtin, node: A.Call, env) -> Any:
    names = [p[0] for p in b.params]
    variadic = b.params and b.params[-1][1] == "tensors*"
    values: dict[str, Any] = {}
    spans: dict[str, Span] = {}
    if not variadic and len(node.args) > len(names):
        raise SpmdError(f"{b.name}() takes at most {len(names)} argument(s) ({', '.join(names)}), "
                        f"got {len(node.args)}", node.args[len(names)].span)
    for i, a in enumerate(node.args):
        if variadic and i >= len(names) - 1:
            values.setdefault(names[-1], []).append(_eval_arg(ctx, b, "tensor", a, env, names[-1]))
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
            if kind == "tensors*":
                raise SpmdError(f"{b.name}() needs at least one tensor argument", node.span)
            if default is _REQUIRED:
                raise SpmdError(f"{b.name}() is missing argument '{pname}'", node.span)
            values[pname] = default
    return b.lower(ctx, node.span, Args(values, spans, node))


def _eval_arg(ctx, b: Builtin, kind: str, node, env, pname):
    where = f"argument '{pname}' of {b.name}()"
    if kind == "spec":
        if not isinstance(node, A.SpecExpr):
            raise SpmdError(f"{where} must be a sharding spec such as {{data, _}}", node.span)
        return node
    v = ctx.expr(node, env)
    if kind in ("tensor", "any"):
        if kind == "tensor" and not isinstance(v, (Value, int, float, bool)):
            raise SpmdError(f"{where} must be a tensor, got {describe(v)}", node.span)
        return v
    if kind == "tensors":
        if not isinstance(v, list) or not v or not all(isinstance(x, Value) for x in v):
            raise SpmdError(f"{where} must be a non-empty list of tensors, e.g. [a, b]", node.span)
        return v
    if kind == "int":
        if isinstance(v, bool) or not isinstance(v, int):
            raise SpmdError(f"{where} must be a static integer, got {describe(v)}", node.span)
        return v
    if kind == "number":
        if isinstance(v, Value) or not isinstance(v, (int, float, bool)):
            raise SpmdError(f"{where} must be a number, got {describe(v)}", node.span)
        return v
    if kind == "axes":  # int, list of ints, or None
        if v is None:
            return None
        items = v if isinstance(v, list) else [v]
        for x in items:
            if isinstance(x, bool) or not isinstance(x, int):
                raise SpmdError(f"{where} must be an integer or a list of integers, got {describe(v)}", node.span)
        return v
    if kind == "ints":
        if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            raise SpmdError(f"{where} must be a list of integers, e.g. [4, 8], got {describe(v)}", node.span)
        return v
    if kind == "bool":
        if not isinstance(v, bool):
            raise SpmdError(f"{where} must be true or false, got {describe(v)}", node.span)
        return v
    if kind == "dtype":
        if not isinstance(v, Dtype):
            raise SpmdError(f"{where} must be a dtype ({', '.join(T.DTYPES)}), got {describe(v)}", node.span)
        return v.name
    if kind == "type":
        if not isinstance(v, StaticType):
            raise SpmdError(f"{where} must be a type such as f32[4, 8], got {describe(v)}", node.span)
        return v.type
    if kind == "str":
        if not isinstance(v, str):
            raise SpmdError(f"{where} must be a string, got {describe(v)}", node.span)
        return v
    return v


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


# ---------------------------------------------------------------------------------- elementwise

_UNARY = ["neg", "abs", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "relu", "gelu", "sin", "cos",
          "floor", "ceil", "sign", "logical_not"]
_FLOAT_ONLY = {"exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "gelu", "sin", "cos", "floor", "ceil"}


def _unary(name):
    def lower(ctx, span, args):
        x = args["x"]
        if not isinstance(x, Value):
            x = ctx.materialize(x, args.span("x"), "f32" if name in _FLOAT_ONLY else None)
        if name in _FLOAT_ONLY and T.is_int(x.type.dtype):
            x = ctx.cast(x, float_for(x.type.dtype), span)  # numpy computes float functions of ints in floats
        return ctx.b.emit(name, x, span=span)

    return lower


for _n in _UNARY:
    builtin(_n, "x:tensor")(_unary(_n))


def _binary(name):
    def lower(ctx, span, args):
        return ctx.binary(name, args["a"], args["b"], span, args.span("a"), args.span("b"))

    return lower


for _n in ("maximum", "minimum", "pow", "logical_and", "logical_or"):
    builtin(_n, "a:tensor", "b:tensor")(_binary(_n))


@builtin("where", "cond:tensor", "a:tensor", "b:tensor")
def _where(ctx, span, args):
    c = args["cond"]
    if not isinstance(c, Value) and not isinstance(c, bool):
        raise SpmdError(f"where: the condition must be bool, got {describe(c)}", args.span("cond"))
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


# ---------------------------------------------------------------------------------- reductions


def _keep(ctx, v, shape, axes, keepdims, span):
    if not keepdims:
        return v
    out = tuple(1 if i in axes else n for i, n in enumerate(shape))
    return ctx.b.emit("reshape", v, span=span, shape=out)


def _reduce(kind):
    def lower(ctx, span, args):
        x = tensor(ctx, args, "x")
        axes = norm_axes(args["axis"], x.type.rank, args.span("axis"))
        dt = x.type.dtype
        if dt == "bool":
            x = ctx.cast(x, "i32", span)
        if kind == "mean" and T.is_int(x.type.dtype):
            x = ctx.cast(x, float_for(x.type.dtype), span)
        prim = {"mean": "reduce_sum"}.get(kind, f"reduce_{kind}")
        out = ctx.b.emit(prim, x, span=span, axes=axes, blame={"axes": args.span("axis")})
        if kind == "mean":
            count = 1
            for a in axes:
                count *= x.type.shape[a]
            out = ctx.b.emit("div", out, ctx.materialize(float(count), span, out.type.dtype), span=span)
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


def _expand_back(ctx, v, shape, axes, span):
    """A reduction's result broadcast back over the reduced axes (keepdims + broadcast in one op)."""
    kept = tuple(i for i in range(len(shape)) if i not in axes)
    return ctx.b.emit("broadcast_in_dim", v, span=span, shape=tuple(shape), dims=kept)


@builtin("softmax", "x:tensor", "axis:axes=-1", doc="exp(x - max) / sum(exp(x - max))")
def _softmax(ctx, span, args):
    x = tensor(ctx, args, "x")
    if not T.is_float(x.type.dtype):
        x = ctx.cast(x, float_for(x.type.dtype), span)
    axes = norm_axes(args["axis"], x.type.rank, args.span("axis"))
    m = _expand_back(ctx, ctx.b.emit("reduce_max", x, span=span, axes=axes), x.type.shape, axes, span)
    e = ctx.b.emit("exp", ctx.b.emit("sub", x, m, span=span), span=span)
    s = _expand_back(ctx, ctx.b.emit("reduce_sum", e, span=span, axes=axes), x.type.shape, axes, span)
    return ctx.b.emit("div", e, s, span=span)


@builtin("logsumexp", "x:tensor", "axis:axes=-1", "keepdims:bool=false",
         doc="max + log(sum(exp(x - max))), with a max of -inf treated as 0")
def _logsumexp(ctx, span, args):
    x = tensor(ctx, args, "x")
    if not T.is_float(x.type.dtype):
        x = ctx.cast(x, float_for(x.type.dtype), span)
    axes = norm_axes(args["axis"], x.type.rank, args.span("axis"))
    m = ctx.b.emit("reduce_max", x, span=span, axes=axes)
    # rows that are all -inf would give -inf - -inf = nan; shift those by 0 instead
    m = ctx.b.emit("select", ctx.binary("eq", m, float("-inf"), span), ctx.materialize(0.0, span, m.type.dtype),
                   m, span=span)
    e = ctx.b.emit("exp", ctx.b.emit("sub", x, _expand_back(ctx, m, x.type.shape, axes, span), span=span), span=span)
    out = ctx.b.emit("add", ctx.b.emit("log", ctx.b.emit("reduce_sum", e, span=span, axes=axes), span=span), m,
                     span=span)
    return _keep(ctx, out, x.type.shape, axes, args["keepdims"], span)


# ---------------------------------------------------------------------------------- contractions


@builtin("einsum", "spec:str", "operands:tensors*")
def _einsum(ctx, span, args):
    ops = args["operands"]
    if len(ops) not in (1, 2):
        raise SpmdError(f"einsum takes one or two operands, got {len(ops)}", span)
    for v in ops:
        if not isinstance(v, Value):
            raise SpmdError(f"einsum operands must be tensors, got {describe(v)}", span)
    dt = ops[0].type.dtype
    for v in ops[1:]:
        dt = T.promote(dt, v.type.dtype)
    ops = [ctx.cast(v, dt, span) for v in ops]
    return ctx.b.emit("einsum", *ops, span=span, spec=args["spec"].replace(" ", ""))


@builtin("conv", "x:tensor", "w:tensor", "stride:any=1", "padding:any=SAME")
def _conv(ctx, span, args):
    x, w = tensor(ctx, args, "x"), tensor(ctx, args, "w")
    nsp = x.type.rank - 2
    if nsp not in (1, 2):
        raise SpmdError(f"conv supports 1-D and 2-D inputs [N, spatial..., C]; got {x.type}", args.span("x"))
    if w.type.rank != nsp + 2:
        raise SpmdError(f"conv kernel must be [window..., C, F] with {nsp} window dim(s), got {w.type}",
                        args.span("w"))
    stride = args["stride"]
    strides = stride if isinstance(stride, list) else [stride] * nsp
    if len(strides) != nsp or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in strides):
        raise SpmdError(f"conv stride must be a positive integer or a list of {nsp}", args.span("stride"))
    pad = args["padding"]
    if pad in ("SAME", "VALID"):
        padding = []
        for i in range(nsp):
            n, k, s = x.type.shape[1 + i], w.type.shape[i], strides[i]
            if pad == "VALID":
                padding.append((0, 0))
            else:
                out = -(-n // s)
                total = max((out - 1) * s + k - n, 0)
                padding.append((total // 2, total - total // 2))
    elif isinstance(pad, list) and len(pad) == nsp and all(
            isinstance(p, list) and len(p) == 2 and all(isinstance(q, int) and not isinstance(q, bool) and q >= 0
                                                         for q in p) for p in pad):
        padding = [tuple(p) for p in pad]
    else:
        raise SpmdError(f'conv padding must be "SAME", "VALID" or [[lo, hi]] x {nsp} of non-negative integers',
                        args.span("padding"))
    dt = T.promote(x.type.dtype, w.type.dtype)
    dt = float_for(dt)
    x, w = ctx.cast(x, dt, span), ctx.cast(w, dt, span)
    return ctx.b.emit("conv", x, w, span=span, strides=tuple(strides), padding=tuple(padding))


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
    ok = isinstance(w, list) and all(
        isinstance(p, list) and len(p) == 2 and all(isinstance(q, int) and not isinstance(q, bool) for q in p)
        for p in w)
    if not ok:
        raise SpmdError("pad: widths must be [[lo, hi], ...] of integers", args.span("widths"))
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
        raise SpmdError("roll: shift and axis must be integers (or lists of equal length)", span)
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

