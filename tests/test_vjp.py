"""Every op's derivative against jax on random shapes.

For each op of the op table with a vjp rule, `INSTANCES` holds a generator of random instances
(random shapes with size-1 and odd dims, random attributes: einsum specs, conv strides / padding /
dilations / groups in 1-D to 3-D, pool windows, slice steps, ...). A case builds the one-op program
with the IR builder, differentiates it with ir.autodiff.backward_pass, runs the backward program on
the reference backend in float64 with a random cotangent, and compares with jax.vjp (x64 enabled for
the case only) of the op's jax emission, the function the xla backend runs; where that emission is
not the plain jax.lax primitive (scans, pool, sort, top_k) also against the primitive itself.

Ties: chooser ops (max / min reductions, maximum / minimum, sort, top_k, pools, abs / relu at 0,
products with zeros) also draw values from a small integer grid, so ties and zeros are common, and
must then match jax's convention exactly: max/min reductions share the cotangent equally among the
elements that attain the result (jax's reduce_max rule), maximum/minimum split ties in half, sort and
top_k send it through the stable order (lower index first), max pool gives a window's whole cotangent
to its first maximum (select_and_scatter_add, lax.reduce_window's rule). One deliberate difference,
documented on the rule: cummax shares a tie equally (as reduce_max), where jax's cummax
differentiates its associative scan's tree of pairwise maxima and splits ties unevenly by position;
it is checked on ties below, against its own convention.

Ops marked `Grad.none` are checked too: where one takes a float operand to a float result, jax's
gradient must be zero on random instances (floor, sign, floordiv, stop_gradient, ...); every other
one must be integer- or bool-valued or take no float operand.

Builtins that lower to several ops (clip, softmax, logsumexp, mean, a layer norm, avg_pool, ...) are
differentiated through the frontend against jax.grad of the jax.numpy / jax.nn function.

The coverage test fails if an op has neither a vjp rule nor Grad.none, or has a rule and no
generator here (a new op must add a case).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from spmdlang.backend_ref.interp import run_global
from spmdlang.errors import ShapeError
from spmdlang.ir import registry
from spmdlang.ir import types as T
from spmdlang.ir.autodiff import Differentiator, backward_pass
from spmdlang.ir.builder import Builder
from spmdlang.ir.core import Param, Program, Result, Value
from spmdlang.ir.mesh import Mesh, Sharding
from spmdlang.ir.registry import Grad
from spmdlang.ir.types import TensorType
from spmdlang.ops.contract import _conv_infer, conv_attrs

GLOBAL = sorted(n for n, op in registry.OPS.items() if not op.local_only)
WITH_RULE = [n for n in GLOBAL if callable(registry.get(n).vjp)]
NO_GRADIENT = [n for n in GLOBAL if registry.get(n).vjp == Grad.none]


# ---------------------------------------------------------------------------------- sampling


def _dims(rng, rank: int, hi: int = 5) -> tuple[int, ...]:
    """Random dims in [1, hi]: size 1 and odd sizes come up often."""
    return tuple(int(n) for n in rng.integers(1, hi + 1, size=rank))


def _floats(rng, shape, *, grid: bool = False, positive: bool = False, away: bool = False) -> np.ndarray:
    """Normal floats; on a `grid` small integers (ties and zeros); `positive` > 0.5 (log, sqrt, ...),
    `away` from zero by 0.5 (divisors)."""
    if grid:
        a = rng.integers(-2, 3, size=shape).astype(np.float64)
    else:
        a = rng.standard_normal(shape)
    if positive:
        a = np.abs(a) + 0.5
    if away:
        a = np.sign(a + 1e-9) * (np.abs(a) + 0.5)
    return np.asarray(a, np.float64)


def _ids(rng, shape, n: int) -> np.ndarray:
    """Integer ids in [-2, n + 1], i32 or i64: out-of-range ones test clamping (take) and dropping
    (scatter_add)."""
    return rng.integers(-2, n + 2, size=shape).astype(np.int64 if rng.random() < 0.25 else np.int32)


def _starts(rng, rank: int) -> list[np.ndarray]:
    """Run-time starts in [-2, 6] (clamped by the ops), all i32 or all i64 (jax wants one dtype)."""
    dtype = np.int64 if rng.random() < 0.25 else np.int32
    return [np.asarray(rng.integers(-2, 7), dtype) for _ in range(rank)]


def _shapes_with_scalars(rng, k: int, max_rank: int = 3):
    """k operand shapes of an elementwise op: one shape, some operands rank 0 (they broadcast)."""
    shape = _dims(rng, int(rng.integers(0, max_rank + 1)))
    return [() if shape and rng.random() < 0.2 else shape for _ in range(k)]


# ---------------------------------------------------------------------------------- instances
# Each generator: rng -> (arrays, attrs, ties). `ties`: values were drawn on the integer grid.

_POSITIVE = {"log", "sqrt", "rsqrt", "log1p"}
_GRID_OK = {"abs", "relu", "relu6", "softplus", "square", "neg", "sign", "floor", "ceil", "round", "stop_gradient",
            "maximum", "minimum", "add", "sub", "mul", "select"}


def _unary(name):
    def gen(rng):
        grid = name in _GRID_OK and rng.random() < 0.4
        x = _floats(rng, _dims(rng, int(rng.integers(0, 4))), grid=grid, positive=name in _POSITIVE)
        if name == "relu6":  # relu6's kinks are at 0 and 6: the grid is stretched over both
            x = 3.0 * x
        return [x], {}, grid
    return gen


def _binary(name):
    def gen(rng):
        grid = name in _GRID_OK and rng.random() < 0.4
        sa, sb = _shapes_with_scalars(rng, 2)
        if name == "pow":
            if rng.random() < 0.4:  # zero bases, zero and integer exponents: jax's special cases
                a = rng.integers(0, 3, size=sa).astype(np.float64)
                b = rng.choice([0.0, 1.0, 2.0, 3.0, -1.0, 0.5], size=sb).astype(np.float64)
                return [a, b], {}, True
            return [_floats(rng, sa, positive=True), _floats(rng, sb)], {}, False
        away = name in ("div", "mod", "floordiv")
        return [_floats(rng, sa, grid=grid), _floats(rng, sb, grid=grid and not away, away=away)], {}, grid
    return gen


def _select(rng):
    grid = rng.random() < 0.3
    sc, sa, sb = _shapes_with_scalars(rng, 3)
    return [rng.random(sc) < 0.5, _floats(rng, sa, grid=grid), _floats(rng, sb, grid=grid)], {}, grid


def _cast(rng):
    dtype = str(rng.choice(["f64", "f32", "bf16", "f16", "i32"]))
    return [_floats(rng, _dims(rng, int(rng.integers(0, 4))))], {"dtype": dtype}, False


def _bitcast(rng):
    x = _floats(rng, _dims(rng, int(rng.integers(0, 4))))
    return [x], {"dtype": {8: "i64", 4: "i32", 2: "bf16"}[x.dtype.itemsize]}, False


def _reduce(name):
    def gen(rng):
        rank = int(rng.integers(1, 4))
        axes = tuple(int(a) for a in np.flatnonzero(rng.random(rank) < 0.5))
        grid = rng.random() < 0.4
        return [_floats(rng, _dims(rng, rank), grid=grid)], {"axes": axes}, grid
    return gen


def _scan(name):
    def gen(rng):
        rank = int(rng.integers(1, 4))
        grid = rng.random() < 0.4
        return ([_floats(rng, _dims(rng, rank), grid=grid)],
                {"axis": int(rng.integers(0, rank)), "reverse": bool(rng.random() < 0.5)}, grid)
    return gen


def _einsum(rng):
    """1 to 3 operands of rank 0 to 3 over a few letters; the output a random subset in random order:
    contractions, batch dims, outer products and indices summed away within one operand."""
    letters = "abcde"
    sizes = dict(zip(letters, _dims(rng, len(letters), 4)))
    ins = ["".join(rng.permutation(list(letters))[:int(rng.integers(0, 4))]) for _ in range(int(rng.integers(1, 4)))]
    used = sorted(set("".join(ins)))
    out = "".join(c for c in rng.permutation(used) if rng.random() < 0.5) if used else ""
    arrays = [_floats(rng, tuple(sizes[c] for c in term)) for term in ins]
    return arrays, {"spec": ",".join(ins) + "->" + out}, False


def _conv(rng):
    """1-D/2-D/3-D, strides, lhs and rhs dilation, negative and positive padding, feature groups
    (depthwise with a multiplier included) and batch groups (as tests/test_conv_general.py draws them)."""
    while True:
        nsp = int(rng.integers(1, 4))
        groups, batch_groups = int(rng.choice([1, 1, 2, 3])), 1
        if groups == 1 and rng.random() < 0.25:
            batch_groups = int(rng.choice([2, 3]))
        c = groups * int(rng.integers(1, 3))
        if rng.random() < 0.2:
            groups = c
        f = groups * batch_groups * int(rng.integers(1, 3))
        n = batch_groups * int(rng.integers(1, 3))
        xs = (n, *_dims(rng, nsp, 6), c)
        ws = (*_dims(rng, nsp, 3), c // groups, f)
        strides = [int(rng.integers(1, 4)) for _ in range(nsp)]
        lhs = [int(rng.choice([1, 1, 2, 3])) for _ in range(nsp)]
        rhs = [int(rng.choice([1, 1, 2])) for _ in range(nsp)]
        padding = [(int(rng.integers(-1, 4)), int(rng.integers(-1, 4))) for _ in range(nsp)]
        attrs = conv_attrs(strides, padding, lhs, rhs, groups, batch_groups)
        try:
            out = _conv_infer((TensorType("f64", xs), TensorType("f64", ws)), attrs)
        except ShapeError:
            continue
        if out.size:
            return [_floats(rng, xs), _floats(rng, ws)], attrs, False


def _pool(rng):
    while True:
        nsp = int(rng.integers(1, 4))
        xs = (int(rng.integers(1, 3)), *_dims(rng, nsp, 6), int(rng.integers(1, 3)))
        window = _dims(rng, nsp, 3)
        strides = _dims(rng, nsp, 3)
        # (a padding of the window's size or more: windows wholly in it, whose sum pool's
        # transposition has negative padding)
        padding = tuple((int(rng.integers(0, w + 2)), int(rng.integers(0, w + 2))) for w in window)
        if all(xs[1 + i] + sum(padding[i]) >= window[i] for i in range(nsp)):
            grid = rng.random() < 0.4
            kind = str(rng.choice(["max", "sum"]))
            attrs = {"reduce": kind, "window": window, "strides": strides, "padding": padding}
            if kind == "sum" and rng.random() < 0.4:  # a sum pool's gradient: the input spread out
                attrs["lhs_dilation"] = _dims(rng, nsp, 3)
            return [_floats(rng, xs, grid=grid)], attrs, grid


def _select_and_scatter_add(rng):
    """A max pool's gradient (its own rule: the second derivative): ties, -inf and NaN in the
    operand on a grid draw."""
    while True:
        [x], attrs, grid = _pool(rng)
        if attrs["reduce"] == "max" and "lhs_dilation" not in attrs:
            break
    if grid:
        x = np.where(rng.random(x.shape) < 0.15, -np.inf, x)
        # (no NaN: jax's rule, select_and_gather_add, reduces a window in XLA's order rather than
        # first to last, so which element of a window with a NaN it reads is XLA's choice; ours
        # reads the one the forward pass selected)
    del attrs["reduce"]
    out = [(n + lo + hi - w) // s + 1 for n, w, s, (lo, hi) in
           zip(x.shape[1:-1], attrs["window"], attrs["strides"], attrs["padding"])]
    return [_floats(rng, (x.shape[0], *out, x.shape[-1])), x], attrs, grid


def _transpose(rng):
    """Mostly rank 3 or 4 with a perm that is not its own inverse (the rule must invert it)."""
    rank = int(rng.integers(0, 3)) if rng.random() < 0.2 else int(rng.integers(3, 5))
    perm = tuple(int(p) for p in rng.permutation(rank))
    while rank >= 3 and all(perm[perm[i]] == i for i in range(rank)):
        perm = tuple(int(p) for p in rng.permutation(rank))
    return [_floats(rng, _dims(rng, rank))], {"perm": perm}, False


def _factors(n: int) -> list[int]:
    out, p = [], 2
    while n > 1:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out


def _reshape(rng):
    shape = _dims(rng, int(rng.integers(0, 4)), 6)
    parts = [[f] for f in _factors(math.prod(shape))] + [[1] for _ in range(int(rng.integers(0, 3)))]
    rng.shuffle(parts)
    groups: list[int] = []
    for p in parts:  # merge neighbours at random
        if groups and rng.random() < 0.4:
            groups[-1] *= p[0]
        else:
            groups.append(p[0])
    return [_floats(rng, shape)], {"shape": tuple(groups)}, False


def _broadcast(rng):
    shape = _dims(rng, int(rng.integers(0, 4)))
    dims = tuple(int(d) for d in np.flatnonzero(rng.random(len(shape)) < 0.6))
    xs = tuple(1 if rng.random() < 0.3 else shape[d] for d in dims)
    return [_floats(rng, xs)], {"shape": shape, "dims": dims}, False


def _slice(rng):
    shape = _dims(rng, int(rng.integers(1, 4)), 7)
    starts, stops, steps = [], [], []
    for n in shape:
        a = int(rng.integers(0, n))
        b = int(rng.integers(a + 1, n + 1))
        starts.append(a)
        stops.append(b)
        steps.append(int(rng.integers(1, 4)))
    return [_floats(rng, shape)], {"starts": tuple(starts), "stops": tuple(stops), "steps": tuple(steps)}, False


def _pad(rng):
    shape = _dims(rng, int(rng.integers(0, 4)))
    lo = tuple(int(v) for v in rng.integers(0, 3, size=len(shape)))
    hi = tuple(int(v) for v in rng.integers(0, 3, size=len(shape)))
    return [_floats(rng, shape)], {"lo": lo, "hi": hi, "value": float(rng.choice([0.0, 1.5, -2.0]))}, False


def _concat(rng):
    rank = int(rng.integers(1, 4))
    base = _dims(rng, rank)
    axis = int(rng.integers(0, rank))
    arrays = []
    for _ in range(int(rng.integers(1, 4))):
        shape = list(base)
        shape[axis] = int(rng.integers(1, 5))
        arrays.append(_floats(rng, tuple(shape)))
    return arrays, {"axis": axis}, False


def _roll(rng):
    rank = int(rng.integers(1, 4))
    axis = int(rng.integers(0, rank))
    shape = tuple(int(rng.integers(3, 8)) if d == axis else n for d, n in enumerate(_dims(rng, rank)))
    return [_floats(rng, shape)], {"shift": int(rng.integers(-9, 10)), "axis": axis}, False


def _take(rng):
    rank = int(rng.integers(1, 4))
    shape = _dims(rng, rank)
    axis = int(rng.integers(0, rank))
    return [_floats(rng, shape), _ids(rng, _dims(rng, int(rng.integers(0, 3))), shape[axis])], {"axis": axis}, False


def _take_along_axis(rng):
    rank = int(rng.integers(1, 4))
    shape = _dims(rng, rank)
    axis = int(rng.integers(0, rank))
    ids_shape = tuple(int(rng.integers(1, 6)) if d == axis else n for d, n in enumerate(shape))
    return [_floats(rng, shape), _ids(rng, ids_shape, shape[axis])], {"axis": axis}, False


def _scatter_add(rng):
    rank = int(rng.integers(1, 4))
    shape = _dims(rng, rank)
    axis = int(rng.integers(0, rank))
    ids_shape = _dims(rng, int(rng.integers(0, 3)))
    upd = shape[:axis] + ids_shape + shape[axis + 1:]
    return [_floats(rng, shape), _ids(rng, ids_shape, shape[axis]), _floats(rng, upd)], {"axis": axis}, False


def _dynamic_slice(rng):
    shape = _dims(rng, int(rng.integers(1, 4)), 6)
    sizes = tuple(int(rng.integers(1, n + 1)) for n in shape)
    return [_floats(rng, shape), *_starts(rng, len(shape))], {"sizes": sizes}, False


def _dynamic_update_slice(rng):
    shape = _dims(rng, int(rng.integers(1, 4)), 6)
    upd = tuple(int(rng.integers(1, n + 1)) for n in shape)
    return [_floats(rng, shape), _floats(rng, upd), *_starts(rng, len(shape))], {}, False


def _sort(rng):
    rank = int(rng.integers(1, 4))
    grid = rng.random() < 0.4
    return [_floats(rng, _dims(rng, rank, 6), grid=grid)], {"axis": int(rng.integers(0, rank))}, grid


def _top_k(rng):
    shape = _dims(rng, int(rng.integers(1, 4)), 6)
    grid = rng.random() < 0.4
    return [_floats(rng, shape, grid=grid)], {"k": int(rng.integers(1, shape[-1] + 1))}, grid


def _shard(rng):
    shape = _dims(rng, int(rng.integers(0, 4)))
    return [_floats(rng, shape)], {"sharding": Sharding.replicated(len(shape))}, False


def _argreduce(rng):
    rank = int(rng.integers(1, 4))
    return [_floats(rng, _dims(rng, rank), grid=rng.random() < 0.4)], {"axis": int(rng.integers(0, rank))}, True


def _compare(rng):
    sa, sb = _shapes_with_scalars(rng, 2)
    return [_floats(rng, sa, grid=True), _floats(rng, sb, grid=True)], {}, True


INSTANCES = {
    "einsum": _einsum, "conv": _conv, "pool": _pool, "select_and_scatter_add": _select_and_scatter_add,
    "cast": _cast, "bitcast_convert_type": _bitcast, "select": _select,
    "transpose": _transpose, "reshape": _reshape, "broadcast_in_dim": _broadcast, "slice": _slice, "pad": _pad,
    "concat": _concat, "roll": _roll, "take": _take, "take_along_axis": _take_along_axis,
    "scatter_add": _scatter_add, "scatter_max": _scatter_add, "scatter_min": _scatter_add,
    "dynamic_slice": _dynamic_slice, "dynamic_update_slice": _dynamic_update_slice,
    "sort": _sort, "argsort": _sort, "top_k": _top_k, "shard": _shard, "argmax": _argreduce, "argmin": _argreduce,
    **{n: _reduce(n) for n in ("reduce_sum", "reduce_prod", "reduce_max", "reduce_min")},
    **{n: _scan(n) for n in ("cumsum", "cumprod", "cummax")},
    **{n: _compare for n in ("lt", "le", "gt", "ge", "eq", "ne")},
}
for _name in GLOBAL:
    _op = registry.get(_name)
    if _name not in INSTANCES and _op.family == "elementwise" and len(_op.example[0]) in (1, 2) \
            and all(t.startswith("f32") for t in _op.example[0]):
        INSTANCES[_name] = _unary(_name) if len(_op.example[0]) == 1 else _binary(_name)


# ---------------------------------------------------------------------------------- independent oracles
# where the emission is not the jax.lax primitive itself: (attrs) -> function of the operands


def _lax_pool(attrs):
    import jax

    window, strides = (1, *attrs["window"], 1), (1, *attrs["strides"], 1)
    padding = ((0, 0), *(tuple(p) for p in attrs["padding"]), (0, 0))
    if attrs["reduce"] == "sum":
        base = (1, *(attrs.get("lhs_dilation") or (1,) * len(attrs["window"])), 1)
        return lambda x: jax.lax.reduce_window(x, 0.0, jax.lax.add, window, strides, padding, base_dilation=base)
    return lambda x: jax.lax.reduce_window(x, -np.inf, jax.lax.max, window, strides, padding)


def _lax_scan(fn):
    def make(attrs):
        import jax

        return lambda x: getattr(jax.lax, fn)(x, axis=attrs["axis"], reverse=attrs["reverse"])
    return make


def _lax_sort(attrs):
    import jax

    return lambda x: jax.lax.sort(x, dimension=attrs["axis"], is_stable=True)


def _lax_top_k(attrs):
    import jax

    return lambda x: jax.lax.top_k(x, attrs["k"])


def _lax_select_and_scatter_add(attrs):
    """jax.lax's max pool gradient itself: the vjp of reduce_window max, as a function of the
    cotangent (the source) and the operand."""
    import jax

    pool = _lax_pool({**attrs, "reduce": "max"})
    return lambda src, x: jax.vjp(pool, x)[1](src)[0]


LAX = {"pool": _lax_pool, "select_and_scatter_add": _lax_select_and_scatter_add, "cumsum": _lax_scan("cumsum"),
       "cumprod": _lax_scan("cumprod"), "cummax": _lax_scan("cummax"), "sort": _lax_sort, "top_k": _lax_top_k}
# ties where our convention is not the jax.lax primitive's (see the module doc): cummax's are checked
# against its own convention (in numpy)
LAX_TIES_DIFFER = {"cummax", "select_and_scatter_add"}


def _cummax_shares(arrays, attrs, cts):
    """cummax's tie convention: y_j's cotangent shared equally by the prefix elements attaining it."""
    (x,), (ct,) = arrays, cts
    axis, reverse = attrs["axis"], attrs["reverse"]
    xs, cs = np.moveaxis(x, axis, -1), np.moveaxis(ct, axis, -1)
    if reverse:
        xs, cs = xs[..., ::-1], cs[..., ::-1]
    g = np.zeros(xs.shape)
    for j in range(xs.shape[-1]):
        prefix = xs[..., :j + 1]
        hit = prefix == prefix.max(axis=-1, keepdims=True)
        g[..., :j + 1] += hit * (cs[..., j:j + 1] / hit.sum(axis=-1, keepdims=True))
    if reverse:
        g = g[..., ::-1]
    return [np.moveaxis(g, -1, axis)]


def _first_maximum_reads(arrays, attrs, cts):
    """select_and_scatter_add's source cotangent where a window has ties (or is all -inf): each
    window reads the cotangent at the element the forward pass sent its source to, the first
    maximum in row-major order (a scan from (-inf, 0) with `ge`, as the forward selects; padding
    reads 0). jax's rule, select_and_gather_add, reduces the window in XLA's order, so which of
    tied elements it reads is XLA's choice."""
    (src, x), (ct,) = arrays, cts
    window, strides, padding = attrs["window"], attrs["strides"], attrs["padding"]
    pad = [(0, 0)] + [tuple(p) for p in padding] + [(0, 0)]
    xp, cp = np.pad(x, pad, constant_values=-np.inf), np.pad(ct, pad)
    g = np.zeros(src.shape)
    for m in np.ndindex(*src.shape[1:-1]):
        best = np.full((src.shape[0], src.shape[-1]), -np.inf)
        val = np.zeros_like(best)
        for o in np.ndindex(*window):
            at = (slice(None),) + tuple(mi * s + oi for mi, s, oi in zip(m, strides, o)) + (slice(None),)
            move = ~(best >= xp[at])
            best, val = np.where(move, xp[at], best), np.where(move, cp[at], val)
        g[(slice(None),) + m + (slice(None),)] = val
    return [g, np.zeros(x.shape)]


