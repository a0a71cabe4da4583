"""Reshards over several mesh axes, every pair: on the mesh [x=2, y=2, z=2], every layout of a
rank-2 tensor (each axis splitting one of the dims, in any order within a dim, or left out: 49
layouts) to every other, and a seeded sample of rank-3 pairs, as tests/test_sweep.py sweeps ops.

For every pair the plan (partition.reshard.plan_reshard) must be a chain of layouts from the
source to the target, and on an evenly divisible shape:
  - gather only axes that disappear (an axis that stays or moves to another dim is never gathered);
  - at most one all_to_all per axis that changes place (its dim, or its position within the
    dim: {(y, z), _} -> {z, y} is cheapest as two all_to_alls), at most two permutes;
  - send no more bytes than the plan the resharding table is built from: slice the axes that
    appear, then for each group of axes moving between the same two dims one permute (to bring
    them to the minor side) and one all_to_all, one permute to bring the disappearing axes to
    the minor side, their gather, and one permute to the target's axis order (_bound).
On the simulator (which fills padding with NaN) the resharded value must equal the input, on
the even shape and on one that no shard count divides; a sample runs by default, every pair
with --runslow. On jax, a deterministic sample (every pair: --runslow). Against XLA's compiled
HLO, the issue's reproductions and a seeded sample: bytes per device no more than XLA's.
"""

from __future__ import annotations

import itertools
import random
import sys
from math import prod
from pathlib import Path

import pytest

import spmdlang
from spmdlang.ir.mesh import Mesh, Sharding
from spmdlang.partition.reshard import plan_cost, plan_reshard

MESH = Mesh.make({"x": 2, "y": 2, "z": 2})
F32 = 4


def two_axis_layouts(names, rank: int = 2) -> list[Sharding]:
    """Every layout of a rank-`rank` value over the mesh axes `names` (two or three of them): each
    axis on one dim or none, in every order within a dim."""
    out = []
    for place in itertools.product(range(-1, rank), repeat=len(names)):
        per_dim = [[a for a, d in zip(names, place) if d == i] for i in range(rank)]
        for orders in itertools.product(*(itertools.permutations(p) for p in per_dim)):
            out.append(Sharding(tuple(tuple(o) for o in orders)))
    return out


def layouts(rank: int) -> list[Sharding]:
    return two_axis_layouts(MESH.names, rank)


RANK2 = layouts(2)
PAIRS2 = [(s, d) for s in RANK2 for d in RANK2 if s != d]
_rank3 = layouts(3)
PAIRS3 = random.Random(3).sample([(s, d) for s in _rank3 for d in _rank3 if s != d], 300)


def text(s: Sharding) -> str:
    return "{" + ", ".join("_" if not d else d[0] if len(d) == 1 else "(" + ", ".join(d) + ")" for d in s.dims) + "}"


def dim_of(s: Sharding, a: str):
    return next((i for i, d in enumerate(s.dims) if a in d), None)


def place(s: Sharding, a: str):
    """(dim, position within the dim) of axis a."""
    d = dim_of(s, a)
    return d, s.dims[d].index(a)


def _bound(shape, src: Sharding, dst: Sharding) -> float:
    """Bytes of the plan in the module docstring (even shapes)."""
    size = lambda axes: prod(MESH.axis_size(a) for a in axes)  # noqa: E731
    appear = [a for a in dst.used_axes() if a not in src.used_axes()]
    gone = [a for a in src.used_axes() if a not in dst.used_axes()]
    local = prod(src.local_shape(shape, MESH)) * F32 / size(appear)
    groups: dict = {}
    for a in src.used_axes():
        if a in dst.used_axes() and dim_of(src, a) != dim_of(dst, a):
            groups.setdefault((dim_of(src, a), dim_of(dst, a)), []).append(a)
    moves = sum(local + (size(g) - 1) / size(g) * local for g in groups.values())
    g = size(gone)
    return 2 * local + moves + (g - 1) * local + g * local


