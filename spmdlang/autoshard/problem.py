"""Auto-sharding search over the global IR: per-op strategies from the factor rules, edge costs
from the reshard planner, one integer linear program (Alpa, OSDI 2022), or a greedy pass.

The graph. Every parameter and every op of the canonical global program is a unit, with the
strategies autoshard.strategies lists (a parameter's layouts, an op's factor splits). A strategy
fixes the layout each operand is wanted in, the layout of each result (pending sums included) and
the op's local work.
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

from dataclasses import dataclass, field

import numpy as np

from ..ir import registry
from ..ir.core import LOOP, Loop, Program, Value, walk
from ..ir.mesh import Mesh, Sharding
from ..ir.types import itemsize
from ..partition.cost import LATENCY_BYTES, PLANNING, latency_steps
from ..partition.propagate import op_rule
from ..partition.reshard import plan_reshard
from .strategies import View, _attached_view, _follower_view, op_views, param_views

TIE_DEPTH = 4  # identical layers: ops alike this many producers up (see _signatures)
# what one latency step of a collective costs in the search, in link bytes: the physical alpha * beta
# of the planning machine (tpu-v4: 1 us * 45 GB/s = 45,000 bytes), so that the objective is the
# modelled step time (partition.cost.step_time_us) in bytes. (The reshard planner's own
# LATENCY_BYTES is a tie-breaker; with it the search would trade ten small collectives for
# a few bytes, and the compiled plan would model slower than the one it replaced.)
PHYSICAL_LATENCY_BYTES = PLANNING.latency_us * PLANNING.bandwidth_gbps * 1e3


def _comm(steps, latency_bytes: float) -> float:
    return sum(s.bytes + latency_bytes * latency_steps(s.kind, s.group) for s in steps)


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


@dataclass(eq=False)
class _BodyParam:
    """A loop's index or one of its carries, as a unit of the search (laid out like a parameter)."""

    value: Value
    sharding: None = None


# ---------------------------------------------------------------------------------- the graph


def _signatures(units, producer, rules, depth: int) -> dict:
    """unit -> an id shared by the ops that are the same op of identical layers: the same source
    position, kind, types and factor rule, and so are their operands' producers, `depth` levels
    up (a parameter or a loop's carry is only itself). The same function called on different
    weights (one Adam update for a column-split and a row-split weight, the two layer norms of a
    block) is not one layer; the k-th op of layers 2..L of an unrolled stack is."""
    ids: dict = {}
    cur = {}
    keys = {u: _op_key(u, rules[u]) for u in units if u in rules}
    for n, u in enumerate(units):
        k = keys.get(u)
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
    return {u: cur[u] for u in units if keys.get(u) is not None}


