"""Tiered compilation (``compiler="auto"``): run at once, compile in the background, switch.

JIT compilers for other languages answer compile waits with tiers; so does this module.
The runner is the Inductor runner's (``runtime.inductor``: the same graph, segments,
memory plan and commit phase apart), with two tiers of every segment:

* **straight-line** (tier 0): the segment's generated code (``runtime.codegen``), the
  compiled path's code, exact against it, and the code the Inductor lowering itself falls
  back on. Steps run on it from the first one, with no compile wait;
* **compiled** (tier 1): the segment's graph compiled by Inductor, exactly as
  ``compiler="inductor"`` compiles it (record, trace, compile per input signature).

Per segment: its first step records its loads and stores (``_CompiledSegment._record``);
its next step with a core free (``compile_beside``: step 3 at the earliest, step 2 being
the first measured; step 2 for a warm load) copies its inputs (tracing runs the kernels: on
copies, as the blocking compile does) and hands the trace and the compile to one
background thread of the process (``_Worker``), then runs its straight-line code; later
steps run straight-line code too.

Switch. At the start of a step (``begin_step``), once every segment of the runner is
settled (a graph compiled for the input signature it saw last, or refused: a segment that
cannot be compiled stays on its straight-line code, with one line naming it and why, as
under ``compiler="inductor"``), the whole runner runs its compiled graphs from that step
on. Segments of one step never mix tiers by timing: the tier is decided once per step, for
every place. One line says the switch, a few steps after it (``REPORT_AFTER``): the steps
run before it, the seconds the background compile took, and the step time before and
after (``say``: stderr, or ``notes``).

New shapes. A compiled segment that meets an input signature it has no graph for runs its
straight-line code, and so does the rest of that step and every step until the new
signature is compiled in the background and the runner switches again: never a wait. On
one place the segments run in order, so the step that meets the new shape runs straight
from that segment on; with several places, a segment of another place may already have run
compiled in that step (each segment's two tiers agree to float32 rounding, the switch's own
difference). A new fetch list is a new runner (``RunnerCache``), which starts on its own
straight-line tier.

Where the compile runs. The trace needs the step's code and values, so it runs in a
background thread of this process (``_Worker``, one per process: Inductor keeps
process-wide state); the compile proper runs in a worker process
(``runtime.compile_worker``, at the lowest scheduling priority), which fills Inductor's
on-disk cache; the thread then compiles the same graph again, a load from that cache. A
compile in the thread itself (``SSAEXEC_COMPILE_WORKER=thread``) holds the interpreter lock
for seconds: on 2 cores a small MLP's steps ran 2.3x slower for the whole compile, against
nothing measurable while the worker compiles; what is left is this process's own Python in
the background (the trace, a fraction of a second; Inductor's import and the loads, seconds:
``_yielding`` hands the lock back every ``SWITCH_S`` meanwhile). The training thread itself
imports nothing of Inductor's (``_cache_dir``); the background thread does, from the trace
on (``make_fx`` imports Inductor's package: 0.8 s).

Order of a cold compile, so that the worker's start is off the critical path and this
process's background Python costs the steps little.

1. The worker starts early: at the import of a model for training (``from_torch`` calls
   ``prestart`` where "auto" will want it), else at the step that submits the first cold
   compile (``CompileWorker.start``). Its imports and its check of the CPU's vector ISA
   (``compat.vec_isa_first``: seconds in all on the CPU build machine) then run beside the
   import (2.8 s for the transformer preset) or the first steps, not after the trace.
2. This process's background thread imports the tracer (``compat.preload_tracer``) and
   traces, paced (``runtime.pacing``: at most ``PACE`` of the time, so it never stalls the
   steps for long) and on one fake mode (``_trace``: half its time went to a fake mode
   per value), and sends the graph.
3. While the worker compiles (the C++ wrapper built apart from the kernels:
   ``split_build``), at its word that its C++ build starts (seconds before its answer),
   this process checks the vector ISA the load needs (the worker built its test programs:
   their loads are left, subprocesses waited for) and imports what the load needs
   (Python under the interpreter lock, which the steps lose either way). Imported at
   once instead, they fell in the first 1000 steps (1.0-1.1 s lost there against
   0.27 s, ``bench/tier_loss.py``); after the answer, they delayed the switch by their
   time.
4. The load from the cache (``bench/time_to_steps.py``'s ``load`` phase: 0.55-0.63 s,
   1.2-1.4 s before) and the switch.

On the transformer preset this switches some 8.5 s after the first step (11.5 s before
the early start, the split build and the word). What this process's part costs the
steps in all is measured by ``bench/tier_loss.py``. A warm load is not paced: a step
boundary waits for it.

Before the switch, a step with nothing to record or submit runs the compiled path's runner
of the same graph (``TieredRunner.plain``: ``compiler=None``'s code, bit for bit), not the
segments' straight-line tier, whose per-segment work (inputs gathered, their signature, the
commit phase apart) cost the transformer preset 7-10% a step. A segment Inductor refuses
(a foreach update) runs its straight-line code in either runner and does not count.

torch's tracers keep process-wide state, so the background thread's trace and loads hold
``compat.TRACE_LOCK``, as every other ssaexec trace does (``from_torch``, a blocking
compile): a model imported while a compile runs in the background waits for its trace or
load to end, rather than corrupt it. Closing the executor (``ParallelExecutor.close``)
skips its compiles still queued, and stops one in flight at its next phase.

Only beside a free core (``compile_beside``). A cold compile starts once the straight
steps leave at least ``FREE_CORE`` of a core free: this process's CPU seconds over wall
seconds, the most over its last 5 straight steps (``TieredRunner.run`` measures each; the
first, which records, is left out; a rank of several processes on the machine counts the
mean of those 5, and a whole core at least, since its waits for its peers are not free
time), against its share of the cores it may run on (the cores over the run's processes on
this machine, ``share``): two gloo ranks of the transformer preset on 2 cores, each
compiling beside its steps at the lowest priority, made them 1.6x slower for the 30 s the
compiles took (their all-reduces wake them every step, and a core the compile holds is not
free at once), so there they keep their straight-line code. Steps that keep
every core busy (kernel-bound: the quick ResNet-18 on two torch threads) ran 1.7-1.9x
slower beside a compile, which there gains little (Inductor's graphs ran 1.08x slower than
the straight-line code). Until a core is free the runner stays on its straight-line code,
said on one line after ``DEFER_SAY`` steps; a warm load starts at once. The measure is this
process's own: other processes' load on the cores delays the switch (the worker runs at
the lowest priority), not the steps.

Cache across runs. Inductor keeps each compiled graph in its on-disk FX graph cache
(``TORCHINDUCTOR_CACHE_DIR``, default ``/tmp/torchinductor_<user>``, kept across runs
until the machine cleans its temporary files). After each compile this module leaves a
marker there (``ssaexec_tiered/``, keyed by the segment's generated code, its constants,
its input signature and the torch version). A segment whose marker exists loads its graph
from the cache in a fraction of a cold compile, so the first step boundary after its
submission waits for it (at most ``WARM_WAIT_S``): a second run of the same program
switches at the start of its third step (step 1 records, step 2 submits).

Numerics and resume. Each compiled graph equals its straight-line code to float32
rounding (fused kernels round the last bit their own way), so the steps after the switch
may differ in the last bits from ``compiler=None``'s. The switch step depends on how long
the compile took: a run resumed from a checkpoint (``se.Checkpoints``) switches at its own
third step with a warm cache, or when its compile ends, not at the step the uninterrupted
run switched at, so the two agree to float32 rounding, not bit for bit. ``compiler=None``
and ``compiler="inductor"`` keep their exact behaviour.

Several processes (``_Agreement``). Each rank compiles in the background on its own, so its
graphs are ready at its own step; if ranks switched when their own graphs were ready, one
rank's update would run fused kernels while another's ran straight-line code, and the
replicas would drift apart in the last bits (docs/security.md, "Replicas never silently
diverge"). So ranks agree, through the executor's collective backend: at the start of step
3 and then every ``AGREE_EVERY`` steps, each rank starts one all-reduce (a sum) of a few
integers: whether it is not ready (a segment unsettled or a compile pending) and, per
segment, whether it refused to compile. The call is asynchronous, and its result is read at
the start of the next step, the step it has run beside (the first one, at step 3, is waited
for at once, so that a warm cache switches at step 3 as in one process): every rank reads
the same sums at the same step, so every rank switches at the same step, and uses the same
graphs. A rank ready after the other ranks switches at most ``AGREE_EVERY + 1`` steps after
its own compiles end. What a rank uses after an agreement is a snapshot of the graphs it
had when its part was sent (``_TieredSegment.agreed``); a graph compiled later is used from
the next agreement that finds every rank ready, and a segment refused on any rank runs
straight-line code on all. A new input shape met after the switch runs that segment's
straight-line code (no graph is agreed for it) and only that segment: the rest of the step
keeps the agreed tier, since the shapes of a rank's own batch differ from its peers' only
upstream of the gradient all-reduce, whose sum every rank then shares. A runner whose graph
holds no cross-process collective (one rank may run it alone: an evaluation on rank 0)
cannot agree, and runs the compiled path (``RunnerCache``).

Where it does not run (``straight_reason``): places with no C++ compiler (CPU) or no
Triton (CUDA), and CUDA graph capture (a captured step would keep the tier it was captured
in). There ``compiler="auto"`` is the compiled path, said once per process on one line.
"""

