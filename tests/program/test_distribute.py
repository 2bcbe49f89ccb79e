"""PlaceableBlock, DistributedBlock and the parameter-server transpile (seed 002).

In one process: a PlaceableBlock program trains as the plain one; the dependency
table; the trainer and server programs (placement, split pieces, replicated LR ops,
startups whose pieces are slices of the original values); files and the CLI. With
real processes on 127.0.0.1 (slow): 2 trainers and 2 servers in sync mode give 2-place
data parallelism's parameters, async mode trains, a dead server is reported by the
trainers within the timeout, and ``ssaexec launch`` runs.
"""

import os
import signal
import subprocess
import sys
import time

import pytest
import torch

import ssaexec as se
from ssaexec.cli.main import main as cli_main
from ssaexec.program.example_models import build_uci_housing, build_uci_housing_pserver
from ssaexec.program.distribute import dependencies
from ssaexec.program.text import program_from_text

from tests.ports import free_port

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS = 5


def mlp(placeable=True, opt=None, hidden=64):
    """A two-layer regression; its optimizer in a PlaceableBlock (or not)."""
    main, startup = se.Program(), se.Program()
    with se.program_guard(main, startup):
        x = se.layers.data("x", shape=[-1, 13], dtype="float32")
        y = se.layers.data("y", shape=[-1, 1], dtype="float32")
        h = se.layers.fc(x, size=hidden, act="relu")
        loss = se.layers.mean(se.layers.square_error_cost(se.layers.fc(h, size=1), y))
        _optimize(loss, opt() if opt else se.optimizer.SGD(learning_rate=0.05), placeable)
    return main, startup, loss.name


def _optimize(loss, opt, placeable):
    if placeable:
        params_grads = se.append_backward(loss)
        with se.layers.PlaceableBlock(inputs=params_grads):
            opt.apply_gradients(params_grads)
    else:
        opt.minimize(loss)


def embedding_model(placeable=True, vocab=1000):
    """A sparse embedding (``is_sparse``) under a regression head."""
    main, startup = se.Program(), se.Program()
    with se.program_guard(main, startup):
        ids = se.layers.data("ids", shape=[-1, 4], dtype="int64")
        y = se.layers.data("y", shape=[-1, 1], dtype="float32")
        emb = se.layers.embedding(ids, size=[vocab, 8], is_sparse=True)
        pred = se.layers.fc(se.layers.reduce_mean(emb, dim=1), size=1)
        loss = se.layers.mean(se.layers.square_error_cost(pred, y))
        _optimize(loss, se.optimizer.SGD(learning_rate=0.5), placeable)
    return main, startup, loss.name


