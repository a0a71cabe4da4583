"""Windows along a split dim: halo exchange, shifts and rotations with collective_permute.

One primitive serves conv, pad, slice, roll and concat. Shard i of the output needs the input
elements at global positions  g(t) = i*a + s + t,  t in [0, L),  on dim d, where the input is
split over axes A (k shards of c elements). Relative to shard i's own first element that window
starts at i*(a - c) + s; over all shards it stays within [lo, hi + L). So:
  1. every shard cuts from its own chunk the slice its neighbour q shards back needs (the same
     static slice on every device) and one collective_permute shifts it by q; the local part
     needs nothing. Only those slices travel, never whole shards unless the window needs them;
  2. the parts concatenate into the window [lo, hi + L) of every shard;
  3. positions outside [0, n) (global edges, and the padding of uneven shards) become `fill`
     (nothing to do for even shards and a zero fill: what no device sends arrives as zeros);
  4. where a != c the window slides per shard: a dynamic_slice at (i*(a - c) + s - lo).
With `wrap` (a rotation of an evenly split dim) shifts wrap around and nothing is masked.
An input that is not split on d is windowed locally (pad, then dynamic_slice): no communication.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Protocol

from ..ir.collectives import CollectiveKind
from ..ir.core import Value
from ..ir.mesh import Mesh


@dataclass(frozen=True)
class Window:
    a: int  # output shard i starts at input position i*a + s
    s: int
    length: int  # L: input elements each output shard needs
    fill: object = 0  # value of positions outside [0, n)
    wrap: bool = False


def _floor_div(x: int, y: int) -> int:
    return x // y


def _needed(w: Window, c: int, k: int, n: int) -> tuple[int, int] | None:
    """The hull [Lo, Hi) (relative to each shard's first element) of what shards really need:
    each shard's window clipped to [0, n) -- positions outside are `fill`, nothing to fetch.

    Shard i needs [a_i, b_i) with a_i = max(i*delta + s, -i*c), b_i = min(i*delta + s + L,
    n - i*c): a is convex and b concave in i, and the shards with a_i < b_i form an interval
    bounded where two of those lines cross, so the extremes lie at the ends 0 and k-1 or next to
    a crossing. Evaluating those few points keeps this O(1) in the number of devices."""
    return _hull(w.a, w.s, w.length, c, k, n)


@lru_cache(maxsize=4096)
def _hull(step: int, s: int, length: int, c: int, k: int, n: int) -> tuple[int, int] | None:
    """_needed of a window (its a, s, length), once per question (the partitioner weighs the
    same windows for every candidate layout of every conv and pool)."""
    delta = step - c
    lines = [(delta, s), (-c, 0), (delta, s + length), (-c, n)]  # slope, intercept in i
    cands = {0, k - 1}
    for x, (m1, b1) in enumerate(lines):
        for m2, b2 in lines[x + 1:]:
            if m1 != m2:
                t = (b2 - b1) / (m1 - m2)
                for i in (int(t) - 1, int(t), int(t) + 1):
                    if 0 <= i < k:
                        cands.add(i)
    lo = hi = None
    for i in cands:
        a = max(i * delta + s, -i * c)
        b = min(i * delta + s + length, n - i * c)
        if a < b:
            lo = a if lo is None else min(lo, a)
            hi = b if hi is None else max(hi, b)
    return None if lo is None else (lo, hi)


def parts(w: Window, c: int, k: int, n: int | None = None):
    """(lo, hi, [(q, start, stop)]): the span [lo, hi + L) of every shard's window relative to its
    first element, and the slice [start, stop) of shard i+q's chunk each shard receives. With the
    global size n (no wrap), only what some shard really needs inside [0, n) is fetched."""
    delta = w.a - c
    lo = w.s + min(0, (k - 1) * delta)
    hi = w.s + max(0, (k - 1) * delta)
    fetch_lo, fetch_hi = lo, hi + w.length
    if n is not None and not w.wrap:
        need = _needed(w, c, k, n)
        if need is None:
            return lo, hi, []
        fetch_lo, fetch_hi = max(fetch_lo, need[0]), min(fetch_hi, need[1])
    out = []
    for q in range(_floor_div(fetch_lo, c), _floor_div(fetch_hi - 1, c) + 1):
        start, stop = max(0, fetch_lo - q * c), min(c, fetch_hi - q * c)
        if stop > start:
            out.append((q, start, stop))
    return lo, hi, out


def _sent(q: int, k: int, wrap: bool) -> bool:
    """Does the part from shard i+q travel? (No-wrap shifts of a whole group or more reach nobody.)"""
    return q % k != 0 if wrap else 0 < abs(q) < k


def window_directions(w: Window, c: int, k: int, row_bytes: int, n: int | None = None) -> list[tuple[int, int]]:
    """[(bytes, permutes)] of the parts that travel, per direction (from the shards before, from
    the shards after): the two directions of an exchange run at the same time."""
    if k == 1:
        return []
    _, _, ps = parts(w, c, k, n)
    out = []
    for side in (-1, 1):
        sent = [(stop - start) * row_bytes for q, start, stop in ps
                if _sent(q, k, w.wrap) and (q > 0) == (side > 0)]
        if sent:
            out.append((sum(sent), len(sent)))
    return out


class Emitter(Protocol):
    """What windows emit through: partition.spmd.OpContext (see its methods)."""

    @property
    def mesh(self) -> Mesh: ...

    def emit(self, kind: str, *operands: Value, name: str | None = None, **attrs) -> Value: ...

    def collective(self, kind: CollectiveKind, x: Value, reason: str, **attrs) -> Value: ...

    def axis_index(self, axes) -> Value: ...

    def affine_index(self, axes, scale: int, shift: int = 0) -> Value: ...

    def slice_dim(self, x: Value, dim: int, start: int, stop: int) -> Value: ...

    def pad_dim(self, x: Value, dim: int, lo: int, hi: int, value=None) -> Value: ...

    def fill_dim(self, x: Value, dim: int, size: int, value) -> Value: ...


def _zero(fill) -> bool:
    """Whether `fill` is what a collective_permute's receiver without a sender gets: +0 (or False)."""
    return isinstance(fill, (bool, int, float)) and fill == 0 and str(fill) != "-0.0"


def window(p: Emitter, x: Value, dim: int, in_axes, out_axes, n: int, w: Window, reason: str,
           first: bool = True) -> Value:
    """The window of local `x` on `dim` (global size n) for the output shard this device holds.
    The input is split over `in_axes`, which are either the output's `out_axes` or none. `first`:
    `x` is not a window of another dim already (see the mask of a joined window below)."""
    in_axes, out_axes = tuple(in_axes), tuple(out_axes)
    if w.length == 0:  # an empty window (a slice or concat operand of no rows): nothing travels
        return p.slice_dim(x, dim, 0, 0)
    if not in_axes:
        return _local_window(p, x, dim, out_axes, n, w)
    assert in_axes == out_axes, (in_axes, out_axes)
    axes = in_axes
    k = p.mesh.group_size(axes)
    c = x.type.shape[dim]
    lo, hi, ps = parts(w, c, k, n)
    pieces = []
    covered = ps[0][0] * c + ps[0][1] if ps else hi + w.length
    if covered > lo:  # nobody needs real data this far back: fill
        pieces.append(p.fill_dim(x, dim, covered - lo, w.fill))
    for q, start, stop in ps:
        piece = p.slice_dim(x, dim, start, stop)
        if _sent(q, k, w.wrap):
            piece = p.collective(CollectiveKind.COLLECTIVE_PERMUTE, piece, reason, axes=axes,
                                 sizes=tuple(p.mesh.axis_size(a) for a in axes),
                                 rule=("shift", -q % k if w.wrap else -q, w.wrap))
        elif q != 0 and not w.wrap:  # beyond the last shard: all outside [0, n), masked below
            piece = p.fill_dim(x, dim, stop - start, w.fill)
        pieces.append(piece)
    end = ps[-1][0] * c + ps[-1][2] if ps else hi + w.length
    if end < hi + w.length:  # nobody needs real data this far on: fill
        pieces.append(p.fill_dim(x, dim, hi + w.length - end, w.fill))
    joined = len(pieces) > 1
    win = p.emit("concat", *pieces, axis=dim) if joined else pieces[0]
    idx = p.axis_index(axes)
    outside = not w.wrap and (lo < 0 or k * c > n or hi + w.length > c)
    if outside and ((joined and first) or not (k * c == n and _zero(w.fill))):
        # Even shards and a zero fill need no mask for its values: every position outside [0, n)
        # came from a shard beyond the ends, which no device sends (collective_permute's receivers
        # without a sender get zeros), or is a fill block already. A joined window is masked all
        # the same, for XLA's CPU compiler: a fusion whose root is a concatenate compiles as one
        # vectorised loop nest per operand, far more LLVM work than the same concatenate under a
        # select (one loop; XLA's own halos have that form), at a compare per element. Only the
        # first dim's window: the next dim's window slices it and joins it again, and masking
        # that join too makes XLA fuse more code into fewer kernels than it saves (conv.spmd's
        # optimised LLVM IR: 5,631 lines unmasked, 5,227 with the first joins masked, 6,106
        # with every join masked).
        win = p.emit("range_mask", win, idx, dim=dim, chunk=c, offset=lo, lo=0, hi=n, value=w.fill)
    if w.a != c:
        start = p.affine_index(axes, w.a - c, w.s - lo)
        win = p.emit("dynamic_slice_in_dim", win, start, dim=dim, size=w.length)
    elif win.type.shape[dim] != w.length:
        win = p.slice_dim(win, dim, w.s - lo, w.s - lo + w.length)
    return win


def _local_window(p: Emitter, x: Value, dim: int, out_axes, n: int, w: Window) -> Value:
    """Unsplit input: pad by the window on both sides (with the fill), then slice this shard's part.
    A wrapping window rotates the whole input locally first, then needs no padding."""
    k = p.mesh.group_size(out_axes) if out_axes else 1
    if w.wrap:
        shift = (-w.s) % n
        if shift:
            x = p.emit("roll", x, shift=shift, axis=dim)
        w = Window(a=w.a, s=0, length=w.length, fill=0, wrap=False)
    lead = max(0, -w.s)
    trail = max(0, (k - 1) * w.a + w.s + w.length - n)
    xp = p.pad_dim(x, dim, lead, trail, w.fill)
    if k == 1:
        return p.slice_dim(xp, dim, w.s + lead, w.s + lead + w.length)
    start = p.affine_index(out_axes, w.a, w.s + lead)
    return p.emit("dynamic_slice_in_dim", xp, start, dim=dim, size=w.length)
