"""The op table: every primitive declared once with everything the pipeline needs.

The entries themselves live in spmdlang.ops (one module per family); this module holds their type
and the registry, so that the IR and the passes find entries without importing spmdlang.ops.

An `OpDef` holds
  doc       one line saying what the op computes (`spmdlang ops` shows it)
  family    a `Family`; elementwise-like families propagate shardings first (GSPMD/Shardy priority)
  stage     a `Stage`: in global programs, per-partition programs, or both
  infer     shape/dtype rule: (operand types, attrs) -> result types; raises ShapeError
  numpy     numpy implementation: (*arrays, **attrs) -> array or tuple of arrays
  rule      sharding rule: (operand types, result types, attrs) -> FactorRule (factors with kinds)
  jax       jax emission: (operand expressions, attrs, result types) -> expression text
  jax_local  the emission in our per-partition (shard_map) module where it must differ from `jax`,
            which the XLA baseline module keeps (conv: zero padding that multiplies; jax.lax forms
            that trace faster than jnp's); its attrs also hold "operand_types", and "operand_hints"
            where an operand's producer carries a hint (see `hints`); None: `jax`
  jax_helper  source of a function named as the op that our per-partition module defines, called
            by the op's emission there (a per-partition op's `jax`, a global op's `jax_local`; the
            XLA baseline module never has it)
  partition custom partitioning step for ops whose dims do not line up (None: generic, by factors);
            it gets a partition.spmd.OpContext
  partial   how pending sums pass through: a `PartialMode` (additive: all operands partial alike;
            multilinear: at most one of `partial_operands` partial), None (operands must be summed
            first), or a callable of the attrs where it depends on them (pad is linear only with 0)
  reduce_kind  a `ReduceKind`: how split reduction factors combine across shards; None: the
            generic partitioner never splits this op's reduction factors
  reduce_fill  dtype -> the value that masks padding of a split reduction factor (its identity);
            given exactly when reduce_kind is
  localize  (attrs, local operand types, local result shapes) -> attrs of the per-partition op,
            for ops whose attrs hold global sizes (reshape's shape, ...); None: attrs unchanged
  simulate  collectives only: (per-device arrays per operand, attrs, mesh) -> per-device results
  flops     (operand types, result types, attrs) -> floating-point operations, on whatever shapes
            it is given (global or local); None: one per result element
  constraint  a sharding constraint (shard()): its `sharding` attr fixes its result's layout
  hints     attributes that only allow a cheaper form of the same value (reduce_max's `shift`):
            CSE merges ops that differ in them, keeping a hint where every merged op has it
  example   (operand types as text, attrs): one instance, for `spmdlang ops` and the tests
  builtin   elementwise math ops that are also the builtin function of their name, taking their
            operands as tensors (`exp(x)`, `maximum(a, b)`): the dtypes they take, a `Takes`; the
            frontend declares those builtins from the table. None: not a builtin of its own name
  vjp       global ops: the reverse-mode derivative rule (ir.autodiff): (differentiator, op, result
            cotangent(s)) -> one cotangent per operand (None: zero), built from ops of this table;
            or `Grad.none` (integer-valued or piecewise constant: no gradient flows back), or
            `Grad.unsupported` (grad through it is a located error); None: not declared yet

`register` rejects an entry that is not whole (see `_validate`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from .core import LOOP


class Named(str, Enum):
    """A str enum that prints and hashes as its value: a member can stand wherever the plain
    string stood (IR attributes, Sharding.partial_op, json, dict keys) and no text changes."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    def __hash__(self) -> int:
        return hash(self.value)


class Family(Named):
    elementwise = "elementwise"  # one result element per operand element, dims aligned
    layout = "layout"  # moves elements or regroups dims (transpose, reshape, slice, pad, ...)
    create = "create"  # made from attributes alone (full, iota)
    constraint = "constraint"  # shard(): fixes a layout, computes nothing
    reduce = "reduce"  # reductions and arg-reductions over axes
    contract = "contract"  # einsum, conv
    gather = "gather"  # take
    collective = "collective"  # per-partition communication
    local = "local"  # per-partition helpers: partition index, slices and masks at offsets


# Shardy and GSPMD propagate through ops whose dims line up element for element first.
PROPAGATES_FIRST = frozenset({Family.elementwise, Family.layout, Family.create, Family.constraint})


class Stage(Named):
    both = "both"  # global and per-partition programs
    global_ = "global"  # global programs only (constraints; partitioning removes them)
    local = "local"  # per-partition programs only (collectives, partition indices)


class PartialMode(Named):
    additive = "additive"  # f(x1 + x2) = f(x1) + f(x2) with every operand partial alike
    multilinear = "multilinear"  # linear in each operand separately: one partial operand at a time


class ReduceKind(Named):
    sum = "sum"
    max = "max"
    min = "min"
    prod = "prod"


class Grad(Named):
    none = "none"  # integer-valued or piecewise constant: no gradient flows back through it
    unsupported = "unsupported"  # differentiable, but no rule yet: grad through it is an error


class Takes(Named):
    """The operand dtypes of an op that is a builtin of its own name (OpDef.builtin)."""

    float = "float"  # floats only: the frontend computes ints in floats, as numpy does
    numeric = "numeric"  # ints or floats
    bool = "bool"


