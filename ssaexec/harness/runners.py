"""One trainer per in-process peer, and how a trainer is timed.

A trainer is one mode's training loop inside a worker process: ``step()``
trains one batch and returns its loss. The peers:

* ``SeqTrainer`` (``seq``): the sequential ``Executor`` on one place;
* ``ParallelTrainer`` (``ssaexec``): ``ParallelExecutor`` over the places, or
  over this process's share of them under torchrun (``ssaexec-nproc``), as users get it:
  ``ExecutionStrategy``'s default compiler (``DEFAULT_COMPILER``; under the tiered
  ``compiler="auto"``, ``runtime.tiered``, its warm-up goes on until the runner has switched
  to the compiled segments, ``settle``, so the timed windows are the steady state: its
  losses then come after more steps than the other modes');
* ``StraightTrainer`` (``ssaexec-none``): the same with ``compiler=None``, the
  straight-line compiled path only;
* ``FromTorchTrainer`` (``ssaexec-from-torch``): ``ParallelExecutor`` running the
  twin converted by ``from_torch``;
* ``EagerTrainer`` (``torch-eager``): the ``torch.nn`` twin in a plain loop (under
  ``torch.autocast`` with ``--amp``);
* ``CompileTrainer`` (``torch-compile``): the same loop with the twin compiled by
  ``torch.compile`` (default mode on CPU, ``reduce-overhead`` on GPUs, which uses CUDA
  graphs); the first step, which compiles, is timed apart (``compile_s``) and is not
  part of the warm-up or the timed windows.

(``torch-ddp`` runs one process per place: ``ssaexec.harness.ddp``.)

Timing policy: ``warm_up`` runs untimed steps; ``window`` runs ``steps`` timed
steps and returns (seconds, step seconds, losses, CPU seconds of this
process). ``ends`` keeps the ``perf_counter`` time at the end of every untimed step
(those the constructor ran to compile included), from which the worker reports the
time to step N (``harness.time_to_steps``). On CUDA every step is synchronised
before its time is taken, so a
step's time is its device time too. Memory: ``rss_mb`` (now) and
``peak_rss_mb`` (``ru_maxrss``) of this process; ``cuda_peak_mb`` of a trainer
is ``torch.cuda.max_memory_allocated`` of its largest place.
"""

import resource
import sys
import time

from ..core.host_allocator import keep_freed_memory
from ..runtime.places_rule import PROBE, REPROBE_FIRST
from ..runtime.tiered import DEFER_SAY
from .time_to_steps import SETTLE_S, places_settled, tier_report

from .workloads import (
    IMPORTED, build_program, from_torch_program, initial_twin, load_twins, place_samples,
    torch_optimizer
)

__all__ = ["Trainer", "SeqTrainer", "ParallelTrainer", "StraightTrainer", "FromTorchTrainer",
           "InductorTrainer", "EagerTrainer", "CompileTrainer", "TRAINERS", "rss_mb",
           "peak_rss_mb"]


def rss_mb():
    """This process's resident memory now, MiB (None where /proc is missing)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def peak_rss_mb():
    """This process's peak resident memory, MiB."""
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kb / 1024 if sys.platform != "darwin" else kb / 2**20


class Trainer:
    """One mode's training loop: ``step()`` trains one batch and returns its loss."""

    device = "cpu"
    compile_s = None  # seconds its compile took (blocking, or in the background)
    compile_blocks = True  # whether the steps waited for that compile

    def step(self):
        raise NotImplementedError

    def counted_step(self):
        """``step()``, its end time kept in ``ends`` (the untimed steps: time to step N)."""
        loss = self.step()
        self.sync()
        self.__dict__.setdefault("ends", []).append(time.perf_counter())
        return loss

    def sync(self):
        if self.device != "cpu":
            import torch
            torch.cuda.synchronize()

    def warm_up(self, n, on_step):
        """``n`` untimed steps (``on_step()`` after each); their losses."""
        losses = []
        for _ in range(n):
            losses.append(self.counted_step())
            on_step()
        return losses

    def window(self, steps, on_step):
        """``steps`` timed steps: (seconds, step seconds, losses, CPU seconds)."""
        self.sync()
        step_s, losses = [], []
        cpu0, start = time.process_time(), time.perf_counter()
        for _ in range(steps):
            t = time.perf_counter()
            losses.append(self.step())
            self.sync()
            step_s.append(time.perf_counter() - t)
            on_step()
        return time.perf_counter() - start, step_s, losses, time.process_time() - cpu0

    def cuda_peak_mb(self):
        return None

    def close(self):
        pass

    def finish(self):
        """Close the trainer: the ``result`` fields (peak memory of this process)."""
        res = {"peak_rss_mb": peak_rss_mb(), "peak_rss_mb_per_process": [peak_rss_mb()],
               "peak_cuda_mb": self.cuda_peak_mb()}
        self.close()
        return res


