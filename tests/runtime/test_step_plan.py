"""One step plan (issue 48): ``runtime.plan.build_plan`` decides aliasing, the no-op
collective rule, atomicity, the commit phase, the order, the segments, the lifetimes and
the stream roles once, and ``ssaexec stats``, the simulator and every runner consume it.

The comparison test builds, for every strategy combination the suite uses, what stats
reports, what the simulator replays and what the runner runs, and checks that they are
the same nodes (segments, collectives, fetches: kind, place, handles, phase) in the same
order. The rest are unit tests of the plan itself."""

import pytest

import ssaexec as se
from ssaexec.graph.ssa import topo_sort
from ssaexec.runtime.collective import LocalCollective
from ssaexec.runtime.compiled import CompiledRunner, compile_summary, summary_plan
from ssaexec.runtime.graph_runner import GraphRunner
from ssaexec.runtime.inductor import InductorLowering, inductor_summary
from ssaexec.runtime.memory_plan import last_uses
from ssaexec.runtime.plan import StepPlan, build_plan, processes_of
from ssaexec.runtime.runner import Runner
from ssaexec.sim import Cluster, Device, Host, Link, Profile
from ssaexec.sim import engine


def _program(optimizer="momentum", schedule=False):
    main, startup = se.Program(), se.Program()
    with se.program_guard(main, startup):
        x = se.layers.data("x", shape=[-1, 6], dtype="float32")
        y = se.layers.data("y", shape=[-1, 1], dtype="float32")
        h = se.layers.fc(se.layers.fc(x, size=8, act="relu"), size=8, act="relu")
        loss = se.layers.mean(se.layers.square_error_cost(se.layers.fc(h, size=1), y))
        lr = se.optimizer.lr.StepDecay(0.1, 2, 0.5) if schedule else 0.1
        opt = se.optimizer.Momentum(lr, 0.9) if optimizer == "momentum" else \
            se.optimizer.Adam(lr)
        opt.minimize(loss)
    return main, loss


def _graph(places, **build):
    main, loss = _program(build.pop("optimizer", "momentum"), build.pop("schedule", False))
    strategy = se.BuildStrategy(**build)
    graph = se.build_ssa_graph(main, se.cpu_places(places), strategy, fetch_list=[loss.name])
    graph.lint()
    return graph


# the BuildStrategy combinations the suite builds graphs with (grep tests for BuildStrategy)
STRATEGIES = {
    "default": {},
    "reduce": {"reduce_strategy": "reduce"},
    "fused": {"fuse_all_reduce_ops": True},
    "unfused": {"fuse_all_reduce_ops": False},
    "tiny-buckets": {"fuse_all_reduce_ops": True, "fuse_bucket_mb": 0.001},
    "zero1": {"zero_stage": 1},
    "zero2": {"zero_stage": 2},
    "zero1-fused": {"zero_stage": 1, "fuse_all_reduce_ops": True},
    "accumulate": {"gradient_accumulation_steps": 2, "fuse_all_reduce_ops": True},
    "scale-one": {"gradient_scale_strategy": "one"},
    "bf16-wire": {"allreduce_dtype": "bf16"},
    "async": {"async_allreduce": True},
    "adam": {"optimizer": "adam"},
    "lr-schedule": {"schedule": True},
    "adam-lr-schedule-fused": {"optimizer": "adam", "schedule": True,
                               "fuse_all_reduce_ops": True},
}


def _keys(plan_or_runner):
    plan = plan_or_runner if isinstance(plan_or_runner, StepPlan) else \
        plan_or_runner.step_plan
    return plan.node_keys()


def _cpu_cluster():
    host = Host(cores=8, op_s=1e-6, hop_s=1e-6, step_s=0.0, node_s=0.0, gil_fraction=1.0)
    return Cluster("cpu-test", 1024, Device("cpu", "test"), host, Link(1e9, 0.0),
                   Link(1e9, 0.0), local_sum=(0.0, 1e9))


@pytest.mark.parametrize("name,places", [(n, p) for n in sorted(STRATEGIES) for p in (1, 2)] +
                         [("default", 3), ("fused", 3), ("reduce", 3), ("zero1", 3)])
