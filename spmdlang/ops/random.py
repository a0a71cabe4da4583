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
from ..ir.types import TensorType
from ..partition.factors import elementwise_rule
from .registry import Family, Grad, check, register, set_vjp

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


register("random", doc="Threefry-2x32 draws (uniform in [0, 1) or standard normal) of (seed, counter)",
         example=(("i32[]", "i32[4, 8]"), {"dist": "uniform", "dtype": "f32"}),
         infer=_infer, numpy=_numpy, rule=_rule, jax=_jax, family=Family.elementwise,
         flops=lambda ops, res, attrs: 60 * res[0].size)
set_vjp("random", Grad.none)  # integer operands: nothing to differentiate
