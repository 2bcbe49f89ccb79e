"""Shape ops: reshape, flatten, transpose, concat, split, squeeze/unsqueeze.

Outputs never alias inputs: a view would let an in-place update of one var
change another behind the SSA graph's back, so shape ops return contiguous copies
only where torch would alias (``reshape`` of a contiguous tensor is copied).
"""

import torch

from .registry import REQUIRED, register_op


def _resolve_shape(x, shape):
    # Paddle's rule: 0 copies the input's dimension at that position, -1 is inferred.
    return [x.shape[i] if d == 0 else d for i, d in enumerate(shape)]


@register_op("reshape", ["X"], ["Out"], {"shape": ("ints", REQUIRED)})
def reshape(ins, attrs):
    """Out = X with a new shape (0 keeps the input dim, -1 is inferred)."""
    x = ins["X"]
    return {"Out": x.reshape(_resolve_shape(x, attrs["shape"])).clone()}


@register_op("flatten", ["X"], ["Out"], {"axis": ("int", 1)})
def flatten(ins, attrs):
    """Out = X as a 2-D matrix [prod(dims[:axis]), prod(dims[axis:])]."""
    x, axis = ins["X"], attrs["axis"]
    rows = 1
    for d in x.shape[:axis]:
        rows *= d
    cols = 1
    for d in x.shape[axis:]:
        cols *= d
    return {"Out": x.reshape(rows, cols).clone()}


@register_op("transpose", ["X"], ["Out"], {"axis": ("ints", REQUIRED)})
def transpose(ins, attrs):
    """Out = X with dimensions permuted by ``axis``."""
    return {"Out": ins["X"].permute(attrs["axis"]).contiguous()}


@register_op("concat", ["X*"], ["Out"], {"axis": ("int", 0)})
def concat(ins, attrs):
    """Out = X[0], X[1], ... joined along ``axis``."""
    return {"Out": torch.cat(ins["X"], dim=attrs["axis"])}


@register_op("split", ["X"], ["Out*"],
             {"num": ("int", 0), "sections": ("ints", []), "axis": ("int", 0)})
def split(ins, attrs):
    """Out = X cut along ``axis`` into ``num`` equal parts or the given ``sections``."""
    x, axis = ins["X"], attrs["axis"]
    if attrs["sections"]:
        parts = torch.split(x, attrs["sections"], dim=axis)
    else:
        if attrs["num"] <= 0:
            raise ValueError("split needs num > 0 or sections")
        parts = torch.chunk(x, attrs["num"], dim=axis)
    return {"Out": [p.contiguous().clone() for p in parts]}


@register_op("unsqueeze", ["X"], ["Out"], {"axes": ("ints", REQUIRED)})
def unsqueeze(ins, attrs):
    """Out = X with size-1 dimensions inserted at ``axes``."""
    x = ins["X"]
    for a in sorted(attrs["axes"]):
        x = x.unsqueeze(a)
    return {"Out": x.clone()}


@register_op("squeeze", ["X"], ["Out"], {"axes": ("ints", REQUIRED)})
def squeeze(ins, attrs):
    """Out = X without the size-1 dimensions at ``axes``."""
    x = ins["X"]
    for a in sorted(attrs["axes"], reverse=True):
        x = x.squeeze(a)
    return {"Out": x.clone()}
