"""Contractions: einsum (matmul lowers to it) and convolution."""

from __future__ import annotations

from functools import lru_cache
from math import prod

import numpy as np

from ..ir import types as T
from ..ir.mesh import Sharding
from ..ir.types import TensorType
from ..partition.factors import PASS, PERMUTATION, REDUCTION, REPLICATE, RuleBuilder, einsum_rule
from ..partition.halo import Window
from ..partition.reshard import chunk
from .moving import _worth_it
from .registry import Family, PartialMode, ReduceKind, check, register, set_vjp

# ---------------------------------------------------------------------------------- einsum


_LETTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")  # what numpy and jax accept


def parse_einsum(spec: str, ranks) -> tuple[list[str], str]:
    """Validate an explicit-output einsum spec against operand ranks; ShapeError if malformed."""
    ranks = tuple(ranks)
    ins, out = (_parse_einsum if isinstance(spec, str) else _parse_einsum.__wrapped__)(spec, ranks)
    return list(ins), out


@lru_cache(maxsize=4096)
def _parse_einsum(spec: str, ranks: tuple[int, ...]) -> tuple[tuple[str, ...], str]:
    """parse_einsum, once per (spec, ranks): the partitioner counts an einsum's FLOPs per candidate."""
    check("->" in spec, f'einsum spec "{spec}" needs an explicit output ("->")')
    check("." not in spec, "einsum: ellipsis is not supported")
    ins, out = spec.replace(" ", "").split("->", 1)
    ins = ins.split(",")
    check(len(ins) == len(ranks), f'einsum spec "{spec}" names {len(ins)} operand(s), got {len(ranks)}')
    for letters, rank in zip(ins, ranks):
        check(all(c in _LETTERS for c in letters), f'einsum spec "{spec}": indices must be letters a-z, A-Z')
        check(len(letters) == rank, f'einsum spec "{spec}": "{letters}" has {len(letters)} indices '
              f"but the operand has rank {rank}")
        check(len(set(letters)) == len(letters), f'einsum spec "{spec}": index repeated within "{letters}"')
    check(all(c in _LETTERS for c in out) and len(set(out)) == len(out),
          f'einsum spec "{spec}": output indices must be distinct letters')
    check(set(out) <= set("".join(ins)), f'einsum spec "{spec}": output index not in any operand')
    return tuple(ins), out


def _einsum_infer(operands, attrs):
    ins, out = parse_einsum(attrs["spec"], [t.rank for t in operands])
    dt = operands[0].dtype
    if not all(t.dtype == dt for t in operands):  # (messages only for errors: this runs per einsum built)
        check(False, "einsum: operand dtypes differ: " + " vs ".join(str(t) for t in operands))
    if T.kind(dt) not in ("float", "int"):
        check(False, f"einsum needs numeric operands, got {operands[0]}")
    sizes: dict[str, int] = {}
    for letters, t in zip(ins, operands):
        for c, n in zip(letters, t.shape):
            check(sizes.setdefault(c, n) == n,
                  f'einsum "{attrs["spec"]}": index {c} is {sizes[c]} in one operand and {n} in another')
    return TensorType(dt, tuple(sizes[c] for c in out))


def _einsum_numpy(*xs, spec):
    dt = xs[0].dtype
    wide = [T.widen(x) for x in xs]
    return np.asarray(np.einsum(spec, *wide, optimize=len(xs) > 1)).astype(dt)


def _einsum_jax(args, attrs, out):
    """bf16 and f16 einsums accumulate in f32, as ref does: the operands are upcast before the dot
    (their products are exact in f32, so this is preferred_element_type=f32 by another route; XLA
    CPU has no BF16 x BF16 = F32 kernel for some dot forms: "Unsupported element type for
    DotThunk::Execute")."""
    if out[0].dtype not in ("bf16", "f16"):
        return f'jnp.einsum("{attrs["spec"]}", {", ".join(args)})'
    wide = ", ".join(f"{a}.astype(jnp.float32)" for a in args)
    return f'jnp.einsum("{attrs["spec"]}", {wide}).astype({T.jnp_dtype(out[0].dtype)})'


def _einsum_jax_local(args, attrs, out):
    """In our per-partition module a two-operand einsum is the jax.lax.dot_general (and at most one
    transpose) that jnp.einsum would trace, written out: the same operand order, dimension numbers
    (batch dims in output order, contracted dims sorted by letter), preferred_element_type and
    transpose, without jnp.einsum's contraction-path search on every trace. Other einsums (one
    operand, or an index summed within one operand) stay jnp.einsum."""
    ins, res = attrs["spec"].replace(" ", "").split("->")
    ins = ins.split(",")
    if len(ins) != 2 or any(c not in res and c not in other for a, other in (ins, ins[::-1]) for c in a):
        return _einsum_jax(args, attrs, out)
    a, b = ins
    contracted = sorted(c for c in a if c in b and c not in res)
    batch = [c for c in res if c in a and c in b]
    a_free, b_free = ([c for c in x if c not in contracted and c not in batch] for x in (a, b))
    # jnp.einsum tries (b, a) first (opt_einsum lists the pair in reverse), then (a, b): the order
    # whose output needs no transpose when one does
    if "".join(batch + a_free + b_free) == res:
        (lhs, x), (rhs, y), names = (a, args[0]), (b, args[1]), batch + a_free + b_free
    else:
        (lhs, x), (rhs, y), names = (b, args[1]), (a, args[0]), batch + b_free + a_free
    dt = out[0].dtype
    wide = dt in ("bf16", "f16")  # upcast to f32 before the dot (see _einsum_jax)
    if wide:
        x, y = f"{x}.astype(jnp.float32)", f"{y}.astype(jnp.float32)"
    dims = (f"(({_tuple(lhs.index(c) for c in contracted)}, {_tuple(rhs.index(c) for c in contracted)}), "
            f"({_tuple(lhs.index(c) for c in batch)}, {_tuple(rhs.index(c) for c in batch)}))")
    expr = (f"jax.lax.dot_general({x}, {y}, {dims}, "
            f"preferred_element_type={'jnp.float32' if wide else T.jnp_dtype(dt)})")
    if "".join(names) != res:
        expr = f"jax.lax.transpose({expr}, {_tuple(names.index(c) for c in res)})"
    return f"{expr}.astype({T.jnp_dtype(dt)})" if wide else expr


def _tuple(xs) -> str:
    return repr(tuple(xs))


def _size(letters, sizes) -> int:
    n = 1
    for c in letters:
        n *= sizes[c]
    return n


def _merge(terms, i: int, j: int, out: str) -> tuple[str, str]:
    """(all indices, indices kept) of contracting terms i and j: kept are those the output or
    another remaining term still needs."""
    rest = set(out).union(*(set(t) for k, t in enumerate(terms) if k not in (i, j)))
    both = terms[i] + "".join(c for c in terms[j] if c not in terms[i])
    return both, "".join(c for c in both if c in rest)


