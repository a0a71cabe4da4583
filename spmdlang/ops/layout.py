"""Data movement: transpose, reshape, broadcast_in_dim, slice, pad, concat, roll.

transpose/reshape/broadcast keep elements aligned with their factors, so the generic partitioner
handles them. slice/pad/concat/roll move elements along a dim: that dim is a permutation factor,
split freely by propagation, and partitioned by the op's custom step.
"""

from __future__ import annotations

import numpy as np

from ..ir import types as T
from ..ir.types import TensorType
from ..partition.factors import PASS, PERMUTATION, RuleBuilder, reshape_rule
from .moving import partition_concat, partition_pad, partition_reshape, partition_roll, partition_slice
from .registry import Family, PartialMode, check, no_flops, py_literal, register, set_vjp

# ---------------------------------------------------------------------------------- transpose


def _transpose_infer(operands, attrs):
    (x,) = operands
    perm = attrs["perm"]
    check(sorted(perm) == list(range(x.rank)), f"transpose: {list(perm)} is not a permutation of {x.rank} dims")
    return x.with_shape(x.shape[p] for p in perm)


def _transpose_rule(operands, results, attrs):
    (x,) = operands
    b = RuleBuilder()
    fs = [b.factor(n) for n in x.shape]
    return b.build([[(f,) for f in fs]], [[(fs[p],) for p in attrs["perm"]]])


register("transpose", doc="permute the dims: result dim i is operand dim perm[i]",
         example=(("f32[2, 3, 4]",), {"perm": (2, 0, 1)}), flops=no_flops, infer=_transpose_infer,
         numpy=lambda x, *, perm: np.transpose(x, perm).copy(),
         rule=_transpose_rule, partial=PartialMode.additive, family=Family.layout,
         jax=lambda a, attrs, out: f"jnp.transpose({a[0]}, {tuple(attrs['perm'])})",
         jax_local=lambda a, attrs, out: f"jax.lax.transpose({a[0]}, {tuple(attrs['perm'])})")

# ---------------------------------------------------------------------------------- reshape


def _reshape_infer(operands, attrs):
    (x,) = operands
    shape = tuple(attrs["shape"])
    out = TensorType(x.dtype, shape)
    check(out.size == x.size, f"reshape: cannot reshape {x} ({x.size} elements) to {list(shape)} ({out.size})",
          blame="shape")
    return out


def _local_shape(attrs, operands, shapes):
    return {**attrs, "shape": tuple(shapes[0])}


register("reshape", doc="the same elements in row-major order, in `shape`",
         example=(("f32[8, 64, 256]",), {"shape": (8, 64, 8, 32)}),
         flops=no_flops, infer=_reshape_infer, numpy=lambda x, *, shape: np.reshape(x, shape),
         localize=_local_shape, partition=partition_reshape,
         rule=lambda ops, res, attrs: reshape_rule(ops[0].shape, res[0].shape),
         partial=PartialMode.additive, family=Family.layout,
         jax=lambda a, attrs, out: f"jnp.reshape({a[0]}, {tuple(out[0].shape)})",
         jax_local=lambda a, attrs, out: f"jax.lax.reshape({a[0]}, {tuple(out[0].shape)})")

# ---------------------------------------------------------------------------------- broadcast


def _broadcast_infer(operands, attrs):
    (x,) = operands
    shape, dims = tuple(attrs["shape"]), tuple(attrs["dims"])
    check(len(dims) == x.rank and all(0 <= d < len(shape) for d in dims)
          and list(dims) == sorted(set(dims)), f"broadcast: bad dims {list(dims)} for {x}")
    for i, d in enumerate(dims):
        check(x.shape[i] in (1, shape[d]), f"cannot broadcast {x} to {list(shape)}")
    return x.with_shape(shape)


def _broadcast_rule(operands, results, attrs):
    (x,) = operands
    shape, dims = attrs["shape"], attrs["dims"]
    b = RuleBuilder()
    fs = [b.factor(n) for n in shape]
    ins = [(fs[d],) if x.shape[i] == shape[d] and shape[d] != 1 else () for i, d in enumerate(dims)]
    return b.build([ins], [[(f,) for f in fs]])


