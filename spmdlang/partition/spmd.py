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

The rooms: partition.emitter (the local state, and the reshard emitter writing the one Ledger,
partition.ledger), partition.strategies (FactorPlan: the ways to run one op, and their costs),
partition.loops (loop bodies), partition.settlement (the combined-settlement second plan). This
module runs them over the program and gives custom steps their one API, `OpContext`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..ir import registry
from ..ir.collectives import CollectiveKind
from ..ir.core import LOOP, Op, Param, Program, Result, Value
from ..ir.mesh import Mesh, Sharding
from .consumer import consumer_layouts
from .emitter import Emitter, LocalOps, LocalState
from .factors import REDUCTION, FactorRule
from .ledger import Collective, Ledger
from .loops import partition_loop
from .propagate import Propagation, op_rule
from .settlement import choose, joinable
from .strategies import FactorPlan, Strategies

__all__ = ["Collective", "OpContext", "SpmdProgram", "partition", "step_time"]


@dataclass
class SpmdProgram:
    program: Program  # the per-partition program
    in_shardings: tuple[Sharding, ...]
    out_shardings: tuple[Sharding, ...]
    ledger: list[Collective] = field(default_factory=list)
    notes: dict[Op, str] = field(default_factory=dict)
    global_program: Program | None = None
    produced: dict[Value, Sharding] = field(default_factory=dict)  # each global value as computed
    layouts: dict[Value, Sharding] = field(default_factory=dict)  # values planned in their consumers' layout
    # partition.combine.finish's result for this program, kept by it: partition() weighs a plan
    # finished, and the pipeline's finish pass then takes the plan kept without redoing it
    finished: SpmdProgram | None = field(default=None, init=False, repr=False, compare=False)


class Partitioner:
    """One plan of the program: its local state, emitter and ledger, and the strategies it chose.
    `settle`: (second plan) the ops whose pending sum is settled in a combined reduction;
    `layouts`: (second plan) values planned in their consumers' layout (partition.consumer);
    `memo`: the strategies' answers, shared by the plans of one partition() (Strategies.best)."""

    def __init__(self, prog: Program, prop: Propagation, settle: frozenset[Op] = frozenset(),
                 layouts: dict[Value, Sharding] | None = None, memo: dict | None = None):
        self.prog, self.mesh = prog, prog.mesh
        self.local = LocalState(prog, prop.shardings)
        self.layouts = dict(layouts or {})
        self.local.planned.update(self.layouts)
        self.demands: dict[Value, list[Sharding]] = {}  # top-level value -> the layouts its uses asked for
        self.ledger = Ledger()
        self.em = Emitter(self.local, self.ledger)
        self.passing: set[Value] = set()  # intermediates of custom steps whose pending sums flow on
        self.strategies = Strategies(self.local, self.passing, memo)
        self.settle = settle
        self.settle_wanted: list[tuple[Op, tuple]] = []  # ops that would rather settle: (op, combining key)

    def run(self) -> SpmdProgram:
        local, em = self.local, self.em
        params = []
        for p in self.prog.params:
            s = local.target(p.value)
            lv = Value(local.local_type(p.value.type, s), p.name)
            params.append(Param(lv, p.name, s, p.span))
            local.state[p.value] = (lv, s)
        for op in self.prog.ops:
            em.current, em.span = op, op.span
            em.scope.builder.backward = op.backward
            self.partition_op(op)
        results, outs = [], []
        for r in self.prog.results:
            em.current, em.span = None, r.span
            em.scope.builder.backward = False
            s = local.wanted(r.value)
            self.demands.setdefault(r.value, []).append(s)
            results.append(Result(em.reshard(r.value, s, "for the result"), s, r.span))
            outs.append(s)
        local_prog = Program(self.prog.name, self.mesh, tuple(params), tuple(em.scope.builder.ops), tuple(results),
                             (), self.prog.source, local=True)
        for p in self.prog.params:
            local.produced[p.value] = local.target(p.value)
        return SpmdProgram(local_prog, tuple(p.sharding for p in params), tuple(outs), self.ledger.entries,
                           self.ledger.notes, self.prog, local.produced, self.layouts)

    def partition_op(self, op: Op) -> None:
        if op.kind == LOOP:
            partition_loop(self, op)
            self._settle_shared(op, "once after the loop, for its several uses")
            return
        opdef = registry.get(op.kind)
        if opdef.constraint:
            out = self.local.wanted(op.result)
            if not self.em.frames:
                self.demands.setdefault(op.operands[0], []).append(out)
            self.local.state[op.result] = (self.em.reshard(op.operands[0], out, "for shard()"), out)
        elif opdef.partition is not None:
            opdef.partition(OpContext(self, op))
        else:
            self.generic(op)
        self._settle_shared(op, "once for its several uses")

    def _settle_shared(self, op: Op, why: str) -> None:
        """A pending sum with several consumers (an accumulated sum) is settled once, to the planned
        layout; unless each of its uses leads into a loop's accumulation (`passing`: the slices of
        a concatenated weight's gradient), whose carries are settled once after the loop."""
        for r in op.results:
            _, s = self.local.state[r]
            self.local.produced[r] = s
            if s.partial and self.local.users.get(r, 0) > 1 and r not in self.passing:
                want = self.local.wanted(r)
                self.local.state[r] = (self.em.reshard(r, want, why), want)

    # ------------------------------------------------------------------ generic factor partitioning

    def generic(self, op: Op, forbid: frozenset[int] = frozenset()) -> None:
        rule = op_rule(op)
        self.execute(op, rule, choose(self, op, rule, forbid))

    def execute(self, op: Op, rule: FactorRule, plan: FactorPlan) -> None:
        """Reshard the operands as `plan` requires (masking the padding of split reduction
        factors with the reduction's identity) and run the op on local shapes."""
        opdef = registry.get(op.kind)
        if op is self.em.current and not self.em.frames:
            for v, req in zip(op.operands, plan.reqs):
                self.demands.setdefault(v, []).append(req.closed())
        locals_ = []
        why = f"for {op.kind}"
        if op.results[0] in self.layouts:  # partition.consumer: run where the result's uses want it
            why += f" (run in the layout its result's uses want, {self.layouts[op.results[0]]})"
        for i, (v, req) in enumerate(zip(op.operands, plan.reqs)):
            x = self.em.reshard(v, req, why)
            for f in plan.fa:
                d = rule.factor_dims(i, f)
                if rule.kinds[f] != REDUCTION or d is None:
                    continue
                x = self.em.mask(x, d, req.dims[d], v.type.shape[d], opdef.reduce_fill(v.type.dtype))
            locals_.append(x)
        shapes = [o.local_shape(r.type.shape, self.mesh) for o, r in zip(plan.outs, op.results)]
        attrs = dict(op.attrs)
        if opdef.localize is not None:
            attrs = opdef.localize(attrs, [x.type for x in locals_], shapes)
        results = self.em.scope.builder.emit_op(op.kind, locals_, attrs, op.span, [r.name for r in op.results])
        for r, lr, o, shape in zip(op.results, results, plan.outs, shapes):
            assert lr.type.shape == tuple(shape), (op.kind, lr.type, shape)
            self.local.state[r] = (lr, o)

    def trial(self, op: Op, target: Sharding, layouts: dict[Value, Sharding]) -> tuple[float, Sharding]:
        """What-if for custom steps choosing between decompositions: (cost in the planner's unit,
        result layout) of partitioning `op` generically with its result planned as `target`, where
        operands not computed yet have the layouts in `layouts`. Emits nothing and plans nothing."""
        state, planned = self.local.state, self.local.planned
        added = [v for v in layouts if v not in state]
        for v in added:
            state[v] = (None, layouts[v])
        r = op.results[0]
        old = planned.get(r)
        planned[r] = target
        try:
            plan = self.strategies.best(op, op_rule(op), frozenset())
        finally:
            for v in added:
                del state[v]
            if old is None:
                del planned[r]
            else:
                planned[r] = old
        return plan.score, plan.outs[0]

    def step(self, op: Op, target: Sharding | None = None) -> None:
        """Partition `op`, one step of a custom decomposition (not an op of the global program),
        generically; its result planned as `target` (None: as propagation planned it)."""
        if target is not None:
            self.local.planned[op.results[0]] = target
        self.generic(op)


