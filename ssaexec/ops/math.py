"""Math ops: matrix products, broadcasting elementwise ops, reductions, activations.

Elementwise ops follow Paddle's broadcasting rule: when ``axis`` is -1 the
shapes broadcast as in NumPy; otherwise ``Y``'s dimensions line up with ``X``'s
starting at ``axis``. Gradients reduce back to each operand's shape.
"""

import torch
import torch.nn.functional as F

from .guards_hand import kernel
from .registry import ShapeRule, get_op_def, register_grad, register_op
from .shape_rules import SAME_X, broadcast, number_class, wrap_axis

# checks its arguments (a broadcasting kernel), but hand-written ops take every ATen
# overload they call from the guard layer (ssaexec.ops.guards_hand.kernel), which decides
_THRESHOLD_BACKWARD = kernel("aten.threshold_backward.default")

_F = "float"


def _align_y(x, y, axis):
    """Reshape ``y`` so plain torch broadcasting gives Paddle's ``axis`` semantics."""
    if axis == -1 or y.dim() == x.dim():
        return y
    trailing = x.dim() - axis - y.dim()
    if axis < 0 or trailing < 0:  # (checked first: a huge axis would make a huge list)
        raise ValueError(f"axis={axis} does not fit X of rank {x.dim()} and Y of rank {y.dim()}")
    return y.reshape(list(y.shape) + [1] * trailing)


def _sum_to(g, shape):
    if tuple(g.shape) == tuple(shape):
        return g
    extra = g.dim() - len(shape)
    if extra > 0:
        g = g.sum(dim=tuple(range(extra)))
    return g.sum_to_size(shape)


_EW_ATTRS = {"axis": ("int", -1)}


def _aligned_y(x, y, axis):
    """``_align_y`` on shapes: the shape ``y`` broadcasts with."""
    if axis == -1 or len(y) == len(x):
        return y
    trailing = len(x) - axis - len(y)
    if axis < 0 or trailing < 0:
        raise ValueError(f"axis={axis} does not fit X of rank {len(x)} and Y of rank {len(y)}")
    return list(y) + [1] * trailing


def _ew_shapes(ins, attrs):
    x, y = ins["X"][0], ins["Y"][0]
    return {"Out": broadcast(x, _aligned_y(x, y, attrs["axis"]))}


def _ew_canon(ins, attrs):
    # a 0-dim operand promotes differently: X, and Y as aligned, keep being 0-dim or not
    x, y = ins["X"][0], ins["Y"][0]
    return {"X": [1] if x else [], "Y": [1] if _aligned_y(x, y, attrs["axis"]) else []}, \
        {"axis": -1}


# shapes broadcast (Paddle's axis rule), dtypes promote as the kernel does
_EW_RULE = ShapeRule(_ew_shapes, _ew_canon)


def _elementwise(name, fn):
    def kernel(ins, attrs):
        x, y = ins["X"], ins["Y"]
        return {"Out": fn(x, _align_y(x, y, attrs["axis"]))}
    kernel.__doc__ = f"Out = {name[12:]}(X, Y), broadcasting Y along ``axis``."
    return register_op(name, ["X", "Y"], ["Out"], _EW_ATTRS, rule=_EW_RULE)(kernel)


_elementwise("elementwise_add", torch.add)
_elementwise("elementwise_sub", torch.sub)
_elementwise("elementwise_mul", torch.mul)
_elementwise("elementwise_div", torch.div)
_elementwise("elementwise_max", torch.maximum)
_elementwise("elementwise_min", torch.minimum)
_elementwise("elementwise_pow", torch.pow)


def _add_sub_grad(sign, fresh=True):
    def grad(ins, attrs, wanted):
        x, y, g = ins["X"], ins["Y"], ins["Out@GRAD"]
        out = {}
        if wanted.get("X@GRAD", [False])[0]:
            gx = _sum_to(g, x.shape)
            # never hand back Out@GRAD itself: X@GRAD and Y@GRAD are separate vars,
            # and an in-place all-reduce of one must not change the other (the
            # compiled path decides that on the graph instead: raw kernel, may_alias)
            out["X@GRAD"] = gx.clone() if fresh and gx is g else gx
        if wanted.get("Y@GRAD", [False])[0]:
            y_al = _align_y(x, y, attrs["axis"])
            gy = _sum_to(g, y_al.shape)
            if sign < 0:
                gy = -gy
            elif fresh and gy is g:
                gy = gy.clone()
            out["Y@GRAD"] = gy.reshape(y.shape)
        return out
    return grad


