"""The Python API: `spmdlang.compile(...)` returns a `Compiled`, whose stages are computed lazily."""

from __future__ import annotations

import os
from functools import cached_property

import numpy as np

from .errors import OverrideError, Source, Span, SpmdError
from .frontend.lower import lower
from .frontend.parse import parse
from .inputs import check_inputs, random_inputs
from .ir.core import Program, result_names
from .ir.printer import print_program
from .memo import clear_caches  # noqa: F401  (spmdlang.api.clear_caches, for the benchmarks)

BACKENDS = ("ref", "sim", "jax", "xla")


def read_source(path: str) -> str:
    """Read a .spmd file as UTF-8 text; unreadable, binary or undecodable files are located user errors."""
    from .limits import MAX_SOURCE_BYTES, read_bounded

    where = Span(Source(path, ""), 1, 1)
    try:
        data = read_bounded(path, MAX_SOURCE_BYTES, "the program")
    except IsADirectoryError:
        raise SpmdError("this is a directory, not a .spmd file", where) from None
    except OSError as e:
        raise SpmdError(f"cannot read the program: {e.strerror or e}", where) from None
    if b"\x00" in data:
        raise SpmdError("this is a binary file, not spmdlang source text", where)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        col = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise SpmdError(f"the file is not UTF-8 text (byte 0x{data[e.start]:02x})",
                        Span(Source(path, data.decode("utf-8", "replace")), line, col)) from None
    if not text.strip():
        raise SpmdError("empty file: expected a mesh declaration and a function", Span(Source(path, text), 1, 1))
    return text.removeprefix("\ufeff")


