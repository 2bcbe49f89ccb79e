"""bench/gpu_check.py (``make gpu-check``): what can be checked without a GPU."""

import json
import os
import pathlib
import shlex
import subprocess
import sys

import pytest
import torch

REPO = pathlib.Path(__file__).resolve().parent.parent.parent
SCRIPT = REPO / "bench" / "gpu_check.py"
sys.path.insert(0, str(REPO / "bench"))

from gpu_check import gpu_gaps, kernel_intervals, merge_intervals  # noqa: E402


def _run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_without_a_gpu_it_says_so_writes_a_report_and_exits_0(tmp_path):
    proc = _run("--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "gpu-check: no CUDA GPU visible to torch" in proc.stdout
    assert "torch.cuda.is_available() is False" in proc.stdout
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["machine"]["gpu"] is False and report["parts"] == []
    assert "no CUDA GPU" in (tmp_path / "report.md").read_text()


def test_list_names_every_part_with_a_command_whose_script_exists(tmp_path):
    proc = _run("--list", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if ln and not ln[0].isspace()]
    names = [ln.split()[0] for ln in lines]
    for want in ("cuda-tests", "stream-sanitizer", "resnet50-fp32", "resnet50-bf16",
                 "resnet50-fp16", "resnet50-cuda-graph", "transformer-b32x128",
                 "transformer-b4x128", "dispatch-overhead", "profile-step",
                 "two-places-one-gpu", "validate-sim", "host-sync"):
        assert want in names
    assert len(names) == len(set(names))
    for ln in lines:
        words = shlex.split(ln.split(None, 1)[1])
        paths = [w for w in words if w.endswith(".py") or w.startswith("tests")]
        assert paths, ln
        for w in paths:
            assert (REPO / w).exists(), f"{ln}: {w} is not in the repository"
    assert "TORCH_CUDA_SANITIZER=1" in proc.stdout
    assert "--device cuda" in proc.stdout and "--cuda-graph" in proc.stdout
    only = _run("--list", "--only", "profile-step", "--only", "validate-sim")
    assert [ln.split()[0] for ln in only.stdout.splitlines()
            if ln and not ln[0].isspace()] == ["profile-step", "validate-sim"]
    assert _run("--list", "--only", "no-such-part").returncode == 2


def test_gaps_of_disjoint_kernels():
    g = gpu_gaps([(0, 10), (15, 20), (30, 40)])
    assert g["kernels"] == 3 and g["busy"] == 25 and g["gaps"] == 15 and g["span"] == 40
    assert g["max_gap"] == 10 and g["n_gaps"] == 2
    assert g["idle_fraction"] == pytest.approx(15 / 40)


def test_gaps_of_overlapping_and_nested_kernels():
    # two streams: (0,10) and (5,12) overlap, (2,3) sits inside, (12,14) touches: no gap
    g = gpu_gaps([(5, 12), (0, 10), (2, 3), (12, 14), (20, 25), (21, 22)])
    assert merge_intervals([(5, 12), (0, 10), (2, 3), (12, 14), (20, 25), (21, 22)]) == \
        [(0, 14), (20, 25)]
    assert g["kernels"] == 6 and g["busy"] == 19 and g["gaps"] == 6 and g["span"] == 25
    assert g["n_gaps"] == 1


def test_gaps_of_nothing_and_of_one_kernel():
    assert gpu_gaps([])["kernels"] == 0 and gpu_gaps([])["gaps"] == 0
    g = gpu_gaps(iter([(3.5, 4.0)]))
    assert g["kernels"] == 1 and g["busy"] == 0.5 and g["gaps"] == 0 and g["idle_fraction"] == 0
    with pytest.raises(ValueError):
        gpu_gaps([(2, 1)])


def test_kernel_intervals_from_a_chrome_trace():
    trace = {"traceEvents": [
        {"ph": "X", "cat": "cpu_op", "ts": 0, "dur": 100, "name": "aten::mm"},
        {"ph": "X", "cat": "kernel", "ts": 10, "dur": 5, "name": "gemm"},
        {"ph": "X", "cat": "gpu_memcpy", "ts": 20, "dur": 2, "name": "Memcpy HtoD"},
        {"ph": "X", "cat": "Kernel", "ts": 30.5, "dur": 1.5, "name": "relu"},
        {"ph": "i", "cat": "kernel", "ts": 40, "name": "marker"},
        {"ph": "X", "cat": "cuda_runtime", "ts": 9, "dur": 1, "name": "cudaLaunchKernel"},
    ]}
    assert kernel_intervals(trace) == [(10.0, 15.0), (20.0, 22.0), (30.5, 32.0)]
    g = gpu_gaps(kernel_intervals(trace))
    assert g["busy"] == 8.5 and g["gaps"] == 13.5


@pytest.mark.slow
def test_profile_step_runs_on_a_cpu_place(tmp_path):
    """The profiler part's own code path, on CPU (no GPU kernels there to count)."""
    out = tmp_path / "p.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--profile-step", "--device", "cpu",
                           "--warmup", "1", "--json", str(out), "--trace",
                           str(tmp_path / "t.json")], cwd=REPO, capture_output=True,
                          text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["device"] == "cpu" and res["gpu_kernels"] == 0 and res["step_us"] > 0
    assert (tmp_path / "t.json").exists()


