"""The benchmark's multi-process ssaexec worker: ``torchrun ... -m ssaexec.dist_bench``.

``ssaexec.benchmark`` measures ssaexec beside torch-ddp; with ``--nproc P`` it
runs ssaexec as ``P`` processes under torchrun, each a ``ParallelExecutor``
over ``places / P`` local places, joined by ``ssaexec.distributed``::

    torchrun --standalone --nproc-per-node P -m ssaexec.dist_bench

The launched group speaks the harness's worker protocol through rank 0: the
first stdin line is the config JSON (``mode``, ``places`` = all places of all
processes, ``device``, ``settings``, ``warmup``, ``steps``), then ``run`` (one
timed window) or ``exit`` lines (end of input counts as ``exit``); rank 0
answers ``@@``-prefixed JSON lines on stdout (``step``, ``ready``, ``window``,
``result``, ``error``), everything else goes to stderr. Rank 0 hands each
command to the other ranks over a gloo group with a long timeout (they idle
while the harness times other modes); the training collectives keep the
normal timeout.

Same work as the other modes: the program of ``benchmark.build_program``, the
synthetic batch of ``benchmark.synthetic_batch`` for all places, process ``r``
training the samples of places ``r * places/P ..`` of it. A window's seconds
and step times are the slowest rank's; losses are averaged over ranks; peak
RSS is summed over ranks (as for torch-ddp). Each worker dies with the
torchrun agent (``PR_SET_PDEATHSIG``), so killing the launcher leaves no
orphans.
"""

import datetime
import json
import os
import sys
import time
import traceback

__all__ = ["main"]

COMMAND_TIMEOUT = datetime.timedelta(days=1)


def _die_with_parent():
    if sys.platform.startswith("linux"):
        try:
            import ctypes
            import signal
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass


from .benchmark import _peak_rss_mb, _rss_mb  # noqa: E402  (one definition of both)


class _Worker:
    """This process's share of the run: its places, its samples, its executor."""

    def __init__(self, cfg):
        import torch

        import ssaexec as se
        from ssaexec import distributed as sd
        from ssaexec.benchmark import build_program, synthetic_batch
        s = cfg["settings"]
        world, rank = sd.world_size(), sd.rank()
        if cfg["places"] % world:
            raise SystemExit(f"{cfg['places']} places do not divide among {world} processes")
        per = cfg["places"] // world
        self.cuda = cfg["device"] == "cuda"
        self.places = sd.local_places(per) if self.cuda else se.cpu_places(per)
        main, startup, self.loss = build_program(s)
        b = s["batch_per_place"]
        x, y = synthetic_batch(s, cfg["places"] * b)
        lo, hi = rank * per * b, (rank + 1) * per * b
        self.feed = {"img": x[lo:hi], "label": y[lo:hi]}
        self.pe = se.ParallelExecutor(self.places, main, startup, self.loss, scope=se.Scope())
        assert self.pe.distributed or world == 1
        self.torch = torch

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def step(self):
        loss, = self.pe.run([self.loss], feed=self.feed)
        return float(loss)

    def cuda_peak_mb(self):
        if not self.cuda:
            return None
        return max(self.torch.cuda.max_memory_allocated(p.device) for p in self.places) / 2**20


def main():
    """Entry point of every rank (see the module docstring)."""
    _die_with_parent()
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # only rank 0's protocol lines reach the harness
    sys.stdout = sys.stderr
    rank = int(os.environ.get("RANK", "0"))

    def emit(msg):
        if rank == 0:
            proto.write("@@" + json.dumps(msg) + "\n")
            proto.flush()

    try:
        t0 = time.perf_counter()
        import torch
        import torch.distributed as dist

        from ssaexec import distributed as sd
        cuda = torch.cuda.is_available() and os.environ.get("SSAEXEC_BENCH_DEVICE") != "cpu"
        # CPU tensors (the commands, the checks) over gloo; CUDA ones over NCCL
        sd.init(backend="cpu:gloo,cuda:nccl" if cuda else "gloo")
        from ssaexec.runtime.dist_collective import ProcessGroupCollective
        commands = ProcessGroupCollective(dist.new_group(backend="gloo",
                                                         timeout=COMMAND_TIMEOUT))
        coll = sd.collective()

        def next_line():
            box = [None]
            if rank == 0:
                box[0] = (sys.stdin.readline() or "exit").strip()
            commands.call("command broadcast", lambda: dist.broadcast_object_list(
                box, src=0, group=commands.group))
            return box[0]

        cfg = json.loads(next_line())
        if cfg["device"] == "cuda" and not cuda:
            raise SystemExit("the config asks for CUDA but this worker has none")
        torch.manual_seed(cfg["settings"]["seed"])
        baseline = _rss_mb()
        worker = _Worker(cfg)
        warm = []
        for _ in range(cfg["warmup"]):
            warm.append(worker.step())
            emit({"event": "step"})
        worker.sync()
        warm = _mean_over_ranks(coll, warm)
        baselines = coll.gather_objects(baseline, "gather of the baseline RSS")
        emit({"event": "ready", "setup_s": time.perf_counter() - t0, "warmup_losses": warm,
              "baseline_rss_mb": sum(b or 0 for b in baselines),
              "torch_threads": torch.get_num_threads(), "processes": coll.world_size,
              "places_per_process": len(worker.places)})
        while next_line() == "run":
            step_s, losses = [], []
            worker.sync()
            cpu0, start = time.process_time(), time.perf_counter()
            for _ in range(cfg["steps"]):
                t = time.perf_counter()
                losses.append(worker.step())
                worker.sync()
                step_s.append(time.perf_counter() - t)
                emit({"event": "step"})
            seconds = time.perf_counter() - start
            cpu = time.process_time() - cpu0
            everyone = coll.gather_objects((seconds, step_s, losses, cpu), "gather of the timings")
            emit({"event": "window", "seconds": max(e[0] for e in everyone),
                  "step_seconds": [max(v) for v in zip(*(e[1] for e in everyone))],
                  "losses": [sum(v) / len(v) for v in zip(*(e[2] for e in everyone))],
                  "cpu_seconds": sum(e[3] for e in everyone)})
        peaks = coll.gather_objects((_peak_rss_mb(), worker.cuda_peak_mb()),
                                    "gather of the peak memory")
        cuda_peaks = [p[1] for p in peaks if p[1] is not None]
        emit({"event": "result", "peak_rss_mb": sum(p[0] for p in peaks),
              "peak_rss_mb_per_process": [p[0] for p in peaks],
              "peak_cuda_mb": max(cuda_peaks) if cuda_peaks else None})
        worker.pe.close()
        sd.shutdown()
    except BaseException:  # noqa: B036 - the harness must hear about every failure
        emit({"event": "error", "message": f"rank {rank}: {traceback.format_exc()}"})
        sys.exit(1)


def _mean_over_ranks(coll, values):
    everyone = coll.gather_objects(values, "gather of the losses")
    return [sum(v) / len(v) for v in zip(*everyone)]


if __name__ == "__main__":
    main()
