"""Sharded data parallelism, ours against torch's: one side = one group of processes.

``bench/zero_vs_fsdp.py`` (issue 49, acceptance 3) and ``bench/zero_memory.py`` use it.
A *side* is one way to train the same model on the same batch with ``world`` gloo
processes:

* ``fsdp2``: the twin under PyTorch FSDP2, ``torch.distributed.fsdp.fully_shard`` on
  every encoder layer and then on the root (per-layer, as FSDP2 is meant to be used),
  ``reshard_after_forward`` as it comes (None: True for the layers, False for the root),
  ``torch.optim.AdamW`` on the DTensor shards (its default implementation on CPU);
* ``ddp-zero1``: the twin under ``DistributedDataParallel`` with
  ``ZeroRedundancyOptimizer`` (the stage-1 peer);
* ``ddp``: plain DDP (the unsharded reference);
* ``ssaexec-zeroK`` (K = 0..3) and ``ssaexec-zeroK-inductor``: the twin imported with
  ``from_torch``, run by ``ParallelExecutor`` on one CPU place per process with
  ``BuildStrategy(zero_stage=K)`` and ``ExecutionStrategy(compiler=None | "inductor")``.

Same work. Every side starts from the twin's seeded weights (``workloads.initial_twin``),
rank ``r`` trains samples ``place_samples(s, world, r)``, and the optimizer is AdamW
with weight decay ``WEIGHT_DECAY`` on both sides (ssaexec's AdamW default, passed to
torch explicitly). Each process gets ``threads`` torch threads.

Processes. Every rank of a side is spawned (``torch.multiprocessing``, ``spawn``), so the
process that drives the benchmark holds no model and each rank's memory is its own; the
ranks meet on 127.0.0.1 at a free port over gloo, then follow the driver's commands
through queues (``window``: a barrier, then timed steps; ``exit``: report memory). A rank
that fails sends its traceback and the side is reported failed; the others go on.

Memory, per process, the same measure for every side (Linux ``/proc``):

* ``baseline_rss_mb``: resident memory after the imports (torch, dynamo, FSDP, ssaexec
  and its torch frontend: what any side imports, imported by every side) and the process
  group, before the model;
* ``step_peak_rss_mb``: the peak resident memory from the end of set-up (compilation
  included in set-up) to the end of the run: the peak is reset by writing 5 to
  ``/proc/self/clear_refs`` (``VmHWM``); where that is refused, ``ru_maxrss``. Before
  the baseline and before the reset, ``gc.collect()`` and glibc's ``malloc_trim(0)``
  hand back what was freed, so both count live memory, not the heap set-up left behind;
* ``after_setup_rss_mb``: resident memory at that reset (the model built, the program
  imported, compiled where the side compiles): ``step_peak_rss_mb`` minus it is what
  the steps themselves added;
* ``peak_rss_mb``: ``ru_maxrss``, the whole life (set-up included);
* ``state_mb``: the bytes of the tensors the side holds between steps (parameters,
  gradients, optimizer state, each storage once): FSDP2's local shards and its
  optimizer's state; ssaexec's place scope and the executor's scope (``pe.scope``,
  where the startup program ran);
* ssaexec sides only (torch has no such count on CPU): ``tensor_peak_model_mb`` and
  ``tensor_peak_total_mb``, the place's peak tensor bytes over one more, observed step
  (``place_memory``: params + grads + optimizer + gathered; and with the activations),
  taken after the other figures.

``training_mb`` = ``step_peak_rss_mb - baseline_rss_mb`` is the figure compared.
"""

import argparse
import datetime
import os
import queue
import re
import socket
import statistics
import time
import traceback

from .runners import peak_rss_mb, rss_mb
from .workloads import initial_twin, load_twins, place_samples, synthetic_batch

__all__ = ["CONFIGS", "WEIGHT_DECAY", "SIDES", "config_settings", "parse_side",
           "ssaexec_program", "param_count", "layer_groups", "free_port", "SideError",
           "SideGroup"]

WEIGHT_DECAY = 0.01  # ssaexec.program.optimizer.AdamW's default, given to torch's too
TIMEOUT_S = 900  # a collective's limit: a rank that dies must not hang the others for long

# model configs: overrides of the harness's ``transformer`` preset (--preset transformer)
CONFIGS = {
    # the preset as it is (d_model 32, 2 layers, seq 16, 4 samples a process), with AdamW
    "transformer": dict(optimizer="adamw", lr=1e-3),
    # >= 50 MB of parameters: 6 layers of d_model 512 (18.9 M parameters, 75.7 MB fp32)
    "big": dict(optimizer="adamw", lr=1e-3, d_model=512, heads=8, layers=6, seq_len=64,
                batch_per_place=4, warmup=2, steps=4, repeats=5),
    # the tests': seconds
    "tiny": dict(optimizer="adamw", lr=1e-3, d_model=16, heads=2, layers=2, seq_len=8,
                 batch_per_place=2, warmup=1, steps=2, repeats=1),
}

