"""Reports a user reads: `check` (every value's type, sharding and why) and `explain`."""

from __future__ import annotations

from .ir.core import result_names
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
    entries += [(n, r.value, r.span) for n, r in zip(result_names(prog), prog.results)]
    produced = c.spmd.produced
    for name, v, span in entries:
        partial = list(produced[v].partial) if v in produced else []
        rows.append({"name": name, "type": str(v.type), "sharding": str(prop.shardings[v]), "partial": partial,
                     "reason": prop.reason(v, names), "line": span.line if span else None})
    return rows


def check_report(c) -> dict:
    prop = c.propagation
    report = {"mesh": mesh_json(c.mesh), "values": value_rows(c),
              "conflicts": [{"line": op.span.line if op.span else None, "op": op.kind, "message": text}
                            for op, text in prop.conflicts]}
    if c.pass_notes:  # what a compile option (--shard-weight-updates) did
        report["notes"] = [{"line": n.line, "message": n.message} for n in c.pass_notes]
    return report


# Rendering at any width (80 columns, tmux panes): headings are lines of their own, not table titles
# (a title wraps to its table's width); every text is escaped (`[data=2]` is not rich markup); short
# columns never wrap and the free-text column is at least as wide as its longest token, so rich
# breaks lines between tokens, never inside one.


def heading(console, text: str) -> None:
    from rich.text import Text

    console.print(Text(text, style="bold"))


def _table_class():
    """rich's Table, printed without losing a character: a table whose columns do not fit the
    console's width (the terminal's, or COLUMNS when piped: 80 by default) first lets its text
    column fold inside long tokens, then lets every column wrap; rich alone would cut them."""
    from rich.measure import Measurement
    from rich.table import Table

    class WholeTable(Table):
        def _cut(self, console, options) -> bool:
            """Would rich cut a cell: the columns wider than the width (the right edge is cropped),
            or a column that may not wrap narrower than its longest cell? (rich's own layout:
            Table._calculate_column_widths, _extra_width, _get_padding_width.)"""
            room = options.max_width - self._extra_width  # the edges and the separators
            box = self.box
            if box and self.show_edge and any(not col.no_wrap for col in self.columns) and not "".join(
                    getattr(box, f"{k}_right") for k in (
                        "top", "head", "head_row", "mid", "row", "foot_row", "foot", "bottom")).strip():
                # a blank right edge may fall off the line, and a wrapping column gives up the one
                # character rich then takes; with none, rich cuts a cell to fit (autoshard's plans
                # table: "11,286,0…")
                room += 1
            widths = self._calculate_column_widths(console, options.update_width(room))
            if sum(widths) > room:
                return True
            for i, (col, w) in enumerate(zip(self.columns, widths)):
                need = col.min_width or 1  # a wrapping column: rich drops one of width 0
                if col.no_wrap:  # its longest cell, the header too
                    need = max((Measurement.get(console, options, c).maximum for c in (col.header, *col.cells)),
                               default=0)
                if w - self._get_padding_width(i) < need:
                    return True
            return False

        def _would_cut(self, console, options) -> bool:
            try:
                return self._cut(console, options)
            except AttributeError:  # rich's private layout helpers moved: wrap every column
                return True

        def __rich_console__(self, console, options):
            if self._would_cut(console, options):
                for col in self.columns:
                    col.min_width = None
            if self._would_cut(console, options):
                for col in self.columns:
                    col.no_wrap, col.overflow = False, "fold"
            yield from super().__rich_console__(console, options)

    return WholeTable


def table(*columns: str, text_column: str | None = None, texts=()):
    """A Table whose columns keep their tokens whole; `text_column` wraps between words. Where the
    columns cannot fit the width, they wrap (see _table_class): nothing is ever cut."""
    from rich import box

    t = _table_class()(box=box.SIMPLE_HEAD, pad_edge=False)
    longest = max((len(w) for x in texts for w in x.split()), default=1)
    for col in columns:
        if col == text_column:
            t.add_column(col, overflow="fold", min_width=min(longest, 48))
        else:
            t.add_column(col, no_wrap=True)
    return t


