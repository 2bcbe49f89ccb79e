"""The recorded stream plan of both runners, checked without a GPU (issue 30, section 2).

``runner.stream_plan(devices)`` is exactly what ``StreamSync`` applies on a GPU:
which streams each node enters, whom it waits for, who records an event, what
the host waits for. For 1, 2 and 3 places, every reduce strategy and several
device layouts, on the readable path (op handles) and the compiled path (node
graph), the plan must satisfy, from the handles' own var handles:

* every device a node reads or writes is the device of a stream it enters
  (issue 30 item 3: a compiled broadcast entered one comm stream);
* every producer edge is ordered on every stream the consumer enters: that
  stream is one the producer entered, or the consumer waits for the producer's
  event;
* every fetch enters the fetch stream of each device it reads, and the host
  waits for its event (item 2: another GPU's copy ran on its default stream);
* each compiled node enters at least the streams of every handle it runs.

The CUDA tests at the end run the same policies on a GPU.
"""

import pytest
import torch

import ssaexec as se
from ssaexec.program.example_models import build_mlp, make_optimizer
from ssaexec.runtime.collective import LocalCollective
from ssaexec.runtime.compiled import CompiledRunner, Segment
from ssaexec.runtime.graph_runner import GraphRunner
from ssaexec.runtime.scheduler import Scheduler
from ssaexec.runtime.streams import storage_parts

STRATEGIES = {
    "all_reduce": {},
    "reduce": {"reduce_strategy": "reduce"},
    "zero_stage1": {"zero_stage": 1},
    "zero_stage2": {"zero_stage": 2},
    "zero_stage3": {"zero_stage": 3},
    "fused": {"fuse_all_reduce_ops": True, "fuse_bucket_mb": 0.0001},
    "bf16_wire": {"allreduce_dtype": "bf16"},
    "async_2_trainers": {"num_trainers": 2, "async_allreduce": True},
}


def _layouts(n):
    """Device of each place: one GPU per place, all on one GPU, and mixed."""
    out = {"one_gpu_per_place": None, "one_gpu": [0] * n}
    if n == 3:
        out["mixed"] = [0, 1, 1]
    return out


def _sparse_program():
    main, startup = se.Program(), se.Program()
    with se.program_guard(main, startup):
        ids = se.layers.data("ids", shape=[-1, 4], dtype="int64")
        y = se.layers.data("y", shape=[-1, 1], dtype="float32")
        emb = se.layers.embedding(ids, size=[50, 8], is_sparse=True)
        pred = se.layers.fc(se.layers.reduce_mean(emb, dim=1), size=1)
        loss = se.layers.mean(se.layers.square_error_cost(pred, y))
        se.optimizer.SGD(learning_rate=0.5).minimize(loss)
    return main, loss


def _runners(n, strategy, program=None):
    if program is None:
        main, _, loss = build_mlp(in_dim=6, hidden=(5, 4), classes=3,
                                  optimizer=make_optimizer("adam", 0.01))
    else:
        main, loss = program
    places = se.cpu_places(n)
    bs = se.BuildStrategy(**strategy)
    out = []
    for kind in (GraphRunner, CompiledRunner):
        graph = se.build_ssa_graph(main, places, bs, [getattr(loss, "name", loss)])
        sched = Scheduler(1)
        try:
            runner = kind(graph, [se.Scope() for _ in places], LocalCollective(), sched)
        finally:
            sched.close()
        out.append(runner)
    return out


def _handles(node):
    if isinstance(node, Segment):
        return node.handles
    return [getattr(node, "handle", node)]


def _touched(h):
    """(read, written) place indices of SSA handle ``h``, from its var handles."""
    reads = {v.place_idx for v in h.inputs if not v.is_dummy}
    writes = {v.place_idx for v in h.outputs if not v.is_dummy}
    if h.on_one_place:
        reads.add(h.place_idx)
    return reads, writes


def _dev(devices, pi):
    return pi if devices is None else devices[pi]


