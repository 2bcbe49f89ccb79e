"""SSA handles: versioned variable handles per place and the op handle kinds between them.

Every (name, place) has a list of ``VarHandle`` versions; version 0 is the value
that exists before the run (no ``generated_op``), and each write makes the next
version. ``DummyVarHandle`` carries no data: it only orders two ops (a
write-after-read or write-after-write hazard, the chain of collectives, or
sequential execution). Op handles come in a closed set of kinds:

* ``ComputationOpHandle``: one program op on one place;
* ``ScaleLossGradOpHandle``: seeds ``loss@GRAD`` on one place;
* ``AllReduceOpHandle`` / ``ReduceOpHandle`` / ``BroadcastOpHandle``: collectives
  spanning every place (a fused all-reduce holds several gradients);
* ``AllGatherOpHandle`` / ``ReduceScatterOpHandle``: ZeRO's collectives
  (``program.shard``): a parameter joined from every rank's shard, a gradient summed
  into each rank's shard;
* ``FreeOpHandle``: drops a var's value on one place (ZeRO's gathered parameters and
  reduce-scattered gradients), as a new, empty version;
* ``FetchOpHandle``: reads a fetched var on every place.

Each kind is a class that carries what every consumer needs to know about it, so
no consumer branches on kind names: ``kind`` and ``legend`` (labels for dumps and
pictures), ``color`` (DOT fill), ``stream`` (the stream role it launches on:
``compute``, ``comm`` or ``fetch``), ``is_collective``, ``in_place`` (its outputs
rewrite its inputs' storage), ``on_one_place`` (it has ``place``/``place_idx``),
``op_type``, ``section()`` (part of the training step), ``details()`` (kind-specific
fields for dumps and traces) and, for collectives, ``traffic_factor``/``traffic_formula``
(bytes moved per place) and ``apply`` (which call of the collective interface it makes).
How a handle runs stays in the runtime (``runtime.handle_calls.handle_fn``,
``runtime.codegen.emit_handle``) and how the simulator replays, prices and profiles it
in ``sim`` (``sim.engine.replay_handle``, ``sim.comm_cost.cost_model``,
``sim.profile.op_key``), each dispatched on the class (``functools.singledispatch``).
``kind`` is a label, data only: dumps, traces, stats, pictures and the explorer show
it, and nothing dispatches on it (``tests/graph/test_kind_dispatch.py``). Adding a kind is
one class (and, for a collective, its cost model class in ``sim.comm_cost``);
``HANDLE_KINDS`` (``graph.kinds``) maps each kind label to its class, in the order the
classes are defined here.

The graph they form (``SSAGraph``, ``lint()``) is ``graph.ssa``, which re-exports every
name of this module; this module does not import it.
"""

import torch

from ..core.dtypes import torch_dtype
from .kinds import HANDLE_KINDS  # kind label -> OpHandle subclass (filled by __init_subclass__)

__all__ = ["VarHandle", "DummyVarHandle", "OpHandle", "ComputationOpHandle",
           "ScaleLossGradOpHandle", "CollectiveOpHandle", "AllReduceOpHandle",
           "AllReduceWaitOpHandle", "ReduceOpHandle", "BroadcastOpHandle", "FetchOpHandle",
           "AllGatherOpHandle", "ReduceScatterOpHandle", "FreeOpHandle"]


class VarHandle:
    """Version ``version`` of var ``name`` on place number ``place_idx``."""

    __slots__ = ("name", "place", "place_idx", "version", "generated_op", "pending_ops")

    def __init__(self, name, place, place_idx, version, generated_op=None):
        self.name = name
        self.place = place
        self.place_idx = place_idx
        self.version = version
        self.generated_op = generated_op
        self.pending_ops = []

    @property
    def is_dummy(self):
        return False

    def __repr__(self):
        return f"{self.name}@v{self.version}({self.place})"


