"""Reading an ``--feed`` file: the arrays of an ``.npz``, checked before they are read.

An ``.npz`` file is a zip of ``NAME.npy`` members, each a small header (dtype, shape,
order) and the raw data. A feed file is untrusted data like a program file
(docs/security.md): a 2 MB deflated member can expand to gigabytes, and its header may
claim any dtype or shape. So ``read_feed_file`` decides everything from the headers
first and decompresses only what passed:

* the file is a regular file (``safe_files.open_regular``: a FIFO is refused, not
  waited on), not empty, and a zip archive;
* every member is named ``NAME.npy``, once, and ``NAME`` is a data var of the program
  (``ProgramDesc.data_vars``);
* its header (read from the member's first bytes: ``numpy.lib.format``, format 1.0 or
  2.0, with numpy's bound on the header's length) declares a dtype ssaexec has, the
  dtype the data var declares, and a shape of the declared rank whose fixed dims match
  and whose element count is within ``max_tensor_elements`` (``ssaexec.core.limits``);
  strings, dates, structured/void, object and complex arrays are refused by name;
  big-endian data is accepted and byte-swapped in place after reading;
* the member's uncompressed size in the zip directory equals header + data exactly:
  the zip reader never yields more than that size, so a header that lies cannot make
  the read bigger than the shape that passed the limits.

Only then is each member's data read, into one array allocated at the checked size,
in bounded chunks; a member that ends early or fails its CRC is refused. Every refusal
is a ``FeedError`` naming the file, the member and what is wrong.
"""

import lzma
import os
import zipfile
import zlib

import numpy as np
from numpy.lib import format as npy

from ..core.dtypes import DTYPES
from ..core.errors import FeedError
from ..core.limits import shape_problem
from ..core.safe_files import open_input

__all__ = ["read_feed_file"]

_CHUNK = 1 << 24  # bytes per read of a member's data: bounds the transient copies
# what reading a member can raise on a damaged file: the zip layer (directory, local
# header, CRC), each decompressor's own error, an encrypted member (RuntimeError), a
# compression method zipfile does not have (NotImplementedError)
_READ_ERRORS = (zipfile.BadZipFile, zlib.error, lzma.LZMAError, OSError, EOFError,
                RuntimeError, NotImplementedError)
# numpy dtype kinds with no ssaexec dtype, by what a user would call them
_REFUSED_KINDS = {"U": "a string", "S": "a byte string", "O": "an object", "V": "a void "
                  "(raw or structured)", "M": "a datetime", "m": "a timedelta",
                  "c": "a complex"}


class _Member:
    __slots__ = ("info", "var", "shape", "fortran", "dtype", "offset", "numel")

    def __init__(self, info, var, shape, fortran, dtype, offset, numel):
        self.info, self.var, self.shape, self.fortran = info, var, shape, fortran
        self.dtype, self.offset, self.numel = dtype, offset, numel


