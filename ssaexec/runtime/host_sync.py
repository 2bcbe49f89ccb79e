"""A host-sync detector: what inside a step makes the host wait for a GPU, or feeds it.

A step should cost the host nothing but launches: its one sync by design is the
fetch. A kernel that reads a value on the host (``.item()``, ``bool(t)``,
``.tolist()``, indexing with a 0-dim tensor), makes a tensor there for a copy to
follow (``torch.tensor(...)``, a factory op without ``device``) or produces a
shape only its data decides (``nonzero``, boolean indexing) synchronises every
step on a GPU, and breaks CUDA-graph capture.

``HostSyncDetector(mode)`` is a context manager that watches what runs inside it:

* on every device, a ``TorchDispatchMode`` sees each ATen call (host reads,
  ``lift_fresh`` of host data, data-dependent shapes, copies between the host and
  a device) and a ``TorchFunctionMode`` the Python-level calls the dispatcher
  never sees (``.tolist()``, ``.numpy()``, a factory called without ``device``);
  on the CPU this is the proxy for a GPU, and on a place on the ``meta`` device
  (``place.MetaPlace``) the host-to-device copies show as well;
* on a GPU, ``torch.cuda.set_sync_debug_mode("warn")`` reports each synchronising
  CUDA call as well, attributed to the Python line that made it.

Policy. A finding matching a rule of ``allowed`` (kind and a source file on the
stack, each rule with its reason) is kept in ``allowed_findings`` and is not an
error; any other is appended to ``findings`` and, by ``mode``, warned about
(``"warn"``: a ``HostSyncWarning`` each) or raised at once (``"error"``:
``HostSyncError``, an ``SSAExecError``, so an executor passes it on unchanged;
CUDA's own reports raise when the detector exits). ``ALLOWED`` is the default list:
what a step does on the host by design.

Invariants and limits: both modes are thread-local, so the detector sees the ops
of the thread that enters it; run the executor with
``ExecutionStrategy(num_threads=1)`` (the synchronous mode: every op runs in the
caller) to see them all. CUDA's sync debug mode is process-wide. Nothing the
detector watches is changed; a step runs slower under it (each ATen call goes
through Python), so it is for tests and ``make gpu-check``, not for training.
"""

import os
import sys
import warnings

import torch
from torch.overrides import TorchFunctionMode

from ..core.compat import TorchDispatchMode
from ..core.errors import SSAExecError

__all__ = ["HostSyncDetector", "HostSync", "Allowed", "ALLOWED", "HostSyncError",
           "HostSyncWarning", "KINDS", "CUDA_SYNC_REPORT", "split_cuda_log"]

# what a finding is
KINDS = {
    "host read": "a value read on the host (.item(), bool(t), .tolist(), a 0-dim index)",
    "host tensor": "a tensor made from host data inside the step (torch.tensor, as_tensor)",
    "default device": "a factory called without device= (the host's, whatever the place)",
    "data-dependent shape": "a result whose shape its data decides (nonzero, masks)",
    "copy to device": "a host-to-device copy of a step value",
    "copy to host": "a blocking device-to-host copy",
    "cuda sync": "a synchronising CUDA call (torch.cuda.set_sync_debug_mode)",
}

_HOST_READS = {"aten._local_scalar_dense.default", "aten.item.default", "aten.equal.default",
               "aten.is_nonzero.default"}
_HOST_TENSORS = {"aten.lift_fresh.default", "aten.lift_fresh_copy.default"}
# overload packets whose result size depends on the data (always, or as checked below)
_DATA_SHAPED = {"aten.nonzero", "aten.argwhere", "aten.masked_select", "aten._unique",
                "aten._unique2", "aten.unique_dim", "aten.unique_consecutive",
                "aten.unique_dim_consecutive", "aten.bincount", "aten.repeat_interleave",
                "aten.index", "aten.index_put", "aten.index_put_", "aten._index_put_impl_",
                "aten._coalesce"}
_FACTORIES = {torch.full, torch.zeros, torch.ones, torch.empty, torch.arange, torch.rand,
              torch.randn, torch.randint, torch.linspace, torch.logspace, torch.eye,
              torch.empty_strided, torch.scalar_tensor, torch.randperm}
_HOST_READ_METHODS = {torch.Tensor.tolist, torch.Tensor.numpy, torch.Tensor.__array__}

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # .../ssaexec/
_SELF = os.path.abspath(__file__)


class HostSyncError(SSAExecError):
    """A step did something on the host it must not (``HostSyncDetector(mode="error")``)."""


class HostSyncWarning(UserWarning):
    """A step did something on the host it should not (``HostSyncDetector(mode="warn")``)."""


