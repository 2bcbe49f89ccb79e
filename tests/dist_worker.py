"""One process of the multi-process tests (``tests/dist/test_world.py`` starts two).

Run as ``python tests/dist_worker.py SCENARIO OUT_DIR`` with torchrun's
environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT). Each rank writes what
it saw to ``OUT_DIR/rank<r>.pt``; the test compares. Importable too: the test
builds the same models and data from ``MODELS`` and ``make_data``.

Scenarios:

* ``train``: MLP and CNN (fused and not) trained 5 steps on this rank's shard of
  the global batches; then a mismatched program with the debug check on (a
  ``DistributedError`` on every rank, group intact), a startup mismatch (the
  same), and finally rank 1 raises in a step: rank 1 gets the ``OpError``,
  rank 0 a ``DistributedError`` at once.
* ``kill``: trains until rank ``$VICTIM`` prints ``STALLING`` and sleeps (the
  test SIGKILLs it); the other rank's ``DistributedError`` is left uncaught, so
  it exits 1.
* ``raise`` (under torchrun): rank 1's step raises an uncaught ``OpError``;
  rank 0's ``DistributedError`` is uncaught too; torchrun exits non-zero.
* ``strategies``: the MLP trained with each of ``STRATEGY_RUNS``' build strategies
  (gradient accumulation, bf16-compressed all-reduce).
"""

import os
import sys
import time

import torch

STEPS = 5
PLACES_PER_PROCESS = 2
PER_PLACE = 3
TIMEOUT = 20.0


def _mlp(opt):
    from ssaexec.program.example_models import build_mlp
    return build_mlp("float64", opt, in_dim=12, hidden=(10, 8))


def _cnn(opt):
    from ssaexec.program.example_models import build_cnn
    return build_cnn("float64", opt, size=8, filters=(3, 4), batch_norm=False)


MODELS = {"mlp": (_mlp, [12]), "cnn": (_cnn, [1, 8, 8])}


def make_data(shape, total_places, seed=0):
    """STEPS global batches of ``total_places * PER_PLACE`` samples (the same in every process)."""
    g = torch.Generator().manual_seed(seed)
    b = total_places * PER_PLACE
    xs = [torch.randn([b, *shape], dtype=torch.float64, generator=g) for _ in range(STEPS)]
    ys = [torch.randint(0, 10, (b, 1), generator=g) for _ in range(STEPS)]
    return xs, ys


def build(model, opt_name="momentum"):
    from ssaexec.program.example_models import make_optimizer
    fn, shape = MODELS[model]
    main, startup, loss = fn(make_optimizer(opt_name, 0.05))
    return main, startup, loss, shape


def _train(se, model, fused, record):
    world = se.distributed.world_size()
    main, startup, loss, shape = build(model)
    xs, ys = make_data(shape, world * PLACES_PER_PROCESS)
    strategy = se.distributed.build_strategy(fuse_all_reduce_ops=fused, fuse_bucket_mb=0.0005)
    scope = se.Scope()
    with se.ParallelExecutor(se.distributed.local_places(PLACES_PER_PROCESS), main, startup,
                             loss, strategy, scope=scope) as pe:
        assert pe.distributed and pe.build_strategy.num_trainers == world
        local, averaged = [], []
        for x, y in zip(xs, ys, strict=True):
            feed = se.distributed.shard_batch({"img": x, "label": y})
            lv, = pe.run([loss], feed=feed)
            local.append(lv)
            averaged.append(se.distributed.average(lv))
        params = {}
        for p in main.all_parameters():
            vals = [s.find_var(p.name) for s in pe.local_scopes]
            assert all(torch.equal(vals[0], v) for v in vals[1:]), p.name
            params[p.name] = vals[0].clone()
        graph = pe.graph([loss])
        n_collectives = len(graph.collectives)
        waits = [h.start.id for h in graph.ops_of_kind("all_reduce_wait")]
    record[f"{model}{'_fused' if fused else ''}"] = {
        "local_losses": torch.stack(local), "losses": torch.stack(averaged), "params": params,
        "collectives": n_collectives, "waits": sorted(waits),
        "starts": sorted(h.id for h in graph.collectives)}


# build-strategy options the "strategies" scenario runs across processes
STRATEGY_RUNS = {"accumulate": {"gradient_accumulation_steps": 2},
                 "bf16_wire": {"allreduce_dtype": "bf16"}}


