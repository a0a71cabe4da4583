"""Selection along one axis: top_k, sort and argsort, take_along_axis, scatter_add.

top_k along a split last dim never gathers the row: each shard takes its own top k (padding masked
with the smallest value), one all_gather per result moves k candidates per shard (values and their
global indices), and a final top k over those picks the answer; equal values keep the order of
their global indices because shards gather in index order.
"""

from __future__ import annotations

import numpy as np

from ..ir import types as T
from ..ir.mesh import Sharding
from ..ir.types import TensorType
from ..partition.factors import PASS, PERMUTATION, REDUCTION, REPLICATE, RuleBuilder
from . import extremes
from .create import gathered_axes, jax_clamped_ids, jax_local_gather, shard_ids
from .reduce import _fill
from .registry import Family, Grad, check, no_flops, operand_flops, register, set_vjp


def _descending(x: np.ndarray) -> np.ndarray:
    """The indices that sort x along its last axis descending, ties by index, NaN (of either sign)
    above +inf as jax.lax.top_k ranks a NaN, and +0.0 above -0.0 as its total order does (ints
    widened so that negating the smallest does not wrap)."""
    if not T.np_is_float(x.dtype):
        return np.argsort(-x.astype(np.int64), axis=-1, kind="stable")
    key = -x.astype(np.float64)
    nan = np.isnan(key)
    return np.lexsort((np.signbit(x) & (x == 0), np.where(nan, 0.0, key), ~nan), axis=-1)


def _nan_largest(x: str) -> str:
    """jax.lax.top_k orders floats totally: a NaN with its sign bit set (as 0/0 and inf - inf give
    on CPUs) ranks below -inf. spmdlang ranks every NaN above +inf: make them all positive NaNs."""
    return f"jnp.where(jnp.isnan({x}), jnp.nan, {x})"


def _zeros_equal(x: str) -> str:
    """jax sorts floats in total order (-0.0 before 0.0); numpy treats them as equal, so that a
    stable order keeps their index order. Make every zero +0.0 first (a no-op on ints), by abs, so
    that the gradient still flows to x at its zeros (a constant zero in its place would take it)."""
    return f"jnp.where({x} == 0, jnp.abs({x}), {x})"


# ---------------------------------------------------------------------------------- top_k


def _top_k_infer(operands, attrs):
    (x,) = operands
    k = attrs["k"]
    check(T.kind(x.dtype) in ("float", "int"), f"top_k needs a numeric operand, got {x}; cast it first")
    check(x.rank >= 1, f"top_k needs a tensor of rank >= 1, got {x}")
    check(1 <= k <= x.shape[-1], f"top_k: k = {k} must be in [1, {x.shape[-1]}] for {x}")
    shape = x.shape[:-1] + (k,)
    return TensorType(x.dtype, shape), TensorType("i32", shape)


def _top_k_rule(operands, results, attrs):
    (x,) = operands
    b = RuleBuilder()
    lead = [(b.factor(n, PASS),) for n in x.shape[:-1]]
    row = b.factor(x.shape[-1], PERMUTATION)  # split: the custom step's candidates
    k = b.factor(attrs["k"], REPLICATE)
    return b.build([lead + [(row,)]], [lead + [(k,)], lead + [(k,)]])


def _top_k_numpy(x, *, k):
    order = _descending(x)[..., :k]
    return np.take_along_axis(x, order, axis=-1), order.astype(np.int32)


def _top_k_partition(ctx):
    (x,) = ctx.op.operands
    k = ctx.attrs["k"]
    s = ctx.layout(0)
    axes = s.dims[-1]
    if not axes:
        return ctx.generic()
    dims = s.dims
    local = ctx.reshard(0, Sharding(dims))
    n, c = x.type.shape[-1], local.type.shape[-1]
    last = x.type.rank - 1
    local = ctx.mask(local, last, axes, n, _fill("max")(x.type.dtype))
    kk = min(k, c)
    vals, idx = ctx.emit_multi("top_k", local, k=kk)
    idx = ctx.emit("add", idx, ctx.offset(axes, c))
    vals = ctx.collective("all_gather", vals, "each shard's top k values", axes=axes, dim=last)
    idx = ctx.collective("all_gather", idx, "their global indices", axes=axes, dim=last)
    best, pos = ctx.emit_multi("top_k", vals, k=k)
    ids = ctx.emit("take_along_axis", idx, pos, axis=last)
    out = Sharding(dims[:-1] + ((),))
    ctx.set_result(best, out, 0)
    ctx.set_result(ids, out, 1)


