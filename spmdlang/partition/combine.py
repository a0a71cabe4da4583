"""Per-partition IR passes after partitioning: CSE, collective combining, dead code.

XLA combines independent all-reduces over the same group (and element type) into one (tuple) all-reduce and
removes duplicates and dead collectives; doing it here keeps the ledger (what `explain` shows)
equal to what XLA actually runs, and the simulator and the emitted module see the same plan.
Independent reduce_scatters and all_gathers over the same group and element type are combined
the same way (XLA's reduce-scatter and all-gather combiners), each as one collective of the
members' flattened operands side by side.

Combining is a list schedule: ops run as soon as their operands are ready (in program order
among the ready ones), while ready combinable collectives wait; only when nothing else can run is the
waiting group (same axes and reduction) that the earliest work needs emitted, as one variadic
all_reduce; the other groups keep collecting. Only ready ops are
ever emitted, so the order stays valid, and independent all_reduces end up in one collective.
"""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

from ..ir.builder import Builder
from ..ir.core import Op, Program, all_ops, freeze
from ..ir.simplify import cse, dead_code, with_regions


def _key(op: Op) -> tuple:
    # XLA's compiled module splits a tuple all-reduce of mixed element types into one per type
    if op.kind in _FUSED:
        return op.kind, tuple(op.attrs["axes"]), op.attrs["group"], op.operands[0].type.dtype
    return op.kind, tuple(op.attrs["axes"]), op.attrs["reduce"], op.operands[0].type.dtype


def _fused_reduce_scatter(group: list[Op]) -> tuple[list[Op], Op]:
    """Several reduce_scatters over one group as ONE (XLA's reduce-scatter combiner): each operand
    laid out as [k, m_i] (its k chunks of `dim` first), concatenated to [k, sum m_i], scattered,
    and each member's piece reshaped back into the member's own result value. Returns the ops and
    the collective among them."""
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
    both = b.emit("concat", *flat, span=group[0].span, axis=1)
    scattered = b.emit("reduce_scatter", both, span=group[0].span, axes=group[0].attrs["axes"], dim=0, group=k)
    collective = b.ops[-1]
    start = 0
    for g, f in zip(group, flat):
        m = f.type.shape[1]
        piece = b.emit("slice", scattered, span=g.span, starts=(0, start), stops=(1, start + m), steps=(1, 1))
        b.ops.append(Op("reshape", (piece,), g.results, freeze({"shape": g.result.type.shape}), g.span))
        start += m
    return b.ops, collective


def _fused_all_gather(group: list[Op]) -> tuple[list[Op], Op]:
    """Several all_gathers over one group as ONE (XLA's all-gather combiner): each operand
    flattened to [1, m_i], concatenated to [1, sum m_i], gathered to [k, sum m_i], and each
    member's [k, m_i] piece laid back out as its own result (the k shards side by side along the
    member's `dim`). Returns the ops and the collective among them."""
    b = Builder()
    k = group[0].attrs["group"]
    flat = [b.emit("reshape", g.operands[0], span=g.span, shape=(1, g.operands[0].type.size)) for g in group]
    both = b.emit("concat", *flat, span=group[0].span, axis=1) if len(flat) > 1 else flat[0]
    gathered = b.emit("all_gather", both, span=group[0].span, axes=group[0].attrs["axes"], dim=0, group=k)
    collective = b.ops[-1]
    start = 0
    for g, f in zip(group, flat):
        (x,), d = g.operands, g.attrs["dim"]
        shape, m = x.type.shape, f.type.shape[1]
        piece = b.emit("slice", gathered, span=g.span, starts=(0, start), stops=(k, start + m), steps=(1, 1))
        y = b.emit("reshape", piece, span=g.span, shape=(k, *shape))
        if d:
            y = b.emit("transpose", y, span=g.span, perm=(*range(1, d + 1), 0, *range(d + 1, len(shape) + 1)))
        b.ops.append(Op("reshape", (y,), g.results, freeze({"shape": g.result.type.shape}), g.span))
        start += m
    return b.ops, collective


# the collectives that combine by flattening their members side by side (all_reduces combine as
# one variadic op instead): kind -> the builder of the combined collective
_FUSED = {"reduce_scatter": _fused_reduce_scatter, "all_gather": _fused_all_gather}


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
        # a product all-reduce runs as an all_gather per operand in jax: nothing to combine
        if op.kind in _FUSED:
            return True
        return op.kind == "all_reduce" and op.attrs["reduce"] != "prod"

    def arrive(op):
        if combinable(op):
            pending.setdefault(_key(op), []).append(op)
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
            by_key.setdefault(_key(op), []).append(op)

    # per key, how far into by_key[key] no op can join the pending group: while a group waits it
    # only grows and `emitted` only grows, so an op that cannot join it never can (linear, not
    # quadratic, in the reductions of one key); reset when the group is released
    scanned: dict[tuple, int] = {}

    def _could_grow(key, group) -> bool:
        mask = 0
        for g in group:
            mask |= 1 << index[g]
        members = set(group)
        cands, i = by_key[key], scanned.get(key, 0)
        while i < len(cands):
            o = cands[i]
            if o not in emitted and o not in members and not (anc[o] & mask):
                break
            i += 1
        scanned[key] = i
        return i < len(cands)

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
        scanned.pop(key, None)
        for group in [pending.pop(key)]:
            group.sort(key=lambda o: index[o])
            if len(group) == 1:
                ops.append(group[0])
            elif group[0].kind in _FUSED:
                fused, op = _FUSED[group[0].kind](group)
                merged[op] = group
                extra += len(fused) - 1
                ops.extend(fused)
            else:
                op = Op("all_reduce", tuple(v for g in group for v in g.operands),
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
    ledger, seen = [], set()
    for c in spmd.ledger:
        op = repl.get(c.local_op, c.local_op)
        while op in repl:
            op = repl[op]
        if op in live and id(op) not in seen:
            seen.add(id(op))
            ledger.append(replace(c, local_op=op))
    prog, ledger = _combine(prog, ledger)
    notes = {c.local_op: c.reason for c in ledger if c.local_op is not None}
    return replace(spmd, program=prog, ledger=ledger, notes=notes)


def _same_pass(entries):
    """The pass a combined collective serves: forward (False), backward (True), or both (None)."""
    passes = {e.backward for e in entries}
    return passes.pop() if len(passes) == 1 else None
