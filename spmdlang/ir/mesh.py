"""The device mesh and the Sharding of a tensor over it.

A Sharding lists, per tensor dim, the mesh axes splitting it (major first); axes it does not name
replicate the tensor. `partial` axes mark a value whose shards still owe a sum over those axes.
`open_dims` only appears on `shard()` constraints: dims that propagation may still refine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from math import prod


@dataclass(frozen=True)
class Mesh:
    """Named axes (major to minor) and the device id of each mesh position (row-major)."""

    axes: tuple[tuple[str, int], ...]
    devices: tuple[int, ...]

    def __post_init__(self):
        # hashed once: the device list has an entry per device, and meshes key the partitioner's
        # caches, so rehashing it on every lookup would make compile time grow with the mesh
        object.__setattr__(self, "_hash", hash((self.axes, self.devices)))

    def __hash__(self) -> int:
        return self._hash

    @staticmethod
    def make(axes: dict[str, int], devices=None) -> Mesh:
        n = prod(axes.values())
        return Mesh(tuple(axes.items()), tuple(devices) if devices is not None else tuple(range(n)))

    @cached_property
    def names(self) -> tuple[str, ...]:
        return tuple(a for a, _ in self.axes)

    @cached_property
    def shape(self) -> dict[str, int]:
        return dict(self.axes)

    @property
    def size(self) -> int:
        return prod(s for _, s in self.axes)

    def axis_size(self, axis: str) -> int:
        size = self.shape.get(axis)
        return sub_axis(axis)[2] if size is None else size

    def group_size(self, axes) -> int:
        n = 1
        for a in axes:
            n *= self.axis_size(a)
        return n

    def order(self, axes) -> tuple[str, ...]:
        """Axes sorted in mesh order (major first)."""
        s = set(axes)
        return tuple(a for a in self.names if a in s)

    def coords(self, position: int) -> dict[str, int]:
        """Mesh coordinates of a row-major mesh position (used by the simulator and tests only)."""
        out = {}
        for name, size in reversed(self.axes):
            out[name] = position % size
            position //= size
        return dict(reversed(list(out.items())))

    def group_index(self, position: int, axes) -> int:
        """A mesh position's index in its group over `axes`: its linear coordinate over them, first
        axis major, as jax.lax.axis_index(axes) counts (simulator and tests only)."""
        c = self.coords(position)
        idx = 0
        for a in axes:
            if a in c:
                idx = idx * self.axis_size(a) + c[a]
            else:
                parent, stride, size = sub_axis(a)
                idx = idx * size + c[parent] // stride % size
        return idx

    def __str__(self) -> str:
        return "[" + ", ".join(f"{a}={s}" for a, s in self.axes) + "]"


def sub_axis(name: str) -> tuple[str, int, int]:
    """A sub-axis "x:s:m" (the reshard planner's, never a program's) is (parent x, stride s, size m):
    the devices' digit (x // s) % m, as XLA splits a mesh axis of 4 into 2x2 to move only what must
    move. Only plans and permute rules name sub-axes; every collective runs over whole mesh axes."""
    parent, stride, size = name.split(":")
    return parent, int(stride), int(size)


def axes_text(axes, empty: str = "_", name=str) -> str:
    """One dim of a spec: `_` (or `empty`) unsplit, `a`, or `(a, b)` major first; every printer of
    specs (IR text, source specs in messages, the emitted PartitionSpecs) goes through it."""
    if not axes:
        return empty
    if len(axes) == 1:
        return name(axes[0])
    return "(" + ", ".join(map(name, axes)) + ")"


@dataclass(frozen=True)
class Sharding:
    """Per dim the splitting mesh axes; pending-sum axes; open dims (constraints only)."""

    dims: tuple[tuple[str, ...], ...]
    partial: tuple[str, ...] = ()
    open_dims: frozenset[int] = field(default_factory=frozenset)
    partial_op: str = "sum"  # what the pending reduction over `partial` is: sum, max, min or prod

    def __hash__(self) -> int:
        # hashed once (shardings key the partitioner's memos and the reshard planner's cache)
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.dims, self.partial, self.open_dims, self.partial_op))
            object.__setattr__(self, "_hash", h)
        return h

    def __getstate__(self):
        # a string's hash differs between processes: a pickled sharding hashes afresh
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    @staticmethod
    def replicated(rank: int) -> Sharding:
        return Sharding(((),) * rank)

    @property
    def rank(self) -> int:
        return len(self.dims)

    def used_axes(self) -> tuple[str, ...]:
        return tuple(a for d in self.dims for a in d)

    def shards(self, mesh: Mesh, dim: int) -> int:
        return mesh.group_size(self.dims[dim])

    def local_shape(self, shape, mesh: Mesh) -> tuple[int, ...]:
        """Static per-partition shape: a dim of n split k ways holds ceil(n/k)."""
        return local_shape(shape, self.dims, mesh)

    def with_partial(self, partial, op: str = "sum") -> Sharding:
        return Sharding(self.dims, tuple(partial), self.open_dims, op if partial else "sum")

    def closed(self) -> Sharding:
        if not self.open_dims:  # immutable: a sharding without open dims is its own closed form
            return self
        return Sharding(self.dims, self.partial, frozenset(), self.partial_op)

    def __str__(self) -> str:
        text = "{" + ", ".join("?" if i in self.open_dims and not d else axes_text(d)
                               for i, d in enumerate(self.dims)) + "}"
        if self.partial:
            op = "" if self.partial_op == "sum" else "_" + self.partial_op
            text += f" partial{op}(" + ", ".join(self.partial) + ")"
        return text

    def __repr__(self) -> str:  # what a user sees at the prompt: the spec, as written in programs
        return f"Sharding {self}"


def local_shape(shape, dims, mesh: Mesh) -> tuple[int, ...]:
    """Sharding.local_shape of a layout's per-dim axes `dims` (all it reads of the layout)."""
    sizes = mesh.shape
    out = []
    for i, n in enumerate(shape):
        k = 1
        for a in dims[i]:
            k *= sizes[a] if a in sizes else mesh.axis_size(a)  # a reshard plan's sub-axis
        out.append(-(-n // k))
    return tuple(out)
