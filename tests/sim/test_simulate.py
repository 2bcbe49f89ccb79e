"""The scaling simulator (ssaexec.sim): α-β closed forms, a graph whose critical path is
known by hand, the GIL, CUDA-graph replay, profiles, and the CLI.

Everything here is fast: graphs are tiny or built once, nothing is timed for real
(bench/validate_sim.py measures and compares; docs/simulator.md has its table).
"""

import math

import pytest

import ssaexec as se
from ssaexec import sim
from ssaexec.sim import Cluster, Device, Host, Link, OpCost, Profile, op_key
from ssaexec.sim.engine import simulate_step
from ssaexec.sim.efficiency import op_class

US = 1e-6


# --- α-β closed forms ----------------------------------------------------------------------

@pytest.mark.parametrize("n", [2, 3, 8, 64, 1000])
@pytest.mark.parametrize("size", [1 << 10, 25 << 20])
def test_ring_all_reduce_closed_form(n, size):
    alpha, bw = 5 * US, 100e9
    expect = 2 * (n - 1) / n * size / bw + 2 * (n - 1) * alpha
    assert sim.ring_all_reduce(size, n, alpha, bw) == pytest.approx(expect, rel=1e-12)
    assert sim.ring_reduce(size, n, alpha, bw) == pytest.approx(expect / 2, rel=1e-12)
    assert sim.ring_broadcast(size, n, alpha, bw) == pytest.approx(expect / 2, rel=1e-12)
    assert sim.tree_all_reduce(size, n, alpha, bw) == pytest.approx(
        2 * math.ceil(math.log2(n)) * alpha + 2 * size / bw, rel=1e-12)


def test_one_rank_costs_nothing():
    assert sim.ring_all_reduce(1 << 20, 1, 1.0, 1.0) == 0.0
    assert sim.collective_time(sim.PRESETS["dgx-h100"], "all_reduce", 1 << 20, 1) == (0.0,
                                                                                       "none")


def _flat(gpus_per_node=8, intra=(100e9, 2 * US), inter=(400e9, 5 * US), launch=0.0):
    return Cluster("test", gpus_per_node, Device("gpu", "test", mem_bw=1e12),
                   Host(op_s=0.0, hop_s=0.0, step_s=0.0, node_s=0.0),
                   Link(*intra), Link(*inter), collective_launch=launch)


def test_collective_time_composes_the_closed_forms():
    c = _flat(launch=10 * US)
    s = 64 << 20
    # one node: the ring over the intra-node links, plus the launch latency
    t, algo = sim.collective_time(c, "all_reduce", s, 8, "ring")
    assert algo == "ring"
    assert t == pytest.approx(10 * US + sim.ring_all_reduce(s, 8, 2 * US, 100e9))
    # 4 nodes of 8, hierarchical: reduce-scatter and all-gather in the node, a ring of the
    # 1/8 shards over the nodes, each rank on 1/8 of the node's network bandwidth
    t, _ = sim.collective_time(c, "all_reduce", s, 32, "hierarchical")
    intra = 2 * (7 * 2 * US + 7 / 8 * s / 100e9)
    inter = sim.ring_all_reduce(s / 8, 4, 5 * US, 400e9 / 8)
    assert t == pytest.approx(10 * US + intra + inter)
    # a flat ring over nodes: intra-node steps at the intra latency, the 2(n-1) steps that
    # cross nodes at the network's, the slower link's bandwidth
    t, _ = sim.collective_time(c, "all_reduce", s, 32, "ring")
    assert t == pytest.approx(10 * US + 2 * 28 * 2 * US + 2 * 3 * 5 * US
                              + 2 * 31 / 32 * s / 100e9)
    # auto is the fastest; reduce and broadcast are rings
    auto, _ = sim.collective_time(c, "all_reduce", s, 32)
    assert auto == min(sim.collective_time(c, "all_reduce", s, 32, a)[0]
                       for a in ("ring", "tree", "hierarchical"))
    t, algo = sim.collective_time(c, "reduce", s, 8)
    assert (t, algo) == (pytest.approx(10 * US + sim.ring_reduce(s, 8, 2 * US, 100e9)), "ring")


def test_small_messages_prefer_trees_large_ones_rings():
    c = sim.PRESETS["dgx-h100"]
    assert sim.collective_time(c, "all_reduce", 4 << 10, 1024)[1] != "ring"
    assert sim.collective_time(c, "all_reduce", 1 << 30, 8)[1] == "ring"


