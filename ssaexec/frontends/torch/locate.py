"""Locate: say where in the user's code a failure comes from.

Every ``ProgramError`` the importer raises names the construct and, where it can,
the module path (``module 'layer1.0' (BasicBlock)``) and the source line. Two
ways to find it:

* ``capture_error`` reads the traceback of an exception raised while tracing:
  the innermost frame whose ``self`` is a submodule gives the path, the
  innermost frame outside torch and ssaexec the ``file:line``;
* ``locate`` re-runs the forward eagerly and reports the module whose forward
  makes the first ATen call that matches a predicate (the failing op, an
  in-place write to an input or a parameter).

Policy and invariants:

* error path only: nothing here runs while an import succeeds, except
  ``written_args`` (which arguments an overload writes in place, read from its
  ``_schema``), the test the lowering refuses in-place ops with;
* best effort: when no module path can be found the text says
  ``module path unknown``, and an exception of the eager re-run is swallowed
  (the capture's error is the one to report);
* the user's module and inputs are never changed: ``locate`` runs a deep copy on
  copies of the inputs, under a dispatch mode with forward hooks on the copy, in the
  wrapper's ``trace_state`` (the capture's: ``torch.compiler.is_exporting()``), so
  model code takes the branches it took when traced;
* this module imports nothing else of the importer: ``wrapper`` is the capture's
  ``LossWrapper`` (``wrapper.module`` is the user's module, ``wrapper.around(m)``
  the same loss around module ``m``).
"""

import contextlib
import copy
import os
import traceback

import torch

from ...core.errors import ProgramError

__all__ = ["UNKNOWN", "capture_error", "locate", "locate_call", "locate_mutation",
           "written_args"]

UNKNOWN = "the forward (module path unknown)"

_DATA_DEPENDENT = frozenset({"GuardOnDataDependentSymNode", "DataDependentOutputException",
                             "DynamicOutputShapeException", "PendingUnbackedSymbolNotFound"})
# frames in here are ssaexec's, not the user's
_SSAEXEC_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def capture_error(exc, wrapper):
    """The ``ProgramError`` for an exception raised while tracing."""
    chain, e = [], exc
    while e is not None and e not in chain:
        chain.append(e)
        e = e.__cause__ or e.__context__
    for e in chain:
        if isinstance(e, ProgramError):
            return e
    data_dependent = any(type(e).__name__ in _DATA_DEPENDENT or "data-dependent" in str(e).lower()
                         or "data dependent" in str(e).lower() for e in chain)
    where = _where_in_traceback(chain, wrapper)
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if data_dependent:
        return ProgramError(
            f"from_torch: data-dependent control flow in {where}: the module branches on (or "
            "reads out) a tensor's value, e.g. `if x.sum() > 0`, `.item()`, `.tolist()` or "
            f"`nonzero`, which one program cannot express ({type(exc).__name__}: {first})")
    return ProgramError(f"from_torch: cannot capture {where}: {type(exc).__name__}: {first}")


def _module_paths(module):
    return {id(m): name for name, m in module.named_modules()}


def _unknown(module):
    return f"the forward of {type(module).__name__} (module path unknown)"


def _describe(path, module):
    """``module 'layer1.0' (BasicBlock)``, or ``the root module (ResNet)``."""
    if path:
        return f"module '{path}' ({type(module.get_submodule(path)).__name__})"
    return f"the root module ({type(module).__name__})"


def _where_in_traceback(chain, wrapper):
    """``module 'layer1.0' (BasicBlock) at file.py:42``: the innermost module frame."""
    module = wrapper.module
    paths = _module_paths(module)
    found, line = None, None
    torch_dir = torch.__file__.rsplit("/", 1)[0]
    for e in reversed(chain):
        for frame, lineno in traceback.walk_tb(e.__traceback__):
            owner = frame.f_locals.get("self")
            if owner is not None and id(owner) in paths:
                found = paths[id(owner)]
            fname = frame.f_code.co_filename
            if not fname.startswith((torch_dir, _SSAEXEC_DIR + os.sep)):
                line = f"{fname}:{lineno}"
    if found is None:
        return _unknown(module)
    return _describe(found, module) + (f" at {line}" if line else "")


def locate(wrapper, inputs, hit, fresh_inputs=True):
    """Where an eager run of the forward first makes an ATen call with ``hit(func, args)``.

    Error path only: runs a copy of the module (so buffers stay untouched)
    under a dispatch mode, with forward hooks tracking the module path.
    """
    from ...core.compat import TorchDispatchMode

    module = wrapper.module
    try:
        clone = copy.deepcopy(module)
    except Exception:  # noqa: BLE001 - best effort
        return _unknown(module)
    names = _module_paths(clone)
    inputs = {k: v.clone() for k, v in inputs.items()} if fresh_inputs else inputs
    stack, found = [], []

    def pre(m, args):
        stack.append(names[id(m)])

    def post(m, args, out):
        stack.pop()

    class Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not found and hit(func, args, kwargs or {}):
                found.append(stack[-1] if stack else None)
            return func(*args, **(kwargs or {}))

    handles = [m.register_forward_pre_hook(pre) for m in clone.modules()]
    handles += [m.register_forward_hook(post) for m in clone.modules()]
    w = wrapper.around(clone)
    state = getattr(wrapper, "trace_state", contextlib.nullcontext)
    try:
        with state(), Mode():  # as traced: model code takes the capture's branches
            w(*inputs.values())
    except Exception:  # noqa: BLE001 - the capture error is the one to report
        pass
    finally:
        for h in handles:
            h.remove()
    if found and found[0] is not None:
        return _describe(found[0], module)
    return _unknown(module)


def locate_call(wrapper, inputs, target):
    """Where an eager run of the forward first calls the ATen overload ``target``."""
    return locate(wrapper, inputs, lambda func, args, kwargs: func is target)


def written_args(func):
    """``[(position, name), ...]`` of the arguments ATen overload ``func`` writes in place."""
    schema = getattr(func, "_schema", None)
    if schema is None:
        return []
    return [(i, a.name) for i, a in enumerate(schema.arguments)
            if a.alias_info is not None and a.alias_info.is_write]


def locate_mutation(wrapper, inputs, input_name):
    """Where the forward first writes input ``input_name`` (None: a parameter) in place."""
    inputs = {k: v.clone() for k, v in inputs.items()}
    ptrs = {inputs[input_name].untyped_storage().data_ptr()} if input_name else None

    def hit(func, args, kwargs):
        for i, _ in written_args(func):
            v = args[i] if i < len(args) else None
            if isinstance(v, torch.Tensor):
                if ptrs is None:
                    return isinstance(v, torch.nn.Parameter)
                if v.untyped_storage().data_ptr() in ptrs:
                    return True
        return False

    return locate(wrapper, inputs, hit, fresh_inputs=False)

