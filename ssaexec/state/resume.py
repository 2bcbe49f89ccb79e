"""``Checkpoints``: a folder of checkpoints of one training run, and its exact resume.

A crash should cost only the steps since the last checkpoint, and the run resumed from it
should be the run that crashed, bit for bit. ``torchrun --max-restarts`` restarts the
processes; this module is the other half: what a checkpoint holds and how a restarted
process continues from it.

What a checkpoint holds (``step-<8 digits>.safetensors``, one ``checkpoint.save_checkpoint``
file; under ZeRO, one file per rank, ``sharded``): every persistable (parameters,
optimizer state, the learning-rate schedule's counter ``@LR.step``, fp16 loss scaling,
gradient accumulators), the executor's run counter (the per-step seeds of random ops are a
function of it, ``runtime.rng``), each rank's torch RNG states (CPU, and CUDA of its
places), the data position (``sampler.EpochSampler``), the step, and the world size.

Policy and invariants:

* **Rank 0 writes, every rank calls.** Parameters and optimizer state are the same on
  every rank after a step; the RNG states are gathered to rank 0 (one small collective),
  so ``save`` is a collective too. Only files whose rename completed carry the name
  pattern, so a save killed half way is never loaded; its temporary file is removed by
  the next ``resume``.
* **A save returns once its checkpoint is complete** (several processes: a barrier after
  rank 0's rename and rotation). A rank past its ``save`` may run ahead, crash or be
  stopped, and the restart still resumes from this checkpoint or a newer one.
* **The folder is shared.** Every rank loads the checkpoint rank 0 chose (its name is
  broadcast), from the same folder: on several machines it must be shared storage. A rank
  that cannot read it raises ``DistributedError`` naming the file.
* **Newest valid wins.** ``resume`` takes the newest checkpoint that reads and whose
  training state is valid (the step, the world size, every RNG state tried on a
  scratch generator); one that is not (a disk error, a bad RNG state) is named on
  stderr and the one before it is tried. The chosen one is checked whole before any
  of it is loaded (``load_checkpoint``'s ``check``, which also tries the data position
  on a copy of the sampler): a refusal loads nothing, and no parameter is left half
  restored. A data position of another sample order (the run's settings changed) is
  an error, not a reason to fall back.
* **Only what a save made.** Only regular files are opened, never through a symlink,
  never blocking (``safe_files.open_regular``): a FIFO named like a checkpoint is
  skipped, not waited on. A dead save's temporary file (``.ckpt-*.tmp``, a regular
  file) is removed; a folder, FIFO or symlink of such a name is left alone (never
  followed) and named on stderr.
* **Keep the last few.** After a save, all but the ``keep`` newest are deleted (rank 0).
* **Another world size** is a resume like any other: parameters and optimizer state do
  not depend on it, the sampler reshards the same next global batch
  (``EpochSampler.reshard``), and rank ``r`` takes the RNG state saved by rank
  ``r % saved world size``.
* **ZeRO shards** (an executor with a ``shard_layout()``): each global rank writes its own
  shard file beside ``step-N.safetensors``, which is rank 0's and is written last
  (``checkpoint``, ``sharded``), so every rank calls ``save`` for its files too. Only
  the entry file makes a checkpoint: shard files of a step without one (a save that
  died) are removed by ``resume``, and those of a checkpoint rotated out with it. A
  sharded checkpoint resumes on any world size and into a run without ZeRO, and a plain
  one into a ZeRO run (each var resharded when loaded).
"""

import copy
import json
import os
import re
import sys

import torch

from ..dist import world as distributed
from .checkpoint import STATE, load_checkpoint, read_checkpoint, save_checkpoint
from .sharded import remove_regular as _remove, stale_shards
from ..core.errors import DistributedError, SSAExecError

__all__ = ["Checkpoints"]

