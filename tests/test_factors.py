"""Factor sharding rules per op family, and projection of shardings onto factors and back.

Rules are checked as text in Shardy's notation (FactorRule.__str__): one letter per factor (i, j,
k, ... in order of first appearance, operands then results), `[ij]` for a dim made of several
factors (major first), `1` for a dim that holds no factor, `[]` for a rank-0 tensor; then the
factors that are not pass-through by kind: reduction, need_replication (must not be split),
permutation (elements move along it).

Projection is checked against a brute-force oracle: which global elements every device holds
under the LANGUAGE.md layout (a dim of n split k ways holds ceil(n/k)-element blocks; the shard
index along (a, b) is index_a * size_b + index_b).
"""

from __future__ import annotations

import itertools
from functools import cache
from math import prod

import numpy as np
import pytest

from spmdlang.ir import registry
from spmdlang.ir.mesh import Mesh, Sharding
from spmdlang.ir.types import TensorType
from spmdlang.partition.factors import (
    PASS,
    project,
    project_dim,
    reshape_factors,
    reshape_rule,
    restrict,
    unproject,
    unproject_dim,
)


def tensor_type(o) -> TensorType:
    """A shape, or a (dtype, shape) pair."""
    return TensorType(o[0], tuple(o[1])) if o and isinstance(o[0], str) else TensorType("f32", tuple(o))


def op_rule(name, *operands, **attrs):
    """The rule of op `name` on operands given as shapes, or (dtype, shape) pairs."""
    types = [tensor_type(o) for o in operands]
    opdef = registry.get(name)
    results = opdef.infer_types(types, attrs)
    return opdef.rule(types, list(results), attrs)


