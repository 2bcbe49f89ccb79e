"""Sub-blocks as units: what a block reads and writes outside it, copies between programs.

``outer_io`` is the block-level dependency analysis the PlaceableBlock design (seed
002) is built on: the names a block (its nested sub-blocks included) reads and
writes that are declared outside it. ``copy_block`` copies a block, and every block
its ops refer to, into another program, renumbering the ``BlockRef`` attributes;
``prune_blocks`` drops the blocks no op refers to any more and renumbers the rest.
``SubBlockBuilder`` is the ``with`` statement of the builders that own a sub-block
(``ParallelDo``, ``PlaceableBlock``).
"""

import copy

from ..core.errors import ProgramError
from ..core.limits import depth_problem
from .builder import default_main_program
from .desc import EMPTY_VAR, renumber_block_refs

__all__ = ["outer_io", "copy_op", "copy_block", "prune_blocks", "SubBlockBuilder"]


class SubBlockBuilder:
    """``with builder:`` appends the layers inside to a new sub-block of the current block
    of the default main program; leaving it calls ``_append_op()`` (unless it raised),
    which appends the op owning the sub-block to the enclosing block."""

    kind = "sub-block"

    def __init__(self, name=None):
        self.name = name
        self.program = self.block = self.op = self._parent = self._switch = None

    def __enter__(self):
        if self.block is not None:
            raise ProgramError(f"a {type(self).__name__} block can be entered only once")
        self.program = default_main_program()
        self._parent = self.program.current_block()
        self.block = self.program.create_block(parent_idx=self._parent.idx)
        self._switch = self.program.switch_block(self.block.idx)
        self._switch.__enter__()
        self.name = self.name or self.program.unique_name(self.kind)
        return self

    def __exit__(self, exc_type, exc, tb):
        self._switch.__exit__(None, None, None)  # back to the parent; never swallows exc
        if exc_type is None:
            self._append_op()
        return False

    def _append_op(self):
        raise NotImplementedError


def outer_io(program, block):
    """(reads, writes): names declared outside ``block`` that it reads and writes.

    Both are lists in order of first use; nested sub-blocks count, and a name
    declared in an enclosing sub-block is local to it.
    """
    reads, writes = {}, {}

    def walk(b, local, depth):
        # validation bounds the nesting; this bounds programs built without it
        problem = depth_problem(depth, f"sub-block {b.idx}")
        if problem:
            raise ProgramError(problem)
        local = local | set(b.vars)
        for op in b.ops:
            for n in op.input_names():
                if n not in local and n != EMPTY_VAR:
                    reads.setdefault(n, None)
            for n in op.output_names():
                if n not in local:
                    writes.setdefault(n, None)
            for sub in op.sub_blocks():
                walk(program.block(sub), local, depth + 1)

    walk(block, frozenset(), 1)
    return list(reads), list(writes)


def copy_op(op, dst_program, src_program, rename=None):
    """A copy of ``op`` for ``dst_program``: names renamed by ``rename`` (a dict), and
    the sub-blocks it refers to copied into ``dst_program`` (as children of the block
    the copy will be appended to: ``dst_program``'s current block)."""
    new = copy.deepcopy(op)
    if rename:
        def swap(names):
            return [rename.get(n, n) for n in names]
        new.inputs = {k: swap(v) for k, v in new.inputs.items()}
        new.outputs = {k: swap(v) for k, v in new.outputs.items()}
        new.role_var = [tuple(swap(pair)) for pair in new.role_var]
    mapping = {}
    parent = dst_program.current_block().idx
    for sub in op.sub_blocks():
        mapping[sub] = copy_block(src_program, sub, dst_program, parent)
    renumber_block_refs(new, mapping)  # a fresh copy, in no block yet
    return new


def copy_block(src_program, idx, dst_program, parent_idx):
    """Copy block ``idx`` of ``src_program`` (and its nested blocks) into ``dst_program``
    as a child of ``parent_idx``; return the new block's index."""
    src = src_program.block(idx)
    dst = dst_program.create_block(parent_idx=parent_idx)
    for v in src.vars.values():
        dst.add_var(copy.copy(v))
    with dst_program.switch_block(dst.idx):
        for op in src.ops:
            dst.add_op(copy_op(op, dst_program, src_program))
    return dst.idx


def prune_blocks(program):
    """Drop the blocks (but block 0) that no op of a kept block refers to; renumber.

    Returns the mapping old index -> new index of the kept blocks.
    """
    keep, stack = {0}, [0]
    while stack:
        for op in program.blocks[stack.pop()].ops:
            for sub in op.sub_blocks():
                if sub not in keep:
                    keep.add(sub)
                    stack.append(sub)
    return program.keep_blocks(sorted(keep))
