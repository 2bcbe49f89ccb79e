"""Faults during a ParallelExecutor run: a bounded-time OpError, intact state, reusable."""

import os
import random
import signal
import threading
import time

import pytest
import torch

import ssaexec as se
from ssaexec.models import make_optimizer
from ssaexec.ops.registry import register_op

POISON = 12345.0


def _maybe_fail(ins, attrs):
    """Out = X, but raise if X holds the poison value (so only the poisoned place fails)."""
    x = ins["X"]
    if x.device.type != "meta" and bool((x == POISON).any()):
        raise RuntimeError("poisoned sample")
    if attrs["sleep"]:
        time.sleep(attrs["sleep"])
    return {"Out": x.clone()}


register_op("_test_maybe_fail", ["X"], ["Out"], {"sleep": ("float", 0.0)})(_maybe_fail)


def _program(sleep=0.0):
    main, startup = se.Program(), se.Program()
    with se.program_guard(main, startup):
        x = se.layers.data("x", [-1, 6], "float64")
        y = se.layers.data("label", [-1, 1], "int64")
        h = se.layers.fc(x, 8, act="relu")
        _, outs = se.program.builder.append_op("_test_maybe_fail", {"X": h},
                                               attrs={"sleep": sleep})
        logits = se.layers.fc(outs["Out"][0], 10)
        loss = se.layers.mean(se.layers.softmax_with_cross_entropy(logits, y))
        make_optimizer("momentum", 0.1).minimize(loss)
    return main, startup, loss.name


def _snapshot(pe, main):
    names = [v.name for v in main.global_block().vars.values() if v.persistable]
    return [{n: s.find_var(n).clone() for n in names} for s in pe.local_scopes]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("threads", [1, 3, 8])
def test_random_fault_gives_op_error_and_leaves_parameters_intact(threads):
    rng = random.Random(threads)
    main, startup, loss = _program()
    n = 3
    pe = se.ParallelExecutor(se.cpu_places(n), main, startup, loss, scope=se.Scope(),
                             exec_strategy=se.ExecutionStrategy(num_threads=threads))
    try:
        for _ in range(6):
            bad_step, bad_place = rng.randrange(3), rng.randrange(n)
            for step in range(3):
                x = torch.randn(n * 2, 6, dtype=torch.float64)
                y = torch.randint(0, 10, (n * 2, 1))
                if step != bad_step:
                    lv, = pe.run([loss], feed={"x": x, "label": y})
                    assert torch.isfinite(lv)
                    continue
                # A zero input row makes the hidden layer equal its bias; setting the bad
                # place's bias to the poison value makes exactly that place's op fail.
                x[bad_place * 2] = 0
                bias = pe.local_scopes[bad_place].find_var("fc_0.b_0")
                saved = bias.clone()
                bias.fill_(POISON)
                before = _snapshot(pe, main)
                t0 = time.perf_counter()
                with pytest.raises(se.OpError) as ei:
                    pe.run([loss], feed={"x": x, "label": y})
                assert time.perf_counter() - t0 < 30
                assert "_test_maybe_fail" in str(ei.value)
                assert f"cpu:{bad_place}" in str(ei.value)
                assert isinstance(ei.value.__cause__, RuntimeError)
                after = _snapshot(pe, main)
                for pb, pa in zip(before, after, strict=True):
                    for name in pb:
                        assert torch.equal(pb[name], pa[name]), name
                bias.copy_(saved)
    finally:
        pe.close()


@pytest.mark.timeout(60)
def test_ctrl_c_stops_the_run_cleanly():
    main, startup, loss = _program(sleep=0.2)
    before = set(threading.enumerate())
    pe = se.ParallelExecutor(se.cpu_places(2), main, startup, loss, scope=se.Scope(),
                             exec_strategy=se.ExecutionStrategy(num_threads=3))
    feed = {"x": torch.randn(4, 6, dtype=torch.float64),
            "label": torch.randint(0, 10, (4, 1))}
    timer = threading.Timer(0.1, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        pe.run([loss], feed=feed)
    timer.join()
    # the executor still works afterwards
    lv, = pe.run([loss], feed=feed)
    assert torch.isfinite(lv)
    pe.close()
    assert set(threading.enumerate()) - before == set()
