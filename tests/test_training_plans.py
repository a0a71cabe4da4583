"""Plan tests for training steps, with the backward passes written by hand (plain forward code
computing the gradients, as reverse-mode differentiation would): where a weight gradient (a
pending sum over `data`) is settled, and how summed input gradients are reduced.

- a replicated update settles its gradient with an all_reduce (combined across weights);
- a sharded update or optimizer state settles it with a reduce_scatter straight into the shard,
  never an all_reduce and a slice;
- a sum of pending sums (the q, k, v input gradients of attention) is added first and reduced once.

Each test also checks the mesh simulator against the reference."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import spmdlang
from spmdlang.ir.verify import verify
from spmdlang.partition.reshard import step_bytes

ROOT = Path(__file__).resolve().parent.parent
PATTERNS = ROOT / "benchmarks" / "patterns"
F32 = 4


def compiled(src, mesh=None, consts=None):
    c = spmdlang.compile(src, mesh=mesh, consts=consts)
    verify(c.spmd.program)
    d = c.diff(backends=["ref", "sim"])
    assert d["ok"], f"sim != ref: {d['results']}\n{c.spmd_ir}"
    return c


def plan(c) -> list[tuple[str, tuple[str, ...]]]:
    return [(e.kind, tuple(e.axes)) for e in c.spmd.ledger]


def total_bytes(c) -> float:
    return sum(e.bytes_per_device for e in c.spmd.ledger)


def test_data_parallel_sgd_is_one_combined_all_reduce():
    c = compiled(str(PATTERNS / "train_dp_mlp.spmd"), consts={"B": 256, "D": 16, "F": 32})
    assert plan(c) == [("all_reduce", ("data",))]
    # both gradients, whole ([D, F] and [F, D]), in one all_reduce over 8 devices
    assert total_bytes(c) == step_bytes("all_reduce", 8, 2 * 16 * 32 * F32)


def test_megatron_sgd_settles_gradients_over_data_once():
    c = compiled(str(PATTERNS / "train_mlp_sgd.spmd"), consts={"B": 64, "D": 16, "F": 32})
    assert sorted(plan(c)) == [("all_reduce", ("data",)), ("all_reduce", ("model",))]
    data = next(e for e in c.spmd.ledger if e.axes == ("data",))
    # each device holds a quarter (model) of each gradient: [16, 32/4] and [32/4, 16]
    assert data.bytes_per_device == step_bytes("all_reduce", 2, 2 * 16 * 8 * F32)


SHARDED_SGD = """
mesh [data=8]
func main(x: f32[256, 16] {data, _}, y: f32[256, 16] {data, _}, w: f32[16, 32] {data, _},
          w2: f32[32, 16] {data, _}) -> (f32[16, 32] {data, _}, f32[32, 16] {data, _}) {
  h = x @ w
  dy = h @ w2 - y
  g2 = einsum("bf,bd->fd", h, dy)
  g = einsum("bd,bf->df", x, einsum("bd,fd->bf", dy, w2))
  return w - 0.1 * g, w2 - 0.1 * g2
}
"""


def test_sharded_update_reduce_scatters_the_gradient():
    c = compiled(SHARDED_SGD)
    kinds = plan(c)
    # the weights are gathered for the forward pass (ZeRO-3), each gradient scattered into its shard
    # (the two weights' all_gathers combined into one, the two gradients' reduce_scatters too, as
    # XLA's combiners would)
    assert sorted(kinds) == [("all_gather", ("data",)), ("reduce_scatter", ("data",))]
    assert [op.kind for op in c.spmd.program.ops].count("all_gather") == 1
    scatters = [e for e in c.spmd.ledger if e.kind == "reduce_scatter"]
    assert [e.bytes_per_device for e in scatters] == [step_bytes("reduce_scatter", 8, 2 * 16 * 32 * F32)]
    assert "all_reduce" not in [op.kind for op in c.spmd.program.ops]
    assert [op.kind for op in c.spmd.program.ops].count("reduce_scatter") == 1


def test_sharded_adam_state_reduce_scatters_without_shard_annotation():
    # the gradients are not annotated: the sharded m and v pull them onto `data`, so each is
    # scattered, the update runs on a shard, and the replicated new weights are gathered
    src = (PATTERNS / "train_zero.spmd").read_text().replace("shard(einsum", "(einsum").replace(", {data, _})", ")")
    assert "= shard(" not in src
    c = compiled(src, consts={"B": 256, "D": 16, "F": 32})
    assert sorted(plan(c)) == [("all_gather", ("data",)), ("reduce_scatter", ("data",))]
    assert str(c.shardings["g1"]) == "{data, _}" and str(c.shardings["g2"]) == "{data, _}"


def test_hand_written_weight_update_sharding_halves_the_bytes():
    c = compiled(str(PATTERNS / "train_zero.spmd"), consts={"B": 256, "D": 16, "F": 32})
    # one reduce_scatter of both gradients, one all_gather of both new weights (combined)
    assert sorted(plan(c)) == [("all_gather", ("data",)), ("reduce_scatter", ("data",))]
    whole = 16 * 32 * F32
    # reduce_scatter + all_gather of each weight: as much as ONE all_reduce of it, where XLA
    # runs an all_reduce (the same again as the all_gathers) and slices
    assert total_bytes(c) == 2 * (step_bytes("reduce_scatter", 8, whole) + step_bytes("all_gather", 8, whole // 8))
    assert total_bytes(c) == 2 * step_bytes("all_reduce", 8, whole)


SUMMED = """
mesh [data=2, model=4]
func main(h: f32[4, 8, 32] {data, _, _}, dq: f32[4, 8, 32] {data, _, model}, dk: f32[4, 8, 32] {data, _, model},
          dv: f32[4, 8, 32] {data, _, model}, wq: f32[32, 32] {_, model}, wk: f32[32, 32] {_, model},
          wv: f32[32, 32] {_, model}, g: f32[32]) -> (f32[4, 8, 32] {data, _, _}, f32[32, 32] {_, model}) {
  dh = einsum("bse,de->bsd", dq, wq) + einsum("bse,de->bsd", dk, wk) + einsum("bse,de->bsd", dv, wv)
  dn = dh * g
  dx = dn - mean(dn, axis=-1, keepdims=true)
  return dx, wq - 0.1 * einsum("bsd,bse->de", h, dq)
}
"""


def test_summed_input_gradients_are_reduced_once():
    c = compiled(SUMMED)
    model = [e for e in c.spmd.ledger if e.axes == ("model",)]
    # the three pending sums over `model` are added first: one all_reduce of one [4/2, 8, 32]
    assert [e.kind for e in model] == ["all_reduce"]
    assert model[0].bytes_per_device == step_bytes("all_reduce", 4, 2 * 8 * 32 * F32)


def test_transformer_backward_reduces_the_qkv_input_gradients_once():
    c = compiled(str(PATTERNS / "train_transformer_adam.spmd"), consts={"B": 2, "S": 8, "H": 4, "DH": 4, "F": 32})
    # forward attention output, the FFN's and the attention's input gradients (one each, the q, k, v
    # terms summed first), and one combined all_reduce of the weight gradients over `data`
    assert sorted(plan(c)) == [("all_reduce", ("data",))] + [("all_reduce", ("model",))] * 3
    act = step_bytes("all_reduce", 4, 1 * 8 * 16 * F32)  # one [B/2, S, D] activation gradient
    assert [e.bytes_per_device for e in c.spmd.ledger if e.axes == ("model",)] == [act] * 3


# ---------------------------------------------------------------------------------- --shard-weight-updates

ADAM_DP = """
mesh [data=8]
func main(x: f32[256, 16] {data, _}, y: f32[256, 16] {data, _}, w: f32[16, 32] {_, _},
          m: f32[16, 32] {_, _}, v: f32[16, 32] {_, _}, w2: f32[32, 16] {_, _})
    -> (f32[16, 32] {_, _}, f32[16, 32], f32[16, 32], f32[32, 16] {_, _}) {
  h = relu(x @ w)
  dy = h @ w2 - y
  g2 = einsum("bf,bd->fd", h, dy)
  g = einsum("bd,bf->df", x, einsum("bd,fd->bf", dy, w2) * cast(h > 0.0, f32))
  m = 0.9 * m + 0.1 * g
  v = 0.999 * v + 0.001 * g * g
  w = w - 0.01 * m / (sqrt(abs(v)) + 1e-8)
  return w, m, v, transpose(transpose(w2) - 0.1 * transpose(g2))
}
"""


def test_shard_weight_updates_reduce_scatters_then_all_gathers():
    plain = compiled(ADAM_DP)
    c = spmdlang.compile(ADAM_DP, shard_weight_updates="data")
    verify(c.spmd.program)
    assert c.diff(backends=["ref", "sim"])["ok"]
    whole = 16 * 32 * F32
    # without the option: one all_reduce of both whole gradients (combined)
    assert plan(plain) == [("all_reduce", ("data",))]
    assert total_bytes(plain) == step_bytes("all_reduce", 8, 2 * whole)
    # with it, for w: reduce_scatter of its gradient, Adam on a shard, all_gather of the new w;
    # w2's update goes through transposes (not elementwise in w2's layout): left alone
    by_kind = sorted(plan(c))
    assert by_kind == [("all_gather", ("data",)), ("all_reduce", ("data",)), ("reduce_scatter", ("data",))]
    scatter = next(e for e in c.spmd.ledger if e.kind == "reduce_scatter")
    assert scatter.bytes_per_device == step_bytes("reduce_scatter", 8, whole) == step_bytes("all_reduce", 8, whole) / 2
    assert str(c.shardings["m"]) == "{_, data}" and str(c.shardings["v"]) == "{_, data}"
    assert str(c.shardings["g"]) == "{_, data}"
    # one note, naming the weight and its state
    assert [n.message.split(" (")[0] for n in c.pass_notes] == [
        "weight-update sharding over data: the elementwise update of m, v, w"]
    # the update itself runs on a shard: [16, 32/8] per device
    mul_shapes = {op.results[0].type.shape for op in c.spmd.program.ops if op.kind == "sqrt"}
    assert mul_shapes == {(16, 4)}


def test_shard_weight_updates_same_numbers_on_every_backend():
    c = spmdlang.compile(str(PATTERNS / "train_dp_mlp.spmd"), consts={"B": 64, "D": 16, "F": 24},
                         shard_weight_updates="data")
    assert sorted(plan(c)) == [("all_gather", ("data",)), ("reduce_scatter", ("data",))]
    d = c.diff(backends=["ref", "sim", "jax", "xla"])
    assert d["ok"], d["results"]


def test_shard_weight_updates_of_a_step_with_a_loop():
    """A loop's results are leaves of an update's region, as parameters are (the pass looked the
    loop up in the op table: an internal error, found with a struct step over stacked layers)."""
    src = """mesh [data=2, model=2]
