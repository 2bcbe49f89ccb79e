"""Optimizer ops. They update ``Param`` and their state in place and return them.

In-place is safe because the SSA graph orders every reader of the old value
before the update (write-after-read edges), and the sequential executor runs
in program order. The update rules match ``torch.optim`` (SGD with momentum
and Nesterov, Adam/AdamW) so results can be checked against it. ``weight_decay``
adds ``wd * param`` to the gradient (L2), or for Adam with ``decoupled`` shrinks
the parameter directly (AdamW).

``SkipUpdate`` (optional, a 0-dim tensor; fp16 loss scaling sets it): when it is
nonzero the update is computed and thrown away, so parameters and state keep their
values, decided on the device without a host sync (CUDA graphs can replay it). The
update runs in place as usual on a snapshot-protected state: the old values are
cloned first and one ``torch.where(skip, old, new, out=new)`` per updated tensor puts
them back, so an unskipped step is bit-identical to the plain update. The fused
passes take ``skip`` too (one ``_foreach_clone`` for the snapshot), so fp16 updates
fuse like bf16 ones. A select cannot be made arithmetic (``new * keep + old * skip``):
a skipped step's ``new`` holds inf or NaN, and ``NaN * 0`` is NaN.

A sparse ``Grad`` (an embedding's, ``ops.sparse``): ``sgd`` updates its rows only,
``adam`` with ``lazy_mode`` the rows and their moments only, ``momentum`` and ``adam``
otherwise the dense way on the densified gradient; the fused passes update such
parameters alone.
"""

import contextvars
import math

import torch

from ..core.compat import foreach
from .registry import ShapeRule, register_op
from .shape_rules import broadcast
from .sparse import adam_rows, dense, sgd_rows


def _decayed(grad, param, wd):
    return grad.add(param, alpha=wd) if wd else grad


# True while a segment is traced for a compiler (runtime.inductor): the learning rate
# must stay a tensor input of the graph, not a number read once and baked in
LR_AS_TENSOR = contextvars.ContextVar("ssaexec_lr_as_tensor", default=False)


def _minus_lr(lr):
    """``-lr`` as a number where reading it costs nothing (a CPU tensor), else None.

    ``param.add_(step, alpha=-lr)`` updates in place without the temporary ``step * lr``
    (fresh pages each step for large tensors: 13 ms against 1.5 ms a step on an 8.7 M
    parameter model, bench/hf_models.py), as ``torch.optim`` does with a float lr. On a
    GPU reading lr would synchronise the host (and break CUDA-graph capture), so there the
    update multiplies by the lr tensor; so it does while traced (``LR_AS_TENSOR``)."""
    return -lr.item() if lr.device.type == "cpu" and not LR_AS_TENSOR.get() else None


def _sub_lr_times(p, step, lr):
    """``p -= lr * step`` in place (see ``_minus_lr``)."""
    alpha = _minus_lr(lr)
    if alpha is None:
        p.sub_(step * lr)
    else:
        p.add_(step, alpha=alpha)


def _skip_problem(skip, shapes):
    """Why ``SkipUpdate`` of shape ``skip`` cannot guard updates of ``shapes``, or None.

    It must hold one value and have no more dimensions than any updated tensor: the
    select ``torch.where(skip, old, new, out=new)`` would otherwise resize the parameter
    and its state to their broadcast (a program file could reshape a parameter)."""
    if math.prod(skip) != 1 or any(len(skip) > len(s) for s in shapes):
        return (f"SkipUpdate has shape {list(skip)}: it must hold one value, with no more "
                "dimensions than the tensors it guards")
    return None


def _snapshot(tensors, skip):
    """The old values of ``tensors`` an update may have to restore, or None (no ``skip``)."""
    if skip is None or not tensors:
        return None
    problem = _skip_problem(list(skip.shape), [list(t.shape) for t in tensors])
    if problem:
        raise ValueError(problem)
    return tensors, foreach("clone")(tensors)


def _restore(saved, skip):
    """Put back the snapshot's values where ``skip`` is nonzero, in place, on the device."""
    if saved is None:
        return
    skipped = skip != 0
    for t, old in zip(*saved, strict=True):
        # out= the updated tensor itself: one kernel a tensor, no temporary, no copy back
        torch.where(skipped, old, t, out=t)


