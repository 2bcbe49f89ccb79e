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
   shapes, strides, dtypes, devices; at most ``MAX_SIGNATURES`` kept: a bounded
   per-shape cache, not dynamic shapes; a shape beyond them runs the generated code,
   said once; ``bench/dynamic_shapes.py --compiler inductor`` measures it). The code
   is traced with ``make_fx`` on copies of the inputs (tracing runs the kernels:
   the real values must not be updated twice), the graph is rewritten where
   Inductor is known to be wrong (``_alpha_as_mul``), and compiled, with
   Inductor rounding low-precision intermediates as eager does
   (``emulate_precision_casts``: AMP's bf16 steps then equal the compiled path's
   to float32 rounding, 3e-8 after two Adam updates, instead of 1.6e-4). The
   compile runs in a tracing context with a shape env, which Inductor's FX graph
   cache needs (without one it bypasses the cache): a second process running the
   same program loads every graph from Inductor's on-disk cache. In-place
   updates of parameters stay in place: Inductor copies mutated inputs back.
   A CPU graph of ATen ops only is compiled with Inductor's C++ wrapper, which
   calls its kernels from C++ (``_cpp_wrapper_ok`` says when, and why not otherwise).
   Progress: a line before and after each compile (on stderr, or ``notes``). One
   compile runs at a time in the process (places' threads take turns).
3. **Run**: the compiled function on the scope's current values; the outputs are
   stored into the scope under the recorded names. The signature is the only check of
   the inputs: graphs are compiled without Inductor's size asserts, which would check
   every input again at every call (``size_asserts=False``; it also drops Inductor's
   checks of extern kernels' output layouts, which hold for inputs of one signature).

Fallback. A segment that cannot be compiled runs its generated code, as on the
compiled path, and says so once, on one line, naming the segment and the reason
(``fallbacks`` keeps them; ``inductor_summary`` says before any run which
segments control ops keep uncompiled, for ``ssaexec stats``): a draw outside a
seeded op or two under one seed (see Random numbers), control ops (their
sub-blocks run on our scheduler), values in the scope that are not tensors, an
op that reads a tensor's value on the host while traced (the graph would keep that
step's answer), an input that overlaps itself in memory (it has no copy of its own
layout to compile for), a trace or a compile that fails. A step never fails because
Inductor could not compile it; the record step's errors name the op, as the compiled
path's do.

Atomic steps. A compiled graph's kernels may update state in any order, so the
commit phase is always a segment of its own here (``SegmentLowering(atomic=True)``),
one place in one process included: forward and backward, then the updates.

Updates left to foreach. A commit segment of plain SGD and momentum updates only
(``FOREACH_UPDATES``) is not compiled: its generated code already runs them as one to
three ``torch._foreach_*`` calls over all the parameters (``runtime.fusion``), each
one pass over the tensors, and Inductor's fused kernel measured no faster on the
bench presets (one CPU place: SGD 0.92-1.03x, momentum 0.99-1.04x, in
``bench/update_compile.py``) while compiling it took up to 10 s (ResNet-18's 62
parameters: one kernel of 136 KB of C++). Adam's dozen passes fuse into one and are
compiled (1.07-1.84x). The rule reads the op types only, so every place and process
decides alike; ``inductor_summary`` lists such segments, and they run with no line
said (nothing failed).

Random numbers. A random op (dropout) draws from its per-step seed
(``runtime.rng``), and so does its compiled graph: the record run notes which
ops draw, in order; while tracing, each ATen call that draws (tagged
``nondeterministic_seeded``, with a non-zero probability) inside such an op
becomes one ``ssaexec::seeded_call`` node whose seed is a graph input; each
step passes that step's seeds. Inductor runs the call as it is (the draw is not
fused; what reads the mask is), so the masks are the compiled path's, bit for bit.

Errors. A compiled segment outside the commit phase that raises (an index out of
range, a kernel guard's assertion: ``ops.guards.TRACED``) has changed nothing that
outlives the step, so its generated code runs on the same inputs and raises the
compiled path's error, naming the op (if it does not raise, its results stand and
the segment runs uncompiled from then on). A commit segment that raises names the
segment, its place and its ops' types (the op inside fused code cannot be told),
and the runner reports it as it does any failure of the commit phase.

