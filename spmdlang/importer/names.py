"""Readable names for an imported program: parameters from pytree key paths, values from the
user's source line that computed them, and the `file:line` spans errors point at."""

from __future__ import annotations

import keyword
import linecache
import os
import re

from ..errors import Source, Span

# names a value may not take: the language's keywords, and builtins a reader would mistake it for
RESERVED = {"mesh", "devices", "const", "func", "return", "for", "loop", "in", "range", "true", "false",
            "struct"}
_ASSIGN = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(?::[^=]*)?(?:[-+*/@]|//)?=(?!=)")


def _builtins() -> set[str]:
    from ..frontend.builtins import BUILTINS

    return set(BUILTINS)


def sanitize(text: str) -> str:
    """`text` as an identifier of the language: runs of other characters become one `_`."""
    name = re.sub(r"[^A-Za-z0-9_]+", "_", text).strip("_") or "x"
    if name[0].isdigit():
        name = "_" + name
    if name in RESERVED or name in _builtins() or keyword.iskeyword(name):
        name += "_"
    return name


def key_name(key) -> str:
    """One key of a jax key path as text: dict keys, attribute names, sequence indices."""
    for attr in ("key", "name", "idx"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def path_name(prefix: str, path) -> str:
    """`params` + ('decoder', 'layers_0', 'kernel') -> params_decoder_layers_0_kernel. A first key
    equal to the prefix (flax's {"params": ...} handed in as `params`) is said once."""
    parts = [key_name(k) for k in path]
    if parts and parts[0] == prefix:
        parts = parts[1:]
    return sanitize("_".join([prefix, *parts]))


def user_frame(eqn):
    """The first frame of the user's code (not jax's) that produced `eqn`, or None."""
    from jax._src import source_info_util as siu

    try:
        return siu.user_frame(eqn.source_info.traceback)
    except Exception:  # noqa: BLE001  (no traceback recorded)
        return None


_LIBRARY_DIRS = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep)


def own_frame(eqn):
    """The first frame of the user's own code that produced `eqn`: not jax's, nor an installed
    library's (flax, optax, ...: a refusal points at the user's call into them), or None."""
    from jax._src import source_info_util as siu

    try:
        frames = list(siu.user_frames(eqn.source_info.traceback))
    except Exception:  # noqa: BLE001  (no traceback recorded)
        return None
    mine = [f for f in frames if not any(d in f.file_name for d in _LIBRARY_DIRS)]
    return (mine or frames or [None])[0]


def frame_span(frame) -> Span | None:
    """A Span at the frame's line, with the file's text so the error shows the line."""
    if frame is None:
        return None
    name = frame.file_name
    text = "".join(linecache.getlines(name)) if os.path.exists(name) else ""
    return Span(Source(name, text), frame.start_line, max(1, frame.start_column + 1))


def frame_target(frame) -> str | None:
    """The name a line of Python assigns (`h = jnp.tanh(x @ w)` -> h), or None."""
    if frame is None:
        return None
    line = linecache.getline(frame.file_name, frame.start_line)
    m = _ASSIGN.match(line)
    if not m or m.group(1) in ("self", "_"):
        return None
    return m.group(1)


def frame_comment(frame) -> str | None:
    """`file.py:LINE: the line`, for a comment above the statements that line produced."""
    if frame is None:
        return None
    line = linecache.getline(frame.file_name, frame.start_line).strip()
    where = f"{os.path.basename(frame.file_name)}:{frame.start_line}"
    return f"{where}: {line}" if line else where


def scope_name(eqn) -> str:
    """The innermost named scope of `eqn` (a flax module such as Dense_0), transforms stripped."""
    stack = str(getattr(eqn.source_info, "name_stack", "") or "")
    parts = [p for p in stack.split("/") if p]
    for p in reversed(parts):
        while "(" in p and p.endswith(")"):
            p = p[p.index("(") + 1:-1]
        if p and p not in ("jvp", "transpose", "vmap", "pjit", "jit", "checkpoint", "remat"):
            return p
    return ""
