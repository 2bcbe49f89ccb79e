"""Public seams: the trace, the CLI and the benchmark use only public names of other modules."""

import ast
import os
import pathlib

import pytest
import torch

import ssaexec as se
from ssaexec.program.example_models import build_mlp, make_optimizer

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the tools on top: they may use only public names of other modules' objects
CONSUMERS = sorted(
    str(p.relative_to(REPO)) for pattern in ("ssaexec/cli/*.py", "ssaexec/harness/*.py",
                                             "ssaexec/execution/step_trace.py", "ssaexec/demo.py",
                                             "ssaexec/state/checkpoint.py")
    for p in pathlib.Path(REPO).glob(pattern))


def private_uses(source):
    """``obj._name`` attribute reads on anything but ``self``/``cls`` (dunders are fine)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") \
                and not node.attr.startswith("__"):
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            out.append((node.lineno, ast.unparse(node)))
    return out


@pytest.mark.parametrize("path", CONSUMERS)
def test_consumers_use_no_private_attribute_of_other_objects(path):
    with open(os.path.join(REPO, path), encoding="utf-8") as f:
        assert private_uses(f.read()) == []


def test_the_lint_covers_the_cli_the_bench_and_the_trace():
    for part in ("ssaexec/cli/", "ssaexec/harness/", "ssaexec/execution/step_trace.py"):
        assert any(c.startswith(part) for c in CONSUMERS), part


def test_the_lint_catches_a_private_reach():
    assert private_uses("runner = pe._runner(fetch)\nself._ok = 1\nx.__class__") == \
        [(1, "pe._runner")]


def test_observe_reports_every_op_of_every_step_and_restores_the_executor():
    main, startup, loss = build_mlp("float32", make_optimizer("sgd", 0.1), in_dim=6,
                                    hidden=(4,), classes=3)
    feed = {"img": torch.randn(4, 6), "label": torch.randint(0, 3, (4, 1))}
    with se.ParallelExecutor(se.cpu_places(2), main, startup, loss, scope=se.Scope()) as pe:
        pe.run([loss], feed=feed)
        seen = []
        with pe.observe([loss], lambda op, ident, t0, t1: seen.append((op.id, t1 >= t0))) \
                as graph:
            assert pe.exec_strategy.compiled is True  # the caller's strategy is never written
            for _ in range(2):
                pe.run([loss], feed=feed)
        assert pe.exec_strategy.compiled is True
        assert sorted(i for i, _ in seen) == sorted(2 * [op.id for op in graph.ops])
        assert all(ok for _, ok in seen)
        n = len(seen)
        pe.run([loss], feed=feed)  # no longer observed
        assert len(seen) == n
        assert pe.num_threads == 3