OWN_TIES = {"cummax": _cummax_shares, "select_and_scatter_add": _first_maximum_reads}


# ---------------------------------------------------------------------------------- the check


def _dtype(a: np.ndarray) -> str:
    return {"float64": "f64", "int32": "i32", "int64": "i64", "bool": "bool"}[str(a.dtype)]


def ours(name, arrays, attrs, cts):
    """spmdlang's vjp of the one-op program at `arrays` for result cotangents `cts` (None: no
    cotangent), run on the reference backend: one array per operand (zeros where no gradient)."""
    types = [TensorType(_dtype(a), a.shape) for a in arrays]
    params = [Value(t, f"x{i}") for i, t in enumerate(types)]
    b = Builder()
    outs = b.emit_op(name, params, dict(attrs))
    ct_params = [Value(r.type, f"ct{k}") for k, r in enumerate(outs)]
    seeds = [(r, c) for r, c, a in zip(outs, ct_params, cts) if a is not None]
    fl = [i for i, t in enumerate(types) if T.is_float(t.dtype)]
    got = backward_pass(Differentiator(b), list(b.ops), [params[i] for i in fl], seeds)
    prog = Program("vjp", Mesh.make({"x": 1}), tuple(Param(v, v.name, None) for v in params + ct_params),
                   tuple(b.ops), tuple(Result(g, None) for g in got if g is not None))
    inputs = {f"x{i}": a for i, a in enumerate(arrays)}
    inputs.update({f"ct{k}": (c if c is not None else np.zeros(r.type.shape, T.np_dtype(r.type.dtype)))
                   for k, (c, r) in enumerate(zip(cts, outs))})
    ran = iter(run_global(prog, inputs))
    out = [np.zeros(a.shape) for a in arrays]
    for i, g in zip(fl, got):
        if g is not None:
            out[i] = np.asarray(next(ran), np.float64)
    return out, [r.type for r in outs]


