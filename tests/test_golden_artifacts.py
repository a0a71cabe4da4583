"""Goldens for the printed artifacts after partitioning: the per-partition IR of every program and
the emitted jax module of programs/mlp.spmd. Regenerate after an intended change with

    SPMDLANG_UPDATE_GOLDENS=1 pytest tests/test_golden_artifacts.py
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest

import spmdlang

ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = sorted((ROOT / "programs").glob("*.spmd"))
GOLDEN = Path(__file__).resolve().parent / "golden"
UPDATE = os.environ.get("SPMDLANG_UPDATE_GOLDENS", "") not in ("", "0")


def _check(text: str, golden: Path):
    if UPDATE:
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text, encoding="utf-8")
        return
    if not golden.exists():
        pytest.fail(f"missing {golden.relative_to(ROOT)}; create it with SPMDLANG_UPDATE_GOLDENS=1", pytrace=False)
    expected = golden.read_text(encoding="utf-8")
    if text != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), text.splitlines(True),
                                            str(golden.relative_to(ROOT)), "actual"))
        pytest.fail(f"differs from {golden.relative_to(ROOT)} (SPMDLANG_UPDATE_GOLDENS=1 if intended)\n{diff}",
                    pytrace=False)


@pytest.mark.parametrize("path", PROGRAMS, ids=[p.stem for p in PROGRAMS])
def test_golden_spmd_ir(path):
    _check(spmdlang.compile(str(path)).spmd_ir, GOLDEN / "spmd" / f"{path.stem}.ir")


def test_golden_jax_module(monkeypatch):
    monkeypatch.chdir(ROOT)  # the header names the file as given: keep it independent of the checkout
    _check(spmdlang.compile("programs/mlp.spmd").jax_source, GOLDEN / "jax" / "mlp.py")


def test_printers_are_deterministic():
    a = spmdlang.compile(str(ROOT / "programs" / "moe.spmd"))
    b = spmdlang.compile(str(ROOT / "programs" / "moe.spmd"))
    assert a.spmd_ir == b.spmd_ir and a.jax_source == b.jax_source and a.xla_source == b.xla_source
