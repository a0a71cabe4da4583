"""Structs (parameter trees) and shape-generic functions: they compile to exactly the program
written flat (per-partition IR compared with a hand-flattened twin), agree with jax on pytrees,
cross the boundary as dotted leaf names and nested dicts, and every misuse is a located error."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

import spmdlang
from spmdlang.errors import SpmdError

HEAD = """mesh [data=2, model=2]
const D = 8
const F = 12
const L = 3
const B = 6
struct Block {
  w1: f32[D, F] {_, model}
  w2: f32[F, D] {model, _}
  b: f32[D]
}
struct Params {
  emb: f32[D, D] {model, _}
  blocks: Block[L]
}
"""

STRUCTS = HEAD + """
func mlp(x: f32[B, D], b: Block) -> f32[B, D] {
  return x + relu(x @ b.w1) @ b.w2 + b.b
}
func loss(p: Params, x: f32[B, D]) -> f32[] {
  h = tanh(x @ p.emb)
  loop l in range(L) {
    h = mlp(h, p.blocks[l])
  }
  return mean(h * h)
}
func adam(w: f32[..S], g: f32[..S], m: f32[..S], v: f32[..S]) -> (f32[..S], f32[..S], f32[..S]) {
  m = 0.9 * m + 0.1 * g
  v = 0.99 * v + 0.01 * g * g
  return w - 0.01 * m / (sqrt(abs(v)) + 1e-6), m, v
}
func main(p: Params, m: Params, v: Params, x: f32[B, D] {data, _}) -> (f32[], Params, Params, Params) {
  l, g = value_and_grad(loss, p, x)
  g = g / maximum(sqrt(tree_sum(g * g)), 1.0)
  p, m, v = tree_map(adam, p, g, m, v)
  return l, p, m, v
}
"""

# the same program with every struct written out as its leaves, in the same order
FLAT = """mesh [data=2, model=2]
const D = 8
const F = 12
const L = 3
const B = 6
func mlp(x: f32[B, D], w1: f32[D, F], w2: f32[F, D], b: f32[D]) -> f32[B, D] {
  return x + relu(x @ w1) @ w2 + b
}
func loss(p_emb: f32[D, D], p_blocks_w1: f32[L, D, F], p_blocks_w2: f32[L, F, D], p_blocks_b: f32[L, D],
          x: f32[B, D]) -> f32[] {
  h = tanh(x @ p_emb)
  loop l in range(L) {
    h = mlp(h, p_blocks_w1[l], p_blocks_w2[l], p_blocks_b[l])
  }
  return mean(h * h)
}
func adam(w: f32[..S], g: f32[..S], m: f32[..S], v: f32[..S]) -> (f32[..S], f32[..S], f32[..S]) {
  m = 0.9 * m + 0.1 * g
  v = 0.99 * v + 0.01 * g * g
  return w - 0.01 * m / (sqrt(abs(v)) + 1e-6), m, v
}
func main(p_emb: f32[D, D] {model, _}, p_blocks_w1: f32[L, D, F] {_, _, model},
          p_blocks_w2: f32[L, F, D] {_, model, _}, p_blocks_b: f32[L, D],
          m_emb: f32[D, D] {model, _}, m_blocks_w1: f32[L, D, F] {_, _, model},
          m_blocks_w2: f32[L, F, D] {_, model, _}, m_blocks_b: f32[L, D],
          v_emb: f32[D, D] {model, _}, v_blocks_w1: f32[L, D, F] {_, _, model},
          v_blocks_w2: f32[L, F, D] {_, model, _}, v_blocks_b: f32[L, D],
          x: f32[B, D] {data, _})
    -> (f32[], f32[D, D] {model, _}, f32[L, D, F] {_, _, model}, f32[L, F, D] {_, model, _}, f32[L, D],
        f32[D, D] {model, _}, f32[L, D, F] {_, _, model}, f32[L, F, D] {_, model, _}, f32[L, D],
        f32[D, D] {model, _}, f32[L, D, F] {_, _, model}, f32[L, F, D] {_, model, _}, f32[L, D]) {
  l, g_emb, g_blocks_w1, g_blocks_w2, g_blocks_b = value_and_grad(loss, p_emb, p_blocks_w1, p_blocks_w2,
                                                                  p_blocks_b, x, argnums=[0, 1, 2, 3])
  s_emb = g_emb * g_emb
  s_blocks_w1 = g_blocks_w1 * g_blocks_w1
  s_blocks_w2 = g_blocks_w2 * g_blocks_w2
  s_blocks_b = g_blocks_b * g_blocks_b
  n = maximum(sqrt(sum(s_emb) + sum(s_blocks_w1) + sum(s_blocks_w2) + sum(s_blocks_b)), 1.0)
  g_emb = g_emb / n
  g_blocks_w1 = g_blocks_w1 / n
  g_blocks_w2 = g_blocks_w2 / n
  g_blocks_b = g_blocks_b / n
  p_emb, m_emb, v_emb = adam(p_emb, g_emb, m_emb, v_emb)
  p_blocks_w1, m_blocks_w1, v_blocks_w1 = adam(p_blocks_w1, g_blocks_w1, m_blocks_w1, v_blocks_w1)
  p_blocks_w2, m_blocks_w2, v_blocks_w2 = adam(p_blocks_w2, g_blocks_w2, m_blocks_w2, v_blocks_w2)
  p_blocks_b, m_blocks_b, v_blocks_b = adam(p_blocks_b, g_blocks_b, m_blocks_b, v_blocks_b)
  return l, p_emb, p_blocks_w1, p_blocks_w2, p_blocks_b, m_emb, m_blocks_w1, m_blocks_w2, m_blocks_b,
         v_emb, v_blocks_w1, v_blocks_w2, v_blocks_b
}
"""

LEAVES = ["emb", "blocks.w1", "blocks.w2", "blocks.b"]


def _normalised(ir: str) -> str:
    """IR text without source comments, every value renamed by its first appearance (the twins
    name their intermediate values differently; the ops, types, shardings and collectives must agree)."""
    ir = re.sub(r"\s*#.*", "", ir)
    names: dict[str, str] = {}
    return re.sub(r"%[\w.]+", lambda m: names.setdefault(m.group(0), f"%v{len(names)}"), ir)


def test_structs_compile_to_the_plans_of_the_flat_twin():
    s, f = spmdlang.compile(STRUCTS), spmdlang.compile(FLAT)
    assert _normalised(s.ir) == _normalised(f.ir)
    assert _normalised(s.spmd_ir) == _normalised(f.spmd_ir)
    ts, tf = s.explain_report()["totals"], f.explain_report()["totals"]
    assert (ts["collectives"], ts["bytes_per_device"]) == (tf["collectives"], tf["bytes_per_device"]) != (0, 0)


def test_leaves_are_named_by_dotted_paths_depth_first():
    c = spmdlang.compile(STRUCTS)
    names = [p.name for p in c.program.params]
    assert names == [f"{s}.{leaf}" for s in "pmv" for leaf in LEAVES] + ["x"]
    assert list(c.random_inputs(0)) == names
    assert str(c.shardings["p.blocks.w1"]) == "{_, _, model}"
    assert str(c.shardings["return1.blocks.w2"]) == "{_, model, _}"
    rows = [r["name"] for r in c.check_report()["values"]]
    assert rows[-13:] == ["return0"] + [f"return{i}.{leaf}" for i in (1, 2, 3) for leaf in LEAVES]
    assert "g.blocks.w1" in rows


def test_struct_program_equals_the_flat_twin_and_jax():
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    s, f = spmdlang.compile(STRUCTS), spmdlang.compile(FLAT)
    inputs = s.random_inputs(1)
    for k in list(inputs):
        if k.startswith("v."):
            inputs[k] = np.abs(inputs[k])
    flat_inputs = {k.replace(".", "_"): a for k, a in inputs.items()}
    got = s.run(inputs, backend="sim")
    for a, b in zip(got, f.run(flat_inputs, backend="sim")):
        np.testing.assert_array_equal(a, b)

    def tree(prefix):
        return {"emb": inputs[f"{prefix}.emb"],
                "blocks": {k: inputs[f"{prefix}.blocks.{k}"] for k in ("w1", "w2", "b")}}

    def loss(p, x):
        h = jnp.tanh(x @ p["emb"])
        for i in range(3):
            blk = jax.tree.map(lambda a, i=i: a[i], p["blocks"])
            h = h + jax.nn.relu(h @ blk["w1"]) @ blk["w2"] + blk["b"]
        return jnp.mean(h * h)

    p, m, v, x = tree("p"), tree("m"), tree("v"), inputs["x"]
    lval, g = jax.value_and_grad(loss)(p, x)
    norm = jnp.sqrt(sum(jnp.sum(a * a) for a in jax.tree.leaves(g)))
    g = jax.tree.map(lambda a: a / jnp.maximum(norm, 1.0), g)
    m = jax.tree.map(lambda m, g: 0.9 * m + 0.1 * g, m, g)
    v = jax.tree.map(lambda v, g: 0.99 * v + 0.01 * g * g, v, g)
    p = jax.tree.map(lambda w, m, v: w - 0.01 * m / (jnp.sqrt(jnp.abs(v)) + 1e-6), p, m, v)
    want = [lval, *jax.tree.leaves(p), *jax.tree.leaves(m), *jax.tree.leaves(v)]
    # jax.tree.leaves sorts dict keys; ours are in declaration order
    order = sorted(range(4), key=lambda i: ["blocks.b", "blocks.w1", "blocks.w2", "emb"].index(LEAVES[i]))
    want = [want[0]] + [want[1 + 4 * t + order[i]] for t in range(3) for i in range(4)]
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, np.asarray(b), rtol=2e-4, atol=2e-5)


def test_emitted_module_takes_and_returns_nested_dicts():
    pytest.importorskip("jax")
    c = spmdlang.compile(STRUCTS)
    inputs = c.random_inputs(2)
    want = c.run(inputs, backend="ref")
    for backend in ("jax", "xla"):
        m = c.runner(backend).module
        nested = m._nest([inputs[p.name] for p in c.program.params], m.GLOBAL_SHAPES)
        assert set(nested[0]) == {"emb", "blocks"} and set(nested[0]["blocks"]) == {"w1", "w2", "b"}
        outs = m.run(*nested, mesh=c.runner(backend).mesh)
        assert isinstance(outs[1], dict) and list(outs[1]["blocks"]) == ["w1", "w2", "b"]
        assert m.IN_SPECS[0]["blocks"]["w1"] == m.P(None, None, "model")
        for a, b in zip(m._leaves(outs, m.RESULT_SHAPES), want):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
        with pytest.raises(ValueError, match="'blocks'"):
            m.run({"emb": nested[0]["emb"]}, *nested[1:], mesh=c.runner(backend).mesh)


def test_cli_npz_names_and_diff(tmp_path):
    path = tmp_path / "s.spmd"
    path.write_text(STRUCTS)
    c = spmdlang.compile(str(path))
    inputs = c.random_inputs(3)
    np.savez(tmp_path / "in.npz", **inputs)
    r = subprocess.run([sys.executable, "-m", "spmdlang", "run", str(path), "--backend", "sim", "--inputs",
                        str(tmp_path / "in.npz"), "-o", str(tmp_path / "out.npz")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    out = np.load(tmp_path / "out.npz")
    assert list(out.keys()) == ["out0"] + [f"out{i}.{leaf}" for i in (1, 2, 3) for leaf in LEAVES]
    r = subprocess.run([sys.executable, "-m", "spmdlang", "diff", str(path), "--backends", "sim", "--json"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    import json

    rows = json.loads(r.stdout)["results"]
    assert [row["name"] for row in rows][:3] == ["return0", "return1.emb", "return1.blocks.w1"]


LEAFWISE = HEAD + """
func main(p: Params, q: Params, c: f32[] {}) -> (Params, Params, Params, f32[]) {
  a = -p * 2.0 + q / 3.0 - c
  b = where(c > 0.0, relu(p), maximum(q, 0.5))
  d = replace(p, emb=p.emb * 0.0, blocks=q.blocks ** 2)
  e = Block(w1=p.blocks.w1[0], w2=q.blocks[1].w2, b=p.blocks.b[2])
  return a, b, d, sum(e.w1) + sum(e.w2) + sum(e.b) + tree_sum(stop_gradient(q))
}
"""


def _close(got, want):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_leafwise_operations_construction_and_replace():
    c = spmdlang.compile(LEAFWISE)
    i = c.random_inputs(4)
    got = c.run(i, backend="sim")
    ref = c.run(i, backend="ref")
    for a, b in zip(got, ref):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    p = [i[f"p.{leaf}"] for leaf in LEAVES]
    q = [i[f"q.{leaf}"] for leaf in LEAVES]
    cc = i["c"]
    _close(ref[0:4], [-a * 2 + b / 3 - cc for a, b in zip(p, q)])
    _close(ref[4:8], [np.maximum(a, 0) if cc > 0 else np.maximum(b, 0.5) for a, b in zip(p, q)])
    _close(ref[8:12], [p[0] * 0, q[1] ** 2, q[2] ** 2, q[3] ** 2])
    want = p[1][0].sum() + q[2][1].sum() + p[3][2].sum() + sum(float(x.sum()) for x in q)
    np.testing.assert_allclose(ref[12], want, rtol=1e-4)


GENERIC = """mesh [x=2]
func scale[T](x: T[B, ..S], a: T[]) -> T[B, ..S] { return x * a }
const B = 4
func sq(w: f32[..S]) -> f32[..S] { return w * w }
func main(a: f32[4, 6] {x, _}, b: bf16[4], c: f32[]) -> (f32[4, 6], bf16[4], f32[], f32[]) {
  return scale(a, 2.0), scale(b, cast(3.0, bf16)), sq(c), sum(sq(a))
}
"""


def test_generic_functions_bind_per_call():
    c = spmdlang.compile(GENERIC)
    i = c.random_inputs(0)
    out = c.run(i, backend="sim")
    np.testing.assert_allclose(out[0], i["a"] * 2)
    np.testing.assert_allclose(out[1].astype(np.float32), (i["b"] * np.float32(3)).astype(out[1].dtype).astype(
        np.float32), rtol=1e-2)
    np.testing.assert_allclose(out[2], i["c"] ** 2, rtol=1e-6)
    np.testing.assert_allclose(out[3], (i["a"] ** 2).sum(), rtol=1e-5)


def test_struct_carried_through_a_loop_and_for():
    src = HEAD + """
