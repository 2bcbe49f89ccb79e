"""The interactive explorer: one self-contained HTML page of an SSA graph (and a trace).

``write_explorer(graph, path, trace=None)`` writes a page that opens offline in a
browser: the page's script and style (``explorer.js``, ``explorer.css`` beside this
module, package data), the graph library it draws with (Cytoscape.js, pinned and
vendored with its licence in ``vendor/``, see ``vendor/README.md``) and the graph's
data (JSON) are inlined into ``explorer.html``; nothing is fetched when it opens.

Cytoscape.js draws the graph: one node per op handle, one compound node per group
(collapsing a group hides its handles and leaves a box), pan, zoom, selection and
highlight classes. It is given preset positions, not one of its layouts: the page
must open a ResNet-50 graph on 8 places (about 5,000 op handles and 15,000 edges)
in a couple of seconds, collapsed into groups that expand in place, and a layered
layout in the browser (dagre, ELK) takes tens of seconds on graphs that size and
moves everything when a group opens. So the layout comes from what the SSA graph
already knows, computed here once (ranks and slots) and placed by the page:

* **columns** are lanes: one per place, and one in the middle for the handles that
  span every place (collectives, fetches);
* **rows** are phases of the step: forward, backward, optimize (then any other
  section). A place's handle goes in the row of its ``section()``; a spanning
  handle goes in the row of its latest one-place producer, so an all-reduce sits
  beside the backward op that made its gradient;
* a **group** is one (lane, section, row) cell. Inside a row every handle has a
  *rank*: the dense rank of its level (longest path from the sources, see
  ``graph.analysis.op_levels``) among the row's handles, so the places' replicas
  line up and every edge inside a row points down. Handles of one group sharing
  a rank get *slots* side by side, ordered by their producers' slots;
* collapsed, a group is one box; the page recomputes only the row heights and
  column widths when a group opens or closes.

The data (``explorer_data``) is plain JSON: ``meta`` (program, places, strategy),
``kinds`` (legend), ``lanes``, ``rows``, ``groups``, ``ops`` (name, kind, op type,
place, section, stream, group, rank, slot, inputs/outputs by slot, dummy edges,
``details()``, attributes), ``vars`` (every version of every var on every place:
writer and readers), ``names`` (declared shape, dtype, persistable), ``dummies``
(reason, writer, readers) and, with a trace, ``trace`` (``trace_summary``). It is
embedded in a ``<script type="application/json">`` with ``<``, ``>`` and ``&``
escaped, so no var name can close the script.

A trace is the Chrome-trace dict of ``ssaexec trace`` (``ssaexec.execution.step_trace``): its
``X`` events carry ``args.op_id``. ``trace_summary`` checks it belongs to the graph
(same op handles, same names), takes each handle's mean duration over the traced
steps, and the critical path of the step weighted by those durations
(``graph.analysis.critical_path``).

Opening ``page.html#selftest`` runs the page's self-check and writes its results
as JSON into ``<pre id="selftest">`` (the browser tests read them with Chromium's
``--dump-dom``); see ``explorer.js``.
"""

import json
import re
from importlib import resources

from ..core.errors import ProgramError, SSAExecError
from ..core.safe_files import read_regular
from .analysis import critical_path, op_levels
from .ssa import ComputationOpHandle

__all__ = ["explorer_data", "explorer_html", "write_explorer", "trace_summary",
           "load_trace", "ROW_ORDER", "COLLAPSE_ABOVE", "CYTOSCAPE_VERSION"]

ROW_ORDER = ("forward", "backward", "optimize")
COLLAPSE_ABOVE = 400    # graphs with more op handles open with every group collapsed
_ATTR_CHARS = 200       # longest attribute value shown, in characters
_SPAN = -1              # the lane of handles that span every place
CYTOSCAPE_VERSION = "3.34.4"    # vendor/cytoscape.min.js (npm cytoscape, MIT; vendor/README.md)
_LIBRARY = "vendor/cytoscape.min.js"


# --- the data --------------------------------------------------------------------------------

