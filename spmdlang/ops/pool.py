"""Pooling over the spatial dims of [N, spatial..., C]: the max or the sum of each window.

avg_pool is the frontend's sum pool divided by the full window size (padding counts as 0). Split
spatial dims take halo windows from their neighbours (partition.halo), like conv: the fill past the
image edges is the pool's identity (-inf for max, 0 for sum), so padding is never gathered.
"""

from __future__ import annotations

from math import prod

import numpy as np

from ..ir import types as T
from ..ir.mesh import Sharding
from ..partition.factors import PASS, PERMUTATION, RuleBuilder
from ..partition.halo import Window
from ..partition.reshard import chunk
from .contract import conv_output_size
from .moving import _worth_it
from .registry import Family, check, register, set_vjp


def _identity(kind: str, dtype: str):
    if kind == "sum":
        return 0.0 if T.is_float(dtype) else 0
    return -np.inf if T.is_float(dtype) else int(np.iinfo(T.np_dtype(dtype)).min)


def _infer(operands, attrs):
    (x,) = operands
    win, strides, padding = attrs["window"], attrs["strides"], attrs["padding"]
    nsp = len(win)
    check(T.kind(x.dtype) in ("float", "int"), f"pool needs a numeric operand, got {x}")
    check(x.rank == nsp + 2, f"pool: {x} is not [N, spatial..., C] with {nsp} spatial dim(s)")
    check(len(strides) == len(padding) == nsp, "pool: one window, stride and padding per spatial dim")
    out = [x.shape[0]]
    for i in range(nsp):
        m = conv_output_size(x.shape[1 + i], win[i], strides[i], *padding[i])
        check(m >= 1, f"pool: window {win[i]} does not fit spatial dim {x.shape[1 + i]}")
        out.append(m)
    return x.with_shape(out + [x.shape[-1]])


def _rule(operands, results, attrs):
    (x,) = operands
    b = RuleBuilder()
    n, c = b.factor(x.shape[0], PASS), b.factor(x.shape[-1], PASS)
    sp_in = [b.factor(m, PERMUTATION) for m in x.shape[1:-1]]
    sp_out = [b.factor(m, PERMUTATION) for m in results[0].shape[1:-1]]
    return b.build([[(n,)] + [(f,) for f in sp_in] + [(c,)]], [[(n,)] + [(f,) for f in sp_out] + [(c,)]])


def _numpy(x, *, reduce, window, strides, padding):
    kind = reduce
    wide = x.astype(np.float32) if T.np_is_narrow_float(x.dtype) else x
    if kind == "sum":
        fill = 0
    else:
        fill = -np.inf if T.np_is_float(x.dtype) else np.iinfo(x.dtype).min
    pad = [(0, 0)] + [tuple(p) for p in padding] + [(0, 0)]
    xp = np.pad(wide, pad, constant_values=np.asarray(fill).astype(wide.dtype))
    out_shape = [x.shape[0]] + [conv_output_size(x.shape[1 + i], window[i], strides[i], *padding[i])
                                for i in range(len(window))] + [x.shape[-1]]
    acc = None
    for offs in np.ndindex(*window):
        sl = (slice(None),) + tuple(slice(o, o + (m - 1) * s + 1, s) for o, m, s in
                                    zip(offs, out_shape[1:-1], strides)) + (slice(None),)
        part = xp[sl]
        acc = part if acc is None else (np.maximum(acc, part) if kind == "max" else acc + part)
    return np.asarray(acc).astype(x.dtype)


def _jax(args, attrs, out):
    """Explicit strided slices of the padded input combined one by one (XLA's SPMD partitioner has
    given wrong answers for reduce_window, see ops/scan.py)."""
    kind, window, strides, padding = attrs["reduce"], attrs["window"], attrs["strides"], attrs["padding"]
    x = args[0]
    dt = out[0].dtype
    fill = _identity(kind, dt)
    fill_text = f'float("{fill}")' if isinstance(fill, float) and fill in (np.inf, -np.inf) else repr(fill)
    pads = [(0, 0)] + [tuple(p) for p in padding] + [(0, 0)]
    xp = f"jnp.pad({x}, {pads}, constant_values={fill_text})"
    parts = []
    for offs in np.ndindex(*window):
        sl = ", ".join([":"] + [f"{o}:{o + (m - 1) * s + 1}:{s}" for o, m, s in zip(offs, out[0].shape[1:-1], strides)]
                       + [":"])
        parts.append(f"_p[{sl}]")
    op = "jnp.maximum" if kind == "max" else "jnp.add"
    body = parts[0]
    for p in parts[1:]:
        body = f"{op}({body}, {p})"
    return f"(lambda _p: {body})({xp})"


