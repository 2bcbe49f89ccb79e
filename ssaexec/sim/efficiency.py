"""How close to the roofline each class of op runs: the estimate's efficiency factors.

``Profile.estimate`` times an op as the longest of its FLOPs at a share of the math
unit's peak, its bytes at a share of the memory bandwidth, and the shortest kernel.
The shares depend on the class of the op:

* ``conv`` (convolutions) and ``matmul`` (matrix products) are compute classes, with
  one share per math unit: ``fp32`` (the CUDA cores), ``tf32`` (TF32 tensor cores) and
  ``fp16`` (FP16/BF16 tensor cores, automatic mixed precision);
* ``norm`` (batch and layer norm) and ``elementwise`` (everything else) are memory
  classes, with one share of the memory bandwidth each;
* ``view`` ops (reshape, transpose, split ...) are views in PyTorch: no kernel.

Policy. The compute shares are *calibrated*: ``bench/calibrate_sim.py`` solves, for
each row of ``docs/data/published.json`` marked ``"use": "calibration"`` (one GPU,
one model, one math unit), the share that predicts that row's published throughput,
and writes it into ``CALIBRATED`` below with the row it came from. The memory
shares are priors, not fitted (no published per-class figure was found): a
streaming kernel reaches about 85 % of the bandwidth, and a training-mode
normalisation reads its input twice where the estimate counts once. A share fitted
on one row is never judged on that row: the validation table marks calibration rows.
A profile measured on the GPU (``Profile.measure``, ``from_trace``) replaces the
estimate and all of this.

Invariant: every share is in (0, 1]; ``op_class`` maps every op type to one class.
"""

__all__ = ["OP_CLASSES", "UNITS", "op_class", "CALIBRATED", "PRIOR", "shares", "describe",
           "interference"]

# op types of the compute and normalisation classes (a "_grad" suffix is the same class)
OP_CLASSES = {
    "conv": ("conv2d", "depthwise_conv2d", "conv2d_transpose", "conv3d"),
    "matmul": ("mul", "matmul", "matmul_v2", "fc", "bmm"),
    "norm": ("batch_norm", "layer_norm", "group_norm", "instance_norm", "sync_batch_norm"),
    # views of their input in PyTorch (no kernel, nothing moved)
    "view": ("reshape", "reshape2", "flatten", "flatten2", "squeeze", "squeeze2",
             "unsqueeze", "unsqueeze2", "transpose", "transpose2", "split"),
}
_BY_TYPE = {t: cls for cls, types in OP_CLASSES.items() for t in types}

# Fallback shares when a class has no calibration: 50 % of the math unit's peak, the
# memory priors below (the estimate's figures before issue 34)
PRIOR = {"conv": {"fp32": 0.5, "tf32": 0.5, "fp16": 0.5},
         "matmul": {"fp32": 0.5, "tf32": 0.5, "fp16": 0.5},
         "norm": 0.85 * 2 / 3, "elementwise": 0.85,
         # fused (flash) attention, sim.llama: FlashAttention-2 reaches 35 % of an H100's
         # BF16 peak (Shah et al., "FlashAttention-3", 2024, abstract); a prior, not fitted
         "attention": {"fp32": 0.35, "tf32": 0.35, "fp16": 0.35}}
UNITS = ("fp32", "tf32", "fp16")

# Written by bench/calibrate_sim.py from docs/data/published.json (do not edit by hand;
# rerun it): class -> unit -> {"share", "row", "published", "unit"}.
CALIBRATED = {'conv': {'fp16': {'row': 'rn50-a100-amp-1', 'share': 0.3837},
          'fp32': {'row': 'rn50-v100-fp32-1', 'share': 0.8534},
          'tf32': {'row': 'rn50-a100-tf32-1', 'share': 0.2329}},
 'interference': {'gpu': {'row': 'rn50-v100-ddp-8', 'share': 0.0306}},
 'matmul': {'fp16': {'row': 'bert-a100-amp-1', 'share': 0.6708},
            'fp32': {'row': 'bert-v100-fp32-1', 'share': 0.8687},
            'tf32': {'row': 'bert-a100-tf32-1', 'share': 0.7631}}
}


def op_class(op_type):
    """The class of ``op_type``: conv, matmul, norm, view or elementwise."""
    base = op_type[:-5] if op_type.endswith("_grad") else op_type
    return _BY_TYPE.get(base, "elementwise")


def shares(overrides=None):
    """{class: share} for the memory classes and {class: {unit: share}} for the compute
    classes: the calibrated values over the priors, then ``overrides`` (same form, or
    a number for every unit of a compute class)."""
    out = {"conv": dict(PRIOR["conv"]), "matmul": dict(PRIOR["matmul"]),
           "norm": PRIOR["norm"], "elementwise": PRIOR["elementwise"],
           "attention": dict(PRIOR["attention"])}
    for cls in ("conv", "matmul"):
        for unit, entry in CALIBRATED.get(cls, {}).items():
            out[cls][unit] = entry["share"]
    for cls, v in (overrides or {}).items():
        if cls not in out:
            raise ValueError(f"unknown op class {cls!r}: use one of {', '.join(out)}")
        if isinstance(out[cls], dict):
            out[cls] = dict(out[cls], **v) if isinstance(v, dict) else \
                {u: float(v) for u in out[cls]}
        else:
            out[cls] = float(v)
    for cls, v in out.items():
        for x in (v.values() if isinstance(v, dict) else (v,)):
            if not 0 < x <= 1:
                raise ValueError(f"efficiency of {cls} must be in (0, 1], got {x}")
    return out


def interference():
    """The share by which a GPU's compute slows in a step that runs collectives beside
    it (NCCL's kernels and the data-parallel bookkeeping; calibrated, 0 without)."""
    entry = CALIBRATED.get("interference", {}).get("gpu")
    return entry["share"] if entry else 0.0


def describe(unit):
    """One line: which shares the estimate uses on ``unit`` and where they come from."""
    parts = []
    for cls in ("conv", "matmul"):
        entry = CALIBRATED.get(cls, {}).get(unit)
        if entry:
            parts.append(f"{cls} {entry['share']:.0%} (calibrated on {entry['row']})")
        else:
            parts.append(f"{cls} {PRIOR[cls][unit]:.0%} (prior)")
    parts.append(f"norm {PRIOR['norm']:.0%}, elementwise {PRIOR['elementwise']:.0%} of "
                 "bandwidth (priors)")
    return ", ".join(parts) + "; " + CONFIDENCE


# how far the calibrated shares carry (docs/simulator.md, the held-out one-GPU rows)
CONFIDENCE = "within about 15 % on published one-GPU rows not fitted"
