"""Writing plans into the source, as ordinary annotations: a rewrite keyed by the spans the
frontend records (a spec on every parameter and result that had none, and shard() around the
assignments whose chosen layout propagation would not find by itself); and the reverse, stripping
a program's annotations (strip_annotations, batch_only) for the benchmarks and tests."""

from __future__ import annotations

from ..api import Compiled
from ..errors import Source, Span
from ..frontend import ast as A
from ..frontend.lower import Lowerer
from ..frontend.parse import parse


def _where(source: Source, func: A.FuncDef) -> Span:
    return func.span if func is not None else Span(source, 1, 1)


def _entry(module: A.Module, entry: str | None) -> A.FuncDef:
    funcs = {f.name: f for f in module.funcs}
    if entry is not None:
        return funcs[entry]
    return funcs.get("main") or module.funcs[0]


# ---------------------------------------------------------------------------------- source rewriting


class _Text:
    """Edits keyed by spans, applied together (none overlaps another)."""

    def __init__(self, text: str):
        self.text = text
        self.starts = [0]
        for i, ch in enumerate(text):
            if ch == "\n":
                self.starts.append(i + 1)
        self.edits: list[tuple[int, int, str]] = []

    def offset(self, line: int, col: int) -> int:
        return self.starts[line - 1] + col - 1

    def span(self, s: Span) -> tuple[int, int]:
        return self.offset(s.line, s.col), self.offset(s.end_line, s.end_col)

    def replace(self, s: Span, new: str) -> None:
        a, b = self.span(s)
        self.edits.append((a, b, new))

    def insert(self, at: int, new: str) -> None:
        self.edits.append((at, at, new))

    def extent(self, node) -> tuple[int, int]:
        """Offsets of the whole text of an expression: a node's own span can be a part of it (a
        binary operator's is its operator token), so take every sub-node's, then the parentheses
        that close around them."""
        a, b = self.span(node.span)

        def walk(n):
            nonlocal a, b
            for v in vars(n).values():
                for x in (v if isinstance(v, list) else [v]):
                    if isinstance(x, A.Node) and x.span is not None and x.span.end_line is not None:
                        xa, xb = self.span(x.span)
                        a, b = min(a, xa), max(b, xb)
                        walk(x)

        walk(node)
        while True:
            depth = 0
            low = 0
            for ch in self.text[a:b]:
                depth += ch == "("
                depth -= ch == ")"
                low = min(low, depth)
            if low < 0:  # a ')' closes something opened before: take its '('
                a = self.text.rindex("(", 0, a)
            elif depth > 0:
                b = self.text.index(")", b) + 1
            else:
                return a, b

    def wrap(self, node, before: str, after: str) -> None:
        a, b = self.extent(node)
        self.edits.append((a, a, before))
        self.edits.append((b, b, after))

    def result(self) -> str:
        """The text with every edit applied, in one pass (edits at one offset in the order made)."""
        out, pos = [], 0
        for a, b, new in sorted(self.edits, key=lambda e: (e[0], e[1])):
            out += [self.text[pos:a], new]
            pos = b
        out.append(self.text[pos:])
        return "".join(out)


def _with_overrides(text: str, module: A.Module, mesh, consts, base: Compiled, t: _Text | None = None) -> str:
    """The source with --mesh and --set written into the mesh and const declarations."""
    t = t or _Text(text)
    for m in module.meshes:
        for ax in m.axes:
            if mesh and ax.name in mesh:
                t.replace(ax.size.span, str(mesh[ax.name]))
    if consts:
        values = _const_values(module, consts)
        for cdecl in module.consts:
            if cdecl.name in consts:  # as the compile read it: a float const stays a float (LR=1 -> 1.0)
                t.replace(cdecl.value.span, repr(values[cdecl.name]))
    return t.result()


def _const_values(module: A.Module, consts) -> dict:
    """Every const's value under the overrides `consts`, typed as the compile types it."""
    lowerer = Lowerer(module, module.span.source, const_override=consts)
    lowerer._lower_consts()
    return lowerer.consts


def _assignments(stmts) -> list[A.Assign]:
    out = []
    for s in stmts:
        if isinstance(s, A.Assign):
            out.append(s)
        elif isinstance(s, (A.For, A.Loop)):
            out.extend(_assignments(s.body))
    return out


def _key(span: Span | None):
    return None if span is None else (span.line, span.col, span.end_line, span.end_col)


