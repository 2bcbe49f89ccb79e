"""Metric ops for evaluation programs: ``accuracy`` (top-k), ``argmax``, ``argmin``.

None has a gradient (``grad=None``): they measure, they are not trained through.
``accuracy`` counts a sample as correct when its label is among the ``k`` highest
scores (ties broken as ``torch.topk`` breaks them) and returns the fraction correct
and the counts, so a caller can add up several batches exactly.
"""

import torch

from .registry import register_op


def _infer_accuracy(ins, attrs):
    return {"Accuracy": ([], "float32"), "Correct": ([], "int64"), "Total": ([], "int64")}


@register_op("accuracy", ["X", "Label"], ["Accuracy", "Correct", "Total"], {"k": ("int", 1)},
             infer=_infer_accuracy, grad=None)
def accuracy(ins, attrs):
    """Fraction (and count) of rows of X whose Label is among the top ``k`` scores."""
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
