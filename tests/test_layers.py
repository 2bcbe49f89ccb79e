"""One-way architecture: every import of ssaexec goes down the layers, and none goes round.

The layers, bottom to top, are folders of ssaexec/ (``FOLDERS``; docs/architecture.md
draws them):

    core       errors, dtypes, place, limits, strategy, faults, compat, safe_files, progress
               (import nothing of ours but core.errors)
    ops        the op registry (a leaf), schemas, the policy, the kernels
    program    ProgramDesc, its codecs and checks, the builder, backward, optimizers,
               the example models
    graph      SSA handles and graphs, building, aliasing, analysis, pictures
    runtime    scopes, prepared calls, the compiled runner, collectives, the scheduler,
               the host-sync detector (a leaf: nothing in the package imports it)
    data       feed policy, the data loaders, feed files, synthetic data
    dist       torch.distributed set-up, the process-group collective, rendezvous, elastic,
               the sampler
    execution  Executor, ParallelExecutor and its parts, the trainer/pserver runner,
               observing and tracing steps
    state      checkpoints and resume
    tools      frontends/, sim/, harness/, cli/, and the package's public surface and entry
               points (ssaexec/__init__.py, __main__.py, demo.py), the only modules at the top

A module may import from its own layer or any layer below. Every import counts:
``import``/``from ... import`` at module level and inside functions (deferred imports
are real dependencies, only later) and ``importlib.import_module``/``__import__`` of a
constant name. The imports must not form a cycle, within a layer or across layers
(a cross-layer cycle is also an upward import). The only exceptions are the edges in
``ALLOWED_CYCLE_EDGES``, each with the reason it is not broken yet; the test fails as
soon as one of them is no longer needed.

Not counted: the package ``__init__`` that Python runs before a submodule (every
module would depend on ``ssaexec/__init__``).
"""

import ast
import pathlib

import networkx as nx
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent / "ssaexec"

LAYERS = ["core", "ops", "program", "graph", "runtime", "data", "dist", "execution", "state", "tools"]

# ssaexec/<folder>/ -> layer. Every module lives in one of these folders, or is one
# of TOP_LEVEL (the public surface and the entry points); a new folder needs a line.
FOLDERS = {
    "core": "core",
    "ops": "ops",
    "program": "program",
    "graph": "graph",
    "runtime": "runtime",
    "data": "data",
    "dist": "dist",
    "execution": "execution",
    "state": "state",
    "frontends": "tools", "sim": "tools", "harness": "tools", "cli": "tools",
}
TOP_LEVEL = {"ssaexec": "tools", "ssaexec.__main__": "tools", "ssaexec.demo": "tools"}
# module basenames that may occur in more than one folder, each with why it does not mislead;
# any other repeated basename fails test_no_two_modules_share_a_name (issue 48's twins:
# trace, models, comm, report, bench)
ALLOWED_TWINS = {
    "amp": "ops/amp (the kernels) beside program/amp (the rewrite that uses them)",
    "lr": "ops/lr (the schedule kernels) beside program/lr (the builder of schedules)",
    "parallel_do": "ops/parallel_do (the op) beside program/parallel_do (its builder)",
    "convert": "cli/convert (the subcommand) and frontends/paddle/convert (Paddle -> ours)",
    "distribute": "cli/distribute (the subcommand) runs program/distribute (the transpiler)",
    "evalmode": "one per frontend: frontends/torch/evalmode, frontends/paddle/evalmode",
    "schema": "ops/schema (op signatures) and frontends/paddle/schema (Paddle's proto)",
}

# Import edges allowed to close a cycle: (importer, imported) -> why it is not broken yet.
# Keep it empty (test_the_allowed_cycle_edges_are_still_needed fails on an unneeded entry).
ALLOWED_CYCLE_EDGES = {}


