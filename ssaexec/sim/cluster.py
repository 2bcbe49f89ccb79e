"""Cluster descriptions: devices, the host that drives them, links, and presets.

A ``Cluster`` is data only (frozen dataclasses, JSON round trip): nodes of
``gpus_per_node`` devices; each node's devices talk over ``intra`` (bandwidth per
direction per device, latency per message step) and the nodes over ``inter`` (the
node's whole network bandwidth, all NICs together, and the per-step latency); the
``host`` (CPU cores, the time an op's launch takes and how much of it holds the GIL,
the scheduler's hand-off latency) drives them. The collective cost models read it
(``ssaexec.sim.comm_cost``); the engine reads the host and device parts.

The presets' figures and where they come from are in ``PRESETS[name].sources`` and
in docs/simulator.md. A CPU cluster for this machine is not a preset: it is measured
(``ssaexec.sim.calibrate.calibrate_cpu``) and can be saved with ``to_dict``.
"""

import dataclasses
import math
from dataclasses import dataclass, field

from ..core.errors import SSAExecError

__all__ = ["Link", "Device", "Host", "Cluster", "PRESETS", "get_cluster"]


@dataclass(frozen=True, slots=True)
class Link:
    """A level of the interconnect: ``bandwidth`` in bytes/s per direction, ``latency``
    in seconds per message step of a collective, and ``efficiency``, the share of
    ``bandwidth`` a collective's bus bandwidth reaches on large messages (NCCL's
    published all-reduce bus bandwidth over the link's; 1.0 for a measured link, whose
    bandwidth is already what collectives get)."""

    bandwidth: float
    latency: float
    efficiency: float = 1.0

    @property
    def bus(self):
        """Bytes/s a collective moves per direction per rank on large messages."""
        return self.bandwidth * self.efficiency