Known Inductor defect worked around (torch 2.13, CPU and CUDA): the pattern that
turns ``add(x, mm(a, b), alpha=s)`` into ``addmm`` drops ``alpha`` (pytorch
issues 167313, 196577), so an SGD update ``param.add_(grad, alpha=-lr)`` of a
gradient made by a matmul came out as ``param + grad``. ``_alpha_as_mul``
rewrites every ``add``/``sub`` with ``alpha`` as an explicit multiplication
before Inductor sees the graph (float64 results then differ from eager by the
last bit at most: a multiply and an add instead of one fused step).
"""

import contextlib
import os
import shutil
import sys
import threading
import time
import types

import torch

from ..core import compat
from ..core.compat import TorchDispatchMode
from ..core.errors import OpError, SSAExecError
from ..ops.guards import TRACED, GuardError
from ..ops.optim import LR_AS_TENSOR
from ..ops.registry import get_op_def
from . import pacing
from .compiled import SegmentLowering, summary_plan
from .rng import op_seed, register_call, seeded_call

__all__ = ["FOREACH_UPDATES", "InductorLowering", "MAX_SIGNATURES", "check_compiler",
           "check_vec_isa", "compile_graph", "inductor_summary", "missing_cpp"]

# optimizer updates whose foreach form (``ops.optim.FUSED``) is already one to three passes
# over each tensor: a commit segment of these only is not compiled (see the policy above)
FOREACH_UPDATES = frozenset({"sgd", "momentum"})
MAX_SIGNATURES = 8  # compiled graphs kept per segment (one per signature of its inputs)
# Places run their segments on several threads, and their first steps compile at the same
# time; tracing and Inductor keep process-wide state (dispatch modes, configs, caches), so
# one compile runs at a time
_COMPILE_LOCK = threading.Lock()

_aten = torch.ops.aten
_ALPHA_OPS = (_aten.add.Tensor, _aten.add_.Tensor, _aten.sub.Tensor, _aten.sub_.Tensor)
_HOST_READS = (_aten._local_scalar_dense.default, _aten.item.default)


def check_compiler(compiler, places):
    """Raise a clear ``SSAExecError`` when ``compiler`` cannot run on ``places``."""
    if compiler is None or compiler == "auto":  # "auto" never refuses (runtime.tiered)
        return
    if compiler != "inductor":
        raise SSAExecError(f"compiler must be None or 'inductor' or 'auto', got {compiler!r}")
    # what a compile needs of torch, refused now (at build time) rather than mid-step
    compat.require("inductor.compile_fx", "inductor.config", "inductor.tracing_context",
                   "inductor.tracing", "fx.make_fx", "fx.disable_proxy_modes_tracing",
                   "fx.get_dispatch_mode", "fx.dispatch_mode_key", "library.custom_op")
    missing = missing_cpp(places)
    if missing is not None:
        raise SSAExecError(f"compiler='inductor' {missing}")


def missing_cpp(places):
    """What CPU ``places`` lack for Inductor (a C++ compiler on PATH), or None; no import."""
    if any(not p.is_cuda for p in places) and \
            not any(shutil.which(cc) for cc in ("g++", "c++", "clang++")):
        return ("on CPU places needs a C++ compiler, and none was found on PATH (g++, c++ "
                "or clang++): install one, e.g. 'apt install g++' (Debian, Ubuntu) or "
                "'dnf install gcc-c++'")
    return None


class InductorLowering:
    """Segments compiled by Inductor, on top of the compiled path's lowering.

    Composed, not derived: the partition, the memory plan, the handles' bodies and
    the generated code are ``SegmentLowering``'s; this adds the compiled bodies.
    ``notes`` is where the one-line fallback messages go (default: stderr).
    """

    __slots__ = ("base", "fallbacks", "compiles", "cpp_wrapped", "foreach", "notes")
    compiled = True
    chatty = True  # a line before and after each compile (runtime.tiered: none, one at the switch)
    atomic = True  # a compiled segment may update state in any order: the commit phase apart
    rebindable = True
    # compile_graph's split_build: the one C++ unit, for the fastest steps (a blocking
    # compile is paid once; runtime.tiered's race with the straight-line steps splits it)
    split_build = False

    def __init__(self, keep_fetched=False, notes=None):
        self.base = SegmentLowering(keep_fetched, atomic=True)
        self.fallbacks = []  # (segment name, reason)
        self.compiles = 0  # graphs compiled by Inductor
        self.cpp_wrapped = 0  # of which with its C++ wrapper (``_cpp_wrapper_ok``)
        self.foreach = 0  # commit segments left to their foreach calls (``_left_to_foreach``)
        self.notes = notes

    @property
    def clones(self):
        return self.base.clones

    @property
    def alias(self):
        return self.base.alias

    @property
    def keep_fetched(self):
        return self.base.keep_fetched

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


def inductor_summary(graph, local_only=True):
    """What ``compiler="inductor"`` would compile of ``graph`` (``ssaexec stats``), without
    running it: the segments (the commit phase apart), and those refused before any
    trace, with the reason. Refusals found while tracing (a draw outside a seed, a
    failed compile) show only when the step runs, each on one line. The segments are
    the Inductor runner's own step plan (``compiled.summary_plan``)."""
    segs = summary_plan(graph, local_only, atomic=True).segments
    refused = [(f"{s.place} segment {s.id} ({s.name})", why) for s in segs
               for why in [_refusal(s) or _left_to_foreach(s)] if why is not None]
    return {"name": "inductor", "segments": len(segs),
            "commit_segments": sum(1 for s in segs if s.commit),
            "uncompiled": [{"segment": n, "why": w} for n, w in refused]}


