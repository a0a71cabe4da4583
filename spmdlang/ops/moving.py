"""Partitioning of ops that move elements along a dim: slice, pad, roll, concat, conv windows.

Their moved dims are permutation factors: when the planned output splits such a dim, each shard
fetches the input window it needs from its neighbours (partition.halo: collective_permutes of
just the halo, masks at the edges) instead of gathering the dim. When the output does not split
it, or the window would move more bytes than gathering, the generic factor path gathers it.
The functions here are the `partition` entries of those ops in the op table.
"""

from __future__ import annotations

from math import prod

from ..ir.mesh import Sharding
from ..partition.cost import comm_cost, exchange_cost, replicated_cost
from ..partition.factors import PERMUTATION
from ..partition.halo import Window, parts, window, window_directions
from ..partition.reshard import chunk, plan_reshard


def _moving_dims(ctx) -> list[int]:
    rule = ctx.rule()
    dims = rule.results[0]
    return [d for d, fs in enumerate(dims) if fs and rule.kinds[fs[0]] == PERMUTATION]


def _input_layout(ctx, i: int, out: Sharding, moving, split) -> tuple[tuple[str, ...], ...]:
    """Operand i keeps the output's splits on pass-through dims; on a windowed dim it keeps the
    output's axes if it already has them (halo exchange), else is taken whole (local window)."""
    cur = ctx.layout(i)
    dims = []
    for d in range(len(out.dims)):
        if d in split:
            dims.append(out.dims[d] if cur.dims[d] == out.dims[d] else ())
        elif d in moving:
            dims.append(())
        else:
            dims.append(out.dims[d])
    return tuple(dims)


def _itemsize(v) -> int:
    return v.type.nbytes // max(v.type.size, 1) if v.type.size else 1


