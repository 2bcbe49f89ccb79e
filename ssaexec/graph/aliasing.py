"""Aliasing decided on the graph: which results may share storage, and who must wait.

Kernels of ATen view ops (``aten.t``, ``aten.view``, ``aten.expand`` ...) and
the generic vjp grads return tensors that may share storage with an input;
optimizer ops and collectives then update tensors in place. The executor used
to copy every aliasing result at run time. This pass decides on the graph
instead, the way functionalization reasons about views:

* **Alias classes.** Var versions are joined when an op's result may alias
  one of its inputs (``OpDef.may_alias``: any input for ATen views, the
  cotangent inputs for vjp grads) or when an op rewrites a version in place
  (an ``inplace`` op's output of the same name, the output of a handle whose
  class says ``in_place``: the collectives). No kind names are compared here.
* **In-place writers.** For every version ``v`` that a handle ``W`` rewrites
  in place, every other member of ``v``'s class that exists before ``W``
  (is not downstream of it) is read by handles that must run before ``W``:
  the pass adds a dummy edge (reason ``alias``) from each such reader to
  ``W``, unless the reader is downstream of ``W``. Then the readers would see
  the new value, so instead every may-alias result of the class is copied
  when it is made (``AliasPlan.copy``).
* **Results that outlive the step** (the final version of a persistable made
  by a may-alias op, or of a fetched var the sequential executor keeps) are
  always copied: a later step may rewrite their base.

Invariant after the pass: no handle reads storage that an in-place writer
changed after the version it reads was made. Most graphs need no copy at all:
views of parameters are read by forward and backward, which run before the
optimizer anyway; the added edges only make that order explicit for the
scheduler.
"""

from ..ops.registry import get_op_def
from .ssa import ComputationOpHandle

__all__ = ["AliasPlan", "plan_aliasing", "inplace_pairs"]


class AliasPlan:
    """The result of ``plan_aliasing``: versions to copy and edges added."""

    __slots__ = ("copy", "edges", "classes")

    def __init__(self, copy, edges, classes):
        self.copy = copy        # set of VarHandle ids whose value must be a fresh copy
        self.edges = edges      # number of alias edges added to the graph
        self.classes = classes  # number of alias classes with more than one member

    def __repr__(self):
        return f"AliasPlan(copy={len(self.copy)}, edges={self.edges}, classes={self.classes})"


def _alias_pairs(op):
    """``(result, input)`` version pairs of compute handle ``op`` that may share storage.

    ``OpDef.may_alias`` is True (any result with any input: ATen views) or a dict
    of output slot -> input slots (a vjp grad may hand back its cotangent).
    """
    if not isinstance(op, ComputationOpHandle):
        return []
    rule = getattr(get_op_def(op.op.type), "may_alias", False)
    if not rule:
        return []
    ins = [v for v in op.inputs if not v.is_dummy]
    outs = [v for v in op.outputs if not v.is_dummy]
    if rule is True:
        return [(o, i) for o in outs for i in ins]
    by_name = {v.name: v for v in ins}
    out_by_name = {v.name: v for v in outs}
    pairs = []
    for out_slot, in_slots in rule.items():
        for o in (out_by_name.get(n) for n in op.op.output(out_slot)):
            if o is None:
                continue
            for slot in in_slots:
                pairs.extend((o, by_name[n]) for n in op.op.input(slot) if n in by_name)
    return pairs


def inplace_pairs(op):
    """``(input version, output version)`` pairs that ``op`` rewrites in place.

    A computation asks its op def (``OpDef.inplace``); any other handle says it
    itself (``in_place``: the collectives), for each place.
    """
    if isinstance(op, ComputationOpHandle):
        if not get_op_def(op.op.type).inplace:
            return []
        ins = {v.name: v for v in op.inputs if not v.is_dummy}
        return [(ins[v.name], v) for v in op.outputs if not v.is_dummy and v.name in ins]
    if not op.in_place:
        return []
    ins = {(v.place_idx, v.name): v for v in op.inputs if not v.is_dummy}
    return [(ins[(v.place_idx, v.name)], v) for v in op.outputs
            if not v.is_dummy and (v.place_idx, v.name) in ins]


