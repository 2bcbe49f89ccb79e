"""Ops that create or copy tensors: constants, seeded random initialisers, assign, cast.

Random initialisers with a non-zero ``seed`` draw from a CPU generator seeded
with it and then move the values to the target device, so the same program
gives the same values on every device and every run. ``seed=0`` uses torch's
global generator. Ops without tensor inputs create on the CPU; the executor
moves their outputs to the op's device.
"""

import torch

from ..dtypes import torch_dtype
from .registry import REQUIRED, register_op


def _shape_infer(ins, attrs):
    return {"Out": (list(attrs["shape"]), attrs["dtype"])}


@register_op("fill_constant", [], ["Out"],
             {"shape": ("ints", REQUIRED), "value": ("float", 0.0), "dtype": ("dtype", "float32")},
             infer=_shape_infer, grad=None)
def fill_constant(ins, attrs):
    """Out = a tensor of ``shape`` filled with ``value``."""
    return {"Out": torch.full(attrs["shape"], attrs["value"], dtype=torch_dtype(attrs["dtype"]))}


@register_op("fill_zeros_like", ["X"], ["Out"], grad=None)
def fill_zeros_like(ins, attrs):
    """Out = zeros with the shape and dtype of X."""
    return {"Out": torch.zeros_like(ins["X"])}


def _random(dist):
    def kernel(ins, attrs):
        shape, dtype = attrs["shape"], torch_dtype(attrs["dtype"])
        seed = attrs["seed"]
        gen = torch.Generator().manual_seed(seed) if seed else None
        if dist == "uniform":
            t = torch.empty(shape, dtype=dtype).uniform_(attrs["min"], attrs["max"],
                                                         generator=gen)
        else:
            t = torch.empty(shape, dtype=dtype).normal_(attrs["mean"], attrs["std"],
                                                        generator=gen)
        return {"Out": t}
    return kernel


register_op("uniform_random", [], ["Out"],
            {"shape": ("ints", REQUIRED), "min": ("float", -1.0), "max": ("float", 1.0),
             "seed": ("int", 0), "dtype": ("dtype", "float32")},
            infer=_shape_infer, grad=None, is_random=True)(_random("uniform"))
register_op("gaussian_random", [], ["Out"],
            {"shape": ("ints", REQUIRED), "mean": ("float", 0.0), "std": ("float", 1.0),
             "seed": ("int", 0), "dtype": ("dtype", "float32")},
            infer=_shape_infer, grad=None, is_random=True)(_random("gaussian"))


@register_op("assign_value", [], ["Out"],
             {"shape": ("ints", REQUIRED), "dtype": ("dtype", "float32"),
              "values": ("floats", REQUIRED)}, infer=_shape_infer, grad=None)
def assign_value(ins, attrs):
    """Out = the literal ``values`` (row-major) reshaped to ``shape``."""
    t = torch.tensor(attrs["values"], dtype=torch.float64).to(torch_dtype(attrs["dtype"]))
    return {"Out": t.reshape(attrs["shape"])}


@register_op("assign", ["X"], ["Out"])
def assign(ins, attrs):
    """Out = a copy of X."""
    return {"Out": ins["X"].clone()}


@register_op("cast", ["X"], ["Out"], {"out_dtype": ("dtype", REQUIRED)})
def cast(ins, attrs):
    """Out = X converted to ``out_dtype`` (gradient flows between float types)."""
    return {"Out": ins["X"].to(torch_dtype(attrs["out_dtype"]), copy=True)}
