"""The op table: every primitive declared once with everything the pipeline needs.

An `OpDef` holds
  infer     shape/dtype rule: (operand types, attrs) -> result types; raises ShapeError
  numpy     numpy implementation: (*arrays, **attrs) -> array or tuple of arrays
  rule      sharding rule: (operand types, result types, attrs) -> FactorRule (factors with kinds)
  jax       jax emission: (operand expressions, attrs, result types) -> expression text
  partition custom partitioning step for ops whose dims do not line up (None: generic, by factors)
  partial   how pending sums pass through: "additive" (all operands partial alike), "multilinear"
            (at most one of `partial_operands` partial), or None (operands must be summed first);
            a callable of the attrs where it depends on them (pad is linear only with value 0)
  reduce_fill  dtype -> the value that masks padding of a split reduction factor (its identity)
  reduce_kind  how split reduction factors combine across shards: "sum", "max", "min", "prod";
            None: the generic partitioner never splits this op's reduction factors
  localize  (attrs, local operand types, local result shapes) -> attrs of the per-partition op,
            for ops whose attrs hold global sizes (reshape's shape, ...); None: attrs unchanged
  simulate  collectives only: (per-device arrays per operand, attrs, mesh) -> per-device results
  flops     (operand types, result types, attrs) -> floating-point operations, on whatever shapes
            it is given (global or local); None: one per result element
  constraint  a sharding constraint (shard()): its `sharding` attr fixes its result's layout
  family    "elementwise" ops propagate shardings first (GSPMD/Shardy priorities)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

OPS: dict[str, OpDef] = {}


@dataclass(frozen=True)
class OpDef:
    name: str
    infer: Callable
    numpy: Callable
    rule: Callable | None = None
    jax: Callable | None = None
    partition: Callable | None = None
    partial: str | None = None
    partial_operands: tuple[int, ...] | None = None
    reduce_fill: Any = None
    reduce_kind: str | None = None
    localize: Callable | None = None
    simulate: Callable | None = None
    flops: Callable | None = None
    constraint: bool = False
    family: str = "other"
    doc: str = ""
    local_only: bool = False  # collectives and partition indices: per-partition programs only

    def infer_types(self, operand_types, attrs):
        out = self.infer(tuple(operand_types), attrs)
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)

    def count_flops(self, operand_types, result_types, attrs) -> int:
        if self.flops is not None:
            return int(self.flops(tuple(operand_types), tuple(result_types), attrs))
        return sum(t.size for t in result_types)

    def partial_mode(self, attrs) -> str | None:
        return self.partial(attrs) if callable(self.partial) else self.partial

    def evaluate(self, arrays, attrs):
        out = self.numpy(*arrays, **attrs)
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def register(name: str, **fields) -> OpDef:
    if name in OPS:
        raise ValueError(f"op {name!r} registered twice")
    op = OpDef(name=name, **fields)
    OPS[name] = op
    return op


def get(name: str) -> OpDef:
    return OPS[name]
