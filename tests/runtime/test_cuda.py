"""CUDA execution: streams, event/wait synchronisation, fused all-reduce (needs a GPU).

Several places share one GPU here (``CUDAPlace(i, device_index=0)``), which is
how the stream and collective machinery is tested on a one-GPU machine.
"""

import random

import pytest
import torch

import ssaexec as se
from ssaexec.program.example_models import build_cnn, build_mlp, make_optimizer
from ssaexec.runtime.graph_runner import GraphRunner
from ssaexec.runtime.collective import LocalCollective
from ssaexec.runtime.scheduler import Scheduler
from ssaexec.runtime.streams import DeviceContext, StreamSync

pytestmark = pytest.mark.cuda

STEPS = 5


def _places(n):
    return [se.CUDAPlace(i, device_index=0) for i in range(n)]


def _data(b, shape, seed):
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn([b, *shape], generator=g) for _ in range(STEPS)]
    ys = [torch.randint(0, 10, (b, 1), generator=g) for _ in range(STEPS)]
    return xs, ys


@pytest.mark.parametrize("n", [1, 2, 4])
@pytest.mark.parametrize("sync", ["event", "wait"])
@pytest.mark.parametrize("fuse", [False, True])
def test_places_on_one_gpu_match_sequential(n, sync, fuse):
    main, startup, loss = build_cnn("float32", make_optimizer("momentum", 0.05), size=8,
                                    filters=(4, 6), batch_norm=False)
    xs, ys = _data(4 * n, [1, 8, 8], seed=n)
    ref_scope, exe = se.Scope(), se.Executor(se.CUDAPlace(0))
    exe.run(startup, scope=ref_scope)
    ref = [exe.run(main, feed={"img": x, "label": y}, fetch_list=[loss], scope=ref_scope)[0]
           for x, y in zip(xs, ys, strict=True)]
    strategy = se.BuildStrategy(fuse_all_reduce_ops=fuse, fuse_bucket_mb=0.001)
    with se.ParallelExecutor(_places(n), main, startup, loss, strategy,
                             se.ExecutionStrategy(sync=sync), scope=se.Scope()) as pe:
        got = [pe.run([loss], feed={"img": x, "label": y})[0] for x, y in zip(xs, ys, strict=True)]
        assert torch.allclose(torch.stack(got), torch.stack(ref), rtol=1e-5, atol=1e-6)
        for p in main.all_parameters():
            for s in pe.local_scopes:
                assert torch.allclose(s.find_var(p.name).cpu(), ref_scope.find_var(p.name).cpu(),
                                      rtol=1e-5, atol=1e-6), p.name


def test_sync_strategy_switches_between_runs():
    main, startup, loss = build_mlp(in_dim=8, hidden=(6,))
    x, y = torch.randn(8, 8), torch.randint(0, 10, (8, 1))
    es = se.ExecutionStrategy(sync="event")
    with se.ParallelExecutor(_places(2), main, startup, loss, exec_strategy=es,
                             scope=se.Scope()) as pe:
        a, = pe.run([loss], feed={"img": x, "label": y})
        es.sync = "wait"
        b, = pe.run([loss], feed={"img": x, "label": y})
        assert torch.isfinite(a) and torch.isfinite(b) and b < a


def _chain_program(width=6, depth=20):
    prog = se.Program()
    g = prog.global_block()
    g.create_var("x", [-1, 16], "float32", is_data=True)
    names = []
    for w in range(width):
        prev = "x"
        for d in range(depth):
            out = f"c{w}_{d}"
            g.create_var(out, [-1, 16], "float32")
            op = ("scale", {"X": [prev]}, {"scale": 1.01, "bias": 0.1}) if d % 2 else \
                 ("elementwise_add", {"X": [prev], "Y": ["x"]}, {})
            g.append_op(op[0], op[1], {"Out": [out]}, op[2])
            prev = out
        names.append(prev)
    g.create_var("total", [-1, 16], "float32")
    g.append_op("sum", {"X": names}, {"Out": ["total"]})
    return prog


def test_random_stream_assignment_never_reads_early():
    prog = _chain_program()
    x = torch.randn(64, 16)
    ref, = se.Executor(se.CUDAPlace(0)).run(prog, feed={"x": x}, fetch_list=["total"],
                                            scope=se.Scope())
    places = _places(2)
    graph = se.build_ssa_graph(prog, places, fetch_list=["total"])
    contexts = [DeviceContext(p) for p in places]
    roles = ("compute", "comm", "fetch")
    rng = random.Random(0)
    sched = Scheduler(4)
    try:
        for it in range(200):
            assignment = {op.id: (rng.randrange(2), rng.choice(roles)) for op in graph.ops}
            scopes = [se.Scope() for _ in places]
            for s, part in zip(scopes, torch.split(x, 32), strict=True):
                s.set_var("x", part.to("cuda"))
            runner = GraphRunner(graph, scopes, LocalCollective(), sched, contexts,
                                 "event" if it % 2 else "wait")
            runner.streams = StreamSync(graph, contexts, runner.streams.sync,
                                        key=lambda op: assignment[op.id])
            runner.fns = [runner._on_stream(n.id, body)
                          for n, body in zip(runner.nodes, runner.bodies, strict=True)]
            out = runner.run()
            got = torch.cat(out["total"])
            assert torch.allclose(got, ref, rtol=1e-5, atol=1e-5), it
    finally:
        sched.close()


