"""Benchmark harness: images/sec of one model trained in several modes, in one run.

``python bench/images_per_sec.py`` (= ``ssaexec bench`` = ``make bench``) trains
the same model, from the same initial weights, on the same synthetic batch in

* ``seq``: the sequential ``Executor`` on one place;
* ``ssaexec``: ``ParallelExecutor`` on 1..N places (CPU places or CUDA devices);
* ``torch-eager``: the ``torch.nn`` twin of the model (``bench/torch_models.py``)
  in a plain training loop;
* ``torch-ddp``: the twin under ``DistributedDataParallel``, one process per
  place (gloo on CPU, NCCL on GPUs), started with ``torch.multiprocessing`` and
  rendezvous on 127.0.0.1 at a free port;
* ``ssaexec-from-torch`` (``--from-torch``): the twin converted by
  ``ssaexec.frontends.torch.from_torch`` and run by ``ParallelExecutor``.

and prints a table (images/sec, speedup over 1 place, scaling efficiency,
peak memory), writes a JSON file with every raw timing and the machine, and
a PNG plot of images/sec against places.

``--model transformer`` (issue 13's launch-bound model: 2 encoder layers,
d_model 32, batch 4 x seq 16, SGD, one torch thread) has no builder program:
``build_program`` imports the twin with ``from_torch``, so ``seq``,
``ssaexec`` and ``ssaexec-nproc`` run the imported program and every mode
starts from the twin's seeded initial weights. "Images" are then sequences.

Policy. Every (mode, places) pair runs in its own worker process
(``python -c 'import ssaexec.benchmark as b; b._worker_main()'``), so peak
memory is that process's own: ``ru_maxrss`` on CPU (summed over the ranks
for DDP), ``torch.cuda.max_memory_allocated`` on GPUs (the largest place).
A worker builds its model, runs ``warmup`` steps once, then waits; the parent
asks each worker in turn for a window of ``steps`` timed steps, ``repeats``
rounds (the order rotates every round). Interleaving the windows means a
burst of load from another process on a shared machine hits every mode
alike instead of one of them; ``--no-interleave`` runs each worker to the end
before starting the next (the default on GPUs, where idle workers would hold
device memory). The figure of a mode is the median images/sec over its
windows; a window's images/sec is ``steps * global batch / seconds``.

Same work in every mode. Initial weights come from the builder's seeded
startup program (copied into the twin by ``load_from_scope``); the data are
one seeded synthetic batch of ``max places * batch_per_place`` samples, and
with ``p`` places place ``i`` (or DDP rank ``i``) trains on samples
``[i * b, (i + 1) * b)``; one-place modes use the first ``b``. Batch per place
is fixed (weak scaling). The optimizer is SGD with momentum 0.9 unless told.

Threads (CPU). ``seq``, ``torch-eager`` and one-place ``ssaexec`` use every
core (at most ``--torch-threads``); ``ParallelExecutor`` itself limits torch
to ``cores // places`` threads per process when it has several CPU places;
each DDP process gets ``cores // processes`` (at most ``--torch-threads``).

Worker protocol (line-based): the parent writes the config as one JSON line,
then ``run`` (one timed window) or ``exit`` lines; the worker answers JSON
lines prefixed with ``@@`` (``ready``, ``step``, ``window``, ``result``,
``error``) on its original stdout, and everything else it prints goes to
stderr, which the parent keeps in a log file and shows when a worker fails.
"""

import argparse
import datetime
import json
import math
import os
import platform
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

__all__ = ["main", "add_arguments", "run", "PRESETS", "MODES", "load_twins",
           "machine_description"]

MODES = ("seq", "ssaexec", "torch-eager", "torch-ddp", "ssaexec-from-torch", "ssaexec-nproc")
DEFAULT_MODES = ("seq", "ssaexec", "torch-eager", "torch-ddp")
SCHEMA = "ssaexec-bench/1"

# Presets fill in every setting the command line leaves out.
PRESETS = {
    # make bench: ResNet-18 on CIFAR-shaped data, < 5 min on 2 CPU cores.
    # (3 warm-up steps: a ParallelExecutor of several CPU places times its first 3 steps to
    # choose between its thread pool and the calling thread)
    "default": dict(model="resnet18", image_size=32, batch_per_place=32, warmup=3, steps=2,
                    repeats=5),
    # make demo: the same model at a quarter of the width, ~30-60 s on 2 CPU cores.
    "quick": dict(model="resnet18", image_size=32, base=16, batch_per_place=16, warmup=3,
                  steps=3, repeats=2),
    # tests: a tiny MLP, seconds.
    "tiny": dict(model="mlp", in_dim=32, hidden="16", batch_per_place=8, warmup=1, steps=2,
                 repeats=1),
    # GPUs: ResNet-50 on ImageNet-shaped data.
    "imagenet": dict(model="resnet50", image_size=224, batch_per_place=32, warmup=3, steps=10,
                     repeats=3),
    # GPUs: the seed document's ResNeXt152 table (batch 12 per GPU).
    "resnext152": dict(model="resnext152", image_size=224, batch_per_place=12, warmup=3,
                       steps=10, repeats=3),
    # --model transformer: issue 13's small imported transformer, one torch thread
    # (launch-bound: ~300 tiny ops a step, a millisecond in eager), ~1 min on 2 CPU cores.
    "transformer": dict(model="transformer", d_model=32, heads=2, layers=2, seq_len=16,
                        batch_per_place=4, warmup=5, steps=20, repeats=5, optimizer="sgd",
                        lr=0.01, torch_threads=1),
}