def _refusal(seg):
    """Why ``seg`` cannot be compiled from its ops alone, or None."""
    for h in seg.handles:
        op = getattr(h, "op", None)
        if op is None:
            continue
        if get_op_def(op.type).is_control:
            return f"{h.name} is a control op (its sub-blocks run on the scheduler)"
    return None


def _left_to_foreach(seg):
    """Why commit segment ``seg`` runs its foreach calls uncompiled, or None: its ops are
    all ``FOREACH_UPDATES`` (the policy in the module docstring).
    ``SSAEXEC_INDUCTOR_FOREACH=0`` compiles them too (``bench/update_compile.py``)."""
    if not seg.commit or not seg.handles or \
            os.environ.get("SSAEXEC_INDUCTOR_FOREACH", "1") == "0":
        return None
    types = {getattr(getattr(h, "op", None), "type", None) for h in seg.handles}
    if not types <= FOREACH_UPDATES:
        return None
    return (f"its updates ({', '.join(sorted(types))}) run as fused foreach calls, "
            "which a compiled kernel measured no faster")


class _Refused(Exception):
    """The segment's graph is one Inductor would compile, but not exactly."""


def _signature(values):
    """What picks a compiled graph: each input's shape, strides, dtype and device. Built
    every step for each segment (tens of inputs), so from the tensors' own hashable
    attributes, with no conversions; a value that is not a tensor has no such signature."""
    try:
        return tuple([(t.shape, t.stride(), t.dtype, t.device) for t in values])
    except (AttributeError, TypeError):
        return None


