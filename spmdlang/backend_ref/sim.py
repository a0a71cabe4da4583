"""The mesh simulator: every device of the mesh runs the per-partition program, in numpy.

Inputs are cut into per-device shards with their padding poisoned (NaN for floats, a large
sentinel for ints, True for bools), so a partitioning that forgets to mask padding gives a wrong
answer instead of a lucky one. Collectives are evaluated over all devices with their op-table
`simulate`. Results are reassembled from the shards, and devices holding replicas of the same
block must agree (a disagreement is a partitioner bug and raises).
"""

from __future__ import annotations

import numpy as np

from ..ir import registry
from ..ir.core import LOOP, Loop
from ..ir.mesh import Mesh, Sharding
from ..ir.types import np_is_float
from ..limits import out_of_memory
from .interp import run_loop

INT_POISON = 1_000_000_007


def poison(dtype: np.dtype):
    if np_is_float(dtype):
        return np.nan
    if dtype.kind == "b":
        return True
    return min(INT_POISON, np.iinfo(dtype).max)


def block_slices(shape, s: Sharding, mesh: Mesh, pos: int):
    """The global index ranges device `pos` holds, per dim: (start, stop, chunk)."""
    out = []
    for n, axes in zip(shape, s.dims):
        k = mesh.group_size(axes)
        idx = mesh.group_index(pos, axes)
        ch = -(-n // k)
        out.append((min(idx * ch, n), min((idx + 1) * ch, n), ch))
    return out


def scatter(array: np.ndarray, s: Sharding, mesh: Mesh) -> list[np.ndarray]:
    out = []
    for pos in range(mesh.size):
        blocks = block_slices(array.shape, s, mesh, pos)
        local = np.full([ch for _, _, ch in blocks], poison(array.dtype), dtype=array.dtype)
        src = tuple(slice(a, b) for a, b, _ in blocks)
        dst = tuple(slice(0, b - a) for a, b, _ in blocks)
        local[dst] = array[src]
        out.append(local)
    return out


def assemble(shards: list[np.ndarray], shape, dtype, s: Sharding, mesh: Mesh) -> np.ndarray:
    out = np.zeros(shape, dtype=dtype)
    seen = np.zeros(shape, dtype=bool)
    for pos in range(mesh.size):
        blocks = block_slices(shape, s, mesh, pos)
        dst = tuple(slice(a, b) for a, b, _ in blocks)
        src = tuple(slice(0, b - a) for a, b, _ in blocks)
        block = shards[pos][src]
        if seen[dst].any():
            prev = out[dst]
            same = (prev == block) | (_isnan(prev) & _isnan(block))
            if not np.all(same):
                raise AssertionError(f"replicas disagree on a block of a {s} result (device position {pos})")
        out[dst] = block
        seen[dst] = True
    return out


def _isnan(a):
    return np.isnan(a.astype(np.float32)) if np_is_float(a.dtype) else np.zeros(a.shape, bool)


def run_sim(spmd, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Run the per-partition program (partition.spmd.SpmdProgram) on every device of its mesh."""
    prog = spmd.program
    shards = [scatter(np.asarray(inputs[p.name]), s, prog.mesh) for p, s in zip(prog.params, spmd.in_shardings)]
    return run_shards(spmd, shards)


def _run_ops(ops, env: dict, mesh: Mesh) -> None:
    """Run `ops` on every device: env maps each value to its per-device arrays."""
    for op in ops:
        if op.kind == LOOP:
            outs = run_loop(Loop(op), [env[v] for v in op.operands], lambda o, e: _run_ops(o, e, mesh),
                            lambda i: [np.asarray(i, dtype=np.int32)] * mesh.size)
        else:
            opdef = registry.get(op.kind)
            try:
                if opdef.simulate is not None:
                    outs = opdef.simulate([env[v] for v in op.operands], op.attrs, mesh)
                else:
                    per_device = [opdef.evaluate([env[v][pos] for v in op.operands], op.attrs)
                                  for pos in range(mesh.size)]
                    outs = [[np.asarray(d[i]) for d in per_device] for i in range(len(op.results))]
            except MemoryError:
                raise out_of_memory(op, "sim") from None
        for r, per_device_result in zip(op.results, outs):
            env[r] = per_device_result


def run_shards(spmd, shards: list[list[np.ndarray]]) -> list[np.ndarray]:
    """Run on given per-device inputs (one list of mesh.size arrays per parameter); global results."""
    prog = spmd.program
    mesh = prog.mesh
    env: dict = {p.value: list(s) for p, s in zip(prog.params, shards)}
    with np.errstate(all="ignore"):
        _run_ops(prog.ops, env, mesh)
    results = []
    for r, s, g in zip(prog.results, spmd.out_shardings, spmd.global_program.results):
        results.append(assemble(env[r.value], g.value.type.shape, env[r.value][0].dtype, s, mesh))
    return results
