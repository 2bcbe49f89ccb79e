"""Case tables for tests/ops/test_ops.py: inputs, attrs and an independent torch reference per op.

Every case names an op type, its inputs (slot -> tensor, list of tensors for a
duplicable slot, or None for an absent optional slot), the attrs given to the
op (defaults are filled in by ``OpDef.full_attrs``) and a reference
``ref(ins, attrs) -> {out_slot: tensor or list}`` written with plain torch,
differentiable by autograd so the same reference checks the gradient.

References are written from the op's meaning (a formula, or the matching
``torch.nn.functional`` call with every argument spelled out), not by calling
ssaexec code, so a wrong attribute mapping or broadcasting rule shows up.
Inputs are float64 and drawn from one seeded generator, so runs repeat.
"""

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

_GEN = torch.Generator().manual_seed(20240611)
F64 = torch.float64


def rn(*shape):
    """Standard normal float64 values."""
    return torch.randn(shape, generator=_GEN, dtype=F64)


def pos(*shape, lo=0.5, hi=2.0):
    """Uniform float64 values in [lo, hi) (for log, sqrt, pow bases, divisors)."""
    return torch.rand(shape, generator=_GEN, dtype=F64) * (hi - lo) + lo


def away(*shape, gap=0.1):
    """Normal values pushed at least ``gap`` away from 0 (no kinks for relu/abs)."""
    x = rn(*shape)
    return x + torch.where(x >= 0, gap, -gap)


def distinct(*shape):
    """Values with no ties (max/min and pooling gradients are then unique)."""
    n = math.prod(shape)
    perm = torch.randperm(n, generator=_GEN).to(F64)
    return (perm / n + 0.01 * rn(n)).reshape(shape)


def ints(hi, *shape):
    return torch.randint(0, hi, shape, generator=_GEN, dtype=torch.int64)


def probs(*shape):
    """Rows that are probability distributions over the last dim (strictly positive)."""
    return torch.softmax(rn(*shape), dim=-1)


@dataclass
class OpCase:
    """One op invocation and its reference (see the module docstring)."""

    type: str
    inputs: dict
    ref: object
    attrs: dict = field(default_factory=dict)
    name: str = ""
    # check the gradient against autograd on ``ref`` (only for differentiable ops)
    grad: bool = True
    # output slots the reference does not model (e.g. batch_norm's saved stats in test mode)
    unchecked: tuple = ()

    @property
    def id(self):
        return f"{self.type}-{self.name}" if self.name else self.type


CASES = []


def case(type, inputs, ref, attrs=None, name="", **kw):
    CASES.append(OpCase(type, inputs, ref, dict(attrs or {}), name, **kw))


# --- elementwise with Paddle's axis broadcasting --------------------------------------------

def paddle_broadcast(x, y, axis):
    """``y`` shaped so numpy broadcasting realises Paddle's ``axis`` rule.

    axis == -1 means axis = rank(X) - rank(Y) (numpy alignment); Y's dims then
    sit at X's dims axis .. axis + rank(Y) - 1.
    """
    if y.dim() >= x.dim():
        return y
    if axis == -1:
        axis = x.dim() - y.dim()
    return y.reshape([1] * axis + list(y.shape) + [1] * (x.dim() - axis - y.dim()))


EW_REFS = {
    "elementwise_add": lambda a, b: a + b,
    "elementwise_sub": lambda a, b: a - b,
    "elementwise_mul": lambda a, b: a * b,
    "elementwise_div": lambda a, b: a / b,
    "elementwise_max": lambda a, b: torch.where(a > b, a, b),
    "elementwise_min": lambda a, b: torch.where(a < b, a, b),
    "elementwise_pow": lambda a, b: torch.exp(b * torch.log(a)),
}

# (name, X shape, Y shape, axis)
EW_SHAPES = [
    ("same", [3, 4], [3, 4], -1),
    ("axis1_mid", [2, 3, 4, 5], [3, 4], 1),
    ("axis0_lead", [2, 3, 4], [2], 0),
    ("trailing_np", [2, 3, 4], [4], -1),
    ("axis1_with_ones", [2, 3, 4], [3, 1], 1),
    ("scalar_y", [2, 3], [1], -1),
    ("both_broadcast", [2, 1, 4], [3, 1], -1),
    ("same_rank_ones", [2, 3, 4], [1, 3, 1], -1),
    ("axis_eq_last", [2, 3, 4], [4], 2),
]


