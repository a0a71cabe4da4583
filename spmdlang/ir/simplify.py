"""Canonicalisation of the global program before propagation: IR -> IR, results keep identity.

- A rotation written as slices and a concat, concat([x[n-s:], x[:n-s]], axis), becomes
  roll(x, s, axis): partitioned, a rotation is one collective_permute where the slices and the
  concat would each exchange data. So does its transpose as jax writes it, the slices padded
  back with zeros and added: pad(x[c:], hi=c) + pad(x[:c], lo=n-c) is roll(x, n-c).
- Algebraic identities (`algebraic`): what autodiff and broadcasting leave behind, so that the
  emitted module stays small and readable. Each rewrite keeps every element's value bit for bit,
  NaN, infinities and the sign of zero included, and the result's dtype and shape:
    rank-0 f32/f64 constants combined by + - * / fold into one (IEEE-exact in every backend);
    x ** 1, x * 1, 1 * x, x / 1, x - (+0), x + (-0) (and for integers x + 0, 0 + x) -> x
    (not x + (+0.0): -0.0 + 0.0 is +0.0); -(-x) -> x; where(c, x, x) -> x; cast to x's dtype -> x;
    broadcast of a broadcast, reshape of a reshape, transpose of a transpose -> one op (or x when
    it does nothing).
  A rewrite never touches a gradient a grad call returns (the xla oracle recomputes those).
- Ops whose results nobody uses and no source name refers to are dropped.
- A constant made from attributes alone (full, iota) gets one copy per use (`split_constants`,
  as XLA's HloConstantSplitter does before sharding propagation): a constant is free to make in
  any layout, so two users of one zeros buffer (the stacked residuals of two loops, the gradients
  of two weights laid out differently) must not tie each other's shardings through it.
`cse` (common subexpressions) serves both the global and the per-partition program.
"""

from __future__ import annotations

import math

import numpy as np

from . import registry
from . import types as T
from .core import LOOP, Loop, Op, Program, Region, Value, make_loop, rewrite_regions
from .names import OpName
from .registry import Family


def _full_except(op: Op, axis: int) -> bool:
    x = op.operands[0]
    return all((a, b, s) == (0, n, 1) for d, (n, a, b, s) in
               enumerate(zip(x.type.shape, op.attrs["starts"], op.attrs["stops"], op.attrs["steps"]))
               if d != axis) and op.attrs["steps"][axis] == 1


def _rotation(op: Op, producers) -> Op | None:
    if op.kind != OpName.CONCAT or len(op.operands) != 2:
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


def _padded_slice(op: Op | None, producers):
    """(x, axis, slice start, slice stop, pad lo, pad hi) of pad(x[a:b], zeros on `axis` only),
    the slice whole on every other dim; else None."""
    if op is None or op.kind != "pad" or op.attrs["value"] != 0:
        return None
    sl = producers.get(op.operands[0])
    if sl is None or sl.kind != "slice":
        return None
    padded = [d for d, (a, b) in enumerate(zip(op.attrs["lo"], op.attrs["hi"])) if a or b]
    if len(padded) != 1 or not _full_except(sl, padded[0]):
        return None
    axis = padded[0]
    return (sl.operands[0], axis, sl.attrs["starts"][axis], sl.attrs["stops"][axis], op.attrs["lo"][axis],
            op.attrs["hi"][axis])


def _padded_rotation(op: Op, producers) -> Op | None:
    """pad(x[c:], hi=c) + pad(x[:c], lo=n-c) is roll(x, n - c): the transpose of a rotation as
    jax differentiates one (the slices' cotangents padded back and added)."""
    if op.kind != OpName.ADD or len(op.operands) != 2 or op.operands[0] is op.operands[1]:
        return None
    first, second = (_padded_slice(producers.get(v), producers) for v in op.operands)
    if first is None or second is None:
        return None
    if first[2] == 0:
        first, second = second, first
    (x, axis, a, b, lo, hi), (x2, axis2, a2, b2, lo2, hi2) = first, second
    n = x.type.shape[axis]
    if x2 is not x or axis2 != axis or op.results[0].type != x.type or not 0 < a < n:
        return None
    if (b, lo, hi, a2, b2, lo2, hi2) != (n, 0, a, 0, a, n - a, 0):
        return None
    return Op("roll", (x,), op.results, {"shift": n - a, "axis": axis}, op.span, op.backward)


