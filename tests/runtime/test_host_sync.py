"""Step kernels that read values on the host or build tensors there (issue 30, item 6).

On a GPU, a kernel that reads a value on the host (``.item()``, indexing with a
0-dim tensor) synchronises every step and breaks CUDA-graph capture, and one that
builds a tensor on the host with ``torch.tensor(..., device=)`` copies it over,
blocking. Both are visible on the CPU: a real dispatch mode records every ATen
call a kernel makes, here on the ``meta`` device standing in for a GPU (a host
read of a meta tensor fails outright).

The second half runs the package's detector (``ssaexec.runtime.host_sync``) over one
step of every example program, optimizer, LR schedule, AMP mode and imported model
(the transformers zoo: slow), on CPU and meta places, both execution paths, and checks
the detector itself; ``make gpu-check`` runs the same cases on a GPU.
"""

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ssaexec.ops.registry import get_op_def

# what reads a value on the host, or builds a tensor there (torch.tensor); a move between
# devices is recorded as "device move" (a dtype conversion, _to_copy too, is not one)
HOST = {"aten._local_scalar_dense.default", "aten.item.default", "aten.lift_fresh.default",
        "device move"}


class _Calls(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = str(func)
        if name == "aten._to_copy.default" and kwargs.get("device") is not None and \
                torch.device(kwargs["device"]) != args[0].device:
            name = "device move"
        self.names.append(name)
        return func(*args, **kwargs)


def _run(op_type, ins, attrs):
    od = get_op_def(op_type)
    with _Calls() as calls:
        outs = od.kernel(ins, od.full_attrs(attrs))
    return outs, set(calls.names)


def test_the_lr_table_schedule_reads_nothing_on_the_host():
    table = torch.tensor([0.1, 0.2, 0.3], dtype=torch.float64)
    for step, want in ((0, 0.1), (2, 0.3), (7, 0.3)):
        outs, names = _run("lr_schedule", {"Step": torch.tensor(float(step)), "Table": table},
                           {"kind": "table", "base_lr": 1.0, "dtype": "float32"})
        assert float(outs["LearningRate"]) == torch.tensor(want, dtype=torch.float32).item()
        assert not names & HOST, names & HOST
    # on a device that is not the host, it runs at all only if it reads nothing there
    outs, names = _run("lr_schedule", {"Step": torch.zeros((), device="meta"),
                                       "Table": table.to("meta")},
                       {"kind": "table", "base_lr": 1.0, "dtype": "float32"})
    assert outs["LearningRate"].device.type == "meta" and not names & HOST


def test_accuracy_makes_its_total_on_the_device():
    x = torch.randn(6, 4, device="meta")
    label = torch.zeros(6, 1, dtype=torch.int64, device="meta")
    outs, names = _run("accuracy", {"X": x, "Label": label}, {"k": 1})
    assert outs["Total"].device.type == "meta" and outs["Total"].shape == ()
    assert not names & HOST, names & HOST
    # torch.tensor(n, device=) builds on the host below the dispatcher (nothing to see) and
    # copies; a fill kernel on the device is what a dispatch mode sees
    assert "aten.full.default" in names, names
    # and the values on the CPU are what they were
    x = torch.tensor([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7]])
    outs, _ = _run("accuracy", {"X": x, "Label": torch.tensor([[1], [1], [1]])}, {"k": 1})
    assert int(outs["Total"]) == 3 and int(outs["Correct"]) == 2
    assert abs(float(outs["Accuracy"]) - 2 / 3) < 1e-6


# --- the detector (ssaexec.runtime.host_sync) over one step of every program ----------------
#
# Each case runs two warm-up steps (the first builds the runner, the second keeps the
# constants), then one step under ``HostSyncDetector``: on a CPU place (what users run;
# host reads and host-made tensors show) and on a ``MetaPlace`` (a GPU's stand-in: every
# host-to-device copy shows too), on both execution paths, with the synchronous scheduler
# (the detector watches the thread that enters it). Only ``ALLOWED`` findings may appear.

import warnings
from pathlib import Path

import pytest
import torch.nn as nn
import torch.nn.functional as F

import ssaexec as se
from ssaexec.program.example_models import build_mlp
from ssaexec.core.place import MetaPlace
from ssaexec.program import lr
from ssaexec.program.builder import program_guard
from ssaexec.program.desc import Program
from ssaexec.program.io import load_program
from ssaexec.runtime.host_sync import (ALLOWED, Allowed, HostSyncDetector, HostSyncError,
                                       HostSyncWarning)
