"""Bounds on an op's attributes checked before shape inference: ranks and counts.

Policy (docs/security.md): validating a file costs time and memory linear in its
size. Shape inference runs torch's meta kernels, and two kinds of attribute would
make one kernel call cost far more than the bytes that ask for it:

* **ranks**: torch's elementwise meta kernels take time cubic in the rank (a
  rank-2000 input cost 240 s). Every declared shape is capped at ``max_rank`` by
  ``ssaexec.core.limits.shape_problem``; ``rank_attr_problem`` caps every attribute
  that lists one entry per dimension (``shape``, ``axes``, ``strides``, an ATen
  op's ``size``/``dims``/``kernel_size`` ...) at ``max_rank`` entries, and those
  that list two per dimension (``paddings``, ``pad``, ``padding``) at twice that.
  The rule is by exclusion: a list attribute is capped unless it is a count list
  (``sections``, ``split_sizes``: see below) or one of ``_NOT_PER_DIM``, whose
  entries are not dimensions (assigned values, schedule points, var names,
  places, ATen tensor lists). A new list attribute is capped until named there.
* **counts**: an op that returns a list of tensors makes one Python object per
  entry, in each inference probe (``split`` with ``num=2**21`` cost 66 s and
  3.5 GB). ``count_problem`` refuses, before inference, a count that differs
  from the number of output vars the op names (a number the file pays for, one
  name each) or that exceeds the size of the dimension it splits when that size
  is declared. Where the size is unknown (-1, the batch), inference probes it
  as 5 and 7, so the count is bounded by the named outputs alone. The ops:
  ``split`` (``num`` or ``sections``), ``aten.split.Tensor`` (``split_size``),
  ``aten.split_with_sizes.default`` (``split_sizes``) and ``aten.unbind.int``
  (the dimension's size).

Both run where a file is read (``serialize``, ``text``, the Paddle converters)
and in ``validate_program`` before an op is inferred; each costs O(1) per
attribute entry. Messages name the attribute and end with how to raise the limit.
"""

import math

from ..core.limits import get_limit, rank_problem

__all__ = ["rank_attr_problem", "count_problem"]

# list attributes whose entries are not one per dimension (never rank-capped)
_NOT_PER_DIM = frozenset({
    "values", "milestones", "boundaries",                     # assign_value, lr_schedule
    "trainers", "sparse", "params", "grads", "dtypes",        # parameter-server ops
    "places", "prefetched", "saved", "stacked", "inputs", "outputs",  # parallel_do, blocks
    "tensors", "@sym", "output_mask",                         # ATen: inputs, bindings, flags
    "sections", "split_sizes",                                # counts: count_problem
})
# one entry per side of each dimension
_TWO_PER_DIM = frozenset({"paddings", "padding", "pad"})


def rank_attr_problem(attrs):
    """``(name, message)`` for the first attribute of ``attrs`` with too many entries, or None.

    Parameters
    ----------
    attrs : dict
        An op's attributes as read from a file (any values).
    """
    cap = get_limit("max_rank")
    for name, value in attrs.items():
        if not isinstance(value, list) or name in _NOT_PER_DIM:
            continue
        if name == "shapes":  # recv: one shape per output var
            for k, shape in enumerate(value):
                if isinstance(shape, list) and len(shape) > cap:
                    return name, rank_problem(len(shape), f"attribute 'shapes' entry {k}")
            continue
        per_dim = 2 if name in _TWO_PER_DIM else 1
        if len(value) > per_dim * cap:
            what = f"attribute {name!r} ({len(value)} entries, {per_dim} per dimension)"
            return name, rank_problem(math.ceil(len(value) / per_dim), what)
    return None


def _int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _dim(shape, axis):
    """The declared size of dimension ``axis`` of ``shape`` (None: unknown or out of range)."""
    if shape is None or not _int(axis) or not -len(shape) <= axis < len(shape):
        return None
    d = shape[axis]
    return d if d >= 0 else None


def _ref_shape(ref, xs):
    # an ATen tensor argument "X[k]" -> the declared shape of input k
    if isinstance(ref, str) and ref.startswith("X[") and ref.endswith("]"):
        k = ref[2:-1]
        if k.isdigit() and int(k) < len(xs):
            return xs[int(k)]
    return None


def count_problem(op_type, attrs, in_shapes, outputs):
    """A message when an op's count attribute would make more results than it may, or None.

    Parameters
    ----------
    op_type : str
    attrs : dict
        The op's attributes (defaults not filled in).
    in_shapes : dict
        Input slot -> list of declared shapes (None: unknown).
    outputs : dict
        Output slot -> list of var names.
    """
    names = outputs.get("Out") or []
    named = len(names)
    if op_type == "split":
        x = (in_shapes.get("X") or [None])[0]
        axis = attrs.get("axis", 0)
        size = _dim(x, axis)
        sections, num = attrs.get("sections") or [], attrs.get("num", 0)
        if isinstance(sections, list) and sections:
            count, what = len(sections), f"{len(sections)} sections"
        elif _int(num):
            if num < 1:
                return (f"attribute 'num' is {num}; hint: split needs num >= 1 or a "
                        "'sections' list")
            if size is not None and num > max(size, 1):
                return (f"attribute 'num' ({num}) is larger than the size {size} of axis "
                        f"{axis} it splits; hint: num must divide that size")
            count, what = num, f"num={num}"
        else:
            return None  # a wrong type: the attribute check reports it
        return _named(count, what, names)
    if op_type == "aten.split_with_sizes.default":
        sizes = attrs.get("split_sizes")
        return _named(len(sizes), f"{len(sizes)} split_sizes", names) \
            if isinstance(sizes, list) else None
    if op_type in ("aten.split.Tensor", "aten.unbind.int"):
        size = _dim(_ref_shape(attrs.get("self"), in_shapes.get("X") or []),
                    attrs.get("dim", 0))
        if size is None:
            return None  # unknown: probed as 5 and 7, at most 7 results
        if op_type == "aten.unbind.int":
            return _named(size, f"unbinding a dimension of size {size}", names)
        step = attrs.get("split_size")
        if _int(step) and step > 0:
            return _named(max(1, -(-size // step)), f"split_size={step} of a dimension of "
                                                     f"size {size}", names, at_most=True)
        if not _int(step) and size > named:  # a size expression: as many as `size` results
            return (f"split_size {str(step)[:40]!r} is computed at run time and may cut the "
                    f"dimension of size {size} into up to {size} results, but the op names "
                    f"{named} output vars; hint: name one var per result, or give a literal "
                    "split_size")
    return None


def _named(count, what, names, at_most=False):
    # the wording of validation's own check after inference, which this one anticipates
    if count == len(names) or (at_most and count <= len(names)):
        return None
    shown = repr(names) if len(names) <= 8 else repr(names[:8])[:-1] + ", ...]"
    return (f"output slot 'Out' lists {len(names)} vars {shown} but the op produces {count} "
            f"({what}); hint: list one var per produced value")