class SeqTrainer(Trainer):
    """``seq``: the sequential ``Executor`` on one place."""

    def __init__(self, cfg):
        import ssaexec as se
        s = cfg["settings"]
        self.device = cfg["device"]
        place = se.CUDAPlace(0) if self.device == "cuda" else se.CPUPlace()
        self.main, startup, self.loss = build_program(s)
        self.scope = se.Scope()
        self.exe = se.Executor(place)
        self.exe.run(startup, scope=self.scope)
        x, y = place_samples(s, 1)
        self.feed = {"img": x.to(place.device), "label": y.to(place.device)}

    def step(self):
        loss, = self.exe.run(self.main, feed=self.feed, fetch_list=[self.loss], scope=self.scope)
        return float(loss)

    def cuda_peak_mb(self):
        import torch
        return torch.cuda.max_memory_allocated(0) / 2**20 if self.device == "cuda" else None


class ParallelTrainer(Trainer):
    """``ssaexec``: ``ParallelExecutor`` over ``places`` (default: the config's first
    ``places`` CPU places or GPUs); ``first_place`` is the index of the first of them
    among all places (under torchrun, this process's share), which picks its samples."""

    compiler = "default"  # ExecutionStrategy(compiler=...): the library's default

    def __init__(self, cfg, places=None, first_place=0):
        import ssaexec as se
        s = self.settings = cfg["settings"]
        self.device = cfg["device"]
        n = cfg["places"]
        self.places = places or self.places_of(cfg)
        x, y = place_samples(s, n, first_place, len(self.places))
        main, startup, self.loss, names = self.program(s, x, y)
        strategy = se.ExecutionStrategy(amp=s.get("amp"), cuda_graph=bool(s.get("cuda_graph")),
                                        compiler=self.compiler)
        self.pe = se.ParallelExecutor(self.places, main, startup, self.loss,
                                      exec_strategy=strategy, scope=se.Scope())
        self.feed = {names[0]: x, names[1]: y}

    @staticmethod
    def places_of(cfg):
        """The config's places: on the GPUs of ``cuda_devices`` where it names them (several
        places may share one, ``--places cuda:0,0``), else the first ``places`` GPUs or
        CPU places."""
        import ssaexec as se
        n = cfg["places"]
        if cfg.get("cuda_devices"):
            return [se.CUDAPlace(i, d) for i, d in enumerate(cfg["cuda_devices"][:n])]
        return se.cuda_places()[:n] if cfg["device"] == "cuda" else se.cpu_places(n)

    def program(self, s, x, y):
        """``(main, startup, loss, feed names)`` to train."""
        return (*build_program(s), ("img", "label"))

    def step(self):
        loss, = self.pe.run([self.loss], feed=self.feed)
        return float(loss)

    def warm_up(self, n, on_step):
        """``n`` untimed steps, then more (not counted by ``on_step``) until a tiered
        runner has switched to its compiled segments, and its places run the way the
        places rule keeps on that tier (``places_settled``: the probe after the switch runs
        on the compiled tier's first steps, warm-up, and the one ``REPROBE_FIRST`` steps
        later decides), at most ``settle_s`` seconds (the settings', default ``SETTLE_S``):
        the timed windows measure the steady state. ``tiers`` then says how
        (``tier_report``)."""
        losses = super().warm_up(n, on_step)
        if not losses:
            self.counted_step()  # the runner exists from the first step on
        start = time.perf_counter()
        settle_s = self.settings.get("settle_s", SETTLE_S)
        tiers = tier_report(self.pe)
        # (not for a compile deferred, the cores busy: it may never start)
        while tiers is not None and tiers.get("switch_step") is None and \
                tiers["deferred"] < DEFER_SAY and time.perf_counter() - start < settle_s:
            self.counted_step()
            tiers = tier_report(self.pe)
        if tiers is not None:  # a tiered runner: its places' way on the tier it runs
            for _ in range(REPROBE_FIRST + 2 * len(PROBE) + 2):
                if places_settled(self.pe) or time.perf_counter() - start >= settle_s:
                    break
                self.counted_step()
        self.tiers = tiers
        if tiers is not None:  # the compile ran in the background: no step waited for it
            self.compile_s, self.compile_blocks = tiers.get("compile_s"), False
        return losses

    def cuda_peak_mb(self):
        import torch
        if self.device != "cuda":
            return None
        return max(torch.cuda.max_memory_allocated(p.device) for p in self.places) / 2**20

    def close(self):
        self.pe.close()