def _attr_text(v):
    if isinstance(v, (bool, int, float, str)) or v is None:
        text = json.dumps(v)
    elif isinstance(v, list) and all(isinstance(x, (bool, int, float, str)) or x is None
                                     for x in v):
        text = json.dumps(v)
    elif hasattr(v, "idx"):  # BlockRef
        text = f"block {v.idx}"
    else:
        text = repr(v)
    return text if len(text) <= _ATTR_CHARS else text[:_ATTR_CHARS - 3] + "..."


def _jsonable(v):
    try:
        json.dumps(v)
        return v
    except (TypeError, ValueError):
        return _attr_text(v)


def _strategy(graph):
    s = graph.strategy
    if s is None:
        return {}
    out = {}
    for name in getattr(s, "__slots__", ()):
        v = getattr(s, name, None)
        if name == "debug_graphviz_path":
            continue
        out[name] = v if isinstance(v, (bool, int, float, str)) or v is None else repr(v)
    return out


def _rows_and_groups(graph, levels):
    """Row, group, rank and slot of every op handle (see the module docstring)."""
    ops = graph.ops
    rows = list(ROW_ORDER)
    row_of = [0] * len(ops)

    def row_index(name):
        if name not in rows:
            rows.append(name)
        return rows.index(name)

    for op in graph.topological_order():
        if op.on_one_place:
            row_of[op.id] = row_index(op.section())
        else:
            prods = [p for p in op.producers() if p.on_one_place]
            if prods:
                last = max(prods, key=lambda p: (levels[p.id], p.id))
                row_of[op.id] = row_of[last.id]
            else:
                row_of[op.id] = row_index(op.section())
    group_key, groups = {}, []
    group_of = [0] * len(ops)
    for op in ops:
        lane = op.place_idx if op.on_one_place else _SPAN
        key = (lane, op.section(), row_of[op.id])
        g = group_key.get(key)
        if g is None:
            g = group_key[key] = len(groups)
            groups.append({"lane": lane, "section": key[1], "row": key[2], "ops": []})
        group_of[op.id] = g
        groups[g]["ops"].append(op.id)
    # rank: dense rank of the level among the row's handles
    rank = [0] * len(ops)
    by_row = {}
    for op in ops:
        by_row.setdefault(row_of[op.id], set()).add(levels[op.id])
    dense = {r: {lv: k for k, lv in enumerate(sorted(lvs))} for r, lvs in by_row.items()}
    for op in ops:
        rank[op.id] = dense[row_of[op.id]][levels[op.id]]
    # slots: handles of one group sharing a rank side by side, by their producers' slots
    slot = [0] * len(ops)
    for grp in groups:
        at_rank = {}
        for i in grp["ops"]:
            at_rank.setdefault(rank[i], []).append(i)
        width = 1
        for r in sorted(at_rank):
            members = at_rank[r]
            if len(members) > 1:
                def bary(i, g=group_of[members[0]]):
                    xs = [slot[p.id] for p in ops[i].producers() if group_of[p.id] == g]
                    return (sum(xs) / len(xs) if xs else float("inf"), i)
                members.sort(key=bary)
            for k, i in enumerate(members):
                slot[i] = k
            width = max(width, len(members))
        ranks = [rank[i] for i in grp["ops"]]
        grp.update(min_rank=min(ranks), max_rank=max(ranks), slots=width)
    return rows, groups, group_of, rank, slot


def _group_label(graph, grp, rows, clash):
    lane = "all places" if grp["lane"] == _SPAN else str(graph.places[grp["lane"]])
    label = f"{lane} · {grp['section']}"
    if clash:
        label += f" ({rows[grp['row']]})"
    return label


