"""Loss ops. Per-sample losses keep a trailing dimension of 1 ([N, 1]), as Paddle does.

Hard labels are int64 class indices shaped like the input with the class axis
of size 1 ([N, 1] for [N, C]; [N] also works); ``soft_label`` takes a
probability distribution per sample instead. The class axis is the last one for
``cross_entropy`` and ``axis`` for ``softmax_with_cross_entropy``.
"""

import torch

from .registry import ShapeRule, register_op
from .shape_rules import broadcast

_CE_ATTRS = {"soft_label": ("bool", False), "ignore_index": ("int", -100)}


def _pick(logp, label, ignore_index, axis):
    """-logp at each label along ``axis`` (0 where the label is ``ignore_index``).

    ``label`` has logp's shape with ``axis`` of size 1, or lacks that dim ([N] for [N, C]).
    """
    lab = label if label.dim() == logp.dim() else label.unsqueeze(axis)
    ignored = lab == ignore_index
    picked = logp.gather(axis, torch.where(ignored, torch.zeros_like(lab), lab))
    return torch.where(ignored, torch.zeros_like(picked), -picked)


def _soft(logp, label, axis):
    return -(label * logp).sum(dim=axis, keepdim=True)


@register_op("cross_entropy", ["X", "Label!"], ["Y"], _CE_ATTRS)
def cross_entropy(ins, attrs):
    """Y = -log(X[label]) per sample, where X holds probabilities over its last dim."""
    x, label = ins["X"], ins["Label"]
    if attrs["soft_label"]:
        return {"Y": _soft(torch.log(x), label, -1)}
    return {"Y": _pick(torch.log(x), label, attrs["ignore_index"], -1)}


@register_op("softmax_with_cross_entropy", ["Logits", "Label!"], ["Softmax!", "Loss"],
             dict(_CE_ATTRS, axis=("int", -1)))
def softmax_with_cross_entropy(ins, attrs):
    """Loss = cross entropy of softmax(Logits) against Label, computed stably."""
    logits, label, axis = ins["Logits"], ins["Label"], attrs["axis"] % ins["Logits"].dim()
    logp = torch.log_softmax(logits, dim=axis)
    if attrs["soft_label"]:
        loss = _soft(logp, label, axis)
    else:
        loss = _pick(logp, label, attrs["ignore_index"], axis)
    return {"Softmax": logp.exp(), "Loss": loss}


@register_op("square_error_cost", ["X", "Y"], ["Out"],
             rule=ShapeRule(lambda ins, attrs: {"Out": broadcast(ins["X"][0], ins["Y"][0])}))
def square_error_cost(ins, attrs):
    """Out = (X - Y) ** 2 elementwise."""
    d = ins["X"] - ins["Y"]
    return {"Out": d * d}
