"""The JSON form of a program: ``program_to_dict``/``program_from_dict``, ``to_json``/``from_json``.

Layout (schema ``"ssaexec.program"``, version 1)::

    {"schema": "ssaexec.program", "version": 1, "random_seed": 0,
     "name_counts": {"fc": 1},
     "blocks": [{"idx": 0, "parent_idx": -1,
                 "vars": [{"name", "shape", "dtype", "persistable", "is_parameter",
                           "stop_gradient", "is_data"}, ...],
                 "ops": [{"type", "inputs": {slot: [names]}, "outputs": {...},
                          "attrs": {...}, "role", "role_var": [[param, grad], ...]}, ...]}]}

Policy and invariants:

* Round trips are exact: ``program_from_dict(program_to_dict(p)) == p`` and
  ``to_json(from_json(s)) == s`` for any ``s`` that ``to_json`` wrote. Key order of
  slots and attrs is kept; ints stay ints and floats stay floats.
* The JSON is standard (no ``NaN`` literals): ``BlockRef(i)`` is written as
  ``{"block": i}`` and a non-finite float as ``{"float": "inf" | "-inf" | "nan"}``.
  Because the dict form already carries these encodings, ``ProgramDesc.__eq__``
  (which compares dict forms) treats two ``nan`` attributes as equal.
* ``name_counts`` persists ``ProgramDesc.name_counts`` so a reloaded program keeps
  generating fresh names.
* Reading is strict: every key is required, unknown keys are errors, and every
  problem raises ``ProgramError`` naming the source and where: ``LINE:COL`` for
  bad JSON, ``LINE:COL`` plus the JSON path (``blocks[0].ops[3].inputs``) for a
  structural error. Nothing is ever executed while reading (no pickle, no eval).
  ``from_json`` gives every op its position (``OpDesc.pos``), so that validation
  errors name ``FILE:LINE:COL`` too.
* Reading is bounded, because files are untrusted (docs/security.md): nesting
  deeper than ``max_nesting``, integers longer than ``max_int_digits`` digits,
  ``NaN``/``Infinity`` literals, numbers that overflow a float (``1e999``),
  blocks nested deeper than ``max_block_depth``, duplicate keys and strings holding unpaired
  surrogates are errors with their position; so are declared shapes above
  ``max_tensor_elements`` and ops the operator policy refuses
  (``ssaexec.ops.policy``), before anything else looks at the program.

Size: the JSON form's writer and its checking reader belong together (over 500 lines).
"""

import json
import math
import re

from ..errors import ProgramError
from ..limits import depth_problem, get_limit, shape_problem
from ..ops.policy import op_problem
from .desc import DTYPES, ROLES, BlockRef, OpDesc, ProgramDesc, VarDesc

__all__ = ["SCHEMA", "VERSION", "program_to_dict", "program_from_dict", "to_json", "from_json",
           "encode_attr", "decode_attr"]

SCHEMA = "ssaexec.program"
VERSION = 1

_TOP_KEYS = ("schema", "version", "random_seed", "name_counts", "blocks")
_BLOCK_KEYS = ("idx", "parent_idx", "vars", "ops")
_VAR_KEYS = ("name", "shape", "dtype", "persistable", "is_parameter", "stop_gradient", "is_data")
_VAR_FLAGS = _VAR_KEYS[3:]
_OP_KEYS = ("type", "inputs", "outputs", "attrs", "role", "role_var")
_NONFINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


