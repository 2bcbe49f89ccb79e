"""Tiered compilation (issue 50, ``ExecutionStrategy(compiler="auto")``, ``runtime.tiered``):
steps run at once on the straight-line code, exact against ``compiler=None``; segments
compile in the background and the runner switches at a step boundary, every segment at
once; a segment that cannot compile stays straight-line and says why; a new shape starts a
new background compile, never a wait; a second process with a warm cache switches at its
third step. Steps are counted, never timed: ``TieredLowering.wait`` waits for the
background compiles, so the switch step is known."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import ssaexec as se
from ssaexec.core.errors import SSAExecError
from ssaexec.runtime.tiered import straight_reason

# The whole module is `make test-tiered`'s, not `make test`'s, for its time: its executors
# compile in the background (seconds of CPU each on 2 cores). Fresh-clone run 49 also found
# a background trace sharing torch.fx's global trace state with a later test's from_torch
# (KeyError 'custom' in torch/fx/traceback.py): every trace now holds compat.TRACE_LOCK
# (tests/core/test_compat.py), and closing an executor skips its queued compiles
pytestmark = pytest.mark.tiered


@pytest.fixture(autouse=True)
def _no_compiler_from_the_environment(monkeypatch, tmp_path):
    # compiler=None is the reference here: make test-inductor's SSAEXEC_COMPILER (which
    # replaces None) would make it compile too
    monkeypatch.delenv("SSAEXEC_COMPILER", raising=False)
    # an empty Inductor cache a test: a cold compile is submitted at step 3 (step 2 is the
    # first measured for compile_beside), a warm load at step 2 (marker in the cache), so
    # a cache left by an earlier test would change the step counts
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor-cache"))


def _mlp(dtype="float64"):
    main, startup = se.Program(), se.Program()
    with se.program_guard(main, startup):
        x = se.layers.data("x", shape=[-1, 6], dtype=dtype)
        y = se.layers.data("y", shape=[-1, 1], dtype=dtype)
        h = se.layers.fc(x, size=8, act="relu")
        loss = se.layers.mean(se.layers.square_error_cost(se.layers.fc(h, size=1), y))
        se.optimizer.Adam(0.01).minimize(loss)  # Adam's update is compiled (SGD's is not)
    return main, startup, loss


def _feeds(n, rows=8, expand=False):
    gen = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        x = torch.randn(rows, 6, dtype=torch.float64, generator=gen)
        if expand:  # a feed that overlaps itself: its segment cannot be compiled
            x = x[:1].expand(rows, 6)
        out.append({"x": x, "y": torch.randn(rows, 1, dtype=torch.float64, generator=gen)})
    return out


def _train(compiler, feeds, wait_after=(), prog=None):
    """Run ``feeds``; after each step index in ``wait_after``, wait for the background
    compiles. Return the losses, the parameters and the runner's lowering."""
    main, startup, loss = prog or _mlp()
    scope = se.Scope()
    torch.manual_seed(1)
    se.Executor(se.CPUPlace(0)).run(startup, scope=scope)
    with se.ParallelExecutor(se.cpu_places(1), main, startup, loss.name, scope=scope,
                             exec_strategy=se.ExecutionStrategy(compiler=compiler)) as pe:
        losses = []
        for i, feed in enumerate(feeds):
            losses.append(pe.run([loss], feed=feed)[0])
            if i in wait_after:
                assert pe._runner((loss.name,)).lowering.wait(timeout=300)
        lowering = pe._runner((loss.name,)).lowering
    params = {p.name: scope.find_var(p.name).clone() for p in main.all_parameters()}
    return losses, params, lowering


def test_steps_run_straight_then_switch_at_a_step_boundary(capfd):
    feeds = _feeds(6)
    ref_losses, ref_params, _ = _train(None, feeds)
    # step 1 records, step 2 is measured (compile_beside: a core is free), step 3 submits
    # the compiles; once they are done, step 4 switches
    losses, params, low = _train("auto", feeds, wait_after=(2,))
    assert low.ran == {"straight": 3, "compiled": 3}
    assert [steps for steps, _ in low.switches] == [3]
    assert low.fallbacks == [] and low.compiles == 2  # forward+backward, Adam's update
    # the straight-line steps are compiler=None's, bit for bit; the compiled ones agree to
    # float64 rounding (fused kernels round the last bits their own way)
    assert all(torch.equal(a, b) for a, b in zip(losses[:3], ref_losses[:3]))
    assert all(float((a - b).abs().max()) < 1e-12 for a, b in zip(losses, ref_losses))
    assert all(float((params[n] - ref_params[n]).abs().max()) < 1e-12 for n in params)
    err = capfd.readouterr().err
    # one line at the switch: the steps before it, the compile time, step times
    assert err.count("ssaexec: switched to compiled segments after 3 steps on the "
                     "straight-line path (2 segments compiled by Inductor in ") == 1
    assert " ms a step before, " in err and "compiling" not in err


