"""Contractions: einsum (matmul lowers to it) and convolution."""

from __future__ import annotations

import numpy as np

from ..ir import types as T
from ..ir.types import TensorType
from ..partition.factors import PASS, PERMUTATION, REDUCTION, REPLICATE, RuleBuilder, einsum_rule
from .moving import partition_conv
from .registry import Family, PartialMode, ReduceKind, check, register, set_vjp

# ---------------------------------------------------------------------------------- einsum


_LETTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")  # what numpy and jax accept


def parse_einsum(spec: str, ranks) -> tuple[list[str], str]:
    """Validate an explicit-output einsum spec against operand ranks; ShapeError if malformed."""
    check("->" in spec, f'einsum spec "{spec}" needs an explicit output ("->")')
    check("." not in spec, "einsum: ellipsis is not supported")
    ins, out = spec.replace(" ", "").split("->", 1)
    ins = ins.split(",")
    check(len(ins) == len(ranks), f'einsum spec "{spec}" names {len(ins)} operand(s), got {len(ranks)}')
    for letters, rank in zip(ins, ranks):
        check(all(c in _LETTERS for c in letters), f'einsum spec "{spec}": indices must be letters a-z, A-Z')
        check(len(letters) == rank, f'einsum spec "{spec}": "{letters}" has {len(letters)} indices '
              f"but the operand has rank {rank}")
        check(len(set(letters)) == len(letters), f'einsum spec "{spec}": index repeated within "{letters}"')
    check(all(c in _LETTERS for c in out) and len(set(out)) == len(out),
          f'einsum spec "{spec}": output indices must be distinct letters')
    check(set(out) <= set("".join(ins)), f'einsum spec "{spec}": output index not in any operand')
    return ins, out


def _einsum_infer(operands, attrs):
    ins, out = parse_einsum(attrs["spec"], [t.rank for t in operands])
    dt = operands[0].dtype
    check(all(t.dtype == dt for t in operands), "einsum: operand dtypes differ: "
          + " vs ".join(str(t) for t in operands))
    check(T.kind(dt) in ("float", "int"), f"einsum needs numeric operands, got {operands[0]}")
    sizes: dict[str, int] = {}
    for letters, t in zip(ins, operands):
        for c, n in zip(letters, t.shape):
            check(sizes.setdefault(c, n) == n,
                  f'einsum "{attrs["spec"]}": index {c} is {sizes[c]} in one operand and {n} in another')
    return TensorType(dt, tuple(sizes[c] for c in out))


def _einsum_numpy(*xs, spec):
    dt = xs[0].dtype
    wide = [T.widen(x) for x in xs]
    return np.asarray(np.einsum(spec, *wide, optimize=len(xs) > 1)).astype(dt)


def _einsum_jax(args, attrs, out):
    acc = ", preferred_element_type=jnp.float32" if out[0].dtype in ("bf16", "f16") else ""
    text = f'jnp.einsum("{attrs["spec"]}", {", ".join(args)}{acc})'
    return f"{text}.astype({T.jnp_dtype(out[0].dtype)})" if acc else text


def _einsum_flops(operands, results, attrs) -> int:
    """One multiply-add (2 flops) per point of the index space; a one-operand einsum only adds."""
    ins, _ = parse_einsum(attrs["spec"], [t.rank for t in operands])
    sizes = {c: n for letters, t in zip(ins, operands) for c, n in zip(letters, t.shape)}
    n = 2 if len(operands) > 1 else 1
    for s in sizes.values():
        n *= s
    return n


def _conv_flops(operands, results, attrs) -> int:
    x, w = operands
    n = 2 * results[0].size
    for s in w.shape[:-1]:
        n *= s
    return n


register("einsum", doc="contraction of one or two operands over named indices (explicit output)",
         example=(("f32[8, 16]", "f32[16, 4]"), {"spec": "ij,jk->ik"}),
         infer=_einsum_infer, numpy=_einsum_numpy, flops=_einsum_flops,
         rule=lambda ops, res, attrs: einsum_rule(attrs["spec"].replace(" ", ""), [t.shape for t in ops],
                                                  res[0].shape),
         jax=_einsum_jax, partial=PartialMode.multilinear, reduce_fill=lambda dtype: 0, reduce_kind=ReduceKind.sum,
         family=Family.contract)

