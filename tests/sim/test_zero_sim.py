"""The simulator under ZeRO (issue 49): the all-gather and reduce-scatter cost models, the
stage-3 step with its gathers, frees and prefetch, and Llama 3.1 8B against torchtitan's
published FSDP2 figures (the bound docs/simulator.md states).

Nothing is timed for real: every figure is a deterministic prediction.
"""

import pytest

import ssaexec as se
from ssaexec import sim
from ssaexec.graph.handles import AllGatherOpHandle, FreeOpHandle, ReduceScatterOpHandle
from ssaexec.sim import comm_cost
from ssaexec.sim.costs import wire_bytes
from ssaexec.sim.llama import (LLAMA3_8B, TORCHTITAN, build_llama, flops_per_token,
                               llama_profile, parameter_count, predict_tokens)
from ssaexec.sim.predict import build_graph

EXAMPLES = __import__("pathlib").Path(__file__).resolve().parents[2] / "examples"
H100 = sim.PRESETS["dgx-h100"]


# --- cost models ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["all_gather", "reduce_scatter"])
@pytest.mark.parametrize("ranks", [2, 8, 64])
def test_ring_gather_and_scatter_closed_forms(name, ranks):
    size = 64 << 20
    nodes, g = H100.layout(ranks)
    bw = H100.intra.bus if nodes == 1 else min(H100.intra.bus, H100.inter.bus)
    lat = (ranks - 1 - (nodes - 1)) * H100.intra.latency + (nodes - 1) * H100.inter.latency
    t, algo = sim.collective_time(H100, name, size, ranks, "ring")
    assert algo == "ring"
    assert t == pytest.approx(H100.collective_launch + lat + (ranks - 1) / ranks * size / bw,
                              rel=1e-12)


def test_a_gather_and_a_scatter_cost_one_ring_all_reduce():
    size, n = 256 << 20, 8
    ag = sim.collective_time(H100, "all_gather", size, n, "ring")[0]
    rs = sim.collective_time(H100, "reduce_scatter", size, n, "ring")[0]
    ar = sim.collective_time(H100, "all_reduce", size, n, "ring")[0]
    assert ag + rs == pytest.approx(ar + H100.collective_launch, rel=1e-12)


def test_the_handles_name_their_models():
    gather = AllGatherOpHandle(["w"], ["w@SHARD"], [[4, 4]])
    scatter = ReduceScatterOpHandle(["w@GRAD"], ["w@GRAD@SHARD"])
    assert isinstance(comm_cost.cost_model(gather), comm_cost.AllGather)
    assert isinstance(comm_cost.cost_model(scatter), comm_cost.ReduceScatter)
    assert sim.op_key(FreeOpHandle(["w"], se.CPUPlace(0), 0)) == "free"


# --- the stage-3 step ---------------------------------------------------------------------------

def _mlp():
    prog = se.load_program(str(EXAMPLES / "mnist_mlp.json"))
    return prog, sim.Profile.estimate(prog, 32, H100.device)


@pytest.mark.parametrize("gather_dtype,reshard,factor", [
    (None, True, 2.0), ("bf16", True, 1.0), (None, False, 1.0)])
def test_the_gathers_move_what_the_strategy_says(gather_dtype, reshard, factor):
    prog, _ = _mlp()
    params = sum(v.numel * 4 for v in prog.all_parameters())
    bs = se.BuildStrategy(zero_stage=3, zero_gather_dtype=gather_dtype,
                          reshard_after_forward=reshard)
    graph = build_graph(prog, H100, 1, 8, bs)
    gathers = graph.ops_of_kind(AllGatherOpHandle)
    scatters = graph.ops_of_kind(ReduceScatterOpHandle)
    # forward and backward gathers of every parameter (bf16: half the bytes), or one
    # gather kept through backward; one reduce-scatter of every gradient, in fp32
    assert sum(wire_bytes(h, graph.program) for h in gathers) == factor * params
    assert sum(wire_bytes(h, graph.program) for h in scatters) == params
    assert graph.ops_of_kind(FreeOpHandle)


def test_the_stage_3_step_replays_every_collective_and_prices_shard_updates():
    prog, profile = _mlp()
    bs = se.BuildStrategy(zero_stage=3)
    p = sim.predict(prog, profile, H100, 8, "process-per-gpu", bs)
    graph = build_graph(prog, H100, 1, 8, bs, cache=None)
    rings = len(graph.ops_of_kind(AllGatherOpHandle)) + \
        len(graph.ops_of_kind(ReduceScatterOpHandle))
    assert sum(p.result.algorithms.values()) == rings
    # the updates on shards are the profiled ones, scaled, not a median stand-in
    assert not any("not in the profile" in n for n in p.notes)
    assert 0 < p.comm_exposed_s < p.step_s