def _broadcast_numpy(x, *, shape, dims):
    expanded = np.reshape(x, [x.shape[dims.index(d)] if d in dims else 1 for d in range(len(shape))])
    return np.broadcast_to(expanded, shape).copy()  # ascontiguousarray would make a 0-d array 1-d


register("broadcast_in_dim", doc="operand dim i becomes result dim dims[i] (size 1 or equal); other dims repeat",
         example=(("f32[16]",), {"shape": (8, 16), "dims": (1,)}),
         flops=no_flops, infer=_broadcast_infer, numpy=_broadcast_numpy, rule=_broadcast_rule,
         localize=_local_shape,
         partial=PartialMode.additive, family=Family.layout,
         jax=lambda a, attrs, out: f"jax.lax.broadcast_in_dim({a[0]}, {tuple(out[0].shape)}, {tuple(attrs['dims'])})")

# ---------------------------------------------------------------------------------- slice


def _slice_infer(operands, attrs):
    (x,) = operands
    starts, stops, steps = attrs["starts"], attrs["stops"], attrs["steps"]
    check(len(starts) == len(stops) == len(steps) == x.rank, f"slice: wrong number of indices for {x}")
    shape = []
    for n, a, b, s in zip(x.shape, starts, stops, steps):
        check(s >= 1 and 0 <= a <= b <= n, f"slice: bad range {a}:{b}:{s} for a dim of {n}")
        shape.append(-(-(b - a) // s))
    return x.with_shape(shape)


def _moves(n, attrs_for_dim) -> bool:
    return attrs_for_dim != (0, n, 1)


def _slice_rule(operands, results, attrs):
    (x,) = operands
    b = RuleBuilder()
    fs = [b.factor(m, PERMUTATION if _moves(n, (a, e, s)) else PASS)
          for n, m, a, e, s in zip(x.shape, results[0].shape, attrs["starts"], attrs["stops"], attrs["steps"])]
    return b.build([[(f,) for f in fs]], [[(f,) for f in fs]])


def _slice_numpy(x, *, starts, stops, steps):
    return x[tuple(slice(a, b, s) for a, b, s in zip(starts, stops, steps))].copy()


def _slice_jax(a, attrs, out):
    idx = ", ".join(f"{s}:{e}" + (f":{st}" if st != 1 else "")
                    for s, e, st in zip(attrs["starts"], attrs["stops"], attrs["steps"]))
    return f"{a[0]}[{idx}]"


def _slice_jax_local(a, attrs, out):
    """jax.lax.slice, which x[a:b] traces to after jnp's index parsing; a whole x is x itself (as jnp
    returns it)."""
    starts, stops, steps = (tuple(attrs[k]) for k in ("starts", "stops", "steps"))
    if starts == (0,) * len(starts) and steps == (1,) * len(steps) and stops == tuple(out[0].shape) \
            and stops == tuple(attrs["operand_types"][0].shape):
        return a[0]
    strides = f", {steps}" if any(st != 1 for st in steps) else ""
    return f"jax.lax.slice({a[0]}, {starts}, {stops}{strides})"


def _slice_localize(attrs, operands, shapes):
    """Dims the slice leaves whole may be split: they span the local operand."""
    (x,) = operands
    stops = tuple(x.shape[d] if (a, s) == (0, 1) and shapes[0][d] == x.shape[d] else e
                  for d, (a, e, s) in enumerate(zip(attrs["starts"], attrs["stops"], attrs["steps"])))
    return {**attrs, "stops": stops}


register("slice", doc="x[starts:stops:steps] per dim (static bounds)",
         example=(("f32[8, 16]",), {"starts": (0, 2), "stops": (8, 10), "steps": (1, 1)}),
         flops=no_flops, infer=_slice_infer, numpy=_slice_numpy, rule=_slice_rule, partial=PartialMode.additive,
         localize=_slice_localize, partition=partition_slice,
         jax=_slice_jax, jax_local=_slice_jax_local, family=Family.layout)

# ---------------------------------------------------------------------------------- pad


def _pad_infer(operands, attrs):
    (x,) = operands
    lo, hi = attrs["lo"], attrs["hi"]
    check(len(lo) == len(hi) == x.rank, f"pad: needs one [lo, hi] pair per dim of {x}")
    check(all(v >= 0 for v in lo + hi), "pad: padding must be non-negative", blame="lo")
    return x.with_shape(n + a + b for n, a, b in zip(x.shape, lo, hi))


def _pad_rule(operands, results, attrs):
    (x,) = operands
    b = RuleBuilder()
    fs = [b.factor(m, PERMUTATION if (lo or hi) else PASS)
          for m, lo, hi in zip(results[0].shape, attrs["lo"], attrs["hi"])]
    return b.build([[(f,) for f in fs]], [[(f,) for f in fs]])


def _pad_numpy(x, *, lo, hi, value):
    if not lo:  # rank 0: nothing to pad (np.pad rejects the empty widths)
        return x.copy()
    return np.pad(x, list(zip(lo, hi)), constant_values=np.asarray(value).astype(x.dtype))


def _pad_jax(a, attrs, out):
    if not attrs["lo"]:  # jnp.pad rejects a rank-0 operand's empty widths
        return a[0]
    return f"jnp.pad({a[0]}, {list(zip(attrs['lo'], attrs['hi']))}, constant_values={py_literal(attrs['value'])})"


def _pad_jax_local(a, attrs, out):
    """jax.lax.pad, which jnp.pad binds, where the value is exact in the dtype (jnp.pad rounds a
    float through f32 first; no rounding, no difference)."""
    dt, value = out[0].dtype, attrs["value"]
    with np.errstate(invalid="ignore", over="ignore"):
        exact = np.asarray(value).astype(T.np_dtype(dt))
    if not attrs["lo"] or not (exact == value or value != value and exact != exact):
        return _pad_jax(a, attrs, out)
    config = [(lo, hi, 0) for lo, hi in zip(attrs["lo"], attrs["hi"])]
    return f"jax.lax.pad({a[0]}, jax.lax.full((), {py_literal(value)}, {T.jnp_dtype(dt)}), {config})"


register("pad", doc="lo[d] and hi[d] elements of `value` added before and after each dim d",
         example=(("f32[8, 16]",), {"lo": (0, 1), "hi": (0, 2), "value": 0.0}),
         flops=no_flops, infer=_pad_infer, numpy=_pad_numpy, rule=_pad_rule, family=Family.layout,
         partition=partition_pad,
         partial=lambda attrs: PartialMode.additive if attrs["value"] == 0 else None,
         jax=_pad_jax, jax_local=_pad_jax_local)

# ---------------------------------------------------------------------------------- concat


def _concat_infer(operands, attrs):
    axis = attrs["axis"]
    first = operands[0]
    check(0 <= axis < first.rank, f"concat: bad axis {axis} for {first}")
    for i, t in enumerate(operands[1:], 1):
        check(t.dtype == first.dtype, f"concat: dtypes differ: {first} vs {t}", blame=i)
        check(t.rank == first.rank and all(a == b for d, (a, b) in enumerate(zip(t.shape, first.shape)) if d != axis),
              f"concat: shapes {first} and {t} differ outside axis {axis}", blame=i)
    shape = list(first.shape)
    shape[axis] = sum(t.shape[axis] for t in operands)
    return first.with_shape(shape)


def _concat_rule(operands, results, attrs):
    axis = attrs["axis"]
    b = RuleBuilder()
    fs = [b.factor(n, PERMUTATION if i == axis else PASS) for i, n in enumerate(results[0].shape)]
    dims = [(f,) for f in fs]
    return b.build([dims] * len(operands), [dims])


register("concat", doc="the operands one after the other along `axis`",
         example=(("f32[4, 8]", "f32[4, 3]"), {"axis": 1}),
         flops=no_flops, infer=_concat_infer, numpy=lambda *xs, axis: np.concatenate(xs, axis=axis),
         partition=partition_concat,
         rule=_concat_rule, partial=PartialMode.additive, family=Family.layout,
         jax=lambda a, attrs, out: f"jnp.concatenate([{', '.join(a)}], axis={attrs['axis']})",
         jax_local=lambda a, attrs, out: f"jax.lax.concatenate([{', '.join(a)}], {attrs['axis']})")

# ---------------------------------------------------------------------------------- roll


def _roll_infer(operands, attrs):
    (x,) = operands
    check(0 <= attrs["axis"] < x.rank, f"roll: bad axis {attrs['axis']} for {x}")
    return x


def _roll_rule(operands, results, attrs):
    (x,) = operands
    b = RuleBuilder()
    fs = [b.factor(n, PERMUTATION if i == attrs["axis"] else PASS) for i, n in enumerate(x.shape)]
    return b.build([[(f,) for f in fs]], [[(f,) for f in fs]])


register("roll", doc="rotate by `shift` along `axis`: element i moves to (i + shift) mod n",
         example=(("f32[8, 16]",), {"shift": 3, "axis": 0}),
         flops=no_flops, infer=_roll_infer, numpy=lambda x, *, shift, axis: np.roll(x, shift, axis=axis),
         partition=partition_roll,
         rule=_roll_rule, partial=PartialMode.additive, family=Family.layout,
         jax=lambda a, attrs, out: f"jnp.roll({a[0]}, {attrs['shift']}, axis={attrs['axis']})")



# ---------------------------------------------------------------------------------- derivatives
# (d: ir.autodiff.Differentiator, op, ct) -> one cotangent per operand; each is the transpose of a
# linear op, built from the ops above.


def _transpose_vjp(d, op, ct):
    perm = op.attrs["perm"]
    inv = tuple(sorted(range(len(perm)), key=lambda i: perm[i]))
    return (d.emit("transpose", ct, perm=inv),)


def _reshape_vjp(d, op, ct):
    return (d.emit("reshape", ct, shape=tuple(op.operands[0].type.shape)),)


def _broadcast_vjp(d, op, ct):
    return (d.sum_to(ct, op.operands[0].type, op.attrs["dims"]),)


def embed(d, ct, n: int, dim: int, start: int, step: int):
    """The transpose of a slice along one dim: ct's m elements at start, start + step, ... of n,
    zeros elsewhere (an interleave of zeros by reshape and pad, then a pad)."""
    shape = ct.type.shape
    m = shape[dim]
    rank = len(shape)
    if step > 1 and m > 0:
        wide = d.emit("reshape", ct, shape=shape[:dim + 1] + (1,) + shape[dim + 1:])
        wide = d.emit("pad", wide, lo=(0,) * (rank + 1), hi=tuple(step - 1 if i == dim + 1 else 0
                                                                   for i in range(rank + 1)), value=0.0)
        wide = d.emit("reshape", wide, shape=shape[:dim] + (m * step,) + shape[dim + 1:])
        length = (m - 1) * step + 1
        ct = d.emit("slice", wide, starts=(0,) * rank, stops=tuple(length if i == dim else s
                                                                    for i, s in enumerate(wide.type.shape)),
                    steps=(1,) * rank)
    length = ct.type.shape[dim]
    hi = n - start - length
    if start == 0 and hi == 0:
        return ct
    return d.emit("pad", ct, lo=tuple(start if i == dim else 0 for i in range(rank)),
                  hi=tuple(hi if i == dim else 0 for i in range(rank)), value=0.0)


def _slice_vjp(d, op, ct):
    x = op.operands[0]
    for dim, (n, a, s) in enumerate(zip(x.type.shape, op.attrs["starts"], op.attrs["steps"])):
        if ct.type.shape[dim] != n or a != 0 or s != 1:
            ct = embed(d, ct, n, dim, a, s)
    return (ct,)


def _pad_vjp(d, op, ct):
    x = op.operands[0]
    lo = op.attrs["lo"]
    return (d.emit("slice", ct, starts=tuple(lo), stops=tuple(a + n for a, n in zip(lo, x.type.shape)),
                   steps=(1,) * x.type.rank),)


def _concat_vjp(d, op, ct):
    axis = op.attrs["axis"]
    out, off = [], 0
    for v in op.operands:
        n = v.type.shape[axis]
        out.append(d.emit("slice", ct, starts=tuple(off if i == axis else 0 for i in range(v.type.rank)),
                          stops=tuple(off + n if i == axis else s for i, s in enumerate(ct.type.shape)),
                          steps=(1,) * v.type.rank))
        off += n
    return tuple(out)


def _roll_vjp(d, op, ct):
    return (d.emit("roll", ct, shift=-op.attrs["shift"], axis=op.attrs["axis"]),)


for _name, _rule in (("transpose", _transpose_vjp), ("reshape", _reshape_vjp), ("broadcast_in_dim", _broadcast_vjp),
                     ("slice", _slice_vjp), ("pad", _pad_vjp), ("concat", _concat_vjp), ("roll", _roll_vjp)):
    set_vjp(_name, _rule)
