"""Guards for ATen kernels that trust their arguments: checks that run before the kernel.

Policy. A program file is untrusted data (docs/security.md), and the operator
policy (``ssaexec.ops.policy``) lets it name allowlisted ATen overloads. Many of
torch's kernels check their arguments; some trust them and read or write out of
bounds, crash, hang or allocate without limit when they are wrong. ``TRUSTS``
names every allowlisted overload whose kernel trusts something a program
controls, and what:

==========  ===========================================================================
``index``   the values of an index tensor (``max_pool2d_with_indices_backward``
            writes at its ``indices`` unchecked: a heap write anywhere)
``shape``   the shapes of secondary inputs, or which optional ones are present:
            statistics of the norm kernels, attention's ``out``/``logsumexp``,
            ``_embedding_bag``'s offsets, a backward's ``grad_output``
``layout``  strides: the kernel reads some inputs as if they were contiguous
``size``    how much it allocates, from numbers the program gives (factories,
            padding, upsampling, ``expand``, ``repeat``, a convolution's padding)
``value``   an integer argument that indexes host memory (an FFT's ``dim``) or
            a flag whose wrong value dereferences an absent tensor
==========  ===========================================================================

Each listed overload gets a guard, run before the kernel on both execution
paths: ``ssaexec.ops.aten`` resolves an ATen type to a ``GuardedOverload``
(``guarded``), which the generic kernel calls and the compiled path
(``runtime/codegen.py``) emits a call to, exactly as it would the bare
``OpOverload``. A guard raises ``ProgramError`` naming the op, the argument and
the bound; at run time the executor reports it as an ``OpError`` of that op. A
``layout`` guard instead hands the kernel contiguous copies of strided inputs
(same values; an input that is already contiguous is passed as is).

The table was found with the kernel fuzzer (``tests/kernel_fuzz.py``), which
drives every allowlisted overload with hostile values; ops not listed either
check for themselves on the CPU or were never seen to misbehave. Index checks
of ops whose CPU kernels check (``gather``, ``index`` ...) run only on other
devices, where torch's checks are device-side asserts that end the process's
CUDA context; each costs a host synchronisation there.

Invariants:

* a guard reads its arguments and either returns or raises; it changes no value;
* ``shape``, ``size`` and ``value`` checks work on meta tensors, so shape
  inference (``validate``) runs them and a program whose declared shapes break
  them fails validation with the same message; ``index`` checks read values,
  skip meta tensors and cost one ``aminmax`` per index tensor at run time;
  traced for a compiler (``TRACED``), they are assertions in the compiled graph,
  with the same words, on every device (the compiler replaces the kernel, and
  with it the CPU kernel's own check);
* an op without a guard costs nothing: its ``OpOverload`` is called directly;
* a program ssaexec built in this process (``ProgramDesc.trusted``: ``from_torch``)
  calls the bare overload (``OpDef.bare_overload``/``bare_kernel``, chosen by
  ``OpDef.overload_for``/``kernel_for``); a program read from a file never does.

Hand-written ops. The kernels of ``ops.nn``, ``ops.math``, ``ops.sparse`` ... call ATen
overloads too, on the values of whatever program runs them (``batch_norm`` over 8
channels with 1-element statistics read and wrote past them). They call none directly:
each takes its callable from ``guards_hand.kernel(op_type)`` once, at import (a module
constant, so the hot path does no lookup): the overload behind its guard (a
``HandWrittenOverload``) when ``TRUSTS`` lists it, else the bare overload, since its
kernel checks for itself. Some of these overloads are not on the program allowlist
(``native_batch_norm`` writes the running statistics, of the op's own copies, in
place): their guards are marked ``hand_written`` (``HAND_WRITTEN_ONLY``). A hand-written
op's guard raises ``GuardError`` (not a ``ProgramError``): the executor reports it as an
``OpError`` of the program's op (``op #3 'batch_norm' on cpu:0``), and validation, which
runs the same kernels on meta tensors, as a ``ProgramError`` at that op. Hand-written
ops run guarded for every program: the ones ``from_torch`` builds (``trusted``) hold no
hand-written op that calls a guarded overload, so nothing is lost.
``tests/ops/test_handwritten_guards.py`` checks that no module outside this layer, the ATen
resolution and the torch frontend's capture names ``torch.ops``.

Layout. This module is the machinery: the kinds, ``TRUSTS``, the ``_guard``
registry, ``GuardedOverload``/``guarded`` and the checks the guards share (their
``_`` names are for the guard modules only). The guards themselves live by family,
each module registering its guards with ``@_guard`` when imported:
``guards_index`` (index values), ``guards_shape`` (statistics, secondary shapes and
the shapes convolutions make), ``guards_value`` (values that index host memory) and
``guards_size`` (what a kernel allocates). They import this module, never the other
way (no cycle): ``ssaexec/ops/__init__.py`` imports them, in that order, which
Python runs before any ``ssaexec.ops.<module>``, so every guard is registered
before ``guarded`` is first called. ``guards_hand`` hands hand-written ops their
kernels; it imports every family itself, since the kernel modules that call it are
imported before the families (and it after them). The index checks' host read stays here
(``_host_range``), where docs/security.md and the host-sync allowlist name it.
"""