class DummyVarHandle:
    """A dependency with no data: ``generated_op`` must run before its ``pending_ops``."""

    __slots__ = ("name", "generated_op", "pending_ops", "reason")

    def __init__(self, name, generated_op, reason):
        self.name = name
        self.generated_op = generated_op
        self.pending_ops = []
        self.reason = reason

    @property
    def is_dummy(self):
        return True

    def __repr__(self):
        return f"{self.name}({self.reason})"


class OpHandle:
    """Base of op handles: input and output var handles, a kind and an id."""

    __slots__ = ("id", "inputs", "outputs")
    kind = None             # label in dumps, traces, stats and pictures
    legend = None           # label in a picture's legend (default: kind)
    color = "#eeeeee"       # DOT fill colour
    stream = "compute"      # stream role: "compute", "comm" or "fetch"
    is_collective = False
    # True: each output rewrites, in place, the input of its name on its place (aliasing
    # orders readers of that storage first); a computation's op def says it per op
    in_place = False
    on_one_place = False    # True: the handle has ``place`` and ``place_idx``
    # True: the scheduler queues it before the computation made ready with it
    # (``runtime.scheduler.comm_first``): collectives, so communication overlaps compute,
    # and ZeRO's frees, so memory comes back as soon as it may
    urgent = False
    # True: moves no data and runs no kernel (ZeRO's frees): on the compiled path, when
    # it waits for a collective its place's open segment does not follow, it is a node
    # of its own rather than the start of a new segment, so the compute after it does
    # not wait for that collective (``runtime.node_graph``)
    bookkeeping = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("kind") is not None:
            HANDLE_KINDS[cls.kind] = cls

    def __init__(self):
        self.id = -1
        self.inputs = []
        self.outputs = []

    @property
    def places(self):
        """Places this handle touches, in place order."""
        seen = []
        for v in self.inputs + self.outputs:
            if not v.is_dummy and v.place not in seen:
                seen.append(v.place)
        return seen

    @property
    def op_type(self):
        """The program op type for compute handles, else the kind."""
        return self.kind

    def section(self):
        """The part of a training step: forward, backward, optimize, comm or fetch."""
        return "comm"

    def details(self):
        """Kind-specific fields (JSON-ready) for dumps and traces."""
        return {}

    def producers(self):
        """Distinct op handles this one waits for."""
        out = []
        for v in self.inputs:
            g = v.generated_op
            if g is not None and g not in out:
                out.append(g)
        return out

    def describe(self):
        """A short label: kind, type and place."""
        return self.name

    def __repr__(self):
        return f"<{type(self).__name__} #{self.id} {self.name}>"


class _OnePlace(OpHandle):
    __slots__ = ()
    on_one_place = True


class ComputationOpHandle(_OnePlace):
    """Program op ``op`` (index ``op_index`` in block 0) on one place."""

    __slots__ = ("op", "op_index", "place", "place_idx")
    kind = "compute"
    color = "#cfe2ff"

    def __init__(self, op, op_index, place, place_idx):
        super().__init__()
        self.op, self.op_index, self.place, self.place_idx = op, op_index, place, place_idx

    @property
    def name(self):
        return f"{self.op.type}#{self.op_index}@{self.place}"

    @property
    def op_type(self):
        return self.op.type

    def section(self):
        return "backward" if self.op.role == "loss" else self.op.role

    def details(self):
        return {"op_type": self.op.type, "op_index": self.op_index, "role": self.op.role}


class CollectiveOpHandle(OpHandle):
    """Base of the handles that span every place and call the collective backend."""

    __slots__ = ("var_names", "seq")
    stream = "comm"
    is_collective = True
    urgent = True
    in_place = True         # the backend sums/copies into the tensors it is given
    traffic_formula = None  # bytes each of n places sends, as a formula of the payload

    def __init__(self, var_names):
        super().__init__()
        self.var_names = list(var_names)
        self.seq = -1  # position in the graph's collective chain

    def details(self):
        return {"vars": list(self.var_names), "seq": self.seq}

    @staticmethod
    def traffic_factor(n):
        """Bytes each of ``n`` places sends per payload byte (ring algorithms)."""
        raise NotImplementedError

    def apply(self, collective, tensors, label):
        """Make this handle's call of ``collective`` on one var's per-place ``tensors``."""
        raise NotImplementedError

    def nbytes(self, program):
        """Bytes of one place's share (from the declared shapes; -1 dims count as 1)."""
        total = 0
        for n in self.var_names:
            var = program.global_block().find_var(n)
            if var is not None and var.numel is not None:
                total += var.numel * torch_dtype(var.dtype).itemsize
        return total


