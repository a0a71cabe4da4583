"""Windows at positions known only at run time: dynamic_slice and dynamic_update_slice.

Operands: the tensor (and the update), then one integer scalar start per dim. A start is clamped
into [0, n - m] so that the window of m elements fits (XLA's clamping; unlike jax.lax's wrapper,
a negative start is not first wrapped around: it clamps to 0, as `x[l]` does in the language).
A dim the window covers whole (m = n) has its start clamped to 0 whatever it is: it is a
pass-through factor and may stay split. A dim the window cuts (m < n):
  dynamic_slice, split dim: the cheaper by the cost model of
    (a) every shard reads the part of the window it holds and zeros the rest, and the result owes
        a sum over the dim's axes (as a vocab-split `take`): the shard's chunk is padded with m
        zeros on both sides, so that one local dynamic_slice at (start - offset + m), clamped by
        the op itself, reads exactly the window's overlap with the chunk, zeros elsewhere (a window
        that misses the chunk clamps into the zeros); padding of uneven shards lies past n and is
        never inside the window;
    (b) gathering the dim, then slicing locally.
  dynamic_update_slice, split dim: no communication. Each shard writes the part of the window that
    falls in its chunk, with the same padding trick (a write that misses the chunk clamps into the
    zeros, which are cut off again); the update is taken whole on that dim.
"""

from __future__ import annotations

import numpy as np

from ..ir import types as T
from ..ir.mesh import Sharding
from ..ir.types import TensorType
from ..partition.cost import comm_cost, replicated_cost
from ..partition.factors import PASS, PERMUTATION, REDUCTION, REPLICATE, RuleBuilder
from ..partition.reshard import plan_reshard
from .registry import Family, PartialMode, check, no_flops, register, set_vjp


def _check_starts(name: str, x: TensorType, starts, first: int) -> None:
    check(len(starts) == x.rank, f"{name}: {len(starts)} start(s) for {x} of rank {x.rank}; give one per dim")
    for i, s in enumerate(starts):
        check(s.rank == 0 and T.is_int(s.dtype), f"{name}: start {i} must be an integer scalar, got {s}",
              blame=first + i)


def _clamped(starts, shape, sizes) -> list[int]:
    return [int(min(max(int(s), 0), n - m)) for s, n, m in zip(starts, shape, sizes)]


def _jax_starts(x: str, window: str, starts) -> str:
    """Starts clamped in the emitted code: jax.lax wraps a negative start once before clamping
    (spmdlang clamps it to 0), and XLA's own partitioner clamps an out-of-range start of an
    unevenly split dim wrongly (docs/known_xla_issues.md); in-range starts are right everywhere."""
    return "(" + "".join(f"jnp.clip({a}, 0, {x}.shape[{d}] - {window}[{d}]), " for d, a in enumerate(starts)) + ")"


# ---------------------------------------------------------------------------------- dynamic_slice


def _ds_infer(operands, attrs):
    x, *starts = operands
    sizes = tuple(attrs["sizes"])
    _check_starts("dynamic_slice", x, starts, 1)
    check(len(sizes) == x.rank, f"dynamic_slice: {len(sizes)} size(s) for {x} of rank {x.rank}", blame="sizes")
    for d, (m, n) in enumerate(zip(sizes, x.shape)):
        check(0 <= m <= n, f"dynamic_slice: size {m} of dim {d} does not fit in {x} (0 <= size <= {n})",
              blame="sizes")
    return x.with_shape(sizes)


def _ds_rule(operands, results, attrs):
    """Whole dims pass through; a cut dim of x is a reduction factor (read where it lies, the
    shards summed), the window's dim a factor of its own that is never split."""
    x = operands[0]
    b = RuleBuilder()
    xd, rd = [], []
    for n, m in zip(x.shape, attrs["sizes"]):
        if m == n:
            f = b.factor(n, PASS)
            xd.append((f,))
            rd.append((f,))
        else:
            xd.append((b.factor(n, REDUCTION),))
            rd.append((b.factor(m, REPLICATE),) if m > 1 else ())
    return b.build([xd] + [[]] * (len(operands) - 1), [rd])


def _ds_numpy(x, *starts, sizes):
    at = _clamped(starts, x.shape, sizes)
    return x[tuple(slice(a, a + m) for a, m in zip(at, sizes))].copy()


def _local_starts(starts) -> str:
    """Starts in our per-partition module: no partitioner runs on it, so XLA's DynamicSlice clamps
    them itself; allow_negative_indices=False keeps jax from wrapping a negative one first."""
    return "(" + "".join(f"{a}, " for a in starts) + ")"


def _ds_jax(args, attrs, out):
    sizes = tuple(out[0].shape)
    return f"jax.lax.dynamic_slice({args[0]}, {_jax_starts(args[0], repr(sizes), args[1:])}, {sizes!r})"


