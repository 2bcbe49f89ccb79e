"""Paddle mappings, neural-network layers: convolution, pooling, normalisation, lookup, dropout.

Registered into ``mapping.MAPPINGS`` on import (by ``paddle/ops.py``, which states the
conventions, among them ``batch_norm``'s running variance and ``dropout``'s
``downgrade_in_infer``).
"""

from .mapping import (_GRAD, Simple, _data_format, _one, _register, a_bool, a_float, a_int, a_ints,
                      a_str, no_inputs, require, simple, with_grad)


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
        require(op, len(spatial) == len(ksize) == len(strides) == 2 and min(strides) > 0,
                f"padding_algorithm='SAME' needs 2 positive strides, got {strides[:8]}")
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


def _pair(op, name, default, positive=False):
    v = a_ints(op, name, default)
    v = v * 2 if len(v) == 1 else v
    require(op, len(v) == 2, f"{name}={v[:8]} must have 2 entries (2-D op)")
    # a zero stride would divide by zero in the SAME padding below, and in the kernel
    require(op, not positive or min(v) > 0, f"{name}={v} must be positive")
    return v


def _conv_attrs(ctx, op):
    _data_format(op)
    x, w = _one(op, "Input"), _one(op, "Filter")
    xs, ws = ctx.shape(x), ctx.shape(w)
    strides = _pair(op, "strides", [1, 1], positive=True)
    dilations = _pair(op, "dilations", [1, 1], positive=True)
    require(op, a_int(op, "groups", 1) > 0, f"groups={a_int(op, 'groups', 1)} must be positive")
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
        ksize = _pair(op, "ksize", [2, 2], positive=True)
        strides = _pair(op, "strides", [1, 1], positive=True)
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
