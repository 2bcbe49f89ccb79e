"""Gradient accumulation: K micro-batches equal one step on all their samples (torch oracle)."""

import pytest
import torch
import torch.nn.functional as F

import ssaexec as se
from ssaexec.core.errors import SSAExecError
from ssaexec.program.example_models import build_mlp, make_optimizer

K, MICRO, PLACES = 4, 16, 2


def _torch_opt(name, params):
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.1)
    if name == "momentum":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)
    return torch.optim.Adam(params, lr=0.01)


def _batches(steps):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(steps * K * MICRO, 6, dtype=torch.float64, generator=g)
    return x, x[:, :3].argmax(1, keepdim=True)


@pytest.mark.parametrize("opt", ["sgd", "momentum", "adam"])
def test_k_micro_batches_equal_one_eager_step_on_all_samples(opt):
    lr = 0.01 if opt == "adam" else 0.1
    main, startup, loss = build_mlp("float64", make_optimizer(opt, lr), in_dim=6, hidden=(5,),
                                    classes=3)
    steps = 2
    x, y = _batches(steps)
    scope = se.Scope()
    bs = se.BuildStrategy(gradient_accumulation_steps=K)
    ran = []
    with se.ParallelExecutor(se.cpu_places(PLACES), main, startup, loss, bs, scope=scope) as pe:
        params = {p.name: scope.find_var(p.name).clone() for p in main.all_parameters()}
        with pe.observe([loss], lambda op, *_: ran.append((len(micro), op.is_collective))):
            micro = []
            for k in range(steps * K):
                part = slice(k * MICRO, (k + 1) * MICRO)
                micro.append(float(pe.run([loss], feed={"img": x[part], "label": y[part]})[0]))
        got = {n: pe.local_scopes[1].find_var(n) for n in params}
    # the same model in torch: one step per K*MICRO samples on the mean loss
    w = {n: t.clone().requires_grad_() for n, t in params.items()}
    opt_t = _torch_opt(opt, list(w.values()))
    for s in range(steps):
        part = slice(s * K * MICRO, (s + 1) * K * MICRO)
        h = F.relu(x[part] @ w["fc_0.w_0"] + w["fc_0.b_0"])
        logits = h @ w["fc_1.w_0"] + w["fc_1.b_0"]
        opt_t.zero_grad()
        F.cross_entropy(logits, y[part].reshape(-1)).backward()
        opt_t.step()
    for n in params:
        assert torch.allclose(got[n], w[n].detach(), rtol=1e-6, atol=1e-9), n
    # communication only on every K-th run
    comm = sorted({k for k, coll in ran if coll})
    assert comm == [k for k in range(steps * K) if k % K == K - 1]
    assert len(micro) == steps * K and all(v > 0 for v in micro)


def test_accumulators_are_visible_and_zero_after_each_applied_step():
    main, startup, loss = build_mlp("float32", make_optimizer("sgd", 0.1), in_dim=6,
                                    hidden=(5,), classes=3)
    x, y = _batches(1)
    bs = se.BuildStrategy(gradient_accumulation_steps=2)
    with se.ParallelExecutor(se.cpu_places(2), main, startup, loss, bs, scope=se.Scope()) as pe:
        text = str(pe.program_for("accumulate"))
        assert "fc_0.w_0@GRAD@ACC" in text and "sgd(" not in text
        assert "sgd(" in str(pe.run_program)
        feed = {"img": x[:8].float(), "label": y[:8]}
        pe.run([loss], feed=feed)
        acc = pe.local_scopes[0].find_var("fc_0.w_0@GRAD@ACC")
        assert acc.abs().sum() > 0
        pe.run([loss], feed=feed)
        assert torch.count_nonzero(pe.local_scopes[0].find_var("fc_0.w_0@GRAD@ACC")) == 0


def test_bad_accumulation_settings_are_refused():
    with pytest.raises(SSAExecError, match="gradient_accumulation_steps"):
        se.BuildStrategy(gradient_accumulation_steps=0)
    with pytest.raises(SSAExecError, match="gradient_accumulation_steps"):
        se.BuildStrategy(gradient_accumulation_steps=1.5)
