"""Guards for ATen kernels that trust their arguments: checks that run before the kernel.

Policy. A program file is untrusted data (docs/security.md), and the operator
policy (``ssaexec.ops.policy``) lets it name allowlisted ATen overloads. Many of
torch's kernels check their arguments; some trust them and read or write out of
bounds, crash, hang or allocate without limit when they are wrong. ``TRUSTS``
names every allowlisted overload whose kernel trusts something a program
controls, and what:

==========  ===========================================================================
``index``   the values of an index tensor (``max_pool2d_with_indices_backward``
            writes at its ``indices`` unchecked: a heap write anywhere)
``shape``   the shapes of secondary inputs, or which optional ones are present:
            statistics of the norm kernels, attention's ``out``/``logsumexp``,
            ``_embedding_bag``'s offsets, a backward's ``grad_output``
``layout``  strides: the kernel reads some inputs as if they were contiguous
``size``    how much it allocates, from numbers the program gives (factories,
            padding, upsampling, ``expand``, ``repeat``, a convolution's padding)
``value``   an integer argument that indexes host memory (an FFT's ``dim``) or
            a flag whose wrong value dereferences an absent tensor
==========  ===========================================================================

Each listed overload gets a guard, run before the kernel on both execution
paths: ``ssaexec.ops.aten`` resolves an ATen type to a ``GuardedOverload``
(``guarded``), which the generic kernel calls and the compiled path
(``runtime/codegen.py``) emits a call to, exactly as it would the bare
``OpOverload``. A guard raises ``ProgramError`` naming the op, the argument and
the bound; at run time the executor reports it as an ``OpError`` of that op. A
``layout`` guard instead hands the kernel contiguous copies of strided inputs
(same values; an input that is already contiguous is passed as is).

The table was found with the kernel fuzzer (``tests/kernel_fuzz.py``), which
drives every allowlisted overload with hostile values; ops not listed either
check for themselves on the CPU or were never seen to misbehave. Index checks
of ops whose CPU kernels check (``gather``, ``index`` ...) run only on other
devices, where torch's checks are device-side asserts that end the process's
CUDA context; each costs a host synchronisation there.

Invariants:

* a guard reads its arguments and either returns or raises; it changes no value;
* ``shape``, ``size`` and ``value`` checks work on meta tensors, so shape
  inference (``validate``) runs them and a program whose declared shapes break
  them fails validation with the same message; ``index`` checks read values,
  skip meta tensors and cost one ``aminmax`` per index tensor at run time;
* an op without a guard costs nothing: its ``OpOverload`` is called directly;
* a program ssaexec built in this process (``ProgramDesc.trusted``: ``from_torch``)
  calls the bare overload (``OpDef.bare_overload``/``bare_kernel``, chosen by
  ``OpDef.overload_for``/``kernel_for``); a program read from a file never does.
"""

import inspect
import math

import torch

from ..errors import ProgramError
from ..limits import get_limit, numel_problem

__all__ = ["TRUSTS", "GuardedOverload", "guarded"]

INDEX, SHAPE, LAYOUT, SIZE, VALUE = "index", "shape", "layout", "size", "value"

# op type -> (what its kernel trusts, the check in words); filled by @_guard below
TRUSTS = {}
_CHECKS = {}   # op type -> (check function, dense)


def _guard(*op_types, trusts, note, dense=False):
    """Register ``fn(op, <schema argument names>...)`` as the guard of ``op_types``.

    ``dense``: the kernel ignores strides, so every tensor argument is made
    contiguous before the check and the call; ``"rows"``: the kernel reads outer
    strides but assumes the last dimension is dense, so only a tensor whose last
    stride is not 1 is copied (a contiguous copy would change the layout of the
    results, which a later ``view`` of the program may rely on: attention's output
    is a transposed view in eager torch).
    """
    def deco(fn):
        for t in op_types:
            TRUSTS[t] = (tuple(trusts), note)
            _CHECKS[t] = (fn, dense)
        return fn
    return deco


