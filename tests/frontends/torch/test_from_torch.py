"""``se.from_torch``: imported torch modules train like torch does.

Acceptance: an MLP and a transformer encoder block on 2 places match eager
training on the concatenated batch; a ResNet-18 (batch norm with per-replica
statistics) matches DistributedDataParallel with 2 gloo processes fed the same
halves; a saved imported program reloads from JSON and trains identically. All
in float64 to 1e-6, with SGD and Adam, 5 steps. Captures are slow (seconds), so
each model is captured once per module and the optimizers are appended to clones.
"""

import math
import os
import tempfile

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import ssaexec as se
from ssaexec.frontends.torch import from_torch
from ssaexec.ops.aten import decode_bytes, encode_bytes, parse_size_expr
from ssaexec.program.desc import grad_var_name

from tests.ports import free_port

STEPS = 5
B = 8  # whole batch; 2 places get 4 each
LR = {"sgd": 0.05, "adam": 0.01}


# --- models ------------------------------------------------------------------------------------
class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 16), nn.Tanh(),
                                 nn.Linear(16, 5))

    def forward(self, x):
        return self.net(x)


class Encoder(nn.Module):
    """A transformer encoder block (attention, layer norm, GELU; dropout off) and a head."""

    def __init__(self, d=8, heads=2, ff=16, classes=3):
        super().__init__()
        self.block = nn.TransformerEncoderLayer(d, heads, ff, dropout=0.0, activation="gelu",
                                                batch_first=True)
        self.head = nn.Linear(d, classes)

    def forward(self, x):
        return self.head(self.block(x).mean(1))