def _skippable(*updated):
    """Give an in-place update an optional ``SkipUpdate`` input (module docstring)."""
    def wrap(kernel):
        def run(ins, attrs):
            skip = ins.get("SkipUpdate")
            saved = _snapshot([ins[slot] for slot in updated], skip)
            outs = kernel(ins, attrs)
            _restore(saved, skip)
            return outs
        run.__doc__ = kernel.__doc__
        run.__name__ = kernel.__name__
        return run
    return wrap


# --- shape rules ---------------------------------------------------------------------------
# Each follows its dense kernel step by step (a meta probe never sees a sparse Grad): an
# in-place update refuses a value that broadcasts beyond its target, and a ``SkipUpdate``
# that could resize what it guards (``_skip_problem``), as the kernel does. Dtypes come
# from the kernel (ShapeRule).

def _into(target, value):
    """The shape of ``target`` after an in-place update by ``value`` (torch's refusal)."""
    if broadcast(target, value) != list(target):
        raise RuntimeError(f"output with shape {list(target)} doesn't match the broadcast "
                           f"shape {broadcast(target, value)}")
    return list(target)


def _number_canon(v):
    """The class of number attr ``v`` to a dtype run: its type, zero or not (``if wd``);
    an int beyond 2**31 stays itself (``1 - beta1`` may leave int64), all else a stand-in.
    The values of floats change no dtype, so a file of distinct ones runs no kernel each."""
    if isinstance(v, bool) or (isinstance(v, int) and abs(v) >= 2 ** 31):
        return v
    return type(v)(0 if v == 0 else 2)


def _optim_canon(ins, attrs):
    return ({k: [1] if v[0] else [] for k, v in ins.items()},
            {k: _number_canon(v) for k, v in attrs.items()})


def _optim_rule(update, updated):
    """A ``ShapeRule`` from ``update(shape_of, attrs)``, which checks the kernel's steps;
    ``updated`` maps each updated input slot to its output slot."""
    def shapes(ins, attrs):
        shape_of = {k: v[0] for k, v in ins.items()}
        update(shape_of, attrs)
        skip = shape_of.get("SkipUpdate")
        if skip is not None:
            problem = _skip_problem(skip, [shape_of[slot] for slot in updated])
            if problem:
                raise ValueError(problem)
        return {out: list(shape_of[slot]) for slot, out in updated.items()}
    return ShapeRule(shapes, _optim_canon)


def _decayed_shape(s, wd):
    return broadcast(s["Grad"], s["Param"]) if wd else s["Grad"]


def _sgd_shapes(s, attrs):
    _into(s["Param"], broadcast(_decayed_shape(s, attrs["weight_decay"]), s["LearningRate"]))


def _momentum_shapes(s, attrs):
    g = _decayed_shape(s, attrs["weight_decay"])
    v = _into(s["Velocity"], g)
    step = broadcast(g, v) if attrs["use_nesterov"] else v
    _into(s["Param"], broadcast(step, s["LearningRate"]))


def _adam_shapes(s, attrs):
    p, lr, g = s["Param"], s["LearningRate"], s["Grad"]
    if not attrs["decoupled"]:
        g = _decayed_shape(s, attrs["weight_decay"])
    elif attrs["weight_decay"]:
        _into(p, lr)
    m1 = _into(s["Moment1"], g)
    m2 = _into(s["Moment2"], g)
    denom = broadcast(m2, s["Beta2Pow"])
    _into(p, broadcast(broadcast(m1, denom), broadcast(lr, s["Beta1Pow"])))


SGD_RULE = _optim_rule(_sgd_shapes, {"Param": "ParamOut"})
MOMENTUM_RULE = _optim_rule(_momentum_shapes, {"Param": "ParamOut", "Velocity": "VelocityOut"})
ADAM_RULE = _optim_rule(_adam_shapes, {"Param": "ParamOut", "Moment1": "Moment1Out",
                                       "Moment2": "Moment2Out", "Beta1Pow": "Beta1PowOut",
                                       "Beta2Pow": "Beta2PowOut"})


@register_op("sgd", ["Param", "Grad", "LearningRate", "SkipUpdate?"], ["ParamOut"],
             {"weight_decay": ("float", 0.0)}, grad=None, inplace=True, rule=SGD_RULE)
@_skippable("Param")
def sgd(ins, attrs):
    """ParamOut = Param - lr * (Grad + wd * Param)."""
    p = ins["Param"]
    if ins["Grad"].is_sparse:  # the touched rows only (ops.sparse)
        sgd_rows(p, ins["Grad"], ins["LearningRate"], attrs["weight_decay"])
        return {"ParamOut": p}
    _sub_lr_times(p, _decayed(ins["Grad"], p, attrs["weight_decay"]), ins["LearningRate"])
    return {"ParamOut": p}