class GuardedOverload:
    """An ATen ``OpOverload`` with its guard: called like it, checks before the kernel.

    Keeps ``_schema`` (and ``overload``, the bare one), so code that reads the
    schema of what it calls (``arg_kinds``, the compiled path) needs no change.
    """

    __slots__ = ("overload", "op_type", "_schema", "_check", "_picks", "_dense")

    def __init__(self, op_type, overload, check, dense):
        self.overload = overload
        self.op_type = op_type
        self._schema = overload._schema
        self._check = check
        self._dense = dense
        args = overload._schema.arguments
        index = {a.name: i for i, a in enumerate(args)}
        names = list(inspect.signature(check).parameters)[1:]
        # (position, name, default) of each argument the check reads
        self._picks = tuple((index[n], n, _default(args[index[n]])) for n in names)

    def __call__(self, *args, **kwargs):
        if self._dense:
            rows = self._dense == "rows"
            args = tuple(_dense(a, rows) for a in args)
            kwargs = {k: _dense(v, rows) for k, v in kwargs.items()}
        n = len(args)
        self._check(self.op_type, *[args[i] if i < n else kwargs.get(name, d)
                                    for i, name, d in self._picks])
        return self.overload(*args, **kwargs)

    def __repr__(self):
        return f"<guarded {self.op_type}>"


def guarded(op_type, overload):
    """``overload`` wrapped in its guard when ``TRUSTS`` lists ``op_type``, else ``overload``."""
    hit = _CHECKS.get(op_type)
    if hit is None:
        return overload
    return GuardedOverload(op_type, overload, *hit)


def _default(arg):
    return arg.default_value if arg.has_default_value() else None


def _dense(v, rows=False):
    if isinstance(v, torch.Tensor):
        if rows and (v.dim() == 0 or v.stride(-1) == 1 or v.shape[-1] <= 1):
            return v
        return v if v.is_contiguous() else v.contiguous()
    if isinstance(v, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in v):
        return type(v)(_dense(x, rows) for x in v)
    return v


# --- helpers ----------------------------------------------------------------------------------
def _fail(op, text):
    raise ProgramError(f"op {op!r}: {text}; its kernel does not check this "
                       "(ssaexec.ops.guards, docs/security.md)")


def _shape(t):
    return list(t.shape)


def _numel(op, shape_or_count, what):
    """Refuse an allocation of more than ``max_tensor_elements`` elements.

    A shape counts its 0 dims as 1: an empty tensor may not have a dimension of
    2**62 either (its strides overflow).
    """
    if isinstance(shape_or_count, (list, tuple)):
        if any(d < 0 for d in shape_or_count):
            return  # the kernel refuses negative sizes itself
        n = math.prod(max(d, 1) for d in shape_or_count)
    else:
        n = shape_or_count
    if n > get_limit("max_tensor_elements"):
        problem = numel_problem(n, what)
        raise ProgramError(f"op {op!r}: {problem}")


def _ints(v):
    return [v] if isinstance(v, int) else list(v or [])


def _same_shape(op, name, t, want, other="what it belongs to"):
    if t is not None and _shape(t) != list(want):
        _fail(op, f"argument {name!r} has shape {_shape(t)}, not {list(want)} ({other})")


def _count(op, name, t, n, what):
    if t is not None and t.numel() != n:
        _fail(op, f"argument {name!r} has {t.numel()} elements ({_shape(t)}), not {n} ({what})")


def _index_range(op, name, t, lo, hi, what, cpu_checks=False):
    """Values of index tensor ``t`` in ``[lo, hi)``: one ``aminmax`` (skips meta tensors)."""
    if not isinstance(t, torch.Tensor) or t.numel() == 0 or t.device.type == "meta":
        return
    if cpu_checks and t.device.type == "cpu":
        return  # the CPU kernel checks; elsewhere its check is a device-side assert
    if t.dtype in (torch.bool, torch.uint8) or t.dtype.is_floating_point or t.is_complex():
        return  # masks and non-index dtypes: the kernel refuses or checks them itself
    mn, mx = torch.aminmax(t)
    mn, mx = int(mn), int(mx)
    if mn < lo or mx >= hi:
        bad = mn if mn < lo else mx
        _fail(op, f"argument {name!r} holds {bad}, outside [{lo}, {hi}) ({what})")


