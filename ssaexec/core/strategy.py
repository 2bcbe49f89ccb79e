"""``BuildStrategy`` (how the SSA graph is built) and ``ExecutionStrategy`` (how it runs).

Plain attribute bags with validation, so a typo fails at construction instead
of silently doing the default.
"""

import copy
import os

from .errors import SSAExecError

__all__ = ["BuildStrategy", "ExecutionStrategy", "default_compiler"]

# ExecutionStrategy's compiler when none is named: the one switch of the default path.
# "auto": tiered (runtime.tiered): steps start at once on the straight-line path and switch
# to Inductor's graphs, compiled in the background, at a step boundary; where Inductor
# cannot run (no C++ compiler, no Triton, CUDA graph capture) it is the straight-line path,
# said on one line. The test suite runs with SSAEXEC_COMPILER=none (tests/conftest.py: a
# background compile in every test's executor would cost seconds of CPU each); make
# test-auto runs it with this default
DEFAULT_COMPILER = "auto"


def default_compiler():
    """The compiler of a strategy that names none (``compiler="default"``): the environment
    variable ``SSAEXEC_COMPILER`` where set ("none" for None), else ``DEFAULT_COMPILER``."""
    compiler = os.environ.get("SSAEXEC_COMPILER") or DEFAULT_COMPILER
    return None if compiler == "none" else compiler


def _check(name, value, allowed):
    if value not in allowed:
        raise SSAExecError(f"{name} must be one of {allowed}, got {value!r}")
    return value


