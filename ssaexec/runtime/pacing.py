"""Pacing: a background thread's imports take at most a share of the time.

A background compile (``runtime.tiered``) imports torch's tracer and Inductor in the
training process: about a second of Python under the interpreter lock, which the training
thread then waits for between its kernels (the transformer preset's first hundred steps
ran 0.5 s slower with it). The compile worker takes seconds to start anyway, so these
imports need not be quick, only out of the steps' way.

Policy. Inside ``paced(share)``, each module the thread imports first waits, asleep (the
lock released), until the thread's CPU seconds since it entered are at most ``share`` of
the wall seconds since then. The imports run as before, in the same order, stretched over
about ``1 / share`` times their CPU time; the interpreter lock is held no longer in all
(the total the steps lose is the same), only never for long at a stretch.

Invariants:

* only the thread that entered is paced: for any other thread the finder returns None at
  once, and its imports run untouched;
* the wait runs in the module's own ``exec_module`` (where only that module's lock is
  held), never in ``find_spec`` (which the import system calls holding its global lock:
  a wait there would stall every thread's imports);
* a loader's ``exec_module`` is wrapped for that one call (the wrapper removes itself);
  loaders that are classes (built-in, frozen modules) are not wrapped;
* the finder is on ``sys.meta_path`` only while some thread is paced.
"""

import contextlib
import sys
import threading
import time

__all__ = ["MAX_WAIT_S", "Pace", "between", "paced"]

MAX_WAIT_S = 0.5  # the longest one wait: a share close to 0 never stalls an import for long


class Pace:
    """The thread that makes it may take ``share`` of the wall time from then on: each
    ``wait()`` sleeps until its CPU seconds since are at most that share of the wall
    seconds since (in that thread; from another, a wait does nothing)."""

    __slots__ = ("share", "cpu0", "wall0", "ident")

    def __init__(self, share):
        if not 0 < share <= 1:
            raise ValueError(f"share must be in (0, 1], got {share!r}")
        self.share = share
        self.ident = threading.get_ident()
        self.cpu0, self.wall0 = time.thread_time(), time.monotonic()

    def wait(self):
        if threading.get_ident() != self.ident:
            return
        due = (time.thread_time() - self.cpu0) / self.share
        left = due - (time.monotonic() - self.wall0)
        if left > 0:
            time.sleep(min(left, MAX_WAIT_S))


class _Finder:
    """On ``sys.meta_path`` first while a thread is paced: finds the module as the finders
    after it would, and wraps the loader's ``exec_module`` of a paced thread's import."""

    def __init__(self):
        self.threads = {}  # thread ident -> its Pace
        self.lock = threading.Lock()

    def find_spec(self, name, path, target=None):
        state = self.threads.get(threading.get_ident())
        if state is None:
            return None
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(name, path, target)
            if spec is not None:
                _wrap(spec.loader, state)
                return spec
        return None

    def enter(self, share):
        with self.lock:
            self.threads[threading.get_ident()] = Pace(share)
            if self not in sys.meta_path:
                sys.meta_path.insert(0, self)

    def leave(self):
        with self.lock:
            self.threads.pop(threading.get_ident(), None)
            if not self.threads:
                with contextlib.suppress(ValueError):
                    sys.meta_path.remove(self)


def _wrap(loader, state):
    run = getattr(loader, "exec_module", None)
    if run is None or isinstance(loader, type):
        return

    def exec_module(module):
        with contextlib.suppress(AttributeError):
            del loader.exec_module  # this one call: the loader's own method from now on
        state.wait()
        return run(module)

    with contextlib.suppress(AttributeError, TypeError):
        loader.exec_module = exec_module


_FINDER = _Finder()


def between(fn, pace):
    """``fn`` waiting for ``pace`` before each call: for the calls a long computation makes
    (a trace's ops), where no import is under way."""
    wait = pace.wait

    def paced_call(*args, **kwargs):
        wait()
        return fn(*args, **kwargs)
    return paced_call


@contextlib.contextmanager
def paced(share):
    """While inside, this thread's imports take at most ``share`` (0 < share <= 1) of the
    wall time (module docstring)."""
    if not 0 < share <= 1:
        raise ValueError(f"share must be in (0, 1], got {share!r}")
    if share == 1 or threading.get_ident() in _FINDER.threads:  # (an outer one paces)
        yield
        return
    _FINDER.enter(share)
    try:
        yield
    finally:
        _FINDER.leave()
