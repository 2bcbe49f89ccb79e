"""Export to ``torch.distributed.checkpoint`` (DCP): the model's state for torch tools.

``export_dcp(source, directory)`` writes the model's tensors, full (gathered under
ZeRO), as a DCP folder that ``torch.distributed.checkpoint.load(model.state_dict(),
checkpoint_id=directory)`` reads into a plain ``nn.Module``, with or without a process
group; torchtitan and FSDP2 read the same folders.

Keys. The model's own names: a program imported with ``se.from_torch`` names each var
after the module's ``named_parameters()``/``named_buffers()`` (``frontends.torch``), so
its var names are the module's ``state_dict()`` keys; a builder program's keys are its
var names. Given ``module=``, the keys are exactly ``module.state_dict()``'s: a tied
tensor (one ``Parameter`` under two names, one var in the program) is written under
each of its names, and every key must have a var of its shape and dtype
(``ProgramError`` naming those that do not, nothing written).

What is the model's state (without ``module=``): the parameters, and the persistables
no optimizer op reads or writes and that the executor did not add (a batch norm's
running statistics, not moments, beta powers, the learning rate, ``@LR.step``,
``@AMP.*``, ``*@ACC``). Optimizer state stays in ssaexec's checkpoints (exact resume
needs it; a DCP folder is for torch tools). Values are the gathered state: parameters
(equal on every place), and buffers as place 0 holds them, as a checkpoint has them
(``write_back`` averages a batch norm's statistics over the places instead).

Policy:

* **Rank 0 writes, every process calls** (under ZeRO, gathering is a collective);
  the DCP files are written by one writer with ``no_dist=True``, so no process group
  is needed to read them.
* **Atomic.** The folder is written as ``.dcp-*.tmp`` beside ``directory`` (files
  fsynced by DCP), then renamed into place; an existing ``directory`` is replaced only
  when it is a DCP folder (it holds ``.metadata``) or empty, never a folder of
  anything else, and never through a symlink. A crash leaves the old folder or the new
  one (between the two renames, the old one as ``.dcp-old-*.tmp`` beside it).
* **ssaexec never reads a DCP folder**: DCP's ``.metadata`` is a pickle, and loading
  it runs whatever code it names (``docs/security.md``). Resume from ssaexec's own
  checkpoints (safetensors); export to DCP only to hand the model to torch.
"""

import os
import shutil
import stat
import tempfile
import warnings

import torch

from ..core.errors import ProgramError, SSAExecError
from ..core.safe_files import fsync_folder
from .checkpoint import _cpu, _full_values, _target, read_checkpoint, STATE

__all__ = ["export_dcp", "model_state_names", "check_directory"]

TEMP_PREFIX = ".dcp-"


def model_state_names(program):
    """The model's state among ``program``'s persistables (module docstring), in order."""
    block = program.global_block()
    optimizer = set()
    for op in block.ops:
        if op.role == "optimize":
            optimizer.update(op.input_names())
            optimizer.update(op.output_names())
    return [v.name for v in block.vars.values() if v.persistable and (
        v.is_parameter or (v.name not in optimizer and "@" not in v.name))]


def export_dcp(source, directory, program=None, module=None):
    """Write the model's state of ``source`` to the DCP folder ``directory``.

    Parameters
    ----------
    source : ParallelExecutor, Scope, or str / os.PathLike
        An executor (every process of its run calls this; rank 0 writes), a ``Scope``
        with ``program``, or the path of an ssaexec checkpoint (gathered or sharded;
        needs ``program`` or ``module`` to tell the model's state from the optimizer's).
    directory : str or os.PathLike
    program : Program, optional
        Whose model state is exported (for a Scope or a checkpoint path).
    module : torch.nn.Module, optional
        Export under ``module.state_dict()``'s keys, tied names included.

    Returns
    -------
    list of str
        The keys written (on every process).
    """
    if isinstance(source, (str, os.PathLike)) and program is None and module is None:
        raise SSAExecError("export_dcp of a checkpoint file needs program= or module= "
                           "(which of its tensors are the model's)")
    values, names = _values(source, program)
    state = _keyed(values, names, module)
    if _writer(source):
        _write(state, os.fspath(directory))
    return sorted(state)


