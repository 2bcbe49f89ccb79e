"""NCCL collectives for places on distinct GPUs of one process, and the backend policy.

One process, several GPUs: the places' tensors are summed by NCCL, one
communicator per device created together (``ncclCommInitAll``), each
collective one NCCL group (``groupStart``/``groupEnd``) with one call per place
on that device's current stream. The runtime makes the first place's
communication stream current and enters the other devices' communication
streams too (``runtime.streams``), so the calls run on the comm streams.

Policy (``choose_local_collective``). It is decided from the places' device
indices alone, before anything touches CUDA or imports cupy:

* CPU places, CPU and CUDA places mixed, one place, or several places on one
  GPU: ``LocalCollective`` (copy and add in place order). NCCL refuses two
  ranks on one device, so if *some* places share a GPU the whole executor
  keeps the local collective and the notice names the shared device.
* places on distinct GPUs: ``CupyNcclCollective`` when cupy imports with its
  NCCL library, else ``TorchNcclCollective`` when torch was built with NCCL
  (``torch.cuda.nccl``), else ``LocalCollective``. A backend whose set-up
  fails (``initAll`` raising, say) is skipped the same way.
* ``prefer`` ("cupy", "torch-nccl" or "local") forces a backend; one that
  cannot be used raises ``SSAExecError`` saying why and how to install it
  (``pip install cupy-cuda12x`` / ``cupy-cuda13x``, matching
  ``torch.version.cuda``).

Processes are not this module's business: a multi-process run uses
``dist.group_collective.ProcessGroupCollective`` (torch.distributed).

The decision (``plan_backend``), the dtype table (``NCCL_DTYPES``) and the
messages (``install_hint``, ``describe_plan``) are pure and tested on CPU;
``choose_local_collective`` only adds the import probes and the construction.
Results equal ``LocalCollective``'s up to the order of the float sums (NCCL
picks its own ring order); ``average=True`` sums, then divides.

Sparse gradients (``ops.sparse``, an embedding's): NCCL moves dense buffers only,
and densifying would cost the whole table per step, so the collectives hand them
to ``LocalCollective`` (the one sparse policy, ``runtime.collective``): every
place's rows and values are gathered on the first place's device, coalesced into
the sum, and copied back to each place. ``communicator_buffers`` is what reaches
NCCL: dense, contiguous buffers, never a sparse tensor.
"""

from typing import NamedTuple

import torch

from ..core.compat import has_torch_nccl
from ..core.errors import SSAExecError
from .collective import LocalCollective, is_sparse_collective

__all__ = ["CupyNcclCollective", "TorchNcclCollective", "choose_local_collective",
           "communicator_buffers",
           "plan_backend", "describe_plan", "device_indices", "nccl_dtype", "cupy_wheel",
           "install_hint", "cupy_unavailable", "torch_nccl_unavailable", "NCCL_DTYPES",
           "BACKENDS", "Plan"]

# the names ``prefer`` accepts, in fallback order
BACKENDS = ("cupy", "torch-nccl", "local")
TITLES = {"cupy": "cupy NCCL", "torch-nccl": "torch.cuda.nccl", "local": "local"}

# torch dtype -> the ``cupy.cuda.nccl`` constant carrying NCCL's ncclDataType_t
NCCL_DTYPES = {
    torch.float32: "NCCL_FLOAT32",
    torch.float16: "NCCL_FLOAT16",
    torch.bfloat16: "NCCL_BFLOAT16",
    torch.float64: "NCCL_FLOAT64",
    torch.int32: "NCCL_INT32",
    torch.int64: "NCCL_INT64",
    torch.uint8: "NCCL_UINT8",
    torch.int8: "NCCL_INT8",
}


def nccl_dtype(dtype, nccl=None):
    """The NCCL datatype of a torch dtype: its constant's name, or its value from ``nccl``."""
    name = NCCL_DTYPES.get(dtype)
    if name is None:
        known = ", ".join(str(d).replace("torch.", "") for d in NCCL_DTYPES)
        raise SSAExecError(f"NCCL collectives do not take {str(dtype).replace('torch.', '')} "
                           f"tensors (supported: {known})")
    return name if nccl is None else getattr(nccl, name)


