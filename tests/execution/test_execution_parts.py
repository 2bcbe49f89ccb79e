"""The parts of ``ParallelExecutor`` (``ssaexec.execution``), each alone, without an executor."""

import pytest
import torch

import ssaexec as se
from ssaexec.core.errors import DistributedError, SSAExecError
from ssaexec.execution import cuda_graphs, learning_rate, shared_vars
from ssaexec.execution.fetch_merge import merge_fetched
from ssaexec.execution.initial_state import (broadcast_persistables, init_added_state,
                                             shard_persistables)
from ssaexec.execution.runner_cache import RunnerCache
from ssaexec.execution.torch_threads import TorchThreads
from ssaexec.program.shard import shard_program
from ssaexec.program.example_models import build_mlp, make_optimizer
from ssaexec.program.lr import StepDecay
from ssaexec.dist.group_setup import GroupSteps
from ssaexec.runtime.nccl import LocalCollective
from ssaexec.runtime.scheduler import Scheduler


def _mlp(opt="momentum", lr=0.1):
    return build_mlp("float32", make_optimizer(opt, lr), in_dim=6, hidden=(5,), classes=3)


def _started(main, startup):
    scope = se.Scope()
    se.Executor(se.CPUPlace()).run(startup, scope=scope)
    return scope


# --- the bucketing default (strategy.py decides it once) ------------------------------
def test_a_compiler_buckets_by_default_without_writing_the_callers_strategy():
    bs = se.BuildStrategy()
    assert not bs.fuses_all_reduce() and bs.fuses_all_reduce("inductor")
    assert bs.for_compiler(None) is bs
    built = bs.for_compiler("inductor")
    assert built is not bs and built.fuse_all_reduce_ops is True
    assert bs.fuse_all_reduce_ops is None  # the caller's object stays as given
    off = se.BuildStrategy(fuse_all_reduce_ops=False)
    assert off.for_compiler("inductor") is off and not off.fuses_all_reduce("inductor")


# --- runner cache -----------------------------------------------------------------------
def test_the_runner_cache_builds_once_per_key_and_observing_takes_the_readable_path():
    main, _, loss = _mlp()
    places = se.cpu_places(2)
    st = se.ExecutionStrategy()
    sched = Scheduler(1)
    try:
        cache = RunnerCache(places, se.BuildStrategy(), st, sched)
        built = []

        def program_for(phase):
            built.append(phase)
            return main
        fetch = (loss,)
        scopes = [se.Scope() for _ in places]
        assert cache.find(fetch, "apply") is None
        fast = cache.runner(fetch, "apply", program_for, scopes, LocalCollective())
        readable = cache.runner(fetch, "apply", program_for, scopes, LocalCollective(),
                                readable=True)
        assert fast.lowering.compiled and not readable.lowering.compiled
        assert cache.runner(fetch, "apply", program_for, scopes, None) is fast  # cached
        assert built == ["apply", "apply"]  # one build per key, none for the cached one
        assert cache.find(fetch, "apply") is fast
        assert cache.find(fetch, "apply", readable=True) is readable
        assert cache.key(fetch, "apply", readable=True)[1:] == (False, None, "apply", None)
        st.compiled = False  # a strategy changed between steps gets its own key
        assert cache.find(fetch, "apply") is readable
        assert cache.contexts() == [None, None]  # CPU places have no streams
    finally:
        sched.close()


# --- initial state ----------------------------------------------------------------------
def test_the_broadcast_shares_place_0s_tensor_and_copies_the_others():
    main, startup, _ = _mlp()
    scope = _started(main, startup)
    places, scopes = se.cpu_places(3), [se.Scope() for _ in range(3)]
    broadcast_persistables((main,), scope, places, scopes, {})
    for p in main.all_parameters():
        src = scope.find_var(p.name)
        assert scopes[0].find_var(p.name) is src
        for s in scopes[1:]:
            t = s.find_var(p.name)
            assert t is not src and t.data_ptr() != src.data_ptr() and torch.equal(t, src)


def test_the_broadcast_gives_owned_state_to_its_owner_only_and_refuses_a_missing_parameter():
    main, startup, _ = _mlp()
    scope = _started(main, startup)
    state = next(v.name for v in main.global_block().vars.values()
                 if v.persistable and not v.is_parameter and "velocity" in v.name)
    scopes = [se.Scope() for _ in range(2)]
    broadcast_persistables((main,), scope, se.cpu_places(2), scopes, {state: 1})
    assert scopes[0].find_var(state) is None and scopes[1].find_var(state) is not None
    empty = se.Scope()
    with pytest.raises(SSAExecError, match="has no value in the scope: run the startup"):
        broadcast_persistables((main,), empty, se.cpu_places(2),
                               [se.Scope(), se.Scope()], {})


