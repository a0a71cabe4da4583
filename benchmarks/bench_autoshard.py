"""Autoshard against the hand-written annotations and against XLA's GSPMD.

For each program (programs/*.spmd, benchmarks/transformer_stack.spmd and train_stack.spmd, 12
layers each, and programs/stack_scan.spmd with L=48) it strips
the annotations to the batch dim of the first input (`spmdlang.autoshard.batch_only`), runs
`spmdlang.autoshard`, and compares three plans on the program's mesh:
  hand      our partitioner on the annotations as written in the file
  autoshard our partitioner on the annotations autoshard wrote
  xla       XLA's GSPMD on the hand annotations (`compile --target xla`), its collectives and
            bytes read from the compiled HLO
Collectives and bytes of hand and autoshard are measured the same way (the HLO of our emitted
jax module, compiled), and modelled time is partition.cost.step_time_us of our plans.

    python benchmarks/bench_autoshard.py [--json OUT.json] [--no-xla] [FILE ...]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def hlo_collectives(c, backend: str) -> tuple[int, int]:
    from spmdlang.backend_jax.hlo import collectives, compiled_text

    r = c.runner(backend)
    inputs = c.random_inputs(0)
    m = r.module  # struct parameters go in as nested dicts
    hlo = collectives(compiled_text(r.fn, *m.place(m._nest([inputs[p.name] for p in c.program.params], m.GLOBAL_SHAPES),
                                                   r.mesh)))
    return len(hlo), int(round(sum(x["bytes_per_device"] for x in hlo)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="*")
    ap.add_argument("--json")
    ap.add_argument("--no-xla", action="store_true")
    args = ap.parse_args()
    import spmdlang
    from spmdlang.autoshard import Plan, autoshard, batch_only

    files = [(Path(f), None) for f in args.files] or [(p, None) for p in sorted((ROOT / "programs").glob("*.spmd"))] + [
        (ROOT / "programs" / "stack_scan.spmd", {"L": 48}), (ROOT / "benchmarks" / "transformer_stack.spmd", None),
        (ROOT / "benchmarks" / "train_stack.spmd", None)]
    rows = []
    for path, consts in files:
        text = path.read_text()
        t0 = time.perf_counter()
        result = autoshard(batch_only(text, str(path)), filename=str(path), consts=consts)
        total = time.perf_counter() - t0
        hand = spmdlang.compile(str(path), consts=consts)
        mine = result.compiled
        name = path.name + ("".join(f" {k}={v}" for k, v in consts.items()) if consts else "")
        row = {"program": name, "solver": result.solver, "solve_s": round(result.solve_s, 2),
               "solve_cpu_s": round(result.solve_cpu_s, 2),
               "autoshard_s": round(total, 2), "variables": result.problem["variables"],
               "hand": Plan("hand", "", hand).totals(), "autoshard": result.chosen.totals(),
               "chosen": result.chosen.label}
        if not args.no_xla:
            row["hand"]["hlo_collectives"], row["hand"]["hlo_bytes"] = hlo_collectives(hand, "jax")
            row["autoshard"]["hlo_collectives"], row["autoshard"]["hlo_bytes"] = hlo_collectives(mine, "jax")
            row["xla"] = dict(zip(("hlo_collectives", "hlo_bytes"), hlo_collectives(hand, "xla")))
        rows.append(row)
        print(json.dumps(row), flush=True)
    print()
    print("| program | plan | collectives | bytes/device | modelled time (us) | solve (s) wall / CPU |")
    print("|---|---|---:|---:|---:|---:|")
    for r in rows:
        for plan in ("hand", "autoshard", "xla"):
            x = r.get(plan)
            if x is None:
                continue
            n = x.get("hlo_collectives", x.get("collectives"))
            b = x.get("hlo_bytes", x.get("bytes_per_device"))
            t = f"{x['modelled_time_us']:.1f}" if "modelled_time_us" in x else ""
            s = f"{r['solve_s']:.2f} / {r['solve_cpu_s']:.2f}" if plan == "autoshard" else ""
            print(f"| {r['program']} | {plan} | {n} | {b:,} | {t} | {s} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
