"""Collective kinds: one typed table, the one place the compiler declares what a collective is
(as XLA's SPMDCollectiveOpsCreator is the one place its partitioner makes one).

A `CollectiveSpec` holds everything the middle floor knows of its kind: its latency steps and the
bytes one device sends (the cost model, partition.cost, and the ledger), the attributes its op
carries (the verifier), how the partitioner emits it for a reshard step (partition.reshard's plan),
its combining key and fuser (partition.combine), and its HLO opcode (backend_jax.hlo reading
XLA's module). Its semantics (shape rule, numpy simulation, jax lowering) are its op-table record
in ops/collective.py, registered under the same `CollectiveKind`. Nothing else branches on a
collective's kind. Adding one is described in docs/extensions.md ("Adding a collective").

Bytes are those one device sends for a group of k and `size` local operand bytes (ring algorithms):
  kind                 latency steps     bytes sent per device
  all_gather           k - 1             (k-1) * size
  all_reduce           2 (k - 1)         2 (k-1)/k * size   (a reduce_scatter + all_gather)
  reduce_scatter       k - 1             (k-1)/k * size
  all_to_all           k - 1             (k-1)/k * size
  collective_permute   1                 size
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from .builder import Builder
from .core import Op, freeze
from .names import OpName


class CollectiveKind(StrEnum):
    """A collective's op name; a str, so ledgers and JSON print it as before ("all_gather")."""

    ALL_GATHER = "all_gather"
    ALL_REDUCE = "all_reduce"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_TO_ALL = "all_to_all"
    COLLECTIVE_PERMUTE = "collective_permute"


@dataclass(frozen=True)
class CollectiveSpec:
    """One collective kind, as the cost model, partitioner, combiner, verifier and HLO reader see it."""

    kind: CollectiveKind
    hlo: str  # the opcode in XLA's HLO text
    attrs: tuple[str, ...]  # the attributes its op carries, all of them
    latency: Callable[[int], int]  # latency steps over a group of k > 1
    sends: Callable[[int, float], float]  # bytes one device sends: group k, local operand bytes
    operand_bytes: Callable[[float, int], float]  # an HLO result's bytes -> its operand's, group k
    emit: Callable  # (emitter, x, reshard step, k, local shape after) -> (value, the collective op)
    settles: bool = False  # carries `reduce`: settles a pending sum (a reshard step's partial_op)
    combine_by: str | None = None  # the attribute that, with axes and element type, keys combining
    fuse: Callable[[list[Op]], tuple[list[Op], Op]] | None = None  # combined side by side (else variadic)
    runs_as: Callable[[Mapping], CollectiveKind] | None = None  # what it runs as, if not itself

    @property
    def dims(self) -> tuple[str, ...]:
        """The attributes that name a dim of the operand."""
        return tuple(a for a in self.attrs if a.endswith("dim"))

    def actual(self, attrs: Mapping) -> CollectiveKind:
        """The kind that runs (jax has no product all-reduce: it runs as an all_gather)."""
        return self.runs_as(attrs) if self.runs_as else self.kind

    def combinable(self, attrs: Mapping) -> bool:
        return self.combine_by is not None and self.actual(attrs) == self.kind


def spec(kind) -> CollectiveSpec | None:
    """The spec of a collective kind (a CollectiveKind or its name); None for any other op."""
    return COLLECTIVES.get(kind)


def is_collective(kind) -> bool:
    return kind in COLLECTIVES


def latency_steps(kind, k: int) -> int:
    """Latency steps of one collective over a group of k (0 for a local step: shard_slice)."""
    s = spec(kind)
    return 0 if s is None or k <= 1 else s.latency(k)


def step_bytes(kind, k: int, size: float) -> float:
    """Bytes one device sends (as `explain` reports), for a group of k and `size` local bytes before the step."""
    s = spec(kind)
    return 0.0 if s is None else s.sends(k, size)


