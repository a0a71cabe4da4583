"""`spmdlang autoshard`: the search (ILP and greedy), the source rewrite, the targets of the issue.

Every autosharded program is compiled again from its rewritten text and checked like any other
(ref == sim, jax on some); its modelled cost is compared with the hand-written annotations of
programs/ on the cost model's own measure (partition.cost.step_time_us of the compiled plans).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

import spmdlang
from spmdlang.autoshard import Plan, autoshard, batch_only, problem, solve, strip_annotations
from spmdlang.frontend.parse import parse

ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = sorted((ROOT / "programs").glob("*.spmd"))


@cache
def searched(name: str, budget: int | None = None, method: str = "auto"):
    path = ROOT / "programs" / name
    return autoshard(batch_only(path.read_text(), str(path)), filename=str(path), memory_per_device=budget,
                     method=method)


def hand(name: str) -> dict:
    return Plan("hand", "", spmdlang.compile(str(ROOT / "programs" / name))).totals()


def recompiled(result) -> spmdlang.Compiled:
    return spmdlang.compile(result.source, filename="autosharded.spmd")


# ---------------------------------------------------------------------------------- rewriting


def test_strip_annotations_keeps_the_program():
    text = (ROOT / "programs" / "transformer_block.spmd").read_text()
    stripped = batch_only(text)
    assert "shard(" not in stripped.split("func main")[1]
    body = stripped.split("func main")[1]
    assert "{_, model}" not in body and "x: f32[B, S, D] {data, _, _}" in body
    a, b = spmdlang.compile(text), spmdlang.compile(stripped)
    assert [op.kind for op in a.program.ops if op.kind != "shard"] == [op.kind for op in b.program.ops]


def test_output_is_the_same_program_with_annotations():
    r = searched("mlp.spmd")
    assert r.source.count("\n") == batch_only((ROOT / "programs" / "mlp.spmd").read_text()).count("\n")
    c = recompiled(r)
    assert all(p.sharding is not None for p in c.program.params)  # every parameter annotated
    assert all(res.sharding is not None for res in c.program.results)
    assert "# Pattern: data parallelism" in r.source  # comments kept


def test_user_annotations_are_constraints():
    text = (ROOT / "programs" / "mlp.spmd").read_text()
    r = autoshard(text, filename="mlp.spmd")
    c = recompiled(r)
    by_name = {p.name: str(p.sharding) for p in c.program.params}
    assert by_name["x"] == "{data, _}" and by_name["w1"] == "{_, model}" and by_name["w2"] == "{model, _}"
    assert str(c.program.results[0].sharding) == "{data, _}"


def test_mesh_and_const_overrides_are_written_in():
    r = autoshard(str(ROOT / "programs" / "mlp.spmd"), mesh={"data": 4, "model": 2}, consts={"B": 32})
    assert "mesh [data=4, model=2]" in r.source and "const B = 32" in r.source
    c = recompiled(r)
    assert dict(c.mesh.axes) == {"data": 4, "model": 2}


# ---------------------------------------------------------------------------------- targets


@pytest.mark.parametrize("name", ["mlp.spmd", "transformer_block.spmd"])
def test_no_worse_than_the_hand_annotations(name):
    """Only the batch dim of the input annotated, mesh [data=2, model=4]: the plan autoshard finds
    costs no more than the Megatron annotations of programs/, by the cost model."""
    r = searched(name)
    mine, theirs = r.chosen.totals(), hand(name)
    assert mine["modelled_time_us"] <= theirs["modelled_time_us"]
    assert r.report()["chosen"]["totals"] == mine
    c = recompiled(r)
    d = c.diff(backends=("sim",))
    assert d["ok"], d


def test_training_step_no_worse_than_the_hand_annotations():
    """The transformer block's training step (value_and_grad, Adam), only the batch dims of x and
    y left: the plan models at most the hand-written Megatron plan's step time and sends fewer
    bytes; the search's own objective agrees with the compiled plan within 5%."""
    from spmdlang.partition.cost import PLANNING

    r = searched("train_transformer.spmd")
    mine, theirs = r.chosen.totals(), hand("train_transformer.spmd")
    assert mine["modelled_time_us"] <= theirs["modelled_time_us"], (mine, theirs)
    assert mine["bytes_per_device"] <= theirs["bytes_per_device"], (mine, theirs)
    assert r.chosen.label == "autoshard"
    modelled = r.chosen.search_cost / (PLANNING.bandwidth_gbps * 1e3)
    assert abs(modelled - mine["modelled_time_us"]) <= 0.05 * mine["modelled_time_us"], modelled


