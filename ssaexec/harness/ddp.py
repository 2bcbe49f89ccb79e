"""The ``torch-ddp`` peer: the twin under ``DistributedDataParallel``, one process per place;
``torch-compile-ddp``: the same, compiled by ``torch.compile`` (dynamo's DDPOptimizer
splits the graph at DDP's bucket boundaries, so each bucket's all-reduce overlaps the
next part's backward; ``compile_s`` is rank 0's first step, taken before the warm-up).

Policy. The worker that runs the mode is rank 0; ranks 1..n-1 are spawned with
``torch.multiprocessing`` (``spawn``) and follow rank 0's commands through
queues (``run`` one window, ``exit``). The group meets on 127.0.0.1 at a free
port, over gloo on CPU and NCCL on GPUs (rank ``i`` on device ``i``), with a
bounded timeout so that a rank that dies does not leave the others waiting.
Each rank trains its own ``batch_per_place`` samples of the shared batch and
gets ``cores // processes`` torch threads (at most ``--torch-threads``).

What the group reports, as the other peers: a window's seconds and step times
are the slowest rank's (each window starts after a barrier), losses are
averaged over ranks, CPU seconds and peak RSS are summed over the processes,
peak GPU memory is the largest rank's. A rank that fails sends its traceback to
rank 0, which raises it; one that dies silently is noticed by its exit code.
"""

import datetime
import socket
import statistics
import time
import traceback

from ..core.place import available_cores
from .runners import EagerTrainer, peak_rss_mb, rss_mb

__all__ = ["DDPRank", "DDPGroup"]


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class DDPRank(EagerTrainer):
    """One DDP rank: process group, twin under ``DistributedDataParallel``, its data shard."""

    def __init__(self, rank, cfg, port):
        import torch
        import torch.distributed as dist
        s, n = cfg["settings"], cfg["places"]
        self.rank, self.cuda = rank, cfg["device"] == "cuda"
        cores = available_cores()
        torch.set_num_threads(min(max(1, cores // n), s["torch_threads"] or cores))
        if self.cuda:
            torch.cuda.set_device(rank)
        # a bounded timeout: a rank that dies must not leave the others waiting 30 minutes;
        # port None: the group is joined already (torchrun's: bench/time_to_steps.py)
        if port is not None:
            dist.init_process_group("nccl" if self.cuda else "gloo", rank=rank, world_size=n,
                                    init_method=f"tcp://127.0.0.1:{port}",
                                    timeout=datetime.timedelta(seconds=120))
        self.baseline = rss_mb()
        self.compiled = cfg["mode"] == "torch-compile-ddp"
        super().__init__(cfg, rank)
        self.threads = torch.get_num_threads()
        self.compile_s = None
        if self.compiled:  # every rank compiles; the collectives meet in the first step
            t0 = time.perf_counter()
            self.counted_step()
            self.compile_s = time.perf_counter() - t0

    def wrap(self, model):
        import torch
        ddp = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[self.rank] if self.cuda else None)
        return torch.compile(ddp) if self.compiled else ddp

    def window(self, steps, on_step):
        """A timed window that starts on every rank at once (after a barrier)."""
        import torch.distributed as dist
        dist.barrier()
        return super().window(steps, on_step)

    def leave(self):
        """Leave the group: (peak RSS MiB, peak GPU MiB or None)."""
        import torch.distributed as dist
        cuda_peak = self.cuda_peak_mb()
        dist.destroy_process_group()
        return peak_rss_mb(), cuda_peak


def _ddp_rank(rank, cfg, port, cmd_q, res_q):
    """DDP ranks 1..n-1 (spawned): build, warm up, then run windows on command."""
    def quiet():
        pass

    try:
        r = DDPRank(rank, cfg, port)
        res_q.put(("ready", rank, r.warm_up(cfg["warmup"], quiet), r.baseline))
        while cmd_q.get() == "run":
            res_q.put(("window", rank, *r.window(cfg["steps"], quiet)))
        res_q.put(("result", rank, *r.leave()))
    except BaseException:  # noqa: B036 - report everything to rank 0, then die
        res_q.put(("error", rank, traceback.format_exc()))
        raise


class DDPGroup:
    """``places`` DDP processes: rank 0 is this worker, ranks 1.. are spawned with
    ``torch.multiprocessing`` and follow rank 0's commands through queues.

    Built, it has warmed up: ``warmup`` (mean losses), ``baseline`` (RSS MiB before
    the model, summed) and ``threads``; ``on_step()`` is called after each of rank 0's
    steps."""

    def __init__(self, cfg, on_step):
        self.n = cfg["places"]
        port = _free_port()
        self.procs, self.cmd_qs, self.res_q = [], [], None
        if self.n > 1:
            import torch.multiprocessing as mp
            ctx = mp.get_context("spawn")
            self.res_q = ctx.Queue()
            self.cmd_qs = [ctx.Queue() for _ in range(1, self.n)]
            for r, q in enumerate(self.cmd_qs, start=1):
                p = ctx.Process(target=_ddp_rank, args=(r, cfg, port, q, self.res_q),
                                daemon=True)
                p.start()
                self.procs.append(p)
        self.rank0 = DDPRank(0, cfg, port)
        warm = [self.rank0.warm_up(cfg["warmup"], on_step)]
        ready = self._collect("ready")
        warm += [m[2] for m in ready]
        self.warmup = [statistics.fmean(v) for v in zip(*warm)]
        self.baseline = (self.rank0.baseline or 0) + sum(m[3] or 0 for m in ready)
        self.threads = self.rank0.threads
        self.compile_s = self.rank0.compile_s

    def _collect(self, kind):
        import queue
        got = {}
        while len(got) < self.n - 1:
            try:
                msg = self.res_q.get(timeout=1.0)
            except queue.Empty:
                dead = [p for p in self.procs if not p.is_alive() and p.exitcode != 0]
                if dead:
                    raise RuntimeError(f"a DDP process died with exit code {dead[0].exitcode} "
                                       "without a message (see the worker log)") from None
                continue
            if msg[0] == "error":
                raise RuntimeError(f"DDP rank {msg[1]} failed:\n{msg[2]}")
            if msg[0] == kind:
                got[msg[1]] = msg
        return [got[r] for r in range(1, self.n)]

    def window(self, steps, on_step):
        """One timed window of ``steps`` steps on every rank (``on_step()`` after each of
        rank 0's): (seconds, step seconds, losses, CPU seconds), as ``Trainer.window``."""
        for q in self.cmd_qs:
            q.put("run")
        mine = self.rank0.window(steps, on_step)
        wins = [mine] + [m[2:] for m in self._collect("window")]
        seconds = max(w[0] for w in wins)
        step_seconds = [max(ts) for ts in zip(*(w[1] for w in wins))]
        losses = [statistics.fmean(v) for v in zip(*(w[2] for w in wins))]
        return seconds, step_seconds, losses, sum(w[3] for w in wins)

    def finish(self):
        """End every rank: the ``result`` fields (peak memory), as ``Trainer.finish``."""
        for q in self.cmd_qs:
            q.put("exit")
        results = [self.rank0.leave()] + [m[2:] for m in self._collect("result")]
        for p in self.procs:
            p.join(30)
        peaks = [r[0] for r in results]
        cuda = [r[1] for r in results if r[1] is not None]
        return {"peak_rss_mb": sum(peaks), "peak_rss_mb_per_process": peaks,
                "peak_cuda_mb": max(cuda) if cuda else None}

    def kill(self):
        for p in self.procs:
            if p.is_alive():
                p.kill()