import contextvars
import inspect
import math

import torch

from ..core.compat import assert_async
from ..core.errors import ProgramError
from ..core.limits import get_limit, numel_problem

__all__ = ["TRUSTS", "TRACED", "HAND_WRITTEN_ONLY", "GuardError", "GuardedOverload",
           "HandWrittenOverload", "guarded"]

# Set while a segment is traced for a compiler (runtime.inductor), to a context manager
# under which torch calls are not traced: a check that reads values on the host would
# run once, at trace time, and be gone from the compiled graph, so it is also traced as
# an assertion in the graph (``_assert``), run at every call. The trace runs the kernels
# on real values, so the check still runs then too, untraced, before the kernel.
TRACED = contextvars.ContextVar("ssaexec_guards_traced", default=None)

INDEX, SHAPE, LAYOUT, SIZE, VALUE = "index", "shape", "layout", "size", "value"

# op type -> (what its kernel trusts, the check in words); filled by @_guard in guards_*
TRUSTS = {}
_CHECKS = {}   # op type -> (check function, dense)
# guarded overloads that only hand-written ops call (a program may not name them)
HAND_WRITTEN_ONLY = set()


def _guard(*op_types, trusts, note, dense=False, hand_written=False):
    """Register ``fn(op, <schema argument names>...)`` as the guard of ``op_types``.

    ``hand_written``: the overloads are not on the program allowlist; only hand-written
    ops call them (through ``guards_hand.kernel``).

    ``dense``: the kernel ignores strides, so every tensor argument is made
    contiguous before the check and the call; ``"rows"``: the kernel reads outer
    strides but assumes the last dimension is dense, so only a tensor whose last
    stride is not 1 is copied (a contiguous copy would change the layout of the
    results, which a later ``view`` of the program may rely on: attention's output
    is a transposed view in eager torch).
    """
    def deco(fn):
        for t in op_types:
            TRUSTS[t] = (tuple(trusts), note)
            _CHECKS[t] = (fn, dense)
            if hand_written:
                HAND_WRITTEN_ONLY.add(t)
        return fn
    return deco


class GuardedOverload:
    """An ATen ``OpOverload`` with its guard: called like it, checks before the kernel.

    Keeps ``_schema`` (and ``overload``, the bare one), so code that reads the
    schema of what it calls (``arg_kinds``, the compiled path) needs no change.
    """

    __slots__ = ("overload", "op_type", "_schema", "_check", "_picks", "_dense")

    def __init__(self, op_type, overload, check, dense):
        self.overload = overload
        self.op_type = op_type
        self._schema = overload._schema
        self._check = check
        self._dense = dense
        args = overload._schema.arguments
        index = {a.name: i for i, a in enumerate(args)}
        names = list(inspect.signature(check).parameters)[1:]
        # (position, name, default) of each argument the check reads
        self._picks = tuple((index[n], n, _default(args[index[n]])) for n in names)

    def __call__(self, *args, **kwargs):
        if self._dense:
            rows = self._dense == "rows"
            args = tuple(_dense(a, rows) for a in args)
            kwargs = {k: _dense(v, rows) for k, v in kwargs.items()}
        n = len(args)
        self._check(self.op_type, *[args[i] if i < n else kwargs.get(name, d)
                                    for i, name, d in self._picks])
        return self.overload(*args, **kwargs)

    def __repr__(self):
        return f"<guarded {self.op_type}>"


class GuardError(ValueError):
    """A hand-written op's kernel call refused by its guard (see the module docstring).

    Not an ``SSAExecError``, on purpose: the executor wraps it in the ``OpError`` that
    names the program's op, and validation in the ``ProgramError`` that locates it.
    """


