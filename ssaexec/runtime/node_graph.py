"""The node graph: the units the scheduler runs once an SSA graph is partitioned.

``partition`` makes it, called by the step plan alone (``runtime.plan``), which
everything that runs, replays or reports a step consumes: both runners
(``runtime.runner``), the stream planner (``runtime.streams``), the scheduler
(``NodeGraph.plan``), ``ssaexec stats`` and the simulator (``sim.engine``).

Node kinds are classes, closed and listed in ``NODE_KINDS``; code that needs to
know what a node is asks the node (``handles``, ``is_comm``, ``stream_handle``,
``scoped_results``, ``body``), never its class name:

* ``Segment``: a run of one place's handles, lowered to one body;
* ``HandleNode``: one SSA handle as a node of its own (a collective or a fetch
  spanning places, or, on the readable path, every handle).

The partition, with ``segments``:

1. Each place's handles, in one topological order of the whole graph
   (``program_order``), are cut into maximal runs that no collective
   interrupts: a run ends after the last handle (in the place's order) that a
   collective waits for (a bucket's all-reduce waits for all its gradients: its
   last one cuts, the others do not) and a new
   one starts before a handle that waits for a collective the run does not
   already follow, except that a place's optimizer updates stay one run waiting
   for all their collectives (so they fuse, as ``torch.optim`` steps after the
   backward pass), and that a bookkeeping handle (ZeRO's free) waiting for such a
   collective becomes a node of its own (the compute after it need not wait). A collective of one place in one process does nothing and
   cuts nothing (``noop_collectives``), so a one-place step is one segment.
   Every external edge then enters a segment at its start and leaves at its
   end, so the node graph is acyclic whenever the SSA graph is.
2. Without ``segments`` (the readable path), every handle is a node and node
   ``i`` is handle ``i``.

Commit phase (``graph.commit``). A node is a commit node when its handles are
in the step's commit phase and the partition is ``atomic``: the scheduler then
holds Ctrl-C once one has started. With ``segments``, each first commit node
also waits for every other node of the step, on every place; without, the
barrier is the ``CommitPlan``'s (a late root waits for every early sink), added
to the dependency plan only, as the readable path always did.

Invariants: ``nodes[i].id == i``; edges run from lower to higher position in a
topological order; every node's ``inputs`` are ``NodeVar``s whose
``generated_op`` is the producing node (what ``StreamSync`` reads).
"""

from ..graph.commit import commit_plan
from .scheduler import DependencyPlan

__all__ = ["NODE_KINDS", "HandleNode", "NodeGraph", "NodeVar", "Segment", "node_handle",
           "partition", "program_order"]


class NodeVar:
    """A var crossing an edge of the node graph (duck-types ``VarHandle`` for streams)."""

    __slots__ = ("name", "place_idx", "generated_op", "is_dummy")

    def __init__(self, name, place_idx, generated_op, is_dummy=False):
        self.name, self.place_idx = name, place_idx
        self.generated_op, self.is_dummy = generated_op, is_dummy


class _Node:
    """What every node kind has: its position, its edges and its phase."""

    __slots__ = ("id", "inputs", "outputs", "_producers", "commit")

    def __init__(self, commit=False):
        self.id = -1
        self.inputs, self.outputs = [], []
        self._producers = []
        self.commit = commit  # in the step's commit phase (graph.commit): runs last

    def producers(self):
        return self._producers


class Segment(_Node):
    """A run of one place's handles lowered to one body."""

    __slots__ = ("place_idx", "place", "handles", "lowered", "after_collectives")
    kind = "segment"
    stream = "compute"
    is_collective = False
    is_comm = False
    on_one_place = True
    scoped_results = False  # its results are locals of its code unless stored

    def __init__(self, place_idx, place, commit=False):
        super().__init__(commit)
        self.place_idx, self.place = place_idx, place
        self.handles = []
        self.lowered = None
        self.after_collectives = set()  # ids of the collectives the segment's start follows

    @property
    def name(self):
        first = self.handles[0].name if self.handles else "-"
        return f"segment({len(self.handles)} ops from {first})"

    @property
    def stream_handle(self):
        """A segment is one place's compute, like each of its handles."""
        return self

    def body(self, lowering):
        return lowering.segment_body(self)


