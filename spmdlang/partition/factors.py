"""Sharding rules as data: factors shared between an op's operand and result dims (Shardy style).

A `FactorRule` says, for every operand and result dim, which factors it is made of (major to
minor; a reshape dim may hold several, a size-1 dim none). Factor kinds:
  pass         the factor indexes operands and results alike (elementwise dims, einsum batch/free dims)
  reduction    it appears only in operands and is summed/maxed away (einsum contracting, reduce axes)
  replicate    it must not be split (the op reads across the whole dim)
  permutation  split allowed, but elements move along it (slice, pad, concat, roll, conv windows):
               propagation passes it through; partitioning needs the op's custom step
Invariant: within one tensor a factor appears at most once.

Projection turns a tensor's Sharding into axes per factor and back. A dim's axes go to its factors
major first; an axis may enter a factor only while every more-major factor of the dim is fully
split (one element per shard), and must divide the factor's size unless the factor is the dim's
only non-trivial one (uneven shards are only contiguous then). Within one op, `restrict` keeps of a
factor split only what every tensor of the op can hold, so all its tensors hold the same elements.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from math import gcd

from ..ir.mesh import Mesh
from ..ir.registry import Named


class FactorKind(Named):
    pass_ = "pass"
    reduction = "reduction"
    replicate = "replicate"
    permutation = "permutation"


PASS, REDUCTION, REPLICATE, PERMUTATION = FactorKind.pass_, FactorKind.reduction, FactorKind.replicate, \
    FactorKind.permutation

# Shardy's names for the kinds that are not pass-through, as its rule printer writes them
_SHARDY_KIND = {REDUCTION: "reduction", REPLICATE: "need_replication", PERMUTATION: "permutation"}

DimFactors = tuple[int, ...]
TensorFactors = tuple[DimFactors, ...]


@dataclass(frozen=True)
class FactorRule:
    sizes: tuple[int, ...]
    kinds: tuple[str, ...]
    operands: tuple[TensorFactors, ...]
    results: tuple[TensorFactors, ...]

    @cached_property
    def tensors(self) -> tuple[TensorFactors, ...]:
        return self.operands + self.results

    @cached_property
    def multi_factor_dims(self) -> bool:
        """Whether some dim is made of several factors (reshape), so that projections can lose axes."""
        return any(len(fs) > 1 for t in self.tensors for fs in t)

    def __str__(self) -> str:
        """Shardy's notation, factors lettered i, j, k, ... in order of first appearance:
        `([i, j], [j, k]) -> ([i, k]) reduction={j}`; a dim of several factors is `[ij]`, a dim
        of none (size 1) is `1`; `{i=8, ...}` sizes are left out, see `sizes_text`."""
        names = self._letters()

        def tensors(ts):
            return "(" + ", ".join("[" + ", ".join("".join(names[f] for f in d) or "1" for d in t) + "]"
                                   for t in ts) + ")"

        text = f"{tensors(self.operands)} -> {tensors(self.results)}"
        for kind, word in _SHARDY_KIND.items():
            fs = [names[f] for f in names if self.kinds[f] == kind]
            if fs:
                text += f" {word}={{{', '.join(fs)}}}"
        return text

    def sizes_text(self) -> str:
        """The factor sizes, `{i=8, j=16, k=4}`."""
        names = self._letters()
        return "{" + ", ".join(f"{n}={self.sizes[f]}" for f, n in names.items()) + "}"

    def _letters(self) -> dict[int, str]:
        names: dict[int, str] = {}
        for t in self.tensors:
            for d in t:
                for f in d:
                    if f not in names:
                        k = len(names)
                        letter = "ijklmnopqrstuvwxyzabcdefgh"[k % 26]
                        names[f] = letter if k < 26 else f"{letter}_{k // 26}"
        return names

    def factor_dims(self, tensor: int, factor: int) -> int | None:
        """Which dim of tensor `tensor` (operands first, then results) holds `factor`, if any."""
        for d, fs in enumerate(self.tensors[tensor]):
            if factor in fs:
                return d
        return None


# ---------------------------------------------------------------------------------- builders


class RuleBuilder:
    """Accumulates factors; `dim(...)` lists are built by callers from factor ids."""

    def __init__(self):
        self.sizes: list[int] = []
        self.kinds: list[str] = []

    def factor(self, size: int, kind: str = PASS) -> int:
        self.sizes.append(size)
        self.kinds.append(kind)
        return len(self.sizes) - 1

    def build(self, operands, results) -> FactorRule:
        tup = lambda ts: tuple(tuple(tuple(d) for d in t) for t in ts)  # noqa: E731
        return FactorRule(tuple(self.sizes), tuple(self.kinds), tup(operands), tup(results))


def einsum_rule(spec: str, operand_shapes, result_shape) -> FactorRule:
    """One factor per index letter; letters absent from the output are reductions."""
    ins, out = spec.split("->")
    ins = ins.split(",")
    b = RuleBuilder()
    ids: dict[str, int] = {}
    sizes: dict[str, int] = {}
    for letters, shape in zip(ins, operand_shapes):
        for c, n in zip(letters, shape):
            sizes[c] = max(sizes.get(c, 1), n)
    for c in out:
        ids[c] = b.factor(sizes[c], PASS)
    for letters in ins:
        for c in letters:
            if c not in ids:
                ids[c] = b.factor(sizes[c], REDUCTION)

    def dims(letters, shape):
        return [() if n == 1 and sizes[c] == 1 else (ids[c],) for c, n in zip(letters, shape)]

    return b.build([dims(s, sh) for s, sh in zip(ins, operand_shapes)], [dims(out, result_shape)])


def elementwise_rule(operand_shapes, result_shape, n_results: int = 1) -> FactorRule:
    """One pass factor per result dim; rank-0 operands (scalars) take part in none."""
    b = RuleBuilder()
    fs = [b.factor(n) for n in result_shape]
    ops = [[(f,) for f in fs] if len(s) == len(result_shape) else [] for s in operand_shapes]
    return b.build(ops, [[(f,) for f in fs]] * n_results)


def reshape_factors(in_shape, out_shape) -> tuple[list[int], list[str], list[list[int]], list[list[int]]]:
    """Common refinement of two shapes with equal size into factors, block by block (the shortest
    runs of dims with equal products). Where a block admits no full refinement (e.g. [6, 4] <-> [4, 6])
    its shared major part (here 2) is still a pass factor and the rest of each dim is replicate."""
    sizes: list[int] = []
    kinds: list[str] = []
    in_dims: list[list[int]] = [[] for _ in in_shape]
    out_dims: list[list[int]] = [[] for _ in out_shape]
    i = j = 0
    in_shape, out_shape = list(in_shape), list(out_shape)
    if 0 in in_shape or 0 in out_shape:  # no elements: every dim a replicate factor of its own
        for dims, shape in ((in_dims, in_shape), (out_dims, out_shape)):
            for d, n in enumerate(shape):
                if n != 1:
                    dims[d].append(len(sizes))
                    sizes.append(n)
                    kinds.append(REPLICATE)
        return sizes, kinds, in_dims, out_dims
    while i < len(in_shape) or j < len(out_shape):
        if i < len(in_shape) and in_shape[i] == 1:
            i += 1
            continue
        if j < len(out_shape) and out_shape[j] == 1:
            j += 1
            continue
        bi, bj = [i], [j]
        pi, pj = in_shape[i], out_shape[j]
        i, j = i + 1, j + 1
        while pi != pj:
            if pi < pj:
                pi *= in_shape[i]
                bi.append(i)
                i += 1
            else:
                pj *= out_shape[j]
                bj.append(j)
                j += 1
        # size-1 dims inside a block hold no factor
        bi = [k for k in bi if in_shape[k] != 1]
        bj = [k for k in bj if out_shape[k] != 1]
        fsizes, fkinds, fin, fout = _factor_block([in_shape[k] for k in bi], [out_shape[k] for k in bj])
        base = len(sizes)
        sizes.extend(fsizes)
        kinds.extend(fkinds)
        for k, fl in zip(bi, fin):
            in_dims[k] = [base + f for f in fl]
        for k, fl in zip(bj, fout):
            out_dims[k] = [base + f for f in fl]
    return sizes, kinds, in_dims, out_dims


def _factor_block(a: list[int], b: list[int]):
    """Split two dim lists (no 1s) of equal product into shared pass factors, major first, each dim
    a run of consecutive factors. Once the remainders of the current dims are coprime nothing more
    can be shared: each remaining (part of a) dim becomes a replicate factor of its own."""
    fa: list[list[int]] = [[] for _ in a]
    fb: list[list[int]] = [[] for _ in b]
    sizes: list[int] = []
    kinds: list[str] = []
    i = j = 0
    ra, rb = a[0], b[0]
    while i < len(a) and j < len(b):
        g = gcd(ra, rb)
        if g == 1:
            break
        fa[i].append(len(sizes))
        fb[j].append(len(sizes))
        sizes.append(g)
        kinds.append(PASS)
        ra, rb = ra // g, rb // g
        if ra == 1:
            i += 1
            ra = a[i] if i < len(a) else 1
        if rb == 1:
            j += 1
            rb = b[j] if j < len(b) else 1
    for dims, fl, k, rest in ((a, fa, i, ra), (b, fb, j, rb)):
        for d in range(k, len(dims)):
            fl[d].append(len(sizes))
            sizes.append(rest if d == k else dims[d])
            kinds.append(REPLICATE)
    return sizes, kinds, fa, fb


def reshape_rule(in_shape, out_shape) -> FactorRule:
    sizes, kinds, in_dims, out_dims = reshape_factors(in_shape, out_shape)
    return FactorRule(tuple(sizes), tuple(kinds), (tuple(map(tuple, in_dims)),),
                      (tuple(map(tuple, out_dims)),))


# ---------------------------------------------------------------------------------- projection

FactorAxes = dict[int, tuple[str, ...]]


def project_dim(factors: DimFactors, axes: tuple[str, ...], sizes, mesh: Mesh, dim_size: int):
    """Assign a dim's axes to its factors (see module doc). Returns (assignment, axes used);
    axes that cannot be placed are left out (the tensor would need resharding for them)."""
    out: dict[int, tuple[str, ...]] = {}
    if not factors or not axes:
        return out, ()
    if len(factors) == 1:
        return {factors[0]: tuple(axes)}, tuple(axes)
    nontrivial = [f for f in factors if sizes[f] > 1]
    if len(nontrivial) <= 1:
        f = nontrivial[0] if nontrivial else factors[-1]
        out[f] = tuple(axes)
        return out, tuple(axes)
    used: list[str] = []
    k = 0
    remaining = sizes[factors[0]]
    for a in axes:
        s = mesh.axis_size(a)
        while remaining == 1 and k + 1 < len(factors):
            k += 1
            remaining = sizes[factors[k]]
        if remaining % s != 0:
            break
        out[factors[k]] = out.get(factors[k], ()) + (a,)
        remaining //= s
        used.append(a)
    return out, tuple(used)


def project(rule_dims: TensorFactors, dims_axes, sizes, mesh: Mesh, shape) -> FactorAxes:
    """A tensor's per-dim axes -> axes per factor."""
    out: FactorAxes = {}
    for fs, axes, n in zip(rule_dims, dims_axes, shape):
        if axes and len(fs) == 1:
            out[fs[0]] = tuple(axes)
        elif axes:
            out.update(project_dim(fs, axes, sizes, mesh, n)[0])
    return out