import atexit
import collections
import contextlib
import hashlib
import importlib.util
import os
import queue
import re
import statistics
import sys
import tempfile
import threading
import time
import weakref

import torch

from ..core import compat
from ..core.errors import SSAExecError
from ..ops.guards import GuardError
from . import pacing
from .compile_worker import CompileWorker, portable
from .compiled import SegmentLowering
from .inductor import (_COMPILE_LOCK, MAX_SIGNATURES, InductorLowering, _CompiledSegment,
                       check_vec_isa,
                       _first_line, _layout_copy, _Refused, _signature, missing_cpp)
from .runner import Runner

__all__ = ["AGREE_EVERY", "COMPILE_BESIDE", "DEFER_SAY", "FREE_CORE", "PACE", "REPORT_AFTER",
           "SWITCH_S", "TieredLowering", "TieredRunner", "WARM_WAIT_S", "agrees",
           "compile_beside", "cores", "prestart", "say_straight", "straight_reason"]

REPORT_AFTER = 3  # compiled steps timed before the switch's line is said
# steps between two agreements of the ranks of a multi-process run: each costs a gloo
# round trip (an agreement every step added some 40% to a 0.8 ms step on 2 loaded cores,
# bench50.md; one every 8 or 32, within the noise), and a rank ready last switches at most
# this many steps (plus one) late
AGREE_EVERY = 16
FIRST_AGREEMENT = 2  # the step (counted from 0) of the first agreement, waited for at once
WARM_WAIT_S = 30.0  # the longest a step boundary waits for graphs expected in the cache
SWITCH_S = 1e-4  # the interpreter's switch interval while the background thread runs Python
# the share of the time a cold compile's trace takes in the background thread
# (runtime.pacing): the transformer preset's 0.3 s trace stretched over about 1.2 s, while
# the worker starts (seconds); unpaced, it made the first few hundred steps 3x slower
PACE = 0.25
_SAID = set()  # straight_reason lines said in this process (once each)
# a cold compile starts only while the steps leave this much of a core free: a compile
# beside steps that keep every core busy slowed them 1.7-1.9x (the quick ResNet-18, two
# torch threads on 2 cores: its kernels wait for each other at every barrier), and such
# kernel-bound steps gain little from Inductor (there its graphs ran 1.08x slower)
FREE_CORE = 0.5
DEFER_SAY = 50  # straight-line steps deferred before the line that says so
# SSAEXEC_COMPILE_BESIDE=always starts a cold compile at once (the third step), whatever
# the steps' load: for a machine whose spare cores this process cannot see, and for tests
# that count steps; anything else (the default, "auto") applies compile_beside
COMPILE_BESIDE = os.environ.get("SSAEXEC_COMPILE_BESIDE", "auto")


