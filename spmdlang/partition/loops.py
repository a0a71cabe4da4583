"""Loop partitioning: a loop's body is partitioned once, as a region of its own.

Each carry has one layout (its propagated sharding in the body): the initial value is resharded
to it on entry, the next value before the back edge (once per iteration). Captures come in as
they are laid out outside; a reshard of one is hoisted out of the loop (Emitter.hoisted).

An accumulation `acc = acc + t` whose t arrives as a pending sum is not settled on every
iteration: the carry itself becomes pending over t's axes and is settled once, where the loop's
result is used. Which carries qualify is only known once the body is partitioned (the axes t is
pending over), so a first attempt finds them, and the body is partitioned again with those
carries pending: twice at most, whatever the trip count.
"""

from __future__ import annotations

from ..ir import registry
from ..ir.builder import Builder
from ..ir.core import Loop, Op, Region, Value, make_loop
from ..ir.mesh import Sharding
from ..ir.names import OpName
from ..ir.types import is_float
from .emitter import Frame, Scope


def partition_loop(p, op: Op) -> None:
    """Partition LOOP op `op` with partitioner `p` (partition.spmd.Partitioner), its body's ops
    through p.partition_op."""
    em = p.em
    loop = Loop(op)
    accums = _accumulations(loop, p.local.users)
    p.passing.update(_accumulated_terms(loop, accums, p.local.users))
    scope = em.scope
    snapshot = (len(scope.builder.ops), len(p.ledger), dict(em.cache), dict(scope.indices), dict(scope.memo))
    pending = _partition_body(p, op, loop, accums, {})
    if pending:
        n_ops, n_ledger, cache, indices, memo = snapshot
        del scope.builder.ops[n_ops:]
        p.ledger.truncate(n_ledger)
        em.cache, scope.indices, scope.memo = cache, indices, memo
        _partition_body(p, op, loop, {}, pending)


def _accumulated_terms(loop: Loop, accums: dict, users) -> set[Value]:
    """The added terms of the loop's accumulations, and the values they are linear in (through
    ops that keep a pending sum on: reshape, add, ...) whose every use leads into accumulations
    (one slice of a gradient per carry: the halves of an LSTM's concatenated kernel): their
    pending sums may flow on into the carries, which are settled once after the loop, so keeping
    one is not charged as a settlement on every iteration (a weight gradient's einsum stays
    local). A window written into zeros (one layer's gradient placed in a stacked buffer) passes
    its update's pending sum on too."""
    producer = {r: bop for bop in loop.body.ops for r in bop.results}
    consumers: dict[Value, list[Op]] = {}
    for bop in loop.body.ops:
        for v in bop.operands:
            consumers.setdefault(v, []).append(bop)
    adds = set(accums)
    out: set[Value] = set()

    def passes(v: Value) -> bool:  # every use of v is an accumulation, or an op passing on into one
        uses = consumers.get(v, [])
        return (is_float(v.type.dtype) and len(uses) == users.get(v, 0) and len(uses) > 0
                and all(c in adds or all(r in out for r in c.results) for c in uses))

    todo = [term for _, term in accums.values()]
    while todo:
        waiting, todo = todo, []
        for v in waiting:
            if v in out or not passes(v):
                continue
            out.add(v)
            bop = producer.get(v)
            if bop is not None and not bop.regions and registry.get(bop.kind).partial_mode(bop.attrs) == "additive":
                todo.extend(bop.operands)
            elif bop is not None and bop.kind == OpName.DYNAMIC_UPDATE_SLICE \
                    and _is_zeros(producer.get(bop.operands[0])):
                todo.append(bop.operands[1])  # a window written into zeros (ops.dynamic keeps its pending sum)
            todo.extend(u for u in waiting if u not in out)  # one may pass now that v does
        todo = list(dict.fromkeys(todo))
    return out


def _is_zeros(op: Op | None) -> bool:
    return op is not None and op.kind == OpName.FULL and op.attrs["value"] == 0


