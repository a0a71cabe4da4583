"""Inclusive scans along one axis: cumsum, cumprod, cummax (optionally from the end).

The scanned dim is a permutation factor (every element reads the ones before it); the others pass
through. Split along the scanned dim, each shard scans its own block (padding masked with the
scan's identity), one all_gather of the per-shard totals (one value per row and shard, never the
row) gives every shard the combination of the shards before it, and a local combine finishes.
"""

from __future__ import annotations

import numpy as np

from ..ir import types as T
from ..ir.mesh import Sharding
from ..partition.factors import PASS, PERMUTATION, RuleBuilder
from .reduce import _fill
from .registry import Family, check, operand_flops, register

# op -> (numpy ufunc, jax combine function, reduction primitive, reduce kind). jax emits an
# associative_scan: jax.lax.cumsum/cummax lower to reduce_window on CPU, and XLA's SPMD partitioner
# gives wrong answers for two such windows of one split operand with different init values (a
# cummax and a cumsum of x along its split dim: the cumsum comes back -inf).
_SCANS = {
    "cumsum": (np.add, "jnp.add", "reduce_sum", "sum"),
    "cumprod": (np.multiply, "jnp.multiply", "reduce_prod", "prod"),
    "cummax": (np.maximum, "jnp.maximum", "reduce_max", "max"),
}
_COMBINE = {"cumsum": "add", "cumprod": "mul", "cummax": "maximum"}


def _infer(name):
    def infer(operands, attrs):
        (x,) = operands
        check(T.kind(x.dtype) in ("float", "int"), f"{name} needs a numeric operand, got {x}; cast it first")
        check(0 <= attrs["axis"] < x.rank, f"{name}: bad axis {attrs['axis']} for {x}")
        return x

    return infer


def _rule(operands, results, attrs):
    (x,) = operands
    b = RuleBuilder()
    fs = [b.factor(n, PERMUTATION if i == attrs["axis"] else PASS) for i, n in enumerate(x.shape)]
    return b.build([[(f,) for f in fs]], [[(f,) for f in fs]])


def _numpy(ufunc):
    def run(x, *, axis, reverse):
        wide = x.astype(np.float32) if T.np_is_narrow_float(x.dtype) else x
        if reverse:
            wide = np.flip(wide, axis)
        out = ufunc.accumulate(wide, axis=axis, dtype=wide.dtype)
        if reverse:
            out = np.flip(out, axis)
        return np.asarray(out).astype(x.dtype)

    return run


def _jax(fn):
    def emit(args, attrs, out):
        dt = out[0].dtype
        x = args[0]
        if T.np_is_narrow_float(T.np_dtype(dt)):
            x = f"{x}.astype(jnp.float32)"
        text = f"jax.lax.associative_scan({fn}, {x}, reverse={attrs['reverse']}, axis={attrs['axis']})"
        return f"{text}.astype({T.jnp_dtype(dt)})" if x != args[0] else text

    return emit


def _partition(name):
    def partition(ctx):
        (x,) = ctx.op.operands
        axis, reverse = ctx.attrs["axis"], ctx.attrs["reverse"]
        cur, out = ctx.layout(0), ctx.target()
        # keep the operand's splits (no input communication); add the result's where they are free
        used = {a for d in cur.dims for a in d}
        dims = tuple(c if c else (o if not (set(o) & used) else ()) for c, o in zip(cur.dims, out.dims))
        local = ctx.reshard(0, Sharding(dims))
        axes = dims[axis]
        if not axes:
            ctx.set_result(ctx.emit(name, local, axis=axis, reverse=reverse), Sharding(dims))
            return
        _, _, reducer, kind = _SCANS[name]
        identity = _fill(kind)(x.type.dtype)
        local = ctx.mask(local, axis, axes, x.type.shape[axis], identity)
        scanned = ctx.emit(name, local, axis=axis, reverse=reverse)
        c = local.type.shape[axis]
        end = 0 if reverse else c - 1
        total = ctx.slice_dim(scanned, axis, end, end + 1)  # this shard's total, one per row
        totals = ctx.collective("all_gather", total, "the per-shard totals", axes=axes, dim=axis)
        pos = ctx.emit("iota", dtype="i32", shape=totals.type.shape, axis=axis)
        before = ctx.emit("gt" if reverse else "lt", pos, ctx.emit(
            "broadcast_in_dim", ctx.axis_index(axes), shape=totals.type.shape, dims=()))
        fill = ctx.emit("full", dtype=x.type.dtype, shape=totals.type.shape, value=identity)
        prefix = ctx.emit(reducer, ctx.emit("select", before, totals, fill), axes=(axis,))
        prefix = ctx.emit("broadcast_in_dim", prefix, shape=scanned.type.shape,
                          dims=tuple(d for d in range(x.type.rank) if d != axis))
        ctx.set_result(ctx.emit(_COMBINE[name], scanned, prefix), Sharding(dims))

    return partition


for _name, (_ufunc, _lax, _, _kind) in _SCANS.items():
    register(_name, doc=f"inclusive running {_kind} along `axis` (from the end when `reverse`)",
             example=(("f32[8, 16]",), {"axis": 1, "reverse": False}),
             infer=_infer(_name), numpy=_numpy(_ufunc), rule=_rule, jax=_jax(_lax), partition=_partition(_name),
             flops=operand_flops, family=Family.reduce)
