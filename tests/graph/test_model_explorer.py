"""``--format model-explorer``: the SSA graph for Google's Model Explorer (an optional extra).

Without the package the export says how to install it; with it, the files load back
through the package's own classes (``dacite.from_dict`` into ``graph_builder.Graph``,
as the package's node-data runner loads graphs) and its config accepts them.
"""

import json
from pathlib import Path

import pytest

import ssaexec as se
from ssaexec.core.errors import SSAExecError
from ssaexec.graph import model_explorer as me
from ssaexec.program.defaults import loss_var
from ssaexec.program.io import load_program

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def graph_of(name, places):
    program = load_program(EXAMPLES / name)
    return se.build_ssa_graph(program, places=se.cpu_places(places),
                              fetch_list=[loss_var(program)])


def fake_trace(graph):
    """A Chrome trace of ``graph`` in the shape ``ssaexec trace`` writes (1 µs per op id)."""
    events = [{"name": op.name, "ph": "X", "cat": op.kind, "pid": 1, "tid": 1,
               "ts": float(op.id), "dur": 1.0 + op.id, "args": {"step": 1, "op_id": op.id}}
              for op in graph.ops]
    return {"traceEvents": events, "otherData": {"op_handles": len(graph.ops)}}


def test_missing_package_says_how_to_install(monkeypatch, tmp_path):
    import builtins
    real = builtins.__import__

    def no_model_explorer(name, *a, **kw):
        if name.startswith("model_explorer"):
            raise ImportError(name)
        return real(name, *a, **kw)
    monkeypatch.setattr(builtins, "__import__", no_model_explorer)
    with pytest.raises(SSAExecError, match="pip install ai-edge-model-explorer"):
        me.write_model_explorer(graph_of("seed_mlp.json", 2), tmp_path / "g.json")


def test_namespaces_nest_place_section_and_module():
    g = graph_of("mnist_mlp.json", 2)
    spaces = {op.id: me.node_namespace(op, g) for op in g.ops}
    fc = next(op for op in g.ops if op.op_type == "mul" and op.place_idx == 1)
    assert spaces[fc.id] == "cpu:1/forward/fc_0"
    ar = next(op for op in g.ops if op.kind == "all_reduce")
    assert spaces[ar.id] == "all places/comm"
    assert all(s.split("/")[0] in {"cpu:0", "cpu:1", "all places"} for s in spaces.values())


def test_export_loads_through_the_package(tmp_path):
    pytest.importorskip("model_explorer", reason="ai-edge-model-explorer is not installed "
                        "(pip install ai-edge-model-explorer)")
    dacite = pytest.importorskip("dacite")
    import model_explorer
    from model_explorer import graph_builder, node_data_builder
    g = graph_of("mnist_mlp.json", 2)
    files = me.write_model_explorer(g, tmp_path / "graph.json", trace=fake_trace(g),
                                    source="mnist_mlp.json")
    assert [f.name for f in files] == ["graph.json", "graph.node_data.json"]
    doc = json.loads(files[0].read_text())
    assert doc["label"] == "mnist_mlp.json" and len(doc["graphs"]) == 1
    graph = dacite.from_dict(data_class=graph_builder.Graph, data=doc["graphs"][0])
    assert [n.id for n in graph.nodes] == [str(op.id) for op in g.ops]
    # every edge of the SSA graph, data and dummy, is an incoming edge
    edges = {(e.sourceNodeId, n.id) for n in graph.nodes for e in n.incomingEdges}
    expected = {(str(p.id), str(op.id)) for op in g.ops for p in op.producers()}
    assert edges == expected
    war = next(n for n in graph.nodes
               if any(a.key == "dummy edges in" and "war" in a.value for a in n.attrs))
    assert war.inputsMetadata[-1].attrs[0].value.startswith("dummy (")
    sgd = next(n for n in graph.nodes if n.label == "momentum")
    names = [a.value for m in sgd.outputsMetadata for a in m.attrs if a.key == "tensor_name"]
    assert any(v.endswith("@v1") for v in names)
    data = json.loads(files[1].read_text())
    nd = dacite.from_dict(data_class=node_data_builder.GraphNodeData, data=data["ssa"])
    assert len(nd.results) == len(g.ops) and nd.results["3"].value == 4.0
    cfg = model_explorer.config().add_model_from_path(str(files[0])) \
        .add_node_data_from_path(str(files[1]))
    assert cfg.has_data_to_encode_in_url()
