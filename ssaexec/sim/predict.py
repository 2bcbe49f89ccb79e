"""Predictions for whole configurations: N ranks, a process layout, a build strategy.

``predict`` builds the SSA graph one process would run (``P`` local places: one per
GPU of a node when one process drives a node, one when every GPU has its own
process), replays a step (``engine.simulate_step``), and with gradient accumulation
one step of each program (``K-1`` accumulating micro-batches, then the one that
all-reduces and applies). ``scaling`` sweeps the number of ranks and the layouts
and reports efficiency against one rank; ``sweep_bucket_mb`` tries fused-bucket
sizes.

Beyond the replayed step, a prediction charges what grows with the cluster, each in
``Prediction.breakdown`` and ``losses()``: compute slowed by collectives between GPUs
beside it (``efficiency.interference()``, the micro-batch that communicates), the
input pipeline's stall (``input_pipeline``) and the slowest rank's jitter
(``stragglers``: the expected maximum over the ranks). One rank pays none of them.

Layouts:

* ``process-per-gpu`` (torchrun, DDP's usual launch): ``P = 1``, ``N`` processes;
* ``process-per-node`` (one process drives all local GPUs, the executor's own
  multi-place mode): ``P = min(N, gpus per node)``, ``N / P`` processes.

Ranks share a GPU only with ``places_per_device`` > 1 (``process-per-node``: one
process's places ``cuda:0,0``, as the executor runs them on one GPU; the engine makes
them share that device's throughput). On a CPU cluster "GPUs" are CPU places and the
machine is one node, so ``process-per-node`` is one process with ``N`` places.
"""

import copy
import math

from ..graph.build import build_ssa_graph
from ..core.place import CPUPlace, CUDAPlace
from ..core.strategy import BuildStrategy
from ..runtime.places_rule import choose
from .efficiency import interference
from .engine import simulate_step
from .input_pipeline import input_cost
from .stragglers import jitter_s

__all__ = ["LAYOUTS", "Prediction", "build_graph", "predict", "scaling", "sweep_bucket_mb"]

LAYOUTS = ("process-per-gpu", "process-per-node")


class Prediction:
    """One configuration's predicted step (``step_s`` per micro-batch of every rank)."""

    __slots__ = ("ranks", "layout", "places", "processes", "cuda_graph", "step_s",
                 "images_per_sec", "efficiency", "comm_exposed_s", "result", "batch",
                 "accumulation", "notes", "jitter_s", "input", "breakdown")

    def __init__(self, **kw):
        for k in self.__slots__:
            setattr(self, k, kw.get(k))

    @property
    def label(self):
        return f"{self.layout}{' + cuda graph' if self.cuda_graph else ''}"

    def bound_by(self):
        """The critical path's largest category and its largest item, in words."""
        r = self.result
        cats = r.critical_summary()
        if not cats:
            return "-"
        total = sum(cats.values()) or 1.0
        top = r.critical_top(1)
        words = {"device": "device compute", "optimizer": "optimizer step",
                 "host": "host launches", "gil": "GIL", "comm": "communication",
                 "hop": "scheduler hand-offs", "step": "step"}
        cat = max(cats, key=cats.get)
        item = f" ({top[0][0]})" if top else ""
        return f"{words.get(cat, cat)} {cats[cat] / total:.0%}{item}"

    def losses(self):
        """What the step loses to growing: {cause: share of the step} for the exposed
        communication, compute slowed by the collectives beside it, the slowest rank's
        jitter and the input pipeline's stall."""
        if not self.step_s:
            return {}
        return {"communication": self.comm_exposed_s / self.step_s,
                "interference": (self.breakdown or {}).get("interference", 0.0) / self.step_s,
                "jitter": (self.jitter_s or 0.0) / self.step_s,
                "input": (self.input or {}).get("stall_s", 0.0) / self.step_s}

    def to_dict(self):
        r = self.result
        return {"gpus": self.ranks, "layout": self.layout, "cuda_graph": self.cuda_graph,
                "places_per_process": self.places, "processes": self.processes,
                "batch_per_gpu": self.batch, "accumulation": self.accumulation,
                "step_ms": self.step_s * 1e3, "images_per_sec": self.images_per_sec,
                "efficiency": self.efficiency, "comm_exposed_ms": self.comm_exposed_s * 1e3,
                "gil_busy_ms": r.gil_busy_s * 1e3, "scheduler_threads": r.threads,
                "inline": r.inline, "algorithms": r.algorithms,
                "critical_path_ms": {k: v * 1e3 for k, v in r.critical_summary().items()},
                "critical_top": [{"op": lab, "category": cat, "ms": s * 1e3, "count": c}
                                 for lab, cat, s, c in r.critical_top(6)],
                "bound_by": self.bound_by(), "notes": list(self.notes or ()),
                "breakdown_ms": {k: v * 1e3 for k, v in (self.breakdown or {}).items()},
                "losses": self.losses(), "jitter_ms": (self.jitter_s or 0.0) * 1e3,
                "input_ms": {k: v * 1e3 for k, v in (self.input or {}).items()}}


