"""Mutation fuzzing of the frontend: bad input gets a located SpmdError, never another exception.

Programs are tokenized crudely (names, numbers, strings, operators, whitespace kept), mutated
(delete, swap adjacent, duplicate, replace with another token) and compiled. Each result must be
a success or a SpmdError with line >= 1 and col >= 1. Successes are also printed as IR and, when
small, run on the ref backend, which may only fail with a SpmdError too.
"""

from __future__ import annotations

import glob
import os
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import spmdlang
from spmdlang.errors import SpmdError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

EMBEDDED = [
    """# a two-layer MLP
mesh [data=2, model=2]
const B = 8
const D = 16
func main(x: f32[B, D] {data, _}, w1: f32[D, 32] {_, model}, b1: f32[32],
          w2: f32[32, D] {model, _}) -> f32[B, D] {data, _} {
  h = relu(x @ w1 + b1)
  h = shard(h, {data, ?})
  return h @ w2
}
""",
    """mesh [x=2, y=2] devices [0, 2, 1, 3]
const S = 6
func attn(q: f32[S, 4], k: f32[S, 4], v: f32[S, 4]) -> f32[S, 4] {
  s = einsum("qd,kd->qk", q, k) / sqrt(4.0)
  p = softmax(s, axis=-1)
  return p @ v
}
func main(x: f32[S, 4] {(x, y), _}, wq: f32[4, 4]) -> (f32[S, 4], f32[]) {
  a = attn(x @ wq, x, x)
  return a, logsumexp(sum(a, 1), 0)
}
""",
    """mesh [d=2]
func main(x: f32[2, 9, 9, 3] {d, _, _, _}, k: f32[3, 3, 3, 4], k1: f32[3, 4, 2]) -> f32[2, 2] {
  y = conv(x, k, stride=2, padding="SAME")
  y = relu(y)[:, 1:4, ::2, :]
  z = conv(reshape(y, [2, 6, 4]), k1, padding=[[1, 1]])
  return mean(z, axis=[1])
}
""",
    """mesh [x=2]
func two(a: f32[5], b: i32[5]) -> (f32[5], i32[]) { return a * 2.0, argmax(a, 0) }
func main(a: f32[5], ids: i32[3], m: bool[5]) -> (f32[3, 5], f32[5]) {
  h = a
  for i in range(3) { h = roll(h, i, 0) + i; }
  s, j = two(h, cast(h, i32))
  t = take(broadcast_to(s, [4, 5]), ids, axis=0)
  e = one_hot(ids, 5) * t
  return where(m, s, -s ** 2), pad(e[0], [[0, 0]], value=1)
}
""",
    """mesh [x=4]
const N = 12
func main(x: i32[N], y: bf16[N, 3]) -> (f32[N], bf16[3, N], i32[4, 3]) {
  z = cast(x, f32) / 3 + iota(f32[N], 0) * 2
  w = concat([y, zeros(bf16[N, 1])], axis=1)[:, 0:3]
  q = reshape(x, [-1, 3])
  return maximum(z, 0.5), transpose(w), q
}
""",
]


def _corpus() -> list[str]:
    progs = list(EMBEDDED)
    for path in sorted(glob.glob(os.path.join(ROOT, "programs", "*.spmd"))):
        with open(path, encoding="utf-8") as f:
            progs.append(f.read())
    return progs


CORPUS = _corpus()
TOKEN = re.compile(
    r'\s+|#[^\n]*|"[^"\n]*"|[A-Za-z_][A-Za-z0-9_]*|\d+\.?\d*(?:[eE][+-]?\d+)?|->|\*\*|[<>=!]=|.', re.S
)
TOKENS = [TOKEN.findall(p) for p in CORPUS]
# tokens worth trying that programs rarely contain: punctuation, keywords, huge numbers, and
# characters str.splitlines() treats as line breaks although the lexer does not
EXTRA = (
    '{ } ( ) [ ] , ; ? _ - -1 0 1e400 2147483648 99999999999 " "ij->" # = -> . @ ** == 1.5 .5'.split()
    + (
        "mesh const func return for in range devices true false main f32 i32 bool bf16 x shard sum None axis "
        "keepdims".split()
    )
    + ["é", "\x00", "\t", "\n", "\r", "\x0c", "\x0b", "\x1c", "\x85", "\u2028", "\ufeff"]
)
VOCAB = sorted({t for toks in TOKENS for t in toks if not t.isspace()} | set(EXTRA))


def mutate(tokens: list[str], ops: list[tuple[int, int, int]]) -> str:
    toks = list(tokens)
    for kind, pos, pick in ops:
        solid = [i for i, t in enumerate(toks) if not t.isspace()]
        if not solid:
            break
        i = solid[pos % len(solid)]
        if kind == 0:  # delete
            del toks[i]
        elif kind == 1:  # swap with the next solid token
            later = [j for j in solid if j > i]
            if later:
                j = later[0]
                toks[i], toks[j] = toks[j], toks[i]
        elif kind == 2:  # duplicate
            toks.insert(i, toks[i])
        else:  # replace
            toks[i] = VOCAB[pick % len(VOCAB)]
    return "".join(toks)


def _small(compiled) -> bool:
    prog = compiled.program
    values = [p.value for p in prog.params] + [r for op in prog.ops for r in op.results]
    return sum(v.type.size for v in values) <= 2_000_000