def train_with(se, options, distributed):
    """MLP parameters after STEPS runs with BuildStrategy ``options``: 2 processes x 2
    places (``distributed``), or 1 process x 4 places on the same global batches."""
    main, startup, loss, shape = build("mlp")
    xs, ys = make_data(shape, 2 * PLACES_PER_PROCESS)
    if distributed:
        places = se.distributed.local_places(PLACES_PER_PROCESS)
        strategy = se.distributed.build_strategy(**options)
    else:
        places, strategy = se.cpu_places(2 * PLACES_PER_PROCESS), se.BuildStrategy(**options)
    with se.ParallelExecutor(places, main, startup, loss, strategy, scope=se.Scope()) as pe:
        for x, y in zip(xs, ys, strict=True):
            feed = {"img": x, "label": y}
            pe.run([loss], feed=se.distributed.shard_batch(feed) if distributed else feed)
        return {p.name: pe.local_scopes[0].find_var(p.name).clone()
                for p in main.all_parameters()}


def _expect(exc_type, fn):
    t0 = time.perf_counter()
    try:
        fn()
    except exc_type as e:
        return {"type": type(e).__name__, "message": str(e), "seconds": time.perf_counter() - t0}
    except BaseException as e:  # noqa: BLE001 - reported to the test, which fails on it
        return {"type": type(e).__name__, "message": str(e), "seconds": time.perf_counter() - t0,
                "unexpected": True}
    return {"type": None, "message": "no error", "seconds": time.perf_counter() - t0}


def _debug_mismatch(se, rank):
    """Rank 1 freezes the first layer: same persistables, fewer collectives."""
    import ssaexec.program.layers as L
    main, startup = se.Program(0), se.Program(0)
    with se.program_guard(main, startup):
        x = L.data("img", [-1, 12], "float64")
        y = L.data("label", [-1, 1], "int64")
        h = L.fc(x, 10, act="relu")
        logits = L.fc(h, 10)
        loss = L.mean(L.softmax_with_cross_entropy(logits, y))
        params = [p.name for p in main.all_parameters()]
        trained = params if rank == 0 else params[2:]
        se.optimizer.SGD(0.1).minimize(loss, parameter_list=trained)
    xs, ys = make_data([12], 4)
    os.environ[se.distributed.DEBUG_ENV] = "1"
    try:
        # one all-reduce per gradient (not the default buckets), so the sequences differ
        # from a known position on
        with se.ParallelExecutor(se.distributed.local_places(PLACES_PER_PROCESS), main,
                                 startup, loss.name, scope=se.Scope(),
                                 build_strategy=se.distributed.build_strategy(
                                     fuse_all_reduce_ops=False)) as pe:
            return _expect(se.DistributedError, lambda: pe.run(
                [loss.name], feed=se.distributed.shard_batch({"img": xs[0], "label": ys[0]})))
    finally:
        del os.environ[se.distributed.DEBUG_ENV]


def _startup_mismatch(se, rank):
    from ssaexec.program.example_models import build_mlp
    main, startup, loss = build_mlp("float64", in_dim=12, hidden=(10, 8 if rank == 0 else 9))
    return _expect(se.DistributedError, lambda: se.ParallelExecutor(
        se.distributed.local_places(PLACES_PER_PROCESS), main, startup, loss, scope=se.Scope()))


def _peer_hangs(se, rank):
    """Rank 1 never joins an all-reduce on a side group: rank 0 times out (after 2 s)."""
    import datetime

    import torch.distributed as dist

    from ssaexec.dist.group_collective import ProcessGroupCollective
    side = ProcessGroupCollective(dist.new_group(timeout=datetime.timedelta(seconds=2)),
                                  timeout=2)
    if rank == 0:
        return _expect(se.DistributedError, lambda: side.all_reduce(
            [torch.ones(3), torch.ones(3)], label="all_reduce(hung)"))
    return None


def _raise_in_step(se, rank, record):
    main, startup, loss, shape = build("mlp")
    xs, ys = make_data(shape, 4)
    pe = se.ParallelExecutor(se.distributed.local_places(PLACES_PER_PROCESS), main, startup,
                             loss, scope=se.Scope())
    try:
        pe.run([loss], feed=se.distributed.shard_batch({"img": xs[0], "label": ys[0]}))
        feed = se.distributed.shard_batch({"img": xs[1], "label": ys[1]})
        if rank == 1:
            time.sleep(0.5)  # rank 0 is waiting in the first all-reduce by now
            feed["label"] = torch.full_like(feed["label"], 99)  # out of range: the loss op fails
            record["raise"] = _expect(se.OpError, lambda: pe.run([loss], feed=feed))
            record["after"] = _expect(se.DistributedError, lambda: pe.run([loss], feed=feed))
        else:
            record["raise"] = _expect(se.DistributedError, lambda: pe.run([loss], feed=feed))
    finally:
        pe.close()


