"""The cost model: one description of what collectives, local work and replicated memory cost,
used by reshard planning, halo planning, the partitioner's choices and `explain`.

Collectives run as ring (or tree) algorithms, alpha-beta:
  time = steps * step latency + bytes sent per device / link bandwidth
each kind's steps and bytes being its entry in the collective table (ir.collectives:
latency_steps, step_bytes).
A halo exchange sends to both neighbours at once: its two directions run concurrently on the two
directions of each link, so it costs the slower direction (one step per permute in that direction,
that direction's bytes), not the sum.

Plans that replicate are charged for it: local work (FLOPs, and elements written) at the device's
compute rate, and every byte a plan holds beyond what the sharded plan holds at REPLICATED_BYTE
(the memory that partitioning exists to save: gathering a whole image to skip a halo exchange
must lose even where the network is idle).

The planner works in bytes sent per device, the unit of the ledger and of XLA's HLO:
  LATENCY_BYTES    what a latency step adds: 16 bytes, a tie-breaker. The physical alpha * beta
                   (tpu-v4: 1 us * 45 GB/s = 45,000 bytes) would make every plan under ~100 KB
                   trade bytes for fewer steps: two small all_reduces of a softmax become one
                   all_gather of the whole input, a halo becomes a gather of the image. Those
                   plans are faster only while the whole exchange takes a few microseconds, and
                   they are the ones that stop scaling, so planning ranks by bytes and counts
                   latency only between plans within a few bytes of each other. `explain`
                   reports modelled time with the physical figures.
  FLOPS_PER_BYTE   achieved FLOP/s / link bandwidth (tpu-v4: 1% of 275 TFLOP/s / 45 GB/s ~ 61)
  STEP_BYTES       the physical alpha * beta of PLANNING (45,000 bytes per latency step), used in
                   one place only: settling a pending sum where a combined reduction can carry it.
Combined reductions. The combiner (partition.combine) merges independent all_reduces (and
reduce_scatters) over the same group into one collective, as XLA's combiners do. A pending sum
(a weight gradient: a local einsum over the local batch) settled by such a collective adds its
bytes to the step but no collective: its latency is paid once by the group. Gathering the
einsum's operands instead (fewer bytes when the batch is small) adds collectives of its own. The
two differ in collectives, not in a tie, so the partitioner weighs them on the whole step in
physical alpha-beta (STEP_BYTES per latency step, none for the settlement that joins a group):
where that favours settling, and the settlement does join another reduction of the step over the
same group (known from a first plan), the step is planned again settling there, and the plan
with the lower modelled step time (`step_time_us`, after combining) is kept. Halo exchanges and
every other choice keep the tie-breaker above.
Constants of the presets, public figures (rough; for ranking plans, not predicting wall time):
  tpu-v4      ICI: 4.5e10 bytes/s per link and direction (a 400 Gb/s link; also the figure of
              "How to Scale Your Model", jax-ml.github.io/scaling-book); ~1 us per hop; 275 TFLOP/s
              bf16 peak and 1.2 TB/s HBM per chip (cloud.google.com/tpu/docs/v4)
  gpu-nvlink  A100 NVLink 3: 300 GB/s per direction (600 GB/s total); ~5 us per NCCL step; 312
              TFLOP/s bf16 peak, 2.0 TB/s HBM (NVIDIA A100 datasheet)
Local work is charged at 1% of peak FLOP/s (ACHIEVED): the ops the partitioner weighs are mostly
small and memory-bound, far from peak, and a plan that replicates work should not win on the
assumption that it runs at peak.
Known differences from real hardware are listed in docs/cost_model.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir import registry
from ..ir.collectives import latency_steps, step_bytes  # noqa: F401  (step_bytes: re-exported)
from ..ir.core import LOOP, walk
from . import memory


@dataclass(frozen=True)
class Machine:
    """One device and its links, as the cost model sees them."""

    bandwidth_gbps: float  # per link and direction, GB/s
    latency_us: float  # one step of a collective (a hop)
    peak_tflops: float  # per device
    hbm_gbps: float  # per device (for reference; replicated memory is charged in link bytes)


PRESETS = {
    "tpu-v4": Machine(bandwidth_gbps=45.0, latency_us=1.0, peak_tflops=275.0, hbm_gbps=1200.0),
    "gpu-nvlink": Machine(bandwidth_gbps=300.0, latency_us=5.0, peak_tflops=312.0, hbm_gbps=2039.0),
}
PLANNING = PRESETS["tpu-v4"]  # the planner ranks plans on this machine
ACHIEVED = 0.01  # fraction of peak FLOP/s charged for local work (see the module docstring)

LATENCY_BYTES = 16.0  # per latency step, in planning: a tie-breaker, not alpha * beta (see above)
FLOPS_PER_BYTE = PLANNING.peak_tflops * 1e12 * ACHIEVED / (PLANNING.bandwidth_gbps * 1e9)  # ~61
REPLICATED_BYTE = 1.0  # each byte held beyond the sharded plan costs as much as one byte sent
STEP_BYTES = PLANNING.latency_us * PLANNING.bandwidth_gbps * 1e3  # physical alpha*beta: 45,000 bytes


def collective_cost(kind: str, k: int, nbytes: float) -> float:
    """One collective in the planner's unit (link byte-equivalents): bytes plus its latency steps."""
    return nbytes + LATENCY_BYTES * latency_steps(kind, k)


