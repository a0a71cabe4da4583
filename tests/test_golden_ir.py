"""Golden IR tests for the example programs in programs/.

Each programs/<name>.spmd is compiled and its global IR text compared with tests/golden/<name>.ir.
After an intended change to lowering or the IR printer, regenerate the goldens with

    SPMDLANG_UPDATE_GOLDENS=1 pytest tests/test_golden_ir.py

and review the diff in git. Every program must also run on the numpy reference backend and give
finite results of the declared result types.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import numpy as np
import pytest

import spmdlang
from spmdlang.ir import types as T

ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = sorted((ROOT / "programs").glob("*.spmd"))
GOLDEN_DIR = Path(__file__).resolve().parent / "golden"
UPDATE = os.environ.get("SPMDLANG_UPDATE_GOLDENS", "") not in ("", "0")


def _normalize(text: str) -> str:
    return text.rstrip("\n") + "\n"


def test_there_are_programs():
    names = {p.stem for p in PROGRAMS}
    assert {"mlp", "transformer_block", "moe", "conv", "embedding"} <= names


@pytest.mark.parametrize("path", PROGRAMS, ids=[p.stem for p in PROGRAMS])
def test_golden_ir(path: Path):
    ir = _normalize(spmdlang.compile(str(path)).ir)
    golden = GOLDEN_DIR / f"{path.stem}.ir"
    if UPDATE:
        GOLDEN_DIR.mkdir(parents=True, exist_ok=True)
        golden.write_text(ir, encoding="utf-8")
        return
    if not golden.exists():
        pytest.fail(f"no golden file {golden.relative_to(ROOT)}; "
                    "create it with SPMDLANG_UPDATE_GOLDENS=1 pytest tests/test_golden_ir.py", pytrace=False)
    expected = golden.read_text(encoding="utf-8")
    if ir != expected:
        diff = "".join(difflib.unified_diff(
            expected.splitlines(keepends=True), ir.splitlines(keepends=True),
            fromfile=f"tests/golden/{path.stem}.ir (expected)",
            tofile=f"programs/{path.name} (actual IR)"))
        pytest.fail(f"IR of programs/{path.name} differs from its golden file; if the change is "
                    f"intended, rerun with SPMDLANG_UPDATE_GOLDENS=1\n{diff}", pytrace=False)


@pytest.mark.parametrize("path", PROGRAMS, ids=[p.stem for p in PROGRAMS])
def test_program_runs_on_ref(path: Path):
    c = spmdlang.compile(str(path))
    outs = c.run(seed=0, backend="ref")
    declared = [r.value.type for r in c.program.results]
    assert len(outs) == len(declared), f"{len(outs)} outputs for {len(declared)} declared results"
    for i, (out, t) in enumerate(zip(outs, declared)):
        out = np.asarray(out)
        assert out.shape == tuple(t.shape), f"out{i}: shape {out.shape}, declared {t}"
        assert out.dtype == T.np_dtype(t.dtype), f"out{i}: dtype {out.dtype}, declared {t}"
        if T.is_float(t.dtype):
            assert np.isfinite(out.astype(np.float64)).all(), f"out{i} ({t}) has NaN or inf"
