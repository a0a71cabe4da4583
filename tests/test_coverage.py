"""Every op of the op table is covered: a factor-rule row (tests/test_factors.py), a builtin that
lowers to it (or a stated reason it has none), a numpy-checked builtin test (tests/test_builtins.py),
a way for the random program generator (tests/progen.py) to produce it, and a derivative: a vjp
rule with random instances in tests/test_vjp.py, or an explicit "no gradient".

Adding a primitive without these fails here, naming the op and what it lacks.
"""

from __future__ import annotations

import os
from functools import cache

import numpy as np
import progen
import pytest
import test_builtins as TB
import test_factors as TF
import test_vjp as TV

import spmdlang
from spmdlang.ir import registry
from spmdlang.ir.registry import Grad

GLOBAL_OPS = sorted(name for name, op in registry.OPS.items() if not op.local_only)
LOCAL_OPS = sorted(name for name, op in registry.OPS.items() if op.local_only)

# ops no builtin lowers to, each with the reason (per-partition ops need none: the partitioner
# makes them, and the differential tests run every one of them on the simulator)
NO_BUILTIN: dict[str, str] = {}


def _cases() -> list:
    found = [*TB._unary_cases(), *TB._binary_cases(), *TB._reduction_cases()]
    for f in vars(TB).values():
        for mark in getattr(f, "pytestmark", []):
            if mark.name == "parametrize" and mark.args and mark.args[0] == "case":
                found.extend(mark.args[1])
    return [c for c in found if isinstance(c, TB.Case)]


def _lowered(src: str, **kw):
    os.environ.setdefault("SPMDLANG_VERIFY", "1")
    return spmdlang.compile(src, verify=False, **kw).program


@cache
def builtin_test_ops() -> dict[str, str]:
    """op -> the id of a numpy-checked builtin test case whose program lowers to it."""
    out: dict[str, str] = {}
    for case in _cases():
        inputs = TB.make_inputs(case)
        with np.errstate(all="ignore"):
            want = case.ref(*inputs.values())
        wants = [np.asarray(w) for w in (want if isinstance(want, tuple) else (want,))]
        results = ", ".join(TB.type_text(w) for w in wants)
        results = f"({results})" if len(wants) > 1 else results
        body = case.body if "return" in case.body else f"return {case.body}"
        src = f"mesh [x=2]\n{case.prelude}\nfunc main({case.params}) -> {results} {{\n  {body}\n}}\n"
        for op in _lowered(src, consts=case.consts).ops:
            out.setdefault(op.kind, case.id)
    return out


@cache
def generated_ops() -> dict[str, str]:
    """op -> the generator method (tests/progen.py) that produced it, drawing each method (nearly) alone."""
    out: dict[str, str] = {}
    names = [n for n, _ in progen.Generator.OPS]
    for name in names:
        alone = {name, "compare_where", "cast"}  # with makers of bools, which logical ops need
        for seed in range(16 if name in ("unary", "unary_more") else 4):  # these draw one of many forms
            gen = progen.Generator(progen.RandomChooser(seed), min_ops=8, max_ops=8,
                                   exclude=[n for n in names if n not in alone])
            for op in _lowered(gen.program()).ops:
                out.setdefault(op.kind, name)
    for seed in range(16):  # what only differentiating programs draw (stop_gradient)
        gen = progen.Generator(progen.RandomChooser(seed), min_ops=8, max_ops=8, grad=True,
                               exclude=[n for n in names if n != "unary"])
        for op in _lowered(gen.grad_program()).ops:
            out.setdefault(op.kind, "unary (grad=True)")
    return out


@pytest.mark.parametrize("name", GLOBAL_OPS)
def test_gradient_declared(name):
    """Every op has a derivative, a vjp rule tested against jax on random instances (INSTANCES in
    tests/test_vjp.py), or says that no gradient flows back through it (Grad.none, checked against
    jax there too). Grad.unsupported is not enough: grad through the op would fail."""
    vjp = registry.get(name).vjp
    assert callable(vjp) or vjp == Grad.none, (
        f"{name}: declare its derivative: vjp=<rule> next to its other rules, or vjp=Grad.none (no "
        f"gradient flows back: integer-valued or piecewise constant); got {vjp!r}")
    if callable(vjp):
        assert name in TV.INSTANCES, (f"{name}: add a random-instance generator to INSTANCES in "
                                      "tests/test_vjp.py, so that its vjp rule is tested against jax")


@pytest.mark.parametrize("name", GLOBAL_OPS)
def test_factor_rule_row(name):
    rows = {row[1] for row in TF.RULES}
    assert name in rows, f"{name}: add a row for its factor rule to RULES in tests/test_factors.py"


@pytest.mark.parametrize("name", GLOBAL_OPS)
def test_builtin_and_numpy_checked_test(name):
    found = builtin_test_ops()
    if name in NO_BUILTIN:
        assert name not in found, f"{name} has a builtin test now: drop its NO_BUILTIN reason"
        return
    assert name in found, (f"{name}: no numpy-checked builtin test in tests/test_builtins.py lowers to it; "
                           "add a builtin and a Case for it, or a reason to NO_BUILTIN")


@pytest.mark.parametrize("name", GLOBAL_OPS)
def test_random_program_generator(name):
    assert name in generated_ops(), f"{name}: tests/progen.py never generates it; add a generator method"


def test_per_partition_ops_come_from_the_partitioner():
    """They need no builtin, but a builtin program must not reach them either."""
    assert not set(LOCAL_OPS) & set(builtin_test_ops())
    assert not set(LOCAL_OPS) & set(generated_ops())