_DEFAULTS = dict(model="resnet18", image_size=32, base=64, classes=10, in_dim=784,
                 hidden="128,64", cardinality=32, width=4, d_model=32, heads=2, layers=2,
                 seq_len=16, batch_per_place=32, warmup=2, steps=3, repeats=3,
                 optimizer="momentum", lr=0.01, seed=0, torch_threads=None)

TARGETS = [
    # (name, numerator run, denominator run, quantity, at least / at most, threshold)
    ("ssaexec@1 / torch-eager images/sec", ("ssaexec", 1), ("torch-eager", 1), "ips", ">=", 0.9),
    ("ssaexec@1 / torch-eager peak memory", ("ssaexec", 1), ("torch-eager", 1), "mem", "<=", 1.2),
    ("ssaexec@N / torch-ddp@N images/sec", ("ssaexec", "N"), ("torch-ddp", "N"), "ips", ">=",
     1.0),
    ("ssaexec@N / ssaexec@1 images/sec", ("ssaexec", "N"), ("ssaexec", 1), "ips", ">=", 1.5),
]


# --- helpers shared by parent and workers --------------------------------------------------

def _cores():
    from .place import available_cores
    return available_cores()


def _repo_root():
    return Path(__file__).resolve().parents[1]


def load_twins():
    """Import ``bench/torch_models.py`` (the torch.nn twins) from the source tree."""
    import importlib.util
    path = _repo_root() / "bench" / "torch_models.py"
    if "ssaexec_bench_torch_models" in sys.modules:
        return sys.modules["ssaexec_bench_torch_models"]
    if not path.exists():
        raise RuntimeError(f"the torch twins are not at {path}: the benchmark needs the ssaexec "
                           "source tree (bench/torch_models.py), not only the installed package")
    spec = importlib.util.spec_from_file_location("ssaexec_bench_torch_models", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _model_kwargs(s):
    """Builder kwargs and twin kwargs for the settings dict ``s``."""
    name = s["model"]
    if name == "mlp":
        hidden = tuple(int(h) for h in str(s["hidden"]).split(",") if h)
        kw = dict(in_dim=s["in_dim"], hidden=hidden, classes=s["classes"])
        return kw, dict(kw)
    if name == "transformer":
        kw = dict(d_model=s["d_model"], heads=s["heads"], layers=s["layers"],
                  classes=s["classes"])
        return kw, dict(kw)
    for prefix in ("resnext", "resnet"):
        if name.startswith(prefix) and name[len(prefix):].isdigit():
            depth = int(name[len(prefix):])
            kw = dict(image_size=s["image_size"], classes=s["classes"], base=s["base"])
            if prefix == "resnext":
                kw.update(cardinality=s["cardinality"], width=s["width"])
            return dict(kw, depth=depth), dict(kw)
    raise ValueError(f"unknown model {name!r}: use mlp, transformer, resnet18/34/50/101/152 "
                     "or resnext50/101/152")


def build_program(s):
    """``(main, startup, loss_name)`` of the benchmark model for settings ``s``."""
    from . import models
    opt = models.make_optimizer(s["optimizer"], s["lr"])
    kw, _ = _model_kwargs(s)
    if s["model"] == "transformer":
        # no builder version: import the seeded twin, its forward returning the loss, so
        # the feeds keep the builder's names (img, label)
        from .frontends.torch import from_torch
        x, y = synthetic_batch(s, 2)
        return from_torch(load_twins().WithLoss(build_twin(s)), {"img": x, "label": y},
                          optimizer=opt, random_seed=s["seed"])
    if s["model"] == "mlp":
        return models.build_mlp(optimizer=opt, seed=s["seed"], **kw)
    return models.build_resnet(optimizer=opt, seed=s["seed"], **kw)


def build_twin(s):
    """The ``torch.nn`` twin of ``build_program(s)``."""
    _, kw = _model_kwargs(s)
    if s["model"] == "transformer":
        import torch
        # torch-only model: its seeded initialisation is the initial weights of every mode
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(s["seed"])
            return load_twins().build_twin(s["model"], **kw)
    return load_twins().build_twin(s["model"], **kw)


def initial_twin(s):
    """The twin holding the initial weights of every mode.

    For builder models the seeded startup program's, copied by ``load_from_scope``;
    the transformer's own seeded ones (its program is imported from them).
    """
    twin = build_twin(s)
    if s["model"] != "transformer":
        main, startup, _ = build_program(s)
        load_twins().load_from_scope(twin, main, _initial_scope(main, startup))
    return twin


def torch_optimizer(name, params, lr):
    """The ``torch.optim`` optimizer whose update matches ``make_optimizer(name, lr)``."""
    import torch
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if name == "momentum":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    if name == "nesterov":
        return torch.optim.SGD(params, lr=lr, momentum=0.9, nesterov=True)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    raise ValueError(f"no torch optimizer for {name!r}")


def synthetic_batch(s, n):
    """``n`` seeded samples: (images or features, int64 labels [n, 1])."""
    from .synthetic import random_batch
    shape = ([s["in_dim"]] if s["model"] == "mlp" else
             [s["seq_len"], s["d_model"]] if s["model"] == "transformer" else
             [3, s["image_size"], s["image_size"]])
    return random_batch(shape, n, s["classes"], 1000 + s["seed"])


def _rss_mb():
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def _peak_rss_mb():
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kb / 1024 if sys.platform != "darwin" else kb / 2**20


def _size(s):
    """The input size for titles: `` 32x32`` (images), `` 2x32 h2 seq 16`` (transformer)."""
    if s["model"] == "mlp":
        return ""
    if s["model"] == "transformer":
        return f" {s['layers']}x{s['d_model']} h{s['heads']} seq {s['seq_len']}"
    return f" {s['image_size']}x{s['image_size']}"


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --- trainers (run inside a worker) -------------------------------------------------------

class _Trainer:
    """One mode's training loop: ``step()`` trains one batch and returns its loss."""

    device = "cpu"

    def sync(self):
        if self.device != "cpu":
            import torch
            torch.cuda.synchronize()

    def cuda_peak_mb(self):
        return None

    def close(self):
        pass


def _initial_scope(main, startup):
    import ssaexec as se
    scope = se.Scope()
    se.Executor(se.CPUPlace()).run(startup, scope=scope)
    return scope


class _SeqTrainer(_Trainer):
    def __init__(self, cfg):
        import ssaexec as se
        s = cfg["settings"]
        self.device = cfg["device"]
        place = se.CUDAPlace(0) if self.device == "cuda" else se.CPUPlace()
        self.main, startup, self.loss = build_program(s)
        self.scope = se.Scope()
        self.exe = se.Executor(place)
        self.exe.run(startup, scope=self.scope)
        x, y = synthetic_batch(s, s["batch_per_place"])
        self.feed = {"img": x.to(place.device), "label": y.to(place.device)}

    def step(self):
        loss, = self.exe.run(self.main, feed=self.feed, fetch_list=[self.loss], scope=self.scope)
        return float(loss)

    def cuda_peak_mb(self):
        import torch
        return torch.cuda.max_memory_allocated(0) / 2**20 if self.device == "cuda" else None


class _ParallelTrainer(_Trainer):
    def __init__(self, cfg, from_torch=False):
        import ssaexec as se
        s = cfg["settings"]
        self.device = cfg["device"]
        n = cfg["places"]
        self.places = (se.cuda_places()[:n] if self.device == "cuda" else se.cpu_places(n))
        x, y = synthetic_batch(s, n * s["batch_per_place"])
        self.scope = se.Scope()
        if from_torch:
            main, startup, self.loss, names = _from_torch_program(s, x, y)
        else:
            main, startup, self.loss = build_program(s)
            names = ("img", "label")
        self.pe = se.ParallelExecutor(self.places, main, startup, self.loss, scope=self.scope)
        self.feed = {names[0]: x, names[1]: y}

    def step(self):
        loss, = self.pe.run([self.loss], feed=self.feed)
        return float(loss)

    def cuda_peak_mb(self):
        import torch
        if self.device != "cuda":
            return None
        return max(torch.cuda.max_memory_allocated(p.device) for p in self.places) / 2**20

    def close(self):
        self.pe.close()


def _from_torch_program(s, x, y):
    """Convert the twin (holding the builder's initial weights) with ``se.from_torch``.

    The feed vars are the forward's argument (``x``) and ``target``, as
    ``from_torch`` names them.
    """
    try:
        from .frontends.torch import from_torch
    except ImportError as e:
        raise RuntimeError(f"--from-torch needs ssaexec.frontends.torch.from_torch, which "
                           f"could not be imported: {e}") from e
    from . import models
    twin = initial_twin(s)
    b = max(2, s["batch_per_place"])
    main, startup, loss = from_torch(twin, {"x": x[:b], "target": y[:b]},
                                     loss_fn=load_twins().loss_fn,
                                     optimizer=models.make_optimizer(s["optimizer"], s["lr"]))
    return main, startup, loss, ("x", "target")


class _EagerTrainer(_Trainer):
    def __init__(self, cfg):
        import torch
        s = cfg["settings"]
        self.device = cfg["device"]
        dev = torch.device("cuda", 0) if self.device == "cuda" else torch.device("cpu")
        self.model = initial_twin(s)
        self.model.to(dev).train()
        self.opt = torch_optimizer(s["optimizer"], self.model.parameters(), s["lr"])
        x, y = synthetic_batch(s, s["batch_per_place"])
        self.x, self.y = x.to(dev), y.to(dev)
        self.loss_fn = load_twins().loss_fn

    def step(self):
        self.opt.zero_grad(set_to_none=True)
        loss = self.loss_fn(self.model(self.x), self.y)
        loss.backward()
        self.opt.step()
        return loss.item()

    def cuda_peak_mb(self):
        import torch
        return torch.cuda.max_memory_allocated(0) / 2**20 if self.device == "cuda" else None


class _DDPRank:
    """One DDP rank: process group, twin under ``DistributedDataParallel``, its data shard."""

    def __init__(self, rank, cfg, port):
        import torch
        import torch.distributed as dist
        s, n = cfg["settings"], cfg["places"]
        self.rank, self.cfg, self.cuda = rank, cfg, cfg["device"] == "cuda"
        torch.set_num_threads(min(max(1, _cores() // n), s["torch_threads"] or _cores()))
        if self.cuda:
            torch.cuda.set_device(rank)
        dev = torch.device("cuda", rank) if self.cuda else torch.device("cpu")
        # a bounded timeout: a rank that dies must not leave the others waiting 30 minutes
        dist.init_process_group("nccl" if self.cuda else "gloo", rank=rank, world_size=n,
                                init_method=f"tcp://127.0.0.1:{port}",
                                timeout=datetime.timedelta(seconds=120))
        self.baseline = _rss_mb()
        model = initial_twin(s)
        model.to(dev).train()
        self.ddp = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[rank] if self.cuda else None)
        self.opt = torch_optimizer(s["optimizer"], self.ddp.parameters(), s["lr"])
        b = s["batch_per_place"]
        x, y = synthetic_batch(s, n * b)
        self.x, self.y = x[rank * b:(rank + 1) * b].to(dev), y[rank * b:(rank + 1) * b].to(dev)
        self.loss_fn = load_twins().loss_fn
        self.threads = torch.get_num_threads()

    def step(self):
        self.opt.zero_grad(set_to_none=True)
        loss = self.loss_fn(self.ddp(self.x), self.y)
        loss.backward()
        self.opt.step()
        return loss.item()

    def warmup(self, on_step):
        out = []
        for _ in range(self.cfg["warmup"]):
            out.append(self.step())
            on_step()
        return out

    def window(self, on_step):
        """``steps`` timed steps after a barrier: (seconds, step seconds, losses, CPU s)."""
        import torch
        import torch.distributed as dist
        dist.barrier()
        times, losses = [], []
        c0, t0 = time.process_time(), time.perf_counter()
        for _ in range(self.cfg["steps"]):
            t = time.perf_counter()
            losses.append(self.step())
            if self.cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
            on_step()
        return time.perf_counter() - t0, times, losses, time.process_time() - c0

    def finish(self):
        import torch
        import torch.distributed as dist
        cuda_peak = torch.cuda.max_memory_allocated(self.rank) / 2**20 if self.cuda else None
        dist.destroy_process_group()
        return _peak_rss_mb(), cuda_peak


def _ddp_rank(rank, cfg, port, cmd_q, res_q):
    """DDP ranks 1..n-1 (spawned): build, warm up, then run windows on command."""
    try:
        r = _DDPRank(rank, cfg, port)
        res_q.put(("ready", rank, r.warmup(lambda: None), r.baseline))
        while cmd_q.get() == "run":
            res_q.put(("window", rank, *r.window(lambda: None)))
        res_q.put(("result", rank, *r.finish()))
    except BaseException:  # noqa: B036 - report everything to rank 0, then die
        res_q.put(("error", rank, traceback.format_exc()))
        raise


class _DDPGroup:
    """``places`` DDP processes: rank 0 is this worker, ranks 1.. are spawned with
    ``torch.multiprocessing`` and follow rank 0's commands through queues."""

    def __init__(self, cfg, emit):
        self.cfg, self.n = cfg, cfg["places"]
        self.on_step = lambda: emit({"event": "step"})
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
        self.rank0 = _DDPRank(0, cfg, port)
        warm = [self.rank0.warmup(self.on_step)]
        ready = self._collect("ready")
        warm += [m[2] for m in ready]
        self.warmup = [statistics.fmean(v) for v in zip(*warm)]
        self.baseline = (self.rank0.baseline or 0) + sum(m[3] or 0 for m in ready)
        self.threads = self.rank0.threads

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

    def window(self):
        for q in self.cmd_qs:
            q.put("run")
        mine = self.rank0.window(self.on_step)
        wins = [mine] + [m[2:] for m in self._collect("window")]
        seconds = max(w[0] for w in wins)
        step_seconds = [max(ts) for ts in zip(*(w[1] for w in wins))]
        losses = [statistics.fmean(v) for v in zip(*(w[2] for w in wins))]
        return seconds, step_seconds, losses, sum(w[3] for w in wins)

    def finish(self):
        for q in self.cmd_qs:
            q.put("exit")
        results = [self.rank0.finish()] + [m[2:] for m in self._collect("result")]
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


def _worker_main():
    """Entry point of a worker process (see the module docstring for the protocol)."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything printed by torch or user code goes to stderr
    sys.stdout = sys.stderr

    def emit(msg):
        proto.write("@@" + json.dumps(msg) + "\n")
        proto.flush()

    group = None
    try:
        cfg = json.loads(sys.stdin.readline())
        import torch
        torch.manual_seed(cfg["settings"]["seed"])
        mode = cfg["mode"]
        t0 = time.perf_counter()
        if mode == "torch-ddp":
            group = _DDPGroup(cfg, emit)
            warm, baseline, threads = group.warmup, group.baseline, group.threads
        else:
            torch.set_num_threads(cfg["settings"]["torch_threads"] or _cores())
            baseline = _rss_mb()
            trainer = {"seq": _SeqTrainer, "ssaexec": _ParallelTrainer,
                       "torch-eager": _EagerTrainer,
                       "ssaexec-from-torch": lambda c: _ParallelTrainer(c, from_torch=True)
                       }[mode](cfg)
            warm = []
            for _ in range(cfg["warmup"]):
                warm.append(trainer.step())
                emit({"event": "step"})
            trainer.sync()
            threads = torch.get_num_threads()
        emit({"event": "ready", "setup_s": time.perf_counter() - t0, "warmup_losses": warm,
              "baseline_rss_mb": baseline, "torch_threads": threads})
        for line in sys.stdin:
            cmd = line.strip()
            if cmd == "exit":
                break
            if group is not None:
                seconds, step_s, losses, cpu = group.window()
            else:
                step_s, losses = [], []
                trainer.sync()
                cpu0, start = time.process_time(), time.perf_counter()
                for _ in range(cfg["steps"]):
                    t = time.perf_counter()
                    losses.append(trainer.step())
                    trainer.sync()
                    step_s.append(time.perf_counter() - t)
                    emit({"event": "step"})
                seconds = time.perf_counter() - start
                cpu = time.process_time() - cpu0
            emit({"event": "window", "seconds": seconds, "step_seconds": step_s,
                  "losses": losses, "cpu_seconds": cpu})
        if group is not None:
            res = group.finish()
        else:
            res = {"peak_rss_mb": _peak_rss_mb(), "peak_rss_mb_per_process": [_peak_rss_mb()],
                   "peak_cuda_mb": trainer.cuda_peak_mb()}
            trainer.close()
        emit(dict(res, event="result"))
    except BaseException:  # noqa: B036 - the parent must hear about every failure
        if group is not None:
            group.kill()
        emit({"event": "error", "message": traceback.format_exc()})
        sys.exit(1)


# --- parent side ---------------------------------------------------------------------------

class _WorkerProcess:
    """The parent's handle on one worker process."""

    def __init__(self, cfg, log_dir, on_step):
        self.cfg = cfg
        self.on_step = on_step
        self.log_path = Path(log_dir) / f"{cfg['mode']}-{cfg['places']}.log"
        self.log = open(self.log_path, "w")
        env = dict(os.environ)
        root = str(_repo_root())
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH")
                                    else "")
        if cfg.get("nproc"):
            # ssaexec under torchrun: rank 0 of ssaexec.dist_bench speaks the same protocol
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   "--nproc-per-node", str(cfg["nproc"]), "-m", "ssaexec.dist_bench"]
        else:
            cmd = [sys.executable, "-c", "import ssaexec.benchmark as b; b._worker_main()"]
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True,
            bufsize=1, env=env, cwd=root)
        self.send(json.dumps(cfg))

    def send(self, line):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def wait_for(self, event):
        for line in self.proc.stdout:
            if not line.startswith("@@"):
                continue
            msg = json.loads(line[2:])
            if msg["event"] == "step":
                self.on_step(self.cfg)
            elif msg["event"] == "error":
                raise _WorkerError(msg["message"])
            elif msg["event"] == event:
                return msg
        self.proc.wait()
        raise _WorkerError(f"worker exited with code {self.proc.returncode} before "
                           f"'{event}':\n{self.log_tail()}")

    def log_tail(self, n=30):
        self.log.flush()
        try:
            return "\n".join(self.log_path.read_text().splitlines()[-n:])
        except OSError:
            return ""

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


