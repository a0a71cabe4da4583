"""Structs (parameter trees): declarations, field access, construction, leafwise arithmetic,
tree_map / tree_sum, and the flattening of struct values into their leaves.

Structs exist in the frontend only: a `StructValue` is a tuple of tensors (`Value`s) named by
field, so lowering hands the IR, propagation, partitioning and the backends tensors only, and a
program with structs lowers to exactly the ops of the same program written with its leaves as
separate tensors. Leaves are ordered depth-first in field declaration order everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import Span, SpmdError
from ..ir import types as T
from ..ir.core import Value
from ..ir.types import TensorType
from . import ast as A
from .builtins import BUILTINS, ELEMENTWISE_BUILTINS, Args, builtin
from .values import StructType, StructValue, describe, did_you_mean, is_value
from .values import static_int as _static_int

# elementwise builtins that map over a struct's leaves (a struct's leaf keeps its declared type)
LEAFWISE = {*ELEMENTWISE_BUILTINS, "gelu", "clip", "maximum", "minimum", "pow", "logical_and", "logical_or", "where",
            "stop_gradient", "log_sigmoid", "softplus", "silu", "swish", "relu6", "hard_tanh", "leaky_relu",
            "elu", "celu", "selu"}


@dataclass(frozen=True)
class FieldDef:
    name: str
    type: TensorType | StructType  # as declared (a struct field's own stacking included)
    spec: A.SpecExpr | None
    span: Span


@dataclass(frozen=True)
class StructDef:
    name: str
    fields: tuple[FieldDef, ...]
    span: Span


# ------------------------------------------------------------------------------ declarations


def declare(ctx, decls: list[A.StructDecl]) -> dict[str, StructDef]:
    """Resolve every struct declaration (after consts and the mesh): field types and specs checked,
    no name declared twice, no struct containing itself."""
    names: dict[str, A.StructDecl] = {}
    for d in decls:
        if d.name in names:
            raise SpmdError(f"struct '{d.name}' is declared twice", d.span)
        if T.is_dtype(d.name) or d.name in BUILTINS or d.name in ctx.consts:
            what = "dtype" if T.is_dtype(d.name) else "builtin" if d.name in BUILTINS else "const"
            raise SpmdError(f"struct '{d.name}' has the name of a {what}", d.span)
        names[d.name] = d
    defs = {}
    for d in decls:
        if not d.fields:
            raise SpmdError(f"struct '{d.name}' has no fields", d.span)
        fields, seen = [], set()
        for f in d.fields:
            if f.name in seen:
                raise SpmdError(f"field '{f.name}' of struct '{d.name}' is declared twice", f.span)
            seen.add(f.name)
            fields.append(FieldDef(f.name, _field_type(ctx, f, names), f.spec, f.span))
        defs[d.name] = StructDef(d.name, tuple(fields), d.span)
    _check_acyclic(defs)
    for sd in defs.values():  # specs checked once the mesh is known, against the field's rank
        for f in sd.fields:
            if f.spec is not None:
                ctx.sharding_of(f.spec, f.type, allow_open=False)
    return defs


def _field_type(ctx, f: A.FieldDecl, structs: dict) -> TensorType | StructType:
    t = f.type
    if t.dtype in structs:
        if f.spec is not None:
            raise SpmdError(f"field '{f.name}' is a struct, whose leaves' layouts come from its own declaration; "
                            "put specs on the fields of struct '" + t.dtype + "'", f.spec.span)
        lead = tuple(_static_int(ctx.static(d, {}), d.span, "a stacking dimension") for d in (t.dims or []))
        for d, n in zip(t.dims or [], lead):
            if n < 0:
                raise SpmdError(f"dimension must be non-negative, got {n}", d.span)
        return StructType(t.dtype, lead)
    if t.dims is None:
        raise SpmdError(f"unknown type '{t.dtype}' of field '{f.name}'; a field is a tensor type such as f32[4], "
                        "a struct, or a stacked struct Name[N]" + did_you_mean(t.dtype, list(structs)),
                        t.dtype_span or t.span)
    return ctx.type_of(t)


def _check_acyclic(defs: dict[str, StructDef]) -> None:
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(name: str, path: list[str]):
        state[name] = 1
        for f in defs[name].fields:
            if isinstance(f.type, StructType):
                if state.get(f.type.name) == 1:
                    chain = " -> ".join(path + [f"{name}.{f.name}", f.type.name])
                    raise SpmdError(f"struct '{f.type.name}' contains itself ({chain}); structs cannot be "
                                    "recursive", f.span)
                if f.type.name not in state:
                    visit(f.type.name, path + [f"{name}.{f.name}"])
        state[name] = 2

    for name in defs:
        if name not in state:
            visit(name, [])


def field_type(ctx, t: StructType, f: FieldDef) -> TensorType | StructType:
    """A field's type in a value of type t: t's stacking dims come first."""
    if isinstance(f.type, StructType):
        return StructType(f.type.name, t.lead + f.type.lead)
    return TensorType(f.type.dtype, t.lead + f.type.shape)


def field_spec(t: StructType, f: FieldDef) -> A.SpecExpr | None:
    """A tensor field's declared spec, with an unsplit entry per stacking dim of t."""
    if f.spec is None:
        return None
    lead = [A.SpecEntry(f.spec.span, ("_",)) for _ in t.lead]
    return A.SpecExpr(f.spec.span, lead + list(f.spec.entries))


