"""Back to PyTorch: copy what an executor trained into the ``nn.Module`` it was imported from.

``write_back(pe, module)`` reads every parameter and buffer of ``module`` from the
executor's places under the var name the importer gave it (``lower``: the
module's own ``named_parameters()``/``named_buffers()`` names; of tied tensors,
one ``Parameter`` under two names, the first name) and copies it into the
module's tensor in place, under ``torch.no_grad()``, so optimizers, hooks and
references holding those tensors see the trained values and
``torch.save(module.state_dict())`` saves them.

Several places:

* parameters are equal on every place (the gradients are all-reduced, every
  place applies the same update); they come from ``place``;
* batch norm's ``running_mean``/``running_var`` differ: each place normalised
  its own share of the batch and updated its own statistics (as DDP without
  SyncBatchNorm does, where rank 0's are the ones saved). ``stats="mean"``
  (default) writes their mean over the places, the statistics of the whole
  batch's shares averaged; ``stats="place"`` takes them from ``place``, as
  saving DDP's rank 0 does. This holds for every floating-point buffer; a
  buffer equal on all places is copied exactly;
* integer buffers (``num_batches_tracked``, equal on every place) come from
  ``place``.

In a multi-process run each process holds its own places: ``write_back`` reads
this process's only (the mean is over them).

Nothing is written unless everything matches: ``ProgramError`` names the module
names the program lacks (or has no value for), the program parameters the module
lacks, and the shape or dtype mismatches.
"""

import torch

from ...core.dtypes import DTYPES, dtype_name
from ...core.errors import ProgramError, SSAExecError

__all__ = ["write_back"]

STATS = ("mean", "place")
LOSS_FN_PREFIX = "loss_fn."


def write_back(pe, module, place=0, stats="mean"):
    """Copy trained parameters and buffers from ``pe``'s places into ``module``.

    Parameters
    ----------
    pe : ssaexec.ParallelExecutor
        The executor that trained the program imported from ``module`` (or one
        sharing its values, ``share_vars_from``).
    module : torch.nn.Module
        The module ``from_torch`` imported (or one with the same names and shapes);
        its tensors are overwritten in place.
    place : int
        The place parameters and integer buffers are read from (and the
        floating-point buffers with ``stats="place"``).
    stats : {"mean", "place"}
        Floating-point buffers (batch norm's running statistics): their mean over
        the places, or the values of ``place``.

    Returns
    -------
    torch.nn.Module
        ``module``.

    Raises
    ------
    ProgramError
        ``module`` does not match the program: names missing on either side,
        shape or dtype mismatches. Nothing is written then.
    SSAExecError
        A bad ``place`` or ``stats``, or ``pe`` is not an executor.
    """
    if not isinstance(module, torch.nn.Module):
        raise SSAExecError(f"write_back expects a torch.nn.Module, got {type(module).__name__}")
    if stats not in STATS:
        raise SSAExecError(f"write_back: stats must be one of {STATS}, got {stats!r}")
    places = getattr(pe, "places", None)
    program = getattr(pe, "program", None)
    if places is None or program is None or not hasattr(pe, "get_var"):
        raise SSAExecError(f"write_back expects a ParallelExecutor, got {type(pe).__name__}")
    if not 0 <= place < len(places):
        raise SSAExecError(f"write_back: place {place} does not exist: the executor has "
                           f"{len(places)} places")
    block = program.global_block()
    params = dict(module.named_parameters())
    tensors = {**params, **dict(module.named_buffers())}

    missing, mismatched = [], []
    for name, t in tensors.items():
        var = block.find_var(name)
        if var is None or not var.persistable:
            missing.append(name)
        elif t.dtype not in DTYPES.values() or var.dtype != dtype_name(t.dtype):
            mismatched.append(f"{name}: dtype {var.dtype} in the program, {t.dtype} in the "
                              "module")
    # the state of a loss_fn that is a module is the importer's "loss_fn.*", not the module's
    extra = [v.name for v in block.vars.values() if v.is_parameter and v.name not in params
             and not v.name.startswith(LOSS_FN_PREFIX)]
    if missing or extra or mismatched:
        raise ProgramError(_mismatch(module, missing, extra, mismatched))

    values = {}
    for name, t in tensors.items():
        try:
            value = _read(pe, name, place, len(places), t, stats, name in params)
        except SSAExecError as e:
            missing.append(f"{name} ({e})")
            continue
        if list(value.shape) != list(t.shape):
            mismatched.append(f"{name}: shape {list(value.shape)} on the places, "
                              f"{list(t.shape)} in the module")
        values[name] = value
    if missing or mismatched:
        raise ProgramError(_mismatch(module, missing, [], mismatched))
    with torch.no_grad():
        for name, t in tensors.items():
            t.copy_(values[name])
    return module


def _read(pe, name, place, n, like, stats, is_param):
    if is_param or stats == "place" or not like.is_floating_point() or n == 1:
        return pe.get_var(name, place).to(like.device)
    per_place = [pe.get_var(name, i).to(like.device) for i in range(n)]
    if all(torch.equal(per_place[0], v) for v in per_place[1:]):
        return per_place[0]
    return torch.stack([v.double() for v in per_place]).mean(0).to(like.dtype)


def _mismatch(module, missing, extra, mismatched):
    parts = []
    if missing:
        parts.append(f"not in the program (or without a value on the places): {missing}")
    if extra:
        parts.append(f"program parameters the module does not have: {extra}")
    if mismatched:
        parts.append("; ".join(mismatched))
    return (f"write_back: {type(module).__name__} does not match the executor's program: "
            + "; ".join(parts) + ". Pass the module the program was imported from")
