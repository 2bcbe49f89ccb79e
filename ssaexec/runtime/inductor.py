"""``InductorLowering``: each segment's body compiled by Inductor (``compiler="inductor"``).

The compiled path's segments (``runtime.node_graph``) with one more step: the
segment's generated code (``runtime.codegen``) is traced into an fx graph of its
ATen ops and compiled by Inductor (``torch._inductor.compile_fx``), which fuses
its kernels. Collectives, fetches and the commit phase stay as they are: the
node graph, the scheduler and the memory plan are the compiled runner's. One
place in one process is one segment: the whole step, forward, backward and
update, compiled as one graph.

Per segment, in order:

1. **First run: record.** The generated code runs as on the compiled path, and
   the values it loads from its scope and stores into it are recorded: they are
   the compiled function's inputs and outputs, in that order.
2. **Compile** (second run, and again for each new signature of the inputs:
   shapes, strides, dtypes, devices; at most ``MAX_SIGNATURES`` kept). The code
   is traced with ``make_fx`` on copies of the inputs (tracing runs the kernels:
   the real values must not be updated twice), the graph is rewritten where
   Inductor is known to be wrong (``_alpha_as_mul``), and compiled. In-place
   updates of parameters stay in place: Inductor copies mutated inputs back.
   Progress: a line before and after each compile (on stderr, or ``notes``). One
   compile runs at a time in the process (places' threads take turns).
3. **Run**: the compiled function on the scope's current values; the outputs are
   stored into the scope under the recorded names.

Fallback. A segment that cannot be compiled runs its generated code, as on the
compiled path, and says so once, on one line, naming the segment and the reason
(``fallbacks`` keeps them, for ``ssaexec stats``): a traced graph that draws
random numbers (an ATen op tagged ``nondeterministic_seeded``: the per-step seeds
of ``runtime.rng`` are not inputs of the graph yet; attention without dropout
draws nothing and compiles), control ops (their
sub-blocks run on our scheduler), values in the scope that are not tensors, a
trace or a compile that fails. A step never fails because Inductor could not
compile it.

Errors. An error raised by a compiled segment names the segment, its place and
its ops' types (the op inside fused code cannot be told); the same inputs on the
generated code name the op and its program line.

Known Inductor defect worked around (torch 2.13, CPU and CUDA): the pattern that
turns ``add(x, mm(a, b), alpha=s)`` into ``addmm`` drops ``alpha`` (pytorch
issues 167313, 196577), so an SGD update ``param.add_(grad, alpha=-lr)`` of a
gradient made by a matmul came out as ``param + grad``. ``_alpha_as_mul``
rewrites every ``add``/``sub`` with ``alpha`` as an explicit multiplication
before Inductor sees the graph (float64 results then differ from eager by the
last bit at most: a multiply and an add instead of one fused step).
"""

import shutil
import sys
import threading
import time

import torch

from ..errors import OpError, SSAExecError
from ..ops.optim import LR_AS_TENSOR
from ..ops.registry import get_op_def
from .compiled import SegmentLowering

__all__ = ["InductorLowering", "MAX_SIGNATURES", "check_compiler"]

MAX_SIGNATURES = 8  # compiled graphs kept per segment (one per signature of its inputs)
# Places run their segments on several threads, and their first steps compile at the same
# time; tracing and Inductor keep process-wide state (dispatch modes, configs, caches), so
# one compile runs at a time
_COMPILE_LOCK = threading.Lock()

_aten = torch.ops.aten
_ALPHA_OPS = (_aten.add.Tensor, _aten.add_.Tensor, _aten.sub.Tensor, _aten.sub_.Tensor)


def check_compiler(compiler, places):
    """Raise a clear ``SSAExecError`` when ``compiler`` cannot run on ``places``."""
    if compiler is None:
        return
    if compiler != "inductor":
        raise SSAExecError(f"compiler must be None or 'inductor', got {compiler!r}")
    if any(not p.is_cuda for p in places) and \
            not any(shutil.which(cc) for cc in ("g++", "c++", "clang++")):
        raise SSAExecError("compiler='inductor' on CPU places needs a C++ compiler, and none "
                           "was found on PATH (g++, c++ or clang++): install one, e.g. "
                           "'apt install g++' (Debian, Ubuntu) or 'dnf install gcc-c++'")