@pytest.mark.parametrize("optimizer", ["Adam", "Momentum"])
def test_straight_steps_with_nothing_to_submit_run_the_compiled_paths_runner(monkeypatch,
                                                                             optimizer):
    # no core ever free (compile_beside): after step 1 (records) and step 2 (meets its
    # signature), every step runs the compiled path's runner, on the same step counter:
    # compiler=None's losses and dropout masks, bit for bit. Momentum's update is a
    # segment Inductor refuses (a foreach kernel), never recorded: it does not hold the
    # steps on the segments' straight-line tier (it did, the transformer preset's
    # optimizer: 10% slower steps until the switch)
    from ssaexec.runtime import tiered
    monkeypatch.setattr(tiered, "FREE_CORE", float("inf"))
    main, startup = se.Program(), se.Program()
    with se.program_guard(main, startup):
        x = se.layers.data("x", shape=[-1, 6], dtype="float64")
        y = se.layers.data("y", shape=[-1, 1], dtype="float64")
        h = se.layers.dropout(se.layers.fc(x, size=8, act="relu"), 0.3)
        loss = se.layers.mean(se.layers.square_error_cost(se.layers.fc(h, size=1), y))
        if optimizer == "Adam":
            se.optimizer.Adam(0.01).minimize(loss)
        else:
            se.optimizer.Momentum(0.01, momentum=0.9).minimize(loss)
    feeds = _feeds(6)
    ref_losses, ref_params, _ = _train(None, feeds, prog=(main, startup, loss))
    losses, params, low = _train("auto", feeds, prog=(main, startup, loss))
    assert low.ran == {"straight": 6, "compiled": 0} and low.plain_steps == 4
    assert any(s.refused is not None for s in low.segs) == (optimizer == "Momentum")
    assert all(torch.equal(a, b) for a, b in zip(losses, ref_losses))
    assert all(torch.equal(params[n], ref_params[n]) for n in params)


def test_several_places_measure_both_ways_before_the_compiled_paths_runner(monkeypatch):
    # with 2 places the places rule probes threads and turns at steps 2 and 3, and
    # compile_beside weighs the most of both: the compiled path's runner (which probes on
    # its own) runs only from step 4, once both are measured on this runner
    from ssaexec.runtime import tiered
    monkeypatch.setattr(tiered, "FREE_CORE", float("inf"))
    main, startup, loss = _mlp()
    feeds = [{k: torch.cat([v, v]) for k, v in f.items()} for f in _feeds(6)]
    results = {}
    for compiler in (None, "auto"):
        scope = se.Scope()
        torch.manual_seed(1)
        se.Executor(se.CPUPlace(0)).run(startup, scope=scope)
        with se.ParallelExecutor(se.cpu_places(2), main, startup, loss.name, scope=scope,
                                 exec_strategy=se.ExecutionStrategy(compiler=compiler)) as pe:
            results[compiler] = [pe.run([loss], feed=f)[0] for f in feeds]
            low = pe._runner((loss.name,)).lowering
    assert low.ran == {"straight": 6, "compiled": 0} and low.plain_steps == 3
    assert low.busy_measured() is not None
    assert all(torch.equal(a, b) for a, b in zip(results["auto"], results[None]))


def test_a_segment_that_cannot_compile_stays_straight_line_and_says_why(capfd):
    feeds = _feeds(6, expand=True)
    ref_losses, _, _ = _train(None, feeds)
    losses, _, low = _train("auto", feeds, wait_after=(2,))
    # the forward+backward segment reads the expanded feed: straight-line code for good;
    # the update is compiled, and the runner switches with it
    assert [why for _, why in low.fallbacks] == [
        "its input 'x' overlaps itself in memory (an expanded tensor)"]
    assert low.ran == {"straight": 3, "compiled": 3} and low.compiles == 1
    assert all(float((a - b).abs().max()) < 1e-12 for a, b in zip(losses, ref_losses))
    err = capfd.readouterr().err
    assert err.count("runs uncompiled: its input 'x' overlaps itself") == 1
    assert err.count("1 kept uncompiled") == 1


def test_a_new_shape_runs_straight_line_while_it_compiles_then_switches_again():
    # 8 rows: record, measure, submit, (wait) switch; 4 rows: a miss, submitted at once
    # (measured already), straight while compiling; (wait) switches again at the next step
    feeds = _feeds(4) + _feeds(3, rows=4)
    ref_losses, _, _ = _train(None, feeds)
    losses, _, low = _train("auto", feeds, wait_after=(2, 4))
    assert low.ran == {"straight": 4, "compiled": 3}
    assert [steps for steps, _ in low.switches] == [3, 5]
    assert low.compiles == 3  # forward+backward at 8 and 4 rows, the update once
    assert all(float((a - b).abs().max()) < 1e-12 for a, b in zip(losses, ref_losses))


