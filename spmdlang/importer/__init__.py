"""From jax: trace a jax function and write the equivalent .spmd program (`spmdlang.from_jax`).

    imp = spmdlang.from_jax(train_step, params, opt_state, batch, mesh={"data": 2},
                            in_specs=(None, None, P("data")))
    c = imp.compile()
    out = imp.unflatten(c.run(imp.flatten(params, opt_state, batch), backend="jax"))

docs/from_jax.md says what is translated and how."""

from __future__ import annotations

import inspect
import os
import re

import numpy as np

from ..errors import SpmdError
from . import names as N
from .translate import Body, NoEquivalentError, Ref, Translator, aval_shape, dtype_name, is_key, spec_text, type_text

__all__ = ["Imported", "NoEquivalentError", "from_jax"]


class Imported:
    """A traced jax function as a .spmd program, with the maps between its pytrees and the
    program's flat parameters and results."""

    def __init__(self, source: str, params: list[str], in_tree, out_tree, consts: dict, filename: str):
        self.source = source
        self.params = params          # main's parameter names for fn's argument leaves, in order
        self.in_tree = in_tree
        self.out_tree = out_tree
        self.consts = consts          # parameter name -> the constant array it stands for
        self.filename = filename
        self.out_keys: list[bool] = []  # per result leaf: a typed PRNG key (unflatten wraps its words)

    def compile(self, **kwargs):
        """spmdlang.compile(self.source, ...)."""
        from ..api import compile as compile_program

        return compile_program(self.source, filename=kwargs.pop("filename", self.filename), **kwargs)

    def flatten(self, *args) -> dict:
        """fn's arguments as {main's parameter name: numpy array} (constants included)."""
        import jax

        leaves, tree = jax.tree_util.tree_flatten(args)
        if tree != self.in_tree:
            raise ValueError(f"the arguments' structure {tree} is not the traced one {self.in_tree}")
        out = {name: _raw(leaf) for name, leaf in zip(self.params, leaves, strict=True)}
        out.update(self.consts)
        return out

    def unflatten(self, outputs):
        """The program's results (a list, as Compiled.run returns them) as fn's output pytree."""
        import jax

        outs = [jax.random.wrap_key_data(o) if key else np.asarray(o)
                for o, key in zip(outputs, self.out_keys, strict=True)]
        return jax.tree_util.tree_unflatten(self.out_tree, outs)


def _raw(leaf) -> np.ndarray:
    """An argument leaf as the program takes it: a typed PRNG key as its raw u32 words; a Python
    number in the dtype jax traced it as (a float is f32 without x64, where numpy would make f64);
    an array in the dtype jax would take it as (numpy's f64 and i64 as f32 and i32 without x64)."""
    import jax

    if is_key(getattr(leaf, "dtype", None)):
        return np.asarray(jax.random.key_data(leaf))
    if isinstance(leaf, (bool, int, float)):
        return np.asarray(jax.numpy.asarray(leaf))
    a = np.asarray(leaf)
    dt = jax.dtypes.canonicalize_dtype(a.dtype)
    return a if dt == a.dtype else a.astype(dt)


def _mesh_of(mesh, leaves) -> dict[str, int]:
    if mesh is not None:
        if hasattr(mesh, "shape") and hasattr(mesh, "axis_names"):
            return {str(a): int(mesh.shape[a]) for a in mesh.axis_names}
        sizes = {str(k): v for k, v in dict(mesh).items()}
        bad = {k: v for k, v in sizes.items() if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1}
        if bad or not sizes:
            raise SpmdError(f"from_jax: mesh={dict(mesh)!r}: every axis needs a size that is a positive integer"
                            + (f" (not {bad})" if bad else " (no axes given)"), _caller_span())
        return {k: int(v) for k, v in sizes.items()}
    for leaf in leaves:
        sh = getattr(leaf, "sharding", None)
        m = getattr(sh, "mesh", None)
        if m is not None and hasattr(sh, "spec"):
            return {str(a): int(m.shape[a]) for a in m.axis_names}
    return {"data": 1}


