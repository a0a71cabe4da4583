"""Counter-based random numbers: Threefry-2x32 (20 rounds) of (seed, global linear index).

`random(seed, counter)` is elementwise in the counter (an i32 tensor of global linear indices that
the frontend builds from iotas), so every shard computes its own elements from its global offsets
with no communication, and every mesh and backend gets the same bits: numpy and jax.numpy run the
same uint32 arithmetic (wrapping adds, rotations, xors). Uniform floats take the top 23 bits of the
first word as a mantissa in [1, 2) minus 1, so [0, 1); normal draws are Box-Muller of both words.
"""

from __future__ import annotations

import numpy as np

from ..ir import types as T
from ..ir.mesh import Sharding
from ..ir.types import TensorType
from ..partition.factors import PASS, REPLICATE, RuleBuilder, elementwise_rule
from .registry import Family, Grad, Stage, check, register, set_vjp

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = 0x1BD11BDA


def threefry2x32(seed: np.ndarray, counter: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both output words for key (seed, 0) and counter words (counter, 0), all uint32."""
    k0 = np.asarray(seed).astype(np.uint32)
    ks = (k0, np.uint32(0), k0 ^ np.uint32(_PARITY))
    x0 = np.asarray(counter).astype(np.uint32) + ks[0]
    x1 = np.zeros_like(x0) + ks[1]
    for i in range(5):
        for r in _ROTATIONS[i % 2]:
            x0 = x0 + x1
            x1 = ((x1 << np.uint32(r)) | (x1 >> np.uint32(32 - r))) ^ x0
        x0 = x0 + ks[(i + 1) % 3]
        x1 = x1 + ks[(i + 2) % 3] + np.uint32(i + 1)
    return x0, x1


def _unit(bits: np.ndarray) -> np.ndarray:
    return ((bits >> np.uint32(9)) | np.uint32(0x3F800000)).view(np.float32) - np.float32(1.0)


def _numpy(seed, counter, *, dist, dtype):
    with np.errstate(over="ignore"):
        x0, x1 = threefry2x32(seed, np.asarray(counter))
    u = _unit(np.asarray(x0))
    if dist == "uniform":
        out = u
    else:
        v = _unit(np.asarray(x1))
        out = np.sqrt(np.float32(-2.0) * np.log(np.float32(1.0) - u)) * np.cos(np.float32(2 * np.pi) * v)
    return np.asarray(out, np.float32).astype(T.np_dtype(dtype))


def _jax(args, attrs, out):
    seed, counter = args
    # the same arithmetic as threefry2x32 above, as one expression: reduce over the 5 groups of 4 rounds
    step = "(lambda a: (a, ((xs[1] << r) | (xs[1] >> (32 - r))) ^ a))(xs[0] + xs[1])"
    group = (f"(lambda st2: (st2[0] + ks[(i + 1) % 3], st2[1] + ks[(i + 2) % 3] + jnp.uint32(i + 1)))"
             f"(__import__('functools').reduce(lambda xs, r: {step}, {_ROTATIONS}[i % 2], st))")
    words = (f"(lambda ks, c: __import__('functools').reduce(lambda st, i: {group}, range(5), "
             f"(c + ks[0], jnp.zeros_like(c) + ks[1])))"
             f"((lambda k0: (k0, jnp.uint32(0), k0 ^ jnp.uint32({_PARITY})))({seed}.astype(jnp.uint32)), "
             f"{counter}.astype(jnp.uint32))")
    unit = "(jax.lax.bitcast_convert_type((({w} >> 9) | jnp.uint32(0x3F800000)), jnp.float32) - 1.0)"
    if attrs["dist"] == "uniform":
        body = f"(lambda w2: {unit.format(w='w2[0]')})({words})"
    else:
        body = (f"(lambda w2: jnp.sqrt(-2.0 * jnp.log(1.0 - {unit.format(w='w2[0]')})) * "
                f"jnp.cos(jnp.float32({float(np.float32(2 * np.pi))!r}) * {unit.format(w='w2[1]')}))({words})")
    return f"{body}.astype({T.jnp_dtype(attrs['dtype'])})"


def _infer(operands, attrs):
    seed, counter = operands
    check(seed.rank == 0 and T.is_int(seed.dtype), f"random: the seed must be an integer scalar, got {seed}")
    check(counter.dtype == "i32", f"random: the counter must be i32, got {counter}")
    check(attrs["dist"] in ("uniform", "normal"), f"random: unknown distribution {attrs['dist']!r}")
    check(T.is_float(attrs["dtype"]), f"random: draws are floats, got {attrs['dtype']}")
    return TensorType(attrs["dtype"], counter.shape)


def _rule(operands, results, attrs):
    return elementwise_rule([t.shape for t in operands], results[0].shape)


# FLOPs per element drawn, as XLA's cost_analysis() counts the emitted Threefry-2x32 (integer adds,
# shifts and xors count as one each; erf_inv's transcendental parts as none), measured on one draw
# of f32[64, 64] with jax 0.10.2: `random` (the seed/counter draws), jax.random's draws (per element
# of the result; a split's result holds two words per key)
_RANDOM_FLOPS = {"uniform": 104, "normal": 117}
_DRAW_FLOPS = {"bits": 111, "uniform": 116, "bernoulli": 117, "normal": 156, "split": 55, "fold_in": 55}


def _draw_flops(operands, results, attrs) -> int:
    return _DRAW_FLOPS[attrs["dist"]] * results[0].size


register("random", doc="Threefry-2x32 draws (uniform in [0, 1) or standard normal) of (seed, counter)",
         example=(("i32[]", "i32[4, 8]"), {"dist": "uniform", "dtype": "f32"}),
         infer=_infer, numpy=_numpy, rule=_rule, jax=_jax, family=Family.elementwise,
         flops=lambda ops, res, attrs: _RANDOM_FLOPS[attrs["dist"]] * res[0].size)
set_vjp("random", Grad.none)  # integer operands: nothing to differentiate


# ---------------------------------------------------------------------------------- jax.random's bits
# jax's threefry PRNG (jax/_src/random/threefry2x32.py) with jax_threefry_partitionable=True, jax's
# default: a key is u32[2]; the draws of an array of shape S hash the key with each element's
# global row-major index, as two u32 words (hi, lo), and take bits = word0 ^ word1. `split` hashes
# iota(n) and keeps both words as n keys; `fold_in(key, d)` is the two words of the counter (0, d).
# `random_draw` is the global op (its jax text calls jax.random itself: the XLA baseline is an
# oracle); partitioned, it becomes `random_draw_local` on each shard, which hashes the counters of
# its own block from the block's global offsets: no communication.

RANDOM_DISTS = ("bits", "uniform", "normal", "bernoulli", "split", "fold_in")
_DRAW_FLOATS = {"f32": (23, np.uint32), "f16": (10, np.uint16), "bf16": (7, np.uint16)}


def threefry2x32_jax(k1, k2, x0, x1):
    """jax's threefry2x32 hash (key words k1, k2; counter words x0, x1), all uint32; both words."""
    k1, k2 = np.asarray(k1, np.uint32), np.asarray(k2, np.uint32)
    x0, x1 = np.asarray(x0, np.uint32), np.asarray(x1, np.uint32)
    ks = (k1, k2, k1 ^ k2 ^ np.uint32(_PARITY))
    with np.errstate(over="ignore"):
        x0, x1 = x0 + ks[0], x1 + ks[1]
        for i in range(5):
            for r in _ROTATIONS[i % 2]:
                x0 = x0 + x1
                x1 = x0 ^ ((x1 << np.uint32(r)) | (x1 >> np.uint32(32 - r)))
            x0 = x0 + ks[(i + 1) % 3]
            x1 = x1 + ks[(i + 2) % 3] + np.uint32(i + 1)
    return x0, x1


def _lo_counters(shape, offsets, global_shape) -> np.ndarray:
    """The low words of the global row-major indices of a block of `shape` starting at `offsets`
    of an array of `global_shape` (the high words are 0: draws hold fewer than 2**32 elements)."""
    lo = np.zeros(shape, np.uint64)
    stride = 1
    for d in range(len(shape) - 1, -1, -1):
        pos = np.arange(shape[d], dtype=np.uint64) + np.uint64(int(offsets[d]))
        lo = lo + pos.reshape([-1 if i == d else 1 for i in range(len(shape))]) * np.uint64(stride)
        stride *= global_shape[d]
    return (lo & np.uint64(0xFFFFFFFF)).astype(np.uint32)


def _erf_inv32(x: np.ndarray) -> np.ndarray:
    """XLA's f32 erf_inv (Giles' single-precision polynomials), fused multiply-adds as on CPU:
    within 2 ulp of jax.lax.erf_inv (its log1p is XLA's own). x * x is rounded to f32 as XLA
    rounds it: near |x| = 1 (normal's tails) 1 - x * x keeps that rounding, tens of ulp."""
    x = np.asarray(x, np.float32)
    with np.errstate(all="ignore"):
        w = (-np.log1p(-(x * x).astype(np.float64))).astype(np.float32)
        lt = w < np.float32(5.0)
        w = np.where(lt, w - np.float32(2.5), np.sqrt(w) - np.float32(3.0)).astype(np.float64)
        p = np.where(lt, _ERFINV_LT5[0], _ERFINV_GE5[0]).astype(np.float32)
        for a, b in zip(_ERFINV_LT5[1:], _ERFINV_GE5[1:]):
            c = np.where(lt, np.float32(a), np.float32(b)).astype(np.float64)
            p = (c + p.astype(np.float64) * w).astype(np.float32)
        out = p * x
    return np.where(np.abs(x) == 1, x * np.float32(np.inf), out).astype(np.float32)


_ERFINV_LT5 = (2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087, -0.00125372503,
               -0.00417768164, 0.246640727, 1.50140941)
_ERFINV_GE5 = (-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773, -0.0076224613,
               0.00943887047, 1.00167406, 2.83297682)


def _uniform_bits(bits: np.ndarray, dtype: str, minval, maxval) -> np.ndarray:
    """jax.random.uniform's floats from 32 random bits: the top mantissa bits under exponent 0
    (1 <= f < 2) minus 1, scaled to [minval, maxval); bf16 takes 8 bits (its low byte), f16 16.
    The f32 multiply-add is exact in long double (the product needs 48 bits), then rounded once."""
    nmant, ut = _DRAW_FLOATS[dtype]
    dt = T.np_dtype(dtype)
    nbits = 8 if nmant < 8 else 8 * ut().itemsize
    b = bits.astype(np.uint8).astype(ut) if nbits == 8 else bits.astype(ut)
    one = np.array(1.0, dt).view(ut)
    floats = ((b >> ut(nbits - nmant)) | one).view(dt) - dt.type(1.0)
    lo, hi = np.asarray(minval, dt), np.asarray(maxval, dt)
    if dtype == "f32":  # XLA fuses floats * (hi - lo) + lo into one multiply-add: one rounding
        wide = np.longdouble
        scaled = (floats.astype(wide) * wide(hi - lo) + wide(lo)).astype(dt)
    else:  # half floats round after each op
        scaled = (floats * (hi - lo) + lo).astype(dt)
    return np.maximum(lo, scaled).astype(dt)


def _draw(key, data, *, dist, dtype, shape, offsets, global_shape, minval=0.0, maxval=1.0, p=0.5):
    key = np.asarray(key, np.uint32)
    k1, k2 = key[0], key[1]
    if dist == "fold_in":
        return np.stack(threefry2x32_jax(k1, k2, np.uint32(0), np.asarray(data).astype(np.uint32)))
    lo = _lo_counters(tuple(shape), offsets, tuple(global_shape))
    w0, w1 = threefry2x32_jax(k1, k2, np.zeros_like(lo), lo)
    if dist == "split":
        return np.stack([w0, w1], axis=-1)
    bits = w0 ^ w1
    if dist == "bits":
        return bits
    if dist == "bernoulli":
        return _uniform_bits(bits, "f32", 0.0, 1.0) < np.float32(p)
    if dist == "uniform":
        return _uniform_bits(bits, dtype, minval, maxval)
    nmant = _DRAW_FLOATS[dtype][0]
    dt = T.np_dtype(dtype)
    u = _uniform_bits(bits, dtype, -(1.0 - 2.0 ** -(nmant + 1)), 1.0)  # nextafter(-1, 0) up to 1
    return (np.asarray(np.sqrt(2), dt) * _erf_inv32(u).astype(dt)).astype(dt)


def _draw_type(dist, dtype, shape) -> TensorType:
    if dist == "split":
        return TensorType("u32", tuple(shape) + (2,))
    if dist == "fold_in":
        return TensorType("u32", (2,))
    return TensorType({"bits": "u32", "bernoulli": "bool"}.get(dist, dtype), tuple(shape))


def _check_draw(operands, attrs, extra: int):
    dist = attrs["dist"]
    check(dist in RANDOM_DISTS, f"random_draw: unknown distribution {dist!r}")
    key = operands[0]
    check(key.dtype == "u32" and key.shape == (2,), f"random_draw: the key must be u32[2], got {key}", blame=0)
    want = 1 if dist == "fold_in" else 0
    check(len(operands) == 1 + want + extra, f"random_draw {dist}: {want} operand(s) after the key, "
          f"got {len(operands) - 1 - extra}")
    if dist == "fold_in":
        check(operands[1].rank == 0 and T.is_int(operands[1].dtype),
              f"fold_in: the data must be an integer scalar, got {operands[1]}", blame=1)
    needs = {"uniform": ("minval", "maxval"), "bernoulli": ("p",)}.get(dist, ())
    check(all(k in attrs for k in needs), f"random_draw {dist}: needs the attributes {', '.join(needs)}")
    if dist in ("uniform", "normal"):
        check(attrs["dtype"] in _DRAW_FLOATS, f"{dist} draws f32, bf16 or f16, got {attrs['dtype']}")
    size = 1
    for n in attrs["shape"]:
        size *= n
    check(size < 2**32, f"random_draw: {list(attrs['shape'])} has 2**32 elements or more")


def _draw_infer(operands, attrs):
    _check_draw(operands, attrs, 0)
    return _draw_type(attrs["dist"], attrs["dtype"], attrs["shape"])


def _draw_numpy(key, *data, shape, **attrs):
    """attrs: dist, dtype; minval and maxval (uniform), p (bernoulli)."""
    return _draw(key, data[0] if data else None, shape=shape, offsets=(0,) * len(shape), global_shape=shape,
                 **attrs)


def _draw_jax(args, attrs, out):
    """jax.random itself (this text runs in the XLA baseline, the oracle for the per-shard draws)."""
    key, shape, dist = args[0], tuple(attrs["shape"]), attrs["dist"]
    dt = T.jnp_dtype(attrs["dtype"])
    return {
        "bits": lambda: f"jax.random.bits({key}, {shape}, jnp.uint32)",
        "uniform": lambda: f"jax.random.uniform({key}, {shape}, {dt}, {attrs['minval']!r}, {attrs['maxval']!r})",
        "normal": lambda: f"jax.random.normal({key}, {shape}, {dt})",
        # p as an f32 array: a Python float would draw f64 uniforms where the module enables x64
        "bernoulli": lambda: f"jax.random.bernoulli({key}, jnp.float32({attrs['p']!r}), {shape})",
        "split": lambda: f"jax.random.split({key}, {shape[0]})" if len(shape) == 1 else
                         f"jax.random.split({key}, {shape})",
        "fold_in": lambda: f"jax.random.fold_in({key}, {args[1]}.astype(jnp.uint32))",
    }[dist]()


def _draw_rule(operands, results, attrs):
    """The key (and fold_in's data) is read whole; every result dim is a fresh factor (a draw
    may be split any way), except a split's pair of key words."""
    b = RuleBuilder()
    ops = [[(b.factor(2, REPLICATE),)]] + [[] for _ in operands[1:]]
    dims = [(b.factor(n, REPLICATE if attrs["dist"] == "split" and i == len(attrs["shape"]) else PASS),)
            for i, n in enumerate(results[0].shape)]
    return b.build(ops, [dims])


def _draw_partition(ctx):
    """Each shard draws its own block: the draw's counters are global indices, so the local op
    needs only its block's global offsets (partition index times shard size): no collective."""
    attrs = ctx.attrs
    shape = tuple(attrs["shape"])
    dims = list(ctx.target().dims)
    for d in range(len(shape), len(dims)):  # a key's two words (split, fold_in) are drawn whole
        dims[d] = ()
    s = Sharding(tuple(dims))
    local = s.local_shape(ctx.op.result.type.shape, ctx.mesh)
    key = ctx.reshard(0, Sharding.replicated(1), "every shard hashes with the whole key")
    data = [ctx.reshard(i, Sharding.replicated(0)) for i in range(1, len(ctx.op.operands))]
    offsets = [ctx.offset(dims[d], local[d]) if dims[d] else ctx.constant(0, "i32") for d in range(len(shape))]
    x = ctx.emit("random_draw_local", key, *data, *offsets,
                 **{**attrs, "shape": tuple(local[:len(shape)]), "global_shape": shape})
    ctx.set_result(x, s)


_DRAW_ATTRS = {"dist": "uniform", "dtype": "f32", "shape": (4, 8), "minval": 0.0, "maxval": 1.0}

register("random_draw", doc="jax.random's draw (bits, uniform, normal, bernoulli, split, fold_in) with a u32[2] key",
         example=(("u32[2]",), _DRAW_ATTRS), stage=Stage.global_,
         infer=_draw_infer, numpy=_draw_numpy, rule=_draw_rule, partition=_draw_partition, jax=_draw_jax,
         family=Family.create, flops=_draw_flops, vjp=Grad.none)


def _local_infer(operands, attrs):
    shape = tuple(attrs["shape"])
    check(len(attrs["global_shape"]) == len(shape), "random_draw_local: one global size per dim")
    _check_draw(operands, {**attrs, "shape": attrs["global_shape"]}, len(shape))
    for v in operands[len(operands) - len(shape):]:
        check(v.dtype == "i32" and v.rank == 0, f"random_draw_local: offsets are i32 scalars, got {v}")
    return _draw_type(attrs["dist"], attrs["dtype"], shape)


def _local_numpy(key, *operands, shape, global_shape, **attrs):
    n = len(shape)
    data, offsets = operands[:len(operands) - n], operands[len(operands) - n:]
    return _draw(key, data[0] if data else None, shape=shape, offsets=[int(o) for o in offsets],
                 global_shape=global_shape, **attrs)


_LOCAL_HELPER = '''
def random_draw_local(key, *operands, dist, dtype, shape, global_shape, minval=0.0, maxval=1.0, p=0.5):
    """jax.random's draw (threefry2x32, jax_threefry_partitionable=True) of this shard's block of
    an array of `global_shape`: the last operands are the block's global offsets, one per dim;
    fold_in's data comes first. Counters are global row-major indices (high word 0)."""
    u32 = jnp.uint32
    # jax.lax's uint32 ops on numpy constants: the hash's ~100 ops traced without jnp's promotion
    add, xor, shl, shr = jax.lax.add, jax.lax.bitwise_xor, jax.lax.shift_left, jax.lax.shift_right_logical

    def hash2(k1, k2, x0, x1):
        ks = (k1, k2, xor(xor(k1, k2), np.uint32(0x1BD11BDA)))
        x0, x1 = add(x0, ks[0]), add(x1, ks[1])
        for i in range(5):
            for r in ((13, 15, 26, 6), (17, 29, 16, 24))[i % 2]:
                x0 = add(x0, x1)
                x1 = xor(x0, jax.lax.bitwise_or(shl(x1, np.uint32(r)), shr(x1, np.uint32(32 - r))))
            x0, x1 = add(x0, ks[(i + 1) % 3]), add(add(x1, ks[(i + 2) % 3]), np.uint32(i + 1))
        return x0, x1

    k1, k2 = key[0], key[1]
    if dist == "fold_in":
        return jnp.stack(hash2(k1, k2, u32(0), operands[0].astype(u32)))
    lo, stride = jax.lax.full(shape, 0, u32), 1
    for d in range(len(shape) - 1, -1, -1):
        pos = add(jax.lax.broadcasted_iota(u32, shape, d), operands[len(operands) - len(shape) + d].astype(u32))
        lo, stride = add(lo, jax.lax.mul(pos, np.uint32(stride))), stride * global_shape[d]
    w0, w1 = hash2(k1, k2, jax.lax.full(shape, 0, u32), lo)
    if dist == "split":
        return jnp.stack([w0, w1], axis=-1)
    bits = w0 ^ w1
    if dist == "bits":
        return bits

    def uniform(dt, lo_, hi_):  # jax.random.uniform's conversion of the bits
        nmant = jnp.finfo(dt).nmant
        nbits = 8 if nmant < 8 else jnp.finfo(dt).bits
        ut = jnp.uint32 if jnp.finfo(dt).bits == 32 else jnp.uint16
        b = bits.astype(jnp.uint8).astype(ut) if nbits == 8 else bits.astype(ut)
        one = jnp.asarray(np.array(1.0, dt).view(np.dtype(ut)), ut)
        floats = jax.lax.bitcast_convert_type((b >> ut(nbits - nmant)) | one, dt) - jnp.array(1.0, dt)
        lo_, hi_ = jnp.asarray(lo_, dt), jnp.asarray(hi_, dt)
        return jax.lax.max(lo_, floats * (hi_ - lo_) + lo_)

    if dist == "bernoulli":
        return uniform(jnp.float32, 0.0, 1.0) < jnp.float32(p)
    if dist == "uniform":
        return uniform(dtype, minval, maxval)
    lo_ = -(1.0 - 2.0 ** -(jnp.finfo(dtype).nmant + 1))  # nextafter(-1, 0)
    return jax.lax.mul(np.array(np.sqrt(2), dtype), jax.lax.erf_inv(uniform(dtype, lo_, 1.0)))
'''


def _local_jax(args, attrs, out):
    kw = ", ".join(f"{k}={attrs[k]!r}" for k in ("dist", "shape", "global_shape", "minval", "maxval", "p")
                   if k in attrs)
    return f"random_draw_local({', '.join(args)}, dtype={T.jnp_dtype(attrs['dtype'])}, {kw})"


register("random_draw_local", doc="one shard's block of a random_draw, from the block's global offsets",
         stage=Stage.local, infer=_local_infer, numpy=_local_numpy, jax=_local_jax, jax_helper=_LOCAL_HELPER,
         family=Family.local, flops=_draw_flops)
