"""Kernel guards, the door of hand-written ops: ``kernel(op_type)``.

A hand-written op (``ops.nn``, ``ops.math``, ``ops.sparse``) that calls an
ATen overload takes it from ``kernel`` once, when its module is imported, and keeps it
in a module constant: the hot path does no lookup. What it gets is the overload behind
its guard, a ``HandWrittenOverload``, when ``ssaexec.ops.guards.TRUSTS`` lists it, else
the bare ``OpOverload``, whose kernel checks its arguments itself. Policy and the
meaning of a refusal (``GuardError``: an ``OpError`` of the program's op at run time, a
``ProgramError`` at that op in validation) are ``ssaexec.ops.guards``'s.

``HAND_WRITTEN`` maps every overload a hand-written op calls to what it calls, for the
tests (tests/ops/test_handwritten_guards.py, tests/ops/test_kernel_guards.py) and for readers.

This module imports every guard family, so a guard is registered before ``kernel``
binds its overload: the kernel modules are imported (``ssaexec/ops/__init__.py``)
before the families are.
"""

from . import guards_index, guards_shape, guards_size, guards_value  # noqa: F401 (register)
from .guards import _CHECKS, HandWrittenOverload
from .schema import resolve_overload

__all__ = ["HAND_WRITTEN", "kernel"]

HAND_WRITTEN = {}  # op type -> the callable hand-written ops call for it


def kernel(op_type):
    """What a hand-written op calls for ATen overload ``op_type`` (``"aten.<name>.<overload>"``).

    Call it once, at import, and keep the result: the overload behind its guard (a
    ``HandWrittenOverload``) when ``TRUSTS`` lists it, else the bare ``OpOverload``.
    """
    hit = HAND_WRITTEN.get(op_type)
    if hit is not None:
        return hit
    overload = resolve_overload(op_type)
    if overload is None:
        raise LookupError(f"no ATen overload {op_type!r}")
    check = _CHECKS.get(op_type)
    hit = overload if check is None else HandWrittenOverload(op_type, overload, *check)
    return HAND_WRITTEN.setdefault(op_type, hit)
