"""``CompiledRunner``: an SSA graph lowered once into segments, run many times.

A ``Runner`` (``runtime.runner``) whose lowering is ``SegmentLowering``.

The readable ``GraphRunner`` schedules every op handle on its own: a queue
hand-off, a lock and a closure per op, ~25 µs of host time where the kernel
takes a few. A graph executor knows the whole step ahead, so this runner
spends that knowledge once, when the graph is built. Steps 1 and 2 are the
runner's step plan (``runtime.plan``, which ``ssaexec stats`` reports too):

1. ``graph.aliasing`` decides which results need a copy and adds the edges that
   keep in-place writers (optimizers, collectives) after every reader of an
   aliased version.
2. **Segments.** ``runtime.node_graph.partition`` cuts each place's handles
   into maximal runs that no collective interrupts; collectives and fetches
   spanning places are nodes of their own.
3. Each segment is lowered to straight-line Python (``runtime.codegen``);
   collectives and fetches keep their functions (``runtime.handle_calls``).
4. The scheduler runs the node graph: one place runs inline in the caller's
   thread with no hand-off; several places run their segments side by side.

Values crossing nodes live in the places' scopes (a version is stored only
when another node reads it, or when it is a persistable's final value);
everything else is a local of its segment. A scope entry is erased when the
last node that reads it has run, unless that node stored a newer version of
the same name (``memory_plan.segment_memory_plan``).

CUDA. Segments run on their place's compute stream, entered once per segment;
cross-stream events are recorded only on node edges that cross streams
(``StreamSync`` applied to the node graph). The stream policy is the readable
path's, decided by the SSA handle behind each node (``Node.stream_handle``): a
collective or fetch node enters the streams its handle would.
"""

from ..graph.ssa import ComputationOpHandle
from .codegen import CloneCounter, lower_segment
from .node_graph import Segment, node_handle, partition
from .plan import build_plan
from .runner import Runner

__all__ = ["CompiledRunner", "Segment", "SegmentLowering", "compile_summary", "node_handle",
           "partition", "summary_plan"]


class _SegmentPlan:
    """What the code generator of one segment must store, copy and bind, and the block
    runner its control ops get."""

    __slots__ = ("export", "copy", "needed", "step", "place_idx", "run_places")

    def __init__(self, export, copy, needed, step, place_idx, run_places):
        self.export, self.copy, self.needed = export, copy, needed
        self.step, self.place_idx = step, place_idx
        self.run_places = run_places


class SegmentLowering:
    """Lower each segment to straight-line code (see the module docstring).

    ``keep_fetched``: the sequential ``Executor`` leaves fetched vars in its scope, as
    it always did. ``atomic``: cut the commit phase into segments of its own even for
    one place in one process (``runtime.inductor``: a compiled segment's kernels may
    update state in any order, so what can fail must not share a segment with it). ``clones`` counts the copies made for aliasing in the last run;
    ``alias`` is the graph's ``AliasPlan`` and ``keep`` the names left in the scope,
    both the runner's step plan's (``runtime.plan``).
    """

    __slots__ = ("keep_fetched", "keep", "alias", "counter", "calls", "atomic")
    compiled = True
    rebindable = True  # the code reads its scope through the runner's list

    def __init__(self, keep_fetched=False, atomic=False):
        self.keep_fetched = keep_fetched
        self.atomic = atomic
        self.keep, self.alias, self.calls = set(), None, None
        self.counter = CloneCounter()

    @property
    def clones(self):
        return self.counter.count

    def prepare(self, runner):
        self.calls = runner.calls
        graph, scopes = runner.graph, runner.scopes
        plan = runner.step_plan
        self.keep, self.alias = plan.keep, plan.alias
        memory, export = plan.memory_plan()
        needed = {id(v) for names in graph.vars for vs in names.values() for v in vs
                  if v.pending_ops}
        for seg in runner.node_graph.segments:
            plan = _SegmentPlan(export, self.alias.copy, needed, runner.step, seg.place_idx,
                                runner.run_places)
            seg.lowered = lower_segment(seg.handles, seg.place, _scope_of(scopes, seg.place_idx),
                                        plan, self.counter, graph.program,
                                        f"{seg.place} segment {seg.id}")
        return memory

    def segment_body(self, seg):
        lowered = seg.lowered
        fn, scopes, pi = lowered.fn, self.calls.scopes, seg.place_idx

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

    def handle_body(self, handle):
        return self.calls.fn(handle)

    def begin_step(self):
        self.counter.count = 0


def _scope_of(scopes, pi):
    return lambda: scopes[pi]


def CompiledRunner(graph, scopes, collective, scheduler, contexts=None,  # noqa: N802
                   sync="event", keep_fetched=False, run_places=None):
    """A ``Runner`` of ``graph`` on the compiled path (a constructor, named as one)."""
    return Runner(graph, scopes, collective, scheduler, SegmentLowering(keep_fetched),
                  contexts, sync, run_places)


def summary_plan(graph, local_only=True, atomic=False):
    """The step plan ``ssaexec stats`` reports: the one a compiled runner of ``graph``
    builds with a local-only collective backend (``local_only``; else one spanning
    processes), and with ``atomic`` the Inductor lowering's."""
    return build_plan(graph, True, 1 if local_only else None, atomic)


def compile_summary(graph, local_only=True):
    """What the compiled path makes of ``graph`` (``ssaexec stats``), without running it:
    the compiled runner's own step plan (``summary_plan``).

    ``alias_copies`` counts the versions the alias plan copies each step (an upper
    bound: a may-alias result that does not share storage at run time is not copied).
    """
    from ..ops.registry import get_op_def
    plan = summary_plan(graph, local_only)
    alias, nodes = plan.alias, plan.nodes
    segments = plan.segments
    views = sum(1 for h in graph.ops if isinstance(h, ComputationOpHandle)
                and get_op_def(h.op.type).may_alias
                for v in h.outputs if not v.is_dummy)
    return {"segments": len(segments), "nodes": len(nodes.nodes),
            "ops_per_segment": max((len(n.handles) for n in segments), default=0),
            "may_alias_results": views, "alias_copies": len(alias.copy),
            "alias_edges": alias.edges}
