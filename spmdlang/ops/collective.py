"""Per-partition ops: collectives, the partition index, and slicing/masking at partition offsets.

They appear only in per-partition programs. Collectives act on a group: the devices that share
every mesh coordinate except those of `axes`; a device's index in its group is its linear
coordinate over `axes` (first axis major), as `jax.lax.axis_index(axes)` counts.

Each collective's record here is its semantics; what the rest of the compiler knows of it (cost,
attributes, combining, reshard emission, HLO opcode) is its entry in the collective table,
ir.collectives, under the same CollectiveKind.

`simulate` runs a collective over all devices at once: it gets one array per mesh position and
the mesh, and returns one array per position (the numpy simulator's semantics of the collective).
"""

from __future__ import annotations

import math
from functools import partial

import numpy as np

from ..ir.collectives import CollectiveKind
from ..ir.types import TensorType, is_float, is_int, jnp_dtype, widen
from ..partition.permute import mesh_order_pairs, permute_pairs
from . import extremes
from .registry import Family, Stage, check, no_flops, py_literal, register


def groups(mesh, axes) -> list[list[int]]:
    """Mesh positions grouped by their coordinates off `axes`; members in axis_index order."""
    axes = tuple(axes)
    out: dict[tuple, list[tuple[int, int]]] = {}
    for pos in range(mesh.size):
        c = mesh.coords(pos)
        key = tuple((a, c[a]) for a in mesh.names if a not in axes)
        out.setdefault(key, []).append((mesh.group_index(pos, axes), pos))
    return [[p for _, p in sorted(members)] for members in out.values()]


def _with_dim(t: TensorType, dim: int, n: int) -> TensorType:
    shape = list(t.shape)
    shape[dim] = n
    return t.with_shape(shape)


# ---------------------------------------------------------------------------------- axis_index


def _axis_names(axes):
    """A collective's axes as jax takes them: one axis by its name (jax.lax.axis_index of a 1-tuple
    binds two more ops, index * 1 + 0), several as a tuple."""
    axes = tuple(axes)
    return axes[0] if len(axes) == 1 else axes


def _sim_axis_index(arrays, attrs, mesh):
    return [[np.asarray(mesh.group_index(pos, attrs["axes"]), dtype=np.int32) for pos in range(mesh.size)]]


register("axis_index", doc="this partition's linear index over `axes` (first axis major), an i32 scalar",
         family=Family.local, stage=Stage.local,
         flops=no_flops, infer=lambda ops, attrs: TensorType("i32", ()), numpy=None,
         simulate=_sim_axis_index,
         jax=lambda a, attrs, out: f"jax.lax.axis_index({_axis_names(attrs['axes'])!r})")


# ---------------------------------------------------------------------------------- all_gather


def _all_gather_infer(ops, attrs):
    (x,) = ops
    return _with_dim(x, attrs["dim"], x.shape[attrs["dim"]] * attrs["group"])


def _sim_all_gather(arrays, attrs, mesh):
    (xs,) = arrays
    out = [None] * mesh.size
    for g in groups(mesh, attrs["axes"]):
        full = np.concatenate([xs[p] for p in g], axis=attrs["dim"])
        for p in g:
            out[p] = full
    return [out]


register(CollectiveKind.ALL_GATHER, doc="concatenate the group's shards along `dim`, in group order",
         family=Family.collective, stage=Stage.local,
         flops=no_flops, infer=_all_gather_infer, numpy=None, simulate=_sim_all_gather,
         jax=lambda a, attrs, out: (f"jax.lax.all_gather({a[0]}, {tuple(attrs['axes'])!r}, "
                                    f"axis={attrs['dim']}, tiled=True)"))

# ---------------------------------------------------------------------------------- all_reduce

_REDUCERS = {"sum": np.sum, "max": partial(extremes.reduce, "max"), "min": partial(extremes.reduce, "min"),
             "prod": np.prod}


