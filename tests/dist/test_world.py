"""Multi-process training on torch.distributed (gloo, 127.0.0.1), with real processes.

Workers are ``tests/dist_worker.py`` started with torchrun's environment (or by
torchrun itself for the documented recipe). Every test kills what it started in
a ``finally`` and checks the rendezvous port is free again.
"""

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
import torch

import ssaexec as se
from ssaexec.dist import world as dist
from ssaexec.dist.group_collective import describe_collective

import dist_worker as W
from tests.ports import free_port

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = os.path.join(REPO, "tests", "dist_worker.py")
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")
WORLD = 2

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow, pytest.mark.processes]  # real processes


def _port_is_free(port):
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _env(**extra):
    env = dict(os.environ)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
              "MASTER_PORT", dist.DEBUG_ENV):
        env.pop(k, None)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    env["CUDA_VISIBLE_DEVICES"] = ""  # these tests are about gloo on CPU, GPUs or not
    env.update({k: str(v) for k, v in extra.items()})
    return env


class _Workers:
    """``WORLD`` worker processes of one scenario; killed (if still alive) on exit."""

    def __init__(self, scenario, out_dir, world=WORLD, **env):
        self.port = free_port()  # a port no other test running beside this one takes
        self.out_dir = out_dir
        self.world = world
        self.logs = [os.path.join(out_dir, f"out{r}.txt") for r in range(world)]
        self.procs = []
        for r in range(world):
            with open(self.logs[r], "w") as log:
                self.procs.append(subprocess.Popen(
                    [sys.executable, WORKER, scenario, str(out_dir)], cwd=REPO,
                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                    env=_env(RANK=r, WORLD_SIZE=world, LOCAL_RANK=r, LOCAL_WORLD_SIZE=world,
                             MASTER_ADDR="127.0.0.1", MASTER_PORT=self.port, **env)))

    def log(self, r):
        with open(self.logs[r]) as f:
            return f.read()

    def wait(self, timeout):
        deadline = time.monotonic() + timeout
        for p in self.procs:
            p.wait(max(0.1, deadline - time.monotonic()))
        return [p.returncode for p in self.procs]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)


def _logs(workers):
    return "\n".join(f"--- rank {r} ---\n{workers.log(r)[-3000:]}"
                     for r in range(workers.world))


