"""Segments compiled by Inductor (issue 32, ``ExecutionStrategy(compiler="inductor")``,
``runtime.inductor``): exact against the compiled path on two places (segments between
collectives), learning rates that stay inputs,
fallback with one line, clear errors. Tiny shapes: each compile takes seconds on CPU."""

import pytest
import torch

import ssaexec as se
from ssaexec.errors import SSAExecError
from ssaexec.runtime.inductor import _alpha_as_mul, check_compiler


def _mlp(opt, dropout=0.0):
    main, startup = se.Program(), se.Program()
    with se.program_guard(main, startup):
        x = se.layers.data("x", shape=[-1, 6], dtype="float64")
        y = se.layers.data("y", shape=[-1, 1], dtype="float64")
        h = se.layers.fc(x, size=8, act="relu")
        if dropout:
            h = se.layers.dropout(h, dropout_prob=dropout)
        h = se.layers.fc(h, size=8, act="tanh")
        loss = se.layers.mean(se.layers.square_error_cost(se.layers.fc(h, size=1), y))
        opt.minimize(loss)
    return main, startup, loss


def _train(opt, places, compiler, lrs=(None, None, None), dropout=0.0):
    main, startup, loss = _mlp(opt, dropout)
    scope = se.Scope()
    torch.manual_seed(1)
    se.Executor(se.CPUPlace(0)).run(startup, scope=scope)
    # one gradient bucket: two places make 3 segments each to compile, not one per gradient
    pe = se.ParallelExecutor(se.cpu_places(places), main, startup, loss.name, scope=scope,
                             build_strategy=se.BuildStrategy(fuse_all_reduce_ops=True),
                             exec_strategy=se.ExecutionStrategy(compiler=compiler))
    gen = torch.Generator().manual_seed(0)
    losses = []
    try:
        for lr in lrs:
            if lr is not None:
                pe.set_lr(lr)
            feed = {"x": torch.randn(8, 6, dtype=torch.float64, generator=gen),
                    "y": torch.randn(8, 1, dtype=torch.float64, generator=gen)}
            losses.append(pe.run([loss], feed=feed)[0])
        params = {p.name: scope.find_var(p.name).clone()
                  for p in main.all_parameters()}
        runner = pe._runner((loss.name,))
    finally:
        pe.close()
    return losses, params, runner.lowering


def _close(a, b, tol):
    return all(float((x - y).abs().max()) <= tol for x, y in zip(a, b, strict=True))


# one case: each compile costs seconds of the suite; bench/inductor_check.py covers the
# models, optimizers (AdamW too) and place counts
@pytest.mark.parametrize("opt, places, lrs", [
    (lambda: se.optimizer.SGD(0.1), 2, (None, 0.05, 0.2)),  # the rate changes: an input
])
def test_inductor_steps_equal_the_compiled_path_in_float64(opt, places, lrs):
    ref_losses, ref_params, _ = _train(opt(), places, None, lrs)
    losses, params, lowering = _train(opt(), places, "inductor", lrs)
    assert lowering.fallbacks == [] and lowering.compiles >= 1
    assert _close(losses, ref_losses, 1e-6)
    # with a rate baked into the graph at its first value, steps 2 and 3 would differ
    assert _close(params.values(), ref_params.values(), 1e-6)


def test_a_segment_that_draws_random_numbers_runs_uncompiled_and_says_why(capfd):
    ref_losses, ref_params, _ = _train(se.optimizer.SGD(0.1), 1, None, dropout=0.5)
    losses, params, lowering = _train(se.optimizer.SGD(0.1), 1, "inductor", dropout=0.5)
    assert len(lowering.fallbacks) == 1 and "draws random numbers" in lowering.fallbacks[0][1]
    err = capfd.readouterr().err
    assert err.count("runs uncompiled") == 1 and "segment 0" in err
    # the fallback is the compiled path itself: same masks, same numbers
    assert all(torch.equal(a, b) for a, b in zip(losses, ref_losses, strict=True))


def test_alpha_is_made_a_multiplication_before_inductor_sees_it():
    """Inductor's add+mm -> addmm pattern drops ``alpha`` (pytorch issues 167313,
    196577): an SGD step of a matmul's gradient came out as ``w + g``."""
    from torch._inductor.compile_fx import compile_fx
    from torch.fx.experimental.proxy_tensor import make_fx

    def step(w, a, c):
        return torch.ops.aten.add.Tensor(w, torch.ops.aten.mm.default(a, c), alpha=-0.1)

    args = [torch.randn(8, 6, dtype=torch.float64), torch.randn(8, 4, dtype=torch.float64),
            torch.randn(4, 6, dtype=torch.float64)]
    gm = make_fx(step)(*args)
    assert _alpha_as_mul(gm)
    assert all("alpha" not in n.kwargs for n in gm.graph.nodes)
    out = compile_fx(gm, args)(*args)
    torch.testing.assert_close(out[0] if isinstance(out, (list, tuple)) else out, step(*args))


def test_bad_compilers_are_clear_errors(monkeypatch):
    with pytest.raises(SSAExecError, match="compiler must be one of"):
        se.ExecutionStrategy(compiler="tvm")
    with pytest.raises(SSAExecError, match="compiler must be None or 'inductor'"):
        check_compiler("xla", [se.CPUPlace(0)])
    monkeypatch.setenv("PATH", "")
    with pytest.raises(SSAExecError, match="needs a C\\+\\+ compiler.*apt install g\\+\\+"):
        check_compiler("inductor", [se.CPUPlace(0)])
