"""numpy backends: the global interpreter (the oracle) and the mesh simulator."""

from .interp import run_global
from .sim import run_sim

__all__ = ["run_global", "run_sim"]
