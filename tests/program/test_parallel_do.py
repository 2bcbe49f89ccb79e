"""parallel_do (seed 000): a sub-block run data-parallel over places inside one program.

Checked against PyTorch (the same MLP trained on the whole batch with torch.optim.SGD)
and against the sequential program without parallel_do, on 2 and 4 CPU places; the
program round-trips through both file formats, dumps and draws.
"""

import threading

import pytest
import torch

import ssaexec as se
from ssaexec.cli.main import main as cli_main
from ssaexec.runtime.parallel_block import flat_program

STEPS = 5
LR = 0.05


def _mlp(x, y):
    h = se.layers.fc(x, size=8, act="relu")
    return se.layers.square_error_cost(se.layers.fc(h, size=1), y)


def build(places=None, prefetch=False):
    """The fc regression, with its forward in a ParallelDo over ``places`` (None: without)."""
    main, startup = se.Program(), se.Program()
    with se.program_guard(main, startup):
        x = se.layers.data("x", shape=[-1, 13], dtype="float32")
        y = se.layers.data("y", shape=[-1, 1], dtype="float32")
        if places is None:
            cost = _mlp(x, y)
        else:
            with se.layers.ParallelDo(places) as pd:
                cost = _mlp(pd.read_input(x, prefetch=prefetch),
                            pd.read_input(y, prefetch=prefetch))
                pd.write_output(cost)
            cost = pd()
        loss = se.layers.mean(cost)
        se.optimizer.SGD(learning_rate=LR).minimize(loss)
    return main, startup, loss


