"""Places: where a replica of the program runs (a CPU slot or a CUDA device).

Several ``CPUPlace`` objects are distinct places that share the host's memory;
``CPUPlace(i)`` is how one process trains data-parallel on CPU. Places are
immutable and hashable, and print as ``cpu:0`` / ``cuda:1``.

``MetaPlace`` is a place on torch's ``meta`` device (shapes, no data). It stands
in for a GPU where there is none: it is neither the CPU nor CUDA, so a tensor an op
makes on the host where the place's device was meant (a factory op without its
``device``, a constant built on the host) meets a meta tensor and raises, exactly
as it would meet a CUDA tensor on a GPU. Its steps compute nothing, so values
cannot be fetched from it; it is for tests of placement, not of numbers.

Ground floor: imports nothing of ssaexec but ``errors``.
"""

import torch

from .errors import SSAExecError

__all__ = ["Place", "CPUPlace", "CUDAPlace", "MetaPlace", "cpu_places", "cuda_places",
           "parse_places"]


class Place:
    """Base class of places."""

    __slots__ = ("index",)
    kind = None
    is_cuda = False

    def __init__(self, index=0):
        self.index = int(index)

    @property
    def device(self):
        """The ``torch.device`` tensors of this place live on."""
        raise NotImplementedError


    def __eq__(self, other):
        return isinstance(other, Place) and (self.kind, self.index) == (other.kind, other.index)

    def __hash__(self):
        return hash((self.kind, self.index))

    def __str__(self):
        return f"{self.kind}:{self.index}"

    def __repr__(self):
        return f"{type(self).__name__}({self.index})"


class CPUPlace(Place):
    """A CPU place; ``index`` tells replicas apart, memory is the host's."""

    __slots__ = ()
    kind = "cpu"

    @property
    def device(self):
        return torch.device("cpu")


class CUDAPlace(Place):
    """CUDA device ``index`` (several places may share one device for testing)."""

    __slots__ = ("device_index",)
    kind = "cuda"
    is_cuda = True

    def __init__(self, index=0, device_index=None):
        super().__init__(index)
        self.device_index = self.index if device_index is None else int(device_index)

    @property
    def device(self):
        return torch.device("cuda", self.device_index)


class MetaPlace(Place):
    """A place on torch's ``meta`` device: a GPU's stand-in in tests (module docstring)."""

    __slots__ = ()
    kind = "meta"

    @property
    def device(self):
        return torch.device("meta")


def available_cores():
    """CPU cores this process may run on (its affinity mask where the OS has one), >= 1."""
    import os
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, n or 1)


def cpu_places(n=None):
    """``n`` CPU places (default: the number of cores, at least 1)."""
    if n is None:
        n = available_cores()
    if n < 1:
        raise SSAExecError(f"cpu_places needs n >= 1, got {n}")
    return [CPUPlace(i) for i in range(n)]


def cuda_places(device_ids=None):
    """One place per visible CUDA device (or per id in ``device_ids``)."""
    if not torch.cuda.is_available():
        return []
    ids = range(torch.cuda.device_count()) if device_ids is None else device_ids
    return [CUDAPlace(i) for i in ids]


def parse_places(spec):
    """Parse ``"cpu:4"``, ``"cuda:0,1"``, ``"cuda"`` or ``"4"`` into a list of places.

    ``cuda:0,0`` gives two places on device 0 (used to test on one GPU).
    """
    spec = str(spec).strip()
    if spec.isdigit():
        return cuda_places()[: int(spec)] if torch.cuda.is_available() else cpu_places(int(spec))
    family, _, rest = spec.partition(":")
    if family == "cpu":
        if rest and not rest.isdigit():
            raise SSAExecError(f"bad places {spec!r}: use cpu:N with N the number of places")
        return cpu_places(int(rest) if rest else None)
    if family == "cuda":
        if not torch.cuda.is_available():
            raise SSAExecError(f"places {spec!r} need CUDA, but torch sees no GPU")
        if not rest:
            return cuda_places()
        try:
            ids = [int(x) for x in rest.split(",")]
        except ValueError:
            raise SSAExecError(f"bad places {spec!r}: use cuda:0,1 (device ids)") from None
        return [CUDAPlace(i, d) for i, d in enumerate(ids)]
    raise SSAExecError(f"bad places {spec!r}: use cpu:N, cuda:0,1, cuda or a number")
