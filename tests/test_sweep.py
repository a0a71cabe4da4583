"""Exhaustive sharding sweep, as DTensor's strategy validation: for every op of the op table and
every assignment of operand shardings on the mesh [a=2, b=2] (each axis splitting some dim, in
either order, or left out; a float operand may also owe a pending sum over axes it does not use),
the simulator must equal the global reference, on an evenly and an unevenly divisible instance.

A pending sum is fed as uneven, unrelated shares (a random part of the value on each device of its
group, the rest on the last), so an op that forgets to settle it, or passes it through where it
must not (max of shares is not the max), cannot match by accident. Float inputs are shifted by
+-2 at random so that padding masked with a wrong identity (0 for a max) shows.

The default run sweeps a representative of each family; --runslow sweeps every op.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from spmdlang.api import _compare
from spmdlang.backend_ref import run_global
from spmdlang.backend_ref.sim import run_shards, scatter
from spmdlang.ir import registry
from spmdlang.ir.builder import Builder
from spmdlang.ir.core import Param, Program, Result, Value
from spmdlang.ir.mesh import Mesh, Sharding
from spmdlang.ir.printer import print_program
from spmdlang.ir.types import TensorType, is_float, np_dtype
from spmdlang.ir.verify import verify
from spmdlang.partition.combine import finish
from spmdlang.partition.propagate import propagate
from spmdlang.partition.spmd import partition

MESH = Mesh.make({"a": 2, "b": 2})

# per op: an evenly divisible instance and an uneven one, (operand types, attrs)
_ELEMENTWISE_SHAPES = ((4, 6), (3, 5))
INSTANCES = {
    "cast": [(("f32[4, 6]",), {"dtype": "i32"}), (("f32[3, 5]",), {"dtype": "bf16"})],
    "full": [((), {"dtype": "f32", "shape": (4, 6), "value": 1.5}),
             ((), {"dtype": "i32", "shape": (3, 5), "value": 2})],
    "iota": [((), {"dtype": "i32", "shape": (4, 6), "axis": 1}), ((), {"dtype": "f32", "shape": (3, 5), "axis": 0})],
    "take": [(("f32[6, 4]", "i32[3]"), {"axis": 0}), (("f32[3, 5]", "i32[2]"), {"axis": 1})],
    "shard": [(("f32[4, 6]",), {"sharding": Sharding((("a",), ()))}),
              (("f32[3, 5]",), {"sharding": Sharding(((), ("b", "a")))})],
    "transpose": [(("f32[4, 6]",), {"perm": (1, 0)}), (("f32[3, 5]",), {"perm": (1, 0)})],
    "reshape": [(("f32[4, 6]",), {"shape": (2, 12)}), (("f32[3, 5]",), {"shape": (15,)})],
    "broadcast_in_dim": [(("f32[6]",), {"shape": (4, 6), "dims": (1,)}),
                         (("f32[3, 1]",), {"shape": (3, 5), "dims": (0, 1)})],
    "slice": [(("f32[4, 6]",), {"starts": (0, 1), "stops": (4, 5), "steps": (1, 1)}),
              (("f32[3, 5]",), {"starts": (1, 0), "stops": (3, 5), "steps": (1, 2)})],
    "pad": [(("f32[4, 6]",), {"lo": (0, 1), "hi": (1, 0), "value": 0.0}),
            (("f32[3, 5]",), {"lo": (1, 0), "hi": (0, 2), "value": 1.5})],
    "concat": [(("f32[4, 6]", "f32[4, 2]"), {"axis": 1}), (("f32[3, 5]", "f32[2, 5]"), {"axis": 0})],
    "roll": [(("f32[4, 6]",), {"shift": 2, "axis": 1}), (("f32[3, 5]",), {"shift": 1, "axis": 0})],
    "einsum": [(("f32[4, 6]", "f32[6, 2]"), {"spec": "ij,jk->ik"}),
               (("f32[3, 5]", "f32[5, 3]"), {"spec": "ij,jk->ik"})],
    "conv": [(("f32[2, 6, 2]", "f32[3, 2, 2]"), {"strides": (1,), "padding": ((1, 1),)}),
             (("f32[1, 5, 3]", "f32[2, 3, 2]"), {"strides": (2,), "padding": ((0, 1),)}),
             # feature groups and an atrous window; a transposed conv (lhs_dilation) on an odd dim
             (("f32[2, 6, 4]", "f32[2, 2, 4]"), {"strides": (1,), "padding": ((1, 1),), "rhs_dilation": (2,),
                                                 "groups": 2}),
             (("f32[1, 5, 2]", "f32[3, 2, 2]"), {"strides": (2,), "padding": ((2, 1),), "lhs_dilation": (3,)})],
}
for _op in ("reduce_sum", "reduce_prod", "reduce_max", "reduce_min"):
    INSTANCES[_op] = [(("f32[4, 6]",), {"axes": (1,)}), (("f32[3, 5]",), {"axes": (0, 1)})]
for _op in ("argmax", "argmin"):
    INSTANCES[_op] = [(("f32[4, 6]",), {"axis": 1}), (("f32[3, 5]",), {"axis": 0})]
for _op in ("cumsum", "cumprod", "cummax"):
    INSTANCES[_op] = [(("f32[4, 6]",), {"axis": 1, "reverse": False}), (("f32[3, 5]",), {"axis": 0, "reverse": True})]
for _op in ("sort", "argsort"):
    INSTANCES[_op] = [(("f32[4, 6]",), {"axis": 1}), (("f32[3, 5]",), {"axis": 0})]
INSTANCES.update({
    "top_k": [(("f32[4, 6]",), {"k": 2}), (("f32[3, 5]",), {"k": 3})],
    "take_along_axis": [(("f32[4, 6]", "i32[4, 3]"), {"axis": 1}), (("f32[3, 5]", "i32[2, 5]"), {"axis": 0})],
    "scatter_add": [(("f32[6, 4]", "i32[3]", "f32[3, 4]"), {"axis": 0}),
                    (("f32[3, 5]", "i32[2]", "f32[3, 2]"), {"axis": 1})],
    **{op: [(("f32[6, 4]", "i32[3]", "f32[3, 4]"), {"axis": 0}), (("i32[3, 5]", "i32[2]", "i32[3, 2]"), {"axis": 1})]
       for op in ("scatter_max", "scatter_min")},
    "pool": [(("f32[2, 6, 4, 2]",), {"reduce": "max", "window": (3, 2), "strides": (1, 2),
                                     "padding": ((1, 1), (0, 0))}),
             (("f32[1, 5, 3]",), {"reduce": "sum", "window": (2,), "strides": (2,), "padding": ((0, 1),)}),
             # a sum pool's gradient (lhs_dilation: the transposed pool) and a dilated max pool
             (("f32[1, 5, 3]",), {"reduce": "sum", "window": (2,), "strides": (1,), "padding": ((1, 1),),
                                  "lhs_dilation": (2,)}),
             (("f32[2, 3, 4, 2]",), {"reduce": "max", "window": (3, 2), "strides": (2, 1),
                                     "padding": ((1, 0), (0, 1)), "lhs_dilation": (3, 2)})],
    # a max pool's gradient: overlapping windows with padding (halos on the operand and the
    # source), and a 2x2 stride-2 one
    "select_and_scatter_add": [(("f32[2, 3, 4, 2]", "f32[2, 6, 4, 2]"), {"window": (3, 2), "strides": (2, 1),
                                                                          "padding": ((1, 1), (0, 1))}),
                               (("f32[1, 3, 2, 3]", "f32[1, 6, 5, 3]"), {"window": (2, 2), "strides": (2, 2),
                                                                         "padding": ((0, 0), (0, 0))})],
    # starts are drawn from [0, 4): clamped where the window would not fit (start 3 of a 3-wide
    # window in 5); windows of one element and wider ones that straddle shard boundaries
    "dynamic_slice": [(("f32[6, 4]", "i32[]", "i32[]"), {"sizes": (1, 4)}),
                      (("f32[5, 3]", "i32[]", "i32[]"), {"sizes": (3, 2)})],
    "dynamic_update_slice": [(("f32[6, 4]", "f32[1, 4]", "i32[]", "i32[]"), {}),
                             (("f32[5, 3]", "f32[3, 2]", "i32[]", "i32[]"), {})],
    "random": [(("i32[]", "i32[4, 6]"), {"dist": "uniform", "dtype": "f32"}),
               (("i32[]", "i32[3, 5]"), {"dist": "normal", "dtype": "f32"})],
    # jax.random's draws: every layout of the result is drawn locally (counters of global indices)
    "random_draw": [(("u32[2]",), {"dist": "uniform", "dtype": "f32", "shape": (4, 6), "minval": -1.0, "maxval": 2.0}),
                    (("u32[2]",), {"dist": "bits", "dtype": "u32", "shape": (3, 5)}),
                    (("u32[2]",), {"dist": "bernoulli", "dtype": "bool", "shape": (3, 5), "p": 0.3})],
})


def instances(name: str):
    """Explicit instances, else the op's own example with its operands resized (elementwise ops)."""
    if name in INSTANCES:
        return INSTANCES[name]
    op = registry.get(name)
    texts, attrs = op.example
    assert op.family == registry.Family.elementwise, f"{name}: give it sweep instances in INSTANCES"
    return [(tuple(str(TensorType.parse(t).with_shape(shape)) for t in texts), attrs)
            for shape in _ELEMENTWISE_SHAPES]