def module_name(path, root=ROOT):
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _dynamic_import(node):
    # importlib.import_module("ssaexec.x") / __import__("ssaexec.x"): a constant name only
    if not isinstance(node, ast.Call) or not node.args:
        return None
    f = node.func
    name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
    arg = node.args[0]
    if name in ("import_module", "__import__") and isinstance(arg, ast.Constant) \
            and isinstance(arg.value, str) and not arg.value.startswith("."):
        return arg.value
    return None


def import_graph(root=ROOT):
    """``networkx.DiGraph`` of imports between ssaexec modules (edges carry ``line``).

    Every ``ast`` node of a module is visited, so imports inside functions, methods,
    ``try`` and ``if`` blocks count as much as those at the top.
    """
    files = {module_name(p, root): p for p in root.rglob("*.py")}
    g = nx.DiGraph()
    g.add_nodes_from(files)
    for mod, path in files.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            dynamic = _dynamic_import(node)
            if dynamic is not None:
                names = [dynamic]
            elif isinstance(node, ast.ImportFrom):
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
    if mod in TOP_LEVEL:
        return LAYERS.index(TOP_LEVEL[mod])
    parts = mod.split(".")
    if len(parts) == 2 and parts[1] not in FOLDERS:
        raise AssertionError(f"{mod} is a loose module at the top of ssaexec/: only "
                             f"{sorted(TOP_LEVEL)} may be; move it into a folder of FOLDERS")
    if parts[1] not in FOLDERS:
        raise AssertionError(f"{mod}: folder ssaexec/{parts[1]}/ has no layer: add it to "
                             "FOLDERS in tests/test_layers.py")
    return LAYERS.index(FOLDERS[parts[1]])


def problems(g, allowed=None):
    """Upward imports and import cycles of import graph ``g``, as readable lines.

    A cycle is named module by module, each with the line of its import of the next;
    edges in ``allowed`` (default ``ALLOWED_CYCLE_EDGES``) close no cycle.
    """
    allowed = ALLOWED_CYCLE_EDGES if allowed is None else allowed
    out = []
    for a, b, d in g.edges(data=True):
        if layer_of(b) > layer_of(a):
            out.append(f"upward import: {a} (layer {LAYERS[layer_of(a)]}) imports {b} "
                       f"(layer {LAYERS[layer_of(b)]}) at line {d['line']}")
    rest = nx.DiGraph((a, b, d) for a, b, d in g.edges(data=True) if (a, b) not in allowed)
    for cycle in sorted(nx.simple_cycles(rest)):
        hops = [f"{a} (line {rest.edges[a, b]['line']})"
                for a, b in zip(cycle, cycle[1:] + cycle[:1], strict=True)]
        out.append("import cycle: " + " -> ".join(hops + cycle[:1]))
    return out


def test_every_module_has_a_layer():
    for mod in import_graph().nodes:
        layer_of(mod)


def test_imports_go_down_the_layers_and_never_round():
    found = problems(import_graph())
    assert not found, "\n".join(found)


def test_the_allowed_cycle_edges_are_still_needed():
    # an allowed edge that is gone, or closes no cycle any more, must leave the list
    g = import_graph()
    assert [e for e in ALLOWED_CYCLE_EDGES if not g.has_edge(*e)] == []
    unneeded = [e for e in ALLOWED_CYCLE_EDGES
                if problems(g, {k: v for k, v in ALLOWED_CYCLE_EDGES.items() if k != e})
                == problems(g)]
    assert unneeded == []


def test_the_allowed_cycle_edges_stay_in_the_program_layer():
    # the allowlist is a debt of one layer, not a door: nothing else may join it
    assert {layer_of(m) for e in ALLOWED_CYCLE_EDGES for m in e} <= {LAYERS.index("program")}


