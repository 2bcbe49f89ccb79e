"""Decode Paddle 3's PIR program JSON (``model.json``) into plain, checked Python objects.

Paddle 3 saves programs in its new IR, PIR, as JSON by default (``paddle.jit.save``,
``paddle.static.save_inference_model``; the model zoos' ``inference.json``). The file
is already SSA: regions of blocks of ops, each op with operand value ids (``I``),
result values with their types (``O``), attributes (``A``) and result attributes
(``OA``), under ``{"base_code": {"magic": "pir", "version": N}, "program": ...}``.
Keys and names are compressed: ``"#"`` is an id, ``"%"`` a value id, an op name is
``DIALECT_ID.NAME`` (``0`` builtin, ``1`` pd_op, ``2`` cf, ``3`` custom_op, ``4``
dist), and ``"p"`` is ``builtin.parameter``. ``decode_pir(text, source)`` turns it
into a ``PirProgram``: the top block's ``PirOp`` list, values with dtype and shape,
attributes decoded to Python values. ``pir_convert`` maps that onto the legacy
``PaddleProgram`` so that the op table (``ops``) serves both formats.

Policy (docs/security.md, docs/paddle.md):

* the text is untrusted data: decoding builds these objects and nothing else;
* the JSON scan is ssaexec's own (``program.json_scan``): nesting is measured
  before parsing (``max_nesting``), long integers, non-finite literals and duplicate
  keys are refused, and every problem is a ``ProgramError`` naming ``LINE:COL``
  and the JSON path (``program.regions[0].blocks[0].ops[3].O[0]``);
* SSA is checked: every value is defined once, before its uses; an op that uses a
  value defined after it (a cycle) or nowhere is refused;
* declared shapes are bounded by ``ssaexec.core.limits``; unknown dialects, types and
  attribute kinds are refused by name; versions newer than ``VERSIONS`` are refused
  with the version found.
"""

import re

from ...core.errors import ProgramError
from ...core.limits import shape_problem
from ...program.json_scan import (Malformed, check_values, decode_bounded, format_path,
                                  locate, short, type_name)

__all__ = ["PirProgram", "PirOp", "PirValue", "decode_pir", "is_pir", "VERSIONS",
           "DIALECTS", "DTYPES"]

# Format versions this reader knows (``base_code.version``): Paddle 3.0, 3.1, 3.2 and 3.3
# write 1, 2, 3 and 4 (0: development builds). The structure is the same in all; between
# versions some attributes changed kind (pool2d's sizes a_i32 -> a_i64 in 2, a few float
# attributes a_f32 -> a_f64 in 4), which the reader takes either way (docs/paddle.md)
VERSIONS = (0, 1, 2, 3, 4)

# compressed dialect ids (Paddle's DialectIdMap)
DIALECTS = {"0": "builtin", "1": "pd_op", "2": "cf", "3": "custom_op", "4": "pd_dist"}

# builtin element types -> our dtype names
DTYPES = {"t_bool": "bool", "t_i8": "int8", "t_ui8": "uint8", "t_i16": "int16",
          "t_i32": "int32", "t_i64": "int64", "t_f16": "float16", "t_bf16": "bfloat16",
          "t_f32": "float32", "t_f64": "float64"}
_COMPLEX = ("t_c64", "t_c128")

# attribute value kinds -> how their "D" decodes
_SCALARS = {"a_bool": bool, "a_i32": int, "a_i64": int, "a_f32": float, "a_f64": float,
            "a_str": str, "a_dtype": str, "a_layout": str, "a_datalayout": str}

_SNIFF = re.compile(rb'\A\s*\{\s*"base_code"\s*:\s*\{[^{}]*"magic"\s*:\s*"pir"')


def is_pir(data):
    """True when ``data`` (bytes or text) starts like a PIR program JSON file."""
    head = data[:4096]
    if isinstance(head, str):
        head = head.encode("utf-8", "replace")
    return bool(_SNIFF.match(bytes(head)))


class PirValue:
    """An SSA value: its id, dtype (our name, or None for a non-tensor), shape and form
    (``dtensor``, ``vec`` of ``items``, ``scalar`` or ``null``)."""

    __slots__ = ("id", "dtype", "shape", "form", "items")

    def __init__(self, id, dtype, shape, form="dtensor", items=None):
        self.id, self.dtype, self.shape, self.form, self.items = id, dtype, shape, form, items

    def __repr__(self):
        return f"PirValue(%{self.id}, {self.form}, {self.dtype}, {self.shape})"


