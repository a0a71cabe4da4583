"""The text reports at 80 and 200 columns (a laptop terminal, a tmux pane, a wide screen): no
heading wraps, rich markup in names and meshes is shown literally, no token is split across
lines, no line is wider than the terminal; goldens in tests/golden/render/ (regenerate with
SPMDLANG_UPDATE_GOLDENS=1)."""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest
from rich.console import Console

import spmdlang
from spmdlang.explain import render_bench, render_check, render_diff, render_explain

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden" / "render"
UPDATE = os.environ.get("SPMDLANG_UPDATE_GOLDENS", "") not in ("", "0")
WIDTHS = (80, 200)

DIFF = {"ok": True, "backends": ["ref", "sim", "jax", "xla"], "rtol": 1e-4, "atol": 1e-4,
        "results": [{"backend": b, "output": 0, "max_abs_err": e, "ok": True}
                    for b, e in (("sim", 0.00128), ("jax", 0.000977), ("xla", 0.0))]}
BENCH = {"mesh": {"data": 2, "model": 4}, "repeat": 20, "ours_s": 0.0298, "xla_s": 0.0296, "ratio": 1.0068,
         "ours_collectives": 1, "xla_collectives": 1, "ours_bytes_per_device": 786432,
         "xla_bytes_per_device": 786432, "ours_jit_s": 0.05, "xla_jit_s": 0.05, "compile_s": 0.006,
         "rounds": 5, "ours_min_s": 0.0281, "xla_min_s": 0.0279, "ratio_min": 0.981, "ratio_max": 1.032,
         "ratio_spread": 0.0253}


def _render(width: int, draw) -> str:
    console = Console(width=width, record=True, file=open(os.devnull, "w"), color_system=None,  # noqa: SIM115
                      highlight=False, force_terminal=False)
    draw(console)
    return "\n".join(line.rstrip() for line in console.export_text().splitlines()) + "\n"


def _compiled(name):
    path = f"programs/{name}.spmd"  # a relative name, so that the goldens do not depend on the checkout
    return spmdlang.compile((ROOT / path).read_text(), filename=path)


def _cases():
    return {
        "check_mlp": lambda con: (lambda c: render_check(con, c, c.check_report()))(_compiled("mlp")),
        "explain_transformer_block_show_scores": lambda con: (lambda c: render_explain(
            con, c, c.explain_report(), show=["scores"]))(_compiled("transformer_block")),
        "diff": lambda con: render_diff(con, DIFF),
        "bench": lambda con: render_bench(con, BENCH),
    }


def _check(text: str, golden: Path):
    if UPDATE:
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text, encoding="utf-8")
        return
    expected = golden.read_text(encoding="utf-8")
    if text != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), text.splitlines(True), str(golden), "actual"))
        pytest.fail(f"differs from {golden.relative_to(ROOT)}\n{diff}", pytrace=False)


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("case", sorted(_cases()))
def test_render_golden(case, width):
    text = _render(width, _cases()[case])
    assert max(len(line) for line in text.splitlines()) <= width
    _check(text, GOLDEN / f"{case}_{width}.txt")


@pytest.mark.parametrize("width", WIDTHS)
def test_headings_do_not_wrap_and_markup_shows(width):
    text = _render(width, _cases()["explain_transformer_block_show_scores"])
    assert "scores: f32[16, 8, 64, 64] {data, model, _, _} over mesh [data=2, model=4]" in text
    assert text.startswith("programs/transformer_block.spmd  mesh [data=2, model=4]\n")
    assert "compared with ref (rtol 0.0001, atol 0.0001 x scale)\n" in _render(width, _cases()["diff"])


@pytest.mark.parametrize("width", WIDTHS)
def test_no_token_is_split_across_lines(width):
    c = _compiled("transformer_block")
    report = c.explain_report()
    text = _render(width, lambda con: render_explain(con, c, report))
    reasons = [v["reason"] for v in report["values"]] + [x["reason"] for x in report["collectives"]]
    for token in {w for r in reasons for w in r.split()}:
        assert token in text, f"'{token}' is split across lines at {width} columns"
    for v in report["values"]:
        assert v["sharding"] in text and v["type"] in text


# ---------------------------------------------------------------------------------- piped output
# What `spmdlang ... | less` or `> file` shows: stdout is not a terminal, the width is COLUMNS (80
# when unset). A table too wide for it wraps its cells; no character is ever cut.

