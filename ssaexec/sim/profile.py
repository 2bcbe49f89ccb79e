"""Op durations of one place: from a trace, measured on the fly, or estimated.

A ``Profile`` maps each op of a program (``op_key``: the op type and the vars it
writes, so the same op is found in the rewritten programs of gradient accumulation)
to an ``OpCost``: ``device_s``, the time its kernels occupy the device, and
``host_s``, the host time of its launch (None: the cluster's ``Host.op_s``). When
``wall`` is set, ``device_s`` is the op's whole time on the thread that ran it (a CPU
place runs its kernels on that thread): the engine takes the host launch out of it.

Three sources, one class:

* ``Profile.from_trace(trace)``: ``ssaexec trace`` output (Chrome-trace JSON), the
  median over steps of each op's slice on place 0. CPU places: the slice is the
  op's wall time on the readable per-op path, whose own cost
  (``Host.readable_extra_s``) is taken off. CUDA places: slices show host launch
  time, unless the trace was made with ``--cuda-sync`` (then device time);
  ``from_trace(device_trace, host_trace=...)`` combines one of each.
* ``Profile.measure(program, ...)``: runs steps on one place through
  ``ParallelExecutor.observe`` (one scheduler thread, so nothing else runs beside
  the op being timed) and takes the same medians; on CPU it also times a copy of the
  place on every core against one alone (``side_by_side``: how much this program's
  kernels slow each other through shared caches and memory).
* ``Profile.estimate(program, batch, device)``: a roofline estimate without
  running anything: matrix products and convolutions at a share of the device's
  peak FLOP/s, everything else at a share of its memory bandwidth, never below
  ``Device.kernel_min``. For devices this machine does not have.

Keys are chosen by the handle's class, never by its kind's label: ``op_key`` is a
``functools.singledispatch`` on the handle class, and a trace slice, which names its
handle's class only by the label (its category), is read back to the class once
(``_medians``), whose entry in ``_SLICE_KEYS`` gives the same key ``op_key`` gives.
"""

import functools
import json
import math
import re
import statistics

from ..core.errors import SSAExecError
from ..core.safe_files import read_regular
from ..graph.handles import FreeOpHandle
from ..graph.ssa import (HANDLE_KINDS, AllReduceWaitOpHandle, CollectiveOpHandle,
                         ComputationOpHandle, FetchOpHandle, ScaleLossGradOpHandle)

__all__ = ["OpCost", "Profile", "op_key", "PRECISIONS", "activations_in_half"]

PRECISIONS = ("fp32", "tf32", "amp")  # how an estimate's fp32 program runs (estimate)

_VERSION = re.compile(r"@v\d+(\[[^\]]*\])?$")


def _compute_key(op_type, outputs):
    return f"{op_type}|{','.join(outputs)}"


def _fetch_key(var_name):
    return f"fetch|{var_name}"


def _kind_key(cls):
    # a kind whose handles all cost the same has one entry, named by the kind's label
    return cls.kind


@functools.singledispatch
def op_key(handle):
    """The profile key of op handle ``handle``, chosen by its class.

    A computation: its op type and the vars it writes; a fetch: the var it reads; the
    other kinds: one entry per kind, named by the kind's label.
    """
    raise SSAExecError(f"a profile has no key for op handle kind {handle.kind!r}")


@op_key.register
def _(handle: ComputationOpHandle):
    return _compute_key(handle.op.type, [v.name for v in handle.outputs if not v.is_dummy])


@op_key.register
def _(handle: FetchOpHandle):
    return _fetch_key(handle.var_name)


@op_key.register(ScaleLossGradOpHandle)
@op_key.register(CollectiveOpHandle)
@op_key.register(AllReduceWaitOpHandle)
@op_key.register(FreeOpHandle)
def _(handle):
    return _kind_key(type(handle))


# How a trace slice of each class gives its profile key (``_medians``): (the lane it is
# read from, None for any; its key from the slice's args). The keys agree with
# ``op_key``. Collectives and their waits are modelled, not replayed: not here.
_SLICE_KEYS = {
    ComputationOpHandle: (1, lambda args: _compute_key(
        args.get("op_type"), [_VERSION.sub("", o) for o in args.get("outputs", [])])),
    ScaleLossGradOpHandle: (1, lambda args: _kind_key(ScaleLossGradOpHandle)),
    FetchOpHandle: (None, lambda args: _fetch_key(args.get("var"))),
}