def cores():
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def compile_beside(busy, n_cores):
    """Whether a cold background compile may start beside steps that kept ``busy`` cores
    busy (this process's CPU seconds over wall seconds, the most over the last straight
    steps; None: not measured yet), on ``n_cores`` cores, this process's share of the
    machine's (``TieredLowering.share``: the cores over the run's processes on it): a core
    left free, at least ``FREE_CORE`` of it. Another program's load is not measured (the
    compile worker runs at the lowest priority, so that load delays the switch)."""
    return busy is not None and n_cores - busy >= FREE_CORE


def straight_reason(places, build_strategy, exec_strategy):
    """Why ``compiler="auto"`` runs the compiled path (no tiers) here, or None."""
    if exec_strategy.cuda_graph:
        return "CUDA graph capture keeps the tier a step was captured in"
    # nothing imported here: importing Inductor takes seconds, and the first step must not
    # wait for it (the background compile imports it; a torch too old for it is a failed
    # compile there, said on one line)
    missing = missing_cpp(places)
    if missing is not None:
        return f"Inductor {missing}"
    if any(p.is_cuda for p in places) and importlib.util.find_spec("triton") is None:
        return "CUDA places need Triton for Inductor, and it is not installed"
    return None


def say_straight(reason):
    """The one line, once per process, saying that ``compiler="auto"`` runs no tiers."""
    if reason not in _SAID:
        _SAID.add(reason)
        print(f"ssaexec: compiler='auto' runs the compiled path without Inductor: {reason}",
              file=sys.stderr, flush=True)


class _Worker:
    """One background thread per process, running compile jobs in turn (Inductor keeps
    process-wide state: one compile at a time, ``inductor._COMPILE_LOCK``).

    Warm jobs (loads from the cache) go before cold ones, in submission order otherwise:
    a step boundary may wait for a warm load (``TieredLowering._ready``), never for another
    runner's cold compile queued ahead of it. ``cold`` is True while a cold compile runs:
    then a warm load cannot start before it ends, and nothing waits for it."""

    def __init__(self):
        self.jobs = queue.PriorityQueue()  # (cold?, submission number, job)
        self.count = 0
        self.thread = None
        self.lock = threading.Lock()
        self.cold = False

    def submit(self, job):
        with self.lock:
            if self.thread is None or not self.thread.is_alive():
                # a daemon: a run that ends mid-compile does not wait for it
                if self.thread is None:
                    # at exit, before atexit's handlers: threading's own hook
                    getattr(threading, "_register_atexit", atexit.register)(_shutdown)
                self.thread = threading.Thread(target=self._loop, name="ssaexec-compile",
                                               daemon=True)
                self.thread.start()
            self.count += 1
            self.jobs.put((not job.warm, self.count, job))

    def _loop(self):
        while not _EXITING.is_set():
            try:
                cold, _, job = self.jobs.get(timeout=0.5)
            except queue.Empty:
                continue
            self.cold = cold
            try:
                job()
            except Exception as e:  # noqa: BLE001 - one job's bug must not stop the others
                print(f"ssaexec: a background compile failed: {type(e).__name__}: "
                      f"{_first_line(e)}", file=sys.stderr, flush=True)
            finally:
                self.cold = False


_WORKER = _Worker()
_EXITING = threading.Event()  # the interpreter is exiting: jobs stop, and say nothing


def _shutdown():
    """At exit, before any ``atexit`` handler (Inductor's close its pools): stop the jobs,
    end the worker process (a job waiting on it returns at once) and wait for the
    background thread, which must not be inside torch's C++ code when the interpreter
    goes (a C++ "terminate called" abort, seen). What it has left is a trace or a load
    from the cache: seconds at most."""
    _EXITING.set()
    _PROCESS.close()
    thread = _WORKER.thread
    if thread is not None and thread.is_alive():
        thread.join(timeout=60)
_PROCESS = CompileWorker()
# where the compile proper runs: "process" (runtime.compile_worker; the default) or
# "thread" (the background thread itself; bench/time_to_steps.py compares the two)
_WORKER_KIND = os.environ.get("SSAEXEC_COMPILE_WORKER", "process")


