"""How the places of one process run (``runtime.places_rule``), its probe and its users.

No test reads a clock: the rule is fed step times, the probe's steps are counted, and the
ways are compared by their results (bit for bit) and torch's thread count.
"""

import torch

import ssaexec as se
from ssaexec.core.place import available_cores
from ssaexec.runtime import places_rule
from ssaexec.execution.threading_probe import ThreadingProbe, ThreadingProbes
from ssaexec.program.example_models import build_mlp, make_optimizer


def _mlp():
    return build_mlp("float32", make_optimizer("momentum", 0.1), in_dim=6, hidden=(5,),
                     classes=3)


def _feed(k):
    g = torch.Generator().manual_seed(k)
    return {"img": torch.randn(4, 6, generator=g),
            "label": torch.randint(0, 3, (4, 1), generator=g)}


# --- the rule ---------------------------------------------------------------------------
def test_threads_are_kept_only_when_faster_and_a_tie_takes_turns():
    fast = places_rule.choose(threads_s=0.001, turns_s=0.002)
    assert fast.mode == "threads" and not fast.inline and not fast.host_bound
    assert fast.times == {"threads": 0.001, "turns": 0.002}
    slow = places_rule.choose(threads_s=0.003, turns_s=0.002)
    assert slow.mode == "turns" and slow.inline and not slow.host_bound  # why: unknown
    assert places_rule.choose(0.002, 0.002).mode == "turns"


def test_the_cpu_time_of_the_threads_step_says_whether_the_lock_is_the_limit():
    # the pool lost and kept 1.1 cores busy: its threads waited for the lock
    lock = places_rule.choose(0.003, 0.002, threads_cpu_s=0.0033, cores=2)
    assert lock.host_bound and "one process per place" in lock.reason
    assert "1.1 cores busy" in lock.reason
    # 1.9 cores busy: the cores are the limit (a loaded machine), processes would not help
    full = places_rule.choose(0.003, 0.002, threads_cpu_s=0.0057, cores=2)
    assert full.mode == "turns" and not full.host_bound and "cores are the limit" in full.reason
    # one core: nothing to overlap on, whatever the lock does
    assert not places_rule.choose(0.003, 0.002, threads_cpu_s=0.003, cores=1).host_bound


def test_the_rule_chooses_for_several_cpu_places_only():
    assert places_rule.chooses(se.cpu_places(2))
    assert not places_rule.chooses(se.cpu_places(1))
    assert not places_rule.chooses(se.cpu_places(2), num_threads=3)
    assert not places_rule.chooses([se.CUDAPlace(0), se.CUDAPlace(1)])


def test_intra_op_threads_divide_the_cores_alike_both_ways():
    assert places_rule.intra_op_threads(1, 8) is None  # one place: torch's own count
    assert places_rule.intra_op_threads(2, 8) == 4
    assert places_rule.intra_op_threads(2, 8, processes=2) == 2
    assert places_rule.intra_op_threads(4, 2) == 1  # never 0
    assert places_rule.intra_op_threads(2, 8, torch_threads=3) == 3


def test_describe_says_how_places_run_and_why():
    assert "threads or turns" in places_rule.describe(se.cpu_places(2), cores=4)
    assert "2 intra-op" in places_rule.describe(se.cpu_places(2), cores=4)
    assert "not probed" in places_rule.describe(se.cpu_places(2), processes=2, cores=4)
    assert "caller's thread" in places_rule.describe(se.cpu_places(1))
    assert "as the strategy says" in places_rule.describe(se.cpu_places(2), num_threads=1)
    assert "CUDA" in places_rule.describe([se.CUDAPlace(0)])


# --- the probe --------------------------------------------------------------------------
class _Runner:
    """What a probe touches of a runner: ``inline``, and a lowering's ``switches``."""

    class _Lowering:
        switches = ()

    def __init__(self):
        self.inline = False
        self.lowering = self._Lowering()


def _probe_steps(probes, runner, times):
    ways = []
    for t in times:
        probe = probes.before(runner, None)
        ways.append("turns" if runner.inline else "threads")
        if probe is not None:
            probe.record(runner, t, t)  # one core busy
    return ways


def _times(threads, turns):
    """A probe's step seconds: the untimed first, then each way's as its steps come."""
    return [1.0] + [threads if m == "threads" else turns for m in places_rule.PROBE[1:]]


