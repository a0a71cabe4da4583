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
A max pool's gradient is its own op, select_and_scatter_add (below), as in jax.lax and XLA: the
cotangent of each window at the window's first maximum, halos of the input and the cotangent.
"""

from __future__ import annotations

from dataclasses import replace
from math import prod

import numpy as np

from ..ir import types as T
from ..ir.mesh import Sharding
from ..partition.factors import PASS, PERMUTATION, RuleBuilder
from ..partition.halo import Window
from ..partition.reshard import chunk
from . import extremes
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
        acc = part if acc is None else (extremes.maximum(acc, part) if kind == "max" else acc + part)
    return np.asarray(acc).astype(x.dtype)


def _full(per_spatial) -> tuple:
    return (1, *per_spatial, 1)


def _full_padding(padding) -> tuple:
    return ((0, 0), *(tuple(p) for p in padding), (0, 0))


def _jax(args, attrs, out):
    """A max pool is jax.lax.reduce_window (its gradient: select_and_scatter_add, as ours). A sum
    pool is explicit strided slices of the padded input added one by one: XLA's SPMD partitioner
    has given wrong answers for two reduce_windows of one split operand with different init values
    (see ops/scan.py), so a max and a sum pool of one image must not both be reduce_windows."""
    kind, window, strides, padding = attrs["reduce"], attrs["window"], attrs["strides"], attrs["padding"]
    x = args[0]
    dt = out[0].dtype
    fill = _identity(kind, dt)
    fill_text = f'float("{fill}")' if isinstance(fill, float) and fill in (np.inf, -np.inf) else repr(fill)
    lhs = _lhs(attrs)
    if kind == "max" and not any(d > 1 for d in lhs):
        # jax.lax's own max pool, so that jax.grad of the module (the xla backend's gradient)
        # routes a window's cotangent as ours does: select_and_scatter_add, the first maximum
        # (a Python scalar init: jax recognises the max monoid, reduce_window_max, with its gradient)
        # (an int's init in its own dtype: a Python int is an i64 where the module enables x64)
        init = fill_text if T.is_float(dt) else f"jnp.asarray({fill_text}, {T.jnp_dtype(dt)})"
        return f"jax.lax.reduce_window({x}, {init}, jax.lax.max, {_full(window)}, " \
               f"{_full(strides)}, {_full_padding(padding)})"
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
        xl = ctx.window(xl, d, dims[d], out.dims[d], n, win, first=i == split[0])
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
    """A max pool's gradient is select_and_scatter_add (below): each window's cotangent goes to the
    first maximum of the window, as jax.lax.reduce_window's rule and XLA have it. A sum pool's is a
    sum pool of the cotangent (_sum_pool_transpose); where that does not apply (a window reaching
    more than its size into the padding) the cotangent goes back through a transposed depthwise
    conv (_sum_pool_conv_transpose)."""
    (x,) = op.operands
    if not T.is_float(x.type.dtype):
        return (None,)
    kind, window, strides, padding = (op.attrs[k] for k in ("reduce", "window", "strides", "padding"))
    if kind == "max":
        check(all(m == 1 for m in _lhs(op.attrs)), "pool: no gradient for this lhs-dilated max pool")
        return (d.emit("select_and_scatter_add", ct, x, window=tuple(window), strides=tuple(strides),
                       padding=tuple(tuple(p) for p in padding)),)
    transposed = _sum_pool_transpose(d, op, ct)
    if transposed is not None:
        return (transposed,)
    if any(m > 1 for m in _lhs(op.attrs)):
        return (_sum_pool_transpose(d, op, ct, crop=True),)
    return (_sum_pool_conv_transpose(d, op, ct),)


def _sum_pool_conv_transpose(d, op, ct):
    """A sum pool's cotangent back to its input as one transposed depthwise conv: every window tap
    gets the cotangent (the taps stacked as channels, a one-hot kernel flipped, lhs_dilation the
    strides, padding cropped away), which partitions as a halo exchange on split spatial dims."""
    from .contract import conv_attrs

    (x,) = op.operands
    window, strides, padding = op.attrs["window"], op.attrs["strides"], op.attrs["padding"]
    out_shape = op.result.type.shape
    nsp = len(window)
    taps = list(np.ndindex(*window))
    cts = [ct] * len(taps)
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
    return cx


def _sum_pool_transpose(d, op, ct, crop: bool = False):
    """A sum pool's gradient as a sum pool of the cotangent: out[m] = sum_o P[m*s + o] (P the input
    dilated by l and padded by lo, hi) gives dx[j] = sum over m*s + o = lo + j*l of ct[m], which is
    the pool of ct dilated by s, padded by (w - 1 - lo, hi'), window w, stride l. Where a window
    reaches more than its size into the padding, that padding is negative: None, or with `crop`
    the pool padded less (the front to a multiple of l short of the cut) and its outputs sliced."""
    (x,) = op.operands
    window, strides, padding = op.attrs["window"], op.attrs["strides"], op.attrs["padding"]
    lhs = _lhs(op.attrs)
    m_out, n_in = op.result.type.shape[1:-1], x.type.shape[1:-1]
    pads, starts = [], []
    for w, s, lo, m, n, l in zip(window, strides, (p[0] for p in padding), m_out, n_in, lhs):
        lo_t, hi_t = w - 1 - lo, (n - 1) * l + lo - (m - 1) * s
        if (lo_t < 0 or hi_t < 0) and not crop:
            return None
        # dx[j] is the window at (j + q) * l of the cotangent dilated by s and padded by front (>= 0)
        front = lo_t if lo_t >= 0 else lo_t % l
        q = 0 if lo_t >= 0 else (front - lo_t) // l
        pads.append((front, max(0, (q + n - 1) * l + w - front - ((m - 1) * s + 1))))
        starts.append(q)
    attrs = dict(reduce="sum", window=tuple(window), strides=tuple(lhs), padding=tuple(pads))
    if any(s > 1 for s in strides):
        attrs["lhs_dilation"] = tuple(strides)
    dx = d.emit("pool", ct, **attrs)
    if dx.type.shape != x.type.shape:
        dx = d.emit("slice", dx, starts=(0,) + tuple(starts) + (0,),
                    stops=(x.type.shape[0],) + tuple(q + n for q, n in zip(starts, n_in)) + (x.type.shape[-1],),
                    steps=(1,) * x.type.rank)
    assert dx.type.shape == x.type.shape, (dx.type, x.type)
    return dx


set_vjp("pool", _pool_vjp)


# ---------------------------------------------------------------------------------- select_and_scatter_add
# A max pool's gradient, as jax.lax and XLA have it: each window's cotangent (`source`, shaped as
# the pool's result) goes to the one element of the window that the pool selected, the rest get
# nothing. The selection scans the window in order (row-major over the window dims), padding
# included as -inf elements: it starts at the first element and moves to the next e wherever
# not (selected >= e) (XLA's select with jax's `ge`): the first maximum; a NaN is passed over by
# the next element and takes the place of any element before it, as XLA does; a cotangent whose
# selection ends on padding (a window of -infs that starts in the padding) is dropped.


def _sas_window(operand_shape, attrs):
    return [conv_output_size(n, w, s, lo, hi) for n, w, s, (lo, hi) in
            zip(operand_shape[1:-1], attrs["window"], attrs["strides"], attrs["padding"])]


def _sas_infer(operands, attrs):
    src, x = operands
    window, strides, padding = attrs["window"], attrs["strides"], attrs["padding"]
    nsp = len(window)
    check(T.is_float(x.dtype) and src.dtype == x.dtype,
          f"select_and_scatter_add needs a float operand and a source of its dtype, got {src} and {x}")
    check(x.rank == nsp + 2 and len(strides) == len(padding) == nsp,
          f"select_and_scatter_add: {x} is not [N, spatial..., C] with one window, stride and padding per "
          f"spatial dim")
    check(all(w >= 1 for w in window) and all(s >= 1 for s in strides)
          and all(lo >= 0 and hi >= 0 for lo, hi in padding),
          "select_and_scatter_add: windows and strides must be positive, padding not negative")
    out = _sas_window(x.shape, attrs)
    check(all(m >= 1 for m in out), f"select_and_scatter_add: window {list(window)} does not fit {x}")
    want = (x.shape[0], *out, x.shape[-1])
    check(tuple(src.shape) == want, f"select_and_scatter_add: the source {src} must be shaped as the pool "
                                    f"of {x}: {list(want)}")
    return x


def _sas_rule(operands, results, attrs):
    """As pool's: a spatial dim of the operand, of the source (the pool's result) and of the result
    share one factor, so a row split carries through; batch and channel pass."""
    (x,) = results
    b = RuleBuilder()
    n, c = b.factor(x.shape[0], PASS), b.factor(x.shape[-1], PASS)
    sp = [b.factor(m, PERMUTATION) for m in x.shape[1:-1]]
    dims = [(n,)] + [(f,) for f in sp] + [(c,)]
    return b.build([dims, dims], [dims])


def _sas_taps(xp, window, strides, out):
    """The padded operand's element at each window tap of every window, in window order."""
    for offs in np.ndindex(*window):
        yield offs, (slice(None),) + tuple(slice(o, o + (m - 1) * s + 1, s) for o, m, s in
                                           zip(offs, out, strides)) + (slice(None),)


