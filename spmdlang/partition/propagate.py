"""Sharding propagation (GSPMD "sharding completion", done over factors as Shardy does).

From the annotated parameters, results and shard() constraints, give every value a sharding:
a fixpoint over the program in both directions where a value's sharding only ever grows (a dim's
axes are extended on the minor side, never changed), so it terminates.

Each round is Jacobi-style: every op due for a visit proposes shardings for its operands and
results from the *same* snapshot, and the proposals for one value are merged by a rule that does
not depend on which op proposed first. So the outcome does not depend on the order ops are
visited. Ops are admitted in phases, as GSPMD/Shardy prioritise them, and each phase first runs forward
only (operands -> results) to its fixpoint, then in both directions: a split arriving from an
op's inputs beats one pulled back from a distant user (GShard's dispatch einsum keeps the gating
split by group, not by expert):
  0. elementwise-like ops (pass-through factors only: elementwise, reshape, transpose, ...)
  1. every op's pass-through factors (einsum batch and free dims, kept dims of reductions, ...)
  2. reduction factors too (einsum contracting dims: one operand's split is offered to the other)
Within an op, a factor whose tensors disagree takes the axes of the largest tensor (moving the
smaller one is cheaper); the loser keeps its own sharding and is resharded by the partitioner.
Every extension remembers the op and the source value it came from, for `check` and `explain`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property, partial
from weakref import WeakKeyDictionary

from ..ir import registry
from ..ir.core import LOOP, Loop, Op, Program, Value, walk
from ..ir.mesh import Mesh, Sharding
from ..ir.mesh import axes_text as _axes_text
from ..memo import Memo
from .factors import REDUCTION, REPLICATE, FactorRule, elementwise_rule, project, restrict, unproject_dim

PHASES = (0, 1, 2)


@dataclass
class Origin:
    """Why a value's dim holds some axes: an annotation, or an op that passed them on from `source`."""

    kind: str  # "parameter", "constraint", "result", "propagated"
    dim: int
    axes: tuple[str, ...]
    op: Op | None = None
    source: Value | None = None
    source_dim: int | None = None


@dataclass
class Propagation:
    """The outcome: a sharding for every value, where each came from, and the conflicts met."""

    program: Program
    shardings: dict[Value, Sharding]
    origins: dict[Value, list[Origin]] = field(default_factory=dict)
    find_conflicts: Callable[[], list[tuple[Op, str]]] | None = field(default=None, repr=False, compare=False)
    rounds: int = 0

    @cached_property
    def conflicts(self) -> list[tuple[Op, str]]:
        """The conflicts met, worked out from the final shardings when first asked (only the
        reports read them: a compile to a module does not)."""
        found = self.find_conflicts() if self.find_conflicts is not None else []
        self.find_conflicts = None  # (it holds propagation's working state)
        return found

    def reason(self, v: Value, names=None) -> str:
        return describe_origins(self, v, names)


TIE = "loop carry"  # a pseudo-op of propagation only: its operand and result share one sharding


_MAX_ANSWERS = 1 << 15  # entries of the rule memo below (memo.Memo: emptied when full, and by clear_caches)


def _signature(op: Op):
    """What an op's factor rule and proposals read of the op itself (kind, attributes, types), or
    None where an attribute is unhashable."""
    key = (op.kind, tuple(sorted(op.attrs.items())), tuple(v.type for v in op.operands),
           tuple(r.type for r in op.results))
    try:
        hash(key)
    except TypeError:
        return None
    return key


# op -> its factor rule: a rule is a pure function of the (immutable) op, and propagation, the
# partitioner's plans and its second plans ask for the same op's many times; held weakly, so an
# entry lives as long as its op
_rules: WeakKeyDictionary[Op, FactorRule] = WeakKeyDictionary()


# and by what a rule reads of its op (_signature: kind, attributes, types), for the ops of
# repeated layers and the ops passes rebuild
_RULES = Memo(_MAX_ANSWERS)


