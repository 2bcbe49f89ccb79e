"""Control ops that own sub-blocks.

``conditional_block`` runs its sub-block when ``Cond`` holds (always, when it has
no ``Cond``). It reads the vars listed in ``Input`` and writes those in ``Out``,
which must include everything the sub-block writes that is visible outside it;
the SSA graph treats the whole op as one node with those reads and writes.
When the condition is false, each ``Out`` keeps the value it had (it must then
also be listed in ``Input``) or is zero-filled by the sub-block's declared shape.
"""

from .registry import register_op


def _no_infer(ins, attrs):
    return {}


def conditional_block(ins, attrs, ctx):
    """Run ``sub_block`` over Input when Cond is true (or absent); produce Out."""
    op = ctx.op
    env = dict(zip(op.input("Input"), ins["Input"], strict=True))
    cond = ins.get("Cond")
    run = cond is None or bool(cond.reshape(-1)[0])
    if run:
        ctx.run_block(attrs["sub_block"].idx, env)
    outs = []
    for name in op.output("Out"):
        if name not in env:
            raise ValueError(f"conditional_block did not produce {name!r}; list it in Input "
                             "so it keeps its value when the condition is false")
        outs.append(env[name].clone())
    return {"Out": outs}


register_op("conditional_block", ["Cond?!", "Input*!"], ["Out*!"],
            {"sub_block": ("block", None), "is_scalar_condition": ("bool", True)},
            infer=_no_infer, grad=None, control=True)(conditional_block)