_MLP_STEP = """mesh [data=4]
const B = 64
func loss(w1: f32[64, 256], w2: f32[256, 64], x: f32[B, 64], y: f32[B, 64]) -> f32[] {
  return mean((gelu(x @ w1) @ w2 - y) ** 2)
}
func main(w1: f32[64, 256], w2: f32[256, 64], x: f32[B, 64], y: f32[B, 64]) -> (f32[], f32[64, 256], f32[256, 64]) {
  l, g1, g2 = value_and_grad(loss, w1, w2, x, y, argnums=[0, 1])
  return l, w1 - 0.1 * g1, w2 - 0.1 * g2
}
"""


@pytest.mark.parametrize("batch", [4096, 4098])
def test_a_batch_that_does_not_divide_is_split_as_one_that_does(batch):
    """Data parallelism is the optimum of this step at B=4096 over 4 devices, and at B=4098 as well
    (one shard padded by 2 rows): the search weighs uneven splits, so it finds it there too (it
    kept the batch whole: 104.9 us against 74.2). Among plans of one modelled time, the one with
    the least memory is chosen (x split too, not only y)."""
    dp = _MLP_STEP.replace("x: f32[B, 64], y: f32[B, 64]) -> (",
                           "x: f32[B, 64] {data, _}, y: f32[B, 64] {data, _}) -> (")
    r = autoshard(_MLP_STEP, filename="step.spmd", consts={"B": batch})
    mine = r.chosen.totals()
    theirs = Plan("dp", "", spmdlang.compile(dp, filename="dp.spmd", consts={"B": batch})).totals()
    assert mine["modelled_time_us"] <= theirs["modelled_time_us"] * 1.001, (mine, theirs)
    assert r.chosen.params["y"] == "{data, _}", r.chosen.params
    if batch == 4096:
        assert r.chosen.params["x"] == "{data, _}", r.chosen.params
        assert mine["peak_bytes_per_device"] == theirs["peak_bytes_per_device"]
    assert recompiled(r).diff(backends=("sim",))["ok"]


@pytest.mark.parametrize("name", ["pipeline_microbatch.spmd", "decode_kv_cache.spmd"])
def test_loop_programs(name):
    """Also: the plans' totals count a loop body's collectives once per iteration, as explain's
    (the report listed pipeline_microbatch's plan as 1 collective of 8,192 bytes where explain
    says 11 of 90,112: one all-gather per iteration of the 11)."""
    from spmdlang.explain import explain_report

    r = searched(name)
    assert r.chosen.totals()["modelled_time_us"] <= r.as_written.totals()["modelled_time_us"]
    c = recompiled(r)
    assert c.diff(backends=("sim",))["ok"]
    for plan in (r.chosen, r.as_written):
        want = explain_report(plan.compiled)["totals"]
        assert {k: plan.totals()[k] for k in ("collectives", "bytes_per_device")} == \
            {k: want[k] for k in ("collectives", "bytes_per_device")}, plan.label


def test_memory_budget_shards_the_weights():
    """3 MB per device cannot hold the MLP's replicated weights (8 MB): autoshard must split them
    (it finds the Megatron layout: w1 by columns, w2 by rows over model)."""
    budget = 3_000_000
    free = searched("mlp.spmd")
    assert free.chosen.totals()["peak_bytes_per_device"] > budget  # without a budget: replicated weights
    r = searched("mlp.spmd", budget)
    params = r.chosen.params
    assert params["w1"] != "{_, _}" and params["w2"] != "{_, _}", params
    assert r.chosen.totals()["peak_bytes_per_device"] <= budget
    assert r.report()["memory_per_device"] == budget
    assert recompiled(r).diff(backends=("sim",))["ok"]


def test_moe_expert_dims_on_the_expert_axis():
    """Under a budget too small for replicated experts, the expert dim of both expert weights lands
    on the `expert` axis; nobody said which dim or which axis."""
    r = searched("moe.spmd", 4_000_000)
    assert r.chosen.params["wi"].startswith("{expert,"), r.chosen.params
    assert r.chosen.params["wo"].startswith("{expert,"), r.chosen.params
    assert recompiled(r).diff(backends=("sim",))["ok"]