@pytest.mark.parametrize("planted, expect", [
    # the runtime reaching up into the executors (execution/)
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
        f.write("\n\ndef _planted():\n    from ..execution.parallel_executor import ParallelExecutor\n"
                "    return ParallelExecutor\n")
    found = problems(import_graph(copy))
    assert any(p.startswith(expect) for p in found), found


@pytest.mark.parametrize("planted, code, names", [
    # the registry is a leaf; making it import a kernel module closes a cycle
    ("ssaexec/ops/registry.py", "from . import math\n    return math",
     ["ssaexec.ops.registry", "ssaexec.ops.math"]),
    # issue 31's cycle: the bottom of the runtime importing the parallel_do engine back
    ("ssaexec/runtime/op_call.py", "from .parallel_block import run_places\n    return run_places",
     ["ssaexec.runtime.op_call", "ssaexec.runtime.parallel_block"]),
    # the same through importlib, with an absolute name
    ("ssaexec/runtime/op_call.py",
     "import importlib\n    return importlib.import_module('ssaexec.runtime.compiled')",
     ["ssaexec.runtime.op_call", "ssaexec.runtime.compiled"]),
])
def test_a_planted_deferred_cycle_is_found(tmp_path, planted, code, names):
    import shutil
    copy = tmp_path / "ssaexec"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / pathlib.Path(planted).relative_to("ssaexec")
    with open(target, "a", encoding="utf-8") as f:
        f.write(f"\n\ndef _planted():\n    {code}\n")
    found = [p for p in problems(import_graph(copy)) if p.startswith("import cycle:")]
    assert any(all(f"{n} (line " in p for n in names) for p in found), found


def test_the_host_sync_detector_is_a_leaf_of_the_runtime():
    # it watches steps from outside (tests, make gpu-check, users): no module of the package
    # imports it, so a step runs the same whether or not it exists, and it imports nothing
    # above the core layer of ours
    g = import_graph()
    mod = "ssaexec.runtime.host_sync"
    assert layer_of(mod) == LAYERS.index("runtime")
    assert list(g.predecessors(mod)) == []
    assert all(layer_of(b) == LAYERS.index("core") for b in g.successors(mod))


def test_no_loose_modules_at_the_top():
    # issue 48: the folders show the layers; only the public surface and entry points stay
    loose = sorted(p.stem for p in ROOT.glob("*.py") if f"ssaexec.{p.stem}" not in TOP_LEVEL
                   and p.stem != "__init__")
    assert loose == [], f"move these into a folder of FOLDERS: {loose}"


def test_every_folder_has_a_layer_and_is_a_package():
    folders = sorted(p.name for p in ROOT.iterdir() if p.is_dir() and p.name != "__pycache__"
                     and any(p.rglob("*.py")))
    assert [f for f in folders if f not in FOLDERS] == []
    assert [f for f in folders if not (ROOT / f / "__init__.py").exists()] == []


def test_no_two_modules_share_a_name():
    # a name in two folders makes a reader open the wrong file (issue 48's twins)
    seen = {}
    for p in ROOT.rglob("*.py"):
        if p.name != "__init__.py" and "__pycache__" not in p.parts:
            seen.setdefault(p.stem, []).append(str(p.relative_to(ROOT)))
    twins = {k: sorted(v) for k, v in seen.items() if len(v) > 1 and k not in ALLOWED_TWINS}
    assert twins == {}
    assert [k for k in ALLOWED_TWINS if len(seen.get(k, [])) < 2] == []


def test_tests_mirror_the_package(pytestconfig):
    # tests/<folder>/ is the test of ssaexec/<folder>/ (tests/integration/: end to end), and
    # pytest must walk into every one (its default norecursedirs skips folders named dist)
    import fnmatch
    tests = ROOT.parent / "tests"
    dirs = {p.parent.relative_to(tests).as_posix() for p in tests.rglob("test_*.py")} - {"."}
    assert sorted(d for d in dirs if d != "integration" and not (ROOT / d).is_dir()) == []
    patterns = pytestconfig.getini("norecursedirs")
    assert [d for d in dirs if any(fnmatch.fnmatch(part, pat) for part in d.split("/")
                                   for pat in patterns)] == []