func main(p: Params) -> (Params, Params) {
  q = p
  loop i in range(3) {
    q = q * 0.5 + p
  }
  r = p
  for k in range(2) {
    r = replace(r, emb=r.emb + r.blocks[k].b[0])
  }
  return q, r
}
"""
    c = spmdlang.compile(src)
    i = c.random_inputs(0)
    out = c.run(i, backend="sim")
    p = [i[f"p.{leaf}"] for leaf in LEAVES]
    q = list(p)
    for _ in range(3):
        q = [a * 0.5 + b for a, b in zip(q, p)]
    _close(out[:4], q)
    np.testing.assert_allclose(out[4], p[0] + p[3][0, 0] + p[3][1, 0], rtol=1e-5)


# ---------------------------------------------------------------------------------- misuse


def _where(src: str, needle: str) -> tuple[int, int]:
    i = src.index(needle)
    return src.count("\n", 0, i) + 1, i - (src.rfind("\n", 0, i) + 1) + 1


M = "mesh [x=2]\nstruct P { a: f32[4] {x}, b: f32[2] }\n"
ERRORS = [
    (M + "func main(p: P) -> f32[4] { return p.c }", "p.c", "struct 'P' has no field 'c'"),
    (M + "func main(p: P) -> P { return P(a=p.a) }", "P(a=p.a)", "missing field 'b'"),
    (M + "func main(p: P) -> P { return P(a=p.a, b=p.a) }", "p.a) }", "field 'b' of P(...) must be f32[2]"),
    (M + "func main(p: P) -> P { return P(p.a, p.b) }", "p.a, p.b", "construct a struct with keywords"),
    (M + "func main(p: P) -> P { return replace(p, z=p.a) }", "z=p.a", "has no field 'z'"),
    ("mesh [x=2]\nstruct A { b: B }\nstruct B { a: A[2] }\nfunc main(x: f32[1]) -> f32[1] { return x }",
     "a: A[2]", "struct 'A' contains itself"),
    ("mesh [x=2]\nstruct A { a: A }\nfunc main(x: f32[1]) -> f32[1] { return x }", "a: A", "contains itself"),
    ("mesh [x=2]\nstruct A { a: f32[1], a: f32[2] }\nfunc main(x: f32[1]) -> f32[1] { return x }", "a: f32[2]",
     "declared twice"),
    ("mesh [x=2]\nstruct A { a: Q }\nfunc main(x: f32[1]) -> f32[1] { return x }", "Q", "unknown type 'Q'"),
    ("mesh [x=2]\nstruct A { a: f32[4] {x, _} }\nfunc main(x: f32[1]) -> f32[1] { return x }", "{x, _}",
     "has 2 entries"),
    (M + "func main(p: P) -> f32[4] { return shard(p, {x}) }", "p, {x}", "shard() takes tensors only"),
    (M + "func main(p: P) -> P { return softmax(p) }", "p) }", "softmax() does not take structs"),
    (M + "func main(p: P {x}) -> P { return p }", "{x})", "drop the spec"),
    (M + "func main(p: P) -> f32[4] { return p.a @ p }", "p }", "@ is not leafwise"),
    (M + "func main(p: P) -> P { return p < 0.0 }", "<", "keep every leaf's type"),
    (M + "func main(p: P) -> P { return p[0] }", "p[0]", "only a stacked struct"),
    (M + "func main(p: P) -> P { return P }", "P }", "'P' is a struct; construct one as P(a=..., b=...)"),
    (M + "func main(p: P) -> f32[] { return tree_sum(p.a) }", "p.a)", "tree_sum() needs a struct"),
    (M + "func f(a: f32[..S]) -> f32[] { return sum(a) }\nfunc main(p: P) -> P { return tree_map(f, p) }",
     "tree_map(f", "'f' gives a tensor f32[] for the leaf 'a'"),
    (M + "func main(p: P, q: f32[3]) -> f32[3] { return q.a }", "q.a", "'.a' needs a struct"),
    (M + "func main(p: P) -> P {\n  loop i in range(2) { p = p.a }\n  return p\n}", "p = p.a",
     "carried through the loop as a struct P"),
    ("mesh [x=2]\nfunc f(w: f32[..S] {x}) -> f32[..S] { return w }\nfunc main(a: f32[4]) -> f32[4] { return f(a) }",
     "{x})", "a generic function's parameters carry no specs"),
    ("mesh [x=2]\nfunc main(w: f32[..S]) -> f32[..S] { return w }", "func main", "cannot be the entry"),
    ("mesh [x=2]\nfunc f(w: f32[..S], g: f32[..S]) -> f32[..S] { return w }\n"
     "func main(a: f32[4], b: f32[8]) -> f32[4] { return f(a, b) }", "b) }", "`..S` of 'f' is bound two ways"),
    ("mesh [x=2]\nfunc f[T](w: T[4], g: T[4]) -> T[4] { return w }\n"
     "func main(a: f32[4], b: i32[4]) -> f32[4] { return f(a, b) }", "b) }", "T of 'f' is bound two ways"),
    ("mesh [x=2]\nfunc f(w: f32[2, ..S]) -> f32[..S] { return w[0] }\n"
     "func main(a: f32[]) -> f32[] { return f(a) }", "a) }", "must have rank >= 1"),
    ("mesh [x=2]\nfunc f(w: f32[4]) -> f32[..S] { return w }\nfunc main(a: f32[4]) -> f32[4] { return f(a) }",
     "..S] {", "`..S` is not bound"),
    ("mesh [x=2]\nfunc f[f32](w: f32[4]) -> f32[4] { return w }\nfunc main(a: f32[4]) -> f32[4] { return f(a) }",
     "func f", "has the name of a dtype"),
    ("mesh [x=2]\nstruct main { a: f32[1] }\nfunc main(x: f32[1]) -> f32[1] { return x }", "func main",
     "has the name of a struct"),
    ("mesh [x=2]\nconst N = 2\nstruct N { a: f32[1] }\nfunc main(x: f32[1]) -> f32[1] { return x }", "N {",
     "struct 'N' has the name of a const"),
    ("mesh [x=2]\nfunc f(w: f32[..S] {x}) -> f32[..S] { return w }\nfunc main(a: f32[4]) -> f32[4] { return a }",
     "{x})", "a generic function's parameters carry no specs"),
    # a struct where a generic function takes a tensor: its variables bound by nothing (was "unknown
    # dtype 'T'" at the function's declaration)
    (M + "func f[T](w: T[..Q]) -> T[..Q] { return w }\nfunc main(p: P) -> f32[3] { return f(p).a }", "p).a",
     "argument 'w' of 'f' must be a tensor T[..Q], got a struct P; tree_map calls a function on each leaf"),
    (M + "func f(w: f32[..Q]) -> f32[..Q] { return w }\nfunc main(p: P) -> f32[3] { return f(p).a }", "p).a",
     "argument 'w' of 'f' must be a tensor f32[..Q], got a struct P"),
]


@pytest.mark.parametrize("src, at, fragment", ERRORS)
def test_misuse_is_a_located_error(src, at, fragment):
    with pytest.raises(SpmdError) as info:
        spmdlang.compile(src)
    e = info.value
    assert fragment in e.message, e.render()
    assert (e.line, e.col) == _where(src, at), e.render()


def test_generic_mismatch_names_the_call(tmp_path):
    src = ("mesh [x=2]\nfunc adam(w: f32[..S], g: f32[..S]) -> f32[..S] { return w - g }\n"
           "func main(a: f32[4], b: f32[8]) -> f32[4] { return adam(a, b) }\n")
    path = tmp_path / "g.spmd"
    path.write_text(src)
    r = subprocess.run([sys.executable, "-m", "spmdlang", "check", str(path)], capture_output=True, text=True)
    assert r.returncode == 1
    assert f"{path}:3:" in r.stderr and "note: in the call to 'adam' at line 3" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_missing_struct_leaf_input_is_a_located_error():
    c = spmdlang.compile(STRUCTS)
    inputs = c.random_inputs(0)
    del inputs["m.blocks.w2"]
    with pytest.raises(SpmdError, match="no array 'm.blocks.w2'"):
        c.run(inputs)


def test_dotted_names_meet_user_names_in_the_emitted_module():
    pytest.importorskip("jax")
    src = """mesh [x=2]