class InductorLowering:
    """Segments compiled by Inductor, on top of the compiled path's lowering.

    Composed, not derived: the partition, the memory plan, the handles' bodies and
    the generated code are ``SegmentLowering``'s; this adds the compiled bodies.
    ``notes`` is where the one-line fallback messages go (default: stderr).
    """

    __slots__ = ("base", "fallbacks", "compiles", "notes")
    compiled = True
    rebindable = True

    def __init__(self, keep_fetched=False, notes=None):
        self.base = SegmentLowering(keep_fetched)
        self.fallbacks = []  # (segment name, reason)
        self.compiles = 0  # graphs compiled by Inductor
        self.notes = notes

    @property
    def clones(self):
        return self.base.clones

    @property
    def alias(self):
        return self.base.alias

    def partition(self, graph, collective, commit):
        return self.base.partition(graph, collective, commit)

    def prepare(self, runner):
        return self.base.prepare(runner)

    def handle_body(self, handle):
        return self.base.handle_body(handle)

    def begin_step(self):
        self.base.begin_step()

    def segment_body(self, seg):
        return _CompiledSegment(self, seg, self.base.segment_body(seg)).run

    def fall_back(self, seg, reason):
        self.fallbacks.append((seg.name, reason))
        self.say(f"ssaexec: {seg.place} segment {seg.id} ({seg.name}) runs uncompiled: "
                 f"{reason}")

    def say(self, line):
        """One line of progress or fallback: to ``notes`` if given, else to stderr."""
        if self.notes is not None:
            self.notes.append(line)
        else:
            print(line, file=sys.stderr, flush=True)


def _refusal(seg):
    """Why ``seg`` cannot be compiled from its ops alone, or None."""
    for h in seg.handles:
        op = getattr(h, "op", None)
        if op is None:
            continue
        if get_op_def(op.type).is_control:
            return f"{h.name} is a control op (its sub-blocks run on the scheduler)"
    return None


class _Refused(Exception):
    """The segment's graph is one Inductor would compile, but not exactly."""


def _signature(values):
    return tuple((tuple(t.shape), tuple(t.stride()), t.dtype, str(t.device)) for t in values)


