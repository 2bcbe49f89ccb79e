"""Builder models trained with the sequential Executor match plain PyTorch (float64)."""

import pytest
import torch
import torch.nn.functional as F

import ssaexec as se
from ssaexec.program.example_models import build_cnn, build_mlp, make_optimizer
from torch_ref import CNN, MLP, load_from_scope, param_close, torch_optimizer

STEPS = 5
LR = {"sgd": 0.1, "momentum": 0.05, "nesterov": 0.05, "adam": 0.01}


def _data(shape, batch, steps, seed=0):
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn([batch, *shape], generator=g, dtype=torch.float64) for _ in range(steps)]
    ys = [torch.randint(0, 10, (batch, 1), generator=g) for _ in range(steps)]
    return xs, ys


def _train_both(main, startup, loss_name, model, xs, ys, opt_name):
    scope = se.Scope()
    exe = se.Executor()
    exe.run(startup, scope=scope)
    pairs = load_from_scope(model, main, scope)
    topt = torch_optimizer(opt_name, model.parameters(), LR[opt_name])
    ours, theirs = [], []
    for x, y in zip(xs, ys, strict=True):
        loss, = exe.run(main, feed={"img": x, "label": y}, fetch_list=[loss_name], scope=scope)
        ours.append(loss.item())
        topt.zero_grad()
        tl = F.cross_entropy(model(x), y.reshape(-1))
        tl.backward()
        topt.step()
        theirs.append(tl.item())
    return scope, pairs, ours, theirs


@pytest.mark.parametrize("opt_name", ["sgd", "momentum", "nesterov", "adam"])
def test_mlp_matches_torch(opt_name):
    main, startup, loss = build_mlp("float64", make_optimizer(opt_name, LR[opt_name]),
                                    in_dim=20, hidden=(16, 12))
    model = MLP(20, (16, 12)).double()
    xs, ys = _data([20], 8, STEPS)
    scope, pairs, ours, theirs = _train_both(main, startup, loss, model, xs, ys, opt_name)
    assert ours == pytest.approx(theirs, rel=1e-6)
    assert ours[-1] < ours[0]
    for name, tp in pairs:
        assert param_close(scope.find_var(name), tp), name


@pytest.mark.parametrize("opt_name", ["sgd", "momentum", "adam"])
@pytest.mark.parametrize("bn", [True, False])
def test_cnn_matches_torch(opt_name, bn):
    main, startup, loss = build_cnn("float64", make_optimizer(opt_name, LR[opt_name]),
                                    size=12, filters=(4, 6), batch_norm=bn)
    model = CNN(1, 12, 10, (4, 6), batch_norm=bn).double()
    xs, ys = _data([1, 12, 12], 6, STEPS, seed=1)
    scope, pairs, ours, theirs = _train_both(main, startup, loss, model, xs, ys, opt_name)
    assert ours == pytest.approx(theirs, rel=1e-6)
    for name, tp in pairs:
        assert param_close(scope.find_var(name), tp), name
    if bn:
        bn_mod = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)][0]
        assert torch.allclose(scope.find_var("batch_norm_0.w_1"), bn_mod.running_mean,
                              rtol=1e-6, atol=1e-9)
        assert torch.allclose(scope.find_var("batch_norm_0.w_2"), bn_mod.running_var,
                              rtol=1e-6, atol=1e-9)


def test_weight_decay_matches_torch():
    main, startup, loss = build_mlp("float64", se.optimizer.SGD(0.1, weight_decay=0.01),
                                    in_dim=10, hidden=(8,))
    model = MLP(10, (8,)).double()
    xs, ys = _data([10], 4, 3)
    scope = se.Scope()
    exe = se.Executor()
    exe.run(startup, scope=scope)
    pairs = load_from_scope(model, main, scope)
    topt = torch.optim.SGD(model.parameters(), lr=0.1, weight_decay=0.01)
    for x, y in zip(xs, ys, strict=True):
        exe.run(main, feed={"img": x, "label": y}, scope=scope)
        topt.zero_grad()
        F.cross_entropy(model(x), y.reshape(-1)).backward()
        topt.step()
    for name, tp in pairs:
        assert param_close(scope.find_var(name), tp), name


