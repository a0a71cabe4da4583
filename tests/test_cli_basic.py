"""The `spmdlang` command: compile and run on the ref backend, exit statuses, error output.

Most tests call spmdlang.cli.main in-process (fast); a few go through `python -m spmdlang` to see
exactly what a user sees: exit status, stdout and stderr, never a traceback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import spmdlang
from spmdlang.cli import main

PROG = """mesh [x=2]
const B = 4
# a small two-result program
func main(a: f32[B, 3] {x, _}, ids: i32[3]) -> (f32[B, 3], i32[]) {
  h = a * 2 + 1
  return h, sum(ids)
}
"""

BAD = """mesh [x=2]
func main(a: f32[4]) -> f32[4] {
  return a + nope
}
"""


@pytest.fixture
def prog(tmp_path):
    p = tmp_path / "prog.spmd"
    p.write_text(PROG)
    return p


@pytest.fixture
def bad(tmp_path):
    p = tmp_path / "bad.spmd"
    p.write_text(BAD)
    return p


def cli(capsys, *args) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def spmdlang_cmd(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "spmdlang", *map(str, args)], capture_output=True, text=True, cwd=cwd
    )


# ---------------------------------------------------------------------------------- compile


def test_compile_ir_prints_ir(capsys, prog):
    code, out, err = cli(capsys, "compile", prog, "--target", "ir")
    assert code == 0 and err == ""
    assert out == spmdlang.compile(str(prog)).ir
    assert out.startswith("# global program, mesh [x=2]\nfunc @main(%a: f32[4, 3] {x, _}, %ids: i32[3])")


def test_compile_output_file(capsys, prog, tmp_path):
    dest = tmp_path / "out.ir"
    code, out, err = cli(capsys, "compile", prog, "--target", "ir", "-o", dest)
    assert code == 0 and out == "" and err == ""
    assert dest.read_text() == spmdlang.compile(str(prog)).ir


def test_compile_error_writes_nothing(capsys, bad, tmp_path):
    dest = tmp_path / "out.ir"
    code, out, err = cli(capsys, "compile", bad, "--target", "ir", "-o", dest)
    assert code == 1 and out == ""
    assert not dest.exists()
    assert sorted(os.listdir(tmp_path)) == ["bad.spmd"]  # no temp file left behind either


def test_compile_error_keeps_existing_output(capsys, bad, tmp_path):
    dest = tmp_path / "out.ir"
    dest.write_text("previous")
    code, _, _ = cli(capsys, "compile", bad, "--target", "ir", "-o", dest)
    assert code == 1 and dest.read_text() == "previous"


def test_compile_json(capsys, prog, tmp_path):
    code, out, _ = cli(capsys, "compile", prog, "--target", "ir", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["target"] == "ir" and data["text"] == spmdlang.compile(str(prog)).ir
    dest = tmp_path / "x.ir"
    code, out, _ = cli(capsys, "compile", prog, "--target", "ir", "--json", "-o", dest)
    assert code == 0 and json.loads(out) == {"target": "ir", "output": str(dest)}
    assert dest.exists()


def test_compile_with_overrides(capsys, prog):
    code, out, _ = cli(capsys, "compile", prog, "--target", "ir", "--mesh", "x=4", "--set", "B=6")
    assert code == 0
    assert out.splitlines()[0] == "# global program, mesh [x=4]"
    assert "%a: f32[6, 3] {x, _}" in out


def test_compile_entry(capsys, tmp_path):
    p = tmp_path / "two.spmd"
    p.write_text(
        "mesh [x=2]\nfunc f(a: f32[2]) -> f32[2] { return a }\nfunc g(a: f32[2]) -> f32[2] { return -a }\n"
    )
    code, _, err = cli(capsys, "compile", p, "--target", "ir")
    assert code == 1 and "none is 'main'" in err
    code, out, _ = cli(capsys, "compile", p, "--target", "ir", "--entry", "g")
    assert code == 0 and "func @g(" in out and "neg(" in out


# ---------------------------------------------------------------------------------- run


def test_run_writes_outputs(capsys, prog, tmp_path):
    dest = tmp_path / "out.npz"
    code, out, err = cli(capsys, "run", prog, "--backend", "ref", "-o", dest)
    assert code == 0 and err == ""
    assert "out0" in out and "out1" in out
    c = spmdlang.compile(str(prog))
    want = c.run(c.random_inputs(0))
    with np.load(dest) as got:
        assert sorted(got.files) == ["out0", "out1"]
        np.testing.assert_array_equal(got["out0"], want[0])
        np.testing.assert_array_equal(got["out1"], want[1])
        assert got["out0"].dtype == np.float32 and got["out1"].dtype == np.int32


def test_run_inputs_round_trip(capsys, prog, tmp_path):
    a = np.arange(12, dtype=np.float32).reshape(4, 3)
    ids = np.array([3, -1, 7], np.int32)
    src = tmp_path / "in.npz"
    np.savez(src, a=a, ids=ids)
    dest = tmp_path / "out.npz"
    code, _, err = cli(capsys, "run", prog, "--backend", "ref", "--inputs", src, "-o", dest)
    assert code == 0, err
    with np.load(dest) as got:
        np.testing.assert_array_equal(got["out0"], a * 2 + 1)
        assert got["out1"] == 9


def test_run_seed(capsys, prog, tmp_path):
    outs = []
    for seed in ("0", "3", "3"):
        dest = tmp_path / f"out{seed}.npz"
        assert cli(capsys, "run", prog, "--backend", "ref", "--seed", seed, "-o", dest)[0] == 0
        with np.load(dest) as got:
            outs.append(got["out0"])
    assert not np.array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[1], outs[2])
    c = spmdlang.compile(str(prog))
    np.testing.assert_array_equal(outs[1], c.random_inputs(3)["a"] * 2 + 1)


def test_run_json_is_the_only_stdout(capsys, prog, tmp_path):
    code, out, _ = cli(capsys, "run", prog, "--backend", "ref", "--json")
    assert code == 0
    data = json.loads(out)  # the whole of stdout is one JSON document
    assert data["backend"] == "ref"
    assert [o["shape"] for o in data["outputs"]] == [[4, 3], []]
    assert [o["type"] for o in data["outputs"]] == ["f32[4, 3]", "i32[]"]
    dest = tmp_path / "o.npz"
    code, out, _ = cli(capsys, "run", prog, "--backend", "ref", "--json", "-o", dest)
    assert code == 0 and json.loads(out)["file"] == str(dest)


def test_run_with_set(capsys, prog, tmp_path):
    dest = tmp_path / "out.npz"
    assert cli(capsys, "run", prog, "--backend", "ref", "--set", "B=6", "-o", dest)[0] == 0
    with np.load(dest) as got:
        assert got["out0"].shape == (6, 3)


def test_run_error_writes_nothing(capsys, bad, tmp_path):
    dest = tmp_path / "out.npz"
    code, out, err = cli(capsys, "run", bad, "--backend", "ref", "-o", dest)
    assert code == 1 and out == "" and not dest.exists()


def test_run_bad_inputs_write_nothing(capsys, prog, tmp_path):
    src = tmp_path / "in.npz"
    np.savez(src, a=np.ones((4, 3), np.float32))
    dest = tmp_path / "out.npz"
    code, out, err = cli(capsys, "run", prog, "--backend", "ref", "--inputs", src, "-o", dest)
    assert code == 1 and not dest.exists()
    assert f"{prog}:4:32: error: " in err and "'ids'" in err


# ---------------------------------------------------------------------------------- what the user sees


def test_program_error_output(bad):
    r = spmdlang_cmd("compile", bad, "--target", "ir")
    assert r.returncode == 1
    assert r.stdout == ""
    lines = r.stderr.splitlines()
    assert lines[0] == f"{bad}:3:14: error: unknown name 'nope'"
    assert lines[1] == "  return a + nope"
    assert lines[2] == " " * 13 + "^~~~"
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize(
    "content", [b"", b"\x00\x01\x02binary", b"mesh [x=2]\nfunc main(a: f32[2]) -> f32[2] {"]
)
def test_bad_files_exit_1(tmp_path, content):
    p = tmp_path / "f.spmd"
    p.write_bytes(content)
    r = spmdlang_cmd("run", p, "--backend", "ref")
    assert r.returncode == 1
    assert r.stderr.startswith(f"{p}:") and ": error: " in r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""


def test_help_exits_0():
    r = spmdlang_cmd("--help")
    assert r.returncode == 0 and "compile" in r.stdout and "run" in r.stdout


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["frobnicate", "{prog}"],
        ["compile", "{prog}"],
        ["compile", "{prog}", "--target", "llvm"],
        ["compile", "--target", "ir"],
        ["run", "{prog}"],
        ["run", "{prog}", "--backend", "gpu"],
        ["run", "{prog}", "--backend", "ref", "--seed", "abc"],
        ["compile", "{prog}", "--target", "ir", "--mesh", "x"],
        ["compile", "{prog}", "--target", "ir", "--mesh", "x=0"],
        ["compile", "{prog}", "--target", "ir", "--mesh", "x=2,x=4"],
        ["compile", "{prog}", "--target", "ir", "--set", "B=four"],
        ["compile", "{prog}", "--target", "ir", "--mesh", "data=2"],
        ["compile", "{prog}", "--target", "ir", "--set", "C=2"],
        ["compile", "{missing}", "--target", "ir"],
        ["compile", "{dir}", "--target", "ir"],
        ["compile", "{prog}", "--target", "ir", "-o", "{dir}/no/such/dir/out.ir"],
        ["run", "{prog}", "--backend", "ref", "--bogus"],
    ],
)
def test_command_line_misuse_exits_2(capsys, prog, tmp_path, args):
    fill = {"prog": str(prog), "missing": str(tmp_path / "missing.spmd"), "dir": str(tmp_path)}
    try:
        code = main([a.format(**fill) for a in args])
    except SystemExit as e:  # argparse's own errors
        code = e.code
    out, err = capsys.readouterr()
    assert code == 2, (args, out, err)
    assert err and "Traceback" not in err
    assert not os.path.exists(tmp_path / "no")


def test_command_line_misuse_from_the_shell(prog):
    r = spmdlang_cmd("compile", prog, "--target", "ir", "--mesh", "x=two")
    assert r.returncode == 2 and "--mesh expects NAME=INT" in r.stderr and r.stdout == ""
    r = spmdlang_cmd("run", prog, "--backend", "ref", "--set", "Q=1")
    assert r.returncode == 2 and "--set names const 'Q'" in r.stderr and "Traceback" not in r.stderr


def test_override_error_in_process(capsys, prog):
    code, out, err = cli(capsys, "compile", prog, "--target", "ir", "--mesh", "y=2")
    assert code == 2 and out == ""
    assert "--mesh names axis 'y', which the mesh does not have (axes: x)" in err


def test_module_entry_point_matches_main(prog):
    r = spmdlang_cmd("compile", prog, "--target", "ir")
    assert r.returncode == 0 and r.stdout == spmdlang.compile(str(prog)).ir and r.stderr == ""