def ew_ref(fn):
    def ref(ins, attrs):
        return {"Out": fn(ins["X"], paddle_broadcast(ins["X"], ins["Y"], attrs["axis"]))}
    return ref


for _t, _fn in EW_REFS.items():
    for _name, _xs, _ys, _axis in EW_SHAPES:
        if _t in ("elementwise_max", "elementwise_min"):
            # shift Y so X and Y never tie (the subgradient at a tie is a convention)
            _x, _y = distinct(*_xs), distinct(*_ys) + 0.003
        elif _t == "elementwise_pow":
            _x, _y = pos(*_xs), rn(*_ys)
        elif _t == "elementwise_div":
            _x, _y = rn(*_xs), away(*_ys, gap=0.5)
        else:
            _x, _y = rn(*_xs), rn(*_ys)
        case(_t, {"X": _x, "Y": _y}, ew_ref(_fn), {"axis": _axis}, _name)


# --- matrix products ------------------------------------------------------------------------

def _mul_ref(ins, attrs):
    x, y = ins["X"], ins["Y"]
    xn, yn = attrs["x_num_col_dims"], attrs["y_num_col_dims"]
    # contract X's trailing dims (from xn) against Y's leading dims (up to yn)
    x3 = x.reshape(list(x.shape[:xn]) + [-1])
    y3 = y.reshape([-1] + list(y.shape[yn:]))
    return {"Out": torch.tensordot(x3, y3, dims=1)}


case("mul", {"X": rn(4, 3), "Y": rn(3, 5)}, _mul_ref, name="2d")
case("mul", {"X": rn(2, 3, 4), "Y": rn(12, 5)}, _mul_ref, name="flatten_x")
case("mul", {"X": rn(2, 3, 4), "Y": rn(4, 5)}, _mul_ref, {"x_num_col_dims": 2}, "x_cols2")
case("mul", {"X": rn(4, 6), "Y": rn(2, 3, 5)}, _mul_ref, {"y_num_col_dims": 2}, "y_cols2")
case("mul", {"X": rn(2, 3, 4), "Y": rn(3, 4, 2, 5)}, _mul_ref,
     {"x_num_col_dims": 1, "y_num_col_dims": 2}, "keep_y_tail")


def _matmul_ref(ins, attrs):
    x, y = ins["X"], ins["Y"]
    if attrs["transpose_X"] and x.dim() >= 2:
        x = x.transpose(-1, -2)
    if attrs["transpose_Y"] and y.dim() >= 2:
        y = y.transpose(-1, -2)
    return {"Out": attrs["alpha"] * (x @ y)}


for _name, _xs, _ys, _attrs in [
    ("plain", [3, 4], [4, 5], {}),
    ("tx", [4, 3], [4, 5], {"transpose_X": True}),
    ("ty", [3, 4], [5, 4], {"transpose_Y": True}),
    ("txty_alpha", [4, 3], [5, 4], {"transpose_X": True, "transpose_Y": True, "alpha": 2.5}),
    ("batched", [2, 3, 4], [2, 4, 5], {}),
    ("batched_ty", [2, 3, 4], [2, 5, 4], {"transpose_Y": True}),
    ("bcast_y", [2, 3, 4], [4, 5], {"alpha": -0.5}),
    ("bcast_x_ty", [3, 4], [2, 5, 4], {"transpose_Y": True}),
    ("bcast_batch", [2, 1, 3, 4], [1, 3, 4, 2], {}),
    ("vec_mat", [4], [4, 5], {}),
    ("mat_vec", [3, 4], [4], {"alpha": 3.0}),
    ("vec_vec", [4], [4], {}),
]:
    case("matmul", {"X": rn(*_xs), "Y": rn(*_ys)}, _matmul_ref, _attrs, _name)


# --- scale, sum, mean, reductions -----------------------------------------------------------