def _greedy_step(terms, out: str, sizes) -> tuple[int, int, str]:
    """opt_einsum's greedy choice: the pair with the fewest FLOPs, ties by the size it leaves."""
    best = None
    for i in range(len(terms)):
        for j in range(i + 1, len(terms)):
            both, keep = _merge(terms, i, j, out)
            key = (_size(both, sizes), _size(keep, sizes), i, j)
            if best is None or key < best[0]:
                best = (key, i, j, keep)
    return best[1], best[2], best[3]


def contraction_orders(ins, out: str, sizes, exhaustive: int = 4):
    """Orders of pairwise contractions of many operands, each a list of (i, j, kept indices) over
    the list of terms in which each step's result is appended (the last two terms then contract
    to `out`). The FLOPs-greedy order comes first; every order follows for up to `exhaustive`
    terms (18 for four); beyond that the first contractions are the greedy ones."""
    terms, prefix = list(ins), []
    while len(terms) > exhaustive:
        i, j, keep = _greedy_step(terms, out, sizes)
        prefix.append((i, j, keep))
        terms = [t for k, t in enumerate(terms) if k not in (i, j)] + [keep]

    def greedy(ts):
        seq = []
        while len(ts) > 2:
            i, j, keep = _greedy_step(ts, out, sizes)
            seq.append((i, j, keep))
            ts = [t for k, t in enumerate(ts) if k not in (i, j)] + [keep]
        return seq

    def every(ts):
        if len(ts) <= 2:
            yield []
            return
        for i in range(len(ts)):
            for j in range(i + 1, len(ts)):
                _, keep = _merge(ts, i, j, out)
                for rest in every([t for k, t in enumerate(ts) if k not in (i, j)] + [keep]):
                    yield [(i, j, keep)] + rest

    first = greedy(terms)
    yield prefix + first
    for seq in every(terms):
        if seq != first:
            yield prefix + seq


def order_flops(ins, out: str, sizes, seq) -> int:
    """FLOPs of contracting in the order `seq` (two per multiply-add)."""
    terms, n = list(ins), 0
    for i, j, keep in seq:
        both, _ = _merge(terms, i, j, out)
        n += 2 * _size(both, sizes)
        terms = [t for k, t in enumerate(terms) if k not in (i, j)] + [keep]
    if len(terms) == 2:
        n += 2 * _size(terms[0] + "".join(c for c in terms[1] if c not in terms[0]), sizes)
    return n


def _einsum_flops(operands, results, attrs) -> int:
    """One multiply-add (2 flops) per point of the index space; a one-operand einsum only adds;
    three or more operands count the FLOPs-greedy order of pairwise contractions."""
    ins, out = parse_einsum(attrs["spec"], [t.rank for t in operands])
    sizes = {c: n for letters, t in zip(ins, operands) for c, n in zip(letters, t.shape)}
    if len(operands) > 2:
        return order_flops(ins, out, sizes, next(contraction_orders(ins, out, sizes, exhaustive=2)))
    n = 2 if len(operands) > 1 else 1
    for s in sizes.values():
        n *= s
    return n


def chain_order(spec: str, types: tuple[TensorType, ...], layouts: tuple[Sharding, ...], target: Sharding,
                mesh) -> tuple[list[tuple[int, int, str]], tuple[Sharding, ...]]:
    """The order in which to contract a many-operand einsum two at a time, and the layout of each
    intermediate: every candidate order (contraction_orders: all of them for up to four operands,
    a greedy prefix beyond; orders making the same contractions once) is written out as a small
    global program of pairwise einsums, over operands in `layouts` to a result in `target`, and
    planned as any program is (propagation, then the partitioner with its consumer-layout second
    plan), and a second time with each intermediate split as its indices are in the result's and
    the operands' layouts where propagation planned it otherwise; the plan with the lowest
    modelled step time wins (partition.spmd.step_time: collectives and local work), ties to fewer
    FLOPs, then to the FLOPs-greedy order. So the choice sees what partitioning will make of each
    order, a plan that gathers an input before a step rather than its result after included. The
    steps are then replayed from the intermediates' planned layouts alone, so the plans weighed
    leave out combined settlements (which such a replay cannot make). An operand that arrives
    with a pending sum is planned as if settled. Orders whose FLOPs spread evenly over the
    devices already take longer than the best plan are not planned. Pure; memoised on its
    (hashable) arguments, as the partitioner plans a program more than once (and autoshard many
    variants): at most 15 orders of the last four operands, two small programs each, and no
    per-device work."""
    return _chain_order(spec, types, tuple(Sharding(s.dims) for s in layouts), Sharding(target.dims), mesh)


def _tree(n: int, seq) -> frozenset:
    """The contraction tree of an order: the operand sets its steps contract (orders that differ
    only in which of two independent contractions comes first share it)."""
    terms, steps = [frozenset([i]) for i in range(n)], set()
    for i, j, _ in seq:
        steps.add(terms[i] | terms[j])
        terms = [t for k, t in enumerate(terms) if k not in (i, j)] + [terms[i] | terms[j]]
    return frozenset(steps)


@lru_cache(maxsize=1024)
def _chain_order(spec, types, layouts, target, mesh):
    from ..ir.core import Op, Param, Program, Result, Value, freeze
    from ..partition.cost import compute_time_us
    from ..partition.propagate import propagate
    from ..partition.spmd import partition, step_time

    ins, out = parse_einsum(spec, [t.rank for t in types])
    sizes = {c: n for letters, t in zip(ins, types) for c, n in zip(letters, t.shape)}
    # the other plan of each order: an intermediate split as its indices are in the result's
    # layout and the operands' (the result's first), where propagation planned it otherwise
    axes_of: dict[str, tuple[str, ...]] = {}
    used: set[str] = set()
    for letters, s in [(out, target)] + list(zip(ins, layouts)):
        for c, axes in zip(letters, s.dims):
            if axes and c not in axes_of and not used & set(axes) and mesh.group_size(axes) <= sizes[c]:
                axes_of[c] = tuple(axes)
                used |= set(axes)
    orders, trees = [], set()
    for k, seq in enumerate(contraction_orders(ins, out, sizes)):
        if _tree(len(ins), seq) not in trees:
            trees.add(_tree(len(ins), seq))
            orders.append((order_flops(ins, out, sizes, seq), k, seq))
    best = None
    for n_flops, k, seq in sorted(orders, key=lambda o: o[:2]):
        # no plan runs faster than its FLOPs spread evenly over the devices: the rest cannot win
        if best is not None and compute_time_us(n_flops / len(mesh.devices)) > best[0][0]:
            break
        params = tuple(Param(Value(t, f"x{i}"), f"x{i}", s) for i, (t, s) in enumerate(zip(types, layouts)))
        terms = [(letters, p.value) for letters, p in zip(ins, params)]
        ops, mids = [], []
        for i, j, keep in seq + [(0, 1, None)]:
            (a, x), (b, y) = terms[i], terms[j]
            kept = out if keep is None else keep
            result = Value(TensorType(types[0].dtype, tuple(sizes[c] for c in kept)), f"t{len(ops)}")
            ops.append(Op("einsum", (x, y), (result,), freeze({"spec": f"{a},{b}->{kept}"})))
            if keep is not None:
                mids.append(result)
                terms = [t for n, t in enumerate(terms) if n not in (i, j)] + [(keep, result)]
        last = Value(ops[-1].results[0].type, "result")  # a result's annotation is a shard() constraint
        ops.append(Op("shard", ops[-1].results, (last,), freeze({"sharding": target})))
        prog = Program("chain", mesh, params, tuple(ops), (Result(last, target),))
        prop = propagate(prog)
        plans = [partition(prog, prop, settlements=False)]
        split = {m: Sharding(tuple(axes_of.get(c, ()) for c in keep)) for m, (_, _, keep) in zip(mids, seq)}
        if any(split[m].dims != prop.shardings[m].dims for m in mids):
            plans.append(partition(prog, prop, split, settlements=False))
        for v, spmd in enumerate(plans):
            key = (round(step_time(spmd), 9), n_flops, k, v)
            if best is None or key < best[0]:  # each intermediate planned as that plan planned it
                best = (key, seq, tuple(Sharding(spmd.layouts.get(m, prop.shardings[m]).dims) for m in mids))
    return best[1], best[2]