def test_added_state_starts_at_its_defaults_and_keeps_a_value_the_scope_has():
    from ssaexec.program.accumulate import accumulation_programs, accumulators
    main, _, _ = _mlp()
    _, apply = accumulation_programs(main)
    accs = accumulators(apply)
    assert accs
    scope = se.Scope()
    first = next(iter(accs))
    scope.set_var(first, torch.full(accs[first].shape, 7.0))
    init_added_state(apply, scope)
    assert float(scope.find_var(first).flatten()[0]) == 7.0
    for name in list(accs)[1:]:
        assert not scope.find_var(name).any()


# --- ZeRO shards ------------------------------------------------------------------------
def test_each_place_gets_its_ranks_slice_of_every_sharded_var():
    main, startup, _ = _mlp()
    scope = _started(main, startup)
    run, layout = shard_program(main, 1, 4)
    velocities = {v.name for v in main.global_block().vars.values() if "velocity" in v.name}
    assert {full for sp in layout for full, _ in sp.state} == velocities  # lr: replicated
    places = se.cpu_places(2)
    scopes = [se.Scope(), se.Scope()]
    shard_persistables(layout, scope, places, scopes, first_rank=2)  # process 1 of 2
    for sp in layout:
        full = scope.find_var(sp.name).reshape(-1)
        s = sp.shard_size
        for i, ls in enumerate(scopes):
            got = ls.find_var(sp.shard_name)
            want = full[(2 + i) * s:(3 + i) * s]
            assert got.shape == (s,) and torch.equal(got[:want.numel()], want)
            assert not got[want.numel():].any()  # zero padding past the end
    shard_persistables(None, scope, places, scopes)  # no ZeRO: nothing to do


# --- learning rate ----------------------------------------------------------------------
def test_the_learning_rate_var_is_found_and_a_scheduled_one_is_not_settable():
    main, _, _ = _mlp()
    name = learning_rate.lr_var(main)
    assert learning_rate.settable_lr_var(main) == name
    with pytest.raises(SSAExecError, match="0 learning-rate vars"):
        learning_rate.lr_var(se.Program())
    sched, _, _ = build_mlp("float32", se.optimizer.SGD(StepDecay(0.1, 2)), in_dim=5,
                            hidden=(4,), classes=3)
    with pytest.raises(SSAExecError, match="computed by an LR schedule"):
        learning_rate.settable_lr_var(sched)


# --- share_vars_from --------------------------------------------------------------------
def test_shared_scopes_need_the_same_places_and_unshadow_drops_only_hiding_bindings():
    parents = [se.Scope(), se.Scope()]
    with pytest.raises(SSAExecError, match="the places differ"):
        shared_vars.shared_scopes(se.cpu_places(2), se.cpu_places(3), parents)
    children = shared_vars.shared_scopes(se.cpu_places(2), se.cpu_places(2), parents)
    assert [c.parent for c in children] == parents
    parents[0].set_var("w", torch.ones(1))
    children[0].set_var("w", torch.zeros(1))  # hides the parent's
    children[1].set_var("w", torch.zeros(1))  # the parent has none: the child's own
    children[0].set_var("mine", torch.zeros(1))
    shared_vars.unshadow(children, frozenset({"w"}))
    assert float(children[0].find_var("w")) == 1.0  # the parent's current value again
    assert float(children[1].find_var("w")) == 0.0 and "mine" in children[0].vars
    main, _, _ = _mlp()
    assert {p.name for p in main.all_parameters()} <= shared_vars.shadowable(main)


# --- CUDA-graph glue --------------------------------------------------------------------
def test_cuda_graphs_are_refused_on_cpu_places_and_have_no_status_before_a_step():
    with pytest.raises(SSAExecError, match="cuda_graph=True needs CUDA places"):
        cuda_graphs.check_places(se.ExecutionStrategy(cuda_graph=True), se.cpu_places(1),
                                 False)
    cuda_graphs.check_places(se.ExecutionStrategy(), se.cpu_places(1), False)  # off: no check
    cache = cuda_graphs.StepGraphCache()
    assert cache.status(None) is None and cache.status(object()) is None


# --- fetch merge ------------------------------------------------------------------------
def test_fetched_values_merge_by_their_declared_shape():
    main, startup = se.Program(), se.Program()
    with se.program_guard(main, startup):
        batch = se.layers.data("b", [-1, 2])
        fixed = se.layers.data("f", [3])
    a, b = torch.ones(1, 2), torch.zeros(2, 2)
    assert torch.equal(merge_fetched(batch, [a, b]), torch.cat([a, b]))
    assert float(merge_fetched(None, [torch.tensor(1.0), torch.tensor(2.0)])) == 1.5
    ints = merge_fetched(None, [torch.tensor([1]), torch.tensor([3])])
    assert ints.tolist() == [1, 3]  # integers are not averaged
    first = torch.arange(3.0)
    assert merge_fetched(fixed, [first, first + 1]) is first
    assert merge_fetched(batch, [b]) is b