def _scale_ref(ins, attrs):
    x, s, b = ins["X"], attrs["scale"], attrs["bias"]
    return {"Out": s * x + b if attrs["bias_after_scale"] else s * (x + b)}


case("scale", {"X": rn(3, 4)}, _scale_ref, {"scale": 2.5, "bias": -1.0}, "after")
case("scale", {"X": rn(3, 4)}, _scale_ref,
     {"scale": -3.0, "bias": 0.5, "bias_after_scale": False}, "before")
case("scale", {"X": rn(2, 3)}, _scale_ref, {}, "default")


def _sum_ref(ins, attrs):
    out = torch.zeros_like(ins["X"][0])
    for t in ins["X"]:
        out = out + t
    return {"Out": out}


case("sum", {"X": [rn(3, 4)]}, _sum_ref, name="one")
case("sum", {"X": [rn(3, 4), rn(3, 4)]}, _sum_ref, name="two")
case("sum", {"X": [rn(2, 3), rn(2, 3), rn(2, 3), rn(2, 3)]}, _sum_ref, name="four")

case("mean", {"X": rn(3, 4)}, lambda ins, a: {"Out": ins["X"].sum() / ins["X"].numel()})
case("mean", {"X": rn(2, 3, 5)}, lambda ins, a: {"Out": ins["X"].sum() / ins["X"].numel()},
     name="3d")


def _reduce_ref(kind):
    def ref(ins, attrs):
        x = ins["X"]
        dims = list(range(x.dim())) if attrs["reduce_all"] else \
            sorted(d % x.dim() for d in attrs["dim"])
        out = x
        for d in reversed(dims):
            if kind == "sum":
                out = out.sum(d, keepdim=True)
            elif kind == "mean":
                out = out.sum(d, keepdim=True) / x.shape[d]
            else:
                out = out.max(d, keepdim=True).values
        if not attrs["keep_dim"]:
            out = out.reshape([n for i, n in enumerate(x.shape) if i not in dims])
        return {"Out": out}
    return ref


for _kind in ("sum", "mean", "max"):
    for _name, _shape, _attrs in [
        ("default", [3, 4], {}),
        ("dim1", [2, 3, 4], {"dim": [1]}),
        ("dim_neg_keep", [2, 3, 4], {"dim": [-1], "keep_dim": True}),
        ("dims02", [2, 3, 4], {"dim": [0, 2]}),
        ("all", [2, 3, 4], {"reduce_all": True}),
        ("all_keep", [2, 3, 4], {"reduce_all": True, "keep_dim": True}),
    ]:
        case("reduce_" + _kind, {"X": distinct(*_shape)}, _reduce_ref(_kind), _attrs, _name)


# --- activations ----------------------------------------------------------------------------

_UNARY = {
    "relu": (away, lambda x: torch.where(x > 0, x, torch.zeros_like(x))),
    "sigmoid": (rn, lambda x: 1 / (1 + torch.exp(-x))),
    "tanh": (rn, lambda x: (torch.exp(x) - torch.exp(-x)) / (torch.exp(x) + torch.exp(-x))),
    "exp": (rn, lambda x: math.e ** x),
    "log": (pos, lambda x: torch.log2(x) * math.log(2)),
    "sqrt": (pos, lambda x: x ** 0.5),
    "square": (rn, lambda x: x * x),
    "abs": (away, lambda x: torch.where(x >= 0, x, -x)),
}

for _t, (_draw, _fn) in _UNARY.items():
    case(_t, {"X": _draw(3, 4)}, (lambda fn: lambda ins, a: {"Out": fn(ins["X"])})(_fn))
    case(_t, {"X": _draw(2, 3, 2)}, (lambda fn: lambda ins, a: {"Out": fn(ins["X"])})(_fn),
         name="3d")


def _gelu_ref(ins, attrs):
    x = ins["X"]
    if attrs["approximate"]:
        inner = math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)
        return {"Out": 0.5 * x * (1 + torch.tanh(inner))}
    return {"Out": 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))}