class Compiled:
    """A compiled program. Stages (IR, shardings, per-partition IR, jax source) are computed on
    first use; every stage is a pure function of the previous one."""

    def __init__(self, program: Program, verify: bool | None = None, shard_weight_updates: str | None = None):
        from .ir.verify import enabled

        self.program = program
        self.shard_weight_updates = shard_weight_updates
        self._runners: dict = {}
        self.verify = enabled(verify)  # run the IR verifier after every pass
        if self.verify:
            from .ir.verify import verify as check

            check(program)

    @property
    def mesh(self):
        return self.program.mesh

    def recompiled(self) -> Compiled:
        """A new Compiled of the same program and options with nothing computed yet: from the
        source text when this one was compiled from it (`bench` times its compile afresh)."""
        args = getattr(self, "compile_args", None)
        if args is not None:
            from .limits import deep_call

            return deep_call(_compile_text, *args)
        return Compiled(self.program, self.verify, self.shard_weight_updates)

    @cached_property
    def ir(self) -> str:
        """The global program as IR text."""
        return print_program(self.program)

    @cached_property
    def pipeline(self):
        """The passes after lowering (partition.pipeline), run as far as a stage asked for needs."""
        from .partition.pipeline import Pipeline

        return Pipeline(self.program, self.verify, self.shard_weight_updates)

    @property
    def canonical(self) -> Program:
        """The global program after canonicalisation (ir.simplify), which partitioning starts from."""
        return self.pipeline.stage("canonical")

    @property
    def pass_notes(self) -> list:
        """What compile options did to the program (partition.weight_update.Note: line, message)."""
        self.canonical  # noqa: B018  (the passes run with canonicalisation)
        return self.pipeline.stages.pass_notes

    @property
    def propagation(self):
        """Sharding propagation over the canonical global program (partition.propagate)."""
        return self.pipeline.stage("propagation")

    @property
    def spmd(self):
        """The per-partition program with its in/out shardings and communication ledger."""
        return self.pipeline.stage("spmd")

    @cached_property
    def spmd_ir(self) -> str:
        """The per-partition program as IR text, each collective commented with its cause."""
        return print_program(self.spmd.program, notes=self.spmd.notes)

    @cached_property
    def jax_source(self) -> str:
        """Our per-partition program as a standalone Python module (shard_map + jax.lax)."""
        from .backend_jax.emit import emit_shard_map
        from .limits import check_jax_loops, check_jax_mesh, gc_paused

        check_jax_mesh(self.program, "jax")
        check_jax_loops(self.program, "jax")
        with gc_paused():
            return emit_shard_map(self.spmd)

    @cached_property
    def xla_source(self) -> str:
        """The global program as a jax.numpy module for XLA's own GSPMD (the baseline). Boundary
        layouts are the same as ours: annotations, else what propagation chose."""
        from .backend_jax.emit import emit_xla
        from .limits import check_jax_loops, check_jax_mesh

        check_jax_mesh(self.program, "xla")
        check_jax_loops(self.program, "xla")
        return emit_xla(self.canonical, self.spmd.in_shardings, self.spmd.out_shardings)

    def runner(self, backend: str):
        """The loaded, jitted module of backend "jax" or "xla" (cached)."""
        if backend not in self._runners:
            from .backend_jax.runner import ModuleRunner

            source = self.jax_source if backend == "jax" else self.xla_source
            self._runners[backend] = ModuleRunner(source, f"spmdlang_{backend}", self.mesh.size,
                                                  program=self.program, backend=backend)
        return self._runners[backend]

    @property
    def shardings(self) -> dict:
        """Sharding of every named value: source names, and results as return0, return1, ..."""
        sh = self.propagation.shardings
        prog = self.canonical  # after CSE, whose names point at the values propagation saw
        out = {name: sh[v] for name, v, _span in prog.names}
        out.update({n: sh[r.value] for n, r in zip(result_names(prog), prog.results)})
        return out

    def check_report(self) -> dict:
        """The `check --json` document (docs/cli.md)."""
        from .explain import check_report

        return check_report(self)

    def explain_report(self, bandwidth=None, latency=None, preset: str = "tpu-v4") -> dict:
        """The `explain --json` document (docs/cli.md)."""
        from .explain import explain_report

        return explain_report(self, bandwidth, latency, preset)

    def check_memory(self, backend: str, max_memory: int | None = None, max_work: int | None = None) -> None:
        """Raise a located SpmdError if a run on `backend` would need more memory than `max_memory`
        bytes (default: the memory available now), by the cost model's estimate, or run more ops
        than `max_work` (default: the backend's limit; a loop body counts once per iteration); see
        spmdlang.limits."""
        from .limits import check_memory

        check_memory(self, backend, max_memory, max_work)

    def diff(self, inputs=None, backends=BACKENDS, rtol=None, atol=None, seed: int = 0, processes: int = 1,
             max_memory: int | None = None, max_work: int | None = None, isolate_xla: bool = False) -> dict:
        """Run the same inputs through each backend and compare every result with ref.

        A result matches when |got - ref| <= atol * scale + rtol * |ref| elementwise, with
        scale = max(1, max |ref|) (reductions may sum in another order); NaNs must coincide;
        integer and bool results must be equal. Defaults follow the narrowest float the program
        computes in (f32: 1e-4, f16: 1e-2, bf16: 2e-2), whatever the result's own dtype.
        `processes` > 1 runs the jax backends across that many local processes (see run);
        `isolate_xla` runs the xla baseline in a child process (see run's `isolate`): an abort
        inside XLA's partitioner is then that backend's error row, not the end of this process.
        """
        for b in ("ref", *backends):
            self.check_memory(b, max_memory, max_work)
        inputs = self.check_inputs(inputs) if inputs is not None else self.random_inputs(seed)
        ref = self.run(inputs, backend="ref", max_memory=max_memory, max_work=max_work)
        results, ok = [], True
        names = result_names(self.program)  # return0, return1.emb, ...: a struct result's leaves
        narrowest = _narrowest_float(self.program)
        for b in backends:
            if b == "ref":
                continue
            if b == "xla":
                from jax.errors import JaxRuntimeError

                from .backend_jax.multiprocess import XlaAborted

                try:
                    got = self.run(inputs, backend=b, processes=processes, max_memory=max_memory,
                                   max_work=max_work, isolate=isolate_xla)
                except (JaxRuntimeError, XlaAborted) as e:  # XLA's own partitioner failed on the baseline
                    error = (e.message if isinstance(e, XlaAborted) else str(e)).strip().splitlines()[0][:300]
                    results += [{"backend": b, "output": i, "name": names[i], "max_abs_err": None, "ok": False,
                                 "error": error} for i in range(len(ref))]
                    ok = False
                    continue
            else:
                got = self.run(inputs, backend=b, processes=processes, max_memory=max_memory, max_work=max_work)
            for i, (r, g) in enumerate(zip(ref, got)):
                err, good = _compare(r, g, *_tolerance(r.dtype, rtol, atol, narrowest))
                ok &= good
                results.append({"backend": b, "output": i, "name": names[i], "max_abs_err": err, "ok": good})
        # the float tolerance applied (integer and bool results are always compared exactly)
        float_rtol, float_atol = _tolerance(np.float32, rtol, atol, narrowest)
        report = {"ok": bool(ok), "backends": list(backends), "results": results, "rtol": float_rtol,
                  "atol": float_atol, "upstream_disagreement": _upstream_disagreement(results),
                  "known_issues": KNOWN_ISSUES}
        notes = [f"ref's out{i} has {n} non-finite value{'s' if n > 1 else ''} (inf or nan) of {r.size}; "
                 "backends are compared on them too (equal infinities and NaNs in the same places)"
                 for i, r in enumerate(ref) if (n := _nonfinite(r))]
        if notes:
            report["notes"] = notes
        return report

    def random_inputs(self, seed: int = 0, int_range: tuple[int, int] | None = None) -> dict[str, np.ndarray]:
        """Seeded inputs (inputs.random_inputs): an integer parameter used as ids is drawn over the
        dim it indexes, other integers in [0, 16); `int_range=(lo, hi)` draws every one in [lo, hi)."""
        return random_inputs(self.program, seed, int_range)

    def check_inputs(self, inputs: dict, origin: str = "inputs") -> dict[str, np.ndarray]:
        return check_inputs(self.program, inputs, origin)

    def run(self, inputs: dict[str, np.ndarray] | None = None, backend: str = "ref", seed: int = 0,
            origin: str = "inputs", processes: int = 1, max_memory: int | None = None,
            max_work: int | None = None, isolate: bool = False) -> list[np.ndarray]:
        """Run on `inputs` (name -> array; random from `seed` when None); results in order, a
        struct parameter's leaves named by their dotted paths (`p.blocks.wq`) in and a struct
        result's leaves (depth-first, in field declaration order) out, as a flat list.

        With `processes` > 1 the jax backends run across that many local processes, as on that many
        hosts (jax.distributed on 127.0.0.1, mesh/processes CPU devices each, gloo collectives).
        Refuses (SpmdError) a run whose estimated peak memory exceeds `max_memory` bytes (default:
        the memory available now), or that would run more ops than `max_work` (default: the
        backend's limit, spmdlang.limits; a loop body counts once per iteration). `isolate` runs
        a jax backend in a child process with a jax of its own: XLA aborting the process (a failed
        CHECK, as its SPMD partitioner does on some baselines) is then an XlaAborted error."""
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r}; choose from {', '.join(BACKENDS)}")
        self.check_memory(backend, max_memory, max_work)
        inputs = check_inputs(self.program, inputs if inputs is not None else self.random_inputs(seed), origin)
        if backend == "ref":
            from .backend_ref import run_global

            return run_global(self.program, inputs)
        if backend == "sim":
            from .backend_ref import run_sim

            return run_sim(self.spmd, inputs)
        arrays = [inputs[p.name] for p in self.program.params]
        if processes > 1:
            from .backend_jax.multiprocess import run_processes

            source = self.jax_source if backend == "jax" else self.xla_source
            return run_processes(source, arrays, self.mesh.size, processes)
        if not isolate and backend not in self._runners:
            from .backend_jax.runner import devices_fixed_below

            have = devices_fixed_below(self.mesh.size)
            if have is not None:  # (jax ran before: its device count is fixed) a jax of its own
                import warnings

                warnings.warn(f"jax has used its devices already and has {have}, fewer than the mesh's "
                              f"{self.mesh.size}: the {backend} backend runs in a child process with "
                              f"{self.mesh.size} virtual CPU devices (slower: a process and a compile per "
                              f'run). To run here, call jax.config.update("jax_num_cpu_devices", '
                              f"{self.mesh.size}) right after importing jax", RuntimeWarning, stacklevel=2)
                isolate = True
        if isolate:
            from .backend_jax.multiprocess import XlaAborted, run_isolated
            from .backend_jax.runner import _runs_on_cpu
            from .limits import check_jax_devices, mesh_span

            check_jax_devices(self.program, backend, cpu=_runs_on_cpu(self.mesh.size))
            try:
                return run_isolated(self.jax_source if backend == "jax" else self.xla_source, arrays, self.mesh.size)
            except XlaAborted as e:
                what = ("XLA's own GSPMD partitioner on the program's annotations (the baseline; ours: "
                        "--backend jax)" if backend == "xla" else "the jax backend")
                raise XlaAborted(f"the {backend} backend: {e.message}", mesh_span(self.program),
                                 note=f"the {backend} backend is {what}") from None
        from jax.errors import JaxRuntimeError

        try:
            return self.runner(backend)(arrays)
        except JaxRuntimeError as e:
            if "RESOURCE_EXHAUSTED" not in str(e):
                raise
            from .limits import mesh_span

            raise SpmdError(f"the {backend} backend ran out of memory: XLA could not allocate what this program "
                            f"asked for ({str(e).strip().splitlines()[0][:200]}); the estimate made before the run "
                            "was too low for it", mesh_span(self.program),
                            note="give it less to hold (--set, --mesh), or more memory") from None