register("top_k", doc="the k largest along the last axis, descending, and their i32 indices (ties: lower index; "
                     "NaN above +inf, +0.0 above -0.0)",
         example=(("f32[8, 16]",), {"k": 3}), infer=_top_k_infer, numpy=_top_k_numpy, rule=_top_k_rule,
         partition=_top_k_partition, flops=operand_flops, family=Family.reduce,
         jax=lambda a, attrs, out: (f"jax.lax.top_k({_nan_largest(a[0])}, {attrs['k']})"
                                    if T.is_float(out[0].dtype) else f"jax.lax.top_k({a[0]}, {attrs['k']})"))


# ---------------------------------------------------------------------------------- take_along_axis


def _taa_infer(operands, attrs):
    x, ids = operands
    axis = attrs["axis"]
    check(0 <= axis < x.rank, f"take_along_axis: bad axis {axis} for {x}")
    check(T.is_int(ids.dtype), f"take_along_axis: ids must be integers, got {ids}")
    check(ids.rank == x.rank and all(a == b for i, (a, b) in enumerate(zip(x.shape, ids.shape)) if i != axis),
          f"take_along_axis: ids {ids} must match {x} outside axis {axis}")
    check(x.shape[axis] > 0, "take_along_axis: cannot gather from an empty axis")
    return TensorType(x.dtype, ids.shape)


def _taa_rule(operands, results, attrs):
    """Dims other than `axis` pass through all three; x's axis is a reduction factor (a shard looks
    up the ids it owns, zeros the rest, and the shards are summed), the ids' axis passes to the result."""
    x, ids = operands
    axis = attrs["axis"]
    b = RuleBuilder()
    shared = [b.factor(n) if i != axis else None for i, n in enumerate(x.shape)]
    xf = b.factor(x.shape[axis], REPLICATE if x.dtype == "bool" else REDUCTION)
    jf = b.factor(ids.shape[axis])
    xd = [(f,) if f is not None else (xf,) for f in shared]
    jd = [(f,) if f is not None else (jf,) for f in shared]
    return b.build([xd, jd], [jd])


def _taa_numpy(x, ids, *, axis):
    return np.take_along_axis(x, np.clip(ids, 0, x.shape[axis] - 1).astype(np.intp), axis=axis)


def _taa_partition(ctx):
    """Split along the taken axis: each shard looks up the ids in its range (clamped first), zeros
    the others, and the result is a pending sum over those axes, like a vocab-split take. Else local."""
    axes = gathered_axes(ctx)
    if axes is None:
        return ctx.generic()
    x, axis, js = ctx.op.operands[0], ctx.attrs["axis"], ctx.layout(1)
    taken = set(axes)
    dims = [tuple(a for a in d if a not in taken) for d in js.dims]
    # x's other dims follow the ids' layout (those are the dims the result keeps)
    xdims = list(dims)
    xdims[axis] = axes
    x_local = ctx.reshard(0, Sharding(tuple(xdims)))
    j_local = ctx.reshard(1, Sharding(tuple(dims)))
    valid, safe = shard_ids(ctx, j_local, x.type.shape[axis], x_local.type.shape[axis], axes)
    got = ctx.emit("take_along_axis", x_local, safe, axis=axis)
    zero = ctx.emit("full", dtype=x.type.dtype, shape=got.type.shape, value=0.0 if T.is_float(x.type.dtype) else 0)
    pending = Sharding(tuple(dims), ctx.mesh.order(axes), frozenset(), "sum")
    ctx.set_result(ctx.emit("select", valid, got, zero), pending)


