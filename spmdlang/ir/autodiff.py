"""Reverse-mode differentiation of the global program (grad, value_and_grad), before propagation.

`differentiate` walks the forward ops of one inlined function backwards from its scalar output and
appends the backward pass as ordinary ops of the op table: each op's `vjp` rule (next to its other
rules in spmdlang.ops) maps its result cotangents to operand cotangents. Propagation, the
partitioner, every backend, `explain` and `bench` then see nothing special. Backward ops carry the
span of the forward op they come from and `Op.backward`.

The backward IR is kept small as it is built: a zero cotangent is `None` (no op, no add of zeros),
and only ops on a path from a differentiated input to the output get cotangents (no dead ones).
"""

from __future__ import annotations

from ..errors import Span, SpmdError
from . import registry
from . import types as T
from .builder import Builder
from .core import LOOP, Loop, Op, Region, Value, make_loop
from .names import OpName
from .registry import Grad
from .types import TensorType


def differentiable(v: Value) -> bool:
    return T.is_float(v.type.dtype)


class Differentiator:
    """What a vjp rule builds with: ops appended to the builder, marked backward, at the span of the
    forward op being differentiated."""

    def __init__(self, b: Builder):
        self.b = b
        self.span: Span | None = None
        self.inserted = 0  # ops put before a forward loop (its residual buffers' zeros), for lower_grad
        self.cotangent_of: dict[Value, Value] = {}  # a complete cotangent -> the forward value it is for

    # ---- emission
    def emit(self, kind: str, *operands: Value, **attrs) -> Value:
        (v,) = self.emit_multi(kind, *operands, **attrs)
        return v

    def emit_multi(self, kind: str, *operands: Value, **attrs) -> tuple[Value, ...]:
        saved, self.b.backward = self.b.backward, True
        try:
            return self.b.emit_op(kind, operands, attrs, self.span)
        finally:
            self.b.backward = saved

    def const(self, value, dtype: str) -> Value:
        """A rank-0 constant (elementwise ops broadcast rank-0 operands)."""
        if T.is_int(dtype):
            value = int(value)
        elif T.is_float(dtype):
            value = float(value)
        return self.emit("full", dtype=dtype, shape=(), value=value)

    def full(self, value, t: TensorType) -> Value:
        return self.emit("full", dtype=t.dtype, shape=tuple(t.shape), value=float(value) if T.is_float(t.dtype)
                         else value)

    def zeros(self, t: TensorType) -> Value:
        return self.full(0.0 if T.is_float(t.dtype) else 0, t)

    def like(self, value, v: Value) -> Value:
        """A constant of v's dtype, rank 0."""
        return self.const(value, v.type.dtype)

    def broadcast(self, v: Value, shape) -> Value:
        """v (rank 0, or trailing-aligned as numpy) to `shape`."""
        shape = tuple(shape)
        if v.type.shape == shape:
            return v
        off = len(shape) - v.type.rank
        return self.emit("broadcast_in_dim", v, shape=shape, dims=tuple(range(off, len(shape))))

    def add(self, a: Value | None, b: Value | None) -> Value | None:
        if a is None:
            return b
        if b is None:
            return a
        return self.emit("add", a, b)

    def mul(self, a: Value, b: Value) -> Value:
        return self.emit("mul", a, b)

    def neg(self, a: Value) -> Value:
        return self.emit("neg", a)

    def select(self, c: Value, a: Value, b: Value) -> Value:
        return self.emit("select", c, a, b)

    def unbroadcast(self, c: Value | None, v: Value) -> Value | None:
        """An elementwise op's cotangent for operand v: a rank-0 operand that broadcast gets the sum."""
        if c is None or c.type.shape == v.type.shape:
            return c
        return self.emit("reduce_sum", c, axes=tuple(range(c.type.rank)))

    def sum_to(self, ct: Value, t: TensorType, dims) -> Value:
        """The transpose of broadcast_in_dim(x: t, shape=ct.shape, dims): sum the dims that were
        added or stretched from 1, then put x's shape back."""
        shape = ct.type.shape
        keep = {d for i, d in enumerate(dims) if t.shape[i] == shape[d]}
        axes = tuple(d for d in range(len(shape)) if d not in keep)
        out = self.emit("reduce_sum", ct, axes=axes) if axes else ct
        if out.type.shape != t.shape:
            out = self.emit("reshape", out, shape=tuple(t.shape))
        return out

    # ---- nested differentiation (rules that expand an op into simpler ones and differentiate those)
    def vjp_of(self, build, inputs: list[Value], ct) -> list[Value | None]:
        """Emit `build(*inputs)` (backward-marked ops: a forward expansion), then differentiate it:
        the cotangents of `inputs` for the cotangent `ct` of its result."""
        start = len(self.b.ops)
        saved, self.b.backward = self.b.backward, True
        try:
            out = build(*inputs)
        finally:
            self.b.backward = saved
        ops = list(self.b.ops[start:])
        return backward_pass(self, ops, list(inputs), [(out, ct)])


