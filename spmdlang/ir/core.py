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
class Op:
    """One primitive application; `kind` names an entry of the op table."""

    kind: str
    operands: tuple[Value, ...]
    results: tuple[Value, ...]
    attrs: Mapping[str, Any] = field(default_factory=lambda: freeze(None))
    span: Span | None = None
    backward: bool = False  # made by differentiation (ir.autodiff); `span` is the forward op's

    @property
    def result(self) -> Value:
        (r,) = self.results
        return r

    def replace(self, **kw) -> Op:
        fields = dict(kind=self.kind, operands=self.operands, results=self.results,
                      attrs=self.attrs, span=self.span, backward=self.backward)
        fields.update(kw)
        return Op(**fields)


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
    values of our gradients, one per argnum. Only `args` and `grads` are values of the program."""

    params: tuple[Value, ...]
    forward: tuple[Op, ...]
    output: Value
    args: tuple[Value, ...]
    argnums: tuple[int, ...]
    grads: tuple[Value, ...]
    span: Span | None = None

    def remapped(self, m: Mapping[Value, Value]) -> GradCall:
        return GradCall(self.params, self.forward, self.output, tuple(m.get(v, v) for v in self.args),
                        self.argnums, tuple(m.get(v, v) for v in self.grads), self.span)


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

    def replace(self, **kw) -> Program:
        fields = {k: getattr(self, k) for k in
                  ("name", "mesh", "params", "ops", "results", "names", "source", "local", "grads")}
        fields.update(kw)
        return Program(**fields)

    def values(self):
        """Every value, parameters first then op results in order."""
        for p in self.params:
            yield p.value
        for op in self.ops:
            yield from op.results

    def producers(self) -> dict[Value, Op]:
        return {r: op for op in self.ops for r in op.results}

    def users(self) -> dict[Value, list[Op]]:
        out: dict[Value, list[Op]] = {v: [] for v in self.values()}
        for op in self.ops:
            for v in op.operands:
                out[v].append(op)
        return out
