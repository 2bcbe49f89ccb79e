"""Shape ops: reshape, flatten, transpose, concat, split, squeeze/unsqueeze.

Outputs never alias inputs: a view would let an in-place update of one var
change another behind the SSA graph's back, so shape ops return contiguous copies
only where torch would alias (``reshape`` of a contiguous tensor is copied).
"""

import torch

from .registry import REQUIRED, ShapeRule, register_op
from .shape_rules import wrap_axis


def _resolve_shape(x, shape):
    # Paddle's rule: 0 copies the input's dimension at that position, -1 is inferred.
    return [x.shape[i] if d == 0 else d for i, d in enumerate(shape)]


@register_op("reshape", ["X"], ["Out"], {"shape": ("ints", REQUIRED)})
def reshape(ins, attrs):
    """Out = X with a new shape (0 keeps the input dim, -1 is inferred)."""
    x = ins["X"]
    return {"Out": x.reshape(_resolve_shape(x, attrs["shape"])).clone()}


@register_op("flatten", ["X"], ["Out"], {"axis": ("int", 1)})
def flatten(ins, attrs):
    """Out = X as a 2-D matrix [prod(dims[:axis]), prod(dims[axis:])].

    ``axis`` is in ``[0, rank]``, as Paddle's ``flatten`` checks: a slice past the
    rank would quietly flatten everything into the rows (the meta probe and the run
    both refuse it here)."""
    x, axis = ins["X"], attrs["axis"]
    if not 0 <= axis <= x.dim():
        raise ValueError(f"flatten: axis {axis} is outside [0, {x.dim()}] for a "
                         f"{x.dim()}-d X")
    rows = 1
    for d in x.shape[:axis]:
        rows *= d
    cols = 1
    for d in x.shape[axis:]:
        cols *= d
    return {"Out": x.reshape(rows, cols).clone()}


@register_op("transpose", ["X"], ["Out"], {"axis": ("ints", REQUIRED)})
def transpose(ins, attrs):
    """Out = X with dimensions permuted by ``axis``."""
    # not .contiguous(): it returns X itself for the identity permutation
    return {"Out": ins["X"].permute(attrs["axis"]).clone(memory_format=torch.contiguous_format)}


def _concat_shapes(ins, attrs):
    shapes = [sh for sh, _ in ins["X"]]
    for i, sh in enumerate(shapes):
        if not sh:
            raise RuntimeError(f"zero-dimensional tensor (at position {i}) cannot be "
                               "concatenated")
    kept = [sh for sh in shapes if sh != [0]]  # torch skips 1-d empty tensors (legacy)
    if not kept:
        return {"Out": [0]}
    ref = kept[0]
    d = wrap_axis(attrs["axis"], len(ref))
    out = list(ref)
    for sh in kept[1:]:
        if len(sh) != len(ref):
            raise RuntimeError("Tensors must have same number of dimensions")
        if any(a != b for i, (a, b) in enumerate(zip(sh, ref, strict=True)) if i != d):
            raise RuntimeError(f"Sizes of tensors must match except in dimension {d}")
        out[d] += sh[d]
    return {"Out": out}


def _concat_canon(ins, attrs):
    # the result's dtype promotes over the inputs' (a set: order and repeats don't matter)
    kinds = sorted({(sh == [0], dt) for sh, dt in ins["X"]})
    return ({"X": [[0] if empty else [1] for empty, _ in kinds]}, {"axis": 0},
            {"X": [(None, dt) for _, dt in kinds]}),


@register_op("concat", ["X*"], ["Out"], {"axis": ("int", 0)},
             rule=ShapeRule(_concat_shapes, _concat_canon))
def concat(ins, attrs):
    """Out = X[0], X[1], ... joined along ``axis``."""
    return {"Out": torch.cat(ins["X"], dim=attrs["axis"])}


@register_op("split", ["X"], ["Out*"],
             {"num": ("int", 0), "sections": ("ints", []), "axis": ("int", 0)})
def split(ins, attrs):
    """Out = X cut along ``axis`` into ``num`` equal parts or ``sections`` (one may be -1)."""
    x, axis = ins["X"], attrs["axis"]
    size = x.shape[axis]
    if attrs["sections"]:
        sections = list(attrs["sections"])
        if sections.count(-1) > 1:
            raise ValueError(f"split: at most one section may be -1, got {sections}")
        if -1 in sections:
            # Paddle's rule: one -1 section takes what the others leave
            sections[sections.index(-1)] = size - (sum(sections) + 1)
        if sum(sections) != size or min(sections) < 0:
            raise ValueError(f"split: sections {attrs['sections']} do not add up to the "
                             f"size {size} of axis {axis}")
    else:
        num = attrs["num"]
        if num <= 0:
            raise ValueError("split needs num > 0 or sections")
        # torch.chunk would quietly return fewer parts; Paddle requires equal parts
        if size % num:
            raise ValueError(f"split: axis {axis} of size {size} does not divide into "
                             f"{num} equal parts")
        sections = [size // num] * num
    if x.is_sparse:  # a sparse gradient cut by rows for parameter servers (ops.sparse)
        starts = [sum(sections[:i]) for i in range(len(sections))]
        return {"Out": [x.narrow_copy(axis, a, n).coalesce()
                        for a, n in zip(starts, sections, strict=True)]}
    parts = torch.split(x, sections, dim=axis)
    return {"Out": [p.clone(memory_format=torch.contiguous_format) for p in parts]}


@register_op("unsqueeze", ["X"], ["Out"], {"axes": ("ints", REQUIRED)})
def unsqueeze(ins, attrs):
    """Out = X with size-1 dimensions inserted at ``axes``."""
    x = ins["X"]
    for a in sorted(attrs["axes"]):
        x = x.unsqueeze(a)
    return {"Out": x.clone()}


@register_op("squeeze", ["X"], ["Out"], {"axes": ("ints", REQUIRED)})
def squeeze(ins, attrs):
    """Out = X without the size-1 dimensions at ``axes`` (every size-1 dim when empty)."""
    x = ins["X"]
    if not attrs["axes"]:
        return {"Out": x.squeeze().clone()}
    # normalise first: sorting mixed signs ([-2, 0]) would drop a dim before its turn
    for a in sorted({a % x.dim() for a in attrs["axes"]}, reverse=True):
        x = x.squeeze(a)
    return {"Out": x.clone()}