for _type, _sign in (("elementwise_add", 1), ("elementwise_sub", -1)):
    register_grad(_type, uses=["X", "Y"])(_add_sub_grad(_sign))
    _gdef = get_op_def(_type + "_grad")
    # a residual's gradient is Out@GRAD itself
    _gdef.may_alias = {"X@GRAD": ["Out@GRAD"], "Y@GRAD": ["Out@GRAD"]}
    _gdef.raw_kernel = _add_sub_grad(_sign, fresh=False)


def _flatten2(t, num_col_dims):
    rows = 1
    for d in t.shape[:num_col_dims]:
        rows *= d
    return t.reshape(rows, -1)


_MUL_ATTRS = {"x_num_col_dims": ("int", 1), "y_num_col_dims": ("int", 1)}


@register_op("mul", ["X", "Y"], ["Out"], _MUL_ATTRS)
def mul(ins, attrs):
    """Out = flatten(X) @ flatten(Y), Paddle's fully-connected product."""
    x, y = ins["X"], ins["Y"]
    xn, yn = attrs["x_num_col_dims"], attrs["y_num_col_dims"]
    out = _flatten2(x, xn) @ _flatten2(y, yn)
    return {"Out": out.reshape(list(x.shape[:xn]) + list(y.shape[yn:]))}


@register_grad("mul", uses=["X", "Y"])
def mul_grad(ins, attrs, wanted):
    x, y, g = ins["X"], ins["Y"], ins["Out@GRAD"]
    xn, yn = attrs["x_num_col_dims"], attrs["y_num_col_dims"]
    x2, y2 = _flatten2(x, xn), _flatten2(y, yn)
    g2 = g.reshape(x2.shape[0], y2.shape[1])
    out = {}
    if wanted.get("X@GRAD", [False])[0]:
        out["X@GRAD"] = (g2 @ y2.t()).reshape(x.shape)
    if wanted.get("Y@GRAD", [False])[0]:
        out["Y@GRAD"] = (x2.t() @ g2).reshape(y.shape)
    return out


_MATMUL_ATTRS = {"transpose_X": ("bool", False), "transpose_Y": ("bool", False),
                 "alpha": ("float", 1.0)}


def _t(a, flag):
    return a.transpose(-1, -2) if flag and a.dim() >= 2 else a


def _matmul_shapes(ins, attrs):
    x, y = list(ins["X"][0]), list(ins["Y"][0])
    if attrs["transpose_X"] and len(x) >= 2:
        x[-1], x[-2] = x[-2], x[-1]
    if attrs["transpose_Y"] and len(y) >= 2:
        y[-1], y[-2] = y[-2], y[-1]
    if not x or not y:
        raise RuntimeError("both arguments to matmul need to be at least 1D")
    if len(x) == 1 and len(y) == 1:
        if x != y:
            raise RuntimeError(f"inconsistent tensor size: {x} and {y}")
        return {"Out": []}
    xm = [1] + x if len(x) == 1 else x
    ym = y + [1] if len(y) == 1 else y
    if xm[-1] != ym[-2]:
        raise RuntimeError(f"size mismatch: {x} @ {y}")
    out = broadcast(xm[:-2], ym[:-2]) + [xm[-2], ym[-1]]
    if len(x) == 1:
        del out[-2]
    if len(y) == 1:
        del out[-1]
    return {"Out": out}


def _matmul_canon(ins, attrs):
    alpha = attrs["alpha"]
    return {s: [1] if len(ins[s][0]) == 1 else [1, 1] for s in ("X", "Y")}, {
        "transpose_X": False, "transpose_Y": False,
        "alpha": 1.0 if alpha == 1.0 else number_class(alpha, 2)}


@register_op("matmul", ["X", "Y"], ["Out"], _MATMUL_ATTRS,
             rule=ShapeRule(_matmul_shapes, _matmul_canon))
