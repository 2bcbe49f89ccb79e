"""Threads or turns: a ``ParallelExecutor`` times both on a runner's first steps.

Several CPU places of one process share the GIL and the cores; ``places_rule`` states
the two ways they run (the pool's threads, or turns in the caller's thread) and the rule
that picks one. This module applies it: unless ``ExecutionStrategy(num_threads=...)`` was
given, a runner's first steps run as ``places_rule.PROBE`` says, timed (wall and the
process's CPU time), and the runner keeps the way ``places_rule.choose`` picks from the
best step of each (``runner.inline``). Both ways give bit-identical results, so the choice
only changes speed. CUDA places and a single place are never probed.

A runner whose lowering switches tier (``compiler="auto"``: ``runtime.tiered``, its
``switches``) is probed again after each switch: the compiled tier's steps may favour
the other way. A runner is also probed again ``places_rule.REPROBE_FIRST`` steps after its
first probe on a tier (whose steps were warm-up), then every ``REPROBE_EVERY`` steps on the
way it kept: the winner can turn with the machine's load. While it is, ``choice``
still says the way kept before.

Invariant: one live ``ThreadingProbe`` per runner, made on its first step, after a tier
switch or after ``REPROBE_FIRST`` / ``REPROBE_EVERY`` steps on the kept way, and done after
``len(places_rule.PROBE)`` steps; a done probe sets only the runner's way.
"""

from ..core.place import available_cores
from ..runtime import places_rule

__all__ = ["ThreadingProbe", "ThreadingProbes"]


class ThreadingProbe:
    """Runs a runner's first steps as ``places_rule.PROBE`` says and times them.

    Step 1 (building, warming up) is not timed; from step ``len(PROBE) + 1`` on the
    runner keeps the way ``places_rule.choose`` picked (``choice``).
    """

    __slots__ = ("k", "times", "cpu", "done", "choice", "epoch", "kept", "previous")
    SCHEDULE = tuple(m == "turns" for m in places_rule.PROBE)  # inline? for steps 1..n

    def __init__(self, epoch=0, previous=None):
        self.k = 0
        self.times = {m: [] for m in places_rule.MODES}
        self.cpu = {m: [] for m in places_rule.MODES}  # the process's CPU seconds, alike
        self.done = False
        self.choice = None  # places_rule.PlacesChoice, once done
        self.epoch = epoch  # the runner's tier switches when the probe began
        self.kept = 0  # steps run on the kept way since the probe was done
        self.previous = previous  # the choice of the probe before, on the same tier

    @property
    def stale(self):
        """Done, and ``places_rule.REPROBE_EVERY`` steps have run on the kept way
        (``REPROBE_FIRST`` after the first probe of a runner or tier: warm-up steps)."""
        return self.done and self.kept >= (places_rule.REPROBE_FIRST if self.previous is None
                                           else places_rule.REPROBE_EVERY)

    @property
    def mode(self):
        """The way the next (or, once done, every) step runs."""
        return self.choice.mode if self.done else places_rule.PROBE[self.k]

    def before(self, runner):
        runner.inline = self.mode == "turns"

    def record(self, runner, seconds, cpu_seconds=None):
        """The step just run took ``seconds`` (and ``cpu_seconds`` of the process's CPU)."""
        if self.k > 0:
            way = places_rule.PROBE[self.k]
            self.times[way].append(seconds)
            self.cpu[way].append(cpu_seconds)
        self.k += 1
        if self.k == len(places_rule.PROBE):
            threads = self.times["threads"]
            best = threads.index(min(threads))
            self.choice = places_rule.choose(min(threads), min(self.times["turns"]),
                                             self.cpu["threads"][best], available_cores())
            runner.inline = self.choice.inline
            self.done = True


def _epoch(runner):
    # tier switches so far (compiler="auto"); other lowerings never switch
    return len(getattr(runner.lowering, "switches", ()) or ())


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
        self._probing = places_rule.chooses(places)

    def before(self, runner, num_threads):
        """The probe to ``record`` this step of ``runner`` with, or None (not probed)."""
        if num_threads is not None or not self._probing:
            return None  # the user chose the threads, or there is nothing to overlap
        probe = self._probes.get(id(runner))
        epoch = _epoch(runner)
        if probe is None or probe.epoch != epoch:
            probe = self._probes[id(runner)] = ThreadingProbe(epoch)
        elif probe.stale:
            probe = self._probes[id(runner)] = ThreadingProbe(epoch, probe.choice)
        if probe.done:
            probe.kept += 1
            return None
        probe.before(runner)
        return probe

    def settled(self, runner, num_threads):
        """Whether ``runner`` runs the way it keeps on its current tier: it is not probed
        (as ``before``), or its probe of ``REPROBE_FIRST`` steps after the tier's first
        probe (whose steps were warm-up) is done. Benchmarks time the steady state from
        then on (``harness.runners``)."""
        if num_threads is not None or not self._probing:
            return True
        probe = self._probes.get(id(runner))
        return probe is not None and probe.epoch == _epoch(runner) and probe.done and \
            probe.previous is not None

    def choice(self, runner):
        """The ``PlacesChoice`` made for ``runner``, or None (not probed, or not yet on
        this tier); while a stale probe runs again, the one it made before."""
        probe = self._probes.get(id(runner))
        return None if probe is None else probe.choice or probe.previous
