"""ZeRO's program rewrite: ``shard_program(program, stage, world)`` -> ``(run program, layout)``.

The shard unit is the parameter, flattened and split evenly (FSDP2's choice): a
sharded parameter ``p`` of ``n`` elements has shard size ``S = ceil(n / W)`` over the
``W`` ranks (places x processes, global rank ``g = process * places + place``), and
rank ``g`` holds ``p@SHARD``, the 1-D slice ``flat(p)[g*S:(g+1)*S]``, zero-padded past
``n``. Why the parameter and not a flat bucket of several: every rank holds 1/W of
each parameter to within W-1 elements (balanced by construction, whatever the model);
an elementwise optimizer on a slice gives bit-identical results to the full update;
a checkpoint reshards by concatenating and re-slicing one tensor at a time; and
collectives can still be fused at run time without changing the layout.

What is sharded. A parameter ``p`` with gradient ``g`` (a backward op's ``role_var``)
is sharded when: it is floating with a fixed shape; exactly one optimizer op updates
it and that op is elementwise (``sgd``, ``momentum``, ``adam``/AdamW:
``ELEMENTWISE``); its gradient is dense; after the gradient's producer nothing but
that optimizer op (and ``fill_zeros_like``, which reads a shape only: gradient
accumulation's reset) reads ``g``; and every optimizer state input with ``p``'s shape
is read by that op alone. Everything else stays replicated on the plain all-reduce
path. A parameter that fails only the "nobody else reads the gradient" rule (global-
norm clipping, fp16 loss scaling's ``amp_unscale``: they need every summed gradient)
is refused under stages 2 and 3 with a ``ProgramError`` naming the op (stage 1 keeps
it replicated).

The rewrite, on a copy (the caller's program is never changed):

* ``p@SHARD`` (persistable, ``[S]``) and ``g@SHARD`` (``[S]``) are declared; each state
  ``m`` of ``p``'s shape becomes ``m@SHARD`` (persistable, ``[S]``) and ``m`` leaves
  the program; other state (beta powers, learning rate, loss scaling) is replicated;
* the optimizer op reads and writes the shards instead (``role_var`` keeps the
  logical pair ``(p, g)``, which the graph's collectives follow);
* stage 3: ``p`` is no longer persistable (the graph gathers it before use and frees
  it after: ``graph.passes.shard_collectives``).

The collectives themselves are the graph's (``graph.handles``: ``AllGatherOpHandle``,
``ReduceScatterOpHandle``, ``FreeOpHandle``): the run program is the graph builder's
input, not a program to run alone (no op writes its gradient shards, nor stage 3's
parameters, so it does not ``validate()`` by itself). Invariant: the layout is a function of
the run program and ``W`` (``layout_of``), so a sharded program that was saved and
loaded, or sharded twice, has the same layout; ``shard_program`` of a run program
returns it unchanged.
"""

import math

import torch

from ..core.dtypes import torch_dtype
from ..core.errors import ProgramError

__all__ = ["SHARD_SUFFIX", "ELEMENTWISE", "ShardedParam", "ShardLayout", "shard_program",
           "layout_of", "shard_like", "is_sharded", "layer_of"]

SHARD_SUFFIX = "@SHARD"

# optimizer op type -> (param slot, param out slot, grad slot): updates elementwise in
# every input of the parameter's shape, so a slice of each gives the slice of the result
ELEMENTWISE = {
    "sgd": ("Param", "ParamOut", "Grad"),
    "momentum": ("Param", "ParamOut", "Grad"),
    "adam": ("Param", "ParamOut", "Grad"),
}
# readers of a gradient after its producer that read only its shape
_SHAPE_READERS = frozenset({"fill_zeros_like"})