class AllReduceOpHandle(CollectiveOpHandle):
    """Sums ``var_names`` over all places; every place gets the result (a bucket if fused).

    ``wire_dtype`` (a dtype name, ``BuildStrategy(allreduce_dtype=...)``) compresses
    floating gradients for the exchange, as DDP's ``bf16_compress_hook``: they are
    cast to it, summed (in their own type by an in-process backend, which sums the
    rounded values exactly; in the wire type across processes) and the result, rounded
    to the wire type as it travels back, is cast to the gradient's type.
    """

    __slots__ = ("wire_dtype", "wait")

    def __init__(self, var_names, wire_dtype=None):
        super().__init__(var_names)
        self.wire_dtype = wire_dtype
        self.wait = None  # the AllReduceWaitOpHandle that completes an asynchronous one
    kind = "all_reduce"
    legend = "all-reduce"
    color = "#f8b4b4"
    traffic_formula = "2(n-1)/n x payload (ring)"

    @property
    def name(self):
        names = self.var_names[0] if len(self.var_names) == 1 else \
            f"{len(self.var_names)} grads: {self.var_names[0]}.."
        return f"all_reduce({names})"

    @staticmethod
    def traffic_factor(n):
        return 2 * (n - 1) / n

    def apply(self, collective, tensors, label):
        self.apply_start(collective, tensors, label)()

    def apply_start(self, collective, tensors, label):
        """Start the all-reduce of ``tensors``; return the function that completes it
        (a backend without asynchronous calls has finished already)."""
        start = getattr(collective, "all_reduce_start", None)
        wire = torch_dtype(self.wire_dtype) if self.wire_dtype else None
        if wire is None or not tensors[0].is_floating_point() or tensors[0].dtype == wire:
            if start is not None:
                return start(tensors, label=label)
            collective.all_reduce(tensors, label=label)
            return _done
        if getattr(collective, "local_only", False):
            sent = [t.to(wire).to(t.dtype) for t in tensors]  # rounded, summed exactly
        else:
            sent = [t.to(wire) for t in tensors]
        if start is not None:
            finish = start(sent, label=label)
        else:
            collective.all_reduce(sent, label=label)
            finish = _done

        def complete():
            finish()
            for t, s in zip(tensors, sent, strict=True):
                t.copy_(s.to(wire))
        return complete

    def details(self):
        d = super().details()
        if self.wire_dtype:
            d["wire_dtype"] = self.wire_dtype
        return d


def _done():
    return None


class AllReduceWaitOpHandle(OpHandle):
    """Completes the asynchronous all-reduce ``start`` (multi-process runs).

    The all-reduce handle issues the cross-process call and returns, so the chain of
    collectives moves on and several are in flight while backward goes on; this
    handle waits for the result and writes the reduced versions, and only what reads
    them waits for it (DDP's reducer works the same way).
    """

    __slots__ = ("start",)
    kind = "all_reduce_wait"
    legend = "all-reduce wait"
    color = "#fbd5d5"
    stream = "comm"

    def __init__(self, start):
        super().__init__()
        self.start = start

    @property
    def name(self):
        return f"wait({self.start.name})"

    def section(self):
        return "comm"

    def details(self):
        return {"waits_for": self.start.id}


