"""Exact resume in one process: ``EpochSampler``, ``Checkpoints``, ``elastic.guard``, faults.

A run stopped after any checkpoint and continued by a fresh executor from the folder must
be the run that never stopped, bit for bit: parameters, AdamW moments, the LR schedule,
dropout masks (per-step seeds from the run counter) and the data position. The
multi-process and multi-node versions are in tests/integration/test_multinode.py.
"""

import os
import subprocess
import sys

import pytest
import torch

import ssaexec as se
from ssaexec.core import faults
from ssaexec.core.errors import SSAExecError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# --- the sampler ----------------------------------------------------------------------------
def test_sampler_ranks_partition_each_global_batch_and_epochs_cover_the_dataset():
    n, b, world = 30, 6, 3
    samplers = [se.EpochSampler(n, b, seed=7, rank=r, world_size=world) for r in range(world)]
    assert samplers[0].steps_per_epoch == 5
    seen = {0: [], 1: []}
    for _ in range(10):
        epoch = samplers[0].epoch
        parts = [s.next_indices() for s in samplers]
        assert all(len(p) == b // world for p in parts)
        seen[epoch].extend(torch.cat(parts).tolist())
    for epoch, idx in seen.items():
        assert sorted(idx) == list(range(n)), epoch
    assert seen[0] != seen[1]  # another order each epoch
    # the same order in any process: a function of (seed, epoch) alone
    assert torch.equal(se.EpochSampler(n, b, seed=7, rank=0, world_size=1).order(1),
                       samplers[0].order(1))


def test_sampler_state_resumes_on_another_world_size():
    a = se.EpochSampler(24, 12, seed=1, rank=0, world_size=1)
    a.next_indices(), a.next_indices(), a.next_indices()  # epoch 1, step 1
    state = a.state_dict()
    want = a.global_batch_indices()
    parts = []
    for r in range(4):
        s = se.EpochSampler(24, 12, seed=1, rank=r, world_size=4)
        s.load_state_dict(state)
        assert (s.epoch, s.step) == (1, 1)
        parts.append(s.next_indices())
    assert torch.equal(torch.cat(parts), want)


def test_sampler_refuses_bad_input_with_the_reason():
    with pytest.raises(SSAExecError, match="not a multiple of the 4 processes"):
        se.EpochSampler(20, 6, rank=0, world_size=4)
    with pytest.raises(SSAExecError, match="larger than the dataset"):
        se.EpochSampler(4, 6, rank=0, world_size=1)
    s = se.EpochSampler(20, 4, seed=0, rank=0, world_size=1)
    with pytest.raises(SSAExecError, match=r"another sample order: seed 5 \(this sampler: 0\)"):
        s.load_state_dict(dict(s.state_dict(), seed=5))
    with pytest.raises(SSAExecError, match="not a position of 5 steps an epoch"):
        s.load_state_dict(dict(s.state_dict(), step=9))


# --- checkpoints of a run ---------------------------------------------------------------------
def _program():
    main, startup = se.Program(3), se.Program(3)
    with se.program_guard(main, startup):
        x = se.layers.data("x", [-1, 6], "float64")
        y = se.layers.data("y", [-1, 1], "int64")
        h = se.layers.dropout(se.layers.fc(x, 8, act="relu"), 0.3)
        loss = se.layers.mean(se.layers.softmax_with_cross_entropy(se.layers.fc(h, 3), y))
        lr = se.optimizer.lr.StepDecay(0.05, step_size=2, gamma=0.5)
        se.optimizer.AdamW(lr, weight_decay=0.01).minimize(loss)
    return main, startup, loss


def _train(steps, folder=None, every=None, keep=3, places=2):
    """Train up to ``steps`` steps, resuming from ``folder``; return {param: value}."""
    g = torch.Generator().manual_seed(0)
    xs, ys = torch.randn(40, 6, dtype=torch.float64, generator=g), torch.randint(0, 3, (40, 1), generator=g)
    main, startup, loss = _program()
    sampler = se.EpochSampler(40, 8, seed=2, rank=0, world_size=1)
    ckpts = se.Checkpoints(folder, every=every, keep=keep, log=lambda s: None) if folder else None
    with se.ParallelExecutor(se.cpu_places(places), main, startup, loss,
                             scope=se.Scope()) as pe:
        start = ckpts.resume(pe, sampler) if ckpts else 0
        for step in range(start, steps):
            idx = sampler.next_indices()
            pe.run([loss], feed={"x": xs[idx], "y": ys[idx]})
            if ckpts:
                ckpts.maybe_save(pe, step + 1, sampler)
        return {p.name: pe.local_scopes[0].find_var(p.name).clone()
                for p in main.all_parameters()}, start


def test_a_run_resumed_from_its_checkpoint_equals_the_run_that_never_stopped(tmp_path):
    ref, _ = _train(9)
    folder = tmp_path / "ck"
    _train(6, folder, every=2, keep=2)  # stops after step 6 (epoch 1, step 1)
    assert sorted(os.listdir(folder)) == ["step-00000004.safetensors",
                                          "step-00000006.safetensors"]
    got, start = _train(9, folder, every=2, keep=2)  # a fresh executor and sampler
    assert start == 6
    for name in ref:
        assert torch.equal(got[name], ref[name]), name


def test_resume_skips_a_dead_save_and_an_unreadable_checkpoint(tmp_path):
    folder = tmp_path / "ck"
    _train(4, folder, every=2)
    (folder / ".ckpt-abc.tmp").write_bytes(b"half a file")
    (folder / "step-00000006.safetensors").write_bytes(b"\x00" * 40)  # a disk error
    said = []
    ckpts = se.Checkpoints(folder, log=said.append)
    main, startup, loss = _program()
    with se.ParallelExecutor(se.cpu_places(1), main, startup, loss, scope=se.Scope()) as pe:
        assert ckpts.resume(pe, se.EpochSampler(40, 8, seed=2, rank=0, world_size=1)) == 4
        assert pe.runs == 4
    assert not (folder / ".ckpt-abc.tmp").exists()
    assert any("a save that did not finish" in s for s in said), said
    assert any(s.startswith(f"skipping {folder}/step-00000006.safetensors") for s in said), said
    assert ckpts.last == str(folder / "step-00000004.safetensors")


def test_checkpoints_refuse_bad_settings():
    with pytest.raises(SSAExecError, match="positive number of steps"):
        se.Checkpoints("/tmp/unused-ssaexec-ck", every=0)
    with pytest.raises(SSAExecError, match="keep must be at least 1"):
        se.Checkpoints("/tmp/unused-ssaexec-ck", keep=0)


def test_guard_names_the_step_the_error_and_the_last_checkpoint(tmp_path, capsys):
    folder = tmp_path / "ck"
    _train(2, folder, every=2)
    ckpts = se.Checkpoints(folder, log=lambda s: None)
    main, startup, loss = _program()
    with se.ParallelExecutor(se.cpu_places(1), main, startup, loss, scope=se.Scope()) as pe:
        ckpts.resume(pe)
        with pytest.raises(se.FeedError):
            with se.elastic.guard(ckpts, exit=False) as run:
                run.step = 3
                pe.run([loss], feed={"x": torch.zeros(2, 5, dtype=torch.float64),
                                     "y": torch.zeros(2, 1, dtype=torch.int64)})
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("ssaexec: rank 0 of 1 stopped at step 3: FeedError: "), line
    assert line.endswith(f"last checkpoint {folder}/step-00000002.safetensors (step 2)"), line


# --- injected faults --------------------------------------------------------------------------
def test_fault_plans_are_checked_and_fire_only_in_their_attempt_and_rank():
    assert faults._parse("kill@step:5:1, kill@save:8") == ((0, "step", 5, 1), (1, "save", 8, 0))
    with pytest.raises(SSAExecError, match="entry 0 'kill@lunch:3'"):
        faults._parse("kill@lunch:3")
    code = ("import os, ssaexec.core.faults as f\n"
            "f.point('save', 3, rank=0); f.point('step', 8, rank=0); f.point('save', 8, rank=1)\n"
            "print('alive'); f.point('save', 8, rank=0); print('not reached')\n")
    env = dict(os.environ, SSAEXEC_FAULT="kill@step:5:1,kill@save:8", PYTHONPATH=REPO,
               TORCHELASTIC_RESTART_COUNT="1")
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == -9 and p.stdout == "alive\n", (p.returncode, p.stdout, p.stderr)
