"""The op table. Importing this package registers every primitive (see registry.OpDef)."""

from . import bitwise, collective, contract, create, dynamic, elementwise, layout, pool, random, reduce, scan, select  # noqa: F401  (registration)
from .registry import OPS, OpDef, get

__all__ = ["OPS", "OpDef", "get"]