def _hints(op: Op) -> tuple[str, ...]:
    e = registry.entry(op.kind)
    return e.hints if e is not None else ()


def _key(op: Op, passes: bool = True):
    # backward ops never stand in for forward ones (nor the other way) in the global program
    # (`passes`): the xla oracle replaces the backward ops of a grad call by jax's autodiff. Ops
    # that differ only in hints (the op table's `hints`) compute the same value: they merge (see
    # _cse_ops)
    hints = _hints(op)
    attrs = {k: v for k, v in op.attrs.items() if k not in hints} if hints else op.attrs
    return (op.kind, tuple(id(v) for v in op.operands), tuple(sorted((k, _exact(v)) for k, v in attrs.items())),
            op.backward if passes else None)


def _exact(v):
    """An attribute as a key that tells -0.0 from 0.0 (equal, and hashed alike, as floats): the
    constants of `x + 0.0` and `minimum(x, -0.0)` are two values, not one."""
    if isinstance(v, (float, np.floating)):
        return (float(v), math.copysign(1.0, v))
    if isinstance(v, tuple):
        return tuple(map(_exact, v))
    return v


def _cse_ops(ops_in, keep, repl: dict, passes: bool = True) -> list[Op]:
    seen: dict = {}
    ops = []
    for op in ops_in:
        if repl and any(v in repl for v in op.operands):
            new = op.replace(operands=tuple(repl.get(v, v) for v in op.operands))
            repl[op] = new
            op = new
        if op.regions:  # a loop: its body is deduplicated on its own, the loop never merged
            new = rewrite_regions(op, lambda r: (_cse_ops(r.ops, keep, repl, passes),
                                                 [repl.get(v, v) for v in r.results]))
            if new is not op:
                repl[op] = new
            ops.append(new)
            continue
        try:
            key = _key(op, passes)
            hash(key)
        except TypeError:
            ops.append(op)
            continue
        prev = seen.get(key)
        if prev is not None and not any(r in keep for r in op.results):
            lost = [h for h in _hints(op) if h in prev.attrs and op.attrs.get(h) != prev.attrs[h]]
            if lost:  # a hint the merged op lacks does not hold for the merged value
                plain = prev.replace(attrs={k: v for k, v in prev.attrs.items() if k not in lost})
                ops[ops.index(prev)] = seen[key] = repl[prev] = plain
                prev = plain
            repl.update(zip(op.results, prev.results))
            repl[op] = prev
            continue
        seen[key] = op
        ops.append(op)
    return ops


def cse(prog: Program, keep=frozenset(), passes: bool = True) -> tuple[Program, dict]:
    """Replace an op by an earlier identical one (same kind, operands and attrs; every op is pure).
    `passes=False` (the per-partition program, which no oracle reads by pass) merges a backward op
    into its forward twin too: a max pool's gradient exchanges the halo its forward pass did.
    Returns the program and a map from each dropped or rewritten op/value to what replaces it."""
    repl: dict = {}
    ops = _cse_ops(prog.ops, keep, repl, passes)
    if not repl:
        return prog, {}
    params = prog.params
    results = tuple(r.__class__(repl.get(r.value, r.value), r.sharding, r.span) for r in prog.results)
    names = tuple((n, repl.get(v, v), s) for n, v, s in prog.names)
    grads = tuple(g.remapped(repl) for g in prog.grads)
    return prog.replace(ops=tuple(ops), params=params, results=results, names=names, grads=grads), repl


