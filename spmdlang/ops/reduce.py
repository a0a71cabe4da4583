"""Reductions over a set of axes, and arg-reductions over one axis.

Reduced dims are reduction factors: split, each shard reduces locally (padding masked with the
reduction's identity, `reduce_fill`) and one collective combines the shards.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from ..ir import types as T
from ..ir.mesh import Sharding
from ..ir.types import TensorType
from ..partition.factors import PASS, REDUCTION, RuleBuilder
from . import extremes
from .registry import Family, Grad, PartialMode, ReduceKind, check, operand_flops, register, set_vjp


def _reduce_infer(name):
    def infer(operands, attrs):
        (x,) = operands
        axes = attrs["axes"]
        check(T.kind(x.dtype) in ("float", "int"), f"{name} needs a numeric operand, got {x}; cast it first")
        check(all(0 <= a < x.rank for a in axes) and len(set(axes)) == len(axes),
              f"{name}: bad axes {list(axes)} for {x}")
        if name in ("reduce_max", "reduce_min"):
            check(all(x.shape[a] > 0 for a in axes),
                  f"{name.removeprefix('reduce_')} over an empty dimension has no identity", blame="axes")
        return TensorType(x.dtype, tuple(n for i, n in enumerate(x.shape) if i not in axes))

    return infer


def _reduce_rule(operands, results, attrs):
    (x,) = operands
    b = RuleBuilder()
    dims, out = [], []
    for i, n in enumerate(x.shape):
        f = b.factor(n, REDUCTION if i in attrs["axes"] else PASS)
        dims.append((f,))
        if i not in attrs["axes"]:
            out.append((f,))
    return b.build([dims], [out])


def _fill(kind):
    """The identity of a reduction for a dtype: what padding must look like to change nothing."""
    def fill(dtype: str):
        if kind == "sum":
            return 0
        if kind == "prod":
            return 1
        if T.is_float(dtype):
            return -np.inf if kind == "max" else np.inf
        info = np.iinfo(T.np_dtype(dtype))
        return info.min if kind == "max" else info.max

    return fill


_REDUCE = {
    "reduce_sum": (np.sum, "jnp.sum", ReduceKind.sum),
    "reduce_prod": (np.prod, "jnp.prod", ReduceKind.prod),
    "reduce_max": (partial(extremes.reduce, "max"), "jnp.max", ReduceKind.max),
    "reduce_min": (partial(extremes.reduce, "min"), "jnp.min", ReduceKind.min),
}


def _reduce_numpy(fn):
    def run(x, *, axes, shift=False):  # (shift: see _SHIFT_DOC's comment)
        acc = np.float32 if T.np_is_narrow_float(x.dtype) else None
        if fn in (np.sum, np.prod) and x.dtype.kind in "iu":
            acc = x.dtype  # numpy would widen ints to int64; keep wrap-around semantics of i32
        out = fn(x, axis=tuple(axes), dtype=acc) if fn in (np.sum, np.prod) else fn(x, axis=tuple(axes))
        return np.asarray(out).astype(x.dtype)

    return run


def _reduce_jax(fn):
    def emit(args, attrs, out):
        # jnp.sum/prod widen small ints to the default int (int64 once the module enables x64): keep
        # the op's dtype, as the IR types it and numpy computes it (wrapping)
        widens = T.is_int(out[0].dtype) and fn in ("jnp.sum", "jnp.prod")
        keep = f", dtype={T.jnp_dtype(out[0].dtype)}" if widens else ""
        return f"{fn}({args[0]}, axis={tuple(attrs['axes'])}{keep})"

    return emit


def _reduce_jax_local(name, fn):
    """Our module's form: the jax.lax reduction jnp's binds, without jnp's jitted wrapper (a trace
    of its own per shape); bf16 and f16 keep jnp's form (sum and prod run in f32, rounded once),
    as does a reduction over no axes."""
    jnp_form = _reduce_jax(fn)

    def emit(args, attrs, out):
        if T.np_is_narrow_float(T.np_dtype(out[0].dtype)) or not attrs["axes"]:
            return jnp_form(args, attrs, out)
        return f"jax.lax.{name}({args[0]}, {tuple(attrs['axes'])})"

    return emit


# reduce_max's and reduce_min's `shift=True`: NaN in x makes the consumer's result what it is
# whatever the extreme is: a max that only shifts values whose result it cancels from (logsumexp,
# softmax, log_softmax: where x holds a NaN that result is NaN), or the shards' extremes of a split
# argmax / argmin (a shard holding NaN ranks its index first without the extreme). Its all_reduce
# may then be XLA's own, which drops NaN on CPU (docs/known_xla_issues.md #8), without the helper's
# NaN-keeping integer keys (ops.collective reads it from the all_reduce's `operand_hints`); ref and
# sim compute the extreme as ever. A hint (the op table's `hints`): CSE merges a shift with a plain
# max of the same operand into the plain one.
_SHIFT_DOC = "; `shift=true`: NaN decides its consumer without it (logsumexp's shift, argmax's shard extremes)"

for _name, (_fn, _jax, _kind) in _REDUCE.items():
    _extreme = _kind in ("max", "min")
    register(_name, doc=f"{_kind} over `axes`, which the result drops" + (_SHIFT_DOC if _extreme else ""),
             example=(("f32[8, 16, 4]",), {"axes": (1,)}),
             infer=_reduce_infer(_name), numpy=_reduce_numpy(_fn), rule=_reduce_rule,
             jax=_reduce_jax(_jax), jax_local=_reduce_jax_local(_name, _jax),
             reduce_fill=_fill(_kind), reduce_kind=_kind, flops=operand_flops,
             hints=("shift",) if _extreme else (),
             partial=PartialMode.additive if _kind == "sum" else None, family=Family.reduce)


def _arg_infer(name):
    def infer(operands, attrs):
        (x,) = operands
        check(T.kind(x.dtype) in ("float", "int"), f"{name} needs a numeric operand, got {x}")
        axis = attrs["axis"]
        check(0 <= axis < x.rank, f"{name}: bad axis {axis} for {x}")
        check(x.shape[axis] > 0, f"{name} of an empty dimension", blame="axis")
        return TensorType("i32", tuple(n for i, n in enumerate(x.shape) if i != axis))

    return infer


def _arg_rule(operands, results, attrs):
    return _reduce_rule(operands, results, {"axes": (attrs["axis"],)})


def _arg_partition(kind):
    """Split along the arg axis: each shard finds its local extreme and its global index, then an
    all_reduce of the values picks the extreme and an all_reduce(min) of the indices that attain
    it picks the first, as numpy does. A NaN is the extreme (the index of the first NaN, as
    jnp.argmax and np.argmax give): a shard whose own extreme is NaN offers its first NaN's index
    ranked before every other, so the values' all_reduce need not keep NaN. Otherwise local
    (generic)."""
    def partition(ctx):
        (x,) = ctx.op.operands
        axis = ctx.attrs["axis"]
        s = ctx.layout(0)
        axes = s.dims[axis]
        if not axes:
            return ctx.generic()
        local = ctx.reshard(0, Sharding(s.dims))
        fill = _fill("max" if kind == "argmax" else "min")(x.type.dtype)
        local = ctx.mask(local, axis, axes, x.type.shape[axis], fill)
        reducer = "reduce_max" if kind == "argmax" else "reduce_min"
        n = x.type.shape[axis]
        # `shift`: a NaN among the shards' extremes decides the result below without the
        # collective's extreme, which may then drop NaN (XLA's own all-reduce; see _SHIFT_DOC)
        best = ctx.emit(reducer, local, axes=(axis,), shift=True)
        idx = ctx.emit(kind, local, axis=axis)
        idx = ctx.emit("add", idx, ctx.offset(axes, local.type.shape[axis]))
        top = ctx.collective("all_reduce", best, "the shards' extremes", axes=axes,
                             reduce="max" if kind == "argmax" else "min")

        def fill(v):
            c = ctx.constant(v, "i32")
            return ctx.emit("broadcast_in_dim", c, shape=idx.type.shape, dims=()) if idx.type.rank else c

        cand = ctx.emit("select", ctx.emit("eq", best, top), idx, fill(int(np.iinfo(np.int32).max)))
        if T.is_float(x.type.dtype):
            # NaN is the extreme (jax's and numpy's argmax): a shard whose extreme is NaN offers
            # its first NaN's index less n, below every index that attains a number
            nan = ctx.emit("ne", best, best)
            cand = ctx.emit("select", nan, ctx.emit("sub", idx, fill(n)), cand)
        first = ctx.collective("all_reduce", cand, "the first index attaining it", axes=axes, reduce="min")
        if T.is_float(x.type.dtype):
            first = ctx.emit("select", ctx.emit("lt", first, fill(0)), ctx.emit("add", first, fill(n)), first)
        ctx.set_result(first, Sharding(tuple(d for i, d in enumerate(s.dims) if i != axis)))

    return partition


# Our module's arg-reductions: jnp.argmax's values (the first extreme; the first NaN where there is
# one) from two plain reductions, not jax.lax.argmax's variadic reduce. XLA's CPU backend fuses an
# elementwise producer into the reduce, and with a variadic one and a long producer (a random
# draw's ~100-op hash: argmax(uniform(key, f32[7, 8]))) LLVM runs for many minutes; a max then a
# min of indices compile in milliseconds. The max is the one a softmax beside it computes (CSE).
_ARG_HELPER = '''
def {name}(x, axis):
    """jnp.{name}(x, axis) as int32: the index of the first {which} element, or of the first NaN."""
    n = x.shape[axis]
    kt = np.float32 if n <= 2 ** 24 else np.int32  # (float keys: XLA reduces them in one kernel)
    kept = [d for d in range(x.ndim) if d != axis]
    extreme = jax.lax.broadcast_in_dim(jax.lax.{reduce}(x, (axis,)), x.shape, kept)
    at = jax.lax.broadcasted_iota(kt, x.shape, axis)
    key = jax.lax.select(jax.lax.eq(x, extreme), at, jax.lax.full(x.shape, n, kt))
    if jnp.issubdtype(x.dtype, jnp.inexact):  # a NaN ranks first: its key is below every other
        key = jax.lax.select(jax.lax.ne(x, x), jax.lax.sub(at, kt(n)), key)
    first = jax.lax.convert_element_type(jax.lax.reduce_min(key, (axis,)), np.int32)
    return jax.lax.select(jax.lax.lt(first, np.int32(0)), jax.lax.add(first, np.int32(n)), first)
'''

for _name, _which, _fn, _reduce in (("argmax", "largest", np.argmax, "reduce_max"),
                                    ("argmin", "smallest", np.argmin, "reduce_min")):
    register(_name, doc=f"index of the first {_which} element along `axis` (i32)",
             example=(("f32[8, 16]",), {"axis": 1}), infer=_arg_infer(_name), partition=_arg_partition(_name),
             flops=operand_flops,
             numpy=lambda x, *, axis, _fn=_fn: _fn(x, axis=axis).astype(np.int32), rule=_arg_rule,
             jax=lambda a, attrs, out, _name=_name: f"jnp.{_name}({a[0]}, axis={attrs['axis']}).astype(jnp.int32)",
             jax_local=lambda a, attrs, out, _name=_name: f"{_name}({a[0]}, {attrs['axis']})",
             jax_helper=_ARG_HELPER.format(name=_name, which=_which, reduce=_reduce),
             family=Family.reduce)


# ---------------------------------------------------------------------------------- derivatives


def _kept(x, axes):
    return tuple(i for i in range(x.type.rank) if i not in axes)


def _reduce_sum_vjp(d, op, ct):
    (x,) = op.operands
    return (d.emit("broadcast_in_dim", ct, shape=x.type.shape, dims=_kept(x, op.attrs["axes"])),)


def _chooser_vjp(d, op, ct):
    """jax's: the cotangent is shared equally by every element attaining the max (min)."""
    (x,) = op.operands
    dims = _kept(x, op.attrs["axes"])
    y = d.emit("broadcast_in_dim", op.result, shape=x.type.shape, dims=dims)
    hit = d.emit("cast", d.emit("eq", x, y), dtype=x.type.dtype)
    count = d.emit("reduce_sum", hit, axes=tuple(op.attrs["axes"]))
    share = d.emit("div", ct, count)
    return (d.mul(hit, d.emit("broadcast_in_dim", share, shape=x.type.shape, dims=dims)),)


