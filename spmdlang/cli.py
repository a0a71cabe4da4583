"""The `spmdlang` command (docs/cli.md): a thin shell over spmdlang.compile and its stages.

Exit status: 0 success; 1 the program, its inputs or a diff is wrong; 2 the command line is wrong.
Program errors print `FILE:LINE:COL: error: MESSAGE`, the source line and a caret; never a traceback.
"""

from __future__ import annotations

import argparse
import errno
import json
import math
import os
import re
import sys

from .api import BACKENDS
from .errors import OverrideError, SpmdError
from .ir.core import result_names
from .outfile import OutputPathError, OutputWriteError, write_output

TARGETS = ("ir", "spmd", "jax", "xla")


class UsageError(Exception):
    """Command-line misuse (exit 2)."""


# ---------------------------------------------------------------------------------- argument parsing


def _finite(doc):
    """`doc` with every NaN or infinity as the string "nan", "inf" or "-inf": JSON has no such
    numbers (Python's json writes NaN and -Infinity, which strict parsers refuse)."""
    if isinstance(doc, float) and not math.isfinite(doc):
        return "nan" if math.isnan(doc) else ("inf" if doc > 0 else "-inf")
    if isinstance(doc, dict):
        return {k: _finite(v) for k, v in doc.items()}
    if isinstance(doc, (list, tuple)):
        return [_finite(v) for v in doc]
    return doc


def _json(doc, **kw) -> str:
    return json.dumps(_finite(doc), allow_nan=False, **kw)


def _int(text: str) -> int | None:
    """An integer as Python writes one (digits, `_` between them: 1_000)."""
    return int(text) if re.fullmatch(r"-?\d+(_\d+)*", text) else None


