"""The compiled hot path (``runtime.compiled``, ``runtime.codegen``, ``graph.aliasing``).

Every check compares against the readable path (``compiled=False``: one
``OpCall`` per op handle, run-time unaliasing), which the rest of the suite
checks against torch: results must be bit-identical, not merely close.
"""

import os

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import ssaexec as se
from ssaexec.program import example_models as models
from ssaexec.cli import synthetic_feed
from ssaexec.core.errors import OpError
from ssaexec.ops import optim as optim_ops
from ssaexec.ops.registry import register_op

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = os.path.join(REPO, "examples")


def _train(main, startup, loss, feeds, places, compiled, threads=None):
    scope = se.Scope()
    strategy = se.ExecutionStrategy(compiled=compiled, num_threads=threads)
    with se.ParallelExecutor(places, main, startup, loss, scope=scope,
                             exec_strategy=strategy) as pe:
        losses = [pe.run([loss], feed=f)[0] for f in feeds]
        state = [{n: t.clone() for n, t in ls.vars.items()} for ls in pe.local_scopes]
        runner = pe._runner((loss if isinstance(loss, str) else loss.name,))
    return losses, state, runner


def _same(a, b):
    la, sa = a[0], b[0]
    assert len(la) == len(lb := b[0])
    for x, y in zip(la, lb, strict=True):
        assert torch.equal(x, y), (x, y)
    for pa, pb in zip(a[1], b[1], strict=True):
        assert pa.keys() == pb.keys()
        for n in pa:
            assert torch.equal(pa[n], pb[n]), n
    return sa


@pytest.mark.parametrize("name", ["seed_mlp", "mnist_mlp", "uci_housing", "small_resnet"])
@pytest.mark.parametrize("n_places", [1, 2])
def test_examples_bit_identical_to_the_readable_path(name, n_places):
    main = se.load_program(os.path.join(EXAMPLES, f"{name}.json"))
    startup = se.load_program(os.path.join(EXAMPLES, f"{name}.startup.json"))
    loss = next(op.output_names()[0] for op in main.global_block().ops if op.role == "loss")
    loss = loss[:-len("@GRAD")]
    feeds = [synthetic_feed(main, 4 * n_places, seed=s) for s in range(3)]
    places = se.cpu_places(n_places)
    fast = _train(main, startup, loss, feeds, places, True)
    slow = _train(main, startup, loss, feeds, places, False)
    _same(fast, slow)
    assert fast[2].clones == 0