def backward_pass(d: Differentiator, ops: list[Op], inputs: list[Value], seeds) -> list[Value | None]:
    """Cotangents of `inputs` given cotangents `seeds` [(value, ct)] of values computed by `ops`."""
    depends = {v for v in inputs if differentiable(v)}
    for op in ops:
        if any(v in depends for v in op.operands):
            depends.update(r for r in op.results if differentiable(r))
    needed = {v for v, _ in seeds}
    active = []
    for op in reversed(ops):
        if any(r in needed for r in op.results) and any(v in depends for v in op.operands):
            active.append(op)
            needed.update(op.operands)
    cts: dict[Value, Value] = {}
    for v, ct in seeds:
        if v in depends and ct is not None:
            cts[v] = d.add(cts.get(v), ct)
    saved = d.span
    try:
        for op in active:
            outs = [cts.pop(r, None) for r in op.results]
            if all(c is None for c in outs):
                continue
            for r, c in zip(op.results, outs):  # complete now (lowering names it d_<r's name>)
                if c is not None:
                    d.cotangent_of.setdefault(c, r)
            if op.kind == LOOP:
                d.span = op.span
                got = _loop_vjp(d, op, outs, depends)
                for v, c in zip(op.operands, got):
                    if c is not None and v in depends:
                        cts[v] = d.add(cts.get(v), c)
                continue
            opdef = registry.get(op.kind)
            rule = opdef.vjp
            if rule == Grad.none:
                continue
            if rule is None or rule == Grad.unsupported:
                raise SpmdError(f"grad: differentiating {op.kind} is not supported yet", op.span)
            d.span = op.span
            got = rule(d, op, outs[0] if len(outs) == 1 else tuple(outs))
            for v, c in zip(op.operands, got):
                if c is None or v not in depends:
                    continue
                assert c.type == v.type, (op.kind, c.type, v.type)
                cts[v] = d.add(cts.get(v), c)
    finally:
        d.span = saved
    return [cts.get(v) for v in inputs]


# ---------------------------------------------------------------------------------- loops
# As jax's scan transpose: the forward loop also stacks, per iteration, the residuals its body's
# backward pass needs, here the carries it starts the iteration with (each in a zero [trips, ...]
# buffer written with dynamic_update_slice at index - start); then a reverse loop (index
# stop - 1 - j) recomputes the body from iteration index's carries (read back with dynamic_slice)
# and runs the body's backward pass on it, carrying the cotangents of the carries and summing those
# of the captures (loop-invariant values: weights) into carries of their own. A stacked weight
# w[l] read in the body is a capture: its cotangent is that sum of per-iteration dynamic updates.
# Storing the carries and recomputing the body from them is jax.checkpoint of the scan body: the
# buffers are one carry per iteration, whatever the body computes. Everything built is ordinary
# IR (a LOOP op with its region), marked backward; a loop nested in the body is differentiated
# the same way when its recomputed copy meets backward_pass.


def _clone_ops(ops, m: dict, backward: bool = True) -> list[Op]:
    """`ops` with a fresh value for everything they define (nested regions included); `m` maps
    each old value to its new one and must already hold the values `ops` read from outside."""
    def f(v):
        if v not in m:
            m[v] = Value(v.type, v.name)
        return m[v]

    out = []
    for op in ops:
        operands = tuple(m[v] for v in op.operands)
        regions = tuple(Region(tuple(f(p) for p in r.params), tuple(_clone_ops(r.ops, m, backward)),
                               tuple(m[v] for v in r.results)) for r in op.regions)
        out.append(op.replace(operands=operands, results=tuple(f(v) for v in op.results), regions=regions,
                              backward=backward or op.backward))
    return out


