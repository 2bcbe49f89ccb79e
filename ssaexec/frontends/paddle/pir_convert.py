"""A decoded PIR program (``pir_reader.PirProgram``) as a legacy ``PaddleProgram``.

PIR ops are the legacy ops in another dress: ``pd_op.conv2d(input, filter)`` is
``conv2d`` with slots ``Input``/``Filter``, ``pd_op.matmul`` is ``matmul_v2``,
``pd_op.add`` is ``elementwise_add`` with ``axis=-1``. So this module only
translates: each PIR op becomes legacy ops (``PaddleOp``: type, named slots of var
names, attributes in the legacy encoding), each SSA value a var, and the result goes
through the same ``convert_program`` and op table (``ops``) as a ``.pdmodel`` file.
One table, two formats; what the legacy path supports and checks, this path does.

Policy and invariants:

* **Support first**: every op name is looked up in ``PIR_OPS`` before anything is
  translated; the unknown ones are reported in one ``ProgramError`` with counts
  and first positions, as the legacy reader does.
* **Values** become vars: a parameter's value is named after the parameter, a
  ``pd_op.data`` value after its ``name``, a fetched value after its fetch
  (``fetch_name_0``), any other ``v<ID>``; their declared dtype and shape come from
  the value's type.
* **Constants** that PIR passes as values where the legacy op had attributes
  (``pd_op.full_int_array`` kernel sizes and shapes, ``pd_op.full`` scalars, axes)
  are folded into the attributes; such a value used as a tensor is materialised
  (``fill_constant``/``assign_value``). A value computed at run time where an
  attribute is needed is refused, naming the op.
* ``builtin.combine``/``builtin.split`` pack and unpack lists of values (``concat``'s
  inputs, ``split``'s outputs) and emit nothing.
* In-place ops (``pd_op.relu_``) are their out-of-place selves: SSA gives their
  result a new value. ``batch_norm``'s running-statistics results alias its
  running-statistics inputs, as in the legacy program.
* **Malformed ops are located errors.** Translators read attributes through
  ``_Ctx.attr`` (a named type: ``int``, ``float``, ``bool``, ``str``, ``ints``),
  results through ``_Ctx.result`` and operands through ``_Ctx.var``/``value``, each
  failing with a ``ProgramError`` that says what is wrong. Whatever slips past
  those (a Python ``ValueError``, ``TypeError`` ...) is caught around each op's
  translation and becomes a ``ProgramError`` naming the op and its JSON path, so a
  malformed file never ends in an internal error. Each legacy op emitted carries
  its PIR op (``_PirOp.where``), so what the legacy mapping refuses names it too.
"""

from ...core.errors import ProgramError
from ...program.json_scan import format_path
from .reader import (DTYPE_CODES, FEED_MINIBATCH, FETCH_LIST, LOD_TENSOR, PaddleBlock,
                     PaddleOp, PaddleProgram, PaddleVar)

__all__ = ["PIR_OPS", "to_legacy", "unsupported_pir_ops", "pir_table"]

_REQUIRED = object()
# Python errors a translator may raise on a malformed op that no check foresaw
_MALFORMED = (ValueError, TypeError, KeyError, IndexError, AttributeError, ArithmeticError)


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


# attribute kind -> (test, conversion, description)
_KINDS = {
    "int": (_is_int, int, "an integer"),
    "float": (_is_number, float, "a number"),
    "bool": (lambda v: isinstance(v, bool) or v in (0, 1) and _is_int(v), bool, "a boolean"),
    "str": (lambda v: isinstance(v, str), str, "a string"),
    "ints": (lambda v: isinstance(v, list) and all(_is_int(x) for x in v), list,
             "a list of integers"),
}


class _PirOp(PaddleOp):
    """A legacy op emitted for a PIR op: errors about it name the PIR op."""

    __slots__ = ("origin",)

    def __init__(self, origin, *args):
        super().__init__(*args)
        self.origin = origin

    @property
    def where(self):
        return f"{self.origin.where} (as legacy {self.type!r})"


def _short(v):
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