def prestart(local_processes=1):
    """Start the compile worker now if ``compiler="auto"`` will want it, ahead of the first
    step; True if it runs. Called at the import of a model for training (``from_torch``):
    the worker's imports and its check of the vector ISA (seconds of a free core) then run
    beside the import (2.8 s for the transformer preset), and the first cold compile
    begins at once instead of seconds into the steps.

    Where: the default compiler is "auto" (``default_compiler``: ``SSAEXEC_COMPILER`` may
    say otherwise), the compile runs in a worker process, a C++ compiler is present, and
    this process's share of the cores (the run's ``local_processes`` on this machine
    share them) leaves one free beside the import's (``compile_beside``, with one core
    busy). An executor given another compiler leaves the worker idle (no CPU; its memory,
    some 0.3 GB) until the process exits."""
    from ..core.place import CPUPlace
    from ..core.strategy import default_compiler
    if default_compiler() != "auto" or _WORKER_KIND != "process" or _EXITING.is_set() or \
            missing_cpp([CPUPlace()]) is not None or \
            not compile_beside(1.0, cores() / max(1, int(local_processes))):
        return False
    _PROCESS.start()
    return _PROCESS.broken is None


class TieredLowering(InductorLowering):
    """The Inductor lowering with a straight-line tier first (see the module docstring).

    ``tier`` is the tier the current step runs ("straight" or "compiled"); ``ran`` counts
    the steps each tier ran (``plain_steps`` of the straight ones on ``TieredRunner.plain``);
    ``switches`` lists ``(steps before, compile seconds)`` of each switch; ``wait()`` waits
    for the background compiles (tests, benchmarks).
    """

    __slots__ = ("tier", "segs", "ran", "switches", "compile_s", "before", "after",
                 "pending", "cond", "missed", "step_tier", "said", "times", "agreement",
                 "begun", "closed", "busy", "deferred", "share", "local", "in_step",
                 "plain_steps")
    chatty = False  # no line per compile: one at the switch
    # the C++ wrapper built apart from the kernels (compile_graph): a shorter background
    # compile once the precompiled headers exist
    split_build = True

    def __init__(self, notes=None, local_processes=1):
        super().__init__(notes=notes)
        # this process's share of the machine's cores: the run's processes here share them
        self.local = max(1, int(local_processes))
        self.share = cores() / self.local
        self.tier = "straight"
        self.segs = []
        self.ran = {"straight": 0, "compiled": 0}
        self.switches = []
        self.compile_s = 0.0  # seconds the background compiles took, all together
        self.before = collections.deque(maxlen=20)  # the last straight steps' seconds
        self.after = []  # the first compiled steps' seconds after the last switch
        self.pending = 0  # background jobs not yet done
        self.cond = threading.Condition()
        self.missed = False  # a segment met a new signature in this step
        self.step_tier = "straight"
        self.said = True
        # seconds of the background compiles by phase: the trace and the load from the cache
        # (in this process), the compile (in the worker process)
        self.times = {"trace": 0.0, "worker": 0.0, "load": 0.0}
        self.agreement = None  # an _Agreement in a multi-process run (TieredRunner)
        self.begun = 0  # steps begun
        self.closed = False  # the executor closed: its queued compiles are skipped
        self.busy = collections.deque(maxlen=5)  # cores busy in the last straight steps
        self.deferred = 0  # steps a cold compile waited for a free core (compile_beside)
        self.in_step = False  # begin_step ran for the step under way (TieredRunner.run)
        self.plain_steps = 0  # straight-line steps run by the compiled path's runner

    def close(self):
        """Skip this lowering's background compiles from now on: those queued, and the
        rest of one in flight (it stops at its next phase; a trace under way ends first,
        holding ``compat.TRACE_LOCK``, so no other trace overlaps it)."""
        self.closed = True

    def segment_body(self, seg):
        body = _TieredSegment(self, seg, self.base.segment_body(seg))
        self.segs.append(body)
        return body.run

    def begin_step(self):
        if self.in_step:  # (TieredRunner.run called it before it picked the runner)
            return
        self.in_step = True
        super().begin_step()
        self.missed = False
        if self.agreement is not None:
            self._agree()
        elif self.tier == "straight" and self._ready():
            self._switch()
        self.begun += 1
        self.step_tier = self.tier

    def _switch(self):
        self.tier = "compiled"
        self.switches.append((sum(self.ran.values()), self.compile_s))
        self.after, self.said = [], False

    def _agree(self):
        """A multi-process run's step boundary: read the ranks' sums sent at the last
        one, if any (switching, and taking the graphs snapshotted then, if every rank was
        ready); at an agreement step, send this rank's part (module docstring)."""
        agreement = self.agreement
        if agreement.sent is not None:  # sent at the start of the last step
            self._agreed(*agreement.read())
        n = self.begun - FIRST_AGREEMENT
        if n < 0 or n % AGREE_EVERY:
            return
        ready = self._ready()
        with self.cond:
            ready = ready and self.pending == 0
            snapshot = [dict(s.graphs) for s in self.segs]
            refused = [s.refused is not None for s in self.segs]
        agreement.send(ready, refused, snapshot)
        if n == 0:  # the first one at once: a warm cache switches at step 3
            self._agreed(*agreement.read())

    def _agreed(self, all_ready, refused_somewhere, snapshot):
        if not all_ready:
            return  # the graphs agreed before (if any) stay in use
        for seg, refused, graphs in zip(self.segs, refused_somewhere, snapshot, strict=True):
            seg.agreed = {} if refused else graphs
        if self.tier == "straight" and any(s.agreed for s in self.segs):
            self._switch()

    def end_step(self, seconds, cpu_seconds=None):
        """Count the step that just ran in ``seconds`` (``cpu_seconds`` of this process's
        CPU time), and say the switch's line once ``REPORT_AFTER`` compiled steps have run
        after it."""
        self.in_step = False
        tier = "straight" if self.missed else self.step_tier
        self.ran[tier] += 1
        if tier == "straight":
            self.before.append(seconds)
            # the first step (recording: single-threaded Python, one-off work) says
            # little of the steps' load: a kernel-bound step on two cores kept 1.3 busy
            # while it recorded, and 1.5-2 after
            if cpu_seconds is not None and seconds > 0 and self.begun > 1:
                self.busy.append(cpu_seconds / seconds)
            return
        if self.said:
            return
        self.after.append(seconds)
        if len(self.after) >= REPORT_AFTER:
            self.said = True
            steps, compile_s = self.switches[-1]
            n = sum(1 for s in self.segs if s.graphs)
            left = sum(1 for s in self.segs if s.refused not in (None, "foreach"))
            before = (f"{statistics.median(self.before) * 1e3:.2f} ms a step before"
                      if self.before else "no step timed before")
            self.say(f"ssaexec: switched to compiled segments after {steps} steps on the "
                     f"straight-line path ({n} segments compiled by Inductor in "
                     f"{compile_s:.1f} s in the background"
                     + (f", {left} kept uncompiled" if left else "") + f"): {before}, "
                     f"{statistics.median(self.after) * 1e3:.2f} ms after")

    def plain_ok(self):
        """Whether this step, on the straight-line tier, may run the compiled path's runner
        (``TieredRunner``): every segment recorded, and none with a compile to submit now
        (each refused, compiled or being compiled for the input signature it met last, or
        a cold compile that must wait for a free core: ``may_compile``). Its steps are
        ``compiler=None``'s, bit for bit, without this runner's per-segment work (the
        inputs gathered and their signature, the commit phase apart): 7-10% of the
        transformer preset's straight-line step. New shapes are seen again at the next
        step this runner runs (a miss after the switch)."""
        wanted = []
        for s in self.segs:
            if s.refused is not None:
                continue  # its straight-line code in every tier (never recorded, it may be)
            if s.loads is None or s.current is None:
                return False  # it records, or meets its inputs' signature first
            if s.refused is None and s.pending_key is None and \
                    s.current not in s.graphs and s.current not in s.skipped:
                wanted.append(s)
        if not wanted:
            return True
        if any(s.warm_marker(s.current) for s in wanted):
            return False  # a load from the cache, submitted at once
        if COMPILE_BESIDE != "always" and self.busy_measured() is None:
            # may_compile's steps are still measured on this runner: with several places
            # its places rule probes both ways (threads, turns); the compiled path's
            # runner probes its own, and a compile started on turns alone slowed the
            # quick ResNet-18's threads steps at 2 places to 0.66x of one place
            return False
        return not self.may_compile()

    def miss(self):
        """A segment met an input signature with no graph: this step runs straight-line
        code from here on, and so do the next ones until the runner switches again (in
        one process; with several, only that segment: module docstring)."""
        if self.agreement is not None:
            return
        self.missed = True
        self.tier = "straight"

    def _ready(self):
        """Whether every segment is settled (at least one with a graph), waiting at most
        ``WARM_WAIT_S`` for those whose graphs are expected from the on-disk cache."""
        if not self.segs:
            return False
        waiting = [s for s in self.segs if not s.settled()]
        # only warm loads are waited for, and not behind a cold compile (another runner's:
        # its seconds or minutes would be a wait)
        if waiting and all(s.warm and s.pending_key == s.current for s in waiting) \
                and not _WORKER.cold:
            deadline = time.monotonic() + WARM_WAIT_S
            with self.cond:
                while any(s.pending_key is not None for s in waiting) and \
                        (left := deadline - time.monotonic()) > 0:
                    self.cond.wait(left)
            waiting = [s for s in self.segs if not s.settled()]
        return not waiting and any(s.current in s.graphs for s in self.segs)

    def may_compile(self):
        """Whether a cold compile may start now (``compile_beside`` on the last straight
        steps); counts the steps it may not, and says so once after ``DEFER_SAY``."""
        # the most of the last steps, not a median: with several places the places rule's
        # probe alternates threads (every core busy) and turns (one), and a compile beside
        # the threads steps slowed 2 places of the quick ResNet-18 to 0.73x of one
        # (and with several places, both ways measured: steps 2 and 3)
        if COMPILE_BESIDE == "always":
            return True
        busy = self.busy_measured()
        if compile_beside(busy, self.share):
            return True
        if busy is not None:
            self.deferred += 1
            if self.deferred == DEFER_SAY:
                of = f"{cores()} cores" if self.share == cores() else \
                    f"this process's share of the cores ({self.share:.2g} of {cores()})"
                self.say(f"ssaexec: compiler='auto' keeps the straight-line path for now: the "
                         f"steps keep {busy:.1f} of {of} busy, and a compile beside "
                         "them would slow them (it starts once a core is free; "
                         "compiler='inductor' compiles before the steps instead)")
        return False

    def busy_measured(self):
        """The cores the straight steps keep busy, as ``may_compile`` weighs them; None
        while too few steps are measured."""
        calls = getattr(self.base, "calls", None)  # (None before the runner prepared it)
        # several processes: a rank counts a whole core at least, over a full window: its
        # waits for its peers are not free time (a peer runs then). Measured alone, two
        # ranks of the transformer preset on 2 cores kept 0.3-1.0 of a core busy a step,
        # and one whose steps waited more started a compile, which slowed its peer, whose
        # steps then waited more too: both compiled beside their steps within 250 steps.
        # Several places: both of the probe's ways (steps 2 and 3), the most of them
        if self.local > 1:
            full = len(self.busy) == self.busy.maxlen
            return max(1.0, statistics.fmean(self.busy)) if full else None
        need = 2 if calls is not None and len(calls.scopes) > 1 else 1
        return max(self.busy) if len(self.busy) >= need else None

    def wait(self, timeout=None):
        """Wait until no background compile of this lowering is pending (True), or
        ``timeout`` seconds (False)."""
        with self.cond:
            return self.cond.wait_for(lambda: self.pending == 0, timeout)


