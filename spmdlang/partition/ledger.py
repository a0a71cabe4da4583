"""The communication ledger: every collective the partitioner emits, with the op and line that
caused it (what `explain` shows, and what the plan regression suite records)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..ir.collectives import CollectiveKind
from ..ir.core import Op


@dataclass
class Collective:
    """One entry of the communication ledger."""

    kind: CollectiveKind
    axes: tuple[str, ...]
    bytes_per_device: float
    line: int | None
    op: str  # the global op whose partitioning needed it
    reason: str
    local_op: Op | None = None
    reduce: str = "sum"
    trip_count: int = 1  # runs once per iteration of the loops around it: this many times in all
    backward: bool | None = False  # needed by the backward pass (differentiation); None: both passes


@dataclass
class Ledger:
    """The entries in emission order, each with the global op it was logged for (None inside a
    loop body: such an entry never joins a combined settlement), and each collective's reason."""

    entries: list[Collective] = field(default_factory=list)
    at: list[Op | None] = field(default_factory=list)
    notes: dict[Op, str] = field(default_factory=dict)

    def add(self, entry: Collective, at: Op | None) -> None:
        self.entries.append(entry)
        self.at.append(at)
        self.notes[entry.local_op] = entry.reason

    def __len__(self) -> int:
        return len(self.entries)

    def truncate(self, n: int) -> None:
        """Forget every entry after the first n (a loop body partitioned again)."""
        del self.entries[n:], self.at[n:]


def remapped(entries: list[Collective], repl: dict, live: set[Op]) -> list[Collective]:
    """The entries after a rewrite of the per-partition program: each follows its op through
    `repl` (op -> what replaced it, in chains), entries whose op is no longer in the program (`live`)
    are dropped, and ops that became one keep one entry."""
    out: list[Collective] = []
    kept: set[int] = set()  # ids of the ops already kept (a set: a scan of `out` is quadratic)
    for c in entries:
        op = repl.get(c.local_op, c.local_op)
        while op in repl:
            op = repl[op]
        if op in live and id(op) not in kept:
            kept.add(id(op))
            out.append(replace(c, local_op=op))
    return out
