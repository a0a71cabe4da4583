"""The numpy interpreter of the global program: the oracle every backend is checked against."""

from __future__ import annotations

import numpy as np

from ..ir import registry
from ..ir.core import LOOP, Loop, Program
from ..limits import out_of_memory


def run_global(prog: Program, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Evaluate the program on validated inputs (see spmdlang.inputs); results in order."""
    env = {p.value: np.asarray(inputs[p.name]) for p in prog.params}
    with np.errstate(all="ignore"):
        run_ops(prog.ops, env)
    return [env[r.value] for r in prog.results]


def run_ops(ops, env: dict) -> None:
    """Evaluate `ops` into `env` (value -> array); a loop runs its body once per index."""
    for op in ops:
        if op.kind == LOOP:
            outs = run_loop(Loop(op), [env[v] for v in op.operands], run_ops,
                            lambda i: np.asarray(i, dtype=np.int32))
        else:
            try:
                outs = registry.get(op.kind).evaluate([env[v] for v in op.operands], op.attrs)
            except MemoryError:
                raise out_of_memory(op, "ref") from None
        for r, a in zip(op.results, outs):
            env[r] = np.asarray(a)


def run_loop(loop: Loop, operands: list, run, index) -> list:
    """The loop's results: carries threaded through `run(body ops, env)` once per index; `index(i)`
    makes the index value (an array, or one per device for the simulator)."""
    n = loop.n
    carries = list(operands[:n])
    captures = operands[n:]
    for i in range(loop.start, loop.stop):
        env = dict(zip(loop.body.params, [index(i), *carries, *captures]))
        run(loop.body.ops, env)
        carries = [env[v] for v in loop.body.results]
    return carries