from ssaexec.data.synthetic import synthetic_feed

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PATHS = ["compiled", "readable"]
DEVICES = ["cpu", "meta"]


def _example(name, form="json"):
    main = load_program(EXAMPLES / f"{name}.{form}")
    startup = load_program(EXAMPLES / f"{name}.startup.{form}")
    return main, startup, "mean_0.tmp_0", synthetic_feed(main, 4), {}


def _mlp(optimizer, **strategy):
    main, startup, loss = build_mlp(in_dim=6, hidden=(5,), optimizer=optimizer)
    return main, startup, getattr(loss, "name", loss), synthetic_feed(main, 4), strategy


def _constants_and_metrics():
    # fill_constant, assign_value and accuracy in the main program, every step
    main, startup = Program(0), Program(0)
    with program_guard(main, startup):
        x = se.layers.data("x", [-1, 6], "float32")
        label = se.layers.data("label", [-1, 1], "int64")
        scale = se.layers.assign(se.layers.fill_constant([1], "float32", 0.5))
        block = main.global_block()
        shift = block.create_var("shift", shape=[6], dtype="float32", stop_gradient=True)
        block.append_op("assign_value", {}, {"Out": ["shift"]},
                        {"shape": [6], "dtype": "float32", "values": [0.5, -1.0, 0, 1, 2, 3]})
        x = se.layers.elementwise_add(se.layers.elementwise_mul(x, scale), shift)
        logits = se.layers.fc(x, 4)
        acc, _, _ = se.layers.accuracy(logits, label)
        loss = se.layers.mean(se.layers.softmax_with_cross_entropy(logits, label))
        se.optimizer.SGD(0.1).minimize(loss)
    return main, startup, loss.name, synthetic_feed(main, 4), {}


def _embedding(sparse):
    # an embedding (sparse rows or dense) and dropout: the ops with data-shaped gradients
    main, startup = Program(0), Program(0)
    with program_guard(main, startup):
        ids = se.layers.data("ids", [-1, 1], "int64")
        y = se.layers.data("y", [-1, 1], "float32")
        emb = se.layers.embedding(ids, size=[10, 4], is_sparse=sparse)
        h = se.layers.dropout(se.layers.reshape(emb, [-1, 4]), 0.2)
        loss = se.layers.mean(se.layers.square_error_cost(se.layers.fc(h, 1), y))
        se.optimizer.Adam(0.01).minimize(loss)
    g = torch.Generator().manual_seed(0)
    feed = {"ids": torch.randint(0, 10, (4, 1), generator=g),
            "y": torch.randn(4, 1, generator=g)}
    return main, startup, loss.name, feed, {}