class BuildStrategy:
    """How ``build_ssa_graph`` turns a program into a multi-place SSA graph.

    Parameters
    ----------
    reduce_strategy : {"all_reduce", "reduce"}
        ``all_reduce``: every place gets the summed gradient and runs the optimizer.
        ``reduce``: each gradient goes to one owner place (balanced by bytes), the
        optimizer runs there, and the parameter is broadcast back.
    gradient_scale_strategy : {"coeff_num_device", "one", "customized"}
        The seed of ``loss@GRAD``: 1/number of ranks (mean over the global batch),
        1 (sum), or fed by the user.
    debug_graphviz_path : str, optional
        Write the built graph's DOT text here, and the graph after each building pass
        (``graph.passes``) to ``PATH.<nn>_<pass>.dot`` (``ssaexec dump --passes``
        shows the same).
    enable_sequential_execution : bool
        Force program order on every place (debugging).
    fuse_all_reduce_ops : bool or None
        All-reduce gradients in buckets of about ``fuse_bucket_mb`` MiB. None (the
        default): buckets when the executor is one process of several, as DDP does
        (each bucket is one network call instead of one per gradient: 2.2x the
        images/sec of 2 gloo processes on docs/benchmarks.md's quick ResNet-18), one
        all-reduce per gradient in one process (``fuses_all_reduce()``). Under
        ``ExecutionStrategy(compiler=...)``, None means buckets in one process too:
        only a bucket's last gradient cuts a segment (``runtime.node_graph``), so each
        place compiles a few large graphs rather than one per gradient.
    num_trainers, trainer_id : int
        Processes in a multi-process run and this one's rank.
    debug_distributed : bool
        Before each step's first collective, check that all ranks agree on the
        sequence of collectives (also ``SSAEXEC_DISTRIBUTED_DEBUG=1``).
    gradient_accumulation_steps : int
        Each ``run`` is one micro-batch; gradients are accumulated locally and
        all-reduced and applied once every this many runs, with no communication on
        the others (``ssaexec.program.accumulate``).
    allreduce_dtype : {None, "bf16", "fp16"}
        Compress floating gradients to this type for the all-reduce and back (as DDP's
        ``bf16_compress_hook``); fused buckets count the compressed bytes.
    zero_stage : {0, 1, 2, 3}
        Sharded data parallelism (ZeRO, ``program.shard``): each parameter updated by an
        elementwise optimizer (sgd, momentum, adam/adamw) is flattened and split evenly
        over the W ranks (places x processes); rank g keeps ``p@SHARD``, its slice.
        Stage 1: the optimizer state is sharded (gradients are reduce-scattered, each
        rank updates its slice, then the parameter is all-gathered). Stage 2: the full
        gradient is also freed right after its reduce-scatter. Stage 3: the parameters
        too: all-gathered before their first use in forward and in backward, freed
        after their last. 0: every place holds everything (plain all-reduce).
    reshard_after_forward : bool
        Stage 3 (FSDP2's name): True (default) frees a parameter after its last reader
        in forward and gathers it again for backward (least memory); False keeps it
        from forward to the end of backward (one gather a step fewer).
    zero_prefetch : int
        Stage 3: how many parameter groups (a layer's parameters, gathered by one
        call: ``program.shard.layer_of``) may be gathered ahead of the compute that
        reads them; the gather of group k waits for the first reader of group
        k-1-zero_prefetch (a ``prefetch`` dummy edge). Bounds the gathered memory.
    zero_gather_dtype : {None, "bf16", "fp16"}
        All-gather floating parameters in this type (half the bytes) and cast back;
        None: in their own type. Gradients are reduce-scattered in their own type
        (or ``allreduce_dtype``).
    async_allreduce : bool
        Multi-process runs: start each cross-process all-reduce and go on, completing
        it in a separate wait handle that only its readers wait for, so several are in
        flight while backward runs (``graph.ssa.AllReduceWaitOpHandle``).
    sparse_gradients : bool
        True (default): an embedding declared ``is_sparse`` gets a sparse gradient (the
        rows its batch touched), merged across places by gathering rows and values and
        applied by row updates (``ops.sparse``). False: the dense fallback, a dense
        gradient all-reduced (and bucketed) like any other.
    """

    __slots__ = ("reduce_strategy", "gradient_scale_strategy", "debug_graphviz_path",
                 "enable_sequential_execution", "fuse_all_reduce_ops", "fuse_bucket_mb",
                 "num_trainers", "trainer_id", "debug_distributed",
                 "gradient_accumulation_steps", "allreduce_dtype", "zero_stage",
                 "async_allreduce", "sparse_gradients", "reshard_after_forward",
                 "zero_prefetch", "zero_gather_dtype")

    def __init__(self, reduce_strategy="all_reduce", gradient_scale_strategy="coeff_num_device",
                 debug_graphviz_path=None, enable_sequential_execution=False,
                 fuse_all_reduce_ops=None, fuse_bucket_mb=25.0, num_trainers=1, trainer_id=0,
                 debug_distributed=False, gradient_accumulation_steps=1,
                 allreduce_dtype=None, zero_stage=0, async_allreduce=True,
                 sparse_gradients=True, reshard_after_forward=True, zero_prefetch=1,
                 zero_gather_dtype=None):
        self.reduce_strategy = _check("reduce_strategy", reduce_strategy,
                                      ("all_reduce", "reduce"))
        self.gradient_scale_strategy = _check("gradient_scale_strategy", gradient_scale_strategy,
                                              ("coeff_num_device", "one", "customized"))
        self.debug_graphviz_path = debug_graphviz_path
        self.enable_sequential_execution = bool(enable_sequential_execution)
        self.fuse_all_reduce_ops = None if fuse_all_reduce_ops is None else \
            bool(fuse_all_reduce_ops)
        if fuse_bucket_mb <= 0:
            raise SSAExecError(f"fuse_bucket_mb must be positive, got {fuse_bucket_mb}")
        self.fuse_bucket_mb = float(fuse_bucket_mb)
        if num_trainers < 1 or not 0 <= trainer_id < num_trainers:
            raise SSAExecError(f"need num_trainers >= 1 and 0 <= trainer_id < num_trainers, got "
                               f"{num_trainers}, {trainer_id}")
        self.num_trainers = int(num_trainers)
        self.trainer_id = int(trainer_id)
        self.debug_distributed = bool(debug_distributed)
        if int(gradient_accumulation_steps) != gradient_accumulation_steps or \
                gradient_accumulation_steps < 1:
            raise SSAExecError(f"gradient_accumulation_steps must be an integer >= 1, got "
                               f"{gradient_accumulation_steps!r}")
        self.gradient_accumulation_steps = int(gradient_accumulation_steps)
        self.allreduce_dtype = _check("allreduce_dtype", allreduce_dtype, (None, "bf16", "fp16"))
        self.zero_stage = _check("zero_stage", zero_stage, (0, 1, 2, 3))
        self.async_allreduce = bool(async_allreduce)
        self.sparse_gradients = bool(sparse_gradients)
        if not isinstance(reshard_after_forward, bool):
            raise SSAExecError(f"reshard_after_forward must be True or False, got "
                               f"{reshard_after_forward!r}")
        self.reshard_after_forward = reshard_after_forward
        if isinstance(zero_prefetch, bool) or not isinstance(zero_prefetch, int) or \
                zero_prefetch < 0:
            raise SSAExecError(f"zero_prefetch must be an integer >= 0, got {zero_prefetch!r}")
        self.zero_prefetch = zero_prefetch
        self.zero_gather_dtype = _check("zero_gather_dtype", zero_gather_dtype,
                                        (None, "bf16", "fp16"))
        if zero_stage and reduce_strategy == "reduce":
            raise SSAExecError(f"zero_stage={zero_stage} shards gradients by reduce-scatter, "
                               "which contradicts reduce_strategy='reduce' (the owner-and-"
                               "broadcast graph); use one or the other")

    def fuses_all_reduce(self, compiler=None):
        """Whether gradients are all-reduced in buckets: ``fuse_all_reduce_ops`` when set,
        else whether this is one process of several (``num_trainers > 1``) or the steps
        run compiled segments (``ExecutionStrategy(compiler=...)``). The one place that
        decides the bucketing default."""
        if self.fuse_all_reduce_ops is None:
            return self.num_trainers > 1 or compiler is not None
        return self.fuse_all_reduce_ops

    def for_compiler(self, compiler):
        """The strategy a graph for ``ExecutionStrategy(compiler=compiler)`` is built with:
        this one, or, when the compiler changes the bucketing default, a copy with
        ``fuse_all_reduce_ops`` written out (the graph builder knows no compiler; the
        caller's object is never written)."""
        if self.fuse_all_reduce_ops is not None or compiler is None:
            return self
        out = copy.copy(self)
        out.fuse_all_reduce_ops = self.fuses_all_reduce(compiler)
        return out

    def key(self):
        """A hashable summary (graphs are cached by it)."""
        return tuple(getattr(self, s) for s in self.__slots__)

    def __repr__(self):
        return "BuildStrategy(" + ", ".join(f"{s}={getattr(self, s)!r}"
                                            for s in self.__slots__) + ")"