SIDES = ("fsdp2", "ddp-zero1", "ddp", "ssaexec-zero0", "ssaexec-zero1", "ssaexec-zero2",
         "ssaexec-zero3", "ssaexec-zero0-inductor", "ssaexec-zero1-inductor",
         "ssaexec-zero2-inductor", "ssaexec-zero3-inductor")
_SSAEXEC_SIDE = re.compile(r"^ssaexec-zero([0-3])(-inductor)?$")


def config_settings(name, **overrides):
    """The harness settings dict of config ``name`` (``CONFIGS``), with ``overrides``
    (settings keys; None leaves the config's value)."""
    from .cli import add_arguments, settings
    if name not in CONFIGS:
        raise ValueError(f"unknown config {name!r}: use {', '.join(CONFIGS)}")
    ns = add_arguments(argparse.ArgumentParser()).parse_args(["--preset", "transformer"])
    for k, v in {**CONFIGS[name], **{k: v for k, v in overrides.items()
                                     if v is not None}}.items():
        setattr(ns, k, v)
    s = settings(ns)
    s["config"] = name
    return s


def parse_side(side):
    """``(kind, zero_stage, compiler)`` of a side name: ``("torch", None, None)`` for the
    torch sides, ``("ssaexec", K, None | "inductor")``; ValueError for anything else."""
    if side in ("fsdp2", "ddp-zero1", "ddp"):
        return "torch", None, None
    m = _SSAEXEC_SIDE.match(side)
    if not m:
        raise ValueError(f"unknown side {side!r}: use {', '.join(SIDES)}")
    return "ssaexec", int(m.group(1)), "inductor" if m.group(2) else None


def ssaexec_program(s):
    """``(main, startup, loss)``: the seeded twin imported with ``from_torch``, AdamW with
    ``WEIGHT_DECAY`` (feeds ``img``, ``label``)."""
    from ..frontends.torch import from_torch
    from ..program.example_models import make_optimizer
    x, y = synthetic_batch(s, 2)
    opt = make_optimizer(s["optimizer"], s["lr"],
                         **({"weight_decay": WEIGHT_DECAY} if s["optimizer"] == "adamw" else {}))
    return from_torch(load_twins().WithLoss(initial_twin(s)), {"img": x, "label": y},
                      optimizer=opt, random_seed=s["seed"])


def param_count(s):
    """Parameters of the config's model (elements)."""
    return sum(p.numel() for p in initial_twin(s).parameters())


def layer_groups(program):
    """``[(first reader op type, [param names], bytes)]``: the parameters grouped by the
    first op of the program that reads them (the ZeRO contract's gather unit: a layer's
    weight and bias), in program order."""
    from ..core.dtypes import itemsize
    params = {v.name: v for v in program.all_parameters()}
    seen, groups = set(), []
    for op in program.global_block().ops:
        names = [n for n in op.input_names() if n in params and n not in seen]
        if names:
            seen.update(names)
            size = 0
            for n in names:
                numel = 1
                for d in params[n].shape:
                    numel *= d
                size += numel * itemsize(params[n].dtype)
            groups.append((op.type, names, size))
    return groups


# --- one rank -------------------------------------------------------------------------------

def _status_mb(key):
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def _trim():
    """Hand the heap's free memory back to the system (glibc ``malloc_trim``; elsewhere
    nothing), so that resident memory is what is live, not what set-up freed."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _reset_peak():
    """Reset this process's peak RSS (VmHWM); False where the kernel refuses."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _storage_bytes(tensors):
    """Bytes of the distinct storages of ``tensors`` (DTensors: their local shards)."""
    seen, total = set(), 0
    for t in tensors:
        if t is None:
            continue
        t = t.to_local() if hasattr(t, "to_local") else t
        st = t.untyped_storage()
        if st.data_ptr() not in seen:
            seen.add(st.data_ptr())
            total += st.nbytes()
    return total


