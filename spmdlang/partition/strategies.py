"""Factor strategies: the ways to run one op under its factor rule, and what each costs.

A strategy splits each factor of the op's rule over some mesh axes (or none); it implies the
layout every operand is resharded to and every result comes out in (a reduction factor split
leaves the result a pending sum over its axes), and costs the bytes resharded in and out (to the
result's planned layout) plus the local work. Candidates per factor come from the operands'
current layouts and the result's planned one; `best` searches their product.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from ..ir import registry
from ..ir.collectives import spec
from ..ir.core import Op
from ..ir.mesh import Mesh, Sharding, local_shape
from ..ir.types import itemsize
from .cost import FLOPS_PER_BYTE, comm_cost, step_cost
from .emitter import LocalState
from .factors import PERMUTATION, REDUCTION, REPLICATE, FactorRule, project, unproject
from .reshard import Step, plan_reshard

_MAX_CANDIDATES = 512


@dataclass(frozen=True, eq=False)
class FactorPlan:
    """One strategy for an op: factor -> axes (`fa`), the operands' required layouts (`reqs`), the
    results' layouts (`outs`), the reshard steps in and out (`steps`) and the one that settles the
    result's pending sum in a combinable reduction, if one does (`settle`)."""

    score: float  # bytes resharded (with latency steps) + work / FLOPS_PER_BYTE: the planner's unit
    work: float  # local FLOPs plus elements written
    fa: dict[int, tuple[str, ...]]
    reqs: list[Sharding]
    outs: list[Sharding]
    steps: list[Step]
    settle: Step | None

    @property
    def key(self) -> tuple[float, float]:
        """Plans rank by score, then by less local work."""
        return self.score, self.work

    def whole_step(self) -> float:
        """The plan on the whole step (partition.cost.step_cost): its settlement's latency is shared."""
        return step_cost(self.steps, shared=self.settle) + self.work / FLOPS_PER_BYTE


def settlement(steps: list[Step], partial, reduce: str) -> Step | None:
    """The one collective of `steps` if they settle the pending sum over `partial` as a single
    all_reduce or reduce_scatter (which the combiner can merge with others), else None."""
    collectives = [s for s in steps if s.is_collective]
    if not partial or reduce != "sum" or len(collectives) != 1:
        return None
    (st,) = collectives
    if not spec(st.kind).settles or set(st.axes) != set(partial):
        return None
    return st


def valid(rule: FactorRule, fa, mesh: Mesh) -> bool:
    """Every tensor can express the factor split (no axes lost to non-contiguous dims)."""
    return layouts(rule, fa, mesh) is not None


def layouts(rule: FactorRule, fa, mesh: Mesh) -> list | None:
    """Each tensor's dims' axes under the factor split (operands, then results), or None where
    some tensor cannot express it (see `valid`)."""
    if not rule.multi_factor_dims:  # a dim of one factor holds its axes whole: every split is expressed
        return [unproject(t, fa, rule.sizes, mesh) for t in rule.tensors]
    out = []
    for t in rule.tensors:
        dims = unproject(t, fa, rule.sizes, mesh)
        got = [a for d in dims for a in d]
        want = [a for fs in t for f in fs for a in fa.get(f, ())]
        if sorted(got) != sorted(want):
            return None
        out.append(dims)
    return out


def local_work(op: Op, reqs, outs, mesh: Mesh) -> float:
    """The local work of running `op` on operands laid out as `reqs`, its results as `outs`: its
    FLOPs plus the elements it writes (so that even data movement prefers running on shards to
    running replicated and slicing afterwards). The partitioner and autoshard weigh it alike."""
    return _local_work(op, [s.dims for s in reqs], [s.dims for s in outs], mesh)


def _local_work(op: Op, in_dims, out_dims, mesh: Mesh, local_types: dict | None = None) -> float:
    """local_work from the tensors' dims' axes alone (all a local shape reads of a layout);
    `local_types`: (global type, dims) -> local type, answers kept between calls."""
    def local(t, dims):
        if local_types is None:
            return t.with_shape(local_shape(t.shape, dims, mesh))
        got = local_types.get((t, dims))
        if got is None:
            got = local_types[t, dims] = t.with_shape(local_shape(t.shape, dims, mesh))
        return got

    out_types = [local(r.type, d) for r, d in zip(op.results, out_dims)]
    work = registry.get(op.kind).count_flops([local(v.type, d) for v, d in zip(op.operands, in_dims)], out_types,
                                             op.attrs)
    return work + sum(t.size for t in out_types)