@pytest.mark.parametrize("n", [1, 2])
def test_compiled_path_is_bit_identical_to_the_readable_path_on_cuda(n):
    """Prepared calls on CUDA streams give exactly what the per-op path gives."""
    main, startup, loss = build_cnn("float32", make_optimizer("adam", 0.01), size=8,
                                    filters=(4, 6))
    xs, ys = _data(4 * n, [1, 8, 8], seed=7)
    runs = []
    for compiled in (True, False):
        with se.ParallelExecutor(_places(n), main, startup, loss,
                                 exec_strategy=se.ExecutionStrategy(compiled=compiled),
                                 scope=se.Scope()) as pe:
            losses = [pe.run([loss], feed={"img": x, "label": y})[0]
                      for x, y in zip(xs, ys, strict=True)]
            params = {p.name: pe.local_scopes[-1].find_var(p.name).cpu()
                      for p in main.all_parameters()}
        runs.append((losses, params))
    for a, b in zip(runs[0][0], runs[1][0], strict=True):
        assert torch.equal(a, b)
    for name in runs[0][1]:
        assert torch.equal(runs[0][1][name], runs[1][1][name]), name


def test_imported_transformer_on_cuda_copies_nothing():
    import torch.nn as nn
    import torch.nn.functional as F
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    model = nn.Sequential(nn.TransformerEncoder(layer, 2, enable_nested_tensor=False),
                          nn.Flatten(), nn.Linear(16 * 6, 5))
    x, y = torch.randn(4, 6, 16), torch.randint(0, 5, (4,))
    # feeds are bound by the forward's argument names: nn.Sequential's is ``input``
    main, startup, loss = se.from_torch(model, {"input": x, "target": y},
                                        loss_fn=F.cross_entropy,
                                        optimizer=se.optimizer.SGD(0.05))
    with se.ParallelExecutor(_places(1), main, startup, loss, scope=se.Scope()) as pe:
        for _ in range(3):
            lv, = pe.run([loss], feed={"input": x, "target": y})
        runner = pe._runner((loss,))
        assert runner.clones == 0 and len(runner.segments) == 1
        assert torch.isfinite(lv)


# --- whole-step CUDA graphs (ExecutionStrategy(cuda_graph=True)) ----------------------------

def _graph_run(n, cuda_graph, batch_norm, steps=10, shapes=None, lr_schedule=True):
    main, startup, loss = build_cnn("float32", make_optimizer("momentum", 0.05), size=8,
                                    filters=(4, 6), batch_norm=batch_norm)
    g = torch.Generator().manual_seed(3)
    shapes = shapes or [4 * n] * steps
    feeds = [{"img": torch.randn(b, 1, 8, 8, generator=g),
              "label": torch.randint(0, 10, (b, 1), generator=g)} for b in shapes]
    st = se.ExecutionStrategy(cuda_graph=cuda_graph, cuda_graph_warmup=2)
    with se.ParallelExecutor(_places(n), main, startup, loss, exec_strategy=st,
                             scope=se.Scope()) as pe:
        losses = []
        for k, feed in enumerate(feeds):
            if lr_schedule:  # a schedule that rebinds the learning rate every step
                for s in pe.local_scopes:
                    s.set_var("learning_rate_0", torch.tensor(0.05 / (1 + k), device="cuda"))
            losses.append(pe.run([loss], feed=feed, return_merged=False)[0])
        params = {p.name: [s.find_var(p.name).cpu() for s in pe.local_scopes]
                  for p in main.all_parameters()}
        return losses, params, pe.cuda_graph_status([loss])


@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("batch_norm", [False, True])
def test_cuda_graph_replay_equals_the_normal_run_bit_for_bit(n, batch_norm):
    ref, ref_params, none = _graph_run(n, False, batch_norm)
    got, got_params, status = _graph_run(n, True, batch_norm)
    assert none is None and status["captured"] == 1 and status["replays"] == 8, status
    for a, b in zip(ref, got, strict=True):
        assert all(torch.equal(x.cpu(), y.cpu()) for x, y in zip(a, b, strict=True))
    for name, vals in ref_params.items():
        assert all(torch.equal(x, y) for x, y in zip(vals, got_params[name], strict=True)), name


def test_a_new_feed_shape_is_captured_again_and_old_ones_are_replayed():
    shapes = [8, 8, 8, 8, 6, 6, 6, 6, 8, 6]
    ref, _, _ = _graph_run(2, False, False, shapes=shapes)
    got, _, status = _graph_run(2, True, False, shapes=shapes)
    assert status["captured"] == 2 and status["cached"] == 2, status
    for a, b in zip(ref, got, strict=True):
        assert all(torch.equal(x.cpu(), y.cpu()) for x, y in zip(a, b, strict=True))


def test_a_step_that_cannot_be_captured_falls_back_with_one_warning():
    main, startup = se.Program(), se.Program()
    with se.program_guard(main, startup):
        x = se.layers.data("x", [-1, 8])
        h = se.layers.dropout(se.layers.fc(x, 8), 0.5)
        loss = se.layers.mean(h)
        se.optimizer.SGD(0.1).minimize(loss)
    st = se.ExecutionStrategy(cuda_graph=True)
    with pytest.warns(RuntimeWarning, match="dropout.*cannot be captured"):
        with se.ParallelExecutor(_places(1), main, startup, loss.name, exec_strategy=st,
                                 scope=se.Scope()) as pe:
            for _ in range(4):
                pe.run([loss], feed={"x": torch.randn(4, 8)})
            assert "dropout" in pe.cuda_graph_status([loss])["fallback"]
