"""Cluster descriptions: devices, the host that drives them, links, and presets.

A ``Cluster`` is data only (frozen dataclasses, JSON round trip): nodes of
``gpus_per_node`` devices; each node's devices talk over ``intra`` (bandwidth per
direction per device, latency per message step) and the nodes over ``inter`` (the
node's whole network bandwidth, all NICs together, and the per-step latency); the
``host`` (CPU cores, the time an op's launch takes and how much of it holds the GIL,
the scheduler's hand-off latency) drives them. The collective cost models read it
(``ssaexec.sim.comm``); the engine reads the host and device parts.

The presets' figures and where they come from are in ``PRESETS[name].sources`` and
in docs/simulator.md. A CPU cluster for this machine is not a preset: it is measured
(``ssaexec.sim.calibrate.calibrate_cpu``) and can be saved with ``to_dict``.
"""

import dataclasses
import math
from dataclasses import dataclass, field

from ..errors import SSAExecError

__all__ = ["Link", "Device", "Host", "Cluster", "PRESETS", "get_cluster"]


@dataclass(frozen=True, slots=True)
class Link:
    """A level of the interconnect: ``bandwidth`` in bytes/s per direction, ``latency``
    in seconds per message step of a collective."""

    bandwidth: float
    latency: float


@dataclass(frozen=True, slots=True)
class Device:
    """One accelerator (``kind="gpu"``) or one CPU place (``kind="cpu"``).

    ``flops`` (fp32) and ``flops_low`` (bf16/fp16 tensor cores) are dense peaks in
    FLOP/s, ``mem_bw`` bytes/s: the roofline estimate of a profile uses them.
    ``kernel_min`` is the shortest time a kernel occupies a stream (launch latency on
    the device). GPUs run kernels asynchronously on streams; a CPU place runs them on
    the calling thread, on ``Host.cores`` shared with everything else on the machine.
    """

    kind: str
    name: str
    flops: float = 0.0
    flops_low: float = 0.0
    mem_bw: float = 0.0
    kernel_min: float = 0.0

    @property
    def is_gpu(self):
        return self.kind.startswith("gpu")


@dataclass(frozen=True, slots=True)
class Host:
    """The CPU side of a node.

    ``op_s``: host seconds to launch one op on the compiled path (Python, ATen
    dispatch, the kernel launch), used when the profile has no host time of its
    own; ``gil_fraction`` of it holds the GIL (ATen releases the GIL around dispatch
    and the kernel). ``hop_s``: latency of handing a ready node to an idle
    scheduler thread. ``step_s``: fixed host seconds per step and place (feed
    split and binding, fetch merge). ``graph_launch_s``: replaying one captured CUDA
    graph. ``cores``: CPU cores of the node (a CPU place's kernels run on them).
    ``readable_extra_s``: what the readable per-op path (``ssaexec trace``) adds to
    each op's time, subtracted from traced CPU op times. ``node_s``: the scheduler's
    bookkeeping per scheduled node (a lock and the successors' counts, GIL held).
    ``parallel_efficiency``: with every core running a kernel, each runs at this share
    of its speed alone (shared caches and memory bandwidth; linear in between).
    """

    cores: int = 64
    op_s: float = 6e-6
    gil_fraction: float = 0.4
    hop_s: float = 30e-6
    step_s: float = 50e-6
    graph_launch_s: float = 10e-6
    readable_extra_s: float = 8e-6
    node_s: float = 1e-6
    parallel_efficiency: float = 1.0


@dataclass(frozen=True, slots=True)
class Cluster:
    """Nodes of ``gpus_per_node`` devices joined by ``intra`` and ``inter`` links.

    ``collective_launch``: fixed seconds per collective call (NCCL's base latency).
    ``comm_channels``: collectives one process runs at once (NCCL: one
    communication stream; gloo: its worker threads). ``collective_issue_s``: host
    seconds to start one cross-process collective beyond an op's launch (a gloo
    call's bookkeeping; measured for CPU clusters). ``local_sum``: (α, bytes/s)
    of the in-process collective ``LocalCollective`` (``(P-1) · (α + S/B)`` for ``P``
    places): host work of CPU places, device work of GPU places sharing one device;
    None where collectives are NCCL's.
    ``sources``: where the figures come from.
    """

    name: str
    gpus_per_node: int
    device: Device
    host: Host
    intra: Link
    inter: Link
    collective_launch: float = 0.0
    comm_channels: int = 1
    collective_issue_s: float = 0.0
    local_sum: tuple = None
    description: str = ""
    sources: tuple = field(default=())

    def layout(self, ranks):
        """(nodes, ranks per node) of ``ranks`` ranks packed onto whole nodes."""
        g = max(1, min(ranks, self.gpus_per_node))
        return math.ceil(ranks / g), g

    def replace(self, **changes):
        """A copy with some fields changed (``host=`` etc. take whole objects)."""
        return dataclasses.replace(self, **changes)

    def with_host(self, **changes):
        """A copy whose host has some fields changed."""
        return dataclasses.replace(self, host=dataclasses.replace(self.host, **changes))

    def to_dict(self):
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d):
        d = dict(d)
        d["device"] = Device(**d["device"])
        d["host"] = Host(**d["host"])
        d["intra"] = Link(**d["intra"])
        d["inter"] = Link(**d["inter"])
        d["local_sum"] = tuple(d["local_sum"]) if d.get("local_sum") else None
        d["sources"] = tuple(d.get("sources", ()))
        return cls(**d)


