"""Auto-sharding search over the global IR: per-op strategies from the factor rules, edge costs
from the reshard planner, one integer linear program (Alpa, OSDI 2022), or a greedy pass.

The graph. Every parameter and every op of the canonical global program is a unit. A unit's
strategies:
  parameter   every layout of it (each mesh axis on at most one dim, dims split evenly); an
              annotated parameter has exactly its annotation
  op          every assignment of mesh axes to the factors of its FactorRule that the partitioner
              could run (pass factors, and reduction factors of ops with a reduce kind: the
              result is then `partial`), each factor split evenly; a shard() constraint keeps only
              those that agree with its spec
A strategy fixes the layout each operand is wanted in, the layout of each result (pending sums
included) and the op's local work.
Costs are the cost model's (partition.cost): local work at FLOPS_PER_BYTE, as the partitioner
weighs an op's candidates, and on every edge producer -> consumer the reshard planner's cheapest
plan from the producer's result layout to the layout the consumer wants (`comm_cost`).

Reductions that keep the problem small:
  - elementwise chains: an elementwise op whose first full-shape operand comes from another unit
    follows that unit's strategy (it adopts the producer's layout, settling any pending sum), so
    a chain of them adds no variables;
  - identical layers: ops with the same source span, kind, types and attributes (a `for` body
    unrolled, a function inlined twice) share one set of strategy variables, and the edges
    between two such groups add up into one cost matrix: a 12-layer stack is one layer's problem.

The program. One binary x[g, s] per group g and strategy s, sum_s x[g, s] = 1; per edge between
groups a and b, continuous e[I, J] >= 0 over classes of strategies with equal cost rows/columns,
with sum_J e[I, J] = sum_{i in I} x[a, i] and sum_I e[I, J] = sum_{j in J} x[b, j] (Alpa's
linearisation of x[a, i] * x[b, j], aggregated); minimise node costs plus edge costs; the
parameters' bytes per device are at most the memory budget. Solved by HiGHS through
scipy.optimize.milp. Over MAX_ILP_VARIABLES, or without scipy, a greedy pass and coordinate
descent find a plan instead. Everything is ordered by program position: the output is
deterministic.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

import numpy as np

from ..ir import registry
from ..ir.core import LOOP, Loop, Program, Value, walk
from ..ir.mesh import Mesh, Sharding
from ..ir.types import itemsize
from ..partition.cost import FLOPS_PER_BYTE, LATENCY_BYTES, PLANNING, latency_steps
from ..partition.factors import PASS, REDUCTION, FactorRule, project, unproject
from ..partition.propagate import op_rule
from ..partition.reshard import plan_reshard

MAX_ILP_VARIABLES = 200_000  # above this, the greedy search
MAX_STRATEGIES = 32  # per unit: the replicated one and the most sharded
TIE_DEPTH = 4  # identical layers: ops alike this many producers up (see _signatures)
TIME_LIMIT_S = 120.0  # a safety net only: the answer must not depend on the machine's speed
MIP_REL_GAP = 1e-3  # stop within 0.1% of the optimum's bound
# what one latency step of a collective costs in the search, in link bytes: the physical alpha * beta
# of the planning machine (tpu-v4: 1 us * 45 GB/s = 45,000 bytes), so that the objective is the
# modelled step time (partition.cost.step_time_us) in bytes. (The reshard planner's own
# LATENCY_BYTES is a tie-breaker; with it the search would trade ten small collectives for
# a few bytes, and the compiled plan would model slower than the one it replaced.)
PHYSICAL_LATENCY_BYTES = PLANNING.latency_us * PLANNING.bandwidth_gbps * 1e3


def _comm(steps, latency_bytes: float) -> float:
    return sum(s.bytes + latency_bytes * latency_steps(s.kind, s.group) for s in steps)


@dataclass(frozen=True)
class View:
    """One unit under one strategy of its group."""

    reqs: tuple[Sharding, ...]  # the layout wanted for each operand
    outs: tuple[Sharding, ...]  # each result's layout (pending sums included)
    work: float  # local work, in the planner's unit


@dataclass
class Group:
    key: object
    roots: list = field(default_factory=list)  # units whose strategies are this group's
    units: list = field(default_factory=list)  # all units, followers included
    n: int = 0
    node_cost: list[float] = field(default_factory=list)
    param_bytes: list[float] = field(default_factory=list)


@dataclass
class Solution:
    choice: dict[int, int]  # group index -> strategy
    cost: float  # the search's objective (planner units)
    solver: str  # "ilp" or "greedy"
    seconds: float


@dataclass
class Problem:
    program: Program
    mesh: Mesh
    views: dict  # unit -> list[View] (indexed by its group's strategy)
    group_of: dict  # unit -> group index
    groups: list[Group]
    edges: dict  # (group a, group b) -> cost matrix (list of rows), a < b in position
    constant: float = 0.0
    units: list = field(default_factory=list)

    @property
    def size(self) -> int:
        """Variables of the integer program (before aggregation of equal rows/columns)."""
        return sum(g.n for g in self.groups) + sum(m.size for m in self.edges.values())

    def sharding(self, unit, sol: Solution, result: int = 0) -> Sharding:
        return self.views[unit][sol.choice[self.group_of[unit]]].outs[result]

    def value_sharding(self, v: Value, sol: Solution) -> Sharding:
        unit, j = self.producer[v]
        return self.sharding(unit, sol, j)

    def evaluate(self, choice: dict[int, int]) -> float:
        total = self.constant + sum(g.node_cost[choice[i]] for i, g in enumerate(self.groups))
        for (a, b), m in self.edges.items():
            total += float(m[choice[a], choice[b]])
        return total

    def param_layouts(self, choice: dict[int, int]) -> tuple:
        """The layout of every parameter under `choice`."""
        return tuple(self.views[p][choice[self.group_of[p]]].outs[0] for p in self.program.params)

    def param_bytes(self, choice: dict[int, int]) -> float:
        return sum(g.param_bytes[choice[i]] for i, g in enumerate(self.groups) if g.param_bytes)


# ---------------------------------------------------------------------------------- strategies


def _axis_assignments(nfactors: int, ok, axes: list[str], mesh: Mesh, sizes):
    """Every map factor -> axes (mesh order) with each axis on at most one allowed factor and
    every factor split evenly."""
    out = []
    for combo in itertools.product(range(-1, nfactors), repeat=len(axes)):
        fa: dict[int, tuple[str, ...]] = {}
        good = True
        for a, f in zip(axes, combo):
            if f < 0:
                continue
            if not ok(f):
                good = False
                break
            fa[f] = fa.get(f, ()) + (a,)
        if not good:
            continue
        if all(sizes[f] % mesh.group_size(ax) == 0 for f, ax in fa.items()):
            out.append(fa)
    return out


def _valid(rule: FactorRule, fa, mesh: Mesh) -> bool:
    for t in rule.tensors:
        got = [a for d in unproject(t, fa, rule.sizes, mesh) for a in d]
        want = [a for fs in t for f in fs for a in fa.get(f, ())]
        if sorted(got) != sorted(want):
            return False
    return True


def _local(t, s: Sharding, mesh: Mesh):
    return t.with_shape(s.local_shape(t.shape, mesh))


def op_view(op, rule: FactorRule, fa, mesh: Mesh) -> View:
    opdef = registry.get(op.kind)
    reduced = mesh.order(a for f, axes in fa.items() if rule.kinds[f] == REDUCTION for a in axes)
    red_op = opdef.reduce_kind or "sum"
    reqs = tuple(Sharding(unproject(rule.operands[i], fa, rule.sizes, mesh)) for i in range(len(op.operands)))
    outs = tuple(Sharding(unproject(rule.results[j], fa, rule.sizes, mesh), reduced, frozenset(),
                          red_op if reduced else "sum") for j in range(len(op.results)))
    out_types = [_local(r.type, s, mesh) for r, s in zip(op.results, outs)]
    work = opdef.count_flops([_local(v.type, s, mesh) for v, s in zip(op.operands, reqs)], out_types, op.attrs)
    work += sum(t.size for t in out_types)
    return View(reqs, outs, work / FLOPS_PER_BYTE)


def op_views(op, rule: FactorRule, mesh: Mesh) -> list[View]:
    """The strategies of one op, the most sharded first (ties in enumeration order)."""
    opdef = registry.get(op.kind)
    axes = [a for a in mesh.names if mesh.axis_size(a) > 1]

    def ok(f):
        kind = rule.kinds[f]
        return kind == PASS or (kind == REDUCTION and opdef.reduce_kind is not None)

    if opdef.constraint:
        spec: Sharding = op.attrs["sharding"]
        cands = []
        for fa in _axis_assignments(len(rule.sizes), ok, axes, mesh, rule.sizes):
            if not _valid(rule, fa, mesh):
                continue
            dims = unproject(rule.results[0], fa, rule.sizes, mesh)
            if all(d == w if i not in spec.open_dims else d[: len(w)] == w
                   for i, (d, w) in enumerate(zip(dims, spec.dims))):
                cands.append(op_view(op, rule, fa, mesh))
        fixed = Sharding(spec.dims)
        if not any(v.outs[0] == fixed for v in cands):  # uneven or unusual: exactly as written
            work = op.result.type.size / FLOPS_PER_BYTE
            cands.insert(0, View((fixed,), (fixed,), work))
        return cands[:MAX_STRATEGIES]
    views, seen = [], {}
    for fa in _axis_assignments(len(rule.sizes), ok, axes, mesh, rule.sizes):
        if not _valid(rule, fa, mesh):
            continue
        v = op_view(op, rule, fa, mesh)
        k = (v.reqs, v.outs)
        if k in seen:  # the same layouts: keep the cheaper
            if v.work < views[seen[k]][0].work:
                views[seen[k]] = (v, len(set(fa)))
            continue
        seen[k] = len(views)
        views.append((v, len(set(fa))))
    if len(views) > MAX_STRATEGIES:
        # the least local work first; among equals, axes spread over more factors (data and model
        # parallel at once before two axes on one dim), then enumeration order
        order = sorted(range(1, len(views)), key=lambda i: (views[i][0].work, -views[i][1], i))
        views = [views[0]] + [views[i] for i in sorted(order[: MAX_STRATEGIES - 1])]
    return [v for v, _ in views]


def param_views(p, mesh: Mesh) -> list[View]:
    t = p.value.type
    if p.sharding is not None:
        return [View((), (Sharding(p.sharding.dims),), 0.0)]
    axes = [a for a in mesh.names if mesh.axis_size(a) > 1]
    out = []
    for combo in itertools.product(range(-1, t.rank), repeat=len(axes)):
        dims = [()] * t.rank
        for a, d in zip(axes, combo):
            if d >= 0:
                dims[d] = dims[d] + (a,)
        if all(n % mesh.group_size(ax) == 0 for n, ax in zip(t.shape, dims)):
            out.append(View((), (Sharding(tuple(dims)),), 0.0))
    return out


@dataclass(eq=False)
class _BodyParam:
    """A loop's index or one of its carries, as a unit of the search (laid out like a parameter)."""

    value: Value
    sharding: None = None