case("gelu", {"X": rn(3, 5)}, _gelu_ref, name="exact")
case("gelu", {"X": rn(3, 5)}, _gelu_ref, {"approximate": True}, "tanh")


def _softmax_ref(ins, attrs):
    x = ins["X"]
    e = torch.exp(x - x.max(attrs["axis"], keepdim=True).values)
    return {"Out": e / e.sum(attrs["axis"], keepdim=True)}


def _log_softmax_ref(ins, attrs):
    x = ins["X"]
    return {"Out": x - torch.logsumexp(x, attrs["axis"], keepdim=True)}


for _axis in (-1, 0, 1):
    case("softmax", {"X": rn(2, 3, 4)}, _softmax_ref, {"axis": _axis}, f"axis{_axis}")
    case("log_softmax", {"X": rn(2, 3, 4)}, _log_softmax_ref, {"axis": _axis}, f"axis{_axis}")
case("softmax", {"X": rn(4, 5)}, _softmax_ref, name="default")
case("log_softmax", {"X": rn(4, 5)}, _log_softmax_ref, name="default")


# --- nn -------------------------------------------------------------------------------------

def _two(v):
    return tuple(v) * 2 if len(v) == 1 else tuple(v)


def _conv_ref(ins, attrs):
    return {"Output": F.conv2d(ins["Input"], ins["Filter"], bias=None,
                               stride=_two(attrs["strides"]), padding=_two(attrs["paddings"]),
                               dilation=_two(attrs["dilations"]), groups=attrs["groups"])}


for _name, _xs, _ws, _attrs in [
    ("plain", [2, 3, 6, 6], [4, 3, 3, 3], {}),
    ("stride2_pad1", [2, 3, 7, 7], [4, 3, 3, 3], {"strides": [2, 2], "paddings": [1, 1]}),
    ("asym", [1, 2, 6, 5], [3, 2, 3, 2], {"strides": [1, 2], "paddings": [1, 0]}),
    ("dilation2", [2, 2, 7, 7], [3, 2, 3, 3], {"dilations": [2, 2], "paddings": [2, 2]}),
    ("groups2", [2, 4, 5, 5], [6, 2, 3, 3], {"groups": 2, "paddings": [1, 1]}),
    ("depthwise", [1, 3, 5, 5], [3, 1, 3, 3], {"groups": 3}),
    ("single_int_lists", [1, 2, 6, 6], [2, 2, 2, 2], {"strides": [2], "paddings": [1]}),
]:
    case("conv2d", {"Input": rn(*_xs), "Filter": rn(*_ws)}, _conv_ref, _attrs, _name)


def _bn_ref(ins, attrs):
    x, w, b = ins["X"], ins["Scale"], ins["Bias"]
    rm, rv = ins["Mean"], ins["Variance"]
    shape = [1, -1] + [1] * (x.dim() - 2)
    dims = [0] + list(range(2, x.dim()))
    m, eps = attrs["momentum"], attrs["epsilon"]
    if attrs["is_test"] or attrs["use_global_stats"]:
        y = (x - rm.reshape(shape)) / torch.sqrt(rv.reshape(shape) + eps)
        return {"Y": y * w.reshape(shape) + b.reshape(shape), "MeanOut": rm, "VarianceOut": rv}
    n = x.numel() // x.shape[1]
    mean = x.sum(dims) / n
    var = ((x - mean.reshape(shape)) ** 2).sum(dims) / n       # biased: normalises Y
    y = (x - mean.reshape(shape)) / torch.sqrt(var.reshape(shape) + eps)
    mean_d, var_d = mean.detach(), var.detach()
    return {
        "Y": y * w.reshape(shape) + b.reshape(shape),
        # Paddle's convention: running = momentum * running + (1 - momentum) * batch,
        # with the unbiased variance for the running estimate (as torch does)
        "MeanOut": m * rm + (1 - m) * mean_d,
        "VarianceOut": m * rv + (1 - m) * var_d * n / (n - 1),
        "SavedMean": mean_d,
        "SavedVariance": 1 / torch.sqrt(var_d + eps),   # Paddle keeps the inverse std
    }


