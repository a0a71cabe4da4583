"""A random program campaign: N programs of tests/progen.py on ref, sim and jax, each classified.

    python tests/campaign.py --count 10000 --start 0 --backends ref,sim,jax --jobs 8 --out campaign.json
    python -m tests.campaign ...          (the same, from the repository root)

Seed s draws one program with Generator(RandomChooser(s), max_devices, wild=True): a plain
program, one with loops, a gradient program, or a gradient program with loops, in turn by s % 4.
Its inputs are `hostile_inputs`: NaN and +-inf in some float parameters, ids and starts out of
range (negative, past the end, +-2^31, 2^32 + 1, 2^63 - 1 for i64 ones). Each program is
compiled, run on every backend and compared with ref (`Compiled.diff`), and classified:

  ok       every backend equals ref (floats to the diff's tolerance, NaNs in the same places)
  wrong    a backend ran and disagrees with ref: a wrong answer
  error    a located SpmdError: the generator's programs must compile and run, so a bug too
  crash    any other exception (a traceback), or the worker process died (signal, out of memory)
  hang     the program took more than --timeout seconds; its worker is killed and replaced

Programs run in --jobs worker processes (each imports jax once, with 64 virtual CPU devices),
each program under its own timeout; a worker is replaced after --recycle programs, so memory
cannot creep. The summary (counts, failing seeds by class with a one-line reason) is printed
and, with --out, written as JSON; --out also makes the run resumable: seeds already in the file
are not run again, and the file is rewritten as results come in. A failing seed reproduces with
--start SEED --count 1 --verbose.
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import subprocess
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
KINDS = ("program", "loops", "grad", "grad_loops")
CLASSES = ("ok", "wrong", "error", "crash", "hang")


def program_for(seed: int, max_devices: int) -> tuple[str, str, set[str]]:
    """(kind, source, index parameters) of seed's program."""
    sys.path.insert(0, str(HERE))
    from progen import Generator, RandomChooser

    kind = KINDS[seed % len(KINDS)]
    gen = Generator(RandomChooser(seed), max_devices=max_devices, grad=kind.startswith("grad"),
                    loops=kind.endswith("loops"), wild=True)
    src = gen.grad_program() if kind.startswith("grad") else gen.program()
    return kind, src, gen.index_params


def run_one(seed: int, backends: list[str], max_devices: int) -> dict:
    """Compile, run and compare seed's program; never raises."""
    import spmdlang
    from spmdlang.errors import SpmdError

    sys.path.insert(0, str(HERE))
    from progen import hostile_inputs, special_floats

    out = {"seed": seed}
    t0 = time.perf_counter()
    try:
        kind, src, index_params = program_for(seed, max_devices)
        out["kind"] = kind
        c = spmdlang.compile(src)
        inputs = hostile_inputs(c.program, index_params, seed, special_floats(src, c))
        tol = 3e-2 if "bf16" in src else None
        d = c.diff(inputs, backends=[b for b in backends if b != "ref"] or ["ref"], rtol=tol, atol=tol)
        if d["ok"]:
            out["class"] = "ok"
        else:
            bad = [r for r in d["results"] if not r["ok"]]
            out["class"] = "wrong"
            out["reason"] = "; ".join(f"{r['backend']} out{r['output']} off by {r['max_abs_err']}" for r in bad[:4])
    except SpmdError as e:
        out["class"], out["reason"] = "error", str(e).splitlines()[0][:300]
    except Exception as e:  # noqa: BLE001 - anything else is a crash, classified, never raised
        out["class"] = "crash"
        out["reason"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"
        out["traceback"] = traceback.format_exc()[-2000:]
    out["seconds"] = round(time.perf_counter() - t0, 2)
    return out


def worker(backends: list[str], max_devices: int) -> None:
    """Read seeds from stdin, one per line; write one JSON result per line."""
    for line in sys.stdin:
        seed = int(line)
        print(json.dumps(run_one(seed, backends, max_devices)), flush=True)


class Worker:
    def __init__(self, args):
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--backends", args.backends,
               "--max-devices", str(args.max_devices)]
        env = dict(os.environ)
        if "device_count" not in env.get("XLA_FLAGS", ""):
            env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=64").strip()
        env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent)] + [p for p in [env.get("PYTHONPATH")] if p])
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True, bufsize=1, env=env, cwd=str(HERE.parent))
        self.seed = None
        self.started = 0.0
        self.done = 0

    def give(self, seed: int) -> None:
        self.seed, self.started = seed, time.monotonic()
        self.proc.stdin.write(f"{seed}\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def _load(path: Path | None) -> dict[int, dict]:
    if path is None or not path.exists():
        return {}
    data = json.loads(path.read_text())
    return {int(r["seed"]): r for r in data.get("programs", [])}


def summary(results: dict[int, dict], args, seconds: float) -> dict:
    counts = {c: 0 for c in CLASSES}
    failing: dict[str, list] = {c: [] for c in CLASSES if c != "ok"}
    for seed in sorted(results):
        r = results[seed]
        counts[r["class"]] += 1
        if r["class"] != "ok":
            failing[r["class"]].append({"seed": seed, "kind": r.get("kind"), "reason": r.get("reason", "")})
    return {"command": " ".join(sys.argv), "start": args.start, "count": args.count, "backends": args.backends,
            "max_devices": args.max_devices, "timeout_s": args.timeout, "counts": counts,
            "failing": failing, "seconds": round(seconds, 1),
            "programs": [results[s] for s in sorted(results)]}


def _write(path: Path | None, data: dict) -> None:
    if path is None:
        return
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)


