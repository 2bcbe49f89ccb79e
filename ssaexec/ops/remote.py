"""Ops that place a block elsewhere (seed 002): ``placeable_block``, ``send``, ``recv``,
``listen_and_serv``.

``placeable_block`` runs its ``sub_block`` where it stands (one process): it reads
``X`` and writes ``Out``, the names declared outside the block that the block reads
and writes (``program.blocks.outer_io``), and updates them in place, as the
optimizer ops inside it do. ``se.transpile`` (``program.distribute``) moves it to
parameter servers, where ``listen_and_serv`` runs it for the gradients the trainers'
``send`` ops deliver, and the trainers' ``recv`` ops get the parameters back.

Messages. Every exchange is point-to-point over the ``torch.distributed`` process
group the caller started (``se.distributed.init``; gloo on CPU, NCCL on GPU): the
ops name their peer by rank and can reach no one else, open no connection and
touch no file (docs/security.md). A trainer's ``send`` posts a header, an int64
tensor ``[kind, trainer rank]`` (``GRADS`` or ``STOP``) with tag ``HEADER``, then
each tensor of ``X`` with tag ``DATA``; its ``recv`` waits for the parameters with
tag ``DATA``. Shapes and dtypes are known on both sides from the programs.

``listen_and_serv`` loops until every trainer has sent ``STOP``:

* ``sync``: one round per step: a header and the gradients from every trainer still
  running, in rank order; each gradient is their sum over ``fan_in`` (the mean over
  the trainers, so the update equals data parallelism's; a sparse gradient, listed in
  ``sparse``, arrives as its row count, rows and values, and the trainers' rows are
  gathered and coalesced, never densified); the optimize block runs
  once; the parameters go back to each trainer of the round. A trainer's ``recv``
  returns only when every trainer has sent: the step barrier.
* ``async``: whichever trainer's header comes first (``recv`` from any source), its
  gradients are applied at once, alone, and the parameters go back to it.

Failures. Every wait is bounded by the op's ``timeout``: a peer that died (gloo
notices the closed connection at once) or hangs becomes a ``DistributedError``
naming this rank, the peer's role and rank, within that time.
"""

import datetime

import torch

from ..core.errors import DistributedError
from .registry import register_op
from .sparse import dense, rows_of, sum_rows

__all__ = ["GRADS", "STOP", "HEADER", "DATA"]

GRADS, STOP = 1, 0
HEADER, DATA = 1, 2


def _no_infer(ins, attrs):
    return {}


# --- placeable_block ---------------------------------------------------------------------
def placeable_block(ins, attrs, ctx):
    """Run ``sub_block`` here over X; Out are the outer vars it wrote (updated in place)."""
    op = ctx.op
    env = dict(zip(op.input("X"), ins["X"], strict=True))
    ctx.run_block(attrs["sub_block"].idx, env)
    missing = [n for n in op.output("Out") if n not in env]
    if missing:
        raise ValueError(f"placeable_block did not write {missing[0]!r}")
    return {"Out": [env[n] for n in op.output("Out")]}


register_op("placeable_block", ["X*!"], ["Out*!"],
            {"sub_block": ("block", None), "inputs": ("strs", []), "outputs": ("strs", [])},
            infer=_no_infer, grad=None, inplace=True, control=True)(placeable_block)


# --- point to point ----------------------------------------------------------------------
def _dist():
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_initialized():
        raise DistributedError("send/recv/listen_and_serv exchange tensors with the ranks of a "
                               "torch.distributed process group, and there is none: start the "
                               "processes with 'ssaexec launch' (or torchrun) and call "
                               "se.distributed.init() first")
    return dist


