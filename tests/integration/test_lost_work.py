"""Work is never lost at the end of a run, and a restart never hangs or crashes on the folder.

* ``ssaexec run --save X.pdiparams`` of a Paddle program with a persistable ssaexec has no
  value for (one in a sub-block) is refused *before* the first step, naming the var and
  the way out (a checkpoint), which works; so is a ``--save`` into a missing folder.
* ``.pdiparams`` files are written atomically (``safe_files.atomic_write``, the
  checkpoints' writer): a symlink at the target is replaced, never written through, and
  a write that fails half way (a file-size limit) leaves the old file and no temporary.
* ``Checkpoints.resume`` opens only regular files, without blocking: FIFOs and symlinks
  named like checkpoints are skipped (the FIFO test has a hard timeout, so a regression
  fails rather than hangs); folders and symlinks named like dead saves are left alone.
* A newest checkpoint with a bad RNG state is skipped for the one before it, and a
  refused checkpoint loads nothing: the parameters are what they were.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import ssaexec as se
from ssaexec.state.checkpoint import _digest, load_checkpoint
from ssaexec.core.errors import ProgramError, SSAExecError
from ssaexec.frontends.paddle import load_params, save_params
from paddle_models import FEED_MINIBATCH, FETCH_LIST, ProgramBuilder
from tests.cli.test_cli import PLACES, assert_clean_error, cli, example  # noqa: F401 - cli: a fixture
from tests.state.test_resume import _program, _train

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# --- --save is checked before the first step ----------------------------------------------
def _sub_block_model(folder):
    """A legacy inference program (x @ w) whose block 1 declares a persistable 'sub_w',
    its .pdiparams (w and sub_w) and a feed with a label for --finetune mse."""
    b = ProgramBuilder()
    b.var("feed", [], kind=FEED_MINIBATCH, persistable=True)
    b.var("fetch", [], kind=FETCH_LIST, persistable=True)
    x = b.var("x", [-1, 3], need_check_feed=True, stop_gradient=True)
    w = b.var("w", [3, 2], persistable=True, is_parameter=True)
    y = b.var("y", [-1, 2])
    b.op("feed", {"X": ["feed"]}, {"Out": [x]}, {"col": 0})
    b.op("matmul_v2", {"X": [x], "Y": [w]}, {"Out": [y]}, {"trans_x": False, "trans_y": False})
    b.op("fetch", {"X": [y]}, {"Out": ["fetch"]}, {"col": 0})
    sub = b.msg.blocks.add(idx=1, parent_idx=0)
    v = sub.vars.add(name="sub_w", persistable=True, is_parameter=True)
    v.type.type = 7  # LOD_TENSOR
    v.type.lod_tensor.tensor.data_type = 5  # FP32
    v.type.lod_tensor.tensor.dims.extend([2])
    model = folder / "m.pdmodel"
    model.write_bytes(b.bytes())
    params = folder / "m.pdiparams"
    save_params(params, {"w": torch.ones(3, 2), "sub_w": torch.zeros(2)}, ["sub_w", "w"])
    rng = np.random.default_rng(0)
    feed = folder / "feed.npz"
    np.savez(feed, x=rng.standard_normal((8, 3)).astype("float32"),
             label=rng.standard_normal((8, 2)).astype("float32"))
    return model, params, feed


def test_a_pdiparams_save_that_cannot_be_complete_is_refused_before_training(cli, tmp_path):
    model, params, feed = _sub_block_model(tmp_path)
    run = ["run", model, "--startup", params, "--finetune", "mse", "--feed", feed,
           "--steps", 3, "--places", "cpu:1", "--no-progress", "--save"]
    out = tmp_path / "trained.pdiparams"
    res = cli(run + [out])
    assert_clean_error(res, f"--save {out}: Paddle's parameter file holds every persistable",
                       "no value for 1 of them: 'sub_w' (block 1)", "Nothing was trained",
                       "--save RUN.safetensors")
    assert "internal error" not in res.err
    assert "step " not in res.out  # refused before the first step
    assert not out.exists()
    # the way out it names: a checkpoint keeps what the run trains
    ck = tmp_path / "run.safetensors"
    res = cli(run + [ck])
    assert res.status == 0, res
    assert res.out.count("step ") == 3
    trained = load_file(ck)["w"]
    assert trained.shape == (3, 2) and not torch.equal(trained, torch.ones(3, 2))


def test_a_save_into_a_missing_folder_is_refused_before_training(cli, tmp_path):
    out = tmp_path / "no" / "such" / "run.safetensors"
    res = cli(["run", example("uci_housing.json"), "--places", PLACES, "--steps", 2,
               "--save", out])
    assert_clean_error(res, f"--save {out}: the folder", "does not exist", "nothing was trained")
    assert "step " not in res.out
    folder = tmp_path / "a-folder"
    folder.mkdir()
    res = cli(["run", example("uci_housing.json"), "--places", PLACES, "--steps", 2,
               "--save", folder])
    assert_clean_error(res, f"--save {folder}: is a folder")


# --- .pdiparams are written atomically ------------------------------------------------------
VALUES = {"a": torch.arange(6, dtype=torch.float32).reshape(2, 3),
          "b": torch.tensor([3, 4], dtype=torch.int64)}


def _leftovers(folder):
    return sorted(n for n in os.listdir(folder) if n.endswith(".tmp"))


def test_pdiparams_replace_a_symlink_at_the_target_never_write_through_it(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("not yours")
    link = tmp_path / "model.pdiparams"
    link.symlink_to(victim)
    save_params(link, VALUES, ["a", "b"])
    assert victim.read_text() == "not yours"
    assert link.is_file() and not link.is_symlink()
    got = load_params(link, ["a", "b"])
    assert all(torch.equal(got[n], VALUES[n]) for n in VALUES)
    umask = os.umask(0o022)
    os.umask(umask)
    assert link.stat().st_mode & 0o777 == 0o666 & ~umask  # as a plain open() would make it
    # one file per var (save_persistables' layout): each replaced the same way
    folder = tmp_path / "persistables"
    folder.mkdir()
    (folder / "a").symlink_to(victim)
    save_params(folder, VALUES, ["a", "b"], combined=False)
    assert victim.read_text() == "not yours" and not (folder / "a").is_symlink()
    got = load_params(folder, ["a", "b"])
    assert all(torch.equal(got[n], VALUES[n]) for n in VALUES)
    assert _leftovers(tmp_path) == [] and _leftovers(folder) == []
    # a folder at the target: a clean error, nothing written
    (tmp_path / "dir.pdiparams").mkdir()
    with pytest.raises(ProgramError, match="dir.pdiparams: cannot write parameter file"):
        save_params(tmp_path / "dir.pdiparams", VALUES, ["a", "b"])
    assert _leftovers(tmp_path) == []


_FAIL_HALF_WAY = """
import resource, signal, sys, torch
from ssaexec.core.errors import ProgramError
from ssaexec.frontends.paddle import save_params
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (65536, resource.RLIM_INFINITY))
try:
    save_params(sys.argv[1], {"big": torch.ones(1 << 20)}, ["big"])  # 4 MiB