def _held_dim(factors: DimFactors, fa: FactorAxes, sizes, mesh: Mesh) -> list[tuple[int, tuple[str, ...]]]:
    """The (factor, axes) a dim can hold of `fa`, major first: the longest contiguous prefix."""
    if len(factors) == 1:
        axes = fa.get(factors[0])
        return [(factors[0], axes)] if axes else []
    nontrivial = [f for f in factors if sizes[f] > 1]
    if len(nontrivial) <= 1:
        return [(f, fa[f]) for f in factors if fa.get(f)]
    out = []
    for f in nontrivial:
        axes = fa.get(f, ())
        kept: list[str] = []
        rem = sizes[f]
        for a in axes:  # keep the axes that divide the factor, then stop
            if rem % mesh.axis_size(a):
                break
            rem //= mesh.axis_size(a)
            kept.append(a)
        if kept:
            out.append((f, tuple(kept)))
        if rem != 1:  # a factor not split down to single elements ends the contiguous prefix
            break
    return out


def unproject_dim(factors: DimFactors, fa: FactorAxes, sizes, mesh: Mesh) -> tuple[str, ...]:
    """Factor axes -> the dim's axes, keeping the longest prefix that stays contiguous."""
    if len(factors) == 1:
        return tuple(fa.get(factors[0], ()))
    if not factors:
        return ()
    return tuple(a for _f, axes in _held_dim(factors, fa, sizes, mesh) for a in axes)


