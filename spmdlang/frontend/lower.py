"""AST -> IR: consts and the mesh, type checking, inlining, broadcasting and dtype adoption.

Expressions evaluate to either a `Value` (a tensor in the IR) or a static Python value (int, float,
bool, str, list, tuple, spec, type): literals, consts and loop indices stay static until an
operation with a tensor needs them, when they adopt that tensor's dtype ("weak" literals).
User functions are inlined at each call; `for` loops over `range` are unrolled.
"""

from __future__ import annotations

import math
from typing import Any

from ..errors import OverrideError, Source, Span, SpmdError
from ..ir import types as T
from ..ir.builder import Builder
from ..ir.core import Boundary, Op, Param, Program, Region, Result, Value, make_loop, map_values
from ..ir.mesh import Mesh, Sharding, axes_text
from ..ir.types import TensorType
from ..limits import MAX_CALL_DEPTH, MAX_DEVICES, MAX_OPS, MAX_UNROLLED, check_type
from . import ast as A
from . import nn as _nn  # noqa: F401  (registers jax.nn's activations as builtins)
from . import structs as S
from .builtins import BUILTINS, call_builtin, dynamic_window
from .values import (
    LOOP_INDICES,
    WEAK,
    Dtype,
    StaticType,
    StructType,
    StructValue,
    describe,
    did_you_mean,
    float_for,
    is_value,
    is_weak,
    loop_index_note,
    scalar_value,
)
from .values import static_int as _check_static_int

# Unrolling and inlining happen at compile time; past these limits (spmdlang.limits) a program is a
# mistake, not a workload.


