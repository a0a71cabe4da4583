"""jax.grad of the emitted modules: a user imports our shard_map module into their own jax code
and differentiates through it. For every program in programs/ with float results, the gradient
of a random linear function of its float results with respect to every float input, taken by
jax.grad through our module, equals jax.grad through the XLA-baseline module (the global program
in jax.numpy, which jax differentiates with its own rules).

jax has no differentiation rule for pmax/pmin (a logsumexp's stabilising max, a max reduction
over a split dim): the module's all_reduce helper gives them jax's derivative of a max."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import spmdlang

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from plan_ledger import CASES  # noqa: E402

# the slowest to compile twice with their backward passes run only with --runslow
SLOW = {"conv", "pipeline", "stack_scan", "decode_kv_cache", "train_stack_scan", "train_pipeline_microbatch"}
PROGRAMS = [pytest.param(p, marks=pytest.mark.slow) if p in SLOW else p
            for p in sorted(p.stem for p in (ROOT / "programs").glob("*.spmd"))]


def _case(name: str):
    """The program at the ledger's tiny size, on its first ledger mesh (a few KB per device)."""
    case = CASES.get(f"programs/{name}")
    if case is None:
        return {}, None
    mesh = case["meshes"][0]
    axes = {a: s for a, s in mesh.items() if not a.startswith("@")}
    consts = {**case["sizes"]["tiny"], **{a[1:]: s for a, s in mesh.items() if a.startswith("@")}}
    return consts, axes


def _loss(c, backend, arrays, floats, cotangents):
    """sum_i <cotangent_i, result_i> as a function of the float inputs, through `backend`'s module."""
    import jax.numpy as jnp

    r = c.runner(backend)
    mod = r.module

    def loss(*xs):
        full = list(arrays)
        for i, x in zip(floats, xs):
            full[i] = x
        # the module's place() pads uneven dims with numpy; pad with jnp so jax.grad sees through
        padded = [jnp.pad(jnp.asarray(a), [(0, t - n) for n, t in zip(a.shape, mod._padded_shape(a.shape, s, r.mesh))])
                  if np.ndim(a) else jnp.asarray(a)  # jnp.pad rejects scalars
                  for a, s in zip(full, mod._leaves(mod.IN_SPECS, mod.GLOBAL_SHAPES))]
        # a struct parameter or result is a nested dict in the module: flat leaves in, flat leaves out
        outs = mod._leaves(r.fn(*mod._nest(padded, mod.GLOBAL_SHAPES)), mod.RESULT_SHAPES)
        total = 0.0
        for o, ct in zip(outs, cotangents):
            if ct is not None:
                total = total + jnp.sum(o[tuple(slice(0, n) for n in ct.shape)] * ct)
        return total

    return loss


@pytest.mark.parametrize("name", PROGRAMS)
def test_jax_grad_of_emitted_module(name):
    import jax
    import jax.numpy as jnp

    consts, mesh = _case(name)
    c = spmdlang.compile(str(ROOT / "programs" / f"{name}.spmd"), mesh=mesh, consts=consts)
    inputs = c.random_inputs(0)
    arrays = [inputs[p.name] for p in c.program.params]
    floats = [i for i, a in enumerate(arrays) if a.dtype.kind == "f"]
    results = [r.value.type for r in c.program.results]
    if not floats or not any(t.dtype.startswith("f") for t in results):
        pytest.skip("no float inputs or results")
    rng = np.random.default_rng(1)
    cotangents = [rng.standard_normal(t.shape).astype(np.float32) if t.dtype == "f32" else None for t in results]
    args = [jnp.asarray(arrays[i]) for i in floats]
    argnums = tuple(range(len(floats)))
    ours = jax.grad(_loss(c, "jax", arrays, floats, cotangents), argnums)(*args)
    theirs = jax.grad(_loss(c, "xla", arrays, floats, cotangents), argnums)(*args)
    for i, a, b in zip(floats, ours, theirs):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        scale = max(1.0, float(np.max(np.abs(b))))
        assert np.all(np.isfinite(a)), c.program.params[i].name
        assert np.max(np.abs(a - b)) <= 1e-4 * scale, (c.program.params[i].name, np.max(np.abs(a - b)), scale)