# NCCL's tuner (src/graph/tuning.cc, NCCL 2.x): base latency of a ring/LL128 call
# 10.0 us; per-step hardware latency NVLink 1.9 us, PCIe 2.5 us, network 4.0 us.
_NCCL = "NCCL src/graph/tuning.cc (baseLat ring/LL128 10.0 us; hwLat NVLink 1.9, PCI 2.5, " \
        "NET 4.0 us per step)"
_HOST = ("host launch time per op: 6 us of which 40 % under the GIL (an assumption in line "
         "with eager PyTorch's few-us-per-op overhead; ATen releases the GIL in dispatch); "
         "replace it with a trace of your own machine (ssaexec trace) or --host-op-us")

H100_SXM = Device("gpu", "H100 SXM5 80GB", flops=66.9e12, flops_low=989.4e12,
                  mem_bw=3.35e12, kernel_min=2.5e-6)
A100_SXM = Device("gpu", "A100 SXM4 80GB", flops=19.5e12, flops_low=312e12,
                  mem_bw=2.039e12, kernel_min=2.5e-6)
A100_PCIE = Device("gpu", "A100 PCIe 80GB", flops=19.5e12, flops_low=312e12,
                   mem_bw=1.935e12, kernel_min=2.5e-6)

PRESETS = {
    "dgx-h100": Cluster(
        "dgx-h100", 8, H100_SXM, Host(cores=112),
        intra=Link(450e9, 1.9e-6), inter=Link(8 * 50e9, 4.0e-6),
        collective_launch=10e-6, comm_channels=1,
        description="NVIDIA DGX H100: 8x H100 SXM5, NVLink4 via NVSwitch (450 GB/s per "
                    "direction per GPU), 8x 400 Gb/s InfiniBand NDR per node",
        sources=("NVIDIA DGX H100 datasheet: 8x H100, 900 GB/s bidirectional NVLink per GPU, "
                 "8x single-port ConnectX-7 400 Gb/s InfiniBand, 2x Xeon 8480C (112 cores)",
                 "NVIDIA H100 datasheet (SXM5): FP32 66.9 TFLOPS, BF16 dense 989.4 TFLOPS, "
                 "HBM3 3.35 TB/s", _NCCL, _HOST)),
    "dgx-a100": Cluster(
        "dgx-a100", 8, A100_SXM, Host(cores=128),
        intra=Link(300e9, 1.9e-6), inter=Link(8 * 25e9, 4.0e-6),
        collective_launch=10e-6, comm_channels=1,
        description="NVIDIA DGX A100: 8x A100 SXM4, NVLink3 via NVSwitch (300 GB/s per "
                    "direction per GPU), 8x 200 Gb/s InfiniBand HDR per node",
        sources=("NVIDIA DGX A100 datasheet: 600 GB/s bidirectional NVLink per GPU, 8x "
                 "ConnectX-6 200 Gb/s HDR InfiniBand, 2x EPYC 7742 (128 cores)",
                 "NVIDIA A100 datasheet (SXM4 80GB): FP32 19.5 TFLOPS, BF16 dense 312 "
                 "TFLOPS, 2.039 TB/s", _NCCL, _HOST)),
    "pcie": Cluster(
        "pcie", 8, A100_PCIE, Host(cores=64),
        intra=Link(31.5e9, 2.5e-6), inter=Link(25e9, 4.0e-6),
        collective_launch=10e-6, comm_channels=1,
        description="8x A100 PCIe per node without NVLink (PCIe 4.0 x16, 31.5 GB/s per "
                    "direction), one 200 Gb/s InfiniBand HDR NIC per node",
        sources=("PCI Express 4.0: 16 GT/s x 16 lanes x 128/130 = 31.5 GB/s per direction",
                 "NVIDIA A100 PCIe datasheet: FP32 19.5 TFLOPS, BF16 dense 312 TFLOPS, "
                 "1.935 TB/s", "InfiniBand HDR: 200 Gb/s = 25 GB/s per direction",
                 _NCCL, _HOST)),
}

# the same nodes, joined by plain Ethernet instead of InfiniBand
PRESETS["ethernet-100g"] = PRESETS["pcie"].replace(
    name="ethernet-100g", inter=Link(12.5e9, 25e-6),
    description="8x A100 PCIe per node, nodes joined by one 100 Gb/s Ethernet NIC "
                "(TCP sockets, no RDMA)",
    sources=("100GbE: 12.5 GB/s per direction", "latency 25 us per step: kernel TCP round "
             "trips take tens of us (an assumption; RoCE would be ~5 us)",
             "PCI Express 4.0 x16: 31.5 GB/s per direction", _NCCL, _HOST))


def get_cluster(name_or_path):
    """A preset by name, or a cluster saved as JSON (``Cluster.to_dict``) by path."""
    if isinstance(name_or_path, Cluster):
        return name_or_path
    if name_or_path in PRESETS:
        return PRESETS[name_or_path]
    import json
    import os
    if os.path.exists(name_or_path):
        try:
            with open(name_or_path, encoding="utf-8") as f:
                return Cluster.from_dict(json.load(f))
        except (OSError, ValueError, TypeError, KeyError) as e:
            raise SSAExecError(f"{name_or_path}: not a cluster description ({e})") from None
    raise SSAExecError(f"unknown cluster {name_or_path!r}: use one of {', '.join(PRESETS)} or a "
                   "JSON file written by Cluster.to_dict (bench/validate_sim.py writes one)")
