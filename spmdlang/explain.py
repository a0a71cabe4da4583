"""Reports a user reads: `check` (every value's type, sharding and why) and `explain`."""

from __future__ import annotations

from .ir.printer import Namer


def mesh_json(mesh) -> dict:
    return {"axes": dict(mesh.axes), "devices": list(mesh.devices)}


def value_rows(c) -> list[dict]:
    """Every named value of the entry function (last assignment wins), then results."""
    prop = c.propagation
    prog = c.canonical  # names and results follow the values propagation saw (after CSE)
    names = Namer.for_program(prog).names
    rows = []
    entries = [(name, v, span) for name, v, span in prog.names]
    entries += [(f"return{i}", r.value, r.span) for i, r in enumerate(prog.results)]
    produced = c.spmd.produced
    for name, v, span in entries:
        partial = list(produced[v].partial) if v in produced else []
        rows.append({"name": name, "type": str(v.type), "sharding": str(prop.shardings[v]), "partial": partial,
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


# ---------------------------------------------------------------------------------- explain


def explain_report(c, bandwidth=None, latency=None, preset: str = "tpu-v4") -> dict:
    """The `explain --json` document: values (sharding, pending sums, why), every collective with
    its cause and cost, and per-device totals."""
    from .partition.cost import collective_time_us, flops, peak_bytes

    bandwidth, latency = bandwidth or {}, latency or {}
    sp = c.spmd
    collectives = []
    for col in sp.ledger:
        collectives.append({
            "kind": col.kind, "axes": list(col.axes), "bytes_per_device": int(round(col.bytes_per_device)),
            "line": col.line, "op": col.op, "reason": col.reason,
            "time_us": round(collective_time_us(col.bytes_per_device, col.axes, bandwidth, latency, preset), 3),
        })
    total_bytes = sum(x["bytes_per_device"] for x in collectives)
    return {
        **check_report(c),
        "collectives": collectives,
        "totals": {"collectives": len(collectives), "bytes_per_device": total_bytes,
                   "flops_per_device": flops(sp.program), "peak_bytes_per_device": peak_bytes(sp.program),
                   "comm_time_us": round(sum(x["time_us"] for x in collectives), 3)},
        "model": {"preset": preset, "bandwidth_gbps": bandwidth, "latency_us": latency},
    }


def render_explain(console, c, report, show=()) -> None:
    from rich.markup import escape
    from rich.table import Table

    render_check(console, c, report)
    table = Table(title="collectives (per device)", title_justify="left")
    for col in ("line", "kind", "axes", "bytes", "time (us)", "why"):
        table.add_column(col, overflow="fold")
    for x in report["collectives"]:
        table.add_row(str(x["line"] or ""), x["kind"], ",".join(x["axes"]), f"{x['bytes_per_device']:,}",
                      f"{x['time_us']:.1f}", escape(x["reason"]))
    if report["collectives"]:
        console.print(table)
    else:
        console.print("no collectives: every op runs on local data")
    t = report["totals"]
    console.print(f"totals: {t['collectives']} collectives, {t['bytes_per_device']:,} bytes sent per device, "
                  f"~{t['comm_time_us']:.1f} us ({report['model']['preset']} model), "
                  f"{t['flops_per_device']:,} FLOPs per device, peak {t['peak_bytes_per_device']:,} bytes per device")
    for name in show:
        render_layout(console, c, name)


def render_layout(console, c, name: str) -> None:
    """Which block of a value each device holds, for any rank: one cell per device of the mesh."""
    from rich.markup import escape
    from rich.table import Table

    from .backend_ref.sim import block_slices
    from .errors import SpmdError
    from .ir.printer import Namer

    values = {n: v for n, v, _ in c.canonical.names}
    values.update({f"return{i}": r.value for i, r in enumerate(c.canonical.results)})
    if name not in values:
        raw = {n: v for v, n in Namer.for_program(c.canonical).names.items()}
        if name.lstrip("%") not in raw:
            raise SpmdError(f"--show: no value named '{name}' (named values: {', '.join(values)})")
        values[name] = raw[name.lstrip("%")]
    v = values[name]
    s = c.propagation.shardings[v]
    mesh = c.mesh
    axes = mesh.names
    rows = mesh.axis_size(axes[0]) if axes else 1
    cols = mesh.size // rows
    table = Table(title=f"{name}: {v.type} {s} over mesh {mesh}", title_justify="left", show_lines=True)
    table.add_column(axes[0] if axes else "")
    rest = axes[1:]
    for j in range(cols):
        coords = mesh.coords(j)
        table.add_column(",".join(f"{a}={coords[a]}" for a in rest) or "device")
    palette = ["cyan", "magenta", "green", "yellow", "blue", "red", "bright_cyan", "bright_magenta"]
    colors: dict = {}
    for i in range(rows):
        cells = [f"{axes[0]}={i}" if axes else ""]
        for j in range(cols):
            pos = i * cols + j
            blocks = block_slices(v.type.shape, s, mesh, pos)
            text = "[" + ", ".join(":" if (a, b) == (0, n) else f"{a}:{b}"
                                   for (a, b, _), n in zip(blocks, v.type.shape)) + "]"
            color = colors.setdefault(text, palette[len(colors) % len(palette)])
            cells.append(f"[{color}]dev {mesh.devices[pos]}\n{escape(text)}[/{color}]")
        table.add_row(*cells)
    console.print(table)


# ---------------------------------------------------------------------------------- diff


def render_diff(console, report) -> None:
    from rich.table import Table

    table = Table(title=f"compared with ref (rtol {report['rtol']}, atol {report['atol']} x scale)",
                  title_justify="left")
    for col in ("backend", "output", "max abs err", "ok"):
        table.add_column(col)
    for r in report["results"]:
        ok = "[green]ok[/green]" if r["ok"] else "[red]MISMATCH[/red]"
        if r.get("upstream_disagreement"):
            ok = "[yellow]MISMATCH: upstream disagreement[/yellow]"
        err = "failed to compile" if r.get("error") else f"{r['max_abs_err']:.3g}"
        table.add_row(r["backend"], str(r["output"]), err, ok)
    console.print(table)
    for r in {r["backend"]: r for r in report["results"] if r.get("error")}.values():
        console.print(f"{r['backend']}: {r['error']}", markup=False)
    if report["ok"]:
        console.print("[green]all backends agree[/green]")
        return
    console.print("[red]backends disagree[/red]")
    upstream = report.get("upstream_disagreement") or []
    if upstream:
        ours = [b for b in report["backends"] if b not in ("ref", *upstream)]
        console.print(
            f"{', '.join(upstream)} (XLA's own GSPMD partitioner, the baseline) disagrees with ref while ours "
            f"({', '.join(ours)}) agree: an upstream disagreement, not a bug of spmdlang's partitioning. "
            f"Known XLA issues: {report.get('known_issues', 'docs/known_xla_issues.md')} in the spmdlang "
            f"repository. To compare only our backends: --backends ref,sim,jax", markup=False)
