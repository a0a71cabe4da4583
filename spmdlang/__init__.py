"""spmdlang: write one array program, annotate a few shardings, get one per-partition program."""

from . import ops as _ops  # noqa: F401  (registers the op table)
from .api import Compiled, compile
from .errors import SpmdError

__all__ = ["Compiled", "SpmdError", "compile"]
__version__ = "0.1.0"
