"""torch's intra-op threads while an executor's CPU places run.

Policy (``places_rule.intra_op_threads``). CPU places share the host's cores, so while
several run, torch's intra-op threads are set to ``cores // (CPU places x processes on
this machine)``, at least 1, whichever way they run (threads or turns: the count is the
same both ways, so the choice never changes results; ``places_rule`` says why);
``ExecutionStrategy(torch_threads=...)`` overrides it. One CPU place in one process
leaves torch's setting alone.

Invariant: ``restore`` puts back the count found before ``apply`` changed it, once
(idempotent); nothing is restored when nothing was changed.
"""

import torch

from ..core.place import available_cores
from ..runtime.places_rule import intra_op_threads

__all__ = ["TorchThreads"]


class TorchThreads:
    """torch's thread count for one executor, set by ``apply`` and put back by ``restore``."""

    def __init__(self):
        self._prev = None

    def wanted(self, places, torch_threads=None, processes=1):
        """The thread count for ``places`` (None: leave torch's); ``processes``: this
        machine's processes of the run (torchrun's ``LOCAL_WORLD_SIZE``)."""
        cpu = sum(1 for p in places if not p.is_cuda)
        return intra_op_threads(cpu, available_cores(), processes, torch_threads)

    def apply(self, places, torch_threads=None, processes=1):
        """Set torch's thread count as ``wanted`` says, remembering the old one."""
        want = self.wanted(places, torch_threads, processes)
        if want is not None and want != torch.get_num_threads():
            self._prev = torch.get_num_threads()
            torch.set_num_threads(want)

    def restore(self):
        """Put back the count ``apply`` replaced (idempotent)."""
        if self._prev is not None:
            torch.set_num_threads(self._prev)
            self._prev = None
