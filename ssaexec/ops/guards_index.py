"""Kernel guards, index family: the values of index tensors a kernel trusts.

Registered into ``ssaexec.ops.guards`` (policy, invariants, the machinery) on import.
Ops whose CPU kernels check their indices (``gather``, ``index`` ...) are checked only
off the CPU, where a bad index is a device-side assert that ends the CUDA context.
"""

import torch

from .guards import (INDEX, LAYOUT, SHAPE, SIZE, TRACED, _assert, _dim, _fail, _guard,
                     _index_range, _numel, _same_shape, _shape)


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
    if offsets.device.type != "meta" and offsets.numel() > 1:
        decreases, text = (offsets[1:] < offsets[:-1]).any(), \
            "argument 'offsets' decreases; bags are runs of indices, in order"
        untraced = TRACED.get()
        if untraced is not None:  # checked now (the trace runs the kernel) and in the graph
            with untraced():
                if bool((offsets[1:] < offsets[:-1]).any()):
                    _fail(op, text)
            _assert(op, ~decreases, text)
        elif bool(decreases):
            _fail(op, text)


@_guard("aten.embedding_backward.default", trusts=[INDEX, SHAPE, SIZE], hand_written=True,
        note="indices in [0, num_weights) on every device (the dense kernel adds rows at them, "
             "the sparse one makes a sparse tensor of them, unchecked); grad shaped like "
             "indices plus the embedding dimension; num_weights x that within the limit")
def _embedding_backward(op, grad, indices, num_weights):
    if num_weights < 0:
        _fail(op, f"argument 'num_weights' is {num_weights}")
    if grad.dim() != indices.dim() + 1:
        _fail(op, f"grad {_shape(grad)} is not indices {_shape(indices)} plus one dimension")
    _same_shape(op, "grad", grad, _shape(indices) + [grad.shape[-1]],
                "indices' shape plus the embedding dimension")
    _numel(op, [num_weights, grad.shape[-1]], f"its result [{num_weights}, {grad.shape[-1]}]")
    _index_range(op, "indices", indices, 0, num_weights, "rows of the weight")


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
