"""The commit phase of a step, decided on the graph: what must run last, what to undo.

A step is atomic when a failure on any place leaves every place as it was.
Two kinds of write change what outlives a step, the persistable vars:

* **In place** (an ``inplace`` op such as an optimizer update, or a collective
  rewriting its buffer, on a persistable var): the old value is gone. Such a
  handle, and every handle downstream of it, forms the **commit phase**; the
  runners start it only after every other handle of the step, on every place,
  has finished without error (a barrier: ``early_sinks`` before each of
  ``late_roots``), and the scheduler lets a commit phase that has begun complete
  even when Ctrl-C comes (``runtime.scheduler``).
* **By rebinding** (any other op writing a persistable var, such as batch norm's
  running statistics or a step counter): the scope gets a new tensor and the
  old one is kept, so a failed step puts the old binding back (``rebound``).

This rests on the graph alone, never on the order of ops in the program or on
their role labels: a checking op placed after the updates in program order, but
not reading what they wrote, still runs before them. What stays outside the
promise is an error raised *inside* the commit phase: an update kernel that
itself raises, or an op that reads updated state and raises; the runners then
re-raise it as ``CommitError`` and say that places may differ.

Invariant: no early handle depends on a late one (late is closed downstream),
so adding the barrier keeps the graph acyclic.
"""

from ..ops.registry import get_op_def
from .aliasing import inplace_pairs
from .ssa import ComputationOpHandle

__all__ = ["CommitPlan", "commit_plan"]


class CommitPlan:
    """The commit phase of an SSA graph (see the module docstring)."""

    __slots__ = ("late", "late_roots", "early_sinks", "rebound", "_root_ids")

    def __init__(self, late, late_roots, early_sinks, rebound):
        self.late = late                # ids of the handles of the commit phase
        self.late_roots = late_roots    # late handles with no late producer, in id order
        self.early_sinks = early_sinks  # early handles no early handle waits for, in id order
        self.rebound = rebound          # persistable names early handles rebind (sorted)
        self._root_ids = {h.id for h in late_roots}

    def producers(self, op):
        """``op``'s producers with the barrier: a late root also waits for every early sink."""
        ps = op.producers()
        if op.id in self._root_ids:
            have = {p.id for p in ps}
            ps = ps + [e for e in self.early_sinks if e.id not in have]
        return ps

    def __repr__(self):
        return (f"CommitPlan(late={len(self.late)}, roots={len(self.late_roots)}, "
                f"early_sinks={len(self.early_sinks)}, rebound={len(self.rebound)})")


def _persistable(block):
    cache = {}

    def test(name):
        p = cache.get(name)
        if p is None:
            var = block.find_var(name)
            p = cache[name] = var is not None and var.persistable
        return p
    return test


def writes_in_place(op, persistable):
    """Whether handle ``op`` rewrites a persistable var's storage in place."""
    if any(persistable(o.name) for _, o in inplace_pairs(op)):
        return True
    # a control op's sub-blocks may update state in place (an optimizer inside a
    # conditional block): treat its persistable outputs as written in place
    return isinstance(op, ComputationOpHandle) and get_op_def(op.op.type).is_control and \
        any(not v.is_dummy and persistable(v.name) for v in op.outputs)


def commit_plan(graph):
    """The ``CommitPlan`` of ``graph`` (computed from its current edges)."""
    persistable = _persistable(graph.program.global_block())
    order = graph.topological_order()
    late = set()
    for op in order:
        if op.id in late or writes_in_place(op, persistable):
            late.add(op.id)
            for v in op.outputs:
                late.update(r.id for r in v.pending_ops)
    late_roots, early_sinks, rebound = [], [], set()
    for op in graph.ops:
        if op.id in late:
            if not any(p.id in late for p in op.producers()):
                late_roots.append(op)
            continue
        if not any(r.id not in late for v in op.outputs for r in v.pending_ops):
            early_sinks.append(op)
        rebound.update(v.name for v in op.outputs if not v.is_dummy and persistable(v.name))
    return CommitPlan(late, late_roots, early_sinks, sorted(rebound))