def jax_vjp(fn, arrays, cts, result_types):
    """jax.vjp of fn over the float operands (the others held fixed): one array per operand."""
    import jax
    import jax.numpy as jnp

    fl = [i for i, a in enumerate(arrays) if a.dtype == np.float64]

    def f(*diff):
        full = list(arrays)
        for i, v in zip(fl, diff):
            full[i] = v
        out = fn(*full)
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)

    @jax.jit  # forward, vjp and pullback in one compile
    def pull(primals, ct):
        return jax.vjp(f, *primals)[1](ct)

    got = pull(tuple(jnp.asarray(arrays[i]) for i in fl),
               tuple(jnp.asarray(c) if c is not None else np.zeros(t.shape, jax.dtypes.float0)
                     for c, t in zip(cts, result_types)))
    out = [np.zeros(a.shape) for a in arrays]
    for i, g in zip(fl, got):
        out[i] = np.asarray(g, np.float64)
    return out


def emission(name, attrs, result_types):
    import jax
    import jax.numpy as jnp

    def fn(*xs):
        names = [f"a{i}" for i in range(len(xs))]
        text = registry.get(name).jax(names, attrs, result_types)
        return eval(f"lambda {', '.join(names)}: {text}",  # noqa: S307
                    {"jax": jax, "jnp": jnp, "np": np, "float": float})(*xs)

    return fn


