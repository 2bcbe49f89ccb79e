"""Sharded checkpoints: one safetensors file per ZeRO rank, resharded on load.

Under ``BuildStrategy(zero_stage=1|2|3)`` a sharded parameter ``p`` of numel ``n`` and its
elementwise optimizer state live as 1-D shards of ``S = ceil(n / W)`` elements on the ``W``
global ranks (``program.shard``: rank ``g`` holds ``flat(p)[g*S:(g+1)*S]``, zero-padded
past ``n``). A sharded checkpoint keeps exactly that: rank ``g`` writes its shards, and
nobody gathers the model to save it (``docs/distributed.md``, "Sharded checkpoints").

Files of a checkpoint ``DIR/NAME.safetensors`` saved by ``W`` ranks:

* ``NAME.safetensors`` (rank 0's, the *entry*, format ``ssaexec-sharded-checkpoint/1``):
  rank 0's shards, every replicated persistable (full), the training state
  (``@STATE.*``), and the *index* in its header: ``persistables`` (every var's full
  shape and dtype, as a gathered checkpoint has it, and the same ``program_hash``) and
  ``shards``: ``{"world": W, "vars": {name: [numel, shard size]}, "files": [the data
  digest of rank 0's file, rank 1's, ...]}``.
* ``NAME.shard-<rank:05d>-of-<W:05d>-<save>.safetensors`` for ranks 1..W-1 (format
  ``ssaexec-checkpoint-shard/1``): that rank's shards, by the var's own name, each 1-D
  of the shard size; the header says the rank, the world and the save. ``<save>`` is
  16 hex digits drawn by rank 0 for each save (the index names it too), so a save never
  writes over the shard files of the checkpoint it replaces.

Policy and invariants:

* **The entry is written last.** Every other rank's file is written atomically first
  (``checkpoint``'s policy: temporary file, fsync, rename, fsync of the folder); rank 0
  writes the entry once every rank's file is in place (a collective across processes
  that also brings rank 0 their digests). A save killed half way leaves no entry, so no
  checkpoint: its shard files are orphans that ``Checkpoints`` removes. A save over an
  existing checkpoint writes new shard files beside the old ones (another ``<save>``),
  so the old checkpoint stays whole until the new entry replaces it; then the old
  shard files are removed (``stale_shards``). The set is one checkpoint because the
  entry names every file's digest and the save.
* **Every file is untrusted.** The index is parsed with bounds (a world of at most
  ``MAX_WORLD``, counts that are integers, a shard size that is ``ceil(n / W)``, a numel
  that is the product of the declared shape); shard file names are made from the entry's
  own name and the rank, never read from a file; each shard file must say the rank and
  world it is named for, hold exactly the index's vars, each 1-D of its shard size and
  dtype, and match the digest the index gives for it. Anything else is an
  ``SSAExecError`` naming the file and the var, before anything is loaded.
* **Only what a save made is removed**: regular files named exactly like a shard file of
  the entry (``lstat``, nothing followed); anything else is left alone.
* **Another world size is a reshard.** Reading assembles each var's full tensor
  (concatenate the shards in rank order, cut the padding, reshape: ``join``); the
  loader cuts it again for the target's ranks (its layout's ``shard_of``), so a
  checkpoint saved by 4 ranks loads on 2, on 8, into a plain run, and a plain
  checkpoint into a ZeRO run. Reading holds the whole model in host memory once (a
  streaming reader is not written yet).

The arithmetic is the layout's own (``program.shard.ShardLayout``), decided once.
"""

import json
import math
import os
import re
import secrets
import stat

from ..core.errors import SSAExecError
from ..program.shard import ShardLayout

__all__ = ["shard_path", "shard_files", "stale_shards", "new_save_id", "remove_regular",
           "ENTRY_FORMAT", "SHARD_FORMAT", "MAX_WORLD", "parse_index", "parse_persistables",
           "check_shard", "shard_meta", "check_shard_meta", "join"]