class _Ctx:
    """The translation state: value ids -> var names, constants, lists, emitted ops."""

    def __init__(self, pir):
        self.pir = pir
        self.block = PaddleBlock(0, -1)
        self.names = {}       # value id -> var name
        self.consts = {}      # value id -> python value (list or number) of a constant
        self.vecs = {}        # value id -> [value ids] of builtin.combine
        self.made = {}        # constant value id -> var name once materialised
        self.lists = {}       # value id -> [var names] of a list an op (split) made
        self.preferred = {}   # value id -> the name a fetch op gives it
        self.feeds = 0
        self.op = None

    # --- errors ---------------------------------------------------------------------------
    def fail(self, message):
        op = self.op
        raise ProgramError(f"{self.pir.source}: op {op.index} ({op.name}): {message}")

    def attr(self, name, kind, default=_REQUIRED):
        """Attribute ``name`` of the current op as ``kind`` (``_KINDS``); ``default`` when
        absent; a ``ProgramError`` naming it when absent and required or of another type."""
        attrs = self.op.attrs
        if name not in attrs:
            if default is _REQUIRED:
                self.fail(f"attribute {name!r} is missing")
            return default
        test, convert, what = _KINDS[kind]
        value = attrs[name]
        if not test(value):
            self.fail(f"attribute {name!r} must be {what}, got {type(value).__name__} "
                      f"{_short(value)}")
        return convert(value)

    def result(self, k=0):
        """Result ``k`` of the current op; a ``ProgramError`` when the op has fewer."""
        results = self.op.results
        if k >= len(results):
            self.fail(f"result {k} is missing (the op has {len(results)} results)")
        return results[k]

    def value(self, vid, what="the input"):
        """The ``PirValue`` of operand ``vid`` (the reader checked that it exists)."""
        if vid is None:
            self.fail(f"{what} is missing (a null or absent operand)")
        return self.pir.values[vid]

    # --- vars -----------------------------------------------------------------------------
    def declare(self, value, name, persistable=False, is_parameter=False, feed=False,
                stop_gradient=False):
        if name in self.block.vars:
            self.fail(f"var name {name!r} is used twice")
        if value.form not in ("dtensor", "scalar"):
            self.fail(f"value %{value.id} is a {value.form}, not a tensor")
        self.block.vars[name] = PaddleVar(
            name, LOD_TENSOR, value.dtype, DTYPE_CODES.get(value.dtype), list(value.shape),
            0, persistable, is_parameter, stop_gradient, feed)
        self.names[value.id] = name
        return name

    def out(self, value):
        """The var name of result ``value`` (declared on first use)."""
        if value.id in self.names:
            return self.names[value.id]
        name = self.preferred.get(value.id)
        if name is None or name in self.block.vars:
            name = f"v{value.id}"
        return self.declare(value, name)

    def var(self, vid):
        """The var name of operand ``vid``, materialising a folded constant."""
        if vid is None:
            self.fail("a required operand is missing (null or absent)")
        if vid in self.names:
            return self.names[vid]
        if vid in self.made:
            return self.made[vid]
        if vid in self.consts:
            return self.materialise(vid)
        if vid in self.vecs:
            self.fail(f"value %{vid} is a list of values where a tensor is expected")
        self.fail(f"value %{vid} has no var (an unsupported op made it)")

    def materialise(self, vid):
        value = self.pir.values[vid]
        name = self.declare(value, f"v{vid}")
        self.made[vid] = name
        c = self.consts[vid]
        code = DTYPE_CODES.get(value.dtype, 5)
        if isinstance(c, list):
            self.emit("assign_value", {}, {"Out": [name]},
                      {"shape": list(value.shape), "dtype": code, "values": [float(x) for x in c]})
        else:
            self.emit("fill_constant", {}, {"Out": [name]},
                      {"shape": list(value.shape), "dtype": code, "value": float(c)})
        return name

    def const(self, vid, what):
        """The folded value of constant operand ``vid`` (an attribute in the legacy op)."""
        if vid is None or vid not in self.consts:
            self.fail(f"{what} must be a constant (pd_op.full / full_int_array); a value "
                      "computed at run time is not supported")
        return self.consts[vid]

    def ints(self, vid, what):
        c = self.const(vid, what)
        c = c if isinstance(c, list) else [c]
        if any(not _is_number(x) or isinstance(x, float) and not x.is_integer() for x in c):
            self.fail(f"{what} must be integers, got {_short(c)}")
        return [int(x) for x in c]

    def int1(self, vid, what):
        """One integer from constant operand ``vid`` (a scalar or a one-entry list)."""
        c = self.ints(vid, what)
        if len(c) != 1:
            self.fail(f"{what} must be one integer, got {_short(c)}")
        return c[0]

    def vec(self, vid, what):
        if vid not in self.vecs:
            self.fail(f"{what} must be a list of values (builtin.combine)")
        return [self.var(v) for v in self.vecs[vid]]

    def tmp_like(self, value, shape, axis, size):
        """A fresh var like ``value`` with ``shape``'s ``axis`` set to ``size``."""
        shape = list(shape)
        if shape:
            shape[axis] = size
        name = f"v{value.id}_t{len(self.block.vars)}"
        self.block.vars[name] = PaddleVar(name, LOD_TENSOR, value.dtype,
                                          DTYPE_CODES.get(value.dtype), shape, 0, False,
                                          False, False, False)
        return name

    # --- ops ------------------------------------------------------------------------------
    def emit(self, type, inputs, outputs, attrs=None):
        op = _PirOp(self.op, type, {k: list(v) for k, v in inputs.items()},
                    {k: list(v) for k, v in outputs.items()}, dict(attrs or {}), 0,
                    len(self.block.ops))
        self.block.ops.append(op)
        return op