# --- install hints (pure) -----------------------------------------------------------------
def cupy_wheel(cuda_version):
    """The cupy wheel for ``torch.version.cuda`` (``"12.8"`` -> ``"cupy-cuda12x"``), or None."""
    if not cuda_version:
        return None
    major = str(cuda_version).split(".")[0]
    return f"cupy-cuda{major}x" if major.isdigit() else None


def install_hint(cuda_version):
    """One sentence saying how to install cupy for the CUDA version torch was built with."""
    wheel = cupy_wheel(cuda_version)
    if wheel is None:
        return ("this torch has no CUDA (torch.version.cuda is None): install a CUDA build of "
                "torch, then `pip install cupy-cuda13x` or `pip install cupy-cuda12x` matching "
                "its torch.version.cuda")
    extra = f"ssaexec[cuda{wheel[len('cupy-cuda'):-1]}]"
    return (f"install it with `pip install {wheel}` (for torch.version.cuda {cuda_version}) "
            f"or `pip install '{extra}'`")


# --- the decision (pure) ------------------------------------------------------------------
class Plan(NamedTuple):
    """A backend name (one of ``BACKENDS``) and why it was chosen ("" when nothing to say)."""
    backend: str
    reason: str


def device_indices(places):
    """The CUDA device index of each place, None for a CPU place (touches no GPU).

    Takes ``ssaexec`` places, ``torch.device`` objects or device strings.
    """
    out = []
    for p in places:
        if hasattr(p, "is_cuda") and hasattr(p, "kind"):  # an ssaexec Place
            out.append(p.device_index if p.is_cuda else None)
            continue
        d = torch.device(p)
        out.append((d.index or 0) if d.type == "cuda" else None)
    return out


def _devices(indices):
    return ", ".join(f"cuda:{d}" for d in indices)


def _situation(indices):
    """(NCCL can serve these places, why not / what to say)."""
    if not indices:
        return False, "no places"
    if all(d is None for d in indices):
        return False, "CPU places"
    if any(d is None for d in indices):
        return False, "CPU and CUDA places mixed"
    shared = {}
    for pi, d in enumerate(indices):
        shared.setdefault(d, []).append(pi)
    shared = {d: pis for d, pis in shared.items() if len(pis) > 1}
    if not shared:
        return True, ""
    if len(shared) == 1 and len(set(indices)) == 1:
        return False, f"all {len(indices)} places on cuda:{indices[0]}"
    where = "; ".join(f"cuda:{d} holds places {', '.join(map(str, pis))}"
                      for d, pis in sorted(shared.items()))
    return False, f"{where}, and NCCL refuses two ranks on one device"


def plan_backend(indices, why_not, prefer=None):
    """Choose the collective backend for places on CUDA devices ``indices``.

    Parameters
    ----------
    indices : list of (int or None)
        Each place's CUDA device index, None for a CPU place (``device_indices``).
    why_not : callable
        ``why_not(backend)`` is None when that backend can be used, else a
        one-line reason; called only for the NCCL backends the decision reaches
        (so a plain dict's ``get`` does for tests).
    prefer : str, optional
        One of ``BACKENDS`` to force, or None / "auto" for the policy.

    Returns
    -------
    Plan
        Raises ``SSAExecError`` when ``prefer`` names a backend that cannot serve.
    """
    if prefer in (None, "auto"):
        prefer = None
    elif prefer not in BACKENDS:
        raise SSAExecError(f"unknown collective backend {prefer!r}: use one of "
                           f"{', '.join(BACKENDS)} (or None for the automatic choice)")
    if prefer == "local":
        return Plan("local", "forced")
    nccl_ok, situation = _situation(indices)
    # one place on one GPU is a valid (1-rank) communicator, but only worth it when asked
    if len(indices) == 1 and indices[0] is not None:
        nccl_ok, situation = prefer is not None, "one place"
    if prefer is not None:
        if not nccl_ok:
            raise SSAExecError(f"collective backend {prefer!r} cannot serve these places "
                               f"({situation}): NCCL needs one place per GPU; use "
                               "prefer='local' or None")
        why = why_not(prefer)
        if why:
            raise SSAExecError(f"collective backend {prefer!r} cannot be used: {why}")
        return Plan(prefer, "forced")
    if not nccl_ok:
        return Plan("local", situation)
    skipped = []
    for name in BACKENDS[:-1]:
        why = why_not(name)
        if not why:
            return Plan(name, "; ".join(skipped))
        skipped.append(f"{TITLES[name]}: {why}")
    return Plan("local", "no NCCL backend: " + "; ".join(skipped))