class Allowed:
    """A finding allowed by design: its ``kind``, a source file on the stack, and why.

    ``where`` is a path inside the package (``"ssaexec/data/feed.py"``), optionally with a
    function's qualified name (``"ssaexec/ops/optim.py:_minus_lr"``, which covers the
    functions nested in it too), matched against every ssaexec frame on the stack.
    """

    __slots__ = ("kind", "where", "reason")

    def __init__(self, kind, where, reason):
        if kind not in KINDS:
            raise ValueError(f"unknown host-sync kind {kind!r}; one of {sorted(KINDS)}")
        self.kind, self.where, self.reason = kind, where, reason

    def covers(self, stack):
        """Whether ``where`` is on ``stack`` (a finding's; the detector matched the kind)."""
        w = self.where
        return any(f == w or (f.startswith(w) and f[len(w)] in ":.") for f in stack)

    def __repr__(self):
        return f"Allowed({self.kind!r}, {self.where!r})"


class HostSync:
    """One finding: ``kind`` (``KINDS``), what ran (``call``), where (innermost first)."""

    __slots__ = ("kind", "call", "stack", "op", "reason")

    def __init__(self, kind, call, stack, op=None):
        self.kind = kind
        self.call = call
        self.stack = stack    # "ssaexec/ops/lr.py:lr_schedule" per ssaexec frame, innermost first
        self.op = op          # the program op, when the readable path ran it ("op #3 'x'")
        self.reason = None    # the rule's reason, for an allowed finding

    @property
    def where(self):
        return self.stack[0] if self.stack else "<outside ssaexec>"

    def __str__(self):
        op = f" in {self.op}" if self.op else ""
        return f"{self.kind}: {self.call}{op} at {self.where} ({KINDS[self.kind]})"

    __repr__ = __str__


ALLOWED = (
    Allowed("copy to device", "ssaexec/data/feed.py",
            "a step's inputs come from the host: the feed is the one host-to-device copy "
            "a step needs (non-blocking; asynchronous when the feed is pinned, as "
            "se.DataLoader's are)"),
    Allowed("host tensor", "ssaexec/data/feed.py",
            "feeds given as numpy arrays or lists become tensors on the host, then move"),
    Allowed("default device", "ssaexec/runtime/handle_calls.py:HandleCalls._fetch_fn",
            "the fetch's buffer is pinned host memory by design (torch.empty(pin_memory=))"),
    Allowed("copy to host", "ssaexec/runtime/handle_calls.py:HandleCalls._fetch_fn",
            "the fetch: the one read back a step has by design"),
    Allowed("copy to host", "ssaexec/execution/executor.py:Executor.run",
            "the sequential executor's fetch, after the step: the read back by design"),
    Allowed("host read", "ssaexec/ops/optim.py:_minus_lr",
            "CPU only by design: an update reads its lr as a number only when the lr is a "
            "CPU tensor (free there, and torch.optim's in-place form); on a device it "
            "multiplies by the lr tensor"),
    Allowed("host read", "ssaexec/ops/guards.py",
            "a program file is untrusted: the index arguments of the few ATen kernels that "
            "trust them are range-checked first (docs/security.md), one read per such op "
            "and step; a device-side assert would end the CUDA context instead. Programs "
            "built in this process (trusted) skip the checks"),
    Allowed("cuda sync", "ssaexec/ops/guards.py",
            "a program file is untrusted: the range check of an index argument reads its "
            "result on the host (the host read above), which waits for the device"),
    Allowed("data-dependent shape", "ssaexec/ops/guards_index.py:_nll_loss",
            "a program file is untrusted: nll_loss's guard checks the targets that are not "
            "ignore_index (a mask of them), one read per such op and step like every guard"),
    Allowed("cuda sync", "ssaexec/ops/sparse.py",
            "sparse gradients: coalescing the rows a batch touched sizes by the data (the "
            "data-dependent shape below), which waits for the device"),
    Allowed("data-dependent shape", "ssaexec/ops/sparse.py",
            "sparse gradients (embedding is_sparse=True) hold the rows a batch touched: "
            "coalescing them sizes by the data, a sync per step on a GPU that is the price of "
            "sparse updates (a dense gradient has none)"),
    Allowed("cuda sync", "ssaexec/data/feed.py",
            "a feed in pageable host memory is copied synchronously (feed pinned tensors, "
            "or use se.DataLoader, to make it asynchronous)"),
    Allowed("cuda sync", "ssaexec/execution/executor.py:Executor.run",
            "the sequential executor's fetch, after the step: the read back by design"),
    Allowed("cuda sync", "ssaexec/runtime/streams.py",
            "the end of a step waits for its streams (finish) so the fetch is complete"),
)


