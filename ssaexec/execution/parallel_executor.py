"""``ParallelExecutor``: data-parallel training of one program over several places.

Life cycle. At construction the startup program runs once (on the first
place, into ``scope``), and every persistable var is then broadcast: place
0's local scope shares the tensors of ``scope``, the other places get their
own copies, so all replicas start identical. Each ``run`` splits the feed's
batch dimension across places, runs the SSA graph (built and compiled once per
fetch list) with the out-of-order scheduler, and merges the fetched values.

Feeds. A dict feed is split along dim 0 for data vars whose first declared
dim is -1, as evenly as possible (the first ``B % n`` places get one more
sample); a batch smaller than the number of places is a ``FeedError``. Other
vars are copied to every place. A list of dicts feeds each place its own.

Fetches. With ``return_merged=True``: vars whose first dim is the batch (-1)
are concatenated in place order; scalars (shape ``[]`` or ``[1]``) are
averaged over places (with uneven splits that is the mean of per-place means);
anything else is identical on every place after the all-reduce and place 0's
value is returned. With ``return_merged=False`` each fetch is a list with one
value per place.

Processes. When a ``torch.distributed`` group of more than one process exists
(``se.distributed.init()`` under torchrun), or ``BuildStrategy(num_trainers>1)``
asks for one, this executor is one process of a multi-process run: the
strategy's ``num_trainers``/``trainer_id`` are filled from the group, all
processes check that they built the same program and strategy and take rank
0's persistables (after the startup program), and the gradient all-reduce
spans places and processes (``dist.group_collective``). Feeds and fetches
are this process's own. If a step fails on this rank, the group is aborted so
the other ranks raise ``DistributedError`` at once, and this executor refuses
further runs. ``distributed=False`` keeps an executor local (evaluation on one
rank, say).

Threads. Several CPU places run either on the scheduler's threads or in turns in the
caller's thread, whichever of a runner's first steps ran faster (``places_rule``,
applied by ``threading_probe``). CPU places share the host's cores, so while several
CPU places run, torch's intra-op threads are set to ``cores // places`` either way (at
least 1; override with ``ExecutionStrategy(torch_threads=...)``) and restored by
``close()``; in a multi-process run the cores are divided among the machine's processes too.

Values from outside. Before the persistables are broadcast, those the program reads
before writing are checked against its declarations (``runtime.boundary``: the error
names the startup program's op that wrote a misfit); ``set_var`` checks its value the
same way; and a step checks what it reads from the places' scopes only when someone
wrote them since this executor's last step (``Scope.set_var``, another executor).

Observing. ``observe()`` runs the observed steps on the readable per-op path by
choosing that runner itself (``_observing``); it never writes the caller's
``ExecutionStrategy``, which other executors and threads may share.

Size: the executor's public surface (set-up, variables, running, observing) is one
class, a facade; each decision it makes lives in a part of its own, in
``ssaexec.execution``: ``runner_cache`` (which runner runs a step), ``initial_state``
(the broadcast of the persistables, ZeRO's shards),
``learning_rate``, ``shared_vars`` (``share_vars_from``), ``cuda_graphs``,
``fetch_merge`` and ``torch_threads``. Beside it: ``step_programs`` (the per-phase
programs), ``observe`` (the per-op instrumentation), ``threading_probe`` (pool or
caller's thread), ``process_group_setup`` (joining a multi-process run, and leaving it
when a step fails), and the policies it applies in ``feed``,
``program.amp``/``accumulate``, ``runtime.*`` and ``checkpoint``.
"""

import contextlib
import time
import weakref

import torch