def describe_plan(plan, indices):
    """The one-line notice: ``collective backend: cupy NCCL over cuda:0, cuda:1``."""
    if plan.backend == "local":
        text = "collective backend: local"
    else:
        text = f"collective backend: {TITLES[plan.backend]} over {_devices(indices)}"
    return f"{text} ({plan.reason})" if plan.reason else text


# --- the probes (import, no GPU work) -----------------------------------------------------
def _one_line(exc):
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def cupy_unavailable():
    """None when ``cupy.cuda.nccl`` imports with its NCCL library, else why not (one line)."""
    hint = install_hint(torch.version.cuda)
    try:
        from cupy.cuda import nccl
    except ImportError as e:
        if isinstance(e, ModuleNotFoundError) and (e.name or "").split(".")[0] == "cupy":
            return f"cupy is not installed; {hint}"
        return f"cupy does not import ({_one_line(e)}); {hint}"
    except Exception as e:  # a broken install: wrong CUDA major, missing driver, ...
        return f"cupy does not import ({_one_line(e)}); reinstall it: {hint}"
    if not getattr(nccl, "available", False) or not hasattr(nccl, "NcclCommunicator"):
        major = (cupy_wheel(torch.version.cuda) or "cupy-cuda12x")[len("cupy-cuda"):-1]
        return ("cupy found no NCCL library (cupy.cuda.nccl.available is False): "
                f"`pip install nvidia-nccl-cu{major}`")
    return None


def torch_nccl_unavailable():
    """None when torch was built with NCCL (``torch.cuda.nccl``), else why not (one line)."""
    if torch.version.cuda is None:
        return "this torch build has no CUDA (torch.version.cuda is None)"
    try:
        import torch.cuda.nccl as tnccl
    except Exception as e:
        return f"torch.cuda.nccl does not import ({_one_line(e)})"
    if not has_torch_nccl() or not tnccl.is_available([]):
        return "this torch build has no NCCL (torch.cuda.nccl is not available)"
    return None


PROBES = {"cupy": cupy_unavailable, "torch-nccl": torch_nccl_unavailable}


def choose_local_collective(places, prefer=None):
    """The collective for ``places`` of one process: ``(collective, backend name, notice)``.

    ``places``: ssaexec places (or torch devices) in place order. ``prefer``:
    "cupy", "torch-nccl", "local" or None (the policy of the module docstring).
    The backend name is one of ``BACKENDS``; the notice is one line.
    """
    indices = device_indices(places)
    failed = {}  # backends whose construction raised: skipped on the next decision

    def why_not(name):
        if name in failed:
            return failed[name]
        probe = PROBES.get(name)
        return probe() if probe is not None else None

    while True:
        plan = plan_backend(indices, why_not, prefer)
        if plan.backend == "local":
            return LocalCollective(), "local", describe_plan(plan, indices)
        kind = CupyNcclCollective if plan.backend == "cupy" else TorchNcclCollective
        try:
            coll = kind(indices)
        except Exception as e:
            if prefer is not None:
                raise SSAExecError(f"collective backend {plan.backend!r} failed to start over "
                                   f"{_devices(indices)}: {_one_line(e)}") from e
            failed[plan.backend] = f"set-up failed ({_one_line(e)})"
            continue
        return coll, plan.backend, describe_plan(plan, indices)