def _stack(depth=2):
    """The ssaexec frames of the caller's stack, innermost first, and the op running."""
    frames, op = [], None
    f = sys._getframe(depth)
    while f is not None:
        path = f.f_code.co_filename
        if path.startswith(_PACKAGE) and path != _SELF:
            rel = "ssaexec/" + path[len(_PACKAGE):].replace(os.sep, "/")
            frames.append(f"{rel}:{f.f_code.co_qualname}")
            if op is None and rel == "ssaexec/runtime/op_call.py" and f.f_code.co_name == "_run":
                op = getattr(f.f_locals.get("self"), "label", None)
        elif path.startswith("<ssaexec "):
            frames.append(f"{path}:{f.f_lineno}")  # a generated segment (runtime.codegen)
        f = f.f_back
    return frames, op


def _is_host(device):
    return device is None or torch.device(device).type == "cpu"


def _data_shaped(name, args, kwargs):
    packet, _, overload = name.rpartition(".")
    if packet == "aten.repeat_interleave":
        # repeats given as a tensor: the size is their sum, unless output_size says it
        return overload in ("Tensor", "self_Tensor") and kwargs.get("output_size") is None
    if packet in ("aten.index", "aten.index_put", "aten.index_put_", "aten._index_put_impl_"):
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)
                   for i in indices or ())
    return True


class _Dispatch(TorchDispatchMode):
    def __init__(self, detector):
        super().__init__()
        self.detector = detector

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = str(func)
        kind = None
        if name in _HOST_READS:
            kind = "host read"
        elif name in _HOST_TENSORS:
            kind = "host tensor"
        elif name == "aten._to_copy.default" and "device" in kwargs and \
                kwargs["device"] is not None:
            src, dst = args[0].device, torch.device(kwargs["device"])
            kind = _copy_kind(src, dst, kwargs.get("non_blocking", False))
        elif name == "aten.copy_.default":
            kind = _copy_kind(args[1].device, args[0].device,
                              args[2] if len(args) > 2 else kwargs.get("non_blocking", False))
        else:
            if name.rsplit(".", 1)[0] in _DATA_SHAPED and _data_shaped(name, args, kwargs):
                kind = "data-dependent shape"
        if kind is not None:
            self.detector._found(kind, name)
        return func(*args, **kwargs)


def _copy_kind(src, dst, non_blocking):
    if src == dst or src.type == dst.type == "cpu":
        return None
    if _is_host(src):
        return "copy to device"
    if _is_host(dst) and not non_blocking:
        return "copy to host"
    return None


class _Function(TorchFunctionMode):
    def __init__(self, detector):
        super().__init__()
        self.detector = detector

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _HOST_READ_METHODS:
            self.detector._found("host read", f"Tensor.{func.__name__}")
        elif func in _FACTORIES and kwargs.get("device") is None and \
                not any(isinstance(a, torch.device) for a in args):
            self.detector._found("default device", f"torch.{func.__name__}")
        return func(*args, **kwargs)


# torch's report of a synchronising call in sync debug mode "warn"
# (c10/cuda/CUDAFunctions.cpp, warn_or_error_on_sync); nothing else counts as one: torch
# 2.11's set_sync_debug_mode itself warns "Synchronization debug mode is a prototype
# feature and does not yet detect all synchronizing operations" (once a process)
CUDA_SYNC_REPORT = "called a synchronizing CUDA operation"


class _WarningLog:
    """Collects the warnings raised while entered (all of them, as ``catch_warnings(record=
    True)``), each with ``ssaexec_stack``: the ssaexec frames on the Python stack when it
    was raised, innermost first. torch turns a CUDA sync report into a Python warning when
    the synchronising call returns to Python, so the stack names the kernel or guard that
    made the call; the warning's own file is the detector's dispatch mode, which names
    nothing (the first GPU run's findings all said ``ssaexec/runtime/host_sync.py``)."""

    def __init__(self):
        self.entries = []
        self._catch = None

    def __enter__(self):
        self._catch = warnings.catch_warnings()
        self._catch.__enter__()
        warnings.simplefilter("always")
        warnings.showwarning = self._show  # catch_warnings puts the original back
        return self

    def _show(self, message, category, filename, lineno, file=None, line=None):
        w = warnings.WarningMessage(message, category, filename, lineno, file, line)
        w.ssaexec_stack = _stack(2)[0]
        self.entries.append(w)

    def __exit__(self, *exc):
        self._catch.__exit__(*exc)
        return False