# --- translators -----------------------------------------------------------------------------

def _operand(op, k):
    return op.operands[k] if k < len(op.operands) else None


def _simple(legacy, ins, outs, attrs=None):
    """One legacy op: operand ``k`` -> slot ``ins[k]`` (None: skipped), result ``k`` ->
    slot ``outs[k]``; ``attrs(ctx, op)`` gives the legacy attributes."""
    def translate(ctx, op):
        inputs = {}
        for k, slot in enumerate(ins):
            vid = _operand(op, k)
            if slot is not None and vid is not None:
                inputs[slot] = [ctx.var(vid)]
        outputs = {slot: [ctx.out(ctx.result(k))] for k, slot in enumerate(outs)
                   if slot is not None and (k == 0 or k < len(op.results))}
        ctx.emit(legacy, inputs, outputs, attrs(ctx, op) if attrs else {})
    return translate


def _same(names):
    return {n: n for n in names}


def _pick(*names, **renames):
    """Attributes copied by name (``renames``: legacy name -> PIR name)."""
    def attrs(ctx, op):
        out = {n: op.attrs[n] for n in names if n in op.attrs}
        out.update({legacy: op.attrs[p] for legacy, p in renames.items() if p in op.attrs})
        return out
    return attrs


def _data(ctx, op):
    name = ctx.attr("name", "str", "")
    if not name:
        ctx.fail("the data op has no name")
    ctx.declare(ctx.result(0), name, feed=True, stop_gradient=True)
    ctx.emit("feed", {"X": ["feed"]}, {"Out": [name]}, {"col": ctx.feeds})
    ctx.feeds += 1


def _fetch(ctx, op):
    col = ctx.attr("col", "int", 0)
    ctx.emit("fetch", {"X": [ctx.var(_operand(op, 0))]}, {"Out": ["fetch"]}, {"col": col})


def _parameter(ctx, op):
    flags = op.result_attrs
    ctx.declare(ctx.result(0), op.attrs["name"], persistable=flags.get("persistable", True),
                is_parameter=op.attrs.get("is_parameter", True),
                stop_gradient=flags.get("stop_gradient", False))


def _full_int_array(ctx, op):
    value = op.attrs.get("value")
    if not isinstance(value, list) or not all(_is_number(x) for x in value):
        ctx.fail(f"full_int_array's value must be a list of numbers, got {_short(value)}")
    ctx.consts[ctx.result(0).id] = value