PIPED = {
    "check_moe": ["check", "programs/moe.spmd"],
    "explain_train_stack_scan": ["explain", "programs/train_stack_scan.spmd"],
    "explain_mlp_show_h": ["explain", "programs/mlp.spmd", "--show", "h"],
    "autoshard_mlp_budget": ["autoshard", "programs/mlp.spmd", "--memory-per-device", "2362400", "-o", "{tmp}"],
    "run_mlp": ["run", "programs/mlp.spmd", "--backend", "ref", "--set", "B=4,D=8,F=8"],
}


def _piped(argv: list[str], width: int, tmp_path) -> str:
    import re
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": str(width)}
    env.pop("LINES", None)
    argv = [a.replace("{tmp}", str(tmp_path / "out.spmd")) for a in argv]
    r = subprocess.run([sys.executable, "-m", "spmdlang", *argv], capture_output=True, text=True, cwd=ROOT,
                       env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "[bold]" not in r.stdout and "…" not in r.stdout
    # the solve time is the one figure that changes from run to run
    return "\n".join(line.rstrip() for line in re.sub(r"search [0-9.]+ s \((\w+)\)", r"search T s (\1)",
                                                     r.stdout).splitlines()) + "\n"


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("case", sorted(PIPED))
def test_piped_output_golden(case, width, tmp_path):
    text = _piped(PIPED[case], width, tmp_path)
    assert max(len(line) for line in text.splitlines()) <= width
    _check(text, GOLDEN / f"piped_{case}_{width}.txt")


def _lost(text: str, cells: list[str]) -> dict:
    """The characters of `cells` that `text` does not show (as many times as the cells hold them)."""
    from collections import Counter

    missing = Counter("".join(cells).replace(" ", "")) - Counter(text.replace(" ", "").replace("\n", ""))
    return dict(missing)


# programs whose tables rich used to cut at 80 columns (the "why" column, or a column pushed off the edge)
CUT_BEFORE = ("moe", "moe_top2", "pipeline", "train_pipeline_microbatch", "train_stack_scan", "mlp")


@pytest.mark.parametrize("width", (50, 80, 200))
@pytest.mark.parametrize("name", CUT_BEFORE)
def test_no_table_cell_is_cut(name, width):
    c = _compiled(name)
    report = c.explain_report()
    text = _render(width, lambda con: render_explain(con, c, report))
    cells = [str(v[k]) for v in report["values"] for k in ("name", "type", "sharding", "reason")]
    cells += [x["reason"] + x["kind"] + f"{x['bytes_per_device']:,}" for x in report["collectives"]]
    assert not _lost(text, cells), f"cut at {width} columns: {_lost(text, cells)}"
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= width


def test_no_autoshard_or_diff_or_bench_cell_is_cut():
    from spmdlang.autoshard import autoshard, render_autoshard

    rep = autoshard(str(ROOT / "programs" / "mlp.spmd"), memory_per_device=2_362_400).report()
    for width in (40, 80):
        text = _render(width, lambda con: render_autoshard(con, rep))
        cells = [x["reason"] for x in rep["chosen"]["collectives"]] + [" = ".join(p["labels"]) for p in rep["plans"]]
        cells += [x["name"] + x["sharding"] + x["from"] for x in rep["chosen"]["layouts"]]
        assert not _lost(text, cells), (width, _lost(text, cells))
        for draw, cells in ((lambda con: render_diff(con, DIFF), ["backend", "xla", "0.000977"]),
                            (lambda con: render_bench(con, BENCH), ["786,432", "fastest call", "0.05 s"])):
            text = _render(width, draw)
            assert not _lost(text, cells), (width, _lost(text, cells))


def test_a_table_of_whole_tokens_one_column_too_wide_wraps_rather_than_cuts():
    """A table with no wrapping column (autoshard's plans) exactly one character wider than the
    width: its blank right edge was taken to fall off the line, but rich lays out the columns
    without it and cut a number ("11,286,0…"); now the columns wrap and every number prints."""
    from spmdlang.explain import table

    rows = [("autoshard (chosen)", "6", "2,625,543", "11,286,020", "yes", "581.0"),
            ("as written", "0", "0", "67,147,776", "NO: over budget", "3949.9")]

    def draw(con):
        t = table("plan", "colls", "bytes", "peak mem", "fits budget", "time us")
        for r in rows:
            t.add_row(*r)
        con.print(t)

    text = _render(80, draw)
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= 80, text
    assert not _lost(text, [x for r in rows for x in r[1:]] + ["time us"]), text