def matmul(ins, attrs):
    """Out = alpha * op(X) @ op(Y) with optional transposes; batched like torch.matmul."""
    out = torch.matmul(_t(ins["X"], attrs["transpose_X"]), _t(ins["Y"], attrs["transpose_Y"]))
    if attrs["alpha"] != 1.0:
        out = out * attrs["alpha"]
    return {"Out": out}


@register_grad("matmul", uses=["X", "Y"])
def matmul_grad(ins, attrs, wanted):
    x, y, g = ins["X"], ins["Y"], ins["Out@GRAD"]
    tx, ty = attrs["transpose_X"], attrs["transpose_Y"]
    if attrs["alpha"] != 1.0:
        g = g * attrs["alpha"]
    if x.dim() < 2 or y.dim() < 2:
        # vector cases: let autograd work out the shapes
        with torch.enable_grad():
            xr = x.detach().requires_grad_()
            yr = y.detach().requires_grad_()
            o = torch.matmul(_t(xr, tx), _t(yr, ty))
            gx, gy = torch.autograd.grad(o, (xr, yr), g)
        return {"X@GRAD": gx, "Y@GRAD": gy}
    a, b = _t(x, tx), _t(y, ty)
    out = {}
    if wanted.get("X@GRAD", [False])[0]:
        ga = torch.matmul(g, b.transpose(-1, -2))
        out["X@GRAD"] = _sum_to(_t(ga, tx), x.shape)
    if wanted.get("Y@GRAD", [False])[0]:
        gb = torch.matmul(a.transpose(-1, -2), g)
        out["Y@GRAD"] = _sum_to(_t(gb, ty), y.shape)
    return out


def _scale_canon(ins, attrs):
    # the result dtype follows the numbers' types (an int scale keeps an int X int)
    return {"X": [1] if ins["X"][0] else []}, {
        "scale": number_class(attrs["scale"], 1), "bias": number_class(attrs["bias"], 0),
        "bias_after_scale": attrs["bias_after_scale"]}


@register_op("scale", ["X"], ["Out"], {"scale": (_F, 1.0), "bias": (_F, 0.0),
                                        "bias_after_scale": ("bool", True)},
             rule=ShapeRule(SAME_X.shapes, _scale_canon))
def scale(ins, attrs):
    """Out = scale * X + bias (or scale * (X + bias))."""
    x, s, b = ins["X"], attrs["scale"], attrs["bias"]
    out = x * s + b if attrs["bias_after_scale"] else (x + b) * s
    return {"Out": out}


def _sum_shapes(ins, attrs):
    xs = [sh for sh, _ in ins["X"]]
    out = list(xs[0]) if len(xs) == 1 else broadcast(xs[0], xs[1])
    for t in xs[2:]:  # added in place: t must broadcast to the result's shape
        if broadcast(out, t) != out:
            raise RuntimeError(f"output with shape {out} doesn't match the broadcast shape "
                               f"{broadcast(out, t)}")
    return {"Out": out}


def _one_of(spec):
    return [1] if spec[0] else []


def _sum_canon(ins, attrs):
    # the first two make the result's dtype; each later one is added to it in place,
    # which refuses a dtype the result cannot hold: one run per distinct later input
    xs = ins["X"]
    head = [_one_of(s) for s in xs[:2]]
    runs = [({"X": head}, {}, {"X": xs[:2]})]
    for later in sorted({(tuple(_one_of(s)), s[1]) for s in xs[2:]}):
        runs.append(({"X": head + [list(later[0])]}, {}, {"X": xs[:2] + [(None, later[1])]}))
    return runs


@register_op("sum", ["X*"], ["Out"], rule=ShapeRule(_sum_shapes, _sum_canon))
def sum_(ins, attrs):
    """Out = X[0] + X[1] + ... (gradient accumulation)."""
    xs = ins["X"]
    out = xs[0].clone() if len(xs) == 1 else torch.add(xs[0], xs[1])
    for t in xs[2:]:
        out.add_(t)
    return {"Out": out}


@register_op("mean", ["X"], ["Out"], rule=ShapeRule(lambda ins, attrs: {"Out": []}))
def mean(ins, attrs):
    """Out = mean of all elements of X (a scalar of shape [])."""
    return {"Out": ins["X"].mean()}


_REDUCE_ATTRS = {"dim": ("ints", [0]), "keep_dim": ("bool", False), "reduce_all": ("bool", False)}


