"""Ctrl-C held back while a step runs, so that nothing can swallow it.

Why. CPython runs a SIGINT handler in the main thread, between two bytecodes
of whatever Python code runs there. When that code is a finalizer (a
``__del__`` or a ``weakref.finalize`` callback that the garbage collector runs
because an allocation inside the step crossed its threshold), the
``KeyboardInterrupt`` it raises is printed as "Exception ignored in ..." and
lost: the step goes on and returns normally, and the user's Ctrl-C did nothing.
An executor left unclosed by earlier code joins its worker threads in such a
finalizer, which makes the window wide (``tests/core/test_faults.py`` shows it).

Policy. ``hold()`` is entered around a step (``ParallelExecutor.run``,
``Executor.run``, ``Scheduler.run``). In the main thread, over Python's default
handler, it installs a handler that only sets ``Hold.pending``: a flag cannot be
swallowed. The scheduler reads the flag between ops and stops the step there
(nothing new starts, running ops finish), unless the step's commit phase has
begun, which then completes on every place (``runtime.scheduler``). When the
outermost hold ends with a Ctrl-C pending, it raises ``KeyboardInterrupt``
itself (an error of the same step leaving then is its context). A second
Ctrl-C while one is pending raises at once, as Python's default handler does:
the way out of an op that never returns.

Invariants. Only the main thread installs a handler, only over
``signal.default_int_handler`` (a program's own SIGINT handler is left alone),
and the previous handler is always restored. Nested holds share the outermost
one. Elsewhere (other threads, other handlers) ``hold()`` gives ``None`` and
Ctrl-C behaves as Python's default.
"""

import _signal  # the C module: signal's wrappers allocate (enum conversions) on every call
import signal
import threading

__all__ = ["Hold", "hold", "requested"]

_MAIN = threading.main_thread()
_SIGINT = int(signal.SIGINT)
_DEFAULT = signal.default_int_handler


class Hold:
    """A held-back Ctrl-C: ``pending`` is True once one arrived."""

    __slots__ = ("pending", "completed", "depth", "_prev", "handler")

    def __init__(self):
        self.pending = False
        self.completed = False  # a step completed after the Ctrl-C (its commit had begun)
        self.depth = 0          # nested holds entered
        self._prev = None
        self.handler = self._on_sigint  # made once: installing it allocates nothing

    def _on_sigint(self, signum, frame):
        if self.pending:
            signal.default_int_handler(signum, frame)  # raises KeyboardInterrupt
        self.pending = True

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.depth -= 1
        if self.depth:
            return False
        _signal.signal(signal.SIGINT, self._prev)
        self._prev = None
        pending, self.pending = self.pending, False
        if pending and not (exc_type is not None and issubclass(exc_type, KeyboardInterrupt)):
            # Ctrl-C wins over another error of the same step (kept as its context)
            err = KeyboardInterrupt()
            if self.completed:
                err.add_note("ssaexec: the step completed on every place before stopping (Ctrl-C "
                             "came during its commit phase or its last ops)")
            raise err
        return False


class _NoHold:
    __slots__ = ()

    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


# One hold for the main thread, made at import: entering it allocates no object, so
# the garbage collector (and the finalizers it runs) cannot start before it holds.
_HOLD = Hold()
_NONE = _NoHold()


def hold():
    """A context manager holding Ctrl-C back over a step (see the module docstring).

    ``with hold() as h``: ``h`` is the main thread's ``Hold`` (entered here or by an
    enclosing ``hold()``), or None where Ctrl-C keeps Python's default behaviour.
    """
    if threading.current_thread() is not _MAIN:
        return _NONE
    h = _HOLD
    if h.depth:
        h.depth += 1
        return h
    if _signal.getsignal(_SIGINT) is not _DEFAULT:
        return _NONE
    h.completed = False
    h._prev = _signal.signal(_SIGINT, h.handler)
    h.depth = 1
    return h


def requested():
    """Whether a held Ctrl-C waits (a loop of ops checks it between two ops)."""
    return _HOLD.pending and threading.current_thread() is _MAIN
