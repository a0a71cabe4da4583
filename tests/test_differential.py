"""Differential tests of the partitioner: the mesh simulator must agree with the global reference.

Random programs (tests/progen.py: chains of 2-8 ops drawn from the op table, random shardings on
parameters and results, random shard() constraints with open `?` dims, meshes of 1-3 axes of sizes
1-4, odd dims so shards are uneven, explicit device orders) are compiled, their global and
per-partition IR verified, and run on `ref` and `sim` with the same inputs. The simulator poisons
padding (NaN), so a missing mask is a wrong answer, and checks that replicas agree.

The fast profile runs in CI; `--runslow` adds a long hypothesis run on bigger meshes and a seeded
sweep of thousands of programs. Every programs/*.spmd also runs on its own mesh and two others.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from progen import Generator, HypothesisChooser, RandomChooser

import spmdlang
from spmdlang.errors import SpmdError
from spmdlang.ir.core import all_ops
from spmdlang.ir.verify import verify

ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = sorted((ROOT / "programs").glob("*.spmd"))
BF16_TOL = 3e-2


def check_program(src: str, seed: int = 0, mesh=None, consts=None) -> dict:
    """Compile `src`, verify both IR stages, and diff sim against ref; AssertionError with the program."""
    try:
        c = spmdlang.compile(src, mesh=mesh, consts=consts)
        verify(c.program)
        spmd = c.spmd
    except SpmdError as e:
        raise AssertionError(f"a generated program does not compile: {e}\n{src}") from e
    verify(spmd.program)
    for p, s in zip(spmd.program.params, spmd.in_shardings):
        g = next(q for q in c.program.params if q.name == p.name)
        assert p.value.type.shape == s.local_shape(g.value.type.shape, c.mesh), (p.name, s)
    check_ledger(spmd, src)
    tol = BF16_TOL if "bf16" in src else None
    d = c.diff(c.random_inputs(seed), backends=["ref", "sim"], rtol=tol, atol=tol)
    assert d["ok"], f"sim != ref: {d['results']}\n{src}\n{c.spmd_ir}"
    return d


COLLECTIVES = ("all_gather", "all_reduce", "reduce_scatter", "all_to_all", "collective_permute")


def check_ledger(spmd, src: str = "") -> None:
    """The ledger lists exactly the collectives of the per-partition program, one entry each."""
    prog = spmd.program
    ops = [op for op in all_ops(prog.ops) if op.kind in COLLECTIVES]
    logged = []
    for c in spmd.ledger:
        op = c.local_op
        assert any(op is o for o in ops), f"ledger entry {c.kind} ({c.reason}) names no collective\n{src}"
        runs_as = "all_gather" if op.kind == "all_reduce" and op.attrs["reduce"] == "prod" else op.kind
        assert c.kind == runs_as, (c.kind, op.kind)  # the ledger names what runs (jax has no product psum)
        logged.append(op)
    for op in ops:
        n = sum(op is o for o in logged)
        assert n == 1, f"{op.kind} {op.attrs.get('axes')} in the program has {n} ledger entries\n{src}"


@st.composite
def programs(draw, max_devices=24, min_ops=2, max_ops=8, exclude=()):
    return Generator(HypothesisChooser(draw), max_devices, min_ops, max_ops, exclude, loops=True).program()


_COMMON = dict(deadline=None, database=None,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                      HealthCheck.filter_too_much])


@settings(max_examples=300, derandomize=True, **_COMMON)
@given(programs())
def test_random_programs(src):
    check_program(src)


@pytest.mark.slow
@settings(max_examples=2000, **_COMMON)
@given(programs(max_devices=64, max_ops=10), st.integers(0, 3))
def test_random_programs_long(src, seed):
    check_program(src, seed)


def sweep(seeds, max_devices):
    """Programs from a plain seeded generator: hypothesis draws skew towards short programs, this
    does not. Reproduce a failure with `Generator(RandomChooser(seed), max_devices).program()`."""
    failures = []
    for seed in seeds:
        src = Generator(RandomChooser(seed), max_devices=max_devices).program()
        try:
            check_program(src)
        except AssertionError as e:
            failures.append(f"seed {seed}: {str(e)[:3000]}")
    assert not failures, f"{len(failures)} failing programs; first:\n" + failures[0]


@pytest.mark.parametrize("block", range(8))
def test_seeded_sweep(block):
    sweep(range(block * 250, (block + 1) * 250), max_devices=24)


@pytest.mark.slow
@pytest.mark.parametrize("block", range(20))
def test_seeded_sweep_long(block):
    sweep(range(100_000 + block * 500, 100_000 + (block + 1) * 500), max_devices=64)


# roll layouts, one by one (the local-window and wrap-around paths)
_ROLL_CASES = [(n, k, shift, src, dst, expr) for n in (7, 8) for k in (1, 2, 3) for shift in (1, -3, 10)
               for src in ("p", "_") for dst in ("p", "_") for expr in ("x", "x * 2.0")]


@pytest.mark.parametrize("n,k,shift,src,dst,expr", _ROLL_CASES)
def test_roll_layouts(n, k, shift, src, dst, expr):
    check_program(f"""mesh [p={k}]