def _leaf_specs(args, in_specs, leaves) -> list:
    """One PartitionSpec (or None) per argument leaf: in_specs broadcast over the arguments as
    jax broadcasts a pytree prefix, else the NamedSharding of a jax.Array argument."""
    from jax.sharding import NamedSharding, PartitionSpec

    if in_specs is None:
        specs = [None] * len(leaves)
    else:
        from jax._src.tree_util import broadcast_prefix

        prefix = tuple(in_specs) if isinstance(in_specs, (tuple, list)) and len(in_specs) == len(args) \
            and not isinstance(in_specs, PartitionSpec) else (in_specs,) * len(args)
        try:
            specs = broadcast_prefix(prefix, tuple(args), is_leaf=lambda x: x is None or isinstance(x, PartitionSpec))
        except ValueError as e:
            count = (f" (it has {len(in_specs)} entries for {len(args)} arguments: one per argument, each a "
                     "PartitionSpec, None or a pytree of them)"
                     if isinstance(in_specs, (tuple, list)) and len(in_specs) != len(args) else f": {e}")
            raise SpmdError(f"from_jax: in_specs is not a pytree prefix of the arguments{count}",
                            _caller_span()) from None
    out = []
    for spec, leaf in zip(specs, leaves):
        if spec is None and isinstance(getattr(leaf, "sharding", None), NamedSharding):
            spec = leaf.sharding.spec
        out.append(spec)
    return out


def _check_specs(specs, leaves_with_paths, mesh: dict, arg_names: list[str]) -> None:
    """Each leaf's spec fits it and the mesh (one entry per dim at most, axes of the mesh, each
    once): an error naming the argument and pointing at the user's from_jax call, rather than
    one in the written program."""
    import jax
    from jax.sharding import PartitionSpec

    for spec, (path, leaf) in zip(specs, leaves_with_paths):
        if spec is None:
            continue
        shape = tuple(np.shape(leaf))
        head = getattr(path[0], "idx", None) if path else None
        name = (arg_names[head] + jax.tree_util.keystr(tuple(path[1:])) if isinstance(head, int)
                and head < len(arg_names) else "args" + jax.tree_util.keystr(path))
        what = f"from_jax: in_specs gives {name} (shape {list(shape)}) the spec {spec}"
        if not isinstance(spec, PartitionSpec):
            raise SpmdError(f"from_jax: in_specs gives {name} (shape {list(shape)}) {spec!r}, a "
                            f"{type(spec).__name__}, where a PartitionSpec is needed"
                            + (f": P({spec!r}) splits its first dim over {spec!r}" if isinstance(spec, str) else ""),
                            _caller_span())
        entries = list(spec)
        if len(entries) > len(shape):
            raise SpmdError(f"{what}, of {len(entries)} {'entry' if len(entries) == 1 else 'entries'} for its "
                            f"{len(shape)} dims", _caller_span())
        seen = []
        for e in entries:
            if e is PartitionSpec.UNCONSTRAINED:
                continue
            for a in (e if isinstance(e, (tuple, list)) else (e,) if e is not None else ()):
                if not isinstance(a, str) or a not in mesh:
                    raise SpmdError(f"{what}: the mesh has no axis {a!r} (its axes: {', '.join(mesh)})",
                                    _caller_span())
                if a in seen:
                    raise SpmdError(f"{what}, which uses the axis {a!r} twice", _caller_span())
                seen.append(a)


def _caller_span():
    """The user's line that called into spmdlang (the first frame outside the package), or None."""
    import sysconfig

    skip = (os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,  # spmdlang's own
            os.path.abspath(sysconfig.get_paths()["stdlib"]) + os.sep)  # threading's (the deep-stack thread)
    frame = inspect.currentframe()
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(skip):
        frame = frame.f_back
    return None if frame is None else _span_at(frame.f_code.co_filename, frame.f_lineno)


def _span_at(filename: str, lineno: int):
    """The span of a line of a Python source file, at its first non-blank character."""
    import linecache

    from ..errors import Source, Span

    text = "".join(linecache.getlines(filename)) if os.path.exists(filename) else ""
    line = linecache.getline(filename, lineno)
    return Span(Source(filename, text), lineno, len(line) - len(line.lstrip()) + 1)


def _raised_span(exc: BaseException):
    """The user's line an exception raised while tracing came from: the innermost frame of its
    traceback outside jax, flax, optax, numpy, spmdlang and the standard library; else None."""
    import sysconfig
    import traceback

    paths = sysconfig.get_paths()
    libraries = {os.path.abspath(paths[k]) + os.sep for k in ("stdlib", "purelib", "platlib")}
    libraries.add(os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep)
    user = [f for f in traceback.extract_tb(exc.__traceback__)
            if not any(os.path.abspath(f.filename).startswith(lib) for lib in libraries)]
    return _span_at(user[-1].filename, user[-1].lineno) if user else None


