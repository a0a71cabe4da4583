"""The IR verifier: run after every pass (lowering, simplify, propagate, partition, finish) in the
tests, and under `--verify` or SPMDLANG_VERIFY=1. A failure here is a compiler bug, never a user
error, so it raises VerifyError (an AssertionError), not SpmdError.

  verify(prog)                      SSA order; known ops; every op's result types agree with its
                                    shape rule; ops belong to the program's stage (no collective in
                                    a global program, no shard() constraint left in a per-partition
                                    one); collective attributes agree with the mesh
  verify_shardings(prog, shardings) every value has a sharding of its rank, over the mesh's axes,
                                    each axis used at most once
  verify_spmd(spmd)                 the per-partition program, and its parameters and results hold
                                    the local shapes their shardings give the global types
"""

from __future__ import annotations

import os

from . import registry
from .collectives import spec
from .core import LOOP, Loop, Op, Program, all_ops
from .mesh import Mesh, Sharding
from .types import TensorType


class VerifyError(AssertionError):
    pass


def enabled(flag: bool | None = None) -> bool:
    """Verification on? An explicit flag wins, else the SPMDLANG_VERIFY environment variable."""
    if flag is not None:
        return flag
    return os.environ.get("SPMDLANG_VERIFY", "") not in ("", "0")


def verify(prog: Program) -> None:
    defined = {p.value for p in prog.params}
    _verify_ops(prog, prog.ops, defined, "")
    for r in prog.results:
        if r.value not in defined:
            raise VerifyError(f"result {r.value!r} is not defined")


def _verify_loop(prog: Program, op: Op, where: str, seen: set) -> None:
    """A loop: an i32[] index, carried types loop-invariant (init, body param, body result and
    loop result alike), captures typed as their operands; the body sees only its own values."""
    if len(op.regions) != 1 or not {"start", "stop"} <= set(op.attrs):
        raise VerifyError(f"{where}: a loop needs one body region and start/stop attributes")
    loop = Loop(op)
    body = loop.body
    if len(body.params) != 1 + len(op.operands):
        raise VerifyError(f"{where}: body has {len(body.params)} params for 1 index and {len(op.operands)} operands")
    if loop.index.type != TensorType("i32", ()):
        raise VerifyError(f"{where}: loop index typed {loop.index.type}, not i32[]")
    if len(body.results) != loop.n:
        raise VerifyError(f"{where}: body yields {len(body.results)} values for {loop.n} carries")
    for k, (init, p, nxt, r) in enumerate(zip(loop.inits, loop.carries, body.results, op.results)):
        if not init.type == p.type == nxt.type == r.type:
            raise VerifyError(f"{where}: carry {k} is not loop-invariant: {init.type} in, {p.type} in the body, "
                              f"{nxt.type} yielded, {r.type} out")
    for c, p in zip(loop.captures, loop.capture_params):
        if c.type != p.type:
            raise VerifyError(f"{where}: capture {c!r} typed {c.type}, its body param {p.type}")
    inner = set(body.params)
    if inner & seen:
        raise VerifyError(f"{where}: a body param is also defined outside the body")
    _verify_ops(prog, body.ops, inner, f"{where} body: ")
    for v in body.results:
        if v not in inner:
            raise VerifyError(f"{where}: body yields {v!r}, which the body does not define")


def _verify_ops(prog: Program, ops, defined: set, prefix: str) -> None:
    for i, op in enumerate(ops):
        where = f"{prefix}op #{i} ({op.kind})"
        if op.kind == LOOP:
            for v in op.operands:
                if v not in defined:
                    raise VerifyError(f"{where}: operand {v!r} used before definition")
            _verify_loop(prog, op, where, defined)
            for r in op.results:
                if r in defined:
                    raise VerifyError(f"{where}: {r!r} defined twice")
                defined.add(r)
            continue
        if op.regions:
            raise VerifyError(f"{where}: only a loop has regions")
        if op.kind not in registry.OPS:
            raise VerifyError(f"{where}: unknown op")
        opdef = registry.OPS[op.kind]
        if opdef.local_only and not prog.local:
            raise VerifyError(f"{where}: per-partition op in a global program")
        if opdef.global_only and prog.local:
            raise VerifyError(f"{where}: global-only op left in a per-partition program")
        for v in op.operands:
            if v not in defined:
                raise VerifyError(f"{where}: operand {v!r} used before definition")
        if "axes" in op.attrs and opdef.local_only:
            _check_group(op, prog.mesh, where)
        try:
            types = opdef.infer_types([v.type for v in op.operands], op.attrs)
        except Exception as e:  # noqa: BLE001  (any failure is a verifier finding)
            raise VerifyError(f"{where}: shape rule rejects the op: {e}") from e
        got = tuple(r.type for r in op.results)
        if types != got:
            raise VerifyError(f"{where}: results typed {list(map(str, got))}, rule says {list(map(str, types))}")
        for r in op.results:
            if r in defined:
                raise VerifyError(f"{where}: {r!r} defined twice")
            defined.add(r)


