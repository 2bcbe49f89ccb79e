"""Limits on what a program may ask for: tensor sizes, numbers, nesting.

Policy: a program file is untrusted data (see docs/security.md), so everything
in it that costs time or memory in proportion to a number written in it is
bounded *before* any work starts, and going over a bound is a ``ProgramError``
that names the limit and how to raise it. The limits, with their defaults:

=========================  ===========  ============================================
limit                      default      bounds
=========================  ===========  ============================================
``max_tensor_elements``    2**31        elements of one tensor: a declared var shape
                                        (-1 and 0 counted as 1), a factory op's size,
                                        an inferred op output, a synthetic batch, a
                                        hand-written op's result at run time
``max_size_value``         2**62        any intermediate value of a size expression
``max_int_digits``         40           digits of one integer literal in a file
``max_nesting``            64           nesting depth of lists/objects in a file
``max_expr_chars``         1000         characters of one size expression
``max_block_depth``        64           nesting of blocks: a block's parent chain
                                        (block 0 is at depth 0, its sub-blocks at 1)
``max_places``             64           places of one ``parallel_do`` op (a thread each)
``max_rank``               64           dimensions of one tensor: a declared var shape,
                                        a PIR value type, an inferred output, and every
                                        attribute that lists one entry per dimension
                                        (``shape``, ``axes``, ``strides`` ...: see
                                        ``ssaexec.program.bounds``)
=========================  ===========  ============================================

Raise one for a process with the environment variable ``SSAEXEC_<NAME>``
(``SSAEXEC_MAX_TENSOR_ELEMENTS=8589934592 ssaexec run big.json``), read at
import, or in Python with ``set_limits(max_tensor_elements=2**33)`` (returns the
previous values) or the context manager ``limits(...)``. The defaults are far
above real models: 2**31 elements is an 8 GiB float32 tensor.

``max_tensor_elements`` also holds at run time, where a size depends on the
batch: a synthetic batch is refused before it is drawn, and a hand-written op's
result is checked when it is stored (``check_result``), so no value over the
limit ever reaches the next op. ``max_block_depth`` keeps every recursive walk
over blocks (validation, graph building, running sub-blocks) far from Python's
recursion limit: the readers and ``validate_program`` refuse deeper programs.
``max_rank`` keeps shape inference linear in the file: torch's elementwise meta
kernels take time cubic in the rank (a rank-2000 var cost 240 s to validate), so
every shape is refused above it where it is read, before any kernel sees it.
"""

import contextlib
import os

__all__ = ["DEFAULTS", "get_limit", "set_limits", "limits", "shape_problem", "numel_problem",
           "depth_problem", "rank_problem", "check_result"]

DEFAULTS = {
    "max_tensor_elements": 2 ** 31,
    "max_size_value": 2 ** 62,
    "max_int_digits": 40,
    "max_nesting": 64,
    "max_expr_chars": 1000,
    "max_block_depth": 64,
    "max_places": 64,
    "max_rank": 64,
}


def _from_env():
    values = dict(DEFAULTS)
    for name in DEFAULTS:
        raw = os.environ.get("SSAEXEC_" + name.upper())
        if raw is None:
            continue
        try:
            value = int(raw.strip().replace("_", ""), 0)
        except ValueError:
            # a bad override must not silently become "no limit": keep the default
            continue
        if value > 0:
            values[name] = value
    return values


_LIMITS = _from_env()


def get_limit(name):
    """The current value of limit ``name`` (a key of ``DEFAULTS``)."""
    return _LIMITS[name]


def set_limits(**values):
    """Set limits by name; return a dict of their previous values.

    Parameters
    ----------
    **values : int
        New values (positive integers), keyed by limit name (see ``DEFAULTS``).

    Returns
    -------
    dict
        The previous values of the limits set, for restoring them.
    """
    for name, value in values.items():
        if name not in DEFAULTS:
            raise ValueError(f"unknown limit {name!r}; limits are {', '.join(DEFAULTS)}")
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"limit {name!r} must be a positive integer, got {value!r}")
    old = {name: _LIMITS[name] for name in values}
    _LIMITS.update(values)
    return old


@contextlib.contextmanager
def limits(**values):
    """Context manager: ``set_limits(**values)`` inside the block, restored after it."""
    old = set_limits(**values)
    try:
        yield
    finally:
        _LIMITS.update(old)


