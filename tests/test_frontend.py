"""Parser and lowering details: the body-brace post-lexer, lexical rules, precedence, IR naming."""

from __future__ import annotations

import re

import numpy as np
import pytest

import spmdlang
from spmdlang.errors import SpmdError
from spmdlang.frontend import ast as A
from spmdlang.frontend.parse import parse

M = "mesh [x=2, y=2]\n"


def ir_of(src: str, **kw) -> str:
    return spmdlang.compile(src, **kw).ir


def run1(src: str, **inputs):
    return spmdlang.compile(src).run({k: np.asarray(v) for k, v in inputs.items()})


def body_expr(text: str) -> A.Node:
    """The AST of `return <text>` in a one-line function."""
    module, _ = parse(M + f"func main(a: f32[4], b: f32[4], c: f32[4]) -> f32[4] {{ return {text} }}")
    (ret,) = module.funcs[0].body
    assert isinstance(ret, A.Return)
    return ret.values[0]


def shape(node) -> str:
    """A fully parenthesised rendering of an expression AST."""
    if isinstance(node, A.Name):
        return node.id
    if isinstance(node, (A.IntLit, A.FloatLit)):
        return str(node.value)
    if isinstance(node, (A.BinOp, A.Compare)):
        return f"({shape(node.left)} {node.op} {shape(node.right)})"
    if isinstance(node, A.Neg):
        return f"(-{shape(node.operand)})"
    if isinstance(node, A.Pow):
        return f"({shape(node.base)} ** {shape(node.exponent)})"
    if isinstance(node, A.Call):
        return f"{node.func}({', '.join(shape(a) for a in node.args)})"
    if isinstance(node, A.Subscript):
        return f"{shape(node.base)}[...]"
    raise AssertionError(type(node))


# ---------------------------------------------------------------------------------- the body brace


@pytest.mark.parametrize(
    "signature, specs",
    [
        ("-> f32[4] { return a }", [None]),
        ("-> f32[4] {x} { return a }", ["{x}"]),
        ("-> f32[4] {_} { return a }", ["{_}"]),
        ("-> f32[4]\n{\n  return a\n}", [None]),
        ("-> f32[4] {x}\n{\n  return a\n}", ["{x}"]),
        ("-> f32[4]{x}{return a}", ["{x}"]),
        ("-> (f32[4]) { return a }", [None]),
        ("-> (f32[4] {y}) { return a }", ["{y}"]),
        ("-> (f32[4] {x}, f32[]) { return a, sum(a) }", ["{x}", None]),
        ("-> (f32[4], f32[] {}) { return a, sum(a) }", [None, "{}"]),
        ("-> (f32[4] {(x, y)}, f32[] {},) { return a, sum(a) }", ["{(x, y)}", "{}"]),
    ],
)
def test_body_brace_vs_result_spec(signature, specs):
    src = M + f"func main(a: f32[4]) {signature}"
    module, _ = parse(src)
    f = module.funcs[0]
    assert len(f.results) == len(specs)
    got = [None if r.spec is None else _spec_text(r.spec) for r in f.results]
    assert got == specs
    assert isinstance(f.body[-1], A.Return)
    spmdlang.compile(src)


def _spec_text(spec: A.SpecExpr) -> str:
    parts = []
    for e in spec.entries:
        if e.axes is None:
            parts.append("?")
        elif len(e.axes) == 1:
            parts.append(e.axes[0])
        else:
            parts.append("(" + ", ".join(e.axes) + ")")
    return "{" + ", ".join(parts) + "}"


def test_param_specs_before_comma_and_paren():
    module, _ = parse(M + "func main(a: f32[4, 4] {x, y}, b: f32[4] {_}, c: f32[2]) -> f32[4] { return b }")
    specs = [None if p.spec is None else _spec_text(p.spec) for p in module.funcs[0].params]
    assert specs == ["{x, y}", "{_}", None]