def _enter(p, loop: Loop, carry_s: list[Sharding]):
    """Bind the body's params: the carries entering in their layouts, the captures as they are
    laid out outside. Returns (index, carry params, capture params, the captures' local values)."""
    em, state = p.em, p.local.state
    inits = [em.enter_pending(v, s) if s.partial else em.reshard(v, s, "into the loop")
             for v, s in zip(loop.inits, carry_s)]
    caps = [state[v] for v in loop.captures]
    index = Value(loop.index.type, loop.index.name)
    carry_params = [Value(x.type, c.name) for x, c in zip(inits, loop.carries)]
    cap_params = [Value(local.type, c.name) for (local, _), c in zip(caps, loop.capture_params)]
    state[loop.index] = (index, Sharding.replicated(0))
    for c, lp, s in zip(loop.carries, carry_params, carry_s):
        state[c] = (lp, s)
    for c, lp, (_, s) in zip(loop.capture_params, cap_params, caps):
        state[c] = (lp, s)
    return inits, index, carry_params, cap_params, [lo for lo, _ in caps]


def _partition_body(p, op: Op, loop: Loop, accums: dict, pending: dict) -> dict:
    """One attempt; carries in `pending` (carry index -> axes) are carried as pending sums.
    Returns the accumulations it found whose added term was pending (carry index -> axes)."""
    em = p.em
    carry_s = [p.local.wanted(c) for c in loop.carries]
    for k, axes in pending.items():
        carry_s[k] = Sharding(carry_s[k].dims, axes, frozenset(), "sum")
    inits, index, carry_params, cap_params, cap_locals = _enter(p, loop, carry_s)
    frame = Frame(dict(zip(loop.capture_params, loop.captures)), em.scope)
    em.frames.append(frame)
    em.scope = Scope(Builder(), em.scope.trips * loop.trips)
    found = {}
    try:
        for bop in loop.body.ops:
            em.current, em.span = bop, bop.span
            if bop in accums:
                k, term = accums[bop]
                got = p.local.layout(term)
                split = {a for d in carry_s[k].dims for a in d}
                if got.partial and got.partial_op == "sum" and not split & set(got.partial):
                    found[k] = got.partial
            p.partition_op(bop)
        em.current, em.span = op, op.span
        # (a carry kept as a pending sum whose new value this attempt's body settled: pending again)
        nexts = [em.pending(r, s, "before the back edge") for r, s in zip(loop.body.results, carry_s)]
        body_ops = em.scope.builder.ops
    finally:
        em.frames.pop()
        em.scope = frame.around
    if found:
        return found
    extra_out = [o for o, _ in frame.extra]
    extra_in = [i for _, i in frame.extra]
    body = Region((index, *carry_params, *cap_params, *extra_in), tuple(body_ops), tuple(nexts))
    results = [Value(x.type, r.name) for x, r in zip(inits, op.results)]
    em.scope.builder.ops.append(make_loop(loop.start, loop.stop, inits, cap_locals + extra_out, body,
                                          results, op.span, op.backward))
    for r, lr, s in zip(op.results, results, carry_s):
        p.local.state[r] = (lr, s)
    return {}


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
        if (op is None or op.kind not in (OpName.ADD, OpName.SUB) or users.get(p, 0) != 1 or users.get(nxt, 0) != 1
                or p not in op.operands or not is_float(p.type.dtype) or op.operands[0] is op.operands[1]):
            continue
        if op.kind == OpName.SUB and op.operands[0] is not p:
            continue
        term = op.operands[1] if op.operands[0] is p else op.operands[0]
        if term.type.shape != p.type.shape:
            continue
        out[op] = (k, term)
    return out


def _window_accumulation(p: Value, nxt: Value, op: Op | None, producer, users):
    """`acc = dynamic_update_slice(acc, dynamic_slice(acc, s) + t, s)` (a stacked weight's
    gradient, accumulated in its window by a reverse loop): (the add op, t), or None."""
    if (op is None or op.kind != OpName.DYNAMIC_UPDATE_SLICE or op.operands[0] is not p or not is_float(p.type.dtype)
            or users.get(p, 0) != 2 or users.get(nxt, 0) != 1):
        return None
    add = producer.get(op.operands[1])
    if add is None or add.kind != OpName.ADD or users.get(add.result, 0) != 1:
        return None
    for a, t in (add.operands, add.operands[::-1]):
        ds = producer.get(a)
        if (ds is not None and ds.kind == OpName.DYNAMIC_SLICE and ds.operands[0] is p and users.get(a, 0) == 1
                and ds.operands[1:] == op.operands[2:] and t is not a and t.type.shape == a.type.shape):
            return add, t
    return None


