"""Discrete-event replay of one training step of one process.

What is replayed. Every process of a data-parallel run holds the same places running
the same graph, so one process stands for all: its SSA graph (``P`` local places)
is replayed against the resources it really contends for, and each collective costs
what the α-β models (``ssaexec.sim.comm_cost``) say it costs on all ``P x processes`` ranks.

The model, resource by resource:

* **Scheduler.** The graph is cut into the nodes the executor schedules by the
  runtime's own step plan (``runtime.plan.build_plan``: the compiled runner's
  segments, collectives and fetches with the alias edges and the commit barrier;
  one node per op handle on the readable path; the plan's no-op collective rule),
  and replayed with the ``Scheduler``'s own plan
  and policy code (``DependencyPlan``, ``run_here``, ``default_threads``): the
  caller thread takes the first compute root; a thread that finishes a node runs
  ONE newly ready node itself and queues the rest (communication first), which an
  idle worker picks up ``Host.hop_s`` later; ``num_threads - 1`` workers serve the
  queue. ``inline`` runs everything in the caller's thread, in the scheduler's
  stack order (``places_rule``'s turns). Change the policy there and the replay follows.
* **Host and GIL.** An op's launch occupies its thread for ``host_s`` (the
  profile's, else ``Host.op_s``), of which ``Host.gil_fraction`` holds the process's
  one GIL: the places of one process launch one at a time, the places of different
  processes do not wait for each other. CUDA-graph replay has no per-op host time,
  one ``Host.graph_launch_s`` per place instead.
* **Devices.** A GPU place has compute and communication streams: a kernel starts
  when its launch is done, its stream is free and the kernels it depends on (on any
  stream) have finished; the thread does not wait for it. A CPU place runs its
  kernels on the launching thread (GIL released) on ``threads`` of the cores this
  process gets of the machine, which its host work also needs: the executor's
  intra-op threads (``places_rule.intra_op_threads``, the same in turns and threads).
* **Shared devices.** GPU places on one device (``CUDAPlace(i, d)`` with the same
  ``d``: ``cuda:0,0``) share its throughput: each op was profiled with the whole
  device to itself, so their kernels, on any of their streams, take turns on one
  slot per device (two places' compute-bound steps take twice one place's device
  time). An upper bound for kernels too small to fill the device, which could
  overlap; places on devices of their own keep overlapping streams.
* **Collectives.** In-process collectives of CPU places are host work
  (``Cluster.local_sum``: ``(P-1)·(α + S/B)``); of GPU places, a kernel on the
  communication stream: NCCL's cost model across devices, ``Cluster.local_sum`` when
  places share a device (NCCL refuses them; ``LocalCollective`` adds and copies on
  that device, its (α, B) calibrated there). Across processes, the executor's
  hierarchical all-reduce: sum the local places, all-reduce one tensor per process
  (``Cluster.comm_channels`` at once, e.g. gloo's worker threads or NCCL's stream),
  copy back; with
  ``BuildStrategy(async_allreduce=True)`` the start handle returns at once and the
  wait handle blocks its thread (GIL released) until the network is done.
* **Step.** ``Host.step_s`` per place before the graph (feeds), and the step ends
  when every thread, stream and channel is idle (``run`` waits for the streams).

Every interval the replay books is an ``Activity`` that remembers the activity whose
end let it start; walking back from the last one gives the critical path, and its
time split by category (device, optimizer, host, gil, comm, hop) says what bounds the
step; ``optimizer`` is the device time of the updates (fused or one by one).
"""

import dataclasses
import functools
import heapq
import weakref
from collections import deque

from ..core.errors import SSAExecError
from ..graph.ssa import (AllReduceWaitOpHandle, CollectiveOpHandle, ComputationOpHandle,
                         FetchOpHandle, ScaleLossGradOpHandle)
from ..graph.handles import FreeOpHandle
from ..runtime.places_rule import intra_op_threads
from ..runtime import scheduler
from ..runtime.fusion import plan_fusion
from ..runtime.plan import build_plan
from .comm_cost import collective_time, cost_model
from .costs import foreach_cost, wire_bytes
from .profile import OpCost
from .result import Activity, SimResult

__all__ = ["Activity", "SimResult", "simulate_step", "wire_bytes", "node_graph", "step_plan"]

_PLANS = weakref.WeakKeyDictionary()  # graph -> {(compiled, processes): StepPlan}


