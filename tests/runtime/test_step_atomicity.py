"""A failed step changes nothing on any place; feeds follow a policy; dropout is reproducible.

Faults are injected by a real op (``_test_fault_point``) placed after every op of
the forward and backward passes; it raises on one chosen (point, place) and
passes through everywhere else, so each trial fails at a random op on a random
place while the other places run on.
"""

import random

import pytest
import torch

import ssaexec as se
from ssaexec.core.errors import FeedError, OpError
from ssaexec.ops.registry import register_op

_TARGET = [None]  # (fault point id, place value) that raises; None: nobody


def _fault_point(ins, attrs):
    """Out = nothing; raises when this point and this place are the target."""
    target = _TARGET[0]
    x = ins["Place"]
    if target is not None and x.device.type != "meta" and target[0] == attrs["point"] \
            and int(x.reshape(-1)[0]) == target[1]:
        raise RuntimeError(f"injected fault at point {attrs['point']}")
    return {"Out": torch.zeros(1, dtype=torch.float64, device=x.device)}


register_op("_test_fault_point", ["Place", "After!"], ["Out"], {"point": ("int", 0)},
            infer=lambda ins, attrs: {"Out": ([1], "float64")}, grad=None)(_fault_point)


def _model():
    """An MLP with batch norm, dropout and Adam, and the per-place ``place_id`` var."""
    main, startup = se.Program(7), se.Program(7)
    with se.program_guard(main, startup):
        x = se.layers.data("x", [-1, 6], "float64")
        y = se.layers.data("label", [-1, 1], "int64")
        h = se.layers.batch_norm(se.layers.fc(x, 8, act="relu"))
        h = se.layers.dropout(h, 0.3)
        loss = se.layers.mean(se.layers.softmax_with_cross_entropy(se.layers.fc(h, 4), y))
        se.optimizer.Adam(0.01).minimize(loss)
    block = main.global_block()
    block.create_var("place_id", shape=[1], dtype="int64", persistable=True)
    return main, startup, loss, block


def _program():
    main, startup, loss, block = _model()
    ops = list(block.ops)
    first_update = next(i for i, op in enumerate(ops) if op.role == "optimize")
    # a fault point after every forward and backward op (reading what it wrote)
    new_ops, points = [], 0
    for i, op in enumerate(ops):
        new_ops.append(op)
        if i < first_update and op.output_names():
            name = f"fault_{points}"
            block.create_var(name, shape=[1], dtype="float64")
            fp = se.program.desc.OpDesc("_test_fault_point",
                                        {"Place": ["place_id"], "After": [op.output_names()[0]]},
                                        {"Out": [name]}, {"point": points},
                                        role="backward" if op.role == "loss" else op.role)
            new_ops.append(fp)
            points += 1
    block.ops = new_ops  # replaces them all and bumps the version (ssaexec.program.desc)
    return main, startup, loss.name, points


def _state(pe, main):
    names = sorted(v.name for v in main.global_block().vars.values()
                   if v.persistable and v.name != "place_id")
    return [{n: s.find_var(n).clone() for n in names} for s in pe.local_scopes]


def _executor(main, startup, loss, n, threads=None):
    pe = se.ParallelExecutor(se.cpu_places(n), main, startup, loss, scope=se.Scope(),
                             exec_strategy=se.ExecutionStrategy(num_threads=threads))
    for i, ls in enumerate(pe.local_scopes):
        ls.set_var("place_id", torch.tensor([i]))
    return pe


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("n_places", [2, 4])
def test_random_faults_never_leave_places_apart(n_places):
    """1000 steps, each failing at a random op on a random place: no place keeps anything."""
    main, startup, loss, points = _program()
    rng = random.Random(n_places)
    pe = _executor(main, startup, loss, n_places, threads=n_places + 1)
    ref = _executor(main, startup, loss, n_places, threads=1)  # never fails
    data = [(torch.randn(2 * n_places, 6, dtype=torch.float64),
             torch.randint(0, 4, (2 * n_places, 1))) for _ in range(4)]
    params = [v.name for v in main.all_parameters()]
    divergent = failures = 0
    try:
        for trial in range(1000):
            x, y = data[trial % len(data)]
            before = _state(pe, main)
            _TARGET[0] = (rng.randrange(points), rng.randrange(n_places))
            with pytest.raises(OpError, match="injected fault") as info:
                pe.run([loss], feed={"x": x, "label": y})
            failures += 1
            assert f"cpu:{_TARGET[0][1]}" in str(info.value)
            _TARGET[0] = None
            after = _state(pe, main)
            # parameters are identical everywhere (batch norm statistics are per place)
            same = all(torch.equal(after[p][k], after[0][k])
                       for p in range(n_places) for k in params)
            unchanged = all(torch.equal(after[p][k], before[p][k])
                            for p in range(n_places) for k in after[0])
            divergent += not (same and unchanged)
            if trial % 50 == 0:
                # training goes on exactly as if the failed steps never happened
                got, = pe.run([loss], feed={"x": x, "label": y})
                want, = ref.run([loss], feed={"x": x, "label": y})
                assert torch.equal(got, want)
                for a, b in zip(_state(pe, main), _state(ref, main), strict=True):
                    for k in a:
                        assert torch.equal(a[k], b[k]), k
    finally:
        _TARGET[0] = None
        pe.close()
        ref.close()
    assert failures == 1000
    assert divergent == 0


