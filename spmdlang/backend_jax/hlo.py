"""The collectives XLA actually runs: parsed from a compiled module's HLO text.

Each collective instruction (the -start half of async pairs) with its group size and the bytes one
device sends, by the ledger's own formulas (the collective table, ir.collectives), so our plan and
XLA's can be compared like for like.
"""

from __future__ import annotations

import re
from math import prod

from ..ir.collectives import BY_HLO, COLLECTIVES, step_bytes

_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4,
          "s64": 8, "u64": 8, "f64": 8}
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(?P<shape>.+?)\s+"
                    r"(?P<op>" + "|".join(map(re.escape, BY_HLO)) + r")(?P<start>-start)?\(")
_ARRAY = re.compile(r"\b([a-z]+\d*)\[([\d,]*)\]")


def _shape_bytes(text: str) -> int:
    total = 0
    for dtype, dims in _ARRAY.findall(text):
        if dtype in _BYTES:
            total += _BYTES[dtype] * prod(int(d) for d in dims.split(",") if d)
    return total


def _group_size(line: str) -> int:
    # mesh form: replica_groups=mesh['a'=2,'b'=4][, device_ids=...] {'b'}: the braced axes form a group
    # a sub-axis is written 'a':(pre)size: the group spans `size` of axis a's devices
    m = re.search(r"replica_groups=mesh\[([^\]]*)\][^{]*\{([^}]*)\}", line)
    if m:
        sizes = dict((k.strip("'"), int(v)) for k, v in (p.split("=") for p in m.group(1).split(",")))
        group = 1
        for item in filter(None, (a.strip() for a in m.group(2).split(","))):
            name, _, sub = item.partition(":")
            group *= int(sub.split(")")[-1]) if sub else sizes[name.strip("'")]
        return group
    m = re.search(r"replica_groups=\{\{([\d,]*)\}", line)
    if m:
        return len([x for x in m.group(1).split(",") if x])
    m = re.search(r"replica_groups=\[([\d,]+)\]<=", line)
    if m:
        return int(m.group(1).split(",")[-1])
    return 1


_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s*\(")
_WHILE = re.compile(r"\swhile\(.*\bbody=%?([\w.\-]+)")
_TRIPS = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')


def _in_computations(lines):
    """(name of the computation a line belongs to, line) for each line of the HLO text: a
    computation's header is the one unindented line that opens it."""
    current = ""
    for line in lines:
        if line and not line[0].isspace():
            m = _COMPUTATION.match(line)
            current = m.group(1) if m else current
        yield current, line


def _trip_counts(lines) -> dict[str, int]:
    """Computation name -> how many times it runs per call of the module: a while loop's body
    runs its known trip count times per run of the computation holding the loop."""
    loops: list[tuple[str, str, int]] = []
    for current, line in _in_computations(lines):
        m = _WHILE.search(line)
        if m:
            t = _TRIPS.search(line)
            loops.append((current, m.group(1), int(t.group(1)) if t else 1))
    runs: dict[str, int] = {}
    for _ in range(len(loops)):  # nested loops: settle outer ones first, whatever the text order
        for parent, body, n in loops:
            runs[body] = runs.get(parent, 1) * n
    return runs


def collectives(hlo_text: str) -> list[dict]:
    """[{kind, group, bytes_per_device, trip_count}] for every collective in the HLO module;
    `trip_count`: the times it runs (more than 1 inside a while loop with a known trip count)."""
    out = []
    lines = hlo_text.splitlines()
    runs = _trip_counts(lines)
    for current, line in _in_computations(lines):
        m = _INSTR.match(line)
        if not m:
            continue
        kind = BY_HLO[m.group("op")]
        shape = m.group("shape")
        if m.group("start") and shape.startswith("("):
            # async start ops return (operands, results, ...): the last element is the result
            parts = _ARRAY.findall(shape)
            shape = "{}[{}]".format(*parts[-1]) if parts else shape
        size = _shape_bytes(shape)
        k = _group_size(line)
        # the shape is the result's; the formulas take the operand's local bytes
        sent = step_bytes(kind, k, COLLECTIVES[kind].operand_bytes(size, k)) if k else 0
        out.append({"kind": kind, "group": k, "bytes_per_device": sent, "trip_count": runs.get(current, 1)})
    return out


def compiled_text(fn, *args) -> str:
    """HLO text of a jitted function after XLA's passes (partitioning included)."""
    return fn.lower(*args).compile().as_text()
