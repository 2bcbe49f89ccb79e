"""Dynamic loss scaling for fp16 (``ssaexec.program.amp``), on the device without host syncs.

``amp_unscale`` divides every gradient by the loss scale in place and sets
``FoundInf`` (1.0 when any gradient has an inf or a NaN). ``amp_update_scale``
then halves the scale after an overflow or doubles it after ``growth_interval``
clean steps, and counts the skipped steps; the optimizer ops skip their update when
``FoundInf`` is set (their ``SkipUpdate`` input). Everything stays a tensor on the
place's device, so a CUDA graph can replay the step and no step waits for the host.
"""

import torch

from ..core.compat import amp_unscale_, amp_update_scale_
from .registry import register_op


def _infer_unscale(ins, attrs):
    return {"GradsOut": [(s, d) for s, d in ins["Grads"]], "FoundInf": ([], "float32")}


@register_op("amp_unscale", ["Grads*", "Scale"], ["GradsOut*", "FoundInf"], grad=None,
             inplace=True, infer=_infer_unscale)
def amp_unscale(ins, attrs):
    """GradsOut = Grads / Scale (in place); FoundInf = 1.0 if any is not finite."""
    grads, scale = ins["Grads"], ins["Scale"]
    found = torch.zeros((), dtype=torch.float32, device=scale.device)
    amp_unscale_(grads, found, scale.reciprocal())
    return {"GradsOut": grads, "FoundInf": found}


@register_op("amp_update_scale", ["Scale", "GrowthTracker", "FoundInf", "SkippedSteps"],
             ["ScaleOut", "GrowthTrackerOut", "SkippedStepsOut"],
             {"growth_factor": ("float", 2.0), "backoff_factor": ("float", 0.5),
              "growth_interval": ("int", 2000)}, grad=None, inplace=True)
def amp_update_scale(ins, attrs):
    """Halve the scale after an overflow, grow it after ``growth_interval`` clean steps."""
    scale, tracker, found = ins["Scale"], ins["GrowthTracker"], ins["FoundInf"]
    amp_update_scale_(scale, tracker, found, attrs["growth_factor"],
                             attrs["backoff_factor"], attrs["growth_interval"])
    skipped = ins["SkippedSteps"]
    skipped.add_(found.to(skipped.dtype))
    return {"ScaleOut": scale, "GrowthTrackerOut": tracker, "SkippedStepsOut": skipped}
