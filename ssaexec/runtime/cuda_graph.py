"""Whole-step CUDA graphs: capture a runner's step once per feed shape, then replay it.

Policy (``ExecutionStrategy(cuda_graph=True)``; ``ParallelExecutor`` drives it):

* **Where.** Every place is a CUDA place on one device, in one process (several places
  may share the device: their compute, comm and fetch streams, the cross-stream events
  and the in-process all-reduces are all captured). Anything else is refused when the
  executor is made, with the reason (``check_places``).
* **When.** A feed shape (the names, shapes and dtypes of one step's feeds) runs
  ``warmup`` steps normally first (lazy initialisation, allocator warm-up, the masks of
  fixed-seed dropout); its next step is captured in the calling thread and replayed at
  once (capturing records work, it does not do it). Later steps of that shape copy
  their feeds into the graph's static inputs and replay. At most ``cache`` graphs are
  kept, the least recently used is dropped.
* **Capture** always synchronises streams with events (``sync="wait"`` would block the
  host inside the capture, which CUDA refuses); the events become edges of the graph.
* **Memory.** One side stream and one memory pool serve every graph of a runner: the
  graphs replay one at a time, each finished before the next starts, and none keeps a
  value in the pool from one replay to the next (static inputs and persistables live
  outside it, fetches are copied out after the replay), so a later capture may reuse
  what an earlier graph only needs while it replays.
* **Static inputs are the graph's own.** Each captured feed gets a buffer allocated for
  the graph; replays copy the step's feed into it. A caller's tensor is never bound in
  the graph (a replay's copy would overwrite the caller's device-resident data, or a
  slice of a dataset kept on the GPU).
* **State.** Parameters and optimizer state are updated in place by the optimizer ops,
  so the graph reads and writes their tensors directly. An op that rebinds a persistable
  instead (batch norm's running statistics) writes a temporary during capture, and a
  copy into the persistable's own tensor is captured after the step. The graph holds
  every persistable tensor it reads or writes, so none is freed while it may replay.
  Before each replay, each of them is looked up again (``Scope.find_var``, so values
  shared from another executor's scopes, ``share_vars_from``, count too): one rebound
  since the capture (a new learning rate; the training executor's batch-norm statistics
  seen from an evaluation executor) is copied into the tensor the graph reads, and bound
  to it again where it is bound in the runner's own scope. One that vanished or changed
  shape, dtype or device makes the graph stale: it is dropped and that feed shape warms
  up and is captured again.
* **Fetches** come from pinned host buffers the captured step copies into; each replay
  returns copies of them.
* **What cannot be captured** (``capture_problem``, decided from the graph before any
  capture): ops that run a sub-block on the host's decision (``conditional_block``),
  random ops that draw from per-step seeds (their seed is a host number baked into the
  graph: every replay would reuse the same mask), random initialisers in the step (they
  draw on the host's generator and copy to the device). Anything else that fails during
  capture (a host sync, a data-dependent shape) is caught: the feeds and persistables
  are bound again as before the capture, the runner warns once, naming the op or the
  error, and runs this step and the later ones normally.
* **Seam.** How a step is captured, replayed and waited for is a small object
  (``CudaCapture`` on a GPU); everything else here is plain Python over scopes, so a
  stand-in that records and replays kernels on the CPU drives this same code in tests.
"""

import collections
import warnings

import torch

from ..core import compat
from ..core.errors import SSAExecError
from ..graph.ssa import ComputationOpHandle
from ..ops.registry import get_op_def
from .rng import needs_step_seed

__all__ = ["check_places", "capture_problem", "CudaCapture", "StepGraphs"]


def check_places(places, distributed=False):
    """``SSAExecError`` unless ``places`` can be captured in one CUDA graph."""
    cpu = [str(p) for p in places if not p.is_cuda]
    if cpu:
        raise SSAExecError(f"cuda_graph=True needs CUDA places, got {', '.join(cpu)}: CUDA "
                           "graphs replay GPU work only; run CPU places without it")
    devices = sorted({p.device_index for p in places})
    if len(devices) > 1:
        raise SSAExecError(f"cuda_graph=True needs every place on one GPU; these places use "
                           f"devices {devices} (one graph per device is not supported yet)")
    if distributed:
        raise SSAExecError("cuda_graph=True runs in one process; a multi-process run's "
                           "collectives are not captured")


