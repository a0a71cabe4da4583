"""Pooling over the spatial dims of [N, spatial..., C]: the max or the sum of each window.

avg_pool is the frontend's sum pool divided by the full window size (padding counts as 0). Split
spatial dims take halo windows from their neighbours (partition.halo), like conv: the fill past the
image edges is the pool's identity (-inf for max, 0 for sum), so padding is never gathered.

An input spatial dim and its output share one factor (as conv's): the output rows a shard holds
read the input rows around the same place, so a split carries through the pool, and a 2x2 stride-2
pool whose shards line up (28 rows over 8 in blocks of 4, 14 in blocks of 2) needs no halo at all.

`lhs_dilation` (absent: 1 per spatial dim) spreads the input as conv's does, the holes holding the
identity: a sum pool's gradient is the sum pool of its cotangent dilated by the strides (the pool
transposed), which partitions as a halo exchange like a transposed conv and runs as a pad with
interior padding and a few adds, where a one-hot depthwise conv with lhs_dilation is slow on CPU.
"""

from __future__ import annotations

from dataclasses import replace
from math import prod

import numpy as np

from ..ir import types as T
from ..ir.mesh import Sharding
from ..partition.factors import PASS, PERMUTATION, RuleBuilder
from .contract import _conv_window, conv_output_size
from .moving import _worth_it
from .registry import Family, check, register, set_vjp


def _identity(kind: str, dtype: str):
    if kind == "sum":
        return 0.0 if T.is_float(dtype) else 0
    return -np.inf if T.is_float(dtype) else int(np.iinfo(T.np_dtype(dtype)).min)


def _lhs(attrs) -> tuple[int, ...]:
    return tuple(attrs.get("lhs_dilation") or (1,) * len(attrs["window"]))


def _infer(operands, attrs):
    (x,) = operands
    win, strides, padding = attrs["window"], attrs["strides"], attrs["padding"]
    nsp = len(win)
    lhs = _lhs(attrs)
    check(T.kind(x.dtype) in ("float", "int"), f"pool needs a numeric operand, got {x}")
    check(x.rank == nsp + 2, f"pool: {x} is not [N, spatial..., C] with {nsp} spatial dim(s)")
    check(len(strides) == len(padding) == len(lhs) == nsp,
          "pool: one window, stride, padding and lhs_dilation per spatial dim")
    check(all(d >= 1 for d in lhs), f"pool: lhs_dilation {list(lhs)} must be positive")
    out = [x.shape[0]]
    for i in range(nsp):
        m = conv_output_size(x.shape[1 + i], win[i], strides[i], *padding[i], lhs[i])
        check(m >= 1, f"pool: window {win[i]} does not fit spatial dim {x.shape[1 + i]}")
        out.append(m)
    return x.with_shape(out + [x.shape[-1]])


def _rule(operands, results, attrs):
    (x,) = operands
    b = RuleBuilder()
    n, c = b.factor(x.shape[0], PASS), b.factor(x.shape[-1], PASS)
    sp = [b.factor(m, PERMUTATION) for m in results[0].shape[1:-1]]
    return b.build([[(n,)] + [(f,) for f in sp] + [(c,)]], [[(n,)] + [(f,) for f in sp] + [(c,)]])


