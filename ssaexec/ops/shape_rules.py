"""Shape arithmetic for ``ShapeRule``s: what the meta probe finds, without running it.

A rule (``ssaexec.ops.registry.ShapeRule``) must give exactly the probe's result:
the probe runs the kernel with every -1 dim as 5 and as 7, marks an output dim that
differs -1, and fails when either run fails. So here a -1 dim is a size B that
takes two values: -1 against -1 or against 1 broadcasts to -1, and -1 against any
other size fails in one of the runs (5 != c or 7 != c), hence always fails.
``tests/test_infer_rules.py`` checks every rule against the probe.
"""

from .registry import ShapeRule

__all__ = ["broadcast", "like", "wrap_axis", "SAME_X"]


def broadcast(a, b):
    """The broadcast of shapes ``a`` and ``b`` (-1: the batch), as the probe finds it.

    Raises ``RuntimeError`` where a probe run fails.
    """
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
                               f"{b} at dimension {i} (-1 is any batch size)")
    return out


def wrap_axis(axis, rank):
    """``axis`` counted from 0, as torch wraps a dim (a 0-dim tensor takes -1 and 0)."""
    n = max(rank, 1)
    if not -n <= axis < n:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], "
                         f"but got {axis})")
    return axis % n


def like(src, *outs):
    """A ``ShapeRule`` whose outputs ``outs`` have the shape of input ``src``."""
    return ShapeRule(lambda ins, attrs: {o: ins[src][0] for o in outs})


SAME_X = like("X", "Out")
