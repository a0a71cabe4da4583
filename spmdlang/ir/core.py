"""The IR: immutable SSA values and ops, one function per program after inlining.

The same IR holds the global program and the per-partition program; the latter has local shapes
and adds collective and partition-index ops (all declared in the op table, spmdlang.ops).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ..errors import Source, Span
from .mesh import Mesh, Sharding
from .types import TensorType

_ids = itertools.count()


@dataclass(frozen=True, eq=False)
class Value:
    """An SSA value. Identity is the object; `name` is the source variable it came from, if any."""

    type: TensorType
    name: str | None = None
    uid: int = field(default_factory=lambda: next(_ids))

    def renamed(self, name: str | None) -> Value:
        return Value(self.type, name)

    def __repr__(self) -> str:
        return f"%{self.name or self.uid}:{self.type}"


def freeze(attrs: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(attrs or {}))


@dataclass(frozen=True, eq=False)
class Region:
    """A nested block of ops (a loop body): its own parameters, ops and results. It sees only its
    parameters and its own values (what it needs from outside comes in as explicit operands of its
    op), so every pass can treat it as a small program of its own."""

    params: tuple[Value, ...]
    ops: tuple[Op, ...]
    results: tuple[Value, ...]

    def replace(self, **kw) -> Region:
        fields = dict(params=self.params, ops=self.ops, results=self.results)
        fields.update(kw)
        return Region(**fields)


LOOP = "loop"  # the one op with a region (see `Loop`); every other kind is an op-table entry


@dataclass(frozen=True, eq=False)
class Op:
    """One primitive application; `kind` names an entry of the op table, or is LOOP."""

    kind: str
    operands: tuple[Value, ...]
    results: tuple[Value, ...]
    attrs: Mapping[str, Any] = field(default_factory=lambda: freeze(None))
    span: Span | None = None
    backward: bool = False  # made by differentiation (ir.autodiff); `span` is the forward op's
    regions: tuple[Region, ...] = ()

    @property
    def result(self) -> Value:
        (r,) = self.results
        return r

    def replace(self, **kw) -> Op:
        fields = dict(kind=self.kind, operands=self.operands, results=self.results,
                      attrs=self.attrs, span=self.span, regions=self.regions, backward=self.backward)
        fields.update(kw)
        return Op(**fields)


class Loop:
    """A view of a LOOP op: `for index in range(start, stop)`, the body run once per index.

    operands  the initial carries, then the captures (loop-invariant values the body reads)
    results   the carries after the last iteration (the initial ones if the range is empty)
    body      params (index: i32[], carries..., captures...), ops, results (the next carries,
              typed as the carries: carried types are loop-invariant)
    """

    def __init__(self, op: Op):
        assert op.kind == LOOP, op.kind
        self.op = op
        self.body: Region = op.regions[0]
        self.n = len(op.results)

    @property
    def start(self) -> int:
        return self.op.attrs["start"]

    @property
    def stop(self) -> int:
        return self.op.attrs["stop"]

    @property
    def trips(self) -> int:
        return max(0, self.stop - self.start)

    @property
    def inits(self) -> tuple[Value, ...]:
        return self.op.operands[: self.n]

    @property
    def captures(self) -> tuple[Value, ...]:
        return self.op.operands[self.n:]

    @property
    def index(self) -> Value:
        return self.body.params[0]

    @property
    def carries(self) -> tuple[Value, ...]:
        return self.body.params[1: 1 + self.n]

    @property
    def capture_params(self) -> tuple[Value, ...]:
        return self.body.params[1 + self.n:]


def make_loop(start: int, stop: int, inits, captures, body: Region, results, span=None,
              backward: bool = False) -> Op:
    return Op(LOOP, tuple(inits) + tuple(captures), tuple(results), freeze({"start": start, "stop": stop}),
              span, backward, regions=(body,))


def walk(ops):
    """Every op, nested ones included (an op, then its regions' ops), with the product of the
    trip counts of the loops around it: yields (op, trips)."""
    stack = [(iter(ops), 1)]
    while stack:
        it, trips = stack[-1]
        op = next(it, None)
        if op is None:
            stack.pop()
            continue
        yield op, trips
        if op.regions:
            inner = trips * Loop(op).trips if op.kind == LOOP else trips
            for r in reversed(op.regions):
                stack.append((iter(r.ops), inner))


def all_ops(ops):
    """Every op, nested ones included (an op first, then its regions' ops)."""
    for op, _ in walk(ops):
        yield op


def rewrite_regions(op: Op, fn) -> Op:
    """The one walk into loop bodies that rewriting passes share: `op` with each region's ops
    replaced by fn(region), which returns the new ops, or (ops, results). A region whose ops and
    results are all the same objects is kept, and so is `op` when no region changed (passes
    compare by identity to tell what they rewrote)."""
    if not op.regions:
        return op
    regions = []
    for r in op.regions:
        got = fn(r)
        ops, results = got if isinstance(got, tuple) else (got, r.results)
        results = tuple(results)
        same = (len(ops) == len(r.ops) and all(a is b for a, b in zip(ops, r.ops))
                and len(results) == len(r.results) and all(a is b for a, b in zip(results, r.results)))
        regions.append(r if same else r.replace(ops=tuple(ops), results=results))
    if all(a is b for a, b in zip(regions, op.regions)):
        return op
    return op.replace(regions=tuple(regions))


def ancestry(ops) -> tuple[dict[Op, int], dict[Op, int]]:
    """(op -> its index in `ops`, op -> its ancestors among `ops` as a bitset over those indices),
    to tell which ops of a block are independent (a loop counts as one op)."""
    index = {op: i for i, op in enumerate(ops)}
    producer = {r: op for op in ops for r in op.results}
    anc: dict[Op, int] = {}
    for op in ops:
        bits = 0
        for v in op.operands:
            if v in producer:
                p = producer[v]
                bits |= anc[p] | (1 << index[p])
        anc[op] = bits
    return index, anc


def region_values(ops):
    """Every value defined by `ops`: each op's results, then its regions' params and values."""
    for op in all_ops(ops):
        yield from op.results
        for r in op.regions:
            yield from r.params


def map_values(ops, f):
    """`ops` with every operand, result, region param and region result v replaced by f(v)
    (recursively); ops that do not change are kept."""
    out = []
    for op in ops:
        regions = tuple(r.replace(params=tuple(f(v) for v in r.params), ops=tuple(map_values(r.ops, f)),
                                  results=tuple(f(v) for v in r.results)) for r in op.regions)
        operands, results = tuple(f(v) for v in op.operands), tuple(f(v) for v in op.results)
        same = (all(a is b for a, b in zip(operands, op.operands))
                and all(a is b for a, b in zip(results, op.results))
                and all(a.params == b.params and a.results == b.results
                        and all(x is y for x, y in zip(a.ops, b.ops)) for a, b in zip(regions, op.regions)))
        out.append(op if same else op.replace(operands=operands, results=results, regions=regions))
    return out


@dataclass(frozen=True, eq=False)
class Param:
    """A function parameter: its value, source name, declared sharding (None = unannotated), span."""

    value: Value
    name: str
    sharding: Sharding | None
    span: Span | None = None


@dataclass(frozen=True, eq=False)
class Result:
    """A function result: its value, declared sharding (None = unannotated), span."""

    value: Value
    sharding: Sharding | None
    span: Span | None = None


@dataclass(frozen=True, eq=False)
class GradCall:
    """One grad/value_and_grad call, kept for the xla oracle (which differentiates with jax's own
    autodiff instead of running our backward ops): `forward` is the inlined function as ops of its
    own, on `params` (one fresh value per argument), computing the scalar `output`; `args` are the
    program's values passed in, `argnums` the differentiated positions and `grads` the program's
    values of our gradients, one per argnum; `value` is value_and_grad's value in the program (None
    for grad). Only `args`, `grads` and `value` are values of the program."""

    params: tuple[Value, ...]
    forward: tuple[Op, ...]
    output: Value
    args: tuple[Value, ...]
    argnums: tuple[int, ...]
    grads: tuple[Value, ...]
    span: Span | None = None
    value: Value | None = None

    def remapped(self, m: Mapping[Value, Value]) -> GradCall:
        return GradCall(self.params, self.forward, self.output, tuple(m.get(v, v) for v in self.args),
                        self.argnums, tuple(m.get(v, v) for v in self.grads), self.span,
                        None if self.value is None else m.get(self.value, self.value))


@dataclass(frozen=True)
class Boundary:
    """How the entry's parameters and results group into structs (the IR itself holds their leaves
    only, as parameters and results in leaf order). A tree is None for a tensor, else a tuple of
    (field, tree) in declaration order; `params` pairs each entry parameter's name with its tree."""

    params: tuple[tuple[str, object], ...]
    results: tuple[object, ...]

    @staticmethod
    def paths(tree, prefix: str) -> list[str]:
        """The dotted leaf names of a tree, depth-first."""
        if tree is None:
            return [prefix]
        return [p for name, sub in tree for p in Boundary.paths(sub, f"{prefix}.{name}")]

    def result_names(self, prefix: str = "return") -> list[str]:
        return [p for i, t in enumerate(self.results) for p in Boundary.paths(t, f"{prefix}{i}")]


def result_names(prog, prefix: str = "return") -> list[str]:
    """The user's names of a program's results: return0, return1, ..., a struct's leaves
    return1.emb, return1.blocks.wq, ... (with `prefix` "out", the -o npz member names)."""
    boundary = getattr(prog, "boundary", None)
    if boundary is not None:
        return boundary.result_names(prefix)
    return [f"{prefix}{i}" for i in range(len(prog.results))]


@dataclass(frozen=True, eq=False)
class Program:
    """The entry function after inlining, with its mesh.

    `names` maps each source variable of the entry function to its last value (for `check`).
    """

    name: str
    mesh: Mesh
    params: tuple[Param, ...]
    ops: tuple[Op, ...]
    results: tuple[Result, ...]
    names: tuple[tuple[str, Value, Span | None], ...] = ()
    source: Source | None = None
    local: bool = False  # True for the per-partition program
    grads: tuple[GradCall, ...] = ()  # the grad calls (global programs), for the xla oracle
    boundary: Boundary | None = None  # struct parameters and results (global programs with structs)

    def replace(self, **kw) -> Program:
        fields = {k: getattr(self, k) for k in
                  ("name", "mesh", "params", "ops", "results", "names", "source", "local", "grads", "boundary")}
        fields.update(kw)
        return Program(**fields)

    def values(self):
        """Every value, parameters first then op results in order (a loop's results, then its
        body's parameters and values)."""
        for p in self.params:
            yield p.value
        yield from region_values(self.ops)

    def producers(self) -> dict[Value, Op]:
        return {r: op for op in all_ops(self.ops) for r in op.results}

    def users(self) -> dict[Value, list[Op]]:
        out: dict[Value, list[Op]] = {v: [] for v in self.values()}
        for op in all_ops(self.ops):
            for v in op.operands:
                out[v].append(op)
        return out