def step_plan(graph, compiled=True, processes=1):
    """The runtime's own ``StepPlan`` of ``graph`` (``runtime.plan``) in ``processes``
    processes: what a runner with that collective backend builds. Cached per graph: a
    replay only reads it."""
    cache = _PLANS.setdefault(graph, {})
    key = (bool(compiled), processes)
    if key not in cache:
        cache[key] = build_plan(graph, bool(compiled), processes)
    return cache[key]


def node_graph(graph, compiled=True, noop_collectives=False):
    """The nodes the scheduler runs and their plan: ``(NodeGraph, DependencyPlan)``,
    the step plan's (``step_plan``). ``noop_collectives``: in one process (the plan
    decides whether its collectives then do nothing), else in several."""
    plan = step_plan(graph, compiled, 1 if noop_collectives else None)
    return plan.nodes, plan.deps


def _core_speed(host, busy):
    """Speed of one core, relative to alone, while ``busy`` cores run kernels."""
    if host.cores <= 1 or busy <= 1:
        return 1.0
    return 1.0 - (1.0 - host.parallel_efficiency) * (min(busy, host.cores) - 1) / (host.cores - 1)


class _Slot:
    """A resource that serves one activity at a time (GIL, core, stream, channel)."""

    __slots__ = ("free", "last")

    def __init__(self):
        self.free, self.last = 0.0, None


def _latest(pairs):
    t, act = 0.0, None
    for tt, a in pairs:
        if tt > t:
            t, act = tt, a
    return t, act


def _shared_device_slots(places):
    """Per place, the slot of its device when other places share it, else None."""
    dev = [getattr(p, "device_index", p.index) if getattr(p, "is_cuda", False) else None
           for p in places]
    slots = {d: _Slot() for d in set(dev) if d is not None and dev.count(d) > 1}
    return [slots.get(d) for d in dev]


class _Thread:
    __slots__ = ("idx", "gen", "node", "last", "idle")

    def __init__(self, idx):
        self.idx, self.gen, self.node, self.last, self.idle = idx, None, None, None, True


