"""Threads or no threads: a ``ParallelExecutor`` times both on a runner's first steps.

Several CPU places of one process share the GIL: with tiny kernels the pool's threads
mostly hand the GIL back and forth, with big ones they overlap kernels. Unless
``ExecutionStrategy(num_threads=...)`` was given, a runner's first steps are timed on
the pool and in the caller's thread alone, and the runner keeps the faster way
(``runner.inline``). Both ways give bit-identical results, so the choice only changes
speed. CUDA places and a single place are never probed.

Invariant: one ``ThreadingProbe`` per runner, made on its first step and done after
``len(ThreadingProbe.SCHEDULE)`` steps; a done probe never touches its runner again.
"""

__all__ = ["ThreadingProbe", "ThreadingProbes"]


class ThreadingProbe:
    """Times a runner's first steps with the thread pool and in the caller's thread alone.

    Step 1 (building, warming up) is not timed; step 2 runs in the caller's thread
    alone, step 3 on the pool; from step 4 on the runner keeps the faster way.
    """

    __slots__ = ("k", "times", "done")
    SCHEDULE = (False, True, False)  # inline? for steps 1..3

    def __init__(self):
        self.k = 0
        self.times = {False: [], True: []}
        self.done = False

    def before(self, runner):
        runner.inline = self.SCHEDULE[self.k]

    def record(self, runner, seconds):
        if self.k > 0:
            self.times[runner.inline].append(seconds)
        self.k += 1
        if self.k == len(self.SCHEDULE):
            runner.inline = min(self.times[True]) < min(self.times[False])
            self.done = True


class ThreadingProbes:
    """The probes of one executor's runners (keyed by runner identity).

    Parameters
    ----------
    places : list of Place
        The executor's places (probing needs two CPU places or more).
    """

    __slots__ = ("_probes", "_probing")

    def __init__(self, places):
        self._probes = {}  # id(runner) -> ThreadingProbe
        self._probing = len(places) >= 2 and not any(p.is_cuda for p in places)

    def before(self, runner, num_threads):
        """The probe to ``record`` this step of ``runner`` with, or None (not probed)."""
        if num_threads is not None or not self._probing:
            return None  # the user chose the threads, or there is nothing to overlap
        probe = self._probes.get(id(runner))
        if probe is None:
            probe = self._probes[id(runner)] = ThreadingProbe()
        if probe.done:
            return None
        probe.before(runner)
        return probe