@register_op("momentum", ["Param", "Grad", "Velocity", "LearningRate", "SkipUpdate?"],
             ["ParamOut", "VelocityOut"],
             {"mu": ("float", 0.9), "use_nesterov": ("bool", False),
              "weight_decay": ("float", 0.0)}, grad=None, inplace=True,
             rule=MOMENTUM_RULE)
@_skippable("Param", "Velocity")
def momentum(ins, attrs):
    """Velocity = mu * Velocity + g; Param -= lr * (g + mu * Velocity if Nesterov else Velocity)."""
    p, v, lr, mu = ins["Param"], ins["Velocity"], ins["LearningRate"], attrs["mu"]
    g = _decayed(dense(ins["Grad"]), p, attrs["weight_decay"])
    v.mul_(mu).add_(g)
    step = g.add(v, alpha=mu) if attrs["use_nesterov"] else v
    _sub_lr_times(p, step, lr)
    return {"ParamOut": p, "VelocityOut": v}


@register_op("adam", ["Param", "Grad", "LearningRate", "Moment1", "Moment2", "Beta1Pow",
                      "Beta2Pow", "SkipUpdate?"],
             ["ParamOut", "Moment1Out", "Moment2Out", "Beta1PowOut", "Beta2PowOut"],
             {"beta1": ("float", 0.9), "beta2": ("float", 0.999), "epsilon": ("float", 1e-8),
              "weight_decay": ("float", 0.0), "decoupled": ("bool", False),
              "lazy_mode": ("bool", False)},
             grad=None, inplace=True, rule=ADAM_RULE)
@_skippable("Param", "Moment1", "Moment2", "Beta1Pow", "Beta2Pow")
def adam(ins, attrs):
    """Adam (or AdamW with ``decoupled``) with bias correction; Beta*Pow hold beta**step."""
    p, m1, m2 = ins["Param"], ins["Moment1"], ins["Moment2"]
    b1p, b2p, lr = ins["Beta1Pow"], ins["Beta2Pow"], ins["LearningRate"]
    b1, b2, wd = attrs["beta1"], attrs["beta2"], attrs["weight_decay"]
    g = ins["Grad"]
    if g.is_sparse:
        if attrs["lazy_mode"]:  # rows of the batch only (ops.sparse)
            adam_rows(p, g, lr, m1, m2, b1p, b2p, attrs)
            return {"ParamOut": p, "Moment1Out": m1, "Moment2Out": m2, "Beta1PowOut": b1p,
                    "Beta2PowOut": b2p}
        g = g.to_dense()
    if attrs["decoupled"]:
        if wd:
            p.mul_(1 - lr * wd)
    else:
        g = _decayed(g, p, wd)
    b1p.mul_(b1)
    b2p.mul_(b2)
    m1.mul_(b1).add_(g, alpha=1 - b1)
    m2.mul_(b2).addcmul_(g, g, value=1 - b2)
    denom = (m2.sqrt() / torch.sqrt(1 - b2p)).add_(attrs["epsilon"])
    p.sub_(m1 / denom * (lr / (1 - b1p)))
    return {"ParamOut": p, "Moment1Out": m1, "Moment2Out": m2, "Beta1PowOut": b1p,
            "Beta2PowOut": b2p}


# --- fused updates -------------------------------------------------------------------------
# All updates of one kind and learning rate on one place as one ``torch._foreach_*`` pass,
# as torch.optim does with ``foreach=True``. Each step is the same elementwise operation,
# in the same order, as the per-parameter kernel above, so results are bit-identical
# (tests/runtime/test_hot_path.py checks it). ``cols`` maps each input slot but LearningRate to
# the list of that slot's tensors, one per op. ``skip`` is the ops' shared ``SkipUpdate``
# (fp16 loss scaling) or None: one ``_foreach_clone`` snapshot before, one select per
# updated tensor after (``_snapshot``, ``_restore``). The learning rate enters through the
# ``Tensor`` overloads (one 0-dim tensor for the whole list): a list ``[lr] * n`` beside
# tensors of other shapes sends torch's CUDA foreach kernels down their per-tensor path.

def _lr_scalar(lr):
    """``lr`` as the 0-dim tensor the ``Tensor`` overloads of ``torch._foreach_*`` take."""
    return lr if lr.dim() == 0 else lr.reshape(())


