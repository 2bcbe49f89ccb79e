"""Per-device memory of a data-parallel step under ZeRO stage 0-3: one formula, one walk.

Used by ``ssaexec stats --zero N`` and by the simulator's report (``predict``): the
numbers come from here and nowhere else.

The model (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion
Parameter Models", SC 2020, section 5; the sharding rule of ``program.shard``: each
parameter flattened and split evenly over the ``W`` ranks, ``ceil(n / W)`` elements a
rank, zero-padded):

* ``zero_bytes`` is the paper's formula for one parameter of ``n`` elements: a rank
  holds the full parameter below stage 3 and its shard from stage 3, the full gradient
  below stage 2 and its shard from stage 2, the full optimizer state at stage 0 and its
  shard from stage 1. With 2-byte parameters and gradients and 12 bytes of Adam state
  per element (fp32 master copy, two moments), 7.5B parameters on 64 ranks give the
  paper's 120 / 31.4 / 16.6 / 1.9 GB for stages 0-3 (``tests/sim/test_memory.py``).
* ``predict_memory`` applies it to every parameter of a program (bytes from the
  declared dtypes; its optimizer state: the persistables its update op reads that have
  its size), and adds what a step holds beside them:

  - **gathered buffers** (stage 3): a parameter is gathered before use and freed after
    (``reshard_after_forward``); with ``zero_prefetch = k`` up to ``k + 1`` groups (the
    adjacent parameters of one layer, ``program.shard.layer_of``) are gathered at
    once, so the largest ``k + 1`` consecutive groups; without resharding, every
    sharded parameter stays gathered through backward;
  - **unsharded gradients** (stages 2 and 3): a group's full gradients live from the
    backward op that writes them to their reduce-scatter, the same ``k + 1`` groups;
  - **activations**: the non-persistable values of one place's step in run order
    (a graph's step plan, ``runtime.plan``, else program order), each live from its
    first write to its last use (``runtime.memory_plan.last_uses``, the package's one
    lifetime rule); the peak of their sum at ``batch`` samples per place (a ``-1``
    dimension is the batch). Parameters' gradients are counted above, not here.
  - **the parameter's slice beside it** (stages 1 and 2): the optimizer updates
    ``p@SHARD`` and the all-gather rewrites the full ``p`` from it, so a rank holds
    both (the paper's fp32 master copy is in its 12 bytes of state instead);
  - **other persistables** (learning rate, beta powers, buffers): replicated.

Policy: the parts peak at different moments of the step (gradients and gathered
buffers in backward, activations at the end of forward), so ``peak_bytes``, their sum,
is an upper bound of the true peak; allocator caching and fragmentation (PyTorch's
reserved memory) are not modelled. Which parameters are sharded, and their optimizer
state, is ``program.shard``'s decision (``shard_program``'s layout: an elementwise
update, a dense gradient); the others stay replicated under every stage.
"""

import math

from ..core.dtypes import torch_dtype
from ..core.errors import SSAExecError

__all__ = ["zero_bytes", "MemoryPrediction", "predict_memory", "strategy_memory",
           "activation_peak", "format_memory", "STAGES"]

STAGES = (0, 1, 2, 3)
_NOT_STATE = frozenset({"Param", "Grad", "LearningRate", "SkipUpdate"})


def zero_bytes(numel, world, stage, param_bytes, grad_bytes, state_bytes):
    """``(parameter, gradient, optimizer state)`` bytes one of ``world`` ranks holds of a
    parameter of ``numel`` elements under ZeRO ``stage`` (the module docstring).

    ``param_bytes``, ``grad_bytes``, ``state_bytes``: bytes per element of the
    parameter, of its gradient and of all its optimizer state together (Adam in mixed
    precision: 2, 2 and 12, the paper's K).
    """
    if stage not in STAGES:
        raise SSAExecError(f"zero stage must be one of {STAGES}, got {stage!r}")
    if world < 1:
        raise SSAExecError(f"world size must be >= 1, got {world!r}")
    shard = math.ceil(numel / world)
    return ((shard if stage >= 3 else numel) * param_bytes,
            (shard if stage >= 2 else numel) * grad_bytes,
            (shard if stage >= 1 else numel) * state_bytes)


