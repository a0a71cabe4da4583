"""The emitted module as a jax user meets it: its run() caches the jitted function, build() and
place() work on the caller's mesh (other axis names, other axis order, Auto axes), inputs may be
numpy, plain jax arrays or jax arrays on any sharding, and importing jax before spmdlang works."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import spmdlang

ROOT = Path(__file__).resolve().parent.parent
MLP = str(ROOT / "programs" / "mlp.spmd")
UNEVEN = """mesh [data=2, model=4]
func main(x: f32[5, 6] {data, model}, w: f32[6, 3] {model, _}) -> f32[5, 3] {data, _} {
  return relu(x @ w)
}
"""


@pytest.fixture(scope="module")
def mlp():
    c = spmdlang.compile(MLP, consts={"B": 8, "D": 16, "F": 32})
    mod = c.runner("jax").module
    inputs = c.random_inputs(1)
    arrays = [inputs[p.name] for p in c.program.params]
    return c, mod, arrays, c.run(inputs, backend="ref")


def _close(outs, ref):
    assert len(outs) == len(ref)
    for a, b in zip(outs, ref):
        assert a.shape == b.shape
        np.testing.assert_allclose(np.asarray(a, np.float64), b.astype(np.float64), rtol=1e-4, atol=1e-4)


def test_run_caches_its_jitted_function(mlp):
    c, mod, arrays, ref = mlp
    mod._BUILT.clear()
    _close(mod.run(*arrays), ref)
    built = dict(mod._BUILT)
    fn = [f for k, f in built.items() if k != "default"]
    assert len(fn) == 1
    _close(mod.run(*arrays), ref)
    assert mod._BUILT == built  # the same mesh and jitted function, not a new jax.jit per call
    assert fn[0]._cache_size() == 1  # compiled once


def test_make_mesh_uses_jax_make_mesh_without_a_device_order(mlp):
    import jax

    _, mod, _, _ = mlp
    assert "jax.make_mesh(" in spmdlang.compile(MLP).jax_source
    m = mod.make_mesh()
    assert m.axis_names == ("data", "model") and m.devices.shape == (2, 4)
    assert all(t == jax.sharding.AxisType.Auto for t in m.axis_types)
    ordered = spmdlang.compile("mesh [x=2, y=2] devices [0, 2, 1, 3]\nfunc main(a: f32[4] {x}) -> f32[4] { return a }")
    assert "jax.make_mesh(" not in ordered.jax_source  # an explicit device order is kept as written


def test_axis_names_map_onto_the_callers_mesh(mlp):
    import jax
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    c, mod, arrays, ref = mlp
    theirs = jax.make_mesh((4, 2), ("tp", "dp"), axis_types=(AxisType.Auto,) * 2)  # other names, other order
    names = {"data": "dp", "model": "tp"}
    f = mod.build(theirs, axis_names=names)
    outs = f(*mod.place(arrays, theirs, axis_names=names))
    _close([np.asarray(o) for o in outs], ref)
    _close(mod.run(*arrays, mesh=theirs, axis_names=names), ref)
    # inputs already on the caller's mesh, with the caller's own layouts, and plain jax arrays
    on_theirs = [jax.device_put(a, NamedSharding(theirs, P("tp") if a.ndim else P())) for a in arrays]
    _close(mod.run(*on_theirs, mesh=theirs, axis_names=names), ref)
    plain = [jax.numpy.asarray(a) for a in arrays]
    _close(mod.run(*plain), ref)
    with pytest.raises(ValueError, match="no axis 'data'.*axis_names"):
        mod.build(theirs)
    with pytest.raises(ValueError, match="size 4"):
        mod.build(theirs, axis_names={"data": "tp", "model": "dp"})


def test_a_mesh_with_the_programs_names_but_other_sizes_is_refused(mlp):
    """The program's axis names at other sizes (x=8 where the program has x=4) were taken as they
    were: masks and chunks of the program's sizes on other shards, a silently wrong sum. Also: a
    missing array, Python numbers, and run() under the caller's jax.set_mesh of their own mesh."""
    import jax
    from jax.sharding import AxisType

    c, mod, arrays, ref = mlp
    wrong = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    with pytest.raises(ValueError, match="axis 'data' of the mesh has size 4, the program's axis 'data' needs 2"):
        mod.run(*arrays, mesh=wrong)
    with pytest.raises(ValueError, match="expected 5 arrays, one per parameter, got 4"):
        mod.run(*arrays[:4])
    theirs = jax.make_mesh((4, 2), ("tp", "dp"), axis_types=(AxisType.Explicit,) * 2)
    with jax.set_mesh(theirs):
        _close(mod.run(*arrays, mesh=theirs, axis_names={"data": "dp", "model": "tp"}), ref)
        _close(mod.run(*arrays), ref)
    scalar = spmdlang.compile("mesh [x=2]\nfunc main(a: f32[], n: i32[]) -> f32[] { return a * cast(n, f32) }\n")
    assert float(scalar.runner("jax").module.run(3.0, 4)[0]) == 12.0


