"""The plan regression suite: every program and pattern, at three sizes and on two meshes, must
communicate exactly as the golden ledger (tests/golden/plans.json) records, and never more than
XLA's GSPMD (numbers recorded in the golden from its compiled HLO) except where
tests/plan_ledger.py's EXCEPTIONS says why (also listed in docs/performance.md).

A changed plan fails here with the entry and the difference; if the change is meant, regenerate
with `python tests/plan_ledger.py --update-goldens --ours-only` (or
`SPMDLANG_UPDATE_GOLDENS=1 python -m pytest tests/test_plan_ledger.py`; drop --ours-only to
recompile XLA's side too), review the diff of tests/golden/plans.json, and say why in the commit.
"""

from __future__ import annotations

import os

import plan_ledger as pl
import pytest

if os.environ.get("SPMDLANG_UPDATE_GOLDENS"):  # as the other goldens: rewrite ours, keep XLA's numbers
    pl.write(pl.regenerate(ours_only=True))
GOLDEN = {pl.key(e): e for e in pl.load()}
ENTRIES = list(pl.entries())


def test_golden_covers_every_entry():
    assert set(GOLDEN) == {(p, s, m) for p, s, m, _, _ in ENTRIES}, (
        "the golden is stale: python tests/plan_ledger.py --update-goldens")


def test_every_program_and_pattern_is_in_the_ledger():
    programs = {f"programs/{p.stem}" for p in (pl.ROOT / "programs").glob("*.spmd")}
    patterns = {f"patterns/{p.stem}" for p in (pl.ROOT / "benchmarks" / "patterns").glob("*.spmd")}
    assert programs | patterns <= set(pl.CASES)


@pytest.mark.parametrize("program", sorted(pl.CASES))
def test_plans_match_the_golden(program):
    """All sizes and meshes of one program: our ledger, by kind, equals the recorded one."""
    diffs = []
    for prog, size, mesh, axes, consts in ENTRIES:
        if prog != program:
            continue
        got = pl.ours(pl.compile_entry(prog, axes, consts))
        want = GOLDEN[(prog, size, mesh)]["ours"]
        if got != want:
            diffs.append(f"{size} [{mesh}]: {want} -> {got}")
    assert not diffs, f"{program}: the plan changed (regenerate deliberately):\n" + "\n".join(diffs)


def test_no_entry_loses_to_xla_except_the_listed_ones():
    losing = {}
    for k, e in GOLDEN.items():
        if e.get("xla") is not None:
            why = pl.worse(e["ours"], e["xla"])
            if why:
                losing[k] = why
    unexplained = {k: v for k, v in losing.items() if k not in pl.EXCEPTIONS}
    assert not unexplained, f"more collectives or bytes than XLA: {unexplained}"
    stale = set(pl.EXCEPTIONS) - set(losing)
    assert not stale, f"listed as exceptions but no longer losing to XLA: {stale}"


def test_exceptions_are_in_the_performance_doc():
    readme = " ".join((pl.ROOT / "docs" / "performance.md").read_text().split())
    for program, size, mesh in pl.EXCEPTIONS:
        assert f"{program} {size} [{mesh}]" in readme, (program, size, mesh)