def _einsum_partition(ctx):
    """One or two operands: by the factor rule. More: two at a time, in the order and with the
    intermediate layouts chain_order finds cheapest once partitioned, each pairwise step
    partitioned by its own factor rule as in the program written pairwise (an intermediate's
    pending sum may flow into the next step, which is linear in it)."""
    op = ctx.op
    if len(op.operands) <= 2:
        return ctx.generic()
    from ..ir.core import Op, Value, freeze

    types = tuple(v.type for v in op.operands)
    ins, out = parse_einsum(op.attrs["spec"], [t.rank for t in types])
    sizes = {c: n for letters, t in zip(ins, types) for c, n in zip(letters, t.shape)}
    seq, mids = chain_order(op.attrs["spec"].replace(" ", ""), types,
                            tuple(ctx.layout(i) for i in range(len(types))), ctx.target(), ctx.mesh)
    terms = list(zip(ins, op.operands))
    for n, (i, j, keep) in enumerate(seq + [(0, 1, None)]):
        (a, x), (b, y) = terms[i], terms[j]
        if keep is None:
            result, keep, target = op.results[0], out, None
        else:
            result, target = Value(TensorType(op.result.type.dtype, tuple(sizes[c] for c in keep))), mids[n]
            terms = [t for k, t in enumerate(terms) if k not in (i, j)] + [(keep, result)]
        step = Op("einsum", (x, y), (result,), freeze({"spec": f"{a},{b}->{keep}"}), op.span)
        ctx.step(step, target)


register("einsum", doc="contraction of any number of operands over named indices (explicit output)",
         example=(("f32[8, 16]", "f32[16, 4]"), {"spec": "ij,jk->ik"}),
         infer=_einsum_infer, numpy=_einsum_numpy, flops=_einsum_flops,
         rule=lambda ops, res, attrs: einsum_rule(attrs["spec"].replace(" ", ""), [t.shape for t in ops],
                                                  res[0].shape),
         jax=_einsum_jax, jax_local=_einsum_jax_local, partition=_einsum_partition, partial=PartialMode.multilinear,
         reduce_fill=lambda dtype: 0, reduce_kind=ReduceKind.sum,
         family=Family.contract)

# ---------------------------------------------------------------------------------- conv
#
# conv is lax.conv_general_dilated in one fixed layout: x [N, spatial..., C], w [window..., C/g, F],
# result [N / b, spatial'..., F]. Attributes: strides and padding (one per spatial dim, padding may
# be negative as in lax), and, left out of the IR where they are the default, lhs_dilation and
# rhs_dilation (one per spatial dim, 1), groups (lax's feature_group_count, 1) and batch_groups
# (lax's batch_group_count, 1). With groups g, output feature f uses the input channels of group
# f // (F/g); with batch_groups b, it uses the input batch rows of group f // (F/b) (major).


def conv_output_size(n: int, window: int, stride: int, lo: int, hi: int, lhs_dilation: int = 1,
                     rhs_dilation: int = 1) -> int:
    n = (n - 1) * lhs_dilation + 1 if n else 0
    window = (window - 1) * rhs_dilation + 1
    return (n + lo + hi - window) // stride + 1


def conv_params(attrs) -> tuple[tuple[int, ...], tuple, tuple[int, ...], tuple[int, ...], int, int]:
    """(strides, padding, lhs_dilation, rhs_dilation, groups, batch_groups), defaults filled in."""
    nsp = len(attrs["strides"])
    return (tuple(attrs["strides"]), tuple(tuple(p) for p in attrs["padding"]),
            tuple(attrs.get("lhs_dilation") or (1,) * nsp), tuple(attrs.get("rhs_dilation") or (1,) * nsp),
            int(attrs.get("groups", 1)), int(attrs.get("batch_groups", 1)))


def conv_attrs(strides, padding, lhs_dilation=None, rhs_dilation=None, groups=1, batch_groups=1) -> dict:
    """The IR attributes of a conv: the optional ones only where they differ from the default."""
    nsp = len(strides)
    attrs = {"strides": tuple(strides), "padding": tuple(tuple(p) for p in padding)}
    if lhs_dilation is not None and tuple(lhs_dilation) != (1,) * nsp:
        attrs["lhs_dilation"] = tuple(lhs_dilation)
    if rhs_dilation is not None and tuple(rhs_dilation) != (1,) * nsp:
        attrs["rhs_dilation"] = tuple(rhs_dilation)
    if groups != 1:
        attrs["groups"] = int(groups)
    if batch_groups != 1:
        attrs["batch_groups"] = int(batch_groups)
    return attrs


def _conv_flops(operands, results, attrs) -> int:
    """Two flops per output element and kernel tap of its group (zeros of a dilation included)."""
    x, w = operands
    n = 2 * results[0].size
    for s in w.shape[:-1]:
        n *= s
    return n


def _positive(values, what: str) -> None:
    check(all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in values),
          f"conv: {what} must be positive integers, got {list(values)}", what)


