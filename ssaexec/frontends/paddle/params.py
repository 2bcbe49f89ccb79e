"""Paddle parameter files: LoDTensor records, read into tensors and written back.

One record (Paddle's ``SerializeToStream`` of a LoDTensor), little-endian:

====================  =====================================================
``uint32``            LoDTensor version, 0
``uint64``            number of LoD levels L
L x (``uint64`` n,    one LoD level: n bytes of ``size_t`` offsets (skipped:
n bytes)              parameters carry no LoD)
``uint32``            tensor version, 0
``int32`` k           size of the tensor description
k bytes               ``VarType.TensorDesc`` protobuf: data type and dims
raw data              numel x itemsize bytes, row-major
====================  =====================================================

A *combined* file (``.pdiparams``, written by ``save_combine``) is the records of
the persistable vars one after the other, sorted by var name (see
``PaddleProgram.persistable_names``); the records carry no names, so the reader
needs the list. A *directory* (``save_persistables``) holds one file per var,
named after it.

Policy: a parameter file is untrusted data like a program file. Every length is
checked against the bytes that are left before anything is allocated, shapes
against ``ssaexec.core.limits``, and anything wrong is a ``ProgramError`` naming the
file, the record (and var) and the byte offset. Var names become file names only
inside the given directory: a name with a path separator, ``.`` or ``..`` is
refused, so a program cannot make the reader open files elsewhere.
"""

import os
import struct
import sys
from pathlib import Path

import torch

from ...core.dtypes import dtype_name, torch_dtype
from ...core.errors import ProgramError
from ...core.limits import shape_problem
from ...core.safe_files import atomic_write, read_input
from .reader import DTYPE_CODES, DTYPES, parse_message
from .schema import messages

__all__ = ["read_record", "read_combined", "read_directory", "load_params", "encode_record",
           "save_combined", "save_directory", "save_params"]


def _check_host():
    if sys.byteorder != "little":  # pragma: no cover - torch supports little-endian hosts
        raise ProgramError("Paddle parameter files are little-endian; this host is not")


def read_record(data, offset, where):
    """Read one record of ``data`` at ``offset``; return ``(tensor, next offset)``.

    ``where`` names the record in errors (``'model.pdiparams: record 3 (fc_0.w_0)'``).
    """
    _check_host()
    end = len(data)

    def take(fmt, what):
        nonlocal offset
        size = struct.calcsize(fmt)
        if offset + size > end:
            raise ProgramError(f"{where}: byte {offset}: the file ends inside the {what}")
        value = struct.unpack_from(fmt, data, offset)[0]
        offset += size
        return value

    start = offset
    version = take("<I", "LoDTensor version")
    if version != 0:
        raise ProgramError(f"{where}: byte {start}: LoDTensor version {version} is not "
                           "supported (only 0); not a Paddle parameter record?")
    levels = take("<Q", "LoD level count")
    if levels > (end - offset) // 8:
        raise ProgramError(f"{where}: byte {offset - 8}: {levels} LoD levels cannot fit in the "
                           f"{end - offset} bytes left")
    for level in range(levels):
        size = take("<Q", f"size of LoD level {level}")
        if size > end - offset:
            raise ProgramError(f"{where}: byte {offset - 8}: LoD level {level} of {size} bytes "
                               f"runs past the end ({end - offset} bytes left)")
        offset += size
    at = offset
    version = take("<I", "tensor version")
    if version != 0:
        raise ProgramError(f"{where}: byte {at}: tensor version {version} is not supported "
                           "(only 0)")
    size = take("<i", "tensor description size")
    if not 0 <= size <= end - offset:
        raise ProgramError(f"{where}: byte {offset - 4}: tensor description size {size} does "
                           f"not fit ({end - offset} bytes left)")
    desc = parse_message("VarType.TensorDesc", data[offset:offset + size],
                         f"{where}: byte {offset}", "tensor description")
    offset += size
    dtype = DTYPES.get(desc.data_type)
    if dtype is None:
        raise ProgramError(f"{where}: data type code {desc.data_type} has no ssaexec dtype")
    shape = list(desc.dims)
    if any(d < 0 for d in shape):
        raise ProgramError(f"{where}: stored shape {shape} has a negative dimension")
    problem = shape_problem(shape, "the stored shape")
    if problem is not None:
        raise ProgramError(f"{where}: {problem}")
    numel = 1
    for d in shape:
        numel *= d
    nbytes = numel * torch_dtype(dtype).itemsize
    if nbytes > end - offset:
        raise ProgramError(f"{where}: byte {offset}: {dtype}{shape} needs {nbytes} bytes of "
                           f"data, {end - offset} are left")
    raw = bytearray(data[offset:offset + nbytes])
    offset += nbytes
    if numel == 0:
        return torch.empty(shape, dtype=torch_dtype(dtype)), offset
    return torch.frombuffer(raw, dtype=torch_dtype(dtype)).reshape(shape), offset


def _read_file(path):
    # a FIFO or a device: refused, not waited on
    return read_input(path, "parameter file", "a parameter file", ProgramError)


