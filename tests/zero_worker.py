"""One process of the ZeRO multi-process tests (tests/dist/test_zero_*.py start two).

Run as ``python tests/zero_worker.py SCENARIO OUT_DIR`` with torchrun's environment
(RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT); ``Workers`` starts them. Each rank writes
what it saw to ``OUT_DIR/rank<r>.pt`` and the test compares it with its own oracle (the
plain definition, or a plain all-reduce run in the test's process). One launch runs many
configurations: starting processes is the slow part on a small machine.

Scenarios:

* ``collectives``: ``ProcessGroupCollective.all_gather`` / ``reduce_scatter`` (and their
  ``_start`` forms, the graph handle's low-precision gather, the compat fallbacks) on
  inputs every rank can rebuild (``collective_input``), for 1 and 2 places a process; a
  size mismatch; a peer that never joins (a side group with a short timeout). With
  ``ZERO_BACKEND=nccl``: the same on GPUs (one a process).
* ``train``: every entry of ``TRAIN_RUNS`` (ZeRO stages 0-3, 1 and 2 places a process,
  SGD and AdamW, float64 and float32, the example MLP and CNN, gradient accumulation, an
  LR schedule, stage 3's switches, debug mode, ``compiler="inductor"``) trained ``runs``
  steps on this rank's share of the same global batches; the
  record holds ``pe.gathered_state()`` (every persistable as the plain program declares
  it), the losses and the ZeRO collectives each phase's graph holds. Last, a step that
  fails on rank 1 (an out-of-range label) under stage 3: each place's state before and
  after it.
* ``resume``: stage 3, AdamW with a step LR schedule, float64: ``RESUME_STEPS`` steps
  of an ``EpochSampler``'s global batches with ``se.Checkpoints`` (every 2 steps) in
  ``$ZERO_CKPT`` under ``se.elastic.guard``, on ``$ZERO_PLACES`` places a process
  (distributed when the world has several processes); it first resumes from the newest
  checkpoint there. The record: the step it started from and the final gathered state.
  ``SSAEXEC_FAULT=kill@step:N:R`` kills rank R at step N's first collective.
"""

import os
import signal
import subprocess
import sys
import time
import warnings

import torch

TIMEOUT = 30.0
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.abspath(__file__)


def eager(se):
    """No compiler, whatever ``SSAEXEC_COMPILER`` says (``make test-inductor`` would compile
    every run of a launch; the one Inductor run names it)."""
    return se.ExecutionStrategy(compiler="none")


# --- the launcher the tests use -----------------------------------------------------------

def _env(cuda=False, **extra):
    env = dict(os.environ)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
              "MASTER_PORT", "SSAEXEC_DISTRIBUTED_DEBUG", "SSAEXEC_FAULT"):
        env.pop(k, None)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    if not cuda:
        env["CUDA_VISIBLE_DEVICES"] = ""  # gloo on CPU, GPUs or not
    env.update({k: str(v) for k, v in extra.items()})
    return env


class Workers:
    """``world`` processes of ``scenario`` (killed, if still alive, on exit); ``cuda``
    leaves them the GPUs (else they see none)."""

    def __init__(self, scenario, out_dir, world=2, cuda=False, **env):
        from tests.ports import free_port
        self.port = free_port()
        self.out_dir = str(out_dir)
        self.world = world
        self.logs = [os.path.join(self.out_dir, f"out{r}.txt") for r in range(world)]
        self.procs = []
        for r in range(world):
            with open(self.logs[r], "w") as log:
                self.procs.append(subprocess.Popen(
                    [sys.executable, WORKER, scenario, self.out_dir], cwd=REPO,
                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                    env=_env(cuda, RANK=r, WORLD_SIZE=world, LOCAL_RANK=r, LOCAL_WORLD_SIZE=world,
                             MASTER_ADDR="127.0.0.1", MASTER_PORT=self.port, **env)))

    def log(self, r):
        with open(self.logs[r]) as f:
            return f.read()

    def logs_text(self):
        return "\n".join(f"--- rank {r} ---\n{self.log(r)[-4000:]}" for r in range(self.world))

    def wait(self, timeout):
        deadline = time.monotonic() + timeout
        for p in self.procs:
            p.wait(max(0.1, deadline - time.monotonic()))
        return [p.returncode for p in self.procs]

    def records(self, timeout):
        """Wait (at most ``timeout`` s) and return every rank's record; fail with the logs."""
        try:
            codes = self.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the workers did not finish in {timeout} s\n" +
                                 self.logs_text()) from None
        assert codes == [0] * self.world, self.logs_text()
        return [torch.load(os.path.join(self.out_dir, f"rank{r}.pt")) for r in range(self.world)]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)


