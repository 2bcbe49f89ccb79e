"""When each non-persistable value leaves its place's scope: the runners' memory plans.

A ``MemoryPlan`` holds reference counts per scope slot ``(place index, name)``:
each node that reads a slot releases one count when it has run, and the node
that releases the last one erases the slot. A node may also erase slots right
after it has run (``unread``: values nobody reads). Counts are reset at the
start of every step (``start``) and decremented under one lock, since nodes of
several places finish on several threads.

This module is the package's one place where value lifetimes are decided.
Straight-line code (a segment's generated body, ``runtime.codegen``; the
sequential executor's readable path, ``executor``) drops a value after its
last use in run order (``last_uses``). Scheduled nodes, which finish in any
order, count readers instead, with two plans, one per partition
(``runtime.plan`` chooses):

* ``handle_memory_plan`` (the readable path, a node per handle): only the latest
  version of a name is ever erased: an earlier version's name is already bound
  to its successor. It is erased when its last reader has run, or right after
  it is written when nobody reads it.
* ``segment_memory_plan`` (the compiled path): a version crossing nodes is
  stored in the scope (``export``) when another node reads it or when it is a
  persistable's final value; everything else is a local of its segment. A slot
  is erased when the last node that reads it has run, unless that node stored a
  newer version of the same name.
"""

import threading

__all__ = ["MemoryPlan", "handle_memory_plan", "last_uses", "segment_memory_plan"]


def last_uses(reads, writes=None):
    """Position of the last use of every key in straight-line code.

    Parameters
    ----------
    reads : sequence of iterable
        ``reads[k]``: the keys step ``k`` reads.
    writes : sequence of iterable, optional
        ``writes[k]``: the keys step ``k`` writes; a key never read lives until
        its first writer is done.

    Returns
    -------
    dict
        key -> the step after which it is dead.
    """
    last = {}
    for k, keys in enumerate(reads):
        for key in keys:
            last[key] = k
        if writes is not None:
            for key in writes[k]:
                last.setdefault(key, k)
    return last


class MemoryPlan:
    """Reference counts of scope slots and the nodes that release them."""

    __slots__ = ("ref0", "slots", "reads", "unread", "refs", "lock")

    def __init__(self, ref0, slots, reads, unread):
        self.ref0, self.slots = ref0, slots
        self.reads, self.unread = reads, unread  # per node: slots it releases / erases
        self.refs = []
        self.lock = threading.Lock()

    def start(self):
        """Reset the counts for a new step."""
        self.refs = list(self.ref0)

    def wrap(self, i, fn, scopes):
        """Node ``i``'s function ``fn`` followed by its releases (``fn`` when it has none)."""
        reads, unread = self.reads[i], self.unread[i]
        if not reads and not unread:
            return fn
        slots, lock = self.slots, self.lock

        def run_and_free():
            fn()
            dead = list(unread)
            if reads:
                with lock:
                    refs = self.refs
                    for k in reads:
                        c = refs[k] - 1
                        refs[k] = c
                        if c == 0:
                            dead.append(slots[k])
            for pi, name in dead:
                scopes[pi].erase(name)
        return run_and_free


def handle_memory_plan(graph):
    """The readable path's plan (node ``i`` is handle ``i``)."""
    block = graph.program.global_block()
    n = len(graph.ops)
    reader_slots = [[] for _ in range(n)]
    free_after = [[] for _ in range(n)]
    ref0, slots = [], []
    for pi, names in enumerate(graph.vars):
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
    return MemoryPlan(ref0, slots, [tuple(x) for x in reader_slots],
                      [tuple(x) for x in free_after])


def segment_memory_plan(nodes, keep=()):
    """The compiled path's plan of ``nodes`` (a segmented ``NodeGraph``) and the ids of
    the versions segments store: ``(MemoryPlan, export)``. ``keep``: names never erased."""
    graph, node_of = nodes.graph, nodes.node_of
    block = graph.program.global_block()
    persistable = {}
    for names in graph.vars:
        for name in names:
            var = block.find_var(name)
            persistable[name] = var is not None and var.persistable

    def home(v):
        return node_of[v.generated_op.id] if v.generated_op is not None else None

    def local(v):
        # a result of a segment: a local of its code unless stored (not a scope entry)
        h = home(v)
        return h is not None and not h.scoped_results

    def outside(v):
        h = home(v)
        return {node_of[r.id].id for r in v.pending_ops if node_of[r.id] is not h}

    export = set()
    for names in graph.vars:
        for name, versions in names.items():
            for v in versions:
                if local(v) and (
                        outside(v) or (persistable[name] and v is versions[-1])):
                    export.add(id(v))

    def stored(w):
        # a newer version is in the scope when a segment stores it or a collective
        # rewrote the old tensor in place
        return id(w) in export or not local(w)

    reads = [[] for _ in nodes.nodes]
    ref0, slots = [], []
    for pi, names in enumerate(graph.vars):
        for name, versions in names.items():
            if persistable[name] or name in keep:
                continue
            for v in versions:
                out = outside(v)
                if not out or not (v.version == 0 or id(v) in export or
                                   not local(v)):
                    continue  # never in the scope, or nobody else reads it
                if any(home(w).id in out and stored(w) for w in versions[v.version + 1:]):
                    continue  # a reader node replaces it with a newer version
                k = len(ref0)
                ref0.append(len(out))
                slots.append((pi, name))
                for r in out:
                    reads[r].append(k)
    plan = MemoryPlan(ref0, slots, [tuple(x) for x in reads], [()] * len(nodes.nodes))
    return plan, export