def _cotangents(rng, name, arrays, attrs):
    types = registry.get(name).infer_types([TensorType(_dtype(a), a.shape) for a in arrays], _frozen(attrs))
    return [rng.standard_normal(t.shape).astype(T.np_dtype(t.dtype)) if T.is_float(t.dtype) else None
            for t in types]


def _frozen(attrs):
    from spmdlang.ir.core import freeze

    return freeze(dict(attrs))


def check(name: str, seed: int) -> str:
    """One random instance of `name`: ours vs jax.vjp of the emission (and of the lax primitive);
    returns a description of the instance."""
    jax = pytest.importorskip("jax")
    rng = np.random.default_rng(seed)
    arrays, attrs, ties = INSTANCES[name](rng)
    what = f"{name} seed {seed}: {[f'{_dtype(a)}{list(a.shape)}' for a in arrays]} {attrs}"
    with jax.enable_x64(True):
        cts = _cotangents(rng, name, arrays, attrs)
        got, result_types = ours(name, arrays, attrs, cts)
        if ties and name in OWN_TIES:
            oracles = [("our tie convention", None)]
        else:
            oracles = [("emission", emission(name, _frozen(attrs), result_types))]
            if name in LAX and not (ties and name in LAX_TIES_DIFFER):
                oracles.append(("jax.lax", LAX[name](attrs)))
        for label, fn in oracles:
            want = OWN_TIES[name](arrays, attrs, cts) if fn is None else jax_vjp(fn, arrays, cts, result_types)
            for i, (g, w) in enumerate(zip(got, want)):
                np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-9,
                                           err_msg=f"{what}: operand {i} vs {label}")
    return what