const L = 3
func loss(w: f32[L, 8, 8], x: f32[6, 8]) -> f32[] {
  h = x
  loop l in range(L) {
    h = tanh(h @ w[l])
  }
  return mean(h * h)
}
func main(w: f32[L, 8, 8], m: f32[L, 8, 8], x: f32[6, 8] {data, _}) -> (f32[L, 8, 8], f32[L, 8, 8]) {
  g = grad(loss, w, x)
  m = 0.9 * m + g
  return w - 0.1 * m, m
}
"""
    c = spmdlang.compile(src, shard_weight_updates="data")
    assert c.pass_notes and "weight-update sharding over data" in c.pass_notes[0].message
    d = c.diff(backends=["ref", "sim", "jax"])
    assert d["ok"], d["results"]


def test_shard_weight_updates_on_megatron_adds_data_to_the_model_split():
    c = spmdlang.compile(str(PATTERNS / "train_mlp_sgd.spmd"), consts={"B": 64, "D": 16, "F": 32},
                         shard_weight_updates="data")
    assert c.diff(backends=["ref", "sim"])["ok"]
    assert sorted(plan(c)) == [("all_gather", ("data",)), ("all_reduce", ("model",)), ("reduce_scatter", ("data",))]
    assert "{_, (model, data)}" in c.pass_notes[0].message + c.pass_notes[1].message


def test_shard_weight_updates_leaves_sharded_and_non_elementwise_params_alone():
    # w is already split over data (ZeRO-3 style): nothing to do; a params-only forward result is no update
    src = """