I32 = "i32"
RULES = [
    # elementwise: one pass factor per dim; rank-0 operands (scalars) take part in none
    ("unary", "exp", [(8, 16)], {}, "([i, j]) -> ([i, j])"),
    ("cast", "cast", [(8, 16)], {"dtype": "i32"}, "([i, j]) -> ([i, j])"),
    ("bitcast", "bitcast_convert_type", [(8, 16)], {"dtype": "u32"}, "([i, j]) -> ([i, j])"),
    ("binary", "add", [(8, 16), (8, 16)], {}, "([i, j], [i, j]) -> ([i, j])"),
    ("scalar operand", "mul", [(8, 16), ()], {}, "([i, j], []) -> ([i, j])"),
    ("scalar first", "sub", [(), (4,)], {}, "([], [i]) -> ([i])"),
    ("all scalars", "add", [(), ()], {}, "([], []) -> ([])"),
    ("select", "select", [("bool", (4, 6)), (4, 6), (4, 6)], {}, "([i, j], [i, j], [i, j]) -> ([i, j])"),
    ("select scalar", "select", [("bool", (4, 6)), (), (4, 6)], {}, "([i, j], [], [i, j]) -> ([i, j])"),
    ("shard", "shard", [(4, 6)], {"sharding": Sharding(((), ()))}, "([i, j]) -> ([i, j])"),
    ("full", "full", [], {"dtype": "f32", "shape": (4, 6), "value": 0.0}, "() -> ([i, j])"),
    ("iota", "iota", [], {"dtype": "i32", "shape": (4, 6), "axis": 1}, "() -> ([i, j])"),
    # broadcast: a size-1 dim that grows holds no factor; new dims are factors of the result only
    ("broadcast new dim", "broadcast_in_dim", [(16,)], {"shape": (8, 16), "dims": (1,)}, "([i]) -> ([j, i])"),
    ("broadcast size-1 dim", "broadcast_in_dim", [(8, 1)], {"shape": (8, 16), "dims": (0, 1)}, "([i, 1]) -> ([i, j])"),
    ("broadcast size-1 kept", "broadcast_in_dim", [(8, 1)], {"shape": (8, 1), "dims": (0, 1)}, "([i, 1]) -> ([i, j])"),
    ("broadcast scalar", "broadcast_in_dim", [()], {"shape": (2, 3), "dims": ()}, "([]) -> ([i, j])"),
    # transpose permutes factors
    ("transpose", "transpose", [(2, 3, 4)], {"perm": (2, 0, 1)}, "([i, j, k]) -> ([k, i, j])"),
    # reshape: the common refinement of both shapes, each dim a run of factors, major first
    ("reshape merge", "reshape", [(8, 16)], {"shape": (128,)}, "([i, j]) -> ([ij])"),
    ("reshape split", "reshape", [(128,)], {"shape": (8, 16)}, "([ij]) -> ([i, j])"),
    ("reshape heads", "reshape", [(8, 64, 256)], {"shape": (8, 64, 8, 32)}, "([i, j, kl]) -> ([i, j, k, l])"),
    ("reshape regroup", "reshape", [(4, 6)], {"shape": (2, 12)}, "([ij, k]) -> ([i, jk])"),
    ("reshape [2,4]->[4,2]", "reshape", [(2, 4)], {"shape": (4, 2)}, "([i, jk]) -> ([ij, k])"),
    ("reshape size-1 inside", "reshape", [(2, 1, 3)], {"shape": (6,)}, "([i, 1, j]) -> ([ij])"),
    ("reshape size-1 out", "reshape", [(6,)], {"shape": (2, 1, 3)}, "([ij]) -> ([i, 1, j])"),
    ("reshape expand", "reshape", [(8, 4)], {"shape": (8, 1, 4)}, "([i, j]) -> ([i, 1, j])"),
    ("reshape squeeze", "reshape", [(1, 4, 1)], {"shape": (4,)}, "([1, i, 1]) -> ([i])"),
    # [6,4] <-> [4,6]: only the shared major factor 2 survives; the rest must not be split
    ("reshape irregular", "reshape", [(6, 4)], {"shape": (4, 6)},
     "([ij, k]) -> ([il, m]) need_replication={j, k, l, m}"),
    ("reshape irregular back", "reshape", [(4, 6)], {"shape": (6, 4)},
     "([ij, k]) -> ([il, m]) need_replication={j, k, l, m}"),
    ("reshape coprime", "reshape", [(2, 3)], {"shape": (3, 2)}, "([i, j]) -> ([k, l]) need_replication={i, j, k, l}"),
    # einsum: one factor per letter; letters not in the output are reductions
    ("matmul", "einsum", [(8, 16), (16, 4)], {"spec": "ij,jk->ik"}, "([i, j], [j, k]) -> ([i, k]) reduction={j}"),
    ("batch matmul", "einsum", [(2, 8, 16), (2, 16, 4)], {"spec": "bij,bjk->bik"},
     "([i, j, k], [i, k, l]) -> ([i, j, l]) reduction={k}"),
    ("outer", "einsum", [(8,), (4,)], {"spec": "i,j->ij"}, "([i], [j]) -> ([i, j])"),
    ("one operand transpose", "einsum", [(8, 4)], {"spec": "ij->ji"}, "([i, j]) -> ([j, i])"),
    ("one operand reduce", "einsum", [(8, 4)], {"spec": "ij->i"}, "([i, j]) -> ([i]) reduction={j}"),
    ("einsum size-1 contraction", "einsum", [(4, 1), (1, 5)], {"spec": "ij,jk->ik"}, "([i, 1], [1, j]) -> ([i, j])"),
    ("attention scores", "einsum", [(2, 8, 4, 16), (2, 8, 4, 16)], {"spec": "bqhd,bkhd->bhqk"},
     "([i, j, k, l], [i, m, k, l]) -> ([i, k, j, m]) reduction={l}"),
    # reductions
    ("reduce one axis", "reduce_sum", [(8, 16, 4)], {"axes": (1,)}, "([i, j, k]) -> ([i, k]) reduction={j}"),
    ("reduce all", "reduce_max", [(8, 16)], {"axes": (0, 1)}, "([i, j]) -> ([]) reduction={i, j}"),
    ("argmax", "argmax", [(8, 16)], {"axis": 1}, "([i, j]) -> ([i]) reduction={j}"),
    # take: the gathered table axis is a reduction (masked local gather, then a sum)
    ("take rows", "take", [(100, 16), (I32, (4, 8))], {"axis": 0}, "([i, j], [k, l]) -> ([k, l, j]) reduction={i}"),
    ("take cols", "take", [(16, 100), (I32, (4,))], {"axis": 1}, "([i, j], [k]) -> ([i, k]) reduction={j}"),
    # conv: batch passes, spatial dims are permutations (halos), window replicated, C reduced
    ("conv 2d", "conv", [(2, 8, 8, 3), (3, 3, 3, 5)], {"strides": (1, 1), "padding": ((1, 1), (1, 1))},
     "([i, j, k, l], [m, n, l, o]) -> ([i, j, k, o]) reduction={l} need_replication={m, n} permutation={j, k}"),
    ("conv 1d", "conv", [(2, 8, 3), (3, 3, 5)], {"strides": (2,), "padding": ((0, 0),)},
     "([i, j, k], [l, k, m]) -> ([i, j, m]) reduction={k} need_replication={l} permutation={j}"),
    # grouped conv: the group index leads the input channels and the features (pass), the channels
    # within a group reduce; depthwise has one channel per group; batch groups lead the input batch
    ("conv grouped", "conv", [(2, 8, 6), (3, 2, 9)], {"strides": (1,), "padding": ((1, 1),), "groups": 3},
     "([i, j, kl], [m, l, kn]) -> ([i, j, kn]) reduction={l} need_replication={m} permutation={j}"),
    ("conv depthwise", "conv", [(2, 8, 6), (3, 1, 12)], {"strides": (1,), "padding": ((1, 1),), "groups": 6},
     "([i, j, k], [l, 1, km]) -> ([i, j, km]) need_replication={l} permutation={j}"),
    ("conv batch groups", "conv", [(4, 8, 3), (3, 3, 6)], {"strides": (1,), "padding": ((0, 0),),
                                                            "batch_groups": 2},
     "([ij, k, l], [m, l, in]) -> ([j, k, in]) reduction={l} need_replication={m} permutation={k}"),
    # ops moving elements along a dim: that dim is a permutation factor, the others pass
    ("concat", "concat", [(4, 8), (4, 3)], {"axis": 1}, "([i, j], [i, j]) -> ([i, j]) permutation={j}"),
    ("slice", "slice", [(8, 16)], {"starts": (0, 2), "stops": (8, 10), "steps": (1, 1)},
     "([i, j]) -> ([i, j]) permutation={j}"),
    ("slice strided", "slice", [(8, 16)], {"starts": (0, 0), "stops": (8, 16), "steps": (2, 1)},
     "([i, j]) -> ([i, j]) permutation={i}"),
    ("slice whole", "slice", [(8, 16)], {"starts": (0, 0), "stops": (8, 16), "steps": (1, 1)}, "([i, j]) -> ([i, j])"),
    ("pad", "pad", [(8, 16)], {"lo": (0, 1), "hi": (0, 2), "value": 0.0}, "([i, j]) -> ([i, j]) permutation={j}"),
    ("roll", "roll", [(8, 16)], {"shift": 3, "axis": 0}, "([i, j]) -> ([i, j]) permutation={i}"),
    # run-time windows: a cut dim of x is read where it lies and summed (reduction), the window's
    # dim is never split; whole dims pass. An update keeps x's split (each shard writes its part)
    ("dynamic_slice", "dynamic_slice", [(8, 16, 4), (I32, ()), (I32, ()), (I32, ())], {"sizes": (1, 16, 2)},
     "([i, j, k], [], [], []) -> ([1, j, l]) reduction={i, k} need_replication={l}"),
    ("dynamic_update_slice", "dynamic_update_slice", [(8, 16), (2, 16), (I32, ()), (I32, ())], {},
     "([i, j], [k, j], [], []) -> ([i, j]) need_replication={k} permutation={i}"),
]
# the rest of the elementwise family: the same rule as their representative above
RULES += [(f"{op} like exp", op, [(8, 16)], {}, "([i, j]) -> ([i, j])")
          for op in "log sqrt rsqrt tanh sigmoid gelu sin cos floor ceil round neg abs sign relu".split()]
