"""Hostile inputs end in exit 0, 1 or 2 with a located or flag-named message, within seconds and
bounded memory (spmdlang.limits): never an internal error (exit 3), a crash or a hang."""

from __future__ import annotations

import errno
import io
import json
import os
import re
import subprocess
import sys
import time
import zipfile

import numpy as np
import pytest

import spmdlang
from spmdlang import limits
from spmdlang.cli import main

LOCATED = re.compile(r"^\S+:\d+:\d+: error: ", re.M)


def cli(capsys, *args) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def write(tmp_path, text, name="p.spmd") -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def fn(body: str, params="x: f32[8]", result="f32[8]", mesh="mesh [d=2]") -> str:
    return f"{mesh}\nfunc main({params}) -> {result} {{\n{body}\n}}\n"


def assert_clean(code, err, allowed=(0, 1)):
    assert code in allowed, err
    assert "internal error" not in err and "Traceback" not in err
    if code == 1:
        assert LOCATED.search(err), err


# ---------------------------------------------------------------------------------- recursion

K = 10  # ten times the depths that used to end in RecursionError


def _deep_programs():
    yield "unary minus", fn("  return " + "-" * 488 * K + "x")
    yield "plus chain", fn("  return " + " + ".join(["x"] * 489 * K))
    yield "nested relu", fn("  return " + "relu(" * 245 * K + "x" + ")" * 245 * K)
    loops = "".join(f"for i{i} in range(1) {{\n" for i in range(244 * K))
    yield "nested for", fn(loops + "x = x + 1.0\n" + "}\n" * 244 * K + "  return x")
    yield "slices", fn("  return x" + "[:]" * 487 * K)
    yield "const chain", "mesh [d=2]\nconst C = " + " + ".join(["1"] * 491 * K) + "\n" + \
        "func main(x: f32[8]) -> f32[8] {\n  return x * C\n}\n"
    n = 123 * K
    calls = "".join(f"func f{i}(x: f32[8]) -> f32[8] {{\n  return f{i + 1}(x)\n}}\n" for i in range(n))
    yield "call chain", "mesh [d=2]\n" + calls + f"func f{n}(x: f32[8]) -> f32[8] {{\n  return x\n}}\n" + \
        "func main(x: f32[8]) -> f32[8] {\n  return f0(x)\n}\n"


@pytest.mark.parametrize("name,text", list(_deep_programs()), ids=[n for n, _ in _deep_programs()])
def test_deep_programs_compile_or_give_a_located_error(capsys, tmp_path, name, text):
    path = write(tmp_path, text)
    t = time.monotonic()
    code, out, err = cli(capsys, "check", path, "--json")
    assert_clean(code, err)
    assert time.monotonic() - t < 60
    if code == 0:
        assert json.loads(out)["values"]


def test_deep_program_through_the_api():
    """spmdlang.compile runs the front end on a deep-stack thread too."""
    c = spmdlang.compile(fn("  return " + "-" * 4000 + "x"))
    np.testing.assert_array_equal(c.run({"x": np.arange(8, dtype=np.float32)}, backend="ref")[0],
                                  np.arange(8, dtype=np.float32))


