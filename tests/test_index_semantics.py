"""Index semantics every backend must share, checked against jax.lax (with 64-bit types on) and
numpy, on ref, sim and jax alike: agreement between our backends is not enough here, since every
backend could share a wrong answer (issue 27).

- ids out of range through a window: clamped into the window (XLA on CPU clamps a gather of a
  dynamic_slice into the whole operand: docs/known_xla_issues.md #7);
- 64-bit ids (2^32, 2^40, -2^32) clamp in their own width, never wrap;
- 64-bit starts (2^32 + 1, 2^63 - 1) clamp in their own width, as jax.lax clamps them;
- a 64-bit seed value and a static start past 64 bits are located errors.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import spmdlang
from spmdlang.errors import SpmdError

BACKENDS = ("ref", "sim", "jax")


def _run(src: str, inputs: dict) -> dict[str, list[np.ndarray]]:
    c = spmdlang.compile(src)
    return {b: [np.asarray(o) for o in c.run(inputs, backend=b)] for b in BACKENDS}


def _same(got: dict, want: list) -> None:
    for b, outs in got.items():
        assert len(outs) == len(want)
        for i, (o, w) in enumerate(zip(outs, want)):
            np.testing.assert_array_equal(o, np.asarray(w), err_msg=f"{b}, result {i}")


# ---------------------------------------------------------------------------------- ids through a window

WINDOW = """mesh [r=3]
func main(x: f32[7] {X}, t: i32[], i: i32[], ids: i32[3], m: f32[3, 5] {_, X}, mt: i32[], mi: i32[3, 2]) ->
    (f32[], f32[3], f32[3, 2], f32[]) {
  w = dynamic_slice(x, [t], [2])
  a = take(w, i)
  b = take(w, ids)
  c = take_along_axis(dynamic_slice(m, [0, mt], [3, 2]), mi, 1)
  acc = 0.0
  loop k in range(2) {
    acc = acc + take(dynamic_slice(x, [t + k], [2]), i + k)
  }
  return a, b, c, acc
}
"""


@pytest.mark.parametrize("spec", ["_", "r"], ids=["unsplit", "split"])
@pytest.mark.parametrize("t, i", [(0, 11), (3, 5), (6, -4), (2, 1)])
def test_ids_out_of_the_window_clamp_into_the_window(spec, t, i):
    x = 10 * np.arange(7, dtype=np.float32)
    m = np.arange(15, dtype=np.float32).reshape(3, 5)
    ids = np.array([i, -i, 1], np.int32)
    mi = np.array([[i, 0], [-1, 1], [7, i]], np.int32)
    mt = np.int32(t)

    def window(a, s, size):  # numpy: the clamped window, then ids clamped into it
        s = min(max(s, 0), len(a) - size)
        return a[s:s + size]

    w = window(x, t, 2)
    cw = m[:, min(max(t, 0), 3):min(max(t, 0), 3) + 2]
    want = [w[np.clip(i, 0, 1)], w[np.clip(ids, 0, 1)], np.take_along_axis(cw, np.clip(mi, 0, 1), 1),
            sum(window(x, t + k, 2)[np.clip(i + k, 0, 1)] for k in range(2))]
    got = _run(WINDOW.replace("X", spec),
               {"x": x, "t": np.int32(t), "i": np.int32(i), "ids": ids, "m": m, "mt": mt, "mi": mi})
    _same(got, want)


# ---------------------------------------------------------------------------------- 64-bit ids

IDS64 = """mesh [r=2]
func main(x: f32[3, 5] {_, S}, ids: i64[3, 2], v: i64[4]) -> (f32[3, 2], f32[3, 4]) {
  return take_along_axis(x, ids, 1), take(x, v, 1)
}
"""


@pytest.mark.parametrize("spec", ["_", "r"], ids=["unsplit", "split"])
def test_64_bit_ids_clamp_in_their_own_width(spec):
    """2^32 is past the end (the last column), -2^32 before the start (column 0): never wrapped."""
    x = np.arange(15, dtype=np.float32).reshape(3, 5)
    big = [2**32, 2**32 + 1, -2**32, 2**40 + 2, 2**63 - 1, -2**63, 3, -1]
    ids = np.array(big[:6], np.int64).reshape(3, 2)
    v = np.array(big[:2] + big[6:], np.int64)
    want = [np.take_along_axis(x, np.clip(ids, 0, 4), 1), np.take(x, np.clip(v, 0, 4), 1)]
    got = _run(IDS64.replace("S", spec), {"x": x, "ids": ids, "v": v})
    _same(got, want)


def test_jnp_itself_wraps_64_bit_ids():
    """Why every gather clamps its ids itself: were this to change, the clamp would still be right."""
    x = np.arange(15, dtype=np.float32).reshape(3, 5)
    with jax.enable_x64(True):
        got = jnp.take_along_axis(x, np.full((3, 1), 2**32, np.int64), axis=1, mode="clip")
    assert np.asarray(got)[:, 0].tolist() == [0.0, 5.0, 10.0]


# ---------------------------------------------------------------------------------- 64-bit starts

STARTS64 = """mesh [r=3]
func main(x: f32[7, 4] {S, _}, s: i64[], u: f32[2, 4]) -> (f32[2, 4], f32[4], f32[7, 4]) {
  return dynamic_slice(x, [s, 0], [2, 4]), x[s], dynamic_update_slice(x, u, [s, 0])
}
"""


@pytest.mark.parametrize("spec", ["_", "r"], ids=["unsplit", "split"])
@pytest.mark.parametrize("s", [2**32 + 1, 2**31, 2**63 - 1, 3, -2**32 + 1, -(2**63)])
def test_64_bit_starts_clamp_as_jax_lax(spec, s):
    """Against jax.lax with x64 on (a negative start clamps to 0: jax.lax would wrap it once)."""
    x = np.arange(28, dtype=np.float32).reshape(7, 4)
    u = -np.ones((2, 4), np.float32)
    with jax.enable_x64(True):
        at = (np.int64(max(s, 0)), np.int64(0))
        want = [jax.lax.dynamic_slice(x, at, (2, 4)), jax.lax.dynamic_slice(x, at, (1, 4))[0],
                jax.lax.dynamic_update_slice(x, u, at)]
        want = [np.asarray(w).astype(np.float32) for w in want]
    got = _run(STARTS64.replace("S", spec), {"x": x, "s": np.int64(s), "u": u})
    _same(got, want)


# ---------------------------------------------------------------------------------- located errors


def _error(src: str) -> str:
    with pytest.raises(SpmdError) as e:
        spmdlang.compile(src)
    return str(e.value)


def test_a_64_bit_seed_value_is_refused():
    msg = _error("""mesh [r=2]