RULES += [("logical_not like exp", "logical_not", [("bool", (8, 16))], {}, "([i, j]) -> ([i, j])")]
RULES += [(f"{op} like add", op, [(8, 16), (8, 16)], {}, "([i, j], [i, j]) -> ([i, j])")
          for op in "div maximum minimum pow atan2 lt le gt ge eq ne".split()]
RULES += [(f"{op} like add", op, [("bool", (8, 16)), ("bool", (8, 16))], {}, "([i, j], [i, j]) -> ([i, j])")
          for op in ("logical_and", "logical_or")]
RULES += [(f"{op} like reduce_sum", op, [(8, 16, 4)], {"axes": (1,)}, "([i, j, k]) -> ([i, k]) reduction={j}")
          for op in ("reduce_prod", "reduce_min")]
RULES += [("argmin", "argmin", [(8, 16)], {"axis": 0}, "([i, j]) -> ([j]) reduction={i}")]
RULES += [(f"{op} like exp", op, [(8, 16)], {}, "([i, j]) -> ([i, j])")
          for op in "gelu_erf erf erf_inv log1p expm1 square stop_gradient softplus relu6".split()]
RULES += [(f"{op} like add", op, [(8, 16), (8, 16)], {}, "([i, j], [i, j]) -> ([i, j])") for op in ("floordiv", "mod")]
RULES += [
    # scans: the scanned dim is a permutation factor (a local scan and a prefix of shard totals)
    *[(op, op, [(8, 16)], {"axis": 1, "reverse": False}, "([i, j]) -> ([i, j]) permutation={j}")
      for op in ("cumsum", "cumprod", "cummax")],
    # top_k: the row is a permutation factor of the operand (candidates per shard), k is replicated
    ("top_k", "top_k", [(8, 16)], {"k": 3}, "([i, j]) -> ([i, k], [i, k]) need_replication={k} permutation={j}"),
    # sort: the sorted dim must not be split (gathered)
    *[(op, op, [(8, 16)], {"axis": 1}, "([i, j]) -> ([i, j]) need_replication={j}") for op in ("sort", "argsort")],
    # take_along_axis: x's taken axis is a reduction (masked lookup, then a sum); the ids' axis passes
    ("take_along_axis", "take_along_axis", [(8, 16), (I32, (8, 3))], {"axis": 1},
     "([i, j], [i, k]) -> ([i, k]) reduction={j}"),
    # scatter_add: the scattered axis a permutation (each shard adds its range); id dims summed away
    *[(op, op, [(10, 4), (I32, (3, 2)), (3, 2, 4)], {"axis": 0},
       "([i, j], [k, l], [k, l, j]) -> ([i, j]) reduction={k, l} permutation={i}")
      for op in ("scatter_add", "scatter_max", "scatter_min")],
    # pool: batch and channels pass, spatial dims are permutations (halo windows), one factor for
    # the input's and the output's rows (as conv), so a row split carries through the pool
    ("pool", "pool", [(2, 8, 8, 3)], {"reduce": "max", "window": (2, 2), "strides": (2, 2),
                                     "padding": ((0, 0), (0, 0))},
     "([i, j, k, l]) -> ([i, j, k, l]) permutation={j, k}"),
    # select_and_scatter_add (a max pool's gradient): the source (pooled), the operand and the
    # result share a factor per spatial dim, as the pool's input and output do
    ("select_and_scatter_add", "select_and_scatter_add", [(2, 4, 4, 3), (2, 8, 8, 3)],
     {"window": (2, 2), "strides": (2, 2), "padding": ((0, 0), (0, 0))},
     "([i, j, k, l], [i, j, k, l]) -> ([i, j, k, l]) permutation={j, k}"),
    # random: elementwise in the counter; the seed is a scalar
    ("random", "random", [(I32, ()), (I32, (4, 8))], {"dist": "uniform", "dtype": "f32"}, "([], [i, j]) -> ([i, j])"),
    # jax.random's draws: the key is read whole; every result dim may be split (global counters),
    # except the pair of key words of a split
    ("random_draw", "random_draw", [("u32", (2,))], {"dist": "uniform", "dtype": "f32", "shape": (4, 8),
                                                     "minval": 0.0, "maxval": 1.0},
     "([i]) -> ([j, k]) need_replication={i}"),
    ("random_draw split", "random_draw", [("u32", (2,))], {"dist": "split", "dtype": "u32", "shape": (5,)},
     "([i]) -> ([j, k]) need_replication={i, k}"),
]
RULES += [(f"{op} like add", op, [("u32", (8, 16)), ("u32", (8, 16))], {}, "([i, j], [i, j]) -> ([i, j])")
          for op in ("bitwise_and", "bitwise_or", "bitwise_xor", "left_shift", "right_shift")]


