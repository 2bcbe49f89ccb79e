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
* **Places.** Values come from place 0; loading writes every place, so a run can resume
  on another number of places.
* **ZeRO shards** (an executor with a ``shard_layout()``): ``save_checkpoint`` writes a
  *sharded* checkpoint by default, one file per global rank (``sharded``: the files,
  the index, the checks), and every process of the run calls it (a collective);
  ``sharded=False`` writes the gathered file instead (``gathered_state()``: full tensors,
  the same file a plain run writes). Loading takes either kind into either kind of
  run: a sharded checkpoint is assembled when it is read (``read_checkpoint`` returns
  full tensors), and a ZeRO target cuts each sharded var for its own ranks.
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
from . import sharded as shards

__all__ = ["save_checkpoint", "load_checkpoint", "read_checkpoint", "save_parameters", "FORMAT"]

FORMAT = "ssaexec-checkpoint/1"
STATE = "@STATE."  # prefix of the training-state tensors (not the program's)
TEMP_PREFIX = ".ckpt-"  # a save's temporary file: .ckpt-XXXX.tmp in the target's folder
_RESERVED = ("format", "persistables", "program_hash", "places", "runs", "data_digest",
             "shards", "shard")


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


class _Zero:
    """What a ZeRO executor holds: this process's global ranks and, per sharded var (a
    parameter or its optimizer state, by its plain name), the shard var on each place.

    ``vars``: ``{plain name: (shard var, full shape, numel, shard size)}``."""

    __slots__ = ("pe", "layout", "world", "ranks", "vars", "processes", "process_rank")

    def __init__(self, pe, layout):
        bs = pe.build_strategy
        n = len(pe.places)
        self.pe, self.layout, self.world = pe, layout, int(layout.world)
        self.processes, self.process_rank = bs.num_trainers, bs.trainer_id
        self.ranks = [self.process_rank * n + i for i in range(n)]
        if self.world != self.processes * n:
            raise SSAExecError(f"the executor's shard layout is for {self.world} ranks, but it "
                               f"runs {self.processes} process(es) x {n} places")
        self.vars = {full: (shard, list(sp.shape), int(sp.numel), int(sp.shard_size))
                     for sp in layout for full, shard in sp.full_names().items()}

    def shard(self, name, place):
        """The shard of plain var ``name`` on place index ``place`` (None: no value)."""
        return self.pe.local_scopes[place].find_var(self.vars[name][0])

    def declared(self, name):
        """(full shape, dtype) of sharded var ``name`` (None: no value on place 0)."""
        t = self.shard(name, 0)
        return None if t is None else (self.vars[name][1], t.dtype)

    def plain_names(self):
        """Every persistable of the plain program (the sharded vars by their plain names,
        never their shards')."""
        names = [v.name for v in _persistables(self.plain_program())]
        return names + [n for n in self.vars if n not in names]

    def plain_program(self):
        """The full-step program before sharding (``ParallelExecutor.program_for``)."""
        return self.pe.program_for("plain")

    def persists(self, name):
        """Whether the run program keeps the full ``name`` too (stages 1 and 2's
        parameters; stage 3's are gathered for use only)."""
        var = self.pe.run_program.global_block().find_var(name)
        return var is not None and var.persistable

    def cut(self, name, value, place):
        """Place ``place``'s shard of the full ``value`` of sharded var ``name``."""
        return self.layout.shard_of(value.reshape(-1), self.ranks[place], self.vars[name][3])

    def exchange(self, obj, what):
        """``obj`` of every process, in process order (a collective across processes)."""
        if self.processes == 1:
            return [obj]
        from ..dist import world as distributed
        return distributed.collective().gather_objects(obj, what)


def _zero(target):
    layout = target.shard_layout() if hasattr(target, "shard_layout") else None
    return None if layout is None else _Zero(target, layout)


class _Target:
    """Where values come from and go: ``get(name)`` (a full tensor or None),
    ``declared(name)`` ((shape, dtype) or None), ``put(name, full tensor)``, the
    persistables' names, the places and runs, and the ZeRO view (None without)."""

    __slots__ = ("names", "params", "get", "declared", "put", "places", "runs", "zero")