def _bn_inputs(shape):
    c = shape[1]
    return {"X": rn(*shape) * 2 + 0.5, "Scale": pos(c), "Bias": rn(c), "Mean": rn(c) * 0.1,
            "Variance": pos(c)}


case("batch_norm", _bn_inputs([4, 3, 2, 3]), _bn_ref, name="train_nchw")
case("batch_norm", _bn_inputs([6, 4]), _bn_ref, {"momentum": 0.7, "epsilon": 1e-3},
     "train_2d")
case("batch_norm", _bn_inputs([3, 2, 4, 4]), _bn_ref, {"is_test": True}, "is_test",
     unchecked=("SavedMean", "SavedVariance"))
case("batch_norm", _bn_inputs([3, 2, 3, 3]), _bn_ref, {"use_global_stats": True},
     "global_stats", unchecked=("SavedMean", "SavedVariance"))


def _pool_ref(ins, attrs):
    """Naive pooling with Paddle's semantics, one output cell at a time.

    A window covers rows [i*s - p, i*s - p + k) clipped to the input; max takes
    the largest value in it, ``exclusive`` avg divides by the clipped window's
    size, non-exclusive avg by the full kernel area (padding counts as zeros).
    """
    x = ins["X"]
    h, w = x.shape[2:]
    if attrs["global_pooling"]:
        k, s, p = [h, w], [1, 1], [0, 0]
    else:
        k, s, p = _two(attrs["ksize"]), _two(attrs["strides"]), _two(attrs["paddings"])

    def out_size(n, k, s, p):
        span = n + 2 * p - k
        return (span + s - 1) // s + 1 if attrs["ceil_mode"] else span // s + 1

    oh, ow = out_size(h, k[0], s[0], p[0]), out_size(w, k[1], s[1], p[1])
    rows = []
    for i in range(oh):
        r0 = i * s[0] - p[0]
        r1 = min(r0 + k[0], h)
        r0 = max(r0, 0)
        cells = []
        for j in range(ow):
            c0 = j * s[1] - p[1]
            c1 = min(c0 + k[1], w)
            c0 = max(c0, 0)
            win = x[:, :, r0:r1, c0:c1].reshape(x.shape[0], x.shape[1], -1)
            if attrs["pooling_type"] == "max":
                cells.append(win.max(-1).values)
            elif attrs["exclusive"]:
                cells.append(win.sum(-1) / win.shape[-1])
            else:
                cells.append(win.sum(-1) / (k[0] * k[1]))
        rows.append(torch.stack(cells, -1))
    return {"Out": torch.stack(rows, -2)}


for _name, _shape, _attrs in [
    ("max_k2s2", [2, 3, 4, 4], {"ksize": [2, 2], "strides": [2, 2]}),
    ("max_k3s1p1", [1, 2, 5, 5], {"ksize": [3, 3], "strides": [1, 1], "paddings": [1, 1]}),
    ("max_rect", [1, 2, 6, 5], {"ksize": [3, 2], "strides": [2, 1]}),
    ("avg_k2s2", [2, 3, 4, 4], {"pooling_type": "avg", "ksize": [2, 2], "strides": [2, 2]}),
    ("avg_excl_pad", [1, 2, 5, 5],
     {"pooling_type": "avg", "ksize": [3, 3], "strides": [2, 2], "paddings": [1, 1]}),
    ("avg_incl_pad", [1, 2, 5, 5],
     {"pooling_type": "avg", "ksize": [3, 3], "strides": [2, 2], "paddings": [1, 1],
      "exclusive": False}),
    ("global_max", [2, 3, 3, 4], {"global_pooling": True, "ksize": [1, 1]}),
    ("global_avg", [2, 3, 3, 4], {"global_pooling": True, "pooling_type": "avg"}),
    ("max_ceil", [1, 2, 5, 5], {"ksize": [2, 2], "strides": [2, 2], "ceil_mode": True}),
    ("avg_ceil_excl", [1, 2, 5, 5],
     {"pooling_type": "avg", "ksize": [2, 2], "strides": [2, 2], "ceil_mode": True}),
    ("avg_ceil_incl", [1, 2, 5, 5],
     {"pooling_type": "avg", "ksize": [2, 2], "strides": [2, 2], "ceil_mode": True,
      "exclusive": False}),
    ("avg_ceil_pad_incl", [1, 1, 6, 6],
     {"pooling_type": "avg", "ksize": [3, 3], "strides": [2, 2], "paddings": [1, 1],
      "ceil_mode": True, "exclusive": False}),
]:
    case("pool2d", {"X": distinct(*_shape)}, _pool_ref, _attrs, _name)


