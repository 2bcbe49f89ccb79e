"""Feed checking: turn user feeds into tensors that match the program's data vars.

A feed value may be a torch tensor, a NumPy array or a nested list. Tensors and
arrays must already have the declared dtype (silent casts hide bugs such as
float64 NumPy data fed to a float32 model); lists are converted to it. Every
declared dimension other than -1 must match.
"""

import torch

from .errors import FeedError
from .dtypes import torch_dtype

__all__ = ["check_feed", "to_tensor", "split_batch"]


def to_tensor(name, value, var):
    """Convert one feed value for ``var``, raising ``FeedError`` when it does not fit."""
    if isinstance(value, torch.Tensor):
        t = value
    elif hasattr(value, "__array__") and not isinstance(value, (list, tuple)):
        import numpy as np
        t = torch.from_numpy(np.ascontiguousarray(value))
    else:
        try:
            t = torch.tensor(value, dtype=torch_dtype(var.dtype))
        except (TypeError, ValueError) as e:
            raise FeedError(f"feed {name!r}: cannot make a tensor from {type(value).__name__}: "
                            f"{e}") from None
    want = torch_dtype(var.dtype)
    if t.dtype != want:
        raise FeedError(f"feed {name!r} has dtype {str(t.dtype).replace('torch.', '')} but the "
                        f"program declares {var.dtype} (shape {var.shape}); convert it first")
    if var.shape is not None:
        ok = len(var.shape) == t.dim() and all(d < 0 or d == s for d, s in
                                                zip(var.shape, t.shape))
        if not ok:
            raise FeedError(f"feed {name!r} has shape {list(t.shape)} but the program expects "
                            f"{var.shape} (-1 is any size)")
    return t


def check_feed(program, feed, required=()):
    """Validate ``feed`` (dict name -> value) against ``program``; return name -> tensor.

    ``required`` names data vars that must be present.
    """
    if feed is None:
        feed = {}
    if not isinstance(feed, dict):
        raise FeedError(f"feed must be a dict of var name -> value, got {type(feed).__name__}")
    block = program.global_block()
    out = {}
    for name, value in feed.items():
        key = name if isinstance(name, str) else getattr(name, "name", name)
        var = block.vars.get(key)
        if var is None:
            data = [v.name for v in program.data_vars()]
            raise FeedError(f"feed {key!r} is not a var of the program; its data vars are "
                            f"{data}")
        out[key] = to_tensor(key, value, var)
    missing = [n for n in required if n not in out]
    if missing:
        var = block.vars[missing[0]]
        raise FeedError(f"data var {missing[0]!r} was not fed (expected shape {var.shape}, "
                        f"dtype {var.dtype})")
    return out


def split_batch(tensor, n, name="feed"):
    """Split ``tensor`` along dim 0 into ``n`` parts as evenly as possible (views)."""
    b = tensor.shape[0]
    if b < n:
        raise FeedError(f"feed {name!r} has batch size {b} but there are {n} places: every "
                        "place needs at least one sample")
    base, extra = divmod(b, n)
    sizes = [base + (1 if i < extra else 0) for i in range(n)]
    return list(torch.split(tensor, sizes))
