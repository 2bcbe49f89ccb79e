"""Multi-process data parallelism on ``torch.distributed``, launched with ``torchrun``.

ssaexec does not ship its own distributed engine: ``init`` sets up a
``torch.distributed`` process group (gloo for CPU places, NCCL for CUDA places)
from the environment ``torchrun`` gives every worker (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``).
Each process then runs a ``ParallelExecutor`` over its own local places; once
a group of more than one process exists, the executor fills
``BuildStrategy(num_trainers, trainer_id)`` from it and its gradient
all-reduce becomes hierarchical (places, then processes; see
``dist.group_collective``). Loss scaling counts every rank (processes x
places), so the result equals one process training on the whole batch.

Contract between the processes (``docs/distributed.md``):

* every rank builds the same program with the same ``BuildStrategy`` and the
  same number of places, and runs the same number of steps; the executor checks
  the persistables and the strategy at start, broadcasts rank 0's values, and
  with ``SSAEXEC_DISTRIBUTED_DEBUG=1`` (or ``init(debug=True)``) checks the
  collective sequence before every step;
* feeds are per process: each process feeds its own shard (``shard`` for a
  dataset, ``shard_batch`` for one global batch); fetched values are this
  process's (``average`` combines a scalar over processes);
* a failure surfaces as ``DistributedError`` on the other ranks: a dead peer
  closes its sockets, a rank whose step raises aborts the group, anything else
  hits the group's ``timeout``.
"""

import atexit
import datetime
import os
import threading
from collections.abc import Sequence

import torch

from ..core.errors import DistributedError
from .rendezvous_store import agent_store_is_shared, fresh_store
from ..core.strategy import BuildStrategy

__all__ = ["init", "shutdown", "abort", "is_initialized", "info", "rank", "world_size",
           "collective", "local_rank", "local_world_size", "local_places", "build_strategy", "shard",
           "shard_batch", "average", "barrier", "debug_enabled", "DistributedInfo",
           "DEFAULT_TIMEOUT", "DEBUG_ENV"]

DEFAULT_TIMEOUT = 300.0
DEBUG_ENV = "SSAEXEC_DISTRIBUTED_DEBUG"


class DistributedInfo:
    """This process's place in the run (returned by ``init``)."""

    __slots__ = ("rank", "world_size", "local_rank", "local_world_size", "backend", "timeout",
                 "debug", "owned", "broken")

    def __init__(self, rank, world_size, local_rank, local_world_size, backend, timeout,
                 debug, owned):
        self.rank, self.world_size = rank, world_size
        self.local_rank, self.local_world_size = local_rank, local_world_size
        self.backend, self.timeout, self.debug, self.owned = backend, timeout, debug, owned
        self.broken = None  # why the group was aborted, once it was

    def __repr__(self):
        return (f"DistributedInfo(rank={self.rank}, world_size={self.world_size}, "
                f"local_rank={self.local_rank}, backend={self.backend!r}, "
                f"timeout={self.timeout}s, debug={self.debug})")


_lock = threading.RLock()
_info = None
_atexit_registered = False


def _dist():
    import torch.distributed as dist
    if not dist.is_available():
        raise DistributedError("this torch build has no torch.distributed support")
    return dist


def _env_int(name, default=None):
    v = os.environ.get(name)
    if v is None or v == "":
        return default
    try:
        return int(v)
    except ValueError:
        raise DistributedError(f"environment variable {name}={v!r} is not an integer") from None


def _env_flag(name):
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _seconds(timeout):
    if isinstance(timeout, datetime.timedelta):
        return timeout.total_seconds()
    t = float(timeout)
    if t <= 0:
        raise DistributedError(f"timeout must be positive, got {timeout!r}")
    return t


def _cores():
    from ..core.place import available_cores
    return available_cores()


def _default_backend(places):
    if places is not None:
        cuda = any(p.is_cuda for p in places)
    else:
        cuda = torch.cuda.is_available()
    if cuda:
        if not _dist().is_nccl_available():
            raise DistributedError("CUDA places need the NCCL backend, which this torch build "
                                   "lacks; pass backend='gloo' to use gloo on CUDA tensors")
        return "nccl"
    return "gloo"


