"""Values made from nothing (full, iota), gathers (take), and the sharding constraint."""

from __future__ import annotations

import numpy as np

from ..ir import types as T
from ..ir.mesh import Sharding
from ..ir.types import TensorType
from ..partition.factors import PASS, REDUCTION, RuleBuilder, elementwise_rule
from .registry import Family, Grad, PartialMode, Stage, check, no_flops, py_literal, register, set_vjp


def _fresh_rule(operands, results, attrs):
    return elementwise_rule([], results[0].shape)


register("full", doc="a tensor of `shape` filled with `value`", family=Family.create,
         example=((), {"dtype": "f32", "shape": (4, 8), "value": 0.0}), flops=no_flops,
         infer=lambda ops, attrs: TensorType(attrs["dtype"], tuple(attrs["shape"])),
         numpy=lambda *, dtype, shape, value: np.full(shape, value, dtype=T.np_dtype(dtype)),
         rule=_fresh_rule,
         localize=lambda attrs, ops, shapes: {**attrs, "shape": tuple(shapes[0])},
         jax=lambda a, attrs, out: (
             f"{T.jnp_dtype(attrs['dtype'])}({py_literal(attrs['value'])})" if not out[0].shape  # a scalar
             else f"jnp.full({tuple(out[0].shape)}, {py_literal(attrs['value'])}, {T.jnp_dtype(attrs['dtype'])})"),
         jax_local=lambda a, attrs, out: (
             f"{T.jnp_dtype(attrs['dtype'])}({py_literal(attrs['value'])})" if not out[0].shape
             else f"jax.lax.full({tuple(out[0].shape)}, {py_literal(attrs['value'])}, {T.jnp_dtype(attrs['dtype'])})"))


def _iota_infer(operands, attrs):
    shape, axis = tuple(attrs["shape"]), attrs["axis"]
    check(0 <= axis < len(shape), f"iota: bad axis {axis} for shape {list(shape)}")
    check(T.kind(attrs["dtype"]) in ("int", "float"), f"iota needs a numeric dtype, got {attrs['dtype']}",
          blame="dtype")
    return TensorType(attrs["dtype"], shape)


def _iota_numpy(*, dtype, shape, axis):
    idx = np.arange(shape[axis]).reshape([-1 if i == axis else 1 for i in range(len(shape))])
    return np.broadcast_to(idx, shape).astype(T.np_dtype(dtype))


def _iota_partition(ctx):
    """A split counting dim counts from this partition's offset: local iota + offset, no communication."""
    out = ctx.target()
    axis, dtype = ctx.attrs["axis"], ctx.attrs["dtype"]
    shape = ctx.local_shape(ctx.op.result, out)
    x = ctx.emit("iota", dtype=dtype, shape=tuple(shape), axis=axis)
    axes = out.dims[axis]
    if axes:
        off = ctx.offset(axes, shape[axis])
        x = ctx.emit("add", x, off if dtype == "i32" else ctx.emit("cast", off, dtype=dtype))
    ctx.set_result(x, out)


register("iota", doc="counts 0, 1, 2, ... along `axis`, constant along the other dims",
         example=((), {"dtype": "i32", "shape": (4, 8), "axis": 1}),
         flops=no_flops, infer=_iota_infer, numpy=_iota_numpy, rule=_fresh_rule, family=Family.create,
         partition=_iota_partition,
         jax=lambda a, attrs, out: (f"jax.lax.broadcasted_iota({T.jnp_dtype(attrs['dtype'])}, "
                                    f"{tuple(out[0].shape)}, {attrs['axis']})"))

# ---------------------------------------------------------------------------------- take


def _take_infer(operands, attrs):
    table, ids = operands
    axis = attrs["axis"]
    check(0 <= axis < table.rank, f"take: bad axis {axis} for {table}")
    check(T.is_int(ids.dtype), f"take: ids must be integers, got {ids}", blame=1)
    check(table.shape[axis] > 0, "take: cannot gather from an empty dimension", blame=0)
    return TensorType(table.dtype, table.shape[:axis] + ids.shape + table.shape[axis + 1:])


