"""``CompiledRunner``: an SSA graph lowered once into segments, run many times.

The readable ``GraphRunner`` schedules every op handle on its own: a queue
hand-off, a lock and a closure per op, ~25 µs of host time where the kernel
takes a few. A graph executor knows the whole step ahead, so this runner
spends that knowledge once, when the graph is built:

1. ``graph.aliasing`` decides which results need a copy and adds the edges that
   keep in-place writers (optimizers, collectives) after every reader of an
   aliased version.
2. **Segments.** Each place's handles, in one topological order of the whole
   graph, are cut into maximal runs that no collective interrupts: a run ends
   after a handle some collective waits for and a new one starts before a
   handle that waits for a collective the run does not already follow, except
   that a place's optimizer updates stay one run waiting for all their
   collectives (so they fuse, as ``torch.optim`` steps after the backward pass).
   A collective of one place in one process does nothing and cuts nothing, so a
   one-place step is one segment. Every external edge then enters a segment at
   its start and leaves at its end, so the graph of segments, collectives and
   fetches (the *nodes*) is acyclic whenever the SSA graph is.
3. Each segment is lowered to straight-line Python (``runtime.codegen``);
   collectives and fetches keep their functions from ``GraphRunner``.
4. The scheduler runs the node graph: one place runs inline in the caller's
   thread with no hand-off; several places run their segments side by side.

Values crossing nodes live in the places' scopes (a version is stored only
when another node reads it, or when it is a persistable's final value);
everything else is a local of its segment. A scope entry is erased when the
last node that reads it has run, unless that node stored a newer version of
the same name (``_memory_plan``).

CUDA. Segments run on their place's compute stream, entered once per segment;
cross-stream events are recorded only on node edges that cross streams
(``StreamSync`` applied to the node graph). The stream policy is the readable
path's, decided by the SSA handle behind each node (``node_handle``): a wrapped
collective or fetch enters the streams its handle would.
"""

import threading

from ..graph.aliasing import plan_aliasing
from ..graph.commit import commit_plan
from ..graph.ssa import ComputationOpHandle
from .codegen import CloneCounter, lower_segment
from .graph_runner import GraphRunner
from .scheduler import DependencyPlan

__all__ = ["CompiledRunner", "Segment", "partition", "compile_summary", "node_handle"]


class _NodeVar:
    """A var crossing an edge of the node graph (duck-types ``VarHandle`` for streams)."""

    __slots__ = ("name", "place_idx", "generated_op", "is_dummy")

    def __init__(self, name, place_idx, generated_op, is_dummy=False):
        self.name, self.place_idx = name, place_idx
        self.generated_op, self.is_dummy = generated_op, is_dummy


class Segment:
    """A run of one place's handles lowered to one generated function."""

    __slots__ = ("id", "place_idx", "place", "handles", "inputs", "outputs", "_producers",
                 "lowered", "after_collectives", "commit")
    kind = "segment"
    stream = "compute"
    is_collective = False
    on_one_place = True

    def __init__(self, place_idx, place):
        self.id = -1
        self.place_idx, self.place = place_idx, place
        self.handles = []
        self.inputs, self.outputs = [], []
        self._producers = []
        self.lowered = None
        self.after_collectives = set()  # ids of the collectives the segment's start follows
        self.commit = False  # in the step's commit phase (graph.commit): runs last

    def producers(self):
        return self._producers

    @property
    def name(self):
        first = self.handles[0].name if self.handles else "-"
        return f"segment({len(self.handles)} ops from {first})"


class _Wrapped:
    """A collective or fetch handle as a node of the node graph."""

    place_idx = None  # spans places
    __slots__ = ("id", "handle", "inputs", "outputs", "_producers", "commit")

    def __init__(self, handle, commit=False):
        self.id = -1
        self.handle = handle
        self.inputs, self.outputs = [], []
        self._producers = []
        self.commit = commit  # in the step's commit phase (graph.commit)

    @property
    def kind(self):
        return self.handle.kind

    @property
    def stream(self):
        return self.handle.stream

    @property
    def is_collective(self):
        return self.handle.is_collective

    @property
    def name(self):
        return self.handle.name

    def producers(self):
        return self._producers