def _ds_jax_local(args, attrs, out):
    sizes = tuple(out[0].shape)
    return f"jax.lax.dynamic_slice({args[0]}, {_local_starts(args[1:])}, {sizes!r}, allow_negative_indices=False)"


def _start(ctx, i: int, n: int, m: int):
    """Start i as a replicated i32 scalar, clamped into [0, n - m] (in its own width, then narrowed)."""
    s = ctx.reshard(i, Sharding(()))
    dt = s.type.dtype
    s = ctx.emit("minimum", ctx.emit("maximum", s, ctx.constant(0, dt)), ctx.constant(n - m, dt))
    return s if dt == "i32" else ctx.emit("cast", s, dtype="i32")


def _local_start(ctx, i: int, n: int, m: int, axes, c: int):
    """Where the window starts in this shard's chunk of c along a dim split over `axes`, counted
    in the chunk padded with m elements on each side."""
    s = _start(ctx, i, n, m)
    return ctx.emit("add", ctx.emit("sub", s, ctx.offset(axes, c)), ctx.constant(m, "i32"))


def _itemsize(t: TensorType) -> int:
    return T.itemsize(t.dtype)


def _ds_plans(ctx, cur: Sharding, keep, cut_split):
    """(cost, read_in_place) of the two ways, for a value already laid out as cur (pending `keep`)."""
    x, r = ctx.op.operands[0], ctx.op.result
    mesh = ctx.mesh
    want = ctx.target()
    out_dims = tuple(() if d in cut_split else a for d, a in enumerate(cur.dims))
    summed = mesh.order(set(keep) | {a for d in cut_split for a in cur.dims[d]})
    read = comm_cost(plan_reshard(r.type.shape, _itemsize(r.type), mesh, Sharding(out_dims, summed), want))
    gathered = Sharding(out_dims, keep)
    whole = gathered.local_shape(x.type.shape, mesh)
    held = cur.local_shape(x.type.shape, mesh)
    gather = comm_cost(plan_reshard(x.type.shape, _itemsize(x.type), mesh, cur, gathered))
    gather += replicated_cost((int(np.prod(whole)) - int(np.prod(held))) * _itemsize(x.type))
    gather += comm_cost(plan_reshard(r.type.shape, _itemsize(r.type), mesh, Sharding(out_dims, keep), want))
    return read, gather


def _ds_partition(ctx):
    x = ctx.op.operands[0]
    sizes = ctx.attrs["sizes"]
    cur = ctx.layout(0)
    keep = cur.partial if cur.partial_op == "sum" else ()
    if cur.partial and not keep:
        cur = Sharding(cur.dims)
    cut_split = [d for d, (n, m) in enumerate(zip(x.type.shape, sizes)) if m < n and cur.dims[d]]
    read_in_place = False
    if cut_split and x.type.dtype != "bool":
        read, gather = _ds_plans(ctx, cur, keep, cut_split)
        read_in_place = read <= gather
    out_dims = tuple(() if d in cut_split else a for d, a in enumerate(cur.dims))
    local = ctx.reshard(0, Sharding(cur.dims if read_in_place else out_dims, keep),
                        "" if read_in_place or not cut_split else "a dim cut by a run-time window is gathered")
    starts = []
    for d, (n, m) in enumerate(zip(x.type.shape, sizes)):
        if m == n:
            starts.append(ctx.constant(0, "i32"))
        elif read_in_place and d in cut_split:
            c = local.type.shape[d]
            local = ctx.pad_dim(local, d, m, m)
            starts.append(_local_start(ctx, 1 + d, n, m, cur.dims[d], c))
        else:
            starts.append(_start(ctx, 1 + d, n, m))
    lsizes = tuple(m if m < n else local.type.shape[d] for d, (n, m) in enumerate(zip(x.type.shape, sizes)))
    out = ctx.emit("dynamic_slice", local, *starts, sizes=lsizes)
    summed = ctx.mesh.order(set(keep) | ({a for d in cut_split for a in cur.dims[d]} if read_in_place else set()))
    ctx.set_result(out, Sharding(out_dims, summed))


def _ds_localize(attrs, operands, shapes):
    """Whole dims may be split: their window is the local operand's."""
    return {**attrs, "sizes": tuple(shapes[0])}


register("dynamic_slice", doc="the window of `sizes` at run-time `starts` (one i32 scalar per dim, clamped to fit)",
         example=(("f32[8, 16]", "i32[]", "i32[]"), {"sizes": (2, 16)}), infer=_ds_infer, numpy=_ds_numpy,
         rule=_ds_rule, partition=_ds_partition, localize=_ds_localize, flops=no_flops, family=Family.layout,
         partial=PartialMode.multilinear, partial_operands=(0,), jax=_ds_jax, jax_local=_ds_jax_local)


# ---------------------------------------------------------------------------------- dynamic_update_slice