def test_inputs_on_another_mesh_and_explicit_axes(mlp):
    import jax
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    c, mod, arrays, ref = mlp
    other = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Explicit,))
    moved = [jax.device_put(a, NamedSharding(other, P(*([None] * a.ndim)))) for a in arrays]
    _close(mod.run(*moved), ref)
    explicit = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
    _close(mod.run(*arrays, mesh=explicit), ref)


def test_uneven_inputs_are_placed_block_by_block():
    c = spmdlang.compile(UNEVEN)
    mod = c.runner("jax").module
    inputs = c.random_inputs(2)
    arrays = [inputs[p.name] for p in c.program.params]
    placed = mod.place(arrays, mod.make_mesh())
    assert placed[0].shape == (6, 8)  # padded to shard multiples
    np.testing.assert_array_equal(np.asarray(placed[0])[:5, :6], arrays[0])
    assert not np.asarray(placed[0])[5:].any()
    _close(mod.run(*arrays), c.run(inputs, backend="ref"))
    _close(c.runner("xla").module.run(*arrays), c.run(inputs, backend="ref"))


def test_importing_jax_first_still_gets_virtual_devices(tmp_path):
    code = (
        "import jax\n"
        "import spmdlang\n"
        f"c = spmdlang.compile({MLP!r}, consts={{'B': 8, 'D': 16, 'F': 32}})\n"
        "d = c.diff(backends=['ref', 'jax'])\n"
        "assert d['ok'], d\n"
        "print(len(jax.devices()))\n"
    )
    env = {k: v for k, v in __import__("os").environ.items() if k != "XLA_FLAGS"}
    env["PYTHONPATH"] = str(ROOT)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert int(r.stdout.split()[-1]) >= 8


def test_too_few_devices_after_jax_started_is_a_clear_error(tmp_path):
    """The module loaded in this process (`runner`) cannot have more devices than jax started with:
    a clear error (`run` goes to a child process instead: the test below)."""
    code = (
        "import jax\n"
        "jax.devices()\n"  # jax has started with its default (1 CPU device): the count is fixed now
        "import spmdlang\n"
        f"c = spmdlang.compile({MLP!r})\n"
        "try:\n"
        "    c.runner('jax')\n"
        "except spmdlang.SpmdError as e:\n"
        "    print('SpmdError', e.message)\n"
    )
    env = {k: v for k, v in __import__("os").environ.items() if k != "XLA_FLAGS"}
    env["PYTHONPATH"] = str(ROOT)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "SpmdError the mesh needs 8 devices" in r.stdout and "jax_num_cpu_devices" in r.stdout


def test_too_old_jax_is_a_clear_error(monkeypatch):
    import jax

    from spmdlang.backend_jax import require_jax

    monkeypatch.setattr(jax, "__version__", "0.6.0")
    with pytest.raises(spmdlang.SpmdError, match=r"need jax >= 0\.6\.1, but jax 0\.6\.0 is installed"):
        require_jax()


def test_declared_jax_bound_is_the_checked_one():
    import re

    from spmdlang.backend_jax import MIN_JAX

    text = (ROOT / "pyproject.toml").read_text()
    want = ".".join(map(str, MIN_JAX))
    for name in ("jax", "jaxlib"):
        bound = rf'"{name}>={re.escape(want)},<[0-9.]+"'
        assert re.search(bound, text), f"pyproject.toml's {name} bound is not >={want}"


@pytest.mark.parametrize("program", ["mlp", "uneven"])
def test_two_processes_as_two_hosts(program):
    """jax.distributed over 2 local processes (4 CPU devices each, gloo): the module's run() places
    each process's blocks and gathers the results; both backends agree with ref."""
    if program == "mlp":
        c, backends = spmdlang.compile(MLP, consts={"B": 8, "D": 16, "F": 32}), ["ref", "jax", "xla"]
    else:
        c, backends = spmdlang.compile(UNEVEN), ["ref", "jax"]
    d = c.diff(backends=backends, seed=4, processes=2)
    assert d["ok"], d["results"]
    assert {r["backend"] for r in d["results"]} == set(backends) - {"ref"}


def test_processes_must_split_the_mesh():
    c = spmdlang.compile(MLP, consts={"B": 8, "D": 16, "F": 32})
    with pytest.raises(spmdlang.SpmdError, match="must split evenly"):
        c.run(backend="jax", processes=3)