def _number(text: str) -> int | float | None:
    """An integer, or a finite float as Python writes one (1e-3, .5, -2.0)."""
    if _int(text) is not None:
        return int(text)
    try:
        v = float(text)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def _assignments(text: str, what: str, parse=_int, expects="NAME=INT[,NAME=INT...]") -> dict[str, int | float]:
    out: dict[str, int | float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, eq, value = part.partition("=")
        name, value = name.strip(), value.strip()
        number = parse(value) if eq and name and value else None
        if number is None:
            raise argparse.ArgumentTypeError(f"{what} expects {expects}, got '{part}'")
        if name in out:
            raise argparse.ArgumentTypeError(f"{what} names '{name}' twice")
        out[name] = number
    return out


def _mesh_arg(text):
    out = _assignments(text, "--mesh")
    for k, v in out.items():
        if v < 1:
            raise argparse.ArgumentTypeError(f"--mesh {k}={v}: axis sizes must be positive")
    return out


def _set_arg(text):
    return _assignments(text, "--set", _number, "NAME=INT or NAME=FLOAT (finite), comma-separated")


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


def _int_range_arg(text):
    lo, comma, hi = text.partition(",")
    try:
        lo, hi = int(lo), int(hi)
    except ValueError:
        lo = hi = None
    if not comma or lo is None or lo >= hi:
        raise argparse.ArgumentTypeError(f"expected LO,HI with integers LO < HI (draws in [LO, HI)), got '{text}'")
    return lo, hi


_INT_RANGE_HELP = ("random integer inputs in [LO, HI) (default: a parameter used as ids over the dim it indexes, "
                   "other integers in [0, 16))")


def _positive_float(text):
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got '{text}'") from None
    if not math.isfinite(v) or v < 0:
        raise argparse.ArgumentTypeError(f"expected a finite non-negative number, got '{text}'")
    return v


def _size_arg(text):
    from .limits import parse_size

    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _backends_arg(text):
    items = [b.strip() for b in text.split(",") if b.strip()]
    bad = [b for b in items if b not in BACKENDS]
    if bad or not items:
        raise argparse.ArgumentTypeError(f"unknown backend(s) {', '.join(bad) or '(none)'}; "
                                         f"choose from {','.join(BACKENDS)}")
    return items


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="spmdlang", description="A GSPMD-style compiler: one array program, a few sharding annotations, "
        "one per-partition program with collectives.",
        epilog="Reference: docs/language.md (the language) and docs/cli.md (the commands, the Python API and "
        "the emitted module) in spmdlang's source tree. `spmdlang COMMAND --help` lists a command's options.")
    p.add_argument("--version", action="version", version=f"spmdlang {_version()}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    common = _common_options()
    _add_run_commands(sub, common)
    _add_report_commands(sub, common)
    return p


def _common_options() -> argparse.ArgumentParser:
    """The options every command on a program takes."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("file", metavar="FILE", help="a .spmd program, or - to read it from standard input")
    common.add_argument("--mesh", type=_mesh_arg, default={}, metavar="AXIS=SIZE,...",
                        help="override the file's mesh axis sizes")
    common.add_argument("--set", type=_set_arg, default={}, metavar="NAME=VALUE,...", dest="consts",
                        help="override consts: an integer for an integer const, a number for a float const")
    common.add_argument("--entry", metavar="NAME", help="the entry function (default: main)")
    common.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    common.add_argument("--verify", action="store_true",
                        help="check the IR after every pass (as SPMDLANG_VERIFY=1 does); for compiler debugging")
    common.add_argument("--shard-weight-updates", metavar="AXIS", default=None,
                        help="shard every elementwise weight update replicated over AXIS: its gradient is "
                        "reduce-scattered, the update and optimizer state run on a shard, the new weights "
                        "are all-gathered (Xu et al. 2020)")
    return common


def _add_run_commands(sub, common) -> None:
    """check, compile, run, diff."""
    sub.add_parser("check", parents=[common], help="parse, type-check, propagate; every value's type and sharding")
    c = sub.add_parser("compile", parents=[common], help="emit IR, per-partition IR or a jax module")
    c.add_argument("--target", required=True, choices=TARGETS,
                   help="ir: the global IR; spmd: the per-partition IR; jax: our shard_map module; "
                   "xla: the XLA-GSPMD baseline module")
    c.add_argument("-o", dest="output", metavar="PATH", help="write here instead of stdout ('-': stdout)")
    r = sub.add_parser("run", parents=[common], help="run the program on one backend")
    r.add_argument("--backend", required=True, choices=BACKENDS,
                   help="ref: numpy reference; sim: numpy simulation of every device; jax: our shard_map "
                   "module; xla: the XLA-GSPMD baseline")
    r.add_argument("--inputs", metavar="IN.npz", help="inputs keyed by parameter name (default: random)")
    r.add_argument("--seed", type=_count(0), default=0, metavar="N", help="seed for random inputs (default 0)")
    r.add_argument("--int-range", type=_int_range_arg, default=None, metavar="LO,HI", help=_INT_RANGE_HELP)
    r.add_argument("-o", dest="output", metavar="OUT.npz", help="write results as out0, out1, ... ('-': stdout)")
    r.add_argument("--processes", type=_count(1), default=1, metavar="N",
                   help="jax/xla backends: run across N local processes, as on N hosts (default 1)")
    r.add_argument("--max-memory", type=_size_arg, default=None, metavar="SIZE", help=_MAX_MEMORY_HELP)
    r.add_argument("--max-work", type=_count(1), default=None, metavar="N", help=_MAX_WORK_HELP)
    d = sub.add_parser("diff", parents=[common], help="run several backends on the same inputs and compare")
    d.add_argument("--backends", type=_backends_arg, default=list(BACKENDS), metavar="B,...",
                   help=f"backends to compare with ref (default {','.join(BACKENDS)})")
    d.add_argument("--inputs", metavar="IN.npz", help="inputs keyed by parameter name (default: random)")
    d.add_argument("--processes", type=_count(1), default=1, metavar="N",
                   help="run the jax/xla backends across N local processes, as on N hosts (default 1)")
    d.add_argument("--seed", type=_count(0), default=0, metavar="N", help="seed for random inputs (default 0)")
    d.add_argument("--int-range", type=_int_range_arg, default=None, metavar="LO,HI", help=_INT_RANGE_HELP)
    d.add_argument("--rtol", type=_positive_float, default=None, metavar="R",
                   help="relative tolerance (default: by the narrowest float the program uses, f32 1e-4)")
    d.add_argument("--atol", type=_positive_float, default=None, metavar="A",
                   help="absolute tolerance, times max(1, max|ref|) (default: as --rtol's)")
    d.add_argument("--max-memory", type=_size_arg, default=None, metavar="SIZE", help=_MAX_MEMORY_HELP)
    d.add_argument("--max-work", type=_count(1), default=None, metavar="N", help=_MAX_WORK_HELP)


def _add_report_commands(sub, common) -> None:
    """explain, bench, autoshard, import, ops."""
    e = sub.add_parser("explain", parents=[common], help="why each sharding, what each collective costs")
    e.add_argument("--show", metavar="NAME", action="append", default=[],
                   help="draw this value's layout over the devices (repeatable)")
    e.add_argument("--bandwidth", type=_mesh_bw_arg, default={}, metavar="AXIS=GBPS,...",
                   help="link bandwidth per mesh axis in GB/s (default: --preset's)")
    e.add_argument("--latency", type=_mesh_bw_arg, default={}, metavar="AXIS=US,...",
                   help="per-collective latency per mesh axis in microseconds")
    e.add_argument("--preset", choices=("tpu-v4", "gpu-nvlink"), default="tpu-v4",
                   help="alpha-beta defaults (default tpu-v4)")
    e.add_argument("--xla", action="store_true",
                   help="also compile with jax and show XLA's cost_analysis() and memory_analysis() "
                   "beside our estimates")
    b = sub.add_parser("bench", parents=[common], help="time our jax module against the XLA baseline")
    b.add_argument("--seed", type=_count(0), default=0, metavar="N", help="seed for random inputs (default 0)")
    b.add_argument("--int-range", type=_int_range_arg, default=None, metavar="LO,HI", help=_INT_RANGE_HELP)
    b.add_argument("--repeat", type=_count(1), default=20, metavar="N",
                   help="timed calls of each side per round, after warm-up (default 20)")
    b.add_argument("--rounds", type=_count(1), default=5, metavar="N",
                   help="rounds of ours and XLA called in turn; the ratio's spread is over rounds (default 5)")
    b.add_argument("--max-memory", type=_size_arg, default=None, metavar="SIZE", help=_MAX_MEMORY_HELP)
    b.add_argument("--max-work", type=_count(1), default=None, metavar="N", help=_MAX_WORK_HELP)
    a = sub.add_parser("autoshard", parents=[common],
                       help="choose the missing annotations (a search over strategies) and write them in")
    a.add_argument("--memory-per-device", type=_size_arg, default=None, metavar="BYTES", dest="memory",
                   help="peak memory per device the plan must fit (e.g. 4G, 512M, 1000000; default: no limit)")
    a.add_argument("--solver", choices=("auto", "ilp", "greedy"), default="auto",
                   help="ilp: the integer program (HiGHS through scipy); greedy: the fast heuristic; "
                   "auto: the ILP unless the problem is too large or scipy is missing (default)")
    a.add_argument("-o", dest="output", metavar="OUT.spmd",
                   help="write the annotated program here (default: standard output, the report on "
                   "standard error)")
    im = sub.add_parser("import", help="trace a jax function and write the equivalent .spmd program",
                        description="Trace FUNCTION of FILE.py with jax and write the equivalent .spmd program. "
                        "FILE.py defines FUNCTION, FUNCTION_args() returning the example arguments, and may "
                        "define FUNCTION_specs() (in_specs: PartitionSpecs, a pytree prefix of the arguments) "
                        "and MESH ({axis: size}). The program is compiled before it is written; nothing is "
                        "written if anything fails.")
    im.add_argument("target", metavar="FILE.py:FUNCTION", help="the jax function to import")
    im.add_argument("-o", dest="output", metavar="OUT.spmd", help="write here (default: standard output)")
    im.add_argument("--mesh", type=_mesh_arg, default={}, metavar="AXIS=SIZE,...",
                    help="the mesh (default: FILE.py's MESH, else the arguments' shardings' mesh, else data=1)")
    o = sub.add_parser("ops", help="list every primitive of the op table with its sharding rule and doc")
    o.add_argument("--json", action="store_true", help="machine-readable output on stdout")


_MAX_MEMORY_HELP = ("refuse to run when the estimated peak memory exceeds SIZE (e.g. 4G, 512M; "
                    "default: the memory available now)")
_MAX_WORK_HELP = ("refuse to run more than N ops, a loop body counted once per iteration (sim: times the "
                  "devices; default: ref 10,000,000, sim 500,000, jax and xla 1,000,000,000)")


def _version() -> str:
    from . import __version__

    return __version__


def _mesh_bw_arg(text):
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, eq, value = part.partition("=")
        try:
            v = float(value)
        except ValueError:
            v = -1
        if not eq or not name.strip() or not math.isfinite(v) or v <= 0:
            raise argparse.ArgumentTypeError(f"expected AXIS=NUMBER[,...] with finite positive numbers, got '{part}'")
        out[name.strip()] = v
    return out


# ---------------------------------------------------------------------------------- commands


STDIN_NAME = "<stdin>"


def _compile(args):
    from .api import compile as compile_program

    if args.file == "-":
        return compile_program(_read_stdin(), mesh=args.mesh, consts=args.consts, entry=args.entry,
                               filename=STDIN_NAME, verify=True if args.verify else None,
                               shard_weight_updates=args.shard_weight_updates)
    if not os.path.exists(args.file):
        raise UsageError(f"no such file: '{args.file}'")
    if os.path.isdir(args.file):
        raise UsageError(f"'{args.file}' is a directory, not a .spmd file")
    return compile_program(args.file, mesh=args.mesh, consts=args.consts, entry=args.entry,
                           verify=True if args.verify else None, shard_weight_updates=args.shard_weight_updates)


def _read_stdin() -> str:
    """The program text from standard input, checked as read_source checks a file."""
    from .errors import Source, Span
    from .limits import MAX_SOURCE_BYTES, format_bytes

    stream = sys.stdin.buffer if hasattr(sys.stdin, "buffer") else None
    data = stream.read(MAX_SOURCE_BYTES + 1) if stream else sys.stdin.read(MAX_SOURCE_BYTES + 1).encode()
    where = Span(Source(STDIN_NAME, ""), 1, 1)
    if len(data) > MAX_SOURCE_BYTES:
        raise SpmdError(f"standard input is longer than {format_bytes(MAX_SOURCE_BYTES)}, the most accepted", where)
    if b"\x00" in data:
        raise SpmdError("standard input is binary, not spmdlang source text", where)
    try:
        text = data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as e:
        raise SpmdError(f"standard input is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})",
                        where) from None
    if not text.strip():
        raise SpmdError("standard input is empty: expected a mesh declaration and a function", where)
    return text


def _console(stderr: bool = False):
    from rich.console import Console

    return Console(highlight=False, stderr=stderr)


def cmd_check(args) -> int:
    c = _compile(args)
    report = c.check_report()
    if args.json:
        print(_json(report, indent=2))
        return 0
    from .explain import render_check

    render_check(_console(), c, report)
    return 0


def cmd_compile(args) -> int:
    c = _compile(args)
    text = {"ir": lambda: c.ir, "spmd": lambda: c.spmd_ir, "jax": lambda: c.jax_source,
            "xla": lambda: c.xla_source}[args.target]()
    if args.output:
        write_output(args.output, text.encode())
        if args.json:  # (with `-o -` the text owns stdout: the document goes to stderr, as run's does)
            print(_json({"target": args.target, "output": args.output}),
                  file=sys.stderr if args.output == "-" else sys.stdout)
    elif args.json:
        print(_json({"target": args.target, "text": text}))
    else:
        sys.stdout.write(text)
    return 0


def _inputs(c, args):
    if getattr(args, "inputs", None):
        from .inputs import load_npz

        return c.check_inputs(load_npz(args.inputs, c.program), origin=args.inputs)
    return c.random_inputs(args.seed, int_range=args.int_range)


def _nonfinite_notes(outs, names) -> list[str]:
    import numpy as np

    notes = []
    for name, a in zip(names, outs):
        if a.size and (a.dtype.kind == "f" or a.dtype.name == "bfloat16"):
            bad = int(np.count_nonzero(~np.isfinite(np.asarray(a, dtype=np.float64))))
            if bad:
                notes.append(f"{name} has {bad} non-finite value{'s' if bad > 1 else ''} (inf or nan) "
                             f"of {a.size}")
    return notes


def cmd_run(args) -> int:
    import numpy as np

    c = _compile(args)
    if args.processes > 1 and args.backend not in ("jax", "xla"):
        raise UsageError(f"--processes {args.processes} needs --backend jax or xla")
    c.check_memory(args.backend, args.max_memory, args.max_work)  # before drawing inputs
    outs = c.run(_inputs(c, args), backend=args.backend, processes=args.processes, max_memory=args.max_memory,
                 max_work=args.max_work, isolate=args.backend == "xla")  # (XLA may abort on the baseline)
    if args.output:
        import io

        buf = io.BytesIO()
        np.savez(buf, **dict(zip(result_names(c.program, "out"), outs)))  # out0, out1.emb (a struct's leaves)
        write_output(args.output, buf.getvalue())
    notes = _nonfinite_notes(outs, result_names(c.program, "out"))
    names = result_names(c.program, "out")
    summary = [{"output": i, "name": names[i], "type": str(r.value.type), "shape": list(a.shape),
                "dtype": str(a.dtype), "sum": float(np.asarray(a, dtype=np.float64).sum()) if a.size else 0.0}
               for i, (r, a) in enumerate(zip(c.program.results, outs))]
    to_stdout = args.output != "-"  # with `-o -` the results' bytes own stdout; the summary goes to stderr
    if args.json:
        doc = {"backend": args.backend, "outputs": summary, "file": args.output}
        if notes:
            doc["notes"] = notes
        print(_json(doc), file=sys.stdout if to_stdout else sys.stderr)
        return 0
    from rich.text import Text

    con = _console(stderr=not to_stdout)
    for s, a in zip(summary, outs):
        con.print(Text.assemble((s["name"], "bold"), f": {s['type']}  (backend {args.backend})"))
        with np.printoptions(threshold=64, edgeitems=3, precision=5, suppress=True):
            con.print(str(np.asarray(a, dtype=np.float64 if a.dtype.kind == "f" else a.dtype)), markup=False)
    if args.output and to_stdout:
        con.print(f"wrote {args.output}")
    for n in notes:
        print(f"note: {n}", file=sys.stderr)
    return 0


def cmd_diff(args) -> int:
    c = _compile(args)
    for b in ["ref", *args.backends]:
        c.check_memory(b, args.max_memory, args.max_work)
    report = c.diff(_inputs(c, args), backends=args.backends, rtol=args.rtol, atol=args.atol,
                    processes=args.processes, max_memory=args.max_memory, max_work=args.max_work,
                    isolate_xla=True)  # (XLA's partitioner may abort on the baseline: that row's error)
    if args.json:
        print(_json(report, indent=2))
    else:
        from .explain import render_diff

        render_diff(_console(), report)
        for n in report.get("notes", []):
            print(f"note: {n}", file=sys.stderr)
    return 0 if report["ok"] else 1


def cmd_explain(args) -> int:
    c = _compile(args)
    from .explain import find_value

    for name in args.show:  # before anything is printed
        try:
            find_value(c, name)
        except SpmdError as e:
            raise UsageError(e.message) from None
    unknown = [a for a in args.bandwidth if a not in c.mesh.names]
    if unknown:
        raise UsageError(f"--bandwidth: the mesh has no axis {unknown[0]!r} (its axes: {', '.join(c.mesh.names)})")
    report = c.explain_report(bandwidth=args.bandwidth, latency=args.latency, preset=args.preset)
    if args.xla:
        from .explain import xla_analysis

        report["xla"] = xla_analysis(c)
    if args.json:
        print(_json(report, indent=2))
        return 0
    from .explain import render_explain, render_xla

    console = _console()
    render_explain(console, c, report, show=args.show)
    if args.xla:
        render_xla(console, report)
    return 0


def cmd_bench(args) -> int:
    c = _compile(args)
    for b in ("jax", "xla"):
        c.check_memory(b, args.max_memory, args.max_work)
    from .backend_jax.bench import bench
    from .explain import render_bench

    report = bench(c, seed=args.seed, repeat=args.repeat, progress=not args.json, rounds=args.rounds,
                   int_range=args.int_range)
    if args.json:
        print(_json(report, indent=2))
    else:
        render_bench(_console(), report)
    return 0


def cmd_autoshard(args) -> int:
    from .autoshard import autoshard, render_autoshard

    if args.file == "-":
        text, filename = _read_stdin(), STDIN_NAME
    else:
        if not os.path.exists(args.file):
            raise UsageError(f"no such file: '{args.file}'")
        if os.path.isdir(args.file):
            raise UsageError(f"'{args.file}' is a directory, not a .spmd file")
        from .api import read_source

        text, filename = read_source(args.file), args.file
    result = autoshard(text, mesh=args.mesh, consts=args.consts, entry=args.entry, filename=filename,
                       memory_per_device=args.memory, method=args.solver)
    report = result.report()
    if args.output and args.output != "-":
        write_output(args.output, result.source.encode())
        report["output"] = args.output
    if args.json:
        print(_json(report, indent=2))
        return 0
    if args.output and args.output != "-":
        render_autoshard(_console(), report)
    else:
        sys.stdout.write(result.source)
        render_autoshard(_console(stderr=True), report)
    return 0


def cmd_import(args) -> int:
    from .importer.load import TargetError, import_target

    try:
        imp = import_target(args.target, args.mesh or None)
    except TargetError as e:
        raise UsageError(str(e)) from None
    imp.compile()  # a program that does not compile is not written
    if args.output and args.output != "-":
        write_output(args.output, imp.source.encode())
    else:
        sys.stdout.write(imp.source)
    return 0


def cmd_ops(args) -> int:
    from .oplist import ops_report, render_ops

    entries = ops_report()
    sys.stdout.write(_json(entries, indent=2) + "\n" if args.json else render_ops(entries))
    return 0


COMMANDS = {"check": cmd_check, "compile": cmd_compile, "run": cmd_run, "diff": cmd_diff,
            "explain": cmd_explain, "bench": cmd_bench, "ops": cmd_ops, "autoshard": cmd_autoshard,
            "import": cmd_import}


_WRITE_ERRNOS = {errno.ENOSPC, errno.EPIPE, errno.EIO, errno.EDQUOT, errno.EFBIG}


def _run_command(args) -> int:
    """The command itself, on the compiler's deep-stack thread: numpy's floating-point warnings
    (overflow to inf and the like) stay off the terminal; non-finite results are reported as notes."""
    import numpy as np

    with np.errstate(all="ignore"):
        code = COMMANDS[args.command](args)
    sys.stdout.flush()  # a full disk or a closed pipe shows here, not at interpreter exit
    return code


def _silence_stdout() -> None:
    """After stdout failed, point it at /dev/null so the interpreter's final flush stays quiet."""
    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, sys.stdout.fileno())
        os.close(fd)
    except (OSError, ValueError, AttributeError):
        pass