def read_combined(data, names, source="<bytes>"):
    """The tensors of a combined parameter file, one per name in ``names`` (in order).

    Parameters
    ----------
    data : bytes
    names : list of str
        The vars the records belong to, in file order (Paddle: sorted by name).
    source : str
        How errors name the file.

    Returns
    -------
    dict of str -> torch.Tensor
    """
    out = {}
    offset = 0
    for k, name in enumerate(names):
        if offset >= len(data):
            raise ProgramError(f"{source}: holds {k} tensors, but the program has "
                               f"{len(names)} persistable vars (the next is {name!r}); is it "
                               "this program's parameter file?")
        out[name], offset = read_record(data, offset, f"{source}: record {k} ({name})")
    if offset != len(data):
        raise ProgramError(f"{source}: {len(data) - offset} bytes are left after the "
                           f"{len(names)} tensors of the program's persistable vars; is it "
                           "this program's parameter file?")
    return out


def _safe_name(name, directory):
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name or \
            (os.altsep and os.altsep in name):
        raise ProgramError(f"{directory}: var name {name!r} cannot be a file name in the "
                           "parameter directory")
    return Path(directory) / name


def read_directory(directory, names):
    """One tensor per name from the file of that name in ``directory``."""
    out = {}
    for name in names:
        path = _safe_name(name, directory)
        data = _read_file(path)
        tensor, offset = read_record(data, 0, f"{path}")
        if offset != len(data):
            raise ProgramError(f"{path}: {len(data) - offset} bytes are left after the tensor")
        out[name] = tensor
    return out


def load_params(params, names, source=None):
    """Read parameters: a combined file's bytes or path, or a directory of per-var files.

    Returns
    -------
    dict of str -> torch.Tensor
        One CPU tensor per name.
    """
    if isinstance(params, (bytes, bytearray, memoryview)):
        return read_combined(bytes(params), names, source or "<params bytes>")
    path = Path(params)
    if path.is_dir():
        return read_directory(path, names)
    return read_combined(_read_file(path), names, source or str(path))


# --- writing ----------------------------------------------------------------------------------

def encode_record(tensor):
    """The bytes of one record holding ``tensor`` (no LoD), as Paddle writes it."""
    _check_host()
    t = tensor.detach().to("cpu").contiguous()
    name = dtype_name(t.dtype)
    if name not in DTYPE_CODES:  # pragma: no cover - every ssaexec dtype has a code
        raise ProgramError(f"dtype {name} has no Paddle data type code")
    msg = getattr(messages(), "VarType.TensorDesc")()
    msg.data_type = DTYPE_CODES[name]
    msg.dims.extend(t.shape)
    body = msg.SerializeToString()
    flat = t.reshape(-1)
    raw = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
    return b"".join([struct.pack("<IQ", 0, 0), struct.pack("<Ii", 0, len(body)), body, raw])


def _values(source, names):
    out = {}
    for name in names:
        if isinstance(source, dict):
            value = source.get(name)
        elif hasattr(source, "get_var"):
            value = source.get_var(name)
        else:
            value = source.find_var(name)
        if value is None:
            raise ProgramError(f"no value for var {name!r} to save")
        out[name] = value
    return out


def save_combined(path, values):
    """Write ``values`` (name -> tensor) as one combined file, records sorted by name.

    Atomically (``safe_files.atomic_write``): a temporary file in the same folder,
    flushed, renamed over ``path``; a symlink at ``path`` is replaced, never written
    through, and a failure leaves the old file as it was.
    """
    data = b"".join(encode_record(values[n]) for n in sorted(values))
    _write_atomic(path, data, path)
    return Path(path)


def save_directory(directory, values):
    """Write one file per var into ``directory`` (created when missing), each atomically."""
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ProgramError(f"{directory}: cannot write parameter files: {e.strerror or e}") \
            from None
    for name in sorted(values):
        _write_atomic(_safe_name(name, directory), encode_record(values[name]), directory)
    return directory


def _write_atomic(path, data, where):
    """``data`` to ``path`` with ``safe_files.atomic_write``; ``ProgramError`` naming
    ``where`` (the file, or the directory and the file in it) if it cannot be."""
    def write(tmp):
        with open(tmp, "wb") as f:
            f.write(data)
    try:
        atomic_write(path, write, prefix=".pdiparams-")
    except OSError as e:
        which = "" if Path(where) == Path(path) else f" {Path(path).name}"
        raise ProgramError(f"{where}: cannot write parameter file{which}: "
                           f"{e.strerror or e}") from None


def save_params(path, source, names, combined=True):
    """Save the values of ``names`` from ``source`` in Paddle's format.

    Parameters
    ----------
    path : str or os.PathLike
        The ``.pdiparams`` file (``combined=True``) or the directory of per-var files.
    source : dict, ParallelExecutor or Scope
        Where the values are: a mapping, anything with ``get_var(name)`` (an executor:
        place 0's values) or ``find_var(name)`` (a scope).
    names : list of str
        The vars to save: for a file Paddle will load with the inference program,
        ``PaddleProgram.persistable_names()`` of that program.
    combined : bool
        One file, records sorted by name (``save_combine``), or a directory
        (``save_persistables``).

    Returns
    -------
    pathlib.Path
    """
    values = _values(source, names)
    return save_combined(path, values) if combined else save_directory(path, values)