def _partition(ctx):
    """Split spatial dims exchange the halo their windows reach (filled with the identity past the
    edges) and pool locally without padding on those dims; batch and channel splits stay local."""
    (x,) = ctx.op.operands
    out = ctx.target()
    window, strides, padding = ctx.attrs["window"], ctx.attrs["strides"], ctx.attrs["padding"]
    nsp = len(window)
    split = [i for i in range(nsp) if out.dims[1 + i]]
    if not split or ctx.layout(0).partial:
        return ctx.generic()
    cur = ctx.layout(0)
    dims = [out.dims[0]]
    for i in range(nsp):
        a = out.dims[1 + i]
        dims.append(a if a and cur.dims[1 + i] == a else ())
    dims.append(out.dims[-1])
    fill = _identity(ctx.attrs["reduce"], x.type.dtype)
    n_out = ctx.op.result.type.shape
    windows = []
    for i in split:
        k = ctx.mesh.group_size(out.dims[1 + i])
        c_out = chunk(n_out[1 + i], k)
        windows.append((1 + i, Window(a=c_out * strides[i], s=-padding[i][0],
                                      length=(c_out - 1) * strides[i] + window[i], fill=fill)))
    local_out = Sharding(out.dims).local_shape(n_out, ctx.mesh)
    whole = [n_out[d] if d in [1 + i for i in split] else m for d, m in enumerate(local_out)]
    replicated = prod(window) * (prod(whole) - prod(local_out))
    if not _worth_it(ctx, 0, tuple(dims), windows, replicated):
        return ctx.generic()
    xl = ctx.reshard(0, Sharding(tuple(dims)))
    for d, w in windows:
        xl = ctx.window(xl, d, dims[d], out.dims[d], x.type.shape[d], w)
    pads = tuple((0, 0) if i in split else tuple(padding[i]) for i in range(nsp))
    ctx.set_result(ctx.emit("pool", xl, reduce=ctx.attrs["reduce"], window=tuple(window), strides=tuple(strides),
                            padding=pads), out)


register("pool", doc="max or sum of each window over the spatial dims of [N, spatial..., C]",
         example=(("f32[2, 8, 8, 3]",), {"reduce": "max", "window": (2, 2), "strides": (2, 2),
                                         "padding": ((0, 0), (0, 0))}),
         infer=_infer, numpy=_numpy, rule=_rule, jax=_jax, partition=_partition, family=Family.layout,
         flops=lambda ops, res, attrs: res[0].size * prod(attrs["window"]))


def _pool_vjp(d, op, ct):
    """The pool as jax computes it (a chain of max / add over strided slices of the padded input,
    see `_jax`), differentiated op by op: max ties as jax's maximum splits them, so the xla
    backend's jax.grad agrees (lax.reduce_window's own rule would give one element of a tie all of
    it). The slices' cotangents (one per window tap, output-shaped) go back to the input as one
    transposed depthwise conv (the taps stacked as channels, a one-hot kernel flipped, lhs_dilation
    the strides, padding cropped away), which partitions as a halo exchange on split spatial dims,
    even split unevenly. (Pad and reshape to interleave each slice's zeros would reshard a split
    dim whose shards the reshape does not keep.)"""
    from .contract import conv_attrs

    (x,) = op.operands
    if not T.is_float(x.type.dtype):
        return (None,)
    kind, window, strides, padding = (op.attrs[k] for k in ("reduce", "window", "strides", "padding"))
    out_shape = op.result.type.shape
    nsp = len(window)
    taps = list(np.ndindex(*window))
    if kind == "sum":
        cts = [ct] * len(taps)
    else:
        fill = _identity(kind, x.type.dtype)
        xp = d.emit("pad", x, lo=(0,) + tuple(p[0] for p in padding) + (0,),
                    hi=(0,) + tuple(p[1] for p in padding) + (0,), value=fill)
        parts = []
        for offs in taps:
            starts = (0,) + tuple(offs) + (0,)
            stops = ((xp.type.shape[0],) + tuple(o + (m - 1) * s + 1 for o, m, s in zip(offs, out_shape[1:-1], strides))
                     + (xp.type.shape[-1],))
            parts.append(d.emit("slice", xp, starts=starts, stops=stops, steps=(1,) + tuple(strides) + (1,)))

        def chain(*vs):
            acc = vs[0]
            for v in vs[1:]:
                acc = d.emit("maximum" if kind == "max" else "add", acc, v)
            return acc

        cts = d.vjp_of(chain, parts, ct)
    if len(taps) == 1:
        g = cts[0]
    else:
        # [N, out..., C] per tap -> [N, out..., C, taps] -> [N, out..., C * taps]: channel c's taps
        # are its group
        shape = tuple(out_shape) + (1,)
        g = d.emit("concat", *[d.emit("reshape", c, shape=shape) for c in cts], axis=len(out_shape))
        g = d.emit("reshape", g, shape=tuple(out_shape[:-1]) + (out_shape[-1] * len(taps),))
    # kernel [window..., taps, C]: tap j's channel reads window position window - 1 - offset_j
    # (flipped: the flat window index is (W - 1) - j)
    ntap, c = len(taps), x.type.shape[-1]
    hit = d.emit("eq", d.emit("add", d.emit("iota", dtype="i32", shape=(ntap, ntap), axis=0),
                              d.emit("iota", dtype="i32", shape=(ntap, ntap), axis=1)), d.const(ntap - 1, "i32"))
    k = d.emit("cast", hit, dtype=x.type.dtype)
    k = d.emit("reshape", k, shape=tuple(window) + (ntap, 1))
    k = d.emit("broadcast_in_dim", k, shape=tuple(window) + (ntap, c), dims=tuple(range(nsp + 2)))
    pads = []
    for i in range(nsp):
        n_pad = x.type.shape[1 + i] + padding[i][0] + padding[i][1]
        pads.append((window[i] - 1 - padding[i][0], n_pad - (out_shape[1 + i] - 1) * strides[i] - 1 - padding[i][1]))
    cx = d.emit("conv", g, k, **conv_attrs((1,) * nsp, pads, lhs_dilation=strides, groups=c))
    assert cx.type.shape == x.type.shape, (cx.type, x.type)
    return (cx,)


set_vjp("pool", _pool_vjp)