def _assigned_values(prog, func, others=()) -> dict:
    """id(Assign) -> the value it assigns, for the entry function's assignments: inside `for`
    bodies by the span of the assigned expression (the last op emitted for it: every iteration is
    one statement of the source), at the top level by name (values take the entry function's
    names; the k-th assignment to a name is its k-th value)."""
    by_span = {}
    by_name: dict = {}
    from ..ir.core import all_ops

    for op in all_ops(prog.ops):
        for r in op.results:
            if r.name:
                by_name.setdefault(r.name, []).append(r)
        k = _key(op.span)
        if k is not None and len(op.results) == 1 and not op.backward:
            by_span[k] = op.result
    out = {}
    for f in others:  # another function's assignments (inlined: by span, the last call's value)
        for s in _assignments(f.body):
            v = by_span.get(_key(s.value.span))
            if v is not None:
                out[id(s)] = v
    for s in _assignments_in_loops(func.body):
        v = by_span.get(_key(s.value.span))
        if v is not None:
            out[id(s)] = v
    top = [s for s in func.body if isinstance(s, A.Assign)]
    looped = {s.target for s in _assignments_in_loops(func.body)}
    for name in {s.target for s in top} - looped:
        stmts = [s for s in top if s.target == name]
        values = by_name.get(name, [])
        if len(values) == len(stmts):
            out.update({id(s): v for s, v in zip(stmts, values)})
    return out


def _assignments_in_loops(stmts, inside: bool = False) -> list[A.Assign]:
    out = []
    for s in stmts:
        if isinstance(s, A.Assign) and inside:
            out.append(s)
        elif isinstance(s, (A.For, A.Loop)):
            out.extend(_assignments_in_loops(s.body, True))
    return out


def _spec(s) -> str:
    from ..ir.mesh import Sharding

    return str(Sharding(s.dims))


def _struct_leaves(structs: dict, name: str, prefix: str, lead: int = 0) -> list:
    """(dotted path, field declaration, stacking dims before the field's own) of every leaf of a
    value of struct `name`, depth-first."""
    out = []
    for f in structs[name].fields:
        if f.type.dtype in structs:
            out += _struct_leaves(structs, f.type.dtype, f"{prefix}.{f.name}", lead + len(f.type.dims or []))
        else:
            out.append((f"{prefix}.{f.name}", f, lead))
    return out


def _leaf_constraint(path: str, spec: str) -> str:
    """`p = replace(p, blocks=replace(p.blocks, w1=shard(p.blocks.w1, {...})))`: one struct leaf constrained."""
    parts = path.split(".")
    value = f"shard({path}, {spec})"
    for k in range(len(parts) - 1, 0, -1):
        value = f"replace({'.'.join(parts[:k])}, {parts[k]}={value})"
    return f"{parts[0]} = {value}"


def _spec_edits(t: _Text, func, prob, sol, prog, results=True, structs: dict | None = None) -> dict:
    """Insert a spec on every parameter and result of `func` that has none; returns name -> spec of
    every parameter (a struct's leaves by their dotted names). results: True (the search's
    layouts), False (none), or a list of specs. A struct's leaves are laid out by its field specs:
    a field without one gets the layout the search chose for it in the first parameter of that
    struct (when its stacking dims are unsplit); struct results follow their declaration."""
    from ..ir.mesh import Sharding

    structs = structs or {}
    params = {}
    by_name = {p.name: p for p in prog.params}
    fields: dict[int, tuple] = {}  # field declaration -> (it, [(leaf path, chosen sharding, lead)])
    for p in func.params:
        if p.type.dtype in structs:
            for path, fd, lead in _struct_leaves(structs, p.type.dtype, p.name, len(p.type.dims or [])):
                if path not in by_name:
                    continue
                sh = prob.sharding(by_name[path], sol)
                params[path] = _spec(sh)
                if fd.spec is None:
                    fields.setdefault(id(fd), (fd, []))[1].append((path, sh, lead))
            continue
        if p.name not in by_name:
            continue
        params[p.name] = _spec(prob.sharding(by_name[p.name], sol))
        if p.spec is None:
            t.insert(t.span(p.type.span)[1], " " + params[p.name])
    # a field whose leaves the search lays out alike (stacking dims unsplit) gets that spec; the
    # leaves of one that differs (weights replicated, their Adam moments split) are constrained one
    # by one at the top of the function
    constraints = []
    for fd, leaves in fields.values():
        inner = {_spec(Sharding(tuple(sh.dims[lead:]))) for _, sh, lead in leaves}
        if len(inner) == 1 and not any(any(sh.dims[:lead]) for _, sh, lead in leaves):
            t.insert(t.span(fd.type.span)[1], " " + inner.pop())
        else:
            constraints += [(path, _spec(sh)) for path, sh, _ in leaves]
    # (a constraint the function states already, as autoshard's own output does, is not written twice)
    lines = {line.strip() for line in t.text.splitlines()}
    constraints = [(path, spec) for path, spec in constraints if _leaf_constraint(path, spec) not in lines]
    if constraints and func.body:
        first = func.body[0]
        indent = "\n" + " " * (first.span.col - 1)
        t.insert(t.extent(first)[0], "".join(_leaf_constraint(path, spec) + indent for path, spec in constraints))
    i = 0  # the result's (first leaf's) index in prog.results
    for r in func.results:
        if r.type.dtype in structs:
            i += len(_struct_leaves(structs, r.type.dtype, "", len(r.type.dims or [])))
            continue
        if r.spec is None and i < len(prog.results) and results is not False:
            spec = _spec(prob.value_sharding(prog.results[i].value, sol)) if results is True else results[i]
            t.insert(t.span(r.type.span)[1], " " + spec)
        i += 1
    return params


