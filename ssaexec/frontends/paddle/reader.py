"""Decode Paddle's ProgramDesc bytes into plain, checked Python objects.

``decode_program(data, source)`` parses the protobuf wire format with the message
classes of our ``framework.proto`` (``schema.py``) and turns the message into a
``PaddleProgram``: blocks of ``PaddleVar`` and ``PaddleOp`` with attribute values
decoded by their ``AttrType``. ``convert.py`` then maps that onto an ssaexec
``Program``; keeping the two apart means the mapping never touches protobuf and the
decoder knows nothing of our ops.

Policy (docs/security.md, docs/paddle.md):

* the bytes are untrusted data: decoding computes nothing from them but these
  objects; no file is opened, nothing is imported or executed;
* every problem is a ``ProgramError`` that starts with ``SOURCE:`` and says where:
  ``byte N (blocks[0].ops[3]): ...`` for bytes that are not a protobuf message
  (``wire.locate`` finds the spot), ``block B, var 'x': ...`` or
  ``block B, op I (TYPE): ...`` for a message that parses but does not make sense;
* fields our schema does not know are skipped (newer Paddle versions add some);
  known fields with the wrong wire type are skipped by protobuf too, and the
  missing value is then reported as missing;
* declared shapes are bounded by ``ssaexec.core.limits`` before anything uses them.
"""

from ...core.errors import ProgramError
from ...core.limits import shape_problem
from ...program.desc import BlockRef
from .schema import enum_values, messages
from .wire import locate

__all__ = ["PaddleProgram", "PaddleBlock", "PaddleVar", "PaddleOp", "decode_program",
           "parse_message", "DTYPES", "DTYPE_CODES", "var_type_name"]

# VarType.Type code of a plain data type -> our dtype name
DTYPES = {0: "bool", 1: "int16", 2: "int32", 3: "int64", 4: "float16", 5: "float32",
          6: "float64", 20: "uint8", 21: "int8", 22: "bfloat16"}
DTYPE_CODES = {v: k for k, v in DTYPES.items()}

# VarType.Type codes of the var kinds we care about
LOD_TENSOR, SELECTED_ROWS, FEED_MINIBATCH, FETCH_LIST = 7, 8, 9, 10
LOD_TENSOR_ARRAY, READER, RAW = 13, 15, 17

# op_role bits (Paddle's OpRole)
ROLE_BACKWARD, ROLE_OPTIMIZE, ROLE_LRSCHED, ROLE_LOSS = 0x1, 0x2, 0x10, 0x100


def var_type_name(code):
    """Paddle's name of VarType.Type ``code`` (``'LOD_TENSOR'``), or ``'type N'``."""
    for name, number in enum_values("VarType.Type").items():
        if number == code:
            return name
    return f"type {code}"


class PaddleVar:
    """A var of a Paddle block: its type (a VarType.Type code), dtype, shape and flags.

    ``dtype`` is our dtype name, or None when the var is not a dense tensor or its
    data type has no ssaexec equivalent (``dtype_code`` keeps Paddle's code).
    """

    __slots__ = ("name", "vtype", "dtype", "dtype_code", "shape", "lod_level", "persistable",
                 "is_parameter", "stop_gradient", "need_check_feed")

    def __init__(self, name, vtype, dtype, dtype_code, shape, lod_level, persistable,
                 is_parameter, stop_gradient, need_check_feed):
        self.name, self.vtype, self.dtype, self.dtype_code = name, vtype, dtype, dtype_code
        self.shape, self.lod_level = shape, lod_level
        self.persistable, self.is_parameter = persistable, is_parameter
        self.stop_gradient, self.need_check_feed = stop_gradient, need_check_feed

    @property
    def is_tensor(self):
        return self.vtype == LOD_TENSOR

    def __repr__(self):
        return f"PaddleVar({self.name!r}, {var_type_name(self.vtype)}, {self.dtype}, {self.shape})"


class PaddleOp:
    """An op of a Paddle block: type, slots of var names, decoded attributes."""

    __slots__ = ("type", "inputs", "outputs", "attrs", "block", "index")

    def __init__(self, type, inputs, outputs, attrs, block, index):
        self.type, self.inputs, self.outputs, self.attrs = type, inputs, outputs, attrs
        self.block, self.index = block, index

    def input(self, slot):
        return self.inputs.get(slot, [])

    def output(self, slot):
        return self.outputs.get(slot, [])

    @property
    def where(self):
        """``block B, op I (TYPE)``: how errors name this op."""
        return f"block {self.block}, op {self.index} ({self.type})"

    @property
    def role(self):
        """Paddle's ``op_role`` bits (0, forward, when absent or not an int)."""
        value = self.attrs.get("op_role", 0)
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    def __repr__(self):
        return f"PaddleOp({self.type!r} #{self.index}, in={self.inputs}, out={self.outputs})"


