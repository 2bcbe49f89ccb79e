"""CUDA streams and the cross-stream synchronisation of an SSA graph (or a node graph).

Each ``CUDAPlace`` gets a ``DeviceContext`` with three streams: compute,
communication and fetch. Both runners schedule *nodes* (the readable path: op
handles; the compiled path: segments and wrapped collectives and fetches) and
share ONE stream policy, decided by the SSA handle behind each node:

* **Primary stream** (``stream_key``): computation and loss scaling on its
  place's compute stream, collectives on the communication stream of their
  first place, fetches on the fetch stream of their first place.
* **Entered streams** (``plan_streams``): a node that touches tensors on
  several devices (a collective, a fetch, an all-reduce wait) also enters the
  stream of the same role on every other device it touches, so each device's
  work (an NCCL kernel, a broadcast's copy, a fetch's device-to-host copy) runs
  on a stream that is ordered, instead of on that device's default stream.
  Invariant: every device a node reads or writes is the device of a stream it
  enters; the primary stream comes first.
* **Waits.** Node ``i`` waits for producer ``j`` unless every stream ``i``
  enters is one ``j`` entered (stream order then covers the edge). A node that
  enters several streams folds them into its primary stream before recording
  its event, so one event stands for all of its work.
* **Host waits.** A fetch copies into pinned host memory; the host waits for
  the fetches' events at the end of a step and for nothing else.

``plan_streams`` is the pure part (a ``StreamPlan``, testable without a GPU).
``StreamSync`` applies it on a GPU with one of two strategies, switchable between
runs:

* ``event``: the consumer's streams wait on the producer's event
  (``stream.wait_event``); the host never blocks inside a step;
* ``wait``: the host synchronises the producer's stream before launching the
  consumer, and every stream at the end of the step; slower, but any ordering
  bug becomes a plain host-side order.

During a CUDA graph capture (``capturing``) nothing synchronises the host:
waits are event waits and the end of the step joins every stream into the
capturing one.

Between steps (``event``): ``finish`` makes each device's current stream wait,
on the GPU, for every stream of the step, and ``start`` makes every stream of
the next step wait for the current stream (the caller's feed copies). So the
caller's later work on the current stream, and the next step, are ordered after
this step without the host waiting for it: host and GPU overlap across steps.

Cross-stream inputs are marked with ``Tensor.record_stream`` (a sparse tensor's
indices and values, ``storage_parts``) on the stream of their own device, so
the caching allocator does not hand their memory out again while that stream
may still read it. So are the step's external inputs (``external_inputs``:
feeds, made on a stream the step does not order, such as a data loader's copy
stream), on every stream of their device, at ``start``: the host no longer waits
for the step, so a feed the caller drops when ``run`` returns must not be reused
before the step has read it. Outside a capture, every event is made once, when
the graph is bound.
"""

import contextlib

import torch

__all__ = ["DeviceContext", "StreamPlan", "StreamSync", "external_inputs", "plan_stream_waits",
           "plan_streams", "storage_parts", "stream_key", "stream_span"]


class DeviceContext:
    """The compute, communication and fetch streams of one CUDA place."""

    __slots__ = ("place", "device", "compute", "comm", "fetch")

    def __init__(self, place):
        self.place = place
        self.device = place.device
        with torch.cuda.device(self.device):
            self.compute = torch.cuda.Stream(self.device)
            self.comm = torch.cuda.Stream(self.device)
            self.fetch = torch.cuda.Stream(self.device)

    def stream(self, role):
        """The stream for ``role`` ("compute", "comm" or "fetch")."""
        return getattr(self, role)


def stream_key(op):
    """(place index, stream role) an op handle launches on (its primary stream)."""
    if op.on_one_place:
        return (op.place_idx, op.stream)
    first = min((v.place_idx for v in op.inputs + op.outputs if not v.is_dummy), default=0)
    return (first, op.stream)


def stream_span(op):
    """Place indices whose tensors op handle ``op`` reads or writes, in place order."""
    if op.on_one_place:
        return (op.place_idx,)
    return tuple(sorted({v.place_idx for v in op.inputs + op.outputs if not v.is_dummy}))


class StreamPlan:
    """Which streams each node enters, which producers it waits for, who records.

    Streams are named ``(place index, role)``: the stream of that role in that
    place's ``DeviceContext``.

    Attributes
    ----------
    keys : list of tuple
        The primary stream of each node (``enters[i][0]``), or None: no stream
        (its place is not a GPU).
    enters : list of tuple of tuple
        The streams node ``i`` runs on: its primary one, then one per other
        device it touches, with the primary's role.
    waits : list of tuple of int
        Producers node ``i`` waits for (their event, or their stream under ``wait``).
    records : list of bool
        True when node ``j`` records an event (a consumer or the host waits for it).
    host_waits : tuple of int
        Nodes whose events the host waits for at the end of a step (the fetches).
    """

    __slots__ = ("keys", "enters", "waits", "records", "host_waits")

    def __init__(self, keys, enters, waits, records, host_waits):
        self.keys, self.enters, self.waits = keys, enters, waits
        self.records, self.host_waits = records, host_waits