except ProgramError as e:
    print("refused:", e)
"""


def test_a_pdiparams_write_that_fails_half_way_leaves_the_old_file(tmp_path):
    path = tmp_path / "model.pdiparams"
    save_params(path, VALUES, ["a", "b"])
    before = path.read_bytes()
    proc = subprocess.run([sys.executable, "-c", _FAIL_HALF_WAY, str(path)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "refused:" in proc.stdout and "cannot write parameter file" in proc.stdout, proc.stdout
    assert path.read_bytes() == before  # the old parameters, whole
    assert _leftovers(tmp_path) == []


# --- resume: only regular files, never blocking -------------------------------------------
@pytest.mark.timeout(30)
def test_a_fifo_named_like_a_checkpoint_is_skipped_not_waited_on(tmp_path, cli):
    folder = tmp_path / "ck"
    _train(4, folder, every=2, places=1)
    os.mkfifo(folder / "step-00000008.safetensors")
    os.mkfifo(folder / ".ckpt-fifo.tmp")
    (folder / "step-00000009.safetensors").symlink_to(folder / "step-00000004.safetensors")
    said = []
    ckpts = se.Checkpoints(folder, log=said.append)
    assert ckpts.steps() == [2, 4]
    main, startup, loss = _program()
    with se.ParallelExecutor(se.cpu_places(1), main, startup, loss, scope=se.Scope()) as pe:
        assert ckpts.resume(pe, se.EpochSampler(40, 8, seed=2, rank=0, world_size=1)) == 4
        assert pe.runs == 4
        with pytest.raises(SSAExecError, match=r"a FIFO \(named pipe\), not a checkpoint file"):
            load_checkpoint(folder / "step-00000008.safetensors", pe)
        with pytest.raises(SSAExecError, match="a symlink, not a checkpoint file"):
            load_checkpoint(folder / "step-00000009.safetensors", pe, follow_symlinks=False)
    assert any(f"ignoring {folder}/step-00000008.safetensors: named like a checkpoint" in s
               for s in said), said
    assert any(f"ignoring {folder}/.ckpt-fifo.tmp" in s for s in said), said
    assert os.path.exists(folder / ".ckpt-fifo.tmp")  # not ours: left alone
    # the command line: --resume of a FIFO is a clean refusal, not a hang
    res = cli(["run", example("uci_housing.json"), "--places", PLACES, "--steps", 1,
               "--resume", folder / "step-00000008.safetensors"])
    assert_clean_error(res, "step-00000008.safetensors: is a FIFO (named pipe), not a checkpoint")


def test_stray_temporaries_and_folders_do_not_stop_any_restart(tmp_path):
    folder = tmp_path / "ck"
    _train(4, folder, every=2, places=1)
    (folder / ".ckpt-dir.tmp").mkdir()
    (folder / ".ckpt-dir.tmp" / "inside").write_text("someone's")
    outside = tmp_path / "outside.txt"
    outside.write_text("keep")
    (folder / ".ckpt-link.tmp").symlink_to(outside)
    (folder / "step-00000009.safetensors").mkdir()  # a folder named like the newest
    main, startup, loss = _program()
    for restart in range(2):
        (folder / ".ckpt-dead.tmp").write_bytes(b"half a save")
        said = []
        ckpts = se.Checkpoints(folder, keep=1, log=said.append)
        with se.ParallelExecutor(se.cpu_places(1), main, startup, loss,
                                 scope=se.Scope()) as pe:
            sampler = se.EpochSampler(40, 8, seed=2, rank=0, world_size=1)
            assert ckpts.resume(pe, sampler) == 4 + restart, (restart, said)
            assert not (folder / ".ckpt-dead.tmp").exists()
            assert any("a save that did not finish" in s for s in said), said
            assert any(f"ignoring {folder}/.ckpt-dir.tmp" in s for s in said), said
            assert any(f"ignoring {folder}/step-00000009.safetensors" in s for s in said), said
            # one more step and a save with keep=1: the folder named like step 9 is not
            # "the newest checkpoint", so the real one survives the pruning
            idx = sampler.next_indices()
            g = torch.Generator().manual_seed(0)
            xs = torch.randn(40, 6, dtype=torch.float64, generator=g)
            ys = torch.randint(0, 3, (40, 1), generator=g)
            pe.run([loss], feed={"x": xs[idx], "y": ys[idx]})
            ckpts.save(pe, 5 + restart, sampler)
        assert ckpts.steps() == [5 + restart]
    assert (folder / ".ckpt-dir.tmp" / "inside").read_text() == "someone's"
    assert (folder / ".ckpt-link.tmp").is_symlink() and outside.read_text() == "keep"
    assert (folder / "step-00000009.safetensors").is_dir()


# --- resume: a bad newest checkpoint is skipped, and nothing is half loaded ------------------
def _with_bad_rng(src, dst, rng, step, scale=2.0):
    """A copy of checkpoint ``src`` at ``dst`` with RNG state ``rng``, parameters times
    ``scale`` (so loading it would show) and the step set to ``step``."""
    tensors = load_file(src)
    with safe_open(src, framework="pt") as f:
        meta = f.metadata()
    for name in list(tensors):
        if not name.startswith("@STATE.") and tensors[name].is_floating_point():
            tensors[name] = tensors[name] * scale
    tensors["@STATE.rng.0.cpu"] = rng
    meta["training"] = json.dumps(dict(json.loads(meta["training"]), step=step))
    meta["data_digest"] = _digest(tensors)  # a whole file, as a save would write it
    save_file(tensors, dst, metadata=meta)


def _params(pe, main):
    return {p.name: pe.local_scopes[0].find_var(p.name).clone() for p in main.all_parameters()}


@pytest.mark.parametrize("rng, why", [
    (torch.zeros(7, dtype=torch.uint8), "is not a state of a torch cpu generator"),
    (torch.get_rng_state().float(), "is a float32 tensor of shape"),
])
def test_a_newest_checkpoint_with_a_bad_rng_state_falls_back_to_the_one_before(tmp_path, rng,
                                                                              why):
    folder = tmp_path / "ck"
    _train(4, folder, every=2, places=1)
    good = folder / "step-00000004.safetensors"
    _with_bad_rng(good, folder / "step-00000006.safetensors", rng, 6)
    said = []
    main, startup, loss = _program()
    with se.ParallelExecutor(se.cpu_places(1), main, startup, loss, scope=se.Scope()) as pe:
        step = se.Checkpoints(folder, log=said.append).resume(
            pe, se.EpochSampler(40, 8, seed=2, rank=0, world_size=1))
        assert step == 4
        got = _params(pe, main)
    saved = load_file(good)
    for name, value in got.items():
        assert torch.equal(value, saved[name]), name  # step 4's, not step 6's doubled ones
    assert any(s.startswith(f"skipping {folder}/step-00000006.safetensors: SSAExecError: ")
               and "RNG state 'rng.0.cpu'" in s and why in s for s in said), said


def test_a_refused_checkpoint_loads_nothing(tmp_path):
    folder = tmp_path / "ck"
    _train(2, folder, every=2, places=1)
    bad = folder / "step-00000004.safetensors"
    _with_bad_rng(folder / "step-00000002.safetensors", bad, torch.zeros(7, dtype=torch.uint8),
                  4)
    os.unlink(folder / "step-00000002.safetensors")  # the bad one is the only one
    main, startup, loss = _program()
    rng_before = torch.get_rng_state()
    said = []
    with se.ParallelExecutor(se.cpu_places(1), main, startup, loss, scope=se.Scope()) as pe:
        fresh = _params(pe, main)
        assert se.Checkpoints(folder, log=said.append).resume(pe) == 0
        assert pe.runs == 0
        for name, value in _params(pe, main).items():
            assert torch.equal(value, fresh[name]), name
        assert torch.equal(torch.get_rng_state(), rng_before)
        # load_checkpoint's check runs after every tensor was read, before any is written
        seen = []

        def refuse(meta, state):
            seen.append(sorted(state))
            raise SSAExecError("refused by the caller")
        with pytest.raises(SSAExecError, match="refused by the caller"):
            load_checkpoint(bad, pe, check=refuse)
        assert seen == [["rng.0.cpu"]]
        for name, value in _params(pe, main).items():
            assert torch.equal(value, fresh[name]), name
        assert pe.runs == 0
    assert any("skipping" in s and "RNG state 'rng.0.cpu'" in s for s in said), said
    assert said[-1] == f"no usable checkpoint in {folder} (1 skipped, above): starting at step 0"


def test_a_data_position_of_another_order_is_an_error_not_a_fall_back(tmp_path):
    folder = tmp_path / "ck"
    _train(4, folder, every=2, places=1)
    said = []
    main, startup, loss = _program()
    with se.ParallelExecutor(se.cpu_places(1), main, startup, loss, scope=se.Scope()) as pe:
        fresh = _params(pe, main)
        other = se.EpochSampler(40, 8, seed=3, rank=0, world_size=1)  # the run's seed was 2
        with pytest.raises(SSAExecError, match=r"step-00000004.safetensors: the saved data "
                                               r"position is of another sample order: seed 2"):
            se.Checkpoints(folder, log=said.append).resume(pe, other)
        for name, value in _params(pe, main).items():  # nothing loaded
            assert torch.equal(value, fresh[name]), name
        assert pe.runs == 0 and other.epoch == 0 and other.step == 0
    assert not any("skipping" in s or "step 0" in s for s in said), said
    assert sorted(os.listdir(folder)) == ["step-00000002.safetensors",
                                          "step-00000004.safetensors"]


def test_a_damaged_checkpoint_is_refused_and_resume_falls_back_to_the_one_before(tmp_path):
    # safetensors has no checksum: bytes flipped in the data loaded as NaN parameters
    folder = tmp_path / "ck"
    _train(4, folder, every=2, places=1)
    newest = folder / "step-00000004.safetensors"
    data = bytearray(newest.read_bytes())
    data[-30:] = b"\xff" * 30  # same size, the header intact
    newest.write_bytes(bytes(data))
    main, startup, loss = _program()
    said = []
    with se.ParallelExecutor(se.cpu_places(1), main, startup, loss, scope=se.Scope()) as pe:
        fresh = _params(pe, main)
        with pytest.raises(SSAExecError, match="does not match the digest saved with it"):
            load_checkpoint(newest, pe)
        for name, value in _params(pe, main).items():  # nothing was loaded
            assert torch.equal(value, fresh[name]), name
        step = se.Checkpoints(folder, log=said.append).resume(
            pe, se.EpochSampler(40, 8, seed=2, rank=0, world_size=1))
        assert step == 2
        got = _params(pe, main)
    saved = load_file(folder / "step-00000002.safetensors")
    for name, value in got.items():
        assert torch.isfinite(value).all() and torch.equal(value, saved[name]), name
    assert any("step-00000004.safetensors" in s and "digest" in s for s in said), said


def test_a_checkpoint_folder_that_is_a_file_is_a_clean_error(tmp_path):
    (tmp_path / "ck").write_text("not a folder")
    with pytest.raises(SSAExecError, match=r"checkpoint folder .*ck: cannot be made or used"):
        se.Checkpoints(tmp_path / "ck")