register("take_along_axis", doc="x's elements at `ids` along `axis` (numpy's take_along_axis, ids clamped)",
         example=(("f32[8, 16]", "i32[8, 3]"), {"axis": 1}), infer=_taa_infer, numpy=_taa_numpy, rule=_taa_rule,
         partition=_taa_partition, flops=no_flops, family=Family.gather,
         jax=lambda a, attrs, out: (f"jnp.take_along_axis({a[0]}, {jax_clamped_ids(a[0], a[1], attrs['axis'])}, "
                                    f"axis={attrs['axis']}, mode='clip')"),
         jax_local=lambda a, attrs, out: jax_local_gather(a, attrs, out, along=True))


# ---------------------------------------------------------------------------------- sort / argsort
# numpy sorts half floats (ml_dtypes' bfloat16) in their own order, NaN not last: they are sorted
# as f32, which holds them exactly.


def _sort_infer(name):
    def infer(operands, attrs):
        (x,) = operands
        check(T.kind(x.dtype) in ("float", "int"), f"{name} needs a numeric operand, got {x}; cast it first")
        check(0 <= attrs["axis"] < x.rank, f"{name}: bad axis {attrs['axis']} for {x}")
        return x if name == "sort" else x.with_dtype("i32")

    return infer


def _sort_rule(operands, results, attrs):
    (x,) = operands
    b = RuleBuilder()
    fs = [b.factor(n, REPLICATE if i == attrs["axis"] else PASS) for i, n in enumerate(x.shape)]
    return b.build([[(f,) for f in fs]], [[(f,) for f in fs]])


def _sort_partition(ctx):
    """A split sorted dim is gathered (as GSPMD does); the other dims keep their splits."""
    (x,) = ctx.op.operands
    axis = ctx.attrs["axis"]
    cur = ctx.layout(0)
    if not cur.dims[axis]:
        return ctx.generic()
    dims = tuple(() if d == axis else a for d, a in enumerate(cur.dims))
    local = ctx.reshard(0, Sharding(dims), "a split sorted dim is gathered whole")
    ctx.set_result(ctx.emit(ctx.op.kind, local, axis=axis), Sharding(dims))


register("sort", doc="ascending along `axis` (stable)", example=(("f32[8, 16]",), {"axis": 1}),
         infer=_sort_infer("sort"),
         numpy=lambda x, *, axis: np.sort(T.widen(x), axis=axis, kind="stable").astype(x.dtype),
         rule=_sort_rule,
         partition=_sort_partition, flops=operand_flops, family=Family.layout,
         jax=lambda a, attrs, out: f"jnp.sort({a[0]}, axis={attrs['axis']}, stable=True)")
register("argsort", doc="i32 indices that sort along `axis`, ascending and stable",
         example=(("f32[8, 16]",), {"axis": 1}), infer=_sort_infer("argsort"),
         numpy=lambda x, *, axis: np.argsort(T.widen(x), axis=axis, kind="stable").astype(np.int32), rule=_sort_rule,
         partition=_sort_partition, flops=operand_flops, family=Family.layout,
         jax=lambda a, attrs, out: (f"jnp.argsort({_zeros_equal(a[0])}, "
                                    f"axis={attrs['axis']}, stable=True).astype(jnp.int32)"))


# ---------------------------------------------------------------------------------- scatter_add, _max, _min
#
# scatter_max / scatter_min combine each update into x with maximum / minimum (NaN wins, as
# jax.lax.scatter_max: XLA's max propagates NaN), the order of duplicate ids never mattering; they
# share scatter_add's shapes, factors and plans, their pending result a max / min over the axes
# the updates are split on (no zeroing of the table: max(x, x) = x).

_SCATTER_KIND = {"scatter_add": "sum", "scatter_max": "max", "scatter_min": "min"}