def _trace_refusal(exc: ValueError) -> SpmdError | None:
    """A jax error while tracing that means a construct from_jax cannot import, as a located
    SpmdError (None: the function's own error, raised as it is)."""
    text = str(exc)
    if "passed to reshard" in text and "Auto" in text:
        return SpmdError("jax.sharding.reshard has no spmdlang equivalent here: it needs Explicit mesh axes, "
                         "and from_jax traces the function on Auto ones (XLA's GSPMD's); constrain the layout "
                         "with jax.lax.with_sharding_constraint(x, P(...)) instead (it becomes shard(x, {...}))",
                         _raised_span(exc))
    if "passed to shard_map" in text or ("shard_map" in text and "context mesh" in text):
        return SpmdError("jax.shard_map inside the function has no spmdlang equivalent: spmdlang writes the "
                         "per-device program and its collectives itself; import the global computation (the "
                         "shard_map's body without psum and the other collectives, on whole arrays)",
                         _raised_span(exc))
    return None


def _arg_names(fn, n: int) -> list[str]:
    try:
        params = [p for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        names = [p.name for p in params]
        var = [p.name for p in inspect.signature(fn).parameters.values() if p.kind == p.VAR_POSITIONAL]
    except (TypeError, ValueError):
        names, var = [], []
    out = []
    for i in range(n):
        if i < len(names):
            out.append(names[i])
        else:
            out.append(f"{var[0]}{i - len(names)}" if var else f"arg{i}")
    return out


def _trace(fn, args, mesh: dict):
    """fn's jaxpr under an abstract mesh of `mesh` with Auto axes (so bare PartitionSpecs in
    with_sharding_constraint resolve, and jnp inserts no `reshard` as it does for Explicit axes,
    jax.make_mesh's default). jax.Array arguments are traced as their shapes and dtypes: their
    specs were read already, and an array on an Explicit mesh would clash with the Auto one."""
    import jax

    try:
        from jax.sharding import AbstractMesh, AxisType

        abstract = AbstractMesh(tuple(mesh.values()), tuple(mesh), axis_types=(AxisType.Auto,) * len(mesh))
        ctx = jax.sharding.use_abstract_mesh(abstract)
    except (AttributeError, TypeError, ImportError):  # an older jax: trace without a mesh in context
        import contextlib

        ctx = contextlib.nullcontext()

    def shape_of(a):
        if isinstance(a, jax.Array):
            return jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=getattr(a, "weak_type", False))
        return a

    with ctx:
        return jax.make_jaxpr(fn, return_shape=True)(*jax.tree_util.tree_map(shape_of, args))


def from_jax(fn, *args, mesh=None, in_specs=None, name: str | None = None) -> Imported:
    """Trace `fn(*args)` with jax and write the equivalent .spmd program.

    `args` are example arguments (pytrees of arrays, or jax.ShapeDtypeStruct): their dtypes and
    shapes become the parameters' types. `mesh` is {axis: size} or a jax Mesh (default: the mesh
    of the arguments' NamedShardings, else [data=1]). `in_specs` is a pytree prefix of `args`
    with a PartitionSpec (or None: unannotated) per subtree; without it, jax.Array arguments
    placed on a NamedSharding keep that spec. Raises SpmdError for anything with no spmdlang
    equivalent, pointing at the user's line that produced it."""
    import jax

    leaves_with_paths, in_tree = jax.tree_util.tree_flatten_with_path(args)
    leaves = [leaf for _, leaf in leaves_with_paths]
    mesh = _mesh_of(mesh, leaves)
    specs = _leaf_specs(args, in_specs, leaves)
    _check_specs(specs, leaves_with_paths, mesh, _arg_names(fn, len(args)))
    try:
        closed, out_shape = _trace(fn, args, mesh)
    except ValueError as e:
        refusal = _trace_refusal(e)
        if refusal is None:
            raise
        raise refusal from None
    out_paths, out_tree = jax.tree_util.tree_flatten_with_path(out_shape)
    jaxpr = closed.jaxpr
    _check_concrete(jaxpr)
    fn_name = getattr(fn, "__name__", "fn")
    try:
        fn_file = inspect.getsourcefile(fn) or "<jax>"
    except TypeError:
        fn_file = "<jax>"
    w = _Writer(fn, jaxpr, specs)
    arg_refs = w.arguments(_arg_names(fn, len(args)), leaves_with_paths, len(args))
    t = Translator(w.body, w.const_param)
    top = [t.constant(np.asarray(c), None) for c in closed.consts]
    result_texts = [t.value(r) for r in t.run(jaxpr, top, arg_refs)]
    result_types, result_texts = w.results(t, out_paths, out_shape, result_texts)
    if not result_texts:
        raise NoEquivalentError(f"{fn_name} returns nothing: a .spmd function needs a result")
    header = f"# Imported from {os.path.basename(fn_file)}:{fn_name} by spmdlang.from_jax."
    w.body.lines = t.constant_lines + w.body.lines
    w.body.lines.append("  return " + ", ".join(result_texts))
    source = w.render(header, mesh, result_types)
    imp = Imported(source, w.param_names, in_tree, out_tree, w.consts, name or f"{fn_name}.spmd")
    imp.out_keys = [is_key(v.aval.dtype) for v in jaxpr.outvars]
    return imp


