"""Factory ops are made on their place's device (issue 30), on both execution paths.

An ATen op with no tensor input (``aten.arange``, ``aten.full``, ``aten.rand`` ...)
takes a ``device`` argument that a program leaves null. Both paths must pass the
place's device there: built on the CPU, such a tensor meets a CUDA tensor in the
next op (or, on the readable path, costs a host-to-device copy every step).
Without a GPU the tests watch the calls with a real ``TorchDispatchMode``.
"""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import ssaexec as se
from ssaexec.program.desc import Program
from ssaexec.runtime.op_call import OpCall


class _Calls(TorchDispatchMode):
    """Records ``(overload name, kwargs)`` of every ATen call made inside it."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.calls.append((str(func), dict(kwargs)))
        return func(*args, **kwargs)

    def named(self, prefix):
        return [kw for name, kw in self.calls if name.startswith(prefix)]

    def copies(self):
        return [name for name, _ in self.calls
                if name.split(".")[1] in ("to", "_to_copy", "copy_")]


class _Positions(nn.Module):
    """Positions made the way imported models make them: ``arange(..., device=x.device)``."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 3)

    def forward(self, x):
        pos = torch.arange(x.shape[1], device=x.device, dtype=x.dtype)
        return self.lin(x * pos)


def _positions_program():
    torch.manual_seed(0)
    x, y = torch.randn(4, 6), torch.randint(0, 3, (4,))
    main, startup, loss = se.from_torch(_Positions(), {"x": x, "target": y},
                                        loss_fn=F.cross_entropy,
                                        optimizer=se.optimizer.SGD(0.1))
    return main, startup, loss, {"x": x, "target": y}


def test_the_importer_leaves_the_factory_device_null():
    main = _positions_program()[0]
    (op,) = [op for op in main.global_block().ops if op.type.startswith("aten.arange")]
    assert op.attrs.get("device") is None and not op.input("X")


@pytest.mark.parametrize("compiled", [True, False])
def test_factory_overload_gets_the_place_device(compiled):
    main, startup, loss, feed = _positions_program()
    place = se.cpu_places(1)[0]
    strategy = se.ExecutionStrategy(compiled=compiled)
    with se.ParallelExecutor([place], main, startup, loss, scope=se.Scope(),
                             exec_strategy=strategy) as pe:
        pe.run([loss], feed=feed)  # the first step builds the runner outside the mode
        with _Calls() as seen:
            lv, = pe.run([loss], feed=feed)
    assert torch.isfinite(lv)
    made = seen.named("aten.arange")
    assert made, "the factory op did not run"
    # None would be torch's default device (the CPU), whatever the place
    assert all(kw.get("device") == place.device for kw in made), made


def test_the_readable_path_makes_a_factory_result_where_it_runs():
    # ``meta`` stands in for a GPU: a device that is not the CPU, so a result made on
    # the CPU would have to be copied there (``.to``), which this op must not need
    program = Program()
    block = program.global_block()
    block.create_var("pos", shape=[5], dtype="float32")
    op = block.append_op("aten.arange.default", {"X": []}, {"Out": ["pos"]},
                         {"end": 5, "dtype": "float32", "device": None})
    scope = se.Scope()
    device = torch.device("meta")
    call = OpCall(op, 0, program, device)
    with _Calls() as seen:
        call.run(scope)
    assert scope.find_var("pos").device == device
    assert [kw.get("device") for kw in seen.named("aten.arange")] == [device]
    assert seen.copies() == []


def test_shape_inference_still_runs_factory_ops_on_meta():
    main = _positions_program()[0]
    main.validate()  # infers the arange's shape on meta
    var = main.global_block().var(
        next(op for op in main.global_block().ops
             if op.type.startswith("aten.arange")).output("Out")[0])
    assert list(var.shape) == [6]


def _sequential_transformer():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    model = nn.Sequential(nn.TransformerEncoder(layer, 2, enable_nested_tensor=False),
                          nn.Flatten(), nn.Linear(16 * 6, 5))
    # nn.Sequential's forward names its argument ``input``: the feed must be called so
    return model, {"input": torch.randn(4, 6, 16), "target": torch.randint(0, 5, (4,))}