class StraightTrainer(ParallelTrainer):
    """``ssaexec-none``: ``ParallelTrainer`` with ``compiler=None`` (no compile)."""

    compiler = None


class FromTorchTrainer(ParallelTrainer):
    """``ssaexec-from-torch``: the twin, converted by ``from_torch``, on ``ParallelExecutor``."""

    def program(self, s, x, y):
        return from_torch_program(s, x, y)


class InductorTrainer(FromTorchTrainer):
    """``ssaexec-inductor``: as ``ssaexec-from-torch``, each segment compiled by Inductor
    (``ExecutionStrategy(compiler="inductor")``); its first two steps (record, compile)
    are timed apart (``compile_s``), before the warm-up."""

    compiler = "inductor"

    def program(self, s, x, y):
        # a torch-only model (transformer, hf-*) is imported as the ssaexec mode imports it
        # (its loss inside, the builder's feed names); the others as ssaexec-from-torch
        if s["model"] in IMPORTED:
            return ParallelTrainer.program(self, s, x, y)
        return super().program(s, x, y)

    def __init__(self, cfg, places=None, first_place=0):
        super().__init__(cfg, places, first_place)
        t0 = time.perf_counter()
        self.counted_step()
        self.counted_step()
        self.compile_s = time.perf_counter() - t0


class EagerTrainer(Trainer):
    """``torch-eager``: the ``torch.nn`` twin in a plain training loop on one place
    (place ``rank`` of the config's places: ``ssaexec.harness.ddp`` wraps the twin)."""

    def __init__(self, cfg, rank=0):
        import torch
        s = cfg["settings"]
        self.device = cfg["device"]
        self.dev = torch.device("cuda", rank) if self.device == "cuda" else torch.device("cpu")
        if self.device == "cpu":
            # the peers' processes get the allocator setting ssaexec's get, so that the
            # comparison is of the training loops, not of malloc's (core.host_allocator)
            keep_freed_memory()
        model = initial_twin(s)
        model.to(self.dev).train()
        self.model = self.wrap(model)
        self.opt = torch_optimizer(s["optimizer"], self.model.parameters(), s["lr"])
        x, y = place_samples(s, cfg["places"], rank)
        self.x, self.y = x.to(self.dev), y.to(self.dev)
        self.loss_fn = load_twins().loss_fn
        amp = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(s.get("amp"))
        self.autocast = (lambda: torch.autocast(self.dev.type, dtype=amp)) if amp else None
        self.scaler = torch.amp.GradScaler(self.dev.type) if s.get("amp") == "fp16" else None

    def wrap(self, model):
        """The module to train (the twin itself)."""
        return model

    def step(self):
        import contextlib
        self.opt.zero_grad(set_to_none=True)
        with self.autocast() if self.autocast else contextlib.nullcontext():
            loss = self.loss_fn(self.model(self.x), self.y)
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.step(self.opt)
            self.scaler.update()
        else:
            loss.backward()
            self.opt.step()
        return loss.item()

    def cuda_peak_mb(self):
        import torch
        return torch.cuda.max_memory_allocated(self.dev) / 2**20 if self.device == "cuda" \
            else None


class CompileTrainer(EagerTrainer):
    """``torch-compile``: the twin compiled by ``torch.compile``; ``compile_s`` is the
    first step's time (compilation), taken before the warm-up."""

    def __init__(self, cfg, rank=0):
        super().__init__(cfg, rank)
        t0 = time.perf_counter()
        self.counted_step()
        self.compile_s = time.perf_counter() - t0

    def wrap(self, model):
        import torch
        return torch.compile(model, mode="reduce-overhead" if self.device == "cuda" else None)


# mode -> trainer class, for the modes that run in one process
TRAINERS = {"seq": SeqTrainer, "ssaexec": ParallelTrainer, "ssaexec-none": StraightTrainer,
            "torch-eager": EagerTrainer,
            "torch-compile": CompileTrainer, "ssaexec-from-torch": FromTorchTrainer,
            "ssaexec-inductor": InductorTrainer}
