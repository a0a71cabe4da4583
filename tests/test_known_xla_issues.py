"""XLA's own partitioner (the `xla` baseline) against ours: `diff` marks the baseline's wrong
answers as an upstream disagreement when our backends agree with ref, and the standalone
reproductions in docs/known_xla_issues.md still show what the page says."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import spmdlang
from spmdlang.cli import main

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "known_xla_issues.md"
STRIDED = """mesh [r=3]
func main(x: f32[8] {r}) -> f32[1] {
  v = x[4:7:2]
  return v[1:2:3]
}
"""


def _doc_snippets() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)


def _run_snippet(code: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # each snippet sets its own
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_strided_slice_reproduction_shows_xla_partitioner_is_wrong():
    out = _run_snippet(_doc_snippets()[0])
    assert "unsharded [6.]" in out  # unpartitioned: right
    assert "sharded   [4.]" in out, f"XLA no longer gets it wrong? update docs/known_xla_issues.md\n{out}"


def test_all_to_all_reproduction_shows_xla_rejects_its_hlo():
    out = _run_snippet(_doc_snippets()[1])
    assert "rejected:" in out and "all-to-all has operands with different shapes" in out, out


def _diff(capsys, path, *extra):
    code = main(["diff", str(path), *extra])
    return code, capsys.readouterr()


def test_diff_marks_the_xla_baseline_as_upstream(tmp_path, capsys):
    p = tmp_path / "strided.spmd"
    p.write_text(STRIDED)
    code, out = _diff(capsys, p, "--json")
    d = json.loads(out.out)
    assert code == 1 and d["ok"] is False  # still a failed diff
    assert d["upstream_disagreement"] == ["xla"] and d["known_issues"] == "docs/known_xla_issues.md"
    by = {r["backend"]: r for r in d["results"]}
    assert by["sim"]["ok"] and by["jax"]["ok"] and not by["xla"]["ok"]
    assert by["xla"]["upstream_disagreement"] is True
    assert "upstream_disagreement" not in by["sim"] and "upstream_disagreement" not in by["jax"]
    assert set(d) >= {"ok", "backends", "results"}  # CLI.md's shape

    code, out = _diff(capsys, p)
    text = " ".join(out.out.split())
    assert code == 1 and "upstream disagreement" in text and "docs/known_xla_issues.md" in text
    assert "--backends ref,sim,jax" in text

    code, out = _diff(capsys, p, "--backends", "ref,sim,jax", "--json")
    assert code == 0 and json.loads(out.out)["upstream_disagreement"] == []


def _perturb(monkeypatch, *wrong: str):
    """Make backends wrong on purpose (the diff logic, not XLA's bug, under test)."""
    real = spmdlang.api.Compiled.run

    def run(self, inputs=None, backend="ref", *a, **k):
        outs = real(self, inputs, backend, *a, **k)
        return [o + 1.0 for o in outs] if backend in wrong else outs

    monkeypatch.setattr(spmdlang.api.Compiled, "run", run)


MLP = ROOT / "programs" / "mlp.spmd"


def test_wrong_xla_with_our_backends_right_is_upstream(monkeypatch, capsys):
    _perturb(monkeypatch, "xla")
    code, out = _diff(capsys, MLP, "--backends", "ref,sim,xla", "--json")
    d = json.loads(out.out)
    assert code == 1 and d["upstream_disagreement"] == ["xla"]


@pytest.mark.parametrize("wrong", ["sim", "jax"])
def test_our_backend_wrong_is_never_upstream(wrong, monkeypatch, capsys):
    """When one of ours is wrong too, nothing is blamed on XLA, even if xla is also wrong."""
    _perturb(monkeypatch, wrong, "xla")
    code, out = _diff(capsys, MLP, "--backends", f"ref,{wrong},xla", "--json")
    d = json.loads(out.out)
    assert code == 1 and d["upstream_disagreement"] == []
    assert not any(r["ok"] for r in d["results"]) and not any("upstream_disagreement" in r for r in d["results"])
    code, out = _diff(capsys, MLP, "--backends", f"ref,{wrong}")
    assert code == 1 and "upstream" not in out.out


def test_xla_alone_is_not_judged(monkeypatch, capsys):
    """With no backend of ours to compare, a wrong xla stays a plain mismatch."""
    _perturb(monkeypatch, "xla")
    code, out = _diff(capsys, MLP, "--backends", "ref,xla", "--json")
    assert code == 1 and json.loads(out.out)["upstream_disagreement"] == []


def test_xla_baseline_that_fails_to_compile_is_a_failed_result(monkeypatch, capsys):
    """XLA's partitioner can also reject the baseline (seed 400303: its HLO verifier on a strided
    slice): a failed xla row, upstream when ours agree, exit 1; not an internal error."""
    from jax.errors import JaxRuntimeError

    real = spmdlang.api.Compiled.run

    def run(self, inputs=None, backend="ref", *a, **k):
        if backend == "xla":
            raise JaxRuntimeError("INTERNAL: during context [hlo verifier]: Expected instruction to have shape")
        return real(self, inputs, backend, *a, **k)

    monkeypatch.setattr(spmdlang.api.Compiled, "run", run)
    code, out = _diff(capsys, MLP, "--backends", "ref,sim,xla", "--json")
    d = json.loads(out.out)
    assert code == 1 and d["upstream_disagreement"] == ["xla"]
    (x,) = [r for r in d["results"] if r["backend"] == "xla"]
    assert not x["ok"] and x["max_abs_err"] is None and x["error"].startswith("INTERNAL: during context")
    code, out = _diff(capsys, MLP, "--backends", "ref,sim,xla")
    assert code == 1 and "failed to compile" in out.out and "hlo verifier" in out.out


# (snippet of docs/known_xla_issues.md, what XLA or jax gets right, what XLA gets wrong): each
# reproduction prints both, and the test fails once XLA stops getting it wrong
_WRONG_IN_XLA = {
    "scatter_partitioner": (2, ["unsharded [0. 1. 2. 3. 4.]"], "sharded   [0. 1. 4. 3. 4.]"),
    "strided_slice_into_a_finely_split_dim": (4, ["unsharded [1. 4.]"], "sharded   [0. 3.]"),
    "gather_of_a_window_clamps_to_the_operand": (5, ["eager   10.0", "clamped 10.0"], "jit     60.0"),
    "all_reduce_max_drops_nan": (6, ["jnp.max nan"], "pmax    [1.]"),
    "multiply_by_a_converted_bool_drops_nan": (7, ["eager  nan", "select nan"], "jit    0.0"),
    "add_of_zero_keeps_a_negative_zero": (9, ["eager  inf"], "jit    -inf"),
    "max_pool_gradient_at_stride_1_shifted": (10, ["unsharded [1. 1. 0. 1. 2. 0. 2. 0.]"],
                                              "sharded   [0. 1. 1. 0. 2. 0. 2. 0.]"),
}


@pytest.mark.parametrize("case", sorted(_WRONG_IN_XLA))
def test_reproduction_shows_xla_is_wrong(case):
    index, right, wrong = _WRONG_IN_XLA[case]
    out = _run_snippet(_doc_snippets()[index])
    assert all(r in out for r in right), out  # unpartitioned / eager / jnp: right
    assert wrong in out, f"XLA no longer gets it wrong? update docs/known_xla_issues.md\n{out}"


def test_conv_padding_times_inf_reproduction_shows_both_forms():
    (code,) = [s for s in _doc_snippets() if "2-D, 1 channel:" in s]
    out = _run_snippet(code)
    assert "2-D, 1 channel: [inf inf  1.]" in out, f"XLA now multiplies the padding? update the page\n{out}"
    assert "1-D, 3 channels: [inf inf nan]" in out, out


def test_sort_gradient_reproduction_still_aborts_xla():
    """docs/known_xla_issues.md #14: XLA's partitioner aborts the process (a failed CHECK)."""
    (code,) = [s for s in _doc_snippets() if "jnp.sort(x, axis=0)" in s]
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode != 0 and "Check failed" in out.stderr, \
        f"XLA no longer aborts? update docs/known_xla_issues.md #14\n{out.stdout}{out.stderr[-2000:]}"


def test_gather_gradient_with_unevenly_split_ids_reproduction_is_still_wrong():
    """docs/known_xla_issues.md #15: XLA's partitioned gradient of a gather by unevenly split ids."""
    (code,) = [s for s in _doc_snippets() if "max error of the partitioned gradient" in s]
    err = float(re.search(r"max error of the partitioned gradient: ([\d.]+)", _run_snippet(code)).group(1))
    assert err > 1.0, f"XLA now gets it right ({err})? update docs/known_xla_issues.md #15"


def test_transposed_conv_kernel_gradient_split_over_its_taps_reproduction_is_still_wrong():
    """docs/known_xla_issues.md #16: XLA's partitioned kernel gradient of an lhs-dilated conv."""
    (code,) = [s for s in _doc_snippets() if "max error of the partitioned kernel gradient" in s]
    out = _run_snippet(code)
    err = float(re.search(r"max error of the partitioned kernel gradient: ([\d.]+)", out).group(1))
    assert err > 1.0, f"XLA now gets it right ({err})? update docs/known_xla_issues.md #16"