def _target(target, program):
    t = _Target()
    t.zero = None
    if hasattr(target, "local_scopes"):  # a ParallelExecutor
        pe = target
        t.zero = zero = _zero(pe)
        plain = zero.plain_program() if zero is not None else pe.run_program
        t.params = {v.name for v in _persistables(plain) if v.is_parameter}
        t.names = zero.plain_names() if zero is not None else \
            [v.name for v in _persistables(plain)]

        def get(name):
            if zero is not None and name in zero.vars:
                return None  # only gathered_state() holds it whole
            return pe.local_scopes[0].find_var(name)

        def declared(name):
            if zero is not None and name in zero.vars:
                return zero.declared(name)
            have = get(name)
            return None if have is None else (list(have.shape), have.dtype)

        def put(name, value):
            cut = zero is not None and name in zero.vars
            for k, (place, scope) in enumerate(zip(pe.places, pe.local_scopes, strict=True)):
                if cut:  # this place's shard; the full var where it persists
                    _set(scope, place, zero.vars[name][0], zero.cut(name, value, k))
                    if not zero.persists(name):
                        continue
                _set(scope, place, name, value)
        t.get, t.declared, t.put = get, declared, put
        t.places, t.runs = len(pe.places), pe.runs
        return t
    if program is None:
        raise SSAExecError("save_checkpoint/load_checkpoint on a Scope need program=")
    scope = target
    t.names = [v.name for v in _persistables(program)]
    t.params = {v.name for v in _persistables(program) if v.is_parameter}

    def declared_scope(name):
        have = scope.find_var(name)
        return None if have is None else (list(have.shape), have.dtype)

    def put_scope(name, value):
        scope.set_var(name, value.clone())
    t.get, t.declared, t.put, t.places, t.runs = \
        scope.find_var, declared_scope, put_scope, 1, 0
    return t


def _set(scope, place, name, value):
    old = scope.vars.get(name)
    if old is not None and old.shape == value.shape and old.dtype == value.dtype:
        old.copy_(value)
    else:
        scope.set_var(name, value.to(place.device, copy=True))


def _cpu(t):
    return t.detach().to("cpu", copy=True).contiguous()


def _dtype(t):
    return str(t.dtype).replace("torch.", "")


def _header(tensors, places, runs, meta, shapes=None):
    """The checkpoint's own header entries over ``meta`` (``shapes``: the full shape of a
    var saved as a shard)."""
    layout = {n: [list((shapes or {}).get(n, t.shape)), _dtype(t)] for n, t in tensors.items()}
    body = json.dumps(layout, sort_keys=True)
    clash = sorted(set(meta or ()) & set(_RESERVED))
    if clash:
        raise SSAExecError(f"checkpoint meta may not set {', '.join(clash)} (the file's own)")
    return dict(meta or {}) | {"format": FORMAT, "persistables": body,
                               "program_hash": hashlib.sha256(body.encode()).hexdigest(),
                               "places": str(places), "runs": str(runs)}


