"""``make demo``'s benchmark at its smallest (apart from tests/harness/test_time_to_n.py: it
is the suite's longest test, and its own file lets xdist run it beside the others)."""

import json

import pytest


@pytest.mark.slow  # torch.compile compiles two small models
@pytest.mark.timeout(600)
def test_the_demo_benchmark_at_its_smallest(tmp_path, capsys):
    """make demo's benchmark (ssaexec.demo.short_benchmark) on both of its models, made
    tiny: each names torch.compile, eager and DDP, with time to N and the headline."""
    from ssaexec.demo import DEMO_BENCH, short_benchmark
    tiny = ["--places", "cpu:1", "--warmup", "1", "--steps", "1", "--repeats", "1",
            "--d-model", "8", "--layers", "1", "--seq-len", "4", "--base", "4",
            "--image-size", "8", "-b", "2", "--settle-s", "0"]
    lines = []
    assert short_benchmark(tmp_path, extra=tiny, progress=False, out=lines.append) == 0
    text = capsys.readouterr().out
    assert lines == [f"== benchmark {k + 1}/2: {what}" for k, (what, _) in enumerate(DEMO_BENCH)]
    assert "ssaexec bench: transformer" in text and "ssaexec bench: resnet18" in text
    assert text.count("headline: ssaexec (default) is") == 2
    assert text.count("time to N steps, compile included") == 2
    for mode in ("ssaexec", "torch-eager", "torch-compile", "torch-ddp"):
        assert sum(line.startswith(mode + " ") for line in text.splitlines()) >= 4, mode
    runs = [r for f in ("transformer.json", "resnet18_8.json")
            for r in json.loads((tmp_path / f).read_text())["runs"]]
    assert {r["mode"] for r in runs} == {"ssaexec", "torch-eager", "torch-compile",
                                         "torch-ddp"}
    assert all(r["error"] is None and r["time_to"]["1000"]["seconds"] > 0 for r in runs)