def live_ops(ops, roots, carries: bool = False) -> list[Op]:
    """The ops some root value depends on, in order (every op is pure: the rest is dead code).
    A loop body keeps what its next carries depend on; with `carries`, a loop also drops the
    carries nothing needs (see _live_loop)."""
    live = set(roots)
    kept = []
    for op in reversed(ops):
        if any(r in live for r in op.results):
            if carries and op.kind == LOOP:
                op = _live_loop(op, live)
            else:
                op = rewrite_regions(op, lambda r: live_ops(r.ops, r.results, carries))
            kept.append(op)
            live.update(op.operands)
    kept.reverse()
    return kept


def _live_loop(op: Op, live: set) -> Op:
    """A loop without its dead carries and captures: a carry whose result nothing after the loop
    reads and which no needed carry's next value depends on (what grad's forward loop stacks for
    a backward loop that never reads it: a loss accumulated in the loop), and a capture the body
    no longer reads. Fewer carries: an accumulation read only by its own add is one again."""
    loop = Loop(op)
    keep = {k for k, r in enumerate(op.results) if r in live}
    while True:
        body_ops = live_ops(loop.body.ops, [loop.body.results[k] for k in sorted(keep)], True)
        used = {v for b in body_ops for v in b.operands} | {loop.body.results[k] for k in keep}
        more = {k for k, c in enumerate(loop.carries) if c in used} - keep
        if not more:
            break
        keep |= more
    ks = sorted(keep)
    caps = [(p, c) for p, c in zip(loop.capture_params, loop.captures) if p in used]
    if len(ks) == loop.n and len(caps) == len(loop.captures):
        return rewrite_regions(op, lambda r: body_ops)
    body = Region((loop.index, *(loop.carries[k] for k in ks), *(p for p, _ in caps)), tuple(body_ops),
                  tuple(loop.body.results[k] for k in ks))
    return op.replace(operands=(*(loop.inits[k] for k in ks), *(c for _, c in caps)),
                      results=tuple(op.results[k] for k in ks), regions=(body,))


def dead_code(prog: Program, keep=()) -> Program:
    """Drop ops that neither a result nor a value of `keep` depends on."""
    return prog.replace(ops=tuple(live_ops(prog.ops, {r.value for r in prog.results} | set(keep))))


def _rotations(ops_in) -> list[Op]:
    producers = {r: op for op in ops_in for r in op.results}
    return [_rotation(op, producers) or _padded_rotation(op, producers)
            or rewrite_regions(op, lambda r: _rotations(r.ops)) for op in ops_in]


