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

Edits go through this API, and only through it (issue 31):

* ``ProgramDesc.version`` counts the edits made through the methods of this module;
  executors cache the plans they compile from a program under it. Every method that
  changes what a program computes (vars, ops, op slots and attributes, blocks) bumps
  it here, and nothing else can: ``_version`` is a read-only property (writing it
  raises ``AttributeError``), backed by a private slot only this module writes.
* ``BlockDesc.ops`` is an ``OpList``, a live read-only view of the block's op list:
  it reads like a list (index, slice, iterate, ``index``) and follows later edits,
  but has no ``append``/``pop``/item assignment, so a caller cannot reorder or drop
  ops behind the version's back. Edit with ``append_op``, ``add_op``, ``insert_op``,
  ``remove_op``, ``replace_op``, or assign ``block.ops = [...]`` (replaces them all).
* Name counters (``unique_name``, ``next_count``, ``set_name_counts``) and the
  builder's current block (``switch_block``) are changed through methods too; they
  do not bump the version, as neither changes what the program computes.
* ``VarDesc`` and ``OpDesc`` objects stay plain and immutable by convention once in a
  block: change an op with ``BlockDesc.set_attr``/``set_input``/``set_output``/
  ``add_role_var``/``remove_role_var`` and a var with ``update_var``, ``add_var`` or
  ``rename_var``. A fresh copy not yet added is the caller's to shape. ``BlockDesc.vars``
  is a plain dict, for reading.
* Programs compare equal by value (their serialisations) and are NOT hashable by
  value: ``__hash__`` is identity, because a program is mutable and the executors'
  caches key on the object (``id``, weak references), never on its contents.