class _TieredSegment(_CompiledSegment):
    """One segment's two tiers: its straight-line code until the runner switches, then its
    compiled graphs; its compiles submitted to the background worker."""

    __slots__ = ("current", "pending_key", "warm", "skipped", "agreed", "markers",
                 "__weakref__")

    def __init__(self, lowering, seg, fallback):
        super().__init__(lowering, seg, fallback)
        self.current = None  # the input signature of its last step
        self.pending_key = None  # the signature being compiled in the background
        self.warm = False  # that compile is expected to load from Inductor's cache
        self.skipped = set()  # signatures beyond MAX_SIGNATURES: straight-line code
        self.agreed = {}  # several processes: the graphs every rank agreed to run
        # signature -> its warm-cache marker: hashed once, not at every step a deferred
        # compile asks again (compile_beside)
        self.markers = {}

    @property
    def lock_free(self):
        low = self.lowering
        return self.releases and low.tier == "compiled" and not low.missed and \
            (self.refused is None or bool(self.agreed))

    def settled(self):
        return self.refused is not None or (self.current is not None and (
            self.current in self.graphs or self.current in self.skipped))

    def run(self):
        low = self.lowering
        # several processes: a graph every rank agreed on runs until an agreement drops
        # it, even if this rank refused the segment since
        if self.refused is not None and not self.agreed:
            return self.fallback()
        scope = self.scopes[self.seg.place_idx]
        if self.loads is None:
            return self._record(scope)
        inputs = self.inputs(scope)
        key = self.current = _signature(inputs)
        if low.tier == "compiled" and not low.missed:
            fn = (self.graphs if low.agreement is None else self.agreed).get(key)
            if fn is not None:
                try:
                    outs = fn(*inputs)
                except Exception as e:
                    return self._failed(e)
                scope.vars.update(zip(self.stores, outs))  # one output per recorded store
                return None
            if key not in self.skipped:
                low.miss()
        if key not in self.graphs and key not in self.skipped and self.pending_key is None \
                and self.refused is None:
            self._submit(key, inputs)
        return self.fallback()

    def _marker_of(self, key):
        marker = self.markers.get(key, False)
        if marker is False:
            marker = self.markers[key] = _marker(self, key)
        return marker

    def warm_marker(self, key):
        """Whether the graph for ``key`` is expected in Inductor's cache (its marker)."""
        marker = None if key is None else self._marker_of(key)
        return marker is not None and os.path.exists(marker)

    def _submit(self, key, inputs):
        """Copy this step's inputs and hand their trace and compile to the worker."""
        bad = next((n for n, t in zip(self.loads, inputs)
                    if not isinstance(t, torch.Tensor)), None)
        if bad is not None or key is None:
            # refused, not run: run() runs this step's straight-line code once, after
            self.refuse(f"its input {bad!r} is not a tensor")
            return
        if len(self.graphs) >= MAX_SIGNATURES:
            self.skipped.add(key)
            if len(self.skipped) == 1:
                seg = self.seg
                self.lowering.say(
                    f"ssaexec: {seg.place} segment {seg.id} ({seg.name}) has compiled "
                    f"{MAX_SIGNATURES} input shapes (MAX_SIGNATURES); other shapes run "
                    "uncompiled: pad the inputs to fewer shapes")
            return
        marker = self._marker_of(key)
        low = self.lowering
        warm = self.warm_marker(key)
        if not warm and not low.may_compile():
            return  # a later step submits it, once a core is free (a load goes at once)
        try:
            copies = [_layout_copy(n, t) for n, t in
                      zip(self.loads + ["seed"] * len(self.draws), inputs)]
        except _Refused as e:
            self.refuse(str(e))
            return
        with low.cond:
            low.pending += 1
            self.pending_key = key
            self.warm = warm
        if not warm and _WORKER_KIND == "process":
            # the worker starts now (seconds: its imports, the CPU's vector ISA checked),
            # while this process imports the tracer and traces
            _PROCESS.start()
        _WORKER.submit(_Job(self, key, copies, marker, warm))