def check_plan(shape, src: Sharding, dst: Sharding, even: bool):
    steps = plan_reshard(shape, F32, MESH, src, dst)
    assert steps[0].before.dims == src.dims and steps[-1].after.dims == dst.dims
    for s, t in zip(steps, steps[1:]):
        assert s.after.dims == t.before.dims
    if not even:
        return steps
    what = f"{text(src)} -> {text(dst)}: {[(s.kind, s.axes, s.bytes) for s in steps]}"
    gone = set(src.used_axes()) - set(dst.used_axes())
    for s in steps:
        if s.kind == "all_gather":
            assert set(s.axes) <= gone, f"gathers an axis that stays: {what}"
    movers = [a for a in src.used_axes() if a in dst.used_axes() and place(src, a) != place(dst, a)]
    kinds = [s.kind for s in steps]
    assert kinds.count("all_to_all") <= len(movers), what
    assert kinds.count("collective_permute") <= 2, what
    assert plan_cost(steps) <= _bound(shape, src, dst) + 1e-9, what
    return steps


def test_every_rank2_pair_plans_within_the_bound():
    for src, dst in PAIRS2:
        check_plan((8, 8), src, dst, even=True)


@pytest.mark.slow
def test_every_rank2_pair_plans_within_the_bound_where_bytes_dominate():
    for src, dst in PAIRS2:
        check_plan((64, 64), src, dst, even=True)


def test_rank3_sample_plans_within_the_bound():
    for src, dst in PAIRS3:
        check_plan((8, 8, 8), src, dst, even=True)


def test_uneven_pairs_are_chains():
    for src, dst in PAIRS2:
        check_plan((6, 10), src, dst, even=False)
    for src, dst in PAIRS3[:100]:
        check_plan((3, 6, 5), src, dst, even=False)


def program(shape, src: Sharding, dst: Sharding) -> str:
    dims = ", ".join(map(str, shape))
    return (f"mesh [x=2, y=2, z=2]\nfunc main(t: f32[{dims}] {text(src)}) -> f32[{dims}] {text(dst)} {{\n"
            f"  return shard(t, {text(dst)})\n}}\n")


def check_run(shape, src: Sharding, dst: Sharding, backends=("ref", "sim")):
    """The program's one reshard is the plan, and it returns its input on every backend."""
    c = spmdlang.compile(program(shape, src, dst))
    plan = [s for s in plan_reshard(shape, F32, MESH, src, dst) if s.is_collective]
    # a boundary fix before a gather is one step of one permute per piece
    want = [(s.kind, s.axes) for s in plan for _ in (s.prefix[2] if s.prefix else [0])]
    assert [(e.kind, tuple(e.axes)) for e in c.spmd.ledger] == want
    d = c.diff(backends=list(backends))
    assert d["ok"], f"{text(src)} -> {text(dst)} on {shape}: {d['results']}\n{c.spmd_ir}"
    return c


SHAPES = [(8, 8), (6, 10)]  # even; no shard count of 2, 4 or 8 divides 10 or 6 evenly past 2


def _sample(pairs, n, seed):
    return random.Random(seed).sample(pairs, n)


@pytest.mark.parametrize("shape", SHAPES)
def test_sim_sample(shape):
    for src, dst in _sample(PAIRS2, 60, 1):
        check_run(shape, src, dst)
    for src, dst in _sample(PAIRS3, 15, 2):
        check_run(shape + (4,), src, dst)


@pytest.mark.slow
@pytest.mark.parametrize("shape", SHAPES)
def test_sim_every_pair(shape):
    for src, dst in PAIRS2:
        check_run(shape, src, dst)


S = lambda *dims: Sharding(tuple(() if d is None else (d,) if isinstance(d, str) else d for d in dims))  # noqa: E731

# the issue's reproductions: a move over several axes with an order change, an unmerge
REPRODUCTIONS = [(S("x", ("y", "z")), S(("y", "x"), "z")), (S(("x", "y"), None), S("x", "y")),
                 (S(None, ("x", "y")), S("y", "x"))]