def unproject(rule_dims: TensorFactors, fa: FactorAxes, sizes, mesh: Mesh) -> tuple[tuple[str, ...], ...]:
    out = []
    for fs in rule_dims:  # unproject_dim, its common cases inline (the partitioner's hottest loop)
        if len(fs) == 1:
            out.append(tuple(fa.get(fs[0], ())))
        elif not fs:
            out.append(())
        else:
            out.append(unproject_dim(fs, fa, sizes, mesh))
    return tuple(out)


def restrict(rule: FactorRule, fa: FactorAxes, mesh: Mesh) -> FactorAxes:
    """The largest part of `fa` (a prefix of each factor's axes) that every tensor of the op holds
    whole. A factor one tensor cannot hold is cut there and so everywhere: otherwise another tensor
    would keep a minor factor's split whose major factor lost its own, and the two tensors' shards
    would hold different elements (e.g. [2, 4] {_, (a, b)} -> [4, 2] must not become {_, b})."""
    fa = {f: axes for f, axes in fa.items() if axes}
    if not rule.multi_factor_dims:
        return fa  # every dim is one factor: each tensor holds whatever it is given
    changed = True
    while changed:
        changed = False
        for tensor in rule.tensors:
            for factors in tensor:
                held = dict(_held_dim(factors, fa, rule.sizes, mesh))
                for f in factors:
                    if f in fa and held.get(f, ()) != fa[f]:
                        fa[f] = held.get(f, ())
                        changed = True
                fa = {f: axes for f, axes in fa.items() if axes}
    return fa

