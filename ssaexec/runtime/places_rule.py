"""How the places of one process run: threads, or turns in one thread (issue 50).

The two ways. Several CPU places of one process share its cores and its interpreter lock:

* **threads**: the scheduler's pool runs the places' nodes side by side (one thread per
  place and the caller's, ``runtime.scheduler.default_threads``), so the places' kernels
  overlap. It pays when kernels are long enough to release the lock for most of a step.
* **turns**: the caller's thread runs every place's nodes, one after another (the
  scheduler's stack order, ``Scheduler.run(inline=True)``). With launch-bound steps (tiny
  kernels, the host's Python the bottleneck) the pool's threads only pass the lock back
  and forth: turns pay no hand-off but one. A node whose compiled graph releases the lock
  for most of its call (Inductor's C++ wrapper: ``_CompiledSegment.lock_free``) goes to a
  pool thread when another node is ready for the caller meanwhile, at most one per free
  core: two places' graphs overlap, and nothing else leaves the caller's thread.

torch's intra-op threads are the same both ways (``intra_op_threads``: ``cores //
(CPU places x processes)``, at least 1). Giving turns a lone place's count (every core)
would leave no core idle while one place's kernels run, but torch's reductions split
their work by the thread count (a sum over 2**20 floats, seed 0, differs in the last bit
between 1 and 2 threads), so results would then depend on which way the timing picked,
and a resumed run could differ from the uninterrupted one. Where the kernels are long
enough for more threads to pay, threads keep every core busy anyway.

Both ways run the same ops on the same values, so they give bit-identical results; the
choice changes speed only (``tests/runtime/test_places_rule.py``).

The rule (``choose``). Measured, never guessed: a runner's first steps run both ways in
turn (``PROBE``: one untimed step, then turns and threads alternating, three of each), and
the way with the faster best step is kept, by ``ThreadingProbe``
(``execution.threading_probe``), again after a tier switch under ``compiler="auto"``,
``REPROBE_FIRST`` steps after the first probe (whose steps warm up) and every
``REPROBE_EVERY`` steps on the kept way (threads win only while a core is free: on the
shared 2-core machine the compiled transformer's 2 places ran threads at 0.65 ms a step
against turns' 0.67 with a core free, and 0.78-0.91 ms against 0.68 with one busy); a tie
keeps turns (fewer threads, no hand-off).
Three samples each, the best of each, so that one slow step (a compile under
``compiler="inductor"``, a burst of load on a shared machine) does not decide. The
simulator (``sim.predict``) applies the same ``choose`` to its replayed steps of both
ways, and replays kernels on ``intra_op_threads``.

What neither way can do. One process has one interpreter lock: a launch-bound step of P
places costs P places' host work whichever way they run, so several places in one process
deliver about one place's images/sec there. Plain turns deliver less, strictly: a step is P
one-place steps back to back plus what one place never does (the in-process sum of the
gradients, the feed split and the fetch merge: about 5% of the transformer preset's
compiled step at 2 places, 0.94x). Only overlap passes 1.0x: threads, where kernels
release the lock and a core is free, and turns' compiled graphs beside the caller (the
transformer preset under Inductor, ``bench/places_turns.py``: 0.60-0.64 ms a step at 2
places against 0.66-0.67 on threads and 0.66-0.68 in one thread, one place 0.31-0.32 ms:
0.99-1.04x one place's images/sec on the shared 2-core machine; the two graphs alone
overlap 1.66x, the rest of a step is Python under the one lock). Processes do not
there: the transformer preset's 2 gloo processes (``ssaexec bench --modes
ssaexec-inductor-nproc``) delivered 0.47x one place in one process, their all-reduce
costing more than the step. Before a compile they do: on the Xeon build machine, whose
straight-line steps are about 3x the EPYC's, the preset's 2 processes under
``compiler=None`` delivered 1.07-1.23x one place in one process, where 2 places in one
process delivered 0.81-0.90x (docs/benchmarks.md, issue 50's sixth session); the executor
does not start processes itself. The probe also takes the process's CPU time of the threads
steps: when the pool lost and kept fewer than ``LOCK_BOUND_CORES`` cores busy, the lock is
the limit (``host_bound``): one process per place, the torchrun path (``se.distributed``,
``ssaexec bench --modes ssaexec-nproc``), overlaps the host work, and pays where the step
is long against its all-reduce between processes. When it kept more busy, the cores are
the limit (a loaded machine, or kernels that fill them). The reason line says which.

What the ways cost beyond the places' own work (issue 50, measured on the transformer
preset, 2 CPU places against 1, turns; ``bench/places_scaling.py``). The in-process
all-reduce of a bucket is summed coalesced (``LocalCollective.all_reduce_coalesced``: a
foreach add and copy per other place, bit for bit the per-gradient sums): through a flat
buffer it cost 0.21 ms of a 0.88 ms step under ``compiler="inductor"`` (0.77x of one
place's images/sec), coalesced 0.04 ms (0.94x). Buckets matter on the straight-line path
too: one all-reduce per gradient (``compiler=None``'s graph in one process,
``BuildStrategy.fuses_all_reduce``) cuts each place's code into a segment per gradient, and
their loads, frees and scheduling cost about 0.3 ms of a 2.1 ms step (0.87x); the bucketed
graph ``compiler="auto"`` builds runs its straight-line tier at about 1.0x. Threads under
Inductor: the C++ wrapper's entry releases the interpreter lock for the whole graph (about
90% of a call of the transformer's forward and backward: the rest is Python wrappers), so
two places' compiled graphs can overlap when a core is free; a graph compiled with the
Python wrapper (``inductor._cpp_wrapper_ok`` refused it) holds the lock in every kernel.

Not chosen here: one place (nothing to overlap), CUDA places (kernels run on the devices:
threads; or per-place CUDA graphs, ``ExecutionStrategy(cuda_graph=True)``), a user's
``ExecutionStrategy(num_threads=...)`` (their choice stands), and a multi-process run's
executors (threads: each rank's steps are not probed). ``describe`` is the one line
``ssaexec stats`` prints.
"""

