"""Collectives across processes: the local places first, then ``torch.distributed``.

``ProcessGroupCollective`` is the collective backend of a ParallelExecutor
that is one process of a multi-process run (``BuildStrategy(num_trainers>1)``).
Its gradient all-reduce is hierarchical:

1. sum the places' tensors into place 0's, in place order (deterministic, as
   ``LocalCollective`` does);
2. all-reduce that one tensor across processes with ``torch.distributed``
   (gloo on CPU, NCCL on CUDA, where it runs on torch's NCCL communication
   stream); a fused bucket is one flat buffer, so it is one cross-process
   call. The call is asynchronous; how its work handle is waited on is below;
3. copy the result back to the other places.

A sparse gradient (``ops.sparse``) is not summed densely: the places' rows and
values are gathered, then every rank's (``all_gather`` of the row counts, then of
the rows and values padded to the longest), and coalesced into the sum.

ZeRO (``BuildStrategy(zero_stage=1|2|3)``, program/shard.py's layout: global rank
``g = process_rank * places + place``, a parameter's flat elements split in W = processes x
places shards of S) adds two hierarchical collectives, each one cross-process call:

* ``all_gather(shards, outs)``: the places' shards, concatenated in place order, are
  gathered across processes (``compat.all_gather_single``) straight into place 0's output
  (its layout is process-major, place-minor: the global rank order), then copied to the
  other places. The low-precision gather (``zero_gather_dtype``) is the graph handle's:
  it hands this method shards and outputs of the wire type, so every rank, its own shard
  too, keeps the same rounded values.
* ``reduce_scatter(fulls, shards)``: the places' full gradients are summed in place order
  into a new buffer (the gradient itself is left as it was), then reduce-scattered across
  processes (``compat.reduce_scatter_single``): process t receives its places' P
  consecutive chunks, summed over the processes, and place i keeps chunk i. The order is
  all_reduce's (places, then processes), so with 2 processes a shard is bit for bit the
  slice of the all-reduced gradient.

Both have ``_start`` forms, like ``all_reduce_start``, and go through ``start``/``call``:
a failure is a ``DistributedError`` naming the rank and the collective.

Order. The SSA graph chains its collectives by dummy edges, so the scheduler
runs them one at a time in the graph's order, and that order is the program
order, the same in every process: ranks never pair up mismatched collectives.
With ``BuildStrategy(async_allreduce=True)`` (the default) the graph splits each
all-reduce in two handles: the first sums the places and starts the cross-process
call (``all_reduce_start``) and returns at once, so the chain moves on and several
all-reduces are in flight while backward runs; an ``AllReduceWaitOpHandle`` waits for
the result and copies it to the places, and only the gradient's readers wait for it.

Waiting (``waits_on_stream``). A CUDA tensor under NCCL is waited on by the
stream: ``work.wait()`` with no timeout makes the calling thread's current stream
wait for NCCL's, and the host moves on, so the collective overlaps whatever the
scheduler launches next. ``work.wait(timeout)`` would instead spin the host until
NCCL is done (torch blocks whenever a timeout is given), a host sync per
collective. A dead NCCL peer is then caught by the group's own timeout (the same
seconds, given to ``init_process_group``) in torch's NCCL watchdog, which aborts
the communicator and the process (``TORCH_NCCL_ASYNC_ERROR_HANDLING``), so
``torchrun --max-restarts`` restarts it; ``TORCH_NCCL_BLOCKING_WAIT=1`` buys back
the error in the calling thread at the host wait's price. Everything else (gloo, a
CPU tensor of a mixed ``cpu:gloo,cuda:nccl`` group) is waited on by the host with
the run's timeout, so a dead or stuck peer becomes an error in bounded time.

Failures. Every ``torch.distributed`` call goes through ``call``, which turns
a backend error (a peer's socket closed, a timeout from the group's
``timeout``) into ``DistributedError`` naming this rank and the collective.
``agree`` checks that every rank holds the same list (the persistables at
start, and in debug mode the collective sequence before each step's first
collective) and raises ``DistributedError`` naming the first difference on
every rank, where a real mismatch would crash or hang the backend.
"""

import datetime
import re

import torch
import torch.distributed as dist

from ..core import compat, faults
from ..core.errors import DistributedError, SSAExecError
from ..ops.sparse import rows_of
from ..runtime.collective import LocalCollective, gather_sparse

__all__ = ["ProcessGroupCollective", "describe_collective", "waits_on_stream"]


