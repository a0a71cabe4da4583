"""Shape-rule errors point at the argument they blame (ShapeError.blame), so builtins need not
repeat the op table's checks: one message, located at the operand or attribute that is wrong."""

from __future__ import annotations

import pytest
from test_errors import M, check


@pytest.mark.parametrize("body, at, fragment", [
    ("take(t, i)", "i)", "take: ids must be integers, got f32[2]"),
    ("take(e, j)", "e, j", "take: cannot gather from an empty dimension"),
    ("max(e, axis=0)", "0)", "max over an empty dimension has no identity"),
    ("min(e, 0)", "0)", "min over an empty dimension has no identity"),
    ("argmax(e, axis=0)", "0)", "argmax of an empty dimension"),
    ('where("yes", t, t)', '"yes"', "argument 'cond' of where() must be a tensor, got a string"),
    ("concat([t, i], 0)", "[t, i]", "concat: shapes f32[4, 3] and f32[2] differ outside axis 0"),
    ("pad(t, [[0, -1]])", "[[0, -1]]", "pad: padding must be non-negative"),
    ("reshape(t, [5, 2])", "[5, 2]", "reshape: cannot reshape f32[4, 3] (12 elements) to [5, 2] (10)"),
    ("iota(bool[4])", "bool[4]", "iota needs a numeric dtype, got bool"),
])
def test_errors_point_at_the_argument(body, at, fragment):
    src = M + f"func main(t: f32[4, 3], i: f32[2], e: f32[0, 3], j: i32[2]) -> f32[4] {{\n  return {body}\n}}\n"
    check(src, at, fragment)


def test_conv_window_message_names_the_padding():
    src = M + 'func main(a: f32[1, 2, 3], w: f32[3, 3, 4]) -> f32[1, 8, 4] {\nreturn conv(a, w, padding="VALID") }'
    check(src, "conv", "conv: window 3 does not fit spatial dim 2 with padding [0, 0]")
