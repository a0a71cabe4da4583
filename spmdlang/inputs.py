"""Program inputs: validation of user arrays / .npz files, and seeded random inputs."""

from __future__ import annotations

import os
import zipfile

import numpy as np

from .errors import Source, Span, SpmdError
from .ir import types as T
from .ir.core import Program


def random_inputs(prog: Program, seed: int = 0) -> dict[str, np.ndarray]:
    """Floats standard normal, ints uniform in [0, 16), u32 (keys, bits) uniform over all 2**32
    values, bools a fair coin; in parameter order, from one stream."""
    rng = np.random.default_rng(seed)
    out = {}
    for p in prog.params:
        t = p.value.type
        if T.is_float(t.dtype):
            a = rng.standard_normal(t.shape)
        elif t.dtype == "u32":
            a = rng.integers(0, 2**32, size=t.shape)
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
        a = _native(np.asarray(inputs[p.name]), T.np_dtype(t.dtype))
        if tuple(a.shape) != t.shape:
            raise SpmdError(f"{origin}: '{p.name}' has shape {list(a.shape)}, but the parameter is {t}", span)
        if a.dtype != T.np_dtype(t.dtype):
            raise SpmdError(f"{origin}: '{p.name}' has dtype {a.dtype}, but the parameter is {t} "
                            f"({T.np_dtype(t.dtype)})", span)
        out[p.name] = a
    return out


def _native(a: np.ndarray, want: np.dtype) -> np.ndarray:
    """A non-native byte order of the wanted dtype (e.g. big-endian '>f4' for f32) is converted."""
    if a.dtype != want and a.dtype.byteorder not in ("=", "|") and a.dtype.newbyteorder("=") == want:
        return a.astype(want)
    return a


def _fail(path: str, message: str, span: Span | None = None) -> SpmdError:
    return SpmdError(message, span or Span(Source(path, ""), 1, 1))


def _describe_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> str:
    with zf.open(info) as f:
        head = f.read(16)
    if not head:
        return "an empty member"
    if all(32 <= b < 127 or b in (9, 10, 13) for b in head):
        return f"text starting {head.decode('ascii')!r}"
    return f"{info.file_size} bytes starting {head[:8]!r}, not the .npy magic b'\\x93NUMPY'"


def load_npz(path: str, prog: Program | None = None) -> dict[str, np.ndarray]:
    """Read an .npz of inputs; unreadable files are user errors located at the file.

    With `prog`, each member's .npy header (shape, dtype) is checked against its parameter before
    any data is read, members that name no parameter are not read at all, and a big-endian member
    of the right dtype is converted. Without it, every member is read (after its header)."""
    where = Span(Source(path, ""), 1, 1)
    if not os.path.exists(path):
        raise _fail(path, f"cannot read inputs: no such file '{path}'")
    if os.path.isdir(path):
        raise _fail(path, f"cannot read inputs: '{path}' is a directory")
    if not os.path.isfile(path):  # a FIFO or a device: a zip archive needs a seekable file
        raise _fail(path, f"cannot read inputs: '{path}' is not a regular file (an .npz archive is)")
    try:
        if not zipfile.is_zipfile(path):  # np.load would guess a format and blame pickles
            raise ValueError("not an .npz archive (write one with numpy.savez)")
        with zipfile.ZipFile(path) as zf:
            members: dict[str, zipfile.ZipInfo] = {}
            for info in zf.infolist():
                if info.is_dir():
                    continue
                name = info.filename.removesuffix(".npy")
                if name in members:
                    raise ValueError(f"the archive holds '{name}' twice")
                members[name] = info
            wanted = {p.name: p for p in prog.params} if prog is not None else None
            out = {}
            for name, info in members.items():
                if wanted is not None and name not in wanted:
                    continue  # not a parameter: not read (check_inputs says what is missing)
                p = wanted[name] if wanted is not None else None
                span = (p.span or where) if p is not None else where
                with zf.open(info) as f:
                    try:
                        version = np.lib.format.read_magic(f)
                    except ValueError:
                        raise _fail(path, f"{path}: member '{info.filename}' is not a .npy array "
                                          f"({_describe_member(zf, info)})", span) from None
                    if version == (1, 0):
                        shape, _fortran, dtype = np.lib.format.read_array_header_1_0(f)
                    elif version == (2, 0):
                        shape, _fortran, dtype = np.lib.format.read_array_header_2_0(f)
                    else:  # 3.0: a UTF-8 header, read by numpy's own reader
                        shape, _fortran, dtype = np.lib.format._read_array_header(f, version)
                if dtype.hasobject:
                    raise _fail(path, f"{path}: '{name}' holds Python objects ({dtype}), not numbers", span)
                if p is not None:
                    t = p.value.type
                    if tuple(shape) != t.shape:
                        raise _fail(path, f"{path}: '{name}' has shape {list(shape)}, but the parameter is {t}",
                                    span)
                    want = T.np_dtype(t.dtype)
                    if dtype != want and dtype.newbyteorder("=") != want:
                        raise _fail(path, f"{path}: '{name}' has dtype {dtype}, but the parameter is {t} ({want})",
                                    span)
                with zf.open(info) as f:
                    a = np.lib.format.read_array(f, allow_pickle=False)
                out[name] = _native(a, T.np_dtype(p.value.type.dtype)) if p is not None else a
            return out
    except SpmdError:
        raise
    except (OSError, ValueError, zipfile.BadZipFile, EOFError, RuntimeError, NotImplementedError) as e:
        raise _fail(path, f"cannot read inputs: {e}") from None
