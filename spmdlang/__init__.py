"""spmdlang: write one array program, annotate a few shardings, get one per-partition program."""

from . import ops as _ops  # noqa: F401  (registers the op table)
from .api import Compiled, compile
from .autoshard import autoshard
from .errors import OverrideError, SpmdError
from .importer import Imported, from_jax

__all__ = ["Compiled", "Imported", "OverrideError", "SpmdError", "autoshard", "compile", "from_jax"]
__version__ = "0.1.0"
