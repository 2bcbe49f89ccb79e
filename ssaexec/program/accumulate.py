"""Gradient accumulation (Paddle's gradient merge, DDP's ``no_sync``) as two programs.

``accumulation_programs(program)`` returns ``(accumulate, apply)``, both made from a
copy of a training program:

* after the op that makes a parameter's final gradient ``G`` (its ``role_var``), an
  ``elementwise_add`` adds ``G`` into the persistable accumulator ``G@ACC`` (same shape
  and dtype as ``G``);
* **accumulate** stops there: no ``role_var`` (so no collective) and no optimizer ops.
  It runs on every micro-batch but the last of a group: no communication at all;
* **apply** moves the ``role_var`` to the add, so the graph all-reduces (or reduces)
  ``G@ACC``, makes the optimize-role ops read ``G@ACC`` in place of ``G`` (the
  optimizer, and fp16 loss scaling's unscale), and ends by zeroing every accumulator.

The loss-gradient seed of both is divided by the number of micro-batches when the
gradient scale strategy averages (``graph.build``), so ``K`` micro-batches of ``b``
samples give the gradient of the mean loss over the ``K*b`` samples. Accumulators are
persistables the executor creates as zeros (``accumulators``).
"""

from ..core.errors import ProgramError
from .desc import OpDesc

__all__ = ["ACC_SUFFIX", "accumulation_programs", "accumulators"]

ACC_SUFFIX = "@ACC"


def accumulators(program):
    """``{accumulator name: (gradient VarDesc)}`` of an ``apply`` program's accumulators."""
    block = program.global_block()
    return {n: block.var(n[:-len(ACC_SUFFIX)]) for n in block.vars if n.endswith(ACC_SUFFIX)}


def accumulation_programs(program):
    """``(accumulate, apply)`` programs for gradient accumulation (module docstring)."""
    return _make(program, apply=False), _make(program, apply=True)


def _make(program, apply):
    new = program.clone()
    block = new.global_block()
    pairs = [(op, p, g) for op in block.ops if op.role == "backward" for p, g in op.role_var]
    if not pairs:
        raise ProgramError("gradient accumulation needs a training program: no backward op "
                           "names a (parameter, gradient) pair in its role_var")
    renamed = {}
    for op, p, g in pairs:
        var = block.var(g)
        acc = g + ACC_SUFFIX
        block.create_var(acc, shape=var.shape, dtype=var.dtype, persistable=True)
        add = OpDesc("elementwise_add", {"X": [acc], "Y": [g]}, {"Out": [acc]}, {"axis": -1},
                     role="backward", role_var=[(p, acc)] if apply else None)
        block.insert_op(block.ops.index(op) + 1, add)
        block.remove_role_var(op, p, g)
        renamed[g] = acc
    if not apply:
        for op in [op for op in block.ops if op.role == "optimize"]:
            block.remove_op(op)
        return new
    for op in block.ops:
        if op.role == "optimize":
            for s, names in list(op.inputs.items()):
                block.set_input(op, s, [renamed.get(n, n) for n in names])
            for s, names in list(op.outputs.items()):
                block.set_output(op, s, [renamed.get(n, n) for n in names])
    for acc in renamed.values():
        block.append_op("fill_zeros_like", {"X": [acc]}, {"Out": [acc]}, role="optimize")
    return new