def waits_on_stream(backend, device):
    """Whether a collective of ``backend`` on ``device`` is waited on by the stream.

    True for a CUDA tensor under NCCL (the backend string may be a per-device one,
    ``"cpu:gloo,cuda:nccl"``); then the host does not wait (module docstring).
    """
    device = torch.device(device)
    backend = str(backend).lower()
    if device.type != "cuda" or "nccl" not in backend:
        return False
    if ":" not in backend:  # one backend for every device
        return True
    per_device = dict(part.split(":", 1) for part in backend.split(",") if ":" in part)
    return per_device.get("cuda") == "nccl"


def describe_collective(item):
    """Render one entry of a collective signature: ``#3 all_reduce(w@GRAD [4, 3] float32)``."""
    seq, kind, names, shapes, dtypes = item
    parts = ", ".join(f"{n} {list(s) if s is not None else '?'} {d}"
                      for n, s, d in zip(names, shapes, dtypes, strict=True))
    return f"#{seq} {kind}({parts})"


def _first_line(exc):
    # gloo's messages start with "[/path/pair.cc:553] " and end in a joke; keep the middle
    lines = str(exc).strip().splitlines()
    text = re.sub(r"^\[[^\]]*\]\s*", "", lines[0]) if lines else type(exc).__name__
    return text.split(" GLHF!")[0].rstrip().rstrip(".")


def _shard_size(shards, what):
    """The common number of elements of ``shards`` (one per place), else ``SSAExecError``."""
    sizes = {s.numel() for s in shards}
    if len(sizes) != 1:
        raise SSAExecError(f"{what}: the places' shards differ in size ({sorted(sizes)}); "
                           "each place holds one shard of the same size")
    return sizes.pop()