def _ln_ref(ins, attrs):
    x, a = ins["X"], attrs["begin_norm_axis"]
    dims = list(range(a, x.dim()))
    n = math.prod(x.shape[a:])
    mean = x.sum(dims, keepdim=True) / n
    var = ((x - mean) ** 2).sum(dims, keepdim=True) / n
    y = (x - mean) / torch.sqrt(var + attrs["epsilon"])
    if ins.get("Scale") is not None:
        y = y * ins["Scale"].reshape(x.shape[a:])
    if ins.get("Bias") is not None:
        y = y + ins["Bias"].reshape(x.shape[a:])
    return {"Y": y}


case("layer_norm", {"X": rn(2, 3, 4), "Scale": pos(12), "Bias": rn(12)}, _ln_ref,
     name="scale_bias")
case("layer_norm", {"X": rn(2, 3, 4), "Scale": pos(4), "Bias": None}, _ln_ref,
     {"begin_norm_axis": 2, "epsilon": 1e-3}, "axis2_scale_only")
case("layer_norm", {"X": rn(2, 3, 4), "Scale": None, "Bias": rn(4)}, _ln_ref,
     {"begin_norm_axis": 2}, "bias_only")
case("layer_norm", {"X": rn(3, 5), "Scale": None, "Bias": None}, _ln_ref, name="plain")
case("layer_norm", {"X": rn(2, 3, 4), "Scale": pos(24), "Bias": rn(24)}, _ln_ref,
     {"begin_norm_axis": 0}, "axis0")


def _lookup_ref(ins, attrs):
    w, ids, pad = ins["W"], ins["Ids"], attrs["padding_idx"]
    if pad >= 0:
        # the padding row is looked up but receives no gradient
        is_pad = (torch.arange(w.shape[0]) == pad).unsqueeze(1)
        w = torch.where(is_pad, w.detach(), w)
    rows = w.index_select(0, ids.reshape(-1))
    return {"Out": rows.reshape(list(ids.shape) + [w.shape[1]])}


case("lookup_table", {"W": rn(10, 4), "Ids": torch.tensor([1, 3, 3, 0, 9])}, _lookup_ref,
     name="1d_repeat")
case("lookup_table", {"W": rn(10, 4), "Ids": torch.tensor([[2, 5], [2, 7], [0, 2]])},
     _lookup_ref, {"padding_idx": 2}, "padding")
case("lookup_table", {"W": rn(6, 3), "Ids": ints(6, 4, 1)}, _lookup_ref, name="nx1")


# --- losses ---------------------------------------------------------------------------------

def _ce_ref(ins, attrs, x_key="X", out_key="Y", logits=False, axis=-1):
    x, label = ins[x_key], ins["Label"]
    axis = axis % x.dim()
    logp = x - torch.logsumexp(x, axis, keepdim=True) if logits else torch.log(x)
    if attrs["soft_label"]:
        loss = -(label * logp).sum(axis, keepdim=True)
    else:
        lab = label if label.dim() == x.dim() else label.unsqueeze(axis)
        classes = torch.arange(x.shape[axis]).reshape(
            [-1 if d == axis else 1 for d in range(x.dim())])
        one_hot = (classes == lab).to(x.dtype)
        keep = (lab != attrs["ignore_index"]).to(x.dtype)
        loss = -(one_hot * logp).sum(axis, keepdim=True) * keep
    out = {out_key: loss}
    if logits:
        out["Softmax"] = torch.exp(logp).detach()
    return out


def _swce_ref(ins, attrs):
    return _ce_ref(ins, attrs, "Logits", "Loss", logits=True, axis=attrs["axis"])