def test_stats_the_simulator_and_the_runners_see_the_same_segments(name, places):
    graph = _graph(places, **STRATEGIES[name])
    scopes = [se.Scope() for _ in graph.places]
    profile = Profile({}, batch=1, device="cpu", threads=1)
    # the compiled runner, in one process (a local collective backend)
    runner = CompiledRunner(graph, scopes, LocalCollective(), None)
    ran = _keys(runner)
    assert ran == _keys(summary_plan(graph))  # what ``ssaexec stats`` reports ...
    stats = compile_summary(graph)
    segs = [k for k in ran if k[0] == "Segment"]
    assert (stats["segments"], stats["nodes"], stats["ops_per_segment"]) == \
        (len(segs), len(ran), max(len(k[2]) for k in segs))
    assert stats["alias_edges"] == runner.lowering.alias.edges
    # ... and what the simulator replays (its replay reads this cached plan)
    assert _keys(engine.step_plan(graph, True, 1)) == ran
    assert engine.simulate_step(graph, profile, _cpu_cluster()).step_s > 0
    assert engine.node_graph(graph, True, noop_collectives=True)[0] is \
        engine.step_plan(graph, True, 1).nodes
    # the readable runner
    readable = GraphRunner(graph, scopes, LocalCollective(), None)
    assert _keys(readable) == _keys(engine.step_plan(graph, False, 1))
    assert [k[2] for k in _keys(readable)] == [(h.id,) for h in graph.ops]
    # the Inductor runner (nothing is compiled before its steps run)
    inductor = Runner(graph, scopes, LocalCollective(), None, InductorLowering(notes=[]))
    assert _keys(inductor) == _keys(summary_plan(graph, atomic=True))
    assert inductor_summary(graph)["segments"] == \
        sum(1 for k in _keys(inductor) if k[0] == "Segment")
    # several processes: stats (local_only=False) and the simulator agree
    multi = compile_summary(graph, local_only=False)
    sim = engine.step_plan(graph, True, 2)
    assert not sim.noop_collectives and sim.atomic
    assert _keys(summary_plan(graph, local_only=False)) == _keys(sim)
    assert multi["segments"] == len(sim.segments)


def test_stats_reports_the_runners_segments_with_several_places():
    # the bug the plan fixes: stats cut the commit phase as a one-place step does, so
    # with a learning-rate schedule (its step counter is updated in place, waiting for no
    # collective) it reported 8 segments of 15 nodes where the runner runs 10 of 17
    graph = _graph(2, schedule=True)
    runner = CompiledRunner(graph, [se.Scope(), se.Scope()], LocalCollective(), None)
    assert runner.step_plan.atomic and any(k[3] for k in _keys(runner))
    assert _keys(summary_plan(graph)) == _keys(runner)
    stats = compile_summary(graph)
    assert (stats["segments"], stats["nodes"]) == (len(runner.segments), len(runner.nodes))
    assert (len(runner.segments), len(runner.nodes)) == (10, 17)


def test_one_place_in_one_process_is_one_segment_and_not_atomic():
    graph = _graph(1)
    plan = build_plan(graph, True, 1)
    assert plan.noop_collectives and not plan.atomic
    assert len(plan.segments) == 1 and not any(n.commit for n in plan.nodes.nodes)
    # another process takes part: the collectives cut, the commit phase is apart
    plan2 = build_plan(graph, True, processes_of(type("Dist", (), {"world_size": 2})()))
    assert plan2.processes == 2 and not plan2.noop_collectives and plan2.atomic
    assert len(plan2.segments) > 1
    # Inductor's lowering keeps the commit phase apart even in one process
    plan3 = build_plan(graph, True, 1, atomic=True)
    assert plan3.noop_collectives and plan3.atomic and len(plan3.segments) == 2
    assert processes_of(LocalCollective()) == 1


def test_the_readable_path_is_a_node_per_handle_and_always_atomic():
    graph = _graph(2)
    plan = build_plan(graph, segments=False)
    assert plan.alias is None and plan.atomic and plan.segments == []
    assert [n.handle for n in plan.nodes.nodes] == list(graph.ops)
    assert plan.deps.n == len(graph.ops)