def _dim(op, name, d, ndim):
    if not -max(ndim, 1) <= d < max(ndim, 1):
        _fail(op, f"argument {name!r} is {d}, not a dimension of a {ndim}-d tensor")
    return d % max(ndim, 1)


# --- index values -----------------------------------------------------------------------------
@_guard("aten.max_pool2d_with_indices_backward.default", trusts=[INDEX, SHAPE],
        note="indices in [0, H*W) of self's planes; indices and grad_output of one shape, "
             "grad_output's leading dims those of self")
def _max_pool2d_backward(op, grad_output, self, indices):
    if self.dim() not in (3, 4) or grad_output.dim() != self.dim():
        _fail(op, f"grad_output {_shape(grad_output)} and self {_shape(self)} must both be "
                  "3-d or 4-d")
    _same_shape(op, "indices", indices, grad_output.shape, "grad_output's shape")
    _same_shape(op, "grad_output", grad_output,
                _shape(self)[:-2] + _shape(grad_output)[-2:], "self's leading dimensions")
    plane = self.shape[-1] * self.shape[-2]
    _index_range(op, "indices", indices, 0, plane, f"positions in a {self.shape[-2]}x"
                 f"{self.shape[-1]} plane of self")


@_guard("aten.embedding_dense_backward.default", trusts=[INDEX, SIZE],
        note="indices in [0, num_weights); num_weights x embedding dim within the limit")
def _embedding_dense_backward(op, grad_output, indices, num_weights):
    if num_weights < 0:
        _fail(op, f"argument 'num_weights' is {num_weights}")
    dim = grad_output.shape[-1] if grad_output.dim() else 1
    _numel(op, [num_weights, dim], f"its result [{num_weights}, {dim}]")
    _index_range(op, "indices", indices, 0, num_weights, "rows of the weight")


@_guard("aten._embedding_bag.default", trusts=[INDEX, SHAPE, LAYOUT], dense=True,
        note="offsets 1-d, non-empty, non-decreasing, in [0, len(indices)]; indices 1-d in "
             "[0, rows of weight); per_sample_weights shaped like indices; mode 0, 1 or 2")
def _embedding_bag(op, weight, indices, offsets, mode, per_sample_weights,
                   include_last_offset):
    if weight.dim() != 2 or indices.dim() != 1 or offsets.dim() != 1:
        _fail(op, f"weight {_shape(weight)} must be 2-d, indices {_shape(indices)} and "
                  f"offsets {_shape(offsets)} 1-d")
    if mode not in (0, 1, 2):
        _fail(op, f"argument 'mode' is {mode}, not 0 (sum), 1 (mean) or 2 (max)")
    if offsets.numel() == 0:
        _fail(op, "argument 'offsets' is empty; it holds the start of each bag")
    _same_shape(op, "per_sample_weights", per_sample_weights, indices.shape, "indices' shape")
    _index_range(op, "indices", indices, 0, weight.shape[0], "rows of the weight")
    _index_range(op, "offsets", offsets, 0, indices.numel() + 1, "positions in indices")
    if offsets.device.type != "meta" and offsets.numel() > 1 and \
            bool((offsets[1:] < offsets[:-1]).any()):
        _fail(op, "argument 'offsets' decreases; bags are runs of indices, in order")


# Ops whose CPU kernels check their indices: checked elsewhere (device-side asserts).
@_guard("aten.gather.default", "aten.scatter.src", "aten.scatter.value",
        "aten.scatter_add.default", "aten.scatter_reduce.two", "aten.index_select.default",
        trusts=[INDEX],
        note="index in [0, size of self along dim) (off the CPU)")
def _scatter_gather(op, self, dim, index):
    if index.device.type in ("cpu", "meta"):
        return
    d = _dim(op, "dim", dim, self.dim())
    size = self.shape[d] if self.dim() else 1
    _index_range(op, "index", index, 0, size, f"positions along dim {dim}", cpu_checks=True)


@_guard("aten.embedding.default", trusts=[INDEX],
        note="indices in [0, rows of weight) (off the CPU)")
def _embedding(op, weight, indices):
    _index_range(op, "indices", indices, 0, weight.shape[0] if weight.dim() else 0,
                 "rows of the weight", cpu_checks=True)


