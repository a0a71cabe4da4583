"""The SPMD partitioner: global program + shardings -> ONE per-partition program with collectives.

Every op is partitioned by its factor rule (generic) or by its op-table `partition` step (ops
whose dims do not line up). Generic partitioning of an op:
  1. choose how each factor is split while the op runs: candidates come from the operands'
     current layouts and the result's propagated target; the choice minimises bytes resharded
     (operands in, result out), then local work (except where a pending sum can join a combined
     reduction: `partition` below, and partition.cost's "Combined reductions");
  2. reshard each operand to the layout that choice implies (partition.reshard), masking the
     padding of unevenly split reduction factors with the reduction's identity;
  3. run the op on local shapes; reduction factors split over axes leave the result `partial`
     over them (a pending sum/max/...), which the consumer settles: with a reduce_scatter where it
     wants the axis on a dim, else an all_reduce, or not at all when it is linear in that operand.
Nothing here loops over devices: the program is one for all, parameterised by axis_index.
"""

from __future__ import annotations

import itertools
from contextlib import contextmanager
from dataclasses import dataclass, field

from ..errors import Span
from ..ir import registry
from ..ir.builder import Builder
from ..ir.core import LOOP, Loop, Op, Param, Program, Region, Result, Value, all_ops, make_loop
from ..ir.mesh import Mesh, Sharding
from ..ir.types import TensorType, is_float, itemsize
from .cost import FLOPS_PER_BYTE, PLANNING, comm_cost, step_bytes, step_cost
from .factors import PERMUTATION, REDUCTION, REPLICATE, FactorRule, project, unproject
from .propagate import Propagation, op_rule
from .reshard import Step, drop_trivial_axes, plan_reshard

_MAX_CANDIDATES = 512


@dataclass
class Collective:
    """One entry of the communication ledger."""

    kind: str
    axes: tuple[str, ...]
    bytes_per_device: float
    line: int | None
    op: str  # the global op whose partitioning needed it
    reason: str
    local_op: Op | None = None
    reduce: str = "sum"
    trip_count: int = 1  # runs once per iteration of the loops around it: this many times in all
    backward: bool | None = False  # needed by the backward pass (differentiation); None: both passes


@dataclass
class SpmdProgram:
    program: Program  # the per-partition program
    in_shardings: tuple[Sharding, ...]
    out_shardings: tuple[Sharding, ...]
    ledger: list[Collective] = field(default_factory=list)
    notes: dict[Op, str] = field(default_factory=dict)
    global_program: Program | None = None
    produced: dict[Value, Sharding] = field(default_factory=dict)  # each global value as computed