def _sparse_apart(kernel, cols, lr, attrs, skip=None):
    """Update alone, with ``kernel``, the parameters whose gradient is sparse; return the
    columns of the others (the order of independent updates does not matter)."""
    grads = cols["Grad"]
    if not any(g.is_sparse for g in grads):
        return cols
    for i, g in enumerate(grads):
        if g.is_sparse:
            ins = {s: v[i] for s, v in cols.items()}
            ins["LearningRate"] = lr
            if skip is not None:
                ins["SkipUpdate"] = skip
            kernel(ins, attrs)
    keep = [i for i, g in enumerate(grads) if not g.is_sparse]
    return {s: [v[i] for i in keep] for s, v in cols.items()}


def _decayed_all(grads, params, wd):
    return foreach("add")(grads, params, alpha=wd) if wd else grads


def _foreach_sub_lr_times(ps, steps, lr):
    """``ps[i] -= lr * steps[i]`` in place (see ``_minus_lr``)."""
    alpha = _minus_lr(lr)
    if alpha is None:
        foreach("sub_")(ps, foreach("mul")(steps, _lr_scalar(lr)))
    else:
        foreach("add_")(ps, steps, alpha=alpha)


def sgd_foreach(cols, lr, attrs, skip=None):
    """Fused ``sgd`` over every (Param, Grad) of ``cols``."""
    cols = _sparse_apart(sgd, cols, lr, attrs, skip)
    if not cols["Param"]:
        return
    ps = cols["Param"]
    saved = _snapshot(ps, skip)
    gs = _decayed_all(cols["Grad"], ps, attrs["weight_decay"])
    _foreach_sub_lr_times(ps, gs, lr)
    _restore(saved, skip)


def momentum_foreach(cols, lr, attrs, skip=None):
    """Fused ``momentum`` (Nesterov too)."""
    cols = _sparse_apart(momentum, cols, lr, attrs, skip)
    if not cols["Param"]:
        return
    ps, vs, mu = cols["Param"], cols["Velocity"], attrs["mu"]
    saved = _snapshot(ps + vs, skip)
    gs = _decayed_all(cols["Grad"], ps, attrs["weight_decay"])
    foreach("mul_")(vs, mu)
    foreach("add_")(vs, gs)
    steps = foreach("add")(gs, vs, alpha=mu) if attrs["use_nesterov"] else vs
    _foreach_sub_lr_times(ps, steps, lr)
    _restore(saved, skip)


def adam_foreach(cols, lr, attrs, skip=None):
    """Fused ``adam`` / AdamW."""
    cols = _sparse_apart(adam, cols, lr, attrs, skip)
    if not cols["Param"]:
        return
    ps, m1s, m2s = cols["Param"], cols["Moment1"], cols["Moment2"]
    saved = _snapshot(ps + m1s + m2s + cols["Beta1Pow"] + cols["Beta2Pow"], skip)
    b1ps, b2ps = cols["Beta1Pow"], cols["Beta2Pow"]
    b1, b2, wd = attrs["beta1"], attrs["beta2"], attrs["weight_decay"]
    gs = cols["Grad"]
    if attrs["decoupled"]:
        if wd:
            foreach("mul_")(ps, _lr_scalar(1 - lr * wd))
    else:
        gs = _decayed_all(gs, ps, wd)
    foreach("mul_")(b1ps, b1)
    foreach("mul_")(b2ps, b2)
    foreach("mul_")(m1s, b1)
    foreach("add_")(m1s, gs, alpha=1 - b1)
    foreach("mul_")(m2s, b2)
    foreach("addcmul_")(m2s, gs, gs, value=1 - b2)
    # 1 - x is exactly (-x) + 1 in IEEE arithmetic
    bc2 = foreach("neg")(b2ps)
    foreach("add_")(bc2, 1)
    denom = foreach("div")(foreach("sqrt")(m2s), foreach("sqrt")(bc2))
    foreach("add_")(denom, attrs["epsilon"])
    bc1 = foreach("neg")(b1ps)
    foreach("add_")(bc1, 1)
    # lr / (1 - b1p) per parameter: a list of 0-dim tensors on both sides (one kernel)
    step_size = foreach("div")([lr] * len(ps), bc1)
    foreach("sub_")(ps, foreach("mul")(foreach("div")(m1s, denom), step_size))
    _restore(saved, skip)


FUSED = {"sgd": sgd_foreach, "momentum": momentum_foreach, "adam": adam_foreach}
