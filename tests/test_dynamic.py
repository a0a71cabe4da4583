"""Dynamic indexing: x[l], dynamic_slice, dynamic_update_slice.

- the op table's numpy implementations against jax.lax on random shapes and starts (out of range
  too), and the emitted jax expressions against numpy (negative starts clamp, never wrap);
- ref == sim == jax on split and unsplit dims, even and uneven;
- plans: which collectives each case takes, with their bytes;
- located errors for bad input.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import spmdlang
from spmdlang.errors import SpmdError
from spmdlang.ir import registry
from spmdlang.ir.types import TensorType
from spmdlang.ir.verify import verify
from spmdlang.partition.cost import step_bytes

F32 = 4


def _random_case(rng):
    rank = int(rng.integers(1, 4))
    shape = tuple(int(rng.integers(1, 7)) for _ in range(rank))
    sizes = tuple(int(rng.integers(0, n + 1)) for n in shape)
    starts = [np.int32(rng.integers(-9, 10)) for _ in shape]
    return shape, sizes, starts


@pytest.mark.parametrize("seed", range(2))
def test_numpy_matches_jax_lax(seed):
    """Non-negative starts (in range or past the end) clamp as jax.lax clamps them."""
    rng = np.random.default_rng(seed)
    ds, dus = registry.get("dynamic_slice"), registry.get("dynamic_update_slice")
    for _ in range(30):
        shape, sizes, starts = _random_case(rng)
        starts = [abs(s) for s in starts]
        x = rng.standard_normal(shape).astype(np.float32)
        u = rng.standard_normal(sizes).astype(np.float32)
        (got,) = ds.evaluate([x, *starts], {"sizes": sizes})
        np.testing.assert_array_equal(got, np.asarray(jax.lax.dynamic_slice(x, starts, sizes)))
        (got,) = dus.evaluate([x, u, *starts], {})
        np.testing.assert_array_equal(got, np.asarray(jax.lax.dynamic_update_slice(x, u, starts)))


def _emitted(name, operands, attrs):
    """The op's jax emission for these operands, evaluated."""
    op = registry.get(name)
    types = [TensorType("f32" if a.ndim else "i32", a.shape) for a in operands]
    out = op.infer_types(types, attrs)
    names = [f"a{i}" for i in range(len(operands))]
    return np.asarray(eval(op.jax(names, attrs, out), {"jax": jax, "jnp": jnp}, dict(zip(names, operands))))


@pytest.mark.parametrize("seed", range(1))
def test_emitted_jax_matches_numpy_with_negative_starts(seed):
    """jax.lax wraps a negative start once before clamping; spmdlang clamps it to 0 (as x[l] does),
    in numpy and in the emitted jax alike."""
    rng = np.random.default_rng(100 + seed)
    ds, dus = registry.get("dynamic_slice"), registry.get("dynamic_update_slice")
    for _ in range(25):
        shape, sizes, starts = _random_case(rng)
        x = rng.standard_normal(shape).astype(np.float32)
        u = rng.standard_normal(sizes).astype(np.float32)
        want = x[tuple(slice(min(max(int(s), 0), n - m), min(max(int(s), 0), n - m) + m)
                       for s, n, m in zip(starts, shape, sizes))]
        (got,) = ds.evaluate([x, *starts], {"sizes": sizes})
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(_emitted("dynamic_slice", [x, *starts], {"sizes": sizes}), want)
        (got,) = dus.evaluate([x, u, *starts], {})
        np.testing.assert_array_equal(_emitted("dynamic_update_slice", [x, u, *starts], {}), got)


def test_jax_lax_itself_wraps_negative_starts():
    """Why the emission clamps: were this to change, the clamp would still be right."""
    x = np.arange(8)
    assert list(np.asarray(jax.lax.dynamic_slice(x, (np.int32(-3),), (2,)))) == [5, 6]
    assert list(registry.get("dynamic_slice").evaluate([x, np.int32(-3)], {"sizes": (2,)})[0]) == [0, 1]


# ---------------------------------------------------------------------------------- ref == sim == jax


def compiled(src: str, mesh=None, backends=("ref", "sim")):
    c = spmdlang.compile(src, mesh=mesh)
    verify(c.spmd.program)
    for seed in range(3):  # inputs of [0, 16): starts in range and past the end
        d = c.diff(c.random_inputs(seed), backends=list(backends))
        assert d["ok"], f"{d['results']}\n{c.spmd_ir}"
    return c


def ledger(c):
    return [(e.kind, tuple(e.axes)) for e in c.spmd.ledger]


STACK = """
mesh [stage=2, model=2]
func main(w: f32[L, 6, 8] {{{spec}}}, l: i32[], x: f32[3, 6]) -> f32[3, 8] {{
  return x @ w[l]
}}
"""


