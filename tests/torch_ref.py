"""Plain-PyTorch twins of the example models, for checking ssaexec against torch.

``load_from_scope`` copies a program's initial parameters into the twin, so both
start from identical weights (fc weights are [in, out] in ssaexec, [out, in] in
torch.nn.Linear).
"""

import os
import sys

import torch
import torch.nn as nn

from ssaexec.harness import torch_optimizer  # noqa: F401  (the optimizer twins)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "bench"))
from torch_models import MLP  # noqa: E402,F401  (the MLP twin lives with the benchmark's)


class CNN(nn.Module):
    def __init__(self, channels=1, size=28, classes=10, filters=(8, 16), batch_norm=True):
        super().__init__()
        layers, c = [], channels
        for f in filters:
            layers.append(nn.Conv2d(c, f, 3, padding=1, bias=not batch_norm))
            if batch_norm:
                layers.append(nn.BatchNorm2d(f, momentum=0.1, eps=1e-5))
            layers += [nn.ReLU(), nn.MaxPool2d(2, 2)]
            c, size = f, size // 2
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(c * size * size, classes)

    def forward(self, x):
        return self.fc(self.features(x).flatten(1))


def load_from_scope(model, program, scope):
    """Copy ``program``'s parameters (creation order) from ``scope`` into ``model``."""
    params = [p for p in program.all_parameters()]
    torch_params = list(model.parameters())
    assert len(params) == len(torch_params), (len(params), len(torch_params))
    with torch.no_grad():
        for p, tp in zip(params, torch_params, strict=True):
            v = scope.find_var(p.name)
            if tp.dim() == 2 and v.shape != tp.shape:
                v = v.t()
            tp.copy_(v)
    return list(zip([p.name for p in params], torch_params, strict=True))


def param_close(value, torch_param, rtol=1e-6, atol=1e-9):
    t = torch_param.detach()
    if t.dim() == 2 and value.shape != t.shape:
        t = t.t()
    return torch.allclose(value, t, rtol=rtol, atol=atol)