class _Rank:
    """One process of a side: the group, this rank's samples, timed windows, memory."""

    def __init__(self, side, rank, world, port, s, threads):
        import gc

        import torch
        import torch.distributed as dist
        # what any side imports, imported by every side before the baseline, so that the
        # baseline holds the code and the figures above it hold the training
        import torch.distributed.fsdp  # noqa: F401
        import ssaexec.frontends.torch  # noqa: F401
        from ssaexec.core import compat
        compat.require("inductor.compile_fx")  # Dynamo and Inductor: from_torch, compilers
        self.side, self.rank, self.world, self.s = side, rank, world, s
        torch.set_num_threads(threads)
        dist.init_process_group("gloo", rank=rank, world_size=world,
                                init_method=f"tcp://127.0.0.1:{port}",
                                timeout=datetime.timedelta(seconds=TIMEOUT_S))
        gc.collect()
        _trim()
        self.baseline = rss_mb()
        torch.manual_seed(s["seed"])
        self.x, self.y = place_samples(s, world, rank)
        t0 = time.perf_counter()
        self.build()
        self.compile_s, self.setup_losses = None, []
        if getattr(self, "compiler", None):  # the first two steps record and compile
            self.setup_losses = [self.step(), self.step()]
            self.compile_s = time.perf_counter() - t0
        self.setup_s = time.perf_counter() - t0
        gc.collect()  # the set-up's garbage (the import's traces) is not the training's
        _trim()
        self.after_setup = rss_mb()
        self.peak_reset = _reset_peak()

    def window(self, steps):
        """A barrier, then ``steps`` timed steps: (step seconds, losses)."""
        import torch.distributed as dist
        dist.barrier()
        times, losses = [], []
        for _ in range(steps):
            t = time.perf_counter()
            losses.append(self.step())
            times.append(time.perf_counter() - t)
        return times, losses

    def memory(self):
        peak = _status_mb("VmHWM") if self.peak_reset else None
        return {"baseline_rss_mb": self.baseline, "after_setup_rss_mb": self.after_setup,
                "peak_rss_mb": peak_rss_mb(),
                "step_peak_rss_mb": peak if peak is not None else peak_rss_mb(),
                "step_peak_measure": "VmHWM since set-up" if peak is not None else "ru_maxrss",
                "state_mb": self.state_bytes() / 2**20}

    def tensor_peaks(self):
        """``{}``, or where the side can count its own tensors over a step, its peaks (MiB)."""
        return {}

    def leave(self):
        import torch.distributed as dist
        self.close()
        dist.destroy_process_group()

    def close(self):
        pass


class _TorchRank(_Rank):
    def build(self):
        import torch
        from torch.distributed.device_mesh import init_device_mesh
        model = load_twins().WithLoss(initial_twin(self.s))
        model.train()
        lr, wd = self.s["lr"], WEIGHT_DECAY
        if self.side == "fsdp2":
            from torch.distributed.fsdp import fully_shard
            mesh = init_device_mesh("cpu", (self.world,))
            for layer in model.model.encoder.layers:
                fully_shard(layer, mesh=mesh)
            fully_shard(model, mesh=mesh)
            self.model = model
            self.opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=wd)
        else:
            self.model = torch.nn.parallel.DistributedDataParallel(model)
            if self.side == "ddp-zero1":
                from torch.distributed.optim import ZeroRedundancyOptimizer
                self.opt = ZeroRedundancyOptimizer(self.model.parameters(),
                                                   optimizer_class=torch.optim.AdamW,
                                                   lr=lr, weight_decay=wd)
            else:
                self.opt = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=wd)

    def step(self):
        self.opt.zero_grad(set_to_none=True)
        loss = self.model(self.x, self.y)
        loss.backward()
        self.opt.step()
        return loss.item()

    def state_bytes(self):
        params = list(self.model.parameters())
        opt = getattr(self.opt, "optim", self.opt)  # ZeroRedundancyOptimizer: its local one
        state = [v for st in opt.state.values() for v in st.values()
                 if hasattr(v, "untyped_storage")]
        return _storage_bytes(params + [p.grad for p in params] + state)


class _SSAExecRank(_Rank):
    def build(self):
        import ssaexec as se
        _, stage, self.compiler = parse_side(self.side)
        # the side names its compiler: "none" rather than None, which SSAEXEC_COMPILER
        # would replace
        self.main, startup, self.loss = ssaexec_program(self.s)
        self.pe = se.ParallelExecutor(
            se.cpu_places(1), self.main, startup, self.loss,
            build_strategy=se.BuildStrategy(zero_stage=stage),
            exec_strategy=se.ExecutionStrategy(compiler=self.compiler or "none"),
            scope=se.Scope())
        if not self.pe.distributed:
            raise RuntimeError(f"{self.side}: the executor did not join the process group")
        self.feed = {"img": self.x, "label": self.y}

    def step(self):
        loss, = self.pe.run([self.loss], feed=self.feed)
        return float(loss)

    def state_bytes(self):
        # the place's scope and the executor's own (which the startup program ran in):
        # what the process holds, whichever scope holds it
        return _storage_bytes(list(self.pe.local_scopes[0].vars.values()) +
                              list(self.pe.scope.vars.values()))

    def tensor_peaks(self):
        """One more step, observed: the place's peak tensor bytes (``place_memory``)."""
        from .place_memory import measure_step
        place, = measure_step(self.pe, self.main, [self.loss], feed=self.feed)["places"]
        return {"tensor_peak_model_mb": place["peak_model"] / 2**20,
                "tensor_peak_total_mb": place["peak_total"] / 2**20}

    def close(self):
        self.pe.close()