class MemoryPrediction:
    """Bytes one device holds at the peak of a step, by part (``parts``)."""

    __slots__ = ("stage", "world", "batch", "parts", "sharded", "replicated", "notes")

    PARTS = ("parameters", "gradients", "optimizer_state", "gathered", "activations",
             "other")

    def __init__(self, stage, world, batch, parts, sharded, replicated, notes=()):
        self.stage, self.world, self.batch = stage, world, batch
        self.parts = {k: int(parts.get(k, 0)) for k in self.PARTS}
        self.sharded, self.replicated = sharded, replicated
        self.notes = list(notes)

    @property
    def peak_bytes(self):
        """The sum of the parts: an upper bound of the step's peak (module docstring)."""
        return sum(self.parts.values())

    @property
    def model_state_bytes(self):
        """Parameters + gradients + optimizer state (the ZeRO paper's figure)."""
        p = self.parts
        return p["parameters"] + p["gradients"] + p["optimizer_state"]

    def to_dict(self):
        return {"zero_stage": self.stage, "world": self.world, "batch": self.batch,
                "bytes": dict(self.parts), "model_state_bytes": self.model_state_bytes,
                "peak_bytes": self.peak_bytes, "sharded_parameters": self.sharded,
                "replicated_parameters": self.replicated, "notes": list(self.notes)}

    def __repr__(self):
        return (f"<MemoryPrediction stage {self.stage}, world {self.world}: "
                f"{self.peak_bytes / 2**30:.2f} GiB>")


def _itemsize(var):
    return torch_dtype(var.dtype).itemsize


def _numel(var, batch):
    if var is None or var.shape is None:
        return 0
    return math.prod(batch if d < 0 else d for d in var.shape)


def _updates(program):
    """{parameter name: its optimizer op} (the op that reads it as ``Param``)."""
    out = {}
    for op in program.global_block().ops:
        for p in op.input("Param") if "Param" in op.inputs else ():
            out.setdefault(p, op)
    return out


def _state(block, op, numel):
    """Names of the optimizer state of the parameter ``op`` updates: the persistables
    it reads that have the parameter's size (moments, velocity; not beta powers)."""
    out = []
    for slot, names in op.inputs.items():
        if slot in _NOT_STATE:
            continue
        for n in names:
            var = block.find_var(n)
            if var is not None and var.persistable and var.numel == numel and n not in out:
                out.append(n)
    return out


def _groups(program, params):
    """Parameters grouped as ZeRO's collectives move them (``program.shard.layer_of``):
    by their first reader outside the update, in program order, adjacent ones of one
    layer together."""
    from ..program.shard import layer_of
    first = {}
    for i, op in enumerate(program.global_block().ops):
        if op.role == "optimize":
            continue
        for n in op.input_names():
            if n in params and n not in first:
                first[n] = i
    groups = {}
    for n in params:
        groups.setdefault(first.get(n, -1), []).append(n)
    out = []
    for k in sorted(groups):
        for n in groups[k]:
            if out and layer_of(out[-1][-1]) == layer_of(n):
                out[-1].append(n)
            else:
                out.append([n])
    return out


def _window(sizes, k):
    """The largest sum of ``k`` consecutive entries of ``sizes``."""
    if not sizes:
        return 0
    k = max(1, min(k, len(sizes)))
    best = cur = sum(sizes[:k])
    for i in range(k, len(sizes)):
        cur += sizes[i] - sizes[i - k]
        best = max(best, cur)
    return best


def _steps(program, graph):
    """(reads, writes, op) of one place's step, in run order: the graph's step plan
    (place 0's handles; ``op`` None for a handle that runs no program op) when given,
    else the program's ops."""
    if graph is not None:
        from ..runtime.plan import build_plan
        order = build_plan(graph, True, 1).order
        steps = []
        for h in order:
            if h.on_one_place and h.place_idx != 0:
                continue
            reads = [v.name for v in h.inputs
                     if not v.is_dummy and getattr(v, "place_idx", 0) == 0]
            writes = [v.name for v in h.outputs
                      if not v.is_dummy and getattr(v, "place_idx", 0) == 0]
            steps.append((reads, writes, getattr(h, "op", None)))
        return steps
    from ..graph.passes import op_reads_writes
    return [op_reads_writes(program, op) + (op,) for op in program.global_block().ops]


