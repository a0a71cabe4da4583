"""Weight-update sharding (Xu et al. 2020, "Automatic cross-replica sharding of weight update in
data-parallel training"): a pass on the global program, before propagation.

In data-parallel training every replica receives the whole gradient (an all_reduce) and runs the
same weight update. When the update is elementwise (w_new = f(w, g, m, v, ...) element by element:
SGD, momentum, Adam), each replica can instead update one shard of the weight: the gradient is
reduce-scattered over the data axis into that shard, the update and its optimizer state run on
1/k of the elements, and the new weights are all-gathered where they are needed replicated. The
reduce_scatter + all_gather send as much as the all_reduce alone, and the update's work and its
state's memory shrink k-fold.

The pass only adds sharding constraints (shard() ops); propagation and the partitioner then find
the reduce_scatter and the all_gather themselves. An update region is found from each result:
the elementwise ops with the result's shape that lead back to it. It qualifies when one of its
leaves is a parameter of that shape (the weight, or an optimizer state) whose layout does not use
the axis, and all its other leaves are scalars or values of that shape (the gradient, the
state). Every value the region computes, and every non-parameter leaf of its shape, is then
constrained to the parameter's layout with the axis added on the dim it divides best.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir import registry
from ..ir.builder import Builder
from ..ir.core import Op, Program, Result, Value
from ..ir.mesh import Mesh, Sharding
from ..ir.registry import Family


@dataclass(frozen=True)
class Note:
    """What the pass did for one update region (explain prints it)."""

    line: int | None
    message: str


def shard_weight_updates(prog: Program, axis: str) -> tuple[Program, list[Note]]:
    """`prog` with every elementwise update of a parameter replicated over `axis` sharded over
    it (see the module doc), and a note per region. Pure."""
    mesh = prog.mesh
    if mesh.axis_size(axis) <= 1:
        return prog, []
    producer = prog.producers()
    params = {p.value: p for p in prog.params}
    targets: dict[Value, Sharding] = {}
    notes: list[Note] = []
    done: set[Value] = set()
    regions = []
    for r in prog.results:
        value = _through_constraints(r.value, producer)
        if value.type.rank and value not in params:
            regions.append((value, *_region(value, producer), r.sharding))
    # the largest first: an update whose region holds another's (w's holds Adam's m and v) covers it
    regions.sort(key=lambda x: -len(x[1]))
    for value, region, leaves, wanted in regions:
        if value in done or value in targets or not region:
            continue
        weights = [params[v] for v in leaves if v in params and v.type.shape == value.type.shape]
        if not weights or not all(v.type.rank == 0 or v.type.shape == value.type.shape for v in leaves):
            continue
        layouts = {p.sharding.dims for p in weights if p.sharding is not None}
        if len(layouts) > 1 or any(axis in a for dims in layouts for a in dims):
            continue
        if any(_constrained_over(v, producer, axis) for v in leaves):
            continue  # the user already placed the gradient or state on the axis: theirs stands
        base = next(iter(layouts), ((),) * value.type.rank)
        dim = _best_dim(value.type.shape, base, mesh, axis)
        if wanted is not None and axis in wanted.used_axes():
            # the result is wanted split over the axis: run the update in that layout if it extends
            # the weight's (no resharding between the update and the result)
            dim = next(d for d, a in enumerate(wanted.dims) if axis in a)
            if not all(w[: len(b)] == b for w, b in zip(wanted.dims, base)):
                continue
            base = tuple(w[: w.index(axis)] if i == dim else b for i, (w, b) in enumerate(zip(wanted.dims, base)))
        if dim is None:
            continue
        dims = tuple(d + (axis,) if i == dim else d for i, d in enumerate(base))
        want = Sharding(dims, open_dims=frozenset() if layouts else frozenset(range(len(dims))) - {dim})
        chosen = [v for v in [*(op.result for op in region), *leaves]
                  if v not in params and v.type.shape == value.type.shape and v not in targets]
        for v in chosen:
            targets[v] = want
        done.add(value)
        names = ", ".join(sorted(p.name for p in weights))
        grads = [v for v in leaves if v not in params and v.type.rank]
        line = region[-1].span.line if region[-1].span else None
        what = (f"weight-update sharding over {axis}: the elementwise update of {names} ({len(region)} ops) "
                f"runs on {Sharding(dims)} instead of {Sharding(base)}")
        if grads:
            what += (f"; {'its gradient is' if len(grads) == 1 else 'its gradients are'} reduce-scattered "
                     "into that layout, not all-reduced")
        notes.append(Note(line, what))
    if not targets:
        return prog, notes
    return _constrain(prog, targets), notes


def _entry(op: Op | None):
    """A producer's op-table entry; None for a parameter and for a loop (whose results are leaves
    of a weight update's region, as a parameter is)."""
    return None if op is None else registry.entry(op.kind)


