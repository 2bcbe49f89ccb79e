"""Optimizer ops. They update ``Param`` and their state in place and return them.

In-place is safe because the SSA graph orders every reader of the old value
before the update (write-after-read edges), and the sequential executor runs
in program order. The update rules match ``torch.optim`` (SGD with momentum
and Nesterov, Adam/AdamW) so results can be checked against it. ``weight_decay``
adds ``wd * param`` to the gradient (L2), or for Adam with ``decoupled`` shrinks
the parameter directly (AdamW).
"""

import torch

from .registry import register_op


def _decayed(grad, param, wd):
    return grad.add(param, alpha=wd) if wd else grad


@register_op("sgd", ["Param", "Grad", "LearningRate"], ["ParamOut"],
             {"weight_decay": ("float", 0.0)}, grad=None, inplace=True)
def sgd(ins, attrs):
    """ParamOut = Param - lr * (Grad + wd * Param)."""
    p = ins["Param"]
    g = _decayed(ins["Grad"], p, attrs["weight_decay"])
    p.sub_(g * ins["LearningRate"])
    return {"ParamOut": p}


@register_op("momentum", ["Param", "Grad", "Velocity", "LearningRate"],
             ["ParamOut", "VelocityOut"],
             {"mu": ("float", 0.9), "use_nesterov": ("bool", False),
              "weight_decay": ("float", 0.0)}, grad=None, inplace=True)
def momentum(ins, attrs):
    """Velocity = mu * Velocity + g; Param -= lr * (g + mu * Velocity if Nesterov else Velocity)."""
    p, v, lr, mu = ins["Param"], ins["Velocity"], ins["LearningRate"], attrs["mu"]
    g = _decayed(ins["Grad"], p, attrs["weight_decay"])
    v.mul_(mu).add_(g)
    step = g.add(v, alpha=mu) if attrs["use_nesterov"] else v
    p.sub_(step * lr)
    return {"ParamOut": p, "VelocityOut": v}


@register_op("adam", ["Param", "Grad", "LearningRate", "Moment1", "Moment2", "Beta1Pow",
                      "Beta2Pow"],
             ["ParamOut", "Moment1Out", "Moment2Out", "Beta1PowOut", "Beta2PowOut"],
             {"beta1": ("float", 0.9), "beta2": ("float", 0.999), "epsilon": ("float", 1e-8),
              "weight_decay": ("float", 0.0), "decoupled": ("bool", False)},
             grad=None, inplace=True)
def adam(ins, attrs):
    """Adam (or AdamW with ``decoupled``) with bias correction; Beta*Pow hold beta**step."""
    p, m1, m2 = ins["Param"], ins["Moment1"], ins["Moment2"]
    b1p, b2p, lr = ins["Beta1Pow"], ins["Beta2Pow"], ins["LearningRate"]
    b1, b2, wd = attrs["beta1"], attrs["beta2"], attrs["weight_decay"]
    g = ins["Grad"]
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
