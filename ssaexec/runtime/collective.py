"""Collectives across the places of one process.

``LocalCollective`` sums (or averages) each place's tensor in place order,
so results are bit-identical from run to run whatever the thread timing, and
writes the result into every place's own tensor in place. In place is safe:
the SSA graph makes the collective the only reader of the versions it
replaces. Tensors on different devices are moved to the first place's device
for the sum and copied back. Sparse gradients (``ops.sparse``) are summed by
gathering every place's rows and values (``gather_sparse``), never densified.
That is the one sparse policy of every backend: the NCCL collectives
(``runtime.nccl``) hand sparse tensors to this class's methods (NCCL moves dense
buffers only), and ``dist.group_collective`` gathers every rank's rows the same
way. ``is_sparse_collective`` tells which path a list of tensors takes.

A collective backend is any object with these methods (``label`` names the
graph op for error messages; ``begin_step`` is called before a step's first
collective; ``close`` when the executor closes, after its workers are joined):
``dist.group_collective.ProcessGroupCollective`` extends this one across
processes (its ``close`` leaves the process group alone: ``se.distributed`` owns it).
"""

import torch

from ..core import compat
from ..core.errors import SSAExecError
from ..ops.sparse import sum_rows

__all__ = ["LocalCollective", "gather_sparse", "is_sparse_collective"]


def _shard_size(shards, fulls, label):
    """The shard size S of a ZeRO collective, checked: ``len(shards) == len(fulls)``
    places, every shard 1-D of S elements, every full buffer 1-D of W*S."""
    if len(shards) != len(fulls) or not shards:
        raise SSAExecError(f"{label or 'collective'}: {len(shards)} shards for "
                           f"{len(fulls)} full buffers")
    s = shards[0].numel()
    world = len(shards)
    for t in shards:
        if t.dim() != 1 or t.numel() != s:
            raise SSAExecError(f"{label or 'collective'}: shards must be 1-D of {s} "
                               f"elements, got {list(t.shape)}")
    for t in fulls:
        if t.dim() != 1 or t.numel() != world * s:
            raise SSAExecError(f"{label or 'collective'}: full buffers must be 1-D of "
                               f"{world * s} elements, got {list(t.shape)}")
    return s


def is_sparse_collective(tensors, label=None):
    """Whether ``tensors`` (one per place) are sparse gradients, gathered by rows.

    A mix of sparse and dense tensors is a graph error: ``SSAExecError`` naming it.
    """
    sparse = [t.is_sparse for t in tensors]
    if any(sparse) and not all(sparse):
        raise SSAExecError(f"{label or 'collective'}: sparse and dense tensors mixed "
                           f"(sparse per place: {sparse}); every place's gradient must be "
                           "sparse or none")
    return bool(sparse) and sparse[0]


def gather_sparse(tensors, average=False, count=None):
    """The sum of sparse gradients, made by gathering their rows and values in order.

    Memory stays proportional to the rows touched (``ops.sparse``); the result is
    coalesced, on the first tensor's device; ``average`` divides by ``count`` (default:
    the number of tensors).
    """
    merged = sum_rows(tensors)
    if average:
        merged = merged * (1.0 / (count or len(tensors)))
    return merged


