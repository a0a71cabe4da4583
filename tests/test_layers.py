"""The layers of the house import one way only (see README, "How it works").

Every import of every module under spmdlang/ is read from its syntax tree, function-level imports
included. A module may import its own layer or lower ones, never a higher one, and the imports
between modules may form no cycle (no two files importing each other, however indirectly).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "spmdlang"

# module (or package) name prefix -> layer; the longest matching prefix wins
LAYERS = {
    "spmdlang.errors": 0,
    "spmdlang.limits": 0,  # resource limits: imports only errors, inspects the IR by duck typing
    "spmdlang.memo": 0,  # clear_caches: finds the package's memos in sys.modules, imports nothing
    "spmdlang.ir": 1,
    "spmdlang.partition": 2,
    "spmdlang.ops": 3,
    "spmdlang.frontend": 4,
    "spmdlang.backend_ref": 4,
    "spmdlang.backend_jax": 4,
    "spmdlang.inputs": 4,
    "spmdlang.explain": 5,
    "spmdlang.oplist": 5,
    "spmdlang.api": 6,
    "spmdlang.importer": 6,  # from_jax: traces with jax, writes .spmd source, compiles through the API
    "spmdlang.autoshard": 6,  # the search, solvers and rewriting; compiles candidates through the API
    "spmdlang.cli": 7,
    "spmdlang.outfile": 7,
    "spmdlang.__main__": 7,
    "spmdlang": 7,  # the package itself: registers the op table and re-exports the API
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def layer(name: str) -> int:
    """The layer of a module; a new package or top-level module must be given one in LAYERS
    (a sibling pass package such as autodiff/ sits on partition's layer)."""
    found = [k for k in LAYERS if name == k or (k != "spmdlang" and name.startswith(k + "."))]
    assert found, f"{name} has no layer: add it to LAYERS in tests/test_layers.py"
    return LAYERS[max(found, key=len)]


def imports(name: str, path: Path, known) -> set[str]:
    """The spmdlang modules `name` imports anywhere in its file (`from . import x` names x)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in known else mod for a in node.names]
        else:
            continue
        out.update(t for t in targets if t == "spmdlang" or t.startswith("spmdlang."))
    out.discard(name)
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports(name, path, mods) for name, path in mods.items()}


def test_every_module_has_a_layer():
    for name in modules():
        layer(name)
    with pytest.raises(AssertionError, match="has no layer"):
        layer("spmdlang.newpass.walk")


def test_no_upward_import():
    upward = [f"{m} (layer {layer(m)}) imports {t} (layer {layer(t)})"
              for m, targets in graph().items() for t in sorted(targets) if layer(t) > layer(m)]
    assert not upward, "\n".join(upward)


def _cycle(g: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for t in sorted(g.get(m, ())):
            if state.get(t) == 1:
                return stack[stack.index(t):] + [t]
            if t not in state:
                found = visit(t)
                if found:
                    return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(g):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def test_no_import_cycle():
    # a package's __init__ re-exporting its own modules is not a cycle through them
    g = {m: {t for t in ts if not m.startswith(t + ".")} for m, ts in graph().items()}
    cycle = _cycle(g)
    assert cycle is None, " -> ".join(cycle)


def test_the_checker_sees_what_it_must():
    """The walker itself: relative, absolute and function-level imports are all edges."""
    g = graph()
    assert "spmdlang.ir.core" in g["spmdlang.ir.printer"]
    assert "spmdlang.ir.registry" in g["spmdlang.ir.builder"]  # `from . import registry`
    assert "spmdlang.explain" in g["spmdlang.api"]  # imported inside a method
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


MAX_FUNCTION_LINES = 80


def long_functions(source: str, name: str) -> list[str]:
    """`name:function (N lines)` for every function or method of `source` (nested ones too) longer
    than MAX_FUNCTION_LINES, counted from its `def` to its last line."""
    out = []
    for node in ast.walk(ast.parse(source, name)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = node.end_lineno - node.lineno + 1
            if n > MAX_FUNCTION_LINES:
                out.append(f"{name}:{node.lineno} {node.name} ({n} lines)")
    return out


def test_no_function_over_80_lines():
    found = [f for name, path in modules().items() for f in long_functions(path.read_text(), name)]
    assert not found, "split these into named steps:\n" + "\n".join(found)
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    assert long_functions(f"class C:\n    def f(self):\n{'    ' + body.replace(chr(10), chr(10) + '    ')}", "t")
    assert not long_functions(f"def f():\n{body[: body.rindex('    x')]}", "t")