class Zoo(nn.Module):
    """Integer inputs, an LSTM (a zero state built from the batch size), lists in and out."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(20, 6)
        self.lstm = nn.LSTM(6, 8, batch_first=True)
        self.conv = nn.Conv1d(8, 8, 3, padding=1)
        self.norm = nn.LayerNorm(16)
        self.fc = nn.Linear(16, 4)

    def forward(self, x):
        h, _ = self.lstm(self.emb(x))
        c = self.conv(h.transpose(1, 2)).transpose(1, 2)
        a, b = torch.split(c, 4, dim=2)
        z = self.norm(torch.cat([a, b, F.softmax(h, -1)], dim=2))
        z = F.max_pool1d(z.transpose(1, 2), 2).transpose(1, 2)
        return self.fc(z.mean(1) + z.amax(1))


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                            nn.BatchNorm2d(cout))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += identity
        return self.relu(out)


class ResNet18(nn.Module):
    """torchvision's ResNet-18 topology, narrow (``width`` channels in the stem)."""

    def __init__(self, width=4, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        cin = width
        for i, c in enumerate([width, 2 * width, 4 * width, 8 * width]):
            setattr(self, f"layer{i + 1}", nn.Sequential(
                BasicBlock(cin, c, 1 if i == 0 else 2), BasicBlock(c, c, 1)))
            cin = c
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def _make(name):
    torch.manual_seed({"mlp": 1, "encoder": 2, "resnet": 3, "zoo": 4}[name])
    model = {"mlp": MLP, "encoder": Encoder, "resnet": ResNet18, "zoo": Zoo}[name]().double()
    shape, classes = {"mlp": ([12], 5), "encoder": ([5, 8], 3),
                      "resnet": ([3, 16, 16], 10), "zoo": ([4], 4)}[name]
    g = torch.Generator().manual_seed(7)

    def example():
        if name == "zoo":
            return torch.randint(0, 20, [B, *shape], generator=g)
        return torch.randn([B, *shape], dtype=torch.float64, generator=g)

    batches = [(example(), torch.randint(0, classes, (B,), generator=g)) for _ in range(STEPS)]
    return model, batches


def _torch_optimizer(name, params):
    if name == "sgd":
        return torch.optim.SGD(params, lr=LR["sgd"])
    return torch.optim.Adam(params, lr=LR["adam"])


def _se_optimizer(name):
    return se.optimizer.SGD(LR["sgd"]) if name == "sgd" else se.optimizer.Adam(LR["adam"])


_CAPTURED = {}


def _captured(name):
    """(model, batches, main, startup, loss): captured once, without an optimizer."""
    if name not in _CAPTURED:
        model, batches = _make(name)
        x, t = batches[0]
        main, startup, loss = from_torch(model, {"x": x, "target": t}, loss_fn=F.cross_entropy)
        _CAPTURED[name] = (model, batches, main, startup, loss)
    return _CAPTURED[name]


def _with_optimizer(main, startup, opt):
    """Clones of ``main``/``startup`` with ``opt``'s updates appended (what from_torch does)."""
    main, startup = main.clone(), startup.clone()
    block = main.global_block()
    pairs = [(p, block.var(grad_var_name(p.name))) for p in main.all_parameters()
             if grad_var_name(p.name) in block.vars]
    with se.program_guard(main, startup):
        opt.apply_gradients(pairs, startup)
    return main, startup


def _train_ssaexec(main, startup, loss, batches, places=2):
    scope = se.Scope()
    with se.ParallelExecutor(se.cpu_places(places), main, startup, loss, scope=scope) as pe:
        losses = [pe.run([loss], feed={"x": x, "target": t}, return_merged=False)[0]
                  for x, t in batches]
        return torch.stack([torch.stack(v) for v in losses]), pe.local_scopes


def _close(a, b):
    return torch.allclose(a, b, rtol=1e-6, atol=1e-9)


# --- acceptance 1: MLP and transformer against eager on the whole batch ------------------------
@pytest.mark.parametrize("name,opt_name", [("mlp", "sgd"), ("mlp", "adam"), ("encoder", "sgd"),
                                           ("encoder", "adam"), ("zoo", "sgd")])
@pytest.mark.slow
def test_matches_eager_on_the_concatenated_batch(name, opt_name):
    model, batches, main0, startup0, loss = _captured(name)
    main, startup = _with_optimizer(main0, startup0, _se_optimizer(opt_name))
    per_place, scopes = _train_ssaexec(main, startup, loss, batches)

    ref = _make(name)[0]
    ref.load_state_dict(model.state_dict())
    opt = _torch_optimizer(opt_name, ref.parameters())
    ref_losses = []
    for x, t in batches:
        opt.zero_grad()
        lv = F.cross_entropy(ref(x), t)
        lv.backward()
        opt.step()
        ref_losses.append(lv.detach())
    # each place's mean over its half; their mean is the mean over the whole batch
    assert _close(per_place.mean(1), torch.stack(ref_losses))
    for pname, p in ref.named_parameters():
        for scope in scopes:
            assert _close(scope.find_var(pname), p.detach()), pname


@pytest.mark.parametrize("strategy", [dict(reduce_strategy="reduce"),
                                      dict(fuse_all_reduce_ops=True),
                                      dict(enable_sequential_execution=True)])
def test_build_strategies_agree(strategy):
    model, batches, main0, startup0, loss = _captured("encoder")
    main, startup = _with_optimizer(main0, startup0, _se_optimizer("adam"))
    want, want_scopes = _train_ssaexec(main, startup, loss, batches[:2])
    scope = se.Scope()
    with se.ParallelExecutor(se.cpu_places(2), main, startup, loss, scope=scope,
                             build_strategy=se.BuildStrategy(**strategy)) as pe:
        got = torch.stack([torch.stack(pe.run([loss], feed={"x": x, "target": t},
                                               return_merged=False)[0])
                           for x, t in batches[:2]])
        assert _close(got, want)
        for pname, _ in model.named_parameters():
            for s in pe.local_scopes:
                assert _close(s.find_var(pname), want_scopes[0].find_var(pname)), pname


@pytest.mark.cuda
def test_imported_program_runs_on_cuda():
    model, batches, main0, startup0, loss = _captured("mlp")
    main, startup = _with_optimizer(main0, startup0, _se_optimizer("sgd"))
    want, _ = _train_ssaexec(main, startup, loss, batches, places=1)
    with se.ParallelExecutor(se.cuda_places()[:1], main, startup, loss, scope=se.Scope()) as pe:
        got = torch.stack([pe.run([loss], feed={"x": x, "target": t})[0].cpu()
                           for x, t in batches])
    assert _close(got, want[:, 0])


def test_from_torch_with_optimizer_argument_and_sequential_executor():
    model, batches = _make("mlp")
    x, t = batches[0]
    main, startup, loss = from_torch(model, {"x": x, "target": t}, loss_fn=F.cross_entropy,
                                     optimizer=se.optimizer.Adam(LR["adam"]))
    scope, exe = se.Scope(), se.Executor()
    exe.run(startup, scope=scope)
    opt = _torch_optimizer("adam", model.parameters())
    for x, t in batches:
        got, = exe.run(main, feed={"x": x, "target": t}, fetch_list=[loss], scope=scope)
        opt.zero_grad()
        lv = F.cross_entropy(model(x), t)
        lv.backward()
        opt.step()
        assert _close(got, lv.detach())
    for pname, p in model.named_parameters():
        assert _close(scope.find_var(pname), p.detach()), pname


# --- acceptance 1: ResNet-18 against DDP (2 gloo processes) ------------------------------------
def _ddp_worker(rank, port, state, batches, out_dir):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    try:
        result = {}
        for opt_name in ("sgd", "adam"):
            model = ResNet18().double()
            model.load_state_dict(state)
            ddp = DDP(model)
            opt = _torch_optimizer(opt_name, ddp.parameters())
            losses = []
            for x, t in batches:
                opt.zero_grad()
                lv = F.cross_entropy(ddp(x.chunk(2)[rank]), t.chunk(2)[rank])
                lv.backward()
                opt.step()
                losses.append(lv.detach())
            result[opt_name] = {"losses": torch.stack(losses), "state": model.state_dict()}
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ddp_reference():
    import torch.multiprocessing as mp
    model, batches, *_ = _captured("resnet")
    with tempfile.TemporaryDirectory() as out_dir:
        mp.spawn(_ddp_worker, args=(free_port(), model.state_dict(), batches, out_dir),
                 nprocs=2, join=True)
        return [torch.load(os.path.join(out_dir, f"rank{r}.pt"), weights_only=True)
                for r in range(2)]


@pytest.mark.slow
@pytest.mark.processes  # and one worker computes ddp_reference once for both
@pytest.mark.parametrize("opt_name", ["sgd", "adam"])
def test_resnet18_matches_ddp_with_per_replica_batch_norm(ddp_reference, opt_name):
    model, batches, main0, startup0, loss = _captured("resnet")
    main, startup = _with_optimizer(main0, startup0, _se_optimizer(opt_name))
    per_place, scopes = _train_ssaexec(main, startup, loss, batches)
    for rank in range(2):
        assert _close(per_place[:, rank], ddp_reference[rank][opt_name]["losses"]), rank
    state0 = ddp_reference[0][opt_name]["state"]
    for name, value in state0.items():
        got = scopes[0].find_var(name)
        if name.endswith("num_batches_tracked"):
            assert torch.equal(got, value), name
        else:
            assert _close(got, value), name
    # parameters agree on every place; statistics are per place (the halves differ)
    for pname, _ in model.named_parameters():
        assert _close(scopes[1].find_var(pname), state0[pname]), pname
    assert not torch.allclose(scopes[0].find_var("bn1.running_mean"),
                              scopes[1].find_var("bn1.running_mean"))


# --- acceptance 2: save / load ---------------------------------------------------------------
def test_saved_program_reloads_from_json_and_trains_identically(tmp_path):
    model, batches, main0, startup0, loss = _captured("resnet")
    main, startup = _with_optimizer(main0, startup0, _se_optimizer("adam"))
    se.save_program(main, tmp_path / "main.json")
    se.save_program(startup, tmp_path / "startup.json")
    main2 = se.load_program(tmp_path / "main.json", validate=True)
    startup2 = se.load_program(tmp_path / "startup.json", validate=True)
    assert main2 == main and startup2 == startup
    want, want_scopes = _train_ssaexec(main, startup, loss, batches)
    got, got_scopes = _train_ssaexec(main2, startup2, loss, batches)
    assert torch.equal(got, want)
    for name in want_scopes[0].var_names():
        assert torch.equal(got_scopes[0].find_var(name), want_scopes[0].find_var(name)), name
    # the text form round-trips too
    se.save_program(main, tmp_path / "main.txt")
    assert se.load_program(tmp_path / "main.txt") == main


# --- the program's shape -------------------------------------------------------------------------
def test_program_names_roles_and_gradients():
    model, batches, main, startup, loss = _captured("resnet")
    block = main.global_block()
    assert loss == "loss"
    assert [v.name for v in main.data_vars()] == ["x", "target"]
    assert block.var("x").shape == [-1, 3, 16, 16] and block.var("target").shape == [-1]
    assert [p.name for p in main.all_parameters()] == [n for n, _ in model.named_parameters()]
    for name, buf in model.named_buffers():
        assert block.var(name).persistable and not block.var(name).is_parameter
    assert sum(op.role == "loss" for op in block.ops) == 1
    seed = next(op for op in block.ops if op.role == "loss")
    assert seed.type == "fill_constant" and seed.output("Out") == ["loss@GRAD"]
    pairs = [pg for op in block.ops if op.role == "backward" for pg in op.role_var]
    assert sorted(pairs) == sorted((n, n + "@GRAD") for n, _ in model.named_parameters())
    for op in block.ops:
        for p, g in op.role_var:
            assert g in op.output_names()
    # batch-norm statistics are written back under their own names
    writers = {n for op in block.ops for n in op.output_names()}
    assert {"bn1.running_mean", "bn1.running_var", "bn1.num_batches_tracked"} <= writers
    # startup sets exactly the module's values
    scope = se.Scope()
    se.Executor().run(startup, scope=scope)
    for name, value in model.state_dict().items():
        assert torch.equal(scope.find_var(name), value), name
    graph = se.build_ssa_graph(main, se.cpu_places(2))
    graph.lint()
    assert sum(h.kind == "all_reduce" for h in graph.collectives) == len(pairs)


def test_any_batch_size_runs():
    model, batches, main, startup, loss = _captured("mlp")
    scope, exe = se.Scope(), se.Executor()
    exe.run(startup, scope=scope)
    for b in (3, 8, 11):
        x, t = torch.randn(b, 12, dtype=torch.float64), torch.randint(0, 5, (b,))
        got, = exe.run(main, feed={"x": x, "target": t}, fetch_list=[loss], scope=scope)
        assert _close(got, F.cross_entropy(model(x), t).detach())


def test_module_is_left_untouched():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(16, 2))
    x, t = torch.randn(4, 3, 4, 4), torch.randint(0, 2, (4,))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    params = [id(p) for p in model.parameters()]
    from_torch(model, {"input": x, "target": t}, loss_fn=F.cross_entropy, validate=False)
    assert [id(p) for p in model.parameters()] == params
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]) and not v.is_meta, k