def test_runners_up_are_other_plans():
    r = searched("mlp.spmd", 3_000_000)
    rep = r.report()
    assert rep["runners_up"], "expected runner-up plans"
    layouts = [rep["chosen"]["params"]] + [p["params"] for p in rep["runners_up"]]
    assert len({json.dumps(x, sort_keys=True) for x in layouts}) == len(layouts)
    for p in rep["runners_up"]:
        assert p["totals"]["modelled_time_us"] >= rep["chosen"]["totals"]["modelled_time_us"] or \
            p["totals"]["peak_bytes_per_device"] > 3_000_000


def test_no_plan_fits_is_a_located_error():
    with pytest.raises(spmdlang.SpmdError) as e:
        autoshard(str(ROOT / "programs" / "mlp.spmd"), memory_per_device=1000)
    assert "fits 1,000 bytes per device" in e.value.message and e.value.line is not None


def test_a_budget_below_the_parameters_says_what_they_need():
    """Under 70,000 bytes the search compiles plans (the smallest 79,872); under 60,000 it finds
    none: the error names the parameters' own floor (69,632), not the program as written's peak
    (270,336, which read as if a tighter budget needed more)."""
    text = "mesh [a=2, b=2]\nfunc main(x: f32[8, 256] {a, _}, w: f32[256, 256]) -> f32[8, 256] {\n  return x @ w\n}\n"
    needs = []
    for budget in (70_000, 60_000):
        with pytest.raises(spmdlang.SpmdError) as e:
            autoshard(text, filename="p.spmd", memory_per_device=budget)
        needs.append(int(e.value.message.split(" need")[1].split(" bytes")[0].split()[-1].replace(",", "")))
    assert "the parameters alone need 69,632" in e.value.message
    assert needs[1] <= needs[0], needs


def test_every_budget_a_found_plan_fits_finds_a_plan():
    """train_mlp with its annotations stripped: 300,000 bytes found a plan of 94,212, while
    250,000 and 100,000 failed ("the smallest found needs 442,372"): the limits tightened from
    the first plan's overshoot reached nothing. The parameters split as finely as they can be
    are now tried too, so every budget the 94,212-byte plan fits finds a plan."""
    path = ROOT / "programs" / "train_mlp.spmd"
    text = strip_annotations(path.read_text(), filename=str(path))
    for budget in (300_000, 250_000, 100_000):
        r = autoshard(text, filename=str(path), memory_per_device=budget)
        assert r.chosen.totals()["peak_bytes_per_device"] <= budget, budget


def test_a_budget_finds_faster_plans_than_the_tightened_limit_gave():
    """The same stripped step: 400,000 bytes finds a 4.4 us plan of 245,764 bytes, but 250,000 and
    300,000 chose a 28.7 us plan of 94,212 (the limit tightened by the first plan's overshoot, or the
    parameters split as finely as they can be, stepped past it). The parameters' limits between
    one that fits and one that does not are now tried too."""
    path = ROOT / "programs" / "train_mlp.spmd"
    text = strip_annotations(path.read_text(), filename=str(path))
    loose = autoshard(text, filename=str(path), memory_per_device=400_000).chosen.totals()
    for budget in (250_000, 300_000):
        got = autoshard(text, filename=str(path), memory_per_device=budget).chosen.totals()
        assert got["peak_bytes_per_device"] <= budget, (budget, got)
        assert got["modelled_time_us"] < 2 * loose["modelled_time_us"], (budget, got, loose)


# ---------------------------------------------------------------------------------- the search


def _problem(name="transformer_block.spmd"):
    path = ROOT / "programs" / name
    c = spmdlang.compile(batch_only(path.read_text()), filename=str(path))
    return problem.build(c.canonical)


def test_greedy_and_ilp_agree_on_the_block():
    prob = _problem()
    a, b = solve.solve_ilp(prob), solve.solve_greedy(prob)
    assert a.solver == "ilp" and b.solver == "greedy"
    assert a.cost <= b.cost + 1e-6  # the ILP is optimal for its own objective
    assert abs(prob.evaluate(a.choice) - a.cost) < 1e-6


