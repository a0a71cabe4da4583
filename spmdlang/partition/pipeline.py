"""The pass pipeline: the compiler's passes after lowering, named and in order, in one place.

  canonicalize           CSE, simplification, a copy of a constant per use (ir.simplify) -> canonical
  shard_weight_updates   with the compile option only (partition.weight_update) -> canonical
  propagate              a sharding for every value (partition.propagate)     -> propagation
  partition              the per-partition program and its ledger (partition.spmd) -> spmd
  finish                 CSE, dead code, collective combining on the per-partition program;
                         the ledger follows its ops (partition.combine)      -> spmd

Each pass reads and writes named stages (`Stages`). A `Pipeline` runs the passes in order, only
as far as the stage asked for needs (the xla baseline needs the canonical program, not the
partitioned one), once each, and with verification on runs the pass's verifier (ir.verify) right
after it. Passes look their functions up when they run (what a test patches, runs).
A new pass is one `Pass` in PASSES; a pass that walks into loop bodies does so with
ir.core.rewrite_regions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..ir import simplify as simplify_
from ..ir import verify as V
from ..ir.core import Program
from ..limits import gc_paused
from . import combine, propagate, weight_update
from .propagate import Propagation
from .spmd import SpmdProgram, partition


@dataclass
class Stages:
    """What the passes read and write: the lowered program, compile options, and each stage so far."""

    lowered: Program
    weight_axis: str | None = None  # the --shard-weight-updates axis
    canonical: Program | None = None
    pass_notes: list = field(default_factory=list)  # what compile options did (weight_update.Note)
    propagation: Propagation | None = None
    spmd: SpmdProgram | None = None


@dataclass(frozen=True)
class Pass:
    name: str
    stage: str  # the stage it writes
    run: Callable[[Stages], None]
    check: Callable[[Stages], None]  # verifies what it wrote
    applies: Callable[[Stages], bool] = lambda stages: True


def _canonicalize(s: Stages) -> None:
    s.canonical = simplify_.split_constants(simplify_.simplify(simplify_.cse(s.lowered)[0]))


def _shard_weight_updates(s: Stages) -> None:
    s.canonical, s.pass_notes = weight_update.shard_weight_updates(s.canonical, s.weight_axis)


def _propagate(s: Stages) -> None:
    s.propagation = propagate.propagate(s.canonical)


def _partition(s: Stages) -> None:
    s.spmd = partition(s.canonical, s.propagation)


def _finish(s: Stages) -> None:
    s.spmd = combine.finish(s.spmd)


PASSES: tuple[Pass, ...] = (
    Pass("canonicalize", "canonical", _canonicalize, lambda s: V.verify(s.canonical)),
    Pass("shard_weight_updates", "canonical", _shard_weight_updates, lambda s: V.verify(s.canonical),
         applies=lambda s: bool(s.weight_axis)),
    Pass("propagate", "propagation", _propagate, lambda s: V.verify_shardings(s.canonical, s.propagation.shardings)),
    Pass("partition", "spmd", _partition, lambda s: V.verify_spmd(s.spmd)),
    Pass("finish", "spmd", _finish, lambda s: V.verify_spmd(s.spmd)),
)


class Pipeline:
    """The passes over one lowered program, run lazily up to the stage asked for."""

    def __init__(self, program: Program, verify: bool = False, weight_axis: str | None = None,
                 passes: tuple[Pass, ...] = PASSES):
        self.stages = Stages(program, weight_axis)
        self.verify, self.passes = verify, passes
        self.done = 0  # passes run (or skipped) so far
        self.error: BaseException | None = None  # what a pass (or its verifier) raised

    def stage(self, name: str):
        """Stage `name`, after every pass up to the last one that writes it. A pass that raised
        raises the same again for any later stage (rather than the stages after it reading one
        it never wrote)."""
        last = max(i for i, p in enumerate(self.passes) if p.stage == name)
        with gc_paused():
            while self.done <= last:
                if self.error is not None:
                    raise self.error
                p = self.passes[self.done]
                try:
                    if p.applies(self.stages):
                        p.run(self.stages)
                        if self.verify:
                            p.check(self.stages)
                except Exception as e:
                    self.error = e
                    raise
                self.done += 1
        return getattr(self.stages, name)