def activation_peak(program, batch, graph=None, exclude=(), half=frozenset(),
                    checkpoint=()):
    """Peak bytes of the non-persistable values of one place's step (module docstring).

    A value lives from its first write (a fed value: its first read) to its last use
    (``runtime.memory_plan.last_uses``). A view's result (``efficiency.op_class``
    "view": reshape, transpose ...) is its input's storage: no bytes of its own, and it
    keeps that storage alive until its own last use.

    Parameters
    ----------
    exclude : iterable of str
        Names counted elsewhere (parameters' gradients) or never materialised.
    half : set of str
        Names held in 2 bytes (automatic mixed precision's activations).
    checkpoint : sequence of (first op, end op, saved names)
        Activation checkpointing, in program op indices (forces program order): the
        values a block's forward ops ``[first, end)`` write that are neither in
        ``saved`` nor read by a later forward op die after their last forward use and
        are recomputed at the block's first backward use of any of them, living then
        to their last use.
    """
    from ..runtime.memory_plan import last_uses
    from .efficiency import op_class
    block = program.global_block()
    if checkpoint:
        graph = None
    steps = _steps(program, graph)
    exclude = set(exclude)
    root = {}  # a view's result -> the value whose storage it is

    def find(name):
        while name in root:
            name = root[name]
        return name

    for r, w, op in steps:
        if op is not None and op_class(op.type) == "view" and r and w:
            src = next((n for n in r if block.find_var(n) is not None and
                        not block.find_var(n).persistable), None)
            if src is not None:
                for n in w:
                    if n != src:
                        root[n] = src
    reads = [[find(n) for n in r] for r, _, _ in steps]
    writes = [[find(n) for n in w] for _, w, _ in steps]
    last = last_uses(reads, writes)
    first = {}
    for k in range(len(steps)):
        for n in reads[k] + writes[k]:
            first.setdefault(n, k)
    spans = {n: [(first[n], last[n])] for n in first}
    backward = [k for k, (_, _, op) in enumerate(steps)
                if op is not None and getattr(op, "role", None) in ("backward", "loss")]
    bstart = backward[0] if backward else len(steps)
    for lo, hi, saved in checkpoint:
        saved = {find(n) for n in saved}
        later = {n for k in range(hi, bstart) for n in reads[k]}
        dropped = {n for k in range(lo, hi) for n in writes[k]} - saved - later
        fwd_last, bwd_first = {}, None
        for n in dropped:
            fwd_last[n] = max(k for k in range(lo, hi) if n in reads[k] or n in writes[k])
            uses = [k for k in range(bstart, len(steps)) if n in reads[k]]
            if uses:
                bwd_first = uses[0] if bwd_first is None else min(bwd_first, uses[0])
        for n in dropped:
            spans[n] = [(first[n], fwd_last[n])]
            if bwd_first is not None and last[n] >= bstart:
                spans[n].append((bwd_first, last[n]))

    def nbytes(name):
        var = block.find_var(name)
        if var is None or var.persistable or name in exclude:
            return 0
        return _numel(var, batch) * (2 if name in half else _itemsize(var))

    delta = [0] * (len(steps) + 1)
    peak_at = [0] * (len(steps) + 1)
    for n, intervals in spans.items():
        b = nbytes(n)
        if not b:
            continue
        for a, z in intervals:
            delta[a] += b
            peak_at[z + 1] -= b
    live = peak = 0
    for k in range(len(steps)):
        live += delta[k]  # born at step k (before it runs)
        peak = max(peak, live)
        live += peak_at[k + 1]  # dead after step k
    return peak