def _signature(op: Op):
    """What `best` reads of the op itself: its kind, attributes and types (so its factor rule), so
    that repeated layers (same shapes, same layouts) search once (train_transformer: 482 questions,
    112 different; pipeline 144, 36). The op itself where an attribute is unhashable."""
    key = (op.kind, tuple(sorted(op.attrs.items())), tuple(v.type for v in op.operands),
           tuple(r.type for r in op.results))
    try:
        hash(key)
    except TypeError:
        return op
    return key


class Strategies:
    """The strategies of ops over the partitioner's local state; `passing` holds the values whose
    pending sums flow on into the next step (not charged as settled where they are made)."""

    def __init__(self, local: LocalState, passing: set, memo: dict | None = None):
        self.local, self.mesh, self.passing = local, local.mesh, passing
        # the answers of `best`, keyed by everything they read (see `_question`): one per
        # partition() call, shared by its plans (a second plan asks most of the first's questions
        # again, and a loop body partitioned twice asks all of them)
        self.memo = {} if memo is None else memo
        # the local types _local_work weighs: the splits of an op, and the ops of a layer, ask for
        # the same few (train_mlp: 216 asked, 9 different)
        self.local_types: dict = {}

    def _question(self, op: Op, forbid, settling: bool) -> tuple:
        """What `best` reads besides the op itself: its operands' current layouts, its results'
        planned layouts, which results pass their pending sums on, and its arguments."""
        local = self.local
        sig = self.memo.get(op)  # (the memo's keys are questions, and ops: their signatures)
        if sig is None:
            sig = self.memo[op] = _signature(op)
        return (sig, forbid, settling, tuple(local.layout(v) for v in op.operands),
                tuple(local.target(r) for r in op.results), tuple(r in self.passing for r in op.results))

    def candidates(self, op: Op, rule: FactorRule, forbid) -> list[list[tuple[str, ...]]]:
        """Per factor, the axes splits to try: none, and each operand's or result's current one."""
        opdef = registry.get(op.kind)
        tensors = list(op.operands) + list(op.results)
        layouts = [self.local.layout(v).dims for v in op.operands] + [self.local.target(r).dims for r in op.results]
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

    def best(self, op: Op, rule: FactorRule, forbid, settling: bool = False):
        """The cheapest FactorPlan; with `settling`, (it, the plan cheapest on the whole step
        (partition.cost: STEP_BYTES per latency step) among those whose result is a pending sum
        settled by one combinable reduction, or None if none is)."""
        key = self._question(op, forbid, settling)
        found = self.memo.get(key)
        if found is None:
            found = self.memo[key] = self._best(op, rule, forbid, settling)
        return found

    def _best(self, op: Op, rule: FactorRule, forbid, settling: bool):
        cands = self.candidates(op, rule, forbid)
        total = 1
        for c in cands:
            total *= len(c)
        if total > _MAX_CANDIDATES:  # keep the two most promising per factor (longest splits)
            cands = [sorted(c, key=len, reverse=True)[:2] + ([()] if () not in c[:2] else []) for c in cands]
        mode = registry.get(op.kind).partial_mode(op.attrs)
        partials = [self.local.layout(v) for v in op.operands]
        keep_options = [False, True] if mode is not None and any(s.partial for s in partials) else [False]
        # The plans rank by (score, work), the first of equals kept (in the order of the splits,
        # then of keep_options); with `settling`, the settling ones by (whole_step, that order).
        # A plan's local work is known before its reshards are planned, and bounds both from
        # below (score and whole_step are its work / FLOPS_PER_BYTE plus a cost of collectives,
        # never negative): the splits are weighed least work first, and one whose bound already
        # ranks behind the plan found (and cannot settle, or ranks behind the settling one too)
        # is not planned. The same plans are chosen; what is skipped is planning the reshards of
        # splits that cannot win (gathers to replicated, mostly), most of the partitioner's time.
        splits = []
        n = len(rule.operands)
        for combo in itertools.product(*cands):
            used = [a for axes in combo for a in axes]
            if len(used) != len(set(used)):
                continue
            fa = {f: axes for f, axes in enumerate(combo) if axes}
            dims = layouts(rule, fa, self.mesh)
            if dims is None:
                continue
            work = _local_work(op, dims[:n], dims[n:], self.mesh, self.local_types)
            splits.append((work / FLOPS_PER_BYTE, work, len(splits), fa, dims))
        splits.sort(key=lambda s: (s[0], s[1], s[2]))
        reduced = [f for f, kind in enumerate(rule.kinds) if kind == REDUCTION]
        best = settle = None
        best_rank = settle_rank = None  # (score, work, order) of best; (whole_step, order) of settle
        for bound, work, i, fa, dims in splits:
            for keep in keep_options:
                order = 2 * i + keep
                # (a plan settles only a pending sum: of a split reduction factor, or one kept)
                can_settle = settling and (keep or any(f in fa for f in reduced))
                if best_rank is not None and (bound, work, order) > best_rank and not (
                        can_settle and (settle_rank is None or (bound, order) < settle_rank)):
                    continue
                plan = self.plan(op, rule, fa, keep, mode, partials, dims, work)
                if plan is None:
                    continue
                rank = (plan.score, plan.work, order)
                if best_rank is None or rank < best_rank:
                    best, best_rank = plan, rank
                if settling and plan.settle is not None:
                    whole = plan.whole_step()
                    if settle_rank is None or (whole, order) < settle_rank:
                        settle, settle_rank = plan, (whole, order)
        assert best is not None, f"no way to partition {op.kind}"
        return (best, settle) if settling else best

    def kept_sum(self, op: Op, fa, mode, partials) -> tuple[str, ...] | None:
        """The axes of the operands' pending sum the op keeps pending (running on the partial
        values: it is linear in them), or None where it may not."""
        holders = [i for i, s in enumerate(partials) if s.partial]
        allowed = registry.get(op.kind).partial_operands
        first = partials[holders[0]]
        if first.partial_op != "sum":
            return None
        if mode == "additive":
            if len(holders) != len(partials) or any(set(partials[i].partial) != set(first.partial) for i in holders):
                return None
        elif mode == "multilinear":
            if len(holders) != 1 or (allowed is not None and holders[0] not in allowed):
                return None
        if any(a in first.partial for axes in fa.values() for a in axes):
            return None
        return first.partial

    def plan(self, op: Op, rule: FactorRule, fa, keep: bool, mode, partials, dims=None,
             work=None) -> FactorPlan | None:
        """Cost and layouts of running `op` with factor split `fa` (`dims`: its `layouts`, and
        `work`: its local work, where the caller has them); None if not allowed."""
        opdef = registry.get(op.kind)
        if dims is None:
            dims = [unproject(t, fa, rule.sizes, self.mesh) for t in rule.tensors]
        kept: tuple[str, ...] = ()
        if keep:
            kept = self.kept_sum(op, fa, mode, partials)
            if kept is None:
                return None
        reduced = tuple(a for f, axes in sorted(fa.items()) if rule.kinds[f] == REDUCTION for a in axes)
        red_op = opdef.reduce_kind or "sum"
        if kept and reduced and red_op != "sum":
            return None
        reqs = []
        steps: list[Step] = []
        for i, v in enumerate(op.operands):
            req = Sharding(dims[i], kept if (keep and partials[i].partial) else (), frozenset(), "sum")
            reqs.append(req)
            steps += plan_reshard(v.type.shape, itemsize(v.type.dtype), self.mesh, self.local.layout(v), req)
        outs = []
        settle = None
        n = len(rule.operands)
        for j, r in enumerate(op.results):
            partial = self.mesh.order(set(kept) | set(reduced))
            out = Sharding(dims[n + j], partial, frozenset(), red_op if reduced else "sum")
            outs.append(out)
            if r in self.passing:  # the next step reshards it (or takes its pending sum on): charged there
                continue
            after = plan_reshard(r.type.shape, itemsize(r.type.dtype), self.mesh, out, self.local.wanted(r))
            settle = settle or settlement(after, partial, out.partial_op)
            steps += after
        if work is None:
            work = local_work(op, reqs, outs, self.mesh)
        return FactorPlan(comm_cost(steps) + work / FLOPS_PER_BYTE, work, fa, reqs, outs, steps, settle)
