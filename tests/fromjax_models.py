"""Models as users write them in flax and optax, for the from_jax tests and `spmdlang import`:
a decoder-only transformer LM (embedding tied to the output, causal self-attention, AdamW) and a
CNN (two convolutions, an average pool, a dense layer, SGD with momentum), one training step each.

`spmdlang import tests/fromjax_models.py:lm_step` traces lm_step with lm_step_args()."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import PartitionSpec as P

MESH = {"data": 2, "model": 2}
VOCAB, DIM, HEADS, LAYERS, BATCH, SEQ = 32, 16, 2, 2, 4, 8


class Block(nn.Module):
    heads: int

    @nn.compact
    def __call__(self, x):
        mask = nn.make_causal_mask(jnp.ones(x.shape[:2]))
        h = nn.LayerNorm()(x)
        x = x + nn.MultiHeadDotProductAttention(num_heads=self.heads, use_bias=False)(h, mask=mask)
        h = nn.LayerNorm()(x)
        h = nn.gelu(nn.Dense(4 * x.shape[-1])(h))
        return x + nn.Dense(x.shape[-1])(h)


class LM(nn.Module):
    @nn.compact
    def __call__(self, tokens):
        emb = nn.Embed(VOCAB, DIM)
        x = emb(tokens)
        for _ in range(LAYERS):
            x = Block(heads=HEADS)(x)
        return emb.attend(nn.LayerNorm()(x))


lm = LM()
lm_opt = optax.adamw(1e-3)


def lm_step(params, opt_state, tokens):
    def loss_fn(p):
        logits = lm.apply(p, tokens[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = lm_opt.update(grads, opt_state, params)
    return loss, optax.apply_updates(params, updates), opt_state


def lm_step_args():
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, VOCAB, (BATCH, SEQ + 1)), jnp.int32)
    params = lm.init(jax.random.PRNGKey(0), tokens[:, :-1])
    return params, lm_opt.init(params), tokens


def lm_step_specs():
    """Data parallelism: the batch split over `data`, the parameters left to propagation."""
    return None, None, P("data")


class CNN(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(8, (3, 3))(x))
        x = nn.avg_pool(x, (2, 2), (2, 2))
        x = nn.relu(nn.Conv(8, (3, 3), strides=2)(x))
        return nn.Dense(10)(x.reshape((x.shape[0], -1)))


cnn = CNN()
cnn_opt = optax.sgd(0.1, momentum=0.9)


def cnn_step(params, opt_state, images, labels):
    def loss_fn(p):
        logits = cnn.apply(p, images)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = cnn_opt.update(grads, opt_state, params)
    return loss, optax.apply_updates(params, updates), opt_state


def cnn_step_args():
    rng = np.random.default_rng(0)
    images = jnp.asarray(rng.standard_normal((BATCH, 12, 12, 3)), jnp.float32)
    labels = jnp.asarray(rng.integers(0, 10, (BATCH,)), jnp.int32)
    params = cnn.init(jax.random.PRNGKey(0), images)
    return params, cnn_opt.init(params), images, labels


def cnn_step_specs():
    return None, None, P("data"), P("data")
