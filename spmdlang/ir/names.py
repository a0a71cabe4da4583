"""The op names the compiler's passes compare (a pass that asks "is this a constant?" or "is this
an accumulation?"): typed, so a renamed op fails at import, not silently. Each is the name of an
op-table entry (tests/test_collectives.py checks it); the table stays the one list of ops.
Collectives have their own table (ir.collectives.CollectiveKind)."""

from __future__ import annotations

from enum import StrEnum


class OpName(StrEnum):
    FULL = "full"
    ADD = "add"
    SUB = "sub"
    CONCAT = "concat"
    DYNAMIC_SLICE = "dynamic_slice"
    DYNAMIC_UPDATE_SLICE = "dynamic_update_slice"
    SHARD_SLICE = "shard_slice"  # the one reshard step that is local (partition.reshard)
