"""Data-parallel equivalence, feeds, fetch merging and life cycle of ParallelExecutor."""

import threading

import pytest
import torch

import ssaexec as se
from ssaexec.program.example_models import build_cnn, build_mlp, make_optimizer

STEPS = 5


def _data(n_places, per_place, shape, seed):
    g = torch.Generator().manual_seed(seed)
    b = n_places * per_place
    xs = [torch.randn([b, *shape], dtype=torch.float64, generator=g) for _ in range(STEPS)]
    ys = [torch.randint(0, 10, (b, 1), generator=g) for _ in range(STEPS)]
    return xs, ys


def _sequential(main, startup, loss, xs, ys):
    scope, exe = se.Scope(), se.Executor()
    exe.run(startup, scope=scope)
    losses = [exe.run(main, feed={"img": x, "label": y}, fetch_list=[loss], scope=scope)[0]
              for x, y in zip(xs, ys, strict=True)]
    return torch.stack(losses), scope


def _parallel(main, startup, loss, xs, ys, n, threads, reduce_strategy):
    scope = se.Scope()
    with se.ParallelExecutor(se.cpu_places(n), main, startup, loss,
                             se.BuildStrategy(reduce_strategy=reduce_strategy),
                             se.ExecutionStrategy(num_threads=threads), scope=scope) as pe:
        losses = [pe.run([loss], feed={"img": x, "label": y})[0]
                  for x, y in zip(xs, ys, strict=True)]
        return torch.stack(losses), pe.local_scopes


MODELS = {
    "mlp": (lambda opt: build_mlp("float64", opt, in_dim=12, hidden=(10, 8)), [12]),
    "cnn": (lambda opt: build_cnn("float64", opt, size=8, filters=(3, 4), batch_norm=False),
            [1, 8, 8]),
}


@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize("opt_name", ["sgd", "momentum", "adam"])
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_data_parallel_equals_sequential(model, opt_name, n):
    build, shape = MODELS[model]
    main, startup, loss = build(make_optimizer(opt_name, 0.05))
    xs, ys = _data(n, 3, shape, seed=n)
    ref_losses, ref_scope = _sequential(main, startup, loss, xs, ys)
    params = [p.name for p in main.all_parameters()]
    for threads in (1, 2, 8):
        for rs in ("all_reduce", "reduce"):
            losses, scopes = _parallel(main, startup, loss, xs, ys, n, threads, rs)
            assert torch.allclose(losses, ref_losses, rtol=1e-6, atol=0), (threads, rs)
            for scope in scopes:
                for p in params:
                    assert torch.allclose(scope.find_var(p), ref_scope.find_var(p), rtol=1e-6,
                                          atol=1e-9), (threads, rs, p)


def test_uneven_batch_is_split_as_evenly_as_possible():
    main, startup, loss = build_mlp(in_dim=4, hidden=(3,))
    pe = se.ParallelExecutor(se.cpu_places(3), main, startup, loss, scope=se.Scope())
    x = torch.randn(7, 4)
    y = torch.zeros(7, 1, dtype=torch.int64)
    # the image var is a batch var: fetched values come back concatenated in place order
    got, = pe.run(["img"], feed={"img": x, "label": y})
    assert torch.equal(got, x)
    per_place, = pe.run(["img"], feed={"img": x, "label": y}, return_merged=False)
    assert [v.shape[0] for v in per_place] == [3, 2, 2]
    with pytest.raises(se.FeedError, match="batch size 2 but there are 3 places"):
        pe.run([loss], feed={"img": x[:2], "label": y[:2]})
    pe.close()


def test_fetch_merging_and_per_place_feeds():
    main, startup, loss = build_mlp(in_dim=4, hidden=(3,))
    with se.ParallelExecutor(se.cpu_places(2), main, startup, loss, scope=se.Scope()) as pe:
        feeds = [{"img": torch.randn(2, 4), "label": torch.zeros(2, 1, dtype=torch.int64)}
                 for _ in range(2)]
        merged, = pe.run([loss], feed=feeds)
        per_place, = pe.run([loss], feed=feeds, return_merged=False)
        assert merged.shape == torch.Size([])
        assert len(per_place) == 2
        # parameters are identical on every place after the all-reduce, so place 0's is returned
        w, = pe.run(["fc_0.w_0"], feed=feeds, return_merged=False)
        assert torch.equal(w[0], w[1])
        with pytest.raises(se.FeedError, match="one dict per place"):
            pe.run([loss], feed=feeds[:1])
        with pytest.raises(se.FeedError, match="'label' was not fed"):
            pe.run([loss], feed={"img": torch.randn(4, 4)})


