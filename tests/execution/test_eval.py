"""Evaluation next to training: metric ops, clone(for_test=True), share_vars_from."""

import pytest
import torch

import ssaexec as se
from ssaexec.core.errors import SSAExecError


def _program():
    main, startup = se.Program(3), se.Program(3)
    with se.program_guard(main, startup):
        x = se.layers.data("img", [-1, 6])
        label = se.layers.data("label", [-1, 1], "int64")
        h = se.layers.batch_norm(se.layers.fc(x, 8), act="relu")
        h = se.layers.dropout(h, 0.3)
        logits = se.layers.fc(h, 4)
        loss = se.layers.mean(se.layers.softmax_with_cross_entropy(logits, label))
        test = main.clone(for_test=True)
        with se.program_guard(test, se.Program()):
            acc, correct, total = se.layers.accuracy(logits, label, k=1)
            top2, _, _ = se.layers.accuracy(logits, label, k=2)
            pred = se.layers.argmax(logits)
        se.optimizer.Momentum(0.1).minimize(loss)
    return main, startup, loss.name, test, (acc.name, correct.name, total.name, top2.name,
                                            pred.name, logits.name)


def _data():
    g = torch.Generator().manual_seed(9)
    x = torch.randn(64, 6, generator=g)
    return {"img": x, "label": x[:, :4].argmax(1, keepdim=True)}


def test_an_eval_executor_shares_the_trained_values_and_sees_every_update():
    main, startup, loss, test, (acc, correct, total, top2, pred, logits) = _program()
    feed = _data()
    with se.ParallelExecutor(se.cpu_places(2), main, startup, loss, scope=se.Scope()) as train:
        with se.ParallelExecutor(se.cpu_places(2), test, share_vars_from=train) as ev:
            before = float(ev.run([acc], feed=feed)[0])
            for _ in range(40):
                train.run([loss], feed=feed)
            a, c, n, t2, p, lg = ev.run([acc, correct, total, top2, pred, logits], feed=feed,
                                       return_merged=False)
            assert sum(int(v) for v in n) == 64
            acc_all = sum(int(v) for v in c) / 64
            assert acc_all > max(0.8, before)  # it sees the trained weights
            assert all(float(u) >= float(v) for u, v in zip(t2, a, strict=True))
            assert torch.equal(torch.cat(p), torch.cat(lg).argmax(1))
            # inference: dropout off and batch norm on running statistics, so two runs agree
            again = ev.run([logits], feed=feed, return_merged=False)[0]
            assert all(torch.equal(u, v) for u, v in zip(lg, again, strict=True))
            # the eval run changed nothing of the training executor
            w = train.get_var("fc_0.w_0")
            ev.run([acc], feed=feed)
            assert torch.equal(train.get_var("fc_0.w_0"), w)
    assert "dropout" in str(test) and "is_test=true" in str(test)


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "readable"])
def test_an_eval_executor_sees_the_running_statistics_trained_after_its_first_run(compiled):
    # an evaluation batch norm returns its running statistics unchanged, which bound them
    # in the eval executor's own scopes: every later run read its first run's statistics
    main, startup, loss, test, (_, _, _, _, _, logits) = _program()
    feed = _data()
    strategy = se.ExecutionStrategy(compiled=compiled)
    with se.ParallelExecutor(se.cpu_places(2), main, startup, loss, scope=se.Scope(),
                             exec_strategy=strategy) as train:
        with se.ParallelExecutor(se.cpu_places(2), test, share_vars_from=train,
                                 exec_strategy=strategy) as ev:
            ev.run([logits], feed=feed)
            for _ in range(5):
                train.run([loss], feed=feed)
            got = ev.run([logits], feed=feed)[0]
            for i, scope in enumerate(train.local_scopes):
                for name in ("batch_norm_0.w_1", "batch_norm_0.w_2"):
                    assert ev.local_scopes[i].find_var(name) is scope.find_var(name)
        with se.ParallelExecutor(se.cpu_places(2), test, share_vars_from=train,
                                 exec_strategy=strategy) as fresh:
            want = fresh.run([logits], feed=feed)[0]
    assert torch.equal(got, want)


def test_sharing_needs_the_same_places():
    main, startup, loss, test, _ = _program()
    with se.ParallelExecutor(se.cpu_places(2), main, startup, loss, scope=se.Scope()) as train:
        with pytest.raises(SSAExecError, match="places differ"):
            se.ParallelExecutor(se.cpu_places(3), test, share_vars_from=train)
        with pytest.raises(SSAExecError, match="must be a ParallelExecutor"):
            se.ParallelExecutor(se.cpu_places(2), test, share_vars_from=se.Scope())