class ReduceOpHandle(CollectiveOpHandle):
    """Sums ``var_names`` over all places into place ``owner_idx`` only."""

    __slots__ = ("owner_idx",)
    kind = "reduce"
    color = "#fcd29f"
    traffic_formula = "(n-1)/n x payload"

    def __init__(self, var_names, owner_idx):
        super().__init__(var_names)
        self.owner_idx = owner_idx

    @property
    def name(self):
        return f"reduce({self.var_names[0]}->{self.owner_idx})"

    def details(self):
        return dict(super().details(), owner=self.owner_idx)

    @staticmethod
    def traffic_factor(n):
        return (n - 1) / n

    def apply(self, collective, tensors, label):
        collective.reduce(tensors, self.owner_idx, label=label)


class BroadcastOpHandle(CollectiveOpHandle):
    """Copies ``var_names`` from place ``root_idx`` to every other place."""

    __slots__ = ("root_idx",)
    kind = "broadcast"
    color = "#fde68a"
    traffic_formula = "(n-1)/n x payload"

    def __init__(self, var_names, root_idx):
        super().__init__(var_names)
        self.root_idx = root_idx

    @property
    def name(self):
        return f"broadcast({self.var_names[0]}<-{self.root_idx})"

    def details(self):
        return dict(super().details(), root=self.root_idx)

    @staticmethod
    def traffic_factor(n):
        return (n - 1) / n

    def apply(self, collective, tensors, label):
        collective.broadcast(tensors, self.root_idx, label=label)


class _ShardCollective(CollectiveOpHandle):
    """Base of the ZeRO collectives: a layer's vars, their shards, an optional wire type."""

    __slots__ = ("shard_names", "wire_dtype")
    traffic_formula = "(n-1)/n x payload (ring)"
    noun = "vars"  # what the dumps call var_names

    def __init__(self, var_names, shard_names, wire_dtype=None):
        super().__init__(var_names)
        self.shard_names = list(shard_names)
        self.wire_dtype = wire_dtype

    @property
    def name(self):
        names = self.var_names[0] if len(self.var_names) == 1 else \
            f"{len(self.var_names)} {self.noun}: {self.var_names[0]}.."
        return f"{self.kind}({names})"

    def details(self):
        d = dict(super().details(), shards=list(self.shard_names))
        if self.wire_dtype:
            d["wire_dtype"] = self.wire_dtype
        return d

    @staticmethod
    def traffic_factor(n):
        return (n - 1) / n


class AllGatherOpHandle(_ShardCollective):
    """Joins each full var of ``var_names`` from every rank's ``shard_names`` (ZeRO).

    ``shard_names[k]`` (1-D, ``S`` elements on each place) is rank g's slice of
    ``var_names[k]`` (``program.shard``); every place gets the whole var, of shape
    ``shapes[k]``: the first ``prod(shape)`` elements of the ``W*S`` joined in global rank
    order. Where the place already holds the var (stages 1 and 2, after the optimizer)
    it is rewritten in place; otherwise (stage 3, before a reader) it is a new tensor.
    ``wire_dtype`` (``BuildStrategy(zero_gather_dtype=...)``) gathers floating shards
    in that type and casts the result back.
    """

    __slots__ = ("shapes",)
    kind = "all_gather"
    legend = "all-gather"
    color = "#a7f3d0"
    noun = "params"

    def __init__(self, var_names, shard_names, shapes, wire_dtype=None):
        super().__init__(var_names, shard_names, wire_dtype)
        self.shapes = [list(s) for s in shapes]

    def apply(self, collective, tensors, label):
        """``tensors`` is ``(shards, outs)``: per place, the 1-D shard and the 1-D buffer
        of ``W*S`` elements that receives every rank's shard."""
        shards, outs = tensors
        wire = torch_dtype(self.wire_dtype) if self.wire_dtype else None
        if wire is None or not shards[0].is_floating_point() or shards[0].dtype == wire:
            collective.all_gather(shards, outs, label=label)
            return
        sent = [s.to(wire) for s in shards]
        got = [torch.empty(o.shape, dtype=wire, device=o.device) for o in outs]
        collective.all_gather(sent, got, label=label)
        for o, g in zip(outs, got, strict=True):
            o.copy_(g)