func main(s: i64[]) -> f32[4] {
  return random_uniform(s, f32[4])
}
""")
    assert ":3:25: error: the seed is a 32-bit integer, got i64[]" in msg and "cast it to i32" in msg
    c = spmdlang.compile("""mesh [r=2]
func main(s: i64[]) -> f32[4] {
  return random_uniform(cast(s, i32), f32[4])
}
""")
    assert c.run({"s": np.int64(7)})[0].shape == (4,)


@pytest.mark.parametrize("call", ["dynamic_slice(x, [10**20], [2])", "dynamic_update_slice(x, x[0:2], [-(10**20)])",
                                  "dynamic_slice(x, [2**63], [2])"])
def test_a_static_start_past_64_bits_is_refused(call):
    msg = _error(f"""mesh [r=2]
func main(x: f32[6]) -> f32[_N] {{
  return {call}
}}
""".replace("_N", "2" if call.startswith("dynamic_slice") else "6"))
    assert ":3:" in msg and "does not fit in 64 bits" in msg


def test_a_static_start_within_64_bits_clamps():
    c = spmdlang.compile("""mesh [r=2]
func main(x: f32[6] {r}) -> (f32[2], f32[6]) {
  return dynamic_slice(x, [2**63 - 1], [2]), dynamic_update_slice(x, x[0:2], [-(2**63)])
}
""")
    x = np.arange(6, dtype=np.float32)
    _same({b: c.run({"x": x}, backend=b) for b in BACKENDS}, [x[4:], np.r_[x[:2], x[2:]]])