ENTRY_FORMAT = "ssaexec-sharded-checkpoint/1"
SHARD_FORMAT = "ssaexec-checkpoint-shard/1"
MAX_WORLD = 1 << 16  # a world size no index may exceed (bounds the files a reader opens)
MAX_INDEX = 1 << 26  # bytes of JSON an index may have (64 MiB: millions of vars)


# --- the files -------------------------------------------------------------------------------
def new_save_id():
    """A fresh save id: 16 hex digits (rank 0 draws it; every rank names its file with it)."""
    return secrets.token_hex(8)


_SAVE = re.compile(r"^[0-9a-f]{16}$")
_SHARD_FILE = re.compile(r"^\.shard-(\d{5})-of-(\d{5})-([0-9a-f]{16})$")


def shard_path(entry, rank, world, save):
    """The file of ``rank``'s shards of the checkpoint whose entry is ``entry`` in save
    ``save`` (rank 0's file is the entry itself)."""
    entry = os.fspath(entry)
    if rank == 0:
        return entry
    root, ext = os.path.splitext(entry)
    return f"{root}.shard-{rank:05d}-of-{world:05d}-{save}{ext}"


def shard_files(entry):
    """``(path, rank, world, save)`` of every regular file in ``entry``'s folder named
    like one of its shard files (whatever the save), by the directory entry (``lstat``:
    nothing opened or followed)."""
    entry = os.fspath(entry)
    folder = os.path.dirname(entry) or "."
    root, ext = os.path.splitext(os.path.basename(entry))
    out = []
    try:
        with os.scandir(folder) as entries:
            for e in entries:
                name = e.name
                if not (name.startswith(root) and name.endswith(ext)):
                    continue
                m = _SHARD_FILE.match(name[len(root):len(name) - len(ext)])
                if m and e.is_file(follow_symlinks=False):
                    out.append((os.path.join(folder, name), int(m.group(1)),
                                int(m.group(2)), m.group(3)))
    except FileNotFoundError:
        pass
    return sorted(out)


def stale_shards(entry, keep=None):
    """Remove ``entry``'s shard files but those of save ``keep`` (None: all of them);
    the paths removed."""
    return [path for path, _, _, save in shard_files(entry)
            if save != keep and remove_regular(path)]


def remove_regular(path):
    """Remove ``path`` if it is a regular file (what a save writes); True when it is gone.

    Anything else (a folder, a FIFO, a symlink) was not made by a save: it is left as it
    is, and nothing is followed.
    """
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return False
        os.unlink(path)
    except FileNotFoundError:
        pass
    return True


def join(shards, shape):
    """The full tensor of ``shape`` from its shards in rank order (the padding cut)."""
    return ShardLayout(len(shards), 0, ()).unshard(shards, list(shape))


# --- the index --------------------------------------------------------------------------------
def _count(value):
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def parse_index(text, persistables, path):
    """The checked index of an entry file: ``(world, save, {name: (numel, shard size)},
    [digest per rank])``. ``persistables`` is the entry's ``{name: [shape, dtype]}``;
    ``SSAExecError`` names ``path`` and what is wrong."""
    def bad(why):
        return SSAExecError(f"{path}: the sharded checkpoint's index {why}")
    try:
        index = json.loads(text) if isinstance(text, str) and len(text) <= MAX_INDEX else None
    except ValueError:
        index = None
    if not isinstance(index, dict):
        raise bad("is not a JSON object")
    world, vars_, files = index.get("world"), index.get("vars"), index.get("files")
    save = index.get("save")
    if not (isinstance(save, str) and _SAVE.match(save)):
        raise bad(f"has save {str(save)[:40]!r}, not 16 hex digits")
    if not _count(world) or not 1 <= world <= MAX_WORLD:
        raise bad(f"has world {str(world)[:40]!r}, not a number of ranks from 1 to {MAX_WORLD}")
    if not isinstance(vars_, dict):
        raise bad("has no 'vars' object")
    if not (isinstance(files, list) and len(files) == world
            and all(isinstance(d, str) and len(d) == 64 for d in files)):
        raise bad(f"does not give one 64-digit data digest for each of its {world} files")
    out = {}
    for name, entry in vars_.items():
        declared = persistables.get(name)
        if declared is None:
            raise bad(f"names var {name[:80]!r}, which the checkpoint does not declare")
        if not (isinstance(entry, list) and len(entry) == 2 and all(map(_count, entry))):
            raise bad(f"gives var {name!r} {str(entry)[:60]}, not [numel, shard size]")
        numel, size = entry
        shape = declared[0]
        want = 1
        for d in shape:
            want *= d
        if numel != want:
            raise bad(f"gives var {name!r} {numel} elements, its shape {shape} has {want}")
        if size != math.ceil(numel / world):
            raise bad(f"gives var {name!r} shards of {size} elements; {numel} elements over "
                      f"{world} ranks are {math.ceil(numel / world)} each")
        out[name] = (numel, size)
    return world, save, out, files