class PirOp:
    """An op of the top block: full name (``pd_op.conv2d``), operand ids (None for a
    null operand), result values, decoded attributes and result attributes."""

    __slots__ = ("name", "index", "operands", "results", "attrs", "result_attrs", "path")

    def __init__(self, name, index, operands, results, attrs, result_attrs, path):
        self.name, self.index, self.operands, self.results = name, index, operands, results
        self.attrs, self.result_attrs, self.path = attrs, result_attrs, path

    @property
    def dialect(self):
        return self.name.split(".", 1)[0]

    @property
    def op_type(self):
        return self.name.split(".", 1)[1]

    @property
    def where(self):
        """``op I (NAME)``: how errors name this op."""
        return f"op {self.index} ({self.name})"

    def __repr__(self):
        return f"PirOp({self.name} #{self.index}, in={self.operands}, " \
               f"out={[v.id for v in self.results]})"


class PirProgram:
    """A decoded PIR program: the top block's ops, its values, the format version."""

    __slots__ = ("ops", "values", "version", "trainable", "source")

    def __init__(self, ops, values, version, trainable, source):
        self.ops, self.values, self.version = ops, values, version
        self.trainable, self.source = trainable, source

    def parameters(self):
        """``[(name, PirValue)]`` of the parameter ops, in program order."""
        return [(op.attrs["name"], op.results[0]) for op in self.ops
                if op.name == "builtin.parameter"]

    def persistable_names(self):
        """The parameters a ``.pdiparams`` file holds, in its order: sorted by name, as
        Paddle's ``save_combine`` writes them."""
        return sorted(name for name, _ in self.parameters())


