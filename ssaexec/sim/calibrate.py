"""A cluster for this machine, measured: host constants and all-reduce sweeps.

``calibrate_cpu`` measures what the engine needs to replay CPU places, each with a
small program of its own, never the program being predicted:

* ``op_s``: host time of one op on the compiled path: a chain of tiny builder ops
  (``scale``/``elementwise_add``/``relu`` on a [4, 4] tensor), time per op;
* ``readable_extra_s``: what the readable per-op path adds (the same chain through
  ``ParallelExecutor.observe``: an op's timed slice minus the compiled time per op),
  taken off traced op times;
* ``gil_fraction``: two threads run the chain side by side; with ``c`` >= 2 cores the
  pair takes ``max(1, 2f)`` times as long as one, so ``f = ratio / 2`` when the
  ratio exceeds 1 (below that it cannot be told apart from 0.5 on this machine and
  hardly matters: the cores bind first; the default is kept);
* ``hop_s``: the scheduler's hand-off latency: a chain whose every link is queued to
  another worker (``runtime.scheduler.Scheduler`` with no-op functions);
* ``step_s``: ``ParallelExecutor.run`` of a one-op program on one place, less the op;
* ``parallel_efficiency``: ``k`` threads each running a 1-thread training step of one
  convolution layer (convolution, batch norm, ReLU, their gradients; GIL released)
  side by side, against one alone, for ``k`` up to the cores: shared
  caches, memory bandwidth or hyper-threads make all cores busy give less than
  ``cores`` times one (``Host.parallel_efficiency`` is that ratio over ``cores``);
* ``local_sum``: ``LocalCollective.all_reduce`` over 2 and 4 places for a sweep of
  sizes, least squares of ``(P-1)·(α + S/B)``.

``gloo_sweep`` (run in every process of a 2-process gloo group) times blocking
all-reduces for a sweep of sizes; ``fit_latency_bandwidth`` turns it into the
intra-node ``Link`` of the CPU cluster: a 2-rank ring costs ``2α + S/B``.
``gloo_burst`` times a burst of asynchronous all-reduces, as the executor issues them:
the host time of one call (``Cluster.collective_issue_s``) and how many progress at
once (``Cluster.comm_channels``).

``calibrate_gpu`` does the same for one GPU, for places on it (``cuda:0`` and
``cuda:0,0``): the host constants above with the chain on a CUDA place (its launches
are the host's work; ``parallel_efficiency`` is a CPU figure and stays 1); the
``LocalCollective`` all-reduce of 2 and 4 places on the device, its device time
(``device_time``: the calls queued behind ``torch.cuda._sleep`` so they run back to
back, timed by CUDA events, launches excluded); ``Device.kernel_min`` (a tiny kernel
back to back), ``mem_bw`` (a 256 MiB copy) and ``flops`` (a fp32 matrix product at
torch's current TF32 setting). Not calibrated: ``graph_launch_s`` (CUDA graphs are
not replayed here), NCCL's links (one GPU has none).
"""

import os
import platform
import statistics
import threading
import time

import torch

from ..core.compat import cuda_sleep
from .cluster import Cluster, Device, Host, Link

__all__ = ["calibrate_host", "local_sum_sweep", "gloo_sweep", "gloo_burst",
           "fit_latency_bandwidth", "parallel_speedup", "cpu_cluster", "calibrate_cpu",
           "cpu_name", "device_time", "gpu_device", "gpu_cluster", "calibrate_gpu"]

SIZES = (1 << 10, 1 << 14, 1 << 17, 1 << 20, 1 << 22)  # bytes