@dataclass(frozen=True, slots=True)
class Device:
    """One accelerator (``kind="gpu"``) or one CPU place (``kind="cpu"``).

    ``flops`` (fp32 on the CUDA cores), ``flops_tf32`` (TF32 tensor cores; 0 where the
    device has none, and fp32 programs then run at ``flops``) and ``flops_low``
    (bf16/fp16 tensor cores) are dense peaks in FLOP/s, ``mem_bw`` bytes/s: the
    roofline estimate of a profile uses them.
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
    flops_tf32: float = 0.0

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
    ``h2d_bw``: bytes/s of a host-to-device copy (the input pipeline's batches).
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
    h2d_bw: float = 25e9


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
    ``jitter_cv``: the spread of one rank's step time (standard deviation over mean;
    ``ssaexec.sim.stragglers``): a synchronous step waits for the slowest rank.
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
    jitter_cv: float = 0.0
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
                  mem_bw=3.35e12, kernel_min=2.5e-6, flops_tf32=494.7e12)
A100_SXM = Device("gpu", "A100 SXM4 80GB", flops=19.5e12, flops_low=312e12,
                  mem_bw=2.039e12, kernel_min=2.5e-6, flops_tf32=156e12)
A100_PCIE = Device("gpu", "A100 PCIe 80GB", flops=19.5e12, flops_low=312e12,
                   mem_bw=1.935e12, kernel_min=2.5e-6, flops_tf32=156e12)
V100_SXM2 = Device("gpu", "V100 SXM2 16GB", flops=15.7e12, flops_low=125e12,
                   mem_bw=900e9, kernel_min=2.5e-6)
# Pascal has no tensor cores: its fp16 rate is twice the fp32 one (no "amp" speed-up for
# products beyond that); fp32 programs run on the CUDA cores
P100_SXM2 = Device("gpu", "P100 SXM2 16GB", flops=10.6e12, flops_low=21.2e12,
                   mem_bw=720e9, kernel_min=2.5e-6)
P100_PCIE = Device("gpu", "P100 PCIe 16GB", flops=9.3e12, flops_low=18.7e12,
                   mem_bw=720e9, kernel_min=2.5e-6)

# NCCL's bus bandwidth on large all-reduces, over the links' line rate (NVIDIA's NCCL
# maintainer, github.com/NVIDIA/nccl-tests issues 149, 212 and 29, NVIDIA/nccl issue 412):
# an NVLink moves ~20 of its 25 GB/s of payload with 128-byte packets; A100's eight GPUs
# reach ~230 of 300 GB/s; H100's NVLink ~370 of 450 GB/s; a 100 Gb/s InfiniBand card
# 12.2 of 12.5 GB/s ("DGX-1 can get 48 GB/s" with four), an HDR card 24 of 25 GB/s
_NCCL_BW = ("NCCL bus bandwidth on large all-reduces, NVIDIA's NCCL maintainer: A100 NVLink "
            "~230 of 300 GB/s (nccl-tests#149), H100 NVLink ~370 of 450 GB/s (nccl-tests#212),"
            " NVLink 20 of 25 GB/s per link with 128 B packets (nccl-tests#149), 100 Gb/s "
            "InfiniBand 12.2 GB/s per card, 48 GB/s for a DGX-1's four (nccl-tests#29), HDR "
            "24 GB/s per card (nccl#412)")
_JITTER = ("jitter_cv 0.3 %: the spread of one GPU's step in PyTorch's DDP benchmark "
           "(pytorch/pytorch benchmarks/distributed/ddp/README.md, V100, synthetic data): "
           "p50 and p90 equal to the millisecond for ResNet-50/101, 0.1-0.5 % apart for "
           "ResNeXt-50/101 (stragglers.cv_from_percentiles); real input pipelines add more")
GPU_JITTER_CV = 0.003

PRESETS = {
    "dgx-h100": Cluster(
        "dgx-h100", 8, H100_SXM, Host(cores=112, h2d_bw=64e9),
        intra=Link(450e9, 1.9e-6, 370 / 450), inter=Link(8 * 50e9, 4.0e-6, 24 / 25),
        collective_launch=10e-6, comm_channels=1, jitter_cv=GPU_JITTER_CV,
        description="NVIDIA DGX H100: 8x H100 SXM5, NVLink4 via NVSwitch (450 GB/s per "
                    "direction per GPU), 8x 400 Gb/s InfiniBand NDR per node",
        sources=("NVIDIA DGX H100 datasheet: 8x H100, 900 GB/s bidirectional NVLink per GPU, "
                 "8x single-port ConnectX-7 400 Gb/s InfiniBand, 2x Xeon 8480C (112 cores)",
                 "NVIDIA H100 datasheet (SXM5): FP32 66.9 TFLOPS, TF32 dense 494.7, BF16 dense "
                 "989.4 TFLOPS, HBM3 3.35 TB/s, 132 SMs; PCIe 5.0 x16 64 GB/s",
                 _NCCL, _NCCL_BW + " (NDR assumed as efficient as HDR)", _JITTER, _HOST)),
    "dgx-a100": Cluster(
        "dgx-a100", 8, A100_SXM, Host(cores=128, h2d_bw=31.5e9),
        intra=Link(300e9, 1.9e-6, 230 / 300), inter=Link(8 * 25e9, 4.0e-6, 24 / 25),
        collective_launch=10e-6, comm_channels=1, jitter_cv=GPU_JITTER_CV,
        description="NVIDIA DGX A100: 8x A100 SXM4, NVLink3 via NVSwitch (300 GB/s per "
                    "direction per GPU), 8x 200 Gb/s InfiniBand HDR per node",
        sources=("NVIDIA DGX A100 datasheet: 600 GB/s bidirectional NVLink per GPU, 8x "
                 "ConnectX-6 200 Gb/s HDR InfiniBand, 2x EPYC 7742 (128 cores)",
                 "NVIDIA A100 datasheet (SXM4 80GB): FP32 19.5 TFLOPS, TF32 dense 156, BF16 "
                 "dense 312 TFLOPS, 2.039 TB/s, 108 SMs; PCIe 4.0 x16 31.5 GB/s", _NCCL, _NCCL_BW,
                 _JITTER, _HOST)),
    "dgx-1v": Cluster(
        "dgx-1v", 8, V100_SXM2, Host(cores=40, h2d_bw=15.75e9),
        intra=Link(150e9, 1.9e-6, 20 / 25), inter=Link(4 * 12.5e9, 4.0e-6, 48 / 50),
        collective_launch=10e-6, comm_channels=1, jitter_cv=GPU_JITTER_CV,
        description="NVIDIA DGX-1 with V100: 8x V100 SXM2 in a hybrid cube mesh of NVLink2 "
                    "(6 links of 25 GB/s per direction per GPU), 4x 100 Gb/s EDR InfiniBand "
                    "per node",
        sources=("NVIDIA DGX-1 with Tesla V100 whitepaper: 8 V100 in a hybrid cube-mesh "
                 "NVLink network, dual Xeon (2x E5-2698 v4, 40 cores), four 100 Gb "
                 "InfiniBand cards",
                 "NVIDIA V100 SXM2: FP32 15.7 TFLOPS, 125 tensor TFLOPS, HBM2 900 GB/s, 80 SMs, six "
                 "NVLinks of 25 GB/s per direction; PCIe 3.0 x16 15.75 GB/s",
                 "a ring over the hybrid cube mesh is taken to use all six links of a GPU "
                 "(an assumption: NCCL builds several rings over them)",
                 _NCCL, _NCCL_BW, _JITTER, _HOST)),
    "pcie": Cluster(
        "pcie", 8, A100_PCIE, Host(cores=64, h2d_bw=31.5e9),
        intra=Link(31.5e9, 2.5e-6), inter=Link(25e9, 4.0e-6, 24 / 25),
        collective_launch=10e-6, comm_channels=1, jitter_cv=GPU_JITTER_CV,
        description="8x A100 PCIe per node without NVLink (PCIe 4.0 x16, 31.5 GB/s per "
                    "direction), one 200 Gb/s InfiniBand HDR NIC per node",
        sources=("PCI Express 4.0: 16 GT/s x 16 lanes x 128/130 = 31.5 GB/s per direction",
                 "NVIDIA A100 PCIe datasheet: FP32 19.5 TFLOPS, TF32 dense 156, BF16 dense "
                 "312 TFLOPS, 1.935 TB/s", "InfiniBand HDR: 200 Gb/s = 25 GB/s per direction",
                 _NCCL, _NCCL_BW, _JITTER, _HOST)),
    "big-basin-50gbe": Cluster(
        "big-basin-50gbe", 8, P100_SXM2, Host(cores=40, h2d_bw=15.75e9),
        intra=Link(80e9, 1.9e-6, 20 / 25), inter=Link(6.25e9, 25e-6),
        collective_launch=10e-6, comm_channels=1, jitter_cv=GPU_JITTER_CV,
        description="Facebook Big Basin: 8x P100 SXM2 joined by NVLink (4 links of 20 GB/s "
                    "per direction per GPU), nodes joined by 50 Gb/s Ethernet",
        sources=("Goyal et al. 2017 (arXiv 1706.02677) and NVIDIA's blog on it: Big Basin, "
                 "eight Tesla P100 interconnected with NVLink; 50 Gbit Ethernet (NVIDIA's "
                 "table of ImageNet records)",
                 "P100 SXM2: FP32 10.6 TFLOPS, FP16 21.2 TFLOPS, HBM2 720 GB/s, 56 SMs, NVLink 160 "
                 "GB/s bidirectional (4 links)", "host cores 40: an assumption (two 20-core "
                 "Xeons, as DGX-1)", "Ethernet latency 25 us per step: TCP (assumed, as "
                 "ethernet-100g)", _NCCL, _JITTER, _HOST)),
    "pascal-25gbe": Cluster(
        "pascal-25gbe", 4, P100_PCIE, Host(cores=32, h2d_bw=15.75e9),
        intra=Link(15.75e9, 2.5e-6), inter=Link(3.125e9, 5e-6),
        collective_launch=10e-6, comm_channels=1, jitter_cv=GPU_JITTER_CV,
        description="4x Pascal (P100 PCIe) per server on PCIe 3.0, servers joined by "
                    "25 Gb/s RoCE (Horovod's benchmark cluster)",
        sources=("Horovod docs/benchmarks.rst: 128 servers with 4 Pascal GPUs each connected "
                 "by a RoCE-capable 25 Gbit/s network", "the Pascal model (P100 PCIe: FP32 "
                 "9.3 TFLOPS, 720 GB/s), PCIe 3.0 x16 (15.75 GB/s) between them and 32 host "
                 "cores are assumptions", "RoCE latency 5 us per step (an assumption)",
                 _NCCL, _JITTER, _HOST)),
}

# Meta's Grand Teton hosts, as torchtitan's published runs describe them (docs/performance.md
# at eaea6f6a2fa9): 8 H100 SXM with 96 GB HBM2e at 2.4 TB/s, power-limited to 500 W,
# fully connected with NVLink; 400 Gb/s of RDMA per GPU between hosts. Its dense BF16 peak
# is not published: "between SXM and NVL" (the same document's footnote), i.e. between
# H100 SXM5's 989.4 and H100 NVL's 835.5 TFLOP/s; the preset takes the middle, 912.5,
# and scales the FP32 and TF32 peaks alike (sim.llama's table shows both ends)
_GT_PEAK = (989.4e12 + 835.5e12) / 2
H100_GT = Device("gpu", "H100 SXM 96GB HBM2e, 500 W (Grand Teton)",
                 flops=66.9e12 * _GT_PEAK / 989.4e12, flops_low=_GT_PEAK, mem_bw=2.4e12,
                 kernel_min=2.5e-6, flops_tf32=494.7e12 * _GT_PEAK / 989.4e12)
PRESETS["grand-teton-h100"] = PRESETS["dgx-h100"].replace(
    name="grand-teton-h100", device=H100_GT,
    inter=Link(8 * 50e9, 4.0e-6, 24 / 25),
    description="Meta Grand Teton: 8x H100 SXM 96GB HBM2e (2.4 TB/s, 500 W) fully connected "
                "with NVLink, 400 Gb/s RDMA per GPU between hosts (torchtitan's benchmark "
                "machines)",
    sources=("pytorch/torchtitan docs/performance.md (eaea6f6a2fa9): 8 H100 per host fully "
             "connected with NVLink, 96GB HBM2e at 2.4 TB/s, 400 Gb/s RDMA per GPU, 500 W "
             "power limit; peak 'between SXM and NVL' (not published)",
             "dense BF16 peak: the middle of H100 SXM5 (989.4 TFLOP/s, H100 datasheet) and "
             "H100 NVL (835.5 TFLOP/s, H100 NVL datasheet: 1,671 with sparsity): 912.5 "
             "(an assumption within that range); FP32/TF32 scaled alike",
             "NVLink and host: as dgx-h100; the RDMA network taken as efficient as InfiniBand "
             "NDR (24/25 of the line rate)", _NCCL, _NCCL_BW, _JITTER, _HOST))

# the same nodes, joined by plain Ethernet instead of InfiniBand
PRESETS["ethernet-100g"] = PRESETS["pcie"].replace(
    name="ethernet-100g", inter=Link(12.5e9, 25e-6),
    description="8x A100 PCIe per node, nodes joined by one 100 Gb/s Ethernet NIC "
                "(TCP sockets, no RDMA)",
    sources=("100GbE: 12.5 GB/s per direction", "latency 25 us per step: kernel TCP round "
             "trips take tens of us (an assumption; RoCE would be ~5 us)",
             "PCI Express 4.0 x16: 31.5 GB/s per direction", _NCCL, _JITTER, _HOST))


def get_cluster(name_or_path):
    """A preset by name, or a cluster saved as JSON (``Cluster.to_dict``) by path."""
    if isinstance(name_or_path, Cluster):
        return name_or_path
    if name_or_path in PRESETS:
        return PRESETS[name_or_path]
    import os

    from ..program.json_scan import load_bounded
    from ..core.safe_files import read_regular
    if os.path.exists(name_or_path):
        try:  # a regular file (a FIFO is refused, not waited on), bounded like a program
            text = read_regular(name_or_path).decode("utf-8")
            return Cluster.from_dict(load_bounded(text, name_or_path))
        except (OSError, ValueError, TypeError, KeyError, AttributeError, SSAExecError) as e:
            raise SSAExecError(f"{name_or_path}: not a cluster description ({e})") from None
    raise SSAExecError(f"unknown cluster {name_or_path!r}: use one of {', '.join(PRESETS)} or a "
                   "JSON file written by Cluster.to_dict (bench/validate_sim.py writes one)")