def _torchrun_env():
    rank, world = _env_int("RANK"), _env_int("WORLD_SIZE")
    if rank is None and world is None:
        return 0, 1, 0, 1  # a plain `python script.py`: a world of one
    if rank is None or world is None:
        raise DistributedError("RANK and WORLD_SIZE must both be set (torchrun sets them); got "
                               f"RANK={os.environ.get('RANK')!r}, "
                               f"WORLD_SIZE={os.environ.get('WORLD_SIZE')!r}")
    if world < 1 or not 0 <= rank < world:
        raise DistributedError(f"need WORLD_SIZE >= 1 and 0 <= RANK < WORLD_SIZE, got RANK={rank}"
                               f", WORLD_SIZE={world}")
    local_rank = _env_int("LOCAL_RANK", rank)
    local_world = _env_int("LOCAL_WORLD_SIZE", world)
    return rank, world, local_rank, local_world


def init(backend=None, timeout=DEFAULT_TIMEOUT, places=None, debug=None):
    """Initialise the ``torch.distributed`` process group from torchrun's environment.

    Parameters
    ----------
    backend : str, optional
        ``"gloo"``, ``"nccl"`` or anything ``torch.distributed`` accepts. Default:
        NCCL for CUDA places (or, without ``places``, when CUDA is available),
        gloo otherwise.
    timeout : float or datetime.timedelta
        Seconds a collective (and the rendezvous) may wait for the other ranks
        before raising ``DistributedError``.
    places : list of Place, optional
        The places this process will use (picks the backend and, for NCCL, the
        current CUDA device). Default: ``local_places()``.
    debug : bool, optional
        Check before every step that all ranks agree on the collective
        sequence. Default: the ``SSAEXEC_DISTRIBUTED_DEBUG`` environment variable.

    Returns
    -------
    DistributedInfo
        rank, world_size, local_rank, local_world_size, backend, timeout, debug.

    Without torchrun's variables (a plain ``python script.py``) the world has
    one process and everything runs as without ``init``. If
    ``torch.distributed`` was initialised already, its group is adopted. A
    second call returns the first call's ``DistributedInfo``.
    """
    global _info, _atexit_registered
    dist = _dist()
    secs = _seconds(timeout)
    with _lock:
        if _info is not None and _info.broken is None and dist.is_initialized():
            return _info
        if debug is None:
            debug = _env_flag(DEBUG_ENV)
        if dist.is_initialized():
            _info = DistributedInfo(dist.get_rank(), dist.get_world_size(),
                                    _env_int("LOCAL_RANK", dist.get_rank()),
                                    _env_int("LOCAL_WORLD_SIZE", dist.get_world_size()),
                                    str(dist.get_backend()), secs, bool(debug), owned=False)
            return _info
        rank, world, local_rank, local_world = _torchrun_env()
        standalone = world == 1 and not os.environ.get("MASTER_ADDR")
        missing = [v for v in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(v)]
        if not standalone and missing:  # the launcher check comes before any backend check
            raise DistributedError(f"{' and '.join(missing)} not set: launch with torchrun (it "
                                   "sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT), see "
                                   "docs/distributed.md")
        _import_world_defaults()
        if places is None and backend in (None, "nccl") and torch.cuda.is_available():
            places = local_places(_local=(local_rank, local_world))
        backend = backend or _default_backend(places)
        if "nccl" in backend:  # "nccl", or a per-device string like "cpu:gloo,cuda:nccl"
            cuda = [p for p in (places or ()) if p.is_cuda]
            torch.cuda.set_device(cuda[0].device_index if cuda else
                                  local_rank % max(1, torch.cuda.device_count()))
        td = datetime.timedelta(seconds=secs)
        try:
            if standalone:
                dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1,
                                        timeout=td)
            elif agent_store_is_shared():  # torchrun's long-lived store: meet in a fresh one
                dist.init_process_group(backend, store=fresh_store(rank, world, secs),
                                        rank=rank, world_size=world, timeout=td)
            else:
                dist.init_process_group(backend, init_method="env://", rank=rank,
                                        world_size=world, timeout=td)
        except DistributedError:
            raise
        except Exception as e:
            raise DistributedError(
                f"rank {rank} of {world}: could not initialise the {backend} process group "
                f"(MASTER_ADDR={os.environ.get('MASTER_ADDR')!r}, "
                f"MASTER_PORT={os.environ.get('MASTER_PORT')!r}, timeout {secs:g}s): "
                f"{type(e).__name__}: {e}") from e
        _info = DistributedInfo(rank, world, local_rank, local_world, backend, secs,
                                bool(debug), owned=True)
        if not _atexit_registered:
            atexit.register(shutdown)
            _atexit_registered = True
        return _info


