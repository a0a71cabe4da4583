"""Autoshard on large programs: wall time of each phase on a generated program of about N ops.

Two shapes, both on mesh [data=2, model=4] with only the batch input annotated:
  chain     h = tanh(h @ w + b) unrolled by `for` (one weight: layers alike share variables)
  distinct  h = tanh(h @ w_i) * c_i with a weight parameter per layer (each layer its own group)

    python benchmarks/bench_autoshard_scale.py [--ops 1000 2500 5000 10000] [--shape chain|distinct|both]
        [--solver auto|ilp|greedy]

Prints the load average before and after each program (the machine may be shared), the search's
problem size, seconds spent building the problem, solving it, and compiling the candidate plans
(`compile`, with how many candidate sources were compiled), and in all: wall clock (`total_s`)
and this process's CPU time (`cpu_s`, which a busy machine inflates less); and the process's
peak memory so far (`peak_rss_mb`).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def program(shape: str, ops: int) -> str:
    if shape == "chain":  # 4 ops a layer: einsum, broadcast of b, add, tanh
        return ("mesh [data=2, model=4]\n"
                "func main(x: f32[64, 128] {data, _}, w: f32[128, 128], b: f32[128]) -> f32[64, 128] {\n"
                f"  h = x\n  for i in range({ops // 4}) {{\n    h = tanh(h @ w + b)\n  }}\n  return h\n}}\n")
    n = ops // 4  # einsum, tanh, the constant, mul
    params = ", ".join(f"w{i}: f32[128, 128]" for i in range(n))
    body = "".join(f"  h = tanh(h @ w{i}) * {1.0 + i % 7}\n" for i in range(n))
    return (f"mesh [data=2, model=4]\nfunc main(x: f32[64, 128] {{data, _}}, {params}) -> f32[64, 128] {{\n"
            f"  h = x\n{body}  return h\n}}\n")


def run(shape: str, ops: int, solver: str) -> dict:
    import spmdlang
    from spmdlang.autoshard import driver
    from spmdlang.autoshard import problem as P
    from spmdlang.autoshard import solve as S

    spent = {"build": 0.0, "solve": 0.0, "compile": 0.0}

    def timed(name, f):
        def wrapper(*a, **k):
            t = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                spent[name] += time.perf_counter() - t
        return wrapper

    saved = P.build, S.solve_ilp, S.solve_greedy, driver._plan
    P.build = timed("build", P.build)
    S.solve_ilp, S.solve_greedy = timed("solve", S.solve_ilp), timed("solve", S.solve_greedy)
    driver._plan = timed("compile", driver._plan)
    try:
        text = program(shape, ops)
        t0, c0 = time.perf_counter(), time.process_time()
        r = spmdlang.autoshard(text, filename=f"{shape}.spmd", method=solver)
        total, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        P.build, S.solve_ilp, S.solve_greedy, driver._plan = saved
    n_ops = len(spmdlang.compile(text).program.ops)
    return {"shape": shape, "ops": n_ops, "solver": r.solver, "variables": r.problem["variables"],
            "groups": r.problem["groups"], **{k: round(v, 1) for k, v in spent.items()},
            "candidate_compiles": r.problem["candidate_compiles"], "total_s": round(total, 1),
            "cpu_s": round(cpu, 1), "chosen": r.chosen.label, "modelled_time_us": r.chosen.totals()["modelled_time_us"],
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", type=int, nargs="+", default=[10_000])
    ap.add_argument("--shape", choices=("chain", "distinct", "both"), default="both")
    ap.add_argument("--solver", choices=("auto", "ilp", "greedy"), default="auto")
    args = ap.parse_args()
    shapes = ("chain", "distinct") if args.shape == "both" else (args.shape,)
    print(json.dumps({"cpus": os.cpu_count()}), flush=True)
    for ops in args.ops:
        for shape in shapes:
            load = [round(x, 1) for x in os.getloadavg()]
            r = run(shape, ops, args.solver)
            after = [round(x, 1) for x in os.getloadavg()]
            print(json.dumps({**r, "load_before": load, "load_after": after}), flush=True)


if __name__ == "__main__":
    main()
