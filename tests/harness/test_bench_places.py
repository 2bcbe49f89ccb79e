"""The benchmark's ``--places cuda:<ids>`` (ssaexec.harness.cli.cuda_devices), on CPU.

The first GPU run (docs/gpu.md) found ``--places cuda:0,0`` refused, though two places
on one GPU is a configuration ssaexec supports (and bench/validate_sim.py measures).
``cuda_devices`` decides from the device indices alone, so it runs without a GPU; a
config whose places share a GPU carries their devices to the worker.
"""

import pytest

from ssaexec.harness import cli
from ssaexec.harness.runners import ParallelTrainer


@pytest.mark.parametrize("ids, counts", [([0], [1]), ([0, 0], [1, 2]), ([0, 1], [1, 2]),
                                         ([0, 0, 1, 1], [2, 4]), ([0, 0, 0, 0], [4])])
def test_devices_in_order_from_zero_are_accepted_and_may_repeat(ids, counts):
    assert cli.cuda_devices(ids, counts, ["ssaexec", "torch-eager"]) == ids


@pytest.mark.parametrize("ids", [[1], [0, 2], [1, 0], [0, 1, 0]])
def test_other_devices_are_refused_pointing_at_cuda_visible_devices(ids):
    with pytest.raises(SystemExit, match="CUDA_VISIBLE_DEVICES"):
        cli.cuda_devices(ids, [1], ["ssaexec"])


@pytest.mark.parametrize("mode", ["torch-ddp", "torch-compile-ddp", "ssaexec-nproc",
                                  "ssaexec-inductor-nproc"])
def test_a_process_a_place_mode_refuses_places_sharing_a_gpu(mode):
    with pytest.raises(SystemExit, match=f"mode {mode} runs a process a place.*2 places "
                                         r"share 1 GPU\(s\)"):
        cli.cuda_devices([0, 0], [1, 2], ["ssaexec", mode])
    # one place a run shares nothing: allowed
    assert cli.cuda_devices([0, 0], [1], ["ssaexec", mode]) == [0, 0]
    assert cli.cuda_devices([0, 1], [1, 2], [mode]) == [0, 1]


def test_a_place_sharing_config_makes_its_places_on_the_shared_gpu():
    # what the worker builds from the config (CUDAPlace objects need no GPU to exist)
    places = ParallelTrainer.places_of({"cuda_devices": [0, 0], "places": 2,
                                        "device": "cuda"})
    assert [(p.index, p.device_index) for p in places] == [(0, 0), (1, 0)]
    one = ParallelTrainer.places_of({"cuda_devices": [0, 0], "places": 1, "device": "cuda"})
    assert [(p.index, p.device_index) for p in one] == [(0, 0)]
    assert [str(p) for p in ParallelTrainer.places_of({"places": 2, "device": "cpu"})] == [
        str(p) for p in __import__("ssaexec").cpu_places(2)]


def _gpu_check():
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[2] / "bench" / "gpu_check.py"
    spec = importlib.util.spec_from_file_location("gpu_check_for_places", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _arg(cmd, flag):
    return cmd[cmd.index(flag) + 1]


def test_gpu_checks_benchmark_parts_pass_arguments_the_benchmark_accepts(tmp_path):
    gc = _gpu_check()
    from ssaexec.runtime.cuda_graph import StepGraphs
    import inspect
    graph_warmup = inspect.signature(StepGraphs).parameters["warmup"].default
    for quick in (False, True):
        benches = {p.name: p for p in gc.parts(tmp_path, quick) if p.kind == "bench"}
        two = benches["two-places-one-gpu"].argv
        ids = [int(i) for i in _arg(two, "--places").split(":")[1].split(",")]
        counts = [int(c) for c in _arg(two, "--place-counts").split(",")]
        assert cli.cuda_devices(ids, counts, _arg(two, "--modes").split(",")) == [0, 0]
        graph = benches["resnet50-cuda-graph"].argv
        if "--warmup" in graph:
            # the capture step (after the step graphs' own warm-up) is not timed
            assert int(_arg(graph, "--warmup")) > graph_warmup, quick