def test_without_scipy_the_greedy_search_runs(monkeypatch):
    monkeypatch.setattr(solve, "have_solver", lambda: False)
    r = autoshard(batch_only((ROOT / "programs" / "mlp.spmd").read_text()), filename="mlp.spmd")
    assert r.solver == "greedy"
    assert recompiled(r).diff(backends=("sim",))["ok"]


def test_over_the_size_limit_the_greedy_search_runs(monkeypatch):
    monkeypatch.setattr(solve, "MAX_ILP_VARIABLES", 10)
    r = autoshard(batch_only((ROOT / "programs" / "mlp.spmd").read_text()), filename="mlp.spmd")
    assert r.solver == "greedy"


def test_identical_layers_are_solved_once():
    """The two inlined layer norms of the block share their strategy variables."""
    tied, untied = _problem(), None
    path = ROOT / "programs" / "transformer_block.spmd"
    c = spmdlang.compile(batch_only(path.read_text()))
    untied = problem.build(c.canonical, tie_layers=False, merge_elementwise=False)
    assert len(tied.groups) < len(untied.groups) / 2
    assert tied.size < untied.size


def test_a_loop_body_is_solved_once():
    """A `loop` stack of 48 layers is the same problem as one of 4 (its body's units, costs times
    the trip count), solved in well under 10 s; the carried residual stream has one layout."""
    text = batch_only((ROOT / "programs" / "stack_scan.spmd").read_text())
    probs = [problem.build(spmdlang.compile(text, consts={"L": n}).canonical) for n in (4, 48)]
    assert len(probs[0].groups) == len(probs[1].groups) and len(probs[0].units) == len(probs[1].units)
    assert abs(probs[0].size - probs[1].size) <= 0.01 * probs[0].size  # (edge classes can differ a little)
    r = autoshard(text, consts={"L": 48}, filename="stack.spmd", runners_up=0)
    assert r.solve_s < 10, r.solve_s
    assert "const L = 48" in r.source
    c = recompiled(r)
    assert c.diff(backends=("sim",))["ok"]
    assert r.chosen.totals()["modelled_time_us"] <= r.as_written.totals()["modelled_time_us"]


@pytest.mark.slow
def test_twelve_layer_training_step_is_solved_in_under_ten_seconds():
    """benchmarks/train_stack.spmd: value_and_grad through 12 unrolled layers and an SGD update
    (2,291 ops and values); identical layers share their variables and chains are eliminated
    before the ILP. CPU seconds of this process (the machine is shared)."""
    path = ROOT / "benchmarks" / "train_stack.spmd"
    r = autoshard(batch_only(path.read_text()), filename=str(path), runners_up=0)
    assert r.solver == "ilp" and r.solve_cpu_s < 10, (r.solve_cpu_s, r.solve_s)
    assert r.chosen.totals()["modelled_time_us"] <= r.as_written.totals()["modelled_time_us"]


def test_the_search_models_the_loop_plan():
    """The search's objective (link bytes, latency at the planning machine's alpha * beta) is the
    modelled step time of the plan compile produces from the written annotations, within 10%."""
    from spmdlang.partition.cost import PLANNING

    r = searched("stack_scan.spmd")
    assert r.chosen.search_cost is not None
    modelled = r.chosen.search_cost / (PLANNING.bandwidth_gbps * 1e3)
    assert abs(modelled - r.chosen.totals()["modelled_time_us"]) <= 0.1 * modelled, modelled


def test_deterministic():
    text = batch_only((ROOT / "programs" / "transformer_block.spmd").read_text())
    a = autoshard(text, filename="t.spmd", runners_up=0)
    b = autoshard(text, filename="t.spmd", runners_up=0)
    assert a.source == b.source


# ---------------------------------------------------------------------------------- random programs


def _random_cases(seeds, **kw):
    sys.path.insert(0, str(Path(__file__).parent))
    from progen import Generator, RandomChooser

    for seed in seeds:
        gen = Generator(RandomChooser(seed), **kw)
        text = gen.grad_program() if kw.get("grad") else gen.program()
        module, _ = parse(text)
        func = next(f for f in module.funcs if f.name == "main")
        first = func.params[0]
        keep = {first.name: _spec_text(first.spec)} if first.spec is not None else {}
        yield seed, strip_annotations(text, keep)