def _full(ctx, op):
    value = op.attrs.get("value")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        ctx.fail(f"full's value must be a number, got {_short(value)}")
    shape = op.attrs.get("shape", [])
    if not isinstance(shape, list) or any(not isinstance(d, int) or d < 0 for d in shape):
        ctx.fail(f"full's shape {_short(shape)} must be a list of sizes")
    ctx.consts[ctx.result(0).id] = value


def _combine(ctx, op):
    ctx.vecs[ctx.result(0).id] = list(op.operands)
    for v in op.operands:
        if v is None:
            ctx.fail("a null value in a list")


def _split_vec(ctx, op):
    items = ctx.vecs.get(_operand(op, 0))
    if items is None:
        # a list made by an op (split): its items are the results, named here
        names = ctx.lists.get(_operand(op, 0))
        if names is None or len(names) != len(op.results):
            ctx.fail("builtin.split of a value that is not a list")
        for value, name in zip(op.results, names, strict=True):
            ctx.names[value.id] = name
            ctx.block.vars[name] = _var_like(ctx, value, name)
        return
    if len(items) != len(op.results):
        ctx.fail(f"builtin.split of {len(items)} values into {len(op.results)}")
    for value, vid in zip(op.results, items, strict=True):
        ctx.names[value.id] = ctx.var(vid)


def _var_like(ctx, value, name):
    if value.form not in ("dtensor", "scalar"):
        ctx.fail(f"value %{value.id} is a {value.form}, not a tensor")
    return PaddleVar(name, LOD_TENSOR, value.dtype, DTYPE_CODES.get(value.dtype),
                     list(value.shape), 0, False, False, False, False)


def _conv(legacy):
    return _simple(legacy, ["Input", "Filter"], ["Output"],
                   _pick("strides", "paddings", "padding_algorithm", "dilations", "groups",
                         "data_format"))


def _pool2d(ctx, op):
    attrs = _pick("strides", "paddings", "ceil_mode", "exclusive", "data_format",
                  "pooling_type", "global_pooling", "adaptive", "padding_algorithm")(ctx, op)
    attrs["ksize"] = ctx.ints(_operand(op, 1), "the kernel size")
    ctx.emit("pool2d", {"X": [ctx.var(_operand(op, 0))]}, {"Out": [ctx.out(ctx.result(0))]},
             attrs)


def _reshape(ctx, op):
    shape = ctx.ints(_operand(op, 1), "the shape")
    ctx.emit("reshape2", {"X": [ctx.var(_operand(op, 0))]}, {"Out": [ctx.out(ctx.result(0))]},
             {"shape": shape})


def _axes_op(legacy, key):
    def translate(ctx, op):
        axes = ctx.ints(_operand(op, 1), "the axes")
        ctx.emit(legacy, {"X": [ctx.var(_operand(op, 0))]}, {"Out": [ctx.out(ctx.result(0))]},
                 {key: axes})
    return translate


def _reduce(legacy):
    def translate(ctx, op):
        dims = ctx.ints(_operand(op, 1), "the axes") if len(op.operands) > 1 else \
            ctx.attr("axis", "ints", [])
        ctx.emit(legacy, {"X": [ctx.var(_operand(op, 0))]}, {"Out": [ctx.out(ctx.result(0))]},
                 {"dim": dims, "keep_dim": ctx.attr("keepdim", "bool", False),
                  "reduce_all": not dims})
    return translate


def _scale(ctx, op):
    if len(op.operands) > 1:
        scale = ctx.const(_operand(op, 1), "the scale")
        if isinstance(scale, list) and len(scale) == 1:
            scale = scale[0]
        if not _is_number(scale):
            ctx.fail(f"the scale must be one number, got {_short(scale)}")
    else:
        scale = ctx.attr("scale", "float", 1.0)
    ctx.emit("scale", {"X": [ctx.var(_operand(op, 0))]}, {"Out": [ctx.out(ctx.result(0))]},
             {"scale": float(scale), "bias": ctx.attr("bias", "float", 0.0),
              "bias_after_scale": ctx.attr("bias_after_scale", "bool", True)})