def op_rule(op: Op) -> FactorRule:
    rule = _rules.get(op)
    if rule is None:
        sig = _signature(op)
        rule = _RULES.get(sig) if sig is not None else None
        if rule is None:
            if op.kind == TIE:
                rule = elementwise_rule([op.operands[0].type.shape], op.results[0].type.shape)
            else:
                opdef = registry.get(op.kind)
                rule = opdef.rule([v.type for v in op.operands], [r.type for r in op.results], op.attrs)
            if sig is not None:
                _RULES.put(sig, rule)
        _rules[op] = rule
    return rule


def _first(op: Op) -> bool:
    return op.kind == TIE or registry.get(op.kind).propagates_first


def flat_ops(prog: Program) -> list[Op]:
    """The ops propagation visits: every op, loop bodies included, with each loop replaced by ties
    (identity pseudo-ops) that give a carry one sharding at entry, in the body, at the back edge
    and at exit, and a capture its outer sharding in the body."""
    out = []
    for op, _ in walk(prog.ops):
        if op.kind != LOOP:
            out.append(op)
            continue
        loop = Loop(op)
        pairs = list(zip(loop.inits, loop.carries)) + list(zip(loop.carries, op.results))
        pairs += list(zip(loop.body.results, loop.carries)) + list(zip(loop.captures, loop.capture_params))
        out += [Op(TIE, (a,), (b,), {}, op.span) for a, b in pairs if a is not b and a.type == b.type]
    return out


class _State:
    def __init__(self, prog: Program, ops: list[Op] | None = None):
        ops = flat_ops(prog) if ops is None else ops
        self.mesh: Mesh = prog.mesh
        self.dims: dict[Value, list[tuple[str, ...]]] = {}
        self.open: dict[Value, set[int]] = {}
        self.origins: dict[Value, list[Origin]] = defaultdict(list)
        for p in prog.params:
            r = p.value.type.rank
            if p.sharding is not None:
                self.dims[p.value] = list(p.sharding.dims)
                self.open[p.value] = set()
                self.origins[p.value] += [Origin("parameter", d, a)
                                          for d, a in enumerate(p.sharding.dims) if a]
                if not any(p.sharding.dims):
                    self.origins[p.value].append(Origin("parameter", -1, ()))
            else:
                self.dims[p.value] = [()] * r
                self.open[p.value] = set(range(r))
        result_constraints = {r.value for r in prog.results if r.sharding is not None}
        for v in prog.values():
            if v not in self.dims:
                self.dims[v] = [()] * v.type.rank
                self.open[v] = set(range(v.type.rank))
        for op in ops:
            if op.kind != TIE and registry.get(op.kind).constraint:
                s: Sharding = op.attrs["sharding"]
                v = op.result
                self.dims[v] = list(s.dims)
                self.open[v] = set(s.open_dims)
                kind = "result" if v in result_constraints else "constraint"
                self.origins[v] += [Origin(kind, d, a, op) for d, a in enumerate(s.dims) if a]
                if not any(s.dims):
                    self.origins[v].append(Origin(kind, -1, (), op))
        self.nbytes: dict[Value, int] = {v: v.type.nbytes for v in self.dims}  # what proposals weigh


def _admitted(kinds, phase: int, first: bool) -> tuple[bool, ...]:
    """Per factor of these kinds, whether the phase admits it (for an op that propagates `first`)."""
    if phase == 0:
        return tuple(first and kind != REPLICATE for kind in kinds)
    if phase == 1:
        return tuple(kind != REPLICATE and kind != REDUCTION for kind in kinds)
    return tuple(kind != REPLICATE for kind in kinds)


def _propose(op: Op, rule: FactorRule, st: _State, phase: int, conflicts: dict, forward: bool = False,
             admitted: tuple[bool, ...] | None = None):
    """This op's proposals: [(value, dim, axes, strength, source value)]; only for its results
    when `forward`. `admitted`: _admitted for this op and phase, where the caller has it."""
    n = len(op.operands) if forward else 0
    return [p[1:] for p in _proposals(op, rule, st, phase, conflicts, admitted) if p[0] >= n]


