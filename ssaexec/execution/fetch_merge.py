"""How the per-place values of a fetched var become one (``run(return_merged=True)``).

Policy, from the var's declared shape:

* first dim the batch (-1): concatenated along dim 0 in place order;
* a scalar (one element, shape ``[]`` or ``[1]`` or undeclared): floating values are
  averaged over places (with uneven splits that is the mean of per-place means),
  others are stacked, one per place;
* anything else is identical on every place after the all-reduce: place 0's value.

Invariant: one place's value is returned as it is.
"""

import torch

__all__ = ["merge_fetched"]


def merge_fetched(var, values):
    """The merged value of ``values`` (one tensor per place) of ``var`` (a VarDesc, or
    None for a var the program does not declare)."""
    shape = var.shape if var is not None else None
    if len(values) == 1:
        return values[0]
    if shape is not None and len(shape) > 0 and shape[0] == -1:
        return torch.cat(values, dim=0)
    if values[0].numel() == 1 and (shape is None or len(shape) <= 1):
        first = values[0].shape
        if all(v.shape == first for v in values):
            # the usual case (every place's loss of one shape): one stack and one mean
            # over the places, two calls where reshaping each place's value took places + 3
            # (host time of every step at several places); the same sums, bit for bit
            stacked = torch.stack(values)
            return stacked.mean(0) if stacked.is_floating_point() else stacked.reshape(-1)
        stacked = torch.stack([v.reshape(()) for v in values])
        if not stacked.is_floating_point():
            return stacked
        return stacked.mean().reshape(first)
    return values[0]