def id_batches(n=STEPS, rows=8, vocab=1000, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [{"ids": torch.randint(0, vocab, (rows, 4), generator=g),
             "y": torch.randn(rows, 1, generator=g)} for _ in range(n)]


def momentum_lr():
    return se.optimizer.Momentum(se.optimizer.lr.StepDecay(0.05, step_size=2, gamma=0.5),
                                 momentum=0.9)


def batches(n=STEPS, rows=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(13, 1, generator=g)
    out = []
    for _ in range(n):
        x = torch.randn(rows, 13, generator=g)
        out.append({"x": x, "y": x @ w + 0.1 * torch.randn(rows, 1, generator=g)})
    return out


def params(scope, main):
    return {p.name: scope.find_var(p.name).clone() for p in main.all_parameters()}


def data_parallel(build, feeds, places=2):
    main, startup, loss = build()
    scope = se.Scope()
    se.Executor().run(startup, scope=scope)
    with se.ParallelExecutor(se.cpu_places(places), main, scope=scope, loss_name=loss) as pe:
        for f in feeds:
            pe.run([loss], feed=f)
        return params(pe.local_scopes[0], main)


def rel_err(a, b):
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item()


# --- one process ------------------------------------------------------------------------------
@pytest.mark.parametrize("opt", [None, momentum_lr, lambda: se.optimizer.Adam(0.01)],
                         ids=["sgd", "momentum-lr-schedule", "adam"])
def test_a_placeable_block_trains_where_it_stands(opt):
    feeds = batches()
    ref = data_parallel(lambda: mlp(False, opt), feeds, places=1)
    for places in (1, 2):
        got = data_parallel(lambda: mlp(True, opt), feeds, places)
        ref_p = ref if places == 1 else data_parallel(lambda: mlp(False, opt), feeds, 2)
        for name in ref:
            assert torch.equal(got[name], ref_p[name]), name
    main, _, _ = mlp(True, opt)
    main.validate()
    op = next(op for op in main.global_block().ops if op.type == "placeable_block")
    assert op.role == "optimize"
    assert set(op.output("Out")) >= {p.name for p in main.all_parameters()}


def test_the_dependency_table_is_the_seeds():
    main, _, _ = build_uci_housing_pserver()
    w, b = "fc_0.w_0", "fc_0.b_0"
    assert dependencies(main) == [
        {"block": 0, "inputs": [w, b], "outputs": [w + "@GRAD", b + "@GRAD"]},
        {"block": 1, "inputs": [w + "@GRAD", b + "@GRAD"], "outputs": [w, b]}]


def test_placement_round_robin_and_split_pieces():
    main, startup, _ = build_uci_housing_pserver()
    dp = se.transpile(main, trainers=2, pservers=2, startup=startup)
    assert dp.placement == {0: [("fc_0.w_0", None)], 1: [("fc_0.b_0", None)]}
    assert [dp.role(r) for r in range(4)] == [("trainer", 0), ("trainer", 1), ("pserver", 0),
                                              ("pserver", 1)]
    trainer_ops = [op.type for op in dp.trainer.global_block().ops]
    assert "placeable_block" not in trainer_ops and len(dp.trainer.blocks) == 1
    assert trainer_ops[-4:] == ["send", "send", "recv", "recv"]
    main, startup, _ = mlp(opt=momentum_lr, hidden=40)
    dp = se.transpile(main, 2, 3, startup, split_threshold=100)
    pieces = {k: dict(v) for k, v in dp.placement.items()}
    assert pieces[0]["fc_0.w_0.block0"] == 5 and pieces[2]["fc_0.w_0.block2"] == 4  # 13 rows
    assert {n for v in pieces.values() for n in v if "block" not in n} == {
        "fc_0.b_0", "fc_1.w_0", "fc_1.b_0"}
    for k, server in enumerate(dp.pservers):
        server.validate()
        sub = server.block(1)
        types = [op.type for op in sub.ops]
        # the LR schedule and the step counter run on every server, with its own copy
        assert types[0] == "lr_schedule" and types[-1] == "scale"
        assert f"fc_0.w_0_velocity_0.block{k}" in server.global_block().vars
        assert sub.vars[f"fc_0.w_0@GRAD.block{k}"].is_data  # fed by listen_and_serv
    dp.trainer.validate()
    assert [op.type for op in dp.trainer.global_block().ops].count("concat") == 1


def test_decay_ops_and_their_sub_blocks_move_with_the_optimizer():
    from ssaexec.program.builder import create_persistable
    from ssaexec.program.initializer import Constant
    main, startup = se.Program(), se.Program()
    with se.program_guard(main, startup):
        x = se.layers.data("x", shape=[-1, 13], dtype="float32")
        y = se.layers.data("y", shape=[-1, 1], dtype="float32")
        loss = se.layers.mean(se.layers.square_error_cost(se.layers.fc(x, size=1), y))
        params_grads = se.append_backward(loss)
        opt = se.optimizer.SGD(0.1)
        with se.layers.PlaceableBlock(inputs=params_grads):
            opt.apply_gradients(params_grads)
            # halve the rate after every step while a flag is set: an op owning a sub-block
            create_persistable("decay_on", [1], "bool", Constant(1.0))
            here = main.current_block()
            sub = main.create_block(parent_idx=here.idx)
            lr = opt.lr_var.name
            sub.append_op("scale", {"X": [lr]}, {"Out": [lr]}, {"scale": 0.5})
            here.append_op("conditional_block", {"Cond": ["decay_on"], "Input": [lr]},
                           {"Out": [lr]}, {"sub_block": se.BlockRef(sub.idx)})
    main.validate()
    scope = se.Scope()
    se.Executor().run(startup, scope=scope)
    for f in batches(3):
        se.Executor().run(main, feed=f, scope=scope)
    assert scope.find_var(lr).item() == pytest.approx(0.1 / 8)
    dp = se.transpile(main, 1, 2, startup)
    for server in dp.pservers:
        server.validate()
        assert [b.parent_idx for b in server.blocks] == [-1, 0, 1]
        cond = server.block(1).ops[-1]
        assert cond.type == "conditional_block" and cond.attrs["sub_block"] == se.BlockRef(2)
        assert [op.type for op in server.block(2).ops] == ["scale"]
        assert program_from_text(str(server)) == server
    assert len(dp.trainer.blocks) == 1


def test_sparse_gradients_travel_as_rows():
    main, startup, _ = embedding_model()
    dp = se.transpile(main, 2, 2, startup, split_threshold=100)
    assert dp.placement[0][0] == ("embedding_0.w_0.block0", 500)
    ops = dp.trainer.global_block().ops
    split = next(op for op in ops if op.type == "split")
    assert split.input("X") == ["embedding_0.w_0@GRAD"]
    sends = [op for op in ops if op.type == "send"]
    assert sends[0].attrs["sparse"] == [0] and sends[1].attrs["sparse"] == [0]
    for k, server in enumerate(dp.pservers):
        listen = server.global_block().ops[0]
        assert listen.attrs["sparse"] == [f"embedding_0.w_0@GRAD.block{k}"]
    # the trainer's split of a sparse gradient keeps it sparse, rows renumbered per piece
    from ssaexec.ops.registry import get_op_def
    g = torch.sparse_coo_tensor(torch.tensor([[3, 600, 999]]), torch.ones(3, 8), (1000, 8),
                                check_invariants=False).coalesce()
    parts = get_op_def("split").kernel({"X": g}, {"sections": [500, 500], "axis": 0,
                                                  "num": 0})["Out"]
    assert all(p.is_sparse for p in parts)
    assert parts[0].indices().tolist() == [[3]] and parts[1].indices().tolist() == [[100, 499]]
    assert torch.equal(torch.cat([p.to_dense() for p in parts]), g.to_dense())


def test_server_startups_hold_slices_of_the_original_values():
    main, startup, _ = mlp(opt=lambda: se.optimizer.Adam(0.01), hidden=40)
    dp = se.transpile(main, 2, 2, startup, split_threshold=100)
    full = se.Scope()
    se.Executor().run(startup, scope=full)
    for k, st in enumerate(dp.pserver_startups):
        st.validate()
        scope = se.Scope()
        se.Executor().run(st, scope=scope)
        w = scope.find_var(f"fc_0.w_0.block{k}")
        rows = [7, 6][k]
        assert torch.equal(w, full.find_var("fc_0.w_0")[7 * k: 7 * k + rows])
        b1 = scope.find_var(f"fc_0.w_0_beta1_pow_0.block{k}")  # replicated per piece
        assert torch.equal(b1, full.find_var("fc_0.w_0_beta1_pow_0"))
    t = se.Scope()
    se.Executor().run(dp.trainer_startup, scope=t)
    assert torch.equal(t.find_var("fc_0.w_0"), full.find_var("fc_0.w_0"))
    assert t.find_var("fc_0.w_0_moment1_0") is None  # optimizer state lives on the servers


def test_programs_round_trip_and_the_cli_writes_dumps_and_draws_them(tmp_path, capsys):
    main, startup, _ = mlp(opt=momentum_lr)
    dp = se.transpile(main, 2, 2, startup, split_threshold=100)
    for stem, prog in dp.files().items():
        for suffix in (".json", ".ssa"):
            path = tmp_path / f"{stem}{suffix}"
            se.save_program(prog, str(path))
            assert se.load_program(str(path)) == prog, stem
    example = os.path.join(REPO, "examples", "uci_housing_pserver.json")
    assert cli_main(["transpile", example, "--trainers", "2", "--pservers", "2",
                     "-o", str(tmp_path / "dist")]) == 0
    assert "pserver1 (rank 3): fc_0.b_0" in capsys.readouterr().out
    for name in ("trainer", "pserver0", "pserver1"):
        path = str(tmp_path / "dist" / f"{name}.json")
        assert cli_main(["dump", path, "--places", "cpu:1"]) == 0
        assert cli_main(["viz", path, "-o", str(tmp_path / f"{name}.dot"),
                         "--places", "cpu:1"]) == 0
    out = capsys.readouterr().out
    assert "listen_and_serv" in out and "send" in out


def test_errors():
    main, startup, _ = build_uci_housing()
    with pytest.raises(se.ProgramError, match="exactly one PlaceableBlock"):
        se.transpile(main, 2, 2, startup)
    with pytest.raises(se.ProgramError, match="mode"):
        se.transpile(build_uci_housing_pserver()[0], 2, 2, mode="eventually")
    main, startup, loss = build_uci_housing_pserver()
    dp = se.transpile(main, 1, 1, startup)
    scope = se.Scope()
    se.Executor().run(dp.trainer_startup, scope=scope)
    with pytest.raises(se.DistributedError, match="no[ne]* process group|there is none"):
        se.Executor().run(dp.trainer, feed=batches(1)[0], fetch_list=[loss], scope=scope)
    with pytest.raises(se.ProgramError, match="never writes"):
        with se.program_guard(se.Program(), se.Program()):
            x = se.layers.data("x", shape=[-1, 2], dtype="float32")
            with se.layers.PlaceableBlock(outputs=[x]):
                se.layers.scale(x, 2.0)


# --- real processes -------------------------------------------------------------------------------
def _worker(scenario, out):
    """One rank of a test run: 2 trainers + 2 servers (ranks 2, 3)."""
    se.distributed.init(backend="gloo", timeout=30)
    rank = se.distributed.rank()
    build = {"seed": lambda: build_uci_housing_pserver(optimizer=se.optimizer.SGD(0.05)),
             "split": lambda: mlp(opt=momentum_lr, hidden=40),
             "sparse": embedding_model}[scenario.split("-")[0]]
    main, startup, loss = build()
    mode = "async" if "async" in scenario else "sync"
    dp = se.transpile(main, 2, 2, startup, mode=mode, split_threshold=100,
                      timeout=float(os.environ.get("TEST_TIMEOUT", "30")))
    kind, i = dp.role(rank)
    n = 40 if mode == "async" else STEPS
    data = id_batches(n) if scenario.startswith("sparse") else batches(n)
    feeds = [{k: v[4 * i: 4 * i + 4] for k, v in b.items()} for b in data]
    losses = []

    def on_step(k, values):
        losses.append(values[0].item())
        print(f"STEP {k}", flush=True)
        if "dead" in scenario and kind == "trainer" and k == 1:
            time.sleep(1.0)  # the test kills server 1 now

    from ssaexec.execution.pserver import run_role
    t0 = time.monotonic()
    try:
        scope = run_role(dp, rank, feeds, [loss], on_step=on_step)
    except se.DistributedError as e:
        torch.save({"error": str(e), "seconds": time.monotonic() - t0},
                   os.path.join(out, f"rank{rank}.pt"))
        raise
    if kind == "trainer":
        torch.save({"params": params(scope, main), "losses": losses},
                   os.path.join(out, f"rank{rank}.pt"))
    se.distributed.shutdown()


class _Ranks:
    def __init__(self, scenario, out, **env):
        port = free_port()  # a port no other test running beside this one takes
        base = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
        base.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="4",
                    OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", PYTHONPATH=REPO,
                    **{k: str(v) for k, v in env.items()})
        self.procs = [subprocess.Popen([sys.executable, __file__, scenario, str(out)],
                                       env=dict(base, RANK=str(r), LOCAL_RANK=str(r)),
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                       text=True, start_new_session=True) for r in range(4)]

    def finish(self, timeout=120):
        outs = [p.communicate(timeout=timeout)[0] for p in self.procs]
        return [p.returncode for p in self.procs], outs

    def kill_all(self):
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def _records(tmp_path, ranks):
    return [torch.load(tmp_path / f"rank{r}.pt") for r in ranks]


@pytest.mark.processes
@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("scenario,build", [
    ("seed", lambda: build_uci_housing(optimizer=se.optimizer.SGD(0.05))),
    ("split", lambda: mlp(False, momentum_lr, hidden=40)),
    ("sparse", lambda: embedding_model(False))],
    ids=["seed-example", "split-momentum", "sparse-embedding"])
def test_sync_mode_equals_two_place_data_parallelism(tmp_path, scenario, build):
    ranks = _Ranks(scenario, tmp_path)
    try:
        codes, outs = ranks.finish()
    finally:
        ranks.kill_all()
    assert codes == [0, 0, 0, 0], outs
    ref = data_parallel(build, id_batches() if scenario == "sparse" else batches())
    for rec in _records(tmp_path, [0, 1]):
        for name in ref:
            assert rel_err(rec["params"][name], ref[name]) < 1e-6, name


@pytest.mark.processes
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_async_mode_trains(tmp_path):
    ranks = _Ranks("seed-async", tmp_path)
    try:
        codes, outs = ranks.finish()
    finally:
        ranks.kill_all()
    assert codes == [0, 0, 0, 0], outs
    for rec in _records(tmp_path, [0, 1]):
        first, last = rec["losses"][:5], rec["losses"][-5:]
        assert sum(last) < 0.5 * sum(first), rec["losses"]


@pytest.mark.processes
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_dead_server_is_reported_by_the_trainers_within_the_timeout(tmp_path):
    timeout = 10
    ranks = _Ranks("split-dead", tmp_path, TEST_TIMEOUT=timeout)
    try:
        # wait until trainer 0 has run a step, then kill server 1 (rank 3)
        deadline = time.monotonic() + 120
        for line in iter(ranks.procs[0].stdout.readline, ""):
            if line.startswith("STEP 1") or time.monotonic() > deadline:
                break
        ranks.procs[3].kill()
        killed = time.monotonic()
        for p in ranks.procs[:2]:
            p.wait(timeout + 30)
        waited = time.monotonic() - killed
    finally:
        ranks.kill_all()
    assert waited < 3 * timeout  # generous for a slow machine; without the timeout: a hang
    for r, rec in zip((0, 1), _records(tmp_path, [0, 1]), strict=True):
        assert ranks.procs[r].returncode != 0
        assert "parameter server rank" in rec["error"], rec["error"]
        assert rec["seconds"] < 60


@pytest.mark.processes
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_launch_starts_every_process(tmp_path):
    example = os.path.join(REPO, "examples", "uci_housing_pserver.json")
    proc = subprocess.run([sys.executable, "-m", "ssaexec", "launch", "--trainers", "2",
                           "--pservers", "2", example, "--steps", "3"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=200,
                          env=dict(os.environ, PYTHONPATH=REPO, CUDA_VISIBLE_DEVICES=""))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("step 3: loss") == 2
    assert "[pserver1] pserver 1: every trainer is done" in proc.stdout


if __name__ == "__main__":
    _worker(sys.argv[1], sys.argv[2])