def leaf_layout(ctx, t: StructType, prefix: str) -> list[tuple[str, TensorType, A.SpecExpr | None]]:
    """(dotted path, type, spec) of every leaf of a value of type t, depth-first."""
    out = []
    for f in ctx.structs[t.name].fields:
        path = f"{prefix}.{f.name}"
        ft = field_type(ctx, t, f)
        if isinstance(ft, StructType):
            out.extend(leaf_layout(ctx, ft, path))
        else:
            out.append((path, ft, field_spec(t, f)))
    return out


def unflatten(ctx, t: StructType, leaves) -> StructValue:
    """A struct value of type t from an iterator over its leaves (depth-first)."""
    fields = []
    for f in ctx.structs[t.name].fields:
        ft = field_type(ctx, t, f)
        fields.append((f.name, unflatten(ctx, ft, leaves) if isinstance(ft, StructType) else next(leaves)))
    return StructValue(t, tuple(fields))


def flat(v) -> list[Value]:
    """The tensors of a value: itself, or a struct's leaves."""
    return [x for _, x in v.leaves()] if isinstance(v, StructValue) else [v]


def tree(ctx, t: StructType):
    """The field structure of a value of type t: ((field, subtree or None for a tensor), ...)."""
    out = []
    for f in ctx.structs[t.name].fields:
        ft = field_type(ctx, t, f)
        out.append((f.name, tree(ctx, ft) if isinstance(ft, StructType) else None))
    return tuple(out)


# ------------------------------------------------------------------------------ expressions


def attribute(ctx, node: A.Attribute, env):
    base = ctx.expr(node.base, env)
    if not isinstance(base, StructValue):
        raise SpmdError(f"'.{node.name}' needs a struct, got {describe(base)}", node.span)
    fields = [f.name for f in ctx.structs[base.type.name].fields]
    if node.name not in fields:
        raise SpmdError(f"struct '{base.type.name}' has no field '{node.name}' (fields: {', '.join(fields)})"
                        + did_you_mean(node.name, fields), node.span)
    return base.field(node.name)


def index(ctx, x: StructValue, node: A.Subscript, env) -> StructValue:
    """`p.blocks[l]`: every leaf indexed at l along its first (stacking) dim, as `x[l]` indexes."""
    if not x.type.lead:
        raise SpmdError(f"cannot index a struct {x.type}; only a stacked struct (declared as Name[N]) is indexed",
                        node.span)
    if len(node.indices) != 1 or isinstance(node.indices[0], A.SliceIndex):
        raise SpmdError(f"a stacked struct {x.type} takes one index (an integer or an i32[] value), e.g. "
                        "p.blocks[l]", node.span)
    idx = node.indices[0]
    i = ctx.expr(idx, env)
    # each leaf goes through the tensor indexing path with the index evaluated once
    hidden = {"\0index": i}
    leaf_node = A.Subscript(node.span, node.base, [A.Name(idx.span, "\0index")])

    def drop(v: StructValue) -> StructValue:
        t = StructType(v.type.name, v.type.lead[1:])
        return StructValue(t, tuple((n, drop(f) if isinstance(f, StructValue) else ctx.index(f, leaf_node, hidden))
                                    for n, f in v.fields))

    return drop(x)


