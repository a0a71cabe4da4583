"""Solving the search problem: exact eliminations, then one integer linear program (HiGHS through
scipy.optimize.milp), or a greedy pass and coordinate descent over MAX_ILP_VARIABLES or without
scipy. Everything is ordered by program position: the answer is deterministic.
"""

from __future__ import annotations

import time

import numpy as np

from .problem import Problem, Solution

MAX_ILP_VARIABLES = 200_000  # above this, the greedy search
# a safety net only (the answer must not depend on the machine's speed; after the eliminations the
# problems of the example programs and of 10,000-op stacks solve in well under a second): at the
# limit, HiGHS's best plan so far, or the greedy search's when it has none
TIME_LIMIT_S = 10.0
MIP_REL_GAP = 1e-3  # stop within 0.1% of the optimum's bound



def have_solver() -> bool:
    try:
        from scipy.optimize import milp  # noqa: F401
    except ImportError:
        return False
    return True


def _class_index(m):
    """The rows of matrix m in classes of equal rows, numbered in order of first appearance:
    (the class of each row, the first row of each class)."""
    _, first, inverse = np.unique(m, axis=0, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")  # np.unique numbers classes in sorted order
    renumber = np.empty(len(order), dtype=np.int64)
    renumber[order] = np.arange(len(order))
    return renumber[inverse.reshape(-1)], first[order]


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
    from scipy.optimize import Bounds, LinearConstraint, milp

    t0 = time.perf_counter()
    pgroups = [gi for gi, g in enumerate(prob.groups) if g.param_bytes]
    keep = set(pgroups) if (budget is not None or exclude) else set()
    node, edges, const, steps = _eliminate(prob, keep)
    ip = _IntegerProgram(node)
    for (a, b), m in sorted(edges.items()):
        if float(m.max() - m.min()) < 1e-9:
            const += float(m.flat[0])
        else:
            ip.edge(a, b, m)
    if budget is not None:
        ip.row([(gi, np.arange(prob.groups[gi].n), prob.groups[gi].param_bytes) for gi in pgroups], float(budget))
    for taken in exclude:
        ip.row([(gi, [taken[gi]], [1.0]) for gi in pgroups], len(pgroups) - 1)
    choice = {}
    if ip.n:
        c, a, lo, hi, integrality = ip.arrays()
        res = milp(c, constraints=LinearConstraint(a, lo, hi), integrality=integrality,
                   bounds=Bounds(np.zeros(ip.n), np.ones(ip.n)),
                   options={"time_limit": time_limit, "presolve": True, "mip_rel_gap": MIP_REL_GAP,
                            **({"node_limit": node_limit} if node_limit is not None else {})})
        if res.x is None and res.status == 1:  # no plan found in the time limit
            return solve_greedy(prob, budget, exclude)
        if res.x is None:  # infeasible
            return None
        for gi in ip.left:
            choice[gi] = int(np.argmax(res.x[ip.offset[gi]: ip.offset[gi] + len(node[gi])]))
    for g, near, arg in reversed(steps):
        choice[g] = int(arg if not near else arg[tuple(choice[h] for h in near)])
    choice = {gi: choice[gi] for gi in range(len(prob.groups))}
    return Solution(choice, prob.evaluate(choice), "ilp", time.perf_counter() - t0)


class _IntegerProgram:
    """The integer program's cost vector and constraint matrix, built as coordinate triplets a
    block of rows at a time (numpy, not a Python loop per variable). First one binary per group
    left and strategy, each group taking one strategy."""

    def __init__(self, node: dict):
        self.left = sorted(node)
        sizes = np.array([len(node[gi]) for gi in self.left], dtype=np.int64)
        starts = np.concatenate(([0], np.cumsum(sizes)))
        self.offset = {gi: int(starts[k]) for k, gi in enumerate(self.left)}
        self.n = self.binaries = int(starts[-1])
        self.c = [np.concatenate([np.asarray(node[gi], dtype=float) for gi in self.left]) if self.left
                  else np.zeros(0)]
        self.rows = [np.repeat(np.arange(len(self.left)), sizes)]
        self.cols = [np.arange(self.n)]
        self.vals = [np.ones(self.n)]
        self.lo, self.hi = [np.ones(len(self.left))], [np.ones(len(self.left))]
        self.r = len(self.left)

    def edge(self, a, b, m) -> None:
        """Edge a-b: one continuous variable per pair of classes (strategies with equal cost rows,
        or columns); its sums over a class of a (of b) equal that class's strategy variables."""
        ri, rrep = _class_index(m)
        ci, crep = _class_index(m.T)
        nr, nc = len(rrep), len(crep)
        self.c.append(m[np.ix_(rrep, crep)].ravel())
        grid = (self.n + np.arange(nr * nc)).reshape(nr, nc)
        self.n += nr * nc
        r = self.r  # row class k of a: sum_J e[k, J] - sum_{s in k} x[a, s] = 0; then the columns'
        self.rows += [np.repeat(r + np.arange(nr), nc), r + ri, np.tile(r + nr + np.arange(nc), nr), r + nr + ci]
        self.cols += [grid.ravel(), self.offset[a] + np.arange(len(ri)), grid.ravel(),
                      self.offset[b] + np.arange(len(ci))]
        self.vals += [np.ones(nr * nc), -np.ones(len(ri)), np.ones(nr * nc), -np.ones(len(ci))]
        self.lo.append(np.zeros(nr + nc))
        self.hi.append(np.zeros(nr + nc))
        self.r += nr + nc

    def row(self, terms, high: float) -> None:
        """sum over terms (group, its strategies, coefficients) of coefficient * x <= high."""
        for gi, strategies, coefs in terms:
            self.rows.append(np.full(len(strategies), self.r))
            self.cols.append(self.offset[gi] + np.asarray(strategies, dtype=np.int64))
            self.vals.append(np.asarray(coefs, dtype=float))
        self.lo.append([-np.inf])
        self.hi.append([high])
        self.r += 1

    def arrays(self):
        """(costs, constraint matrix, its lower and upper bounds, integrality)."""
        from scipy.sparse import coo_matrix

        a = coo_matrix((np.concatenate(self.vals), (np.concatenate(self.rows), np.concatenate(self.cols))),
                       shape=(self.r, self.n)).tocsr()
        integrality = np.zeros(self.n)
        integrality[: self.binaries] = 1
        return np.concatenate(self.c), a, np.concatenate(self.lo), np.concatenate(self.hi), integrality


def solve_greedy(prob: Problem, budget: float | None = None, exclude=(), passes: int = 4) -> Solution | None:
    """Groups in program order, each taking its cheapest strategy given the groups already chosen;
    then coordinate descent (each group re-chosen given all the others) until nothing improves.
    The memory budget is kept by shrinking the largest parameters first. Linear in the problem:
    a trial move is priced by the group's own edges, and the budget and the exclusions are kept
    as running totals (bytes, and per excluded plan how many parameters are laid out otherwise)."""
    t0 = time.perf_counter()
    g = _Greedy(prob, budget, exclude)
    ng = len(prob.groups)
    for gi in range(ng):
        g.choice[gi] = min(range(prob.groups[gi].n), key=lambda s: (g.local(gi, s), s))
    g.start()
    for _ in range(passes):
        improved = False
        for gi in range(ng):
            cur = g.local(gi, g.choice[gi])
            for s in range(prob.groups[gi].n):
                if s == g.choice[gi]:
                    continue
                if g.local(gi, s) < cur - 1e-9 and g.fits(gi, s) and g.allowed(gi, s):
                    g.move(gi, s)
                    cur, improved = g.local(gi, s), True
        if not improved:
            break
    # memory: move the largest parameters to their smallest layouts until the budget holds
    for gi in sorted(g.pgroups, key=lambda x: -max(prob.groups[x].param_bytes)):
        if g.fits():
            break
        grp = prob.groups[gi]
        g.move(gi, min(range(grp.n), key=lambda s: (grp.param_bytes[s], g.local(gi, s), s)))
    if not g.fits():
        return None
    if not g.allowed():  # the nearest plan with another parameter layout
        best = None
        base = prob.evaluate(g.choice)
        for gi in range(ng):
            cur = g.local(gi, g.choice[gi])
            for s in range(prob.groups[gi].n):
                if g.allowed(gi, s) and g.fits(gi, s):
                    cost = base + g.local(gi, s) - cur
                    # priced by difference, so equal plans may differ by rounding: the first wins
                    if best is None or cost < best[0] - 1e-9 * max(1.0, abs(best[0])):
                        best = (cost, gi, s)
        if best is None:
            return None
        g.move(best[1], best[2])
    choice = dict(g.choice)
    return Solution(choice, prob.evaluate(choice), "greedy", time.perf_counter() - t0)


class _Greedy:
    """The greedy search's state: the choice so far, each group's edges, the parameters' bytes
    per device and, per excluded plan, how many parameters the choice lays out otherwise."""

    def __init__(self, prob: Problem, budget, exclude):
        self.prob, self.budget = prob, budget
        ng = len(prob.groups)
        self.nbrs: list[list] = [[] for _ in range(ng)]
        for (a, b), m in prob.edges.items():
            self.nbrs[a].append((b, m, False))
            self.nbrs[b].append((a, m, True))
        self.choice: dict[int, int] = {}
        self.pgroups = [gi for gi, grp in enumerate(prob.groups) if grp.param_bytes]
        # the parameters each group lays out (a parameter attached to its user is in the user's group)
        self.params_of: list[list] = [[] for _ in range(ng)]
        for k, p in enumerate(prob.program.params):
            self.params_of[prob.group_of[p]].append((k, prob.views[p]))
        self.excluded = list(dict.fromkeys(prob.param_layouts(t) for t in exclude))

    def local(self, gi, s) -> float:
        """Group gi's node cost under strategy s plus its edges to the groups chosen so far."""
        total = self.prob.groups[gi].node_cost[s]
        choice = self.choice
        for other, m, flipped in self.nbrs[gi]:
            if other in choice:
                total += float(m[choice[other], s] if flipped else m[s, choice[other]])
        return total

    def start(self) -> None:
        """The running totals of a complete choice."""
        self.bytes = self.prob.param_bytes(self.choice)
        layouts = self.prob.param_layouts(self.choice)
        self.differ = [sum(a != b for a, b in zip(layouts, e)) for e in self.excluded]

    def _bytes_delta(self, gi, s):
        pb = self.prob.groups[gi].param_bytes
        return pb[s] - pb[self.choice[gi]] if pb else 0

    def _differ_delta(self, gi, s) -> list[int]:
        old = self.choice[gi]
        out = []
        for e in self.excluded:
            d = 0
            for k, views in self.params_of[gi]:
                d += (views[s].outs[0] != e[k]) - (views[old].outs[0] != e[k])
            out.append(d)
        return out

    def fits(self, gi=None, s=None) -> bool:
        """Whether the choice (with group gi moved to s) keeps the parameters within the budget."""
        if self.budget is None:
            return True
        return self.bytes + (self._bytes_delta(gi, s) if gi is not None else 0) <= self.budget

    def allowed(self, gi=None, s=None) -> bool:
        """Whether the choice (with group gi moved to s) lays some parameter out otherwise than
        every excluded plan."""
        if gi is None or not self.params_of[gi]:
            return all(self.differ)
        return all(x + d for x, d in zip(self.differ, self._differ_delta(gi, s)))

    def move(self, gi, s) -> None:
        self.bytes += self._bytes_delta(gi, s)
        self.differ = [x + d for x, d in zip(self.differ, self._differ_delta(gi, s))]
        self.choice[gi] = s


def solve(prob: Problem, budget=None, exclude=(), method: str = "auto") -> Solution | None:
    """method: "ilp", "greedy", or "auto" (the ILP when scipy is there and the problem is under
    MAX_ILP_VARIABLES, else greedy)."""
    if method == "auto":
        method = "ilp" if have_solver() and prob.size <= MAX_ILP_VARIABLES else "greedy"
    if method == "ilp":
        return solve_ilp(prob, budget, exclude)
    return solve_greedy(prob, budget, exclude)
