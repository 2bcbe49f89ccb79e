"""One process of a multi-process run: joining it, and leaving it when a step fails.

A ``ParallelExecutor`` is one process of a multi-process run when a ``torch.distributed``
group of more than one process exists (``se.distributed.init()`` under torchrun), when
``BuildStrategy(num_trainers>1)`` asks for one, or with ``distributed=True`` (a world of
one too); ``distributed=False`` keeps it local. Before the first step every process
checks that it built the same program, strategy and place count, then takes rank 0's
persistables (for a ZeRO shard, ``name@SHARD``, rank 0's full ``name``: each rank cuts
its own shard from it): a mismatch found later would crash or hang the backend in a
collective.
ZeRO (``zero_stage=1|2|3``) runs across processes; the ``reduce`` strategy does not.

If a step fails on this rank, the others wait in a collective it will never issue, so
the group is aborted (they raise ``DistributedError`` at once) and the executor refuses
further runs (``GroupSteps``); a failure every rank raised before any collective (the
debug check's, ``group_intact``) leaves the group as it is.

Invariant: the caller's ``BuildStrategy`` object is never written; when the group fills
``num_trainers``/``trainer_id`` it is a copy.
"""

from . import world as _distributed
from ..core import faults
from ..core.errors import DistributedError
from ..program.shard import SHARD_SUFFIX

__all__ = ["process_group_collective", "executor_collective", "agree_and_broadcast",
           "GroupSteps"]


def process_group_collective(build_strategy, distributed):
    """``(build_strategy, collective)``: the cross-process collective, or None for a local
    executor, and the strategy to use with it (a copy when the group fills it in)."""
    bs = build_strategy
    if distributed is False:
        if bs.num_trainers > 1:
            raise DistributedError(f"distributed=False contradicts BuildStrategy("
                                   f"num_trainers={bs.num_trainers})")
        return build_strategy, None
    info = _distributed.info()
    usable = info is not None and info.broken is None
    if bs.num_trainers == 1:
        if not usable:
            if distributed:
                raise DistributedError("distributed=True but there is no process group: "
                                       "launch with torchrun and call "
                                       "se.distributed.init() first")
            return build_strategy, None
        if info.world_size == 1 and not distributed:
            # a world of one: nothing to talk to unless asked (tests do)
            return build_strategy, None
        if info.world_size > 1:
            import copy
            bs = copy.copy(bs)  # the user's strategy object stays as given
            bs.num_trainers, bs.trainer_id = info.world_size, info.rank
    elif not usable:
        why = f" (it was aborted: {info.broken})" if info is not None else ""
        raise DistributedError(f"BuildStrategy(num_trainers={bs.num_trainers}) needs a "
                               f"process group{why}: launch with torchrun and call "
                               "se.distributed.init() first (docs/distributed.md)")
    elif (bs.num_trainers, bs.trainer_id) != (info.world_size, info.rank):
        raise DistributedError(f"BuildStrategy(num_trainers={bs.num_trainers}, trainer_id="
                               f"{bs.trainer_id}) does not match the process group (world "
                               f"size {info.world_size}, rank {info.rank}); use "
                               "se.distributed.build_strategy()")
    if bs.reduce_strategy != "all_reduce":
        # the owner-and-broadcast graph has no cross-process form; ZeRO (zero_stage) does
        raise DistributedError("reduce_strategy='reduce' runs in one process only; use "
                               "'all_reduce' with several processes (with zero_stage=1|2|3 "
                               "to shard the optimizer state, gradients and parameters)")
    from .group_collective import ProcessGroupCollective
    return bs, ProcessGroupCollective(debug=_distributed.debug_enabled(bs), timeout=info.timeout)


def executor_collective(places, dist_collective):
    """``(collective, backend line)`` of an executor over ``places``: the cross-process
    ``dist_collective`` when there is one, else the local one ``runtime.nccl`` chooses."""
    if dist_collective is None:
        from ..runtime.nccl import choose_local_collective
        collective, _, backend = choose_local_collective(places)
        return collective, backend
    return dist_collective, ("collective backend: torch.distributed process group "
                             f"({_distributed.info().backend})")


def agree_and_broadcast(coll, build_strategy, places, program, scope):
    """Check across processes that all built the same ``program`` (its persistables),
    ``build_strategy`` and number of ``places``, then broadcast rank 0's persistables
    (in ``scope``) to every process."""
    key = tuple((s, getattr(build_strategy, s)) for s in build_strategy.__slots__
                if s not in ("trainer_id", "debug_graphviz_path"))
    # the debug check is a collective of its own: it must be on everywhere or nowhere
    items = [("local places", len(places)), ("build strategy", key),
             ("debug mode", coll.debug)]
    tensors, names = [], {}
    for var in program.global_block().vars.values():
        if var.persistable:
            # a ZeRO shard is each rank's own, cut afterwards from the full value in the
            # scope (a stage-3 parameter, a sharded state var: no longer persistables of
            # the run program): that full value is what rank 0 gives everyone
            full = var.name[:-len(SHARD_SUFFIX)] if var.name.endswith(SHARD_SUFFIX) else None
            names.setdefault(full or var.name, var.name)
    for name, declared in names.items():
        t = scope.find_var(name)
        items.append((declared, None if t is None else list(t.shape),
                      None if t is None else str(t.dtype).replace("torch.", "")))
        if t is not None:
            tensors.append(t)
    coll.agree("the program's persistables, the build strategy, the number of places "
               "and the debug mode",
               items, describe=lambda it: " ".join(str(x) for x in it),
               hint="Every process must build the same program with the same "
                    "BuildStrategy and as many places.")
    coll.broadcast_from(tensors, src=0, label="broadcast of the persistables from rank 0")


class GroupSteps:
    """The steps of one process of a multi-process run: a failed one aborts the group.

    Attributes
    ----------
    failed : str or None
        The first line of the error that stopped an earlier step, once one did.
    """

    def __init__(self):
        self.failed = None

    def check(self):
        """``DistributedError`` once a step failed: the group is gone."""
        if self.failed is not None:
            raise DistributedError(f"an earlier step of this multi-process run failed "
                                   f"({self.failed}); the process group was shut down: "
                                   "restart every process")

    def run(self, runner, sync, step):
        """Run ``runner`` as step number ``step`` (1-based) of the run."""
        faults.arm(step)  # SSAEXEC_FAULT's kill@step: this step's first collective
        try:
            return runner.run(sync)
        except BaseException as e:
            if getattr(e, "group_intact", False):
                raise  # the debug check: every rank raised it, before any collective
            # this rank stopped mid-step: the others wait in a collective it will never
            # issue, so drop the group's connections and let them fail now
            self.failed = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            _distributed.abort(f"rank {_distributed.rank()}: {self.failed}")
            raise
