"""What a new user meets first on the command line: --version, help on every option, `-` for
stdin, bad --mesh/--set as command-line errors naming the flag, --show checked before output."""

from __future__ import annotations

import argparse
import io
import subprocess
import sys
from pathlib import Path

import pytest

import spmdlang
from spmdlang.cli import build_parser, main

ROOT = Path(__file__).resolve().parent.parent
MLP = str(ROOT / "programs" / "mlp.spmd")
SMALL = "mesh [x=2]\nconst N = 4\nfunc main(a: f32[N] {x}) -> f32[N] { return a * 2.0 }\n"


def run_cli(capsys, *argv, stdin: str | None = None, monkeypatch=None):
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin.encode())))
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"spmdlang {spmdlang.__version__}"


def _subparsers(parser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices
    return {}


def test_every_option_of_every_command_has_help():
    parser = build_parser()
    commands = _subparsers(parser)
    assert set(commands) >= {"check", "compile", "run", "diff", "explain", "bench"}
    for name, sub in commands.items():
        for action in sub._actions:
            assert action.help and action.help != argparse.SUPPRESS, f"{name} {action.option_strings or action.dest}"


def test_help_points_at_docs_in_the_repository():
    text = build_parser().format_help()
    assert "docs/language.md" in text and "docs/cli.md" in text and "shared" not in text
    for doc in ("docs/language.md", "docs/cli.md"):
        assert (ROOT / doc).exists()


def test_dash_reads_the_program_from_stdin(capsys, monkeypatch):
    code, out, err = run_cli(capsys, "run", "-", "--backend", "ref", "--json", stdin=SMALL, monkeypatch=monkeypatch)
    assert code == 0, err
    assert '"backend": "ref"' in out


def test_stdin_errors_name_stdin(capsys, monkeypatch):
    code, _, err = run_cli(capsys, "check", "-", stdin=SMALL.replace("a * 2.0", "a * b"), monkeypatch=monkeypatch)
    assert code == 1 and err.startswith("<stdin>:3:") and "unknown name 'b'" in err
    code, _, err = run_cli(capsys, "check", "-", stdin="", monkeypatch=monkeypatch)
    assert code == 1 and err.startswith("<stdin>:1:1: error:") and "empty" in err


def test_stdin_through_the_real_command():
    r = subprocess.run([sys.executable, "-m", "spmdlang", "check", "-", "--json"], input=SMALL,
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert '"sharding": "{x}"' in r.stdout


@pytest.mark.parametrize("argv, flag, fragment", [
    (["--mesh", "dat=2"], "--mesh", "names axis 'dat'"),
    (["--set", "Q=3"], "--set", "names const 'Q'"),
    (["--mesh", "data"], "--mesh", "expects NAME=INT"),
    (["--mesh", "data=0"], "--mesh", "positive"),
    (["--set", "B=x"], "--set", "expects NAME=INT"),
    (["--set", "B=1__0"], "--set", "expects NAME=INT"),
])
def test_bad_mesh_or_set_is_a_command_line_error_naming_the_flag(argv, flag, fragment, capsys):
    try:
        code = main(["check", MLP, *argv])
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    assert code == 2
    assert (f"error: argument {flag}:" in err or f"error: {flag} " in err) and fragment in err
    assert "^" not in err and "Traceback" not in err


def test_set_takes_an_integer_with_underscores(capsys):
    """--set B=1_000 is the integer 1000, as Python writes it (it was read as the float 1000.0 and
    refused for an integer const)."""
    code, out, err = run_cli(capsys, "check", MLP, "--set", "B=1_000", "--json")
    assert code == 0, err


def test_explain_show_checks_the_name_before_printing(capsys):
    code, out, err = run_cli(capsys, "explain", MLP, "--show", "h", "--show", "nosuch")
    assert code == 2 and out == ""
    assert "no value named 'nosuch'" in err


def test_sharding_repr_is_the_spec():
    c = spmdlang.compile(MLP)
    assert repr(c.shardings["h"]) == "Sharding {data, model}"
    assert str(c.shardings["h"]) == "{data, model}"


def test_explain_xla_shows_xlas_own_analysis_beside_ours(capsys):
    import json

    code, out, err = run_cli(capsys, "explain", MLP, "--xla", "--json")
    assert code == 0, err
    d = json.loads(out)
    ours, xla = d["xla"]["ours"], d["xla"]["xla_gspmd"]
    assert ours["flops_per_device"] > 0 and ours["peak_bytes_per_device"] > 0 and xla["peak_bytes_per_device"] > 0
    # the FLOP and memory models count what XLA counts (tests/test_explain_xla.py: every program)
    assert abs(d["totals"]["flops_per_device"] / ours["flops_per_device"] - 1) < 0.15
    assert abs(d["totals"]["peak_bytes_per_device"] / ours["peak_bytes_per_device"] - 1) < 0.15
    code, out, _ = run_cli(capsys, "explain", MLP, "--set", "B=8,D=16,F=32", "--xla")
    assert code == 0 and "XLA: our module" in out and "memory_analysis()" in out and "transcendentals" in out
