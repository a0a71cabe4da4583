"""Canonicalisation that the programs jax writes need (ir.simplify, partition.loops, ops.dynamic):
what `spmdlang import` brings in from a jax gradient through a scan partitions as the language's
own loop gradient does. Each plan is checked, and ref, sim and jax against numpy."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

import spmdlang
from spmdlang.ir.core import all_ops

pytestmark = pytest.mark.jax


def compiled(src: str):
    c = spmdlang.compile(src)
    kinds = Counter(e.kind.value for e in c.spmd.ledger for _ in range(e.trip_count))
    return c, kinds


def check_numbers(c, want, backends=("ref", "sim", "jax")):
    inputs = c.random_inputs(0)
    for b in backends:
        got = c.run(inputs, backend=b)
        np.testing.assert_allclose(got[0], want(**inputs), rtol=1e-5, atol=1e-5, err_msg=b)


SHARED_ZEROS = """mesh [a=2]

func main(x: f32[4, 8] {a, _}, y: f32[4, 8] {_, a}) -> (f32[2, 4, 8], f32[2, 4, 8]) {
  z = zeros(f32[2, 4, 8])
  s1 = dynamic_update_slice(z, expand_dims(x, 0), [0, 0, 0])
  s2 = dynamic_update_slice(z, expand_dims(y, 0), [1, 0, 0])
  return s1, s2
}
"""


def test_one_constant_for_two_layouts_is_two_copies():
    """Two stacked buffers initialised with the same zeros, one filled by rows over `a`, one by
    columns: each copy of the zeros takes its own buffer's layout (one shared value would tie them,
    and one update would be resharded: 2 collectives, 96 bytes)."""
    c, kinds = compiled(SHARED_ZEROS)
    assert not kinds
    fulls = [op for op in c.canonical.ops if op.kind == "full" and op.result.type.rank == 3]
    assert len(fulls) == 2
    inputs = c.random_inputs(0)
    for b in ("ref", "sim", "jax"):
        s1, s2 = c.run(inputs, backend=b)
        np.testing.assert_array_equal(s1[0], inputs["x"])
        np.testing.assert_array_equal(s2[1], inputs["y"])
        assert not s1[1].any() and not s2[0].any()


STACKED_GRADIENT = """mesh [data=2]
const L = 4

func main(x: f32[L, 8, 16] {_, data, _}) -> f32[L, 16, 16] {
  acc = zeros(f32[L, 16, 16])
  loop l in range(L) {
    g = einsum("bi,bj->ij", x[l], x[l])
    acc = acc + dynamic_update_slice(zeros(f32[L, 16, 16]), expand_dims(g, 0), [l, 0, 0])
  }
  return acc
}
"""


def test_a_layers_gradient_written_into_zeros_stays_pending_through_the_loop():
    """jax's transpose of a scanned layer's weight read: the layer's gradient (a pending sum over
    data) written into zeros and added to the carried stack. The zeros are a pending sum already,
    so the carry stays pending and is settled once after the loop, not once per layer."""
    c, kinds = compiled(STACKED_GRADIENT)
    assert kinds == Counter({"all_reduce": 1})
    check_numbers(c, lambda x: np.einsum("lbi,lbj->lij", x, x))


TRANSPOSED_ROLL = """mesh [x=4]

func main(a: f32[16, 8] {x, _}) -> f32[16, 8] {x, _} {
  return pad(a[3:16], [[0, 3], [0, 0]]) + pad(a[0:3], [[13, 0], [0, 0]])
}
"""


def test_a_rotation_as_jax_transposes_it_is_one_permute():
    """jnp.roll's transpose in a jax gradient: the two slices padded back with zeros and added.
    It is roll(a, 13): one collective_permute, where the pads and the add would move more."""
    c, kinds = compiled(TRANSPOSED_ROLL)
    assert kinds == Counter({"collective_permute": 1})
    assert [op.attrs["shift"] for op in all_ops(c.canonical.ops) if op.kind == "roll"] == [13]
    check_numbers(c, lambda a: np.roll(a, -3, axis=0))
    # another cut, or another pad, is no rotation
    c, _ = compiled(TRANSPOSED_ROLL.replace("[[13, 0]", "[[12, 1]"))
    assert not any(op.kind == "roll" for op in all_ops(c.canonical.ops))
