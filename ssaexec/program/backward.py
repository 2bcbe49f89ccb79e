"""``append_backward``: add gradient ops for a scalar loss to its block.

Policy:

* Only ops on a path from a var that needs a gradient (a trainable parameter,
  or anything computed from one) to the loss get grad ops, in reverse order.
* The op that seeds ``loss@GRAD`` (a ``fill_constant`` of ones) has role
  ``loss``; the SSA graph builder replaces it with a loss-scaling handle.
* Grad vars are named ``X@GRAD``. A var read by several ops gets one
  contribution per read, named ``X@GRAD@RENAME@k``, summed by a ``sum`` op
  into ``X@GRAD`` right after the last contribution is produced.
* The op that writes a parameter's final gradient carries
  ``role_var=[(param, param@GRAD)]``; the graph builder all-reduces there.
* Differentiable vars must be written once before the loss (an SSA-shaped
  forward); otherwise the gradient would be ambiguous and we say so.
"""

from ..core.errors import ProgramError
from ..ops.registry import get_op_def
from .desc import EMPTY_VAR, grad_var_name

__all__ = ["append_backward", "append_grad_ops", "register_block_grad"]


def _loss_op_index(block, loss_name):
    for i in range(len(block.ops) - 1, -1, -1):
        if loss_name in block.ops[i].output_names():
            return i
    raise ProgramError(f"append_backward: no op in block {block.idx} writes the loss "
                       f"{loss_name!r}")


def _diff_inputs(op_def, op):
    """(slot, position, name) of every differentiable input entry of ``op``."""
    if op_def.grad is None:
        return []
    return [(s.name, i, n) for s in op_def.inputs if not s.no_grad
            for i, n in enumerate(op.input(s.name))]


def _diff_outputs(op_def, op):
    return [(s.name, i, n) for s in op_def.outputs if not s.no_grad
            for i, n in enumerate(op.output(s.name)) if n != EMPTY_VAR]


def append_backward(loss, parameter_list=None, no_grad_set=None):
    """Append the backward pass of scalar ``loss`` to its program.

    Parameters
    ----------
    loss : VarDesc or str
        The loss var (declared in the global block of the default main program,
        or of ``loss.program`` when given a ``(program, name)`` pair).
    parameter_list : list of str, optional
        Only these parameters get gradients (default: all trainable ones).
    no_grad_set : set of str, optional
        Vars that get no gradient.

    Returns
    -------
    list of (VarDesc, VarDesc)
        (parameter, gradient) pairs in parameter creation order.
    """
    from .builder import default_main_program
    program = default_main_program()
    loss_name = loss if isinstance(loss, str) else loss.name
    block = program.global_block()
    loss_var = block.var(loss_name)
    loss_idx = _loss_op_index(block, loss_name)
    no_grad = set(no_grad_set or ())
    params = [p.name for p in program.all_parameters() if not p.stop_gradient]
    if parameter_list is not None:
        wanted = {p if isinstance(p, str) else p.name for p in parameter_list}
        params = [p for p in params if p in wanted]

    def seed_loss():
        seed = grad_var_name(loss_name)
        if seed not in block.vars:
            block.create_var(seed, loss_var.shape, loss_var.dtype)
        block.append_op("fill_constant", outputs={"Out": [seed]},
                        attrs={"shape": loss_var.shape or [], "value": 1.0,
                               "dtype": loss_var.dtype}, role="loss")

    append_grad_ops(block, block, block.ops[: loss_idx + 1], [loss_name],
                    [p for p in params if p not in no_grad], params, no_grad, seed_loss)
    return [(block.var(p), block.var(grad_var_name(p))) for p in params
            if grad_var_name(p) in block.vars]


# op type -> maker(block, forward op, grad op): builds the grad op's sub-block
_BLOCK_GRAD_MAKERS = {}


def register_block_grad(op_type, maker):
    """Have ``append_backward`` call ``maker(block, op, grad_op)`` after making the grad op of
    every ``op_type`` op (an op owning a sub-block, whose grad op needs one too)."""
    _BLOCK_GRAD_MAKERS[op_type] = maker
    return maker