@pytest.mark.parametrize("layers, spec", [(5, "stage, _, model"), (4, "(stage, model), _, _"), (5, "_, stage, _")])
def test_stacked_weights_on_every_backend(layers, spec):
    compiled(STACK.format(spec=spec).replace("L,", f"{layers},"), backends=("ref", "sim", "jax", "xla"))


@pytest.mark.parametrize("layers", [4, 5], ids=["even", "uneven"])
def test_layer_dim_split_reads_in_place_and_sums_once(layers):
    """w[l] with the layer dim split: each stage reads the layer if it holds it, zeros otherwise,
    and one all_reduce of one layer (never a gather of the stack) settles it."""
    c = compiled(STACK.format(spec="stage, _, model").replace("L,", f"{layers},"))
    assert ledger(c) == [("all_reduce", ("stage",))]
    # the layer [6, 8/2] per device
    assert c.spmd.ledger[0].bytes_per_device == step_bytes("all_reduce", 2, 6 * 4 * F32)
    assert str(c.shardings["return0"]) == "{_, model}"


def test_layer_dim_unsplit_is_local():
    c = compiled(STACK.format(spec="_, _, model").replace("L,", "4,"))
    assert ledger(c) == []


def test_split_dim_not_cut_passes_through():
    """x[l, :] along an unsplit dim keeps the other dims' splits: no communication."""
    c = compiled("""
mesh [a=2, b=3]
func main(x: f32[5, 7, 4] {_, b, a}, l: i32[]) -> f32[7, 4] {b, a} {
  return x[l]
}
""")
    assert ledger(c) == []


def test_window_straddling_shards_reads_in_place():
    """A window of 3 rows over shards of 2 rows: each shard reads its part, one all_reduce of the
    window (3 x 4 f32) over the row axis."""
    c = compiled("""
mesh [a=4]
func main(x: f32[7, 4] {a, _}, t: i32[]) -> f32[3, 4] {
  return dynamic_slice(x, [t, 0], [3, 4])
}
""", backends=("ref", "sim", "jax", "xla"))
    assert ledger(c) == [("all_reduce", ("a",))]
    assert c.spmd.ledger[0].bytes_per_device == step_bytes("all_reduce", 4, 3 * 4 * F32)


def test_window_into_a_split_result_is_a_reduce_scatter():
    c = compiled("""
mesh [a=2]
func main(x: f32[9, 4] {a, _}, t: i32[]) -> f32[4, 4] {a, _} {
  return dynamic_slice(x, [t, 0], [4, 4])
}
""")
    assert ledger(c) == [("reduce_scatter", ("a",))]


def test_tiny_or_bool_windows_gather_the_dim():
    """Where reading in place costs more (two latency steps for two bytes) or cannot sum (bool),
    the dim is gathered and sliced locally."""
    c = compiled("""
mesh [a=2]
func main(x: f32[2] {a}, t: i32[]) -> f32[1] {
  return dynamic_slice(x, [t], [1])
}
""")
    assert ledger(c) == [("all_gather", ("a",))]
    c = compiled("""
mesh [a=2]
func main(x: bool[6, 5] {a, _}, t: i32[]) -> bool[5] {
  return x[t]
}
""")
    assert ledger(c) == [("all_gather", ("a",))]


@pytest.mark.parametrize("seq", [8, 7], ids=["even", "uneven"])
def test_cache_update_needs_no_communication(seq):
    """A decode step's KV-cache write: the cache keeps its splits (batch, heads, and the sequence
    dim the update moves along); the new entry is only sliced locally."""
    c = compiled(f"""
mesh [data=2, seq=2, model=2]
func main(cache: f32[4, {seq}, 4, 3] {{data, seq, model, _}}, new: f32[4, 1, 4, 3] {{data, _, model, _}}, t: i32[])
    -> f32[4, {seq}, 4, 3] {{data, seq, model, _}} {{
  return dynamic_update_slice(cache, new, [0, t, 0, 0])
}}
""", backends=("ref", "sim", "jax", "xla"))
    assert ledger(c) == []


def test_update_split_along_the_cut_dim_is_gathered_first():
    c = compiled("""
mesh [a=2]
func main(x: f32[9, 4] {a, _}, u: f32[4, 4] {a, _}, t: i32[]) -> f32[9, 4] {a, _} {
  return dynamic_update_slice(x, u, [t, 0])
}
""")
    assert ledger(c) == [("all_gather", ("a",))]
    assert c.spmd.ledger[0].bytes_per_device == step_bytes("all_gather", 2, 2 * 4 * F32)


def test_pending_sum_passes_through_a_dynamic_slice():
    """dynamic_slice is linear: a partial matmul result is sliced before its all_reduce, which
    then moves one row instead of the matrix."""
    c = compiled("""
mesh [m=4]
func main(a: f32[8, 16] {_, m}, b: f32[16, 6] {m, _}, t: i32[]) -> f32[6] {
  return (a @ b)[t]
}
""")
    assert ledger(c) == [("all_reduce", ("m",))]
    assert c.spmd.ledger[0].bytes_per_device == step_bytes("all_reduce", 4, 6 * F32)