def test_presets_name_their_sources_and_round_trip():
    for name, c in sim.PRESETS.items():
        assert c.sources and c.description
        assert Cluster.from_dict(c.to_dict()) == c
    h100 = sim.PRESETS["dgx-h100"]
    assert h100.intra.bandwidth == 450e9 and h100.inter.bandwidth == 8 * 50e9
    with pytest.raises(se.SSAExecError, match="unknown cluster"):
        sim.get_cluster("no-such-cluster")


# --- a tiny graph with a known critical path -------------------------------------------------

def _diamond():
    """x -> a = scale(x) (10 us) and b = relu(x) (30 us) side by side -> c = a + b (5 us)
    -> mean(c) (1 us): the longest path is relu, add, mean = 36 us; all ops 46 us."""
    main, startup = se.Program(), se.Program()
    with se.program_guard(main, startup):
        x = se.layers.data("x", shape=[-1, 4], dtype="float32")
        a = se.layers.scale(x, 2.0)
        b = se.layers.relu(x)
        c = se.layers.elementwise_add(a, b)
        se.layers.mean(c)
    graph = se.build_ssa_graph(main, [se.CPUPlace(0)])
    cost = {"scale": 10, "relu": 30, "elementwise_add": 5, "mean": 1}
    profile = Profile({op_key(h): OpCost(cost[h.op_type] * US, 0.0) for h in graph.ops},
                      batch=1, device="cpu", threads=1)
    return main, graph, profile


def _cpu(cores=8, **host):
    h = dict(cores=cores, op_s=0.0, hop_s=0.0, step_s=0.0, node_s=0.0, gil_fraction=1.0)
    h.update(host)
    return Cluster("cpu-test", 1024, Device("cpu", "test"), Host(**h), Link(1e9, 0.0),
                   Link(1e9, 0.0), local_sum=(0.0, 1e9))


def test_critical_path_of_a_hand_made_graph():
    main, graph, profile = _diamond()
    # readable path, 4 threads on 8 cores: scale and relu run side by side
    r = simulate_step(graph, profile, _cpu(), compiled=False, threads=4)
    assert r.step_s == pytest.approx(36 * US)
    assert [a.label.split("#")[0] for a in r.critical] == ["relu", "elementwise_add", "mean"]
    assert r.critical_summary() == {"device": pytest.approx(36 * US)}
    # one thread, or the compiled path (one segment): everything in a row
    assert simulate_step(graph, profile, _cpu(), compiled=False, inline=True).step_s == \
        pytest.approx(46 * US)
    _, graph2, _ = _diamond()
    assert simulate_step(graph2, profile, _cpu()).step_s == pytest.approx(46 * US)


def test_hand_offs_and_cores_are_charged():
    _, graph, profile = _diamond()
    # one core: the two branches cannot overlap
    assert simulate_step(graph, profile, _cpu(cores=1), compiled=False, threads=4).step_s == \
        pytest.approx(46 * US)
    # a queued node starts hop_s after it was queued: scale or relu goes through the queue
    _, graph, _ = _diamond()
    r = simulate_step(graph, profile, _cpu(hop_s=50 * US), compiled=False, threads=4)
    assert r.step_s == pytest.approx(50 * US + 30 * US + 6 * US)
    assert "hop" in r.critical_summary()
    # waking the worker needs a core: on one core it waits for scale (10 us) to end
    _, graph, _ = _diamond()
    r = simulate_step(graph, profile, _cpu(cores=1, hop_s=50 * US), compiled=False, threads=4)
    assert r.step_s == pytest.approx(10 * US + 50 * US + 30 * US + 6 * US)


# --- the GIL, processes and CUDA graphs ------------------------------------------------------

def _mlp():
    main, startup = se.Program(), se.Program()
    with se.program_guard(main, startup):
        x = se.layers.data("x", shape=[-1, 8], dtype="float32")
        y = se.layers.data("y", shape=[-1, 1], dtype="float32")
        h = se.layers.fc(x, size=8, act="relu")
        loss = se.layers.mean(se.layers.square_error_cost(se.layers.fc(h, size=1), y))
        se.optimizer.SGD(0.1).minimize(loss)
    return main


def _host_bound_gpu(gil=1.0):
    # launches take 10 us, kernels 1 us, the network is free: the host bounds the step
    return Cluster("host-bound", 8, Device("gpu", "test", mem_bw=1e12, kernel_min=1 * US),
                   Host(op_s=10 * US, gil_fraction=gil, hop_s=0.0, step_s=0.0, node_s=0.0,
                        graph_launch_s=5 * US),
                   Link(1e18, 0.0), Link(1e18, 0.0))


