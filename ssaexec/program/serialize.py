"""The JSON form of a program, read: ``program_from_dict``, ``from_json``, ``decode_attr``.

The layout, and the writer (``program_to_dict``, ``to_json``, ``encode_attr``, re-exported
here), are in ``ssaexec.program.json_write``; the strict scanner under the reader is
``ssaexec.program.json_scan``. This module builds programs, so it sits above
``ssaexec.program.desc``; the writer sits below it.

Policy and invariants:

* Round trips are exact: ``program_from_dict(program_to_dict(p)) == p`` and
  ``to_json(from_json(s)) == s`` for any ``s`` that ``to_json`` wrote.
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
  ``max_tensor_elements`` or ``max_rank``, per-dimension attribute lists longer than
  ``max_rank`` allows (``ssaexec.program.bounds``) and ops the operator policy refuses
  (``ssaexec.ops.policy``), before anything else looks at the program.
"""

import json
import math

from ..core.errors import ProgramError
from ..core.limits import depth_problem, shape_problem
from ..ops.policy import op_problem
from .bounds import rank_attr_problem
from .desc import DTYPES, ROLES, BlockRef, OpDesc, ProgramDesc, VarDesc
from .json_scan import (Malformed, check_values, decode_bounded, expect, expect_object,
                        format_path, is_int, locate, set_op_positions, short, type_name)
from .json_write import (BLOCK_KEYS, OP_KEYS, SCHEMA, TOP_KEYS, VAR_KEYS, VERSION, encode_attr,
                         program_to_dict, to_json)

__all__ = ["SCHEMA", "VERSION", "program_to_dict", "program_from_dict", "to_json", "from_json",
           "encode_attr", "decode_attr"]

_VAR_FLAGS = VAR_KEYS[3:]
_NONFINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


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
        check_values(d, [])
        return _decode_program(d)
    except Malformed as e:
        raise ProgramError(f"{source}: {format_path(e.path)}: {e.message}") from None
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
    d = decode_bounded(text, source)
    try:
        check_values(d, [])
        program = _decode_program(d)
    except Malformed as e:
        line, col = locate(text, e.path)
        raise ProgramError(f"{source}:{line}:{col}: {format_path(e.path)}: {e.message}") \
            from None
    set_op_positions(program, text, source)
    return program


def _decode_program(d):
    if not isinstance(d, dict):
        raise Malformed([], f"not an ssaexec program: expected an object, found "
                             f"{type_name(d)} {short(d)}")
    # schema and version first: a foreign or newer file should say so, not trip on keys
    if d.get("schema") != SCHEMA:
        if "schema" not in d:
            raise Malformed([], f"not an ssaexec program: no \"schema\": {json.dumps(SCHEMA)}")
        raise Malformed(["schema"], f"not an ssaexec program: schema is "
                                     f"{short(d['schema'])}, expected {json.dumps(SCHEMA)}")
    if "version" not in d:
        raise Malformed([], "missing key 'version'")
    if not is_int(d["version"]) or d["version"] != VERSION:
        raise Malformed(["version"], f"unsupported version {short(d['version'])}; this "
                                      f"ssaexec reads version {VERSION} only")
    expect_object(d, [], TOP_KEYS)
    expect(is_int(d["random_seed"]), ["random_seed"], "an integer", d["random_seed"])
    counts = d["name_counts"]
    expect(isinstance(counts, dict), ["name_counts"], "an object", counts)
    for k, v in counts.items():
        expect(is_int(v), ["name_counts", k], "an integer", v)
    blocks = d["blocks"]
    expect(isinstance(blocks, list) and blocks, ["blocks"], "a non-empty array", blocks)

    program = ProgramDesc(d["random_seed"])
    depths = []  # per block: how deep it nests (block 0: 0)
    for i, bd in enumerate(blocks):
        _decode_block(program, bd, ["blocks", i], i, depths)
    program.set_name_counts(counts)
    return program


