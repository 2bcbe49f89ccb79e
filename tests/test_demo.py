"""The demo trains on real data (scikit-learn's digits), evaluates, saves and writes back."""

import pytest
import torch

import ssaexec as se
from ssaexec.demo import load_digits_split, train_digits

pytest.importorskip("sklearn", reason="the demo's data set comes with scikit-learn")


def test_the_split_is_disjoint_and_seeded():
    a = load_digits_split(seed=3)
    b = load_digits_split(seed=3)
    assert all(torch.equal(u, v) for u, v in zip(a, b, strict=True))
    x, y, xt, yt = a
    assert x.shape[1:] == (1, 8, 8) and 0 <= float(x.min()) and float(x.max()) <= 1
    assert len(y) + len(yt) == 1797 and len(yt) == 359


@pytest.mark.slow
def test_two_epochs_on_two_places_learn_far_above_chance(tmp_path):
    ckpt = tmp_path / "digits.safetensors"
    lines = []
    res = train_digits(se.cpu_places(2), epochs=2, checkpoint=ckpt, out=lines.append,
                       progress=False)
    assert res["test_accuracy"][-1] > 0.8  # chance is 0.1
    assert res["train_loss"][1] < res["train_loss"][0]
    assert abs(res["torch_accuracy"] - res["test_accuracy"][-1]) < 0.05
    assert len([s for s in lines if "held-out accuracy" in s]) == 2  # one line an epoch
    from safetensors import safe_open
    with safe_open(str(ckpt), framework="pt") as f:
        w = f.get_tensor([k for k in f.keys() if k.endswith("classifier.weight")][0])
    assert torch.equal(w, res["module"].classifier.weight.detach())
