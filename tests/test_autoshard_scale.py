"""autoshard on large programs: the work it does grows with the distinct questions a program asks,
not with its length (counts of strategy enumerations and compiles; never wall time: see
benchmarks/bench_autoshard_scale.py for that)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import spmdlang
from spmdlang.autoshard import autoshard, batch_only, driver
from spmdlang.autoshard import problem as ilp

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


def test_every_candidate_source_is_compiled_once(monkeypatch):
    sources = Counter()
    real = driver.compile

    def counted(source, **kw):
        sources[source] += 1
        return real(source, **kw)

    monkeypatch.setattr(driver, "compile", counted)
    path = ROOT / "programs" / "mlp.spmd"
    r = autoshard(batch_only(path.read_text(), str(path)), filename=str(path))
    assert r.chosen is not None
    assert sources and max(sources.values()) == 1, [n for n in sources.values() if n > 1]
