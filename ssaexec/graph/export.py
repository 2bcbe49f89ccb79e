"""Export an SSA graph to networkx and Graphviz DOT.

networkx nodes are ``op:<id>`` for op handles and ``var:<place>:<name>@v<k>`` for
var handles (dummies are ``dummy:<name>``), with attributes ``kind``,
``place``, ``op_type``, ``var_name``, ``version``; edges carry ``dummy=True``
when they only order ops. DOT output draws one cluster per place, collectives
between the clusters, colours by handle kind and dashed dummy edges.
"""

import networkx as nx

__all__ = ["to_networkx", "to_dot", "KIND_COLORS", "op_graph"]

KIND_COLORS = {
    "compute": "#cfe2ff", "all_reduce": "#f8b4b4", "reduce": "#fcd29f",
    "broadcast": "#fde68a", "fetch": "#c6f6d5", "scale_loss_grad": "#e9d5ff",
}


def _var_id(v):
    if v.is_dummy:
        return f"dummy:{v.name}"
    return f"var:{v.place}:{v.name}@v{v.version}"


def _op_attrs(op):
    return {"kind": op.kind, "label": op.name,
            "place": str(op.place) if hasattr(op, "place") and op.kind != "fetch" else None,
            "op_type": op.op.type if op.kind == "compute" else op.kind,
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


def _q(s):
    return '"' + str(s).replace("\\", "\\\\").replace('"', '\\"') + '"'


def to_dot(graph, collapse=False, include=None, show_vars=True):
    """Graphviz DOT text of ``graph``.

    Parameters
    ----------
    collapse : bool
        Draw only place 0's replica (per-place copies are identical).
    include : callable, optional
        ``include(op_handle) -> bool`` keeps part of the graph.
    show_vars : bool
        Draw var nodes (``name@vN``); otherwise ops only, edges labelled by var.
    """
    keep = [op for op in graph.ops if include is None or include(op)]
    if collapse:
        keep = [op for op in keep if not hasattr(op, "place_idx") or op.place_idx == 0]
    kept = {op.id for op in keep}
    lines = ["digraph ssa {", "  rankdir=TB;", '  node [fontname="Helvetica", fontsize=10];',
             '  edge [fontname="Helvetica", fontsize=8];']
    by_place = {}
    shared = []
    for op in keep:
        if hasattr(op, "place_idx"):
            by_place.setdefault(op.place_idx, []).append(op)
        else:
            shared.append(op)

    def op_node(op):
        return (f'    {_q(f"op:{op.id}")} [label={_q(op.name)}, shape=box, style=filled, '
                f'fillcolor={_q(KIND_COLORS.get(op.kind, "#eeeeee"))}];')

    var_place = {}
    edges = []
    for op in keep:
        for v in op.inputs:
            src = v.generated_op
            if v.is_dummy:
                if src is not None and src.id in kept:
                    edges.append((f"op:{src.id}", f"op:{op.id}", True, v.reason))
                continue
            if show_vars:
                var_place.setdefault(_var_id(v), v)
                edges.append((_var_id(v), f"op:{op.id}", False, None))
            elif src is not None and src.id in kept:
                edges.append((f"op:{src.id}", f"op:{op.id}", False, f"{v.name}@v{v.version}"))
        if show_vars:
            for v in op.outputs:
                if not v.is_dummy:
                    var_place.setdefault(_var_id(v), v)
                    edges.append((f"op:{op.id}", _var_id(v), False, None))
    vars_by_place = {}
    for vid, v in var_place.items():
        if collapse and v.place_idx != 0:
            continue
        vars_by_place.setdefault(v.place_idx, []).append((vid, v))
    for pi in sorted(set(by_place) | set(vars_by_place)):
        lines.append(f"  subgraph cluster_place_{pi} {{")
        lines.append(f"    label={_q(str(graph.places[pi]) + (' (x%d)' % len(graph.places) if collapse else ''))};")
        lines.append('    style=rounded; color="#888888";')
        for op in by_place.get(pi, []):
            lines.append(op_node(op))
        for vid, v in vars_by_place.get(pi, []):
            lines.append(f"    {_q(vid)} [label={_q(f'{v.name}@v{v.version}')}, shape=ellipse, "
                         f"fontsize=8];")
        lines.append("  }")
    for op in shared:
        lines.append(op_node(op).strip().join(["  ", ""]))
    drawn = {f"op:{i}" for i in kept} | {vid for vs in vars_by_place.values() for vid, _ in vs}
    for a, b, dummy, label in edges:
        if a not in drawn or b not in drawn:
            continue
        attrs = []
        if dummy:
            attrs.append('style=dashed, color="#999999"')
        if label:
            attrs.append(f"label={_q(label)}")
        lines.append(f"  {_q(a)} -> {_q(b)}" + (f" [{', '.join(attrs)}]" if attrs else "") + ";")
    lines.append("}")
    return "\n".join(lines) + "\n"