@pytest.mark.parametrize("shape", SHAPES)
def test_jax_sample(shape):
    for src, dst in REPRODUCTIONS + _sample(PAIRS2, 3, 4):
        check_run(shape, src, dst, backends=("ref", "jax"))


@pytest.mark.slow
@pytest.mark.parametrize("shape", SHAPES)
def test_jax_every_pair(shape):
    for src, dst in PAIRS2:
        check_run(shape, src, dst, backends=("ref", "jax"))


def test_reproduction_is_one_all_to_all_and_one_permute():
    steps = [s for s in plan_reshard((8, 8), F32, MESH, *REPRODUCTIONS[0]) if s.is_collective]
    assert [s.kind for s in steps] == ["all_to_all", "collective_permute"]
    assert plan_cost(steps) == 16 + 32
    steps = plan_reshard((8, 8), F32, MESH, *REPRODUCTIONS[1])
    assert [(s.kind, s.axes) for s in steps] == [("all_to_all", ("y",))]


def _xla_bytes(c) -> tuple[int, int]:
    sys.path.insert(0, str(Path(__file__).parent))
    from plan_ledger import xla

    got = xla(c)
    return got["collectives"], got["bytes"]


def _against_xla(pairs, shape):
    for src, dst in pairs:
        c = spmdlang.compile(program(shape, src, dst))
        ours = sum(e.bytes_per_device for e in c.spmd.ledger)
        n, theirs = _xla_bytes(c)
        assert ours <= theirs, f"{text(src)} -> {text(dst)}: {ours} bytes, XLA {theirs}\n{c.spmd_ir}"


# uneven shards that do not nest (f32[6, 10]): gather the minor axis, then fix the block boundaries
# with one permute, as XLA does, where gathering the whole dim sent up to twice XLA's bytes
UNEVEN_FIXES = [(S(("y", "z"), None), S("y", None)), (S(None, ("z", "y")), S(None, "x")),
                (S("y", ("x", "z")), S("z", "y")), (S("z", ("y", "x")), S(None, "y")),
                (S(("z", "x"), "y"), S("y", "z")), (S(None, ("y", "x")), S(None, "z")),
                (S(None, ("z", "y", "x")), S(None, "z")), (S(None, ("z", "y", "x")), S(None, "y"))]


def test_bytes_against_xla_sample():
    _against_xla(REPRODUCTIONS + _sample(PAIRS2, 4, 5), (8, 8))
    _against_xla(UNEVEN_FIXES, (6, 10))


def test_boundary_fix_is_a_gather_of_one_axis_and_one_permute():
    steps = plan_reshard((6, 10), F32, MESH, *UNEVEN_FIXES[0])
    # {(y, z), _} -> {y, _} on 6 rows: gathering z leaves y-blocks of rows [0, 4) and [4, 6); row 3
    # crosses into y=1's chunk [3, 6): 80 B gathered, 40 B permuted (gathering (y, z) whole: 240 B)
    assert [(s.kind, s.axes, s.bytes) for s in steps] == [("all_gather", ("z",), 80),
                                                          ("collective_permute", ("y",), 40)]


def test_boundary_fix_before_the_gather():
    steps = plan_reshard((6, 10), F32, MESH, *UNEVEN_FIXES[6])
    # {_, (z, y, x)} -> {_, z} on 10 columns: gathering (y, x) would leave z-blocks [0, 8), [8, 10)
    # and 3 columns to move after it (72 B); shifting z=1's fine shards back 3 columns first moves
    # one column from the shard two back and one from the shard before (24 + 24 B), then the
    # gather leaves [5, 10) first in z=1's block: XLA's 192 B
    assert [(s.kind, s.axes, s.bytes) for s in steps] == [("collective_permute", ("z", "y", "x"), 48),
                                                          ("all_gather", ("y", "x"), 144)]
    assert steps[0].prefix == (3, 1, ((-2, 1, 2), (-1, 0, 1)))


