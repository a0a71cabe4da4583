"""A unit's strategies: the layouts a parameter can take, and the ways the partitioner could run
an op (partition.strategies: its factor-split validity check and its local-work formula, shared).

  parameter   every layout of it (each mesh axis on at most one dim, each dim split evenly or
              nearly so, see `splits`); an annotated parameter has exactly its annotation
  op          every assignment of mesh axes to the factors of its FactorRule that the partitioner
              could run (pass factors, and reduction factors of ops with a reduce kind: the
              result is then `partial`), each factor split evenly or nearly so (`splits`), and
              evenly where a reshape merges it with others; a shard() constraint keeps only
              those that agree with its spec

A dim that does not divide by its shards is split all the same (the last shard padded, as the
partitioner runs it): a batch of 4,098 over 4 devices is data parallel as 4,096 is, where
splitting only even dims would leave it replicated. The local work of each candidate counts the
padded shard, so a split that wastes much loses to one that does not.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from ..ir import registry
from ..ir.mesh import Mesh, Sharding
from ..partition.cost import FLOPS_PER_BYTE
from ..partition.factors import PASS, REDUCTION, FactorRule, project, unproject
from ..partition.strategies import local_work, valid

MAX_STRATEGIES = 32  # per unit: the replicated one and the most sharded


@dataclass(frozen=True)
class View:
    """One unit under one strategy of its group."""

    reqs: tuple[Sharding, ...]  # the layout wanted for each operand
    outs: tuple[Sharding, ...]  # each result's layout (pending sums included)
    work: float  # local work, in the planner's unit





def splits(n: int, k: int) -> bool:
    """Whether a dim of n elements may be split into k shards: evenly, or with at most an eighth
    of n in padding (the last shard's; then every shard holds some of it). Splits that waste more
    (3 over 2) would rarely win and make the search larger."""
    return n % k == 0 or 8 * (k * -(-n // k) - n) <= n


def _axis_assignments(nfactors: int, ok, axes: list[str], mesh: Mesh, sizes, merged=frozenset()):
    """Every map factor -> axes (mesh order) with each axis on at most one allowed factor and
    every factor split evenly or nearly so (`splits`), evenly for the `merged`
    factors (those a reshape merges with others into one dim: an uneven block of one is no block
    of the merged dim)."""
    out = []
    for combo in itertools.product(range(-1, nfactors), repeat=len(axes)):
        fa: dict[int, tuple[str, ...]] = {}
        good = True
        for a, f in zip(axes, combo):
            if f < 0:
                continue
            if not ok(f):
                good = False
                break
            fa[f] = fa.get(f, ()) + (a,)
        if not good:
            continue
        if all(sizes[f] % mesh.group_size(ax) == 0 if f in merged else splits(sizes[f], mesh.group_size(ax))
               for f, ax in fa.items()):
            out.append(fa)
    return out


def _merged(rule: FactorRule) -> frozenset[int]:
    """The factors some tensor's dim holds with others (a reshape's merged or split dims)."""
    return frozenset(f for t in rule.tensors for fs in t if len(fs) > 1 for f in fs)


def op_view(op, rule: FactorRule, fa, mesh: Mesh) -> View:
    opdef = registry.get(op.kind)
    reduced = mesh.order(a for f, axes in fa.items() if rule.kinds[f] == REDUCTION for a in axes)
    red_op = opdef.reduce_kind or "sum"
    reqs = tuple(Sharding(unproject(rule.operands[i], fa, rule.sizes, mesh)) for i in range(len(op.operands)))
    outs = tuple(Sharding(unproject(rule.results[j], fa, rule.sizes, mesh), reduced, frozenset(),
                          red_op if reduced else "sum") for j in range(len(op.results)))
    return View(reqs, outs, local_work(op, reqs, outs, mesh) / FLOPS_PER_BYTE)


def op_views(op, rule: FactorRule, mesh: Mesh) -> list[View]:
    """The strategies of one op, the most sharded first (ties in enumeration order)."""
    opdef = registry.get(op.kind)
    axes = [a for a in mesh.names if mesh.axis_size(a) > 1]

    def ok(f):
        kind = rule.kinds[f]
        return kind == PASS or (kind == REDUCTION and opdef.reduce_kind is not None)

    if opdef.constraint:
        spec: Sharding = op.attrs["sharding"]
        cands = []
        for fa in _axis_assignments(len(rule.sizes), ok, axes, mesh, rule.sizes, _merged(rule)):
            if not valid(rule, fa, mesh):
                continue
            dims = unproject(rule.results[0], fa, rule.sizes, mesh)
            if all(d == w if i not in spec.open_dims else d[: len(w)] == w
                   for i, (d, w) in enumerate(zip(dims, spec.dims))):
                cands.append(op_view(op, rule, fa, mesh))
        fixed = Sharding(spec.dims)
        if not any(v.outs[0] == fixed for v in cands):  # uneven or unusual: exactly as written
            work = op.result.type.size / FLOPS_PER_BYTE
            cands.insert(0, View((fixed,), (fixed,), work))
        return cands[:MAX_STRATEGIES]
    views, seen = [], {}
    for fa in _axis_assignments(len(rule.sizes), ok, axes, mesh, rule.sizes, _merged(rule)):
        if not valid(rule, fa, mesh):
            continue
        v = op_view(op, rule, fa, mesh)
        k = (v.reqs, v.outs)
        if k in seen:  # the same layouts: keep the cheaper
            if v.work < views[seen[k]][0].work:
                views[seen[k]] = (v, len(set(fa)))
            continue
        seen[k] = len(views)
        views.append((v, len(set(fa))))
    if len(views) > MAX_STRATEGIES:
        # the least local work first; among equals, axes spread over more factors (data and model
        # parallel at once before two axes on one dim), then enumeration order
        order = sorted(range(1, len(views)), key=lambda i: (views[i][0].work, -views[i][1], i))
        views = [views[0]] + [views[i] for i in sorted(order[: MAX_STRATEGIES - 1])]
    return [v for v, _ in views]


def param_views(p, mesh: Mesh) -> list[View]:
    t = p.value.type
    if p.sharding is not None:
        return [View((), (Sharding(p.sharding.dims),), 0.0)]
    axes = [a for a in mesh.names if mesh.axis_size(a) > 1]
    out = []
    for combo in itertools.product(range(-1, t.rank), repeat=len(axes)):
        dims = [()] * t.rank
        for a, d in zip(axes, combo):
            if d >= 0:
                dims[d] = dims[d] + (a,)
        if all(splits(n, mesh.group_size(ax)) for n, ax in zip(t.shape, dims) if ax):
            out.append(View((), (Sharding(tuple(dims)),), 0.0))
    return out


def _follower_view(op, rule: FactorRule, main: int, src: Sharding, mesh: Mesh) -> View:
    """An elementwise op in the layout of its main operand's producer (pending sums settled)."""
    dims = src.dims
    fa = project(rule.operands[main], dims, rule.sizes, mesh, op.operands[main].type.shape)
    return op_view(op, rule, fa, mesh)


def _attached_view(op, rule: FactorRule, want: Sharding, mesh: Mesh) -> View:
    """An op laid out as its one user wants its result (what its factors can hold of that)."""
    fa = project(rule.results[0], want.dims, rule.sizes, mesh, op.result.type.shape)
    fa = {f: a for f, a in fa.items() if rule.kinds[f] == PASS}
    if not valid(rule, fa, mesh):
        fa = {}
    return op_view(op, rule, fa, mesh)