def _sas_numpy(source, x, *, window, strides, padding):
    wide = np.float32 if T.np_is_narrow_float(x.dtype) else x.dtype
    out = _sas_window(x.shape, {"window": window, "strides": strides, "padding": padding})
    pad = [(0, 0)] + [tuple(p) for p in padding] + [(0, 0)]
    xp = np.pad(x.astype(wide), pad, constant_values=-np.inf)
    taps = list(_sas_taps(xp, window, strides, out))
    best, pick = xp[taps[0][1]], np.zeros(source.shape, dtype=np.int64)
    for j, (_, sl) in enumerate(taps[1:], 1):  # one vectorised step per window tap
        e = xp[sl]
        move = ~(best >= e)
        best, pick = np.where(move, e, best), np.where(move, j, pick)
    acc = np.zeros(xp.shape, dtype=wide)
    src = source.astype(wide)
    for j, (_, sl) in enumerate(taps):
        acc[sl] += np.where(pick == j, src, 0)  # windows of one stride step never share a tap's element
    crop = (slice(None),) + tuple(slice(lo, lo + n) for (lo, _), n in zip(padding, x.shape[1:-1])) + (slice(None),)
    return acc[crop].astype(x.dtype)


def _sas_jax(args, attrs, out):
    """jax.vjp of lax.reduce_window max: XLA's select_and_scatter (the forward is dead code)."""
    src, x = args
    return (f"jax.vjp(lambda _x: jax.lax.reduce_window(_x, -jnp.inf, jax.lax.max, "
            f"{_full(attrs['window'])}, {_full(attrs['strides'])}, {_full_padding(attrs['padding'])}), "
            f"{x})[1]({src})[0]")


