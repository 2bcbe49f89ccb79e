"""Paddle mappings, math family: feed and fetch, arithmetic, activations, reductions, losses.

Registered into ``mapping.MAPPINGS`` on import (by ``paddle/ops.py``, which states the conventions).
"""

from .mapping import (_one, _register, a_bool, a_dtype, a_float, a_int, a_ints, require, simple,
                      with_grad)


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