def _nonfinite(a: np.ndarray) -> int:
    if not a.size or not (a.dtype.kind == "f" or a.dtype.name == "bfloat16"):
        return 0
    return int(np.count_nonzero(~np.isfinite(np.asarray(a, dtype=np.float64))))


_TOLERANCE = {"bf16": 2e-2, "f16": 1e-2, "f32": 1e-4, "f64": 1e-9}
KNOWN_ISSUES = "docs/known_xla_issues.md"
OUR_BACKENDS = ("sim", "jax")


def _upstream_disagreement(results: list[dict]) -> list[str]:
    """Backends whose mismatches are XLA's, not ours: the xla baseline (XLA's own partitioner)
    disagrees with ref while our partitioned backends that ran (sim, jax) all agree with it.
    Its failing results are marked `upstream_disagreement`; the diff still fails."""
    ours = [r for r in results if r["backend"] in OUR_BACKENDS]
    if not ours or not all(r["ok"] for r in ours):
        return []
    upstream = []
    for r in results:
        if r["backend"] == "xla" and not r["ok"]:
            r["upstream_disagreement"] = True
            if "xla" not in upstream:
                upstream.append("xla")
    return upstream


def _narrowest_float(prog: Program) -> str | None:
    floats = {v.type.dtype for v in prog.values() if v.type.dtype in _TOLERANCE}
    return max(floats, key=lambda d: _TOLERANCE[d]) if floats else None