def _cast(ctx, op):
    dtype = ctx.attr("dtype", "str")
    if dtype not in DTYPE_CODES:
        ctx.fail(f"cast to {_short(dtype)} has no ssaexec dtype")
    ctx.emit("cast", {"X": [ctx.var(_operand(op, 0))]}, {"Out": [ctx.out(ctx.result(0))]},
             {"out_dtype": DTYPE_CODES[dtype]})


def _concat(ctx, op):
    axis = ctx.int1(_operand(op, 1), "the axis")
    ctx.emit("concat", {"X": ctx.vec(_operand(op, 0), "concat's inputs")},
             {"Out": [ctx.out(ctx.result(0))]}, {"axis": axis})


def _split(ctx, op):
    x = ctx.var(_operand(op, 0))
    if op.op_type == "split_with_num":
        attrs = {"num": ctx.attr("num", "int"), "sections": [],
                 "axis": ctx.int1(_operand(op, 1), "the axis")}
        count, what = attrs["num"], f"num={attrs['num']}"
    else:
        attrs = {"num": 0, "sections": ctx.ints(_operand(op, 1), "the sections"),
                 "axis": ctx.int1(_operand(op, 2), "the axis")}
        count, what = len(attrs["sections"]), f"{len(attrs['sections'])} sections"
    vec = ctx.result(0)
    if vec.form != "vec" or not vec.items:
        ctx.fail(f"split's result must be a non-empty list (t_vec) of tensors, not a {vec.form}")
    n = len(vec.items)
    # the count bounds the work of shape inference: it must match the result types given
    if count != n:
        ctx.fail(f"{what} makes {count} parts, but the result lists {n} tensor types")
    names = [f"v{vec.id}_{k}" for k in range(n)]
    for name, item in zip(names, vec.items, strict=True):
        ctx.block.vars[name] = _var_like(ctx, item, name)
    ctx.lists[vec.id] = names
    ctx.emit("split", {"X": [x]}, {"Out": names}, attrs)


def _dropout(ctx, op):
    # operands: x, seed_tensor (usually null), p (a constant); older files had p an attribute
    p = ctx.attr("p", "float", 0.5)
    if _operand(op, 2) is not None:
        p = ctx.const(_operand(op, 2), "the dropout probability")
        if not _is_number(p):
            ctx.fail(f"the dropout probability must be a number, got {_short(p)}")
    outs = {"Out": [ctx.out(ctx.result(0))]}
    if len(op.results) > 1:
        outs["Mask"] = [ctx.out(op.results[1])]
    ctx.emit("dropout", {"X": [ctx.var(_operand(op, 0))]}, outs,
             {"dropout_prob": float(p), "is_test": ctx.attr("is_test", "bool", False),
              "dropout_implementation": ctx.attr("mode", "str", "upscale_in_train"),
              "fix_seed": ctx.attr("fix_seed", "bool", False),
              "seed": ctx.attr("seed", "int", 0)})


def _batch_norm(ctx, op):
    if len(op.operands) < 5:
        ctx.fail(f"batch_norm takes 5 operands (x, mean, variance, scale, bias), got "
                 f"{len(op.operands)}")
    names = [ctx.var(v) for v in op.operands[:5]]
    x, mean, var, scale, bias = names
    outs = {"Y": [ctx.out(ctx.result(0))]}
    # the running statistics are updated in place, as in the legacy program
    for k, (slot, alias) in enumerate((("MeanOut", mean), ("VarianceOut", var)), 1):
        if k < len(op.results):
            ctx.names[op.results[k].id] = alias
            outs[slot] = [alias]
    for k, slot in ((3, "SavedMean"), (4, "SavedVariance")):
        if k < len(op.results):
            outs[slot] = [ctx.out(op.results[k])]
    attrs = _pick("momentum", "epsilon", "is_test", "use_global_stats",
                  "trainable_statistics", data_layout="data_format")(ctx, op)
    ctx.emit("batch_norm", {"X": [x], "Mean": [mean], "Variance": [var], "Scale": [scale],
                            "Bias": [bias]}, outs, attrs)