def _exclusive(d, x, axis: int, reverse: bool):
    """The product of the elements before (after, with `reverse`) each one along `axis`."""
    n = x.type.shape[axis]
    rank = x.type.rank
    inc = d.emit("cumprod", x, axis=axis, reverse=reverse)
    lo = tuple(1 if i == axis and not reverse else 0 for i in range(rank))
    hi = tuple(1 if i == axis and reverse else 0 for i in range(rank))
    padded = d.emit("pad", inc, lo=lo, hi=hi, value=1.0)
    start = 1 if reverse else 0
    return d.emit("slice", padded, starts=tuple(start if i == axis else 0 for i in range(rank)),
                  stops=tuple(start + n if i == axis else s for i, s in enumerate(padded.type.shape)),
                  steps=(1,) * rank)


def _reduce_prod_vjp(d, op, ct):
    """d prod / d x_i is the product of the others: the exclusive products from both sides along the
    reduced elements laid out as one axis (exact with zeros, as jax's rule)."""
    (x,) = op.operands
    axes = tuple(op.attrs["axes"])
    keep = _kept(x, axes)
    perm = keep + axes
    t = d.emit("transpose", x, perm=perm) if perm != tuple(range(x.type.rank)) else x
    rest = tuple(x.type.shape[i] for i in keep)
    k = 1
    for a in axes:
        k *= x.type.shape[a]
    flat = d.emit("reshape", t, shape=rest + (k,))
    last = len(rest)
    others = d.mul(_exclusive(d, flat, last, False), _exclusive(d, flat, last, True))
    g = d.mul(others, d.emit("broadcast_in_dim", ct, shape=flat.type.shape, dims=tuple(range(last))))
    g = d.emit("reshape", g, shape=t.type.shape)
    if t is not x:
        inv = tuple(sorted(range(len(perm)), key=lambda i: perm[i]))
        g = d.emit("transpose", g, perm=inv)
    return (g,)


set_vjp("reduce_sum", _reduce_sum_vjp)
set_vjp("reduce_max", _chooser_vjp)
set_vjp("reduce_min", _chooser_vjp)
set_vjp("reduce_prod", _reduce_prod_vjp)
set_vjp("argmax", Grad.none)
set_vjp("argmin", Grad.none)
