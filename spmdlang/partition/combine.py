"""Per-partition IR passes after partitioning: CSE, collective combining, dead code.

XLA combines independent all-reduces over the same group (and element type) into one (tuple) all-reduce and
removes duplicates and dead collectives; doing it here keeps the ledger (what `explain` shows)
equal to what XLA actually runs, and the simulator and the emitted module see the same plan.
Independent reduce_scatters and all_gathers over the same group and element type are combined
the same way (XLA's reduce-scatter and all-gather combiners), each as one collective of the
members' flattened operands side by side. Which kinds combine, by what key, and how (side by
side, or as one variadic op) is each kind's entry in the collective table (ir.collectives).

Combining is a list schedule: ops run as soon as their operands are ready (in program order
among the ready ones), while ready combinable collectives wait; only when nothing else can run is the
waiting group (same axes and reduction) that the earliest work needs emitted, as one variadic
all_reduce; the other groups keep collecting. Only ready ops are
ever emitted, so the order stays valid, and independent all_reduces end up in one collective.
"""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

from ..ir.collectives import CollectiveKind, combine_key, spec
from ..ir.core import Op, Program, all_ops
from ..ir.simplify import cse, dead_code, with_regions


def _combine(prog: Program, ledger):
    """Combine in the program and, each on its own, in every loop body (an all_reduce never
    leaves or enters a loop here); the ledger follows, in program order."""
    new_ledger = list(ledger)

    def region(r):
        nonlocal new_ledger
        ops, new_ledger = _combine_ops(tuple(r.ops), new_ledger)
        return r.replace(ops=tuple(ops))

    ops, new_ledger = _combine_ops(tuple(with_regions(op, region) for op in prog.ops), new_ledger)
    order = {op: i for i, op in enumerate(all_ops(ops))}
    new_ledger.sort(key=lambda c: order.get(c.local_op, -1))
    return prog.replace(ops=tuple(ops)), new_ledger


def _combine_ops(prog_ops, ledger):
    import heapq

    prog = SimpleNamespace(ops=prog_ops)
    index = {op: i for i, op in enumerate(prog.ops)}
    producer = {r: op for op in prog.ops for r in op.results}
    users: dict[Op, list[Op]] = {op: [] for op in prog.ops}
    missing: dict[Op, int] = {}
    for op in prog.ops:
        deps = {producer[v] for v in op.operands if v in producer}
        missing[op] = len(deps)
        for d in deps:
            users[d].append(op)
    ready: list[tuple[int, int]] = []
    pending: dict[tuple, list[Op]] = {}
    ops: list[Op] = []
    merged: dict[Op, list[Op]] = {}
    extra = 0  # ops added by fusing reduce_scatters

    def combinable(op) -> bool:
        # (a product all-reduce runs as an all_gather per operand in jax: nothing to combine)
        s = spec(op.kind)
        return s is not None and s.combinable(op.attrs)

    def arrive(op):
        if combinable(op):
            pending.setdefault(combine_key(op), []).append(op)
        else:
            heapq.heappush(ready, (index[op], id(op)))

    def done(op):
        for u in users[op]:
            missing[u] -= 1
            if missing[u] == 0:
                arrive(u)

    # ancestors of every op as a bitset over op indices, to tell which all_reduces are independent
    anc: dict[Op, int] = {}
    for op in prog.ops:
        bits = 0
        for v in op.operands:
            if v in producer:
                p = producer[v]
                bits |= anc[p] | (1 << index[p])
        anc[op] = bits
    emitted: set[Op] = set()
    by_key: dict[tuple, list[Op]] = {}
    for op in prog.ops:
        if combinable(op):
            by_key.setdefault(combine_key(op), []).append(op)

    def _could_grow(key, group) -> bool:
        mask = 0
        for g in group:
            mask |= 1 << index[g]
        return any(o not in emitted and o not in group and not (anc[o] & mask) for o in by_key[key])

    by_id = {id(op): op for op in prog.ops}
    for op in prog.ops:
        if missing[op] == 0:
            arrive(op)
    while ready or pending:
        if ready:
            op = by_id[heapq.heappop(ready)[1]]
            ops.append(op)
            done(op)
            continue
        # stalled: release a group no later all_reduce could still join (one that does not depend
        # on it); if every group could still grow, the one the earliest waiting work needs
        key = min(pending, key=lambda k: (_could_grow(k, pending[k]), min(index[o] for o in pending[k])))
        for group in [pending.pop(key)]:
            group.sort(key=lambda o: index[o])
            if len(group) == 1:
                ops.append(group[0])
            elif spec(group[0].kind).fuse is not None:
                fused, op = spec(group[0].kind).fuse(group)
                merged[op] = group
                extra += len(fused) - 1
                ops.extend(fused)
            else:
                op = Op(CollectiveKind(group[0].kind), tuple(v for g in group for v in g.operands),
                        tuple(r for g in group for r in g.results), group[0].attrs, group[0].span)
                merged[op] = group
                ops.append(op)
            emitted.update(group)
            for g in group:
                done(g)
    assert len(ops) - extra + sum(len(g) - 1 for g in merged.values()) == len(prog.ops), "scheduling lost ops"
    by_op = {c.local_op: c for c in ledger}
    members = {g: op for op, group in merged.items() for g in group}
    new_ledger = [c for c in ledger if c.local_op not in members]
    for op, group in merged.items():
        entries = [by_op[g] for g in group if g in by_op]
        if entries:
            new_ledger.append(replace(entries[0], bytes_per_device=sum(e.bytes_per_device for e in entries),
                                      reason=" + ".join(e.reason for e in entries), local_op=op,
                                      backward=_same_pass(entries),
                                      line=min((e.line for e in entries if e.line is not None), default=None)))
    return ops, new_ledger


def finish(spmd):
    """CSE, dead code, then all_reduce combining, on a partition.spmd.SpmdProgram."""
    prog, repl = cse(spmd.program)
    prog = dead_code(prog)
    live = set(all_ops(prog.ops))
    ledger = []
    for c in spmd.ledger:
        op = repl.get(c.local_op, c.local_op)
        while op in repl:
            op = repl[op]
        if op in live and all(e.local_op is not op for e in ledger):
            ledger.append(replace(c, local_op=op))
    prog, ledger = _combine(prog, ledger)
    notes = {c.local_op: c.reason for c in ledger if c.local_op is not None}
    return replace(spmd, program=prog, ledger=ledger, notes=notes)


def _same_pass(entries):
    """The pass a combined collective serves: forward (False), backward (True), or both (None)."""
    passes = {e.backward for e in entries}
    return passes.pop() if len(passes) == 1 else None