from ..dist import world as _distributed
from ..core.dtypes import torch_dtype
from ..core.errors import SSAExecError
from ..core.host_allocator import keep_freed_memory
from . import cuda_graphs, learning_rate, shared_vars
from .fetch_merge import merge_fetched
from .initial_state import broadcast_persistables, init_added_state, shard_persistables
from .runner_cache import RunnerCache
from .torch_threads import TorchThreads
from .executor import Executor, fetch_names
from ..data.feed import bind_feeds, forget_feeds, place_feeds
from .observe import instrumented
from ..core.place import cpu_places, cuda_places
from ..dist.group_setup import (
    GroupSteps, agree_and_broadcast, executor_collective, process_group_collective
)
from ..program.desc import Program
from ..runtime.boundary import SET_VAR, EntryCheck, check_value
from ..runtime.inductor import check_compiler
from ..runtime.interrupt import hold
from ..runtime.scheduler import Scheduler, default_threads
from ..runtime.scope import Scope, global_scope
from .step_programs import StepPrograms
from ..core.strategy import BuildStrategy, ExecutionStrategy
from .threading_probe import ThreadingProbes

__all__ = ["ParallelExecutor"]


class ParallelExecutor:
    """Train ``main_program`` data-parallel over ``places``.

    Parameters
    ----------
    places : list of Place, optional
        Default: every CUDA device, or ``cpu_places(cores)`` without one.
    main_program : Program
        The training program (forward, backward with ``role_var``, optimizer).
    startup_program : Program, optional
        Run once into ``scope`` before parameters are broadcast.
    loss_name : str, optional
        The loss var (used for checks and as the default fetch).
    build_strategy, exec_strategy : optional
        See ``BuildStrategy`` and ``ExecutionStrategy``.
    scope : Scope, optional
        Where the startup program writes (default ``se.global_scope()``).
    distributed : bool, optional
        None (default): one process of a multi-process run when a process group
        of more than one process exists or ``build_strategy.num_trainers > 1``;
        True: require a process group (of any size: a world of one runs the
        cross-process path too); False: stay local to this process.
    share_vars_from : ParallelExecutor, optional
        Run on that executor's values (an evaluation program next to a training
        one): each place's scope falls back to the other executor's scope of the same
        place, so it always sees the current parameters and statistics. What this
        program writes to its own vars stays its own; what it writes to a var the
        other executor holds (an evaluation batch norm's unchanged running statistics)
        lasts its step only, so the next step reads the other's current value again.
        The places must be the same.
    """

    def __init__(self, places=None, main_program=None, startup_program=None, loss_name=None,
                 build_strategy=None, exec_strategy=None, scope=None, distributed=None,
                 share_vars_from=None):
        if main_program is None:
            from ..program.builder import default_main_program
            main_program = default_main_program()
        if not isinstance(main_program, Program):
            raise SSAExecError(f"main_program must be a Program, got "
                               f"{type(main_program).__name__}")
        self.places = list(places) if places is not None else (cuda_places() or cpu_places())
        if not self.places:
            raise SSAExecError("ParallelExecutor needs at least one place")
        self.program = main_program
        if loss_name is not None and not isinstance(loss_name, str):
            loss_name = getattr(loss_name, "name", loss_name)  # a VarDesc names itself
        self.loss_name = loss_name
        if loss_name is not None and main_program.global_block().find_var(loss_name) is None:
            raise SSAExecError(f"loss_name {loss_name!r} is not a var of the main program")
        self.exec_strategy = exec_strategy or ExecutionStrategy()
        self.scope = scope if scope is not None else global_scope()
        # the group fills num_trainers/trainer_id in a copy: the caller's object stays
        self.build_strategy, dist_collective = process_group_collective(
            build_strategy or BuildStrategy(), distributed)
        cuda_graphs.check_places(self.exec_strategy, self.places, dist_collective is not None)
        check_compiler(self.exec_strategy.compiler, self.places)
        self._scheduler = Scheduler(self.exec_strategy.num_threads
                                    or default_threads(len(self.places)), name="ssaexec")
        # the local or cross-process collective (tests may replace it before the first step)
        self._collective, self.collective_backend = executor_collective(self.places,
                                                                        dist_collective)
        self.distributed = dist_collective is not None
        # this run's processes on this machine: they share its cores (torch's threads, a
        # tiered runner's background compile)
        local = _distributed.local_world_size() if self.distributed else 1
        self._group = GroupSteps()  # a failed multi-process step aborts the group
        self._programs = StepPrograms()
        self._runners = RunnerCache(self.places, self.build_strategy, self.exec_strategy,
                                    self._scheduler, local)
        self._cuda_graphs = cuda_graphs.StepGraphCache()
        self._step_graphs = self._cuda_graphs.graphs  # id(runner) -> StepGraphs
        # makes each StepGraphs' capture mechanism (None: CUDA graphs); tests set a CPU one
        self._graph_capture = None
        self._shadowing = None  # share_vars_from: persistable names a step may shadow
        self._lender = None  # share_vars_from: the executor shared from
        self._micro_step = 0  # runs so far (gradient accumulation picks the phase from it)
        self._probes = ThreadingProbes(self.places)  # threads or turns (places_rule)
        self._entry = EntryCheck()  # what steps read from the places' scopes (boundary)
        self._observing = False  # observe(): steps run the readable path (see observe)
        if any(not p.is_cuda for p in self.places):
            # steps reuse what they free (core.host_allocator); before anything process-wide
            # is changed, since a bad SSAEXEC_HOST_ALLOCATOR raises here
            keep_freed_memory()
        self._threads = TorchThreads()
        self._threads.apply(self.places, self.exec_strategy.torch_threads, local)
        self._finalizer = weakref.finalize(self, _shutdown, self._scheduler, self._runners)
        try:
            if share_vars_from is not None:
                self._share_vars(share_vars_from)
                return
            if startup_program is not None:
                Executor(self.places[0]).run(startup_program, scope=self.scope)
            init_added_state(self.run_program, self.scope)
            self.local_scopes = [Scope() for _ in self.places]
            if self.distributed:
                agree_and_broadcast(self._collective, self.build_strategy, self.places,
                                    self.run_program, self.scope)
            programs = self._step_programs()
            broadcast_persistables(programs, self.scope, self.places, self.local_scopes,
                                   {}, startup_program)
            shard_persistables(self.shard_layout(), self.scope, self.places,
                               self.local_scopes,
                               self.build_strategy.trainer_id * len(self.places),
                               keep={v.name for p in programs
                                     for v in p.global_block().vars.values() if v.persistable})
            self._entry.trust(programs, self.local_scopes)
        except BaseException:
            self.close()
            raise

    # --- set-up -------------------------------------------------------------------------
    @property
    def run_program(self):
        """The program of a full step as the places run it: ``main_program``, rewritten
        for ``ExecutionStrategy(amp=...)`` (``ssaexec.program.amp``) and, with
        ``BuildStrategy(gradient_accumulation_steps=K)``, the last micro-batch's program
        (all-reduce and update; ``program_for("accumulate")`` is the others')."""
        return self.program_for("apply")

    def program_for(self, phase="apply"):
        """The program of ``phase``: "apply" (a full step) or "accumulate" (a micro-batch
        that only accumulates gradients; None without gradient accumulation)."""
        bs = self.build_strategy
        return self._programs.program_for(self.program, phase, self.exec_strategy,
                                          bs.gradient_accumulation_steps,
                                          (bs.zero_stage, len(self.places) * bs.num_trainers))

    def _share_vars(self, other):
        if not isinstance(other, ParallelExecutor):
            raise SSAExecError(f"share_vars_from must be a ParallelExecutor, got "
                               f"{type(other).__name__}")
        self.local_scopes = shared_vars.shared_scopes(self.places, other.places,
                                                      other.local_scopes)
        self._shadowing = shared_vars.shadowable(self.program)
        self._lender = other  # ZeRO 3: whole parameters are borrowed for each run

    def state_owners(self):
        """{} (kept for callers of the owner-based ZeRO this replaced): every place holds
        its shard of every sharded var (``shard_layout``), and whole every other one."""
        return {}

    def shard_layout(self):
        """ZeRO's ``program.shard.ShardLayout`` of the full step (which parameters and
        state are sharded over which ranks), or None without ZeRO (or one rank)."""
        return self.program_for("layout")

    def gathered(self, name):
        """The whole value of the sharded parameter or state var ``name``, every rank's
        shard joined (ZeRO; a collective in a multi-process run: call it on every rank)."""
        layout = self.shard_layout()
        sp, shard = layout.sharded(name)
        shards = [s.find_var(shard) for s in self.local_scopes]
        if any(t is None for t in shards):
            raise SSAExecError(f"var {name!r}: its shard {shard!r} has no value on a place")
        outs = [torch.empty(layout.world * sp.shard_size, dtype=t.dtype, device=t.device)
                for t in shards]
        self._collective.all_gather(shards, outs, label=f"gather({name})")
        n = sp.numel
        return outs[0][:n].reshape(sp.shape).clone()

    def gathered_state(self):
        """``{name: full tensor}`` of every persistable the (unsharded) full-step program
        declares: a ZeRO shard's every rank joined, any other var as place 0 holds it.
        What ``write_back``, checkpoints' gathered export and fetches of sharded vars
        use. In a multi-process run, call it on every process (it gathers)."""
        layout = self.shard_layout()
        out = {}
        for var in self.program_for("plain").global_block().vars.values():
            if not var.persistable:
                continue
            if layout is not None and layout.sharded(var.name) is not None:
                out[var.name] = self.gathered(var.name)
                continue
            t = self.local_scopes[0].find_var(var.name)
            if t is not None:
                out[var.name] = t.detach().clone()
        return out

    def _step_programs(self):
        """The programs a step may run: the full step's and, with gradient accumulation,
        the micro-batches'."""
        acc = self.program_for("accumulate")
        return (self.run_program,) if acc is None else (self.run_program, acc)

    def _runner(self, fetch, phase="apply"):
        # observed steps take the readable path; the user's strategy object stays as given
        return self._runners.runner(fetch, phase, self.program_for, self.local_scopes,
                                    self._collective, readable=self._observing)

    def _phase(self):
        # gradient accumulation: every K-th run all-reduces and applies
        k = self.build_strategy.gradient_accumulation_steps
        return "apply" if k == 1 or self._micro_step % k == k - 1 else "accumulate"

    @property
    def runs(self):
        """Successful ``run`` calls so far (checkpoints keep it: gradient accumulation
        resumes at the same micro-batch)."""
        return self._micro_step

    @runs.setter
    def runs(self, n):
        self._micro_step = int(n)

    # --- variables on every place ---------------------------------------------------------
    def set_var(self, name, value):
        """Write ``value`` to var ``name`` on every place of this process.

        The places' scopes are the source of truth once the executor exists (place 0
        shares the scope it was given). An existing tensor of the same shape and dtype is
        overwritten in place, so captured CUDA graphs and aliases see the new value. In
        a multi-process run, call it on every process with the same value.
        """
        layout = self.shard_layout()
        sharded = layout.sharded(name) if layout is not None else None
        var = self.run_program.global_block().find_var(name)
        if sharded is not None:
            var = self.program_for("plain").global_block().find_var(name)
        dtype = torch_dtype(var.dtype) if var is not None else None
        value = torch.as_tensor(value, dtype=dtype)  # numbers and lists take the dtype
        if var is not None:
            check_value(var, value, SET_VAR, self.places[0].device, moves=True)
        if sharded is not None:  # ZeRO: each place its rank's slice
            sp, shard = sharded
            first = self.build_strategy.trainer_id * len(self.places)
            for i, (place, scope) in enumerate(zip(self.places, self.local_scopes,
                                                   strict=True)):
                part = layout.shard_of(value.reshape(-1), first + i, sp.shard_size)
                scope.set_var(shard, part.to(place.device))
            run_var = self.run_program.global_block().find_var(name)
            if run_var is None or not run_var.persistable:
                return  # stage 3's parameters, sharded state: the shards are all
        for place, scope in zip(self.places, self.local_scopes, strict=True):
            old = scope.vars.get(name)
            if old is not None and old.shape == value.shape and old.dtype == value.dtype:
                old.copy_(value)
            else:
                scope.set_var(name, value.to(place.device, copy=True))

    def get_var(self, name, place=0):
        """Var ``name`` on place number ``place`` (a copy); ``SSAExecError`` if unset."""
        if not 0 <= place < len(self.places):
            raise SSAExecError(f"place {place} does not exist: this executor has "
                               f"{len(self.places)} places")
        layout = self.shard_layout()
        if layout is not None and layout.sharded(name) is not None:
            return self.gathered(name)  # ZeRO: the full value (every place's alike)
        t = self.local_scopes[place].find_var(name)
        if t is None:
            raise SSAExecError(f"var {name!r} has no value on {self.places[place]}")
        return t.detach().clone()

    def get_lr(self):
        """The learning rate the last step used (place 0), as a float."""
        return float(self.get_var(learning_rate.lr_var(self.run_program)))

    def set_lr(self, value):
        """Set the learning rate on every place (a program without an LR schedule)."""
        self.set_var(learning_rate.settable_lr_var(self.run_program), float(value))

    def graph(self, fetch_list=None, phase="apply"):
        """The SSA graph used for ``fetch_list`` (built on first use); ``phase`` as in
        ``program_for``."""
        return self._runner(fetch_names(fetch_list), phase).graph

    @property
    def num_threads(self):
        """Threads the scheduler runs ops on (the caller included)."""
        return self._scheduler.num_threads

    @contextlib.contextmanager
    def observe(self, fetch_list, on_op, cuda_sync=False, nodes=False):
        """Call ``on_op`` around every op handle of the steps run inside the block.

        ``on_op(handle, thread_ident, start_ns, end_ns)`` is called once per op
        handle per step (``time.perf_counter_ns`` clock), from the thread that ran
        it. Observed steps run on the readable per-op path (one function per op
        handle), whatever ``ExecutionStrategy.compiled`` says. ``cuda_sync``
        synchronises an op's devices before its end time (accurate, serialising).
        Yields the SSA graph whose handles ``on_op`` receives (with gradient
        accumulation, the full step's; micro-batches that only accumulate report the
        handles of ``graph(fetch_list, "accumulate")``).

        With ``nodes``, the steps run on the path the strategy chose, and ``on_op`` is
        called once per node of the runner's node graph (``runtime.node_graph``: a
        compiled segment is one node, whose ``handles`` are its ops); yields that
        ``NodeGraph`` (its ``graph`` is the SSA graph).
        """
        fetch = fetch_names(fetch_list)
        observing, self._observing = self._observing, not nodes
        try:
            phases = ["apply"] + (["accumulate"] if self.program_for("accumulate") else [])
            runners = [self._runner(fetch, phase) for phase in phases]
            with instrumented(runners, on_op, cuda_sync, nodes):
                yield runners[0].node_graph if nodes else runners[0].graph
        finally:
            self._observing = observing

    # --- running ------------------------------------------------------------------------
    def run(self, fetch_list=None, feed=None, return_merged=True,
            allow_persistable_feed=False):
        """Run one step on every place.

        Parameters
        ----------
        fetch_list : list of str or VarDesc, optional
            Vars to fetch (default: none).
        feed : dict or list of dict
            Whole-batch feed (split across places; every split data var must
            have the same batch size) or one feed per place.
        return_merged : bool
            Merge per-place values (see the module docstring) or return lists.
        allow_persistable_feed : bool
            Allow feeding persistable vars (parameters, optimizer state): each
            place gets its own copy. Otherwise that is a ``FeedError``.

        A step that fails changes nothing: no place keeps its updates, and its
        feed is forgotten (the next run must feed again).

        Returns
        -------
        list
            One entry per fetched var.
        """
        with hold():  # Ctrl-C stops the step cleanly (runtime.interrupt)
            return self._run_step(fetch_list, feed, return_merged, allow_persistable_feed)

    def _run_step(self, fetch_list, feed, return_merged, allow_persistable_feed):
        if self._scheduler.closed:
            raise SSAExecError("this ParallelExecutor is closed")
        self._group.check()
        lent = () if self._lender is None else \
            shared_vars.borrowed(self._lender, self.program)
        if not lent:
            return self._run_fetching(fetch_list, feed, return_merged, allow_persistable_feed)
        shared_vars.lend(self._lender, lent, self.local_scopes, self.places)
        try:
            return self._run_fetching(fetch_list, feed, return_merged, allow_persistable_feed)
        finally:
            shared_vars.give_back(self.local_scopes, lent)

    def _run_fetching(self, fetch_list, feed, return_merged, allow_persistable_feed):
        fetch = fetch_names(fetch_list)
        gathered = self._gathered_fetches(fetch)
        runner = self._runner(tuple(n for n in fetch if n not in gathered), self._phase())
        # random ops seed from the executor's run count, whatever runner runs the step, so
        # a checkpoint's ``runs`` restores the masks of the steps after it (runtime.rng)
        runner.step[0] = self._micro_step
        per_place = place_feeds(self.program, feed, len(self.places), allow_persistable_feed)
        self._entry.before(self._step_programs(), self.local_scopes, self.places,
                           set().union(*per_place))
        replaced = []

        def bind(parts):
            replaced.extend(bind_feeds(self.local_scopes, self.places, parts,
                                       self._programs.data_read(self.program)))
        graphs = self._cuda_graphs.of(runner, self.run_program, self.exec_strategy,
                                      self._graph_capture) \
            if self.exec_strategy.cuda_graph else None
        if graphs is None:
            bind(per_place)
        ok = False
        try:
            if self.distributed:
                fetched = self._group.run(runner, self.exec_strategy.sync, self.runs + 1)
            elif graphs is not None:
                fetched = graphs.run(per_place, bind, self.exec_strategy.sync)
            else:
                probe = self._probes.before(runner, self.exec_strategy.num_threads)
                if probe is None:
                    fetched = runner.run(self.exec_strategy.sync)
                else:  # wall and CPU time of a probed step (places_rule)
                    t0, c0 = time.perf_counter(), time.process_time()
                    fetched = runner.run(self.exec_strategy.sync)
                    probe.record(runner, time.perf_counter() - t0, time.process_time() - c0)
            ok = True
        except BaseException:
            forget_feeds(self.program, self.local_scopes, per_place, replaced)
            raise
        finally:
            self._entry.after(self.local_scopes, ok)
        self._micro_step += 1
        for name in gathered:  # ZeRO: a sharded var is fetched joined, after the step
            fetched[name] = [self.gathered(name)] * len(self.places)
        if self._shadowing is not None:
            shared_vars.unshadow(self.local_scopes, self._shadowing)
        if not return_merged:
            return [fetched[name] for name in fetch]
        block = self.program_for("plain").global_block()
        return [merge_fetched(block.find_var(name), fetched[name]) for name in fetch]

    def _gathered_fetches(self, fetch):
        # ZeRO: fetched vars that no place holds whole (stage 3's parameters, sharded
        # optimizer state): joined from their shards after the step
        layout = self.shard_layout()
        if layout is None:
            return ()
        block = self.run_program.global_block()
        grads = {sp.grad for sp in layout} if layout.stage >= 2 else ()
        out = []
        for name in fetch:
            if name in grads:
                raise SSAExecError(
                    f"cannot fetch {name!r} under zero_stage={layout.stage}: each place "
                    "frees the whole gradient after its reduce-scatter and keeps its "
                    f"slice of the sum only (fetch {name + '@SHARD'!r}, per place with "
                    "return_merged=False)")
            if layout.sharded(name) is not None:
                var = block.find_var(name)
                if var is None or not var.persistable:
                    out.append(name)
        return tuple(out)

    def cuda_graph_status(self, fetch_list=None):
        """Captured CUDA graphs for ``fetch_list``: ``{"captured", "replays", "cached",
        "fallback"}`` (``fallback`` names why steps run without graphs), or None when
        ``ExecutionStrategy(cuda_graph=True)`` is off or no step ran yet."""
        runner = self._runners.find(fetch_names(fetch_list), "apply", self._observing)
        return self._cuda_graphs.status(runner)

    # --- teardown -----------------------------------------------------------------------
    def close(self):
        """Join every worker thread, close the collective's communicators (NCCL's, once no
        op can use them) and restore torch's thread count (idempotent)."""
        self._scheduler.close()
        self._runners.close()
        if self._collective is not None:
            self._collective.close()
        self._threads.restore()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _shutdown(scheduler, runners):
    # the garbage collector runs this: stop the workers, never wait for them here, and
    # skip the runners' background compiles (compiler="auto")
    scheduler.close(wait=False)
    runners.close()