def test_permute_pairs_are_listed_for_small_groups_and_computed_for_large_ones():
    """A permute's pairs are written into the module only for a group of at most LITERAL_PAIRS
    devices: emitting never lists the devices of a large group; the module computes those."""
    from spmdlang.ops.collective import LITERAL_PAIRS

    src = ("mesh [p={p}, q={q}]\nfunc main(x: f32[64, 8] {{(p, q), _}}) -> f32[64, 8] {{(p, q), _}} {{\n"
           "  return roll(x, 3, axis=0)\n}}\n")
    small = spmdlang.compile(src.format(p=2, q=4)).jax_source
    assert "perm=[(" in small and "def permute_pairs" not in small
    large = spmdlang.compile(src.format(p=4, q=8))
    assert 4 * 8 > LITERAL_PAIRS
    assert "perm=[(" not in large.jax_source and "perm=permute_pairs((" in large.jax_source
    x = np.arange(64 * 8, dtype=np.float32).reshape(64, 8)
    np.testing.assert_array_equal(large.run({"x": x}, backend="jax")[0], np.roll(x, 3, axis=0))


def test_an_int_product_over_a_split_dim_wraps_as_int32_under_x64():
    """prod over a split i32 dim: the shards' products are gathered and multiplied with jnp.prod,
    which widens small ints to the default int once x64 is on (as any module of a 64-bit program
    turns it on for the process): the dtype stays i32, wrapping as the reference does (the
    campaign's seed 71668 got the unwrapped int64 product)."""
    import jax

    c = spmdlang.compile("""mesh [p=2, q=3]
func main(x: i32[4, 5] {(q, p), _}) -> i32[] {
  return prod(x)
}
""")
    x = np.arange(1, 21, dtype=np.int32).reshape(4, 5) % 14 + 1
    want = c.run({"x": x}, backend="ref")[0]
    assert int(want) != int(np.prod(x.astype(np.int64)))  # (it wraps)
    with jax.enable_x64(True):
        got = c.run({"x": x}, backend="jax")[0]
    assert got.dtype == np.int32 and int(got) == int(want)


def test_run_after_jax_used_its_devices_runs_in_a_child_process(tmp_path):
    """A user who computed with jax first (a model.init, a jnp.ones) fixed jax's CPU device count
    at 1: `run(backend="jax")` on a mesh of 4 then runs in a child process with a jax of its own,
    warning that it does, and gives the reference's answer (it was an error)."""
    script = tmp_path / "used_first.py"
    script.write_text(
        "import warnings\nimport jax, jax.numpy as jnp, numpy as np\n"
        "x = jnp.ones((8, 4)) * 3.0  # jax's devices are fixed now: 1 CPU device\n"
        "import spmdlang\n"
        "c = spmdlang.compile('mesh [a=2, b=2]\\nfunc main(x: f32[8, 4] {a, b}) -> f32[4] {\\n"
        "  return sum(x * x, 0)\\n}\\n')\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    out = c.run({'x': np.asarray(x)}, backend='jax')[0]\n"
        "assert len(jax.devices()) == 1 and any('child process' in str(m.message) for m in w), w\n"
        "np.testing.assert_allclose(out, np.full(4, 72.0))\nprint('ok')\n")
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}
    env["JAX_PLATFORMS"] = "cpu"
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr[-2000:]


def test_place_refuses_what_a_cast_would_truncate_and_names_it_does_not_know():
    """Float ids for an i32 parameter (they were truncated), complex values for an f32 one (their
    imaginary part dropped), a struct field the struct lacks and an axis_names key that is no
    program axis (both ignored) are ValueErrors; ints for a float parameter still convert."""
    c = spmdlang.compile("mesh [x=2]\nstruct P {\n  w: f32[4]\n}\n"
                         "func main(p: P, ids: i32[3]) -> f32[3] {\n  return take(p.w, ids)\n}\n")
    m = c.runner("jax").module
    p = {"w": np.arange(4, dtype=np.float32)}
    np.testing.assert_array_equal(m.run({"w": [0, 1, 2, 3]}, [3, 1, 0])[0], [3.0, 1.0, 0.0])
    for args, kw, fragment in [((p, np.array([0.7, 1.9, 2.5])), {}, "expected int32 values, got float64"),
                               (({"w": np.ones(4) * (1 + 5j)}, [0, 1, 2]), {}, "got complex128"),
                               (({"w": p["w"], "ww": np.zeros(4)}, [0, 1, 2]), {}, "got the fields ['ww']"),
                               ((p, [0, 1, 2]), {"mesh": m.make_mesh(), "axis_names": {"dtaa": "x"}},
                                "axis_names maps ['dtaa']")]:
        with pytest.raises(ValueError, match=re.escape(fragment)):
            m.run(*args, **kw)
