"""The input pipeline: preparing each rank's next batch while the step runs.

Policy. Loader workers prepare the next batch while the current step runs
(prefetching), so the pipeline costs a step nothing until it is slower than the
step; then the step waits for it (the *stall*). Per step and rank:

* host work: ``batch * host_s`` core-seconds (decode, augment), done on the node's
  cores that its training processes leave free (one core each for the process that
  drives a GPU), shared by every rank of the node: ``batch * host_s * ranks_per_node
  / (cores - ranks_per_node)`` seconds of wall time;
* the copy to the device: ``batch * sample_bytes / Host.h2d_bw``, on a copy engine,
  overlapped too;
* device work of a GPU-side pipeline (DALI's resize and normalise kernels):
  ``batch * device_s``, which adds to the step (it runs on the same GPU).

A node with one GPU in use gives that rank all its cores; eight ranks share them:
the pipeline is one of the costs that grow with the number of ranks per node.

Invariants: ``synthetic`` costs nothing; the stall is never negative and never
falls as ranks per node grow.
"""

from dataclasses import dataclass, field

from ..core.errors import SSAExecError

__all__ = ["InputPipeline", "PIPELINES", "get_pipeline", "input_cost"]


@dataclass(frozen=True, slots=True)
class InputPipeline:
    """What preparing one sample costs: ``host_s`` core-seconds, ``device_s`` device
    seconds, ``sample_bytes`` copied to the device."""

    name: str
    host_s: float = 0.0
    device_s: float = 0.0
    sample_bytes: int = 0
    description: str = ""
    sources: tuple = field(default=())

    def to_dict(self):
        return {"name": self.name, "host_s": self.host_s, "device_s": self.device_s,
                "sample_bytes": self.sample_bytes, "description": self.description,
                "sources": list(self.sources)}


# ImageNet JPEGs decoded with Pillow, random-resized-cropped to 224x224, flipped and
# converted to a uint8 tensor, on one core of this project's build machine (2-core AMD
# EPYC KVM guest): bench/input_pipeline.py, docs/data/issue34/input_pipeline.json
IMAGENET_CPU_HOST_S = 1.44e-3
_IMAGE_BYTES = 224 * 224 * 3  # uint8 HWC, normalised on the device

PIPELINES = {
    "synthetic": InputPipeline("synthetic", description="data already on the device "
                               "(synthetic benchmarks): costs nothing"),
    "imagenet-cpu": InputPipeline(
        "imagenet-cpu", host_s=IMAGENET_CPU_HOST_S, sample_bytes=_IMAGE_BYTES,
        description="ImageNet JPEGs decoded and augmented on the CPU (Pillow, as "
                    "torchvision's loader), uint8 batches copied to the device",
        sources=("host_s measured: bench/input_pipeline.py (Pillow decode of 500x375 "
                 "JPEGs, RandomResizedCrop to 224, flip) on one core of a 2-core AMD "
                 "EPYC guest; a different CPU decodes at a different rate",)),
    "imagenet-dali": InputPipeline(
        "imagenet-dali", host_s=0.0, device_s=0.0, sample_bytes=0,
        description="ImageNet decoded and augmented on the GPU (NVIDIA DALI, as the "
                    "Deep Learning Examples run): no host decode, its kernels' time "
                    "is inside the measured one-GPU figure",
        sources=("NVIDIA DALI offloads JPEG decoding and augmentation to the GPU "
                 "(docs.nvidia.com/deeplearning/dali); its device time is not modelled "
                 "separately",)),
    "tokens": InputPipeline(
        "tokens", sample_bytes=0,
        description="pre-tokenised text shards (BERT's HDF5 shards): reading them is "
                    "negligible next to a step"),
}


def get_pipeline(name_or_pipeline):
    """A pipeline by name (``PIPELINES``), or an ``InputPipeline`` as it is."""
    if isinstance(name_or_pipeline, InputPipeline):
        return name_or_pipeline
    if name_or_pipeline is None:
        return PIPELINES["synthetic"]
    try:
        return PIPELINES[name_or_pipeline]
    except KeyError:
        raise SSAExecError(f"unknown input pipeline {name_or_pipeline!r}: use one of "
                           f"{', '.join(PIPELINES)}") from None


def input_cost(pipeline, cluster, batch, ranks_per_node, step_s):
    """What the pipeline costs one step of ``step_s`` seconds.

    Returns
    -------
    dict
        ``host_s`` (wall seconds the node's free cores need for every rank's batch),
        ``copy_s`` (the host-to-device copy), ``device_s`` (added to the step) and
        ``stall_s`` (how much longer than ``step_s`` the overlapped parts take).
    """
    p = get_pipeline(pipeline)
    host = cluster.host
    free = max(1, host.cores - ranks_per_node)
    host_wall = batch * p.host_s * ranks_per_node / free
    copy = batch * p.sample_bytes / host.h2d_bw if p.sample_bytes and host.h2d_bw else 0.0
    device = batch * p.device_s
    stall = max(0.0, max(host_wall, copy) - (step_s + device))
    return {"host_s": host_wall, "copy_s": copy, "device_s": device, "stall_s": stall}