class OpTableError(ValueError):
    """An op-table entry that is not whole: a bug in spmdlang.ops, raised at import."""


OPS: dict[str, OpDef] = {}


@dataclass(frozen=True, kw_only=True)
class OpDef:
    name: str
    doc: str
    infer: Callable
    numpy: Callable | None
    family: Family
    stage: Stage = Stage.both
    rule: Callable | None = None
    jax: Callable | None = None
    jax_local: Callable | None = None
    jax_helper: str = ""
    partition: Callable | None = None
    partial: PartialMode | Callable | None = None
    partial_operands: tuple[int, ...] | None = None
    reduce_fill: Any = None
    reduce_kind: ReduceKind | None = None
    localize: Callable | None = None
    simulate: Callable | None = None
    flops: Callable | None = None
    constraint: bool = False
    hints: tuple[str, ...] = ()
    builtin: Takes | None = None
    vjp: Callable | Grad | None = None
    example: tuple[tuple[str, ...], dict] | None = field(default=None, compare=False)

    @property
    def local_only(self) -> bool:
        """Collectives and partition indices: per-partition programs only."""
        return self.stage == Stage.local

    @property
    def global_only(self) -> bool:
        return self.stage == Stage.global_

    @property
    def propagates_first(self) -> bool:
        return self.family in PROPAGATES_FIRST

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


def _validate(op: OpDef) -> None:
    """What every entry must have; each message names the entry and what it lacks."""
    def need(cond, what):
        if not cond:
            raise OpTableError(f"op {op.name!r}: {what}")

    need(op.doc.strip() and "\n" not in op.doc.strip(), "needs a one-line doc")
    need(isinstance(op.family, Family), f"family must be a Family, got {op.family!r}")
    need(isinstance(op.stage, Stage), f"stage must be a Stage, got {op.stage!r}")
    need(op.partial is None or callable(op.partial) or isinstance(op.partial, PartialMode),
         f"partial must be a PartialMode, a callable or None, got {op.partial!r}")
    need(op.reduce_kind is None or isinstance(op.reduce_kind, ReduceKind),
         f"reduce_kind must be a ReduceKind, got {op.reduce_kind!r}")
    need((op.reduce_kind is None) == (op.reduce_fill is None),
         "a reduce_kind needs a reduce_fill (the identity that masks padding) and the other way round")
    need(op.partial_operands is None or op.partial is not None, "partial_operands without a partial mode")
    need(op.jax is not None, "needs a jax emission")
    if op.stage == Stage.local:
        need(op.numpy is not None or op.simulate is not None, "needs a numpy implementation or a simulation")
        need(op.rule is None and op.partition is None, "a per-partition op is never partitioned")
    else:
        need(op.rule is not None, "a global op needs a factor rule")
        need(op.numpy is not None, "a global op needs a numpy implementation")
        need(op.simulate is None, "only per-partition ops have a simulation")
        need(not op.jax_helper or op.jax_local is not None,
             "a global op's jax helper is called by its jax_local (the baseline module has none)")
        need(op.example is not None, "a global op needs an example instance (for `spmdlang ops`)")
    need(not op.jax_helper or f"def {op.name}(" in op.jax_helper, f"jax_helper must define a function named {op.name}")
    need(not op.constraint or op.stage == Stage.global_, "a constraint lives in global programs only")
    need(op.builtin is None or (isinstance(op.builtin, Takes) and op.family == Family.elementwise
                                and op.example is not None and not op.example[1]),
         "a builtin of its own name is elementwise with no attributes, and its `builtin` a Takes")


def register(name: str, **fields) -> OpDef:
    """Add an entry to the table; OpTableError if it is incomplete or the name is taken."""
    name = str(name)  # a CollectiveKind registers under its plain name
    if name in OPS:
        raise OpTableError(f"op {name!r} registered twice")
    for key, enum in (("family", Family), ("stage", Stage), ("reduce_kind", ReduceKind), ("builtin", Takes)):
        if isinstance(fields.get(key), str):
            fields[key] = _member(enum, fields[key], name, key)
    if isinstance(fields.get("partial"), str):
        fields["partial"] = _member(PartialMode, fields["partial"], name, "partial")
    try:
        op = OpDef(name=name, **fields)
    except TypeError as e:  # a missing or unknown field
        raise OpTableError(f"op {name!r}: {e}") from None
    _validate(op)
    OPS[name] = op
    return op


def _member(enum, value: str, name: str, key: str):
    try:
        return enum(value)
    except ValueError:
        raise OpTableError(f"op {name!r}: {key} {value!r} is not one of "
                           f"{', '.join(m.value for m in enum)}") from None


def set_vjp(name: str, vjp) -> None:
    """Declare the derivative of an entry registered earlier (entries registered in a loop)."""
    import dataclasses

    OPS[name] = dataclasses.replace(OPS[name], vjp=vjp)


def get(name: str) -> OpDef:
    return OPS[name]


def entry(kind: str) -> OpDef | None:
    """The table entry of an op kind; None for a loop, the one kind without one (an op with a
    region, whose body's ops have theirs): for passes that walk every op."""
    return None if kind == LOOP else OPS[kind]
