"""Neural-network ops: conv2d, batch_norm, pool2d, layer_norm, dropout, lookup_table.

Layouts are NCHW. ``batch_norm`` follows Paddle's momentum convention
(running = momentum * running + (1 - momentum) * batch) and updates the
running statistics through its ``MeanOut``/``VarianceOut`` outputs, which name
the same vars as its ``Mean``/``Variance`` inputs. The running variance uses
the unbiased batch variance, as torch does.

Kernel calls (docs/security.md). The values are the program's: a file may give
``batch_norm`` 1-element statistics over 8 channels, ``conv2d_grad`` a gradient of
another batch size, ``lookup_table`` ids past the table. The kernels that trust such
values are called through the guard layer (``ssaexec.ops.guards_hand.kernel``, resolved
once, below): ``native_batch_norm`` (statistics, one per channel; training writes
them), its backward (saved statistics and gradient), ``convolution`` (the size its
padding makes) and its backward (the gradient's shape); ``lookup_table``'s gradient
(``ops.sparse``) checks its ids. The ``F.*`` calls left (pooling, layer norm, gelu)
check their arguments on every device, and their gradients (``torch.func.vjp``) pass
statistics the forward made; ``F.embedding`` checks its ids on the CPU and on a GPU
stops at a device-side assert (see ``lookup_table``). The kernel fuzzer
(``tests/kernel_fuzz.py``) drives all of these ops with hostile inputs.
"""

import torch
import torch.nn.functional as F

from ..core.errors import ProgramError
from .guards import GuardError
from .guards_hand import kernel
from .registry import ShapeRule, register_grad, register_op
from .shape_rules import broadcast, like, number_class, numel

_CONVOLUTION = kernel("aten.convolution.default")
_CONVOLUTION_BACKWARD = kernel("aten.convolution_backward.default")
_BATCH_NORM = kernel("aten.native_batch_norm.default")
_BATCH_NORM_BACKWARD = kernel("aten.native_batch_norm_backward.default")

_CONV_ATTRS = {"strides": ("ints", [1, 1]), "paddings": ("ints", [0, 0]),
               "dilations": ("ints", [1, 1]), "groups": ("int", 1)}


def _pair(v):
    return list(v) * 2 if len(v) == 1 else list(v)


@register_op("conv2d", ["Input", "Filter"], ["Output"], _CONV_ATTRS)
def conv2d(ins, attrs):
    """Output = 2-D convolution of Input (NCHW) with Filter (OIHW), no bias."""
    # what F.conv2d calls for a batched input, behind the guard of its result's size
    return {"Output": _CONVOLUTION(ins["Input"], ins["Filter"], None, _pair(attrs["strides"]),
                                   _pair(attrs["paddings"]), _pair(attrs["dilations"]), False,
                                   [0, 0], attrs["groups"])}


@register_grad("conv2d", uses=["Input", "Filter"])
def conv2d_grad(ins, attrs, wanted):
    x, w, g = ins["Input"], ins["Filter"], ins["Output@GRAD"]
    mask = [wanted.get("Input@GRAD", [False])[0], wanted.get("Filter@GRAD", [False])[0], False]
    gx, gw, _ = _CONVOLUTION_BACKWARD(
        g, x, w, None, _pair(attrs["strides"]), _pair(attrs["paddings"]),
        _pair(attrs["dilations"]), False, [0, 0], attrs["groups"], mask)
    out = {}
    if mask[0]:
        out["Input@GRAD"] = gx
    if mask[1]:
        out["Filter@GRAD"] = gw
    return out


_BN_ATTRS = {"momentum": ("float", 0.9), "epsilon": ("float", 1e-5), "is_test": ("bool", False),
             "use_global_stats": ("bool", False), "data_layout": ("str", "NCHW")}


def _guard_check(overload, *args):
    """Run the guard of hand-written ``overload`` alone, as its call would (shape rules)."""
    try:
        overload._check(overload.op_type, *args)
    except ProgramError as e:
        raise GuardError(str(e)) from None