def _conv_infer(operands, attrs):
    x, w = operands
    strides, padding, lhs, rhs, g, bg = conv_params(attrs)
    nsp = len(strides)
    check(x.rank == nsp + 2, f"conv: input {x} must be [N, spatial..., C] with {nsp} spatial dim(s)", 0)
    check(w.rank == nsp + 2, f"conv: kernel {w} must be [window..., C, F] with {nsp} window dim(s)", 1)
    check(x.dtype == w.dtype, f"conv: dtypes differ: {x} vs {w}")
    check(T.is_float(x.dtype), f"conv needs float operands, got {x}")
    check(len(padding) == len(lhs) == len(rhs) == nsp, "conv: one padding pair and dilation per spatial dim")
    _positive(strides, "strides")
    _positive(lhs, "lhs_dilation")
    _positive(rhs, "rhs_dilation")
    _positive((g, bg), "groups")
    check(g == 1 or bg == 1, f"conv: groups ({g}) and batch_groups ({bg}) cannot both exceed 1")
    n, c, f = x.shape[0], x.shape[-1], w.shape[-1]
    if g == 1:
        check(c == w.shape[-2], f"conv: input has {c} channels, kernel expects {w.shape[-2]}", 1)
    else:
        check(c % g == 0, f"conv: {c} input channels do not divide into {g} groups", 0)
        check(w.shape[-2] * g == c, f"conv: with {g} groups the kernel takes {c // g} channels per group "
              f"(input has {c}), got {w.shape[-2]}", 1)
    check(f % g == 0, f"conv: {f} output features do not divide into {g} groups", 1)
    check(n % bg == 0, f"conv: batch {n} does not divide into {bg} batch groups", 0)
    check(f % bg == 0, f"conv: {f} output features do not divide into {bg} batch groups", 1)
    out = [n // bg]
    for i in range(nsp):
        m = conv_output_size(x.shape[1 + i], w.shape[i], strides[i], *padding[i], lhs[i], rhs[i])
        check(m >= 1, f"conv: window {w.shape[i]} does not fit spatial dim {x.shape[1 + i]} "
              f"with padding {list(padding[i])}", 1)
        out.append(m)
    out.append(f)
    return TensorType(x.dtype, tuple(out))


def window_contracting(operands, out_shape, attrs) -> frozenset[int]:
    """The spatial dims along which a conv is a contraction over its window rather than a sliding
    window over its input: the kernel's window (dilated) spans at least twice the output's length.
    That is a kernel gradient, whose "kernel" is the output cotangent spanning the image and whose
    output is the small kernel; a forward conv whose window merely overhangs a small image (a
    U-Net's bottleneck, a 7x7 stride-2 stem on 8 rows) stays a sliding window with halos. Along
    such a dim GSPMD splits input and window alike: each shard correlates its window rows with
    the input rows they reach (a halo), and the result is a pending sum."""
    x, w = operands
    strides, padding, lhs, rhs, g, bg = conv_params(attrs)
    return frozenset(i for i in range(len(strides))
                     if (w.shape[i] - 1) * rhs[i] + 1 >= 2 * out_shape[1 + i] and lhs[i] == 1 and w.shape[i] > 1)


def _conv_rule(operands, results, attrs):
    """Batch passes, spatial dims are permutations (halos), window taps replicate; along a
    window-contracting dim (window_contracting) the input's spatial dim is a permutation of its
    own and the output's replicates: propagation carries no split from the image to the small
    output (a kernel gradient, then the kernel) nor onto the window (a kernel, when a forward conv
    has a kernel larger than its output), and partition_conv contracts over the window where
    input and window arrive split alike. Channels reduce;
    with groups, the group index is a pass factor leading the input channels and the kernel's and
    result's features (a group-aligned split stays local); with batch groups, it leads the input
    batch and the features."""
    x, w = operands
    _, _, _, _, g, bg = conv_params(attrs)
    nsp = len(attrs["strides"])
    b = RuleBuilder()

    def some(*fs):
        return tuple(f for f in fs if f is not None)

    def opt(size, kind=PASS):
        return b.factor(size, kind) if size > 1 else None

    if bg > 1:
        grp = b.factor(bg)
        n = opt(x.shape[0] // bg)
    else:
        grp = None
        n = b.factor(x.shape[0])
    contracting = window_contracting(operands, results[0].shape, attrs)
    spatial = [b.factor(results[0].shape[1 + i], REPLICATE if i in contracting else PERMUTATION)
               for i in range(nsp)]
    window = [b.factor(w.shape[i], REPLICATE) for i in range(nsp)]
    rows = {i: b.factor(x.shape[1 + i], PERMUTATION) for i in contracting}
    if g > 1:
        grp = b.factor(g)
        c = opt(x.shape[-1] // g, REDUCTION)
        xc = some(grp, c)
    else:
        c = b.factor(x.shape[-1], REDUCTION)
        xc = (c,)
    f = opt(w.shape[-1] // (g * bg)) if grp is not None else b.factor(w.shape[-1], PASS)
    feat = some(grp, f)
    xn = some(grp, n) if bg > 1 else (n,)
    xd = [xn] + [(rows[i] if i in contracting else spatial[i],) for i in range(nsp)] + [xc]
    wd = [(k,) for k in window] + [some(c), feat]
    od = [some(n) if bg > 1 else (n,)] + [(s,) for s in spatial] + [feat]
    return b.build([xd, wd], [od])


def _conv_localize(attrs, operands, shapes):
    """Local groups: the groups a shard holds whole (the channel and feature splits are group-aligned)."""
    x, w = operands
    out = dict(attrs)
    if attrs.get("groups", 1) != 1:
        out.pop("groups")
        if x.shape[-1] // w.shape[-2] != 1:
            out["groups"] = x.shape[-1] // w.shape[-2]
    if attrs.get("batch_groups", 1) != 1:
        out.pop("batch_groups")
        if x.shape[0] // shapes[0][0] != 1:
            out["batch_groups"] = x.shape[0] // shapes[0][0]
    return out


def conv_numpy(x, w, **attrs):
    """Direct convolution: a sum over window taps of (strided) input rows times the kernel tap (per
    group). Each tap reads only the input elements it reaches, never the padding or the zeros of
    lhs_dilation, so the cost follows the taps that touch the input: a window spread by
    rhs_dilation=10^8 over an 8-element input costs its one reaching tap, not 10^8 padded rows.
    Padding and holes still count as zeros that multiply: where a non-finite kernel tap reads one,
    the output is NaN (0 * inf), as in a split conv's halo past the image edge."""
    strides, padding, lhs, rhs, g, bg = conv_params(attrs)
    dt = x.dtype
    xw, ww = T.widen(x), T.widen(w)
    nsp = len(strides)
    out_sp = [conv_output_size(x.shape[1 + i], w.shape[i], strides[i], *padding[i], lhs[i], rhs[i])
              for i in range(nsp)]
    n, c, f = x.shape[0], x.shape[-1], w.shape[-1]
    out = np.zeros((n // bg, *out_sp, f), dtype=np.result_type(xw.dtype, ww.dtype))
    rows = [[_tap_rows(x.shape[1 + i], o, out_sp[i], strides[i], padding[i][0], lhs[i], rhs[i])
             for o in range(w.shape[i])] for i in range(nsp)]
    for offset in np.ndindex(*w.shape[:nsp]):
        hit = [rows[i][o] for i, o in enumerate(offset)]
        if any(h is None for h in hit):
            continue  # this tap lands in padding (or between dilated elements) for every output
        if all(isinstance(m, slice) for m, _ in hit):
            dst, src = tuple(m for m, _ in hit), tuple(q for _, q in hit)
        else:
            dst = np.ix_(*[np.arange(out_sp[i])[m] if isinstance(m, slice) else m for i, (m, _) in enumerate(hit)])
            src = np.ix_(*[np.arange(x.shape[1 + i])[q] if isinstance(q, slice) else q
                           for i, (_, q) in enumerate(hit)])
        patch = xw[(slice(None),) + src + (slice(None),)]
        tap = ww[offset]
        target = (out.shape[0], *patch.shape[1:-1], f)
        if g > 1:
            p = patch.reshape(*patch.shape[:-1], g, c // g)
            part = np.einsum("...gc,cgf->...gf", p, tap.reshape(c // g, g, f // g)).reshape(target)
        elif bg > 1:
            p = patch.reshape(bg, n // bg, *patch.shape[1:])
            part = np.einsum("bn...c,cbf->n...bf", p, tap.reshape(c, bg, f // bg)).reshape(target)
        else:
            part = np.tensordot(patch, tap, axes=([patch.ndim - 1], [0]))
        out[(slice(None),) + dst + (slice(None),)] += part
    if out.dtype.kind == "f" and not np.isfinite(ww).all():
        # padding and lhs_dilation holes are zeros that multiply the kernel, as in XLA: where a
        # tap with an inf or NaN (in the channels output feature f reads) reads one, f is NaN
        for offset in np.ndindex(*w.shape[:nsp]):
            cols = ~np.isfinite(ww[offset]).all(axis=0)
            if not cols.any():
                continue
            reads = np.ones(tuple(out_sp), bool)
            for i, o in enumerate(offset):
                dim = np.zeros(out_sp[i], bool)
                if rows[i][o] is not None:
                    dim[rows[i][o][0]] = True
                reads &= dim.reshape([out_sp[i] if k == i else 1 for k in range(nsp)])
            out[:, (~reads)[..., None] & cols] = np.nan
    return out.astype(dt)


def _tap_rows(n: int, o: int, n_out: int, stride: int, lo: int, lhs: int, rhs: int):
    """Tap o of one spatial dim: (the outputs whose window reads an input element at this tap,
    those elements) as two slices (or index arrays under lhs_dilation), or None when it reads
    none. Output m reads the dilated input at q = o*rhs + m*stride - lo: an element where
    0 <= q <= (n-1)*lhs and lhs divides q. Python integers: o*rhs may pass 2^63."""
    base = o * rhs - lo
    if n == 0 or n_out == 0:
        return None
    m0 = max(0, -(base // stride))  # the first m with base + m*stride >= 0
    m1 = min(n_out - 1, ((n - 1) * lhs - base) // stride)  # the last with q <= (n-1)*lhs
    if m0 > m1:
        return None
    q0 = base + m0 * stride
    if lhs == 1:
        return slice(m0, m1 + 1), slice(q0, q0 + (m1 - m0) * stride + 1, stride)
    m = np.arange(m0, m1 + 1, dtype=np.int64)
    q = q0 + (m - m0) * stride
    keep = q % lhs == 0
    if not keep.any():
        return None
    return m[keep], q[keep] // lhs


_CONV_DIMS = {1: ("NWC", "WIO", "NWC"), 2: ("NHWC", "HWIO", "NHWC"), 3: ("NDHWC", "DHWIO", "NDHWC")}


def _conv_jax(args, attrs, out):
    strides, padding, lhs, rhs, g, bg = conv_params(attrs)
    nsp = len(strides)
    check(nsp in _CONV_DIMS, f"conv: jax emission supports 1 to 3 spatial dims, got {nsp}")
    extra = ""
    if lhs != (1,) * nsp:
        extra += f", lhs_dilation={lhs}"
    if rhs != (1,) * nsp:
        extra += f", rhs_dilation={rhs}"
    if g != 1:
        extra += f", feature_group_count={g}"
    if bg != 1:
        extra += f", batch_group_count={bg}"
    pad = [tuple(p) for p in padding]
    return (f"jax.lax.conv_general_dilated({args[0]}, {args[1]}, window_strides={strides}, "
            f"padding={pad}{extra}, dimension_numbers={_CONV_DIMS[nsp]})")


def _reads_padding(padding, lhs) -> bool:
    """Whether a conv's windows may read padding or lhs_dilation holes (negative padding crops)."""
    return any(lo > 0 or hi > 0 for lo, hi in padding) or any(d > 1 for d in lhs)


def _padding_in_memory(out_shape, strides, padding, lhs) -> bool:
    """Whether a conv's padding and lhs_dilation holes are few enough to build in memory: padding
    of at most the output's extent (times the stride) plus 64 along each spatial dim, and at most
    8 input elements' room per element from the holes (a 2x upsampling in 3-D). A window spread
    far past the input (rhs_dilation=10^8 over 8 rows with SAME padding) would materialize mostly
    padding."""
    room = 1
    for d in lhs:
        room *= d
    return room <= 8 and all(max(lo, 0) + max(hi, 0) <= m * s + 64
                             for m, s, (lo, hi) in zip(out_shape[1:-1], strides, padding))


def _conv_jax_local(args, attrs, out):
    """A conv in our per-partition module, as ref and sim compute it: padding and lhs_dilation holes
    are zeros that multiply the kernel (0 * inf is NaN), as the zeros a split conv's halo brings
    past the image edge do. XLA's CPU convolutions skip those taps in some forms and not in others
    (docs/known_xla_issues.md, 10), and fold a constant-zero lax.pad into the conv's padding, so
    the input is padded and dilated in memory (lax.pad, interior padding for the holes) with a zero
    XLA cannot see through (an optimization_barrier): the conv then multiplies every tap, one
    kernel (the pad fuses into its producer, often a halo's concatenate) where a correction costs a
    second conv. Where that padding would be large (a window spread far past the input:
    _padding_in_memory) nothing is materialized: the outputs where a non-finite tap reads padding
    or a hole are set to NaN instead (_nan_where_taps_miss: static masks, elementwise). Batch
    groups run as one conv per group, concatenated along the features: XLA's batch_group_count
    with rhs_dilation spreads a NaN or inf of one group's kernel over every group's output."""
    strides, padding, lhs, rhs, g, bg = conv_params(attrs)
    nsp = len(strides)
    x, w = args
    pad_x = None
    if _reads_padding(padding, lhs) and _padding_in_memory(out[0].shape, strides, padding, lhs):
        spec = [(0, 0, 0)] + [(lo, hi, d - 1) for (lo, hi), d in zip(padding, lhs)] + [(0, 0, 0)]
        padding, lhs = ((0, 0),) * nsp, (1,) * nsp
        if nsp == 2:
            # XLA's CPU can run a 2-D conv without any padding several times slower than one with
            # some ([8, 64, 64, 32] by 3x3x32x32: 30 ms against 7): one more zero row, cropped
            spec[1] = (spec[1][0] + 1, spec[1][1], spec[1][2])
            padding = ((-1, 0), (0, 0))
        pad_x = f"jax.lax.pad({x}, jax.lax.optimization_barrier(jnp.zeros((), {x}.dtype)), {spec})"
        attrs = conv_attrs(strides, padding, lhs, rhs, g, bg)
    if bg > 1:
        xb = "_x" if pad_x else x
        n, f = out[0].shape[0], out[0].shape[-1] // bg
        xs, ws = f"{xb}[_b * {n}:(_b + 1) * {n}]", f"{w}[..., _b * {f}:(_b + 1) * {f}]"
        conv = _conv_jax([xs, ws], conv_attrs(strides, padding, lhs, rhs, g), out)
        conv = f"jnp.concatenate([{conv} for _b in range({bg})], axis=-1)"
        if pad_x:
            return f"(lambda _x: {conv})({pad_x})"
    else:
        conv = _conv_jax([pad_x or x, w], attrs, out)
    if pad_x or not _reads_padding(padding, lhs):
        return conv
    return _nan_where_taps_miss(conv, x, w, out, strides, padding, lhs, rhs)


def _nan_where_taps_miss(conv, x, w, out, strides, padding, lhs, rhs):
    """`conv` with NaN where a non-finite kernel tap reads padding or a hole. Whether tap o of
    spatial dim d reads an input element at output p is a static [out_d, k_d] mask (numpy at trace
    time), and a tap reads the input where it does so on every dim: so an output is NaN where, on
    some dim d, a tap position that misses there holds a non-finite tap of the feature (_i, any over
    the other dims' taps). Elementwise: no second conv, nothing the size of the window spread over
    the input."""
    nsp = len(strides)
    nans = []
    for d in range(nsp):
        if padding[d][0] <= 0 and padding[d][1] <= 0 and lhs[d] == 1:
            continue  # every tap reads the input on this dim
        others = tuple(j for j in range(nsp) if j != d)
        q = f"np.arange({w}.shape[{d}])[None, :] * {rhs[d]} + np.arange({out[0].shape[1 + d]})[:, None] * " \
            f"{strides[d]} - {padding[d][0]}"
        reads = f"(_q >= 0) & (_q <= ({x}.shape[{1 + d}] - 1) * {lhs[d]})"
        if lhs[d] > 1:
            reads += f" & (_q % {lhs[d]} == 0)"
        miss = f"jnp.asarray(~(lambda _q: {reads})({q}))"
        taps = f"_i.any(axis={others})" if others else "_i"
        shape = tuple(out[0].shape[1 + d] if j == d else 1 for j in range(nsp))
        nans.append(f"({miss}[:, :, None] & {taps}[None]).any(axis=1).reshape((1,) + {shape} + (-1,))")
    return f"(lambda _c, _i: jnp.where({' | '.join(nans)}, jnp.nan, _c))({conv}, (~jnp.isfinite({w})).any(axis=-2))"


def _conv_window(n_out: int, k: int, stride: int, lo: int, window: int, lhs: int, rhs: int):
    """How output shards of a conv along one split spatial dim get their input: (Window, dilated,
    local lhs_dilation, local padding). Output shard i (c_out outputs) reads the dilated, padded
    input at [i*c_out*stride - lo, + span), span = (c_out - 1)*stride + (window - 1)*rhs + 1.
    Where c_out*stride is a multiple of lhs (always without lhs_dilation) every shard's window
    starts at the same phase of the dilation: it fetches just the input elements in its span (an
    affine window of the undilated input) and convolves them dilated, padded by the phase. Else
    (transposed conv, uneven shards) the phase differs per shard: the input is dilated locally
    first and the window is cut from the dilated input (`dilated`), then convolved undilated."""
    c_out = chunk(n_out, k)
    span = (c_out - 1) * stride + (window - 1) * rhs + 1
    if (c_out * stride) % lhs == 0:
        first = -(lo // lhs)  # ceil(-lo / lhs): the first input element at or after the span's start
        phase = first * lhs + lo
        length = (span - 1 - lo) // lhs - first + 1
        if length >= 1:
            hi = span - phase - (length - 1) * lhs - 1
            return Window(a=c_out * stride // lhs, s=first, length=length, fill=0.0), False, lhs, (phase, hi)
    return Window(a=c_out * stride, s=-lo, length=span, fill=0.0), True, 1, (0, 0)


def _dilate_dim(ctx, x, d: int, m: int):
    """x with m - 1 zeros after every element along dim d (size c -> c*m)."""
    shape = x.type.shape
    y = ctx.emit("reshape", x, shape=shape[:d + 1] + (1,) + shape[d + 1:])
    y = ctx.pad_dim(y, d + 1, 0, m - 1, 0.0)
    return ctx.emit("reshape", y, shape=shape[:d] + (shape[d] * m,) + shape[d + 1:])


def partition_conv(ctx):
    """Spatially split conv: each shard exchanges only the halo rows its windows reach (zeros past
    the image edges, as SAME/explicit padding; window extents count rhs_dilation and strides), then
    convolves locally with no padding on those dims (lhs_dilation: see _conv_window). Batch and
    output-feature splits stay local; so do feature groups split over axes that hold whole groups
    (the local conv runs groups/k of them); other channel splits are gathered. Output features
    split where the groups are not aligned are computed whole and sliced by the consumer. A conv
    whose output is not split spatially but whose window-contracting dims arrive split (a kernel
    gradient) contracts over the window instead (_window_contraction)."""
    x, w = ctx.op.operands
    out = ctx.target()
    strides, padding, lhs, rhs, groups, batch_groups = conv_params(ctx.attrs)
    nsp = len(strides)
    split = [i for i in range(nsp) if out.dims[1 + i]]
    if not split and _window_contraction(ctx):
        return None
    if not split or batch_groups != 1 or ctx.layout(0).partial or ctx.layout(1).partial:
        return ctx.generic()
    feat = out.dims[-1]
    kf = ctx.mesh.group_size(feat) if feat else 1
    aligned = groups == 1 or groups % kf == 0
    if not aligned:
        feat = ()
    cur = ctx.layout(0)
    xdims = [out.dims[0]]
    for i in range(nsp):
        a = out.dims[1 + i]
        xdims.append(a if a and cur.dims[1 + i] == a else ())
    xdims.append(feat if groups > 1 else ())
    wdims = [()] * (nsp + 1) + [feat]
    res = Sharding(tuple(out.dims[:-1]) + (feat,))
    n_out = ctx.op.result.type.shape
    plans, windows, scale = {}, [], {}
    for i in split:
        k = ctx.mesh.group_size(out.dims[1 + i])
        win, dilated, dl, pads = _conv_window(n_out[1 + i], k, strides[i], padding[i][0], w.type.shape[i],
                                              lhs[i], rhs[i])
        n_in = x.type.shape[1 + i] * (lhs[i] if dilated else 1)
        if win.length > 2 * n_in + 1024:
            # a window spread far past the input (rhs_dilation=10^8 on 8 rows): each shard's window
            # would be mostly zeros of padding, materialized; the whole input is smaller
            return ctx.generic()
        plans[i] = (win, dilated, dl, pads)
        windows.append((1 + i, win))
        if dilated:
            scale[1 + i] = lhs[i]
    # gathering the spatial dims instead would run each device's conv over the whole image
    local_out = list(res.local_shape(n_out, ctx.mesh))
    whole = [n_out[d] if d in [1 + i for i in split] else m for d, m in enumerate(local_out)]
    per_point = 2
    for m in w.type.shape[:-1]:
        per_point *= m
    replicated = per_point * (prod(whole) - prod(local_out)) // max(1, local_out[-1]) * local_out[-1]
    if not _worth_it(ctx, 0, tuple(xdims), windows, replicated, scale):
        return ctx.generic()
    xl = ctx.reshard(0, Sharding(tuple(xdims)))
    wl = ctx.reshard(1, Sharding(tuple(wdims)))
    pads, lhs_local = list(padding), list(lhs)
    for i in split:
        win, dilated, dl, pad = plans[i]
        d = 1 + i
        n = x.type.shape[d]
        if dilated:
            xl = _dilate_dim(ctx, xl, d, lhs[i])
            n *= lhs[i]
        xl = ctx.window(xl, d, xdims[d], out.dims[d], n, win, first=i == split[0])
        pads[i], lhs_local[i] = pad, dl
    g_local = groups // kf if groups > 1 and feat else groups
    attrs = conv_attrs(strides, pads, lhs_local, rhs, g_local)
    ctx.set_result(ctx.emit("conv", xl, wl, **attrs), res)


def _window_contraction(ctx) -> bool:
    """A conv split along window-contracting dims (window_contracting; a kernel gradient with the
    image split): input and window split alike over the same axes, each shard correlates its window
    rows with the input rows they reach (its own plus a halo of (output - 1) * stride rows from the
    next shards, or fewer where dilated), and the result owes a sum over those axes (and over the
    channel split, as the contraction it is). Emits it and returns True where the cost model ranks
    it below the generic plan (which gathers the split dims)."""
    x, w = ctx.op.operands
    out = ctx.target()
    strides, padding, lhs, rhs, groups, batch_groups = conv_params(ctx.attrs)
    nsp = len(strides)
    if groups != 1 or batch_groups != 1 or ctx.layout(0).partial or ctx.layout(1).partial:
        return False
    n_out = ctx.op.result.type.shape
    contracting = window_contracting([x.type, w.type], n_out, ctx.attrs)
    lx, lw = ctx.layout(0), ctx.layout(1)
    axes = {}
    for i in sorted(contracting):
        a = lw.dims[i] or lx.dims[1 + i]
        if a:
            axes[i] = a
    if not axes:
        return False
    chan = lx.dims[-1] if lx.dims[-1] == lw.dims[-2] else ()
    batch, feat = out.dims[0], out.dims[-1]
    used = [a for i in axes for a in axes[i]] + list(chan)
    if len(set(used)) != len(used) or set(used) & (set(batch) | set(feat)) or set(batch) & set(feat):
        return False
    xdims = (batch,) + tuple(axes.get(i, ()) for i in range(nsp)) + (chan,)
    wdims = tuple(axes.get(i, ()) for i in range(nsp)) + (chan, feat)
    partial = ctx.mesh.order(set(used))
    res = Sharding((batch,) + ((),) * nsp + (feat,), partial)
    windows = {}
    for i, a in axes.items():
        k = ctx.mesh.group_size(a)
        c_t = chunk(w.type.shape[i], k)
        span = (c_t - 1) * rhs[i] + (n_out[1 + i] - 1) * strides[i] + 1
        windows[i] = Window(a=c_t * rhs[i], s=-padding[i][0], length=span, fill=0.0)
    # cost: the halos, the kernel's reshard and settling the pending sum, against the generic plan
    from ..partition.cost import FLOPS_PER_BYTE, comm_cost
    from ..partition.reshard import plan_reshard
    from .moving import _costs, _itemsize

    cost, _ = _costs(ctx, 0, xdims, [(1 + i, win) for i, win in windows.items()])
    cost += comm_cost(plan_reshard(w.type.shape, _itemsize(w), ctx.mesh, lw, Sharding(wdims)))
    r = ctx.op.result
    cost += comm_cost(plan_reshard(r.type.shape, _itemsize(r), ctx.mesh, res, out))
    xl_shape = list(Sharding(xdims).local_shape(x.type.shape, ctx.mesh))
    for i, win in windows.items():
        xl_shape[1 + i] = win.length
    wl_type = w.type.with_shape(Sharding(wdims).local_shape(w.type.shape, ctx.mesh))
    out_type = r.type.with_shape(res.local_shape(r.type.shape, ctx.mesh))
    work = _conv_flops([x.type.with_shape(tuple(xl_shape)), wl_type], [out_type], ctx.attrs) + out_type.size
    cost += work / FLOPS_PER_BYTE
    generic, _ = ctx.trial(ctx.op, out, {})
    if cost > generic:
        return False
    xl = ctx.reshard(0, Sharding(xdims))
    wl = ctx.reshard(1, Sharding(wdims))
    # the padding of uneven window shards must add nothing
    for i, a in axes.items():
        wl = ctx.mask(wl, i, a, w.type.shape[i], 0.0)
    if chan:
        wl = ctx.mask(wl, nsp, chan, w.type.shape[nsp], 0.0)
        xl = ctx.mask(xl, 1 + nsp, chan, x.type.shape[-1], 0.0)
    pads = list(padding)
    for i, win in windows.items():
        xl = ctx.window(xl, 1 + i, axes[i], axes[i], x.type.shape[1 + i], win, first=i == next(iter(windows)))
        pads[i] = (0, 0)
    attrs = conv_attrs(strides, pads, lhs, rhs)
    ctx.set_result(ctx.emit("conv", xl, wl, **attrs), res)
    return True


register("conv", doc="lax.conv_general_dilated: [N, spatial..., C] x [window..., C/groups, F] -> [N, spatial..., F]",
         example=(("f32[2, 8, 8, 3]", "f32[3, 3, 3, 5]"), {"strides": (1, 1), "padding": ((1, 1), (1, 1))}),
         infer=_conv_infer, numpy=conv_numpy, rule=_conv_rule, jax=_conv_jax, jax_local=_conv_jax_local,
         partition=partition_conv,
         flops=_conv_flops, localize=_conv_localize,
         partial=PartialMode.multilinear, reduce_fill=lambda dtype: 0, reduce_kind=ReduceKind.sum,
         family=Family.contract)



# ---------------------------------------------------------------------------------- derivatives


def _einsum_vjp(d, op, ct):
    """Operand i's cotangent is an einsum of the result cotangent with the other operands, onto
    operand i's indices; indices that only operand i has (summed away alone) are broadcast back."""
    ins, out = parse_einsum(op.attrs["spec"], [v.type.rank for v in op.operands])
    if not T.is_float(op.result.type.dtype):
        return (None,) * len(op.operands)
    cts = []
    for i, v in enumerate(op.operands):
        others = [(ins[j], op.operands[j]) for j in range(len(ins)) if j != i]
        seen = set(out) | {c for letters, _ in others for c in letters}
        mine = "".join(c for c in ins[i] if c in seen)
        spec = ",".join([out] + [letters for letters, _ in others]) + "->" + mine
        g = d.emit("einsum", ct, *[w for _, w in others], spec=spec)
        if mine != ins[i]:
            g = d.emit("broadcast_in_dim", g, shape=v.type.shape, dims=tuple(ins[i].index(c) for c in mine))
        cts.append(g)
    return tuple(cts)


set_vjp("einsum", _einsum_vjp)


def _flip(d, w, dim: int):
    """w reversed along `dim` (a take at n-1, n-2, ..., 0)."""
    n = w.type.shape[dim]
    ids = d.emit("sub", d.const(n - 1, "i32"), d.emit("iota", dtype="i32", shape=(n,), axis=0))
    return d.emit("take", w, ids, axis=dim)


def _conv_vjp(d, op, ct):
    """jax's conv transposes for stride-1 convs: for x a full correlation with the flipped kernel
    (in and out channels swapped), for w a correlation of the padded input with the cotangent over
    the batch (batch and channels swapped). Strides, dilations, groups and batch groups go to
    _conv_vjp_general (jax's rules with the general conv: the strides become the cotangent's
    lhs_dilation and the kernel gradient's rhs_dilation, which partition as halos, where
    interleaving zeros by pad and reshape would gather a split cotangent)."""
    x, w = op.operands
    strides, padding, lhs, rhs, groups, batch_groups = conv_params(op.attrs)
    nsp = len(strides)
    if lhs != (1,) * nsp or rhs != (1,) * nsp or groups != 1 or batch_groups != 1 or strides != (1,) * nsp:
        return _conv_vjp_general(d, op, ct)
    sp = range(1, nsp + 1)
    win = w.type.shape[:nsp]
    ctd = ct
    dil = ctd.type.shape[1:1 + nsp]
    ones = (1,) * nsp
    # d x: correlate the dilated cotangent, padded by window - 1 (and whatever the forward's
    # padded input had beyond the last window), with the flipped, channel-swapped kernel
    wf = w
    for i in range(nsp):
        if win[i] > 1:
            wf = _flip(d, wf, i)
    wf = d.emit("transpose", wf, perm=tuple(range(nsp)) + (nsp + 1, nsp))
    full = [x.type.shape[1 + i] + padding[i][0] + padding[i][1] for i in range(nsp)]
    pads = tuple((win[i] - 1, win[i] - 1 + full[i] - (dil[i] + win[i] - 1)) for i in range(nsp))
    cropped = tuple((lo - p[0], hi - p[1]) for (lo, hi), p in zip(pads, padding))
    if all(lo >= 0 and hi >= 0 for lo, hi in cropped):
        # the forward's padding taken off the transposed conv's: just the rows x has, no slice
        # after it (a slice of a split dim would shift every shard's rows by a permute)
        cx = d.emit("conv", ctd, wf, strides=ones, padding=cropped)
    else:
        dxp = d.emit("conv", ctd, wf, strides=ones, padding=pads)
        cx = d.emit("slice", dxp, starts=(0,) + tuple(p[0] for p in padding) + (0,),
                    stops=(x.type.shape[0],) + tuple(p[0] + x.type.shape[1 + i] for i, p in enumerate(padding))
                    + (x.type.shape[-1],), steps=(1,) * (nsp + 2))
    # d w: batch and channels swapped, the dilated cotangent as the kernel
    rank = nsp + 2
    xt = d.emit("transpose", x, perm=(rank - 1,) + tuple(sp) + (0,))
    ctt = d.emit("transpose", ctd, perm=tuple(sp) + (0, rank - 1))
    dw = d.emit("conv", xt, ctt, strides=ones, padding=tuple(tuple(p) for p in padding))
    if dw.type.shape[1:1 + nsp] != tuple(win):
        dw = d.emit("slice", dw, starts=(0,) * rank, stops=(dw.type.shape[0],) + tuple(win) + (dw.type.shape[-1],),
                    steps=(1,) * rank)
    cw = d.emit("transpose", dw, perm=tuple(sp) + (0, rank - 1))
    return cx, cw


def _dilated(n: int, k: int) -> int:
    return (n - 1) * k + 1 if n else 0


def _conv_vjp_general(d, op, ct):
    """jax's transpose rules (_conv_general_dilated_transpose_lhs / _rhs) with the general conv:
    for x, the cotangent dilated by the strides (lhs_dilation) and correlated with the flipped kernel,
    the groups moved from its output features into its input channels, at stride lhs_dilation;
    for w, the input (batch and channels swapped) correlated with the cotangent as the kernel at
    stride rhs_dilation and rhs_dilation the forward's strides, groups becoming batch groups and
    batch groups becoming groups."""
    x, w = op.operands
    strides, padding, lhs, rhs, groups, batch_groups = conv_params(op.attrs)
    nsp = len(strides)
    rank = nsp + 2
    sp = tuple(range(1, nsp + 1))
    win = w.type.shape[:nsp]
    cin, f = w.type.shape[nsp], w.type.shape[nsp + 1]
    xin = x.type.shape[1:1 + nsp]
    out = ct.type.shape[1:1 + nsp]
    lhs_d = [_dilated(xin[i], lhs[i]) for i in range(nsp)]
    rhs_d = [_dilated(win[i], rhs[i]) for i in range(nsp)]
    out_d = [_dilated(out[i], strides[i]) for i in range(nsp)]
    # d x
    g = max(groups, batch_groups)
    wf = w
    for i in range(nsp):
        if win[i] > 1:
            wf = _flip(d, wf, i)
    # [win, cin, g, f/g] -> [win, f/g, g, cin] -> [win, f/g, g * cin]: groups major in the channels
    wf = d.emit("reshape", wf, shape=tuple(win) + (cin, g, f // g))
    wf = d.emit("transpose", wf, perm=tuple(range(nsp)) + (nsp + 2, nsp + 1, nsp))
    wf = d.emit("reshape", wf, shape=tuple(win) + (f // g, g * cin))
    pb = [rhs_d[i] - padding[i][0] - 1 for i in range(nsp)]
    pads = tuple((pb[i], lhs_d[i] + rhs_d[i] - 1 - out_d[i] - pb[i]) for i in range(nsp))
    cx = d.emit("conv", ct, wf, **conv_attrs(lhs, pads, strides, rhs, groups=g))
    if batch_groups > 1:
        # [n/b, sp, b * c] -> [b, n/b, sp, c] -> [n, sp, c]
        n_b, c = ct.type.shape[0], x.type.shape[-1]
        cx = d.emit("reshape", cx, shape=(n_b,) + tuple(xin) + (batch_groups, c))
        cx = d.emit("transpose", cx, perm=(rank - 1,) + tuple(range(rank - 1)) + (rank,))
        cx = d.emit("reshape", cx, shape=x.type.shape)
    # d w: x as [C, sp, N], the cotangent as the kernel [sp, N, F], result [cin, win, F]
    xt = d.emit("transpose", x, perm=(rank - 1,) + sp + (0,))
    ctt = d.emit("transpose", ct, perm=sp + (0, rank - 1))
    padw = tuple((padding[i][0], out_d[i] - lhs_d[i] + rhs_d[i] - padding[i][0] - 1) for i in range(nsp))
    dw = d.emit("conv", xt, ctt, **conv_attrs(rhs, padw, lhs, strides, groups=batch_groups,
                                              batch_groups=groups))
    cw = d.emit("transpose", dw, perm=sp + (0, rank - 1))
    return cx, cw


set_vjp("conv", _conv_vjp)