# ---------------------------------------------------------------------------------- conv


def conv_output_size(n: int, window: int, stride: int, lo: int, hi: int) -> int:
    return (n + lo + hi - window) // stride + 1


def _conv_infer(operands, attrs):
    x, w = operands
    strides, padding = attrs["strides"], attrs["padding"]
    nsp = len(strides)
    check(x.rank == nsp + 2, f"conv: input {x} must be [N, spatial..., C] with {nsp} spatial dim(s)")
    check(w.rank == nsp + 2, f"conv: kernel {w} must be [window..., C, F] with {nsp} window dim(s)")
    check(x.dtype == w.dtype, f"conv: dtypes differ: {x} vs {w}")
    check(T.is_float(x.dtype), f"conv needs float operands, got {x}")
    check(x.shape[-1] == w.shape[-2], f"conv: input has {x.shape[-1]} channels, kernel expects {w.shape[-2]}")
    out = [x.shape[0]]
    for i in range(nsp):
        n = conv_output_size(x.shape[1 + i], w.shape[i], strides[i], *padding[i])
        check(n >= 1, f"conv: window {w.shape[i]} does not fit spatial dim {x.shape[1 + i]} "
              f"with padding {list(padding[i])}")
        out.append(n)
    out.append(w.shape[-1])
    return TensorType(x.dtype, tuple(out))


def _conv_rule(operands, results, attrs):
    x, w = operands
    nsp = len(attrs["strides"])
    b = RuleBuilder()
    n = b.factor(x.shape[0])
    spatial = [b.factor(results[0].shape[1 + i], PERMUTATION) for i in range(nsp)]
    window = [b.factor(w.shape[i], REPLICATE) for i in range(nsp)]
    c = b.factor(x.shape[-1], REDUCTION)
    f = b.factor(w.shape[-1], PASS)
    xd = [(n,)] + [(s,) for s in spatial] + [(c,)]
    wd = [(k,) for k in window] + [(c,), (f,)]
    od = [(n,)] + [(s,) for s in spatial] + [(f,)]
    return b.build([xd, wd], [od])


def conv_numpy(x, w, *, strides, padding):
    """Direct convolution: a sum over window offsets of strided slices times kernel taps."""
    dt = x.dtype
    xw, ww = T.widen(x), T.widen(w)
    nsp = len(strides)
    xp = np.pad(xw, [(0, 0)] + [tuple(p) for p in padding] + [(0, 0)])
    out_sp = [conv_output_size(x.shape[1 + i], w.shape[i], strides[i], *padding[i]) for i in range(nsp)]
    out = np.zeros((x.shape[0], *out_sp, w.shape[-1]), dtype=xw.dtype)
    for offset in np.ndindex(*w.shape[:nsp]):
        idx = tuple(slice(o, o + (m - 1) * s + 1, s) for o, m, s in zip(offset, out_sp, strides))
        patch = xp[(slice(None),) + idx + (slice(None),)]
        out += np.tensordot(patch, ww[offset], axes=([patch.ndim - 1], [0]))
    return out.astype(dt)


def _conv_jax(args, attrs, out):
    nsp = len(attrs["strides"])
    spec = ("NWC", "WIO", "NWC") if nsp == 1 else ("NHWC", "HWIO", "NHWC")
    pad = [tuple(p) for p in attrs["padding"]]
    return (f"jax.lax.conv_general_dilated({args[0]}, {args[1]}, window_strides={tuple(attrs['strides'])}, "
            f"padding={pad}, dimension_numbers={spec})")


register("conv", doc="convolution [N, spatial..., C] x [window..., C, F] -> [N, spatial..., F]",
         example=(("f32[2, 8, 8, 3]", "f32[3, 3, 3, 5]"), {"strides": (1, 1), "padding": ((1, 1), (1, 1))}),
         infer=_conv_infer, numpy=conv_numpy, rule=_conv_rule, jax=_conv_jax, partition=partition_conv,
         flops=_conv_flops,
         partial=PartialMode.multilinear, reduce_fill=lambda dtype: 0, reduce_kind=ReduceKind.sum,
         family=Family.contract)



