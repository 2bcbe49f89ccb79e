"""The out-of-order scheduler: run ops as soon as their inputs are ready.

Policy. A ``DependencyPlan`` is built once per graph: for op ``i``,
``pending[i]`` is the number of distinct ops it waits for and ``succ[i]`` the
ops that wait for it (plain int lists and tuples, no objects on the hot path).
Each run copies ``pending`` and starts the ops with no producers. The thread
that finishes an op decrements its successors' counts under one lock, runs ONE
newly ready op itself (a thread-pool hop costs tens of microseconds in
CPython, a decrement a tenth of one) and queues the rest for the pool,
communication ops first so they start while computation continues. The two
choices are the functions ``comm_first`` (queue order) and ``run_here`` (the op
a thread keeps), with ``default_threads``: the simulator replays steps with
these same functions (``sim.engine``), so a policy changed here changes both.

State invariants of one run (``_Run``): ``inflight`` counts ops that are ready
(queued or running) and not finished; ``remaining`` counts ops not yet run.
The run is over when ``remaining`` hits 0, or when it was stopped (first
error or Ctrl-C) and ``inflight`` hits 0: nothing new starts after a stop,
running ops finish, queued ones are skipped. Queue items carry their run,
so leftovers of a failed run can never execute in the next one. The first
exception is kept and re-raised in the caller; later ones are dropped.

Commit phase and Ctrl-C. A plan may flag ``commit`` ops: the step's commit
phase (in-place updates of persistable state, and everything after them),
whose ops wait for every other op of the step (``graph.commit``). Once a
commit op has started (``committing``), a Ctrl-C no longer stops the run: the
commit completes on every place, so a step is applied everywhere or nowhere.
Ctrl-C reaches the run as a flag (``runtime.interrupt``), read between ops; an
error still stops the run at once, in either phase.

``num_threads=1`` runs everything in the calling thread: a synchronous mode
for debugging. Otherwise the caller is one of the ``num_threads`` workers and
``num_threads - 1`` daemon threads serve the queue until ``close()``.

Turns (``run(inline=True)``, the places rule's way for launch-bound places) run the ops
in the calling thread in stack order, with one exception: an op flagged ``lock_free``
(a compiled graph whose C++ code releases the interpreter lock for most of its call) is
handed to a pool thread when another op is ready for the caller to run meanwhile, and at
most ``cores - 1`` such ops run beside the caller. Everything else, the counts included,
stays in the calling thread: a turn has no lock to take, and no hand-off but the
lock-free op's own (``_run_sync``). The ops run are the same and see the same values;
only which thread runs a lock-free op changes.
"""

import queue
import threading

from ..core.errors import GraphError, SSAExecError
from ..graph.ssa import topo_sort
from . import interrupt

__all__ = ["DependencyPlan", "Scheduler", "comm_first", "default_threads", "run_here"]


# --- the policy (the simulator replays steps with these same functions: sim.engine) -------
def comm_first(ids, is_comm):
    """The order in which ready ops are queued: communication first, so collectives start
    while computation continues; otherwise as given."""
    return tuple(sorted(ids, key=lambda j: not is_comm[j]))


def run_here(ready, is_comm):
    """Of the ops that finishing one op made ready (queue order), the one its thread runs
    itself: the first computation op, else the first; the others go to the pool."""
    for j in ready:
        if not is_comm[j]:
            return j
    return ready[0]


def default_threads(places):
    """Scheduler threads for ``places`` places when the strategy names none: one per
    place and the caller's, at most 8."""
    return min(8, places + 1)


class DependencyPlan:
    """Int-indexed dependency arrays of a DAG of ``n`` ops.

    Parameters
    ----------
    n : int
        Number of ops, numbered 0..n-1.
    producers : list of iterable of int
        ``producers[i]``: ops that must finish before op ``i`` starts.
    is_comm : list of bool, optional
        Communication ops, dispatched ahead of computation.
    commit : list of bool, optional
        Ops of the commit phase (see the module docstring); None: no commit phase.
    """

    __slots__ = ("n", "pending", "succ", "roots", "is_comm", "commit")

    def __init__(self, n, producers, is_comm=None, commit=None):
        self.n = n
        self.is_comm = list(is_comm) if is_comm is not None else [False] * n
        self.commit = tuple(bool(c) for c in commit) if commit is not None and any(commit) \
            else None
        succ = [[] for _ in range(n)]
        pending = [0] * n
        for i, ps in enumerate(producers):
            uniq = set(ps)
            pending[i] = len(uniq)
            for p in uniq:
                if not 0 <= p < n:
                    raise GraphError(f"op {i} depends on unknown op {p}")
                succ[p].append(i)
        # comm successors first, so they are queued ahead of compute ops
        self.succ = tuple(comm_first(s, self.is_comm) for s in succ)
        self.pending = pending
        self.roots = comm_first((i for i in range(n) if pending[i] == 0), self.is_comm)
        self._check_acyclic()

    def _check_acyclic(self):
        seen = len(topo_sort(self.succ, self.pending))
        if seen != self.n:
            raise GraphError(f"dependency cycle: {self.n - seen} ops can never become ready")

    @classmethod
    def from_graph(cls, graph, commit=None):
        """The plan of an ``SSAGraph`` (op ids are handle ids); ``commit``: handle ids
        of the commit phase."""
        flags = None if not commit else [op.id in commit for op in graph.ops]
        return cls(len(graph.ops), [[p.id for p in op.producers()] for op in graph.ops],
                   [op.is_collective for op in graph.ops], flags)


