"""Compile time against the number of devices: it must not grow (DESIGN.md, "Partitioning").

Compiles one program, a deep stack of pre-LN transformer blocks (data parallel over `data`,
Megatron tensor parallel over `model`, attention heads on `model`), on a mesh of 8 devices
([data=8, model=1]) and one of 2048 ([data=32, model=64]), and times each stage: parse + lower,
sharding propagation, SPMD partitioning (what `c.spmd` computes, per-partition passes included).
Prints both, and the ratio 2048 / 8, which should be about 1; also the number of Python function
calls of one compile on each mesh, a noise-free measure of the work done. A control row compiles on
[data=2, model=4]: 8 devices with the 2048-device plan, so device count is the only difference.

    python benchmarks/bench_compile.py [--layers 8] [--repeat 5] [--json PATH] [--profile]

`--profile` also prints the top functions by cumulative time of one 2048-device compile, to find
where the time goes if the ratio is not flat.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import platform
import pstats
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import spmdlang  # noqa: E402

MESHES = {"8 devices": {"data": 8, "model": 1}, "2048 devices": {"data": 32, "model": 64}}
# a control: 8 devices with the same tensor-parallel plan as 2048 (model > 1), so the difference
# between it and 2048 is the number of devices alone, not the plan's extra collectives
CONTROL = {"8 devices, tp": {"data": 2, "model": 4}}

PROGRAM = """\
mesh [data=2, model=4]

const B = 64     # batch
const S = 128    # sequence
const H = 64     # heads
const DH = 64    # head dim
const D = H * DH # model dim
const F = 4 * D  # FFN hidden dim

func layer_norm(x: f32[B, S, D], g: f32[D], b: f32[D]) -> f32[B, S, D] {
  mu = mean(x, axis=-1, keepdims=true)
  xc = x - mu
  var = mean(xc * xc, axis=-1, keepdims=true)
  return xc * rsqrt(var + 1e-5) * g + b
}

func block(x: f32[B, S, D], g1: f32[D], b1: f32[D],
           wq: f32[D, D] {_, model}, wk: f32[D, D] {_, model}, wv: f32[D, D] {_, model},
           wo: f32[D, D] {model, _}, g2: f32[D], b2: f32[D],
           w1: f32[D, F] {_, model}, c1: f32[F], w2: f32[F, D] {model, _}, c2: f32[D]) -> f32[B, S, D] {
  h = layer_norm(x, g1, b1)
  q = reshape(h @ wq, [B, S, H, DH])
  k = reshape(h @ wk, [B, S, H, DH])
  v = reshape(h @ wv, [B, S, H, DH])
  scores = shard(einsum("bqhd,bkhd->bhqk", q, k) * DH ** -0.5, {data, model, _, _})
  ctx = einsum("bhqk,bkhd->bqhd", softmax(scores, axis=-1), v)
  x = x + reshape(ctx, [B, S, D]) @ wo
  h = layer_norm(x, g2, b2)
  return x + (gelu(h @ w1 + c1) @ w2 + c2)
}

