"""The state every place starts from.

Policy. State the executor adds to a program (fp16 loss scaling, gradient
accumulators) starts at its defaults unless the scope already holds it. Then every
persistable var of the step programs is copied from the executor's scope to each
place: place 0 shares the scope's tensor when it is on place 0's device, every other
place gets its own copy, so all replicas start identical.

Invariants: a parameter without a value is an ``SSAExecError`` (the startup program
did not run); the values the programs read before writing are checked against their
declarations once, before any place holds them (``runtime.boundary``: the error names
the startup program's op that wrote a misfit); under ZeRO (``program.shard``) each place gets its global rank's slice of every
sharded parameter and optimizer state, cut from the full values in the executor's
scope (``shard_persistables``), and the executor's scope then drops the full values
that no place keeps whole (stage 3's parameters, every sharded optimizer state): a
process holds each sharded var once, as its shards; ``ParallelExecutor.get_var`` and
``gathered_state`` join them when asked.
"""

import torch

from ..core.dtypes import torch_dtype
from ..core.errors import SSAExecError
from ..runtime.boundary import check_value, entering_vars, startup_source

__all__ = ["init_added_state", "broadcast_persistables", "shard_persistables"]


def init_added_state(program, scope):
    """Write the defaults of the state the executor adds to ``program`` (loss scaling,
    zero gradient accumulators) to ``scope``, where it has none."""
    from ..program.accumulate import accumulators
    from ..program.amp import LOSS_SCALE_STATE
    block = program.global_block()
    for name, (dtype, value) in LOSS_SCALE_STATE.items():
        if block.find_var(name) is not None and scope.find_var(name) is None:
            scope.set_var(name, torch.tensor(value, dtype=torch_dtype(dtype)))
    for name, grad in accumulators(program).items():
        if scope.find_var(name) is None:
            if grad.shape is None or any(d < 0 for d in grad.shape):
                raise SSAExecError(f"gradient {grad.name!r} has shape {grad.shape}: an "
                                   "accumulator needs a fixed shape")
            scope.set_var(name, torch.zeros(grad.shape, dtype=torch_dtype(grad.dtype)))


def broadcast_persistables(programs, scope, places, local_scopes, owned, startup=None):
    """Copy every persistable of ``programs[0]`` from ``scope`` to ``local_scopes``.

    Parameters
    ----------
    programs : tuple of Program
        The step programs (the full step's first); the values any of them reads before
        writing are checked.
    scope : Scope
        Where the startup program wrote.
    places, local_scopes : list
        One scope per place.
    owned : dict
        ``{var name: owner place index}`` (ZeRO): only the owner gets that var.
    startup : Program, optional
        Named in the error about a misfit value.
    """
    block = programs[0].global_block()
    entering = {v.name for p in programs for v in entering_vars(p)}
    device = places[0].device
    for var in block.vars.values():
        if not var.persistable:
            continue
        src = scope.find_var(var.name)
        if src is None:
            if var.is_parameter:
                raise SSAExecError(f"parameter {var.name!r} has no value in the scope: run "
                                   "the startup program first or pass startup_program=")
            continue
        if var.name in entering:
            check_value(var, src, startup_source(startup, var.name), device, moves=True)
        for i, (place, ls) in enumerate(zip(places, local_scopes, strict=True)):
            if owned.get(var.name, i) != i:
                continue  # ZeRO: another place owns this optimizer state
            if i == 0 and src.device == place.device:
                ls.set_var(var.name, src)  # place 0 shares the user's scope
            else:
                ls.set_var(var.name, src.detach().to(place.device, copy=True))


def shard_persistables(layout, scope, places, local_scopes, first_rank=0, keep=None):
    """ZeRO: write each place's shards of the sharded parameters and state.

    Place ``i`` is global rank ``first_rank + i``; its ``p@SHARD`` is
    ``layout.shard_of(flat(p), rank)`` of the full value in ``scope`` (every process
    holds the same full values: rank 0's, after the start-up broadcast). A state var
    the scope lacks starts at zeros (as the optimizers' start-up programs make it).
    ``keep`` (a set of names, the step programs' persistables), when given: every other
    full value is then erased from ``scope`` once sliced, so the process does not hold
    a whole copy of what its places hold as shards (ZeRO's memory is the point).
    """
    if layout is None:
        return
    for sp in layout:
        for full, shard in sp.full_names().items():
            src = scope.find_var(full)
            if src is None:
                if full == sp.name:
                    raise SSAExecError(f"parameter {full!r} has no value in the scope: run "
                                       "the startup program first or pass startup_program=")
                src = torch.zeros(sp.shape, dtype=torch_dtype(sp.dtype))
            if list(src.shape) != sp.shape:
                raise SSAExecError(f"{full!r} has shape {list(src.shape)} in the scope, but "
                                   f"the program declares {sp.shape}")
            flat = src.detach().reshape(-1)
            for i, (place, ls) in enumerate(zip(places, local_scopes, strict=True)):
                part = layout.shard_of(flat, first_rank + i, sp.shard_size)
                ls.set_var(shard, part.to(place.device))
            if keep is not None and full not in keep:
                scope.erase(full)
