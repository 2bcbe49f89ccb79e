"""The device-agnostic program description: ProgramDesc, BlockDesc, VarDesc, OpDesc.

A program is a list of blocks; block 0 is the global block and every other block
names its parent. A block declares variables (``VarDesc``) and lists operators
(``OpDesc``) in program order. Operators name their inputs and outputs by slot,
each slot holding a list of variable names; attributes are plain values
(int, float, bool, str, lists of those, ``None``) or ``BlockRef`` to a sub-block.

Invariants kept by this module:

* names within a block are unique; lookups fall back to ancestor blocks;
* attribute values are normalised on the way in (tuples become lists), so two
  programs built the same way compare equal and serialise identically;
* the description holds no tensors and no device: the graph builder and the
  executors decide where things run.

``_version`` counts mutations made through this API so executors can cache the
plans they compile from a program.
"""

import copy

import torch

from ..dtypes import DTYPES, dtype_name, torch_dtype
from ..errors import ProgramError
from ..ops.registry import EMPTY_VAR, get_op_def

__all__ = ["DTYPES", "ROLES", "EMPTY_VAR", "BlockRef", "VarDesc", "OpDesc", "BlockDesc",
           "ProgramDesc", "Program", "grad_var_name", "register_test_rewrite", "torch_dtype",
           "dtype_name"]

# 'loss' marks the op that seeds loss@GRAD; the graph builder swaps it for a
# ScaleLossGrad handle. 'optimize' ops update parameters.
ROLES = ("forward", "backward", "optimize", "loss")

GRAD_SUFFIX = "@GRAD"


def grad_var_name(name):
    """Return the name of the gradient variable of ``name`` (``name@GRAD``)."""
    return name + GRAD_SUFFIX


# Rewrites ``clone(for_test=True)`` applies to every clone after dropping the training
# ops, for op types the program layer knows nothing of: the torch importer registers
# ``ssaexec.frontends.torch.evalmode.to_inference`` (imported batch norm on running
# statistics, dropout off). Registration keeps the layers: program/ imports no frontend.
_TEST_REWRITES = []


def register_test_rewrite(fn):
    """Have ``clone(for_test=True)`` call ``fn(program)`` on each clone; returns ``fn``.

    ``fn`` rewrites the forward-only clone in place and must leave programs
    without its ops unchanged. Registering the same function again does nothing.
    """
    if fn not in _TEST_REWRITES:
        _TEST_REWRITES.append(fn)
    return fn


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