@pytest.mark.parametrize("threads", [1, 2, 4])
def test_dropout_is_bit_identical_for_any_thread_count(threads):
    main, startup, loss, _ = _program()
    data = [(torch.randn(8, 6, dtype=torch.float64), torch.randint(0, 4, (8, 1)))
            for _ in range(3)]
    results = []
    for t in (1, threads):
        pe = _executor(main, startup, loss, 2, threads=t)
        losses = [pe.run([loss], feed={"x": x, "label": y})[0] for x, y in data]
        results.append((losses, _state(pe, main)))
        pe.close()
    for a, b in zip(results[0][0], results[1][0], strict=True):
        assert torch.equal(a, b)
    for sa, sb in zip(results[0][1], results[1][1], strict=True):
        for k in sa:
            assert torch.equal(sa[k], sb[k]), k
    # and the masks do change from step to step
    assert not torch.equal(results[0][0][0], results[0][0][1])


def test_dropout_draws_leave_the_global_generator_alone():
    main, startup, loss, _ = _program()
    pe = _executor(main, startup, loss, 2)
    torch.manual_seed(123)
    expect = torch.rand(3)
    torch.manual_seed(123)
    pe.run([loss], feed={"x": torch.randn(4, 6, dtype=torch.float64),
                         "label": torch.randint(0, 4, (4, 1))})
    torch.manual_seed(123)
    assert torch.equal(torch.rand(3), expect)
    pe.close()


def _mlp():
    main, startup = se.Program(), se.Program()
    with se.program_guard(main, startup):
        x = se.layers.data("x", [-1, 3], "float32")
        y = se.layers.data("y", [-1, 1], "float32")
        loss = se.layers.mean(se.layers.square_error_cost(se.layers.fc(x, 1), y))
        se.optimizer.SGD(0.1).minimize(loss)
    return main, startup, loss.name


def test_feeding_a_parameter_needs_permission_and_is_copied():
    main, startup, loss = _mlp()
    feed = {"x": torch.ones(4, 3), "y": torch.ones(4, 1)}
    with se.ParallelExecutor(se.cpu_places(4), main, startup, loss, scope=se.Scope()) as pe:
        w = torch.full((3, 1), 0.5)
        with pytest.raises(FeedError, match="'fc_0.w_0' is a persistable var.*"
                                            "allow_persistable_feed=True"):
            pe.run([loss], feed={**feed, "fc_0.w_0": w})
        pe.run([loss], feed={**feed, "fc_0.w_0": w}, allow_persistable_feed=True)
        assert torch.equal(w, torch.full((3, 1), 0.5)), "the caller's tensor is not updated"
        ws = [ls.find_var("fc_0.w_0") for ls in pe.local_scopes]
        assert all(torch.equal(t, ws[0]) for t in ws)
        assert len({t.untyped_storage().data_ptr() for t in ws}) == 4
        assert not torch.equal(ws[0], w)  # trained from the fed value


def test_batch_sizes_of_split_feeds_must_agree():
    main, startup, loss = _mlp()
    with se.ParallelExecutor(se.cpu_places(2), main, startup, loss, scope=se.Scope()) as pe:
        with pytest.raises(FeedError, match="'x' and 'y' have batch sizes 32 and 30"):
            pe.run([loss], feed={"x": torch.ones(32, 3), "y": torch.ones(30, 1)})


def test_a_failed_step_forgets_its_feed():
    main, startup, loss, _ = _program()
    pe = _executor(main, startup, loss, 2)
    x, y = torch.randn(4, 6, dtype=torch.float64), torch.randint(0, 4, (4, 1))
    try:
        saved = pe.local_scopes[1].find_var("fc_0.w_0").clone()
        _TARGET[0] = (2, 1)
        with pytest.raises(OpError, match="injected fault"):
            pe.run([loss], feed={"x": x, "label": y,
                                 "fc_0.w_0": torch.zeros(6, 8, dtype=torch.float64)},
                   allow_persistable_feed=True)
        _TARGET[0] = None
        # the fed weight is undone, and the failed step's data is gone
        assert torch.equal(pe.local_scopes[1].find_var("fc_0.w_0"), saved)
        with pytest.raises(FeedError, match="data var 'x' was not fed"):
            pe.run([loss])
        lv, = pe.run([loss], feed={"x": x, "label": y})
        assert torch.isfinite(lv)
    finally:
        _TARGET[0] = None
        pe.close()