def test_sequential_imports_with_its_forward_argument_name():
    # the import tests/runtime/test_cuda.py's transformer test makes, on the CPU
    model, feed = _sequential_transformer()
    main, startup, loss = se.from_torch(model, feed, loss_fn=F.cross_entropy,
                                        optimizer=se.optimizer.SGD(0.05))
    with se.ParallelExecutor(se.cpu_places(1), main, startup, loss, scope=se.Scope()) as pe:
        lv, = pe.run([loss], feed=feed)
    assert torch.isfinite(lv)


@pytest.mark.cuda
@pytest.mark.parametrize("compiled", [True, False])
def test_imported_positions_run_on_a_cuda_place(compiled):
    main, startup, loss, feed = _positions_program()
    strategy = se.ExecutionStrategy(compiled=compiled)
    with se.ParallelExecutor(se.cuda_places()[:1], main, startup, loss, scope=se.Scope(),
                             exec_strategy=strategy) as pe:
        for _ in range(3):
            lv, = pe.run([loss], feed=feed)
    assert torch.isfinite(lv)


# --- constants of the main program (issue 30, item 6): made on the device, not copied -----

def _constant_op(op_type):
    """One ``op_type`` op (fill_constant, assign_value, assign_bytes) writing ``c``."""
    from ssaexec.ops.aten import encode_bytes
    program = Program()
    block = program.global_block()
    block.create_var("c", shape=[2, 3], dtype="float32")
    value = torch.arange(6, dtype=torch.float32).reshape(2, 3) / 4
    attrs = {"fill_constant": {"shape": [2, 3], "value": 1.5, "dtype": "float32"},
             "assign_value": {"shape": [2, 3], "dtype": "float32",
                              "values": value.reshape(-1).tolist()},
             "assign_bytes": {"shape": [2, 3], "dtype": "float32",
                              "data": encode_bytes(value)}}[op_type]
    op = block.append_op(op_type, {}, {"Out": ["c"]}, attrs)
    want = torch.full((2, 3), 1.5) if op_type == "fill_constant" else value
    return program, op, want


@pytest.mark.parametrize("op_type", ["fill_constant", "assign_value", "assign_bytes"])
def test_a_constant_is_made_on_the_device_with_no_copy_each_step(op_type):
    # ``meta`` stands in for a GPU; a copy from the host shows as a ``_to_copy`` to meta
    program, op, _ = _constant_op(op_type)
    device = torch.device("meta")
    call = OpCall(op, 0, program, device)
    scope = se.Scope()
    for step in range(4):
        with _Calls() as seen:
            call.run(scope)
        assert scope.find_var("c").device == device and scope.find_var("c").shape == (2, 3)
        moves = [kw for name, kw in seen.calls
                 if name == "aten._to_copy.default" and kw.get("device") == device]
        if op_type == "fill_constant":  # filled where it lives, every step
            assert [kw.get("device") for kw in seen.named("aten.full")] == [device]
            assert moves == [] and seen.copies() == []
        elif step >= 2:  # decoded and copied on the first two runs only, then a device clone
            assert moves == [] and not seen.named("aten.lift_fresh"), seen.calls
            assert [n for n, _ in seen.calls] == ["aten.clone.default"]


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("op_type", ["fill_constant", "assign_value", "assign_bytes"])
def test_a_kept_constant_survives_in_place_writes_of_its_result(op_type, compiled):
    # the kept device tensor is never handed out: an op rewriting the result in place
    # (here the caller) must not change what the next step's op produces
    from ssaexec.execution.executor import Executor
    program, _, want = _constant_op(op_type)
    scope = se.Scope()
    exe = Executor(se.CPUPlace(0), compiled=compiled)
    for _ in range(4):
        out, = exe.run(program, scope=scope, fetch_list=["c"])
        assert torch.equal(torch.as_tensor(out), want)
        scope.find_var("c").add_(100.0)
