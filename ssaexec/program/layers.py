"""Layers: functions that append ops (and parameters) to the default programs.

Each layer returns the ``VarDesc`` of its output. Parameters are named
``<layer>_<n>.w_0`` / ``.b_0`` and initialised in the startup program;
weights of ``fc`` are ``[in, out]`` as in Paddle's ``mul``.
"""

from ..core.errors import ProgramError
from . import initializer as init
from .desc import dtype_name
from .builder import append_op, create_parameter, create_persistable, default_main_program, \
    unique_name
from .distribute import PlaceableBlock
from .parallel_do import ParallelDo

__all__ = [
    "data", "fc", "conv2d", "batch_norm", "pool2d", "relu", "sigmoid", "tanh", "gelu",
    "softmax", "log_softmax", "dropout", "embedding", "layer_norm", "cross_entropy",
    "softmax_with_cross_entropy", "square_error_cost", "mean", "reduce_sum", "reduce_mean",
    "scale", "elementwise_add", "elementwise_sub", "elementwise_mul", "elementwise_div",
    "matmul", "reshape", "flatten", "transpose", "concat", "split", "cast", "assign",
    "fill_constant", "sums", "exp", "log", "sqrt", "square", "accuracy", "argmax", "argmin",
    "ParallelDo", "PlaceableBlock",
]


def _out(type, inputs, attrs=None, slot="Out", prefix=None, **kw):
    _, outs = append_op(type, inputs, attrs=attrs, prefix=prefix, **kw)
    return outs[slot][0]


def _act(x, act):
    if act is None:
        return x
    if act not in ("relu", "sigmoid", "tanh", "gelu", "softmax"):
        raise ProgramError(f"unknown activation {act!r}; use relu, sigmoid, tanh, gelu or softmax")
    return _out(act, {"X": x})


def data(name, shape, dtype="float32", stop_gradient=True):
    """Declare a fed input var; use -1 for the batch dimension."""
    main = default_main_program()
    return main.global_block().create_var(name, shape, dtype, is_data=True,
                                          stop_gradient=stop_gradient)


def _param(prefix, suffix, shape, dtype, attr, default):
    ini = attr if isinstance(attr, init.Initializer) else default
    return create_parameter(f"{prefix}.{suffix}", shape, dtype, ini)


def fc(input, size, num_flatten_dims=1, param_attr=None, bias_attr=None, act=None, name=None):
    """Fully connected: act(flatten(input) @ W + b) with W of shape [in, size].

    ``param_attr``/``bias_attr`` may be initialisers; ``bias_attr=False`` drops the bias.
    """
    prefix = name or unique_name("fc")
    if input.shape is None:
        raise ProgramError(f"fc: input {input.name!r} has no static shape")
    fan_in = 1
    for d in input.shape[num_flatten_dims:]:
        if d < 0:
            raise ProgramError(f"fc: input {input.name!r} shape {input.shape} has an unknown "
                               f"dimension after num_flatten_dims={num_flatten_dims}")
        fan_in *= d
    w = _param(prefix, "w_0", [fan_in, size], input.dtype, param_attr, init.Xavier())
    out = _out("mul", {"X": input, "Y": w},
               {"x_num_col_dims": num_flatten_dims, "y_num_col_dims": 1}, prefix=prefix)
    if bias_attr is not False:
        b = _param(prefix, "b_0", [size], input.dtype, bias_attr, init.Constant(0.0))
        out = _out("elementwise_add", {"X": out, "Y": b}, {"axis": num_flatten_dims},
                   prefix=prefix)
    return _act(out, act)


def _pair(v):
    return [v, v] if isinstance(v, int) else list(v)