# --- crafted programs: atomicity from the graph, not from op order or role labels -----

_CHECK_STEPS = 250  # fault-injected steps per configuration: 1000 on 2 places, 1000 on 4


def _crafted(rng, checks=3):
    """The fault program's model with ``checks`` checking ops (``_test_fault_point``) at
    random positions of the op list, with random role labels, each reading a value the
    step computes before its updates (an activation, a gradient, a loss). A position may
    be after the optimizer ops: the check still runs before them. (Role ``loss`` is the
    seed's alone: validation refuses it on any other op, tests/program/test_validate.py.)"""
    main, startup, loss, block = _model()
    persistable = {v.name for v in block.vars.values() if v.persistable}
    ops = list(block.ops)
    made = {}  # non-persistable name -> index of the first op writing it
    for i, op in enumerate(ops):
        for n in op.output_names():
            if n not in persistable:
                made.setdefault(n, i)
    names = sorted(made)
    for point in range(checks):
        name = rng.choice(names)
        pos = rng.randint(made[name] + 1, len(ops))
        out = f"check_{point}"
        block.create_var(out, shape=[1], dtype="float64")
        ops.insert(pos, se.program.desc.OpDesc(
            "_test_fault_point", {"Place": ["place_id"], "After": [name]}, {"Out": [out]},
            {"point": point}, role=rng.choice(["forward", "backward", "optimize"])))
        made = {n: (i + 1 if i >= pos else i) for n, i in made.items()}
    block.ops = ops  # replaces them all and bumps the version (ssaexec.program.desc)
    return main, startup, loss.name


@pytest.mark.timeout(600)
@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("pool", [False, True])
@pytest.mark.parametrize("n_places", [2, 4])
def test_crafted_checks_in_any_role_and_position_leave_no_place_changed(n_places, pool,
                                                                         compiled):
    rng = random.Random(f"{n_places}-{pool}-{compiled}")
    data = [(torch.randn(2 * n_places, 6, dtype=torch.float64),
             torch.randint(0, 4, (2 * n_places, 1))) for _ in range(3)]
    failures = divergent = 0
    programs = 10
    for _ in range(programs):
        main, startup, loss = _crafted(rng)
        pe = se.ParallelExecutor(
            se.cpu_places(n_places), main, startup, loss, scope=se.Scope(),
            exec_strategy=se.ExecutionStrategy(num_threads=n_places + 1 if pool else 1,
                                               compiled=compiled))
        for i, ls in enumerate(pe.local_scopes):
            ls.set_var("place_id", torch.tensor([i]))
        try:
            for step in range(_CHECK_STEPS // programs):
                x, y = data[step % len(data)]
                if step % 5 == 0:  # training goes on between the failures
                    _TARGET[0] = None
                    pe.run([loss], feed={"x": x, "label": y})
                before = _state(pe, main)
                _TARGET[0] = (rng.randrange(3), rng.randrange(n_places))
                with pytest.raises(OpError, match="injected fault") as info:
                    pe.run([loss], feed={"x": x, "label": y})
                assert not isinstance(info.value, se.core.errors.CommitError)
                failures += 1
                _TARGET[0] = None
                after = _state(pe, main)
                divergent += not all(torch.equal(after[p][k], before[p][k])
                                     for p in range(n_places) for k in after[0])
        finally:
            _TARGET[0] = None
            pe.close()
    assert failures == _CHECK_STEPS
    assert divergent == 0


@pytest.mark.parametrize("compiled", [True, False])
def test_a_failure_after_the_updates_began_is_a_commit_error(compiled):
    """The case a step cannot undo: an op reading an updated parameter fails."""
    main, startup, loss, _ = _program()
    block = main.global_block()
    block.create_var("late_check", shape=[1], dtype="float64")
    block.append_op("_test_fault_point", {"Place": ["place_id"], "After": ["fc_0.w_0"]},
                    {"Out": ["late_check"]}, {"point": 999}, role="optimize")
    pe = _executor(main, startup, loss, 2, threads=3)
    pe.local_scopes[0].find_var("place_id")  # set by _executor
    try:
        x, y = torch.randn(4, 6, dtype=torch.float64), torch.randint(0, 4, (4, 1))
        _TARGET[0] = (999, 1)
        with pytest.raises(se.core.errors.CommitError, match="commit phase") as info:
            pe.run([loss], feed={"x": x, "label": y})
        assert "cpu:1" in str(info.value) and "injected fault" in str(info.value)
        assert isinstance(info.value.__cause__, OpError)
    finally:
        _TARGET[0] = None
        pe.close()