func main(x: f32[B, S, D] {data, _, _}, PARAMS) -> f32[B, S, D] {data, _, _} {
BODY  return x
}
"""

WEIGHTS = ["g1: f32[D]", "b1: f32[D]", "wq: f32[D, D]", "wk: f32[D, D]", "wv: f32[D, D]", "wo: f32[D, D]",
           "g2: f32[D]", "b2: f32[D]", "w1: f32[D, F]", "c1: f32[F]", "w2: f32[F, D]", "c2: f32[D]"]


def program(layers: int) -> str:
    params, body = [], []
    for i in range(layers):
        names = []
        for w in WEIGHTS:
            name, ty = w.split(": ")
            params.append(f"{name}_{i}: {ty}")
            names.append(f"{name}_{i}")
        body.append(f"  x = block(x, {', '.join(names)})\n")
    return PROGRAM.replace("PARAMS", ", ".join(params)).replace("BODY", "".join(body))


def compile_once(text: str, mesh: dict) -> dict:
    """Seconds per stage of one compile from text; touching c.spmd runs the whole pipeline."""
    t0 = time.perf_counter()
    c = spmdlang.compile(text, mesh=mesh, filename="stack.spmd")
    t1 = time.perf_counter()
    _ = c.propagation
    t2 = time.perf_counter()
    spmd = c.spmd
    t3 = time.perf_counter()
    return {"lower_s": t1 - t0, "propagate_s": t2 - t1, "partition_s": t3 - t2, "total_s": t3 - t0,
            "global_ops": len(c.program.ops), "local_ops": len(spmd.program.ops),
            "collectives": len(spmd.ledger)}


def measure(text: str, meshes: dict, repeat: int) -> dict:
    """Medians per mesh; the meshes take turns in every round and each compile starts after a
    garbage collection, so load drift and heap growth do not favour the mesh measured first."""
    runs: dict = {label: [] for label in meshes}
    for _ in range(repeat):
        for label, mesh in meshes.items():
            gc.collect()
            runs[label].append(compile_once(text, mesh))
    rows = {}
    for label, mesh in meshes.items():
        rs = runs[label]
        stages = ("lower_s", "propagate_s", "partition_s", "total_s")
        out = {k: statistics.median(r[k] for r in rs) for k in stages}
        out.update({k: rs[0][k] for k in ("global_ops", "local_ops", "collectives")})
        out["mesh"] = mesh
        out["devices"] = 1
        for n in mesh.values():
            out["devices"] *= n
        rows[label] = out
    return rows


def call_count(text: str, mesh: dict) -> int:
    """Python function calls of one compile: a noise-free measure of work (it must not grow either)."""
    prof = cProfile.Profile()
    prof.enable()
    compile_once(text, mesh)
    prof.disable()
    return sum(v[1] for v in pstats.Stats(prof).stats.values())


def profile(text: str, mesh: dict, top: int = 25) -> str:
    prof = cProfile.Profile()
    prof.enable()
    compile_once(text, mesh)
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(top)
    return buf.getvalue()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=8, help="transformer blocks in the program (default 8)")
    ap.add_argument("--repeat", type=int, default=5, help="compiles per mesh; medians are reported")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    ap.add_argument("--profile", action="store_true", help="cProfile one compile on the largest mesh")
    args = ap.parse_args(argv)

    text = program(args.layers)
    compile_once(text, MESHES["8 devices"])  # warm-up: grammar tables, imports
    meshes = {**MESHES, **CONTROL}
    rows = measure(text, meshes, args.repeat)
    for label, mesh in meshes.items():
        r = rows[label]
        r["function_calls"] = call_count(text, mesh)
        print(f"{label:>13} {str(mesh):32} {r['global_ops']} ops -> {r['local_ops']} local ops, "
              f"{r['collectives']} collectives: lower {r['lower_s']:.3f} s, "
              f"propagate {r['propagate_s']:.3f} s, partition {r['partition_s']:.3f} s, "
              f"total {r['total_s']:.3f} s; {r['function_calls']:,} calls")
    small, big = rows["8 devices"], rows["2048 devices"]
    ratio = big["total_s"] / small["total_s"]
    print(f"ratio 2048 / 8 devices: {ratio:.2f} (total), "
          + ", ".join(f"{k[:-2]} {big[k] / small[k]:.2f}" for k in ("lower_s", "propagate_s", "partition_s"))
          + f"; function calls {big['function_calls'] / small['function_calls']:.2f}")
    tp = rows["8 devices, tp"]
    print(f"ratio 2048 / 8 devices with the same plan: {big['total_s'] / tp['total_s']:.2f} (total); "
          f"function calls {big['function_calls'] / tp['function_calls']:.2f}")
    if args.profile:
        print(profile(text, MESHES["2048 devices"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"layers": args.layers, "repeat": args.repeat, "python": platform.python_version(),
                       "machine": platform.machine(), "meshes": rows, "ratio": ratio,
                       "ratio_same_plan": big["total_s"] / tp["total_s"]}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