def _sas_partition(ctx):
    """Split spatial dims: result shard i holds operand rows [i*c, (i+1)*c); it takes the source
    rows of the windows that reach them (0 past the edges: no cotangent) and the operand rows those
    windows cover (-inf past the edges: the padding), each a halo window of its own shards
    (partition.halo), runs select_and_scatter_add locally at the pool's stride without padding on
    that dim and keeps its own c rows. Where c is a multiple of the stride s every shard's windows
    start at the same phase: windows o in [i*c/s + o0, + L), operand rows [(i*c/s + o0)*s - lo,
    + (L-1)*s + w) (a 2x2 stride-2 pool on aligned blocks moves nothing). Else the first window
    reaching a shard (and so its phase against the shard's rows) is a floor of i*c/s: each side
    takes the affine halo window that holds every shard's part, and a dynamic slice at the shard's
    own offset (_SasPhase) picks the L windows and their rows, as XLA's partitioner does. Uneven
    splits: rows past the end are filled, so a shard's padding rows (NaN in the simulator) never
    reach its result."""
    src, x = ctx.op.operands
    out = ctx.target()
    window, strides, padding = ctx.attrs["window"], ctx.attrs["strides"], ctx.attrs["padding"]
    nsp = len(window)
    split = [i for i in range(nsp) if out.dims[1 + i]]
    if not split or ctx.layout(0).partial or ctx.layout(1).partial:
        return ctx.generic()
    n_in = x.type.shape
    plans = {}
    for i in split:
        k = ctx.mesh.group_size(out.dims[1 + i])
        c = chunk(n_in[1 + i], k)
        w, s, lo = window[i], strides[i], padding[i][0]
        o0 = -((w - 1 - lo) // s)  # ceil((lo - w + 1) / s): the first window reaching row 0 of a shard
        length = (c - 1 + lo) // s - o0 + 1
        span = (length - 1) * s + w
        own = lo - o0 * s  # where the shard's first row lies in its operand window
        if c % s == 0 and length >= 1 and 0 <= own and own + c <= span:
            plans[i] = (Window(a=c // s, s=o0, length=length, fill=0.0),
                        Window(a=c, s=o0 * s - lo, length=span, fill=-np.inf), own, c)
        else:
            plans[i] = _SasPhase(n_in[1 + i], k, chunk(src.type.shape[1 + i], k), w, s, lo)
    locals_ = []
    for j, v in enumerate((src, x)):
        cur = ctx.layout(j)
        dims = [out.dims[0]] + [out.dims[1 + i] if i in split and cur.dims[1 + i] == out.dims[1 + i] else ()
                                for i in range(nsp)] + [out.dims[-1]]
        lv = ctx.reshard(j, Sharding(tuple(dims)))
        for i in split:
            d, plan = 1 + i, plans[i]
            if isinstance(plan, _SasPhase):
                lv = plan.side(ctx, lv, d, dims[d], out.dims[d], v.type.shape[d], j)
            else:
                lv = ctx.window(lv, d, dims[d], out.dims[d], v.type.shape[d], plan[j], first=i == split[0])
        locals_.append(lv)
    pads = [(0, 0) if i in split else tuple(padding[i]) for i in range(nsp)]
    y = ctx.emit("select_and_scatter_add", *locals_, window=tuple(window), strides=tuple(strides),
                 padding=tuple(pads))
    for i in split:
        plan = plans[i]
        if isinstance(plan, _SasPhase):
            y = plan.own(ctx, y, 1 + i, out.dims[1 + i])
        else:
            y = ctx.slice_dim(y, 1 + i, plan[2], plan[2] + plan[3])
    ctx.set_result(y, out)


class _SasPhase:
    """select_and_scatter_add on a split dim whose shards start at different phases of the stride
    (c not a multiple of s). Shard i (operand rows [i*c, i*c + c)) takes the windows o in
    [o_i, o_i + L), o_i = ceil((i*c + lo - w + 1) / s) the first window reaching its rows (L: the
    most windows any shard's rows meet), and the operand rows [o_i*s - lo, + (L-1)*s + w) they
    cover. o_i - i*c_src (the source shards' chunk c_src) and the phase
    r_i = (i*c + lo - w + s) mod s vary with i but stay within a few rows: each side fetches the
    affine halo window that holds every shard's part (only rows some shard's windows really meet:
    a shard's last windows may lie past its rows, their values never reach its result) and takes
    its part by a dynamic slice (static where every shard's is the same). The local result covers
    operand rows from i*c - w + 1 + (s - 1 - r_i); its own c rows are a dynamic slice again. Offsets
    are planned over the shards that hold rows; the rest (all padding) get clamped slices.
    """

    def __init__(self, n: int, k: int, c_src: int, w: int, s: int, lo: int):
        c = chunk(n, k)
        self.c, self.c_src, self.w, self.s, self.lo = c, c_src, w, s, lo
        active = range(min(k, -(-n // c)))
        first = {i: -(-(i * c + lo - w + 1) // s) for i in active}  # o_i
        last = {i: (i * c + c - 1 + lo) // s for i in active}  # the last window starting in the rows
        phi = {i: first[i] * s - lo - (i * c - w + 1) for i in active}  # in [0, s)
        self.L = max(1, max(last[i] - first[i] + 1 for i in active))
        self.x_size = (self.L - 1) * s + w
        # the source: shard i needs [d_i, d_i + count_i) of it (relative to i*c_src), uses d_i + L
        d = {i: first[i] - i * c_src for i in active}
        self.src_lo = min(d.values())
        src_hi = max(d[i] + max(0, last[i] - first[i] + 1) for i in active)
        self.src_win = Window(a=c_src, s=self.src_lo, length=max(1, src_hi - self.src_lo), fill=0.0)
        self.src_need = max(d.values()) - self.src_lo + self.L
        self.src_static = d[0] - self.src_lo if len(set(d.values())) == 1 else None
        # the operand: shard i needs rows [phi_i - w + 1, last_i*s - lo + w - i*c) of it, uses + x_size
        starts = {i: phi[i] - w + 1 for i in active}
        self.x_lo = min(starts.values())
        x_hi = max(last[i] * s - lo + w - i * c for i in active)
        self.x_win = Window(a=c, s=self.x_lo, length=max(1, x_hi - self.x_lo), fill=-np.inf)
        self.x_need = max(starts.values()) - self.x_lo + self.x_size
        self.x_static = starts[0] - self.x_lo if len(set(starts.values())) == 1 else None
        # the result: own rows at w - 1 - phi_i of the local result (padded to hold every shard's)
        at = {i: w - 1 - phi[i] for i in active}
        self.pad_lo = max(0, -min(at.values()))
        self.pad_hi = max(0, max(at.values()) + c - self.x_size)
        self.own_static = at[0] + self.pad_lo if len(set(at.values())) == 1 else None

    def _phase(self, ctx, axes):
        """r_i = (i*c + lo - w + s) mod s, an i32 scalar: phi_i = s - 1 - r_i."""
        t = ctx.affine_index(axes, self.c, self.lo - self.w + self.s)
        return ctx.emit("mod", t, ctx.constant(self.s, "i32"))

    def side(self, ctx, v, d: int, in_axes, out_axes, n: int, j: int):
        """Operand j's local part on dim d: the source (j = 0) or the operand (j = 1)."""
        s = self.s
        if j == 0:
            v = ctx.window(v, d, in_axes, out_axes, n, self.src_win)
            v = ctx.pad_dim(v, d, 0, max(0, self.src_need - v.type.shape[d]), 0.0)
            if self.src_static is not None:
                return ctx.slice_dim(v, d, self.src_static, self.src_static + self.L)
            # o_i - i*c_src - src_lo = floor((i*(c - s*c_src) + lo - w + s - s*src_lo) / s)
            t = ctx.affine_index(out_axes, self.c - s * self.c_src, self.lo - self.w + s - s * self.src_lo)
            start = ctx.emit("floordiv", t, ctx.constant(s, "i32"))
            return ctx.emit("dynamic_slice_in_dim", v, start, dim=d, size=self.L)
        v = ctx.window(v, d, in_axes, out_axes, n, self.x_win)
        v = ctx.pad_dim(v, d, 0, max(0, self.x_need - v.type.shape[d]), -np.inf)
        if self.x_static is not None:
            return ctx.slice_dim(v, d, self.x_static, self.x_static + self.x_size)
        # phi_i - w + 1 - x_lo = (s - w - x_lo) - r_i
        start = ctx.emit("sub", ctx.constant(s - self.w - self.x_lo, "i32"), self._phase(ctx, out_axes))
        return ctx.emit("dynamic_slice_in_dim", v, start, dim=d, size=self.x_size)

    def own(self, ctx, y, d: int, axes):
        """The shard's own c rows of the local result."""
        y = ctx.pad_dim(y, d, self.pad_lo, self.pad_hi, 0.0)
        if self.own_static is not None:
            return ctx.slice_dim(y, d, self.own_static, self.own_static + self.c)
        # w - 1 - phi_i + pad_lo = (w - s + pad_lo) + r_i
        start = ctx.emit("add", self._phase(ctx, axes), ctx.constant(self.w - self.s + self.pad_lo, "i32"))
        return ctx.emit("dynamic_slice_in_dim", y, start, dim=d, size=self.c)


def _sas_vjp(d, op, ct):
    """Linear in the source: its cotangent is ct read back at each window's selected element (XLA's
    select_and_gather_add), the same scan over the window's taps; none to the operand (the
    selection is piecewise constant in it). As jax's rule, the scan starts from (-inf, 0): a window
    whose elements are all -inf reads 0 (the forward pass sent its source to the first of them)."""
    src, x = op.operands
    window, strides, padding = op.attrs["window"], op.attrs["strides"], op.attrs["padding"]
    out = src.type.shape[1:-1]
    lo, hi = (0,) + tuple(p[0] for p in padding) + (0,), (0,) + tuple(p[1] for p in padding) + (0,)
    xp = d.emit("pad", x, lo=lo, hi=hi, value=-np.inf)
    gp = d.emit("pad", ct, lo=lo, hi=hi, value=0.0)
    shape = src.type.shape
    best = d.emit("full", dtype=x.type.dtype, shape=shape, value=-np.inf)
    val = d.emit("full", dtype=ct.type.dtype, shape=shape, value=0.0)
    for offs, _ in _sas_taps(None, window, strides, out):
        starts = (0,) + tuple(offs) + (0,)
        stops = ((xp.type.shape[0],) + tuple(o + (m - 1) * s + 1 for o, m, s in zip(offs, out, strides))
                 + (xp.type.shape[-1],))
        steps = (1,) + tuple(strides) + (1,)
        e = d.emit("slice", xp, starts=starts, stops=stops, steps=steps)
        g = d.emit("slice", gp, starts=starts, stops=stops, steps=steps)
        move = d.emit("logical_not", d.emit("ge", best, e))
        best, val = d.emit("select", move, e, best), d.emit("select", move, g, val)
    return (val, None)


register("select_and_scatter_add",
         doc="a max pool's gradient: each window's source value added at the window's first maximum of the "
             "operand (jax.lax / XLA's select_and_scatter_add with `ge`; padding counts as -inf)",
         example=(("f32[2, 4, 4, 3]", "f32[2, 8, 8, 3]"), {"window": (2, 2), "strides": (2, 2),
                                                           "padding": ((0, 0), (0, 0))}),
         infer=_sas_infer, numpy=_sas_numpy, rule=_sas_rule, jax=_sas_jax, partition=_sas_partition,
         family=Family.layout, flops=lambda ops, res, attrs: ops[0].size * prod(attrs["window"]))
set_vjp("select_and_scatter_add", _sas_vjp)
