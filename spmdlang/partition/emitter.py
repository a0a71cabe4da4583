"""The partitioner's local state and its reshard emitter.

`LocalState` is what the partitioner knows of each global value: its local value and layout as
partitioned so far, the layout planned for it (propagation's, or a custom step's: an overlay, so
partitioning never writes into the propagation it reads), its producer and its number of uses.

`Emitter` appends to the one per-partition program (or to the loop body being partitioned: a
`Scope`), and is the only place collectives come from: a reshard of a global value to a wanted
layout (partition.reshard plans it, the collective table emits each step), or one collective for
a custom step; each is written to the one `Ledger` with the global op and line that caused it.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

from ..errors import Span
from ..ir.builder import Builder
from ..ir.collectives import CollectiveKind, spec, step_bytes
from ..ir.core import Op, Program, Value, all_ops
from ..ir.mesh import Sharding, sub_axis
from ..ir.names import OpName
from ..ir.types import TensorType, itemsize
from .halo import Window, window
from .ledger import Collective, Ledger
from .reshard import Step, drop_trivial_axes, plan_reshard


class LocalState:
    """Each global value's (local value, layout) as partitioned so far, and its planned layout."""

    def __init__(self, prog: Program, shardings):
        self.prog, self.mesh = prog, prog.mesh
        self.shardings = shardings  # propagation's: read, never written
        self.planned: dict[Value, Sharding] = {}  # layouts custom steps plan for their intermediates
        self.state: dict[Value, tuple[Value, Sharding]] = {}
        self.produced: dict[Value, Sharding] = {}  # each global value's layout as computed
        self.producer: dict[Value, Op] = {r: op for op in all_ops(prog.ops) for r in op.results}
        self.users: dict[Value, int] = {}
        for op in all_ops(prog.ops):
            for v in op.operands:
                self.users[v] = self.users.get(v, 0) + 1
            for region in op.regions:  # the back edge uses the next carries
                for v in region.results:
                    self.users[v] = self.users.get(v, 0) + 1
        for r in prog.results:
            self.users[r.value] = self.users.get(r.value, 0) + 1
        self.trivial = any(size == 1 for _, size in self.mesh.axes)
        self._nontrivial: dict[Sharding, Sharding] = {}  # drop_trivial_axes, once per layout
        self._user_ops: dict[Value, list[Op]] | None = None

    def target(self, v: Value) -> Sharding:
        """The planned layout of v, without mesh axes of size 1 (they split nothing; keeping them
        would make custom steps emit collectives over groups of one)."""
        s = self.planned[v] if v in self.planned else self.shardings[v]
        if not self.trivial:
            return s
        t = self._nontrivial.get(s)
        if t is None:
            t = self._nontrivial[s] = drop_trivial_axes(s, self.mesh)
        return t

    def wanted(self, v: Value) -> Sharding:
        """The planned layout of v as a consumer wants it: no pending sum."""
        return self.target(v).closed().with_partial(())

    def layout(self, v: Value) -> Sharding:
        return self.state[v][1]

    def user_ops(self, v: Value) -> list[Op]:
        """The global ops that use v, in program order."""
        if self._user_ops is None:
            self._user_ops = {}
            for op in all_ops(self.prog.ops):
                for u in dict.fromkeys(op.operands):
                    self._user_ops.setdefault(u, []).append(op)
        return self._user_ops.get(v, [])

    def local_type(self, t: TensorType, s: Sharding) -> TensorType:
        return t.with_shape(s.local_shape(t.shape, self.mesh))


@dataclass
class Scope:
    """Where ops are emitted: the per-partition program, or a loop body being partitioned."""

    builder: Builder
    trips: int = 1  # iterations of the loops around it
    indices: dict[tuple[str, ...], Value] = field(default_factory=dict)  # axes -> axis_index value
    memo: dict = field(default_factory=dict)  # work custom steps share across ops (OpContext.memo)


@dataclass
class Frame:
    """A loop being partitioned: its capture params (global) -> the values they capture, the scope
    around it, and the reshards hoisted out of it so far."""

    outer: dict[Value, Value]
    around: Scope
    extra: list[tuple[Value, Value]] = field(default_factory=list)  # (value outside, its body param)
    hoisted: dict = field(default_factory=dict)


def zero(dtype: str):
    return False if dtype == "bool" else 0.0 if dtype in ("f32", "bf16", "f16", "f64") else 0


