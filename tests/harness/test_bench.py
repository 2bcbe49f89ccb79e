"""The benchmark harness (ssaexec.harness) and its torch.nn twins (bench/torch_models.py)."""

import argparse
import json
import math
import sys
from pathlib import Path

import pytest
import torch

import ssaexec as se
from ssaexec import harness as benchmark
from ssaexec.program.example_models import build_mlp, build_resnet, make_optimizer

ROOT = Path(__file__).resolve().parents[2]
twins = benchmark.load_twins()


def _losses_both_ways(main, startup, loss, twin, feed, steps=2):
    scope = se.Scope()
    exe = se.Executor()
    exe.run(startup, scope=scope)
    twins.load_from_scope(twin, main, scope)
    opt = torch.optim.SGD(twin.parameters(), lr=0.01, momentum=0.9)
    ours, theirs = [], []
    for _ in range(steps):
        ours.append(float(exe.run(main, feed=feed, fetch_list=[loss], scope=scope)[0]))
        opt.zero_grad()
        lt = twins.loss_fn(twin(feed["img"]), feed["label"])
        lt.backward()
        opt.step()
        theirs.append(lt.item())
    return ours, theirs


@pytest.mark.parametrize("kw", [dict(depth=18, image_size=16, base=4),
                                dict(depth=18, image_size=72, base=4),      # ImageNet stem
                                dict(depth=50, image_size=16, base=4),
                                dict(depth=50, image_size=16, base=16, cardinality=4, width=4)])
@pytest.mark.slow
def test_resnet_twin_matches_builder(kw):
    main, startup, loss = build_resnet(optimizer=make_optimizer("momentum", 0.01), **kw)
    twin = twins.ResNet(**kw)
    g = torch.Generator().manual_seed(0)
    size = kw["image_size"]
    feed = {"img": torch.randn(4, 3, size, size, generator=g),
            "label": torch.randint(0, 10, (4, 1), generator=g)}
    ours, theirs = _losses_both_ways(main, startup, loss, twin, feed)
    assert ours == pytest.approx(theirs, rel=1e-4, abs=1e-5)


def test_mlp_twin_matches_builder():
    main, startup, loss = build_mlp(optimizer=make_optimizer("momentum", 0.01), in_dim=20,
                                    hidden=(16, 8))
    g = torch.Generator().manual_seed(0)
    feed = {"img": torch.randn(6, 20, generator=g),
            "label": torch.randint(0, 10, (6, 1), generator=g)}
    ours, theirs = _losses_both_ways(main, startup, loss, twins.MLP(20, (16, 8)), feed, steps=3)
    assert ours == pytest.approx(theirs, rel=1e-5)


def test_twin_with_wrong_architecture_is_refused():
    main, startup, _ = build_resnet(18, 32, base=4)
    scope = se.Scope()
    se.Executor().run(startup, scope=scope)
    with pytest.raises(ValueError, match="does not match"):
        twins.load_from_scope(twins.ResNet(34, 32, base=4), main, scope)


def test_bad_options_fail_clearly():
    with pytest.raises(SystemExit, match="unknown mode"):
        benchmark.main(["--preset", "tiny", "--modes", "seq,bogus", "--places", "cpu:1"])
    with pytest.raises(ValueError, match="unknown model"):
        benchmark.main(["--model", "vgg16", "--places", "cpu:1"])


def test_torchrun_modes_are_planned_on_the_place_counts_their_processes_divide():
    # ssaexec-inductor-nproc (issue 32's two gloo processes against torch.compile + DDP)
    # runs as ssaexec-nproc does, an InductorTrainer in each process
    from ssaexec.harness import cli
    ap = argparse.ArgumentParser()
    cli.add_arguments(ap)
    args = ap.parse_args(["--preset", "tiny", "--places", "cpu:3", "--place-counts", "1,2,3",
                          "--modes", "ssaexec-inductor-nproc,torch-compile-ddp"])
    configs, device, counts = cli.plan(args, cli.settings(args))
    got = {(c["mode"], c["places"], c.get("nproc")) for c in configs}
    assert ("ssaexec-inductor-nproc", 2, 2) in got and device == "cpu" and counts == [1, 2, 3]
    assert not {c["places"] for c in configs if c["mode"] == "ssaexec-inductor-nproc"} - {2}
    assert all("nproc" not in c for c in configs if c["mode"] == "torch-compile-ddp")


def test_from_torch_flag_plans_its_mode_and_without_the_frontend_errors_clearly(monkeypatch):
    from ssaexec.harness import cli

    def plan(*argv):
        ap = argparse.ArgumentParser()
        cli.add_arguments(ap)
        args = ap.parse_args(["--preset", "tiny", "--places", "cpu:2", *argv])
        return cli.plan(args, cli.settings(args))[0]

    assert not any(c["mode"] == "ssaexec-from-torch" for c in plan("--modes", "seq"))
    got = {(c["mode"], c["places"]) for c in plan("--modes", "seq", "--from-torch")}
    assert got == {("seq", 1), ("ssaexec-from-torch", 1), ("ssaexec-from-torch", 2)}
    # an install whose torch frontend cannot be imported: one clear line, no traceback
    monkeypatch.setitem(sys.modules, "ssaexec.frontends.torch", None)
    with pytest.raises(SystemExit, match=r"--from-torch needs ssaexec\.frontends\.torch"):
        plan("--modes", "seq", "--from-torch")


