"""ZeRO 1/2/3 across processes (issue 49, acceptance 1): 2 real gloo processes x 1 and x 2
places, each stage against the plain all-reduce run of the same launch.

One launch of ``tests/zero_worker.py train`` trains every entry of ``TRAIN_RUNS`` (about
thirty short runs) and ends with a step that fails on one rank; the tests compare what
each rank recorded. float64: every persistable (parameters, AdamW moments, the LR
counter) within 1e-10 of the plain run after 3 SGD or AdamW steps; float32 within 1e-5;
both ranks bit for bit alike. The oracle of the plain run itself is one process with
as many places (in the test's process).
"""

import pytest
import torch

import ssaexec as se

import zero_worker as Z

pytestmark = [pytest.mark.timeout(400), pytest.mark.slow, pytest.mark.processes]

FLOAT64 = 1e-10
FLOAT32 = 1e-5


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    out = tmp_path_factory.mktemp("zero_train")
    with Z.Workers("train", out, world=Z.PROCESSES) as w:
        return w.records(360)


def _result(records, name):
    got = [rec[name] for rec in records]
    for r, g in enumerate(got):
        assert "error" not in g, f"rank {r}, {name}: {g.get('error')}"
    # every rank holds the same gathered state, bit for bit (but batch norm's running
    # statistics: each place's own)
    for other in got[1:]:
        assert other["state"].keys() == got[0]["state"].keys(), name
        for k, v in got[0]["state"].items():
            assert k in got[0]["per_place"] or torch.equal(other["state"][k], v), (name, k)
    return got[0]


def _max_diff(a, b):
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
    worst = 0.0
    for k in a:
        assert a[k].shape == b[k].shape and a[k].dtype == b[k].dtype, k
        if a[k].is_floating_point():
            worst = max(worst, (a[k] - b[k]).abs().max().item())
        else:
            assert torch.equal(a[k], b[k]), k
    return worst


def _group(name):
    return sorted(n for n in Z.TRAIN_RUNS if n.split("/")[0] == name)


EXACT_GROUPS = ["sgd-2x1", "adamw-2x1", "sgd-2x2", "adamw-2x2", "adamw-fp32-2x2",
                "cnn-2x2", "accumulate-2x2", "schedule-2x1", "switches-2x2"]


@pytest.mark.parametrize("group", EXACT_GROUPS)
def test_every_stage_equals_the_plain_all_reduce_run(records, group):
    names = _group(group)
    plain = _result(records, f"{group}/0")
    tol = FLOAT32 if Z.TRAIN_RUNS[f"{group}/0"]["dtype"] == "float32" else FLOAT64
    assert len(names) > 1
    for name in names:
        if name.endswith("/0") or name.endswith("-bf16"):
            continue
        got = _result(records, name)
        assert _max_diff(got["state"], plain["state"]) <= tol, name
        assert torch.allclose(got["losses"], plain["losses"], rtol=0, atol=tol), name


@pytest.mark.parametrize("name", ["sgd-2x1/0", "adamw-2x2/0"])
def test_the_plain_run_is_one_process_with_as_many_places(records, name):
    # the workers' pairing is itself right: their plain run is one process's
    ref = Z.train_run(se, Z.TRAIN_RUNS[name], distributed=False)
    assert _max_diff(_result(records, name)["state"], ref["state"]) <= FLOAT64


def test_stage_3_on_2x1_is_1x2_bit_for_bit(records):
    # the same 2 ranks, the same sums (a + b): what exact resume on 1 process x 2 places rests on
    ref = Z.train_run(se, Z.TRAIN_RUNS["adamw-2x1/3"], distributed=False)
    got = _result(records, "adamw-2x1/3")["state"]
    assert got.keys() == ref["state"].keys()
    for k, v in ref["state"].items():
        assert torch.equal(got[k], v), k