class HandleNode(_Node):
    """One SSA handle as a node."""

    __slots__ = ("handle", "handles")
    scoped_results = True  # every result it writes is in its place's scope

    def __init__(self, handle, commit=False):
        super().__init__(commit)
        self.handle = handle
        self.handles = (handle,)

    @property
    def place_idx(self):
        return self.handle.place_idx if self.handle.on_one_place else None

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
    def is_comm(self):
        # queued first (``scheduler.comm_first``): collectives and ZeRO's frees
        return self.handle.urgent

    @property
    def name(self):
        return self.handle.name

    @property
    def stream_handle(self):
        """The node's handle decides its streams: a broadcast enters the comm stream of
        every device it writes, on either path."""
        return self.handle

    def body(self, lowering):
        return lowering.handle_body(self.handle)


NODE_KINDS = (Segment, HandleNode)


def node_handle(node):
    """The SSA handle that decides ``node``'s streams (``runtime.streams``)."""
    return node.stream_handle


class NodeGraph:
    """The nodes of one SSA graph, their edges, and the plan the scheduler runs."""

    __slots__ = ("graph", "nodes", "node_of", "commit", "segmented", "atomic")

    def __init__(self, graph, nodes, node_of, commit, segmented, atomic):
        self.graph, self.nodes, self.node_of = graph, nodes, node_of
        self.commit, self.segmented, self.atomic = commit, segmented, atomic

    @property
    def ops(self):
        """The nodes (``plan_streams`` and ``StreamSync`` read them like op handles)."""
        return self.nodes

    @property
    def segments(self):
        return [n for n in self.nodes if isinstance(n, Segment)]

    def plan(self):
        """The scheduler's ``DependencyPlan`` of the nodes (with the commit barrier)."""
        nodes = self.nodes
        if self.segmented:
            producers = [[p.id for p in n.producers()] for n in nodes]
        else:
            producers = [[self.node_of[p.id].id for p in self.commit.producers(n.handle)]
                         for n in nodes]
        return DependencyPlan(len(nodes), producers, [n.is_comm for n in nodes],
                              [n.commit for n in nodes])


def partition(graph, segments=True, noop_collectives=False, atomic=False, plan=None,
              order=None):
    """Cut ``graph`` into a ``NodeGraph`` (see the module docstring).

    Parameters
    ----------
    graph : SSAGraph
    segments : bool
        Cut each place's handles into segments (the compiled path); False: one
        node per handle (the readable path).
    noop_collectives : bool
        A collective of one place in one process does nothing: it cuts no segment.
    atomic : bool
        Flag the commit phase's nodes; with ``segments``, its first nodes wait for
        every other node of the step.
    plan : CommitPlan, optional
        The graph's commit plan, if the caller has it.
    order : list of OpHandle, optional
        ``program_order(graph, plan.late)``, if the caller has it.
    """
    plan = plan or commit_plan(graph)
    if not segments:
        nodes = [HandleNode(h, atomic and h.id in plan.late) for h in graph.ops]
        node_of = {}
        for k, node in enumerate(nodes):
            node.id = k
            node_of[node.handle.id] = node
        _link(nodes, node_of, chain=False)
        return NodeGraph(graph, nodes, node_of, plan, False, atomic)
    nodes, node_of = _segments(graph, noop_collectives, atomic, plan.late,
                               order or program_order(graph, plan.late))
    _link(nodes, node_of, chain=True)
    if atomic:
        _commit_barrier(nodes)
    for node in nodes:
        for p in node._producers:
            p.outputs.append(NodeVar("edge", None, p, True))
    return NodeGraph(graph, nodes, node_of, plan, True, atomic)