class _Link:
    """This rank's exchanges with one peer, each wait bounded by ``timeout`` seconds."""

    __slots__ = ("dist", "me", "peer", "role", "timeout", "device")

    def __init__(self, peer, role, timeout):
        self.dist = dist = _dist()
        self.me = dist.get_rank()
        world = dist.get_world_size()
        if not 0 <= peer < world or peer == self.me:
            raise DistributedError(f"rank {self.me}: peer rank {peer} is not another rank of "
                                   f"the process group (world size {world})")
        self.peer, self.role, self.timeout = peer, role, float(timeout)
        self.device = torch.device("cuda", torch.cuda.current_device()) \
            if str(dist.get_backend()) == "nccl" else torch.device("cpu")

    def _wait(self, work, what):
        try:
            done = work.wait(datetime.timedelta(seconds=self.timeout))
            if done is False:
                raise TimeoutError(f"not done after {self.timeout:g}s")
        except DistributedError:
            raise
        except Exception as e:  # gloo: "Connection closed by peer", "Timed out waiting"
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise DistributedError(
                f"rank {self.me}: {what} {self.role} rank {self.peer} failed within the "
                f"{self.timeout:g}s timeout ({type(e).__name__}: {first[:200]}); the "
                f"{self.role} probably died or hangs (see its log)") from e

    def send(self, tensors, tag, what):
        works = []
        try:
            for t in tensors:
                works.append(self.dist.isend(t.detach().contiguous().to(self.device),
                                             self.peer, tag=tag))
        except Exception as e:
            raise DistributedError(f"rank {self.me}: {what} {self.role} rank {self.peer} "
                                   f"failed ({type(e).__name__}: {e})") from e
        for w in works:
            self._wait(w, what)

    def recv(self, specs, tag, what):
        out = [torch.empty(shape, dtype=dtype, device=self.device) for shape, dtype in specs]
        try:
            works = [self.dist.irecv(t, self.peer, tag=tag) for t in out]
        except Exception as e:
            raise DistributedError(f"rank {self.me}: {what} {self.role} rank {self.peer} "
                                   f"failed ({type(e).__name__}: {e})") from e
        for w in works:
            self._wait(w, what)
        return out


def _header(kind, rank):
    return torch.tensor([kind, rank], dtype=torch.int64)


def _as_rows(t):
    """[row count, rows, values] of ``t`` as a sparse gradient travels (``ops.sparse``)."""
    t = (t if t.is_sparse else t.to_sparse(1)).coalesce()
    rows = t.indices()[0]
    return [torch.tensor([rows.numel()], dtype=torch.int64), rows, t.values()]


def send(ins, attrs):
    """Send X to the parameter server ``peer`` after a header (``stop``: a STOP header).

    The entries of X whose positions ``sparse`` lists travel as rows: their row count,
    rows and values; the others whole (a sparse one densified)."""
    link = _Link(attrs["peer"], "parameter server", attrs["timeout"])
    tag = STOP if attrs["stop"] else GRADS
    link.send([_header(tag, link.me)], HEADER, "sending a header to")
    if not attrs["stop"]:
        rows = set(attrs["sparse"])
        out = []
        for j, t in enumerate(ins.get("X") or []):
            out += _as_rows(t) if j in rows else [dense(t)]
        link.send(out, DATA, "sending gradients to")
    return {"Token": torch.zeros((), dtype=torch.int64)}


register_op("send", ["X*?!"], ["Token?!"],
            {"peer": ("int", 0), "timeout": ("float", 60.0), "stop": ("bool", False),
             "sparse": ("ints", [])}, infer=_no_infer, grad=None)(send)


def _specs(attrs):
    from ..core.dtypes import torch_dtype
    return [(list(shape), torch_dtype(dt))
            for shape, dt in zip(attrs["shapes"], attrs["dtypes"], strict=True)]


def recv(ins, attrs):
    """Out = the parameters the server ``peer`` sends back (after every Token's send)."""
    link = _Link(attrs["peer"], "parameter server", attrs["timeout"])
    out = link.recv(_specs(attrs), DATA, "receiving parameters from")
    return {"Out": out}


