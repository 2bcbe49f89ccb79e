"""Loss ops. Per-sample losses keep a trailing dimension of 1 ([N, 1]), as Paddle does.

Hard labels are int64 class indices shaped like the input with the class axis
of size 1 ([N, 1] for [N, C]; [N] also works); ``soft_label`` takes a
probability distribution per sample instead. The class axis is the last one for
``cross_entropy`` and ``axis`` for ``softmax_with_cross_entropy``.
"""

import torch

from .registry import ShapeRule, register_op
from .shape_rules import broadcast, gather, number_class, numel, wrap_axis

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


def _loss_shape(logits, label, attrs, axis):
    """The shape of the loss ``_pick`` or ``_soft`` makes of ``logits`` and ``label``."""
    if attrs["soft_label"]:
        p = broadcast(label, logits)
        if p:
            p[wrap_axis(axis, len(p))] = 1
        return p
    lab = label if len(label) == len(logits) else \
        list(label[:wrap_axis(axis, len(label) + 1)]) + [1] + \
        list(label[wrap_axis(axis, len(label) + 1):])
    return gather(logits, axis, lab)


def _canon_label(logits, label, attrs):
    """A one-element (or empty) label the dtype run takes the kernel's path with: the soft
    path promotes label with logits (0-dim or not matters), the hard one unsqueezes a
    label of another rank than logits' (a rank-1 stand-in for logits: [] then) and gathers."""
    if attrs["soft_label"]:
        return [1] if label else []
    if not numel(label):
        return [0]
    return [1] if len(label) == len(logits) and logits else []


def _ce_canon(ins, attrs):
    x = ins["X"][0]
    return {"X": [1] if x else [], "Label": _canon_label(x, ins["Label"][0], attrs)}, {
        "soft_label": attrs["soft_label"],
        "ignore_index": number_class(attrs["ignore_index"], -100)}


@register_op("cross_entropy", ["X", "Label!"], ["Y"], _CE_ATTRS, rule=ShapeRule(
    lambda ins, attrs: {"Y": _loss_shape(ins["X"][0], ins["Label"][0], attrs, -1)},
    _ce_canon))
def cross_entropy(ins, attrs):
    """Y = -log(X[label]) per sample, where X holds probabilities over its last dim."""
    x, label = ins["X"], ins["Label"]
    if attrs["soft_label"]:
        return {"Y": _soft(torch.log(x), label, -1)}
    return {"Y": _pick(torch.log(x), label, attrs["ignore_index"], -1)}


def _swce_shapes(ins, attrs):
    logits = ins["Logits"][0]
    if not logits:
        raise ZeroDivisionError("integer modulo by zero")  # axis % rank, as the kernel does
    axis = attrs["axis"] % len(logits)
    return {"Softmax": logits, "Loss": _loss_shape(logits, ins["Label"][0], attrs, axis)}


def _swce_canon(ins, attrs):
    return {"Logits": [1], "Label": _canon_label(ins["Logits"][0], ins["Label"][0], attrs)}, {
        "soft_label": attrs["soft_label"],
        "ignore_index": number_class(attrs["ignore_index"], -100), "axis": -1}


@register_op("softmax_with_cross_entropy", ["Logits", "Label!"], ["Softmax!", "Loss"],
             dict(_CE_ATTRS, axis=("int", -1)), rule=ShapeRule(_swce_shapes, _swce_canon))
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
