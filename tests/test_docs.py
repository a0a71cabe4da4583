"""The user docs stay true: every builtin is documented, every `spmd` example on
docs/language.md compiles and gives the reference's numbers on the simulator, and nothing links
outside the repository."""

from __future__ import annotations

import pathlib
import re

import pytest

import spmdlang
from spmdlang.frontend.builtins import BUILTINS

ROOT = pathlib.Path(__file__).resolve().parent.parent
LANGUAGE = (ROOT / "docs" / "language.md").read_text()


def _examples() -> list[str]:
    return re.findall(r"```spmd\n(.*?)```", LANGUAGE, flags=re.S)


def _builtins_section() -> str:
    return LANGUAGE.split("## Builtins", 1)[1]


@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_every_builtin_is_documented_with_an_example(name):
    section = _builtins_section()
    assert re.search(rf"`{name}[`(, ]", section), f"docs/language.md has no table row for builtin '{name}'"
    code = "\n".join(_examples())
    assert re.search(rf"\b{name}\(", code), f"no example on docs/language.md calls '{name}'"


@pytest.mark.parametrize("index", range(len(_examples())))
def test_language_examples_run_and_match_the_reference(index):
    c = spmdlang.compile(_examples()[index], filename=f"docs/language.md example {index}")
    report = c.diff(backends=["ref", "sim"])
    assert report["ok"], report


def test_no_feature_is_left_planned():
    """Every version-2 feature has landed: the reference documents each and lists none as planned."""
    assert "## Planned" not in LANGUAGE and "planned-not-implemented" not in LANGUAGE


def test_loop_is_documented():
    assert any("loop l in range" in e for e in _examples())


def test_docs_never_point_outside_the_repository():
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "spmdlang").rglob("*.py"))]
    for f in files:
        text = f.read_text()
        assert "../shared" not in text and "/work/shared" not in text, f
        if f.suffix != ".md":
            continue
        prose = re.sub(r"`[^`\n]*`", "", re.sub(r"```.*?```", "", text, flags=re.S))  # `f[T](x)` is code, not a link
        for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", prose):
            if "://" in target:
                continue
            assert (f.parent / target).exists(), f"{f.name} links to missing {target}"


# ---------------------------------------------------------------------------------- documented commands
# Every `spmdlang ...` command in the README and docs/*.md: a concrete one (real files, no
# placeholders) is parsed and run, and must succeed; a synopsis (FILE, [--opt N], a|b) must name a
# command and options that exist. `python benchmarks/...` lines name a script that exists and
# options its --help lists. Command blocks are fenced blocks whose first line is a command
# (output excerpts are not), and inline code spans.

DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "README.md"]
_PROMPT = re.compile(r"^(spmdlang|python -m spmdlang|python3? benchmarks/)")


def _strip(line: str) -> str:
    """The command without its trailing comment or description column."""
    line = line.split("#", 1)[0]
    return re.split(r"\s{6,}(?=[a-z(])", line.strip(), maxsplit=1)[0].strip()


def _documented_commands() -> list[tuple[str, str]]:
    out = []
    for f in DOC_FILES:
        text = f.read_text()
        for block in re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S):
            lines = [x.strip() for x in block.splitlines() if x.strip()]
            if not lines or not _PROMPT.match(lines[0].split("&& ")[-1]):
                continue  # not a block of commands: a program, an output excerpt, a table
            for line in lines:
                cmd = line.split("&& ")[-1]  # `python3 -m venv ... && pip install . && spmdlang diff X`
                if _PROMPT.match(cmd):
                    out.append((f.relative_to(ROOT).as_posix(), _strip(cmd)))
        for span in re.findall(r"`((?:spmdlang|python -m spmdlang) [^`]*)`", text):
            out.append((f.relative_to(ROOT).as_posix(), _strip(span)))
    return sorted(set(out))


