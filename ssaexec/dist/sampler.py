"""``EpochSampler``: which samples each rank trains at each step, resumable exactly.

A training run that can be killed and restarted, on the same number of processes or on
another, needs its data position to be part of its state: a resume that skips samples or
repeats them is not the run it replaces. This sampler keeps that position as two integers.

Policy and invariants:

* **Order.** Epoch ``e`` visits the ``n`` samples in the order ``randperm(n)`` drawn from a
  generator seeded by ``(seed, e)`` alone (``shuffle=False``: ``0 .. n-1``). The order is a
  function of the seed and the epoch, the same on every rank, so no generator state is
  saved and every rank agrees without talking.
* **Global batches.** Step ``t`` of an epoch trains ``order[t*B:(t+1)*B]`` (``B`` =
  ``global_batch``); an epoch has ``n // B`` steps, and the last ``n % B`` samples of its
  order are not seen in that epoch (as ``DistributedSampler(drop_last=True)``; with
  shuffling, other samples each epoch).
* **Ranks.** Rank ``r`` of ``W`` trains the ``r``-th contiguous ``B / W`` of the global
  batch, as ``ParallelExecutor`` splits a batch over places: ``W`` processes of one place
  train exactly the samples one process of ``W`` places trains. ``B`` must be a multiple
  of ``W`` (every rank's samples weigh the same in the averaged gradient).
* **State.** ``(epoch, step)``: the next global batch. ``state_dict()`` is that position
  plus what fixes the order (``n``, ``B``, ``seed``, ``shuffle``), and ``load_state_dict``
  refuses a state of another order. The world size is not part of the state: a run resumed
  on fewer or more ranks trains the same next global batch, resharded, so each sample of
  the epoch is still seen exactly once.
"""

import hashlib

import torch

from ..core.errors import SSAExecError

__all__ = ["EpochSampler"]


class EpochSampler:
    """The sample indices of each step, by epoch, for this rank.

    Parameters
    ----------
    num_samples : int
        Samples in the dataset (``n``).
    global_batch : int
        Samples per step over all ranks (``B``, at most ``n``).
    seed : int
        Fixes the order of every epoch.
    shuffle : bool
        False: every epoch in dataset order.
    rank, world_size : int, optional
        Default: this process's (``se.distributed``); they may change with
        ``reshard`` (a resume on another number of processes).
    """

    __slots__ = ("num_samples", "global_batch", "seed", "shuffle", "rank", "world_size",
                 "epoch", "step", "_order")

    def __init__(self, num_samples, global_batch, seed=0, shuffle=True, rank=None,
                 world_size=None):
        self.num_samples, self.global_batch = _count("num_samples", num_samples, 1), \
            _count("global_batch", global_batch, 1)
        if self.global_batch > self.num_samples:
            raise SSAExecError(f"global_batch {global_batch} is larger than the dataset "
                               f"({num_samples} samples)")
        self.seed, self.shuffle = int(seed), bool(shuffle)
        self.epoch, self.step = 0, 0
        self._order = None  # (epoch, order tensor) of the current epoch
        self.reshard(rank, world_size)

    @property
    def steps_per_epoch(self):
        """Global batches in an epoch (``n // B``)."""
        return self.num_samples // self.global_batch

    @property
    def global_step(self):
        """Steps taken since epoch 0 began."""
        return self.epoch * self.steps_per_epoch + self.step

    def reshard(self, rank=None, world_size=None):
        """Train as ``rank`` of ``world_size`` from now on (default: this process's)."""
        if rank is None or world_size is None:
            from . import world as distributed
            rank = distributed.rank() if rank is None else rank
            world_size = distributed.world_size() if world_size is None else world_size
        w = _count("world_size", world_size, 1)
        if not 0 <= int(rank) < w:
            raise SSAExecError(f"rank {rank} is not in a world of {w}")
        if self.global_batch % w:
            raise SSAExecError(f"global_batch {self.global_batch} is not a multiple of the "
                               f"{w} processes: each rank must train the same number of "
                               "samples (choose a global batch every world size divides)")
        self.rank, self.world_size = int(rank), w

    def order(self, epoch=None):
        """The global order of ``epoch`` (default: the current one), a 1-D int64 tensor."""
        epoch = self.epoch if epoch is None else int(epoch)
        if self._order is not None and self._order[0] == epoch:
            return self._order[1]
        if self.shuffle:
            g = torch.Generator().manual_seed(_mix(self.seed, epoch))
            order = torch.randperm(self.num_samples, generator=g)
        else:
            order = torch.arange(self.num_samples)
        self._order = (epoch, order)
        return order

    def global_batch_indices(self):
        """Every rank's samples of the next step, in rank order."""
        b = self.global_batch
        return self.order()[self.step * b:(self.step + 1) * b]

    def next_indices(self):
        """This rank's samples of the next step; advances the position by one step."""
        per = self.global_batch // self.world_size
        idx = self.global_batch_indices()[self.rank * per:(self.rank + 1) * per]
        self.step += 1
        if self.step == self.steps_per_epoch:
            self.epoch, self.step = self.epoch + 1, 0
        return idx

    def state_dict(self):
        """The position and what fixes the order (plain ints and a bool: JSON-safe)."""
        return {"num_samples": self.num_samples, "global_batch": self.global_batch,
                "seed": self.seed, "shuffle": self.shuffle, "epoch": self.epoch,
                "step": self.step}

    def load_state_dict(self, state):
        """Continue from ``state`` (``state_dict()`` of a sampler of the same order)."""
        if not isinstance(state, dict):
            raise SSAExecError(f"sampler state must be a dict, got {type(state).__name__}")
        fixed = ("num_samples", "global_batch", "seed", "shuffle")
        diff = [f"{k} {state.get(k)!r} (this sampler: {getattr(self, k)!r})" for k in fixed
                if state.get(k) != getattr(self, k)]
        if diff:
            raise SSAExecError("the saved data position is of another sample order: "
                               + ", ".join(diff))
        epoch, step = state.get("epoch"), state.get("step")
        if not (_is_count(epoch) and _is_count(step) and step < self.steps_per_epoch):
            raise SSAExecError(f"the saved data position (epoch {epoch!r}, step {step!r}) is "
                               f"not a position of {self.steps_per_epoch} steps an epoch")
        self.epoch, self.step = epoch, step

    def __repr__(self):
        return (f"EpochSampler(n={self.num_samples}, B={self.global_batch}, epoch "
                f"{self.epoch}, step {self.step}/{self.steps_per_epoch}, rank "
                f"{self.rank}/{self.world_size})")


def _mix(seed, epoch):
    # a stable 63-bit seed of (seed, epoch): the same in every process and Python version
    digest = hashlib.sha256(f"ssaexec-sampler:{seed}:{epoch}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def _is_count(v):
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _count(name, v, least):
    if not (isinstance(v, int) and not isinstance(v, bool)) or v < least:
        raise SSAExecError(f"{name} must be an integer >= {least}, got {v!r}")
    return v
