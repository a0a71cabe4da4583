"""Float consts: `const LR = 3e-4`, expressions over literals and earlier consts, typed as a
literal is (weak), overridden by `--set` and `consts=`; an integer const stays an integer."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import spmdlang
from spmdlang.cli import main
from spmdlang.errors import OverrideError, SpmdError

PROG = """mesh [x=2]
const B = 6
const LR = 3e-4
const B1 = 0.9
const C = -0.5 * B1 + B / 4
func main(a: bf16[B, 3] {x, _}, w: f32[B, 3] {x, _}, n: i32[B]) -> (bf16[B, 3], f32[B, 3], f32[B]) {
  return a * LR, w - LR * w + C, n * LR
}
"""


def _inputs(c):
    rng = np.random.default_rng(1)
    shape = c.program.params[0].value.type.shape
    return {"a": rng.normal(size=shape).astype(ml_dtypes.bfloat16),
            "w": rng.normal(size=shape).astype(np.float32),
            "n": rng.integers(-50, 50, size=shape[:1]).astype(np.int32)}


def _expected(inputs, lr, b1, b):
    c = -0.5 * b1 + b / 4
    a32 = inputs["a"].astype(np.float32)
    return [(a32 * np.float32(ml_dtypes.bfloat16(lr))).astype(ml_dtypes.bfloat16),
            inputs["w"] - np.float32(lr) * inputs["w"] + np.float32(c),
            inputs["n"].astype(np.float32) * np.float32(lr)]


@pytest.mark.parametrize("consts, lr, b1, b", [
    (None, 3e-4, 0.9, 6),
    ({"LR": 1e-3}, 1e-3, 0.9, 6),
    ({"B1": 0.5, "B": 4}, 3e-4, 0.5, 4),  # C, declared after B1 and B, follows them
    ({"LR": 2}, 2.0, 0.9, 6),  # a float const given an integer is still a float (n * LR is f32)
])
def test_float_consts_are_weak_scalars_and_overridable(consts, lr, b1, b):
    c = spmdlang.compile(PROG, consts=consts)
    assert [str(r.value.type) for r in c.program.results] == [f"bf16[{b}, 3]", f"f32[{b}, 3]", f"f32[{b}]"]
    inputs = _inputs(c)
    got = c.run(inputs, backend="ref")
    for g, want in zip(got, _expected(inputs, lr, b1, b)):
        assert g.dtype == want.dtype
        np.testing.assert_allclose(g.astype(np.float32), want.astype(np.float32), rtol=1e-6, atol=1e-7)


def test_float_consts_agree_on_every_backend_split_unevenly():
    c = spmdlang.compile(PROG, consts={"B": 5, "LR": 0.25})
    report = c.diff(_inputs(c), backends=["ref", "sim", "jax", "xla"])
    assert report["ok"], report


def test_an_integer_const_stays_an_integer():
    src = "mesh [x=2]\nconst K = 3\nconst H = 8 / 2\nfunc main(n: i32[H]) -> i32[H] { return n * K }"
    c = spmdlang.compile(src, consts={"K": 5})
    assert str(c.program.results[0].value.type) == "i32[4]"
    np.testing.assert_array_equal(c.run({"n": np.arange(4, dtype=np.int32)})[0], np.arange(4) * 5)
    for bad in (5.0, 2.5, True, "5"):
        with pytest.raises(OverrideError, match="'K' is an integer const; give an integer"):
            spmdlang.compile(src, consts={"K": bad})


@pytest.mark.parametrize("bad", [True, "1e-3", float("inf"), float("nan")])
def test_a_float_const_takes_a_finite_number(bad):
    with pytest.raises(OverrideError, match="'LR' is a float const; give a finite number") as info:
        spmdlang.compile(PROG, consts={"LR": bad})
    assert (info.value.line, info.value.col) == (3, 7)


@pytest.mark.parametrize("src, at, fragment", [
    ("const N = 8 / 3\nfunc main(a: f32[N]) -> f32[N] { return a }", "N]", "'N' is a float const (2.66"),
    ("const LR = 0.5\nfunc main(a: f32[4]) -> f32[4] { return reshape(a, [LR, 4]) }", "[LR",
     "must be a list of integers"),
    ("const S = 2.0\nfunc main(a: f32[4]) -> f32[4] {\n  for i in range(S) { a = a + 1.0 }\n  return a\n}", "S)",
     "range() argument must be a static integer, got the number 2.0"),
    ("const LR = 1e-3\nconst Y = LR * x\nfunc main(a: f32[4]) -> f32[4] { return a }", "x\n",
     "unknown name 'x'"),
    ("const LR = [1.0]\nfunc main(a: f32[4]) -> f32[4] { return a }", "[1.0]",
     "const 'LR' must be an integer or a float, got a list"),
])
def test_float_const_misuse_is_located(src, at, fragment):
    src = "mesh [x=2]\n" + src
    with pytest.raises(SpmdError) as info:
        spmdlang.compile(src)
    e = info.value
    i = src.index(at)
    assert (e.line, e.col) == (src.count("\n", 0, i) + 1, i - src.rfind("\n", 0, i)), e.render()
    assert fragment in e.message, e.render()


@pytest.fixture
def prog(tmp_path):
    p = tmp_path / "prog.spmd"
    p.write_text(PROG)
    return p


def test_cli_set_overrides_a_float_const(capsys, prog, tmp_path):
    dest = tmp_path / "out.npz"
    assert main(["run", str(prog), "--backend", "ref", "--set", "LR=1e-3,B1=.5", "-o", str(dest)]) == 0
    want = spmdlang.compile(PROG, consts={"LR": 1e-3, "B1": 0.5}).run(backend="ref")
    default = spmdlang.compile(PROG).run(backend="ref")
    with np.load(dest) as got:
        outs = [got["out0"].view(ml_dtypes.bfloat16), got["out1"], got["out2"]]
    for g, w, d in zip(outs, want, default):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)
        assert not np.array_equal(g, d)


@pytest.mark.parametrize("value, fragment", [
    ("LR=abc", "--set expects NAME=INT or NAME=FLOAT"),
    ("LR=inf", "--set expects NAME=INT or NAME=FLOAT (finite)"),
    ("LR=", "--set expects NAME=INT or NAME=FLOAT"),
    ("B=0.5", "--set B=0.5: 'B' is an integer const; give an integer"),
])
def test_cli_bad_set_value_exits_2(capsys, prog, value, fragment):
    try:
        code = main(["check", str(prog), "--set", value])
    except SystemExit as e:  # argparse's own errors
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and fragment in err and "Traceback" not in err


def test_float_consts_compile_to_the_plan_of_the_literals():
    """A program with float consts and its twin with the literals written in: the same global and
    per-partition IR (the const lines are blank lines in the twin, so line numbers agree)."""
    twin = "\n".join("" if line.startswith("const") else line for line in PROG.splitlines())
    twin = twin.replace("[B", "[6").replace("w - LR * w + C", "w - 3e-4 * w + (-0.5 * 0.9 + 6 / 4)")
    twin = twin.replace("LR", "3e-4")
    assert "const" not in twin and "B" not in twin.replace("bf16", "")
    got, want = spmdlang.compile(PROG), spmdlang.compile(twin)
    assert got.spmd_ir == want.spmd_ir and got.ir == want.ir
