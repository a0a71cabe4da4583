"""Compile time against the trip count of a `loop`: it must be flat (issue: "loops compiled once").

Compiles programs/stack_scan.spmd (a pre-LN transformer layer in a `loop` over L stacked layers,
mesh [data=2, model=4]) for L = 4, 12, 48, 192 and times each stage of one compile: parse + lower,
sharding propagation, partitioning (`c.spmd`, per-partition passes included) and emitting the jax
module; `--jit` also times jax's lower + compile of our emitted module (XLA's own compile of the
fori_loop). For contrast, the same stack with the layers unrolled by `for` (static indices) is
compiled too, up to `--unrolled-max` layers. The ratio L=192 / L=4 of the loop's total should be
about 1; the unrolled one grows with L.

    python benchmarks/bench_loop_compile.py [--layers 4 12 48 192] [--repeat 3] [--jit] [--json PATH]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import spmdlang  # noqa: E402

SOURCE = (ROOT / "programs" / "stack_scan.spmd").read_text()


def unrolled_source() -> str:
    """stack_scan with its `loop` unrolled at compile time: `for` and static layer indices."""
    loop = SOURCE.index("  loop l in range(L) {")
    end = SOURCE.index("  return x", loop)
    body = ("  for l in range(L) {\n"
            "    x = layer(x, wq[l], wk[l], wv[l], wo[l], w1[l], w2[l])\n"
            "  }\n")
    return SOURCE[:loop] + body + SOURCE[end:]


def stages(src: str, layers: int, jit: bool) -> dict:
    out = {}
    gc.collect()
    t = time.perf_counter()
    c = spmdlang.compile(src, consts={"L": layers}, verify=False)
    canonical = c.canonical
    out["lower_s"] = time.perf_counter() - t
    t = time.perf_counter()
    c.pipeline.stage("propagation")
    out["propagate_s"] = time.perf_counter() - t
    t = time.perf_counter()
    spmd = c.spmd
    out["partition_s"] = time.perf_counter() - t
    t = time.perf_counter()
    c.jax_source  # noqa: B018
    out["emit_s"] = time.perf_counter() - t
    out["total_s"] = sum(out.values())
    out["ops"] = sum(1 for _ in canonical.values())
    out["local_ops"] = sum(1 for _ in spmd.program.values())
    if jit:
        runner = c.runner("jax")
        inputs = c.random_inputs(0)
        args = runner.module.place([inputs[p.name] for p in c.program.params], runner.mesh)
        t = time.perf_counter()
        runner.fn.lower(*args).compile()
        out["jax_jit_s"] = time.perf_counter() - t
    return out


def median_of(src, layers, repeat, jit) -> dict:
    runs = [stages(src, layers, jit and i == 0) for i in range(repeat)]
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0] if k != "jax_jit_s"}
    if "jax_jit_s" in runs[0]:
        med["jax_jit_s"] = runs[0]["jax_jit_s"]
    return med


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, nargs="+", default=[4, 12, 48, 192])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--jit", action="store_true", help="also time jax's lower + compile of our module")
    ap.add_argument("--unrolled-max", type=int, default=48, help="unrolled `for` contrast up to this many layers")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    if args.jit and "device_count" not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8")
    results = {"python": platform.python_version(), "loop": {}, "unrolled": {}}
    head = (f"{'layers':>6} {'form':9} {'IR ops':>7} {'lower':>7} {'propagate':>9} {'partition':>9} "
            f"{'emit':>6} {'total':>7}")
    stages(SOURCE, args.layers[0], False)  # warm up: imports and first-use caches
    print(head + ("  jax jit" if args.jit else ""))
    for layers in args.layers:
        for form, src in (("loop", SOURCE), ("unrolled", unrolled_source())):
            if form == "unrolled" and layers > args.unrolled_max:
                continue
            r = median_of(src, layers, args.repeat, args.jit)
            results[form][layers] = r
            line = (f"{layers:>6} {form:9} {r['ops']:>7} {r['lower_s']:>7.3f} {r['propagate_s']:>9.3f} "
                    f"{r['partition_s']:>9.3f} {r['emit_s']:>6.3f} {r['total_s']:>7.3f}")
            print(line + (f"  {r['jax_jit_s']:7.2f}" if "jax_jit_s" in r else ""), flush=True)
    loop = results["loop"]
    lo, hi = min(loop), max(loop)
    ratio = loop[hi]["total_s"] / loop[lo]["total_s"]
    results["ratio_loop_total"] = ratio
    print(f"loop: compile time at L={hi} / L={lo}: {ratio:.2f} (target <= 1.2)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
