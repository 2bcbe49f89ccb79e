"""Metric ops for evaluation programs: ``accuracy`` (top-k), ``argmax``, ``argmin``.

None has a gradient (``grad=None``): they measure, they are not trained through.
``accuracy`` counts a sample as correct when its label is among the ``k`` highest
scores (ties broken as ``torch.topk`` breaks them) and returns the fraction correct
and the counts, so a caller can add up several batches exactly.
"""

import math

import torch

from .registry import register_op


def _accuracy_problem(x_shape, label_shape, k):
    """Why ``accuracy`` cannot score these shapes and ``k``, or None.

    X is ``[rows, classes]`` and Label holds one class per row, as Paddle's
    ``accuracy`` checks: a Label of another row count would broadcast against the
    top-k indices and count the wrong thing. A -1 dim (or an unknown shape) is
    checked when the op runs."""
    if k < 1:
        return f"k is {k}; it must be at least 1"
    if x_shape is None:
        return None
    if len(x_shape) != 2:
        return f"X must be 2-d [rows, classes], got shape {list(x_shape)}"
    if label_shape is None or -1 in label_shape or x_shape[0] == -1:
        return None
    labels = math.prod(label_shape)
    if labels != x_shape[0]:
        return (f"Label holds {labels} labels (shape {list(label_shape)}) but X has "
                f"{x_shape[0]} rows; hint: give one label per row of X")
    return None


def _infer_accuracy(ins, attrs):
    x, label = ins.get("X"), ins.get("Label")
    problem = _accuracy_problem(x and x[0], label and label[0], attrs["k"])
    if problem:
        raise ValueError(f"accuracy: {problem}")
    return {"Accuracy": ([], "float32"), "Correct": ([], "int64"), "Total": ([], "int64")}


@register_op("accuracy", ["X", "Label"], ["Accuracy", "Correct", "Total"], {"k": ("int", 1)},
             infer=_infer_accuracy, grad=None)
def accuracy(ins, attrs):
    """Fraction (and count) of rows of X whose Label is among the top ``k`` scores."""
    problem = _accuracy_problem(list(ins["X"].shape), list(ins["Label"].shape), attrs["k"])
    if problem:
        raise ValueError(f"accuracy: {problem}")
    x, label = ins["X"], ins["Label"].reshape(-1, 1)
    top = torch.topk(x, min(attrs["k"], x.shape[-1]), dim=-1).indices
    correct = (top == label).any(dim=-1).sum()
    # made on x's device by a fill kernel: torch.tensor(..., device=) would build it on the
    # host and copy it over, a blocking copy every step on a GPU
    total = torch.full((), x.shape[0], dtype=torch.int64, device=x.device)
    return {"Accuracy": correct.to(torch.float32) / max(x.shape[0], 1), "Correct": correct,
            "Total": total}


def _arg(fn):
    def kernel(ins, attrs):
        return {"Out": fn(ins["X"], dim=attrs["axis"], keepdim=attrs["keepdim"])}
    kernel.__doc__ = f"Out = index of the {fn.__name__[3:]} along ``axis`` (int64)."
    return kernel


register_op("argmax", ["X"], ["Out"], {"axis": ("int", -1), "keepdim": ("bool", False)},
            grad=None)(_arg(torch.argmax))
register_op("argmin", ["X"], ["Out"], {"axis": ("int", -1), "keepdim": ("bool", False)},
            grad=None)(_arg(torch.argmin))
