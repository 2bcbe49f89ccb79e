"""Pictures of an SSA graph: Graphviz when ``dot`` is installed, matplotlib otherwise.

``render(graph, path)`` picks the format from the suffix (``.svg``, ``.png``,
``.pdf`` or ``.dot``). Both engines draw the same ``drawn_graph``: op handles
(boxes coloured by kind), var handles (ellipses labelled ``name@vN``), one
cluster per place, the collectives and fetches that span every place between
the clusters, dummy edges dashed. Graphviz renders ``dot_source`` with the
``dot`` binary (``$SSAEXEC_DOT`` names it; default: ``dot`` on ``PATH``); the
fallback lays the graph out itself (levels top to bottom, one band per place)
and draws it with matplotlib. In both SVGs the element of op handle ``i`` has
``id="op:i"``, so tools (and tests) can find every op.

Big graphs. A layered drawing routes an edge through every level it spans,
and an SSA graph of a deep network has hundreds of edges from the forward
pass to the backward pass: Graphviz then takes many minutes. So when the
edges would cross more than ``SPLIT_COST`` levels in all, an edge spanning
more than ``SPLIT_SPAN`` levels is cut: its reader gets a copy of the var (a
dashed ellipse with the same label) or, for a dummy edge, a small "after #id"
stub. Graphs of more than ``BIG_NODES`` nodes also get cheaper Graphviz
settings and no edge labels. If Graphviz still takes longer than ``timeout``
seconds, the fallback draws.

``select_ops`` narrows a big graph: ``collapse`` keeps place 0's replica (the
others are copies), ``sections`` keeps parts of the training step
(``forward``, ``backward``, ``optimize``, ``comm``, ``fetch``) and
``pattern`` keeps ops whose name, op type or var names match a regex.

Size: both drawing engines share one layout (``drawn_graph``); kept together (over 500
lines).
"""

import itertools
import math
import os
import re
import shutil
import subprocess

import networkx as nx

from ..core.errors import SSAExecError
from .kinds import HANDLE_KINDS

__all__ = ["SECTIONS", "op_section", "select_ops", "find_dot", "render", "dot_source",
           "drawn_graph", "layer_levels", "FORMATS", "DOT_ENV", "SPLIT_COST", "SPLIT_SPAN",
           "BIG_NODES"]

SECTIONS = ("forward", "backward", "optimize", "comm", "fetch")
FORMATS = ("svg", "png", "pdf", "dot")
DOT_ENV = "SSAEXEC_DOT"
SPLIT_COST = 1000   # levels crossed by all edges together (Graphviz's virtual nodes)
SPLIT_SPAN = 8
BIG_NODES = 250
DOT_TIMEOUT = 120
# DOT attributes of the drawing's nodes that are not op handles
_VAR_NODES = {"var": "shape=ellipse, fontsize=8",
              "ref": 'shape=ellipse, fontsize=8, style=dashed, color="#777777"',
              "after": 'shape=plaintext, fontsize=7, fontcolor="#777777"'}


def op_section(op):
    """Which part of a training step op handle ``op`` belongs to (one of ``SECTIONS``)."""
    return op.section()


def select_ops(graph, collapse=False, sections=None, pattern=None):
    """The op handles to draw (see the module docstring), in id order.

    Parameters
    ----------
    collapse : bool
        Keep only place 0's per-place handles (and every collective and fetch).
    sections : iterable of str, optional
        Keep handles whose ``op_section`` is one of these.
    pattern : str, optional
        A regular expression; keep handles whose name, op type or any var
        name they read or write matches (``re.search``).
    """
    if sections is not None:
        sections = set(sections)
        bad = sections - set(SECTIONS)
        if bad:
            raise SSAExecError(f"unknown section {sorted(bad)[0]!r}; choose from "
                               f"{', '.join(SECTIONS)}")
    rx = None
    if pattern:
        try:
            rx = re.compile(pattern)
        except re.error as e:
            raise SSAExecError(f"bad --filter pattern {pattern!r}: {e}") from None
    keep = []
    for op in graph.ops:
        if collapse and op.on_one_place and op.place_idx != 0:
            continue
        if sections is not None and op_section(op) not in sections:
            continue
        if rx is not None:
            texts = [op.name, op.op_type]
            texts += [v.name for v in op.inputs + op.outputs if not v.is_dummy]
            if not any(rx.search(t) for t in texts):
                continue
        keep.append(op)
    return keep