class _CompiledSegment:
    """The body of one segment: record, then compile per input signature, then run."""

    __slots__ = ("lowering", "seg", "fallback", "scopes", "loads", "stores", "graphs",
                 "refused", "draws", "seeds", "ns", "full", "releases")

    def __init__(self, lowering, seg, fallback):
        self.lowering, self.seg, self.fallback = lowering, seg, fallback
        self.scopes = lowering.base.calls.scopes
        self.loads = self.stores = None
        self.draws = []  # (program seed, op index, place index) of each seeded draw, in order
        self.seeds = []  # one int64 scalar tensor per draw: its seed at this step
        self.ns = seg.lowered.fn.__globals__  # the generated code's names (_op_seed, _seeded)
        self.graphs = {}  # input signature -> compiled function
        self.full = False  # MAX_SIGNATURES graphs compiled, and said so
        self.releases = False  # its last graph has the C++ wrapper (runs without the lock)
        self.refused = _refusal(seg)
        if self.refused is not None:
            lowering.fall_back(seg, self.refused)
        elif _left_to_foreach(seg) is not None:
            self.refused = "foreach"  # by policy, not a failure: nothing is said
            lowering.foreach += 1

    @property
    def lock_free(self):
        """Whether this step's call is expected to release the interpreter lock for most
        of its time (its graph has the C++ wrapper): turns may run it beside another node
        (``Scheduler.run``). A hint for speed only: a wrong one runs the same ops."""
        return self.releases and self.refused is None

    def run(self):
        if self.refused is not None:
            return self.fallback()
        scope = self.scopes[self.seg.place_idx]
        if self.loads is None:
            return self._record(scope)
        inputs = self.inputs(scope)
        key = _signature(inputs)
        fn = self.graphs.get(key)
        if fn is None:
            # a new signature (or none): checked here, not on every step
            bad = next((n for n, t in zip(self.loads, inputs)
                        if not isinstance(t, torch.Tensor)), None)
            if bad is not None:
                return self._refuse(f"its input {bad!r} is not a tensor")
            if len(self.graphs) >= MAX_SIGNATURES:
                # more shapes than kept: this one runs uncompiled (said once: a run with
                # many sequence lengths should pad them to a few)
                if not self.full:
                    self.full = True
                    seg = self.seg
                    self.lowering.say(
                        f"ssaexec: {seg.place} segment {seg.id} ({seg.name}) has compiled "
                        f"{MAX_SIGNATURES} input shapes (MAX_SIGNATURES); other shapes run "
                        "uncompiled: pad the inputs to fewer shapes (e.g. sequence lengths "
                        "rounded up to a multiple of 64)")
                return self.fallback()
            try:
                with _COMPILE_LOCK:
                    fn = self._compile(inputs)
            except _Refused as e:
                return self._refuse(str(e))
            except (SSAExecError, GuardError):
                # a guard refused these inputs while tracing: the generated code raises
                # the same error, naming the op (and the segment stays compilable)
                return self.fallback()
            except Exception as e:  # noqa: BLE001 - any failure of tracing or Inductor
                return self._refuse(f"Inductor could not compile it ({type(e).__name__}: "
                                    f"{_first_line(e)})")
            self.graphs[key] = fn
        try:
            outs = fn(*inputs)
        except Exception as e:
            return self._failed(e)
        scope.vars.update(zip(self.stores, outs))  # one output per recorded store

    def inputs(self, scope):
        """The compiled function's arguments at this step: the recorded loads from
        ``scope``, then this step's seeds."""
        find, get = scope.find_var, scope.vars.get
        inputs = [t if (t := get(n)) is not None else find(n) for n in self.loads]
        if self.draws:
            # the step's seeds, written into tensors kept for it (a fill costs a quarter
            # of a new tensor); the graph reads them during the call only
            step = self.ns["_step"][0]
            seeds = self.seeds
            for t, d in zip(seeds, self.draws):
                t.fill_(op_seed(*d, step))
            inputs += seeds
        return inputs

    def _failed(self, e):
        """The compiled graph raised ``e``. Outside the commit phase it wrote nothing that
        outlives the step (``SegmentLowering(atomic=True)``): the generated code runs on
        the same inputs and raises the error naming the op and its program line. If it
        does not raise, its results stand, and the segment runs uncompiled from now on."""
        seg = self.seg
        if not seg.commit:
            result = self.fallback()
            self.refused = (f"its compiled graph raised where the generated code did not "
                            f"({type(e).__name__}: {_first_line(e)})")
            self.lowering.fall_back(seg, self.refused)
            return result
        types = sorted({getattr(h, "op_type", h.kind) for h in seg.handles})
        raise OpError(f"While executing {seg.name} compiled by Inductor on {seg.place} "
                      f"(ops: {', '.join(types)}): {type(e).__name__}: {e}", "segment",
                      seg.place) from e

    def _refuse(self, reason):
        """Refuse the segment (``refused``) and run this step's straight-line code."""
        self.refuse(reason)
        return self.fallback()

    def refuse(self, reason):
        """Keep the segment on its straight-line code from now on, said on one line;
        runs nothing (the caller runs the step's code once, itself)."""
        self.refused = reason
        self.lowering.fall_back(self.seg, reason)

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

        def noted_seed(program_seed, op_index, place_idx, step):
            self.draws.append((program_seed, op_index, place_idx))
            return op_seed(program_seed, op_index, place_idx, step)

        out = Stores()
        try:
            with _swapped(self.ns, _op_seed=noted_seed):
                self.seg.lowered.fn(out, load)
        except BaseException as e:  # noqa: B036 - Ctrl-C passes through unchanged
            # as the compiled path fails: the error names the op; the next step records
            self.draws.clear()
            err = self.seg.lowered.error(e) if isinstance(e, Exception) else e
            if err is e:
                raise
            raise err from e
        scope.vars.update(out)
        self.loads, self.stores = loads, stores
        self.seeds = [torch.zeros((), dtype=torch.int64) for _ in self.draws]

    def _compile(self, inputs):
        gm, copies = self._trace(inputs)
        return self._compile_traced(gm, copies)

    def _trace(self, inputs, pace=None):
        """The segment's fx graph of ATen ops, traced on copies of ``inputs``, and the
        copies (the example inputs it is compiled for). ``pace``: a ``pacing.Pace`` the
        trace waits for before each call of the generated code (a background trace)."""
        make_fx = compat.make_fx
        disable_proxy_modes_tracing = compat.disable_proxy_modes_tracing
        loads, stores = self.loads, self.stores
        # the generated code over a copy of its names: the trace swaps _op_seed and _seeded
        # in them, while the step's own code may run at the same time (runtime.tiered
        # traces in a background thread)
        ns = dict(self.ns)
        if pace is not None:  # its ops and helpers (callables; not classes) wait first
            for name, value in list(ns.items()):
                if name.startswith("_") and not name.startswith("__") and callable(value) \
                        and not isinstance(value, type):
                    ns[name] = pacing.between(value, pace)
        body = types.FunctionType(self.seg.lowered.fn.__code__, ns)

        n_loads = len(loads)
        draws = _SeededDraws()

        def pure(*values):
            env = dict(zip(loads, values[:n_loads], strict=True))
            seeds = iter(values[n_loads:])
            out = {}
            # each random op's seed is the next graph input; its draws become seeded_calls
            with _swapped(ns, _op_seed=lambda *_: next(seeds), _seeded=draws.seeded), \
                    draws:
                body(out, env.get)
            return tuple(out[n] for n in stores)

        # tracing runs the kernels: on copies, so the step is not applied twice; the
        # learning rate stays an input (a schedule changes it between steps). Each copy
        # has its input's exact strides: the graph is compiled for the copies' layout and
        # called with the inputs (clone() would make a strided view, a shard of a batch,
        # contiguous, and the graph would read the real one as if it were)
        copies = [_layout_copy(n, t) for n, t in zip(self.loads + ["seed"] * len(self.draws),
                                                       inputs)]
        if _signature(copies) != _signature(inputs):
            raise _Refused("its inputs' layouts could not be copied for the compile")
        tokens = LR_AS_TENSOR.set(True), TRACED.set(disable_proxy_modes_tracing)
        try:
            # one fake mode for the values the trace records: without a tracing context,
            # make_fx makes one per value, each taking a stack trace (0.35 s of the
            # transformer preset's 0.6 s trace). The graph is the same
            with compat.tracing_context(compat.fake_tensor_mode()):
                gm = make_fx(pure, tracing_mode="real")(*copies)
        finally:
            TRACED.reset(tokens[1])
            LR_AS_TENSOR.reset(tokens[0])
        if draws.refused is not None:
            raise _Refused(draws.refused)
        _alpha_as_mul(gm)
        return gm, copies

    def _compile_traced(self, gm, copies):
        """Compile the traced ``gm`` for ``copies`` (``compile_graph``), with its lines."""
        seg = self.seg
        chatty = self.lowering.chatty
        if chatty:
            self.lowering.say(f"ssaexec: compiling {seg.place} segment {seg.id} "
                              f"({len(seg.handles)} ops) with Inductor ...")
        t0 = time.perf_counter()
        fn, cpp = compile_graph(gm, copies, self.lowering.split_build)
        self.releases = cpp
        self.lowering.cpp_wrapped += cpp
        self.lowering.compiles += 1
        if chatty:
            self.lowering.say(f"ssaexec: {seg.place} segment {seg.id} compiled in "
                              f"{time.perf_counter() - t0:.1f} s")
        return fn