def main(scenario, out_dir):
    from ssaexec.harness.worker import die_with_parent
    die_with_parent()  # never outlive the test (or torchrun) that started this process
    import ssaexec as se
    import ssaexec.dist.world  # noqa: F401 - until ssaexec/__init__ exports it
    if not hasattr(se, "distributed"):
        se.distributed = sys.modules["ssaexec.dist.world"]
    info = se.distributed.init(backend="gloo", timeout=TIMEOUT)
    rank = info.rank
    record = {"rank": rank, "world_size": info.world_size, "backend": info.backend}
    path = os.path.join(out_dir, f"rank{rank}.pt")
    if scenario == "train":
        for model, fused in (("mlp", False), ("cnn", False), ("cnn", True)):
            if model == "mlp":
                os.environ[se.distributed.DEBUG_ENV] = "1"  # no false alarm on a good program
            try:
                _train(se, model, fused, record)
            finally:
                os.environ.pop(se.distributed.DEBUG_ENV, None)
        record["debug_mismatch"] = _debug_mismatch(se, rank)
        record["startup_mismatch"] = _startup_mismatch(se, rank)
        main_, startup, loss, _ = build("mlp")
        record["reduce_rejected"] = _expect(se.DistributedError, lambda: se.ParallelExecutor(
            se.distributed.local_places(PLACES_PER_PROCESS), main_, startup, loss,
            se.distributed.build_strategy(reduce_strategy="reduce"), scope=se.Scope()))
        # the group survived both checks: a collective still works
        record["after_checks"] = float(se.distributed.average(float(rank)))
        record["hang"] = _peer_hangs(se, rank)
        _raise_in_step(se, rank, record)
        torch.save(record, path)
    elif scenario == "strategies":
        for name, options in STRATEGY_RUNS.items():
            record[name] = train_with(se, options, distributed=True)
        torch.save(record, path)
    elif scenario == "kill":
        import threading
        victim = int(os.environ.get("VICTIM", "1"))
        main_, startup, loss, shape = build("mlp")
        xs, ys = make_data(shape, 4)
        pe = se.ParallelExecutor(se.distributed.local_places(PLACES_PER_PROCESS), main_, startup,
                                 loss, scope=se.Scope())
        for step in range(1000):
            if rank == victim and step == 2:
                print("STALLING", flush=True)
                time.sleep(120)  # the test kills this process here
            k = step % STEPS
            t0 = time.perf_counter()
            try:
                pe.run([loss], feed=se.distributed.shard_batch({"img": xs[k], "label": ys[k]}))
            except se.DistributedError:
                print(f"RAISED after {time.perf_counter() - t0:.2f}s", flush=True)
                pe.close()
                # this thread and the executor's workers still alive (Inductor's compile
                # pool, under make test-inductor, is not the executor's; nor is the
                # process's one background compile thread of compiler="auto", a daemon)
                ours = [t for t in threading.enumerate() if t.name.startswith("ssaexec")
                        and t.name != "ssaexec-compile"]
                print(f"THREADS {1 + len(ours)}", flush=True)
                raise  # uncaught: the process exits 1, as it would under torchrun
    elif scenario == "raise":
        with open(os.path.join(out_dir, f"pid{rank}"), "w") as f:
            f.write(str(os.getpid()))
        main_, startup, loss, shape = build("mlp")
        xs, ys = make_data(shape, 4)
        pe = se.ParallelExecutor(se.distributed.local_places(PLACES_PER_PROCESS), main_, startup,
                                 loss, scope=se.Scope())
        for step in range(STEPS):
            feed = se.distributed.shard_batch({"img": xs[step], "label": ys[step]})
            if rank == 1 and step == 1:
                feed["label"] = torch.full_like(feed["label"], 99)
            pe.run([loss], feed=feed)  # rank 1: OpError, rank 0: DistributedError, uncaught
    else:
        raise SystemExit(f"unknown scenario {scenario!r}")


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main(sys.argv[1], sys.argv[2])