@pytest.fixture(scope="module")
def train_records(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist_train")
    with _Workers("train", str(out)) as w:
        try:
            codes = w.wait(120)
        except subprocess.TimeoutExpired:
            pytest.fail("the workers did not finish in 120 s\n" + _logs(w))
        assert codes == [0] * WORLD, _logs(w)
        records = [torch.load(os.path.join(out, f"rank{r}.pt")) for r in range(WORLD)]
    assert _port_is_free(w.port)
    return records


def _reference(model, places):
    """Losses and parameters of 1 process x ``places`` places and of the sequential Executor."""
    main, startup, loss, shape = W.build(model)
    xs, ys = W.make_data(shape, WORLD * W.PLACES_PER_PROCESS)
    scope = se.Scope()
    with se.ParallelExecutor(se.cpu_places(places), main, startup, loss, scope=scope) as pe:
        assert not pe.distributed
        pe_losses = torch.stack([pe.run([loss], feed={"img": x, "label": y})[0]
                                 for x, y in zip(xs, ys, strict=True)])
        pe_params = {p.name: scope.find_var(p.name).clone() for p in main.all_parameters()}
    seq_scope, exe = se.Scope(), se.Executor()
    exe.run(startup, scope=seq_scope)
    seq_losses = torch.stack([exe.run(main, feed={"img": x, "label": y}, fetch_list=[loss],
                                      scope=seq_scope)[0] for x, y in zip(xs, ys, strict=True)])
    seq_params = {p.name: seq_scope.find_var(p.name) for p in main.all_parameters()}
    return (pe_losses, pe_params), (seq_losses, seq_params)


@pytest.mark.parametrize("run", ["mlp", "cnn", "cnn_fused"])
def test_two_processes_match_one_process_and_sequential(train_records, run):
    model = run.split("_")[0]
    assert [r["backend"] for r in train_records] == ["gloo"] * WORLD
    got = [r[run] for r in train_records]
    # every rank ends with bit-identical parameters and sees the same global loss
    for other in got[1:]:
        assert torch.equal(other["losses"], got[0]["losses"])
        for name, value in got[0]["params"].items():
            assert torch.equal(other["params"][name], value), name
    # the ranks trained different shards: their local losses differ
    assert not torch.allclose(got[0]["local_losses"], got[1]["local_losses"])
    if run == "cnn_fused":
        assert got[0]["collectives"] < len(got[0]["params"])  # buckets, not one per grad
    for ref_losses, ref_params in _reference(model, WORLD * W.PLACES_PER_PROCESS):
        assert torch.allclose(got[0]["losses"], ref_losses, rtol=1e-6, atol=0)
        assert ref_params.keys() == got[0]["params"].keys()
        for name, value in ref_params.items():
            assert torch.allclose(got[0]["params"][name], value, rtol=1e-6, atol=1e-9), name


def test_cross_process_all_reduces_are_started_and_completed_apart(train_records):
    # every cross-process all-reduce has its wait handle: several are in flight at once
    for rec in train_records:
        for run in ("mlp", "cnn", "cnn_fused"):
            assert rec[run]["waits"] == rec[run]["starts"] and rec[run]["waits"], run


def test_debug_mode_names_the_first_mismatched_collective(train_records):
    for r, rec in enumerate(train_records):
        res = rec["debug_mismatch"]
        assert res["type"] == "DistributedError", res
        msg = res["message"]
        assert msg.startswith(f"rank {r} of 2 (gloo): ranks disagree on the collective "
                              "sequence of step 1"), msg
        assert "first difference at position 2" in msg
        assert "rank 0: #2 all_reduce(fc_0.b_0@GRAD [10] float64)" in msg
        assert "rank 1: nothing (its list ends after 2 entries)" in msg
        assert res["seconds"] < W.TIMEOUT / 2  # no wait for the timeout (bound for a slow machine)
        # the check leaves the process group usable
        assert rec["after_checks"] == pytest.approx(0.5)


def test_programs_that_differ_fail_at_start_on_every_rank(train_records):
    for rec in train_records:
        res = rec["reduce_rejected"]
        assert res["type"] == "DistributedError", res
        assert "reduce_strategy='reduce' runs in one process only" in res["message"]
        res = rec["startup_mismatch"]
        assert res["type"] == "DistributedError", res
        assert "ranks disagree on the program's persistables" in res["message"]
        assert "rank 0: fc_1.w_0 [10, 8] float64" in res["message"]
        assert "rank 1: fc_1.w_0 [10, 9] float64" in res["message"]


def test_a_rank_that_hangs_makes_the_others_time_out(train_records):
    res = train_records[0]["hang"]
    assert res["type"] == "DistributedError", res
    assert res["message"].startswith("rank 0 of 2 (gloo): all_reduce(hung) failed ("), res
    assert "A peer process probably died, raised or timed out" in res["message"]
    assert 1.5 < res["seconds"] < W.TIMEOUT  # the side group's 2 s, not the 20 s one


def test_a_rank_that_raises_makes_the_others_fail_fast(train_records):
    r0, r1 = (rec["raise"] for rec in train_records)
    assert r1["type"] == "OpError" and "softmax_with_cross_entropy" in r1["message"], r1
    assert r0["type"] == "DistributedError", r0
    assert r0["message"].startswith("rank 0 of 2 (gloo): all_reduce(")
    assert r0["seconds"] < W.TIMEOUT / 2  # the group was aborted: no wait for the timeout
    after = train_records[1]["after"]
    assert after["type"] == "DistributedError" and "earlier step" in after["message"], after


def test_accumulation_and_compression_work_across_processes(tmp_path):
    import ssaexec as se
    with _Workers("strategies", str(tmp_path)) as w:
        assert w.wait(120) == [0] * WORLD, _logs(w)
        records = [torch.load(os.path.join(tmp_path, f"rank{r}.pt")) for r in range(WORLD)]
    for name, options in W.STRATEGY_RUNS.items():
        ref = W.train_with(se, options, distributed=False)
        for p, want in ref.items():
            got = [rec[name][p] for rec in records]
            assert torch.equal(got[0], got[1]), (name, p)  # the ranks agree exactly
            # accumulation is exact; the compressed sum rounds in bf16 across processes
            tol = dict(rtol=1e-9, atol=1e-12) if name == "accumulate" else \
                dict(rtol=2e-2, atol=2e-3)
            assert torch.allclose(got[0], want, **tol), (name, p)


def test_killed_rank_makes_the_others_raise_and_exit(tmp_path):
    """Rank 0 of 3 (it also hosts the rendezvous store) is SIGKILLed mid-step."""
    world, victim = 3, 0
    survivors = [r for r in range(world) if r != victim]
    with _Workers("kill", str(tmp_path), world=world, VICTIM=victim) as w:
        deadline = time.monotonic() + 90
        while "STALLING" not in w.log(victim):
            assert w.procs[victim].poll() is None, _logs(w)
            assert time.monotonic() < deadline, "the victim never got to its stall\n" + _logs(w)
            time.sleep(0.1)
        time.sleep(0.5)  # the survivors are now waiting in a collective for the victim
        os.killpg(w.procs[victim].pid, signal.SIGKILL)
        t0 = time.monotonic()
        for r in survivors:
            try:
                w.procs[r].wait(max(0.1, W.TIMEOUT - (time.monotonic() - t0)))
            except subprocess.TimeoutExpired:
                pytest.fail(f"rank {r} did not exit within the {W.TIMEOUT}s timeout\n" +
                            _logs(w))
        elapsed = time.monotonic() - t0
        w.procs[victim].wait(10)
        for r in survivors:
            log = w.log(r)
            assert w.procs[r].returncode == 1, _logs(w)
            # the collective a survivor was in: the gradients' all-reduce, or under
            # compiler="auto" (make test-auto) the ranks' agreement on the tier
            assert re.search(rf"DistributedError: rank {r} of {world} \(gloo\): "
                             r"(all_reduce\(|agreement \d+ on the tier)", log), log
            assert "RAISED" in log and "THREADS 1" in log, log  # pe.close() joined its threads
        assert elapsed < W.TIMEOUT
    assert all(p.poll() is not None for p in w.procs)
    assert _port_is_free(w.port)


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_rank_that_raises_under_torchrun_makes_torchrun_exit_nonzero(tmp_path):
    cmd = [TORCHRUN, "--standalone", "--nproc-per-node", str(WORLD), WORKER, "raise",
           str(tmp_path)]
    proc = subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        # a hang is what this bounds, generously (a 10x slower machine still fits)
        out, _ = proc.communicate(timeout=170)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    assert proc.returncode != 0, out
    assert "OpError" in out and "softmax_with_cross_entropy" in out, out
    pids = [int((tmp_path / f"pid{r}").read_text()) for r in range(WORLD)]
    assert not any(_pid_alive(p) for p in pids), out


def _doc_command():
    with open(os.path.join(REPO, "docs", "distributed.md")) as f:
        text = f.read()
    m = re.search(r"^torchrun --standalone --nproc-per-node 2 examples/train_distributed\.py.*$",
                  text, re.M)
    assert m, "docs/distributed.md lost its one-machine torchrun command"
    return shlex.split(m.group(0))


def test_documented_torchrun_recipe_runs(tmp_path):
    cmd = _doc_command()
    cmd[0] = TORCHRUN
    proc = subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    assert proc.returncode == 0, out
    assert "2 process(es), backend gloo" in out
    losses = [float(v) for v in re.findall(r"^step \d+ loss (\S+)$", out, re.M)]
    steps = int(cmd[cmd.index("--steps") + 1])
    assert len(losses) == steps, out  # printed by rank 0 only
    # the same training in this process, one process with 2 places: the same losses
    sys.path.insert(0, os.path.join(REPO, "examples"))
    try:
        import train_distributed as example
    finally:
        sys.path.pop(0)
    ref = example.train(steps, places=se.cpu_places(2), log=lambda s: None)
    assert ref == pytest.approx(losses, rel=1e-5)


_TEARDOWN_PROBE = """
import os, sys
import torch
from ssaexec import distributed as dist
import ssaexec as se
dist.init(backend="gloo", timeout=30)
# building a program imports torch._dynamo on first use, after the group exists
main, startup = se.Program(), se.Program()
with se.program_guard(main, startup):
    se.layers.fc(se.layers.data("x", [-1, 3], "float32"), 2)
import torch._dynamo  # noqa: F401
dist.average(torch.ones(2))
def gloo_threads():
    names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
    return [n for n in names if n.startswith(("pt_gloo", "gloo"))]
assert gloo_threads(), "gloo has run-loop threads while the group lives"
dist.shutdown()
left = gloo_threads()
print("left:", left)
sys.exit(1 if left else 0)
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs /proc thread names")
def test_shutdown_joins_the_gloo_threads_even_after_dynamo_is_imported():
    """The cause of the torchrun recipe's random SIGABRT at exit.

    ``torch.distributed.nn.functional`` captures ``group.WORLD`` in default
    arguments when imported; torch._dynamo imports it, and our shape inference
    imports dynamo. Imported after ``init``, it kept the group (and gloo's
    run-loop threads) alive past ``destroy_process_group``, and a run-loop thread
    that released its last work item during interpreter finalisation aborted the
    process. ``init`` imports it first, so ``shutdown`` joins the threads.
    """
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        assert k not in _env()
    proc = subprocess.run([sys.executable, "-c", _TEARDOWN_PROBE], env=_env(), cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "left: []" in proc.stdout


# --- in-process: helpers and errors that need no second process --------------------------

def test_shard_gives_equal_strided_shares():
    data = {"x": torch.arange(10), "y": torch.arange(10) * 2}
    shares = [dist.shard(data, r, 3) for r in range(3)]
    assert [s["x"].tolist() for s in shares] == [[0, 3, 6], [1, 4, 7], [2, 5, 8]]
    assert shares[1]["y"].tolist() == [2, 8, 14]
    seq = dist.shard(list("abcdefg"), 1, 2)
    assert list(seq) == ["b", "d", "f"] and len(seq) == 3 and seq[-1] == "f"
    assert list(dist.shard(list("abc"))) == ["a", "b", "c"]  # no process group: all of it
    with pytest.raises(se.DistributedError, match="differ in length"):
        dist.shard({"x": torch.arange(3), "y": torch.arange(4)}, 0, 2)
    with pytest.raises(se.DistributedError, match="0 <= rank < world_size"):
        dist.shard([1, 2], 2, 2)


def test_shard_batch_matches_the_place_split():
    x = torch.arange(14).reshape(7, 2)
    parts = [dist.shard_batch({"img": x, "lr": torch.tensor(0.1)}, r, 2) for r in range(2)]
    assert torch.equal(torch.cat([p["img"] for p in parts]), x)
    assert [p["img"].shape[0] for p in parts] == [4, 3]
    assert parts[1]["lr"].item() == pytest.approx(0.1)


def test_without_torchrun_everything_is_local(monkeypatch):
    for k in ("RANK", "WORLD_SIZE", dist.DEBUG_ENV):
        monkeypatch.delenv(k, raising=False)
    assert (dist.rank(), dist.world_size()) == (0, 1)
    assert dist.info() is None and not dist.is_initialized()
    assert dist.average(3.0).item() == 3.0
    s = dist.build_strategy(fuse_all_reduce_ops=True)
    assert (s.num_trainers, s.trainer_id, s.fuse_all_reduce_ops) == (1, 0, True)
    main, startup, loss, _ = W.build("mlp")
    with se.ParallelExecutor(se.cpu_places(2), main, startup, loss, scope=se.Scope()) as pe:
        assert not pe.distributed
    with pytest.raises(se.DistributedError, match="needs a process group"):
        se.ParallelExecutor(se.cpu_places(2), main, startup, loss, scope=se.Scope(),
                            build_strategy=se.BuildStrategy(num_trainers=2, trainer_id=0))
    with pytest.raises(se.DistributedError, match="distributed=True"):
        se.ParallelExecutor(se.cpu_places(2), main, startup, loss, scope=se.Scope(),
                            distributed=True)


def test_init_explains_a_missing_launcher(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    with pytest.raises(se.DistributedError, match="MASTER_ADDR and MASTER_PORT not set: "
                                                  "launch with torchrun"):
        dist.init()
    monkeypatch.delenv("WORLD_SIZE")
    with pytest.raises(se.DistributedError, match="RANK and WORLD_SIZE must both be set"):
        dist.init()
    assert not torch.distributed.is_initialized()


def test_world_of_one_group(monkeypatch):
    """``init`` without torchrun makes a world of one; ``distributed=True`` uses it anyway."""
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv(dist.DEBUG_ENV, "1")
    before = set(threading.enumerate())
    info = dist.init(backend="gloo", timeout=5)
    try:
        assert (info.rank, info.world_size, info.backend) == (0, 1, "gloo")
        assert dist.init() is info and dist.is_initialized()
        assert dist.average(torch.tensor([2.0, 4.0])).tolist() == [2.0, 4.0]
        dist.barrier()
        main, startup, loss, shape = W.build("cnn")
        with se.ParallelExecutor(se.cpu_places(2), main, startup, loss,
                                 scope=se.Scope()) as pe:
            assert not pe.distributed  # nothing to talk to
        # the whole cross-process path (checks, broadcast, hierarchical all-reduce, debug
        # mode) in one process: same result as 4 local places and as the sequential executor
        xs, ys = W.make_data(shape, 4)
        strategy = se.BuildStrategy(fuse_all_reduce_ops=True, fuse_bucket_mb=0.0005)
        scope = se.Scope()
        with se.ParallelExecutor(se.cpu_places(4), main, startup, loss, strategy, scope=scope,
                                 distributed=True) as pe:
            assert pe.distributed and pe._collective.debug
            losses = torch.stack([pe.run([loss], feed={"img": x, "label": y})[0]
                                  for x, y in zip(xs, ys, strict=True)])
            assert pe._collective.steps == W.STEPS
        for ref_losses, ref_params in _reference("cnn", 4):
            assert torch.allclose(losses, ref_losses, rtol=1e-6, atol=0)
            for name, value in ref_params.items():
                assert torch.allclose(scope.find_var(name), value, rtol=1e-6, atol=1e-9), name
        with pytest.raises(se.DistributedError, match="reduce_strategy='reduce' runs in one process only"):
            se.ParallelExecutor(se.cpu_places(2), main, startup, loss,
                                se.BuildStrategy(reduce_strategy="reduce"), scope=se.Scope(),
                                distributed=True)
        with pytest.raises(se.DistributedError, match="does not match the process group"):
            se.ParallelExecutor(se.cpu_places(2), main, startup, loss,
                                se.BuildStrategy(num_trainers=2, trainer_id=1),
                                scope=se.Scope())
        with pytest.raises(se.DistributedError, match="distributed=False contradicts"):
            se.ParallelExecutor(se.cpu_places(2), main, startup, loss,
                                se.BuildStrategy(num_trainers=2, trainer_id=1),
                                scope=se.Scope(), distributed=False)
    finally:
        dist.shutdown()
    assert not torch.distributed.is_initialized() and dist.info() is None
    assert set(threading.enumerate()) - before == set()


@pytest.mark.cuda
def test_nccl_world_of_one_on_two_cuda_places(monkeypatch):
    if not torch.distributed.is_nccl_available():
        pytest.skip("this torch build has no NCCL")
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    places = [se.CUDAPlace(0, 0), se.CUDAPlace(1, 0)]
    info = dist.init(places=places, timeout=60)
    try:
        assert info.backend == "nccl"
        assert dist.average(torch.tensor(3.0)).item() == 3.0
        main, startup, loss, shape = W.build("mlp")
        xs, ys = W.make_data(shape, 4)
        scope = se.Scope()
        with se.ParallelExecutor(places, main, startup, loss, scope=scope,
                                 distributed=True) as pe:
            assert pe.distributed
            losses = torch.stack([pe.run([loss], feed={"img": x, "label": y})[0]
                                  for x, y in zip(xs, ys, strict=True)])
        _, (seq_losses, seq_params) = _reference("mlp", 4)
        assert torch.allclose(losses, seq_losses, rtol=1e-6, atol=0)
        for name, value in seq_params.items():
            assert torch.allclose(scope.find_var(name).cpu(), value, rtol=1e-6, atol=1e-9)
    finally:
        dist.shutdown()


def test_describe_collective():
    item = (3, "all_reduce", ("w@GRAD", "b@GRAD"), ((4, 3), (3,)), ("float32", "float32"))
    assert describe_collective(item) == "#3 all_reduce(w@GRAD [4, 3] float32, b@GRAD [3] float32)"