def test_where_auto_runs_no_tiers_and_the_default_switch(monkeypatch):
    places = se.cpu_places(1)
    run = se.ExecutionStrategy(compiler="auto")
    assert straight_reason(places, se.BuildStrategy(), run) is None
    # several processes run tiers too, agreed across ranks (tests/dist/test_tiered_processes.py)
    assert straight_reason(places, se.BuildStrategy(num_trainers=2), run) is None
    assert "CUDA graph" in straight_reason(places, se.BuildStrategy(),
                                          se.ExecutionStrategy(compiler="auto",
                                                               cuda_graph=True))
    with pytest.raises(SSAExecError, match="compiler must be one of"):
        se.ExecutionStrategy(compiler="tiered")
    # the default is the one switch's; the environment replaces it, and None ("none": None)
    from ssaexec.core.strategy import DEFAULT_COMPILER
    assert DEFAULT_COMPILER == "auto"  # issue 50: tiered is what users get
    monkeypatch.delenv("SSAEXEC_COMPILER", raising=False)
    assert se.ExecutionStrategy().compiler == "auto"
    monkeypatch.setenv("SSAEXEC_COMPILER", "auto")
    assert se.ExecutionStrategy().compiler == "auto"
    assert se.ExecutionStrategy(compiler=None).compiler == "auto"
    monkeypatch.setenv("SSAEXEC_COMPILER", "none")
    assert se.ExecutionStrategy().compiler is None
    assert se.ExecutionStrategy(compiler="inductor").compiler == "inductor"


_SECOND_RUN = textwrap.dedent("""
    import sys, torch
    sys.path.insert(0, {tests!r})
    from runtime.test_tiered import _feeds, _mlp
    import ssaexec as se
    main, startup, loss = _mlp()
    scope = se.Scope()
    se.Executor(se.CPUPlace(0)).run(startup, scope=scope)
    with se.ParallelExecutor(se.cpu_places(1), main, startup, loss.name, scope=scope,
            exec_strategy=se.ExecutionStrategy(compiler="auto")) as pe:
        for i, feed in enumerate(_feeds(4)):
            pe.run([loss], feed=feed)
            if i == 2 and sys.argv[1] == "wait":  # the first run: compile it all
                pe._runner((loss.name,)).lowering.wait(timeout=300)
        low = pe._runner((loss.name,)).lowering
        print("switches", [s for s, _ in low.switches], "ran", low.ran)
""")


@pytest.mark.slow
@pytest.mark.tiered
def test_a_second_process_with_a_warm_cache_switches_at_its_third_step(tmp_path):
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("SSAEXEC_COMPILER", None)
    script = _SECOND_RUN.format(tests=os.path.dirname(os.path.dirname(__file__)))

    def run(mode):
        out = subprocess.run([sys.executable, "-c", script, mode], env=env, text=True,
                             capture_output=True, timeout=600)
        assert out.returncode == 0, out.stderr
        return out.stdout
    assert "switches [3]" in run("wait")  # cold: submitted at step 3, once measured
    # no wait here: the graphs are expected in the cache, so step 3's boundary loads them
    assert "switches [2] ran {'straight': 2, 'compiled': 2}" in run("go")


@pytest.mark.tiered
@pytest.mark.slow  # a worker process's start and a cold compile: 10-25 s on 2 cores
@pytest.mark.parametrize("split_build", [False, True])
def test_the_worker_process_fills_the_cache_this_process_loads(tmp_path, monkeypatch,
                                                                split_build):
    """The compile proper runs in the worker process; this process's compile of the same
    (portable) graph, with the same options, is then a hit in Inductor's on-disk cache,
    and computes the same. The worker takes torch's thread count (a part of the cache
    key) and Inductor's cache directory with each graph, not at its start: here both
    changed in between."""
    from torch._dynamo.utils import counters

    from ssaexec.core import compat
    from ssaexec.runtime.compile_worker import CompileWorker, portable
    from ssaexec.runtime.inductor import compile_graph
    x, y = torch.randn(4, 3), torch.randn(4, 3)
    gm = portable(compat.make_fx(lambda a, b: ((a * b + 1).relu(),))(x, y))
    worker = CompileWorker()
    threads = torch.get_num_threads()
    building = []
    try:
        worker.start()  # before the graph: it imports Inductor and checks the CPU's ISA
        proc = worker.proc
        assert proc is not None and proc.poll() is None
        # changed after the worker's start: both come with the graph
        monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
        torch.set_num_threads(2 if threads == 1 else 1)
        assert worker.compile(gm, [x, y], split_build,
                              building=lambda: building.append(proc.poll())) is None
        assert building == [None]  # once, while the worker compiled: as its C++ build began
        assert worker.proc is proc  # the same process, started once
        # the same graph again: a hit in the worker's cache, no C++ build to say
        assert worker.compile(gm, [x, y], split_build,
                              building=lambda: building.append(proc.poll())) is None
        assert building == [None]
    finally:
        worker.close()
    assert worker.compile(gm, [x, y]) == "the compile worker is closed"  # never restarted
    try:
        hits = counters["inductor"]["fxgraph_cache_hit"]
        fn, _ = compile_graph(gm, [x, y], split_build)
        assert counters["inductor"]["fxgraph_cache_hit"] == hits + 1
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(fn(x, y)[0], (x * y + 1).relu())