def check_plan(nodes, plan, devices):
    """Assert the invariants of the module docstring; return the number of waits."""
    n_waits = 0
    for node in nodes:
        i = node.id
        enters = plan.enters[i]
        assert enters and enters[0] == plan.keys[i], node.name
        entered = [_dev(devices, pi) for pi, _ in enters]
        assert len(set(entered)) == len(entered), f"{node.name}: two streams on one device"
        assert len({role for _, role in enters}) == 1, node.name
        for h in _handles(node):
            reads, writes = _touched(h)
            missing = {_dev(devices, pi) for pi in reads | writes} - set(entered)
            assert not missing, (f"{node.name} touches devices {sorted(missing)} on no "
                                 f"stream it enters ({enters})")
        for p in node.producers():
            for s in enters:
                assert s in plan.enters[p.id] or p.id in plan.waits[i], \
                    f"{node.name} on {s} is not ordered after {p.name}"
        for j in plan.waits[i]:
            assert any(p.id == j for p in node.producers()), node.name
            assert plan.records[j], nodes[j].name
            n_waits += 1
        if any(h.kind == "fetch" for h in _handles(node)):
            assert i in plan.host_waits and plan.records[i], node.name
            assert all(role == "fetch" for _, role in enters), node.name
    return n_waits


def check_compiled_covers_readable(compiled, readable, devices):
    """Each compiled node enters the streams of every handle it runs."""
    rplan = readable.stream_plan(devices)
    cplan = compiled.stream_plan(devices)
    for node in compiled.nodes:
        for h in _handles(node):
            if isinstance(node, Segment) and not h.on_one_place:
                assert len(compiled.graph.places) == 1 and h.is_collective  # a no-op
                continue
            want = set(rplan.enters[h.id])
            got = set(cplan.enters[node.id])
            assert want <= got, f"{node.name}: enters {sorted(got)}, {h.name} needs " \
                                f"{sorted(want)}"


@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_stream_plans_order_every_edge_on_every_device(n, strategy):
    readable, compiled = _runners(n, STRATEGIES[strategy])
    for devices in _layouts(n).values():
        check_plan(readable.graph.ops, readable.stream_plan(devices), devices)
        check_plan(compiled.nodes, compiled.stream_plan(devices), devices)
        check_compiled_covers_readable(compiled, readable, devices)


@pytest.mark.parametrize("n", [2, 3])
def test_sparse_gradient_plans(n):
    readable, compiled = _runners(n, {}, _sparse_program())
    for devices in _layouts(n).values():
        check_plan(readable.graph.ops, readable.stream_plan(devices), devices)
        check_plan(compiled.nodes, compiled.stream_plan(devices), devices)
        check_compiled_covers_readable(compiled, readable, devices)


@pytest.mark.parametrize("strategy", ["reduce", "zero_stage1", "zero_stage3"])
def test_compiled_broadcast_enters_every_comm_stream(strategy):
    """Issue 30 item 3: the owner's broadcast writes every place's parameter (and so
    does ZeRO's all-gather, issue 49)."""
    readable, compiled = _runners(3, STRATEGIES[strategy])
    plan = compiled.stream_plan()
    broadcasts = [n for n in compiled.nodes if not isinstance(n, Segment)
                  and n.kind in ("broadcast", "all_gather")]
    assert broadcasts
    for node in broadcasts:
        assert plan.enters[node.id] == ((0, "comm"), (1, "comm"), (2, "comm")), node.name
        # each place's later compute reads the broadcast value after the broadcast's event
        for c in compiled.segments:
            if node in c.producers():
                assert node.id in plan.waits[c.id] and plan.records[node.id]


def test_fetch_enters_each_devices_fetch_stream_and_the_host_waits():
    """Issue 30 item 2: each place's device-to-host copy waits for its producer."""
    for runner in _runners(3, {}):
        plan = runner.stream_plan()
        nodes = runner.nodes  # one per handle on the readable path
        fetches = [n for n in nodes if n.kind == "fetch"]
        assert len(fetches) == 1
        f = fetches[0]
        assert plan.enters[f.id] == ((0, "fetch"), (1, "fetch"), (2, "fetch"))
        assert plan.host_waits == (f.id,)
        # the loss on every place comes from that place's compute stream: waited for
        producers = {p.id for p in f.producers()}
        assert producers and producers <= set(plan.waits[f.id])
        # two places on one GPU: one fetch stream there, still waited for per producer
        plan1 = runner.stream_plan([0, 0, 1])
        assert plan1.enters[f.id] == ((0, "fetch"), (2, "fetch"))


def test_one_place_needs_no_cross_stream_waits_in_the_compiled_path():
    readable, compiled = _runners(1, {})
    plan = compiled.stream_plan()
    # one segment and the fetch: the fetch alone waits (for the segment)
    assert sum(1 for w in plan.waits if w) == 1
    assert check_plan(readable.graph.ops, readable.stream_plan(), None) > 0