func main(x: f32[{n}, 3] {{{src}, _}}) -> f32[{n}, 3] {{{dst}, _}} {{
  return roll({expr}, {shift}, 0)
}}
""")


# ---------------------------------------------------------------------------------- example programs

# Per program: two meshes besides its own (by axis name); the second splits unevenly.
MESH_VARIANTS = {
    "mlp": [{"data": 4, "model": 2}, {"data": 3, "model": 3}],
    "transformer_block": [{"data": 4, "model": 2}, {"data": 3, "model": 3}],
    "moe": [{"expert": 2, "model": 4}, {"expert": 3, "model": 3}],
    "embedding": [{"data": 4, "vocab": 2}, {"data": 3, "vocab": 3}],
    "conv": [{"data": 1, "h": 4, "w": 2}, {"data": 2, "h": 3, "w": 3}],
    "pipeline": [{"stage": 2, "data": 4}, {"stage": 3, "data": 3}],
}


def _variants(path: Path):
    if path.stem in MESH_VARIANTS:
        return [None] + MESH_VARIANTS[path.stem]
    axes = dict(spmdlang.compile(str(path)).mesh.axes)  # a program added later: generic variants
    names, sizes = list(axes), list(axes.values())
    other = dict(zip(names, reversed(sizes)))
    if other == axes:
        other = {**{a: 1 for a in names}, names[-1]: int(np.prod(sizes))}
    return [None, other, {a: 3 for a in names}]


CASES = [(p, m) for p in PROGRAMS for m in _variants(p)]


def _case_id(case):
    path, mesh = case
    return path.stem + ("" if mesh is None else "-" + "-".join(f"{a}{s}" for a, s in mesh.items()))


PATTERNS = sorted((ROOT / "benchmarks" / "patterns").glob("*.spmd"))


@pytest.mark.parametrize("path", PATTERNS, ids=[p.stem for p in PATTERNS])
def test_benchmark_pattern(path):
    """The benchmark patterns are programs a user may diff too: sim agrees with ref on their meshes."""
    d = spmdlang.compile(str(path)).diff(backends=["ref", "sim"])
    assert d["ok"], f"{path.name}: {d['results']}"


@pytest.mark.slow
@pytest.mark.parametrize("path", PATTERNS, ids=[p.stem for p in PATTERNS])
def test_benchmark_pattern_on_jax(path):
    d = spmdlang.compile(str(path)).diff(backends=["ref", "jax", "xla"])
    assert d["ok"], f"{path.name}: {d['results']}"


@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_example_program(case):
    path, mesh = case
    text = path.read_text()
    c = spmdlang.compile(str(path), mesh=mesh)
    verify(c.spmd.program)
    d = c.diff(backends=["ref", "sim"])
    assert d["ok"], f"{path.name} on {c.mesh}: {d['results']}"
    if mesh is not None and 3 in mesh.values():
        # the uneven variant really is uneven somewhere
        assert any(n % 3 for p in c.program.params for n in p.value.type.shape), text
