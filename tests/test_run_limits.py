"""Loops at the edges of int32, deeply nested loops, work and memory limits, and a conv whose
window is spread far past its input: each runs and agrees with the reference, or ends in a located
error (exit 1), never a traceback, a crash or an unbounded run."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

import spmdlang
from spmdlang import limits
from spmdlang.cli import main

LOCATED = re.compile(r"^\S+:\d+:\d+: error: ", re.M)


def cli(capsys, *args) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "internal error" not in err, err
    return code, out, err


def write(tmp_path, text, name="p.spmd") -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def loop_program(start: int, stop: int) -> str:
    return ("mesh [d=2]\nfunc main(x: f32[8]) -> (f32[8], i32[]) {\n  c = 0\n"
            f"  loop i in range({start}, {stop}) {{\n    x = x * 0.5 + 1.0\n    c = maximum(c, i)\n  }}\n"
            "  return x, c\n}\n")


# ---------------------------------------------------------------------------------- int32 loop bounds


def test_loop_ending_at_2_31_agrees_on_every_backend(capsys, tmp_path):
    """fori_loop's bounds are int32: range(2^31 - 3, 2^31) used to end in OverflowError on jax."""
    path = write(tmp_path, loop_program(2**31 - 3, 2**31))
    code, out, err = cli(capsys, "diff", path, "--backends", "sim,jax,xla")
    assert code == 0, err
    c = spmdlang.compile(path)
    x = np.arange(8, dtype=np.float32)
    want = x
    for _ in range(3):
        want = want * np.float32(0.5) + np.float32(1.0)
    for backend in ("ref", "jax"):
        got_x, got_c = c.run({"x": x}, backend=backend)
        np.testing.assert_allclose(got_x, want, rtol=1e-6)
        assert int(got_c) == 2**31 - 1


def test_loop_of_2_32_trips_lowers_on_jax_and_is_refused_by_the_work_limit(capsys, tmp_path):
    """A trip count beyond int32 (range(-2^31, 2^31)) becomes consecutive fori_loops plus the last
    index; jax traces and lowers it (running it would take hours: the work limit refuses it, at the
    loop)."""
    path = write(tmp_path, loop_program(-2**31, 2**31))
    c = spmdlang.compile(path)
    for backend in ("jax", "xla"):
        src = c.jax_source if backend == "jax" else c.xla_source
        assert src.count("jax.lax.fori_loop(") == 3 and "loop0(2147483647, " in src  # 3 pieces < 2^31
        r = c.runner(backend)
        args = r.module.place([np.zeros(8, np.float32)], r.mesh)
        assert "while" in r.fn.lower(*args).as_text()
        code, _, err = cli(capsys, "run", path, "--backend", backend)
        assert code == 1 and f"{path}:4:3: error: the {backend} backend would run" in err, err
        assert "--max-work" in err


@pytest.mark.parametrize("start,stop,col", [(0, 2**31 + 1, 22), (2**31, 2**31 + 2, 31), (-2**31 - 1, 0, 19),
                                            (-2**40, 2**40, 35)])
def test_loop_index_beyond_int32_is_a_check_error(capsys, tmp_path, start, stop, col):
    """The index is an i32 value: a range reaching beyond int32 is refused where it is written."""
    path = write(tmp_path, loop_program(start, stop))
    code, _, err = cli(capsys, "check", path)
    assert code == 1 and f"{path}:4:{col}: error: the loop index 'i' is an i32 value" in err, err


def test_empty_loop_with_any_bounds_is_accepted(capsys, tmp_path):
    path = write(tmp_path, loop_program(2**40, 2**40))
    code, _, err = cli(capsys, "diff", path, "--backends", "sim,jax")
    assert code == 0, err


# ---------------------------------------------------------------------------------- nested loops


def nested(n: int) -> str:
    opens = "".join(f"{'  ' * (k + 1)}loop i{k} in range(2) {{\n" for k in range(n))
    closes = "".join("  " * (k + 1) + "}\n" for k in reversed(range(n)))
    return (f"mesh [d=2]\nfunc main(x: f32[8] {{d}}, y: f32[8]) -> f32[8] {{\n{opens}"
            f"{'  ' * (n + 1)}x = x * 0.5 + y\n{closes}  return x\n}}\n")


def test_nested_loops_emit_bounded_indentation():
    """Every loop's function is defined at the enclosing function's level: 64 nested loops (the
    most the jax backends take) indent the module no deeper than a single loop does."""
    def indent(src):
        return max(len(line) - len(line.lstrip(" ")) for line in src.splitlines() if line.strip())

    one, deep = spmdlang.compile(nested(1)), spmdlang.compile(nested(limits.JAX_MAX_LOOP_DEPTH))
    for a, src in ((one.jax_source, deep.jax_source), (one.xla_source, deep.xla_source)):
        assert indent(src) == indent(a)
        compile(src, "<module>", "exec")  # Python accepts it
        assert src.count("jax.lax.fori_loop(") == limits.JAX_MAX_LOOP_DEPTH