@pytest.mark.parametrize("name, op, operands, attrs, expected", RULES, ids=[r[0] for r in RULES])
def test_rule_text(name, op, operands, attrs, expected):
    assert str(op_rule(op, *operands, **attrs)) == expected


@pytest.mark.parametrize("name, op, operands, attrs, expected", RULES, ids=[r[0] for r in RULES])
def test_rule_invariants(name, op, operands, attrs, expected):
    """A factor appears at most once per tensor; each dim's factors multiply to the dim's size
    (replicate remainders included), except permutation factors, which have the result's size."""
    rule = op_rule(op, *operands, **attrs)
    types = [tensor_type(o) for o in operands]
    shapes = [t.shape for t in types] + [t.shape for t in registry.get(op).infer_types(types, attrs)]
    assert len(rule.tensors) == len(shapes)
    for dims, shape in zip(rule.tensors, shapes):
        flat = [f for d in dims for f in d]
        assert len(flat) == len(set(flat))
        assert len(dims) == len(shape)
        for fs, n in zip(dims, shape):
            if fs and rule.kinds[fs[0]] != "permutation":
                assert prod(rule.sizes[f] for f in fs) == n
            if len(fs) > 1:
                assert all(rule.sizes[f] > 1 for f in fs)


def test_reshape_factor_sizes():
    assert reshape_factors((6, 4), (4, 6))[0] == [2, 3, 4, 2, 6]
    assert reshape_factors((2, 1, 3), (6,)) == ([2, 3], [PASS, PASS], [[0], [], [1]], [[0, 1]])
    assert reshape_factors((12, 5), (4, 15))[0] == [4, 3, 5]
    assert reshape_factors((1,), (1, 1)) == ([], [], [[]], [[], []])