@pytest.mark.slow
@pytest.mark.processes  # torch-ddp and ssaexec-nproc start 2 processes each
@pytest.mark.timeout(240)
def test_harness_runs_every_mode(tmp_path, capsys):
    """Acceptance: a tiny model, a couple of steps, every mode; schema and training checked."""
    out = tmp_path / "tiny.json"
    png = tmp_path / "tiny.png"
    # --settle-s 0: the default (tiered) ssaexec mode runs its windows at once, its compile
    # in the background (test_time_to_n.py waits for a switch)
    extra = ["--from-torch", "--nproc", "2", "--settle-s", "0"]
    rc = benchmark.main(["--preset", "tiny", "--places", "cpu:2", "--place-counts", "2",
                         "--json", str(out), "--plot", str(png), "--no-progress", *extra])
    text = capsys.readouterr().out
    assert rc == 0, text
    result = json.loads(out.read_text())
    assert result["schema"] == benchmark.SCHEMA
    for key in ("cpu", "cores", "torch", "python", "platform", "loadavg_start", "loadavg_end"):
        assert key in result["machine"]
    s = result["settings"]
    assert s["model"] == "mlp" and s["places"] == [2] and s["device"] == "cpu"
    runs = {(r["mode"], r["places"]): r for r in result["runs"]}
    expected = {("seq", 1), ("ssaexec", 2), ("torch-eager", 1), ("torch-compile", 1),
                ("torch-ddp", 2),
                ("ssaexec-nproc", 2), ("ssaexec-from-torch", 2)}
    assert set(runs) == expected
    for (mode, places), r in runs.items():
        assert r["error"] is None, r["error"]
        assert r["global_batch"] == places * s["batch_per_place"]
        assert len(r["windows"]) == s["repeats"]
        for w in r["windows"]:
            assert w["seconds"] > 0 and w["cpu_seconds"] >= 0
            assert len(w["step_seconds"]) == len(w["losses"]) == s["steps"]
        assert len(r["images_per_sec"]) == s["repeats"]
        assert r["images_per_sec_median"] > 0
        # the worker's set-up (and its time to step N) counts from the config it got: inside
        # the harness's span from sending it to the ready message, never the wait before it
        # (torchrun's ranks had counted the builds of the modes before theirs)
        assert 0 < r["setup_s"] <= r["begin_to_ready_s"], (mode, r["setup_s"])
        assert r["peak_rss_mb"] > 0 and len(r["peak_rss_mb_per_process"]) == \
            (places if mode in ("torch-ddp", "ssaexec-nproc") else 1)
        losses = r["losses"]
        assert len(losses) == s["warmup"] + s["repeats"] * s["steps"]
        assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0], (mode, losses)
        assert r["trained"]
        compiled = r["compile_s"] is not None and r["compile_s"] > 0
        if mode == "torch-compile":
            assert compiled  # blocking, timed
        elif mode != "ssaexec":  # the default, tiered, may report its background compile
            assert not compiled, (mode, r["compile_s"])
    # same weights, same data: each one-place mode and each two-place mode trains alike
    assert runs[("seq", 1)]["losses"] == pytest.approx(runs[("torch-eager", 1)]["losses"],
                                                       rel=1e-4)
    assert runs[("ssaexec", 2)]["losses"] == pytest.approx(runs[("torch-ddp", 2)]["losses"],
                                                           rel=1e-4)
    # ssaexec under torchrun (2 processes x 1 place) trains like 1 process x 2 places
    assert runs[("ssaexec-nproc", 2)]["losses"] == pytest.approx(runs[("ssaexec", 2)]["losses"],
                                                                rel=1e-4)
    # the imported twin starts from the builder's weights: it trains alike
    assert runs[("ssaexec-from-torch", 2)]["losses"] == pytest.approx(
        runs[("ssaexec", 2)]["losses"], rel=1e-4)
    assert [c["name"] for c in result["comparisons"]] == ["ssaexec@2 / torch-ddp@2 images/sec"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for mode in ("seq", "ssaexec", "torch-eager", "torch-ddp"):
        assert mode in text


def test_scheduler_overhead_script(tmp_path, capsys):
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import scheduler_overhead
    finally:
        sys.path.remove(str(ROOT / "bench"))
    out = tmp_path / "so.json"
    assert scheduler_overhead.main(["--ops", "200", "--repeats", "1", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    executors = {r["executor"] for r in data["rows"]}
    assert {"python loop (floor)", "ssaexec Scheduler(1)", "ssaexec Scheduler(4)"} <= executors
    assert {r["graph"] for r in data["rows"]} == {"chain", "4 chains"}
    assert "us/op" in capsys.readouterr().out



@pytest.mark.slow
def test_failing_mode_is_reported_not_hidden(tmp_path, capsys):
    # batch 1 on an 8x8 image: torch's batch norm refuses a single value per channel
    out = tmp_path / "fail.json"
    rc = benchmark.main(["--model", "resnet18", "--base", "4", "--image-size", "8", "-b", "1",
                         "--warmup", "1", "--steps", "1", "--repeats", "1", "--places", "cpu:1",
                         "--modes", "torch-eager", "--json", str(out), "--plot", "none",
                         "--no-progress"])
    assert rc == 1
    run, = json.loads(out.read_text())["runs"]
    assert run["mode"] == "torch-eager" and "more than 1 value per channel" in run["error"]
    assert "FAILED" in capsys.readouterr().out
