"""The simulator's validation on one GPU (issue 30 section 3): bench/validate_sim.py
--device cuda, and the pure parts it rests on.

On CPU: the script's no-GPU line and exit status (a subprocess), places sharing one GPU
in the engine (their kernels take turns on the device; their all-reduce is
``LocalCollective``'s, on ``Cluster.local_sum``), the layouts that allow it, and the
one-GPU cluster built from measured parts. Nothing is timed: profiles and clusters are
hand-made. On a GPU (``cuda``): one short round of the real validation.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import ssaexec as se
from ssaexec import sim
from ssaexec.graph.ssa import AllReduceOpHandle
from ssaexec.sim import Cluster, Device, Host, Link, OpCost, Profile, op_key
from ssaexec.sim.engine import simulate_step

US = 1e-6
REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "validate_sim.py"


def _run_script(*args, timeout=120):
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU path needs a machine "
                                                      "without a GPU")
def test_without_a_gpu_it_says_so_on_one_line_and_exits_0(tmp_path):
    out = tmp_path / "sim.json"
    r = _run_script("--device", "cuda", "--rounds", "1", "--json", str(out))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 1, r.stdout
    assert "skipped" in lines[0] and "no GPU" in lines[0] and "--device cuda" in lines[0]
    assert not out.exists()  # nothing measured, nothing written


# --- places sharing one GPU in the engine ----------------------------------------------------

def _mlp():
    main, startup = se.Program(), se.Program()
    with se.program_guard(main, startup):
        x = se.layers.data("x", shape=[-1, 8], dtype="float32")
        y = se.layers.data("y", shape=[-1, 1], dtype="float32")
        h = se.layers.fc(x, size=8, act="relu")
        loss = se.layers.mean(se.layers.square_error_cost(se.layers.fc(h, size=1), y))
        se.optimizer.SGD(0.1).minimize(loss)
    return main


def _profile(program, device_s, host_s=0.0):
    g = se.build_ssa_graph(program, [se.CUDAPlace(0)])
    return Profile({op_key(h): OpCost(device_s, host_s) for h in g.ops
                    if not h.is_collective}, batch=4, device="gpu")


def _gpu(gpus=2, local_sum=(0.0, 1e18), op_s=0.0, link=Link(1e18, 0.0)):
    # launches free, collectives free unless asked: the kernels bound the step
    return Cluster("one-gpu", gpus, Device("gpu", "test", mem_bw=1e12, kernel_min=0.0),
                   Host(op_s=op_s, gil_fraction=0.0, hop_s=0.0, step_s=0.0, node_s=0.0),
                   link, link, local_sum=local_sum)


def test_two_places_on_one_gpu_take_twice_one_places_device_time():
    main = _mlp()
    profile = _profile(main, 100 * US)  # compute-bound: every kernel 100 us, launches free
    c = _gpu()
    one = sim.predict(main, profile, c, 1, "process-per-node", exposed=False)
    shared = sim.predict(main, profile, c, 2, "process-per-node", exposed=False,
                         places_per_device=2)
    own = sim.predict(main, profile, c, 2, "process-per-node", exposed=False)
    assert shared.places == 2 and shared.processes == 1
    assert shared.step_s == pytest.approx(2 * one.step_s, rel=0.05)
    # the same two places on GPUs of their own run side by side
    assert own.step_s == pytest.approx(one.step_s, rel=0.05)
    assert shared.result.critical_summary()["device"] > 0.9 * shared.step_s


def test_the_places_of_a_shared_gpu_are_cuda_0_0():
    main = _mlp()
    from ssaexec.sim.predict import build_graph
    g = build_graph(main, _gpu(gpus=1), 2, 1, places_per_device=2)
    assert [(p.index, p.device_index) for p in g.places] == [(0, 0), (1, 0)]
    # a graph built on parse_places("cuda:0,0")-like places is replayed the same way
    profile = _profile(main, 50 * US)
    alone = simulate_step(se.build_ssa_graph(main, [se.CUDAPlace(0)]), profile, _gpu())
    r = simulate_step(se.build_ssa_graph(main, [se.CUDAPlace(0, 0), se.CUDAPlace(1, 0)]),
                      profile, _gpu())
    assert r.step_s == pytest.approx(2 * alone.step_s, rel=0.05)


def test_a_shared_gpu_all_reduces_with_local_collective_costs():
    main = _mlp()
    profile = _profile(main, 1 * US)
    places = [se.CUDAPlace(0, 0), se.CUDAPlace(1, 0)]
    graph = se.build_ssa_graph(main, places)
    n = sum(isinstance(h, AllReduceOpHandle) for h in graph.ops)
    assert n > 0
    free = simulate_step(graph, profile, _gpu(local_sum=(0.0, 1e18))).step_s
    # 1 ms per all-reduce of 2 places ((P-1)·α): they queue on the communication stream
    slow = simulate_step(graph, profile, _gpu(local_sum=(1e-3, 1e18))).step_s
    assert slow - free >= n * 1e-3 * 0.99
    # places on GPUs of their own all-reduce with NCCL's model on the links instead
    own = se.build_ssa_graph(main, [se.CUDAPlace(0), se.CUDAPlace(1)])
    nccl = simulate_step(own, profile, _gpu(local_sum=(1e-3, 1e18)))
    assert nccl.step_s < free + 1e-3


def test_only_one_process_can_share_a_gpu_in_a_prediction():
    main = _mlp()
    profile = _profile(main, 10 * US)
    with pytest.raises(ValueError, match="process-per-node"):
        sim.predict(main, profile, _gpu(), 2, "process-per-gpu", places_per_device=2)
    cpu = _gpu().replace(device=Device("cpu", "test"))
    with pytest.raises(ValueError, match="GPU cluster"):
        sim.predict(main, profile, cpu, 2, "process-per-node", places_per_device=2)


def test_a_one_gpu_cluster_from_measured_parts():
    from ssaexec.sim.calibrate import gpu_cluster
    host = dict(op_s=7 * US, gil_fraction=0.5, hop_s=30 * US, step_s=80 * US,
                readable_extra_s=2 * US, speedup={})
    # device time of LocalCollective.all_reduce on one GPU: (P-1)·(α + S/B)
    local = [(p, s, (p - 1) * (6 * US + s / 900e9)) for p in (2, 4)
             for s in (1 << 10, 1 << 20, 1 << 22)]
    device = {"name": "a GPU", "kernel_min": 2 * US, "mem_bw": 3e12, "flops": 50e12,
              "tf32": False}
    c = gpu_cluster(host, local, device)
    assert c.device.is_gpu and c.device.name == "a GPU" and c.gpus_per_node == 1
    assert c.device.kernel_min == 2 * US and c.device.mem_bw == 3e12
    assert c.host.op_s == 7 * US and c.host.step_s == 80 * US and c.host.gil_fraction == 0.5
    alpha, bw = c.local_sum
    assert alpha == pytest.approx(6 * US) and bw == pytest.approx(900e9)
    assert Cluster.from_dict(json.loads(json.dumps(c.to_dict()))) == c


# --- on a GPU ----------------------------------------------------------------------------------

@pytest.mark.cuda
def test_one_short_round_on_the_gpu(tmp_path):
    out = tmp_path / "sim.json"
    r = _run_script("--device", "cuda", "--rounds", "1", "--steps", "3", "--warmup", "2",
                    "--profile-steps", "2", "--batch", "128", "--json", str(out), timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads(out.read_text())
    rows = data["summary"]
    assert [s["config"] for s in rows] == ["1 place", "2 places on one GPU"]
    for s in rows:
        assert s["predicted_ms"] > 0 and s["measured_ms"] > 0
    cluster = data["rounds"][0]["cluster"]
    assert cluster["device"]["kind"] == "gpu" and cluster["local_sum"] is not None
    assert data["rounds"][0]["device"]["mem_bw"] > 0
