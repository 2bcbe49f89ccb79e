"""``clone(for_test=True)`` of an imported Paddle training program.

``Program.clone(for_test=True)`` keeps the forward ops and sets ``is_test`` on the
ops that have it, which is right for ops mapped one to one. Two Paddle mappings
add forward ops of their own (``ops.py``), and those need undoing for a test
program, as Paddle's own ``clone(for_test=True)`` would have it:

* **batch norm in training** is followed by the six ops that write Paddle's
  running variance (``elementwise_sub``, ``square``, ``reduce_mean``, ``scale``,
  ``scale``, ``elementwise_add``, the last writing the op's ``Variance`` input),
  while the op itself writes a scratch var. In a test program batch norm reads
  the running statistics and writes nothing new: the six ops are removed and the
  op's ``VarianceOut`` names the running variance again;
* **dropout** ``downgrade_in_infer`` in training is our ``dropout`` (to a scratch
  var), a ``cast`` of its mask and an ``elementwise_mul``; at inference Paddle
  scales by ``1 - dropout_prob``: the three ops become that ``scale``.

The ops are recognised by their exact sequence and the scratch vars the import
names ``<var>@ssaexec_<k>``, so programs from anywhere else are left unchanged.
``ssaexec.frontends.paddle`` registers ``to_inference`` with
``ssaexec.program.desc.register_test_rewrite``.
"""

from ...program.desc import OpDesc

__all__ = ["to_inference", "SCRATCH"]

SCRATCH = "@ssaexec_"
_BN_TAIL = ("elementwise_sub", "square", "reduce_mean", "scale", "scale", "elementwise_add")


def _scratch(name):
    return SCRATCH in name


def _bn_tail(ops, i):
    op = ops[i]
    var_out = op.output("VarianceOut")
    tail = ops[i + 1:i + 1 + len(_BN_TAIL)]
    if len(var_out) != 1 or not _scratch(var_out[0]) or \
            tuple(o.type for o in tail) != _BN_TAIL:
        return None
    if tail[-1].output("Out") != op.input("Variance") or \
            tail[0].input("Y") != op.output("SavedMean"):
        return None
    return tail


def _dropout_tail(ops, i):
    op = ops[i]
    tail = ops[i + 1:i + 3]
    if len(tail) != 2 or [o.type for o in tail] != ["cast", "elementwise_mul"]:
        return None
    if not all(_scratch(n) for n in op.output("Out")) or \
            tail[0].input("X") != op.output("Mask") or \
            tail[1].input("X") != op.input("X") or tail[1].input("Y") != tail[0].output("Out"):
        return None
    return tail


def to_inference(program):
    """Undo the training-only forward ops of Paddle imports in ``program`` (in place)."""
    for block in program.blocks:
        i = 0
        while i < len(block.ops):
            op = block.ops[i]
            if op.type == "batch_norm" and op.role == "forward":
                tail = _bn_tail(block.ops, i)
                if tail is not None:
                    outs = dict(op.outputs)
                    outs["VarianceOut"] = list(op.input("Variance"))
                    new = OpDesc(op.type, op.inputs, outs, op.attrs, op.role, op.role_var)
                    for o in [op] + tail:
                        block.remove_op(o)
                    block.insert_op(i, new)
            elif op.type == "dropout" and op.role == "forward":
                tail = _dropout_tail(block.ops, i)
                if tail is not None:
                    p = op.attrs.get("dropout_prob", 0.5)
                    new = OpDesc("scale", {"X": op.input("X")}, {"Out": tail[1].output("Out")},
                                 {"scale": 1.0 - p}, op.role)
                    for o in [op] + tail:
                        block.remove_op(o)
                    block.insert_op(i, new)
            i += 1
    return program
