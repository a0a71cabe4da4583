"""programs/train_gpt.spmd is the GPT step a jax user writes: the same step in jax (dict pytrees,
jax.nn, jax.random, lax.scan over the stacked blocks) with optax's clip_by_global_norm and adamw
gives the same loss, parameters and optimizer state, on the ref backend and on the jax backend
(our shard_map module), evenly and unevenly split. `diff` then holds sim and xla to ref."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import spmdlang

pytestmark = pytest.mark.usefixtures("jax_without_x64")  # jax.random's reference draws (conftest)

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
optax = pytest.importorskip("optax")

PATH = Path(__file__).resolve().parent.parent / "programs" / "train_gpt.spmd"
BLOCK = ["ln1", "wq", "wk", "wv", "wo", "ln2", "w1", "w2"]


def jax_step(consts, p, m, v, step, key, tokens, targets):
    """The step as written in jax, flax's dropout and optax's optimizer included."""
    L, DH, V, rate = consts["L"], consts["DH"], consts["V"], consts["RATE"]
    S = tokens.shape[1]

    def dropout(k, x):
        keep = jax.random.bernoulli(k, 1.0 - rate, x.shape)
        return jnp.where(keep, x / (1.0 - rate), 0.0)

    def block(x, b, k):
        ks = jax.random.split(k, 2)
        h = jax.nn.standardize(x, epsilon=1e-6) * b["ln1"]
        q = jnp.einsum("bsd,dhe->bhse", h, b["wq"]) * DH ** -0.5
        kk = jnp.einsum("bsd,dhe->bhse", h, b["wk"])
        vv = jnp.einsum("bsd,dhe->bhse", h, b["wv"])
        causal = jnp.arange(S)[:, None] >= jnp.arange(S)[None, :]
        att = jax.nn.softmax(jnp.where(causal, jnp.einsum("bhqe,bhke->bhqk", q, kk), -1e9), axis=-1)
        x = x + dropout(ks[0], jnp.einsum("bhqk,bhke,hed->bqd", att, vv, b["wo"]))
        h = jax.nn.standardize(x, epsilon=1e-6) * b["ln2"]
        return x + dropout(ks[1], jax.nn.gelu(h @ b["w1"]) @ b["w2"])

    def loss(p, k):
        x = jnp.take(p["emb"], tokens, axis=0) + p["pos"]
        x, _ = jax.lax.scan(lambda x, bk: (block(x, *bk), None), x, (p["blocks"], jax.random.split(k, L)))
        logits = jnp.einsum("bsd,vd->bsv", jax.nn.standardize(x, epsilon=1e-6) * p["ln_f"], p["emb"])
        return -jnp.mean(jnp.sum(jax.nn.one_hot(targets, V) * jax.nn.log_softmax(logits), axis=-1))

    l, g = jax.value_and_grad(loss)(p, jax.random.fold_in(key, step))
    opt = optax.chain(optax.clip_by_global_norm(consts["CLIP"]),
                      optax.adamw(consts["LR"], consts["B1"], consts["B2"], consts["EPS"], weight_decay=consts["WD"]))
    state = (optax.EmptyState(), (optax.ScaleByAdamState(jnp.asarray(step), m, v), optax.EmptyState(),
                                  optax.EmptyState()))
    updates, (_, (adam, _, _)) = opt.update(g, state, p)
    return l, optax.apply_updates(p, updates), adam.mu, adam.nu


def _tree(inputs, prefix):
    """The dict pytree of a struct parameter's dotted leaves (`p.blocks.wq`, ...)."""
    return {"emb": inputs[f"{prefix}.emb"], "pos": inputs[f"{prefix}.pos"],
            "blocks": {f: inputs[f"{prefix}.blocks.{f}"] for f in BLOCK}, "ln_f": inputs[f"{prefix}.ln_f"]}


def _leaves(tree):
    """A GPT's leaves in declaration order (how the program returns them)."""
    return [tree["emb"], tree["pos"], *[tree["blocks"][f] for f in BLOCK], tree["ln_f"]]


@pytest.mark.parametrize("mesh, sizes", [({"data": 2, "model": 4}, {"V": 64, "B": 2, "S": 8, "H": 4, "DH": 4}),
                                         ({"data": 2, "model": 4}, {"V": 50, "B": 3, "S": 6, "H": 3, "DH": 4})])
def test_train_gpt_is_the_jax_optax_step(mesh, sizes):
    c = spmdlang.compile(str(PATH), mesh=mesh, consts=sizes)
    consts = {"L": 2, "RATE": 0.1, "LR": 3e-4, "B1": 0.9, "B2": 0.95, "EPS": 1e-8, "WD": 0.1, "CLIP": 1.0, **sizes}
    inputs = c.random_inputs(0)
    inputs["step"] = np.int32(7)
    for k in list(inputs):
        if k.startswith("v."):
            inputs[k] = np.abs(inputs[k])  # a second moment (the program takes abs of a random one)
    with jax.default_matmul_precision("highest"):
        want = jax_step(consts, _tree(inputs, "p"), _tree(inputs, "m"), _tree(inputs, "v"), inputs["step"],
                        inputs["key"], inputs["tokens"], inputs["targets"])
    want = [np.asarray(want[0])] + [np.asarray(a) for t in want[1:] for a in _leaves(t)]
    names = ["loss"] + [f"{t}.{n}" for t in "pmv" for n in ("emb", "pos", *[f"blocks.{f}" for f in BLOCK], "ln_f")]
    for backend in ("ref", "jax"):
        got = c.run(inputs, backend=backend)
        assert len(got) == len(want)
        for name, g, w in zip(names, got, want):
            np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-6, err_msg=f"{name} on {backend}")