struct P { emb: f32[4] {x}, inner: Q }
struct Q { w: f32[2, 2] }
func main(p: P, p_emb: f32[4] {x}, p_inner_w: f32[2, 2]) -> (P, f32[4], f32[]) {
  p_emb = p_emb + p.emb
  q = replace(p, emb=p_emb * 2.0)
  return q, p_emb, sum(p.inner.w * p_inner_w)
}
"""
    c = spmdlang.compile(src)
    assert "def body(p, p_emb_, p_inner_w_):\n" in c.jax_source and "    p_emb = p['emb']\n" in c.jax_source
    i = c.random_inputs(0)
    want = c.run(i, backend="ref")
    for backend in ("sim", "jax", "xla"):
        for a, b in zip(c.run(i, backend=backend), want):
            np.testing.assert_allclose(a, b, rtol=1e-6)
    np.testing.assert_allclose(want[2], i["p_emb"] + i["p.emb"], rtol=1e-6)


def test_double_stacked_struct_and_grad_of_a_generic_function():
    src = """mesh [x=2]
struct W { a: f32[3] {x} }
struct S { layers: W[2, 4] }
func f[T](w: T[..S]) -> T[] { return sum(w * w) }
func loss(s: S) -> f32[] { return f(s.layers[1][2].a) + f(s.layers.a) }
func main(s: S) -> (f32[], S) {
  l, g = value_and_grad(loss, s)
  return l, g
}
"""
    c = spmdlang.compile(src)
    assert [p.name for p in c.program.params] == ["s.layers.a"]
    assert c.program.params[0].value.type.shape == (2, 4, 3)
    assert str(c.shardings["s.layers.a"]) == "{_, _, x}"
    a = c.random_inputs(0)["s.layers.a"]
    out = c.run({"s.layers.a": a}, backend="sim")
    want_g = 2 * a
    want_g[1, 2] += 2 * a[1, 2]
    np.testing.assert_allclose(out[0], (a * a).sum() + (a[1, 2] ** 2).sum(), rtol=1e-5)
    np.testing.assert_allclose(out[1], want_g, rtol=1e-5)


def test_autoshard_writes_struct_layouts():
    """autoshard on train_transformer (annotations stripped but x's batch split, field specs too):
    the search keeps the weights replicated and splits their Adam moments, which share the
    weights' struct, so each leaf is constrained at the top of main; the written program compiles
    to the plan the report gives and matches the reference."""
    from pathlib import Path

    from spmdlang.autoshard import autoshard, batch_only

    path = Path(__file__).resolve().parent.parent / "programs" / "train_transformer.spmd"
    text = batch_only(path.read_text())
    assert "{_, model}" not in text.split("struct Block {")[1].split("func layer_norm")[0]  # field specs stripped
    r = autoshard(text)
    body = r.source.split("func main")[1]
    assert re.search(r"\n  m = replace\(m, wq=shard\(m\.wq, \{[^}]*\}\)\)\n", body), body
    assert set(r.chosen.params) >= {"w.wq", "m.wq", "v.w2", "ln.ln1_g", "x"}
    c = spmdlang.compile(r.source)
    assert c.explain_report()["totals"]["bytes_per_device"] == r.chosen.totals()["bytes_per_device"]
    assert c.diff(backends=["ref", "sim"])["ok"]


def test_a_leafwise_error_names_the_leaf():
    src = "mesh [x=2]\nstruct P { w: f32[4], b: f32[2] }\nfunc main(p: P, v: f32[4]) -> P { return p + v }\n"
    with pytest.raises(SpmdError) as info:
        spmdlang.compile(src)
    e = info.value
    assert "do not broadcast" in e.message and (e.line, e.col) == _where(src, "+ v")
    assert e.note == "in '+' on the leaf 'b' (f32[2]) of the struct P", e.render()
