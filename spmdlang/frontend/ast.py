"""AST dataclasses, named after the grammar rules; every node carries its source span."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import Span


@dataclass
class Node:
    span: Span = field(repr=False, compare=False)


# ---------------------------------------------------------------------------------- expressions


@dataclass
class Name(Node):
    id: str


@dataclass
class IntLit(Node):
    value: int


@dataclass
class FloatLit(Node):
    value: float


@dataclass
class StrLit(Node):
    value: str


@dataclass
class BoolLit(Node):
    value: bool


@dataclass
class BinOp(Node):
    op: str  # + - * / @
    left: Node
    right: Node


@dataclass
class Compare(Node):
    op: str
    left: Node
    right: Node


@dataclass
class Neg(Node):
    operand: Node


@dataclass
class Pow(Node):
    base: Node
    exponent: Node


@dataclass
class Keyword(Node):
    name: str
    value: Node


@dataclass
class Call(Node):
    func: str
    args: list[Node]
    kwargs: list[Keyword]
    func_span: Span = field(repr=False, compare=False, default=None)


@dataclass
class SliceIndex(Node):
    start: Node | None
    stop: Node | None
    step: Node | None


@dataclass
class Subscript(Node):
    base: Node
    indices: list[Node]


@dataclass
class Attribute(Node):
    """`base.name`: a struct's field."""

    base: Node
    name: str


@dataclass
class TupleLit(Node):
    items: list[Node]


@dataclass
class ListLit(Node):
    items: list[Node]


@dataclass
class SpecEntry(Node):
    axes: tuple[str, ...] | None  # None: open ("?"); ("_",) is parsed as replicated by lowering


@dataclass
class SpecExpr(Node):
    entries: list[SpecEntry]


# ---------------------------------------------------------------------------------- declarations


@dataclass
class ShapeVar(Node):
    """`..S` among a type's dims: any shape, bound per call of a generic function."""

    name: str


@dataclass
class TypeExpr(Node):
    """`f32[4, N]`, a stacked struct `Block[L]`, or (bare) a struct `Params`: `dims` is None."""

    dtype: str
    dims: list[Node] | None
    dtype_span: Span = field(repr=False, compare=False, default=None)


@dataclass
class Param(Node):
    name: str
    type: TypeExpr
    spec: SpecExpr | None


@dataclass
class ResultType(Node):
    type: TypeExpr
    spec: SpecExpr | None


@dataclass
class Assign(Node):
    target: str
    value: Node


@dataclass
class MultiAssign(Node):
    targets: list[str]
    value: Node
    target_spans: list[Span] = field(repr=False, compare=False, default_factory=list)


@dataclass
class Return(Node):
    values: list[Node]


@dataclass
class For(Node):
    var: str
    range_args: list[Node]
    body: list[Node]


@dataclass
class Loop(Node):
    """`loop var in range(...) { body }`: compiled once, `var` an i32[] value."""

    var: str
    range_args: list[Node]
    body: list[Node]
    var_span: Span = field(repr=False, compare=False, default=None)


@dataclass
class FuncDef(Node):
    name: str
    params: list[Param]
    results: list[ResultType]
    parenthesised: bool
    body: list[Node]
    type_params: list[str] = field(default_factory=list)  # `func f[T](...)`: dtype variables


@dataclass
class FieldDecl(Node):
    name: str
    type: TypeExpr
    spec: SpecExpr | None


@dataclass
class StructDecl(Node):
    name: str
    fields: list[FieldDecl]


@dataclass
class MeshAxis(Node):
    name: str
    size: Node


@dataclass
class MeshDecl(Node):
    axes: list[MeshAxis]
    devices: list[Node] | None
    devices_span: Span | None = field(repr=False, compare=False, default=None)


@dataclass
class ConstDecl(Node):
    name: str
    value: Node


@dataclass
class Module(Node):
    meshes: list[MeshDecl]
    consts: list[ConstDecl]
    funcs: list[FuncDef]
    structs: list[StructDecl] = field(default_factory=list)
