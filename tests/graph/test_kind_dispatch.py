"""Handle kinds are told apart by class, never by their label (issue 48, acceptance 3).

Two checks:

* the dispatch tables are complete: every op handle class of ssaexec, found by walking
  ``OpHandle``'s subclasses, is handled by every dispatcher that must know it (how the
  simulator replays it, what prices it, its profile key, how each runner runs it), and
  a class no dispatcher knows is refused with an ``SSAExecError`` naming its kind;
* no module dispatches on a kind's label: an AST scan of ``ssaexec/`` finds every
  comparison with, ``match`` on, or lookup keyed by a kind (``x.kind``, ``kind``,
  ``d["kind"]``, ``type(x).__name__``) or a kind label, and every lookup in a table
  keyed by labels (``HANDLE_KINDS``, ``COLLECTIVES``). Each use that is not dispatch
  is listed in ``NOT_DISPATCH`` with why; the list must not go stale either.

Adding a kind is a class (and, for a collective, its cost model class): the last test
adds a collective kind here and the simulator dispatches it with no other edit.
"""

import ast
import pathlib

import pytest

from ssaexec.core.errors import SSAExecError
from ssaexec.graph.handles import CollectiveOpHandle, OpHandle, ReduceOpHandle
from ssaexec.graph.kinds import HANDLE_KINDS
from ssaexec.runtime.codegen import emit_handle
from ssaexec.runtime.handle_calls import handle_fn
from ssaexec.sim import comm_cost as comm
from ssaexec.sim.cluster import PRESETS
from ssaexec.sim.engine import replay_handle
from ssaexec.sim.profile import op_key

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent / "ssaexec"


def handle_classes():
    """Every op handle class of ssaexec that names a kind, from the class hierarchy."""
    out, todo = [], [OpHandle]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls.__dict__.get("kind") is not None and cls.__module__.startswith("ssaexec."):
            out.append(cls)
    return sorted(out, key=lambda c: c.__name__)


# dispatcher -> which handle classes it must handle (the others fall to its default)
DISPATCHERS = {
    "simulator replay (sim.engine.replay_handle)": (replay_handle, lambda cls: True),
    "simulator comm model (sim.comm_cost.cost_model)": (comm.cost_model,
                                                   lambda cls: cls.is_collective),
    "profile key (sim.profile.op_key)": (op_key, lambda cls: True),
    "readable runner (runtime.handle_calls.handle_fn)": (handle_fn, lambda cls: True),
    # a segment holds the handles of one place and collectives with nothing to do
    # (runtime.node_graph's partition); fetches and waits are nodes of their own
    "compiled runner (runtime.codegen.emit_handle)": (
        emit_handle, lambda cls: cls.on_one_place or cls.is_collective),
}


def test_the_classes_are_the_registered_kinds():
    classes = handle_classes()
    ours = [c for c in HANDLE_KINDS.values() if c.__module__.startswith("ssaexec.")]
    assert len(classes) >= 7 and set(classes) == set(ours)


@pytest.mark.parametrize("name", sorted(DISPATCHERS))
def test_every_dispatcher_handles_every_kind_it_must(name):
    fn, must = DISPATCHERS[name]
    default = fn.registry[object]
    missing = [c.__name__ for c in handle_classes() if must(c) and fn.dispatch(c) is default]
    extra = [c.__name__ for c in handle_classes() if not must(c) and fn.dispatch(c) is not default]
    assert (missing, extra) == ([], [])


class _Unknown(OpHandle):
    """An op handle class no dispatcher knows (it names no kind, so it registers none)."""

    __slots__ = ()


@pytest.mark.parametrize("call", [
    lambda h: replay_handle(h, None, None),
    lambda h: comm.cost_model(h),
    lambda h: op_key(h),
], ids=["replay", "cost_model", "op_key"])
def test_a_kind_the_simulator_does_not_know_is_refused(call):
    with pytest.raises(SSAExecError, match="op handle kind"):
        call(_Unknown())