def _argmax(ctx, op):
    axis = ctx.int1(_operand(op, 1), "the axis")
    dtype = ctx.attr("dtype", "str", "int64")
    ctx.emit("arg_max", {"X": [ctx.var(_operand(op, 0))]}, {"Out": [ctx.out(ctx.result(0))]},
             {"axis": axis, "keepdims": ctx.attr("keepdims", "bool", False),
              "flatten": ctx.attr("flatten", "bool", False),
              "dtype": DTYPE_CODES.get(dtype, 3)})


def _slice(ctx, op):
    """``x[start:end]`` along constant axes, as ``split``s (ssaexec has no slice op): the
    declared size of each sliced axis must be known."""
    x = ctx.var(_operand(op, 0))
    value = ctx.value(_operand(op, 0))
    if value.shape is None:
        ctx.fail(f"value %{value.id} is a {value.form}, not a tensor")
    shape = list(value.shape)
    axes = ctx.attr("axes", "ints", [])
    starts = ctx.ints(_operand(op, 1), "the starts")
    ends = ctx.ints(_operand(op, 2), "the ends")
    if not (len(axes) == len(starts) == len(ends)):
        ctx.fail(f"axes {axes}, starts {starts} and ends {ends} differ in length")
    cur = x
    for axis, start, end in zip(axes, starts, ends, strict=True):
        axis = axis % len(shape) if shape else axis
        dim = shape[axis] if 0 <= axis < len(shape) else -1
        if dim < 0:
            ctx.fail(f"slicing axis {axis} needs its size declared (it is {dim})")
        start = max(0, min(dim, start + dim if start < 0 else start))
        end = max(start, min(dim, end + dim if end < 0 else end))
        if end == start:
            ctx.fail(f"an empty slice [{start}:{end}] of axis {axis} is not supported")
        parts = [n for n in (start, end - start, dim - end) if n > 0]
        pick = 1 if start > 0 else 0
        if len(parts) == 1:
            continue
        names = [ctx.tmp_like(value, shape, axis, n) for n in parts]
        ctx.emit("split", {"X": [cur]}, {"Out": names},
                 {"num": 0, "sections": parts, "axis": axis})
        cur = names[pick]
        shape[axis] = end - start
    out = ctx.out(ctx.result(0))
    drop = ctx.attr("decrease_axis", "ints", [])
    if drop:
        ctx.emit("squeeze2", {"X": [cur]}, {"Out": [out]}, {"axes": drop})
    else:
        ctx.emit("assign", {"X": [cur]}, {"Out": [out]})


def _pow(ctx, op):
    y = op.attrs.get("y")
    if isinstance(y, bool) or not isinstance(y, (int, float)):
        ctx.fail(f"pow's exponent must be a number, got {y!r}")
    value = ctx.value(_operand(op, 0))
    exponent = ctx.tmp_like(value, [1], 0, 1)
    ctx.emit("fill_constant", {}, {"Out": [exponent]},
             {"shape": [1], "dtype": DTYPE_CODES.get(value.dtype, 5), "value": float(y)})
    ctx.emit("elementwise_pow", {"X": [ctx.var(_operand(op, 0))], "Y": [exponent]},
             {"Out": [ctx.out(ctx.result(0))]}, {"axis": -1})


def _binary(legacy):
    return _simple(legacy, ["X", "Y"], ["Out"], lambda ctx, op: {"axis": -1})


