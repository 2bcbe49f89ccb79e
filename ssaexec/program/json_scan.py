"""The strict, bounded JSON scanner under the program reader (``ssaexec.program.serialize``).

Files are untrusted (docs/security.md), so the scanner refuses before anything builds a
program: nesting deeper than ``max_nesting`` (measured by one scan before parsing, so a
deep file costs no ``RecursionError``), integers longer than ``max_int_digits`` digits,
``NaN``/``Infinity`` literals, numbers that overflow a float, duplicate keys and strings
holding unpaired surrogates. Literals the reader refuses are kept as values
(``READER``) and reported by ``check_values`` at their JSON path.

A structural problem is a ``Malformed`` (a JSON path and a message); the callers turn it
into ``ProgramError`` naming ``LINE:COL`` (``locate``, run on the error path only) and
the path (``format_path``). ``set_op_positions`` gives every op read from JSON text its
``OpDesc.pos``, so that validation errors name ``FILE:LINE:COL`` too.
"""

import json
import math
import re

from ..core.limits import get_limit

__all__ = ["Malformed", "format_path", "is_int", "too_deep", "decode_bounded", "line_col",
           "READER",
           "check_values", "type_name", "expect", "short", "expect_object", "locate",
           "set_op_positions", "load_bounded"]


class Malformed(Exception):
    """A structural problem at a JSON path; turned into ``ProgramError`` by the callers."""

    __slots__ = ("path", "message")

    def __init__(self, path, message):
        super().__init__(message)
        self.path = path
        self.message = message


def format_path(path):
    """Render a JSON path (keys and indices) as ``blocks[0].ops[3].inputs["Out@GRAD"]``."""
    out = ""
    for key in path:
        if isinstance(key, int):
            out += f"[{key}]"
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            out += f".{key}" if out else key
        else:
            out += f"[{json.dumps(key)}]"
    return out or "<root>"

def is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)

# --- bounded parsing ------------------------------------------------------------------------
# Strings (skipped whole, escapes included) and brackets: enough to measure nesting.
_NESTING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?|[\[\]{}]')


def too_deep(text):
    """Offset of the first bracket nested deeper than ``max_nesting``, else None.

    Measured before parsing so a deep file costs one scan, not a RecursionError
    (the json module recurses once per level).
    """
    limit, depth = get_limit("max_nesting"), 0
    for m in _NESTING.finditer(text):
        c = m.group()[0]
        if c in "[{":
            depth += 1
            if depth > limit:
                return m.start()
        elif c in "]}":
            depth -= 1
    return None


def decode_bounded(text, source):
    """``READER.decode(text)`` after the nesting scan; ``ProgramError`` naming
    ``SOURCE:LINE:COL`` for text nested too deep or that is not JSON."""
    from ..core.errors import ProgramError
    deep = too_deep(text)
    if deep is not None:
        line, col = line_col(text, deep)
        raise ProgramError(f"{source}:{line}:{col}: invalid JSON: nested more than "
                           f"{get_limit('max_nesting')} deep (the limit max_nesting)")
    try:
        return READER.decode(text)
    except json.JSONDecodeError as e:
        raise ProgramError(f"{source}:{e.lineno}:{e.colno}: invalid JSON: {e.msg}") from None
    except RecursionError:  # pragma: no cover - too_deep rules this out
        raise ProgramError(f"{source}: invalid JSON: nested too deeply") from None



def load_bounded(text, source):
    """Any JSON document (a trace, a profile), read as strictly as a program file.

    ``decode_bounded`` then ``check_values``: nesting within ``max_nesting``, no
    ``NaN``/``Infinity`` or overflowing numbers, no overlong integers, no duplicate
    keys or unpaired surrogates. ``ProgramError`` naming ``SOURCE:LINE:COL`` and the
    path of the value at fault otherwise.
    """
    from ..core.errors import ProgramError
    doc = decode_bounded(text, source)
    try:
        check_values(doc, [])
    except Malformed as e:
        line, col = locate(text, e.path)
        raise ProgramError(f"{source}:{line}:{col}: {format_path(e.path)}: {e.message}") \
            from None
    return doc

def line_col(text, pos):
    return text.count("\n", 0, pos) + 1, pos - (text.rfind("\n", 0, pos) + 1) + 1


class _BadLiteral:
    """A number or constant the reader refuses, kept as a value to report it by path."""

    __slots__ = ("text", "why")

    def __init__(self, text, why):
        self.text = text
        self.why = why


def _parse_int(text):
    # int() of a long digit string is quadratic and CPython refuses over 4300 digits
    digits = len(text.lstrip("-"))
    if digits > get_limit("max_int_digits"):
        return _BadLiteral(text, f"an integer of {digits} digits is out of range (the limit "
                                 f"max_int_digits={get_limit('max_int_digits')})")
    return int(text)


def _parse_float(text):
    value = float(text)
    if math.isinf(value):  # 1e999 would silently become inf
        return _BadLiteral(text, f"the number {_short_literal(text)} is out of range (it "
                                 "overflows a float); write a non-finite float as "
                                 '{"float": "inf" | "-inf"}')
    return value


def _short_literal(text):
    return text if len(text) <= 40 else text[:37] + "..."


def _parse_constant(text):
    return _BadLiteral(text, f"{text} is not standard JSON; write a non-finite float as "
                             '{"float": "inf" | "-inf" | "nan"}')


class _Duplicated(dict):
    """An object with a repeated key (the first repeat in ``dup``)."""

    __slots__ = ("dup",)


