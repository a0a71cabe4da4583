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
from . import extremes
from .reduce import _fill
from .registry import Family, check, operand_flops, register, set_vjp

# op -> (numpy ufunc, jax combine function, reduction primitive, reduce kind). The XLA baseline
# emits an associative_scan: jax.lax.cumsum/cummax lower to reduce_window on CPU, and XLA's SPMD
# partitioner gives wrong answers for two such windows of one split operand with different init
# values (a cummax and a cumsum of x along its split dim: the cumsum comes back -inf). Our module
# scans each shard's block, which no partitioner touches, with jax.lax's own scans: the
# associative_scan's interleave adds +0.0 padding, which turns a -0.0 product or maximum into +0.0
# (cumprod of [-0.0, 2.0] is [+0.0, +0.0] where jnp.cumprod gives [-0.0, -0.0]).
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
        if ufunc is np.maximum:
            out = extremes.accumulate("max", wide, axis)
        else:
            out = ufunc.accumulate(wide, axis=axis, dtype=wide.dtype)
        if ufunc is np.add and wide.dtype.kind == "f":
            out = out + wide.dtype.type(0)  # jax's cumsum starts from +0.0: a run of -0.0 sums to +0.0
        if reverse:
            out = np.flip(out, axis)
        return np.asarray(out).astype(x.dtype)

    return run


def _jax(call):
    """The scan as `call` writes it (text with {x}, {axis}, {reverse}), narrow floats scanned in f32."""
    def emit(args, attrs, out):
        dt = out[0].dtype
        x = args[0]
        if T.np_is_narrow_float(T.np_dtype(dt)):
            x = f"{x}.astype(jnp.float32)"
        text = call.format(x=x, axis=attrs["axis"], reverse=attrs["reverse"])
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
        if not axes or local.type.shape[axis] == 0:  # an empty scan dim: nothing to carry over
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
             infer=_infer(_name), numpy=_numpy(_ufunc), rule=_rule,
             jax=_jax(f"jax.lax.associative_scan({_lax}, {{x}}, reverse={{reverse}}, axis={{axis}})"),
             jax_local=_jax(f"jax.lax.{_name}({{x}}, axis={{axis}}, reverse={{reverse}})"),
             partition=_partition(_name), flops=operand_flops, family=Family.reduce)


# ---------------------------------------------------------------------------------- derivatives


def _cumsum_vjp(d, op, ct):
    return (d.emit("cumsum", ct, axis=op.attrs["axis"], reverse=not op.attrs["reverse"]),)


def _pairs(d, x, axis: int, reverse: bool):
    """x with its scan axis moved last and a new axis i before it: (xt [R..., n], inc [R..., n, n]
    where inc[..., i, j] says that element j is in the scan up to i, i.e. j <= i, or j >= i with
    `reverse`), and the permutation used."""
    rank = x.type.rank
    perm = tuple(i for i in range(rank) if i != axis) + (axis,)
    xt = d.emit("transpose", x, perm=perm) if perm != tuple(range(rank)) else x
    n = x.type.shape[axis]
    shape = xt.type.shape[:-1] + (n, n)
    i = d.emit("iota", dtype="i32", shape=shape, axis=rank - 1)
    j = d.emit("iota", dtype="i32", shape=shape, axis=rank)
    inc = d.emit("ge" if reverse else "le", j, i)
    return xt, inc, perm, i, j


def _back(d, g, perm):
    if perm == tuple(range(len(perm))):
        return g
    inv = tuple(sorted(range(len(perm)), key=lambda k: perm[k]))
    return d.emit("transpose", g, perm=inv)


def _cumprod_vjp(d, op, ct):
    """d y_j / d x_i is the product of x_k over the scan up to j with k != i (exact with zeros):
    for each i, a cumprod of x with element i replaced by 1; O(n^2) along the scan axis."""
    (x,) = op.operands
    axis, reverse = op.attrs["axis"], op.attrs["reverse"]
    xt, inc, perm, i, j = _pairs(d, x, axis, reverse)
    rank = x.type.rank
    shape = inc.type.shape
    xs = d.emit("broadcast_in_dim", xt, shape=shape, dims=tuple(range(rank - 1)) + (rank,))
    ones = d.emit("full", dtype=x.type.dtype, shape=shape, value=1.0)
    m = d.select(d.emit("eq", i, j), ones, xs)  # m[..., i, j]: x_j, or 1 at j = i
    p = d.emit("cumprod", m, axis=rank, reverse=reverse)  # p[..., i, j]: prod over the scan to j, k != i
    ctt = d.emit("transpose", ct, perm=perm) if xt is not x else ct
    cts = d.emit("broadcast_in_dim", ctt, shape=shape, dims=tuple(range(rank - 1)) + (rank,))
    # element i contributes to y_j when i is in the scan up to j: j >= i (j <= i with reverse)
    reach = d.emit("ge" if not reverse else "le", j, i)
    terms = d.select(reach, d.mul(cts, p), d.zeros(p.type))
    g = d.emit("reduce_sum", terms, axes=(rank,))
    return (_back(d, g, perm),)


def _cummax_vjp(d, op, ct):
    """Each y_j's cotangent goes to the elements of its scan that attain it, shared equally on
    ties (as reduce_max's rule). jax's cummax differs on ties only: it differentiates its
    associative scan's tree of pairwise maxima, which splits a tie unevenly by position; equal
    shares do not depend on how the scan is computed (tests/test_vjp.py checks both cases)."""
    (x,) = op.operands
    axis, reverse = op.attrs["axis"], op.attrs["reverse"]
    xt, inc, perm, i, j = _pairs(d, x, axis, reverse)
    rank = x.type.rank
    shape = inc.type.shape
    yt = d.emit("transpose", op.result, perm=perm) if xt is not x else op.result
    ctt = d.emit("transpose", ct, perm=perm) if xt is not x else ct
    lead = tuple(range(rank - 1))
    # hit[..., j, i]: element i is in the scan up to j and attains y_j
    xs = d.emit("broadcast_in_dim", xt, shape=shape, dims=lead + (rank,))
    ys = d.emit("broadcast_in_dim", yt, shape=shape, dims=lead + (rank - 1,))
    member = d.emit("ge" if reverse else "le", j, i)
    hit = d.emit("cast", d.emit("logical_and", member, d.emit("eq", xs, ys)), dtype=x.type.dtype)
    count = d.emit("reduce_sum", hit, axes=(rank,))
    share = d.emit("div", ctt, count)
    g = d.emit("reduce_sum", d.mul(hit, d.emit("broadcast_in_dim", share, shape=shape, dims=lead + (rank - 1,))),
               axes=(rank - 1,))
    return (_back(d, g, perm),)


set_vjp("cumsum", _cumsum_vjp)
set_vjp("cumprod", _cumprod_vjp)
set_vjp("cummax", _cummax_vjp)