def capture_problem(graph):
    """``(op handle, reason)`` of the first op that cannot be captured, else None."""
    for h in graph.ops:
        if not isinstance(h, ComputationOpHandle):
            continue
        op_def = get_op_def(h.op.type)
        if op_def.is_control:
            return h, "it runs a sub-block chosen on the host"
        if needs_step_seed(op_def, h.op):
            return h, "it draws random numbers from per-step seeds"
        if op_def.is_random and not any(h.op.input_names()) and op_def.overload is None:
            # uniform_random/gaussian_random (ops.init): a CPU tensor, copied over; an ATen
            # factory draws on the device from its default generator, which a graph registers
            return h, "it draws random numbers on the host every step"
    return None


class CudaCapture:
    """Captures with ``torch.cuda.graph`` on ``device``: one side stream and one memory
    pool for every graph it makes (see the module docstring, Memory).

    ``check_liveness``: each replay first checks that no tensor the graph reads from
    outside it was freed (torch's ``check_input_liveness``; slow, for tests; skipped on a
    torch without it, ``compat.cuda_graph_kwargs``)."""

    __slots__ = ("device", "stream", "pool", "check_liveness")

    def __init__(self, device, check_liveness=False):
        self.device = torch.device(device)
        self.stream = None
        self.pool = None
        self.check_liveness = check_liveness

    def capture(self, step):
        """``(graph, step())`` with ``step``'s GPU work recorded into ``graph``."""
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
            self.stream = torch.cuda.Stream(self.device)
        graph = torch.cuda.CUDAGraph()
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        # the liveness check only when asked and where this torch has it (2.13+: compat)
        with torch.cuda.graph(graph, pool=self.pool, stream=self.stream,
                              capture_error_mode="relaxed",
                              **compat.cuda_graph_kwargs(self.check_liveness)):
            result = step()
        return graph, result

    def synchronize(self):
        """Wait for the replay just launched."""
        torch.cuda.synchronize(self.device)


class _Captured:
    __slots__ = ("graph", "static", "fetched", "held")

    def __init__(self, graph, static, fetched, held):
        self.graph, self.static, self.fetched, self.held = graph, static, fetched, held