def _follower_view(op, rule: FactorRule, main: int, src: Sharding, mesh: Mesh) -> View:
    """An elementwise op in the layout of its main operand's producer (pending sums settled)."""
    dims = src.dims
    fa = project(rule.operands[main], dims, rule.sizes, mesh, op.operands[main].type.shape)
    return op_view(op, rule, fa, mesh)


def _attached_view(op, rule: FactorRule, want: Sharding, mesh: Mesh) -> View:
    """An op laid out as its one user wants its result (what its factors can hold of that)."""
    fa = project(rule.results[0], want.dims, rule.sizes, mesh, op.result.type.shape)
    fa = {f: a for f, a in fa.items() if rule.kinds[f] == PASS}
    if not _valid(rule, fa, mesh):
        fa = {}
    return op_view(op, rule, fa, mesh)


# ---------------------------------------------------------------------------------- the graph


def _signatures(units, producer, rules, depth: int) -> dict:
    """unit -> an id shared by the ops that are the same op of identical layers: the same source
    position, kind, types and factor rule, and so are their operands' producers, `depth` levels
    up (a parameter or a loop's carry is only itself). The same function called on different
    weights (one Adam update for a column-split and a row-split weight, the two layer norms of a
    block) is not one layer; the k-th op of layers 2..L of an unrolled stack is."""
    ids: dict = {}
    cur = {}
    for n, u in enumerate(units):
        k = _op_key(u, rules[u]) if u in rules else None
        cur[u] = ids.setdefault(k if k is not None else ("unit", n), len(ids))
    for _ in range(depth):
        nxt = {}
        for u in units:
            if u in rules:
                k = (cur[u], tuple((cur[producer[v][0]], producer[v][1]) if v in producer else None
                                   for v in u.operands))
                nxt[u] = ids.setdefault(k, len(ids))
            else:
                nxt[u] = cur[u]
        cur = nxt
    return {u: cur[u] for u in units if u in rules and _op_key(u, rules[u]) is not None}


