"""flax's examples/mnist model and training step (a CNN: two 3x3 convs, each with relu and a 2x2
stride-2 avg_pool, two dense layers; softmax cross-entropy on one-hot labels; optax.sgd with
momentum), the reference programs/train_mnist_cnn.spmd is checked against (tests/test_pool_halo.py).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax


class CNN(nn.Module):
    """examples/mnist/train.py's model."""

    @nn.compact
    def __call__(self, x):
        x = nn.Conv(features=32, kernel_size=(3, 3))(x)
        x = nn.relu(x)
        x = nn.avg_pool(x, window_shape=(2, 2), strides=(2, 2))
        x = nn.Conv(features=64, kernel_size=(3, 3))(x)
        x = nn.relu(x)
        x = nn.avg_pool(x, window_shape=(2, 2), strides=(2, 2))
        x = x.reshape((x.shape[0], -1))
        x = nn.Dense(features=256)(x)
        x = nn.relu(x)
        x = nn.Dense(features=10)(x)
        return x


cnn = CNN()
tx = optax.sgd(0.1, momentum=0.9)


def train_step(params, opt_state, images, labels):
    """One step as examples/mnist's apply_model and update_model, returning the loss too."""
    def loss_fn(p):
        logits = cnn.apply({"params": p}, images)
        return jnp.mean(optax.softmax_cross_entropy(logits=logits, labels=jax.nn.one_hot(labels, 10)))

    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return loss, optax.apply_updates(params, updates), opt_state


# the program's struct CNN fields, in flax's parameter tree
FIELDS = {"k1": ("Conv_0", "kernel"), "b1": ("Conv_0", "bias"), "k2": ("Conv_1", "kernel"),
          "b2": ("Conv_1", "bias"), "w3": ("Dense_0", "kernel"), "b3": ("Dense_0", "bias"),
          "w4": ("Dense_1", "kernel"), "b4": ("Dense_1", "bias")}