class StepGraphs:
    """Captured steps of one runner, keyed by feed shape (see the module docstring).

    ``capture`` is the capture mechanism (``CudaCapture`` on the places' device when
    None): ``capture(step) -> (graph, step())`` with ``graph.replay()``, and
    ``synchronize()``.
    """

    def __init__(self, runner, persistables, warmup=2, cache=4, capture=None):
        self.runner = runner
        used = [set(names) for names in runner.graph.vars]
        # per place, the persistables the step reads or writes: held while a graph may replay
        self.persistables = [[n for n in persistables if n in names] for names in used]
        self.warmup = warmup
        self.cache = cache
        self.capture = capture
        self.graphs = collections.OrderedDict()
        self.seen = collections.Counter()
        self.captures = 0
        self.replays = 0
        problem = capture_problem(runner.graph)
        self.fallback = None
        if problem is not None:
            h, why = problem
            self._give_up(f"op #{h.op_index} '{h.op.type}' cannot be captured: {why}")

    def _give_up(self, reason):
        self.fallback = reason
        warnings.warn(f"cuda_graph: {reason}; this step runs without CUDA graphs",
                      RuntimeWarning, stacklevel=4)

    @staticmethod
    def key(per_place):
        """The feed-shape key of one step's per-place feeds."""
        return tuple((pi, name, tuple(t.shape), t.dtype)
                     for pi, d in enumerate(per_place) for name, t in sorted(d.items()))

    def run(self, per_place, bind, sync=None):
        """Run one step: normally, by capturing, or by replaying.

        ``bind(per_place)`` sets the feeds in the places' scopes (the normal way).
        """
        if self.fallback is not None:
            bind(per_place)
            return self.runner.run(sync)
        key = self.key(per_place)
        entry = self.graphs.get(key)
        if entry is not None and not self._rebind(entry):
            # a tensor the graph reads vanished or changed shape: warm up and capture again
            del self.graphs[key]
            self.seen[key] = 0
            entry = None
        if entry is None:
            bind(per_place)
            self.seen[key] += 1
            if self.seen[key] <= self.warmup:
                return self.runner.run(sync)
            entry = self._capture(per_place, sync)
            if entry is None:
                return self.runner.run(sync)
            self.graphs[key] = entry
            while len(self.graphs) > self.cache:
                self.graphs.popitem(last=False)
        else:
            self.graphs.move_to_end(key)
            for static, d in zip(entry.static, per_place, strict=True):
                for name, t in d.items():
                    static[name].copy_(t, non_blocking=True)
        entry.graph.replay()
        self.capture.synchronize()
        self.replays += 1
        self.runner.step[0] += 1
        return {name: [t.clone() for t in vals] for name, vals in entry.fetched.items()}

    def _rebind(self, entry):
        """Bring every tensor ``entry`` reads up to date with the scopes (module
        docstring, State); False when one can no longer be read through the graph."""
        for scope, held in zip(self.runner.scopes, entry.held, strict=True):
            for name, t in held.items():
                now = scope.find_var(name)
                if now is t:
                    continue
                if now is None or now.shape != t.shape or now.dtype != t.dtype or \
                        now.device != t.device:
                    return False
                t.copy_(now)
                if name in scope.vars:  # another executor's scope (an ancestor) is its own
                    scope.vars[name] = t
        return True

    def _static_inputs(self, per_place):
        # the graph's own buffer for each feed: bind() binds the caller's tensor itself when
        # it is already on the place's device (a replay's copy would then overwrite it)
        static = []
        for scope, d in zip(self.runner.scopes, per_place, strict=True):
            bufs = {}
            for name, fed in d.items():
                t = scope.vars[name]
                if t is fed or t.device == fed.device and \
                        t.untyped_storage().data_ptr() == fed.untyped_storage().data_ptr():
                    t = torch.empty_like(t).copy_(t)
                    scope.vars[name] = t
                bufs[name] = t
            static.append(bufs)
        return static

    def _capture(self, per_place, sync):
        runner = self.runner
        scopes = runner.scopes
        bound = [{name: scope.vars[name] for name in d}
                 for scope, d in zip(scopes, per_place, strict=True)]
        own = [{n: scope.vars[n] for n in names if n in scope.vars}
               for scope, names in zip(scopes, self.persistables, strict=True)]
        for scope in scopes:
            # a persistable the step rebinds but that lives in another executor's scope
            # (share_vars_from): a normal step binds its result here, never there; a copy
            # bound here first gives the graph a tensor of this runner's to copy it into
            for n in runner.commit.rebound:
                if n not in scope.vars and (t := scope.find_var(n)) is not None:
                    scope.vars[n] = t.clone()
        if self.capture is None:
            self.capture = CudaCapture(runner.graph.places[0].device)
        static = self._static_inputs(per_place)
        held = [{n: t for n in names if (t := scope.find_var(n)) is not None}
                for scope, names in zip(scopes, self.persistables, strict=True)]
        inline, runner.inline = runner.inline, True
        streams = getattr(runner, "streams", None)
        if streams is not None:
            streams.capturing, synced = True, streams.sync

        def step():
            fetched = runner.run("event")  # "wait" blocks the host: not allowed in a capture
            # rebinding persistables: copy into the tensors the graph holds, inside the graph
            for scope, before in zip(scopes, held, strict=True):
                for name, t in before.items():
                    now = scope.find_var(name)
                    if now is not None and now is not t:
                        t.copy_(now)
                        if name in scope.vars:
                            scope.vars[name] = t
            return fetched
        try:
            graph, fetched = self.capture.capture(step)
        except Exception as e:  # noqa: BLE001 - any capture failure falls back
            # nothing ran: bind the feeds and persistables as before, for the normal run
            for scope, before, feeds in zip(scopes, own, bound, strict=True):
                scope.vars.update(before)
                scope.vars.update(feeds)
            self._give_up(f"capturing the step failed ({type(e).__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else ''})")
            return None
        finally:
            runner.inline = inline
            if streams is not None:
                streams.capturing, streams.sync = False, synced
        runner.step[0] -= 1  # capturing recorded the step; the replay runs it
        self.captures += 1
        return _Captured(graph, static, fetched, held)

    def status(self):
        """``{"captured", "replays", "cached", "fallback"}`` for ``ssaexec stats``/tests."""
        return {"captured": self.captures, "replays": self.replays, "cached": len(self.graphs),
                "fallback": self.fallback}
