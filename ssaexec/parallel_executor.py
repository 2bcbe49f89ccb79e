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
spans places and processes (``runtime.dist_collective``). Feeds and fetches
are this process's own. If a step fails on this rank, the group is aborted so
the other ranks raise ``DistributedError`` at once, and this executor refuses
further runs. ``distributed=False`` keeps an executor local (evaluation on one
rank, say).

Threads. CPU places share the host's cores, so while several CPU places run,
torch's intra-op threads are set to ``cores // places`` (at least 1; override
with ``ExecutionStrategy(torch_threads=...)``) and restored by ``close()``; in a
multi-process run the cores are divided among the machine's processes too.

Values from outside. Before the persistables are broadcast, those the program reads
before writing are checked against its declarations (``runtime.boundary``: the error
names the startup program's op that wrote a misfit); ``set_var`` checks its value the
same way; and a step checks what it reads from the places' scopes only when someone
wrote them since this executor's last step (``Scope.set_var``, another executor).

Observing. ``observe()`` runs the observed steps on the readable per-op path by
choosing that runner itself (``_observing``); it never writes the caller's
``ExecutionStrategy``, which other executors and threads may share.

Size: the executor's public surface (set-up, variables, running, observing) is one
class; its parts live beside it: ``step_programs`` (the per-phase programs),
``observe`` (the per-op instrumentation), ``threading_probe`` (pool or caller's thread),
``process_group_setup`` (joining a multi-process run), and the policies it applies in
``feed``, ``program.amp``/``accumulate``, ``runtime.*`` and ``checkpoint``.
"""

import contextlib
import copy
import time
import weakref

import torch

from . import distributed as _distributed, faults
from .errors import DistributedError, SSAExecError
from .executor import Executor, fetch_names
from .feed import bind_feeds, forget_feeds, place_feeds
from .graph.build import build_ssa_graph, grad_owners
from .observe import instrumented
from .process_group_setup import agree_and_broadcast, process_group_collective
from .program.desc import Program
from .runtime.boundary import SET_VAR, EntryCheck, check_value, entering_vars, \
    startup_source
from .runtime.compiled import CompiledRunner
from .runtime.graph_runner import GraphRunner
from .runtime.inductor import InductorLowering, check_compiler
from .runtime.runner import Runner
from .dtypes import torch_dtype
from .place import available_cores, cpu_places, cuda_places
from .runtime.scheduler import Scheduler, default_threads
from .runtime.interrupt import hold
from .runtime.parallel_block import run_places
from .runtime.scope import Scope, global_scope
from .step_programs import StepPrograms
from .strategy import BuildStrategy, ExecutionStrategy
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
            from .program.builder import default_main_program
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
        self.build_strategy = build_strategy or BuildStrategy()
        self.exec_strategy = exec_strategy or ExecutionStrategy()
        self.scope = scope if scope is not None else global_scope()
        self._failed = None
        self._collective = None  # the local or cross-process collective, chosen below
        dist_collective = self._distributed_setup(distributed)
        if self.exec_strategy.cuda_graph:
            from .runtime.cuda_graph import check_places
            check_places(self.places, dist_collective is not None)
        check_compiler(self.exec_strategy.compiler, self.places)
        n = len(self.places)
        threads = self.exec_strategy.num_threads or default_threads(n)
        self._scheduler = Scheduler(threads, name="ssaexec")
        if dist_collective is None:
            from .runtime.nccl import choose_local_collective
            self._collective, _, self.collective_backend = choose_local_collective(self.places)
        else:
            self._collective = dist_collective
            self.collective_backend = "collective backend: torch.distributed process group " \
                f"({_distributed.info().backend})"
        self.distributed = dist_collective is not None
        self._runners = {}
        self._step_graphs = {}  # id(runner) -> runtime.cuda_graph.StepGraphs
        # makes each StepGraphs' capture mechanism (None: CUDA graphs); tests set a CPU one
        self._graph_capture = None
        self._shadowing = None  # share_vars_from: persistable names a step may shadow
        self._micro_step = 0  # runs so far (gradient accumulation picks the phase from it)
        self._probes = ThreadingProbes(self.places)
        self._programs = StepPrograms()
        self._entry = EntryCheck()  # what steps read from the places' scopes (boundary)
        self._observing = False  # observe(): steps run the readable path (see observe)
        self._device_contexts = None
        self._prev_torch_threads = None
        self._set_torch_threads()
        self._finalizer = weakref.finalize(self, _shutdown, self._scheduler)
        try:
            if share_vars_from is not None:
                self._share_vars(share_vars_from)
                return
            if startup_program is not None:
                Executor(self.places[0]).run(startup_program, scope=self.scope)
            self._init_state()
            self.local_scopes = [Scope() for _ in self.places]
            if self.distributed:
                self._sync_processes()
            self._broadcast_persistables(startup_program)
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
        return self._programs.program_for(self.program, phase, self.exec_strategy,
                                          self.build_strategy.gradient_accumulation_steps)

    def _init_state(self):
        # state the executor adds to a program starts at its defaults unless the scope has
        # it: fp16 loss scaling, gradient accumulators (zeros)
        from .program.accumulate import accumulators
        from .program.amp import LOSS_SCALE_STATE
        program = self.run_program
        block = program.global_block()
        for name, (dtype, value) in LOSS_SCALE_STATE.items():
            if block.find_var(name) is not None and self.scope.find_var(name) is None:
                self.scope.set_var(name, torch.tensor(value, dtype=torch_dtype(dtype)))
        for name, grad in accumulators(program).items():
            if self.scope.find_var(name) is None:
                if grad.shape is None or any(d < 0 for d in grad.shape):
                    raise SSAExecError(f"gradient {grad.name!r} has shape {grad.shape}: an "
                                       "accumulator needs a fixed shape")
                self.scope.set_var(name, torch.zeros(grad.shape,
                                                     dtype=torch_dtype(grad.dtype)))

    def _share_vars(self, other):
        if not isinstance(other, ParallelExecutor):
            raise SSAExecError(f"share_vars_from must be a ParallelExecutor, got "
                               f"{type(other).__name__}")
        if list(other.places) != list(self.places):
            here, there = ", ".join(map(str, self.places)), ", ".join(map(str, other.places))
            raise SSAExecError(f"share_vars_from: the places differ ({here} here, {there} "
                               "there); an executor can only share the values of its own "
                               "places")
        self.local_scopes = [s.new_scope() for s in other.local_scopes]
        self._shadowing = frozenset(v.name for b in self.program.blocks
                                    for v in b.vars.values() if v.persistable)

    def _set_torch_threads(self):
        cpu = [p for p in self.places if not p.is_cuda]
        want = self.exec_strategy.torch_threads
        # the cores are shared by this machine's processes too (torchrun's LOCAL_WORLD_SIZE)
        share = len(cpu) * (_distributed.local_world_size() if self.distributed else 1)
        if want is None and share > 1:
            want = max(1, available_cores() // share)
        if want is not None and want != torch.get_num_threads():
            self._prev_torch_threads = torch.get_num_threads()
            torch.set_num_threads(want)

    def _distributed_setup(self, distributed):
        """The cross-process collective, or None for a local executor; fixes the strategy."""
        self.build_strategy, coll = process_group_collective(self.build_strategy, distributed)
        return coll

    def _sync_processes(self):
        agree_and_broadcast(self._collective, self.build_strategy, self.places,
                            self.run_program, self.scope)

    def state_owners(self):
        """ZeRO (``BuildStrategy(zero_stage=1|2)``): ``{optimizer state var: owner place
        index}`` for the state only its parameter's owner place keeps; {} otherwise."""
        if not self.build_strategy.zero_stage or len(self.places) == 1:
            return {}
        program = self.run_program
        block = program.global_block()
        owners = grad_owners(program, [pair for op in block.ops if op.role == "backward"
                                       for pair in op.role_var], len(self.places))
        users = {}  # persistable -> parameters whose update reads it (None: other readers)
        for op in block.ops:
            param = op.role_var[0][0] if op.role == "optimize" and op.role_var else None
            for n in op.input_names():
                var = block.find_var(n)
                if var is None or not var.persistable or var.is_parameter:
                    continue
                users.setdefault(n, set()).add(param)
        return {n: owners[next(iter(ps))] for n, ps in users.items()
                if len(ps) == 1 and None not in ps and next(iter(ps)) in owners}

    def _step_programs(self):
        """The programs a step may run: the full step's and, with gradient accumulation,
        the micro-batches'."""
        acc = self.program_for("accumulate")
        return (self.run_program,) if acc is None else (self.run_program, acc)

    def _broadcast_persistables(self, startup):
        programs = self._step_programs()
        block = programs[0].global_block()
        owned = self.state_owners()
        # the startup program's values, checked once, before any place holds them
        entering = {v.name for p in programs for v in entering_vars(p)}
        device = self.places[0].device
        for var in block.vars.values():
            if not var.persistable:
                continue
            src = self.scope.find_var(var.name)
            if src is None:
                if var.is_parameter:
                    raise SSAExecError(f"parameter {var.name!r} has no value in the scope: run "
                                       "the startup program first or pass startup_program=")
                continue
            if var.name in entering:
                check_value(var, src, startup_source(startup, var.name), device, moves=True)
            for i, (place, ls) in enumerate(zip(self.places, self.local_scopes, strict=True)):
                if owned.get(var.name, i) != i:
                    continue  # ZeRO: another place owns this optimizer state
                if i == 0 and src.device == place.device:
                    ls.set_var(var.name, src)  # place 0 shares the user's scope
                else:
                    ls.set_var(var.name, src.detach().to(place.device, copy=True))
        self._entry.trust(programs, self.local_scopes)

    def _contexts(self):
        """One ``DeviceContext`` (compute/comm/fetch streams) per CUDA place, None for CPU."""
        if self._device_contexts is None:
            if any(p.is_cuda for p in self.places):
                from .runtime.streams import DeviceContext
                self._device_contexts = [DeviceContext(p) if p.is_cuda else None
                                         for p in self.places]
            else:
                self._device_contexts = [None] * len(self.places)
        return self._device_contexts

    def _compiled(self):
        # observed steps take the readable path; the user's strategy object stays as given
        return self.exec_strategy.compiled and not self._observing

    def _runner_key(self, fetch, phase):
        """The cache key of the runner of ``fetch`` in ``phase``: what makes runners differ."""
        compiled = self._compiled()
        compiler = self.exec_strategy.compiler if compiled else None
        return (fetch, compiled, self.exec_strategy.amp, phase, compiler)

    def _runner(self, fetch, phase="apply"):
        key = self._runner_key(fetch, phase)
        _, compiled, _, _, compiler = key
        runner = self._runners.get(key)
        if runner is None:
            build = self.build_strategy
            if compiler is not None and build.fuse_all_reduce_ops is None:
                # compiled segments: buckets by default (BuildStrategy.fuse_all_reduce_ops)
                build = copy.copy(build)
                build.fuse_all_reduce_ops = True
            graph = build_ssa_graph(self.program_for(phase), self.places, build, list(fetch))
            graph.lint()
            if compiler == "inductor":
                runner = Runner(graph, self.local_scopes, self._collective, self._scheduler,
                                InductorLowering(), self._contexts(), self.exec_strategy.sync,
                                run_places)
            else:
                kind = CompiledRunner if compiled else GraphRunner
                runner = kind(graph, self.local_scopes, self._collective, self._scheduler,
                              self._contexts(), self.exec_strategy.sync, run_places=run_places)
            self._runners[key] = runner
        return runner

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
        var = self.run_program.global_block().find_var(name)
        dtype = torch_dtype(var.dtype) if var is not None else None
        value = torch.as_tensor(value, dtype=dtype)  # numbers and lists take the dtype
        if var is not None:
            check_value(var, value, SET_VAR, self.places[0].device, moves=True)
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
        t = self.local_scopes[place].find_var(name)
        if t is None:
            raise SSAExecError(f"var {name!r} has no value on {self.places[place]}")
        return t.detach().clone()

    def _lr_var(self):
        block = self.run_program.global_block()
        names = sorted({op.input("LearningRate")[0] for op in block.ops
                        if op.role == "optimize" and op.input("LearningRate")})
        if len(names) != 1:
            raise SSAExecError(f"the program has {len(names)} learning-rate vars ({names}); "
                               "use set_var/get_var with the one you mean")
        return names[0]

    def get_lr(self):
        """The learning rate the last step used (place 0), as a float."""
        return float(self.get_var(self._lr_var()))

    def set_lr(self, value):
        """Set the learning rate on every place (a program without an LR schedule)."""
        name = self._lr_var()
        block = self.run_program.global_block()
        if any(op.type == "lr_schedule" and op.output("LearningRate") == [name]
               for op in block.ops):
            raise SSAExecError(f"{name!r} is computed by an LR schedule each step; set_lr "
                               "would be overwritten. Build the optimizer with a number "
                               "to control the rate by hand")
        self.set_var(name, float(value))

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
        if self._failed is not None:
            raise DistributedError(f"an earlier step of this multi-process run failed "
                                   f"({self._failed}); the process group was shut down: "
                                   "restart every process")
        fetch = fetch_names(fetch_list)
        runner = self._runner(fetch, self._phase())
        # random ops seed from the executor's run count, whatever runner runs the step, so
        # a checkpoint's ``runs`` restores the masks of the steps after it (runtime.rng)
        runner.step[0] = self._micro_step
        per_place = place_feeds(self.program, feed, len(self.places), allow_persistable_feed)
        self._entry.before(self._step_programs(), self.local_scopes, self.places,
                           set().union(*per_place))
        replaced = []

        def bind(parts):
            replaced.extend(bind_feeds(self.local_scopes, self.places, parts,
                                       self._data_read()))
        graphs = self._graphs_of(runner) if self.exec_strategy.cuda_graph else None
        if graphs is None:
            bind(per_place)
        ok = False
        try:
            if self.distributed:
                fetched = self._run_distributed(runner)
            elif graphs is not None:
                fetched = graphs.run(per_place, bind, self.exec_strategy.sync)
            else:
                probe = self._probes.before(runner, self.exec_strategy.num_threads)
                t0 = time.perf_counter()
                fetched = runner.run(self.exec_strategy.sync)
                if probe is not None:
                    probe.record(runner, time.perf_counter() - t0)
            ok = True
        except BaseException:
            forget_feeds(self.program, self.local_scopes, per_place, replaced)
            raise
        finally:
            self._entry.after(self.local_scopes, ok)
        self._micro_step += 1
        if self._shadowing is not None:
            self._unshadow()
        return [self._merge(name, fetched[name]) if return_merged else fetched[name]
                for name in fetch]

    def _unshadow(self):
        # share_vars_from: a persistable of the other executor that this step rebound (an
        # evaluation batch norm returns its running statistics, unchanged) would hide that
        # executor's later values from every later step here; drop the step's binding
        for scope in self.local_scopes:
            for name in [n for n in scope.vars if n in self._shadowing]:
                if scope.parent is not None and scope.parent.find_var(name) is not None:
                    del scope.vars[name]

    def _graphs_of(self, runner):
        graphs = self._step_graphs.get(id(runner))
        if graphs is None:
            from .runtime.cuda_graph import StepGraphs
            st = self.exec_strategy
            persist = [v.name for v in self.run_program.global_block().vars.values()
                       if v.persistable]
            graphs = self._step_graphs[id(runner)] = StepGraphs(
                runner, persist, st.cuda_graph_warmup, st.cuda_graph_cache,
                self._graph_capture() if self._graph_capture is not None else None)
        return graphs

    def cuda_graph_status(self, fetch_list=None):
        """Captured CUDA graphs for ``fetch_list``: ``{"captured", "replays", "cached",
        "fallback"}`` (``fallback`` names why steps run without graphs), or None when
        ``ExecutionStrategy(cuda_graph=True)`` is off or no step ran yet."""
        runner = self._runners.get(self._runner_key(fetch_names(fetch_list), "apply"))
        graphs = self._step_graphs.get(id(runner)) if runner is not None else None
        return graphs.status() if graphs is not None else None

    def _data_read(self):
        return self._programs.data_read(self.program)

    def _run_distributed(self, runner):
        faults.arm(self.runs + 1)  # SSAEXEC_FAULT's kill@step: this step's first collective
        try:
            return runner.run(self.exec_strategy.sync)
        except BaseException as e:
            if getattr(e, "group_intact", False):
                raise  # the debug check: every rank raised it, before any collective
            # this rank stopped mid-step: the others wait in a collective it will never
            # issue, so drop the group's connections and let them fail now
            self._fail(e)
            raise

    def _fail(self, e):
        self._failed = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        _distributed.abort(f"rank {_distributed.rank()}: {self._failed}")

    def _merge(self, name, values):
        var = self.run_program.global_block().find_var(name)
        shape = var.shape if var is not None else None
        if len(values) == 1:
            return values[0]
        if shape is not None and len(shape) > 0 and shape[0] == -1:
            return torch.cat(values, dim=0)
        if values[0].numel() == 1 and (shape is None or len(shape) <= 1):
            stacked = torch.stack([v.reshape(()) for v in values])
            if not stacked.is_floating_point():
                return stacked
            return stacked.mean().reshape(values[0].shape)
        return values[0]

    # --- teardown -----------------------------------------------------------------------
    def close(self):
        """Join every worker thread, close the collective's communicators (NCCL's, once no
        op can use them) and restore torch's thread count (idempotent)."""
        self._scheduler.close()
        if self._collective is not None:
            self._collective.close()
        if self._prev_torch_threads is not None:
            torch.set_num_threads(self._prev_torch_threads)
            self._prev_torch_threads = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _shutdown(scheduler):
    # the garbage collector runs this: stop the workers, never wait for them here
    scheduler.close(wait=False)