def test_spec_then_next_function():
    src = M + (
        "func f(a: f32[4]) -> f32[4] {x} { return a }\nfunc main(a: f32[4]) -> f32[4] { return f(a) }\n"
    )
    module, _ = parse(src)
    assert [f.name for f in module.funcs] == ["f", "main"]
    assert module.funcs[0].results[0].spec is not None
    assert module.funcs[1].results[0].spec is None


def test_body_that_looks_like_a_spec_is_a_body():
    # `{ return a }` right after `]` is the body even though `{` follows a type
    e = pytest.raises(SpmdError, spmdlang.compile, M + "func main(a: f32[4]) -> f32[4] {x}").value
    assert "unexpected '}'" in e.message


def test_shard_spec_in_body_after_index():
    src = M + "func main(a: f32[4, 4]) -> f32[4] {\n  b = shard(a[0], {x})\n  return b\n}"
    spmdlang.compile(src)


# ---------------------------------------------------------------------------------- lexical


def test_comments_everywhere():
    src = (
        "# leading comment\n"
        "mesh [x=2]  # the mesh\n"
        "const N = 4 # a const\n"
        "func main(a: f32[N],  # first\n"
        "          b: f32[N]   # second\n"
        ") -> f32[N] {  # results\n"
        "  # a whole-line comment\n"
        "  c = a + b  # sum\n"
        "  return c  # done\n"
        "}\n"
        "# trailing comment without newline"
    )
    a, b = np.arange(4, dtype=np.float32), np.ones(4, np.float32)
    np.testing.assert_array_equal(run1(src, a=a, b=b)[0], a + b)


def test_hash_inside_string_is_not_a_comment():
    src = M + 'func main(a: f32[4, 3]) -> f32[3, 4] { return einsum("ij->ji", a) } # "#"'
    spmdlang.compile(src)


def test_semicolons_separate_items_and_statements():
    src = "mesh [x=2]; const N = 3; func main(a: f32[N]) -> f32[N] { b = a * 2; c = b + 1; ; return c; }"
    a = np.arange(3, dtype=np.float32)
    np.testing.assert_array_equal(run1(src, a=a)[0], a * 2 + 1)


def test_newlines_are_insignificant():
    src = (
        "mesh\n[\nx\n=\n2\n]\nfunc\nmain\n(\na\n:\nf32\n[\n3\n]\n)\n->\nf32\n[\n3\n]\n{\nreturn\na\n+\n1\n}\n"
    )
    np.testing.assert_array_equal(run1(src, a=np.zeros(3, np.float32))[0], np.ones(3, np.float32))


def test_crlf_line_endings():
    src = "mesh [x=2]\r\nfunc main(a: f32[3]) -> f32[3] {\r\n  b = a + 1\r\n  return b\r\n}\r\n"
    np.testing.assert_array_equal(run1(src, a=np.zeros(3, np.float32))[0], np.ones(3, np.float32))
    e = pytest.raises(SpmdError, spmdlang.compile, src.replace("a + 1", "a + q")).value
    assert (e.line, e.col) == (3, 11)


def test_lone_carriage_returns_end_lines():
    src = "mesh [x=2]\rfunc main(a: f32[3]) -> f32[3] {\r  return a + q\r}"
    e = pytest.raises(SpmdError, spmdlang.compile, src).value
    assert (e.line, e.col) == (3, 14)
    assert e.render().splitlines()[1] == "  return a + q"


@pytest.mark.parametrize("sep", ["\x0c", "\x0b", "\x1c", "\x85", "\u2028"])
def test_unusual_line_separators_do_not_crash(sep):
    # Python's splitlines() splits on these; the lexer counts lines by \n only
    for body in ("return a $", "return q", "return a"):
        src = f"mesh [x=2] # {sep}\nfunc main(a: f32[3]) -> f32[3] {{ {body}"
        e = pytest.raises(SpmdError, spmdlang.compile, src).value
        assert e.line == 2 and e.col >= 1
        e.render()


def test_byte_order_mark_is_ignored():
    src = "\ufeffmesh [x=2]\nfunc main(a: f32[3]) -> f32[3] { return a }"
    spmdlang.compile(src)