case("cross_entropy", {"X": probs(5, 4), "Label": ints(4, 5, 1)}, _ce_ref, name="hard")
case("cross_entropy", {"X": probs(5, 4), "Label": ints(4, 5)}, _ce_ref, name="hard_1d")
case("cross_entropy", {"X": probs(6, 3), "Label": torch.tensor([[0], [2], [1], [2], [0], [1]])},
     _ce_ref, {"ignore_index": 2}, "ignore")
case("cross_entropy", {"X": probs(5, 4), "Label": probs(5, 4)}, _ce_ref, {"soft_label": True},
     "soft")
case("cross_entropy", {"X": probs(2, 3, 4), "Label": ints(4, 2, 3, 1)}, _ce_ref, name="hard_3d")
case("softmax_with_cross_entropy", {"Logits": rn(5, 4) * 3, "Label": ints(4, 5, 1)}, _swce_ref,
     name="hard")
case("softmax_with_cross_entropy",
     {"Logits": rn(6, 3), "Label": torch.tensor([[0], [1], [1], [2], [1], [0]])}, _swce_ref,
     {"ignore_index": 1}, "ignore")
case("softmax_with_cross_entropy", {"Logits": rn(5, 4), "Label": probs(5, 4)}, _swce_ref,
     {"soft_label": True}, "soft")
case("softmax_with_cross_entropy", {"Logits": rn(2, 4, 3), "Label": ints(4, 2, 1, 3)}, _swce_ref,
     {"axis": 1}, "hard_axis1")
case("softmax_with_cross_entropy", {"Logits": rn(2, 3, 4), "Label": ints(4, 2, 3, 1)}, _swce_ref,
     {"axis": -1}, "hard_3d_last")
case("softmax_with_cross_entropy",
     {"Logits": rn(2, 4, 3), "Label": torch.softmax(rn(2, 4, 3), dim=1)}, _swce_ref,
     {"axis": 1, "soft_label": True}, "soft_axis1")


def _sec_ref(ins, attrs):
    d = ins["X"] - ins["Y"]
    return {"Out": d ** 2}


case("square_error_cost", {"X": rn(5, 1), "Y": rn(5, 1)}, _sec_ref)
case("square_error_cost", {"X": rn(3, 4), "Y": rn(3, 4)}, _sec_ref, name="2d")


# --- shape ops ------------------------------------------------------------------------------

def _reshape_to(shape):
    return lambda ins, attrs: {"Out": ins["X"].reshape(shape)}


case("reshape", {"X": rn(2, 3, 4)}, _reshape_to([2, 12]), {"shape": [0, -1]}, "zero_minus1")
case("reshape", {"X": rn(2, 3, 4)}, _reshape_to([4, 3, 2]), {"shape": [4, 0, -1]}, "zero_mid")
case("reshape", {"X": rn(6, 4)}, _reshape_to([3, 2, 4]), {"shape": [-1, 2, 4]}, "minus1_first")
case("reshape", {"X": rn(2, 3)}, _reshape_to([6]), {"shape": [6]}, "flat")


def _flatten_ref(ins, attrs):
    x, a = ins["X"], attrs["axis"]
    return {"Out": x.reshape(math.prod(x.shape[:a]), math.prod(x.shape[a:]))}


for _axis in (0, 1, 2, 3):
    case("flatten", {"X": rn(2, 3, 2, 2)}, _flatten_ref, {"axis": _axis}, f"axis{_axis}")


for _perm in ([1, 0, 2], [2, 0, 1], [0, 1, 2]):
    case("transpose", {"X": rn(2, 3, 4)},
         (lambda perm: lambda ins, a: {"Out": ins["X"].permute(*perm)})(_perm),
         {"axis": _perm}, "".join(map(str, _perm)))
case("transpose", {"X": rn(3, 5)}, lambda ins, a: {"Out": ins["X"].t()}, {"axis": [1, 0]}, "2d")


def _concat_ref(ins, attrs):
    return {"Out": torch.cat(list(ins["X"]), attrs["axis"])}