@pytest.mark.parametrize("group", ["sgd-2x2", "adamw-2x1"])
def test_each_stage_has_its_collectives(records, group):
    kinds = {s: _result(records, f"{group}/{s}")["kinds"]["apply"] for s in range(4)}
    assert kinds[0]["all_gather"] == kinds[0]["reduce_scatter"] == kinds[0]["free"] == 0
    # the MLP's 3 layers (fc_i: weight and bias, all sharded: sgd and adamw are
    # elementwise), each moved by one call (program.shard.layer_of)
    n = 3
    for s in (1, 2):
        assert kinds[s]["reduce_scatter"] == n and kinds[s]["all_gather"] == n, (s, kinds[s])
        assert kinds[s]["all_reduce"] == 0, kinds[s]
    # stage 3: gathered for forward and again for backward, and freed after each
    assert kinds[3]["all_gather"] == 2 * n and kinds[3]["reduce_scatter"] == n, kinds[3]
    assert kinds[3]["free"] > 0


def test_accumulation_reduce_scatters_only_on_the_applying_step(records):
    for s in (2, 3):
        kinds = _result(records, f"accumulate-2x2/{s}")["kinds"]
        assert kinds["accumulate"]["reduce_scatter"] == 0, kinds
        assert kinds["accumulate"]["all_reduce"] == 0, kinds
        assert kinds["apply"]["reduce_scatter"] > 0, kinds


def test_the_lr_schedule_counts_the_steps(records):
    for name in ("schedule-2x1/0", "schedule-2x1/3"):
        state = _result(records, name)["state"]
        assert float(state["@LR.step"]) == 3.0, name


def test_stage_3_switches(records):
    keep = _result(records, "switches-2x2/3-keep")["kinds"]["apply"]
    reshard = _result(records, "switches-2x2/3-noprefetch")["kinds"]["apply"]
    assert keep["all_gather"] < reshard["all_gather"]  # no second gather for backward
    plain = _result(records, "switches-2x2/0")
    low = _result(records, "switches-2x2/3-bf16")
    # bf16 gathers: forward and backward see rounded parameters; the updates stay fp64
    diff = _max_diff(low["state"], plain["state"])
    assert 0 < diff < 1e-2, diff


def test_a_failed_step_leaves_every_place_as_it_was(records):
    r0, r1 = (rec["fail"] for rec in records)
    assert r1["type"] == "OpError" and "softmax_with_cross_entropy" in r1["message"], r1
    assert r0["type"] == "DistributedError", r0
    for r, rec in enumerate(records):
        before, after = rec["fail_state"]
        assert len(before) == 2 and any(k.endswith("@SHARD") for k in before[0]), before[0].keys()
        for place, (b, a) in enumerate(zip(before, after, strict=True)):
            assert b.keys() == a.keys(), (r, place)
            for k in b:
                assert torch.equal(a[k], b[k]), (r, place, k)


def test_stage_3_trains_rank_0s_start_whatever_each_rank_drew(records):
    want = _result(records, "adamw-2x2/3")["state"]
    got = _result(records, "adamw-2x2/3-seeds")["state"]
    for k, v in want.items():
        assert torch.equal(got[k], v), k


def test_write_back_on_every_rank_gives_torchs_training(records):
    import torch.nn.functional as F
    model = Z.TorchMLP().double()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)
    for b in Z.train_batches(Z.PROCESSES * 2, "float64", 3):
        f = Z.torch_feed(b)
        opt.zero_grad()
        F.cross_entropy(model(f["x"]), f["target"]).backward()
        opt.step()
    want = model.state_dict()
    for rec in records:
        for stage in (0, 3):
            got = rec[f"write_back/{stage}"]
            assert got.keys() == want.keys()
            for k, v in want.items():
                assert torch.allclose(got[k], v, rtol=0, atol=FLOAT64), (stage, k)


def test_stage_3_under_inductor_equals_the_plain_run(tmp_path):
    # its own launch: each segment between two collectives is compiled (about a minute here)
    with Z.Workers("train", tmp_path, world=Z.PROCESSES, ZERO_RUNS="inductor-2x1/3") as w:
        records = w.records(360)
    got = _result(records, "inductor-2x1/3")
    # one gather a layer (3) for forward and again for backward
    assert got["kinds"]["apply"]["all_gather"] == 6 and got["kinds"]["apply"]["free"] > 0
    ref = Z.train_run(se, Z.TRAIN_RUNS["adamw-2x1/0"], distributed=False)
    assert _max_diff(got["state"], ref["state"]) <= FLOAT64
    assert "compiled in" in w.log(0)  # Inductor did compile the segments