def _check_concrete(jaxpr) -> None:
    """A shape-polymorphic trace has no spmdlang equivalent."""
    for v in [*jaxpr.invars, *jaxpr.outvars]:
        shape = getattr(getattr(v, "aval", None), "shape", ())
        if any(not isinstance(d, (int, np.integer)) for d in shape):
            where = N.frame_span(N.user_frame(jaxpr.eqns[0])) if jaxpr.eqns else None
            raise NoEquivalentError(f"a shape-polymorphic trace (shape {shape}) has no spmdlang equivalent: "
                                    "trace with concrete shapes", where)


class _Writer:
    """The written program's signature and body: parameters for the arguments (a leaf a tensor
    parameter, a pytree a struct parameter whose leaves are its fields) and for the traced
    function's constants (imp.flatten passes them), unique names, structs, and the results."""

    def __init__(self, fn, jaxpr, specs):
        self.fn, self.jaxpr, self.specs = fn, jaxpr, specs
        self.body = Body()
        self.params: list[str] = []
        self.param_names: list[str] = []
        self.taken: set[str] = set()
        self.structs = Structs()
        self.const_params: list[str] = []
        self.consts: dict[str, np.ndarray] = {}
        self.const_refs: list[tuple[np.ndarray, Ref]] = []

    def unique(self, base: str) -> str:
        name, k = base, 1
        while name in self.taken:
            k += 1
            name = f"{base}_{k}"
        self.taken.add(name)
        return name

    def arguments(self, arg_names, leaves_with_paths, nargs: int) -> list:
        """One parameter per argument; returns the body's reference to each argument leaf."""
        jaxpr, specs, fn = self.jaxpr, self.specs, self.fn
        arg_refs: list = [None] * len(leaves_with_paths)
        for arg_name, tree in zip(arg_names, _tries(leaves_with_paths, nargs)):
            if tree is None:
                continue
            pname = self.unique(N.sanitize(arg_name))
            text = self.body.new(fixed=pname)
            if isinstance(tree, int):  # the argument is one array
                aval = jaxpr.invars[tree].aval
                stext = spec_text(specs[tree], len(aval.shape))
                self.params.append(f"{pname}: {_arg_type(aval, pname, fn)}" + (f" {stext}" if stext else ""))
                self.param_names.append(pname)
                arg_refs[tree] = Ref(text, dtype_name(aval.dtype), aval_shape(aval))
                continue

            def leaf_type(k, path, pname=pname):
                aval = jaxpr.invars[k].aval
                stext = spec_text(specs[k], len(aval.shape))
                return _arg_type(aval, ".".join([pname, *path]), fn) + (f" {stext}" if stext else "")

            self.params.append(f"{pname}: {self.structs.declare(tree, _camel(arg_name), leaf_type)}")
            for k, path in _leaf_paths(tree):
                self.param_names.append(".".join([pname, *path]))
                aval = jaxpr.invars[k].aval
                arg_refs[k] = Ref(".".join([text, *path]), dtype_name(aval.dtype), aval_shape(aval))
        return arg_refs

    def const_param(self, arr: np.ndarray, where) -> Ref:
        """A constant of the traced function as a parameter (each distinct array once)."""
        for seen, ref in self.const_refs:
            if seen.shape == arr.shape and seen.dtype == arr.dtype and np.array_equal(seen, arr):
                return ref
        pname = self.unique(f"const{len(self.consts)}")
        dt = dtype_name(arr.dtype, where)
        shape = ", ".join(str(d) for d in arr.shape)
        self.const_params.append(f"# {pname}: a constant of the traced function ({arr.size} elements), "
                                 f"a parameter here: imp.flatten passes it\n{pname}: {dt}[{shape}]")
        self.consts[pname] = np.array(arr)
        ref = Ref(self.body.new(fixed=pname), dt, tuple(arr.shape))
        self.const_refs.append((self.consts[pname], ref))
        return ref

    def results(self, t, out_paths, out_shape, result_texts) -> tuple[list[str], list[str]]:
        """(result types, returned texts): fn's output tuple is several results, each a tensor or
        a struct of its leaves."""
        jaxpr, body, structs = self.jaxpr, self.body, self.structs
        # a tuple or list is several results; any other node (a dict, a NamedTuple such as an
        # optax state or a Metrics(loss, grad_norm): a tuple whose keys are its fields) is one
        several = isinstance(out_shape, (tuple, list)) and all(p and hasattr(p[0], "idx") for p, _ in out_paths)
        out_trees = _tries(out_paths, len(out_shape)) if several else \
            [_tries([((None, *p), x) for p, x in out_paths], 1)[0]]
        result_types, returned = [], []
        for i, tree in enumerate(out_trees):
            if tree is None:
                continue
            hint = f"out{i}" if len(out_trees) > 1 else "out"
            if isinstance(tree, int):
                result_types.append(type_text(jaxpr.outvars[tree].aval))
                if not body.hinted(result_texts[tree]):  # a result no line named: after its place in the output
                    body.hint(result_texts[tree], hint)
                returned.append(result_texts[tree])
                continue
            name = structs.result_type(tree, lambda k: type_text(jaxpr.outvars[k].aval), _camel(hint))
            result_types.append(name)
            returned.append(t.emit(structs.construct(tree, name, result_texts, t.emit), hint=hint))
        return result_types, returned

    def render(self, header: str, mesh: dict, result_types: list[str]) -> str:
        """The .spmd source: the header comment, the mesh, the structs, and `main`."""
        lines = [header, f"mesh [{', '.join(f'{a}={n}' for a, n in mesh.items())}]", "", *self.structs.text(),
                 "func main(" + _join_params(self.params + self.const_params) + ")"
                 + (f" -> {result_types[0]} {{" if len(result_types) == 1 else
                    f" -> ({', '.join(result_types)}) {{")]
        lines += self.body.render(self.taken)
        lines.append("}")
        return "\n".join(lines) + "\n"


