"""Resource limits: what spmdlang refuses, before it runs out of memory, stack or patience.

Every limit here ends in a located `SpmdError` (exit 1) or a usage error naming the flag (exit 2),
never a crash. The limits (also listed in docs/cli.md, "Limits"):

  source file                 at most MAX_SOURCE_BYTES, checked before it is read
  nesting                     expressions and blocks nest at most MAX_NESTING deep, and calls to
                              user functions at most MAX_CALL_DEPTH deep (they are inlined)
  unrolling / inlining        MAX_UNROLLED `for` iterations and MAX_OPS operations, counted while
                              lowering
  tensors                     rank at most MAX_RANK (numpy's limit); at most 2^63-1 bytes; integer
                              attributes (strides, shifts, ...) fit in 64 bits
  mesh                        at most MAX_DEVICES devices; the jax backends take at most
                              JAX_MAX_MESH_AXES axes, JAX_MAX_LOOP_DEPTH nested loops and, on virtual CPU devices,
                              JAX_MAX_CPU_DEVICES devices; the simulator at most SIM_MAX_WORK
                              device-steps (devices x per-partition ops)
  loops                       the ref backend runs at most REF_MAX_WORK ops (a loop body counts
                              once per iteration; the simulator's device-steps count them so too),
                              the jax backends JAX_MAX_WORK (the per-partition program's ops on
                              jax, the global program's on xla); `--max-work` sets the limit
  memory                      before a run, the backend's estimated peak (the cost model's
                              per-device peak on the per-partition program; the global peak for
                              ref) must fit in the available memory, or `--max-memory`
  .npz inputs                 member headers are read before any data; only parameters are loaded

The compiler recurses over expressions; `deep_call` runs it on a thread with a large stack so that
the nesting limits, not Python's default recursion limit, are what a program meets.
"""

from __future__ import annotations

import gc
import os
import re
import sys
import threading
from contextlib import contextmanager

from .errors import Source, Span, SpmdError

MAX_SOURCE_BYTES = 4 << 20  # 4 MiB of program text
MAX_NESTING = 10_000
MAX_CALL_DEPTH = 2_000
MAX_UNROLLED = 20_000
MAX_OPS = 50_000
MAX_DEVICES = 1 << 20
MAX_RANK = 64
MAX_BYTES = (1 << 63) - 1
MAX_INT = (1 << 63) - 1
JAX_MAX_MESH_AXES = 64
JAX_MAX_CPU_DEVICES = 256
JAX_MAX_LOOP_DEPTH = 64  # XLA's CPU compiler crashes (a segfault) on about 100 nested while loops
JAX_MAX_WORK = 1_000_000_000  # per-partition ops a jax run executes (a loop body's once per iteration)
SIM_MAX_WORK = 500_000  # devices x per-partition ops: the simulator runs every device in turn
REF_MAX_WORK = 10_000_000  # ops the numpy interpreter runs (a loop body's once per iteration)

_STACK_BYTES = 1 << 30  # reserved address space; only what deep programs touch is ever used
_RECURSION_LIMIT = 400_000

# ------------------------------------------------------------------------------------- deep stack

_local = threading.local()