def conv2d(input, num_filters, filter_size, stride=1, padding=0, dilation=1, groups=1,
           param_attr=None, bias_attr=None, act=None, name=None):
    """2-D convolution (NCHW) with an optional per-channel bias and activation."""
    prefix = name or unique_name("conv2d")
    c_in = input.shape[1]
    if c_in < 0 or c_in % groups:
        raise ProgramError(f"conv2d: input channels {c_in} must be known and divisible by "
                           f"groups={groups}")
    k = _pair(filter_size)
    w = _param(prefix, "w_0", [num_filters, c_in // groups] + k, input.dtype, param_attr,
               init.MSRA())
    out = _out("conv2d", {"Input": input, "Filter": w},
               {"strides": _pair(stride), "paddings": _pair(padding),
                "dilations": _pair(dilation), "groups": groups}, slot="Output", prefix=prefix)
    if bias_attr is not False:
        b = _param(prefix, "b_0", [num_filters], input.dtype, bias_attr, init.Constant(0.0))
        out = _out("elementwise_add", {"X": out, "Y": b}, {"axis": 1}, prefix=prefix)
    return _act(out, act)


def batch_norm(input, act=None, momentum=0.9, epsilon=1e-5, is_test=False, param_attr=None,
               bias_attr=None, name=None):
    """Batch normalisation over the channel dim with learnt scale/shift and running stats."""
    prefix = name or unique_name("batch_norm")
    c = input.shape[1]
    scale = _param(prefix, "w_0", [c], input.dtype, param_attr, init.Constant(1.0))
    bias = _param(prefix, "b_0", [c], input.dtype, bias_attr, init.Constant(0.0))
    mean = create_persistable(f"{prefix}.w_1", [c], input.dtype, init.Constant(0.0))
    var = create_persistable(f"{prefix}.w_2", [c], input.dtype, init.Constant(1.0))
    _, outs = append_op("batch_norm",
                        {"X": input, "Scale": scale, "Bias": bias, "Mean": mean,
                         "Variance": var},
                        outputs={"MeanOut": mean, "VarianceOut": var},
                        attrs={"momentum": momentum, "epsilon": epsilon, "is_test": is_test},
                        prefix=prefix)
    return _act(outs["Y"][0], act)


def pool2d(input, pool_size=2, pool_type="max", pool_stride=1, pool_padding=0,
           global_pooling=False, ceil_mode=False, exclusive=True, name=None):
    """Max or average pooling (NCHW); ``global_pooling`` pools each channel to 1x1."""
    return _out("pool2d", {"X": input},
                {"pooling_type": pool_type, "ksize": _pair(pool_size),
                 "strides": _pair(pool_stride), "paddings": _pair(pool_padding),
                 "global_pooling": global_pooling, "ceil_mode": ceil_mode,
                 "exclusive": exclusive}, prefix=name)


def relu(x, name=None):
    """max(x, 0)."""
    return _out("relu", {"X": x}, prefix=name)


def sigmoid(x, name=None):
    """1 / (1 + exp(-x))."""
    return _out("sigmoid", {"X": x}, prefix=name)


def tanh(x, name=None):
    """tanh(x)."""
    return _out("tanh", {"X": x}, prefix=name)


def exp(x, name=None):
    """exp(x)."""
    return _out("exp", {"X": x}, prefix=name)


def log(x, name=None):
    """log(x)."""
    return _out("log", {"X": x}, prefix=name)


def sqrt(x, name=None):
    """sqrt(x)."""
    return _out("sqrt", {"X": x}, prefix=name)


def square(x, name=None):
    """x * x."""
    return _out("square", {"X": x}, prefix=name)


def gelu(x, approximate=False, name=None):
    """GELU activation."""
    return _out("gelu", {"X": x}, {"approximate": approximate}, prefix=name)


def softmax(input, axis=-1, name=None):
    """softmax along ``axis``."""
    return _out("softmax", {"X": input}, {"axis": axis}, prefix=name)


def log_softmax(input, axis=-1, name=None):
    """log softmax along ``axis``."""
    return _out("log_softmax", {"X": input}, {"axis": axis}, prefix=name)


def dropout(x, dropout_prob, is_test=False, seed=None, name=None):
    """Zero elements with probability ``dropout_prob`` and rescale; ``seed`` fixes the mask."""
    return _out("dropout", {"X": x},
                {"dropout_prob": float(dropout_prob), "is_test": is_test, "seed": seed or 0},
                prefix=name)


def embedding(input, size, is_sparse=False, padding_idx=None, param_attr=None,
              dtype="float32", name=None):
    """Look up rows of a [vocab, dim] table (``size``) by the int64 ids in ``input``.

    ``is_sparse``: the table's gradient holds only the rows the batch touched
    (``ssaexec.ops.sparse``, docs/blocks.md).
    """
    prefix = name or unique_name("embedding")
    w = _param(prefix, "w_0", list(size), dtype, param_attr, init.Xavier())
    attrs = {"padding_idx": -1 if padding_idx is None else padding_idx}
    if is_sparse:
        attrs["is_sparse"] = True
    return _out("lookup_table", {"W": w, "Ids": input}, attrs, prefix=prefix)


def layer_norm(input, begin_norm_axis=1, epsilon=1e-5, scale=True, shift=True, name=None):
    """Normalise over dims from ``begin_norm_axis`` on, with learnt scale and shift."""
    prefix = name or unique_name("layer_norm")
    n = 1
    for d in input.shape[begin_norm_axis:]:
        n *= d
    ins = {"X": input}
    if scale:
        ins["Scale"] = _param(prefix, "w_0", [n], input.dtype, None, init.Constant(1.0))
    if shift:
        ins["Bias"] = _param(prefix, "b_0", [n], input.dtype, None, init.Constant(0.0))
    return _out("layer_norm", ins, {"begin_norm_axis": begin_norm_axis, "epsilon": epsilon},
                slot="Y", prefix=prefix)


def cross_entropy(input, label, soft_label=False, ignore_index=-100):
    """Per-sample -log(input[label]) for probabilities ``input``; shape [N, 1]."""
    return _out("cross_entropy", {"X": input, "Label": label},
                {"soft_label": soft_label, "ignore_index": ignore_index}, slot="Y")


def softmax_with_cross_entropy(logits, label, soft_label=False, ignore_index=-100,
                               return_softmax=False):
    """Per-sample cross entropy of softmax(logits); optionally also the softmax."""
    _, outs = append_op("softmax_with_cross_entropy", {"Logits": logits, "Label": label},
                        attrs={"soft_label": soft_label, "ignore_index": ignore_index})
    if return_softmax:
        return outs["Loss"][0], outs["Softmax"][0]
    return outs["Loss"][0]


def square_error_cost(input, label):
    """(input - label) ** 2."""
    return _out("square_error_cost", {"X": input, "Y": label})


def mean(x, name=None):
    """Mean of all elements (a scalar)."""
    return _out("mean", {"X": x}, prefix=name)


def _reduce(type, input, dim, keep_dim):
    attrs = {"keep_dim": keep_dim}
    if dim is None:
        attrs.update(reduce_all=True, dim=[0])
    else:
        attrs["dim"] = [dim] if isinstance(dim, int) else list(dim)
    return _out(type, {"X": input}, attrs)


def reduce_sum(input, dim=None, keep_dim=False):
    """Sum over ``dim`` (all dims when None)."""
    return _reduce("reduce_sum", input, dim, keep_dim)


def reduce_mean(input, dim=None, keep_dim=False):
    """Mean over ``dim`` (all dims when None)."""
    return _reduce("reduce_mean", input, dim, keep_dim)


def scale(x, scale=1.0, bias=0.0, bias_after_scale=True):
    """scale * x + bias."""
    return _out("scale", {"X": x}, {"scale": float(scale), "bias": float(bias),
                                    "bias_after_scale": bias_after_scale})


def _ew(type, x, y, axis, act):
    return _act(_out(type, {"X": x, "Y": y}, {"axis": axis}), act)


def elementwise_add(x, y, axis=-1, act=None):
    """x + y with Paddle broadcasting along ``axis``."""
    return _ew("elementwise_add", x, y, axis, act)


def elementwise_sub(x, y, axis=-1, act=None):
    """x - y with Paddle broadcasting along ``axis``."""
    return _ew("elementwise_sub", x, y, axis, act)


def elementwise_mul(x, y, axis=-1, act=None):
    """x * y with Paddle broadcasting along ``axis``."""
    return _ew("elementwise_mul", x, y, axis, act)


def elementwise_div(x, y, axis=-1, act=None):
    """x / y with Paddle broadcasting along ``axis``."""
    return _ew("elementwise_div", x, y, axis, act)


def matmul(x, y, transpose_x=False, transpose_y=False, alpha=1.0):
    """alpha * op(x) @ op(y), batched."""
    return _out("matmul", {"X": x, "Y": y}, {"transpose_X": transpose_x,
                                             "transpose_Y": transpose_y, "alpha": float(alpha)})


def reshape(x, shape):
    """x with a new shape (0 copies the input dim, -1 is inferred)."""
    return _out("reshape", {"X": x}, {"shape": list(shape)})


def flatten(x, axis=1):
    """x as a 2-D matrix split at ``axis``."""
    return _out("flatten", {"X": x}, {"axis": axis})


def transpose(x, perm):
    """x with dims permuted."""
    return _out("transpose", {"X": x}, {"axis": list(perm)})


def concat(input, axis=0):
    """Join a list of vars along ``axis``."""
    return _out("concat", {"X": list(input)}, {"axis": axis})


def split(input, num_or_sections, dim=-1):
    """Cut ``input`` along ``dim`` into equal parts (int) or given sizes (list)."""
    if isinstance(num_or_sections, int):
        attrs, n = {"num": num_or_sections, "axis": dim}, num_or_sections
    else:
        attrs, n = {"sections": list(num_or_sections), "axis": dim}, len(num_or_sections)
    _, outs = append_op("split", {"X": input}, outputs={"Out": n}, attrs=attrs)
    return outs["Out"]


def cast(x, dtype):
    """x converted to ``dtype``."""
    return _out("cast", {"X": x}, {"out_dtype": dtype_name(dtype)})


def assign(input):
    """A copy of ``input``."""
    return _out("assign", {"X": input})


def fill_constant(shape, dtype, value):
    """A tensor of ``shape`` filled with ``value``."""
    return _out("fill_constant", {}, {"shape": list(shape), "dtype": dtype,
                                      "value": float(value)}, stop_gradient=True)


def sums(input):
    """Elementwise sum of a list of vars."""
    return _out("sum", {"X": list(input)})


def accuracy(input, label, k=1):
    """Fraction of rows of ``input`` (scores) whose ``label`` is among the top ``k``.

    Returns ``(accuracy, correct, total)``: a float32 scalar and two int64 counts (add
    the counts over batches for an exact epoch accuracy). No gradient flows through.
    """
    _, outs = append_op("accuracy", {"X": input, "Label": label}, attrs={"k": int(k)},
                        stop_gradient=True)
    return outs["Accuracy"][0], outs["Correct"][0], outs["Total"][0]


def argmax(x, axis=-1, keepdim=False):
    """Index of the largest value along ``axis`` (int64, no gradient)."""
    return _out("argmax", {"X": x}, {"axis": int(axis), "keepdim": bool(keepdim)},
                stop_gradient=True)


def argmin(x, axis=-1, keepdim=False):
    """Index of the smallest value along ``axis`` (int64, no gradient)."""
    return _out("argmin", {"X": x}, {"axis": int(axis), "keepdim": bool(keepdim)},
                stop_gradient=True)