def combine_key(op: Op) -> tuple:
    """Ops with equal keys may be combined into one collective (XLA's compiled module splits a tuple
    all-reduce of mixed element types into one per type, hence the element type)."""
    s = COLLECTIVES[op.kind]
    return op.kind, tuple(op.attrs["axes"]), op.attrs[s.combine_by], op.operands[0].type.dtype


def step_combine_key(st, dtype: str) -> tuple:
    """The combining key of the collective a reshard step (partition.reshard.Step) emits."""
    s = COLLECTIVES[st.kind]
    return st.kind, tuple(st.axes), getattr(st, s.combine_by), dtype


# ---------------------------------------------------------------------------------- emission
# `e` is the partitioner's emitter: emit(kind, *operands, **attrs), pad_to, trim, mesh, last_op


def _subgroup(e, axes) -> tuple[str, ...] | None:
    """The mesh axes (mesh order) under a group that names sub-axes ("x:s:m", partition.reshard);
    None for a group of whole mesh axes."""
    if all(a in e.mesh.shape for a in axes):
        return None
    return e.mesh.order({a.split(":")[0] for a in axes})


def _group_shift(e, x, axes, offset: int, wrap: bool):
    """x sent to the member `offset` later in the group over `axes` (sub-axes allowed: the
    permute runs over their mesh axes, its rule shifting the group's digits alone)."""
    parents = _subgroup(e, axes)
    if parents is None:
        return e.emit(CollectiveKind.COLLECTIVE_PERMUTE, x, axes=tuple(axes),
                      sizes=tuple(e.mesh.axis_size(a) for a in axes), rule=("shift", offset, wrap))
    return e.emit(CollectiveKind.COLLECTIVE_PERMUTE, x, axes=parents, sizes=tuple(e.mesh.axis_size(a) for a in parents),
                  rule=("shift", offset, wrap, tuple(axes), parents))


def _by_shifts(e, x, st, k, split, concat):
    """An all_gather (split None) or all_to_all over a group naming sub-axes, which no jax
    collective spans: k - 1 permutes, the j-th sending to the member j later (all_to_all: the
    chunk of `split` for that member); member i holds the pieces of members i, i-1, ..., i-k+1,
    which reversed and doubled put members 0..k-1 in order from piece k-1-i: a dynamic slice.
    The same bytes as the collective, in k - 1 collectives. Returns (value, the permutes)."""
    i = e.axis_index(st.axes)
    const = lambda v: e.constant(v, "i32")  # noqa: E731
    pieces, cols = [], []
    for j in range(k):
        if split is None:
            piece = x
        else:
            c = x.type.shape[split] // k
            at = i if j == 0 else e.emit("mod", e.emit(OpName.ADD, i, const(j)), const(k))
            piece = e.emit("dynamic_slice_in_dim", x, e.emit("mul", at, const(c)), dim=split, size=c)
        if j:
            piece = _group_shift(e, piece, st.axes, j, True)
            cols.append(e.last_op)
        pieces.append(piece)
    pieces = pieces[::-1]
    b = pieces[0].type.shape[concat]
    y = e.emit(OpName.CONCAT, *pieces, *pieces, axis=concat)
    start = e.emit("mul", e.emit(OpName.SUB, const(k - 1), i), const(b))
    return e.emit("dynamic_slice_in_dim", y, start, dim=concat, size=k * b), tuple(cols)


def _emit_all_gather(e, x, st, k, after):
    if _subgroup(e, st.axes) is not None:
        x, cols = _by_shifts(e, x, st, k, None, st.dim)
        return e.trim(x, st.dim, after[st.dim]), cols
    x = e.emit(CollectiveKind.ALL_GATHER, x, axes=st.axes, dim=st.dim, group=k)
    col = e.last_op
    if st.block:  # the blocks stay as gathered: the boundary fix (a permute step) comes next
        return x, col
    return e.trim(x, st.dim, after[st.dim]), col


def _emit_all_reduce(e, x, st, k, after):
    return e.emit(CollectiveKind.ALL_REDUCE, x, axes=st.axes, reduce=st.reduce), e.last_op