def _take_rule(operands, results, attrs):
    """Table dims other than `axis` and all id dims pass through; the gathered axis is a reduction
    factor: a shard gathers the rows it owns, zeros the rest, and the shards are summed."""
    table, ids = operands
    axis = attrs["axis"]
    b = RuleBuilder()
    td = [(b.factor(n, REDUCTION if i == axis else PASS),) for i, n in enumerate(table.shape)]
    idd = [(b.factor(n),) for n in ids.shape]
    return b.build([td, idd], [td[:axis] + idd + td[axis + 1:]])


def _take_numpy(table, ids, *, axis):
    return np.take(table, np.clip(ids, 0, table.shape[axis] - 1), axis=axis)


def gathered_axes(ctx) -> tuple[str, ...] | None:
    """The axes splitting operand 0 along the gathered `axis`, where the gather can run on those
    shards (a pending sum of what each finds); None: partition it generically (the axis is whole,
    a bool has no sum, or operand 0 is itself a pending sum)."""
    x, s = ctx.op.operands[0], ctx.layout(0)
    axes = s.dims[ctx.attrs["axis"]]
    return None if not axes or x.type.dtype == "bool" or s.partial else axes


def shard_ids(ctx, ids, n: int, c: int, axes):
    """Ids into a dim of n split over `axes` in chunks of c: (valid, safe). `valid` marks the ids (clamped
    into [0, n) first) that fall in this shard's chunk; `safe` is their local index, 0 elsewhere."""
    dt = ids.type.dtype
    clamped = ctx.emit("minimum", ctx.emit("maximum", ids, ctx.constant(0, dt)), ctx.constant(n - 1, dt))
    off = ctx.offset(axes, c)
    local = ctx.emit("sub", clamped, off if dt == "i32" else ctx.emit("cast", off, dtype=dt))
    valid = ctx.emit("logical_and", ctx.emit("ge", local, ctx.constant(0, dt)),
                     ctx.emit("lt", local, ctx.constant(c, dt)))
    return valid, ctx.emit("select", valid, local, ctx.constant(0, dt))


def jax_clamped_ids(x: str, ids: str, axis: int) -> str:
    """The emitted ids clamped into [0, n - 1] of x's `axis`, in the ids' own width, before jax
    gathers with them: jnp narrows 64-bit ids to i32 first (2^32 would wrap to 0), and XLA on CPU
    folds a gather from a dynamic_slice into a dynamic_slice of the whole operand, clamped to the
    operand's bounds instead of the window's (docs/known_xla_issues.md), so mode='clip' alone is
    not enough."""
    return f"jnp.clip({ids}, 0, {x}.shape[{axis}] - 1)"


def jax_local_gather(a, attrs, out, along: bool) -> str:
    """Our module's take (`along` False) or take_along_axis (True) as one lax.gather of the ids
    clamped into the axis by one lax.clamp (docs/known_xla_issues.md, 7: XLA only ever sees ids in
    range): jnp.take, jnp.take_along_axis and jnp.clip each trace as a nested jit, which jax lowers
    as a function of its own, and normalise negative ids that the clamp has already made >= 0."""
    (xt, it), axis = attrs["operand_types"], attrs["axis"]
    n, rank = xt.shape[axis], len(it.shape)
    dt = T.jnp_dtype(it.dtype)  # the bounds in the ids' own width (lax.clamp wants one dtype)
    ids = f"jax.lax.reshape(jax.lax.clamp({dt}(0), {a[1]}, {dt}({n - 1})), {(*it.shape, 1)!r})"
    if along:  # every other dim is a batch dim of both, the result is the ids' shape
        batch = tuple(d for d in range(rank) if d != axis)
        dims = (f"offset_dims=(), collapsed_slice_dims=({axis},), start_index_map=({axis},), "
                f"operand_batching_dims={batch!r}, start_indices_batching_dims={batch!r}")
        sizes = (1,) * rank
    else:  # the result is x's dims before `axis`, the ids' dims, x's dims after it
        offset = tuple(range(axis)) + tuple(range(axis + rank, len(xt.shape) - 1 + rank))
        dims = f"offset_dims={offset!r}, collapsed_slice_dims=({axis},), start_index_map=({axis},)"
        sizes = tuple(1 if d == axis else s for d, s in enumerate(xt.shape))
    return f"jax.lax.gather({a[0]}, {ids}, jax.lax.GatherDimensionNumbers({dims}), {sizes!r}, mode='clip')"


