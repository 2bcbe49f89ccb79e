"""``Runner``: one step of an SSA graph, as a node graph run by the scheduler.

A runner is composed, not derived. Its parts:

* the **step plan** (``runtime.plan.build_plan``): the node graph, the commit
  phase, the alias plan, the scheduler's dependency plan, the memory and stream
  plans, all decided once from the graph and the lowering's policy: a node per
  handle (``GraphRunner``, the readable path) or segments (``CompiledRunner``);
* the **lowering**, which turns each node into a zero-argument body: a handle's
  own function, or a segment's generated code (``runtime.codegen``). It also
  chooses the memory plan, since what stays in a scope depends on what the
  bodies keep as locals. Swapping the lowering swaps the compiler;
* the **handle calls** (``runtime.handle_calls``): collective issue, fetches and
  the per-handle functions, shared by both lowerings;
* the **memory plan** (``StepPlan.memory_plan``): reference counts that erase a
  value from its place's scope once its last reader has run;
* the **streams** on CUDA places (``runtime.streams``, applying the plan's
  ``stream_plan``);
* the **scheduler**, which runs the plan's ``deps``.

A lowering states its policy in the attributes ``compiled`` (segments or a node
per handle), ``atomic`` and ``keep_fetched``; it has ``prepare(runner)`` ->
``MemoryPlan`` (after which ``segment_body(node)`` and ``handle_body(handle)``
give the bodies), ``begin_step()``, and the attributes ``rebindable`` and ``clones``.

Step. ``run`` resets the per-step state (fetches, reference counts), hands the
collective backend the step's signature, runs the plan, and returns ``{fetch
name: [value per place]}``. Persistables the early phase rebinds (running
statistics, counters) are put back when the step fails; in-place updates run
only once nothing else can fail (``graph.commit``), and an error after the
commit phase began is a ``CommitError``. On CUDA places the run returns once
the fetched values are complete; each device's current stream waits, on the
GPU, for the whole step (``StreamSync.finish``).
"""

from ..core.errors import CommitError, SSAExecError
from .handle_calls import HandleCalls, collective_signature
from .plan import build_plan, processes_of

__all__ = ["Runner"]


class Runner:
    """Run ``graph`` over ``scopes`` (one per place) with ``scheduler`` and ``lowering``.

    ``run_places`` is the block runner control ops get (``parallel_do``;
    ``runtime.op_call``): passed in by whoever makes the runner, which sits above it.
    ``step``: the step counter (a one-item list) to share with another runner of the same
    graph, whose steps this one's continue (``runtime.tiered``); a new one by default.
    """

    def __init__(self, graph, scopes, collective, scheduler, lowering, contexts=None,
                 sync="event", run_places=None, step=None):
        self.graph = graph
        self.scopes = list(scopes)
        self.collective = collective
        self.scheduler = scheduler
        self.run_places = run_places
        self.lowering = lowering
        # steps run so far: random ops seed from it (runtime.rng)
        self.step = [0] if step is None else step
        self.inline = False  # run in the caller's thread only (see ParallelExecutor)
        self.calls = HandleCalls(graph, self.scopes, collective, self.step, run_places)
        keep = {h.var_name for h in graph.fetches} if lowering.keep_fetched else ()
        self.step_plan = build_plan(graph, lowering.compiled, processes_of(collective),
                                    lowering.atomic, keep)
        # the commit phase waits for every other node, on every place (graph.commit)
        self.commit = self.step_plan.commit
        self.node_graph = self.step_plan.nodes
        self.nodes = self.node_graph.nodes
        self.plan = self.step_plan.deps
        self.signature = collective_signature(graph)
        self.streams = None
        if contexts is not None and any(c is not None for c in contexts):
            from .node_graph import node_handle
            from .streams import StreamSync, external_inputs
            devices = [c.device if c is not None else None for c in contexts]
            self.streams = StreamSync(self.node_graph, contexts, sync, handle=node_handle,
                                      external=external_inputs(graph),
                                      plan=self.step_plan.stream_plan(devices))
        self.memory = lowering.prepare(self)
        self.bodies = [n.body(lowering) for n in self.nodes]
        self.fns = [self.memory.wrap(i, self._on_stream(i, body), self.scopes)
                    for i, body in enumerate(self.bodies)]

    # --- views --------------------------------------------------------------------------
    @property
    def ops(self):
        """The node graph's nodes (``StreamSync`` reads them like op handles)."""
        return self.nodes

    @property
    def segments(self):
        return self.node_graph.segments

    @property
    def fetched(self):
        return self.calls.fetched

    @property
    def pending(self):
        return self.calls.pending

    @property
    def clones(self):
        """Copies made for aliasing in the last run (the compiled path)."""
        return self.lowering.clones

    def stream_plan(self, devices=None):
        """The ``StreamPlan`` of the node graph (``runtime.streams``; no GPU needed)."""
        return self.step_plan.stream_plan(devices)

    def _on_stream(self, i, fn):
        return fn if self.streams is None else self.streams.wrap(i, fn, self.scopes)

    def bind_scopes(self, scopes):
        """Run later steps against ``scopes`` (one per place; the code is kept)."""
        if not self.lowering.rebindable:
            raise SSAExecError("this runner binds its scopes when it is made")
        if len(scopes) != len(self.scopes):
            raise ValueError(f"need {len(self.scopes)} scopes, got {len(scopes)}")
        self.scopes[:] = scopes

    # --- running ------------------------------------------------------------------------
    def _lock_free(self):
        """Turns of several places: which nodes' bodies release the interpreter lock this
        step (compiled graphs with the C++ wrapper; ``Scheduler.run``), else None."""
        if not self.inline or len(self.scopes) < 2 or not self.lowering.compiled:
            return None
        return [getattr(getattr(b, "__self__", None), "lock_free", False)
                for b in self.bodies]

    def run(self, sync=None):
        """Run the step once; return {fetch name: [value per place]}.

        ``sync`` ("event" or "wait") switches the CUDA stream synchronisation.
        """
        self.calls.fetched = {}
        self.memory.start()
        self.lowering.begin_step()
        if self.signature:
            self.collective.begin_step(self.signature)
        if self.streams is not None:
            if sync is not None:
                self.streams.sync = sync
            self.streams.start(self.scopes)
        rebound = self.commit.rebound
        saved = [[(n, s.vars.get(n)) for n in rebound] for s in self.scopes] if rebound \
            else None
        try:
            ran = False
            try:
                self.scheduler.run(self.plan, self.fns, self.inline, self._lock_free())
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
        return self.calls.fetched
