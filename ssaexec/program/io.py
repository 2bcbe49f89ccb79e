"""Saving and loading programs: ``save_program`` / ``load_program``.

The file suffix picks the form: ``.json`` is the JSON form
(``ssaexec.program.serialize``), ``.txt``, ``.prog`` and ``.ssa`` the text form
(``ssaexec.program.text``); any other suffix is a ``ProgramError``. Files are
UTF-8. Other formats are read-only and registered by the frontend that reads them
(``register_reader``: Paddle's ``.pdmodel``; ``register_sniffer`` for a format that
shares one of our suffixes, such as Paddle's PIR ``.json``, recognised by content), so
this layer imports no frontend.
Loading only parses: it never imports, unpickles or evaluates anything
from the file, and the readers bound their work and apply the operator policy
(docs/security.md), so a program file from anywhere is safe to open: anything
wrong with it is a ``ProgramError`` naming ``PATH:LINE:COL`` where known.
"""

from pathlib import Path

from ..core.errors import ProgramError
from ..core.safe_files import NotRegularFile, atomic_write, read_input
from .serialize import from_json, to_json
from .text import program_from_text, program_to_text

__all__ = ["save_program", "load_program", "FORMATS", "READERS", "SNIFFERS", "register_reader",
           "register_sniffer"]

# suffix -> (writer, reader)
FORMATS = {
    ".json": (to_json, from_json),
    ".txt": (program_to_text, program_from_text),
    ".prog": (program_to_text, program_from_text),
    ".ssa": (program_to_text, program_from_text),
}


# suffix -> reader(data: bytes, source: str) -> ProgramDesc, for read-only formats
READERS = {}

# suffix -> [(sniff(data: bytes) -> bool, reader)]: other formats sharing a suffix with
# ours (Paddle's PIR ``.json``), told apart by content before the suffix's own reader
SNIFFERS = {}


def register_reader(suffix, reader):
    """Have ``load_program`` read files ending in ``suffix`` with ``reader(data, source)``.

    For read-only formats of other frameworks; the frontend that reads them registers
    itself (``ssaexec.frontends.paddle``). ``reader`` gets the file's bytes and its path,
    returns a ``ProgramDesc`` and raises ``ProgramError`` for bad input.
    """
    READERS[suffix.lower()] = reader
    return reader


def register_sniffer(suffix, sniff, reader):
    """Have ``load_program`` read ``suffix`` files whose bytes ``sniff`` accepts with
    ``reader(data, source)`` instead of the suffix's own reader (a foreign format that
    shares the suffix, recognised by content, never by name)."""
    SNIFFERS.setdefault(suffix.lower(), []).append((sniff, reader))
    return reader


def _format(path):
    fmt = FORMATS.get(Path(path).suffix.lower())
    if fmt is None and Path(path).suffix.lower() in READERS:
        raise ProgramError(f"{path}: {Path(path).suffix!r} files are read-only here; write "
                           f"one of {', '.join(FORMATS)}")
    if fmt is None:
        raise ProgramError(f"{path}: unknown program file suffix {Path(path).suffix!r}; "
                           f"use one of {', '.join(FORMATS)}")
    return fmt


def save_program(program, path):
    """Write ``program`` to ``path`` in the form its suffix names.

    Parameters
    ----------
    program : ProgramDesc
    path : str or os.PathLike
        Ends in ``.json`` (JSON) or ``.txt``/``.prog``/``.ssa`` (text).

    Returns
    -------
    pathlib.Path
        The path written: atomically (a crash leaves the old file or the new one), and a
        symlink at ``path`` is replaced, never written through (``safe_files``).
    """
    writer, _ = _format(path)
    path = Path(path)
    data = writer(program).encode("utf-8")

    def write(tmp):
        with open(tmp, "wb") as f:
            f.write(data)
    try:  # atomically, never through a symlink at the target (``safe_files``)
        atomic_write(path, write, prefix=".program-")
    except NotRegularFile as e:
        raise ProgramError(f"{path}: is {e.kind}, not a program file") from None
    except OSError as e:
        raise ProgramError(f"{path}: cannot write program file: {e.strerror or e}") from None
    return path


def load_program(path, validate=False):
    """Read a program from ``path`` (form chosen by the suffix).

    Parameters
    ----------
    path : str or os.PathLike
    validate : bool
        When true, also run ``program.validate()`` before returning.

    Returns
    -------
    ProgramDesc

    Raises
    ------
    ProgramError
        When the file is missing or unreadable, has an unknown suffix, does not
        parse (the message gives ``PATH:LINE:COL``) or, with ``validate``, is invalid.
    """
    binary = READERS.get(Path(path).suffix.lower())
    _, reader = (None, None) if binary is not None else _format(path)
    path = Path(path)
    # a FIFO or a device is refused, not waited on
    data = read_input(path, "program file", "a program file", ProgramError)
    for sniff, foreign in SNIFFERS.get(path.suffix.lower(), ()):
        if sniff(data):
            binary = foreign
            break
    if binary is not None:
        program = binary(data, str(path))
        if validate:
            program.validate()
        return program
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        col = len(data[data.rfind(b"\n", 0, e.start) + 1:e.start].decode("utf-8", "replace")) + 1
        raise ProgramError(f"{path}:{line}:{col}: not UTF-8 text ({e.reason} at byte "
                           f"{e.start})") from None
    program = reader(text, source=str(path))
    if validate:
        program.validate()
    return program