class HandWrittenOverload(GuardedOverload):
    """What a hand-written op calls: a ``GuardedOverload`` whose refusal is a ``GuardError``."""

    __slots__ = ()

    def __call__(self, *args, **kwargs):
        try:
            return GuardedOverload.__call__(self, *args, **kwargs)
        except ProgramError as e:  # only guards raise it: torch's kernels never do
            raise GuardError(str(e)) from None

    def __repr__(self):
        return f"<guarded {self.op_type} (hand-written ops)>"


def guarded(op_type, overload):
    """``overload`` wrapped in its guard when ``TRUSTS`` lists ``op_type``, else ``overload``."""
    hit = _CHECKS.get(op_type)
    if hit is None:
        return overload
    return GuardedOverload(op_type, overload, *hit)


def _default(arg):
    return arg.default_value if arg.has_default_value() else None


def _dense(v, rows=False):
    if isinstance(v, torch.Tensor):
        if rows and (v.dim() == 0 or v.stride(-1) == 1 or v.shape[-1] <= 1):
            return v
        return v if v.is_contiguous() else v.contiguous()
    if isinstance(v, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in v):
        return type(v)(_dense(x, rows) for x in v)
    return v


# --- helpers ----------------------------------------------------------------------------------
def _fail(op, text):
    raise ProgramError(_message(op, text))


def _message(op, text):
    return (f"op {op!r}: {text}; its kernel does not check this "
            "(ssaexec.ops.guards, docs/security.md)")


def _assert(op, cond, text):
    """While ``TRACED``: the check ``cond`` (a bool tensor) as an assertion in the graph."""
    assert_async(cond, _message(op, text))


def _shape(t):
    return list(t.shape)


def _numel(op, shape_or_count, what):
    """Refuse an allocation of more than ``max_tensor_elements`` elements.

    A shape counts its 0 dims as 1: an empty tensor may not have a dimension of
    2**62 either (its strides overflow).
    """
    if isinstance(shape_or_count, (list, tuple)):
        if any(d < 0 for d in shape_or_count):
            return  # the kernel refuses negative sizes itself
        n = math.prod(max(d, 1) for d in shape_or_count)
    else:
        n = shape_or_count
    if n > get_limit("max_tensor_elements"):
        problem = numel_problem(n, what)
        raise ProgramError(f"op {op!r}: {problem}")


def _ints(v):
    return [v] if isinstance(v, int) else list(v or [])


def _same_shape(op, name, t, want, other="what it belongs to"):
    if t is not None and _shape(t) != list(want):
        _fail(op, f"argument {name!r} has shape {_shape(t)}, not {list(want)} ({other})")


def _count(op, name, t, n, what):
    if t is not None and t.numel() != n:
        _fail(op, f"argument {name!r} has {t.numel()} elements ({_shape(t)}), not {n} ({what})")


def _index_range(op, name, t, lo, hi, what, cpu_checks=False):
    """Values of index tensor ``t`` in ``[lo, hi)``: one ``aminmax`` (skips meta tensors)."""
    if not isinstance(t, torch.Tensor) or t.numel() == 0 or t.device.type == "meta":
        return
    if t.dtype in (torch.bool, torch.uint8) or t.dtype.is_floating_point or t.is_complex():
        return  # masks and non-index dtypes: the kernel refuses or checks them itself
    untraced = TRACED.get()
    if untraced is not None:  # a compiler replaces the kernel and its checks
        with untraced():
            _host_range(op, name, t, lo, hi, what)  # the trace runs the kernel too
        mn, mx = torch.aminmax(t)
        _assert(op, (mn >= lo) & (mx < hi),
                f"argument {name!r} holds a value outside [{lo}, {hi}) ({what})")
    elif not (cpu_checks and t.device.type == "cpu"):
        # (a CPU kernel that checks for itself needs nothing; elsewhere its check is a
        # device-side assert)
        _host_range(op, name, t, lo, hi, what)


def _host_range(op, name, t, lo, hi, what):
    mn, mx = torch.aminmax(t)
    mn, mx = int(mn), int(mx)
    if mn < lo or mx >= hi:
        bad = mn if mn < lo else mx
        _fail(op, f"argument {name!r} holds {bad}, outside [{lo}, {hi}) ({what})")


def _dim(op, name, d, ndim):
    if not -max(ndim, 1) <= d < max(ndim, 1):
        _fail(op, f"argument {name!r} is {d}, not a dimension of a {ndim}-d tensor")
    return d % max(ndim, 1)
