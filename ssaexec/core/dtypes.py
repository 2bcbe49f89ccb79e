"""Dtype names and torch dtypes: the one table both program files and kernels use.

Ground floor: imports nothing of ssaexec but ``errors``. A program names dtypes by
string (``"float32"``); kernels and the runtime need ``torch.dtype`` objects.
"""

import torch

from .errors import ProgramError

__all__ = ["DTYPES", "torch_dtype", "dtype_name", "itemsize"]

DTYPES = {
    "float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
    "float64": torch.float64, "int8": torch.int8, "uint8": torch.uint8,
    "int16": torch.int16, "int32": torch.int32, "int64": torch.int64, "bool": torch.bool,
}
_DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


def torch_dtype(name):
    """Map a dtype name (``"float32"``) to the torch dtype."""
    try:
        return DTYPES[name]
    except KeyError:
        raise ProgramError(f"unknown dtype {name!r}; expected one of {sorted(DTYPES)}") from None


def dtype_name(dtype):
    """Map a torch dtype (or a dtype name) to its name."""
    if isinstance(dtype, str):
        torch_dtype(dtype)
        return dtype
    try:
        return _DTYPE_NAMES[dtype]
    except KeyError:
        raise ProgramError(f"unsupported dtype {dtype}") from None


def itemsize(name):
    """Bytes per element of dtype ``name``."""
    return torch_dtype(name).itemsize