def hoist_invariants(ops_in) -> list[Op]:
    """Loop-invariant code motion: a body op whose operands are all loop-invariant (captures, or
    results of such ops) runs once, before the loop, and its result comes in as a capture, so
    whatever communication it needs happens once too. Constants move only along with an op that
    uses them (a copy stays in the body if the body uses them as well); nested loops first."""
    out: list[Op] = []
    for op in ops_in:
        if op.kind != LOOP:
            out.append(op)
            continue
        loop = Loop(op)
        body_ops = hoist_invariants(loop.body.ops)
        invariant: set[Value] = set(loop.capture_params)
        inv_ops = []
        for bop in body_ops:
            if not bop.regions and all(v in invariant for v in bop.operands):
                inv_ops.append(bop)
                invariant.update(bop.results)
        users: dict[Value, list[Op]] = {}
        for bop in body_ops:
            for v in bop.operands:
                users.setdefault(v, []).append(bop)
        moved = {bop for bop in inv_ops if bop.operands}
        moved |= {bop for bop in inv_ops if not bop.operands
                  and any(u in moved for r in bop.results for u in users.get(r, ()))}
        if not any(bop.operands for bop in moved):
            out.append(op.replace(regions=(loop.body.replace(ops=tuple(body_ops)),)))
            continue
        outer = dict(zip(loop.capture_params, loop.captures))  # body value -> its value outside
        for bop in body_ops:
            if bop in moved:
                clone = bop.replace(operands=tuple(outer[v] for v in bop.operands),
                                    results=tuple(Value(r.type, r.name) for r in bop.results))
                out.append(clone)
                outer.update(zip(bop.results, clone.results))
        kept = [bop for bop in body_ops if bop not in moved or (not bop.operands and any(
            u not in moved for r in bop.results for u in users.get(r, ())))]
        kept_results = {r for bop in kept for r in bop.results}
        needed = {v for bop in kept for v in bop.operands} | set(loop.body.results)
        new_params = {r: Value(r.type, r.name) for bop in body_ops if bop in moved and bop not in kept
                      for r in bop.results if r in needed and r not in kept_results}
        kept = [bop.replace(operands=tuple(new_params.get(v, v) for v in bop.operands)) for bop in kept]
        results = tuple(new_params.get(v, v) for v in loop.body.results)
        used = {v for bop in kept for v in bop.operands} | set(results)
        # captures the body still reads: the old ones it did not hand over, then the hoisted values
        caps = [(p, c) for p, c in zip(loop.capture_params, loop.captures) if p in used]
        caps += [(p, outer[r]) for r, p in new_params.items()]
        body = Region((loop.index, *loop.carries, *(p for p, _ in caps)), tuple(kept), results)
        out.append(make_loop(loop.start, loop.stop, loop.inits, [c for _, c in caps], body, op.results, op.span,
                              op.backward))
    return out


# ---------------------------------------------------------------------------------- algebra

_FOLD = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}
# every kind `_Algebra.rewrite` looks at (any other op is kept as it is)
_REWRITES = frozenset(_FOLD) | {"pow", "neg", "cast", "reshape", "transpose", "broadcast_in_dim", "select"}