def test_nested_loops_agree_with_ref(capsys, tmp_path):
    path = write(tmp_path, nested(6))
    code, _, err = cli(capsys, "diff", path, "--backends", "sim,jax,xla")
    assert code == 0, err


@pytest.mark.slow
def test_deepest_nesting_runs_on_jax(capsys, tmp_path):
    path = write(tmp_path, nested(limits.JAX_MAX_LOOP_DEPTH).replace("range(2)", "range(1)"))
    code, _, err = cli(capsys, "diff", path, "--backends", "jax,xla")
    assert code == 0, err


def test_nesting_deeper_than_jax_takes_is_a_located_error(capsys, tmp_path):
    """check and the ref and sim backends take 500 nested loops; the jax backends refuse more than
    JAX_MAX_LOOP_DEPTH at the first loop too deep, as compile and run alike (XLA crashes on ~100)."""
    n = 500
    path = write(tmp_path, nested(n).replace("range(2)", "range(1)"))
    code, _, err = cli(capsys, "check", path)
    assert code == 0, err
    code, _, err = cli(capsys, "diff", path, "--backends", "sim")
    assert code == 0, err
    depth = limits.JAX_MAX_LOOP_DEPTH + 1
    where = f"{path}:{2 + depth}:{2 * depth + 1}: error: this loop nests {depth} loops deep"
    for args in (("run", "--backend", "jax"), ("run", "--backend", "xla"), ("compile", "--target", "jax"),
                 ("compile", "--target", "xla"), ("diff", "--backends", "jax")):
        out_file = tmp_path / "out.py"
        extra = ("-o", out_file) if args[0] == "compile" else ()
        code, out, err = cli(capsys, args[0], path, *args[1:], *extra)
        assert code == 1 and where in err, (args, err)
        assert not out_file.exists() and not out


# ---------------------------------------------------------------------------------- work limits


def test_jax_work_limit_names_the_loop_and_max_work_raises_it(capsys, tmp_path):
    """2^40 iterations (two nested loops of 2^20) used to run unbounded on jax while ref refused."""
    path = write(tmp_path, "mesh [d=2]\nfunc main(x: f32[8]) -> f32[8] {\n  y = x + 1.0\n"
                           "  loop i in range(1048576) {\n    loop j in range(1048576) {\n      x = x * 0.5\n"
                           "    }\n  }\n  return x + y\n}\n")
    for backend in ("jax", "xla", "ref", "sim"):
        code, _, err = cli(capsys, "run", path, "--backend", backend)
        assert code == 1 and f"{path}:4:3: error: the {backend} backend would run" in err, err
        assert "--max-work" in err
    c = spmdlang.compile(path)
    work = limits._ops_run(c.program.ops)  # the global program's, as xla counts: bodies once per iteration
    assert work >= 2**40
    with pytest.raises(spmdlang.SpmdError, match="at most 1,000,000,000"):
        c.check_memory("jax")
    c.check_memory("jax", max_work=2**43)  # raised: passes
    c.check_memory("ref", max_work=2**43)
    with pytest.raises(spmdlang.SpmdError, match=f"at most {work - 1:,}"):
        c.check_memory("xla", max_work=work - 1)


def test_max_work_flag(capsys, tmp_path):
    path = write(tmp_path, loop_program(0, 10))
    code, _, err = cli(capsys, "diff", path, "--backends", "sim,jax", "--max-work", "20")
    assert code == 1 and f"{path}:4:3: error: the ref backend would run 52 ops" in err and "at most 20" in err
    code, _, err = cli(capsys, "run", path, "--backend", "jax", "--max-work", "20")
    assert code == 1 and f"{path}:4:3: error: the jax backend would run" in err
    code, _, err = cli(capsys, "diff", path, "--backends", "sim,jax", "--max-work", "1000")
    assert code == 0, err
    with pytest.raises(SystemExit):
        main(["run", path, "--backend", "ref", "--max-work", "0"])
    assert "--max-work" in capsys.readouterr().err


# ---------------------------------------------------------------------------------- conv taps