def render_check(console, c, report) -> None:
    from rich.markup import escape

    mesh = ", ".join(f"{a}={s}" for a, s in report["mesh"]["axes"].items())
    heading(console, f"{c.program.source.name if c.program.source else ''}  mesh [{mesh}]")
    t = table("name", "type", "sharding", "line", "why", text_column="why",
              texts=[row["reason"] for row in report["values"]])
    for row in report["values"]:
        t.add_row(*(escape(x) for x in (row["name"], row["type"], row["sharding"], str(row["line"] or ""),
                                         row["reason"])))
    console.print(t)
    for conflict in report["conflicts"]:
        console.print(f"[yellow]conflict[/yellow] {escape(conflict['message'])}")
    for note in report.get("notes", ()):
        line = f"line {note['line']}: " if note["line"] else ""
        console.print(f"[cyan]note[/cyan] {escape(line + note['message'])}")


# ---------------------------------------------------------------------------------- explain


def explain_report(c, bandwidth=None, latency=None, preset: str = "tpu-v4") -> dict:
    """The `explain --json` document: values (sharding, pending sums, why), every collective with
    its cause and cost, and per-device totals."""
    from .partition.cost import collective_time_us, flops, ledger_time_us, peak_bytes

    bandwidth, latency = bandwidth or {}, latency or {}
    sp = c.spmd
    collectives = []
    for col in sp.ledger:
        entry = {
            "kind": col.kind, "axes": list(col.axes), "bytes_per_device": int(round(col.bytes_per_device)),
            "line": col.line, "op": col.op, "reason": col.reason,
            "pass": {False: "forward", True: "backward", None: "both"}[col.backward],
            "time_us": round(collective_time_us(col.kind, c.mesh.group_size(col.axes), col.bytes_per_device,
                                                col.axes, bandwidth, latency, preset), 3),
        }
        if col.trip_count != 1:  # inside a loop: listed once, run once per iteration
            entry["trip_count"] = col.trip_count
        collectives.append(entry)
    runs = [x.get("trip_count", 1) for x in collectives]
    total_bytes = sum(x["bytes_per_device"] * n for x, n in zip(collectives, runs))
    return {
        **check_report(c),
        "collectives": collectives,
        "totals": {"collectives": sum(runs), "bytes_per_device": total_bytes,
                   "flops_per_device": flops(sp.program), "peak_bytes_per_device": peak_bytes(sp.program),
                   "comm_time_us": round(ledger_time_us(sp.ledger, c.mesh, preset, bandwidth, latency), 3)},
        "model": {"preset": preset, "bandwidth_gbps": bandwidth, "latency_us": latency},
    }


def render_explain(console, c, report, show=()) -> None:
    from rich.markup import escape

    render_check(console, c, report)
    looped = any("trip_count" in x for x in report["collectives"])
    runs = ("runs",) if looped else ()  # a collective in a loop body runs once per iteration
    # a program that differentiates says which pass each collective belongs to
    passes = any(x["pass"] != "forward" for x in report["collectives"])
    cols = table("line", *(("pass",) if passes else ()), "kind", "axes", *runs, "bytes", "time (us)", "why",
                 text_column="why", texts=[x["reason"] for x in report["collectives"]])
    for x in report["collectives"]:
        n = (f"x{x.get('trip_count', 1)}",) if looped else ()
        cols.add_row(str(x["line"] or ""), *((x["pass"],) if passes else ()), x["kind"], ",".join(x["axes"]), *n,
                     f"{x['bytes_per_device']:,}", f"{x['time_us']:.1f}", escape(x["reason"]))
    if report["collectives"]:
        heading(console, "collectives (per device)")
        console.print(cols)
    else:
        console.print("no collectives: every op runs on local data")
    t = report["totals"]
    if looped:
        console.print("bytes and time are per run; totals count each collective once per loop iteration")
    console.print(f"totals: {t['collectives']} collectives, {t['bytes_per_device']:,} bytes sent per device, "
                  f"~{t['comm_time_us']:.1f} us ({report['model']['preset']} model), "
                  f"{t['flops_per_device']:,} FLOPs per device, peak {t['peak_bytes_per_device']:,} bytes per device")
    for name in show:
        render_layout(console, c, name)


def find_value(c, name: str):
    """The value `--show NAME` means: a source name, `returnN`, or an IR name (`%12` or `12`)."""
    from .errors import SpmdError
    from .ir.printer import Namer

    values = {n: v for n, v, _ in c.canonical.names}
    values.update(dict(zip(result_names(c.canonical), (r.value for r in c.canonical.results))))
    if name in values:
        return values[name]
    raw = {n: v for v, n in Namer.for_program(c.canonical).names.items()}
    if name.lstrip("%") not in raw:
        raise SpmdError(f"--show: no value named '{name}' (named values: {', '.join(values)})")
    return raw[name.lstrip("%")]