@pytest.mark.parametrize("shape", SHAPES[1:] + [(7, 10), (3, 9), (5, 11), (3, 13)])
def test_boundary_fix_runs(shape):
    """NaN in every padding element (sim) and jax: the fixed blocks hold exactly the input."""
    for src, dst in UNEVEN_FIXES:
        check_run(shape, src, dst, backends=("ref", "sim", "jax") if shape == (6, 10) else ("ref", "sim"))
    fixes = [s for src, dst in UNEVEN_FIXES for s in plan_reshard((6, 10), F32, MESH, src, dst)]
    assert any(s.block for s in fixes) and any(s.prefix for s in fixes)


@pytest.mark.slow
def test_bytes_against_xla_uneven():
    """120 random pairs on f32[6, 10], where the shard counts 4 and 8 do not nest in 2."""
    for src, dst in _sample(PAIRS2, 120, 25) + _sample(PAIRS2, 120, 7):
        c = spmdlang.compile(program((6, 10), src, dst))
        ours = sum(e.bytes_per_device for e in c.spmd.ledger)
        _, theirs = _xla_bytes(c)
        assert ours <= theirs, f"{text(src)} -> {text(dst)}: {ours} bytes, XLA {theirs}\n{c.spmd_ir}"


@pytest.mark.slow
def test_bytes_against_xla_wide_sample():
    _against_xla(_sample(PAIRS2, 200, 6), (8, 8))
    _against_xla(_sample(PAIRS3, 40, 7), (8, 8, 8))


def partial_program(shape, src: Sharding, partial: tuple[str, ...], dst: Sharding) -> str:
    """The value arrives as a pending sum over `partial`: the sum over a leading dim split there."""
    dims = ", ".join(map(str, shape))
    lead = partial[0] if len(partial) == 1 else "(" + ", ".join(partial) + ")"
    k = MESH.group_size(partial)
    return (f"mesh [x=2, y=2, z=2]\nfunc main(t: f32[{k + 1}, {dims}] {{{lead}, {text(src)[1:]}) -> "
            f"f32[{dims}] {text(dst)} {{\n  return shard(sum(t, axis=0), {text(dst)})\n}}\n")


@pytest.mark.parametrize("shape", SHAPES)
def test_pending_sums_sample(shape):
    """Sources that owe a sum over the axes they leave free: settled by reduce_scatters where the
    target splits those axes, all_reduces where it does not, moved before or after."""
    cases = [(s, d) for s, d in PAIRS2 if len(s.used_axes()) < 3]
    for src, dst in _sample(cases, 25, 8):
        free = tuple(a for a in MESH.names if a not in src.used_axes())
        partial = free[:1] if len(src.used_axes()) == 1 else free
        steps = plan_reshard(shape, F32, MESH, src.with_partial(partial), dst)
        assert steps[-1].after.dims == dst.dims and not steps[-1].after.partial
        c = spmdlang.compile(partial_program(shape, src, partial, dst))
        d = c.diff(backends=["ref", "sim"])
        assert d["ok"], f"{text(src)} partial{partial} -> {text(dst)} on {shape}: {d['results']}\n{c.spmd_ir}"


# axes from two dims into one: one all_to_all over both, splitting the joined dim in turn
INTO_ONE = [(S("x", "y", None), S(None, None, ("x", "y"))), (S("x", "y", "z"), S(None, None, ("z", "x", "y"))),
            (S("x", "y", "z"), S(None, None, ("x", "y", "z"))), (S("x", None, "y"), S(None, ("y", "x"), None))]


def test_axes_from_two_dims_into_one_move_in_one_all_to_all():
    got = [[(s.kind, s.axes, s.bytes) for s in plan_reshard((8, 8, 8), F32, MESH, src, dst)] for src, dst in INTO_ONE]
    # f32[4, 4, 8] per device: 3/4 of it in one all_to_all, where two over 2 sent 1/2 + 1/2 of it
    assert got[0] == [("all_to_all", ("x", "y"), 384)]
    assert got[1] == [("all_to_all", ("x", "y"), 192)]
    # z leaves dim 2 first (to dim 1), then x, y and z in one all_to_all: 128 + 224, not 3 (448)
    assert got[2] == [("all_to_all", ("z",), 128), ("all_to_all", ("x", "y", "z"), 224)]
    assert got[3] == [("all_to_all", ("y", "x"), 384)]