def _values(source, program):
    """({name: full CPU tensor}, the model's state names or None)."""
    if isinstance(source, (str, os.PathLike)):
        _, tensors = read_checkpoint(source)
        tensors = {n: t for n, t in tensors.items() if not n.startswith(STATE)}
        return tensors, model_state_names(program) if program is not None else None
    t = _target(source, program)
    values = _full_values(t, source, "export")
    prog = program if program is not None else getattr(source, "program", None)
    return values, model_state_names(prog) if prog is not None else None


def _writer(source):
    bs = getattr(source, "build_strategy", None)
    return bs is None or bs.trainer_id == 0


def _keyed(values, names, module):
    """{DCP key: tensor}: ``module``'s state_dict keys, or the model state's names."""
    if module is None:
        missing = [n for n in names if n not in values]
        if missing:
            raise ProgramError(f"export_dcp: no value for {', '.join(missing[:8])}")
        return {n: values[n] for n in names}
    if not isinstance(module, torch.nn.Module):
        raise SSAExecError(f"export_dcp: module must be a torch.nn.Module, got "
                           f"{type(module).__name__}")
    first = {}  # id of a module tensor -> the first name of it that has a value (tied)
    for name, t in [*module.named_parameters(remove_duplicate=False),
                    *module.named_buffers(remove_duplicate=False)]:
        if name in values:
            first.setdefault(id(t), name)
    out, problems = {}, []
    for key, like in module.state_dict(keep_vars=True).items():
        source = key if key in values else first.get(id(like))
        if source is None:
            problems.append(f"{key}: not in the program")
            continue
        value = values[source]
        if list(value.shape) != list(like.shape) or value.dtype != like.dtype:
            problems.append(f"{key}: {list(value.shape)} {value.dtype} in the program, "
                            f"{list(like.shape)} {like.dtype} in the module")
            continue
        out[key] = value
    if problems:
        raise ProgramError(f"export_dcp: {type(module).__name__} does not match the program: "
                           + "; ".join(problems[:8]) + (" ..." if len(problems) > 8 else ""))
    return out


def check_directory(directory):
    """Whether ``directory`` may take an export: True when one is there to replace (a
    DCP export, or an empty folder), False when nothing is; ``SSAExecError`` for
    anything else (a file, a symlink, a folder of other files, a missing parent)."""
    directory = os.fspath(directory)
    parent = os.path.dirname(os.path.abspath(directory))
    if not os.path.isdir(parent):
        raise SSAExecError(f"{directory}: the folder {parent} does not exist")
    try:
        mode = os.lstat(directory).st_mode
    except FileNotFoundError:
        return False
    if not stat.S_ISDIR(mode):
        raise SSAExecError(f"{directory}: exists and is not a folder (a DCP export is a "
                           "folder): not replaced")
    entries = os.listdir(directory)
    if entries and ".metadata" not in entries:
        raise SSAExecError(f"{directory}: a folder that is not a DCP export (no "
                           ".metadata): not replaced")
    return True


def _write(state, directory):
    """DCP files in a temporary folder, then renamed into place (module policy)."""
    import torch.distributed.checkpoint as dcp
    parent = os.path.dirname(os.path.abspath(directory))
    replace = check_directory(directory)
    tmp = tempfile.mkdtemp(prefix=TEMP_PREFIX, suffix=".tmp", dir=parent)
    try:
        with warnings.catch_warnings():  # "assuming ... a single process": it is, by design
            warnings.simplefilter("ignore", UserWarning)
            dcp.save({k: _cpu(v) for k, v in state.items()},
                     storage_writer=dcp.FileSystemWriter(tmp, sync_files=True), no_dist=True)
        fsync_folder(tmp)
        if replace:
            old = tempfile.mkdtemp(prefix=TEMP_PREFIX + "old-", suffix=".tmp", dir=parent)
            os.replace(directory, old)  # onto the empty folder mkdtemp made
            os.replace(tmp, directory)
            fsync_folder(parent)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, directory)
            fsync_folder(parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
