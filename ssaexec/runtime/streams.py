"""CUDA streams and the cross-stream synchronisation of an SSA graph.

Each ``CUDAPlace`` gets a ``DeviceContext`` with three streams: compute,
communication and fetch. Every op handle launches on one stream (its
``stream key``): computation and loss scaling on its place's compute stream,
collectives on the communication stream of their first place, fetches on the
fetch stream of their first place.

``plan_stream_waits`` is the pure part, testable without a GPU: for every op
it lists the producers that ran on a *different* stream (same-stream edges
are ordered by the stream itself and need nothing) and marks the producers
that must record an event. ``StreamSync`` applies the plan on a GPU with
one of two strategies, switchable between runs:

* ``event``: the consumer's stream waits on the producer's event
  (``stream.wait_event``); the host never blocks;
* ``wait``: the host synchronises the producer's stream before launching the
  consumer; slower, but any ordering bug becomes a plain host-side order.

Cross-stream inputs are also marked with ``Tensor.record_stream`` so the
caching allocator does not hand their memory out again while the consuming
stream may still read it.
"""

import contextlib

import torch

__all__ = ["DeviceContext", "plan_stream_waits", "stream_key", "StreamSync"]


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
    """(place index, stream role) an op handle launches on."""
    if op.on_one_place:
        return (op.place_idx, op.stream)
    first = min((v.place_idx for v in op.inputs + op.outputs if not v.is_dummy), default=0)
    return (first, op.stream)


def plan_stream_waits(graph, key=stream_key):
    """Per op: producers on another stream (``waits``) and ops that record an event.

    Returns
    -------
    (list of tuple of int, list of bool)
        ``waits[i]`` are producer ids op ``i`` must wait for; ``records[j]`` is
        True when some consumer waits for op ``j``.
    """
    keys = [key(op) for op in graph.ops]
    waits = []
    records = [False] * len(graph.ops)
    for op in graph.ops:
        mine = keys[op.id]
        ws = tuple(sorted({p.id for p in op.producers() if keys[p.id] != mine}))
        for j in ws:
            records[j] = True
        waits.append(ws)
    return waits, records


class StreamSync:
    """Applies a stream-wait plan on CUDA (see the module docstring)."""

    __slots__ = ("streams", "extra", "waits", "events", "sync", "cross_inputs", "capturing")

    def __init__(self, graph, contexts, sync="event", key=stream_key):
        waits, records = plan_stream_waits(graph, key)
        self.streams = []
        # a collective spanning several GPUs also launches on the other devices' comm streams
        self.extra = []
        for op in graph.ops:
            pi, role = key(op)
            ctx = contexts[pi]
            self.streams.append(ctx.stream(role) if ctx is not None else None)
            others = {}
            if op.is_collective and ctx is not None:
                for v in op.inputs + op.outputs:
                    c = None if v.is_dummy else contexts[v.place_idx]
                    if c is not None and c.device != ctx.device:
                        others.setdefault(c.device, c.comm)
            self.extra.append(tuple(others.values()))
        self.waits = waits
        self.events = [torch.cuda.Event(enable_timing=False) if r else None for r in records]
        self.sync = sync
        self.capturing = False  # inside a CUDA graph capture: join the streams, never sync
        # (place index, var name) of inputs produced on another stream, for record_stream
        self.cross_inputs = []
        for op in graph.ops:
            producers = set(waits[op.id])
            self.cross_inputs.append(tuple(
                (v.place_idx, v.name) for v in op.inputs
                if not v.is_dummy and v.generated_op is not None
                and v.generated_op.id in producers))

    def before(self, i):
        """Make op ``i``'s stream(s) wait for its cross-stream producers."""
        for j in self.waits[i]:
            if self.sync == "event":
                for stream in (self.streams[i],) + self.extra[i]:
                    stream.wait_event(self.events[j])
            else:
                self.streams[j].synchronize()

    def after(self, i, scopes):
        """Record op ``i``'s event and protect cross-stream inputs from early reuse."""
        stream = self.streams[i]
        for other in self.extra[i]:
            # fold the other devices' work into the primary stream before its event
            ev = torch.cuda.Event(enable_timing=False)
            ev.record(other)
            stream.wait_event(ev)
        for pi, name in self.cross_inputs[i]:
            t = scopes[pi].find_var(name)
            if t is not None and t.is_cuda:
                t.record_stream(stream)
        ev = self.events[i]
        if ev is not None:
            ev.record(stream)

    def wrap(self, i, fn, scopes):
        """``fn`` launched on op ``i``'s stream with the waits and event around it."""
        stream = self.streams[i]
        if stream is None:
            return fn

        extra = self.extra[i]

        def run_on_stream():
            self.before(i)
            with contextlib.ExitStack() as stack:
                for s in extra:
                    stack.enter_context(torch.cuda.stream(s))
                stack.enter_context(torch.cuda.stream(stream))
                fn()
            self.after(i, scopes)
        return run_on_stream

    def start(self):
        """Order every stream after the host's pending work (feed copies) on its device."""
        for s in {id(s): s for s in self.streams if s is not None}.values():
            s.wait_stream(torch.cuda.current_stream(s.device))
        for extra in self.extra:
            for s in extra:
                s.wait_stream(torch.cuda.current_stream(s.device))

    def finish(self):
        """Block the host until every stream used by the graph is idle (while a CUDA graph
        is being captured: join every stream into the capturing one instead)."""
        for s in {id(s): s for s in self.streams if s is not None}.values():
            if self.capturing:
                torch.cuda.current_stream(s.device).wait_stream(s)
            else:
                s.synchronize()