def test_starts_from_computed_values_and_meshes():
    src = """
mesh [p=3, q=2]
func main(x: f32[7, 5, 4] {p, q, _}, v: f32[7]) -> (f32[2, 5], f32[7, 5, 4]) {
  t = argmax(v, 0)
  y = dynamic_slice(x, [t - 2, 0, t], [2, 5, 1])
  return reshape(y, [2, 5]), dynamic_update_slice(x, y * 2.0, [t, t, 3])
}
"""
    for mesh in (None, {"p": 2, "q": 3}, {"p": 4, "q": 1}):
        compiled(src, mesh=mesh)


# ---------------------------------------------------------------------------------- errors


def _error(body: str, params: str = "x: f32[6, 4], t: i32[], f: f32[]", result: str = "f32[6, 4]"):
    src = f"mesh [a=2]\nfunc main({params}) -> {result} {{\n  return {body}\n}}\n"
    with pytest.raises(SpmdError) as info:
        spmdlang.compile(src)
    e = info.value
    assert e.line == 3, e
    return e, src.splitlines()[2][e.col - 1:]


@pytest.mark.parametrize("body, at, fragment", [
    ("x[f]", "f]", "an index must be an integer scalar, got f32[]"),
    ("x[x]", "x]", "an index must be an integer scalar, got f32[6, 4]"),
    ("dynamic_slice(x, [t], [2, 4])", "[t]", "1 start(s) for f32[6, 4] of rank 2"),
    ("dynamic_slice(x, t, [2, 4])", "t,", "starts must be a list"),
    ("dynamic_slice(x, [f, 0], [2, 4])", "[f, 0]", "start 0 must be an integer scalar, got f32[]"),
    ("dynamic_slice(x, [0, 1.5], [2, 4])", "[0, 1.5]", "start 1 must be an integer scalar"),
    ("dynamic_slice(x, [t, 0], [7, 4])", "[7, 4]", "size 7 of dim 0 does not fit in f32[6, 4]"),
    ("dynamic_slice(x, [t, 0], [2])", "[2]", "1 size(s) for f32[6, 4] of rank 2"),
    ("dynamic_slice(x, [t, 0], [t, 4])", "[t, 4]", "must be a list of integers"),
    ("dynamic_update_slice(x, zeros(f32[7, 1]), [t, 0])", "zeros", "does not fit in f32[6, 4]"),
    ("dynamic_update_slice(x, zeros(bf16[2, 4]), [t, 0])", "zeros", "the update is bf16 but x is f32"),
    ("dynamic_update_slice(x, zeros(f32[2, 4]), [t])", "[t]", "1 start(s) for f32[6, 4] of rank 2"),
    ("dynamic_update_slice(x, zeros(f32[2, 4]), [t, true])", "[t, true]", "start 1 must be an integer scalar"),
])
def test_located_errors(body, at, fragment):
    e, pointed = _error(body)
    assert pointed.startswith(at), (pointed, at)
    assert fragment in e.message, e.message


def test_cli_error_has_a_caret_and_exit_1(tmp_path):
    import subprocess
    import sys

    f = tmp_path / "bad.spmd"
    f.write_text("mesh [a=2]\nfunc main(x: f32[6], s: f32[]) -> f32[] {\n  return x[s]\n}\n")
    r = subprocess.run([sys.executable, "-m", "spmdlang", "check", str(f)], capture_output=True, text=True)
    assert r.returncode == 1
    assert f"{f}:3:12: error: an index must be an integer scalar" in r.stderr
    assert "^" in r.stderr and "Traceback" not in r.stderr


def test_xla_update_past_the_end_reproduction():
    """docs/known_xla_issues.md #5: why the emitted modules clamp starts themselves."""
    import os
    import re
    import subprocess
    import sys
    from pathlib import Path

    doc = (Path(__file__).resolve().parent.parent / "docs" / "known_xla_issues.md").read_text()
    code = re.findall(r"```python\n(.*?)```", doc.split("## 5.", 1)[1], re.S)[0]
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "unsharded [ 0.  1.  2.  3. -1.]" in out.stdout
    assert "sharded   [0. 1. 2. 3. 4.]" in out.stdout, f"XLA is right now? update the page\n{out.stdout}"
    c = spmdlang.compile("mesh [q=2]\nfunc main(x: f32[5] {q}, u: f32[1], t: i32[]) -> f32[5] {\n"
                         "  return dynamic_update_slice(x, u, [t])\n}\n")
    inputs = {"x": np.arange(5, dtype=np.float32), "u": np.array([-1], np.float32), "t": np.int32(7)}
    assert c.diff(inputs, backends=["ref", "sim", "jax", "xla"])["ok"]
