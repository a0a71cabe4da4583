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
