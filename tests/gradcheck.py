"""Central finite differences of a loss against the gradients spmdlang computed, on `ref`.

Shared by the random-program gradient tests (tests/test_grad.py) and the loop gradient tests
(tests/test_loop_grad.py): probe a few random elements of each differentiated parameter.
"""

from __future__ import annotations

import numpy as np


def check_finite_differences(loss, inputs: dict, argnums, grads, rng: np.random.Generator, points: int = 3,
                             eps: float = 1e-6, rtol: float = 1e-5, context: str = "") -> None:
    """`loss`: the compiled loss function (its params in order); `grads[j]`: the gradient of
    parameter `argnums[j]`. Each probe perturbs one element by +-eps (run in float64)."""
    names = [p.name for p in loss.program.params]
    for i, g in zip(argnums, grads):
        name, x = names[i], inputs[names[i]]
        for _ in range(points if x.size else 0):
            k = tuple(int(rng.integers(0, n)) for n in x.shape)
            hi, lo = dict(inputs), dict(inputs)
            hi[name], lo[name] = x.copy(), x.copy()
            hi[name][k] += eps
            lo[name][k] -= eps
            fd = (loss.run(hi, backend="ref")[0] - loss.run(lo, backend="ref")[0]) / (2 * eps)
            assert abs(fd - g[k]) <= rtol * (1 + abs(fd)), (
                f"{context}d loss / d {name}{list(k)}: finite differences {fd}, grad {g[k]}")
