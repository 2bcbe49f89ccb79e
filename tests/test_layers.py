"""One-way architecture: every import of ssaexec goes down the layers, and none goes round.

The layers, bottom to top (docs/architecture.md draws them):

    ground     errors, dtypes, place, limits, strategy  (import nothing of ours but errors)
    ops        the op registry (a leaf), schemas, the policy, the kernels
    program    ProgramDesc, its codecs and checks, the builder, backward, optimizers
    graph      SSA handles and graphs, building, aliasing, analysis, pictures
    runtime    scopes, prepared calls, the compiled runner, collectives, the scheduler,
               the host-sync detector (a leaf: nothing in the package imports it)
    executors  Executor, ParallelExecutor, feed policy, data loading, distributed
    tools      frontends, cli, bench, trace, models, synthetic data, demo, progress, and
               the package's public surface (ssaexec/__init__.py, __main__.py)

A module may import from its own layer or any layer below. Every import counts,
including those inside functions (they are real dependencies, only later). Within a
layer the imports must not form a cycle, except the few back-references listed in
``DEFERRED``, each with its reason.
"""

import ast
import pathlib

import networkx as nx
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent / "ssaexec"

LAYERS = ["ground", "ops", "program", "graph", "runtime", "executors", "tools"]

# module (or package prefix) -> layer; the longest matching prefix wins
PLACEMENT = {
    "ssaexec.errors": "ground", "ssaexec.dtypes": "ground", "ssaexec.place": "ground",
    "ssaexec.limits": "ground", "ssaexec.strategy": "ground",
    "ssaexec.ops": "ops",
    "ssaexec.program": "program",
    "ssaexec.graph": "graph",
    "ssaexec.runtime": "runtime",
    "ssaexec.executor": "executors", "ssaexec.parallel_executor": "executors",
    "ssaexec.feed": "executors", "ssaexec.data": "executors",
    "ssaexec.distributed": "executors", "ssaexec.checkpoint": "executors",
    "ssaexec.prefetch": "executors", "ssaexec.pserver": "executors",
    "ssaexec.frontends": "tools", "ssaexec.cli": "tools", "ssaexec.bench": "tools",
    "ssaexec.trace": "tools", "ssaexec.sim": "tools",
    "ssaexec.models": "tools", "ssaexec.synthetic": "tools", "ssaexec.demo": "tools",
    "ssaexec.progress": "tools",
    "ssaexec": "tools",
}

# Intra-layer back-references allowed to close a cycle: (importer, imported) -> reason.
DEFERRED = {
    ("ssaexec.program.desc", "ssaexec.program.validate"):
        "Program.validate() is the documented entry to the checks, which read the IR",
    ("ssaexec.program.desc", "ssaexec.program.serialize"):
        "Program.to_dict()/__eq__ use the JSON form, which builds the IR",
    ("ssaexec.program.desc", "ssaexec.program.text"):
        "print(program) shows the text form, whose parser builds the IR",
    ("ssaexec.graph.ssa", "ssaexec.graph.draw"):
        "graph.to_dot() is the documented shortcut to the one DOT writer, which reads "
        "the handle classes",
}


def module_name(path, root=ROOT):
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph(root=ROOT):
    """``networkx.DiGraph`` of imports between ssaexec modules (edges carry ``line``)."""
    files = {module_name(p, root): p for p in root.rglob("*.py")}
    g = nx.DiGraph()
    g.add_nodes_from(files)
    for mod, path in files.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[:len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                names = [target] + [f"{target}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            # "from . import x" names module x; "from .m import f" names module m
            hit = [n for n in names if n in files and n != mod]
            for n in hit[1:] if len(hit) > 1 and hit[0] == target else hit:
                g.add_edge(mod, n, line=node.lineno)
    return g


def layer_of(mod):
    best = max((p for p in PLACEMENT if mod == p or mod.startswith(p + ".")), key=len,
               default=None)
    if best is None:
        raise AssertionError(f"{mod} has no layer: add it to PLACEMENT in tests/test_layers.py")
    return LAYERS.index(PLACEMENT[best])


def problems(g):
    """Upward imports and intra-layer cycles of import graph ``g``, as readable lines."""
    out = []
    for a, b, d in g.edges(data=True):
        if layer_of(b) > layer_of(a):
            out.append(f"upward import: {a} (layer {LAYERS[layer_of(a)]}) imports {b} "
                       f"(layer {LAYERS[layer_of(b)]}) at line {d['line']}")
    same = nx.DiGraph((a, b) for a, b in g.edges
                      if layer_of(a) == layer_of(b) and (a, b) not in DEFERRED)
    for cycle in nx.simple_cycles(same):
        out.append("import cycle: " + " -> ".join(cycle + cycle[:1]))
    return out


def test_every_module_has_a_layer():
    for mod in import_graph().nodes:
        layer_of(mod)


def test_imports_go_down_the_layers_and_never_round():
    assert problems(import_graph()) == []


def test_the_deferred_back_references_still_exist():
    # a listed exception that is no longer needed should be removed from DEFERRED
    g = import_graph()
    assert [e for e in DEFERRED if not g.has_edge(*e)] == []


@pytest.mark.parametrize("planted, expect", [
    # the runtime reaching up into the executors
    ("ssaexec/runtime/scope.py", "upward import: ssaexec.runtime.scope"),
    # a deferred import inside a function is still a dependency
    ("ssaexec/ops/math.py", "upward import: ssaexec.ops.math"),
])
def test_a_planted_upward_import_is_found(tmp_path, planted, expect):
    import shutil
    copy = tmp_path / "ssaexec"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / pathlib.Path(planted).relative_to("ssaexec")
    with open(target, "a", encoding="utf-8") as f:
        f.write("\n\ndef _planted():\n    from ..parallel_executor import ParallelExecutor\n"
                "    return ParallelExecutor\n")
    found = problems(import_graph(copy))
    assert any(p.startswith(expect) for p in found), found


def test_a_planted_cycle_is_found(tmp_path):
    import shutil
    copy = tmp_path / "ssaexec"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns("__pycache__"))
    # the registry is a leaf; making it import a kernel module closes a cycle
    with open(copy / "ops" / "registry.py", "a", encoding="utf-8") as f:
        f.write("\n\ndef _planted():\n    from . import math\n    return math\n")
    found = problems(import_graph(copy))
    assert any(p.startswith("import cycle:") and "ssaexec.ops.registry" in p
               for p in found), found


def test_the_host_sync_detector_is_a_leaf_of_the_runtime():
    # it watches steps from outside (tests, make gpu-check, users): no module of the package
    # imports it, so a step runs the same whether or not it exists, and it imports nothing
    # above the ground layer of ours
    g = import_graph()
    mod = "ssaexec.runtime.host_sync"
    assert layer_of(mod) == LAYERS.index("runtime")
    assert list(g.predecessors(mod)) == []
    assert all(layer_of(b) == LAYERS.index("ground") for b in g.successors(mod))