class Partitioner:
    def __init__(self, prog: Program, prop: Propagation):
        self.prog = prog
        self.prop = prop
        self.mesh: Mesh = prog.mesh
        self.b = Builder()
        self.state: dict[Value, tuple[Value, Sharding]] = {}
        self.cache: dict[tuple[Value, Sharding], Value] = {}
        self.indices: dict[tuple[str, ...], Value] = {}
        self.ledger: list[Collective] = []
        self.notes: dict[Op, str] = {}
        self.users: dict[Value, int] = {}
        for op in all_ops(prog.ops):
            for v in op.operands:
                self.users[v] = self.users.get(v, 0) + 1
            for region in op.regions:  # the back edge uses the next carries
                for v in region.results:
                    self.users[v] = self.users.get(v, 0) + 1
        for r in prog.results:
            self.users[r.value] = self.users.get(r.value, 0) + 1
        self.span: Span | None = None
        self.current: Op | None = None
        self.produced: dict[Value, Sharding] = {}
        self.producer: dict[Value, Op] = {r: op for op in all_ops(prog.ops) for r in op.results}
        self.trips = 1  # iterations of the loops around the op being partitioned
        self.frames: list[_Frame] = []  # the loops being partitioned, innermost last
        self.trivial = any(size == 1 for _, size in self.mesh.axes)
        self.user_ops: dict[Value, list[Op]] | None = None
        self.memo: dict = {}
        self.passing: set[Value] = set()  # intermediates of custom steps whose pending sums flow on
        self.settle: set[Op] = set()  # (second plan) ops whose pending sum is settled in a combined reduction
        self.settle_wanted: list[tuple[Op, tuple]] = []  # ops that would rather settle: (op, combining key)
        self.logged_at: list[Op | None] = []  # the global op of each ledger entry

    # ------------------------------------------------------------------ emission helpers

    def emit(self, kind: str, *operands: Value, name: str | None = None, **attrs) -> Value:
        return self.b.emit(kind, *operands, span=self.span, name=name, **attrs)

    def axis_index(self, axes) -> Value:
        axes = tuple(axes)
        if axes not in self.indices:
            self.indices[axes] = self.b.emit("axis_index", span=None, axes=axes)
        return self.indices[axes]

    def target(self, v: Value) -> Sharding:
        """The planned layout of v, without mesh axes of size 1 (they split nothing; keeping them
        would make custom steps emit collectives over groups of one)."""
        s = self.prop.shardings[v]
        return drop_trivial_axes(s, self.mesh) if self.trivial else s

    def local_type(self, t: TensorType, s: Sharding) -> TensorType:
        return t.with_shape(s.local_shape(t.shape, self.mesh))

    # ------------------------------------------------------------------ resharding

    def reshard(self, v: Value, want: Sharding, why: str = "") -> Value:
        """The local value of global `v` laid out as `want`; collectives are logged in the ledger."""
        local, cur = self.state[v]
        want = want.closed()
        if cur.dims == want.dims and set(cur.partial) == set(want.partial):
            return local
        key = (v, want)
        if key in self.cache:
            return self.cache[key]
        if self.frames and v in self.frames[-1].outer:
            return self.hoisted(v, want, why)
        made = self.producer.get(v)
        if made is not None and made.kind == "full" and not want.partial:  # a constant: made again, not moved
            out = self.emit("full", dtype=v.type.dtype, shape=tuple(want.local_shape(v.type.shape, self.mesh)),
                            value=made.attrs["value"])
            self.cache[key] = out
            return out
        steps = plan_reshard(v.type.shape, itemsize(v.type.dtype), self.mesh, cur, want)
        # reuse the longest prefix of the plan already done for another use of v
        start = 0
        for i, st in enumerate(steps):
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

    @contextmanager
    def outside(self, frame: _Frame):
        """Emit into the program around the loop of `frame` (the innermost one) for a while."""
        inner = (self.b, self.indices, self.memo, self.trips, self.frames.pop())
        self.b, self.indices, self.memo, self.trips = frame.saved
        try:
            yield
        finally:
            frame.saved = (self.b, self.indices, self.memo, self.trips)
            self.b, self.indices, self.memo, self.trips, top = inner
            self.frames.append(top)

    def partition_loop(self, op: Op) -> None:
        """The body is partitioned once. Each carry has one layout (its propagated sharding in the
        body): the initial value is resharded to it on entry, the next value before the back edge
        (once per iteration). Captures come in as they are laid out outside; a reshard of one is
        hoisted out of the loop (see `hoisted`).

        An accumulation `acc = acc + t` whose t arrives as a pending sum is not settled on every
        iteration: the carry itself becomes pending over t's axes and is settled once, where the
        loop's result is used. Which carries qualify is only known once the body is partitioned
        (the axes t is pending over), so a first attempt finds them, and the body is partitioned
        again with those carries pending: twice at most, whatever the trip count."""
        loop = Loop(op)
        accums = _accumulations(loop, self.users)
        self.passing.update(self._accumulated_terms(loop, accums))
        snapshot = (len(self.b.ops), len(self.ledger), dict(self.cache), dict(self.indices), dict(self.memo))
        pending = self._partition_loop(op, loop, accums, {})
        if pending:
            n_ops, n_ledger, cache, indices, memo = snapshot
            del self.b.ops[n_ops:], self.ledger[n_ledger:]
            self.cache, self.indices, self.memo = cache, indices, memo
            self._partition_loop(op, loop, {}, pending)

    def _accumulated_terms(self, loop: Loop, accums: dict) -> set[Value]:
        """The added terms of the loop's accumulations, and the values they are linear in (through
        ops that keep a pending sum on: reshape, add, ...), each with this one use: their pending
        sums may flow on into the carry, which is settled once after the loop, so keeping one is
        not charged as a settlement on every iteration (a weight gradient's einsum stays local)."""
        producer = {r: bop for bop in loop.body.ops for r in bop.results}
        out: set[Value] = set()
        todo = [term for _, term in accums.values()]
        while todo:
            v = todo.pop()
            if v in out or self.users.get(v, 0) != 1 or not is_float(v.type.dtype):
                continue
            out.add(v)
            bop = producer.get(v)
            if bop is not None and not bop.regions and registry.get(bop.kind).partial_mode(bop.attrs) == "additive":
                todo.extend(bop.operands)
        return out

    def _partition_loop(self, op: Op, loop: Loop, accums: dict, pending: dict) -> dict:
        """One attempt; carries in `pending` (carry index -> axes) are carried as pending sums.
        Returns the accumulations it found whose added term was pending (carry index -> axes)."""
        carry_s = [self.target(p).closed().with_partial(()) for p in loop.carries]
        for k, axes in pending.items():
            carry_s[k] = Sharding(carry_s[k].dims, axes, frozenset(), "sum")
        inits = [self.enter_pending(v, s) if s.partial else self.reshard(v, s, "into the loop")
                 for v, s in zip(loop.inits, carry_s)]
        caps = [self.state[v] for v in loop.captures]
        index = Value(loop.index.type, loop.index.name)
        carry_params = [Value(x.type, p.name) for x, p in zip(inits, loop.carries)]
        cap_params = [Value(local.type, p.name) for (local, _), p in zip(caps, loop.capture_params)]
        self.state[loop.index] = (index, Sharding.replicated(0))
        for p, lp, s in zip(loop.carries, carry_params, carry_s):
            self.state[p] = (lp, s)
        for p, lp, (_, s) in zip(loop.capture_params, cap_params, caps):
            self.state[p] = (lp, s)
        frame = _Frame(dict(zip(loop.capture_params, loop.captures)),
                       (self.b, self.indices, self.memo, self.trips))
        self.frames.append(frame)
        self.b, self.indices, self.memo, self.trips = Builder(), {}, {}, self.trips * loop.trips
        found = {}
        try:
            for bop in loop.body.ops:
                self.current, self.span = bop, bop.span
                if bop in accums:
                    k, term = accums[bop]
                    got = self.state[term][1]
                    split = {a for d in carry_s[k].dims for a in d}
                    if got.partial and got.partial_op == "sum" and not split & set(got.partial):
                        found[k] = got.partial
                self.partition_op(bop)
            self.current, self.span = op, op.span
            nexts = [self.reshard(r, s, "before the back edge") for r, s in zip(loop.body.results, carry_s)]
            body_ops = self.b.ops
        finally:
            self.frames.pop()
            self.b, self.indices, self.memo, self.trips = frame.saved
        if found:
            return found
        extra_out = [o for o, _ in frame.extra]
        extra_in = [i for _, i in frame.extra]
        body = Region((index, *carry_params, *cap_params, *extra_in), tuple(body_ops), tuple(nexts))
        results = [Value(x.type, r.name) for x, r in zip(inits, op.results)]
        self.b.ops.append(make_loop(loop.start, loop.stop, inits, [lo for lo, _ in caps] + extra_out, body,
                                    results, op.span, op.backward))
        for r, lr, s in zip(op.results, results, carry_s):
            self.state[r] = (lr, s)
        return {}

    def enter_pending(self, v: Value, s: Sharding) -> Value:
        """The initial value of a carry that is a pending sum over s.partial: held by the first
        device of each group over those axes, zeros elsewhere (a zero constant already is one)."""
        x = self.reshard(v, s.with_partial(()), "into the loop")
        producer = self.producer.get(v)
        if producer is not None and producer.kind == "full" and producer.attrs["value"] == 0:
            return x
        first = self.emit("eq", self.axis_index(s.partial), self.emit("full", dtype="i32", shape=(), value=0))
        zero = self.emit("full", dtype=x.type.dtype, shape=(), value=_zero(x.type.dtype))
        return self.emit("select", first, x, zero)

    def apply_steps(self, x: Value, v: Value, steps: list[Step], why: str) -> Value:
        shape = v.type.shape
        for st in steps:
            after = st.after.local_shape(shape, self.mesh)
            k = self.mesh.group_size(st.axes)
            if st.kind == "shard_slice":
                x = self.emit("shard_slice", x, self.axis_index(st.axes), dim=st.dim, size=after[st.dim], group=k)
                self.cache[(v, st.after.closed())] = x
                continue
            if st.kind == "all_gather":
                x = self.emit("all_gather", x, axes=st.axes, dim=st.dim, group=k)
                col = self.b.ops[-1]
                x = self.trim(x, st.dim, after[st.dim])
            elif st.kind == "all_reduce":
                x = self.emit("all_reduce", x, axes=st.axes, reduce=st.reduce)
                col = self.b.ops[-1]
            elif st.kind == "reduce_scatter":
                x = self.pad_to(x, st.dim, k * after[st.dim])
                x = self.emit("reduce_scatter", x, axes=st.axes, dim=st.dim, group=k)
                col = self.b.ops[-1]
            elif st.kind == "all_to_all" and st.moves:
                x, col = self.all_to_all_dims(x, st.moves, st.axes, k)
            elif st.kind == "all_to_all":
                x = self.pad_to(x, st.dim, k * after[st.dim])
                x = self.emit("all_to_all", x, axes=st.axes, split_dim=st.dim, concat_dim=st.dim2, group=k)
                col = self.b.ops[-1]
                x = self.trim(x, st.dim2, after[st.dim2])
            elif st.kind == "collective_permute":
                rule = ("relayout", st.axes, st.before.dims, st.after.dims)
                x = self.emit("collective_permute", x, axes=st.axes,
                              sizes=tuple(self.mesh.axis_size(a) for a in st.axes), rule=rule)
                col = self.b.ops[-1]
            else:  # pragma: no cover
                raise AssertionError(st.kind)
            assert x.type.shape == after, (st, x.type, after)
            self.cache[(v, st.after.closed())] = x
            # what the emitted collective really sends (padding included), not the plan's estimate
            sent = step_bytes(st.kind, k, sum(v.type.nbytes for v in col.operands))
            made = self.producer.get(v)
            self.log(st.kind, st.axes, sent, st.reduce,
                     f"{self.describe(v)} {st.before} -> {st.after}" + (f" {why}" if why else ""), col,
                     backward=made is not None and made.backward)
        return x

    def all_to_all_dims(self, x: Value, moves, axes, k: int):
        """One all_to_all moving several splits at once, each (split dim j, concat dim d, its
        axes): split every j into (k_i, rest), bring the k_i to the front as one dim of k (group
        index order: the moves' axes in turn, major first), exchange along it, then put each k_i
        back on the major side of its d. Returns (result, the collective op)."""
        shape = x.type.shape
        ks = [self.mesh.group_size(a) for _, _, a in moves]
        split = {j: i for i, (j, _, _) in enumerate(moves)}
        concat = {d: i for i, (_, d, _) in enumerate(moves)}
        expanded, pos = [], {}
        for t, n in enumerate(shape):
            if t in split:
                pos[("k", split[t])] = len(expanded)
                expanded.append(ks[split[t]])
                n //= ks[split[t]]
            pos[t] = len(expanded)
            expanded.append(n)
        front = [pos[("k", i)] for i in range(len(moves))]
        rest = [i for i in range(len(expanded)) if i not in front]
        y = self.emit("reshape", x, shape=tuple(expanded))
        y = self.emit("transpose", y, perm=tuple(front + rest))
        rest_shape = [expanded[i] for i in rest]
        y = self.emit("reshape", y, shape=(k, *rest_shape))
        y = self.emit("all_to_all", y, axes=tuple(axes), split_dim=0, concat_dim=0, group=k)
        col = self.b.ops[-1]
        y = self.emit("reshape", y, shape=(*ks, *rest_shape))
        # dims now: the k_i (0..m-1), then the original dims in order (split ones shrunk)
        m = len(moves)
        perm, final = [], []
        for t in range(len(shape)):
            if t in concat:
                perm.append(concat[t])
            perm.append(m + t)
            n = rest_shape[t] * (ks[concat[t]] if t in concat else 1)
            final.append(n)
        y = self.emit("transpose", y, perm=tuple(perm))
        return self.emit("reshape", y, shape=tuple(final)), col

    def describe(self, v: Value) -> str:
        """A global value as a reader of `explain` knows it: its source name, else the op making it."""
        if v.name:
            return f"%{v.name}"
        op = self.producer.get(v)
        if op is None:
            return str(v.type)
        line = f" at line {op.span.line}" if op.span else ""
        return f"the {op.kind} result{line} ({v.type})"

    def log(self, kind, axes, nbytes, reduce, reason, local_op, backward=False):
        """`backward`: the collective moves a value of the backward pass (a gradient settled for
        its update counts as backward even though the update is a forward op)."""
        if kind == "all_reduce" and reduce == "prod":
            # jax has no product all-reduce: it runs as an all_gather and a local product
            kind = "all_gather"
            nbytes = step_bytes("all_gather", self.mesh.group_size(axes), local_op.operands[0].type.nbytes)
        op = self.current
        line = op.span.line if op is not None and op.span else None
        self.ledger.append(Collective(kind, tuple(axes), float(nbytes), line, op.kind if op else "return",
                                      reason, local_op, reduce,
                                      backward=bool(backward or op is not None and op.backward),
                                      trip_count=self.trips))
        self.logged_at.append(op if not self.frames else None)
        self.notes[local_op] = reason

    def collective(self, kind: str, x: Value, reason: str, **attrs) -> Value:
        """Emit one collective for a custom partitioning step and log it in the ledger."""
        axes = tuple(attrs["axes"])
        k = self.mesh.group_size(axes)
        size = x.type.nbytes
        if kind in ("all_gather", "reduce_scatter", "all_to_all"):
            attrs.setdefault("group", k)
        out = self.emit(kind, x, **attrs)
        self.log(kind, axes, step_bytes(kind, k, size), attrs.get("reduce", "sum"), reason, self.b.ops[-1])
        return out

    # ---- local helpers on one dim (custom steps reach them through OpContext)

    def slice_dim(self, x: Value, dim: int, start: int, stop: int) -> Value:
        if start == 0 and stop == x.type.shape[dim]:
            return x
        starts = [0] * x.type.rank
        stops = list(x.type.shape)
        starts[dim], stops[dim] = start, stop
        return self.emit("slice", x, starts=tuple(starts), stops=tuple(stops), steps=(1,) * x.type.rank)

    def pad_dim(self, x: Value, dim: int, lo: int, hi: int, value=None) -> Value:
        if not lo and not hi:
            return x
        los, his = [0] * x.type.rank, [0] * x.type.rank
        los[dim], his[dim] = lo, hi
        return self.emit("pad", x, lo=tuple(los), hi=tuple(his), value=_zero(x.type.dtype) if value is None else value)

    def fill_dim(self, x: Value, dim: int, size: int, value) -> Value:
        """A constant block shaped like x except for `size` elements on `dim`."""
        shape = list(x.type.shape)
        shape[dim] = size
        return self.emit("full", dtype=x.type.dtype, shape=tuple(shape), value=value)

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
            x = self.emit("mul", x, self.emit("full", dtype="i32", shape=(), value=scale))
        if shift:
            x = self.emit("add", x, self.emit("full", dtype="i32", shape=(), value=shift))
        return x

    def offset(self, axes, c: int) -> Value:
        """The global index of this partition's first element along a dim split over `axes`."""
        return self.affine_index(axes, c)

    # ------------------------------------------------------------------ the pass

    def run(self) -> SpmdProgram:
        params = []
        for p in self.prog.params:
            s = self.target(p.value)
            local = Value(self.local_type(p.value.type, s), p.name)
            params.append(Param(local, p.name, s, p.span))
            self.state[p.value] = (local, s)
        for op in self.prog.ops:
            self.current, self.span = op, op.span
            self.b.backward = op.backward
            self.partition_op(op)
        results, outs = [], []
        for r in self.prog.results:
            self.current, self.span = None, r.span
            self.b.backward = False
            s = self.target(r.value).closed().with_partial(())
            local = self.reshard(r.value, s, "for the result")
            results.append(Result(local, s, r.span))
            outs.append(s)
        local_prog = Program(self.prog.name, self.mesh, tuple(params), tuple(self.b.ops), tuple(results),
                             (), self.prog.source, local=True)
        for p in self.prog.params:
            self.produced[p.value] = self.target(p.value)
        return SpmdProgram(local_prog, tuple(p.sharding for p in params), tuple(outs), self.ledger, self.notes,
                           self.prog, self.produced)

    def partition_op(self, op: Op) -> None:
        if op.kind == LOOP:
            self.partition_loop(op)
            for r in op.results:
                local, s = self.state[r]
                self.produced[r] = s
                if s.partial and self.users.get(r, 0) > 1:  # an accumulated sum, settled once
                    want = self.target(r).closed().with_partial(())
                    self.state[r] = (self.reshard(r, want, "once after the loop, for its several uses"), want)
            return
        opdef = registry.get(op.kind)
        if opdef.constraint:
            out = self.target(op.result).closed().with_partial(())
            local = self.reshard(op.operands[0], out, "for shard()")
            self.state[op.result] = (local, out)
        elif opdef.partition is not None:
            opdef.partition(OpContext(self, op))
        else:
            self.generic(op)
        # a pending sum with several consumers is settled once, to the planned layout
        for r in op.results:
            local, s = self.state[r]
            self.produced[r] = s
            if s.partial and self.users.get(r, 0) > 1:
                want = self.target(r).closed().with_partial(())
                self.state[r] = (self.reshard(r, want, "once for its several uses"), want)

    def joinable(self) -> set[Op]:
        """The ops that would rather settle their pending sum in a combined reduction
        (settle_wanted) and have one to join: another reduction with the same combining key,
        logged by this plan or wanted by another such op, that neither depends on them nor they on
        it (ancestry in the global program; loops count as one op)."""
        if not self.settle_wanted:
            return set()
        index = {op: i for i, op in enumerate(self.prog.ops)}
        producer = {r: op for op in self.prog.ops for r in op.results}
        anc: dict[Op, int] = {}
        for op in self.prog.ops:
            bits = 0
            for v in op.operands:  # a loop's captures are operands too
                if v in producer:
                    bits |= anc[producer[v]] | (1 << index[producer[v]])
            anc[op] = bits
        present = [(op, key) for op, key in self.settle_wanted if op in index]
        for c, g in zip(self.ledger, self.logged_at):
            if g in index and c.trip_count == 1 and c.local_op is not None and c.kind in ("all_reduce",
                                                                                       "reduce_scatter"):
                x = c.local_op
                extra = x.attrs["group"] if c.kind == "reduce_scatter" else x.attrs["reduce"]
                present.append((g, (c.kind, tuple(x.attrs["axes"]), extra, x.operands[0].type.dtype)))
        # descendants too, and per key the reductions present as one bitset: an op can join one of
        # them that is neither its ancestor nor its descendant (bit operations, not a scan of pairs)
        desc: dict[Op, int] = {op: 0 for op in self.prog.ops}
        for op in reversed(self.prog.ops):
            below = desc[op] | (1 << index[op])
            for v in op.operands:
                if v in producer:
                    desc[producer[v]] |= below
        by_key: dict = {}
        for g, k2 in present:
            by_key[k2] = by_key.get(k2, 0) | (1 << index[g])
        out = set()
        for op, key in self.settle_wanted:
            if op not in index:
                continue
            if by_key.get(key, 0) & ~(anc[op] | desc[op] | (1 << index[op])):
                out.add(op)
        return out

    # ------------------------------------------------------------------ generic factor partitioning

    def generic(self, op: Op, forbid: frozenset[int] = frozenset()) -> None:
        rule = op_rule(op)
        choice = self.choose(op, rule, forbid)
        self.execute(op, rule, *choice)

    def _factor_candidates(self, op, rule: FactorRule, forbid) -> list[list[tuple[str, ...]]]:
        opdef = registry.get(op.kind)
        tensors = list(op.operands) + list(op.results)
        layouts = [self.state[v][1].dims for v in op.operands] + [self.target(r).dims for r in op.results]
        fas = [project(rule.tensors[i], layouts[i], rule.sizes, self.mesh, t.type.shape)
               for i, t in enumerate(tensors)]
        out = []
        for f, kind in enumerate(rule.kinds):
            cands = [()]
            splittable = (kind not in (REPLICATE, PERMUTATION) and f not in forbid
                          and (kind != REDUCTION or opdef.reduce_kind is not None))
            if splittable:
                for fa in fas:
                    if fa.get(f) and fa[f] not in cands:
                        cands.append(fa[f])
            out.append(cands)
        return out

    def choose(self, op: Op, rule: FactorRule, forbid):
        if self.frames or op is not self.current or len(op.results) != 1:
            return self._best(op, rule, forbid)[1:4]
        best, settling = self._best(op, rule, forbid, settling=True)
        if settling is not None and settling is not best:
            if op in self.settle:  # the second plan of the step: settle here, in a combined reduction
                return settling[1:4]
            if _whole_step(settling) < _whole_step(best):
                self.settle_wanted.append((op, _settle_key(settling[4][1], op.result.type.dtype)))
        return best[1:4]

    def trial(self, op: Op, target: Sharding, layouts: dict[Value, Sharding],
              passing: bool = False) -> tuple[float, Sharding]:
        """What-if for custom steps choosing between decompositions: (cost in the planner's unit,
        result layout) of partitioning `op` generically with its result planned as `target`, where
        operands not computed yet have the layouts in `layouts`; a `passing` result may keep a
        pending sum for the next step to take on. Emits nothing."""
        if passing:
            self.passing.add(op.results[0])
        added = [v for v in layouts if v not in self.state]
        for v in added:
            self.state[v] = (None, layouts[v])
        r = op.results[0]
        old = self.prop.shardings.get(r)
        self.prop.shardings[r] = target
        try:
            (cost, _), _, _, outs, _ = self._best(op, op_rule(op), frozenset())
        finally:
            for v in added:
                del self.state[v]
            if old is None:
                del self.prop.shardings[r]
            else:
                self.prop.shardings[r] = old
        return cost, outs[0]

    def step(self, op: Op, target: Sharding | None = None, passing: bool = False) -> None:
        """Partition `op`, one step of a custom decomposition (not an op of the global program),
        generically; its result planned as `target` (None: as propagation planned it), keeping a
        pending sum for the next step where `passing`."""
        if passing:
            self.passing.add(op.results[0])
        if target is not None:
            self.prop.shardings[op.results[0]] = target
        self.generic(op)

    def _best(self, op: Op, rule: FactorRule, forbid, settling: bool = False):
        """The cheapest plan ((cost, work), fa, reqs, outs, (steps, settlement)); with `settling`,
        also the plan cheapest on the whole step (partition.cost: STEP_BYTES per latency step)
        among those whose result is a pending sum settled by one combinable reduction (None if
        none is)."""
        cands = self._factor_candidates(op, rule, forbid)
        total = 1
        for c in cands:
            total *= len(c)
        if total > _MAX_CANDIDATES:  # keep the two most promising per factor (longest splits)
            cands = [sorted(c, key=len, reverse=True)[:2] + ([()] if () not in c[:2] else []) for c in cands]
        opdef = registry.get(op.kind)
        mode = opdef.partial_mode(op.attrs)
        partials = [self.state[v][1] for v in op.operands]
        keep_options = [False]
        if mode is not None and any(s.partial for s in partials):
            keep_options.append(True)
        best = settle = None
        for combo in itertools.product(*cands):
            used = [a for axes in combo for a in axes]
            if len(used) != len(set(used)):
                continue
            fa = {f: axes for f, axes in enumerate(combo) if axes}
            if not _valid(rule, fa, self.mesh):
                continue
            for keep in keep_options:
                plan = self._plan(op, rule, fa, keep, mode, partials)
                if plan is None:
                    continue
                if best is None or plan[0] < best[0]:
                    best = plan
                if settling and plan[4][1] is not None and (settle is None or _whole_step(plan) < _whole_step(settle)):
                    settle = plan
        assert best is not None, f"no way to partition {op.kind}"
        return (best, settle) if settling else best

    def _plan(self, op, rule, fa, keep, mode, partials):
        """Cost and layouts of running `op` with factor split `fa`; None if not allowed."""
        opdef = registry.get(op.kind)
        kept: tuple[str, ...] = ()
        if keep:
            holders = [i for i, s in enumerate(partials) if s.partial]
            allowed = opdef.partial_operands
            first = partials[holders[0]]
            if first.partial_op != "sum":
                return None
            if mode == "additive":
                if len(holders) != len(partials) or any(set(partials[i].partial) != set(first.partial)
                                                        for i in holders):
                    return None
            elif mode == "multilinear":
                if len(holders) != 1 or (allowed is not None and holders[0] not in allowed):
                    return None
            kept = first.partial
            if any(a in kept for axes in fa.values() for a in axes):
                return None
        reduced = tuple(a for f, axes in sorted(fa.items()) if rule.kinds[f] == REDUCTION for a in axes)
        red_op = opdef.reduce_kind or "sum"
        if kept and reduced and red_op != "sum":
            return None
        reqs = []
        steps: list[Step] = []
        for i, v in enumerate(op.operands):
            dims = unproject(rule.operands[i], fa, rule.sizes, self.mesh)
            req = Sharding(dims, kept if (keep and partials[i].partial) else (), frozenset(), "sum")
            reqs.append(req)
            steps += plan_reshard(v.type.shape, itemsize(v.type.dtype), self.mesh, self.state[v][1], req)
        outs = []
        settle = None
        for j, r in enumerate(op.results):
            dims = unproject(rule.results[j], fa, rule.sizes, self.mesh)
            partial = self.mesh.order(set(kept) | set(reduced))
            out = Sharding(dims, partial, frozenset(), red_op if reduced else "sum")
            outs.append(out)
            if r in self.passing:  # the next step reshards it (or takes its pending sum on): charged there
                continue
            want = self.target(r).closed().with_partial(())
            after = plan_reshard(r.type.shape, itemsize(r.type.dtype), self.mesh, out, want)
            settle = settle or _settlement(after, partial, out.partial_op)
            steps += after
        cost = comm_cost(steps)
        # local work: the op's FLOPs plus the elements it writes (so that even data movement
        # prefers running on shards to running replicated and slicing afterwards)
        local = lambda v, s: v.type.with_shape(s.local_shape(v.type.shape, self.mesh))  # noqa: E731
        out_types = [local(r, s) for r, s in zip(op.results, outs)]
        work = opdef.count_flops([local(v, s) for v, s in zip(op.operands, reqs)], out_types, op.attrs)
        work += sum(t.size for t in out_types)
        return (cost + work / FLOPS_PER_BYTE, work), fa, reqs, outs, (steps, settle)

    def execute(self, op: Op, rule: FactorRule, fa, reqs, outs) -> None:
        opdef = registry.get(op.kind)
        locals_ = []
        for i, (v, req) in enumerate(zip(op.operands, reqs)):
            x = self.reshard(v, req, f"for {op.kind}")
            for f in fa:
                d = rule.factor_dims(i, f)
                if rule.kinds[f] != REDUCTION or d is None:
                    continue
                dim_axes = req.dims[d]
                x = self.mask(x, d, dim_axes, v.type.shape[d], opdef.reduce_fill(v.type.dtype))
            locals_.append(x)
        shapes = [o.local_shape(r.type.shape, self.mesh) for o, r in zip(outs, op.results)]
        attrs = dict(op.attrs)
        if opdef.localize is not None:
            attrs = opdef.localize(attrs, [x.type for x in locals_], shapes)
        results = self.b.emit_op(op.kind, locals_, attrs, op.span, [r.name for r in op.results])
        for r, lr, o, shape in zip(op.results, results, outs, shapes):
            assert lr.type.shape == tuple(shape), (op.kind, lr.type, shape)
            self.state[r] = (lr, o)


