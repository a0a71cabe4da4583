"""Resharding: from any Sharding of a tensor to any other on the same mesh, as cheap collectives.

Invariant: every step maps a valid layout of the same global array to another valid layout.
A layout splits dim d of size n over k = |axes| shards of ceil(n/k) elements, shard i holding
global elements [i*c, (i+1)*c); padding only ever sits past n, at the end of the dim.

The table, per axis (DTensor's `_redistribute` in mesh-axis form):
  current             wanted                  step                       bytes sent per device
  partial(a)          a splits dim d next     reduce_scatter(a, d)       (k-1)/k * S
  partial(a)          a not in the layout     all_reduce(a)              2 (k-1)/k * S
  a splits dim d      a not in the layout     all_gather(a, d)           (k-1) * s
  a splits dim d      a splits dim e next     all_to_all(a, e -> d)      (k-1)/k * S
  a absent            a splits dim d next     shard_slice(a, d)          0  (a local slice)
  same shard counts   other axes/order        collective_permute         S
Axes leaving a dim go minor first; axes joining a dim are appended on its minor side; runs of
axes doing the same thing share one collective (one all_reduce over both contracting axes, one
all_to_all over a group (x, y) that moves together, one all_to_all for moves between disjoint
dims). Reduce-scatters and slices come first (they shrink the data), then all_reduces of what
cannot be scattered, then moves and gathers. Uneven splits nest only when
m * ceil(n/(k*m)) == ceil(n/k) (or the coarse layout is whole); where they do not, the dim is
gathered whole and sliced afresh, or (the search's step below) the minor run is gathered with
its blocks left as they come, m * ceil(n/(k*m)) elements each, and one collective_permute moves
the rows that cross into each ceil(n/k) chunk from the neighbouring shard (XLA's edge fix):
{(y, z), _} -> {y, _} on 6 rows gathers z (y-blocks [0, 4), [4, 6)) and sends row 3 to y=1,
80 + 40 bytes where gathering (y, z) whole sends 240 (f32[6, 10]). Or the fix comes first, on
the fine shards (shift_fix): those of coarse shard i take their rows from i*D earlier, one
permute per neighbour they reach, and the plain gather then leaves each chunk first in its block:
{_, (z, y, x)} -> {_, z} on 10 columns moves 2 columns (48 B) where fixing after moves 3 (72 B).

Moves over several axes. A permute relabels axes: any layout reaches any other with the same
shard count on every dim in one collective_permute of the local block. So an axis need not be
gathered to change dim or position: {x, (y, z)} -> {(y, x), z} is all_to_all(z, dim 1 -> 0),
giving {(x, z), y} (the target's shard counts), then one permute; {x, y, _} -> {z, (x, y), _}
is a slice over z, giving {x, (y, z), _}, then one permute; an unmerge
{_, (x, y)} -> {x, y} is all_to_all((x, y), 1 -> 0) then all_to_all(y, 0 -> 1). Only axes the
target no longer uses are gathered, axes it adds are local slices, done before the moves.

Sub-axes. An axis of composite size is XLA's product of subgroups: on [x=4, y=2], x is
(x:2:2, x:1:2) (sub-axis "x:s:m": the device digit (x // s) % m, ir.mesh.sub_axis), and a layout
may split a dim over a sub-axis alone. Where the mesh has such an axis (and the atoms are at most
SUB_ATOMS), the search runs once more over the prime sub-axes, and finds XLA's plans:
  {_, x} -> {_, y} on f32[6, 10]  permute to {_, (y, x:2:2)}, fix the boundaries, gather x:2:2:
                                  72 + 24 + 72 bytes where gathering x sends 216
  {y, _} -> {x, y} on f32[8, 8]   slice x:2:2 and x:1:2, one permute: 32 where an all_to_all sends 64
  {x, y} -> {y, x} on f32[8, 8]   all_to_all over x:1:2, one permute: 16 + 32, not 32 + 48
No jax collective spans a sub-axis, so the steps over one run as permutes over the mesh axis:
a relabelling permute is one (its pairs computed from the two layouts by partition.permute at
run or trace time, never per device by the compiler), a gather or all_to_all over a group of k
is k - 1 permutes of the same bytes (ir.collectives._by_shifts), and a slice takes the digit of
the axis index. Layouts and groups are written with whole axes wherever the sub-axes of one
come together in order.

Four plans are weighed: the greedy walk of the table above; the fallback "settle sums in place,
gather whole what does not nest, slice", which bounds every plan by the bytes of gathering
everything; one collective_permute where both layouts have the same shard counts; and, where
those move more than once, gather an axis the target keeps, or slice after moving, a search
(Dijkstra over layouts, `_Search`) whose steps are the rows above on minor runs of each dim plus
a permute to any layout of the same shard counts, once for the cost model and once for the
fewest bytes. The plan kept is the cheapest in the cost model (partition.cost: bytes plus the
latency steps of each collective), then the one with fewer collectives, among the plans that no
other plan beats on both bytes and collectives (at a few bytes per device the 16-byte latency
steps alone would prefer two all_to_alls over k=2 to one over k=4 that sends fewer bytes).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from functools import lru_cache
from itertools import permutations
from math import prod

from ..ir.collectives import CollectiveKind, is_collective, spec
from ..ir.mesh import Mesh, Sharding, sub_axis
from ..ir.names import OpName
from .cost import collective_cost, comm_cost, step_bytes
from .halo import Window, parts

__all__ = ["Step", "boundary_fix", "chunk", "comm_cost", "drop_trivial_axes", "nests", "plan_cost", "plan_reshard",
           "shift_fix", "step_bytes"]


@dataclass(frozen=True)
class Step:
    kind: CollectiveKind | OpName  # a collective, or OpName.SHARD_SLICE (a local slice)
    axes: tuple[str, ...]
    before: Sharding
    after: Sharding
    bytes: float = 0.0
    dim: int | None = None
    dim2: int | None = None  # all_to_all: the dim the axes leave (concat side)
    reduce: str = "sum"
    group: int = 1  # devices in the collective's group
    moves: tuple = ()  # all_to_all of several dims at once: ((split dim, concat dim, axes), ...)
    # a boundary fix (uneven shards that do not nest), block = (B, the dim's global size): an
    # all_gather that leaves blocks of B elements on `dim` (the gathered fine shards, untrimmed),
    # then a collective_permute on the same dim moving the rows that cross into each standard
    # chunk from the neighbouring shard
    block: tuple = ()
    # the other boundary fix, before the gather (prefix = (D, axes of the coarse split, pieces)):
    # collective_permutes over `axes` (coarse major, fine minor) shift the fine shards of coarse
    # shard i back by i*D rows, D = m*ceil(n/(k*m)) - ceil(n/k), one per piece (q, start, stop):
    # rows [start, stop) of fine shard g+q to g; the plain all_gather that follows then leaves
    # each standard chunk first in its block
    prefix: tuple = ()

    @property
    def is_collective(self) -> bool:
        return is_collective(self.kind)


def chunk(n: int, k: int) -> int:
    return -(-n // k)


def nests(n: int, k_coarse: int, m: int) -> bool:
    """Does the k_coarse*m-way layout of a dim of n sit inside the k_coarse-way one, shard by shard?"""
    return k_coarse == 1 or m * chunk(n, k_coarse * m) == chunk(n, k_coarse)


@lru_cache(maxsize=4096)
def boundary_fix(n: int, k: int, m: int) -> tuple[int, int] | None:
    """Gathering m fine shards of a dim of n split k*m ways leaves blocks of B = m*ceil(n/(k*m))
    elements on each of the k coarse shards, where the k-way layout wants ceil(n/k). (B, rows the
    one permute moves) when one shift of a static slice from the neighbouring shard fixes every
    block's boundaries; None when the shards nest (no fix needed) or it takes more than one shift."""
    c, big = chunk(n, k), m * chunk(n, k * m)
    if k == 1 or big == c:
        return None
    travel = [(q, a, b) for q, a, b in parts(Window(c, 0, c), big, k, n)[2] if q != 0]
    if len(travel) != 1 or not 0 < abs(travel[0][0]) < k:
        return None
    _, a, b = travel[0]
    return big, b - a