@pytest.mark.parametrize("shape", [(8, 8, 8), (6, 10, 4)])
def test_axes_into_one_dim_run(shape):
    for src, dst in INTO_ONE:
        check_run(shape, src, dst, backends=("ref", "sim", "jax"))
    _against_xla(INTO_ONE, shape)


# ---------------------------------------------------------------------------------- sub-axes
# On [x=4, y=2] (and [x=2, y=4]) XLA splits the axis of 4 into 2x2 subgroups and moves only what
# must move: {_, x} -> {_, y} on f32[6, 10] relabels the split over (x:2:2, x:1:2) to (y, x:2:2)
# (a permute), fixes the block boundaries and gathers x:2:2 alone: 168 B where gathering x sends
# 216. The planner searches those sub-axes too (partition.reshard._sub_axes); a gather or an
# all_to_all over a sub-axis runs as permutes over its mesh axis (ir.collectives._by_shifts).

TWO_AXES = ["x=4, y=2", "x=2, y=4"]
PAIRS_XY = [(s, d) for s in two_axis_layouts(("x", "y")) for d in two_axis_layouts(("x", "y")) if s != d]


def mesh_program(mesh: str, shape, src: Sharding, dst: Sharding) -> str:
    return program(shape, src, dst).replace("mesh [x=2, y=2, z=2]", f"mesh [{mesh}]")


def swap(s: Sharding) -> Sharding:
    """The same layout with x and y exchanged: [x=4, y=2]'s pair is [x=2, y=4]'s swapped pair."""
    return Sharding(tuple(tuple({"x": "y", "y": "x"}[a] for a in d) for d in s.dims))


# every pair of [x=4, y=2] where the whole-axis plans sent more bytes than XLA (f32[6, 10] and
# f32[8, 8]; f32[7, 9] had none): ours before -> XLA's
SUB_AXIS_PAIRS = [((6, 10), S(None, "x"), S(None, "y")),  # 216 -> 168: permute, fix, gather x:2:2
                  ((6, 10), S("y", "x"), S(None, "y")),  # 168 -> 156
                  ((8, 8), S("y", None), S("x", "y")),  # 64 -> 32: slices over x's sub-axes, one permute
                  ((8, 8), S(None, "y"), S("y", "x")),  # 64 -> 32
                  ((8, 8), S("x", "y"), S("y", None)),  # 160 -> 128: permute, gather x:2:2, then x:1:2
                  ((8, 8), S("y", "x"), S(None, "y")),  # 160 -> 128
                  ((8, 8), S("x", "y"), S("y", "x")),  # 80 -> 48: all_to_all over x:1:2, one permute
                  ((8, 8), S("y", "x"), S("x", "y"))]  # 80 -> 48


def _sub_cases():
    return [(mesh, shape, s if mesh == TWO_AXES[0] else swap(s), d if mesh == TWO_AXES[0] else swap(d))
            for mesh in TWO_AXES for shape, s, d in SUB_AXIS_PAIRS]


def _ours(c) -> float:
    return sum(e.bytes_per_device for e in c.spmd.ledger)


def test_sub_axis_plans_send_no_more_than_xla():
    for mesh, shape, src, dst in _sub_cases():
        c = spmdlang.compile(mesh_program(mesh, shape, src, dst))
        _, theirs = _xla_bytes(c)
        assert _ours(c) <= theirs, f"[{mesh}] {text(src)} -> {text(dst)}: {_ours(c)} bytes, XLA {theirs}\n{c.spmd_ir}"
        sizes = dict((a.split("=")[0].strip(), int(a.split("=")[1])) for a in mesh.split(","))
        steps = plan_reshard(shape, F32, Mesh.make(sizes), src, dst)
        assert any(":" in str(st.after) for st in steps), f"{text(src)} -> {text(dst)}: no sub-axis"