def _serve_rank(side, rank, world, port, s, threads, cmd_q, res_q):
    """A spawned rank: build, warm up, then windows on command until ``exit``."""
    try:
        cls = _TorchRank if parse_side(side)[0] == "torch" else _SSAExecRank
        r = cls(side, rank, world, port, s, threads)
        # the compiling steps' losses first: every side's list starts at step 1
        warm = r.setup_losses + [r.step() for _ in range(s["warmup"])]
        res_q.put(("ready", rank, {"setup_s": r.setup_s, "compile_s": r.compile_s,
                                   "warmup_losses": warm}))
        while True:
            cmd = cmd_q.get()
            if cmd[0] != "window":
                break
            res_q.put(("window", rank, r.window(cmd[1])))
        mem = r.memory()  # before the observed step, which is not a timed one
        mem.update(r.tensor_peaks())
        r.leave()
        res_q.put(("result", rank, mem))
    except BaseException:  # noqa: B036 - the driver must hear about every failure
        res_q.put(("error", rank, traceback.format_exc()))
        raise SystemExit(1) from None


# --- the driver's handle on a side ----------------------------------------------------------

class SideError(RuntimeError):
    """A rank of a side failed (its traceback is the message) or died."""


def free_port():
    """A free TCP port on 127.0.0.1 (for a group's rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class SideGroup:
    """``world`` spawned ranks of ``side`` training config ``s``; built, they have warmed up
    (``ready``: per rank ``setup_s``, ``compile_s``, ``warmup_losses``)."""

    def __init__(self, side, s, world=2, threads=1, timeout=TIMEOUT_S):
        import torch.multiprocessing as mp
        parse_side(side)
        self.side, self.world, self.timeout = side, world, timeout
        ctx = mp.get_context("spawn")
        self.res_q = ctx.Queue()
        self.cmd_qs = [ctx.Queue() for _ in range(world)]
        port = free_port()
        self.procs = []
        env = os.environ.get("PYTHONWARNINGS")
        os.environ["PYTHONWARNINGS"] = "ignore"  # FSDP2's view warning, once a rank a step
        try:
            for r in range(world):
                p = ctx.Process(target=_serve_rank, args=(side, r, world, port, s, threads,
                                                          self.cmd_qs[r], self.res_q),
                                daemon=True)
                p.start()
                self.procs.append(p)
        finally:
            if env is None:
                os.environ.pop("PYTHONWARNINGS", None)
            else:
                os.environ["PYTHONWARNINGS"] = env
        try:
            self.ready = self._collect("ready")
        except BaseException:
            self.kill()
            raise

    def _collect(self, kind):
        got, deadline = {}, time.monotonic() + self.timeout
        while len(got) < self.world:
            try:
                msg = self.res_q.get(timeout=1.0)
            except queue.Empty:
                if time.monotonic() > deadline:
                    raise SideError(f"{self.side}: no '{kind}' from every rank in "
                                    f"{self.timeout} s") from None
                dead = [r for r, p in enumerate(self.procs) if r not in got and not p.is_alive()]
                if dead:
                    try:  # a rank that exits right after its message: the message first
                        msg = self.res_q.get(timeout=2.0)
                    except queue.Empty:
                        raise SideError(f"{self.side}: rank {dead[0]} died with exit code "
                                        f"{self.procs[dead[0]].exitcode} without a "
                                        "message") from None
                else:
                    continue
            if msg[0] == "error":
                raise SideError(f"{self.side} rank {msg[1]} failed:\n{msg[2]}")
            if msg[0] == kind:
                got[msg[1]] = msg[2]
        return [got[r] for r in range(self.world)]

    def window(self, steps):
        """``steps`` timed steps on every rank: (step seconds, the slowest rank's each;
        losses, averaged over ranks)."""
        for q in self.cmd_qs:
            q.put(("window", steps))
        wins = self._collect("window")
        return ([max(v) for v in zip(*(w[0] for w in wins))],
                [statistics.fmean(v) for v in zip(*(w[1] for w in wins))])

    def finish(self):
        """End every rank: their memory dicts (``_Rank.memory``)."""
        for q in self.cmd_qs:
            q.put(("exit",))
        try:
            return self._collect("result")
        finally:
            for p in self.procs:
                p.join(30)
            self.kill()

    def kill(self):
        for p in self.procs:
            if p.is_alive():
                p.kill()
                p.join(5)