def _import_world_defaults():
    # torch.distributed.nn.functional evaluates ``group=group.WORLD`` as default arguments
    # when it is imported, and torch._dynamo imports it (our shape inference imports dynamo
    # on first use). Imported after init_process_group, those defaults keep the default
    # group alive past destroy_process_group, so gloo's run-loop threads survive to
    # interpreter exit, where one of them drops its last work item, needs the GIL for the
    # tensors' Python objects, and aborts the process ("terminate called without an active
    # exception"). Imported before, the defaults are None and shutdown joins the threads.
    try:
        import torch.distributed.nn.functional  # noqa: F401
    except Exception:  # noqa: BLE001 - optional module; without it nothing captures WORLD
        pass


def shutdown():
    """Destroy the process group ``init`` created (idempotent; also run at exit)."""
    global _info
    with _lock:
        info_, _info = _info, None
        if info_ is None or not info_.owned:
            return
        dist = _dist()
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001 - the group may be half-dead after a failure
                pass


def abort(reason):
    """Tear the process group down after a failed step so the peers fail fast.

    A rank whose step raised stops issuing collectives, leaving the others
    blocked until their timeout; destroying the group closes its connections,
    so they raise ``DistributedError`` at once. The group is unusable after.
    """
    with _lock:
        dist = _dist()
        if _info is not None:
            _info.broken = str(reason)
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001 - best effort: the point is to drop the sockets
                pass


def info():
    """The ``DistributedInfo`` of this process, or None without a process group.

    A group set up with ``torch.distributed.init_process_group`` directly is
    adopted (as ``init`` would).
    """
    if _info is not None:
        return _info
    try:
        dist = _dist()
    except DistributedError:
        return None
    if dist.is_initialized():
        return init()
    return None


def is_initialized():
    """True when a usable process group exists."""
    i = info()
    return i is not None and i.broken is None


def rank():
    """This process's rank (0 without a process group: from ``RANK`` or 0)."""
    i = info()
    return i.rank if i is not None else _torchrun_env()[0]


def world_size():
    """Number of processes (1 without a process group: from ``WORLD_SIZE`` or 1)."""
    i = info()
    return i.world_size if i is not None else _torchrun_env()[1]


def local_rank():
    """This process's rank on its machine (``LOCAL_RANK``)."""
    i = info()
    return i.local_rank if i is not None else _torchrun_env()[2]


def local_world_size():
    """Processes on this machine (``LOCAL_WORLD_SIZE``)."""
    i = info()
    return i.local_world_size if i is not None else _torchrun_env()[3]


def debug_enabled(build_strategy=None):
    """Whether the per-step collective check is on (env var, ``init(debug=)`` or strategy)."""
    if _env_flag(DEBUG_ENV):
        return True
    if build_strategy is not None and getattr(build_strategy, "debug_distributed", False):
        return True
    return _info is not None and _info.debug