def _scatter_infer(operands, attrs, name="scatter_add"):
    x, ids, upd = operands
    axis = attrs["axis"]
    check(T.kind(x.dtype) in ("float", "int"), f"{name} needs a numeric table, got {x}")
    check(0 <= axis < x.rank, f"{name}: bad axis {axis} for {x}")
    check(T.is_int(ids.dtype), f"{name}: ids must be integers, got {ids}")
    want = x.shape[:axis] + ids.shape + x.shape[axis + 1:]
    check(upd.dtype == x.dtype and upd.shape == want,
          f"{name}: updates must be {TensorType(x.dtype, want)}, got {upd}")
    return x


def _scatter_rule(operands, results, attrs):
    """x's dims pass to the result; the scattered axis is a permutation factor (the custom step keeps
    it split, each shard combining the ids in its range); id dims are reduced away (reduction)."""
    x, ids, upd = operands
    axis = attrs["axis"]
    b = RuleBuilder()
    xd = [(b.factor(n, PERMUTATION if i == axis else PASS),) for i, n in enumerate(x.shape)]
    idd = [(b.factor(n, REDUCTION),) for n in ids.shape]
    return b.build([xd, idd, xd[:axis] + idd + xd[axis + 1:]], [xd])


def _scatter_numpy(kind):
    def run(x, ids, upd, *, axis):
        n = x.shape[axis]
        wide = x.astype(np.float32) if T.np_is_narrow_float(x.dtype) else x.copy()
        pre, post = x.shape[:axis], x.shape[axis + 1:]
        flat = ids.reshape(-1)
        u = np.moveaxis(upd.reshape(pre + (flat.size,) + post), axis, 0).astype(wide.dtype)
        keep = (flat >= 0) & (flat < n)
        if kind == "sum":
            np.add.at(np.moveaxis(wide, axis, 0), flat[keep], u[keep])
        else:  # NaN wins: any NaN at a position, from x or an update, makes it NaN
            extremes.scatter(kind, np.moveaxis(wide, axis, 0), flat[keep], u[keep])
        return wide.astype(x.dtype)

    return run


def _scatter_jax(kind):
    def emit(args, attrs, out):
        x, ids, upd = args
        axis, t = attrs["axis"], out[0]
        n = t.shape[axis]
        pre, post = t.shape[:axis], t.shape[axis + 1:]
        if 0 in t.shape:
            return x  # nothing to combine into
        flat = f"{ids}.reshape(-1)"
        # Out-of-range ids (negatives too) change nothing: their updates become the combine's identity
        # at a clamped, in-range id. (Not mode='drop' with out-of-range ids: XLA on CPU has written
        # dropped updates' neighbours.)
        keep = f"(({flat} >= 0) & ({flat} < {n}))"
        u = f"jnp.moveaxis({upd}.reshape({tuple(pre) + (-1,) + tuple(post)!r}), {axis}, 0)"
        u = f"jnp.where({keep}.reshape((-1,) + (1,) * {len(pre) + len(post)}), {u}, {_identity(kind, t.dtype)})"
        at = f"jnp.clip({flat}, 0, {n - 1})"
        method = {"sum": "add", "max": "max", "min": "min"}[kind]
        return f"jnp.moveaxis(jnp.moveaxis({x}, {axis}, 0).at[{at}].{method}({u}), 0, {axis})"

    return emit


def _identity(kind: str, dtype: str) -> str:
    """The combine's identity as a literal of `dtype`: what an update at a dropped id becomes."""
    v = _fill(kind)(dtype)
    return repr(int(v)) if not T.is_float(dtype) else "0" if kind == "sum" else ("-" if v < 0 else "") + "jnp.inf"


