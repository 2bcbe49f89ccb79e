"""The dispatch-overhead benchmark and ``ssaexec bench --model transformer`` run end to end.

Both are measuring tools (issue 13): these tests check that they run and report
what they promise, never how fast anything is.
"""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # runs the benchmarks end to end

ROOT = Path(__file__).resolve().parents[2]


def _run(cmd, timeout):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def _positive(x):
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


@pytest.mark.timeout(300)
def test_dispatch_overhead_quick(tmp_path):
    out = tmp_path / "dispatch.json"
    text = _run([sys.executable, "bench/dispatch_overhead.py", "--quick", "--json", str(out)],
                timeout=280)
    for part in ("(a) scheduler alone", "(b) whole dispatch", "(c) the small imported "
                 "transformer", "targets"):
        assert part in text
    data = json.loads(out.read_text())
    assert data["schema"] == "ssaexec-dispatch/1"
    for key in ("cpu", "cores", "torch", "python", "git_commit"):
        assert key in data["machine"]
    assert data["settings"]["device"] == "cpu" and data["settings"]["torch_threads"] == 1

    sched = data["scheduler"]
    assert {(r["graph"], r["executor"]) for r in sched["rows"]} == {
        (g, e) for g in ("chain", "4 chains")
        for e in ("python loop (floor)", "ssaexec Scheduler(1)", "ssaexec Scheduler(2)",
                  "ssaexec Scheduler(4)")}
    for r in sched["rows"]:
        assert r["ops"] == sched["ops"] > 0
        assert _positive(r["us_per_op"]) and math.isfinite(r["overhead_us_per_op"])
        assert len(r["seconds"]) == data["settings"]["sched_repeats"]

    chain, mlp = data["dispatch"]
    transformer = data["transformer"]
    executors = {"ssaexec Executor", "ssaexec ParallelExecutor",
                 "ssaexec ParallelExecutor num_threads=1"}
    assert {r["executor"] for r in chain["rows"]} == executors | {"python loop (floor)"}
    assert chain["ops"] == data["settings"]["ops"]
    for case in (mlp, transformer):
        assert {r["executor"] for r in case["rows"]} == \
            executors | {"torch eager", "fx joint graph (floor)"}
        assert case["ops"] > 0 and case["fx_aten_calls"] > 0
        for r in case["rows"]:
            assert _positive(r["x_eager"]) and _positive(r["paired_x_eager"])
    assert transformer["config"] == {"layers": 2, "d_model": 32, "heads": 2, "batch": 4,
                                     "seq": 16}
    assert transformer["ops"] > 100  # ~300 ATen ops plus the optimizer's
    for case in (chain, mlp, transformer):
        floor = next(r for r in case["rows"] if r["executor"] == case["floor"])
        assert floor["overhead_us_per_op"] == 0
        for r in case["rows"]:
            assert len(r["seconds"]) == data["settings"]["repeats"]
            assert all(_positive(t) for t in r["seconds"])
            assert _positive(r["ms_per_run"]) and _positive(r["us_per_op"])
            assert math.isfinite(r["overhead_us_per_op"])
    assert data["targets"] and all(isinstance(t["met"], bool) and math.isfinite(t["value"])
                                   for t in data["targets"])


@pytest.mark.timeout(300)
def test_bench_transformer_runs(tmp_path):
    """The smallest ``ssaexec bench --model transformer``: imported program vs eager."""
    out = tmp_path / "transformer.json"
    text = _run([sys.executable, "-m", "ssaexec", "bench", "--model", "transformer",
                 "--layers", "1", "--d-model", "8", "--seq-len", "4", "-b", "2",
                 "--warmup", "1", "--steps", "2", "--repeats", "1", "--places", "cpu:1",
                 "--modes", "seq,ssaexec,torch-eager", "--json", str(out), "--plot", "none",
                 "--no-progress"], timeout=280)
    assert "transformer 1x8 h2 seq 4" in text
    result = json.loads(out.read_text())
    s = result["settings"]
    assert s["model"] == "transformer" and s["preset"] == "transformer"
    assert s["torch_threads"] == 1 and s["optimizer"] == "sgd"
    runs = {(r["mode"], r["places"]): r for r in result["runs"]}
    assert set(runs) == {("seq", 1), ("ssaexec", 1), ("torch-eager", 1)}
    for r in runs.values():
        assert r["error"] is None, r["error"]
        assert r["torch_threads"] == 1
        assert _positive(r["images_per_sec_median"]) and r["trained"]
    # the imported program starts from the twin's seeded weights: it trains like eager
    assert runs[("ssaexec", 1)]["losses"] == pytest.approx(runs[("torch-eager", 1)]["losses"],
                                                           rel=1e-4)
    assert runs[("seq", 1)]["losses"] == pytest.approx(runs[("torch-eager", 1)]["losses"],
                                                       rel=1e-4)
    assert [c["name"] for c in result["comparisons"]][:1] == \
        ["ssaexec@1 / torch-eager images/sec"]