class _Run:
    __slots__ = ("plan", "fns", "counts", "remaining", "inflight", "error", "stopped", "done",
                 "lock", "hold", "committing")

    def __init__(self, plan, fns, hold):
        self.plan = plan
        self.fns = fns
        self.counts = list(plan.pending)
        self.remaining = plan.n
        self.inflight = 0
        self.error = None
        self.stopped = False
        self.done = threading.Event()
        self.lock = threading.Lock()
        self.hold = hold  # runtime.interrupt.Hold of the main thread, or None
        self.committing = False  # a commit op has started: Ctrl-C waits for the end


_STOP = object()
_OFFLOAD = object()  # a queue item (_OFFLOAD, (fn, i, done)): run fn, report to done


class Scheduler:
    """Runs ``DependencyPlan``s on a pool of ``num_threads`` threads (caller included)."""

    def __init__(self, num_threads=1, name="ssaexec"):
        if num_threads < 1:
            raise SSAExecError(f"num_threads must be >= 1, got {num_threads}")
        self.num_threads = int(num_threads)
        self.name = name
        self._queue = queue.SimpleQueue()
        self._workers = []
        self._closed = False
        self._busy = threading.Lock()
        self._beside = None  # lock-free ops that turns run beside the caller at most
        self.handed = 0  # lock-free ops turns have run beside the caller, all runs together
        self.commit_began = False  # the last run started its commit phase

    # --- pool -------------------------------------------------------------------------
    def _ensure_workers(self):
        if self._closed:
            raise SSAExecError("this scheduler is closed")
        while len(self._workers) < self.num_threads - 1:
            t = threading.Thread(target=self._worker_loop,
                                 name=f"{self.name}-worker-{len(self._workers)}", daemon=True)
            t.start()
            self._workers.append(t)

    def _worker_loop(self):
        # torch's intra-op thread count is applied per thread on first use of some
        # kernels; set it here so a fresh worker honours the executor's limit at once
        import torch
        torch.set_num_threads(torch.get_num_threads())
        get = self._queue.get
        while True:
            item = get()
            if item is _STOP:
                return
            run, i = item
            if run is _OFFLOAD:
                fn, j, done = i
                try:
                    fn()
                    done.put((j, None))
                except BaseException as e:  # noqa: B036 - the caller re-raises it
                    done.put((j, e))
                continue
            self._execute(run, i)

    def close(self, timeout=10.0, wait=True):
        """Stop every worker thread and, with ``wait``, join them (idempotent).

        A finalizer passes ``wait=False``: blocking there would hold up the garbage
        collector in whatever thread it runs, and a Ctrl-C arriving meanwhile would be
        raised inside the finalizer, where Python drops it (``runtime.interrupt``).
        """
        if self._closed:
            return
        self._closed = True
        for _ in self._workers:
            self._queue.put(_STOP)
        if wait:
            for t in self._workers:
                t.join(timeout)
        self._workers = []

    @property
    def closed(self):
        return self._closed

    # --- running ----------------------------------------------------------------------
    def run(self, plan, fns, inline=False, lock_free=None):
        """Run every op of ``plan`` (``fns[i]()`` runs op ``i``); re-raise the first error.

        ``inline`` runs this plan in the calling thread only, as ``num_threads=1`` does,
        but for the ops ``lock_free[i]`` flags (turns: the module docstring), which a
        pool of more than one thread may run beside it.
        A Ctrl-C raises ``KeyboardInterrupt`` once the ops running have finished (after
        the whole commit phase, if it had begun).
        """
        if plan.n == 0:
            return
        if len(fns) != plan.n:
            raise SSAExecError(f"plan has {plan.n} ops but {len(fns)} functions were given")
        if not self._busy.acquire(blocking=False):
            raise SSAExecError("this executor is already running (runs cannot overlap; use one "
                               "executor per thread)")
        run = None
        try:
            with interrupt.hold() as hold:
                run = _Run(plan, fns, hold)
                roots = plan.roots
                run.inflight = len(roots)
                if self.num_threads == 1 or inline:
                    self._run_sync(run, lock_free if self.num_threads > 1 and lock_free
                                   is not None and any(lock_free) else None)
                else:
                    self._run_pool(run)
                if run.error is not None:
                    raise run.error
                if hold is not None and hold.pending:
                    hold.completed = True  # the outermost hold raises KeyboardInterrupt
        finally:
            self.commit_began = run is not None and run.committing
            self._busy.release()

    def _run_pool(self, run):
        plan = run.plan
        self._ensure_workers()
        # comm roots go to the pool, the caller takes the first compute root
        inline = run_here(plan.roots, plan.is_comm)
        for r in plan.roots:
            if r != inline:
                self._queue.put((run, r))
        try:
            self._execute(run, inline)
            while not run.done.wait(0.05):
                pass
        except KeyboardInterrupt as e:  # Ctrl-C where it is not held (runtime.interrupt)
            self._stop(run, e)
            while not run.done.wait(0.05):
                pass

    def _stop(self, run, exc):
        with run.lock:
            if run.error is None:
                run.error = exc
            run.stopped = True
            if run.inflight == 0:
                run.done.set()

    def _admit(self, run, i):
        """Whether op ``i`` may start (slow path: a stop, a Ctrl-C or a first commit op).

        Called with ``run.lock`` held, or from the only thread of the run.
        """
        hold = run.hold
        if not run.stopped and hold is not None and hold.pending and not run.committing:
            run.stopped = True
            if run.error is None:
                run.error = KeyboardInterrupt()
        if run.stopped:
            return False
        commit = run.plan.commit
        if commit is not None and commit[i]:
            run.committing = True
        return True

    def _run_sync(self, run, lock_free=None):
        """Run the plan in this thread, in stack order. With ``lock_free`` (turns), a
        flagged op goes to a pool thread when another op is ready for this thread
        meanwhile. The counts and the stack are this thread's alone; a finished lock-free
        op comes back through ``done``, and no op is still running when this returns (the
        first error is kept, the ops running are waited for)."""
        slots = 0  # lock-free ops that may run beside this thread
        if lock_free is not None:
            self._ensure_workers()
            slots = self._beside
            if slots is None:  # a free core each (one at least), and no more than the pool
                from ..core.place import available_cores
                slots = self._beside = max(1, min(self.num_threads - 1,
                                                  available_cores() - 1))
        stack = list(reversed(run.plan.roots))
        succ, counts, fns, commit = run.plan.succ, run.counts, run.fns, run.plan.commit
        hold, done = run.hold, None
        out = 0  # lock-free ops running on the pool
        try:
            while (stack and run.error is None) or out:
                if not stack or run.error is not None:
                    i, e = done.get()
                    out -= 1
                    if e is not None:
                        if run.error is None:
                            run.error = e
                        continue
                    if run.error is not None:
                        continue
                else:
                    i = stack.pop()
                    if (hold is not None and hold.pending) or \
                            (commit is not None and not run.committing and commit[i]):
                        if not self._admit(run, i):
                            stack.clear()
                            continue
                    if out < slots and lock_free[i] and stack:
                        if done is None:
                            done = queue.SimpleQueue()
                        out += 1
                        self.handed += 1
                        self._queue.put((_OFFLOAD, (fns[i], i, done)))
                        continue
                    try:
                        fns[i]()
                    except BaseException as e:  # noqa: B036 - Ctrl-C too must stop the run
                        run.error = e
                        continue
                ready = []
                for j in succ[i]:
                    c = counts[j] - 1
                    counts[j] = c
                    if c == 0:
                        ready.append(j)
                stack.extend(reversed(ready))
        finally:
            while out:  # a KeyboardInterrupt in the wait above: the ops still finish
                done.get()
                out -= 1

    def _execute(self, run, i):
        plan, fns, counts = run.plan, run.fns, run.counts
        succ, is_comm, lock, put = plan.succ, plan.is_comm, run.lock, self._queue.put
        commit, hold = plan.commit, run.hold
        while i is not None:
            if run.stopped or (hold is not None and hold.pending) or \
                    (commit is not None and not run.committing and commit[i]):
                with lock:
                    if not self._admit(run, i):
                        run.inflight -= 1
                        if run.inflight == 0:
                            run.done.set()
                        return
            try:
                fns[i]()
                failed = False
            except BaseException as e:  # noqa: B036 - keep the first error, stop the run
                failed = True
                with lock:
                    if run.error is None:
                        run.error = e
                    run.stopped = True
            ready = None
            with lock:
                run.remaining -= 1
                run.inflight -= 1
                if not failed and not run.stopped:
                    for j in succ[i]:
                        c = counts[j] - 1
                        counts[j] = c
                        if c == 0:
                            if ready is None:
                                ready = [j]
                            else:
                                ready.append(j)
                    if ready:
                        run.inflight += len(ready)
                if run.remaining == 0 or (run.stopped and run.inflight == 0):
                    run.done.set()
            if not ready:
                return
            # run one op here (the policy's choice; one ready op is its only choice) and
            # hand the rest (comm ops first) to the pool
            nxt = ready[0] if len(ready) == 1 else run_here(ready, is_comm)
            for j in ready:
                if j != nxt:
                    put((run, j))
            i = nxt