def read_feed_file(path, program):
    """The arrays of the ``.npz`` feed file ``path``, by data var name.

    Parameters
    ----------
    path : str or os.PathLike
    program : ProgramDesc
        Whose data vars the members must be (name, dtype, shape: module docstring).

    Returns
    -------
    dict of str -> numpy.ndarray
        Native byte order, the declared dtype and shape (``-1`` dims any size).

    Raises
    ------
    FeedError
        Naming the file (and the member) for anything the module docstring refuses.
    """
    path = os.fspath(path)
    fd = open_input(path, "feed file", "an .npz feed file", FeedError)
    with os.fdopen(fd, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            raise FeedError(f"{path}: the file is empty, not an .npz feed file")
        try:
            archive = zipfile.ZipFile(f)
        except (zipfile.LargeZipFile, ValueError) + _READ_ERRORS as e:
            raise FeedError(f"{path}: not an .npz feed file (not a zip archive: {e})") from None
        with archive:
            members = [_check_member(archive, info, path, program)
                       for info in _infos(archive, path)]
            if not members:
                raise FeedError(f"{path}: the .npz file holds no arrays")
            return {m.var.name: _read_member(archive, m, path) for m in members}


def _infos(archive, path):
    """The members, each named ``NAME.npy`` and only once."""
    infos = archive.infolist()
    seen = set()
    for info in infos:
        name = info.filename
        # (not info.is_dir(): it indexes the name, and a damaged directory may give "")
        if not name.endswith(".npy") or len(name) == 4 or "/" in name or "\\" in name:
            raise FeedError(f"{path}: member {_clip(name)} is not an array (an .npz holds "
                            "only NAME.npy members, one per data var)")
        if name in seen:
            raise FeedError(f"{path}: member {_clip(name)} appears more than once (which "
                            "one would be fed is ambiguous)")
        seen.add(name)
    return infos


def _check_member(archive, info, path, program):
    """Everything about one member but its data: name, header, dtype, shape, size."""
    name = info.filename[:-4]
    where = f"{path}: member {_clip(info.filename)}"
    var = program.global_block().vars.get(name)
    if var is None or not var.is_data:
        data = [v.name for v in program.data_vars()]
        raise FeedError(f"{where}: the program has no data var {_clip(name)}; its data vars "
                        f"are {', '.join(data[:16]) or 'none'}")
    try:
        with archive.open(info) as stream:
            version = npy.read_magic(stream)
            if version == (1, 0):
                shape, fortran, dtype = npy.read_array_header_1_0(stream)
            elif version == (2, 0):
                shape, fortran, dtype = npy.read_array_header_2_0(stream)
            else:
                raise ValueError(f"npy format version {version[0]}.{version[1]} is not "
                                 "supported (1.0 and 2.0 are)")
            offset = stream.tell()
    except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError) + _READ_ERRORS \
            as e:  # the header's text is parsed by numpy: what its parser raises, too
        raise FeedError(f"{where}: cannot read its .npy array header "
                        f"({str(e).splitlines()[0][:200] if str(e) else type(e).__name__})") \
            from None
    kind = _REFUSED_KINDS.get(dtype.kind)
    if kind is not None or dtype.fields is not None or dtype.subdtype is not None:
        raise FeedError(f"{where}: dtype {_clip(dtype.str)} is {kind or 'a structured'} type, "
                        f"which no feed can hold; data var {var.name!r} is {var.dtype}")
    native = dtype.newbyteorder("=") if dtype.byteorder in "<>" else dtype
    if native.name not in DTYPES or native.name != var.dtype:
        raise FeedError(f"{where}: feed {var.name!r} has dtype {native.name} but the program "
                        f"declares {var.dtype}; convert the array first")
    if any(d < 0 for d in shape):
        raise FeedError(f"{where}: shape {_clip(list(shape))} has a negative dimension")
    if var.shape is not None and (len(var.shape) != len(shape) or any(
            d >= 0 and d != s for d, s in zip(var.shape, shape))):
        raise FeedError(f"{where}: shape {_clip(list(shape))} but data var {var.name!r} is "
                        f"declared {var.shape} (-1 is any size)")
    problem = shape_problem(list(shape), f"array {var.name!r}: shape")
    if problem is not None:
        raise FeedError(f"{where}: {problem}")
    numel = 1
    for d in shape:
        numel *= d
    expected = offset + numel * dtype.itemsize
    if info.file_size != expected:
        raise FeedError(f"{where}: holds {info.file_size - offset} bytes of data, but its "
                        f"header says {dtype.name}{list(shape)}, {numel * dtype.itemsize} "
                        "bytes: truncated, or a header that lies")
    return _Member(info, var, tuple(shape), fortran, dtype, offset, numel)


def _read_member(archive, m, path):
    """The data of a member that ``_check_member`` passed, in native byte order."""
    where = f"{path}: member {_clip(m.info.filename)}"
    try:
        array = np.empty(m.numel, dtype=m.dtype)
    except MemoryError:
        raise FeedError(f"{where}: {m.dtype.name}{list(m.shape)} does not fit in memory") \
            from None
    view = memoryview(array.view(np.uint8).reshape(-1)) if m.numel else memoryview(b"")
    try:
        with archive.open(m.info) as stream:
            stream.read(m.offset)  # the header, checked already
            done = 0
            while done < len(view):
                chunk = stream.read(min(_CHUNK, len(view) - done))
                if not chunk:
                    raise FeedError(f"{where}: the data ends after {done} of "
                                    f"{len(view)} bytes (a truncated file)")
                view[done:done + len(chunk)] = chunk
                done += len(chunk)
            stream.read(1)  # at the end the zip reader checks the member's CRC
    except (ValueError,) + _READ_ERRORS as e:
        raise FeedError(f"{where}: the data cannot be read ({e})") from None
    finally:
        view.release()
    if not m.dtype.isnative:
        array.byteswap(inplace=True)  # big-endian data: the same values, native order
        array = array.view(m.dtype.newbyteorder("="))
    if m.fortran:
        return array.reshape(m.shape[::-1]).transpose()
    return array.reshape(m.shape)


def _clip(value):
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
