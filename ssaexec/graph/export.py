"""Export an SSA graph to networkx (DOT text comes from ``ssaexec.graph.draw``).

networkx nodes are ``op:<id>`` for op handles and ``var:<place>:<name>@v<k>`` for
var handles (dummies are ``dummy:<name>``), with attributes ``kind``,
``place``, ``op_type``, ``var_name``, ``version``; edges carry ``dummy=True``
when they only order ops.
"""

import networkx as nx

__all__ = ["to_networkx", "op_graph"]


def _var_id(v):
    if v.is_dummy:
        return f"dummy:{v.name}"
    return f"var:{v.place}:{v.name}@v{v.version}"


def _op_attrs(op):
    return {"kind": op.kind, "label": op.name,
            "place": str(op.place) if op.on_one_place else None,
            "op_type": op.op_type,
            "var_name": None, "version": None}


def to_networkx(graph):
    """A ``networkx.DiGraph`` with op, var and dummy nodes (see module docstring)."""
    g = nx.DiGraph()
    for op in graph.ops:
        g.add_node(f"op:{op.id}", **_op_attrs(op))
    for op in graph.ops:
        for v in op.inputs + op.outputs:
            vid = _var_id(v)
            if vid in g:
                continue
            if v.is_dummy:
                g.add_node(vid, kind="dummy", place=None, op_type=None, var_name=v.name,
                           version=None, reason=v.reason)
            else:
                g.add_node(vid, kind="var", place=str(v.place), op_type=None, var_name=v.name,
                           version=v.version)
        for v in op.inputs:
            g.add_edge(_var_id(v), f"op:{op.id}", dummy=v.is_dummy)
        for v in op.outputs:
            g.add_edge(f"op:{op.id}", _var_id(v), dummy=v.is_dummy)
    return g


def op_graph(graph):
    """A ``networkx.DiGraph`` over op handle ids only: an edge per dependency."""
    g = nx.DiGraph()
    for op in graph.ops:
        g.add_node(op.id, kind=op.kind, label=op.name)
    for op in graph.ops:
        for p in op.producers():
            g.add_edge(p.id, op.id)
    return g