class ProcessGroupCollective(LocalCollective):
    """Hierarchical collectives over local places and the processes of ``group``.

    Parameters
    ----------
    group : ProcessGroup, optional
        Default: torch.distributed's default group (it must be initialised).
    debug : bool
        Check, before each step's first collective, that all ranks agree on the
        sequence of collectives (one ``all_gather_object`` per step).
    timeout : float, optional
        Seconds each host wait may take (default: the group's own timeout, which
        gloo applies to every operation). CUDA tensors under NCCL are waited on
        by the stream, with no host wait: there the group's timeout and torch's
        NCCL watchdog catch a dead peer (module docstring).
    """

    __slots__ = ("group", "rank", "world_size", "backend", "debug", "steps", "timeout")
    local_only = False  # other processes take part even with one local place

    @property
    def processes(self):
        """The number of processes (ZeRO's world is this times the local places)."""
        return self.world_size

    @property
    def process_rank(self):
        """This process's rank (global rank of its place i: ``process_rank * places + i``)."""
        return self.rank

    def __init__(self, group=None, debug=False, timeout=None):
        if not dist.is_available() or not dist.is_initialized():
            raise DistributedError("torch.distributed has no process group: call "
                                   "se.distributed.init() first (under torchrun)")
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.backend = str(dist.get_backend(group))
        self.debug = bool(debug)
        self.steps = 0
        self.timeout = None if timeout is None else datetime.timedelta(seconds=float(timeout))

    @property
    def where(self):
        return f"rank {self.rank} of {self.world_size} ({self.backend})"

    def call(self, what, issue, tensor=None):
        """Run ``issue()`` (a torch.distributed call), wait for its work handle, map errors."""
        return self.start(what, issue, tensor)()

    def start(self, what, issue, tensor=None):
        """Run ``issue()`` now; return the function that waits for its work handle (errors
        of either become ``DistributedError``). ``tensor``, the call's tensor, decides
        how: on its stream or on the host (``waits_on_stream``)."""
        try:
            work = issue()
        except SSAExecError:
            raise
        except Exception as e:
            raise self._failure(what, e) from e
        host_timeout = self.timeout
        if tensor is not None and waits_on_stream(self.backend, tensor.device):
            host_timeout = None  # a timeout makes torch spin the host until NCCL is done

        def wait():
            if work is None:
                return None
            try:
                done = work.wait() if host_timeout is None else work.wait(host_timeout)
                if done is False:
                    raise TimeoutError(f"not done after {self.timeout.total_seconds():g}s")
            except SSAExecError:
                raise
            except Exception as e:
                raise self._failure(what, e) from e
            return work
        return wait

    def _failure(self, what, e):
        return DistributedError(
            f"{self.where}: {what} failed ({type(e).__name__}: {_first_line(e)}). A peer "
            "process probably died, raised or timed out (see its log); the process group "
            "is unusable now, restart every process")

    # --- gradient collectives -------------------------------------------------------------
    def all_reduce(self, tensors, average=False, label=None):
        """Sum over places and processes; every tensor gets the result (in place)."""
        self.all_reduce_start(tensors, average, label)()
        return tensors

    def all_reduce_start(self, tensors, average=False, label=None):
        """Sum the places into the first tensor and start the cross-process all-reduce;
        return the function that waits for it and copies the result to every place."""
        faults.fire()  # SSAEXEC_FAULT's kill@step point: a step's first collective
        acc = tensors[0]
        if acc.is_sparse:
            return self._gather_sparse(tensors, average, label)
        dev = acc.device
        for t in tensors[1:]:
            acc.add_(t if t.device == dev else t.to(dev))
        wait = self.start(label or f"all_reduce of a {list(acc.shape)} tensor",
                          lambda: dist.all_reduce(acc, op=dist.ReduceOp.SUM, group=self.group,
                                                  async_op=True), acc)

        def finish():
            wait()
            if average:
                acc.div_(len(tensors) * self.world_size)
            for t in tensors[1:]:
                t.copy_(acc)
        return finish

    def _gather_sparse(self, tensors, average, label):
        # a sparse gradient (ops.sparse): every rank's rows and values, gathered (padded to
        # the longest, then trimmed) and summed by coalescing; never densified
        local = gather_sparse(tensors)
        rows, vals = local.indices()[0], local.values()
        what = label or f"all-gather of a sparse {list(local.shape)} gradient"
        n = torch.tensor([rows.numel()], dtype=torch.int64, device=rows.device)
        counts = [torch.zeros_like(n) for _ in range(self.world_size)]
        self.call(f"{what} (row counts)",
                  lambda: dist.all_gather(counts, n, group=self.group, async_op=True), n)
        counts = [int(c) for c in counts]
        most = max(counts)
        pad = most - rows.numel()
        rows = torch.cat([rows, rows.new_zeros(pad)])
        vals = torch.cat([vals, vals.new_zeros((pad,) + tuple(vals.shape[1:]))])
        all_rows = [torch.empty_like(rows) for _ in range(self.world_size)]
        all_vals = [torch.empty_like(vals) for _ in range(self.world_size)]
        self.call(f"{what} (rows)",
                  lambda: dist.all_gather(all_rows, rows, group=self.group, async_op=True),
                  rows)
        self.call(f"{what} (values)",
                  lambda: dist.all_gather(all_vals, vals, group=self.group, async_op=True),
                  vals)
        merged = rows_of(torch.cat([r[:c] for r, c in zip(all_rows, counts, strict=True)]),
                         torch.cat([v[:c] for v, c in zip(all_vals, counts, strict=True)]),
                         local.shape)
        if average:
            merged = merged * (1.0 / (len(tensors) * self.world_size))

        def finish():
            for t in tensors:
                t.copy_(merged)
        return finish

    # --- ZeRO's collectives (program/shard.py's layout) --------------------------------
    def all_gather(self, shards, outs, label=None):
        """Every rank's shard, in global rank order, into every place's ``outs[i]``."""
        self.all_gather_start(shards, outs, label)()
        return outs

    def all_gather_start(self, shards, outs, label=None):
        """Start the all-gather; return the function that waits for it and copies the
        result to every place.

        ``shards[i]`` (S elements) is place i's; ``outs[i]`` (W x S, W = processes x
        places) gets the concatenation over global ranks ``process_rank * places + i``.
        The places' shards are concatenated in place order and gathered across processes
        in one call, so the process-major, place-minor order is the global rank order.
        """
        faults.fire()  # stage 3's first collective of a step is a gather
        what = label or f"all_gather of {len(shards)} x {shards[0].numel()}-element shards"
        size = _shard_size(shards, what)
        full = self.world_size * len(shards) * size
        out0 = outs[0]
        for o in outs:
            if o.numel() != full:
                raise SSAExecError(f"{what}: an output of {o.numel()} elements where the "
                                   f"gather makes {full} ({self.world_size} processes x "
                                   f"{len(shards)} places x {size})")
        dev, dtype = out0.device, out0.dtype
        local = torch.cat([s.detach().reshape(-1).to(dev, dtype) for s in shards])
        direct = out0.is_contiguous()  # gathered straight into place 0's output
        buf = out0.view(-1) if direct else torch.empty(full, dtype=dtype, device=dev)
        wait = self.start(what, lambda: compat.all_gather_single(
            buf, local, group=self.group, async_op=True), buf)

        def finish():
            wait()
            with torch.no_grad():
                if not direct:
                    out0.copy_(buf.view(out0.shape))
                for o in outs[1:]:
                    o.copy_(out0)
        return finish

    def reduce_scatter(self, fulls, shards, label=None):
        """Every place's ``shards[i]`` gets its global rank's chunk of the sum of ``fulls``."""
        self.reduce_scatter_start(fulls, shards, label)()
        return shards

    def reduce_scatter_start(self, fulls, shards, label=None):
        """Sum the places' ``fulls`` (in place order, into a new buffer: the inputs are
        left as they are) and start the cross-process reduce-scatter; return the function
        that waits for it and writes each place's chunk into its ``shards[i]``.

        ``fulls[i]`` has W x S elements (padded), ``shards[i]`` S; place i of process t
        gets chunk ``t * places + i``. The sum runs over places in order, then over the
        processes (as ``all_reduce``), so it does not depend on timing.
        """
        faults.fire()
        what = label or f"reduce_scatter of {len(fulls)} x {fulls[0].numel()}-element tensors"
        size = _shard_size(shards, what)
        places = len(fulls)
        full = self.world_size * places * size
        for f in fulls:
            if f.numel() != full:
                raise SSAExecError(f"{what}: an input of {f.numel()} elements where the "
                                   f"reduce-scatter takes {full} ({self.world_size} processes "
                                   f"x {places} places x {size})")
        acc = fulls[0].detach().reshape(-1)
        dev = acc.device
        if places > 1:  # sums into a new buffer: the gradient's own version is not written
            acc = torch.add(acc, fulls[1].detach().reshape(-1).to(dev))
            for t in fulls[2:]:
                acc.add_(t.detach().reshape(-1).to(dev))
        elif not acc.is_contiguous():
            acc = acc.contiguous()
        mine = shards[0]
        direct = places == 1 and mine.dtype == acc.dtype and mine.device == dev and \
            mine.is_contiguous()
        buf = mine.view(-1) if direct else torch.empty(places * size, dtype=acc.dtype,
                                                       device=dev)
        wait = self.start(what, lambda: compat.reduce_scatter_single(
            buf, acc, group=self.group, async_op=True), buf)

        def finish():
            wait()
            if not direct:
                with torch.no_grad():
                    for i, s in enumerate(shards):
                        s.copy_(buf[i * size:(i + 1) * size].view(s.shape))
        return finish

    def reduce(self, tensors, root, average=False, label=None):
        raise DistributedError("the 'reduce' strategy runs in one process only; use "
                               "BuildStrategy(reduce_strategy='all_reduce') with several "
                               "processes")

    def broadcast(self, tensors, root, label=None):
        raise DistributedError("graph broadcasts (the 'reduce' strategy) run in one process "
                               "only; use BuildStrategy(reduce_strategy='all_reduce')")

    # --- set-up and checks ----------------------------------------------------------------
    def broadcast_from(self, tensors, src=0, label="broadcast of the persistables"):
        """Overwrite ``tensors`` in place with rank ``src``'s (one flat call per dtype/device)."""
        groups = {}
        for t in tensors:
            groups.setdefault((t.dtype, t.device), []).append(t)
        for (dtype, _), ts in groups.items():
            flat = torch.cat([t.detach().reshape(-1) for t in ts])
            self.call(f"{label} ({len(ts)} {str(dtype).replace('torch.', '')} tensors)",
                       lambda: dist.broadcast(flat, src=src, group=self.group, async_op=True),
                       flat)
            if self.rank != src:
                offset = 0
                with torch.no_grad():
                    for t in ts:
                        k = t.numel()
                        t.copy_(flat[offset:offset + k].view_as(t))
                        offset += k

    def gather_objects(self, obj, what):
        """``obj`` of every rank, in rank order."""
        out = [None] * self.world_size
        self.call(what, lambda: dist.all_gather_object(out, obj, group=self.group))
        return out

    def agree(self, what, items, describe=repr, hint=""):
        """Raise ``DistributedError`` on every rank unless all ranks hold the same ``items``.

        The error names the first position where a rank differs from rank 0 and
        has ``group_intact = True``: every rank raises it after the same one
        collective, so the process group is still usable.
        """
        items = list(items)
        everyone = self.gather_objects(items, f"agreement check of {what}")
        if all(other == everyone[0] for other in everyone):
            return
        k = 0
        while all(k < len(x) for x in everyone) and all(x[k] == everyone[0][k]
                                                       for x in everyone):
            k += 1

        def at(r):
            x = everyone[r]
            if k < len(x):
                return describe(x[k])
            return f"nothing (its list ends after {len(x)} entries)"
        lines = [f"rank {r}: {at(r)}" for r in range(self.world_size)]
        err = DistributedError(f"{self.where}: ranks disagree on {what}: first difference at "
                               f"position {k}:\n  " + "\n  ".join(lines) +
                               (f"\n{hint}" if hint else ""))
        err.group_intact = True  # every rank raises this together; the group still works
        raise err

    def begin_step(self, signature):
        """Called before a step's first collective; in debug mode check the sequence."""
        self.steps += 1
        if self.debug:
            self.agree(f"the collective sequence of step {self.steps}", signature,
                       describe_collective,
                       hint="Every rank must run the same program with the same BuildStrategy "
                            "(the collectives are issued in the graph's order).")