class ExecutionStrategy:
    """How the scheduler runs a graph.

    Parameters
    ----------
    num_threads : int
        Worker threads; 1 runs everything in the calling thread (debugging).
        Default: number of places + 1, at most 8; with several CPU places the
        executor also times its first steps run by the pool and run in the
        calling thread alone (places share the GIL: with tiny kernels threads
        mostly trade it back and forth) and keeps the faster way. Results are
        bit-identical either way.
    sync : {"event", "wait"}
        CUDA only: cross-stream edges wait on events (non-blocking) or synchronise
        the producer's stream (easy to debug). Switchable between runs.
    amp : {None, "bf16", "fp16"}
        Mixed precision (``ssaexec.program.amp``): matrix products and convolutions in
        the low type, reductions, softmax, norms and losses in fp32, parameters and
        optimizer state fp32; fp16 adds dynamic loss scaling. Works on CPU places too.
    amp_allreduce : {"fp32", "low"}
        The type parameter gradients are all-reduced in under ``amp``.
    cuda_graph : bool
        CUDA places on one device: after ``cuda_graph_warmup`` steps, capture the whole
        step as one CUDA graph and replay it (``runtime.cuda_graph``); refused on CPU.
    cuda_graph_warmup : int
        Steps run normally before the capture (lazy initialisation, allocator warm-up).
    cuda_graph_cache : int
        Captured graphs kept, one per feed shape (least recently used goes first).
    torch_threads : int, optional
        torch intra-op threads per place; default: cores // places (at least 1).
    compiled : bool
        True (default): lower the graph once to prepared calls, straight-line code
        per segment (``runtime.compiled``). False: the readable path, one
        ``OpCall`` per op handle through the scheduler (per-op traces use it).
    compiler : {"default", None, "inductor", "auto"}
        With ``compiled``: None runs each segment's generated code; "inductor"
        compiles each segment with Inductor before its steps run on it
        (``runtime.inductor``; one place in one process: the whole step as one
        graph); "auto" runs the generated code at once, compiles the segments in the
        background and switches to them at a step boundary (``runtime.tiered``). A
        segment Inductor cannot compile runs its generated code, with one line saying
        why. "default" is ``DEFAULT_COMPILER``, "auto" (where Inductor cannot run,
        no C++ compiler or Triton, CUDA graphs, "auto" is the compiled path, said on
        one line). The environment variable ``SSAEXEC_COMPILER`` ("inductor", "auto"
        or "none"), when set, replaces "default" and None (``make test-inductor`` and
        ``make test-auto`` run the suite so; the test suite sets "none").
    """

    __slots__ = ("num_threads", "sync", "amp", "torch_threads", "compiled", "amp_allreduce",
                 "cuda_graph", "cuda_graph_warmup", "cuda_graph_cache", "compiler")

    def __init__(self, num_threads=None, sync="event", amp=None, torch_threads=None,
                 compiled=True, amp_allreduce="fp32", cuda_graph=False, cuda_graph_warmup=2,
                 cuda_graph_cache=4, compiler="default"):
        if num_threads is not None and num_threads < 1:
            raise SSAExecError(f"num_threads must be >= 1, got {num_threads}")
        self.num_threads = num_threads
        self.sync = _check("sync", sync, ("event", "wait"))
        self.amp = _check("amp", amp, (None, "bf16", "fp16"))
        self.amp_allreduce = _check("amp_allreduce", amp_allreduce, ("fp32", "low"))
        self.torch_threads = torch_threads
        self.compiled = bool(compiled)
        if compiler == "default":
            compiler = default_compiler()
        elif compiler is None:  # make test-inductor: every strategy compiles
            compiler = os.environ.get("SSAEXEC_COMPILER") or None
        if compiler == "none":  # the environment's way to say None
            compiler = None
        self.compiler = _check("compiler", compiler, (None, "inductor", "auto"))
        self.cuda_graph = bool(cuda_graph)
        if cuda_graph_warmup < 1 or cuda_graph_cache < 1:
            raise SSAExecError(f"cuda_graph_warmup and cuda_graph_cache must be >= 1, got "
                               f"{cuda_graph_warmup} and {cuda_graph_cache}")
        self.cuda_graph_warmup = int(cuda_graph_warmup)
        self.cuda_graph_cache = int(cuda_graph_cache)

    def __repr__(self):
        return "ExecutionStrategy(" + ", ".join(f"{s}={getattr(self, s)!r}"
                                                for s in self.__slots__) + ")"