def _tolerance(dtype, rtol, atol, narrowest=None):
    default = _TOLERANCE.get(narrowest or "f32", 1e-4)
    if np.dtype(dtype).kind in "biu":
        default = 0.0
    return (default if rtol is None else rtol), (default if atol is None else atol)


def _compare(ref: np.ndarray, got: np.ndarray, rtol: float, atol: float) -> tuple[float, bool]:
    if ref.shape != got.shape:
        return float("inf"), False
    if ref.size == 0:
        return 0.0, True
    r, g = ref.astype(np.float64), got.astype(np.float64)
    nan_r, nan_g = np.isnan(r), np.isnan(g)
    if not np.array_equal(nan_r, nan_g):
        return float("nan"), False
    fin = ~nan_r
    with np.errstate(invalid="ignore"):
        diff = np.where(fin & (r != g), np.abs(r - g), 0.0)  # equal infinities are equal
    err = float(np.max(diff)) if diff.size else 0.0
    finite = np.abs(r[fin & np.isfinite(r)])
    scale = max(1.0, float(finite.max())) if finite.size else 1.0
    good = bool(np.all(diff <= atol * scale + rtol * np.where(np.isfinite(r), np.abs(r), 0.0)))
    return err, good


def compile(program: str, mesh: dict[str, int] | None = None, consts: dict[str, int] | None = None,
            entry: str | None = None, filename: str | None = None, verify: bool | None = None,
            shard_weight_updates: str | None = None) -> Compiled:
    """Compile a .spmd file (a path) or source text. `mesh` overrides axis sizes, `consts` consts.
    `verify` runs the IR verifier after every pass (default: the SPMDLANG_VERIFY environment
    variable); a verifier failure is a compiler bug and raises AssertionError.
    `shard_weight_updates` names a mesh axis: every parameter replicated over it and updated
    elementwise (w_new = f(w, g, state...)) has its gradient, update and optimizer state sharded
    over it (reduce_scatter -> local update -> all_gather; Xu et al. 2020).

    Raises SpmdError for anything wrong with the program or the overrides.
    """
    if filename is None and "\n" not in program and (program.endswith(".spmd") or os.path.exists(program)):
        filename, text = program, read_source(program)
    else:
        text = program
        filename = filename or "<input>"
    from .limits import deep_call

    return deep_call(_compile_text, text, filename, mesh, consts, entry, verify, shard_weight_updates)