def _numpy(x, *, reduce, window, strides, padding, lhs_dilation=None):
    kind = reduce
    lhs = _lhs({"window": window, "lhs_dilation": lhs_dilation})
    wide = x.astype(np.float32) if T.np_is_narrow_float(x.dtype) else x
    if kind == "sum":
        fill = 0
    else:
        fill = -np.inf if T.np_is_float(x.dtype) else np.iinfo(x.dtype).min
    fill_w = np.asarray(fill).astype(wide.dtype)
    if any(d > 1 for d in lhs):  # holes between the input elements hold the identity
        shape = [x.shape[0]] + [(n - 1) * d + 1 if n else 0 for n, d in zip(x.shape[1:-1], lhs)] + [x.shape[-1]]
        spread = np.full(shape, fill_w, dtype=wide.dtype)
        spread[(slice(None),) + tuple(slice(None, None, d) for d in lhs) + (slice(None),)] = wide
        wide = spread
    pad = [(0, 0)] + [tuple(p) for p in padding] + [(0, 0)]
    xp = np.pad(wide, pad, constant_values=fill_w)
    out_shape = [x.shape[0]] + [conv_output_size(x.shape[1 + i], window[i], strides[i], *padding[i], lhs[i])
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
    lhs = _lhs(attrs)
    if any(d > 1 for d in lhs):  # lax.pad's interior padding spreads the input (the pool transposed)
        cfg = [(0, 0, 0)] + [(lo, hi, d - 1) for (lo, hi), d in zip(padding, lhs)] + [(0, 0, 0)]
        xp = f"jax.lax.pad({x}, jnp.asarray({fill_text}, {T.jnp_dtype(dt)}), {cfg})"
    else:
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
    edges) and pool locally without padding on those dims; batch and channel splits stay local.
    Output shard i of a split dim reads the (dilated, padded) input from i * c_out * stride: where
    that is where input shard i starts (a 2x2 stride-2 pool on aligned blocks) nothing moves; else
    the halo windows of a conv with the same window, stride and dilation (contract._conv_window)."""
    (x,) = ctx.op.operands
    out = ctx.target()
    window, strides, padding = ctx.attrs["window"], ctx.attrs["strides"], ctx.attrs["padding"]
    lhs = _lhs(ctx.attrs)
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
    plans, windows, scale = {}, [], {}
    for i in split:
        k = ctx.mesh.group_size(out.dims[1 + i])
        win, dilated, dl, pads = _conv_window(n_out[1 + i], k, strides[i], padding[i][0], window[i], lhs[i], 1)
        win = replace(win, fill=fill)
        plans[i] = (win, dilated, dl, pads)
        windows.append((1 + i, win))
        if dilated:
            scale[1 + i] = lhs[i]
    local_out = Sharding(out.dims).local_shape(n_out, ctx.mesh)
    whole = [n_out[d] if d in [1 + i for i in split] else m for d, m in enumerate(local_out)]
    replicated = prod(window) * (prod(whole) - prod(local_out))
    if not _worth_it(ctx, 0, tuple(dims), windows, replicated, scale):
        return ctx.generic()
    xl = ctx.reshard(0, Sharding(tuple(dims)))
    pads, lhs_local = [tuple(p) for p in padding], list(lhs)
    for i in split:
        win, dilated, dl, pad = plans[i]
        d = 1 + i
        n = x.type.shape[d]
        if dilated:
            xl = _dilate_dim(ctx, xl, d, lhs[i], fill)
            n *= lhs[i]  # the trailing holes hold the fill too
        xl = ctx.window(xl, d, dims[d], out.dims[d], n, win)
        pads[i], lhs_local[i] = tuple(pad), dl
    attrs = dict(reduce=ctx.attrs["reduce"], window=tuple(window), strides=tuple(strides), padding=tuple(pads))
    if any(d > 1 for d in lhs_local):
        attrs["lhs_dilation"] = tuple(lhs_local)
    ctx.set_result(ctx.emit("pool", xl, **attrs), out)


def _dilate_dim(ctx, x, d: int, m: int, fill):
    """x with m - 1 `fill`s after every element along dim d (size c -> c*m), as contract's
    _dilate_dim with the pool's identity in the holes."""
    shape = x.type.shape
    y = ctx.emit("reshape", x, shape=shape[:d + 1] + (1,) + shape[d + 1:])
    y = ctx.pad_dim(y, d + 1, 0, m - 1, fill)
    return ctx.emit("reshape", y, shape=shape[:d] + (shape[d] * m,) + shape[d + 1:])


register("pool", doc="max or sum of each window over the spatial dims of [N, spatial..., C] (lhs_dilation: "
                     "the input spread out, the identity in the holes)",
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
    dim whose shards the reshape does not keep.) A sum pool's gradient is a sum pool instead
    (_sum_pool_transpose): the same halos, without the conv."""
    from .contract import conv_attrs

    (x,) = op.operands
    if not T.is_float(x.type.dtype):
        return (None,)
    kind, window, strides, padding = (op.attrs[k] for k in ("reduce", "window", "strides", "padding"))
    out_shape = op.result.type.shape
    nsp = len(window)
    if kind == "sum":
        transposed = _sum_pool_transpose(d, op, ct)
        if transposed is not None:
            return (transposed,)
    check(all(m == 1 for m in _lhs(op.attrs)), "pool: no gradient for this lhs-dilated pool")
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


def _sum_pool_transpose(d, op, ct):
    """A sum pool's gradient as a sum pool of the cotangent: out[m] = sum_o P[m*s + o] (P the input
    dilated by l and padded by lo, hi) gives dx[j] = sum over m*s + o = lo + j*l of ct[m], which is
    the pool of ct dilated by s, padded by (w - 1 - lo, hi'), window w, stride l. None where that
    padding would be negative (a window reaching more than its size into the padding)."""
    (x,) = op.operands
    window, strides, padding = op.attrs["window"], op.attrs["strides"], op.attrs["padding"]
    lhs = _lhs(op.attrs)
    m_out, n_in = op.result.type.shape[1:-1], x.type.shape[1:-1]
    pads = []
    for w, s, lo, m, n, l in zip(window, strides, (p[0] for p in padding), m_out, n_in, lhs):
        lo_t, hi_t = w - 1 - lo, (n - 1) * l + lo - (m - 1) * s
        if lo_t < 0 or hi_t < 0:
            return None
        pads.append((lo_t, hi_t))
    attrs = dict(reduce="sum", window=tuple(window), strides=tuple(lhs), padding=tuple(pads))
    if any(s > 1 for s in strides):
        attrs["lhs_dilation"] = tuple(strides)
    dx = d.emit("pool", ct, **attrs)
    assert dx.type.shape == x.type.shape, (dx.type, x.type)
    return dx


set_vjp("pool", _pool_vjp)
