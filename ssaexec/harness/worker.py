"""Worker processes and the line protocol between them and the harness.

Policy. Every (mode, places) pair runs in its own worker process, so peak
memory is that process's own. The harness (``WorkerProcess``) starts

* ``python -c 'from ssaexec.harness.worker import serve; serve()'`` for the modes
  of one process (``ssaexec.harness.runners``) and ``torch-ddp`` (whose rank 0 it
  is, ``ssaexec.harness.ddp``), and
* ``torchrun --standalone --nproc-per-node P -m ssaexec.harness.worker`` for
  ``ssaexec-nproc``: ssaexec as ``P`` processes, each a ``ParallelTrainer`` over
  ``places / P`` local places (``ssaexec-inductor-nproc``: an ``InductorTrainer``),
  joined by ``ssaexec.dist.world`` (``serve_torchrun``; rank 0 speaks the protocol).

Protocol (line-based): the harness writes the config as one JSON line
(``mode``, ``places`` = all places of all processes, ``device``, ``settings``,
``warmup``, ``steps``), then ``run`` (one timed window) or ``exit`` lines (end of
input counts as ``exit``). The worker builds its model, runs ``warmup`` steps,
then waits; it answers JSON lines prefixed with ``@@`` (``step``, ``ready``,
``window``, ``result``, ``error``) on its original stdout, and everything else
it prints goes to stderr, which the harness keeps in a log file and shows when
a worker fails.

Under torchrun, rank 0 hands each command to the other ranks over a gloo group
with a long timeout (they idle while the harness times other modes); the
training collectives keep the normal timeout. A window's seconds and step
times are the slowest rank's; losses are averaged over ranks; CPU seconds and
peak RSS are summed over ranks (as for torch-ddp). Each rank dies with the
torchrun agent (``die_with_parent``), so killing the launcher leaves no orphans.

``python -m ssaexec.harness.worker`` is the torchrun rank; the package does not
import this module, so running it with ``-m`` finds it fresh.
"""

import datetime
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

from ..core import host_allocator
from ..core.place import available_cores
from .ddp import DDPGroup
from .workloads import repo_root
from .runners import TRAINERS, InductorTrainer, ParallelTrainer, peak_rss_mb, rss_mb
from .time_to_steps import to_step

__all__ = ["WorkerProcess", "WorkerError", "serve", "serve_torchrun", "die_with_parent"]

PREFIX = "@@"
COMMAND_TIMEOUT = datetime.timedelta(days=1)


# --- the harness's side ---------------------------------------------------------------------

class WorkerError(RuntimeError):
    """A worker reported an error, or exited before answering."""


class WorkerProcess:
    """The harness's handle on one worker process (``cfg`` is its config)."""

    def __init__(self, cfg, log_dir, on_step, begin=True):
        self.cfg = cfg
        self.on_step = on_step
        self.log_path = Path(log_dir) / f"{cfg['mode']}-{cfg['places']}.log"
        self.log = open(self.log_path, "w")
        env = dict(os.environ)
        root = str(repo_root())
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH")
                                    else "")
        if cfg.get("nproc"):
            # ssaexec under torchrun: rank 0 of serve_torchrun speaks the same protocol
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   "--nproc-per-node", str(cfg["nproc"]), "-m", "ssaexec.harness.worker"]
        else:
            cmd = [sys.executable, "-c", "from ssaexec.harness.worker import serve; serve()"]
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True,
            bufsize=1, env=env, cwd=root)
        if begin:
            self.begin()

    def begin(self):
        """Send the config: the worker builds its model and warms up (until then it has
        only imported; ``begin=False`` lets the harness start the builds one at a time).
        ``begun``: when, on ``time.perf_counter``'s clock."""
        self.begun = time.perf_counter()
        self.send(json.dumps(self.cfg))

    def send(self, line):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def wait_for(self, event):
        """The next message ``event`` (``step`` messages go to ``on_step(cfg)`` meanwhile)."""
        for line in self.proc.stdout:
            if not line.startswith(PREFIX):
                continue
            msg = json.loads(line[len(PREFIX):])
            if msg["event"] == "step":
                self.on_step(self.cfg)
            elif msg["event"] == "error":
                raise WorkerError(msg["message"])
            elif msg["event"] == event:
                return msg
        self.proc.wait()
        raise WorkerError(f"worker exited with code {self.proc.returncode} before "
                          f"'{event}':\n{self.log_tail()}")

    def log_tail(self, n=30):
        self.log.flush()
        try:
            return "\n".join(self.log_path.read_text().splitlines()[-n:])
        except OSError:
            return ""

    def kill(self):
        self.proc.kill()

    def close(self):
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


# --- the worker's side ----------------------------------------------------------------------

def _take_stdout(speaks=True):
    """Keep this process's stdout for protocol lines and send all other output to stderr.

    Returns ``emit(msg)``, which writes one message (only where ``speaks``).
    """
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything printed by torch or user code goes to stderr
    sys.stdout = sys.stderr

    def emit(msg):
        if speaks:
            proto.write(PREFIX + json.dumps(msg) + "\n")
            proto.flush()
    return emit


def _ready_message(t0, peer, **more):
    """The ``ready`` message: set-up seconds, the compile (its seconds, whether steps
    waited for it, what a tiered runner did), the time to each step run so far, and what
    ``core.host_allocator`` did in this process (every CPU mode's process asks, the
    peers' too)."""
    ends = getattr(getattr(peer, "rank0", peer), "ends", [])
    return dict(event="ready", setup_s=time.perf_counter() - t0,
                compile_s=getattr(peer, "compile_s", None),
                compile_blocks=getattr(peer, "compile_blocks", True),
                tiers=getattr(peer, "tiers", None), host_allocator=host_allocator.state(),
                **to_step(ends, t0), **more)