def partition(graph, noop_collectives, atomic=False, plan=None):
    """Cut ``graph`` into nodes (see the module docstring).

    Each place runs its early handles before its commit phase (``graph.commit``),
    which forms commit segments; with ``atomic``, those wait for every other node
    of the step, on every place.

    ``plan``: the graph's ``CommitPlan`` if the caller has it.

    Returns
    -------
    (list of nodes, dict id(handle) -> node)
    """
    late = (plan or commit_plan(graph)).late
    order = _program_order(graph, late)
    multi = set()
    for h in graph.ops:
        # handles spanning places are nodes of their own (but one place's no-op collectives)
        if not h.on_one_place and not (h.is_collective and noop_collectives):
            multi.add(h.id)
    feeds_multi = set()
    for h in graph.ops:
        if h.id in multi and h.stream != "fetch":  # fetches wait at the end: they cut nothing
            for p in h.producers():
                feeds_multi.add(p.id)
    nodes, node_of = [], {}
    current = {}  # place index -> open Segment
    updates_only = {}  # place index -> its open segment holds optimizer updates alone
    for h in order:
        if h.id in multi:
            node = _Wrapped(h, atomic and h.id in late)
            nodes.append(node)
            node_of[h.id] = node
            continue
        pi = h.place_idx if h.on_one_place else \
            next(v.place_idx for v in h.inputs + h.outputs if not v.is_dummy)
        needs = {p.id for p in h.producers() if p.id in multi}
        commit = atomic and h.id in late
        seg = current.get(pi)
        updating = h.section() == "optimize"
        if seg is not None and seg.commit == commit and not needs <= seg.after_collectives \
                and updating and updates_only[pi]:
            # a place's updates form one run that waits for all their collectives, as
            # torch.optim's step after the backward pass: then they fuse into
            # torch._foreach_* calls instead of one segment (and launch) each
            seg.after_collectives |= needs
        elif seg is None or not needs <= seg.after_collectives or seg.commit != commit:
            seg = Segment(pi, graph.places[pi])
            seg.after_collectives = needs
            seg.commit = commit
            nodes.append(seg)
            current[pi] = seg
            updates_only[pi] = True
        updates_only[pi] = updates_only[pi] and updating
        seg.handles.append(h)
        node_of[h.id] = seg
        if h.id in feeds_multi:
            current[pi] = None  # a collective waits for this handle: end the run here
    for k, node in enumerate(nodes):
        node.id = k
    # node edges: every handle edge between different nodes, and a chain per place
    last_seg = {}
    for node in nodes:
        preds = {}
        handles = node.handles if isinstance(node, Segment) else [node.handle]
        for h in handles:
            for v in h.inputs:
                g = v.generated_op
                if g is None:
                    continue
                src = node_of[g.id]
                if src is node:
                    continue
                preds.setdefault(src.id, src)
                node.inputs.append(_NodeVar(v.name, getattr(v, "place_idx", None), src,
                                            v.is_dummy))
        if isinstance(node, Segment):
            prev = last_seg.get(node.place_idx)
            if prev is not None and prev.id not in preds:
                preds[prev.id] = prev
                node.inputs.append(_NodeVar("chain", node.place_idx, prev, True))
            last_seg[node.place_idx] = node
        node._producers = list(preds.values())
    if atomic:
        _commit_barrier(nodes)
    for node in nodes:
        for p in node._producers:
            p.outputs.append(_NodeVar("edge", None, p, True))
    return nodes, node_of


def _commit_barrier(nodes):
    # the commit phase is closed downstream (graph.commit), so its nodes are exactly the
    # ``commit`` ones; each of its first nodes waits for every other node of the step
    early = [n for n in nodes if not n.commit]
    for n in nodes:
        if n.commit and not any(p.commit for p in n._producers):
            have = {p.id for p in n._producers}
            for e in early:
                if e.id not in have:
                    n._producers.append(e)
                    n.inputs.append(_NodeVar("commit", n.place_idx, e, True))