# PIR op name -> translator(ctx, op); in-place variants ("relu_") share their op's entry
PIR_OPS = {
    "builtin.parameter": _parameter,
    "builtin.combine": _combine,
    "builtin.split": _split_vec,
    "pd_op.data": _data,
    "pd_op.feed": _data,
    "pd_op.fetch": _fetch,
    "pd_op.full_int_array": _full_int_array,
    "pd_op.full": _full,
    "pd_op.conv2d": _conv("conv2d"),
    "pd_op.depthwise_conv2d": _conv("depthwise_conv2d"),
    "pd_op.pool2d": _pool2d,
    "pd_op.matmul": _simple("matmul_v2", ["X", "Y"], ["Out"],
                            _pick(trans_x="transpose_x", trans_y="transpose_y")),
    "pd_op.add": _binary("elementwise_add"),
    "pd_op.subtract": _binary("elementwise_sub"),
    "pd_op.multiply": _binary("elementwise_mul"),
    "pd_op.divide": _binary("elementwise_div"),
    "pd_op.maximum": _binary("elementwise_max"),
    "pd_op.minimum": _binary("elementwise_min"),
    "pd_op.elementwise_pow": _binary("elementwise_pow"),
    "pd_op.gelu": _simple("gelu", ["X"], ["Out"], _pick("approximate")),
    "pd_op.softmax": _simple("softmax", ["X"], ["Out"], _pick("axis")),
    "pd_op.log_softmax": _simple("log_softmax", ["X"], ["Out"], _pick("axis")),
    "pd_op.layer_norm": _simple("layer_norm", ["X", "Scale", "Bias"], ["Y", "Mean", "Variance"],
                                _pick("epsilon", "begin_norm_axis")),
    "pd_op.batch_norm": _batch_norm,
    "pd_op.embedding": _simple("lookup_table_v2", ["Ids", "W"], ["Out"], _pick("padding_idx")),
    "pd_op.flatten": _simple("flatten_contiguous_range", ["X"], ["Out", None],
                             _pick("start_axis", "stop_axis")),
    "pd_op.reshape": _reshape,
    "pd_op.transpose": _simple("transpose2", ["X"], ["Out"], _pick(axis="perm")),
    "pd_op.squeeze": _axes_op("squeeze2", "axes"),
    "pd_op.unsqueeze": _axes_op("unsqueeze2", "axes"),
    "pd_op.mean": _reduce("reduce_mean"),
    "pd_op.sum": _reduce("reduce_sum"),
    "pd_op.max": _reduce("reduce_max"),
    "pd_op.scale": _scale,
    "pd_op.cast": _cast,
    "pd_op.concat": _concat,
    "pd_op.split": _split,
    "pd_op.split_with_num": _split,
    "pd_op.dropout": _dropout,
    "pd_op.assign": _simple("assign", ["X"], ["Out"]),
    "pd_op.argmax": _argmax,
    "pd_op.slice": _slice,
    "pd_op.pow": _pow,
}
for _name in ("relu", "sigmoid", "tanh", "exp", "log", "sqrt", "square", "abs"):
    PIR_OPS[f"pd_op.{_name}"] = _simple(_name, ["X"], ["Out"])


