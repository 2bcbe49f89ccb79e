"""Paddle op types, slots and attribute conventions mapped onto ssaexec's ops.

``MAPPINGS`` maps a Paddle op type to a ``Mapping``: the ssaexec op(s) it becomes
(for the table in docs/paddle.md, ``mapping_table()``) and a function
``fn(ctx, op)`` that emits them through ``ctx`` (``convert.Converter``). Most
entries are one op with renamed slots and converted attributes (``Simple``); a few
take several ops to keep Paddle's numbers:

* ``batch_norm`` in training updates the running variance with the *biased* batch
  variance (Paddle's CPU kernel); ssaexec's kernel, like torch, uses the unbiased
  one. The mapping lets our op update a scratch var and writes Paddle's update
  from the batch itself (3 extra elementwise ops and a reduction);
* ``adam`` keeps Paddle's beta-power accumulators, which hold ``beta**t`` *before*
  step ``t`` (ours hold it after): two ``scale`` ops shift it each way, so the
  accumulators in the scope (and in saved parameter files) are Paddle's;
* ``dropout`` with ``downgrade_in_infer`` (Paddle's default) masks without
  rescaling in training and scales by ``1 - p`` at inference.

Gradient ops (``*_grad``, written by Paddle's ``append_backward``) map through
their forward op (``GradOf``): ``ctx.forward(op)`` finds the forward op whose vars
the grad op names, and the grad op becomes ssaexec's grad op of the op the forward
mapped to, reading the forward values by our slot names. So a grad op needs no
table of its own, and its numbers are those of ssaexec's grad kernels.

Attributes: each mapping reads the attributes it needs, converting Paddle's
encodings (``dtype`` codes, 4-element ``paddings``, ``padding_algorithm``) and
refusing values it cannot honour (``data_format='NHWC'``, ``use_softmax=False``,
a ``ShapeTensor`` input ...) with ``Unsupported``. Other attributes (``op_role``,
``use_mkldnn``, ``op_callstack``, fusion hints ...) do not change the result and
are ignored.

Size: one table, an entry per Paddle op type, with each multi-op mapping beside its
entry (over 500 lines).
"""

from ...ops.registry import EMPTY_VAR, get_op_def
from .reader import DTYPES

__all__ = ["MAPPINGS", "Mapping", "Unsupported", "mapping_table", "grad_forward_type"]


class Unsupported(Exception):
    """A Paddle op (or one of its attributes) that ssaexec cannot run; ``op`` and message."""

    def __init__(self, op, message):
        super().__init__(message)
        self.op = op


class Mapping:
    """How one Paddle op type becomes ssaexec ops: ``fn(ctx, op)``; ``ours`` and ``note``
    describe it for the docs."""

    __slots__ = ("paddle_type", "ours", "note", "fn")

    def __init__(self, paddle_type, ours, note, fn):
        self.paddle_type, self.ours, self.note, self.fn = paddle_type, ours, note, fn


MAPPINGS = {}


def _register(paddle_type, ours, fn, note=""):
    MAPPINGS[paddle_type] = Mapping(paddle_type, ours, note, fn)


# --- attributes -------------------------------------------------------------------------------

_REQUIRED = object()


def _get(op, name, default):
    if name in op.attrs:
        return op.attrs[name]
    if default is _REQUIRED:
        raise Unsupported(op, f"attribute {name!r} is missing")
    return default


def a_int(op, name, default=_REQUIRED):
    v = _get(op, name, default)
    if isinstance(v, bool) or not isinstance(v, int):
        raise Unsupported(op, f"attribute {name!r} must be an integer, got {v!r}")
    return v