def _arg_type(aval, what: str, fn) -> str:
    try:
        return type_text(aval)
    except NoEquivalentError as e:
        raise NoEquivalentError(f"argument {what}: {e.message}", _def_span(fn)) from None


def _field(key) -> str:
    """A pytree key as a struct field name (`_0` for a sequence index)."""
    text = N.key_name(key)
    name = re.sub(r"[^A-Za-z0-9_]+", "_", text).strip("_") or "_"
    if name[0].isdigit():
        name = "_" + name
    return name + "_" if name in N.RESERVED else name


def _camel(text: str) -> str:
    parts = [p for p in re.split(r"[^A-Za-z0-9]+", text) if p]
    name = "".join(p[:1].upper() + p[1:] for p in parts) or "Tree"
    return "T" + name if name[0].isdigit() else name


def _tries(leaves_with_paths, n: int) -> list:
    """Per top-level child (argument, or output element): None (no leaves), the leaf's index (the
    child is one array), or a trie {field: trie or leaf index} in jax's leaf order."""
    out: list = [None] * n
    fields: dict = {}  # id(trie node) -> {key text: its field name}

    def field(node: dict, key) -> str:
        # keys that read alike as names ("a.b" and "a_b") get distinct fields: "a_b", "a_b_2"
        taken = fields.setdefault(id(node), {})
        text = N.key_name(key)
        if text not in taken:
            name = base = _field(key)
            j = 2
            while name in taken.values():
                name, j = f"{base}_{j}", j + 1
            taken[text] = name
        return taken[text]

    for k, (path, _) in enumerate(leaves_with_paths):
        i = path[0].idx if path and hasattr(path[0], "idx") else 0
        rest = path[1:]
        if not rest:
            out[i] = k
            continue
        node = out[i] if isinstance(out[i], dict) else out.__setitem__(i, {}) or out[i]
        for key in rest[:-1]:
            node = node.setdefault(field(node, key), {})
        node[field(node, rest[-1])] = k
    return out


