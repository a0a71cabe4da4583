"""Canonicalisation of the global program before propagation: IR -> IR, results keep identity.

- A rotation written as slices and a concat, concat([x[n-s:], x[:n-s]], axis), becomes
  roll(x, s, axis): partitioned, a rotation is one collective_permute where the slices and the
  concat would each exchange data.
- Ops whose results nobody uses and no source name refers to are dropped.
`cse` (common subexpressions) serves both the global and the per-partition program.
"""

from __future__ import annotations

from .core import Op, Program


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
    # backward ops never stand in for forward ones (nor the other way): the xla oracle replaces
    # the backward ops of a grad call by jax's autodiff
    return (op.kind, tuple(id(v) for v in op.operands), tuple(sorted(op.attrs.items())), op.backward)


def cse(prog: Program, keep=frozenset()) -> tuple[Program, dict]:
    """Replace an op by an earlier identical one (same kind, operands and attrs; every op is pure).
    Returns the program and a map from each dropped or rewritten op/value to what replaces it."""
    seen: dict = {}
    repl: dict = {}
    ops = []
    for op in prog.ops:
        if repl and any(v in repl for v in op.operands):
            new = op.replace(operands=tuple(repl.get(v, v) for v in op.operands))
            repl[op] = new
            op = new
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
    if not repl:
        return prog, {}
    params = prog.params
    results = tuple(r.__class__(repl.get(r.value, r.value), r.sharding, r.span) for r in prog.results)
    names = tuple((n, repl.get(v, v), s) for n, v, s in prog.names)
    grads = tuple(g.remapped(repl) for g in prog.grads)
    return prog.replace(ops=tuple(ops), params=params, results=results, names=names, grads=grads), repl


def live_ops(ops, roots) -> list[Op]:
    """The ops some root value depends on, in order (every op is pure: the rest is dead code)."""
    live = set(roots)
    kept = []
    for op in reversed(ops):
        if any(r in live for r in op.results):
            kept.append(op)
            live.update(op.operands)
    kept.reverse()
    return kept


def dead_code(prog: Program, keep=()) -> Program:
    """Drop ops that neither a result nor a value of `keep` depends on."""
    return prog.replace(ops=tuple(live_ops(prog.ops, {r.value for r in prog.results} | set(keep))))


def simplify(prog: Program) -> Program:
    producers = {r: op for op in prog.ops for r in op.results}
    ops = []
    for op in prog.ops:
        ops.append(_rotation(op, producers) or op)
    kept = live_ops(ops, {r.value for r in prog.results} | {v for _, v, _ in prog.names})
    if len(kept) == len(prog.ops) and all(a is b for a, b in zip(kept, prog.ops)):
        return prog
    return prog.replace(ops=tuple(kept))
