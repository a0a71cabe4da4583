"""The autoshard driver: compile the program as written, build and solve the search problem
(autoshard.problem, autoshard.solve), write each solution into the source (autoshard.rewrite),
compile the candidates and keep the least modelled step time that fits the memory budget."""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field

from ..api import Compiled, _compile_text, compile, read_source
from ..errors import SpmdError
from ..frontend.parse import parse
from ..ir.core import walk
from . import problem as P
from . import solve as S
from .rewrite import _assigned_values, _entry, _rewrap, _spec, _spec_edits, _Text, _where, _with_overrides

# Candidate plans are measured by compiling them (parse, lower, propagate, partition: time linear
# in the program): at most MAX_CANDIDATE_COMPILES compiles of candidate sources per search, and
# at most CANDIDATE_COMPILE_OPS ops compiled in all; a program of more than SINGLE_COMPILE_OPS
# ops compiles only the optimum (always compiled). The programs in programs/ compile every
# candidate; benchmarks/train_stack.spmd (2,283 ops) 10 of 12, its chosen plan among them (its
# second runner-up in its first variant only); a 10,000-op program costs its own compile and one
# more. The program's own compile, which the search starts from, is not a candidate compile.
MAX_CANDIDATE_COMPILES = 24
CANDIDATE_COMPILE_OPS = 24_000
SINGLE_COMPILE_OPS = 3_000


@dataclass
class Plan:
    """One candidate: its source text, compiled program and measured figures."""

    label: str
    source: str
    compiled: Compiled
    search_cost: float | None = None
    params: dict = field(default_factory=dict)
    constraints: list = field(default_factory=list)
    _totals: dict | None = field(default=None, repr=False)

    @property
    def collectives(self) -> list:
        return self.compiled.spmd.ledger

    def totals(self) -> dict:
        if self._totals is None:
            self._totals = self._measure()
        return self._totals

    def _measure(self) -> dict:
        from ..partition.cost import collective_cost, compute_time_us, flops, peak_bytes, step_time_us

        mesh = self.compiled.mesh
        # a collective in a loop body runs once per iteration: counted so, as explain's totals
        cols = [(x.kind, mesh.group_size(x.axes), x.bytes_per_device, x.trip_count) for x in self.collectives]
        fl = flops(self.compiled.spmd.program)
        return {"collectives": sum(n for *_, n in cols),
                "bytes_per_device": int(round(sum(b * n for _, _, b, n in cols))),
                "flops_per_device": fl, "peak_bytes_per_device": peak_bytes(self.compiled.spmd.program),
                "modelled_time_us": round(step_time_us(self.collectives, mesh, fl), 3),
                "compute_time_us": round(compute_time_us(fl), 3),
                "planner_cost": round(sum(collective_cost(k, g, b) * n for k, g, b, n in cols), 1)}


@dataclass
class Autoshard:
    """The outcome of `spmdlang.autoshard(...)`: the rewritten source and the report."""

    source: str
    chosen: Plan
    as_written: Plan
    runners_up: list[Plan]
    solver: str
    solve_s: float
    problem: dict
    budget: int | None
    solve_cpu_s: float = 0.0

    @property
    def compiled(self) -> Compiled:
        return self.chosen.compiled

    def report(self) -> dict:
        def plan_json(p: Plan) -> dict:
            return {"label": p.label, "params": p.params, "constraints": p.constraints, "totals": p.totals(),
                    "search_cost": None if p.search_cost is None else round(p.search_cost, 1)}

        chosen = plan_json(self.chosen)
        chosen["collectives"] = [{"kind": x.kind, "axes": list(x.axes),
                                  "bytes_per_device": int(round(x.bytes_per_device)), "line": x.line, "op": x.op,
                                  "reason": x.reason} for x in self.chosen.collectives]
        chosen["layouts"] = self._layouts()
        return {"mesh": {"axes": dict(self.compiled.mesh.axes)}, "solver": self.solver,
                "solve_s": round(self.solve_s, 4), "solve_cpu_s": round(self.solve_cpu_s, 4),
                "problem": self.problem,
                "memory_per_device": self.budget, "chosen": chosen, "as_written": plan_json(self.as_written),
                "runners_up": [plan_json(p) for p in self.runners_up], "plans": self._distinct_plans(),
                "source": self.source}

    def _layouts(self) -> list[dict]:
        """Every parameter of the entry in the chosen plan: its sharding, and whether the program
        wrote it, autoshard chose it, or propagation inferred it (a parameter left unannotated)."""
        written = {p.name: p.sharding for p in self.as_written.compiled.canonical.params}
        c = self.chosen.compiled
        return [{"name": p.name, "sharding": str(c.propagation.shardings[p.value]),
                 "from": "as written" if written.get(p.name) is not None
                 else "autoshard" if p.name in self.chosen.params else "propagation"}
                for p in c.canonical.params]

    def _distinct_plans(self) -> list[dict]:
        """The candidates, one entry per distinct compiled plan (the same per-partition program
        under several labels is one plan): the chosen first, then the runners-up, then the program
        as written; `fits` says whether the peak fits the memory budget (None: no budget)."""
        plans = [self.chosen, *self.runners_up]
        if self.as_written is not self.chosen:
            plans.append(self.as_written)
        out: list[dict] = []
        seen: dict[str, dict] = {}
        for p in plans:
            key = p.compiled.spmd_ir
            if key in seen:
                seen[key]["labels"].append(p.label)
                continue
            peak = p.totals()["peak_bytes_per_device"]
            seen[key] = {"labels": [p.label], "chosen": p is self.chosen, "totals": p.totals(),
                         "fits": None if self.budget is None else peak <= self.budget}
            out.append(seen[key])
        return out