_NAME = re.compile(r"^step-(\d{8})\.safetensors$")
_SHARD = re.compile(r"^step-(\d{8})\.shard-\d{5}-of-\d{5}-[0-9a-f]{16}\.safetensors$")
_TEMP = re.compile(r"^\.ckpt-.*\.tmp$")
META = "training"  # the header entry with the step, the data position and the world size


class Checkpoints:
    """Save a run every ``every`` steps to ``directory`` and resume it exactly.

    Parameters
    ----------
    directory : str or os.PathLike
        Created if missing. Shared by every rank (see the module docstring).
    every : int, optional
        ``maybe_save`` saves after every ``every``-th step (None: only ``save``).
    keep : int
        Checkpoints kept (the newest).
    log : callable, optional
        Where rank 0's one-line notes go (default: stderr).

    ``last`` is the path of the newest checkpoint saved or resumed from (None before).
    """

    __slots__ = ("directory", "every", "keep", "log", "last", "last_step")

    def __init__(self, directory, every=None, keep=3, log=None):
        self.directory = os.fspath(directory)
        if every is not None and (not isinstance(every, int) or isinstance(every, bool)
                                  or every < 1):
            raise SSAExecError(f"checkpoint every must be a positive number of steps, "
                               f"got {every!r}")
        if not isinstance(keep, int) or isinstance(keep, bool) or keep < 1:
            raise SSAExecError(f"keep must be at least 1 checkpoint, got {keep!r}")
        self.every, self.keep = every, keep
        self.log = log or (lambda s: print(s, file=sys.stderr, flush=True))
        self.last, self.last_step = None, None
        try:
            os.makedirs(self.directory, exist_ok=True)
        except OSError as e:  # a file in the way, a read-only parent: say which folder
            raise SSAExecError(f"checkpoint folder {self.directory}: cannot be made or used "
                               f"({e.strerror or e})") from None

    # --- the folder -----------------------------------------------------------------------
    def path(self, step):
        """Where the checkpoint after ``step`` steps goes."""
        return os.path.join(self.directory, f"step-{int(step):08d}.safetensors")

    def steps(self):
        """The steps of the complete checkpoints in the folder, oldest first: regular
        files of the checkpoint name pattern (a folder, FIFO or symlink of such a name
        is not a checkpoint: never loaded, never counted, never deleted)."""
        return sorted(step for step, regular in self._named() if regular)

    def _named(self):
        """(step, is a regular file) of every entry named like a checkpoint; the kind is
        the directory entry's (``lstat``): nothing is opened or followed."""
        with os.scandir(self.directory) as entries:
            return [(int(m.group(1)), e.is_file(follow_symlinks=False))
                    for e in entries for m in [_NAME.match(e.name)] if m]

    # --- saving ---------------------------------------------------------------------------
    def maybe_save(self, pe, step, sampler=None):
        """``save`` when ``step`` is a multiple of ``every``; returns the path or None."""
        if self.every is None or step % self.every:
            return None
        return self.save(pe, step, sampler)

    def save(self, pe, step, sampler=None):
        """Checkpoint ``pe`` after ``step`` steps (every rank calls it; rank 0 writes).

        Returns the checkpoint's path.
        """
        rngs = _rng_states(pe)
        world = distributed.world_size()
        if world > 1:
            rngs = distributed.collective().gather_objects(rngs, "gather of the RNG states")
        else:
            rngs = [rngs]
        path = self.path(step)
        zero = pe.shard_layout() if hasattr(pe, "shard_layout") else None
        if distributed.rank() == 0 or zero is not None:  # under ZeRO every rank writes
            state = {f"rng.{r}.{k}": t for r, states in enumerate(rngs)
                     for k, t in states.items()}
            training = {"step": int(step), "world_size": world,
                        "sampler": sampler.state_dict() if sampler is not None else None}
            save_checkpoint(path, pe, state=state, meta={META: json.dumps(training)})
        if distributed.rank() == 0:  # all but the newest ``keep``
            for old in self.steps()[:-self.keep]:
                if _remove(self.path(old)):  # the entry first: then it is no checkpoint
                    stale_shards(self.path(old))
        if world > 1:  # no rank runs ahead of a checkpoint still being written
            distributed.barrier()
        self.last, self.last_step = path, int(step)
        return path

    def _shard_files(self):
        """(step, name) of every entry named like a checkpoint's shard file."""
        with os.scandir(self.directory) as entries:
            return [(int(m.group(1)), e.name)
                    for e in entries for m in [_SHARD.match(e.name)] if m]

    # --- resuming -------------------------------------------------------------------------
    def resume(self, pe, sampler=None):
        """Continue from the newest checkpoint, if any: load it into ``pe`` (every place),
        restore this rank's RNG states and the sampler's position (resharded for this
        world). Every rank calls it. Returns the step to continue from (0: none found).
        """
        choice, skipped = self._choose() if distributed.rank() == 0 else (None, 0)
        if distributed.world_size() > 1:
            choice = distributed.collective().gather_objects(
                choice, "broadcast of the checkpoint to resume from")[0]
        if choice is None:
            if distributed.rank() == 0:
                self.log(f"no {'usable ' if skipped else ''}checkpoint in {self.directory}"
                         f"{f' ({skipped} skipped, above)' if skipped else ''}: starting at "
                         "step 0")
            return 0
        path = self.path(choice)
        state, checked = {}, {}

        def check(meta, kept):  # before anything is loaded (load_checkpoint's check)
            checked["training"] = _check_training(meta, kept, path, sampler)
        try:
            load_checkpoint(path, pe, state=state, check=check, follow_symlinks=False)
        except SSAExecError as e:
            if distributed.world_size() > 1 and not os.path.exists(path):
                raise DistributedError(
                    f"rank {distributed.rank()}: cannot read {path}, the checkpoint rank 0 "
                    "resumes from: the checkpoint folder must be shared by every machine "
                    "(it is not on this one)") from e
            raise
        training = checked["training"]
        if sampler is not None:
            sampler.load_state_dict(training["sampler"])
            sampler.reshard()
        _set_rng_states(pe, state, training["world_size"])
        self.last, self.last_step = path, training["step"]
        if distributed.rank() == 0:
            self.log(f"resumed from {path} (step {training['step']}, saved by "
                     f"{training['world_size']} process(es), now {distributed.world_size()})")
        return training["step"]

    def _choose(self):
        """Rank 0: (the newest step whose checkpoint reads and whose training state is
        valid, or None; how many newer ones were skipped), after removing dead temporary
        files. Whether the data position fits the caller's sampler is not asked here: a
        mismatch is the caller's setting, refused when loading, never a reason to fall
        back to an older checkpoint (or to none, and start over)."""
        for name in sorted(os.listdir(self.directory)):
            if _TEMP.match(name):  # a save killed before its rename: never a checkpoint
                path = os.path.join(self.directory, name)
                if _remove(path):
                    self.log(f"removed {name} in {self.directory}: a save that did not finish")
                else:
                    self.log(f"ignoring {path}: named like a save's temporary file, but "
                             "not a file a save makes (left as it is)")
        named = sorted(self._named())
        for step, regular in named:
            if not regular:
                self.log(f"ignoring {self.path(step)}: named like a checkpoint, but not a "
                         "regular file (left as it is)")
        complete = {step for step, regular in named if regular}
        orphans = sorted((step, name) for step, name in self._shard_files()
                         if step not in complete)
        for step, name in orphans:  # a sharded save that died before its entry file
            if _remove(os.path.join(self.directory, name)):
                self.log(f"removed {name} in {self.directory}: a shard of a save that did "
                         "not finish")
        skipped = 0
        for step in reversed(self.steps()):
            path = self.path(step)
            try:
                meta, state = _peek(path)
                _check_training(meta, state, path)
                return step, skipped
            except Exception as e:  # noqa: BLE001 - unreadable: say so, try the one before
                self.log(f"skipping {path}: {type(e).__name__}: {e}")
                skipped += 1
        return None, skipped