_BN_STATS = ("Scale", "Bias", "Mean", "Variance")


def _bn_shapes(ins, attrs):
    # the guard reads shapes only: it runs on meta tensors of the probe's sizes
    x = ins["X"][0]
    mean, var = ins["Mean"][0], ins["Variance"][0]
    training = not (attrs["is_test"] or attrs["use_global_stats"])
    _guard_check(_BATCH_NORM, torch.empty(x, device="meta"),
                 *[torch.empty(ins[s][0], device="meta") for s in _BN_STATS], training)
    # then what torch's meta kernel (a Python decomposition) does with the shapes
    c = x[1]
    tail = [1] * (len(x) - 2)
    if training:
        # it corrects the running variance by n / (n - 1), n = numel / channels
        if c == 0 or numel(x) == c:
            raise ZeroDivisionError("float division by zero")
        for stat in (mean, var):  # stat.copy_(momentum * batch stat [C] + ... * stat)
            if broadcast(broadcast([c], stat), stat) != list(stat):
                raise RuntimeError(f"the running statistics' update of shape [{c}] does not "
                                   f"broadcast to their shape {list(stat)}")
        y, saved = list(x), ([c], [c])
    else:
        # (x - mean) * invstd, each statistic unsqueezed at the end to rank(X) - 1
        y = x
        for stat in (mean, var):
            y = broadcast(y, list(stat) + [1] * (len(x) - 1 - len(stat)))
        saved = (mean, var)
    for _ in ("Scale", "Bias"):  # flattened, [C, 1, ...]
        y = broadcast(y, [c] + tail)
    return {"Y": y, "MeanOut": mean, "VarianceOut": var, "SavedMean": saved[0],
            "SavedVariance": saved[1]}


def _bn_canon(ins, attrs):
    return dict({"X": [2, 1]}, **{s: [1] for s in _BN_STATS}), {
        "momentum": number_class(attrs["momentum"], 0.9),
        "epsilon": number_class(attrs["epsilon"], 1e-5), "is_test": attrs["is_test"],
        "use_global_stats": attrs["use_global_stats"], "data_layout": "NCHW"}


@register_op("batch_norm", ["X", "Scale", "Bias", "Mean!", "Variance!"],
             ["Y", "MeanOut!", "VarianceOut!", "SavedMean!", "SavedVariance!"], _BN_ATTRS,
             rule=ShapeRule(_bn_shapes, _bn_canon))
def batch_norm(ins, attrs):
    """Y = batch-normalised X; training mode also updates the running statistics."""
    x = ins["X"]
    training = not (attrs["is_test"] or attrs["use_global_stats"])
    # copies in both modes: training updates them in place, and in test mode
    # MeanOut/VarianceOut must still be fresh tensors, not the Mean/Variance inputs
    mean, var = ins["Mean"].clone(), ins["Variance"].clone()
    y, saved_mean, saved_invstd = _BATCH_NORM(
        x, ins["Scale"], ins["Bias"], mean, var, training, 1.0 - attrs["momentum"],
        attrs["epsilon"])
    return {"Y": y, "MeanOut": mean, "VarianceOut": var, "SavedMean": saved_mean,
            "SavedVariance": saved_invstd}


@register_grad("batch_norm", uses=["X", "Scale", "Mean", "Variance", "SavedMean",
                                   "SavedVariance"])
def batch_norm_grad(ins, attrs, wanted):
    training = not (attrs["is_test"] or attrs["use_global_stats"])
    mask = [wanted.get(k, [False])[0] for k in ("X@GRAD", "Scale@GRAD", "Bias@GRAD")]
    gx, gs, gb = _BATCH_NORM_BACKWARD(
        ins["Y@GRAD"], ins["X"], ins["Scale"], ins["Mean"], ins["Variance"], ins["SavedMean"],
        ins["SavedVariance"], training, attrs["epsilon"], mask)
    return {k: v for k, v, m in zip(("X@GRAD", "Scale@GRAD", "Bias@GRAD"), (gx, gs, gb), mask,
                                   strict=True) if m}


