"""Checkpoints: every persistable of a training run in one safetensors file.

``save_checkpoint(path, pe)`` writes parameters, optimizer state (moments, beta powers),
the LR schedule's step counter, fp16 loss-scaling state and gradient accumulators, with
metadata: the format, the program's persistables (name -> shape, dtype) and their hash,
the number of places and runs. ``load_checkpoint(path, pe)`` checks the file against the
executor's program and writes every value to every place.

Policy:

* **No code in a checkpoint.** safetensors holds raw tensors and a JSON header, so
  loading never runs code (no pickle); the file opens with the ``safetensors`` library
  alone.
* **Atomic.** The file is written next to ``path`` under a temporary name
  (``.ckpt-*.tmp``), flushed to disk, renamed over ``path`` (replacing a symlink there,
  never writing through it), and the rename itself flushed (the folder's fsync): a
  crash leaves the old checkpoint or the new one, never half of one
  (``SSAEXEC_FAULT=kill@save:N`` kills between the write and the rename, ``faults``).
  The mechanics are ``safe_files.atomic_write``, shared with every file ssaexec saves.
* **All or nothing.** Loading reads and checks the whole file first (header, every
  tensor, the fit to the program, and the caller's ``check`` of the training state)
  and only then writes values into the scopes: a refused checkpoint loads nothing.
  Only a regular file is opened (``safe_files.open_regular``): a FIFO is refused, not
  waited on.
* **Training state beside the program's.** ``state`` tensors (RNG states, say) are kept
  under ``@STATE.<name>`` and ``meta`` strings in the header; neither is checked against
  the program, and ``load_checkpoint(..., state={})`` hands them back (``resume``).
* **Places.** Values come from place 0, or for ZeRO-sharded optimizer state from the
  owner place; loading writes every place (the owners only, under ZeRO), so a run can
  resume on another number of places.
* **Untrusted metadata.** The header is the file's text: a ``runs`` that is not a
  count, or a file whose data does not match its header, is an ``SSAExecError``.
* **Damage is detected.** safetensors keeps no checksum, so a bit flipped in the data
  would load as a wrong (NaN, say) parameter. The header holds ``data_digest``, a
  BLAKE2b digest of every tensor's name, dtype, shape and bytes, checked when the file
  is read, before anything is loaded (``Checkpoints.resume`` then falls back to the
  checkpoint before). Files saved before the digest existed load without it.
* **Mismatch is an error.** Loading into a program whose persistables differ (missing,
  extra, other shape or dtype) raises ``SSAExecError`` naming them. State an executor
  adds by itself (``@AMP.*`` loss scaling, ``*@ACC`` accumulators) may be absent on
  either side: it starts at its default.
"""

import hashlib
import json
import os

import torch

from ..core import faults
from ..core.errors import SSAExecError
from ..runtime.boundary import check_values
from ..core.safe_files import atomic_write, fd_path, open_input

__all__ = ["save_checkpoint", "load_checkpoint", "read_checkpoint", "save_parameters", "FORMAT"]

FORMAT = "ssaexec-checkpoint/1"
STATE = "@STATE."  # prefix of the training-state tensors (not the program's)
TEMP_PREFIX = ".ckpt-"  # a save's temporary file: .ckpt-XXXX.tmp in the target's folder
_RESERVED = ("format", "persistables", "program_hash", "places", "runs", "data_digest")


def _optional(name):
    return name.startswith("@AMP.") or name.endswith("@ACC")


def _safetensors():
    try:
        import safetensors.torch as st
    except ImportError:
        raise SSAExecError("checkpoints need the safetensors package: pip install safetensors "
                           "(or pip install 'ssaexec[checkpoint]')") from None
    return st


def _persistables(program):
    return [v for v in program.global_block().vars.values() if v.persistable]


def _target(target, program):
    """(program, getter(name) -> tensor or None, setter(name, tensor), places, runs)."""
    if hasattr(target, "local_scopes"):  # a ParallelExecutor
        pe = target
        owners = pe.state_owners()

        def get(name):
            return pe.local_scopes[owners.get(name, 0)].find_var(name)

        def put(name, value):
            owner = owners.get(name)
            for k, (place, scope) in enumerate(zip(pe.places, pe.local_scopes, strict=True)):
                if owner is not None and owner != k:
                    continue
                old = scope.vars.get(name)
                if old is not None and old.shape == value.shape and old.dtype == value.dtype:
                    old.copy_(value)
                else:
                    scope.set_var(name, value.to(place.device, copy=True))
        return pe.run_program, get, put, len(pe.places), pe.runs
    if program is None:
        raise SSAExecError("save_checkpoint/load_checkpoint on a Scope need program=")
    scope = target

    def put_scope(name, value):
        scope.set_var(name, value.clone())
    return program, scope.find_var, put_scope, 1, 0