def _emit_reduce_scatter(e, x, st, k, after):
    x = e.pad_to(x, st.dim, k * after[st.dim])
    return e.emit(CollectiveKind.REDUCE_SCATTER, x, axes=st.axes, dim=st.dim, group=k), e.last_op


def _emit_all_to_all(e, x, st, k, after):
    if st.moves:
        return _all_to_all_dims(e, x, st.moves, st.axes, k)
    x = e.pad_to(x, st.dim, k * after[st.dim])
    if _subgroup(e, st.axes) is not None:
        x, cols = _by_shifts(e, x, st, k, st.dim, st.dim2)
        return e.trim(x, st.dim2, after[st.dim2]), cols
    x = e.emit(CollectiveKind.ALL_TO_ALL, x, axes=st.axes, split_dim=st.dim, concat_dim=st.dim2, group=k)
    col = e.last_op
    return e.trim(x, st.dim2, after[st.dim2]), col


def _all_to_all_dims(e, x, moves, axes, k: int):
    """One all_to_all moving several splits at once, each (split dim j, concat dim d, its
    axes; the d distinct, moves sharing a j split it in turn, the first major): split every j
    into (k_i, rest), bring the k_i to the front as one dim of k (group
    index order: the moves' axes in turn, major first), exchange along it, then put each k_i
    back on the major side of its d. Returns (result, the collective op)."""
    shape = x.type.shape
    ks = [e.mesh.group_size(a) for _, _, a in moves]
    split: dict[int, list[int]] = {}  # moves joining one dim split it in turn, the first major
    for i, (j, _, _) in enumerate(moves):
        split.setdefault(j, []).append(i)
    concat = {d: i for i, (_, d, _) in enumerate(moves)}
    expanded, pos = [], {}
    for t, n in enumerate(shape):
        for i in split.get(t, ()):
            pos[("k", i)] = len(expanded)
            expanded.append(ks[i])
            n //= ks[i]
        pos[t] = len(expanded)
        expanded.append(n)
    front = [pos[("k", i)] for i in range(len(moves))]
    rest = [i for i in range(len(expanded)) if i not in front]
    y = e.emit("reshape", x, shape=tuple(expanded))
    y = e.emit("transpose", y, perm=tuple(front + rest))
    rest_shape = [expanded[i] for i in rest]
    y = e.emit("reshape", y, shape=(k, *rest_shape))
    y = e.emit(CollectiveKind.ALL_TO_ALL, y, axes=tuple(axes), split_dim=0, concat_dim=0, group=k)
    col = e.last_op
    y = e.emit("reshape", y, shape=(*ks, *rest_shape))
    # dims now: the k_i (0..m-1), then the original dims in order (split ones shrunk)
    m = len(moves)
    perm, final = [], []
    for t in range(len(shape)):
        if t in concat:
            perm.append(concat[t])
        perm.append(m + t)
        final.append(rest_shape[t] * (ks[concat[t]] if t in concat else 1))
    y = e.emit("transpose", y, perm=tuple(perm))
    return e.emit("reshape", y, shape=tuple(final)), col


def _emit_boundary_fix(e, x, st, k, after):
    """Blocks of st.block[0] elements on st.dim (an all_gather left them) to the standard chunks of
    the layout: each shard takes the rows that cross into its chunk from its neighbour, one shift
    (the emitter's `boundary_fix`: partition.halo.window with output shard i starting at i*chunk)."""
    y, (col,) = e.boundary_fix(x, st.dim, st.axes, st.block[1], after[st.dim])
    return y, col


