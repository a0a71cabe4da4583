"""Cost model of a per-partition program: FLOPs, peak live memory, and collective time.

Collective time is alpha-beta: latency + bytes / bandwidth, taking the slowest axis of the group.
The presets are rough public figures, meant for comparing plans, not for predicting wall time:
  tpu-v4      ICI: 45 GB/s per axis and direction, 2 us per collective
  gpu-nvlink  NVLink 3 (A100): 150 GB/s, 5 us
"""

from __future__ import annotations

from ..ir import registry
from ..ir.core import Op, Program

PRESETS = {
    "tpu-v4": {"bandwidth_gbps": 45.0, "latency_us": 2.0},
    "gpu-nvlink": {"bandwidth_gbps": 150.0, "latency_us": 5.0},
}

# The partitioner's cost model, in bytes: what moves, a fixed charge per collective (latency: about
# alpha * beta at 2 us and 32 GB/s), and local work at FLOPS_PER_BYTE, so that neither many tiny
# collectives nor replicating a contraction on every device wins on bytes alone. (partition.reshard
# adds them up for a plan: comm_cost.)
LATENCY_BYTES = 64 * 1024
FLOPS_PER_BYTE = 64


def step_bytes(kind: str, k: int, size: float) -> float:
    """Bytes one device sends in a collective over a group of k, `size` being its local bytes before
    the step (the ledger's measure; backend_jax.hlo reads XLA's collectives by the same formulas)."""
    if kind == "all_gather":
        return (k - 1) * size
    if kind == "all_reduce":
        return 2 * (k - 1) / k * size
    if kind in ("reduce_scatter", "all_to_all"):
        return (k - 1) / k * size
    if kind == "collective_permute":
        return size
    return 0.0



def op_flops(op: Op) -> int:
    """Floating-point operations of one op on its (local) shapes, as its op-table entry counts them."""
    return registry.get(op.kind).count_flops([v.type for v in op.operands], [r.type for r in op.results], op.attrs)


def flops(prog: Program) -> int:
    return sum(op_flops(op) for op in prog.ops)


def peak_bytes(prog: Program) -> int:
    """Peak bytes live at once in program order: a value lives from its definition to its last use
    (parameters and results for the whole program)."""
    last: dict = {}
    for i, op in enumerate(prog.ops):
        for v in op.operands:
            last[v] = i
    end = len(prog.ops)
    for r in prog.results:
        last[r.value] = end
    live = sum(p.value.type.nbytes for p in prog.params)
    for p in prog.params:
        last[p.value] = end
    peak = live
    frees: dict[int, int] = {}
    for v, i in last.items():
        frees[i] = frees.get(i, 0) + v.type.nbytes
    for i, op in enumerate(prog.ops):
        live += sum(r.type.nbytes for r in op.results)
        peak = max(peak, live)
        live -= frees.get(i, 0)
        for r in op.results:
            if r not in last:
                live -= r.type.nbytes
    return peak


def collective_time_us(nbytes: float, axes, bandwidth: dict, latency: dict, preset: str = "tpu-v4") -> float:
    base = PRESETS[preset]
    bw = min((bandwidth.get(a, base["bandwidth_gbps"]) for a in axes), default=base["bandwidth_gbps"])
    lat = max((latency.get(a, base["latency_us"]) for a in axes), default=base["latency_us"])
    return lat + nbytes / (bw * 1e3)  # GB/s = 1e3 bytes per microsecond
