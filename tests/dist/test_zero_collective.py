"""ZeRO's collectives across processes (``ProcessGroupCollective.all_gather`` and
``reduce_scatter``), against their plain definition, with 2 real gloo processes.

One launch (``tests/zero_worker.py collectives``) runs every case: 2 processes x 1 and x 2
places, float64 and float32. The oracle is the definition in zero_spec (global rank
``process * places + place``): the gather is the concatenation of every rank's shard in
global rank order; a reduce-scatter shard is the sum over ranks of that rank's chunk,
places summed in order, then processes, so with 2 processes it equals, bit for bit, the
slice of the plain all-reduce.
"""

import pytest
import torch

import zero_worker as Z

pytestmark = [pytest.mark.timeout(180), pytest.mark.processes]


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    out = tmp_path_factory.mktemp("zero_collectives")
    with Z.Workers("collectives", out, world=Z.PROCESSES) as w:
        return w.records(120)


def _expected(places, dtype):
    world = Z.PROCESSES * places
    S = Z.SHARD
    shards = [Z.collective_input("shard", g, S, dtype) for g in range(world)]
    fulls = [Z.collective_input("full", g, world * S, dtype) for g in range(world)]
    gathered = torch.cat(shards)
    per_process = []
    for t in range(Z.PROCESSES):
        acc = fulls[t * places].clone()
        for i in range(1, places):
            acc += fulls[t * places + i]  # places in order
        per_process.append(acc)
    total = per_process[0] + per_process[1]  # then the 2 processes (a + b == b + a)
    scattered = [total[g * S:(g + 1) * S] for g in range(world)]
    return gathered, scattered, total


@pytest.mark.parametrize("places, dtype", Z.COLLECTIVE_CASES)
def test_gather_and_scatter_equal_their_definition(records, places, dtype):
    gathered, scattered, total = _expected(places, dtype)
    S = Z.SHARD
    for rec in records:
        got = rec[(places, dtype)]
        for i in range(places):
            g = rec["rank"] * places + i
            assert torch.equal(got["gather"][i], gathered), (rec["rank"], i)
            assert torch.equal(got["async_gather"][i], gathered)
            assert torch.equal(got["scatter"][i], scattered[g]), (rec["rank"], i)
            assert torch.equal(got["async_scatter"][i], scattered[g])
            # the shard is the all-reduced gradient's slice, bit for bit
            assert torch.equal(got["scatter"][i], got["all_reduce"][g * S:(g + 1) * S])
        assert torch.equal(got["all_reduce"], total)
        assert got["inputs_untouched"]  # the reduce-scatter does not write its inputs


@pytest.mark.parametrize("places, dtype", Z.COLLECTIVE_CASES)
def test_the_low_precision_gather_rounds_every_shard_the_same(records, places, dtype):
    gathered, _, _ = _expected(places, dtype)
    want = gathered.to(torch.bfloat16).to(gathered.dtype)
    assert not torch.equal(want, gathered)  # the rounding shows
    for rec in records:
        for out in rec[(places, dtype)]["bf16_gather"]:
            assert out.dtype == gathered.dtype and torch.equal(out, want)


def test_the_compat_fallbacks_equal_the_running_torchs_names(records):
    for rec in records:
        assert (rec["processes"], rec["process_rank"]) == (Z.PROCESSES, rec["rank"])
        for name, (old, new, native) in rec["compat"].items():
            assert torch.equal(old, new), name
            # torch 2.13 has the *_single names; 2.11 only the old ones (then both are them)
            assert native == hasattr(torch.distributed, name.split(".")[1]), name


def test_bad_sizes_are_refused_before_any_collective(records):
    for rec in records:
        bad = rec["bad_size"]
        assert bad["type"] == "SSAExecError" and "all_gather(bad)" in bad["message"], bad
        assert "differ in size ([3, 4])" in bad["message"]
        bad = rec["bad_out"]
        assert bad["type"] == "SSAExecError" and "reduce_scatter(bad)" in bad["message"], bad
        assert "an input of 7 elements where the reduce-scatter takes 6" in bad["message"]
        assert rec["after"] == pytest.approx(0.5)  # the group is still usable


def test_a_peer_that_never_joins_is_a_distributed_error_naming_rank_and_collective(records):
    res = records[0]["hang"]
    assert res["type"] == "DistributedError", res
    assert res["message"].startswith("rank 0 of 2 (gloo): reduce_scatter(w@GRAD) failed ("), res
    assert "A peer process probably died, raised or timed out" in res["message"]
    assert 0.5 < res["seconds"] < Z.TIMEOUT  # the side group's 1 s, not the 30 s one


# --- NCCL (marked cuda: skipped on a machine without a GPU) ----------------------------------

def _needs_gpus(n):
    if not torch.distributed.is_nccl_available():
        pytest.skip("this torch build has no NCCL")
    if torch.cuda.device_count() < n:
        pytest.skip(f"needs {n} GPUs (NCCL takes one per process), this machine has "
                    f"{torch.cuda.device_count()}")


@pytest.fixture
def world_of_one(monkeypatch):
    import ssaexec.dist.world as dist
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    yield dist
    dist.shutdown()


@pytest.mark.cuda
def test_nccl_world_of_one_gathers_and_scatters_two_places_on_one_gpu(world_of_one):
    from ssaexec.dist.group_collective import ProcessGroupCollective
    _needs_gpus(1)
    info = world_of_one.init(backend="nccl", timeout=60)
    coll = ProcessGroupCollective(timeout=info.timeout)
    S, dev = Z.SHARD, torch.device("cuda:0")
    shards = [Z.collective_input("shard", g, S, "float64").to(dev) for g in range(2)]
    fulls = [Z.collective_input("full", g, 2 * S, "float64").to(dev) for g in range(2)]
    outs = [torch.full((2 * S,), float("nan"), dtype=torch.float64, device=dev)
            for _ in range(2)]
    coll.all_gather(shards, outs, label="all_gather(w)")
    got = [torch.zeros(S, dtype=torch.float64, device=dev) for _ in range(2)]
    coll.reduce_scatter(fulls, got, label="reduce_scatter(w@GRAD)")
    torch.cuda.synchronize()
    total = (fulls[0] + fulls[1]).cpu()
    for i in range(2):
        assert torch.equal(outs[i].cpu(), torch.cat(shards).cpu())
        assert torch.equal(got[i].cpu(), total[i * S:(i + 1) * S])


@pytest.mark.cuda
@pytest.mark.parametrize("places, dtype", Z.COLLECTIVE_CASES)
def test_two_nccl_processes_gather_and_scatter_as_defined(tmp_path, places, dtype):
    _needs_gpus(Z.PROCESSES)
    with Z.Workers("collectives", tmp_path, world=Z.PROCESSES, cuda=True,
                   ZERO_BACKEND="nccl") as w:
        records = w.records(180)
    gathered, scattered, total = _expected(places, dtype)
    for rec in records:
        got = rec[(places, dtype)]
        for i in range(places):
            g = rec["rank"] * places + i
            assert torch.equal(got["gather"][i], gathered)
            assert torch.equal(got["async_gather"][i], gathered)
            # NCCL sums in its own order: equal to float rounding
            assert torch.allclose(got["scatter"][i], scattered[g], rtol=1e-6, atol=1e-6)
        assert got["inputs_untouched"]
        for name, (old, new, _) in rec["compat"].items():
            assert torch.equal(old, new), name