def _emit_shift_fix(e, x, st, k, after):
    """Fine shard g = (i, j) of st.axes (coarse axes major) takes its rows from i*D before its own:
    the pieces of shards g+q (one shift each), its own rows, then a dynamic slice at (-i*D - lo).
    Returns (value, the collectives)."""
    shift, coarse, pieces = st.prefix
    d, f = st.dim, x.type.shape[st.dim]
    parts, cols = [], []
    for q, start, stop in pieces:
        parts.append(_group_shift(e, e.slice_dim(x, d, start, stop), st.axes, -q, False))
        cols.append(e.last_op)
    lo = pieces[0][0] * f + pieces[0][1]
    y = e.emit(OpName.CONCAT, *parts, x, axis=d)
    at = e.affine_index(st.axes[:coarse], -shift, -lo)
    return e.emit("dynamic_slice_in_dim", y, at, dim=d, size=f), tuple(cols)


def _emit_permute(e, x, st, k, after):
    if st.prefix:
        return _emit_shift_fix(e, x, st, k, after)
    if st.block:
        return _emit_boundary_fix(e, x, st, k, after)
    axes = _subgroup(e, st.axes) or st.axes  # sub-axes: the permute runs over their mesh axes
    rule = ("relayout", axes, st.before.dims, st.after.dims)
    x = e.emit(CollectiveKind.COLLECTIVE_PERMUTE, x, axes=axes,
               sizes=tuple(e.mesh.axis_size(a) for a in axes), rule=rule)
    return x, e.last_op


# ---------------------------------------------------------------------------------- fusers


