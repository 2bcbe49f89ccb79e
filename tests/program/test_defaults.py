"""Default initial values (ssaexec.program.defaults) follow the program's own layers."""

import torch
import torch.nn.functional as F

import ssaexec as se
from ssaexec.program.example_models import build_cnn, make_optimizer
from ssaexec.program.defaults import default_startup


def _values(main):
    prog, added = default_startup(main)
    scope = se.Scope()
    se.Executor().run(prog, scope=scope)
    return {n: scope.find_var(n) for n in added}


def test_imported_norm_layers_start_with_unit_scale_and_variance():
    m = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.BatchNorm2d(4),
                            torch.nn.Flatten(), torch.nn.Linear(144, 3), torch.nn.LayerNorm(3))
    main, _, _ = se.from_torch(m, {"input": torch.randn(4, 1, 8, 8),
                                   "target": torch.randint(0, 3, (4,))},
                               loss_fn=F.cross_entropy, optimizer=se.optimizer.SGD(0.1))
    v = _values(main)
    for name in ("1.weight", "1.running_var", "4.weight"):
        assert torch.equal(v[name], torch.ones_like(v[name])), name
    for name in ("1.bias", "1.running_mean", "4.bias", "3.bias"):
        assert torch.count_nonzero(v[name]) == 0, name
    assert v["0.weight"].abs().sum() > 0  # Xavier, not zeros


def test_builder_batch_norm_scale_and_variance_are_ones():
    main, _, _ = build_cnn("float32", make_optimizer("sgd", 0.1), size=8, filters=(4,))
    v = _values(main)
    scales = [n for n in v if n.startswith("batch_norm") and v[n].dim() == 1]
    assert scales and any(torch.equal(v[n], torch.ones_like(v[n])) for n in scales)
