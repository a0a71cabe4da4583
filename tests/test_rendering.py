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