def _reduce_rule(no_identity):
    def shapes(ins, attrs):
        x = ins["X"][0]
        n = len(x)
        dims = [] if attrs["reduce_all"] else [wrap_axis(d, n) for d in attrs["dim"]]
        if len(set(dims)) != len(dims):
            raise RuntimeError("duplicate value in the list of dims")
        dims = set(dims or range(n))
        if no_identity and any(x[i] == 0 for i in dims if n):
            raise RuntimeError("reducing over zero-size dimension for reduction operation "
                               "without identity")
        keep = attrs["keep_dim"]
        return {"Out": [1 if i in dims else d for i, d in enumerate(x)] if keep else
                [d for i, d in enumerate(x) if i not in dims]}

    def canon(ins, attrs):
        return {"X": _one_of(ins["X"])}, {"dim": [0], "keep_dim": False,
                                          "reduce_all": attrs["reduce_all"]}
    return ShapeRule(shapes, canon)


def _reduce(name, fn):
    def kernel(ins, attrs):
        x = ins["X"]
        if attrs["reduce_all"]:
            out = fn(x)
            return {"Out": out.reshape([1] * x.dim()) if attrs["keep_dim"] else out}
        return {"Out": fn(x, dim=attrs["dim"], keepdim=attrs["keep_dim"])}
    kernel.__doc__ = f"Out = {name[7:]} of X over ``dim`` (or everything with ``reduce_all``)."
    return register_op(name, ["X"], ["Out"], _REDUCE_ATTRS,
                       rule=_reduce_rule(fn is torch.amax))(kernel)


_reduce("reduce_sum", torch.sum)
_reduce("reduce_mean", torch.mean)
_reduce("reduce_max", torch.amax)


def _unary(name, fn, doc):
    def kernel(ins, attrs):
        return {"Out": fn(ins["X"])}
    kernel.__doc__ = doc
    return register_op(name, ["X"], ["Out"], rule=SAME_X)(kernel)


_unary("relu", torch.relu, "Out = max(X, 0).")
_unary("sigmoid", torch.sigmoid, "Out = 1 / (1 + exp(-X)).")
_unary("tanh", torch.tanh, "Out = tanh(X).")
_unary("exp", torch.exp, "Out = exp(X).")
_unary("log", torch.log, "Out = log(X).")
_unary("sqrt", torch.sqrt, "Out = sqrt(X).")
_unary("square", torch.square, "Out = X * X.")
_unary("abs", torch.abs, "Out = |X|.")


@register_grad("relu", uses=["Out"])
def relu_grad(ins, attrs, wanted):
    return {"X@GRAD": _THRESHOLD_BACKWARD(ins["Out@GRAD"], ins["Out"], 0)}


@register_op("gelu", ["X"], ["Out"], {"approximate": ("bool", False)}, rule=SAME_X)
def gelu(ins, attrs):
    """Out = GELU(X), exact or tanh-approximated."""
    return {"Out": F.gelu(ins["X"], approximate="tanh" if attrs["approximate"] else "none")}


def _log_softmax_shapes(ins, attrs):
    x = ins["X"][0]
    wrap_axis(attrs["axis"], len(x))
    return {"Out": x}


def _axis_canon(ins, attrs):
    return {"X": [1] if ins["X"][0] else []}, {"axis": -1}


def _softmax_canon(ins, attrs):
    # torch's meta softmax checks no axis (any int that converts passes)
    return {"X": [1] if ins["X"][0] else []}, {"axis": number_class(attrs["axis"], -1, 2 ** 63)}


@register_op("softmax", ["X"], ["Out"], {"axis": ("int", -1)},
             rule=ShapeRule(SAME_X.shapes, _softmax_canon))
def softmax(ins, attrs):
    """Out = softmax(X) along ``axis``."""
    return {"Out": torch.softmax(ins["X"], attrs["axis"])}


@register_op("log_softmax", ["X"], ["Out"], {"axis": ("int", -1)},
             rule=ShapeRule(_log_softmax_shapes, _axis_canon))
def log_softmax(ins, attrs):
    """Out = log(softmax(X)) along ``axis``."""
    return {"Out": torch.log_softmax(ins["X"], attrs["axis"])}