def test_host_sync_part_runs_the_detector_over_cases_on_a_meta_place(tmp_path):
    """The host-sync part's own code path, on a meta place (a GPU's stand-in)."""
    out = tmp_path / "h.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--host-sync", "--device", "meta",
                           "--cases", "example-uci_housing,sgd-lambda", "--json", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["mode"] == "warn" and res["runs"] == 4 and res["errors"] == 0
    assert res["not_allowed"] == 0, res
    # the feeds are the copies a step makes on a device, allowed with their reason
    assert all(r["allowed"] and all("copy to device" in a and " -- " in a for a in r["allowed"])
               for r in res["results"])
    from gpu_check import Part, figures
    part = Part("host-sync", "", [], 1, json_path=out, kind="host-sync")
    assert figures(part, "") == {"runs": 4, "not_allowed": 0, "errors": 0, "findings": []}


# --- a GPU machine as it comes (issue 47): bench/gpu_env.py and the version causes ----------

from gpu_check import version_cause  # noqa: E402
from gpu_env import decide  # noqa: E402


@pytest.mark.parametrize("no_venv, venv, cuda, reachable, mode", [
    ("1", True, None, True, "system"),        # the switch wins over everything
    ("0", False, "13.0", False, "venv"),
    ("", True, "13.0", False, "venv"),        # a developer's machine with .venv
    ("", False, "13.0", False, "system"),     # a GPU machine as it comes
    ("", False, "13.0", True, "venv"),        # an index to install from
    ("", False, None, False, "venv"),         # no CUDA torch: nothing to run on as it is
])
def test_gpu_env_decides_which_python_runs_the_check(no_venv, venv, cuda, reachable, mode):
    got, why = decide(no_venv, venv, cuda, reachable)
    assert got == mode and why


def test_gpu_env_refuses_a_bad_switch():
    with pytest.raises(ValueError, match="NO_VENV must be 1, 0 or empty"):
        decide("yes", False, None, True)


def test_gpu_env_detects_this_interpreter_without_a_venv(tmp_path):
    # no .venv at tmp_path and pip told not to reach an index: "system" exactly when this
    # interpreter's torch is a CUDA build (the torch 2.11 matrix venv's is; the pinned
    # CPU build is not)
    env = dict(os.environ, PIP_NO_INDEX="1", NO_VENV="")
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "gpu_env.py"),
                           str(tmp_path / ".venv"), sys.executable], capture_output=True,
                          text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == ("system" if torch.version.cuda else "venv"), proc.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_make_gpu_check_no_venv_runs_on_this_python_without_installing(tmp_path):
    # what a GPU machine as it comes runs, with no index: no .venv is made or used
    env = dict(os.environ, PIP_NO_INDEX="1")
    proc = subprocess.run(["make", "--no-print-directory", "gpu-check", "NO_VENV=1",
                           f"PYTHON={sys.executable}", f"VENV={tmp_path / 'venv'}",
                           f"GPU_CHECK_ARGS=--out {tmp_path / 'out'}"], cwd=REPO,
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "gpu-check: system python (NO_VENV=1" in proc.stderr
    assert "no CUDA GPU visible to torch" in proc.stdout
    assert not (tmp_path / "venv").exists()
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["machine"]["supported"] is True


def test_a_version_caused_failure_is_named_as_such():
    assert version_cause("Traceback ...\nssaexec.errors.TorchFeatureError: the fused "
                         "optimizer update needs torch._foreach_clone (torch >= 2.13)\n") \
        .startswith("the fused optimizer update needs torch._foreach_clone")
    assert "has no attribute '_foreach_clone'" in version_cause(
        "AttributeError: module 'torch' has no attribute '_foreach_clone'\n")
    assert version_cause("ModuleNotFoundError: No module named 'torch._inductor.x'") \
        == "No module named 'torch._inductor.x'"
    assert version_cause("AssertionError: 3 != 4\nRuntimeError: CUDA error") is None


def test_a_missing_module_is_named_and_torch_modules_are_left_to_the_version_cause():
    from gpu_check import missing_module
    assert missing_module("/usr/bin/python3: No module named pytest\n") == "pytest"
    assert missing_module("ModuleNotFoundError: No module named 'cupy'") == "cupy"
    assert missing_module("ModuleNotFoundError: No module named 'torch._inductor.x'") is None
    assert missing_module("all good") is None