# ---------------------------------------------------------------------------------- projection

M22 = Mesh.make({"a": 2, "b": 2})
M24 = Mesh.make({"a": 2, "b": 4})
M23 = Mesh.make({"a": 2, "b": 3})
M42 = Mesh.make({"a": 4, "b": 2})


def reshaped(in_shape, dims, out_shape, mesh):
    """What propagation hands the reshape's result for an operand laid out as `dims`."""
    rule = reshape_rule(in_shape, out_shape)
    fa = project(rule.operands[0], dims, rule.sizes, mesh, in_shape)
    fa = {f: a for f, a in fa.items() if rule.kinds[f] == PASS}
    return unproject(rule.results[0], restrict(rule, fa, mesh), rule.sizes, mesh)


RESHAPES = [
    # merges keep (a, b) only when the major dim's split covers it fully
    ("merge covered", M22, (2, 16), (("a",), ("b",)), (32,), (("a", "b"),)),
    ("merge not covered", M24, (8, 16), (("a",), ("b",)), (128,), (("a",),)),
    ("merge major only", M22, (2, 16), (("a",), ()), (32,), (("a",),)),
    ("merge minor only", M22, (2, 16), ((), ("b",)), (32,), ((),)),
    ("merge two axes major", M22, (4, 16), (("a", "b"), ()), (64,), (("a", "b"),)),
    ("merge three dims", M22, (2, 2, 5), (("a",), ("b",), ()), (20,), (("a", "b"),)),
    # a split dim hands its axes to the major parts first; sizes that do not divide stop
    ("split both to major", M24, (128,), (("a", "b"),), (8, 16), (("a", "b"), ())),
    ("split spills to minor", M24, (32,), (("a", "b"),), (2, 16), (("a",), ("b",))),
    ("split does not divide", M24, (32,), (("b",),), (2, 16), ((), ())),
    ("split stops midway", M24, (24,), (("a", "b"),), (6, 4), (("a",), ())),
    ("split minor axis first", M24, (32,), (("b", "a"),), (4, 8), (("b",), ("a",))),
    ("heads", M24, (8, 64, 256), (("a",), (), ("b",)), (8, 64, 8, 32), (("a",), (), ("b",), ())),
    ("heads back", M24, (8, 64, 8, 32), (("a",), (), ("b",), ()), (8, 64, 256), (("a",), (), ("b",))),
    ("heads too few", M24, (8, 64, 2, 128), ((), (), ("b",), ()), (8, 64, 256), ((), (), ())),
    # irregular blocks: only the shared major factor passes
    ("irregular major", M22, (6, 4), (("a",), ()), (4, 6), (("a",), ())),
    ("irregular minor", M22, (6, 4), ((), ("a",)), (4, 6), ((), ())),
    ("irregular too much", M23, (6, 4), (("b",), ()), (4, 6), ((), ())),
    # a minor factor's split cannot survive where its major factor's split is lost
    ("no orphan minor split", M22, (2, 4), ((), ("a", "b")), (4, 2), ((), ())),
    # uneven shards are contiguous only where the dim has a single non-trivial factor
    ("uneven sole factor", M42, (10,), (("a",),), (10, 1), (("a",), ())),
    ("uneven into merge", M22, (5, 4), (("a",), ()), (20,), ((),)),
    ("uneven split", M22, (20,), (("a",),), (5, 4), ((), ())),
    ("size-1 dims", M22, (2, 1, 3), (("a",), (), ()), (6,), (("a",),)),
    ("size-1 dims out", M23, (6,), (("a", "b"),), (2, 1, 3), (("a",), (), ("b",))),
]