def construct(ctx, node: A.Call, env) -> StructValue:
    """`Block(ln1=a, ...)`: every field by keyword."""
    sd = ctx.structs[node.func]
    names = [f.name for f in sd.fields]
    if node.args:
        raise SpmdError(f"construct a struct with keywords, one per field: {node.func}("
                        + ", ".join(f"{n}=..." for n in names) + ")", node.args[0].span)
    t = StructType(sd.name)
    given = _field_kwargs(ctx, t, node.kwargs, env, node.func)
    missing = [n for n in names if n not in given]
    if missing:
        raise SpmdError(f"{node.func}(...) is missing field{'s' if len(missing) > 1 else ''} "
                        + ", ".join(f"'{n}'" for n in missing) + f"; every field of '{node.func}' is given by keyword",
                        node.span)
    return StructValue(t, tuple((n, given[n]) for n in names))


def replace(ctx, node: A.Call, env) -> StructValue:
    """`replace(p, emb=e)`: p with some fields replaced."""
    if len(node.args) != 1:
        raise SpmdError("replace() takes one struct and fields by keyword, e.g. replace(p, emb=e)", node.span)
    base = ctx.expr(node.args[0], env)
    if not isinstance(base, StructValue):
        raise SpmdError(f"replace() needs a struct, got {describe(base)}", node.args[0].span)
    given = _field_kwargs(ctx, base.type, node.kwargs, env, "replace")
    return StructValue(base.type, tuple((n, given.get(n, v)) for n, v in base.fields))


def _field_kwargs(ctx, t: StructType, kwargs, env, what: str) -> dict:
    sd = ctx.structs[t.name]
    fields = {f.name: f for f in sd.fields}
    out = {}
    for kw in kwargs:
        if kw.name not in fields:
            raise SpmdError(f"struct '{t.name}' has no field '{kw.name}' (fields: {', '.join(fields)})"
                            + did_you_mean(kw.name, fields), kw.span)
        if kw.name in out:
            raise SpmdError(f"field '{kw.name}' is given twice", kw.span)
        want = field_type(ctx, t, fields[kw.name])
        v = ctx.expr(kw.value, env)
        if isinstance(want, TensorType) and not is_value(v) and want.rank == 0 and isinstance(v, (int, float, bool)):
            v = ctx.materialize(v, kw.value.span, dtype=want.dtype)
        got = v.type if is_value(v) else None
        if got != want:
            raise SpmdError(f"field '{kw.name}' of {what}(...) must be {want}, got {describe(v)}", kw.value.span)
        out[kw.name] = v
    return out


# ------------------------------------------------------------------------------ leafwise


def leafwise(ctx, fn, operands: list, spans: list, span, what: str) -> StructValue:
    """fn applied to each leaf: struct operands (all of one type) give their leaf, other operands
    (tensors, numbers) are passed to every leaf; each result keeps the leaf's declared type."""
    structs = [(v, sp) for v, sp in zip(operands, spans) if isinstance(v, StructValue)]
    first, _ = structs[0]
    for v, sp in structs[1:]:
        if v.type != first.type:
            raise SpmdError(f"{what} on structs needs structs of one type, got {first.type} and {v.type}", sp)

    def go(path: str, parts: list):
        s0 = next(p for p in parts if isinstance(p, StructValue))
        fields = []
        for name, leaf in s0.fields:
            sub = [p.field(name) if isinstance(p, StructValue) else p for p in parts]
            p2 = f"{path}.{name}" if path else name
            if isinstance(leaf, StructValue):
                fields.append((name, go(p2, sub)))
                continue
            try:
                out = fn(sub)
            except SpmdError as e:
                if e.note is None:  # which leaf: the message speaks of its tensors only
                    e.note = f"in {what} on the leaf '{p2}' ({leaf.type}) of the struct {first.type}"
                raise
            if not isinstance(out, Value) or out.type != leaf.type:
                raise SpmdError(f"{what} on a struct {first.type} gives {describe(out)} for its leaf '{p2}', which "
                                f"is {leaf.type}; leafwise operations keep every leaf's type (use tree_map, or "
                                "work on the leaves)", span)
            fields.append((name, out))
        return StructValue(s0.type, tuple(fields))

    return go("", list(operands))


def leafwise_builtin(ctx, b, node: A.Call, values: dict, spans: dict):
    """A builtin called with a struct argument: elementwise ones map over the leaves."""
    pname = next(k for k, v in values.items() if isinstance(v, StructValue))
    if b.name not in LEAFWISE:
        if b.name == "shard":
            raise SpmdError("shard() takes tensors only: a struct's layouts come from its declaration; constrain "
                            "one leaf with shard(p.emb, {...})", spans.get(pname, node.span))
        raise SpmdError(f"{b.name}() does not take structs (got {describe(values[pname])}); the elementwise "
                        "builtins work leafwise, tree_map(f, ...) calls a function on every leaf",
                        spans.get(pname, node.span))
    keys = list(values)

    def one(parts):
        return b.lower(ctx, node.span, Args(dict(zip(keys, parts)), spans, node))

    return leafwise(ctx, one, [values[k] for k in keys], [spans.get(k, node.span) for k in keys], node.span,
                    f"{b.name}()")