def _op_key(op, rule):
    s = op.span
    if s is None:
        return None
    return (s.line, s.col, s.end_line, s.end_col, op.kind, tuple(str(v.type) for v in op.operands),
            tuple(str(r.type) for r in op.results), rule)


def build(prog: Program, tie_layers: bool = True, merge_elementwise: bool = True,
          attach_params: bool = True, latency_bytes: float = PHYSICAL_LATENCY_BYTES) -> Problem:
    """The search problem of `prog` (the module doc): units, their strategies, groups, costs."""
    b = _Build(prog, tie_layers, merge_elementwise, latency_bytes)
    b.add_units()
    b.attach(attach_params)
    b.follow()
    b.make_groups()
    b.make_views()
    b.node_costs()
    b.edge_costs()
    b.result_costs()
    prob = Problem(prog, b.mesh, b.views, b.group_of, b.groups, b.edges, 0.0, b.units)
    prob.producer = b.producer
    return prob


class _Build:
    """The state of `build`, filled in by its steps in order."""

    def __init__(self, prog: Program, tie_layers: bool, merge_elementwise: bool, latency_bytes: float):
        self.prog, self.mesh = prog, prog.mesh
        self.tie_layers, self.merge_elementwise, self.latency_bytes = tie_layers, merge_elementwise, latency_bytes
        self.producer: dict[Value, tuple] = {}
        self.units: list = []
        self.views: dict = {}
        self.root_of: dict = {}
        self.trips_of: dict = {}  # unit -> how many times it runs (the product of the enclosing loops' trips)
        self.rules: dict = {}
        self.ops: list = []  # every op, loop bodies included, loops themselves not
        # (carry unit, (initial value, next value), (trips at entry, trips of the back edge))
        self.carries: list = []
        self.attached: dict = {}  # op -> (its one user, operand index)
        self.attached_params: dict = {}  # parameter -> (its one user, operand index)
        self.main_of: dict = {}  # follower -> the operand whose producer it follows
        self.groups: list[Group] = []
        self.group_of: dict = {}
        self.edges: dict = {}

    def add_root(self, u, views, trips: int) -> None:
        self.units.append(u)
        self.views[u] = views
        self.root_of[u] = u
        self.trips_of[u] = trips

    def add_units(self) -> None:
        mesh = self.mesh
        for p in self.prog.params:
            self.producer[p.value] = (p, 0)
            self.add_root(p, param_views(p, mesh), 1)
        for op, trips in walk(self.prog.ops):
            if op.kind == LOOP:
                self.add_loop(op, trips)
                continue
            self.ops.append(op)
            self.units.append(op)
            self.trips_of[op] = trips
            self.rules[op] = op_rule(op)
            for j, r in enumerate(op.results):
                self.producer[r] = (op, j)

    def add_loop(self, op, trips: int) -> None:
        """A loop body is solved once: its ops are units like any other, their costs times the
        trip count; each carry is one unit with one layout at entry, in the body and at exit (as
        the partitioner carries it), its initial value resharded once and its next value once per
        iteration; a capture is read in its outer layout."""
        loop = Loop(op)
        idx = _BodyParam(loop.index)
        self.producer[loop.index] = (idx, 0)
        self.add_root(idx, [View((), (Sharding.replicated(loop.index.type.rank),), 0.0)], trips)
        for cap, outer in zip(loop.capture_params, loop.captures):
            self.producer[cap] = self.producer[outer]
        for init, carry, nxt, res in zip(loop.inits, loop.carries, loop.body.results, op.results):
            u = _BodyParam(carry)
            self.producer[carry] = self.producer[res] = (u, 0)
            self.add_root(u, [View((v.outs[0], v.outs[0]), v.outs, 0.0) for v in param_views(u, self.mesh)], trips)
            self.carries.append((u, (init, nxt), (trips, trips * loop.trips)))

    def attach(self, attach_params: bool) -> None:
        """A broadcast (or other layout op) of parameters or of nothing, used once, is laid out as
        its one user wants it; so is a parameter used once, unannotated, when `attach_params` (no
        memory budget: a layout other than the one it is used in would only add a reshard)."""
        self.consumers = [(op, op.operands, (self.trips_of[op],) * len(op.operands)) for op in self.ops]
        self.consumers += self.carries
        users: dict = {}
        for u, operands, _w in self.consumers:
            for i, v in enumerate(operands):
                users.setdefault(v, []).append((u, i))
        self.returned = {r.value for r in self.prog.results}
        for op in self.ops:
            opdef = registry.get(op.kind)
            if (self.merge_elementwise and opdef.family in ("layout", "create") and len(op.results) == 1
                    and op.result not in self.returned and len(users.get(op.result, [])) == 1
                    and all(hasattr(self.producer[v][0], "value") for v in op.operands if v in self.producer)):
                self.attached[op] = users[op.result][0]
        if attach_params:
            for p in self.prog.params:
                if p.sharding is None and p.value not in self.returned and len(users.get(p.value, [])) == 1:
                    self.attached_params[p] = users[p.value][0]
                    self.root_of[p] = None

    def follow(self) -> None:
        """Followers: elementwise ops adopt their main producer's strategy."""
        for op in self.ops:
            if op in self.attached:
                self.root_of[op] = None
                continue
            main = self.main_operand(op) if self.merge_elementwise else None
            if main is not None:
                self.main_of[op] = main
                self.root_of[op] = self.root_of[self.producer[op.operands[main]][0]]
            else:
                self.root_of[op] = op

    def main_operand(self, op) -> int | None:
        """The first full-shape operand of an elementwise op made by another op (a parameter's
        layout is its own choice: never follow one)."""
        opdef = registry.get(op.kind)
        if opdef.family != "elementwise" or len(op.results) != 1 or opdef.constraint:
            return None
        for i, v in enumerate(op.operands):
            src = self.producer.get(v, (None,))[0]
            if (v.type.shape == op.result.type.shape and src is not None and not hasattr(src, "value")
                    and src not in self.attached):
                return i
        return None

    def make_groups(self) -> None:
        """Groups of roots: identical layers share one."""
        by_key: dict = {}
        sigs = _signatures(self.units, self.producer, self.rules, TIE_DEPTH) if self.tie_layers else {}
        for u in self.units:
            if self.root_of[u] is not u:
                continue  # a follower, or attached
            key = sigs.get(u)
            if key is not None and key in by_key:
                g = by_key[key]
            else:
                g = len(self.groups)
                self.groups.append(Group(key if key is not None else ("unit", len(self.groups))))
                if key is not None:
                    by_key[key] = g
            self.groups[g].roots.append(u)
            self.group_of[u] = g
        for op in self.ops:
            if self.root_of[op] is not None and self.root_of[op] is not op:
                self.group_of[op] = self.group_of[self.root_of[op]]
        for op in reversed(self.ops):
            if op in self.attached:
                self.group_of[op] = self.group_of[self.attached[op][0]]
        for p, (user, _i) in self.attached_params.items():
            self.group_of[p] = self.group_of[user]

    def shared_views(self, op, other, index: int, make):
        """The views of `op` derived (by `make`) from the views of `other`: identical ops
        deriving from one list share one result."""
        k = (_op_key(op, self.rules[op]), id(self.views[other]), index) if self.tie_layers else None
        if k is None or k[0] is None or k not in self.followed:
            vs = [make(v) for v in self.views[other]]
            if k is not None and k[0] is not None:
                self.followed[k] = (vs, self.views[other])  # keeps the source list alive while its id is a key
        return vs if k is None or k[0] is None or k not in self.followed else self.followed[k][0]

    def make_views(self) -> None:
        """Views per unit, indexed by its group's strategy (program order: a follower's main
        producer first); equal lists become one object, so edge costs are computed once per pair."""
        mesh, views, rules = self.mesh, self.views, self.rules
        self.followed: dict = {}
        interned: dict = {}
        for op in self.ops:
            if op in self.attached:
                continue
            if op in self.main_of:
                main = self.main_of[op]
                src_unit, j = self.producer[op.operands[main]]
                views[op] = self.shared_views(op, src_unit, j, lambda v, op=op, main=main, j=j: _follower_view(
                    op, rules[op], main, v.outs[j], mesh))
            elif self.groups[self.group_of[op]].roots[0] is not op:
                views[op] = views[self.groups[self.group_of[op]].roots[0]]
            else:
                views[op] = op_views(op, rules[op], mesh)
            views[op] = interned.setdefault(tuple(views[op]), views[op])
        for op in reversed(self.ops):
            if op in self.attached:
                user, i = self.attached[op]
                views[op] = self.shared_views(op, user, i, lambda v, op=op, i=i: _attached_view(
                    op, rules[op], v.reqs[i], mesh))
        for p, (user, i) in self.attached_params.items():
            views[p] = [View((), (Sharding(v.reqs[i].dims),), 0.0) for v in views[user]]
        for u in self.units:
            views[u] = interned.setdefault(tuple(views[u]), views[u])

    def node_costs(self) -> None:
        """Local work; a parameter group counts its bytes per device."""
        for u in self.units:
            self.groups[self.group_of[u]].units.append(u)
        for g in self.groups:
            g.n = len(self.views[g.roots[0]])
            g.node_cost = [0.0] * g.n
        params = set(self.prog.params)
        for u in self.units:
            g = self.groups[self.group_of[u]]
            for s, v in enumerate(self.views[u]):
                g.node_cost[s] += v.work * self.trips_of[u]
            if u in params:
                t = u.value.type
                nbytes = [itemsize(t.dtype) * _count(v.outs[0].local_shape(t.shape, self.mesh)) for v in self.views[u]]
                g.param_bytes = [a + b for a, b in zip(g.param_bytes, nbytes)] if g.param_bytes else nbytes
        for g in self.groups:
            g.node_cost = np.asarray(g.node_cost, dtype=float)

    def edge_costs(self) -> None:
        """One reshard question per distinct (result layout, wanted layout) pair."""
        self.cache: dict = {}
        self.distinct: dict = {}  # id(list of layouts) -> (index per strategy, distinct layouts)
        self.smalls: dict = {}
        for op, operands, weights in self.consumers:
            for i, (v, w) in enumerate(zip(operands, weights)):
                if v in self.producer:
                    self.edge(op, i, v, w)

    def edge(self, op, i: int, v: Value, w: float) -> None:
        views, mesh = self.views, self.mesh
        src_unit, j = self.producer[v]
        ga, gb = self.group_of[src_unit], self.group_of[op]
        shape, isz = v.type.shape, itemsize(v.type.dtype)
        # a gradient leaving the backward pass (an optimizer update, a returned gradient): its
        # settling reduction is independent of the others, and the compiler combines them into
        # one collective per group of axes (partition.combine): its latency is not this edge's
        lat = self.latency_bytes
        if getattr(src_unit, "backward", False) and not getattr(op, "backward", True):
            lat = LATENCY_BYTES
        if ga == gb:  # inside a group: only each strategy against itself
            g = self.groups[ga]
            outs, reqs = views[src_unit], views[op]
            dk = (id(outs), j, id(reqs), i, "diag", lat)
            if dk not in self.smalls:
                self.smalls[dk] = (np.array([_edge_cost(shape, isz, mesh, outs[s].outs[j], reqs[s].reqs[i],
                                                        self.cache, lat) for s in range(g.n)]), outs, reqs)
            g.node_cost = np.asarray(g.node_cost) + w * self.smalls[dk][0]
            return
        sk = (id(views[src_unit]), j, id(views[op]), i, lat)
        if sk not in self.smalls:
            ia, da = self.classes([x.outs[j] for x in views[src_unit]], (id(views[src_unit]), j, "out"))
            ib, db = self.classes([x.reqs[i] for x in views[op]], (id(views[op]), i, "req"))
            small = np.empty((len(da), len(db)))
            for x, src in enumerate(da):
                for y, dst in enumerate(db):
                    small[x, y] = _edge_cost(shape, isz, mesh, src, dst, self.cache, lat)
            self.smalls[sk] = (small[np.ix_(ia, ib)], views[src_unit], views[op])
        full = self.smalls[sk][0] * w if w != 1 else self.smalls[sk][0]
        key = (ga, gb) if ga < gb else (gb, ga)
        if ga > gb:
            full = full.T
        self.edges[key] = self.edges[key] + full if key in self.edges else full

    def classes(self, layouts, k):
        if k not in self.distinct:
            index: dict = {}
            ids = np.array([index.setdefault(x, len(index)) for x in layouts], dtype=np.int64)
            self.distinct[k] = (ids, list(index))
        return self.distinct[k]

    def result_costs(self) -> None:
        """A pending sum is settled before it is returned."""
        for r in self.prog.results:
            unit, j = self.producer.get(r.value, (None, 0))
            if unit is None:
                continue
            g = self.groups[self.group_of[unit]]
            for s, v in enumerate(self.views[unit]):
                out = v.outs[j]
                if out.partial:
                    g.node_cost[s] += _comm(plan_reshard(r.value.type.shape, itemsize(r.value.type.dtype), self.mesh,
                                                         out, Sharding(out.dims)), self.latency_bytes)


