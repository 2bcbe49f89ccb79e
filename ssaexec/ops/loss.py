"""Loss ops. Per-sample losses keep a trailing dimension of 1 ([N, 1]), as Paddle does.

Hard labels are int64 class indices of shape [N, 1] (or [N]); ``soft_label``
takes a probability distribution per sample instead.
"""

import torch

from .registry import register_op

_CE_ATTRS = {"soft_label": ("bool", False), "ignore_index": ("int", -100)}


def _hard_label(label):
    return label.reshape(-1) if label.dim() > 1 else label


def _pick(logp, label, ignore_index):
    lab = _hard_label(label)
    safe = torch.where(lab == ignore_index, torch.zeros_like(lab), lab)
    picked = logp.gather(1, safe.unsqueeze(1))
    return torch.where((lab == ignore_index).unsqueeze(1), torch.zeros_like(picked), -picked)


@register_op("cross_entropy", ["X", "Label!"], ["Y"], _CE_ATTRS)
def cross_entropy(ins, attrs):
    """Y = -log(X[label]) per sample, where X holds probabilities."""
    x, label = ins["X"], ins["Label"]
    if attrs["soft_label"]:
        return {"Y": -(label * torch.log(x)).sum(dim=1, keepdim=True)}
    return {"Y": _pick(torch.log(x), label, attrs["ignore_index"])}


@register_op("softmax_with_cross_entropy", ["Logits", "Label!"], ["Softmax!", "Loss"],
             dict(_CE_ATTRS, axis=("int", -1)))
def softmax_with_cross_entropy(ins, attrs):
    """Loss = cross entropy of softmax(Logits) against Label, computed stably."""
    logits, label = ins["Logits"], ins["Label"]
    logp = torch.log_softmax(logits, dim=attrs["axis"])
    if attrs["soft_label"]:
        loss = -(label * logp).sum(dim=1, keepdim=True)
    else:
        loss = _pick(logp, label, attrs["ignore_index"])
    return {"Softmax": logp.exp(), "Loss": loss}


@register_op("square_error_cost", ["X", "Y"], ["Out"])
def square_error_cost(ins, attrs):
    """Out = (X - Y) ** 2 elementwise."""
    d = ins["X"] - ins["Y"]
    return {"Out": d * d}
