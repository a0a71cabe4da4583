"""grad(f, a1, ..., an, argnums=[0]) and value_and_grad(...): inline f, differentiate it.

f is inlined on fresh parameter values (one per argument, so that the same value passed twice
still gets one partial derivative per position), the backward pass is appended (ir.autodiff), and
then the parameters are replaced by the arguments. A record of the call (ir.core.GradCall) keeps
the forward function as ops of its own for the xla oracle, which differentiates it with jax.
"""

from __future__ import annotations

from ..errors import SpmdError
from ..ir import types as T
from ..ir.autodiff import Differentiator, backward_pass
from ..ir.core import GradCall
from . import ast as A
from . import structs as S
from .values import StructType, StructValue, describe, did_you_mean


def lower_grad(ctx, node: A.Call, env, with_value: bool):
    name = node.func
    if not node.args:
        raise SpmdError(f"{name}() needs a function and its arguments, e.g. {name}(loss, w, x)", node.span)
    fnode = node.args[0]
    if not isinstance(fnode, A.Name) or fnode.id not in ctx.funcs:
        what = fnode.id if isinstance(fnode, A.Name) else None
        hint = ""
        if what is not None and what not in ctx.funcs and what not in env:
            hint = did_you_mean(what, list(ctx.funcs))
        if what in env or what is None:
            got = describe(ctx.expr(fnode, env)) if what is None or what in env else what
        else:
            got = f"'{what}'"
        raise SpmdError(f"the first argument of {name}() must be a function of this file, got {got}{hint}",
                        fnode.span)
    f = ctx.funcs[fnode.id]
    argnums_node = None
    for kw in node.kwargs:
        if kw.name != "argnums":
            raise SpmdError(f"{name}() has no argument '{kw.name}'" + did_you_mean(kw.name, ["argnums"]), kw.span)
        if argnums_node is not None:
            raise SpmdError(f"argument 'argnums' of {name}() given twice", kw.span)
        argnums_node = kw
    # the arguments of f, checked and bound as a call of f would bind them
    call = A.Call(span=node.span, func=f.name, args=node.args[1:], kwargs=[], func_span=fnode.span)
    args = ctx._bind_user_args(f, call, env)
    if len(f.results) != 1:
        raise SpmdError(f"{name}() needs a function with one result, a float scalar; '{f.name}' declares "
                        f"{len(f.results)}", fnode.span)
    rt = ctx.type_of(f.results[0].type, ctx.bind_generics(f, args, [None] * len(args), node.span))
    if isinstance(rt, StructType):
        raise SpmdError(f"{name}() needs a function whose result is a float scalar such as f32[]; "
                        f"'{f.name}' returns the struct {rt}", fnode.span)
    if rt.rank != 0 or not T.is_float(rt.dtype):
        raise SpmdError(f"{name}() needs a function whose result is a float scalar such as f32[]; "
                        f"'{f.name}' returns {rt}", fnode.span)
    argnums = _argnums(ctx, argnums_node, env, len(args), name, fnode.span)
    for i in argnums:
        for leaf in S.flat(args[i]):
            if not T.is_float(leaf.type.dtype):
                where = node.args[1 + i].span if 1 + i < len(node.args) else node.span
                what = f"{args[i].type}" if leaf is args[i] else f"a struct {args[i].type} with the leaf {leaf.type}"
                raise SpmdError(f"{name}(): argument {i} ('{f.params[i].name}') is {what}; only float "
                                "arguments can be differentiated", where)
    return _differentiate(ctx, f, args, argnums, node, with_value)


def _argnums(ctx, kw, env, n: int, name: str, span) -> tuple[int, ...]:
    if n == 0:
        raise SpmdError(f"{name}(): the function takes no arguments to differentiate", span)
    if kw is None:
        return (0,)
    v = ctx.static(kw.value, env)
    items = v if isinstance(v, list) else [v]
    if not items or not all(isinstance(x, int) and not isinstance(x, bool) for x in items):
        raise SpmdError(f"argnums must be a non-empty list of argument indices, e.g. [0, 1], got {describe(v)}",
                        kw.value.span)
    out = []
    for x in items:
        if not -n <= x < n:
            raise SpmdError(f"argnums: {x} is out of range for a function of {n} argument(s)", kw.value.span)
        x %= n
        if x in out:
            raise SpmdError(f"argnums: argument {x} is named twice", kw.value.span)
        out.append(x)
    return tuple(out)