def main(argv=None) -> int:
    import warnings

    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "output", None) == "":  # (only '-' means standard output)
        parser.error("-o: the path is empty")
    from .limits import deep_call

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return deep_call(_run_command, args)
    except OverrideError as e:  # --mesh / --set name something the program lacks: the command line is wrong
        where = f" ({e.span.file}:{e.span.line})" if e.span and e.span.source and e.span.source.text else ""
        parser.print_usage(sys.stderr)
        print(f"spmdlang {args.command}: error: {e.message}{where}", file=sys.stderr)
        return 2
    except SpmdError as e:
        print(e.render(), file=sys.stderr)
        return 1
    except (UsageError, OutputPathError) as e:
        parser.print_usage(sys.stderr)
        print(f"spmdlang: error: {e}", file=sys.stderr)
        return 2
    except OutputWriteError as e:
        print(f"spmdlang: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("spmdlang: interrupted", file=sys.stderr)
        return 130
    except MemoryError:
        print("spmdlang: error: out of memory; the estimate that --max-memory checks was too low for this run",
              file=sys.stderr)
        return 1
    except OSError as e:
        if e.errno not in _WRITE_ERRNOS:
            return _internal_error(e)
        _silence_stdout()
        print(f"spmdlang: error: cannot write the output: {e.strerror or e}", file=sys.stderr)
        return 1
    except Exception as e:  # noqa: BLE001  (a compiler bug: say so plainly, no traceback)
        return _internal_error(e)


def _internal_error(e: Exception) -> int:
    if os.environ.get("SPMDLANG_DEBUG"):
        raise e
    print(f"spmdlang: internal error: {type(e).__name__}: {e}\n"
          "This is a bug in spmdlang; rerun with SPMDLANG_DEBUG=1 for a traceback.", file=sys.stderr)
    return 3


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