"""

import contextlib
import copy
import types
from collections.abc import Sequence

import torch

from ..dtypes import DTYPES, dtype_name, torch_dtype
from ..errors import ProgramError
from ..ops.registry import EMPTY_VAR, get_op_def

__all__ = ["DTYPES", "ROLES", "EMPTY_VAR", "BlockRef", "VarDesc", "OpDesc", "OpList",
           "BlockDesc", "ProgramDesc", "Program", "grad_var_name", "register_test_rewrite",
           "torch_dtype", "dtype_name"]

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


def renumber_block_refs(op, mapping):
    """Point ``op``'s ``BlockRef`` attributes at the blocks' new indices (``mapping``)."""
    for k, v in op.attrs.items():
        if isinstance(v, BlockRef):
            op.attrs[k] = BlockRef(mapping[v.idx])
        elif isinstance(v, list) and any(isinstance(x, BlockRef) for x in v):
            op.attrs[k] = [BlockRef(mapping[x.idx]) if isinstance(x, BlockRef) else x
                           for x in v]


def _set_slot(slots, op_type, slot, names):
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


class OpList(Sequence):
    """A live, read-only view of a block's ops (see the module docstring).

    Reads like a list and follows the block's later edits; a slice is a new list (a
    copy, as for a list: editing it leaves the block as it is).
    """

    __slots__ = ("_ops",)

    def __init__(self, ops):
        self._ops = ops

    def __getitem__(self, index):
        return self._ops[index]  # a slice of a list is a copy already

    def __len__(self):
        return len(self._ops)

    def __iter__(self):
        return iter(self._ops)

    def __reversed__(self):
        return reversed(self._ops)

    def __contains__(self, op):
        return op in self._ops

    def index(self, op, *args):
        return self._ops.index(op, *args)

    def __eq__(self, other):
        if isinstance(other, (OpList, list, tuple)):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None

    def __repr__(self):
        return f"OpList({self._ops!r})"

    def _refuse(self, *args, **kwargs):
        raise TypeError("BlockDesc.ops is read-only: edit a block with append_op, add_op, "
                        "insert_op, remove_op or replace_op (or assign block.ops = [...]), "
                        "which keep the program's version")

    append = extend = insert = pop = remove = clear = sort = reverse = _refuse
    __setitem__ = __delitem__ = __iadd__ = _refuse


class BlockDesc:
    """A block: ordered vars and ops, and the index of its parent block (-1 for none).

    ``ops`` is a read-only ``OpList``; assigning ``block.ops = [...]`` replaces every
    op (and bumps the version).
    """

    __slots__ = ("program", "idx", "parent_idx", "vars", "_ops", "_ops_view")

    def __init__(self, program, idx, parent_idx=-1):
        self.program = program
        self.idx = idx
        self.parent_idx = parent_idx
        self.vars = {}
        self._ops = []
        self._ops_view = OpList(self._ops)

    @property
    def ops(self):
        """The block's ops in program order (a live read-only ``OpList``)."""
        return self._ops_view

    @ops.setter
    def ops(self, ops):
        self._ops[:] = list(ops)
        self.program._touch()

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
        self.program._touch()
        return var

    def add_var(self, var):
        """Add an existing ``VarDesc`` (replacing one of the same name)."""
        self.vars[var.name] = var
        self.program._touch()
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
        self.program._touch()
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
        self.program._touch()

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
        self.program._touch()

    def remove_role_var(self, op, param, grad):
        """Drop the pair ``(param, grad)`` from ``op``'s ``role_var`` (an op of this block)."""
        op.role_var = [pair for pair in op.role_var if pair != (param, grad)]
        self.program._touch()

    def update_var(self, name, **fields):
        """Change fields of the var ``name`` declared in this block; return its ``VarDesc``.

        Parameters
        ----------
        name : str
            A var declared in this block (not an ancestor).
        **fields
            ``VarDesc`` fields and their new values (``dtype="float16"``,
            ``is_data=True``), normalised as the constructor does.

        Raises
        ------
        ProgramError
            When ``name`` is not declared here, or a field is not a ``VarDesc`` field.
        """
        var = self.vars.get(name)
        if var is None:
            raise ProgramError(f"block {self.idx}: var {name!r} is not declared here")
        unknown = sorted(set(fields) - set(VarDesc.__slots__))
        if unknown:
            raise ProgramError(f"block {self.idx}: var {name!r} has no field {unknown[0]!r}")
        new = VarDesc(name, **{s: fields.get(s, getattr(var, s)) for s in VarDesc.__slots__
                               if s != "name"})
        for s in VarDesc.__slots__:
            setattr(var, s, getattr(new, s))  # in place: holders of the VarDesc see it
        self.program._touch()
        return var

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
        return self.add_op(OpDesc(type, inputs, outputs, attrs, role, role_var))

    def add_op(self, op):
        """Append an existing ``OpDesc`` and return it."""
        self._ops.append(op)
        self.program._touch()
        return op

    def insert_op(self, index, op):
        """Insert an existing ``OpDesc`` at ``index``."""
        self._ops.insert(index, op)
        self.program._touch()
        return op

    def _position(self, op):
        for i, o in enumerate(self._ops):
            if o is op:
                return i
        raise ProgramError(f"block {self.idx}: {op!r} is not an op of this block")

    def remove_op(self, op):
        """Remove ``op`` (an ``OpDesc`` of this block, found by identity) and return it."""
        del self._ops[self._position(op)]
        self.program._touch()
        return op

    def replace_op(self, op, new_ops):
        """Put the ops of ``new_ops`` (a sequence of ``OpDesc``) where ``op`` was.

        Parameters
        ----------
        op : OpDesc
            An op of this block, found by identity.
        new_ops : sequence of OpDesc
            Its replacements, in order (empty: ``op`` is dropped).

        Raises
        ------
        ProgramError
            When ``op`` is not an op of this block.
        """
        at = self._position(op)
        self._ops[at:at + 1] = list(new_ops)
        self.program._touch()

    def set_attr(self, op, name, value):
        """Set attribute ``name`` of ``op`` (an op of this block) to ``value``."""
        op.attrs[name] = normalize_attr(value)
        self.program._touch()

    def set_input(self, op, slot, names):
        """Make input slot ``slot`` of ``op`` (an op of this block) read ``names``
        (None: drop the slot)."""
        _set_slot(op.inputs, op.type, slot, names)
        self.program._touch()

    def set_output(self, op, slot, names):
        """Make output slot ``slot`` of ``op`` (an op of this block) write ``names``
        (None: drop the slot)."""
        _set_slot(op.outputs, op.type, slot, names)
        self.program._touch()

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

    __slots__ = ("blocks", "random_seed", "trusted", "_edits", "_name_counts",
                 "_current_block", "__weakref__")

    def __init__(self, random_seed=0):
        self.blocks = []
        self.random_seed = int(random_seed)
        self.trusted = False
        self._edits = 0
        self._name_counts = {}
        self._current_block = 0
        self.blocks.append(BlockDesc(self, 0, -1))

    # --- version ------------------------------------------------------------------------
    @property
    def version(self):
        """How many edits this program has had; caches of compiled plans key on it."""
        return self._edits

    @property
    def _version(self):
        # the name the executors' caches have always read; read-only like ``version``
        return self._edits

    @_version.setter
    def _version(self, value):
        raise AttributeError("ProgramDesc._version is read-only: edit the program through "
                             "its ProgramDesc/BlockDesc methods, which bump the version "
                             "(ssaexec.program.desc)")

    def _touch(self):
        self._edits += 1

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

    @contextlib.contextmanager
    def switch_block(self, idx):
        """``with program.switch_block(idx):`` makes block ``idx`` the current block and
        restores the previous one on the way out (exception or not)."""
        self.block(idx)  # raises for a block that does not exist
        saved, self._current_block = self._current_block, idx
        try:
            yield self.blocks[idx]
        finally:
            self._current_block = saved

    def keep_blocks(self, kept):
        """Keep only the blocks ``kept`` (old indices, block 0 among them), renumbered.

        Block ``kept[k]`` becomes block ``k``; parents and ``BlockRef`` attributes are
        renumbered (a parent that is dropped becomes -1) and block 0 becomes current.

        Returns
        -------
        dict
            The mapping old index -> new index.
        """
        mapping = {old: new for new, old in enumerate(kept)}
        if mapping.get(0) != 0:
            raise ProgramError(f"keep_blocks: block 0 must be kept first, got {list(kept)}")
        blocks = [self.blocks[old] for old in kept]
        for b in blocks:
            b.idx = mapping[b.idx]
            b.parent_idx = mapping.get(b.parent_idx, -1) if b.parent_idx >= 0 else -1
            for op in b._ops:
                renumber_block_refs(op, mapping)
        self.blocks = blocks
        self._current_block = 0
        self._touch()
        return mapping

    def create_block(self, parent_idx=None):
        """Append a new block whose parent is ``parent_idx`` (default: current block)."""
        parent = self._current_block if parent_idx is None else parent_idx
        block = BlockDesc(self, len(self.blocks), parent)
        self.blocks.append(block)
        self._touch()
        return block

    @property
    def num_blocks(self):
        return len(self.blocks)

    # --- naming -------------------------------------------------------------------------
    def unique_name(self, prefix):
        """A fresh name ``prefix_N``; counters live on the program, so builds repeat."""
        return f"{prefix}_{self.next_count(prefix)}"

    def next_count(self, prefix):
        """The counter of ``prefix`` (0 the first time), counted up by one."""
        n = self._name_counts.get(prefix, 0)
        self._name_counts[prefix] = n + 1
        return n

    @property
    def name_counts(self):
        """The name counters, read-only (prefix -> next N)."""
        return types.MappingProxyType(self._name_counts)

    def set_name_counts(self, counts):
        """Replace the name counters (a program read from a file restores its own)."""
        self._name_counts = {str(k): int(v) for k, v in dict(counts).items()}

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
            nb._ops[:] = [copy.deepcopy(op) for op in b._ops]
            new.blocks.append(nb)
        new._name_counts = dict(self._name_counts)
        if for_test:
            for b in new.blocks:
                b._ops[:] = [op for op in b._ops if op.role == "forward"]
                for op in b._ops:
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
        """Equal by value: the same serialisation (``to_dict``)."""
        if not isinstance(other, ProgramDesc):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    # Not hashable by value: a program is edited in place, so a value hash would change
    # under a dict key. The hash is the identity, and equal programs may hash apart;
    # caches key on the object (id, weak references), never on the value.
    __hash__ = object.__hash__

    def __str__(self):
        from .text import program_to_text
        return program_to_text(self)

    def __repr__(self):
        return f"<Program blocks={len(self.blocks)} ops={len(self.global_block().ops)}>"


Program = ProgramDesc
