"""The reports a user reads, through the CLI: check, explain, diff and bench (CLI.md's JSON shapes),
and their text forms (no traceback, useful content)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import spmdlang
from spmdlang.cli import main

ROOT = Path(__file__).resolve().parent.parent
MLP = str(ROOT / "programs" / "mlp.spmd")
KINDS = {"all_gather", "all_reduce", "reduce_scatter", "all_to_all", "collective_permute"}


def run_cli(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_check_json(capsys):
    code, out, err = run_cli(capsys, "check", MLP, "--json")
    assert code == 0 and "Traceback" not in err
    d = json.loads(out)
    assert d["mesh"] == {"axes": {"data": 2, "model": 4}, "devices": list(range(8))}
    rows = {v["name"]: v for v in d["values"]}
    assert set(rows) >= {"x", "w1", "b1", "w2", "h", "return0"}
    assert rows["h"]["sharding"] == "{data, model}" and rows["h"]["type"] == "f32[64, 2048]"
    assert rows["b1"]["sharding"] == "{model}" and "w1" in rows["b1"]["reason"]
    for v in d["values"]:
        assert set(v) >= {"name", "type", "sharding", "partial", "reason"}


def test_check_text_and_mesh_override(capsys):
    code, out, err = run_cli(capsys, "check", MLP, "--mesh", "data=4,model=2")
    assert code == 0 and "{data, model}" in out and "data=4" in out


def test_explain_json_ledger(capsys):
    code, out, _ = run_cli(capsys, "explain", MLP, "--json")
    assert code == 0
    d = json.loads(out)
    (c,) = d["collectives"]
    assert c["kind"] == "all_reduce" and c["axes"] == ["model"] and c["line"] == 27
    assert c["bytes_per_device"] == 2 * 3 * 64 // 2 * 512 * 4 // 4  # 2 (k-1)/k of a [32, 512] f32 shard
    t = d["totals"]
    assert t["collectives"] == 1 and t["bytes_per_device"] == c["bytes_per_device"]
    assert t["flops_per_device"] > 0 and t["peak_bytes_per_device"] > 0
    assert {v["name"]: v for v in d["values"]}["h"]["partial"] == []


def test_explain_kinds_and_partial(capsys, tmp_path):
    p = tmp_path / "rs.spmd"
    p.write_text("mesh [a=2, b=4]\n"
                 "func main(x: f32[64, 512] {_, b}, w: f32[512, 256] {b, _}) -> f32[64, 256] {b, _} {\n"
                 "  y = x @ w\n  return y\n}\n")
    code, out, _ = run_cli(capsys, "explain", str(p), "--json")
    d = json.loads(out)
    assert [c["kind"] for c in d["collectives"]] == ["reduce_scatter"]
    assert {v["name"]: v for v in d["values"]}["y"]["partial"] == ["b"]
    assert all(c["kind"] in KINDS for c in d["collectives"])


def test_explain_text_with_layout_picture(capsys):
    code, out, err = run_cli(capsys, "explain", MLP, "--show", "h", "--preset", "gpu-nvlink")
    assert code == 0 and "all_reduce" in out and "dev 7" in out and "1536:2048]" in out and "[32:64," in out


def test_explain_show_unknown_value(capsys):
    code, _, err = run_cli(capsys, "explain", MLP, "--show", "nope")
    assert code == 2 and "no value named 'nope'" in err and "Traceback" not in err


def test_explain_bad_bandwidth_is_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        main(["explain", MLP, "--bandwidth", "model=fast"])
    assert e.value.code == 2


def test_diff_json_ref_sim(capsys):
    code, out, _ = run_cli(capsys, "diff", MLP, "--backends", "ref,sim", "--json", "--mesh", "data=3,model=3")
    assert code == 0
    d = json.loads(out)
    assert d["ok"] is True and d["backends"] == ["ref", "sim"]
    (r,) = d["results"]
    assert r["backend"] == "sim" and r["output"] == 0 and r["ok"] and r["max_abs_err"] >= 0


def test_diff_detects_a_mismatch(capsys, monkeypatch):
    """A wrong backend makes diff exit 1 (here: sim results perturbed on purpose)."""
    import spmdlang.backend_ref as br

    real = br.run_sim
    monkeypatch.setattr(br, "run_sim", lambda spmd, inputs: [o + 1.0 for o in real(spmd, inputs)])
    code, out, _ = run_cli(capsys, "diff", MLP, "--backends", "ref,sim", "--json")
    assert code == 1 and json.loads(out)["ok"] is False


def test_an_abort_inside_xla_is_the_xla_rows_error(capsys, monkeypatch, tmp_path):
    """XLA's SPMD partitioner aborts the whole process on some baselines (a failed CHECK: grad of a
    sort along an unevenly split dim, jax 0.10). diff and `run --backend xla` run the baseline in a
    child process: its abort is the xla row's error (an upstream disagreement) or a located error,
    and ours still report. The child's abort is forced here, whatever XLA's version does."""
    import spmdlang.backend_jax.multiprocess as mp

    real = mp.run_isolated
    monkeypatch.setattr(mp, "run_isolated", lambda source, *a, **k: real(
        source.replace("def build(mesh", "import os\nos.abort()\n\ndef build(mesh", 1), *a, **k))
    prog = tmp_path / "sortgrad.spmd"
    prog.write_text("mesh [a=4]\nfunc loss(x: f32[3, 2]) -> f32[] {\n  return sum(sort(x, axis=0))\n}\n"
                    "func main(x: f32[3, 2] {a, _}) -> f32[3, 2] {\n  return grad(loss, x)\n}\n")
    code, out, _ = run_cli(capsys, "diff", str(prog), "--json")
    d = json.loads(out)
    assert code == 1 and d["upstream_disagreement"] == ["xla"], d
    (row,) = [r for r in d["results"] if r["backend"] == "xla"]
    assert "XLA ended the process (killed by signal 6)" in row["error"]
    assert all(r["ok"] for r in d["results"] if r["backend"] != "xla")
    code, out, err = run_cli(capsys, "run", str(prog), "--backend", "xla")
    assert code == 1 and f"{prog}:1:1: error: the xla backend: XLA ended the process" in err
    assert "Traceback" not in err
    # a Python error in the child is not XLA's: an internal error (exit 3), not an upstream disagreement
    monkeypatch.setattr(mp, "run_isolated", lambda source, *a, **k: real(
        source.replace("def build(mesh", "raise ValueError('boom')\n\ndef build(mesh", 1), *a, **k))
    code, out, err = run_cli(capsys, "run", str(prog), "--backend", "xla")
    assert code == 3 and "internal error" in err and "Traceback" not in err
    # XLA refusing the baseline with an error of its own (its HLO verifier on a strided
    # ConvTranspose's gradient, 13 rows over 8): the xla row's error, as an abort is
    refuse = ("from jax.errors import JaxRuntimeError\n"
              "raise JaxRuntimeError('INVALID_ARGUMENT: during context [hlo verifier]: Slice dim size 1')\n\n")
    monkeypatch.setattr(mp, "run_isolated", lambda source, *a, **k: real(
        source.replace("def build(mesh", refuse + "def build(mesh", 1), *a, **k))
    code, out, _ = run_cli(capsys, "diff", str(prog), "--json")
    (row,) = [r for r in json.loads(out)["results"] if r["backend"] == "xla"]
    assert code == 1 and "XLA failed to compile it: INVALID_ARGUMENT: during context [hlo verifier]" in row["error"]
    code, out, err = run_cli(capsys, "run", str(prog), "--backend", "xla")
    assert code == 1 and "error: the xla backend: XLA failed to compile it" in err
    monkeypatch.setattr(mp, "run_isolated", real)
    code, out, _ = run_cli(capsys, "run", str(prog), "--backend", "xla", "--json")  # XLA's own, now or fixed
    assert code in (0, 1) and "Traceback" not in out


def test_compile_to_stdout_with_json_keeps_stdout_the_module(capsys):
    """`compile -o - --json`: the module alone on stdout, the JSON document on stderr (as run's);
    explain's --bandwidth of an axis the mesh lacks is command-line misuse, as --mesh's is."""
    code, out, err = run_cli(capsys, "compile", MLP, "--target", "jax", "-o", "-", "--json")
    assert code == 0 and out.startswith('"""Generated by spmdlang') and "def build(" in out
    assert json.loads(err) == {"target": "jax", "output": "-"}
    code, out, err = run_cli(capsys, "explain", MLP, "--bandwidth", "foo=1", "--json")
    assert code == 2 and not out and "--bandwidth: the mesh has no axis 'foo'" in err


def test_bench_json(capsys):
    code, out, err = run_cli(capsys, "bench", MLP, "--json", "--repeat", "2")
    assert code == 0
    d = json.loads(out)
    assert set(d) >= {"ours_s", "xla_s", "ratio", "ours_collectives", "xla_collectives", "compile_s",
                      "compile_includes"}
    assert d["ours_collectives"] == 1 and d["xla_collectives"] >= 1
    assert d["ratio"] == pytest.approx(d["ours_s"] / d["xla_s"])
    assert "parse" in d["compile_includes"] and "ours_jit_s" in d["compile_includes"]


@pytest.mark.parametrize("from_source", [True, False])
def test_bench_compile_time_is_a_fresh_compile(monkeypatch, from_source):
    """compile_s times our compiler from scratch, not the cached stages of the program the CLI has
    already compiled (once 0.006 s for a CNN whose compile takes 0.1 s)."""
    import spmdlang.api as api
    import spmdlang.partition.pipeline as spmd_mod  # the pass pipeline calls partition.spmd.partition
    from spmdlang.backend_jax.bench import fresh_compile_s

    c = spmdlang.compile(MLP)
    if not from_source:  # a Compiled made from a Program: timed from the global IR on
        c = api.Compiled(c.program)
    _ = c.jax_source  # every stage cached
    calls = {"parse": 0, "partition": 0}
    real_parse, real_partition = api.parse, spmd_mod.partition

    def parse(*a, **k):
        calls["parse"] += 1
        return real_parse(*a, **k)

    def partition(*a, **k):
        calls["partition"] += 1
        return real_partition(*a, **k)

    monkeypatch.setattr(api, "parse", parse)
    monkeypatch.setattr(spmd_mod, "partition", partition)
    assert fresh_compile_s(c) > 0
    assert calls == {"parse": 1 if from_source else 0, "partition": 1}


def test_compile_targets(capsys, tmp_path):
    for target, needle in (("ir", "# global program"), ("spmd", "all_reduce("), ("jax", "jax.shard_map"),
                           ("xla", "with_sharding_constraint")):
        code, out, _ = run_cli(capsys, "compile", MLP, "--target", target)
        assert code == 0 and needle in out, target


@pytest.mark.parametrize("argv", [
    ["run", MLP, "--backend", "ref", "--seed", "-1"],
    ["bench", MLP, "--repeat", "0"],
])
def test_bad_counts_are_usage_errors(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize("target", ["dir", "missing"])
def test_output_path_that_cannot_be_written(target, tmp_path, capsys):
    path = str(tmp_path) if target == "dir" else str(tmp_path / "no" / "such" / "out.ir")
    code, out, err = run_cli(capsys, "compile", MLP, "--target", "ir", "-o", path)
    assert code == 2 and "cannot write" in err and "internal error" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing half-written


def test_diff_reports_the_float_tolerance_even_when_the_last_result_is_an_integer(tmp_path, capsys):
    p = tmp_path / "mixed.spmd"
    p.write_text("mesh [x=2]\nfunc main(a: f32[4] {x}) -> (f32[4], i32[]) { return a * 2.0, argmax(a, axis=0) }\n")
    code, out, _ = run_cli(capsys, "diff", str(p), "--backends", "ref,sim", "--json")
    d = json.loads(out)
    assert code == 0 and d["rtol"] == d["atol"] == 1e-4


def test_json_is_strict_with_non_finite_numbers(tmp_path, capsys):
    """A result summing to -inf or NaN: `run --json` and `diff --json` write strict JSON (the
    strings "-inf", "nan"), which a parser refusing NaN/Infinity reads (they wrote -Infinity, NaN)."""
    import json

    from spmdlang.cli import main

    def strict(text):
        def refuse(token):
            raise ValueError(f"not JSON: {token}")
        return json.loads(text, parse_constant=refuse)

    prog = tmp_path / "p.spmd"
    prog.write_text("mesh [x=2]\nfunc main(a: f32[4] {x}) -> (f32[4], f32[4]) {\n"
                    "  return log(a * 0.0), sqrt(a - 10.0)\n}\n")
    assert main(["run", str(prog), "--backend", "ref", "--json"]) == 0
    sums = [o["sum"] for o in strict(capsys.readouterr().out)["outputs"]]
    assert sums == ["-inf", "nan"]
    main(["diff", str(prog), "--backends", "ref,sim", "--json"])
    strict(capsys.readouterr().out)


def test_a_results_settlement_has_a_line():
    """A sum carried out of a loop over a split dim is settled for the result: its collective's
    line is the result's (it was null in --json, blank in the table)."""
    import spmdlang

    c = spmdlang.compile("mesh [data=2]\nfunc main(x: f32[8] {data}) -> f32[] {\n  t = 0.0\n"
                         "  loop i in range(3) {\n    x = x * 2.0\n    t = t + sum(x)\n  }\n  return t\n}\n")
    entries = c.explain_report()["collectives"]
    assert entries and all(isinstance(e["line"], int) for e in entries), entries