mesh [data=4]
func main(x: f32[64, 8] {data, _}, w: f32[8, 8] {data, _}, r: f32[8, 8]) -> (f32[8, 8] {data, _}, f32[64, 8]) {
  g = einsum("bd,be->de", x, x @ w)
  return w - 0.1 * g, x @ r
}
"""
    c = spmdlang.compile(src, shard_weight_updates="data")
    assert c.pass_notes == []
    plain = spmdlang.compile(src)
    assert [op.kind for op in c.canonical.ops] == [op.kind for op in plain.canonical.ops]
    assert plan(c) == plan(plain) and ("reduce_scatter", ("data",)) in plan(c)


def test_shard_weight_updates_cli(tmp_path):
    import json
    import subprocess
    import sys

    path = PATTERNS / "train_dp_mlp.spmd"
    run = lambda *a: subprocess.run([sys.executable, "-m", "spmdlang", *a], capture_output=True, text=True,  # noqa: E731
                                    cwd=ROOT)
    out = run("explain", str(path), "--shard-weight-updates", "data", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert [x["kind"] for x in report["collectives"]].count("reduce_scatter") == 1
    assert len(report["notes"]) == 2 and "reduce-scattered" in report["notes"][0]["message"]
    bad = run("check", str(path), "--shard-weight-updates", "model")
    assert bad.returncode == 2 and "--shard-weight-updates names axis 'model'" in bad.stderr
    assert "--shard-weight-updates" in run("compile", "--help").stdout


def test_shard_weight_updates_follows_a_result_wanted_split():
    # the new weight is wanted split over data on dim 0: the update runs there (no all_gather and
    # no resharding after it), although dim 1 (12 = 4 * 3) would also divide
    src = """
