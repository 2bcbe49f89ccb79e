"""One process of the ZeRO multi-process tests (tests/dist/test_zero_*.py start two).

Run as ``python tests/zero_worker.py SCENARIO OUT_DIR`` with torchrun's environment
(RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT); ``Workers`` starts them. Each rank writes
what it saw to ``OUT_DIR/rank<r>.pt`` and the test compares it with its own oracle (the
plain definition, or a plain all-reduce run in the test's process). One launch runs many
configurations: starting processes is the slow part on a small machine.

Scenarios:

* ``collectives``: ``ProcessGroupCollective.all_gather`` / ``reduce_scatter`` (and their
  ``_start`` forms, the graph handle's low-precision gather, the compat fallbacks) on inputs every rank
  can rebuild (``collective_input``), for 1 and 2 places a process; a size mismatch; a
  peer that never joins (a side group with a short timeout).
"""

import os
import signal
import subprocess
import sys
import time
import warnings

import torch

TIMEOUT = 30.0
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.abspath(__file__)


# --- the launcher the tests use -----------------------------------------------------------

def _env(**extra):
    env = dict(os.environ)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
              "MASTER_PORT", "SSAEXEC_DISTRIBUTED_DEBUG", "SSAEXEC_FAULT"):
        env.pop(k, None)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    env["CUDA_VISIBLE_DEVICES"] = ""  # gloo on CPU, GPUs or not
    env.update({k: str(v) for k, v in extra.items()})
    return env


class Workers:
    """``world`` processes of ``scenario`` (killed, if still alive, on exit)."""

    def __init__(self, scenario, out_dir, world=2, **env):
        from tests.ports import free_port
        self.port = free_port()
        self.out_dir = str(out_dir)
        self.world = world
        self.logs = [os.path.join(self.out_dir, f"out{r}.txt") for r in range(world)]
        self.procs = []
        for r in range(world):
            with open(self.logs[r], "w") as log:
                self.procs.append(subprocess.Popen(
                    [sys.executable, WORKER, scenario, self.out_dir], cwd=REPO,
                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                    env=_env(RANK=r, WORLD_SIZE=world, LOCAL_RANK=r, LOCAL_WORLD_SIZE=world,
                             MASTER_ADDR="127.0.0.1", MASTER_PORT=self.port, **env)))

    def log(self, r):
        with open(self.logs[r]) as f:
            return f.read()

    def logs_text(self):
        return "\n".join(f"--- rank {r} ---\n{self.log(r)[-4000:]}" for r in range(self.world))

    def wait(self, timeout):
        deadline = time.monotonic() + timeout
        for p in self.procs:
            p.wait(max(0.1, deadline - time.monotonic()))
        return [p.returncode for p in self.procs]

    def records(self, timeout):
        """Wait (at most ``timeout`` s) and return every rank's record; fail with the logs."""
        try:
            codes = self.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the workers did not finish in {timeout} s\n" +
                                 self.logs_text()) from None
        assert codes == [0] * self.world, self.logs_text()
        return [torch.load(os.path.join(self.out_dir, f"rank{r}.pt")) for r in range(self.world)]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)


# --- scenario "collectives" -----------------------------------------------------------------

PROCESSES = 2
SHARD = 5  # elements per rank's shard
COLLECTIVE_CASES = [(1, "float64"), (2, "float64"), (2, "float32")]  # (places, dtype)


def collective_input(kind, g, n, dtype):
    """The ``kind`` ("shard" or "full") tensor of global rank ``g``: ``n`` elements that
    every process (and the test) can make again."""
    gen = torch.Generator().manual_seed(1000 * g + (1 if kind == "full" else 2) + 7 * n)
    return torch.randn(n, dtype=getattr(torch, dtype), generator=gen)


def _expect(exc_type, fn):
    try:
        fn()
    except exc_type as e:
        return {"type": type(e).__name__, "message": str(e)}
    except BaseException as e:  # noqa: BLE001 - reported to the test, which fails on it
        return {"type": type(e).__name__, "message": str(e), "unexpected": True}
    return {"type": None, "message": "no error"}


