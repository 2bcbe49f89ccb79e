"""Saving and loading programs: ``save_program`` / ``load_program``.

The file suffix picks the form: ``.json`` is the JSON form
(``ssaexec.program.serialize``), ``.txt``, ``.prog`` and ``.ssa`` the text form
(``ssaexec.program.text``); any other suffix is a ``ProgramError``. Files are
UTF-8. Loading only parses: it never imports, unpickles or evaluates anything
from the file, and the readers bound their work and apply the operator policy
(docs/security.md), so a program file from anywhere is safe to open: anything
wrong with it is a ``ProgramError`` naming ``PATH:LINE:COL`` where known.
"""

from pathlib import Path

from ..errors import ProgramError
from .serialize import from_json, to_json
from .text import program_from_text, program_to_text

__all__ = ["save_program", "load_program", "FORMATS"]

# suffix -> (writer, reader)
FORMATS = {
    ".json": (to_json, from_json),
    ".txt": (program_to_text, program_from_text),
    ".prog": (program_to_text, program_from_text),
    ".ssa": (program_to_text, program_from_text),
}


def _format(path):
    fmt = FORMATS.get(Path(path).suffix.lower())
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
        The path written.
    """
    writer, _ = _format(path)
    path = Path(path)
    try:
        path.write_text(writer(program), encoding="utf-8")
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
    _, reader = _format(path)
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ProgramError(f"{path}: no such program file") from None
    except OSError as e:
        raise ProgramError(f"{path}: cannot read program file: {e.strerror or e}") from None
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