def layouts(t: TensorType):
    """Every sharding of an operand: each mesh axis on some dim (any order within a dim) or unused;
    a float operand may owe a pending sum over any subset of the unused axes."""
    names = MESH.names
    for place in itertools.product(range(-1, t.rank), repeat=len(names)):
        per_dim = [[a for a, d in zip(names, place) if d == i] for i in range(t.rank)]
        free = [a for a, d in zip(names, place) if d == -1]
        for orders in itertools.product(*(itertools.permutations(p) for p in per_dim)):
            dims = tuple(tuple(o) for o in orders)
            if any(MESH.group_size(d) > n for d, n in zip(dims, t.shape)):
                continue  # never more shards than elements
            subsets = [()]
            if is_float(t.dtype):
                subsets = [c for k in range(len(free) + 1) for c in itertools.combinations(free, k)]
            for partial in subsets:
                yield Sharding(dims, tuple(partial))


def _input(t: TensorType, rng) -> np.ndarray:
    if t.dtype == "bool":
        return rng.random(t.shape) < 0.5
    if t.dtype in ("i32", "i64"):
        return rng.integers(0, 4, size=t.shape).astype(np_dtype(t.dtype))
    return (rng.standard_normal(t.shape) + rng.choice([-2.0, 2.0])).astype(np_dtype(t.dtype))


