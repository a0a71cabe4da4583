"""The `spmdlang` command (see CLI.md): a thin shell over spmdlang.compile and its stages.

Exit status: 0 success; 1 the program, its inputs or a diff is wrong; 2 the command line is wrong.
Program errors print `FILE:LINE:COL: error: MESSAGE`, the source line and a caret; never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

from .api import BACKENDS
from .errors import OverrideError, SpmdError

TARGETS = ("ir", "spmd", "jax", "xla")


class UsageError(Exception):
    """Command-line misuse (exit 2)."""


# ---------------------------------------------------------------------------------- argument parsing


def _assignments(text: str, what: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, eq, value = part.partition("=")
        name, value = name.strip(), value.strip()
        if not eq or not name or not value.lstrip("-").isdigit():
            raise argparse.ArgumentTypeError(f"{what} expects NAME=INT[,NAME=INT...], got '{part}'")
        if name in out:
            raise argparse.ArgumentTypeError(f"{what} names '{name}' twice")
        out[name] = int(value)
    return out


def _mesh_arg(text):
    out = _assignments(text, "--mesh")
    for k, v in out.items():
        if v < 1:
            raise argparse.ArgumentTypeError(f"--mesh {k}={v}: axis sizes must be positive")
    return out


def _set_arg(text):
    return _assignments(text, "--set")


def _count(minimum: int):
    def parse(text):
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got '{text}'") from None
        if v < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {v}")
        return v

    return parse


def _positive_float(text):
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got '{text}'") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative number, got '{text}'")
    return v


def _backends_arg(text):
    items = [b.strip() for b in text.split(",") if b.strip()]
    bad = [b for b in items if b not in BACKENDS]
    if bad or not items:
        raise argparse.ArgumentTypeError(f"unknown backend(s) {', '.join(bad) or '(none)'}; "
                                         f"choose from {','.join(BACKENDS)}")
    return items


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("file", metavar="FILE", help="a .spmd program")
    common.add_argument("--mesh", type=_mesh_arg, default={}, metavar="AXIS=SIZE,...",
                        help="override the file's mesh axis sizes")
    common.add_argument("--set", type=_set_arg, default={}, metavar="NAME=INT,...", dest="consts",
                        help="override integer consts")
    common.add_argument("--entry", metavar="NAME", help="the entry function (default: main)")
    common.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    common.add_argument("--verify", action="store_true",
                        help="check the IR after every pass (as SPMDLANG_VERIFY=1 does); for compiler debugging")

    p = argparse.ArgumentParser(prog="spmdlang", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    sub.add_parser("check", parents=[common], help="parse, type-check, propagate; every value's type and sharding")
    c = sub.add_parser("compile", parents=[common], help="emit IR, per-partition IR or a jax module")
    c.add_argument("--target", required=True, choices=TARGETS)
    c.add_argument("-o", dest="output", metavar="PATH", help="write here instead of stdout")
    r = sub.add_parser("run", parents=[common], help="run the program on one backend")
    r.add_argument("--backend", required=True, choices=BACKENDS)
    r.add_argument("--inputs", metavar="IN.npz", help="inputs keyed by parameter name (default: random)")
    r.add_argument("--seed", type=_count(0), default=0, help="seed for random inputs (default 0)")
    r.add_argument("-o", dest="output", metavar="OUT.npz", help="write results as out0, out1, ...")
    d = sub.add_parser("diff", parents=[common], help="run several backends on the same inputs and compare")
    d.add_argument("--backends", type=_backends_arg, default=list(BACKENDS), metavar="B,...")
    d.add_argument("--inputs", metavar="IN.npz")
    d.add_argument("--seed", type=_count(0), default=0)
    d.add_argument("--rtol", type=_positive_float, default=None)
    d.add_argument("--atol", type=_positive_float, default=None)
    e = sub.add_parser("explain", parents=[common], help="why each sharding, what each collective costs")
    e.add_argument("--show", metavar="NAME", action="append", default=[],
                   help="draw this value's layout over the devices (repeatable)")
    e.add_argument("--bandwidth", type=_mesh_bw_arg, default={}, metavar="AXIS=GBPS,...",
                   help="link bandwidth per mesh axis in GB/s (default: --preset's)")
    e.add_argument("--latency", type=_mesh_bw_arg, default={}, metavar="AXIS=US,...",
                   help="per-collective latency per mesh axis in microseconds")
    e.add_argument("--preset", choices=("tpu-v4", "gpu-nvlink"), default="tpu-v4",
                   help="alpha-beta defaults (default tpu-v4)")
    b = sub.add_parser("bench", parents=[common], help="time our jax module against the XLA baseline")
    b.add_argument("--seed", type=_count(0), default=0)
    b.add_argument("--repeat", type=_count(1), default=20, help="timed runs after warm-up (default 20)")
    o = sub.add_parser("ops", help="list every primitive of the op table with its sharding rule and doc")
    o.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    return p


def _mesh_bw_arg(text):
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, eq, value = part.partition("=")
        try:
            v = float(value)
        except ValueError:
            v = -1
        if not eq or not name.strip() or v <= 0:
            raise argparse.ArgumentTypeError(f"expected AXIS=NUMBER[,...] with positive numbers, got '{part}'")
        out[name.strip()] = v
    return out


# ---------------------------------------------------------------------------------- commands


def _compile(args):
    from .api import compile as compile_program

    if not os.path.exists(args.file):
        raise UsageError(f"no such file: '{args.file}'")
    if os.path.isdir(args.file):
        raise UsageError(f"'{args.file}' is a directory, not a .spmd file")
    return compile_program(args.file, mesh=args.mesh, consts=args.consts, entry=args.entry,
                           verify=True if args.verify else None)


def _write_atomic(path: str, data: bytes) -> None:
    """Write all or nothing: a temp file in the same directory, renamed into place."""
    if os.path.isdir(path):
        raise UsageError(f"cannot write '{path}': it is a directory")
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise UsageError(f"cannot write '{path}': no such directory '{directory}'")
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".spmdlang-")
    except OSError as e:
        raise UsageError(f"cannot write '{path}': {e.strerror or e}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _console():
    from rich.console import Console

    return Console(highlight=False)


def cmd_check(args) -> int:
    c = _compile(args)
    report = c.check_report()
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    from .explain import render_check

    render_check(_console(), c, report)
    return 0


def cmd_compile(args) -> int:
    c = _compile(args)
    text = {"ir": lambda: c.ir, "spmd": lambda: c.spmd_ir, "jax": lambda: c.jax_source,
            "xla": lambda: c.xla_source}[args.target]()
    if args.output:
        _write_atomic(args.output, text.encode())
        if args.json:
            print(json.dumps({"target": args.target, "output": args.output}))
    elif args.json:
        print(json.dumps({"target": args.target, "text": text}))
    else:
        sys.stdout.write(text)
    return 0


def _inputs(c, args):
    if getattr(args, "inputs", None):
        from .inputs import load_npz

        return c.check_inputs(load_npz(args.inputs), origin=args.inputs)
    return c.random_inputs(args.seed)


def cmd_run(args) -> int:
    import numpy as np

    c = _compile(args)
    outs = c.run(_inputs(c, args), backend=args.backend)
    if args.output:
        import io

        buf = io.BytesIO()
        np.savez(buf, **{f"out{i}": a for i, a in enumerate(outs)})
        _write_atomic(args.output, buf.getvalue())
    summary = [{"output": i, "type": str(r.value.type), "shape": list(a.shape), "dtype": str(a.dtype),
                "sum": float(np.asarray(a, dtype=np.float64).sum()) if a.size else 0.0}
               for i, (r, a) in enumerate(zip(c.program.results, outs))]
    if args.json:
        print(json.dumps({"backend": args.backend, "outputs": summary, "file": args.output}))
        return 0
    con = _console()
    for s, a in zip(summary, outs):
        con.print(f"[bold]out{s['output']}[/bold]: {s['type']}  (backend {args.backend})")
        with np.printoptions(threshold=64, edgeitems=3, precision=5, suppress=True):
            con.print(str(np.asarray(a, dtype=np.float64 if a.dtype.kind == "f" else a.dtype)), markup=False)
    if args.output:
        con.print(f"wrote {args.output}")
    return 0


def cmd_diff(args) -> int:
    c = _compile(args)
    report = c.diff(_inputs(c, args), backends=args.backends, rtol=args.rtol, atol=args.atol)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        from .explain import render_diff

        render_diff(_console(), report)
    return 0 if report["ok"] else 1


def cmd_explain(args) -> int:
    c = _compile(args)
    report = c.explain_report(bandwidth=args.bandwidth, latency=args.latency, preset=args.preset)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    from .explain import render_explain

    render_explain(_console(), c, report, show=args.show)
    return 0


def cmd_bench(args) -> int:
    c = _compile(args)
    from .backend_jax.bench import bench, render_bench

    report = bench(c, seed=args.seed, repeat=args.repeat, progress=not args.json)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        render_bench(_console(), report)
    return 0


def cmd_ops(args) -> int:
    from .oplist import ops_report, render_ops

    entries = ops_report()
    sys.stdout.write(json.dumps(entries, indent=2) + "\n" if args.json else render_ops(entries))
    return 0


COMMANDS = {"check": cmd_check, "compile": cmd_compile, "run": cmd_run, "diff": cmd_diff,
            "explain": cmd_explain, "bench": cmd_bench, "ops": cmd_ops}


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except SpmdError as e:
        print(e.render(), file=sys.stderr)
        return 2 if isinstance(e, OverrideError) else 1
    except UsageError as e:
        parser.print_usage(sys.stderr)
        print(f"spmdlang: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("spmdlang: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as e:  # noqa: BLE001  (a compiler bug: say so plainly, no traceback)
        if os.environ.get("SPMDLANG_DEBUG"):
            raise
        print(f"spmdlang: internal error: {type(e).__name__}: {e}\n"
              "This is a bug in spmdlang; rerun with SPMDLANG_DEBUG=1 for a traceback.", file=sys.stderr)
        return 3


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
