"""Kernel guards, size family: what a kernel allocates, from numbers the program gives.

Registered into ``ssaexec.ops.guards`` (policy, invariants, the machinery) on import.
Each refuses a result (or storage) over ``max_tensor_elements`` before the kernel runs.
"""

import math

from .guards import LAYOUT, SIZE, VALUE, _fail, _guard, _ints, _numel, _shape


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