def _i32(d: Differentiator, value: int) -> Value:
    return d.const(int(value), "i32")


def _dependent_carries(loop: Loop, depends: set) -> tuple[set, set]:
    """Positions of the carries and captures through which the loop's results depend on the
    differentiated inputs: captures in `depends`, and carries whose init is, or which some
    iteration makes depend (a fixpoint over the body)."""
    n = loop.n
    caps = {k for k, v in enumerate(loop.captures) if v in depends and differentiable(v)}
    carries = {k for k, v in enumerate(loop.inits) if v in depends and differentiable(v)}
    while True:
        dep = {loop.carries[k] for k in carries} | {loop.capture_params[k] for k in caps}
        for op in loop.body.ops:
            if any(v in dep for v in op.operands):
                dep.update(r for r in op.results if differentiable(r))
        more = {k for k in range(n) if loop.body.results[k] in dep and differentiable(loop.carries[k])}
        if more <= carries:
            return carries, caps
        carries |= more


def _accumulate(d: Differentiator, made: dict, acc: Value, c: Value | None) -> Value:
    """acc + c. A stacked weight w[l]'s cotangent is a window written into zeros,
    dynamic_update_slice(0, u, starts): then only the window is added to, in place,
    dynamic_update_slice(acc, dynamic_slice(acc, starts) + u, starts), so an iteration costs the
    window, not the whole stack."""
    if c is None:
        return acc
    op = made.get(c)
    if op is not None and op.kind == OpName.DYNAMIC_UPDATE_SLICE:
        z = made.get(op.operands[0])
        if z is not None and z.kind == OpName.FULL and z.attrs["value"] == 0:
            u, starts = op.operands[1], op.operands[2:]
            old = d.emit("dynamic_slice", acc, *starts, sizes=tuple(u.type.shape))
            return d.emit("dynamic_update_slice", acc, d.add(old, u), *starts)
    return d.add(acc, c)


def _loop_vjp(d: Differentiator, op: Op, outs, depends: set) -> list[Value | None]:
    loop = Loop(op)
    dep_c, dep_k = _dependent_carries(loop, depends)
    cts: list[Value | None] = [None] * len(op.operands)
    if loop.trips == 0:  # the results are the inits
        for k in dep_c:
            cts[k] = outs[k]
        return cts
    if not dep_c and not dep_k:
        return cts
    stacked, stacks = _stacking_forward(d, op, loop)
    rc, rk = sorted(dep_c), sorted(dep_k)
    results = _reverse_loop(d, op, loop, rc, rk, outs, stacked, stacks)
    for k, r in zip(rc, results):
        cts[k] = r
    for k, r in zip(rk, results[len(rc):]):
        cts[loop.n + k] = r
    return cts


def _body_differentiator(op: Op) -> Differentiator:
    """A differentiator emitting backward ops into a loop body of its own."""
    body_b = Builder()
    body_b.backward = True
    bd = Differentiator(body_b)
    bd.span = op.span
    return bd


