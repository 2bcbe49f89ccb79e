"""The step plan: every decision that turns an SSA graph into what runs, made once.

``build_plan(graph, segments, processes, atomic, keep)`` is the one function that
decides, for one SSA graph on its places (``graph.places``) in ``processes``
processes, under the lowering's policy (``segments``: the compiled path's
segments or a node per handle; ``atomic``: the commit phase apart even where it
need not be; ``keep``: names the step leaves in the scope). Everything that runs,
replays or reports a step consumes the ``StepPlan`` it returns and re-derives no
part of it: both runners and the Inductor lowering (``runtime.runner``), the
scheduler (``StepPlan.deps``), the stream plan (``StepPlan.stream_plan``), ``ssaexec
stats`` (``runtime.compiled.compile_summary``, ``runtime.inductor.inductor_summary``),
``ssaexec trace`` (the runner's plan) and the simulator (``sim.engine``).

Decisions, in order, each made here and nowhere else:

1. **Aliasing** (``graph.aliasing``, compiled path only): the edges that keep
   in-place writers after every reader of an aliased version, and the versions
   to copy. The edges are applied to the graph once, the first time any plan of
   it is built (memoised per graph and ``keep``), and the plan module is their
   only caller: a later plan, whatever its policy, adds nothing and reports the
   same edges, so no consumer ever sees the graph change under it.
2. **The no-op collective rule**: a collective of one place in one process does
   nothing (``noop_collectives``: one place, ``processes == 1``, on either path);
   on the compiled path it cuts no segment and emits no code.
3. **Atomicity**: the commit phase is flagged (the scheduler holds Ctrl-C
   once it begins, and with segments its first nodes wait for every other node)
   on the readable path always, and on the compiled path unless the step's
   collectives are no-ops, or when the lowering asks (``atomic``: Inductor).
4. **The commit phase** (``graph.commit``), after the alias edges.
5. **The topological order** of the handles: program order, the commit phase
   last (``runtime.node_graph.program_order``, the package's one sort,
   ``graph.ssa.topo_sort``).
6. **Segments**: the node graph (``runtime.node_graph.partition``) and its
   ``DependencyPlan`` (``deps``), what the scheduler runs.
7. **Value lifetimes** (``memory_plan()``, ``runtime.memory_plan``): fresh
   reference counts per call, since each runner erases its own scopes.
8. **Stream roles** (``stream_plan(devices)``, ``runtime.streams.plan_streams``).

Invariants: a plan is a value: building it changes nothing a caller can see
(the alias edges above being the graph's own, once), and a runner writes only
its own plan's segments (their ``lowered`` code), so runners never share one;
two plans of one graph with the same arguments have the same nodes, in the
same order (``node_keys``); ``nodes.nodes[i].id == i`` and ``deps`` numbers
nodes alike.
"""

import weakref

from ..graph.aliasing import AliasPlan, plan_aliasing
from ..graph.commit import commit_plan
from .memory_plan import handle_memory_plan, segment_memory_plan
from .node_graph import Segment, node_handle, partition, program_order

__all__ = ["StepPlan", "build_plan", "processes_of"]

_ALIAS = weakref.WeakKeyDictionary()  # graph -> {keep: AliasPlan}, the edges applied once


def processes_of(collective):
    """The processes a collective backend spans: 1 when it is local only, else its
    ``world_size`` when above 1, else None (several). A backend that is not local
    only is never a no-op, even in a world of one: it still takes part in the
    group's steps."""
    if getattr(collective, "local_only", False):
        return 1
    world = getattr(collective, "world_size", None)
    return world if isinstance(world, int) and world > 1 else None


def _aliasing(graph, keep):
    done = _ALIAS.setdefault(graph, {})
    alias = done.get(keep)
    if alias is None:
        alias = plan_aliasing(graph, keep)
        if done:  # the first plan added the edges: report them, as it did
            first = next(iter(done.values()))
            alias = AliasPlan(alias.copy, first.edges, alias.classes)
        done[keep] = alias
    return alias


