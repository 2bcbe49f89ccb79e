"""Whole-step CUDA graphs (``runtime.cuda_graph``, issue 30 items 5, 6, 7, 8, 10).

The capture/replay logic (static feeds, fallback, rebinding, cache) is plain Python
over scopes; only capturing and replaying is CUDA. Here the real ``StepGraphs``,
driven by a real ``ParallelExecutor.run`` on CPU places, captures with ``HostCapture``:
a dispatch mode that records every ATen call of the captured step and replays them on
the very tensors they were captured with, as a CUDA graph replays its kernels on the
addresses it captured. Like a CUDA capture it leaves every tensor that existed before
the capture as it was (capturing does not run the step), fails on a read on the host
(``strict``) and on a generator the graph does not know, holds the tensors that existed
before the capture only weakly (a replay that reads a freed one fails: a GPU would read
freed memory), and its replays ignore later rebindings in the scopes. torch itself is
the oracle: the same steps run normally. The real thing is tested at the end
(``cuda``-marked, skipped without a GPU).
"""

import weakref

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

import ssaexec as se
from ssaexec.program.example_models import build_cnn, make_optimizer
from ssaexec.program.builder import append_op
from ssaexec.runtime.cuda_graph import CudaCapture, capture_problem

HOST_READS = {"aten._local_scalar_dense.default", "aten.item.default"}


class _Address:
    """A tensor that existed before the capture, held weakly (a CUDA graph holds only its
    address: the caller must keep it alive)."""

    __slots__ = ("ref",)

    def __init__(self, t):
        self.ref = weakref.ref(t)


class _Slot:
    """The ``k``-th tensor the captured step made (a fresh result or a view)."""

    __slots__ = ("k",)

    def __init__(self, k):
        self.k = k


class _HostGraph:
    """A recorded step; ``replay`` runs its calls again on the captured tensors: a fresh
    result is written into the tensor the capture made (its address), a view is made
    again from what it views."""

    def __init__(self, calls, fresh):
        self.calls = calls
        self.fresh = fresh  # slot -> the tensor the capture made, for fresh results

    def replay(self):
        vals = dict(self.fresh)

        def resolve(v):
            if isinstance(v, _Address):
                t = v.ref()
                if t is None:
                    raise RuntimeError("replay reads a tensor freed since the capture")
                return t
            return vals[v.k] if isinstance(v, _Slot) else v
        for func, args, kwargs, slots, fresh in self.calls:
            res = func(*tree_map(resolve, args), **tree_map(resolve, kwargs))
            for k, r in zip(slots, tree_flatten(res)[0], strict=True):
                if k is None:
                    continue
                if fresh:
                    self.fresh[k].copy_(r)
                else:
                    vals[k] = r


class _Record(TorchDispatchMode):
    def __init__(self, strict):
        super().__init__()
        self.strict = strict
        self.invalid = None
        self.calls = []
        self.made = set()   # storages allocated during the capture
        self.slot_of = {}   # id(tensor the step made) -> slot
        self.keep = []      # those tensors, alive while capturing (their ids stay theirs)
        self.fresh = {}     # slot -> a fresh result (kept: the graph's own memory)
        self.saved = {}     # storage pointer -> (storage, its bytes before the capture)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.strict and str(func) in HOST_READS:
            self.invalid = f"{func}: operation not permitted when stream is capturing"
            if self.strict == "op":
                raise RuntimeError(self.invalid)
        schema = func._schema
        named = list(zip(schema.arguments, args)) + \
            [(a, kwargs[a.name]) for a in schema.arguments if a.name in kwargs]
        for arg, value in named:
            if isinstance(value, torch.Generator):
                raise RuntimeError(f"{func}: a generator not registered with the graph")
            if arg.alias_info is not None and arg.alias_info.is_write:
                for t in tree_flatten(value)[0]:
                    if isinstance(t, torch.Tensor):
                        s = t.untyped_storage()
                        if s.data_ptr() not in self.made and s.data_ptr() not in self.saved:
                            self.saved[s.data_ptr()] = (s, s.clone())

        def ref(v):
            if not isinstance(v, torch.Tensor):
                return v
            k = self.slot_of.get(id(v))
            return _Address(v) if k is None else _Slot(k)
        rec_args, rec_kwargs = tree_map(ref, args), tree_map(ref, kwargs)
        given = {id(v) for v in tree_flatten((args, kwargs))[0]}
        out = func(*args, **kwargs)
        fresh = all(r.alias_info is None for r in schema.returns)
        slots = []
        for t in tree_flatten(out)[0]:
            # an in-place op returns its argument: that stays what it was
            if not isinstance(t, torch.Tensor) or id(t) in given:
                slots.append(None)
                continue
            k = len(self.keep)
            self.keep.append(t)
            self.slot_of[id(t)] = k
            if fresh:
                self.made.add(t.untyped_storage().data_ptr())
                self.fresh[k] = t
            slots.append(k)
        self.calls.append((func, rec_args, rec_kwargs, slots, fresh))
        return out