def check_source(text: str, run: bool = True):
    try:
        # filename= makes the API take `text` as source even when it also names a path (".")
        c = spmdlang.compile(text, filename="<fuzz>")
        assert isinstance(c.ir, str) and c.ir.startswith("#")
        if run and _small(c):
            c.run(None, backend="ref")
    except SpmdError as e:
        assert e.line is not None and e.line >= 1, e.render()
        assert e.col is not None and e.col >= 1, e.render()
        assert e.message, "empty error message"
        rendered = e.render()
        assert f":{e.line}:{e.col}: error: " in rendered


mutations = st.lists(
    st.tuples(st.integers(0, 3), st.integers(0, 10_000), st.integers(0, 10_000)), min_size=1, max_size=4
)


def test_corpus_compiles_and_runs():
    for text in CORPUS:
        check_source(text)


@settings(max_examples=250, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(prog=st.integers(0, len(CORPUS) - 1), ops=mutations)
def test_mutations_give_located_errors(prog, ops):
    check_source(mutate(TOKENS[prog], ops), run=False)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(prog=st.integers(0, len(EMBEDDED) - 1), ops=mutations)
def test_mutated_programs_that_compile_also_run(prog, ops):
    check_source(mutate(TOKENS[prog], ops), run=True)


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(
    text=st.text(
        alphabet=st.sampled_from(list('mesh[x=2]func main(a:f32[3])->{return a+1}#,_?"\n ;-.e0@*')),
        max_size=80,
    )
)
def test_random_text(text):
    check_source("mesh [x=2]\n" + text, run=False)
    check_source(text, run=False)


@pytest.mark.slow
@settings(max_examples=4000, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(
    prog=st.integers(0, len(CORPUS) - 1),
    ops=st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 10_000), st.integers(0, 10_000)), min_size=1, max_size=8
    ),
)
def test_mutations_long(prog, ops):
    check_source(mutate(TOKENS[prog], ops), run=prog < len(EMBEDDED))


@pytest.mark.parametrize(
    "text",
    [
        "",
        " ",
        "\n\n",
        "#",
        "mesh",
        "mesh [",
        "mesh []",
        "mesh [x=0]",
        "mesh [x=2] devices []",
        "mesh [x=2]\nfunc",
        "mesh [x=2]\nfunc main(",
        "mesh [x=2]\nfunc main() -> f32[] {}",
        "mesh [x=2]\nfunc main() -> f32[] { return }",
        "mesh [x=2]\nfunc main() -> () { return 1 }",
        "mesh [x=2]\nfunc main(x: f32[2]) -> f32[2] { return x[] }",
        "mesh [x=2]\nfunc main(x: f32[2]) -> f32[2] { return x[:] [0] }",
        "mesh [x=2]\nfunc main(x: f32[2]) -> f32[2] {x} {x} { return x }",
        "mesh [x=2]\nfunc main(x: f32[2]) -> f32[2] { { return x } }",
        "mesh [x=2]\nfunc main(x: f32[2]) -> f32[2] { return {x} }",
        "mesh [x=2]\nfunc main(x: f32[2] {x}) -> (f32[2] {x}, f32[2] {?}) { return x, x }",
        "mesh [x=2]\nfunc main(x: f32[2]) -> f32[2] { for i in range(10**9) { x = x } return x }",
        "mesh [x=2]\nfunc main(x: f32[2]) -> f32[2] { for i in range(1, 2, 0) { x = x } return x }",
        "mesh [x=2]\nfunc main(x: f32[2]) -> f32[2] { for x in range(2) { } return x }",
        "mesh [x=2]\nfunc main(x: f32[2]) -> f32[2] { x = 1; return x }",
        "mesh [x=2]\nfunc main(x: f32[2]) -> f32[2] { return x + 1e400 - 1e400 }",
        "mesh [x=2]\nconst A = 2 ** 64\nfunc main(x: f32[A]) -> f32[A] { return x }",
        "mesh [x=2]\nconst A = 7 / 2\nfunc main(x: f32[A]) -> f32[A] { return x }",
        "mesh [x=2]\nfunc main(x: f32[2], x: f32[2]) -> f32[2] { return x }",
        'mesh [x=2]\nfunc main(x: f32[2]) -> f32[2] { return einsum("\u00e9->\u00e9", x) }',
        'mesh [x=2]\nfunc main(x: f32[2]) -> f32[2] { return einsum("ab,b->a", x, x) }',
        "mesh [x=2]\nfunc main(x: i32[2]) -> i32[2] { return x + 99999999999 }",
        "mesh [x=2]\nfunc main(x: f32[2]) -> f32[2] { return shard(x, {}) }",
        "mesh [x=2]\nfunc main(x: f32[]) -> f32[] { return shard(x, {}) }",
        "mesh [x=2]\nfunc main(x: f32[2]) -> f32[2] { return shard(x, {(x)}) }",
        "mesh [x=2]\nfunc main(x: f32[2]) -> f32[2] { return shard(x, {()}) }",
        "\ufeffmesh [x=2]\nfunc main(x: f32[2]) -> f32[2] { return x }",
        "mesh [x=2]\nfunc main(x: f32[2]) -> f32[2] { return x }\x00",
        "mesh [x=2]\r\nfunc main(x: f32[2]) -> f32[2] {\r\n  return x \r\n}",
    ],
)
def test_edge_texts(text):
    check_source(text)