def _describe(program, get):
    out = {}
    for var in _persistables(program):
        t = get(var.name)
        if t is not None:
            out[var.name] = [list(t.shape), str(t.dtype).replace("torch.", "")]
    return out


def save_checkpoint(path, target, program=None, state=None, meta=None):
    """Write ``target``'s persistables to ``path`` (safetensors, atomically).

    Parameters
    ----------
    path : str or os.PathLike
    target : ParallelExecutor or Scope
        A ``Scope`` needs ``program`` (whose persistables are saved).
    state : dict of str to tensor, optional
        More tensors to keep (as ``@STATE.<name>``), not checked against the program.
    meta : dict of str to str, optional
        More header entries (not the checkpoint's own keys).
    """
    st = _safetensors()
    program, get, _, places, runs = _target(target, program)
    tensors = {}
    for var in _persistables(program):
        t = get(var.name)
        if t is None:
            if var.is_parameter:
                raise SSAExecError(f"parameter {var.name!r} has no value: nothing to save")
            continue
        tensors[var.name] = t.detach().to("cpu", copy=True).contiguous()
    layout = {n: [list(t.shape), str(t.dtype).replace("torch.", "")]
              for n, t in tensors.items()}
    body = json.dumps(layout, sort_keys=True)
    clash = sorted(set(meta or ()) & set(_RESERVED))
    if clash:
        raise SSAExecError(f"checkpoint meta may not set {', '.join(clash)} (the file's own)")
    meta = dict(meta or {}) | {"format": FORMAT, "persistables": body,
                               "program_hash": hashlib.sha256(body.encode()).hexdigest(),
                               "places": str(places), "runs": str(runs)}
    for name, t in (state or {}).items():
        tensors[STATE + name] = t.detach().to("cpu", copy=True).contiguous()
    meta["data_digest"] = _digest(tensors)
    _write(st, tensors, path, meta, runs)
    return meta


def save_parameters(path, target, program=None):
    """Write ``target``'s parameters alone to ``path`` (safetensors, atomically): the
    trained weights, by var name, for any safetensors reader."""
    st = _safetensors()
    program, get, _, _, runs = _target(target, program)
    tensors = {v.name: get(v.name).detach().to("cpu", copy=True).contiguous()
               for v in _persistables(program) if v.is_parameter and get(v.name) is not None}
    _write(st, tensors, path, {"format": "ssaexec-parameters/1", "runs": str(runs)}, None)


def _write(st, tensors, path, meta, runs):
    """Write, fsync, rename, fsync the folder (the atomic policy above, ``safe_files``)."""
    fault = (lambda: faults.point("save", runs)) if runs is not None else None

    def write(tmp):
        from safetensors import SafetensorError
        try:
            st.save_file(tensors, tmp, metadata=meta)
        except SafetensorError as e:  # its I/O errors (a full disk) are OSErrors to callers
            raise OSError(f"{path}: cannot write the checkpoint ({e})") from e
    atomic_write(path, write, prefix=TEMP_PREFIX, before_rename=fault, private=True)