def batches(n=STEPS, rows=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [{"x": torch.randn(rows, 13, generator=g), "y": torch.randn(rows, 1, generator=g)}
            for _ in range(n)]


def train(main, startup, loss, feeds, compiled=True):
    scope = se.Scope()
    exe = se.Executor(compiled=compiled)
    exe.run(startup, scope=scope)
    init = {p.name: scope.find_var(p.name).clone() for p in main.all_parameters()}
    losses = [exe.run(main, feed=f, fetch_list=[loss], scope=scope)[0].item() for f in feeds]
    final = {p.name: scope.find_var(p.name).clone() for p in main.all_parameters()}
    return init, final, losses


def torch_train(init, feeds):
    w0, b0 = init["fc_0.w_0"].clone().requires_grad_(), init["fc_0.b_0"].clone().requires_grad_()
    w1, b1 = init["fc_1.w_0"].clone().requires_grad_(), init["fc_1.b_0"].clone().requires_grad_()
    opt = torch.optim.SGD([w0, b0, w1, b1], lr=LR)
    for f in feeds:
        opt.zero_grad()
        pred = torch.relu(f["x"] @ w0 + b0) @ w1 + b1
        ((pred - f["y"]) ** 2).mean().backward()
        opt.step()
    return {"fc_0.w_0": w0, "fc_0.b_0": b0, "fc_1.w_0": w1, "fc_1.b_0": b1}


def rel_err(a, b):
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item()


@pytest.mark.parametrize("n", [2, 4])
def test_trains_like_the_sequential_program_and_torch(n):
    feeds = batches()
    init, seq, _ = train(*build(None), feeds)
    init_pd, par, losses = train(*build(se.cpu_places(n)), feeds)
    for name in init:
        assert torch.equal(init[name], init_pd[name])
    ref = torch_train(init, feeds)
    for name in seq:
        assert rel_err(par[name], seq[name]) < 1e-6, name
        assert rel_err(par[name], ref[name].detach()) < 1e-5, name
        assert not torch.equal(par[name], init[name])
    assert losses[-1] < losses[0]


def test_uneven_batch_and_readable_path_agree():
    feeds = batches(3, rows=10)  # 10 rows on 4 places: 3, 3, 2, 2
    _, seq, _ = train(*build(None), feeds)
    _, compiled, _ = train(*build(se.cpu_places(4)), feeds)
    _, readable, _ = train(*build(se.cpu_places(4)), feeds, compiled=False)
    for name in seq:
        assert torch.equal(compiled[name], readable[name])
        assert rel_err(compiled[name], seq[name]) < 1e-6


def test_program_shape_grad_block_and_all_reduce_inside():
    main, _, _ = build(se.cpu_places(2))
    main.validate()
    ops = [op.type for op in main.global_block().ops]
    assert ops.count("parallel_do") == 1 and ops.count("parallel_do_grad") == 1
    assert ops.index("parallel_do_grad") < ops.index("sgd")  # optimizer outside, after
    fwd = next(op for op in main.global_block().ops if op.type == "parallel_do")
    grad = next(op for op in main.global_block().ops if op.type == "parallel_do_grad")
    assert fwd.input("Inputs") == ["x", "y"]
    assert fwd.input("Parameters") == [p.name for p in main.all_parameters()]
    assert fwd.output("Saved") == grad.input("Saved") and len(fwd.output("Saved")) % 2 == 0
    gblock = main.block(grad.attrs["sub_block"].idx)
    assert gblock.parent_idx == 0
    # every parameter gradient is all-reduced over the places inside the grad block, right
    # after the op that makes it
    graph = se.build_ssa_graph(flat_program(main, gblock.idx, ()), se.cpu_places(2))
    graph.lint()
    reduced = sorted(n for h in graph.collectives for n in h.var_names)
    assert reduced == sorted(p.name + "@GRAD" for p in main.all_parameters())
    assert all(h.kind == "all_reduce" for h in graph.collectives)


def test_round_trips_dumps_and_draws(tmp_path, capsys):
    main, startup, loss = build(se.cpu_places(2))
    for suffix in ("json", "ssa"):
        path = tmp_path / f"pd.{suffix}"
        se.save_program(main, str(path))
        back = se.load_program(str(path))
        assert back == main
        back.validate()
        feeds = batches(2)
        _, a, _ = train(main, startup, loss, feeds)
        _, b, _ = train(back, startup, loss, feeds)
        assert all(torch.equal(a[n], b[n]) for n in a)
    assert cli_main(["dump", str(tmp_path / "pd.json")]) == 0
    assert "parallel_do_grad" in capsys.readouterr().out
    assert cli_main(["viz", str(tmp_path / "pd.ssa"), "-o", str(tmp_path / "pd.dot")]) == 0
    assert "parallel_do" in (tmp_path / "pd.dot").read_text()


def test_mixes_single_place_parts_with_the_parallel_part():
    # outside: a preprocessing fc whose output is split (its gradient comes back merged),
    # a parameter read both inside and outside, a metric on the merged predictions
    def model(places):
        main, startup = se.Program(), se.Program()
        with se.program_guard(main, startup):
            x = se.layers.data("x", shape=[-1, 6], dtype="float32")
            label = se.layers.data("label", shape=[-1, 1], dtype="int64")
            h = se.layers.fc(x, size=6, act="tanh", name="pre")
            if places is None:
                logits = se.layers.fc(h, size=3, name="head")
            else:
                with se.layers.ParallelDo(places) as pd:
                    logits = se.layers.fc(pd.read_input(h), size=3, name="head")
                    pd.write_output(logits)
                logits = pd()
            shared = main.global_block().var("head.b_0")
            logits = se.layers.elementwise_add(logits, shared)  # the bias used twice
            loss = se.layers.mean(se.layers.softmax_with_cross_entropy(logits, label))
            acc, _, _ = se.layers.accuracy(se.layers.softmax(logits), label)
            se.optimizer.SGD(learning_rate=0.1).minimize(loss)
        return main, startup, loss, acc

    g = torch.Generator().manual_seed(1)
    feeds = [{"x": torch.randn(12, 6, generator=g),
              "label": torch.randint(0, 3, (12, 1), generator=g)} for _ in range(STEPS)]
    results = []
    for places in (None, se.cpu_places(3)):
        main, startup, loss, acc = model(places)
        scope = se.Scope()
        exe = se.Executor()
        exe.run(startup, scope=scope)
        accs = [exe.run(main, feed=f, fetch_list=[loss, acc], scope=scope)[1].item()
                for f in feeds]
        results.append(({p.name: scope.find_var(p.name).clone()
                         for p in main.all_parameters()}, accs))
    (seq, acc_seq), (par, acc_par) = results
    assert acc_seq == acc_par
    for name in seq:
        assert rel_err(par[name], seq[name]) < 1e-6, name


def test_scalar_outputs_are_stacked_one_row_per_place():
    main, startup = se.Program(), se.Program()
    with se.program_guard(main, startup):
        x = se.layers.data("x", shape=[-1, 4], dtype="float32")
        with se.layers.ParallelDo(2) as pd:
            part = se.layers.mean(se.layers.fc(pd.read_input(x), size=1))
            pd.write_output(part)
        parts = pd()
        loss = se.layers.mean(parts)
        se.optimizer.SGD(learning_rate=0.1).minimize(loss)
    assert parts.shape == [2]
    scope = se.Scope()
    exe = se.Executor()
    exe.run(startup, scope=scope)
    w, b = scope.find_var("fc_0.w_0").clone(), scope.find_var("fc_0.b_0").clone()
    xs = torch.randn(8, 4)
    got, = exe.run(main, feed={"x": xs}, fetch_list=[parts], scope=scope)
    want = torch.stack([(xs[:4] @ w + b).mean(), (xs[4:] @ w + b).mean()])
    assert torch.allclose(got, want, atol=1e-6)
    # d loss / d w = mean over all rows of x (halves of equal size)
    assert torch.allclose(scope.find_var("fc_0.w_0"), w - 0.1 * xs.mean(0, keepdim=True).T,
                          atol=1e-6)


def test_prefetched_inputs_train_the_same():
    feeds = batches(4, rows=9)
    _, plain, losses = train(*build(se.cpu_places(2)), feeds)
    main, startup, loss = build(se.cpu_places(2), prefetch=True)
    main.validate()
    assert "x@PLACE@1" in main.global_block().vars
    with se.PrefetchLoader(feeds, main) as loader:
        _, pre, losses_pre = train(main, startup, loss, loader)
    assert losses == losses_pre
    assert all(torch.equal(plain[n], pre[n]) for n in plain)


def test_forward_clone_keeps_no_activations():
    main, startup, loss = build(se.cpu_places(2))
    test = main.clone(for_test=True)
    op = test.global_block().ops[0]
    assert op.type == "parallel_do" and "Saved" not in op.outputs and not op.attrs["saved"]
    scope = se.Scope()
    se.Executor().run(startup, scope=scope)
    f = batches(1)[0]
    a, = se.Executor().run(test, feed=f, fetch_list=[loss], scope=scope)
    b, = se.Executor().run(build(None)[0].clone(for_test=True), feed=f, fetch_list=[loss],
                           scope=scope)
    assert torch.allclose(a, b, rtol=1e-6)


def test_inside_a_parallel_executor_and_no_thread_left():
    main, startup, loss = build(se.cpu_places(2))
    before = set(threading.enumerate())
    scope = se.Scope()
    se.Executor().run(startup, scope=scope)
    with se.ParallelExecutor(se.cpu_places(2), main, scope=scope, loss_name=loss.name) as pe:
        for f in batches(2):
            pe.run([loss.name], feed=f)
    assert not [t for t in set(threading.enumerate()) - before
                if t.name.startswith("ssaexec-parallel-do")]


def test_errors_name_the_problem():
    main, startup = se.Program(), se.Program()
    with se.program_guard(main, startup):
        x = se.layers.data("x", shape=[-1, 4], dtype="float32")
        pd = se.layers.ParallelDo(se.cpu_places(2))
        with pytest.raises(se.ProgramError, match="inside its 'with' block"):
            pd.read_input(x)
        with pytest.raises(se.ProgramError, match="write_output"):
            with pd:
                se.layers.fc(pd.read_input(x), size=1)
        with pytest.raises(se.ProgramError, match="not made inside the block"):
            with se.layers.ParallelDo(2) as pd2:
                pd2.write_output(x)
        with pytest.raises(se.ProgramError, match="places would race"):
            with se.layers.ParallelDo(2) as pd3:
                out = se.layers.scale(pd3.read_input(x), 2.0)
                main.current_block().append_op("assign", {"X": [out.name]}, {"Out": ["x"]})
                pd3.write_output(out)
        with pytest.raises(se.ProgramError, match="distinct"):
            se.layers.ParallelDo([se.CPUPlace(0), se.CPUPlace(0)])
        assert main.current_block().idx == 0
    main, startup, loss = build(se.cpu_places(4))
    scope = se.Scope()
    se.Executor().run(startup, scope=scope)
    with pytest.raises(se.OpError, match="3 rows but there are 4 places"):
        se.Executor().run(main, feed=batches(1, rows=3)[0], fetch_list=[loss], scope=scope)