def tree_map(ctx, node: A.Call, env):
    """`tree_map(f, a, b, ...)`: f called on each leaf of the structs (tensors and numbers passed to
    every call); one struct per result of f."""
    if len(node.args) < 2 or node.kwargs:
        raise SpmdError("tree_map() takes a function and its arguments, e.g. tree_map(f, p, g)",
                        node.kwargs[0].span if node.kwargs else node.span)
    fnode = node.args[0]
    if not isinstance(fnode, A.Name) or fnode.id not in ctx.funcs:
        what = f"'{fnode.id}'" if isinstance(fnode, A.Name) else "an expression"
        raise SpmdError(f"the first argument of tree_map() must be a function of this file, got {what}",
                        fnode.span)
    f = ctx.funcs[fnode.id]
    args = [ctx.expr(a, env) for a in node.args[1:]]
    spans = [a.span for a in node.args[1:]]
    structs = [a for a in args if isinstance(a, StructValue)]
    if not structs:
        raise SpmdError("tree_map() needs at least one struct argument", node.span)
    for a, sp in zip(args, spans):
        if not is_value(a) and not isinstance(a, (int, float, bool)):
            raise SpmdError(f"tree_map(): expected a struct, a tensor or a number, got {describe(a)}", sp)
    t = structs[0].type
    for a, sp in zip(args, spans):
        if isinstance(a, StructValue) and a.type != t:
            raise SpmdError(f"tree_map() needs structs of one type, got {t} and {a.type}", sp)
    n = len(f.results)
    leaf_outs: list[list[Value]] = [[] for _ in range(n)]
    paths = [p for p, _ in structs[0].leaves()]
    leaves = [dict(a.leaves()) if isinstance(a, StructValue) else None for a in args]
    for path in paths:
        call_args = [lv[path] if lv is not None else a for a, lv in zip(args, leaves)]
        if len(call_args) != len(f.params):
            raise SpmdError(f"tree_map(): '{f.name}' takes {len(f.params)} argument(s), got {len(call_args)}",
                            node.span)
        call_args = ctx.prepare_args(f, call_args, spans, node.span)
        outs = ctx.call_function(f, call_args, node.span, spans)
        want = dict(structs[0].leaves())[path]
        for k, o in enumerate(outs):
            if not isinstance(o, Value) or o.type != want.type:
                raise SpmdError(f"tree_map(): '{f.name}' gives {describe(o)} for the leaf '{path}' of {t}, which is "
                                f"{want.type}; each result of the function keeps the leaf's type", node.span)
            leaf_outs[k].append(o)
    results = [unflatten(ctx, t, iter(vals)) for vals in leaf_outs]
    return results[0] if n == 1 and not f.parenthesised else tuple(results)


def tree_sum(ctx, node: A.Call, env) -> Value:
    """`tree_sum(x)`: the f32 sum of sum(leaf) over x's leaves (in leaf order)."""
    if len(node.args) != 1 or node.kwargs:
        raise SpmdError("tree_sum() takes one struct, e.g. tree_sum(g * g)", node.span)
    x = ctx.expr(node.args[0], env)
    if not isinstance(x, StructValue):
        raise SpmdError(f"tree_sum() needs a struct, got {describe(x)}; use sum() for a tensor", node.args[0].span)
    total = None
    for _, leaf in x.leaves():
        leaf = ctx.cast(leaf, "f32", node.span)
        s = BUILTINS["sum"].lower(ctx, node.span, Args({"x": leaf, "axis": None, "keepdims": False}, {}, node))
        total = s if total is None else ctx.binary("add", total, s, node.span)
    return total


def _lowered_here(ctx, span, args):  # pragma: no cover - Lowerer.expr_Call calls this module
    raise AssertionError("struct builtins are lowered by frontend.structs")


SPECIAL = {"tree_map": tree_map, "tree_sum": tree_sum, "replace": replace}
builtin("tree_map", "f:any", "args:tensors*", doc="f called on every leaf of structs; one struct per result")(
    _lowered_here)
builtin("tree_sum", "x:any", doc="the f32 sum of sum(leaf) over a struct's leaves")(_lowered_here)
builtin("replace", "x:any", doc="a struct with some fields replaced: replace(p, emb=e)")(_lowered_here)