def _sim_all_reduce(arrays, attrs, mesh):
    """Variadic: one all_reduce may carry several operands (a combined collective)."""
    fn = _REDUCERS[attrs["reduce"]]
    results = []
    for xs in arrays:
        out = [None] * mesh.size
        for g in groups(mesh, attrs["axes"]):
            stacked = np.stack([xs[p] for p in g])
            r = np.asarray(fn(widen(stacked), axis=0)).astype(xs[g[0]].dtype)
            for p in g:
                out[p] = r
        results.append(out)
    return results


def _all_reduce_jax(a, attrs, out):
    axes = _mesh_ordered(attrs)  # a reduction's result does not depend on the axes' order
    kind = attrs["reduce"]
    arg = a[0] if len(a) == 1 else "(" + ", ".join(a) + ")"
    if kind == "prod":
        # (jnp.prod widens small ints to the default int, int64 once a module enables x64: keep
        # the dtype, wrapping as the reference does)
        keep = [f", dtype={jnp_dtype(t.dtype)}" if is_int(t.dtype) else "" for t in out]
        parts = [f"jnp.prod(jax.lax.all_gather({x}, {axes!r}, axis=0), axis=0{k})" for x, k in zip(a, keep)]
        return parts[0] if len(parts) == 1 else "(" + ", ".join(parts) + ")"
    if kind == "sum":
        return f"jax.lax.psum({arg}, {axes!r})"
    # integers and bools: jax.lax's pmax / pmin (exact, and carrying no tangent under jax.grad);
    # floats: the module's all_reduce helper (NaN kept, a derivative), except a cancelling shift's
    # max (ops.reduce, `shift`: a NaN makes its result NaN anyway), XLA's own under stop_gradient
    # (the shift has no gradient, and jax none for pmax)
    shift = [("shift" in h) for h in attrs.get("operand_hints") or ((),) * len(a)]
    parts = [f"jax.lax.p{kind}(jax.lax.stop_gradient({x}), {axes!r})" if s and is_float(t.dtype) else
             f"all_reduce({x}, {axes!r}, {str(kind)!r})" if is_float(t.dtype)
             else f"jax.lax.p{kind}({x}, {axes!r})" for x, t, s in zip(a, out, shift)]
    return parts[0] if len(parts) == 1 else "(" + ", ".join(parts) + ")"


_ALL_REDUCE_HELPER = '''
def all_reduce(x, axes, reduce):
    """jax.lax.pmax / pmin ("max" / "min") of floats, NaN kept and with a derivative.

    XLA's all-reduce max/min on CPU drops NaN (docs/known_xla_issues.md #8), jnp.max keeps it: the
    collective reduces integer keys that order the floats totally instead, NaN made the winner (the
    largest for max, the smallest for min), and the floats are read back. jax has no
    differentiation rule for pmax: as jax differentiates a max reduction, the tangent is that of
    the elements holding the result, averaged over the ties in the group."""
    collective = jax.lax.pmax if reduce == "max" else jax.lax.pmin

    @jax.custom_jvp
    def extreme(x):
        wide = x if x.dtype.itemsize >= 4 else jax.lax.convert_element_type(x, np.float32)
        ints = np.int32 if wide.dtype.itemsize == 4 else np.int64
        top = np.array(np.iinfo(ints).max, ints)
        nan = jax.lax.full_like(wide, np.nan if reduce == "max" else -np.nan)
        bits = jax.lax.bitcast_convert_type(jax.lax.select(jax.lax.ne(wide, wide), nan, wide), ints)

        def order(k):  # sign-magnitude <-> two's complement order (its own inverse)
            return jax.lax.select(jax.lax.lt(k, ints(0)), jax.lax.bitwise_xor(k, top), k)

        key = collective(order(bits), axes)
        return jax.lax.convert_element_type(jax.lax.bitcast_convert_type(order(key), wide.dtype), x.dtype)

    @extreme.defjvp
    def extreme_jvp(primals, tangents):
        (x,), (t,) = primals, tangents
        y = extreme(x)
        hit = jax.lax.convert_element_type(jax.lax.eq(x, y), t.dtype)
        return y, jax.lax.div(jax.lax.psum(jax.lax.mul(t, hit), axes), jax.lax.psum(hit, axes))

    return extreme(x)
'''