def _is_synopsis(argv: list[str]) -> bool:
    """A synopsis names placeholders (FILE, N, a|b, [--opt], ...) or only the command."""
    return len(argv) == 1 or any(re.search(r"[\[\]|]|\.\.\.|^[A-Z][A-Z.,_=]*$|^[A-Z]{2,}\.\w+(:[A-Z]+)?$", a)
                                 for a in argv)  # the last: FILE.py:FUNCTION, OUT.spmd


def _subparser(name: str):
    import argparse

    from spmdlang.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices.get(name)


def test_documented_commands_are_found():
    cmds = {c for _, c in _documented_commands()}
    assert "spmdlang diff programs/mlp.spmd" in cmds  # the README's first command
    assert "spmdlang bench programs/train_mlp.spmd" in cmds  # the tour
    assert "spmdlang check FILE" in cmds and not any("138.1 ms" in c for c in cmds)  # not an output line


@pytest.mark.parametrize("where, command", [c for c in _documented_commands() if not c[1].startswith("python")])
def test_documented_spmdlang_command(where, command, tmp_path, monkeypatch, capsys):
    import shlex

    from spmdlang.cli import main

    argv = shlex.split(command.replace("python -m spmdlang", "spmdlang"))[1:]
    if argv and argv[0] in ("--help", "--version"):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 0
        return
    if argv[0] == "COMMAND":
        return
    parser = _subparser(argv[0])
    assert parser is not None, f"{where}: `{command}` names no command"
    if _is_synopsis(argv):
        for opt in (a.split("=")[0].strip("[]") for a in argv[1:]):
            if opt.startswith("-"):
                assert opt in parser._option_string_actions, f"{where}: `{command}`: {argv[0]} has no {opt}"
        return
    monkeypatch.chdir(ROOT)
    if "-o" in argv:
        argv[argv.index("-o") + 1] = str(tmp_path / pathlib.Path(argv[argv.index("-o") + 1]).name)
    if "--processes" in argv:  # local processes with a coordinator: tests/test_jax_module.py runs them
        parser.parse_args(argv[1:])
        return
    if argv[0] == "bench":  # a real run, with fewer timed calls
        argv += ["--repeat", "2", "--rounds", "1"]
    code = main(argv)
    err = capsys.readouterr().err
    missing = re.search(r"raised ModuleNotFoundError: No module named '([\w.]+)'", err)
    if code and argv[0] == "import" and missing:  # the example model's own dependency (flax, optax)
        pytest.skip(f"{where}: `{command}` needs {missing.group(1)}, which is not installed")
    assert code == 0, f"{where}: `{command}` failed:\n{err}"


@pytest.mark.parametrize("where, command", [c for c in _documented_commands() if c[1].startswith("python")])
def test_documented_benchmark_command(where, command):
    import shlex
    import subprocess
    import sys

    argv = shlex.split(command)
    script = ROOT / argv[1]
    assert script.is_file(), f"{where}: `{command}`: no {argv[1]}"
    helptext = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, cwd=ROOT,
                              timeout=120).stdout
    for opt in (a.strip("[]") for a in argv[2:] if a.strip("[]").startswith("--")):
        assert opt in helptext, f"{where}: `{command}`: {argv[1]} has no {opt}"


def test_ci_installs_and_tests_as_the_readme_says():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert 'pip install ".[test]" && python -m pytest' in readme
    assert re.search(r'pip install (-q )?"\.\[test\]"\n', ci) and ci.rstrip().endswith("python -m pytest")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_links_to_sections_name_existing_headings():
    for f in DOC_FILES:
        for target, anchor in re.findall(r"\]\(([^)#]*\.md)#([^)]+)\)", f.read_text()):
            doc = (f.parent / target).read_text()
            slugs = {_slug(h) for h in re.findall(r"^#+ (.*)$", doc, flags=re.M)}
            assert anchor in slugs, f"{f.name} links to {target}#{anchor}, which has no such heading"
