"""Peak memory per device of a per-partition program, as XLA's compiled module holds it.

`explain`'s and autoshard's peak (partition.cost.peak_bytes) is what XLA's memory_analysis() of the
compiled module reports: argument + output + temp bytes, where temp is the most that the module's
temporaries occupy at once. A walk over the program in order, with the buffers XLA's fusion and
buffer assignment leave:

- Fusion. A value made by a fusible op (elementwise, broadcast, reshape, slice, pad, concat,
  iota, constants, masks) whose every consumer fuses it (fusible ops, reductions,
  dynamic_update_slice) is computed inside its consumers and never stored; its consumers read
  what it was made from, so those stay live until the consumers run. Every other value is a buffer.
- Buffer sharing. A reshape's result is its operand's buffer (a bitcast). A fused elementwise
  result, an all_reduce and a dynamic_update_slice write in place into a same-sized operand buffer
  that dies there; a loop's results take its initial carries' buffers that die at the loop.
- Outputs. The results' buffers are counted whole (output bytes); a temporary that dies before a
  result is written may sit in that result's buffer (XLA's buffer assignment shares live-out
  allocations with earlier temporaries), so it adds nothing.
- Loops. A body's own temporaries are live while the loop runs (its carries are the loop's
  buffers); a carry whose old value is still read after its new value is made takes a copy; a
  carry nothing reads after the loop and whose value only feeds its own update is dropped, as
  XLA's while-loop simplifier drops it.

Not modelled: XLA's scheduler reordering ops (the program order is the schedule; XLA may compute
weight-only values first and hold them), fragmentation of its temp heap, and values XLA:CPU stores
for its library calls where the model fuses them. `benchmarks/bench_explain_xla.py` compares the
figure with memory_analysis() on every program in programs/ (docs/performance.md).
The unfused walk (every value a buffer, live from its op to its last use) is limits.peak_and_culprit:
what the ref and sim backends, which do not fuse, hold.
"""

from __future__ import annotations

from bisect import bisect_left

from ..ir import registry
from ..ir.core import LOOP, Loop
from ..ir.registry import Family

# layout ops XLA does not fuse into their consumers (a sort, a reduce-window, an in-place update)
_UNFUSED_LAYOUT = frozenset({"sort", "argsort", "pool", "dynamic_update_slice"})
# reductions that are loops of their own in XLA (scans, top_k): their operand is a buffer
_UNFUSED_REDUCE = frozenset({"cumsum", "cumprod", "cummax", "top_k"})


def _fused_into_consumer(op) -> bool:
    """Is `op`'s result computed inside the fusion of its consumers?"""
    if op.kind == LOOP:
        return False
    family = registry.get(op.kind).family
    return family in (Family.elementwise, Family.create, Family.local) or (
        family == Family.layout and op.kind not in _UNFUSED_LAYOUT)


def _fuses_operands(op) -> bool:
    """Does `op` read fused operands (computing them inside itself) rather than buffers?"""
    if op.kind == LOOP:
        return False
    if _fused_into_consumer(op) or op.kind == "dynamic_update_slice":
        return True
    return registry.get(op.kind).family == Family.reduce and op.kind not in _UNFUSED_REDUCE


def _dead_carry(loop_op, k: int, used_outside: bool) -> bool:
    """Carry k of a loop that nothing reads after it and whose value only feeds its own update."""
    if used_outside:
        return False
    lp = Loop(loop_op)
    derived = {lp.carries[k]}
    for op in lp.body.ops:
        if any(v in derived for v in op.operands):
            derived.update(op.results)
    for op in lp.body.ops:
        if any(v in derived for v in op.operands) and not all(r in derived for r in op.results):
            return False  # read by something else in the body
    return not any(v in derived for j, v in enumerate(lp.body.results) if j != k)


def temp_peak(ops, outside, outputs, carries=None) -> int:
    """Most bytes of temporaries live at once while `ops` run: values other than `outside` (the
    parameters: live throughout, counted by the caller) and `outputs` (counted whole by the
    caller; temporaries that die before an output is written may share its buffer). `carries`:
    a loop body's (parameter, next value) pairs; None for a program."""
    walk = _Walk(ops, set(outside), outputs)
    walk.share_buffers()
    temps = [x for x in walk.start if x not in walk.out_roots]
    if carries is None:  # a loop body's outputs are its carries: busy for the whole iteration
        temps = _outside_outputs(temps, [(x.type.nbytes, walk.start[x]) for x in walk.out_roots], walk.start,
                                 walk.end)
    delta = [0] * (len(ops) + 1)
    for x in temps:
        delta[walk.start[x]] += x.type.nbytes
        delta[walk.end[x] + 1] -= x.type.nbytes
    position = {r: i for i, op in enumerate(ops) for r in op.results}
    for p, r in carries or ():  # the old value read after the new one is made: a copy
        if r in position and walk.last.get(p, -1) > position[r]:
            delta[position[r]] += p.type.nbytes
            delta[walk.last[p] + 1] -= p.type.nbytes
    bodies = {i: loop_peak(op) for i, op in enumerate(ops) if op.kind == LOOP}
    live = peak = 0
    for i in range(len(ops)):
        live += delta[i]
        peak = max(peak, live + bodies.get(i, 0))
    return peak