_POOL_ATTRS = {"pooling_type": ("str", "max"), "ksize": ("ints", [2, 2]),
               "strides": ("ints", [1, 1]), "paddings": ("ints", [0, 0]),
               "global_pooling": ("bool", False), "ceil_mode": ("bool", False),
               "exclusive": ("bool", True)}


@register_op("pool2d", ["X"], ["Out"], _POOL_ATTRS)
def pool2d(ins, attrs):
    """Out = max or average pooling of X (NCHW); ``global_pooling`` pools to 1x1.

    ``exclusive`` averages divide by the cells of the window inside X; otherwise
    by the whole kernel area, padding counting as zeros (Paddle's rule).
    """
    x = ins["X"]
    pooling = attrs["pooling_type"]
    if pooling not in ("max", "avg"):
        raise ValueError(f"pooling_type must be 'max' or 'avg', got {pooling!r}")
    if attrs["global_pooling"]:
        out = x.amax(dim=(2, 3), keepdim=True) if pooling == "max" else x.mean(dim=(2, 3),
                                                                           keepdim=True)
        return {"Out": out}
    k, s, p = _pair(attrs["ksize"]), _pair(attrs["strides"]), _pair(attrs["paddings"])
    if pooling == "max":
        out = F.max_pool2d(x, k, s, p, ceil_mode=attrs["ceil_mode"])
    elif attrs["exclusive"]:
        out = F.avg_pool2d(x, k, s, p, ceil_mode=attrs["ceil_mode"], count_include_pad=False)
    else:
        # Paddle divides by the full kernel area; torch's count_include_pad clips
        # windows that hang past the padding (ceil_mode) and would divide by less
        out = F.avg_pool2d(x, k, s, p, ceil_mode=attrs["ceil_mode"], count_include_pad=True,
                           divisor_override=k[0] * k[1])
    return {"Out": out}


def _ln_shapes(ins, attrs):
    x = ins["X"][0]
    shape = x[attrs["begin_norm_axis"]:]
    for s in ("Scale", "Bias"):
        if s in ins and numel(ins[s][0]) != numel(shape):
            raise RuntimeError(f"shape '{list(shape)}' is invalid for input of size "
                               f"{numel(ins[s][0])}")
    if not shape:
        raise RuntimeError("Expected normalized_shape to be at least 1-dimensional, i.e., "
                           "containing at least one element, but got normalized_shape = []")
    return {"Y": x}


def _ln_canon(ins, attrs):
    return dict({"X": [1]}, **{s: [1] for s in ("Scale", "Bias") if s in ins}), {
        "begin_norm_axis": 0, "epsilon": number_class(attrs["epsilon"], 1e-5)}


@register_op("layer_norm", ["X", "Scale?", "Bias?"], ["Y"],
             {"begin_norm_axis": ("int", 1), "epsilon": ("float", 1e-5)},
             rule=ShapeRule(_ln_shapes, _ln_canon))
def layer_norm(ins, attrs):
    """Y = X normalised over dims from ``begin_norm_axis`` on, then scaled and shifted."""
    x = ins["X"]
    shape = list(x.shape[attrs["begin_norm_axis"]:])
    scale, bias = ins.get("Scale"), ins.get("Bias")
    scale = None if scale is None else scale.reshape(shape)
    bias = None if bias is None else bias.reshape(shape)
    return {"Y": F.layer_norm(x, shape, scale, bias, attrs["epsilon"])}


_FIXED = {}  # (seed, shape, device) -> what a fixed seed draws (fixed_uniform)