class Lowerer:
    """Lowers one module. `lower_program` is the entry point."""

    def __init__(self, module: A.Module, source: Source, mesh_override=None, const_override=None):
        self.module = module
        self.source = source
        self.mesh_override = dict(mesh_override or {})
        self.const_override = dict(const_override or {})
        self.consts: dict[str, int | float] = {}
        self.funcs: dict[str, A.FuncDef] = {}
        self.structs: dict[str, S.StructDef] = {}
        self.mesh: Mesh | None = None
        self.b = Builder()
        self.names: dict[Value, str] = {}
        self.stack: list[str] = []
        self.called: set[str] = set()  # functions reached by inlining
        self.unrolled = 0  # loop iterations unrolled so far, against MAX_UNROLLED
        self.entry_named: set[Value] = set()  # values named by an assignment in the entry function
        self.grad_calls: list = []  # ir.core.GradCall of each grad/value_and_grad, for the xla oracle

    # ------------------------------------------------------------------ module level

    def lower_program(self, entry: str | None = None) -> Program:
        m = self.module
        self._lower_consts()
        self._lower_mesh()
        self.structs = S.declare(self, m.structs)
        for f in m.funcs:
            if f.name in self.funcs:
                raise SpmdError(f"function '{f.name}' is defined twice", f.span)
            if f.name in BUILTINS:
                raise SpmdError(f"function '{f.name}' has the name of a builtin", f.span)
            if f.name in self.structs:
                raise SpmdError(f"function '{f.name}' has the name of a struct", f.span)
            self.funcs[f.name] = f
        if not m.funcs:
            raise SpmdError("no function defined; add e.g. `func main(x: f32[8]) -> f32[8] { return x }`",
                            Span(self.source, 1, 1))
        if entry is not None:
            if entry not in self.funcs:
                raise SpmdError(f"no function '{entry}' (--entry){did_you_mean(entry, self.funcs)}",
                                Span(self.source, 1, 1))
            fdef = self.funcs[entry]
        elif "main" in self.funcs:
            fdef = self.funcs["main"]
        elif len(self.funcs) == 1:
            fdef = next(iter(self.funcs.values()))
        else:
            raise SpmdError("several functions and none is 'main'; name the entry with --entry",
                            m.funcs[0].span)
        if _is_generic(fdef):
            raise SpmdError(f"'{fdef.name}' is generic (dtype variables or `..S` shapes) and cannot be the entry: "
                            "the entry's parameters need fixed types", fdef.span)
        prog = self._lower_entry(fdef)
        self._check_uncalled(fdef.name)
        return prog

    def _lower_consts(self):
        """Consts in order, each an int or a float; an override replaces its value, an integer
        const's with an integer, a float const's with any number."""
        for c in self.module.consts:
            if c.name in self.consts:
                raise SpmdError(f"const '{c.name}' is defined twice", c.span)
            value = self.static(c.value, {})
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise SpmdError(f"const '{c.name}' must be an integer or a float, got {describe(value)}", c.value.span)
            if c.name in self.const_override:
                value = _const_override(c, value, self.const_override[c.name])
            self.consts[c.name] = value

    def _lower_mesh(self):
        meshes = self.module.meshes
        if not meshes:
            raise SpmdError("no mesh declaration; add one such as `mesh [data=2, model=4]`",
                            Span(self.source, 1, 1))
        if len(meshes) > 1:
            raise SpmdError("more than one mesh declaration (exactly one is allowed)", meshes[1].span)
        decl = meshes[0]
        axes: dict[str, int] = {}
        for ax in decl.axes:
            if ax.name in axes:
                raise SpmdError(f"mesh axis '{ax.name}' is declared twice", ax.span)
            if ax.name == "_":
                raise SpmdError("'_' cannot name a mesh axis (it means 'not split' in specs)", ax.span)
            size = self.mesh_override.get(ax.name)
            if isinstance(size, bool) or not isinstance(size, (int, type(None))):
                raise OverrideError(f"--mesh {ax.name}={size!r}: sizes must be positive integers", ax.span)
            if size is None:
                size = _check_static_int(self.static(ax.size, {}), ax.size.span, f"size of mesh axis '{ax.name}'")
            if size < 1:
                raise SpmdError(f"mesh axis '{ax.name}' must have a positive size, got {size}", ax.size.span)
            axes[ax.name] = size
        n = 1
        for s in axes.values():
            n *= s
        if n > MAX_DEVICES:
            raise SpmdError(f"the mesh has {n} devices; at most {MAX_DEVICES} are supported", decl.span)
        devices = None
        if decl.devices is not None:
            devices = [_check_static_int(self.static(d, {}), d.span, "device id") for d in decl.devices]
            if sorted(devices) != list(range(n)):
                note = None
                if len(devices) != n and self.mesh_override:
                    note = "--mesh changed the number of devices; drop the devices list or give matching sizes"
                raise SpmdError(f"devices must be a permutation of 0..{n - 1} for a mesh of {n} devices, "
                                f"got {devices}", decl.devices_span, note)
        self.mesh = Mesh.make(axes, devices)

    def _check_uncalled(self, entry: str):
        """Functions never reached by inlining are still type-checked on their own."""
        called = self.called
        for name, f in self.funcs.items():
            if name != entry and name not in called and _is_generic(f):
                self._check_params(f)  # its types are bound per call: only the signature is checked
            elif name != entry and name not in called:
                saved = (self.b, self.names, self.grad_calls)
                self.b, self.names, self.grad_calls = Builder(), {}, []
                try:
                    self._check_params(f)
                    params = [self.fresh(self.type_of(p.type), p.name) for p in f.params]
                    self.call_function(f, params, f.span)
                finally:
                    self.b, self.names, self.grad_calls = saved

    def _lower_entry(self, f: A.FuncDef) -> Program:
        self._check_params(f)
        params = []
        env: dict[str, Any] = {}
        in_trees, out_trees = [], []
        for p in f.params:
            t = self.type_of(p.type)
            if isinstance(t, StructType):  # its leaves, named by dotted paths, laid out as declared
                leaves = []
                for path, lt, spec in S.leaf_layout(self, t, p.name):
                    v = Value(lt, path)
                    params.append(Param(v, path, self.sharding_of(spec, lt, allow_open=False) if spec else None,
                                        p.span))
                    leaves.append(v)
                env[p.name] = S.unflatten(self, t, iter(leaves))
                in_trees.append((p.name, S.tree(self, t)))
                continue
            spec = self.sharding_of(p.spec, t, allow_open=False) if p.spec else None
            v = Value(t, p.name)
            params.append(Param(v, p.name, spec, p.span))
            env[p.name] = v
            in_trees.append((p.name, None))
        named: dict[str, tuple[Value, Span]] = {p.name: (p.value, p.span) for p in params}
        self.stack.append(f.name)
        outs = self.body(f, env, named)
        self.stack.pop()
        results = []
        for r, v in zip(f.results, outs):
            if isinstance(v, StructValue):
                specs = [spec for _, _, spec in S.leaf_layout(self, v.type, "")]
                for (_, leaf), spec in zip(v.leaves(), specs):
                    sh = self.sharding_of(spec, leaf.type, allow_open=False) if spec else None
                    if sh is not None:
                        leaf = self.b.emit("shard", leaf, span=r.span, sharding=sh)
                    results.append(Result(leaf, sh, r.span))
                out_trees.append(S.tree(self, v.type))
                continue
            spec = self.sharding_of(r.spec, v.type, allow_open=False) if r.spec else None
            if spec is not None:  # the caller receives this layout: a constraint like shard()
                v = self.b.emit("shard", v, span=r.span, sharding=spec)
            results.append(Result(v, spec, r.span))
            out_trees.append(None)
        ops, rename = self._finalize_names()
        params = [Param(rename.get(p.value, p.value), p.name, p.sharding, p.span) for p in params]
        results = [Result(rename.get(r.value, r.value), r.sharding, r.span) for r in results]
        names = tuple((n, rename.get(v, v), s) for n, (v, s) in named.items())
        grads = tuple(g.remapped(rename) for g in self.grad_calls)
        boundary = Boundary(tuple(in_trees), tuple(out_trees)) if self.structs else None
        return Program(f.name, self.mesh, tuple(params), tuple(ops), tuple(results), names, self.source,
                       grads=grads, boundary=boundary)

    def _finalize_names(self) -> tuple[list[Op], dict[Value, Value]]:
        """Give values the source names they were assigned to, in one pass over the ops."""
        rename: dict[Value, Value] = {v: v.renamed(n) for v, n in self.names.items() if v.name != n}
        if not rename:
            return list(self.b.ops), {}
        return map_values(self.b.ops, lambda v: rename.get(v, v)), rename

    # ------------------------------------------------------------------ functions

    def _check_params(self, f: A.FuncDef):
        seen = set()
        generic = _is_generic(f)
        for tv in f.type_params:
            if T.is_dtype(tv) or tv in self.structs:
                raise SpmdError(f"type variable '{tv}' of '{f.name}' has the name of a "
                                f"{'dtype' if T.is_dtype(tv) else 'struct'}", f.span)
        if len(set(f.type_params)) != len(f.type_params):
            raise SpmdError(f"'{f.name}' names a type variable twice", f.span)
        for p in f.params:
            if p.name in seen:
                raise SpmdError(f"parameter '{p.name}' is declared twice", p.span)
            seen.add(p.name)
            if p.spec is not None and generic:
                raise SpmdError(f"parameter '{p.name}' of the generic function '{f.name}' has a spec; a generic "
                                "function's parameters carry no specs (use shard() inside, or specs at the caller)",
                                p.spec.span)
            if p.spec is not None and self._names_struct(p.type):
                raise SpmdError(f"parameter '{p.name}' is a struct, whose leaves' layouts come from its declaration; "
                                "drop the spec (or constrain one leaf with shard(p.field, {...}))", p.spec.span)
        for r in f.results:
            if r.spec is not None and generic:
                raise SpmdError(f"a result of the generic function '{f.name}' has a spec; a generic function's "
                                "results carry no specs", r.spec.span)
            if r.spec is not None and self._names_struct(r.type):
                raise SpmdError("a struct result takes its leaves' layouts from its declaration; drop the spec",
                                r.spec.span)
        if not f.results:
            raise SpmdError(f"function '{f.name}' declares no results", f.span)

    def _names_struct(self, t: A.TypeExpr) -> bool:
        return t.dtype in self.structs

    def fresh(self, t, name: str | None = None):
        """A new value of type t with no producer: a tensor, or a struct of new leaves."""
        if isinstance(t, StructType):
            return S.unflatten(self, t, iter(Value(lt, path) for path, lt, _ in S.leaf_layout(self, t, name or "")))
        return Value(t, name)

    def bind_generics(self, f: A.FuncDef, args: list, spans: list, span: Span) -> dict:
        """The dtype variables and `..S` shapes of a generic f, bound by the types of its tensor arguments;
        a variable bound two ways is an error at the argument that disagrees."""
        bound: dict[str, Any] = {}
        origin: dict[str, tuple[str, Any]] = {}
        call_note = f"in the call to '{f.name}' at line {span.line}, column {span.col}" if span else None
        for p, a, sp in zip(f.params, args, spans):
            t = p.type
            generic = t.dtype in f.type_params or any(isinstance(d, A.ShapeVar) for d in t.dims or ())
            if isinstance(a, StructValue) and generic:  # (else its type's variables go unbound)
                raise SpmdError(f"argument '{p.name}' of '{f.name}' must be a tensor {_type_text(t)}, got "
                                f"{describe(a)}; tree_map calls a function on each leaf", sp or span, call_note)
            if not isinstance(a, Value) or self._names_struct(t):
                continue
            if t.dtype in f.type_params:
                if t.dtype in bound and bound[t.dtype] != a.type.dtype:
                    first, ft = origin[t.dtype]
                    raise SpmdError(f"type variable {t.dtype} of '{f.name}' is bound two ways: {bound[t.dtype]} by "
                                    f"argument '{first}' ({ft}), {a.type.dtype} by argument '{p.name}' ({a.type})",
                                    sp or span, call_note)
                bound.setdefault(t.dtype, a.type.dtype)
                origin.setdefault(t.dtype, (p.name, a.type))
            # a type without dims is a struct's name or an unknown type: type_of reports the latter
            svars = [i for i, d in enumerate(t.dims or ()) if isinstance(d, A.ShapeVar)]
            if len(svars) > 1:
                raise SpmdError("a type has at most one `..S` shape", t.dims[svars[1]].span)
            if not svars:
                continue
            k = svars[0]
            fixed = len(t.dims) - 1
            if a.type.rank < fixed:
                raise SpmdError(f"argument '{p.name}' of '{f.name}' must have rank >= {fixed} "
                                f"({_type_text(t)}), got {a.type}", sp or span, call_note)
            name = t.dims[k].name
            shape = a.type.shape[k: a.type.rank - (fixed - k)]
            if name in bound and bound[name] != shape:
                first, ft = origin[name]
                raise SpmdError(f"`..{name}` of '{f.name}' is bound two ways: {list(bound[name])} by argument "
                                f"'{first}' ({ft}), {list(shape)} by argument '{p.name}' ({a.type})", sp or span,
                                call_note)
            bound.setdefault(name, shape)
            origin.setdefault(name, (p.name, a.type))
        return bound

    def prepare_args(self, f: A.FuncDef, values: list, spans: list, span: Span) -> list:
        """Arguments of a call of f: numbers materialized as the parameter's (bound) dtype."""
        bound = self.bind_generics(f, values, spans, span)
        out = []
        for p, v, sp in zip(f.params, values, spans):
            if not is_value(v):
                if self._names_struct(p.type) or not isinstance(v, (int, float, bool)):
                    raise SpmdError(f"argument '{p.name}' of '{f.name}' must be {_type_text(p.type)}, got "
                                    f"{describe(v)}", sp)
                dt = bound.get(p.type.dtype, p.type.dtype)
                dims_ok = not p.type.dims or all(isinstance(d, A.ShapeVar) for d in p.type.dims)
                if not dims_ok or (p.type.dims and bound.get(p.type.dims[0].name, ()) != ()):
                    raise SpmdError(f"argument '{p.name}' of '{f.name}' must be a tensor {_type_text(p.type)}, "
                                    f"got {describe(v)}", sp)
                v = self.materialize(v, sp, dtype=dt if T.is_dtype(dt) else None)
            out.append(v)
        return out

    def call_function(self, f: A.FuncDef, args: list, span: Span, arg_spans: list | None = None) -> list:
        """Inline f with tensor (or struct) arguments; declared specs become shard() constraints."""
        if f.name in self.stack:
            chain = " -> ".join(self.stack + [f.name])
            raise SpmdError(f"recursive call to '{f.name}' ({chain}); functions are inlined, "
                            "so recursion is not supported", span)
        if len(self.stack) > MAX_CALL_DEPTH:
            raise SpmdError(f"calls nest more than {MAX_CALL_DEPTH} deep ({self.stack[0]} -> {self.stack[1]} -> ... "
                            f"-> {f.name}); functions are inlined, and this is the limit", span)
        self.called.add(f.name)
        self._check_params(f)
        spans = list(arg_spans) if arg_spans else [None] * len(args)
        bound = self.bind_generics(f, args, spans, span)
        env: dict[str, Any] = {tv: Dtype(bound[tv]) for tv in f.type_params if tv in bound}
        for p, a, sp in zip(f.params, args, spans):
            t = self.type_of(p.type, bound)
            if not is_value(a) or a.type != t:
                got = a.type if is_value(a) else describe(a)
                if sp is not None and span is not None and _is_generic(f):  # point at the argument, and the call
                    raise SpmdError(f"argument '{p.name}' of '{f.name}' must be {t}, got {got}", sp,
                                    f"in the call to '{f.name}' at line {span.line}, column {span.col}")
                raise SpmdError(f"argument '{p.name}' of '{f.name}' must be {t}, got {got}", span)
            if p.spec is not None:
                a = self.b.emit("shard", a, span=p.span, sharding=self.sharding_of(p.spec, t, allow_open=True))
            env[p.name] = a
        self.stack.append(f.name)
        outs = self.body(f, env, None, bound)
        self.stack.pop()

        for i, (r, v) in enumerate(zip(f.results, outs)):
            if r.spec is not None:
                outs[i] = self.b.emit("shard", v, span=r.span,
                                      sharding=self.sharding_of(r.spec, v.type, allow_open=True))
        return outs

    def body(self, f: A.FuncDef, env: dict, named: dict | None, bound: dict | None = None) -> list:
        """Run the statements; returns the result values, checked against the declared types."""
        ret = self.statements(f.body, env, named)
        if ret is None:
            end = f.span
            raise SpmdError(f"function '{f.name}' does not return a value", Span(end.source, end.end_line or end.line,
                                                                                max((end.end_col or 2) - 1, 1)))
        node, values = ret
        if len(values) == 1 and isinstance(values[0][1], tuple) and values[0][1] and \
                all(is_value(x) for x in values[0][1]):  # `return f(x)` of a call with several results: those
            expr, many = values[0]
            values = [(expr, x) for x in many]
        if len(values) != len(f.results):
            raise SpmdError(f"'{f.name}' returns {len(values)} value(s) but declares {len(f.results)}", node.span)
        outs = []
        for i, ((expr, v), r) in enumerate(zip(values, f.results)):
            t = self.type_of(r.type, bound)
            if not is_value(v):
                if isinstance(t, StructType):
                    raise SpmdError(f"result {i} of '{f.name}' is {describe(v)}, but the function declares {t}",
                                    expr.span)
                v = self.materialize(v, expr.span, dtype=t.dtype)
            if v.type != t:
                got = v.type if isinstance(v, Value) else describe(v)
                raise SpmdError(f"result {i} of '{f.name}' is {got}, but the function declares {t}", expr.span)
            outs.append(v)
        return outs

    def statements(self, stmts, env, named):
        """Lower statements; returns (return node, [(expr, value)]) at a return, else None."""
        for k, s in enumerate(stmts):
            if len(self.b.ops) > MAX_OPS:
                raise SpmdError(f"the program unrolls and inlines to more than {MAX_OPS} operations", s.span)
            if isinstance(s, A.Assign):
                v = self.expr(s.value, env)
                if isinstance(v, tuple) and len(v) > 0 and all(is_value(x) for x in v):
                    raise SpmdError(f"the call returns {len(v)} values; unpack them as `a, b = ...`", s.value.span)
                self.assign(s.target, v, env, named, s.span)
            elif isinstance(s, A.MultiAssign):
                v = self.expr(s.value, env)
                if not isinstance(v, tuple) or not all(is_value(x) for x in v):
                    raise SpmdError(f"cannot unpack {describe(v)} into {len(s.targets)} names", s.value.span)
                if len(v) != len(s.targets):
                    raise SpmdError(f"the call returns {len(v)} values but {len(s.targets)} names are assigned",
                                    s.span)
                for name, val, sp in zip(s.targets, v, s.target_spans):
                    self.assign(name, val, env, named, sp)
            elif isinstance(s, A.Return):
                if k != len(stmts) - 1:
                    raise SpmdError("statements after return are never run", stmts[k + 1].span)
                return s, [(e, self.expr(e, env)) for e in s.values]
            elif isinstance(s, A.For):
                ret = self.for_loop(s, env, named)
                if ret is not None:
                    raise SpmdError("return inside a for loop is not supported", ret[0].span)
            elif isinstance(s, A.Loop):
                self.loop(s, env, named)
            else:  # pragma: no cover - the grammar admits nothing else
                raise SpmdError("unsupported statement", s.span)
        return None

    def assign(self, name, value, env, named, span):
        if isinstance(value, tuple) and value and all(is_value(x) for x in value):
            raise SpmdError("cannot assign several values to one name", span)
        env[name] = value
        if isinstance(value, StructValue):  # each leaf named by its dotted path
            for path, leaf in value.leaves(name):
                self._name_value(path, leaf, named, span)
            return
        self._name_value(name, value, named, span)

    def _name_value(self, name, value, named, span):
        if isinstance(value, Value):
            # the first name wins, but the entry function's names beat an inlined callee's locals
            # (IR text and `check` then agree on what a value is called)
            entry_level = named is not None
            renames = value not in self.names or (entry_level and value not in self.entry_named)
            if value.name is None and renames:
                self.names[value] = name
                if entry_level:
                    self.entry_named.add(value)
            if entry_level:
                named[name] = (value, span)

    def for_loop(self, s: A.For, env, named):
        args = [_check_static_int(self.static(a, env), a.span, "range() argument") for a in s.range_args]
        if len(args) > 3:
            raise SpmdError("range() takes 1 to 3 arguments", s.span)
        if len(args) == 3 and args[2] == 0:
            raise SpmdError("range() step must not be zero", s.range_args[2].span)
        r = range(*args)
        self.unrolled += len(r)
        if self.unrolled > MAX_UNROLLED:
            raise SpmdError(f"for loops unroll to more than {MAX_UNROLLED} iterations in all "
                            f"(this one has {len(r)}); loops are unrolled at compile time", s.span)
        for i in r:
            env[s.var] = i
            ret = self.statements(s.body, env, named)
            if ret is not None:
                return ret
        return None

    # ------------------------------------------------------------------ types and specs

    def type_of(self, t: A.TypeExpr, bound: dict | None = None) -> TensorType | StructType:
        """A written type; `bound` holds a generic function's dtype variables and `..S` shapes."""
        bound = bound or {}
        if t.dtype in self.structs:
            lead = []
            for d in t.dims or []:
                n = _check_static_int(self.static(d, {}), d.span, "a stacking dimension")
                if n < 0:
                    raise SpmdError(f"dimension must be non-negative, got {n}", d.span)
                lead.append(n)
            return StructType(t.dtype, tuple(lead))
        dtype = bound.get(t.dtype, t.dtype)
        if t.dims is None:
            raise SpmdError(f"unknown type '{t.dtype}'; a type is a dtype with a shape such as f32[4, 8], or a "
                            "struct" + did_you_mean(t.dtype, list(self.structs) + list(T.DTYPES)),
                            t.dtype_span or t.span)
        if not isinstance(dtype, str) or not T.is_dtype(dtype):
            raise SpmdError(f"unknown dtype '{t.dtype}'; dtypes are {', '.join(T.DTYPES)}"
                            + did_you_mean(t.dtype, T.DTYPES + tuple(self.structs)), t.dtype_span or t.span)
        dims = []
        for d in t.dims:
            if isinstance(d, A.ShapeVar):
                if d.name not in bound:
                    raise SpmdError(f"`..{d.name}` is not bound: a `..S` shape stands only in a generic function's "
                                    "signature, and one in a result must appear in a parameter too", d.span)
                dims.extend(bound[d.name])
                continue
            n = self.static(d, {})
            if isinstance(d, A.Name) and isinstance(n, float) and d.id in self.consts:
                raise SpmdError(f"a dimension must be a static integer; '{d.id}' is a float const ({n})", d.span)
            n = _check_static_int(n, d.span, "a dimension")
            if n < 0:
                raise SpmdError(f"dimension must be non-negative, got {n}", d.span)
            dims.append(n)
        out = TensorType(dtype, tuple(dims))
        check_type(out, t.span)
        return out

    def sharding_of(self, spec: A.SpecExpr, t: TensorType, allow_open: bool) -> Sharding:
        if len(spec.entries) != t.rank:
            raise SpmdError(f"spec {self._spec_text(spec)} has {len(spec.entries)} entr"
                            f"{'y' if len(spec.entries) == 1 else 'ies'} but {t} has rank {t.rank}; "
                            "a spec needs one entry per dimension", spec.span)
        dims, open_dims, seen = [], set(), {}
        names = self.mesh.names
        for i, e in enumerate(spec.entries):
            if e.axes is None:
                if not allow_open:
                    raise SpmdError("'?' (open dimension) is only allowed in shard()", e.span)
                open_dims.add(i)
                dims.append(())
                continue
            if e.axes == ("_",):
                dims.append(())
                continue
            for a in e.axes:
                if a == "_":
                    raise SpmdError("'_' cannot appear inside an axis group", e.span)
                if a not in names:
                    raise SpmdError(f"unknown mesh axis '{a}'; the mesh has {', '.join(names)}"
                                    + did_you_mean(a, names), e.span)
                if a in seen:
                    raise SpmdError(f"mesh axis '{a}' appears twice in one spec", e.span)
                seen[a] = i
            dims.append(tuple(e.axes))
        return Sharding(tuple(dims), (), frozenset(open_dims))

    def _spec_text(self, spec: A.SpecExpr) -> str:
        return "{" + ", ".join("?" if e.axes is None else axes_text(e.axes) for e in spec.entries) + "}"

    def loop(self, s: A.Loop, env, named):
        """`loop` compiles its body once into a LOOP op. Names bound before the loop and assigned
        in the body are carried (same type on every iteration); the body's other names are local
        to it; the outer values it reads become explicit captures."""
        args = [_check_static_int(self.static(a, env), a.span, "range() argument") for a in s.range_args]
        if len(args) > 2:
            raise SpmdError("a loop's range() takes 1 or 2 arguments: range(stop) or range(start, stop)",
                            s.range_args[2].span)
        start, stop = (0, args[0]) if len(args) == 1 else args
        if stop > start and not (-2**31 <= start and stop <= 2**31):
            raise SpmdError(f"the loop index '{s.var}' is an i32 value, so a loop's range lies within "
                            f"range(-2^31, 2^31); range({start}, {stop}) goes beyond it",
                            s.range_args[-1].span if stop > 2**31 else s.range_args[0].span)
        assigned = _assigned(s.body)
        carried = []
        for name in assigned:
            if name == s.var or name not in env:
                continue
            v = env[name]
            if not is_value(v):
                if not isinstance(v, (int, float, bool)):
                    raise SpmdError(f"'{name}' is {describe(v)}; a loop carries only tensors, structs and numbers",
                                    assigned[name][0])
                v = env[name] = self.materialize(v, s.span)
                self.names.setdefault(v, name)
            carried.append(name)
        outer_b = self.b
        self.b = Builder()
        index = Value(TensorType("i32", ()), s.var)
        LOOP_INDICES.add(index)
        # a carried struct is carried leaf by leaf
        carried_as = {n: self.fresh(env[n].type, n) for n in carried}
        params = [leaf for n in carried for leaf in S.flat(carried_as[n])]
        body_env = dict(env)
        body_env[s.var] = index
        body_env.update(carried_as)
        ret = self.statements(s.body, body_env, {} if named is not None else None)
        if ret is not None:
            raise SpmdError("return inside a loop is not supported", ret[0].span)
        nexts = []
        for name in carried:
            p, v = carried_as[name], body_env[name]
            where = assigned[name][-1]
            if isinstance(p, StructValue) or isinstance(v, StructValue):
                if not is_value(v) or v.type != p.type:
                    raise SpmdError(f"'{name}' is carried through the loop as {describe(p)}, but the body assigns it "
                                    f"{describe(v)}; a carried value keeps its type on every iteration", where)
                nexts.extend(S.flat(v))
                continue
            if not isinstance(v, Value):
                if not isinstance(v, (int, float, bool)) or p.type.rank:
                    raise SpmdError(f"'{name}' is carried through the loop as {p.type}, but the body "
                                    f"assigns it {describe(v)}", where)
                v = self.materialize(v, where, dtype=p.type.dtype)
            if v.type != p.type:
                raise SpmdError(f"'{name}' is carried through the loop as {p.type}, but the body assigns it "
                                f"{v.type}; a carried value keeps its type on every iteration", where)
            nexts.append(v)
        body_ops, self.b = self.b.ops, outer_b
        captures = _free_values(body_ops, [index, *params], nexts)
        cap_params = {v: Value(v.type, v.name) for v in captures}
        body_ops = [op.replace(operands=tuple(cap_params.get(v, v) for v in op.operands)) for op in body_ops]
        nexts = [cap_params.get(v, v) for v in nexts]
        body = Region((index, *params, *cap_params.values()), tuple(body_ops), tuple(nexts))
        results = [Value(p.type) for p in params]
        inits = [leaf for n in carried for leaf in S.flat(env[n])]
        self.b.ops.append(make_loop(start, stop, inits, captures, body, results, s.span))
        it = iter(results)
        for name in carried:
            t = env[name].type
            r = S.unflatten(self, t, it) if isinstance(t, StructType) else next(it)
            self.assign(name, r, env, named, assigned[name][-1])

    # ------------------------------------------------------------------ expressions

    def static(self, node, env):
        v = self.expr(node, env)
        if isinstance(v, Value):
            raise SpmdError(f"expected a static value, got a tensor {v.type}{loop_index_note(v)}", node.span)
        return v

    def expr(self, node, env):
        method = getattr(self, "expr_" + type(node).__name__)
        return method(node, env)

    def expr_IntLit(self, node, env):
        return node.value

    def expr_FloatLit(self, node, env):
        return node.value

    def expr_StrLit(self, node, env):
        return node.value

    def expr_BoolLit(self, node, env):
        return node.value

    def expr_ListLit(self, node, env):
        return [self.expr(i, env) for i in node.items]

    def expr_TupleLit(self, node, env):
        return [self.expr(i, env) for i in node.items]

    def expr_SpecExpr(self, node, env):
        return node  # interpreted by shard(), which knows the operand's rank

    def expr_Name(self, node, env):
        n = node.id
        if n in env:
            return env[n]
        if n in self.consts:
            return self.consts[n]
        if T.is_dtype(n):
            return Dtype(n)
        if n in self.funcs:
            raise SpmdError(f"'{n}' is a function; call it as {n}(...)", node.span)
        if n in self.structs:
            fields = ", ".join(f"{f.name}=..." for f in self.structs[n].fields)
            raise SpmdError(f"'{n}' is a struct; construct one as {n}({fields})", node.span)
        if n in BUILTINS:
            raise SpmdError(f"'{n}' is a builtin; call it as {n}(...)", node.span)
        if self.mesh and n in self.mesh.names:
            raise SpmdError(f"'{n}' is a mesh axis; axes may only appear in sharding specs", node.span)
        options = list(env) + list(self.consts)
        raise SpmdError(f"unknown name '{n}'" + did_you_mean(n, options), node.span)

    def expr_Neg(self, node, env):
        x = self.expr(node.operand, env)
        if isinstance(x, StructValue):
            return S.leafwise(self, lambda a: self.b.emit("neg", *a, span=node.span), [x], [node.operand.span],
                              node.span, "negation")
        if isinstance(x, Value):
            if x.type.dtype == "bool":
                raise SpmdError("cannot negate a bool tensor; use logical_not", node.span)
            out = self.b.emit("neg", x, span=node.span)
            if x in WEAK:
                WEAK.add(out)
            return out
        if isinstance(x, (int, float)) and not isinstance(x, bool):
            return -x
        raise SpmdError(f"cannot negate {describe(x)}", node.span)

    def expr_BinOp(self, node, env):
        a, b = self.expr(node.left, env), self.expr(node.right, env)
        if node.op == "@":
            for v, sp in ((a, node.left.span), (b, node.right.span)):
                if isinstance(v, StructValue):
                    raise SpmdError(f"@ is not leafwise: it needs tensors, got {describe(v)}", sp)
            return self.matmul(a, b, node)
        kind = {"+": "add", "-": "sub", "*": "mul", "/": "div", "//": "floordiv", "%": "mod"}[node.op]
        return self.binary(kind, a, b, node.span, node.left.span, node.right.span)

    def expr_Compare(self, node, env):
        a, b = self.expr(node.left, env), self.expr(node.right, env)
        kind = {"<": "lt", "<=": "le", ">": "gt", ">=": "ge", "==": "eq", "!=": "ne"}[node.op]
        return self.binary(kind, a, b, node.span, node.left.span, node.right.span)

    def expr_Pow(self, node, env):
        a, b = self.expr(node.base, env), self.expr(node.exponent, env)
        return self.binary("pow", a, b, node.span, node.base.span, node.exponent.span)

    def expr_Call(self, node: A.Call, env):
        if node.func in self.funcs:
            f = self.funcs[node.func]
            args, spans = self._bind_user_args(f, node, env, with_spans=True)
            outs = self.call_function(f, args, node.span, spans)
            return outs[0] if len(outs) == 1 and not f.parenthesised else tuple(outs)
        if node.func in self.structs:
            return S.construct(self, node, env)
        if node.func in S.SPECIAL:
            return S.SPECIAL[node.func](self, node, env)
        if node.func in ("grad", "value_and_grad"):
            from .grad import lower_grad

            return lower_grad(self, node, env, with_value=node.func == "value_and_grad")
        if node.func in BUILTINS:
            return call_builtin(self, BUILTINS[node.func], node, env, on_struct=S.leafwise_builtin)
        if T.is_dtype(node.func):
            raise SpmdError(f"'{node.func}' is a dtype; to convert, write cast(x, {node.func})", node.func_span)
        raise SpmdError(f"unknown function '{node.func}'" + did_you_mean(node.func, list(self.funcs) + list(BUILTINS)),
                        node.func_span or node.span)

    def _bind_user_args(self, f: A.FuncDef, node: A.Call, env, with_spans: bool = False):
        names = [p.name for p in f.params]
        bound: dict[str, Any] = {}
        if len(node.args) > len(names):
            raise SpmdError(f"'{f.name}' takes {len(names)} argument(s), got {len(node.args)}", node.span)
        for p, a in zip(f.params, node.args):
            bound[p.name] = (a, self.expr(a, env))
        for kw in node.kwargs:
            if kw.name not in names:
                raise SpmdError(f"'{f.name}' has no parameter '{kw.name}'" + did_you_mean(kw.name, names), kw.span)
            if kw.name in bound:
                raise SpmdError(f"argument '{kw.name}' given twice", kw.span)
            bound[kw.name] = (kw.value, self.expr(kw.value, env))
        for p in f.params:
            if p.name not in bound:
                raise SpmdError(f"missing argument '{p.name}' of '{f.name}'", node.span)
        spans = [bound[p.name][0].span for p in f.params]
        args = self.prepare_args(f, [bound[p.name][1] for p in f.params], spans, node.span)
        return (args, spans) if with_spans else args

    def expr_Attribute(self, node: A.Attribute, env):
        return S.attribute(self, node, env)

    def expr_Subscript(self, node: A.Subscript, env):
        base = self.expr(node.base, env)
        if isinstance(base, StructValue):
            return S.index(self, base, node, env)
        if isinstance(base, Dtype):
            dims = []
            for d in node.indices:
                if isinstance(d, A.SliceIndex):
                    raise SpmdError("a type's dimensions must be integers", d.span)
                n = _check_static_int(self.static(d, env), d.span, "a dimension")
                if n < 0:
                    raise SpmdError(f"dimension must be non-negative, got {n}", d.span)
                dims.append(n)
            out = TensorType(base.name, tuple(dims))
            check_type(out, node.span)
            return StaticType(out)
        if not isinstance(base, Value):
            raise SpmdError(f"cannot index {describe(base)}", node.span)
        return self.index(base, node, env)

    def index(self, x: Value, node: A.Subscript, env) -> Value:
        for idx in node.indices:
            if isinstance(idx, A.Name) and idx.id == "None":
                raise SpmdError("indexing with None (numpy's new axis) is not supported", idx.span,
                                note="expand_dims(x, axis) adds a dim of size 1")
        if len(node.indices) > x.type.rank:
            raise SpmdError(f"too many indices ({len(node.indices)}) for {x.type}", node.span)
        starts, stops, steps, drop = [], [], [], []
        at: dict[int, Value] = {}  # dims indexed by a run-time value
        for d, n in enumerate(x.type.shape):
            if d >= len(node.indices):
                starts.append(0), stops.append(n), steps.append(1)
                continue
            idx = node.indices[d]
            if isinstance(idx, A.SliceIndex):
                step = 1 if idx.step is None else _check_static_int(self.static(idx.step, env), idx.step.span,
                                                                     "slice step")
                if step <= 0:
                    raise SpmdError(f"slice step must be positive, got {step}", idx.step.span)
                lo = None if idx.start is None else _check_static_int(self.static(idx.start, env), idx.start.span,
                                                                       "slice start")
                hi = None if idx.stop is None else _check_static_int(self.static(idx.stop, env), idx.stop.span,
                                                                     "slice stop")
                a, b, _ = slice(lo, hi, step).indices(n)
                b = max(a, b)
                starts.append(a), stops.append(b), steps.append(step)
            else:
                i = self.expr(idx, env)
                if isinstance(i, Value):
                    if i.type.rank != 0 or not T.is_int(i.type.dtype):
                        raise SpmdError(f"an index must be an integer scalar, got {i.type}; use "
                                        "take(x, ids, axis) to gather with a tensor of ids", idx.span)
                    if n == 0:  # (a loop over range(0) reading xs[i]: the loop never runs, the read is typed)
                        raise SpmdError(f"indexing dimension {d} of {x.type}, which is empty (size 0)", idx.span)
                    at[d] = i
                    starts.append(0), stops.append(1), steps.append(1)  # of the dynamic_slice's one element
                    drop.append(d)
                    continue
                i = _check_static_int(i, idx.span, "an index")
                if not -n <= i < n:
                    raise SpmdError(f"index {i} is out of range for dimension {d} of size {n}", idx.span)
                i %= n
                starts.append(i), stops.append(i + 1), steps.append(1)
                drop.append(d)
        out = x
        if at:  # one element of each such dim, clamped into [0, n-1]; the static part slices that
            out = dynamic_window(self, x, [at.get(d, 0) for d in range(x.type.rank)],
                                 [1 if d in at else n for d, n in enumerate(x.type.shape)], node.span)
        if (tuple(starts), tuple(stops), tuple(steps)) != ((0,) * x.type.rank, out.type.shape, (1,) * x.type.rank):
            out = self.b.emit("slice", out, span=node.span, starts=tuple(starts), stops=tuple(stops),
                              steps=tuple(steps))
        if drop:
            shape = tuple(n for d, n in enumerate(out.type.shape) if d not in drop)
            out = self.b.emit("reshape", out, span=node.span, shape=shape)
        return out

    # ------------------------------------------------------------------ helpers used by builtins

    def materialize(self, v, span: Span, dtype: str | None = None) -> Value:
        """A static scalar as a rank-0 constant; a weak literal takes `dtype` when given."""
        if isinstance(v, Value):
            return v
        if isinstance(v, bool):
            dt = dtype or "bool"
        elif isinstance(v, int):
            dt = dtype or "i32"
        elif isinstance(v, float):
            dt = dtype or "f32"
            if not T.is_float(dt):
                raise SpmdError(f"the number {v} cannot be a {dt} value", span)
        else:
            raise SpmdError(f"expected a tensor, got {describe(v)}", span)
        if dt == "bool" and not isinstance(v, bool):
            raise SpmdError(f"{v} is not a bool; use true or false", span)
        return self.b.emit("full", span=span, dtype=dt, shape=(), value=scalar_value(v, dt, span))

    def cast(self, v: Value, dtype: str, span) -> Value:
        return v if v.type.dtype == dtype else self.b.emit("cast", v, span=span, dtype=dtype)

    def broadcast_shapes(self, shapes, span) -> tuple[int, ...]:
        rank = max((len(s) for s in shapes), default=0)
        out = []
        for i in range(rank):
            sizes = {s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0}
            big = sizes - {1}
            if len(big) > 1:
                raise SpmdError("shapes " + " and ".join(str(list(s)) for s in shapes)
                                + " do not broadcast", span)
            out.append(big.pop() if big else 1)
        return tuple(out)

    def broadcast_to(self, v: Value, shape, span) -> Value:
        """numpy broadcasting made explicit; rank-0 values stay scalars for elementwise ops."""
        shape = tuple(shape)
        if v.type.shape == shape:
            return v
        offset = len(shape) - v.type.rank
        if offset < 0:
            raise SpmdError(f"cannot broadcast {v.type} to {list(shape)}", span)
        for i, n in enumerate(v.type.shape):
            if n not in (1, shape[offset + i]):
                raise SpmdError(f"cannot broadcast {v.type} to {list(shape)}", span)
        return self.b.emit("broadcast_in_dim", v, span=span, shape=shape,
                           dims=tuple(range(offset, len(shape))))

    def unify(self, values, spans, span, float_only=False) -> tuple[list[Value], str, tuple[int, ...]]:
        """Common dtype (weak literals adopt it) and broadcast shape of elementwise operands."""
        tensors = [v for v in values if isinstance(v, Value)]
        for v, sp in zip(values, spans):
            if not isinstance(v, (Value, int, float, bool)):
                raise SpmdError(f"expected a tensor or a number, got {describe(v)}", sp)
        strong = [v for v in tensors if v not in WEAK] or tensors  # weak values count as literals
        if tensors:
            dt = strong[0].type.dtype
            for t in strong[1:]:
                dt = T.promote(dt, t.type.dtype)
            weak = [v for v in values if is_weak(v) and not any(v is t for t in strong)]
            kinds = {("float" if isinstance(v, float) else "int") if not isinstance(v, Value) else T.kind(v.type.dtype)
                     for v in weak}
            if "float" in kinds and not T.is_float(dt):
                dt = float_for(dt)  # a float literal meets an int tensor: promote, as jax's weak floats do
            elif "int" in kinds and dt == "bool":
                dt = "i32"  # likewise an int literal meets a bool tensor (numpy: True * 2 == 2)
        else:
            dt = "f32" if any(isinstance(v, float) for v in values) else (
                "bool" if all(isinstance(v, bool) for v in values) else "i32")
        if float_only and not T.is_float(dt):
            dt = float_for(dt)
        shape = self.broadcast_shapes([v.type.shape for v in tensors], span)
        out = []
        for v, sp in zip(values, spans):
            if isinstance(v, Value):
                v = self.cast(v, dt, span)
            else:
                if isinstance(v, bool) and dt != "bool":
                    v = int(v)
                v = self.materialize(v, sp, dtype=dt)
            if v.type.rank:
                v = self.broadcast_to(v, shape, span)
            out.append(v)
        return out, dt, shape

    def binary(self, kind: str, a, b, span, aspan=None, bspan=None):
        if isinstance(a, StructValue) or isinstance(b, StructValue):  # leafwise
            return S.leafwise(self, lambda ab: self.binary(kind, *ab, span, aspan, bspan), [a, b],
                              [aspan or span, bspan or span], span, f"'{_SYMBOL.get(kind, kind)}'")
        if not isinstance(a, Value) and not isinstance(b, Value):
            return _fold(kind, a, b, span)
        values, dt, shape = self.unify([a, b], [aspan or span, bspan or span], span)
        if dt == "bool" and kind in ("add", "sub", "mul", "div", "pow", "floordiv", "mod"):
            raise SpmdError("arithmetic on bool tensors is not defined; cast to i32 or f32 first", span)
        if kind in ("div", "atan2") and T.is_int(dt):
            values = [self.cast(v, float_for(dt), span) for v in values]  # in floats, as numpy
        if kind in ("logical_and", "logical_or") and dt != "bool":
            raise SpmdError(f"{kind} needs bool operands", span)
        out = self.b.emit(kind, *values, span=span)
        if is_weak(a) and is_weak(b) and T.kind(out.type.dtype) != "bool":
            WEAK.add(out)  # computed from literals only: stays weak, as in jax (comparisons do not)
        return out

    def matmul(self, a, b, node) -> Value:
        for v, sp in ((a, node.left.span), (b, node.right.span)):
            if not isinstance(v, Value) or v.type.rank == 0:
                raise SpmdError(f"@ needs tensors of rank >= 1, got {describe(v)}", sp)
        dt = T.promote(a.type.dtype, b.type.dtype)
        if dt == "bool":
            raise SpmdError("@ needs numeric operands, got bool", node.span)
        a, b = self.cast(a, dt, node.span), self.cast(b, dt, node.span)
        sa, sb = a.type.shape, b.type.shape
        if sa[-1] != (sb[-2] if len(sb) >= 2 else sb[0]):
            raise SpmdError(f"matmul shapes do not match: {a.type} @ {b.type} (contracting "
                            f"{sa[-1]} vs {sb[-2] if len(sb) >= 2 else sb[0]})", node.span)
        if len(sa) == 1 and len(sb) == 1:
            return self.b.emit("einsum", a, b, span=node.span, spec="k,k->")
        if len(sb) == 1:
            batch = "abcdefghij"[: len(sa) - 2]
            return self.b.emit("einsum", a, b, span=node.span, spec=f"{batch}mk,k->{batch}m")
        if len(sa) == 1:
            batch = "abcdefghij"[: len(sb) - 2]
            return self.b.emit("einsum", a, b, span=node.span, spec=f"k,{batch}kn->{batch}n")
        ba, bb = sa[:-2], sb[:-2]
        batch = self.broadcast_shapes([ba, bb], node.span)
        letters = "abcdefghij"[: len(batch)]

        def operand(v, bdims, tail):
            keep, shape = [], []
            off = len(batch) - len(bdims)
            for i, n in enumerate(bdims):
                if n == batch[off + i]:
                    keep.append(letters[off + i])
                    shape.append(n)
            if len(keep) != len(bdims):  # size-1 dims that broadcast are dropped, not materialised
                v = self.b.emit("reshape", v, span=node.span, shape=tuple(shape) + v.type.shape[-2:])
            return v, "".join(keep) + tail

        a, la = operand(a, ba, "mk")
        b, lb = operand(b, bb, "kn")
        return self.b.emit("einsum", a, b, span=node.span, spec=f"{la},{lb}->{letters}mn")