def test_sub_axis_plans_match_xlas():
    """XLA's plans, read from its HLO (source_target_pairs, replica groups of 2 within x)."""
    mesh = Mesh.make({"x": 4, "y": 2})
    plan = lambda shape, s, d: [(st.kind, st.axes, st.bytes) for st in plan_reshard(shape, F32, mesh, s, d)]  # noqa: E731
    assert plan((6, 10), *SUB_AXIS_PAIRS[0][1:]) == [("collective_permute", ("x", "y"), 72),
                                                      ("collective_permute", ("y", "x:2:2"), 24),
                                                      ("all_gather", ("x:2:2",), 72)]
    assert plan((8, 8), *SUB_AXIS_PAIRS[2][1:]) == [("shard_slice", ("x:2:2",), 0), ("shard_slice", ("x:1:2",), 0),
                                                    ("collective_permute", ("x", "y"), 32)]
    assert plan((8, 8), *SUB_AXIS_PAIRS[4][1:]) == [("collective_permute", ("x", "y"), 32),
                                                    ("all_gather", ("x:2:2",), 32), ("all_gather", ("x:1:2",), 64)]
    assert plan((8, 8), *SUB_AXIS_PAIRS[6][1:]) == [("all_to_all", ("x:1:2",), 16),
                                                    ("collective_permute", ("x", "y"), 32)]


@pytest.mark.parametrize("shape", [(6, 10), (8, 8), (7, 9), (5, 11), (3, 13)])
def test_sub_axis_plans_run(shape):
    """NaN in every padding element (sim), and jax on two shapes: each pair returns its input."""
    backends = ["ref", "sim", "jax"] if shape in ((6, 10), (8, 8)) else ["ref", "sim"]
    for mesh, _, src, dst in _sub_cases():
        c = spmdlang.compile(mesh_program(mesh, shape, src, dst))
        d = c.diff(backends=backends)
        assert d["ok"], f"[{mesh}] {text(src)} -> {text(dst)} on {shape}: {d['results']}\n{c.spmd_ir}"


def test_sub_axes_only_where_an_axis_composes():
    """[x=2, y=2, z=2] has no composite axis: no sub-axis search; [x=8, y=4] has 5 prime atoms, past
    SUB_ATOMS, and pending sums are settled over whole axes: the whole-axis plans stand."""
    from spmdlang.partition.reshard import _sub_axes

    assert _sub_axes(MESH, S("x", "y"), S("y", "x")) == {}
    assert _sub_axes(Mesh.make({"x": 8, "y": 4}), S("x", "y"), S("y", "x")) == {}
    assert _sub_axes(Mesh.make({"x": 4, "y": 2}), S("x", "y"), S("y", "x")) == {"x": ("x:2:2", "x:1:2")}
    assert _sub_axes(Mesh.make({"x": 4, "y": 2}), S(None, "x").with_partial(("y",)), S("y", None)) == {}


@pytest.mark.slow
@pytest.mark.parametrize("mesh", TWO_AXES)
@pytest.mark.parametrize("shape", [(6, 10), (8, 8), (7, 9)])
def test_every_two_axis_pair_against_xla(mesh, shape):
    """Every pair of the 110 (11 layouts of a rank-2 tensor over two axes): bytes <= XLA's, and the
    value comes back on the simulator."""
    for src, dst in PAIRS_XY:
        c = spmdlang.compile(mesh_program(mesh, shape, src, dst))
        _, theirs = _xla_bytes(c)
        assert _ours(c) <= theirs, f"[{mesh}] {text(src)} -> {text(dst)}: {_ours(c)} bytes, XLA {theirs}\n{c.spmd_ir}"
        d = c.diff(backends=["ref", "sim"])
        assert d["ok"], f"[{mesh}] {text(src)} -> {text(dst)} on {shape}: {d['results']}\n{c.spmd_ir}"