def _settlement(steps: list[Step], partial, reduce: str) -> Step | None:
    """The one collective of `steps` if they settle the pending sum over `partial` as a single
    all_reduce or reduce_scatter (which the combiner can merge with others), else None."""
    collectives = [s for s in steps if s.is_collective]
    if not partial or reduce != "sum" or len(collectives) != 1:
        return None
    (st,) = collectives
    if st.kind not in ("all_reduce", "reduce_scatter") or set(st.axes) != set(partial):
        return None
    return st


def _settle_key(st: Step, dtype: str) -> tuple:
    """The combining key (partition.combine) of the collective a settlement step emits."""
    return (st.kind, tuple(st.axes), st.group if st.kind == "reduce_scatter" else st.reduce, dtype)


def _whole_step(plan) -> float:
    """A plan on the whole step (partition.cost.step_cost): its settlement's latency is shared."""
    (cost, work), _, _, _, (steps, settle) = plan
    return step_cost(steps, shared=settle) + work / FLOPS_PER_BYTE


def _accumulations(loop: Loop, users) -> dict[Op, tuple[int, Value]]:
    """The body's `acc = acc + t` (or acc - t) on float carries that nothing else in the body
    reads: add op -> (carry index, t)."""
    producer = {r: op for op in loop.body.ops for r in op.results}
    out = {}
    for k, (p, nxt) in enumerate(zip(loop.carries, loop.body.results)):
        op = producer.get(nxt)
        window = _window_accumulation(p, nxt, op, producer, users)
        if window is not None:
            out[window[0]] = (k, window[1])
            continue
        if (op is None or op.kind not in ("add", "sub") or users.get(p, 0) != 1 or users.get(nxt, 0) != 1
                or p not in op.operands or not is_float(p.type.dtype) or op.operands[0] is op.operands[1]):
            continue
        if op.kind == "sub" and op.operands[0] is not p:
            continue
        term = op.operands[1] if op.operands[0] is p else op.operands[0]
        if term.type.shape != p.type.shape:
            continue
        out[op] = (k, term)
    return out


