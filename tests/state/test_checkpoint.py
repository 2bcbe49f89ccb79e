"""Checkpoints: save, load, resume (on other place counts), refuse what does not fit."""

import os

import pytest
import torch

import ssaexec as se
from ssaexec.core.errors import SSAExecError
from ssaexec.program.example_models import build_mlp, make_optimizer


def _data(k):
    g = torch.Generator().manual_seed(10 + k)
    x = torch.randn(12, 6, dtype=torch.float64, generator=g)
    return {"img": x, "label": x[:, :3].argmax(1, keepdim=True)}


def _build(opt):
    optimizer = se.optimizer.Adam(se.optimizer.lr.StepDecay(0.01, 2, 0.5)) \
        if opt == "adam" else make_optimizer(opt, 0.1)
    return build_mlp("float64", optimizer, in_dim=6, hidden=(5,), classes=3)


def _state(pe, main):
    names = [v.name for v in pe.run_program.global_block().vars.values() if v.persistable]
    return {n: pe.get_var(n) for n in names}


@pytest.mark.parametrize("opt", ["momentum", "adam"])
@pytest.mark.parametrize("places_after", [2, 3, 1])
def test_resume_equals_training_straight_through(tmp_path, opt, places_after):
    main, startup, loss = _build(opt)
    with se.ParallelExecutor(se.cpu_places(2), main, startup, loss, scope=se.Scope()) as pe:
        for k in range(5):
            pe.run([loss], feed=_data(k))
        straight = _state(pe, main)
    path = tmp_path / "run.safetensors"
    with se.ParallelExecutor(se.cpu_places(2), main, startup, loss, scope=se.Scope()) as pe:
        for k in range(3):
            pe.run([loss], feed=_data(k))
        meta = se.save_checkpoint(path, pe)
    assert meta["runs"] == "3" and os.listdir(tmp_path) == ["run.safetensors"]  # no temp left
    with se.ParallelExecutor(se.cpu_places(places_after), main, startup, loss,
                             scope=se.Scope()) as pe:
        se.load_checkpoint(path, pe)
        assert pe.runs == 3
        for k in range(3, 5):
            pe.run([loss], feed=_data(k))
        resumed = _state(pe, main)
        for n in straight:
            for place in range(places_after):
                assert torch.equal(pe.get_var(n, place), resumed[n]), (n, place)
    assert straight.keys() == resumed.keys()
    for n, t in straight.items():
        # the same numbers; a different place count changes only the summation order
        tol = 0 if places_after == 2 else 1e-12
        assert torch.allclose(resumed[n], t, rtol=tol, atol=tol), n
    if opt == "adam":
        assert "@LR.step" in straight and float(straight["@LR.step"]) == 5.0


def test_the_file_is_plain_safetensors_with_metadata(tmp_path):
    from safetensors import safe_open
    main, startup, loss = _build("adam")
    path = tmp_path / "c.safetensors"
    with se.ParallelExecutor(se.cpu_places(2), main, startup, loss, scope=se.Scope()) as pe:
        pe.run([loss], feed=_data(0))
        se.save_checkpoint(path, pe)
        w = pe.get_var("fc_0.w_0")
    with safe_open(str(path), framework="pt") as f:
        assert f.metadata()["format"] == "ssaexec-checkpoint/1"
        assert len(f.metadata()["program_hash"]) == 64
        assert torch.equal(f.get_tensor("fc_0.w_0"), w)
        assert "fc_0.w_0_moment1_0" in f.keys()


def test_loading_into_another_program_names_the_mismatch(tmp_path):
    main, startup, loss = _build("momentum")
    path = tmp_path / "c.safetensors"
    with se.ParallelExecutor(se.cpu_places(1), main, startup, loss, scope=se.Scope()) as pe:
        se.save_checkpoint(path, pe)
    other, ostartup, oloss = build_mlp("float64", make_optimizer("momentum", 0.1), in_dim=6,
                                       hidden=(7,), classes=3)
    with se.ParallelExecutor(se.cpu_places(1), other, ostartup, oloss, scope=se.Scope()) as pe:
        with pytest.raises(SSAExecError, match=r"different shape or dtype: .*fc_0\.w_0 \(checkpoint \[6, 5\]"):
            se.load_checkpoint(path, pe)
    adam, astartup, aloss = _build("adam")
    with se.ParallelExecutor(se.cpu_places(1), adam, astartup, aloss, scope=se.Scope()) as pe:
        with pytest.raises(SSAExecError, match="missing from the checkpoint: .*moment1"):
            se.load_checkpoint(path, pe)
    (tmp_path / "junk.safetensors").write_bytes(b"not a checkpoint")
    with se.ParallelExecutor(se.cpu_places(1), main, startup, loss, scope=se.Scope()) as pe:
        with pytest.raises(SSAExecError, match="not a readable safetensors"):
            se.load_checkpoint(tmp_path / "junk.safetensors", pe)
        with pytest.raises(SSAExecError, match="no such checkpoint"):
            se.load_checkpoint(tmp_path / "none.safetensors", pe)


def test_scope_checkpoints_and_zero_sharded_state(tmp_path):
    main, startup, loss = _build("momentum")
    scope = se.Scope()
    se.Executor().run(startup, scope=scope)
    se.save_checkpoint(tmp_path / "s.safetensors", scope, program=main)
    bs = se.BuildStrategy(zero_stage=1)
    with se.ParallelExecutor(se.cpu_places(2), main, startup, loss, bs, scope=se.Scope()) as pe:
        se.load_checkpoint(tmp_path / "s.safetensors", pe)
        for k in range(2):
            pe.run([loss], feed=_data(k))
        se.save_checkpoint(tmp_path / "z.safetensors", pe, sharded=False)
        gathered = pe.gathered_state()
        assert pe.shard_layout().sharded("fc_0.w_0_velocity_0") is not None
    fresh = se.Scope()
    se.load_checkpoint(tmp_path / "z.safetensors", fresh, program=main)
    assert all(torch.equal(fresh.find_var(n), t) for n, t in gathered.items())  # every rank's