def fixed_uniform(seed, shape, device):
    """``torch.rand(shape)`` (float32) from a generator seeded with ``seed``: the same
    tensor every call, not to be written (policy: ``runtime.rng``)."""
    key = (int(seed), tuple(shape), torch.device(device))
    t = _FIXED.get(key)
    if t is None:
        gen = torch.Generator(device=key[2])
        gen.manual_seed(key[0])
        # two threads may both draw: the numbers are equal, either may be kept
        t = _FIXED.setdefault(key, torch.rand(key[1], generator=gen, device=key[2],
                                               dtype=torch.float32))
    return t


def _dropout_prob(attrs):
    # Paddle refuses a probability outside [0, 1]; NaN fails both comparisons, and a
    # p above 1 would scale by a negative 1 / (1 - p) or drop everything silently
    p = attrs["dropout_prob"]
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout: dropout_prob is {p}; it must be in [0, 1]")
    return p


def _dropout_shapes(ins, attrs):
    _dropout_prob(attrs)  # validation runs the rule, not the kernel, with the file's attrs
    return _LIKE_X.shapes(ins, attrs)


_LIKE_X = like("X", "Out", "Mask")


def _dropout_canon(ins, attrs):
    # both branches of the kernel make X's dtype and uint8, but the run keeps which one
    return {"X": [1] if ins["X"][0] else []}, {
        "dropout_prob": 0.0 if attrs["dropout_prob"] == 0.0 else 0.5,
        "is_test": attrs["is_test"], "seed": 0}


@register_op("dropout", ["X"], ["Out", "Mask!"],
             {"dropout_prob": ("float", 0.5), "is_test": ("bool", False), "seed": ("int", 0)},
             is_random=True, rule=ShapeRule(_dropout_shapes, _dropout_canon))
def dropout(ins, attrs):
    """Out = X * Mask / (1 - p) (upscale in train); a non-zero ``seed`` fixes the mask."""
    x, p = ins["X"], _dropout_prob(attrs)
    if attrs["is_test"] or p == 0.0:
        return {"Out": x.clone(), "Mask": torch.ones_like(x, dtype=torch.uint8)}
    if x.device.type == "meta":
        return {"Out": torch.empty_like(x), "Mask": torch.empty_like(x, dtype=torch.uint8)}
    if attrs["seed"]:  # drawn once, no generator in the step (runtime.rng, CUDA graphs)
        keep = fixed_uniform(attrs["seed"], x.shape, x.device) >= p
    else:
        keep = torch.rand(x.shape, device=x.device, dtype=torch.float32) >= p
    mask = keep.to(torch.uint8)
    return {"Out": x * keep.to(x.dtype) * _keep_scale(p), "Mask": mask}


def _keep_scale(p):
    # p == 1 drops everything (the mask is all zeros); 1 / (1 - p) would give 0 * inf = nan
    return 0.0 if p >= 1.0 else 1.0 / (1.0 - p)


@register_grad("dropout", uses=["Mask"])
def dropout_grad(ins, attrs, wanted):
    g, p = ins["Out@GRAD"], _dropout_prob(attrs)
    if attrs["is_test"] or p == 0.0:
        return {"X@GRAD": g.clone()}   # a fresh tensor, not Out@GRAD itself
    return {"X@GRAD": g * ins["Mask"].to(g.dtype) * _keep_scale(p)}


@register_op("lookup_table", ["W", "Ids!"], ["Out"],
             {"padding_idx": ("int", -1), "is_sparse": ("bool", False)})
def lookup_table(ins, attrs):
    """Out = rows of W picked by Ids (embedding); rows at ``padding_idx`` get no gradient.

    Its gradient (``ops.sparse``) is sparse, the touched rows only, with ``is_sparse``."""
    pad = attrs["padding_idx"]
    # unguarded on purpose: torch checks the ids on the CPU (index_select), and on a GPU a
    # bad id is a device-side assert, which writes nothing; a guard there would read the
    # ids on the host every step, and no CUDA graph could capture the step
    return {"Out": F.embedding(ins["Ids"], ins["W"], padding_idx=None if pad < 0 else pad)}