def _window_accumulation(p: Value, nxt: Value, op: Op | None, producer, users):
    """`acc = dynamic_update_slice(acc, dynamic_slice(acc, s) + t, s)` (a stacked weight's
    gradient, accumulated in its window by a reverse loop): (the add op, t), or None."""
    if (op is None or op.kind != "dynamic_update_slice" or op.operands[0] is not p or not is_float(p.type.dtype)
            or users.get(p, 0) != 2 or users.get(nxt, 0) != 1):
        return None
    add = producer.get(op.operands[1])
    if add is None or add.kind != "add" or users.get(add.result, 0) != 1:
        return None
    for a, t in (add.operands, add.operands[::-1]):
        ds = producer.get(a)
        if (ds is not None and ds.kind == "dynamic_slice" and ds.operands[0] is p and users.get(a, 0) == 1
                and ds.operands[1:] == op.operands[2:] and t is not a and t.type.shape == a.type.shape):
            return add, t
    return None


@dataclass
class _Frame:
    """A loop being partitioned: its capture params (global) -> the values they capture, what
    the program around it was emitting into, and the reshards hoisted out of it so far."""

    outer: dict[Value, Value]
    saved: tuple
    extra: list[tuple[Value, Value]] = field(default_factory=list)  # (value outside, its body param)
    hoisted: dict = field(default_factory=dict)


