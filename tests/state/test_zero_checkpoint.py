"""Checkpoints under ZeRO (issue 49): one file per rank, resharded on load, refused when
any file does not fit; the gathered export; the DCP export read by torch; exact resume."""

import json
import os

import pytest
import torch

import ssaexec as se
from ssaexec.core.errors import SSAExecError
from ssaexec.program.example_models import build_mlp
from ssaexec.program.shard import ShardLayout
from ssaexec.state import sharded
from ssaexec.state.checkpoint import _digest, read_checkpoint


def _build(opt="adamw"):
    optimizer = se.optimizer.AdamW(0.01, weight_decay=0.01) if opt == "adamw" \
        else se.optimizer.SGD(0.1)
    return build_mlp("float64", optimizer, in_dim=6, hidden=(5,), classes=3)


def _data(k):
    g = torch.Generator().manual_seed(10 + k)
    x = torch.randn(12, 6, dtype=torch.float64, generator=g)
    return {"img": x, "label": x[:, :3].argmax(1, keepdim=True)}


def _executor(program, places, stage):
    main, startup, loss = program
    return se.ParallelExecutor(se.cpu_places(places), main, startup, loss,
                               se.BuildStrategy(zero_stage=stage), scope=se.Scope())


def _fill(pe, seed=0):
    """Every persistable set to distinct values (moments too), so a misplaced slice shows."""
    g = torch.Generator().manual_seed(seed)
    state = pe.gathered_state() if pe.shard_layout() is not None else None
    names = state if state is not None else {
        v.name: None for v in pe.run_program.global_block().vars.values() if v.persistable}
    for name in names:
        like = state[name] if state is not None else pe.get_var(name)
        if like.is_floating_point():
            pe.set_var(name, torch.randn(like.shape, dtype=like.dtype, generator=g))


def _state(pe):
    if pe.shard_layout() is not None:
        return pe.gathered_state()
    return {v.name: pe.get_var(v.name)
            for v in pe.run_program.global_block().vars.values() if v.persistable}


def _equal(a, b):
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
    for n in a:
        assert a[n].dtype == b[n].dtype and torch.equal(a[n], b[n]), n


# --- the files and their reshard ---------------------------------------------------------------
def test_a_sharded_checkpoint_loads_on_every_world_size_and_stage(tmp_path):
    program = _build()
    path = tmp_path / "c.safetensors"
    with _executor(program, 4, 3) as pe:
        _fill(pe)
        meta = se.save_checkpoint(path, pe)
        ref = _state(pe)
    save = json.loads(meta["shards"])["save"]
    assert sorted(os.listdir(tmp_path)) == ["c.safetensors"] + [
        f"c.shard-{r:05d}-of-00004-{save}.safetensors" for r in (1, 2, 3)]
    assert meta["format"] == sharded.ENTRY_FORMAT
    # every rank's file holds its own slice, not the model: rank 3's is 1/4 of each var
    _, shard3 = sharded_file(_shard(path, 3))
    assert shard3["fc_0.w_0"].shape == (8,)  # 30 elements over 4 ranks: ceil = 8
    _, whole = read_checkpoint(path)
    _equal({n: t for n, t in whole.items() if not n.startswith("@STATE.")}, ref)
    for places, stage in ((2, 3), (1, 0), (3, 1), (4, 2), (2, 0)):
        with _executor(program, places, stage) as pe:
            se.load_checkpoint(path, pe)
            _equal(_state(pe), ref)
            layout = pe.shard_layout()
            if layout is not None:  # each place holds its rank's slice of the full value
                for i, scope in enumerate(pe.local_scopes):
                    got = scope.find_var("fc_0.w_0@SHARD")
                    assert torch.equal(got, layout.shard_of(ref["fc_0.w_0"].reshape(-1), i))
    scope = se.Scope()  # and into a scope, with the plain program
    se.load_checkpoint(path, scope, program=program[0])
    assert torch.equal(scope.find_var("fc_0.w_0"), ref["fc_0.w_0"])


def _shard(path, rank):
    """The file of ``rank``'s shards of the checkpoint ``path`` (its index names the save)."""
    meta, _ = sharded_file(path)
    index = json.loads(meta["shards"])
    return path.parent / os.path.basename(
        sharded.shard_path(str(path), rank, index["world"], index["save"]))


def sharded_file(path):
    from safetensors import safe_open
    with safe_open(str(path), framework="pt") as f:
        return f.metadata(), {k: f.get_tensor(k) for k in f.keys()}