# --- writing ------------------------------------------------------------------------------
def encode_attr(value):
    """Return the JSON-ready form of one attribute value (see the module docstring)."""
    if isinstance(value, BlockRef):
        return {"block": value.idx}
    if isinstance(value, float) and not math.isfinite(value):
        return {"float": "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")}
    if isinstance(value, (list, tuple)):
        return [encode_attr(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise ProgramError(f"attribute value {value!r} of type {type(value).__name__} cannot be "
                       "serialised; use int, float, bool, str, None, lists of them or BlockRef")


def program_to_dict(program):
    """Return the JSON-ready dict form of ``program``.

    Parameters
    ----------
    program : ProgramDesc

    Returns
    -------
    dict
        Plain JSON values only; ``json.dumps(..., allow_nan=False)`` accepts it.
    """
    return {
        "schema": SCHEMA,
        "version": VERSION,
        "random_seed": program.random_seed,
        "name_counts": dict(program.name_counts),
        "blocks": [_block_to_dict(b) for b in program.blocks],
    }


def _block_to_dict(block):
    return {
        "idx": block.idx,
        "parent_idx": block.parent_idx,
        "vars": [{k: (list(v.shape) if k == "shape" and v.shape is not None else getattr(v, k))
                  for k in _VAR_KEYS} for v in block.vars.values()],
        "ops": [_op_to_dict(op) for op in block.ops],
    }


def _op_to_dict(op):
    return {
        "type": op.type,
        "inputs": {k: list(v) for k, v in op.inputs.items()},
        "outputs": {k: list(v) for k, v in op.outputs.items()},
        "attrs": {k: encode_attr(v) for k, v in op.attrs.items()},
        "role": op.role,
        "role_var": [list(pair) for pair in op.role_var],
    }


def to_json(program):
    """Serialise ``program`` to a JSON string (one var or op per line, ends with a newline).

    Parameters
    ----------
    program : ProgramDesc

    Returns
    -------
    str
        Standard JSON; ``from_json`` reads it back to an equal program and
        ``to_json(from_json(s)) == s``.
    """
    d = program_to_dict(program)
    lines = ["{"]
    lines += [f"  {_dump(k)}: {_dump(d[k])}," for k in _TOP_KEYS[:-1]]
    if not d["blocks"]:
        lines.append('  "blocks": []')
    else:
        lines.append('  "blocks": [')
        for i, b in enumerate(d["blocks"]):
            lines.append("    {")
            lines.append(f'      "idx": {_dump(b["idx"])},')
            lines.append(f'      "parent_idx": {_dump(b["parent_idx"])},')
            lines.append(f'      "vars": {_dump_rows(b["vars"], "      ")},')
            lines.append(f'      "ops": {_dump_rows(b["ops"], "      ")}')
            lines.append("    }" + ("," if i + 1 < len(d["blocks"]) else ""))
        lines.append("  ]")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _dump(value):
    # allow_nan=False: non-finite floats must have been encoded; a raw one is a bug
    return json.dumps(value, ensure_ascii=False, allow_nan=False)


def _dump_rows(rows, indent):
    # One row per line keeps files diffable without exploding shapes over many lines.
    if not rows:
        return "[]"
    body = ",\n".join(f"{indent}  {_dump(r)}" for r in rows)
    return f"[\n{body}\n{indent}]"


# --- reading ------------------------------------------------------------------------------
class _Malformed(Exception):
    """A structural problem at a JSON path; turned into ``ProgramError`` by the callers."""

    __slots__ = ("path", "message")

    def __init__(self, path, message):
        super().__init__(message)
        self.path = path
        self.message = message


def _format_path(path):
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


def program_from_dict(d, source="<dict>"):
    """Build a ``ProgramDesc`` from its dict form.

    Parameters
    ----------
    d : dict
        What ``program_to_dict`` returns (or ``json.loads`` of a saved file).
    source : str
        Name used in error messages.

    Returns
    -------
    ProgramDesc

    Raises
    ------
    ProgramError
        On any structural problem, naming ``source`` and the JSON path.
    """
    try:
        _check_values(d, [])
        return _decode_program(d)
    except _Malformed as e:
        raise ProgramError(f"{source}: {_format_path(e.path)}: {e.message}") from None
    except RecursionError:  # a dict built in Python can nest without bound
        raise ProgramError(f"{source}: nested too deeply") from None


def from_json(text, source="<string>"):
    """Parse a program from JSON text.

    Parameters
    ----------
    text : str
        JSON as written by ``to_json``.
    source : str
        File name (or other label) used in error messages.

    Returns
    -------
    ProgramDesc

    Raises
    ------
    ProgramError
        ``SOURCE:LINE:COL: ...`` for invalid JSON; ``SOURCE:LINE:COL: PATH: ...``
        for a structural problem (missing key, wrong type, wrong schema or version).
    """
    if not isinstance(text, str):
        raise ProgramError(f"{source}: expected JSON text (str), got {type(text).__name__}")
    deep = _too_deep(text)
    if deep is not None:
        line, col = _line_col(text, deep)
        raise ProgramError(f"{source}:{line}:{col}: invalid JSON: nested more than "
                           f"{get_limit('max_nesting')} deep (the limit max_nesting)")
    try:
        d = _READER.decode(text)
    except json.JSONDecodeError as e:
        raise ProgramError(f"{source}:{e.lineno}:{e.colno}: invalid JSON: {e.msg}") from None
    except RecursionError:  # pragma: no cover - _too_deep rules this out
        raise ProgramError(f"{source}: invalid JSON: nested too deeply") from None
    try:
        _check_values(d, [])
        program = _decode_program(d)
    except _Malformed as e:
        line, col = _locate(text, e.path)
        raise ProgramError(f"{source}:{line}:{col}: {_format_path(e.path)}: {e.message}") \
            from None
    _set_op_positions(program, text, source)
    return program


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


# --- bounded parsing ------------------------------------------------------------------------
# Strings (skipped whole, escapes included) and brackets: enough to measure nesting.
_NESTING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?|[\[\]{}]')


def _too_deep(text):
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


def _line_col(text, pos):
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


_READER = json.JSONDecoder(parse_int=_parse_int, parse_float=_parse_float,
                           parse_constant=_parse_constant, object_pairs_hook=_object_pairs)
_SURROGATE = re.compile("[\ud800-\udfff]")


def _check_values(value, path):
    """Refuse what ``_READER`` kept for reporting: bad literals, duplicates, surrogates.

    Recursion is bounded by ``max_nesting`` (``_too_deep`` ran first).
    """
    if isinstance(value, _BadLiteral):
        raise _Malformed(path, value.why)
    if isinstance(value, str):
        if _SURROGATE.search(value):
            raise _Malformed(path, f"string {_short(value)} holds an unpaired surrogate "
                                   "(not valid Unicode text)")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_values(v, path + [i])
    elif isinstance(value, dict):
        if isinstance(value, _Duplicated):
            raise _Malformed(path + [value.dup], f"key {_short(value.dup)} appears twice in "
                                                 "one object")
        for k, v in value.items():
            if _SURROGATE.search(k):
                raise _Malformed(path, f"key {_short(k)} holds an unpaired surrogate (not "
                                       "valid Unicode text)")
            _check_values(v, path + [k])


def _type_name(v):
    return {dict: "object", list: "array", str: "string", bool: "boolean",
            int: "integer", float: "number", type(None): "null"}.get(type(v), type(v).__name__)


def _expect(cond, path, what, value):
    if not cond:
        raise _Malformed(path, f"expected {what}, found {_type_name(value)} {_short(value)}")


def _short(value):
    if isinstance(value, _BadLiteral):
        value = value.text
    try:
        text = json.dumps(value, default=repr)
    except (ValueError, RecursionError):  # a nan, or a value too deep to print
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _object(d, path, keys):
    """Check ``d`` is an object with exactly ``keys``."""
    _expect(isinstance(d, dict), path, "an object", d)
    missing = [k for k in keys if k not in d]
    if missing:
        raise _Malformed(path, f"missing key {missing[0]!r} (an object here has keys "
                               f"{', '.join(keys)})")
    extra = [k for k in d if k not in keys]
    if extra:
        raise _Malformed(path + [extra[0]], f"unknown key {extra[0]!r} (expected only "
                                            f"{', '.join(keys)})")


def _decode_program(d):
    if not isinstance(d, dict):
        raise _Malformed([], f"not an ssaexec program: expected an object, found "
                             f"{_type_name(d)} {_short(d)}")
    # schema and version first: a foreign or newer file should say so, not trip on keys
    if d.get("schema") != SCHEMA:
        if "schema" not in d:
            raise _Malformed([], f"not an ssaexec program: no \"schema\": {json.dumps(SCHEMA)}")
        raise _Malformed(["schema"], f"not an ssaexec program: schema is "
                                     f"{_short(d['schema'])}, expected {json.dumps(SCHEMA)}")
    if "version" not in d:
        raise _Malformed([], "missing key 'version'")
    if not _is_int(d["version"]) or d["version"] != VERSION:
        raise _Malformed(["version"], f"unsupported version {_short(d['version'])}; this "
                                      f"ssaexec reads version {VERSION} only")
    _object(d, [], _TOP_KEYS)
    _expect(_is_int(d["random_seed"]), ["random_seed"], "an integer", d["random_seed"])
    counts = d["name_counts"]
    _expect(isinstance(counts, dict), ["name_counts"], "an object", counts)
    for k, v in counts.items():
        _expect(_is_int(v), ["name_counts", k], "an integer", v)
    blocks = d["blocks"]
    _expect(isinstance(blocks, list) and blocks, ["blocks"], "a non-empty array", blocks)

    program = ProgramDesc(d["random_seed"])
    depths = []  # per block: how deep it nests (block 0: 0)
    for i, bd in enumerate(blocks):
        _decode_block(program, bd, ["blocks", i], i, depths)
    program.set_name_counts(counts)
    return program


def _decode_block(program, bd, path, i, depths):
    _object(bd, path, _BLOCK_KEYS)
    _expect(_is_int(bd["idx"]) and bd["idx"] == i, path + ["idx"], f"the integer {i}",
            bd["idx"])
    parent = bd["parent_idx"]
    # parents come first, which rules out cycles; only block 0 has no parent
    ok = _is_int(parent) and (parent == -1 if i == 0 else -1 <= parent < i)
    _expect(ok, path + ["parent_idx"],
            "-1" if i == 0 else f"an integer from -1 to {i - 1} (an earlier block)", parent)
    # the nesting bound, before anything walks the blocks recursively
    depths.append(0 if parent < 0 else depths[parent] + 1)
    problem = depth_problem(depths[i], f"block {i}")
    if problem:
        raise _Malformed(path + ["parent_idx"], problem)
    block = program.global_block() if i == 0 else program.create_block(parent_idx=parent)
    _expect(isinstance(bd["vars"], list), path + ["vars"], "an array", bd["vars"])
    for j, vd in enumerate(bd["vars"]):
        var = _decode_var(vd, path + ["vars", j])
        if var.name in block.vars:
            raise _Malformed(path + ["vars", j, "name"], f"var {var.name!r} is declared twice "
                                                         f"in block {i}")
        block.add_var(var)
    _expect(isinstance(bd["ops"], list), path + ["ops"], "an array", bd["ops"])
    block.ops = [_decode_op(od, path + ["ops", j]) for j, od in enumerate(bd["ops"])]
    return block


def _decode_var(vd, path):
    _object(vd, path, _VAR_KEYS)
    name = vd["name"]
    _expect(isinstance(name, str) and name, path + ["name"], "a non-empty string", name)
    shape = vd["shape"]
    _expect(shape is None or (isinstance(shape, list) and all(_is_int(x) for x in shape)),
            path + ["shape"], "null or an array of integers", shape)
    problem = shape_problem(shape, f"var {name!r}: shape")
    if problem:
        raise _Malformed(path + ["shape"], problem)
    _expect(isinstance(vd["dtype"], str) and vd["dtype"] in DTYPES, path + ["dtype"],
            f"a dtype name ({', '.join(DTYPES)})", vd["dtype"])
    for flag in _VAR_FLAGS:
        _expect(isinstance(vd[flag], bool), path + [flag], "true or false", vd[flag])
    return VarDesc(name, shape, vd["dtype"], **{f: vd[f] for f in _VAR_FLAGS})


def _decode_slots(slots, path):
    _expect(isinstance(slots, dict), path, "an object mapping slot names to arrays of var "
                                           "names", slots)
    for slot, names in slots.items():
        _expect(isinstance(names, list) and all(isinstance(n, str) and n for n in names),
                path + [slot], "an array of non-empty strings (var names)", names)
    return slots


def _decode_op(od, path):
    _object(od, path, _OP_KEYS)
    _expect(isinstance(od["type"], str) and od["type"], path + ["type"], "a non-empty string",
            od["type"])
    inputs = _decode_slots(od["inputs"], path + ["inputs"])
    outputs = _decode_slots(od["outputs"], path + ["outputs"])
    _expect(isinstance(od["attrs"], dict), path + ["attrs"], "an object", od["attrs"])
    attrs = {k: _decode_attr(v, path + ["attrs", k]) for k, v in od["attrs"].items()}
    bad = op_problem(od["type"], attrs, inputs)  # the operator policy, at load time
    if bad is not None:
        where, message = bad
        raise _Malformed(path + (["type"] if where is None else ["attrs", where]), message)
    _expect(isinstance(od["role"], str) and od["role"] in ROLES, path + ["role"],
            f"one of {', '.join(ROLES)}", od["role"])
    role_var = od["role_var"]
    _expect(isinstance(role_var, list), path + ["role_var"], "an array of [param, grad] pairs",
            role_var)
    for j, pair in enumerate(role_var):
        _expect(isinstance(pair, list) and len(pair) == 2
                and all(isinstance(n, str) and n for n in pair),
                path + ["role_var", j], "a [param, grad] pair of var names", pair)
    return OpDesc(od["type"], inputs, outputs, attrs, od["role"], role_var)


def decode_attr(value, path=()):
    """Inverse of ``encode_attr``; raises ``ProgramError`` on a value it cannot decode."""
    try:
        return _decode_attr(value, list(path))
    except _Malformed as e:
        raise ProgramError(f"{_format_path(e.path)}: {e.message}") from None


def _decode_attr(value, path):
    if isinstance(value, list):
        return [_decode_attr(v, path + [i]) for i, v in enumerate(value)]
    if isinstance(value, dict):
        if list(value) == ["block"] and _is_int(value["block"]) and value["block"] >= 0:
            return BlockRef(value["block"])
        if list(value) == ["float"] and isinstance(value["float"], str) \
                and value["float"] in _NONFINITE:
            return _NONFINITE[value["float"]]
        raise _Malformed(path, 'expected an attribute value; the only objects allowed are '
                               '{"block": INDEX} and {"float": "inf" | "-inf" | "nan"}, found '
                               f"{_short(value)}")
    return value  # json only yields null, bool, int, float and str here


# --- error locations ------------------------------------------------------------------------
def _set_op_positions(program, text, source):
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
_DECODER = _READER  # skips values the way they were read (long integers included)


def _locate(text, path):
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