def split_cuda_log(log, setup=0):
    """``(reports, others)``: the warnings caught while CUDA's sync debug mode was on.

    ``reports`` are torch's reports of a synchronising call (``CUDA_SYNC_REPORT``);
    ``others`` every other warning (the detector's own ``HostSyncWarning``, a step's
    unrelated warnings, torch's notice when the mode is turned on), to be warned again
    unchanged. The first ``setup`` entries were logged while the detector turned the mode
    on: its own setup, never a report."""
    reports, others = [], list(log[:setup])
    for w in log[setup:]:
        is_report = (not issubclass(w.category, HostSyncWarning)
                     and CUDA_SYNC_REPORT in str(w.message))
        (reports if is_report else others).append(w)
    return reports, others


class HostSyncDetector:
    """Watch a step for host syncs (module docstring); a context manager.

    Parameters
    ----------
    mode : {"warn", "error"}
        ``"warn"``: a ``HostSyncWarning`` per finding; ``"error"``: raise
        ``HostSyncError`` at the first (CUDA's reports: on exit).
    allowed : iterable of Allowed
        Findings by design (default ``ALLOWED``); matched ones go to
        ``allowed_findings`` with their reason.
    cuda : bool, optional
        Use ``torch.cuda.set_sync_debug_mode`` too (default: when CUDA is available).

    Attributes
    ----------
    findings : list of HostSync
        What the step did on the host that no rule allows.
    allowed_findings : list of HostSync
        What it did by design.
    """

    def __init__(self, mode="warn", allowed=ALLOWED, cuda=None):
        if mode not in ("warn", "error"):
            raise ValueError(f"HostSyncDetector mode must be 'warn' or 'error', got {mode!r}")
        self.mode = mode
        self.allowed = tuple(allowed)
        self._rules = {}  # kind -> the rules of that kind
        for rule in self.allowed:
            self._rules.setdefault(rule.kind, []).append(rule)
        self.cuda = torch.cuda.is_available() if cuda is None else bool(cuda)
        self.findings = []
        self.allowed_findings = []
        self._modes = None
        self._cuda_prev = None
        self._caught = None     # the catch_warnings that collects CUDA's reports
        self._cuda_log = None
        self._cuda_setup = 0    # how many of its entries turning the mode on logged

    def _found(self, kind, call, stack=None):
        if stack is None:
            stack, op = _stack(3)
        else:
            op = None
        finding = HostSync(kind, call, stack, op)
        for rule in self._rules.get(kind, ()):
            if rule.covers(stack):
                finding.reason = rule.reason
                self.allowed_findings.append(finding)
                return
        self.findings.append(finding)
        if self.mode == "error":
            raise HostSyncError(f"host sync inside a step: {finding}")
        warnings.warn(str(finding), HostSyncWarning, stacklevel=2)

    def __enter__(self):
        if self.cuda:
            self._cuda_prev = torch.cuda.get_sync_debug_mode()
            self._caught = _WarningLog()
            self._cuda_log = self._caught.__enter__().entries
            torch.cuda.set_sync_debug_mode("warn")
            # what turning the mode on logged (torch's notice that the mode is a prototype)
            # is the detector's own setup, never a report about the step
            self._cuda_setup = len(self._cuda_log)
        self._modes = (_Function(self), _Dispatch(self))
        for m in self._modes:
            m.__enter__()
        return self

    def __exit__(self, *exc):
        for m in reversed(self._modes):
            m.__exit__(*exc)
        self._modes = None
        if self.cuda:
            torch.cuda.set_sync_debug_mode(self._cuda_prev)
            self._caught.__exit__(*exc)
            self._caught = None
            log, self._cuda_log = self._cuda_log, None
            mode, self.mode = self.mode, "warn"  # CUDA's reports raise below, all at once
            before = len(self.findings)
            reports, others = split_cuda_log(log, self._cuda_setup)
            for w in others:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
            for w in reports:
                # where the call was made: the ssaexec frames on the stack when torch
                # reported it (the op's kernel, a guard), else the warning's own file
                path = w.filename
                where = ("ssaexec/" + path[len(_PACKAGE):].replace(os.sep, "/")
                         if path.startswith(_PACKAGE) else path)
                stack = getattr(w, "ssaexec_stack", None) or [where]
                self._found("cuda sync", str(w.message).splitlines()[0], stack)
            self.mode = mode
            syncs = self.findings[before:]
            if mode == "error" and exc[0] is None and syncs:
                raise HostSyncError("synchronising CUDA calls inside a step: " + "; ".join(
                    str(f) for f in syncs))
        return False

    def report(self):
        """The findings as text lines: those not allowed, then the allowed with reasons."""
        lines = [f"NOT ALLOWED {f}" for f in self.findings]
        lines += [f"allowed     {f} -- {f.reason}" for f in self.allowed_findings]
        return lines