def local_places(n=None, _local=None):
    """The places this process should use.

    CUDA: this local rank's share of the visible devices (one device each when
    ``--nproc-per-node`` equals the number of GPUs). CPU: ``n`` places
    (default: the cores divided among this machine's processes, at least 1).
    """
    from ..core.place import CUDAPlace, cpu_places
    lr, lw = _local if _local is not None else (local_rank(), local_world_size())
    backend = _info.backend if _info is not None else None
    if torch.cuda.is_available() and backend != "gloo":
        count = torch.cuda.device_count()
        if count < lw:
            raise DistributedError(f"{lw} processes on this machine but {count} visible GPU(s): "
                                   "NCCL needs a GPU per process; use --nproc-per-node "
                                   f"{count}, or backend='gloo' for CPU places")
        per = count // lw if n is None else int(n)
        ids = [(lr * per + i) % count for i in range(per)]
        return [CUDAPlace(i, d) for i, d in enumerate(ids)]
    return cpu_places(n if n is not None else max(1, _cores() // max(1, lw)))


def build_strategy(**kwargs):
    """A ``BuildStrategy`` with ``num_trainers`` and ``trainer_id`` from the process group."""
    return BuildStrategy(num_trainers=world_size(), trainer_id=rank(), **kwargs)


def _rank_world(rank_, world_size_):
    r = rank() if rank_ is None else int(rank_)
    w = world_size() if world_size_ is None else int(world_size_)
    if w < 1 or not 0 <= r < w:
        raise DistributedError(f"need world_size >= 1 and 0 <= rank < world_size, got {r}, {w}")
    return r, w


class _Shard(Sequence):
    """Items ``indices`` of ``data``, without copying it."""

    __slots__ = ("data", "indices")

    def __init__(self, data, indices):
        self.data, self.indices = data, indices

    def __len__(self):
        return len(self.indices)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return _Shard(self.data, self.indices[i])
        return self.data[self.indices[i]]


def shard(data, rank=None, world_size=None):
    """This rank's share of a dataset: items ``rank, rank + world, ...``.

    Every rank gets the same number of items (``len(data) // world_size``; the
    last ``len(data) % world_size`` items are dropped) so every rank runs the
    same number of steps, which collectives require. Like
    ``torch.utils.data.DistributedSampler`` without shuffling.

    Parameters
    ----------
    data : tensor, array, dict of them, or sequence
        Tensors and arrays are split along dim 0 (a strided view); a dict
        shards each value (all must have the same length); any other sequence
        gives a lazy sequence view.
    rank, world_size : int, optional
        Default: this process's.
    """
    r, w = _rank_world(rank, world_size)
    if isinstance(data, dict):
        lengths = {k: len(v) for k, v in data.items()}
        if len(set(lengths.values())) > 1:
            raise DistributedError(f"shard: the dict's values differ in length: {lengths}")
        return {k: shard(v, r, w) for k, v in data.items()}
    n = len(data) // w * w
    if isinstance(data, torch.Tensor) or hasattr(data, "__array__"):
        return data[r:n:w]
    return _Shard(data, range(r, n, w))


def shard_batch(batch, rank=None, world_size=None):
    """This rank's contiguous part of one global batch (dim 0 split as ``ParallelExecutor``).

    With ``P`` places per process, process ``r`` then trains samples
    ``r*P .. r*P+P-1`` of the global split, exactly the samples places
    ``r*P ..`` would train in one process with ``world_size * P`` places.
    ``batch`` is a tensor or a feed dict; values with no dims are kept whole.
    """
    from ..data.feed import split_batch
    r, w = _rank_world(rank, world_size)
    if isinstance(batch, dict):
        return {k: shard_batch(v, r, w) for k, v in batch.items()}
    if not isinstance(batch, torch.Tensor):
        import numpy as np
        batch = torch.from_numpy(np.ascontiguousarray(batch))
    if batch.dim() == 0:
        return batch
    return split_batch(batch, w, "batch")[r]


def collective():
    """A ``ProcessGroupCollective`` over this run's process group (``DistributedError``
    when there is no usable group)."""
    from .group_collective import ProcessGroupCollective
    if not is_initialized():
        i = _info
        why = f" (it was aborted: {i.broken})" if i is not None and i.broken else ""
        raise DistributedError(f"no usable process group{why}: call se.distributed.init() "
                               "under torchrun")
    return ProcessGroupCollective(debug=False, timeout=_info.timeout)


def average(value):
    """The mean of ``value`` (a tensor or number) over all processes; every rank must call it.

    Returns a CPU tensor. Use it to report the global loss: ``pe.run`` returns
    this process's value (the mean over its own places).
    """
    t = torch.as_tensor(value).detach()
    t = t.to(torch.float64) if not t.is_floating_point() else t.clone()
    if world_size() == 1 and not is_initialized():
        return t.cpu()
    coll = collective()
    dev = torch.device("cuda", torch.cuda.current_device()) if coll.backend == "nccl" else \
        torch.device("cpu")  # gloo, or a mixed backend whose CPU part is gloo
    buf = t.to(dev)
    coll.all_reduce([buf], label="average")
    return (buf / coll.world_size).cpu()


def barrier():
    """Wait until every process gets here (``DistributedError`` on failure or timeout)."""
    if world_size() == 1 and not is_initialized():
        return
    dist = _dist()
    coll = collective()
    coll.call("barrier", lambda: dist.barrier(async_op=True))