def _edge_cost(shape, isz: int, mesh: Mesh, src: Sharding, dst: Sharding, cache: dict,
               latency_bytes: float) -> float:
    """The reshard planner's cost from `src` to `dst`; a split that only grows (each dim's axes
    extend its current ones, no pending sum) is a local slice and costs nothing."""
    if not src.partial and all(w[: len(h)] == h for h, w in zip(src.dims, dst.dims)):
        return 0.0
    key = (shape, isz, src, dst, latency_bytes)
    if key not in cache:
        cache[key] = _comm(plan_reshard(shape, isz, mesh, src, dst), latency_bytes)
    return cache[key]


def _count(shape) -> int:
    n = 1
    for x in shape:
        n *= x
    return n


# ---------------------------------------------------------------------------------- solvers


def have_solver() -> bool:
    try:
        from scipy.optimize import milp  # noqa: F401
    except ImportError:
        return False
    return True


def _classes(rows):
    """Indices grouped by equal rows: list of (representative row, [indices])."""
    seen: dict = {}
    for i, r in enumerate(rows):
        seen.setdefault(tuple(r), []).append(i)
    return list(seen.items())


def _eliminate(prob: Problem, keep: set):
    """Exact reductions before the integer program (dynamic programming on the graph): a group
    with one neighbour folds into it (the neighbour's cost per strategy gains this group's best
    answer to it), a group with two neighbours becomes one edge between them (the best middle
    strategy for each pair); groups in `keep` (parameters under a memory budget or an exclusion)
    stay. Chains of ops, a layer's elementwise tails and a training step's optimizer updates go
    away. Returns (node costs of the groups left, edges left, constant, the eliminations in order:
    replay them backwards to recover the eliminated groups' strategies)."""
    e = _Elimination(prob)
    e.separate()
    changed = True
    while changed:
        changed = False
        for g in sorted(e.node):
            if g not in keep and g in e.node and e.eliminate(g):
                changed = True
    return e.node, e.edges, e.const, e.steps


