"""Program inputs: validation of user arrays / .npz files, and seeded random inputs."""

from __future__ import annotations

import os
import tokenize
import zipfile

import numpy as np

from .errors import Source, Span, SpmdError
from .ir import types as T
from .ir.core import Program

DEFAULT_INT_RANGE = (0, 16)

# ops an integer value goes through unchanged as ids (the same numbers, rearranged or narrowed)
_PASS_THROUGH = frozenset({"reshape", "transpose", "broadcast_in_dim", "slice", "shard", "cast"})


def _index_bound(op, k: int, producers: dict) -> int | None:
    """How many positions operand `k` of `op` indexes, when `op` uses it as ids or a start: the
    dim it picks from (ids in [0, n)); a dynamic start in [0, n - size]. None: not an index."""
    kind, a = op.kind, op.attrs
    if kind in ("take", "take_along_axis", "scatter_add") and k == 1:
        return op.operands[0].type.shape[a["axis"]]
    if kind == "dynamic_slice" and k >= 1:
        return op.operands[0].type.shape[k - 1] - a["sizes"][k - 1] + 1
    if kind == "dynamic_update_slice" and k >= 2:
        return op.operands[0].type.shape[k - 2] - op.operands[1].type.shape[k - 2] + 1
    if kind == "eq":  # one_hot: ids compared with an iota along the classes
        other = producers.get(op.operands[1 - k])
        if other is not None and other.kind == "iota":
            return other.attrs["shape"][other.attrs["axis"]]
    return None


def index_bounds(prog: Program) -> dict[str, int]:
    """Integer parameters used as ids or dynamic starts, and the number of positions they index
    (the smallest over their uses): followed from the parameter through reshapes, transposes,
    broadcasts, slices, casts, sharding constraints and into loop bodies, to take,
    take_along_axis, scatter_add, one_hot (an eq with an iota), dynamic_slice and
    dynamic_update_slice."""
    from .ir.core import LOOP

    uses: dict = {}
    producers: dict = {}

    def scan(ops):
        for op in ops:
            for r in op.results:
                producers[r] = op
            for k, v in enumerate(op.operands):
                uses.setdefault(v, []).append((op, k))
            for region in op.regions:
                scan(region.ops)

    scan(prog.ops)
    out = {}
    for p in prog.params:
        if not T.is_int(p.value.type.dtype):
            continue
        bound, todo, seen = None, [p.value], set()
        while todo:
            v = todo.pop()
            if v in seen:
                continue
            seen.add(v)
            for op, k in uses.get(v, ()):
                if op.kind == LOOP:  # operand k is the body's parameter k + 1 (after the index)
                    todo.append(op.regions[0].params[k + 1])
                elif op.kind in _PASS_THROUGH and T.is_int(op.results[0].type.dtype):
                    todo.append(op.results[0])
                else:
                    n = _index_bound(op, k, producers)
                    if n is not None:
                        bound = max(1, n) if bound is None else min(bound, max(1, n))
        if bound is not None:
            out[p.name] = bound
    return out


def int_ranges(prog: Program, int_range: tuple[int, int] | None = None) -> dict[str, tuple[int, int]]:
    """The range [lo, hi) random_inputs draws each integer parameter from: `int_range` for every
    one when given; else [0, n) for a parameter used as ids over n positions, [0, 16) for others."""
    bounds = {} if int_range is not None else index_bounds(prog)
    return {p.name: tuple(int_range) if int_range is not None else
            ((0, bounds[p.name]) if p.name in bounds else DEFAULT_INT_RANGE)
            for p in prog.params if T.is_int(p.value.type.dtype)}


def random_inputs(prog: Program, seed: int = 0, int_range: tuple[int, int] | None = None) -> dict[str, np.ndarray]:
    """Floats standard normal, bools a fair coin, u32 (keys, bits) uniform over all 2**32 values
    (unless `int_range` is given), other ints uniform in int_ranges(prog, int_range): an integer
    parameter used as ids over the dim it indexes, others in [0, 16); in parameter order, from one
    stream."""
    rng = np.random.default_rng(seed)
    ranges = int_ranges(prog, int_range)
    out = {}
    for p in prog.params:
        t = p.value.type
        if T.is_float(t.dtype):
            a = rng.standard_normal(t.shape)
        elif t.dtype == "u32" and int_range is None:
            a = rng.integers(0, 2**32, size=t.shape)
        elif T.is_int(t.dtype):
            lo, hi = ranges[p.name]
            info = np.iinfo(T.np_dtype(t.dtype))
            if lo >= hi or lo < info.min or hi - 1 > info.max:
                raise SpmdError(f"cannot draw '{p.name}' ({t}) from the integer range [{lo}, {hi})"
                                + (": it is empty" if lo >= hi else f": {t.dtype} holds [{info.min}, {info.max}]"),
                                p.span or Span(prog.source, 1, 1))
            a = rng.integers(lo, hi, size=t.shape)
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


def _raw_bf16(dtype: np.dtype, want: np.dtype) -> bool:
    """A bf16 array as numpy saves it: bfloat16 is no numpy dtype of its own (ml_dtypes'), so
    np.save writes its two bytes per element as void ('|V2'), and reads them back so."""
    return want.name == "bfloat16" and dtype.kind == "V" and dtype.itemsize == 2 and dtype.fields is None


def _native(a: np.ndarray, want: np.dtype) -> np.ndarray:
    """A non-native byte order of the wanted dtype (e.g. big-endian '>f4' for f32) is converted,
    and a bf16 array's raw bytes (_raw_bf16) viewed as bf16."""
    if _raw_bf16(a.dtype, want):
        return a.view(want)
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
                    try:
                        if version == (1, 0):
                            shape, _fortran, dtype = np.lib.format.read_array_header_1_0(f)
                        elif version == (2, 0):
                            shape, _fortran, dtype = np.lib.format.read_array_header_2_0(f)
                        else:  # 3.0 (a UTF-8 header) and later: numpy's reader, on the whole member
                            with zf.open(info) as g:
                                a = np.lib.format.read_array(g, allow_pickle=False)
                            shape, dtype = a.shape, a.dtype
                    except (ValueError, SyntaxError, tokenize.TokenError) as e:
                        why = e if isinstance(e, ValueError) else "its header dict does not parse"
                        raise _fail(path, f"{path}: member '{info.filename}' has a malformed .npy header ({why})",
                                    span) from None
                if dtype.hasobject:
                    raise _fail(path, f"{path}: '{name}' holds Python objects ({dtype}), not numbers", span)
                if p is not None:
                    t = p.value.type
                    if tuple(shape) != t.shape:
                        raise _fail(path, f"{path}: '{name}' has shape {list(shape)}, but the parameter is {t}",
                                    span)
                    want = T.np_dtype(t.dtype)
                    if dtype != want and dtype.newbyteorder("=") != want and not _raw_bf16(dtype, want):
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
