"""Whole steps on ``MetaPlace``s: a GPU's stand-in that catches tensors on the wrong device.

A place on torch's ``meta`` device is neither the CPU nor CUDA: a tensor an op makes
on the host where the place's device was meant (a factory op without ``device``, a
constant built on the host) meets a meta tensor in the next op and raises, as it would
meet a CUDA tensor on a GPU (0-dim host tensors mix, as with CUDA). Each test runs
two steps (the first builds the runner) of a program on 1 to 3 such places, on both
execution paths: the example programs, every optimizer and LR schedule, AMP mode and
reduce strategy, and imported models that make tensors with factory ops.
"""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import ssaexec as se
from ssaexec.program.example_models import build_mlp
from ssaexec.core.place import MetaPlace
from ssaexec.program import lr
from ssaexec.program.io import load_program
from ssaexec.data.synthetic import synthetic_feed

from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PATHS = [pytest.param(True, id="compiled"), pytest.param(False, id="readable")]


def _steps(main, startup, loss, feed, places=2, compiled=True, build=None, **strategy):
    """Two steps on ``places`` meta places; returns the places' scopes' parameters."""
    exec_strategy = se.ExecutionStrategy(compiled=compiled, **strategy)
    with se.ParallelExecutor([MetaPlace(i) for i in range(places)], main, startup, loss,
                             scope=se.Scope(), exec_strategy=exec_strategy,
                             build_strategy=build) as pe:
        for _ in range(2):
            assert pe.run([], feed=feed) == []
        params = [p.name for p in main.all_parameters()]
        values = [pe.local_scopes[i].find_var(n) for i in range(places) for n in params]
    return values


def _on_meta(values):
    assert values and all(v is not None and v.device.type == "meta" for v in values)


@pytest.mark.parametrize("compiled", PATHS)
@pytest.mark.parametrize("places", [1, 2, 3])
@pytest.mark.parametrize("name", ["uci_housing", "seed_mlp", "mnist_mlp", "small_resnet"])
def test_example_programs_run_on_meta_places(name, places, compiled):
    main = load_program(EXAMPLES / f"{name}.json")
    startup = load_program(EXAMPLES / f"{name}.startup.json")
    feed = synthetic_feed(main, 6)
    _on_meta(_steps(main, startup, "mean_0.tmp_0", feed, places, compiled))


def _mlp(optimizer=None, dtype="float32"):
    main, startup, loss = build_mlp(in_dim=6, hidden=(5,), dtype=dtype, optimizer=optimizer)
    return main, startup, getattr(loss, "name", loss), synthetic_feed(main, 6)


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
    "lambda": lambda: lr.LambdaDecay(0.1, lambda s: 0.9 ** s, steps=4),
    "warmup": lambda: lr.LinearWarmup(0.1, warmup_steps=2, start_lr=0.0, end_lr=0.1),
}


# every schedule once and every optimizer twice (tests/runtime/test_host_sync.py sweeps more pairs
# on meta places too)
PAIRS = [(sorted(OPTIMIZERS)[k % len(OPTIMIZERS)], name)
         for k, name in enumerate(sorted(SCHEDULES))]


@pytest.mark.parametrize("compiled", PATHS)
@pytest.mark.parametrize("opt,schedule", PAIRS)
def test_optimizers_and_schedules_run_on_meta_places(opt, schedule, compiled):
    _on_meta(_steps(*_mlp(OPTIMIZERS[opt](SCHEDULES[schedule]())), compiled=compiled))


@pytest.mark.parametrize("compiled", PATHS)
@pytest.mark.parametrize("amp", ["bf16", "fp16"])
@pytest.mark.parametrize("opt", ["sgd", "adam"])
def test_amp_modes_run_on_meta_places(amp, opt, compiled):
    _on_meta(_steps(*_mlp(OPTIMIZERS[opt](0.1)), compiled=compiled, amp=amp))


STRATEGIES = {
    "all_reduce": {},
    "reduce": {"reduce_strategy": "reduce"},
    "zero1": {"zero_stage": 1},
    "zero2": {"zero_stage": 2},
    "fused": {"fuse_all_reduce_ops": True},
    "bf16_allreduce": {"allreduce_dtype": "bf16"},
    "accumulate": {"gradient_accumulation_steps": 2},
}


@pytest.mark.parametrize("compiled", PATHS)
@pytest.mark.parametrize("places", [2, 3])
@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_reduce_strategies_run_on_meta_places(strategy, places, compiled):
    build = se.BuildStrategy(**STRATEGIES[strategy])
    _on_meta(_steps(*_mlp(se.optimizer.Adam(0.01)), places, compiled, build=build))


class _Positions(nn.Module):
    """Makes positions and a mask with factory ops, as imported transformers do."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 3)

    def forward(self, x):
        pos = torch.arange(x.shape[1], device=x.device, dtype=x.dtype)
        keep = torch.ones(x.shape, device=x.device).tril()
        return self.lin(x * pos * keep)


def _transformer():
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    return nn.Sequential(nn.TransformerEncoder(layer, 1, enable_nested_tensor=False),
                         nn.Flatten(), nn.Linear(8 * 4, 3))


@pytest.mark.parametrize("compiled", PATHS)
@pytest.mark.parametrize("model", ["positions", "transformer"])
def test_imported_models_run_on_meta_places(model, compiled):
    torch.manual_seed(0)
    module = _Positions() if model == "positions" else _transformer()
    x = torch.randn(4, 6, 6) if model == "positions" else torch.randn(4, 4, 8)
    name = "x" if model == "positions" else "input"
    feed = {name: x, "target": torch.randint(0, 3, (4,))}
    if model == "positions":
        feed["x"] = torch.randn(4, 6)
    main, startup, loss = se.from_torch(module, feed, loss_fn=F.cross_entropy,
                                        optimizer=se.optimizer.AdamW(0.01))
    _on_meta(_steps(main, startup, loss, feed, 2, compiled))