def _rewrap(t: _Text, func, others, chosen: dict, got: dict, prob, sol, c1) -> list:
    """shard() around the assignments whose chosen layout propagation (in c1) does not reproduce."""
    from ..ir import registry

    constraints = []
    for s in [s for f in [func] + others for s in _assignments(f.body)]:
        v, g = chosen.get(id(s)), got.get(id(s))
        if v is None or g is None or g.type != v.type or v not in prob.producer:
            continue
        unit, j = prob.producer[v]
        if hasattr(unit, "kind") and registry.get(unit.kind).constraint:
            continue
        want = _spec(prob.sharding(unit, sol, j))
        if want != _spec(c1.propagation.shardings[g]):
            t.wrap(s.value, "shard(", f", {want})")
            constraints.append({"line": s.span.line, "name": s.target, "sharding": want})
    return constraints


# ---------------------------------------------------------------------------------- stripping


def strip_annotations(text: str, keep: dict[str, str] | None = None, filename: str = "<input>",
                      entry: str | None = None) -> str:
    """The program with every sharding annotation of its entry function removed (parameter and
    result specs, the field specs of structs, shard() calls), except the parameter specs in `keep`
    (name -> spec text)."""
    module, _source = parse(text, filename)
    func = _entry(module, entry)
    keep = keep or {}
    t = _Text(text)
    for sd in module.structs:
        for f in sd.fields:
            if f.spec is not None:
                t.edits.append((t.span(f.type.span)[1], t.span(f.spec.span)[1], ""))
    for p in func.params:
        if p.spec is not None:
            a = t.span(p.type.span)[1]
            b = t.span(p.spec.span)[1]
            t.edits.append((a, b, (" " + keep[p.name]) if p.name in keep else ""))
        elif p.name in keep:
            t.insert(t.span(p.type.span)[1], " " + keep[p.name])
    for r in func.results:
        if r.spec is not None:
            t.edits.append((t.span(r.type.span)[1], t.span(r.spec.span)[1], ""))

    def strip_calls(node):
        if isinstance(node, A.Call) and node.func == "shard" and node.args:
            a, eb = t.extent(node)
            inner = node.args[0]
            ia, ib = t.extent(inner)
            t.edits.append((a, ia, ""))
            t.edits.append((ib, eb, ""))
            strip_calls(inner)
            return
        for v in vars(node).values():
            for x in (v if isinstance(v, list) else [v]):
                if isinstance(x, A.Node):
                    strip_calls(x)

    for s in func.body:
        strip_calls(s)
    return t.result()


def _int(node) -> int | None:
    """An integer literal's value (negative ones included), else None."""
    if isinstance(node, A.IntLit):
        return node.value
    if isinstance(node, A.Neg) and isinstance(node.operand, A.IntLit):
        return -node.operand.value
    return None


def _grad_args(func: A.FuncDef) -> tuple[set[str], set[str]]:
    """Names passed to a grad or value_and_grad call in `func`: (at a differentiated position,
    `argnums`, default [0]: a training step's weights; at the others: its batch, labels, ...)."""
    out: set[str] = set()
    data: set[str] = set()

    def walk(node):
        if isinstance(node, A.Call) and node.func in ("grad", "value_and_grad"):
            args = node.args[1:]  # args[0] is the function
            nums = [0]
            for kw in node.kwargs:
                if kw.name == "argnums":
                    items = kw.value.items if isinstance(kw.value, (A.ListLit, A.TupleLit)) else [kw.value]
                    nums = [_int(i) % len(args) for i in items if _int(i) is not None and args]
            for i, a in enumerate(args):
                if isinstance(a, A.Name):
                    (out if i in nums else data).add(a.id)
        if isinstance(node, A.Node):
            for v in vars(node).values():
                walk(v)
        elif isinstance(node, (list, tuple)):
            for v in node:
                walk(v)

    walk(func.body)
    return out, data - out


def batch_only(text: str, filename: str = "<input>", entry: str | None = None) -> str:
    """The program with every annotation of its entry function removed except the first split dim
    of its batch input: what the benchmarks give autoshard to start from. The batch input is the
    first split parameter that a grad call takes but does not differentiate (a training step's
    data), else the first split parameter no grad call differentiates (a training step's weights
    and optimizer state are what the search is to choose)."""
    module, _source = parse(text, filename)
    func = _entry(module, entry)
    weights, data = _grad_args(func)
    split = [q for q in func.params if q.spec is not None and any(e.axes and e.axes != ("_",) for e in q.spec.entries)]
    p = next((q for q in split if q.name in data), None) or next((q for q in split if q.name not in weights),
                                                                  func.params[0])
    entries, done = [], False
    for e in (p.spec.entries if p.spec is not None else []):
        if e.axes and e.axes != ("_",) and not done:
            entries.append(e.axes[0] if len(e.axes) == 1 else "(" + ", ".join(e.axes) + ")")
            done = True
        else:
            entries.append("_")
    return strip_annotations(text, {p.name: "{" + ", ".join(entries) + "}"} if done else {}, filename, entry)