case("concat", {"X": [rn(2, 3), rn(1, 3)]}, _concat_ref, name="axis0")
case("concat", {"X": [rn(2, 3, 2), rn(2, 1, 2), rn(2, 4, 2)]}, _concat_ref, {"axis": 1}, "axis1")
case("concat", {"X": [rn(2, 3), rn(2, 2)]}, _concat_ref, {"axis": -1}, "axis_neg")


def _split_ref(ins, attrs):
    x, axis = ins["X"], attrs["axis"]
    n = x.shape[axis]
    sizes = list(attrs["sections"]) or [n // attrs["num"]] * attrs["num"]
    if -1 in sizes:
        sizes[sizes.index(-1)] = n - (sum(sizes) + 1)
    outs, start = [], 0
    for s in sizes:
        outs.append(x.narrow(axis, start, s))
        start += s
    return {"Out": outs}


case("split", {"X": rn(2, 4, 3)}, _split_ref, {"num": 2, "axis": 1}, "num2")
case("split", {"X": rn(6, 2)}, _split_ref, {"num": 3}, "num3_axis0")
case("split", {"X": rn(2, 3, 5)}, _split_ref, {"sections": [1, 3, 1], "axis": 2}, "sections")
case("split", {"X": rn(2, 3, 5)}, _split_ref, {"sections": [2, -1], "axis": -1}, "sections_infer")


case("unsqueeze", {"X": rn(3, 4)}, _reshape_to([1, 3, 4]), {"axes": [0]}, "front")
case("unsqueeze", {"X": rn(3, 4)}, _reshape_to([1, 3, 1, 4]), {"axes": [0, 2]}, "two")
case("unsqueeze", {"X": rn(3, 4)}, _reshape_to([3, 4, 1]), {"axes": [-1]}, "neg")
case("squeeze", {"X": rn(1, 3, 1, 4)}, _reshape_to([3, 4]), {"axes": [0, 2]}, "two")
case("squeeze", {"X": rn(1, 3, 1, 4)}, _reshape_to([1, 3, 4]), {"axes": [-2]}, "neg")
case("squeeze", {"X": rn(1, 3, 1, 4)}, _reshape_to([3, 4]), {"axes": [-2, 0]}, "mixed_sign")
case("squeeze", {"X": rn(1, 3, 1)}, _reshape_to([3]), {"axes": [-1, -3]}, "two_neg")
case("squeeze", {"X": rn(1, 3, 1, 4)}, _reshape_to([3, 4]), {"axes": []}, "all")


# --- copies and constants -------------------------------------------------------------------

case("assign", {"X": rn(3, 4)}, lambda ins, a: {"Out": ins["X"] * 1})
# cast between float types is differentiable; float64 -> float32 is checked in test_ops
case("cast", {"X": rn(3, 4)}, lambda ins, a: {"Out": ins["X"] * 1}, {"out_dtype": "float64"},
     "f64_f64")
case("cast", {"X": ints(5, 2, 3)}, lambda ins, a: {"Out": ins["X"].double()},
     {"out_dtype": "float64"}, "int_to_f64", grad=False)
case("fill_constant", {}, lambda ins, a: {"Out": torch.ones(2, 3, dtype=F64) * 1.5},
     {"shape": [2, 3], "value": 1.5, "dtype": "float64"})
case("fill_constant", {}, lambda ins, a: {"Out": torch.ones(4, dtype=torch.int64) * 7},
     {"shape": [4], "value": 7.0, "dtype": "int64"}, "int")
case("fill_zeros_like", {"X": rn(3, 2)}, lambda ins, a: {"Out": ins["X"] * 0})
case("fill_zeros_like", {"X": ints(3, 4)}, lambda ins, a: {"Out": ins["X"] * 0}, name="int")
case("assign_value", {},
     lambda ins, a: {"Out": torch.tensor([[1.0, 2.5, -3.0], [0.0, 4.0, 6.25]], dtype=F64)},
     {"shape": [2, 3], "dtype": "float64", "values": [1.0, 2.5, -3.0, 0.0, 4.0, 6.25]})
case("assign_value", {}, lambda ins, a: {"Out": torch.tensor([3, -1], dtype=torch.int32)},
     {"shape": [2], "dtype": "int32", "values": [3, -1]}, "int32")