class BlockDesc:
    """A block: ordered vars and ops, and the index of its parent block (-1 for none)."""

    __slots__ = ("program", "idx", "parent_idx", "vars", "ops")

    def __init__(self, program, idx, parent_idx=-1):
        self.program = program
        self.idx = idx
        self.parent_idx = parent_idx
        self.vars = {}
        self.ops = []

    @property
    def parent(self):
        """The parent block, or None for the global block."""
        return None if self.parent_idx < 0 else self.program.blocks[self.parent_idx]

    def create_var(self, name, shape=None, dtype="float32", **kwargs):
        """Declare a var in this block and return its ``VarDesc`` (error if it exists)."""
        if name in self.vars:
            raise ProgramError(f"block {self.idx}: var {name!r} is already declared")
        var = VarDesc(name, shape, dtype, **kwargs)
        self.vars[name] = var
        self.program._version += 1
        return var

    def add_var(self, var):
        """Add an existing ``VarDesc`` (replacing one of the same name)."""
        self.vars[var.name] = var
        self.program._version += 1
        return var

    def remove_var(self, name):
        """Remove the declaration of ``name`` from this block.

        Parameters
        ----------
        name : str
            A var declared in this block (not an ancestor).

        Returns
        -------
        VarDesc
            The removed declaration. Ops that name ``name`` are left as they are.

        Raises
        ------
        ProgramError
            When ``name`` is not declared in this block.
        """
        if name not in self.vars:
            raise ProgramError(f"block {self.idx}: var {name!r} is not declared here")
        self.program._version += 1
        return self.vars.pop(name)

    def rename_var(self, old, new):
        """Rename var ``old`` to ``new`` throughout this block.

        Every input and output slot and every ``role_var`` entry of this block's
        ops that names ``old`` names ``new`` afterwards. When ``old`` is declared
        in this block, its ``VarDesc`` takes the new name (and becomes the block's
        last declaration); otherwise only the references change, which merges
        ``old`` into an existing ``new`` after ``remove_var(old)``.

        Parameters
        ----------
        old, new : str
            The current and the new var name.

        Raises
        ------
        ProgramError
            When both ``old`` and ``new`` are declared in this block.
        """
        if old in self.vars:
            if new in self.vars:
                raise ProgramError(f"block {self.idx}: cannot rename var {old!r} to {new!r}, "
                                   "which is already declared")
            var = self.vars.pop(old)
            var.name = new
            self.vars[new] = var

        def swap(names):
            return [new if n == old else n for n in names]

        for op in self.ops:
            op.inputs = {k: swap(v) for k, v in op.inputs.items()}
            op.outputs = {k: swap(v) for k, v in op.outputs.items()}
            op.role_var = [tuple(swap(pair)) for pair in op.role_var]
        self.program._version += 1

    def add_role_var(self, op, param, grad):
        """Record that ``op`` writes ``grad``, the final gradient of parameter ``param``.

        Parameters
        ----------
        op : OpDesc
            An op of this block; the pair is appended to its ``role_var``.
        param, grad : str
            The parameter's and its gradient's var names.

        Raises
        ------
        ProgramError
            When ``op`` is not an op of this block.
        """
        if not any(o is op for o in self.ops):
            raise ProgramError(f"block {self.idx}: {op!r} is not an op of this block")
        op.role_var = op.role_var + [(param, grad)]
        self.program._version += 1

    def has_var(self, name):
        """True when ``name`` is declared in this block or an ancestor."""
        return self.find_var(name) is not None

    def find_var(self, name):
        """The ``VarDesc`` for ``name`` here or in an ancestor block, else None."""
        block = self
        while block is not None:
            var = block.vars.get(name)
            if var is not None:
                return var
            block = block.parent
        return None

    def var(self, name):
        """Like ``find_var`` but raises ``ProgramError`` when the var is not declared."""
        var = self.find_var(name)
        if var is None:
            raise ProgramError(f"block {self.idx}: var {name!r} is not declared")
        return var

    def append_op(self, type, inputs=None, outputs=None, attrs=None, role="forward",
                  role_var=None):
        """Append an ``OpDesc`` and return it."""
        op = OpDesc(type, inputs, outputs, attrs, role, role_var)
        self.ops.append(op)
        self.program._version += 1
        return op

    def insert_op(self, index, op):
        """Insert an existing ``OpDesc`` at ``index``."""
        self.ops.insert(index, op)
        self.program._version += 1
        return op

    def remove_op(self, op):
        """Remove ``op`` (an ``OpDesc`` of this block, found by identity) and return it."""
        for i, o in enumerate(self.ops):
            if o is op:
                del self.ops[i]
                self.program._version += 1
                return op
        raise ProgramError(f"block {self.idx}: {op!r} is not an op of this block")

    def __repr__(self):
        return f"BlockDesc(idx={self.idx}, parent={self.parent_idx}, vars={len(self.vars)}, " \
               f"ops={len(self.ops)})"