def test_tabs_count_as_one_column():
    src = "mesh [x=2]\nfunc main(a: f32[3]) -> f32[3] {\n\treturn q\n}"
    e = pytest.raises(SpmdError, spmdlang.compile, src).value
    assert (e.line, e.col) == (3, 9)


@pytest.mark.parametrize(
    "name", ["meshy", "format", "in_x", "range2", "_", "_tmp", "returned", "true_", "For", "F32"]
)
def test_names_that_contain_keywords(name):
    src = M + f"func main({name}: f32[3]) -> f32[3] {{ return {name} * 2 }}"
    np.testing.assert_array_equal(run1(src, **{name: np.ones(3, np.float32)})[0], np.full(3, 2, np.float32))


@pytest.mark.parametrize(
    "where",
    [
        "func for(a: f32[3]) -> f32[3] { return a }",
        "func main(in: f32[3]) -> f32[3] { return in }",
        "func main(a: f32[3]) -> f32[3] { true = a\n return a }",
        "const func = 3\nfunc main(a: f32[3]) -> f32[3] { return a }",
        "func main(a: f32[3]) -> f32[3] { return a * devices }",
    ],
)
def test_keywords_are_not_names(where):
    e = pytest.raises(SpmdError, spmdlang.compile, M + where).value
    assert "keyword" in e.message
    assert e.line >= 2


@pytest.mark.parametrize(
    "text, value",
    [("12", 12), ("1.0", 1.0), ("1e-5", 1e-5), (".5", 0.5), ("2.", 2.0), ("1E3", 1000.0), ("3.5e+2", 350.0)],
)
def test_number_literals(text, value):
    node = body_expr(text)
    assert type(node) is (A.IntLit if isinstance(value, int) else A.FloatLit)
    assert node.value == value


def test_negative_literal_is_negation():
    node = body_expr("-3")
    assert isinstance(node, A.Neg) and node.operand.value == 3
    out = run1(
        M + "const N = -3\nfunc main(a: f32[2]) -> f32[2] { return a * N + -1 }", a=np.ones(2, np.float32)
    )
    np.testing.assert_array_equal(out[0], np.full(2, -4, np.float32))


def test_trailing_commas():
    src = M + (
        "func f(a: f32[2],) -> f32[2] { return a }\n"
        "func main(a: f32[2, 2],) -> (f32[2], f32[2, 2],) {\n"
        "  b = f(a[0,],)\n"
        "  return b, pad(a, [[0, 0], [0, 0],],)\n"
        "}\n"
    )
    a = np.arange(4, dtype=np.float32).reshape(2, 2)
    b, p = run1(src, a=a)
    np.testing.assert_array_equal(b, a[0])
    np.testing.assert_array_equal(p, a)


@pytest.mark.parametrize(
    "good, bad",
    [
        ("b = f(", "b, = f("),
        ("return a }", "return a, }"),
        ("[0, 0],],)\n", "[0, 0],],),\n"),
    ],
)
def test_trailing_commas_not_allowed(good, bad):
    src = M + (
        "func f(a: f32[2]) -> f32[2] { return a }\n"
        "func main(a: f32[2, 2]) -> (f32[2], f32[2, 2]) {\n"
        "  b = f(a[0])\n"
        "  return b, pad(a, [[0, 0], [0, 0],],)\n"
        "}\n"
    )
    spmdlang.compile(src)
    assert good in src
    with pytest.raises(SpmdError, match="unexpected"):
        spmdlang.compile(src.replace(good, bad))


# ---------------------------------------------------------------------------------- precedence


@pytest.mark.parametrize(
    "text, tree",
    [
        ("-a ** 2", "(-(a ** 2))"),
        ("-a * b", "((-a) * b)"),
        ("a - b - c", "((a - b) - c)"),
        ("a / b * c", "((a / b) * c)"),
        ("a + b * c", "(a + (b * c))"),
        ("a @ b + c", "((a @ b) + c)"),
        ("a + b @ c", "(a + (b @ c))"),
        ("a ** b ** c", "(a ** (b ** c))"),
        ("a ** -b", "(a ** (-b))"),
        ("a - -b", "(a - (-b))"),
        ("a-b", "(a - b)"),
        ("a-1", "(a - 1)"),
        ("a + b < c * 2", "((a + b) < (c * 2))"),
        ("a == b + c", "(a == (b + c))"),
        ("(a + b) * c", "((a + b) * c)"),
        ("-a[0] ** 2", "(-(a[...] ** 2))"),
        ("sum(a) - b", "(sum(a) - b)"),
        ("2 * -a", "(2 * (-a))"),
    ],
)
def test_precedence(text, tree):
    assert shape(body_expr(text)) == tree