@_guard("aten.index.Tensor", "aten._unsafe_index.Tensor", "aten.index_put.default",
        "aten._unsafe_index_put.default", trusts=[INDEX],
        note="each index tensor in [-size, size) of the dimension it indexes (off the CPU)")
def _index(op, self, indices):
    if all(t is None or t.device.type in ("cpu", "meta") for t in indices or []):
        return
    d = 0
    for k, t in enumerate(indices or []):
        if t is None:
            d += 1
            continue
        if t.dtype in (torch.bool, torch.uint8):
            d += t.dim()  # a mask covers as many dimensions as it has; the kernel checks it
            continue
        size = self.shape[d] if d < self.dim() else 0
        _index_range(op, f"indices[{k}]", t, -size, size, f"positions along dim {d}",
                     cpu_checks=True)
        d += 1


@_guard("aten.nll_loss_forward.default", "aten.nll_loss_backward.default", trusts=[INDEX],
        note="target in [0, classes) or ignore_index (off the CPU)")
def _nll_loss(op, self, target, ignore_index):
    if target.device.type in ("cpu", "meta") or target.numel() == 0:
        return
    classes = self.shape[-1] if self.dim() == 1 else self.shape[1] if self.dim() else 1
    valid = target[target != ignore_index]
    _index_range(op, "target", valid, 0, classes, "class numbers", cpu_checks=True)


# --- statistics and other secondary shapes ---------------------------------------------------
def _lead(op, input, normalized_shape):
    k = len(normalized_shape)
    if input.dim() < k or _shape(input)[input.dim() - k:] != list(normalized_shape):
        _fail(op, f"input {_shape(input)} does not end in normalized_shape "
                  f"{list(normalized_shape)}")
    return math.prod(_shape(input)[:input.dim() - k]), math.prod(normalized_shape)


@_guard("aten.native_layer_norm_backward.default", trusts=[SHAPE, LAYOUT], dense=True,
        note="grad_out shaped like input; mean and rstd one per normalised row; weight and "
             "bias shaped like normalized_shape")
def _layer_norm_backward(op, grad_out, input, normalized_shape, mean, rstd, weight, bias):
    rows, n = _lead(op, input, normalized_shape)
    _same_shape(op, "grad_out", grad_out, input.shape, "input's shape")
    _count(op, "mean", mean, rows, "one per normalised row of input")
    _count(op, "rstd", rstd, rows, "one per normalised row of input")
    _count(op, "weight", weight, n, "normalized_shape")
    _count(op, "bias", bias, n, "normalized_shape")


def _group_norm_sizes(op, input, N, C, HxW, group):
    if input.dim() < 2 or input.shape[0] != N or input.shape[1] != C or \
            input.numel() != N * C * HxW:
        _fail(op, f"input {_shape(input)} is not N={N} x C={C} x HxW={HxW}")
    if group <= 0 or C % group:
        _fail(op, f"argument 'group' is {group}, not a divisor of C={C}")


@_guard("aten.native_group_norm.default", trusts=[SHAPE],
        note="input N x C x HxW as given; weight and bias of C elements; group divides C")
def _group_norm(op, input, weight, bias, N, C, HxW, group):
    _group_norm_sizes(op, input, N, C, HxW, group)
    _count(op, "weight", weight, C, "one per channel")
    _count(op, "bias", bias, C, "one per channel")


@_guard("aten.native_group_norm_backward.default", trusts=[SHAPE, LAYOUT], dense=True,
        note="as native_group_norm, and grad_out shaped like input; mean and rstd N x group")
def _group_norm_backward(op, grad_out, input, mean, rstd, weight, N, C, HxW, group):
    _group_norm_sizes(op, input, N, C, HxW, group)
    _same_shape(op, "grad_out", grad_out, input.shape, "input's shape")
    _count(op, "mean", mean, N * group, "one per sample and group")
    _count(op, "rstd", rstd, N * group, "one per sample and group")
    _count(op, "weight", weight, C, "one per channel")


def _channels(op, input):
    if input.dim() < 2:
        _fail(op, f"input {_shape(input)} has no channel dimension (dim 1)")
    return input.shape[1]