# ---------------------------------------------------------------------------------- tests


SEEDS = 3  # per op in the default suite; --runslow adds a hypothesis sweep


@pytest.mark.parametrize("name", WITH_RULE)
def test_vjp_matches_jax_on_random_instances(name):
    for seed in range(SEEDS):
        check(name, seed)


# the general forms, each a few more times: they have the most corners
@pytest.mark.parametrize("name,count", [("conv", 12), ("einsum", 8), ("pool", 6), ("scatter_add", 3),
                                        ("scatter_max", 4), ("take", 3), ("reshape", 3), ("slice", 3),
                                        ("broadcast_in_dim", 3)])
def test_vjp_of_general_forms_matches_jax(name, count):
    for seed in range(SEEDS, SEEDS + count):
        check(name, seed)


@pytest.mark.parametrize("name", NO_GRADIENT)
def test_no_gradient_ops_have_none_in_jax_either(name):
    """Grad.none is true: float -> float ones have a zero gradient in jax; the others take no float
    operand or give no float result."""
    op = registry.get(name)
    if name in INSTANCES:
        jax = pytest.importorskip("jax")
        for seed in range(SEEDS):
            rng = np.random.default_rng(seed)
            arrays, attrs, _ = INSTANCES[name](rng)
            with jax.enable_x64(True):
                cts = _cotangents(rng, name, arrays, attrs)
                if not any(a.dtype == np.float64 for a in arrays) or all(c is None for c in cts):
                    continue
                got, result_types = ours(name, arrays, attrs, cts)
                want = jax_vjp(emission(name, _frozen(attrs), result_types), arrays, cts, result_types)
                for g, w in zip(got, want):
                    assert not g.any() and not w.any(), f"{name} seed {seed}: jax has a gradient here"
        return
    types = [TensorType.parse(t) for t in op.example[0]]
    results = op.infer_types(types, _frozen(op.example[1]))
    assert not any(T.is_float(t.dtype) for t in types) or not any(T.is_float(t.dtype) for t in results), (
        f"{name} takes floats to floats: add a generator to INSTANCES so that its zero gradient is checked")