def test_stage_3_killed_mid_run_resumes_bit_for_bit_on_2_processes_and_on_1x2(tmp_path):
    """Issue 49, acceptance 4: 2 processes x 1 place, rank 1 SIGKILLed at step 5's first
    collective (a gather); resumed from step 4's sharded checkpoint by 2 processes (once
    more killed, rank 0 this time, while saving step 6, so resumed from step 4 again), and
    (from a copy of the folder) by 1 process x 2 places: both end bit for bit where the
    uninterrupted run ends (float64, AdamW, a step LR schedule, a second epoch)."""
    import shutil
    import signal

    def launch(name, world=2, places=1, ckpt=None, **env):
        out = tmp_path / name
        out.mkdir()
        ckpt = ckpt or (tmp_path / f"{name}-ck")
        w = Z.Workers("resume", out, world=world, ZERO_CKPT=ckpt, ZERO_PLACES=places, **env)
        return w, ckpt

    w, _ = launch("whole")
    with w:
        whole = w.records(120)
    assert [r["start"] for r in whole] == [0, 0]
    want = whole[0]["state"]
    w, ckpt = launch("killed", SSAEXEC_FAULT="kill@step:5:1")
    with w:
        try:
            codes = w.wait(120)
        except Exception:
            raise AssertionError(w.logs_text()) from None
        assert codes == [1, -signal.SIGKILL], w.logs_text()
        assert "stopped at step 5" in w.log(0), w.logs_text()
    names = sorted(p.name for p in ckpt.iterdir())
    # rank 0's files (the index) of steps 2 and 4, each with rank 1's shard file
    assert [n for n in names if ".shard-" not in n] == [
        "step-00000002.safetensors", "step-00000004.safetensors"], names
    assert len([n for n in names if ".shard-00001-of-00002" in n]) == 2, names
    copy = tmp_path / "copy-ck"
    shutil.copytree(ckpt, copy)
    # resumed, then rank 0 killed while writing step 6's checkpoint (its index written,
    # not renamed; rank 1's shard file is in place): no step-6 checkpoint
    w, _ = launch("save-killed", ckpt=ckpt, SSAEXEC_FAULT="kill@save:6:0")
    with w:
        codes = w.wait(120)
        assert codes == [-signal.SIGKILL, 1], w.logs_text()
    assert not (ckpt / "step-00000006.safetensors").exists()
    for name, world, places, folder in (("again", 2, 1, ckpt), ("one", 1, 2, copy)):
        w, _ = launch(name, world=world, places=places, ckpt=folder)
        with w:
            got = w.records(120)
        for rec in got:
            assert rec["start"] == 4 and rec["runs"] == Z.RESUME_STEPS, name
            assert rec["layout_world"] == 2
            assert rec["state"].keys() == want.keys(), name
            for k, v in want.items():
                assert torch.equal(rec["state"][k], v), (name, k)
    # the orphaned shard file of the killed save is gone: one shard file per checkpoint
    names = sorted(p.name for p in ckpt.iterdir())
    entries = [n for n in names if ".shard-" not in n]
    assert entries == [f"step-0000000{k}.safetensors" for k in (2, 4, 6)], names
    assert len([n for n in names if ".shard-" in n]) == len(entries), names


@pytest.mark.cuda
def test_stage_3_on_two_gpus_with_nccl_equals_the_plain_run(tmp_path):
    if not torch.distributed.is_nccl_available() or torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs and NCCL (one GPU per process)")
    with Z.Workers("train", tmp_path, world=Z.PROCESSES, cuda=True, ZERO_BACKEND="nccl",
                   ZERO_RUNS="adamw-2x1/0,adamw-2x1/3,sgd-2x1/1,sgd-2x1/2") as w:
        records = w.records(300)
    ref = Z.train_run(se, Z.TRAIN_RUNS["adamw-2x1/0"], distributed=False)
    for name in ("adamw-2x1/0", "adamw-2x1/3"):
        assert _max_diff(_result(records, name)["state"], ref["state"]) <= FLOAT64, name
    ref = Z.train_run(se, Z.TRAIN_RUNS["sgd-2x1/0"], distributed=False)
    for name in ("sgd-2x1/1", "sgd-2x1/2"):
        assert _max_diff(_result(records, name)["state"], ref["state"]) <= FLOAT64, name
