"""Whole-step CUDA graphs: capture a runner's step once per feed shape, then replay it.

Policy (``ExecutionStrategy(cuda_graph=True)``; ``ParallelExecutor`` drives it):

* **Where.** Every place is a CUDA place on one device, in one process (several places
  may share the device: their compute, comm and fetch streams, the cross-stream events
  and the in-process all-reduces are all captured). Anything else is refused when the
  executor is made, with the reason (``check_places``).
* **When.** A feed shape (the names, shapes and dtypes of one step's feeds) runs
  ``warmup`` steps normally first (lazy initialisation, allocator warm-up); its next
  step is captured with ``torch.cuda.graph`` on a private memory pool, in the calling
  thread, and replayed at once (capturing records work, it does not do it). Later steps
  of that shape copy their feeds into the captured (static) input tensors and replay.
  At most ``cache`` graphs are kept, the least recently used is dropped.
* **State.** Parameters and optimizer state are updated in place by the optimizer ops,
  so the graph reads and writes their tensors directly. An op that rebinds a persistable
  instead (batch norm's running statistics) writes a temporary during capture, and a
  copy into the persistable's own tensor is captured after the step. Before each replay
  a persistable the user rebound in a place's scope (``scope.set_var``, e.g. a new
  learning rate) is copied into the tensor the graph reads, so schedules keep working.
* **Fetches** come from pinned host buffers the captured step copies into; each replay
  returns copies of them.
* **What cannot be captured** (``capture_problem``): ops that run a sub-block on the
  host's decision (``conditional_block``), random ops that draw from per-step seeds
  (their seed is a host number baked into the graph: every replay would reuse the same
  mask), and anything that fails during capture (a host sync, a data-dependent shape).
  Such a runner warns once, naming the op or the error, and runs its steps normally.
"""

import collections
import warnings

import torch

from ..errors import SSAExecError
from ..graph.ssa import ComputationOpHandle
from ..ops.registry import get_op_def
from .rng import needs_step_seed

__all__ = ["check_places", "capture_problem", "StepGraphs"]


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
    return None


class _Captured:
    __slots__ = ("graph", "static", "fetched", "persist")

    def __init__(self, graph, static, fetched, persist):
        self.graph, self.static, self.fetched, self.persist = graph, static, fetched, persist


class StepGraphs:
    """Captured steps of one runner, keyed by feed shape (see the module docstring)."""

    def __init__(self, runner, persistables, warmup=2, cache=4):
        self.runner = runner
        self.persistables = list(persistables)
        self.warmup = warmup
        self.cache = cache
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
            self._restore_bindings(entry)
        entry.graph.replay()
        for t in {t.device for d in entry.static for t in d.values()}:
            torch.cuda.synchronize(t)
        self.replays += 1
        self.runner.step[0] += 1
        return {name: [t.clone() for t in vals] for name, vals in entry.fetched.items()}

    def _restore_bindings(self, entry):
        # a persistable rebound since the capture (a new learning rate): copy its value
        # into the tensor the graph reads, and bind that tensor again
        for scope, persist in zip(self.runner.scopes, entry.persist, strict=True):
            for name, t in persist.items():
                now = scope.vars.get(name)
                if now is not t and now is not None:
                    t.copy_(now)
                    scope.vars[name] = t

    def _capture(self, per_place, sync):
        runner = self.runner
        scopes = runner.scopes
        static = [{name: scope.vars[name] for name in d} for scope, d in
                  zip(scopes, per_place, strict=True)]
        persist = [{n: scope.vars[n] for n in self.persistables if n in scope.vars}
                   for scope in scopes]
        device = next(t.device for d in static for t in d.values()) if any(static) else \
            torch.device("cuda", torch.cuda.current_device())
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        inline, runner.inline = runner.inline, True
        streams = getattr(runner, "streams", None)
        if streams is not None:
            streams.capturing = True
        try:
            with torch.cuda.graph(graph, stream=stream, capture_error_mode="relaxed"):
                fetched = runner.run(sync)
                # rebinding persistables: copy into their own tensors, inside the graph
                for scope, before in zip(scopes, persist, strict=True):
                    for name, t in before.items():
                        now = scope.vars.get(name)
                        if now is not None and now is not t:
                            t.copy_(now)
                            scope.vars[name] = t
        except Exception as e:  # noqa: BLE001 - any capture failure falls back
            for scope, before in zip(scopes, persist, strict=True):
                scope.vars.update(before)
            self._give_up(f"capturing the step failed ({type(e).__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else ''})")
            return None
        finally:
            runner.inline = inline
            if streams is not None:
                streams.capturing = False
        runner.step[0] -= 1  # capturing recorded the step; the replay runs it
        self.captures += 1
        return _Captured(graph, static, fetched, persist)

    def status(self):
        """``{"captured", "replays", "cached", "fallback"}`` for ``ssaexec stats``/tests."""
        return {"captured": self.captures, "replays": self.replays, "cached": len(self.graphs),
                "fallback": self.fallback}