def compile_summary(graph, local_only=True):
    """What the compiled path makes of ``graph`` (``ssaexec stats``), without running it.

    Adds the alias edges to ``graph``. ``alias_copies`` counts the versions the
    alias plan copies each step (an upper bound: a may-alias result that does not
    share storage at run time is not copied).
    """
    from ..ops.registry import get_op_def
    alias = plan_aliasing(graph)
    nodes, _ = partition(graph, local_only and len(graph.places) == 1)
    segments = [n for n in nodes if isinstance(n, Segment)]
    views = sum(1 for h in graph.ops if isinstance(h, ComputationOpHandle)
                and get_op_def(h.op.type).may_alias
                for v in h.outputs if not v.is_dummy)
    return {"segments": len(segments), "nodes": len(nodes),
            "ops_per_segment": max((len(n.handles) for n in segments), default=0),
            "may_alias_results": views, "alias_copies": len(alias.copy),
            "alias_edges": alias.edges}


def _program_order(graph, late=()):
    """A topological order that follows program order (handle ids) wherever it can,
    with every handle of ``late`` (the commit phase) after all the others.

    Handles are made in program order, so each place then runs its ops as the
    sequential executor would: the optimizer updates stay together at the end,
    where they can be fused.
    """
    import heapq
    indeg = [0] * len(graph.ops)
    succ = [[] for _ in graph.ops]
    for op in graph.ops:
        ps = op.producers()
        indeg[op.id] = len(ps)
        for p in ps:
            succ[p.id].append(op.id)
    ready = [(i in late, i) for i, d in enumerate(indeg) if d == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        _, i = heapq.heappop(ready)
        order.append(graph.ops[i])
        for j in succ[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                heapq.heappush(ready, (j in late, j))
    if len(order) != len(graph.ops):
        graph.topological_order()  # raises GraphError naming the cycle
    return order


class _SegmentPlan:
    """What the code generator of one segment must store, copy and bind, and the block
    runner its control ops get."""

    __slots__ = ("export", "copy", "needed", "step", "place_idx", "run_places")

    def __init__(self, export, copy, needed, step, place_idx, run_places):
        self.export, self.copy, self.needed = export, copy, needed
        self.step, self.place_idx = step, place_idx
        self.run_places = run_places


class CompiledRunner(GraphRunner):
    """Run ``graph`` over ``scopes`` with prepared calls (see the module docstring).

    Same interface as ``GraphRunner``: ``run(sync)`` returns ``{fetch name:
    [value per place]}``. ``clones`` counts the copies made for aliasing in the
    last run; ``segments`` lists the generated functions. ``run_places``: the
    block runner of control ops, as for ``GraphRunner``.
    """

    def __init__(self, graph, scopes, collective, scheduler, contexts=None, sync="event",
                 keep_fetched=False, run_places=None):
        # GraphRunner.__init__ is not called: only its collective and fetch functions are used
        self.graph = graph
        self.run_places = run_places
        # the sequential Executor leaves fetched vars in its scope, as it always did
        self._keep = {h.var_name for h in graph.fetches} if keep_fetched else set()
        self.scopes = scopes
        self.collective = collective
        self.scheduler = scheduler
        self.fetched = {}
        self.pending = {}  # started asynchronous all-reduces (GraphRunner._collective_fn)
        self._lock = threading.Lock()
        self._refs = []
        self.counter = CloneCounter()
        self.step = [0]  # steps run so far: random ops seed from it (runtime.rng)
        self.inline = False  # run in the caller's thread only (see ParallelExecutor)
        self.alias = plan_aliasing(graph, self._keep)
        noop = len(graph.places) == 1 and getattr(collective, "local_only", False)
        # several places: a step commits its updates on every place or on none
        self.atomic = not noop
        self.commit = commit_plan(graph)
        self.nodes, node_of = partition(graph, noop, self.atomic, self.commit)
        self.segments = [n for n in self.nodes if isinstance(n, Segment)]
        self.streams = None
        if contexts is not None and any(c is not None for c in contexts):
            from .streams import StreamSync, external_inputs
            self.streams = StreamSync(self, contexts, sync, handle=node_handle,
                                      external=external_inputs(graph))
        self.plan = DependencyPlan(len(self.nodes), [[p.id for p in n.producers()]
                                                     for n in self.nodes],
                                   [not isinstance(n, Segment) and n.is_collective
                                    for n in self.nodes],
                                   [n.commit for n in self.nodes])
        self.signature = self._collective_signature()
        export, reads = self._memory_plan(node_of)
        needed = {id(v) for names in graph.vars for vs in names.values() for v in vs
                  if v.pending_ops}
        self.scopes = list(scopes)
        for seg in self.segments:
            plan = _SegmentPlan(export, self.alias.copy, needed, self.step, seg.place_idx,
                                run_places)
            seg.lowered = lower_segment(seg.handles, seg.place, self._scope_of(seg.place_idx),
                                        plan, self.counter, graph.program,
                                        f"{seg.place} segment {seg.id}")
        self.fns = [self._with_frees(self._on_stream(n.id, self._node_fn(n)), reads[n.id], ())
                    for n in self.nodes]

    @property
    def ops(self):
        """The node graph's nodes (``StreamSync`` reads them like op handles)."""
        return self.nodes

    def stream_plan(self, devices=None):
        """The ``StreamPlan`` of the node graph (``runtime.streams``; no GPU needed)."""
        from .streams import plan_streams
        return plan_streams(self.nodes, devices, handle=node_handle)

    @property
    def clones(self):
        return self.counter.count

    def _scope_of(self, pi):
        scopes = self.scopes
        return lambda: scopes[pi]

    def bind_scopes(self, scopes):
        """Run later steps against ``scopes`` (one per place; the code is kept)."""
        if len(scopes) != len(self.scopes):
            raise ValueError(f"need {len(self.scopes)} scopes, got {len(scopes)}")
        self.scopes[:] = scopes

    def _node_fn(self, node):
        if isinstance(node, Segment):
            lowered = node.lowered
            fn, scopes, pi = lowered.fn, self.scopes, node.place_idx

            def run_segment():
                scope = scopes[pi]
                try:
                    fn(scope.vars, scope.find_var)
                except BaseException as e:  # noqa: B036 - Ctrl-C passes through unchanged
                    err = lowered.error(e) if isinstance(e, Exception) else e
                    if err is e:
                        raise
                    raise err from e
            return run_segment
        return self._compile(node.handle)

    # --- memory plan --------------------------------------------------------------------
    def _memory_plan(self, node_of):
        """(ids of versions to store, per node the refcount slots it releases)."""
        block = self.graph.program.global_block()
        persistable = {}
        for names in self.graph.vars:
            for name in names:
                var = block.find_var(name)
                persistable[name] = var is not None and var.persistable

        def home(v):
            return node_of[v.generated_op.id] if v.generated_op is not None else None

        def outside(v):
            h = home(v)
            return {node_of[r.id].id for r in v.pending_ops if node_of[r.id] is not h}

        export = set()
        for names in self.graph.vars:
            for name, versions in names.items():
                for v in versions:
                    if isinstance(home(v), Segment) and (
                            outside(v) or (persistable[name] and v is versions[-1])):
                        export.add(id(v))

        def stored(w):
            # a newer version is in the scope when a segment stores it or a collective
            # rewrote the old tensor in place
            return id(w) in export or not isinstance(home(w), Segment)

        reads = [[] for _ in self.nodes]
        ref0, slots = [], []
        for pi, names in enumerate(self.graph.vars):
            for name, versions in names.items():
                if persistable[name] or name in self._keep:
                    continue
                for v in versions:
                    out = outside(v)
                    if not out or not (v.version == 0 or id(v) in export or
                                       not isinstance(home(v), Segment)):
                        continue  # never in the scope, or nobody else reads it
                    if any(home(w).id in out and stored(w) for w in versions[v.version + 1:]):
                        continue  # a reader node replaces it with a newer version
                    k = len(ref0)
                    ref0.append(len(out))
                    slots.append((pi, name))
                    for r in out:
                        reads[r].append(k)
        self._ref0, self._slots = ref0, slots
        return export, [tuple(x) for x in reads]

    def run(self, sync=None):
        """Run the step once; return {fetch name: [value per place]}."""
        self.counter.count = 0
        return super().run(sync)


def node_handle(node):
    """The SSA handle that decides ``node``'s streams (``runtime.streams``): a segment
    is one place's compute, like each of its handles; a wrapped node is its handle,
    so a broadcast enters the comm stream of every device it writes, as on the
    readable path."""
    return node if isinstance(node, Segment) else node.handle