# PIR op -> what it becomes before the shared table (legacy op types, or how it is read)
_BECOMES = {
    "builtin.parameter": ("(persistable var)", "named by the op; its value from `params`"),
    "builtin.combine": ("(list of vars)", "packs `concat`'s inputs; emits nothing"),
    "builtin.split": ("(vars of a list)", "unpacks `split`'s outputs; emits nothing"),
    "pd_op.data": ("feed", "a data var named by `name`, in program order"),
    "pd_op.feed": ("feed", "as `pd_op.data`"),
    "pd_op.fetch": ("fetch", "the fetched value takes the fetch's `name`"),
    "pd_op.full_int_array": ("(constant)", "folded into the attribute that reads it"),
    "pd_op.full": ("(constant) or fill_constant", "folded, or materialised when read as a "
                   "tensor"),
    "pd_op.pool2d": ("pool2d", "`kernel_size` from a constant"),
    "pd_op.reshape": ("reshape2", "`shape` from a constant"),
    "pd_op.scale": ("scale", "the factor from a constant"),
    "pd_op.mean": ("reduce_mean", "axes from a constant"),
    "pd_op.sum": ("reduce_sum", "axes from a constant"),
    "pd_op.max": ("reduce_max", "axes from a constant"),
    "pd_op.squeeze": ("squeeze2", "axes from a constant"),
    "pd_op.unsqueeze": ("unsqueeze2", "axes from a constant"),
    "pd_op.concat": ("concat", "inputs from `builtin.combine`, the axis from a constant"),
    "pd_op.split": ("split", "sections and axis from constants"),
    "pd_op.split_with_num": ("split", "the axis from a constant"),
    "pd_op.slice": ("split (+ squeeze2)", "constant starts and ends, declared sizes"),
    "pd_op.pow": ("fill_constant, elementwise_pow", "the exponent `y` as a tensor"),
    "pd_op.batch_norm": ("batch_norm", "running statistics updated in place"),
    "pd_op.matmul": ("matmul_v2", "`transpose_x`/`transpose_y`"),
    "pd_op.embedding": ("lookup_table_v2", ""),
    "pd_op.flatten": ("flatten_contiguous_range", ""),
    "pd_op.transpose": ("transpose2", "`perm`"),
    "pd_op.argmax": ("arg_max", "the axis from a constant"),
    "pd_op.dropout": ("dropout", "`mode` and `is_test` as the legacy attributes"),
    "pd_op.add": ("elementwise_add", ""), "pd_op.subtract": ("elementwise_sub", ""),
    "pd_op.multiply": ("elementwise_mul", ""), "pd_op.divide": ("elementwise_div", ""),
    "pd_op.maximum": ("elementwise_max", ""), "pd_op.minimum": ("elementwise_min", ""),
}


def pir_table():
    """The docs table: one Markdown row per PIR op, what it becomes and how."""
    rows = ["| PIR op | legacy op (then the table below) | notes |", "|---|---|---|"]
    for name in sorted(PIR_OPS):
        becomes, note = _BECOMES.get(name, (name.split(".", 1)[1], ""))
        rows.append(f"| `{name}` | {becomes} | {note} |")
    return "\n".join(rows)


def _entry(name):
    entry = PIR_OPS.get(name)
    if entry is None and name.endswith("_"):  # an in-place variant
        entry = PIR_OPS.get(name[:-1])
    return entry


def unsupported_pir_ops(pir):
    """``{op name: [op indices]}`` of the ops ``PIR_OPS`` cannot translate."""
    out = {}
    for op in pir.ops:
        if _entry(op.name) is None:
            out.setdefault(op.name, []).append(op.index)
    return out


def to_legacy(pir):
    """Translate ``pir`` into a ``PaddleProgram`` for ``convert_program``."""
    missing = unsupported_pir_ops(pir)
    if missing:
        total = sum(len(v) for v in missing.values())
        parts = [f"{name!r} (x{len(idx)}, first at op {idx[0]})"
                 for name, idx in sorted(missing.items(), key=lambda kv: kv[1][0])]
        raise ProgramError(f"{pir.source}: {total} ops of {len(missing)} types are not "
                           f"supported: {', '.join(parts)}; docs/paddle.md lists the "
                           "supported ones")
    ctx = _Ctx(pir)
    for name, vtype in (("feed", FEED_MINIBATCH), ("fetch", FETCH_LIST)):
        ctx.block.vars[name] = PaddleVar(name, vtype, None, None, None, 0, True, False, False,
                                         False)
    for op in pir.ops:  # a fetched value takes the fetch's name (fetch_name_0 ...)
        name = op.attrs.get("name") if op.name == "pd_op.fetch" else None
        if isinstance(name, str) and name and op.operands and op.operands[0] is not None:
            ctx.preferred.setdefault(op.operands[0], name)
    for op in pir.ops:
        ctx.op = op
        try:
            _entry(op.name)(ctx, op)
        except _MALFORMED as e:
            # a malformed op no check foresaw: located, never an internal error
            detail = str(e).splitlines()[0][:200] if str(e) else ""
            ctx.fail(f"malformed op at {format_path(op.path)} ({type(e).__name__}"
                     f"{': ' + detail if detail else ''}); see docs/paddle.md for the "
                     "supported form")
    return PaddleProgram([ctx.block], None, {}, pir.source)