def test_building_a_plan_again_changes_nothing():
    graph = _graph(2)
    first = build_plan(graph)
    ops, dummies = len(graph.ops), len(graph.dummies)
    inputs = [len(h.inputs) for h in graph.ops]
    again = build_plan(graph)
    assert (len(graph.ops), len(graph.dummies)) == (ops, dummies)
    assert [len(h.inputs) for h in graph.ops] == inputs
    assert again.node_keys() == first.node_keys()
    assert again.alias.edges == first.alias.edges  # the edges are reported, not re-added
    # another policy on the same graph adds nothing either
    build_plan(graph, segments=False)
    build_plan(graph, True, None, atomic=True, keep=["x"])
    assert len(graph.dummies) == dummies


def test_the_order_is_topological_program_order_with_the_commit_phase_last():
    graph = _graph(2)
    plan = build_plan(graph)
    pos = {h.id: k for k, h in enumerate(plan.order)}
    assert sorted(pos) == [h.id for h in graph.ops]
    for h in graph.ops:
        assert all(pos[p.id] < pos[h.id] for p in h.producers())
    late = plan.commit.late
    assert late and max(pos[i] for i in pos if i not in late) < min(pos[i] for i in late)
    # node edges run forward, and the scheduler's plan numbers nodes alike
    for n in plan.nodes.nodes:
        assert all(p.id < n.id for p in n.producers())
    assert plan.deps.n == len(plan.nodes.nodes)


def test_memory_and_stream_plans_come_fresh_from_the_plan():
    graph = _graph(2)
    plan = build_plan(graph)
    (m1, e1), (m2, e2) = plan.memory_plan(), plan.memory_plan()
    assert m1 is not m2 and e1 == e2 and m1.ref0 == m2.ref0 and e1
    m1.start()
    m1.refs[0] = -5
    m2.start()
    assert m2.refs[0] == m1.ref0[0]
    assert build_plan(graph, segments=False).memory_plan()[1] == set()
    runner = CompiledRunner(graph, [se.Scope(), se.Scope()], LocalCollective(), None)
    devices = [0, 1]
    a, b = plan.stream_plan(devices), runner.stream_plan(devices)
    assert (a.enters, a.waits, a.records) == (b.enters, b.waits, b.records)


def test_topo_sort_prefers_program_order_puts_late_last_and_reports_a_cycle():
    # 0 -> 2, 1 -> 2, 3 free; 1 late
    succ, indeg = [[2], [2], [], []], [0, 0, 2, 0]
    assert topo_sort(succ, indeg) == [0, 1, 2, 3]
    assert topo_sort(succ, indeg, late={1}) == [0, 3, 1, 2]
    assert indeg == [0, 0, 2, 0]  # not changed
    assert len(topo_sort([[1], [0]], [1, 1])) == 0  # a cycle: nothing is ready


def test_last_uses_is_the_last_reader_or_the_first_writer():
    reads = [["a"], ["a", "b"], [], ["b"]]
    writes = [["b"], ["c"], ["d"], ["d"]]
    assert last_uses(reads) == {"a": 1, "b": 3}
    assert last_uses(reads, writes) == {"a": 1, "b": 3, "c": 1, "d": 2}


def test_stats_under_a_compiler_reports_the_graph_that_compiler_runs(capsys):
    # `ssaexec stats --compiler inductor` must summarise the graph the Inductor runner is
    # given: under a compiler the gradients go in buckets (BuildStrategy.for_compiler), so
    # a graph built with the plain strategy has other collectives and other segments
    import json
    from pathlib import Path
    from ssaexec.cli import main as cli_main
    from ssaexec.cli.common import load_program_file, loss_var
    path = str(Path(__file__).resolve().parents[2] / "examples" / "seed_mlp.json")
    assert cli_main(["stats", path, "--places", "2", "--compiler", "inductor",
                     "--format", "json"]) in (0, None)
    reported = json.loads(capsys.readouterr().out)["compiler"]["segments"]
    program = load_program_file(path)
    startup = load_program_file(path.replace(".json", ".startup.json"))
    pe = se.ParallelExecutor(places=se.cpu_places(2), main_program=program,
                             startup_program=startup, loss_name=loss_var(program),
                             exec_strategy=se.ExecutionStrategy(compiler="inductor"))
    runner = pe._runner((loss_var(program),))
    ran = sum(1 for k in _keys(runner) if k[0] == "Segment")
    assert reported == ran
    # and the plain graph differs, so this test can fail
    plain = se.build_ssa_graph(program, se.cpu_places(2), se.BuildStrategy(),
                               fetch_list=[loss_var(program)])
    assert inductor_summary(plain)["segments"] != ran