def test_the_probe_runs_both_ways_and_one_slow_step_does_not_decide():
    probes = ThreadingProbes(se.cpu_places(2))
    runner = _Runner()
    # step 2 (the first turns) is a compile: 100x; the other turns steps decide
    n = len(places_rule.PROBE)
    times = [9.0, 100.0] + [2.0, 1.0] * ((n - 2) // 2) + [3.0] * (n % 2) + [7.0, 7.0]
    ways = _probe_steps(probes, runner, times)
    assert ways[:n] == list(places_rule.PROBE)
    assert ways[n:] == ["turns", "turns"]
    choice = probes.choice(runner)
    assert choice.mode == "turns" and choice.times == {"threads": 2.0, "turns": 1.0}
    assert choice.host_bound == (available_cores() >= 2)  # one core busy on threads


def test_a_tier_switch_probes_again():
    probes = ThreadingProbes(se.cpu_places(2))
    runner = _Runner()
    _probe_steps(probes, runner, _times(threads=2.0, turns=1.0))
    assert probes.choice(runner).mode == "turns"
    runner.lowering.switches = [(5, 1.0)]  # compiler="auto" switched to compiled graphs
    ways = _probe_steps(probes, runner, _times(threads=1.0, turns=3.0) + [1.0])
    assert ways == list(places_rule.PROBE) + ["threads"]
    assert probes.choice(runner).mode == "threads"


def test_no_probe_for_one_place_or_a_chosen_thread_count():
    runner = _Runner()
    assert ThreadingProbes(se.cpu_places(1)).before(runner, None) is None
    assert ThreadingProbes(se.cpu_places(2)).before(runner, 3) is None
    assert ThreadingProbe.SCHEDULE == tuple(m == "turns" for m in places_rule.PROBE)


# --- every way gives the same results, on the same torch threads ------------------------
def _train(strategy, steps=7):
    main, startup, loss = _mlp()
    before = torch.get_num_threads()
    pe = se.ParallelExecutor(se.cpu_places(2), main, startup, loss, exec_strategy=strategy,
                             scope=se.Scope())
    threads, ways = [], []
    try:
        for k in range(steps):
            pe.run([loss], feed=_feed(k))
            threads.append(torch.get_num_threads())
            ways.append(pe._runner((loss,)).inline)
        params = {(v.name, i): pe.get_var(v.name, i)
                  for v in main.global_block().vars.values() if v.persistable
                  for i in range(2)}
    finally:
        pe.close()
    assert torch.get_num_threads() == before  # restored
    return params, set(threads), ways


def test_turns_threads_and_the_probe_give_bit_identical_results_on_one_thread_count():
    cores = available_cores()
    want = {places_rule.intra_op_threads(2, cores)}
    turns, t1, w1 = _train(se.ExecutionStrategy(num_threads=1))
    pool, t2, w2 = _train(se.ExecutionStrategy(num_threads=3))
    probed, t3, w3 = _train(se.ExecutionStrategy())
    assert t1 == t2 == t3 == want  # the way never changes torch's thread count
    # after each probe step but the last, the way it ran; then the way kept
    assert w3[:4] == [m == "turns" for m in places_rule.PROBE[:4]]
    assert w1 == w2 == [False] * 7  # a chosen num_threads is never probed
    assert len(turns) > 4
    for name, value in turns.items():
        assert torch.equal(value, pool[name]), name
        assert torch.equal(value, probed[name]), name


def _replays(device_us, host_us, hop_us=20):
    import importlib
    from ssaexec.sim import Cluster, Device, Host, Link, OpCost, Profile, op_key
    predict = importlib.import_module("ssaexec.sim.predict")  # the module, not the function
    main, _, _ = _mlp()
    cluster = Cluster("cpu-test", 1024, Device("cpu", "test"),
                      Host(cores=8, op_s=0.0, hop_s=hop_us * 1e-6, step_s=0.0, node_s=0.0,
                           gil_fraction=1.0),
                      Link(1e9, 0.0), Link(1e9, 0.0), local_sum=(0.0, 1e9))
    bs = se.BuildStrategy()
    graph = predict.build_graph(main, cluster, 2, 1, bs, predict._fetch(main))
    profile = Profile({op_key(h): OpCost(device_us * 1e-6, host_us * 1e-6)
                       for h in graph.ops}, batch=4, device="cpu", threads=1)
    kw = dict(compiled=False, cuda_graph=False, algorithm="auto", threads=None, cache={})
    best = predict._best_threading(main, profile, cluster, 2, 1, bs, None, **kw)
    pool = predict._step(main, profile, cluster, 2, 1, bs, inline=False, **kw)
    alone = predict._step(main, profile, cluster, 2, 1, bs, inline=True, **kw)
    return best, pool, alone


def test_the_simulator_keeps_the_way_the_rule_picks():
    # long kernels (GIL released): the places overlap on threads
    best, pool, alone = _replays(device_us=500, host_us=1)
    assert pool.step_s < alone.step_s and not best.inline
    assert best.step_s == pool.step_s
    # launch-bound (host time under the lock only): the hand-offs lose, turns win
    best, pool, alone = _replays(device_us=0.1, host_us=20, hop_us=100)
    assert alone.step_s < pool.step_s and best.inline and best.step_s == alone.step_s
    assert "pool gained nothing" in places_rule.choose(pool.step_s, alone.step_s).reason


# --- a bucket in one process: summed coalesced, bit for bit ------------------------------
def test_a_bucket_in_one_process_is_summed_coalesced_as_var_by_var():
    from ssaexec.runtime.collective import LocalCollective
    g = torch.Generator().manual_seed(3)

    def per_var():  # 3 places; a strided view, a 0-d and a sparse gradient among them
        dense = [[torch.randn(5, 7, generator=g) for _ in range(3)],
                 [torch.randn(7, 5, generator=g).t() for _ in range(3)],
                 [torch.randn((), generator=g) for _ in range(3)],
                 [torch.randn(4, generator=g, dtype=torch.float64) for _ in range(3)]]
        rows = [torch.sparse_coo_tensor([[i, 2]], torch.randn(2, 3, generator=g), (4, 3))
                for i in range(3)]
        return dense + [rows]

    coalesced = per_var()
    g.manual_seed(3)
    one_by_one = per_var()
    coll = LocalCollective()
    assert coll.all_reduce_coalesced(coalesced, "bucket") is coalesced
    for ts in one_by_one:
        coll.all_reduce(ts, label="bucket")
    for mine, theirs in zip(coalesced, one_by_one):
        for a, b in zip(mine, theirs):
            if a.is_sparse:
                a, b = a.to_dense(), b.to_dense()
            assert torch.equal(a, b)
        assert all(torch.equal(t if not t.is_sparse else t.to_dense(),
                               mine[0] if not t.is_sparse else mine[0].to_dense())
                   for t in mine)  # every place holds the sum


def _train_fused(fuse, num_threads, steps=5):
    main, startup, loss = _mlp()
    pe = se.ParallelExecutor(se.cpu_places(2), main, startup, loss,
                             build_strategy=se.BuildStrategy(fuse_all_reduce_ops=fuse),
                             exec_strategy=se.ExecutionStrategy(num_threads=num_threads),
                             scope=se.Scope())
    try:
        losses = [pe.run([loss], feed=_feed(k))[0] for k in range(steps)]
        collectives = [h for h in pe._runner((loss,)).graph.collectives]
        params = {(v.name, i): pe.get_var(v.name, i)
                  for v in main.global_block().vars.values() if v.persistable
                  for i in range(2)}
    finally:
        pe.close()
    return losses, params, collectives


def test_bucketed_gradients_train_bit_identically_to_one_all_reduce_each_both_ways():
    base_losses, base, per_grad = _train_fused(False, 1)
    for nt in (1, 3):  # turns, threads
        losses, params, bucket = _train_fused(True, nt)
        assert len(bucket) == 1 < len(per_grad)  # one coalesced all-reduce of every grad
        assert len(bucket[0].var_names) == len(per_grad)
        assert all(torch.equal(torch.as_tensor(a), torch.as_tensor(b))
                   for a, b in zip(losses, base_losses))
        assert params.keys() == base.keys()
        for name, value in params.items():
            assert torch.equal(value, base[name]), (nt, name)


def test_the_simulator_prices_a_bucket_in_one_process_as_its_coalesced_sums():
    # a bucket summed coalesced (all_reduce_coalesced) moves the bytes of its vars' own
    # sums, no flat buffer filled and emptied (4 more passes over its bytes at 2 places):
    # at 1 MB/s of local sums the step costs no more than with an all-reduce a var
    import importlib
    from ssaexec.sim import Cluster, Device, Host, Link, OpCost, Profile, op_key
    predict = importlib.import_module("ssaexec.sim.predict")
    main, _, _ = _mlp()
    cluster = Cluster("cpu-test", 1024, Device("cpu", "test"),
                      Host(cores=2, op_s=50e-6, hop_s=20e-6, step_s=0.0, node_s=0.0,
                           gil_fraction=1.0),
                      Link(1e9, 0.0), Link(1e9, 0.0), local_sum=(0.0, 1e6))
    steps = {}
    for fuse in (False, True):
        bs = se.BuildStrategy(fuse_all_reduce_ops=fuse)
        graph = predict.build_graph(main, cluster, 2, 1, bs, predict._fetch(main))
        profile = Profile({op_key(h): OpCost(1e-6, 1e-6) for h in graph.ops}, batch=4,
                          device="cpu", threads=1)
        steps[fuse] = predict._step(main, profile, cluster, 2, 1, bs, compiled=True,
                                    cuda_graph=False, algorithm="auto", threads=None,
                                    cache={}, inline=True).step_s
        assert len(graph.collectives) == (1 if fuse else 4)  # 4 gradients, one bucket
    assert steps[True] <= steps[False] * (1 + 1e-9)


def test_the_probe_runs_again_after_reprobe_every_steps_on_the_kept_way():
    probes = ThreadingProbes(se.cpu_places(2))
    runner = _Runner()
    n = len(places_rule.PROBE)
    # turns win; then REPROBE_FIRST steps run turns (the first probe's steps warmed up),
    # a second probe finds turns again, and REPROBE_EVERY steps run turns
    ways = _probe_steps(probes, runner, _times(threads=2.0, turns=1.0) +
                        [1.0] * places_rule.REPROBE_FIRST)
    assert ways[n:] == ["turns"] * places_rule.REPROBE_FIRST
    ways = _probe_steps(probes, runner, _times(threads=2.0, turns=1.0) +
                        [1.0] * places_rule.REPROBE_EVERY)
    assert ways[:n] == list(places_rule.PROBE)
    assert ways[n:] == ["turns"] * places_rule.REPROBE_EVERY
    first = probes.choice(runner)
    assert first.mode == "turns"
    # the load changed: the next probe finds threads faster, and says the old choice
    # until it is done
    probe = probes.before(runner, None)
    assert probe is not None and probe.k == 0 and not runner.inline
    assert probes.choice(runner) is first
    probe.record(runner, 1.0, 1.0)
    ways = _probe_steps(probes, runner, _times(threads=1.0, turns=3.0)[1:] + [1.0])
    assert ways == list(places_rule.PROBE[1:]) + ["threads"]
    assert probes.choice(runner).mode == "threads" and probes.choice(runner) is not first


def test_a_runner_is_settled_after_the_probe_that_follows_its_tiers_warm_up_probe():
    """``settled`` (what benchmarks wait for before they time): not after a tier's first
    probe, whose steps warm up, but after the one ``REPROBE_FIRST`` steps later; again not
    after a tier switch, until the new tier's second probe; always without a probe."""
    probes = ThreadingProbes(se.cpu_places(2))
    runner = _Runner()
    assert not probes.settled(runner, None)  # no step yet
    assert probes.settled(runner, 3)  # the user's thread count: never probed
    assert ThreadingProbes(se.cpu_places(1)).settled(runner, None)  # nothing to overlap
    _probe_steps(probes, runner, _times(threads=2.0, turns=1.0))
    assert probes.choice(runner) is not None and not probes.settled(runner, None)
    _probe_steps(probes, runner, [1.0] * places_rule.REPROBE_FIRST)
    assert not probes.settled(runner, None)  # the second probe has not run
    _probe_steps(probes, runner, _times(threads=2.0, turns=1.0))
    assert probes.settled(runner, None)
    runner.lowering.switches = [(5, 1.0)]  # compiler="auto" switched: the new tier's way
    assert not probes.settled(runner, None)
    _probe_steps(probes, runner, _times(threads=1.0, turns=3.0) +
                 [1.0] * places_rule.REPROBE_FIRST)
    assert not probes.settled(runner, None)
    _probe_steps(probes, runner, _times(threads=1.0, turns=3.0))
    assert probes.settled(runner, None) and probes.choice(runner).mode == "threads"