def test_comparisons_do_not_chain():
    e = pytest.raises(
        SpmdError, spmdlang.compile, M + "func main(a: f32[4]) -> bool[4] { return a < a < a }"
    ).value
    assert "unexpected '<'" in e.message


@pytest.mark.parametrize(
    "text, value",
    [
        ("-2 ** 2", -4.0),
        ("2 ** 3 ** 2", 512.0),
        ("2 ** -1", 0.5),
        ("10 - 4 - 3", 3.0),
        ("12 / 3 / 2", 2.0),
        ("1 + 2 * 3 - 4 / 2", 5.0),
        ("(1 + 2) * 3", 9.0),
        ("7 / 2", 3.5),
        ("-(3 - 5)", 2.0),
    ],
)
def test_static_arithmetic(text, value):
    out = run1(M + f"func main() -> f32[] {{ return {text} }}")[0]
    assert out.dtype == np.float32 and out == value


def test_precedence_numerically():
    a = np.array([1.5, -2.0, 3.0, 0.5], np.float32)
    b = np.array([2.0, 1.0, -1.0, 4.0], np.float32)
    c = np.array([0.5, 3.0, 2.0, -1.0], np.float32)
    src = M + "func main(a: f32[4], b: f32[4], c: f32[4]) -> (f32[4], f32[4], bool[4]) { return %s }"
    outs = run1(src % "-a ** 2, a - b - c, a + 1 > b * 2", a=a, b=b, c=c)
    np.testing.assert_array_equal(outs[0], -(a**2))
    np.testing.assert_array_equal(outs[1], (a - b) - c)
    np.testing.assert_array_equal(outs[2], (a + 1) > (b * 2))


# ---------------------------------------------------------------------------------- IR text


def test_reassignment_names():
    src = M + "func main(x: f32[4]) -> f32[4] {\n  h = x + 1\n  h = h * 2\n  h = relu(h)\n  return h\n}"
    ir = ir_of(src)
    assert re.search(r"^  %h = add\(%x, %\w+\) : f32\[4\]  # line 3$", ir, re.M), ir
    assert re.search(r"^  %h\.1 = mul\(%h, %\w+\) : f32\[4\]  # line 4$", ir, re.M), ir
    assert re.search(r"^  %h\.2 = relu\(%h\.1\) : f32\[4\]  # line 5$", ir, re.M), ir
    assert ir.rstrip().endswith("return %h.2\n}")


def test_reassigned_parameter_name():
    ir = ir_of(M + "func main(h: f32[4]) -> f32[4] {\n  h = h + h\n  return h\n}")
    assert "func @main(%h: f32[4])" in ir
    assert "%h.1 = add(%h, %h) : f32[4]" in ir


def test_temporaries_are_numbered_and_literals_adopt_dtype():
    ir = ir_of(M + "func main(x: bf16[4]) -> bf16[4] { return x * 2 + 1 }")
    assert '%0 = full() {dtype="bf16", shape=[], value=2.0} : bf16[]' in ir
    assert "%1 = mul(%x, %0) : bf16[4]" in ir
    assert '%2 = full() {dtype="bf16", shape=[], value=1.0} : bf16[]' in ir


def test_int_tensor_times_float_literal_promotes_in_ir():
    ir = ir_of(M + "func main(i: i32[4]) -> f32[4] { return i * 2.5 }")
    assert 'cast(%i) {dtype="f32"}' in ir and "value=2.5" in ir


