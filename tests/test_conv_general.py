"""conv as lax.conv_general_dilated: lhs_dilation (transposed conv), rhs_dilation (atrous),
groups (feature_group_count, depthwise at groups = C), batch_groups (batch_group_count) and 3-D.

The numpy implementation is checked against jax.lax on random configurations; every backend
against ref on even and uneven splits of spatial and feature dims; and the plans: split spatial
dims exchange halos (collective_permutes whose bytes scale with the window, not the image), and
feature groups split group-aligned stay local.
"""

from __future__ import annotations

import random
from collections import Counter

import jax
import numpy as np
import pytest
from test_errors import M, check
from test_more_builtins import ALL, kinds, total_bytes

import spmdlang
from spmdlang.errors import ShapeError
from spmdlang.ir.types import TensorType
from spmdlang.ir.verify import verify
from spmdlang.ops.contract import _conv_infer, _conv_jax_local, conv_attrs, conv_numpy

DIMS = {1: ("NWC", "WIO", "NWC"), 2: ("NHWC", "HWIO", "NHWC"), 3: ("NDHWC", "DHWIO", "NDHWC")}


def lax_conv(x, w, strides, padding, lhs, rhs, groups=1, batch_groups=1):
    return np.asarray(jax.lax.conv_general_dilated(
        x, w, tuple(strides), [tuple(p) for p in padding], tuple(lhs), tuple(rhs), DIMS[x.ndim - 2],
        feature_group_count=groups, batch_group_count=batch_groups))


def _draw(rng, xs, ws, attrs):
    """(result type, x, w) of a random conv configuration, or None where its shapes are invalid."""
    try:
        out = _conv_infer((TensorType("f32", xs), TensorType("f32", ws)), attrs)
    except ShapeError:
        return None
    return out, rng.standard_normal(xs).astype(np.float32), rng.standard_normal(ws).astype(np.float32)


@pytest.mark.parametrize("count", [40, pytest.param(400, marks=pytest.mark.slow)])
def test_numpy_conv_matches_lax_on_random_configurations(count):
    """1-D/2-D/3-D, strides, both dilations, negative and positive padding, feature groups
    (depthwise included) and batch groups: the op's numpy against jax.lax."""
    rng = np.random.default_rng(12 + count)
    seen = Counter()
    while sum(seen.values()) < count:
        nsp = int(rng.integers(1, 4))
        groups, batch_groups = int(rng.choice([1, 1, 2, 3])), 1
        if groups == 1 and rng.random() < 0.25:
            batch_groups = int(rng.choice([2, 3]))
        cg = int(rng.integers(1, 3))
        c = groups * cg
        if rng.random() < 0.2:  # depthwise with a channel multiplier
            groups, cg = c, 1
        f = groups * batch_groups * int(rng.integers(1, 3))
        n = batch_groups * int(rng.integers(1, 3))
        xs = (n, *(int(rng.integers(1, 7)) for _ in range(nsp)), c)
        ws = (*(int(rng.integers(1, 4)) for _ in range(nsp)), c // groups, f)
        strides = [int(rng.integers(1, 4)) for _ in range(nsp)]
        lhs = [int(rng.integers(1, 4)) for _ in range(nsp)]
        rhs = [int(rng.integers(1, 3)) for _ in range(nsp)]
        padding = [(int(rng.integers(-1, 4)), int(rng.integers(-1, 4))) for _ in range(nsp)]
        attrs = conv_attrs(strides, padding, lhs, rhs, groups, batch_groups)
        drawn = _draw(rng, xs, ws, attrs)
        if drawn is None:
            continue
        out, x, w = drawn
        got = conv_numpy(x, w, **attrs)
        want = lax_conv(x, w, strides, padding, lhs, rhs, groups, batch_groups)
        assert got.shape == want.shape == out.shape, (attrs, xs, ws)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=str((attrs, xs, ws)))
        seen[(nsp, groups > 1, batch_groups > 1, max(lhs) > 1, max(rhs) > 1)] += 1
    assert len({k[0] for k in seen}) == 3 and any(k[1] for k in seen) and any(k[2] for k in seen)


def _shape(t: str) -> str:
    return "f32[" + ", ".join(map(str, t)) + "]"