@pytest.mark.parametrize("name, mesh, in_shape, dims, out_shape, expected", RESHAPES,
                         ids=[r[0] for r in RESHAPES])
def test_reshape_projection(name, mesh, in_shape, dims, out_shape, expected):
    assert reshaped(in_shape, dims, out_shape, mesh) == expected


def test_project_dim_order_and_stop():
    sizes = (2, 8, 3)
    assert project_dim((0, 1), ("a", "b"), sizes, M24, 16) == ({0: ("a",), 1: ("b",)}, ("a", "b"))
    # b=4 does not divide 2: the dim's axes stop at the first that cannot be placed
    assert project_dim((0, 1), ("b", "a"), sizes, M24, 16) == ({}, ())
    # the sole non-trivial factor takes everything, even unevenly
    assert project_dim((2,), ("b",), sizes, M24, 3) == ({2: ("b",)}, ("b",))


def test_unproject_dim_contiguous_prefix():
    sizes = (2, 8, 3)
    assert unproject_dim((0, 1), {0: ("a",), 1: ("b",)}, sizes, M24) == ("a", "b")
    assert unproject_dim((0, 1), {1: ("b",)}, sizes, M24) == ()  # major factor whole: minor split lost
    assert unproject_dim((1, 0), {1: ("a",), 0: ("b",)}, sizes, M22) == ("a",)  # 8 not fully split
    assert unproject_dim((), {0: ("a",)}, sizes, M22) == ()


def test_restrict_cuts_everywhere():
    rule = reshape_rule((2, 4), (4, 2))  # a(bc)->(ab)c
    assert restrict(rule, {1: ("a",), 2: ("b",)}, M22) == {}
    assert restrict(rule, {0: ("a",), 1: ("b",), 2: ()}, M22) == {0: ("a",), 1: ("b",)}


# ---------------------------------------------------------------------------------- brute force


def block_layouts(rank, mesh):
    """Every sharding of a rank-`rank` tensor over `mesh`: each axis unused or on one dim, any order."""
    names = mesh.names
    for place in itertools.product(range(-1, rank), repeat=len(names)):
        per_dim = [[a for a, d in zip(names, place) if d == i] for i in range(rank)]
        for orders in itertools.product(*(itertools.permutations(p) for p in per_dim)):
            yield tuple(tuple(o) for o in orders)