class ReduceScatterOpHandle(_ShardCollective):
    """Sums each gradient of ``var_names`` over every rank into each rank's shard (ZeRO).

    Place i gets ``shard_names[k]`` (1-D, ``S``): the sum over ranks of their chunk
    number g, g being place i's global rank, of the flattened, zero-padded gradient.
    The sum runs in the gradient's type (or ``wire_dtype``, ``allreduce_dtype``'s).
    """

    __slots__ = ()
    kind = "reduce_scatter"
    legend = "reduce-scatter"
    color = "#fca5a5"
    noun = "grads"

    def apply(self, collective, tensors, label):
        """``tensors`` is ``(fulls, shards)``: per place, the flattened gradient padded to
        ``W*S`` elements and the 1-D shard of ``S`` that receives the sum."""
        fulls, shards = tensors
        wire = torch_dtype(self.wire_dtype) if self.wire_dtype else None
        if wire is None or not fulls[0].is_floating_point() or fulls[0].dtype == wire:
            collective.reduce_scatter(fulls, shards, label=label)
            return
        if getattr(collective, "local_only", False):
            sent = [f.to(wire).to(f.dtype) for f in fulls]  # rounded, summed exactly
            got = [torch.empty_like(s) for s in shards]
        else:
            sent = [f.to(wire) for f in fulls]
            got = [torch.empty(s.shape, dtype=wire, device=s.device) for s in shards]
        collective.reduce_scatter(sent, got, label=label)
        for s, g in zip(shards, got, strict=True):
            s.copy_(g.to(wire))


class FreeOpHandle(_OnePlace):
    """Drops the values of ``var_names`` on one place (ZeRO: a gathered parameter after
    its last reader, a gradient after its reduce-scatter).

    It writes a new, empty version of each var: by the SSA hazards every reader of the
    value it drops runs before it, and the next write of the name (the next gather)
    after it. It moves no data and launches nothing.
    """

    __slots__ = ("var_names", "place", "place_idx")
    kind = "free"
    color = "#e5e7eb"
    urgent = True
    bookkeeping = True

    def __init__(self, var_names, place, place_idx):
        super().__init__()
        self.var_names = list(var_names)
        self.place, self.place_idx = place, place_idx

    @property
    def name(self):
        return f"free({', '.join(self.var_names)})@{self.place}"

    def section(self):
        return "comm"  # ZeRO's bookkeeping beside its collectives

    def details(self):
        return {"vars": list(self.var_names)}


class FetchOpHandle(OpHandle):
    """Reads the latest version of ``var_name`` on every place."""

    __slots__ = ("var_name",)
    kind = "fetch"
    color = "#c6f6d5"
    stream = "fetch"

    def section(self):
        return "fetch"

    def details(self):
        return {"var": self.var_name}

    def __init__(self, var_name):
        super().__init__()
        self.var_name = var_name

    @property
    def name(self):
        return f"fetch({self.var_name})"


class ScaleLossGradOpHandle(_OnePlace):
    """Writes ``loss@GRAD`` = ``coeff`` (shape ``shape``, dtype ``dtype``) on one place."""

    __slots__ = ("var_name", "coeff", "shape", "dtype", "place", "place_idx", "op_index")
    kind = "scale_loss_grad"
    legend = "loss-grad scale"
    color = "#e9d5ff"

    def __init__(self, var_name, coeff, shape, dtype, place, place_idx, op_index):
        super().__init__()
        self.var_name, self.coeff, self.shape, self.dtype = var_name, coeff, shape, dtype
        self.place, self.place_idx, self.op_index = place, place_idx, op_index

    @property
    def name(self):
        return f"scale_loss_grad({self.var_name})@{self.place}"

    def section(self):
        return "backward"

    def details(self):
        return {"var": self.var_name, "coeff": self.coeff}