def compile_graph(gm, example_inputs, split_build=False):
    """``gm`` compiled by Inductor for ``example_inputs``: (function, whether with the C++
    wrapper). The one compile call, shared with ``runtime.compile_worker`` (which fills
    Inductor's on-disk cache in another process: the same call, with the same
    ``split_build``, must make the same key).

    ``split_build``: a C++ wrapper is built apart from the kernels (Inductor's
    ``cpp_wrapper_build_separate``): the wrapper at -O1 and the kernels at -O3, each on a
    precompiled header, where one unit at -O3 parses the kernels' header every time: a
    shorter build once the headers exist (a machine's first build makes two headers
    instead of one). The transformer preset's steps after the switch stayed at 0.32 ms
    (``bench/time_to_steps.py``). ``runtime.tiered``'s
    background compile uses it (there the compile is a race with the straight-line
    steps); ``compiler="inductor"`` keeps the one unit, whose kernels the wrapper may
    inline."""
    # a tracing context whose fake mode has a shape env: without one Inductor bypasses
    # its FX graph cache ("No shape env"), and a second process compiles everything
    # again; ignore_shape_env keeps the example inputs' static shapes
    def compiled(cpp_wrapper):
        fake_mode = compat.fake_tensor_mode(shape_env=compat.shape_env())
        # no size asserts: the graph is only ever called with inputs of the shapes,
        # strides, dtypes and devices it was compiled for (the signature picks it), so
        # Inductor's own check of each input, every call, would repeat ours (tens of
        # microseconds a step on a launch-bound model: one check per input)
        # the config patch is process-wide too: the whole call holds compat.TRACE_LOCK
        # (and the vector ISA's check, where check_vec_isa did it lighter: isa)
        with compat.TRACE_LOCK, compat.tracing_context(fake_mode), compat.inductor_config().patch(
                {**isa, "emulate_precision_casts": True, "size_asserts": False,
                 "cpp_wrapper": cpp_wrapper,
                 "cpp_wrapper_build_separate": bool(split_build and cpp_wrapper)}):
            return compat.compile_fx(gm, example_inputs, ignore_shape_env=True)

    isa = check_vec_isa(example_inputs)
    cpp = _cpp_wrapper_ok(gm, example_inputs)
    try:
        return compiled(cpp), cpp
    except Exception:  # noqa: BLE001 - the C++ wrapper refused a call: the Python one
        if not cpp:
            raise
        return compiled(False), False