class _Job:
    """One background compile: holds its segment weakly (a dropped executor's compiles
    are skipped) and the copies of its inputs."""

    __slots__ = ("seg", "key", "copies", "marker", "warm")

    def __init__(self, seg, key, copies, marker, warm):
        self.seg, self.key, self.copies, self.marker = weakref.ref(seg), key, copies, marker
        self.warm = warm

    def __call__(self):
        seg = self.seg()
        if seg is None or _EXITING.is_set() or seg.lowering.closed:
            return
        low = seg.lowering
        t0 = time.perf_counter()
        fn = reason = None
        try:
            if not self.warm:  # what the trace imports (a second, for a builder program)
                _imported(compat.preload_tracer)
            with _COMPILE_LOCK, _yielding():
                # a cold compile's trace is paced: the worker is still starting, and the
                # steps run meanwhile; a warm load is not (a step boundary waits for it)
                gm, copies = seg._trace(self.copies, None if self.warm else pacing.Pace(PACE))
                gm = portable(gm)  # the graph every process compiles: one cache key
            self.copies = None  # the trace made its own: one copy of the inputs held, not two
            t1 = time.perf_counter()
            if _WORKER_KIND == "process" and not self.warm:
                # the compile proper in the worker process; here, a load from the cache (if
                # the worker failed, the compile itself: slower, never a failed step).
                # Meanwhile this process readies the load, off the switch's path, as the
                # worker's C++ build starts (seconds before its answer, and long after the
                # first steps): the vector ISA's check (the worker built its test
                # programs: only their loads are left, a subprocess each), then the
                # load's imports (under the interpreter lock)
                _PROCESS.compile(gm, copies, low.split_build,
                                 building=lambda: _imported(lambda: _ready_load(copies)))
            t2 = time.perf_counter()
            if _EXITING.is_set() or low.closed:
                return
            with _COMPILE_LOCK, _yielding():
                fn = seg._compile_traced(gm, copies)
            times = low.times
            times["trace"] += t1 - t0
            times["worker"] += t2 - t1
            times["load"] += time.perf_counter() - t2
        except _Refused as e:
            reason = str(e)
        except (SSAExecError, GuardError) as e:
            reason = f"a check refused its inputs while traced ({_first_line(e)})"
        except Exception as e:  # noqa: BLE001 - any failure of tracing or Inductor
            reason = f"Inductor could not compile it ({type(e).__name__}: {_first_line(e)})"
        self.copies = None
        with low.cond:
            low.compile_s += time.perf_counter() - t0
            if fn is not None:
                seg.graphs[self.key] = fn
                _touch(self.marker)
            seg.pending_key = None
            low.pending -= 1
            low.cond.notify_all()
        if reason is not None and not _EXITING.is_set():  # (modules go away at exit)
            seg.refuse(reason)  # said; the step's code runs in the training thread, not here