def _leaf_paths(tree, prefix=()):
    for f, child in tree.items():
        if isinstance(child, dict):
            yield from _leaf_paths(child, (*prefix, f))
        else:
            yield child, [*prefix, f]


class Structs:
    """The struct declarations of an imported program: one per distinct pytree node (its field
    names, types and specs), named after the first key path that has it."""

    def __init__(self):
        self.decls: list[tuple[str, list[str]]] = []
        self.by_sig: dict = {}
        self.by_shape: dict = {}  # the signature without specs -> the first struct declared with it
        self.names: set[str] = set()

    def _name(self, *hints: str) -> str:
        """The first free of `hints` (a key's own name, then its whole path), else a numbered one."""
        from ..frontend.builtins import BUILTINS
        from ..ir import types as T

        def free(name):
            return not (name in self.names or name in BUILTINS or T.is_dtype(name) or name in N.RESERVED
                        or name[0].isdigit())

        name = next((h for h in hints if h and free(h)), None)
        k = 1
        while name is None or not free(name):
            k += 1
            name = f"{hints[-1]}{k}"
        self.names.add(name)
        return name

    def declare(self, tree: dict, hint: str, leaf_type, path=()) -> str:
        root = not path
        if root:
            hint = self._name(hint)  # the argument's own struct keeps the argument's name
        fields = []
        for f, child in tree.items():
            if isinstance(child, dict):
                fields.append((f, self.declare(child, _camel(f) if f.strip("_").isalpha() or not f[1:].isdigit()
                                               else "", leaf_type, (*path, f) if path else (hint, f))))
            else:
                fields.append((f, leaf_type(child, [*path[1:], f] if path else [f])))
        sig = tuple(fields)
        if sig not in self.by_sig:
            name = hint if root else self._name(hint, _camel("_".join(path)))
            self.by_sig[sig] = name
            self.by_shape.setdefault(tuple((f, re.sub(r" \{.*\}$", "", t)) for f, t in fields), name)
            self.decls.append((name, [f"{f}: {t}" for f, t in fields]))
        return self.by_sig[sig]

    def result_type(self, tree: dict, leaf_type, hint: str) -> str:
        """A result's struct: an argument's struct of the same fields and types where there is one
        (its specs then lay out the result, as a training step returns its parameters), else a new
        one without specs."""
        fields = []
        for f, child in tree.items():
            fields.append((f, self.result_type(child, leaf_type, _camel(f)) if isinstance(child, dict)
                           else leaf_type(child)))
        shape = tuple(fields)
        if shape in self.by_shape:
            return self.by_shape[shape]
        return self.declare_plain(fields, hint)

    def declare_plain(self, fields, hint) -> str:
        sig = tuple(fields)
        if sig not in self.by_sig:
            name = self._name(hint)
            self.by_sig[sig] = name
            self.by_shape.setdefault(sig, name)
            self.decls.append((name, [f"{f}: {t}" for f, t in fields]))
        return self.by_sig[sig]

    def construct(self, tree: dict, name: str, texts: list[str], emit) -> str:
        """`Name(field=..., ...)`, the inner structs built by statements of their own (emit)."""
        decl = dict(self.decls)[name]
        kinds = {line.split(":", 1)[0]: line.split(":", 1)[1].strip() for line in decl}
        args = []
        for f, child in tree.items():
            if isinstance(child, dict):
                inner = kinds[f]
                args.append(f"{f}={emit(self.construct(child, inner, texts, emit), hint=f.lower())}")
            else:
                args.append(f"{f}={texts[child]}")
        return f"{name}({', '.join(args)})"

    def text(self) -> list[str]:
        out = []
        for name, fields in self.decls:
            out.append(f"struct {name} {{")
            out += [f"  {f}" for f in fields]
            out += ["}", ""]
        return out


def _def_span(fn):
    """The span of fn's `def` line, for errors about its arguments."""
    try:
        lines, start = inspect.getsourcelines(fn)
        path = inspect.getsourcefile(fn)
    except (OSError, TypeError):
        return None
    from ..errors import Source, Span

    with open(path, encoding="utf-8") as f:
        text = f.read()
    return Span(Source(path, text), start, len(lines[0]) - len(lines[0].lstrip()) + 1)


def _join_params(params: list[str]) -> str:
    if not params:
        return ""
    out = [p + ("," if i < len(params) - 1 else "") for i, p in enumerate(params)]
    return "\n          ".join(line for p in out for line in p.split("\n"))