def layer_of(name):
    """The layer parameter ``name`` belongs to: the unit ZeRO's collectives move at once.

    The graph (``graph.passes.shard_collectives``) gathers the parameters of one layer
    by one all-gather and reduce-scatters their gradients by one reduce-scatter (a
    flat buffer of the layer's shards, rank by rank), as FSDP2 does for each module
    it wraps: one network call per layer instead of one per parameter. A layer is read
    off the name, which carries the module path: in an imported model
    (``frontends.torch``) the path up to its last list index (``model.layers.3.attn.
    q_proj.weight`` -> ``model.layers.3``: a transformer block, FSDP2's usual unit),
    else the module path (``model.head.weight`` -> ``model.head``; a builder program's
    ``fc_0.w_0`` -> ``fc_0``: a layer's weight and bias), and a name without a path is
    a layer of its own. Only parameters with the same layer whose collectives are
    adjacent in the graph's order join one call, so a name that repeats elsewhere in
    the program never ties distant layers together; the memory a gather holds is then
    at most one layer's (plus ``zero_prefetch`` layers ahead).
    """
    parts = name.split(".")[:-1]
    if not parts:
        return name
    for k in range(len(parts) - 1, -1, -1):
        if parts[k].isdigit():
            return ".".join(parts[:k + 1])
    return ".".join(parts)


class ShardedParam:
    """One sharded parameter: its full declaration and its shards' names.

    Attributes
    ----------
    name, grad : str
        The parameter and its gradient.
    shape : list of int
    dtype : str
    numel : int
    shard_size : int
        ``ceil(numel / world)``.
    state : tuple of (str, str)
        ``(state var as the plain program declares it, its shard's name)``.
    """

    __slots__ = ("name", "grad", "shape", "dtype", "numel", "shard_size", "state")

    def __init__(self, name, grad, shape, dtype, numel, shard_size, state=()):
        self.name, self.grad, self.shape, self.dtype = name, grad, list(shape), dtype
        self.numel, self.shard_size, self.state = numel, shard_size, tuple(state)

    @property
    def shard_name(self):
        return self.name + SHARD_SUFFIX

    @property
    def grad_shard_name(self):
        return self.grad + SHARD_SUFFIX

    def full_names(self):
        """``{full name: shard name}`` of the parameter and its sharded state."""
        return dict(((self.name, self.shard_name),) + self.state)

    def __repr__(self):
        return (f"ShardedParam({self.name!r}, shape={self.shape}, shard_size="
                f"{self.shard_size}, state={[s for s, _ in self.state]})")


class ShardLayout:
    """Which parameters are sharded over ``world`` ranks, and how to slice and join.

    Attributes
    ----------
    world : int
    stage : int
    params : dict
        ``{parameter name: ShardedParam}`` in program order.
    """

    __slots__ = ("world", "stage", "params", "_by_full")

    def __init__(self, world, stage, params):
        self.world, self.stage = int(world), int(stage)
        self.params = {p.name: p for p in params}
        self._by_full = {full: (p, shard) for p in params
                         for full, shard in p.full_names().items()}

    def __len__(self):
        return len(self.params)

    def __iter__(self):
        return iter(self.params.values())

    def sharded(self, full_name):
        """``(ShardedParam, shard name)`` of a full parameter or state name, or None."""
        return self._by_full.get(full_name)

    def shard_names(self):
        """``{shard name: full name}`` of every sharded var (persistable shards only)."""
        return {shard: full for full, (_, shard) in self._by_full.items()}

    def shard_of(self, flat_full, rank, shard_size=None):
        """Rank ``rank``'s slice of the 1-D tensor ``flat_full`` (zero-padded; a new tensor).

        ``shard_size`` defaults to that of the parameter with ``flat_full.numel()``
        elements over ``world`` ranks.
        """
        flat = flat_full.reshape(-1)
        if not 0 <= rank < self.world:
            raise ProgramError(f"rank {rank} is not in a world of {self.world}")
        s = shard_size or math.ceil(flat.numel() / self.world)
        out = torch.zeros(s, dtype=flat.dtype, device=flat.device)
        part = flat[rank * s:(rank + 1) * s]
        out[:part.numel()] = part
        return out

    def unshard(self, shards, shape=None):
        """The full tensor joined from ``shards`` (one per rank, in rank order), cut to
        ``prod(shape)`` elements and viewed as ``shape`` (1-D of every element when None)."""
        if len(shards) != self.world:
            raise ProgramError(f"unshard needs {self.world} shards, got {len(shards)}")
        flat = torch.cat([s.reshape(-1) for s in shards])
        if shape is None:
            return flat
        n = math.prod(shape)
        return flat[:n].reshape(shape).clone()

    def __repr__(self):
        return f"ShardLayout(world={self.world}, stage={self.stage}, params={list(self.params)})"