def _hint(name):
    return (f"the limit is {name}={_LIMITS[name]}; raise it with SSAEXEC_{name.upper()}=N "
            f"or ssaexec.core.limits.set_limits({name}=N) if the program is trusted")


def numel_problem(numel, what):
    """A message when ``numel`` elements for ``what`` exceed ``max_tensor_elements``, else None."""
    cap = _LIMITS["max_tensor_elements"]
    if numel <= cap:
        return None
    # a product of file-given dims can have thousands of digits: never print those
    count = str(numel) if numel.bit_length() <= 64 else "more than 2**64"
    return (f"{what} has {count} elements, more than one tensor may hold "
            f"({_hint('max_tensor_elements')})")


def depth_problem(depth, what):
    """A message when block ``what`` at nesting ``depth`` is deeper than ``max_block_depth``."""
    if depth <= _LIMITS["max_block_depth"]:
        return None
    return (f"{what} is nested {depth} blocks deep, deeper than a program may nest "
            f"({_hint('max_block_depth')})")


def rank_problem(rank, what):
    """A message when ``what`` has ``rank`` dimensions, more than ``max_rank``, else None."""
    if rank <= _LIMITS["max_rank"]:
        return None
    return (f"{what} has {rank} dimensions, more than a tensor may have "
            f"({_hint('max_rank')})")


def check_result(t, name, label):
    """``t`` when it fits ``max_tensor_elements``; ``ProgramError`` naming var ``name`` if not.

    For results whose size no static check bounds (a var declared without a shape,
    or with -1 dims that a batch-dependent op multiplies): checked where an op's
    result is stored, so an oversized value never reaches the next op.
    """
    # numel() of a tensor is one C call: cheap enough to run on every stored result
    numel = getattr(t, "numel", None)
    if numel is not None and numel() > _LIMITS["max_tensor_elements"]:
        from .errors import ProgramError
        raise ProgramError(numel_problem(numel(), f"var {name!r} (shape {_short(list(t.shape))}"
                                                  f", made by {label})"))
    return t


def shape_problem(shape, what="the shape"):
    """A message when declared ``shape`` is malformed or too big, else None.

    A declared shape is a list of dims, each -1 (any size: the batch) or >= 0;
    its element count, with -1 and 0 counted as 1, must not exceed
    ``max_tensor_elements``. An empty shape is bounded too: torch computes its
    strides from the other dims, and ``[0, 2**62, 2**62]`` overflows them. Its
    length must not exceed ``max_rank`` (checked first: O(1) however long it is).
    """
    if shape is None:
        return None
    if len(shape) > _LIMITS["max_rank"]:
        return rank_problem(len(shape), f"{what} {_short(shape)}")
    for d in shape:
        if d < -1:
            return f"{what} {_short(shape)} has dimension {_short_int(d)}; dims are -1 (any " \
                   "size) or >= 0"
    numel = 1
    for d in shape:
        numel *= max(d, 1)
        if numel > _LIMITS["max_tensor_elements"]:  # stop early: the product can be huge
            if 0 in shape:
                return numel_problem(numel, f"{what} {_short(shape)} is empty, but its other "
                                            "dims would size one that")
            return numel_problem(numel, f"{what} {_short(shape)}")
    return None


def _short_int(v):
    return str(v) if v.bit_length() <= 64 else ("-" if v < 0 else "") + "<huge>"


def _short(shape):
    text = "[" + ", ".join(_short_int(d) for d in shape[:8]) + (", ...]" if len(shape) > 8 else "]")
    return text if len(text) <= 60 else text[:57] + "...]"


def cap_sizes(sizes, op_type):
    """``sizes`` (a size list computed at run time) if their product fits one tensor.

    ``ProgramError`` otherwise: a program could ask for ``s0**4`` elements through
    four batch-sized factors, each of which is within bounds on its own.
    """
    numel = 1
    for d in sizes:
        if type(d) is int and d > 0:
            numel *= d
    problem = numel_problem(numel, f"the size list {list(sizes[:8])} of op {op_type!r}")
    if problem is not None:
        from .errors import ProgramError
        raise ProgramError(problem)
    return sizes