def check_vec_isa(example_inputs):
    """Inductor's CPU vector ISA, checked (once a process) up to the one it picks and no
    further (``compat.vec_isa_first``: 3 s less of a cold compile, and less again where
    its check is lighter; the same pick, so the same kernels), where ``example_inputs`` hold a
    CPU tensor: a graph of CUDA tensors alone has no CPU kernels to pick it for. Returns
    the Inductor options the graph's compile takes for it (``compat.vec_isa_patch``): the
    same in every process that compiles or loads the graph, so one cache key."""
    if any(isinstance(t, torch.Tensor) and t.device.type == "cpu" for t in example_inputs):
        compat.vec_isa_first()
        return compat.vec_isa_patch()
    return {}


def _cpp_wrapper_ok(gm, inputs):
    """Whether ``gm`` is compiled with Inductor's C++ wrapper (``cpp_wrapper=True``): the
    graph's calls made from C++ instead of Python, about 0.08 ms less a step on the
    transformer preset (``bench/inductor_overhead.py``). Only on CPU (measured there; GPU
    graphs keep the Python wrapper until measured on one), and only for graphs of ATen
    and prims ops: in torch 2.13 the C++ wrapper crashed the process (a segmentation
    fault, no exception to fall back on) calling our ``ssaexec::seeded_call``, a custom op
    returning a list. A graph it refuses with an exception (an ATen fallback returning a
    list, as fp16's unscale does) is compiled again with the Python wrapper.
    ``SSAEXEC_INDUCTOR_CPP_WRAPPER=0`` turns it off."""
    if os.environ.get("SSAEXEC_INDUCTOR_CPP_WRAPPER", "1") == "0":
        return False
    if any(t.device.type != "cpu" for t in inputs):
        return False
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        target = node.target
        overload, packet, higher_order = compat.op_classes()
        if isinstance(target, higher_order):
            return False
        if isinstance(target, (overload, packet)) and \
                target.namespace not in ("aten", "prims"):
            return False
    return True