def _compile_text(text, filename, mesh, consts, entry, verify, shard_weight_updates=None, parsed=None) -> Compiled:
    """`parsed`: (module, source) of `text` when the caller parsed it already (lowering leaves it as is)."""
    from .limits import gc_paused

    with gc_paused():
        module, source = parsed or parse(text, filename)
        _check_overrides(module, source, mesh, consts, shard_weight_updates)
        c = Compiled(lower(module, source, mesh, consts, entry), verify, shard_weight_updates)
    c.compile_args = (text, filename, mesh, consts, entry, verify, shard_weight_updates)  # to compile afresh (bench)
    return c


def _check_overrides(module, source, mesh, consts, shard_weight_updates=None):
    # point at the declaration the override is checked against (the mesh, the consts), not at line 1
    where = module.meshes[0].span if module.meshes else Span(source, 1, 1)
    axes = {a.name for m in module.meshes for a in m.axes}
    for name, size in (mesh or {}).items():
        if name not in axes:
            raise OverrideError(f"--mesh names axis '{name}', which the mesh does not have"
                            + (f" (axes: {', '.join(sorted(axes))})" if axes else ""), where)
        if not isinstance(size, int) or size < 1:
            raise OverrideError(f"--mesh {name}={size}: sizes must be positive integers", where)
    if shard_weight_updates is not None and shard_weight_updates not in axes:
        raise OverrideError(f"--shard-weight-updates names axis '{shard_weight_updates}', which the mesh does not have"
                            + (f" (axes: {', '.join(sorted(axes))})" if axes else ""), where)
    names = {c.name for c in module.consts}
    where = module.consts[0].span if module.consts else where
    for name in consts or {}:
        if name not in names:
            raise OverrideError(f"--set names const '{name}', which the program does not declare"
                            + (f" (consts: {', '.join(sorted(names))})" if names else ""), where)