def test_a_new_collective_kind_is_two_classes():
    class GatherOpHandle(CollectiveOpHandle):
        __slots__ = ()
        kind = "test_gather"

    class Gather(comm.Reduce):
        __slots__ = ()
        handle = GatherOpHandle

    try:
        h = GatherOpHandle(["g"])
        model = comm.cost_model(h)
        assert isinstance(model, Gather) and model.name == "test_gather"
        assert comm.COLLECTIVES["test_gather"] is model  # listed by label, for display
        # priced by its model's formulas (a ring reduce's), passed as the model
        cluster = PRESETS["dgx-h100"]
        assert comm.collective_time(cluster, model, 1 << 20, 8) == \
            comm.collective_time(cluster, comm.cost_model(ReduceOpHandle([], 0)), 1 << 20, 8)
        # the simulator replays it as a collective, the profile keys it by its label
        assert replay_handle.dispatch(GatherOpHandle) is \
            replay_handle.dispatch(CollectiveOpHandle)
        assert op_key(h) == "test_gather"
    finally:
        HANDLE_KINDS.pop("test_gather", None)
        comm.COLLECTIVES.pop("test_gather", None)


# --- no dispatch on kind labels ----------------------------------------------------------

LABEL_TABLES = {"HANDLE_KINDS", "COLLECTIVES"}  # tables keyed by kind labels
LOOKUPS = {"get", "setdefault", "pop"}
# compared with a string that happens to spell a kind label, these are other concepts
OTHER_CONCEPTS = {
    "stream": "a handle's stream role (compute, comm, fetch), asked of the handle",
    "reduce_strategy": "a BuildStrategy setting (all_reduce, reduce)",
}

# Every use the scan finds that is not dispatch: source text (whitespace collapsed) ->
# where and why.
NOT_DISPATCH = {
    # a handle kind's label, used as data
    'by_kind.setdefault(op.kind, {"count": 0, "payload_bytes": 0, "bytes_per_place": 0.0, '
    '"formula": op.traffic_formula})':
        "graph/analysis.py: collective stats grouped by label for display (ssaexec stats)",
    "by_kind[op.kind]": "graph/analysis.py: op counts by label for display",
    "by_kind.get(op.kind, 0)": "graph/analysis.py: op counts by label for display",
    'kinds_used.setdefault(op.kind, {"kind": op.kind, "legend": cls.legend or op.kind, '
    '"color": cls.color, "stream": cls.stream, "count": 0})':
        "graph/explorer.py: the explorer JSON's legend, one entry per label (display)",
    "kinds_used[op.kind]": "graph/explorer.py: counts in that legend (display)",
    "HANDLE_KINDS[cls.kind]": "graph/handles.py: __init_subclass__ fills the label table",
    "HANDLE_KINDS[kind]": "graph/ssa.py: SSAGraph.ops_of_kind accepts a label from its "
                          "caller and reads it back to the class, then filters by isinstance",
    "COLLECTIVES[cls.name]": "sim/comm_cost.py: Collective.__init_subclass__ fills the label table",
    "COLLECTIVES.get(coll)": "sim/comm_cost.py: collective_time(cluster, 'all_reduce', ...) "
                             "reads a caller's name back to its model (the simulator "
                             "passes models)",
    "HANDLE_KINDS.get(cat)": "sim/profile.py: a trace slice names its class only by the "
                             "label (its category); read back to the class once",
    # other concepts that a scan by name cannot tell from handle kinds
    "_REFUSED_KINDS.get(dtype.kind)": "feed_file.py: a numpy dtype's kind letter",
    "_KINDS[kind]": "frontends/paddle/pir_convert.py: a Paddle PIR type kind",
    '_VAR_NODES[d["kind"]]': "graph/draw.py: a drawing node's kind (var, ref, after)",
    'boxes[d["kind"]]': "graph/draw.py: drawing nodes grouped by drawing kind",
    "self._rules.get(kind, ())": "runtime/host_sync.py: a host-sync finding kind",
    "KINDS[self.kind]": "runtime/host_sync.py: a host-sync finding kind",
    "self._rules.setdefault(rule.kind, [])": "runtime/host_sync.py: a host-sync finding kind",
    'self.streams[h.place_idx]["compute"]': "sim/engine.py: a place's compute stream",
}