mesh [data=4]
func main(x: f32[64, 8] {data, _}, w: f32[8, 12] {_, _}) -> f32[8, 12] {data, _} {
  g = einsum("bd,be->de", x, x @ w)
  return w - 0.1 * g
}
"""
    c = spmdlang.compile(src, shard_weight_updates="data")
    assert "runs on {data, _}" in c.pass_notes[0].message
    assert plan(c) == [("reduce_scatter", ("data",))]
    assert c.diff(backends=["ref", "sim"])["ok"]


GATHERS = """
mesh [data=4, model=2]
func main(a: f32[8, 6] {data, _}, b: f32[6, 12] {_, data}, c: f32[2, 3, 16] {_, _, data},
          d: f32[10, 4] {data, _}, e: i32[8] {data}, m: f32[6, 8] {model, data})
    -> (f32[8, 6] {_, _}, f32[6, 12] {_, _}, f32[2, 3, 16] {_, _, _}, f32[10, 4] {_, _}, i32[8] {_},
        f32[6, 8] {_, _}) {
  return a * 2.0, b + 1.0, c * c, d - 1.0, e + 1, m * 3.0
}
"""


def test_independent_all_gathers_combine_into_one():
    # the f32 all_gathers over `data` (dims 0, 1 and 2, one padded: 10 rows over 4 shards, one after
    # m's gather over `model`) become ONE all_gather of their concatenation (XLA's all-gather
    # combiner); the i32 one and the one over `model` keep their own (another type, another group)
    c = compiled(GATHERS)
    gathers = [e for e in c.spmd.ledger if e.kind == "all_gather"]
    assert sorted(e.axes for e in gathers) == [("data",), ("data",), ("model",)]
    merged = next(e for e in gathers if e.axes == ("data",) and e.reason.count(" + ") == 4)
    # the bytes are the members' bytes: (k-1) times each local shard
    assert merged.bytes_per_device == 3 * (2 * 6 + 6 * 3 + 2 * 3 * 4 + 3 * 4 + 6 * 2) * F32
    assert [op.kind for op in c.spmd.program.ops].count("all_gather") == 3
    d = c.diff(backends=["ref", "sim", "jax"])
    assert d["ok"], d["results"]


STACKED_GATHERS = """
mesh [data=4]
func main(a: f32[8, 6] {data, _}, b: f32[6, 8] {_, data}, c: f32[2, 3, 8] {_, _, data},
          d: f32[7, 6] {data, _})
    -> (f32[8, 6] {_, _}, f32[6, 8] {_, _}, f32[2, 3, 8] {_, _, _}, f32[7, 6] {_, _}) {
  return a * 2.0, b + 1.0, c * c, d - 1.0
}
"""


def test_all_gathers_of_one_size_combine_stacked():
    # members whose local shards are the same size (12 elements: dims 0, 1 and 2 gathered, d's 7
    # rows padded to 8) are stacked [4, 12] and gathered along dim 1 (row i: member i's shards one
    # after the other), which XLA's CPU backend fuses with the members' producers; one collective,
    # the members' bytes, and every backend equal to the reference
    c = compiled(STACKED_GATHERS)
    (gather,) = [op for op in c.spmd.program.ops if op.kind == "all_gather"]
    assert gather.operands[0].type.shape == (4, 12) and gather.attrs["dim"] == 1
    (entry,) = c.spmd.ledger
    assert entry.bytes_per_device == 3 * 4 * 12 * F32
    d = c.diff(backends=["ref", "sim", "jax"])
    assert d["ok"], d["results"]


# ---------------------------------------------------------------------------------- differentiated programs

PROGRAMS = ROOT / "programs"


def test_autodiff_zero_reduce_scatters_both_gradients_in_one_collective():
    # weight-update sharding by hand on the differentiated step: both weight gradients are local
    # einsums over the local batch settled by ONE reduce_scatter into their shards (not by
    # gathering the batch's activations: that would send fewer bytes here, but adds collectives
    # that the combined reduce_scatter does not), the update is local, the new weights are
    # all_gathered together; the loss rides in the reduce_scatter (8 copies of its partial sum,
    # one per shard's piece: 28 B where an all_reduce of its own sends 7 B, and 14 latency steps
    # fewer). Collectives and bytes <= XLA's (3, 172,039 B: an all_reduce of loss and both whole
    # gradients, 2 all_gathers).
    c = compiled(str(PROGRAMS / "train_zero.spmd"))
    assert sorted(plan(c)) == [("all_gather", ("data",)), ("reduce_scatter", ("data",))]
    whole = 2 * 64 * 128 * F32  # w1 [D, F] and w2 [F, D]
    by_kind = {e.kind: e.bytes_per_device for e in c.spmd.ledger}
    assert by_kind["reduce_scatter"] == step_bytes("reduce_scatter", 8, whole + 8 * F32)
    assert by_kind["all_gather"] == step_bytes("all_gather", 8, whole // 8)
    assert total_bytes(c) <= 172_039
    assert str(c.shardings["g1"]) == "{data, _}" and str(c.shardings["g2"]) == "{data, _}"
    assert "all_reduce" not in [op.kind for op in c.spmd.program.ops]
    d = c.diff(backends=["ref", "sim", "jax", "xla"])  # xla: jax's own autodiff of the step
    assert d["ok"], d["results"]


RIDERS = """
mesh [data=4]
func main(x: f32[18, 8] {data, _}, y: f32[18, 64] {data, _}, n: i32[18] {data})
    -> (f32[8, 8] {data, _}, f32[], f32[8], i32[]) {
  return shard(einsum("bi,bj->ij", x, x), {data, _}), sum(x), sum(x, axis=0), sum(n)
}
"""


def test_small_all_reduces_ride_in_a_reduce_scatter_of_the_group():
    # the einsum over the split batch is a pending sum settled into its shard by a reduce_scatter;
    # the two small f32 sums (a scalar and 8 values: their 4 copies add 72 B, within the 6 latency
    # steps an all_reduce of their own costs at 16 B a step) ride in it, each broadcast to the 4
    # chunks so that every shard's piece is the whole sum; the i32 sum (another element type)
    # keeps its all_reduce. 18 rows over 4 shards: uneven, padded.
    c = compiled(RIDERS)
    assert sorted(plan(c)) == [("all_reduce", ("data",)), ("reduce_scatter", ("data",))]
    (rs,) = [e for e in c.spmd.ledger if e.kind == "reduce_scatter"]
    assert rs.bytes_per_device == step_bytes("reduce_scatter", 4, (8 * 8 + 4 * 1 + 4 * 8) * F32)
    (ar,) = [e for e in c.spmd.ledger if e.kind == "all_reduce"]
    assert ar.bytes_per_device == step_bytes("all_reduce", 4, F32)
    d = c.diff(backends=["ref", "sim", "jax", "xla"])
    assert d["ok"], d["results"]
    # hostile values: NaN and infinities in the rows stay where a sum puts them
    x = np.arange(18 * 8, dtype=np.float32).reshape(18, 8) / 7
    x[3, 2], x[17, 5], x[9, 0] = np.nan, np.inf, -np.inf
    inputs = {"x": x, "y": np.ones((18, 64), np.float32), "n": np.arange(18, dtype=np.int32)}
    d = c.diff(backends=["ref", "sim", "jax", "xla"], inputs=inputs)
    assert d["ok"], d["results"]


def test_an_all_reduce_rides_only_when_its_whole_group_is_small():
    # with a 256 B sum in the same combined all_reduce, the group keeps its collective (moving
    # only the small sums into the reduce_scatter would add their bytes and save no latency)
    src = RIDERS.replace("-> (f32[8, 8] {data, _}, f32[], f32[8], i32[])",
                         "-> (f32[8, 8] {data, _}, f32[], f32[8], i32[], f32[64])").replace(
        "sum(n)\n", "sum(n), sum(y, axis=0)\n")
    c = compiled(src)
    assert sorted(plan(c)) == [("all_reduce", ("data",)), ("all_reduce", ("data",)), ("reduce_scatter", ("data",))]
    (rs,) = [e for e in c.spmd.ledger if e.kind == "reduce_scatter"]
    assert rs.bytes_per_device == step_bytes("reduce_scatter", 4, 8 * 8 * F32)
    assert c.diff(backends=["ref", "sim", "jax"])["ok"]


def test_autodiff_data_parallel_step_is_one_all_reduce_at_a_small_batch():
    # pure data parallelism with 8 examples per device: the weight gradients are settled by the
    # all_reduce that the loss needs anyway (one collective, as XLA), not by gathering activations
    for consts in ({}, {"B": 4, "D": 16, "F": 32}):
        c = compiled(str(PROGRAMS / "train_mlp.spmd"), mesh={"data": 8, "model": 1}, consts=consts)
        assert plan(c) == [("all_reduce", ("data",))], consts


def test_autodiff_transformer_sums_the_qkv_input_gradients_before_reducing():
    # with a layer-norm gain differentiated, the gradient flowing into the first layer norm is
    # needed: the q, k and v input gradients (each a pending sum over `model`) are added first and
    # reduced by one all_reduce of one activation, as is the FFN's input gradient
    src = (PROGRAMS / "train_transformer.spmd").read_text()
    src = src.replace("l, g = value_and_grad(loss, w, x, y, ln)",
                      "l, g, gl = value_and_grad(loss, w, x, y, ln, argnums=[0, 3])").replace(
        "  return l, w, m, v", "  return l + 0.0 * sum(gl.ln1_g), w, m, v")
    assert "gl = value_and_grad" in src and "sum(gl.ln1_g)" in src
    c = compiled(src)
    act = step_bytes("all_reduce", 4, 8 // 2 * 16 * 128 * F32)  # one [B/2, S, D] activation
    backward = [e for e in c.spmd.ledger if e.axes == ("model",) and e.backward]
    assert [e.bytes_per_device for e in backward] == [act, act]
    # the summed q, k, v input gradient is the cotangent of the layer norm's output h: d_h (an add)
    assert any(e.reason.startswith("%d_h ") for e in backward), [e.reason for e in backward]


def test_vocab_parallel_cross_entropy_reduces_over_vocab_only_where_the_forward_must():
    # Megatron's vocab-parallel loss, trained, on an uneven vocabulary (30 over 4): the max, then
    # the sum of exponentials with the target logit (combined), over `vocab`; the backward pass
    # reduces over `vocab` only the hidden state's gradient (logsumexp's shift is under
    # stop_gradient, as in jax: no sum of softmax for d(max)), and the loss and weight gradients
    # over `data` in one all_reduce. 4 all_reduces (XLA's GSPMD: 5); 5 before the stop_gradient.
    consts = {"B": 2, "S": 4, "V": 30, "D": 8}
    c = compiled(str(PATTERNS / "train_vocab_ce.spmd"), consts=consts)
    d = c.diff(backends=["ref", "jax", "xla"])  # xla: the gradients of jax.value_and_grad
    assert d["ok"], d["results"]
    assert plan(c) == [("all_reduce", ("vocab",))] * 3 + [("all_reduce", ("data",))], plan(c)
    vocab = [e for e in c.spmd.ledger if e.axes == ("vocab",)]
    assert [e.reduce for e in vocab] == ["max", "sum", "sum"]
    rows = 2 // 2 * 4  # [B/2, S] per device
    assert [e.bytes_per_device for e in vocab] == [step_bytes("all_reduce", 4, rows * F32),
                                                   step_bytes("all_reduce", 4, 2 * rows * F32),
                                                   step_bytes("all_reduce", 4, rows * 8 * F32)]
    assert not any(e.backward and "reduce_sum" in e.reason for e in vocab), [e.reason for e in vocab]


def test_tied_embedding_training_has_no_backward_sum_over_vocab_of_the_softmax():
    c = compiled(str(PROGRAMS / "train_embedding.spmd"), consts={"B": 4, "S": 8, "V": 62, "D": 16})
    backward_rows = [e for e in c.spmd.ledger if e.axes == ("vocab",) and e.backward is True
                     and "reduce_sum result" in e.reason]
    assert not backward_rows, [e.reason for e in backward_rows]
    assert len(c.spmd.ledger) == 5, plan(c)