def _spec_text(spec) -> str:
    out = []
    for e in spec.entries:
        if e.axes is None:
            out.append("?")
        elif len(e.axes) == 1:
            out.append(e.axes[0])
        else:
            out.append("(" + ", ".join(e.axes) + ")")
    return "{" + ", ".join(out) + "}"


def _check_random(seeds, backends=("sim",), **kw):
    for seed, text in _random_cases(seeds, **kw):
        try:
            spmdlang.compile(text).spmd  # noqa: B018  (partitions, or says why not)
        except spmdlang.SpmdError:
            continue  # a "?" kept on a parameter, say: not a program to search
        r = autoshard(text, filename=f"seed{seed}.spmd", runners_up=1)
        c = recompiled(r)
        d = c.diff(backends=backends)
        assert d["ok"], (seed, r.source, d)
        assert r.chosen.totals()["modelled_time_us"] <= r.as_written.totals()["modelled_time_us"] + 1e-9


def test_random_programs_autoshard_and_diff():
    _check_random(range(6))


def test_random_loop_programs_autoshard_and_diff():
    _check_random(range(200, 206), loops=True)


@pytest.mark.slow
def test_random_loop_and_grad_programs_many():
    _check_random(range(206, 240), loops=True)
    _check_random(range(300, 330), grad=True)


@pytest.mark.slow
def test_random_programs_autoshard_and_diff_many():
    _check_random(range(6, 60))


@pytest.mark.slow
def test_random_programs_on_jax():
    _check_random(range(100, 106), backends=("sim", "jax", "xla"))


# ---------------------------------------------------------------------------------- every program


def _diff_cli(path: Path, backends: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "spmdlang", "diff", str(path), "--backends", backends, "--json"],
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=900)
    assert out.returncode == 0, out.stderr + out.stdout
    return json.loads(out.stdout)


@pytest.mark.parametrize("name,budget", [("mlp.spmd", None), ("moe.spmd", 4_000_000)])
def test_programs_pass_diff(name, budget, tmp_path):
    path = tmp_path / name
    path.write_text(searched(name, budget).source)
    assert _diff_cli(path, "sim,jax")["ok"]


@pytest.mark.slow
@pytest.mark.parametrize("path", PROGRAMS, ids=[p.name for p in PROGRAMS])
def test_every_program_passes_diff(path, tmp_path):
    out = tmp_path / path.name
    out.write_text(searched(path.name).source)
    assert _diff_cli(out, "sim,jax,xla")["ok"]


# ---------------------------------------------------------------------------------- the command


def _cli(*args, stdin=None):
    return subprocess.run([sys.executable, "-m", "spmdlang", "autoshard", *args], capture_output=True, text=True,
                          input=stdin, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=900)


def test_overridden_consts_keep_their_kind_in_the_written_program(tmp_path):
    """--set LR=1 on a float const writes `const LR = 1.0` (still a float const, as the compile read
    it), an integer const stays an integer."""
    src = tmp_path / "lr.spmd"
    src.write_text("mesh [data=2]\nconst LR = 0.5\nconst B = 8\n"
                   "func main(x: f32[B, 4] {data, _}, w: f32[4, 4]) -> f32[B, 4] {\n  return (x @ w) * LR\n}\n")
    out = tmp_path / "auto.spmd"
    r = _cli(str(src), "--set", "LR=1,B=4", "-o", str(out))
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    assert "const LR = 1.0" in text and "const B = 4" in text