def _ready_load(copies):
    """What a load from Inductor's cache of a graph of ``copies`` needs first: the vector
    ISA checked (for CPU tensors), ``compile_fx`` and its modules imported."""
    check_vec_isa(copies)
    compat.require("inductor.compile_fx")


def _imported(imports):
    """``imports()``, its errors ignored: the compile that follows meets them again, and
    says them. Not paced, and at the interpreter's own switch interval: measured on the
    transformer preset, imports paced (``runtime.pacing``) or handed back every
    ``SWITCH_S`` cost the steps more in all (1.6-1.9 s against 1.2-1.5 s)."""
    try:
        imports()
    except Exception:  # noqa: BLE001
        pass


def _cache_dir():
    """Inductor's on-disk cache directory (where its FX graph cache lives), as
    ``torch._inductor.runtime.cache_dir_utils.cache_dir`` says it, without importing
    Inductor: that import (the package's ``__init__``) took 0.8-1.9 s, and this runs in the
    training thread, at the step that submits the compiles."""
    utils = sys.modules.get("torch._inductor.runtime.cache_dir_utils")
    if utils is not None:
        try:
            return utils.cache_dir()
        except Exception:  # noqa: BLE001 - another torch: its documented default below
            pass
    path = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or os.path.join(
        tempfile.gettempdir(), "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", _user()))
    return os.path.abspath(path)


def _user():
    try:
        import getpass
        return getpass.getuser()
    except Exception:  # noqa: BLE001
        getuid = getattr(os, "getuid", None)
        return f"uid_{getuid()}" if callable(getuid) else "unknown_user"


