"""Per-partition IR passes after partitioning: CSE, collective combining, dead code.

XLA combines independent all-reduces over the same group (and element type) into one (tuple) all-reduce and
removes duplicates and dead collectives; doing it here keeps the ledger (what `explain` shows)
equal to what XLA actually runs, and the simulator and the emitted module see the same plan.
Independent reduce_scatters and all_gathers over the same group and element type are combined
the same way (XLA's reduce-scatter and all-gather combiners), each as one collective of the
members' flattened operands side by side (all_gathers of one size: stacked, see
ir.collectives._fused_all_gather). Which kinds combine, by what key, and how (side by
side, or as one variadic op) is each kind's entry in the collective table (ir.collectives).
A waiting group of small all_reduce sums rides in a reduce_scatter over the same group and element
type (`rides`: each operand broadcast to the k chunks, so every shard's piece is the whole sum),
where the bytes that adds are within the latency steps it saves at the planner's price of a step:
a loss rides with the weight gradients' reduce_scatter, one collective fewer (XLA, which has no
such rewrite, combines the loss with the gradients' all-reduce instead).

Combining is a list schedule: ops run as soon as their operands are ready (in program order
among the ready ones), while ready combinable collectives wait; only when nothing else can run is the
waiting group (same axes and reduction) that the earliest work needs emitted, as one variadic
all_reduce; the other groups keep collecting. Only ready ops are
ever emitted, so the order stays valid, and independent all_reduces end up in one collective.
"""

from __future__ import annotations

import heapq
from dataclasses import replace

from ..ir.collectives import CollectiveKind, combine_key, latency_steps, spec, step_bytes
from ..ir.core import Op, Program, all_ops, ancestry, rewrite_regions
from ..ir.simplify import algebraic, cse, dead_code
from .cost import LATENCY_BYTES
from .ledger import remapped


def _combine(prog: Program, ledger):
    """Combine in the program and, each on its own, in every loop body (an all_reduce never
    leaves or enters a loop here); the ledger follows, in program order."""
    new_ledger = list(ledger)

    def region(r):
        nonlocal new_ledger
        ops, new_ledger = _combine_ops(tuple(r.ops), new_ledger)
        return ops

    ops, new_ledger = _combine_ops(tuple(rewrite_regions(op, region) for op in prog.ops), new_ledger)
    order = {op: i for i, op in enumerate(all_ops(ops))}
    new_ledger.sort(key=lambda c: order.get(c.local_op, -1))
    return prog.replace(ops=tuple(ops)), new_ledger


class _Schedule:
    """The list schedule of one block's ops (the module doc): ready ops run in program order,
    ready combinable collectives wait in groups by combining key until nothing else can run."""

    def __init__(self, ops):
        self.ops = ops
        self.index, self.anc = ancestry(ops)
        producer = {r: op for op in ops for r in op.results}
        self.users: dict[Op, list[Op]] = {op: [] for op in ops}
        self.missing: dict[Op, int] = {}
        for op in ops:
            deps = {producer[v] for v in op.operands if v in producer}
            self.missing[op] = len(deps)
            for d in deps:
                self.users[d].append(op)
        self.by_key: dict[tuple, list[Op]] = {}
        for op in ops:
            if _combinable(op):
                self.by_key.setdefault(combine_key(op), []).append(op)
        self.by_id = {id(op): op for op in ops}
        self.ready: list[tuple[int, int]] = []
        self.pending: dict[tuple, list[Op]] = {}
        self.emitted: set[Op] = set()
        self.out: list[Op] = []
        self.merged: dict[Op, list[Op]] = {}  # each combined collective -> the ones it replaces
        self.extra = 0  # ops added by fusing side by side
        self.scanned: dict[tuple, int] = {}  # could_grow's cursor per combining key

    def arrive(self, op: Op) -> None:
        if _combinable(op):
            self.pending.setdefault(combine_key(op), []).append(op)
        else:
            heapq.heappush(self.ready, (self.index[op], id(op)))

    def done(self, op: Op) -> None:
        for u in self.users[op]:
            self.missing[u] -= 1
            if self.missing[u] == 0:
                self.arrive(u)

    def could_grow(self, key, group) -> bool:
        """Could a collective not yet emitted, independent of the group, still join it?
        self.scanned[key] is how far into by_key[key] no op can join the waiting group: while a group
        waits it only grows and `emitted` only grows, so an op that cannot join it never can (linear,
        not quadratic, in the collectives of one key); reset when the group is released."""
        mask = 0
        for g in group:
            mask |= 1 << self.index[g]
        members = set(group)
        cands, i = self.by_key[key], self.scanned.get(key, 0)
        while i < len(cands):
            o = cands[i]
            if o not in self.emitted and o not in members and not (self.anc[o] & mask):
                break
            i += 1
        self.scanned[key] = i
        return i < len(cands)

    def carrier(self, key) -> tuple[tuple, list[tuple]]:
        """The group to release for the stalled choice `key`, and the waiting all_reduce groups that
        ride in it (see rides): a reduce_scatter group takes every waiting group that can ride in
        it; an all_reduce group that can ride goes with a reduce_scatter group that cannot grow."""
        def fits(ar, rs):
            return (ar[0] == CollectiveKind.ALL_REDUCE and rs[0] == CollectiveKind.REDUCE_SCATTER
                    and ar[1] == rs[1] and ar[3] == rs[3] and rides(self.pending[ar], rs[2]))
        if key[0] == CollectiveKind.ALL_REDUCE:
            rs = next((r for r in self.pending if fits(key, r) and not self.could_grow(r, self.pending[r])), None)
            if rs is None:
                return key, []
            key = rs
        return key, [a for a in self.pending if fits(a, key)]

    def release(self, group: list[Op], riders: list[Op] = ()) -> None:
        """Emit a waiting group as one collective (side by side, or one variadic op), with the
        all_reduces that ride in it (a reduce_scatter group: see rides)."""
        group.sort(key=lambda o: self.index[o])
        s = spec(group[0].kind)
        if len(group) == 1 and not riders:
            self.out.append(group[0])
        elif s.fuse is not None:
            fused, op = s.fuse(group, tuple(riders)) if riders else s.fuse(group)
            self.merged[op] = group + list(riders)
            self.extra += len(fused) - 1
            self.out.extend(fused)
        else:
            op = Op(s.kind, tuple(v for g in group for v in g.operands),
                    tuple(r for g in group for r in g.results), group[0].attrs, group[0].span)
            self.merged[op] = group
            self.out.append(op)
        self.emitted.update(group)
        self.emitted.update(riders)
        for g in (*group, *riders):
            self.done(g)

    def run(self) -> list[Op]:
        for op in self.ops:
            if self.missing[op] == 0:
                self.arrive(op)
        while self.ready or self.pending:
            if self.ready:
                op = self.by_id[heapq.heappop(self.ready)[1]]
                self.out.append(op)
                self.done(op)
                continue
            # stalled: release a group no later collective could still join (one that does not
            # depend on it); if every group could still grow, the one the earliest waiting work needs
            key = min(self.pending, key=lambda k: (self.could_grow(k, self.pending[k]),
                                                   min(self.index[o] for o in self.pending[k])))
            key, riding = self.carrier(key)
            riders = sorted((o for r in riding for o in self.pending.pop(r)), key=lambda o: self.index[o])
            for r in (key, *riding):
                self.scanned.pop(r, None)
            self.release(self.pending.pop(key), riders)
        lost = len(self.out) - self.extra + sum(len(g) - 1 for g in self.merged.values()) - len(self.ops)
        assert lost == 0, "scheduling lost ops"
        return self.out


