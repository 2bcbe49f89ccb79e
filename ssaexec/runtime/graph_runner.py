"""``GraphRunner``: binds an SSA graph's handles to scopes and runs it with the scheduler.

It compiles every op handle once into a zero-argument function (a
``ComputationOpHandle`` becomes an ``OpCall`` bound to its place's scope; the
collectives call the collective backend on the places' tensors), and computes
the memory plan: the latest version of every non-persistable var is erased
from its place's scope as soon as its last reader has run (reference counts
from the graph), or right after it is written when nobody reads it. Only the
latest version is ever erased: an earlier version's name is already bound to
its successor.

Collectives. The backend (``LocalCollective``, or ``ProcessGroupCollective``
in a multi-process run) gets each op's name as ``label`` for its errors, and
``begin_step(signature)`` before every run whose graph has collectives: the
signature lists each collective in chain order as ``(seq, kind, var names,
declared shapes, dtypes)``, which the debug mode of a multi-process run
compares across ranks.

CUDA. Given device contexts, every handle runs on its streams
(``runtime.streams``): waits on cross-stream producers before, an event and
``record_stream`` after. A fetch enters the fetch stream of every device it
reads, so each place's copy into pinned host memory waits for its producer;
``run`` returns when the fetch copies are complete (every stream is idle under
``sync="wait"``), with each device's current stream ordered after the step.
"""

import functools
import threading

import torch

from ..errors import CommitError, OpError, SSAExecError
from ..dtypes import torch_dtype
from ..graph.commit import commit_plan
from ..graph.ssa import (AllReduceOpHandle, AllReduceWaitOpHandle, CollectiveOpHandle,
                         ComputationOpHandle, FetchOpHandle, ScaleLossGradOpHandle)
from .op_call import OpCall
from .scheduler import DependencyPlan

__all__ = ["GraphRunner", "handle_fn"]