def _check_group(op: Op, mesh: Mesh, where: str) -> None:
    """A collective (or partition index) names a group of mesh axes its attributes agree with; a
    collective carries the attributes its entry in the collective table (ir.collectives) names."""
    collective = spec(op.kind)
    if collective is not None and set(op.attrs) != set(collective.attrs):
        raise VerifyError(f"{where}: attributes {sorted(op.attrs)}, but a {op.kind} carries {sorted(collective.attrs)}")
    axes = tuple(op.attrs["axes"])
    if not axes or len(set(axes)) != len(axes) or any(a not in mesh.names for a in axes):
        raise VerifyError(f"{where}: axes {list(axes)} are not distinct axes of mesh {mesh}")
    if "group" in op.attrs and op.attrs["group"] != mesh.group_size(axes):
        raise VerifyError(f"{where}: group {op.attrs['group']} but axes {list(axes)} hold {mesh.group_size(axes)}")
    if "sizes" in op.attrs and tuple(op.attrs["sizes"]) != tuple(mesh.axis_size(a) for a in axes):
        raise VerifyError(f"{where}: sizes {list(op.attrs['sizes'])} are not the sizes of axes {list(axes)}")
    if "reduce" in op.attrs and op.attrs["reduce"] not in tuple(registry.ReduceKind):
        raise VerifyError(f"{where}: unknown reduction {op.attrs['reduce']!r}")
    rank = op.operands[0].type.rank if op.operands else 0
    for key in collective.dims if collective else ():
        if not 0 <= op.attrs[key] < rank:
            raise VerifyError(f"{where}: {key} {op.attrs[key]} out of range for rank {rank}")


def check_sharding(s: Sharding, rank: int, mesh: Mesh, what: str) -> None:
    if s.rank != rank:
        raise VerifyError(f"{what}: sharding {s} has {s.rank} dims for rank {rank}")
    used = [a for d in s.dims for a in d] + list(s.partial)
    if any(a not in mesh.names for a in used):
        raise VerifyError(f"{what}: sharding {s} names an axis mesh {mesh} lacks")
    if len(set(used)) != len(used):
        raise VerifyError(f"{what}: sharding {s} uses an axis twice")


def verify_shardings(prog: Program, shardings) -> None:
    """Every value of the global program has a well-formed sharding (propagation's output)."""
    for v in prog.values():
        if v not in shardings:
            raise VerifyError(f"value {v!r} has no sharding")
        check_sharding(shardings[v], v.type.rank, prog.mesh, repr(v))
        if shardings[v].partial:
            raise VerifyError(f"value {v!r}: propagation never makes a pending sum, got {shardings[v]}")


def verify_spmd(spmd) -> None:
    """A partition.spmd.SpmdProgram: its program, and local shapes at its boundary."""
    prog, gprog = spmd.program, spmd.global_program
    if not prog.local:
        raise VerifyError("the per-partition program is not marked local")
    verify(prog)
    mesh = prog.mesh
    boundary = [("parameter", spmd.in_shardings, prog.params, gprog.params),
                ("result", spmd.out_shardings, prog.results, gprog.results)]
    for what, shardings, local, glob in boundary:
        if not len(shardings) == len(local) == len(glob):
            raise VerifyError(f"{len(shardings)} {what} shardings for {len(local)} local and {len(glob)} global")
        for i, (s, lv, gv) in enumerate(zip(shardings, local, glob)):
            name = f"{what} {i}"
            check_sharding(s, gv.value.type.rank, mesh, name)
            if s.partial:
                raise VerifyError(f"{name}: a pending sum at the program's boundary ({s})")
            want = s.local_shape(gv.value.type.shape, mesh)
            if lv.value.type.shape != want or lv.value.type.dtype != gv.value.type.dtype:
                raise VerifyError(f"{name}: local {lv.value.type}, but {gv.value.type} {s} is {list(want)} per device")
    ops = set(all_ops(prog.ops))
    for c in spmd.ledger:
        if c.local_op is not None and c.local_op not in ops:
            raise VerifyError(f"ledger entry {c.kind} (line {c.line}) points at an op not in the program")
