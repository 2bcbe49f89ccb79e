"""The device-agnostic program description: ProgramDesc, the whole program.

The IR is three modules, bottom up: ``elements`` (``VarDesc``, ``OpDesc``, ``BlockRef``,
roles, attribute values, the gradient naming rule), ``blockdesc`` (``BlockDesc`` and its
``OpList``) and this one (``ProgramDesc``, the version, copies). Every name of the first
two is importable from here as before. The modules that only read a program import
below this one: the checks (``validate``), the JSON writer (``json_write``) and the text
printer (``text_write``), which ``validate()``, ``to_dict()``/``==`` and ``str()`` call;
the readers that build programs (``serialize``, ``text``) import this module, never the
other way round.

A program is a list of blocks; block 0 is the global block and every other block
names its parent. A block declares variables (``VarDesc``) and lists operators
(``OpDesc``) in program order. Operators name their inputs and outputs by slot,
each slot holding a list of variable names; attributes are plain values
(int, float, bool, str, lists of those, ``None``) or ``BlockRef`` to a sub-block.

Invariants kept by the IR modules:

* names within a block are unique; lookups fall back to ancestor blocks;
* attribute values are normalised on the way in (tuples become lists), so two
  programs built the same way compare equal and serialise identically;
* the description holds no tensors and no device: the graph builder and the
  executors decide where things run.

Edits go through this API, and only through it (issue 31):

* ``ProgramDesc.version`` counts the edits made through the IR's methods (here and
  in ``blockdesc``); executors cache the plans they compile from a program under it.
  Every method that changes what a program computes (vars, ops, op slots and
  attributes, blocks) bumps it through ``ProgramDesc._touch``, defined here, and
  nothing else can: ``_version`` is a read-only property (writing it
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
* Programs compare equal by value (their dict forms, ``json_write.program_to_dict``)
  and are NOT hashable by value: ``__hash__`` is identity, because a program is
  mutable and the executors' caches key on the object (``id``, weak references),
  never on its contents.
"""

import contextlib
import copy
import types

from ..core.dtypes import DTYPES, dtype_name, torch_dtype
from ..core.errors import ProgramError
from ..ops.registry import EMPTY_VAR, get_op_def
from .blockdesc import BlockDesc, OpList
from .elements import (GRAD_SUFFIX, ROLES, BlockRef, OpDesc, VarDesc, grad_var_name,
                       normalize_attr, renumber_block_refs)
from .json_write import program_to_dict
from .text_write import program_to_text
from .validate import validate_program

__all__ = ["DTYPES", "ROLES", "EMPTY_VAR", "BlockRef", "VarDesc", "OpDesc", "OpList",
           "BlockDesc", "ProgramDesc", "Program", "grad_var_name", "register_test_rewrite",
           "torch_dtype", "dtype_name", "GRAD_SUFFIX", "normalize_attr", "renumber_block_refs"]

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
        validate_program(self)
        return self

    def to_dict(self):
        """The JSON-ready dict form (see ``ssaexec.program.serialize``)."""
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
        return program_to_text(self)

    def __repr__(self):
        return f"<Program blocks={len(self.blocks)} ops={len(self.global_block().ops)}>"


Program = ProgramDesc