def _places(cluster, n, per_device=1):
    if cluster.device.is_gpu:
        return [CUDAPlace(i, i // per_device) for i in range(n)]
    return [CPUPlace(i) for i in range(n)]


def layout_of(cluster, ranks, layout, places_per_device=1):
    """(places per process, processes) of ``ranks`` ranks in ``layout``."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if places_per_device < 1 or (places_per_device > 1 and not cluster.device.is_gpu):
        raise ValueError(f"places_per_device must be 1, or more on a GPU cluster; got "
                         f"{places_per_device}")
    if layout == "process-per-gpu":
        if places_per_device > 1:
            # the replay sees one process: another process's kernels on its GPU would not
            # show, so sharing a device is modelled for one process's places only
            raise ValueError("places_per_device > 1 needs layout 'process-per-node'")
        return 1, ranks
    p = min(ranks, cluster.gpus_per_node * places_per_device)
    return p, math.ceil(ranks / p)


def build_graph(program, cluster, places, processes, build_strategy=None, fetch=None,
                cache=None, places_per_device=1):
    """The SSA graph of one process with ``places`` places out of ``processes``.

    ``cache`` (a dict, for the predictions of one unchanged program) keeps graphs: the
    number of processes changes a graph only through whether all-reduces cross
    processes (``AllReduceWaitOpHandle``s), so one graph serves every count above one;
    under ZeRO the shards' sizes depend on the count, so each count has its own.
    """
    bs = copy.copy(build_strategy or BuildStrategy())
    bs.num_trainers, bs.trainer_id = processes, 0
    bs.debug_graphviz_path = None
    # ZeRO shards over every rank: there the count itself shapes the graph
    procs = processes if bs.zero_stage else processes > 1
    key = (id(program), cluster.device.kind, places, places_per_device, procs,
           tuple(v for k, v in zip(bs.__slots__, bs.key(), strict=True)
                 if k not in ("num_trainers", "trainer_id")), tuple(fetch or ()))
    graph = cache.get(key) if cache is not None else None
    if graph is None:
        graph = build_ssa_graph(program, _places(cluster, places, places_per_device), bs,
                                fetch)
        if cache is not None:
            cache[key] = graph
    return graph


def _fetch(program):
    from ..program.defaults import loss_var
    loss = loss_var(program)
    return [loss] if loss else None


def _step(program, profile, cluster, places, processes, bs, comm=True, cache=None,
          places_per_device=1, **kw):
    graph = build_graph(program, cluster, places, processes, bs, _fetch(program), cache,
                        places_per_device)
    return simulate_step(graph, profile, cluster, processes=processes, comm=comm, **kw)


def _best_threading(program, profile, cluster, places, processes, bs, inline, **kw):
    # The executor runs both ways on its first steps when several CPU places share a
    # process and keeps the one places_rule.choose picks (execution.threading_probe); so
    # does this, with the same rule on the replayed steps.
    if inline is not None or cluster.device.is_gpu or places < 2 or \
            kw.get("threads") is not None:
        return _step(program, profile, cluster, places, processes, bs,
                     inline=bool(inline), **kw)
    pool = _step(program, profile, cluster, places, processes, bs, inline=False, **kw)
    alone = _step(program, profile, cluster, places, processes, bs, inline=True, **kw)
    return alone if choose(pool.step_s, alone.step_s).inline else pool


def predict(program, profile, cluster, ranks, layout="process-per-gpu", build_strategy=None,
            cuda_graph=False, compiled=True, algorithm="auto", threads=None, inline=None,
            exposed=True, cache=None, places_per_device=1, input_pipeline=None,
            jitter=True):
    """Predict one configuration (see the module docstring); returns a ``Prediction``.

    ``inline=None`` picks the faster of the pool and the caller's thread where the
    executor does (several CPU places in one process). ``cache``: a dict shared by the
    predictions of one unchanged program (graphs are built once).
    ``places_per_device``: places of one process on each GPU (2 with ``ranks=2``:
    ``cuda:0,0``, two places sharing one GPU). ``input_pipeline``: a name in
    ``input_pipeline.PIPELINES`` or an ``InputPipeline`` (default: synthetic data).
    ``jitter``: charge the slowest rank's jitter (``Cluster.jitter_cv``).
    """
    places, processes = layout_of(cluster, ranks, layout, places_per_device)
    bs = build_strategy or BuildStrategy()
    k = bs.gradient_accumulation_steps
    kw = dict(compiled=compiled, cuda_graph=cuda_graph, algorithm=algorithm, threads=threads,
              cache={} if cache is None else cache, places_per_device=places_per_device)
    notes = []
    if k > 1:
        from ..program.accumulate import accumulation_programs
        # kept in the cache: its graphs are keyed by the programs' ids
        key = ("accumulation", id(program))
        if key not in kw["cache"]:
            kw["cache"][key] = accumulation_programs(program)
        acc_prog, apply_prog = kw["cache"][key]
        apply = _best_threading(apply_prog, profile, cluster, places, processes, bs, inline,
                                **kw)
        acc = _best_threading(acc_prog, profile, cluster, places, processes, bs, inline, **kw)
        step = ((k - 1) * acc.step_s + apply.step_s) / k
        result = apply
        if exposed:
            quiet = _best_threading(apply_prog, profile, cluster, places, processes, bs,
                                    inline, comm=False, **kw)
            comm_exposed = max(0.0, apply.step_s - quiet.step_s) / k
        notes.append(f"gradient accumulation: {k - 1} micro-batches of "
                     f"{acc.step_s * 1e3:.2f} ms, then one of {apply.step_s * 1e3:.2f} ms")
    else:
        result = _best_threading(program, profile, cluster, places, processes, bs, inline, **kw)
        step = result.step_s
        if exposed:
            quiet = _best_threading(program, profile, cluster, places, processes, bs, inline,
                                    comm=False, **kw)
            comm_exposed = max(0.0, result.step_s - quiet.step_s)
    if not exposed:
        comm_exposed = 0.0
    # beyond the replayed step: compute slowed by collectives beside it (GPU ranks; the
    # micro-batch that communicates), the input pipeline's stall, the slowest rank's jitter
    replayed = step
    breakdown = _breakdown(result, replayed)
    slow = 0.0
    if cluster.device.is_gpu and ranks // places_per_device > 1:  # NCCL between GPUs
        cats = result.critical_summary()
        slow = interference() * (cats.get("device", 0.0) + cats.get("optimizer", 0.0)) / k
        step += slow
    ranks_per_node = cluster.layout(ranks)[1] * places_per_device
    inp = input_cost(input_pipeline, cluster, profile.batch, ranks_per_node, step)
    step += inp["device_s"]
    # the jitter of the compute (the pipeline's stall, if any, is the same on every rank)
    jit = jitter_s(step - comm_exposed, cluster.jitter_cv / math.sqrt(k), ranks) \
        if jitter else 0.0
    step += inp["stall_s"] + jit
    breakdown["interference"] = slow
    breakdown["input stall"] = inp["stall_s"] + inp["device_s"]
    breakdown["jitter"] = jit
    if cuda_graph and processes > 1:
        notes.append("the executor captures CUDA graphs of single-process runs only "
                      "(runtime.cuda_graph); this row shows what replay would give")
    if processes > 1 and bs.reduce_strategy == "reduce":
        notes.append("the executor runs the reduce strategy in one process only; "
                      "owners are this process's places")
    notes.extend(result.notes)
    return Prediction(ranks=ranks, layout=layout, places=places, processes=processes,
                      cuda_graph=cuda_graph, step_s=step,
                      images_per_sec=ranks * profile.batch / step if step > 0 else math.inf,
                      efficiency=None, comm_exposed_s=comm_exposed, result=result,
                      batch=profile.batch, accumulation=k, notes=notes, jitter_s=jit,
                      input=inp, breakdown=breakdown)


# the critical path's categories, as the breakdown names them
_PARTS = {"device": "compute", "optimizer": "optimizer", "comm": "communication",
          "host": "launch gaps", "gil": "launch gaps", "hop": "launch gaps",
          "step": "launch gaps"}


def _breakdown(result, step_s):
    """Seconds of the replayed step by cause: the critical path's time per category,
    scaled to ``step_s`` (the mean step with gradient accumulation)."""
    parts = {name: 0.0 for name in dict.fromkeys(_PARTS.values())}
    cats = result.critical_summary()
    total = sum(cats.values()) or 1.0
    for cat, s in cats.items():
        name = _PARTS.get(cat, cat)
        parts[name] = parts.get(name, 0.0) + s * step_s / total
    return parts


def scaling(program, profile, cluster, gpus, layouts=LAYOUTS, cuda_graphs=(False, True),
            build_strategy=None, **kw):
    """Predictions for every (ranks, layout, cuda graph) combination.

    Efficiency of a row: its images/sec over ``ranks`` times the images/sec of the same
    layout and CUDA-graph setting on one rank.

    Returns
    -------
    list of Prediction, in ``gpus`` order then layout and CUDA-graph order.
    """
    out = []
    base = {}
    kw.setdefault("cache", {})
    cuda_graphs = cuda_graphs if cluster.device.is_gpu else (False,)
    for n in gpus:
        for layout in layouts:
            for cg in cuda_graphs:
                p = predict(program, profile, cluster, n, layout, build_strategy, cg, **kw)
                key = (layout, cg)
                if key not in base:
                    one = p if n == 1 else predict(program, profile, cluster, 1, layout,
                                                   build_strategy, cg, exposed=False, **kw)
                    base[key] = one.images_per_sec
                p.efficiency = p.images_per_sec / (n * base[key])
                out.append(p)
    return out


def sweep_bucket_mb(program, profile, cluster, ranks, sizes=(1, 4, 16, 25, 64, 256),
                    layout="process-per-gpu", build_strategy=None, **kw):
    """Predictions with fused all-reduce buckets of each size in ``sizes`` (MiB), plus
    one without fusion (``bucket_mb`` None); returns ``[(bucket_mb, Prediction)]``."""
    base = build_strategy or BuildStrategy()
    out = []
    kw.setdefault("cache", {})
    for mb in (None,) + tuple(sizes):
        bs = copy.copy(base)
        bs.fuse_all_reduce_ops = mb is not None
        if mb is not None:
            bs.fuse_bucket_mb = float(mb)
        out.append((mb, predict(program, profile, cluster, ranks, layout, bs, **kw)))
    return out