def find_dot():
    """Path of the Graphviz ``dot`` binary, or None (``$SSAEXEC_DOT`` overrides PATH)."""
    override = os.environ.get(DOT_ENV)
    if override is not None:
        if override and os.path.isfile(override) and os.access(override, os.X_OK):
            return override
        return shutil.which(override) if override and os.sep not in override else None
    return shutil.which("dot")


def _format_of(path):
    fmt = os.path.splitext(str(path))[1].lower().lstrip(".")
    if fmt not in FORMATS:
        raise SSAExecError(f"{path}: cannot draw a {fmt or 'suffix-less'} file; use one of "
                           + ", ".join("." + f for f in FORMATS))
    return fmt


# --- the drawn graph -------------------------------------------------------------------------

def _var_id(v):
    return f"var:{v.place}:{v.name}@v{v.version}"


def drawn_graph(graph, ops=None, collapse=False, show_vars=True, split=None):
    """The ``networkx.DiGraph`` both engines draw.

    Nodes: ``op:<id>`` (``kind`` is the handle kind), with ``show_vars``
    ``var:<place>:<name>@v<k>`` (kind ``var``), and after cutting long edges
    ``ref:<k>`` (kind ``ref``: a copy of a var next to a distant reader) and
    ``after:<k>`` (kind ``after``: the far end of a cut dummy edge). Every node
    has ``label``, ``band`` (place index; None for handles spanning every
    place) and ``level`` (row, top = 0). Edges have ``dummy`` (bool) and
    ``label`` (the hazard reason on dummy edges, the var on op-to-op edges).

    Parameters
    ----------
    ops : list of OpHandle, optional
        The op handles to draw (default: all).
    collapse : bool
        Draw only place 0's vars (use with ``select_ops(collapse=True)``).
    show_vars : bool
        Var nodes, or op-to-op edges labelled by var.
    split : bool, optional
        Cut edges longer than ``SPLIT_SPAN`` levels; default: when all edges
        together cross more than ``SPLIT_COST`` levels.
    """
    ops = list(graph.ops) if ops is None else list(ops)
    kept = {op.id for op in ops}
    g = nx.DiGraph()
    for op in ops:
        band = op.place_idx if op.on_one_place else None
        g.add_node(f"op:{op.id}", kind=op.kind, label=op.name, band=band, color=op.color)

    def add_var(v):
        vid = _var_id(v)
        if vid not in g:
            g.add_node(vid, kind="var", label=f"{v.name}@v{v.version}", band=v.place_idx)
        return vid

    for op in ops:
        me = f"op:{op.id}"
        for v in op.inputs:
            src = v.generated_op
            if v.is_dummy:
                if src is not None and src.id in kept:
                    g.add_edge(f"op:{src.id}", me, dummy=True, label=v.reason)
                continue
            if collapse and v.place_idx != 0:
                continue
            if show_vars:
                g.add_edge(add_var(v), me, dummy=False, label=None)
            elif src is not None and src.id in kept:
                g.add_edge(f"op:{src.id}", me, dummy=False, label=f"{v.name}@v{v.version}")
        if show_vars:
            for v in op.outputs:
                if not v.is_dummy and not (collapse and v.place_idx != 0):
                    g.add_edge(me, add_var(v), dummy=False, label=None)
    layer_levels(g)
    if split is None:
        lv = g.nodes
        split = sum(max(0, lv[v]["level"] - lv[u]["level"] - 1)
                    for u, v in g.edges) > SPLIT_COST
    if split and _split_long_edges(g, SPLIT_SPAN):
        layer_levels(g)
    return g


def layer_levels(g):
    """Set ``level`` on every node: longest-path depth, sources moved next to their readers.

    Sources (version-0 vars, the loss-grad seed, copies) and whatever hangs
    only from them sit right above their first reader instead of at the top.
    """
    level = {}
    for depth, nodes in enumerate(nx.topological_generations(g)):
        for v in nodes:
            level[v] = depth
    order = list(nx.topological_sort(g))
    movable = set()
    for v in order:
        if all(u in movable for u in g.predecessors(v)):
            movable.add(v)
    for v in reversed(order):
        if v in movable and g.out_degree(v) > 0:
            level[v] = min(level[w] for w in g.successors(v)) - 1
    nx.set_node_attributes(g, level, "level")
    return level


