"""Pacing: a background thread's long Python computation takes at most a share of the time.

A background compile (``runtime.tiered``) traces a segment in the training process: a
fraction of a second of Python under the interpreter lock, which the training thread waits
for between its kernels (unpaced, the transformer preset's first few hundred steps ran 3x
slower while it traced). The compile worker takes seconds to start anyway, so the trace
need not be quick, only out of the steps' way.

Policy. A ``Pace`` made by a thread lets that thread take ``share`` of the wall time from
then on: each ``wait()`` sleeps (the lock released) until the thread's CPU seconds since
are at most that share of the wall seconds since. ``between(fn, pace)`` waits before each
call of ``fn``: the computation runs as before, in the same order, stretched over about
``1 / share`` times its CPU time. It holds the lock no longer in all (the steps lose about
the same), only never for long at a stretch.

Invariants: a wait sleeps at most ``MAX_WAIT_S``; a wait in any thread but the one that
made the pace returns at once; nothing here changes what the computation does.

Not for imports: an import wrapped this way (a finder on ``sys.meta_path`` pacing each
module) cost the transformer preset's steps more in all than the same imports unpaced
(1.6-1.7 s against 1.2 s, ``runtime.tiered._imported``).
"""

import threading
import time

__all__ = ["MAX_WAIT_S", "Pace", "between"]

MAX_WAIT_S = 0.5  # the longest one wait: a share close to 0 never stalls a call for long


class Pace:
    """The thread that makes it may take ``share`` (0 < share <= 1) of the wall time from
    then on (module docstring)."""

    __slots__ = ("share", "cpu0", "wall0", "ident")

    def __init__(self, share):
        if not 0 < share <= 1:
            raise ValueError(f"share must be in (0, 1], got {share!r}")
        self.share = share
        self.ident = threading.get_ident()
        self.cpu0, self.wall0 = time.thread_time(), time.monotonic()

    def wait(self):
        """Sleep until this thread's CPU seconds since the pace began are at most ``share``
        of the wall seconds since (at most ``MAX_WAIT_S``); in another thread, return."""
        if threading.get_ident() != self.ident:
            return
        due = (time.thread_time() - self.cpu0) / self.share
        left = due - (time.monotonic() - self.wall0)
        if left > 0:
            time.sleep(min(left, MAX_WAIT_S))


def between(fn, pace):
    """``fn``, waiting for ``pace`` before each call."""
    wait = pace.wait

    def paced_call(*args, **kwargs):
        wait()
        return fn(*args, **kwargs)
    return paced_call
