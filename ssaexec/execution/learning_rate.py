"""The learning rate of a program, as ``ParallelExecutor.get_lr``/``set_lr`` see it.

Policy. The learning rate is the one var that every optimizer op's ``LearningRate``
input names; a program with none or several is an ``SSAExecError`` that lists them
(the caller then uses ``set_var``/``get_var`` with the one it means). A rate that an
``lr_schedule`` op computes each step cannot be set by hand: the next step would
overwrite it, so ``settable_lr_var`` refuses it.
"""

from ..core.errors import SSAExecError

__all__ = ["lr_var", "settable_lr_var"]


def lr_var(program):
    """The name of ``program``'s single learning-rate var."""
    block = program.global_block()
    names = sorted({op.input("LearningRate")[0] for op in block.ops
                    if op.role == "optimize" and op.input("LearningRate")})
    if len(names) != 1:
        raise SSAExecError(f"the program has {len(names)} learning-rate vars ({names}); "
                           "use set_var/get_var with the one you mean")
    return names[0]


def settable_lr_var(program):
    """``lr_var(program)``, or an ``SSAExecError`` when an LR schedule computes it."""
    name = lr_var(program)
    if any(op.type == "lr_schedule" and op.output("LearningRate") == [name]
           for op in program.global_block().ops):
        raise SSAExecError(f"{name!r} is computed by an LR schedule each step; set_lr "
                           "would be overwritten. Build the optimizer with a number "
                           "to control the rate by hand")
    return name