class OpContext(LocalOps):
    """What an op's custom `partition` step (OpDef.partition) gets: the op, its operands' local
    values and layouts, the planned layouts of its results, and the emission helpers (LocalOps:
    constant, slice_dim, pad_dim, fill_dim, mask, affine_index, offset). The step must call
    `set_result` for every result, or hand the op to `generic`.

    Everything it emits goes into the one per-partition program, with the op's source span;
    collectives go through `collective` (or `reshard`/`window`), so the ledger sees them.
    """

    def __init__(self, p: Partitioner, op: Op):
        self._p, self._local, self._em, self.op = p, p.local, p.em, op
        self.mesh: Mesh = p.mesh
        self.attrs = op.attrs
        # emission, as the partitioner's emitter does it
        self.emit, self.emit_multi, self.axis_index = self._em.emit, self._em.emit_multi, self._em.axis_index

    def rule(self) -> FactorRule:
        return op_rule(self.op)

    def layout(self, i: int) -> Sharding:
        """The current layout of operand i (a pending sum included)."""
        return self._local.layout(self.op.operands[i])

    def target(self, j: int = 0) -> Sharding:
        """The layout propagation planned for result j (no pending sum)."""
        return self._local.wanted(self.op.results[j])

    def local_shape(self, v: Value, s: Sharding) -> tuple[int, ...]:
        return s.local_shape(v.type.shape, self.mesh)

    # ---- the rest of the global program (for steps that share work between ops)

    def operand_local(self, i: int) -> Value:
        """Operand i's local value as it is now (in `layout(i)`)."""
        return self._local.state[self.op.operands[i]][0]

    def producer(self, v: Value) -> Op | None:
        """The global op that computes v (None for a parameter)."""
        return self._local.producer.get(v)

    def users(self, v: Value) -> list[Op]:
        """The global ops that use v, in program order."""
        return self._local.user_ops(v)

    def is_result(self, v: Value) -> bool:
        return any(r.value is v for r in self._p.prog.results)

    def layout_of(self, v: Value) -> Sharding | None:
        """The current layout of an already partitioned global value (None if not yet)."""
        got = self._local.state.get(v)
        return got[1] if got else None

    def target_of(self, v: Value) -> Sharding:
        """The layout propagation planned for any global value."""
        return self._local.target(v)

    def reshard_value(self, v: Value, want: Sharding) -> Value:
        """Any already partitioned global value laid out as `want`, for this op."""
        return self._em.reshard(v, want, f"for {self.op.kind}")

    @property
    def memo(self) -> dict:
        """Work custom steps share across ops (one halo exchange for several slices)."""
        return self._em.scope.memo

    # ---- getting operands, giving results

    def reshard(self, i: int, want: Sharding, why: str = "") -> Value:
        """Operand i's local value laid out as `want` (collectives logged as for this op, with
        `why` added to their reason where the step has one to give)."""
        if self.op is self._em.current and not self._em.frames:  # what this use wants (partition.consumer)
            self._p.demands.setdefault(self.op.operands[i], []).append(want.closed())
        return self._em.reshard(self.op.operands[i], want, f"for {self.op.kind}" + (f": {why}" if why else ""))

    def set_result(self, local: Value, s: Sharding, j: int = 0) -> None:
        """Result j is `local`, laid out as s (which may owe a pending sum)."""
        r = self.op.results[j]
        assert local.type.shape == s.local_shape(r.type.shape, self.mesh), (self.op.kind, local.type, s)
        self._local.state[r] = (local, s)

    def generic(self, forbid=frozenset()) -> None:
        """Partition the op by its factor rule instead (never splitting the factors in `forbid`)."""
        self._p.generic(self.op, frozenset(forbid))

    def trial(self, op: Op, target: Sharding, layouts: dict[Value, Sharding]) -> tuple[float, Sharding]:
        """(cost, result layout) of partitioning `op` (a step of a decomposition of this op, over
        this op's operands and earlier steps' results, whose layouts are in `layouts`) generically
        with its result planned as `target`, in the cost model's unit; emits nothing."""
        return self._p.trial(op, target, layouts)

    def step(self, op: Op, target: Sharding | None = None) -> None:
        """Partition one step of a decomposition of this op generically (its result planned as
        `target`; the last step must produce this op's result, as propagation planned it)."""
        self._p.step(op, target)

    # ---- communication

    def collective(self, kind: CollectiveKind, x: Value, reason: str, **attrs) -> Value:
        """One collective over attrs["axes"], logged in the ledger with `reason` for this op."""
        return self._em.collective(kind, x, f"{reason} for {self.op.kind}", **attrs)

    def window(self, x: Value, dim: int, in_axes, out_axes, n: int, w, first: bool = True) -> Value:
        """See partition.halo: the input elements this device's output shard needs on `dim`
        (`first`: `x` is not a window of another dim already)."""
        from .halo import window

        return window(self, x, dim, in_axes, out_axes, n, w, f"halo of %{self.op.operands[0].name or 'operand'}",
                      first)