def _uniform_profile(program, device_s):
    g = se.build_ssa_graph(program, [se.CUDAPlace(0)])
    return Profile({op_key(h): OpCost(device_s) for h in g.ops if not h.is_collective},
                   batch=4, device="gpu")


def test_the_gil_serialises_the_places_of_one_process():
    main = _mlp()
    profile = _uniform_profile(main, 1 * US)
    c = _host_bound_gpu()
    one = sim.predict(main, profile, c, 1, exposed=False)
    ops = one.step_s / (10 * US)
    assert ops == pytest.approx(round(ops), abs=0.5)  # host launches only
    unfused = se.BuildStrategy(fuse_all_reduce_ops=False)  # the same graph in both layouts
    per_node = sim.predict(main, profile, c, 4, "process-per-node", unfused, exposed=False)
    per_gpu = sim.predict(main, profile, c, 4, "process-per-gpu", unfused, exposed=False)
    # a process per GPU launches its own place: about one place's step (plus its
    # all-reduces' launches)
    assert one.step_s < per_gpu.step_s < 1.5 * one.step_s
    # one process launches for 4 places through one GIL: ~4x the host time
    assert per_node.step_s == pytest.approx(4 * per_gpu.step_s, rel=0.1)
    assert per_node.result.critical_summary().get("gil", 0) > 0.5 * per_node.step_s
    # without the GIL (launches release it), 4 threads launch side by side again
    free = sim.predict(main, profile, _host_bound_gpu(gil=0.0), 4, "process-per-node",
                       unfused, exposed=False)
    assert free.step_s < 0.5 * per_node.step_s


def test_cuda_graph_replay_removes_the_host_time():
    main = _mlp()
    profile = _uniform_profile(main, 1 * US)
    c = _host_bound_gpu()
    plain = sim.predict(main, profile, c, 4, "process-per-node", exposed=False)
    replay = sim.predict(main, profile, c, 4, "process-per-node", cuda_graph=True,
                         exposed=False)
    # 4 graph launches under the GIL, then one place's kernels (1 us each) in a row
    kernels = sum(1 for h in se.build_ssa_graph(main, [se.CUDAPlace(0)]).ops
                  if not h.is_collective and h.kind != "fetch")
    assert replay.step_s < 0.2 * plain.step_s
    assert replay.step_s <= 4 * 5 * US + (kernels + 2) * 1 * US + 1e-12


def test_communication_shows_in_the_prediction():
    main = _mlp()
    profile = _uniform_profile(main, 50 * US)
    slow = _flat(intra=(1e6, 100 * US), inter=(1e6, 100 * US))
    unfused = se.BuildStrategy(fuse_all_reduce_ops=False)
    p = sim.predict(main, profile, slow, 8, "process-per-gpu", unfused)
    assert p.comm_exposed_s > 0 and p.result.critical_summary().get("comm", 0) > 0
    fused = se.BuildStrategy(fuse_all_reduce_ops=True)
    q = sim.predict(main, profile, slow, 8, "process-per-gpu", fused)
    assert q.step_s < p.step_s  # one bucket: one latency instead of four
    # across processes the executor buckets by default, and so does the prediction
    assert sim.predict(main, profile, slow, 8, "process-per-gpu").step_s == \
        pytest.approx(q.step_s)
    bf16 = se.BuildStrategy(fuse_all_reduce_ops=True, allreduce_dtype="bf16")
    assert sim.predict(main, profile, slow, 8, "process-per-gpu", bf16).step_s < q.step_s
    acc = se.BuildStrategy(gradient_accumulation_steps=4, fuse_all_reduce_ops=False)
    a = sim.predict(main, profile, slow, 8, "process-per-gpu", acc)
    assert a.images_per_sec > p.images_per_sec  # communication every 4th micro-batch


def test_scaling_and_bucket_sweep():
    main = _mlp()
    profile = _uniform_profile(main, 20 * US)
    rows = sim.scaling(main, profile, "dgx-h100" and sim.PRESETS["dgx-h100"], [1, 8, 64],
                       layouts=("process-per-gpu",), cuda_graphs=(False,))
    assert [r.ranks for r in rows] == [1, 8, 64]
    assert rows[0].efficiency == pytest.approx(1.0)
    assert all(0 < r.efficiency <= 1.0 + 1e-9 for r in rows)
    sweep = sim.sweep_bucket_mb(main, profile, sim.PRESETS["dgx-h100"], 64, sizes=(1, 25))
    assert [mb for mb, _ in sweep] == [None, 1, 25]