class _Replay:
    def __init__(self, graph, profile, cluster, processes, compiled, cuda_graph, threads,
                 inline, algorithm, comm):
        self.graph, self.profile, self.cluster = graph, profile, cluster
        self.host = cluster.host
        self.P = len(graph.places)
        self.procs = processes
        self.ranks = self.P * processes
        self.cuda_graph, self.compiled = cuda_graph, compiled
        self.gpu = cluster.device.is_gpu
        if profile.side_by_side is not None and not self.gpu:
            # the program's own kernels measured side by side beat the generic figure
            self.host = dataclasses.replace(self.host, parallel_efficiency=profile.side_by_side)
        self.algorithm, self.comm = algorithm, comm
        self.notes = []
        nodes_per_machine, g = cluster.layout(self.ranks)
        self.procs_per_node = max(1, g // self.P)
        # the processes of one node share its cores (CPU places run kernels on them);
        # with fewer cores than processes each runs at its time-slice of one core
        share = cluster.host.cores / self.procs_per_node
        cores = max(1, int(share))
        self.slowdown = 1.0 if self.gpu or share >= 1 else 1.0 / share
        self.cores = [_Slot() for _ in range(cores)]
        # the executor's own intra-op threads (places_rule: the same either way)
        torch_threads = intra_op_threads(self.P, cores) or cores
        self.kernel_cores = min(cores, profile.threads or torch_threads)
        # the profile ran its kernels on kernel_cores cores of an idle machine; the other
        # processes of the node keep as many of its cores busy as this one does
        self.alone = _core_speed(self.host, self.kernel_cores)
        if not self.gpu and profile.threads and profile.threads != torch_threads:
            self.notes.append(f"profile taken with {profile.threads} torch threads; the "
                              f"executor would use {torch_threads} per place here")
        self.gil = _Slot()
        self.streams = [{"compute": _Slot(), "comm": _Slot(), "fetch": _Slot()}
                        for _ in range(self.P)]
        self.proc_comm = _Slot()  # the process's collective stream (GPU)
        self.device_slot = _shared_device_slots(graph.places) if self.gpu else [None] * self.P
        self.shared = any(s is not None for s in self.device_slot)
        self.channels = [_Slot() for _ in range(max(1, cluster.comm_channels))]
        # processes of one node act as ranks of a cluster with that many per node
        self.proc_cluster = cluster.replace(gpus_per_node=self.procs_per_node)
        self.step_plan = step_plan(graph, compiled, processes)
        self.plan = self.step_plan.deps
        self.nodes = self.step_plan.nodes.nodes
        self.pending = list(self.plan.pending)
        self.num_threads = 1 if inline else (threads or scheduler.default_threads(self.P))
        self.inline = bool(inline) or self.num_threads == 1
        self.dev_end = {}   # handle id -> (time, activity) its device work ends
        self.pending_net = {}  # all-reduce start id -> (time, activity) network done
        self.acts = []
        self.heap, self.seq = [], 0
        self.now = 0.0
        self.queue = deque()
        self.stack = []
        self.missing = set()
        self.algos = {}
        self.busy = {"gil": 0.0, "device": 0.0, "comm": 0.0}
        self.hop_s = 0.0 if cuda_graph else self.host.hop_s

    # --- bookkeeping --------------------------------------------------------------------
    def act(self, start, end, cat, label, prev):
        a = Activity(start, end, cat, label, prev)
        self.acts.append(a)
        return a

    def at(self, t, thread):
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, thread.idx))

    # --- costs --------------------------------------------------------------------------
    def cost(self, h):
        c = self.profile.cost(h)
        if c is None:  # an update ZeRO moved onto shards: the profiled one, scaled
            c = self.profile.shard_cost(h, self.graph.program)
        if c is None:
            if not isinstance(h, FetchOpHandle):
                self.missing.add(h.op_type)
            c = self.profile.fallback(h)
        host = self.host.op_s if c.host_s is None else c.host_s
        dev = c.device_s
        if self.profile.wall:
            dev = max(0.0, dev - host)
        if self.cuda_graph:
            host = 0.0
        return OpCost(dev, host)

    def net_time(self, coll, nbytes, ranks, cluster=None):
        if not self.comm:
            return 0.0
        t, algo = collective_time(cluster or self.cluster, coll, nbytes, ranks, self.algorithm)
        self.algos[algo] = self.algos.get(algo, 0) + 1
        return t

    def local_time(self, model, nbytes):
        """In-process collective of the P places (host work for CPU places)."""
        P = self.P
        if P <= 1 or not self.comm:
            return 0.0
        if self.cluster.local_sum is None or (self.gpu and not self.shared):
            return self.net_time(model.in_process(self.procs), nbytes, P)
        # CPU places: host work; GPU places sharing a device: LocalCollective's kernels
        alpha, bw = self.cluster.local_sum
        return (P - 1) * (alpha + nbytes / bw) * model.passes / 2

    # --- host work ----------------------------------------------------------------------
    def host_work(self, thread, seconds, label, gil_fraction=None):
        """Book ``seconds`` of host work on ``thread`` at ``now``; return its end."""
        if seconds <= 0:
            return self.now
        seconds *= self.slowdown
        f = self.host.gil_fraction if gil_fraction is None else gil_fraction
        gil = seconds * f
        cands = [(self.now, thread.last), (self.gil.free, self.gil.last)]
        core = None
        if not self.gpu:
            core = min(self.cores, key=lambda c: c.free)
            cands.append((core.free, core.last))
        start, prev = _latest(cands)
        a = self.act(start, start + seconds, "host", label, prev)
        if gil > 0:
            g = self.act(start, start + gil, "gil", label, prev)
            self.gil.free, self.gil.last = start + gil, g
            self.busy["gil"] += gil
        if core is not None:
            core.free, core.last = start + seconds, a
        thread.last = a
        return a.end

    def cpu_kernel(self, thread, seconds, label, ncores=None, cat="device"):
        """A CPU place's kernel: ``ncores`` cores for ``seconds`` on the calling thread."""
        if seconds <= 0:
            return self.now
        k = ncores or self.kernel_cores
        chosen = sorted(self.cores, key=lambda c: c.free)[:k]
        start, prev = _latest([(self.now, thread.last)] + [(c.free, c.last) for c in chosen])
        # cores running side by side slow each other (shared caches, memory bandwidth)
        busy = k + sum(1 for c in self.cores if c not in chosen and c.free > start)
        busy = min(self.host.cores, busy * self.procs_per_node)
        seconds *= self.slowdown * self.alone / _core_speed(self.host, busy)
        a = self.act(start, start + seconds, cat, label, prev)
        for c in chosen:
            c.free, c.last = a.end, a
        thread.last = a
        self.busy["device"] += seconds
        return a.end

    def stream_work(self, slot, seconds, label, after, cat="device", place=0):
        """Work on a stream (or channel) ``slot`` of ``place`` once ``after`` (time,
        activity) pairs have passed, and its device's turn where places share it;
        returns its activity."""
        shared = self.device_slot[place]
        cands = [(slot.free, slot.last)] + list(after)
        if shared is not None:
            cands.append((shared.free, shared.last))
        start, prev = _latest(cands)
        a = self.act(start, start + seconds, cat, label, prev)
        slot.free, slot.last = a.end, a
        if shared is not None:
            shared.free, shared.last = a.end, a
        self.busy["comm" if cat == "comm" else "device"] += seconds
        return a

    def deps(self, h):
        return [self.dev_end[p.id] for p in h.producers() if p.id in self.dev_end]

    # --- handles --------------------------------------------------------------------------
    def run_handle(self, thread, h):
        yield from replay_handle(h, self, thread)  # chosen by the handle's class

    def op(self, thread, h):
        c = self.cost(h)
        label = h.name
        cat = "optimizer" if getattr(getattr(h, "op", None), "role", None) == "optimize" \
            else "device"
        t = self.host_work(thread, c.host_s, label)
        if self.gpu:
            place = h.place_idx if h.on_one_place else 0
            a = self.stream_work(self.streams[place][h.stream], c.device_s, label,
                                 [(t, thread.last)] + self.deps(h), cat, place=place)
            self.dev_end[h.id] = (a.end, a)
            yield t
            return
        yield t
        end = self.cpu_kernel(thread, c.device_s, label, cat=cat)
        self.dev_end[h.id] = (end, thread.last)
        yield end

    def fused(self, thread, group):
        """One ``torch._foreach_*`` update for a group of optimizer ops (memory-bound)."""
        host_s, device_s, label = foreach_cost(group, self.graph.program, self.cluster,
                                               self.host, self.gpu, self.cuda_graph)
        t = self.host_work(thread, host_s, label)
        if self.gpu:
            h = group[-1]
            slot = self.streams[h.place_idx]["compute"]
            deps = [d for g in group for d in self.deps(g)]
            a = self.stream_work(slot, device_s, label, [(t, thread.last)] + deps,
                                 "optimizer", place=h.place_idx)
            for g in group:
                self.dev_end[g.id] = (a.end, a)
            yield t
            return
        yield t
        end = self.cpu_kernel(thread, device_s, label, cat="optimizer")
        for g in group:
            self.dev_end[g.id] = (end, thread.last)
        yield end

    def collective(self, thread, h):
        nbytes = wire_bytes(h, self.graph.program)
        model = cost_model(h)  # the handle's class names its cost model (sim.comm_cost)
        is_async = model.splits and h.wait is not None
        label = h.name
        P = self.P
        if self.step_plan.noop_collectives:
            # nothing to do: the compiled path emits no code for it, the readable path
            # calls the backend once
            t = self.host_work(thread, 0.0 if self.cuda_graph or self.compiled
                               else self.host.op_s, label)
            self.dev_end[h.id] = (t, thread.last)
            yield t
            return
        local = self.local_time(model, nbytes)
        cross = self.procs > 1
        if self.gpu:
            launch = self.host.op_s * P + (self.cluster.collective_issue_s if cross else 0.0)
            t = self.host_work(thread, 0.0 if self.cuda_graph else launch, label)
            work = local
            if cross and model.hierarchical:  # local reduce, processes, local broadcast
                work += self.net_time(model, nbytes, self.procs, self.proc_cluster)
            elif cross:
                work = self.net_time(model, nbytes, self.ranks)
            a = self.stream_work(self.proc_comm, work, label,
                                 [(t, thread.last)] + self.deps(h), "comm")
            self.dev_end[h.id] = (a.end, a)
            yield t
            if cross and is_async:
                self.pending_net[h.id] = (a.end, a)
            elif cross and model.hierarchical and not self.cuda_graph:
                # the executor waits for the process group's work with a timeout: blocking
                yield self.block(thread, (a.end, a))
            return
        # CPU places: the in-process part is host work (sums and copies on the thread)
        calls = model.passes * (P - 1)
        # a fused bucket across processes: flatten, then copy back (in one process its
        # vars are summed coalesced, as many calls as one var: all_reduce_coalesced)
        if len(h.var_names) > 1 and P > 1 and cross:
            calls += P * (1 + len(h.var_names))
            if self.cluster.local_sum is not None:
                local += 2 * P * nbytes / self.cluster.local_sum[1]
        host = min(calls * self.host.op_s, local)
        t = self.host_work(thread, host, label)
        yield t
        if local > host:
            t = self.cpu_kernel(thread, local - host, label, ncores=1)
            yield t
        if cross:
            t = self.host_work(thread, self.host.op_s + self.cluster.collective_issue_s, label)
            yield t
            net = self.net_time(model, nbytes, self.procs, self.proc_cluster)
            ch = min(self.channels, key=lambda c: c.free)
            a = self.stream_work(ch, net, label, [(t, thread.last)], "comm")
            if is_async:
                self.pending_net[h.id] = (a.end, a)
            else:
                t = self.block(thread, (a.end, a))
                yield t
        self.dev_end[h.id] = (t, thread.last)

    def free(self, thread, h):
        """Drop a gathered parameter (ZeRO-3): no kernel and no host launch to speak of.
        PyTorch's caching allocator frees in stream order, so the host does not wait
        for the kernels that read it; the next gather that reuses the memory is ordered
        after it by the graph's dummy edge."""
        self.dev_end[h.id] = (self.now, thread.last)
        yield self.now

    def block(self, thread, done):
        """The thread waits, GIL released, until ``done`` = (time, activity) has passed."""
        end, act = done
        if end > self.now:
            thread.last = act  # what it waited for is what let it go on
        return max(self.now, end)

    def wait_handle(self, thread, h):
        done = self.pending_net.pop(h.start.id, None)
        if done is None:  # no network part (comm off, or one process)
            done = self.dev_end.get(h.start.id, (self.now, thread.last))
        if self.cuda_graph:
            self.dev_end[h.id] = done
            yield self.now
            return
        t = self.block(thread, done)
        self.dev_end[h.id] = (t, thread.last)
        yield t

    # --- scheduling -----------------------------------------------------------------------
    def node_gen(self, thread, node):
        # the compiled path's own fusion rule (fp16 updates sharing a SkipUpdate fuse too)
        fused_at, skip = plan_fusion(node.handles) if self.compiled else ({}, ())
        for k, h in enumerate(node.handles):
            if k in skip:
                continue
            if k in fused_at:
                yield from self.fused(thread, fused_at[k])
            else:
                yield from self.run_handle(thread, h)
        if not self.cuda_graph:
            t = self.host_work(thread, self.host.node_s, "scheduler", gil_fraction=1.0)
            yield t

    def start(self, thread, node_id, t, prev=None):
        thread.idle = False
        thread.node = self.nodes[node_id]
        if prev is not None and (thread.last is None or prev.end > thread.last.end):
            thread.last = prev
        thread.gen = self.node_gen(thread, thread.node)
        self.at(t, thread)

    def put(self, node_id, prev):
        self.queue.append((self.now, node_id, prev))

    def dispatch(self):
        for w in self.threads[1:]:
            if not self.queue:
                return
            if w.idle:
                put_t, j, prev = self.queue.popleft()
                start = put_t
                core = None
                if not self.gpu and self.hop_s > 0:
                    # waking a thread is work of the OS on a core: with every core
                    # running kernels the woken worker waits for one
                    core = min(self.cores, key=lambda c: c.free)
                    if core.free > start:
                        start, prev = core.free, core.last
                t = max(self.now, start + self.hop_s)
                hop = self.act(put_t, t, "hop", "scheduler hand-off", prev) \
                    if t > put_t else prev
                if core is not None:
                    core.free, core.last = t, hop
                self.start(w, j, t, hop)

    def finished(self, thread, node):
        ready = []
        pending = self.pending
        for j in self.plan.succ[node.id]:
            pending[j] -= 1
            if pending[j] == 0:
                ready.append(j)
        if self.inline:
            self.stack.extend(reversed(ready))
            if self.stack:
                self.start(thread, self.stack.pop(), self.now)
            else:
                thread.idle = True
            return
        nxt = None
        if ready:
            nxt = scheduler.run_here(ready, self.plan.is_comm)
            for j in ready:
                if j != nxt:
                    self.put(j, thread.last)
        if nxt is not None:
            self.start(thread, nxt, self.now)
        elif thread.idx > 0 and self.queue:
            put_t, j, prev = self.queue.popleft()
            self.start(thread, j, max(self.now, put_t), prev)
        else:
            thread.idle = True
        self.dispatch()

    def run(self):
        self.threads = [_Thread(i) for i in range(self.num_threads)]
        caller = self.threads[0]
        caller.idle = False
        if self.cuda_graph:
            t = 0.0
            for _ in range(self.P):
                self.now = t
                t = self.host_work(caller, self.host.graph_launch_s, "cuda graph replay")
        else:
            self.now = 0.0
            t = self.host_work(caller, self.host.step_s * self.P, "step (feeds, fetches)",
                               gil_fraction=1.0)
        self.now = t
        roots = self.plan.roots
        if self.inline:
            self.stack = list(reversed(roots))
            self.start(caller, self.stack.pop(), t)
        else:
            first = scheduler.run_here(roots, self.plan.is_comm)
            for r in roots:
                if r != first:
                    self.put(r, caller.last)
            self.start(caller, first, t)
            self.dispatch()
        while self.heap:
            t, _, idx = heapq.heappop(self.heap)
            self.now = t
            thread = self.threads[idx]
            try:
                nxt = next(thread.gen)
            except StopIteration:
                self.finished(thread, thread.node)
                continue
            self.at(max(nxt, t), thread)
        left = [j for j, c in enumerate(self.pending) if c > 0]
        if left:
            raise RuntimeError(f"simulation stalled with {len(left)} nodes never ready")
        ends = [(a.end, a) for a in self.acts]
        end, last = _latest(ends)
        path = []
        a = last
        seen = set()
        while a is not None and id(a) not in seen:
            seen.add(id(a))
            path.append(a)
            a = a.prev
        path.reverse()
        if self.missing:
            self.notes.append("not in the profile (median of their type used): " +
                              ", ".join(sorted(self.missing)))
        return SimResult(step_s=end, places=self.P, processes=self.procs, ranks=self.ranks,
                         inline=self.inline, threads=self.num_threads,
                         gil_busy_s=self.busy["gil"], device_busy_s=self.busy["device"],
                         comm_busy_s=self.busy["comm"], critical=path,
                         algorithms=dict(self.algos), notes=list(self.notes),
                         activities=self.acts)


