"""The scheduler on random DAGs: every op runs once, after all its producers; no leaks."""

import random
import signal
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ssaexec.core.errors import GraphError
from ssaexec.runtime import interrupt
from ssaexec.runtime.scheduler import DependencyPlan, Scheduler


@st.composite
def dags(draw):
    n = draw(st.integers(1, 40))
    producers = []
    for i in range(n):
        k = draw(st.integers(0, min(i, 4)))
        producers.append(draw(st.lists(st.integers(0, i - 1), min_size=k, max_size=k,
                                       unique=True)) if i else [])
    is_comm = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    return n, producers, is_comm


def _logging_fns(n, log, rng):
    sleeps = [rng.choice([0, 0, 0, 1e-5, 1e-4, 5e-4]) for _ in range(n)]

    def make(i):
        def fn():
            start = time.perf_counter()
            if sleeps[i]:
                time.sleep(sleeps[i])
            log.append((i, start, time.perf_counter()))
        return fn
    return [make(i) for i in range(n)]


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(dags(), st.integers(1, 8), st.integers(0, 2**32 - 1))
def test_every_op_runs_once_after_its_producers(dag, threads, seed):
    n, producers, is_comm = dag
    plan = DependencyPlan(n, producers, is_comm)
    sched = Scheduler(threads)
    rng = random.Random(seed)
    try:
        for _ in range(8):
            log = []
            sched.run(plan, _logging_fns(n, log, rng))
            assert sorted(i for i, _, _ in log) == list(range(n))
            times = {i: (s, e) for i, s, e in log}
            for i, ps in enumerate(producers):
                for p in ps:
                    assert times[p][1] <= times[i][0], f"op {i} started before producer {p} ended"
    finally:
        sched.close()


def test_no_thread_left_after_close():
    before = set(threading.enumerate())
    sched = Scheduler(8)
    plan = DependencyPlan(20, [[]] * 20)
    for _ in range(50):
        sched.run(plan, [lambda: None] * 20)
    assert len(set(threading.enumerate()) - before) == 7
    sched.close()
    assert set(threading.enumerate()) - before == set()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("threads", [1, 2, 8])
def test_first_error_is_raised_and_next_run_works(threads):
    n = 30
    plan = DependencyPlan(n, [[i - 1] if i % 3 else [] for i in range(n)])
    ran = []

    def ok(i):
        return lambda: ran.append(i)

    def boom(msg):
        def fn():
            time.sleep(0.01 if msg == "second" else 0)
            raise ValueError(msg)
        return fn

    fns = [ok(i) for i in range(n)]
    fns[4] = boom("first")
    fns[20] = boom("second")
    sched = Scheduler(threads)
    try:
        with pytest.raises(ValueError) as ei:
            sched.run(plan, fns)
        assert str(ei.value) in ("first", "second")
        assert 5 not in ran  # the successor of the failed op never ran
        ran.clear()
        sched.run(plan, [ok(i) for i in range(n)])
        assert sorted(ran) == list(range(n))
    finally:
        sched.close()


def test_cycles_are_rejected():
    with pytest.raises(GraphError, match="cycle"):
        DependencyPlan(3, [[2], [0], [1]])


def test_runs_cannot_overlap():
    sched = Scheduler(2)
    inner_error = []

    def reenter():
        try:
            sched.run(DependencyPlan(1, [[]]), [lambda: None])
        except Exception as e:  # noqa: BLE001
            inner_error.append(e)

    sched.run(DependencyPlan(1, [[]]), [reenter])
    sched.close()
    assert inner_error and "already running" in str(inner_error[0])


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("press_at", [2, 5])
def test_a_held_ctrl_c_stops_before_the_commit_phase_never_inside_it(threads, press_at):
    """Ops 0-3 compute, 4-7 commit (each waits for 0-3). A Ctrl-C held back while op
    ``press_at`` runs stops the run before the commit phase, or lets a begun one finish."""
    n = 8
    producers = [[], [0], [1], [2]] + [[0, 1, 2, 3]] * 4
    plan = DependencyPlan(n, producers, commit=[i >= 4 for i in range(n)])
    ran = []

    def op(i):
        def fn():
            ran.append(i)
            if i == press_at:
                interrupt._HOLD.pending = True  # as the held-back handler does
        return fn
    sched = Scheduler(threads)
    # Ctrl-C as a terminal delivers it (a background job starts with SIGINT ignored)
    prev = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt) as ei:
            with interrupt.hold():
                sched.run(plan, [op(i) for i in range(n)])
        if press_at < 4:
            assert sorted(ran) == list(range(press_at + 1))  # nothing after the press
            assert not sched.commit_began
        else:
            assert sorted(ran) == list(range(n))  # the commit phase completed
            assert sched.commit_began
            assert "completed on every place" in "".join(ei.value.__notes__)
        assert not interrupt._HOLD.pending
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, prev)
        sched.close()


def test_turns_run_a_lock_free_op_beside_the_caller_and_the_rest_in_it():
    # a diamond per place: roots 0 and 1 (lock free), then 2 needs both, 3 after 2
    plan = DependencyPlan(4, [[], [], [0, 1], [2]])
    caller = threading.get_ident()
    where = {}

    def make(i):
        return lambda: where.setdefault(i, threading.get_ident())

    sched = Scheduler(3)
    try:
        for lock_free in ([True, True, False, False], [False, False, False, False]):
            where.clear()
            sched.run(plan, [make(i) for i in range(4)], inline=True, lock_free=lock_free)
            assert sorted(where) == [0, 1, 2, 3]
            beside = [i for i, t in where.items() if t != caller]
            # one lock-free op goes to the pool while the caller runs the other; without
            # a flag, or as the last op ready, everything stays in the caller's thread
            assert beside == ([0] if lock_free[0] else [])
    finally:
        sched.close()


@pytest.mark.timeout(30)
def test_an_error_in_turns_is_raised_after_the_op_beside_ends():
    plan = DependencyPlan(4, [[], [], [0, 1], [2]])
    ended, ran = threading.Event(), []

    def boom():
        raise ValueError("beside")

    def slow():
        time.sleep(0.05)  # (likely) still running beside when the caller's op fails
        ended.set()

    sched = Scheduler(3)
    try:
        with pytest.raises(ValueError, match="beside"):
            sched.run(plan, [slow, boom, lambda: ran.append(2), lambda: ran.append(3)],
                      inline=True, lock_free=[True, False, False, False])
        assert ended.is_set() and ran == []  # waited for; the successors never ran
        sched.run(plan, [lambda: ran.append(i) for i in range(4)], inline=True,
                  lock_free=[True, True, False, False])
        assert len(ran) == 4  # the next run works
    finally:
        sched.close()


def test_an_error_of_the_op_beside_is_raised_by_the_run():
    plan = DependencyPlan(3, [[], [], [0, 1]])
    ran = []

    def boom():
        raise ValueError("beside")

    sched = Scheduler(2)
    try:
        with pytest.raises(ValueError, match="beside"):
            sched.run(plan, [boom, lambda: ran.append(1), lambda: ran.append(2)],
                      inline=True, lock_free=[True, False, False])
        assert ran == [1]  # the caller's op ran; their successor never did
    finally:
        sched.close()
