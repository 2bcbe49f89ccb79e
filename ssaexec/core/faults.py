"""Injected crashes, for the tests of crash recovery (``SSAEXEC_FAULT``).

A resume is only as good as the crashes it was tried against, and the crashes that matter
land at precise points: in the middle of a step (gradients half all-reduced, parameters
not yet updated) and in the middle of a checkpoint save (the file half written). A kill
from outside lands wherever the clock puts it; this module lets a test put it there.

``SSAEXEC_FAULT`` is a comma list of ``kill@WHERE:STEP[:RANK]``:

* ``WHERE`` is ``step`` (this rank enters the first cross-process collective of step
  ``STEP``: the executor has run part of the step and updated nothing) or ``save`` (the
  checkpoint after step ``STEP`` is written to its temporary file and not yet renamed);
* ``STEP`` counts steps from 1 (``ParallelExecutor.runs`` after the step; a checkpoint's
  step);
* ``RANK`` (default 0) is the global rank that dies (a ``save`` point is met by rank 0
  alone: it writes the checkpoints).

The ``i``-th entry fires only in attempt ``i`` of the run (``TORCHELASTIC_RESTART_COUNT``,
which torchrun sets, 0 for the first start), so each restart meets the next crash rather
than the same one again. A fault kills with ``SIGKILL``: no handler, no ``finally``, no
flush runs, as when the machine loses power or the kernel's OOM killer strikes.

The executor arms the ``step`` point with the step's number before a multi-process step
(``arm``) and the cross-process collective fires it (``fire``) as the first all-reduce
starts, so the kill lands after the step's first gradients exist and before any update.

Policy: without the variable nothing here costs more than one test of a module global
(``PLAN`` is None). A malformed value is an error at import, naming the entry.
"""

import os
import signal

from .errors import SSAExecError

__all__ = ["ENV", "PLAN", "point", "arm", "fire"]

ENV = "SSAEXEC_FAULT"
_WHERE = ("step", "save")


def _parse(text):
    plan = []
    for i, entry in enumerate(e.strip() for e in text.split(",") if e.strip()):
        action, _, rest = entry.partition("@")
        parts = rest.split(":")
        if action != "kill" or len(parts) not in (2, 3) or parts[0] not in _WHERE or \
                not all(p.isdigit() for p in parts[1:]):
            raise SSAExecError(f"{ENV} entry {i} {entry!r}: expected kill@step:STEP[:RANK] or "
                               "kill@save:STEP[:RANK]")
        plan.append((i, parts[0], int(parts[1]), int(parts[2]) if len(parts) == 3 else 0))
    return tuple(plan) or None


PLAN = _parse(os.environ.get(ENV, ""))


def point(where, step, rank=None):
    """Die here if the plan says so for (``where``, ``step``) in this attempt and rank."""
    if PLAN is None:
        return
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    if rank is None:  # torchrun's RANK: this module sits below the distributed layer
        rank = int(os.environ.get("RANK", "0") or 0)
    for i, w, s, r in PLAN:
        if i == attempt and w == where and s == step and r == rank:
            os.kill(os.getpid(), signal.SIGKILL)


_armed = None  # the step whose first collective runs the "step" point (``arm``)


def arm(step):
    """The next ``fire()`` is the ``step`` point of step ``step``."""
    global _armed
    if PLAN is not None:
        _armed = step


def fire():
    """Called as a step's first cross-process collective starts: the armed ``step`` point."""
    global _armed
    if _armed is not None:
        step, _armed = _armed, None
        point("step", step)