def test_cli_writes_the_program_and_reports(tmp_path):
    src = tmp_path / "mlp.spmd"
    src.write_text(batch_only((ROOT / "programs" / "mlp.spmd").read_text()))
    out = tmp_path / "auto.spmd"
    r = _cli(str(src), "--memory-per-device", "3M", "-o", str(out), "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["output"] == str(out) and out.read_text() == report["source"]
    assert set(report) >= {"chosen", "runners_up", "as_written", "solver", "solve_s", "memory_per_device"}
    assert report["chosen"]["totals"]["peak_bytes_per_device"] <= 3 * 2**20
    plain = _cli(str(src))  # the program on stdout, the report on stderr
    assert plain.returncode == 0 and plain.stdout.startswith("# Pattern") and "plans" in plain.stderr


def test_cli_errors(tmp_path):
    assert _cli(str(tmp_path / "missing.spmd")).returncode == 2
    assert _cli(str(ROOT / "programs" / "mlp.spmd"), "--memory-per-device", "lots").returncode == 2
    assert _cli(str(ROOT / "programs" / "mlp.spmd"), "--solver", "magic").returncode == 2
    bad = tmp_path / "bad.spmd"
    bad.write_text("mesh [a=2]\nfunc main(x: f32[4] {b}) -> f32[4] {\n  return x\n}\n")
    r = _cli(str(bad))
    assert r.returncode == 1 and f"{bad}:2:" in r.stderr and "Traceback" not in r.stderr
    out = tmp_path / "never.spmd"
    r = _cli(str(ROOT / "programs" / "mlp.spmd"), "--memory-per-device", "1000", "-o", str(out))
    assert r.returncode == 1 and "error:" in r.stderr and not out.exists()  # nothing half-written


@pytest.mark.slow
@pytest.mark.parametrize("name", [
    "mlp.spmd", "transformer_block.spmd",
    pytest.param("train_transformer.spmd", marks=pytest.mark.xfail(strict=True, reason=(
        "the search's optimum is ZeRO-like (weights replicated, Adam states split over both axes): 5 "
        "collectives, 245,764 B, modelled 33.2 us against 43.5 us as written, one collective more than "
        "XLA's 4 (344,068 B) on the hand annotations"))),
    pytest.param("train_mlp.spmd", marks=pytest.mark.xfail(strict=True, reason=(
        "the search's optimum is pure data parallelism: 1 all-reduce, 131,076 B, modelled 6.9 us against the "
        "Megatron hand plan's 9.5 us, but more bytes than XLA's 57,348 on the hand annotations"))),
])
def test_measured_collectives_no_more_than_xla_with_the_hand_annotations(name):
    """Read from compiled HLO: our module for the autoshard plan against XLA's GSPMD partitioning
    the hand-annotated program."""
    from spmdlang.backend_jax.hlo import collectives, compiled_text

    def measured(c, backend):
        r = c.runner(backend)
        inputs = c.random_inputs(0)
        m = r.module  # struct parameters go in as nested dicts
        leaves = m._nest([inputs[p.name] for p in c.program.params], m.GLOBAL_SHAPES)
        hlo = collectives(compiled_text(r.fn, *m.place(leaves, r.mesh)))
        return len(hlo), sum(x["bytes_per_device"] for x in hlo)

    ours = measured(searched(name).compiled, "jax")
    xla = measured(spmdlang.compile(str(ROOT / "programs" / name)), "xla")
    assert ours[0] <= xla[0] and ours[1] <= xla[1], (ours, xla)
    if name.startswith("train_"):  # and no more bytes than our partitioner on the hand annotations
        assert ours[1] <= measured(spmdlang.compile(str(ROOT / "programs" / name)), "jax")[1]


# ---------------------------------------------------------------------------------- the report


def _report_text(rep: dict, width: int = 200) -> str:
    import io

    from rich.console import Console

    from spmdlang.autoshard import render_autoshard

    out = io.StringIO()
    render_autoshard(Console(file=out, width=width, color_system=None), rep)
    return out.getvalue()


def test_report_lists_each_distinct_plan_once_and_every_parameters_layout():
    """mlp annotates x, w1 and w2: the search's plan compiles to the program as written, so the
    two are one row; every parameter says what it gets and where that came from."""
    r = autoshard(str(ROOT / "programs" / "mlp.spmd"))
    rep = r.report()
    labels = [lab for p in rep["plans"] for lab in p["labels"]]
    assert len(labels) == len(set(labels)) == 2 + len(rep["runners_up"])  # every candidate, once
    assert rep["plans"][0]["chosen"] and rep["plans"][0]["labels"] == ["autoshard", "as written"]
    assert len({json.dumps(p["totals"], sort_keys=True) for p in rep["plans"]}) == len(rep["plans"])
    got = {x["name"]: (x["sharding"], x["from"]) for x in rep["chosen"]["layouts"]}
    assert got == {"x": ("{data, _}", "as written"), "w1": ("{_, model}", "as written"),
                   "b1": ("{model}", "autoshard"), "w2": ("{model, _}", "as written"), "b2": ("{_}", "autoshard")}
    text = _report_text(rep)
    assert text.count("as written") == 1 + 3 and "autoshard = as written (chosen)" in text  # 3: the layouts


def test_report_when_the_program_is_kept_as_written():
    """The program as written chosen: one row for it, and its parameters' layouts are listed
    (written, or inferred by propagation), never an empty table."""
    import dataclasses

    r = autoshard(str(ROOT / "programs" / "mlp.spmd"))
    kept = dataclasses.replace(r, chosen=r.as_written, runners_up=[r.chosen, *r.runners_up])
    rep = kept.report()
    assert [p["labels"] for p in rep["plans"]][0] == ["as written", "autoshard"]
    assert sum("as written" in p["labels"] for p in rep["plans"]) == 1
    got = {x["name"]: (x["sharding"], x["from"]) for x in rep["chosen"]["layouts"]}
    assert got["b1"] == ("{model}", "propagation") and got["x"] == ("{data, _}", "as written")
    assert len(got) == 5
    text = _report_text(rep)
    assert "as written = autoshard (chosen)" in text and "b1          {model}      propagation" in text


def test_report_under_a_budget_marks_the_plans_that_do_not_fit():
    r = searched("mlp.spmd", 2_362_400)
    rep = r.report()
    assert rep["plans"][0]["chosen"] and rep["plans"][0]["fits"]
    over = [p for p in rep["plans"] if p["totals"]["peak_bytes_per_device"] > 2_362_400]
    assert over and all(p["fits"] is False for p in over)
    text = _report_text(rep)
    assert text.count("NO: over budget") == len(over) and "fits budget" in text


def test_the_modelled_peak_does_not_depend_on_the_hash_seed():
    """The transformer step with every annotation stripped, compiled as written: its modelled peak
    was 3,738,628 bytes under some PYTHONHASHSEEDs and 3,869,700 under others (seed 4; the output
    buffers that temporaries may share were offered from a set), so autoshard's report changed
    from run to run. Three processes, three seeds, one answer."""
    code = ("import sys; import spmdlang; from spmdlang.autoshard import Plan, strip_annotations; "
            f"p = {str(ROOT / 'programs' / 'train_transformer.spmd')!r}; "
            "c = spmdlang.compile(strip_annotations(open(p).read(), filename=p), filename=p); "
            "print(Plan('x', '', c).totals()['peak_bytes_per_device'])")
    peaks = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            env={**os.environ, "PYTHONHASHSEED": seed}).stdout.strip() for seed in ("0", "4", "1")}
    assert len(peaks) == 1, peaks