def test_every_op_declares_a_rule_or_no_gradient_and_every_rule_is_tested():
    """The coverage test: each global op has a vjp rule or Grad.none (Grad.unsupported and None are
    not allowed: grad through such an op would fail), and each rule has random instances here."""
    undeclared = [n for n in GLOBAL if not callable(registry.get(n).vjp) and registry.get(n).vjp != Grad.none]
    assert not undeclared, f"give these ops a vjp rule or vjp=Grad.none: {undeclared}"
    untested = [n for n in WITH_RULE if n not in INSTANCES]
    assert not untested, f"add a random-instance generator to INSTANCES in tests/test_vjp.py for: {untested}"
    stale = [n for n in INSTANCES if n not in GLOBAL]
    assert not stale, f"INSTANCES names ops that are gone: {stale}"


def test_cummax_shares_ties_equally():
    """Our convention (module doc): each y_j's cotangent is shared equally among the elements of its
    prefix that attain it, as reduce_max's rule; jax's cummax splits by its scan tree instead."""
    x = np.array([[1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 2.0, 2.0]])
    ct = np.arange(1.0, 9.0)[None]
    got, _ = ours("cummax", [x], {"axis": 1, "reverse": False}, [ct])
    # y_0..y_5 are 1 (shared by the 1s up to them), y_6 and y_7 are 2
    tail = 5 / 4 + 6 / 5
    want = [1 + 2 / 2 + 3 / 3 + 4 / 4 + tail, 2 / 2 + 3 / 3 + 4 / 4 + tail, 3 / 3 + 4 / 4 + tail, 4 / 4 + tail,
            0, 6 / 5, 7 + 8 / 2, 8 / 2]
    np.testing.assert_allclose(got[0][0], want, rtol=1e-12)
    np.testing.assert_allclose(_cummax_shares([x], {"axis": 1, "reverse": False}, [ct])[0][0], want, rtol=1e-12)
    for reverse in (False, True):
        got, _ = ours("cummax", [x.T], {"axis": 0, "reverse": reverse}, [ct.T])
        np.testing.assert_allclose(got[0], _cummax_shares([x.T], {"axis": 0, "reverse": reverse}, [ct.T])[0],
                                   rtol=1e-12)