def _proposals(op: Op, rule: FactorRule, st: _State, phase: int, conflicts: dict,
               admitted: tuple[bool, ...] | None = None):
    """_propose in both directions, each proposal led by its tensor's position in the op (operands,
    then results): the forward proposals are those of the results."""
    if admitted is None:
        admitted = _admitted(rule.kinds, phase, _first(op))
    if not any(admitted):  # (phase 0 admits no factor of an op that does not propagate first)
        return []
    tensors = op.operands + op.results
    mesh = st.mesh
    by_factor: dict[int, list] = {}
    for i, t in enumerate(tensors):
        dims = st.dims[t]
        if any(dims):
            for f, axes in project(rule.tensors[i], dims, rule.sizes, mesh, t.type.shape).items():
                by_factor.setdefault(f, []).append((axes, i))
    if not by_factor:
        return []
    nbytes = [st.nbytes[t] for t in tensors]
    chosen: dict[int, tuple[str, ...]] = {}
    strength: dict[int, tuple[int, int]] = {}
    source: dict[int, int] = {}  # factor -> index of the tensor its axes come from
    for f in sorted(by_factor):
        if not admitted[f]:
            continue
        cands = by_factor[f]
        # strongest first: the largest tensor, then the longest split, then a fixed order
        if len(cands) > 1:
            cands.sort(key=lambda c: (-nbytes[c[1]], -len(c[0]), c[0], c[1]))
        best, bi = cands[0]
        for axes, i in cands[1:]:
            if axes[: len(best)] == best and len(axes) > len(best):
                best, bi = axes, i  # a compatible refinement
            elif best[: len(axes)] != axes:
                conflicts.setdefault((op, f), ("dim", bi, best, i, axes))
        chosen[f], strength[f], source[f] = best, (nbytes[bi], len(best)), bi
    if not chosen:
        return []
    # one axis may split only one factor of the op: stronger factors keep theirs
    used: dict[str, int] = {}
    order = sorted(chosen, key=lambda f: (-strength[f][0], -strength[f][1], f)) if len(chosen) > 1 else list(chosen)
    for f in order:
        keep = []
        for a in chosen[f]:
            if a in used:
                g = used[a]
                conflicts.setdefault((op, f), ("axis", source[g], chosen[g], source[f], chosen[f], g, f))
                break
            keep.append(a)
        used.update(dict.fromkeys(keep, f))
        chosen[f] = tuple(keep)
    # what one tensor of the op cannot hold, none may keep (reshape dims made of several factors)
    chosen = restrict(rule, chosen, mesh)
    if not chosen:
        return []
    out = []
    for i, t in enumerate(tensors):
        factors = rule.tensors[i]
        for d in st.open[t]:
            dim = factors[d]
            axes = tuple(chosen.get(dim[0], ())) if len(dim) == 1 else unproject_dim(dim, chosen, rule.sizes, mesh)
            cur = st.dims[t][d]
            if len(axes) > len(cur) and axes[: len(cur)] == cur:
                fs = [f for f in dim if f in chosen]
                f = fs[0] if len(fs) == 1 else max(fs, key=lambda f: strength[f])
                # by position, not value: a value used twice (einsum(x, x)) has other factors each time
                src = source[f]
                out.append((i, t, d, axes, strength[f], (tensors[src], rule.factor_dims(src, f))))
    return out