def _split_long_edges(g, span):
    cut = 0
    for u, v, d in list(g.edges(data=True)):
        if g.nodes[v]["level"] - g.nodes[u]["level"] <= span:
            continue
        src = g.nodes[u]
        if src["kind"] in ("var", "ref"):  # drawing nodes, not handle kinds
            node = f"ref:{cut}"
            g.add_node(node, kind="ref", label=src["label"], band=g.nodes[v]["band"], of=u)
        else:
            reason = f" ({d['label']})" if d.get("label") else ""
            node = f"after:{cut}"
            g.add_node(node, kind="after", label=f"after #{u.split(':', 1)[1]}{reason}",
                       band=g.nodes[v]["band"], of=u)
        g.remove_edge(u, v)
        g.add_edge(node, v, dummy=d["dummy"], label=None)
        if g.degree(u) == 0:
            g.remove_node(u)
        cut += 1
    return cut


# --- Graphviz --------------------------------------------------------------------------------

def _q(s):
    return '"' + str(s).replace("\\", "\\\\").replace('"', '\\"') + '"'


def _dot_node(v, d):
    if "color" in d:  # an op handle
        attrs = f"shape=box, style=filled, fillcolor={_q(d['color'])}"
    else:
        attrs = _VAR_NODES[d["kind"]]
    return f"{_q(v)} [label={_q(d['label'])}, {attrs}];"


def _legend_kinds(g):
    """Handle classes drawn in ``g``, in the order of ``HANDLE_KINDS``."""
    drawn = {d["kind"] for _, d in g.nodes(data=True) if "color" in d}
    return [cls for k, cls in HANDLE_KINDS.items() if k in drawn]


def dot_source(graph, ops=None, collapse=False, show_vars=True, split=None):
    """Graphviz DOT text of ``drawn_graph(...)``, with a legend; node ids are node names."""
    g = drawn_graph(graph, ops, collapse, show_vars, split)
    big = g.number_of_nodes() > BIG_NODES
    lines = ["digraph ssa {", "  rankdir=TB;"]
    if big:
        # ranking with clusters and x placement by network simplex are the slow parts on
        # big graphs (newrank ranks globally; it reorders clusters, so small graphs go without)
        lines.append("  newrank=true; nslimit=2; nslimit1=2; mclimit=0.5;")
    lines += ['  node [fontname="Helvetica", fontsize=10, id="\\N"];',
              '  edge [fontname="Helvetica", fontsize=8];']
    by_band = {}
    for v, d in g.nodes(data=True):
        by_band.setdefault(d["band"], []).append((v, d))
    for band in sorted(b for b in by_band if b is not None):
        label = str(graph.places[band]) + (f" (x{len(graph.places)})" if collapse else "")
        lines.append(f"  subgraph cluster_place_{band} {{")
        lines.append(f'    label={_q(label)}; style=rounded; color="#888888";')
        lines.extend("    " + _dot_node(v, d) for v, d in by_band[band])
        lines.append("  }")
    lines.extend("  " + _dot_node(v, d) for v, d in by_band.get(None, []))
    for u, v, d in g.edges(data=True):
        attrs = []
        if d["dummy"]:
            attrs.append('style=dashed, color="#999999"')
        if d.get("label") and not big:
            attrs.append(f"label={_q(d['label'])}")
        lines.append(f"  {_q(u)} -> {_q(v)}" + (f" [{', '.join(attrs)}]" if attrs else "") + ";")
    lines.extend(_legend(_legend_kinds(g)))
    lines.append("}")
    return "\n".join(lines) + "\n"


