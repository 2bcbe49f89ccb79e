"""``PrefetchLoader``: the feeds of a program whose ``parallel_do`` prefetches its inputs.

The parallel_do seed: "If the input of the parallel_do is independent from any
prior operators, we can avoid [splitting it] by prefetching the input onto
different devices in a separate background thread." A data var read with
``pd.read_input(x, prefetch=True)`` is fed as one data var per place,
``x@PLACE@K``; this loader makes them: a ``DataLoader`` thread splits each
batch along dim 0 and, for CUDA places, copies every slice to its place's device
on a copy stream from pinned memory while the previous step runs. Every other
feed passes whole. Each item is one feed dict for ``Executor.run``.
"""

from .loader import DataLoader
from ..core.errors import SSAExecError
from ..ops.parallel_do import attr_places

__all__ = ["PrefetchLoader", "prefetched_inputs"]

_SUFFIX = "@PLACE"


def prefetched_inputs(program):
    """(data var names read with ``prefetch=True``, their places) of ``program``."""
    names, places = [], None
    for block in program.blocks:
        for op in block.ops:
            if op.type != "parallel_do" or not op.attrs.get("prefetched"):
                continue
            these = attr_places(op.attrs["places"])
            if places is not None and these != places:
                raise SSAExecError("PrefetchLoader: the program's parallel_do ops prefetch "
                                   "onto different places; use one set of places")
            places = these
            names.extend(n[: -len(_SUFFIX)] for n in op.attrs["prefetched"])
    if not names:
        raise SSAExecError("PrefetchLoader: no parallel_do of the program reads an input with "
                           "prefetch=True")
    return list(dict.fromkeys(names)), places


class PrefetchLoader:
    """Iterate feed dicts prepared ``prefetch`` batches ahead (module docstring).

    Parameters
    ----------
    source : iterable of dict
        Whole-batch feeds: var name -> tensor (or NumPy array).
    program : Program
        The program with the prefetching ``parallel_do``.
    prefetch : int
        How many prepared batches may wait.
    """

    def __init__(self, source, program, prefetch=2):
        self.names, self.places = prefetched_inputs(program)
        self._loader = DataLoader(source, self.places, batch_vars=self.names, prefetch=prefetch)

    def __iter__(self):
        return self

    def __next__(self):
        per_place = next(self._loader)
        feed = {}
        for name, value in per_place[0].items():
            if name not in self.names:
                feed[name] = value
        for k, d in enumerate(per_place):
            for name in self.names:
                if name not in d:
                    raise SSAExecError(f"PrefetchLoader: the batch has no {name!r}")
                feed[f"{name}{_SUFFIX}@{k}"] = d[name]
        return feed

    def close(self):
        """Stop the background thread (idempotent)."""
        self._loader.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