class HostCapture:
    """``StepGraphs``' capture mechanism on the CPU (see the module docstring).

    ``strict``: a read on the host fails the capture at once ("op"), or when the capture
    ends ("end"), as CUDA reports an invalidated capture; False records it.
    """

    def __init__(self, strict=False):
        self.strict = strict
        self.captures = 0

    def capture(self, step):
        rec = _Record(self.strict)
        try:
            with rec:
                result = step()
            if rec.invalid:  # reported when the capture ends, after the whole step
                raise RuntimeError(f"capture invalidated: {rec.invalid}")
        finally:
            # capturing records the step, it does not run it: undo what it wrote
            for s, before in rec.saved.values():
                s.copy_(before)
        self.captures += 1
        return _HostGraph(rec.calls, rec.fresh), result

    def synchronize(self):
        pass


def _graphed(pe, strict=False, warmup=2):
    """Let ``pe`` (CPU places) run its steps through StepGraphs with ``HostCapture``."""
    pe.exec_strategy.cuda_graph = True  # check_places refuses CPU places: set afterwards
    pe.exec_strategy.cuda_graph_warmup = warmup
    pe._graph_capture = lambda: HostCapture(strict)
    return pe


def _cnn(batch_norm=True, optimizer="momentum"):
    return build_cnn("float32", make_optimizer(optimizer, 0.05), size=8, filters=(4, 6),
                     batch_norm=batch_norm)


def _feeds(steps, b=4, seed=3, shapes=None):
    g = torch.Generator().manual_seed(seed)
    return [{"img": torch.randn(s, 1, 8, 8, generator=g),
             "label": torch.randint(0, 10, (s, 1), generator=g)}
            for s in (shapes or [b] * steps)]


def _train(n, feeds, graphs, batch_norm=True, strict=False, program=None, compiled=True):
    main, startup, loss = program or _cnn(batch_norm)
    st = se.ExecutionStrategy(compiled=compiled)
    with se.ParallelExecutor(se.cpu_places(n), main, startup, loss, scope=se.Scope(),
                             exec_strategy=st) as pe:
        if graphs:
            _graphed(pe, strict)
        losses = [pe.run([loss], feed=f, return_merged=False)[0] for f in feeds]
        params = {p.name: [s.find_var(p.name).clone() for s in pe.local_scopes]
                  for p in main.all_parameters()}
        return losses, params, pe.cuda_graph_status([loss])


def _same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert all(torch.equal(u, v) for u, v in zip(x, y, strict=True))


# --- the stand-in is faithful: replays equal normal steps -----------------------------

@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("compiled", [False, True])
def test_replays_on_the_cpu_stand_in_equal_normal_steps(n, compiled):
    feeds = _feeds(8, b=4 * n, shapes=[4 * n] * 4 + [2 * n] * 3 + [4 * n])
    ref, ref_params, none = _train(n, feeds, False, compiled=compiled)
    got, got_params, status = _train(n, feeds, True, compiled=compiled)
    assert none is None and status["fallback"] is None, status
    assert status["captured"] == 2 and status["replays"] == 4, status
    _same(ref, got)
    for name, vals in ref_params.items():
        _same([vals], [got_params[name]])


# --- item 7: the graph owns its static inputs -------------------------------------------

def test_replays_never_write_into_the_callers_feeds_or_dataset():
    # the data set lives "on the device" (here the CPU places' own device): each step
    # feeds slices of it, which bind_feeds binds as they are, without a copy
    data = _feeds(1, b=48)[0]
    kept = {k: v.clone() for k, v in data.items()}
    feeds = [{k: v[8 * i:8 * (i + 1)] for k, v in data.items()} for i in range(6)]
    ref, _, _ = _train(2, feeds, False)
    assert all(torch.equal(data[k], kept[k]) for k in data)
    got, _, status = _train(2, feeds, True)
    assert status["captured"] == 1 and status["replays"] == 4, status
    for k in data:  # the capture step's slices are the caller's: replays must not fill them
        assert torch.equal(data[k], kept[k]), k
    _same(ref, got)


# --- item 5: a failed capture falls back with its feeds ---------------------------------

@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("strict", ["op", "end"])
def test_a_failed_capture_runs_its_step_normally_with_the_feeds(compiled, strict):
    # strict: a host read fails the capture, as on a GPU (SGD reads a CPU lr with .item());
    # the step has freed its feeds by then (at once on the readable path, at its end on
    # the compiled one)
    feeds = _feeds(5)
    ref, ref_params, _ = _train(1, feeds, False, program=_cnn(optimizer="sgd"))
    with pytest.warns(RuntimeWarning, match="capturing the step failed"):
        got, got_params, status = _train(1, feeds, True, strict=strict, compiled=compiled,
                                         program=_cnn(optimizer="sgd"))
    assert status["captured"] == 0 and "RuntimeError" in status["fallback"], status
    _same(ref, got)
    for name, vals in ref_params.items():
        _same([vals], [got_params[name]])


