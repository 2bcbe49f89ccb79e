"""α-β cost models of the collectives (latency α per message step, bandwidth B per rank).

Closed forms, for ``S`` bytes on ``N`` ranks over links of latency ``alpha`` seconds
and bandwidth ``bw`` bytes/s per direction per rank (Thakur, Rabenseifner and Gropp,
"Optimization of collective communication operations in MPICH", IJHPCA 2005; Patarasuk
and Yuan, "Bandwidth optimal all-reduce algorithms for clusters of workstations", JPDC
2009; Sanders, Speck and Träff, "Two-tree algorithms for full bandwidth broadcast,
reduction and scan", Parallel Computing 2009):

* ring all-reduce (reduce-scatter then all-gather): ``2(N-1)α + 2(N-1)/N · S/B``;
* tree all-reduce (reduce up, broadcast down two binary trees, pipelined):
  ``2⌈log2 N⌉α + 2 · S/B``;
* reduce (ring reduce-scatter + gather to the root) and broadcast (scatter + ring
  all-gather): ``(N-1)α + (N-1)/N · S/B`` each;
* hierarchical all-reduce over ``n`` nodes of ``g`` ranks: reduce-scatter inside each
  node, ring all-reduce of the ``S/g`` shards across nodes (each rank on its share of
  the node's network bandwidth), all-gather inside the node.

``collective_time`` composes them over a ``Cluster``'s two link levels the way NCCL's
tuner does (``src/graph/tuning.cc``: a fixed launch latency per call, intra-node steps
at the intra-node latency and inter-node steps at the network's; the bus bandwidth of a
ring spanning nodes is the smaller of the intra-node links' and the node's network
bandwidth) and, for ``algorithm="auto"``, takes the fastest, as NCCL's tuner picks one
per call.

Each collective is a class whose methods hold its formulas (``ring_steps``: the ring's
message steps and payload share; ``times``: seconds per algorithm it can run) and that
names the op handle class it prices (``handle``). ZeRO's collectives (issue 49):
all-gather and reduce-scatter are rings of ``N-1`` steps moving ``(N-1)/N`` of the
full payload, each half of a ring all-reduce. Defining the class registers it:
``cost_model(handle)`` finds a handle's model by the handle's class
(``functools.singledispatch``, as the runtime's ``handle_fn`` and ``emit_handle``), so
adding a collective is a handle class (``graph.handles``) and a model class here, and
nothing branches on a kind name. ``COLLECTIVES`` (the handle kind's label -> model) is
for display and for callers of ``collective_time`` that name a collective; the
simulator passes models. Reduce and broadcast run as rings only.
"""

import functools
import math

from ..core.errors import SSAExecError
from ..graph.handles import (AllGatherOpHandle, AllReduceOpHandle, BroadcastOpHandle,
                             ReduceOpHandle, ReduceScatterOpHandle)

__all__ = ["ring_all_reduce", "tree_all_reduce", "ring_reduce", "ring_broadcast",
           "hierarchical_all_reduce", "collective_time", "cost_model", "Collective",
           "ALGORITHMS", "COLLECTIVES"]

ALGORITHMS = ("auto", "ring", "tree", "hierarchical")


def ring_all_reduce(nbytes, ranks, alpha, bw):
    """Ring all-reduce: ``2(N-1)α + 2(N-1)/N · S/B`` seconds (0 for one rank)."""
    n = ranks
    if n <= 1:
        return 0.0
    return 2 * (n - 1) * alpha + 2 * (n - 1) / n * nbytes / bw


def tree_all_reduce(nbytes, ranks, alpha, bw):
    """Double-binary-tree all-reduce: ``2⌈log2 N⌉α + 2 · S/B`` seconds."""
    if ranks <= 1:
        return 0.0
    return 2 * math.ceil(math.log2(ranks)) * alpha + 2 * nbytes / bw


def ring_reduce(nbytes, ranks, alpha, bw):
    """Reduce to one root (reduce-scatter + gather): ``(N-1)α + (N-1)/N · S/B``."""
    n = ranks
    if n <= 1:
        return 0.0
    return (n - 1) * alpha + (n - 1) / n * nbytes / bw


def ring_broadcast(nbytes, ranks, alpha, bw):
    """Broadcast from one root (scatter + ring all-gather): ``(N-1)α + (N-1)/N · S/B``."""
    return ring_reduce(nbytes, ranks, alpha, bw)


def hierarchical_all_reduce(nbytes, nodes, per_node, intra, inter):
    """Reduce-scatter in the node, all-reduce across nodes, all-gather in the node.

    ``intra`` and ``inter`` are ``(alpha, bandwidth)`` pairs; ``inter``'s bandwidth is
    the node's whole network bandwidth, shared by its ``per_node`` ranks.
    """
    g, n = per_node, nodes
    a_i, b_i = intra
    a_e, b_e = inter
    t = 0.0
    if g > 1:
        t += 2 * ((g - 1) * a_i + (g - 1) / g * nbytes / b_i)
    if n > 1:
        t += ring_all_reduce(nbytes / g, n, a_e, b_e / g)
    return t


def _ring(cluster, model, nbytes, ranks):
    nodes, g = cluster.layout(ranks)
    intra, inter = cluster.intra, cluster.inter
    steps, share, inter_steps = model.ring_steps(ranks, nodes)
    bw = intra.bus if nodes == 1 else min(intra.bus, inter.bus)
    lat = (steps - inter_steps) * intra.latency + inter_steps * inter.latency
    return lat + share * nbytes / bw


