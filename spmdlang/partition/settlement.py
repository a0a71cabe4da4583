"""The combined-settlement second plan (partition.cost, "Combined reductions").

A pending sum (a weight gradient) may rather be settled in a combined reduction than have its
operands gathered: on the whole step, its settlement adds bytes but no latency when it joins
another reduction over the same group. The first plan records the ops that would rather settle
(`choose`); where such an op has a reduction to join (`joinable`), partition.spmd.partition plans
the step a second time settling there, and keeps the plan with the lower modelled step time.
"""

from __future__ import annotations

from ..ir.collectives import combine_key, spec, step_combine_key
from ..ir.core import Op, ancestry
from .factors import FactorRule
from .strategies import FactorPlan


def choose(p, op: Op, rule: FactorRule, forbid) -> FactorPlan:
    """The strategy partitioner `p` runs `op` with: the cheapest, or in the second plan the one
    settling in a combined reduction; records in p.settle_wanted the ops that would rather settle."""
    if p.em.frames or op is not p.em.current or len(op.results) != 1:
        return p.strategies.best(op, rule, forbid)
    best, settling = p.strategies.best(op, rule, forbid, settling=True)
    if settling is not None and settling is not best:
        if op in p.settle:  # the second plan of the step: settle here, in a combined reduction
            return settling
        if settling.whole_step() < best.whole_step():
            p.settle_wanted.append((op, step_combine_key(settling.settle, op.result.type.dtype)))
    return best


def joinable(p) -> set[Op]:
    """The ops of partitioner `p`'s plan that would rather settle their pending sum in a combined
    reduction (settle_wanted) and have one to join: another reduction with the same combining key,
    logged by this plan or wanted by another such op, that neither depends on them nor they on it."""
    if not p.settle_wanted:
        return set()
    index, anc = ancestry(p.local.prog.ops)
    present = [(op, key) for op, key in p.settle_wanted if op in index]
    for c, g in zip(p.ledger.entries, p.ledger.at):
        if g in index and c.trip_count == 1 and c.local_op is not None and spec(c.kind).settles:
            present.append((g, combine_key(c.local_op)))
    # descendants too, and per key the reductions present as one bitset: an op can join one of them
    # that is neither its ancestor nor its descendant (bit operations, not a scan of pairs)
    ops = p.local.prog.ops
    producer = {r: op for op in ops for r in op.results}
    desc: dict[Op, int] = {op: 0 for op in ops}
    for op in reversed(ops):
        below = desc[op] | (1 << index[op])
        for v in op.operands:
            if v in producer:
                desc[producer[v]] |= below
    by_key: dict = {}
    for g, k2 in present:
        by_key[k2] = by_key.get(k2, 0) | (1 << index[g])
    out = set()
    for op, key in p.settle_wanted:
        if op in index and by_key.get(key, 0) & ~(anc[op] | desc[op] | (1 << index[op])):
            out.add(op)
    return out