def a_float(op, name, default=_REQUIRED):
    v = _get(op, name, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise Unsupported(op, f"attribute {name!r} must be a number, got {v!r}")
    return float(v)


def a_bool(op, name, default=_REQUIRED):
    v = _get(op, name, default)
    if isinstance(v, bool):
        return v
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    raise Unsupported(op, f"attribute {name!r} must be a boolean, got {v!r}")


def a_ints(op, name, default=_REQUIRED):
    v = _get(op, name, default)
    if not isinstance(v, list) or any(isinstance(x, bool) or not isinstance(x, int) for x in v):
        raise Unsupported(op, f"attribute {name!r} must be a list of integers, got {v!r}")
    return list(v)


def a_str(op, name, default=_REQUIRED):
    v = _get(op, name, default)
    if not isinstance(v, str):
        raise Unsupported(op, f"attribute {name!r} must be a string, got {v!r}")
    return v


def a_dtype(op, name, default=_REQUIRED):
    """A ``VarType.Type`` code attribute as our dtype name."""
    code = a_int(op, name, default)
    if code not in DTYPES:
        raise Unsupported(op, f"attribute {name!r}: data type code {code} has no ssaexec dtype "
                              f"(supported: {', '.join(sorted(DTYPES.values()))})")
    return DTYPES[code]


def require(op, cond, message):
    if not cond:
        raise Unsupported(op, message)


def no_inputs(op, *slots):
    """Refuse tensor inputs that would make an attribute dynamic (``ShapeTensor`` ...)."""
    for s in slots:
        if any(n != EMPTY_VAR for n in op.input(s)):
            raise Unsupported(op, f"input {s!r} (a value computed at run time) is not supported; "
                                  "ssaexec needs it as an attribute")


def _data_format(op, name="data_format"):
    fmt = a_str(op, name, "NCHW")
    require(op, fmt in ("NCHW", "AnyLayout"), f"{name}={fmt!r} is not supported; ssaexec "
                                               "convolutions and pools are NCHW")


def _one(op, slot, outputs=False):
    names = op.output(slot) if outputs else op.input(slot)
    if len(names) != 1:
        kind = "output" if outputs else "input"
        raise Unsupported(op, f"{kind} slot {slot!r} must name one var, names {len(names)}")
    return names[0]


# --- one op, renamed slots --------------------------------------------------------------------

class Simple:
    """Map to one ssaexec op: slots renamed (``ins``/``outs``: Paddle slot -> ours), attributes
    from ``attrs(op)``. Output slots in ``drop`` (``XShape``) are not produced; input slots in
    ``dynamic`` must be empty. Any other non-empty slot is refused."""

    def __init__(self, ours, ins, outs, attrs=None, drop=(), dynamic=()):
        self.ours, self.ins, self.outs = ours, dict(ins), dict(outs)
        self.attrs, self.drop, self.dynamic = attrs, tuple(drop), tuple(dynamic)

    def check_slots(self, op):
        no_inputs(op, *self.dynamic)
        for slot, names in op.inputs.items():
            if slot not in self.ins and slot not in self.dynamic and \
                    any(n != EMPTY_VAR for n in names):
                raise Unsupported(op, f"input slot {slot!r} is not supported")
        for slot, names in op.outputs.items():
            if slot not in self.outs and slot not in self.drop and \
                    any(n != EMPTY_VAR for n in names):
                raise Unsupported(op, f"output slot {slot!r} is not supported")

    def __call__(self, ctx, op, attrs=None):
        self.check_slots(op)
        if attrs is None:
            attrs = self.attrs(op) if self.attrs is not None else {}
        ours = ctx.emit(self.ours, {o: op.input(p) for p, o in self.ins.items() if op.input(p)},
                        {o: op.output(p) for p, o in self.outs.items() if op.output(p)}, attrs)
        ctx.record(op, ours, self.ins, self.outs)
        return ours


def simple(paddle_type, ours, ins=("X",), outs=("Out",), attrs=None, drop=(), dynamic=(),
           note=""):
    """Register a ``Simple`` mapping; ``ins``/``outs`` are dicts or same-name slot lists."""
    ins = ins if isinstance(ins, dict) else {s: s for s in ins}
    outs = outs if isinstance(outs, dict) else {s: s for s in outs}
    m = Simple(ours, ins, outs, attrs, drop, dynamic)
    _register(paddle_type, ours, m, note)
    return m


# --- gradients --------------------------------------------------------------------------------

# Paddle grad op types that are not "<forward>_grad"
_GRAD_NAMES = {"cross_entropy_grad2": "cross_entropy2"}


def grad_forward_type(grad_type):
    """The forward op type of Paddle grad op type ``grad_type``."""
    if grad_type in _GRAD_NAMES:
        return _GRAD_NAMES[grad_type]
    return grad_type[: -len("_grad")]


class GradOf:
    """Map a Paddle grad op to ssaexec's grad op of what its forward op became."""

    def __call__(self, ctx, op):
        rec = ctx.forward(op)
        fwd = rec.ours
        gdef = get_op_def(fwd.type + "_grad", missing_ok=True)
        if gdef is None:
            raise Unsupported(op, f"ssaexec's {fwd.type!r} has no gradient op")
        rev_in = {o: p for p, o in rec.ins.items()}
        rev_out = {o: p for p, o in rec.outs.items()}
        ins = {}
        for s in gdef.inputs:
            if s.name.endswith("@GRAD"):
                p = rev_out.get(s.name[:-5])
                names = op.input(p + "@GRAD") if p else []
            else:
                names = fwd.input(s.name) or fwd.output(s.name)
            if names:
                ins[s.name] = list(names)
        outs, used = {}, set()
        for s in gdef.outputs:
            p = rev_in.get(s.name[:-5])
            if p is not None and op.output(p + "@GRAD"):
                outs[s.name] = op.output(p + "@GRAD")
                used.add(p + "@GRAD")
        for slot, names in op.outputs.items():
            if slot not in used and any(n != EMPTY_VAR for n in names):
                raise Unsupported(op, f"output {slot!r} has no counterpart in ssaexec's "
                                      f"{gdef.type!r}")
        if not any(n != EMPTY_VAR for names in outs.values() for n in names):
            return None  # nothing wanted
        return ctx.emit(gdef.type, ins, outs, dict(fwd.attrs))


_GRAD = GradOf()


def with_grad(paddle_type, ours, note=""):
    """Register ``<paddle_type>_grad`` (mapped through its forward op)."""
    grad_type = paddle_type + "_grad"
    for k, v in _GRAD_NAMES.items():
        if v == paddle_type:
            grad_type = k
    _register(grad_type, ours + "_grad", _GRAD, note)


# --- the table --------------------------------------------------------------------------------

def _feed(ctx, op):
    ctx.feed(_one(op, "Out", outputs=True), a_int(op, "col", 0))


def _fetch(ctx, op):
    ctx.fetch(_one(op, "X"), a_int(op, "col", 0))


_register("feed", "(feed var)", _feed, "dropped; its output is a data var, in `col` order")
_register("fetch", "(fetch target)", _fetch, "dropped; its input is a fetch target")

# math
simple("mul", "mul", ["X", "Y"], attrs=lambda op: {
    "x_num_col_dims": a_int(op, "x_num_col_dims", 1),
    "y_num_col_dims": a_int(op, "y_num_col_dims", 1)})
with_grad("mul", "mul")


def _matmul_attrs(op):
    require(op, a_int(op, "head_number", 1) == 1, "head_number > 1 is not supported")
    for k in ("fused_reshape_X", "fused_reshape_Y", "fused_transpose_X", "fused_transpose_Y",
              "fused_reshape_Out", "fused_transpose_Out"):
        require(op, not op.attrs.get(k), f"fused attribute {k!r} is not supported")
    return {"transpose_X": a_bool(op, "transpose_X", False),
            "transpose_Y": a_bool(op, "transpose_Y", False), "alpha": a_float(op, "alpha", 1.0)}


simple("matmul", "matmul", ["X", "Y"], attrs=_matmul_attrs)
with_grad("matmul", "matmul")
simple("matmul_v2", "matmul", ["X", "Y"], attrs=lambda op: {
    "transpose_X": a_bool(op, "trans_x", False), "transpose_Y": a_bool(op, "trans_y", False)},
    note="`trans_x`/`trans_y` become `transpose_X`/`transpose_Y`")
with_grad("matmul_v2", "matmul")

for _ew in ("add", "sub", "mul", "div", "max", "min", "pow"):
    simple(f"elementwise_{_ew}", f"elementwise_{_ew}", ["X", "Y"],
           attrs=lambda op: {"axis": a_int(op, "axis", -1)})
    with_grad(f"elementwise_{_ew}", f"elementwise_{_ew}")

for _act in ("relu", "sigmoid", "tanh", "exp", "log", "sqrt", "square", "abs"):
    simple(_act, _act)
    with_grad(_act, _act)

simple("gelu", "gelu", attrs=lambda op: {"approximate": a_bool(op, "approximate", False)})
with_grad("gelu", "gelu")
simple("softmax", "softmax", attrs=lambda op: {"axis": a_int(op, "axis", -1)})
with_grad("softmax", "softmax")
simple("log_softmax", "log_softmax", attrs=lambda op: {"axis": a_int(op, "axis", -1)})
with_grad("log_softmax", "log_softmax")
simple("mean", "mean")
with_grad("mean", "mean")


def _reduce_attrs(op):
    out_dtype = a_int(op, "out_dtype", -1)
    require(op, out_dtype in (-1, op.attrs.get("in_dtype", -1)),
            "a reduction that changes the dtype (out_dtype) is not supported")
    dims = a_ints(op, "dim", [0])
    return {"dim": dims, "keep_dim": a_bool(op, "keep_dim", False),
            "reduce_all": a_bool(op, "reduce_all", False) or not dims}


for _red in ("reduce_sum", "reduce_mean", "reduce_max"):
    simple(_red, _red, attrs=_reduce_attrs, note="an empty `dim` reduces everything")
    with_grad(_red, _red)

simple("scale", "scale", attrs=lambda op: {
    "scale": a_float(op, "scale", 1.0), "bias": a_float(op, "bias", 0.0),
    "bias_after_scale": a_bool(op, "bias_after_scale", True)}, dynamic=("ScaleTensor",),
    note="Paddle's gradient of `scale` is a `scale` op")
simple("sum", "sum", note="also the sum of gradient contributions (`@RENAME@`)")
simple("assign", "assign")
simple("cast", "cast", attrs=lambda op: {"out_dtype": a_dtype(op, "out_dtype")},
       note="`out_dtype` code becomes a dtype name")
simple("arg_max", "argmax", attrs=lambda op: (
    require(op, not a_bool(op, "flatten", False), "flatten=True is not supported"),
    require(op, a_int(op, "dtype", 3) == 3, "only int64 results are supported"),
    {"axis": a_int(op, "axis", -1), "keepdim": a_bool(op, "keepdims", False)})[-1])

# losses
simple("softmax_with_cross_entropy", "softmax_with_cross_entropy", ["Logits", "Label"],
       ["Softmax", "Loss"], attrs=lambda op: (
           require(op, a_bool(op, "use_softmax", True), "use_softmax=False is not supported"),
           {"soft_label": a_bool(op, "soft_label", False),
            "ignore_index": a_int(op, "ignore_index", -100),
            "axis": a_int(op, "axis", -1)})[-1])
with_grad("softmax_with_cross_entropy", "softmax_with_cross_entropy")
simple("cross_entropy", "cross_entropy", ["X", "Label"], ["Y"], attrs=lambda op: {
    "soft_label": a_bool(op, "soft_label", False),
    "ignore_index": a_int(op, "ignore_index", -100)})
with_grad("cross_entropy", "cross_entropy")
simple("cross_entropy2", "cross_entropy", ["X", "Label"], ["Y"], drop=("XShape", "MatchX"),
       attrs=lambda op: {"ignore_index": a_int(op, "ignore_index", -100)},
       note="`XShape`/`MatchX` are not produced; grad op `cross_entropy_grad2`")
with_grad("cross_entropy2", "cross_entropy")

# creation
_SHAPE_INPUTS = ("ShapeTensor", "ShapeTensorList")


def _fill_constant(op):
    no_inputs(op, "ValueTensor", *_SHAPE_INPUTS)
    value = a_float(op, "value", 0.0)
    text = a_str(op, "str_value", "")
    if text:
        try:
            value = float(text)
        except ValueError:
            raise Unsupported(op, f"str_value {text[:40]!r} is not a number") from None
    return {"shape": a_ints(op, "shape"), "value": value, "dtype": a_dtype(op, "dtype", 5)}


simple("fill_constant", "fill_constant", [], attrs=_fill_constant,
       dynamic=("ValueTensor",) + _SHAPE_INPUTS,
       note="the loss-gradient seed (`op_role` Backward|Loss) gets role `loss`")
simple("fill_zeros_like", "fill_zeros_like")


def _fill_any_like(ctx, op):
    x, out = _one(op, "X"), _one(op, "Out", outputs=True)
    dtype = a_int(op, "dtype", -1)
    require(op, dtype == -1 or DTYPES.get(dtype) == ctx.dtype(x),
            "fill_any_like with another dtype than its input is not supported")
    value = a_float(op, "value", 0.0)
    if value == 0.0:
        ctx.emit("fill_zeros_like", {"X": [x]}, {"Out": [out]})
        return
    zeros = ctx.tmp(x)
    ctx.emit("fill_zeros_like", {"X": [x]}, {"Out": [zeros]})
    ctx.emit("scale", {"X": [zeros]}, {"Out": [out]}, {"scale": 1.0, "bias": value})


_register("fill_any_like", "fill_zeros_like (+ scale)", _fill_any_like)


def _random_attrs(dist):
    def attrs(op):
        require(op, a_int(op, "diag_num", 0) == 0, "diag_num is not supported")
        out = {"shape": a_ints(op, "shape"), "seed": a_int(op, "seed", 0),
               "dtype": a_dtype(op, "dtype", 5)}
        if dist == "uniform":
            out.update(min=a_float(op, "min", -1.0), max=a_float(op, "max", 1.0))
        else:
            out.update(mean=a_float(op, "mean", 0.0), std=a_float(op, "std", 1.0))
        return out
    return attrs


def _assign_value(op):
    values = None
    for key in ("values", "fp32_values", "fp64_values", "int32_values", "int64_values",
                "bool_values", "fp16_values"):
        if op.attrs.get(key):
            values = op.attrs[key]
            break
    values = values or []
    require(op, isinstance(values, list) and all(
        isinstance(v, (int, float)) for v in values), "values must be a list of numbers")
    return {"shape": a_ints(op, "shape"), "dtype": a_dtype(op, "dtype", 5),
            "values": [float(v) for v in values]}


simple("assign_value", "assign_value", [], attrs=_assign_value,
       note="the one non-empty `*_values` list")

_RANDOM_NOTE = "draws from ssaexec's generator: values differ from Paddle's"
simple("uniform_random", "uniform_random", [], attrs=_random_attrs("uniform"),
       dynamic=_SHAPE_INPUTS, note=_RANDOM_NOTE)
simple("gaussian_random", "gaussian_random", [], attrs=_random_attrs("gaussian"),
       dynamic=_SHAPE_INPUTS, note=_RANDOM_NOTE)

# shapes
simple("reshape", "reshape", attrs=lambda op: {"shape": a_ints(op, "shape")},
       dynamic=("Shape", "ShapeTensor"))
with_grad("reshape", "reshape")
simple("reshape2", "reshape", drop=("XShape",), attrs=lambda op: {"shape": a_ints(op, "shape")},
       dynamic=("Shape", "ShapeTensor"), note="`XShape` is not produced")
with_grad("reshape2", "reshape")
simple("transpose", "transpose", attrs=lambda op: {"axis": a_ints(op, "axis")})
with_grad("transpose", "transpose")
simple("transpose2", "transpose", drop=("XShape",), attrs=lambda op: {"axis": a_ints(op, "axis")})
with_grad("transpose2", "transpose")
simple("flatten", "flatten", attrs=lambda op: {"axis": a_int(op, "axis", 1)})
with_grad("flatten", "flatten")
simple("flatten2", "flatten", drop=("XShape",), attrs=lambda op: {"axis": a_int(op, "axis", 1)})
with_grad("flatten2", "flatten")


class _FlattenRange(Simple):
    """``flatten_contiguous_range`` as a ``reshape`` (0 keeps a dim, -1 takes the rest)."""

    def __init__(self):
        super().__init__("reshape", {"X": "X"}, {"Out": "Out"}, drop=("XShape",))

    def __call__(self, ctx, op):
        shape = ctx.shape(_one(op, "X"))
        require(op, shape is not None, "the input's rank is not declared")
        rank = len(shape)
        start = a_int(op, "start_axis", 1) % max(rank, 1)
        stop = a_int(op, "stop_axis", -1) % max(rank, 1)
        require(op, start <= stop, f"start_axis {start} is after stop_axis {stop}")
        tail = shape[stop + 1:]
        require(op, all(d >= 0 for d in tail), "dims after stop_axis must be known")
        return super().__call__(ctx, op, {"shape": [0] * start + [-1] + tail})


_register("flatten_contiguous_range", "reshape", _FlattenRange(),
          "`[0]*start_axis + [-1] + dims after stop_axis`")
with_grad("flatten_contiguous_range", "reshape")
simple("squeeze2", "squeeze", drop=("XShape",), attrs=lambda op: {"axes": a_ints(op, "axes", [])},
       dynamic=("AxesTensor", "AxesTensorList"))
with_grad("squeeze2", "squeeze")
simple("unsqueeze2", "unsqueeze", drop=("XShape",), attrs=lambda op: {"axes": a_ints(op, "axes")},
       dynamic=("AxesTensor", "AxesTensorList"))
with_grad("unsqueeze2", "unsqueeze")
simple("concat", "concat", attrs=lambda op: {"axis": a_int(op, "axis", 0)},
       dynamic=("AxisTensor",))
with_grad("concat", "concat")
simple("split", "split", outs=("Out",), attrs=lambda op: {
    "num": a_int(op, "num", 0), "sections": a_ints(op, "sections", []),
    "axis": a_int(op, "axis", 0)}, dynamic=("AxisTensor", "SectionsTensorList"),
    note="Paddle's gradient of `split` is a `concat` op")

# neural-network layers


def _paddings(op, spatial, ksize, strides, dilations, global_pool=False):
    """Symmetric [ph, pw] from ``paddings`` and ``padding_algorithm`` (and the new dilations)."""
    algo = a_str(op, "padding_algorithm", "EXPLICIT")
    pads = a_ints(op, "paddings", [0, 0])
    if global_pool or algo == "VALID":
        return [0, 0], dilations
    if algo == "SAME":
        require(op, spatial is not None and all(d > 0 for d in spatial),
                "padding_algorithm='SAME' needs the input's height and width declared")
        out = []
        for size, k, s in zip(spatial, ksize, strides, strict=True):
            total = max((-(-size // s) - 1) * s + k - size, 0)
            require(op, total % 2 == 0, "padding_algorithm='SAME' with uneven padding "
                                        "(more at the bottom/right) is not supported")
            out.append(total // 2)
        return out, [1, 1]
    require(op, algo == "EXPLICIT", f"padding_algorithm={algo!r} is not supported")
    if len(pads) == 4:
        require(op, pads[0] == pads[1] and pads[2] == pads[3],
                f"asymmetric paddings {pads} are not supported")
        pads = [pads[0], pads[2]]
    require(op, len(pads) == 2, f"paddings {pads} must have 2 or 4 entries")
    return pads, dilations


def _pair(op, name, default):
    v = a_ints(op, name, default)
    v = v * 2 if len(v) == 1 else v
    require(op, len(v) == 2, f"{name}={v} must have 2 entries (2-D op)")
    return v


def _conv_attrs(ctx, op):
    _data_format(op)
    x, w = _one(op, "Input"), _one(op, "Filter")
    xs, ws = ctx.shape(x), ctx.shape(w)
    strides, dilations = _pair(op, "strides", [1, 1]), _pair(op, "dilations", [1, 1])
    ksize = ws[2:] if ws is not None and len(ws) == 4 else None
    spatial = xs[2:] if xs is not None and len(xs) == 4 else None
    if a_str(op, "padding_algorithm", "EXPLICIT") == "SAME":
        require(op, ksize is not None, "padding_algorithm='SAME' needs the filter shape")
    pads, dilations = _paddings(op, spatial, ksize or [1, 1], strides, dilations)
    return {"strides": strides, "paddings": pads, "dilations": dilations,
            "groups": a_int(op, "groups", 1)}


class _Conv(Simple):
    def __init__(self):
        super().__init__("conv2d", {"Input": "Input", "Filter": "Filter"}, {"Output": "Output"})

    def __call__(self, ctx, op):
        return super().__call__(ctx, op, _conv_attrs(ctx, op))


_register("conv2d", "conv2d", _Conv(), "4-element symmetric `paddings`, `padding_algorithm` "
                                       "SAME/VALID; NCHW only")
with_grad("conv2d", "conv2d")
_register("depthwise_conv2d", "conv2d", _Conv(), "a grouped `conv2d`")
with_grad("depthwise_conv2d", "conv2d")


class _Pool(Simple):
    def __init__(self):
        super().__init__("pool2d", {"X": "X"}, {"Out": "Out"})

    def __call__(self, ctx, op):
        _data_format(op)
        kind = a_str(op, "pooling_type", "max")
        require(op, kind in ("max", "avg"), f"pooling_type={kind!r} is not supported")
        ksize = _pair(op, "ksize", [2, 2])
        strides = _pair(op, "strides", [1, 1])
        global_pool = a_bool(op, "global_pooling", False)
        if a_bool(op, "adaptive", False):
            require(op, ksize == [1, 1], "adaptive pooling to an output other than 1x1 is not "
                                         "supported")
            global_pool = True
        xs = ctx.shape(_one(op, "X"))
        spatial = xs[2:] if xs is not None and len(xs) == 4 else None
        pads, _ = _paddings(op, spatial, ksize, strides, [1, 1], global_pool)
        attrs = {"pooling_type": kind, "ksize": ksize, "strides": strides, "paddings": pads,
                 "global_pooling": global_pool, "ceil_mode": a_bool(op, "ceil_mode", False),
                 "exclusive": a_bool(op, "exclusive", True)}
        return super().__call__(ctx, op, attrs)


_register("pool2d", "pool2d", _Pool(), "`adaptive` only to 1x1 (global pooling); NCHW only")
with_grad("pool2d", "pool2d")

_BN_IN = {"X": "X", "Scale": "Scale", "Bias": "Bias", "Mean": "Mean", "Variance": "Variance"}
_BN_OUT = {"Y": "Y", "MeanOut": "MeanOut", "VarianceOut": "VarianceOut",
           "SavedMean": "SavedMean", "SavedVariance": "SavedVariance"}


def _batch_norm(ctx, op):
    fmt = a_str(op, "data_layout", "NCHW")
    require(op, fmt in ("NCHW", "AnyLayout"), f"data_layout={fmt!r} is not supported")
    require(op, not a_bool(op, "fuse_with_relu", False), "fuse_with_relu is not supported")
    no_inputs(op, "MomentumTensor")
    is_test = a_bool(op, "is_test", False)
    global_stats = a_bool(op, "use_global_stats", False)
    require(op, not (is_test and a_bool(op, "trainable_statistics", False)),
            "trainable_statistics is not supported")
    momentum = a_float(op, "momentum", 0.9)
    attrs = {"momentum": momentum, "epsilon": a_float(op, "epsilon", 1e-5), "is_test": is_test,
             "use_global_stats": global_stats}
    mapping = Simple("batch_norm", _BN_IN, _BN_OUT, drop=("ReserveSpace",),
                     dynamic=("MomentumTensor",))
    mapping.check_slots(op)
    if is_test or global_stats:
        return mapping(ctx, op, attrs)
    # Training: our kernel's running variance (unbiased batch variance) goes to a scratch
    # var; Paddle's (biased) is computed from the batch below.
    x, var, var_out = _one(op, "X"), _one(op, "Variance"), _one(op, "VarianceOut", outputs=True)
    saved_mean = _one(op, "SavedMean", outputs=True)
    scratch = ctx.tmp(var)
    outs = {o: op.output(p) for p, o in _BN_OUT.items() if op.output(p)}
    outs["VarianceOut"] = [scratch]
    ins = {o: op.input(p) for p, o in _BN_IN.items()}
    ours = ctx.emit("batch_norm", ins, outs, attrs)
    ctx.record(op, ours, _BN_IN, _BN_OUT)
    shape = ctx.shape(x)
    require(op, shape is not None and len(shape) >= 2, "the input's rank is not declared")
    centred, squared, batch_var = ctx.tmp(x), ctx.tmp(x), ctx.tmp(var)
    kept, new = ctx.tmp(var), ctx.tmp(var)
    ctx.emit("elementwise_sub", {"X": [x], "Y": [saved_mean]}, {"Out": [centred]}, {"axis": 1})
    ctx.emit("square", {"X": [centred]}, {"Out": [squared]})
    ctx.emit("reduce_mean", {"X": [squared]}, {"Out": [batch_var]},
             {"dim": [d for d in range(len(shape)) if d != 1], "keep_dim": False,
              "reduce_all": False})
    ctx.emit("scale", {"X": [var]}, {"Out": [kept]}, {"scale": momentum})
    ctx.emit("scale", {"X": [batch_var]}, {"Out": [new]}, {"scale": 1.0 - momentum})
    ctx.emit("elementwise_add", {"X": [kept], "Y": [new]}, {"Out": [var_out]})
    return ours


_register("batch_norm", "batch_norm (+ 6 ops in training)", _batch_norm,
          "training: running variance from the biased batch variance, as Paddle's CPU kernel")
with_grad("batch_norm", "batch_norm")
simple("layer_norm", "layer_norm", ["X", "Scale", "Bias"], ["Y"], drop=("Mean", "Variance"),
       attrs=lambda op: {"begin_norm_axis": a_int(op, "begin_norm_axis", 1),
                         "epsilon": a_float(op, "epsilon", 1e-5)},
       note="`Mean`/`Variance` are not produced")
with_grad("layer_norm", "layer_norm")


def _lookup_attrs(op):
    pad = a_int(op, "padding_idx", -1)
    require(op, pad == -1, "padding_idx is not supported (Paddle zeroes those rows' output)")
    return {"padding_idx": -1}


simple("lookup_table_v2", "lookup_table", ["W", "Ids"], attrs=_lookup_attrs,
       note="no `padding_idx`; dense gradients only")


def _lookup_grad(ctx, op):
    require(op, not a_bool(op, "is_sparse", False),
            "sparse (SelectedRows) gradients are not supported; set is_sparse=False")
    return _GRAD(ctx, op)


_register("lookup_table_v2_grad", "lookup_table_grad", _lookup_grad)


def _dropout(ctx, op):
    no_inputs(op, "Seed")
    p = a_float(op, "dropout_prob", 0.5)
    is_test = a_bool(op, "is_test", False)
    impl = a_str(op, "dropout_implementation", "downgrade_in_infer")
    require(op, impl in ("downgrade_in_infer", "upscale_in_train"),
            f"dropout_implementation={impl!r} is not supported")
    seed = a_int(op, "seed", 0) if a_bool(op, "fix_seed", False) else 0
    attrs = {"dropout_prob": p, "is_test": is_test, "seed": seed}
    mapping = Simple("dropout", {"X": "X"}, {"Out": "Out", "Mask": "Mask"}, dynamic=("Seed",))
    mapping.check_slots(op)
    if impl == "upscale_in_train":
        return mapping(ctx, op, attrs)
    x, out = _one(op, "X"), _one(op, "Out", outputs=True)
    if is_test:
        return ctx.emit("scale", {"X": [x]}, {"Out": [out]}, {"scale": 1.0 - p})
    # downgrade_in_infer in training: Out = X * Mask, no rescaling
    mask = op.output("Mask")[0] if op.output("Mask") else ctx.tmp(x, dtype="uint8")
    scaled, keep = ctx.tmp(x), ctx.tmp(x)
    ours = ctx.emit("dropout", {"X": [x]}, {"Out": [scaled], "Mask": [mask]}, attrs)
    ctx.record(op, ours, {"X": "X"}, {"Mask": "Mask"})
    ctx.emit("cast", {"X": [mask]}, {"Out": [keep]}, {"out_dtype": ctx.dtype(x)})
    return ctx.emit("elementwise_mul", {"X": [x], "Y": [keep]}, {"Out": [out]})


def _dropout_grad(ctx, op):
    fwd = ctx.forward(op).ours
    impl = a_str(op, "dropout_implementation", "downgrade_in_infer")
    if impl == "upscale_in_train" or fwd.attrs.get("is_test"):
        return _GRAD(ctx, op)
    grad_in, grad_out = _one(op, "Out@GRAD"), _one(op, "X@GRAD", outputs=True)
    keep = ctx.tmp(grad_out)
    ctx.emit("cast", {"X": fwd.output("Mask")}, {"Out": [keep]}, {"out_dtype": ctx.dtype(grad_in)})
    return ctx.emit("elementwise_mul", {"X": [grad_in], "Y": [keep]}, {"Out": [grad_out]})


_register("dropout", "dropout (+ cast, elementwise_mul)", _dropout,
          "`downgrade_in_infer` (Paddle's default): mask without rescaling in training, "
          "`scale` by 1-p in inference; masks differ from Paddle's")
_register("dropout_grad", "dropout_grad or elementwise_mul", _dropout_grad)

# optimizers


def _update_slots(op, ins, outs):
    """Refuse master weights and the like; require ParamOut == Param (updates are in place)."""
    for slot, names in op.inputs.items():
        if slot not in ins and any(n != EMPTY_VAR for n in names):
            raise Unsupported(op, f"input {slot!r} is not supported")
    for slot, names in op.outputs.items():
        if slot not in outs and any(n != EMPTY_VAR for n in names):
            raise Unsupported(op, f"output {slot!r} is not supported")
    for out, inp in outs.items():
        if op.output(out) != op.input(inp):
            raise Unsupported(op, f"{out} must name the same var as {inp} (ssaexec updates in "
                                  "place)")
    for slot in ins:
        _one(op, slot)


def _sgd(ctx, op):
    ins = ("Param", "Grad", "LearningRate")
    _update_slots(op, ins, {"ParamOut": "Param"})
    param, grad = _one(op, "Param"), _one(op, "Grad")
    ctx.emit("sgd", {s: op.input(s) for s in ins}, {"ParamOut": [param]},
             {"weight_decay": 0.0}, role_var=[(param, grad)])


def _momentum(ctx, op):
    ins = ("Param", "Grad", "Velocity", "LearningRate")
    _update_slots(op, ins, {"ParamOut": "Param", "VelocityOut": "Velocity"})
    require(op, a_float(op, "rescale_grad", 1.0) == 1.0, "rescale_grad != 1 is not supported")
    method = a_str(op, "regularization_method", "")
    require(op, method in ("", "l2_decay"), f"regularization_method={method!r} is not supported")
    decay = a_float(op, "regularization_coeff", 0.0) if method == "l2_decay" else 0.0
    param, grad = _one(op, "Param"), _one(op, "Grad")
    ctx.emit("momentum", {s: op.input(s) for s in ins},
             {"ParamOut": [param], "VelocityOut": op.input("Velocity")},
             {"mu": a_float(op, "mu", 0.9), "use_nesterov": a_bool(op, "use_nesterov", False),
              "weight_decay": decay}, role_var=[(param, grad)])


def _adam(ctx, op):
    ins = ("Param", "Grad", "LearningRate", "Moment1", "Moment2", "Beta1Pow", "Beta2Pow")
    _update_slots(op, ins, {"ParamOut": "Param", "Moment1Out": "Moment1",
                            "Moment2Out": "Moment2", "Beta1PowOut": "Beta1Pow",
                            "Beta2PowOut": "Beta2Pow"})
    require(op, not a_bool(op, "use_global_beta_pow", False),
            "use_global_beta_pow is not supported")
    decoupled = op.type == "adamw"
    decay = 0.0
    if decoupled:
        require(op, a_float(op, "lr_ratio", 1.0) == 1.0, "lr_ratio != 1 is not supported")
        decay = a_float(op, "coeff", 0.01) if a_bool(op, "with_decay", True) else 0.0
    b1, b2 = a_float(op, "beta1", 0.9), a_float(op, "beta2", 0.999)
    require(op, b1 > 0 and b2 > 0, "beta1 and beta2 must be positive")
    param, grad = _one(op, "Param"), _one(op, "Grad")
    pair = [(param, grad)]
    # Paddle's accumulators hold beta**t before step t, ours after: shift by one power
    pows = {}
    for slot, beta in (("Beta1Pow", b1), ("Beta2Pow", b2)):
        acc = _one(op, slot)
        prev = ctx.tmp(acc)
        ctx.emit("scale", {"X": [acc]}, {"Out": [prev]}, {"scale": 1.0 / beta}, role_var=pair)
        pows[slot] = (acc, prev, beta)
    ours_in = {s: op.input(s) for s in ins}
    ours_in["Beta1Pow"], ours_in["Beta2Pow"] = [pows["Beta1Pow"][1]], [pows["Beta2Pow"][1]]
    ctx.emit("adam", ours_in,
             {"ParamOut": [param], "Moment1Out": op.input("Moment1"),
              "Moment2Out": op.input("Moment2"), "Beta1PowOut": [pows["Beta1Pow"][1]],
              "Beta2PowOut": [pows["Beta2Pow"][1]]},
             {"beta1": b1, "beta2": b2, "epsilon": a_float(op, "epsilon", 1e-8),
              "weight_decay": decay, "decoupled": decoupled}, role_var=pair)
    for acc, prev, beta in pows.values():
        ctx.emit("scale", {"X": [prev]}, {"Out": [acc]}, {"scale": beta}, role_var=pair)


_register("sgd", "sgd", _sgd)
_register("momentum", "momentum", _momentum, "`regularization_method='l2_decay'` becomes "
                                             "`weight_decay`")
_register("adam", "adam (+ 4 scale)", _adam, "beta-power accumulators keep Paddle's meaning")
_register("adamw", "adam (decoupled, + 4 scale)", _adam, "`coeff` becomes `weight_decay`")


def mapping_table():
    """The docs table: one Markdown row per mapped Paddle op type, sorted."""
    rows = ["| Paddle op | ssaexec op | notes |", "|---|---|---|"]
    for name in sorted(MAPPINGS):
        m = MAPPINGS[name]
        rows.append(f"| `{name}` | {m.ours} | {m.note} |")
    return "\n".join(rows)
