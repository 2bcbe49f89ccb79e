"""An SSA graph for Google's Model Explorer (``ai-edge-model-explorer``, an optional extra).

Model Explorer opens large graphs with collapsible layers and per-node data overlays;
``write_model_explorer(graph, path, trace=None)`` writes what it loads:

* **the graph** (``path``, JSON): one ``GraphCollection`` holding one ``Graph``,
  built with the package's own classes (``model_explorer.graph_builder``). Every op
  handle is a node (id: the handle id; label: the op type, or the kind for
  collectives and fetches). Its **namespace** nests ``place / section / module``
  (``cpu:0/backward/blocks/6/a/conv``; the module is the owner of the first
  parameter the handle reads or writes, ``.`` becoming ``/``), and ``all places/comm``
  for the handles that span every place, so each place, each phase of the step
  and each module is a layer that collapses. Node attributes: kind, op type,
  place, section, stream, level, the inputs and outputs with their versions, the
  dummy edges in and out with their reasons, ``details()`` and the op's attributes
  (``attr.NAME``); outputs carry their tensor name (``name@vK``), shape and dtype;
  dummy edges are incoming edges too, on input ids after the data inputs. Nodes are
  filled with the kind's colour.
* **node data** (with a trace; ``<stem>.node_data.json`` beside ``path``): the mean
  measured duration of each handle in microseconds (``model_explorer.node_data_builder``),
  with a colour gradient, for Model Explorer's node-data overlay.

Open them with ``model-explorer graph.json --node_data_paths=graph.node_data.json``.
The package is imported only here and only when asked for: ``SSAExecError`` says how
to install it when it is missing.
"""

import dataclasses
import json
from pathlib import Path

from ..core.errors import SSAExecError
from .analysis import op_levels
from .explorer import trace_summary
from .ssa import ComputationOpHandle

__all__ = ["model_explorer_graph", "model_explorer_node_data", "write_model_explorer",
           "node_namespace", "INSTALL_HINT"]

INSTALL_HINT = ("--format model-explorer needs Google's Model Explorer: pip install "
                "ai-edge-model-explorer (or ssaexec[model-explorer])")
_GRADIENT = (("0", "#dbeafe"), ("0.5", "#fde68a"), ("1", "#dc2626"))


def _builders():
    try:
        from model_explorer import graph_builder, node_data_builder
    except ImportError:
        raise SSAExecError(INSTALL_HINT) from None
    return graph_builder, node_data_builder


def _module_of(op, block):
    # the owner of the first parameter the handle reads or writes (its gradient counts)
    for v in op.inputs + op.outputs:
        if v.is_dummy:
            continue
        name = v.name.split("@", 1)[0]
        d = block.find_var(name)
        if d is not None and d.is_parameter:
            return name.rsplit(".", 1)[0] if "." in name else name
    return None


def node_namespace(op, graph):
    """The layers a handle sits in: ``place/section[/module/...]``."""
    place = str(graph.places[op.place_idx]) if op.on_one_place else "all places"
    parts = [place.replace("/", "_"), op.section()]
    module = _module_of(op, graph.program.global_block()) if isinstance(op, ComputationOpHandle) \
        else None
    if module:
        parts += [p for p in module.replace("/", "_").split(".") if p]
    return "/".join(parts)


def _strip_none(d):
    if isinstance(d, dict):
        return {k: _strip_none(v) for k, v in d.items() if v is not None}
    if isinstance(d, list):
        return [_strip_none(x) for x in d]
    return d