def _family(op: Op | None) -> Family | None:
    e = _entry(op)
    return e.family if e is not None else None


def _is_constraint(op: Op | None) -> bool:
    e = _entry(op)
    return e is not None and e.constraint


def _constrained_over(v: Value, producer, axis: str) -> bool:
    op = producer.get(v)
    return _is_constraint(op) and axis in op.attrs["sharding"].used_axes()


def _through_constraints(v: Value, producer) -> Value:
    op = producer.get(v)
    while _is_constraint(op):
        v = op.operands[0]
        op = producer.get(v)
    return v


def _region(value: Value, producer) -> tuple[list[Op], list[Value]]:
    """The elementwise ops of `value`'s shape that compute it (program order) and their leaves."""
    shape = value.type.shape
    ops: dict[Op, None] = {}
    leaves: dict[Value, None] = {}
    stack = [value]
    seen: set[Value] = set()
    while stack:
        v = stack.pop()
        if v in seen:
            continue
        seen.add(v)
        op = producer.get(v)
        family = _family(op)
        if family == Family.create and v.type.rank == 0:
            continue  # a scalar constant
        if (family != Family.elementwise or len(op.results) != 1
                or v.type.shape != shape or not v.type.dtype.startswith(("f", "bf"))):
            leaves[v] = None
            continue
        ops[op] = None
        stack.extend(op.operands)
    order = {op: i for i, op in enumerate(producer.values())}
    return sorted(ops, key=lambda op: order.get(op, 0)), list(leaves)


def _best_dim(shape, base, mesh: Mesh, axis: str) -> int | None:
    """The dim the axis splits with the least padding (then the largest, then the first)."""
    k = mesh.axis_size(axis)
    best, key = None, None
    for d, n in enumerate(shape):
        shards = mesh.group_size(base[d]) * k
        chunk = -(-n // shards)
        if chunk == 0 or n < shards:
            continue
        waste = chunk * shards - n
        if key is None or (waste, -n) < key:
            best, key = d, (waste, -n)
    return best


def _constrain(prog: Program, targets: dict[Value, Sharding]) -> Program:
    """A shard() after each target value (after the parameters, for parameter targets); every
    later use reads the constrained value."""
    b = Builder()
    subst: dict[Value, Value] = {}

    def constrain(v: Value, span):
        subst[v] = b.emit("shard", v, span=span, name=v.name, sharding=targets[v])

    for p in prog.params:
        if p.value in targets:
            constrain(p.value, p.span)
    for op in prog.ops:
        new = op.replace(operands=tuple(subst.get(v, v) for v in op.operands))
        b.ops.append(new)
        for r in op.results:
            if r in targets:
                constrain(r, op.span)
    results = tuple(Result(subst.get(r.value, r.value), r.sharding, r.span) for r in prog.results)
    names = tuple((n, subst.get(v, v), s) for n, v, s in prog.names)
    return prog.replace(ops=tuple(b.ops), results=results, names=names)