def test_sub_axes_of_three_run():
    """[x=6, y=2]: x is (x:3:2, x:1:3); a gather and an all_to_all over x:1:3 are two permutes each
    (the member order rebuilt from the doubled pieces), on the simulator with NaN padding."""
    mesh = Mesh.make({"x": 6, "y": 2})
    cases = [((12, 12), S("x", "y"), S("y", "x"), "all_to_all"), ((12, 12), S("x", "y"), S("y", None), "all_gather"),
             ((7, 13), S(None, "x"), S(None, "y"), "all_gather"), ((7, 13), S("y", "x"), S(None, None), "all_gather")]
    for shape, src, dst, kind in cases:
        steps = plan_reshard(shape, F32, mesh, src, dst)
        assert (kind, ("x:1:3",)) in [(st.kind, st.axes) for st in steps], (text(src), text(dst), steps)
        c = spmdlang.compile(mesh_program("x=6, y=2", shape, src, dst))
        assert _ours(c) == plan_cost(steps)
        d = c.diff(backends=["ref", "sim"])
        assert d["ok"], f"{text(src)} -> {text(dst)} on {shape}: {d['results']}\n{c.spmd_ir}"


@pytest.mark.parametrize("mesh", ["[y=2, x=4] devices [3, 0, 6, 2, 1, 4, 7, 5]",
                                  "[x=4, y=2] devices [5, 7, 1, 0, 2, 6, 3, 4]"])
def test_sub_axis_permutes_pair_the_same_devices_in_jax(mesh):
    """On a mesh in another device order (and axis order), every permute of a sub-axis plan pairs
    in XLA's compiled module the devices the simulator pairs, and the value comes back."""

    from permute_check import permute_ops, simulated_and_compiled_pairs

    for shape, src, dst in [((6, 10), S(None, "x"), S(None, "y")), ((8, 8), S("x", "y"), S("y", "x")),
                            ((8, 8), S("x", "y"), S("y", None)), ((8, 8), S("y", None), S("x", "y"))]:
        c = spmdlang.compile(program(shape, src, dst).replace("mesh [x=2, y=2, z=2]", f"mesh {mesh}"))
        ops = permute_ops(c)
        assert ops and any(":" in str(op.attrs["rule"]) for op in ops), c.spmd_ir
        inputs = c.random_inputs(0)
        want, got = simulated_and_compiled_pairs(c, inputs)
        assert got == want, f"{text(src)} -> {text(dst)}\n{c.spmd_ir}"
        d = c.diff(inputs, backends=["ref", "sim", "jax"])
        assert d["ok"], f"{text(src)} -> {text(dst)}: {d['results']}"


@pytest.mark.parametrize("sizes", [{"x": 2, "y": 2, "z": 2}, {"x": 4, "y": 2}, {"x": 2, "y": 3}])
@pytest.mark.parametrize("shape", [(8, 8, 12), (7, 9, 5), (6, 10, 4)])
def test_a_reshard_to_fewer_axes_skips_the_search_and_keeps_its_plan(monkeypatch, sizes, shape):
    """_least_possible skips the searches where the target only drops axes: the plan must be
    the one the searches would have kept, on every such pair (even and uneven shapes)."""
    from spmdlang.partition import reshard

    mesh = Mesh.make(sizes)
    pairs = [(s, d) for s in two_axis_layouts(mesh.names, 3) for d in two_axis_layouts(mesh.names, 3)
             if s != d and all(t == f[:len(t)] for t, f in zip(d.dims, s.dims))]
    skipped = 0
    for src, dst in pairs:
        fast = reshard._plan_reshard.__wrapped__(shape, F32, mesh.axes, src, dst)
        skipped += reshard._least_possible(list(fast), shape, F32, mesh, src, dst)
        with monkeypatch.context() as m:
            m.setattr(reshard, "_least_possible", lambda *a: False)
            full = reshard._plan_reshard.__wrapped__(shape, F32, mesh.axes, src, dst)
        assert fast == full, (text(src), text(dst))
    assert skipped > 0  # (uneven shards pad: a gather's bytes then exceed the growth, no shortcut)
