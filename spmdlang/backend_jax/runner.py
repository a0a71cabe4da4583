"""Running emitted modules on a jax mesh, with virtual CPU devices when there is no accelerator.

jax decides how many CPU devices it has when it first uses a device. Before that (whether or not
jax is already imported) `jax.config.update("jax_num_cpu_devices", N)` sets it; the setting only
concerns the CPU platform, so on a TPU/GPU host jax still uses the accelerator, and the emitted
module falls back to CPU devices only if the accelerator has too few. XLA_FLAGS'
--xla_force_host_platform_device_count, if the user set it, is respected. Only once jax has used
its devices is the count fixed: then `Compiled.run` runs a bigger mesh in a child process with a
jax of its own (devices_fixed_below), and a ModuleRunner is an error saying what to do.
"""

from __future__ import annotations

import os
import sys
import types

from ..errors import SpmdError

_FLAG = "--xla_force_host_platform_device_count"


def _started() -> bool:
    """Whether jax has used its devices (its backends are initialised): their count is fixed."""
    if "jax" not in sys.modules:
        return False
    try:
        from jax._src import xla_bridge

        return xla_bridge.backends_are_initialized()
    except (ImportError, AttributeError):
        return False


def ensure_devices(n: int) -> None:
    """Make sure jax has at least n CPU devices, if it has not used its devices yet."""
    if _FLAG in os.environ.get("XLA_FLAGS", ""):
        return
    from . import require_jax

    jax = require_jax()
    if _started():
        return
    try:
        current = jax.config.jax_num_cpu_devices
        if current < 0 or current < n:
            jax.config.update("jax_num_cpu_devices", max(n, 8))
    except (AttributeError, RuntimeError):  # already initialised, or a jax without the option
        pass


def devices_fixed_below(n: int) -> int | None:
    """jax's device count if jax has used its devices already and has fewer than n (CPU devices
    included), else None: a mesh of n cannot run in this process."""
    if not _started():
        return None
    import jax

    try:
        cpus = len(jax.devices("cpu"))
    except RuntimeError:
        cpus = 0
    have = max(len(jax.devices()), cpus)
    return have if have < n else None


def check_devices(n: int) -> None:
    import jax

    if len(jax.devices()) >= n:
        return
    try:
        cpus = len(jax.devices("cpu"))
    except RuntimeError:
        cpus = 0
    if cpus < n:
        raise SpmdError(f"the mesh needs {n} devices but jax has {len(jax.devices())} (and {cpus} CPU devices), "
                        f"and jax has already used its devices, so their number is fixed: call "
                        f'jax.config.update("jax_num_cpu_devices", {n}) right after importing jax, or set '
                        f"XLA_FLAGS={_FLAG}={n} before starting Python")


def _runs_on_cpu(n: int) -> bool:
    """Whether a mesh of n devices would run on (virtual) CPU devices. Asking jax would initialise
    its backends and fix the CPU device count before ensure_devices could raise it, so until jax
    has initialised them, go by the requested platform: CPU unless an accelerator is asked for."""
    if not _started():
        platforms = os.environ.get("JAX_PLATFORMS", "") or os.environ.get("JAX_PLATFORM_NAME", "")
        return not platforms or "cpu" in platforms.split(",")[0]
    import jax

    try:
        return jax.default_backend() == "cpu" or len(jax.devices()) < n
    except RuntimeError:
        return True


def load(source: str, name: str) -> types.ModuleType:
    """Execute an emitted module's source as a fresh module."""
    mod = types.ModuleType(name)
    mod.__file__ = f"<spmdlang {name}>"
    exec(compile(source, mod.__file__, "exec"), mod.__dict__)  # noqa: S102  (our own generated code)
    return mod


class ModuleRunner:
    """A loaded module with its mesh; the module's run() caches its jitted function."""

    def __init__(self, source: str, name: str, n_devices: int, program=None, backend: str = "jax",
                 compiler_options: dict | None = None):
        """compiler_options: XLA options for this module's compile only (jax's
        `Lowered.compile(compiler_options=...)`), e.g. cheaper CPU codegen for bulk testing."""
        if program is not None:
            from ..limits import check_jax_devices

            check_jax_devices(program, backend, cpu=_runs_on_cpu(n_devices))
        from . import require_jax

        require_jax()
        ensure_devices(n_devices)
        check_devices(n_devices)
        self.module = load(source, name)
        gather = getattr(self.module, "_gather", None)
        if gather is not None:  # jax cannot assemble some sharded empty arrays
            import numpy as np  # ("could not broadcast input array from shape (8,0) into shape (4,0)")

            self.module._gather = lambda out, shape: (np.zeros(shape, dtype=out.dtype) if 0 in tuple(shape)
                                                      else gather(out, shape))
        self.mesh = self.module.make_mesh()
        self.fn = self.module.build(self.mesh)
        self.compiler_options = compiler_options
        self._compiled = None

    def __call__(self, arrays):
        """Parameters' leaves in (a struct's leaves depth-first), results' leaves out, flat."""
        m = self.module
        values = m._nest(arrays, m.GLOBAL_SHAPES)
        if self.compiler_options is None:
            return m._leaves(m.run(*values, mesh=self.mesh), m.RESULT_SHAPES)
        args = m.place(values, self.mesh)
        if self._compiled is None:
            self._compiled = self.fn.lower(*args).compile(compiler_options=self.compiler_options)
        return m._leaves([m._tree_map(lambda shape, o: m._gather(o, shape), shape, o)
                          for o, shape in zip(self._compiled(*args), m.RESULT_SHAPES)], m.RESULT_SHAPES)
