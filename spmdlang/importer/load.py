"""`spmdlang import FILE.py:FUNCTION`: load the user's module and import FUNCTION.

FILE.py defines FUNCTION and FUNCTION_args() (the example arguments, a tuple); it may define
FUNCTION_specs() (in_specs, a pytree prefix of the arguments) and MESH ({axis: size})."""

from __future__ import annotations

import importlib.util
import os
import sys
import traceback
from importlib.machinery import SourceFileLoader

from ..errors import Source, Span, SpmdError


class TargetError(Exception):
    """The FILE.py:FUNCTION argument itself is wrong (exit 2)."""


def split_target(target: str) -> tuple[str, str]:
    path, sep, func = target.rpartition(":")
    if not sep or not path or not func or not func.isidentifier():
        raise TargetError(f"expected FILE.py:FUNCTION, got '{target}'")
    if not os.path.isfile(path):
        raise TargetError(f"no such file: '{path}'")
    return path, func


def _user_span(exc: BaseException, path: str) -> Span | None:
    """The innermost frame of the traceback that lies in the user's file (a syntax error's own
    position, which no frame holds)."""
    real = os.path.realpath(path)
    if isinstance(exc, SyntaxError) and exc.filename and os.path.realpath(exc.filename) == real and exc.lineno:
        return Span(Source(path, _read(path)), exc.lineno, exc.offset or 1)
    found = None
    for fr in traceback.extract_tb(exc.__traceback__):
        if os.path.realpath(fr.filename) == real:
            found = fr
    if found is None:
        return Span(Source(path, _read(path)), 1, 1)
    return Span(Source(path, _read(path)), found.lineno or 1, (found.colno or 0) + 1)


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError):
        return ""


def import_target(target: str, mesh: dict | None = None):
    """The Imported program of FILE.py:FUNCTION (SpmdError for anything the user's code raises)."""
    from . import from_jax

    path, func = split_target(target)
    directory = os.path.dirname(os.path.abspath(path))
    name = f"_spmdlang_import_{os.path.splitext(os.path.basename(path))[0]}"
    sys.path.insert(0, directory)
    try:
        # Python's source loader whatever the file's suffix (importlib finds none for a name without
        # .py: a script, or a file named by mistake, whose syntax error is then reported at its line)
        spec = importlib.util.spec_from_file_location(name, path, loader=SourceFileLoader(name, path))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses (flax's modules) look their module up while it loads
        try:
            spec.loader.exec_module(module)
        except Exception as e:  # noqa: BLE001  (the user's module failed: say where)
            raise SpmdError(f"loading {os.path.basename(path)} raised {type(e).__name__}: {e}",
                            _user_span(e, path)) from None
        where = Span(Source(path, _read(path)), 1, 1)
        fn = getattr(module, func, None)
        if not callable(fn):
            raise SpmdError(f"{os.path.basename(path)} defines no function '{func}'", where)
        args_fn = getattr(module, f"{func}_args", None)
        if not callable(args_fn):
            raise SpmdError(f"{os.path.basename(path)} defines no '{func}_args()' returning the example arguments",
                            where)
        specs_fn = getattr(module, f"{func}_specs", None)
        try:
            args = args_fn()
            if not isinstance(args, (tuple, list)):
                args = (args,)
            specs = specs_fn() if callable(specs_fn) else None
            use_mesh = mesh or getattr(module, "MESH", None)
            return from_jax(fn, *args, mesh=use_mesh, in_specs=specs,
                            name=os.path.splitext(os.path.basename(path))[0] + ".spmd")
        except SpmdError as e:
            if e.message.startswith("from_jax: in_specs") and callable(specs_fn):  # at FUNCTION_specs()
                code = specs_fn.__code__
                e.span = Span(Source(code.co_filename, _read(code.co_filename)), code.co_firstlineno, 1)
                e.message = e.message.replace("from_jax: in_specs", f"{func}_specs()", 1)
            raise
        except Exception as e:  # noqa: BLE001  (tracing the user's function failed)
            raise SpmdError(f"tracing {func} raised {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
                            _user_span(e, path)) from None
    finally:
        sys.path.remove(directory)
        sys.modules.pop(name, None)