@pytest.mark.parametrize("shape", [(), (1,)])
def test_a_fetched_scalar_is_the_mean_of_the_places_bit_for_bit(shape):
    # the torch oracle: the mean of the places' values stacked, for 2 to 8 places
    g = torch.Generator().manual_seed(0)
    for n in range(2, 9):
        values = [torch.randn(shape, generator=g) * 1e3 for _ in range(n)]
        got = merge_fetched(None, values)
        assert got.shape == values[0].shape
        assert torch.equal(got.reshape(()), torch.stack([v.reshape(()) for v in values]).mean())
    ints = merge_fetched(None, [torch.tensor(4, dtype=torch.int64)] * 3)
    assert ints.tolist() == [4, 4, 4]
    # places whose scalars differ in shape ([] and [1]): still averaged, in the first's shape
    mixed = merge_fetched(None, [torch.tensor(1.0), torch.tensor([2.0])])
    assert mixed.shape == () and float(mixed) == 1.5


# --- torch threads ----------------------------------------------------------------------
def test_torch_threads_divide_the_cores_and_are_restored_once():
    from ssaexec.core.place import available_cores
    t = TorchThreads()
    assert t.wanted(se.cpu_places(1)) is None
    assert t.wanted(se.cpu_places(2)) == max(1, available_cores() // 2)
    assert t.wanted(se.cpu_places(2), processes=available_cores()) == 1
    assert t.wanted(se.cpu_places(1), torch_threads=3) == 3
    before = torch.get_num_threads()
    want = 1 if before != 1 else 2
    t.apply(se.cpu_places(1), torch_threads=want)
    try:
        assert torch.get_num_threads() == want
    finally:
        t.restore()
    assert torch.get_num_threads() == before
    torch.set_num_threads(want)
    try:
        t.restore()  # idempotent: nothing left to restore
        assert torch.get_num_threads() == want
    finally:
        torch.set_num_threads(before)


# --- a multi-process run's steps (process_group_setup.GroupSteps) ----------------------
class _Runner:
    def __init__(self, error=None):
        self.error, self.syncs = error, []

    def run(self, sync):
        self.syncs.append(sync)
        if self.error is not None:
            raise self.error
        return {"x": [1]}


def test_group_steps_run_and_an_error_every_rank_raised_keeps_the_group():
    steps = GroupSteps()
    runner = _Runner()
    assert steps.run(runner, True, 1) == {"x": [1]} and runner.syncs == [True]
    intact = SSAExecError("ranks disagree")
    intact.group_intact = True
    with pytest.raises(SSAExecError, match="ranks disagree"):
        steps.run(_Runner(intact), False, 2)
    assert steps.failed is None
    steps.check()  # still usable
    steps.failed = "OpError: boom"
    with pytest.raises(DistributedError, match=r"earlier step .* failed \(OpError: boom\)"):
        steps.check()


# --- layering ---------------------------------------------------------------------------
def test_the_parts_import_nothing_above_the_runtime():
    from test_layers import LAYERS, import_graph, layer_of
    g = import_graph()
    runtime = LAYERS.index("runtime")
    parts = [m for m in g.nodes if m.startswith("ssaexec.execution.")
             # not the modules issue 48 moved in beside them
             and m.rpartition('.')[2] not in {"executor", "observe", "parallel_executor",
                                              "pserver", "step_programs", "step_trace",
                                              "threading_probe"}]
    assert len(parts) >= 7  # zero_owners went with issue 49 (ZeRO shards instead)
    above = [(a, b) for a in parts for b in g.successors(a) if layer_of(b) > runtime]
    assert above == []


def test_a_dropped_executor_is_freed_at_once_and_stops_its_workers():
    # the parts hold no reference back to the executor: no cycle waits for the collector
    import gc
    import weakref
    main, startup, loss = _mlp()
    pe = se.ParallelExecutor(se.cpu_places(2), main, startup, loss, scope=se.Scope())
    pe.run([loss], feed={"img": torch.randn(4, 6), "label": torch.zeros(4, 1, dtype=torch.int64)})
    ref, scheduler = weakref.ref(pe), pe._scheduler
    gc.disable()
    try:
        del pe
        assert ref() is None and scheduler.closed
    finally:
        gc.enable()