# --- the collectives ----------------------------------------------------------------------
def communicator_buffers(tensors, label=None):
    """The buffers NCCL reads and writes in place of ``tensors``: each tensor itself when
    it is contiguous, else a contiguous copy that the caller copies back.

    NCCL takes a pointer and an element count, so a sparse tensor (which has no such
    buffer; ``.contiguous()`` raises on it) is refused here: the collectives route sparse
    gradients to ``LocalCollective`` first (module docstring).
    """
    if is_sparse_collective(tensors, label):
        raise SSAExecError(f"{label or 'NCCL collective'}: sparse tensors have no dense "
                           "buffer for NCCL; they are gathered by rows (LocalCollective)")
    return [t if t.is_contiguous() else t.contiguous() for t in tensors]


def _device_index(d):
    if isinstance(d, int):
        return d
    d = torch.device(d)
    if d.type != "cuda":
        raise SSAExecError(f"NCCL collectives need CUDA devices, got {d}")
    return torch.cuda.current_device() if d.index is None else d.index


class _NcclBase(LocalCollective):
    """In-place NCCL collectives over one tensor per device, in ``devices`` order."""

    __slots__ = ("devices",)
    # a real NCCL call even with one place (the 1-GPU communicator runs the multi-GPU
    # path), and compressed all-reduce sends the wire dtype over NCCL
    local_only = False

    # why the library cannot be used (None when it can): a probe above
    unavailable = None

    def __init__(self, devices):
        self.devices = [_device_index(d) for d in devices]
        if not self.devices:
            raise SSAExecError("an NCCL collective needs at least one device")
        if len(set(self.devices)) != len(self.devices):
            raise SSAExecError(f"NCCL refuses two ranks on one device: devices "
                               f"{self.devices}; places sharing a GPU use LocalCollective")
        why = self.unavailable()
        if why:
            raise SSAExecError(why)

    def _check(self, tensors, label):
        got = [t.device.index if t.is_cuda else None for t in tensors]
        if got != self.devices:
            raise SSAExecError(f"{label or 'NCCL collective'}: tensors on devices {got}, the "
                               f"communicator spans {self.devices} (one tensor per device, "
                               "in place order)")
        t0 = tensors[0]
        for t in tensors[1:]:
            if t.dtype != t0.dtype or t.numel() != t0.numel():
                raise SSAExecError(f"{label or 'NCCL collective'}: tensors differ: "
                                   f"{t0.dtype} x {t0.numel()} vs {t.dtype} x {t.numel()}")

    def _in_place(self, tensors, label, launch):
        """Run ``launch(contiguous tensors)``; copy results back into non-contiguous ones."""
        self._check(tensors, label)
        bufs = communicator_buffers(tensors, label)
        launch(bufs)
        for t, b in zip(tensors, bufs, strict=True):
            if b is not t:
                t.copy_(b)

    def all_reduce(self, tensors, average=False, label=None):
        """Every tensor becomes the sum (or mean) of all of them."""
        if is_sparse_collective(tensors, label):  # gathered by rows (module docstring)
            self._check(tensors, label)
            return super().all_reduce(tensors, average, label)
        self._in_place(tensors, label, self._all_reduce)
        if average and len(tensors) > 1:
            for t in tensors:
                t.div_(len(tensors))
        return tensors

    def reduce(self, tensors, root, average=False, label=None):
        """``tensors[root]`` becomes the sum (or mean) of all; the others are unchanged."""
        if is_sparse_collective(tensors, label):
            self._check(tensors, label)
            return super().reduce(tensors, root, average, label)
        self._in_place(tensors, label, lambda bufs: self._reduce(bufs, root))
        acc = tensors[root]
        if average and len(tensors) > 1:
            acc.div_(len(tensors))
        return acc

    def broadcast(self, tensors, root, label=None):
        """Every tensor becomes a copy of ``tensors[root]``."""
        if is_sparse_collective(tensors, label):
            self._check(tensors, label)
            return super().broadcast(tensors, root, label)
        self._in_place(tensors, label, lambda bufs: self._broadcast(bufs, root))
        return tensors

    def all_gather(self, tensors, outputs=None, label=None):
        """Each place gets every place's tensor stacked in place order: ``[n, *shape]``.

        ``outputs`` (contiguous, one per place, ``n x numel`` elements) are
        allocated on each device's current stream when not given.
        """
        self._check(tensors, label)
        n = len(tensors)
        ins = communicator_buffers(tensors, label)
        if outputs is None:
            outputs = [torch.empty((n, *t.shape), dtype=t.dtype, device=t.device)
                       for t in tensors]
        for o, t in zip(outputs, ins, strict=True):
            if not o.is_contiguous() or o.numel() != n * t.numel() or o.device != t.device:
                raise SSAExecError(f"{label or 'all_gather'}: each output must be a contiguous "
                                   f"tensor of {n} x {t.numel()} elements on {t.device}")
        self._all_gather(ins, outputs)
        return outputs


