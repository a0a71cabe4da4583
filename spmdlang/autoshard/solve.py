"""Solving the search problem: exact eliminations, then one integer linear program (HiGHS through
scipy.optimize.milp), or a greedy pass and coordinate descent over MAX_ILP_VARIABLES or without
scipy. Everything is ordered by program position: the answer is deterministic.
"""

from __future__ import annotations

import time

import numpy as np

from .problem import Problem, Solution

MAX_ILP_VARIABLES = 200_000  # above this, the greedy search
TIME_LIMIT_S = 120.0  # a safety net only: the answer must not depend on the machine's speed
MIP_REL_GAP = 1e-3  # stop within 0.1% of the optimum's bound



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
