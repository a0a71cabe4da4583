"""Time to an executable: our compiler plus jax's jit of the module we emit, against jax's jit of
the XLA-GSPMD baseline, for every program in programs/ (or the files given).

Per program and round, each side starts with jax's caches cleared (`jax.clear_caches()`, and no
persistent compilation cache), so nothing compiled before is reused:

- ours: `spmdlang` compiles the program afresh from its source text (parse .. the jax module's
  source, as `spmdlang bench`'s compile_s) with its memos of earlier compiles forgotten
  (`spmdlang.api.clear_caches()`, as in a fresh process), then the module is loaded and
  `build(mesh)` is lowered and compiled by jax (`jit(...).lower(*args).compile()`: tracing,
  StableHLO, XLA's compile);
- XLA: the baseline module (emitted once, outside the clock: it is the program as written) is
  loaded, lowered and compiled the same way.

The two sides take turns (which one goes first alternates by round) for `--rounds` rounds, so load
drift hits both alike. Printed per program: each side's median wall seconds, our compile's share,
the ratio ours/XLA of the medians and its spread (the lowest and highest ratio of one round's
pair), the same ratio in process CPU time (all threads; steadier than wall time on a loaded
machine), the module's ratio (the median over rounds of (ours - our compile) / XLA: jax's jit of the
module we emit against jax's jit of the baseline, spmdlang's own compile left out, which says how
much of a gap is what XLA compiles and how much our compiler's time), then the geometric means of
the ratios. The goal (issue 25) is a ratio <= 1.0 on every program.

    python benchmarks/bench_time_to_executable.py [PROGRAM.spmd ...] [--rounds 3] [--json PATH]

`--kernels` prints, instead of times, what XLA's CPU backend compiles on each side: the kernels
(fusions and unfused ops of the optimized HLO's non-fused computations, loop bodies included; XLA
compiles each one to machine code, which is most of its compile time), the lines of optimised LLVM
IR of those kernels (XLA's dump, `--xla_dump_to`: LLVM's work grows with it, and a kernel's size
varies far more than the count of kernels says: a fusion rooted in a concatenate of n operands is
n vectorised loop nests) and the collectives. The counts are deterministic, so they show a change's
effect on a loaded machine, where times do not.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import spmdlang  # noqa: E402
from spmdlang.backend_jax.runner import ensure_devices, load  # noqa: E402


def _executable(module, arrays) -> None:
    """jit + lower + XLA compile of the module's build(mesh), on placed arguments."""
    mesh = module.make_mesh()
    module.build(mesh).lower(*arrays).compile()


def _placed(c, backend: str, inputs):
    m = c.runner(backend).module
    values = m._nest([inputs[p.name] for p in c.program.params], m.GLOBAL_SHAPES)
    return m.place(values, m.make_mesh())


# Ops of an optimized HLO module that XLA's CPU backend does not compile into a kernel of their own.
_NOT_KERNELS = {"parameter", "constant", "bitcast", "get-tuple-element", "tuple", "partition-id",
                "replica-id", "after-all", "opt-barrier", "while", "conditional", "call"}
_COLLECTIVES = {"all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute",
                "all-reduce-start", "all-gather-start", "collective-permute-start", "all-reduce-done",
                "all-gather-done", "collective-permute-done"}


def kernel_counts(hlo_text: str) -> tuple[int, int]:
    """(kernels, collectives) of an optimized HLO module's text: the instructions of every
    computation that is not a fusion's body or a reducer (see _NOT_KERNELS)."""
    called = set(re.findall(r"(?:calls|to_apply)=%([\w.-]+)", hlo_text))
    kernels = collectives = 0
    name = None
    for line in hlo_text.splitlines():
        head = re.match(r"^(?:ENTRY )?%([\w.-]+) ", line)
        if head and line.rstrip().endswith("{"):
            name = head.group(1)
            continue
        # the opcode: the first lower-case word before "(" after the shape, which may be a tuple
        # with spaces (a multi-output fusion, a combined all-reduce: "(f32[], f32[8]{0}) all-reduce(")
        op = re.match(r"^\s+(?:ROOT )?%\S+ = .*?([a-z][a-z0-9-]*)\(", line)
        if name is None or name in called or not op:
            continue
        kind = op.group(1)
        if kind in _COLLECTIVES:
            collectives += kind.endswith("-done") is False
        elif kind not in _NOT_KERNELS:
            kernels += 1
    return kernels, collectives