def test_ir_header_and_specs():
    ir = ir_of(M + "func main(a: f32[4, 4] {x, _}, b: f32[4]) -> f32[4, 4] {(x, y), _} { return a + b }")
    lines = ir.splitlines()
    assert lines[0] == "# global program, mesh [x=2, y=2]"
    assert lines[1] == "func @main(%a: f32[4, 4] {x, _}, %b: f32[4]) -> (f32[4, 4] {(x, y), _}) {"
    assert "shard(" in ir and "sharding={(x, y), _}" in ir


def test_names_from_inlined_functions_stay_local():
    src = M + (
        "func f(a: f32[4]) -> f32[4] {\n  t = a * 3\n  return t\n}\n"
        "func main(a: f32[4]) -> f32[4] {\n  t = a + 1\n  u = f(t)\n  return u + t\n}\n"
    )
    ir = ir_of(src)
    assert "%t = add(%a," in ir
    assert "%u = mul(%t," in ir  # f's local `t` is not the caller's name: the caller assigns u
    out = run1(src, a=np.ones(4, np.float32))[0]
    np.testing.assert_array_equal(out, np.full(4, 8, np.float32))


def test_ir_printer_is_deterministic():
    src = M + (
        "const N = 4\n"
        "func layer(h: f32[N, 8] {x, _}, w: f32[8, 8]) -> f32[N, 8] { return relu(h @ w) }\n"
        "func main(x: f32[N, 8], w: f32[8, 8]) -> (f32[N, 8], f32[]) {\n"
        "  h = x\n"
        "  for i in range(3) { h = layer(h, w) + i }\n"
        "  return h, logsumexp(sum(h, 1), 0)\n"
        "}\n"
    )
    first = spmdlang.compile(src)
    texts = {first.ir, first.ir, spmdlang.compile(src).ir}
    spmdlang.compile(M + "func other(q: f32[2]) -> f32[2] { return q }")  # unrelated work in between
    texts.add(spmdlang.compile(src).ir)
    assert len(texts) == 1
    assert first.ir.endswith("}\n")


def test_ir_with_mesh_and_const_overrides():
    src = M + "const N = 4\nfunc main(a: f32[N] {x}) -> f32[N] { return a }"
    ir = ir_of(src, mesh={"x": 4}, consts={"N": 8})
    assert ir.splitlines()[0] == "# global program, mesh [x=4, y=2]"
    assert "%a: f32[8] {x}" in ir


# ---------------------------------------------------------------------------------- lowering rules


def test_uncalled_functions_are_type_checked_but_not_emitted():
    src = M + (
        "func unused(b: f32[2, 3]) -> f32[3] { return sum(b, 0) }\n"
        "func main(a: f32[4]) -> f32[4] { return a }\n"
    )
    ir = ir_of(src)
    assert "reduce_sum" not in ir
    bad = src.replace("sum(b, 0)", "sum(b, 1)")
    e = pytest.raises(SpmdError, spmdlang.compile, bad).value
    assert e.line == 2 and "result 0 of 'unused' is f32[2]" in e.message


def test_uncalled_function_with_spec_is_checked():
    src = (
        M
        + "func unused(b: f32[2, 3] {x}) -> f32[2, 3] { return b }\n"
        + "func main(a: f32[4]) -> f32[4] { return a }"
    )
    e = pytest.raises(SpmdError, spmdlang.compile, src).value
    assert e.line == 2 and "has 1 entry" in e.message


def test_entry_selection():
    one = M + "func only(a: f32[2]) -> f32[2] { return a + 1 }"
    assert "func @only(" in ir_of(one)
    two = M + "func f(a: f32[2]) -> f32[2] { return a }\nfunc main(a: f32[2]) -> f32[2] { return f(a) }"
    assert "func @main(" in ir_of(two)
    assert "func @f(" in ir_of(two, entry="f")


def test_loop_variable_is_a_static_int():
    src = M + (
        "func main(a: f32[6]) -> f32[] {\n"
        "  s = zeros(f32[])\n"
        "  for i in range(1, 4) {\n"
        "    s = s + sum(a[0:i]) * i + sum(zeros(f32[i]))\n"
        "  }\n"
        "  return s\n"
        "}\n"
    )
    a = np.arange(6, dtype=np.float32)
    want = sum(a[:i].sum() * i for i in range(1, 4))
    assert run1(src, a=a)[0] == want
    ir = ir_of(src)
    assert "slice(%a) {starts=[0], steps=[1], stops=[3]}" in ir  # the loop is unrolled