# --- scenario "collectives" -----------------------------------------------------------------

PROCESSES = 2
SHARD = 5  # elements per rank's shard
COLLECTIVE_CASES = [(1, "float64"), (2, "float64"), (2, "float32")]  # (places, dtype)


def collective_input(kind, g, n, dtype):
    """The ``kind`` ("shard" or "full") tensor of global rank ``g``: ``n`` elements that
    every process (and the test) can make again."""
    gen = torch.Generator().manual_seed(1000 * g + (1 if kind == "full" else 2) + 7 * n)
    return torch.randn(n, dtype=getattr(torch, dtype), generator=gen)


def _expect(exc_type, fn):
    try:
        fn()
    except exc_type as e:
        return {"type": type(e).__name__, "message": str(e)}
    except BaseException as e:  # noqa: BLE001 - reported to the test, which fails on it
        return {"type": type(e).__name__, "message": str(e), "unexpected": True}
    return {"type": None, "message": "no error"}


def _collectives(se, rank, record):
    import datetime

    import torch.distributed as dist

    from ssaexec.core import compat
    from ssaexec.dist.group_collective import ProcessGroupCollective
    from ssaexec.graph.handles import AllGatherOpHandle
    coll = ProcessGroupCollective(timeout=TIMEOUT)
    nccl = coll.backend == "nccl"
    dev = torch.device(f"cuda:{se.distributed.local_rank()}" if nccl else "cpu")
    record["processes"], record["process_rank"] = coll.processes, coll.process_rank
    for places, dtype in COLLECTIVE_CASES:
        world = PROCESSES * places
        ranks = [rank * places + i for i in range(places)]
        shards = [collective_input("shard", g, SHARD, dtype).to(dev) for g in ranks]
        fulls = [collective_input("full", g, world * SHARD, dtype).to(dev) for g in ranks]
        outs = [torch.full((world * SHARD,), float("nan"), dtype=shards[0].dtype, device=dev)
                for _ in range(places)]
        coll.all_gather([s.clone() for s in shards], outs, label="all_gather(case)")
        got = [torch.full((SHARD,), float("nan"), dtype=shards[0].dtype, device=dev)
               for _ in range(places)]
        sent = [f.clone() for f in fulls]
        coll.reduce_scatter(sent, got, label="reduce_scatter(case)")
        untouched = all(torch.equal(a, b) for a, b in zip(sent, fulls, strict=True))
        reduced = [f.clone() for f in fulls]
        coll.all_reduce(reduced, label="all_reduce(case)")
        # two in flight at once, finished in order (the graph's asynchronous form)
        a_outs = [torch.zeros_like(o) for o in outs]
        a_got = [torch.zeros_like(s) for s in got]
        fin_gather = coll.all_gather_start([s.clone() for s in shards], a_outs)
        fin_scatter = coll.reduce_scatter_start([f.clone() for f in fulls], a_got)
        fin_gather()
        fin_scatter()
        # the low-precision gather (zero_gather_dtype), as the graph's handle makes it
        low = [torch.zeros_like(o) for o in outs]
        AllGatherOpHandle(["w"], ["w@SHARD"], [[world * SHARD]], wire_dtype="bfloat16").apply(
            coll, (shards, low), "all_gather(w)")
        record[(places, dtype)] = {
            "gather": outs, "scatter": got, "inputs_untouched": untouched,
            "all_reduce": reduced[0], "async_gather": a_outs, "async_scatter": a_got,
            "bf16_gather": low}
    # the pre-2.13 names (compat's fallbacks) give what the running torch's own name gives
    x = collective_input("shard", rank, SHARD, "float64").to(dev)
    both = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # all_gather_into_tensor, deprecated
        for name in ("dist.all_gather_single", "dist.reduce_scatter_single"):
            f = compat.FEATURES[name]
            outs = []
            for fn in (f.fallback, f.get()):
                if name == "dist.all_gather_single":
                    out = torch.zeros(PROCESSES * SHARD, dtype=x.dtype, device=dev)
                    fn(out, x, group=None, async_op=True).wait()
                else:
                    out = torch.zeros(SHARD // 2 + 1, dtype=x.dtype, device=dev)
                    inp = collective_input("full", rank, PROCESSES * out.numel(),
                                           "float64").to(dev)
                    fn(out, inp, group=None, async_op=True).wait()
                outs.append(out)
            both[name] = (outs[0], outs[1], f.native)
    record["compat"] = both
    # a shard of the wrong size is refused before any collective, on every rank
    record["bad_size"] = _expect(se.SSAExecError, lambda: coll.all_gather(
        [torch.zeros(3), torch.zeros(4)], [torch.zeros(14), torch.zeros(14)],
        label="all_gather(bad)"))
    record["bad_out"] = _expect(se.SSAExecError, lambda: coll.reduce_scatter(
        [torch.zeros(7)], [torch.zeros(3)], label="reduce_scatter(bad)"))
    if nccl:  # a peer that never joins: NCCL's watchdog ends the process (docs)
        record["after"] = float(se.distributed.average(float(rank)))  # the group works
        return
    # a peer that never joins: the collective's DistributedError names rank and collective
    side = ProcessGroupCollective(dist.new_group(timeout=datetime.timedelta(seconds=1)),
                                  timeout=1)
    if rank == 0:
        t0 = time.perf_counter()
        record["hang"] = _expect(se.DistributedError, lambda: side.reduce_scatter(
            [torch.ones(2 * SHARD)], [torch.zeros(SHARD)], label="reduce_scatter(w@GRAD)"))
        record["hang"]["seconds"] = time.perf_counter() - t0
    # the default group is still usable (and rank 1 waits here, alive, for rank 0)
    record["after"] = float(se.distributed.average(float(rank)))


# --- scenario "train" -------------------------------------------------------------------------

PER_PLACE = 2  # samples per place per step
IN_DIM = 12


def train_model(opt, dtype, schedule=False, seed=0, model="mlp"):
    """The example MLP (sizes that leave padded shards: 10 and 8 over 2 or 4 ranks), or
    the example CNN (``model="cnn"``: conv, batch norm, 8x8 images)."""
    import ssaexec as se
    from ssaexec.program.example_models import build_cnn, build_mlp, make_optimizer
    lr = 0.05 if opt == "sgd" else 0.01
    if schedule:
        lr = se.optimizer.lr.StepDecay(lr, step_size=1, gamma=0.5)
    if model == "cnn":
        return build_cnn(dtype, make_optimizer(opt, lr), seed=seed, size=8, filters=(3, 4))
    return build_mlp(dtype, make_optimizer(opt, lr), seed=seed, in_dim=IN_DIM, hidden=(10, 8))


SAMPLE_SHAPES = {"mlp": [IN_DIM], "cnn": [1, 8, 8]}


def train_batches(places_total, dtype, runs, seed=0, model="mlp"):
    """``runs`` global batches of ``places_total * PER_PLACE`` samples (every process's)."""
    g = torch.Generator().manual_seed(seed)
    b = places_total * PER_PLACE
    shape = SAMPLE_SHAPES[model]
    return [{"img": torch.randn(b, *shape, dtype=getattr(torch, dtype), generator=g),
             "label": torch.randint(0, 10, (b, 1), generator=g)} for _ in range(runs)]


def _run(places, opt, dtype, stage, runs=3, schedule=False, compiler=None,
         seed_by_rank=False, debug=False, model="mlp", **options):
    return dict(places=places, opt=opt, dtype=dtype, stage=stage, runs=runs,
                schedule=schedule, compiler=compiler, seed_by_rank=seed_by_rank,
                debug=debug, model=model, options=options)


def _stages(name, stages=(0, 1, 2, 3), **kw):
    return {f"{name}/{s}": _run(stage=s, **kw) for s in stages}


# name -> run; "<group>/<stage>": the group's stage 0 is its plain all-reduce pair
TRAIN_RUNS = {
    **_stages("sgd-2x1", places=1, opt="sgd", dtype="float64"),
    **_stages("adamw-2x1", places=1, opt="adamw", dtype="float64"),
    **_stages("sgd-2x2", places=2, opt="sgd", dtype="float64"),
    **_stages("adamw-2x2", places=2, opt="adamw", dtype="float64"),
    # each rank's start-up draws other values: rank 0's are the ones every rank trains
    "adamw-2x2/3-seeds": _run(2, "adamw", "float64", 3, seed_by_rank=True),
    # the debug check compares the ranks' collective sequences (gathers, reduce-scatters)
    "adamw-2x2/3-debug": _run(2, "adamw", "float64", 3, debug=True),
    **_stages("adamw-fp32-2x2", places=2, opt="adamw", dtype="float32"),
    # the example CNN: 4-D conv weights, batch norm (its running statistics per place)
    **_stages("cnn-2x2", stages=(0, 1, 3), places=2, opt="adamw", dtype="float64",
              model="cnn"),
    # gradient accumulation: 2 micro-batches a step, 3 steps
    **_stages("accumulate-2x2", stages=(0, 2, 3), places=2, opt="adamw", dtype="float64",
              runs=6, gradient_accumulation_steps=2),
    **_stages("schedule-2x1", stages=(0, 3), places=1, opt="adamw", dtype="float64",
              schedule=True),
    # stage 3's switches: kept from forward to backward, no prefetch, bf16 gathers
    "switches-2x2/0": _run(2, "adamw", "float64", 0),
    "switches-2x2/3-keep": _run(2, "adamw", "float64", 3, reshard_after_forward=False),
    "switches-2x2/3-noprefetch": _run(2, "adamw", "float64", 3, zero_prefetch=0),
    "switches-2x2/3-bf16": _run(2, "adamw", "float64", 3, zero_gather_dtype="bf16"),
    # compiler="inductor" (its own launch: compiling is slow); its pair is adamw-2x1/0
    "inductor-2x1/3": _run(1, "adamw", "float64", 3, compiler="inductor"),
}

# the collectives each phase's graph holds (counted by kind)
ZERO_KINDS = ("all_gather", "reduce_scatter", "free", "all_reduce")


def _kinds(graph):
    out = dict.fromkeys(ZERO_KINDS, 0)
    for h in graph.ops:
        if h.kind in out:
            out[h.kind] += 1
    return out


def train_run(se, run, distributed, processes=PROCESSES):
    """Train ``run`` (a ``TRAIN_RUNS`` entry): this process's part of ``processes`` x
    ``run["places"]`` (``distributed``), or all of them in one process. Returns the
    gathered state, the losses (this process's) and the graphs' collective counts."""
    seed = se.distributed.rank() if distributed and run["seed_by_rank"] else 0
    main, startup, loss = train_model(run["opt"], run["dtype"], run["schedule"], seed,
                                      run["model"])
    batches = train_batches(processes * run["places"], run["dtype"], run["runs"],
                            model=run["model"])
    options = dict(run["options"], zero_stage=run["stage"])
    if distributed:
        places = se.distributed.local_places(run["places"])
        strategy = se.distributed.build_strategy(**options)
    else:
        places = se.cpu_places(processes * run["places"])
        strategy = se.BuildStrategy(**options)
    es = eager(se) if run["compiler"] is None else se.ExecutionStrategy(compiler=run["compiler"])
    if run["debug"] and distributed:
        os.environ[se.distributed.DEBUG_ENV] = "1"
    try:
        pe = se.ParallelExecutor(places, main, startup, loss, strategy, es, scope=se.Scope())
    finally:
        os.environ.pop(se.distributed.DEBUG_ENV, None)
    with pe:
        if run["debug"] and distributed:
            assert pe._collective.debug
        losses = []
        for feed in batches:
            lv, = pe.run([loss], feed=se.distributed.shard_batch(feed) if distributed else feed)
            losses.append(torch.as_tensor(lv).reshape(-1)[0].clone())
        phases = ["apply"] + (["accumulate"] if pe.program_for("accumulate") is not None
                              else [])
        kinds = {ph: _kinds(pe.graph([loss], phase=ph)) for ph in phases}
        state = {k: v.clone() for k, v in pe.gathered_state().items()}
    block = main.global_block()
    # batch norm's running statistics: each place's own (its share of the batch)
    per_place = sorted({n for op in block.ops if op.type == "batch_norm"
                        for n in op.output_names() if block.var(n).persistable})
    return {"state": state, "losses": torch.stack(losses), "kinds": kinds,
            "per_place": per_place}


def _place_state(pe):
    return [{n: t.detach().clone() for n, t in s.vars.items() if isinstance(t, torch.Tensor)}
            for s in pe.local_scopes]


def _failed_step(se, rank, record):
    """Stage 3, 2 places a process: rank 1's second step fails (a label out of range)."""
    run = _run(2, "adamw", "float64", 3)
    main, startup, loss = train_model(run["opt"], run["dtype"])
    batches = train_batches(PROCESSES * 2, "float64", 2)
    pe = se.ParallelExecutor(se.distributed.local_places(2), main, startup, loss,
                             se.distributed.build_strategy(zero_stage=3), eager(se),
                             scope=se.Scope())
    persist = [n for n, v in pe.run_program.global_block().vars.items() if v.persistable]
    try:
        pe.run([loss], feed=se.distributed.shard_batch(batches[0]))
        before = [{n: s.find_var(n).clone() for n in persist if s.find_var(n) is not None}
                  for s in pe.local_scopes]
        feed = se.distributed.shard_batch(batches[1])
        if rank == 1:
            feed["label"] = torch.full_like(feed["label"], 99)
            record["fail"] = _expect(se.OpError, lambda: pe.run([loss], feed=feed))
        else:
            record["fail"] = _expect(se.DistributedError, lambda: pe.run([loss], feed=feed))
        after = [{n: s.find_var(n).clone() for n in persist if s.find_var(n) is not None}
                 for s in pe.local_scopes]
        record["fail_state"] = (before, after)
    finally:
        pe.close()


class TorchMLP(torch.nn.Module):
    """The module of the write-back run (imported with ``se.from_torch``)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = torch.nn.Linear(IN_DIM, 10)
        self.fc2 = torch.nn.Linear(10, 10)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def torch_feed(batch):
    return {"x": batch["img"], "target": batch["label"][:, 0]}


def _write_back(se, record):
    """An imported ``torch.nn`` MLP trained 3 AdamW steps (stages 0 and 3, 2 places a
    process) and written back into a fresh module on every rank."""
    import torch.nn.functional as F
    batches = train_batches(PROCESSES * 2, "float64", 3)
    for stage in (0, 3):
        model = TorchMLP().double()
        main, startup, loss = se.from_torch(
            model, torch_feed(batches[0]), loss_fn=F.cross_entropy,
            optimizer=se.optimizer.AdamW(0.01, weight_decay=0.1))
        with se.ParallelExecutor(se.distributed.local_places(2), main, startup, loss,
                                 se.distributed.build_strategy(zero_stage=stage), eager(se),
                                 scope=se.Scope()) as pe:
            for b in batches:
                pe.run([loss], feed=se.distributed.shard_batch(torch_feed(b)))
            trained = TorchMLP().double()
            with torch.no_grad():
                for p in trained.parameters():
                    p.zero_()
            se.write_back(pe, trained)  # on every rank: a sharded parameter is gathered
        record[f"write_back/{stage}"] = {k: v.detach().clone()
                                         for k, v in trained.state_dict().items()}


def _train(se, rank, record):
    only = os.environ.get("ZERO_RUNS")  # a comma list of names: run only those
    names = only.split(",") if only else [n for n, r in TRAIN_RUNS.items()
                                          if r["compiler"] is None]
    for name in names:
        t0 = time.perf_counter()
        try:
            record[name] = train_run(se, TRAIN_RUNS[name], distributed=True)
        except Exception as e:  # noqa: BLE001 - reported per run; the others go on
            if isinstance(e, se.DistributedError):
                raise  # the group is gone: nothing else can run
            record[name] = {"error": f"{type(e).__name__}: {e}"}
        print(f"{name}: {time.perf_counter() - t0:.2f}s", flush=True)
    if not only:
        _write_back(se, record)
        _failed_step(se, rank, record)


# --- scenario "resume" ------------------------------------------------------------------------

RESUME_STEPS = 6
RESUME_BATCH = 8  # global: 2 ranks x 4 samples
RESUME_SAMPLES = 40  # 5 steps an epoch: the run crosses into a second epoch


def resume_data():
    g = torch.Generator().manual_seed(3)
    return {"img": torch.randn(RESUME_SAMPLES, IN_DIM, dtype=torch.float64, generator=g),
            "label": torch.randint(0, 10, (RESUME_SAMPLES, 1), generator=g)}


def _resume(se, record):
    places = int(os.environ.get("ZERO_PLACES", "1"))
    main, startup, loss = train_model("adamw", "float64", schedule=True)
    data = resume_data()
    sampler = se.EpochSampler(RESUME_SAMPLES, RESUME_BATCH, seed=0)
    ckpts = se.Checkpoints(os.environ["ZERO_CKPT"], every=2, keep=3)
    if se.distributed.world_size() > 1:
        places = se.distributed.local_places(places)
        strategy = se.distributed.build_strategy(zero_stage=3)
    else:
        places, strategy = se.cpu_places(places), se.BuildStrategy(zero_stage=3)
    with se.ParallelExecutor(places, main, startup, loss, strategy, eager(se),
                             scope=se.Scope()) as pe, \
            se.elastic.guard(ckpts) as run:
        record["start"] = start = ckpts.resume(pe, sampler)
        for step in range(start, RESUME_STEPS):
            run.step = step + 1
            idx = sampler.next_indices()
            pe.run([loss], feed={k: v[idx] for k, v in data.items()})
            ckpts.maybe_save(pe, step + 1, sampler)
        record["state"] = {k: v.clone() for k, v in pe.gathered_state().items()}
        record["runs"] = pe.runs
        record["layout_world"] = pe.shard_layout().world


def main(scenario, out_dir):
    from ssaexec.harness.worker import die_with_parent
    die_with_parent()  # never outlive the test that started this process
    import ssaexec as se
    info = se.distributed.init(backend=os.environ.get("ZERO_BACKEND", "gloo"), timeout=TIMEOUT)
    rank = info.rank
    record = {"rank": rank, "world_size": info.world_size}
    if scenario == "collectives":
        _collectives(se, rank, record)
    elif scenario == "train":
        _train(se, rank, record)
    elif scenario == "resume":
        _resume(se, record)
    else:
        raise SystemExit(f"unknown scenario {scenario!r}")
    torch.save(_to_cpu(record), os.path.join(out_dir, f"rank{rank}.pt"))


def _to_cpu(x):
    if isinstance(x, torch.Tensor):
        return x.detach().cpu()
    if isinstance(x, dict):
        return {k: _to_cpu(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_to_cpu(v) for v in x)
    return x


if __name__ == "__main__":
    sys.path.insert(0, REPO)
    main(sys.argv[1], sys.argv[2])