def partition(prog: Program, prop: Propagation, layouts: dict[Value, Sharding] | None = None,
              settlements: bool = True) -> SpmdProgram:
    """Partition the global program under its propagated shardings (and `layouts`: values planned
    in other layouts than propagation gave them). Pure: `prop` is read only. `settlements=False`
    leaves out the combined-settlement plan, for a caller that replays the plan from its values'
    layouts alone (ops.contract.chain_order), which cannot replay a settlement.

    Where an op's pending sum (a weight gradient) would rather be settled in a combined reduction
    than have its operands gathered (partition.cost, "Combined reductions"), and the first plan
    has another reduction over the same group that it can join, the step is planned a second time
    settling there (partition.settlement); the plan with the lower modelled step time is kept.
    Before that, where values' uses all want them in a layout that running their producers in it
    gives cheaper than resharding after (partition.consumer), the step is planned with those
    values in their consumers' layouts, and kept where its modelled step time is lower."""
    memo: dict = {}
    first = Partitioner(prog, prop, layouts=layouts, memo=memo)
    spmd = first.run()
    moved = consumer_layouts(first)
    if moved:
        second = Partitioner(prog, prop, layouts={**(layouts or {}), **moved}, memo=memo)
        other = second.run()
        if step_time(other) < step_time(spmd):
            first, spmd = second, other
    settle = joinable(first) if settlements else None
    if not settle:
        return spmd
    other = Partitioner(prog, prop, frozenset(settle), first.layouts, memo).run()
    return other if step_time(other) < step_time(spmd) else spmd


def step_time(spmd: SpmdProgram) -> float:
    """Modelled time of a plan after combining (partition.combine), on the planning machine
    (partition.cost.step_time_us: a collective in a loop body counts once per iteration)."""
    from .combine import finish
    from .cost import flops, step_time_us

    done = finish(spmd)
    return step_time_us(done.ledger, done.program.mesh, flops(done.program))
