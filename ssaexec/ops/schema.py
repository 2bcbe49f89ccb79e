"""Reading ATen schemas: overload lookup and the encoding kind of each argument.

A leaf of ``ops/``: the operator policy (``policy.py``) and the generic ATen kernels
(``aten.py``) both read schemas through it. Kinds: ``tensor``, ``tensor_list``, ``size``
(ints, floats, numbers and lists of them), ``dtype``, ``layout``, ``memory_format``,
``device``, ``literal`` (bools, strings), ``generator`` — each a string — and
``Unsupported(<type>)`` for a schema type ssaexec cannot encode. The last is a type, not a
string prefix, so callers ask ``isinstance(kind, Unsupported)`` and read ``kind.type``
instead of slicing a string.
"""

import torch

__all__ = ["SYM_ATTR", "MEMORY_FORMATS", "LAYOUTS", "Unsupported", "resolve_overload",
           "arg_kinds"]

SYM_ATTR = "@sym"

MEMORY_FORMATS = {"preserve_format": torch.preserve_format,
                  "contiguous_format": torch.contiguous_format,
                  "channels_last": torch.channels_last,
                  "channels_last_3d": torch.channels_last_3d}
LAYOUTS = {"strided": torch.strided}


class Unsupported:
    """The kind of a schema argument whose type ssaexec cannot encode.

    Immutable; two are equal when they name the same schema type, and neither equals
    any of the string kinds.

    Parameters
    ----------
    type : str
        The schema type as torch spells it (``"Storage"``, ``"Optional[Stream]"``).
    """

    __slots__ = ("type",)

    def __init__(self, type):
        object.__setattr__(self, "type", str(type))

    def __setattr__(self, name, value):
        raise AttributeError(f"Unsupported is immutable; cannot set {name!r}")

    __delattr__ = __setattr__

    def __reduce__(self):
        # copy and pickle would otherwise restore the slot through the refused __setattr__
        return Unsupported, (self.type,)

    def __eq__(self, other):
        return isinstance(other, Unsupported) and other.type == self.type

    def __hash__(self):
        return hash((Unsupported, self.type))

    def __repr__(self):
        return f"Unsupported({self.type!r})"


def resolve_overload(type):
    """The ``torch._ops.OpOverload`` named by ``aten.<name>.<overload>``, else None."""
    parts = type.split(".")
    if len(parts) != 3 or parts[0] != "aten" or not all(parts):
        return None
    packet = getattr(torch.ops.aten, parts[1], None)
    if packet is None or not hasattr(packet, "overloads"):
        return None
    if parts[2] not in packet.overloads():
        return None
    return getattr(packet, parts[2])


def _kind(arg):
    """The encoding kind of one schema argument (see the module docstring)."""
    t = str(arg.real_type)
    optional = t.startswith("Optional[")
    if optional:
        t = t[len("Optional["):-1]
    if t == "Tensor":
        return "tensor"
    if t in ("List[Tensor]", "List[Optional[Tensor]]"):
        return "tensor_list"
    if t in ("int", "SymInt", "float", "number", "List[int]", "List[SymInt]", "List[float]"):
        return "size"
    if t == "ScalarType":
        return "dtype"
    if t == "Layout":
        return "layout"
    if t == "MemoryFormat":
        return "memory_format"
    if t == "Device":
        return "device"
    if t in ("bool", "str", "List[bool]", "List[str]"):
        return "literal"
    if t == "Generator":
        return "generator"
    return Unsupported(t)


def arg_kinds(overload):
    """``[(name, kind, kwarg_only), ...]`` for every schema argument of ``overload``."""
    return [(a.name, _kind(a), a.kwarg_only) for a in overload._schema.arguments]