def _legend(kinds):
    # a small cluster naming the colours of the handle classes ``kinds``, beside the graph
    if not kinds:
        return []
    lines = ["  subgraph cluster_legend {", '    label="handle kinds"; style=rounded; '
             'color="#bbbbbb"; fontsize=9;']
    names = []
    for cls in kinds:
        names.append(f"legend:{cls.kind}")
        lines.append(f'    "legend:{cls.kind}" [label="{cls.legend or cls.kind}", shape=box, '
                     f'style=filled, fillcolor="{cls.color}", fontsize=8];')
    lines.append('    "legend:dummy_a" [label="dummy", shape=plaintext, fontsize=8];')
    lines.append('    "legend:dummy_b" [label="edge", shape=plaintext, fontsize=8];')
    lines.append('    "legend:dummy_a" -> "legend:dummy_b" [style=dashed, color="#999999"];')
    for a, b in itertools.pairwise(names):
        lines.append(f'    "{a}" -> "{b}" [style=invis];')
    lines.append(f'    {{rank=same; {"; ".join(_q(n) for n in names)}; "legend:dummy_a";}}')
    lines.append("  }")
    return lines


def render(graph, path, ops=None, collapse=False, show_vars=True, use_dot=None, notify=None,
           timeout=DOT_TIMEOUT, dpi=None):
    """Draw ``graph`` (or just ``ops``) into ``path``; return the engine used.

    Parameters
    ----------
    path : str or os.PathLike
        ``.svg``, ``.png``, ``.pdf`` (a picture) or ``.dot`` (Graphviz text).
    ops : list of OpHandle, optional
        What to draw (``select_ops``); default every op handle.
    collapse : bool
        Draw only place 0's var nodes and label its cluster ``(xN)``.
    show_vars : bool
        Draw var nodes; otherwise op-to-op edges.
    use_dot : bool, optional
        True: require Graphviz; False: always matplotlib; None: Graphviz when found.
    notify : callable, optional
        Called with a one-line note when falling back to matplotlib.
    timeout : float
        Seconds Graphviz may take before the matplotlib fallback takes over
        (with ``use_dot=True``, an error instead).
    dpi : int, optional
        Resolution of a PNG (default: Graphviz's 96, the fallback's 110).

    Returns
    -------
    str
        ``"dot-text"``, ``"graphviz"`` or ``"matplotlib"``.
    """
    fmt = _format_of(path)
    if fmt == "dot":
        _write_text(path, dot_source(graph, ops, collapse, show_vars))
        return "dot-text"
    name = os.path.basename(str(path))
    dot = find_dot() if use_dot is not False else None
    if dot is None and use_dot:
        raise SSAExecError(f"Graphviz 'dot' not found (install graphviz or set ${DOT_ENV})")
    if dot is not None:
        text = dot_source(graph, ops, collapse, show_vars)
        try:
            extra = [f"-Gdpi={int(dpi)}"] if dpi and fmt == "png" else []
            proc = subprocess.run([dot, f"-T{fmt}", *extra, "-o", str(path)], input=text,
                                  capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            if use_dot:
                raise SSAExecError(f"Graphviz 'dot' took longer than {timeout:g} s; draw less "
                                   "(--collapse, --block, --filter, --no-vars)") from None
            if notify is not None:
                notify(f"Graphviz 'dot' took longer than {timeout:g} s; drawing {name} with "
                       "matplotlib instead (--collapse, --block or --filter draw less)")
            dot = None
        except OSError as e:
            raise SSAExecError(f"Graphviz 'dot' ({dot}) failed: {e}") from None
        else:
            if proc.returncode != 0:
                msg = (proc.stderr or "").strip().splitlines()
                raise SSAExecError(f"Graphviz 'dot' ({dot}) failed with status "
                                   f"{proc.returncode}: {msg[-1] if msg else 'no message'}")
            return "graphviz"
    elif notify is not None and use_dot is None:
        notify(f"Graphviz 'dot' not found (install graphviz or set ${DOT_ENV}); "
               f"drawing {name} with matplotlib instead")
    _draw_matplotlib(graph, drawn_graph(graph, ops, collapse, show_vars), path, fmt, collapse,
                     dpi)
    return "matplotlib"


def _write_text(path, text):
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        raise SSAExecError(f"{path}: cannot write: {e.strerror or e}") from None


# --- the matplotlib fallback -----------------------------------------------------------------

_GAP = 3.0          # characters between neighbours in a row
_LEVEL_IN = 0.42    # inches per level
_FONT = 7.0         # points
_CHAR_IN = _FONT * 0.62 / 72.0  # DejaVu Sans: about 0.6 em per character
_BOX_H = 0.2        # half a node box's height, in levels


def _node_width(d):
    return len(d["label"]) + 2.0


def _positions(g, bands):
    """x in characters (rows packed per band, ordered by predecessors' mean x), y = -level."""
    rows = {}
    for v, d in g.nodes(data=True):
        rows.setdefault((d["level"], d["band"]), []).append(v)

    def row_width(nodes):
        return sum(_node_width(g.nodes[v]) for v in nodes) + _GAP * (len(nodes) - 1)

    band_width = {b: 10.0 for b in bands}
    for (_, b), nodes in rows.items():
        band_width[b] = max(band_width[b], row_width(nodes))
    offset, x0 = {}, 0.0
    for b in bands:
        offset[b] = x0
        x0 += band_width[b] + 4 * _GAP
    pos = {}
    for depth in sorted({lv for lv, _ in rows}):
        for b in bands:
            nodes = rows.get((depth, b))
            if not nodes:
                continue

            def bary(v):
                xs = [pos[u][0] for u in g.predecessors(v) if u in pos]
                return (sum(xs) / len(xs)) if xs else math.inf, v
            nodes.sort(key=bary)
            x = offset[b] + (band_width[b] - row_width(nodes)) / 2.0
            for v in nodes:
                w = _node_width(g.nodes[v])
                pos[v] = (x + w / 2.0, -float(depth))
                x += w + _GAP
    return pos, offset, band_width, x0 - 4 * _GAP


def _edge_geometry(g, pos):
    """Edge segments clipped to the node boxes, and arrowhead triangles, in data units."""
    half_h = _BOX_H
    segs, dummy, heads = [], [], []
    sx, sy = _CHAR_IN, _LEVEL_IN  # inches per data unit

    def clip(p, q, d):
        # where the segment p->q leaves the box of size d around p
        dx, dy = q[0] - p[0], q[1] - p[1]
        hw = (len(d["label"]) + 1.2) / 2.0
        t = min(hw / abs(dx) if dx else math.inf, half_h / abs(dy) if dy else math.inf, 0.45)
        return p[0] + t * dx, p[1] + t * dy

    for u, v, d in g.edges(data=True):
        p, q = pos[u], pos[v]
        a = clip(p, q, g.nodes[u])
        b = clip(q, p, g.nodes[v])
        (dummy if d["dummy"] else segs).append((a, b))
        # a triangle at b pointing along a->b, 0.07 x 0.05 inches
        ix, iy = (b[0] - a[0]) * sx, (b[1] - a[1]) * sy
        n = math.hypot(ix, iy) or 1.0
        ux, uy = ix / n, iy / n
        L, W = 0.07, 0.03
        base = (b[0] - ux * L / sx, b[1] - uy * L / sy)
        heads.append([b, (base[0] - uy * W / sx, base[1] + ux * W / sy),
                      (base[0] + uy * W / sx, base[1] - ux * W / sy)])
    return segs, dummy, heads


def _box(x, y, d):
    hw = (len(d["label"]) + 1.2) / 2.0
    return [(x - hw, y - _BOX_H), (x + hw, y - _BOX_H), (x + hw, y + _BOX_H), (x - hw, y + _BOX_H)]


def _draw_matplotlib(graph, g, path, fmt, collapse, dpi=None):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.collections import LineCollection, PolyCollection
        from matplotlib.lines import Line2D
        from matplotlib.patches import FancyBboxPatch, Patch
    except ImportError:
        raise SSAExecError("drawing without Graphviz needs matplotlib: pip install matplotlib, "
                           "or install graphviz") from None
    places = sorted({d["band"] for _, d in g.nodes(data=True) if d["band"] is not None})
    bands = list(places)
    if any(d["band"] is None for _, d in g.nodes(data=True)) or not bands:
        bands.insert((len(places) + 1) // 2, None)  # collectives between the places
    pos, offset, band_width, width = _positions(g, bands)
    depth = 1 + max((-y for _, y in pos.values()), default=0)
    legend_in = 0.35
    fig_w = max(6.0, min(width * _CHAR_IN + 0.5, 400.0))
    graph_h = min(depth * _LEVEL_IN + 0.6, 400.0)
    fig_h = max(3.0, graph_h + legend_in)
    with plt.rc_context({"svg.fonttype": "none", "font.family": "DejaVu Sans"}):
        fig = plt.figure(figsize=(fig_w, fig_h))
        # the graph above, a strip for the legend below; no bbox_inches="tight": it draws twice
        ax = fig.add_axes((0.0, legend_in / fig_h, 1.0, 1.0 - legend_in / fig_h))
        ax.set_xlim(-2.0, width + 2.0)
        ax.set_ylim(-depth - 0.3, 1.3)
        ax.axis("off")
        for b in bands:
            if b is None:
                continue
            ys = [pos[v][1] for v, d in g.nodes(data=True) if d["band"] == b]
            if not ys:
                continue
            top, bottom = max(ys) + 0.5, min(ys) - 0.5
            box = FancyBboxPatch((offset[b] - 1.0, bottom), band_width[b] + 2.0, top - bottom,
                                 boxstyle="round,pad=0,rounding_size=0.4", fc="#f7f7f7",
                                 ec="#888888", lw=0.8, zorder=0,
                                 mutation_aspect=_LEVEL_IN / _CHAR_IN)
            box.set_gid(f"cluster:{graph.places[b]}")
            ax.add_patch(box)
            label = str(graph.places[b]) + (f" (x{len(graph.places)})" if collapse else "")
            ax.text(offset[b] + band_width[b] / 2.0, top + 0.1, label, ha="center",
                    va="bottom", fontsize=_FONT + 2, fontweight="bold", color="#555555")
        segs, dummy, heads = _edge_geometry(g, pos)
        ax.add_collection(LineCollection(segs, colors="#444444", linewidths=0.6, zorder=1))
        ax.add_collection(LineCollection(dummy, colors="#999999", linewidths=0.6, zorder=1,
                                         linestyles=[(0, (3, 2))]))
        ax.add_collection(PolyCollection(heads, facecolors="#444444", edgecolors="none",
                                         zorder=1))
        # node boxes as three collections (one artist each: thousands of patches are slow)
        op_boxes, op_colors, var_boxes, ref_boxes = [], [], [], []
        boxes = {"var": var_boxes, "ref": ref_boxes, "after": []}
        for v, d in g.nodes(data=True):
            x, y = pos[v]
            if "color" in d:
                op_boxes.append(_box(x, y, d))
                op_colors.append(d["color"])
            else:
                boxes[d["kind"]].append(_box(x, y, d))
        ax.add_collection(PolyCollection(var_boxes, facecolors="white", edgecolors="#777777",
                                         linewidths=0.5, zorder=2))
        ax.add_collection(PolyCollection(ref_boxes, facecolors="white", edgecolors="#777777",
                                         linewidths=0.5, linestyles=[(0, (2, 2))], zorder=2))
        ax.add_collection(PolyCollection(op_boxes, facecolors=op_colors, edgecolors="#333333",
                                         linewidths=0.6, zorder=2))
        for v, d in g.nodes(data=True):
            x, y = pos[v]
            small = "color" not in d
            ax.text(x, y, d["label"], ha="center", va="center", gid=v, zorder=3,
                    fontsize=_FONT - 1 if small else _FONT,
                    color="#777777" if d["kind"] in ("after",) else "black")
        handles = [Patch(fc=cls.color, ec="#333333", label=cls.legend or cls.kind)
                   for cls in _legend_kinds(g)]
        if handles:
            handles.append(Line2D([], [], color="#999999", ls=(0, (3, 2)), label="dummy edge"))
            fig.legend(handles=handles, loc="lower center", fontsize=_FONT + 1, frameon=False,
                       ncol=min(len(handles), 7))
        dpi = dpi or 110
        if fmt == "png":  # at most about 40 megapixels and 30000 pixels a side
            dpi = max(12, min(dpi, int(math.sqrt(40e6 / (fig_w * fig_h))),
                              int(30000 / max(fig_w, fig_h))))
        try:
            fig.savefig(path, format=fmt, dpi=dpi)
        except OSError as e:
            raise SSAExecError(f"{path}: cannot write: {e.strerror or e}") from None
        finally:
            plt.close(fig)