# --- item 6: fixed-seed dropout needs no generator inside the step ----------------------

def _dropout_program(seed):
    main, startup = se.Program(5), se.Program(5)
    with se.program_guard(main, startup):
        x = se.layers.data("x", [-1, 8])
        h = se.layers.dropout(se.layers.fc(x, 8), 0.5, seed=seed)
        loss = se.layers.mean(se.layers.fc(h, 1))
        se.optimizer.Momentum(0.1).minimize(loss)
    return main, startup, loss


def test_fixed_seed_dropout_is_captured_and_replays_its_fixed_mask():
    g = torch.Generator().manual_seed(0)
    feeds = [{"x": torch.randn(4, 8, generator=g)} for _ in range(6)]
    runs = []
    for graphs in (False, True):
        main, startup, loss = _dropout_program(seed=7)
        with se.ParallelExecutor(se.cpu_places(1), main, startup, loss,
                                 scope=se.Scope()) as pe:
            if graphs:
                _graphed(pe)
            runs.append([pe.run([loss], feed=f, return_merged=False)[0] for f in feeds])
            status = pe.cuda_graph_status([loss])
    assert status["fallback"] is None and status["captured"] == 1, status
    _same(*runs)


def test_what_cannot_be_captured_is_known_before_capturing():
    assert capture_problem(se.build_ssa_graph(_dropout_program(seed=7)[0],
                                              se.cpu_places(1))) is None
    handle, why = capture_problem(se.build_ssa_graph(_dropout_program(seed=0)[0],
                                                     se.cpu_places(1)))
    assert handle.op.type == "dropout" and "per-step seeds" in why
    main, startup = se.Program(), se.Program()
    with se.program_guard(main, startup):
        _, outs = append_op("gaussian_random", {}, attrs={"shape": [4, 8]},
                            stop_gradient=True)
        x = se.layers.data("x", [4, 8])
        h = se.layers.elementwise_mul(se.layers.fc(x, 8), outs["Out"][0])
        se.optimizer.SGD(0.1).minimize(se.layers.mean(h))
    handle, why = capture_problem(se.build_ssa_graph(main, se.cpu_places(1)))
    assert handle.op.type == "gaussian_random" and "on the host" in why

    class Noisy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x):
            return (self.fc(x) + torch.randn(4, device=x.device)).sum()
    # an ATen factory draws on the place's device, from the generator a graph registers
    main = se.from_torch(Noisy(), {"x": torch.randn(2, 4)})[0]
    assert "aten.randn.default" in [op.type for op in main.global_block().ops]
    assert capture_problem(se.build_ssa_graph(main, se.cpu_places(1))) is None


# --- item 8: another executor rebinding what the graph reads ----------------------------

def test_an_evaluation_graph_follows_values_the_training_executor_rebinds():
    # the evaluation executor reads the trainer's values through its scopes; the trainer
    # rebinds some (its batch-norm statistics every step, a parameter loaded here): the
    # graph must not keep reading the tensors it was captured on (on a GPU: freed memory)
    main, startup, loss = _cnn(batch_norm=True)
    test = main.clone(for_test=True)
    train_feeds, eval_feed = _feeds(8, seed=1), _feeds(1, seed=2)[0]

    def run(graphs):
        outs = []
        with se.ParallelExecutor(se.cpu_places(1), main, startup, loss,
                                 scope=se.Scope()) as tr, \
                se.ParallelExecutor(se.cpu_places(1), test, share_vars_from=tr) as ev:
            if graphs:
                _graphed(ev)
            for k, f in enumerate(train_feeds):
                tr.run([loss], feed=f)
                w = tr.local_scopes[0].find_var("fc_0.w_0")
                tr.local_scopes[0].set_var("fc_0.w_0", w * (1 + k / 8))  # a weight load
                del w  # nothing of the test's keeps the old weight alive
                outs.append(ev.run([loss], feed=eval_feed, return_merged=False)[0])
            status = ev.cuda_graph_status([loss])
        return outs, status
    ref, _ = run(False)
    got, status = run(True)
    assert status["captured"] == 1 and status["replays"] == 6, status
    _same(ref, got)