@lru_cache(maxsize=4096)
def shift_fix(n: int, k: int, m: int) -> tuple[int, tuple] | None:
    """The boundary fix before gathering m fine shards of a dim of n split k*m ways: fine shard
    (i, j) (index g = i*m + j) takes the f = ceil(n/(k*m)) rows starting i*D before its own, so
    that coarse block i gathers [i*ceil(n/k), ...). (D, pieces (q, start, stop)): the rows of fine
    shard g+q every shard receives (the hull over i >= 1 of [-i*D, f - i*D) left of its own rows);
    None when the shards nest."""
    f = chunk(n, k * m)
    d = m * f - chunk(n, k)
    if k == 1 or d == 0:
        return None
    lo, hi = -(k - 1) * d, min(0, f - d)  # what the shards i >= 1 need from others, relative to their rows
    pieces = tuple((q, max(0, lo - q * f), min(f, hi - q * f)) for q in range(lo // f, 0) if q * f < hi)
    return d, pieces


def local_bytes(shape, itemsize: int, mesh: Mesh, s: Sharding) -> int:
    return prod(s.local_shape(shape, mesh)) * itemsize


class _Planner:
    def __init__(self, shape, itemsize, mesh: Mesh, src: Sharding, dst: Sharding):
        self.shape, self.itemsize, self.mesh = tuple(shape), itemsize, mesh
        self.dst = dst
        self.cur = [list(d) for d in src.dims]
        self.partial = list(src.partial)
        self.op = src.partial_op
        self.resolve = [a for a in src.partial if a not in dst.partial]
        self.steps: list[Step] = []

    def layout(self) -> Sharding:
        return Sharding(tuple(map(tuple, self.cur)), tuple(self.partial), frozenset(),
                        self.op if self.partial else "sum")

    def measure(self, axes):
        before = self.layout()
        k = self.mesh.group_size(axes)
        size = local_bytes(self.shape, self.itemsize, self.mesh, before)
        return before, k, size

    def record(self, kind, axes, before, k, size, dim=None, dim2=None):
        settles = is_collective(kind) and spec(kind).settles
        self.steps.append(Step(kind, tuple(axes), before, self.layout(), step_bytes(kind, k, size), dim, dim2,
                               self.op if settles else "sum", k))

    def shards(self, axes) -> int:
        return self.mesh.group_size(axes)

    def used_elsewhere(self, a, d) -> bool:
        return any(a in self.cur[e] for e in range(len(self.cur)) if e != d)

    # ---- steps
    def gather_whole(self, d):
        axes = tuple(self.cur[d])
        before, k, size = self.measure(axes)
        self.cur[d] = []
        self.record(CollectiveKind.ALL_GATHER, axes, before, k, size, d)

    def append(self) -> bool:
        """Slices and reduce-scatters on dims whose current axes prefix the wanted ones."""
        for d, want in enumerate(self.dst.dims):
            cur = self.cur[d]
            if tuple(cur) != tuple(want[: len(cur)]):
                continue
            run, kind = [], None
            for a in want[len(cur):]:
                if self.used_elsewhere(a, d):
                    break
                if a in self.partial:
                    if a not in self.resolve or self.op != "sum":
                        break
                    k = CollectiveKind.REDUCE_SCATTER
                else:
                    k = OpName.SHARD_SLICE
                if kind not in (None, k):
                    break
                kind = k
                run.append(a)
            if not run:
                continue
            late = self._late_sums(d)
            if late:
                # scattering and slicing in turns would not nest (uneven shards): settle the sums
                # first; a reduce_scatter then all_gather costs as much as the all_reduce anyway
                return self.all_reduce(late)
            if not nests(self.shape[d], self.shards(cur), self.shards(run)):
                if kind == CollectiveKind.REDUCE_SCATTER:
                    # the scattered layout does not sit inside the current one: settle the sum in
                    # place (gathering would bring us back here, a loop), then slice like any axis
                    return self.all_reduce(run)
                if not cur:
                    raise AssertionError("a whole dim always nests")
                self.gather_whole(d)
                return True
            before, k, size = self.measure(run)
            self.cur[d] = cur + run
            if kind == CollectiveKind.REDUCE_SCATTER:
                self.partial = [a for a in self.partial if a not in run]
                self.resolve = [a for a in self.resolve if a not in run]
            self.record(kind, run, before, k, size, d)
            return True
        return False

    def _late_sums(self, d) -> list[str]:
        """Pending-sum axes wanted on dim d, if the runs (scatters, slices) that would append them
        do not all nest one inside the other: summing them in place first leaves one slice."""
        cur, want = self.cur[d], self.dst.dims[d]
        rest = []
        for a in want[len(cur):]:
            if self.used_elsewhere(a, d):
                break
            rest.append(a)
        sums = {a for a in rest if a in self.resolve and self.op == "sum"}
        i = 0
        while sums and i < len(rest):
            j = i
            while j < len(rest) and (rest[j] in sums) == (rest[i] in sums):
                j += 1
            if not nests(self.shape[d], self.shards(want[: len(cur) + i]), self.shards(rest[i:j])):
                return [a for a in rest if a in sums]
            i = j
        return []

    def all_reduce(self, axes) -> bool:
        if not axes:
            return False
        axes = tuple(a for a in self.mesh.names if a in axes)
        before, k, size = self.measure(axes)
        self.partial = [a for a in self.partial if a not in axes]
        self.resolve = [a for a in self.resolve if a not in axes]
        self.record(CollectiveKind.ALL_REDUCE, axes, before, k, size)
        return True

    def remove(self) -> bool:
        """Moves (all_to_all) and drops (all_gather) of axes beyond each dim's common prefix:
        first any move, then drops of axes wanted nowhere (they may unblock moves), then the rest."""
        extras = {}
        for d, want in enumerate(self.dst.dims):
            cur = self.cur[d]
            common = 0
            while common < min(len(cur), len(want)) and cur[common] == want[common]:
                common += 1
            if cur[common:]:
                extras[d] = cur[common:]
        for d, ex in extras.items():
            if self._move(d, ex):
                return True
        wanted = {a for w in self.dst.dims for a in w}
        for d, ex in extras.items():
            if ex[-1] not in wanted:
                run = []
                for a in reversed(ex):
                    if a in wanted:
                        break
                    run.insert(0, a)
                return self._drop(d, run)
        d, ex = next(iter(extras.items()), (None, None))
        if d is None:
            return False
        run = []
        for a in reversed(ex):
            if self._move_target(a, d) is not None and run:
                break
            run.insert(0, a)
        return self._drop(d, run)

    def _move(self, d, extras) -> bool:
        """Move the longest minor run of dim d's extra axes that another dim wants next, in the
        same order, as ONE all_to_all over the whole run (a group (x, y) moves together)."""
        cur = self.cur[d]
        for j, want in enumerate(self.dst.dims):
            cj = self.cur[j]
            if j == d or tuple(cj) != tuple(want[: len(cj)]):
                continue
            nxt = list(want[len(cj):])
            for n in range(min(len(extras), len(nxt)), 0, -1):
                run = extras[-n:]
                if nxt[:n] != run:
                    continue
                keep = cur[: len(cur) - n]
                m = self.shards(run)
                if not (nests(self.shape[d], self.shards(keep), m) and nests(self.shape[j], self.shards(cj), m)):
                    continue
                before, k, size = self.measure(run)
                self.cur[d] = keep
                self.cur[j] = cj + list(run)
                self.record(CollectiveKind.ALL_TO_ALL, run, before, k, size, j, d)
                return True
        return False

    def _drop(self, d, run) -> bool:
        cur = self.cur[d]
        keep = cur[: len(cur) - len(run)]
        if not nests(self.shape[d], self.shards(keep), self.shards(run)):
            self.gather_whole(d)
            return True
        before, k, size = self.measure(run)
        self.cur[d] = keep
        self.record(CollectiveKind.ALL_GATHER, run, before, k, size, d)
        return True

    def _move_target(self, a, d):
        for j, want in enumerate(self.dst.dims):
            cur = self.cur[j]
            if j != d and tuple(cur) == tuple(want[: len(cur)]) and len(want) > len(cur) and want[len(cur)] == a:
                return j
        return None

    def run(self) -> list[Step]:
        want = [list(d) for d in self.dst.dims]
        for _ in range(4 * (len(self.cur) + 1) * (len(self.mesh.names) + 1)):
            if self.cur == want and not self.resolve:  # there (what the last round below would find)
                return self.steps
            if self.append():
                continue
            # pending sums over axes the wanted layout does not split: settle them on the small data
            if self.all_reduce([a for a in self.resolve if not any(a in w for w in self.dst.dims)]):
                continue
            if self.remove():
                continue
            if self.all_reduce(list(self.resolve)):
                continue
            if tuple(map(tuple, self.cur)) == self.dst.dims:
                return self.steps
            # stuck (an axis wanted where it cannot be appended yet): gather the offending dims whole
            for d, want in enumerate(self.dst.dims):
                if tuple(self.cur[d]) != tuple(want[: len(self.cur[d])]) and self.cur[d]:
                    self.gather_whole(d)
                    break
            else:
                raise AssertionError(f"reshard stuck at {self.layout()} -> {self.dst}")
        raise AssertionError(f"reshard did not converge: {self.layout()} -> {self.dst}")


def _permute_plan(shape, itemsize, mesh: Mesh, src: Sharding, dst: Sharding) -> list[Step] | None:
    if set(src.partial) != set(dst.partial) or src.dims == dst.dims:
        return None
    if any(src.shards(mesh, d) != dst.shards(mesh, d) for d in range(src.rank)):
        return None
    axes = mesh.order({a for s in (src, dst) for dim in s.dims for a in dim})
    size = local_bytes(shape, itemsize, mesh, src)
    permute = CollectiveKind.COLLECTIVE_PERMUTE
    return [Step(permute, axes, src, dst.with_partial(src.partial, src.partial_op),
                 step_bytes(permute, mesh.group_size(axes), size), group=mesh.group_size(axes))]


def _gather_plan(shape, itemsize, mesh: Mesh, src: Sharding, dst: Sharding) -> list[Step]:
    """The fallback: settle pending sums where they lie, gather whole every dim whose axes are not
    a nesting prefix of the wanted ones, slice. Never more bytes than gathering everything, which
    the greedy planner can exceed when uneven shards stop a move or a scatter from nesting."""
    p = _Planner(shape, itemsize, mesh, src, dst)
    p.all_reduce(list(p.resolve))
    for d, want in enumerate(dst.dims):
        cur = p.cur[d]
        if cur and (tuple(cur) != tuple(want[: len(cur)])
                    or not nests(p.shape[d], p.shards(cur), p.shards(want[len(cur):]))):
            p.gather_whole(d)
    for d, want in enumerate(dst.dims):
        run = list(want[len(p.cur[d]):])
        if run:
            before = p.layout()
            p.cur[d] = p.cur[d] + run
            p.record(OpName.SHARD_SLICE, run, before, mesh.group_size(run), 0, d)
    return p.steps


# ---------------------------------------------------------------------------------- the search

# layouts the search settles at most (~0.2 s) before it gives up: the other plans stand
SEARCH_STATES = 1000
# over sub-axes, a second search where most reshards gain nothing: every pair of [x=4, y=2] and
# [x=2, y=4] on f32[6, 10], f32[8, 8], f32[7, 9] finds its plan within 60 (tests/test_reshard_multi_axis.py)
SUB_STATES = 300
CHEAPEST, LEANEST = (2, 1), (0, 1, 2)  # objectives: indices into (bytes, collectives, comm_cost)
FIX = "all_gather+fix"  # a search edge: all_gather of a minor run that does not nest, then its boundary fix
PREFIX = "fix+all_gather"  # the same gather with the boundaries fixed first, on the fine shards


def _count_layouts(axes, counts, sizes, used=()):
    """Every assignment of distinct `axes` to dims, ordered within each dim, with the product of
    each dim's axes equal to that dim's count in `counts`."""
    if not counts:
        yield ()
        return
    want, rest = counts[0], counts[1:]
    free = [a for a in axes if a not in used]
    for n in range(len(free) + 1):
        for pick in permutations(free, n):
            if prod(sizes[a] for a in pick) == want:
                for tail in _count_layouts(axes, rest, sizes, used + pick):
                    yield (pick, *tail)


@lru_cache(maxsize=4096)
def _relabels(axes, sizes, counts, active, rank) -> tuple:
    """(layout, its axes) of every layout of `rank` dims splitting the `active` dims over distinct
    `axes` with these shard counts: what one permute reaches. Shared by the searches, which ask it
    of the same axes over and over (a search over three axes asks it a thousand times)."""
    out = []
    for picked in _count_layouts(axes, counts, dict(zip(axes, sizes))):
        full = [()] * rank
        for d, dim in zip(active, picked):
            full[d] = dim
        out.append((tuple(full), frozenset(a for dim in picked for a in dim)))
    return tuple(out)


class _Search:
    """The best plan over every step of the table (Dijkstra over layouts), on the dims either layout
    splits and the axes either uses. `objective` orders (bytes, collectives, comm_cost) of a plan:
    CHEAPEST (comm_cost, then collectives) or LEANEST (bytes, then collectives, then comm_cost).
    A state is (dims, pending-sum axes); its steps:
      shard_slice     an axis the target splits, absent here, appended on some dim's minor side
      all_reduce      the pending sums to settle (all of them, or one axis)
      reduce_scatter  one pending-sum axis the target splits, appended on some dim's minor side
      all_gather      a minor run of one dim's axes
      all_to_all      a minor run of dim a's axes, appended on dim b's minor side
      all_gather+fix  a minor run of one dim's axes that does not nest, gathered, then the block
                      boundaries fixed by one permute (boundary_fix; two Steps sharing `block`)
      fix+all_gather  the same, the boundaries fixed first (shift_fix; a Step with `prefix`, one
                      permute per piece, then the all_gather)
      collective_permute  to any layout with the same shard count on every dim (the axes
                      relabelled: {(x, z), y} -> {(y, x), z} is one permute, not a gather)
    Every other step keeps uneven shards nesting (nests)."""

    def __init__(self, shape, itemsize, mesh: Mesh, src: Sharding, dst: Sharding, objective, split=None):
        self.shape, self.itemsize, self.objective = shape, itemsize, objective
        self.sizes = {a: mesh.axis_size(a) for a in mesh.names}
        self.active = [d for d in range(len(shape)) if src.dims[d] or dst.dims[d]]
        self.axes = mesh.order({a for s in (src, dst) for dim in s.dims for a in dim} | set(src.partial))
        self.split = split or {}  # mesh axis -> its sub-axes, major first (_sub_axes)
        self.limit = SUB_STATES if self.split else SEARCH_STATES
        if self.split:
            for subs in self.split.values():
                self.sizes.update((a, sub_axis(a)[2]) for a in subs)
            self.axes = tuple(b for a in self.axes for b in self.split.get(a, (a,)))
            src, dst = (Sharding(tuple(self.expand(d) for d in s.dims), s.partial, frozenset(), s.partial_op)
                        for s in (src, dst))
        self.wanted = {a for dim in dst.dims for a in dim}
        self.op = src.partial_op
        self.resolve = set(src.partial) - set(dst.partial)
        self.start = (src.dims, self.order(src.partial))
        self.target = (dst.dims, self.order(dst.partial))
        self.relabel: dict = {}  # (pending sums, shard counts) -> the layouts a permute reaches
        self.counts: dict = {}  # a run of axes -> its shard count (asked millions of times)

    def order(self, axes) -> tuple[str, ...]:
        return tuple(a for a in self.axes if a in axes)

    def expand(self, axes) -> tuple[str, ...]:
        return tuple(b for a in axes for b in self.split.get(a, (a,)))

    def merge(self, axes) -> tuple[str, ...]:
        """Runs of a mesh axis's sub-axes, all of them in order, written as the axis."""
        out = list(axes)
        for a, subs in self.split.items():
            n = len(subs)
            for i in range(len(out) - n + 1):
                if tuple(out[i:i + n]) == subs:
                    out[i:i + n] = [a]
                    break
        return tuple(out)

    def subs(self, run) -> bool:
        """Does a run name sub-axes (its gathers and all_to_alls run as permutes)?"""
        return any(":" in a for a in self.merge(run))

    def count(self, axes) -> int:
        n = self.counts.get(axes)
        if n is None:
            n = self.counts[axes] = prod(self.sizes[a] for a in axes)
        return n

    def size_of(self, dims) -> int:
        return prod(chunk(n, self.count(dims[d])) for d, n in enumerate(self.shape)) * self.itemsize

    def sharding(self, state) -> Sharding:
        dims, partial = state
        return Sharding(tuple(map(self.merge, dims)), partial, frozenset(), self.op if partial else "sum")

    def edges(self, state):
        """(kind, axes, next state, dim, dim2) of every step from `state`."""
        dims, partial = state
        used = {a for dim in dims for a in dim}

        def put(d, run):
            return tuple(dim + tuple(run) if e == d else dim for e, dim in enumerate(dims))

        def fits(d, run):
            return nests(self.shape[d], self.count(dims[d]), self.count(run))

        for a in self.axes:
            if a in self.wanted and a not in used and a not in partial:
                yield from ((OpName.SHARD_SLICE, (a,), (put(d, (a,)), partial), d, None)
                            for d in self.active if fits(d, (a,)))
        pend = [a for a in partial if a in self.resolve]
        for run in ([pend] if len(pend) == 1 else [pend] + [[a] for a in pend]) if pend else []:
            yield CollectiveKind.ALL_REDUCE, tuple(run), (dims, self.order(set(partial) - set(run))), None, None
        for a in pend if self.op == "sum" else []:
            left = self.order(set(partial) - {a})
            yield from ((CollectiveKind.REDUCE_SCATTER, (a,), (put(d, (a,)), left), d, None)
                        for d in self.active if a in self.wanted and fits(d, (a,)))
        yield from self.moves(dims, partial)
        yield from self.permutes(dims, partial)

    def moves(self, dims, partial):
        """Gathers and all_to_alls of each dim's minor runs."""
        for d in self.active:
            cur = dims[d]
            for n in range(1, len(cur) + 1):
                run, keep = cur[len(cur) - n:], cur[: len(cur) - n]
                left = tuple(keep if e == d else dim for e, dim in enumerate(dims))
                if not nests(self.shape[d], self.count(keep), self.count(run)):
                    fix = boundary_fix(self.shape[d], self.count(keep), self.count(run))
                    if fix and not (self.subs(keep) or self.subs(run)):  # (its emission takes mesh axes)
                        yield FIX, run, (left, partial), d, None
                    if keep and shift_fix(self.shape[d], self.count(keep), self.count(run)):
                        yield PREFIX, run, (left, partial), d, None
                    continue
                yield CollectiveKind.ALL_GATHER, run, (left, partial), d, None
                for b in self.active:
                    if b != d and nests(self.shape[b], self.count(dims[b]), self.count(run)):
                        moved = tuple(dim + run if e == b else dim for e, dim in enumerate(left))
                        yield CollectiveKind.ALL_TO_ALL, run, (moved, partial), b, d

    def permutes(self, dims, partial):
        key = (partial, tuple(self.count(dims[d]) for d in self.active))
        if key not in self.relabel:
            free = tuple(a for a in self.axes if a not in partial)
            self.relabel[key] = _relabels(free, tuple(self.sizes[a] for a in free), key[1], tuple(self.active),
                                          len(dims))
        mine = {a for dim in dims for a in dim}
        for full, theirs in self.relabel[key]:
            if full != dims:
                group = tuple(a for a in self.axes if a in mine or a in theirs)
                yield CollectiveKind.COLLECTIVE_PERMUTE, group, (full, partial), None, None

    @staticmethod
    @lru_cache(maxsize=4096)
    def step(kind, k: int, size: int) -> tuple[float, tuple]:
        """Bytes sent, and (bytes, collectives, comm_cost) of one step."""
        nbytes = step_bytes(kind, k, size)
        col = is_collective(kind)
        return nbytes, (nbytes, int(col), collective_cost(kind, k, nbytes) if col else 0.0)

    def fix(self, left, d: int, m: int) -> tuple[int, int, int]:
        """(block, group of the permute, bytes it sends) of gathering m shards of dim d down to `left`."""
        k = self.count(left[d])
        block, rows = boundary_fix(self.shape[d], k, m)
        row = prod(chunk(n, self.count(left[e])) for e, n in enumerate(self.shape) if e != d) * self.itemsize
        return block, k, rows * row

    def fix_step(self, dims, left, d: int, m: int, size: int) -> tuple[tuple, tuple]:
        """Bytes of (the all_gather, the permute), and (bytes, collectives, comm_cost) of both."""
        _, k, sent = self.fix(left, d, m)
        g_bytes, g = self.step(CollectiveKind.ALL_GATHER, m, size)
        p_bytes, p = self.step(CollectiveKind.COLLECTIVE_PERMUTE, k, sent)
        return (g_bytes, p_bytes), tuple(a + b for a, b in zip(g, p))

    def prefix(self, dims, d: int, m: int) -> tuple[int, tuple, float]:
        """(D, pieces, bytes the permutes send) of fixing dim d's fine shards before gathering m."""
        k = self.count(dims[d]) // m
        shift, pieces = shift_fix(self.shape[d], k, m)
        row = prod(chunk(n, self.count(dims[e])) for e, n in enumerate(self.shape) if e != d) * self.itemsize
        return shift, pieces, sum(stop - start for _, start, stop in pieces) * row

    def prefix_step(self, dims, d: int, m: int, size: int) -> tuple[tuple, tuple]:
        """Bytes of (the permutes, the all_gather), and (bytes, collectives, comm_cost) of all of them
        (each permute one latency step)."""
        _, pieces, sent = self.prefix(dims, d, m)
        g_bytes, g = self.step(CollectiveKind.ALL_GATHER, m, size)
        k = self.count(dims[d])
        lat = collective_cost(CollectiveKind.COLLECTIVE_PERMUTE, k, 0.0)
        return (sent, g_bytes), (g[0] + sent, g[1] + len(pieces), g[2] + sent + lat * len(pieces))

    def run(self) -> list[Step] | None:
        """The plan, or None when the layouts are too many to search."""
        zero = (0.0, 0, 0.0)
        best, back, done = {self.start: zero}, {}, set()
        heap = [(zero, 0, self.start)]
        while heap:
            prio, _, state = heapq.heappop(heap)
            if state in done:
                continue
            if state == self.target:
                return self.path(back)
            done.add(state)
            if len(done) > self.limit:
                return None
            size = self.size_of(state[0])
            for kind, run, nxt, dim, dim2 in self.edges(state):
                if nxt in done:
                    continue
                k = self.count(run)
                if kind == FIX:
                    nbytes, step = self.fix_step(state[0], nxt[0], dim, k, size)
                elif kind == PREFIX:
                    nbytes, step = self.prefix_step(state[0], dim, k, size)
                else:
                    nbytes, step = self.step(kind, k, size)
                    if kind in (CollectiveKind.ALL_GATHER, CollectiveKind.ALL_TO_ALL) and self.subs(run):
                        step = (step[0], k - 1, step[2])  # k - 1 permutes (ir.collectives._by_shifts)
                p = tuple([a + step[i] for a, i in zip(prio, self.objective)])
                if nxt not in best or p < best[nxt]:
                    best[nxt] = p
                    back[nxt] = (state, kind, run, dim, dim2, nbytes, k)
                    heapq.heappush(heap, (p, len(back), nxt))
        return None

    def path(self, back) -> list[Step]:
        steps, state = [], self.target
        while state != self.start:  # layouts and groups written with whole axes where they can be
            prev, kind, run, dim, dim2, nbytes, k = back[state]
            if kind == PREFIX:
                shift, pieces, _ = self.prefix(prev[0], dim, k)
                at = self.sharding(prev)
                coarse = self.merge(prev[0][dim][: len(prev[0][dim]) - len(run)])
                steps.append(Step(CollectiveKind.ALL_GATHER, self.merge(run), at, self.sharding(state), nbytes[1], dim,
                                  group=k))
                steps.append(Step(CollectiveKind.COLLECTIVE_PERMUTE, coarse + self.merge(run), at, at, nbytes[0], dim,
                                  group=self.count(prev[0][dim]), prefix=(shift, len(coarse), pieces)))
                state = prev
                continue
            if kind == FIX:
                block, group, _ = self.fix(state[0], dim, k)
                at = self.sharding(state)
                steps.append(Step(CollectiveKind.COLLECTIVE_PERMUTE, self.merge(state[0][dim]), at, at, nbytes[1], dim,
                                  group=group, block=(block, self.shape[dim])))
                steps.append(Step(CollectiveKind.ALL_GATHER, self.merge(run), self.sharding(prev), at, nbytes[0], dim,
                                  group=k, block=(block, self.shape[dim])))
                state = prev
                continue
            settles = is_collective(kind) and spec(kind).settles
            steps.append(Step(kind, self.merge(run), self.sharding(prev), self.sharding(state), nbytes, dim, dim2,
                              self.op if settles else "sum", k))
            state = prev
        return steps[::-1]


def drop_trivial_axes(s: Sharding, mesh: Mesh) -> Sharding:
    """Axes of size 1 split nothing and sum nothing: layouts that differ only in them are one."""
    if not s.open_dims and (s.partial or s.partial_op == "sum") and all(size > 1 for _, size in mesh.axes):
        return s  # (what the rest builds, equal: no mesh axis is trivial, and sub-axes never are)
    keep = lambda axes: tuple(a for a in axes if mesh.axis_size(a) > 1)  # noqa: E731
    partial = keep(s.partial)
    return Sharding(tuple(keep(d) for d in s.dims), partial, frozenset(), s.partial_op if partial else "sum")


def plan_reshard(shape, itemsize: int, mesh: Mesh, src: Sharding, dst: Sharding) -> tuple[Step, ...]:
    """The cheapest plan from `src` to `dst` (dst.partial must be a subset of src.partial).
    Memoised: the partitioner asks the same questions many times while weighing candidates."""
    # keyed by the axis sizes alone: plans never depend on the device order, and comparing two
    # meshes' device lists on every cache hit would make compile time grow with the mesh
    return _plan_reshard(tuple(shape), itemsize, mesh.axes, src.closed(), dst.closed())


@lru_cache(maxsize=64)
def _sizes_mesh(axes) -> Mesh:
    """One deviceless Mesh per axis sizes, its cached properties (names, shape) worked out once,
    not on every plan."""
    return Mesh(axes, ())


@lru_cache(maxsize=65536)
def _plan_reshard(shape, itemsize: int, axes, src: Sharding, dst: Sharding) -> tuple[Step, ...]:
    mesh = _sizes_mesh(axes)  # the planner reads axis sizes only
    src, dst = drop_trivial_axes(src, mesh), drop_trivial_axes(dst, mesh)
    if not set(dst.partial) <= set(src.partial):
        raise AssertionError(f"cannot create a pending sum: {src} -> {dst}")
    if src.dims == dst.dims and set(src.partial) == set(dst.partial):
        return ()
    first = _merge_moves(_Planner(shape, itemsize, mesh, src, dst).run(), shape, itemsize, mesh)
    if not any(st.is_collective for st in first):
        # slices only: no bytes, no collectives, no latency, which no plan beats (_choose keeps the
        # first of equals) and nothing to search (_improvable: no move)
        return tuple(first)
    if _least_possible(first, shape, itemsize, mesh, src, dst):
        # no plan beats it, and one as good ties and is not first (_choose): the gather and
        # permute plans would only confirm it
        return tuple(first)
    plans = [first, _gather_plan(shape, itemsize, mesh, src, dst)]
    p = _permute_plan(shape, itemsize, mesh, src, dst)
    if p is not None:
        plans.append(p)
    best = _choose(plans)
    if _least_possible(best, shape, itemsize, mesh, src, dst):
        return tuple(best)
    if _improvable(best, dst):
        for objective in (CHEAPEST, LEANEST):
            p = _Search(shape, itemsize, mesh, src, dst, objective).run()
            if p is not None:
                plans.append(_merge_moves(p, shape, itemsize, mesh))
        best = _choose(plans)
    split = _sub_axes(mesh, src, dst) if _improvable(best, dst) else {}
    if split:
        # not where the plan moves once (a gather of what the target drops): a gather over sub-axes
        # of uneven shards may send fewer bytes, but in k - 1 permutes where there was one collective.
        # The fewest bytes are looked for only where the sub-axes cut them at all.
        for objective in (CHEAPEST, LEANEST):
            p = _Search(shape, itemsize, mesh, src, dst, objective, split).run()
            if p is None or plan_cost(p) >= plan_cost(best):
                break
            plans.append(_merge_moves(p, shape, itemsize, mesh))
        best = _choose(plans)
    return tuple(best)


SUB_ATOMS = 4  # at most this many axes and sub-axes searched (the layouts grow factorially with them)


def _sub_axes(mesh: Mesh, src: Sharding, dst: Sharding) -> dict:
    """Each composite mesh axis the layouts use, split into prime sub-axes "x:s:m" (major first),
    XLA's subgroups: [x=4, y=2]'s {_, x} -> {_, y} sends 168 bytes where gathering x sends 216,
    relabelling the split over (x:2:2, x:1:2) to (y, x:2:2) and gathering x:2:2 alone. Empty when
    no axis splits, a pending sum is to be settled, or the atoms would be more than SUB_ATOMS."""
    if src.partial or dst.partial:
        return {}
    used = mesh.order({a for s in (src, dst) for d in s.dims for a in d})
    split, atoms = {}, 0
    for a in used:
        n, factors, p = mesh.axis_size(a), [], 2
        while p * p <= n:  # trial division to sqrt(n): no loop as long as the axis
            while n % p == 0:
                factors.append(p)
                n //= p
            p += 1
        if n > 1:
            factors.append(n)
        atoms += len(factors)
        if len(factors) > 1:
            stride, subs = mesh.axis_size(a), []
            for f in factors:
                stride //= f
                subs.append(f"{a}:{stride}:{f}")
            split[a] = tuple(subs)
    return split if split and atoms <= SUB_ATOMS else {}


def _improvable(steps, dst: Sharding) -> bool:
    """Might the search beat this plan? Not if it moves at most once, on data already sliced:
    settling sums and slicing are what they are, and one all_to_all, permute, or gather of axes
    the target no longer uses is the move."""
    wanted = {a for dim in dst.dims for a in dim}
    moves = [i for i, s in enumerate(steps) if s.kind in (CollectiveKind.ALL_TO_ALL, CollectiveKind.ALL_GATHER,
                                                          CollectiveKind.COLLECTIVE_PERMUTE)]
    if not moves:
        return False
    return (len(moves) > 1 or any(s.kind == OpName.SHARD_SLICE for s in steps[moves[0]:])
            or any(steps[i].kind == CollectiveKind.ALL_GATHER and set(steps[i].axes) & wanted for i in moves))


def _least_possible(steps, shape, itemsize: int, mesh: Mesh, src: Sharding, dst: Sharding) -> bool:
    """Is `steps` a plan no search can beat? Where the target only drops axes (each of its dims a
    prefix of the source's, no pending sum), one all_gather per dim that drops any, each sending
    what the dim grows by: no step shrinks a shard but a slice (which sends nothing and must be
    gathered back), so every plan sends at least the growth of the local shard, and each dim
    dropping axes takes a collective of its own. A plan as good in bytes and collectives gathers
    the same runs, so it ties, and ties keep the plan found first (_choose): the search (up to
    SEARCH_STATES layouts, twice) would only confirm it. A reshard to fewer axes is most of them."""
    if src.partial or dst.partial or any(t != f[:len(t)] for t, f in zip(dst.dims, src.dims)):
        return False
    dropped = sum(t != f for t, f in zip(dst.dims, src.dims))

    def local(s: Sharding) -> int:
        return prod(chunk(n, mesh.group_size(axes)) for n, axes in zip(shape, s.dims)) * itemsize

    return (len(steps) == dropped and all(st.kind == CollectiveKind.ALL_GATHER and not st.block
                                          and not st.prefix for st in steps)
            and plan_cost(steps) == local(dst) - local(src))


def _choose(plans):
    """The cheapest plan in the cost model (then the fewest collectives) among those no other plan
    beats on both bytes and collectives: at a few bytes per device the latency tie-break alone
    would pick two all_to_alls over k=2 (2 latency steps) and a permute where one all_to_all over
    k=4 (3 steps) and the permute send fewer bytes in fewer collectives."""
    def measure(steps):
        return round(plan_cost(steps), 6), sum(map(_collectives, steps))

    ms = [measure(p) for p in plans]
    front = [p for p, m in zip(plans, ms) if not any(o[0] <= m[0] and o[1] <= m[1] and o != m for o in ms)]
    return min(front, key=lambda steps: (comm_cost(steps), sum(map(_collectives, steps))))


def _collectives(st: Step) -> int:
    """The collectives a step runs: a gather or all_to_all over sub-axes runs as k - 1 permutes."""
    if st.kind in (CollectiveKind.ALL_GATHER, CollectiveKind.ALL_TO_ALL) and any(":" in a for a in st.axes):
        return st.group - 1
    return int(st.is_collective)


def _moves_of(st: Step) -> tuple:
    return st.moves or ((st.dim, st.dim2, st.axes),)


def _exact(st: Step, shape, mesh: Mesh) -> bool:
    """An all_to_all that needs no padding or trimming (every moved dim divides evenly)."""
    before, after = st.before.local_shape(shape, mesh), st.after.local_shape(shape, mesh)
    into, out = [1] * len(shape), [1] * len(shape)
    for j, d, a in _moves_of(st):
        into[j] *= mesh.group_size(a)
        out[d] *= mesh.group_size(a)
    return all(before[j] == into[j] * after[j] and after[d] == out[d] * before[d] for j, d, _ in _moves_of(st))


def _merge_moves(steps, shape, itemsize: int, mesh: Mesh) -> list[Step]:
    """Consecutive all_to_alls over disjoint axes, leaving distinct dims that none of them joins,
    run as ONE all_to_all over all their axes (XLA's MultipleSourceTargetDimsInOneAllToAll; two
    joining one dim split it in turn, {x, y, _} -> {_, _, (x, y)}), which sends
    (k1 k2 - 1)/(k1 k2) of the array instead of (k1 - 1)/k1 + (k2 - 1)/k2 of it."""
    out: list[Step] = []
    for st in steps:
        prev = out[-1] if out else None
        if (prev is not None and prev.kind == st.kind == CollectiveKind.ALL_TO_ALL and not set(prev.axes) & set(st.axes)
                and not any(":" in a for a in prev.axes + st.axes)
                and _exact(prev, shape, mesh) and _exact(st, shape, mesh)):
            moves = _moves_of(prev) + _moves_of(st)
            joins, leaves = {j for j, _, _ in moves}, [d for _, d, _ in moves]
            if len(leaves) == len(set(leaves)) and not joins & set(leaves):  # several may join one dim
                k = prev.group * st.group
                size = local_bytes(shape, itemsize, mesh, prev.before)
                out[-1] = Step(CollectiveKind.ALL_TO_ALL, prev.axes + st.axes, prev.before, st.after,
                               step_bytes(CollectiveKind.ALL_TO_ALL, k, size), None, None, "sum", k, moves)
                continue
        out.append(st)
    return out


def plan_cost(steps) -> float:
    return sum(s.bytes for s in steps)