@_guard("aten._native_batch_norm_legit_functional.default",
        "aten._native_batch_norm_legit_no_training.default", trusts=[SHAPE],
        note="weight, bias, running_mean and running_var of one element per channel")
def _batch_norm(op, input, weight, bias, running_mean, running_var):
    c = _channels(op, input)
    for name, t in (("weight", weight), ("bias", bias), ("running_mean", running_mean),
                    ("running_var", running_var)):
        _count(op, name, t, c, "one per channel of input")


@_guard("aten._native_batch_norm_legit.no_stats", trusts=[SHAPE, VALUE],
        note="weight and bias of one element per channel; training true (no running "
             "statistics to evaluate with)")
def _batch_norm_no_stats(op, input, weight, bias, training):
    c = _channels(op, input)
    _count(op, "weight", weight, c, "one per channel of input")
    _count(op, "bias", bias, c, "one per channel of input")
    if not training:
        _fail(op, "argument 'training' is false, but this overload has no running statistics "
                  "to normalise with")


@_guard("aten.native_batch_norm_backward.default", trusts=[SHAPE, LAYOUT, VALUE], dense=True,
        note="grad_out shaped like input; weight and the statistics the mode reads (save_* "
             "when train, running_* otherwise) present with one element per channel")
def _batch_norm_backward(op, grad_out, input, weight, running_mean, running_var, save_mean,
                         save_invstd, train):
    c = _channels(op, input)
    _same_shape(op, "grad_out", grad_out, input.shape, "input's shape")
    _count(op, "weight", weight, c, "one per channel of input")
    used = (("save_mean", save_mean), ("save_invstd", save_invstd)) if train else \
        (("running_mean", running_mean), ("running_var", running_var))
    for name, t in used:
        if t is None:
            _fail(op, f"argument {name!r} is absent, but train={bool(train)} reads it")
        _count(op, name, t, c, "one per channel of input")


def _attention_shapes(op, query, key, value, attn_mask):
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        _fail(op, f"query {_shape(query)}, key {_shape(key)} and value {_shape(value)} must "
                  "be 4-d: batch, heads, length, embedding")
    b, h, lq, e = _shape(query)
    _same_shape(op, "key", key, [b, h, key.shape[2], e], "query's batch, heads and embedding")
    _same_shape(op, "value", value, [b, h, key.shape[2], value.shape[3]],
                "key's batch, heads and length")
    if attn_mask is not None:
        full = [b, h, lq, key.shape[2]]
        m = _shape(attn_mask)
        if len(m) > 4 or any(d not in (1, f) for d, f in zip(reversed(m), reversed(full))):
            _fail(op, f"argument 'attn_mask' has shape {m}, which does not broadcast to "
                      f"{full}")
    return b, h, lq, value.shape[3]


@_guard("aten._scaled_dot_product_flash_attention_for_cpu.default",
        trusts=[SHAPE, LAYOUT], dense="rows",
        note="query, key, value 4-d with matching batch, heads, length and embedding; "
             "attn_mask broadcasting to batch x heads x L x S")
def _flash_attention(op, query, key, value, attn_mask):
    _attention_shapes(op, query, key, value, attn_mask)


@_guard("aten._scaled_dot_product_flash_attention_for_cpu_backward.default",
        trusts=[SHAPE, LAYOUT], dense="rows",
        note="as the forward, and out and grad_out batch x heads x L x Ev, logsumexp "
             "batch x heads x L")
def _flash_attention_backward(op, grad_out, query, key, value, out, logsumexp, attn_mask):
    b, h, lq, ev = _attention_shapes(op, query, key, value, attn_mask)
    _same_shape(op, "out", out, [b, h, lq, ev], "the attention's result")
    _same_shape(op, "grad_out", grad_out, [b, h, lq, ev], "the attention's result")
    _same_shape(op, "logsumexp", logsumexp, [b, h, lq], "one per query row")


@_guard("aten._softmax_backward_data.default", "aten._log_softmax_backward_data.default",
        trusts=[SHAPE], note="grad_output shaped like output")
def _softmax_backward(op, grad_output, output):
    _same_shape(op, "grad_output", grad_output, output.shape, "output's shape")


