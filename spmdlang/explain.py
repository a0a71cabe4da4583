"""Reports a user reads: `check` (every value's type, sharding and why) and `explain`."""

from __future__ import annotations

from .ir.printer import Namer


def mesh_json(mesh) -> dict:
    return {"axes": dict(mesh.axes), "devices": list(mesh.devices)}


def value_rows(c) -> list[dict]:
    """Every named value of the entry function (last assignment wins), then results."""
    prop = c.propagation
    prog = c.program
    names = Namer.for_program(prog).names
    rows = []
    entries = [(name, v, span) for name, v, span in prog.names]
    entries += [(f"return{i}", r.value, r.span) for i, r in enumerate(prog.results)]
    for name, v, span in entries:
        rows.append({"name": name, "type": str(v.type), "sharding": str(prop.shardings[v]), "partial": [],
                     "reason": prop.reason(v, names), "line": span.line if span else None})
    return rows


def check_report(c) -> dict:
    prop = c.propagation
    return {"mesh": mesh_json(c.mesh), "values": value_rows(c),
            "conflicts": [{"line": op.span.line if op.span else None, "op": op.kind, "message": text}
                          for op, text in prop.conflicts]}


def render_check(console, c, report) -> None:
    from rich.table import Table

    mesh = ", ".join(f"{a}={s}" for a, s in report["mesh"]["axes"].items())
    from rich.markup import escape

    table = Table(title=escape(f"{c.program.source.name if c.program.source else ''}  mesh [{mesh}]"),
                  title_justify="left")
    for col in ("name", "type", "sharding", "line", "why"):
        table.add_column(col, overflow="fold")
    for row in report["values"]:
        table.add_row(*(escape(x) for x in (row["name"], row["type"], row["sharding"], str(row["line"] or ""),
                                             row["reason"])))
    console.print(table)
    for conflict in report["conflicts"]:
        console.print(f"[yellow]conflict[/yellow] {escape(conflict['message'])}")