def _collectives(se, rank, record):
    import datetime

    import torch.distributed as dist

    from ssaexec.core import compat
    from ssaexec.dist.group_collective import ProcessGroupCollective
    from ssaexec.graph.handles import AllGatherOpHandle
    coll = ProcessGroupCollective(timeout=TIMEOUT)
    record["processes"], record["process_rank"] = coll.processes, coll.process_rank
    for places, dtype in COLLECTIVE_CASES:
        world = PROCESSES * places
        ranks = [rank * places + i for i in range(places)]
        shards = [collective_input("shard", g, SHARD, dtype) for g in ranks]
        fulls = [collective_input("full", g, world * SHARD, dtype) for g in ranks]
        outs = [torch.full((world * SHARD,), float("nan"), dtype=shards[0].dtype)
                for _ in range(places)]
        coll.all_gather([s.clone() for s in shards], outs, label="all_gather(case)")
        got = [torch.full((SHARD,), float("nan"), dtype=shards[0].dtype) for _ in range(places)]
        sent = [f.clone() for f in fulls]
        coll.reduce_scatter(sent, got, label="reduce_scatter(case)")
        untouched = all(torch.equal(a, b) for a, b in zip(sent, fulls, strict=True))
        reduced = [f.clone() for f in fulls]
        coll.all_reduce(reduced, label="all_reduce(case)")
        # two in flight at once, finished in order (the graph's asynchronous form)
        a_outs = [torch.zeros_like(o) for o in outs]
        a_got = [torch.zeros_like(s) for s in got]
        fin_gather = coll.all_gather_start([s.clone() for s in shards], a_outs)
        fin_scatter = coll.reduce_scatter_start([f.clone() for f in fulls], a_got)
        fin_gather()
        fin_scatter()
        # the low-precision gather (zero_gather_dtype), as the graph's handle makes it
        low = [torch.zeros_like(o) for o in outs]
        AllGatherOpHandle(["w"], ["w@SHARD"], [[world * SHARD]], wire_dtype="bfloat16").apply(
            coll, (shards, low), "all_gather(w)")
        record[(places, dtype)] = {
            "gather": outs, "scatter": got, "inputs_untouched": untouched,
            "all_reduce": reduced[0], "async_gather": a_outs, "async_scatter": a_got,
            "bf16_gather": low}
    # the pre-2.13 names (compat's fallbacks) give what the running torch's own name gives
    x = collective_input("shard", rank, SHARD, "float64")
    both = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # all_gather_into_tensor, deprecated
        for name in ("dist.all_gather_single", "dist.reduce_scatter_single"):
            f = compat.FEATURES[name]
            outs = []
            for fn in (f.fallback, f.get()):
                if name == "dist.all_gather_single":
                    out = torch.zeros(PROCESSES * SHARD, dtype=x.dtype)
                    fn(out, x, group=None, async_op=True).wait()
                else:
                    out = torch.zeros(SHARD // 2 + 1, dtype=x.dtype)
                    inp = collective_input("full", rank, PROCESSES * out.numel(), "float64")
                    fn(out, inp, group=None, async_op=True).wait()
                outs.append(out)
            both[name] = (outs[0], outs[1], f.native)
    record["compat"] = both
    # a shard of the wrong size is refused before any collective, on every rank
    record["bad_size"] = _expect(se.SSAExecError, lambda: coll.all_gather(
        [torch.zeros(3), torch.zeros(4)], [torch.zeros(14), torch.zeros(14)],
        label="all_gather(bad)"))
    record["bad_out"] = _expect(se.SSAExecError, lambda: coll.reduce_scatter(
        [torch.zeros(7)], [torch.zeros(3)], label="reduce_scatter(bad)"))
    # a peer that never joins: the collective's DistributedError names rank and collective
    side = ProcessGroupCollective(dist.new_group(timeout=datetime.timedelta(seconds=1)),
                                  timeout=1)
    if rank == 0:
        t0 = time.perf_counter()
        record["hang"] = _expect(se.DistributedError, lambda: side.reduce_scatter(
            [torch.ones(2 * SHARD)], [torch.zeros(SHARD)], label="reduce_scatter(w@GRAD)"))
        record["hang"]["seconds"] = time.perf_counter() - t0
    # the default group is still usable
    record["after"] = float(se.distributed.average(float(rank)))


def main(scenario, out_dir):
    from ssaexec.harness.worker import die_with_parent
    die_with_parent()  # never outlive the test that started this process
    import ssaexec as se
    info = se.distributed.init(backend="gloo", timeout=TIMEOUT)
    rank = info.rank
    record = {"rank": rank, "world_size": info.world_size}
    if scenario == "collectives":
        _collectives(se, rank, record)
    else:
        raise SystemExit(f"unknown scenario {scenario!r}")
    torch.save(record, os.path.join(out_dir, f"rank{rank}.pt"))


if __name__ == "__main__":
    sys.path.insert(0, REPO)
    main(sys.argv[1], sys.argv[2])