def check_shard(path, tensors, sizes, dtypes, extra_ok):
    """Check one rank's file: every var of ``sizes`` present, 1-D of its shard size, of
    its ``dtypes`` entry; no other tensor unless ``extra_ok(name)``. Raises
    ``SSAExecError`` naming ``path`` and the var."""
    missing = sorted(n for n in sizes if n not in tensors)
    if missing:
        raise SSAExecError(f"{path}: the shard of {missing[0]!r} is missing"
                           + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    for name, t in tensors.items():
        if name not in sizes:
            if not extra_ok(name):
                raise SSAExecError(f"{path}: holds {name[:80]!r}, which the index does not "
                                   "name")
            continue
        if t.dim() != 1 or t.numel() != sizes[name]:
            raise SSAExecError(f"{path}: the shard of {name!r} has shape {list(t.shape)}; the "
                               f"index says 1-D of {sizes[name]} elements")
        dtype = str(t.dtype).replace("torch.", "")
        if dtype != dtypes[name]:
            raise SSAExecError(f"{path}: the shard of {name!r} is {dtype}; the index says "
                               f"{dtypes[name]}")


# --- declarations -----------------------------------------------------------------------------
def parse_persistables(text, path):
    """``{name: [shape, dtype]}`` from an entry's ``persistables`` header (untrusted text:
    a JSON object of ``[list of counts, dtype name]``); ``SSAExecError`` otherwise."""
    try:
        decl = json.loads(text) if isinstance(text, str) and len(text) <= MAX_INDEX else None
    except ValueError:
        decl = None
    ok = isinstance(decl, dict) and all(
        isinstance(v, list) and len(v) == 2 and isinstance(v[0], list)
        and len(v[0]) <= 64 and all(map(_count, v[0])) and isinstance(v[1], str)
        for v in decl.values())
    if not ok:
        raise SSAExecError(f"{path}: its 'persistables' header is not a JSON object of "
                           "[shape, dtype] per var")
    return decl


def shard_meta(rank, world, save):
    """The ``shard`` header entry of rank ``rank``'s file."""
    return json.dumps({"rank": rank, "world": world, "save": save}, sort_keys=True)


def check_shard_meta(meta, path, rank, world, save):
    """Refuse a shard file that is not rank ``rank`` of ``world`` in save ``save`` (a file
    renamed, or left by another save)."""
    if meta.get("format") != SHARD_FORMAT:
        raise SSAExecError(f"{path}: not a checkpoint shard file (format "
                           f"{str(meta.get('format'))[:40]!r}, expected {SHARD_FORMAT!r})")
    try:
        said = json.loads(meta.get("shard", "")) if len(meta.get("shard", "")) < 200 else None
    except ValueError:
        said = None
    if said != {"rank": rank, "world": world, "save": save}:
        shown = {k: said[k] for k in ("rank", "world") if k in said} \
            if isinstance(said, dict) else said
        raise SSAExecError(f"{path}: its header says it is shard {str(shown)[:60]} of save "
                           f"{str(said.get('save') if isinstance(said, dict) else None)[:20]}"
                           f", not rank {rank} of {world} of save {save}")
