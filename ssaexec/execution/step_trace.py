"""Timelines of ``ParallelExecutor`` steps in the Chrome trace format (Perfetto, chrome://tracing).

``trace_steps(pe, feeds, fetch_list, steps)`` runs ``steps`` steps with every
op handle's function wrapped by an ``OpTimer``, which records the step, the op
handle id, the thread that ran it and ``time.perf_counter_ns`` at start and
end. ``chrome_trace`` turns the records into ``{"traceEvents": [...]}``:

* one ``"X"`` (complete) event per executed op handle per step: ``name`` is the
  handle's name, ``cat`` its kind, ``ts``/``dur`` in microseconds from the
  first traced step's start, ``args`` the step, op id, op type and the vars it
  reads and writes (with ``memory=True`` also ``output_bytes``: the bytes of each
  var it wrote, a sparse gradient counting its rows and values);
* ``pid`` is the *lane*: one per place (named ``cpu:0``, ...), then one for
  the collectives and one for the fetches, which span every place; ``tid`` is
  the thread, numbered in order of appearance and named after the Python
  thread (``ssaexec-worker-3``; the caller's thread is ``MainThread``), so
  overlap between places, threads and all-reduces is visible at a glance;
* one ``"X"`` event per step (``cat`` ``"step"``) in a ``steps`` lane, and
  ``"M"`` metadata events naming and ordering the lanes and threads.

Compiled segments. With ``nodes=True`` (``ssaexec trace --compiler inductor``) the
steps run on the path the strategy chose and each node of its node graph is one
slice: a segment (a run of one place's ops, compiled by Inductor under that
compiler) is named ``segment(N ops from ...)``, ``cat`` ``"segment"``, with
``args.segment`` (its node id), ``args.ops`` (its ops' names, in order) and
``args.op_ids``; a node that is one op handle (a collective, a fetch) is drawn as
above.

Timing caveat: on CUDA places an op's function returns once its kernels are
queued, so slices show host-side launch time unless ``cuda_sync=True``, which
synchronises the op's device after every op (accurate, but serialising).

The records come from ``ParallelExecutor.observe``, the executor's public
instrumentation seam (an ``on_op`` callback per op handle run). Per-op slices
need one function per op handle, so observed steps run on the readable path
(``ExecutionStrategy(compiled=False)``): their timings show each op's own
cost, not the compiled path's lower dispatch overhead (``bench/
dispatch_overhead.py`` measures that).
"""

import json
import threading
import time

from ..core.errors import SSAExecError
from .executor import fetch_names
from ..ops.sparse import nbytes
from ..runtime.node_graph import Segment

__all__ = ["OpTimer", "TraceResult", "trace_steps", "chrome_trace", "write_chrome_trace"]


class OpTimer:
    """Collects the op records of ``ParallelExecutor.observe`` (its ``on_op`` callback).

    ``records`` is a list of ``(step, op_id, thread_ident, start_ns, end_ns)``;
    ``threads`` maps a thread ident to its name. Set ``step`` before each run.
    Given the places' ``scopes``, ``output_bytes[(step, op_id)]`` also holds the bytes
    of every var version the op wrote, as it stands when the op ends (a sparse
    gradient counts its rows and values, ``ops.sparse.nbytes``).
    """

    def __init__(self, scopes=None):
        self.step = 0
        self.records = []
        self.threads = {}
        self.scopes = scopes
        self.output_bytes = {}

    def __call__(self, op, ident, start_ns, end_ns):
        threads = self.threads
        if ident not in threads:
            threads[ident] = threading.current_thread().name
        self.records.append((self.step, op.id, ident, start_ns, end_ns))  # atomic append
        if self.scopes is not None:
            sizes = {}
            for h in getattr(op, "handles", None) or (op,):  # a node: its handles' outputs
                for v in h.outputs:
                    t = None if v.is_dummy else self.scopes[v.place_idx].find_var(v.name)
                    if t is not None:
                        sizes[_var_label(v, not h.on_one_place)] = nbytes(t)
            self.output_bytes[(self.step, op.id)] = sizes


class TraceResult:
    """What ``trace_steps`` measured: op records, step spans and fetched values."""

    __slots__ = ("graph", "records", "threads", "steps", "fetched", "output_bytes", "nodes")

    def __init__(self, graph, records, threads, steps, fetched, output_bytes=None,
                 nodes=None):
        self.graph = graph
        self.nodes = nodes          # the NodeGraph whose node ids the records hold, or None
        self.records = records
        self.threads = threads
        self.steps = steps          # [(step, start_ns, end_ns)]
        self.fetched = fetched      # [list of fetched values per step]
        self.output_bytes = output_bytes or {}  # (step, op id) -> {var label: bytes}

    def to_chrome(self, metadata=None):
        """The Chrome trace dict (see the module docstring)."""
        return chrome_trace(self.graph, self.records, self.threads, self.steps, metadata,
                            self.output_bytes, self.nodes)