def _op_key(op, rule):
    s = op.span
    if s is None:
        return None
    return (s.line, s.col, s.end_line, s.end_col, op.kind, tuple(v.type for v in op.operands),
            tuple(r.type for r in op.results), rule)


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
        # alike questions answered once: a parameter's layouts by (type, annotation), an op's
        # factor rule by (kind, attributes, types)
        self.param_cache: dict = {}
        self.rule_cache: dict = {}

    def param_views(self, p) -> list[View]:
        k = (p.value.type, None if p.sharding is None else p.sharding.dims)
        if k not in self.param_cache:
            self.param_cache[k] = param_views(p, self.mesh)
        return self.param_cache[k]

    def op_rule(self, op):
        try:
            k = (op.kind, tuple(sorted(op.attrs.items())), tuple(v.type for v in op.operands),
                 tuple(r.type for r in op.results))
            hash(k)
        except TypeError:  # an unhashable attribute: no sharing
            return op_rule(op)
        if k not in self.rule_cache:
            self.rule_cache[k] = op_rule(op)
        return self.rule_cache[k]

    def add_root(self, u, views, trips: int) -> None:
        self.units.append(u)
        self.views[u] = views
        self.root_of[u] = u
        self.trips_of[u] = trips

    def add_units(self) -> None:
        for p in self.prog.params:
            self.producer[p.value] = (p, 0)
            self.add_root(p, self.param_views(p), 1)
        for op, trips in walk(self.prog.ops):
            if op.kind == LOOP:
                self.add_loop(op, trips)
                continue
            self.ops.append(op)
            self.units.append(op)
            self.trips_of[op] = trips
            self.rules[op] = self.op_rule(op)
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
            self.add_root(u, [View((v.outs[0], v.outs[0]), v.outs, 0.0) for v in self.param_views(u)], trips)
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

    def signature(self, op):
        """Ops alike in kind, attributes, types and rule have the same views, wherever they are (a
        stack of distinct but identically shaped layers asks the same questions per layer): they
        are computed once. None: an unhashable attribute, no sharing."""
        try:
            k = (op.kind, tuple(sorted(op.attrs.items())), tuple(v.type for v in op.operands),
                 tuple(r.type for r in op.results), self.rules[op])
            hash(k)
        except TypeError:
            return None
        return k

    def shared_views(self, op, other, index: int, make):
        """The views of `op` derived (by `make`) from the views of `other`: identical ops
        deriving from one list share one result."""
        k = (self.signature(op), id(self.views[other]), index) if self.tie_layers else None
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
        strategies: dict = {}  # signature -> op_views
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
                sk = self.signature(op)
                if sk is None:
                    views[op] = op_views(op, rules[op], mesh)
                else:
                    if sk not in strategies:
                        strategies[sk] = op_views(op, rules[op], mesh)
                    views[op] = strategies[sk]
            views[op] = interned.setdefault(tuple(views[op]), views[op])
        for op in reversed(self.ops):
            if op in self.attached:
                user, i = self.attached[op]
                views[op] = self.shared_views(op, user, i, lambda v, op=op, i=i: _attached_view(
                    op, rules[op], v.reqs[i], mesh))
        attached: dict = {}  # (id of the user's views, operand) -> the parameter's
        for p, (user, i) in self.attached_params.items():
            k = (id(views[user]), i)
            if k not in attached:
                attached[k] = [View((), (Sharding(v.reqs[i].dims),), 0.0) for v in views[user]]
            views[p] = attached[k]
        for u in self.units:
            views[u] = interned.setdefault(tuple(views[u]), views[u])

    def node_costs(self) -> None:
        """Local work; a parameter group counts its bytes per device."""
        for u in self.units:
            self.groups[self.group_of[u]].units.append(u)
        for g in self.groups:
            g.n = len(self.views[g.roots[0]])
            g.node_cost = np.zeros(g.n)
        params = set(self.prog.params)
        sizes: dict = {}  # (id of the views, type) -> bytes per device under each
        works: dict = {}  # id of the views -> local work under each
        for u in self.units:
            g = self.groups[self.group_of[u]]
            vs = self.views[u]
            if id(vs) not in works:
                works[id(vs)] = np.array([v.work for v in vs], dtype=float)
            g.node_cost += works[id(vs)] * self.trips_of[u]
            if u in params:
                t = u.value.type
                k = (id(self.views[u]), t)
                if k not in sizes:
                    sizes[k] = [itemsize(t.dtype) * _count(v.outs[0].local_shape(t.shape, self.mesh))
                                for v in self.views[u]]
                nbytes = sizes[k]
                g.param_bytes = [a + b for a, b in zip(g.param_bytes, nbytes)] if g.param_bytes else list(nbytes)

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
    src, dst = _renamed(mesh, src, dst)
    key = (shape, isz, src, dst, latency_bytes)
    if key not in cache:
        cache[key] = _comm(plan_reshard(shape, isz, mesh, src, dst), latency_bytes)
    return cache[key]


def _renamed(mesh: Mesh, src: Sharding, dst: Sharding) -> tuple[Sharding, Sharding]:
    """`src` and `dst` with the mesh axes they use renamed, in order of first use, each to the first
    mesh axis of its size not taken yet. A reshard's cost depends on the axes' sizes alone (never on
    their names or the device order), so on [data=2, seq=2, model=2] the questions
    {model, _} -> {_, seq} and {data, _} -> {_, model} are one: a search over three axes asks
    2.5 times fewer (a 7-op attention's 5,559 questions are 2,185)."""
    sizes = dict(mesh.axes)
    names: dict = {}
    for s in (src, dst):
        for a in (*s.used_axes(), *s.partial):
            if a not in names:
                names[a] = next(b for b, n in mesh.axes if n == sizes[a] and b not in names.values())
    if all(a == b for a, b in names.items()):
        return src, dst

    def rename(s: Sharding) -> Sharding:
        partial = {names[a] for a in s.partial}
        return Sharding(tuple(tuple(names[a] for a in d) for d in s.dims),
                        tuple(a for a in mesh.names if a in partial), s.open_dims, s.partial_op)

    return rename(src), rename(dst)


def _count(shape) -> int:
    n = 1
    for x in shape:
        n *= x
    return n

