"""The out-of-order scheduler: run ops as soon as their inputs are ready.

Policy. A ``DependencyPlan`` is built once per graph: for op ``i``,
``pending[i]`` is the number of distinct ops it waits for and ``succ[i]`` the
ops that wait for it (plain int lists and tuples, no objects on the hot path).
Each run copies ``pending`` and starts the ops with no producers. The thread
that finishes an op decrements its successors' counts under one lock, runs ONE
newly ready op itself (a thread-pool hop costs tens of microseconds in
CPython, a decrement a tenth of one) and queues the rest for the pool,
communication ops first so they start while computation continues.

State invariants of one run (``_Run``): ``inflight`` counts ops that are ready
(queued or running) and not finished; ``remaining`` counts ops not yet run.
The run is over when ``remaining`` hits 0, or when it was stopped (first
error or Ctrl-C) and ``inflight`` hits 0: nothing new starts after a stop,
running ops finish, queued ones are skipped. Queue items carry their run,
so leftovers of a failed run can never execute in the next one. The first
exception is kept and re-raised in the caller; later ones are dropped.

``num_threads=1`` runs everything in the calling thread: a synchronous mode
for debugging. Otherwise the caller is one of the ``num_threads`` workers and
``num_threads - 1`` daemon threads serve the queue until ``close()``.
"""

import queue
import threading

from ..errors import GraphError, SSAExecError

__all__ = ["DependencyPlan", "Scheduler"]


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
    """

    __slots__ = ("n", "pending", "succ", "roots", "is_comm")

    def __init__(self, n, producers, is_comm=None):
        self.n = n
        self.is_comm = list(is_comm) if is_comm is not None else [False] * n
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
        self.succ = tuple(tuple(sorted(s, key=lambda j: not self.is_comm[j])) for s in succ)
        self.pending = pending
        self.roots = tuple(sorted((i for i in range(n) if pending[i] == 0),
                                  key=lambda j: not self.is_comm[j]))
        self._check_acyclic()

    def _check_acyclic(self):
        counts = list(self.pending)
        stack = list(self.roots)
        seen = 0
        while stack:
            i = stack.pop()
            seen += 1
            for j in self.succ[i]:
                counts[j] -= 1
                if counts[j] == 0:
                    stack.append(j)
        if seen != self.n:
            raise GraphError(f"dependency cycle: {self.n - seen} ops can never become ready")

    @classmethod
    def from_graph(cls, graph):
        """The plan of an ``SSAGraph`` (op ids are handle ids)."""
        return cls(len(graph.ops), [[p.id for p in op.producers()] for op in graph.ops],
                   [op.is_collective for op in graph.ops])


class _Run:
    __slots__ = ("plan", "fns", "counts", "remaining", "inflight", "error", "stopped", "done",
                 "lock")

    def __init__(self, plan, fns):
        self.plan = plan
        self.fns = fns
        self.counts = list(plan.pending)
        self.remaining = plan.n
        self.inflight = 0
        self.error = None
        self.stopped = False
        self.done = threading.Event()
        self.lock = threading.Lock()


_STOP = object()


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
            self._execute(run, i)

    def close(self, timeout=10.0):
        """Stop and join every worker thread (idempotent)."""
        if self._closed:
            return
        self._closed = True
        for _ in self._workers:
            self._queue.put(_STOP)
        for t in self._workers:
            t.join(timeout)
        self._workers = []

    @property
    def closed(self):
        return self._closed

    # --- running ----------------------------------------------------------------------
    def run(self, plan, fns, inline=False):
        """Run every op of ``plan`` (``fns[i]()`` runs op ``i``); re-raise the first error.

        ``inline`` runs this plan in the calling thread only, as ``num_threads=1`` does.
        """
        if plan.n == 0:
            return
        if len(fns) != plan.n:
            raise SSAExecError(f"plan has {plan.n} ops but {len(fns)} functions were given")
        if not self._busy.acquire(blocking=False):
            raise SSAExecError("this executor is already running (runs cannot overlap; use one "
                               "executor per thread)")
        try:
            run = _Run(plan, fns)
            roots = plan.roots
            run.inflight = len(roots)
            if self.num_threads == 1 or inline:
                self._run_sync(run)
            else:
                self._ensure_workers()
                # comm roots go to the pool, the caller takes the first compute root
                inline = next((r for r in roots if not plan.is_comm[r]), roots[0])
                for r in roots:
                    if r != inline:
                        self._queue.put((run, r))
                try:
                    self._execute(run, inline)
                    while not run.done.wait(0.05):
                        pass
                except KeyboardInterrupt as e:
                    self._stop(run, e)
                    while not run.done.wait(0.05):
                        pass
            if run.error is not None:
                raise run.error
        finally:
            self._busy.release()

    def _stop(self, run, exc):
        with run.lock:
            if run.error is None:
                run.error = exc
            run.stopped = True
            if run.inflight == 0:
                run.done.set()

    def _run_sync(self, run):
        stack = list(reversed(run.plan.roots))
        succ, counts, fns = run.plan.succ, run.counts, run.fns
        while stack:
            i = stack.pop()
            try:
                fns[i]()
            except BaseException as e:  # noqa: B036 - Ctrl-C too must stop the run cleanly
                run.error = e
                return
            ready = []
            for j in succ[i]:
                c = counts[j] - 1
                counts[j] = c
                if c == 0:
                    ready.append(j)
            stack.extend(reversed(ready))

    def _execute(self, run, i):
        plan, fns, counts = run.plan, run.fns, run.counts
        succ, is_comm, lock, put = plan.succ, plan.is_comm, run.lock, self._queue.put
        while i is not None:
            if run.stopped:
                with lock:
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
            # run one compute op here; hand the rest (comm ops first) to the pool
            nxt = ready[0]
            for j in ready:
                if not is_comm[j]:
                    nxt = j
                    break
            for j in ready:
                if j != nxt:
                    put((run, j))
            i = nxt
