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
axes doing the same thing share one collective (one all_reduce over both contracting axes).
Reduce-scatters and slices come first (they shrink the data), then all_reduces of what cannot be
scattered, then moves and gathers. Uneven splits nest only when m * ceil(n/(k*m)) == ceil(n/k)
(or the coarse layout is whole); where they do not, the dim is gathered whole and sliced afresh.
Where both layouts have the same shard count on every dim, one collective_permute is an option;
so is the fallback "settle sums in place, gather whole what does not nest, slice", which bounds
every plan by the bytes of gathering everything. The cheapest plan wins in the cost model (partition.cost: bytes plus
the latency steps of each collective), then fewer steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from math import prod

from ..ir.collectives import CollectiveKind, is_collective, spec
from ..ir.mesh import Mesh, Sharding
from ..ir.names import OpName
from .cost import comm_cost, step_bytes

__all__ = ["Step", "chunk", "comm_cost", "drop_trivial_axes", "nests", "plan_cost", "plan_reshard", "step_bytes"]


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

    @property
    def is_collective(self) -> bool:
        return is_collective(self.kind)


def chunk(n: int, k: int) -> int:
    return -(-n // k)


def nests(n: int, k_coarse: int, m: int) -> bool:
    """Does the k_coarse*m-way layout of a dim of n sit inside the k_coarse-way one, shard by shard?"""
    return k_coarse == 1 or m * chunk(n, k_coarse * m) == chunk(n, k_coarse)


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
        for _ in range(4 * (len(self.cur) + 1) * (len(self.mesh.names) + 1)):
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


def drop_trivial_axes(s: Sharding, mesh: Mesh) -> Sharding:
    """Axes of size 1 split nothing and sum nothing: layouts that differ only in them are one."""
    keep = lambda axes: tuple(a for a in axes if mesh.axis_size(a) > 1)  # noqa: E731
    partial = keep(s.partial)
    return Sharding(tuple(keep(d) for d in s.dims), partial, frozenset(), s.partial_op if partial else "sum")


def plan_reshard(shape, itemsize: int, mesh: Mesh, src: Sharding, dst: Sharding) -> tuple[Step, ...]:
    """The cheapest plan from `src` to `dst` (dst.partial must be a subset of src.partial).
    Memoised: the partitioner asks the same questions many times while weighing candidates."""
    # keyed by the axis sizes alone: plans never depend on the device order, and comparing two
    # meshes' device lists on every cache hit would make compile time grow with the mesh
    return _plan_reshard(tuple(shape), itemsize, mesh.axes, src.closed(), dst.closed())


@lru_cache(maxsize=65536)
def _plan_reshard(shape, itemsize: int, axes, src: Sharding, dst: Sharding) -> tuple[Step, ...]:
    mesh = Mesh(axes, ())  # the planner reads axis sizes only
    src, dst = drop_trivial_axes(src, mesh), drop_trivial_axes(dst, mesh)
    if not set(dst.partial) <= set(src.partial):
        raise AssertionError(f"cannot create a pending sum: {src} -> {dst}")
    if src.dims == dst.dims and set(src.partial) == set(dst.partial):
        return ()
    plans = [_merge_moves(_Planner(shape, itemsize, mesh, src, dst).run(), shape, itemsize, mesh),
             _gather_plan(shape, itemsize, mesh, src, dst)]
    p = _permute_plan(shape, itemsize, mesh, src, dst)
    if p is not None:
        plans.append(p)
    return tuple(min(plans, key=lambda steps: (comm_cost(steps), sum(s.is_collective for s in steps))))


def _moves_of(st: Step) -> tuple:
    return st.moves or ((st.dim, st.dim2, st.axes),)


def _exact(st: Step, shape, mesh: Mesh) -> bool:
    """An all_to_all that needs no padding or trimming (every moved dim divides evenly)."""
    before, after = st.before.local_shape(shape, mesh), st.after.local_shape(shape, mesh)
    return all(before[j] == mesh.group_size(a) * after[j] and after[d] == mesh.group_size(a) * before[d]
               for j, d, a in _moves_of(st))


def _merge_moves(steps, shape, itemsize: int, mesh: Mesh) -> list[Step]:
    """Consecutive all_to_alls over disjoint axes and disjoint dims commute: run them as ONE
    all_to_all over all their axes (XLA's MultipleSourceTargetDimsInOneAllToAll), which sends
    (k1 k2 - 1)/(k1 k2) of the array instead of (k1 - 1)/k1 + (k2 - 1)/k2 of it."""
    out: list[Step] = []
    for st in steps:
        prev = out[-1] if out else None
        if (prev is not None and prev.kind == st.kind == CollectiveKind.ALL_TO_ALL and not set(prev.axes) & set(st.axes)
                and _exact(prev, shape, mesh) and _exact(st, shape, mesh)):
            moves = _moves_of(prev) + _moves_of(st)
            dims = [x for j, d, _ in moves for x in (j, d)]
            if len(dims) == len(set(dims)):
                k = prev.group * st.group
                size = local_bytes(shape, itemsize, mesh, prev.before)
                out[-1] = Step(CollectiveKind.ALL_TO_ALL, prev.axes + st.axes, prev.before, st.after,
                               step_bytes(CollectiveKind.ALL_TO_ALL, k, size), None, None, "sum", k, moves)
                continue
        out.append(st)
    return out


def plan_cost(steps) -> float:
    return sum(s.bytes for s in steps)