def _scatter_jax_local(kind):
    """Our module's scatter as one jax.lax.scatter_add / _max / _min into x itself (no moveaxis), of
    the updates made the identity (0, -inf, +inf) where the id is out of range (jax.lax.select) at
    the ids clamped in range (jax.lax.clamp, in the ids' own width): _scatter_jax's answer without
    its nested jits (jnp.clip, jnp.where) and jnp's indexed-update tracing."""
    def emit(args, attrs, out):
        x, ids, upd = args
        (_, it, _), axis, t = attrs["operand_types"], attrs["axis"], out[0]
        n, rank = t.shape[axis], len(t.shape)
        if 0 in t.shape:
            return x  # nothing to combine into
        m, dt = it.size, T.jnp_dtype(it.dtype)
        pre, post = tuple(t.shape[:axis]), tuple(t.shape[axis + 1:])
        flat = f"jax.lax.reshape({ids}, ({m},))"
        keep = (f"jax.lax.broadcast_in_dim(jax.lax.bitwise_and(jax.lax.ge({flat}, {dt}(0)), "
                f"jax.lax.lt({flat}, {dt}({n}))), {pre + (m,) + post!r}, ({axis},))")
        u = f"jax.lax.reshape({upd}, {pre + (m,) + post!r})"
        ident = _identity(kind, t.dtype).replace("jnp.inf", "np.inf")
        u = f"jax.lax.select({keep}, {u}, jax.lax.full({pre + (m,) + post!r}, {ident}, {T.jnp_dtype(t.dtype)}))"
        at = f"jax.lax.reshape(jax.lax.clamp({dt}(0), {flat}, {dt}({n - 1})), ({m}, 1))"
        window = tuple(d for d in range(rank) if d != axis)
        dims = (f"jax.lax.ScatterDimensionNumbers(update_window_dims={window!r}, inserted_window_dims=({axis},), "
                f"scatter_dims_to_operand_dims=({axis},))")
        return f"jax.lax.scatter_{'add' if kind == 'sum' else kind}({x}, {at}, {u}, {dims}, mode='drop')"

    return emit


def _scatter_plans(ctx):
    """The layouts a scatter can run in without gathering everything: (x dims, ids dims, pending
    axes). "table": the table keeps its splits, the scattered axis included (each shard combines
    the ids in its range), and the ids/updates give up the axes the table uses. "updates": the ids
    and updates keep their splits, the table gives up the axes they use on its scattered axis;
    each shard scatters its own updates and the result is pending (a sum, max or min) over those
    axes."""
    axis = ctx.attrs["axis"]
    xs, js = ctx.layout(0), ctx.layout(1)
    plans = []
    for kind in ("table", "updates"):
        xdims = list(xs.dims)
        if kind == "updates":
            ids_axes = {a for d in js.dims for a in d}
            if not ids_axes & set(xdims[axis]):
                continue  # the same as "table"
            xdims[axis] = tuple(a for a in xdims[axis] if a not in ids_axes)
        used = {a for d in xdims for a in d}
        jdims = tuple(tuple(a for a in d if a not in used) for d in js.dims)
        summed = ctx.mesh.order({a for d in jdims for a in d})
        plans.append((kind, tuple(xdims), jdims, summed))
    return plans


def _pending(xdims, summed, op: str) -> Sharding:
    return Sharding(xdims, summed, frozenset(), op) if summed else Sharding(xdims)


def _scatter_cost(ctx, xdims, jdims, summed) -> float:
    """Bytes (and latency) of a plan in the cost model: the operands resharded into it and the
    result from it into its planned layout."""
    from ..partition.cost import comm_cost
    from ..partition.reshard import plan_reshard

    axis = ctx.attrs["axis"]
    want = [Sharding(xdims), Sharding(jdims), Sharding(xdims[:axis] + jdims + xdims[axis + 1:])]
    cost = 0.0
    for i, (v, s) in enumerate(zip(ctx.op.operands, want)):
        cost += comm_cost(plan_reshard(v.type.shape, T.itemsize(v.type.dtype), ctx.mesh, ctx.layout(i), s))
    r = ctx.op.result
    out = _pending(xdims, summed, _SCATTER_KIND[ctx.op.kind])
    return cost + comm_cost(plan_reshard(r.type.shape, T.itemsize(r.type.dtype), ctx.mesh, out, ctx.target()))


