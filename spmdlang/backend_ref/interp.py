"""The numpy interpreter of the global program: the oracle every backend is checked against."""

from __future__ import annotations

import numpy as np

from ..ir import registry
from ..ir.core import Program


def run_global(prog: Program, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Evaluate the program on validated inputs (see spmdlang.inputs); results in order."""
    env = {p.value: np.asarray(inputs[p.name]) for p in prog.params}
    with np.errstate(all="ignore"):
        for op in prog.ops:
            outs = registry.get(op.kind).evaluate([env[v] for v in op.operands], op.attrs)
            for r, a in zip(op.results, outs):
                env[r] = np.asarray(a)
    return [env[r.value] for r in prog.results]