register(CollectiveKind.ALL_REDUCE,
         doc="combine (`reduce`: sum, max, min, prod) over the group; variadic: one collective",
         family=Family.collective, stage=Stage.local,
         flops=no_flops, infer=lambda ops, attrs: ops, numpy=None,
         simulate=_sim_all_reduce, jax=_all_reduce_jax, jax_helper=_ALL_REDUCE_HELPER)

# ---------------------------------------------------------------------------------- reduce_scatter


def _reduce_scatter_infer(ops, attrs):
    (x,) = ops
    n, k = x.shape[attrs["dim"]], attrs["group"]
    check(n % k == 0, f"reduce_scatter: dim of {n} does not divide by {k}")
    return _with_dim(x, attrs["dim"], n // k)


def _sim_reduce_scatter(arrays, attrs, mesh):
    (xs,) = arrays
    out = [None] * mesh.size
    dim = attrs["dim"]
    for g in groups(mesh, attrs["axes"]):
        stacked = np.stack([xs[p] for p in g])
        total = np.sum(widen(stacked), axis=0).astype(xs[g[0]].dtype)
        parts = np.split(total, len(g), axis=dim)
        for i, p in enumerate(g):
            out[p] = parts[i]
    return [out]


register(CollectiveKind.REDUCE_SCATTER, doc="sum over the group, each member keeping its chunk of `dim`",
         family=Family.collective, stage=Stage.local,
         flops=no_flops, infer=_reduce_scatter_infer, numpy=None,
         simulate=_sim_reduce_scatter,
         jax=lambda a, attrs, out: (f"jax.lax.psum_scatter({a[0]}, {tuple(attrs['axes'])!r}, "
                                    f"scatter_dimension={attrs['dim']}, tiled=True)"))

# ---------------------------------------------------------------------------------- all_to_all


def _all_to_all_infer(ops, attrs):
    (x,) = ops
    k, s, c = attrs["group"], attrs["split_dim"], attrs["concat_dim"]
    check(x.shape[s] % k == 0, f"all_to_all: split dim of {x.shape[s]} does not divide by {k}")
    if s == c:  # a dim of k blocks, block m sent to member m, received in member order
        return x
    return _with_dim(_with_dim(x, s, x.shape[s] // k), c, x.shape[c] * k)


def _sim_all_to_all(arrays, attrs, mesh):
    (xs,) = arrays
    out = [None] * mesh.size
    s, c = attrs["split_dim"], attrs["concat_dim"]
    for g in groups(mesh, attrs["axes"]):
        pieces = [np.split(xs[p], len(g), axis=s) for p in g]
        for i, p in enumerate(g):
            out[p] = np.concatenate([pieces[m][i] for m in range(len(g))], axis=c)
    return [out]


_ALL_TO_ALL_HELPER = '''
def all_to_all(x, axes, split_dim, concat_dim):
    """jax.lax.all_to_all (tiled) with its operand behind an optimization barrier: XLA otherwise
    splits an operand padded along split_dim to a piece boundary (e.g. einsum -> pad) into one
    operand per piece and then rejects its own HLO ("all-to-all has operands with different shapes")."""
    return jax.lax.all_to_all(jax.lax.optimization_barrier(x), axes, split_dim, concat_dim, tiled=True)
'''

register(CollectiveKind.ALL_TO_ALL,
         doc="split `split_dim` into group chunks, send chunk m to member m, concatenate on `concat_dim`",
         family=Family.collective, stage=Stage.local,
         flops=no_flops, infer=_all_to_all_infer, numpy=None, simulate=_sim_all_to_all,
         jax=lambda a, attrs, out: (f"all_to_all({a[0]}, {tuple(attrs['axes'])!r}, "
                                    f"{attrs['split_dim']}, {attrs['concat_dim']})"),
         jax_helper=_ALL_TO_ALL_HELPER)

# ---------------------------------------------------------------------------------- collective_permute


def _sim_permute(arrays, attrs, mesh):
    (xs,) = arrays
    out = [np.zeros_like(x) for x in xs]
    axes = tuple(attrs["axes"])
    sizes = tuple(mesh.axis_size(a) for a in axes)
    for g in groups(mesh, axes):
        for src, dst in permute_pairs(attrs["rule"], sizes):
            out[g[dst]] = xs[g[src]]
    return [out]


def _mesh_ordered(attrs) -> tuple:
    """The collective's axes in mesh order (attrs["mesh_axes"], which the jax emitter adds)."""
    axes = tuple(attrs["axes"])
    order = attrs.get("mesh_axes")
    return axes if order is None else tuple(sorted(axes, key=list(order).index))


# a permute's (source, destination) pairs up to this many are written out in the module; more are
# computed there by its permute_pairs helper (a line of a few hundred characters at most)
LITERAL_PAIRS = 16


def _permute_jax(a, attrs, out):
    """jax.lax.ppermute numbers a group by its axes in mesh order (see partition.permute), and
    jax >= 0.11 wants the axis names in that order too: the names are emitted in mesh order, and
    pairs computed over the axes as the rule writes them are renumbered (mesh_order_pairs), so the
    same devices exchange the same blocks. The pairs are written out (`perm=[(0, 1), (1, 2)]`), or
    for a large group computed by the module's permute_pairs (and mesh_order_pairs, over AXES: the
    mesh's) from the rule."""
    axes, sizes = tuple(attrs["axes"]), tuple(attrs["sizes"])
    ordered = _mesh_ordered(attrs)
    renumber = len(axes) > 1 and (ordered != axes or "mesh_axes" not in attrs)
    # the group's size bounds its pairs: only a small group's are listed here, so that emitting
    # never loops over the devices of a large mesh
    if math.prod(sizes) <= LITERAL_PAIRS and (not renumber or "mesh_axes" in attrs):
        pairs = permute_pairs(attrs["rule"], sizes)
        if renumber:
            pairs = mesh_order_pairs(pairs, axes, sizes, attrs["mesh_axes"])
        return f"jax.lax.ppermute({a[0]}, {ordered!r}, perm={pairs!r})"
    text = f"permute_pairs({attrs['rule']!r}, {sizes!r})"
    if renumber:
        text = f"mesh_order_pairs({text}, {axes!r}, {sizes!r}, AXES)"
    return f"jax.lax.ppermute({a[0]}, {ordered!r}, perm={text})"


register(CollectiveKind.COLLECTIVE_PERMUTE,
         doc="send to the member that `rule` names (partition.permute); others receive zeros",
         family=Family.collective, stage=Stage.local,
         flops=no_flops, infer=lambda ops, attrs: ops[0], numpy=None,
         simulate=_sim_permute, jax=_permute_jax)

# ---------------------------------------------------------------------------------- local slicing


def _shard_slice_infer(ops, attrs):
    x, idx = ops
    check(idx.rank == 0 and idx.dtype == "i32", "shard_slice: the index must be an i32 scalar")
    return _with_dim(x, attrs["dim"], attrs["size"])


def _pad_dim_to(x, dim, n, value):
    if x.shape[dim] >= n:
        return x
    widths = [(0, 0)] * x.ndim
    widths[dim] = (0, n - x.shape[dim])
    return np.pad(x, widths, constant_values=np.asarray(value).astype(x.dtype))


def _shard_slice_numpy(x, idx, *, dim, size, group):
    x = _pad_dim_to(x, dim, size * group, 0)
    start = int(idx) * size
    return np.take(x, np.arange(start, start + size), axis=dim)


def _shard_slice_jax(a, attrs, out):
    dim, size, group = attrs["dim"], attrs["size"], attrs["group"]
    return f"shard_slice({a[0]}, {a[1]}, dim={dim}, size={size}, group={group})"


_SHARD_SLICE_HELPER = '''
def shard_slice(x, idx, *, dim, size, group):
    """This partition's chunk (index idx, `size` elements) of dim `dim`, padding the dim first."""
    if x.shape[dim] < size * group:
        widths = [(0, 0, 0)] * x.ndim
        widths[dim] = (0, size * group - x.shape[dim], 0)
        x = jax.lax.pad(x, np.zeros((), x.dtype), widths)
    return jax.lax.dynamic_slice_in_dim(x, idx * size, size, dim, allow_negative_indices=False)  # idx >= 0
'''

register("shard_slice", doc="this partition's chunk (index idx, `size` elements) of dim `dim`, padding the dim first",
         family=Family.local, stage=Stage.local,
         flops=no_flops, infer=_shard_slice_infer, numpy=_shard_slice_numpy,
         jax=_shard_slice_jax, jax_helper=_SHARD_SLICE_HELPER, partial="additive", partial_operands=(0,))


def _range_mask_infer(ops, attrs):
    x, idx = ops
    check(idx.rank == 0, "range_mask: the index must be a scalar")
    return x


def _range_mask_numpy(x, idx, *, dim, chunk, offset, lo, hi, value):
    pos = int(idx) * chunk + offset + np.arange(x.shape[dim])
    keep = ((pos >= lo) & (pos < hi)).reshape([-1 if i == dim else 1 for i in range(x.ndim)])
    return np.where(keep, x, np.asarray(value).astype(x.dtype))


def _range_mask_jax(a, attrs, out):
    return (f"range_mask({a[0]}, {a[1]}, dim={attrs['dim']}, chunk={attrs['chunk']}, offset={attrs['offset']}, "
            f"lo={attrs['lo']}, hi={attrs['hi']}, value={py_literal(attrs['value'])})")


_RANGE_MASK_HELPER = '''
def range_mask(x, idx, *, dim, chunk, offset, lo, hi, value):
    """Keep elements whose global position idx*chunk + offset + t lies in [lo, hi); others := value."""
    int_ = lambda v: np.asarray(v, idx.dtype)  # noqa: E731 (jax.lax takes no Python int once x64 is on)
    pos = jax.lax.add(jax.lax.broadcasted_iota(idx.dtype, x.shape, dim),
                      jax.lax.add(jax.lax.mul(idx, int_(chunk)), int_(offset)))
    keep = jax.lax.bitwise_and(jax.lax.ge(pos, int_(lo)), jax.lax.lt(pos, int_(hi)))
    return jax.lax.select(keep, x, jax.lax.full(x.shape, value, x.dtype))
'''

# masks the padding of uneven shards and the outside of halo windows
register("range_mask", doc="keep elements at global positions idx*chunk + offset + t in [lo, hi); others := value",
         family=Family.local, stage=Stage.local,
         infer=_range_mask_infer, numpy=_range_mask_numpy, jax=_range_mask_jax, jax_helper=_RANGE_MASK_HELPER)

# ---------------------------------------------------------------------------------- dynamic_slice_in_dim
# (the halo's per-partition window; the language's dynamic_slice is in ops/dynamic.py)


def _dynamic_slice_infer(ops, attrs):
    x, start = ops
    check(start.rank == 0 and start.dtype == "i32", "dynamic_slice_in_dim: the start must be an i32 scalar")
    check(attrs["size"] <= x.shape[attrs["dim"]], "dynamic_slice_in_dim: size larger than the dim")
    return _with_dim(x, attrs["dim"], attrs["size"])


def _dynamic_slice_numpy(x, start, *, dim, size):
    s = int(np.clip(int(start), 0, x.shape[dim] - size))  # clamps like jax.lax.dynamic_slice
    return np.take(x, np.arange(s, s + size), axis=dim)


register("dynamic_slice_in_dim", doc="`size` elements of dim `dim` from a run-time start (clamped into the dim)",
         family=Family.local, stage=Stage.local,
         flops=no_flops, infer=_dynamic_slice_infer, numpy=_dynamic_slice_numpy,
         jax=lambda a, attrs, out: f"jax.lax.dynamic_slice_in_dim({a[0]}, {a[1]}, {attrs['size']}, {attrs['dim']})",
         partial="additive", partial_operands=(0,))