class _Walk:
    """One block of ops: which values are buffers (`buffers`), what each value is computed from
    (`made_of`: itself if stored, else the stored values its fusion reads), the position of each
    buffer's last read (`last`), and after share_buffers, the buffers' memory: `root` (the value
    whose memory a value uses) and each root's `start` and `end` positions."""

    def __init__(self, ops, outside: set, outputs):
        # (outputs in their order: the output buffers are offered to temporaries in it)
        self.ops, self.outside, self.output_order, self.outputs = ops, outside, list(outputs), set(outputs)
        users: dict = {}
        for op in ops:
            for v in op.operands:
                users.setdefault(v, []).append(op)
        self.dead = {op: {k for k, r in enumerate(op.results) if _dead_carry(op, k, r in self.outputs or r in users)}
                     for op in ops if op.kind == LOOP}
        readers: dict = {}
        for op in ops:
            for v in self.reads(op):
                readers.setdefault(v, []).append(op)
        self.made_of: dict = {v: (v,) for v in outside}
        self.buffers = set()
        for op in ops:
            for r in op.results:
                if (r in self.outputs or not _fused_into_consumer(op)
                        or any(not _fuses_operands(u) for u in readers.get(r, ()))):
                    self.buffers.add(r)
                    self.made_of[r] = (r,)
                else:
                    self.made_of[r] = tuple(dict.fromkeys(s for v in op.operands for s in self.made_of.get(v, ())))
        self.last: dict = {}
        for i, op in enumerate(ops):
            for v in self.reads(op):
                for s in self.made_of.get(v, ()):
                    self.last[s] = i

    def reads(self, op):
        """The operands `op` holds buffers of (a loop: not a dead carry's initial value, and not the
        scalars it captures, a few bytes that XLA folds into its body)."""
        if op.kind != LOOP:
            return op.operands
        n = len(op.results)
        return [v for k, v in enumerate(op.operands)
                if (k < n and k not in self.dead[op]) or (k >= n and v.type.size > 1)]

    def candidates(self, op, k: int):
        """The values whose buffer result k of `op` may take over (where it dies at `op`)."""
        if op.kind in ("reshape", "dynamic_update_slice"):
            return op.operands[:1]
        if op.kind == LOOP:
            return op.operands[k:k + 1]
        if op.kind == "all_reduce" or _fused_into_consumer(op):
            return [s for v in op.operands for s in self.made_of.get(v, ())]
        return []

    def share_buffers(self) -> None:
        self.root, self.start, self.end = {}, {}, {}
        for i, op in enumerate(self.ops):
            taken = set()
            for k, r in enumerate(op.results):
                if r not in self.buffers or r in self.outside or (op.kind == LOOP and k in self.dead[op]):
                    continue
                into = None
                for c in self.candidates(op, k):
                    x = self.root.get(c)
                    if x is not None and x not in taken and (op.kind == "reshape" or (
                            self.end[x] == i and x.type.nbytes == r.type.nbytes)):
                        into = x
                        break
                if into is None:
                    into, self.start[r], self.end[r] = r, i, self.last.get(r, i)
                else:
                    self.end[into] = max(self.end[into], self.last.get(r, i))
                taken.add(into)
                self.root[r] = into
        self.out_roots = dict.fromkeys(self.root[v] for v in self.output_order if v in self.root)


def _outside_outputs(temps, slots, start, end):
    """The temporaries that do not fit in an output's buffer before the output is written (largest
    first, each output buffer holding one temporary at a time)."""
    slots = [(size, t0, []) for size, t0 in sorted(slots, key=lambda s: (s[0], s[1])) if t0 > 0]
    rest = []
    for x in sorted(temps, key=lambda t: -t.type.nbytes):
        for size, t0, taken in slots:
            if x.type.nbytes > size or end[x] >= t0:
                continue
            j = bisect_left(taken, (start[x], end[x]))
            if (j == 0 or taken[j - 1][1] < start[x]) and (j == len(taken) or taken[j][0] > end[x]):
                taken.insert(j, (start[x], end[x]))
                break
        else:
            rest.append(x)
    return rest


def loop_peak(op) -> int:
    """Temporaries of one loop body while it runs (its carries and captures are the loop's)."""
    lp = Loop(op)
    return temp_peak(lp.body.ops, set(lp.body.params), lp.body.results,
                     carries=list(zip(lp.carries, lp.body.results)))


def peak_bytes(prog) -> int:
    """Argument + output + peak temporary bytes of a per-partition program (see the module doc)."""
    params = [p.value for p in prog.params]
    results = list(dict.fromkeys(r.value for r in prog.results))
    return (sum(v.type.nbytes for v in params) + sum(v.type.nbytes for v in results if v not in set(params))
            + temp_peak(prog.ops, set(params), results))
