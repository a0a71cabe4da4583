"""Random inputs: an integer parameter used as ids is drawn over the dim it indexes (followed in
the global IR from the parameter to take, take_along_axis, one_hot, scatter_add and dynamic
starts), other integers in [0, 16); `--int-range LO,HI` / `int_range=(lo, hi)` overrides."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import spmdlang
from spmdlang.inputs import index_bounds

ROOT = Path(__file__).resolve().parent.parent


def bounds(src: str) -> dict:
    return index_bounds(spmdlang.compile(src).program)


def test_vocab_ids_cover_the_whole_vocab_and_labels_stay_below_the_class_count():
    src = """mesh [data=2]
func main(table: f32[64, 8], ids: i32[32, 16] {data, _}, labels: i32[32, 16] {data, _}, n: i32[4])
    -> (f32[32, 16, 8], f32[32, 16, 10], i32[4]) {
  return take(table, ids), one_hot(labels, 10), n + 1
}
"""
    c = spmdlang.compile(src)
    assert index_bounds(c.program) == {"ids": 64, "labels": 10}
    x = c.random_inputs(0)
    assert x["ids"].min() == 0 and x["ids"].max() == 63 and len(np.unique(x["ids"])) == 64
    assert x["labels"].max() == 9 and x["labels"].min() == 0
    _, onehot, _ = c.run(x)
    assert (onehot.sum(axis=-1) == 1).all()  # no all-zero row: every label names a class
    assert x["n"].min() >= 0 and x["n"].max() <= 15  # not an index: [0, 16) as before
    assert c.diff(x, backends=["sim"])["ok"]


@pytest.mark.parametrize("body, params, want", [
    ("take_along_axis(x, i, axis=1)", "x: f32[4, 40], i: i32[4, 3]", {"i": 40}),
    ("scatter_add(x, i, u, axis=1)", "x: f32[4, 40], i: i32[3], u: f32[4, 3]", {"i": 40}),
    ("dynamic_slice(x, [0, k], [4, 8])", "x: f32[4, 40], k: i32[]", {"k": 33}),
    ("dynamic_update_slice(x, u, [k, 0])", "x: f32[4, 40], u: f32[2, 40], k: i32[]", {"k": 3}),
    ("x[p[1]]", "x: f32[30], p: i32[2]", {"p": 30}),  # through a slice and a reshape
    ("take(x, reshape(transpose(i, [1, 0]), [6]), axis=0)", "x: f32[50], i: i32[2, 3]", {"i": 50}),
    ("take(x, i, axis=0) + cast(take(y, i, axis=0), f32)", "x: f32[50], y: i32[20], i: i32[3]", {"i": 20}),
])
def test_the_ids_range_follows_the_indexing_op(body, params, want):
    src = f"mesh [p=2]\nfunc main({params}) -> f32[] {{\n  return sum(cast({body}, f32))\n}}\n"
    assert bounds(src) == want


def test_ids_captured_by_a_loop_are_followed_into_its_body():
    src = """mesh [p=2]
func main(x: f32[24, 4], ids: i32[5]) -> f32[5, 4] {
  acc = zeros(f32[5, 4])
  loop l in range(3) {
    acc = acc + take(x, ids, axis=0)
  }
  return acc
}
"""
    assert bounds(src) == {"ids": 24}


def test_int_range_overrides_every_integer_parameter():
    src = ("mesh [p=2]\nfunc main(t: f32[64, 2], ids: i32[400], n: i32[400]) -> f32[400, 2] {\n"
           "  return take(t, ids + n)\n}\n")
    c = spmdlang.compile(src)
    x = c.random_inputs(1, int_range=(-3, 2))
    for name in ("ids", "n"):
        assert x[name].min() == -3 and x[name].max() == 1
    assert c.random_inputs(1)["n"].max() == 15  # ids + n is arithmetic, not an id: [0, 16)
    with pytest.raises(spmdlang.SpmdError, match=r"i32 holds \[-2147483648, 2147483647\]"):
        c.random_inputs(0, int_range=(0, 2**40))


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "spmdlang", *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT, timeout=300)


def test_cli_int_range(tmp_path):
    prog = tmp_path / "ids.spmd"
    prog.write_text("mesh [p=2]\nfunc main(ids: i32[300] {p}) -> i32[300] {p} {\n  return ids\n}\n")
    out = tmp_path / "out.npz"
    r = _cli("run", str(prog), "--backend", "sim", "--int-range", "100,103", "-o", str(out))
    assert r.returncode == 0, r.stderr
    got = np.load(out)["out0"]
    assert got.min() == 100 and got.max() == 102
    r = _cli("diff", str(prog), "--backends", "sim", "--int-range=-7,-2")
    assert r.returncode == 0, r.stderr
    for bad in ("5,3", "1", "a,b"):
        r = _cli("run", str(prog), "--backend", "ref", "--int-range", bad)
        assert r.returncode == 2 and "LO,HI" in r.stderr, r.stderr
