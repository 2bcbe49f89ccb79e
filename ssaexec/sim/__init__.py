"""The scaling simulator: predict a program's step time on N devices from one place's profile.

Modules, one concept each:

* ``cluster``: ``Cluster`` (devices, host, links) and the presets (``dgx-h100`` ...);
* ``comm_cost``: α-β cost models of ring, tree and hierarchical collectives (all-reduce,
  reduce, broadcast, all-gather, reduce-scatter);
* ``profile``: ``Profile``, op durations from a trace, measured, or estimated;
* ``engine``: the discrete-event replay of one process's step (host, GIL, scheduler
  threads, streams, collectives) and its critical path;
* ``predict``: whole configurations (ranks, process layout, build strategy), scaling
  sweeps and bucket-size sweeps, with what grows with the cluster;
* ``efficiency``: the roofline estimate's per-op-class shares, calibrated on
  published one-GPU results;
* ``stragglers``: the slowest of N ranks (expected maximum of their step times);
* ``input_pipeline``: preparing each rank's batch while the step runs;
* ``published``: the validation against published results (docs/data/published.json);
* ``memory``: each device's peak memory under ZeRO 0-3 (``ssaexec stats --zero``);
* ``llama``: a Llama-style model and its prediction against torchtitan's FSDP2 runs;
* ``calibrate``: a cluster of this machine's CPU places, or of its GPU, measured;
* ``report``: table, JSON and plot.

docs/simulator.md explains the model and its validation against measured runs.
"""

from .cluster import PRESETS, Cluster, Device, Host, Link, get_cluster
from .comm_cost import (
    collective_time, hierarchical_all_reduce, ring_all_reduce, ring_broadcast, ring_reduce,
    tree_all_reduce
)
from .engine import SimResult, simulate_step
from .predict import LAYOUTS, Prediction, predict, scaling, sweep_bucket_mb
from .profile import OpCost, Profile, op_key

__all__ = ["simulate", "Cluster", "Device", "Host", "Link", "PRESETS", "get_cluster",
           "Profile", "OpCost", "op_key", "SimResult", "Prediction", "LAYOUTS", "predict",
           "scaling", "sweep_bucket_mb", "collective_time", "ring_all_reduce",
           "tree_all_reduce", "ring_reduce", "ring_broadcast", "hierarchical_all_reduce"]


def simulate(graph, profile, cluster, processes=None, **options):
    """Replay one step of ``graph`` with op costs ``profile`` on ``cluster``.

    Parameters
    ----------
    graph : SSAGraph
        One process's graph (``se.build_ssa_graph(program, places, strategy)``); every
        process of the run is assumed identical.
    profile : Profile
        Op durations of one place (``Profile.from_trace``, ``measure``, ``estimate``).
    cluster : Cluster or str
        A ``Cluster``, a preset name or a saved cluster's JSON path.
    processes : int, optional
        Processes in the run (default: the graph strategy's ``num_trainers``).
    **options
        ``compiled``, ``cuda_graph``, ``threads``, ``inline``, ``algorithm``, ``comm``
        (see ``ssaexec.sim.engine.simulate_step``).

    Returns
    -------
    SimResult
        ``step_s``, busy times, the critical path (``critical_summary()``,
        ``critical_top()``), notes.
    """
    cluster = get_cluster(cluster)
    if processes is None:
        processes = graph.strategy.num_trainers
    return simulate_step(graph, profile, cluster, processes=processes, **options)