def trace_steps(pe, feeds, fetch_list, steps, warmup=0, cuda_sync=False, on_step=None,
                memory=False, nodes=False):
    """Run ``warmup`` untimed steps, then ``steps`` traced steps of ``pe``.

    Parameters
    ----------
    pe : ParallelExecutor
    feeds : callable or dict
        ``feeds(k)`` gives the feed of step ``k`` (0-based over warm-up and
        traced steps), or one dict used every step.
    fetch_list : list of str
    steps, warmup : int
    cuda_sync : bool
        Synchronise the device after every op on CUDA places (see module docstring).
    on_step : callable, optional
        ``on_step(k, fetched, seconds)`` after every traced step (1-based ``k``).
    memory : bool
        Also record the bytes of every var each op wrote (``args.output_bytes``).
    nodes : bool
        One slice per node of the path the strategy chose (a compiled segment is one;
        see the module docstring) instead of one per op handle on the readable path.

    Returns
    -------
    TraceResult
    """
    feed_of = feeds if callable(feeds) else (lambda k: feeds)
    fetch = fetch_names(fetch_list)
    for k in range(warmup):
        pe.run(fetch_list=list(fetch), feed=feed_of(k))
    spans, fetched = [], []
    timer = OpTimer(pe.local_scopes if memory else None)
    with pe.observe(fetch, timer, cuda_sync, nodes) as observed:
        for s in range(1, steps + 1):
            timer.step = s
            feed = feed_of(warmup + s - 1)
            t0 = time.perf_counter_ns()
            values = pe.run(fetch_list=list(fetch), feed=feed)
            t1 = time.perf_counter_ns()
            spans.append((s, t0, t1))
            fetched.append(values)
            if on_step is not None:
                on_step(s, values, (t1 - t0) / 1e9)
    graph = observed.graph if nodes else observed
    return TraceResult(graph, list(timer.records), dict(timer.threads), spans, fetched,
                       dict(timer.output_bytes), observed if nodes else None)


def _lanes(graph):
    n = len(graph.places)
    names = {i + 1: str(p) for i, p in enumerate(graph.places)}
    names[n + 1] = "collectives"
    names[n + 2] = "fetch"
    names[n + 3] = "steps"
    return names, n + 1, n + 2, n + 3


def _var_label(v, with_place):
    return f"{v.name}@v{v.version}" + (f"[{v.place}]" if with_place else "")


def _segment_args(seg):
    return {"segment": seg.id, "ops": [h.name for h in seg.handles],
            "op_ids": [h.id for h in seg.handles]}


def chrome_trace(graph, records, threads, steps=(), metadata=None, output_bytes=None,
                 nodes=None):
    """Build the Chrome trace dict from ``OpTimer`` records (see the module docstring);
    with ``nodes`` (a ``NodeGraph`` of ``graph``) the records hold its node ids."""
    lane_names, coll_pid, fetch_pid, step_pid = _lanes(graph)
    origin = min([r[3] for r in records] + [s[1] for s in steps], default=0)
    tids = {}
    events = []
    used = set()

    def tid_of(ident):
        t = tids.get(ident)
        if t is None:
            t = tids[ident] = len(tids) + 1
        return t

    for step, op_id, ident, t0, t1 in sorted(records, key=lambda r: (r[3], r[1])):
        key = (step, op_id)
        op = graph.ops[op_id] if nodes is None else nodes.nodes[op_id]
        seg = op if isinstance(op, Segment) else None
        if nodes is not None and seg is None:
            op = op.handles[0]  # a node of one handle is drawn as that handle
            op_id = op.id
        if op.on_one_place:
            pid = op.place_idx + 1
        else:
            pid = {"fetch": fetch_pid}.get(op.stream, coll_pid)
        tid = tid_of(ident)
        used.add((pid, tid))
        multi = pid > len(graph.places)
        if seg is not None:
            args = {"step": step, **_segment_args(seg)}
        else:
            args = {"step": step, "op_id": op_id, "kind": op.kind,
                    "inputs": [_var_label(v, multi) for v in op.inputs if not v.is_dummy],
                    "outputs": [_var_label(v, multi) for v in op.outputs if not v.is_dummy]}
            args.update(op.details())
        if output_bytes and key in output_bytes:
            args["output_bytes"] = output_bytes[key]
        events.append({"name": op.name, "cat": op.kind, "ph": "X", "pid": pid, "tid": tid,
                       "ts": (t0 - origin) / 1000.0, "dur": max(t1 - t0, 0) / 1000.0,
                       "args": args})
    for step, t0, t1 in steps:
        events.append({"name": f"step {step}", "cat": "step", "ph": "X", "pid": step_pid,
                       "tid": 0, "ts": (t0 - origin) / 1000.0, "dur": (t1 - t0) / 1000.0,
                       "args": {"step": step}})
    meta = []
    pids = sorted({p for p, _ in used} | ({step_pid} if steps else set()))
    for pid in pids:
        meta.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                     "args": {"name": lane_names[pid]}})
        meta.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0,
                     "args": {"sort_index": pid}})
    name_of = {t: threads.get(ident, f"thread {ident}") for ident, t in tids.items()}
    for pid, tid in sorted(used):
        meta.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                     "args": {"name": name_of[tid]}})
        meta.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid,
                     "args": {"sort_index": tid}})
    if steps:
        meta.append({"name": "thread_name", "ph": "M", "pid": step_pid, "tid": 0,
                     "args": {"name": "ParallelExecutor.run"}})
    other = {"places": [str(p) for p in graph.places], "op_handles": len(graph.ops),
             "steps": len(steps)}
    if nodes is not None:
        other["segments"] = len(nodes.segments)
    other.update(metadata or {})
    return {"traceEvents": meta + events, "displayTimeUnit": "ms", "otherData": other}


def write_chrome_trace(path, trace):
    """Write a Chrome trace dict as JSON (``SSAExecError`` when the file cannot be written)."""
    try:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(trace, f, separators=(",", ":"))
    except OSError as e:
        raise SSAExecError(f"{path}: cannot write trace: {e.strerror or e}") from None
    return path