def render_layout(console, c, name: str) -> None:
    """Which block of a value each device holds, for any rank: one cell per device of the mesh."""
    from rich import box
    from rich.markup import escape

    from .backend_ref.sim import block_slices

    v = find_value(c, name)
    s = c.propagation.shardings[v]
    mesh = c.mesh
    axes = mesh.names
    rows = mesh.axis_size(axes[0]) if axes else 1
    cols = mesh.size // rows
    heading(console, f"{name}: {v.type} {s} over mesh {mesh}")
    picture = _table_class()(box=box.SQUARE, show_lines=True)
    picture.add_column(escape(axes[0]) if axes else "", no_wrap=True)
    rest = axes[1:]
    for j in range(cols):
        coords = mesh.coords(j)
        picture.add_column(escape(",".join(f"{a}={coords[a]}" for a in rest) or "device"), overflow="fold")
    palette = ["cyan", "magenta", "green", "yellow", "blue", "red", "bright_cyan", "bright_magenta"]
    blocks = {pos: [":" if (a, b) == (0, n) else f"{a}:{b}"
                    for (a, b, _), n in zip(block_slices(v.type.shape, s, mesh, pos), v.type.shape)]
              for pos in range(rows * cols)}
    # blocks written without spaces when a row of them fits the terminal; else wrapped between dims
    widest = max((len(",".join(b)) + 2 for b in blocks.values()), default=0)
    first = max(len(axes[0]) + 3, len(f"{axes[0]}={rows - 1}")) if axes else 0
    labels = max((len(str(col.header)) for col in picture.columns[1:]), default=0)
    sep = "," if first + 3 + cols * (max(widest, labels, 6) + 3) + 1 <= console.width else ", "
    colors: dict = {}
    for i in range(rows):
        cells = [f"{axes[0]}={i}" if axes else ""]
        for j in range(cols):
            pos = i * cols + j
            text = "[" + sep.join(blocks[pos]) + "]"
            color = colors.setdefault(text, palette[len(colors) % len(palette)])
            cells.append(f"[{color}]dev {mesh.devices[pos]}\n{escape(text)}[/{color}]")
        picture.add_row(*cells)
    console.print(picture)


# ---------------------------------------------------------------------------------- diff


def render_diff(console, report) -> None:
    heading(console, f"compared with ref (rtol {report['rtol']}, atol {report['atol']} x scale)")
    t = table("backend", "output", "max abs err", "ok")
    for r in report["results"]:
        ok = "[green]ok[/green]" if r["ok"] else "[red]MISMATCH[/red]"
        if r.get("upstream_disagreement"):
            ok = "[yellow]MISMATCH: upstream disagreement[/yellow]"
        err = "failed to compile" if r.get("error") else f"{r['max_abs_err']:.3g}"
        name = r.get("name", "")
        t.add_row(r["backend"], f"{r['output']} ({name})" if "." in name else str(r["output"]), err, ok)
    console.print(t)
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


# ---------------------------------------------------------------------------------- bench


def render_bench(console, r: dict) -> None:
    mesh = ", ".join(f"{a}={s}" for a, s in r["mesh"].items())
    rounds = r.get("rounds", 1)
    heading(console, f"mesh [{mesh}], {rounds} rounds of {r['repeat']} calls each, ours and XLA in turn")
    t = table("", "ours (shard_map)", "XLA GSPMD")
    t.add_row("median per call", f"{r['ours_s'] * 1e3:.3f} ms", f"{r['xla_s'] * 1e3:.3f} ms")
    if "ours_min_s" in r:
        t.add_row("fastest call", f"{r['ours_min_s'] * 1e3:.3f} ms", f"{r['xla_min_s'] * 1e3:.3f} ms")
    t.add_row("collectives (compiled HLO)", str(r["ours_collectives"]), str(r["xla_collectives"]))
    t.add_row("bytes sent per device", f"{r['ours_bytes_per_device']:,}", f"{r['xla_bytes_per_device']:,}")
    t.add_row("jit compile", f"{r['ours_jit_s']:.2f} s", f"{r['xla_jit_s']:.2f} s")
    console.print(t)
    line = f"ratio ours/XLA = {r['ratio']:.3f}"
    if "ratio_min" in r:
        line += f" (rounds {r['ratio_min']:.3f} .. {r['ratio_max']:.3f}, +-{r['ratio_spread'] * 100:.0f}%)"
        if r["ratio_spread"] > 0.05:
            line += "; spread over 5%: the machine is busy or the program too small to time"
    console.print(line)
    console.print(f"spmdlang compile {r['compile_s'] * 1e3:.1f} ms (afresh from the source: parse .. jax module "
                  "source; jax's jit of it is the 'jit compile' row)")


