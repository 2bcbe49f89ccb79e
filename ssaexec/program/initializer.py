"""Parameter initialisers. Each appends one op to the startup block that fills a var.

Seeds are derived from the startup program's ``random_seed`` and a per-program
counter, so building the same model twice gives the same initial weights,
and every parameter still gets its own stream.
"""

import math

__all__ = ["Initializer", "Constant", "Uniform", "Normal", "Xavier", "MSRA", "NumpyArray"]


def _next_seed(startup):
    n = startup.next_count("@seed")
    # a non-zero seed selects a private generator in the random ops
    return (startup.random_seed * 1000003 + 7919 * (n + 1)) % 2147483647 or 1


def _fans(shape):
    if len(shape) < 2:
        return shape[0] if shape else 1, shape[0] if shape else 1
    if len(shape) == 2:  # fc weights are [in, out]
        return shape[0], shape[1]
    receptive = 1
    for d in shape[2:]:
        receptive *= d
    return shape[1] * receptive, shape[0] * receptive  # conv filters are OIHW


class Initializer:
    """Base class: ``init(var, startup)`` appends the op that fills ``var``."""

    __slots__ = ()

    def init(self, var, startup):
        raise NotImplementedError


class Constant(Initializer):
    """Fill with ``value``."""

    __slots__ = ("value",)

    def __init__(self, value=0.0):
        self.value = float(value)

    def init(self, var, startup):
        startup.global_block().append_op(
            "fill_constant", outputs={"Out": [var.name]},
            attrs={"shape": var.shape, "value": self.value, "dtype": var.dtype})


class Uniform(Initializer):
    """Uniform in [low, high)."""

    __slots__ = ("low", "high", "seed")

    def __init__(self, low=-1.0, high=1.0, seed=None):
        self.low, self.high, self.seed = float(low), float(high), seed

    def init(self, var, startup):
        startup.global_block().append_op(
            "uniform_random", outputs={"Out": [var.name]},
            attrs={"shape": var.shape, "min": self.low, "max": self.high, "dtype": var.dtype,
                   "seed": self.seed or _next_seed(startup)})


class Normal(Initializer):
    """Gaussian with ``mean`` and ``std``."""

    __slots__ = ("mean", "std", "seed")

    def __init__(self, mean=0.0, std=1.0, seed=None):
        self.mean, self.std, self.seed = float(mean), float(std), seed

    def init(self, var, startup):
        startup.global_block().append_op(
            "gaussian_random", outputs={"Out": [var.name]},
            attrs={"shape": var.shape, "mean": self.mean, "std": self.std, "dtype": var.dtype,
                   "seed": self.seed or _next_seed(startup)})


class Xavier(Initializer):
    """Glorot uniform: U(-a, a) with a = sqrt(6 / (fan_in + fan_out))."""

    __slots__ = ("seed",)

    def __init__(self, seed=None):
        self.seed = seed

    def init(self, var, startup):
        fan_in, fan_out = _fans(var.shape)
        a = math.sqrt(6.0 / (fan_in + fan_out))
        Uniform(-a, a, self.seed).init(var, startup)


class MSRA(Initializer):
    """He normal: N(0, sqrt(2 / fan_in)), for ReLU networks."""

    __slots__ = ("seed",)

    def __init__(self, seed=None):
        self.seed = seed

    def init(self, var, startup):
        fan_in, _ = _fans(var.shape)
        Normal(0.0, math.sqrt(2.0 / fan_in), self.seed).init(var, startup)


class NumpyArray(Initializer):
    """Fill with given values (stored in the program as an ``assign_value`` op)."""

    __slots__ = ("values",)

    def __init__(self, values):
        self.values = values

    def init(self, var, startup):
        import torch
        t = torch.as_tensor(self.values, dtype=torch.float64).reshape(var.shape)
        startup.global_block().append_op(
            "assign_value", outputs={"Out": [var.name]},
            attrs={"shape": var.shape, "dtype": var.dtype, "values": t.reshape(-1).tolist()})