def _valid(rule: FactorRule, fa, mesh: Mesh) -> bool:
    """Every tensor can express the factor split (no axes lost to non-contiguous dims)."""
    for t in rule.tensors:
        dims = unproject(t, fa, rule.sizes, mesh)
        got = [a for d in dims for a in d]
        want = [a for fs in t for f in fs for a in fa.get(f, ())]
        if sorted(got) != sorted(want):
            return False
    return True


def _zero(dtype: str):
    return False if dtype == "bool" else 0.0 if dtype in ("f32", "bf16", "f16", "f64") else 0


class OpContext:
    """What an op's custom `partition` step (OpDef.partition) gets: the op, its operands' local
    values and layouts, the planned layouts of its results, and the emission helpers below. The
    step must call `set_result` for every result, or hand the op to `generic`.

    Everything it emits goes into the one per-partition program, with the op's source span;
    collectives go through `collective` (or `reshard`/`window`), so the ledger sees them.
    """

    def __init__(self, p: Partitioner, op: Op):
        self._p, self.op = p, op

    # ---- the op and its layouts

    @property
    def mesh(self) -> Mesh:
        return self._p.mesh

    @property
    def attrs(self):
        return self.op.attrs

    def rule(self) -> FactorRule:
        return op_rule(self.op)

    def layout(self, i: int) -> Sharding:
        """The current layout of operand i (a pending sum included)."""
        return self._p.state[self.op.operands[i]][1]

    def target(self, j: int = 0) -> Sharding:
        """The layout propagation planned for result j (no pending sum)."""
        return self._p.target(self.op.results[j]).closed().with_partial(())

    def local_shape(self, v: Value, s: Sharding) -> tuple[int, ...]:
        return s.local_shape(v.type.shape, self.mesh)

    # ---- the rest of the global program (for steps that share work between ops)

    def operand_local(self, i: int) -> Value:
        """Operand i's local value as it is now (in `layout(i)`)."""
        return self._p.state[self.op.operands[i]][0]

    def producer(self, v: Value) -> Op | None:
        """The global op that computes v (None for a parameter)."""
        return self._p.producer.get(v)

    def users(self, v: Value) -> list[Op]:
        """The global ops that use v, in program order."""
        p = self._p
        if p.user_ops is None:
            p.user_ops = {}
            for op in all_ops(p.prog.ops):
                for u in dict.fromkeys(op.operands):
                    p.user_ops.setdefault(u, []).append(op)
        return p.user_ops.get(v, [])

    def is_result(self, v: Value) -> bool:
        return any(r.value is v for r in self._p.prog.results)

    def layout_of(self, v: Value) -> Sharding | None:
        """The current layout of an already partitioned global value (None if not yet)."""
        got = self._p.state.get(v)
        return got[1] if got else None

    def target_of(self, v: Value) -> Sharding:
        """The layout propagation planned for any global value."""
        return self._p.target(v)

    def reshard_value(self, v: Value, want: Sharding) -> Value:
        """Any already partitioned global value laid out as `want`, for this op."""
        return self._p.reshard(v, want, f"for {self.op.kind}")

    @property
    def memo(self) -> dict:
        """Work custom steps share across ops (one halo exchange for several slices)."""
        return self._p.memo

    # ---- getting operands, giving results

    def reshard(self, i: int, want: Sharding, why: str = "") -> Value:
        """Operand i's local value laid out as `want` (collectives logged as for this op, with
        `why` added to their reason where the step has one to give)."""
        return self._p.reshard(self.op.operands[i], want, f"for {self.op.kind}" + (f": {why}" if why else ""))

    def set_result(self, local: Value, s: Sharding, j: int = 0) -> None:
        """Result j is `local`, laid out as s (which may owe a pending sum)."""
        r = self.op.results[j]
        assert local.type.shape == s.local_shape(r.type.shape, self.mesh), (self.op.kind, local.type, s)
        self._p.state[r] = (local, s)

    def generic(self, forbid=frozenset()) -> None:
        """Partition the op by its factor rule instead (never splitting the factors in `forbid`)."""
        self._p.generic(self.op, frozenset(forbid))

    def trial(self, op: Op, target: Sharding, layouts: dict[Value, Sharding],
              passing: bool = False) -> tuple[float, Sharding]:
        """(cost, result layout) of partitioning `op` (a step of a decomposition of this op, over
        this op's operands and earlier steps' results, whose layouts are in `layouts`) generically
        with its result planned as `target`, in the cost model's unit; emits nothing. A `passing`
        result (an intermediate) may keep a pending sum that a later step takes on."""
        return self._p.trial(op, target, layouts, passing)

    def step(self, op: Op, target: Sharding | None = None, passing: bool = False) -> None:
        """Partition one step of a decomposition of this op generically (its result planned as
        `target`; the last step must produce this op's result, as propagation planned it)."""
        self._p.step(op, target, passing)

    # ---- emission

    def emit(self, kind: str, *operands: Value, name: str | None = None, **attrs) -> Value:
        """Append a single-result op to the per-partition program."""
        return self._p.emit(kind, *operands, name=name, **attrs)

    def emit_multi(self, kind: str, *operands: Value, **attrs) -> tuple[Value, ...]:
        """Append an op with several results (top_k's values and indices)."""
        return self._p.b.emit_op(kind, operands, attrs, self._p.span)

    def constant(self, value, dtype: str) -> Value:
        """A scalar constant."""
        return self._p.emit("full", dtype=dtype, shape=(), value=value)

    def collective(self, kind: str, x: Value, reason: str, **attrs) -> Value:
        """One collective over attrs["axes"], logged in the ledger with `reason` for this op."""
        return self._p.collective(kind, x, f"{reason} for {self.op.kind}", **attrs)

    def axis_index(self, axes) -> Value:
        """This partition's linear index over `axes` (first axis major), an i32 scalar."""
        return self._p.axis_index(axes)

    def affine_index(self, axes, scale: int, shift: int = 0) -> Value:
        """axis_index(axes) * scale + shift, as an i32 scalar."""
        return self._p.affine_index(axes, scale, shift)

    def offset(self, axes, c: int) -> Value:
        """The global index of this partition's first element along a dim split over `axes` in
        chunks of c."""
        return self._p.offset(axes, c)

    def mask(self, x: Value, dim: int, axes, n: int, value) -> Value:
        """Fill the padding of dim `dim` (split over `axes`, global size n) with `value`."""
        return self._p.mask(x, dim, axes, n, value)

    def slice_dim(self, x: Value, dim: int, start: int, stop: int) -> Value:
        """x restricted to [start, stop) on dim (nothing emitted for the whole dim)."""
        return self._p.slice_dim(x, dim, start, stop)

    def pad_dim(self, x: Value, dim: int, lo: int, hi: int, value=None) -> Value:
        """x with lo and hi elements of `value` (default zero) added on dim."""
        return self._p.pad_dim(x, dim, lo, hi, value)

    def fill_dim(self, x: Value, dim: int, size: int, value) -> Value:
        """A constant block shaped like x except for `size` elements on `dim`."""
        return self._p.fill_dim(x, dim, size, value)

    def window(self, x: Value, dim: int, in_axes, out_axes, n: int, w) -> Value:
        """See partition.halo: the input elements this device's output shard needs on `dim`."""
        from .halo import window

        return window(self, x, dim, in_axes, out_axes, n, w, f"halo of %{self.op.operands[0].name or 'operand'}")