def decode_pir(text, source="<string>"):
    """Decode a PIR program JSON text (``str`` or UTF-8 ``bytes``) into a ``PirProgram``.

    Raises
    ------
    ProgramError
        ``SOURCE:LINE:COL: PATH: ...`` for anything that is not a well-formed PIR
        program of a known version.
    """
    if isinstance(text, (bytes, bytearray, memoryview)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as e:
            raise ProgramError(f"{source}: not UTF-8 text (byte {e.start}); not a Paddle PIR "
                               "program") from None
    d = decode_bounded(text, source)
    try:
        check_values(d, [])
        return _Decoder(source).program(d)
    except Malformed as e:
        line, col = locate(text, e.path)
        raise ProgramError(f"{source}:{line}:{col}: {format_path(e.path)}: {e.message}") \
            from None


def _need(cond, path, message):
    if not cond:
        raise Malformed(path, message)


def _obj(d, path, what):
    _need(isinstance(d, dict), path, f"{what} must be an object, found {type_name(d)} "
                                     f"{short(d)}")
    return d


def _list(d, path, what):
    _need(isinstance(d, list), path, f"{what} must be a list, found {type_name(d)} {short(d)}")
    return d


def _int(v, path, what):
    _need(isinstance(v, int) and not isinstance(v, bool), path,
          f"{what} must be an integer, found {type_name(v)} {short(v)}")
    return v


class _Decoder:
    def __init__(self, source):
        self.source = source
        self.values = {}

    def program(self, d):
        _obj(d, [], "a PIR program")
        base = _obj(d.get("base_code"), ["base_code"], "base_code")
        _need(base.get("magic") == "pir", ["base_code", "magic"],
              f"not a Paddle PIR program: magic is {short(base.get('magic'))}, expected \"pir\"")
        version = _int(base.get("version"), ["base_code", "version"], "the version")
        _need(version in VERSIONS, ["base_code", "version"],
              f"PIR format version {version} is not supported (this reader knows versions "
              f"{VERSIONS[0]} to {VERSIONS[-1]}, written by Paddle 3.0 to 3.3); re-save the "
              "model with a Paddle that writes one of them")
        prog = _obj(d.get("program"), ["program"], "program")
        regions = _list(prog.get("regions"), ["program", "regions"], "regions")
        _need(len(regions) == 1, ["program", "regions"],
              f"a program has one top region, found {len(regions)}")
        path = ["program", "regions", 0]
        region = _obj(regions[0], path, "a region")
        blocks = _list(region.get("blocks"), path + ["blocks"], "blocks")
        _need(len(blocks) == 1, path + ["blocks"],
              f"the top region has one block, found {len(blocks)}")
        path = path + ["blocks", 0]
        block = _obj(blocks[0], path, "a block")
        args = _list(block.get("args", []), path + ["args"], "args")
        _need(not args, path + ["args"], "the top block takes no arguments")
        ops = [self.op(o, path + ["ops", k], k)
               for k, o in enumerate(_list(block.get("ops"), path + ["ops"], "ops"))]
        return PirProgram(ops, self.values, version, bool(base.get("trainable", False)),
                          self.source)

    # --- ops ------------------------------------------------------------------------------
    def op(self, o, path, index):
        _obj(o, path, "an op")
        name = o.get("#")
        _need(isinstance(name, str) and name, path + ["#"], "the op has no name")
        if name == "p":
            return self.parameter(o, path, index)
        dialect, dot, op_name = name.partition(".")
        _need(dot and op_name, path + ["#"], f"op name {short(name)} is not DIALECT.NAME")
        _need(dialect in DIALECTS, path + ["#"],
              f"unknown dialect {short(dialect)} in op {short(name)} (known: "
              f"{', '.join(f'{k} {v}' for k, v in DIALECTS.items())})")
        full = f"{DIALECTS[dialect]}.{op_name}"
        _need("regions" not in o or not o["regions"], path + ["regions"],
              f"{full}: ops with regions (control flow) are not supported")
        operands = []
        for k, v in enumerate(_list(o.get("I", []), path + ["I"], "operands")):
            operands.append(self.use(v, path + ["I", k], index, full))
        results = []
        for k, v in enumerate(_list(o.get("O", []), path + ["O"], "results")):
            results.append(self.define(v, path + ["O", k]))
        attrs = self.attrs(o.get("A", []), path + ["A"])
        result_attrs = self.attrs(o.get("OA", []), path + ["OA"])
        return PirOp(full, index, operands, results, attrs, result_attrs, path)

    def parameter(self, o, path, index):
        # builtin.parameter, compressed: "A": [is_distributed, is_parameter, need_clip,
        # name], one result "O" (an object), "OA": [persistable, stop_gradient, trainable]
        a = _list(o.get("A"), path + ["A"], "a parameter's A")
        _need(len(a) == 4 and isinstance(a[3], str) and a[3], path + ["A"],
              f"a parameter's A must be [is_distributed, is_parameter, need_clip, name], "
              f"found {short(a)}")
        name = a[3]
        _need(re.fullmatch(r"[^\x00-\x1f/\\]{1,512}", name) is not None and name not in
              (".", ".."), path + ["A", 3], f"parameter name {short(name)} is not a plain name")
        result = self.define(o.get("O"), path + ["O"])
        flags = o.get("OA", [])
        _list(flags, path + ["OA"], "a parameter's OA")
        attrs = {"name": name, "is_distributed": bool(a[0]), "is_parameter": bool(a[1]),
                 "need_clip": bool(a[2])}
        keys = ("persistable", "stop_gradient", "trainable")
        result_attrs = {k: bool(v) for k, v in zip(keys, flags, strict=False)}
        return PirOp("builtin.parameter", index, [], [result], attrs, result_attrs, path)

    # --- values ---------------------------------------------------------------------------
    def define(self, v, path):
        _obj(v, path, "a result")
        vid = _int(v.get("%"), path + ["%"], "a value id")
        _need(vid > 0, path + ["%"], f"value id {vid} must be positive")
        _need(vid not in self.values, path + ["%"], f"value %{vid} is defined twice")
        value = self.type(v.get("TT"), path + ["TT"], vid)
        self.values[vid] = value
        return value

    def use(self, v, path, index, name):
        _obj(v, path, "an operand")
        vid = _int(v.get("%"), path + ["%"], "a value id")
        if vid == 0:
            return None  # a null operand (an optional input left out)
        _need(vid in self.values, path + ["%"],
              f"op {index} ({name}) uses value %{vid}, which no earlier op defines (a value "
              "used before its definition, or a cycle)")
        return vid

    def type(self, t, path, vid):
        _obj(t, path, "a type")
        tid = t.get("#")
        _need(isinstance(tid, str), path + ["#"], "the type has no id")
        if tid == "NULL":
            return PirValue(vid, None, None, "null")
        dialect, _, tag = tid.partition(".")
        if tag == "t_dtensor":
            data = _list(t.get("D"), path + ["D"], "a dense tensor type's D")
            _need(len(data) >= 2, path + ["D"], "a dense tensor type's D is [dtype, dims, "
                                                "layout, lod, offset]")
            dtype = self.element(data[0], path + ["D", 0])
            dims = _list(data[1], path + ["D", 1], "dims")
            for k, x in enumerate(dims):
                _int(x, path + ["D", 1, k], "a dim")
            problem = shape_problem(dims, "the declared shape")
            _need(problem is None, path + ["D", 1], problem or "")
            if len(data) > 3:
                lod = _list(data[3], path + ["D", 3], "lod")
                _need(not lod, path + ["D", 3], "LoD (sequence) tensors are not supported")
            return PirValue(vid, dtype, list(dims))
        if tag == "t_vec":
            items = _list(t.get("D", []), path + ["D"], "a vector type's D")
            return PirValue(vid, None, None, "vec",
                            [self.type(x, path + ["D", k], vid) for k, x in enumerate(items)])
        if tag in DTYPES or tag in _COMPLEX:  # a bare element type (a scalar result)
            return PirValue(vid, self.element(t, path), [], "scalar")
        _need(False, path + ["#"], f"type {short(tid)} is not supported (dense tensors, "
                                   "vectors of them and element types are)")

    def element(self, t, path):
        _obj(t, path, "an element type")
        tid = t.get("#")
        tag = tid.partition(".")[2] if isinstance(tid, str) else None
        _need(tag in DTYPES, path + ["#"],
              f"element type {short(tid)} has no ssaexec dtype (supported: "
              f"{', '.join(sorted(DTYPES.values()))})")
        return DTYPES[tag]

    # --- attributes -----------------------------------------------------------------------
    def attrs(self, entries, path):
        out = {}
        for k, e in enumerate(_list(entries, path, "attributes")):
            _obj(e, path + [k], "an attribute")
            name = e.get("N")
            _need(isinstance(name, str) and name, path + [k, "N"], "the attribute has no name")
            _need(name not in out, path + [k, "N"], f"attribute {name!r} is given twice")
            out[name] = self.attr(e.get("AT"), path + [k, "AT"])
        return out

    def attr(self, a, path):
        _obj(a, path, "an attribute value")
        tid = a.get("#")
        _need(isinstance(tid, str), path + ["#"], "the attribute value has no tag")
        tag = tid.partition(".")[2]
        data = a.get("D")
        if tag in ("a_f32", "a_f64") and "VD" in a:
            # a non-finite float: {"VD": "NaN" | "INF" | "-INF"} in place of "D"
            vd = a["VD"]
            _need(isinstance(vd, str) and vd.upper() in ("NAN", "INF", "-INF"), path + ["VD"],
                  f"a non-finite float is NaN, INF or -INF, found {short(vd)}")
            return float(vd.lower())
        if tag in _SCALARS:
            want = _SCALARS[tag]
            ok = isinstance(data, want) and not (want is int and isinstance(data, bool))
            if want is float and isinstance(data, int) and not isinstance(data, bool):
                data, ok = float(data), True
            if want is float and isinstance(data, str) and data in ("inf", "-inf", "nan"):
                data, ok = float(data), True
            _need(ok, path + ["D"], f"a {tag} attribute holds {type_name(data)} {short(data)}")
            return data
        if tag == "a_array":
            items = _list(data, path + ["D"], "an array attribute")
            return [self.attr(x, path + ["D", k]) for k, x in enumerate(items)]
        if tag == "a_intarray":
            items = _list(data, path + ["D"], "an int array attribute")
            for k, x in enumerate(items):
                _int(x, path + ["D", k], "an int array entry")
            return list(items)
        if tag == "a_place":
            return list(_list(data, path + ["D"], "a place attribute"))
        if tag == "a_scalar":
            # [element type id, value]: a number of any dtype
            items = _list(data, path + ["D"], "a scalar attribute")
            _need(len(items) == 2 and isinstance(items[1], (int, float, bool, str)),
                  path + ["D"], f"a scalar attribute is [dtype, value], found {short(items)}")
            v = items[1]
            if isinstance(v, str):
                _need(v in ("inf", "-inf", "nan"), path + ["D", 1],
                      f"a scalar's value {short(v)} is not a number")
                v = float(v)
            return v
        if tag == "a_type":
            return self.type(data, path + ["D"], 0)
        _need(False, path + ["#"], f"attribute tag {short(tid)} is not supported")
