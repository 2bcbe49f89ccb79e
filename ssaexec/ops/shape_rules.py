"""Shape arithmetic for ``ShapeRule``s: what the meta probe finds, without running it.

A rule (``ssaexec.ops.registry.ShapeRule``) must give exactly the probe's result.
Its shape function sees concrete sizes (the rule runs it with each -1 as 5 and as
7, as the probe runs the kernel), so these are torch's rules for concrete shapes.
``tests/ops/test_infer_rules.py`` checks every rule against the probe.
"""

from .registry import ShapeRule

__all__ = ["broadcast", "gather", "like", "wrap_axis", "number_class", "numel", "SAME_X"]


def broadcast(a, b):
    """The broadcast of shapes ``a`` and ``b``; ``RuntimeError`` where they do not broadcast."""
    out = []
    n = max(len(a), len(b))
    a = [1] * (n - len(a)) + list(a)
    b = [1] * (n - len(b)) + list(b)
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            raise RuntimeError(f"the size {x} of shape {a} must match the size {y} of shape "
                               f"{b} at dimension {i}")
    return out


def numel(shape):
    """The number of elements of ``shape``."""
    n = 1
    for d in shape:
        n *= d
    return n


def number_class(v, stand_in, top=2 ** 64):
    """What number attribute ``v`` is to a dtype run: ``stand_in`` of its type, or an
    int that, like ``v``, does not convert to a C number (torch's Scalar and double
    arguments take ints within int64/uint64 and floats; an int argument, ``top=2**63``,
    ints within int64)."""
    if isinstance(v, float):
        return float(stand_in)
    if -2 ** 63 <= v < top:
        return int(stand_in)
    return top if v > 0 else -2 ** 63 - 1


def wrap_axis(axis, rank):
    """``axis`` counted from 0, as torch wraps a dim (a 0-dim tensor takes -1 and 0)."""
    n = max(rank, 1)
    if not -n <= axis < n:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], "
                         f"but got {axis})")
    return axis % n


def gather(inp, dim, index):
    """The shape of ``inp.gather(dim, index)`` (torch's shape check, which an empty index
    skips; a 0-dim tensor counts as one of shape [1])."""
    d = wrap_axis(dim, len(inp))
    n = max(len(inp), 1)
    if numel(index):
        if max(len(index), 1) != n:
            raise RuntimeError("Index tensor must have the same number of dimensions as "
                               "input tensor")
        for i in range(n):
            a = index[i] if index else 1
            b = inp[i] if inp else 1
            if i != d and a > b:
                raise RuntimeError(f"Size does not match at dimension {i} expected index "
                                   f"{list(index)} to be no larger than self {list(inp)} "
                                   f"apart from dimension {d}")
    return list(index)


def like(src, *outs):
    """A ``ShapeRule`` whose outputs ``outs`` have the shape of input ``src``."""
    return ShapeRule(lambda ins, attrs: {o: ins[src][0] for o in outs})


SAME_X = like("X", "Out")