class GraphRunner:
    """Run ``graph`` over ``scopes`` (one per place) with ``scheduler``.

    ``run_places`` is the block runner control ops get (``parallel_do``;
    ``runtime.op_call``): passed in by whoever makes the runner, which sits above it.
    """

    def __init__(self, graph, scopes, collective, scheduler, contexts=None, sync="event",
                 run_places=None):
        self.graph = graph
        self.run_places = run_places
        self.scopes = scopes
        self.collective = collective
        self.scheduler = scheduler
        # CUDA places: every op launches on its stream, cross-stream edges synchronise
        self.streams = None
        if contexts is not None and any(c is not None for c in contexts):
            from .streams import StreamSync, external_inputs
            self.streams = StreamSync(graph, contexts, sync, external=external_inputs(graph))
        # the commit phase waits for every other handle, on every place (graph.commit)
        self.commit = commit_plan(graph)
        self.plan = DependencyPlan(len(graph.ops),
                                   [[p.id for p in self.commit.producers(op)] for op in graph.ops],
                                   [op.is_collective for op in graph.ops],
                                   [op.id in self.commit.late for op in graph.ops])
        self.fetched = {}
        self.pending = {}  # started asynchronous all-reduces: id -> function completing it
        self.step = [0]  # steps run so far: random ops seed from it (runtime.rng)
        self.inline = False  # run in the caller's thread only (see ParallelExecutor)
        self._lock = threading.Lock()
        self._refs = []
        self._ref0, reader_slots, free_after, self._slots = self._memory_plan()
        self.signature = self._collective_signature()
        self.fns = [self._with_frees(self._on_stream(op.id, self._compile(op)),
                                     reader_slots[op.id], free_after[op.id])
                    for op in graph.ops]

    def stream_plan(self, devices=None):
        """The ``StreamPlan`` of the graph's handles (``runtime.streams``; no GPU needed)."""
        from .streams import plan_streams
        return plan_streams(self.graph.ops, devices)

    def _on_stream(self, i, fn):
        return fn if self.streams is None else self.streams.wrap(i, fn, self.scopes)

    # --- memory plan --------------------------------------------------------------------
    def _memory_plan(self):
        block = self.graph.program.global_block()
        n = len(self.graph.ops)
        reader_slots = [[] for _ in range(n)]
        free_after = [[] for _ in range(n)]
        ref0, slots = [], []
        for pi, names in enumerate(self.graph.vars):
            for name, versions in names.items():
                var = block.find_var(name)
                if var is None or var.persistable:
                    continue
                last = versions[-1]
                if not last.pending_ops:
                    if last.generated_op is not None:
                        free_after[last.generated_op.id].append((pi, name))
                    continue
                k = len(ref0)
                ref0.append(len(last.pending_ops))
                slots.append((pi, name))
                for r in last.pending_ops:
                    reader_slots[r.id].append(k)
        return ref0, [tuple(x) for x in reader_slots], [tuple(x) for x in free_after], slots

    def _with_frees(self, fn, reads, unread):
        if not reads and not unread:
            return fn
        scopes, slots, lock = self.scopes, self._slots, self._lock

        def run_and_free():
            fn()
            dead = list(unread)
            if reads:
                with lock:
                    refs = self._refs
                    for k in reads:
                        c = refs[k] - 1
                        refs[k] = c
                        if c == 0:
                            dead.append(slots[k])
            for pi, name in dead:
                scopes[pi].erase(name)
        return run_and_free

    def _collective_signature(self):
        block = self.graph.program.global_block()
        out = []
        for op in self.graph.collectives:
            vars_ = [block.find_var(n) for n in op.var_names]
            out.append((op.seq, op.kind, tuple(op.var_names),
                        tuple(tuple(v.shape) if v is not None and v.shape is not None else None
                              for v in vars_),
                        tuple(v.dtype if v is not None else None for v in vars_)))
        return out

    # --- handle kinds (dispatched on the handle class: _compile below) ------------------
    def _compile(self, op):
        return handle_fn(op, self)

    def _compute_fn(self, op):
        call = OpCall(op.op, op.op_index, self.graph.program, op.place.device, self.run_places)
        scope, place, pi, step = self.scopes[op.place_idx], op.place, op.place_idx, self.step
        return lambda: call.run(scope, place, step[0], pi)

    def _scale_loss_grad_fn(self, op):
        scope, name = self.scopes[op.place_idx], op.var_name
        shape, dtype, coeff = list(op.shape), torch_dtype(op.dtype), op.coeff
        device = op.place.device
        return lambda: scope.set_var(name, torch.full(shape, coeff, dtype=dtype, device=device))

    def _tensors(self, name, place_ids, op):
        out = []
        for pi in place_ids:
            t = self.scopes[pi].find_var(name)
            if t is None:
                raise OpError(f"While executing {op.name}: var {name!r} has no value on "
                              f"{self.graph.places[pi]}", op.kind, self.graph.places[pi])
            out.append(t)
        return out

    def _collective_fn(self, op):
        everyone = list(range(len(self.graph.places)))
        coll = self.collective
        is_all_reduce = isinstance(op, AllReduceOpHandle)
        fused = is_all_reduce and len(op.var_names) > 1
        split = is_all_reduce and op.wait is not None
        label = op.name

        def run():
            try:
                if fused:
                    finish = self._fused_all_reduce(op, everyone)
                elif is_all_reduce:
                    parts = [op.apply_start(coll, self._tensors(name, everyone, op), label)
                             for name in op.var_names]

                    def finish():
                        for f in parts:
                            f()
                else:
                    for name in op.var_names:
                        op.apply(coll, self._tensors(name, everyone, op), label)
                    return
                if split:
                    self.pending[op.id] = finish  # AllReduceWaitOpHandle completes it
                else:
                    finish()
            except SSAExecError:
                raise  # DistributedError too: a peer's failure must surface as itself
            except Exception as e:
                raise OpError(f"While executing {op.name}: {type(e).__name__}: {e}",
                              op.kind) from e
        return run

    def _wait_fn(self, op):
        def run():
            finish = self.pending.pop(op.start.id, None)
            if finish is None:
                raise SSAExecError(f"{op.name}: its all-reduce was not started")
            finish()
        return run

    def _fused_all_reduce(self, op, everyone):
        # one flat buffer per place, one collective, then copy the slices back
        per_name = [self._tensors(name, everyone, op) for name in op.var_names]
        flats = [torch.cat([ts[pi].reshape(-1) for ts in per_name]) for pi in everyone]
        started = op.apply_start(self.collective, flats, op.name)

        def finish():
            started()
            self._unflatten(per_name, flats, everyone)
        return finish

    @staticmethod
    def _unflatten(per_name, flats, everyone):
        for pi in everyone:
            offset = 0
            for ts in per_name:
                t = ts[pi]
                k = t.numel()
                t.copy_(flats[pi][offset:offset + k].view_as(t))
                offset += k

    def _fetch_fn(self, op):
        name = op.var_name
        n = len(self.graph.places)

        def run():
            vals = []
            for pi in range(n):
                t = self.scopes[pi].find_var(name)
                if t is None:
                    raise OpError(f"While executing {op.name}: var {name!r} has no value on "
                                  f"{self.graph.places[pi]}", "fetch", self.graph.places[pi])
                # a snapshot: later ops and runs update parameters in place
                if t.is_cuda:
                    # pinned host memory, copied on the current stream of t's device: the
                    # fetch stream this handle entered there (StreamSync.wrap), which waited
                    # for t's producer; run() waits for the fetch's event
                    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                    vals.append(host.copy_(t.detach(), non_blocking=True))
                else:
                    vals.append(t.detach().to("cpu", copy=True))
            self.fetched[name] = vals
        return run

    # --- running ------------------------------------------------------------------------
    def run(self, sync=None):
        """Run the graph once; return {fetch name: [value per place]}.

        ``sync`` ("event" or "wait") switches the CUDA stream synchronisation.
        On CUDA places the run returns once the fetched values are complete; the
        devices' current streams wait (on the GPU) for the whole step, so the
        caller's work on them sees its results (``StreamSync.finish``).
        """
        self.fetched = {}
        self._refs = list(self._ref0)
        if self.signature:
            self.collective.begin_step(self.signature)
        if self.streams is not None:
            if sync is not None:
                self.streams.sync = sync
            self.streams.start(self.scopes)
        # persistables the early phase rebinds (running statistics, counters) are put
        # back if the step fails; in-place updates run only once nothing else can fail
        rebound = self.commit.rebound
        saved = [[(n, s.vars.get(n)) for n in rebound] for s in self.scopes] if rebound \
            else None
        try:
            ran = False
            try:
                self.scheduler.run(self.plan, self.fns, self.inline)
                ran = True
            finally:
                if self.streams is not None:
                    self.streams.finish(failed=not ran)
        except BaseException as e:
            if saved is not None:
                for scope, binding in zip(self.scopes, saved, strict=True):
                    for n, t in binding:
                        if t is None:
                            scope.vars.pop(n, None)
                        else:
                            scope.vars[n] = t
            if self.scheduler.commit_began and isinstance(e, Exception) and \
                    not isinstance(e, CommitError):
                raise CommitError.of(e) from e
            raise
        self.step[0] += 1  # a failed step draws the same masks when it is run again
        return self.fetched


@functools.singledispatch
def handle_fn(op, runner):
    """A zero-argument function that runs handle ``op`` for ``runner`` (by handle class).

    A new handle kind registers here: ``@handle_fn.register`` on a function taking
    ``(op: NewOpHandle, runner)``.
    """
    raise SSAExecError(f"no runner for op handle kind {op.kind!r}")


handle_fn.register(ComputationOpHandle, lambda op, runner: runner._compute_fn(op))
handle_fn.register(ScaleLossGradOpHandle, lambda op, runner: runner._scale_loss_grad_fn(op))
handle_fn.register(FetchOpHandle, lambda op, runner: runner._fetch_fn(op))
handle_fn.register(CollectiveOpHandle, lambda op, runner: runner._collective_fn(op))
handle_fn.register(AllReduceWaitOpHandle, lambda op, runner: runner._wait_fn(op))