def _window_message(seconds, step_seconds, losses, cpu_seconds):
    return {"event": "window", "seconds": seconds, "step_seconds": step_seconds,
            "losses": losses, "cpu_seconds": cpu_seconds}


def serve():
    """A worker of one process: a trainer of ``TRAINERS``, or rank 0 of a ``DDPGroup``."""
    emit = _take_stdout()

    def on_step():
        emit({"event": "step"})

    group = None
    try:
        cfg = json.loads(sys.stdin.readline())
        import torch
        torch.manual_seed(cfg["settings"]["seed"])
        mode = cfg["mode"]
        t0 = time.perf_counter()
        if mode in ("torch-ddp", "torch-compile-ddp"):
            peer = group = DDPGroup(cfg, on_step)
            warm, baseline, threads = group.warmup, group.baseline, group.threads
        else:
            torch.set_num_threads(cfg["settings"]["torch_threads"] or available_cores())
            baseline = rss_mb()
            peer = TRAINERS[mode](cfg)
            warm = peer.warm_up(cfg["warmup"], on_step)
            threads = torch.get_num_threads()
        emit(_ready_message(t0, peer, warmup_losses=warm, baseline_rss_mb=baseline,
                            torch_threads=threads))
        for line in sys.stdin:
            if line.strip() == "exit":
                break
            emit(_window_message(*peer.window(cfg["steps"], on_step)))
        emit(dict(peer.finish(), event="result"))
    except BaseException:  # noqa: B036 - the harness must hear about every failure
        if group is not None:
            group.kill()
        emit({"event": "error", "message": traceback.format_exc()})
        sys.exit(1)


def die_with_parent():
    """Have the kernel kill this process when its parent dies (Linux; elsewhere nothing)."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes
            import signal
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass


def serve_torchrun():
    """Every rank of ``torchrun ... -m ssaexec.harness.worker`` (``ssaexec-nproc``)."""
    die_with_parent()
    rank = int(os.environ.get("RANK", "0"))
    emit = _take_stdout(speaks=rank == 0)  # only rank 0's protocol lines reach the harness

    def on_step():
        emit({"event": "step"})

    try:
        import torch
        import torch.distributed as dist

        import ssaexec as se
        from ssaexec.dist import world as sd
        cuda = torch.cuda.is_available() and os.environ.get("SSAEXEC_BENCH_DEVICE") != "cpu"
        # CPU tensors (the commands, the checks) over gloo; CUDA ones over NCCL
        sd.init(backend="cpu:gloo,cuda:nccl" if cuda else "gloo")
        from ssaexec.dist.group_collective import ProcessGroupCollective
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
        # the set-up counts from the config, as in serve(): before it, a rank has only
        # imported and joined its group, and then waited while the harness built the
        # modes before this one (counted, they made nproc's time to step 1 16-52 s)
        t0 = time.perf_counter()
        if cfg["device"] == "cuda" and not cuda:
            raise SystemExit("the config asks for CUDA but this worker has none")
        torch.manual_seed(cfg["settings"]["seed"])
        baseline = rss_mb()
        world = sd.world_size()
        if cfg["places"] % world:
            raise SystemExit(f"{cfg['places']} places do not divide among {world} processes")
        per = cfg["places"] // world
        places = sd.local_places(per) if cfg["device"] == "cuda" else se.cpu_places(per)
        # ssaexec-inductor-nproc: each process compiles its segments (its first two steps)
        cls = InductorTrainer if cfg["mode"] == "ssaexec-inductor-nproc" else ParallelTrainer
        trainer = cls(cfg, places, first_place=sd.rank() * per)
        assert trainer.pe.distributed or world == 1
        warm = _mean_over_ranks(coll, trainer.warm_up(cfg["warmup"], on_step))
        baselines = coll.gather_objects(baseline, "gather of the baseline RSS")
        emit(_ready_message(t0, trainer, warmup_losses=warm,
                            baseline_rss_mb=sum(b or 0 for b in baselines),
                            torch_threads=torch.get_num_threads(), processes=coll.world_size,
                            places_per_process=len(trainer.places)))
        while next_line() == "run":
            everyone = coll.gather_objects(trainer.window(cfg["steps"], on_step),
                                           "gather of the timings")
            emit(_window_message(max(e[0] for e in everyone),
                                 [max(v) for v in zip(*(e[1] for e in everyone))],
                                 [sum(v) / len(v) for v in zip(*(e[2] for e in everyone))],
                                 sum(e[3] for e in everyone)))
        peaks = coll.gather_objects((peak_rss_mb(), trainer.cuda_peak_mb()),
                                    "gather of the peak memory")
        cuda_peaks = [p[1] for p in peaks if p[1] is not None]
        emit({"event": "result", "peak_rss_mb": sum(p[0] for p in peaks),
              "peak_rss_mb_per_process": [p[0] for p in peaks],
              "peak_cuda_mb": max(cuda_peaks) if cuda_peaks else None})
        trainer.close()
        sd.shutdown()
    except BaseException:  # noqa: B036 - the harness must hear about every failure
        emit({"event": "error", "message": f"rank {rank}: {traceback.format_exc()}"})
        sys.exit(1)


def _mean_over_ranks(coll, values):
    everyone = coll.gather_objects(values, "gather of the losses")
    return [sum(v) / len(v) for v in zip(*everyone)]


if __name__ == "__main__":
    serve_torchrun()