class _Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(6, 6, bias=False)
        self.b = nn.Linear(6, 6, bias=False)
        self.b.weight = self.a.weight
        self.head = nn.Linear(6, 3)
        self.frozen = nn.Linear(6, 6)
        self.frozen.requires_grad_(False)

    def forward(self, x):
        return self.head(self.b(torch.relu(self.a(self.frozen(x)))))


def test_tied_and_frozen_parameters():
    torch.manual_seed(0)
    model = _Tied().double()
    x, t = torch.randn(4, 6, dtype=torch.float64), torch.randint(0, 3, (4,))
    main, startup, loss = from_torch(model, {"x": x, "target": t}, loss_fn=F.cross_entropy,
                                     optimizer=se.optimizer.SGD(0.1))
    names = [p.name for p in main.all_parameters()]
    assert "b.weight" not in names and "a.weight" in names
    scope, exe = se.Scope(), se.Executor()
    exe.run(startup, scope=scope)
    exe.run(main, feed={"x": x, "target": t}, scope=scope)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    F.cross_entropy(model(x), t).backward()
    opt.step()
    for name, p in model.named_parameters():
        if name != "b.weight":
            assert _close(scope.find_var(name), p.detach()), name


def test_loss_fn_module_with_state():
    model, batches = _make("mlp")
    weight = torch.linspace(0.5, 1.5, 5, dtype=torch.float64)
    loss_fn = nn.CrossEntropyLoss(weight=weight)
    x, t = batches[0]
    main, startup, loss = from_torch(model, {"x": x, "target": t}, loss_fn=loss_fn)
    assert main.global_block().var("loss_fn.weight").persistable
    scope = se.Scope()
    se.Executor().run(startup, scope=scope)
    got, = se.Executor().run(main, feed={"x": x, "target": t}, fetch_list=[loss], scope=scope)
    assert _close(got, loss_fn(model(x), t).detach())