def cpu_name():
    """The CPU's model name (``/proc/cpuinfo``), else ``platform.processor()``."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _chain_program(n_ops):
    from ..program.builder import program_guard
    from ..program.desc import Program
    from ..program import layers
    main, startup = Program(), Program()
    with program_guard(main, startup):
        x = layers.data("x", shape=[-1, 4], dtype="float32")
        y = x
        for k in range(n_ops):
            y = (layers.scale(y, 0.5, 0.25) if k % 3 == 0 else
                 layers.elementwise_add(y, x) if k % 3 == 1 else layers.relu(y))
        out = layers.mean(y)
    return main, out.name


def _executor(main, out, place=None, **strategy):
    from ..execution.parallel_executor import ParallelExecutor
    from ..core.place import CPUPlace
    from ..runtime.scope import Scope
    from ..core.strategy import ExecutionStrategy
    return ParallelExecutor(places=[place or CPUPlace(0)], main_program=main, scope=Scope(),
                            # the straight-line path the simulator models, not the
                            # default's tiers (a background compile beside the timed steps)
                            exec_strategy=ExecutionStrategy(**{"compiler": "none", **strategy}),
                            distributed=False)


def _time_runs(pe, out, feed, runs):
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        pe.run(fetch_list=[out], feed=feed)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _hop_latency(links=300, repeats=5):
    from ..runtime.scheduler import DependencyPlan, Scheduler
    # comm chain c_i -> c_{i+1}, compute leaf l_i after c_i: the thread that ran c_i
    # queues c_{i+1} and runs l_i itself, and l_i holds that thread until c_{i+1} has
    # started elsewhere; the other worker sleeps in the queue, so every link of the
    # chain is one wake-up of a sleeping worker
    producers, comm = [], []
    for i in range(links):
        producers.append([2 * (i - 1)] if i else [])
        comm.append(True)
        producers.append([2 * i])
        comm.append(False)
    plan = DependencyPlan(len(producers), producers, comm)
    started = []

    def link(i):
        def c():
            started[i].set()

        def leaf():
            if i + 1 < links:
                started[i + 1].wait(1.0)
        return c, leaf
    fns = [f for i in range(links) for f in link(i)]
    sched = Scheduler(3, name="ssaexec-calibrate")
    try:
        per_link = []
        for k in range(repeats + 1):
            started[:] = [threading.Event() for _ in range(links)]
            t0 = time.perf_counter()
            sched.run(plan, fns)
            if k:
                per_link.append((time.perf_counter() - t0) / links)
    finally:
        sched.close()
    return statistics.median(per_link)


def parallel_speedup(max_cores=None, seconds=0.15, repeats=5):
    """``{k: throughput of k threads / one thread's}`` for ``k`` = 1 .. cores, each thread
    running a 1-thread step of a convolution layer (GIL released) side by side: what cores shared
    caches, memory bandwidth or hyper-threads give when all are busy."""
    import torch.nn.functional as F

    from ..core.place import available_cores
    max_cores = max_cores or available_cores()
    x = torch.randn(8, 16, 32, 32, requires_grad=True)
    w = torch.randn(16, 16, 3, 3, requires_grad=True)
    gamma, beta = torch.ones(16, requires_grad=True), torch.zeros(16, requires_grad=True)

    def layer():
        # a training step's kernel mix, not one kind: convolutions alone hardly slow
        # each other, the batch norm and elementwise kernels around them stream memory
        y = F.relu(F.batch_norm(F.conv2d(x, w, padding=1), None, None, gamma, beta,
                                training=True))
        torch.autograd.grad(y.sum(), (x, w, gamma, beta))
    prev = torch.get_num_threads()
    torch.set_num_threads(1)

    def rate(k):
        counts = [0] * k
        barrier = threading.Barrier(k + 1)
        window = [0.0]

        def work(i):
            # OpenMP's thread count is per thread: a fresh thread left at the default
            # runs 2-thread kernels on cores the other threads need (as the
            # scheduler's workers do, set it in the thread)
            torch.set_num_threads(1)
            barrier.wait()
            while time.perf_counter() < window[0]:
                layer()
                counts[i] += 1
        ts = [threading.Thread(target=work, args=(i,)) for i in range(k)]
        for t in ts:
            t.start()
        window[0] = time.perf_counter() + seconds
        barrier.wait()
        for t in ts:
            t.join()
        return sum(counts)
    try:
        rate(1)
        # alternate k threads with one alone and take the median of the paired ratios:
        # a neighbour's burst then spoils a pair, not the whole estimate
        speedup = {1: 1.0}
        for k in range(2, max_cores + 1):
            speedup[k] = statistics.median(rate(k) / max(1, rate(1)) for _ in range(repeats))
        return speedup
    finally:
        torch.set_num_threads(prev)


def calibrate_host(n_ops=300, runs=20, default_gil=0.4, place=None):
    """Measure ``op_s``, ``readable_extra_s``, ``gil_fraction``, ``hop_s``, ``step_s`` with
    one torch thread, and the ``speedup`` of k cores (CPU places; ``{}`` on a CUDA
    ``place``, whose chain's launches are what is timed); returns a dict (module
    docstring)."""
    from ..execution.step_trace import OpTimer
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        main, out = _chain_program(n_ops)
        feed = {"x": torch.randn(4, 4)}
        pe = _executor(main, out, place, num_threads=1, torch_threads=1)
        try:
            _time_runs(pe, out, feed, 3)
            chain = _time_runs(pe, out, feed, runs)
            timer = OpTimer()
            with pe.observe([out], timer):
                for _ in range(runs // 2):
                    pe.run(fetch_list=[out], feed=feed)
            slices = sorted((t1 - t0) / 1e9 for _, _, _, t0, t1 in timer.records)
            per_op_readable = statistics.median(slices)
        finally:
            pe.close()
        one, out1 = _chain_program(1)
        pe1 = _executor(one, out1, place, num_threads=1, torch_threads=1)
        try:
            _time_runs(pe1, out1, feed, 3)
            tiny = _time_runs(pe1, out1, feed, runs * 5)
        finally:
            pe1.close()
        op_s = (chain - tiny) / (n_ops - 1)
        step_s = max(0.0, tiny - 2 * op_s)
        ratio = _two_threads(main, out, feed, runs, place) if (os.cpu_count() or 1) >= 2 \
            else 0.0
        gil = min(1.0, ratio / 2) if ratio > 1.05 else default_gil
        cuda = place is not None and place.is_cuda
        return {"op_s": op_s, "readable_extra_s": max(0.0, per_op_readable - op_s),
                "gil_fraction": gil, "two_thread_ratio": ratio, "hop_s": _hop_latency(),
                "step_s": step_s, "speedup": {} if cuda else parallel_speedup()}
    finally:
        torch.set_num_threads(prev)


def _two_threads(main, out, feed, runs, place=None):
    """Wall time of two threads each running the chain, over one thread's."""
    pes = [_executor(main, out, place, num_threads=1, torch_threads=1) for _ in range(2)]
    try:
        for pe in pes:
            _time_runs(pe, out, feed, 3)
        alone = _time_runs(pes[0], out, feed, runs)
        ratios = []
        for _ in range(3):
            barrier = threading.Barrier(3)

            def work(pe):
                barrier.wait()
                for _ in range(runs):
                    pe.run(fetch_list=[out], feed=feed)
            ts = [threading.Thread(target=work, args=(pe,)) for pe in pes]
            for t in ts:
                t.start()
            barrier.wait()
            t0 = time.perf_counter()
            for t in ts:
                t.join()
            ratios.append((time.perf_counter() - t0) / runs / alone)
        return statistics.median(ratios)
    finally:
        for pe in pes:
            pe.close()


def local_sum_sweep(sizes=SIZES, places=(2, 4), repeats=15, device=None):
    """``[(places, bytes, seconds)]`` of ``LocalCollective.all_reduce`` (float32).

    ``device`` (a CUDA ``torch.device``): every place's tensor on that one device (places
    sharing a GPU), seconds of device time per call (``device_time``)."""
    from ..runtime.collective import LocalCollective
    coll = LocalCollective()
    out = []
    if device is not None and torch.device(device).type == "cuda":
        for p in places:
            for s in sizes:
                ts = [torch.randn(max(1, s // 4), device=device) for _ in range(p)]
                _, dev = device_time(lambda ts=ts: coll.all_reduce(ts), device,
                                     repeats=max(3, repeats // 3))
                out.append((p, s, dev))
        return out
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for p in places:
            for s in sizes:
                ts = [torch.randn(max(1, s // 4)) for _ in range(p)]
                coll.all_reduce(ts)
                times = []
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    coll.all_reduce(ts)
                    times.append(time.perf_counter() - t0)
                out.append((p, s, statistics.median(times)))
    finally:
        torch.set_num_threads(prev)
    return out


def gloo_sweep(sizes=SIZES, repeats=15):
    """``[(bytes, seconds)]`` of blocking ``torch.distributed.all_reduce`` (float32) in
    the current process group (call it in every process)."""
    import torch.distributed as dist
    out = []
    warm = torch.zeros(256)
    for _ in range(20):  # connections, buffers
        dist.all_reduce(warm)
    for s in sizes:
        t = torch.randn(max(1, s // 4))
        for _ in range(3):
            dist.all_reduce(t)
        times = []
        for _ in range(repeats):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(t)
            times.append(time.perf_counter() - t0)
        out.append((s, statistics.median(times)))
    return out


def gloo_burst(nbytes=1 << 14, count=32, repeats=15):
    """``(issue seconds per call, seconds per all-reduce)`` of ``count`` asynchronous
    all-reduces of ``nbytes`` issued back to back and then waited for, as the executor's
    ``async_allreduce`` does (call it in every process of the group)."""
    import torch.distributed as dist
    ts = [torch.randn(max(1, nbytes // 4)) for _ in range(count)]
    issue, total = [], []
    for _ in range(repeats + 1):
        dist.barrier()
        t0 = time.perf_counter()
        works = [dist.all_reduce(t, async_op=True) for t in ts]
        t1 = time.perf_counter()
        for w in works:
            w.wait()
        t2 = time.perf_counter()
        issue.append((t1 - t0) / count)
        total.append((t2 - t0) / count)
    return statistics.median(issue[1:]), statistics.median(total[1:])


def fit_latency_bandwidth(points, small=1 << 14):
    """``(intercept, slope)`` of time against bytes, robust to a noisy point: the
    intercept from the median of the small sizes (latency-bound), the slope from them
    to the largest size (bandwidth-bound)."""
    pts = sorted(points)
    lo = [p for p in pts if p[0] <= small] or pts[:1]
    s0 = statistics.median(x for x, _ in lo)
    t0 = statistics.median(y for _, y in lo)
    s1, t1 = pts[-1]
    slope = max(0.0, (t1 - t0) / (s1 - s0)) if s1 > s0 else 0.0
    return max(0.0, t0 - slope * s0), slope


def _fit_local(sweep):
    # t = (P-1)·α + (P-1)·S/B: a line through (P-1, (P-1)·S) in two unknowns
    rows = [((p - 1), (p - 1) * s, t) for p, s, t in sweep]
    a11 = sum(r[0] * r[0] for r in rows)
    a12 = sum(r[0] * r[1] for r in rows)
    a22 = sum(r[1] * r[1] for r in rows)
    b1 = sum(r[0] * r[2] for r in rows)
    b2 = sum(r[1] * r[2] for r in rows)
    det = a11 * a22 - a12 * a12
    alpha = (b1 * a22 - b2 * a12) / det
    inv_bw = (a11 * b2 - a12 * b1) / det
    return max(alpha, 0.0), 1.0 / max(inv_bw, 1e-15)


def cpu_cluster(host, local, gloo=None, cores=None, name=None, burst=None):
    """A ``Cluster`` of CPU places on this machine from measured parts.

    ``host``: ``calibrate_host()``; ``local``: ``local_sum_sweep()``; ``gloo``:
    ``gloo_sweep()`` of 2 processes (None: the local sum's figures stand in);
    ``burst``: ``(bytes, gloo_burst())``: the host time to issue one collective, and
    how many are in flight at once (the blocking time of that size over the time per
    all-reduce in a burst; when a burst is slower than one at a time, one is in flight
    and the latency is what makes an all-reduce of that size take its time in the
    burst).
    """
    from ..core.place import available_cores
    cores = cores or available_cores()
    speedup = host.get("speedup") or {}
    efficiency = min(1.0, speedup.get(cores, speedup.get(str(cores), cores)) / cores)
    alpha_l, bw_l = _fit_local(local)
    issue, channels = 0.0, 2
    if gloo:
        a, b = fit_latency_bandwidth(gloo)
        link = Link(1.0 / max(b, 1e-15), max(a, 0.0) / 2)  # 2 ranks: 2α + S/B
        if burst is not None:
            # in a burst, all-reduces overlap (several in flight) or queue behind each
            # other; a queued one occupies the process group for its time in the burst
            size, (issue, per_call) = burst
            blocking = a + b * size
            channels = max(1, round(blocking / max(per_call, 1e-9)))
            if per_call > blocking:
                link = Link(link.bandwidth, max(0.0, per_call - b * size) / 2)
    else:
        link = Link(bw_l, alpha_l)
    return Cluster(
        name or f"cpu ({cores} cores, {cpu_name()})", 1024,
        Device("cpu", cpu_name()),
        Host(cores=cores, op_s=host["op_s"], gil_fraction=host["gil_fraction"],
             hop_s=host["hop_s"], step_s=host["step_s"], graph_launch_s=0.0,
             readable_extra_s=host["readable_extra_s"], parallel_efficiency=efficiency),
        intra=link, inter=link, collective_launch=0.0, comm_channels=channels,
        collective_issue_s=issue, local_sum=(alpha_l, bw_l),
        description=f"this machine: {cores} cores of {cpu_name()}; CPU places; processes "
                    "joined by gloo over loopback",
        sources=("calibrated by ssaexec.sim.calibrate on this machine",
                 "collectives in flight: a burst of asynchronous gloo all-reduces against "
                 "one blocking one (ProcessGroupGloo runs 2 worker threads by default)"))


def _sleep_rate(device):
    """Cycles per second of ``torch.cuda._sleep`` on ``device`` (its clock, measured)."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cycles = 1_000_000
    cuda_sleep(cycles)  # the first call loads the kernel
    a.record()
    cuda_sleep(cycles)
    b.record()
    b.synchronize()
    return cycles / max(a.elapsed_time(b) / 1e3, 1e-9)


def device_time(fn, device, calls=50, repeats=5):
    """``(host seconds, device seconds)`` per call of ``fn`` (GPU work on the current
    stream of CUDA ``device``).

    The host time is what queueing ``calls`` calls takes; for the device time the
    stream is first held by ``torch.cuda._sleep`` for longer than that, so the calls'
    kernels run back to back, without the gaps of their launches, between two CUDA
    events (medians of ``repeats``).
    """
    with torch.cuda.device(device):
        fn()
        torch.cuda.synchronize()
        rate = _sleep_rate(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        host, dev = [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            queued = time.perf_counter() - t0
            torch.cuda.synchronize()
            # hold the stream well past the time it takes to queue the calls again
            cuda_sleep(int(rate * (2 * queued + 1e-3)))
            start.record()
            for _ in range(calls):
                fn()
            end.record()
            end.synchronize()
            host.append(queued / calls)
            dev.append(start.elapsed_time(end) / 1e3 / calls)
        return statistics.median(host), statistics.median(dev)


def gpu_device(device, copy_bytes=256 << 20, matmul_n=4096):
    """``{name, kernel_min, mem_bw, flops}`` of CUDA ``device``, measured (module docstring)."""
    device = torch.device(device)
    tiny = torch.zeros(4, device=device)
    _, kernel_min = device_time(lambda: tiny.add_(1.0), device, calls=200)
    src = torch.empty(copy_bytes // 4, device=device)
    dst = torch.empty_like(src)
    _, copy_s = device_time(lambda: dst.copy_(src), device, calls=10)
    del src, dst
    a = torch.randn(matmul_n, matmul_n, device=device)
    b = torch.randn(matmul_n, matmul_n, device=device)
    _, mm_s = device_time(lambda: a @ b, device, calls=10)
    return {"name": torch.cuda.get_device_name(device), "kernel_min": kernel_min,
            "mem_bw": 2 * copy_bytes / copy_s,  # a copy reads and writes every byte
            "flops": 2 * matmul_n ** 3 / mm_s,
            "tf32": bool(torch.backends.cuda.matmul.allow_tf32)}


def gpu_cluster(host, local, device, name=None):
    """A one-GPU ``Cluster`` from measured parts: ``host`` (``calibrate_host(place=a
    CUDA place)``), ``local`` (``local_sum_sweep(device=...)``) and ``device``
    (``gpu_device()``). Places sharing the GPU all-reduce with ``local_sum``; the
    links stand for it too (one GPU has no NCCL link to measure)."""
    from ..core.place import available_cores
    alpha, bw = _fit_local(local)
    link = Link(bw, alpha)
    return Cluster(
        name or f"{device['name']} (this GPU)", 1,
        Device("gpu", device["name"], flops=device["flops"], mem_bw=device["mem_bw"],
               kernel_min=device["kernel_min"]),
        Host(cores=available_cores(), op_s=host["op_s"], gil_fraction=host["gil_fraction"],
             hop_s=host["hop_s"], step_s=host["step_s"],
             readable_extra_s=host["readable_extra_s"]),
        intra=link, inter=link, collective_launch=0.0, comm_channels=1, local_sum=(alpha, bw),
        description=f"this machine: one {device['name']}, {available_cores()} cores of "
                    f"{cpu_name()}; places on the GPU all-reduce with LocalCollective",
        sources=("calibrated by ssaexec.sim.calibrate on this machine (calibrate_gpu)",
                 "graph_launch_s: the default, not measured"))


def calibrate_gpu(place):
    """``(Cluster, raw measurements)`` for places on the GPU of CUDA ``place``."""
    host = calibrate_host(place=place)
    local = local_sum_sweep(device=place.device)
    device = gpu_device(place.device)
    return gpu_cluster(host, local, device), {"host": host, "local_sum": local,
                                              "device": device}


def calibrate_cpu(gloo=None):
    """``(Cluster, raw measurements)`` for CPU places of this machine."""
    host = calibrate_host()
    local = local_sum_sweep()
    return cpu_cluster(host, local, gloo), {"host": host, "local_sum": local, "gloo": gloo}
