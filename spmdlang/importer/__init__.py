"""From jax: trace a jax function and write the equivalent .spmd program (`spmdlang.from_jax`).

    imp = spmdlang.from_jax(train_step, params, opt_state, batch, mesh={"data": 2},
                            in_specs=(None, None, P("data")))
    c = imp.compile()
    out = imp.unflatten(c.run(imp.flatten(params, opt_state, batch), backend="jax"))

docs/from_jax.md says what is translated and how."""

from __future__ import annotations

import inspect
import os

import numpy as np

from ..errors import SpmdError
from . import names as N
from .translate import Body, ImportError_, Ref, Translator, dtype_name, spec_text, type_text

__all__ = ["Imported", "ImportError_", "from_jax"]


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
        out = {name: np.asarray(leaf) for name, leaf in zip(self.params, leaves, strict=True)}
        out.update(self.consts)
        return out

    def unflatten(self, outputs):
        """The program's results (a list, as Compiled.run returns them) as fn's output pytree."""
        import jax

        return jax.tree_util.tree_unflatten(self.out_tree, [np.asarray(o) for o in outputs])


def _mesh_of(mesh, leaves) -> dict[str, int]:
    if mesh is not None:
        if hasattr(mesh, "shape") and hasattr(mesh, "axis_names"):
            return {str(a): int(mesh.shape[a]) for a in mesh.axis_names}
        return {str(k): int(v) for k, v in dict(mesh).items()}
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
            raise SpmdError(f"from_jax: in_specs is not a pytree prefix of the arguments: {e}") from None
    out = []
    for spec, leaf in zip(specs, leaves):
        if spec is None and isinstance(getattr(leaf, "sharding", None), NamedSharding):
            spec = leaf.sharding.spec
        out.append(spec)
    return out


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
    import jax

    try:
        from jax.sharding import AbstractMesh

        ctx = jax.sharding.use_abstract_mesh(AbstractMesh(tuple(mesh.values()), tuple(mesh)))
    except (AttributeError, TypeError):  # an older jax: trace without a mesh in context
        import contextlib

        ctx = contextlib.nullcontext()
    with ctx:
        return jax.make_jaxpr(fn, return_shape=True)(*args)


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
    closed, out_shape = _trace(fn, args, mesh)
    out_paths, out_tree = jax.tree_util.tree_flatten_with_path(out_shape)
    jaxpr = closed.jaxpr
    _check_concrete(jaxpr)
    fn_name = getattr(fn, "__name__", "fn")
    try:
        fn_file = inspect.getsourcefile(fn) or "<jax>"
    except TypeError:
        fn_file = "<jax>"
    arg_names = _arg_names(fn, len(args))
    body = Body()
    sig = _Signature(body)
    params, param_names = [], []
    arg_refs = []
    for (path, _leaf), var, spec in zip(leaves_with_paths, jaxpr.invars, specs, strict=True):
        argi = path[0].idx if path and hasattr(path[0], "idx") else 0
        pname = sig.unique(N.path_name(arg_names[argi], path[1:]))
        param, ref = _parameter(fn, body, pname, var.aval, spec)
        params.append(param)
        param_names.append(pname)
        arg_refs.append(ref)
    t = Translator(body, sig.const_param)
    top = [t.constant(np.asarray(c), None) for c in closed.consts]
    results = t.run(jaxpr, top, arg_refs)
    result_texts = [t.value(r) for r in results]
    for text, (path, _) in zip(result_texts, out_paths):  # a result no line named: after its key path
        if not body.hinted(text):
            body.hint(text, N.path_name("out", path))
    result_types = [type_text(v.aval) for v in jaxpr.outvars]
    if not result_texts:
        raise ImportError_(f"{fn_name} returns nothing: a .spmd function needs a result")

    body.lines = t.constant_lines + body.lines
    body.lines.append("  return " + ", ".join(result_texts))
    header = f"# Imported from {os.path.basename(fn_file)}:{fn_name} by spmdlang.from_jax."
    source = _render(header, mesh, params + sig.const_params, result_types, body.render(sig.taken))
    return Imported(source, param_names, in_tree, out_tree, sig.consts, name or f"{fn_name}.spmd")


class _Signature:
    """Unique names for the written function's parameters, and the traced function's constants
    as parameters after the arguments' (imp.flatten passes them), each distinct array once."""

    def __init__(self, body):
        self.body = body
        self.taken: set[str] = set()
        self.const_params: list[str] = []
        self.consts: dict[str, np.ndarray] = {}
        self._made: list[tuple[np.ndarray, Ref]] = []

    def unique(self, base: str) -> str:
        name, k = base, 1
        while name in self.taken:
            k += 1
            name = f"{base}_{k}"
        self.taken.add(name)
        return name

    def const_param(self, arr: np.ndarray, where) -> Ref:
        for seen, ref in self._made:
            if seen.shape == arr.shape and seen.dtype == arr.dtype and np.array_equal(seen, arr):
                return ref
        pname = self.unique(f"const{len(self.consts)}")
        dt = dtype_name(arr.dtype, where)
        shape = ", ".join(str(d) for d in arr.shape)
        self.const_params.append(f"# {pname}: a constant of the traced function ({arr.size} elements), "
                                 f"a parameter here: imp.flatten passes it\n{pname}: {dt}[{shape}]")
        self.consts[pname] = np.array(arr)
        ref = Ref(self.body.new(fixed=pname), dt, tuple(arr.shape))
        self._made.append((self.consts[pname], ref))
        return ref


def _check_concrete(jaxpr) -> None:
    """A shape-polymorphic trace has no spmdlang equivalent."""
    for v in [*jaxpr.invars, *jaxpr.outvars]:
        shape = getattr(getattr(v, "aval", None), "shape", ())
        if any(not isinstance(d, (int, np.integer)) for d in shape):
            where = N.frame_span(N.user_frame(jaxpr.eqns[0])) if jaxpr.eqns else None
            raise ImportError_(f"a shape-polymorphic trace (shape {shape}) has no spmdlang equivalent: "
                               "trace with concrete shapes", where)


def _parameter(fn, body, pname: str, aval, spec) -> tuple[str, Ref]:
    """(the parameter's text in the signature, its reference in the body) for one argument leaf."""
    text = body.new(fixed=pname)
    stext = spec_text(spec, len(aval.shape))
    try:
        ttext = type_text(aval)
    except ImportError_ as e:
        raise ImportError_(f"argument {pname}: {e.message}", _def_span(fn)) from None
    return f"{pname}: {ttext}" + (f" {stext}" if stext else ""), Ref(text, dtype_name(aval.dtype), tuple(aval.shape))


def _render(header: str, mesh: dict, params: list[str], result_types: list[str], body_lines: list[str]) -> str:
    """The .spmd source: the header comment, the mesh, and `main`."""
    lines = [header, f"mesh [{', '.join(f'{a}={n}' for a, n in mesh.items())}]", "",
             "func main(" + _join_params(params) + ")"
             + (f" -> {result_types[0]} {{" if len(result_types) == 1 else
                f" -> ({', '.join(result_types)}) {{")]
    lines += body_lines
    lines.append("}")
    return "\n".join(lines) + "\n"


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