def test_cpu_places_enter_no_stream():
    readable, compiled = _runners(2, {})
    for r in (readable, compiled):
        plan = r.stream_plan([None, None])
        assert all(e == () for e in plan.enters)
        assert not any(plan.waits) and not any(plan.records) and plan.host_waits == ()


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
def test_storage_parts_of_sparse_tensors():
    """Issue 30 item 4: ``record_stream`` goes to the strided tensors a sparse one holds."""
    dense = torch.randn(3, 4)
    assert storage_parts(dense) == (dense,)
    coo = torch.sparse_coo_tensor(torch.tensor([[0, 2, 2]]), torch.randn(3, 4), (5, 4),
                                  check_invariants=True)
    idx, val = storage_parts(coo)
    assert idx.layout == torch.strided and val.layout == torch.strided
    assert idx.data_ptr() == coo._indices().data_ptr()
    assert val.data_ptr() == coo._values().data_ptr()
    csr = torch.randn(4, 5).relu().to_sparse_csr()
    parts = storage_parts(csr)
    assert [p.data_ptr() for p in parts] == [csr.crow_indices().data_ptr(),
                                              csr.col_indices().data_ptr(),
                                              csr.values().data_ptr()]
    assert all(p.layout == torch.strided for p in parts)


# --- on a GPU -------------------------------------------------------------------------

def _cuda_places(n):
    count = torch.cuda.device_count()
    return [se.CUDAPlace(i, device_index=i % count) for i in range(n)]


@pytest.mark.cuda
def test_record_stream_of_a_sparse_cuda_tensor():
    s = torch.cuda.Stream()
    coo = torch.sparse_coo_tensor(torch.tensor([[0, 2]]), torch.randn(2, 3), (4, 3)).cuda()
    for part in storage_parts(coo):
        part.record_stream(s)


def _train(places, strategy, compiled, sync, steps=3, program=None):
    main, startup, loss = build_mlp(in_dim=6, hidden=(5, 4), classes=3,
                                    optimizer=make_optimizer("adam", 0.01))
    g = torch.Generator().manual_seed(0)
    data = [{"img": torch.randn(6 * len(places), 6, generator=g),
             "label": torch.randint(0, 3, (6 * len(places), 1), generator=g)}
            for _ in range(steps)]
    with se.ParallelExecutor(places, main, startup, loss,
                             build_strategy=se.BuildStrategy(**strategy),
                             exec_strategy=se.ExecutionStrategy(compiled=compiled, sync=sync),
                             scope=se.Scope()) as pe:
        losses = [pe.run([loss], feed=f)[0] for f in data]
        params = {p.name: pe.get_var(p.name, place=len(places) - 1).cpu()
                  for p in main.all_parameters()}
    return losses, params


@pytest.mark.cuda
@pytest.mark.parametrize("strategy", ["all_reduce", "reduce", "zero_stage2"])
@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("sync", ["event", "wait"])
def test_cuda_steps_match_cpu(strategy, compiled, sync):
    """Broadcasts, fetches from every place and unsynchronised step ends on CUDA."""
    ref_losses, ref = _train(se.cpu_places(3), STRATEGIES[strategy], compiled, "event")
    losses, params = _train(_cuda_places(3), STRATEGIES[strategy], compiled, sync)
    for a, b in zip(losses, ref_losses, strict=True):
        torch.testing.assert_close(torch.as_tensor(a).cpu(), torch.as_tensor(b),
                                   rtol=1e-4, atol=1e-5)
    for name, t in ref.items():
        torch.testing.assert_close(params[name], t, rtol=1e-4, atol=1e-5)


@pytest.mark.cuda
@pytest.mark.parametrize("strategy", ["all_reduce", "reduce"])
def test_stream_sync_applies_the_runners_plan(strategy):
    """What a GPU runs is the plan the CPU tests check."""
    from ssaexec.runtime.streams import DeviceContext
    places = _cuda_places(3)
    contexts = [DeviceContext(p) for p in places]
    devices = [c.device for c in contexts]
    main, _, loss = build_mlp(in_dim=6, hidden=(5, 4), classes=3,
                              optimizer=make_optimizer("adam", 0.01))
    for kind in (GraphRunner, CompiledRunner):
        graph = se.build_ssa_graph(main, places, se.BuildStrategy(**STRATEGIES[strategy]),
                                   [loss])  # build_mlp returns the loss name
        sched = Scheduler(1)
        try:
            runner = kind(graph, [se.Scope() for _ in places], LocalCollective(), sched,
                          contexts)
        finally:
            sched.close()
        want, got = runner.stream_plan(devices), runner.streams.plan
        for field in ("keys", "enters", "waits", "records", "host_waits"):
            assert getattr(got, field) == getattr(want, field), field
        nodes = runner.nodes if kind is CompiledRunner else graph.ops
        check_plan(nodes, got, devices)