def explorer_data(graph, trace=None, title=None, source=None):
    """The JSON-ready data of the explorer page (see the module docstring).

    Parameters
    ----------
    graph : SSAGraph
    trace : dict, optional
        A Chrome trace of this graph (``ssaexec trace``, ``TraceResult.to_chrome()``).
    title : str, optional
        The page's title (default: ``source`` or "SSA graph").
    source : str, optional
        Where the program came from (its file), shown in the header.
    """
    ops = graph.ops
    levels = op_levels(graph)
    rows, groups, group_of, rank, slot = _rows_and_groups(graph, levels)
    seen_lane_section = {}
    for grp in groups:
        k = (grp["lane"], grp["section"])
        seen_lane_section[k] = seen_lane_section.get(k, 0) + 1
    for grp in groups:
        grp["label"] = _group_label(graph, grp, rows,
                                    seen_lane_section[(grp["lane"], grp["section"])] > 1)
    block = graph.program.global_block()
    names, name_idx = [], {}

    def name_index(name):
        k = name_idx.get(name)
        if k is None:
            k = name_idx[name] = len(names)
            d = block.find_var(name)
            if d is None:
                names.append([name, None, None, ""])
            else:
                flags = ("P" if d.is_parameter else "") + ("S" if d.persistable else "") + \
                        ("D" if d.is_data else "")
                names.append([name, d.shape, d.dtype, flags])
        return k

    var_idx, var_rows = {}, []
    for pi, by_name in enumerate(graph.vars):
        for name, versions in by_name.items():
            n = name_index(name)
            for v in versions:
                var_idx[id(v)] = len(var_rows)
                var_rows.append([n, pi, v.version,
                                 v.generated_op.id if v.generated_op is not None else -1,
                                 [r.id for r in v.pending_ops]])
    dummy_idx, dummy_rows = {}, []
    for d in graph.dummies:
        dummy_idx[id(d)] = len(dummy_rows)
        dummy_rows.append([d.name, d.reason,
                           d.generated_op.id if d.generated_op is not None else -1,
                           [r.id for r in d.pending_ops]])

    def slots_of(handle, vars_, desc_slots):
        by_name = {}
        for v in vars_:
            if not v.is_dummy:
                by_name.setdefault(v.name, []).append(v)
        out, used = [], set()
        for slot_name, slot_vars in (desc_slots or {}).items():
            for name in slot_vars:
                for v in by_name.get(name, ()):
                    if id(v) not in used:
                        used.add(id(v))
                        out.append([slot_name, var_idx[id(v)]])
        for v in vars_:
            if not v.is_dummy and id(v) not in used:
                out.append(["" if desc_slots is None else "(sub-block)", var_idx[id(v)]])
        return out

    op_rows, kinds_used = [], {}
    for op in ops:
        desc = op.op if isinstance(op, ComputationOpHandle) else None
        row = {"n": op.name, "k": op.kind, "t": op.op_type,
               "p": op.place_idx if op.on_one_place else _SPAN,
               "s": op.section(), "st": op.stream, "g": group_of[op.id],
               "r": rank[op.id], "x": slot[op.id], "lv": levels[op.id],
               "i": slots_of(op, op.inputs, desc.inputs if desc is not None else None),
               "o": slots_of(op, op.outputs, desc.outputs if desc is not None else None),
               "di": [dummy_idx[id(v)] for v in op.inputs if v.is_dummy and id(v) in dummy_idx],
               "do": [dummy_idx[id(v)] for v in op.outputs
                      if v.is_dummy and id(v) in dummy_idx],
               "d": {k: _jsonable(v) for k, v in op.details().items()}}
        if desc is not None:
            row["a"] = {k: _attr_text(v) for k, v in desc.attrs.items()}
        if op.is_collective:
            row["c"] = 1
        op_rows.append(row)
        cls = type(op)
        kinds_used.setdefault(op.kind, {"kind": op.kind, "legend": cls.legend or op.kind,
                                        "color": cls.color, "stream": cls.stream, "count": 0})
        kinds_used[op.kind]["count"] += 1
    n = len(graph.places)
    lanes = list(range(n // 2 + n % 2)) + ([_SPAN] if any(g["lane"] == _SPAN for g in groups)
                                           else []) + list(range(n // 2 + n % 2, n))
    places = [str(p) for p in graph.places]
    data = {
        "meta": {"title": title or source or "SSA graph", "source": source,
                 "places": places, "strategy": _strategy(graph),
                 "ops": len(ops), "vars": len(var_rows), "dummies": len(dummy_rows),
                 "collectives": len(graph.collectives),
                 "collapsed": len(ops) > COLLAPSE_ABOVE},
        "kinds": list(kinds_used.values()),
        "lanes": [{"lane": lane, "label": "all places" if lane == _SPAN else places[lane]}
                  for lane in lanes],
        "rows": rows,
        "groups": [{k: g[k] for k in ("lane", "section", "row", "label", "min_rank",
                                      "max_rank", "slots")} | {"n": len(g["ops"])}
                   for g in groups],
        "ops": op_rows, "vars": var_rows, "names": names, "dummies": dummy_rows,
        "trace": trace_summary(graph, trace) if trace is not None else None,
    }
    return data


# --- traces ----------------------------------------------------------------------------------

def load_trace(path):
    """Read a Chrome-trace JSON file (``SSAExecError`` naming the file when it is not one).

    A trace file is untrusted data like a program: it is read with the program
    reader's bounded JSON scan (``program.json_scan``: nesting within ``max_nesting``
    measured before parsing, no ``NaN``/``Infinity``, no overlong integers), so a
    hostile trace is a ``ProgramError`` naming the file and ``FILE:LINE:COL``, never a
    crash.
    """
    from ..program.json_scan import load_bounded
    try:
        text = read_regular(path).decode("utf-8")  # a FIFO: refused, not waited on
    except OSError as e:
        raise SSAExecError(f"{path}: cannot read trace: {e.strerror or e}") from None
    except ValueError as e:  # not UTF-8
        raise SSAExecError(f"{path}: not a JSON trace: {e}") from None
    try:
        doc = load_bounded(text, str(path))
    except ProgramError as e:
        raise ProgramError(f"{path}: not a JSON trace ({e})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise SSAExecError(f"{path}: not a Chrome trace (no 'traceEvents' list); write one "
                           "with 'ssaexec trace'")
    return doc


def trace_summary(graph, trace):
    """What the page shows of a trace: slices, mean durations, the critical path.

    Returns a dict: ``events`` (``[op_id, step, ts_us, dur_us]`` per slice),
    ``steps`` (``[step, ts_us, dur_us]``), ``mean_us`` (per op id; -1 when the
    handle never ran alone), ``critical`` (op ids of the duration-weighted critical
    path) and ``critical_us`` (its length). ``SSAExecError`` when the trace was
    not taken of this graph.

    A trace of compiled segments (``ssaexec trace --compiler inductor``: slices with
    ``args.segment`` and ``args.op_ids``) also gives ``segments`` (``{"n": name,
    "ops": op ids, "mean_us"}`` each) and ``seg_of`` (per op id, its segment's index
    or -1); a segment's slice is ``[first op id, step, ts_us, dur_us, segment
    index]``, and on the critical path a segment weighs its time at its first op.
    """
    events = trace.get("traceEvents") if isinstance(trace, dict) else None
    if not isinstance(events, list):
        raise SSAExecError("not a Chrome trace: no 'traceEvents' list")
    other = trace.get("otherData") or {}
    n = len(graph.ops)
    if isinstance(other, dict) and isinstance(other.get("op_handles"), int) \
            and other["op_handles"] != n:
        raise SSAExecError(f"the trace has {other['op_handles']} op handles, the graph {n}: it "
                           "was taken of another program, places or strategy")
    slices, steps = [], []
    total, count = [0.0] * n, [0] * n
    segments, seg_index, seg_of = [], {}, [-1] * n
    for ev in events:
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            continue
        args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
        ts, dur = ev.get("ts"), ev.get("dur")
        if not isinstance(ts, (int, float)) or not isinstance(dur, (int, float)):
            continue
        step = args.get("step") if isinstance(args.get("step"), int) else 0
        if ev.get("cat") == "step":
            steps.append([step, ts, dur])
            continue
        if "segment" in args:
            k = _segment_slice(graph, ev, args, segments, seg_index, seg_of)
            seg = segments[k]
            slices.append([seg["ops"][0], step, ts, dur, k])
            seg["total"] += dur
            seg["count"] += 1
            continue
        op_id = args.get("op_id")
        if not isinstance(op_id, int) or isinstance(op_id, bool):
            continue
        if not 0 <= op_id < n or ev.get("name") != graph.ops[op_id].name:
            raise SSAExecError(f"trace event {ev.get('name')!r} (op id {op_id}) is not op "
                               "handle of this graph: the trace was taken of another "
                               "program, places or strategy")
        slices.append([op_id, step, ts, dur])
        total[op_id] += dur
        count[op_id] += 1
    if not slices:
        raise SSAExecError("the trace has no op slices (args.op_id); write one with "
                           "'ssaexec trace'")
    mean = [total[i] / count[i] if count[i] else -1 for i in range(n)]
    weight = [max(m, 0.0) for m in mean]
    for seg in segments:
        seg["mean_us"] = seg.pop("total") / seg.pop("count")
        weight[seg["ops"][0]] = seg["mean_us"]
    length, chain = critical_path(graph, weight=lambda op: weight[op.id])
    out = {"events": slices, "steps": sorted(steps), "mean_us": mean,
           "critical": [op.id for op in chain], "critical_us": length}
    if segments:
        out.update(segments=segments, seg_of=seg_of)
    return out


def _segment_slice(graph, ev, args, segments, seg_index, seg_of):
    """The index in ``segments`` of the compiled segment ``ev`` times (added when new),
    after checking that its ops are op handles of ``graph``."""
    ids, n = args.get("op_ids"), len(graph.ops)
    if not isinstance(ids, list) or not ids or not all(
            isinstance(i, int) and not isinstance(i, bool) and 0 <= i < n for i in ids) or \
            [graph.ops[i].name for i in ids] != args.get("ops"):
        raise SSAExecError(f"trace event {ev.get('name')!r} (segment {args.get('segment')}) "
                           "does not list op handles of this graph: the trace was taken of "
                           "another program, places or strategy")
    key = tuple(ids)
    k = seg_index.get(key)
    if k is None:
        k = seg_index[key] = len(segments)
        segments.append({"n": str(ev.get("name")), "ops": ids, "total": 0.0, "count": 0})
        for i in ids:
            seg_of[i] = k
    return k


# --- the page --------------------------------------------------------------------------------

def _asset(name):
    path = resources.files(__package__)
    for part in name.split("/"):
        path = path.joinpath(part)
    return path.read_text(encoding="utf-8")


def _library():
    # inlined in the page's <script>: it must not end that element (it never does; checked)
    text = _asset(_LIBRARY)
    if f'"{CYTOSCAPE_VERSION}"' not in text or "</script" in text.lower():
        raise SSAExecError(f"{_LIBRARY} is not Cytoscape.js {CYTOSCAPE_VERSION}, or cannot be "
                           "inlined in a <script>")
    return text


def _script_json(data):
    # inside <script>, "</script" or "<!--" would end or change the element: escape < > &
    text = json.dumps(data, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _html_text(s):
    return (str(s).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace('"', "&quot;"))


def explorer_html(graph, trace=None, title=None, source=None):
    """The explorer page as one HTML string (``explorer_data`` inlined with the assets)."""
    data = explorer_data(graph, trace=trace, title=title, source=source)
    page = _asset("explorer.html")
    parts = {"@TITLE@": _html_text(data["meta"]["title"]), "/*@CSS@*/": _asset("explorer.css"),
             "/*@LIB@*/": _library(), "/*@JS@*/": _asset("explorer.js"),
             "@DATA@": _script_json(data)}
    missing = [k for k in parts if k not in page]
    if missing:
        raise SSAExecError(f"explorer.html has no {missing[0]} placeholder")
    # one pass over the template: inserted text is never scanned for placeholders
    page = re.sub("|".join(re.escape(k) for k in parts), lambda m: parts[m.group(0)], page)
    return page


def write_explorer(graph, path, trace=None, title=None, source=None):
    """Write the explorer page of ``graph`` (and ``trace``) to ``path``; return its size.

    Parameters
    ----------
    graph : SSAGraph
    path : str or os.PathLike
    trace : dict, optional
        A Chrome trace of ``graph`` (``load_trace(file)`` or ``TraceResult.to_chrome()``).
    title, source : str, optional
        See ``explorer_data``.

    Returns
    -------
    int
        Bytes written.
    """
    page = explorer_html(graph, trace=trace, title=title, source=source)
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(page)
    except OSError as e:
        raise SSAExecError(f"{path}: cannot write: {e.strerror or e}") from None
    return len(page.encode("utf-8"))