def partition(prog: Program, prop: Propagation) -> SpmdProgram:
    """Partition the global program under its propagated shardings. Pure.

    Where an op's pending sum (a weight gradient) would rather be settled in a combined reduction
    than have its operands gathered (partition.cost, "Combined reductions"), and the first plan
    has another reduction over the same group that it can join, the step is planned a second time
    settling there; the plan with the lower modelled step time after combining is kept."""
    first = Partitioner(prog, prop)
    spmd = first.run()
    settle = first.joinable()
    if not settle:
        return spmd
    second = Partitioner(prog, prop)
    second.settle = settle
    other = second.run()
    return other if _step_time(other) < _step_time(spmd) else spmd


def _step_time(spmd: SpmdProgram) -> float:
    """Modelled time of a plan after combining (partition.combine), in the planning machine's
    alpha-beta (partition.cost)."""
    from .combine import finish
    from .cost import compute_time_us, flops, latency_steps

    done = finish(spmd)
    mesh = spmd.program.mesh
    comm = sum((PLANNING.latency_us * latency_steps(c.kind, mesh.group_size(c.axes))
                + c.bytes_per_device / (PLANNING.bandwidth_gbps * 1e3)) * c.trip_count for c in done.ledger)
    return comm + compute_time_us(flops(done.program))