class _Elimination:
    """The graph `_eliminate` reduces: node costs, edges, neighbours, and what it did so far."""

    def __init__(self, prob: Problem):
        self.node = {gi: np.asarray(g.node_cost, dtype=float) for gi, g in enumerate(prob.groups)}
        self.edges = {k: np.asarray(m, dtype=float) for k, m in prob.edges.items()}
        self.nbrs: dict = {gi: set() for gi in self.node}
        for a, b in self.edges:
            self.nbrs[a].add(b)
            self.nbrs[b].add(a)
        self.const = prob.constant
        self.steps: list = []

    def oriented(self, g, h):
        """The matrix of edge g-h as [g strategy, h strategy]."""
        return self.edges[(g, h)] if (g, h) in self.edges else self.edges[(h, g)].T

    def add_edge(self, g, h, m) -> None:
        edges = self.edges
        if (g, h) in edges:
            edges[(g, h)] = edges[(g, h)] + m
        elif (h, g) in edges:
            edges[(h, g)] = edges[(h, g)] + m.T
        else:
            edges[(g, h) if g < h else (h, g)] = m if g < h else m.T
            self.nbrs[g].add(h)
            self.nbrs[h].add(g)

    def drop(self, g) -> None:
        for h in sorted(self.nbrs[g]):
            self.edges.pop((g, h), None)
            self.edges.pop((h, g), None)
            self.nbrs[h].discard(g)
        del self.nbrs[g], self.node[g]

    def separate(self) -> None:
        """An edge whose cost is a cost of one end plus a cost of the other is two node costs."""
        for (a, b), m in sorted(self.edges.items()):
            d = m - m[:, :1]
            if np.allclose(d, d[:1, :], rtol=0, atol=1e-6):
                self.node[a] = self.node[a] + m[:, 0]
                self.node[b] = self.node[b] + d[0, :]
                del self.edges[(a, b)]
                self.nbrs[a].discard(b)
                self.nbrs[b].discard(a)

    def eliminate(self, g) -> bool:
        """Fold group g into its neighbours if it has one strategy or at most two neighbours."""
        node, near = self.node, sorted(self.nbrs[g])
        if len(node[g]) == 1 and near:  # one strategy: its edges are costs of its neighbours'
            for h in near:
                node[h] = node[h] + self.oriented(h, g)[:, 0]
            self.const += float(node[g][0])
            self.steps.append((g, (), 0))
        elif len(near) == 0:
            self.const += float(node[g].min())
            self.steps.append((g, (), int(np.argmin(node[g]))))
        elif len(near) == 1:
            (h,) = near
            t = self.oriented(h, g) + node[g][None, :]
            node[h] = node[h] + t.min(axis=1)
            self.steps.append((g, (h,), t.argmin(axis=1)))
        elif len(near) == 2:
            h1, h2 = near
            t = self.oriented(h1, g)[:, :, None] + node[g][None, :, None] + self.oriented(g, h2)[None, :, :]
            if t.size > 1 << 16:
                return False
            self.steps.append((g, (h1, h2), t.argmin(axis=1)))
            best = t.min(axis=1)
            self.drop(g)
            self.add_edge(h1, h2, best)
            return True
        else:
            return False
        self.drop(g)
        return True


