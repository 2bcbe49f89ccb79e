"""Learning-rate schedules inside the program, and setting variables on every place."""

import math

import pytest
import torch
import torch.nn.functional as F

import ssaexec as se
from ssaexec.core.errors import ProgramError, SSAExecError
from ssaexec.program.example_models import build_mlp

L = se.optimizer.lr
SCHED = torch.optim.lr_scheduler
STEPS = 6


def _data():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(8, 5, dtype=torch.float64, generator=g)
    return x, x[:, :3].argmax(1, keepdim=True)


def _run(optimizer, steps=STEPS, places=2, setup=None):
    main, startup, loss = build_mlp("float64", optimizer, in_dim=5, hidden=(4,), classes=3)
    x, y = _data()
    with se.ParallelExecutor(se.cpu_places(places), main, startup, loss,
                             scope=se.Scope()) as pe:
        init = {p.name: pe.get_var(p.name) for p in main.all_parameters()}
        if setup:
            setup(pe)
        rates = []
        for _ in range(steps):
            pe.run([loss], feed={"img": x, "label": y})
            rates.append(pe.get_lr())
        params = {p.name: [pe.get_var(p.name, k) for k in range(places)]
                  for p in main.all_parameters()}
    return init, params, rates


def _eager(init, make_opt, make_sched, steps=STEPS):
    x, y = _data()
    w = {n: t.clone().requires_grad_() for n, t in init.items()}
    opt = make_opt(list(w.values()))
    sched = make_sched(opt)
    rates = []
    for _ in range(steps):
        rates.append(opt.param_groups[0]["lr"])
        h = torch.relu(x @ w["fc_0.w_0"] + w["fc_0.b_0"])
        opt.zero_grad()
        F.cross_entropy(h @ w["fc_1.w_0"] + w["fc_1.b_0"], y.reshape(-1)).backward()
        opt.step()
        sched.step()
    return {n: t.detach() for n, t in w.items()}, rates


@pytest.mark.parametrize("ours, theirs", [
    (lambda: L.StepDecay(0.2, step_size=2, gamma=0.5), lambda o: SCHED.StepLR(o, 2, 0.5)),
    (lambda: L.CosineAnnealing(0.2, T_max=4), lambda o: SCHED.CosineAnnealingLR(o, 4)),
], ids=["step", "cosine"])
def test_schedules_train_exactly_like_torch_schedulers(ours, theirs):
    init, params, rates = _run(se.optimizer.Momentum(ours(), momentum=0.9))
    want, want_rates = _eager(init, lambda ps: torch.optim.SGD(ps, lr=0.2, momentum=0.9), theirs)
    assert rates == pytest.approx(want_rates, rel=1e-12)  # get_lr(): the rate step k used
    for name, vals in params.items():
        for v in vals:
            assert torch.allclose(v, want[name], rtol=1e-6, atol=1e-9), name


@pytest.mark.parametrize("ours, theirs", [
    (lambda: L.MultiStepDecay(0.2, [1, 4], gamma=0.3), lambda o: SCHED.MultiStepLR(o, [1, 4], 0.3)),
    (lambda: L.ExponentialDecay(0.2, gamma=0.8), lambda o: SCHED.ExponentialLR(o, 0.8)),
    (lambda: L.LambdaDecay(0.2, lambda t: 1 / (1 + t), steps=4),
     lambda o: SCHED.LambdaLR(o, lambda t: 1 / (1 + min(t, 3)))),
], ids=["multistep", "exponential", "lambda"])
def test_more_schedules_match_torch_rate_for_rate(ours, theirs):
    _, _, rates = _run(se.optimizer.SGD(ours()))
    _, want = _eager(_run(se.optimizer.SGD(0.1), steps=0)[0],
                     lambda ps: torch.optim.SGD(ps, lr=0.2), theirs)
    # get_lr() after run k is the rate step k used
    assert rates == pytest.approx(want, rel=1e-12)


def test_warmup_then_piecewise_and_plain_warmup():
    sched = L.LinearWarmup(L.PiecewiseDecay([2], [0.3, 0.03]), warmup_steps=3, start_lr=0.0,
                           end_lr=0.3)
    _, _, rates = _run(se.optimizer.SGD(sched), steps=7)
    assert rates == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.3, 0.03, 0.03])
    _, _, rates = _run(se.optimizer.SGD(L.LinearWarmup(0.5, 2, 0.1, 0.5)), steps=4)
    assert rates == pytest.approx([0.1, 0.3, 0.5, 0.5])


def test_set_lr_zero_freezes_every_place_and_get_var_reads_each():
    def freeze(pe):
        pe.set_lr(0.0)
        assert pe.get_lr() == 0.0
    init, params, rates = _run(se.optimizer.Momentum(0.1), setup=freeze)
    assert rates == [0.0] * STEPS
    for name, vals in params.items():
        assert all(torch.equal(v, init[name]) for v in vals), name


def test_set_var_writes_every_place_in_place_and_checks_the_shape():
    main, startup, loss = build_mlp("float32", se.optimizer.SGD(0.1), in_dim=5, hidden=(4,),
                                    classes=3)
    with se.ParallelExecutor(se.cpu_places(3), main, startup, loss, scope=se.Scope()) as pe:
        before = pe.local_scopes[2].find_var("fc_0.b_0")
        pe.set_var("fc_0.b_0", torch.arange(4.0))
        assert all(torch.equal(pe.get_var("fc_0.b_0", k), torch.arange(4.0)) for k in range(3))
        assert pe.local_scopes[2].find_var("fc_0.b_0") is before  # in place
        with pytest.raises(SSAExecError, match="shape"):
            pe.set_var("fc_0.b_0", torch.zeros(5))
        with pytest.raises(SSAExecError, match="place 7"):
            pe.get_var("fc_0.b_0", 7)


def test_set_lr_is_refused_under_a_schedule_and_bad_schedules_are_refused():
    main, startup, loss = build_mlp("float32", se.optimizer.SGD(L.StepDecay(0.1, 2)), in_dim=5,
                                    hidden=(4,), classes=3)
    with se.ParallelExecutor(se.cpu_places(1), main, startup, loss, scope=se.Scope()) as pe:
        with pytest.raises(SSAExecError, match="schedule"):
            pe.set_lr(0.5)
    assert "lr_schedule(" in str(main) and "@LR.step" in str(main)
    with pytest.raises(ProgramError, match="step_size"):
        L.StepDecay(0.1, 0)
    with pytest.raises(ProgramError, match="one more value"):
        L.PiecewiseDecay([1, 2], [0.1])
    with pytest.raises(ProgramError, match="learning_rate"):
        se.optimizer.SGD("fast")


def test_the_schedule_round_trips_through_both_file_formats(tmp_path):
    main, _, _ = build_mlp("float32", se.optimizer.Adam(L.CosineAnnealing(0.01, 10, 1e-4)),
                           in_dim=5, hidden=(4,), classes=3)
    for suffix in (".json", ".txt"):
        path = tmp_path / f"p{suffix}"
        se.save_program(main, str(path))
        assert se.load_program(str(path)) == main
    assert math.isclose(0.01, [op for op in main.global_block().ops
                               if op.type == "lr_schedule"][0].attrs["base_lr"])