class StepPlan:
    """Every decision about one step of one graph (see the module docstring).

    Attributes
    ----------
    graph : SSAGraph
    segmented : bool
        Segments (the compiled path), else a node per handle.
    processes : int or None
        Processes the step's collectives span (None: more than one, count unknown).
    noop_collectives : bool
        One place in one process: collectives do nothing and cut nothing.
    atomic : bool
        The commit phase is flagged and, with segments, waits for the rest.
    keep : frozenset of str
        Non-persistable names left in the scope after the step (never erased).
    alias : AliasPlan or None
        The compiled path's alias plan (None on the readable path).
    commit : CommitPlan
    order : list of OpHandle
        The handles in program order, the commit phase last.
    nodes : NodeGraph
    deps : DependencyPlan
        What the scheduler runs (node ids).
    """

    __slots__ = ("graph", "segmented", "processes", "noop_collectives", "atomic", "keep",
                 "alias", "commit", "order", "nodes", "deps")

    def __init__(self, graph, segmented, processes, noop_collectives, atomic, keep, alias,
                 commit, order, nodes, deps):
        self.graph, self.segmented, self.processes = graph, segmented, processes
        self.noop_collectives, self.atomic, self.keep = noop_collectives, atomic, keep
        self.alias, self.commit, self.order = alias, commit, order
        self.nodes, self.deps = nodes, deps

    @property
    def segments(self):
        """The segments, in node order (none on the readable path)."""
        return [n for n in self.nodes.nodes if isinstance(n, Segment)]

    def node_keys(self):
        """What each node runs, in node order: ``(kind, place index, handle ids,
        commit)``; equal keys mean the same step."""
        return [(type(n).__name__, n.place_idx, tuple(h.id for h in n.handles), n.commit)
                for n in self.nodes.nodes]

    def memory_plan(self):
        """``(MemoryPlan, export)``: fresh reference counts for one runner, and the ids
        of the versions segments store (empty on the readable path)."""
        if self.segmented:
            return segment_memory_plan(self.nodes, self.keep)
        return handle_memory_plan(self.graph), set()

    def stream_plan(self, devices=None):
        """The ``StreamPlan`` of the nodes (``runtime.streams``; no GPU needed)."""
        from .streams import plan_streams
        return plan_streams(self.nodes.nodes, devices, handle=node_handle)

    def __repr__(self):
        return (f"StepPlan({'segments' if self.segmented else 'handles'}, "
                f"nodes={len(self.nodes.nodes)}, segments={len(self.segments)}, "
                f"noop_collectives={self.noop_collectives}, atomic={self.atomic})")


def build_plan(graph, segments=True, processes=1, atomic=False, keep=()):
    """The ``StepPlan`` of ``graph`` (see the module docstring).

    Parameters
    ----------
    graph : SSAGraph
        On its places (``graph.places``).
    segments : bool
        The compiled path's segments; False: a node per handle (the readable path).
    processes : int or None
        Processes the collectives span (``processes_of(collective)``); None: several.
    atomic : bool
        Keep the commit phase apart even for one place in one process (Inductor).
    keep : iterable of str
        Non-persistable names the step leaves in the scope (the sequential
        executor's fetches): their final values are copied and never erased.
    """
    keep = frozenset(keep)
    alias = _aliasing(graph, keep) if segments else None
    noop = len(graph.places) == 1 and processes == 1
    # several places or processes: a step commits its updates on every place or on none
    atomic = bool(atomic) or not segments or not noop
    commit = commit_plan(graph)
    order = program_order(graph, commit.late)
    nodes = partition(graph, bool(segments), noop, atomic=atomic, plan=commit, order=order)
    return StepPlan(graph, bool(segments), processes, noop, atomic, keep, alias, commit,
                    order, nodes, nodes.plan())