@_guard("aten.binary_cross_entropy.default", trusts=[SHAPE],
        note="target shaped like self (else the kernel resizes a view of its result, "
             "whose values then depend on the inputs' strides)")
def _binary_cross_entropy(op, self, target):
    _same_shape(op, "target", target, self.shape, "self's shape")


@_guard("aten.binary_cross_entropy_backward.default", trusts=[SHAPE],
        note="target shaped like self, as the forward")
def _binary_cross_entropy_backward(op, self, target):
    _same_shape(op, "target", target, self.shape, "self's shape")


@_guard("aten._adaptive_avg_pool2d_backward.default", "aten.avg_pool2d_backward.default",
        trusts=[SHAPE], note="grad_output with self's number of dimensions and leading "
                             "(batch, channel) dimensions")
def _pool_backward(op, grad_output, self):
    if grad_output.dim() != self.dim() or self.dim() not in (3, 4):
        _fail(op, f"grad_output {_shape(grad_output)} and self {_shape(self)} must both be "
                  "3-d or 4-d")
    _same_shape(op, "grad_output", grad_output, _shape(self)[:-2] + _shape(grad_output)[-2:],
                "self's leading dimensions")


def _conv_output(op, input, weight, stride, padding, dilation, transposed, output_padding,
                 groups):
    """The shape of ``convolution``'s result, refusing parameters the kernels trust."""
    k = weight.dim() - 2
    if k < 1 or input.dim() != k + 2:
        _fail(op, f"input {_shape(input)} and weight {_shape(weight)} do not make a "
                  "batched convolution")

    def per_dim(name, v, least):
        v = _ints(v)
        v = v * k if len(v) == 1 else v
        if len(v) != k or any(x < least for x in v):
            _fail(op, f"argument {name!r} is {v}: {k} values, each at least {least}")
        return v

    stride, dilation = per_dim("stride", stride, 1), per_dim("dilation", dilation, 1)
    padding = per_dim("padding", padding, 0)
    output_padding = per_dim("output_padding", output_padding, 0) if transposed else [0] * k
    if groups < 1:
        _fail(op, f"argument 'groups' is {groups}")
    for s, d, p in zip(stride, dilation, output_padding, strict=True):
        if p >= max(s, d):
            _fail(op, f"output_padding {output_padding} must be smaller than stride or "
                      "dilation")
    spatial = []
    for j in range(k):
        i, w = input.shape[2 + j], weight.shape[2 + j]
        if transposed:
            spatial.append((i - 1) * stride[j] - 2 * padding[j] + dilation[j] * (w - 1)
                           + output_padding[j] + 1)
        else:
            spatial.append((i + 2 * padding[j] - dilation[j] * (w - 1) - 1) // stride[j] + 1)
    out_c = weight.shape[1] * groups if transposed else weight.shape[0]
    return [input.shape[0], out_c] + spatial


@_guard("aten.convolution.default", trusts=[SIZE],
        note="the result (from padding, stride, dilation, output_padding) within the limit")
def _convolution(op, input, weight, stride, padding, dilation, transposed, output_padding,
                 groups):
    shape = _conv_output(op, input, weight, stride, padding, dilation, transposed,
                         output_padding, groups)
    _numel(op, shape, f"its result {shape}")


@_guard("aten.convolution_backward.default", trusts=[SHAPE, SIZE],
        note="grad_output shaped like the convolution's result (a transposed one's "
             "output_padding indexes past it); bias_sizes within the limit")
def _convolution_backward(op, grad_output, input, weight, bias_sizes, stride, padding,
                          dilation, transposed, output_padding, groups):
    shape = _conv_output(op, input, weight, stride, padding, dilation, transposed,
                         output_padding, groups)
    _same_shape(op, "grad_output", grad_output, shape, "the convolution's result")
    _numel(op, _ints(bias_sizes), f"its bias gradient {_ints(bias_sizes)[:8]}")


@_guard("aten.col2im.default", trusts=[SHAPE, SIZE],
        note="positive kernel, dilation, stride; padding >= 0; self's blocks those the "
             "sizes make; the result within the limit")
def _col2im(op, self, output_size, kernel_size, dilation, padding, stride):
    vals = {"output_size": _ints(output_size), "kernel_size": _ints(kernel_size),
            "dilation": _ints(dilation), "padding": _ints(padding), "stride": _ints(stride)}
    for name, v in vals.items():
        least = 0 if name == "padding" else 1
        if len(v) != 2 or any(x < least for x in v):
            _fail(op, f"argument {name!r} is {v}: 2 values, each at least {least}")
    if self.dim() not in (2, 3):
        _fail(op, f"self {_shape(self)} must be 2-d or 3-d")
    blocks = 1
    for j in range(2):
        o, k, d, p, s = (vals[n][j] for n in ("output_size", "kernel_size", "dilation",
                                               "padding", "stride"))
        if p > o + d * (k - 1):
            _fail(op, f"padding {vals['padding']} is larger than the output {vals['output_size']}")
        blocks *= max((o + 2 * p - d * (k - 1) - 1) // s + 1, 0)
    if self.shape[-1] != blocks:
        _fail(op, f"self {_shape(self)} holds {self.shape[-1]} blocks, but the sizes make "
                  f"{blocks}")
    kernel = math.prod(vals["kernel_size"])
    channels = self.shape[-2] // kernel
    batch = self.shape[0] if self.dim() == 3 else 1
    _numel(op, [batch, channels] + vals["output_size"], "its result")


# --- values that index host memory ------------------------------------------------------------
@_guard("aten._fft_r2c.default", trusts=[VALUE],
        note="dim holds distinct dimensions of self (the kernel indexes its shape with "
             "them); normalization 0, 1 or 2")
def _fft(op, self, dim, normalization):
    seen = set()
    for d in _ints(dim):
        seen.add(_dim(op, "dim", d, self.dim()))
    if len(seen) != len(_ints(dim)) or not seen:
        _fail(op, f"argument 'dim' is {list(dim)}: distinct dimensions, at least one")
    if normalization not in (0, 1, 2):
        _fail(op, f"argument 'normalization' is {normalization}, not 0, 1 or 2")


@_guard("aten._fft_c2r.default", trusts=[VALUE, SIZE],
        note="as _fft_r2c, and last_dim_size positive with the result within the limit")
def _fft_c2r(op, self, dim, normalization, last_dim_size):
    _fft(op, self, dim, normalization)
    if last_dim_size < 1:
        _fail(op, f"argument 'last_dim_size' is {last_dim_size}")
    last = _dim(op, "dim", _ints(dim)[-1], self.dim())
    shape = _shape(self)
    shape[last] = last_dim_size
    _numel(op, shape, f"its result {shape}")



# --- sizes: what a kernel allocates ----------------------------------------------------------
@_guard("aten.empty.memory_format", "aten.full.default", "aten.zeros.default",
        "aten.rand.default", "aten.randn.default", trusts=[SIZE],
        note="prod(size) within the limit")
def _factory(op, size):
    _numel(op, _ints(size), f"its result {_ints(size)[:8]}")


@_guard("aten.new_empty.default", "aten.new_zeros.default", trusts=[SIZE],
        note="prod(size) within the limit")
def _new_factory(op, self, size):
    _numel(op, _ints(size), f"its result {_ints(size)[:8]}")


@_guard("aten.empty_strided.default", trusts=[SIZE, LAYOUT],
        note="the storage its strides span, and prod(size), within the limit")
def _empty_strided(op, size, stride):
    size, stride = _ints(size), _ints(stride)
    _numel(op, size, f"its result {size[:8]}")
    if len(size) == len(stride) and 0 not in size and all(d > 0 for d in size):
        span = 1 + sum((d - 1) * abs(s) for d, s in zip(size, stride, strict=True))
        _numel(op, span, f"the storage of size {size[:8]} with strides {stride[:8]}")


@_guard("aten.arange.default", trusts=[SIZE], note="end elements within the limit")
def _arange_end(op, end):
    _arange(op, 0, end, 1)


@_guard("aten.arange.start_step", trusts=[SIZE],
        note="ceil((end - start) / step) elements within the limit")
def _arange(op, start, end, step):
    try:
        n = math.ceil((float(end) - float(start)) / float(step))
    except (ValueError, OverflowError, ZeroDivisionError, TypeError):
        return  # NaN, infinite or zero step: torch refuses the range itself
    _numel(op, max(n, 0), f"its result [{max(n, 0)}]")


@_guard("aten.randperm.default", trusts=[SIZE], note="n within the limit")
def _randperm(op, n):
    _numel(op, n, f"its result [{n}]")


@_guard("aten.select_backward.default", "aten.slice_backward.default", trusts=[SIZE],
        note="prod(input_sizes) within the limit")
def _select_backward(op, input_sizes):
    _numel(op, _ints(input_sizes), f"its result {_ints(input_sizes)[:8]}")


@_guard("aten.repeat.default", trusts=[SIZE],
        note="self's elements times prod(repeats) within the limit")
def _repeat(op, self, repeats):
    r = _ints(repeats)
    if any(x < 0 for x in r):
        return  # the kernel refuses negative repeats
    _numel(op, self.numel() * math.prod(r), f"its result (self {_shape(self)} repeated {r[:8]})")


@_guard("aten.expand.default", trusts=[SIZE],
        note="prod(size) within the limit (a view, but ssaexec copies views it cannot prove "
             "safe)")
def _expand(op, self, size):
    size = _ints(size)
    lead = len(size) - self.dim()
    shape = [self.shape[j - lead] if d == -1 and j >= lead else d for j, d in enumerate(size)]
    _numel(op, shape, f"its result {shape[:8]}")


def _padded(op, self, pad):
    pad = _ints(pad)
    shape = _shape(self)
    for j in range(len(pad) // 2):
        d = len(shape) - 1 - j
        if d < 0:
            break
        shape[d] += pad[2 * j] + pad[2 * j + 1]
    if any(d < 0 for d in shape):
        # an empty batch skips the kernel's check: the result would have a negative dim
        _fail(op, f"padding {pad[:8]} makes a result of shape {shape[:8]}")
    _numel(op, shape, f"its result {shape[:8]}")


@_guard("aten.constant_pad_nd.default", trusts=[SIZE, VALUE],
        note="self's shape plus the padding: no dimension negative (unchecked for an empty "
             "batch), within the limit")
def _constant_pad(op, self, pad):
    _padded(op, self, pad)


@_guard("aten.reflection_pad1d.default", "aten.reflection_pad2d.default",
        "aten.reflection_pad3d.default", "aten.replication_pad2d.default",
        "aten.replication_pad3d.default", trusts=[SIZE, VALUE],
        note="self's shape plus the padding: no dimension negative (unchecked for an empty "
             "batch), within the limit")
def _pad(op, self, padding):
    _padded(op, self, padding)


@_guard("aten.upsample_bilinear2d.vec", "aten.upsample_nearest2d.vec", trusts=[SIZE],
        note="the result (output_size, or the input scaled) within the limit")
def _upsample(op, input, output_size, scale_factors):
    lead = _shape(input)[:-2]
    if output_size is not None:
        shape = lead + _ints(output_size)
    elif scale_factors is not None:
        try:
            shape = lead + [math.floor(d * float(s)) for d, s in
                            zip(_shape(input)[-2:], scale_factors, strict=False)]
        except (ValueError, OverflowError):
            _fail(op, f"argument 'scale_factors' is {list(scale_factors)}")
    else:
        return
    _numel(op, shape, f"its result {shape[:8]}")


@_guard("aten._adaptive_avg_pool2d.default", "aten._adaptive_avg_pool3d.default",
        "aten.adaptive_avg_pool1d.default", trusts=[SIZE, VALUE],
        note="output_size >= 0 (unchecked for an empty batch); self's leading dimensions "
             "times prod(output_size) within the limit")
def _adaptive_pool(op, self, output_size):
    size = _ints(output_size)
    if any(d < 0 for d in size):
        # an empty batch skips the kernel's check: the result would have a negative dim
        _fail(op, f"argument 'output_size' is {size}; sizes are >= 0")
    shape = _shape(self)[:max(self.dim() - len(size), 0)] + size
    _numel(op, shape, f"its result {shape[:8]}")