class _WorkerError(RuntimeError):
    pass


def machine_description():
    """A dict describing this machine (CPU model, cores, memory, GPUs, versions, load)."""
    import torch
    cpu = platform.processor() or platform.machine()
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                cpu = line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    mem = None
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        pass
    gpus = []
    if torch.cuda.is_available():
        gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    commit = None
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, cwd=_repo_root(), timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        pass
    return {"cpu": cpu, "cores": _cores(), "memory_gib": round(mem, 1) if mem else None,
            "gpus": gpus, "platform": platform.platform(), "python": platform.python_version(),
            "torch": torch.__version__, "torch_threads_default": torch.get_num_threads(),
            "git_commit": commit, "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
            "loadavg_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}


def add_arguments(ap):
    """Add the benchmark's options to ``ap`` (used by ``ssaexec bench``)."""
    ap.add_argument("--preset", choices=sorted(PRESETS), default=None,
                    help="settings to start from (default: 'default'); options override them")
    ap.add_argument("--quick", action="store_true", help="same as --preset quick (make demo)")
    ap.add_argument("--nproc", type=int, default=None,
                    help="also run ssaexec under torchrun with this many processes (mode "
                         "ssaexec-nproc; places are divided among them)")
    ap.add_argument("--model", help="mlp, transformer (imported with from_torch; preset "
                                    "'transformer' unless one is given), resnet18/34/50/101/152 "
                                    "or resnext50/101/152")
    ap.add_argument("--image-size", type=int, help="32 (CIFAR stem) or e.g. 224 (ImageNet stem)")
    ap.add_argument("--base", type=int, help="ResNet width of the first stage (64 standard)")
    ap.add_argument("--cardinality", type=int, help="ResNeXt groups (default 32)")
    ap.add_argument("--width", type=int, help="ResNeXt group width (default 4)")
    ap.add_argument("--classes", type=int)
    ap.add_argument("--in-dim", type=int, help="MLP input features")
    ap.add_argument("--hidden", help="MLP hidden sizes, e.g. 128,64")
    ap.add_argument("--d-model", type=int, help="transformer width (default 32)")
    ap.add_argument("--heads", type=int, help="transformer attention heads (default 2)")
    ap.add_argument("--layers", type=int, help="transformer encoder layers (default 2)")
    ap.add_argument("--seq-len", type=int, help="transformer sequence length (default 16)")
    ap.add_argument("--batch-per-place", "-b", type=int)
    ap.add_argument("--warmup", type=int, help="untimed steps per worker")
    ap.add_argument("--steps", type=int, help="timed steps per window")
    ap.add_argument("--repeats", type=int, help="timed windows per (mode, places)")
    ap.add_argument("--optimizer", choices=["sgd", "momentum", "nesterov", "adam", "adamw"])
    ap.add_argument("--lr", type=float)
    ap.add_argument("--seed", type=int)
    ap.add_argument("--torch-threads", type=int,
                    help="torch threads of a one-process mode, at most (default: every core; "
                         "1 with the transformer preset); several places or DDP processes "
                         "share the cores")
    ap.add_argument("--places", default=None,
                    help="cpu:N, cuda, cuda:0,1 or N (default: every GPU, else cpu:<cores>)")
    ap.add_argument("--place-counts", default=None,
                    help="comma list of place counts to measure (default 1..N)")
    ap.add_argument("--modes", default=None,
                    help=f"comma list from {', '.join(MODES)} (default: "
                         f"{','.join(DEFAULT_MODES)})")
    ap.add_argument("--from-torch", action="store_true",
                    help="also build the program with se.from_torch from the torch twin "
                         "(mode ssaexec-from-torch)")
    ap.add_argument("--out-dir", default=None, help="where the JSON and PNG go (default out/bench)")
    ap.add_argument("--json", default=None, help="JSON path (default <out-dir>/<tag>.json)")
    ap.add_argument("--plot", default=None, help="PNG path (default <out-dir>/<tag>.png); "
                                                 "'none' skips the plot")
    ap.add_argument("--tag", default=None, help="file name stem (default from model and size)")
    ap.add_argument("--interleave", dest="interleave", action="store_true", default=None,
                    help="alternate timed windows between modes (default on CPU)")
    ap.add_argument("--no-interleave", dest="interleave", action="store_false",
                    help="run each mode to the end before the next (default on GPUs)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    return ap


def _settings(args):
    preset = args.preset or ("quick" if args.quick else
                             "transformer" if args.model == "transformer" else "default")
    s = dict(_DEFAULTS)
    s.update(PRESETS[preset])
    for k in _DEFAULTS:
        v = getattr(args, k, None)
        if v is not None:
            s[k] = v
    s["preset"] = preset
    for k in ("batch_per_place", "warmup", "steps", "repeats"):
        if s[k] < (0 if k == "warmup" else 1):
            raise SystemExit(f"--{k.replace('_', '-')} must be positive, got {s[k]}")
    _model_kwargs(s)  # validates the model name
    return s


def _plan(args, s):
    import torch
    import ssaexec as se
    if args.places is None:
        places = se.cuda_places() or se.cpu_places()
    else:
        places = se.parse_places(args.places)
    device = "cuda" if places[0].is_cuda else "cpu"
    if device == "cuda" and any(p.device_index != i for i, p in enumerate(places)):
        raise SystemExit("the benchmark uses CUDA devices 0..N-1; restrict them with "
                         "CUDA_VISIBLE_DEVICES instead of --places cuda:<ids>")
    n = len(places)
    counts = (sorted({int(c) for c in args.place_counts.split(",")}) if args.place_counts
              else list(range(1, n + 1)))
    if counts[0] < 1 or counts[-1] > max(n, 1):
        raise SystemExit(f"--place-counts must lie in 1..{n}")
    modes = list(DEFAULT_MODES) if args.modes is None else \
        [m.strip() for m in args.modes.split(",") if m.strip()]
    if args.from_torch and "ssaexec-from-torch" not in modes:
        modes.append("ssaexec-from-torch")
    if args.nproc and "ssaexec-nproc" not in modes:
        modes.append("ssaexec-nproc")
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise SystemExit(f"unknown mode {bad[0]!r}; choose from {', '.join(MODES)}")
    if "ssaexec-from-torch" in modes:
        try:
            from .frontends.torch import from_torch  # noqa: F401
        except ImportError as e:
            raise SystemExit(f"--from-torch needs ssaexec.frontends.torch.from_torch, which "
                             f"could not be imported ({e})") from None
    if device == "cuda" and torch.cuda.device_count() < counts[-1]:
        raise SystemExit(f"{counts[-1]} places need {counts[-1]} GPUs")
    configs = []
    for mode in modes:
        for p in ([1] if mode in ("seq", "torch-eager") else counts):
            cfg = {"mode": mode, "places": p, "device": device, "settings": s,
                   "warmup": s["warmup"], "steps": s["steps"]}
            if mode == "ssaexec-nproc":
                nproc = args.nproc or 2
                if p % nproc:
                    continue  # the places are divided among the processes
                cfg["nproc"] = nproc
            configs.append(cfg)
    return configs, device, counts


def _summarise(run, s):
    gb = run["global_batch"]
    ips = [s["steps"] * gb / w["seconds"] for w in run["windows"]]
    run["images_per_sec"] = ips
    run["images_per_sec_median"] = statistics.median(ips) if ips else None
    # CPU time of the process(es) per image: what contention on a shared machine does not
    # change much, so it tells framework overhead from lack of cores
    run["cpu_ms_per_image"] = statistics.median(
        1e3 * w["cpu_seconds"] / (s["steps"] * gb) for w in run["windows"]) if ips else None
    # cores kept busy (CPU seconds / wall seconds): well under the cores this mode can use
    # means other processes took the CPU during that window
    run["cores_busy"] = [w["cpu_seconds"] / w["seconds"] for w in run["windows"]]
    losses = list(run["warmup_losses"]) + [v for w in run["windows"] for v in w["losses"]]
    run["losses"] = losses
    run["trained"] = bool(losses) and all(math.isfinite(v) for v in losses) and \
        (len(losses) < 2 or losses[-1] < losses[0])


def _compare(runs, counts):
    by = {(r["mode"], r["places"]): r for r in runs if r.get("error") is None}
    n = counts[-1]
    out = []
    for name, num, den, what, op, threshold in TARGETS:
        a = by.get((num[0], n if num[1] == "N" else num[1]))
        b = by.get((den[0], n if den[1] == "N" else den[1]))
        if a is None or b is None or (a is b) or (num[1] == "N" and n == 1):
            continue
        if what == "ips":
            ratio = a["images_per_sec_median"] / b["images_per_sec_median"]
            # windows were interleaved round by round: paired ratios cancel shared load
            pairs = [x / y for x, y in zip(a["images_per_sec"], b["images_per_sec"])]
            paired = statistics.median(pairs) if pairs else None
        else:
            key = "peak_cuda_mb" if a.get("peak_cuda_mb") is not None else "peak_rss_mb"
            ratio = a[key] / b[key]
            paired = None
        met = ratio >= threshold if op == ">=" else ratio <= threshold
        out.append({"name": name.replace("N", str(n)), "ratio": ratio, "paired_ratio": paired,
                    "target": f"{op} {threshold}", "met": met})
    return out


def _table(runs, device):
    mem = "peak GPU MiB" if device == "cuda" else "peak RSS MiB"
    head = (f"{'mode':<20} {'places':>6} {'batch/place':>11} {'images/sec':>11} "
            f"{'(min-max)':>15} {'speedup':>8} {'efficiency':>10} {mem:>13} "
            f"{'CPU ms/img':>10} {'cores busy':>10}")
    lines = [head, "-" * len(head)]
    for r in runs:
        if r.get("error") is not None:
            lines.append(f"{r['mode']:<20} {r['places']:>6} {r['batch_per_place']:>11}   FAILED: "
                         f"{r['error'].strip().splitlines()[-1][:60]}")
            continue
        ips = r["images_per_sec"]
        m = r["peak_cuda_mb"] if device == "cuda" else r["peak_rss_mb"]
        speedup = "-" if r["speedup"] is None else f"{r['speedup']:.2f}x"
        eff = "-" if r["efficiency"] is None else f"{r['efficiency']:.0%}"
        lines.append(f"{r['mode']:<20} {r['places']:>6} {r['batch_per_place']:>11} "
                     f"{r['images_per_sec_median']:>11.1f} "
                     f"{f'({min(ips):.1f}-{max(ips):.1f})':>15} {speedup:>8} {eff:>10} "
                     f"{m if m is not None else float('nan'):>13.0f} "
                     f"{r['cpu_ms_per_image']:>10.1f} {statistics.median(r['cores_busy']):>10.2f}")
    return "\n".join(lines)


def _plot(result, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    s = result["settings"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    modes = []
    for r in result["runs"]:
        if r.get("error") is None and r["mode"] not in modes:
            modes.append(r["mode"])
    markers = {"seq": "s", "ssaexec": "o", "torch-eager": "D", "torch-ddp": "^",
               "ssaexec-from-torch": "v", "ssaexec-nproc": "P"}
    for k, mode in enumerate(modes):
        rs = sorted((r for r in result["runs"] if r["mode"] == mode and r.get("error") is None),
                    key=lambda r: r["places"])
        # a small sideways shift per mode keeps overlapping points and bars readable
        xs = [r["places"] + 0.04 * (k - (len(modes) - 1) / 2) for r in rs]
        ys = [r["images_per_sec_median"] for r in rs]
        lo = [y - min(r["images_per_sec"]) for y, r in zip(ys, rs)]
        hi = [max(r["images_per_sec"]) - y for y, r in zip(ys, rs)]
        ax.errorbar(xs, ys, yerr=[lo, hi], marker=markers.get(mode, "o"), capsize=3,
                    label=mode, linestyle="-" if len(xs) > 1 else "none")
    base = next((r for r in result["runs"] if r["mode"] == "ssaexec" and r["places"] == 1
                 and r.get("error") is None), None)
    counts = sorted({r["places"] for r in result["runs"]})
    if base is not None and len(counts) > 1:
        ax.plot(counts, [base["images_per_sec_median"] * c for c in counts], color="grey",
                linestyle=":", label="ssaexec linear scaling")
    ax.set_xticks(counts)
    ax.set_xlabel("places (CPU places / GPUs; DDP processes)")
    ax.set_ylabel("images / sec (median, min-max bars)")
    m = result["machine"]
    where = ", ".join(m["gpus"]) if m["gpus"] else f"{m['cores']}-core {m['cpu']}"
    size = _size(s)
    ax.set_title(f"{s['model']}{size}, batch {s['batch_per_place']}/place\n{where}",
                 fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(args):
    """Run the benchmark for parsed ``args``; return the result dict (also written as JSON)."""
    from .progress import Progress
    s = _settings(args)
    configs, device, counts = _plan(args, s)
    interleave = args.interleave if args.interleave is not None else device == "cpu"
    machine = machine_description()
    tag = args.tag or (s["model"] if s["model"] in ("mlp", "transformer")
                       else f"{s['model']}_{s['image_size']}")
    out_dir = Path(args.out_dir or "out/bench")
    json_path = Path(args.json) if args.json else out_dir / f"{tag}.json"
    plot_path = None if args.plot == "none" else (Path(args.plot) if args.plot
                                                  else out_dir / f"{tag}.png")
    print(f"ssaexec bench: {s['model']}"
          + _size(s)
          + f", batch {s['batch_per_place']}/place, {s['warmup']} warm-up + {s['repeats']} x "
          f"{s['steps']} timed steps, places {counts}, modes "
          f"{sorted({c['mode'] for c in configs}, key=MODES.index)}; "
          f"{machine['cores']}-core {machine['cpu']}"
          + (f", GPUs {machine['gpus']}" if machine["gpus"] else ""), flush=True)
    total = len(configs) * (s["warmup"] + s["repeats"] * s["steps"])
    runs = []
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ssaexec-bench-") as log_dir, \
            Progress(total, "bench", enabled=not args.no_progress) as bar:
        def on_step(cfg):
            bar.update(1, mode=f"{cfg['mode']}@{cfg['places']}")

        for cfg in configs:
            runs.append({"mode": cfg["mode"], "places": cfg["places"], "device": device,
                         "batch_per_place": s["batch_per_place"],
                         "global_batch": s["batch_per_place"] * cfg["places"],
                         "windows": [], "warmup_losses": [], "error": None})
        alive = {}

        def start(i, w=None):
            w = w or _WorkerProcess(configs[i], log_dir, on_step)
            try:
                ready = w.wait_for("ready")
            except _WorkerError as e:
                _fail(i, w, e)
                return None
            runs[i].update(setup_s=ready["setup_s"], warmup_losses=ready["warmup_losses"],
                           baseline_rss_mb=ready["baseline_rss_mb"],
                           torch_threads=ready["torch_threads"])
            return w

        def _fail(i, w, e):
            runs[i]["error"] = str(e)
            bar.update(0)
            sys.stderr.write(f"\n{configs[i]['mode']} on {configs[i]['places']} place(s) failed:"
                             f"\n{e}\n")
            w.proc.kill()
            w.close()
            alive.pop(i, None)

        def window(i):
            w = alive[i]
            w.send("run")
            try:
                msg = w.wait_for("window")
            except _WorkerError as e:
                _fail(i, w, e)
                return
            runs[i]["windows"].append({"seconds": msg["seconds"],
                                       "step_seconds": msg["step_seconds"],
                                       "losses": msg["losses"],
                                       "cpu_seconds": msg["cpu_seconds"]})

        def finish(i):
            w = alive.pop(i)
            w.send("exit")
            try:
                res = w.wait_for("result")
            except _WorkerError as e:
                alive[i] = w
                _fail(i, w, e)
                return
            runs[i].update(peak_rss_mb=res["peak_rss_mb"],
                           peak_rss_mb_per_process=res["peak_rss_mb_per_process"],
                           peak_cuda_mb=res["peak_cuda_mb"])
            w.close()

        try:
            if interleave:
                # set-up and warm-up are not timed: let the workers do them at once
                launched = [_WorkerProcess(c, log_dir, on_step) for c in configs]
                for i, w in enumerate(launched):
                    if start(i, w) is not None:
                        alive[i] = w
                for r in range(s["repeats"]):
                    order = list(range(len(configs)))
                    k = r % len(order)
                    for i in order[k:] + order[:k]:
                        if i in alive:
                            window(i)
                for i in list(alive):
                    finish(i)
            else:
                for i in range(len(configs)):
                    w = start(i)
                    if w is None:
                        continue
                    alive[i] = w
                    for _ in range(s["repeats"]):
                        if i in alive:
                            window(i)
                    if i in alive:
                        finish(i)
        finally:
            for w in alive.values():
                w.proc.kill()
                w.close()
    for r in runs:
        if r["error"] is None:
            _summarise(r, s)
    for r in runs:
        if r["error"] is None:
            one = next((x for x in runs if x["mode"] == r["mode"] and x["places"] == 1
                        and x["error"] is None), None)
            r["speedup"] = (r["images_per_sec_median"] / one["images_per_sec_median"]
                            if one else None)
            r["efficiency"] = r["speedup"] / r["places"] if r["speedup"] is not None else None
    machine["loadavg_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    result = {"schema": SCHEMA, "machine": machine,
              "settings": dict(s, places=counts, device=device, interleave=interleave,
                               modes=sorted({c["mode"] for c in configs}, key=MODES.index)),
              "runs": runs, "comparisons": _compare(runs, counts),
              "wall_seconds": time.perf_counter() - t_start}
    print()
    print(_table(runs, device))
    if result["comparisons"]:
        print()
        for c in result["comparisons"]:
            paired = (f" (paired per round: {c['paired_ratio']:.2f})"
                      if c["paired_ratio"] is not None else "")
            print(f"{c['name']:<40} {c['ratio']:6.2f}{paired}  target {c['target']}: "
                  f"{'met' if c['met'] else 'MISSED'}")
    not_trained = [f"{r['mode']}@{r['places']}" for r in runs
                   if r["error"] is None and not r["trained"]]
    if not_trained:
        print(f"warning: loss did not fall (or was not finite) in {', '.join(not_trained)}")
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(result, indent=1))
    print(f"\nraw timings: {json_path}")
    if plot_path is not None:
        try:
            _plot(result, plot_path)
            print(f"plot: {plot_path}")
        except ImportError:
            print("plot skipped: matplotlib is not installed (pip install ssaexec[plot])")
    print(f"load average {machine['loadavg_start']} -> {machine['loadavg_end']}; "
          f"{result['wall_seconds']:.0f} s")
    return result


def main(argv=None):
    """``ssaexec bench`` / ``bench/images_per_sec.py``; returns the exit status."""
    ap = add_arguments(argparse.ArgumentParser(
        prog="ssaexec bench", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter))
    args = ap.parse_args(argv)
    result = run(args)
    return 1 if any(r["error"] is not None for r in result["runs"]) else 0


if __name__ == "__main__":
    sys.exit(main())