register_op("recv", ["Token*!"], ["Out*!"],
            {"peer": ("int", 0), "timeout": ("float", 60.0), "shapes": ("any", []),
             "dtypes": ("strs", [])}, infer=_no_infer, grad=None)(recv)


# --- the server ----------------------------------------------------------------------------
def listen_and_serv(ins, attrs, ctx):
    """Serve the trainers (module docstring) until each has sent STOP."""
    op = ctx.op
    env = dict(zip(op.input("X"), ins["X"], strict=True))
    block = ctx.program.block(attrs["sub_block"].idx)  # the gradients are its fed vars
    from ..core.dtypes import torch_dtype
    sparse = set(attrs["sparse"])
    specs = [(block.var(n).shape, torch_dtype(block.var(n).dtype), n in sparse)
             for n in attrs["grads"]]
    links = {t: _Link(t, "trainer", attrs["timeout"]) for t in attrs["trainers"]}
    active = list(attrs["trainers"])
    sync = attrs["mode"] == "sync"
    fan_in = attrs["fan_in"] or len(active)
    while active:
        if sync:
            arrived = []
            for t in list(active):
                tag = int(links[t].recv([([2], torch.int64)], HEADER,
                                         "waiting for a header from")[0][0])
                if tag == STOP:
                    active.remove(t)
                else:
                    arrived.append((t, _recv_grads(links[t], specs)))
            if not arrived:
                break
            for j, name in enumerate(attrs["grads"]):
                parts = [grads[j] for _, grads in arrived]
                if parts[0].is_sparse:
                    total = sum_rows(parts)
                else:
                    total = parts[0].clone()
                    for g in parts[1:]:
                        total.add_(g)
                env[name] = total * (1.0 / fan_in) if fan_in != 1 else total
        else:
            t = _any_header(links, active)
            if t is None:
                continue
            grads = _recv_grads(links[t], specs)
            env.update(zip(attrs["grads"], grads, strict=True))
            arrived = [(t, grads)]
        ctx.run_block(attrs["sub_block"].idx, env)
        params = [env[n] for n in attrs["params"]]
        for t, _ in arrived:
            links[t].send(params, DATA, "sending parameters to")
    return {"Out": [env.get(n) for n in op.output("Out")]}


def _recv_grads(link, specs):
    """The gradients of one trainer: whole, or as rows (``specs``: shape, dtype, sparse)."""
    out = []
    for shape, dtype, sparse in specs:
        if not sparse:
            out += link.recv([(shape, dtype)], DATA, "receiving gradients from")
            continue
        n = int(link.recv([([1], torch.int64)], DATA, "receiving gradients from")[0][0])
        rows, values = link.recv([([n], torch.int64), ([n] + list(shape[1:]), dtype)], DATA,
                                 "receiving gradients from")
        out.append(rows_of(rows, values, shape))
    return out


def _any_header(links, active):
    """The rank of the trainer whose header comes first (None after a STOP)."""
    some = links[active[0]]
    hdr = torch.empty(2, dtype=torch.int64, device=some.device)
    try:
        # public API: recv from any source returns the sender (the group's timeout applies)
        sender = some.dist.recv(hdr, src=None, tag=HEADER)
    except Exception as e:
        raise DistributedError(f"rank {some.me}: waiting for a header from any trainer failed "
                               f"({type(e).__name__}: {str(e).strip()[:200]}); a trainer "
                               "probably died") from e
    if int(hdr[0]) == STOP:
        active.remove(sender)
        return None
    return sender


register_op("listen_and_serv", ["X*!"], ["Out*!"],
            {"sub_block": ("block", None), "grads": ("strs", []), "params": ("strs", []),
             "trainers": ("ints", []), "mode": ("str", "sync"), "fan_in": ("int", 0),
             "timeout": ("float", 60.0), "sparse": ("strs", [])},
            infer=_no_infer, grad=None, inplace=True, control=True)(listen_and_serv)
