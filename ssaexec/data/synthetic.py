"""Synthetic data, one place for it: feeds for any program, learnable datasets, batches.

Everything here is seeded (a private ``torch.Generator``), so the CLI, the demo, the
benchmark and the tests draw the same values for the same seed, and never touch torch's
global random stream.

* ``synthetic_feed(program, batch)``: one batch for every data var a program reads,
  from the declared shapes and dtypes (what ``ssaexec run`` and ``trace`` feed);
* ``learnable_dataset(shape, n)``: inputs and labels that depend on them (a fixed linear
  map's argmax), so a model's loss visibly goes down (the demo);
* ``random_batch(shape, n, classes, seed)``: inputs ~ N(0, 1) and uniform int64 labels
  ``[n, 1]`` (the benchmark's batches).
"""

import torch

from ..core.dtypes import torch_dtype
from ..core.errors import FeedError
from ..core.limits import shape_problem

__all__ = ["infer_classes", "synthetic_feed", "learnable_dataset", "random_batch"]


def infer_classes(program, label):
    """The label range of int data var ``label``, read from the op that consumes it."""
    block = program.global_block()
    for op in block.ops:
        if label not in op.input("Label"):
            continue
        for slot in ("Logits", "X", "Input"):
            names = op.input(slot)
            if names:
                var = block.find_var(names[0])
                if var is not None and var.shape and var.shape[-1] > 0:
                    return var.shape[-1]
    for op in block.ops:  # embeddings: ids index the table's rows
        if label in op.input("Ids") and op.input("W"):
            var = block.find_var(op.input("W")[0])
            if var is not None and var.shape and var.shape[0] > 0:
                return var.shape[0]
    return None


def synthetic_feed(program, batch, seed=0, classes=None):
    """One batch of synthetic data for every data var the program reads.

    Floats ~ N(0, 1), integers uniform in [0, classes) (``infer_classes``,
    else 2), bools uniform; a leading -1 dim becomes ``batch``. A batch over
    ``max_tensor_elements`` (``ssaexec.core.limits``) is a ``FeedError`` before
    anything is allocated: the program file chose the other dims.
    """
    gen = torch.Generator().manual_seed(seed)
    read = {n for op in program.global_block().ops for n in op.input_names()}
    feed = {}
    for var in program.data_vars():
        if var.name not in read:
            continue
        if var.shape is None:
            raise FeedError(f"data var {var.name!r} has no declared shape; cannot make synthetic "
                            "data for it (pass --feed FILE.npz)")
        shape = [batch if (i == 0 and d == -1) else d for i, d in enumerate(var.shape)]
        if any(d < 0 for d in shape):
            raise FeedError(f"data var {var.name!r} has shape {var.shape}: only the first dim "
                            "may be -1 for synthetic data (pass --feed FILE.npz)")
        # the declared shape passed with -1 counted as 1; the batch multiplies it
        problem = shape_problem(shape, f"the synthetic batch of data var {var.name!r}: shape")
        if problem:
            raise FeedError(f"{problem}; or lower --batch")
        dtype = torch_dtype(var.dtype)
        if dtype.is_floating_point:
            feed[var.name] = torch.randn(shape, generator=gen).to(dtype)
        elif dtype == torch.bool:
            feed[var.name] = torch.randint(0, 2, shape, generator=gen).bool()
        else:
            hi = classes or infer_classes(program, var.name) or 2
            feed[var.name] = torch.randint(0, hi, shape, generator=gen).to(dtype)
    return feed


def learnable_dataset(shape, n, classes=10, seed=0):
    """``n`` inputs of ``shape`` and labels ``[n, 1]`` = argmax of a fixed linear map."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn([n, *shape], generator=g)
    w = torch.randn([x[0].numel(), classes], generator=g)
    y = (x.reshape(n, -1) @ w).argmax(dim=1, keepdim=True)
    return x, y


def random_batch(shape, n, classes, seed):
    """``n`` inputs of ``shape`` ~ N(0, 1) and labels uniform in [0, classes), ``[n, 1]``."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn([n, *shape], generator=g)
    y = torch.randint(0, classes, (n, 1), generator=g)
    return x, y
