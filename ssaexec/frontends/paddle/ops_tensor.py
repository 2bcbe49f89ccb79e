"""Paddle mappings, tensor family: creation (constants, random values) and shapes.

Registered into ``mapping.MAPPINGS`` on import (by ``paddle/ops.py``, which states the conventions).
"""

from .mapping import (Simple, Unsupported, _one, _register, a_dtype, a_float, a_int, a_ints, a_str,
                      no_inputs, require, simple, with_grad)
from .reader import DTYPES


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
