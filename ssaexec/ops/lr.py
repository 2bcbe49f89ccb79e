"""Learning-rate schedule op: the rate as a function of a step counter, on the device.

``lr_schedule`` reads ``Step`` (a float64 scalar: optimizer steps taken) and writes
``LearningRate`` in the rate var's dtype. ``kind`` picks the rule; the rules are those
of ``torch.optim.lr_scheduler`` in closed form, with ``t = Step - offset`` (clamped
at 0; ``offset`` lets a warm-up hand over to a schedule that starts after it):

* ``step``: ``base * gamma ** floor(t / step_size)``
* ``multistep``: ``base * gamma ** (number of milestones <= t)``
* ``exponential``: ``base * gamma ** t``
* ``cosine``: ``eta_min + (base - eta_min) * (1 + cos(pi * t / T_max)) / 2``
* ``piecewise``: ``values[number of boundaries <= t]``
* ``table``: ``base * Table[min(t, len - 1)]`` (``LambdaDecay``: the lambda is
  evaluated when the program is built into the persistable ``Table``; programs never
  hold code)
* ``warmup``: ``start + (end - start) * t / warmup_steps`` while ``t < warmup_steps``,
  then ``After`` (the rate of the schedule it wraps) or ``end``.

Everything is a tensor operation on the counter's device, with Python numbers as the
only constants (no host-to-device copy, no host sync), so every place and process
computes the same rate and a CUDA graph replays it.
"""

import math

import torch

from ..core.dtypes import torch_dtype
from .registry import register_op

KINDS = ("step", "multistep", "exponential", "cosine", "piecewise", "table", "warmup")


def _infer(ins, attrs):
    return {"LearningRate": ([], attrs["dtype"])}


@register_op("lr_schedule", ["Step", "After?", "Table?"], ["LearningRate"],
             {"kind": ("str", "step"), "base_lr": ("float", 0.1), "dtype": ("dtype", "float32"),
              "offset": ("int", 0), "step_size": ("int", 1), "gamma": ("float", 0.1),
              "milestones": ("ints", []), "T_max": ("int", 1), "eta_min": ("float", 0.0),
              "boundaries": ("ints", []), "values": ("floats", []), "warmup_steps": ("int", 1),
              "start_lr": ("float", 0.0), "end_lr": ("float", 0.0)},
             infer=_infer, grad=None)
def lr_schedule(ins, attrs):
    """LearningRate = the schedule ``kind`` at step ``Step`` (see the module docstring)."""
    step = ins["Step"].to(torch.float64)
    t = torch.clamp(step - attrs["offset"], min=0)
    rule, base = attrs["kind"], attrs["base_lr"]
    if rule == "step":
        lr = base * torch.pow(attrs["gamma"], torch.floor(t / attrs["step_size"]))
    elif rule == "multistep":
        passed = torch.zeros_like(t)
        for m in attrs["milestones"]:
            passed = passed + (t >= m).to(torch.float64)
        lr = base * torch.pow(attrs["gamma"], passed)
    elif rule == "exponential":
        lr = base * torch.pow(attrs["gamma"], t)
    elif rule == "cosine":
        eta = attrs["eta_min"]
        lr = eta + (base - eta) * (1 + torch.cos(math.pi * t / attrs["T_max"])) / 2
    elif rule == "piecewise":
        values = attrs["values"]
        lr = torch.full_like(t, values[0])
        for b, v in zip(attrs["boundaries"], values[1:], strict=True):
            lr = torch.where(t >= b, v, lr)
    elif rule == "table":
        table = ins["Table"].to(torch.float64)
        # take, not table[t]: indexing with a 0-dim tensor reads it on the host (.item()),
        # a sync every step on a GPU and a break in CUDA-graph capture
        lr = base * torch.take(table, torch.clamp(t, max=table.numel() - 1).to(torch.int64))
    elif rule == "warmup":
        w = attrs["warmup_steps"]
        start, end = attrs["start_lr"], attrs["end_lr"]
        after = ins.get("After")
        after = after.to(torch.float64) if after is not None else torch.full_like(t, end)
        lr = torch.where(t < w, start + (end - start) * t / w, after)
    else:
        raise ValueError(f"lr_schedule kind must be one of {KINDS}, got {rule!r}")
    return {"LearningRate": lr.to(torch_dtype(attrs["dtype"]))}
