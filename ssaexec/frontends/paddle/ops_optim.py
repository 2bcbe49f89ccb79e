"""Paddle mappings, optimizers: ``sgd``, ``momentum``, ``adam`` and ``adamw``, updating in place.

Registered into ``mapping.MAPPINGS`` on import (by ``paddle/ops.py``, which states the
conventions, among them ``adam``'s beta-power accumulators).
"""

from ...ops.registry import EMPTY_VAR
from .mapping import Unsupported, _one, _register, a_bool, a_float, a_str, require


def _update_slots(op, ins, outs):
    """Refuse master weights and the like; require ParamOut == Param (updates are in place)."""
    for slot, names in op.inputs.items():
        if slot not in ins and any(n != EMPTY_VAR for n in names):
            raise Unsupported(op, f"input {slot!r} is not supported")
    for slot, names in op.outputs.items():
        if slot not in outs and any(n != EMPTY_VAR for n in names):
            raise Unsupported(op, f"output {slot!r} is not supported")
    for out, inp in outs.items():
        if op.output(out) != op.input(inp):
            raise Unsupported(op, f"{out} must name the same var as {inp} (ssaexec updates in "
                                  "place)")
    for slot in ins:
        _one(op, slot)


def _sgd(ctx, op):
    ins = ("Param", "Grad", "LearningRate")
    _update_slots(op, ins, {"ParamOut": "Param"})
    param, grad = _one(op, "Param"), _one(op, "Grad")
    ctx.emit("sgd", {s: op.input(s) for s in ins}, {"ParamOut": [param]},
             {"weight_decay": 0.0}, role_var=[(param, grad)])


def _momentum(ctx, op):
    ins = ("Param", "Grad", "Velocity", "LearningRate")
    _update_slots(op, ins, {"ParamOut": "Param", "VelocityOut": "Velocity"})
    require(op, a_float(op, "rescale_grad", 1.0) == 1.0, "rescale_grad != 1 is not supported")
    method = a_str(op, "regularization_method", "")
    require(op, method in ("", "l2_decay"), f"regularization_method={method!r} is not supported")
    decay = a_float(op, "regularization_coeff", 0.0) if method == "l2_decay" else 0.0
    param, grad = _one(op, "Param"), _one(op, "Grad")
    ctx.emit("momentum", {s: op.input(s) for s in ins},
             {"ParamOut": [param], "VelocityOut": op.input("Velocity")},
             {"mu": a_float(op, "mu", 0.9), "use_nesterov": a_bool(op, "use_nesterov", False),
              "weight_decay": decay}, role_var=[(param, grad)])


def _adam(ctx, op):
    ins = ("Param", "Grad", "LearningRate", "Moment1", "Moment2", "Beta1Pow", "Beta2Pow")
    _update_slots(op, ins, {"ParamOut": "Param", "Moment1Out": "Moment1",
                            "Moment2Out": "Moment2", "Beta1PowOut": "Beta1Pow",
                            "Beta2PowOut": "Beta2Pow"})
    require(op, not a_bool(op, "use_global_beta_pow", False),
            "use_global_beta_pow is not supported")
    decoupled = op.type == "adamw"
    decay = 0.0
    if decoupled:
        require(op, a_float(op, "lr_ratio", 1.0) == 1.0, "lr_ratio != 1 is not supported")
        decay = a_float(op, "coeff", 0.01) if a_bool(op, "with_decay", True) else 0.0
    b1, b2 = a_float(op, "beta1", 0.9), a_float(op, "beta2", 0.999)
    require(op, b1 > 0 and b2 > 0, "beta1 and beta2 must be positive")
    param, grad = _one(op, "Param"), _one(op, "Grad")
    pair = [(param, grad)]
    # Paddle's accumulators hold beta**t before step t, ours after: shift by one power
    pows = {}
    for slot, beta in (("Beta1Pow", b1), ("Beta2Pow", b2)):
        acc = _one(op, slot)
        prev = ctx.tmp(acc)
        ctx.emit("scale", {"X": [acc]}, {"Out": [prev]}, {"scale": 1.0 / beta}, role_var=pair)
        pows[slot] = (acc, prev, beta)
    ours_in = {s: op.input(s) for s in ins}
    ours_in["Beta1Pow"], ours_in["Beta2Pow"] = [pows["Beta1Pow"][1]], [pows["Beta2Pow"][1]]
    ctx.emit("adam", ours_in,
             {"ParamOut": [param], "Moment1Out": op.input("Moment1"),
              "Moment2Out": op.input("Moment2"), "Beta1PowOut": [pows["Beta1Pow"][1]],
              "Beta2PowOut": [pows["Beta2Pow"][1]]},
             {"beta1": b1, "beta2": b2, "epsilon": a_float(op, "epsilon", 1e-8),
              "weight_decay": decay, "decoupled": decoupled}, role_var=pair)
    for acc, prev, beta in pows.values():
        ctx.emit("scale", {"X": [prev]}, {"Out": [acc]}, {"scale": beta}, role_var=pair)


_register("sgd", "sgd", _sgd)
_register("momentum", "momentum", _momentum, "`regularization_method='l2_decay'` becomes "
                                             "`weight_decay`")
_register("adam", "adam (+ 4 scale)", _adam, "beta-power accumulators keep Paddle's meaning")
_register("adamw", "adam (decoupled, + 4 scale)", _adam, "`coeff` becomes `weight_decay`")
