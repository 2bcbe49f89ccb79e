"""``HANDLE_KINDS``: the closed list of op handle kinds, kind label -> handle class.

Policy: ``graph.handles.OpHandle.__init_subclass__`` fills it as each kind's class is
defined, so adding a kind is one class and the order is definition order (a picture's
legend follows it). Invariant: a leaf of the graph layer. Readers of the list (the DOT
writer in ``graph.draw``) import it from here, not from ``graph.ssa``, whose
``SSAGraph.to_dot()`` calls them: the two would otherwise import each other.

It is the one way back from a label to its class, for labels that come from outside
(a trace's categories, a caller's ``ops_of_kind("fetch")``); once read back, the class
decides. Nothing looks a label up to choose behaviour.
"""

__all__ = ["HANDLE_KINDS"]

HANDLE_KINDS = {}