# ---------------------------------------------------------------------------------- explain --xla


def xla_figures(c, side: str = "jax", seed: int = 0) -> dict:
    """XLA's cost_analysis() and memory_analysis() of one compiled module, per device: side "jax"
    is our per-partition module, "xla" the GSPMD baseline. XLA's peak is argument + output + temp
    - alias bytes: what the compiled program holds at once after fusion and buffer reuse."""
    inputs = c.random_inputs(seed)
    arrays = [inputs[p.name] for p in c.program.params]
    r = c.runner(side)
    m = r.module  # struct parameters go in as nested dicts
    compiled = r.fn.lower(*m.place(m._nest(arrays, m.GLOBAL_SHAPES), r.mesh)).compile()
    cost = compiled.cost_analysis()
    cost = (cost[0] if cost else {}) if isinstance(cost, (list, tuple)) else (cost or {})
    mem = compiled.memory_analysis()
    peak = None
    if mem is not None:
        peak = int(mem.argument_size_in_bytes + mem.output_size_in_bytes + mem.temp_size_in_bytes
                   - mem.alias_size_in_bytes)
    return {"flops_per_device": int(cost.get("flops", 0)),
            "transcendentals_per_device": int(cost.get("transcendentals", 0)),
            "bytes_accessed_per_device": int(cost.get("bytes accessed", 0)),
            "peak_bytes_per_device": peak,
            "temp_bytes_per_device": int(mem.temp_size_in_bytes) if mem is not None else None}


def xla_analysis(c, seed: int = 0) -> dict:
    """XLA's own figures (xla_figures) of our compiled module and of the GSPMD baseline, to show
    beside our estimates; `flops_loop_once_per_device`: our FLOPs with a loop body counted once, as
    XLA's cost_analysis() counts a while loop (present when the program has a loop)."""
    from .ir.core import LOOP
    from .partition.cost import flops

    out = {name: xla_figures(c, side, seed) for side, name in (("jax", "ours"), ("xla", "xla_gspmd"))}
    if any(op.kind == LOOP for op in c.spmd.program.ops):
        out["flops_loop_once_per_device"] = flops(c.spmd.program, per_iteration=False)
    return out


def render_xla(console, report: dict) -> None:
    t, x = report["totals"], report["xla"]
    heading(console, "our estimates beside XLA's own analysis (per device)")
    table_ = table("", "our estimate", "XLA: our module", "XLA: GSPMD baseline")

    def num(v):
        return "-" if v is None else f"{v:,}"

    table_.add_row("FLOPs", num(t["flops_per_device"]), num(x["ours"]["flops_per_device"]),
                   num(x["xla_gspmd"]["flops_per_device"]))
    if "flops_loop_once_per_device" in x:
        table_.add_row("FLOPs, a loop body once", num(x["flops_loop_once_per_device"]), "", "")
    table_.add_row("peak bytes", num(t["peak_bytes_per_device"]), num(x["ours"]["peak_bytes_per_device"]),
                   num(x["xla_gspmd"]["peak_bytes_per_device"]))
    table_.add_row("bytes accessed", "-", num(x["ours"]["bytes_accessed_per_device"]),
                   num(x["xla_gspmd"]["bytes_accessed_per_device"]))
    console.print(table_)
    console.print("FLOPs are counted as XLA's cost_analysis() counts them (a matmul 2*M*N*K, an elementwise op "
                  "1 per element, exp, log, tanh and other transcendentals none); XLA counts a while loop's body "
                  "once, ours once per iteration. Our peak is arguments + outputs + the most the temporaries "
                  "hold at once, after fusion and buffer sharing, as XLA's memory_analysis() counts it "
                  "(docs/cost_model.md).", markup=False)
