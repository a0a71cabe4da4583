"""`spmdlang autoshard`: choose the annotations a program leaves out, and write them into its source.

1. Compile the program as written (its annotations are the constraints) and build the search
   problem over its canonical global IR (spmdlang.search.ilp: strategies from the factor rules,
   edge costs from the reshard planner, the cost model's units).
2. Solve it (an ILP through HiGHS, or the greedy fallback), then again for runner-up plans that
   lay out some parameter differently.
3. Write each plan into the source as ordinary annotations (a rewrite keyed by the spans the
   frontend records): a spec on every parameter and result that had none, and `shard()` around
   the assignments of the entry function whose chosen layout propagation would not find by itself.
4. Compile every candidate, the program as written included, and keep the one with the least
   modelled step time (partition.cost.step_time_us: its collectives plus its local work) whose
   per-device peak memory fits the budget. What is reported is measured on the compiled plans.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .api import Compiled, compile, read_source
from .errors import Source, Span, SpmdError
from .frontend import ast as A
from .frontend.parse import parse


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
        from .partition.cost import collective_cost, compute_time_us, flops, peak_bytes, step_time_us

        mesh = self.compiled.mesh
        cols = [(x.kind, mesh.group_size(x.axes), x.bytes_per_device, x.axes) for x in self.collectives]
        fl = flops(self.compiled.spmd.program)
        return {"collectives": len(cols), "bytes_per_device": int(round(sum(x[2] for x in cols))),
                "flops_per_device": fl, "peak_bytes_per_device": peak_bytes(self.compiled.spmd.program),
                "modelled_time_us": round(step_time_us(cols, fl), 3),
                "compute_time_us": round(compute_time_us(fl), 3),
                "planner_cost": round(sum(collective_cost(k, g, b) for k, g, b, _ in cols), 1)}


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
    from .limits import deep_call

    return deep_call(_autoshard, text, filename, mesh, consts, entry, memory_per_device, method, runners_up)


def _autoshard(text, filename, mesh, consts, entry, budget, method, n_runners) -> Autoshard:
    from .search import ilp

    base = compile(text, mesh=mesh, consts=consts, entry=entry, filename=filename)
    module, source = parse(text, filename)
    func = _entry(module, entry)
    written = Plan("as written", _with_overrides(text, module, mesh, consts, base), base)

    if method in ("auto", "ilp") and ilp.have_solver():
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
    prob = timed(ilp.build, base.canonical, attach_params=budget is None)
    if method == "auto":
        method = "ilp" if ilp.have_solver() and prob.size <= ilp.MAX_ILP_VARIABLES else "greedy"
    solve = ilp.solve_ilp if method == "ilp" else ilp.solve_greedy
    limit = None if budget is None else float(budget)
    plans: list[Plan] = []
    seen = {text: base} if mesh is None and consts is None else {}  # source -> compiled, for _plan
    best = timed(solve, prob, limit)
    # the budget binds the compiled peak, which holds activations too: tighten the parameters'
    # share by what the plan went over, and solve again (keeping the last plan if none is found)
    for _ in range(5):
        if best is None:
            break
        plan = _plan(text, module, func, base, prob, best, mesh, consts, entry, filename, "autoshard", seen)
        if budget is None or plan.totals()["peak_bytes_per_device"] <= budget:
            break
        over = plan.totals()["peak_bytes_per_device"] - budget
        limit = prob.param_bytes(best.choice) - over
        nxt = timed(solve, prob, limit) if limit > 0 else None
        if nxt is None:
            break
        best = nxt
    if best is not None:
        solutions = [best]
        for _ in range(n_runners):
            # runners-up are for the report: the greedy search's best plan that lays out some
            # parameter otherwise than every plan before it (fast, deterministic, not proven optimal)
            nxt = timed(ilp.solve_greedy, prob, limit, exclude=[s.choice for s in solutions])
            if nxt is None:
                break
            solutions.append(nxt)
        plans.append(plan)
        for k, sol in enumerate(solutions[1:]):
            plans.append(_plan(text, module, func, base, prob, sol, mesh, consts, entry, filename,
                               f"runner-up {k + 1}", seen))
    solve_s = clock[0]
    candidates = plans + [written]
    fits = [p for p in candidates if budget is None or p.totals()["peak_bytes_per_device"] <= budget]
    if not fits:
        least = min(candidates, key=lambda p: p.totals()["peak_bytes_per_device"])
        raise SpmdError(f"no plan found fits {budget:,} bytes per device: the smallest found needs "
                        f"{least.totals()['peak_bytes_per_device']:,}", _where(source, func))
    rank = {id(p): i for i, p in enumerate(candidates)}
    chosen = min(fits, key=lambda p: (p.totals()["modelled_time_us"], rank[id(p)]))
    others = [p for p in plans if p is not chosen]
    problem = {"units": len(prob.units), "groups": len(prob.groups), "edges": len(prob.edges),
               "variables": prob.size}
    return Autoshard(chosen.source, chosen, written, others, method, solve_s, problem, budget, clock[1])


def _where(source: Source, func: A.FuncDef) -> Span:
    return func.span if func is not None else Span(source, 1, 1)


def _entry(module: A.Module, entry: str | None) -> A.FuncDef:
    funcs = {f.name: f for f in module.funcs}
    if entry is not None:
        return funcs[entry]
    return funcs.get("main") or module.funcs[0]


# ---------------------------------------------------------------------------------- source rewriting


class _Text:
    """Edits keyed by spans, applied together (none overlaps another)."""

    def __init__(self, text: str):
        self.text = text
        self.starts = [0]
        for i, ch in enumerate(text):
            if ch == "\n":
                self.starts.append(i + 1)
        self.edits: list[tuple[int, int, str]] = []

    def offset(self, line: int, col: int) -> int:
        return self.starts[line - 1] + col - 1

    def span(self, s: Span) -> tuple[int, int]:
        return self.offset(s.line, s.col), self.offset(s.end_line, s.end_col)

    def replace(self, s: Span, new: str) -> None:
        a, b = self.span(s)
        self.edits.append((a, b, new))

    def insert(self, at: int, new: str) -> None:
        self.edits.append((at, at, new))

    def extent(self, node) -> tuple[int, int]:
        """Offsets of the whole text of an expression: a node's own span can be a part of it (a
        binary operator's is its operator token), so take every sub-node's, then the parentheses
        that close around them."""
        a, b = self.span(node.span)

        def walk(n):
            nonlocal a, b
            for v in vars(n).values():
                for x in (v if isinstance(v, list) else [v]):
                    if isinstance(x, A.Node) and x.span is not None and x.span.end_line is not None:
                        xa, xb = self.span(x.span)
                        a, b = min(a, xa), max(b, xb)
                        walk(x)

        walk(node)
        while True:
            depth = 0
            low = 0
            for ch in self.text[a:b]:
                depth += ch == "("
                depth -= ch == ")"
                low = min(low, depth)
            if low < 0:  # a ')' closes something opened before: take its '('
                a = self.text.rindex("(", 0, a)
            elif depth > 0:
                b = self.text.index(")", b) + 1
            else:
                return a, b

    def wrap(self, node, before: str, after: str) -> None:
        a, b = self.extent(node)
        self.edits.append((a, a, before))
        self.edits.append((b, b, after))

    def result(self) -> str:
        out = self.text
        for a, b, new in sorted(self.edits, key=lambda e: (e[0], e[1]), reverse=True):
            out = out[:a] + new + out[b:]
        return out


def _with_overrides(text: str, module: A.Module, mesh, consts, base: Compiled, t: _Text | None = None) -> str:
    """The source with --mesh and --set written into the mesh and const declarations."""
    t = t or _Text(text)
    for m in module.meshes:
        for ax in m.axes:
            if mesh and ax.name in mesh:
                t.replace(ax.size.span, str(mesh[ax.name]))
    for cdecl in module.consts:
        if consts and cdecl.name in consts:
            t.replace(cdecl.value.span, str(consts[cdecl.name]))
    return t.result()


def _assignments(stmts) -> list[A.Assign]:
    out = []
    for s in stmts:
        if isinstance(s, A.Assign):
            out.append(s)
        elif isinstance(s, (A.For, A.Loop)):
            out.extend(_assignments(s.body))
    return out


def _key(span: Span | None):
    return None if span is None else (span.line, span.col, span.end_line, span.end_col)


def _assigned_values(prog, func, others=()) -> dict:
    """id(Assign) -> the value it assigns, for the entry function's assignments: inside `for`
    bodies by the span of the assigned expression (the last op emitted for it: every iteration is
    one statement of the source), at the top level by name (values take the entry function's
    names; the k-th assignment to a name is its k-th value)."""
    by_span = {}
    by_name: dict = {}
    from .ir.core import all_ops

    for op in all_ops(prog.ops):
        for r in op.results:
            if r.name:
                by_name.setdefault(r.name, []).append(r)
        k = _key(op.span)
        if k is not None and len(op.results) == 1 and not op.backward:
            by_span[k] = op.result
    out = {}
    for f in others:  # another function's assignments (inlined: by span, the last call's value)
        for s in _assignments(f.body):
            v = by_span.get(_key(s.value.span))
            if v is not None:
                out[id(s)] = v
    for s in _assignments_in_loops(func.body):
        v = by_span.get(_key(s.value.span))
        if v is not None:
            out[id(s)] = v
    top = [s for s in func.body if isinstance(s, A.Assign)]
    looped = {s.target for s in _assignments_in_loops(func.body)}
    for name in {s.target for s in top} - looped:
        stmts = [s for s in top if s.target == name]
        values = by_name.get(name, [])
        if len(values) == len(stmts):
            out.update({id(s): v for s, v in zip(stmts, values)})
    return out


def _assignments_in_loops(stmts, inside: bool = False) -> list[A.Assign]:
    out = []
    for s in stmts:
        if isinstance(s, A.Assign) and inside:
            out.append(s)
        elif isinstance(s, (A.For, A.Loop)):
            out.extend(_assignments_in_loops(s.body, True))
    return out


def _spec(s) -> str:
    from .ir.mesh import Sharding

    return str(Sharding(s.dims))


def _struct_leaves(structs: dict, name: str, prefix: str, lead: int = 0) -> list:
    """(dotted path, field declaration, stacking dims before the field's own) of every leaf of a
    value of struct `name`, depth-first."""
    out = []
    for f in structs[name].fields:
        if f.type.dtype in structs:
            out += _struct_leaves(structs, f.type.dtype, f"{prefix}.{f.name}", lead + len(f.type.dims or []))
        else:
            out.append((f"{prefix}.{f.name}", f, lead))
    return out


def _leaf_constraint(path: str, spec: str) -> str:
    """`p = replace(p, blocks=replace(p.blocks, w1=shard(p.blocks.w1, {...})))`: one struct leaf constrained."""
    parts = path.split(".")
    value = f"shard({path}, {spec})"
    for k in range(len(parts) - 1, 0, -1):
        value = f"replace({'.'.join(parts[:k])}, {parts[k]}={value})"
    return f"{parts[0]} = {value}"


def _spec_edits(t: _Text, func, prob, sol, prog, results=True, structs: dict | None = None) -> dict:
    """Insert a spec on every parameter and result of `func` that has none; returns name -> spec of
    every parameter (a struct's leaves by their dotted names). results: True (the search's
    layouts), False (none), or a list of specs. A struct's leaves are laid out by its field specs:
    a field without one gets the layout the search chose for it in the first parameter of that
    struct (when its stacking dims are unsplit); struct results follow their declaration."""
    from .ir.mesh import Sharding

    structs = structs or {}
    params = {}
    by_name = {p.name: p for p in prog.params}
    fields: dict[int, tuple] = {}  # field declaration -> (it, [(leaf path, chosen sharding, lead)])
    for p in func.params:
        if p.type.dtype in structs:
            for path, fd, lead in _struct_leaves(structs, p.type.dtype, p.name, len(p.type.dims or [])):
                if path not in by_name:
                    continue
                sh = prob.sharding(by_name[path], sol)
                params[path] = _spec(sh)
                if fd.spec is None:
                    fields.setdefault(id(fd), (fd, []))[1].append((path, sh, lead))
            continue
        if p.name not in by_name:
            continue
        params[p.name] = _spec(prob.sharding(by_name[p.name], sol))
        if p.spec is None:
            t.insert(t.span(p.type.span)[1], " " + params[p.name])
    # a field whose leaves the search lays out alike (stacking dims unsplit) gets that spec; the
    # leaves of one that differs (weights replicated, their Adam moments split) are constrained one
    # by one at the top of the function
    constraints = []
    for fd, leaves in fields.values():
        inner = {_spec(Sharding(tuple(sh.dims[lead:]))) for _, sh, lead in leaves}
        if len(inner) == 1 and not any(any(sh.dims[:lead]) for _, sh, lead in leaves):
            t.insert(t.span(fd.type.span)[1], " " + inner.pop())
        else:
            constraints += [(path, _spec(sh)) for path, sh, _ in leaves]
    if constraints and func.body:
        first = func.body[0]
        indent = "\n" + " " * (first.span.col - 1)
        t.insert(t.extent(first)[0], "".join(_leaf_constraint(path, spec) + indent for path, spec in constraints))
    i = 0  # the result's (first leaf's) index in prog.results
    for r in func.results:
        if r.type.dtype in structs:
            i += len(_struct_leaves(structs, r.type.dtype, "", len(r.type.dims or [])))
            continue
        if r.spec is None and i < len(prog.results) and results is not False:
            spec = _spec(prob.value_sharding(prog.results[i].value, sol)) if results is True else results[i]
            t.insert(t.span(r.type.span)[1], " " + spec)
        i += 1
    return params


def _plan(text, module, func, base, prob, sol, mesh, consts, entry, filename, label, seen=None) -> Plan:
    """Write solution `sol` into the source: first the parameter and result specs, then shard()
    where propagation from those does not reach the chosen layout of an assignment. Each variant is
    compiled; the one with the least modelled step time is the plan. `seen`: source text ->
    compiled, shared by the plans of one search (variants often write the same text)."""
    prog = base.canonical
    seen = {} if seen is None else seen

    def compile_once(source):
        if source not in seen:
            seen[source] = compile(source, filename=filename, entry=entry)
        return seen[source]

    def write(results, wrap: bool):
        t = _Text(text)
        params = _spec_edits(t, func, prob, sol, prog, results=results, structs=structs)
        constraints = _rewrap(t, func, others, chosen, got, prob, sol, c1) if wrap else []
        return _with_overrides(text, module, mesh, consts, base, t), params, constraints

    def candidate(results, wrap: bool):
        source, params, constraints = write(results, wrap)
        try:
            c = compile_once(source)
            c.spmd  # noqa: B018  (partition now: a plan that cannot be partitioned is not a candidate)
        except SpmdError:
            return None
        return Plan(label, source, c, sol.cost, params, constraints)

    structs = {s.name: s for s in module.structs}
    t = _Text(text)
    params = _spec_edits(t, func, prob, sol, prog, structs=structs)
    first = _with_overrides(text, module, mesh, consts, base, t)
    c1 = compile_once(first)
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
        try:
            free = compile_once(source)
            specs = [_spec(free.propagation.shardings[r.value]) for r in free.program.results]
        except SpmdError:
            continue
        p = candidate(specs, wrap)
        if p is not None:
            plans.append(p)
    rank = {id(p): i for i, p in enumerate(plans)}
    return min(plans, key=lambda p: (p.totals()["modelled_time_us"], rank[id(p)]))


def _rewrap(t: _Text, func, others, chosen: dict, got: dict, prob, sol, c1) -> list:
    """shard() around the assignments whose chosen layout propagation (in c1) does not reproduce."""
    from .ir import registry

    constraints = []
    for s in [s for f in [func] + others for s in _assignments(f.body)]:
        v, g = chosen.get(id(s)), got.get(id(s))
        if v is None or g is None or g.type != v.type or v not in prob.producer:
            continue
        unit, j = prob.producer[v]
        if hasattr(unit, "kind") and registry.get(unit.kind).constraint:
            continue
        want = _spec(prob.sharding(unit, sol, j))
        if want != _spec(c1.propagation.shardings[g]):
            t.wrap(s.value, "shard(", f", {want})")
            constraints.append({"line": s.span.line, "name": s.target, "sharding": want})
    return constraints


# ---------------------------------------------------------------------------------- stripping


def strip_annotations(text: str, keep: dict[str, str] | None = None, filename: str = "<input>",
                      entry: str | None = None) -> str:
    """The program with every sharding annotation of its entry function removed (parameter and
    result specs, the field specs of structs, shard() calls), except the parameter specs in `keep`
    (name -> spec text)."""
    module, _source = parse(text, filename)
    func = _entry(module, entry)
    keep = keep or {}
    t = _Text(text)
    for sd in module.structs:
        for f in sd.fields:
            if f.spec is not None:
                t.edits.append((t.span(f.type.span)[1], t.span(f.spec.span)[1], ""))
    for p in func.params:
        if p.spec is not None:
            a = t.span(p.type.span)[1]
            b = t.span(p.spec.span)[1]
            t.edits.append((a, b, (" " + keep[p.name]) if p.name in keep else ""))
        elif p.name in keep:
            t.insert(t.span(p.type.span)[1], " " + keep[p.name])
    for r in func.results:
        if r.spec is not None:
            t.edits.append((t.span(r.type.span)[1], t.span(r.spec.span)[1], ""))

    def strip_calls(node):
        if isinstance(node, A.Call) and node.func == "shard" and node.args:
            a, eb = t.extent(node)
            inner = node.args[0]
            ia, ib = t.extent(inner)
            t.edits.append((a, ia, ""))
            t.edits.append((ib, eb, ""))
            strip_calls(inner)
            return
        for v in vars(node).values():
            for x in (v if isinstance(v, list) else [v]):
                if isinstance(x, A.Node):
                    strip_calls(x)

    for s in func.body:
        strip_calls(s)
    return t.result()


def _int(node) -> int | None:
    """An integer literal's value (negative ones included), else None."""
    if isinstance(node, A.IntLit):
        return node.value
    if isinstance(node, A.Neg) and isinstance(node.operand, A.IntLit):
        return -node.operand.value
    return None


def _grad_args(func: A.FuncDef) -> tuple[set[str], set[str]]:
    """Names passed to a grad or value_and_grad call in `func`: (at a differentiated position,
    `argnums`, default [0]: a training step's weights; at the others: its batch, labels, ...)."""
    out: set[str] = set()
    data: set[str] = set()

    def walk(node):
        if isinstance(node, A.Call) and node.func in ("grad", "value_and_grad"):
            args = node.args[1:]  # args[0] is the function
            nums = [0]
            for kw in node.kwargs:
                if kw.name == "argnums":
                    items = kw.value.items if isinstance(kw.value, (A.ListLit, A.TupleLit)) else [kw.value]
                    nums = [_int(i) % len(args) for i in items if _int(i) is not None and args]
            for i, a in enumerate(args):
                if isinstance(a, A.Name):
                    (out if i in nums else data).add(a.id)
        if isinstance(node, A.Node):
            for v in vars(node).values():
                walk(v)
        elif isinstance(node, (list, tuple)):
            for v in node:
                walk(v)

    walk(func.body)
    return out, data - out


def batch_only(text: str, filename: str = "<input>", entry: str | None = None) -> str:
    """The program with every annotation of its entry function removed except the first split dim
    of its batch input: what the benchmarks give autoshard to start from. The batch input is the
    first split parameter that a grad call takes but does not differentiate (a training step's
    data), else the first split parameter no grad call differentiates (a training step's weights
    and optimizer state are what the search is to choose)."""
    module, _source = parse(text, filename)
    func = _entry(module, entry)
    weights, data = _grad_args(func)
    split = [q for q in func.params if q.spec is not None and any(e.axes and e.axes != ("_",) for e in q.spec.entries)]
    p = next((q for q in split if q.name in data), None) or next((q for q in split if q.name not in weights),
                                                                  func.params[0])
    entries, done = [], False
    for e in (p.spec.entries if p.spec is not None else []):
        if e.axes and e.axes != ("_",) and not done:
            entries.append(e.axes[0] if len(e.axes) == 1 else "(" + ", ".join(e.axes) + ")")
            done = True
        else:
            entries.append("_")
    return strip_annotations(text, {p.name: "{" + ", ".join(entries) + "}"} if done else {}, filename, entry)


# ---------------------------------------------------------------------------------- the report


def render_autoshard(console, report: dict) -> None:
    """The human-readable report: the chosen plan's annotations and ledger, the runners-up."""
    from rich.markup import escape

    from .explain import heading, table

    mesh = ", ".join(f"{a}={n}" for a, n in report["mesh"]["axes"].items())
    prob = report["problem"]
    heading(console, f"autoshard  mesh [{mesh}]  solver {report['solver']}  {report['solve_s']:.2f} s  "
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