def save_checkpoint(path, target, program=None, state=None, meta=None, sharded=None):
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
    sharded : bool, optional
        An executor with ZeRO shards: True or None (default) writes one file per global
        rank (``path`` is rank 0's, the others beside it, ``sharded``); False writes
        the gathered file of full tensors. Either way every process of the run calls
        it. Without ZeRO, True is an error.

    Returns the header written (of rank 0's file; None on the other processes of a
    sharded save).
    """
    st = _safetensors()
    t = _target(target, program)
    if t.zero is None and sharded:
        raise SSAExecError("save_checkpoint(sharded=True) needs an executor with ZeRO shards "
                           "(BuildStrategy(zero_stage=1|2|3))")
    if t.zero is not None and sharded is not False:
        return _save_sharded(st, path, t, state, meta)
    tensors = _full_values(t, target, "save")
    header = _header(tensors, t.places, t.runs, meta)
    for name, value in (state or {}).items():
        tensors[STATE + name] = _cpu(value)
    header["data_digest"] = _digest(tensors)
    if t.zero is None or t.zero.process_rank == 0:
        _write(st, tensors, path, header, t.runs)
        shards.stale_shards(path)  # of a sharded checkpoint this file replaced
    return header


def _full_values(t, target, what):
    """{name: full CPU tensor} of every persistable with a value (ZeRO: gathered)."""
    if t.zero is not None:
        gathered = target.gathered_state()  # a collective across processes
        return {n: _cpu(v) for n, v in gathered.items()}
    tensors = {}
    for name in t.names:
        value = t.get(name)
        if value is None:
            if name in t.params:
                raise SSAExecError(f"parameter {name!r} has no value: nothing to {what}")
            continue
        tensors[name] = _cpu(value)
    return tensors


def _save_sharded(st, path, t, state, meta):
    """Every rank of this process writes its file; rank 0's entry goes last, once every
    other rank's file is in place (``sharded``'s policy)."""
    zero, path = t.zero, os.fspath(path)
    shapes, sizes, dtypes = {}, {}, {}
    files = {}
    for k, rank in enumerate(zero.ranks):
        tensors = {}
        for name, (_, shape, numel, size) in zero.vars.items():
            value = zero.shard(name, k)
            if value is None:
                continue
            if value.dim() != 1 or value.numel() != size:  # the layout's own contract
                raise SSAExecError(f"ZeRO shard of {name!r} on place {k} has shape "
                                   f"{list(value.shape)}, the layout says {size} elements")
            tensors[name] = _cpu(value)
            shapes[name], sizes[name], dtypes[name] = shape, [numel, size], _dtype(value)
        files[rank] = tensors
    save = zero.exchange(shards.new_save_id(), "choice of the checkpoint's save id")[0]
    try:
        digests, entry, header = _write_shards(st, path, t, files, shapes, state, meta, save)
        failure = None
    except Exception as e:  # noqa: BLE001 - told to the other processes, then raised here
        digests, entry, header, failure = {}, None, None, e
    parts = zero.exchange({"digests": digests, "failed": None if failure is None else
                           f"{type(failure).__name__}: {failure}"},
                          "exchange of the checkpoint shards' digests")
    if failure is not None:
        raise failure
    failed = [(k, p["failed"]) for k, p in enumerate(parts) if p["failed"]]
    if failed:  # no entry: the files written are orphans, removed by the next resume
        k, why = failed[0]
        raise SSAExecError(f"{path}: not saved: process {k} could not write its shard files "
                           f"({why})")
    if entry is None:
        return None
    everyone = {}
    for part in parts:
        everyone.update(part["digests"])  # every rank's file is written once this returns
    header["shards"] = json.dumps({"world": zero.world, "save": save, "vars": sizes,
                                   "files": [everyone[r] for r in range(zero.world)]},
                                  sort_keys=True)
    _write(st, entry, path, header, t.runs)
    shards.stale_shards(path, keep=save)  # the replaced checkpoint's, now no checkpoint's
    return header


def _write_shards(st, path, t, files, shapes, state, meta, save):
    """Write this process's shard files but rank 0's; ({rank: digest}, rank 0's tensors
    and header, or None and None on other processes)."""
    zero = t.zero
    digests = {}
    for rank, tensors in files.items():
        if rank == 0:
            continue
        digests[rank] = _digest(tensors)
        header = {"format": shards.SHARD_FORMAT, "runs": str(t.runs),
                  "shard": shards.shard_meta(rank, zero.world, save),
                  "data_digest": digests[rank]}
        _write(st, tensors, shards.shard_path(path, rank, zero.world, save), header, t.runs)
    entry = files.get(0)
    if entry is None:
        return digests, None, None
    for name in t.names:
        if name not in zero.vars and (value := t.get(name)) is not None:
            entry[name] = _cpu(value)
        elif name not in zero.vars and name in t.params:
            raise SSAExecError(f"parameter {name!r} has no value: nothing to save")
    header = _header(entry, t.places, t.runs, meta, shapes)
    header["format"] = shards.ENTRY_FORMAT
    for name, value in (state or {}).items():
        entry[STATE + name] = _cpu(value)
    digests[0] = header["data_digest"] = _digest(entry)
    return digests, entry, header


def save_parameters(path, target, program=None):
    """Write ``target``'s parameters alone to ``path`` (safetensors, atomically): the
    trained weights, by var name, for any safetensors reader. Under ZeRO they are
    gathered (every process calls it; rank 0 writes)."""
    st = _safetensors()
    t = _target(target, program)
    tensors = {n: v for n, v in _full_values(t, target, "save").items() if n in t.params}
    if t.zero is None or t.zero.process_rank == 0:
        _write(st, tensors, path, {"format": "ssaexec-parameters/1", "runs": str(t.runs)}, None)


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
    opened for a blocking read. A sharded checkpoint (every rank's file beside ``path``)
    loads whole into any run, resharded for a ZeRO target's ranks.
    """
    meta, tensors = read_checkpoint(path, follow_symlinks)
    runs = _runs(meta.get("runs", "0"), path)
    t = _target(target, program)
    kept = {n[len(STATE):]: tensors.pop(n) for n in [n for n in tensors if n.startswith(STATE)]}
    want = set(t.names)
    have = {n: t.declared(n) for n in want}
    missing = sorted(n for n in want if n not in tensors and not _optional(n)
                     and have[n] is not None)
    extra = sorted(n for n in tensors if n not in want and not _optional(n))
    mismatched = []
    for n, value in tensors.items():
        d = have.get(n)
        if d is not None and (list(d[0]) != list(value.shape) or d[1] != value.dtype):
            mismatched.append(f"{n} (checkpoint {list(value.shape)} {_dtype(value)}, program "
                              f"{list(d[0])} {str(d[1]).replace('torch.', '')})")
    if missing or extra or mismatched:
        parts = [f"{label}: {', '.join(names[:8])}{' ...' if len(names) > 8 else ''}"
                 for label, names in (("missing from the checkpoint", missing),
                                      ("not in the program", extra),
                                      ("different shape or dtype", mismatched)) if names]
        raise SSAExecError(f"{path} does not fit this program: " + "; ".join(parts))
    if check is not None:
        check(meta, kept)
    declarations = _declarations(target, program, t)
    check_values({n: v for n, v in declarations.items() if n in want}, tensors,
                 f"checkpoint {path}")  # the declarations (runtime.boundary)
    for n, value in tensors.items():
        if n in want:
            t.put(n, value)
    if hasattr(target, "local_scopes"):
        target.runs = runs
    if state is not None:
        state.update(kept)
    return meta