@functools.singledispatch
def replay_handle(h, replay, thread):
    """Replay op handle ``h`` on ``thread`` of ``replay``: chosen by the handle's class,
    as the runtime's ``handle_fn`` and ``emit_handle`` choose how it runs. A generator
    of the times the thread is next free; a new kind registers here."""
    raise SSAExecError(f"the simulator has no model for op handle kind {h.kind!r}")


for _cls in (ComputationOpHandle, ScaleLossGradOpHandle, FetchOpHandle):
    replay_handle.register(_cls, lambda h, replay, thread: replay.op(thread, h))
replay_handle.register(CollectiveOpHandle,
                       lambda h, replay, thread: replay.collective(thread, h))
replay_handle.register(AllReduceWaitOpHandle,
                       lambda h, replay, thread: replay.wait_handle(thread, h))
replay_handle.register(FreeOpHandle, lambda h, replay, thread: replay.free(thread, h))


def simulate_step(graph, profile, cluster, processes=1, compiled=True, cuda_graph=False,
                  threads=None, inline=False, algorithm="auto", comm=True):
    """Replay one step of ``graph`` (one process's places) and return a ``SimResult``.

    Parameters
    ----------
    graph : SSAGraph
        The graph of one process (its ``P`` local places; ``num_trainers`` processes
        in the strategy make its all-reduces cross-process).
    profile : Profile
    cluster : Cluster
    processes : int
        Processes in the run, each with ``P`` places (ranks = ``P * processes``).
    compiled : bool
        Replay the compiled runner's segments (default) or the readable path.
    cuda_graph : bool
        Replay captured CUDA graphs (no per-op host time).
    threads : int, optional
        Scheduler threads (default ``min(8, P + 1)``, as the executor).
    inline : bool
        Run everything in the caller's thread.
    algorithm : str
        All-reduce algorithm (``ssaexec.sim.comm_cost.ALGORITHMS``).
    comm : bool
        False: collectives cost nothing (to see how much communication is exposed).
    """
    return _Replay(graph, profile, cluster, processes, compiled, cuda_graph, threads,
                   inline, algorithm, comm).run()