class LocalCollective:
    """In-process all-reduce, reduce, broadcast, all-gather and reduce-scatter over a
    list of per-place tensors (this process's places, in place order; the global rank of
    place i is i: ``processes`` is 1 and ``process_rank`` 0)."""

    __slots__ = ()
    # one place in one process: every collective is a no-op the compiled runner skips
    local_only = True
    processes = 1
    process_rank = 0

    def all_reduce(self, tensors, average=False, label=None):
        """Every tensor becomes the sum (or mean) of all of them."""
        if is_sparse_collective(tensors, label):
            merged = gather_sparse(tensors, average)
            for t in tensors:
                t.copy_(merged)
            return tensors
        acc = tensors[0]
        dev = acc.device
        for t in tensors[1:]:
            acc.add_(t if t.device == dev else t.to(dev))
        if average and len(tensors) > 1:
            acc.div_(len(tensors))
        for t in tensors[1:]:
            t.copy_(acc)
        return tensors

    def all_reduce_coalesced(self, per_var, label=None):
        """Each var's tensors (``per_var[k]``: one per place) become their sum, as
        ``all_reduce`` makes it var by var (the same adds in place order, so bit for bit),
        in one foreach add and one foreach copy (``compat.foreach``) per other place
        instead of two calls per var: a fused bucket in one process
        (``HandleCalls._fused_all_reduce``), with no flat buffer to fill and empty. Vars
        that are sparse or whose tensors lie on several devices go var by var."""
        dev = per_var[0][0].device if per_var else None
        # one look at every tensor (the usual bucket: dense, on one device), else var by var
        if all(not t.is_sparse and t.device == dev for ts in per_var for t in ts):
            fast = per_var
        else:
            fast = []
            for ts in per_var:
                if is_sparse_collective(ts, label) or any(t.device != ts[0].device
                                                          for t in ts):
                    self.all_reduce(ts, label=label)
                else:
                    fast.append(ts)
        if fast:
            accs = [ts[0] for ts in fast]
            add_, copy_ = compat.foreach("add_"), compat.foreach("copy_")
            for pi in range(1, len(fast[0])):
                add_(accs, [ts[pi] for ts in fast])
            for pi in range(1, len(fast[0])):
                copy_([ts[pi] for ts in fast], accs)
        return per_var

    def reduce(self, tensors, root, average=False, label=None):
        """``tensors[root]`` becomes the sum (or mean) of all; the others are unchanged."""
        if is_sparse_collective(tensors, label):
            return tensors[root].copy_(gather_sparse(tensors, average))
        acc = tensors[root]
        dev = acc.device
        for i, t in enumerate(tensors):
            if i != root:
                acc.add_(t if t.device == dev else t.to(dev))
        if average and len(tensors) > 1:
            acc.div_(len(tensors))
        return acc

    def broadcast(self, tensors, root, label=None):
        """Every tensor becomes a copy of ``tensors[root]``."""
        src = tensors[root]
        for i, t in enumerate(tensors):
            if i != root:
                t.copy_(src)
        return tensors

    def all_gather(self, shards, outs, label=None):
        """ZeRO's all-gather: ``outs[i]`` (1-D, ``W*S``) gets every rank's shard
        (``shards[r]``, 1-D, ``S``) concatenated in global rank order."""
        s = _shard_size(shards, outs, label)
        for out in outs:
            dev = out.device
            for r, shard in enumerate(shards):
                out[r * s:(r + 1) * s].copy_(shard if shard.device == dev else shard.to(dev))
        return outs

    def reduce_scatter(self, fulls, shards, label=None):
        """ZeRO's reduce-scatter: ``shards[i]`` (1-D, ``S``) becomes the sum over ranks, in
        rank order, of chunk ``i`` of their ``fulls`` (1-D, ``W*S``, zero-padded)."""
        s = _shard_size(shards, fulls, label)
        for i, shard in enumerate(shards):
            dev = shard.device
            acc = fulls[0][i * s:(i + 1) * s].to(dev, copy=True)
            for full in fulls[1:]:
                part = full[i * s:(i + 1) * s]
                acc.add_(part if part.device == dev else part.to(dev))
            shard.copy_(acc)
        return shards

    def begin_step(self, signature):
        """Called before each step's first collective with the graph's collective signature."""

    def close(self):
        """Release what the backend holds (NCCL communicators); the executor's ``close``
        calls it once its workers are joined. Idempotent; nothing to do here."""

    @staticmethod
    def flatten(tensors):
        """One contiguous buffer holding ``tensors`` back to back (for fused buckets)."""
        return torch.cat([t.reshape(-1) for t in tensors])