def test_loop_variable_as_axis_and_shift():
    src = (
        M
        + "func main(a: f32[3, 4]) -> f32[3, 4] {\n"
        + "  for i in range(2) { a = roll(a, i + 1, axis=i) }\n"
        + "  return a\n}"
    )
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(run1(src, a=a)[0], np.roll(np.roll(a, 1, 0), 2, 1))


def test_loop_reassignment_is_visible_after_the_loop():
    src = M + "func main(a: f32[2]) -> f32[2] {\n  for i in range(3) { a = a * 2 }\n  return a\n}"
    np.testing.assert_array_equal(run1(src, a=np.ones(2, np.float32))[0], np.full(2, 8, np.float32))


def test_consts_in_shapes_and_arguments():
    src = M + "const N = 3\nconst A = N / N\nfunc main(a: f32[N, N + 1]) -> f32[N] { return sum(a, axis=A) }"
    a = np.ones((3, 4), np.float32)
    np.testing.assert_array_equal(run1(src, a=a)[0], np.full(3, 4, np.float32))
    c = spmdlang.compile(src, consts={"N": 5})
    assert c.run({"a": np.ones((5, 6), np.float32)})[0].shape == (5,)


def test_const_override_of_a_const_used_by_another():
    src = M + "const N = 3\nconst M2 = N * 2\nfunc main(a: f32[M2]) -> f32[M2] { return a }"
    assert "f32[10]" in ir_of(src, consts={"N": 5})
    assert "f32[7]" in ir_of(src, consts={"M2": 7})


def test_static_int_division_stays_int_when_exact():
    src = M + "const N = 8\nfunc main(a: f32[N / 2]) -> f32[4] { return a }"
    spmdlang.compile(src)
    e = pytest.raises(SpmdError, spmdlang.compile, src.replace("N / 2", "N / 3")).value
    assert "must be a static integer" in e.message


def test_inlined_specs_become_shard_ops():
    src = M + (
        "func f(h: f32[4, 4] {x, ?}) -> f32[4, 4] {_, y} { return h * 2 }\n"
        "func main(a: f32[4, 4]) -> f32[4, 4] { return f(a) }\n"
    )
    ir = ir_of(src)
    assert "sharding={x, ?}" in ir and "sharding={_, y}" in ir


def test_multi_result_call_and_single_parenthesised_result():
    src = M + (
        "func two(a: f32[3]) -> (f32[3], f32[]) { return a * 2, sum(a) }\n"
        "func one(a: f32[3]) -> (f32[3]) { return a + 1 }\n"
        "func main(a: f32[3]) -> (f32[3], f32[]) {\n"
        "  p, q = two(a)\n"
        "  (r) = one(p)\n"
        "  return r, q\n"
        "}\n"
    )
    with pytest.raises(SpmdError):  # a parenthesised target is not a statement
        spmdlang.compile(src)
    src = src.replace("(r) = one(p)", "r = one(p)")
    with pytest.raises(SpmdError, match="the call returns 1 values; unpack them"):
        spmdlang.compile(src)
    src = src.replace("-> (f32[3]) { return a + 1 }", "-> f32[3] { return a + 1 }")
    a = np.array([1, 2, 3], np.float32)
    r, q = run1(src, a=a)
    np.testing.assert_array_equal(r, a * 2 + 1)
    assert q == a.sum()


def test_names_are_recorded_for_every_assignment():
    c = spmdlang.compile(
        M + "func main(a: f32[4]) -> f32[4] {\n  h = a + 1\n  h = h * 2\n  g = h\n  return g\n}"
    )
    names = {n: v for n, v, _ in c.program.names}
    assert set(names) == {"a", "h", "g"}
    assert names["h"] is names["g"]  # the last assignment of h