def test_prestart_starts_the_worker_only_where_auto_will_want_it(monkeypatch):
    """``prestart`` (at ``from_torch``) starts nothing where the default compiler is not
    "auto", nor where this process's share of the cores leaves none free."""
    from ssaexec.runtime import tiered
    monkeypatch.setattr(tiered, "_PROCESS", tiered.CompileWorker())
    monkeypatch.setenv("SSAEXEC_COMPILER", "none")
    assert tiered.prestart() is False
    monkeypatch.setenv("SSAEXEC_COMPILER", "inductor")
    assert tiered.prestart() is False
    monkeypatch.setenv("SSAEXEC_COMPILER", "auto")
    # a process per core: no core free beside the import's
    assert tiered.prestart(local_processes=tiered.cores()) is False
    assert tiered._PROCESS.proc is None
    if tiered.compile_beside(1.0, tiered.cores()):  # this process alone: a core is free
        try:
            assert tiered.prestart() is True
            proc = tiered._PROCESS.proc
            assert proc is not None and proc.poll() is None
            assert tiered.prestart() is True and tiered._PROCESS.proc is proc  # once
        finally:
            tiered._PROCESS.close()


def test_a_graph_that_cannot_reach_the_worker_is_compiled_here():
    from ssaexec.runtime.compile_worker import CompileWorker
    worker = CompileWorker()
    # a graph that does not pickle: the worker is not used again, the caller compiles
    why = worker.compile(lambda: None, [])
    assert why.startswith("the compile worker failed (") and worker.proc is None
    assert worker.compile(None, []) == why


_CACHE_DIR = textwrap.dedent("""
    import os, sys
    from ssaexec.runtime.tiered import _cache_dir
    ours = _cache_dir()
    assert "torch._inductor" not in sys.modules, "the cache path imported Inductor"
    from torch._inductor.runtime.cache_dir_utils import cache_dir
    # torch 2.11 returns a relative TORCHINDUCTOR_CACHE_DIR as given: the same folder
    print(ours == os.path.abspath(cache_dir()), ours)
""")


@pytest.mark.parametrize("where", [None, "rel/cache"])
def test_the_cache_path_is_inductors_without_importing_it(tmp_path, where):
    """The step that submits the compiles names each segment's warm-cache marker: in the
    training thread, so without Inductor's import (0.8-1.9 s), and at Inductor's path."""
    env = dict(os.environ)
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    if where is not None:
        env["TORCHINDUCTOR_CACHE_DIR"] = where
    out = subprocess.run([sys.executable, "-c", _CACHE_DIR], env=env, text=True, cwd=tmp_path,
                         capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("True "), out.stdout


def test_lazy_sparse_adam_trains_alike_under_auto():
    # a segment refused when its compile was submitted (its sparse gradient is an expanded
    # tensor) once ran its step's code twice, applying Adam twice (0.018 apart after 6
    # steps); and a refusal in the background thread ran the segment there. Now each runs
    # once: equal to None's up to the switch's float32 rounding (a warm cache switches at
    # step 3)
    from tests.ops.test_sparse import build, feeds

    def run(compiler):
        main, startup, loss = build(True, se.optimizer.Adam(0.01, lazy_mode=True), vocab=1000)
        scope = se.Scope()
        se.Executor().run(startup, scope=scope)
        with se.ParallelExecutor(se.cpu_places(2), main, scope=scope, loss_name=loss.name,
                                 exec_strategy=se.ExecutionStrategy(compiler=compiler)) as pe:
            for f in feeds(6, vocab=1000):
                pe.run([loss.name], feed=f)
            return pe.local_scopes[0].find_var("embedding_0.w_0").clone()
    torch.testing.assert_close(run("auto"), run("none"), rtol=1e-5, atol=1e-6)