def test_a_graph_whose_input_changed_shape_is_captured_again():
    main, startup, loss = _cnn(batch_norm=False)
    # a declared shape binds the value's (runtime.boundary): declared without one, the
    # learning rate may be rebound with another
    main.global_block().var("learning_rate_0").shape = None
    feeds = _feeds(8)
    with se.ParallelExecutor(se.cpu_places(1), main, startup, loss, scope=se.Scope()) as pe:
        _graphed(pe)
        for f in feeds[:4]:
            pe.run([loss], feed=f)
        assert pe.cuda_graph_status([loss])["captured"] == 1
        lr = pe.local_scopes[0].find_var("learning_rate_0")
        pe.local_scopes[0].set_var("learning_rate_0", lr.reshape(1, 1).clone())
        got = [pe.run([loss], feed=f, return_merged=False)[0] for f in feeds[4:]]
        status = pe.cuda_graph_status([loss])
    assert status["captured"] == 2 and status["fallback"] is None, status
    with se.ParallelExecutor(se.cpu_places(1), main, startup, loss, scope=se.Scope()) as pe:
        for f in feeds[:4]:
            pe.run([loss], feed=f)
        pe.local_scopes[0].set_var("learning_rate_0", lr.reshape(1, 1).clone())
        ref = [pe.run([loss], feed=f, return_merged=False)[0] for f in feeds[4:]]
    _same(ref, got)


# --- on a GPU -----------------------------------------------------------------------------

def _cuda_run(sync="event", shapes=(8, 8, 8, 8, 6, 6, 6, 6, 8, 6), graphs=True, seed=0):
    main, startup = se.Program(5), se.Program(5)
    with se.program_guard(main, startup):
        x = se.layers.data("x", [-1, 8])
        h = se.layers.dropout(se.layers.fc(x, 8), 0.5, seed=seed) if seed else \
            se.layers.fc(x, 8)
        loss = se.layers.mean(se.layers.fc(h, 1))
        se.optimizer.Momentum(0.1).minimize(loss)
    g = torch.Generator().manual_seed(0)
    feeds = [{"x": torch.randn(b, 8, generator=g).cuda()} for b in shapes]
    kept = [f["x"].clone() for f in feeds]
    st = se.ExecutionStrategy(cuda_graph=graphs, sync=sync)
    places = [se.CUDAPlace(i, device_index=0) for i in range(2)]
    with se.ParallelExecutor(places, main, startup, loss, exec_strategy=st,
                             scope=se.Scope()) as pe:
        losses = [pe.run([loss], feed=f, return_merged=False)[0] for f in feeds]
        runner = pe._runner((loss.name,))
        sg = pe._step_graphs.get(id(runner))
        pools = {e.graph.pool() for e in sg.graphs.values()} if sg else set()
        return losses, pe.cuda_graph_status([loss]), pools, sg, feeds, kept


@pytest.mark.cuda
@pytest.mark.parametrize("sync", ["event", "wait"])
def test_cuda_capture_under_either_sync_with_one_pool_and_the_callers_feeds_untouched(sync):
    ref = _cuda_run(sync, graphs=False)[0]
    got, status, pools, sg, feeds, kept = _cuda_run(sync)
    assert status["fallback"] is None and status["captured"] == 2, status
    assert len(pools) == 1 and pools == {sg.capture.pool}
    _same(ref, got)
    assert all(torch.equal(f["x"], k) for f, k in zip(feeds, kept, strict=True))


@pytest.mark.cuda
def test_cuda_capture_of_fixed_seed_dropout():
    ref = _cuda_run(graphs=False, seed=11)[0]
    got, status, *_ = _cuda_run(seed=11)
    assert status["fallback"] is None and status["captured"] == 2, status
    _same(ref, got)


@pytest.mark.cuda
def test_cuda_evaluation_graph_never_replays_on_a_freed_tensor():
    # item 8 on the GPU: torch's liveness check fails a replay that reads freed memory
    main, startup, loss = _cnn(batch_norm=True)
    test = main.clone(for_test=True)
    train_feeds, eval_feed = _feeds(8, seed=1), _feeds(1, seed=2)[0]
    places = [se.CUDAPlace(0)]

    def run(graphs):
        outs = []
        with se.ParallelExecutor(places, main, startup, loss, scope=se.Scope()) as tr, \
                se.ParallelExecutor(places, test, share_vars_from=tr,
                                    exec_strategy=se.ExecutionStrategy(
                                        cuda_graph=graphs)) as ev:
            ev._graph_capture = lambda: CudaCapture("cuda:0", check_liveness=True)
            for k, f in enumerate(train_feeds):
                tr.run([loss], feed=f)
                w = tr.local_scopes[0].find_var("fc_0.w_0")
                tr.local_scopes[0].set_var("fc_0.w_0", w * (1 + k / 8))
                del w
                outs.append([v.cpu() for v in ev.run([loss], feed=eval_feed,
                                                     return_merged=False)[0]])
            status = ev.cuda_graph_status([loss])
        return outs, status
    ref, _ = run(False)
    got, status = run(True)
    assert status["captured"] == 1 and status["replays"] == 6, status
    _same(ref, got)