_SYMBOL = {"add": "+", "sub": "-", "mul": "*", "div": "/", "floordiv": "//", "mod": "%", "pow": "**", "lt": "<",
           "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}


def _is_generic(f: A.FuncDef) -> bool:
    """A function with dtype variables or a `..S` shape in a parameter's type."""
    return bool(f.type_params) or any(
        p.type.dims and any(isinstance(d, A.ShapeVar) for d in p.type.dims) for p in f.params)


def _type_text(t: A.TypeExpr) -> str:
    if t.dims is None:
        return t.dtype

    def dim(d):
        if isinstance(d, A.ShapeVar):
            return f"..{d.name}"
        if isinstance(d, A.IntLit):
            return str(d.value)
        return d.id if isinstance(d, A.Name) else "?"

    return f"{t.dtype}[{', '.join(dim(d) for d in t.dims)}]"


def _assigned(stmts) -> dict[str, list[Span]]:
    """The names a block assigns (in nested blocks too), each with the spans that assign it."""
    out: dict[str, list[Span]] = {}
    for s in stmts:
        if isinstance(s, A.Assign):
            out.setdefault(s.target, []).append(s.span)
        elif isinstance(s, A.MultiAssign):
            for name, sp in zip(s.targets, s.target_spans):
                out.setdefault(name, []).append(sp)
        elif isinstance(s, (A.For, A.Loop)):
            for name, spans in _assigned(s.body).items():
                out.setdefault(name, []).extend(spans)
    return out


def _free_values(ops, params, results) -> list[Value]:
    """The values `ops` (and `results`) use that neither they nor `params` define, in first-use order."""
    defined = set(params)
    free: dict[Value, None] = {}
    for op in ops:
        for v in op.operands:
            if v not in defined:
                free.setdefault(v)
        defined.update(op.results)
    for v in results:
        if v not in defined:
            free.setdefault(v)
    return list(free)


def _fold(kind, a, b, span):
    """Static arithmetic on literals and consts (Python semantics; int / int stays int if exact)."""
    for v in (a, b):
        if not isinstance(v, (int, float, bool)):
            raise SpmdError(f"cannot apply '{kind}' to {describe(v)}", span)
    if kind == "pow" and isinstance(b, int) and not isinstance(a, float) and abs(b) > 64:
        raise SpmdError(f"constant power {a} ** {b} is too large", span)
    if kind in ("floordiv", "mod") and b == 0:
        raise SpmdError(f"static division by zero: {a} {'//' if kind == 'floordiv' else '%'} {b}", span)
    try:
        if kind == "div":
            if isinstance(a, int) and isinstance(b, int) and b != 0 and a % b == 0:
                return a // b
            return a / b
        return {
            "add": lambda: a + b, "sub": lambda: a - b,
            "floordiv": lambda: a // b, "mod": lambda: a % b, "mul": lambda: a * b, "pow": lambda: a ** b,
            "lt": lambda: a < b, "le": lambda: a <= b, "gt": lambda: a > b, "ge": lambda: a >= b,
            "eq": lambda: a == b, "ne": lambda: a != b,
            # (XLA's signed zeros: max(-0.0, 0.0) is 0.0 and min -0.0, whichever comes first)
            "maximum": lambda: a + b if a == b == 0 else max(a, b),
            "minimum": lambda: -(-a - b) if a == b == 0 else min(a, b),
            "atan2": lambda: math.atan2(a, b),
            "logical_and": lambda: bool(a) and bool(b), "logical_or": lambda: bool(a) or bool(b),
        }[kind]()
    except (ZeroDivisionError, OverflowError) as e:
        raise SpmdError(f"constant arithmetic failed: {e}", span) from None


def _const_override(c: A.ConstDecl, declared: int | float, value) -> int | float:
    """--set / consts= for const `c`: an integer const takes an integer, a float const any finite
    number (as a float)."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(declared, int):
        if not number or not isinstance(value, int):
            raise OverrideError(f"--set {c.name}={value!r}: '{c.name}' is an integer const; give an integer", c.span)
        return value
    if not number or not math.isfinite(value):
        raise OverrideError(f"--set {c.name}={value!r}: '{c.name}' is a float const; give a finite number", c.span)
    return float(value)


def lower(module: A.Module, source: Source, mesh=None, consts=None, entry=None) -> Program:
    """Lower a parsed module to the global IR program of its entry function."""
    return Lowerer(module, source, mesh, consts).lower_program(entry)