def campaign(args) -> dict:
    out = Path(args.out) if args.out else None
    results = _load(out)
    todo = [s for s in range(args.start, args.start + args.count) if s not in results]
    t0 = time.monotonic()
    workers: list[Worker] = []
    sel = selectors.DefaultSelector()
    pending = list(reversed(todo))
    last_write = 0.0

    def start_worker():
        w = Worker(args)
        workers.append(w)
        sel.register(w.proc.stdout, selectors.EVENT_READ, w)
        return w

    def retire(w: Worker):
        sel.unregister(w.proc.stdout)
        w.stop()
        workers.remove(w)

    def feed(w: Worker):
        if pending:
            w.give(pending.pop())
        else:
            retire(w)

    def record(r: dict):
        nonlocal last_write
        results[r["seed"]] = r
        if r["class"] != "ok" or args.verbose:
            print(f"seed {r['seed']} ({r.get('kind')}): {r['class']} {r.get('reason', '')}", flush=True)
            if args.verbose and r.get("traceback"):
                print(r["traceback"], flush=True)
        n = len(results)
        if n % 50 == 0:
            print(f"... {n} programs, {time.monotonic() - t0:.0f} s", flush=True)
        if time.monotonic() - last_write > 10:
            _write(out, summary(results, args, time.monotonic() - t0))
            last_write = time.monotonic()

    for _ in range(min(args.jobs, len(pending))):
        feed(start_worker())
    while workers:
        for key, _ in sel.select(timeout=1.0):
            w = key.data
            line = w.proc.stdout.readline()
            if not line:  # the worker died: a crash of its program
                seed = w.seed
                code = w.proc.wait()
                record({"seed": seed, "kind": KINDS[seed % len(KINDS)], "class": "crash",
                        "reason": f"the worker process died (exit {code})",
                        "seconds": round(time.monotonic() - w.started, 2)})
                retire(w)
                feed(start_worker())
                continue
            r, took = json.loads(line), time.monotonic() - w.started
            if took > args.timeout:  # the result came in after the deadline: a hang all the same
                r = {"seed": w.seed, "kind": KINDS[w.seed % len(KINDS)], "class": "hang",
                     "reason": f"no result in {args.timeout} s", "seconds": round(took, 2)}
            record(r)
            w.done += 1
            if w.done >= args.recycle and pending:
                retire(w)
                feed(start_worker())
            else:
                feed(w)
        now = time.monotonic()
        for w in list(workers):
            if w.seed is not None and now - w.started > args.timeout:
                record({"seed": w.seed, "kind": KINDS[w.seed % len(KINDS)], "class": "hang",
                        "reason": f"no result in {args.timeout} s", "seconds": round(now - w.started, 2)})
                retire(w)
                if pending:
                    feed(start_worker())
    data = summary(results, args, time.monotonic() - t0)
    _write(out, data)
    return data


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="campaign", description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=100, help="programs to run (default 100)")
    ap.add_argument("--start", type=int, default=0, help="first seed (default 0)")
    ap.add_argument("--backends", default="ref,sim,jax", help="compared with ref (default ref,sim,jax)")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per program before it is a hang")
    ap.add_argument("--max-devices", type=int, default=16, help="largest mesh drawn (default 16)")
    ap.add_argument("--recycle", type=int, default=200, help="programs per worker before it is replaced")
    ap.add_argument("--out", help="JSON summary file; seeds already in it are skipped (resume)")
    ap.add_argument("--verbose", action="store_true", help="print every program's result and tracebacks")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if args.worker:
        worker(backends, args.max_devices)
        return 0
    data = campaign(args)
    c = data["counts"]
    print(f"{sum(c.values())} programs (seeds {args.start}..{args.start + args.count - 1}, "
          f"{args.backends}): " + ", ".join(f"{k} {v}" for k, v in c.items()) + f" in {data['seconds']} s")
    for cls, rows in data["failing"].items():
        if rows:
            print(f"{cls}: " + " ".join(str(r["seed"]) for r in rows))
    return 0 if all(c[k] == 0 for k in CLASSES if k != "ok") else 1


if __name__ == "__main__":
    sys.exit(main())