class _CompiledSegment:
    """The body of one segment: record, then compile per input signature, then run."""

    __slots__ = ("lowering", "seg", "fallback", "scopes", "loads", "stores", "graphs",
                 "refused")

    def __init__(self, lowering, seg, fallback):
        self.lowering, self.seg, self.fallback = lowering, seg, fallback
        self.scopes = lowering.base.calls.scopes
        self.loads = self.stores = None
        self.graphs = {}  # input signature -> compiled function
        self.refused = _refusal(seg)
        if self.refused is not None:
            lowering.fall_back(seg, self.refused)

    def run(self):
        if self.refused is not None:
            return self.fallback()
        scope = self.scopes[self.seg.place_idx]
        if self.loads is None:
            return self._record(scope)
        inputs = [scope.find_var(n) for n in self.loads]
        if not all(isinstance(t, torch.Tensor) for t in inputs):
            bad = next(n for n, t in zip(self.loads, inputs, strict=True)
                       if not isinstance(t, torch.Tensor))
            return self._refuse(f"its input {bad!r} is not a tensor")
        key = _signature(inputs)
        fn = self.graphs.get(key)
        if fn is None:
            if len(self.graphs) >= MAX_SIGNATURES:
                return self.fallback()  # more shapes than kept: this one runs uncompiled
            try:
                with _COMPILE_LOCK:
                    fn = self._compile(inputs)
            except _Refused as e:
                return self._refuse(str(e))
            except Exception as e:  # noqa: BLE001 - any failure of tracing or Inductor
                return self._refuse(f"Inductor could not compile it ({type(e).__name__}: "
                                    f"{_first_line(e)})")
            self.graphs[key] = fn
        try:
            outs = fn(*inputs)
        except Exception as e:
            types = sorted({getattr(h, "op_type", h.kind) for h in self.seg.handles})
            raise OpError(f"While executing {self.seg.name} compiled by Inductor on "
                          f"{self.seg.place} (ops: {', '.join(types)}): "
                          f"{type(e).__name__}: {e}", "segment", self.seg.place) from e
        vars_ = scope.vars
        for n, v in zip(self.stores, outs, strict=True):
            vars_[n] = v

    def _refuse(self, reason):
        self.refused = reason
        self.lowering.fall_back(self.seg, reason)
        return self.fallback()

    def _record(self, scope):
        loads, stores = [], []
        seen = set()
        find = scope.find_var

        def load(name):
            if name not in seen:
                seen.add(name)
                loads.append(name)
            return find(name)

        class Stores(dict):
            __slots__ = ()

            def __setitem__(self, name, value):
                if name not in self:
                    stores.append(name)
                dict.__setitem__(self, name, value)

        out = Stores()
        self.seg.lowered.fn(out, load)
        scope.vars.update(out)
        self.loads, self.stores = loads, stores

    def _compile(self, inputs):
        from torch._inductor.compile_fx import compile_fx
        from torch.fx.experimental.proxy_tensor import make_fx
        body, loads, stores = self.seg.lowered.fn, self.loads, self.stores

        def pure(*values):
            env = dict(zip(loads, values, strict=True))
            out = {}
            body(out, env.get)
            return tuple(out[n] for n in stores)

        # tracing runs the kernels: on copies, so the step is not applied twice; the
        # learning rate stays an input (a schedule changes it between steps)
        copies = [t.clone() for t in inputs]
        token = LR_AS_TENSOR.set(True)
        try:
            gm = make_fx(pure, tracing_mode="real")(*copies)
        finally:
            LR_AS_TENSOR.reset(token)
        drawn = next((n.target for n in gm.graph.nodes if _draws(n)), None)
        if drawn is not None:
            raise _Refused(f"it draws random numbers ({drawn}): its per-step seed is not a "
                           "graph input yet")
        _alpha_as_mul(gm)
        seg = self.seg
        self.lowering.say(f"ssaexec: compiling {seg.place} segment {seg.id} "
                          f"({len(seg.handles)} ops) with Inductor ...")
        t0 = time.perf_counter()
        fn = compile_fx(gm, copies)
        self.lowering.compiles += 1
        self.lowering.say(f"ssaexec: {seg.place} segment {seg.id} compiled in "
                          f"{time.perf_counter() - t0:.1f} s")
        return fn


def _draws(node):
    """Whether fx ``node`` draws random numbers: an ATen op tagged
    ``nondeterministic_seeded`` whose probability argument (``dropout_p``, ``p``), if it
    has one, is not 0 (attention without dropout draws nothing)."""
    target = node.target
    if node.op != "call_function" or \
            torch.Tag.nondeterministic_seeded not in getattr(target, "tags", ()):
        return False
    for i, arg in enumerate(target._schema.arguments):
        if arg.name in ("dropout_p", "p"):
            value = node.args[i] if i < len(node.args) else \
                node.kwargs.get(arg.name, arg.default_value)
            return value != 0
    return True


def _alpha_as_mul(gm):
    """Rewrite ``add``/``sub`` with ``alpha`` as a multiplication (see the module doc)."""
    g = gm.graph
    changed = False
    for n in list(g.nodes):
        if n.op != "call_function" or n.target not in _ALPHA_OPS:
            continue
        alpha = n.kwargs.get("alpha", 1)
        if alpha == 1:
            continue
        with g.inserting_before(n):
            scaled = g.call_function(_aten.mul.Tensor, (n.args[1], alpha))
        n.args = (n.args[0], scaled) + tuple(n.args[2:])
        n.kwargs = {k: v for k, v in n.kwargs.items() if k != "alpha"}
        changed = True
    if changed:
        g.lint()
        gm.recompile()
    return changed


def _first_line(e):
    text = str(e).strip().splitlines()
    return text[0][:200] if text else ""