def _declarations(target, program, t):
    """{name: VarDesc} of the plain program's persistables (a ZeRO run program's shard
    vars are not; its sharded vars are checked by ``declared`` alone)."""
    prog = program if not hasattr(target, "local_scopes") else \
        t.zero.plain_program() if t.zero is not None else target.run_program
    names = set(t.names)
    return {v.name: v for v in _persistables(prog) if v.name in names}


def read_checkpoint(path, follow_symlinks=True):
    """(metadata, every tensor) of the checkpoint at ``path``, read whole and checked (the
    format, ``runs``, the data against its header and its digest); nothing is loaded.
    A sharded checkpoint's files are read and checked too, and its vars returned whole.
    Only regular files are opened, without blocking; ``follow_symlinks=False`` refuses a
    symlink at ``path`` (and at every shard file). ``SSAExecError`` names what is wrong."""
    st = _safetensors()
    path = os.fspath(path)
    fd = open_input(path, "checkpoint", "a checkpoint file", SSAExecError, follow_symlinks)
    try:
        meta, tensors = _read(st, path, fd_path(fd, path))
    finally:
        os.close(fd)
    if meta.get("format") == shards.ENTRY_FORMAT:
        tensors = _assemble(st, path, meta, tensors, follow_symlinks)
    return meta, tensors


def _read(st, path, source, formats=(FORMAT, shards.ENTRY_FORMAT)):
    """(metadata, every tensor) of the checkpoint file ``source`` names (``path`` in
    errors): all of it read and checked before anything is loaded."""
    try:
        from safetensors import safe_open
        with safe_open(source, framework="pt") as f:
            meta = f.metadata() or {}
    except Exception as e:  # noqa: BLE001 - a corrupt or foreign file
        raise SSAExecError(f"{path}: not a readable safetensors checkpoint ({e})") from None
    if meta.get("format") not in formats:
        raise SSAExecError(f"{path}: not an ssaexec checkpoint (format "
                           f"{_clip(meta.get('format'))}, expected {formats[0]!r})")
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


def _assemble(st, path, meta, tensors, follow_symlinks):
    """The full tensors of the sharded checkpoint whose entry ``path`` holds ``meta`` and
    rank 0's ``tensors``: every rank's file read and checked, each var joined."""
    decl = shards.parse_persistables(meta.get("persistables"), path)
    world, save, sizes, files = shards.parse_index(meta.get("shards"), decl, path)
    if meta.get("data_digest") != files[0]:
        raise SSAExecError(f"{path}: its data digest is not the one its index gives rank 0")
    dtypes = {n: decl[n][1] for n in sizes}
    expected = {n: s for n, (_, s) in sizes.items()}
    shards.check_shard(path, tensors, expected, dtypes,
                       lambda n: n.startswith(STATE) or n in decl)
    parts = {n: [tensors.pop(n)] for n in sizes}
    for rank in range(1, world):
        where = shards.shard_path(path, rank, world, save)
        try:
            fd = open_input(where, "checkpoint shard file", "a checkpoint shard file",
                            SSAExecError, follow_symlinks)
        except SSAExecError as e:
            raise SSAExecError(f"{path} is a checkpoint of {world} ranks, and the file of "
                               f"rank {rank} is not usable: {e}") from None
        try:
            shard_meta, got = _read(st, where, fd_path(fd, where), (shards.SHARD_FORMAT,))
        finally:
            os.close(fd)
        shards.check_shard_meta(shard_meta, where, rank, world, save)
        if shard_meta.get("data_digest") != files[rank]:
            raise SSAExecError(f"{where}: not the shard file {path} was saved with (its data "
                               "digest differs from the one the index gives rank "
                               f"{rank})")
        shards.check_shard(where, got, expected, dtypes, lambda n: False)
        for n in sizes:
            parts[n].append(got[n])
    for n in sizes:
        tensors[n] = shards.join(parts.pop(n), decl[n][0])
    return tensors


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
