"""Step kernels that read values on the host or build tensors there (issue 30, item 6).

On a GPU, a kernel that reads a value on the host (``.item()``, indexing with a
0-dim tensor) synchronises every step and breaks CUDA-graph capture, and one that
builds a tensor on the host with ``torch.tensor(..., device=)`` copies it over,
blocking. Both are visible on the CPU: a real dispatch mode records every ATen
call a kernel makes, here on the ``meta`` device standing in for a GPU (a host
read of a meta tensor fails outright).
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