def _layout_copy(name, t):
    """A copy of ``t`` with its shape and strides; a tensor that overlaps itself (an
    expanded one) has no such copy, and its segment runs uncompiled."""
    out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
    try:
        return out.copy_(t)
    except RuntimeError:
        raise _Refused(f"its input {name!r} overlaps itself in memory (an expanded "
                       "tensor)") from None


@contextlib.contextmanager
def _swapped(ns, **names):
    """``ns`` (a generated function's globals) with ``names`` replaced, then restored."""
    old = {k: ns[k] for k in names}
    ns.update(names)
    try:
        yield
    finally:
        ns.update(old)


class _SeededDraws(TorchDispatchMode):
    """While tracing: each ATen call that draws, inside a random op's ``_seeded`` block,
    becomes a ``seeded_call`` of the block's seed (a graph input); one draw per block
    (two would share one generator's stream), none outside a block."""

    def __init__(self):
        super().__init__()
        self.block = None  # (seed input, device, draws so far) of the open _seeded block
        self.refused = None

    @contextlib.contextmanager
    def seeded(self, seed, device):
        self.block = [seed, device, 0]
        try:
            yield
        finally:
            self.block = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _HOST_READS and _tracing():
            # a value read on the host (bool(t), t.item()) decides what the op does: the
            # trace would bake this step's answer into the graph for every later step
            # (a kernel guard's host check runs untraced, and asserts in the graph too)
            self.refused = self.refused or (
                f"an op reads a tensor's value on the host ({func}): the compiled graph "
                "would keep this step's answer")
            return func(*args, **kwargs)
        if not _draws(func, args, kwargs):
            return func(*args, **kwargs)
        block = self.block
        if block is None or block[2]:
            self.refused = self.refused or (
                f"it draws random numbers ({func}) " +
                ("outside a random op's seed" if block is None else
                 "twice in one random op (one seed, one draw)"))
            return func(*args, **kwargs)
        block[2] += 1
        key, tensors = register_call(func, args, kwargs, block[1])
        outs = seeded_call(key, block[0], tensors)
        if func._schema.is_mutable:  # in place: write the drawn values into the argument
            args[0].copy_(outs[0])
            return args[0]
        return outs[0] if len(func._schema.returns) == 1 else tuple(outs)


def _tracing():
    """Whether ``make_fx`` records the ATen calls now (not inside
    ``disable_proxy_modes_tracing``)."""
    return compat.proxy_tracing()


def _draws(func, args, kwargs):
    """Whether calling ``func`` draws random numbers: an ATen op tagged
    ``nondeterministic_seeded`` whose probability argument (``dropout_p``, ``p``), if it
    has one, is not 0 (attention without dropout draws nothing)."""
    if torch.Tag.nondeterministic_seeded not in getattr(func, "tags", ()):
        return False
    for i, arg in enumerate(func._schema.arguments):
        if arg.name in ("dropout_p", "p"):
            value = args[i] if i < len(args) else kwargs.get(arg.name, arg.default_value)
            return not (isinstance(value, (int, float)) and value == 0)
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