def step_cost(steps, shared=None) -> float:
    """A plan's collectives in physical alpha-beta: bytes plus STEP_BYTES per latency step, except
    for `shared` (a settlement that joins a combined reduction: its group pays the latency)."""
    return sum(s.bytes + (0.0 if s is shared else STEP_BYTES * latency_steps(s.kind, s.group)) for s in steps)


def comm_cost(steps) -> float:
    """A reshard plan (partition.reshard.Step list): its collectives, one after another."""
    return sum(collective_cost(s.kind, s.group, s.bytes) for s in steps)


def exchange_cost(directions) -> float:
    """A halo exchange: [(bytes, permutes)] per direction. The directions run concurrently (latency
    steps: the longer direction's permutes); the bytes are all counted, as the ledger counts them."""
    return sum(b for b, _ in directions) + LATENCY_BYTES * max((n for _, n in directions), default=0)


def replicated_cost(nbytes: float, flops: float = 0.0) -> float:
    """What a plan pays for holding `nbytes` and computing `flops` beyond the sharded plan."""
    return REPLICATED_BYTE * nbytes + flops / FLOPS_PER_BYTE


def collective_time_us(kind: str, k: int, nbytes: float, axes, bandwidth: dict, latency: dict,
                       preset: str = "tpu-v4") -> float:
    """Modelled time of one collective: the slowest axis of the group sets bandwidth and latency
    (per-axis overrides from `explain --bandwidth/--latency`)."""
    base = PRESETS[preset]
    bw = min((bandwidth.get(a, base.bandwidth_gbps) for a in axes), default=base.bandwidth_gbps)
    lat = max((latency.get(a, base.latency_us) for a in axes), default=base.latency_us)
    return lat * latency_steps(kind, k) + nbytes / (bw * 1e3)  # GB/s = 1e3 bytes per microsecond


# ---------------------------------------------------------------------------------- local work


def op_flops(op) -> int:
    """Floating-point operations of one op on its (local) shapes, as its op-table entry counts them."""
    return registry.get(op.kind).count_flops([v.type for v in op.operands], [r.type for r in op.results], op.attrs)


def flops(prog, per_iteration: bool = True) -> int:
    """FLOPs of a program run once: an op in a loop body counts once per iteration, or once with
    `per_iteration=False` (as XLA's cost_analysis() counts a while loop's body)."""
    return sum(op_flops(op) * (trips if per_iteration else 1) for op, trips in walk(prog.ops) if op.kind != LOOP)


def peak_bytes(prog) -> int:
    """Peak bytes per device of a per-partition program as XLA's compiled module holds them:
    arguments + outputs + the most its temporaries hold at once after fusion and buffer sharing
    (partition.memory). The ref and sim backends, which do not fuse, hold more
    (limits.peak_and_culprit)."""
    return memory.peak_bytes(prog)


def compute_time_us(flops: float, preset: str = "tpu-v4") -> float:
    """Modelled time of `flops` of local work at ACHIEVED of the preset's peak."""
    return flops / (PRESETS[preset].peak_tflops * 1e12 * ACHIEVED) * 1e6


def ledger_time_us(ledger, mesh, preset: str = "tpu-v4", bandwidth=None, latency=None) -> float:
    """Modelled time of a plan's collectives (partition.ledger.Collective entries), one after
    another, each as many times as it runs (a loop body's: once per iteration). The one measure of
    a plan's communication: the partitioner's second plan, `explain` and autoshard read it."""
    return sum(collective_time_us(c.kind, mesh.group_size(c.axes), c.bytes_per_device, c.axes, bandwidth or {},
                                  latency or {}, preset) * c.trip_count for c in ledger)


def step_time_us(ledger, mesh, flops: float, preset: str = "tpu-v4") -> float:
    """Modelled step time of a plan: its collectives (ledger_time_us, each as often as it runs)
    plus `flops` of local work (no overlap of the two is assumed). The one modelled time: the
    partitioner's second plan (partition.spmd.step_time) and autoshard's plans are ranked by it."""
    return ledger_time_us(ledger, mesh, preset) + compute_time_us(flops, preset)