def test_a_plain_checkpoint_loads_into_a_zero_run_and_the_gathered_export_is_plain(tmp_path):
    program = _build()
    with _executor(program, 2, 0) as pe:
        _fill(pe, seed=1)
        se.save_checkpoint(tmp_path / "plain.safetensors", pe)
        ref = _state(pe)
    with _executor(program, 4, 3) as pe:
        se.load_checkpoint(tmp_path / "plain.safetensors", pe)
        _equal(_state(pe), ref)
        gathered = se.save_checkpoint(tmp_path / "g.safetensors", pe, sharded=False)
        entry = se.save_checkpoint(tmp_path / "s.safetensors", pe)
        se.save_parameters(tmp_path / "p.safetensors", pe)
    assert gathered["format"] == "ssaexec-checkpoint/1"
    # the same persistables, whichever way they were saved
    assert gathered["program_hash"] == entry["program_hash"]
    _, g = read_checkpoint(tmp_path / "g.safetensors")
    _equal(g, ref)
    _, p = sharded_file(tmp_path / "p.safetensors")
    assert set(p) == {"fc_0.w_0", "fc_0.b_0", "fc_1.w_0", "fc_1.b_0"}
    assert all(torch.equal(p[n], ref[n]) for n in p)
    with _executor(program, 1, 0) as pe, pytest.raises(SSAExecError, match="needs an executor "
                                                                          "with ZeRO"):
        se.save_checkpoint(tmp_path / "x.safetensors", pe, sharded=True)


# --- untrusted files ---------------------------------------------------------------------------
def _saved(tmp_path):
    program = _build()
    path = tmp_path / "c.safetensors"
    with _executor(program, 4, 3) as pe:
        _fill(pe)
        se.save_checkpoint(path, pe)
    return program, path


def _rewrite(path, tensors=None, **meta):
    """Rewrite a checkpoint file as an attacker would: new tensors and header entries
    (its own digest made to match, so only the cross-file checks can catch it)."""
    from safetensors.torch import save_file
    old_meta, old = sharded_file(path)
    tensors = old if tensors is None else tensors
    new_meta = dict(old_meta, **meta)
    if "data_digest" not in meta:
        new_meta["data_digest"] = _digest(tensors)
    save_file(tensors, str(path), metadata=new_meta)
    return new_meta


def _refused(program, path, match):
    with _executor(program, 2, 3) as pe:
        before = _state(pe)
        with pytest.raises(SSAExecError, match=match):
            se.load_checkpoint(path, pe)
        _equal(_state(pe), before)  # nothing was loaded


def test_a_missing_shard_file_is_named(tmp_path):
    program, path = _saved(tmp_path)
    os.remove(_shard(path, 2))
    _refused(program, path, r"c.safetensors is a checkpoint of 4 ranks, and the file of rank "
                            r"2 is not usable: .*c.shard-00002-of-00004-[0-9a-f]{16}"
                            r".safetensors: no such checkpoint shard file")


def test_a_shard_of_the_wrong_size_is_named_with_its_file_and_var(tmp_path):
    program, path = _saved(tmp_path)
    shard = _shard(path, 1)
    _, tensors = sharded_file(shard)
    tensors["fc_0.w_0"] = tensors["fc_0.w_0"][:5].clone()
    digest = _rewrite(shard, tensors)["data_digest"]
    meta, _ = sharded_file(path)
    index = json.loads(meta["shards"])
    index["files"][1] = digest  # the index made to agree: the size check still stands
    _rewrite(path, shards=json.dumps(index))
    _refused(program, path, r"c.shard-00001-of-00004-[0-9a-f]{16}.safetensors: the shard of "
                            r"'fc_0.w_0' has shape \[5\]; the index says 1-D of 8 elements")


def test_a_shard_from_another_save_or_rank_is_refused(tmp_path):
    program, path = _saved(tmp_path)
    one, two = _shard(path, 1), _shard(path, 2)
    os.rename(one, tmp_path / "x")  # two ranks' files swapped
    os.rename(two, one)
    os.rename(tmp_path / "x", two)
    _refused(program, path, r"c.shard-00001-of-00004-[0-9a-f]{16}.safetensors: its header says "
                            r"it is shard \{'rank': 2, 'world': 4\} of save [0-9a-f]{16}, not "
                            r"rank 1 of 4 of save [0-9a-f]{16}")
    os.rename(one, tmp_path / "x")
    os.rename(two, one)
    os.rename(tmp_path / "x", two)
    other = tmp_path / "other"
    other.mkdir()
    with _executor(program, 4, 3) as pe:  # rank 1's file of another save
        _fill(pe, seed=7)
        se.save_checkpoint(other / "c.safetensors", pe)
    os.replace(_shard(other / "c.safetensors", 1), one)
    _refused(program, path, r"its header says it is shard \{'rank': 1, 'world': 4\} of save "
                            r"(?P<a>[0-9a-f]{16}), not rank 1 of 4 of save (?!(?P=a))")
    meta, _ = sharded_file(path)  # and its header forged to say it is this save's
    save = json.loads(meta["shards"])["save"]
    _rewrite(one, shard=sharded.shard_meta(1, 4, save))
    _refused(program, path, r"c.shard-00001-of-00004-[0-9a-f]{16}.safetensors: not the shard "
                            r"file .* was saved with \(its data digest differs")