class LocalOps:
    """Local helpers on one dim, for anything with `emit`, `axis_index` and `mesh` (the emitter,
    and the OpContext custom steps get)."""

    def constant(self, value, dtype: str) -> Value:
        """A scalar constant."""
        return self.emit(OpName.FULL, dtype=dtype, shape=(), value=value)

    def slice_dim(self, x: Value, dim: int, start: int, stop: int) -> Value:
        """x restricted to [start, stop) on dim (nothing emitted for the whole dim)."""
        if start == 0 and stop == x.type.shape[dim]:
            return x
        starts = [0] * x.type.rank
        stops = list(x.type.shape)
        starts[dim], stops[dim] = start, stop
        return self.emit("slice", x, starts=tuple(starts), stops=tuple(stops), steps=(1,) * x.type.rank)

    def pad_dim(self, x: Value, dim: int, lo: int, hi: int, value=None) -> Value:
        """x with lo and hi elements of `value` (default zero) added on dim."""
        if not lo and not hi:
            return x
        los, his = [0] * x.type.rank, [0] * x.type.rank
        los[dim], his[dim] = lo, hi
        return self.emit("pad", x, lo=tuple(los), hi=tuple(his), value=zero(x.type.dtype) if value is None else value)

    def fill_dim(self, x: Value, dim: int, size: int, value) -> Value:
        """A constant block shaped like x except for `size` elements on `dim`."""
        shape = list(x.type.shape)
        shape[dim] = size
        return self.emit(OpName.FULL, dtype=x.type.dtype, shape=tuple(shape), value=value)

    def pad_to(self, x: Value, dim: int, n: int) -> Value:
        return self.pad_dim(x, dim, 0, max(0, n - x.type.shape[dim]))

    def trim(self, x: Value, dim: int, n: int) -> Value:
        return self.slice_dim(x, dim, 0, n)

    def mask(self, x: Value, dim: int, axes, n: int, value) -> Value:
        """Fill the padding of dim `dim` (split over `axes`, global size n) with `value`."""
        c = x.type.shape[dim]
        if not axes or c * self.mesh.group_size(axes) == n:
            return x
        return self.emit("range_mask", x, self.axis_index(axes), dim=dim, chunk=c, offset=0, lo=0, hi=n, value=value)

    def affine_index(self, axes, scale: int, shift: int = 0) -> Value:
        """axis_index(axes) * scale + shift, as an i32 scalar."""
        x = self.axis_index(axes)
        if scale != 1:
            x = self.emit("mul", x, self.constant(scale, "i32"))
        if shift:
            x = self.emit(OpName.ADD, x, self.constant(shift, "i32"))
        return x

    def offset(self, axes, c: int) -> Value:
        """The global index of this partition's first element along a dim split over `axes` in
        chunks of c."""
        return self.affine_index(axes, c)