def _stacking_forward(d: Differentiator, op: Op, loop: Loop):
    """The forward loop, in place of `op` in d.b.ops, also stacking (trips, ...) the carries its
    body reads. Returns (their carry indices, the stacks)."""
    trips = loop.trips
    read = {v for bop in loop.body.ops for v in bop.operands}
    stacked = [k for k in range(loop.n) if loop.carries[k] in read]
    first = len(d.b.ops)
    zeros = [d.zeros(loop.carries[k].type.with_shape((trips, *loop.carries[k].type.shape))) for k in stacked]
    pre = d.b.ops[first:]
    del d.b.ops[first:]
    bd = _body_differentiator(op)
    stack_params = [Value(z.type, f"{loop.carries[k].name or 'carry'}_stack") for k, z in zip(stacked, zeros)]
    pos = loop.index if loop.start == 0 else bd.emit("sub", loop.index, _i32(bd, loop.start))
    zero = _i32(bd, 0)
    stored = []
    for k, sp in zip(stacked, stack_params):
        c = loop.carries[k]
        upd = bd.emit("reshape", c, shape=(1, *c.type.shape))
        stored.append(bd.emit("dynamic_update_slice", sp, upd, pos, *[zero] * c.type.rank))
    body = loop.body
    fwd_body = Region((body.params[0], *loop.carries, *stack_params, *loop.capture_params),
                      body.ops + tuple(bd.b.ops), body.results + tuple(stored))
    stacks = [Value(z.type, sp.name) for z, sp in zip(zeros, stack_params)]
    fwd = make_loop(loop.start, loop.stop, [*loop.inits, *zeros], loop.captures, fwd_body,
                    [*op.results, *stacks], op.span, op.backward)
    at = next(i for i, o in enumerate(d.b.ops) if o is op)
    d.b.ops[at:at + 1] = [*pre, fwd]
    d.inserted += len(pre)
    return stacked, stacks


def _reverse_loop(d: Differentiator, op: Op, loop: Loop, rc, rk, outs, stacked, stacks) -> list[Value]:
    """The reverse loop: iteration j recomputes forward iteration trips-1-j from the stacked
    carries and runs its backward pass; carries the cotangents of carries `rc` and accumulates
    those of captures `rk`. Returns its results (those cotangents, in that order)."""
    trips, body = loop.trips, loop.body
    inits = [outs[k] if outs[k] is not None else d.zeros(loop.carries[k].type) for k in rc]
    inits += [d.zeros(loop.captures[k].type) for k in rk]
    bd = _body_differentiator(op)
    j = Value(T.TensorType("i32", ()), "j")
    ct_params = [Value(loop.carries[k].type, f"{loop.carries[k].name or 'carry'}_ct") for k in rc]
    acc_params = [Value(loop.captures[k].type, f"{loop.capture_params[k].name or 'capture'}_ct") for k in rk]
    stack_in = [Value(s.type, s.name) for s in stacks]
    cap_in = [Value(c.type, c.name) for c in loop.capture_params]
    back = bd.emit("sub", _i32(bd, trips - 1), j)  # the forward iteration's position, trips - 1 down to 0
    index = back if loop.start == 0 else bd.emit("add", back, _i32(bd, loop.start))
    m = {loop.index: index}
    m.update(zip(loop.capture_params, cap_in))
    zero = _i32(bd, 0)
    for k, s in zip(stacked, stack_in):
        t = loop.carries[k].type
        w = bd.emit("dynamic_slice", s, back, *[zero] * t.rank, sizes=(1, *t.shape))
        m[loop.carries[k]] = bd.emit("reshape", w, shape=tuple(t.shape))
    for c in loop.carries:  # carries no op reads (passed on as they are): stand-ins for their cotangents
        m.setdefault(c, Value(c.type, c.name))
    recomputed = _clone_ops(body.ops, m)
    bd.b.ops.extend(recomputed)
    inputs = [m[loop.carries[k]] for k in rc] + [m[loop.capture_params[k]] for k in rk]
    seeds = [(m[body.results[k]], ct) for k, ct in zip(rc, ct_params)]
    got = backward_pass(bd, recomputed, inputs, seeds)
    nexts = [c if c is not None else bd.zeros(loop.carries[k].type) for k, c in zip(rc, got[:len(rc)])]
    made = {r: bop for bop in bd.b.ops for r in bop.results}
    for acc, c in zip(acc_params, got[len(rc):]):
        nexts.append(_accumulate(bd, made, acc, c))
    live = set(nexts)
    kept = []
    for bop in reversed(bd.b.ops):
        if any(r in live for r in bop.results):
            kept.append(bop)
            live.update(bop.operands)
    rev_body = Region((j, *ct_params, *acc_params, *stack_in, *cap_in), tuple(kept[::-1]), tuple(nexts))
    results = [Value(v.type, v.name) for v in nexts]
    d.b.ops.append(make_loop(0, trips, inits, [*stacks, *loop.captures], rev_body, results, op.span, True))
    return results