STRUCT_ADAM = """mesh [x=4, y=2, z=1]
const B = 16
const D = 32
const F = 64
struct P {
  w1: f32[D, F]
  b1: f32[F]
  w2: f32[F, D]
}
func fwd(p: P, x: f32[B, D], y: f32[B, D]) -> f32[] {
  h = silu(x @ p.w1 + p.b1)
  return mean((h @ p.w2 - y) ** 2)
}
func adam(w: f32[..S], g: f32[..S], m: f32[..S], v: f32[..S]) -> (f32[..S], f32[..S], f32[..S]) {
  m = 0.9 * m + 0.1 * g
  v = 0.999 * abs(v) + 0.001 * g * g
  return w - 0.001 * m / (sqrt(v) + 1e-8), m, v
}
func main(p: P, m: P, v: P, x: f32[B, D] {x, _}, y: f32[B, D] {x, _}) -> (f32[], P, P, P) {
  l, g = value_and_grad(fwd, p, x, y)
  p, m, v = tree_map(adam, p, g, m, v)
  return l, p, m, v
}
"""


def test_autoshard_of_its_own_output_changes_nothing():
    """A struct whose fields carry no specs gets its leaves constrained at the top of main
    (`p = replace(p, w1=shard(p.w1, {...}))`); autoshard of that output wrote every such line a
    second time and listed the same plan twice, as "autoshard" and "as written"."""
    once = autoshard(STRUCT_ADAM, filename="adam.spmd")
    assert "replace(p, w1=shard(p.w1" in once.source or "replace(m, " in once.source
    twice = autoshard(once.source, filename="adam.spmd")
    assert twice.source == once.source
    assert twice.chosen.source == twice.as_written.source