class _Tr(nn.Module):
    def __init__(self, d=16, heads=2, dropout=0.0):
        super().__init__()
        layer = nn.TransformerEncoderLayer(d, heads, 2 * d, dropout=dropout, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(d, 5)

    def forward(self, x):
        return self.head(self.enc(x).mean(1))


class _Conv(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4 * 6 * 6, 5)

    def forward(self, x):
        return self.fc(F.relu(self.bn(self.c(x))).flatten(1))


@pytest.mark.slow
@pytest.mark.parametrize("model,shape", [(_Tr, (4, 6, 16)), (_Conv, (4, 3, 6, 6))])
@pytest.mark.parametrize("opt", ["sgd", "momentum", "adam"])
def test_imported_models_bit_identical_and_copy_free(model, shape, opt):
    torch.manual_seed(0)
    m = model().double()
    x = torch.randn(*shape, dtype=torch.float64)
    y = torch.randint(0, 5, (shape[0],))
    optimizer = {"sgd": se.optimizer.SGD(0.05),
                 "momentum": se.optimizer.Momentum(0.05, use_nesterov=True),
                 "adam": se.optimizer.AdamW(0.01, weight_decay=0.1)}[opt]
    main, startup, loss = se.from_torch(m, {"x": x, "target": y}, loss_fn=F.cross_entropy,
                                        optimizer=optimizer)
    feeds = [{"x": x + k, "target": y} for k in range(3)]
    for n in (1, 2):
        fast = _train(main, startup, loss, feeds, se.cpu_places(n), True)
        slow = _train(main, startup, loss, feeds, se.cpu_places(n), False)
        _same(fast, slow)
        assert fast[2].clones == 0, "views of parameters and gradients need no copy"
    # one place, one process: the whole step is one segment of straight-line code
    assert len(_train(main, startup, loss, feeds[:1], se.cpu_places(1), True)[2].segments) == 1


def test_sequential_executor_paths_agree():
    main, startup, loss = models.build_cnn("float64", se.optimizer.Adam(0.01), channels=1,
                                              size=8, filters=(4,))
    feeds = [synthetic_feed(main, 6, seed=s) for s in range(3)]
    out = []
    for compiled in (True, False):
        scope = se.Scope()
        exe = se.Executor(se.CPUPlace(), compiled=compiled)
        exe.run(startup, scope=scope)
        losses = [exe.run(main, feed=f, fetch_list=[loss], scope=scope)[0] for f in feeds]
        out.append((losses, {n: t.clone() for n, t in scope.vars.items()}))
    for a, b in zip(out[0][0], out[1][0], strict=True):
        assert torch.equal(a, b)
    assert out[0][1].keys() == out[1][1].keys()
    for n in out[0][1]:
        assert torch.equal(out[0][1][n], out[1][1][n]), n


def _view_program(reader_after_update):
    """w (persistable) -> vt = aten.t(w); sgd updates w in place; a reader of vt.

    With ``reader_after_update`` the reader also reads the updated w, so it must
    run after the update and still see the old values through the view.
    """
    main = se.Program()
    b = main.global_block()
    b.create_var("w", shape=[2, 3], dtype="float64", persistable=True)
    b.create_var("g", shape=[2, 3], dtype="float64", persistable=True)
    b.create_var("lr", shape=[1], dtype="float64", persistable=True)
    for n in ("vt", "out"):
        b.create_var(n, shape=None, dtype="float64")
    b.append_op("aten.t.default", inputs={"X": ["w"]}, outputs={"Out": ["vt"]},
                attrs={"self": "X[0]"})
    b.append_op("sgd", inputs={"Param": ["w"], "Grad": ["g"], "LearningRate": ["lr"]},
                outputs={"ParamOut": ["w"]})
    if reader_after_update:  # out = vt @ w_new: [3, 2] x [2, 3]
        b.append_op("aten.mm.default", inputs={"X": ["vt", "w"]}, outputs={"Out": ["out"]},
                    attrs={"self": "X[0]", "mat2": "X[1]"})
    else:
        b.append_op("aten.mul.Tensor", inputs={"X": ["vt"]}, outputs={"Out": ["out"]},
                    attrs={"self": "X[0]", "other": "X[0]"})
    return main


@pytest.mark.parametrize("after", [False, True])
@pytest.mark.parametrize("n_places", [1, 2])
def test_a_view_later_updated_in_place_is_protected(after, n_places):
    main = _view_program(after)
    w0 = torch.arange(6, dtype=torch.float64).reshape(2, 3)
    g = torch.ones(2, 3, dtype=torch.float64)
    lr = torch.tensor([0.5], dtype=torch.float64)
    results = {}
    for compiled in (True, False):
        scope = se.Scope()
        for n, t in (("w", w0), ("g", g), ("lr", lr)):
            scope.set_var(n, t.clone())
        with se.ParallelExecutor(se.cpu_places(n_places), main, scope=scope,
                                 exec_strategy=se.ExecutionStrategy(compiled=compiled)) as pe:
            out = pe.run(["out"], return_merged=False)[0]
            if compiled:
                runner = pe._runner(("out",))
        results[compiled] = out
    w1 = w0 - 0.5 * g
    expect = w0.t() @ w1 if after else w0.t() * w0.t()
    for compiled, outs in results.items():
        for o in outs:
            assert torch.equal(o, expect), compiled
    # the reader downstream of the update forces one copy of the view per place and step
    assert runner.clones == (n_places if after else 0)
    assert (len(runner.lowering.alias.copy) > 0) == after


@pytest.mark.parametrize("kind", ["sgd", "momentum", "nesterov", "adam", "adamw"])
@pytest.mark.parametrize("wd", [0.0, 0.01])
def test_foreach_optimizers_equal_the_per_parameter_updates(kind, wd):
    torch.manual_seed(1)
    shapes = [(3, 4), (4,), (2, 2, 3), (1,)]
    op_type = {"nesterov": "momentum", "adamw": "adam"}.get(kind, kind)
    attrs = {"weight_decay": wd}
    if kind in ("momentum", "nesterov"):
        attrs.update(mu=0.9, use_nesterov=kind == "nesterov")
    if op_type == "adam":
        attrs.update(beta1=0.9, beta2=0.999, epsilon=1e-8, decoupled=kind == "adamw")
    lr = torch.tensor([0.1])

    def state():
        torch.manual_seed(2)
        cols = {"Param": [torch.randn(s) for s in shapes], "Grad": [torch.randn(s) for s in shapes]}
        if op_type == "momentum":
            cols["Velocity"] = [torch.randn(s) for s in shapes]
        if op_type == "adam":
            cols["Moment1"] = [torch.randn(s) for s in shapes]
            cols["Moment2"] = [torch.rand(s) for s in shapes]
            cols["Beta1Pow"] = [torch.tensor([0.9 ** (k + 1)]) for k in range(len(shapes))]
            cols["Beta2Pow"] = [torch.tensor([0.999 ** (k + 1)]) for k in range(len(shapes))]
        return cols

    per, fused = state(), state()
    kernel = se.ops.registry.get_op_def(op_type).kernel
    for _ in range(3):
        for k in range(len(shapes)):
            kernel({**{s: v[k] for s, v in per.items()}, "LearningRate": lr}, attrs)
        optim_ops.FUSED[op_type](fused, lr, attrs)
    for slot in per:
        for a, b in zip(per[slot], fused[slot], strict=True):
            assert torch.equal(a, b), slot


@register_op("_test_hot_path_returns_none", ["X"], ["Out"], grad=None)
def _returns_none(ins, attrs):
    return None


@register_op("_test_hot_path_drops_a_slot", ["X"], ["Out"], grad=None)
def _drops_a_slot(ins, attrs):
    return {"Other": ins["X"]}


@pytest.mark.parametrize("op_type,what", [("_test_hot_path_returns_none", "returned"),
                                          ("_test_hot_path_drops_a_slot", "Out")])
def test_a_kernel_that_breaks_its_contract_is_an_op_error(op_type, what):
    main = se.Program()
    b = main.global_block()
    b.create_var("x", shape=[2], dtype="float32", persistable=True)
    b.create_var("y", shape=[2], dtype="float32")
    b.create_var("z", shape=[2], dtype="float32")
    b.append_op(op_type, inputs={"X": ["x"]}, outputs={"Out": ["y"]})
    b.append_op("scale", inputs={"X": ["y"]}, outputs={"Out": ["z"]}, attrs={"scale": 2.0})
    scope = se.Scope()
    scope.set_var("x", torch.ones(2))
    with pytest.raises(OpError, match=f"op #0 '{op_type}' on cpu:0.*{what}") as info:
        se.Executor().run(main, fetch_list=["z"], scope=scope)
    assert info.value.op_type == op_type


def test_errors_name_the_op_and_shapes_as_the_readable_path_does():
    main, startup = se.Program(), se.Program()
    with se.program_guard(main, startup):
        x = se.layers.data("x", [-1, 3], "float32")
        se.layers.fc(x, 2)
    scope = se.Scope()
    se.Executor().run(startup, scope=scope)
    scope.set_var("fc_0.w_0", torch.ones(5, 2))  # a weight of the wrong shape
    # ... that its declaration does not refuse first (runtime.boundary): none is declared
    main.global_block().var("fc_0.w_0").shape = None
    msgs = []
    for compiled in (True, False):
        with pytest.raises(OpError) as info:
            se.Executor(compiled=compiled).run(main, feed={"x": torch.ones(4, 3)}, scope=scope)
        msgs.append(str(info.value))
    assert msgs[0] == msgs[1]
    assert "op #0 'mul' on cpu:0 with input shapes" in msgs[0] and "[5, 2]" in msgs[0]


def test_missing_input_names_the_var():
    main, startup = se.Program(), se.Program()
    with se.program_guard(main, startup):
        x = se.layers.data("x", [-1, 3], "float32")
        se.layers.fc(x, 2)
    with pytest.raises(OpError, match="input var 'fc_0.w_0' has no value"):
        se.Executor().run(main, feed={"x": torch.ones(4, 3)}, scope=se.Scope())


@pytest.mark.parametrize("threads", [1, 2, 4])
def test_thread_counts_give_identical_results(threads):
    main, startup, loss = models.build_mlp("float64", se.optimizer.Momentum(0.1), in_dim=8,
                                              hidden=(6,), classes=3)
    feeds = [synthetic_feed(main, 8, seed=s) for s in range(3)]
    ref = _train(main, startup, loss, feeds, se.cpu_places(3), True, threads=1)
    got = _train(main, startup, loss, feeds, se.cpu_places(3), True, threads=threads)
    _same(ref, got)


def test_each_places_updates_are_one_fused_segment_on_several_places():
    """The updates of a place wait for all their all-reduces as one run, so they fuse
    (runtime.node_graph.partition); results equal the readable path's bit for bit."""
    from ssaexec.runtime.node_graph import Segment, partition
    main, startup = se.Program(), se.Program()
    with se.program_guard(main, startup):
        x = se.layers.data("x", shape=[-1, 6], dtype="float32")
        y = se.layers.data("y", shape=[-1, 1], dtype="float32")
        h = se.layers.fc(se.layers.fc(x, size=8, act="relu"), size=8, act="relu")
        loss = se.layers.mean(se.layers.square_error_cost(se.layers.fc(h, size=1), y))
        se.optimizer.Momentum(0.1, 0.9).minimize(loss)
    graph = se.build_ssa_graph(main, se.cpu_places(2))
    nodes = partition(graph, noop_collectives=False).nodes
    for pi in range(2):
        updating = [n for n in nodes if isinstance(n, Segment) and n.place_idx == pi and
                    any(h.section() == "optimize" for h in n.handles)]
        assert len(updating) == 1, [len(n.handles) for n in updating]
        assert sum(h.op.type == "momentum" for h in updating[0].handles) == 6
    torch.manual_seed(0)
    feed = {"x": torch.randn(8, 6), "y": torch.randn(8, 1)}
    params = {}
    for compiled in (True, False):
        scope = se.Scope()
        with se.ParallelExecutor(se.cpu_places(2), main, startup, loss.name, scope=scope,
                                 exec_strategy=se.ExecutionStrategy(compiled=compiled)) as pe:
            if compiled:
                source = "".join(s.lowered.source for s in pe._runner((loss.name,)).segments
                                 if s.lowered is not None)
            for _ in range(3):
                pe.run([loss], feed=feed)
            params[compiled] = {p.name: pe.get_var(p.name).clone()
                                for p in main.all_parameters()}
    # one fused call per place, over all six parameters
    calls = [line for line in source.splitlines() if "'Velocity': [" in line]
    assert len(calls) == 2, calls
    for line in calls:
        params_list = line.split("'Param': [", 1)[1].split("]", 1)[0]
        assert len(params_list.split(", ")) == 6, line
    for name, value in params[True].items():
        assert torch.equal(value, params[False][name]), name