class Emitter(LocalOps):
    """Emission into the per-partition program, resharding, and the ledger."""

    def __init__(self, local: LocalState, ledger: Ledger):
        self.local, self.mesh, self.ledger = local, local.mesh, ledger
        self.scope = Scope(Builder())
        self.frames: list[Frame] = []  # the loops being partitioned, innermost last
        self.cache: dict[tuple[Value, Sharding], Value] = {}  # (global value, layout) -> local value
        self.span: Span | None = None
        self.current: Op | None = None  # the global op being partitioned (None: the results)

    # ------------------------------------------------------------------ emission

    def emit(self, kind: str, *operands: Value, name: str | None = None, **attrs) -> Value:
        """Append a single-result op, with the source span of the op being partitioned."""
        return self.scope.builder.emit(kind, *operands, span=self.span, name=name, **attrs)

    def emit_multi(self, kind: str, *operands: Value, **attrs) -> tuple[Value, ...]:
        """Append an op with several results (top_k's values and indices)."""
        return self.scope.builder.emit_op(kind, operands, attrs, self.span)

    @property
    def last_op(self) -> Op:
        return self.scope.builder.ops[-1]

    def axis_index(self, axes) -> Value:
        """This partition's linear index over `axes` (first axis major), an i32 scalar."""
        axes = tuple(axes)
        if axes not in self.scope.indices:
            if all(a in self.mesh.shape for a in axes):
                self.scope.indices[axes] = self.scope.builder.emit("axis_index", span=None, axes=axes)
            else:  # sub-axes (partition.reshard): digits of their mesh axes' indices
                idx = None
                for a in axes:
                    if a in self.mesh.shape:
                        digit = self.axis_index((a,))
                    else:
                        parent, stride, size = sub_axis(a)
                        digit = self.axis_index((parent,))
                        if stride > 1:
                            digit = self.emit("div", digit, self.constant(stride, "i32"))
                        if stride * size < self.mesh.axis_size(parent):
                            digit = self.emit("mod", digit, self.constant(size, "i32"))
                    if idx is not None:
                        idx = self.emit(OpName.ADD, self.emit("mul", idx, self.constant(self.mesh.axis_size(a), "i32")),
                                        digit)
                    else:
                        idx = digit
                self.scope.indices[axes] = idx
        return self.scope.indices[axes]

    @contextmanager
    def outside(self, frame: Frame):
        """Emit into the scope around the loop of `frame` (the innermost one) for a while."""
        inner, top = self.scope, self.frames.pop()
        self.scope = frame.around
        try:
            yield
        finally:
            self.scope = inner
            self.frames.append(top)

    # ------------------------------------------------------------------ collectives and the ledger

    def collective(self, kind: CollectiveKind, x: Value, reason: str, **attrs) -> Value:
        """Emit one collective for a custom partitioning step and log it in the ledger."""
        kind = CollectiveKind(kind)
        axes = tuple(attrs["axes"])
        k = self.mesh.group_size(axes)
        size = x.type.nbytes
        if "group" in spec(kind).attrs:
            attrs.setdefault("group", k)
        out = self.emit(kind, x, **attrs)
        self.log(kind, axes, step_bytes(kind, k, size), attrs.get("reduce", "sum"), reason, self.last_op)
        return out

    def boundary_fix(self, x: Value, dim: int, axes, n: int, c: int) -> tuple[Value, list[Op]]:
        """Blocks of x.shape[dim] elements on `dim` (split over `axes`, global size n) to chunks of
        c: partition.halo.window's exchange, its permutes emitted but not logged (the reshard step
        they make up is logged by apply_steps). Returns (value, the permutes)."""
        quiet = _Unlogged(self)
        return window(quiet, x, dim, axes, axes, n, Window(c, 0, c), ""), quiet.ops

    def log(self, kind, axes, nbytes, reduce, reason, local_op, backward=False):
        """`backward`: the collective moves a value of the backward pass (a gradient settled for
        its update counts as backward even though the update is a forward op)."""
        runs = spec(kind).actual(local_op.attrs)
        if runs != kind:  # jax has no product all-reduce: it runs as an all_gather and a local product
            kind = runs
            nbytes = step_bytes(runs, self.mesh.group_size(axes), local_op.operands[0].type.nbytes)
        op = self.current
        span = op.span if op is not None else self.span  # (no op: a result's settlement, at its return)
        line = span.line if span else None
        self.ledger.add(Collective(kind, tuple(axes), float(nbytes), line, op.kind if op else "return",
                                   reason, local_op, reduce,
                                   backward=bool(backward or op is not None and op.backward),
                                   trip_count=self.scope.trips),
                        op if not self.frames else None)

    def describe(self, v: Value) -> str:
        """A global value as a reader of `explain` knows it: its source name, else the op making it."""
        if v.name:
            return f"%{v.name}"
        op = self.local.producer.get(v)
        if op is None:
            return str(v.type)
        line = f" at line {op.span.line}" if op.span else ""
        return f"the {op.kind} result{line} ({v.type})"

    # ------------------------------------------------------------------ resharding

    def reshard(self, v: Value, want: Sharding, why: str = "") -> Value:
        """The local value of global `v` laid out as `want`; collectives are logged in the ledger."""
        local, cur = self.local.state[v]
        want = want.closed()
        if cur.dims == want.dims and set(cur.partial) == set(want.partial):
            return local
        key = (v, want)
        if key in self.cache:
            return self.cache[key]
        if self.frames and v in self.frames[-1].outer:
            return self.hoisted(v, want, why)
        made = self.local.producer.get(v)
        if made is not None and made.kind == OpName.FULL and not want.partial:  # a constant: made again, not moved
            out = self.emit(OpName.FULL, dtype=v.type.dtype, shape=tuple(want.local_shape(v.type.shape, self.mesh)),
                            value=made.attrs["value"])
            self.cache[key] = out
            return out
        steps = plan_reshard(v.type.shape, itemsize(v.type.dtype), self.mesh, cur, want)
        # reuse the longest prefix of the plan already done for another use of v
        start = 0
        for i, st in enumerate(steps):
            if st.block and st.kind == CollectiveKind.ALL_GATHER or st.prefix:  # not st.after's layout yet
                continue
            hit = self.cache.get((v, st.after.closed()))
            if hit is not None and hit.type.shape == st.after.local_shape(v.type.shape, self.mesh):
                local, start = hit, i + 1
        out = self.apply_steps(local, v, steps[start:], why)
        self.cache[key] = out
        return out

    def hoisted(self, v: Value, want: Sharding, why: str) -> Value:
        """A loop-invariant value (a capture of the loop being partitioned) resharded once before
        the loop, not on every iteration: the resharded value comes in as one more capture."""
        frame = self.frames[-1]
        key = (v, want)
        if key not in frame.hoisted:
            with self.outside(frame):
                hoist = " (loop-invariant: hoisted out of the loop)"
                local = self.reshard(frame.outer[v], want, why if why.endswith(hoist) else why + hoist)
            inner = Value(local.type, v.name)
            frame.extra.append((local, inner))
            frame.hoisted[key] = inner
        return frame.hoisted[key]

    def apply_steps(self, x: Value, v: Value, steps: list[Step], why: str) -> Value:
        """Emit a reshard plan's steps (the collective table emits each collective)."""
        shape = v.type.shape
        for st in steps:
            after = st.after.local_shape(shape, self.mesh)
            k = self.mesh.group_size(st.axes)
            if not st.is_collective:
                x = self.emit(OpName.SHARD_SLICE, x, self.axis_index(st.axes), dim=st.dim, size=after[st.dim],
                              group=k)
                self.cache[(v, st.after.closed())] = x
                continue
            x, col = spec(st.kind).emit(self, x, st, k, after)
            if st.block and st.kind == CollectiveKind.ALL_GATHER:  # blocks of st.block[0]: the fix comes next
                after = tuple(st.block[0] if d == st.dim else n for d, n in enumerate(after))
            assert x.type.shape == after, (st, x.type, after)
            if not (st.block and st.kind == CollectiveKind.ALL_GATHER or st.prefix):
                self.cache[(v, st.after.closed())] = x
            made = self.local.producer.get(v)
            for c in col if isinstance(col, tuple) else (col,):  # a shift fix: one permute per piece
                # what the emitted collective really sends (padding included), not the plan's estimate
                # (a collective over sub-axes runs as permutes: partition.reshard)
                kind = CollectiveKind(c.kind)
                sent = step_bytes(kind, k, sum(v.type.nbytes for v in c.operands))
                self.log(kind, st.axes, sent, st.reduce,
                         f"{self.describe(v)} {st.before} -> {st.after}"
                         + (" (block boundaries)" if st.block or st.prefix else "") + (f" {why}" if why else ""), c,
                         backward=made is not None and made.backward)
        return x

    def enter_pending(self, v: Value, s: Sharding) -> Value:
        """The initial value of a carry that is a pending sum over s.partial: held by the first
        device of each group over those axes, zeros elsewhere (a zero constant already is one)."""
        producer = self.local.producer.get(v)
        if producer is not None and producer.kind == OpName.FULL and producer.attrs["value"] == 0:
            return self.reshard(v, s.with_partial(()), "into the loop")
        return self.pending(v, s, "into the loop")

    def pending(self, v: Value, s: Sharding, why: str) -> Value:
        """`v` in layout `s`, whose pending sum may be over axes that v's is not: the sum v keeps
        over axes s keeps stays pending; over the others the value is held by the first device of
        each group and zeros elsewhere, whose sum it is. No communication beyond settling what s
        does not keep. (A loop's carry kept as a pending sum whose body settled the new value.)"""
        keep = tuple(a for a in s.partial if a in self.local.layout(v).partial)
        missing = tuple(a for a in s.partial if a not in keep)
        x = self.reshard(v, s.with_partial(keep), why)
        if not missing:
            return x
        first = self.emit("eq", self.axis_index(missing), self.constant(0, "i32"))
        return self.emit("select", first, x, self.constant(zero(x.type.dtype), x.type.dtype))


class _Unlogged:
    """An emitter as partition.halo.window sees it, except that its collectives are emitted and
    collected, not logged."""

    def __init__(self, e: Emitter):
        self._e, self.ops = e, []

    def __getattr__(self, name):
        return getattr(self._e, name)

    def collective(self, kind, x: Value, reason: str, **attrs) -> Value:
        out = self._e.emit(kind, x, **attrs)
        self.ops.append(self._e.last_op)
        return out