def model_explorer_graph(graph, label="ssaexec SSA graph", source=None):
    """The graph as a ``model_explorer.graph_builder.GraphCollection`` (module docstring)."""
    gb, _ = _builders()
    kv = gb.KeyValue
    block = graph.program.global_block()
    levels = op_levels(graph)
    nodes = []
    for op in graph.ops:
        data_in = [v for v in op.inputs if not v.is_dummy]
        dummy_in = [v for v in op.inputs if v.is_dummy]
        data_out = [v for v in op.outputs if not v.is_dummy]
        attrs = [kv("kind", op.kind), kv("op_type", op.op_type),
                 kv("place", str(graph.places[op.place_idx]) if op.on_one_place
                    else "all places"),
                 kv("section", op.section()), kv("stream", op.stream),
                 kv("level", str(levels[op.id])),
                 kv("inputs", ", ".join(f"{v.name}@v{v.version}" for v in data_in)),
                 kv("outputs", ", ".join(f"{v.name}@v{v.version}" for v in data_out))]
        if dummy_in:
            attrs.append(kv("dummy edges in", ", ".join(
                f"{d.reason} after #{d.generated_op.id}" for d in dummy_in)))
        after = [f"{d.reason} before #{r.id}" for d in op.outputs if d.is_dummy
                 for r in d.pending_ops]
        if after:
            attrs.append(kv("dummy edges out", ", ".join(after)))
        for key, value in op.details().items():
            if key in ("op_type", "kind"):
                continue
            attrs.append(kv(key, value if isinstance(value, str) else json.dumps(value)))
        desc = op.op if isinstance(op, ComputationOpHandle) else None
        if desc is not None:
            for key, value in desc.attrs.items():
                attrs.append(kv(f"attr.{key}", str(value)))
        edges = []
        for k, v in enumerate(data_in + dummy_in):
            src = v.generated_op
            if src is None:
                continue
            out_id = src.outputs.index(v)
            edges.append(gb.IncomingEdge(sourceNodeId=str(src.id),
                                         sourceNodeOutputId=str(out_id),
                                         targetNodeInputId=str(k)))
        inputs_meta = [gb.MetadataItem(id=str(k), attrs=[kv("__tensor_tag",
                                                            f"{v.name}@v{v.version}")])
                       for k, v in enumerate(data_in)]
        inputs_meta += [gb.MetadataItem(id=str(len(data_in) + k),
                                        attrs=[kv("__tensor_tag", f"dummy ({d.reason})")])
                        for k, d in enumerate(dummy_in)]
        outputs_meta = []
        for k, v in enumerate(op.outputs):
            if v.is_dummy:
                meta = [kv("tensor_name", v.name), kv("dummy", v.reason)]
            else:
                d = block.find_var(v.name)
                meta = [kv("tensor_name", f"{v.name}@v{v.version}")]
                if d is not None:
                    meta += [kv("shape", str(d.shape)), kv("dtype", d.dtype)]
            outputs_meta.append(gb.MetadataItem(id=str(k), attrs=meta))
        nodes.append(gb.GraphNode(
            id=str(op.id), label=op.op_type,
            namespace=node_namespace(op, graph), attrs=attrs, incomingEdges=edges,
            inputsMetadata=inputs_meta, outputsMetadata=outputs_meta,
            style=gb.GraphNodeStyle(backgroundColor=type(op).color)))
    strategy = graph.strategy
    info = {"places": ", ".join(str(p) for p in graph.places),
            "op handles": str(len(graph.ops)), "collectives": str(len(graph.collectives))}
    if source:
        info["program"] = str(source)
    if strategy is not None:
        info["strategy"] = repr(strategy)
    g = gb.Graph(id="ssa", nodes=nodes, groupNodeAttributes={"": info})
    return gb.GraphCollection(label=label, graphs=[g])


def model_explorer_node_data(graph, trace):
    """Mean measured duration (µs) of every handle, as ``node_data_builder.ModelNodeData``."""
    _, nd = _builders()
    summary = trace_summary(graph, trace)
    results = {str(i): nd.NodeDataResult(value=round(us, 3))
               for i, us in enumerate(summary["mean_us"]) if us >= 0}
    ran = [us for us in summary["mean_us"] if us >= 0]
    lo, hi = min(ran), max(ran)
    gradient = [nd.GradientItem(stop=float(stop), bgColor=color) for stop, color in _GRADIENT]
    data = nd.GraphNodeData(results=results, gradient=gradient,
                            name=f"mean time (µs), {lo:.1f} to {hi:.1f}")
    return nd.ModelNodeData(graphsData={"ssa": data})


def write_model_explorer(graph, path, trace=None, label=None, source=None):
    """Write the Model Explorer graph JSON to ``path`` (and node data with a trace).

    Returns
    -------
    list of pathlib.Path
        The files written: the graph, then ``<stem>.node_data.json`` with a trace.
    """
    path = Path(path)
    collection = model_explorer_graph(graph, label=label or (source or "ssaexec SSA graph"),
                                      source=source)
    written = [path]
    try:
        path.write_text(json.dumps(_strip_none(dataclasses.asdict(collection)),
                                   separators=(",", ":")), encoding="utf-8")
        if trace is not None:
            data_path = path.with_name(path.stem + ".node_data.json")
            data_path.write_text(model_explorer_node_data(graph, trace).to_json_string(),
                                 encoding="utf-8")
            written.append(data_path)
    except OSError as e:
        raise SSAExecError(f"{e.filename or path}: cannot write: {e.strerror or e}") from None
    return written