def is_sharded(program):
    """Whether ``program`` is already a run program of ``shard_program`` (or
    ``shard_like``): a parameter ``p`` has its shard ``p@SHARD`` declared."""
    block = program.global_block()
    for n in block.vars:
        if n.endswith(SHARD_SUFFIX):
            var = block.find_var(n[:-len(SHARD_SUFFIX)])
            if var is not None and var.is_parameter:
                return True
    return False


def _updates(block):
    """``{param: [optimizer ops naming it first in role_var]}``."""
    out = {}
    for op in block.ops:
        if op.role == "optimize" and op.role_var:
            out.setdefault(op.role_var[0][0], []).append(op)
    return out


def _candidates(program, stage):
    """``[(p, g, optimizer op, [state names])]`` of the parameters to shard, in order."""
    block = program.global_block()
    ops = list(block.ops)
    updates = _updates(block)
    readers = {}
    for i, op in enumerate(ops):
        for n in dict.fromkeys(op.input_names()):
            readers.setdefault(n, []).append((i, op))
    writers = {}
    for i, op in enumerate(ops):
        for n in dict.fromkeys(op.output_names()):
            writers.setdefault(n, []).append((i, op))
    out, seen = [], set()
    for i, op in enumerate(ops):
        if op.role != "backward":
            continue
        for p, g in op.role_var:
            if p in seen:
                continue
            seen.add(p)
            var = block.find_var(p)
            if var is None or var.shape is None or any(d < 0 for d in var.shape) or \
                    not torch_dtype(var.dtype).is_floating_point or not var.numel:
                continue
            ups = updates.get(p, [])
            if len(ups) != 1 or ups[0].type not in ELEMENTWISE:
                continue
            upd = ups[0]
            pslot, pout, gslot = ELEMENTWISE[upd.type]
            if upd.input(pslot) != [p] or upd.output(pout) != [p] or upd.input(gslot) != [g]:
                continue
            if any(w.attrs.get("is_sparse") is True for _, w in writers.get(g, ())):
                continue  # a sparse gradient: rows, not slices
            if any(w is not upd and j > i for j, w in writers.get(p, ())):
                continue  # something else writes the parameter
            others = [r for j, r in readers.get(g, ()) if j > i and r is not upd
                      and r.type not in _SHAPE_READERS]
            if others:
                if stage >= 2:
                    bad = others[0]
                    raise ProgramError(
                        f"zero_stage={stage}: op #{ops.index(bad)} {bad.type!r} reads the "
                        f"gradient {g!r} of parameter {p!r} after it is complete; under "
                        "ZeRO each rank holds only its slice of the summed gradient "
                        "(ops reading every gradient, as global-norm clipping or fp16 loss "
                        "scaling, are not supported: use zero_stage=1, or drop the op)")
                continue
            if stage == 3 and any(j > ops.index(upd) for j, _ in readers.get(p, ())):
                bad = next(r for j, r in readers[p] if j > ops.index(upd))
                raise ProgramError(f"zero_stage=3: op #{ops.index(bad)} {bad.type!r} reads "
                                   f"parameter {p!r} after its update; a stage-3 parameter "
                                   "is gathered for forward and backward only")
            state, ok = [], True
            for slot, names in upd.inputs.items():
                if slot in (pslot, gslot):
                    continue
                for n in names:
                    sv = block.find_var(n)
                    if sv is None or not sv.persistable or sv.shape != var.shape:
                        continue  # replicated (beta powers, learning rate, ...)
                    if any(r is not upd for _, r in readers.get(n, ())) or \
                            any(w is not upd for _, w in writers.get(n, ())):
                        ok = False  # shared with another op: cannot slice it alone
                    elif n not in state:
                        state.append(n)
            if ok:
                out.append((p, g, upd, state))
    return out