def solve_ilp(prob: Problem, budget: float | None = None, exclude=(), node_limit: int | None = None,
              time_limit: float = TIME_LIMIT_S):
    """The optimum of the integer program; `exclude`: parameter layouts already taken (each a
    dict group -> strategy), so the answer differs from each of them in some parameter.
    Returns None when infeasible."""
    import numpy as np
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_matrix

    t0 = time.perf_counter()
    pgroups = [gi for gi, g in enumerate(prob.groups) if g.param_bytes]
    keep = set(pgroups) if (budget is not None or exclude) else set()
    node, edges, const, steps = _eliminate(prob, keep)
    left = sorted(node)
    offset = {}
    n = 0
    for gi in left:
        offset[gi] = n
        n += len(node[gi])
    c = [0.0] * n
    for gi in left:
        for s, x in enumerate(node[gi]):
            c[offset[gi] + s] = float(x)
    integrality = [1] * n
    rows, cols, vals, lo, hi = [], [], [], [], []
    r = 0

    def add_row(entries, low, high):
        nonlocal r
        for col, val in entries:
            rows.append(r)
            cols.append(col)
            vals.append(val)
        lo.append(low)
        hi.append(high)
        r += 1

    for gi in left:
        add_row([(offset[gi] + s, 1.0) for s in range(len(node[gi]))], 1.0, 1.0)
    for (a, b), m in sorted(edges.items()):
        if float(m.max() - m.min()) < 1e-9:
            const += float(m.flat[0])
            continue
        row_classes = _classes(m.tolist())
        col_classes = _classes(m.T.tolist())
        first = n
        for _row, ridx in row_classes:
            for _col, cidx in col_classes:
                c.append(float(m[ridx[0], cidx[0]]))
                integrality.append(0)
                n += 1
        nc = len(col_classes)
        for ri, (_row, idx) in enumerate(row_classes):
            add_row([(first + ri * nc + ci, 1.0) for ci in range(nc)] + [(offset[a] + s, -1.0) for s in idx], 0, 0)
        for ci, (_col, idx) in enumerate(col_classes):
            add_row([(first + ri * nc + ci, 1.0) for ri in range(len(row_classes))]
                    + [(offset[b] + s, -1.0) for s in idx], 0, 0)
    if budget is not None:
        entries = [(offset[gi] + s, prob.groups[gi].param_bytes[s]) for gi in pgroups
                   for s in range(prob.groups[gi].n)]
        add_row(entries, -np.inf, float(budget))
    for taken in exclude:
        add_row([(offset[gi] + taken[gi], 1.0) for gi in pgroups], -np.inf, len(pgroups) - 1)
    choice = {}
    if n:
        a = coo_matrix((vals, (rows, cols)), shape=(r, n)).tocsr()
        res = milp(np.array(c), constraints=LinearConstraint(a, np.array(lo), np.array(hi)),
                   integrality=np.array(integrality), bounds=Bounds(np.zeros(n), np.ones(n)),
                   options={"time_limit": time_limit, "presolve": True, "mip_rel_gap": MIP_REL_GAP,
                            **({"node_limit": node_limit} if node_limit is not None else {})})
        if res.x is None:  # infeasible, or no plan found in the time limit
            return None
        for gi in left:
            choice[gi] = int(np.argmax(res.x[offset[gi]: offset[gi] + len(node[gi])]))
    for g, near, arg in reversed(steps):
        choice[g] = int(arg if not near else arg[tuple(choice[h] for h in near)])
    choice = {gi: choice[gi] for gi in range(len(prob.groups))}
    return Solution(choice, prob.evaluate(choice), "ilp", time.perf_counter() - t0)