def _merge(st: _State, v: Value, props, op_of) -> bool:
    """Apply the proposals for one value; order-independent. Returns whether it changed."""
    dims = st.dims[v]
    used = {a for d in dims for a in d}
    by_dim: dict[int, list] = defaultdict(list)
    for d, axes, s, src, op in props:
        by_dim[d].append((axes, s, src, op))
    # dims whose strongest proposal is strongest claim shared axes first
    strongest = {d: max(c[1] for c in cands) for d, cands in by_dim.items()}  # (bytes, split length)
    order = sorted(by_dim, key=lambda d: (-strongest[d][0], -strongest[d][1], d))
    changed = False
    for d in order:
        cands = sorted(by_dim[d], key=lambda c: (-c[1][0], -c[1][1], c[0], op_of[c[3]], c[2][1]))
        best, bsrc, bop = cands[0][0], cands[0][2], cands[0][3]
        for axes, _s, src, op in cands[1:]:
            if axes[: len(best)] == best and len(axes) > len(best):
                best, bsrc, bop = axes, src, op
        cur = dims[d]
        ext = []
        for a in best[len(cur):]:
            # a dim with fewer elements than shards still splits (the last shards are empty, as
            # for the value it came from): refusing would leave the value replicated, and every
            # op between two split values would gather and slice back
            if a in used:
                break
            ext.append(a)
        if ext:
            dims[d] = cur + tuple(ext)
            used.update(ext)
            st.origins[v].append(Origin("propagated", d, dims[d], bop, bsrc[0], bsrc[1]))
            changed = True
    return changed


def propagate(prog: Program) -> Propagation:
    """Give every value of the global program a sharding. Pure: the program is not changed."""
    ops = flat_ops(prog)
    st = _State(prog, ops)
    rules = {op: op_rule(op) for op in ops}
    index = {op: i for i, op in enumerate(ops)}
    adjacent: dict[Value, list[Op]] = defaultdict(list)
    for op in ops:
        for v in op.operands + op.results:
            adjacent[v].append(op)
    rounds = 0
    # an op's proposals depend only on its tensors' shardings and which of its factors the phase
    # admits (forward: those of its results): each phase starts by visiting every op, and most ask
    # what they asked in the pass before (an elementwise op admits the same factors in all three
    # phases, and a phase's forward pass asks what its pass in both directions asks again). An
    # answer is kept with the round its op's tensors last changed in (`touched`), and reused
    # while none has changed since. An op none of whose tensors has an open dim proposes nothing.
    admits = {}
    for op in ops:
        first = _first(op)
        for phase in PHASES:
            admits[op, phase] = _admitted(rules[op].kinds, phase, first)
    inert = {op for op in ops if not any(st.open[t] for t in op.operands + op.results)}
    touched = dict.fromkeys(ops, 0)
    answers: dict[tuple, tuple[int, list]] = {}
    for phase, forward in ((p, f) for p in PHASES for f in (True, False)):
        frontier = set(ops)
        while frontier:
            rounds += 1
            proposals: dict[Value, list] = defaultdict(list)
            for op in frontier:
                if op in inert:
                    continue
                key = (op, admits[op, phase])
                kept = answers.get(key)
                if kept is not None and kept[0] == touched[op]:
                    got = kept[1]
                else:
                    got = _proposals(op, rules[op], st, phase, {}, key[1])
                    answers[key] = (touched[op], got)
                n = len(op.operands) if forward else 0
                for i, t, d, axes, s, src in got:
                    if i >= n:
                        proposals[t].append((d, axes, s, src, op))
            changed = [v for v, props in proposals.items() if _merge(st, v, props, index)]
            frontier = {op for v in changed for op in adjacent[v]}
            for op in frontier:
                touched[op] = rounds
    shardings = {v: Sharding(tuple(d)) for v, d in st.dims.items()}
    return Propagation(prog, shardings, dict(st.origins), partial(_conflicts, ops, rules, st, index), rounds)