def _peek(path):
    """(header metadata, training-state tensors) of the checkpoint at ``path``: a regular
    file, never a symlink, read whole and checked against its digest
    (``checkpoint.read_checkpoint``), so a damaged newest checkpoint is passed over."""
    meta, tensors = read_checkpoint(path, follow_symlinks=False)
    return meta, {k[len(STATE):]: t for k, t in tensors.items() if k.startswith(STATE)}


def _check_training(meta, state, path, sampler=None):
    """The training entry of a checkpoint, once its data position (for ``sampler``) and
    every RNG state were checked; ``SSAExecError`` naming what is wrong otherwise.

    Nothing is changed: the data position is tried on a copy of the sampler, each RNG
    state on a fresh generator of its device (torch's own check of a state).
    """
    training = _training_meta(meta, path)
    if sampler is not None:
        if training["sampler"] is None:
            raise SSAExecError(f"{path} holds no data position (saved without a sampler)")
        try:
            copy.copy(sampler).load_state_dict(training["sampler"])
        except SSAExecError as e:
            raise SSAExecError(f"{path}: {e}") from None
    for key, t in state.items():
        generator = _rng_key(key, training["world_size"])
        if generator is None:
            continue
        if t.dtype != torch.uint8 or t.dim() != 1:
            raise SSAExecError(f"{path}: RNG state {key!r} is a {str(t.dtype)[6:]} tensor of "
                               f"shape {list(t.shape)}, not a generator state (1-d uint8)")
        if generator == "cpu":
            scratch = torch.Generator()
        elif _cuda_here(generator):
            scratch = torch.Generator(device=f"cuda:{generator[4:]}")
        else:
            continue  # a device this process does not have: _set_rng_states skips it too
        try:
            scratch.set_state(t)
        except (RuntimeError, ValueError, TypeError) as e:
            raise SSAExecError(f"{path}: RNG state {key!r} is not a state of a torch "
                               f"{generator} generator ({str(e).splitlines()[0][:200]})") \
                from None
    return training