# ---------------------------------------------------------------------------------- derivatives


def _einsum_vjp(d, op, ct):
    """Operand i's cotangent is an einsum of the result cotangent with the other operands, onto
    operand i's indices; indices that only operand i has (summed away alone) are broadcast back."""
    ins, out = parse_einsum(op.attrs["spec"], [v.type.rank for v in op.operands])
    if not T.is_float(op.result.type.dtype):
        return (None,) * len(op.operands)
    cts = []
    for i, v in enumerate(op.operands):
        others = [(ins[j], op.operands[j]) for j in range(len(ins)) if j != i]
        seen = set(out) | {c for letters, _ in others for c in letters}
        mine = "".join(c for c in ins[i] if c in seen)
        spec = ",".join([out] + [letters for letters, _ in others]) + "->" + mine
        g = d.emit("einsum", ct, *[w for _, w in others], spec=spec)
        if mine != ins[i]:
            g = d.emit("broadcast_in_dim", g, shape=v.type.shape, dims=tuple(ins[i].index(c) for c in mine))
        cts.append(g)
    return tuple(cts)


set_vjp("einsum", _einsum_vjp)


def _flip(d, w, dim: int):
    """w reversed along `dim` (a take at n-1, n-2, ..., 0)."""
    n = w.type.shape[dim]
    ids = d.emit("sub", d.const(n - 1, "i32"), d.emit("iota", dtype="i32", shape=(n,), axis=0))
    return d.emit("take", w, ids, axis=dim)


def _conv_vjp(d, op, ct):
    """jax's conv transposes, with stride-1 convs only: the cotangent dilated by the strides (zeros
    interleaved), then for x a full correlation with the flipped kernel (in and out channels
    swapped), for w a correlation of the padded input with the cotangent over the batch (batch and
    channels swapped)."""
    from .layout import embed

    x, w = op.operands
    strides, padding = op.attrs["strides"], op.attrs["padding"]
    nsp = len(strides)
    sp = range(1, nsp + 1)
    win = w.type.shape[:nsp]
    ctd = ct
    for i, s in enumerate(strides):
        m = ct.type.shape[1 + i]
        if s > 1:
            ctd = embed(d, ctd, (m - 1) * s + 1, 1 + i, 0, s)
    dil = ctd.type.shape[1:1 + nsp]
    ones = (1,) * nsp
    # d x: correlate the dilated cotangent, padded by window - 1 (and whatever the forward's
    # padded input had beyond the last window), with the flipped, channel-swapped kernel
    wf = w
    for i in range(nsp):
        if win[i] > 1:
            wf = _flip(d, wf, i)
    wf = d.emit("transpose", wf, perm=tuple(range(nsp)) + (nsp + 1, nsp))
    full = [x.type.shape[1 + i] + padding[i][0] + padding[i][1] for i in range(nsp)]
    pads = tuple((win[i] - 1, win[i] - 1 + full[i] - (dil[i] + win[i] - 1)) for i in range(nsp))
    dxp = d.emit("conv", ctd, wf, strides=ones, padding=pads)
    cx = d.emit("slice", dxp, starts=(0,) + tuple(p[0] for p in padding) + (0,),
                stops=(x.type.shape[0],) + tuple(p[0] + x.type.shape[1 + i] for i, p in enumerate(padding))
                + (x.type.shape[-1],), steps=(1,) * (nsp + 2))
    # d w: batch and channels swapped, the dilated cotangent as the kernel
    rank = nsp + 2
    xt = d.emit("transpose", x, perm=(rank - 1,) + tuple(sp) + (0,))
    ctt = d.emit("transpose", ctd, perm=tuple(sp) + (0, rank - 1))
    dw = d.emit("conv", xt, ctt, strides=ones, padding=tuple(tuple(p) for p in padding))
    if dw.type.shape[1:1 + nsp] != tuple(win):
        dw = d.emit("slice", dw, starts=(0,) * rank, stops=(dw.type.shape[0],) + tuple(win) + (dw.type.shape[-1],),
                    steps=(1,) * rank)
    cw = d.emit("transpose", dw, perm=tuple(sp) + (0, rank - 1))
    return cx, cw


set_vjp("conv", _conv_vjp)
