"""`spmdlang bench`: our shard_map module against the XLA-GSPMD baseline, same mesh, same inputs.

Each side is jitted and compiled once (compile time recorded), warmed up, then timed `repeat`
times; we report medians. The collectives and bytes of each side come from its compiled HLO
(backend_jax.hlo), so they are what XLA really runs, not what either compiler meant to emit.
"""

from __future__ import annotations

import statistics
import time


def _time_calls(fn, args, repeat: int, warmup: int = 3) -> list[float]:
    import jax

    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t)
    return times


def measure(c, seed: int = 0, repeat: int = 20, progress=None) -> dict:
    """Time and inspect both sides; `progress(step_text)` is called as the work advances."""
    from .hlo import collectives

    step = progress or (lambda text: None)
    t0 = time.perf_counter()
    _ = c.jax_source  # our compiler, end to end: parse .. per-partition program .. python source
    compile_s = time.perf_counter() - t0
    inputs = c.random_inputs(seed)
    arrays = [inputs[p.name] for p in c.program.params]
    out = {"compile_s": compile_s}
    for side in ("jax", "xla"):
        name = "ours" if side == "jax" else "xla"
        step(f"jit-compiling {name}")
        runner = c.runner(side)
        args = runner.module.place(arrays, runner.mesh)
        t = time.perf_counter()
        compiled = runner.fn.lower(*args).compile()
        out[f"{name}_jit_s"] = time.perf_counter() - t
        cols = collectives(compiled.as_text())
        out[f"{name}_collectives"] = len(cols)
        out[f"{name}_bytes_per_device"] = int(sum(x["bytes_per_device"] for x in cols))
        out[f"{name}_collective_kinds"] = sorted({x["kind"] for x in cols})
        step(f"timing {name}")
        times = _time_calls(compiled, args, repeat)
        out[f"{name}_s"] = statistics.median(times)
    out["ratio"] = out["ours_s"] / out["xla_s"] if out["xla_s"] else float("nan")
    out["ledger_collectives"] = len(c.spmd.ledger)
    out["mesh"] = dict(c.mesh.axes)
    out["repeat"] = repeat
    return out


def bench(c, seed: int = 0, repeat: int = 20, progress: bool = True) -> dict:
    """Run `measure` with a progress display on stderr (none when `progress` is False)."""
    if not progress:
        return measure(c, seed, repeat)
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("compiling", total=None)
        return measure(c, seed, repeat, lambda text: bar.update(task, description=text))


def render_bench(console, r: dict) -> None:
    from ..explain import heading
    from ..explain import table as make_table

    mesh = ", ".join(f"{a}={s}" for a, s in r["mesh"].items())
    heading(console, f"mesh [{mesh}], median of {r['repeat']} runs after warm-up")
    table = make_table("", "ours (shard_map)", "XLA GSPMD")
    table.add_row("time per call", f"{r['ours_s'] * 1e3:.3f} ms", f"{r['xla_s'] * 1e3:.3f} ms")
    table.add_row("collectives (compiled HLO)", str(r["ours_collectives"]), str(r["xla_collectives"]))
    table.add_row("bytes sent per device", f"{r['ours_bytes_per_device']:,}", f"{r['xla_bytes_per_device']:,}")
    table.add_row("jit compile", f"{r['ours_jit_s']:.2f} s", f"{r['xla_jit_s']:.2f} s")
    console.print(table)
    console.print(f"ratio ours/XLA = {r['ratio']:.3f}; spmdlang compile {r['compile_s'] * 1e3:.1f} ms")