def test_max_pool_ties_go_to_the_first_maximum_as_reduce_window():
    """A max pool's window gives its whole cotangent to its first maximum (select_and_scatter_add),
    as jax.grad of lax.reduce_window and of the emitted module (the xla backend's gradient) do; a
    window that starts in the padding and holds only -inf drops its cotangent."""
    jax = pytest.importorskip("jax")
    attrs = {"reduce": "max", "window": (2,), "strides": (1,), "padding": ((0, 0),)}
    for x, padding, want in [(np.ones((1, 4, 1)), ((0, 0),), [1.0, 2.0, 4.0, 0.0]),
                             (np.full((1, 3, 1), -np.inf), ((1, 1),), [2.0, 4.0, 8.0]),
                             (np.array([[[2.0], [np.nan], [1.0], [1.0]]]), ((0, 0),), [0.0, 1.0, 6.0, 0.0])]:
        attrs["padding"] = padding
        ct = (2.0 ** np.arange(x.shape[1] + sum(padding[0]) - 1))[None, :, None]
        got, types = ours("pool", [x], attrs, [ct])
        with jax.enable_x64(True):
            emitted = jax_vjp(emission("pool", _frozen(attrs), types), [x], [ct], types)[0]
            window = jax_vjp(_lax_pool(attrs), [x], [ct], types)[0]
        np.testing.assert_array_equal(got[0].ravel(), want)
        np.testing.assert_array_equal(emitted.ravel(), want)
        np.testing.assert_array_equal(window.ravel(), want)


@pytest.mark.parametrize("name, x", [("relu6", [-6.0, -0.0, 0.0, 3.0, 6.0, 9.0]),
                                     ("softplus", [-np.inf, -30.0, -1.0, 0.0, 1.0, 30.0, np.inf])])
def test_custom_jvp_activations_at_their_kinks(name, x):
    """jax.nn.relu6 and jax.nn.softplus define their derivatives by custom rules; ours give the same
    at the kinks (relu6: 0 at 0 and 6) and at the infinities (softplus: logaddexp's rule, 1 at +inf
    where its +inf is replaced by 0, 0 at -inf)."""
    jax = pytest.importorskip("jax")
    x = np.asarray(x)
    ct = np.arange(1.0, len(x) + 1)
    with jax.enable_x64(True):
        got, types = ours(name, [x], {}, [ct])
        want = jax_vjp(getattr(jax.nn, name), [x], [ct], types)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12, atol=0)
    if name == "relu6":
        np.testing.assert_array_equal(got[0], [0, 0, 0, 4, 0, 0])