import dataclasses

__all__ = ["MODES", "PROBE", "REPROBE_EVERY", "REPROBE_FIRST", "LOCK_BOUND_CORES",
           "PlacesChoice", "chooses", "choose", "intra_op_threads", "describe"]

MODES = ("threads", "turns")
# the way each of a runner's first steps runs; the first is not timed (it builds and warms
# up: workers start, the first kernels load). Three samples a way: with two, the compiled
# transformer preset's probe right after a tier switch kept threads (0.601 against 0.636
# ms) where its steady steps ran turns faster (0.59-0.62 against 0.64-0.65 ms)
PROBE = ("threads",) + ("turns", "threads") * 3
# steps on the kept way before the probe runs again: which way wins can turn with the
# machine's load (threads need a free core), and a probe costs at most 4 steps of the
# slower way (under 0.1% of the steps between probes, at 15% apart)
REPROBE_EVERY = 1000
# ...but the first probe of a runner (or of a tier) runs again after this many: its steps
# are warm-up (the first calls of a compiled graph on a pool thread; under
# compiler="inductor" the compile itself): the compiled transformer preset's first probe
# kept threads (0.619 against 0.671 ms) where its steady steps ran turns 6% faster
REPROBE_FIRST = 50
# fewer cores than this busy on threads: the pool's threads mostly waited for the lock
LOCK_BOUND_CORES = 1.5


@dataclasses.dataclass(frozen=True)
class PlacesChoice:
    """The way the places of one process run, and why.

    ``mode``: "threads" or "turns"; ``times``: the best step seconds of each way that
    decided it (empty when nothing was measured); ``host_bound``: the pool gained nothing
    and kept about one core busy (the lock is the limit), so only processes would overlap
    the host work; ``reason``: one line.
    """

    mode: str
    reason: str
    times: dict = dataclasses.field(default_factory=dict)
    host_bound: bool = False

    @property
    def inline(self):
        """Whether the runner runs in the caller's thread alone (``Runner.inline``)."""
        return self.mode == "turns"