def test_nesting_limit_is_a_located_error(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr("spmdlang.frontend.parse.MAX_NESTING", 50)
    path = write(tmp_path, fn("  y = x\n  return " + "-" * 60 + "y"))
    code, _, err = cli(capsys, "check", path)
    assert code == 1 and f"{path}:4:" in err and "nests more than 50 levels" in err


def test_call_depth_limit_is_a_located_error(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr("spmdlang.frontend.lower.MAX_CALL_DEPTH", 20)
    calls = "".join(f"func f{i}(x: f32[8]) -> f32[8] {{\n  return f{i + 1}(x)\n}}\n" for i in range(30))
    path = write(tmp_path, "mesh [d=2]\n" + calls + "func f30(x: f32[8]) -> f32[8] {\n  return x\n}\n"
                 "func main(x: f32[8]) -> f32[8] {\n  return f0(x)\n}\n")
    code, _, err = cli(capsys, "check", path)
    assert code == 1 and LOCATED.search(err) and "calls nest more than 20 deep" in err


# ---------------------------------------------------------------------------------- tensors too big


def test_too_big_for_memory_is_refused_at_the_declaration(capsys, tmp_path):
    path = write(tmp_path, fn("  return sum(x)", params="x: f32[700000000]", result="f32[]"))
    for backend in ("ref", "sim", "jax"):
        code, _, err = cli(capsys, "run", path, "--backend", backend, "--max-memory", "1G")
        assert code == 1 and f"{path}:2:11: error: running on {backend} needs about" in err, err
        assert "--max-memory" in err and "f32[700000000]" in err


def test_max_memory_passes_a_program_that_fits(capsys, tmp_path):
    path = write(tmp_path, fn("  return x * 2.0"))
    code, _, err = cli(capsys, "diff", path, "--backends", "ref,sim", "--max-memory", "64M")
    assert code == 0, err
    code, _, err = cli(capsys, "diff", path, "--backends", "ref,sim", "--max-memory", "100")
    assert code == 1 and "more than the 100 bytes of --max-memory" in err


def test_api_run_checks_memory():
    c = spmdlang.compile(fn("  return x * 2.0"))
    with pytest.raises(spmdlang.SpmdError, match="needs about"):
        c.run(backend="sim", max_memory=10)


def test_huge_broadcast_is_refused_quickly_on_every_backend(capsys, tmp_path):
    path = write(tmp_path, fn("  return sum(broadcast_to(x, [1000000, 1000000, 8]))", result="f32[]"))
    for backend in ("ref", "sim", "jax", "xla"):
        t = time.monotonic()
        code, _, err = cli(capsys, "run", path, "--backend", backend)
        assert code == 1 and f"{path}:3:14: error: running on {backend}" in err, err
        assert time.monotonic() - t < 30
    code, out, err = cli(capsys, "explain", path, "--json")  # reports still work at any size
    totals = json.loads(out)["totals"]
    # explain's peak is the compiled module's, where the broadcast fuses into the sum (the run's
    # check above holds every value, nothing fused)
    assert code == 0 and totals["flops_per_device"] >= 8 * 10 ** 12 and totals["peak_bytes_per_device"] < 1000


@pytest.mark.parametrize("body,result,what", [
    ("  return sum(iota(i32[4611686018427387904], 0))", "i32[]", "at most 2^63-1 bytes"),
    ("  return sum(zeros(f32[99999999999999999999]))", "f32[]", "at most 2^63-1 bytes"),
    ("  return sum(broadcast_to(x, [4611686018427387904, 8]))", "f32[]", "at most 2^63-1 bytes"),
])
def test_sizes_beyond_int64_are_check_errors(capsys, tmp_path, body, result, what):
    path = write(tmp_path, fn(body, result=result))
    code, _, err = cli(capsys, "check", path)
    assert code == 1 and LOCATED.search(err) and what in err, err


def test_rank_above_64_is_a_check_error(capsys, tmp_path):
    path = write(tmp_path, fn("  return sum(x)", params="x: f32[" + ", ".join(["1"] * 65) + "]", result="f32[]"))
    code, _, err = cli(capsys, "check", path)
    assert code == 1 and f"{path}:2:14: error: " in err and "at most 64 dimensions" in err
    path = write(tmp_path, fn("  return reshape(x, [" + ", ".join(["1"] * 70) + "])",
                              params="x: f32[1]", result="f32[" + ", ".join(["1"] * 70) + "]"))
    code, _, err = cli(capsys, "check", path)
    assert code == 1 and LOCATED.search(err) and "at most 64 dimensions" in err


def test_huge_stride_is_a_check_error(capsys, tmp_path):
    path = write(tmp_path, fn("  return conv(x, ones(f32[1, 4, 4]), stride=99999999999999999999)",
                              params="x: f32[1, 8, 4]", result="f32[1, 1, 4]"))
    code, _, err = cli(capsys, "check", path)
    assert code == 1 and f"{path}:3:10: error: the integer 99999999999999999999" in err
    assert "does not fit in 64 bits" in err


# ---------------------------------------------------------------------------------- zero-size dims

ZERO = """mesh [d=2, m=2]
func main(x: f32[0, 8] {d, m}, w: f32[8, 4] {m, _}, ids: i32[6] {d}) -> (f32[], f32[0, 4], f32[6, 0], f32[8]) {
  y = x @ w
  return sum(x), y, one_hot(ids, 0), sum(x, axis=0) + 1.0
}
"""


def test_zero_size_dims_on_all_four_backends(capsys, tmp_path):
    code, out, err = cli(capsys, "diff", write(tmp_path, ZERO), "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["ok"] and {r["backend"] for r in d["results"]} == {"sim", "jax", "xla"}


def test_zero_batch_mlp_on_all_four_backends(capsys):
    code, out, err = cli(capsys, "diff", "programs/mlp.spmd", "--set", "B=0", "--json")
    assert code == 0 and json.loads(out)["ok"], err


# ---------------------------------------------------------------------------------- meshes


def test_mesh_with_more_than_64_axes(capsys, tmp_path):
    mesh = "mesh [" + ", ".join(f"a{i}=1" for i in range(65)) + "]"
    path = write(tmp_path, fn("  return sum(x)", result="f32[]", mesh=mesh))
    for backend in ("jax", "xla"):
        code, _, err = cli(capsys, "run", path, "--backend", backend)
        assert code == 1 and f"{path}:1:1: error: the mesh has 65 axes; the {backend} backend supports at most 64" \
            in err
    code, _, err = cli(capsys, "compile", path, "--target", "jax")
    assert code == 1 and "at most 64" in err
    for backend in ("ref", "sim"):
        assert cli(capsys, "run", path, "--backend", backend)[0] == 0
    assert cli(capsys, "explain", path)[0] == 0


def test_jax_refuses_meshes_beyond_its_cpu_device_limit(capsys, tmp_path):
    n = limits.JAX_MAX_CPU_DEVICES * 2
    path = write(tmp_path, fn("  return sum(x)", params=f"x: f32[{n}] {{d}}", result="f32[]", mesh=f"mesh [d={n}]"))
    for backend in ("jax", "xla"):
        code, _, err = cli(capsys, "run", path, "--backend", backend)
        assert code == 1 and f"the mesh has {n} devices; the {backend} backend runs at most" in err, err
    code, out, err = cli(capsys, "explain", path, "--json")
    assert code == 0, err
    code, out, err = cli(capsys, "run", path, "--backend", "sim", "--json")
    assert code == 0, err


def test_sim_bounds_its_work_on_huge_meshes(capsys, tmp_path):
    path = write(tmp_path, fn("  return sum(x * 2.0)", params="x: f32[8] {d}", result="f32[]",
                              mesh="mesh [d=1000000]"))
    t = time.monotonic()
    code, _, err = cli(capsys, "run", path, "--backend", "sim")
    assert code == 1 and f"{path}:1:1: error: the sim backend would run" in err and "ref backend" in err
    code, out, err = cli(capsys, "run", path, "--backend", "ref", "--json")
    assert code == 0, err
    assert time.monotonic() - t < 60


# ---------------------------------------------------------------------------------- unbounded reads


def test_source_size_is_checked_before_reading(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(limits, "MAX_SOURCE_BYTES", 1000)
    monkeypatch.setattr("spmdlang.frontend.parse.MAX_SOURCE_BYTES", 1000)
    path = write(tmp_path, fn("  return x") + "#" * 2000 + "\n")
    code, _, err = cli(capsys, "check", path)
    assert code == 1 and f"{path}:1:1: error: the program is" in err and "at most" in err
    with pytest.raises(spmdlang.SpmdError, match="at most"):
        spmdlang.compile(fn("  return x") + "#" * 2000 + "\n")


def test_endless_source_stream_is_cut_off(capsys, tmp_path, monkeypatch):
    """A FIFO (like /dev/zero) has no size: reading stops at the limit."""
    monkeypatch.setattr(limits, "MAX_SOURCE_BYTES", 1 << 16)
    fifo = tmp_path / "src.spmd"
    os.mkfifo(fifo)
    import threading

    def feed():
        try:
            with open(fifo, "wb") as f:
                for _ in range(1000):
                    f.write(b"#" * 4096 + b"\n")
        except BrokenPipeError:
            pass

    threading.Thread(target=feed, daemon=True).start()
    code, _, err = cli(capsys, "check", fifo)
    assert code == 1 and "longer than 64.0 KiB" in err


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero")
def test_dev_zero_is_refused_quickly():
    t = time.monotonic()
    for args in (["check", "/dev/zero"], ["run", "programs/mlp.spmd", "--backend", "ref", "--inputs", "/dev/zero"]):
        r = subprocess.run([sys.executable, "-m", "spmdlang", *args], capture_output=True, text=True, timeout=120)
        assert r.returncode == 1 and "/dev/zero:1:1: error: " in r.stderr, r.stderr
    assert time.monotonic() - t < 60


def test_unrolling_is_refused_while_lowering(capsys, tmp_path):
    path = write(tmp_path, fn("  for i in range(100000) {\n    x = x + 1.0\n  }\n  return x"))
    t = time.monotonic()
    code, _, err = cli(capsys, "check", path)
    assert code == 1 and "unroll" in err and LOCATED.search(err)
    assert time.monotonic() - t < 10


def test_op_limit_is_enforced_while_lowering(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr("spmdlang.frontend.lower.MAX_OPS", 500)
    path = write(tmp_path, fn("  for i in range(300) {\n    x = x + 1.0\n    x = x * 2.0\n  }\n  return x"))
    code, _, err = cli(capsys, "check", path)
    assert code == 1 and "more than 500 operations" in err and LOCATED.search(err)


# ---------------------------------------------------------------------------------- .npz inputs

NPZ_PROG = fn("  return x * 2.0 + cast(sum(y), f32)", params="x: f32[8] {d}, y: i32[4]")


def _npz(path, members: dict):
    with zipfile.ZipFile(path, "w") as zf:
        for name, content in members.items():
            with zf.open(name, "w") as f:
                if isinstance(content, bytes):
                    f.write(content)
                elif isinstance(content, dict):  # a header only, claiming a shape
                    np.lib.format.write_array_header_1_0(f, content)
                    f.write(b"\0" * 64)
                else:
                    np.lib.format.write_array(f, content)


def test_npz_extra_member_with_a_huge_header_is_not_loaded(capsys, tmp_path):
    src = tmp_path / "in.npz"
    _npz(src, {"x.npy": np.arange(8, dtype=np.float32), "y.npy": np.arange(4, dtype=np.int32),
               "big.npy": {"descr": "<f8", "fortran_order": False, "shape": (100000, 100000)}})
    code, out, err = cli(capsys, "run", write(tmp_path, NPZ_PROG), "--backend", "ref", "--inputs", src, "--json")
    assert code == 0, err
    assert json.loads(out)["outputs"][0]["sum"] == pytest.approx(2 * 28 + 8 * 6)


def test_npz_header_is_checked_before_loading(capsys, tmp_path):
    src = tmp_path / "in.npz"
    _npz(src, {"x.npy": {"descr": "<f4", "fortran_order": False, "shape": (100000, 100000)},
               "y.npy": np.arange(4, dtype=np.int32)})
    path = write(tmp_path, NPZ_PROG)
    code, _, err = cli(capsys, "run", path, "--backend", "ref", "--inputs", src)
    assert code == 1 and f"{path}:2:11: error: " in err and "has shape [100000, 100000]" in err


def test_npz_big_endian_is_accepted_and_converted(capsys, tmp_path):
    src = tmp_path / "in.npz"
    _npz(src, {"x.npy": np.arange(8, dtype=">f4"), "y.npy": np.arange(4, dtype=">i4")})
    code, out, err = cli(capsys, "run", write(tmp_path, NPZ_PROG), "--backend", "sim", "--inputs", src, "--json")
    assert code == 0, err
    assert json.loads(out)["outputs"][0]["sum"] == pytest.approx(2 * 28 + 8 * 6)
    c = spmdlang.compile(NPZ_PROG)  # the API takes big-endian arrays too
    out = c.run({"x": np.arange(8, dtype=">f4"), "y": np.arange(4, dtype=">i4")}, backend="ref")
    assert out[0].dtype == np.float32 and out[0].sum() == 2 * 28 + 8 * 6


def test_npz_bf16_as_numpy_saves_it_travels_both_ways(capsys, tmp_path):
    """bfloat16 is ml_dtypes', not numpy's: np.savez writes a bf16 array as two raw bytes per
    element ('|V2'), and so does `run -o` for a bf16 result. Such a member is read as the bf16
    parameter it is for (it was refused as 'has dtype |V2'), so a run's outputs are inputs again."""
    import ml_dtypes

    prog = "mesh [p=2]\nfunc main(x: bf16[4, 3] {p, _}, y: f32[3]) -> bf16[4, 3] {\n  return x * cast(y, bf16)\n}\n"
    path = write(tmp_path, prog)
    x = (np.arange(12, dtype=np.float32).reshape(4, 3) / 7).astype(ml_dtypes.bfloat16)
    y = np.array([1.5, -2.0, 0.25], np.float32)
    src, out = tmp_path / "in.npz", tmp_path / "out.npz"
    np.savez(src, x=x, y=y)
    assert np.load(src)["x"].dtype == np.dtype("V2")  # (what numpy writes)
    code, _, err = cli(capsys, "run", path, "--backend", "sim", "--inputs", src, "-o", out)
    assert code == 0, err
    want = spmdlang.compile(prog).run({"x": x, "y": y}, backend="ref")[0]
    got = np.load(out)["out0"]
    assert got.dtype == np.dtype("V2") and np.array_equal(got.view(ml_dtypes.bfloat16), want)
    np.savez(src, x=got, y=y)  # the result, as written, is an input again
    code, _, err = cli(capsys, "run", path, "--backend", "ref", "--inputs", src)
    assert code == 0, err
    np.savez(src, x=np.zeros((4, 3), "V4"), y=y)  # other raw bytes stay refused
    code, _, err = cli(capsys, "run", path, "--backend", "ref", "--inputs", src)
    assert code == 1 and "has dtype |V4" in err


def test_npz_member_that_is_not_npy_says_what_it_is(capsys, tmp_path):
    src = tmp_path / "in.npz"
    _npz(src, {"x.npy": b"hello, this is text", "y.npy": np.arange(4, dtype=np.int32)})
    code, _, err = cli(capsys, "run", write(tmp_path, NPZ_PROG), "--backend", "ref", "--inputs", src)
    assert code == 1 and "member 'x.npy' is not a .npy array (text starting 'hello, this is t')" in err


def test_npz_wrong_dtype_and_missing_member(capsys, tmp_path):
    path = write(tmp_path, NPZ_PROG)
    src = tmp_path / "in.npz"
    _npz(src, {"x.npy": np.arange(8, dtype=np.float64), "y.npy": np.arange(4, dtype=np.int32)})
    code, _, err = cli(capsys, "run", path, "--backend", "ref", "--inputs", src)
    assert code == 1 and "has dtype float64" in err
    _npz(src, {"x.npy": np.arange(8, dtype=np.float32)})
    code, _, err = cli(capsys, "run", path, "--backend", "ref", "--inputs", src)
    assert code == 1 and "has no array 'y'" in err


def test_inputs_that_are_not_regular_files(capsys, tmp_path):
    fifo = tmp_path / "in.npz"
    os.mkfifo(fifo)
    code, _, err = cli(capsys, "run", write(tmp_path, NPZ_PROG), "--backend", "ref", "--inputs", fifo)
    assert code == 1 and "is not a regular file" in err


# ---------------------------------------------------------------------------------- options, outputs


@pytest.mark.parametrize("argv", [
    ["diff", "programs/mlp.spmd", "--rtol", "nan"],
    ["diff", "programs/mlp.spmd", "--rtol", "inf"],
    ["diff", "programs/mlp.spmd", "--atol", "-1"],
    ["explain", "programs/mlp.spmd", "--bandwidth", "data=nan"],
    ["explain", "programs/mlp.spmd", "--bandwidth", "data=inf"],
    ["explain", "programs/mlp.spmd", "--latency", "data=nan"],
    ["run", "programs/mlp.spmd", "--backend", "ref", "--max-memory", "nan"],
    ["run", "programs/mlp.spmd", "--backend", "ref", "--max-memory", "-4G"],
    ["run", "programs/mlp.spmd", "--backend", "ref", "--max-memory", "lots"],
])
def test_meaningless_numbers_are_usage_errors(capsys, argv):
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and argv[-2] in err and "Traceback" not in err


def test_parse_size():
    assert limits.parse_size("4G") == 4 << 30
    assert limits.parse_size("512MiB") == 512 << 20
    assert limits.parse_size("1.5k") == 1536
    assert limits.parse_size("1000") == 1000


class _Failing(io.StringIO):
    def __init__(self, err):
        super().__init__()
        self.err = err

    def write(self, s):
        raise OSError(self.err, os.strerror(self.err))

    def flush(self):
        pass


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EPIPE])
def test_stdout_write_errors_are_clean_io_errors(monkeypatch, capsys, err):
    monkeypatch.setattr("sys.stdout", _Failing(err))
    code = main(["compile", "programs/mlp.spmd", "--target", "ir"])
    captured = capsys.readouterr().err
    assert code == 1 and "cannot write" in captured and os.strerror(err) in captured
    assert "internal error" not in captured


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
def test_dev_full_stdout():
    try:
        out = open("/dev/full", "w")
    except OSError:
        pytest.skip("/dev/full cannot be opened here")
    with out:
        r = subprocess.run([sys.executable, "-m", "spmdlang", "compile", "programs/mlp.spmd", "--target", "jax"],
                           stdout=out, stderr=subprocess.PIPE, text=True, timeout=120)
    assert r.returncode == 1 and "No space left on device" in r.stderr and "Traceback" not in r.stderr


INF = fn("  return exp(x * 1000.0)")


def test_non_finite_results_are_a_note_and_numpy_warnings_stay_quiet(tmp_path):
    path = write(tmp_path, INF)
    r = subprocess.run([sys.executable, "-m", "spmdlang", "run", path, "--backend", "ref"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and "note: out0 has" in r.stderr and "non-finite" in r.stderr
    assert "RuntimeWarning" not in r.stderr and "overflow" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "spmdlang", "diff", path, "--backends", "ref,sim", "--json"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "RuntimeWarning" not in r.stderr
    assert "non-finite" in json.loads(r.stdout)["notes"][0]


def test_endless_stdin_is_cut_off(capsys, monkeypatch):
    monkeypatch.setattr(limits, "MAX_SOURCE_BYTES", 1000)

    class Endless(io.RawIOBase):
        def readable(self):
            return True

        def readinto(self, b):
            b[:] = b"#" * len(b)
            return len(b)

    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BufferedReader(Endless())))
    code, _, err = cli(capsys, "check", "-")
    assert code == 1 and "standard input is longer than" in err


def test_npz_version_3_and_malformed_headers(capsys, tmp_path):
    """A .npy of format 3.0 (a UTF-8 header; np.load reads it) is read; a header whose length field
    cuts its dict short, or an unknown format version, is a located error, not an internal one."""
    path = write(tmp_path, NPZ_PROG)
    x, y = np.arange(8, dtype=np.float32), np.arange(4, dtype=np.int32)
    v3 = io.BytesIO()
    np.lib.format.write_array(v3, x, version=(3, 0))
    src = tmp_path / "in.npz"
    _npz(src, {"x.npy": v3.getvalue(), "y.npy": y})
    code, out, err = cli(capsys, "run", path, "--backend", "ref", "--inputs", src, "--json")
    assert code == 0, err
    assert json.loads(out)["outputs"][0]["sum"] == pytest.approx(2 * 28 + 8 * 6)
    good = io.BytesIO()
    np.lib.format.write_array(good, x, version=(1, 0))
    short = bytearray(good.getvalue())
    short[8:10] = (16).to_bytes(2, "little")  # the header's length: 16 bytes, mid-dict
    unknown = bytearray(good.getvalue())
    unknown[6] = 9  # format 9.0
    for member, fragment in ((bytes(short), "has a malformed .npy header"), (bytes(unknown), "not (9, 0)")):
        _npz(src, {"x.npy": member, "y.npy": y})
        code, _, err = cli(capsys, "run", path, "--backend", "ref", "--inputs", src)
        assert code == 1 and f"{path}:" in err and fragment in err and "internal error" not in err, err
