"""Speed of lowering and sharding propagation on a deep transformer stack.

Generates the text of an N-layer pre-LN transformer (each layer: two layer norms, multi-head
attention through reshapes, einsums and a softmax, a gelu FFN; about 60 IR ops per layer), data
parallel over `data` and Megatron tensor parallel over `model`, compiles it (parse + lower to IR)
and propagates shardings, timing each stage (median of --repeat runs).

    python benchmarks/bench_propagate.py                      # 16, 32, 64 layers
    python benchmarks/bench_propagate.py --layers 8 128 --json out.json

Run on demand; not part of pytest (tests only check that a small stack compiles and propagates).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time

HEADER = """\
mesh [data=2, model=4]

const B = 8      # batch
const S = 128    # sequence length
const H = 16     # heads
const DH = 64    # head dim
const D = H * DH # model dim
const F = 4 * D  # FFN hidden dim

func layer_norm(x: f32[B, S, D], g: f32[D], b: f32[D]) -> f32[B, S, D] {
  mu = mean(x, axis=-1, keepdims=true)
  xc = x - mu
  var = mean(xc * xc, axis=-1, keepdims=true)
  return xc * rsqrt(var + 1e-5) * g + b
}

func layer(x: f32[B, S, D],
           ln1_g: f32[D], ln1_b: f32[D],
           wq: f32[D, D], wk: f32[D, D], wv: f32[D, D], wo: f32[D, D],
           ln2_g: f32[D], ln2_b: f32[D],
           w1: f32[D, F], b1: f32[F], w2: f32[F, D], b2: f32[D]) -> f32[B, S, D] {
  h = layer_norm(x, ln1_g, ln1_b)
  q = reshape(h @ wq, [B, S, H, DH])
  k = reshape(h @ wk, [B, S, H, DH])
  v = reshape(h @ wv, [B, S, H, DH])
  scores = einsum("bqhd,bkhd->bhqk", q, k) * DH ** -0.5
  scores = shard(scores, {data, model, _, _})
  probs = softmax(scores, axis=-1)
  ctx = einsum("bhqk,bkhd->bqhd", probs, v)
  x = x + reshape(ctx, [B, S, D]) @ wo
  h = layer_norm(x, ln2_g, ln2_b)
  u = gelu(h @ w1 + b1)
  return x + (u @ w2 + b2)
}
"""

LAYER_PARAMS = ("ln1_g: f32[D]", "ln1_b: f32[D]", "wq: f32[D, D] {_, model}", "wk: f32[D, D] {_, model}",
                "wv: f32[D, D] {_, model}", "wo: f32[D, D] {model, _}", "ln2_g: f32[D]", "ln2_b: f32[D]",
                "w1: f32[D, F] {_, model}", "b1: f32[F]", "w2: f32[F, D] {model, _}", "b2: f32[D]")


def transformer_stack(layers: int) -> str:
    """Program text of an embedding-free transformer stack with `layers` layers. Only the input,
    the output and the weight matrices are annotated; norms and biases are left to propagation."""
    params = ["x: f32[B, S, D] {data, _, _}"]
    calls = []
    for i in range(layers):
        names = []
        for p in LAYER_PARAMS:
            name, _, rest = p.partition(":")
            params.append(f"l{i}_{name}:{rest}")
            names.append(f"l{i}_{name}")
        calls.append(f"  x = layer(x, {', '.join(names)})")
    signature = ",\n          ".join(params)
    return (HEADER + f"\nfunc main({signature}) -> f32[B, S, D] {{data, _, _}} {{\n"
            + "\n".join(calls) + "\n  return x\n}\n")


def _median_time(fn, repeat: int):
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def measure(layers: int, repeat: int) -> dict:
    import spmdlang
    from spmdlang.partition.propagate import propagate

    text = transformer_stack(layers)
    lower_s, compiled = _median_time(lambda: spmdlang.compile(text), repeat)
    prog = compiled.program
    prop_s, prop = _median_time(lambda: propagate(prog), repeat)
    return {"layers": layers, "ops": len(prog.ops), "params": len(prog.params),
            "values": sum(1 for _ in prog.values()), "lower_s": lower_s, "propagate_s": prop_s,
            "propagate_us_per_op": 1e6 * prop_s / len(prog.ops), "rounds": prop.rounds,
            "conflicts": len(prop.conflicts)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, nargs="+", default=[16, 32, 64], help="stack depths to time")
    ap.add_argument("--repeat", type=int, default=5, help="runs per stage; the median is reported")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = ap.parse_args(argv)
    rows = [measure(n, args.repeat) for n in args.layers]
    print(f"{'layers':>6} {'ops':>7} {'values':>7} {'lower (s)':>10} {'propagate (s)':>14} "
          f"{'us/op':>7} {'rounds':>7} {'conflicts':>9}")
    for r in rows:
        print(f"{r['layers']:>6} {r['ops']:>7} {r['values']:>7} {r['lower_s']:>10.3f} "
              f"{r['propagate_s']:>14.3f} {r['propagate_us_per_op']:>7.1f} {r['rounds']:>7} "
              f"{r['conflicts']:>9}")
    if args.json:
        doc = {"benchmark": "propagate", "repeat": args.repeat, "python": sys.version.split()[0],
               "machine": platform.machine(), "processor": platform.processor() or platform.machine(),
               "results": rows}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
