"""The elements of a block: ``VarDesc``, ``OpDesc``, their attribute values and roles.

The leaf of the program IR: it imports nothing of ``ssaexec.program``, so the modules
that read a program (its checks, its JSON and text writers) and the ones that hold it
(``blockdesc``, ``desc``) all import from here, and no import goes round.

Policy and invariants:

* attribute values are normalised on the way in (``normalize_attr``: tuples become
  lists, dtypes their names), so two programs built the same way compare equal and
  serialise identically; a sub-block is referred to by ``BlockRef``;
* op slots hold lists of non-empty var names (``set_slot`` normalises a slot edit);
* the gradient of var ``x`` is named ``x@GRAD`` (``grad_var_name``);
* a ``VarDesc``/``OpDesc`` is plain and, once in a block, changed only through the
  block's methods (``ssaexec.program.blockdesc``), which bump the program's version.
"""

import torch

from ..core.dtypes import dtype_name
from ..core.errors import ProgramError
from ..ops.registry import EMPTY_VAR

__all__ = ["ROLES", "GRAD_SUFFIX", "grad_var_name", "BlockRef", "normalize_attr", "VarDesc",
           "OpDesc", "renumber_block_refs", "set_slot"]

# 'loss' marks the op that seeds loss@GRAD; the graph builder swaps it for a
# ScaleLossGrad handle. 'optimize' ops update parameters.
ROLES = ("forward", "backward", "optimize", "loss")

GRAD_SUFFIX = "@GRAD"


def grad_var_name(name):
    """Return the name of the gradient variable of ``name`` (``name@GRAD``)."""
    return name + GRAD_SUFFIX

class BlockRef:
    """An attribute value that refers to a sub-block by index."""

    __slots__ = ("idx",)

    def __init__(self, idx):
        self.idx = int(idx)

    def __eq__(self, other):
        return isinstance(other, BlockRef) and other.idx == self.idx

    def __hash__(self):
        return hash(("BlockRef", self.idx))

    def __repr__(self):
        return f"BlockRef({self.idx})"


def normalize_attr(value):
    """Return ``value`` in the canonical attribute form (lists, not tuples)."""
    if isinstance(value, (list, tuple)):
        return [normalize_attr(v) for v in value]
    if isinstance(value, torch.dtype):
        return dtype_name(value)
    if value is None or isinstance(value, (bool, int, float, str, BlockRef)):
        return value
    # numpy scalars and the like
    if hasattr(value, "item"):
        return value.item()
    raise ProgramError(f"attribute value {value!r} of type {type(value).__name__} is not "
                       "supported; use int, float, bool, str, None, lists of them or BlockRef")


class VarDesc:
    """A variable: name, static shape (-1 for the batch dimension) and dtype.

    ``persistable`` vars outlive a run (parameters, optimizer state); ``is_data``
    vars are fed by the user; ``stop_gradient`` vars get no gradient.
    """

    __slots__ = ("name", "shape", "dtype", "persistable", "is_parameter", "stop_gradient",
                 "is_data")

    def __init__(self, name, shape=None, dtype="float32", persistable=False,
                 is_parameter=False, stop_gradient=False, is_data=False):
        if not isinstance(name, str) or not name:
            raise ProgramError(f"variable name must be a non-empty string, got {name!r}")
        self.name = name
        self.shape = None if shape is None else [int(d) for d in shape]
        self.dtype = dtype_name(dtype)
        self.persistable = bool(persistable)
        self.is_parameter = bool(is_parameter)
        self.stop_gradient = bool(stop_gradient)
        self.is_data = bool(is_data)

    def _key(self):
        return tuple(getattr(self, s) for s in self.__slots__)

    def __eq__(self, other):
        return isinstance(other, VarDesc) and self._key() == other._key()

    def __repr__(self):
        return f"VarDesc({self.name!r}, shape={self.shape}, dtype={self.dtype!r})"

    @property
    def numel(self):
        """Number of elements, counting a -1 dimension as 1; None when unknown."""
        if self.shape is None:
            return None
        n = 1
        for d in self.shape:
            n *= max(d, 1)
        return n


class OpDesc:
    """One operator: type, named input/output slots of var names, attributes, role.

    ``role_var`` holds (parameter, gradient) pairs on the ops that produce a
    parameter's final gradient; the graph builder puts an all-reduce after them.
    ``pos`` is ``(source, line, column)`` of the op in the file it was read from
    (None for ops built in Python): validation errors name it. It is no part of
    the op's value (equality, the saved forms).
    """

    __slots__ = ("type", "inputs", "outputs", "attrs", "role", "role_var", "pos")

    def __init__(self, type, inputs=None, outputs=None, attrs=None, role="forward",
                 role_var=None):
        if role not in ROLES:
            raise ProgramError(f"op {type!r}: unknown role {role!r}; expected one of {ROLES}")
        self.type = type
        self.inputs = {k: _names(v, type, k) for k, v in (inputs or {}).items()}
        self.outputs = {k: _names(v, type, k) for k, v in (outputs or {}).items()}
        self.attrs = {k: normalize_attr(v) for k, v in (attrs or {}).items()}
        self.role = role
        self.role_var = [tuple(p) for p in (role_var or [])]
        self.pos = None

    def input(self, slot):
        """Var names in input slot ``slot`` (empty list when absent)."""
        return self.inputs.get(slot, [])

    def output(self, slot):
        """Var names in output slot ``slot`` (empty list when absent)."""
        return self.outputs.get(slot, [])

    def input_names(self):
        """All input var names, in slot order."""
        return [n for ns in self.inputs.values() for n in ns]

    def output_names(self):
        """All output var names, in slot order, without the empty marker."""
        return [n for ns in self.outputs.values() for n in ns if n != EMPTY_VAR]

    def sub_blocks(self):
        """Indices of the sub-blocks this op's attributes refer to."""
        out = []
        for v in self.attrs.values():
            if isinstance(v, BlockRef):
                out.append(v.idx)
            elif isinstance(v, list):
                out.extend(x.idx for x in v if isinstance(x, BlockRef))
        return out

    def _key(self):
        return (self.type, self.inputs, self.outputs, self.attrs, self.role, self.role_var)

    def __eq__(self, other):
        return isinstance(other, OpDesc) and self._key() == other._key()

    def __repr__(self):
        return f"OpDesc({self.type!r}, inputs={self.inputs}, outputs={self.outputs})"


def renumber_block_refs(op, mapping):
    """Point ``op``'s ``BlockRef`` attributes at the blocks' new indices (``mapping``)."""
    for k, v in op.attrs.items():
        if isinstance(v, BlockRef):
            op.attrs[k] = BlockRef(mapping[v.idx])
        elif isinstance(v, list) and any(isinstance(x, BlockRef) for x in v):
            op.attrs[k] = [BlockRef(mapping[x.idx]) if isinstance(x, BlockRef) else x
                           for x in v]


def set_slot(slots, op_type, slot, names):
    """Make ``slots[slot]`` hold ``names`` (normalised to var names); None drops the slot."""
    if names is None:
        slots.pop(slot, None)
    else:
        slots[slot] = _names(names, op_type, slot)


def _names(value, op_type, slot):
    if isinstance(value, str):
        value = [value]
    elif hasattr(value, "name") and not isinstance(value, (list, tuple)):
        value = [value.name]
    out = []
    for v in value:
        name = v.name if hasattr(v, "name") else v
        if not isinstance(name, str) or not name:
            raise ProgramError(f"op {op_type!r} slot {slot!r}: var names must be non-empty "
                               f"strings, got {v!r}")
        out.append(name)
    return out