def _segments(graph, noop_collectives, atomic, late, order):
    multi = set()
    for h in graph.ops:
        # handles spanning places are nodes of their own (but one place's no-op collectives)
        if not h.on_one_place and not (h.is_collective and noop_collectives):
            multi.add(h.id)
    # a run ends where a collective becomes ready: after the last, in a place's order, of
    # its producers on that place (a bucket's all-reduce waits for all its gradients, so
    # cutting after each one would only make more, smaller segments)
    pos = {h.id: k for k, h in enumerate(order)}
    feeds_multi = set()
    for h in graph.ops:
        if h.id in multi and h.stream != "fetch":  # fetches wait at the end: they cut nothing
            last = {}
            for p in h.producers():
                if p.id in multi:
                    continue
                pi = _place_of(p)
                if pi not in last or pos[p.id] > pos[last[pi]]:
                    last[pi] = p.id
            feeds_multi.update(last.values())
    nodes, node_of = [], {}
    current = {}  # place index -> open Segment
    updates_only = {}  # place index -> its open segment holds optimizer updates alone
    for h in order:
        if h.id in multi:
            node = HandleNode(h, atomic and h.id in late)
            nodes.append(node)
            node_of[h.id] = node
            continue
        pi = _place_of(h)
        needs = {p.id for p in h.producers() if p.id in multi}
        commit = atomic and h.id in late
        seg = current.get(pi)
        if h.bookkeeping and needs and (seg is None or not needs <= seg.after_collectives):
            # a free after a collective: a node of its own, so what follows on this
            # place does not wait for the collective (ZeRO's reduce-scatters)
            node = HandleNode(h, commit)
            nodes.append(node)
            node_of[h.id] = node
            continue
        updating = h.section() == "optimize"
        if seg is not None and seg.commit == commit and not needs <= seg.after_collectives \
                and updating and updates_only[pi]:
            # a place's updates form one run that waits for all their collectives, as
            # torch.optim's step after the backward pass: then they fuse into
            # torch._foreach_* calls instead of one segment (and launch) each
            seg.after_collectives |= needs
        elif seg is None or not needs <= seg.after_collectives or seg.commit != commit:
            seg = Segment(pi, graph.places[pi], commit)
            seg.after_collectives = needs
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
    return nodes, node_of


def _place_of(h):
    # a one-place no-op collective spans no places but its vars'
    return h.place_idx if h.on_one_place else \
        next(v.place_idx for v in h.inputs + h.outputs if not v.is_dummy)


def _link(nodes, node_of, chain):
    """Node edges: every handle edge between different nodes, and with ``chain`` one
    chain of segments per place."""
    last_seg = {}
    for node in nodes:
        preds = {}
        for h in node.handles:
            for v in h.inputs:
                g = v.generated_op
                if g is None:
                    continue
                src = node_of[g.id]
                if src is node:
                    continue
                preds.setdefault(src.id, src)
                node.inputs.append(NodeVar(v.name, getattr(v, "place_idx", None), src,
                                           v.is_dummy))
        if chain and isinstance(node, Segment):
            prev = last_seg.get(node.place_idx)
            if prev is not None and prev.id not in preds:
                preds[prev.id] = prev
                node.inputs.append(NodeVar("chain", node.place_idx, prev, True))
            last_seg[node.place_idx] = node
        if not chain:
            # the readable path's edges are the handle's own, dummy-var edges included
            preds = {node_of[p.id].id: node_of[p.id] for p in node.handle.producers()}
        node._producers = list(preds.values())


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
                    n.inputs.append(NodeVar("commit", n.place_idx, e, True))


def program_order(graph, late=()):
    """A topological order that follows program order (handle ids) wherever it can,
    with every handle of ``late`` (the commit phase) after all the others
    (``SSAGraph.topological_order``, the package's one sort).

    Handles are made in program order, so each place then runs its ops as the
    sequential executor would: the optimizer updates stay together at the end,
    where they can be fused.
    """
    return graph.topological_order(late)
