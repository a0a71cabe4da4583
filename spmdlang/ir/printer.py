"""Deterministic IR text, one op per line (HLO-like), for `compile --target ir|spmd` and goldens."""

from __future__ import annotations

from .core import Program, Value
from .mesh import Sharding


class Namer:
    """Stable printable names: source names where known (`%h`, `%h.1` on reuse), else `%0, %1...`."""

    def __init__(self):
        self.names: dict[Value, str] = {}
        self.taken: dict[str, int] = {}
        self.temps = 0

    @staticmethod
    def for_program(prog: Program) -> Namer:
        """Names in program order, so they match the printed IR."""
        n = Namer()
        for v in prog.values():
            n(v)
        return n

    def __call__(self, v: Value) -> str:
        if v not in self.names:
            if v.name:
                n = self.taken.get(v.name, 0)
                self.taken[v.name] = n + 1
                base = v.name if n == 0 else f"{v.name}.{n}"
                while base in self.taken and n:
                    n += 1
                    base = f"{v.name}.{n}"
                self.names[v] = base
            else:
                self.names[v] = str(self.temps)
                self.temps += 1
        return self.names[v]


def format_attr(value) -> str:
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Sharding):
        return str(value)
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(format_attr(v) for v in value) + "]"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def format_attrs(attrs) -> str:
    if not attrs:
        return ""
    return " {" + ", ".join(f"{k}={format_attr(v)}" for k, v in sorted(attrs.items())) + "}"


def print_program(prog: Program, shardings: dict[Value, Sharding] | None = None,
                  notes: dict | None = None) -> str:
    """The program as text. `shardings` adds each value's sharding; `notes` a comment per op."""
    name = Namer.for_program(prog)

    def shard(v):
        return f" {shardings[v]}" if shardings and v in shardings else ""

    params = []
    for p in prog.params:
        spec = f" {p.sharding}" if p.sharding is not None and not shardings else shard(p.value)
        params.append(f"%{name(p.value)}: {p.value.type}{spec}")
    results = []
    for r in prog.results:
        spec = f" {r.sharding}" if r.sharding is not None else ""
        results.append(f"{r.value.type}{spec}")
    kind = "local" if prog.local else "global"
    lines = [f"# {kind} program, mesh {prog.mesh}"]
    lines.append(f"func @{prog.name}({', '.join(params)}) -> ({', '.join(results)}) {{")
    _print_ops(prog.ops, lines, "  ", name, shard, notes)
    lines.append("  return " + ", ".join(f"%{name(r.value)}" for r in prog.results))
    lines.append("}")
    return "\n".join(lines) + "\n"


def _print_ops(ops, lines, indent, name, shard, notes) -> None:
    for op in ops:
        lhs = ", ".join(f"%{name(r)}" for r in op.results)
        rhs = f"{op.kind}({', '.join('%' + name(v) for v in op.operands)}){format_attrs(op.attrs)}"
        types = ", ".join(f"{r.type}{shard(r)}" for r in op.results)
        comment = []
        if op.span is not None:
            comment.append(f"line {op.span.line}")
        if op.backward:
            comment.append("backward")
        if notes and op in notes:
            comment.append(notes[op])
        tail = f"  # {'; '.join(comment)}" if comment else ""
        lines.append(f"{indent}{lhs} = {rhs} : {types}{tail}")
        for region in op.regions:
            # a loop body: (index, carries..., captures...) -> the next carries
            params = ", ".join(f"%{name(v)}: {v.type}{shard(v)}" for v in region.params)
            lines.append(f"{indent}  body({params}) {{")
            _print_ops(region.ops, lines, indent + "    ", name, shard, notes)
            lines.append(f"{indent}    yield " + ", ".join(f"%{name(v)}" for v in region.results))
            lines.append(f"{indent}  }}")
