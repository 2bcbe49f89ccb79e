"""One node graph (issue 31): the runners, the stream plan and the simulator share one
partition (``runtime.node_graph``), one scheduling policy (``runtime.scheduler``) and one
fusion rule (``runtime.fusion``)."""

import threading

import pytest
import torch

import ssaexec as se
from ssaexec.runtime import fusion, scheduler
from ssaexec.runtime.collective import LocalCollective
from ssaexec.runtime.compiled import CompiledRunner, SegmentLowering
from ssaexec.runtime.graph_runner import GraphRunner
from ssaexec.runtime.node_graph import NODE_KINDS, HandleNode, Segment, partition
from ssaexec.runtime.runner import Runner
from ssaexec.sim import Cluster, Device, Host, Link, OpCost, Profile, op_key
from ssaexec.sim.engine import node_graph, simulate_step

US = 1e-6


def _diamond():
    """x -> scale (10 us) and relu (30 us) side by side -> add (5 us) -> mean (1 us)."""
    main, startup = se.Program(), se.Program()
    with se.program_guard(main, startup):
        x = se.layers.data("x", shape=[-1, 4], dtype="float32")
        c = se.layers.elementwise_add(se.layers.scale(x, 2.0), se.layers.relu(x))
        loss = se.layers.mean(c)
    graph = se.build_ssa_graph(main, [se.CPUPlace(0)], fetch_list=[loss.name])
    cost = {"scale": 10, "relu": 30, "elementwise_add": 5, "mean": 1}
    profile = Profile({op_key(h): OpCost(cost.get(getattr(h, "op_type", None), 0) * US, 0.0)
                       for h in graph.ops}, batch=1, device="cpu", threads=1)
    return main, graph, profile


def _cpu(hop_s):
    host = Host(cores=8, op_s=0.0, hop_s=hop_s, step_s=0.0, node_s=0.0, gil_fraction=1.0)
    return Cluster("cpu-test", 1024, Device("cpu", "test"), host, Link(1e9, 0.0),
                   Link(1e9, 0.0), local_sum=(0.0, 1e9))


def _mlp(places):
    main, startup = se.Program(), se.Program()
    with se.program_guard(main, startup):
        x = se.layers.data("x", shape=[-1, 6], dtype="float32")
        y = se.layers.data("y", shape=[-1, 1], dtype="float32")
        h = se.layers.fc(se.layers.fc(x, size=8, act="relu"), size=8, act="relu")
        loss = se.layers.mean(se.layers.square_error_cost(se.layers.fc(h, size=1), y))
        se.optimizer.Momentum(0.1, 0.9).minimize(loss)
    return main, startup, loss, se.build_ssa_graph(main, places, fetch_list=[loss.name])


def test_node_kinds_are_closed_and_the_readable_path_is_a_node_per_handle():
    _, _, _, graph = _mlp(se.cpu_places(2))
    readable = partition(graph, segments=False, atomic=True)
    assert [n.handle for n in readable.nodes] == list(graph.ops)
    assert all(n.id == i for i, n in enumerate(readable.nodes))
    compiled = partition(graph, True, atomic=True)
    assert {type(n) for n in compiled.nodes} == set(NODE_KINDS) == {Segment, HandleNode}
    # every handle is in exactly one node, and a node answers what it is
    seen = [h.id for n in compiled.nodes for h in n.handles]
    assert sorted(seen) == [h.id for h in graph.ops]
    for n in compiled.nodes:
        assert n.is_comm == (isinstance(n, HandleNode) and n.handle.is_collective)
        assert n.scoped_results == isinstance(n, HandleNode)


def test_the_simulator_replays_the_runners_own_node_graph():
    _, _, _, graph = _mlp(se.cpu_places(2))
    scopes = [se.Scope() for _ in graph.places]
    for compiled, make in ((True, CompiledRunner), (False, GraphRunner)):
        runner = make(graph, scopes, LocalCollective(), None)
        nodes, plan = node_graph(graph, compiled)
        assert [[h.id for h in n.handles] for n in nodes.nodes] == \
            [[h.id for h in n.handles] for n in runner.nodes]
        assert (plan.succ, plan.roots, plan.commit) == \
            (runner.plan.succ, runner.plan.roots, runner.plan.commit)