def test_a_save_that_fails_half_way_leaves_the_checkpoint_it_replaces_whole(tmp_path):
    program, path = _saved(tmp_path)
    before = sorted(os.listdir(tmp_path))
    with _executor(program, 4, 3) as pe:
        _fill(pe, seed=3)
        with pytest.raises(AttributeError):  # after ranks 1-3 wrote their files
            se.save_checkpoint(path, pe, state={"rng": "not a tensor"})
        assert len(os.listdir(tmp_path)) == len(before) + 3  # beside the old ones
        with _executor(program, 2, 3) as other:
            se.load_checkpoint(path, other)  # the old checkpoint, whole
        meta = se.save_checkpoint(path, pe)  # a good save: every other save's file removed
        want = _state(pe)
    save = json.loads(meta["shards"])["save"]
    assert sorted(os.listdir(tmp_path)) == ["c.safetensors"] + [
        f"c.shard-{r:05d}-of-00004-{save}.safetensors" for r in (1, 2, 3)]
    with _executor(program, 2, 3) as pe:
        se.load_checkpoint(path, pe)
        _equal(_state(pe), want)
    with _executor(program, 1, 0) as pe:  # a plain save over it removes every shard file
        se.save_checkpoint(path, pe)
    assert os.listdir(tmp_path) == ["c.safetensors"]


def test_an_index_that_disagrees_with_itself_or_the_program_is_refused(tmp_path):
    program, path = _saved(tmp_path)
    meta, _ = sharded_file(path)
    index, decl = json.loads(meta["shards"]), json.loads(meta["persistables"])
    cases = [
        (dict(index, world=10 ** 9), r"index has world '1000000000', not a number of ranks"),
        (dict(index, vars=dict(index["vars"], **{"fc_0.w_0": [30, 9]})),
         r"gives var 'fc_0.w_0' shards of 9 elements; 30 elements over 4 ranks are 8 each"),
        (dict(index, vars=dict(index["vars"], **{"fc_0.w_0": [31, 8]})),
         r"gives var 'fc_0.w_0' 31 elements, its shape \[6, 5\] has 30"),
        (dict(index, files=index["files"][:3]), "one 64-digit data digest for each of its 4"),
        (dict(index, save="../../etc"), r"has save '../../etc', not 16 hex digits"),
        ("[1, 2]", "is not a JSON object"),
    ]
    for bad, match in cases:
        _rewrite(path, shards=bad if isinstance(bad, str) else json.dumps(bad))
        _refused(program, path, match)
    # an index consistent with itself, but of another model: the program's check names it
    decl["fc_0.w_0"] = [[3, 10], "float64"]
    _rewrite(path, shards=meta["shards"], persistables=json.dumps(decl))
    _refused(program, path, r"does not fit this program: different shape or dtype: fc_0.w_0 "
                            r"\(checkpoint \[3, 10\] float64, program \[6, 5\] float64\)")
    _rewrite(path, persistables="{not json")
    _refused(program, path, "its 'persistables' header is not a JSON object")


def test_a_shard_file_that_is_a_fifo_or_a_symlink_is_never_opened(tmp_path):
    program, path = _saved(tmp_path)
    shard = _shard(path, 2)
    os.replace(shard, tmp_path / "real")
    os.mkfifo(shard)  # opened for reading, a FIFO would wait for a writer forever
    _refused(program, path, r"c.shard-00002-of-00004-[0-9a-f]{16}.safetensors: is a FIFO "
                            r"\(named pipe\), not a checkpoint shard file")
    os.remove(shard)
    os.symlink(tmp_path / "real", shard)
    with _executor(program, 2, 3) as pe:
        se.load_checkpoint(path, pe)  # a user's own symlinks are followed by default ...
        with pytest.raises(SSAExecError, match="is a symlink, not a checkpoint shard file"):
            se.load_checkpoint(path, pe, follow_symlinks=False)  # ... never in a folder's


def test_damaged_shard_data_is_refused_by_its_digest(tmp_path):
    program, path = _saved(tmp_path)
    shard = _shard(path, 3)
    data = bytearray(shard.read_bytes())
    data[-3] ^= 0xFF
    shard.write_bytes(bytes(data))
    _refused(program, path, r"c.shard-00003-of-00004-[0-9a-f]{16}.safetensors: its data does "
                            r"not match the digest")