def _describe(value):
    """A description of a generated module's constant that is the same in every process."""
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), str(value.dtype), str(value.device))
    if value is None or isinstance(value, (bool, int, float, str, torch.dtype, torch.device)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return tuple(_describe(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((str(k), _describe(v)) for k, v in value.items()))
    name = getattr(value, "__qualname__", None)
    if name is not None:
        return f"{getattr(value, '__module__', '')}.{name}"
    text = str(value)
    return type(value).__name__ if " at 0x" in text else text


def _marker(seg, key):
    """The path of the segment's warm-cache marker for signature ``key``, or None."""
    try:
        lowered = seg.seg.lowered
        source = re.sub(r"segment_\d+", "segment", lowered.source)
        # the generated code's constants; not ``_step`` (the step counter, a list the
        # runner advances: a marker keyed by it would differ between the step that left
        # it and the step a second run looks for it)
        consts = sorted((k, _describe(v)) for k, v in seg.ns.items()
                        if k.startswith("_") and not k.startswith("__") and k != "_step")
        text = repr((source, consts, key, len(seg.draws), torch.__version__,
                     os.environ.get("SSAEXEC_INDUCTOR_CPP_WRAPPER", "1")))
    except Exception:  # noqa: BLE001 - no marker: the compile is simply not expected warm
        return None
    digest = hashlib.sha256(text.encode()).hexdigest()[:32]
    return os.path.join(_cache_dir(), "ssaexec_tiered", digest)


def _touch(path):
    if path is None:
        return
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w"):
            pass
    except OSError:  # a cache we cannot write: the next run compiles in the background
        pass


@contextlib.contextmanager
def _yielding():
    """While this thread runs Python for seconds (a trace, a load from the cache, Inductor's
    imports), the interpreter hands the lock to the training thread every ``SWITCH_S``
    instead of every 5 ms: the training thread releases the lock at each kernel and, to
    take it back, waits for this thread to be told to let go; at 5 ms a time, its steps
    ran several times slower beside a compile."""
    old = sys.getswitchinterval()
    if old <= SWITCH_S:
        yield
        return
    sys.setswitchinterval(SWITCH_S)
    try:
        yield
    finally:
        if sys.getswitchinterval() == SWITCH_S:  # unless someone else changed it since
            sys.setswitchinterval(old)


class _Agreement:
    """The ranks' agreement on the tier (several processes; see the module docstring): one
    asynchronous all-reduce (a sum) through the executor's collective backend,
    ``ProcessGroupCollective``, of ``[not ready, refused per segment]``."""

    __slots__ = ("collective", "sent", "sums", "snapshot", "device", "count")

    def __init__(self, collective):
        self.collective = collective
        self.sent = None  # the wait of the all-reduce in flight
        self.sums = self.snapshot = None
        # NCCL reduces CUDA tensors only; every other backend (gloo) a CPU tensor
        self.device = (torch.device("cuda", torch.cuda.current_device())
                       if collective.backend == "nccl" else torch.device("cpu"))
        self.count = 0  # agreements sent

    def send(self, ready, refused, snapshot):
        import torch.distributed as dist
        sums = torch.tensor([0 if ready else 1] + [int(r) for r in refused],
                            dtype=torch.int32, device=self.device)
        self.count += 1
        c = self.collective
        self.sent = c.start(f"agreement {self.count} on the tier of compiler='auto'",
                            lambda: dist.all_reduce(sums, op=dist.ReduceOp.SUM, group=c.group,
                                                    async_op=True), sums)
        self.sums, self.snapshot = sums, snapshot

    def read(self):
        """``(every rank ready, refused on some rank per segment, this rank's snapshot)``
        of the agreement in flight (waited for: sent a step ago, it is done, unless a
        peer is behind)."""
        wait, self.sent = self.sent, None
        wait()
        sums = self.sums.tolist()
        snapshot, self.sums, self.snapshot = self.snapshot, None, None
        return sums[0] == 0, [x > 0 for x in sums[1:]], snapshot


def agrees(collective, graph):
    """Whether the tiers of ``graph``'s runner can be agreed across processes over
    ``collective``: None where it runs in one process (nothing to agree), else whether the
    graph holds a cross-process collective (then every rank runs each of its steps)."""
    if getattr(collective, "local_only", True):
        return None
    return bool(graph.collectives)


class TieredRunner(Runner):
    """A ``Runner`` with ``TieredLowering``: each step is timed for the switch's line. Over
    a multi-process collective the ranks agree on the tier (``_Agreement``): the graph
    must hold a cross-process collective (``agrees``).

    A straight-line step with nothing to record or submit (``TieredLowering.plain_ok``)
    runs ``plain``: the compiled path's runner of the same graph (``compiler=None``'s code,
    bit for bit), made at the first such step, sharing this runner's step counter (its
    random ops draw the same), scopes and places' way (``inline``)."""

    def __init__(self, graph, scopes, collective, scheduler, contexts=None, sync="event",
                 run_places=None, notes=None, local_processes=1):
        self._plain = None
        self._made = (contexts, sync)
        super().__init__(graph, scopes, collective, scheduler,
                         TieredLowering(notes, local_processes), contexts, sync, run_places)
        if agrees(collective, graph) is not None:
            self.lowering.agreement = _Agreement(collective)

    @property
    def inline(self):
        return self._inline

    @inline.setter
    def inline(self, value):
        self._inline = value
        if self._plain is not None:
            self._plain.inline = value

    @property
    def plain(self):
        """The compiled path's runner of this graph (made on first use)."""
        if self._plain is None:
            contexts, sync = self._made
            plain = Runner(self.graph, self.scopes, self.collective, self.scheduler,
                           SegmentLowering(), contexts, sync, self.run_places, step=self.step)
            plain.inline = self.inline
            self._plain = plain
        return self._plain

    def bind_scopes(self, scopes):
        super().bind_scopes(scopes)
        if self._plain is not None:
            self._plain.bind_scopes(scopes)

    def run(self, sync=None):
        t0, c0 = time.perf_counter(), time.process_time()
        low = self.lowering
        low.begin_step()  # the switch, an agreement: before the runner is picked
        try:
            if low.tier == "straight" and low.plain_ok():
                low.plain_steps += 1
                fetched = self.plain.run(sync)
            else:
                fetched = super().run(sync)
        except BaseException:
            low.in_step = False  # the step failed: the next one begins again
            raise
        low.end_step(time.perf_counter() - t0, time.process_time() - c0)
        return fetched

    def close(self):
        """The executor closed: its background compiles stop (``TieredLowering.close``)."""
        self.lowering.close()