def _rng_key(key, saved_world):
    """``'cpu'`` or ``'cuda<i>'`` for a state key ``rng.<rank>.<generator>`` of a saved
    rank, else None (not an RNG state; ignored as before)."""
    parts = key.split(".")
    if len(parts) != 3 or parts[0] != "rng" or not parts[1].isdigit() or len(parts[1]) > 9 \
            or int(parts[1]) >= saved_world:
        return None
    generator = parts[2]
    if generator == "cpu" or (generator.startswith("cuda") and generator[4:].isdigit()
                              and len(generator) <= 12):
        return generator
    return None


def _cuda_here(generator):
    return torch.cuda.is_available() and int(generator[4:]) < torch.cuda.device_count()


def _training_meta(meta, path):
    text = meta.get(META)
    try:
        training = json.loads(text) if isinstance(text, str) and len(text) < 1 << 16 else None
    except ValueError:
        training = None
    ok = isinstance(training, dict) and isinstance(training.get("step"), int) and \
        isinstance(training.get("world_size"), int) and training["world_size"] >= 1 and \
        isinstance(training.get("sampler"), (dict, type(None)))
    if not ok:
        raise SSAExecError(f"{path}: not a checkpoint of a training run (no valid "
                           f"{META!r} entry in its header)")
    return training


def _rng_states(pe):
    states = {"cpu": torch.get_rng_state()}
    for p in getattr(pe, "places", ()):
        if p.is_cuda:
            states[f"cuda{p.device_index}"] = torch.cuda.get_rng_state(p.device_index)
    return states


def _set_rng_states(pe, state, saved_world):
    # every state was checked (_check_training) before the checkpoint was loaded
    r = distributed.rank() % saved_world
    for key, t in state.items():
        generator = _rng_key(key, saved_world)
        if generator is None or not key.startswith(f"rng.{r}."):
            continue
        if generator == "cpu":
            torch.set_rng_state(t)
        elif _cuda_here(generator):
            torch.cuda.set_rng_state(t, int(generator[4:]))