def _tree(cluster, nbytes, ranks):
    nodes, g = cluster.layout(ranks)
    intra, inter = cluster.intra, cluster.inter
    bw = intra.bus if nodes == 1 else min(intra.bus, inter.bus)
    if nodes == 1:
        return tree_all_reduce(nbytes, ranks, intra.latency, bw)
    lat = 2 * ((g - 1) * intra.latency + math.ceil(math.log2(nodes)) * inter.latency)
    return lat + 2 * nbytes / bw


@functools.singledispatch
def cost_model(handle):
    """The ``Collective`` that prices op handle ``handle``, chosen by the handle's class.

    Raises ``SSAExecError`` for a handle class no model names (not a collective).
    """
    raise SSAExecError(f"the simulator has no cost model for op handle kind {handle.kind!r}")


# the collectives the simulator prices, by label (display, and names given to
# collective_time); filled as each model class is defined
COLLECTIVES = {}


class Collective:
    """One collective's cost model on a ``Cluster`` (launch latency excluded).

    A subclass that sets ``handle`` (an op handle class) prices that class's handles:
    defining it registers one instance with ``cost_model`` and ``COLLECTIVES``.
    """

    __slots__ = ()
    handle = None  # the op handle class it prices
    name = None  # the label of that class's kind (display): set from ``handle``
    passes = 1  # passes over the places' tensors of the in-process part (sums, copies)
    splits = False  # a start handle and a wait handle (asynchronous all-reduce)
    hierarchical = False  # across processes: local reduce, processes, local broadcast

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "handle" in cls.__dict__:
            cls.name = cls.handle.kind
            model = COLLECTIVES[cls.name] = cls()
            cost_model.register(cls.handle, lambda handle: model)

    def in_process(self, processes):
        """The model of its in-process part when ``processes`` processes take part."""
        return self

    @staticmethod
    def ring_steps(ranks, nodes):
        """(message steps, payload share each rank sends, steps crossing nodes) of its ring."""
        raise NotImplementedError

    def times(self, cluster, nbytes, ranks):
        """Seconds of each algorithm it can run, by algorithm name (a ring by default)."""
        return {"ring": _ring(cluster, self, nbytes, ranks)}


class AllReduce(Collective):
    """Ring (reduce-scatter then all-gather: two passes), tree or hierarchical."""

    __slots__ = ()
    handle = AllReduceOpHandle
    passes = 2
    splits = True
    hierarchical = True

    def in_process(self, processes):
        # several processes: the places reduce to one tensor, the processes all-reduce it
        return Reduce() if processes > 1 else self

    @staticmethod
    def ring_steps(ranks, nodes):
        return 2 * (ranks - 1), 2 * (ranks - 1) / ranks, 2 * (nodes - 1)

    def times(self, cluster, nbytes, ranks):
        nodes, g = cluster.layout(ranks)
        return {
            "ring": _ring(cluster, self, nbytes, ranks),
            "tree": _tree(cluster, nbytes, ranks),
            "hierarchical": hierarchical_all_reduce(
                nbytes, nodes, g, (cluster.intra.latency, cluster.intra.bus),
                (cluster.inter.latency, cluster.inter.bus)),
        }


class Reduce(Collective):
    """Ring reduce-scatter + gather to the root: one pass round the ring."""

    __slots__ = ()
    handle = ReduceOpHandle

    @staticmethod
    def ring_steps(ranks, nodes):
        return ranks - 1, (ranks - 1) / ranks, nodes - 1


class Broadcast(Reduce):
    """Scatter + ring all-gather from the root: the reduce's steps, run backwards."""

    __slots__ = ()
    handle = BroadcastOpHandle


class AllGather(Collective):
    """Ring all-gather (ZeRO-3's gather of a parameter, ZeRO-1/2's of the updated
    shards): ``N-1`` steps, each rank receives ``(N-1)/N`` of the full payload; ``nbytes``
    is the full (gathered) payload, as the handle's vars declare it. The all-reduce's
    second half (Thakur et al. 2005); NCCL runs it as a ring."""

    __slots__ = ()
    handle = AllGatherOpHandle

    @staticmethod
    def ring_steps(ranks, nodes):
        return ranks - 1, (ranks - 1) / ranks, nodes - 1


class ReduceScatter(AllGather):
    """Ring reduce-scatter (ZeRO-1/2/3's gradient reduction): the all-reduce's first
    half, the all-gather's steps with a sum at each; ``nbytes`` is the full gradient."""

    __slots__ = ()
    handle = ReduceScatterOpHandle
    passes = 1


def collective_time(cluster, coll, nbytes, ranks, algorithm="auto"):
    """Seconds one collective of ``nbytes`` (per rank) takes on ``ranks`` ranks.

    Parameters
    ----------
    cluster : ssaexec.sim.cluster.Cluster
    coll : Collective or {"all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter"}
        The model (``cost_model(handle)``), or its name in ``COLLECTIVES``.
    nbytes : int
        Payload of one rank (what the rank holds before the call).
    ranks : int
    algorithm : {"auto", "ring", "tree", "hierarchical"}
        All-reduce algorithm; reduce and broadcast are rings. ``auto`` takes the
        fastest.

    Returns
    -------
    (seconds, algorithm used)
    """
    if ranks <= 1 or nbytes <= 0:
        return 0.0, "none"
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    # a caller outside the simulator names the collective; the simulator passes the model
    model = coll if isinstance(coll, Collective) else COLLECTIVES.get(coll)
    if model is None:
        raise ValueError(f"coll must be one of {tuple(COLLECTIVES)}, got {coll!r}")
    times = model.times(cluster, nbytes, ranks)
    if algorithm not in times:
        # "auto" takes the fastest (the ring on a tie); a ring-only collective, its ring
        algorithm = min(times, key=lambda a: (times[a], a != "ring"))
    return cluster.collective_launch + times[algorithm], algorithm