def predict_memory(program, world, stage=0, batch=1, prefetch=1, reshard_after_forward=True,
                   gather_dtype=None, precision=None, graph=None, exclude=(),
                   checkpoint=()):
    """Predict one device's peak memory of a step of ``program`` (module docstring).

    Parameters
    ----------
    program : ProgramDesc
        The plain training program (before sharding).
    world : int
        Ranks the parameters are sharded over (processes x places).
    stage : {0, 1, 2, 3}
    batch : int
        Samples per device (a ``-1`` dimension), for the activations.
    prefetch : int
        ``BuildStrategy.zero_prefetch``: groups gathered ahead of compute.
    reshard_after_forward : bool
        Stage 3: free a gathered parameter after forward (gather again in backward).
    gather_dtype : str, optional
        Stage 3: the dtype parameters travel and stay gathered in (``"bf16"``).
    precision : {None, "amp"}
        ``"amp"``: floating activations in 2 bytes (as ``Profile.estimate``).
    graph : SSAGraph, optional
        Its step plan gives the run order of the activations (else program order).
    exclude : iterable of str
        Values a fused kernel never materialises (flash attention's scores).
    checkpoint : sequence of (first op, end op, saved names)
        Activation checkpointing (``activation_peak``).

    Returns
    -------
    MemoryPrediction
    """
    if stage not in STAGES:
        raise SSAExecError(f"zero stage must be one of {STAGES}, got {stage!r}")
    if not isinstance(world, int) or world < 1:
        raise SSAExecError(f"world size must be a positive integer, got {world!r}")
    from ..program.shard import shard_program
    block = program.global_block()
    # which parameters shard and their state: program.shard's rule (stage 1 never
    # refuses an op; the stage's own refusals come from the runtime's build)
    layout = shard_program(program, stage, world)[1] if stage else \
        shard_program(program, 1, world)[1]
    updates = _updates(program)
    params = list(program.all_parameters())
    parts = dict.fromkeys(MemoryPrediction.PARTS, 0)
    sharded, replicated, state_names = [], [], set()
    full_grad, gathered = {}, {}
    # BuildStrategy's names ("bf16") or dtype names ("bfloat16")
    gather_dtype = {"bf16": "bfloat16", "fp16": "float16"}.get(gather_dtype, gather_dtype)
    gbytes = torch_dtype(gather_dtype).itemsize if gather_dtype else None
    for var in params:
        n = var.numel or 0
        sp = layout.params.get(var.name)
        if sp is not None:
            state = [full for full, _ in sp.state]
        else:
            op = updates.get(var.name)
            state = _state(block, op, n) if op is not None else []
        state_names.update(state)
        state_bytes = sum(_itemsize(block.find_var(s)) for s in state)
        s = stage if sp is not None else 0
        (sharded if sp is not None else replicated).append(var.name)
        p, g, o = zero_bytes(n, world, s, _itemsize(var), _itemsize(var), state_bytes)
        if 1 <= s < 3:  # the optimizer's slice beside the full parameter (module doc)
            p += math.ceil(n / world) * _itemsize(var)
        parts["parameters"] += p
        parts["gradients"] += g
        parts["optimizer_state"] += o
        if s >= 2:
            full_grad[var.name] = n * _itemsize(var)
        if s >= 3:
            gathered[var.name] = n * (gbytes or _itemsize(var))
    groups = _groups(program, [v.name for v in params])
    window = prefetch + 1
    if full_grad:
        parts["gradients"] += _window([sum(full_grad.get(n, 0) for n in g) for g in groups],
                                      window)
    notes = []
    if gathered:
        if reshard_after_forward:
            parts["gathered"] = _window([sum(gathered.get(n, 0) for n in g) for g in groups],
                                        window)
        else:
            parts["gathered"] = sum(gathered.values())
            notes.append("reshard_after_forward=False: every sharded parameter stays "
                         "gathered from forward to the end of backward")
    grads = {g for _, g in graph.param_grads()} if graph is not None else \
        {v.name + "@GRAD" for v in params}
    half = frozenset()
    if precision == "amp":
        from .profile import activations_in_half
        half = activations_in_half(program)
    elif precision is not None:
        raise SSAExecError(f"precision must be None or 'amp', got {precision!r}")
    parts["activations"] = activation_peak(program, batch, graph,
                                           exclude=grads | {v.name for v in params} |
                                           set(exclude), half=half, checkpoint=checkpoint)
    pnames = {v.name for v in params}
    parts["other"] = sum((v.numel or 0) * _itemsize(v) for v in block.vars.values()
                         if v.persistable and not v.is_data and v.name not in pnames
                         and v.name not in state_names)
    if replicated and stage:
        notes.append(f"{len(replicated)} parameter(s) stay replicated (update not "
                     "elementwise, or sparse gradient)")
    return MemoryPrediction(stage, world, batch, parts, len(sharded), len(replicated), notes)


def strategy_memory(program, strategy, world, batch, precision=None, **kw):
    """``predict_memory`` with the ZeRO settings of a ``BuildStrategy``."""
    return predict_memory(program, world, strategy.zero_stage, batch=batch,
                          prefetch=strategy.zero_prefetch,
                          reshard_after_forward=strategy.reshard_after_forward,
                          gather_dtype=strategy.zero_gather_dtype,
                          precision="amp" if precision == "amp" else None, **kw)


def _gib(n):
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.2f} MiB"


def format_memory(m, where=""):
    """Text lines of a ``MemoryPrediction`` (``ssaexec stats --zero``, the simulator)."""
    p = m.parts
    lines = [f"memory (ZeRO stage {m.stage}, world {m.world}{where}), per device:",
             f"  parameters      {_gib(p['parameters'])} ({m.sharded} sharded, "
             f"{m.replicated} replicated)",
             f"  gradients       {_gib(p['gradients'])}",
             f"  optimizer state {_gib(p['optimizer_state'])}",
             f"  gathered        {_gib(p['gathered'])}",
             f"  activations     {_gib(p['activations'])} (batch {m.batch} per device)",
             f"  other           {_gib(p['other'])}",
             f"  peak <=         {_gib(m.peak_bytes)} (model state "
             f"{_gib(m.model_state_bytes)}; the parts' sum bounds the peak)"]
    lines.extend(f"  note: {n}" for n in m.notes)
    return "\n".join(lines) + "\n"