class PaddleBlock:
    __slots__ = ("idx", "parent_idx", "vars", "ops")

    def __init__(self, idx, parent_idx):
        self.idx, self.parent_idx = idx, parent_idx
        self.vars = {}
        self.ops = []


class PaddleProgram:
    """A decoded Paddle program: blocks, the program version, the op version map."""

    __slots__ = ("blocks", "version", "op_versions", "source")

    def __init__(self, blocks, version, op_versions, source):
        self.blocks, self.version, self.op_versions = blocks, version, op_versions
        self.source = source

    def persistable_names(self):
        """The vars a combined parameter file holds, in its order.

        Paddle's ``save_inference_model`` / ``save_combine`` write every persistable
        var of every block except feed/fetch holders, readers and raw vars, sorted
        by name.
        """
        names = set()
        for block in self.blocks:
            for v in block.vars.values():
                if v.persistable and v.vtype not in (FEED_MINIBATCH, FETCH_LIST, READER, RAW):
                    names.add(v.name)
        return sorted(names)


def parse_message(cls_name, data, source, what):
    """Parse ``data`` as message ``cls_name`` of the schema; ``ProgramError`` with the spot."""
    cls = getattr(messages(), cls_name)  # first: it says how to install protobuf
    from google.protobuf.message import DecodeError

    msg = cls()
    try:
        msg.ParseFromString(bytes(data))
    except DecodeError:
        spot = locate(bytes(data), cls.DESCRIPTOR)
        if spot is None:
            raise ProgramError(f"{source}: not a Paddle {what}: the protobuf library refused "
                               "the bytes") from None
        offset, path, problem = spot
        at = f"byte {offset}" + (f" ({path})" if path else "")
        raise ProgramError(f"{source}: {at}: {problem}; not a Paddle {what}") from None
    except RecursionError:  # pragma: no cover - the library bounds its own recursion
        raise ProgramError(f"{source}: not a Paddle {what}: nested too deeply") from None
    return msg


def _text(value, where, what):
    if isinstance(value, bytes):
        raise ProgramError(f"{where}: {what} is not UTF-8 text ({value[:40]!r})")
    return value