def _dus_infer(operands, attrs):
    x, upd, *starts = operands
    check(upd.dtype == x.dtype, f"dynamic_update_slice: the update is {upd.dtype} but x is {x.dtype}; cast it",
          blame=1)
    check(upd.rank == x.rank and all(m <= n for m, n in zip(upd.shape, x.shape)),
          f"dynamic_update_slice: the update {upd} does not fit in {x}", blame=1)
    _check_starts("dynamic_update_slice", x, starts, 2)
    return x


def _dus_rule(operands, results, attrs):
    """Whole dims pass through all three; a cut dim keeps x's split into the result (each shard
    writes what falls in its chunk), and the update's dim is never split."""
    x, upd = operands[0], operands[1]
    b = RuleBuilder()
    xd, ud = [], []
    for n, m in zip(x.shape, upd.shape):
        if m == n:
            f = b.factor(n, PASS)
            xd.append((f,))
            ud.append((f,))
        else:
            xd.append((b.factor(n, PERMUTATION),))
            ud.append((b.factor(m, REPLICATE),) if m > 1 else ())
    return b.build([xd, ud] + [[]] * (len(operands) - 2), [xd])


def _dus_numpy(x, upd, *starts):
    at = _clamped(starts, x.shape, upd.shape)
    out = x.copy()
    out[tuple(slice(a, a + m) for a, m in zip(at, upd.shape))] = upd
    return out


def _dus_jax(args, attrs, out):
    return f"jax.lax.dynamic_update_slice({args[0]}, {args[1]}, {_jax_starts(args[0], args[1] + '.shape', args[2:])})"


def _dus_jax_local(args, attrs, out):
    return (f"jax.lax.dynamic_update_slice({args[0]}, {args[1]}, {_local_starts(args[2:])}, "
            "allow_negative_indices=False)")


def _is_zeros(op) -> bool:
    return op is not None and op.kind == "full" and op.attrs["value"] == 0


def _dus_partition(ctx):
    """x and the update both pending sums over the same axes (a carried gradient accumulator
    and its update, in a reverse loop): the write is linear in the two together, so the
    result stays pending over them."""
    x, upd = ctx.op.operands[0], ctx.op.operands[1]
    xs, us = ctx.layout(0), ctx.layout(1)
    keep = ()
    if (xs.partial and xs.partial_op == "sum" and us.partial_op == "sum"
            and set(xs.partial) == set(us.partial)):
        keep = xs.partial
    # zeros with a pending update written in (one layer's gradient placed in a stacked buffer,
    # as jax's scan transpose does): zeros are already a pending sum over any axes, for free
    zeros = not xs.partial and us.partial and us.partial_op == "sum" and _is_zeros(ctx.producer(x))
    if zeros:
        keep = us.partial
    cur = Sharding(xs.dims, keep)
    if any(a in keep for d in cur.dims for a in d):
        keep, cur, zeros = (), Sharding(xs.dims), False
    shape, ushape = x.type.shape, upd.type.shape
    local = ctx.reshard(0, Sharding(cur.dims) if zeros else cur)
    udims = tuple(a if m == n else () for a, n, m in zip(cur.dims, shape, ushape))
    u = ctx.reshard(1, Sharding(udims, keep), "the update is taken whole on the dims it cuts")
    starts, padded = [], []
    for d, (n, m) in enumerate(zip(shape, ushape)):
        if m == n:
            starts.append(ctx.constant(0, "i32"))
        elif cur.dims[d]:
            c = local.type.shape[d]
            local = ctx.pad_dim(local, d, m, m)
            starts.append(_local_start(ctx, 2 + d, n, m, cur.dims[d], c))
            padded.append((d, m, c))
        else:
            starts.append(_start(ctx, 2 + d, n, m))
    out = ctx.emit("dynamic_update_slice", local, u, *starts)
    for d, m, c in padded:
        out = ctx.slice_dim(out, d, m, m + c)
    ctx.set_result(out, cur)


register("dynamic_update_slice", doc="x with `update` written at run-time `starts` (one i32 scalar per dim, clamped)",
         example=(("f32[8, 16]", "f32[2, 16]", "i32[]", "i32[]"), {}), infer=_dus_infer, numpy=_dus_numpy,
         rule=_dus_rule, partition=_dus_partition, flops=no_flops, family=Family.layout, jax=_dus_jax,
         jax_local=_dus_jax_local)


# ---------------------------------------------------------------------------------- derivatives
# The window clamps alike in both ops, so each one's transpose is the other at the same starts.


def _ds_vjp(d, op, ct):
    x, *starts = op.operands
    return (d.emit("dynamic_update_slice", d.zeros(x.type), ct, *starts),) + (None,) * len(starts)


def _dus_vjp(d, op, ct):
    x, upd, *starts = op.operands
    cx = d.emit("dynamic_update_slice", ct, d.zeros(upd.type), *starts)
    cu = d.emit("dynamic_slice", ct, *starts, sizes=tuple(upd.type.shape))
    return (cx, cu) + (None,) * len(starts)


set_vjp("dynamic_slice", _ds_vjp)
set_vjp("dynamic_update_slice", _dus_vjp)