def test_a_policy_changed_in_the_scheduler_is_followed_by_the_runtime_and_the_simulator(
        monkeypatch):
    main, graph, profile = _diamond()
    # today's policy: the caller runs scale (the first compute root), relu is queued and
    # starts a hand-off (50 us) later: 50 + 30 + 5 + 1
    assert simulate_step(graph, profile, _cpu(50 * US), compiled=False, threads=4).step_s \
        == pytest.approx(86 * US)
    calls = []

    def last_ready(ready, is_comm):
        calls.append(tuple(ready))
        return ready[-1]

    monkeypatch.setattr(scheduler, "run_here", last_ready)
    # the simulator: the caller now runs relu and scale waits for the hand-off: 50 + 10 + 6
    _, graph, profile = _diamond()
    assert simulate_step(graph, profile, _cpu(50 * US), compiled=False, threads=4).step_s \
        == pytest.approx(66 * US)
    sim_roots = calls[0]
    # the runtime: the calling thread runs the root the policy chose, before anything else
    calls.clear()
    sched = scheduler.Scheduler(4)
    try:
        scope = se.Scope()
        scope.set_var("x", torch.randn(2, 4))
        runner = GraphRunner(graph, [scope], LocalCollective(), sched)
        ran = []
        caller = threading.get_ident()

        def logged(i, fn):
            def run():
                if threading.get_ident() == caller:
                    ran.append(i)
                fn()
            return run
        runner.fns = [logged(i, fn) for i, fn in enumerate(runner.fns)]
        runner.run()
    finally:
        sched.close()
    assert calls[0] == sim_roots == runner.plan.roots
    assert ran[0] == sim_roots[-1]
    assert runner.nodes[ran[0]].handle.op_type == "relu"


def test_the_simulator_fuses_with_the_code_generators_rule(monkeypatch):
    main, _, _, graph = _mlp([se.CPUPlace(0)])
    cluster = _cpu(0.0)
    profile = Profile({op_key(h): OpCost(1 * US, 0.0) for h in graph.ops}, batch=1,
                      device="cpu", threads=1)
    fused = simulate_step(graph, profile, cluster)
    assert any("momentum_foreach" in a.label for a in fused.activities)
    assert "'Param': [" in _source(graph)  # one fused call takes every parameter
    # no update fuses: the code runs one update per op, the replay books one each
    monkeypatch.setattr(fusion, "_fusable", lambda h: None)
    _, _, _, graph = _mlp([se.CPUPlace(0)])
    apart = simulate_step(graph, profile, cluster)
    assert not any("foreach" in a.label for a in apart.activities)
    assert sum(a.label.startswith("momentum") for a in apart.activities) == 6
    assert "'Param': [" not in _source(graph)


def _source(graph):
    runner = CompiledRunner(graph, [se.Scope()], LocalCollective(), None)
    return "\n".join(seg.lowered.source for seg in runner.segments)


class _CountingLowering(SegmentLowering):
    """A lowering swapped in by the caller: the compiled path's bodies, counted."""

    __slots__ = ("ran",)

    def __init__(self):
        super().__init__()
        self.ran = []

    def segment_body(self, seg):
        body = super().segment_body(seg)

        def counted():
            self.ran.append(seg.id)
            body()
        return counted


def test_the_lowering_is_swapped_without_touching_the_runner():
    main, startup, loss, graph = _mlp(se.cpu_places(2))
    feed = {"x": torch.randn(8, 6), "y": torch.randn(8, 1)}
    results = []
    for lowering in (SegmentLowering(), _CountingLowering()):
        exe = se.Executor(se.CPUPlace(0))
        scope = se.Scope()
        torch.manual_seed(0)
        exe.run(startup, scope=scope)
        scopes = [se.Scope() for _ in graph.places]
        for s in scopes:
            for name, value in scope.vars.items():
                s.set_var(name, value.clone())
        for pi, s in enumerate(scopes):
            s.set_var("x", feed["x"][4 * pi:4 * pi + 4])
            s.set_var("y", feed["y"][4 * pi:4 * pi + 4])
        graph = se.build_ssa_graph(main, se.cpu_places(2), fetch_list=[loss.name])
        sched = scheduler.Scheduler(3)
        try:
            runner = Runner(graph, scopes, LocalCollective(), sched, lowering)
            results.append(runner.run()[loss.name])
        finally:
            sched.close()
    assert all(torch.equal(a, b) for a, b in zip(*results, strict=True))
    assert sorted(lowering.ran) == [n.id for n in runner.segments]