# --- exact resume (se.Checkpoints) ----------------------------------------------------------------
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


def _train(steps, places, stage, folder=None, every=None, keep=3):
    """Train up to ``steps`` steps, resuming from ``folder``; (full state, start step)."""
    g = torch.Generator().manual_seed(0)
    xs = torch.randn(48, 6, dtype=torch.float64, generator=g)
    ys = torch.randint(0, 3, (48, 1), generator=g)
    sampler = se.EpochSampler(48, 8, seed=2, rank=0, world_size=1)
    ckpts = se.Checkpoints(folder, every=every, keep=keep, log=lambda s: None) if folder \
        else None
    with _executor(_program(), places, stage) as pe:
        start = ckpts.resume(pe, sampler) if ckpts else 0
        for step in range(start, steps):
            idx = sampler.next_indices()
            pe.run([], feed={"x": xs[idx], "y": ys[idx]})
            if ckpts:
                ckpts.maybe_save(pe, step + 1, sampler)
        return _state(pe), start


@pytest.mark.parametrize("stage,places", [(3, 2), (3, 4), (2, 2), (1, 2)])
def test_killed_and_resumed_equals_the_run_that_never_stopped(tmp_path, stage, places):
    ref, _ = _train(7, places, stage)
    folder = tmp_path / "ck"
    _train(5, places, stage, folder, every=2, keep=2)  # "killed" after step 5: resumes at 4
    names = sorted(os.listdir(folder))
    assert [n for n in names if ".shard-" not in n] == \
        ["step-00000002.safetensors", "step-00000004.safetensors"]
    assert sorted(n[:len("step-00000002.shard-00001-of-00004")] for n in names
                  if ".shard-" in n) == [f"step-0000000{s}.shard-0000{r}-of-0000{places}"
                                          for s in (2, 4) for r in range(1, places)]
    got, start = _train(7, places, stage, folder, every=2, keep=2)
    assert start == 4
    _equal(got, ref)  # float64, bit for bit
    # rotation removed step 2 and its shard files with it
    assert not any(n.startswith("step-00000002") for n in os.listdir(folder))


def test_resume_on_another_world_size_takes_the_saved_parameters(tmp_path):
    folder = tmp_path / "ck"
    saved, _ = _train(4, 4, 3, folder, every=4)
    with _executor(_program(), 2, 3) as pe:
        sampler = se.EpochSampler(48, 8, seed=2, rank=0, world_size=1)
        assert se.Checkpoints(folder, log=lambda s: None).resume(pe, sampler) == 4
        _equal(_state(pe), saved)
    with _executor(_program(), 1, 0) as pe:  # and into a run without ZeRO
        se.Checkpoints(folder, log=lambda s: None).resume(pe, sampler)
        _equal(_state(pe), saved)


def test_resume_removes_the_shards_of_a_save_that_died_and_skips_an_incomplete_set(tmp_path):
    folder = tmp_path / "ck"
    _train(4, 2, 3, folder, every=2)
    orphan = folder / "step-00000006.shard-00001-of-00002-0123456789abcdef.safetensors"
    orphan.write_bytes(b"orphan")
    os.remove(_shard(folder / "step-00000004.safetensors", 1))  # a lost file
    said = []
    with _executor(_program(), 2, 3) as pe:
        sampler = se.EpochSampler(48, 8, seed=2, rank=0, world_size=1)
        assert se.Checkpoints(folder, log=said.append).resume(pe, sampler) == 2
    assert not orphan.exists()
    assert any("a shard of a save that did not finish" in s for s in said), said
    assert any(s.startswith(f"skipping {folder}/step-00000004.safetensors") and
               "file of rank 1 is not usable" in s for s in said), said


# --- pure parts ---------------------------------------------------------------------------------
def test_shard_file_names_and_the_join():
    save = sharded.new_save_id()
    assert len(save) == 16 and int(save, 16) >= 0 and save != sharded.new_save_id()
    assert sharded.shard_path("d/step-00000004.safetensors", 0, 4, save) == \
        "d/step-00000004.safetensors"
    assert sharded.shard_path("d/step-00000004.safetensors", 3, 4, save) == \
        f"d/step-00000004.shard-00003-of-00004-{save}.safetensors"
    full = torch.arange(10.0).reshape(2, 5)
    layout = ShardLayout(3, 3, ())
    parts = [layout.shard_of(full.reshape(-1), r) for r in range(3)]
    assert [p.numel() for p in parts] == [4, 4, 4] and parts[2].tolist() == [8, 9, 0, 0]
    assert torch.equal(sharded.join(parts, [2, 5]), full)