def test_local_scopes_start_identical_and_place0_shares_user_scope():
    main, startup, loss = build_mlp(in_dim=4, hidden=(3,))
    scope = se.Scope()
    with se.ParallelExecutor(se.cpu_places(3), main, startup, loss, scope=scope) as pe:
        for p in main.all_parameters():
            vals = [s.find_var(p.name) for s in pe.local_scopes]
            assert all(torch.equal(vals[0], v) for v in vals)
            assert vals[0] is scope.find_var(p.name)
            assert vals[1] is not vals[0]


def test_close_joins_every_thread():
    before = {t.ident for t in threading.enumerate()}
    main, startup, loss = build_mlp(in_dim=4, hidden=(3,))
    pe = se.ParallelExecutor(se.cpu_places(2), main, startup, loss, scope=se.Scope(),
                             exec_strategy=se.ExecutionStrategy(num_threads=6))
    pe.run([loss], feed={"img": torch.randn(4, 4), "label": torch.zeros(4, 1, dtype=torch.int64)})
    assert len({t.ident for t in threading.enumerate()} - before) == 5
    pe.close()
    pe.close()
    assert {t.ident for t in threading.enumerate()} - before == set()
    with pytest.raises(se.SSAExecError, match="closed"):
        pe.run([loss], feed={})


def test_intermediates_are_freed():
    main, startup, loss = build_mlp(in_dim=4, hidden=(3,))
    with se.ParallelExecutor(se.cpu_places(2), main, startup, loss, scope=se.Scope()) as pe:
        pe.run([loss], feed={"img": torch.randn(4, 4),
                             "label": torch.zeros(4, 1, dtype=torch.int64)})
        block = main.global_block()
        for scope in pe.local_scopes:
            left = [n for n in scope.var_names() if not block.var(n).persistable]
            assert left == []


def test_torch_threads_are_limited_and_restored():
    before = torch.get_num_threads()
    main, startup, loss = build_mlp(in_dim=4, hidden=(3,))
    pe = se.ParallelExecutor(se.cpu_places(2), main, startup, loss, scope=se.Scope(),
                             exec_strategy=se.ExecutionStrategy(torch_threads=1))
    assert torch.get_num_threads() == 1
    pe.close()
    assert torch.get_num_threads() == before


def test_batch_norm_keeps_per_place_statistics():
    main, startup, loss = build_cnn("float64", size=8, filters=(2,), batch_norm=True)
    x = torch.randn(4, 1, 8, 8, dtype=torch.float64)
    x[2:] += 3.0  # the two places see different data
    with se.ParallelExecutor(se.cpu_places(2), main, startup, loss, scope=se.Scope()) as pe:
        pe.run([loss], feed={"img": x, "label": torch.zeros(4, 1, dtype=torch.int64)})
        m0, m1 = (s.find_var("batch_norm_0.w_1") for s in pe.local_scopes)
        assert not torch.allclose(m0, m1)


@pytest.mark.parametrize("bucket_mb", [0.0005, 0.01, 25])
def test_fused_all_reduce_matches_unfused(bucket_mb):
    main, startup, loss = build_cnn("float64", make_optimizer("adam", 0.05), size=8,
                                    filters=(3, 4), batch_norm=False)
    xs, ys = _data(2, 2, [1, 8, 8], seed=7)
    ref_losses, ref_scope = _sequential(main, startup, loss, xs, ys)
    strategy = se.BuildStrategy(fuse_all_reduce_ops=True, fuse_bucket_mb=bucket_mb)
    graph = se.build_ssa_graph(main, se.cpu_places(2), strategy)
    graph.lint()
    buckets = [op.var_names for op in graph.collectives]
    assert sorted(n for b in buckets for n in b) == sorted(g for _, g in graph.param_grads())
    if bucket_mb == 25:
        assert len(buckets) == 1  # the whole model is smaller than the first bucket
    if bucket_mb == 0.0005:
        assert len(buckets) > 2
    scope = se.Scope()
    with se.ParallelExecutor(se.cpu_places(2), main, startup, loss, strategy, scope=scope) as pe:
        losses = torch.stack([pe.run([loss], feed={"img": x, "label": y})[0]
                              for x, y in zip(xs, ys, strict=True)])
        assert torch.allclose(losses, ref_losses, rtol=1e-6)
        for p in main.all_parameters():
            for s in pe.local_scopes:
                assert torch.allclose(s.find_var(p.name), ref_scope.find_var(p.name), rtol=1e-6,
                                      atol=1e-9)