def test_prefetch_hides_gathers_and_costs_gathered_memory():
    cluster = sim.get_cluster("grand-teton-h100")
    model = build_llama(**dict(LLAMA3_8B, layers=2), seq_len=2048)
    profile = llama_profile(model, 2, cluster.device)
    rows = [predict_tokens(128, cluster, model=model, profile=profile, prefetch=k)
            for k in (0, 1, 2)]
    exposed = [r["prediction"].comm_exposed_s for r in rows]
    gathered = [r["memory"].parts["gathered"] for r in rows]
    assert exposed[0] > exposed[1] > exposed[2] > 0
    assert gathered[0] <= gathered[1] <= gathered[2]


# --- Llama 3.1 8B against torchtitan ------------------------------------------------------------

def test_the_8b_shape():
    assert parameter_count(**LLAMA3_8B) == 8_030_261_248  # Llama 3.1 8B's 8.03B
    model = build_llama(**dict(LLAMA3_8B, layers=1))
    n = sum(v.numel for v in model.main.all_parameters())
    assert n == parameter_count(**dict(LLAMA3_8B, layers=1))


# docs/simulator.md, "Llama 3.1 8B on H100s against torchtitan": the bound the comparison
# is held to. The goal is 15 %; the eager figures miss it (the documented gap), the
# compiled ones meet it. The errors below are the table's, to the point.
DOCUMENTED = {"llama3-8b-fsdp-8": 0.211, "llama3-8b-fsdp-compile-8": 0.046}
GOAL = 0.15


def test_llama_8b_on_8_h100s_against_torchtitan():
    rows = {r["id"]: r for r in TORCHTITAN["rows"]}
    r = predict_tokens(8, "grand-teton-h100", batch=TORCHTITAN["batch"],
                       seq_len=TORCHTITAN["seq_len"], ac=TORCHTITAN["ac"])
    tps = r["tokens_per_sec_per_gpu"]
    for rid, documented in DOCUMENTED.items():
        error = tps / rows[rid]["tps_per_gpu"] - 1
        assert error == pytest.approx(documented, abs=0.005), rid
    assert abs(tps / rows["llama3-8b-fsdp-compile-8"]["tps_per_gpu"] - 1) <= GOAL
    assert tps / rows["llama3-8b-fsdp-8"]["tps_per_gpu"] - 1 > GOAL  # the documented gap
    # the prediction in torchtitan's MFU accounting (its FLOPs per token over the SXM
    # peak): above the published 33 % (eager) to 39 % (compiled), as the documented
    # gap says, and below half the peak
    mfu = tps * flops_per_token(r["model"]) / 989.4e12
    assert 0.39 < mfu < 0.5
    m = r["memory"]
    # sharded fp32 parameters, gradients and Adam state: 16 bytes x 8.03B / 8
    assert m.parts["parameters"] + m.parts["optimizer_state"] == pytest.approx(
        12 * parameter_count(**LLAMA3_8B) / 8, rel=0.001)
    assert m.peak_bytes < rows["llama3-8b-fsdp-8"]["memory_gib"] * 2**30


def test_simulate_zero_3_reports_the_memory_stats_reports(capsys):
    import json

    from ssaexec.cli import main as cli_main
    from ssaexec.sim.memory import predict_memory
    path = str(EXAMPLES / "mnist_mlp.json")
    assert cli_main(["simulate", path, "--gpus", "8", "--zero", "3", "--zero-gather-dtype",
                     "bf16", "--layout", "process-per-gpu", "--cuda-graph", "off",
                     "--no-plot", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    memory = doc["memory"]["8"]
    expect = predict_memory(se.load_program(path), 8, 3, batch=32, gather_dtype="bf16")
    assert memory["bytes"] == expect.parts and memory["world"] == 8


def test_a_shared_cache_keeps_one_graph_per_world_under_zero():
    prog, profile = _mlp()
    bs = se.BuildStrategy(zero_stage=3)
    cache = {}
    shared = [sim.predict(prog, profile, H100, n, "process-per-gpu", bs, cache=cache).step_s
              for n in (8, 64)]
    alone = [sim.predict(prog, profile, H100, n, "process-per-gpu", bs).step_s for n in (8, 64)]
    assert shared == alone