@pytest.mark.slow
def test_vjp_matches_jax_on_many_random_instances():
    """A hypothesis sweep over ops and seeds."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    @settings(max_examples=150, deadline=None, derandomize=True)
    @given(st.sampled_from(WITH_RULE), st.integers(100, 10**6))
    def run(name, seed):
        check(name, seed)

    run()


# ---------------------------------------------------------------------------------- compositions
# builtins that lower to several ops, differentiated through the frontend: grad of sum(c * f(x))
# against jax.grad of the jax.numpy / jax.nn function, on normal values and on an integer grid (ties
# at clip's bounds, in logsumexp's and max's maxima, zeros in prod)

COMPOSITIONS = [
    ("clip(x, -1.0, 1.0)", lambda jnp, jax, x: jnp.clip(x, -1.0, 1.0)),
    ("softmax(x, axis=-1)", lambda jnp, jax, x: jax.nn.softmax(x, axis=-1)),
    ("softmax(x, axis=0)", lambda jnp, jax, x: jax.nn.softmax(x, axis=0)),
    ("logsumexp(x, axis=-1, keepdims=true)", lambda jnp, jax, x: jax.nn.logsumexp(x, axis=-1, keepdims=True)),
    ("x - logsumexp(x, axis=0, keepdims=true)", lambda jnp, jax, x: jax.nn.log_softmax(x, axis=0)),
    ("mean(x, axis=[0, 2], keepdims=true)", lambda jnp, jax, x: jnp.mean(x, axis=(0, 2), keepdims=True)),
    ("(x - mean(x, axis=-1, keepdims=true)) * rsqrt(mean(square(x - mean(x, axis=-1, keepdims=true)), "
     "axis=-1, keepdims=true) + 0.001)",
     lambda jnp, jax, x: (x - x.mean(-1, keepdims=True)) * jax.lax.rsqrt(x.var(-1, keepdims=True) + 0.001)),
    ("prod(x, axis=1)", lambda jnp, jax, x: jnp.prod(x, axis=1)),
    ("max(x, axis=[0, 1])", lambda jnp, jax, x: jnp.max(x, axis=(0, 1))),
    ("min(x, keepdims=true)", lambda jnp, jax, x: jnp.min(x, keepdims=True)),
    ("where(x > 0.0, x, 0.1 * x)", lambda jnp, jax, x: jnp.where(x > 0, x, 0.1 * x)),
    ("cumsum(x, axis=1) * cumprod(x, axis=2)", lambda jnp, jax, x: jnp.cumsum(x, 1) * jnp.cumprod(x, 2)),
    ("avg_pool(x, 2, stride=1, padding=\"SAME\")",
     lambda jnp, jax, x: jax.lax.reduce_window(x, 0.0, jax.lax.add, (1, 2, 2, 1), (1, 1, 1, 1),
                                               ((0, 0), (0, 1), (0, 1), (0, 0))) / 4.0),
    ("sort(x, axis=1)", lambda jnp, jax, x: jnp.sort(x, axis=1)),
    # jax.nn's activations (frontend/nn.py); on the grid: 0 (and 6 for relu6, +-1 for hard_tanh)
    ("log_softmax(x)", lambda jnp, jax, x: jax.nn.log_softmax(x)),
    ("log_softmax(x, axis=[0, 2])", lambda jnp, jax, x: jax.nn.log_softmax(x, axis=(0, 2))),
    ("sigmoid(x)", lambda jnp, jax, x: jax.nn.sigmoid(x)),
    ("softplus(x)", lambda jnp, jax, x: jax.nn.softplus(x)),
    ("log_sigmoid(x)", lambda jnp, jax, x: jax.nn.log_sigmoid(x)),
    ("silu(x) + swish(2.0 * x)", lambda jnp, jax, x: jax.nn.silu(x) + jax.nn.swish(2.0 * x)),
    ("relu6(3.0 * x)", lambda jnp, jax, x: jax.nn.relu6(3.0 * x)),
    ("hard_tanh(x)", lambda jnp, jax, x: jax.nn.hard_tanh(x)),
    ("leaky_relu(x) + leaky_relu(x, negative_slope=0.3)",
     lambda jnp, jax, x: jax.nn.leaky_relu(x) + jax.nn.leaky_relu(x, negative_slope=0.3)),
    ("elu(x) + elu(x, alpha=0.5)", lambda jnp, jax, x: jax.nn.elu(x) + jax.nn.elu(x, alpha=0.5)),
    ("celu(x) + celu(x, alpha=2.0)", lambda jnp, jax, x: jax.nn.celu(x) + jax.nn.celu(x, alpha=2.0)),
    ("selu(x)", lambda jnp, jax, x: jax.nn.selu(x)),
    ("glu(concat([x, x + 1.0], axis=1), axis=1)",
     lambda jnp, jax, x: jax.nn.glu(jnp.concatenate([x, x + 1.0], axis=1), axis=1)),
    ("standardize(x)", lambda jnp, jax, x: jax.nn.standardize(x)),
    ("standardize(x, axis=[1, 2], epsilon=0.1)", lambda jnp, jax, x: jax.nn.standardize(x, axis=(1, 2), epsilon=0.1)),
]


def _shape_text(shape) -> str:
    return f"f64[{', '.join(map(str, shape))}]"


@pytest.mark.parametrize("index", range(len(COMPOSITIONS)))
def test_compositions_differentiate_as_jax(index):
    import spmdlang

    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    expr, ref = COMPOSITIONS[index]
    for seed in range(2):
        rng = np.random.default_rng(seed)
        shape = (int(rng.integers(1, 4)), int(rng.integers(2, 6)), int(rng.integers(1, 5)), int(rng.integers(1, 3)))
        x = _floats(rng, shape, grid=seed == 1)
        with jax.enable_x64(True):
            y = jax.eval_shape(lambda v: ref(jnp, jax, v), jax.ShapeDtypeStruct(shape, jnp.float64))
            c = rng.standard_normal(y.shape)
            loss = jax.jit(jax.grad(lambda v, w: jnp.sum(w * ref(jnp, jax, v))))
            want = np.asarray(loss(jnp.asarray(x), jnp.asarray(c)))
        src = (f"mesh [p=1]\nfunc f(x: {_shape_text(shape)}, c: {_shape_text(y.shape)}) -> f64[] "
               f"{{ return sum(c * ({expr})) }}\n"
               f"func main(x: {_shape_text(shape)}, c: {_shape_text(y.shape)}) -> {_shape_text(shape)} "
               f"{{ return grad(f, x, c) }}\n")
        got = spmdlang.compile(src).run({"x": x, "c": c}, backend="ref")[0]
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9, err_msg=f"{expr} seed {seed}")