def _differentiate(ctx, f, args: list, argnums, node, with_value: bool):
    """A struct argument is its leaves: one fresh parameter per leaf, and its gradient is a struct
    of their gradients, laid out as the argument."""
    b = ctx.b
    structured = [ctx.fresh(a.type, p.name) for a, p in zip(args, f.params)]
    start, calls = len(b.ops), len(ctx.grad_calls)
    (out,) = ctx.call_function(f, structured, node.span)
    forward = tuple(b.ops[start:])
    params = [leaf for v in structured for leaf in S.flat(v)]
    first = [0]
    for v in structured:
        first.append(first[-1] + len(S.flat(v)))
    leaf_argnums = [k for i in argnums for k in range(first[i], first[i + 1])]
    args = [leaf for a in args for leaf in S.flat(a)]
    d = Differentiator(b)
    d.span = node.span
    seed = d.const(1.0, out.type.dtype)
    cts = backward_pass(d, list(forward), [params[i] for i in leaf_argnums], [(out, seed)])
    grads = []
    for i, ct in zip(leaf_argnums, cts):
        if ct is None:  # the result does not depend on this argument
            d.span = node.span
            ct = d.zeros(params[i].type)
        grads.append(ct)
    argnums = leaf_argnums
    # no dead cotangents: drop backward ops the gradients do not need (rules build every operand's)
    live = set(grads)
    kept = []
    end = start + len(forward) + d.inserted  # a forward loop's residual buffers come before it
    for op in reversed(b.ops[end:]):
        if any(r in live for r in op.results):
            kept.append(op)
            live.update(op.operands)
    b.ops[end:] = kept[::-1]
    _name_cotangents(ctx, b.ops[end:], d.cotangent_of)
    # the program computes on the arguments themselves
    subst = dict(zip(params, args))
    for k in range(start, len(b.ops)):
        op = b.ops[k]
        if any(v in subst for v in op.operands):
            b.ops[k] = op.replace(operands=tuple(subst.get(v, v) for v in op.operands))
    for k in range(calls, len(ctx.grad_calls)):
        ctx.grad_calls[k] = ctx.grad_calls[k].remapped(subst)
    grads = [subst.get(g, g) for g in grads]
    ctx.grad_calls.append(GradCall(tuple(params), forward, out, tuple(args), tuple(argnums), tuple(grads),
                                   node.span))
    grads_it = iter(grads)
    grads = [S.unflatten(ctx, v.type, grads_it) if isinstance(v, StructValue) else next(grads_it)
             for v in (structured[i] for i in _arg_positions(structured, argnums, first))]
    results = ([subst.get(out, out)] if with_value else []) + grads
    return results[0] if len(results) == 1 else tuple(results)


def _name_cotangents(ctx, backward_ops, cotangent_of: dict) -> None:
    """Each cotangent the backward ops compute is named after its forward value (`d_h` for the
    cotangent of `h`) unless it has a name, so the emitted module stays readable; names given
    later by the source (`l, g1 = value_and_grad(...)`) win."""
    made = {r for op in backward_ops for r in op.results}
    for c, fwd in cotangent_of.items():
        name = ctx.names.get(fwd) or fwd.name
        if name and c in made and c.name is None:
            ctx.names.setdefault(c, f"d_{name}")


def _arg_positions(structured, leaf_argnums, first) -> list[int]:
    """The argument positions whose leaves leaf_argnums lists, in order."""
    out = []
    for k in leaf_argnums:
        i = next(i for i in range(len(structured)) if first[i] <= k < first[i + 1])
        if not out or out[-1] != i:
            out.append(i)
    return out
