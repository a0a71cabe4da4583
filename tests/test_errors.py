"""One test per error class: the SpmdError's line, column and (a fragment of) its message.

Expected positions are written as the text the error points at (`at`), found in the source, so
the tests read like the programs they check.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import spmdlang
from spmdlang.errors import OverrideError, SpmdError

M = "mesh [x=2, y=2]\n"


def table(rows):
    """Parametrize rows (src, at, fragment[, nth]) with nth defaulting to 1."""
    return [r if len(r) == 4 else (*r, 1) for r in rows]


def locate(src: str, needle: str, nth: int = 1) -> tuple[int, int]:
    """(line, col), 1-based, of the nth occurrence of needle in src."""
    i = -1
    for _ in range(nth):
        i = src.index(needle, i + 1)
    line = src.count("\n", 0, i) + 1
    col = i - (src.rfind("\n", 0, i) + 1) + 1
    return line, col


def compile_error(src: str, **kw) -> SpmdError:
    with pytest.raises(SpmdError) as info:
        spmdlang.compile(src, **kw)
    return info.value


def check(src: str, at: str, fragment: str, nth: int = 1, **kw) -> SpmdError:
    e = compile_error(src, **kw)
    assert (e.line, e.col) == locate(src, at, nth), e.render()
    assert fragment in e.message, e.render()
    return e


# ---------------------------------------------------------------------------------- syntax


@pytest.mark.parametrize(
    "src, at, fragment, nth",
    table(
        [
            (M + "func main(x: f32[4] -> f32[4] { return x }", "->", "unexpected '->'; expected ')'"),
            (M + "func main(x: f32[4]) f32[4] { return x }", "f32[4] {", "expected '->'"),
            (M + "func main(x: f32[4]) -> f32[4] { return x $ 1 }", "$", "unexpected character '$'"),
            (
                M + 'func main(x: f32[4]) -> f32[4] { return einsum("i->i, x) }',
                '"i->i',
                "unterminated string",
            ),
            (M + "func main(x: f32[4]) -> f32[4] {\n  y =\n  return x }", "return", "expected an expression"),
            (M + "func main(x: f32[4]) -> f32[4] { return (x + 1 }", "}", "unexpected '}'; expected ')'"),
            (M + "func main(x: f32[4]) -> f32[4] { return x[0 }", "}", "expected"),
            (M + "func main(x: f32[4]) -> f32[4] { return x ** }", "}", "expected an expression"),
            (M + "func main(x: f32[4]) -> f32[4] { return x < x < x }", "<", "unexpected '<'", 2),
            (M + "func main(x: f32[4]) -> f32[4] { return x\x01 }", "\x01", "unexpected character U+0001"),
            ("mesh [x=2\nfunc main(x: f32[4]) -> f32[4] { return x }", "func", "expected"),
            ("mesh x=2\nfunc main(x: f32[4]) -> f32[4] { return x }", "x=2", "expected '['"),
            (M + "const = 3\n", "= 3", "expected a name"),
            (M + "func main(x: f32[4]) -> f32[4] { return x }\n}", "}", "unexpected '}'", 2),
        ]
    ),
)
def test_syntax_error(src, at, fragment, nth):
    check(src, at, fragment, nth)


def test_syntax_error_at_end_of_file():
    src = M + "func main(x: f32[4]) -> f32[4] {\n  return sum(x,"
    e = compile_error(src)
    # the caret sits just past the last character, on the last line
    assert (e.line, e.col) == (3, len("  return sum(x,") + 1)
    assert "unexpected end of file" in e.message


@pytest.mark.parametrize(
    "src, at, found",
    [
        # the file ends inside the function: the function's brace
        (M + "func main(x: f32[4]) -> f32[4] {\n  y = x + 1.0\n  return y\n", "{\n  y", "end of file"),
        # the next function starts: the first function's brace, not the line after its statement
        (M + "func f(x: f32[4]) -> f32[4] {\n  return x\n\nfunc main(x: f32[4]) -> f32[4] {\n  return f(x)\n}\n",
         "{\n  return x", "keyword 'func'"),
        # a loop's block is left open: the `}` that closes the function tells which brace lost its own
        (M + "func main(x: f32[4]) -> f32[4] {\n  loop i in range(3) {\n    x = x + 1.0\n"
         "  return x\n}\n", "{\n    x", "end of file"),
    ],
)
def test_missing_closing_brace_is_reported_at_the_unclosed_brace(src, at, found):
    e = compile_error(src)
    assert (e.line, e.col) == locate(src, at), e.render()
    assert e.message == f"this '{{' is never closed: expected '}}' before {found}"


def test_a_closed_brace_is_not_blamed_for_another_syntax_error():
    e = compile_error(M + "func main(x: f32[4]) -> f32[4] {\n  y = x x\n  return y\n}\n")
    assert "never closed" not in e.message


def test_syntax_error_says_what_was_expected():
    e = compile_error(M + "func main(x: f32[4]) -> f32[4] { return sum(x,, 0) }")
    assert "expected" in e.message and "an expression" in e.message


@pytest.mark.parametrize("kw", ["mesh", "devices", "const", "func", "in", "range", "true", "false"])
def test_keyword_as_name(kw):
    src = M + f"func main(x: f32[4]) -> f32[4] {{\n  {kw} = x\n  return x\n}}"
    e = compile_error(src)
    assert e.line == 3 and e.col == 3, e.render()
    assert f"'{kw}' is a keyword and cannot be used as a name" in e.message


@pytest.mark.parametrize("kw", ["return", "for"])
def test_statement_keyword_as_name(kw):
    # these start a statement, so the parser complains at the '=' that follows
    src = M + f"func main(x: f32[4]) -> f32[4] {{\n  {kw} = x\n  return x\n}}"
    e = compile_error(src)
    assert (e.line, e.col) == (3, 4 + len(kw)) and "unexpected '='" in e.message, e.render()


def test_keyword_as_parameter():
    check(
        M + "func main(for: f32[4]) -> f32[4] { return x }",
        "for",
        "'for' is a keyword and cannot be used as a name",
    )


# ---------------------------------------------------------------------------------- names


@pytest.mark.parametrize(
    "src, at, fragment, nth",
    table(
        [
            (
                M + "func main(x: f32[4]) -> f32[4] { return xs + 1 }",
                "xs",
                "unknown name 'xs'; did you mean 'x'?",
            ),
            (
                M + "func main(x: f32[4]) -> f32[4] { return sofmax(x) }",
                "sofmax",
                "unknown function 'sofmax'; did you mean 'softmax'?",
            ),
            (
                M + "func main(x: f32[4]) -> f32[4] { return helper(x) }",
                "helper",
                "unknown function 'helper'",
            ),
            (M + "func main(x: f33[4]) -> f32[4] { return x }", "f33", "unknown dtype 'f33'"),
            (
                M + "func main(x: f32[4]) -> f32[4] { return zeros(float[4]) }",
                "float",
                "unknown name 'float'",
            ),
            (M + "func main(x: f32[4]) -> f32[4] { return cast(x, f8) }", "f8", "unknown name 'f8'"),
            (M + "func main(x: f32[B]) -> f32[4] { return x }", "B", "unknown name 'B'"),
            (M + "const A = 2\nfunc main(x: f32[AA]) -> f32[4] { return x }", "AA", "did you mean 'A'"),
            (
                M + "func main(x: f32[4, 4] {z, _}) -> f32[4] { return x }",
                "z",
                "unknown mesh axis 'z'; the mesh has x, y",
            ),
            (M + "func main(x: f32[4]) -> f32[4] { return shard(x, {xx}) }", "xx", "unknown mesh axis 'xx'"),
            (M + "func main(x: f32[4]) -> f32[4] { return x * y }", "y }", "'y' is a mesh axis"),
            (
                M + "func main(x: f32[4]) -> f32[4] { return f32(x) }",
                "f32(",
                "'f32' is a dtype; to convert, write cast(x, f32)",
            ),
            (M + "func main(x: f32[4]) -> f32[4] { return sum }", "sum", "'sum' is a builtin"),
            (  # a dimless unknown type in a called function (found by test_fuzz_mutations)
                M + "func two(a: f32[4], b: i325) -> f32[4] { return a }\n"
                "func main(x: f32[4]) -> f32[4] { return two(x, x) }",
                "i325",
                "unknown type 'i325'",
            ),
        ]
    ),
)
def test_unknown(src, at, fragment, nth):
    check(src, at, fragment, nth)


# ---------------------------------------------------------------------------------- specs


@pytest.mark.parametrize(
    "src, at, fragment, nth",
    table(
        [
            (
                M + "func main(a: f32[4, 4] {x}) -> f32[4, 4] { return a }",
                "{x}",
                "spec {x} has 1 entry but f32[4, 4] has rank 2",
            ),
            (M + "func main(a: f32[4, 4]) -> f32[4, 4] {x, _, _} { return a }", "{x, _, _}", "has 3 entries"),
            (M + "func main(a: f32[4]) -> f32[4] { return shard(a, {x, y}) }", "{x, y}", "has rank 1"),
            (
                M + "func main(a: f32[4, 4] {x, x}) -> f32[4, 4] { return a }",
                "x}",
                "mesh axis 'x' appears twice in one spec",
            ),
            (
                M + "func main(a: f32[4, 4] {(x, y), y}) -> f32[4, 4] { return a }",
                "y}",
                "mesh axis 'y' appears twice",
            ),
            (
                M + "func main(a: f32[4, 4]) -> f32[4, 4] { return shard(a, {(x, x), _}) }",
                "(x, x)",
                "appears twice",
            ),
            (
                M + "func main(a: f32[4, 4] {x, ?}) -> f32[4, 4] { return a }",
                "?",
                "'?' (open dimension) is only allowed in shard()",
            ),
            (M + "func main(a: f32[4, 4]) -> f32[4, 4] {?, x} { return a }", "?", "only allowed in shard()"),
            (
                M + "func main(a: f32[4, 4]) -> f32[4, 4] { return shard(a, {(x, _), _}) }",
                "(x, _)",
                "'_' cannot appear",
            ),
            (M + "func main(a: f32[4]) -> f32[4] { return shard(a, 1) }", "1)", "must be a sharding spec"),
        ]
    ),
)
def test_spec_error(src, at, fragment, nth):
    check(src, at, fragment, nth)


def test_open_dims_allowed_in_shard():
    spmdlang.compile(M + "func main(a: f32[4, 4]) -> f32[4, 4] { return shard(a, {x, ?}) }")


# ---------------------------------------------------------------------------------- builtins: shapes, dtypes


@pytest.mark.parametrize(
    "src, at, fragment, nth",
    table(
        [
            (
                M + "func main(a: f32[4, 3], b: f32[4]) -> f32[4, 3] { return a + b }",
                "+",
                "shapes [4, 3] and [4] do not broadcast",
            ),
            (
                M + "func main(a: f32[4, 3], b: f32[2, 3]) -> f32[4, 3] { return maximum(a, b) }",
                "maximum",
                "do not broadcast",
            ),
            (
                M + "func main(a: f32[4, 3], b: f32[4, 3]) -> f32[4, 3] { return a @ b }",
                "@",
                "matmul shapes do not match: f32[4, 3] @ f32[4, 3]",
            ),
            (
                M + "func main(a: f32[4, 3]) -> f32[4, 3] { return a @ 2 }",
                "2 }",
                "@ needs tensors of rank >= 1",
            ),
            (
                M + "func main(a: bool[4, 3], b: bool[3]) -> bool[4] { return a @ b }",
                "@",
                "@ needs numeric operands",
            ),
            (
                M + 'func main(a: f32[4], b: f32[4]) -> f32[4] { return where("a", a, b) }',
                '"a"',
                "argument 'cond' of where() must be a tensor",
            ),
            (
                M + "func main(a: f32[4, 3], b: f32[4, 2]) -> f32[8, 3] { return concat([a, b], 0) }",
                "[a, b]",
                "concat: shapes f32[4, 3] and f32[4, 2] differ outside axis 0",
            ),
            (
                M + "func main(a: f32[1, 8, 3], w: f32[3, 2, 4]) -> f32[1, 8, 4] { return conv(a, w) }",
                "conv",
                "conv: input has 3 channels, kernel expects 2",
            ),
            (
                M + "func main(a: f32[1, 8, 3], w: f32[3, 4]) -> f32[1, 8, 4] { return conv(a, w) }",
                "w)",
                "conv kernel must be",
            ),
            (
                M + "func main(a: f32[1, 2, 3], w: f32[3, 3, 4]) -> f32[1, 8, 4] {\n"
                'return conv(a, w, padding="VALID") }',
                "conv",
                "does not fit",
            ),
            (
                M + "func main(a: f32[1, 8, 3], w: f32[3, 3, 4]) -> f32[1, 8, 4] {\n"
                'return conv(a, w, padding="FULL") }',
                '"FULL"',
                "conv padding must be",
            ),
            (
                M + "func main(a: bool[4]) -> f32[4] { return log(a) }",
                "log",
                "log needs a float operand, got bool[4]",
            ),
            (
                M + "func main(a: f32[4]) -> bool[4] { return logical_and(a, a) }",
                "logical_and",
                "logical_and needs bool operands",
            ),
            (
                M + "func main(a: f32[4]) -> bool[4] { return logical_not(a) }",
                "logical_not",
                "needs a bool operand",
            ),
            (M + "func main(a: bool[4]) -> bool[4] { return a + a }", "+", "arithmetic on bool tensors"),
            (M + "func main(a: bool[4]) -> bool[4] { return -a }", "-a", "cannot negate a bool tensor"),
            (
                M + "func main(t: f32[4, 3], i: f32[2]) -> f32[2, 3] { return take(t, i) }",
                "i)",
                "take: ids must be integers",
            ),
            (
                M + "func main(i: f32[2]) -> f32[2, 3] { return one_hot(i, 3) }",
                "i, 3",
                "one_hot: ids must be integers",
            ),
            (
                M + "func main(a: f32[4]) -> f32[4] { return sum(a, keepdims=1) }",
                "1)",
                "must be true or false",
            ),
            (M + "func main(a: f32[4]) -> f32[4] { return cast(a, a) }", "a)", "must be a dtype"),
            (
                M + "func main(a: f32[4]) -> f32[4] { return zeros(a) }",
                "a)",
                "must be a type such as f32[4, 8]",
            ),
            (
                M + "func main(a: f32[4]) -> f32[4] { return iota(bool[4]) }",
                "bool[4]",
                "iota needs a numeric dtype",
            ),
            (M + "func main(a: f32[4]) -> f32[4] { return full(i32[4], 1.5) }", "1.5", "not an integer"),
            (
                M + "func main(a: i32[4]) -> i32[4] { return a + 3000000000 }",
                "3000000000",
                "does not fit i32",
            ),
            (
                M + "func main(a: f32[4]) -> f32[4] { return neg(a, a) }",
                "a)",
                "neg() takes at most 1 argument",
            ),
            (
                M + "func main(a: f32[4]) -> f32[4] { return cast(a) }",
                "cast",
                "cast() is missing argument 'dtype'",
            ),
            (
                M + "func main(a: f32[4]) -> f32[4] { return pad(a, [[1, -1]]) }",
                "[[1, -1]]",
                "padding must be non-negative",
            ),
            (
                M + "func main(a: f32[4, 3]) -> f32[4] { return transpose(a, [1]) }",
                "[1]",
                "is not a permutation",
            ),
            (
                M + "func main(a: f32[4, 3]) -> f32[4] { return transpose(a, [1, 1]) }",
                "[1, 1]",
                "is not a permutation",
            ),
            (M + "func main(a: f32[4, 3]) -> f32[4] { return squeeze(a, 1) }", "1)", "has size 3, not 1"),
            (
                M + "func main(a: f32[4, 3]) -> f32[4] { return broadcast_to(a, [3, 3]) }",
                "broadcast_to",
                "cannot broadcast",
            ),
            (
                M + "func main(a: f32[4, 3]) -> f32[4] { return roll(a, 1.5, 0) }",
                "roll",
                "roll: shift and axis must be integers",
            ),
        ]
    ),
)
def test_builtin_error(src, at, fragment, nth):
    check(src, at, fragment, nth)


@pytest.mark.parametrize(
    "spec, fragment",
    [
        ('"ij"', 'needs an explicit output ("->")'),
        ('"ijk->ji"', '"ijk" has 3 indices but the operand has rank 2'),
        ('"i->i"', '"i" has 1 indices but the operand has rank 2'),
        ('"ii->i"', "index repeated within"),
        ('"ij->k"', "output index not in any operand"),
        ('"ij->jj"', "output indices must be distinct"),
        ('"i...->i"', "ellipsis is not supported"),
        ('"i1->i"', "indices must be letters"),
        ('"ij,jk->ik"', "names 2 operand(s), got 1"),
    ],
)
def test_bad_einsum_spec(spec, fragment):
    src = M + f"func main(a: f32[4, 3]) -> f32[3, 4] {{ return einsum({spec}, a) }}"
    check(src, "einsum", fragment)


def test_einsum_mismatched_sizes():
    src = M + 'func main(a: f32[4, 3], b: f32[4, 3]) -> f32[4, 4] { return einsum("ij,jk->ik", a, b) }'
    check(src, "einsum", "index j is 3 in one operand and 4 in another")


@pytest.mark.parametrize("spec, fragment", [
    ('"ij,jk,kl->il"', "index j is 3 in one operand and 4 in another"),
    ('"ij,jk->ik"', "names 2 operand(s), got 3"),
    ('"ij,ij,ij"', "needs an explicit output"),
])
def test_bad_many_operand_einsum(spec, fragment):
    src = M + f"func main(a: f32[4, 3]) -> f32[4, 3] {{ return einsum({spec}, a, a, a) }}"
    check(src, "einsum", fragment)


@pytest.mark.parametrize(
    "shape, fragment",
    [
        ("[5, 2]", "cannot reshape f32[4, 3] (12 elements) to [5, 2]"),
        ("[5, -1]", "cannot reshape f32[4, 3] (12 elements) to [5, -1]"),
        ("[-1, -1]", "only one -1 is allowed"),
        ("[0, -1]", "cannot reshape"),
        ("[2, -3]", "bad size"),
    ],
)
def test_reshape_size_mismatch(shape, fragment):
    src = M + f"func main(a: f32[4, 3]) -> f32[12] {{ return reshape(a, {shape}) }}"
    # the builtin's own checks and the op's shape rule (which blames its `shape`) alike point at the shape
    check(src, shape, fragment)


@pytest.mark.parametrize(
    "call, at, fragment",
    [
        ("sum(a, axis=2)", "2)", "axis 2 is out of range for rank 2"),
        ("sum(a, -3)", "-3", "axis -3 is out of range for rank 2"),
        ("sum(a, [0, -2])", "[0, -2]", "names a dimension twice"),
        ("argmax(a, 5)", "5)", "out of range"),
        ("argmax(a, [0, 1])", "[0, 1]", "argmax takes a single axis"),
        ("softmax(a, 2)", "2)", "out of range"),
        ("concat([a, a], 3)", "3)", "out of range"),
        ("expand_dims(a, 3)", "3)", "out of range for rank 3"),
        ("iota(i32[4], 1)", "1)", "out of range for rank 1"),
        ("take(a, 0, axis=2)", "2)", "out of range"),
        ("roll(a, 1, -3)", "-3", "out of range"),
        ("sum(a, 1.5)", "1.5", "must be an integer or a list of integers"),
    ],
)
def test_bad_axis(call, at, fragment):
    check(M + f"func main(a: f32[4, 3]) -> f32[] {{ return {call} }}", at, fragment)


@pytest.mark.parametrize(
    "src, at, fragment, nth",
    table(
        [
            (
                M + "func main(a: f32[4]) -> f32[] { return a[4] }",
                "4] }",
                "index 4 is out of range for dimension 0 of size 4",
            ),
            (M + "func main(a: f32[4]) -> f32[] { return a[-5] }", "-5", "index -5 is out of range"),
            (M + "func main(a: f32[4], i: i32[2]) -> f32[] { return a[i] }", "i]", "use take(x, ids, axis)"),
            (M + "func main(a: f32[4]) -> f32[] { return a[0, 0] }", "a[", "too many indices (2) for f32[4]"),
            (M + "func main(a: f32[4, 1]) -> f32[4, 1, 1] { return a[:, 0:1, None] }", "None",
             "indexing with None (numpy's new axis) is not supported"),
            (M + "func main(xs: f32[0, 4]) -> f32[4] {\n  t = zeros(f32[4])\n  loop i in range(0) {\n"
             "    t = t + xs[i]\n  }\n  return t\n}", "i]", "indexing dimension 0 of f32[0, 4], which is empty"),
            (M + "func two(a: f32[4]) -> (f32[4], f32[]) { return a, sum(a) }\n"
             "func main(a: f32[4]) -> f32[4] { return two(a) * 2.0 }", "* 2.0",
             "cannot apply 'mul' to the 2 results of a call (unpack them first"),
            (
                M + "func main(a: f32[4]) -> f32[] { return a[::0] }",
                "0]",
                "slice step must be positive, got 0",
            ),
            (M + "func main(a: f32[4]) -> f32[] { return a[::-1] }", "-1", "slice step must be positive"),
            (
                M + "func main(a: f32[4]) -> f32[] { return a[1.5] }",
                "1.5",
                "an index must be a static integer",
            ),
        ]
    ),
)
def test_indexing_error(src, at, fragment, nth):
    check(src, at, fragment, nth)


# ---------------------------------------------------------------------------------- module level


def test_devices_not_a_permutation():
    src = "mesh [x=2, y=2] devices [0, 1, 2, 2]\nfunc main(a: f32[4]) -> f32[4] { return a }"
    check(src, "devices", "devices must be a permutation of 0..3 for a mesh of 4 devices")


def test_devices_wrong_count():
    src = "mesh [x=2] devices [0, 1, 2]\nfunc main(a: f32[4]) -> f32[4] { return a }"
    check(src, "devices", "permutation of 0..1")


def test_devices_after_mesh_override():
    src = "mesh [x=2] devices [1, 0]\nfunc main(a: f32[4]) -> f32[4] { return a }"
    e = check(src, "devices", "permutation of 0..3", mesh={"x": 4})
    assert e.note and "--mesh" in e.note


def test_missing_mesh():
    check("func main(a: f32[4]) -> f32[4] { return a }", "func", "no mesh declaration")


def test_two_meshes():
    src = M + "mesh [z=2]\nfunc main(a: f32[4]) -> f32[4] { return a }"
    check(src, "mesh [z=2]", "more than one mesh declaration")


@pytest.mark.parametrize(
    "src, at, fragment, nth",
    table(
        [
            (
                "mesh [x=2, x=2]\nfunc main(a: f32[4]) -> f32[4] { return a }",
                "x=2]",
                "mesh axis 'x' is declared twice",
            ),
            ("mesh [x=0]\nfunc main(a: f32[4]) -> f32[4] { return a }", "0", "must have a positive size"),
            ("mesh [_=2]\nfunc main(a: f32[4]) -> f32[4] { return a }", "_", "'_' cannot name a mesh axis"),
            (
                "mesh [x=65536, y=65536]\nfunc main(a: f32[4]) -> f32[4] { return a }",
                "mesh",
                "devices; at most",
            ),
            (
                M + "const A = true\nfunc main(a: f32[4]) -> f32[4] { return a }",
                "true",
                "const 'A' must be an integer or a float, got a bool",
            ),
            (
                M + "const A = 1.5\nfunc main(a: f32[A]) -> f32[4] { return a }",
                "A]",
                "a dimension must be a static integer; 'A' is a float const (1.5)",
            ),
            (
                M + "const A = 1\nconst A = 2\nfunc main(a: f32[4]) -> f32[4] { return a }",
                "A",
                "defined twice",
                2,
            ),
            (M + "const A = 1", "mesh", "no function defined"),
            (
                M + "func f(a: f32[4]) -> f32[4] { return a }\nfunc g(a: f32[4]) -> f32[4] { return a }",
                "func",
                "several functions and none is 'main'",
            ),
            (
                M
                + "func main(a: f32[4]) -> f32[4] { return a }\nfunc main(a: f32[4]) -> f32[4] { return a }",
                "func",
                "function 'main' is defined twice",
                2,
            ),
            (
                M + "func sum(a: f32[4]) -> f32[4] { return a }\nfunc main(a: f32[4]) -> f32[4] { return a }",
                "func",
                "has the name of a builtin",
            ),
            (
                M + "func main(a: f32[4], a: f32[4]) -> f32[4] { return a }",
                "a:",
                "parameter 'a' is declared twice",
                2,
            ),
            (M + "func main(a: f32[-4]) -> f32[4] { return a }", "-4", "dimension must be non-negative"),
            (
                M + "func main(a: f32[4.0]) -> f32[4] { return a }",
                "4.0",
                "a dimension must be a static integer",
            ),
            (M + "func main(a: f32[4]) -> () { return a }", "func", "declares no results"),
        ]
    ),
)
def test_module_error(src, at, fragment, nth):
    check(src, at, fragment, nth)


def test_unknown_entry():
    check(
        M + "func main(a: f32[4]) -> f32[4] { return a }",
        "mesh",
        "no function 'mian' (--entry); did you mean 'main'",
        entry="mian",
    )


# ---------------------------------------------------------------------------------- functions


def test_recursion():
    src = (
        M + "func f(a: f32[4]) -> f32[4] { return g(a) }\nfunc g(a: f32[4]) -> f32[4] { return f(a) }\n"
        "func main(a: f32[4]) -> f32[4] { return f(a) }"
    )
    # found where g, inlined into f inlined into main, calls f again
    e = check(src, "f(a) }", "recursive call to 'f' (main -> f -> g -> f)", nth=1)
    assert e.line == 3


def test_self_recursion_in_uncalled_function():
    src = M + "func f(a: f32[4]) -> f32[4] { return f(a) }\nfunc main(a: f32[4]) -> f32[4] { return a }"
    check(src, "f(a) }", "recursive call to 'f'")


@pytest.mark.parametrize(
    "src, at, fragment, nth",
    table(
        [
            (
                M + "func main(a: f32[4]) -> f32[4] { return a, a }",
                "return",
                "'main' returns 2 value(s) but declares 1",
            ),
            (
                M + "func main(a: f32[4]) -> (f32[4], f32[4]) { return a }",
                "return",
                "returns 1 value(s) but declares 2",
            ),
            (
                M + "func main(a: f32[4]) -> f32[4] { return sum(a) }",
                "sum",
                "result 0 of 'main' is f32[], but the function declares f32[4]",
            ),
            (
                M + "func main(a: f32[4]) -> i32[4] { return a }",
                "a }",
                "result 0 of 'main' is f32[4], but the function declares i32[4]",
            ),
            (
                M + "func main(a: f32[4]) -> (f32[4], f32[4]) { return a, a > 0 }",
                "> 0",
                "result 1 of 'main' is bool[4]",
            ),
            (
                M + "func f(a: f32[4]) -> f32[4] { return a[0] }\n"
                "func main(a: f32[4]) -> f32[4] { return f(a) }",
                "a[0]",
                "result 0 of 'f' is f32[]",
            ),
            (
                M + "func main(a: f32[4]) -> f32[4] {\n  b = a\n}",
                "}",
                "function 'main' does not return a value",
            ),
            (
                M + "func main(a: f32[4]) -> f32[4] {\n  return a\n  b = a\n}",
                "b = a",
                "statements after return are never run",
            ),
            (
                M + "func main(a: f32[4]) -> f32[4] {\n  for i in range(2) { return a }\n}",
                "return",
                "return inside a for loop",
            ),
            (
                M + "func main(a: f32[4]) -> f32[4] {\n  for i in range(1, 4, 0) { a = a }\n  return a\n}",
                "0)",
                "step must not be zero",
            ),
            (
                M + "func main(a: f32[4]) -> f32[4] {\n  for i in range(a) { a = a }\n  return a\n}",
                "a)",
                "expected a static value",
            ),
            (
                M + "func main(a: f32[4]) -> f32[4] {\n  for i in range(10 ** 9) { a = a }\n  return a\n}",
                "for",
                "unroll",
            ),
            (
                M + "func f(a: f32[4]) -> (f32[4], f32[4]) { return a, a }\n"
                "func main(a: f32[4]) -> f32[4] {\n  p, q, r = f(a)\n"
                "  return p }",
                "p, q, r",
                "the call returns 2 values but 3 names are assigned",
            ),
            (
                M + "func f(a: f32[4]) -> (f32[4], f32[4]) { return a, a }\n"
                "func main(a: f32[4]) -> f32[4] {\n  p = f(a)\n"
                "  return p }",
                "f(a)\n",
                "the call returns 2 values; unpack them",
            ),
            (
                M + "func main(a: f32[4]) -> f32[4] {\n  p, q = a\n  return p }",
                "a\n",
                "cannot unpack a tensor f32[4] into 2 names",
            ),
            (
                M
                + "func f(a: f32[4]) -> f32[4] { return a }\nfunc main(a: f32[5]) -> f32[4] { return f(a) }",
                "f(a)",
                "argument 'a' of 'f' must be f32[4], got f32[5]",
            ),
            (
                M + "func f(a: f32[4]) -> f32[4] { return a }\n"
                "func main(a: f32[4]) -> f32[4] { return f(a, a) }",
                "f(a, a)",
                "'f' takes 1 argument(s), got 2",
            ),
            (
                M + "func f(a: f32[4], b: f32[4]) -> f32[4] { return a }\n"
                "func main(a: f32[4]) -> f32[4] { return f(a) }",
                "f(a)",
                "missing argument 'b' of 'f'",
            ),
            (
                M + "func f(a: f32[4]) -> f32[4] { return a }\n"
                "func main(a: f32[4]) -> f32[4] { return f(a, a=a) }",
                "a=a",
                "argument 'a' given twice",
            ),
            (
                M + "func f(a: f32[4]) -> f32[4] { return a }\n"
                "func main(a: f32[4]) -> f32[4] { return f(1.5) }",
                "1.5",
                "must be a tensor f32[4]",
            ),
        ]
    ),
)
def test_function_error(src, at, fragment, nth):
    check(src, at, fragment, nth)


def test_uncalled_function_is_type_checked():
    src = (
        M
        + "func unused(a: f32[4]) -> f32[4] { return a @ a @ a }\nfunc main(a: f32[4]) -> f32[4] { return a }"
    )
    # (a @ a) is a scalar; the error points at that left operand (an operator's span is the operator)
    check(src, "@", "@ needs tensors of rank >= 1")


@pytest.mark.parametrize(
    "src, at, fragment, nth",
    table(
        [
            (
                M + "func main(a: f32[4]) -> f32[] { return sum(a, axes=0) }",
                "axes",
                "sum() has no argument 'axes'; did you mean 'axis'?",
            ),
            (
                M + "func main(a: f32[4]) -> f32[] { return softmax(a, dim=0) }",
                "dim",
                "softmax() has no argument 'dim'",
            ),
            (
                M + "func main(a: f32[4]) -> f32[] { return sum(a, axis=0, axis=0) }",
                "axis=0)",
                "argument 'axis' of sum() given twice",
            ),
            (
                M + "func f(a: f32[4]) -> f32[4] { return a }\n"
                "func main(a: f32[4]) -> f32[4] { return f(b=a) }",
                "b=a",
                "'f' has no parameter 'b'",
            ),
        ]
    ),
)
def test_unknown_keyword(src, at, fragment, nth):
    check(src, at, fragment, nth)


@pytest.mark.parametrize("call", ["sum(axis=0, a)", "maximum(a=a, a)", "f(a=a, a)"])
def test_positional_after_keyword(call):
    src = (
        M + f"func f(a: f32[4]) -> f32[4] {{ return a }}\nfunc main(a: f32[4]) -> f32[4] {{ return {call} }}"
    )
    check(src, "a)", "positional argument after a keyword argument")


# ---------------------------------------------------------------------------------- files and overrides


def test_empty_file(tmp_path):
    p = tmp_path / "empty.spmd"
    p.write_text("")
    e = compile_error(str(p))
    assert (e.line, e.col) == (1, 1) and "empty file" in e.message
    assert e.file == str(p)


def test_whitespace_only_file(tmp_path):
    p = tmp_path / "blank.spmd"
    p.write_text("\n  \n# just a comment\n")
    e = compile_error(str(p))
    assert e.line >= 1 and e.col >= 1


def test_binary_file(tmp_path):
    p = tmp_path / "bin.spmd"
    p.write_bytes(b"\x7fELF\x02\x01\x01\x00\x00\x00\xff\xfe")
    e = compile_error(str(p))
    assert (e.line, e.col) == (1, 1) and "binary file" in e.message


def test_non_utf8_file(tmp_path):
    p = tmp_path / "latin.spmd"
    p.write_bytes(b"mesh [x=2]\nfunc main(a: f32[4]) -> f32[4] { return a } # caf\xe9\n")
    e = compile_error(str(p))
    assert (e.line, e.col) == (2, 50) and "not UTF-8" in e.message


def test_file_errors_name_the_file(tmp_path):
    p = tmp_path / "prog.spmd"
    p.write_text(M + "func main(a: f32[4]) -> f32[4] { return b }\n")
    e = compile_error(str(p))
    assert e.render().startswith(f"{p}:2:41: error: unknown name 'b'")


@pytest.mark.parametrize("path", [".", "no/such/file.spmd"])
def test_api_bad_path_is_a_located_error(path):
    # a directory, or a missing .spmd file: a located user error, not an OSError
    e = compile_error(path)
    assert e.file == path and (e.line, e.col) == (1, 1)


def test_mesh_override_names_absent_axis():
    with pytest.raises(OverrideError) as info:
        spmdlang.compile(M + "func main(a: f32[4]) -> f32[4] { return a }", mesh={"data": 4})
    assert isinstance(info.value, SpmdError)
    assert "--mesh names axis 'data'" in info.value.message and "axes: x, y" in info.value.message
    assert info.value.line >= 1 and info.value.col >= 1


def test_set_names_absent_const():
    with pytest.raises(OverrideError) as info:
        spmdlang.compile(M + "const B = 2\nfunc main(a: f32[4]) -> f32[4] { return a }", consts={"C": 4})
    assert "--set names const 'C'" in info.value.message and "consts: B" in info.value.message


def test_override_with_bad_size():
    with pytest.raises(OverrideError):
        spmdlang.compile(M + "func main(a: f32[4]) -> f32[4] { return a }", mesh={"x": 0})


@pytest.mark.parametrize(
    "kw, at, fragment",
    [
        ({"consts": {"B": 2.5}}, "B =", "--set B=2.5: 'B' is an integer const; give an integer"),
        ({"consts": {"B": True}}, "B =", "'B' is an integer const"),
        ({"consts": {"B": "4"}}, "B =", "'B' is an integer const"),
        ({"mesh": {"x": True}}, "x=2", "sizes must be positive integers"),
    ],
)
def test_api_overrides_must_be_integers(kw, at, fragment):
    src = "mesh [x=2]\nconst B = 4\nfunc main(a: f32[B]) -> f32[B] { return a }"
    with pytest.raises(OverrideError) as info:
        spmdlang.compile(src, **kw)
    e = info.value
    assert fragment in e.message
    assert (e.line, e.col) == locate(src, at)


def test_set_makes_shapes_mismatch():
    src = M + "const B = 4\nfunc main(a: f32[B]) -> f32[4] { return a }"
    e = check(src, "a }", "result 0 of 'main' is f32[6]", consts={"B": 6})
    assert not isinstance(e, OverrideError)


def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "spmdlang", *args], capture_output=True, text=True, cwd=cwd)


@pytest.fixture
def prog(tmp_path):
    p = tmp_path / "prog.spmd"
    p.write_text(
        "mesh [x=2]\nconst B = 4\nfunc main(a: f32[B, 3] {x, _},\n          ids: i32[3]) -> f32[B, 3] {\n"
        "  return a * 2\n}\n"
    )
    return p


def test_cli_override_exit_2(prog):
    r = _cli("run", str(prog), "--backend", "ref", "--mesh", "data=2")
    assert r.returncode == 2 and "--mesh names axis 'data'" in r.stderr and "Traceback" not in r.stderr
    r = _cli("run", str(prog), "--backend", "ref", "--set", "C=2")
    assert r.returncode == 2 and "--set names const 'C'" in r.stderr


@pytest.mark.parametrize(
    "arrays, fragment, param",
    [
        ({"a": np.ones((4, 3), np.float32)}, "has no array 'ids' for parameter ids: i32[3]", "ids"),
        (
            {"a": np.ones((4, 2), np.float32), "ids": np.zeros(3, np.int32)},
            "'a' has shape [4, 2], but the parameter is f32[4, 3]",
            "a",
        ),
        (
            {"a": np.ones((4, 3), np.float64), "ids": np.zeros(3, np.int32)},
            "'a' has dtype float64, but the parameter is f32[4, 3]",
            "a",
        ),
        ({"a": np.ones((4, 3), np.float32), "ids": np.zeros(3, np.int64)}, "'ids' has dtype int64", "ids"),
    ],
)
def test_cli_bad_npz(prog, tmp_path, arrays, fragment, param):
    npz = tmp_path / "in.npz"
    np.savez(npz, **arrays)
    r = _cli("run", str(prog), "--backend", "ref", "--inputs", str(npz))
    assert r.returncode == 1, r.stderr
    assert fragment in r.stderr and "Traceback" not in r.stderr
    line, col = (3, 11) if param == "a" else (4, 11)
    assert f"{prog}:{line}:{col}: error: " in r.stderr


def test_cli_npz_not_an_archive(prog, tmp_path):
    bad = tmp_path / "bad.npz"
    bad.write_text("not a zip")
    r = _cli("run", str(prog), "--backend", "ref", "--inputs", str(bad))
    assert r.returncode == 1 and "not an .npz archive" in r.stderr and "Traceback" not in r.stderr
    r = _cli("run", str(prog), "--backend", "ref", "--inputs", str(tmp_path / "missing.npz"))
    assert r.returncode == 1 and "no such file" in r.stderr


def test_api_bad_inputs():
    c = spmdlang.compile(M + "func main(a: f32[4]) -> f32[4] { return a }")
    with pytest.raises(SpmdError, match="has shape"):
        c.run({"a": np.ones(5, np.float32)})
    with pytest.raises(SpmdError, match="has no array 'a'"):
        c.run({"b": np.ones(4, np.float32)})


# ---------------------------------------------------------------------------------- rendering


def test_render_has_source_line_and_caret():
    src = M + "func main(x: f32[4]) -> f32[4] {\n  y = x + zz\n  return y\n}"
    e = compile_error(src)
    text = e.render()
    first, code, caret = text.splitlines()[:3]
    assert first == "<input>:3:11: error: unknown name 'zz'"
    assert code == "  y = x + zz"
    assert caret == " " * 10 + "^~"
    assert str(e) == text


def test_render_with_filename_and_note(tmp_path):
    p = tmp_path / "p.spmd"
    p.write_text("mesh [x=2] devices [1, 0]\nfunc main(a: f32[4]) -> f32[4] { return a }\n")
    e = compile_error(str(p), mesh={"x": 3})
    lines = e.render().splitlines()
    assert lines[0].startswith(f"{p}:1:12: error: devices must be a permutation")
    assert lines[1] == "mesh [x=2] devices [1, 0]"
    assert lines[2] == " " * 11 + "^" + "~" * (len("devices [1, 0]") - 1)
    assert lines[-1].startswith("note: ")


def test_render_shows_the_right_line_after_a_form_feed():
    e = compile_error("mesh [x=2] # \x0c page\nfunc main(a: f32[3]) -> f32[3] { return q }")
    assert (e.line, e.col) == (2, 41)
    assert e.render().splitlines()[1] == "func main(a: f32[3]) -> f32[3] { return q }"


def test_render_caret_at_end_of_line():
    e = compile_error(M + "func main(x: f32[4]) -> f32[4] { return sum(x,")
    lines = e.render().splitlines()
    assert lines[2].index("^") == e.col - 1 == len(lines[1])
