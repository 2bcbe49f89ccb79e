"""``ParallelExecutor.observe``: observed steps run the readable per-op path, and the
caller's ``ExecutionStrategy`` object is never written (other executors and threads may
share and read it)."""

import threading

import torch

import ssaexec as se
from ssaexec.program.example_models import build_mlp, make_optimizer


def _model():
    main, startup, loss = build_mlp("float32", make_optimizer("sgd", 0.1), in_dim=6,
                                    hidden=(4,), classes=3)
    feed = {"img": torch.randn(4, 6), "label": torch.randint(0, 3, (4, 1))}
    return main, startup, loss, feed


def test_observe_leaves_a_shared_strategy_unchanged_and_runs_the_readable_path():
    main, startup, loss, feed = _model()
    strategy = se.ExecutionStrategy()  # shared by two executors
    assert strategy.compiled is True
    with se.ParallelExecutor(se.cpu_places(2), main, startup, loss, scope=se.Scope(),
                             exec_strategy=strategy) as pe, \
            se.ParallelExecutor(se.cpu_places(2), main, startup, loss, scope=se.Scope(),
                                exec_strategy=strategy) as other:
        pe.run([loss], feed=feed)
        seen, during = [], []
        with pe.observe([loss], lambda op, ident, t0, t1: seen.append(op.id)) as graph:
            during.append(strategy.compiled)
            assert pe.exec_strategy is strategy
            for _ in range(2):
                pe.run([loss], feed=feed)
                during.append(strategy.compiled)
            # the other executor still runs compiled, and is not observed
            other.run([loss], feed=feed)
            assert other._runner((loss,)).lowering.compiled
            # this one's observed steps: the readable runner, one call per op handle
            runner = pe._runner((loss,))
            assert not runner.lowering.compiled and runner.graph is graph
        assert during == [True, True, True]
        assert strategy.compiled is True and pe.exec_strategy.compiled is True
        assert sorted(seen) == sorted(2 * [op.id for op in graph.ops])
        n = len(seen)
        pe.run([loss], feed=feed)  # no longer observed, and compiled again
        assert len(seen) == n
        assert pe._runner((loss,)).lowering.compiled


def test_a_reader_thread_never_sees_the_strategy_change_while_observing():
    main, startup, loss, feed = _model()
    strategy = se.ExecutionStrategy()
    stop, values = threading.Event(), set()

    def read():
        while not stop.is_set():
            values.add(strategy.compiled)
    reader = threading.Thread(target=read)
    with se.ParallelExecutor(se.cpu_places(2), main, startup, loss, scope=se.Scope(),
                             exec_strategy=strategy) as pe:
        reader.start()
        try:
            for _ in range(3):
                with pe.observe([loss], lambda *_: None):
                    pe.run([loss], feed=feed)
        finally:
            stop.set()
            reader.join()
    assert values == {True}


def test_observe_restores_the_compiled_path_after_an_error_inside():
    main, startup, loss, feed = _model()
    with se.ParallelExecutor(se.cpu_places(2), main, startup, loss,
                             scope=se.Scope()) as pe:
        try:
            with pe.observe([loss], lambda *_: None):
                raise KeyError("inside")
        except KeyError:
            pass
        assert pe.exec_strategy.compiled is True
        pe.run([loss], feed=feed)
        assert pe._runner((loss,)).lowering.compiled


def test_observed_and_compiled_steps_agree():
    main, startup, loss, feed = _model()
    losses = []
    for observe in (False, True):
        torch.manual_seed(0)
        with se.ParallelExecutor(se.cpu_places(2), main, startup, loss,
                                 scope=se.Scope()) as pe:
            if observe:
                with pe.observe([loss], lambda *_: None):
                    losses.append([pe.run([loss], feed=feed)[0] for _ in range(3)])
            else:
                losses.append([pe.run([loss], feed=feed)[0] for _ in range(3)])
    for a, b in zip(*losses, strict=True):
        torch.testing.assert_close(a, b)
