"""The consumer-layout second plan: resharding a value before the ops that make it, not after.

Where every use of a value wants it in one layout (a `shard()` to replicated, a result, an op
that gathers it) but the value is made in another, the partitioner's first plan runs the ops
that make it in the planned layout and reshards their result: a slice and then a roll along a
split dim cost halo permutes each, and the gather after them moves the value once more. Running
those ops in the consumer's layout instead (resharding their inputs first, then working locally)
moves the input once and nothing else.

From the first plan (partition.spmd.Partitioner) this reads each value's layout as made, the
layouts its uses asked for (`Partitioner.demands`: a `shard()`, a result, a generic op's operand
layout), and what each op's own collectives cost (its ledger entries). Walking up from a value
whose uses agree on a layout L, through producers whose result has that one use, it picks the
ops to move into the consumer's layout by the cost model's planning unit (partition.cost:
`collective_cost` per reshard step, local work at FLOPS_PER_BYTE):

  cost(v in L) = min(reshard(v: made -> L) + first(v),               keep g as planned, move v
                     work(g in L) + sum over operands x of cost(x in L_x))   move g's inputs

where g makes v, L_x is the layout L implies for g's operand x through g's factor rule (none
where L splits a permutation or reduction factor: then g keeps its plan), and first(v) is what
the first plan spent on g and on the ops above it that this walk could move (their collectives
and local work). Where moving wins, partition.spmd.partition plans the program again with those
values planned in the consumer's layouts, and keeps the plan with the lower modelled step time
(partition.cost.step_time_us), so the estimate only proposes: the one cost model decides.
"""

from __future__ import annotations

from ..ir import registry
from ..ir.core import LOOP, Op, Value
from ..ir.mesh import Sharding
from ..ir.types import itemsize
from .cost import FLOPS_PER_BYTE, collective_cost, comm_cost
from .factors import PERMUTATION, REDUCTION, REPLICATE, project, unproject
from .propagate import op_rule
from .reshard import plan_reshard
from .strategies import local_work, valid

MAX_DEPTH = 8  # ops walked up from one value
_MARGIN = 1.0  # a move must save more than this (planning bytes) to be tried


def same(a: Sharding, b: Sharding) -> bool:
    return a.dims == b.dims and set(a.partial) == set(b.partial)


class _Walk:
    """The walk up from values of partitioner `p`'s first plan, with what its ops cost there."""

    def __init__(self, p):
        self.local, self.mesh = p.local, p.mesh
        self.top: dict[Value, Op] = {r: op for op in p.prog.ops for r in op.results}
        self.own: dict[Op, float] = {}  # each op's own collectives in the first plan
        for c, g in zip(p.ledger.entries, p.ledger.at):
            if g is not None:
                k = self.mesh.group_size(c.axes)
                self.own[g] = self.own.get(g, 0.0) + collective_cost(c.kind, k, c.bytes_per_device) * c.trip_count

    def reshard(self, v: Value, want: Sharding, made: Sharding | None = None) -> float:
        """The collectives of resharding v from `made` (default: as the first plan made it) to `want`."""
        if made is None:
            made = self.local.produced.get(v)
        if made is None or same(made, want):
            return 0.0
        return comm_cost(plan_reshard(v.type.shape, itemsize(v.type.dtype), self.mesh, made, want))

    def movable(self, g: Op | None) -> bool:
        if g is None or g.kind == LOOP or len(g.results) != 1:
            return False
        opdef = registry.get(g.kind)
        return not opdef.constraint and all(x in self.local.produced for x in g.operands)

    def implied(self, g: Op, want: Sharding) -> list[Sharding] | None:
        """g's operands' layouts for its result to come out in `want` with no communication after
        (None where `want` splits a factor that only a halo or a pending reduction could split)."""
        rule = op_rule(g)
        fa = project(rule.results[0], want.dims, rule.sizes, self.mesh, g.result.type.shape)
        if any(rule.kinds[f] in (PERMUTATION, REDUCTION, REPLICATE) for f, axes in fa.items() if axes):
            return None
        if not valid(rule, fa, self.mesh) or unproject(rule.results[0], fa, rule.sizes, self.mesh) != want.dims:
            return None
        return [Sharding(unproject(t, fa, rule.sizes, self.mesh)) for t in rule.operands]

    def first(self, g: Op) -> float:
        """What the first plan spent on g: its collectives and local work."""
        ins = [self.local.produced[x].closed() for x in g.operands]
        work = local_work(g, ins, [self.local.produced[g.result]], self.mesh)
        return self.own.get(g, 0.0) + work / FLOPS_PER_BYTE

    def own_use(self, x: Value) -> bool:
        """x is made by a top-level op and used once (by the op walked from)."""
        return self.local.users.get(x, 0) == 1 and x in self.top

    def spent(self, v: Value, depth: int) -> float:
        """What the first plan spends on v's producer and the ops above it that a walk of `depth`
        could move."""
        g = self.top.get(v)
        if depth == 0 or not self.movable(g):
            return 0.0
        return self.first(g) + sum(self.spent(x, depth - 1) for x in g.operands if self.own_use(x))

    def cost(self, v: Value, want: Sharding, depth: int,
             others: tuple[Sharding, ...] = ()) -> tuple[float, float, dict[Value, Sharding]]:
        """(cheapest cost of v in `want`, and in each of `others` for other uses, what the first
        plan spends on v's movable ops, the values to plan in new layouts for the cheapest)."""
        g = self.top.get(v)
        after = self.reshard(v, want) + sum(self.reshard(v, o) for o in others)
        if depth == 0 or not self.movable(g):
            return after, 0.0, {}
        ins = self.implied(g, want)
        if ins is None:
            spent = self.spent(v, depth)
            return after + spent, spent, {}
        spent = self.first(g)
        moved_cost = local_work(g, ins, [want], self.mesh) / FLOPS_PER_BYTE
        moved_cost += sum(self.reshard(v, o, want) for o in others)
        moved = {v: want}
        for x, lx in zip(g.operands, ins):
            if self.own_use(x):
                c, s, m = self.cost(x, lx, depth - 1)
                spent += s
                moved.update(m)
            else:
                c = self.reshard(x, lx)
            moved_cost += c
        keep = after + spent
        if moved_cost + _MARGIN < keep:
            return moved_cost, spent, moved
        return keep, spent, {}


def consumer_layouts(p) -> dict[Value, Sharding]:
    """The values of partitioner `p`'s (first) plan worth planning in their consumers' layout:
    value -> layout (empty where no move is estimated to save anything)."""
    local = p.local
    walk = None
    out: dict[Value, Sharding] = {}
    for v, asks in p.demands.items():
        made = local.produced.get(v)
        # a pending sum is settled or not by the strategies (and the combined-settlement plan)
        if len(asks) != local.users.get(v, 0) or made is None or made.partial or v in out:
            continue
        wants: list[Sharding] = []
        for a in asks:
            if not any(same(a, w) for w in wants):
                wants.append(a)
        if any(w.partial for w in wants) or all(same(made, w) for w in wants):
            continue
        walk = walk or _Walk(p)
        if not walk.movable(walk.top.get(v)) or not any(walk.reshard(v, w) > 0 for w in wants):
            continue
        # make v in one of the layouts its uses want, each other use resharding from there
        best = None
        for w in wants:
            if same(made, w):
                continue
            others = tuple(o for o in wants if o is not w)
            c, _, moved = walk.cost(v, w, MAX_DEPTH, others)
            if moved and (best is None or c < best[0]):
                best = (c, moved)
        for u, s in (best[1] if best else {}).items():
            out.setdefault(u, s)
    return out