def deep_call(fn, *args, **kwargs):
    """Run fn on a thread with a large stack and a high recursion limit; exceptions (including
    KeyboardInterrupt in the caller) propagate. Already on such a thread: just call it."""
    if getattr(_local, "deep", False):
        return fn(*args, **kwargs)
    box: dict = {}

    def target():
        _local.deep = True
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001  (handed to the calling thread)
            box["error"] = e

    old_limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old_limit, _RECURSION_LIMIT))
    t = None
    for size in (_STACK_BYTES, _STACK_BYTES // 8):
        try:
            old_size = threading.stack_size(size)
        except (ValueError, RuntimeError):
            break
        try:
            t = threading.Thread(target=target, name="spmdlang", daemon=True)
            t.start()
            break
        except RuntimeError:  # no address space for that stack: try a smaller one
            t = None
        finally:
            threading.stack_size(old_size)
    if t is None:  # a platform that will not: run here, with the old limits
        sys.setrecursionlimit(old_limit)
        return fn(*args, **kwargs)
    try:
        while t.is_alive():
            t.join(0.1)  # a timed join lets Ctrl-C reach this thread
    finally:
        sys.setrecursionlimit(old_limit)
    if "error" in box:
        e = box["error"]
        if isinstance(e, RecursionError):
            raise SpmdError(f"the program nests too deeply for the compiler ({e}); expressions may nest "
                            f"{MAX_NESTING} deep and calls {MAX_CALL_DEPTH} deep") from None
        raise e
    return box.get("value")


@contextmanager
def gc_paused():
    """The cycle collector off while a compile's passes run: they allocate many small IR objects
    (values, ops, types, layouts) that live to the pass's end, and collecting the young ones over
    and over is a few percent of a compile (train_mlp: 4 collections, ~0.4 ms of ~12 ms CPU, with
    the one collection the garbage left, a little, costs after). autoshard.driver._without_gc does
    the same for its search. Nested uses leave it off until the outermost ends."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


# ------------------------------------------------------------------------------------- sources


def read_bounded(path: str, limit: int, what: str) -> bytes:
    """Read at most `limit` bytes of a file (any kind: a pipe, a device); longer is an error located
    at the file, raised before reading more than limit + 1 bytes."""
    where = Span(Source(path, ""), 1, 1)
    with open(path, "rb") as f:
        try:
            size = os.fstat(f.fileno()).st_size
        except OSError:
            size = 0
        if size > limit:
            raise SpmdError(f"{what} is {_bytes(size)}; at most {_bytes(limit)} is accepted", where)
        data = f.read(limit + 1)
    if len(data) > limit:
        raise SpmdError(f"{what} is longer than {_bytes(limit)}, the most accepted", where)
    return data


def _bytes(n: float) -> str:
    for unit, k in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k:
            return f"{n / k:.1f} {unit}"
    return f"{int(n)} bytes"


format_bytes = _bytes


# ------------------------------------------------------------------------------------- types


def check_type(t, span) -> None:
    """Rank and size limits of one tensor type (declared or computed)."""
    if len(t.shape) > MAX_RANK:
        raise SpmdError(f"{t.dtype}[...] has rank {len(t.shape)}; tensors have at most {MAX_RANK} dimensions "
                        "(numpy's and XLA's limit)", span)
    nbytes = t.nbytes
    if nbytes > MAX_BYTES:
        raise SpmdError(f"{t} has {_count(t.size)} elements ({_count(nbytes)} bytes); a tensor may "
                        "hold at most 2^63-1 bytes, on any backend", span)


def _count(n: int) -> str:
    text = str(n)
    if len(text) <= 15:
        return text
    return f"about 2^{n.bit_length() - 1}" if n > 0 else text


def check_attrs(kind: str, attrs, span) -> None:
    """Integer attributes (strides, shifts, sizes, ...) must fit in 64 bits: jax and XLA take C longs."""
    for name, value in attrs.items():
        big = _big_int(value)
        if big is not None:
            text = str(big)
            if len(text) > 24:
                text = f"{text[:3]}...({len(text)} digits)"
            raise SpmdError(f"the integer {text} ('{name}' of {kind}) does not fit in 64 bits", span)


def _big_int(value):
    kind = type(value)
    if kind is int:  # the common cases first, by exact type (an op's attrs are checked as it is built)
        return value if not -MAX_INT - 1 <= value <= MAX_INT else None
    if kind is str or kind is float or value is None:
        return None
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if not -MAX_INT - 1 <= value <= MAX_INT else None
    if isinstance(value, (tuple, list)):
        for v in value:
            b = _big_int(v)
            if b is not None:
                return b
    return None


# ------------------------------------------------------------------------------------- mesh


def mesh_span(program) -> Span:
    """Where the program declares its mesh (line 1 if it cannot be found)."""
    source = program.source
    if source is None:
        return Span(None, 1, 1)
    m = re.search(r"^[ \t]*(mesh)\b", source.text, re.M)
    if not m:
        return Span(source, 1, 1)
    line = source.text.count("\n", 0, m.start(1)) + 1
    col = m.start(1) - (source.text.rfind("\n", 0, m.start(1)) + 1) + 1
    return Span(source, line, col, line, col + 4)


def check_jax_mesh(program, backend: str) -> None:
    """What the jax backends can express at all (whatever the devices): at most JAX_MAX_MESH_AXES axes."""
    axes = len(program.mesh.axes)
    if axes > JAX_MAX_MESH_AXES:
        raise SpmdError(f"the mesh has {axes} axes; the {backend} backend supports at most {JAX_MAX_MESH_AXES} "
                        "(a jax mesh is an array of devices, one dimension per axis); the ref and sim backends "
                        "and `explain` take any number", mesh_span(program))


def check_jax_loops(program, backend: str) -> None:
    """XLA compiles nested while loops recursively: at most JAX_MAX_LOOP_DEPTH loops inside one
    another (the error names the first loop that nests deeper)."""

    def deepest(ops, depth):
        for op in ops:
            for region in op.regions:
                if depth + 1 > JAX_MAX_LOOP_DEPTH:
                    return op
                found = deepest(region.ops, depth + 1)
                if found is not None:
                    return found
        return None

    op = deepest(program.ops, 0)
    if op is not None:
        raise SpmdError(f"this loop nests {JAX_MAX_LOOP_DEPTH + 1} loops deep; the {backend} backend compiles at "
                        f"most {JAX_MAX_LOOP_DEPTH} nested loops (XLA's compiler crashes on about 100); the ref "
                        "and sim backends and `explain` take any depth", op.span or mesh_span(program))


def check_jax_devices(program, backend: str, cpu: bool) -> None:
    """Running on virtual CPU devices: at most JAX_MAX_CPU_DEVICES of them in one process."""
    n = program.mesh.size
    if cpu and n > JAX_MAX_CPU_DEVICES:
        raise SpmdError(f"the mesh has {n} devices; the {backend} backend runs at most {JAX_MAX_CPU_DEVICES} "
                        "virtual CPU devices in one process (more take minutes to compile or do not run); use "
                        "--mesh for a smaller mesh, or the ref and sim backends", mesh_span(program))


def check_sim_work(compiled, max_work: int | None = None) -> None:
    """The simulator runs each op once per device, in one process: bound devices x ops."""
    limit = SIM_MAX_WORK if max_work is None else max_work
    n = compiled.program.mesh.size
    ops = _ops_run(compiled.spmd.program.ops) + len(compiled.program.params) + len(compiled.program.results)
    if n * ops > limit:
        loop = _biggest_loop(compiled.program)
        if loop is not None and _ops_run([loop]) * n > limit:  # the loop is what is too long
            raise SpmdError(f"the sim backend would run {ops:,} ops (a loop body once per iteration) on each of "
                            f"{n} devices in turn ({n * ops:,} steps; at most {limit:,}); use `explain`, "
                            "or fewer loop iterations (--set)", loop.span or mesh_span(compiled.program),
                            note=_WORK_NOTE)
        raise SpmdError(f"the sim backend would run {ops} ops on each of {n} devices in turn ({n * ops:,} steps; at "
                        f"most {limit:,}); use the ref backend, `explain`, or a smaller mesh (--mesh)",
                        mesh_span(compiled.program), note=_WORK_NOTE)


_WORK_NOTE = "raise the limit with --max-work N (max_work= in the API)"


def check_ref_work(compiled, max_work: int | None = None) -> None:
    """The interpreter runs a loop body once per iteration: bound the ops it runs in all."""
    _check_ops_run(compiled.program, "ref", REF_MAX_WORK if max_work is None else max_work)


def check_jax_work(compiled, backend: str, max_work: int | None = None) -> None:
    """A compiled jax program runs a loop body once per iteration too: bound the ops it runs (our
    per-partition program's on jax, the global program's on xla), so that a loop of 2^40
    iterations is refused at once rather than run for days."""
    prog = compiled.spmd.program if backend == "jax" else compiled.program
    _check_ops_run(prog, backend, JAX_MAX_WORK if max_work is None else max_work, compiled.program)


def _check_ops_run(prog, backend: str, limit: int, glob=None) -> None:
    ops = _ops_run(prog.ops)
    if ops > limit:
        biggest = _biggest_loop(glob if glob is not None else prog)
        span = biggest.span if biggest is not None and biggest.span is not None else mesh_span(glob or prog)
        raise SpmdError(f"the {backend} backend would run {ops:,} ops (a loop body once per iteration; at most "
                        f"{limit:,}); use `explain`, or fewer loop iterations (--set)", span, note=_WORK_NOTE)


def _biggest_loop(prog):
    """The outermost loop of the global program that runs the most ops (None without loops)."""
    return max((op for op in prog.ops if op.regions), key=lambda op: _ops_run([op]), default=None)


def _ops_run(ops) -> int:
    """Ops a run executes: a loop body's once per iteration (a loop op's attrs give its range)."""
    n = 0
    for op in ops:
        n += 1
        for region in op.regions:
            n += max(0, op.attrs["stop"] - op.attrs["start"]) * _ops_run(region.ops)
    return n


# ------------------------------------------------------------------------------------- memory

_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([kmgt]?)(i?b)?\s*$", re.I)


def parse_size(text: str) -> int:
    """'4G', '512MiB', '1.5g', '1000000' (bytes); K/M/G/T are powers of 1024. ValueError if not."""
    m = _SIZE.match(text)
    if not m:
        raise ValueError(f"expected a size such as 4G, 512M or a number of bytes, got '{text}'")
    value = float(m.group(1)) * (1 << (10 * "kmgt".find(m.group(2).lower()) + 10) if m.group(2) else 1)
    if not value > 0 or value != value or value == float("inf"):
        raise ValueError(f"expected a positive size, got '{text}'")
    return int(value)


def available_memory() -> int | None:
    """Memory a new allocation can get without swapping: MemAvailable on Linux, else free pages;
    and no more than the process's own limits leave (RLIMIT_AS, RLIMIT_DATA: `ulimit -v`,
    `prlimit --as`), less what it already maps."""
    free = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    free = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    if free is None:
        try:
            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            free = None
    headroom = _rlimit_headroom()
    if headroom is not None:
        free = headroom if free is None else min(free, headroom)
    return free


def _rlimit_headroom() -> int | None:
    """Bytes the address-space and data limits still allow this process (None: unlimited)."""
    try:
        import resource
    except ImportError:  # not a Unix
        return None
    usage = _proc_status()
    out = None
    for name, field in (("RLIMIT_AS", "VmSize"), ("RLIMIT_DATA", "VmData")):
        which = getattr(resource, name, None)
        if which is None:
            continue
        try:
            soft, _hard = resource.getrlimit(which)
        except (OSError, ValueError):
            continue
        if soft == resource.RLIM_INFINITY or soft < 0:
            continue
        left = max(0, soft - usage.get(field, 0))
        out = left if out is None else min(out, left)
    return out


def _proc_status() -> dict[str, int]:
    """VmSize and VmData of this process in bytes (empty where /proc is not there)."""
    out = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("VmSize", "VmData"):
                    out[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return out


def out_of_memory(op, backend: str) -> SpmdError:
    """A MemoryError while computing `op`, as an error located at the op (the estimate that
    check_memory makes before a run was too low for it)."""
    what = ", ".join(str(r.type) for r in op.results) or op.kind
    return SpmdError(f"the {backend} backend ran out of memory computing {op.kind} ({what}); the estimate made "
                     "before the run was too low for it", op.span,
                     note="give it less to hold (--set, --mesh), or more memory")


def peak_and_culprit(prog) -> tuple[int, object, Span | None]:
    """The cost model's peak live bytes of a program in order (partition.cost.peak_bytes is this) and
    the largest value live at that peak, with the span of its declaration or defining op."""
    last: dict = {}
    for i, op in enumerate(prog.ops):
        for v in op.operands:
            last[v] = i
    end = len(prog.ops)
    for r in prog.results:
        last[r.value] = end
    spans = {p.value: p.span for p in prog.params}
    live_set = {p.value: None for p in prog.params}
    for p in prog.params:
        last[p.value] = end
    live = sum(v.type.nbytes for v in live_set)
    peak, at_peak = live, dict(live_set)
    frees: dict[int, list] = {}
    for v, i in last.items():
        frees.setdefault(i, []).append(v)
    for i, op in enumerate(prog.ops):
        for r in op.results:
            live += r.type.nbytes
            live_set[r] = None
            spans[r] = op.span
        for region in op.regions:  # a loop body's own temporaries, live while it runs
            inner, v, span = peak_and_culprit(_RegionAsProgram(region))
            inner -= sum(p.type.nbytes for p in region.params)  # those alias the loop's operands
            if live + inner > peak:
                peak, at_peak = live + inner, {**live_set, v: None}
                spans[v] = span
        if live > peak:
            peak, at_peak = live, dict(live_set)
        for v in frees.get(i, ()):
            if v in live_set:
                live -= v.type.nbytes
                del live_set[v]
        for r in op.results:
            if r not in last and r in live_set:
                live -= r.type.nbytes
                del live_set[r]
    culprit = max(at_peak, key=lambda v: v.type.nbytes, default=None)
    return peak, culprit, spans.get(culprit) if culprit is not None else None


class _RegionAsProgram:
    """A loop body seen as a program by peak_and_culprit."""

    def __init__(self, region):
        from types import SimpleNamespace

        self.ops = region.ops
        self.params = [SimpleNamespace(value=p, span=None) for p in region.params]
        self.results = [SimpleNamespace(value=r) for r in region.results]


def estimate(compiled, backend: str) -> tuple[int, object, Span | None, str]:
    """Host (or device) bytes a run on `backend` needs at its peak, the biggest value then, its span,
    and how the figure was made."""
    prog = compiled.program
    # random inputs are drawn in float64 and then cast: one parameter's worth of float64 on top
    draw = max((p.value.type.size * 8 for p in prog.params), default=0)
    if backend == "ref":
        peak, v, span = peak_and_culprit(prog)
        return peak + draw, v, span, "the global program's peak"
    spmd = compiled.spmd.program
    peak, v, span = peak_and_culprit(spmd)
    n = prog.mesh.size
    if backend == "sim":
        ins = sum(p.value.type.nbytes for p in prog.params)
        return peak * n + ins + draw, v, span, f"{_bytes(peak)} per device x {n} simulated devices"
    return peak * n + draw, v, span, f"{_bytes(peak)} per device x {n} devices"


def check_memory(compiled, backend: str, limit: int | None = None, max_work: int | None = None) -> None:
    """Refuse (a located SpmdError) a run whose estimated peak does not fit: in `limit` bytes when
    given (--max-memory), else in the memory available now; first, a run that would execute more
    ops than the backend's work limit (`max_work` when given: --max-work)."""
    if backend == "sim":
        check_sim_work(compiled, max_work)
    if backend == "ref":
        check_ref_work(compiled, max_work)
    if backend in ("jax", "xla"):
        check_jax_work(compiled, backend, max_work)
    avail = limit if limit is not None else available_memory()
    if avail is None:
        return
    need, v, span, how = estimate(compiled, backend)
    if need <= avail:
        return
    what = "--max-memory" if limit is not None else "available memory"
    culprit = f"; the largest tensor then is {v.type} ({_bytes(v.type.nbytes)})" if v is not None else ""
    raise SpmdError(f"running on {backend} needs about {_bytes(need)} ({how}), more than the {_bytes(avail)} "
                    f"of {what}{culprit}", span or mesh_span(compiled.program),
                    note="raise the limit with --max-memory SIZE, or make the tensors smaller (--set, --mesh)")