def kernels(path: Path, dump: Path) -> dict:
    """Kernels, lines of optimised LLVM IR and collectives XLA compiles for our module and for the
    baseline (see --kernels); `dump` is XLA's dump folder (XLA_FLAGS --xla_dump_to)."""
    import jax

    c = spmdlang.compile(str(path))
    ensure_devices(c.mesh.size)
    inputs = c.random_inputs(0)
    row = {"program": path.stem}
    for side, backend, source in (("ours", "jax", c.jax_source), ("xla", "xla", c.xla_source)):
        shutil.rmtree(dump)
        dump.mkdir()
        jax.clear_caches()
        module = load(source, side)
        text = module.build(module.make_mesh()).lower(*_placed(c, backend, inputs)).compile().as_text()
        row[side + "_kernels"], row[side + "_collectives"] = kernel_counts(text)
        row[side + "_llvm_lines"] = sum(f.read_text().count("\n") for f in dump.glob("*.ir-with-opt.ll"))
    return row


def measure(path: Path, rounds: int) -> dict:
    import jax

    c = spmdlang.compile(str(path))
    ensure_devices(c.mesh.size)
    inputs = c.random_inputs(0)
    xla_source = c.xla_source
    args = {"jax": _placed(c, "jax", inputs), "xla": _placed(c, "xla", inputs)}
    _ = c.recompiled().jax_source  # warm imports and the op table

    def ours() -> tuple[float, float, float]:
        t0, c0 = time.perf_counter(), time.process_time()
        source = c.recompiled().jax_source
        t1 = time.perf_counter()
        _executable(load(source, "ours"), args["jax"])
        return time.perf_counter() - t0, time.process_time() - c0, t1 - t0

    def xla() -> tuple[float, float]:
        t0, c0 = time.perf_counter(), time.process_time()
        _executable(load(xla_source, "xla"), args["xla"])
        return time.perf_counter() - t0, time.process_time() - c0

    out = {"ours": [], "ours_cpu": [], "ours_compile": [], "xla": [], "xla_cpu": []}
    for r in range(rounds):
        for side in (("ours", "xla") if r % 2 == 0 else ("xla", "ours")):
            jax.clear_caches()
            spmdlang.api.clear_caches()
            gc.collect()
            if side == "ours":
                total, cpu, own = ours()
                out["ours"].append(total)
                out["ours_cpu"].append(cpu)
                out["ours_compile"].append(own)
            else:
                total, cpu = xla()
                out["xla"].append(total)
                out["xla_cpu"].append(cpu)
    ratios = [o / x for o, x in zip(out["ours"], out["xla"])]
    # the module alone: jit of what we emit against jit of the baseline, our compiler's time left out
    module_ratios = [(o - c) / x for o, c, x in zip(out["ours"], out["ours_compile"], out["xla"])]
    cpu_ratios = [o / x for o, x in zip(out["ours_cpu"], out["xla_cpu"])]
    med = {k: statistics.median(v) for k, v in out.items()}
    return {"program": path.stem, "ours_s": med["ours"], "xla_s": med["xla"], "spmdlang_s": med["ours_compile"],
            "ratio": med["ours"] / med["xla"], "ratio_min": min(ratios), "ratio_max": max(ratios),
            "module_ratio": statistics.median(module_ratios),
            "ours_cpu_s": med["ours_cpu"], "xla_cpu_s": med["xla_cpu"], "cpu_ratio": med["ours_cpu"] / med["xla_cpu"],
            "cpu_ratio_min": min(cpu_ratios), "cpu_ratio_max": max(cpu_ratios), "rounds": rounds}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("programs", nargs="*", type=Path, help="default: every programs/*.spmd")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds per program (default 3)")
    ap.add_argument("--json", type=Path, help="also write the rows as JSON")
    ap.add_argument("--kernels", action="store_true",
                    help="print the kernels and collectives XLA compiles on each side, no timing")
    a = ap.parse_args(argv)
    os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)
    if a.kernels:  # XLA reads its flags once, when jax starts its CPU backend
        dump = Path(tempfile.mkdtemp(prefix="spmdlang-xla-dump-"))
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_dump_to={dump}".strip()
    import jax

    jax.config.update("jax_enable_compilation_cache", False)
    paths = a.programs or sorted((ROOT / "programs").glob("*.spmd"))
    ensure_devices(max(spmdlang.compile(str(p)).mesh.size for p in paths))
    if a.kernels:
        try:
            return _print_kernels(paths, a.json, dump)
        finally:
            shutil.rmtree(dump, ignore_errors=True)
    load0 = os.getloadavg()[0]
    rows = []
    print(f"{'program':<26} {'ours s':>7} {'(spmdlang)':>10} {'XLA s':>7} {'ratio':>6} {'spread':>12}  "
          f"{'cpu ratio':>9} {'spread':>12}  {'module':>6}", flush=True)
    for p in paths:
        row = measure(p, a.rounds)
        rows.append(row)
        print(f"{row['program']:<26} {row['ours_s']:>7.3f} {row['spmdlang_s']:>10.3f} {row['xla_s']:>7.3f} "
              f"{row['ratio']:>6.2f} {row['ratio_min']:>5.2f} .. {row['ratio_max']:<4.2f}  {row['cpu_ratio']:>9.2f} "
              f"{row['cpu_ratio_min']:>5.2f} .. {row['cpu_ratio_max']:<4.2f}  {row['module_ratio']:>6.2f}", flush=True)
    geo = math.exp(sum(math.log(r["ratio"]) for r in rows) / len(rows))
    cpu_geo = math.exp(sum(math.log(r["cpu_ratio"]) for r in rows) / len(rows))
    module_geo = math.exp(sum(math.log(r["module_ratio"]) for r in rows) / len(rows))
    worst = max(rows, key=lambda r: r["ratio"])
    print(f"geomean ratio {geo:.3f} (cpu time {cpu_geo:.3f}, module {module_geo:.3f}) over {len(rows)} programs; "
          f"worst {worst['program']} {worst['ratio']:.2f}; "
          f"median of {a.rounds} interleaved rounds; load average {load0:.1f} -> {os.getloadavg()[0]:.1f}; "
          f"jax {jax.__version__}, {platform.python_version()}")
    if a.json:
        doc = {"rows": rows, "geomean": geo, "cpu_geomean": cpu_geo, "module_geomean": module_geo,
               "jax": jax.__version__}
        a.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


def _print_kernels(paths, json_path, dump: Path) -> int:
    rows = []
    print(f"{'program':<26} {'ours kernels':>12} {'XLA kernels':>11} {'ours LLVM IR':>12} {'XLA LLVM IR':>11} "
          f"{'ours coll.':>10} {'XLA coll.':>9}")
    for p in paths:
        r = kernels(p, dump)
        rows.append(r)
        print(f"{r['program']:<26} {r['ours_kernels']:>12} {r['xla_kernels']:>11} {r['ours_llvm_lines']:>12} "
              f"{r['xla_llvm_lines']:>11} {r['ours_collectives']:>10} {r['xla_collectives']:>9}", flush=True)
    total = {k: sum(r[k] for r in rows) for k in ("ours_kernels", "xla_kernels", "ours_llvm_lines", "xla_llvm_lines")}
    print(f"total kernels: ours {total['ours_kernels']}, XLA {total['xla_kernels']}; lines of optimised LLVM IR: "
          f"ours {total['ours_llvm_lines']}, XLA {total['xla_llvm_lines']}")
    if json_path:
        json_path.write_text(json.dumps({"rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
