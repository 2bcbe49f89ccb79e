"""Sparse gradients: an embedding's gradient as the rows a batch touched (ops/sparse.py).

The oracle is PyTorch: ``nn.functional.embedding``'s sparse backward, ``torch.optim.SGD``
on a sparse embedding, ``torch.optim.SparseAdam``; and dense training of the same
program, which sparse training must equal.
"""

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import ssaexec as se
from ssaexec.ops.registry import get_op_def
from ssaexec.ops.sparse import nbytes
from ssaexec.execution.step_trace import trace_steps

from tests.ports import free_port

VOCAB, DIM, SLOTS, BATCH, STEPS = 100_000, 16, 4, 64, 5


def build(sparse, opt=None, vocab=VOCAB):
    main, startup = se.Program(), se.Program()
    with se.program_guard(main, startup):
        ids = se.layers.data("ids", shape=[-1, SLOTS], dtype="int64")
        y = se.layers.data("y", shape=[-1, 1], dtype="float32")
        emb = se.layers.embedding(ids, size=[vocab, DIM], is_sparse=sparse)
        pred = se.layers.fc(se.layers.reduce_mean(emb, dim=1), size=1)
        loss = se.layers.mean(se.layers.square_error_cost(pred, y))
        (opt or se.optimizer.SGD(learning_rate=0.5)).minimize(loss)
    return main, startup, loss


