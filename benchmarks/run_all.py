"""Benchmark every program in programs/ against XLA's GSPMD, and our compile time against mesh size.

    python benchmarks/run_all.py [--repeat 20] [--rounds 5] [--out /tmp/results] [--quick]

For each program, and the patterns in benchmarks/patterns/ (at the sizes in SIZES, where compute
is not negligible): our shard_map module and the XLA baseline on the same mesh and inputs, called
in turn (ours, XLA, ours, ...) for --rounds rounds of --repeat calls each (backend_jax.bench);
the median and fastest call of each, the ratio of the medians with the lowest and highest ratio
among the rounds; the collectives and bytes per device in each compiled HLO, and compile times.
Then the compile time of a deep transformer stack (thousands of ops) on meshes from 8 to 2048
devices, which should be flat. Prints the markdown table; with --out PATH also writes PATH.md and
PATH.json (nothing is written by default, so a run never overwrites the tracked results).
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

from bench_compile import program as transformer_stack  # noqa: E402

import spmdlang  # noqa: E402
from spmdlang.backend_jax.bench import measure  # noqa: E402

# --set overrides so that each device has real work (the defaults are sized for quick tests)
SIZES = {
    "mlp": {"B": 256, "D": 1024, "F": 4096},
    "transformer_block": {"B": 16, "S": 128},
    "moe": {"S": 128, "M": 512, "F": 1024, "C": 32},
    "moe_top2": {"S": 128, "M": 512, "F": 1024, "C": 32},
    "unet3d": {"N": 2, "V": 32},
    "conv": {"N": 16},
    "embedding": {"B": 32, "S": 128},
    "pipeline": {"B": 64, "D": 512},
    "pipeline_microbatch": {"B": 64, "D": 512},
    "stack_scan": {"L": 12, "B": 16, "S": 128},
    "decode_kv_cache": {"B": 32, "T": 64},
    "train_mlp": {"B": 256, "D": 1024, "F": 4096},
    "train_transformer": {"B": 16, "S": 128},
    "train_embedding": {"B": 16, "S": 128, "V": 8192, "D": 256},
    "train_zero": {"B": 256, "D": 1024, "F": 4096},
    "train_stack_scan": {"L": 12, "B": 16, "S": 128, "H": 8, "DH": 64, "F": 1024},
    "train_pipeline_microbatch": {"B": 64, "D": 512},
}

SWEEP = [{"data": 2, "model": 4}, {"data": 8, "model": 8}, {"data": 16, "model": 16}, {"data": 32, "model": 64}]


def geomean(xs):
    xs = [x for x in xs if x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def bench_programs(repeat: int, quick: bool, rounds: int = 5) -> list[dict]:
    rows = []
    paths = sorted(glob.glob(os.path.join(ROOT, "programs", "*.spmd")))
    paths += sorted(glob.glob(os.path.join(HERE, "patterns", "*.spmd")))
    for path in paths:
        name = os.path.splitext(os.path.basename(path))[0]
        consts = {} if quick else SIZES.get(name, {})
        c = spmdlang.compile(path, consts=consts)
        print(f"{name}: measuring ...", file=sys.stderr, flush=True)
        r = measure(c, repeat=repeat, rounds=rounds)
        r.update(program=name, consts=consts, ops=len(c.program.ops))
        rows.append(r)
        print(f"  ours {r['ours_s'] * 1e3:.2f} ms, xla {r['xla_s'] * 1e3:.2f} ms, ratio {r['ratio']:.3f} "
              f"(rounds {r['ratio_min']:.3f}..{r['ratio_max']:.3f}); "
              f"collectives {r['ours_collectives']} vs {r['xla_collectives']}; bytes {r['ours_bytes_per_device']:,} "
              f"vs {r['xla_bytes_per_device']:,}", file=sys.stderr, flush=True)
    return rows


def compile_sweep(layers: int, runs: int = 5) -> list[dict]:
    """Median compile time per mesh; the meshes take turns in every round, each compile after a
    garbage collection, so drift in load or heap size does not favour one mesh."""
    import gc

    text = transformer_stack(layers)
    _ = spmdlang.compile(text, filename="stack.spmd").jax_source  # warm-up: parser tables, imports
    times: dict[int, list[float]] = {i: [] for i in range(len(SWEEP))}
    info: dict[int, tuple] = {}
    for _ in range(runs):
        for i, mesh in enumerate(SWEEP):
            gc.collect()
            t = time.perf_counter()
            c = spmdlang.compile(text, mesh=mesh, filename="stack.spmd")
            _ = c.jax_source
            times[i].append(time.perf_counter() - t)
            info[i] = (len(c.program.ops), len(c.spmd.ledger))
    rows = []
    for i, mesh in enumerate(SWEEP):
        n = 1
        for s in mesh.values():
            n *= s
        ops, cols = info[i]
        rows.append({"devices": n, "mesh": mesh, "ops": ops, "compile_s": sorted(times[i])[len(times[i]) // 2],
                     "collectives": cols})
        print(f"compile sweep: {n} devices, {ops} ops: {rows[-1]['compile_s']:.3f} s", file=sys.stderr, flush=True)
    return rows


def markdown(rows, sweep) -> str:
    out = ["| program | ours median / min (ms) | XLA median / min (ms) | ours/XLA | ratio over rounds "
           "| collectives ours / XLA | bytes/device ours / XLA | our compile (ms) | jit ours / XLA (s) |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        flag = "" if r["ratio_spread"] <= 0.05 else " (over +-5%)"
        out.append(f"| {r['program']} | {r['ours_s'] * 1e3:.2f} / {r['ours_min_s'] * 1e3:.2f} | "
                   f"{r['xla_s'] * 1e3:.2f} / {r['xla_min_s'] * 1e3:.2f} | {r['ratio']:.2f} | "
                   f"{r['ratio_min']:.2f}..{r['ratio_max']:.2f}{flag} | "
                   f"{r['ours_collectives']} / {r['xla_collectives']} | {r['ours_bytes_per_device']:,} / "
                   f"{r['xla_bytes_per_device']:,} | {r['compile_s'] * 1e3:.0f} | {r['ours_jit_s']:.2f} / "
                   f"{r['xla_jit_s']:.2f} |")
    out.append(f"| **geomean** | | | **{geomean([r['ratio'] for r in rows]):.2f}** | | | | | |")
    out += ["", "| devices | mesh | ops | compile (s) | x of 8 devices |", "|---:|---|---:|---:|---:|"]
    base = sweep[0]["compile_s"] if sweep else 1
    for s in sweep:
        mesh = ", ".join(f"{a}={n}" for a, n in s["mesh"].items())
        out.append(f"| {s['devices']} | [{mesh}] | {s['ops']} | {s['compile_s']:.3f} | {s['compile_s'] / base:.2f} |")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--layers", type=int, default=24, help="transformer layers in the compile sweep")
    ap.add_argument("--rounds", type=int, default=5, help="rounds of ours and XLA in turn")
    ap.add_argument("--out", metavar="PATH", help="also write PATH.md and PATH.json (default: print only)")
    ap.add_argument("--quick", action="store_true", help="default program sizes, fewer repeats")
    args = ap.parse_args(argv)
    rows = bench_programs(3 if args.quick else args.repeat, args.quick, 2 if args.quick else args.rounds)
    sweep = compile_sweep(4 if args.quick else args.layers)
    md = markdown(rows, sweep)
    if args.out:
        with open(args.out + ".md", "w") as f:
            f.write(md)
        with open(args.out + ".json", "w") as f:
            json.dump({"programs": rows, "compile_sweep": sweep,
                       "geomean_ratio": geomean([r["ratio"] for r in rows])}, f, indent=2, default=str)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