def chooses(places, num_threads=None):
    """Whether the rule chooses for ``places`` (several CPU places, no ``num_threads``)."""
    return num_threads is None and len(places) >= 2 and not any(p.is_cuda for p in places)


def choose(threads_s, turns_s, threads_cpu_s=None, cores=None):
    """The way to keep, from the best step seconds of each (measured or replayed).

    Threads only when strictly faster: on a tie, turns (no hand-off, fewer threads).
    ``threads_cpu_s``: the process's CPU seconds in the threads step timed
    ``threads_s`` (every thread's, torch's included), and ``cores`` the cores it may use:
    when the pool lost and kept less than ``LOCK_BOUND_CORES`` cores busy on a machine of
    two or more, the interpreter lock is the limit (``host_bound``), and processes would
    overlap what one process cannot.
    """
    times = {"threads": float(threads_s), "turns": float(turns_s)}
    ms = f"threads {threads_s * 1e3:.3g} ms, turns {turns_s * 1e3:.3g} ms a step"
    if threads_s < turns_s:
        return PlacesChoice("threads", f"threads: the places' kernels overlap ({ms})", times)
    busy = threads_cpu_s / threads_s if threads_cpu_s is not None and threads_s > 0 else None
    if busy is None:
        why = ("the places' host work holds one interpreter lock, or their kernels find "
               "no free core")
    else:
        ms += f"; on threads the process kept {busy:.1f} cores busy"
        why = ("the interpreter lock is the limit: one process per place (torchrun) would "
               "overlap the host work, where a step is long against its all-reduce"
               if busy < LOCK_BOUND_CORES and (cores or 2) >= 2
               else "the cores are the limit, not the lock")
    bound = busy is not None and busy < LOCK_BOUND_CORES and (cores or 2) >= 2
    return PlacesChoice("turns", f"turns in the caller's thread: the pool gained nothing "
                                 f"({ms}); {why}", times, host_bound=bound)


def intra_op_threads(cpu_places, cores, processes=1, torch_threads=None):
    """torch's intra-op threads while ``cpu_places`` CPU places of a process run, either way.

    ``cores``: the machine's cores this process may use; ``processes``: this machine's
    processes of the run; ``torch_threads``: the user's count (it wins). None: one place in
    one process, torch's own count stands. Otherwise >= 1.
    """
    if torch_threads is not None:
        return int(torch_threads)
    share = cpu_places * processes
    return max(1, cores // share) if share > 1 else None


def describe(places, processes=1, num_threads=None, torch_threads=None, cores=None):
    """One line: how ``places`` of one process run, and why (``ssaexec stats``)."""
    from ..core.place import available_cores
    cores = cores or available_cores()
    n = len(places)
    if any(p.is_cuda for p in places):
        return (f"{n} CUDA place(s): threads (kernels run on the devices; "
                f"ExecutionStrategy(cuda_graph=True) replays each place's step instead)")
    if n == 1:
        return "1 CPU place: runs in the caller's thread, torch's intra-op threads as set"
    if num_threads is not None:
        return f"{n} CPU places: {num_threads} scheduler thread(s), as the strategy says"
    each = intra_op_threads(n, cores, processes, torch_threads)
    if processes > 1:  # ParallelExecutor probes in one process only
        return (f"{n} CPU places in each of {processes} processes: threads ({each} intra-op "
                f"thread(s) each; a multi-process run is not probed)")
    return (f"{n} CPU places: threads or turns in one thread ({each} intra-op thread(s) "
            f"each), the faster on the first steps and every {REPROBE_EVERY} after; "
            f"launch-bound steps gain little either way (one lock; turns run compiled "
            f"graphs that release it beside each other), one process per place overlaps "
            f"the host work")