def decode_program(data, source="<bytes>"):
    """Decode serialized Paddle ``ProgramDesc`` bytes.

    Parameters
    ----------
    data : bytes
        A ``.pdmodel`` file, a ``__model__`` file or ``program.desc.serialize_to_string()``.
    source : str
        How errors name the input (a path).

    Returns
    -------
    PaddleProgram

    Raises
    ------
    ProgramError
        When the bytes are not a ProgramDesc or describe an impossible program.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ProgramError(f"{source}: expected the bytes of a Paddle program, got "
                           f"{type(data).__name__}")
    if not len(data):
        raise ProgramError(f"{source}: empty file; not a Paddle program")
    msg = parse_message("ProgramDesc", data, source, "ProgramDesc")
    if not msg.blocks:
        raise ProgramError(f"{source}: the program has no blocks; not a Paddle ProgramDesc "
                           "(is this a parameter file?)")
    blocks = []
    for i, b in enumerate(msg.blocks):
        where = f"{source}: block {i}"
        idx = b.idx if b.HasField("idx") else i
        parent = b.parent_idx if b.HasField("parent_idx") else (-1 if i == 0 else 0)
        if idx != i:
            raise ProgramError(f"{where}: its idx is {idx}; blocks must be numbered by position")
        if (i == 0 and parent != -1) or (i > 0 and not 0 <= parent < i):
            want = "-1" if i == 0 else f"an earlier block (0..{i - 1})"
            raise ProgramError(f"{where}: parent_idx is {parent}, expected {want}")
        block = PaddleBlock(i, parent)
        for k, v in enumerate(b.vars):
            var = _decode_var(v, where, k)
            if var.name in block.vars:
                raise ProgramError(f"{where}: var {var.name!r} is declared twice")
            block.vars[var.name] = var
        for k, o in enumerate(b.ops):
            block.ops.append(_decode_op(o, i, k, len(msg.blocks), source))
        blocks.append(block)
    version = msg.version.version if msg.HasField("version") else None
    op_versions = {}
    for k, pair in enumerate(msg.op_version_map.pair):
        name = _text(pair.op_name, f"{source}: op_version_map.pair[{k}]", "the op name")
        op_versions[name] = pair.op_version.version
    return PaddleProgram(blocks, version, op_versions, source)


def _decode_var(v, block_where, k):
    if not v.HasField("name") or not v.name:
        raise ProgramError(f"{block_where}, var {k}: the var has no name")
    name = _text(v.name, f"{block_where}, var {k}", "the var name")
    where = f"{block_where}, var {name!r}"
    if not v.HasField("type") or not v.type.HasField("type"):
        raise ProgramError(f"{where}: the var has no type")
    vtype = v.type.type
    dtype = dtype_code = shape = None
    lod_level = 0
    desc = None
    if vtype == LOD_TENSOR and v.type.HasField("lod_tensor"):
        desc, lod_level = v.type.lod_tensor.tensor, v.type.lod_tensor.lod_level
    elif vtype == SELECTED_ROWS and v.type.HasField("selected_rows"):
        desc = v.type.selected_rows
    elif vtype == LOD_TENSOR_ARRAY and v.type.HasField("tensor_array"):
        desc, lod_level = v.type.tensor_array.tensor, v.type.tensor_array.lod_level
    elif vtype == LOD_TENSOR:
        raise ProgramError(f"{where}: a dense tensor var without a tensor description")
    if desc is not None:
        dtype_code = desc.data_type
        dtype = DTYPES.get(dtype_code)
        shape = list(desc.dims)
        problem = shape_problem(shape, "the declared shape")
        if problem is not None:
            raise ProgramError(f"{where}: {problem}")
    return PaddleVar(name, vtype, dtype, dtype_code, shape, lod_level, bool(v.persistable),
                     bool(v.is_parameter), bool(v.stop_gradient), bool(v.need_check_feed))


def _slots(entries, where, what):
    out = {}
    for k, e in enumerate(entries):
        if not e.HasField("parameter"):
            raise ProgramError(f"{where}: {what} slot {k} has no name")
        slot = _text(e.parameter, where, f"{what} slot {k}'s name")
        if slot in out:
            raise ProgramError(f"{where}: {what} slot {slot!r} appears twice")
        names = []
        for n in e.arguments:
            n = _text(n, where, f"a var name in {what} slot {slot!r}")
            if not n:
                raise ProgramError(f"{where}: {what} slot {slot!r} names an empty var")
            names.append(n)
        out[slot] = names
    return out


def _decode_op(o, block, index, num_blocks, source):
    where = f"{source}: block {block}, op {index}"
    if not o.HasField("type") or not o.type:
        raise ProgramError(f"{where}: the op has no type")
    op_type = _text(o.type, where, "the op type")
    where = f"{where} ({op_type})"
    inputs = _slots(o.inputs, where, "input")
    outputs = _slots(o.outputs, where, "output")
    attrs = {}
    for k, a in enumerate(o.attrs):
        if not a.HasField("name"):
            raise ProgramError(f"{where}: attribute {k} has no name")
        name = _text(a.name, where, f"attribute {k}'s name")
        if name in attrs:
            raise ProgramError(f"{where}: attribute {name!r} appears twice")
        if not a.HasField("type"):
            raise ProgramError(f"{where}: attribute {name!r} has no type")
        attrs[name] = _attr_value(a, f"{where}: attribute {name!r}", num_blocks)
    return PaddleOp(op_type, inputs, outputs, attrs, block, index)


def _scalar(s, where):
    code = s.type
    if code == 1:
        return bool(s.b)
    if code == 2:
        return int(s.i)
    if code == 3:
        return float(s.r)
    if code == 4:
        raise ProgramError(f"{where}: complex scalars are not supported")
    raise ProgramError(f"{where}: unknown scalar type {code}")


def _block_ref(idx, where, num_blocks):
    if not 0 <= idx < num_blocks:
        raise ProgramError(f"{where}: refers to block {idx}, but the program has "
                           f"{num_blocks} blocks")
    return BlockRef(idx)


def _attr_value(a, where, num_blocks):
    t = a.type
    if t == 0:
        return int(a.i)
    if t == 1:
        return float(a.f)
    if t == 2:
        return _text(a.s, where, "the value")
    if t == 3:
        return [int(x) for x in a.ints]
    if t == 4:
        return [float(x) for x in a.floats]
    if t == 5:
        return [_text(x, where, "a value") for x in a.strings]
    if t == 6:
        return bool(a.b)
    if t == 7:
        return [bool(x) for x in a.bools]
    if t == 8:
        return _block_ref(a.block_idx, where, num_blocks)
    if t == 9:
        return int(a.l)
    if t == 10:
        return [_block_ref(x, where, num_blocks) for x in a.blocks_idx]
    if t == 11:
        return [int(x) for x in a.longs]
    if t == 12:
        return [float(x) for x in a.float64s]
    if t == 13:
        return _text(a.var_name, where, "the var name")
    if t == 14:
        return [_text(x, where, "a var name") for x in a.vars_name]
    if t == 15:
        return float(a.float64)
    if t == 16:
        return _scalar(a.scalar, where)
    if t == 17:
        return [_scalar(s, where) for s in a.scalars]
    raise ProgramError(f"{where}: unknown attribute type {t}")