@cache
def held(shape, dims, mesh) -> tuple[frozenset, ...]:
    """Per device (mesh position), the flat global indices it holds under the ceil-division layout."""
    flat = np.arange(prod(shape)).reshape(shape)
    out = []
    for position in range(mesh.size):
        coords = mesh.coords(position)
        index = []
        for n, axes in zip(shape, dims):
            shard = 0
            for a in axes:
                shard = shard * mesh.axis_size(a) + coords[a]
            chunk = -(-n // mesh.group_size(axes))
            index.append(slice(min(shard * chunk, n), min((shard + 1) * chunk, n)))
        out.append(frozenset(flat[tuple(index)].ravel().tolist()))
    return tuple(out)


def test_held_matches_language_layout():
    # [a=2, b=2], dim of 5 over (a, b): shards of ceil(5/4) = 2, shard index a*2 + b, the last one empty
    assert held((5,), (("a", "b"),), M22) == (frozenset({0, 1}), frozenset({2, 3}), frozenset({4}),
                                             frozenset())
    assert held((2, 2), (("b",), ("a",)), M22) == tuple(frozenset({x}) for x in (0, 2, 1, 3))


def shapes_of_size(n, max_rank=3):
    dims = [d for d in range(1, n + 1) if n % d == 0]
    return [s for r in range(1, max_rank + 1) for s in itertools.product(dims, repeat=r) if prod(s) == n]


@pytest.mark.parametrize("mesh", [M22, M23, M42], ids=str)
@pytest.mark.parametrize("n", [4, 6, 8, 12, 16])
def test_reshape_projection_brute_force(mesh, n):
    """For every pair of shapes with n elements and every layout of the operand:
    sound: the result's layout and the operand's layout that projects back from it hold the same
      elements on every device (the reshape is local), and that operand layout only drops axes;
    exact: an evenly split operand keeps all its axes whenever some result layout holds exactly
      its elements (a split survives exactly when shards stay contiguous)."""
    shapes = shapes_of_size(n)
    if n == 16:
        shapes = [s for s in shapes if len(s) <= 2 or 1 in s]
    for in_shape in shapes:
        for out_shape in shapes:
            if in_shape == out_shape:
                continue
            rule = reshape_rule(in_shape, out_shape)
            out_layouts = {held(out_shape, d, mesh) for d in block_layouts(len(out_shape), mesh)}
            for dims in block_layouts(len(in_shape), mesh):
                if any(mesh.group_size(a) > m for a, m in zip(dims, in_shape)):
                    continue  # propagation never splits a dim into more shards than elements
                out = reshaped(in_shape, dims, out_shape, mesh)
                fb = project(rule.results[0], out, rule.sizes, mesh, out_shape)
                back = unproject(rule.operands[0], restrict(rule, fb, mesh), rule.sizes, mesh)
                where = f"{in_shape} {dims} -> {out_shape} {out} (back {back})"
                assert all(b == d[: len(b)] for b, d in zip(back, dims)), where
                assert held(in_shape, back, mesh) == held(out_shape, out, mesh), where
                even = all(m % mesh.group_size(a) == 0 for a, m in zip(dims, in_shape))
                if even and held(in_shape, dims, mesh) in out_layouts:
                    assert back == dims, where


@pytest.mark.parametrize("mesh", [M22, M23], ids=str)
def test_transpose_and_elementwise_projection_brute_force(mesh):
    """Pass factors of single-factor dims carry any layout across, holding the same elements."""
    shape, perm = (2, 3, 4), (2, 0, 1)
    rule = op_rule("transpose", shape, perm=perm)
    out_shape = tuple(shape[p] for p in perm)
    for dims in block_layouts(3, mesh):
        fa = project(rule.operands[0], dims, rule.sizes, mesh, shape)
        out = unproject(rule.results[0], fa, rule.sizes, mesh)
        assert out == tuple(dims[p] for p in perm)
        moved = np.transpose(np.arange(prod(shape)).reshape(shape), perm).ravel()
        assert [frozenset(moved[i] for i in h) for h in held(out_shape, out, mesh)] == list(
            held(shape, dims, mesh))