def shard_program(program, stage, world):
    """The run program of ZeRO ``stage`` (1-3) over ``world`` ranks, and its layout.

    Parameters
    ----------
    program : Program
        A training program (not changed), or a run program of this function (returned
        as it is).
    stage : {1, 2, 3}
    world : int
        Ranks: places x processes.

    Returns
    -------
    (Program, ShardLayout)

    Raises
    ------
    ProgramError
        An op that cannot run on shards under ``stage`` (module docstring), or a run
        program sharded for another stage.
    """
    if stage not in (1, 2, 3):
        raise ProgramError(f"shard_program: stage must be 1, 2 or 3, got {stage!r}")
    if int(world) != world or world < 1:
        raise ProgramError(f"shard_program: world must be a positive integer, got {world!r}")
    if is_sharded(program):
        layout = layout_of(program, world, stage)
        return program, layout
    run = program.clone()
    block = run.global_block()
    params = []
    for p, g, upd, state in _candidates(run, stage):
        var = block.var(p)
        s = math.ceil(var.numel / world)
        block.create_var(p + SHARD_SUFFIX, shape=[s], dtype=var.dtype, persistable=True)
        gvar = block.var(g)
        block.create_var(g + SHARD_SUFFIX, shape=[s], dtype=gvar.dtype)
        renames = {p: p + SHARD_SUFFIX, g: g + SHARD_SUFFIX}
        pairs = []
        for m in state:
            mvar = block.remove_var(m)
            block.create_var(m + SHARD_SUFFIX, shape=[s], dtype=mvar.dtype, persistable=True)
            renames[m] = m + SHARD_SUFFIX
            pairs.append((m, m + SHARD_SUFFIX))
        for slot, names in list(upd.inputs.items()):
            block.set_input(upd, slot, [renames.get(n, n) for n in names])
        for slot, names in list(upd.outputs.items()):
            block.set_output(upd, slot, [renames.get(n, n) for n in names])
        if stage == 3:
            block.update_var(p, persistable=False)
        params.append(ShardedParam(p, g, var.shape, var.dtype, var.numel, s, pairs))
    return run, ShardLayout(world, stage, params)


def shard_like(program, layout):
    """``program`` (a copy) with the parameters of ``layout`` sharded as a run program of
    ``shard_program`` holds them, for a program that updates nothing (gradient
    accumulation's micro-batches): their shards declared and, under stage 3, the full
    parameters no longer persistable (the graph gathers them)."""
    if is_sharded(program) or not len(layout):
        return program
    run = program.clone()
    block = run.global_block()
    for sp in layout:
        block.create_var(sp.shard_name, shape=[sp.shard_size], dtype=sp.dtype,
                         persistable=True)
        if layout.stage == 3:
            block.update_var(sp.name, persistable=False)
    return run


def layout_of(program, world, stage=None):
    """The ``ShardLayout`` of a run program of ``shard_program`` (or ``shard_like``) over
    ``world`` ranks (an empty one for a program that is not sharded). ``stage``, when
    given, is checked against the program (stage 3 makes its parameters
    non-persistable)."""
    block = program.global_block()
    updates = _updates(block)
    params = []
    three = None
    for shard in list(block.vars):
        if not shard.endswith(SHARD_SUFFIX):
            continue
        p = shard[:-len(SHARD_SUFFIX)]
        var = block.find_var(p)
        if var is None or not var.is_parameter:
            continue  # a gradient's or a state's shard
        svar = block.var(shard)
        s = math.ceil(var.numel / world)
        if svar.shape != [s]:
            raise ProgramError(f"{shard!r} has shape {svar.shape}, but a world of {world} "
                               f"ranks gives {var.shape} shards of [{s}]: the program was "
                               "sharded for another world size")
        g, state = None, []
        ups = updates.get(p, [])
        if ups:
            upd = ups[0]
            if upd.type not in ELEMENTWISE:
                raise ProgramError(f"{shard!r} is declared, but {p!r} is updated by "
                                   f"{upd.type!r}, which does not run on shards")
            gs = upd.input(ELEMENTWISE[upd.type][2])
            if len(gs) != 1 or not gs[0].endswith(SHARD_SUFFIX):
                raise ProgramError(f"the update of {p!r} reads gradient {gs}, not a shard")
            g = gs[0][:-len(SHARD_SUFFIX)]
            state = [(n[:-len(SHARD_SUFFIX)], n) for n in upd.input_names()
                     if n.endswith(SHARD_SUFFIX) and n not in (shard, gs[0])]
        params.append(ShardedParam(p, g, var.shape, var.dtype, var.numel, s,
                                   list(dict.fromkeys(state))))
        three = not var.persistable
    found = (3 if three else stage if stage in (1, 2) else 1) if params else (stage or 0)
    if stage is not None and params and (stage == 3) != (found == 3):
        raise ProgramError(f"the program was sharded for zero_stage="
                           f"{'3' if three else '1 or 2'}, not {stage}")
    return ShardLayout(world, found, params)