class _Union:
    __slots__ = ("parent",)

    def __init__(self):
        self.parent = {}

    def find(self, x):
        p = self.parent.get(x, x)
        if p == x:
            return x
        root = self.find(p)
        self.parent[x] = root
        return root

    def union(self, a, b):
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[ra] = rb


def plan_aliasing(graph, outlive=()):
    """Add the alias edges to ``graph`` and return the ``AliasPlan`` (see the module doc).

    ``outlive`` names non-persistable vars whose final value also stays after the
    step (the sequential executor leaves fetched vars in its scope).
    """
    block = graph.program.global_block()
    uf = _Union()
    handles = {}  # id(VarHandle) -> VarHandle
    linked = set()  # ids of versions made by a may-alias op
    writers = []
    for op in graph.ops:
        for o, i in _alias_pairs(op):
            handles[id(o)], handles[id(i)] = o, i
            linked.add(id(o))
            uf.union(id(o), id(i))
        pairs = inplace_pairs(op)
        if pairs:
            writers.append((op, pairs))
            for i, o in pairs:
                handles[id(i)], handles[id(o)] = i, o
                uf.union(id(i), id(o))
    members = {}
    for k in handles:
        members.setdefault(uf.find(k), []).append(handles[k])
    classes = {r: m for r, m in members.items() if len(m) > 1}

    copy = set()
    # results that outlive the step must not share storage with anything
    for k in linked:
        v = handles[k]
        var = block.find_var(v.name)
        versions = graph.vars[v.place_idx].get(v.name)
        lasting = (var is not None and var.persistable) or v.name in outlive
        if lasting and versions and versions[-1] is v:
            copy.add(k)

    order = _Order(graph)
    edges = 0
    poisoned = set()  # class roots whose may-alias results are all copied
    for w, pairs in writers:
        for vin, _ in pairs:
            root = uf.find(id(vin))
            if root not in classes or root in poisoned:
                continue
            if not any(id(m) in linked for m in classes[root]):
                continue  # only in-place chains, no views: the graph's own edges suffice
            readers, conflict = [], False
            for m in classes[root]:
                if m is vin or m.generated_op is w:
                    continue
                if m.generated_op is not None and order.downstream(w, m.generated_op):
                    continue  # made from the new value: it may see it
                for r in m.pending_ops:
                    if r is w:
                        continue
                    if order.downstream(w, r):
                        conflict = True
                        break
                    readers.append(r)
                if conflict:
                    break
            if conflict:
                poisoned.add(root)
                continue
            for r in readers:
                if graph.depend(r, w, "alias") is not None:
                    edges += 1
                    order.added(r, w)
    for root in poisoned:
        copy.update(id(m) for m in classes[root] if id(m) in linked)
    return AliasPlan(copy, edges, len(classes))


class _Order:
    """Reachability queries on a graph that only gains edges consistent with it."""

    __slots__ = ("graph", "pos", "stale")

    def __init__(self, graph):
        self.graph = graph
        self.pos = None
        self.stale = True

    def _refresh(self):
        self.pos = {op.id: k for k, op in enumerate(self.graph.topological_order())}
        self.stale = False

    def downstream(self, a, b):
        """Whether ``b`` is reachable from ``a`` (``b`` runs after ``a`` in every schedule)."""
        if a is b:
            return True
        if self.stale:
            self._refresh()
        pos = self.pos
        if pos[b.id] < pos[a.id]:
            return False  # a topological order puts b first: no path a -> b
        target, limit = b, pos[b.id]
        seen, stack = {a.id}, [a]
        while stack:
            op = stack.pop()
            for out in op.outputs:
                for nxt in out.pending_ops:
                    if nxt is target:
                        return True
                    if nxt.id not in seen and pos[nxt.id] < limit:
                        seen.add(nxt.id)
                        stack.append(nxt)
        return False

    def added(self, before, after):
        if not self.stale and self.pos[before.id] > self.pos[after.id]:
            self.stale = True
