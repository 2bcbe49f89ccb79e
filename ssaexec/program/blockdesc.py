"""A block of a program: ``BlockDesc`` and ``OpList``, the live read-only view of its ops.

Policy and invariants (the module docstring of ``ssaexec.program.desc`` has the whole
discipline):

* every method that changes what the block computes (vars, ops, op slots and
  attributes, role vars) calls ``program._touch()``, which bumps the program's
  version in ``ssaexec.program.desc``; this module writes no version of its own;
* ``BlockDesc.ops`` is an ``OpList``: it reads like a list and follows later edits,
  but cannot be edited; ``block.ops = [...]`` replaces every op (and bumps);
* names within a block are unique; lookups fall back to ancestor blocks.
"""

from collections.abc import Sequence

from ..core.errors import ProgramError
from .elements import OpDesc, VarDesc, normalize_attr, set_slot

__all__ = ["OpList", "BlockDesc"]


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
        set_slot(op.inputs, op.type, slot, names)
        self.program._touch()

    def set_output(self, op, slot, names):
        """Make output slot ``slot`` of ``op`` (an op of this block) write ``names``
        (None: drop the slot)."""
        set_slot(op.outputs, op.type, slot, names)
        self.program._touch()

    def __repr__(self):
        return f"BlockDesc(idx={self.idx}, parent={self.parent_idx}, vars={len(self.vars)}, " \
               f"ops={len(self.ops)})"