class _Algebra:
    """One walk over ops (loop bodies included) with the constants seen so far and the values
    replaced; `keep`: values that must stay what they are (a grad call's gradients)."""

    def __init__(self, keep):
        self.keep = keep
        self.repl: dict = {}
        self.const: dict[Value, object] = {}  # value -> its element, for every `full`
        self.producer: dict[Value, Op] = {}

    def scalar(self, v: Value):
        """v's constant element if v is a constant (a full, or a broadcast of one), else None."""
        if v in self.const:
            return self.const[v]
        op = self.producer.get(v)
        if op is not None and op.kind == "broadcast_in_dim" and op.operands[0] in self.const:
            return self.const[op.operands[0]]
        return None

    def is_value(self, v: Value, value, sign: bool = False) -> bool:
        """v is a constant equal to `value` (with `sign`: a float zero of the same sign too)."""
        c = self.scalar(v)
        if c is None or isinstance(c, bool) or c != value:
            return False
        return not sign or math.copysign(1.0, float(c)) == math.copysign(1.0, float(value))

    def rewrite(self, op: Op):
        """A value that stands for op's result, or a replacement op, or None (keep op)."""
        k, a, r = op.kind, op.operands, op.results[0] if len(op.results) == 1 else None
        if k not in _REWRITES or r is None or r in self.keep:
            return None
        same = lambda x: x.type == r.type  # noqa: E731
        if k in _FOLD and r.type.dtype in ("f32", "f64") and r.type.rank == 0 and all(
                v.type.rank == 0 and v in self.const for v in a):
            x, y = (np.asarray(self.const[v], dtype=T.np_dtype(r.type.dtype)) for v in a)
            with np.errstate(all="ignore"):
                value = float(_FOLD[k](x, y))
            return Op("full", (), op.results, {"dtype": r.type.dtype, "shape": (), "value": value},
                      op.span, op.backward)
        if k == "pow" and same(a[0]) and T.is_float(r.type.dtype) and self.is_value(a[1], 1):
            return a[0]
        if k == "mul":
            for x, c in ((a[0], a[1]), (a[1], a[0])):
                if same(x) and self.is_value(c, 1):
                    return x
        if k == "div" and same(a[0]) and self.is_value(a[1], 1):
            return a[0]
        if k == "sub" and same(a[0]) and self.is_value(a[1], 0, sign=T.is_float(r.type.dtype)):
            return a[0]
        if k == "add":
            zero = -0.0 if T.is_float(r.type.dtype) else 0
            for x, c in ((a[0], a[1]), (a[1], a[0])):
                if same(x) and self.is_value(c, zero, sign=T.is_float(r.type.dtype)):
                    return x
        if k in ("neg", "cast", "reshape", "transpose", "broadcast_in_dim", "select"):
            return self._layout(op, k, a, r)
        return None

    def _layout(self, op: Op, k: str, a, r: Value):
        inner = self.producer.get(a[0])
        if k == "neg" and inner is not None and inner.kind == "neg" and inner.operands[0].type == r.type:
            return inner.operands[0]
        if k == "cast" and a[0].type == r.type:
            return a[0]
        if k == "select" and a[1] is a[2] and a[1].type == r.type:
            return a[1]
        if k == "reshape":
            if a[0].type == r.type:
                return a[0]
            if inner is not None and inner.kind == "reshape":
                src = inner.operands[0]
                return src if src.type == r.type else op.replace(operands=(src,))
        if k == "transpose":
            perm = tuple(op.attrs["perm"])
            if perm == tuple(range(len(perm))):
                return a[0]
            moved = [p for p in perm if a[0].type.shape[p] != 1]
            if a[0].type == r.type and moved == sorted(moved):  # only dims of size 1 move: the same array
                return a[0]
            if inner is not None and inner.kind == "transpose":
                first = tuple(inner.attrs["perm"])
                both = tuple(first[p] for p in perm)
                src = inner.operands[0]
                if both == tuple(range(len(both))):
                    return src
                return op.replace(operands=(src,), attrs={**op.attrs, "perm": both})
        if k == "broadcast_in_dim":
            dims = tuple(op.attrs["dims"])
            if a[0].type == r.type and dims == tuple(range(r.type.rank)):
                return a[0]
            if inner is not None and inner.kind == "broadcast_in_dim":
                first = tuple(inner.attrs["dims"])
                return op.replace(operands=inner.operands, attrs={**op.attrs, "dims": tuple(dims[d] for d in first)})
        return None

    def ops(self, ops_in) -> list[Op]:
        out = []
        repl = self.repl
        for orig in ops_in:
            op = orig
            if repl and any(v in repl for v in op.operands):
                op = op.replace(operands=tuple(self.repl.get(v, v) for v in op.operands))
            if op.regions:
                op = rewrite_regions(op, lambda r: (self.ops(r.ops), [self.repl.get(v, v) for v in r.results]))
                if op is not orig:
                    self.repl[orig] = op
                out.append(op)
                continue
            got = self.rewrite(op)
            while isinstance(got, Op):  # a rewritten op may simplify further (a fold, then x ** 1)
                op, got = got, self.rewrite(got)
            if isinstance(got, Value):
                self.repl[op.results[0]] = got
                continue
            if op is not orig:  # a collective's ledger entry follows its op
                self.repl[orig] = op
            if op.kind == OpName.FULL and op.results[0].type.size:
                self.const[op.results[0]] = op.attrs["value"]
            for v in op.results:
                self.producer[v] = op
            out.append(op)
        return out


def algebraic(prog: Program) -> tuple[Program, dict]:
    """The program with the identities of the module docstring applied (dead ops are left for
    dead-code removal), and a map from each replaced value or op to what stands for it now."""
    keep = {v for g in prog.grads for v in g.grads}
    alg = _Algebra(keep)
    ops = alg.ops(prog.ops)
    if not alg.repl and len(ops) == len(prog.ops) and all(a is b for a, b in zip(ops, prog.ops)):
        return prog, {}
    repl = alg.repl
    results = tuple(r.__class__(repl.get(r.value, r.value), r.sharding, r.span) for r in prog.results)
    names = tuple((n, repl.get(v, v), s) for n, v, s in prog.names)
    grads = tuple(g.remapped(repl) for g in prog.grads)
    return prog.replace(ops=tuple(ops), results=results, names=names, grads=grads), repl