def test_shared_var_gradients_are_summed():
    # y = fc(x) read twice: its gradient must be the sum of both contributions
    main, startup = se.Program(), se.Program()
    with se.program_guard(main, startup):
        x = se.layers.data("x", [-1, 3], "float64")
        h = se.layers.fc(x, 4)
        loss = se.layers.mean(se.layers.elementwise_mul(h, se.layers.tanh(h)))
        pg = se.append_backward(loss)
    types = [op.type for op in main.global_block().ops]
    assert "sum" in types
    scope = se.Scope()
    exe = se.Executor()
    exe.run(startup, scope=scope)
    xv = torch.randn(5, 3, dtype=torch.float64)
    grads = exe.run(main, feed={"x": xv}, fetch_list=[g.name for _, g in pg], scope=scope)
    w = scope.find_var("fc_0.w_0").clone().requires_grad_()
    b = scope.find_var("fc_0.b_0").clone().requires_grad_()
    hv = xv @ w + b
    (hv * torch.tanh(hv)).mean().backward()
    assert torch.allclose(grads[0], w.grad, rtol=1e-6)
    assert torch.allclose(grads[1], b.grad, rtol=1e-6)


def test_feed_errors_name_the_var():
    main, startup, loss = build_mlp(in_dim=4, hidden=(3,))
    exe = se.Executor()
    scope = se.Scope()
    exe.run(startup, scope=scope)
    good = {"img": torch.randn(2, 4), "label": torch.zeros(2, 1, dtype=torch.int64)}
    with pytest.raises(se.FeedError, match="'img'.*\\[-1, 4\\]"):
        exe.run(main, feed={**good, "img": torch.randn(2, 5)}, scope=scope)
    with pytest.raises(se.FeedError, match="'img'.*float64.*float32"):
        exe.run(main, feed={**good, "img": torch.randn(2, 4, dtype=torch.float64)}, scope=scope)
    with pytest.raises(se.FeedError, match="'label' was not fed"):
        exe.run(main, feed={"img": good["img"]}, scope=scope)
    with pytest.raises(se.FeedError, match="'nope' is not a var"):
        exe.run(main, feed={**good, "nope": 1}, scope=scope)


def test_op_error_names_op_and_shapes():
    main, startup = se.Program(), se.Program()
    with se.program_guard(main, startup):
        x = se.layers.data("x", [-1, 3])
        y = se.layers.data("y", [-1, 3])
        se.layers.elementwise_add(x, y)
    with pytest.raises(se.OpError, match="elementwise_add.*cpu:0.*\\[2, 3\\].*\\[4, 3\\]") as ei:
        se.Executor().run(main, feed={"x": torch.ones(2, 3), "y": torch.ones(4, 3)},
                          scope=se.Scope())
    assert ei.value.__cause__ is not None


def test_clone_for_test_drops_training_ops():
    main, startup, loss = build_cnn(size=8, filters=(2,))
    test_prog = main.clone(for_test=True)
    roles = {op.role for op in test_prog.global_block().ops}
    assert roles == {"forward"}
    bn = [op for op in test_prog.global_block().ops if op.type == "batch_norm"]
    assert bn and all(op.attrs["is_test"] for op in bn)
    assert len(main.global_block().ops) > len(test_prog.global_block().ops)


def test_startup_is_reproducible():
    a = build_mlp(in_dim=6, hidden=(4,))
    b = build_mlp(in_dim=6, hidden=(4,))
    sa, sb = se.Scope(), se.Scope()
    se.Executor().run(a[1], scope=sa)
    se.Executor().run(b[1], scope=sb)
    for p in a[0].all_parameters():
        assert torch.equal(sa.find_var(p.name), sb.find_var(p.name))