def append_grad_ops(src, dst, fwd_ops, seeds, targets, params, no_grad=(), before=None):
    """Append to ``dst`` the grad ops that carry the gradients of ``seeds`` back to ``targets``.

    Parameters
    ----------
    src : BlockDesc
        The block declaring the forward vars (looked up through its ancestors).
    dst : BlockDesc
        Where grad vars are declared (unless visible there already) and grad ops go:
        ``src`` itself for ``append_backward``, a grad sub-block for an op owning one.
    fwd_ops : list of OpDesc
        The forward ops, in program order.
    seeds : list of str
        Vars whose gradient ``X@GRAD`` exists already (the loss, a sub-block's outputs).
    targets : list of str
        Vars to differentiate with respect to (trainable parameters, inputs).
    params : list of str
        Vars whose final gradient op carries ``role_var`` (all-reduced by the graph).
    no_grad : iterable of str
        Vars that get no gradient.
    before : callable, optional
        Called once the forward ops are checked, before the first grad op (to seed).
    """
    no_grad = set(no_grad)

    def trainable(name):
        var = src.find_var(name)
        return var is not None and not var.stop_gradient and name not in no_grad

    defs = [get_op_def(op.type) for op in fwd_ops]
    seeds = set(seeds)

    # Forward sweep: which vars carry a dependence on something trainable.
    needs = set(targets)
    writer = {}
    for i, (op, od) in enumerate(zip(fwd_ops, defs, strict=True)):
        if op.role != "forward":
            continue
        for _, _, n in _diff_outputs(od, op):
            if n in writer and n in needs | seeds:
                raise ProgramError(
                    f"append_backward: var {n!r} is written by op {writer[n]} "
                    f"({fwd_ops[writer[n]].type}) and op {i} ({op.type}); gradients need each "
                    "differentiable var written once")
            writer[n] = i
        if any(n in needs for _, _, n in _diff_inputs(od, op)):
            needs.update(n for _, _, n in _diff_outputs(od, op) if trainable(n))

    # Backward sweep: which vars reach a seed.
    reaches = set(seeds)
    included = []
    for i in range(len(fwd_ops) - 1, -1, -1):
        op, od = fwd_ops[i], defs[i]
        if op.role != "forward" or od.grad is None:
            continue
        if not any(n in reaches for _, _, n in _diff_outputs(od, op)):
            continue
        diff_in = [n for _, _, n in _diff_inputs(od, op) if n in needs and trainable(n)]
        if not diff_in:
            continue
        included.append(i)
        reaches.update(diff_in)

    # How many grad contributions each var will receive.
    pending = {}
    for i in included:
        for _, _, n in _diff_inputs(defs[i], fwd_ops[i]):
            if n in needs and trainable(n):
                pending[n] = pending.get(n, 0) + 1
    total = dict(pending)
    renames = {}
    has_grad = set(seeds)

    def new_grad_var(name, grad_name):
        src_var = src.var(name)
        if grad_name not in dst.vars:
            dst.create_var(grad_name, src_var.shape, src_var.dtype)
        return grad_name

    if before is not None:
        before()
    param_set = set(params)

    for i in included:
        op, od = fwd_ops[i], defs[i]
        gdef = get_op_def(op.type + "_grad")
        ins = {s: list(op.input(s)) if od.input_slot(s) else list(op.output(s))
               for s in od.grad_uses}
        for s in od.outputs:
            if s.no_grad:
                continue
            ins[s.name + "@GRAD"] = [grad_var_name(n) if n in has_grad else EMPTY_VAR
                                     for n in op.output(s.name)]
        outs = {}
        finished = []
        for s in od.inputs:
            if s.no_grad:
                continue
            names = []
            for n in op.input(s.name):
                if not (n in needs and trainable(n)):
                    names.append(EMPTY_VAR)
                    continue
                if total[n] == 1:
                    names.append(new_grad_var(n, grad_var_name(n)))
                else:
                    k = renames.get(n, 0)
                    renames[n] = k + 1
                    names.append(new_grad_var(n, f"{grad_var_name(n)}@RENAME@{k}"))
                pending[n] -= 1
                if pending[n] == 0:
                    finished.append(n)
            outs[s.name + "@GRAD"] = names
        # drop grad-input slots that carry nothing, so unused vars stay unread
        ins = {k: v for k, v in ins.items()
               if not (k.endswith("@GRAD") and all(x == EMPTY_VAR for x in v))}
        role_var = [(n, grad_var_name(n)) for n in finished
                    if n in param_set and total[n] == 1]
        grad_op = dst.append_op(gdef.type, ins, outs, dict(op.attrs), role="backward",
                                role_var=role_var)
        maker = _BLOCK_GRAD_MAKERS.get(op.type)
        if maker is not None:
            maker(dst, op, grad_op)
        for n in finished:
            if total[n] > 1:
                parts = [f"{grad_var_name(n)}@RENAME@{k}" for k in range(total[n])]
                dst.append_op("sum", {"X": parts}, {"Out": [new_grad_var(n, grad_var_name(n))]},
                              role="backward",
                              role_var=[(n, grad_var_name(n))] if n in param_set else None)
            has_grad.add(n)
    return has_grad