def feeds(n=STEPS, vocab=VOCAB, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [{"ids": torch.randint(0, vocab, (BATCH, SLOTS), generator=g),
             "y": torch.randn(BATCH, 1, generator=g)} for _ in range(n)]


def train_pe(main, startup, loss, data, places=2, strategy=None):
    scope = se.Scope()
    se.Executor().run(startup, scope=scope)
    init = {p.name: scope.find_var(p.name).clone() for p in main.all_parameters()}
    with se.ParallelExecutor(se.cpu_places(places), main, scope=scope, loss_name=loss.name,
                             build_strategy=strategy) as pe:
        for f in data:
            pe.run([loss.name], feed=f)
        final = {p.name: pe.local_scopes[0].find_var(p.name).clone()
                 for p in main.all_parameters()}
    return init, final


def torch_twin(init):
    """The model in torch (a sparse ``nn.Embedding``), from ssaexec's initial weights."""
    emb = torch.nn.Embedding(*init["embedding_0.w_0"].shape, sparse=True)
    fc = torch.nn.Linear(DIM, 1)
    with torch.no_grad():
        emb.weight.copy_(init["embedding_0.w_0"])
        fc.weight.copy_(init["fc_0.w_0"].T)
        fc.bias.copy_(init["fc_0.b_0"])
    return emb, fc


def rel_err(a, b):
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item()


def test_lookup_grad_is_torch_sparse_embedding_backward():
    w = torch.randn(50, 3, requires_grad=True)
    ids = torch.tensor([[1, 7, 1], [49, 0, 7]])
    g = torch.randn(2, 3, 3)
    F.embedding(ids, w, sparse=True).backward(g)
    kernel = get_op_def("lookup_table_grad").kernel
    for pad in (-1, 7):
        got = kernel({"W": w.detach(), "Ids": ids, "Out@GRAD": g},
                     {"padding_idx": pad, "is_sparse": True}, {"W@GRAD": [True]})["W@GRAD"]
        assert got.is_sparse and got.is_coalesced()
        want = w.grad.to_dense() if pad < 0 else \
            torch.autograd.grad(F.embedding(ids, w, padding_idx=pad), w, g)[0]
        assert torch.allclose(got.to_dense(), want)
        assert got.indices()[0].tolist() == sorted({1, 7, 49, 0} - ({pad} if pad >= 0 else set()))
        dense = kernel({"W": w.detach(), "Ids": ids, "Out@GRAD": g},
                       {"padding_idx": pad, "is_sparse": False}, {"W@GRAD": [True]})["W@GRAD"]
        assert not dense.is_sparse and torch.equal(dense, got.to_dense())


def test_two_places_equal_dense_training_and_torch():
    data = feeds()
    assert all(f["ids"].unique().numel() < VOCAB // 100 for f in data)  # < 1% of the rows
    init, dense = train_pe(*build(False), data)
    init_s, sparse = train_pe(*build(True), data)
    for name in dense:
        assert torch.equal(init[name], init_s[name])
        assert rel_err(sparse[name], dense[name]) < 1e-6, name
    # torch: a sparse nn.Embedding with torch.optim.SGD on the whole batch
    emb, fc = torch_twin(init)
    opt = torch.optim.SGD(list(emb.parameters()) + list(fc.parameters()), lr=0.5)
    for f in data:
        opt.zero_grad()
        ((fc(emb(f["ids"]).mean(1)) - f["y"]) ** 2).mean().backward()
        assert emb.weight.grad.is_sparse
        opt.step()
    assert rel_err(sparse["embedding_0.w_0"], emb.weight.detach()) < 1e-5
    assert rel_err(sparse["fc_0.w_0"], fc.weight.detach().T) < 1e-5


def _grad_bytes(result, op_type):
    graph = result.graph
    out = []
    for (step, op_id), sizes in result.output_bytes.items():
        h = graph.ops[op_id]
        name = h.op.type if h.kind == "compute" else h.kind
        if name == op_type:
            out.extend(b for label, b in sizes.items() if "embedding_0.w_0@GRAD" in label)
    return out


def test_gradient_memory_in_the_trace_is_the_rows_touched():
    dense_bytes = VOCAB * DIM * 4
    data = feeds(2)
    for sparse, strategy in ((True, None), (False, se.BuildStrategy(sparse_gradients=False)),
                             (True, se.BuildStrategy(sparse_gradients=False))):
        main, startup, loss = build(sparse)
        scope = se.Scope()
        se.Executor().run(startup, scope=scope)
        with se.ParallelExecutor(se.cpu_places(2), main, scope=scope, loss_name=loss.name,
                                 build_strategy=strategy) as pe:
            result = trace_steps(pe, lambda k: data[k], [loss.name], 2, memory=True)
        made, reduced = _grad_bytes(result, "lookup_table_grad"), _grad_bytes(result, "all_reduce")
        assert len(made) == 4 and len(reduced) == 4  # 2 steps x 2 places
        if sparse and strategy is None:
            assert max(made + reduced) < 0.05 * dense_bytes
            event = next(e for e in result.to_chrome()["traceEvents"]
                         if e.get("name", "").startswith("lookup_table_grad"))
            assert any("@GRAD" in k for k in event["args"]["output_bytes"])
        else:  # dense, or the dense fallback of an is_sparse embedding
            assert min(made + reduced) == dense_bytes


@pytest.mark.parametrize("strategy", [
    se.BuildStrategy(sparse_gradients=False), se.BuildStrategy(fuse_all_reduce_ops=True),
    se.BuildStrategy(reduce_strategy="reduce")], ids=["dense-fallback", "fused", "reduce"])
def test_strategies_equal_dense_training(strategy):
    data = feeds(3, vocab=1000)
    _, dense = train_pe(*build(False, vocab=1000), data, places=3)
    _, sparse = train_pe(*build(True, vocab=1000), data, places=3, strategy=strategy)
    for name in dense:
        assert rel_err(sparse[name], dense[name]) < 1e-6, name


def test_a_table_read_twice_sums_sparse_gradients():
    def twice(sparse):
        main, startup = se.Program(), se.Program()
        with se.program_guard(main, startup):
            a = se.layers.data("a", shape=[-1, 3], dtype="int64")
            b = se.layers.data("b", shape=[-1, 3], dtype="int64")
            ea = se.layers.embedding(a, size=[50, 4], is_sparse=sparse, name="emb")
            w = main.global_block().var("emb.w_0")
            eb = se.layers.embedding(b, size=[50, 4], is_sparse=sparse,
                                     param_attr=se.initializer.Constant(0.0), name="other")
            main.global_block().ops[-1].inputs["W"] = [w.name]  # the same table twice
            loss = se.layers.mean(se.layers.elementwise_add(ea, eb))
            se.optimizer.SGD(0.5).minimize(loss)
        return main, startup, loss

    data = [{"a": torch.randint(0, 50, (8, 3)), "b": torch.randint(0, 50, (8, 3))}
            for _ in range(2)]
    _, dense = train_pe(*twice(False), data)
    main, startup, loss = twice(True)
    assert "sum" in [op.type for op in main.global_block().ops]
    for strategy in (None, se.BuildStrategy(fuse_all_reduce_ops=True)):
        _, sparse = train_pe(main, startup, loss, data, strategy=strategy)
        assert rel_err(sparse["emb.w_0"], dense["emb.w_0"]) < 1e-6


@pytest.mark.parametrize("make", [lambda: se.optimizer.Momentum(0.1, momentum=0.9),
                                  lambda: se.optimizer.Adam(0.01),
                                  lambda: se.optimizer.SGD(0.5, weight_decay=0.01)],
                         ids=["momentum", "adam", "sgd-decay"])
def test_other_optimizers_equal_dense_training(make):
    data = feeds(3, vocab=1000)
    _, dense = train_pe(*build(False, make(), vocab=1000), data)
    _, sparse = train_pe(*build(True, make(), vocab=1000), data)
    for name in dense:
        assert rel_err(sparse[name], dense[name]) < 1e-6, name


def test_lazy_adam_is_torch_sparse_adam():
    vocab, eps = 1000, 1e-12
    data = feeds(4, vocab=vocab)
    main, startup, loss = build(True, se.optimizer.Adam(0.01, epsilon=eps, lazy_mode=True),
                                vocab=vocab)
    init, got = train_pe(main, startup, loss, data)
    emb, fc = torch_twin(init)
    sparse_opt = torch.optim.SparseAdam(emb.parameters(), lr=0.01, eps=eps)
    dense_opt = torch.optim.Adam(fc.parameters(), lr=0.01, eps=eps)
    untouched = torch.ones(vocab, dtype=torch.bool)
    for f in data:
        sparse_opt.zero_grad()
        dense_opt.zero_grad()
        ((fc(emb(f["ids"]).mean(1)) - f["y"]) ** 2).mean().backward()
        sparse_opt.step()
        dense_opt.step()
        untouched[f["ids"].reshape(-1)] = False
    assert rel_err(got["embedding_0.w_0"], emb.weight.detach()) < 1e-5
    assert rel_err(got["fc_0.w_0"], fc.weight.detach().T) < 1e-5
    # rows no batch touched keep their initial value (dense Adam would move none either,
    # but a lazy update must not touch them at all)
    assert torch.equal(got["embedding_0.w_0"][untouched], init["embedding_0.w_0"][untouched])


def test_sequential_executor_and_program_files(tmp_path):
    main, startup, loss = build(True, vocab=1000)
    main.validate()
    for suffix in ("json", "ssa"):
        se.save_program(main, str(tmp_path / f"p.{suffix}"))
        assert se.load_program(str(tmp_path / f"p.{suffix}")) == main
    data = feeds(2, vocab=1000)
    results = []
    for compiled in (True, False):
        scope = se.Scope()
        exe = se.Executor(compiled=compiled)
        exe.run(startup, scope=scope)
        for f in data:
            exe.run(main, feed=f, fetch_list=[loss], scope=scope)
        results.append(scope.find_var("embedding_0.w_0").clone())
    assert torch.equal(results[0], results[1])


def test_inside_parallel_do_the_grad_block_gathers_rows():
    def net(ids, y):
        emb = se.layers.embedding(ids, size=[1000, DIM], is_sparse=True)
        return se.layers.square_error_cost(
            se.layers.fc(se.layers.reduce_mean(emb, dim=1), size=1), y)

    results = []
    for parallel in (False, True):
        main, startup = se.Program(), se.Program()
        with se.program_guard(main, startup):
            ids = se.layers.data("ids", shape=[-1, SLOTS], dtype="int64")
            y = se.layers.data("y", shape=[-1, 1], dtype="float32")
            if parallel:
                with se.layers.ParallelDo(2) as pd:
                    pd.write_output(net(pd.read_input(ids), pd.read_input(y)))
                cost = pd()
            else:
                cost = net(ids, y)
            loss = se.layers.mean(cost)
            se.optimizer.SGD(0.5).minimize(loss)
        scope = se.Scope()
        exe = se.Executor()
        exe.run(startup, scope=scope)
        for f in feeds(3, vocab=1000):
            exe.run(main, feed=f, fetch_list=[loss], scope=scope)
        results.append(scope.find_var("embedding_0.w_0").clone())
    assert rel_err(results[1], results[0]) < 1e-6


def test_nbytes_counts_rows_and_values():
    t = torch.sparse_coo_tensor(torch.tensor([[3, 9]]), torch.ones(2, 5), (100, 5),
                                check_invariants=False).coalesce()
    assert nbytes(t) == 2 * 8 + 2 * 5 * 4
    assert nbytes(torch.ones(100, 5)) == 2000


# --- across processes ------------------------------------------------------------------------
def _worker(out):
    """One of two gloo processes: one place each, the sparse model on its shard."""
    se.distributed.init()
    rank = se.distributed.rank()
    main, startup, loss = build(True, vocab=1000)
    strategy = se.distributed.build_strategy()
    with se.ParallelExecutor(se.distributed.local_places(1), main, startup, loss, strategy,
                             scope=se.Scope()) as pe:
        for f in feeds(3, vocab=1000):
            pe.run([loss], feed=se.distributed.shard_batch(f))
        torch.save({p.name: pe.local_scopes[0].find_var(p.name).clone()
                    for p in main.all_parameters()}, os.path.join(out, f"rank{rank}.pt"))
    se.distributed.shutdown()


@pytest.mark.slow
@pytest.mark.processes
@pytest.mark.timeout(120)
def test_two_processes_gather_sparse_rows_like_two_places(tmp_path):
    port = free_port()  # a port no other test running beside this one takes
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2",
               OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    procs = [subprocess.Popen([sys.executable, __file__, str(tmp_path)],
                              env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for r in range(2)]
    outs = [p.communicate(timeout=100)[0].decode() for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    _, ref = train_pe(*build(True, vocab=1000), feeds(3, vocab=1000), places=2)
    for name in ref:
        assert torch.equal(ranks[0][name], ranks[1][name])
        assert rel_err(ranks[0][name], ref[name]) < 1e-6, name


if __name__ == "__main__":
    _worker(sys.argv[1])