def _costs(ctx, i: int, dims, windows, scale=None) -> tuple[float, float]:
    """(windows, gather) in the cost model (partition.cost): operand i resharded into `dims`, then
    each window one exchange whose two directions run at once; against gathering the moved dims
    whole, which also pays for the bytes it holds beyond the windows (replicated memory). A dim in
    `scale` (d -> m) is windowed after m-fold dilation (conv's lhs_dilation): its windows count
    in dilated elements, m per input element."""
    scale = scale or {}
    v = ctx.op.operands[i]
    mesh = ctx.mesh
    cur = ctx.layout(i)
    shape, isz = v.type.shape, _itemsize(v)
    want = Sharding(dims)
    cost = comm_cost(plan_reshard(shape, isz, mesh, cur, want))
    local = want.local_shape(shape, mesh)
    held = list(local)
    for d in {d for d, _ in windows}:
        # what the windows hold: the span every shard's window is cut from (a rotation: two)
        m = scale.get(d, 1)
        held[d] = sum(-(-_span(w, local[d] * m, mesh.group_size(dims[d]), shape[d] * m) // m) if dims[d]
                      else shape[d] for e, w in windows if e == d)
    for d, w in windows:
        if not dims[d]:
            continue
        k = mesh.group_size(dims[d])
        row = isz * prod(n for e, n in enumerate(local) if e != d)
        m = scale.get(d, 1)
        cost += exchange_cost(window_directions(w, local[d] * m, k, row, shape[d] * m))
    moved = {d for d, _ in windows}
    gathered = tuple(() if d in moved else a for d, a in enumerate(cur.dims))
    whole = Sharding(gathered).local_shape(shape, mesh)
    gather = comm_cost(plan_reshard(shape, isz, mesh, cur, Sharding(gathered)))
    gather += replicated_cost(max(0, prod(whole) - prod(held)) * isz)
    return cost, gather


def _span(w: Window, c: int, k: int, n: int) -> int:
    lo, hi, _ = parts(w, c, k, n)
    return hi + w.length - lo


def _worth_it(ctx, i: int, dims, windows, replicated_work: int = 0, scale=None) -> bool:
    """Do windows cost no more than gathering the moved dims, counting the extra local work
    (`replicated_work` FLOPs) that running the op on the gathered dims would add?"""
    window, gather = _costs(ctx, i, dims, windows, scale)
    return window <= gather + replicated_cost(0, replicated_work)


def _positions(ctx, shape, dim: int, axes, c: int):
    """Global positions along `dim` of this shard's elements (i32, full local shape)."""
    pos = ctx.emit("iota", dtype="i32", shape=tuple(shape), axis=dim)
    if axes:
        pos = ctx.emit("add", pos, ctx.offset(axes, c))
    return pos


# ---------------------------------------------------------------------------------- slice / pad / roll


def _single(window_of, local_attrs):
    """A one-operand moving op: window every split moved dim, then the op's local remainder."""
    def partition(ctx):
        (x,) = ctx.op.operands
        out = ctx.target()
        moving = _moving_dims(ctx)
        split = [d for d in moving if out.dims[d]]
        if not split or ctx.layout(0).partial:
            return ctx.generic()
        n_out = ctx.op.result.type.shape
        dims = _input_layout(ctx, 0, out, moving, split)
        windows = []
        for d in split:
            k = ctx.mesh.group_size(out.dims[d])
            windows.append((d, window_of(ctx.attrs, d, x.type.shape[d], chunk(n_out[d], k), k)))
        if not _worth_it(ctx, 0, dims, windows):
            return ctx.generic()
        local = ctx.reshard(0, Sharding(dims))
        for d, w in windows:
            local = ctx.window(local, d, dims[d], out.dims[d], x.type.shape[d], w, first=d == windows[0][0])
        local = local_attrs(ctx, local, split)
        ctx.set_result(local, out)

    return partition


def _slice_window(attrs, d, n, c_out, k):
    start, step = attrs["starts"][d], attrs["steps"][d]
    return Window(a=c_out * step, s=start, length=(c_out - 1) * step + 1 if c_out else 0)  # (empty: nothing)


def _slice_rest(ctx, x, split):
    a = ctx.attrs
    starts, stops, steps = list(a["starts"]), list(a["stops"]), list(a["steps"])
    for d in range(x.type.rank):
        full = (starts[d], steps[d]) == (0, 1) and stops[d] == ctx.op.operands[0].type.shape[d]
        if d in split:
            starts[d], stops[d] = 0, x.type.shape[d]
        elif full:
            stops[d] = x.type.shape[d]
    if starts == [0] * x.type.rank and steps == [1] * x.type.rank and tuple(stops) == x.type.shape:
        return x
    return ctx.emit("slice", x, starts=tuple(starts), stops=tuple(stops), steps=tuple(steps))


def _pad_window(attrs, d, n, c_out, k):
    return Window(a=c_out, s=-attrs["lo"][d], length=c_out, fill=attrs["value"])


def _pad_rest(ctx, x, split):
    lo = [0 if d in split else v for d, v in enumerate(ctx.attrs["lo"])]
    hi = [0 if d in split else v for d, v in enumerate(ctx.attrs["hi"])]
    if not any(lo) and not any(hi):
        return x
    return ctx.emit("pad", x, lo=tuple(lo), hi=tuple(hi), value=ctx.attrs["value"])


_partition_one_slice = _single(_slice_window, _slice_rest)
partition_pad = _single(_pad_window, _pad_rest)


def partition_slice(ctx):
    """A slice that is one of several unit-step shifted slices of one tensor (a depthwise conv
    written as shifted slices, often of a padded tensor) takes its window from ONE exchange
    shared by all of them; any other slice is windowed on its own."""
    if not _shared_slice(ctx):
        _partition_one_slice(ctx)


def _siblings(ctx, x, d):
    """The slices of global x that shift along dim d only: unit step, same length, same layout."""
    me = ctx.op
    n_out = me.result.type.shape[d]
    want = ctx.target_of(me.result).dims[d]
    return [op for op in ctx.users(x)
            if op.kind == "slice" and op.attrs["steps"][d] == 1 and op.result.type.shape[d] == n_out
            and ctx.target_of(op.result).dims[d] == want]


def _shared_slice(ctx) -> bool:
    (x,) = ctx.op.operands
    out = ctx.target()
    moving = _moving_dims(ctx)
    split = [d for d in moving if out.dims[d]]
    if len(split) != 1 or ctx.layout(0).partial:
        return False
    d = split[0]
    axes = out.dims[d]
    if ctx.attrs["steps"][d] != 1:
        return False
    siblings = _siblings(ctx, x, d)
    if len(siblings) < 2:
        return False
    # look through a pad on d alone: the window on its input, with the pad value outside
    src, lo, fill = x, 0, 0
    pad = ctx.producer(x)
    if pad is not None and pad.kind == "pad" and not ctx.is_result(x):
        inner = ctx.layout_of(pad.operands[0])
        if (all(v == 0 for e, v in enumerate(pad.attrs["lo"]) if e != d)
                and all(v == 0 for e, v in enumerate(pad.attrs["hi"]) if e != d)
                and inner is not None and inner.dims[d] == axes and not inner.partial):
            src, lo, fill = pad.operands[0], pad.attrs["lo"][d], pad.attrs["value"]
    if src is x and ctx.layout(0).dims[d] != axes:
        return False
    k = ctx.mesh.group_size(axes)
    c_out = chunk(ctx.op.result.type.shape[d], k)
    starts = [op.attrs["starts"][d] for op in siblings]
    first = min(starts)
    dims = tuple(axes if e == d else out.dims[e] if e not in moving else () for e in range(len(out.dims)))
    key = ("shared_window", src, d, dims, c_out, first, max(starts))
    cache = ctx.memo
    if key not in cache:
        w = Window(a=c_out, s=first - lo, length=c_out + max(starts) - first, fill=fill)
        # slices far apart would pull every row between them: then each takes its own window
        isz, n = _itemsize(src), src.type.shape[d]
        local_shape = Sharding(dims).local_shape(src.type.shape, ctx.mesh)
        row = isz * prod(m for e, m in enumerate(local_shape) if e != d)
        shared = exchange_cost(window_directions(w, local_shape[d], k, row, n))
        gather = comm_cost(plan_reshard(src.type.shape, isz, ctx.mesh, Sharding(dims),
                                        Sharding(tuple(() if e == d else a for e, a in enumerate(dims)))))
        if shared > gather:
            return False
        local = ctx.reshard_value(src, Sharding(dims))
        why = f"halo of %{src.name or 'operand'} for {len(siblings)} shifted slices"
        cache[key] = window(ctx, local, d, axes, axes, src.type.shape[d], w, why)
    mine = ctx.attrs["starts"][d] - first
    local = ctx.slice_dim(cache[key], d, mine, mine + c_out)
    ctx.set_result(_slice_rest(ctx, local, split), out)
    return True


def partition_roll(ctx):
    """An evenly split dim rotates with wrap-around shifts (one permute for a shift under a shard);
    an uneven one takes the two windows a rotation is made of and picks per position."""
    (x,) = ctx.op.operands
    out = ctx.target()
    d = ctx.attrs["axis"]
    axes = out.dims[d]
    if not axes or ctx.layout(0).partial:
        return ctx.generic()
    n, shift = x.type.shape[d], ctx.attrs["shift"] % x.type.shape[d]
    k = ctx.mesh.group_size(axes)
    c = chunk(n, k)
    dims = _input_layout(ctx, 0, out, [d], [d])
    if n % k == 0:
        windows = [(d, Window(a=c, s=-shift, length=c, wrap=True))]
    else:
        windows = [(d, Window(a=c, s=n - shift, length=c)), (d, Window(a=c, s=-shift, length=c))]
    if not _worth_it(ctx, 0, dims, windows):
        return ctx.generic()
    local = ctx.reshard(0, Sharding(dims))
    got = [ctx.window(local, d, dims[d], axes, n, w) for _, w in windows]
    if len(got) == 1:
        ctx.set_result(got[0], out)
        return
    pos = _positions(ctx, got[0].type.shape, d, axes, c)
    ctx.set_result(ctx.emit("select", ctx.emit("lt", pos, ctx.constant(shift, "i32")), got[0], got[1]), out)


# ---------------------------------------------------------------------------------- concat


def partition_concat(ctx):
    """Output shard i takes, from each operand, the window of positions it covers, and picks
    per position which operand it comes from."""
    out = ctx.target()
    d = ctx.attrs["axis"]
    axes = out.dims[d]
    if not axes or any(ctx.layout(i).partial for i in range(len(ctx.op.operands))):
        return ctx.generic()
    k = ctx.mesh.group_size(axes)
    n = ctx.op.result.type.shape[d]
    c = chunk(n, k)
    plans, offset = [], 0
    window_total, gathers = 0.0, {}
    for i, v in enumerate(ctx.op.operands):
        dims = _input_layout(ctx, i, out, [d], [d])
        w = Window(a=c, s=-offset, length=c)
        window, gather = _costs(ctx, i, dims, [(d, w)])
        window_total += window
        gathers[v] = gather  # an operand used twice is gathered once
        plans.append((i, dims, w, offset))
        offset += v.type.shape[d]
    if window_total > sum(gathers.values()):
        return ctx.generic()
    parts = []
    for i, dims, w, off in plans:
        local = ctx.reshard(i, Sharding(dims))
        parts.append((off, ctx.window(local, d, dims[d], axes, ctx.op.operands[i].type.shape[d], w)))
    result = parts[-1][1]
    pos = _positions(ctx, result.type.shape, d, axes, c)
    for j in range(len(parts) - 2, -1, -1):
        result = ctx.emit("select", ctx.emit("lt", pos, ctx.constant(parts[j + 1][0], "i32")), parts[j][1], result)
    ctx.set_result(result, out)


# ---------------------------------------------------------------------------------- reshape


def _merge_group(shape_in, shape_out, d: int, e: int):
    """(end_in, end_out) of the reshape group starting at input dim d and output dim e (the
    same flat offset), up to the first dims where the row-major prefixes meet again; None when d
    and e do not start at the same offset."""
    if prod(shape_in[:d]) != prod(shape_out[:e]):
        return None
    j, f = d + 1, e + 1
    while j <= len(shape_in) and f <= len(shape_out):
        a, b = prod(shape_in[:j]), prod(shape_out[:f])
        if a == b:
            return j, f
        if a < b:
            j += 1
        else:
            f += 1
    return None


def partition_reshape(ctx):
    """A reshape whose split dim leads a group that merges and splits dims (f32[B, 7, 10] {_, x, _}
    -> f32[B, 14, 5] {_, x, _}): where the shard borders of input and output do not coincide
    (uneven splits), each shard exchanges only the elements that cross a border (a halo on the
    group's flattened dim: XLA's ReshapeMergeDimsWithHaloExchange) instead of gathering the dim.
    Anything else takes the generic factor path."""
    (x,) = ctx.op.operands
    out, cur = ctx.target(), ctx.layout(0)
    shape_in, shape_out = x.type.shape, ctx.op.result.type.shape
    split_out = [e for e, a in enumerate(out.dims) if a]
    split_in = [d for d, a in enumerate(cur.dims) if a]
    if len(split_out) != 1 or len(split_in) != 1 or cur.partial:
        return ctx.generic()
    d, e = split_in[0], split_out[0]
    axes = out.dims[e]
    group = _merge_group(shape_in, shape_out, d, e) if cur.dims[d] == axes else None
    if group is None:
        return ctx.generic()
    j, f = group
    inner_in, inner_out = prod(shape_in[d + 1:j]), prod(shape_out[e + 1:f])
    k = ctx.mesh.group_size(axes)
    c_in, c_out = chunk(shape_in[d], k), chunk(shape_out[e], k)
    local = ctx.operand_local(0)
    local_out = out.local_shape(shape_out, ctx.mesh)
    if c_in * inner_in == c_out * inner_out:  # the borders coincide (padding too): a local reshape
        return ctx.set_result(ctx.emit("reshape", local, shape=tuple(local_out), name=ctx.op.result.name), out)
    n = shape_in[d] * inner_in
    flat_in = local.type.shape[:d] + (c_in * inner_in,) + local.type.shape[j:]
    w = Window(a=c_out * inner_out, s=0, length=c_out * inner_out, fill=0)
    isz = _itemsize(x)
    row = isz * prod(flat_in[:d]) * prod(flat_in[d + 1:])
    halo = exchange_cost(window_directions(w, c_in * inner_in, k, row, n))
    gather = comm_cost(plan_reshard(shape_in, isz, ctx.mesh, cur, Sharding(((),) * len(shape_in))))
    if halo > gather:
        return ctx.generic()
    flat = ctx.emit("reshape", local, shape=flat_in)
    win = window(ctx, flat, d, axes, axes, n, w, f"halo of %{x.name or 'operand'} for reshape")
    ctx.set_result(ctx.emit("reshape", win, shape=tuple(local_out), name=ctx.op.result.name), out)
