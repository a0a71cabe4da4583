"""Program inputs: validation of user arrays / .npz files, and seeded random inputs."""

from __future__ import annotations

import os
import zipfile

import numpy as np

from .errors import Source, Span, SpmdError
from .ir import types as T
from .ir.core import Program


def random_inputs(prog: Program, seed: int = 0) -> dict[str, np.ndarray]:
    """Floats standard normal, ints uniform in [0, 16), bools a fair coin; in parameter order."""
    rng = np.random.default_rng(seed)
    out = {}
    for p in prog.params:
        t = p.value.type
        if T.is_float(t.dtype):
            a = rng.standard_normal(t.shape)
        elif T.is_int(t.dtype):
            a = rng.integers(0, 16, size=t.shape)
        else:
            a = rng.random(t.shape) < 0.5
        out[p.name] = np.asarray(a).astype(T.np_dtype(t.dtype))
    return out


def check_inputs(prog: Program, inputs: dict, origin: str = "inputs") -> dict[str, np.ndarray]:
    """Every parameter present with its exact shape and dtype; errors point at the parameter."""
    out = {}
    for p in prog.params:
        t = p.value.type
        span = p.span or Span(prog.source, 1, 1)
        if p.name not in inputs:
            raise SpmdError(f"{origin} has no array '{p.name}' for parameter {p.name}: {t}"
                            + (f" (it has {', '.join(sorted(inputs))})" if inputs else ""), span)
        a = np.asarray(inputs[p.name])
        if tuple(a.shape) != t.shape:
            raise SpmdError(f"{origin}: '{p.name}' has shape {list(a.shape)}, but the parameter is {t}", span)
        if a.dtype != T.np_dtype(t.dtype):
            raise SpmdError(f"{origin}: '{p.name}' has dtype {a.dtype}, but the parameter is {t} "
                            f"({T.np_dtype(t.dtype)})", span)
        out[p.name] = a
    return out


def load_npz(path: str) -> dict[str, np.ndarray]:
    """Read an .npz; unreadable files are user errors located at the file."""
    try:
        if not os.path.exists(path):
            raise FileNotFoundError(path)
        if os.path.isdir(path):
            raise ValueError(f"'{path}' is a directory")
        if not zipfile.is_zipfile(path):  # np.load would guess a format and blame pickles
            raise ValueError("not an .npz archive (write one with numpy.savez)")
        with np.load(path, allow_pickle=False) as data:
            if not hasattr(data, "files"):
                raise ValueError("not an .npz archive")
            return {k: data[k] for k in data.files}
    except FileNotFoundError:
        raise SpmdError(f"cannot read inputs: no such file '{path}'", Span(Source(path, ""), 1, 1)) from None
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
        raise SpmdError(f"cannot read inputs: {e}", Span(Source(path, ""), 1, 1)) from None
