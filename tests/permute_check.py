"""The device pairs of a compiled program's collective_permutes, as the simulator pairs them and as
XLA's compiled module of the jax backend pairs them (the two must agree on any mesh order)."""

from __future__ import annotations

import re

from spmdlang.backend_jax.hlo import compiled_text
from spmdlang.ops.collective import groups
from spmdlang.partition.permute import permute_pairs

_PAIRS = re.compile(r"source_target_pairs=\{((?:\{\d+,\d+\},?)*)\}")


def permute_ops(c):
    return [op for op in c.spmd.program.ops if op.kind == "collective_permute"]


def simulated_and_compiled_pairs(c, inputs):
    """(pairs the simulator uses, pairs in XLA's compiled HLO), each sorted per permute."""
    want = sorted(sorted((g[s], g[d]) for g in groups(c.mesh, op.attrs["axes"])
                         for s, d in permute_pairs(op.attrs["rule"], op.attrs["sizes"])) for op in permute_ops(c))
    r = c.runner("jax")
    hlo = compiled_text(r.fn, *r.module.place([inputs[p.name] for p in c.program.params], r.mesh))
    got = sorted(sorted(tuple(map(int, pair)) for pair in re.findall(r"\{(\d+),(\d+)\}", m))
                 for m in _PAIRS.findall(hlo))
    return want, got