def simplify(prog: Program) -> Program:
    prog = algebraic(prog)[0]
    ops = _rotations(hoist_invariants(prog.ops))
    kept = live_ops(ops, {r.value for r in prog.results} | {v for _, v, _ in prog.names}, carries=True)
    if len(kept) == len(prog.ops) and all(a is b for a, b in zip(kept, prog.ops)):
        return prog
    return prog.replace(ops=tuple(kept))


def _is_free_constant(op: Op) -> bool:
    """An op that makes a tensor from its attributes alone and costs nothing to make in any layout
    (full, iota); scalars are left alone (a scalar has one layout)."""
    return (not op.operands and not op.regions and op.kind != LOOP and op.results[0].type.rank > 0
            and registry.get(op.kind).family == Family.create)


def _clone(op: Op) -> Op:
    return op.replace(results=tuple(Value(r.type, r.name) for r in op.results))


def _split_constants(ops_in) -> list[Op]:
    consts = {op.result: op for op in ops_in if _is_free_constant(op)}
    used: set[Value] = set()
    out: list[Op] = []
    for op in ops_in:
        if op.kind == LOOP:
            op = _sink_shared_captures(op, consts)
            op = rewrite_regions(op, lambda r: _split_constants(r.ops))
        operands = list(op.operands)
        for i, v in enumerate(operands):
            if v not in consts:
                continue
            if v in used:  # a second use: its own copy, made right before its user
                copy = _clone(consts[v])
                out.append(copy)
                operands[i] = copy.result
            used.add(v)
        out.append(op if operands == list(op.operands) else op.replace(operands=tuple(operands)))
    return out


def _sink_shared_captures(op: Op, consts: dict) -> Op:
    """A captured `full` (a scalar broadcast: the partitioner makes one in any layout, and reads
    its value where it is a gradient buffer's zeros), or another captured constant that the body
    uses more than once, is made in the body instead (where each use then gets a copy); an iota
    used once stays captured, made once before the loop."""
    loop = Loop(op)
    uses: dict[Value, int] = {}
    for v in [*(v for bop in loop.body.ops for v in bop.operands), *loop.body.results]:
        uses[v] = uses.get(v, 0) + 1
    made = {p: _clone(consts[c]) for p, c in zip(loop.capture_params, loop.captures)
            if c in consts and (uses.get(p, 0) > 1 or consts[c].kind == OpName.FULL)}
    if not made:
        return op
    ops = [*made.values()]
    ops += [bop.replace(operands=tuple(made[v].result if v in made else v for v in bop.operands))
            for bop in loop.body.ops]
    results = tuple(made[v].result if v in made else v for v in loop.body.results)
    caps = [(p, c) for p, c in zip(loop.capture_params, loop.captures) if p not in made]
    body = Region((loop.index, *loop.carries, *(p for p, _ in caps)), tuple(ops), results)
    return make_loop(loop.start, loop.stop, loop.inits, [c for _, c in caps], body, op.results, op.span,
                     op.backward)


def split_constants(prog: Program) -> Program:
    """Every use of a free constant (full, iota) its own copy, loop bodies included (a captured
    constant is mostly made in the body, a copy per use: _sink_shared_captures):
    propagation then gives each copy its user's layout, and the per-partition program's CSE
    merges the copies that end up alike."""
    ops = _split_constants(prog.ops)
    if len(ops) == len(prog.ops) and all(a is b for a, b in zip(ops, prog.ops)):
        return prog
    return prog.replace(ops=tuple(ops))