def _conflicts(ops, rules, st: _State, index) -> list[tuple[Op, str]]:
    """Where the final shardings disagree within an op, in program order. Taken from the final
    state, not while iterating, so each note names who finally keeps its split."""
    found: dict = {}
    for op in ops:
        _propose(op, rules[op], st, PHASES[-1], found)
    notes = []
    for (op, _f), c in sorted(found.items(), key=lambda kv: (index[kv[0][0]], kv[0][1])):
        tensors = op.operands + op.results
        if c[0] == "dim":
            _kind, wi, wa, li, la = c
            notes.append((op, _conflict_text(op, tensors[wi], wa, tensors[li], la)))
        else:
            _kind, wi, wa, li, la, g, f = c
            rule = rules[op]
            notes.append((op, _axis_conflict_text(op, tensors[wi], rule.factor_dims(wi, g), wa,
                                                  tensors[li], rule.factor_dims(li, f), la)))
    return _dedupe(notes)


def _dedupe(notes):
    seen, out = set(), []
    for op, text in notes:
        if (op, text) not in seen:
            seen.add((op, text))
            out.append((op, text))
    return out


def _conflict_text(op, winner, wa, loser, la) -> str:
    line = f" at line {op.span.line}" if op.span else ""
    return (f"{op.kind}{line}: {_name(winner)} wants {_axes_text(wa)}, {_name(loser)} wants {_axes_text(la)} "
            f"on the same dimension; kept {_name(winner)}'s "
            f"({winner.type.nbytes} bytes vs {loser.type.nbytes}), "
            f"{_name(loser)} will be resharded")


def _axis_conflict_text(op, winner, wd, wa, loser, ld, la) -> str:
    line = f" at line {op.span.line}" if op.span else ""
    shared = ", ".join(a for a in la if a in wa)
    return (f"{op.kind}{line}: {_name(winner)} dim {wd} ({', '.join(wa)}) and {_name(loser)} dim {ld} "
            f"({', '.join(la)}) are different dimensions of the op but share {shared}, which can split only "
            f"one; kept {_name(winner)}'s ({winner.type.nbytes} bytes vs {loser.type.nbytes}), "
            f"{_name(loser)} will be resharded")


def _name(v: Value, names=None) -> str:
    if names and v in names:
        return f"%{names[v]}"
    return f"%{v.name}" if v.name else f"a {v.type} temporary"


def _dim_origin(p: Propagation, v: Value, d: int) -> Origin | None:
    found = None
    for o in p.origins.get(v, []):
        if o.dim == d or o.dim == -1:
            found = o  # the last extension of the dim explains its final axes
    return found


def trace(p: Propagation, v: Value, d: int, names=None, limit: int = 12) -> str:
    """How dim d of v got its axes: the annotation it started from and the ops it came through."""
    steps = []
    seen = set()
    o = _dim_origin(p, v, d)
    while o is not None and o.kind == "propagated" and (v, d) not in seen and len(steps) < limit:
        seen.add((v, d))
        steps.append(f"{o.op.kind}" + (f":{o.op.span.line}" if o.op.span else ""))
        v, d = o.source, o.source_dim
        o = _dim_origin(p, v, d) if d is not None else None
    if o is None:
        start = _name(v, names)
    elif o.kind == "parameter":
        start = f"{_name(v, names)} (parameter)"
    else:
        what = "shard()" if o.kind == "constraint" else "result annotation"
        start = f"{what}" + (f":{o.op.span.line}" if o.op is not None and o.op.span else "")
    if len(steps) >= limit:
        steps.append("...")
    return " -> ".join([start] + list(reversed(steps)))


def describe_origins(p: Propagation, v: Value, names=None) -> str:
    """Per split dim: where its axes came from, as a chain from the annotation to this value."""
    sharding = p.shardings[v]
    if not any(sharding.dims):
        origins = p.origins.get(v, [])
        if origins and origins[-1].dim == -1:
            return "replicated, as annotated"
        return "replicated: no annotation reaches it"
    parts = []
    for d, axes in enumerate(sharding.dims):
        if axes:
            parts.append(f"dim {d} {_axes_text(axes)}: {trace(p, v, d, names)}")
    return "; ".join(parts)
