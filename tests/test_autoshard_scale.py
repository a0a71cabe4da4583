"""autoshard on large programs: the work it does grows with the distinct questions a program asks,
not with its length, and the candidate compiles are bounded (counts of strategy enumerations,
cost evaluations and compiles; never wall time: see benchmarks/bench_autoshard_scale.py for that)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import spmdlang
from spmdlang.autoshard import autoshard, batch_only, driver, solve
from spmdlang.autoshard import problem as ilp
from spmdlang.ir.core import walk

ROOT = Path(__file__).resolve().parent.parent


def distinct_layers(n: int) -> str:
    params = ", ".join(f"w{i}: f32[16, 16]" for i in range(n))
    body = "".join(f"  h = tanh(h @ w{i}) * {1.0 + i % 3}\n" for i in range(n))
    return (f"mesh [data=2, model=2]\nfunc main(x: f32[8, 16] {{data, _}}, {params}) -> f32[8, 16] {{\n"
            f"  h = x\n{body}  return h\n}}\n")


def test_alike_layers_enumerate_their_strategies_once(monkeypatch):
    """Distinct weights make each layer its own group, but the layers ask the same questions:
    op_views runs once per signature (kind, attributes, types, rule), not once per layer."""
    calls = Counter()
    real = ilp.op_views

    def counted(op, rule, mesh):
        calls[op.kind] += 1
        return real(op, rule, mesh)

    monkeypatch.setattr(ilp, "op_views", counted)
    for n in (3, 24):
        calls.clear()
        prob = ilp.build(spmdlang.compile(distinct_layers(n)).canonical)
        assert len(prob.groups) > n  # one group (at least) per layer: nothing tied them
        assert calls["einsum"] == 1, calls
        assert calls["full"] <= 3 and sum(calls.values()) <= 4, calls  # the constants 1.0, 2.0, 3.0
    # the views are the same objects, so each edge cost is computed once too
    einsums = [u for u in prob.units if getattr(u, "kind", None) == "einsum"]
    assert len({id(prob.views[u]) for u in einsums}) == 1


def _count_compiles(monkeypatch) -> Counter:
    """driver.compile counting the sources it is given (the counter fills as the search runs)."""
    sources = Counter()
    real = driver.compile

    def counted(source, **kw):
        sources[source] += 1
        return real(source, **kw)

    monkeypatch.setattr(driver, "compile", counted)
    return sources


def test_every_candidate_source_is_compiled_once(monkeypatch):
    sources = _count_compiles(monkeypatch)
    path = ROOT / "programs" / "mlp.spmd"
    r = autoshard(batch_only(path.read_text(), str(path)), filename=str(path))
    assert r.chosen is not None
    assert sources and max(sources.values()) == 1, [n for n in sources.values() if n > 1]


def _ops(text: str) -> int:
    return sum(1 for _ in walk(spmdlang.compile(text).canonical.ops))


def test_candidate_compiles_are_bounded_by_the_program_size(monkeypatch):
    """A search compiles at most CANDIDATE_COMPILE_OPS ops of candidates (and at most
    MAX_CANDIDATE_COMPILES), but always the optimum: on a program over the budget, one compile."""
    sources = _count_compiles(monkeypatch)
    small = autoshard(distinct_layers(2), filename="small.spmd")
    unbounded = sum(sources.values())
    assert unbounded >= 4 and small.problem["candidate_compiles"] == unbounded  # variants and runners-up
    assert unbounded <= driver.MAX_CANDIDATE_COMPILES
    for n in (6, 24):
        text = distinct_layers(n)
        ops = _ops(text)
        monkeypatch.setattr(driver, "CANDIDATE_COMPILE_OPS", 2 * ops)  # room for two
        sources.clear()
        r = autoshard(text, filename="layers.spmd")
        assert sum(sources.values()) == r.problem["candidate_compiles"] == 2, sources
        assert r.chosen.compiled.spmd is not None and r.chosen.label == "autoshard"
        monkeypatch.setattr(driver, "CANDIDATE_COMPILE_OPS", ops // 2)  # not even one: the optimum anyway
        sources.clear()
        r = autoshard(text, filename="layers.spmd")
        assert sum(sources.values()) == r.problem["candidate_compiles"] == 1, sources
        assert r.runners_up == [] and r.chosen.label == "autoshard"
        assert r.chosen.totals()["modelled_time_us"] <= r.as_written.totals()["modelled_time_us"]


def test_the_search_work_per_op_does_not_grow_with_the_program(monkeypatch):
    """Strategy enumerations, reshard questions and greedy cost evaluations per layer stay flat
    from 8 to 32 layers (the runners-up's greedy search used to price every trial move with a
    full evaluation of the plan: quadratic), and the plan is evaluated whole a fixed number of
    times."""
    counts = Counter()

    def counting(module, name):
        real = getattr(module, name)

        def wrapper(*a, **k):
            counts[name] += 1
            return real(*a, **k)

        monkeypatch.setattr(module, name, wrapper)

    counting(ilp, "op_views")
    counting(ilp, "plan_reshard")
    counting(ilp, "_edge_cost")
    counting(solve._Greedy, "local")
    counting(ilp.Problem, "evaluate")
    per_op = {}
    for n in (8, 32):
        counts.clear()
        prob = ilp.build(spmdlang.compile(distinct_layers(n)).canonical)
        built = dict(counts)
        best = solve.solve_ilp(prob)
        runners = [best.choice]
        for _ in range(2):
            runners.append(solve.solve_greedy(prob, exclude=runners).choice)
        ops = _ops(distinct_layers(n))
        per_op[n] = {k: v / ops for k, v in counts.items()}
        assert built.get("op_views", 0) <= 4 and built.get("plan_reshard", 0) < 100, built  # alike: asked once
        assert counts["evaluate"] <= 6, counts  # once per solve, once more per runner-up's last move
    assert per_op[32]["local"] <= 1.25 * per_op[8]["local"], per_op
    assert per_op[32]["_edge_cost"] <= 1.25 * per_op[8]["_edge_cost"], per_op