def _fused_reduce_scatter(group: list[Op], riders: tuple[Op, ...] = ()) -> tuple[list[Op], Op]:
    """Several reduce_scatters over one group as ONE (XLA's reduce-scatter combiner): each operand
    laid out as [k, m_i] (its k chunks of `dim` first), concatenated to [k, sum m_i], scattered,
    and each member's piece reshaped back into the member's own result value. `riders`: small
    all_reduce(sum)s over the same axes carried in the same collective (combine.rides): each
    operand broadcast to [k, m] (every chunk holds it, so every shard's piece is its sum). Returns
    the ops and the collective among them."""
    b = Builder()
    k = group[0].attrs["group"]
    flat = []
    for g in group:
        (x,), d = g.operands, g.attrs["dim"]
        shape = x.type.shape
        y = b.emit("reshape", x, span=g.span, shape=(*shape[:d], k, shape[d] // k, *shape[d + 1:]))
        if d:
            y = b.emit("transpose", y, span=g.span, perm=(d, *[i for i in range(len(shape) + 1) if i != d]))
        flat.append(b.emit("reshape", y, span=g.span, shape=(k, x.type.size // k)))
    outs = [(g.span, g.results) for g in group]
    for r in riders:
        for x, res in zip(r.operands, r.results):
            row = b.emit("reshape", x, span=r.span, shape=(1, x.type.size))
            flat.append(b.emit("broadcast_in_dim", row, span=r.span, shape=(k, x.type.size), dims=(0, 1)))
            outs.append((r.span, (res,)))
    both = b.emit(OpName.CONCAT, *flat, span=group[0].span, axis=1) if len(flat) > 1 else flat[0]
    scattered = b.emit(CollectiveKind.REDUCE_SCATTER, both, span=group[0].span, axes=group[0].attrs["axes"],
                       dim=0, group=k)
    collective = b.ops[-1]
    start = 0
    for (span, results), f in zip(outs, flat):
        m = f.type.shape[1]
        piece = b.emit("slice", scattered, span=span, starts=(0, start), stops=(1, start + m), steps=(1, 1))
        b.ops.append(Op("reshape", (piece,), results, freeze({"shape": results[0].type.shape}), span))
        start += m
    return b.ops, collective


def _fused_all_gather(group: list[Op]) -> tuple[list[Op], Op]:
    """Several all_gathers over one group as ONE (XLA's all-gather combiner): each operand
    flattened to [1, m_i], concatenated to [1, sum m_i], gathered to [k, sum m_i], and each
    member's [k, m_i] piece laid back out as its own result (the k shards side by side along the
    member's `dim`). Returns the ops and the collective among them.

    Members of one size are stacked instead, [n, m] gathered along dim 1 to [n, k * m] (row i:
    member i's k shards one after the other): the same bytes, but XLA's CPU backend fuses the
    members' producers into the stacking (it does not fuse into a concatenate along the major
    dim), one kernel fewer per member to compile (train_zero: 20 kernels -> 18, its compile
    about 13% faster)."""
    b = Builder()
    k = group[0].attrs["group"]
    n, stacked = len(group), len({g.operands[0].type.size for g in group}) == 1 and len(group) > 1
    flat = [b.emit("reshape", g.operands[0], span=g.span, shape=(1, g.operands[0].type.size)) for g in group]
    both = b.emit(OpName.CONCAT, *flat, span=group[0].span, axis=0 if stacked else 1) if n > 1 else flat[0]
    gathered = b.emit(CollectiveKind.ALL_GATHER, both, span=group[0].span, axes=group[0].attrs["axes"],
                      dim=1 if stacked else 0, group=k)
    collective = b.ops[-1]
    start = 0
    for i, (g, f) in enumerate(zip(group, flat)):
        (x,), d = g.operands, g.attrs["dim"]
        shape, m = x.type.shape, f.type.shape[1]
        if stacked:  # row i, [1, k * m]: the k shards one after the other, as [k, m] reads them
            piece = b.emit("slice", gathered, span=g.span, starts=(i, 0), stops=(i + 1, k * m), steps=(1, 1))
        else:
            piece = b.emit("slice", gathered, span=g.span, starts=(0, start), stops=(k, start + m), steps=(1, 1))
        y = b.emit("reshape", piece, span=g.span, shape=(k, *shape))
        if d:
            y = b.emit("transpose", y, span=g.span, perm=(*range(1, d + 1), 0, *range(d + 1, len(shape) + 1)))
        b.ops.append(Op("reshape", (y,), g.results, freeze({"shape": g.result.type.shape}), g.span))
        start += m
    return b.ops, collective


# ---------------------------------------------------------------------------------- the table

_SAME = lambda size, k: size  # noqa: E731  (the result is as large as the operand)

COLLECTIVES: dict[CollectiveKind, CollectiveSpec] = {s.kind: s for s in (
    CollectiveSpec(CollectiveKind.ALL_GATHER, "all-gather", ("axes", "dim", "group"),
                   latency=lambda k: k - 1, sends=lambda k, size: (k - 1) * size,
                   operand_bytes=lambda size, k: size / k, emit=_emit_all_gather,
                   combine_by="group", fuse=_fused_all_gather),
    CollectiveSpec(CollectiveKind.ALL_REDUCE, "all-reduce", ("axes", "reduce"),
                   latency=lambda k: 2 * (k - 1), sends=lambda k, size: 2 * (k - 1) / k * size,
                   operand_bytes=_SAME, emit=_emit_all_reduce, settles=True, combine_by="reduce",
                   runs_as=lambda attrs: (CollectiveKind.ALL_GATHER if attrs.get("reduce") == "prod"
                                          else CollectiveKind.ALL_REDUCE)),
    CollectiveSpec(CollectiveKind.REDUCE_SCATTER, "reduce-scatter", ("axes", "dim", "group"),
                   latency=lambda k: k - 1, sends=lambda k, size: (k - 1) / k * size,
                   operand_bytes=lambda size, k: size * k, emit=_emit_reduce_scatter, settles=True,
                   combine_by="group", fuse=_fused_reduce_scatter),
    CollectiveSpec(CollectiveKind.ALL_TO_ALL, "all-to-all", ("axes", "split_dim", "concat_dim", "group"),
                   latency=lambda k: k - 1, sends=lambda k, size: (k - 1) / k * size,
                   operand_bytes=_SAME, emit=_emit_all_to_all),
    CollectiveSpec(CollectiveKind.COLLECTIVE_PERMUTE, "collective-permute", ("axes", "sizes", "rule"),
                   latency=lambda k: 1, sends=lambda k, size: size, operand_bytes=_SAME, emit=_emit_permute),
)}
BY_HLO: dict[str, CollectiveKind] = {s.hlo: s.kind for s in COLLECTIVES.values()}