def test_forward_returning_the_loss():
    class WithLoss(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 1)

        def forward(self, x, y):
            return ((self.fc(x) - y) ** 2).mean()

    torch.manual_seed(0)
    model = WithLoss().double()
    x, y = torch.randn(6, 3, dtype=torch.float64), torch.randn(6, 1, dtype=torch.float64)
    main, startup, loss = from_torch(model, {"x": x, "y": y}, optimizer=se.optimizer.SGD(0.1))
    scope = se.Scope()
    with se.ParallelExecutor(se.cpu_places(2), main, startup, loss, scope=scope) as pe:
        got, = pe.run([loss], feed={"x": x, "y": y})
    assert _close(got, model(x, y).detach())


# --- what cannot be imported ------------------------------------------------------------------
class _Inner(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        if x.sum() > 0:
            return self.fc(x)
        return -self.fc(x)


class _Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = _Inner()

    def forward(self, x):
        return self.block(x)


class _Mutates(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        x.mul_(2)
        return self.fc(x)


class _FixedBatch(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(x.view(8, 4))


class _Item(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(x) * x.max().item()


class _Masked(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(x[x[:, 0] > 0]).sum(0, keepdim=True).expand(x.shape[0], 3)


class _Complex(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(torch.fft.fft(x).abs())


@torch.library.custom_op("ssaexec_test::twice", mutates_args=())
def _twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@_twice.register_fake
def _(x):
    return torch.empty_like(x)


class _Custom(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Sequential(nn.Identity(), _CustomInner())

    def forward(self, x):
        return self.inner(x)


class _CustomInner(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(_twice(x))


@pytest.mark.parametrize("module,pattern", [
    (_Branchy, r"data-dependent control flow in module 'block' \(_Inner\)"),
    (_Item, r"data-dependent value in the root module \(_Item\)"),
    (_Mutates, r"in-place mutation of an input \('x'\) in the root module \(_Mutates\)"),
    (_FixedBatch, r"fixes the batch size of input 'x' to 8"),
    (_Masked, r"data-dependent shape in the root module \(_Masked\): the size of "
              r"aten.index.Tensor's result"),
    (_Complex, r"dtype torch.complex64, which programs cannot hold"),
    (_Custom, r"unsupported operation ssaexec_test.twice.default .* in module 'inner.1' "
              r"\(_CustomInner\)"),
])
def test_unsupported_constructs_name_construct_and_module(module, pattern):
    x, t = torch.randn(8, 4), torch.randint(0, 3, (8,))
    with pytest.raises(se.ProgramError, match=pattern):
        from_torch(module(), {"x": x, "target": t}, loss_fn=F.cross_entropy)


def test_bad_arguments():
    model = MLP()
    x, t = torch.randn(4, 12), torch.randint(0, 5, (4,))
    with pytest.raises(se.ProgramError, match="must also hold 'target'"):
        from_torch(model, {"x": x}, loss_fn=F.cross_entropy)
    with pytest.raises(se.ProgramError, match="loss must be a scalar"):
        from_torch(model, {"x": x})
    with pytest.raises(se.ProgramError, match="do not fit the forward"):
        from_torch(model, {"inp": x, "target": t}, loss_fn=F.cross_entropy)
    with pytest.raises(se.ProgramError, match="must be at least 2"):
        from_torch(model, {"x": x[:1], "target": t[:1]}, loss_fn=F.cross_entropy)
    with pytest.raises(se.ProgramError, match="expects a torch.nn.Module"):
        from_torch(lambda x: x, {"x": x})


# --- the generic ATen op and its pieces -------------------------------------------------------
def test_aten_ops_run_in_programs_and_copy_views():
    main = se.Program()
    block = main.global_block()
    block.create_var("w", [3, 4], "float64", persistable=True)
    block.create_var("wt", [4, 3], "float64")
    block.append_op("aten.t.default", {"X": ["w"]}, {"Out": ["wt"]}, {"self": "X[0]"})
    main.validate()
    scope = se.Scope()
    w = torch.randn(3, 4, dtype=torch.float64)
    scope.set_var("w", w)
    wt, = se.Executor().run(main, fetch_list=["wt"], scope=scope)
    assert torch.equal(wt, w.t())
    # the result is a copy: an in-place update of w (the optimizer's) does not reach it
    assert scope.find_var("wt").untyped_storage().data_ptr() != w.untyped_storage().data_ptr()
    with pytest.raises(se.ProgramError, match="unknown op type 'aten.no_such_op.default'"):
        se.ops.registry.get_op_def("aten.no_such_op.default")


def test_size_expressions_are_parsed_not_evaluated():
    fn, symbols = parse_size_expr("16*s0 + FloorDiv(s0, 2) - Max(1, s1)*Max(1, s1)")
    assert symbols == {"s0", "s1"} and fn({"s0": 6, "s1": 3}) == 96 + 3 - 9
    for bad in ("__import__('os').system('true')", "s0.real", "[s0]", "lambda: 1", "f(s0)",
                "s0**2", "9**9**9*s0"):  # no power: it is how a size grows without bound
        with pytest.raises(se.ProgramError):
            parse_size_expr(bad)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16,
                                   torch.int64, torch.int32, torch.uint8, torch.bool])
def test_assign_bytes_round_trips(dtype):
    t = (torch.randn(3, 5) * 10).to(dtype)
    data = encode_bytes(t)
    assert len(data) <= math.ceil(t.numel() * t.element_size() / 3) * 4
    assert torch.equal(decode_bytes(data, [3, 5], se.program.desc.dtype_name(dtype)), t)
    assert decode_bytes(encode_bytes(torch.tensor(2.5)), [], "float32").item() == 2.5
    with pytest.raises(se.ProgramError, match="bytes do not make"):
        decode_bytes(data, [4, 5], se.program.desc.dtype_name(dtype))