class _Positions(nn.Module):
    """Positions and a mask made with factory ops, and a graph constant (torch.tensor)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 3)

    def forward(self, x):
        pos = torch.arange(x.shape[1], device=x.device, dtype=x.dtype)
        keep = torch.ones(x.shape, device=x.device).tril()
        weight = torch.tensor([1.0, 0.5, 0.25, 2.0, 1.0, 0.5], device=x.device)
        return self.lin(x * pos * keep * weight)


class _Pooled(nn.Module):
    """Max pooling and an embedding: ATen kernels that trust their index arguments."""

    def __init__(self):
        super().__init__()
        self.emb, self.conv = nn.Embedding(10, 4), nn.Conv2d(1, 2, 3, padding=1)
        self.lin = nn.Linear(2 * 2 * 2 + 4, 3)

    def forward(self, x, ids):
        h = F.max_pool2d(torch.relu(self.conv(x)), 2)
        return self.lin(torch.cat([h.flatten(1), self.emb(ids).mean(1)], 1))


def _from_file():
    # a program file is untrusted: guarded ATen ops check their index arguments first
    from ssaexec.program.serialize import from_json, to_json
    torch.manual_seed(0)
    feed = {"x": torch.randn(4, 1, 4, 4), "ids": torch.randint(0, 10, (4, 3)),
            "target": torch.randint(0, 3, (4,))}
    main, startup, loss = se.from_torch(_Pooled(), feed, loss_fn=F.cross_entropy,
                                        optimizer=se.optimizer.SGD(0.1))
    main, startup = from_json(to_json(main)), from_json(to_json(startup))
    assert not main.trusted
    return main, startup, loss, feed, {}


def _transformer():
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    return nn.Sequential(nn.TransformerEncoder(layer, 1, enable_nested_tensor=False),
                         nn.Flatten(), nn.Linear(8 * 4, 3))


def _imported(model, eval_=False):
    torch.manual_seed(0)
    module = _Positions() if model == "positions" else _transformer()
    name = "x" if model == "positions" else "input"
    x = torch.randn(4, 6) if model == "positions" else torch.randn(4, 4, 8)
    if eval_:  # an evaluation import: its graph constants are assign_bytes ops of main
        main, startup, out = se.from_torch_eval(module, {name: x})
        return main, startup, out, {name: x}, {}
    feed = {name: x, "target": torch.randint(0, 3, (4,))}
    main, startup, loss = se.from_torch(module, feed, loss_fn=F.cross_entropy,
                                        optimizer=se.optimizer.AdamW(0.01))
    return main, startup, loss, feed, {}


OPTIMIZERS = {
    "sgd": lambda rate: se.optimizer.SGD(rate),
    "momentum": lambda rate: se.optimizer.Momentum(rate, momentum=0.9),
    "adam": lambda rate: se.optimizer.Adam(rate),
    "adamw": lambda rate: se.optimizer.AdamW(rate, weight_decay=0.01),
}
SCHEDULES = {
    "constant": lambda: 0.1,
    "step": lambda: lr.StepDecay(0.1, step_size=1),
    "multistep": lambda: lr.MultiStepDecay(0.1, milestones=[1, 3]),
    "exponential": lambda: lr.ExponentialDecay(0.1, gamma=0.9),
    "cosine": lambda: lr.CosineAnnealing(0.1, T_max=4),
    "piecewise": lambda: lr.PiecewiseDecay([1, 2], [0.1, 0.05, 0.01]),
    "lambda": lambda: lr.LambdaDecay(0.1, lambda s: 0.9 ** s, steps=4),  # the 'table' rule
    "warmup": lambda: lr.LinearWarmup(0.1, warmup_steps=2, start_lr=0.0, end_lr=0.1),
}
# every optimizer and every schedule, each schedule once, each optimizer twice
PAIRS = [("sgd", "constant"), ("sgd", "lambda"), ("momentum", "step"),
         ("momentum", "multistep"), ("adam", "exponential"), ("adam", "cosine"),
         ("adamw", "piecewise"), ("adamw", "warmup")]

CASES = {
    # every program in examples/ (the scripts build an MLP and Llama: below and the zoo)
    **{f"example-{n}": (lambda n=n: _example(n))
       for n in ("uci_housing", "seed_mlp", "mnist_mlp", "small_resnet",
                 "uci_housing_pserver")},
    **{f"example-{n}-text": (lambda n=n: _example(n, "ssa"))
       for n in ("uci_housing", "seed_mlp")},
    **{f"{o}-{s}": (lambda o=o, s=s: _mlp(OPTIMIZERS[o](SCHEDULES[s]()))) for o, s in PAIRS},
    "amp-bf16": lambda: _mlp(se.optimizer.Adam(0.1), amp="bf16"),
    # two places in one thread (the synchronous scheduler): collectives, owners, broadcasts
    "two-places-all-reduce": lambda: _mlp(se.optimizer.Adam(0.1), places=2),
    "two-places-reduce": lambda: _mlp(se.optimizer.Adam(0.1), places=2,
                                      build={"reduce_strategy": "reduce"}),
    "two-places-zero2": lambda: _mlp(se.optimizer.Adam(0.1), places=2,
                                     build={"zero_stage": 2}),
    "amp-fp16": lambda: _mlp(se.optimizer.Momentum(0.1, momentum=0.9), amp="fp16"),
    "constants-and-accuracy": _constants_and_metrics,
    "embedding-dense": lambda: _embedding(False),
    "embedding-sparse": lambda: _embedding(True),  # allowed: its coalesce (ALLOWED says why)
    "import-positions": lambda: _imported("positions"),
    "import-transformer": lambda: _imported("transformer"),
    "import-eval-positions": lambda: _imported("positions", eval_=True),
    "import-pooled-from-file": _from_file,  # allowed: its guards' reads (ALLOWED says why)
}


_BUILT = {}


def _case(name):
    """CASES[name]() built once (an import traces for seconds); programs are only read."""
    if name not in _BUILT:
        _BUILT[name] = CASES[name]()
    return _BUILT[name]


def _detect(case, device, path, sequential=False, mode="warn"):
    """The detector over the third step of ``case`` (a ``_case`` result).

    ``device``: "cpu", "meta" or "cuda" (bench/gpu_check.py runs these cases on a GPU).
    """
    main, startup, loss, feed, strategy = case
    place = {"meta": MetaPlace(0), "cpu": se.CPUPlace(0)}.get(device) or \
        se.CUDAPlace(0, device_index=0)
    fetch = [] if device == "meta" else [loss]  # a meta value cannot be read back
    compiled = path == "compiled"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HostSyncWarning)
        if sequential:  # the Executor runs the loss seed as an op (fill_constant)
            scope, exe = se.Scope(), se.Executor(place, compiled=compiled)
            exe.run(startup, scope=scope)
            step = lambda: exe.run(main, feed=feed, fetch_list=fetch, scope=scope)  # noqa
            for _ in range(2):
                step()
            with HostSyncDetector(mode) as found:
                step()
            return found
        strategy = dict(strategy)
        build = se.BuildStrategy(**strategy.pop("build", {}))
        # more places: the next ones (on a GPU, places sharing its one device)
        more = range(1, strategy.pop("places", 1))
        places = [place] + [se.CUDAPlace(i, device_index=0) if device == "cuda"
                            else type(place)(i) for i in more]
        es = se.ExecutionStrategy(compiled=compiled, num_threads=1, **strategy)
        with se.ParallelExecutor(places, main, startup, loss, scope=se.Scope(),
                                 exec_strategy=es, build_strategy=build) as pe:
            for _ in range(2):
                pe.run(fetch, feed=feed)
            with HostSyncDetector(mode) as found:
                pe.run(fetch, feed=feed)
    return found


# the small ResNet computes for seconds on the CPU: on the meta place alone; sparse tensors
# have no meta kernels (coalesce): on the CPU alone
SWEEP = [(n, d) for n in sorted(CASES) for d in DEVICES
         if (n, d) not in (("example-small_resnet", "cpu"), ("embedding-sparse", "meta"))]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name,device", SWEEP)
def test_one_step_does_nothing_on_the_host(name, device, path):
    found = _detect(_case(name), device, path)
    assert found.findings == [], "\n".join(found.report())


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["example-seed_mlp", "import-positions",
                                  "constants-and-accuracy"])
def test_one_sequential_step_does_nothing_on_the_host(name, device, path):
    # the sequential Executor runs the loss seed (a fill_constant of shape []) as an op
    found = _detect(_case(name), device, path, sequential=True)
    assert found.findings == [], "\n".join(found.report())


def test_sparse_gradients_are_allowed_with_their_reason():
    found = _detect(_case("embedding-sparse"), "cpu", "compiled")
    sparse = [f for f in found.allowed_findings if f.kind == "data-dependent shape"]
    assert sparse and all(f.where.startswith("ssaexec/ops/sparse.py") and "sparse" in f.reason
                          for f in sparse), found.report()


def test_an_untrusted_programs_guards_are_allowed_with_their_reason():
    found = _detect(_case("import-pooled-from-file"), "cpu", "readable")
    guards = [f for f in found.allowed_findings if f.where.startswith("ssaexec/ops/guards.py")]
    ops = " ".join(f.op or "" for f in guards)
    assert "embedding_dense_backward" in ops and "max_pool2d_with_indices_backward" in ops, \
        found.report()
    assert all(f.kind == "host read" and "untrusted" in f.reason for f in guards)


def test_feeds_are_the_one_copy_a_step_makes():
    # what the detector allows shows, with its reason: the feeds, on a device place
    found = _detect(_case("example-uci_housing"), "meta", "compiled")
    kinds = {(f.kind, f.where.split(":")[0]) for f in found.allowed_findings}
    assert kinds == {("copy to device", "ssaexec/data/feed.py")}, found.report()
    assert all(f.reason for f in found.allowed_findings)


# --- the detector itself ---------------------------------------------------------------------

SYNCS = {
    "host read": [lambda x: x[0].item(), lambda x: x.tolist(), lambda x: bool(x[1]),
                  lambda x: float(x.sum()), lambda x: x.numpy(),
                  lambda x: x[torch.full((), 1, dtype=torch.int64, device=x.device)]],
    "host tensor": [lambda x: x + torch.tensor([1.0, 2.0, 3.0, 4.0])],
    "default device": [lambda x: torch.full([4], 1.0), lambda x: torch.zeros(4)],
    "data-dependent shape": [lambda x: x.nonzero(), lambda x: x[x > 1],
                             lambda x: x.masked_select(x > 1),
                             lambda x: torch.repeat_interleave(x, x.long())],
    "copy to device": [lambda x: x.to("meta")],
}


@pytest.mark.parametrize("kind", sorted(SYNCS))
def test_the_detector_flags_each_kind(kind):
    x = torch.arange(4.0)
    for fn in SYNCS[kind]:
        with pytest.warns(HostSyncWarning), HostSyncDetector("warn", cuda=False) as found:
            fn(x)
        assert [f.kind for f in found.findings][:1] == [kind], found.report()
        with pytest.raises(HostSyncError, match=kind), HostSyncDetector("error", cuda=False):
            fn(x)


def test_the_detector_passes_device_side_work():
    x = torch.arange(4.0)
    with HostSyncDetector("error", cuda=False) as found:
        y = torch.full([4], 1.0, device=x.device) + x.clone()
        torch.take(x, torch.zeros((), dtype=torch.int64, device=x.device))
        torch.where(x > 1, x, y).sum()
        x.to(torch.float64)
    assert found.findings == [] and found.allowed_findings == []


@pytest.mark.parametrize("path", PATHS)
def test_error_mode_stops_the_step_with_the_finding(path):
    # with nothing allowed, the CPU-only lr read of an SGD update is an error, raised out
    # of the step as an SSAExecError naming where it was made (an update is in the step's
    # commit phase, so the executor chains it to a CommitError)
    main, startup, loss, feed, _ = _case("sgd-constant")
    es = se.ExecutionStrategy(compiled=path == "compiled", num_threads=1)
    with se.ParallelExecutor([se.CPUPlace(0)], main, startup, loss, scope=se.Scope(),
                             exec_strategy=es) as pe:
        pe.run([loss], feed=feed)
        with pytest.raises(se.SSAExecError, match="host read: .* at ssaexec/ops/optim.py") \
                as caught, HostSyncDetector("error", allowed=(), cuda=False):
            pe.run([loss], feed=feed)
    assert HostSyncError in (type(caught.value), type(caught.value.__cause__))


def test_an_allowed_finding_names_its_rule_and_reason():
    rule = Allowed("host read", "ssaexec/ops/init.py", "a test's reason")
    from ssaexec.ops.init import DeviceConstant
    kernel = DeviceConstant(lambda attrs: torch.arange(3.0), None)
    with HostSyncDetector("error", allowed=(rule,), cuda=False) as found:
        # DeviceConstant.__call__ is in ssaexec/ops/init.py; a read from inside it is allowed
        kernel.make = lambda attrs: torch.arange(3.0, device="cpu") * torch.arange(
            2.0, device="cpu").sum().item()
        kernel({}, {})
    assert [f.reason for f in found.allowed_findings] == ["a test's reason"]
    with pytest.raises(ValueError, match="unknown host-sync kind"):
        Allowed("sync", "ssaexec/data/feed.py", "")
    assert all(rule.reason for rule in ALLOWED)


@pytest.mark.slow
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", ["gpt2", "llama", "bert", "vit", "resnet"])
def test_one_step_of_a_zoo_model_does_nothing_on_the_host(name, path):
    # the transformers zoo of tests/frontends/torch/test_zoo.py (each captured once there, shared here),
    # AdamW, on a meta place: a GPU's stand-in, where any host-made value shows as a copy
    pytest.importorskip("transformers")
    import tests.frontends.torch.test_zoo as test_zoo
    from tests.frontends.torch.test_from_torch import _with_optimizer
    _, main0, startup0, loss = test_zoo._captured(name)
    main, startup = _with_optimizer(main0, startup0, se.optimizer.AdamW(0.01))
    found = _detect((main, startup, loss, test_zoo._batches(name)[0], {}), "meta", path)
    assert found.findings == [], "\n".join(found.report())


# --- on a GPU (make gpu-check runs these; bench/gpu_check.py's host-sync part all cases) -----

@pytest.mark.cuda
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", ["example-mnist_mlp", "sgd-lambda", "amp-fp16",
                                  "constants-and-accuracy", "import-eval-positions",
                                  "two-places-reduce"])
def test_one_step_on_a_gpu_does_nothing_on_the_host(name, path):
    found = _detect(_case(name), "cuda", path)
    assert found.findings == [], "\n".join(found.report())


@pytest.mark.cuda
def test_cuda_sync_debug_mode_reports_a_sync_where_it_was_made():
    x = torch.arange(4.0, device="cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HostSyncWarning)
        with HostSyncDetector("warn") as found:
            x.sum().item()
    kinds = {f.kind for f in found.findings}
    assert {"host read", "cuda sync"} <= kinds, found.report()
    assert torch.cuda.get_sync_debug_mode() == 0  # put back as it was
    with pytest.raises(HostSyncError), HostSyncDetector("error"):
        x.sum().item()


def _logged(*entries):
    """What ``warnings.catch_warnings(record=True)`` records for ``(message, category)``."""
    with warnings.catch_warnings(record=True) as log:
        warnings.simplefilter("always")
        for message, category in entries:
            warnings.warn(message, category)
    return log


def test_the_detectors_own_setup_is_never_a_cuda_sync_report():
    # the first GPU run (torch 2.11, docs/gpu.md): torch.cuda.set_sync_debug_mode("warn")
    # itself warns that the mode is a prototype; the detector counted that as a sync of
    # the step. What the setup logged is passed on; only torch's report counts.
    from ssaexec.runtime.host_sync import CUDA_SYNC_REPORT, split_cuda_log
    notice = ("Synchronization debug mode is a prototype feature and does not yet detect "
              "all synchronizing operations (Triggered internally at "
              "/pytorch/torch/csrc/cuda/Module.cpp:1003.)")
    report = f"{CUDA_SYNC_REPORT} (Triggered internally at c10/cuda/CUDAFunctions.cpp:156.)"
    log = _logged((notice, UserWarning), (report, UserWarning),
                  ("host read: aten.item at x.py", HostSyncWarning),
                  ("unrelated: a deprecated argument", UserWarning), (report, UserWarning))
    reports, others = split_cuda_log(log, setup=1)
    assert [str(w.message) for w in reports] == [report, report]
    assert [str(w.message) for w in others] == [notice, "host read: aten.item at x.py",
                                                "unrelated: a deprecated argument"]
    # the notice is no report even when it arrives later (torch warns it once a process,
    # so another detector may see it mid-step): it names no synchronising call
    reports, others = split_cuda_log(log, setup=0)
    assert len(reports) == 2 and str(others[0].message) == notice
    # nothing lost, nothing doubled
    assert len(reports) + len(others) == len(log)


def test_a_warning_raised_in_a_step_keeps_the_ssaexec_frames_that_raised_it():
    # torch reports a synchronising CUDA call as a warning when the call returns to
    # Python; the first GPU run attributed every one to the detector's own file. The log
    # keeps the stack at the warning, so the report names the code that made the call.
    # A real ssaexec warning stands in for torch's (StepGraphs gives up on capturing).
    import types
    from ssaexec.runtime.cuda_graph import StepGraphs
    from ssaexec.runtime.host_sync import _WarningLog
    with _WarningLog() as log:
        StepGraphs._give_up(types.SimpleNamespace(), "the test's reason")
    assert len(log.entries) == 1
    w = log.entries[0]
    assert "the test's reason" in str(w.message) and w.category is RuntimeWarning
    assert w.ssaexec_stack[0] == "ssaexec/runtime/cuda_graph.py:StepGraphs._give_up"
    # the rules match that stack as they match the dispatch mode's findings
    from ssaexec.runtime.host_sync import Allowed
    assert Allowed("cuda sync", "ssaexec/runtime/cuda_graph.py", "x").covers(w.ssaexec_stack)
    assert not Allowed("cuda sync", "ssaexec/data/feed.py", "x").covers(w.ssaexec_stack)
    # and warnings behave as before once it exits
    with warnings.catch_warnings(record=True) as after:
        warnings.simplefilter("always")
        warnings.warn("after", UserWarning)
    assert [str(a.message) for a in after] == ["after"]