class CupyNcclCollective(_NcclBase):
    """NCCL through cupy: ``NcclCommunicator.initAll(devices)``, one group per collective.

    ``devices``: the places' CUDA devices (``torch.device``, "cuda:1" or int),
    distinct, in place order. Each call launches on each tensor's device's
    current stream (the runtime makes the comm streams current).
    """

    __slots__ = ("nccl", "comms")
    unavailable = staticmethod(cupy_unavailable)

    def __init__(self, devices):
        super().__init__(devices)
        from cupy.cuda import nccl
        self.nccl = nccl
        self.comms = nccl.NcclCommunicator.initAll(list(self.devices))

    def _launch(self, method, ins, outs, *args):
        """One NCCL group: ``comm.<method>(send, recv, count, dtype, *args, stream)`` a place.

        ``count`` is the input's numel; ``stream`` the current stream of its device.
        """
        if not self.comms:
            raise SSAExecError("the NCCL communicators are closed (the executor was closed)")
        nccl = self.nccl
        dt = nccl_dtype(ins[0].dtype, nccl)
        nccl.groupStart()
        try:
            for comm, t, o in zip(self.comms, ins, outs, strict=True):
                getattr(comm, method)(t.data_ptr(), o.data_ptr(), t.numel(), dt, *args,
                                      torch.cuda.current_stream(t.device).cuda_stream)
        finally:
            nccl.groupEnd()

    def _all_reduce(self, bufs):
        self._launch("allReduce", bufs, bufs, self.nccl.NCCL_SUM)

    def _reduce(self, bufs, root):
        # NCCL writes the receive buffer on the root only: the others keep their values
        self._launch("reduce", bufs, bufs, self.nccl.NCCL_SUM, root)

    def _broadcast(self, bufs, root):
        self._launch("broadcast", bufs, bufs, root)

    def _all_gather(self, ins, outs):
        self._launch("allGather", ins, outs)

    def close(self):
        """Destroy the communicators (idempotent; the executor's ``close`` calls it once
        its workers are joined, so no collective is being enqueued)."""
        comms, self.comms = self.comms, []
        for comm in comms:
            comm.destroy()  # ncclCommDestroy; cupy zeroes its handle, so GC will not repeat it


class TorchNcclCollective(_NcclBase):
    """NCCL through ``torch.cuda.nccl`` (torch keeps one communicator set per device list).

    ``devices`` as for ``CupyNcclCollective``; the calls run on each device's
    current stream (``streams=None``). ``close`` has nothing to release: torch caches
    those communicators for the process and offers no call to destroy them.
    """

    __slots__ = ("tnccl",)
    unavailable = staticmethod(torch_nccl_unavailable)

    def __init__(self, devices):
        super().__init__(devices)
        import torch.cuda.nccl as tnccl
        self.tnccl = tnccl

    def _all_reduce(self, bufs):
        self.tnccl.all_reduce(bufs)

    def _reduce(self, bufs, root):
        self.tnccl.reduce(bufs, root=root)

    def _broadcast(self, bufs, root):
        self.tnccl.broadcast(bufs, root=root)

    def _all_gather(self, ins, outs):
        self.tnccl.all_gather(ins, outs)