# --- profiles --------------------------------------------------------------------------------

def test_profile_from_a_trace_and_measured(tmp_path):
    from ssaexec.execution.step_trace import trace_steps
    import torch
    main = _mlp()
    startup = se.program.defaults.default_startup(main)[0]
    loss = se.program.defaults.loss_var(main)
    pe = se.ParallelExecutor(places=[se.CPUPlace(0)], main_program=main,
                             startup_program=startup, loss_name=loss, scope=se.Scope(),
                             exec_strategy=se.ExecutionStrategy(num_threads=1))
    feed = {"x": torch.randn(4, 8), "y": torch.randn(4, 1)}
    try:
        res = trace_steps(pe, feed, [loss], 2)
    finally:
        pe.close()
    doc = res.to_chrome({"batch": 4})
    prof = Profile.from_trace(doc, readable_extra_s=0.0)
    graph = se.build_ssa_graph(main, [se.CPUPlace(0)], fetch_list=[loss])
    computes = [h for h in graph.ops if h.kind == "compute"]
    assert all(prof.cost(h) is not None for h in computes)
    assert prof.device == "cpu" and prof.wall and prof.batch == 4
    again = Profile.from_dict(prof.to_dict())
    assert again.costs.keys() == prof.costs.keys()
    measured = Profile.measure(main, batch=4, steps=1, warmup=1, threads=1)
    assert measured.costs.keys() >= {op_key(h) for h in computes}
    assert measured.threads == 1
    from ssaexec.core.place import available_cores
    if available_cores() >= 2:  # copies of the place side by side, one per core
        assert 0.0 < measured.side_by_side <= 1.0
    else:
        assert measured.side_by_side is None
    assert Profile.from_dict(measured.to_dict()).side_by_side == measured.side_by_side
    assert Profile.measure(main, batch=4, steps=1, warmup=1, threads=1,
                           side_by_side=False).side_by_side is None


def test_roofline_estimate_counts_convolutions():
    prog = se.load_program("examples/small_resnet.json")
    dev = sim.PRESETS["dgx-h100"].device
    small, big = Profile.estimate(prog, 256, dev), Profile.estimate(prog, 1024, dev)
    def convs(p):
        return sum(c.device_s for k, c in p.costs.items() if k.startswith("conv2d_grad|"))
    assert convs(big) > 3 * convs(small)  # 4x the work, a few kernels at the floor
    # every kernel takes at least the shortest one; views (reshape ...) and the gradients
    # of same-shaped additions (PyTorch passes them through) launch none
    free = {k for k, c in small.costs.items() if c.device_s == 0}
    assert all(c.device_s >= dev.kernel_min for k, c in small.costs.items() if k not in free)
    assert free and all(op_class(k.split("|")[0]) == "view" or
                        k.startswith("elementwise_add_grad|") for k in free)


# --- the command line ------------------------------------------------------------------------