@pytest.mark.parametrize("rhs", [10**8, 10**12])
@pytest.mark.parametrize("spec", ["", " {_, d, _}"])
def test_conv_dilated_far_past_its_input(capsys, tmp_path, rhs, spec):
    """Only the centre tap reaches the input: ref and sim cost that tap alone (37 s and 4.7 GB at
    10^8, out of memory at 10^12, before), and equal jax.lax.conv_general_dilated."""
    import jax

    path = write(tmp_path, f"mesh [d=2]\nfunc main(x: f32[1, 8, 4]{spec}, w: f32[3, 4, 4]) -> f32[1, 8, 4] {{\n"
                           f"  return conv(x, w, rhs_dilation={rhs})\n}}\n")
    c = spmdlang.compile(path)
    inputs = c.random_inputs(3)
    want = np.einsum("nwc,cf->nwf", inputs["x"], inputs["w"][1])  # the centre tap alone
    if rhs <= 10**8:  # (XLA on CPU pads the input first: at 10^12 it asks for 32 TB)
        lax = jax.lax.conv_general_dilated(inputs["x"], inputs["w"], (1,), [(rhs, rhs)], None, (rhs,),
                                           ("NWC", "WIO", "NWC"))
        np.testing.assert_allclose(np.asarray(lax), want, rtol=1e-5, atol=1e-5)
    for backend in ("ref", "sim", "jax"):
        try:
            got = c.run(inputs, backend=backend)[0]
        except spmdlang.SpmdError as e:  # XLA pads the input first: at 10^12 it cannot allocate it
            assert backend == "jax" and rhs > 10**8 and "the jax backend ran out of memory" in str(e), e
            assert e.span is not None and e.span.line == 1
            continue
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # the per-partition program holds no tensor larger than the input's whole rows
    assert max(v.type.size for op in c.spmd.program.ops for v in op.results) <= 8 * 4 * 4


def test_conv_numpy_matches_lax_on_random_configurations():
    """Taps that land in padding or between lhs-dilated elements are skipped, not computed."""
    import jax

    from spmdlang.ops.contract import conv_attrs, conv_numpy

    rng = np.random.default_rng(7)
    dims = {1: ("NWC", "WIO", "NWC"), 2: ("NHWC", "HWIO", "NHWC")}
    checked = 0
    while checked < 40:
        nsp = int(rng.integers(1, 3))
        g = int(rng.choice([1, 2]))
        bg = 1 if g > 1 else int(rng.choice([1, 2]))
        c, f, n = 2 * g, 2 * max(g, bg), 2 * bg
        sp = [int(rng.integers(1, 7)) for _ in range(nsp)]
        k = [int(rng.integers(1, 4)) for _ in range(nsp)]
        st, lhs, rhs = ([int(rng.integers(1, hi)) for _ in range(nsp)] for hi in (3, 3, 5))
        pad = [(int(rng.integers(-2, 4)), int(rng.integers(-2, 4))) for _ in range(nsp)]
        x = rng.standard_normal((n, *sp, c)).astype(np.float32)
        w = rng.standard_normal((*k, c // g, f)).astype(np.float32)
        try:
            want = np.asarray(jax.lax.conv_general_dilated(x, w, st, pad, lhs, rhs, dims[nsp],
                                                           feature_group_count=g, batch_group_count=bg))
        except (TypeError, ValueError):
            continue
        if 0 in want.shape:
            continue
        got = conv_numpy(x, w, **conv_attrs(st, pad, lhs, rhs, g, bg))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=str((sp, k, st, lhs, rhs, pad, g, bg)))
        checked += 1


# ---------------------------------------------------------------------------------- address-space limit


def _limited_run(path, *args, limit=2 << 30):
    """`spmdlang run` in a child that lowers its own RLIMIT_AS first (as `prlimit --as` would; no
    preexec_fn: forking this process, where jax runs threads, could deadlock)."""
    code = ("import resource, runpy, sys\n"
            f"resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}))\n"
            f"sys.argv = ['spmdlang', 'run', *{[path, *args]!r}]\n"
            "runpy.run_module('spmdlang', run_name='__main__')\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc are Linux's")
@pytest.mark.parametrize("backend", ["ref", "sim"])
def test_address_space_limit_is_respected(tmp_path, backend):
    """Under `prlimit --as` the estimate is checked against what the limit leaves, not the machine's
    free memory; a run let through anyway (--max-memory) that runs out is located at the op."""
    path = write(tmp_path, "mesh [d=2]\nfunc main(x: f32[8]) -> f32[] {\n"
                           "  return sum(broadcast_to(x, [25000000, 8]) * 2.0)\n}\n")
    p = _limited_run(path, "--backend", backend)
    assert p.returncode == 1 and f"{path}:3:14: error: running on {backend} needs about" in p.stderr, p.stderr
    assert "of available memory" in p.stderr
    p = _limited_run(path, "--backend", backend, "--max-memory", "100G")
    assert p.returncode == 1 and LOCATED.search(p.stderr), p.stderr
    assert f"the {backend} backend ran out of memory computing" in p.stderr and "Traceback" not in p.stderr


def test_rlimit_headroom_counts_what_the_process_maps(monkeypatch):
    import resource

    real = resource.getrlimit
    monkeypatch.setattr(resource, "getrlimit", lambda which: (
        (5 << 30, resource.RLIM_INFINITY) if which == resource.RLIMIT_AS else real(which)))
    monkeypatch.setattr(limits, "_proc_status", lambda: {"VmSize": 2 << 30, "VmData": 1 << 30})
    assert limits._rlimit_headroom() == 3 << 30
    assert limits.available_memory() <= 3 << 30