def _shares(array, s: Sharding, rng):
    """Per device its block of `array` under s; under a pending sum, the group's members hold
    random parts (the last member the rest), which add up to the block."""
    if not s.partial:
        return scatter(array, s, MESH)
    k = MESH.group_size(s.partial)
    parts = [p.astype(array.dtype) for p in rng.standard_normal((k - 1,) + array.shape)]
    parts.append((array.astype(np.float64) - sum(p.astype(np.float64) for p in parts)).astype(array.dtype))
    blocks = [scatter(part, Sharding(s.dims), MESH) for part in parts]
    return [blocks[MESH.group_index(pos, s.partial)][pos] for pos in range(MESH.size)]


def check(name: str, texts, attrs, shardings, rng) -> None:
    types = [TensorType.parse(t) for t in texts]
    params = tuple(Param(Value(t, f"x{i}"), f"x{i}", Sharding(s.dims), None) for i, (t, s) in
                   enumerate(zip(types, shardings)))
    b = Builder()
    results = b.emit_op(name, [p.value for p in params], attrs)
    prog = Program("main", MESH, params, tuple(b.ops), tuple(Result(r, None) for r in results))
    prop = propagate(prog)
    for p, s in zip(params, shardings):
        prop.shardings[p.value] = s  # the operand arrives in exactly this layout, pending sum included
    spmd = finish(partition(prog, prop))
    verify(spmd.program)
    inputs = {p.name: _input(p.value.type, rng) for p in params}
    ref = run_global(prog, inputs)
    got = run_shards(spmd, [_shares(inputs[p.name], s, rng) for p, s in zip(params, shardings)])
    for i, (r, g) in enumerate(zip(ref, got)):
        tol = 2e-2 if "bf16" in (str(r.dtype), str(g.dtype)) else 1e-5
        err, ok = _compare(r, g, tol, tol)
        assert ok, (f"{name} {list(texts)} {dict(attrs)} with operands {[str(s) for s in shardings]}: "
                    f"result {i} off by {err}\n{print_program(spmd.program)}")


def sweep(name: str) -> int:
    rng = np.random.default_rng(0)
    n = 0
    for texts, attrs in instances(name):
        types = [TensorType.parse(t) for t in texts]
        for shardings in itertools.product(*(list(layouts(t)) for t in types)):
            check(name, texts, attrs, shardings, rng)
            n += 1
    return n


GLOBAL_OPS = [name for name, op in registry.OPS.items() if not op.local_only]
# one of each family and kind of custom partition step, in the default run
# (select, with three operands, alone takes 7,000 cases: --runslow)
DEFAULT = ("neg", "exp", "mul", "cast", "full", "iota", "take", "shard", "transpose", "reshape",
           "broadcast_in_dim", "slice", "pad", "concat", "roll", "reduce_sum", "reduce_max", "argmax", "einsum",
           "cumsum", "top_k", "sort", "take_along_axis", "scatter_add", "scatter_max", "pool", "select_and_scatter_add",
           "conv",
           "dynamic_slice",
           "dynamic_update_slice")


@pytest.mark.parametrize("name", DEFAULT)
def test_sweep(name):
    assert sweep(name) > 0


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in GLOBAL_OPS if n not in DEFAULT])
def test_sweep_all(name):
    assert sweep(name) > 0


def test_layouts_are_every_placement():
    """11 placements of two axes on a rank-2 tensor, 18 with the pending sums of free axes."""
    t = TensorType("f32", (4, 6))
    assert len({Sharding(s.dims) for s in layouts(t)}) == 11
    assert len(list(layouts(t))) == 18
    assert len(list(layouts(TensorType("i32", (4, 6))))) == 11


def test_every_global_op_is_swept():
    assert set(DEFAULT) <= set(GLOBAL_OPS)
    for name in GLOBAL_OPS:
        assert instances(name)