def test_cli_simulate_prints_a_table_and_writes_a_plot(tmp_path, capsys):
    from ssaexec.cli import main
    plot = tmp_path / "scaling.png"
    assert main(["simulate", "examples/small_resnet.json", "--gpus", "1,8,64",
                 "--cluster", "dgx-h100", "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    assert "best configuration" in out and "images/sec by layout" in out
    for n in ("1", "8", "64"):
        assert any(line.split()[:1] == [n] for line in out.splitlines())
    assert "critical path at 64 GPUs" in out
    assert plot.stat().st_size > 1000 and plot.read_bytes()[:4] == b"\x89PNG"


def test_cli_simulate_json_and_sweep(tmp_path, capsys):
    import json
    from ssaexec.cli import main
    assert main(["simulate", "examples/mnist_mlp.json", "--gpus", "1,16", "--cluster", "pcie",
                 "--layout", "process-per-gpu", "--cuda-graph", "off", "--sweep", "bucket-mb",
                 "--bucket-sizes", "1,25", "--json", "--no-plot"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [p["gpus"] for p in doc["predictions"]] == [1, 16]
    assert doc["best"]["16"]["efficiency"] <= 1.0
    assert [r["bucket_mb"] for r in doc["bucket_sweep"]["16"]] == [None, 1, 25]
    assert doc["plot"] is None and doc["cluster"]["name"] == "pcie"


def test_cli_simulate_errors(capsys):
    from ssaexec.cli import main
    assert main(["simulate", "examples/mnist_mlp.json", "--cluster", "nope", "--no-plot"]) == 2
    assert "unknown cluster" in capsys.readouterr().err
    assert main(["simulate", "examples/mnist_mlp.json", "--gpus", "0,2", "--no-plot"]) == 2
    assert "--gpus" in capsys.readouterr().err


def test_calibration_fits():
    from ssaexec.sim.calibrate import _fit_local, cpu_cluster, fit_latency_bandwidth
    line = [(s, 50 * US + s / 2e9) for s in (1 << 10, 1 << 14, 1 << 20, 1 << 22)]
    line[2] = (1 << 20, 1.0)  # one noisy point does not move the fit
    a, b = fit_latency_bandwidth(line)
    assert a == pytest.approx(50 * US, rel=0.01) and 1 / b == pytest.approx(2e9, rel=0.01)
    sums = [(p, s, (p - 1) * (2 * US + s / 8e9)) for p in (2, 4) for s in (1 << 10, 1 << 20)]
    alpha, bw = _fit_local(sums)
    assert alpha == pytest.approx(2 * US) and bw == pytest.approx(8e9)
    host = dict(op_s=3 * US, gil_fraction=0.9, hop_s=30 * US, step_s=30 * US,
                readable_extra_s=0.5 * US, speedup={1: 1.0, 2: 1.7})
    c = cpu_cluster(host, sums, line, cores=2, name="here",
                    burst=(1 << 14, (40 * US, 25 * US)))
    assert c.host.cores == 2 and c.device.kind == "cpu" and c.local_sum == (alpha, bw)
    assert c.host.parallel_efficiency == pytest.approx(0.85)
    assert c.intra.latency == pytest.approx(25 * US, rel=0.01)  # a 2-rank ring: 2α + S/B
    # a blocking 16 KiB all-reduce takes ~58 us, one in a burst 25 us: 2 in flight
    assert c.comm_channels == 2 and c.collective_issue_s == 40 * US
    assert Cluster.from_dict(c.to_dict()) == c
    # a burst slower than one at a time: one in flight, each taking its burst time
    c = cpu_cluster(host, sums, line, cores=2, burst=(1 << 14, (40 * US, 200 * US)))
    assert c.comm_channels == 1
    assert sim.collective_time(c, "all_reduce", 1 << 14, 2)[0] == pytest.approx(200 * US)


def test_a_profile_measured_side_by_side_overrides_the_clusters_figure():
    _, graph, profile = _diamond()
    # the cluster's generic figure says cores do not slow each other; the program's own
    # kernels, measured side by side, run at half speed: as in the test below
    profile.side_by_side = 0.5
    slow = simulate_step(graph, profile, _cpu(cores=2), compiled=False, threads=4)
    assert slow.step_s == pytest.approx(60 * US + 5 * US + 1 * US)


def test_parallel_speedup_measures_every_core_count():
    from ssaexec.sim.calibrate import parallel_speedup
    speedup = parallel_speedup(max_cores=2, seconds=0.02, repeats=1)
    assert set(speedup) == {1, 2} and speedup[1] == 1.0 and speedup[2] > 0


def test_cores_running_side_by_side_slow_each_other():
    _, graph, profile = _diamond()
    fast = simulate_step(graph, profile, _cpu(cores=2), compiled=False, threads=4)
    _, graph, _ = _diamond()
    slow = simulate_step(graph, profile, _cpu(cores=2, parallel_efficiency=0.5),
                         compiled=False, threads=4)
    # relu (30 us) starts while scale runs on the other core: at half speed it takes 60
    assert fast.step_s == pytest.approx(36 * US)
    assert slow.step_s == pytest.approx(60 * US + 5 * US + 1 * US)


def test_fp16_updates_fuse_in_the_simulator_as_in_the_compiled_path():
    # the simulator takes its fusion rule from the compiled path (runtime.codegen):
    # fp16 loss scaling's updates share one SkipUpdate, and fuse into foreach calls there
    from ssaexec.program.example_models import build_mlp
    from ssaexec.program.amp import amp_program
    main, _, _ = build_mlp(in_dim=6, hidden=(5, 4), optimizer=se.optimizer.Adam(0.01))
    labels = {}
    for amp in ("bf16", "fp16"):
        graph = se.build_ssa_graph(amp_program(main, amp), [se.CPUPlace(0)])
        profile = Profile({op_key(h): OpCost(1 * US, 0.0) for h in graph.ops},
                          batch=1, device="cpu", threads=1)
        r = simulate_step(graph, profile, _cpu())
        labels[amp] = [a.label for a in r.activities if "adam" in a.label]
    for amp, found in labels.items():
        assert found and all("_foreach" in x for x in found), (amp, found)
