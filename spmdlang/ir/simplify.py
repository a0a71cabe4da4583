"""Canonicalisation of the global program before propagation: IR -> IR, results keep identity.

- A rotation written as slices and a concat, concat([x[n-s:], x[:n-s]], axis), becomes
  roll(x, s, axis): partitioned, a rotation is one collective_permute where the slices and the
  concat would each exchange data.
- Ops whose results nobody uses and no source name refers to are dropped.
`cse` (common subexpressions) serves both the global and the per-partition program.
"""

from __future__ import annotations

from .core import Op, Program, Region


def _full_except(op: Op, axis: int) -> bool:
    x = op.operands[0]
    return all((a, b, s) == (0, n, 1) for d, (n, a, b, s) in
               enumerate(zip(x.type.shape, op.attrs["starts"], op.attrs["stops"], op.attrs["steps"]))
               if d != axis) and op.attrs["steps"][axis] == 1


def _rotation(op: Op, producers) -> Op | None:
    if op.kind != "concat" or len(op.operands) != 2:
        return None
    axis = op.attrs["axis"]
    first, second = (producers.get(v) for v in op.operands)
    if not first or not second or first.kind != "slice" or second.kind != "slice":
        return None
    x = first.operands[0]
    if second.operands[0] is not x or not _full_except(first, axis) or not _full_except(second, axis):
        return None
    n = x.type.shape[axis]
    cut = first.attrs["starts"][axis]
    if (first.attrs["stops"][axis], second.attrs["starts"][axis], second.attrs["stops"][axis]) != (n, 0, cut):
        return None
    return Op("roll", (x,), op.results, {"shift": n - cut, "axis": axis}, op.span)


def _key(op: Op):
    return (op.kind, tuple(id(v) for v in op.operands), tuple(sorted(op.attrs.items())))


def with_regions(op: Op, fn) -> Op:
    """op with each region r replaced by fn(r) (op itself when nothing changes)."""
    if not op.regions:
        return op
    regions = tuple(fn(r) for r in op.regions)
    if all(a is b for a, b in zip(regions, op.regions)):
        return op
    return op.replace(regions=regions)


def _cse_region(region: Region, keep, repl: dict) -> Region:
    ops = _cse_ops(region.ops, keep, repl)
    results = tuple(repl.get(v, v) for v in region.results)
    if len(ops) == len(region.ops) and all(a is b for a, b in zip(ops, region.ops)) and results == region.results:
        return region
    return region.replace(ops=tuple(ops), results=results)


def _cse_ops(ops_in, keep, repl: dict) -> list[Op]:
    seen: dict = {}
    ops = []
    for op in ops_in:
        if repl and any(v in repl for v in op.operands):
            new = op.replace(operands=tuple(repl.get(v, v) for v in op.operands))
            repl[op] = new
            op = new
        if op.regions:  # a loop: its body is deduplicated on its own, the loop never merged
            new = with_regions(op, lambda r: _cse_region(r, keep, repl))
            if new is not op:
                repl[op] = new
            ops.append(new)
            continue
        try:
            key = _key(op)
            hash(key)
        except TypeError:
            ops.append(op)
            continue
        prev = seen.get(key)
        if prev is not None and not any(r in keep for r in op.results):
            repl.update(zip(op.results, prev.results))
            repl[op] = prev
            continue
        seen[key] = op
        ops.append(op)
    return ops


def cse(prog: Program, keep=frozenset()) -> tuple[Program, dict]:
    """Replace an op by an earlier identical one (same kind, operands and attrs; every op is pure).
    Returns the program and a map from each dropped or rewritten op/value to what replaces it."""
    repl: dict = {}
    ops = _cse_ops(prog.ops, keep, repl)
    if not repl:
        return prog, {}
    params = prog.params
    results = tuple(r.__class__(repl.get(r.value, r.value), r.sharding, r.span) for r in prog.results)
    names = tuple((n, repl.get(v, v), s) for n, v, s in prog.names)
    return prog.replace(ops=tuple(ops), params=params, results=results, names=names), repl


def live_ops(ops, roots) -> list[Op]:
    """The ops some root value depends on, in order (every op is pure: the rest is dead code).
    A loop body keeps what its next carries depend on."""
    live = set(roots)
    kept = []
    for op in reversed(ops):
        if any(r in live for r in op.results):
            kept.append(with_regions(op, _live_region))
            live.update(op.operands)
    kept.reverse()
    return kept


def _live_region(region: Region) -> Region:
    ops = live_ops(region.ops, region.results)
    if len(ops) == len(region.ops) and all(a is b for a, b in zip(ops, region.ops)):
        return region
    return region.replace(ops=tuple(ops))


def dead_code(prog: Program, keep=()) -> Program:
    """Drop ops that neither a result nor a value of `keep` depends on."""
    return prog.replace(ops=tuple(live_ops(prog.ops, {r.value for r in prog.results} | set(keep))))


def _rotations(ops_in) -> list[Op]:
    producers = {r: op for op in ops_in for r in op.results}
    return [_rotation(op, producers) or with_regions(op, _region_rotations) for op in ops_in]


def _region_rotations(region: Region) -> Region:
    ops = _rotations(region.ops)
    return region if all(a is b for a, b in zip(ops, region.ops)) else region.replace(ops=tuple(ops))


def simplify(prog: Program) -> Program:
    ops = _rotations(prog.ops)
    kept = live_ops(ops, {r.value for r in prog.results} | {v for _, v, _ in prog.names})
    if len(kept) == len(prog.ops) and all(a is b for a, b in zip(kept, prog.ops)):
        return prog
    return prog.replace(ops=tuple(kept))