def _scatter_partition(ctx):
    """Of the plans of `_scatter_plans`, the cheapest in the cost model (ties: the table keeps its
    splits). Along the scattered axis each shard combines the ids in its own range and drops the
    rest (no communication); on split id dims each shard scatters its own updates and the result
    is pending over those axes, settled by the consumer (a reduce_scatter where it wants the table
    split): a sum counts the table on one shard of them, a max or min on all (x combined with
    itself is x)."""
    x, ids, upd = ctx.op.operands
    axis, op = ctx.attrs["axis"], _SCATTER_KIND[ctx.op.kind]
    plans = _scatter_plans(ctx)
    _, xdims, jdims, summed = min(plans, key=lambda p: _scatter_cost(ctx, *p[1:])) if len(plans) > 1 else plans[0]
    if not xdims[axis] and not summed:
        return ctx.generic()
    x_local = ctx.reshard(0, Sharding(xdims))
    j_local = ctx.reshard(1, Sharding(jdims))
    u_local = ctx.reshard(2, Sharding(xdims[:axis] + jdims + xdims[axis + 1:]))
    dt = ids.type.dtype
    for d, a in enumerate(jdims):  # padding of split id dims must change nothing
        j_local = ctx.mask(j_local, d, a, ids.type.shape[d], -1)
    if xdims[axis]:
        off = ctx.offset(xdims[axis], x_local.type.shape[axis])
        j_local = ctx.emit("sub", j_local, off if dt == "i32" else ctx.emit("cast", off, dtype=dt))
    if summed and op == "sum":
        first = ctx.emit("eq", ctx.axis_index(summed), ctx.constant(0, "i32"))
        zero = ctx.emit("full", dtype=x.type.dtype, shape=x_local.type.shape,
                        value=0.0 if T.is_float(x.type.dtype) else 0)
        x_local = ctx.emit("select", ctx.emit("broadcast_in_dim", first, shape=x_local.type.shape, dims=()),
                           x_local, zero)
    out = ctx.emit(ctx.op.kind, x_local, j_local, u_local, axis=axis)
    ctx.set_result(out, _pending(xdims, summed, op))


for _name, _kind in _SCATTER_KIND.items():
    _how = {"sum": "added", "max": "combined with maximum (NaN wins)", "min": "combined with minimum (NaN wins)"}
    register(_name, doc=f"x with `updates` {_how[_kind]} at `ids` along `axis` (ids outside the axis are dropped)",
             example=(("f32[10, 4]", "i32[3, 2]", "f32[3, 2, 4]"), {"axis": 0}),
             infer=lambda ops, attrs, _name=_name: _scatter_infer(ops, attrs, _name),
             numpy=_scatter_numpy(_kind), rule=_scatter_rule, partition=_scatter_partition, family=Family.gather,
             flops=lambda ops, res, attrs: ops[2].size, jax=_scatter_jax(_kind), jax_local=_scatter_jax_local(_kind))


# ---------------------------------------------------------------------------------- derivatives


def scatter_along_axis(d, ct, ids, x_type, axis: int):
    """The transpose of take_along_axis(x, ids, axis): ct added into zeros of x's type at the
    (clamped) ids, as one scatter_add into x flattened (each element's flat index from iotas)."""
    from .create import clamped_ids

    shape = x_type.shape
    safe = clamped_ids(d, ids, shape[axis])
    if safe.type.dtype != "i32":
        safe = d.emit("cast", safe, dtype="i32")
    strides, s = [], 1
    for n in reversed(shape):
        strides.append(s)
        s *= n
    strides.reverse()
    flat = d.mul(safe, d.const(strides[axis], "i32")) if strides[axis] != 1 else safe
    for dim, stride in enumerate(strides):
        if dim == axis or ids.type.shape[dim] == 1 and shape[dim] == 1:
            continue
        pos = d.emit("iota", dtype="i32", shape=tuple(ids.type.shape), axis=dim)
        flat = d.emit("add", flat, d.mul(pos, d.const(stride, "i32")) if stride != 1 else pos)
    size = ids.type.size
    table = d.emit("full", dtype=x_type.dtype, shape=(x_type.size,), value=0.0)
    out = d.emit("scatter_add", table, d.emit("reshape", flat, shape=(size,)), d.emit("reshape", ct, shape=(size,)),
                 axis=0)
    return d.emit("reshape", out, shape=tuple(shape))