class ProgramDesc:
    """A whole program: blocks (block 0 global), a random seed and name counters.

    ``print(program)`` shows the text form; ``se.save_program`` writes JSON or
    text; ``validate()`` checks it and raises ``ProgramError`` naming the culprit.

    ``trusted`` is True only for a program ssaexec built in this process from the
    caller's own Python objects (``se.from_torch``); its ATen ops then skip the
    kernel guards (``ssaexec.ops.guards``), which cost time at run time. It is
    never read from a file, and copies keep it: a program file, or anything read
    from one (Paddle's too), runs guarded.
    """

    __slots__ = ("blocks", "random_seed", "trusted", "_version", "_name_counts",
                 "_current_block", "__weakref__")

    def __init__(self, random_seed=0):
        self.blocks = []
        self.random_seed = int(random_seed)
        self.trusted = False
        self._version = 0
        self._name_counts = {}
        self._current_block = 0
        self.blocks.append(BlockDesc(self, 0, -1))

    # --- blocks -------------------------------------------------------------------------
    def global_block(self):
        """Block 0."""
        return self.blocks[0]

    def block(self, idx):
        """Block ``idx`` (``ProgramError`` if there is none)."""
        if not 0 <= idx < len(self.blocks):
            raise ProgramError(f"program has {len(self.blocks)} blocks; no block {idx}")
        return self.blocks[idx]

    def current_block(self):
        """The block the builder appends to."""
        return self.blocks[self._current_block]

    def create_block(self, parent_idx=None):
        """Append a new block whose parent is ``parent_idx`` (default: current block)."""
        parent = self._current_block if parent_idx is None else parent_idx
        block = BlockDesc(self, len(self.blocks), parent)
        self.blocks.append(block)
        self._version += 1
        return block

    @property
    def num_blocks(self):
        return len(self.blocks)

    # --- naming -------------------------------------------------------------------------
    def unique_name(self, prefix):
        """A fresh name ``prefix_N``; counters live on the program, so builds repeat."""
        n = self._name_counts.get(prefix, 0)
        self._name_counts[prefix] = n + 1
        return f"{prefix}_{n}"

    # --- queries ------------------------------------------------------------------------
    def all_parameters(self):
        """Parameter ``VarDesc``s of the global block, in creation order."""
        return [v for v in self.global_block().vars.values() if v.is_parameter]

    def list_vars(self):
        """Every ``VarDesc`` of every block."""
        return [v for b in self.blocks for v in b.vars.values()]

    def data_vars(self):
        """The vars the user feeds (``is_data``), in declaration order."""
        return [v for v in self.global_block().vars.values() if v.is_data]

    # --- copies -------------------------------------------------------------------------
    def clone(self, for_test=False):
        """A deep copy. ``for_test=True`` drops backward/optimizer ops, sets ``is_test`` and
        applies the registered test rewrites (``register_test_rewrite``: imported batch
        norm on running statistics, imported dropout off)."""
        new = ProgramDesc(self.random_seed)
        new.trusted = self.trusted
        new.blocks = []
        for b in self.blocks:
            nb = BlockDesc(new, b.idx, b.parent_idx)
            nb.vars = {k: copy.copy(v) for k, v in b.vars.items()}
            nb.ops = [copy.deepcopy(op) for op in b.ops]
            new.blocks.append(nb)
        new._name_counts = dict(self._name_counts)
        if for_test:
            for b in new.blocks:
                b.ops = [op for op in b.ops if op.role == "forward"]
                for op in b.ops:
                    op_def = get_op_def(op.type, missing_ok=True)
                    if op_def is not None and "is_test" in op_def.attrs:
                        op.attrs["is_test"] = True
            for rewrite in _TEST_REWRITES:
                rewrite(new)
        return new

    def validate(self):
        """Check the program; raise ``ProgramError`` naming block, op, type and var."""
        from .validate import validate_program
        validate_program(self)
        return self

    def to_dict(self):
        """The JSON-ready dict form (see ``ssaexec.program.serialize``)."""
        from .serialize import program_to_dict
        return program_to_dict(self)

    def __eq__(self, other):
        if not isinstance(other, ProgramDesc):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    __hash__ = object.__hash__

    def __str__(self):
        from .text import program_to_text
        return program_to_text(self)

    def __repr__(self):
        return f"<Program blocks={len(self.blocks)} ops={len(self.global_block().ops)}>"


Program = ProgramDesc