def _take_partition(ctx):
    """Table split on the gathered axis (vocab split): every shard gathers the rows it owns, zeros
    the others, and the result is a pending sum over the vocab axes (one all_reduce, or a
    reduce_scatter if the consumer wants it split). Other splits are local (generic)."""
    vocab = gathered_axes(ctx)
    if vocab is None:
        return ctx.generic()
    table, ids = ctx.op.operands
    axis = ctx.attrs["axis"]
    ts, ids_s = ctx.layout(0), ctx.layout(1)
    t_dims = list(ts.dims)
    taken = {a for i, d in enumerate(t_dims) if i != axis for a in d} | set(vocab)
    id_dims = [tuple(a for a in d if a not in taken) for d in ids_s.dims]
    t_local = ctx.reshard(0, Sharding(tuple(t_dims)))
    i_local = ctx.reshard(1, Sharding(tuple(id_dims)))
    valid, safe = shard_ids(ctx, i_local, table.type.shape[axis], t_local.type.shape[axis], vocab)
    rows = ctx.emit("take", t_local, safe, axis=axis)
    rank = ids.type.rank
    keep = ctx.emit("broadcast_in_dim", valid, shape=rows.type.shape, dims=tuple(range(axis, axis + rank)))
    zero = ctx.constant(0.0 if table.type.dtype[0] in "fb" else 0, table.type.dtype)
    out = ctx.emit("select", keep, rows, ctx.emit("broadcast_in_dim", zero, shape=rows.type.shape, dims=()))
    dims = tuple(t_dims[:axis]) + tuple(id_dims) + tuple(t_dims[axis + 1:])
    ctx.set_result(out, Sharding(dims, ctx.mesh.order(vocab), frozenset(), "sum"))


register("take", doc="gather: the slices of `table` along `axis` at `ids` (ids clamped to the axis)",
         example=(("f32[100, 16]", "i32[4, 8]"), {"axis": 0}),
         flops=no_flops, infer=_take_infer, numpy=_take_numpy, rule=_take_rule, partition=_take_partition,
         partial=PartialMode.multilinear, partial_operands=(0,), family=Family.gather,
         jax=lambda a, attrs, out: f"jnp.take({a[0]}, {jax_clamped_ids(a[0], a[1], attrs['axis'])}, "
                                   f"axis={attrs['axis']}, mode='clip')",
         jax_local=lambda a, attrs, out: jax_local_gather(a, attrs, out, along=False))

# ---------------------------------------------------------------------------------- shard


def _shard_infer(operands, attrs):
    (x,) = operands
    check(attrs["sharding"].rank == x.rank,
          f"shard: spec {attrs['sharding']} has {attrs['sharding'].rank} entries for {x} of rank {x.rank}")
    return x


register("shard", doc="sharding constraint: x laid out as `sharding` (GSPMD's mesh_split)",
         example=(("f32[4, 8]",), {"sharding": Sharding(((), ()))}), stage=Stage.global_,
         flops=no_flops, constraint=True, infer=_shard_infer, numpy=lambda x, *, sharding: x,
         rule=lambda ops, res, attrs: elementwise_rule([ops[0].shape], res[0].shape),
         partial=PartialMode.additive, family=Family.constraint, jax=lambda a, attrs, out: a[0])


# ---------------------------------------------------------------------------------- derivatives


def clamped_ids(d, ids, n: int):
    """ids clamped into [0, n - 1], as take and take_along_axis clamp them."""
    dt = ids.type.dtype
    return d.emit("minimum", d.emit("maximum", ids, d.const(0, dt)), d.const(n - 1, dt))


def _take_vjp(d, op, ct):
    """jax's: the cotangent rows scatter-added at the (clamped) ids."""
    table, ids = op.operands
    axis = op.attrs["axis"]
    safe = clamped_ids(d, ids, table.type.shape[axis])
    return d.emit("scatter_add", d.zeros(table.type), safe, ct, axis=axis), None


def _shard_vjp(d, op, ct):
    """A constraint on a forward value constrains its cotangent alike (GSPMD's annotations do)."""
    return (d.emit("shard", ct, sharding=op.attrs["sharding"]),)


set_vjp("full", Grad.none)
set_vjp("iota", Grad.none)
set_vjp("take", _take_vjp)
set_vjp("shard", _shard_vjp)