def _object_pairs(pairs):
    d = {}
    for k, v in pairs:
        if k in d:
            d = _Duplicated(pairs)
            d.dup = k
            return d
        d[k] = v
    return d


READER = json.JSONDecoder(parse_int=_parse_int, parse_float=_parse_float,
                           parse_constant=_parse_constant, object_pairs_hook=_object_pairs)
_SURROGATE = re.compile("[\ud800-\udfff]")


def check_values(value, path):
    """Refuse what ``READER`` kept for reporting: bad literals, duplicates, surrogates.

    Recursion is bounded by ``max_nesting`` (``too_deep`` ran first).
    """
    if isinstance(value, _BadLiteral):
        raise Malformed(path, value.why)
    if isinstance(value, str):
        if _SURROGATE.search(value):
            raise Malformed(path, f"string {short(value)} holds an unpaired surrogate "
                                   "(not valid Unicode text)")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            check_values(v, path + [i])
    elif isinstance(value, dict):
        if isinstance(value, _Duplicated):
            raise Malformed(path + [value.dup], f"key {short(value.dup)} appears twice in "
                                                 "one object")
        for k, v in value.items():
            if _SURROGATE.search(k):
                raise Malformed(path, f"key {short(k)} holds an unpaired surrogate (not "
                                       "valid Unicode text)")
            check_values(v, path + [k])


def type_name(v):
    return {dict: "object", list: "array", str: "string", bool: "boolean",
            int: "integer", float: "number", type(None): "null"}.get(type(v), type(v).__name__)


def expect(cond, path, what, value):
    if not cond:
        raise Malformed(path, f"expected {what}, found {type_name(value)} {short(value)}")


def short(value):
    if isinstance(value, _BadLiteral):
        value = value.text
    try:
        text = json.dumps(value, default=repr)
    except (ValueError, RecursionError):  # a nan, or a value too deep to print
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def expect_object(d, path, keys):
    """Check ``d`` is an object with exactly ``keys``."""
    expect(isinstance(d, dict), path, "an object", d)
    missing = [k for k in keys if k not in d]
    if missing:
        raise Malformed(path, f"missing key {missing[0]!r} (an object here has keys "
                               f"{', '.join(keys)})")
    extra = [k for k in d if k not in keys]
    if extra:
        raise Malformed(path + [extra[0]], f"unknown key {extra[0]!r} (expected only "
                                            f"{', '.join(keys)})")

# --- error locations ------------------------------------------------------------------------
def set_op_positions(program, text, source):
    """Give every op its ``pos`` (source, line, column) in ``text``, for validation errors.

    One scan of the strings and brackets (the nesting scan's tokens) finds the
    object of every ``blocks[i].ops[j]``: the structure was checked, so the last
    string before a container's bracket is its key. An op whose position the scan
    cannot pin (a key spelled with escapes) keeps ``pos = None``.
    """
    offsets = []  # per block, the offset of each op's '{'
    stack = []  # per open container: [role, last string directly inside it]
    for m in _NESTING.finditer(text):
        c = m.group()[0]
        if c == '"':
            if stack:
                stack[-1][1] = m.group()
            continue
        if c in "]}":
            stack.pop()
            continue
        role, key = stack[-1] if stack else ("top", None)
        new = "other"
        if role == "top":
            new = "root"
        elif role == "root" and key == '"blocks"':
            new = "blocks"
        elif role == "blocks":
            new = "block"
            offsets.append([])
        elif role == "block" and key == '"ops"':
            new = "ops"
        elif role == "ops":
            offsets[-1].append(m.start())
        stack.append([new, None])
    line, line_start, scanned = 1, 0, 0
    for block, offs in zip(program.blocks, offsets, strict=False):
        if len(offs) != len(block.ops):
            continue
        for op, off in zip(block.ops, offs, strict=True):
            # offsets only grow: count the newlines since the last one, linear overall
            n = text.count("\n", scanned, off)
            if n:
                line += n
                line_start = text.rfind("\n", scanned, off) + 1
            scanned = off
            op.pos = (source, line, off - line_start + 1)


_WS = re.compile(r"[ \t\n\r]*")
_DECODER = READER  # skips values the way they were read (long integers included)


def locate(text, path):
    """Line and column (1-based) of the value at ``path`` in valid JSON ``text``.

    Only runs on the error path, so it re-scans rather than have the happy path
    track positions; it stops at the deepest prefix of ``path`` it can find.
    """
    pos = _WS.match(text, 0).end()
    try:
        for key in path:
            pos = _child(text, pos, key)
    except _NotFound:
        pass
    except (ValueError, IndexError):  # cannot happen on valid JSON; keep the best position
        pass
    line = text.count("\n", 0, pos) + 1
    col = pos - (text.rfind("\n", 0, pos) + 1) + 1
    return line, col


class _NotFound(Exception):
    __slots__ = ()


def _child(text, pos, key):
    """Position of child ``key`` of the container starting at ``pos``."""
    opener = text[pos]
    if opener not in "[{" or isinstance(key, int) != (opener == "["):
        raise _NotFound
    pos = _WS.match(text, pos + 1).end()
    index = 0
    while text[pos] not in "]}":
        if opener == "{":
            name, pos = _DECODER.raw_decode(text, pos)
            pos = _WS.match(text, pos).end() + 1  # the ':'
            pos = _WS.match(text, pos).end()
            if name == key:
                return pos
        elif index == key:
            return pos
        _, pos = _DECODER.raw_decode(text, pos)
        pos = _WS.match(text, pos).end()
        if text[pos] == ",":
            pos = _WS.match(text, pos + 1).end()
        index += 1
    raise _NotFound