def plan_streams(ops, devices=None, key=stream_key, handle=None):
    """The ``StreamPlan`` of ``ops`` (nodes with ``id`` and ``producers()``).

    Parameters
    ----------
    ops : sequence
        The nodes, ``ops[i].id == i``.
    devices : sequence, optional
        The device of each place index (any hashable label), None for a place
        that is not a GPU (its nodes enter no stream). Default: one device per place.
    key : callable
        A handle's primary ``(place index, role)`` (``stream_key``).
    handle : callable, optional
        The SSA handle that decides a node's streams (the compiled path maps a
        wrapped collective or fetch to its handle); default: the node itself.

    Returns
    -------
    StreamPlan
    """
    def device(pi):
        return pi if devices is None else devices[pi]

    keys, enters, host_waits = [], [], []
    for op in ops:
        h = op if handle is None else handle(op)
        pi, role = key(h)
        if device(pi) is None:
            keys.append(None)
            enters.append(())
            continue
        # one stream per device: the primary's on its own device, else the lowest place's
        chosen = {device(pi): (pi, role)}
        for q in sorted(set(stream_span(h)) | {pi}):
            d = device(q)
            if d is not None and d not in chosen:
                chosen[d] = (q, role)
        keys.append((pi, role))
        enters.append(tuple(chosen.values()))
        if h.stream == "fetch":
            host_waits.append(op.id)
    waits = []
    records = [False] * len(ops)
    for op in ops:
        mine = set(enters[op.id])
        ws = () if not mine else tuple(sorted(
            {p.id for p in op.producers() if enters[p.id] and not mine <= set(enters[p.id])}))
        for j in ws:
            records[j] = True
        waits.append(ws)
    for i in host_waits:
        records[i] = True
    return StreamPlan(keys, enters, waits, records, tuple(host_waits))


def plan_stream_waits(graph, key=stream_key):
    """Per op: producers on another stream (``waits``) and ops that record an event.

    Returns
    -------
    (list of tuple of int, list of bool)
        ``waits[i]`` are producer ids op ``i`` must wait for; ``records[j]`` is
        True when some consumer (or the host) waits for op ``j``.
    """
    plan = plan_streams(graph.ops, key=key)
    return plan.waits, plan.records


def external_inputs(graph):
    """``(place index, name)`` of the non-persistable values an SSA graph reads before
    any of its handles writes them (feeds): made outside the step, on any stream."""
    block = graph.program.global_block()
    out = []
    for pi, names in enumerate(graph.vars):
        for name, versions in names.items():
            var = block.find_var(name)
            if versions[0].pending_ops and not (var is not None and var.persistable):
                out.append((pi, name))
    return tuple(out)


def storage_parts(t):
    """The strided tensors that hold ``t``'s memory (a sparse tensor's indices and values).

    ``record_stream`` is defined on strided CUDA tensors only.
    """
    layout = t.layout
    if layout == torch.sparse_coo:
        return (t._indices(), t._values())  # no coalescing: it would launch work
    if layout in (torch.sparse_csr, torch.sparse_bsr):
        return (t.crow_indices(), t.col_indices(), t.values())
    if layout in (torch.sparse_csc, torch.sparse_bsc):
        return (t.ccol_indices(), t.row_indices(), t.values())
    return (t,)