def _taa_vjp(d, op, ct):
    x, ids = op.operands
    return scatter_along_axis(d, ct, ids, x.type, op.attrs["axis"]), None


def _sort_vjp(d, op, ct):
    """jax's: the cotangent goes back through the sorting permutation (stable, as argsort)."""
    (x,) = op.operands
    axis = op.attrs["axis"]
    order = d.emit("argsort", x, axis=axis)
    return (scatter_along_axis(d, ct, order, x.type, axis),)


def _top_k_vjp(d, op, cts):
    (x,) = op.operands
    ct, _ = cts
    if ct is None:
        return (None,)
    return (scatter_along_axis(d, ct, op.results[1], x.type, x.type.rank - 1),)


def _kept_updates(d, ids, n: int, upd_type, axis: int):
    """Which updates a scatter along `axis` (n rows) keeps, as a mask of the updates' shape: those
    whose id is in [0, n-1] (the others are dropped)."""
    dt = ids.type.dtype
    valid = d.emit("logical_and", d.emit("ge", ids, d.const(0, dt)), d.emit("lt", ids, d.const(n, dt)))
    return d.emit("broadcast_in_dim", valid, shape=upd_type.shape, dims=tuple(range(axis, axis + ids.type.rank)))


def _scatter_vjp(d, op, ct):
    """x's cotangent passes; each update gets the cotangent at its id (none for dropped ids)."""
    from .create import clamped_ids

    x, ids, upd = op.operands
    axis = op.attrs["axis"]
    n = x.type.shape[axis]
    got = d.emit("take", ct, clamped_ids(d, ids, n), axis=axis)
    return ct, None, d.select(_kept_updates(d, ids, n, got.type, axis), got, d.zeros(got.type))


set_vjp("take_along_axis", _taa_vjp)
set_vjp("sort", _sort_vjp)
set_vjp("argsort", Grad.none)
set_vjp("top_k", _top_k_vjp)
set_vjp("scatter_add", _scatter_vjp)


def _scatter_extreme_vjp(d, op, ct):
    """As jax's: the cotangent at each position goes to what holds the result there, x or updates,
    shared equally among ties (x counted once, each update at the position once)."""
    from .create import clamped_ids

    x, ids, upd = op.operands
    out = op.results[0]
    axis = op.attrs["axis"]
    n = x.type.shape[axis]
    safe = clamped_ids(d, ids, n)
    one, zero_u = d.full(1.0, upd.type), d.zeros(upd.type)
    won = d.emit("eq", upd, d.emit("take", out, safe, axis=axis))
    u_hit = d.select(d.emit("logical_and", _kept_updates(d, ids, n, upd.type, axis), won), one, zero_u)
    # x holds the result where it equals it, or where no update lands (a NaN of x stays x's);
    # scatter_add drops the updates at ids out of range itself
    lands = d.emit("scatter_add", d.zeros(x.type), ids, one, axis=axis)
    x_held = d.emit("logical_or", d.emit("eq", x, out), d.emit("eq", lands, d.zeros(x.type)))
    x_hit = d.select(x_held, d.full(1.0, x.type), d.zeros(x.type))
    count = d.emit("add", x_hit, d.emit("scatter_add", d.zeros(x.type), ids, u_hit, axis=axis))
    share = d.emit("div", ct, d.emit("maximum", count, d.full(1.0, x.type)))
    return (d.emit("mul", share, x_hit), None, d.emit("mul", d.emit("take", share, safe, axis=axis), u_hit))


set_vjp("scatter_max", _scatter_extreme_vjp)
set_vjp("scatter_min", _scatter_extreme_vjp)