class _Compiles:
    """The candidate sources compiled in one search (source text -> Compiled; each distinct text
    once) and how many more compiles the budget allows."""

    def __init__(self, ops: int, filename: str, entry: str | None):
        self.left = 1 if ops > SINGLE_COMPILE_OPS else max(1, min(MAX_CANDIDATE_COMPILES,
                                                                    CANDIDATE_COMPILE_OPS // max(1, ops)))
        self.filename, self.entry = filename, entry
        self.seen: dict[str, Compiled] = {}
        self.count = 0  # compiles done

    def has(self, source: str, n: int = 1) -> bool:
        """Whether `source` is compiled or n more compiles fit the budget."""
        return source in self.seen or self.left >= n

    def get(self, source: str, force: bool = False) -> Compiled | None:
        """The compiled `source`; None when it is not compiled yet and the budget is spent (force:
        compile it anyway, the search's first plan)."""
        if source not in self.seen:
            if self.left <= 0 and not force:
                return None
            self.left -= 1
            self.count += 1
            self.seen[source] = compile(source, filename=self.filename, entry=self.entry)
        return self.seen[source]


def autoshard(program: str, mesh: dict | None = None, consts: dict | None = None, entry: str | None = None,
              filename: str | None = None, memory_per_device: int | None = None, method: str = "auto",
              runners_up: int = 2) -> Autoshard:
    """Choose shardings for every unannotated parameter, result and assignment of `program` (a
    path or source text) that minimise modelled step time with peak memory per device at most
    `memory_per_device` bytes. method: "auto", "ilp" or "greedy". Raises SpmdError for a bad
    program, or when no plan fits the memory budget."""
    import os

    if filename is None and "\n" not in program and (program.endswith(".spmd") or os.path.exists(program)):
        filename, text = program, read_source(program)
    else:
        text, filename = program, filename or "<input>"
    from ..limits import deep_call

    return deep_call(_without_gc, _autoshard, text, filename, mesh, consts, entry, memory_per_device, method,
                     runners_up)


def _without_gc(f, *args):
    """Run f with the cycle collector off: a search allocates several compiles' worth of IR that
    stays alive to its end, and collecting it over and over costs a quarter of the time (the
    garbage left, a little, is collected after)."""
    was = gc.isenabled()
    gc.disable()
    try:
        return f(*args)
    finally:
        if was:
            gc.enable()


def _autoshard(text, filename, mesh, consts, entry, budget, method, n_runners) -> Autoshard:
    module, source = parse(text, filename)
    base = _compile_text(text, filename, mesh, consts, entry, None, None, (module, source))
    func = _entry(module, entry)
    written = Plan("as written", _with_overrides(text, module, mesh, consts, base), base)

    if method in ("auto", "ilp") and S.have_solver():
        import scipy.optimize  # noqa: F401  (imported before the clock starts: seconds on a busy machine)
    clock = [0.0, 0.0]  # wall, CPU (of this process: the machine may be shared)

    def timed(f, *a, **k):
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            return f(*a, **k)
        finally:
            clock[0] += time.perf_counter() - t0
            clock[1] += time.process_time() - c0

    # under a memory budget a parameter may be stored more finely split than its one user reads it
    # (ZeRO: gathered before use); without one that only adds a reshard, and the parameter takes
    # its user's layout
    prob = timed(P.build, base.canonical, attach_params=budget is None)
    if method == "auto":
        method = "ilp" if S.have_solver() and prob.size <= S.MAX_ILP_VARIABLES else "greedy"
    solve = S.solve_ilp if method == "ilp" else S.solve_greedy
    plans: list[Plan] = []
    compiles = _Compiles(sum(1 for _ in walk(base.canonical.ops)), filename, entry)
    if mesh is None and consts is None:
        compiles.seen[text] = base

    def plan_of(sol, force: bool = False):
        return _plan(text, module, func, base, prob, sol, mesh, consts, entry, filename, "autoshard", compiles,
                     force=force)

    plan, planned, limit = _fit(budget, prob, compiles, lambda lim: timed(solve, prob, lim), plan_of)
    if plan is not None:
        plans.append(plan)
        solutions = [planned]
        for k in range(n_runners):
            # runners-up: the greedy search's best plan that lays out some parameter otherwise
            # than every plan before it (fast, deterministic, not proven optimal), while the
            # compile budget lasts
            if not compiles.left:
                break
            nxt = timed(S.solve_greedy, prob, limit, exclude=[s.choice for s in solutions])
            if nxt is None:
                break
            solutions.append(nxt)
            p = _plan(text, module, func, base, prob, nxt, mesh, consts, entry, filename, f"runner-up {k + 1}",
                      compiles)
            if p is not None:
                plans.append(p)
    solve_s = clock[0]
    floor = _floor(prob) if budget is not None and plan is None else None
    chosen = _choose(plans + [written], budget, compiles, _where(source, func), floor)
    others = [p for p in plans if p is not chosen]
    problem = {"units": len(prob.units), "groups": len(prob.groups), "edges": len(prob.edges),
               "variables": prob.size, "candidate_compiles": compiles.count}
    solver = planned.solver if planned is not None else method  # the ILP's time limit hands over to greedy
    return Autoshard(chosen.source, chosen, written, others, solver, solve_s, problem, budget, clock[1])


def _fit(budget: int | None, prob, compiles, solve, plan_of):
    """The search's plan, its solution and the parameters' limit it was solved under. Under a
    budget (it binds the compiled peak, which holds activations too) the parameters' share is
    tightened by what the plan went over, and solved again (keeping the last plan if none is
    found); then the other limits (_other_limits, _between_limits)."""
    limit = None if budget is None else float(budget)
    best = solve(limit)
    plan = planned = None
    tries = 0
    while best is not None:
        nxt = plan_of(best, force=plan is None)
        if nxt is None:  # over the compile budget: the last plan stands
            break
        plan, planned = nxt, best
        if budget is None or plan.totals()["peak_bytes_per_device"] <= budget or not compiles.left or tries == 4:
            break
        tries += 1
        over = plan.totals()["peak_bytes_per_device"] - budget
        limit = prob.param_bytes(best.choice) - over
        best = solve(limit) if limit > 0 else None
    if plan is not None and budget is not None and compiles.left:
        plan, planned = _other_limits(plan, planned, budget, prob, compiles, solve, plan_of)
        if tries and plan.totals()["peak_bytes_per_device"] <= budget:  # the budget's own limit went over
            plan, planned = _between_limits(plan, planned, budget, _floor(prob), float(budget), compiles, solve,
                                            plan_of)
    return plan, planned, limit


def _choose(candidates: list[Plan], budget: int | None, compiles, where, floor: float | None = None) -> Plan:
    """The fastest plan in the model that fits the budget (ties: the least peak memory, then the
    earlier candidate). `floor`: the parameters' bytes split as finely as they can be, where the
    search found no plan under the budget."""
    fits = [p for p in candidates if budget is None or p.totals()["peak_bytes_per_device"] <= budget]
    if not fits and floor is not None and floor > budget:
        raise SpmdError(f"no plan fits {budget:,} bytes per device: the parameters alone need {int(floor):,} bytes "
                        "per device, split as finely as the mesh allows", where,
                        note="the budget binds the compiled peak, which holds the activations too")
    if not fits:
        least = min(candidates, key=lambda p: p.totals()["peak_bytes_per_device"])
        raise SpmdError(f"no plan found fits {budget:,} bytes per device: the smallest of the plans kept "
                        f"needs {least.totals()['peak_bytes_per_device']:,}", where,
                        note=f"the search compiled {compiles.count} candidate programs; the layouts it weighs "
                        "bound the parameters' bytes, the budget the compiled peak (activations too)")
    # as fast as the fastest (to rounding): the least peak memory, then the earlier candidate
    rank = {id(p): i for i, p in enumerate(candidates)}
    best = min(p.totals()["modelled_time_us"] for p in fits)
    ties = [p for p in fits if p.totals()["modelled_time_us"] <= best + 1e-9]
    return min(ties, key=lambda p: (p.totals()["peak_bytes_per_device"], rank[id(p)]))


def _floor(prob) -> float:
    """The parameters' bytes per device split as finely as they can be."""
    return prob.param_bytes({i: min(range(g.n), key=lambda s, g=g: g.param_bytes[s] if g.param_bytes else 0)
                             for i, g in enumerate(prob.groups)})


def _other_limits(plan, planned, budget: int, prob, compiles, solve, plan_of):
    """Under a budget (it binds the parameters' bytes in the search, the compiled peak here): the
    plan with no budget (every budget above its peak gets it, so a looser budget never does worse
    than a tighter one) and, where the limits tightened from the first plan's overshoot did not
    reach the budget (the activations count too), the parameters split as finely as they can be.
    The better of those and `plan` (fitting first, then the modelled time), with its solution."""
    floor = _floor(prob)
    limits = [None] + ([floor] if plan.totals()["peak_bytes_per_device"] > budget else [])
    for lim in limits:
        if not compiles.left:
            break
        sol = solve(lim)
        alt = None if sol is None else plan_of(sol)
        if alt is None:
            continue
        peak, best_peak = alt.totals()["peak_bytes_per_device"], plan.totals()["peak_bytes_per_device"]
        faster = alt.totals()["modelled_time_us"] < plan.totals()["modelled_time_us"]
        if (peak <= budget and (best_peak > budget or faster)) or (best_peak > budget and peak < best_peak):
            plan, planned = alt, sol
    return plan, planned


def _between_limits(plan, planned, budget: int, fits: float, over: float, compiles, solve, plan_of, steps: int = 4):
    """Under a budget, where the parameters' limit `over` gave a plan over the budget and `fits`
    (the parameters split as finely as they can be) one that fits: the limits between, halved
    `steps` times. Tightening by the overshoot can step past faster plans that fit (a stripped
    train_mlp step at 300,000 bytes: 28.7 us where a 4.4 us plan of 245,764 bytes fits, found at
    400,000). The fastest fitting plan, with its solution."""
    for _ in range(steps):
        if not compiles.left or over - fits < 1024:
            break
        mid = (fits + over) / 2
        sol = solve(mid)
        alt = None if sol is None else plan_of(sol)
        if alt is None or alt.totals()["peak_bytes_per_device"] > budget:
            over = mid
            continue
        fits = mid
        if alt.totals()["modelled_time_us"] < plan.totals()["modelled_time_us"]:
            plan, planned = alt, sol
    return plan, planned


def _plan(text, module, func, base, prob, sol, mesh, consts, entry, filename, label, compiles,
          force: bool = False) -> Plan | None:
    """Write solution `sol` into the source: first the parameter and result specs, then shard()
    where propagation from those does not reach the chosen layout of an assignment. Each variant is
    compiled while `compiles` (the search's, shared by its plans: variants often write the same
    text) allows; the one with the least modelled step time is the plan. None when the budget is
    spent before the first variant (`force`: compile that one anyway, the search's first plan)."""
    prog = base.canonical

    def write(results, wrap: bool):
        t = _Text(text)
        params = _spec_edits(t, func, prob, sol, prog, results=results, structs=structs)
        constraints = _rewrap(t, func, others, chosen, got, prob, sol, c1) if wrap else []
        return _with_overrides(text, module, mesh, consts, base, t), params, constraints

    def candidate(results, wrap: bool):
        source, params, constraints = write(results, wrap)
        try:
            c = compiles.get(source)
            if c is None:
                return None
            c.spmd  # noqa: B018  (partition now: a plan that cannot be partitioned is not a candidate)
        except SpmdError:
            return None
        return Plan(label, source, c, sol.cost, params, constraints)

    structs = {s.name: s for s in module.structs}
    t = _Text(text)
    params = _spec_edits(t, func, prob, sol, prog, structs=structs)
    first = _with_overrides(text, module, mesh, consts, base, t)
    c1 = compiles.get(first, force=force)
    if c1 is None:
        return None
    plans = [Plan(label, first, c1, sol.cost, params, [])]
    # the assignments whose chosen layout propagation does not reproduce
    others = [f for f in module.funcs if f is not func]
    chosen = _assigned_values(prog, func, others)
    got = _assigned_values(c1.canonical, func, others)
    wrapped = bool(_rewrap(_Text(text), func, others, chosen, got, prob, sol, c1))
    if wrapped:
        p = candidate(True, True)
        if p is not None:
            plans.insert(0, p)
    # a result's layout propagates backwards, into a backward pass that no assignment names (a
    # weight update laid out as the search stores it pulls its split into the gradient): the same
    # plan with the results laid out as propagation lays them out from the rest, written in
    for wrap in ([True, False] if wrapped else [False]):
        source, _, _ = write(False, wrap)
        if not compiles.has(source, 2):  # this and the candidate it gives
            continue
        try:
            free = compiles.get(source)
            specs = [_spec(free.propagation.shardings[r.value]) for r in free.propagation.program.results]
        except SpmdError:
            continue
        p = candidate(specs, wrap)
        if p is not None:
            plans.append(p)
    rank = {id(p): i for i, p in enumerate(plans)}
    return min(plans, key=lambda p: (p.totals()["modelled_time_us"], rank[id(p)]))


# ---------------------------------------------------------------------------------- the report


def render_autoshard(console, report: dict) -> None:
    """The human-readable report: the chosen plan's annotations and ledger, the runners-up."""
    from rich.markup import escape

    from ..explain import heading, table

    mesh = ", ".join(f"{a}={n}" for a, n in report["mesh"]["axes"].items())
    prob = report["problem"]
    # (the search's time: weighing every reshard between strategies, then the solver)
    heading(console, f"autoshard  mesh [{mesh}]  search {report['solve_s']:.2f} s ({report['solver']})  "
            f"({prob['groups']} groups of {prob['units']} values and ops, {prob['variables']:,} variables)")
    chosen = report["chosen"]
    t = table("parameter", "sharding", "from")
    for x in chosen["layouts"]:
        t.add_row(escape(x["name"]), escape(x["sharding"]), x["from"])
    console.print(t)
    if chosen["constraints"]:
        t = table("line", "shard()", "sharding")
        for c in chosen["constraints"]:
            t.add_row(str(c["line"]), escape(c["name"]), escape(c["sharding"]))
        console.print(t)
    if chosen["collectives"]:
        heading(console, "collectives of the chosen plan (per device)")
        t = table("line", "kind", "axes", "bytes", "why", text_column="why",
                  texts=[x["reason"] for x in chosen["collectives"]])
        for x in chosen["collectives"]:
            t.add_row(str(x["line"] or ""), x["kind"], ",".join(x["axes"]), f"{x['bytes_per_device']:,}",
                      escape(x["reason"]))
        console.print(t)
    else:
        console.print("the chosen plan needs no collectives")
    heading(console, "plans (modelled step time: collectives + local work, tpu-v4 preset)")
    budget = report["memory_per_device"]
    t = table("plan", "colls", "bytes", "peak mem", *(("fits budget",) if budget is not None else ()), "time us")
    for p in report["plans"]:
        x = p["totals"]
        label = " = ".join(p["labels"]) + (" (chosen)" if p["chosen"] else "")
        fits = (("yes" if p["fits"] else "NO: over budget",) if budget is not None else ())
        t.add_row(escape(label), str(x["collectives"]), f"{x['bytes_per_device']:,}",
                  f"{x['peak_bytes_per_device']:,}", *fits, f"{x['modelled_time_us']:.1f}")
    console.print(t)
    if budget is not None:
        console.print(f"memory budget: {budget:,} bytes per device")
