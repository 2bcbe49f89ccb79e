"""Decompose: which ATen ops the capture traces as other ops, and as what.

``decompositions()`` is the table ``capture`` hands ``aot_export_module``; an op in
it is traced as its decomposition (recursively), every other op stays whole.

Policy:

* keep ops whole where possible: a fused kernel (``_softmax_backward_data``,
  ``native_layer_norm_backward``) is faster than its pieces, and the operator
  policy (``ssaexec.ops.policy``) allows the ones real models need;
* an op the policy refuses (``new_ones``, ``ones_like``, ``where.ScalarOther``,
  ``nll_loss2d_forward`` ...) is traced as torch's core ATen decomposition of it
  (``torch._decomp.core_aten_decompositions()``, the table ``torch.export``'s
  ``run_decompositions`` uses; torch's plain ``decomposition_table`` has refs that
  emit ``prims``), so programs name allowed ops only and the allowlist does not
  grow for every model;
* ``SYMBOLIC_SAFE``: ops torch 2.13 cannot trace with a symbolic batch, traced as
  functional equivalents whose fake kernels keep sizes symbolic: ``F.pad``
  (``constant_pad_nd``) as slices and a ``cat`` of filled blocks, and the
  ``as_strided`` / ``as_strided_scatter`` pair functionalisation emits for a layout
  replay as the reshape of a slice it is (any other ``as_strided`` stays, and the
  policy refuses it);
* ``RENAMES`` and ``ASSERTS`` (ops the lowering drops or turns into renames) are
  never decomposed.
"""

import torch

from ...core import compat

__all__ = ["RENAMES", "ASSERTS", "SYMBOLIC_SAFE", "decompositions"]

# ops the lowering drops or turns into renames (it never emits them): never decomposed
RENAMES = frozenset({"aten.detach.default", "aten.alias.default", "aten.lift_fresh.default",
                     "aten.lift_fresh_copy.default"})
ASSERTS = frozenset({"aten._assert_scalar.default", "aten._assert_tensor_metadata.default",
                     "aten.sym_constrain_range_for_size.default",
                     "aten.sym_constrain_range.default", "aten._assert_async.msg",
                     "aten._assert_async.default"})


_TABLE = None


def _constant_pad_nd(x, pad, value=0):
    # F.pad: torch 2.13's C++ kernel, run on a fake tensor whose batch is a symbol (the
    # joint graph's re-trace), reads storage_offset() and so fixes the batch size (a conv
    # then a pad: MobileNetV2, Swin). The same values from slices and a cat of filled
    # blocks, functional ops whose fake kernels keep sizes symbolic.
    aten = torch.ops.aten
    for k in range(len(pad) // 2):
        dim = x.dim() - 1 - k
        lo, hi = pad[2 * k], pad[2 * k + 1]
        if lo < 0 or hi < 0:
            size = x.shape[dim]
            x = aten.slice.Tensor(x, dim, max(-lo, 0), size + min(hi, 0))
        parts = []
        for width, where in ((lo, 0), (hi, 1)):
            if width > 0:
                shape = list(x.shape)
                shape[dim] = width
                parts.append((where, aten.full.default(shape, value, dtype=x.dtype,
                                                       layout=x.layout, device=x.device,
                                                       pin_memory=False)))
        if parts:
            x = aten.cat.default([p for w, p in parts if w == 0] + [x]
                                 + [p for w, p in parts if w == 1], dim)
    return x


def _window(x, size, stride, offset):
    """``(x flattened, start, numel)`` when ``as_strided(x, size, stride, offset)`` reads a
    contiguous run of the elements of contiguous ``x`` in order (a reshape of a slice),
    else None."""
    known = compat.statically_known_true

    def contiguous(sizes, strides):
        expect = 1
        for n, st in reversed(list(zip(sizes, strides, strict=True))):
            if not known(n == 1) and not known(st == expect):
                return None
            expect = expect * n
        return expect

    if contiguous(x.shape, x.stride()) is None:
        return None
    numel = contiguous(size, stride)
    if numel is None:
        return None
    start = 0 if offset is None else offset - x.storage_offset()
    if not (known(start >= 0) and known(start + numel <= x.numel())):
        return None
    return torch.ops.aten.view.default(x, [x.numel()]), start, numel


def _as_strided(x, size, stride, storage_offset=None):
    # as_strided reads raw storage (refused by the operator policy), but the graph has it
    # where functionalisation replays a layout change (adaptive_avg_pool2d's as_strided_ to
    # channels-last strides of a [n, c, 1, 1] mean: Swin's pooler): a reshape of a slice
    # of a contiguous tensor says the same. Anything else stays as_strided (refused).
    known = compat.statically_known_true
    w = _window(x, size, stride, storage_offset)
    if w is None:
        return NotImplemented
    aten = torch.ops.aten
    flat, start, numel = w
    if not (known(start == 0) and known(numel == x.numel())):
        flat = aten.slice.Tensor(flat, 0, start, start + numel)
    return aten.view.default(flat, list(size))


def _as_strided_scatter(base, src, size, stride, storage_offset=None):
    # the backward of the as_strided above: src written into that run of base's elements
    w = _window(base, size, stride, storage_offset)
    if w is None:
        return NotImplemented
    aten = torch.ops.aten
    flat, start, numel = w
    values = aten.clone.default(src, memory_format=torch.contiguous_format)
    values = aten.view.default(values, [numel])
    out = aten.slice_scatter.default(flat, values, 0, start, start + numel)
    return aten.view.default(out, list(base.shape))


SYMBOLIC_SAFE = {torch.ops.aten.constant_pad_nd.default: _constant_pad_nd,
                 torch.ops.aten.as_strided.default: _as_strided,
                 torch.ops.aten.as_strided_scatter.default: _as_strided_scatter}


def decompositions():
    """The decompositions the capture traces with.

    ``{OpOverload: function}``, built on first use (see the module docstring).
    """
    global _TABLE
    if _TABLE is None:
        # the table torch.export's run_decompositions() lowers to core ATen with (torch's
        # plain decomposition_table has refs that emit prims, e.g. where.ScalarOther)
        from ...ops.policy import is_allowed
        table = {}
        for op, fn in compat.core_aten_decompositions().items():
            name = getattr(op, "_schema", None)
            if name is None or getattr(op, "namespace", None) != "aten":
                continue
            t = f"aten.{name.name.split('::')[-1]}.{op._overloadname}"
            if t not in RENAMES and t not in ASSERTS and not is_allowed(t):
                table[op] = fn
        table.update(SYMBOLIC_SAFE)
        _TABLE = table
    return _TABLE