class OpCost:
    """``device_s`` and ``host_s`` (None: the cluster's default) of one op."""

    __slots__ = ("device_s", "host_s")

    def __init__(self, device_s, host_s=None):
        self.device_s = float(device_s)
        self.host_s = None if host_s is None else float(host_s)

    def __repr__(self):
        h = "default" if self.host_s is None else f"{self.host_s * 1e6:.1f}us"
        return f"OpCost(device {self.device_s * 1e6:.1f}us, host {h})"


class Profile:
    """Op costs of one place of a program (see the module docstring).

    Parameters
    ----------
    costs : dict
        ``op_key -> OpCost``.
    batch : int
        Samples per place the costs were taken at.
    device : str
        ``"cpu"`` or ``"gpu"``.
    wall : bool
        ``device_s`` holds the op's whole time on its thread (CPU places).
    threads : int, optional
        torch intra-op threads of a CPU profile (the cores a kernel keeps busy).
    source : str
        Where the numbers come from.
    side_by_side : float, optional
        CPU profiles: the program's steps per second with every core running a copy
        of the place, over as many times one copy alone (``measure``). Cores share
        caches and memory bandwidth, and how much that slows kernels depends on the
        kernels; when given, the engine uses it instead of the cluster's generic
        ``Host.parallel_efficiency``.
    """

    __slots__ = ("costs", "batch", "device", "wall", "threads", "source", "side_by_side")

    def __init__(self, costs, batch, device, wall=False, threads=None, source="",
                 side_by_side=None):
        if device not in ("cpu", "gpu"):
            raise SSAExecError(f"profile device must be 'cpu' or 'gpu', got {device!r}")
        self.costs = dict(costs)
        self.batch = int(batch)
        self.device = device
        self.wall = bool(wall)
        self.threads = None if threads is None else int(threads)
        self.source = source
        self.side_by_side = None if side_by_side is None else float(side_by_side)

    def __repr__(self):
        return (f"<Profile {len(self.costs)} ops, batch {self.batch} per place, "
                f"{self.device}{' wall' if self.wall else ''}, {self.source}>")

    def cost(self, handle):
        """The ``OpCost`` of ``handle``, or None when the profile does not know it."""
        return self.costs.get(op_key(handle))

    def shard_cost(self, handle, program):
        """The cost of an optimizer op that ZeRO moved onto shards (``program.shard``:
        it writes ``p@SHARD`` where the profiled program's op wrote ``p``): the profiled
        op's, scaled by the shard's share of the parameter (an elementwise update is
        linear in its size). None when ``handle`` is no such op or the profile lacks it."""
        from ..program.shard import SHARD_SUFFIX
        if not isinstance(handle, ComputationOpHandle):
            return None
        outs = [v.name for v in handle.outputs if not v.is_dummy]
        if not any(n.endswith(SHARD_SUFFIX) for n in outs):
            return None
        full = [n[:-len(SHARD_SUFFIX)] if n.endswith(SHARD_SUFFIX) else n for n in outs]
        base = self.costs.get(_compute_key(handle.op.type, full))
        if base is None:
            return None
        block = program.global_block()
        shard = next(n for n in outs if n.endswith(SHARD_SUFFIX))
        s, f = block.find_var(shard), block.find_var(full[outs.index(shard)])
        share = s.numel / f.numel if s is not None and f is not None and f.numel else 1.0
        return OpCost(base.device_s * share, base.host_s)

    def fallback(self, handle):
        """A stand-in for an op the profile lacks: the median of its type, else of all."""
        if isinstance(handle, FetchOpHandle):
            return OpCost(0.0)  # a copy of a scalar: the host launch only
        typ = handle.op_type
        same = [c for k, c in self.costs.items() if k.split("|", 1)[0] == typ]
        pool = same or list(self.costs.values())
        if not pool:
            return OpCost(0.0)
        return OpCost(statistics.median(c.device_s for c in pool),
                      None if any(c.host_s is None for c in pool)
                      else statistics.median(c.host_s for c in pool))

    def total_device_s(self):
        return sum(c.device_s for c in self.costs.values())

    # --- JSON ---------------------------------------------------------------------------
    def to_dict(self):
        return {"batch": self.batch, "device": self.device, "wall": self.wall,
                "threads": self.threads, "source": self.source,
                "side_by_side": self.side_by_side,
                "costs": {k: [c.device_s, c.host_s] for k, c in self.costs.items()}}

    @classmethod
    def from_dict(cls, d):
        return cls({k: OpCost(*v) for k, v in d["costs"].items()}, d["batch"], d["device"],
                   d.get("wall", False), d.get("threads"), d.get("source", ""),
                   d.get("side_by_side"))

    def save(self, path):
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_dict(), f, indent=1)
        return path

    # --- from a trace -------------------------------------------------------------------
    @classmethod
    def from_trace(cls, trace, host_trace=None, readable_extra_s=8e-6):
        """A profile from ``ssaexec trace`` output (a dict or a path).

        ``host_trace``: a second trace of CUDA places made without ``--cuda-sync``,
        whose slices give the host times while ``trace``'s (with ``--cuda-sync``)
        give the device times. ``readable_extra_s``: the readable path's own cost per
        op, taken off CPU slices and host times.
        """
        doc = _load(trace)
        meta = doc.get("otherData", {})
        places = meta.get("places") or ["cpu:0"]
        cuda = str(places[0]).startswith("cuda")
        batch = max(1, int(meta.get("batch", 1)) // max(1, len(places)))
        durations = _medians(doc)
        source = f"trace of {meta.get('program', 'a program')} on {places[0]}"
        if not cuda:
            costs = {k: OpCost(max(0.0, d - readable_extra_s)) for k, d in durations.items()}
            return cls(costs, batch, "cpu", wall=True, threads=meta.get("torch_threads"),
                       source=source)
        if host_trace is not None:
            host = _medians(_load(host_trace))
            if not meta.get("cuda_sync"):
                raise SSAExecError("from_trace(trace, host_trace=...): the first trace must be "
                                   "made with --cuda-sync (device times)")
            costs = {k: OpCost(max(0.0, d - readable_extra_s),
                               max(0.0, host.get(k, d) - readable_extra_s))
                     for k, d in durations.items()}
            return cls(costs, batch, "gpu", source=source + " (+ a host trace)")
        if meta.get("cuda_sync"):
            costs = {k: OpCost(max(0.0, d - readable_extra_s)) for k, d in durations.items()}
            return cls(costs, batch, "gpu", source=source + " (--cuda-sync: device times)")
        # launch times only: the device time is unknown, assume the kernels keep up
        costs = {k: OpCost(max(0.0, d - readable_extra_s), max(0.0, d - readable_extra_s))
                 for k, d in durations.items()}
        return cls(costs, batch, "gpu",
                   source=source + " (host launch times only: device time taken equal)")

    # --- measured on the fly ------------------------------------------------------------
    @classmethod
    def measure(cls, program, startup=None, batch=16, place=None, threads=None, steps=5,
                warmup=2, seed=0, readable_extra_s=8e-6, loss=None, side_by_side=True):
        """Run ``warmup`` + ``steps`` steps of ``program`` on one place and time every op.

        One scheduler thread runs the ops, one at a time (``observe`` uses the readable
        path). ``threads``: torch intra-op threads (CPU; default torch's current
        setting). On a CUDA place a second pass with ``cuda_sync`` gives device times:
        an op's synchronised slice less its launch (the first pass's slice).
        ``side_by_side`` (CPU, when the cores hold 2 to ``MAX_SIDE_BY_SIDE`` copies):
        also time the step with a copy of the place on every ``threads`` cores against
        one alone (``Profile.side_by_side``). More copies would each hold the program's
        parameters and activations; such machines keep the cluster's calibrated figure.
        """
        import torch

        from ..execution.parallel_executor import ParallelExecutor
        from ..core.place import CPUPlace
        from ..program.defaults import default_startup, loss_var
        from ..runtime.scope import Scope
        from ..core.strategy import ExecutionStrategy
        from ..data.synthetic import synthetic_feed
        from ..execution.step_trace import OpTimer
        place = place or CPUPlace(0)
        loss = loss or loss_var(program)
        if loss is None:
            raise SSAExecError("Profile.measure: the program has no loss var to fetch")
        startup = default_startup(program, startup)[0]
        threads = threads or torch.get_num_threads()
        # the straight-line path the simulator models (not the default's tiers)
        strategy = ExecutionStrategy(num_threads=1, torch_threads=threads, compiler="none")
        feed = synthetic_feed(program, batch, seed)
        pe = ParallelExecutor(places=[place], main_program=program, startup_program=startup,
                              loss_name=loss, exec_strategy=strategy, scope=Scope(),
                              distributed=False)
        try:
            for _ in range(warmup):
                pe.run(fetch_list=[loss], feed=feed)

            def timed(cuda_sync):
                timer = OpTimer()
                with pe.observe([loss], timer, cuda_sync) as graph:
                    for s in range(steps):
                        timer.step = s
                        pe.run(fetch_list=[loss], feed=feed)
                per = {}
                for _, op_id, _, t0, t1 in timer.records:
                    op = graph.ops[op_id]
                    if not op.is_collective:  # collectives are modelled, not replayed
                        per.setdefault(op_key(op), []).append((t1 - t0) / 1e9)
                return {k: statistics.median(v) for k, v in per.items()}

            first = timed(False)
            if not place.is_cuda:
                copies = _alias_copies(pe.graph([loss]), batch)
                costs = {k: OpCost(max(0.0, d - readable_extra_s - copies.get(k, 0.0)))
                         for k, d in first.items()}
                from ..core.place import available_cores
                k = available_cores() // threads
                sbs = _side_by_side(program, startup, loss, feed, threads, k) \
                    if side_by_side and 2 <= k <= MAX_SIDE_BY_SIDE else None
                return cls(costs, batch, "cpu", wall=True, threads=threads,
                           source=f"measured on {place}, {threads} torch threads",
                           side_by_side=sbs)
            device = timed(True)
            # a synchronised slice is the launch, then what the device still has to do
            # after it; the engine starts an op's kernels when its launch ends, so the
            # device time it needs is that remainder (the whole slice would count the
            # launch twice: once on the host, once on the stream)
            costs = {k: OpCost(max(0.0, device[k] - first[k]),
                               max(0.0, first[k] - readable_extra_s)) for k in first}
            return cls(costs, batch, "gpu", source=f"measured on {place}")
        finally:
            pe.close()

    # --- estimated ------------------------------------------------------------------------
    @classmethod
    def estimate(cls, program, batch, device, precision=None, efficiency=None,
                 low_precision=False):
        """A roofline estimate of every op of ``program`` at ``batch`` samples per place.

        Parameters
        ----------
        program : ProgramDesc
        batch : int
        device : ssaexec.sim.cluster.Device
            A GPU with peak figures.
        precision : {"fp32", "tf32", "amp"}, optional
            How the fp32 program's convolutions and matrix products run: on the CUDA
            cores (``fp32``), on TF32 tensor cores (``tf32``: the default where the
            device has them, as cuDNN and PyTorch's convolutions do by default), or
            under automatic mixed precision (``amp``: fp16/bf16 tensor cores,
            activations in 2 bytes; parameters, their gradients and the optimizer's
            state stay fp32). ``low_precision=True`` is ``amp``.
        efficiency : dict, optional
            Overrides of the per-op-class shares (``ssaexec.sim.efficiency.shares``).

        Each op takes the longest of its FLOPs at its class's share of the math unit's
        peak, its bytes (inputs and outputs, once) at its class's share of the memory
        bandwidth, and ``device.kernel_min``. Host times are the cluster's default.
        """
        from .efficiency import describe, op_class, shares
        if not device.is_gpu or not device.mem_bw:
            raise SSAExecError(f"Profile.estimate needs a GPU device with peak figures, got "
                               f"{device.name!r}; measure a profile instead")
        if low_precision:
            precision = "amp"
        if precision is None:
            precision = "tf32" if device.flops_tf32 else "fp32"
        if precision not in PRECISIONS:
            raise SSAExecError(f"precision must be one of {', '.join(PRECISIONS)}, got "
                               f"{precision!r}")
        if precision == "tf32" and not device.flops_tf32:
            raise SSAExecError(f"{device.name} has no TF32 tensor cores: use precision "
                               "fp32 or amp")
        peak, unit = {"fp32": (device.flops, "fp32"), "tf32": (device.flops_tf32, "tf32"),
                      "amp": (device.flops_low, "fp16")}[precision]
        if not peak:
            raise SSAExecError(f"{device.name} has no {precision} peak figure")
        eff = shares(efficiency)
        block = program.global_block()
        half = activations_in_half(program) if precision == "amp" else frozenset()
        costs = {}
        from ..graph.build import op_reads_writes
        for op in block.ops:
            reads, writes = op_reads_writes(program, op)
            c = op_class(op.type)
            key = f"{op.type}|{','.join(writes)}"
            if c == "view":
                costs[key] = OpCost(0.0)
                continue
            size = {n: _bytes(block, n, batch) // (2 if n in half else 1)
                    for n in set(reads) | set(writes)}
            moved = _moved(op, size)
            flops = _flops(block, op, batch)
            if c in ("conv", "matmul"):
                t = max(flops / (peak * eff[c][unit]) if flops else 0.0,
                        moved / (device.mem_bw * eff["elementwise"]))
            else:
                t = moved / (device.mem_bw * eff[c])
            costs[key] = OpCost(max(t, device.kernel_min) if moved or flops else 0.0)
        costs[_kind_key(ScaleLossGradOpHandle)] = OpCost(device.kernel_min)
        return cls(costs, batch, "gpu",
                   source=f"roofline estimate for {device.name}, {precision} "
                          f"({peak / 1e12:.0f} TFLOP/s, {device.mem_bw / 1e12:.2f} TB/s): "
                          f"{describe(unit)}")


def _moved(op, size):
    """Bytes an op's kernels move: its inputs and outputs once (``size``: name ->
    bytes), except the gradient of an addition, which PyTorch passes through to a
    same-shaped input (no kernel) and sums over the broadcast dims of the others."""
    if op.type not in ("elementwise_add_grad", "elementwise_sub_grad"):
        return sum(size.values())
    dout = op.input("Out@GRAD")
    d = size.get(dout[0], 0) if dout else 0
    moved = 0
    for slot in ("X@GRAD", "Y@GRAD"):
        for n in op.output(slot):
            b = size.get(n, 0)
            if b != d or op.type == "elementwise_sub_grad" and slot == "Y@GRAD":
                moved += d + b  # a reduction (or the negation): read dOut, write it
    return moved


def activations_in_half(program):
    """Names of the fp32 values that automatic mixed precision keeps in 2 bytes: every
    floating non-persistable value but the gradients of persistable ones (parameters'
    gradients stay fp32, as their master copies)."""
    block = program.global_block()
    persist = {n for n, v in block.vars.items() if getattr(v, "persistable", False)}
    out = set()
    for n, v in block.vars.items():
        if n in persist or str(v.dtype) not in ("float32", "fp32", "5"):
            continue
        if n.endswith("@GRAD") and n[:-5] in persist:
            continue
        out.add(n)
    return frozenset(out)


def _alias_copies(graph, batch, repeats=5):
    """{op_key: seconds of the copies the readable path makes of results that alias an
    input} for the ops of place 0 that may alias (``OpDef.may_alias``): a result with
    as many elements as one of the op's gradient inputs is taken to be that input
    handed back (a linear op's vjp), which the compiled path does not copy; each copy
    is timed here, on a tensor of that size."""
    import time

    import torch

    from ..ops.registry import get_op_def
    block = graph.program.global_block()
    timed = {}

    def copy_s(numel):
        if numel not in timed:
            t = torch.empty(numel)
            t.clone()
            runs = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                t.clone()
                runs.append(time.perf_counter() - t0)
            timed[numel] = statistics.median(runs)
        return timed[numel]

    out = {}
    for h in graph.ops:
        if not isinstance(h, ComputationOpHandle) or h.place_idx != 0 or \
                not get_op_def(h.op.type).may_alias:
            continue
        grads = {_numel(block.find_var(n), batch) for slot, names in h.op.inputs.items()
                 if slot.endswith("@GRAD") for n in names}
        total = 0.0
        for v in h.outputs:
            if not v.is_dummy:
                n = _numel(block.find_var(v.name), batch)
                if n and n in grads:
                    total += copy_s(n)
        if total:
            out[op_key(h)] = total
    return out


def _load(trace):
    if isinstance(trace, dict):
        return trace
    from ..program.json_scan import load_bounded
    try:
        text = read_regular(trace).decode("utf-8")  # a FIFO: refused, not waited on
        return load_bounded(text, str(trace))  # bounded like a program file
    except OSError as e:
        raise SSAExecError(f"{trace}: cannot read the trace: {e.strerror or e}") from None
    except (ValueError, SSAExecError) as e:
        raise SSAExecError(f"{trace}: not a JSON trace ({e})") from None


def _medians(doc):
    """{op_key: median slice seconds} of place 0's lane (pid 1) and the fetch lane."""
    per = {}
    for e in doc.get("traceEvents", []):
        if e.get("ph") != "X":
            continue
        # a slice names its handle class by the kind's label (its category): read back
        # to the class here, once; the class decides the rest (steps have no class)
        cat = e.get("cat")
        cls = HANDLE_KINDS.get(cat) if isinstance(cat, str) else None
        lane, key = _SLICE_KEYS.get(cls, (None, None))
        if key is None or lane not in (None, e.get("pid")):
            continue
        per.setdefault(key(e.get("args", {})), []).append(float(e.get("dur", 0.0)) / 1e6)
    if not per:
        raise SSAExecError("the trace has no op slices on place 0 (is it ssaexec trace output?)")
    return {k: statistics.median(v) for k, v in per.items()}


def _numel(var, batch):
    if var is None or var.shape is None:
        return 0
    return math.prod(batch if d < 0 else d for d in var.shape)


def _bytes(block, name, batch):
    var = block.find_var(name)
    if var is None:
        return 0
    from ..core.dtypes import torch_dtype
    return _numel(var, batch) * torch_dtype(var.dtype).itemsize


def _shape(block, op, slot, batch):
    names = op.input(slot) or op.output(slot)
    var = block.find_var(names[0]) if names else None
    if var is None or var.shape is None:
        return None
    return [batch if d < 0 else d for d in var.shape]


def _flops(block, op, batch):
    """Multiply-add FLOPs of the matrix products and convolutions (0 for the others)."""
    t = op.type
    grad = 2 if t.endswith("_grad") else 1
    base = t[:-5] if t.endswith("_grad") else t
    if base in ("conv2d", "depthwise_conv2d"):
        f = _shape(block, op, "Filter", batch)
        out = _shape(block, op, "Output", batch) or _shape(block, op, "Output@GRAD", batch)
        if f and out:
            return 2.0 * math.prod(out) * math.prod(f[1:]) * grad
    if base in ("mul", "matmul", "matmul_v2", "fc"):
        x = _shape(block, op, "X", batch)
        y = _shape(block, op, "Y", batch) or _shape(block, op, "W", batch)
        if x and y:
            # every element of x meets every output column of y once; op(y) = y^T
            # swaps which of y's last two dims is the columns'
            trans = op.attrs.get("transpose_Y", op.attrs.get("trans_y", False))
            cols = y[-2] if trans and len(y) >= 2 else y[-1]
            return 2.0 * math.prod(x) * cols * grad
    return 0.0


MAX_SIDE_BY_SIDE = 8  # copies of a place Profile.measure runs side by side at most


def _side_by_side(program, startup, loss, feed, threads, copies, steps=4, rounds=3):
    """Steps per second of ``copies`` one-place executors stepping side by side, each in
    its own thread with ``threads`` torch threads, over ``copies`` times one alone (the
    median of ``rounds`` alternated pairs, so a neighbour's burst spoils one pair)."""
    import threading
    import time

    import torch

    from ..execution.parallel_executor import ParallelExecutor
    from ..core.place import CPUPlace
    from ..runtime.scope import Scope
    from ..core.strategy import ExecutionStrategy
    strategy = ExecutionStrategy(num_threads=1, torch_threads=threads, compiler="none")
    pes = [ParallelExecutor(places=[CPUPlace(0)], main_program=program,
                            startup_program=startup, loss_name=loss, exec_strategy=strategy,
                            scope=Scope(), distributed=False) for _ in range(copies)]

    def run(pe, out):
        torch.set_num_threads(threads)  # per thread: a fresh thread has OpenMP's default
        t0 = time.perf_counter()
        for _ in range(steps):
            pe.run(fetch_list=[loss], feed=feed)
        out.append(time.perf_counter() - t0)

    def together(n):
        out = []
        ts = [threading.Thread(target=run, args=(pe, out)) for pe in pes[:n]]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        return max(out)
    try:
        together(copies)  # warm every copy up
        ratios = []
        for _ in range(rounds):
            alone = together(1)
            ratios.append(alone / together(copies))
        return min(1.0, statistics.median(ratios))
    finally:
        for pe in pes:
            pe.close()
