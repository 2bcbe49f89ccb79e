"""Kernel guards, shape family: statistics, secondary inputs and the shapes convolutions make.

Registered into ``ssaexec.ops.guards`` (policy, invariants, the machinery) on import.
The checks read shapes only, so they run on meta tensors too (shape inference); the
``layout`` guards among them (``dense=``) hand their kernels contiguous inputs.
"""

import math

from .guards import (LAYOUT, SHAPE, SIZE, VALUE, _count, _fail, _guard, _ints, _numel,
                     _same_shape, _shape)


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


@_guard("aten.native_batch_norm.default", trusts=[SHAPE, VALUE], hand_written=True,
        note="weight, bias, running_mean and running_var of one element per channel (training "
             "writes C values into the running statistics, in place); the running statistics "
             "present when not training (evaluation reads them)")
def _native_batch_norm(op, input, weight, bias, running_mean, running_var, training):
    _batch_norm(op, input, weight, bias, running_mean, running_var)
    if not training:
        for name, t in (("running_mean", running_mean), ("running_var", running_var)):
            if t is None:
                _fail(op, f"argument {name!r} is absent, but training=False reads it")


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
