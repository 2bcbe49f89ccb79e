"""Faults during a ParallelExecutor run: a bounded-time OpError, intact state, reusable."""

import gc
import os
import random
import signal
import threading
import time
import weakref

import pytest
import torch

import ssaexec as se
from ssaexec.program.example_models import make_optimizer
from ssaexec.ops.registry import register_op
from ssaexec.runtime import interrupt

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


# --- Ctrl-C -----------------------------------------------------------------------------
# An op presses Ctrl-C (SIGINT to this process) from inside a step, from whichever thread
# runs it, and waits until the held-back press has been seen: no timer, no sleep decides
# where in the step it lands.

_PRESS = {"left": 0, "gc": False, "wait": True, "garbage": None}
_PRESS_LOCK = threading.Lock()


def _press_ctrl_c(ins, attrs):
    """Out = X; the first call after arming presses Ctrl-C (or collects garbage whose
    finalizer presses it) and returns once the press is pending."""
    x = ins["X"]
    if x.device.type == "meta":
        return {"Out": x.clone()}
    with _PRESS_LOCK:
        press = _PRESS["left"] > 0
        _PRESS["left"] -= press
    if press:
        if _PRESS["gc"]:
            _PRESS["garbage"] = None  # the last reference: only a collection frees it now
            gc.collect()  # runs its finalizer, in this thread
        else:
            os.kill(os.getpid(), signal.SIGINT)
        deadline = time.monotonic() + 60
        while _PRESS["wait"] and not interrupt._HOLD.pending and time.monotonic() < deadline:
            time.sleep(0.001)  # the main thread runs the handler between two bytecodes
    return {"Out": x.clone()}


register_op("_test_press_ctrl_c", ["X"], ["Out"])(_press_ctrl_c)


@pytest.fixture
def terminal_ctrl_c():
    """Ctrl-C as a terminal delivers it. A shell starts background jobs with SIGINT ignored
    (then Python installs no handler and nothing is held back), so CI may run us so."""
    prev = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, prev)


def _press_program(commit_phase=False):
    """The fault program with a pressing op in the forward pass or, with
    ``commit_phase``, after the updates (it reads an updated parameter)."""
    main, startup = se.Program(), se.Program()
    with se.program_guard(main, startup):
        x = se.layers.data("x", [-1, 6], "float64")
        y = se.layers.data("label", [-1, 1], "int64")
        h = se.layers.fc(x, 8, act="relu")
        if not commit_phase:
            _, outs = se.program.builder.append_op("_test_press_ctrl_c", {"X": h})
            h = outs["Out"][0]
        logits = se.layers.fc(h, 10)
        loss = se.layers.mean(se.layers.softmax_with_cross_entropy(logits, y))
        make_optimizer("momentum", 0.1).minimize(loss)
        if commit_phase:
            block = main.global_block()
            block.create_var("w_seen", shape=[6, 8], dtype="float64")
            block.append_op("_test_press_ctrl_c", {"X": ["fc_0.w_0"]}, {"Out": ["w_seen"]},
                            role="optimize")
    return main, startup, loss.name


def _press_executor(main, startup, loss, threads, compiled):
    return se.ParallelExecutor(se.cpu_places(2), main, startup, loss, scope=se.Scope(),
                               exec_strategy=se.ExecutionStrategy(num_threads=threads,
                                                                  compiled=compiled))


def _feed():
    return {"x": torch.randn(4, 6, dtype=torch.float64), "label": torch.randint(0, 10, (4, 1))}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("via_gc", [False, True])
def test_ctrl_c_stops_the_run_cleanly(threads, compiled, via_gc, terminal_ctrl_c):
    main, startup, loss = _press_program()
    before = set(threading.enumerate())
    pe = _press_executor(main, startup, loss, threads, compiled)
    feed = _feed()
    pe.run([loss], feed=feed)
    state = _snapshot(pe, main)
    if via_gc:
        # garbage whose finalizer presses Ctrl-C: Python drops an exception raised in a
        # finalizer, so the step must hold the press back to honour it
        class Garbage:
            pass
        g = Garbage()
        g.cycle = g
        weakref.finalize(g, os.kill, os.getpid(), signal.SIGINT)
        _PRESS["garbage"] = g  # kept until the op drops it: no earlier collection frees it
        del g
    _PRESS.update(left=1, gc=via_gc)
    try:
        with pytest.raises(KeyboardInterrupt):
            pe.run([loss], feed=feed)
    finally:
        _PRESS.update(left=0, gc=False, garbage=None)
    assert pe.runs == 1
    for pb, pa in zip(state, _snapshot(pe, main), strict=True):
        for name in pb:
            assert torch.equal(pb[name], pa[name]), name
    # the executor still works afterwards, and Ctrl-C is Python's again
    lv, = pe.run([loss], feed=feed)
    assert torch.isfinite(lv)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back
    pe.close()
    # none of the executor's threads outlives it (a first compile under make test-inductor
    # starts Inductor's own pool, which stays for the process, as torch.compile's does)
    assert {t for t in set(threading.enumerate()) - before
            if not t.name.startswith(("ThreadPoolExecutor", "tqdm_monitor"))} == set()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("compiled", [True, False])
def test_ctrl_c_in_the_commit_phase_completes_the_step_everywhere(compiled, terminal_ctrl_c):
    main, startup, loss = _press_program(commit_phase=True)
    pe = _press_executor(main, startup, loss, 3, compiled)
    feed = _feed()
    pe.run([loss], feed=feed)
    state = _snapshot(pe, main)
    _PRESS.update(left=1, gc=False)
    try:
        with pytest.raises(KeyboardInterrupt) as ei:
            pe.run([loss], feed=feed)
    finally:
        _PRESS.update(left=0)
    assert "completed on every place" in "".join(getattr(ei.value, "__notes__", []))
    after = _snapshot(pe, main)
    assert not torch.equal(state[0]["fc_0.w_0"], after[0]["fc_0.w_0"])  # the step was applied
    for name in after[0]:
        assert torch.equal(after[0][name], after[1][name]), name  # ... on both places
    pe.close()


def test_a_custom_sigint_handler_is_left_alone():
    main, startup, loss = _press_program()
    pe = _press_executor(main, startup, loss, 3, True)
    seen = []
    prev = signal.signal(signal.SIGINT, lambda *a: seen.append(a[0]))
    try:
        _PRESS.update(left=1, gc=False, wait=False)
        # the press is the program's own handler's business: the step runs on
        lv, = pe.run([loss], feed=_feed())
        interrupt_pending = interrupt._HOLD.pending
        deadline = time.monotonic() + 60
        while not seen and time.monotonic() < deadline:
            time.sleep(0.001)  # the handler runs in the main thread, here
    finally:
        _PRESS.update(left=0, wait=True)
        signal.signal(signal.SIGINT, prev)
        pe.close()
    assert not interrupt_pending and seen == [signal.SIGINT]
    assert torch.isfinite(lv)
