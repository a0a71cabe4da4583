"""`spmdlang autoshard`: choose the annotations a program leaves out, and write them into its source.

1. Compile the program as written (its annotations are the constraints) and build the search
   problem over its canonical global IR (autoshard.problem and autoshard.strategies: strategies from the factor rules,
   edge costs from the reshard planner, the cost model's units).
2. Solve it (an ILP through HiGHS, or the greedy fallback), then again for runner-up plans that
   lay out some parameter differently.
3. Write each plan into the source as ordinary annotations (a rewrite keyed by the spans the
   frontend records): a spec on every parameter and result that had none, and `shard()` around
   the assignments of the entry function whose chosen layout propagation would not find by itself.
4. Compile every candidate, the program as written included, and keep the one with the least
   modelled step time (partition.cost.step_time_us: its collectives plus its local work) whose
   per-device peak memory fits the budget. What is reported is measured on the compiled plans.

The package: problem (the graph and its costs), strategies (a unit's strategies, from the
partitioner's), solve (eliminations, ILP, greedy), rewrite (plans into source text), driver.
"""

from .driver import Autoshard, Plan, autoshard, render_autoshard
from .rewrite import batch_only, strip_annotations

__all__ = ["Autoshard", "Plan", "autoshard", "batch_only", "render_autoshard", "strip_annotations"]