class StreamSync:
    """Applies a ``StreamPlan`` on CUDA (see the module docstring).

    ``graph`` is anything with ``ops`` (an ``SSAGraph``, a ``NodeGraph``);
    ``key`` and ``handle`` as in ``plan_streams``; ``external``: the
    ``(place index, name)`` values made outside the step (``external_inputs``).
    ``plan``: the ``StreamPlan`` to apply when the caller has it (a runner passes
    its step plan's, ``runtime.plan``); else planned here from ``graph``.
    """

    __slots__ = ("plan", "streams", "extra", "folds", "events", "sync", "cross_inputs",
                 "capturing", "external", "_used", "_start_events", "_end_events")

    def __init__(self, graph, contexts, sync="event", key=stream_key, handle=None,
                 external=(), plan=None):
        devices = [c.device if c is not None else None for c in contexts]
        if plan is None:
            plan = plan_streams(graph.ops, devices, key, handle)
        self.plan = plan
        self.streams, self.extra = [], []
        for entered in plan.enters:
            ss = tuple(contexts[pi].stream(role) for pi, role in entered)
            self.streams.append(ss[0] if ss else None)
            # the other devices' streams of a node spanning several GPUs
            self.extra.append(ss[1:])
        # made once: one event per fold of an extra stream, per recording node
        self.folds = [tuple(torch.cuda.Event() for _ in ex) for ex in self.extra]
        self.events = [torch.cuda.Event() if r else None for r in plan.records]
        self.sync = sync
        self.capturing = False  # inside a CUDA graph capture: join the streams, never sync
        used = {}
        for i, s in enumerate(self.streams):
            for t in ((s,) + self.extra[i] if s is not None else ()):
                used.setdefault(id(t), t)
        self._used = tuple(used.values())
        self._end_events = tuple(torch.cuda.Event() for _ in self._used)
        self._start_events = {s.device: torch.cuda.Event() for s in self._used}
        self.external = tuple(
            (pi, name, tuple(s for s in self._used if s.device == devices[pi]))
            for pi, name in external if devices[pi] is not None)
        # (place index, var name, stream of its device) of inputs made on another stream
        self.cross_inputs = []
        for op in graph.ops:
            producers = set(plan.waits[op.id])
            on_device = {}
            if self.streams[op.id] is not None:
                for s in (self.streams[op.id],) + self.extra[op.id]:
                    on_device.setdefault(s.device, s)
            self.cross_inputs.append(tuple(
                (v.place_idx, v.name, on_device.get(devices[v.place_idx],
                                                    self.streams[op.id]))
                for v in op.inputs
                if not v.is_dummy and v.generated_op is not None
                and v.generated_op.id in producers))

    def before(self, i):
        """Make op ``i``'s streams wait for its cross-stream producers."""
        waits = self.plan.waits[i]
        if not waits:
            return
        if self.sync == "event" or self.capturing:  # a capture cannot sync the host
            streams = (self.streams[i],) + self.extra[i]
            for j in waits:
                ev = self.events[j]
                for stream in streams:
                    stream.wait_event(ev)
        else:
            for j in waits:
                self.streams[j].synchronize()

    def after(self, i, scopes):
        """Fold op ``i``'s streams into its primary one, protect its cross-stream
        inputs from early reuse, and record its event."""
        stream = self.streams[i]
        for other, ev in zip(self.extra[i], self.folds[i], strict=True):
            ev.record(other)
            stream.wait_event(ev)
        for pi, name, s in self.cross_inputs[i]:
            t = scopes[pi].find_var(name)
            if t is not None and t.is_cuda:
                for part in storage_parts(t):
                    part.record_stream(s)
        ev = self.events[i]
        if ev is not None:
            ev.record(stream)

    def wrap(self, i, fn, scopes):
        """``fn`` launched on op ``i``'s streams with the waits and event around it."""
        stream = self.streams[i]
        if stream is None:
            return fn

        extra = self.extra[i]

        def run_on_stream():
            self.before(i)
            with contextlib.ExitStack() as stack:
                # each device's current stream (what a kernel or copy there runs on) is the
                # node's stream on it; the primary is entered last so its device is current
                for s in extra:
                    stack.enter_context(torch.cuda.stream(s))
                stack.enter_context(torch.cuda.stream(stream))
                fn()
            self.after(i, scopes)
        return run_on_stream

    def start(self, scopes=None):
        """Order every stream after the host's pending work (feed copies) on its device,
        and keep the external inputs in ``scopes`` from reuse until the step has read them."""
        if self.capturing:
            for s in self._used:
                s.wait_stream(torch.cuda.current_stream(s.device))
            return
        for d, ev in self._start_events.items():
            ev.record(torch.cuda.current_stream(d))
        for s in self._used:
            s.wait_event(self._start_events[s.device])
        if scopes is not None:
            for pi, name, streams in self.external:
                t = scopes[pi].find_var(name)
                if t is not None and t.is_cuda:
                    for part in storage_parts(t):
                        for s in streams:
                            part.record_stream(s)

    def finish(self, failed=False):
        """End a step (see the module docstring).

        ``event``: each device's current stream waits on the GPU for every stream,
        and the host waits for the fetches' events only. ``wait``, or ``failed``
        (the step raised; its launched work must end before the caller cleans up):
        the host waits for every stream. During a capture: every stream is joined
        into the capturing one.
        """
        if self.capturing:
            for s in self._used:
                torch.cuda.current_stream(s.device).wait_stream(s)
            return
        if failed or self.sync != "event":
            for s in self._used:
                s.synchronize()
            return
        for s, ev in zip(self._used, self._end_events, strict=True):
            ev.record(s)
            torch.cuda.current_stream(s.device).wait_event(ev)
        for i in self.plan.host_waits:
            if self.streams[i] is not None:
                self.events[i].synchronize()
