"""numpy backends: the global interpreter (the oracle) and the mesh simulator."""

from .interp import run_global

__all__ = ["run_global"]
