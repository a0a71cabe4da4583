"""Running emitted modules on a jax mesh, with virtual CPU devices when there is no accelerator.

jax fixes its device count when first imported, so the embedded default sets
XLA_FLAGS=--xla_force_host_platform_device_count before that import (at least 8, or what the mesh
needs). The flag only concerns the CPU platform: on a TPU/GPU host, jax still uses the accelerator,
and the emitted module falls back to CPU devices only if the accelerator has too few.
"""

from __future__ import annotations

import os
import sys
import types

_FLAG = "--xla_force_host_platform_device_count"


def ensure_devices(n: int) -> None:
    """Make sure jax, once imported, has at least n CPU devices (a no-op after jax is imported)."""
    if "jax" in sys.modules:
        return
    flags = os.environ.get("XLA_FLAGS", "")
    if _FLAG in flags:
        return
    os.environ["XLA_FLAGS"] = f"{flags} {_FLAG}={max(n, 8)}".strip()


def check_devices(n: int) -> None:
    import jax

    from ..errors import SpmdError

    if len(jax.devices()) >= n:
        return
    try:
        cpus = len(jax.devices("cpu"))
    except RuntimeError:
        cpus = 0
    if cpus < n:
        raise SpmdError(f"the mesh needs {n} devices but jax has {len(jax.devices())} (and {cpus} CPU devices); "
                        f"jax was imported before spmdlang could ask for virtual devices: set "
                        f"XLA_FLAGS={_FLAG}={n} before importing jax")


def load(source: str, name: str) -> types.ModuleType:
    """Execute an emitted module's source as a fresh module."""
    mod = types.ModuleType(name)
    mod.__file__ = f"<spmdlang {name}>"
    exec(compile(source, mod.__file__, "exec"), mod.__dict__)  # noqa: S102  (our own generated code)
    return mod


class ModuleRunner:
    """A loaded module with its mesh and jitted function, reused across runs."""

    def __init__(self, source: str, name: str, n_devices: int, compiler_options: dict | None = None):
        """compiler_options: XLA options for this module's compile only (jax's
        `Lowered.compile(compiler_options=...)`), e.g. cheaper CPU codegen for bulk testing."""
        ensure_devices(n_devices)
        check_devices(n_devices)
        self.module = load(source, name)
        self.mesh = self.module.make_mesh()
        self.fn = self.module.build(self.mesh)
        self.compiler_options = compiler_options
        self._compiled = None

    def __call__(self, arrays):
        import numpy as np

        m = self.module
        args = m.place(arrays, self.mesh)
        if self.compiler_options is None:
            outs = self.fn(*args)
        else:
            if self._compiled is None:
                self._compiled = self.fn.lower(*args).compile(compiler_options=self.compiler_options)
            outs = self._compiled(*args)
        shapes = getattr(m, "RESULT_SHAPES", None)
        if shapes is None:
            return [np.asarray(o) for o in outs]
        return [np.asarray(o)[tuple(slice(0, n) for n in shape)] for o, shape in zip(outs, shapes)]
