"""`spmdlang bench`: our shard_map module against the XLA-GSPMD baseline, same mesh, same inputs.

Our compile time (`compile_s`) is one fresh compile from the source text (fresh_compile_s). Each
side is jitted and compiled once (`ours_jit_s`, `xla_jit_s`) and warmed up. Then the two are timed
call by call in turn (ours, XLA, ours, XLA, ...) for `rounds` rounds of `repeat` calls each, so a
change in machine load hits both sides alike. We report, per side, the minimum and the median
call time over all calls, and the ours/XLA ratio of the medians with its spread: the lowest and
highest ratio among the rounds (each round's median against the same round's median). The
collectives and bytes of each side come from its compiled HLO (backend_jax.hlo), so they are what
XLA really runs, not what either compiler meant to emit.
"""

from __future__ import annotations

import statistics
import time


def _interleaved(fns, args, repeat: int, rounds: int, warmup: int = 3) -> list[list[list[float]]]:
    """times[side][round] = the call times of side `side` in that round, sides taking turns."""
    import jax

    for fn, a in zip(fns, args):
        for _ in range(warmup):
            jax.block_until_ready(fn(*a))
    times = [[[] for _ in range(rounds)] for _ in fns]
    for r in range(rounds):
        for _ in range(repeat):
            for side, (fn, a) in enumerate(zip(fns, args)):
                t = time.perf_counter()
                jax.block_until_ready(fn(*a))
                times[side][r].append(time.perf_counter() - t)
    return times


COMPILE_INCLUDES = ("spmdlang's compile from the source text, afresh (no memo of an earlier compile): "
                    "parse, lower, simplify, propagate, partition, finish (combine) and emit the jax "
                    "module's source; not jax's jit of it (ours_jit_s)")


def fresh_compile_s(c) -> float:
    """Seconds our compiler takes on `c`'s program from scratch, as COMPILE_INCLUDES says: a new
    compile of the same source and options (c.recompiled(); a Compiled caches every stage, so
    timing `c` itself would time a cache), with the memos of earlier compiles in this process
    forgotten (memo.clear_caches). Imports are warmed first, by `c`'s own stages."""
    from ..memo import clear_caches

    _ = c.jax_source
    clear_caches()
    t0 = time.perf_counter()
    _ = c.recompiled().jax_source
    return time.perf_counter() - t0


def measure(c, seed: int = 0, repeat: int = 20, progress=None, rounds: int = 5, int_range=None) -> dict:
    """Time and inspect both sides; `progress(step_text)` is called as the work advances."""
    from .hlo import collectives

    step = progress or (lambda text: None)
    step("compiling with spmdlang")
    compile_s = fresh_compile_s(c)
    inputs = c.random_inputs(seed, int_range=int_range)
    arrays = [inputs[p.name] for p in c.program.params]
    out = {"compile_s": compile_s, "compile_includes": COMPILE_INCLUDES}
    compiled, args = [], []
    for side in ("jax", "xla"):
        name = "ours" if side == "jax" else "xla"
        step(f"jit-compiling {name}")
        runner = c.runner(side)
        a = runner.module.place(runner.module._nest(arrays, runner.module.GLOBAL_SHAPES), runner.mesh)
        t = time.perf_counter()
        fn = runner.fn.lower(*a).compile()
        out[f"{name}_jit_s"] = time.perf_counter() - t
        cols = collectives(fn.as_text())
        out[f"{name}_collectives"] = sum(x["trip_count"] for x in cols)  # once per loop iteration
        out[f"{name}_bytes_per_device"] = int(sum(x["bytes_per_device"] * x["trip_count"] for x in cols))
        out[f"{name}_collective_kinds"] = sorted({x["kind"] for x in cols})
        compiled.append(fn)
        args.append(a)
    step("timing ours and XLA in turn")
    times = _interleaved(compiled, args, repeat, rounds)
    for name, per_round in zip(("ours", "xla"), times):
        flat = [x for r in per_round for x in r]
        out[f"{name}_s"] = statistics.median(flat)
        out[f"{name}_min_s"] = min(flat)
    ratios = [statistics.median(o) / statistics.median(x) for o, x in zip(*times)]
    out["ratio"] = out["ours_s"] / out["xla_s"] if out["xla_s"] else float("nan")
    out["ratio_min"], out["ratio_max"] = min(ratios), max(ratios)
    out["ratio_spread"] = (max(ratios) - min(ratios)) / 2 / out["ratio"] if out["ratio"] else float("nan")
    out["ledger_collectives"] = sum(e.trip_count for e in c.spmd.ledger)
    out["mesh"] = dict(c.mesh.axes)
    out["repeat"] = repeat
    out["rounds"] = rounds
    return out


def bench(c, seed: int = 0, repeat: int = 20, progress: bool = True, rounds: int = 5, int_range=None) -> dict:
    """Run `measure` with a progress display on stderr (none when `progress` is False)."""
    if not progress:
        return measure(c, seed, repeat, rounds=rounds, int_range=int_range)
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("compiling", total=None)
        return measure(c, seed, repeat, lambda text: bar.update(task, description=text), rounds=rounds,
                       int_range=int_range)