def rides(group: list[Op], k: int) -> bool:
    """Can these all_reduces ride in a reduce_scatter over the same group of k (each operand
    broadcast to k chunks, so that every shard's piece is the sum: ir.collectives'
    _fused_reduce_scatter)? When they are sums and the bytes that adds are within the latency
    steps it saves, at the planner's price of a step (cost.LATENCY_BYTES: only small values, such
    as a loss riding with the weight gradients' reduce_scatter, ride)."""
    if any(op.attrs["reduce"] != "sum" for op in group):
        return False
    size = sum(x.type.nbytes for op in group for x in op.operands)
    added = step_bytes(CollectiveKind.REDUCE_SCATTER, k, k * size) - step_bytes(CollectiveKind.ALL_REDUCE, k, size)
    return added <= latency_steps(CollectiveKind.ALL_REDUCE, k) * LATENCY_BYTES


def _combinable(op: Op) -> bool:
    # (a product all-reduce runs as an all_gather per operand in jax: nothing to combine)
    s = spec(op.kind)
    return s is not None and s.combinable(op.attrs)


def _combine_ops(prog_ops, ledger):
    """One block's ops combined, and the ledger with one entry per combined collective."""
    schedule = _Schedule(prog_ops)
    ops = schedule.run()
    by_op = {c.local_op: c for c in ledger}
    members = {g for group in schedule.merged.values() for g in group}
    new_ledger = [c for c in ledger if c.local_op not in members]
    for op, group in schedule.merged.items():
        # the combined collective's own kind first; an all_reduce riding in a reduce_scatter sends
        # its operand's k copies' share instead (rides)
        entries = sorted(([by_op[g], g] for g in group if g in by_op), key=lambda e: e[0].kind != op.kind)
        for e in entries:
            if e[0].kind != op.kind:
                k = op.attrs["group"]
                size = sum(x.type.nbytes for x in e[1].operands)
                e[0] = replace(e[0], kind=op.kind, bytes_per_device=step_bytes(op.kind, k, k * size))
        entries = [e for e, _ in entries]
        if entries:
            new_ledger.append(replace(entries[0], bytes_per_device=sum(e.bytes_per_device for e in entries),
                                      reason=" + ".join(e.reason for e in entries), local_op=op,
                                      backward=_same_pass(entries),
                                      line=min((e.line for e in entries if e.line is not None), default=None)))
    return ops, new_ledger


def finish(spmd):
    """CSE, algebraic identities (what partitioning leaves, e.g. where(c, x, x) once CSE has made
    two constants one), dead code, then all_reduce combining, on a partition.spmd.SpmdProgram.
    Pure; the result is kept on `spmd` (never changed once partitioned) and returned again."""
    if spmd.finished is not None:
        return spmd.finished
    prog, repl = cse(spmd.program, passes=False)
    prog, more = algebraic(prog)
    repl.update(more)  # ledger.remapped follows chains: op -> its CSE'd op -> its rewritten op
    if more:  # an identity gone (a transpose of size-1 dims) can leave two ops alike: one
        prog, again = cse(prog, passes=False)
        repl.update(again)
    prog = dead_code(prog)
    prog, ledger = _combine(prog, remapped(spmd.ledger, repl, set(all_ops(prog.ops))))
    prog, more = algebraic(prog)  # combining packs values with reshapes: a reshape of a reshape is one
    if more:
        prog = dead_code(prog)
        ledger = remapped(ledger, more, set(all_ops(prog.ops)))
    notes = {c.local_op: c.reason for c in ledger if c.local_op is not None}
    spmd.finished = replace(spmd, program=prog, ledger=ledger, notes=notes)
    return spmd.finished


def _same_pass(entries):
    """The pass a combined collective serves: forward (False), backward (True), or both (None)."""
    passes = {e.backward for e in entries}
    return passes.pop() if len(passes) == 1 else None