def _same(n, k, s):
    total = max((-(-n // s) - 1) * s + k - n, 0)
    return total // 2, total - total // 2


def conv_program(mesh: str, xs, xspec: str, ws, kw: dict, ospec: str, wspec: str = "") -> tuple[str, dict]:
    """A one-conv program, its result type computed from the arguments; also the lax attributes."""
    nsp = len(xs) - 2

    def per(v):
        return list(v) if isinstance(v, list) else [v] * nsp

    strides, lhs, rhs = per(kw.get("stride", 1)), per(kw.get("lhs_dilation", 1)), per(kw.get("rhs_dilation", 1))
    groups = kw.get("groups", 1)
    pad = kw.get("padding", "SAME")
    if pad == "SAME":
        pad = [_same(n, (k - 1) * r + 1, s) for n, k, s, r in zip(xs[1:-1], ws, strides, rhs)]
    elif pad == "VALID":
        pad = [(0, 0)] * nsp
    attrs = conv_attrs(strides, pad, lhs, rhs, groups)
    out = _conv_infer((TensorType("f32", tuple(xs)), TensorType("f32", tuple(ws))), attrs)
    args = ", ".join(f"{k}={v}" if not isinstance(v, str) else f'{k}="{v}"' for k, v in kw.items())
    src = (f"mesh {mesh}\nfunc main(x: {_shape(xs)} {xspec}, w: {_shape(ws)} {wspec}) -> {out} {ospec} {{\n"
           f"  return conv(x, w{', ' + args if args else ''})\n}}\n")
    return src, dict(strides=strides, padding=pad, lhs=lhs, rhs=rhs, groups=groups)


def run_conv(mesh, xs, xspec, ws, kw, ospec, wspec="", backends=ALL, seed=0):
    """Compile, check ref against jax.lax directly and every backend against ref."""
    src, lax_attrs = conv_program(mesh, xs, xspec, ws, kw, ospec, wspec)
    c = spmdlang.compile(src)
    verify(c.spmd.program)
    rng = np.random.default_rng(seed)
    inputs = {"x": rng.standard_normal(xs).astype(np.float32), "w": rng.standard_normal(ws).astype(np.float32)}
    (got,) = c.run(inputs, backend="ref")
    np.testing.assert_allclose(got, lax_conv(inputs["x"], inputs["w"], **lax_attrs), rtol=1e-4, atol=1e-4)
    d = c.diff(inputs, backends=list(backends))
    assert d["ok"], f"{d['results']}\n{src}\n{c.spmd_ir}"
    return c


# mesh, x shape, x spec, w shape, arguments, result spec: even and uneven splits of spatial dims
# and of features, 1-D/2-D/3-D, every new argument
SHARDED = [
    ("[a=2]", (2, 8, 4), "{_, a, _}", (3, 4, 4), {"rhs_dilation": 2}, "{_, a, _}"),
    ("[a=3]", (2, 8, 4), "{_, a, _}", (3, 4, 4), {"rhs_dilation": 3, "stride": 2}, "{_, a, _}"),
    ("[a=2]", (2, 8, 4), "{_, a, _}", (3, 4, 4), {"lhs_dilation": 2, "padding": [[2, 2]]}, "{_, a, _}"),
    ("[a=3]", (2, 5, 4), "{_, a, _}", (3, 4, 4), {"lhs_dilation": 2, "padding": [[1, 2]]}, "{_, a, _}"),
    ("[a=4]", (2, 7, 4), "{_, a, _}", (4, 4, 4), {"stride": 2, "lhs_dilation": 3, "padding": [[2, 1]]},
     "{_, a, _}"),
    ("[a=3]", (1, 7, 2), "{_, a, _}", (4, 2, 3), {"lhs_dilation": 2, "rhs_dilation": 2, "padding": [[3, 0]]},
     "{_, a, _}"),
    ("[a=2]", (2, 8, 4), "{_, _, a}", (3, 1, 4), {"groups": 4}, "{_, _, a}"),
    ("[a=3]", (2, 7, 6), "{_, a, _}", (3, 1, 12), {"groups": 6, "stride": 2}, "{_, a, _}"),
    ("[a=4]", (2, 8, 4), "{_, _, a}", (3, 2, 6), {"groups": 2}, "{_, _, a}"),
    ("[a=2, b=2]", (2, 9, 8), "{_, a, b}", (3, 2, 8), {"groups": 4, "rhs_dilation": 2}, "{_, a, b}"),
    ("[a=2, b=3]", (2, 7, 5, 6), "{_, a, b, _}", (3, 3, 3, 6), {"groups": 2, "padding": "VALID"},
     "{_, a, _, b}"),
    ("[a=2, b=3]", (2, 7, 5, 6, 4), "{_, a, b, _, _}", (3, 3, 2, 4, 4), {"stride": [1, 2, 1]},
     "{_, a, b, _, _}"),
    ("[a=2, b=2]", (1, 5, 6, 6, 2), "{_, a, _, b, _}", (2, 2, 2, 2, 4),
     {"lhs_dilation": 2, "padding": [[1, 1], [1, 1], [0, 1]]}, "{_, a, _, b, _}"),
    ("[a=3, b=2]", (2, 7, 4, 5, 4), "{b, a, _, _, _}", (3, 2, 3, 1, 4),
     {"groups": 4, "rhs_dilation": [2, 1, 1], "padding": "VALID"}, "{b, a, _, _, _}"),
]


@pytest.mark.parametrize("mesh, xs, xspec, ws, kw, ospec", SHARDED,
                         ids=[f"{len(c[1]) - 2}d-{'-'.join(c[4])}-{c[0]}" for c in SHARDED])
def test_conv_sharded_on_every_backend(mesh, xs, xspec, ws, kw, ospec):
    run_conv(mesh, xs, xspec, ws, kw, ospec)


def test_random_partitioned_convs_agree_with_ref():
    """Random configurations and random layouts of x, w and the result over two axes (sim vs ref)."""
    rng = random.Random(7)
    done = 0
    while done < 40:
        nsp = rng.randint(1, 3)
        g = rng.choice([1, 1, 2, 4])
        c, f = g * rng.randint(1, 2), g * rng.randint(1, 2)
        xs = (rng.randint(1, 3), *[rng.randint(2, 9) for _ in range(nsp)], c)
        ws = (*[rng.randint(1, 4) for _ in range(nsp)], c // g, f)
        kw = {"stride": [rng.choice([1, 1, 2, 3]) for _ in range(nsp)],
              "lhs_dilation": [rng.choice([1, 1, 2, 3]) for _ in range(nsp)],
              "rhs_dilation": [rng.choice([1, 1, 2]) for _ in range(nsp)], "groups": g}
        if max(kw["lhs_dilation"]) > 1 or rng.random() < 0.3:
            kw["padding"] = [[rng.randint(0, 3), rng.randint(0, 3)] for _ in range(nsp)]
        else:
            kw["padding"] = rng.choice(["SAME", "VALID"])
        sizes = {"a": rng.choice([2, 3, 4]), "b": rng.choice([2, 3])}

        def spec(rank, sizes=sizes):
            dims = ["_"] * rank
            for ax in sizes:
                d = rng.randrange(rank)
                if dims[d] == "_" and rng.random() < 0.8:
                    dims[d] = ax
            return "{" + ", ".join(dims) + "}"

        try:
            src, _ = conv_program(f"[a={sizes['a']}, b={sizes['b']}]", xs, spec(len(xs)), ws, kw,
                                  spec(len(xs)), spec(len(ws)))
        except ShapeError:
            continue
        comp = spmdlang.compile(src)
        d = comp.diff(backends=["sim"], seed=done)
        assert d["ok"], f"{d['results']}\n{src}\n{comp.spmd_ir}"
        done += 1


# ---------------------------------------------------------------------------------- plans


def _permutes_only(c) -> bool:
    return set(kinds(c)) == {"collective_permute"}


@pytest.mark.parametrize("n", [64, 256])
def test_atrous_conv_on_a_split_dim_exchanges_the_dilated_halo(n):
    """A 3-tap conv with rhs_dilation=2 reaches 2 rows on each side: 2 permutes of [8, 2, 64]
    f32 (4 KiB), whatever the image size."""
    c = run_conv("[a=4]", (8, n, 64), "{_, a, _}", (3, 64, 64), {"rhs_dilation": 2}, "{_, a, _}",
                 backends=("sim",))
    assert kinds(c) == ["collective_permute"] * 2
    assert all(e.bytes_per_device == 8 * 2 * 64 * 4 for e in c.spmd.ledger)


@pytest.mark.parametrize("n", [64, 256])
def test_transposed_conv_on_an_even_split_fetches_undilated_halo_rows(n):
    """A 2x upsampling transposed conv (lhs_dilation=2, 4 taps, padding [[2, 2]]): every shard
    starts at the same phase of the dilation, so it fetches one undilated input row from each
    neighbour and dilates locally: 2 permutes of [8, 1, 64] f32, at any image size."""
    c = run_conv("[a=4]", (8, n, 64), "{_, a, _}", (4, 64, 32), {"lhs_dilation": 2, "padding": [[2, 2]]},
                 "{_, a, _}", backends=("sim",))
    assert kinds(c) == ["collective_permute"] * 2
    assert all(e.bytes_per_device == 8 * 1 * 64 * 4 for e in c.spmd.ledger)
    assert "reshape" not in c.spmd_ir  # no local dilation before the exchange


@pytest.mark.parametrize("n", [61, 253])
def test_transposed_conv_on_an_uneven_split_exchanges_a_dilated_halo(n):
    """Uneven shards start at different phases of the dilation: the input is dilated locally
    and the halo cut from the dilated rows. Still only permutes, bytes fixed by the window."""
    c = run_conv("[a=4]", (8, n, 64), "{_, a, _}", (3, 64, 32), {"lhs_dilation": 2, "padding": [[1, 1]]},
                 "{_, a, _}", backends=("sim",))
    assert _permutes_only(c), kinds(c)
    assert total_bytes(c) <= 2 * 8 * 2 * 64 * 4
    assert "reshape" in c.spmd_ir


def test_halo_bytes_do_not_grow_with_the_image():
    for kw in ({"rhs_dilation": 3}, {"lhs_dilation": 2, "padding": [[1, 2]]}, {"groups": 64}):
        ws = (3, 1 if "groups" in kw else 64, 64)
        small = run_conv("[a=2]", (4, 32, 64), "{_, a, _}", ws, kw, "{_, a, _}", backends=("sim",))
        big = run_conv("[a=2]", (4, 512, 64), "{_, a, _}", ws, kw, "{_, a, _}", backends=("sim",))
        assert _permutes_only(small) and _permutes_only(big), (kw, kinds(small), kinds(big))
        assert total_bytes(small) == total_bytes(big), kw


def test_3d_conv_split_on_two_spatial_dims_exchanges_faces():
    """3x3x3 SAME conv of [2, 16, 16, 16, 8] over [d=2, h=2]: one face of [2, 1, 8, 16, 8] from
    each neighbour on D, then one of [2, 10, 1, 16, 8] (the D window) on H."""
    c = run_conv("[d=2, h=2]", (2, 16, 16, 16, 8), "{_, d, h, _, _}", (3, 3, 3, 8, 8), {}, "{_, d, h, _, _}",
                 backends=("sim",))
    assert _permutes_only(c), kinds(c)
    assert sorted(e.bytes_per_device for e in c.spmd.ledger) == [2 * 8 * 16 * 8 * 4] * 2 + [2 * 10 * 16 * 8 * 4] * 2


def test_depthwise_conv_with_channels_split_is_local():
    """groups = C: the channel split holds whole groups, the kernel's features follow: nothing moves."""
    c = run_conv("[m=4]", (2, 16, 8), "{_, _, m}", (5, 1, 16), {"groups": 8}, "{_, _, m}", "{_, _, m}",
                 backends=("sim",))
    assert kinds(c) == []
    assert "groups=2" in c.spmd_ir  # each shard runs 2 of the 8 groups


def test_grouped_conv_split_on_space_and_groups_moves_only_halos():
    c = run_conv("[h=2, m=2]", (2, 32, 8), "{_, h, m}", (3, 2, 8), {"groups": 4}, "{_, h, m}", "{_, _, m}",
                 backends=("sim",))
    assert _permutes_only(c), kinds(c)
    assert all(e.bytes_per_device == 2 * 1 * 4 * 4 for e in c.spmd.ledger)  # one row of 4 local channels


def test_grouped_conv_split_across_groups_falls_back_to_gathering_channels():
    """2 groups over 4 shards: a shard would hold half a group, so the channels are gathered (one
    all_gather of x) and each shard computes its features from them; the result is still right."""
    c = run_conv("[m=4]", (2, 8, 4), "{_, _, m}", (3, 2, 8), {"groups": 2}, "{_, _, m}", backends=("sim",))
    assert kinds(c) == ["all_gather"]


# ---------------------------------------------------------------------------------- errors


@pytest.mark.parametrize("call, at, fragment", [
    ("conv(x, w, lhs_dilation=2)", "2)", "needs explicit padding"),
    ('conv(x, w, lhs_dilation=2, padding="SAME")', '"SAME"', "needs explicit padding"),
    ("conv(x, w, groups=3)", "3)", "8 input channels do not divide into 3 groups"),
    ("conv(x, w, groups=0)", "0)", "groups must be a positive integer"),
    ("conv(x, w, groups=2)", "w, groups", "the kernel must be [window..., 4, F]"),
    ("conv(x, v, groups=8)", "8)", "6 output features (the kernel's last dim) do not divide into 8 groups"),
    ("conv(x, w, rhs_dilation=0)", "0)", "conv rhs_dilation must be a positive integer or a list of 1"),
    ("conv(x, w, lhs_dilation=[2, 2], padding=[[1, 1]])", "[2, 2]", "lhs_dilation must be"),
    ('conv(x, w, rhs_dilation=9, padding="VALID")', "conv", "does not fit"),
])
def test_conv_argument_errors_are_located(call, at, fragment):
    src = M + ("func main(x: f32[2, 16, 8], w: f32[3, 8, 8], v: f32[3, 1, 6]) -> f32[2, 16, 8] {\n"
               f"  return {call}\n}}\n")
    check(src, at, fragment)


def test_conv_4d_is_an_error():
    src = M + "func main(x: f32[1, 2, 2, 2, 2, 3], w: f32[1, 1, 1, 1, 3, 3]) -> f32[1] {\n  return conv(x, w)\n}\n"
    check(src, "x, w", "conv supports 1-D, 2-D and 3-D inputs")


def test_batch_groups_partition_under_random_layouts():
    """batch_groups (lax's batch_group_count, the kernel gradient of a grouped conv) has no builtin:
    the op itself, under random layouts of both operands (pending sums included), sim vs ref."""
    import itertools

    import test_sweep as S

    texts, attrs = ("f32[4, 6, 3]", "f32[2, 3, 4]"), {"strides": (1,), "padding": ((1, 0),), "batch_groups": 2}
    types = [TensorType.parse(t) for t in texts]
    combos = list(itertools.product(*(list(S.layouts(t)) for t in types)))
    rng = np.random.default_rng(0)
    for i in rng.choice(len(combos), 40, replace=False):
        S.check("conv", texts, attrs, combos[i], rng)


# An infinite kernel tap on padding: padding and lhs_dilation holes are zeros that multiply the
# kernel (0 * inf = NaN) on every backend of ours, split or not: a split conv's halo past the image
# edge is such a zero too. (jax.lax.conv's own padding skips those taps in some forms on XLA CPU,
# and the XLA baseline keeps that: docs/known_xla_issues.md.)
INF_EDGE = [
    ("[a=1]", "{_, _, _}", "SAME", 3),
    ("[a=3]", "{_, a, _}", "SAME", 3),
    ("[a=2]", "{_, a, _}", "lhs_dilation=2", 3),
    ("[a=1]", "{_, _, _}", "lhs_dilation=2", 3),
    ("[a=3]", "{_, _, a}", "SAME", 3),
    ("[a=1]", "{_, _, _, _}", "SAME", 1),  # 2-D, one channel, one feature: XLA skips the padding taps
    ("[a=2]", "{_, _, a, _}", "SAME", 1),
    ("[a=3]", "{_, _, _, a}", "SAME", 3),  # local feature 1 of 1
]


@pytest.mark.parametrize("mesh, spec, conv_args, ch", INF_EDGE,
                         ids=[f"{c[0]}{c[1]}-{c[2]}-{c[3]}ch" for c in INF_EDGE])
def test_an_inf_kernel_tap_on_padding_is_nan_on_every_backend(mesh, spec, conv_args, ch):
    """x = ones [1, 6, ch], split or not along space or features; w: window 3, tap 0 +inf for
    feature 0 and finite elsewhere. With SAME padding (1, 1) output 0 of feature 0 reads padding
    with the inf tap: NaN; the others read the image: +inf. 2-D: x [1, 2, 6, ch], window 1 x 2
    (SAME pads (0, 1)) with its last tap +inf: the last output is NaN.
    With lhs_dilation 2 (explicit padding [[1, 1]], 11 outputs) every other output also reads a
    hole with the inf tap: NaN there too."""
    dil = conv_args == "lhs_dilation=2"
    pad = ", padding=[[1, 1]], lhs_dilation=2" if dil else ""
    n_out = 11 if dil else 6
    two = spec.count(",") == 3
    xs, ws, os_ = (1, 2, 6, ch) if two else (1, 6, ch), (1, 2, ch, ch) if two else (3, ch, ch), n_out
    out_shape = f"[1, 2, {os_}, {ch}]" if two else f"[1, {os_}, {ch}]"
    src = (f"mesh {mesh}\nfunc main(x: f32{list(xs)} {spec}, w: f32{list(ws)}) -> f32{out_shape} {spec} {{\n"
           f"  return conv(x, w{pad})\n}}\n")
    c = spmdlang.compile(src)
    w = np.full(ws, 0.5, np.float32)
    w[(0, 1) if two else (0,)][:, 0] = np.inf
    inputs = {"x": np.ones(xs, np.float32), "w": w}
    want = np.full((n_out,), np.inf, np.float32)
    if dil:
        want[0::2] = np.nan  # output j reads dilated positions j-1, j, j+1: tap 0 on a hole or padding
    else:
        want[-1 if two else 0] = np.nan
    for backend in ("ref", "sim", "jax"):
        (got,) = c.run(inputs, backend=backend)
        got = got.reshape(-1, n_out, ch)
        for row in got:
            np.testing.assert_array_equal(row[:, 0], want, err_msg=f"{backend}\n{src}")
        assert np.isfinite(got[..., 1:]).all(), backend


def test_kernel_gradient_of_a_dilated_grouped_conv_keeps_nan_in_its_group():
    """The kernel gradient of a grouped, atrous conv is a batch_groups conv whose kernel is the
    cotangent: a NaN in group 0's input makes group 0's cotangent NaN, and only group 0's kernel
    gradient (XLA's batch_group_count with rhs_dilation spreads it over every group; the jax
    backend runs one conv per batch group)."""
    src = ("mesh [a=2]\nfunc loss(x: f32[2, 7, 4], w: f32[3, 2, 4]) -> f32[] {\n"
           "  return sum(tanh(conv(x, w, groups=2, rhs_dilation=2)))\n}\n"
           "func main(x: f32[2, 7, 4] {_, a, _}, w: f32[3, 2, 4]) -> (f32[], f32[3, 2, 4]) {\n"
           "  l, g = value_and_grad(loss, x, w, argnums=[1])\n  return l, g\n}\n")
    c = spmdlang.compile(src)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 7, 4)).astype(np.float32)
    x[0, 3, 0] = np.nan
    inputs = {"x": x, "w": rng.standard_normal((3, 2, 4)).astype(np.float32)}
    (_, want), = [c.run(inputs, backend="ref")]
    assert np.isnan(want[..., :2]).any() and np.isfinite(want[..., 2:]).all()
    x1 = x.copy()
    x1[..., :2] = 0.0  # group 1 alone, checked against jax's own gradient
    oracle = jax.grad(lambda w: jax.numpy.tanh(jax.lax.conv_general_dilated(
        x1, w, (1,), "SAME", rhs_dilation=(2,), dimension_numbers=DIMS[1], feature_group_count=2)).sum())(inputs["w"])
    np.testing.assert_allclose(want[..., 2:], np.asarray(oracle)[..., 2:], rtol=1e-4, atol=1e-4)
    for backend in ("sim", "jax"):
        _, got = c.run(inputs, backend=backend)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=backend)
        np.testing.assert_allclose(got[..., 2:], want[..., 2:], rtol=1e-4, atol=1e-4, err_msg=backend)


def _local_conv(x, w, attrs, out_type):
    """The per-partition module's emission of one conv (ops.contract._conv_jax_local), jitted."""
    expr = _conv_jax_local(["x", "w"], attrs, [out_type])
    fn = jax.jit(lambda x, w: eval(expr, {"jax": jax, "jnp": jax.numpy, "np": np, "x": x, "w": w}))
    return np.asarray(fn(x, w)), expr


@pytest.mark.parametrize("count", [60, pytest.param(400, marks=pytest.mark.slow)])
def test_module_conv_multiplies_padding_and_holes_by_non_finite_taps(count):
    """The jax module's conv on random 1-D/2-D/3-D configurations (strides, both dilations,
    negative and positive padding, feature and batch groups) with inf, -inf and NaN kernel taps,
    against ref: NaN exactly where a non-finite tap reads padding or a hole. Both forms run: the
    padding and holes built in memory behind an optimization_barrier, and, for a window spread far
    past the input, NaN set by static per-dim masks of the taps that miss; one conv either way."""
    rng = np.random.default_rng(77 + count)
    forms = Counter()
    while sum(forms.values()) < count:
        nsp = int(rng.integers(1, 4))
        groups, batch_groups = int(rng.choice([1, 1, 2])), 1
        if groups == 1 and rng.random() < 0.25:
            batch_groups = 2
        c = groups * int(rng.integers(1, 3))
        f = groups * batch_groups * int(rng.integers(1, 3))
        n = batch_groups * int(rng.integers(1, 3))
        xs = (n, *(int(rng.integers(1, 7)) for _ in range(nsp)), c)
        ws = (*(int(rng.integers(1, 4)) for _ in range(nsp)), c // groups, f)
        strides = [int(rng.integers(1, 3)) for _ in range(nsp)]
        lhs = [int(rng.choice([1, 1, 2])) for _ in range(nsp)]
        rhs = [int(rng.integers(1, 3)) for _ in range(nsp)]
        padding = [(int(rng.integers(-1, 4)), int(rng.integers(-1, 4))) for _ in range(nsp)]
        if rng.random() < 0.2:  # a window spread far past the input, SAME-padded for it
            rhs[0] = 50
            padding[0] = (50 * (ws[0] - 1) // 2, 50 * (ws[0] - 1) - 50 * (ws[0] - 1) // 2)
        attrs = conv_attrs(strides, padding, lhs, rhs, groups, batch_groups)
        drawn = _draw(rng, xs, ws, attrs)
        if drawn is None:
            continue
        out, x, w = drawn
        bad = rng.choice(w.size, min(w.size, 2), replace=False)
        w.reshape(-1)[bad] = rng.choice([np.inf, -np.inf, np.nan], len(bad))
        want = conv_numpy(x, w, **attrs)
        got, expr = _local_conv(x, w, attrs, out)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=f"{attrs} {xs} {ws}\n{expr}")
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"{attrs} {xs} {ws}\n{expr}")
        if any(lo > 0 or hi > 0 for lo, hi in padding) or max(lhs) > 1:
            form = "in memory" if "optimization_barrier" in expr else "corrected"
            assert expr.count("conv_general_dilated") == 1  # written once (a batch group each)
            forms[form] += 1
    assert forms["in memory"] > count // 2 and forms["corrected"] > 0, forms


def test_padding_in_memory_survives_xla_on_the_form_it_skips():
    """A 2-D conv with one channel and one feature, SAME padding: XLA's own conv skips the padding
    tap (docs/known_xla_issues.md, 10), and folds a constant-zero lax.pad into the conv alike. The
    module's form (a pad with a zero behind an optimization_barrier) keeps the pad in the optimized
    HLO, so the infinite tap on it gives NaN."""
    attrs = conv_attrs((1, 1), ((0, 0), (0, 1)))
    w = np.array([1.0, np.inf], np.float32).reshape(1, 2, 1, 1)
    x = np.ones((1, 1, 3, 1), np.float32)
    got, expr = _local_conv(x, w, attrs, TensorType("f32", (1, 1, 3, 1)))
    np.testing.assert_array_equal(got.ravel(), [np.inf, np.inf, np.nan])
    scope = {"jax": jax, "jnp": jax.numpy, "np": np}
    hlo = jax.jit(lambda x, w: eval(expr, {**scope, "x": x, "w": w})).lower(x, w).compile().as_text()
    assert " pad(" in hlo and hlo.count(" convolution(") == 1, hlo