def load_checkpoint(path, target, program=None, state=None, check=None, follow_symlinks=True):
    """Load ``path`` into ``target`` (a ParallelExecutor, or a Scope with ``program``).

    Returns the checkpoint's metadata. ``SSAExecError`` names every var that is missing,
    extra, or of another shape or dtype. A ``state`` dict receives the file's
    ``@STATE.`` tensors (``save_checkpoint(state=)``), by name. ``check(meta, state)``,
    when given, validates the training state (raising ``SSAExecError``) after every
    tensor was read and fitted to the program and before any of them is written: a
    refused checkpoint loads nothing. ``follow_symlinks=False`` refuses a symlink at
    ``path``; anything but a regular file (a FIFO, a folder) is always refused, never
    opened for a blocking read.
    """
    meta, tensors = read_checkpoint(path, follow_symlinks)
    runs = _runs(meta.get("runs", "0"), path)
    program, get, put, _, _ = _target(target, program)
    kept = {n[len(STATE):]: tensors.pop(n) for n in [n for n in tensors if n.startswith(STATE)]}
    want = {v.name: v for v in _persistables(program)}
    missing = sorted(n for n in want if n not in tensors and not _optional(n)
                     and get(n) is not None)
    extra = sorted(n for n in tensors if n not in want and not _optional(n))
    mismatched = []
    for n, t in tensors.items():
        have = get(n) if n in want else None
        if have is not None and (list(have.shape) != list(t.shape) or have.dtype != t.dtype):
            mismatched.append(f"{n} (checkpoint {list(t.shape)} "
                              f"{str(t.dtype).replace('torch.', '')}, program "
                              f"{list(have.shape)} {str(have.dtype).replace('torch.', '')})")
    if missing or extra or mismatched:
        parts = [f"{label}: {', '.join(names[:8])}{' ...' if len(names) > 8 else ''}"
                 for label, names in (("missing from the checkpoint", missing),
                                      ("not in the program", extra),
                                      ("different shape or dtype", mismatched)) if names]
        raise SSAExecError(f"{path} does not fit this program: " + "; ".join(parts))
    if check is not None:
        check(meta, kept)
    check_values(want, tensors, f"checkpoint {path}")  # the declarations (runtime.boundary)
    for n, t in tensors.items():
        if n in want:
            put(n, t)
    if hasattr(target, "local_scopes"):
        target.runs = runs
    if state is not None:
        state.update(kept)
    return meta


def read_checkpoint(path, follow_symlinks=True):
    """(metadata, every tensor) of the checkpoint at ``path``, read whole and checked (the
    format, ``runs``, the data against its header and its digest); nothing is loaded.
    Only a regular file is opened, without blocking; ``follow_symlinks=False`` refuses a
    symlink at ``path``. ``SSAExecError`` names what is wrong."""
    st = _safetensors()
    path = os.fspath(path)
    fd = open_input(path, "checkpoint", "a checkpoint file", SSAExecError, follow_symlinks)
    try:
        return _read(st, path, fd_path(fd, path))
    finally:
        os.close(fd)


def _read(st, path, source):
    """(metadata, every tensor) of the checkpoint file ``source`` names (``path`` in
    errors): all of it read and checked before anything is loaded."""
    try:
        from safetensors import safe_open
        with safe_open(source, framework="pt") as f:
            meta = f.metadata() or {}
    except Exception as e:  # noqa: BLE001 - a corrupt or foreign file
        raise SSAExecError(f"{path}: not a readable safetensors checkpoint ({e})") from None
    if meta.get("format") != FORMAT:
        raise SSAExecError(f"{path}: not an ssaexec checkpoint (format "
                           f"{_clip(meta.get('format'))}, expected {FORMAT!r})")
    _runs(meta.get("runs", "0"), path)
    try:
        tensors = st.load_file(source)
    except Exception as e:  # noqa: BLE001 - a header that lies about the data after it
        raise SSAExecError(f"{path}: not a readable safetensors checkpoint ({e})") from None
    digest = meta.get("data_digest")
    if digest is not None and digest != _digest(tensors):
        raise SSAExecError(f"{path}: its data does not match the digest saved with it (the "
                           "file was damaged or changed after it was written)")
    return meta, tensors


def _digest(tensors):
    """BLAKE2b of every tensor (name, dtype, shape, bytes; CPU and contiguous), hex."""
    h = hashlib.blake2b(digest_size=32)
    for name in sorted(tensors):
        t = tensors[name]
        h.update(json.dumps([name, str(t.dtype), list(t.shape)]).encode())
        if t.numel():
            h.update(t.contiguous().reshape(-1).view(torch.uint8).numpy().data)
    return h.hexdigest()


def _clip(value):
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _runs(text, path):
    # metadata is the file's text: int() of it could raise, or parse thousands of digits
    if not (isinstance(text, str) and text.isascii() and text.isdigit() and len(text) <= 18):
        raise SSAExecError(f"{path}: checkpoint metadata runs={_clip(text)} is not a count of "
                           "runs (a non-negative integer of at most 18 digits)")
    return int(text)
