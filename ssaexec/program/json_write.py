"""The JSON form of a program, written: ``program_to_dict``, ``to_json``, ``encode_attr``.

Layout (schema ``"ssaexec.program"``, version 1)::

    {"schema": "ssaexec.program", "version": 1, "random_seed": 0,
     "name_counts": {"fc": 1},
     "blocks": [{"idx": 0, "parent_idx": -1,
                 "vars": [{"name", "shape", "dtype", "persistable", "is_parameter",
                           "stop_gradient", "is_data"}, ...],
                 "ops": [{"type", "inputs": {slot: [names]}, "outputs": {...},
                          "attrs": {...}, "role", "role_var": [[param, grad], ...]}, ...]}]}

Policy and invariants:

* The writer only reads a program (any object with the ``ProgramDesc`` attributes):
  it imports no ``ProgramDesc``, so ``ProgramDesc.to_dict``/``__eq__`` use it without an
  import cycle. The reader, which builds programs, is ``ssaexec.program.serialize``.
* Key order of slots and attrs is kept; ints stay ints and floats stay floats, so
  ``program_from_dict(program_to_dict(p)) == p`` and ``to_json`` output re-reads and
  re-writes identically.
* The JSON is standard (no ``NaN`` literals): ``BlockRef(i)`` is written as
  ``{"block": i}`` and a non-finite float as ``{"float": "inf" | "-inf" | "nan"}``.
  Because the dict form already carries these encodings, ``ProgramDesc.__eq__``
  (which compares dict forms) treats two ``nan`` attributes as equal.
* ``name_counts`` persists ``ProgramDesc.name_counts`` so a reloaded program keeps
  generating fresh names.
"""

import json
import math

from ..core.errors import ProgramError
from .elements import BlockRef

__all__ = ["SCHEMA", "VERSION", "TOP_KEYS", "BLOCK_KEYS", "VAR_KEYS", "OP_KEYS",
           "encode_attr", "program_to_dict", "to_json"]

SCHEMA = "ssaexec.program"
VERSION = 1

TOP_KEYS = ("schema", "version", "random_seed", "name_counts", "blocks")
BLOCK_KEYS = ("idx", "parent_idx", "vars", "ops")
VAR_KEYS = ("name", "shape", "dtype", "persistable", "is_parameter", "stop_gradient", "is_data")
_VAR_FLAGS = VAR_KEYS[3:]
OP_KEYS = ("type", "inputs", "outputs", "attrs", "role", "role_var")

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
                  for k in VAR_KEYS} for v in block.vars.values()],
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
    lines += [f"  {_dump(k)}: {_dump(d[k])}," for k in TOP_KEYS[:-1]]
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