def _decode_block(program, bd, path, i, depths):
    expect_object(bd, path, BLOCK_KEYS)
    expect(is_int(bd["idx"]) and bd["idx"] == i, path + ["idx"], f"the integer {i}",
            bd["idx"])
    parent = bd["parent_idx"]
    # parents come first, which rules out cycles; only block 0 has no parent
    ok = is_int(parent) and (parent == -1 if i == 0 else -1 <= parent < i)
    expect(ok, path + ["parent_idx"],
            "-1" if i == 0 else f"an integer from -1 to {i - 1} (an earlier block)", parent)
    # the nesting bound, before anything walks the blocks recursively
    depths.append(0 if parent < 0 else depths[parent] + 1)
    problem = depth_problem(depths[i], f"block {i}")
    if problem:
        raise Malformed(path + ["parent_idx"], problem)
    block = program.global_block() if i == 0 else program.create_block(parent_idx=parent)
    expect(isinstance(bd["vars"], list), path + ["vars"], "an array", bd["vars"])
    for j, vd in enumerate(bd["vars"]):
        var = _decode_var(vd, path + ["vars", j])
        if var.name in block.vars:
            raise Malformed(path + ["vars", j, "name"], f"var {var.name!r} is declared twice "
                                                         f"in block {i}")
        block.add_var(var)
    expect(isinstance(bd["ops"], list), path + ["ops"], "an array", bd["ops"])
    block.ops = [_decode_op(od, path + ["ops", j]) for j, od in enumerate(bd["ops"])]
    return block


def _decode_var(vd, path):
    expect_object(vd, path, VAR_KEYS)
    name = vd["name"]
    expect(isinstance(name, str) and name, path + ["name"], "a non-empty string", name)
    shape = vd["shape"]
    expect(shape is None or (isinstance(shape, list) and all(is_int(x) for x in shape)),
            path + ["shape"], "null or an array of integers", shape)
    problem = shape_problem(shape, f"var {name!r}: shape")
    if problem:
        raise Malformed(path + ["shape"], problem)
    expect(isinstance(vd["dtype"], str) and vd["dtype"] in DTYPES, path + ["dtype"],
            f"a dtype name ({', '.join(DTYPES)})", vd["dtype"])
    for flag in _VAR_FLAGS:
        expect(isinstance(vd[flag], bool), path + [flag], "true or false", vd[flag])
    return VarDesc(name, shape, vd["dtype"], **{f: vd[f] for f in _VAR_FLAGS})


def _decode_slots(slots, path):
    expect(isinstance(slots, dict), path, "an object mapping slot names to arrays of var "
                                           "names", slots)
    for slot, names in slots.items():
        expect(isinstance(names, list) and all(isinstance(n, str) and n for n in names),
                path + [slot], "an array of non-empty strings (var names)", names)
    return slots


def _decode_op(od, path):
    expect_object(od, path, OP_KEYS)
    expect(isinstance(od["type"], str) and od["type"], path + ["type"], "a non-empty string",
            od["type"])
    inputs = _decode_slots(od["inputs"], path + ["inputs"])
    outputs = _decode_slots(od["outputs"], path + ["outputs"])
    expect(isinstance(od["attrs"], dict), path + ["attrs"], "an object", od["attrs"])
    attrs = {k: _decode_attr(v, path + ["attrs", k]) for k, v in od["attrs"].items()}
    # the operator policy and the rank of per-dimension lists (program.bounds), at load time
    bad = op_problem(od["type"], attrs, inputs) or rank_attr_problem(attrs)
    if bad is not None:
        where, message = bad
        raise Malformed(path + (["type"] if where is None else ["attrs", where]), message)
    expect(isinstance(od["role"], str) and od["role"] in ROLES, path + ["role"],
            f"one of {', '.join(ROLES)}", od["role"])
    role_var = od["role_var"]
    expect(isinstance(role_var, list), path + ["role_var"], "an array of [param, grad] pairs",
            role_var)
    for j, pair in enumerate(role_var):
        expect(isinstance(pair, list) and len(pair) == 2
                and all(isinstance(n, str) and n for n in pair),
                path + ["role_var", j], "a [param, grad] pair of var names", pair)
    return OpDesc(od["type"], inputs, outputs, attrs, od["role"], role_var)


def decode_attr(value, path=()):
    """Inverse of ``encode_attr``; raises ``ProgramError`` on a value it cannot decode."""
    try:
        return _decode_attr(value, list(path))
    except Malformed as e:
        raise ProgramError(f"{format_path(e.path)}: {e.message}") from None


def _decode_attr(value, path):
    if isinstance(value, list):
        return [_decode_attr(v, path + [i]) for i, v in enumerate(value)]
    if isinstance(value, dict):
        if list(value) == ["block"] and is_int(value["block"]) and value["block"] >= 0:
            return BlockRef(value["block"])
        if list(value) == ["float"] and isinstance(value["float"], str) \
                and value["float"] in _NONFINITE:
            return _NONFINITE[value["float"]]
        raise Malformed(path, 'expected an attribute value; the only objects allowed are '
                               '{"block": INDEX} and {"float": "inf" | "-inf" | "nan"}, found '
                               f"{short(value)}")
    return value  # json only yields null, bool, int, float and str here
