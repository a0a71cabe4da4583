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
from ..partition.factors import PERMUTATION
from ..partition.halo import Window, window_bytes, window_collectives
from ..partition.reshard import FLOPS_PER_BYTE, LATENCY_BYTES, chunk, comm_cost, plan_reshard


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


def _costs(ctx, i: int, dims, windows) -> tuple[float, float]:
    """(windows, gather): in the partitioner's model (bytes plus a latency charge per collective),
    what operand i costs taken by windows (after any reshard into `dims`), and gathered whole on
    the moved dims instead."""
    v = ctx.op.operands[i]
    mesh = ctx.mesh
    cur = ctx.layout(i)
    shape, isz = v.type.shape, _itemsize(v)
    want = Sharding(dims)
    cost = comm_cost(plan_reshard(shape, isz, mesh, cur, want))
    local = want.local_shape(shape, mesh)
    for d, w in windows:
        if not dims[d]:
            continue
        k = mesh.group_size(dims[d])
        row = isz
        for e, n in enumerate(local):
            if e != d:
                row *= n
        cost += (window_bytes(w, local[d], k, row, shape[d])
                 + LATENCY_BYTES * window_collectives(w, local[d], k, shape[d]))
    moved = {d for d, _ in windows}
    gathered = tuple(() if d in moved else a for d, a in enumerate(cur.dims))
    return cost, comm_cost(plan_reshard(shape, isz, mesh, cur, Sharding(gathered)))


def _worth_it(ctx, i: int, dims, windows, replicated_work: int = 0) -> bool:
    """Do windows cost no more than gathering the moved dims, counting the extra local work
    (`replicated_work` FLOPs) that running the op on the gathered dims would add?"""
    window, gather = _costs(ctx, i, dims, windows)
    return window <= gather + replicated_work / FLOPS_PER_BYTE


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
            local = ctx.window(local, d, dims[d], out.dims[d], x.type.shape[d], w)
        local = local_attrs(ctx, local, split)
        ctx.set_result(local, out)

    return partition


def _slice_window(attrs, d, n, c_out, k):
    start, step = attrs["starts"][d], attrs["steps"][d]
    return Window(a=c_out * step, s=start, length=(c_out - 1) * step + 1)


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


partition_slice = _single(_slice_window, _slice_rest)
partition_pad = _single(_pad_window, _pad_rest)


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


# ---------------------------------------------------------------------------------- conv


def partition_conv(ctx):
    """Spatially split conv: each shard exchanges only the halo rows its windows reach (zeros past
    the image edges, as SAME/explicit padding), then convolves locally with no padding on those
    dims. Batch and output-feature splits stay local; channel splits go through the generic path."""
    x, w = ctx.op.operands
    out = ctx.target()
    strides, padding = ctx.attrs["strides"], ctx.attrs["padding"]
    nsp = len(strides)
    split = [i for i in range(nsp) if out.dims[1 + i]]
    if not split or ctx.layout(0).partial or ctx.layout(1).partial:
        return ctx.generic()
    cur = ctx.layout(0)
    xdims = [out.dims[0]]
    for i in range(nsp):
        a = out.dims[1 + i]
        xdims.append(a if a and cur.dims[1 + i] == a else ())
    xdims.append(())
    wdims = [()] * (nsp + 1) + [out.dims[-1]]
    windows = []
    n_out = ctx.op.result.type.shape
    for i in split:
        k = ctx.mesh.group_size(out.dims[1 + i])
        c_out = chunk(n_out[1 + i], k)
        windows.append((1 + i, Window(a=c_out * strides[i], s=-padding[i][0],
                                      length=(c_out - 1) * strides[i] + w.type.shape[i], fill=0.0)))
    # gathering the spatial dims instead would run each device's conv over the whole image
    out_t = ctx.op.result.type
    local_out = list(Sharding(out.dims).local_shape(out_t.shape, ctx.mesh))
    whole = [out_t.shape[d] if d in [1 + i for i in split] else n for d, n in enumerate(local_out)]
    per_point = 2
    for n in w.type.shape[:-1]:
        per_point *= n
    replicated = per_point * (prod(whole) - prod(local_out)) // max(1, local_out[-1]) * local_out[-1]
    if not _worth_it(ctx, 0, tuple(xdims), windows, replicated):
        return ctx.generic()
    xl = ctx.reshard(0, Sharding(tuple(xdims)))
    wl = ctx.reshard(1, Sharding(tuple(wdims)))
    for d, win in windows:
        xl = ctx.window(xl, d, xdims[d], out.dims[d], x.type.shape[d], win)
    pads = tuple((0, 0) if i in split else tuple(padding[i]) for i in range(nsp))
    ctx.set_result(ctx.emit("conv", xl, wl, strides=tuple(strides), padding=pads), out)