def _kindish(node):
    # an expression that holds a kind: x.kind, kind, d["kind"], getattr(x, "kind"),
    # type(x).__name__
    if isinstance(node, ast.Attribute):
        return node.attr in ("kind", "__name__")
    if isinstance(node, ast.Name):
        return node.id == "kind"
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value == "kind"
    if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "getattr":
        return len(node.args) > 1 and getattr(node.args[1], "value", None) == "kind"
    return False


def _name(node):
    return node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)


def _labels(node, labels):
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return [e.value for e in items if isinstance(e, ast.Constant) and e.value in labels]


def kind_uses(source, labels):
    """``(line, text with whitespace collapsed)`` of each place in ``source`` that compares, matches or looks up
    by a kind or a kind label, or looks up a label table (see the module docstring)."""
    hits = []
    for node in ast.walk(ast.parse(source)):
        found = False
        if isinstance(node, ast.Compare):
            operands = [node.left] + node.comparators
            found = any(_labels(o, labels) for o in operands) and \
                not any(_name(o) in OTHER_CONCEPTS for o in operands)
        elif isinstance(node, ast.Match):
            found = _kindish(node.subject) or any(
                _labels(m.value, labels) for c in node.cases for m in ast.walk(c.pattern)
                if isinstance(m, ast.MatchValue))
        elif isinstance(node, ast.Subscript):
            found = _name(node.value) in LABEL_TABLES or _kindish(node.slice) or \
                bool(_labels(node.slice, labels))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in LOOKUPS:
                found = _name(node.func.value) in LABEL_TABLES or bool(node.args) and (
                    _kindish(node.args[0]) or bool(_labels(node.args[0], labels)))
            elif node.func.attr == "ops_of_kind":
                found = any(_labels(a, labels) for a in node.args)
        if found:
            hits.append((node.lineno, " ".join(ast.get_source_segment(source, node).split())))
    return hits


LABELS = set(HANDLE_KINDS) | {c.__name__ for c in HANDLE_KINDS.values()}


def test_no_module_dispatches_on_a_kind_label():
    found, seen = [], set()
    for p in sorted(ROOT.rglob("*.py")):
        for line, text in kind_uses(p.read_text(encoding="utf-8"), LABELS):
            if text in NOT_DISPATCH:
                seen.add(text)
            else:
                found.append(f"{p.relative_to(ROOT.parent)}:{line}: {text}")
    assert found == [], "dispatch by kind label (dispatch on the class instead, or list " \
                        "a use that is not dispatch in NOT_DISPATCH with why)"
    stale = sorted(set(NOT_DISPATCH) - seen)
    assert stale == [], "NOT_DISPATCH lists uses that are gone: drop them"


@pytest.mark.parametrize("source", [
    'if op.kind in ("all_reduce", "reduce", "broadcast"):\n    pass',
    'ok = h.kind == "fetch"',
    'ok = "compute" != kind',
    'ok = getattr(op, "kind") not in ["scale_loss_grad"]',
    'ok = type(op).__name__ == "AllReduceOpHandle"',
    'ok = d["kind"] == "all_reduce_wait"',
    'ok = cat == "scale_loss_grad"',  # a label from a trace, compared by name
    'match op.kind:\n    case "reduce":\n        pass',
    'match cat:\n    case "compute":\n        pass',
    'f = {"all_reduce": 1, "broadcast": 2}[op.kind]',
    'f = MODELS[h.kind]',
    'f = table.get(h.kind)',
    'f = COLLECTIVES["reduce"]',
    'f = COLLECTIVES.get(name)',
    'c = costs["scale_loss_grad"]',
    'ops = graph.ops_of_kind("all_reduce")',
    'cls = HANDLE_KINDS["fetch"]',
])
def test_a_kind_dispatch_is_found(source):
    assert len(kind_uses(source, LABELS)) == 1


@pytest.mark.parametrize("source", [
    'ok = op.stream == "fetch"',  # a stream role, asked of the handle
    'ok = bs.reduce_strategy == "reduce"',  # a strategy setting
    'ok = kind in ("max", "avg")',  # a pooling type
    'ops = graph.ops_of_kind(AllReduceOpHandle)',
    'm = cost_model(h)',
    'label = f"{op.kind}: {op.name}"',  # display
])
def test_other_uses_are_not_kind_dispatches(source):
    assert kind_uses(source, LABELS) == []