def solve_greedy(prob: Problem, budget: float | None = None, exclude=(), passes: int = 4) -> Solution | None:
    """Groups in program order, each taking its cheapest strategy given the groups already chosen;
    then coordinate descent (each group re-chosen given all the others) until nothing improves.
    The memory budget is kept by shrinking the largest parameters first."""
    t0 = time.perf_counter()
    ng = len(prob.groups)
    nbrs: list[list] = [[] for _ in range(ng)]
    for (a, b), m in prob.edges.items():
        nbrs[a].append((b, m, False))
        nbrs[b].append((a, m, True))

    def local(gi, s, choice):
        total = prob.groups[gi].node_cost[s]
        for other, m, flipped in nbrs[gi]:
            if other in choice:
                total += float(m[choice[other], s] if flipped else m[s, choice[other]])
        return total

    choice: dict[int, int] = {}
    for gi in range(ng):
        choice[gi] = min(range(prob.groups[gi].n), key=lambda s: (local(gi, s, choice), s))
    pgroups = [gi for gi, g in enumerate(prob.groups) if g.param_bytes]

    def fits(ch):
        return budget is None or prob.param_bytes(ch) <= budget

    excluded = {prob.param_layouts(t) for t in exclude}

    def allowed(ch):
        return prob.param_layouts(ch) not in excluded

    for _ in range(passes):
        improved = False
        for gi in range(ng):
            cur = local(gi, choice[gi], choice)
            for s in range(prob.groups[gi].n):
                if s == choice[gi]:
                    continue
                trial = dict(choice)
                trial[gi] = s
                if local(gi, s, choice) < cur - 1e-9 and fits(trial) and allowed(trial):
                    choice, cur, improved = trial, local(gi, s, trial), True
        if not improved:
            break
    # memory: move the largest parameters to their smallest layouts until the budget holds
    for gi in sorted(pgroups, key=lambda g: -max(prob.groups[g].param_bytes)):
        if fits(choice):
            break
        g = prob.groups[gi]
        choice[gi] = min(range(g.n), key=lambda s: (g.param_bytes[s], local(gi, s, choice), s))
    if not fits(choice):
        return None
    if not allowed(choice):  # the nearest plan with another parameter layout
        best = None
        for gi in range(ng):
            for s in range(prob.groups[gi].n):
                trial = dict(choice)
                trial[gi] = s
                if allowed(trial) and fits(trial):
                    cost = prob.evaluate(trial)
                    if best is None or cost < best[0]:
                        best = (cost, trial)
        if best is None:
            return None
        choice = best[1]
    return Solution(choice, prob.evaluate(choice), "greedy", time.perf_counter() - t0)


def solve(prob: Problem, budget=None, exclude=(), method: str = "auto") -> Solution | None:
    """method: "ilp", "greedy", or "auto" (the ILP when scipy is there and the problem is under
    MAX_ILP_VARIABLES, else greedy)."""
    if method == "auto":
        method = "ilp" if have_solver() and prob.size <= MAX_ILP_VARIABLES else "greedy"
    if method == "ilp":
        return solve_ilp(prob, budget, exclude)
    return solve_greedy(prob, budget, exclude)
