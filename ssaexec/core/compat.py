"""compat: every private or version-dependent torch API ssaexec uses, in one place.

Supported torch: ``SUPPORTED`` (2.11 up to, not including, 2.15), the range stated in
pyproject.toml, the README and docs/torch_versions.md, and tested on each end by
``make test-matrix`` (torch 2.11.0, 2.13.0, 2.14.1).

Policy:

* **The only door.** No other module of ssaexec (nor bench/) names ``torch._*``,
  ``torch.fx.experimental``, ``torch.library``, ``torch.utils._*`` or a private
  attribute of a torch module; it asks here (tests/core/test_compat.py checks the source).
  So a new torch release that moves one of them breaks one line of
  ``tests/core/test_compat.py``, not thirty tests.
* **Features, not version strings.** Each entry looks up the attribute or module it
  needs when first used; nothing here compares ``torch.__version__``.
* **A fallback or a clear refusal.** Where a feature is missing, an entry either falls
  back to code that gives the same results (``foreach("clone")`` becomes one
  ``clone()`` a tensor) or raises ``TorchFeatureError`` (a ``ProgramError``) naming
  the feature, the running torch and the minimum version that has it. Callers ask
  for required features while a program is built or imported (``require``), never in
  the middle of a step.
* **Lazy.** The heavy private packages (``torch._functorch``, ``torch._inductor``) are
  imported on first use, so ``import ssaexec`` stays cheap.

``FEATURES`` lists every entry (name -> ``Feature``), which tests/core/test_compat.py
enumerates, one case per private API.
"""

import contextlib
import functools
import importlib
import inspect
import os
import platform
import threading

import torch

from .errors import ProgramError

__all__ = ["SUPPORTED", "TorchFeatureError", "Feature", "FEATURES", "require", "available",
           "foreach", "FOREACH_USED", "amp_unscale_", "amp_update_scale_",
           "aot_export_module", "fake_tensor_mode", "shape_env", "symbolic_context",
           "statically_known_true", "check", "export_state", "core_aten_decompositions",
           "compile_fx", "tracing_context", "inductor_config", "make_fx",
           "disable_proxy_modes_tracing", "proxy_tracing", "op_classes", "TorchDispatchMode",
           "custom_op", "has_torch_nccl", "batch_norm_base", "cuda_sleep", "cuda_graph_kwargs", "SDPA_CPU", "SDPA_CPU_BACKWARD", "torch_version",
           "all_gather_single", "reduce_scatter_single", "TRACE_LOCK", "vec_isa_first", "vec_isa_patch",
           "preload_tracer"]

# the supported torch range [lowest, first unsupported): pyproject.toml states the same
SUPPORTED = ("2.11", "2.15")

# torch's tracers keep process-wide state (``torch.fx.traceback``'s ``current_meta``, the
# node-meta flags, Inductor's config): two traces at once in two threads corrupt each other
# (a background compile of compiler="auto" beside a from_torch import raised KeyError
# 'custom' inside torch.fx). Every trace and compile ssaexec starts goes through
# ``aot_export_module``, ``make_fx`` or ``compile_fx`` below, which hold this lock for the
# call: ssaexec's own traces never overlap, whichever thread runs them
TRACE_LOCK = threading.RLock()


def torch_version():
    """The running torch's version string (for messages only: nothing branches on it)."""
    return str(torch.__version__)


class TorchFeatureError(ProgramError):
    """A feature this torch lacks: names the feature, the running torch and the minimum."""


class Feature:
    """One private or version-dependent torch API.

    ``path`` is where it lives (``"torch._foreach_clone"``, ``"torch._functorch.
    aot_autograd:aot_export_module"``: module, colon, attribute); ``minimum`` the lowest
    torch that has it; ``fallback`` a callable with the same results, or None (then
    using a missing feature raises ``TorchFeatureError``); ``why`` what ssaexec uses it
    for, for the message. ``keyword``: the feature is a keyword argument of the callable
    at ``path`` (a newer parameter of a public API); this torch has it when the
    callable's signature names it.
    """

    __slots__ = ("name", "path", "minimum", "fallback", "why", "keyword", "_value")

    def __init__(self, name, path, minimum, why, fallback=None, keyword=None):
        self.name, self.path, self.minimum, self.why = name, path, minimum, why
        self.fallback = fallback
        self.keyword = keyword
        self._value = None

    def lookup(self):
        """The torch object, or None when this torch lacks it (never raises)."""
        obj = self._resolve()
        if obj is None or self.keyword is None:
            return obj
        try:
            params = inspect.signature(obj).parameters
        except (TypeError, ValueError):  # a builtin without a signature: cannot tell
            return None
        return obj if self.keyword in params else None

    def _resolve(self):
        mod_name, _, attr = self.path.partition(":")
        try:
            obj = importlib.import_module(mod_name) if attr else None
        except Exception:  # noqa: BLE001 - a private module that moved or fails to import
            return None
        if not attr:  # a dotted attribute path from ``torch``
            obj = torch
            for part in mod_name.split(".")[1:]:
                obj = getattr(obj, part, None)
                if obj is None:
                    return None
            return obj
        for part in attr.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                return None
        return obj

    def error(self):
        """The ``TorchFeatureError`` for this feature missing from the running torch."""
        what = self.path.replace(":", ".")
        if self.keyword is not None:
            what = f"{what}({self.keyword}=...)"
        return TorchFeatureError(
            f"{self.why} needs {what} (torch >= {self.minimum}), which "
            f"torch {torch_version()} does not have; ssaexec supports torch "
            f">= {SUPPORTED[0]}, < {SUPPORTED[1]} (docs/torch_versions.md)")

    def get(self):
        """The torch object, else the fallback, else raise ``TorchFeatureError``."""
        if self._value is None:
            value = self.lookup()
            if value is None:
                if self.fallback is None:
                    raise self.error()
                value = self.fallback
            self._value = value
        return self._value

    @property
    def native(self):
        """Whether the running torch has it (False: the fallback is used, or it is missing)."""
        return self.lookup() is not None


FEATURES = {}


def _feature(name, path, minimum, why, fallback=None, keyword=None):
    f = FEATURES[name] = Feature(name, path, minimum, why, fallback, keyword)
    return f


def require(*names):
    """Raise ``TorchFeatureError`` for the first of ``names`` this torch has no way to do.

    Called where a program or strategy is built, so a missing feature is refused then,
    never in the middle of a step."""
    for name in names:
        FEATURES[name].get()


def available(name):
    """Whether feature ``name`` works on this torch (natively or by its fallback)."""
    try:
        FEATURES[name].get()
    except TorchFeatureError:
        return False
    return True


# ---------------------------------------------------------------------------------------
# torch._foreach_*: one call over a list of tensors. Fallback: one call a tensor.

# the foreach ops ssaexec calls (ops.optim's fused updates, bench/); tests/core/test_compat.py
# checks each, and that no other name is used
FOREACH_USED = ("add", "add_", "addcmul_", "clone", "copy_", "div", "mul", "mul_", "neg",
                "sqrt", "sub_")


def _per_tensor(op):
    """``torch._foreach_<op>`` as a loop of the per-tensor op: list arguments are zipped,
    others (a scalar, a 0-dim tensor) passed to every call; an in-place op (``add_``)
    calls the method on each tensor of the first list and returns None, as foreach does."""
    inplace = op.endswith("_")

    def run(*args, **kwargs):
        n = len(args[0])
        lists = [a if isinstance(a, (list, tuple)) else None for a in args]
        out = []
        for i in range(n):
            call = [lst[i] if lst is not None else a for lst, a in zip(lists, args, strict=True)]
            if inplace:
                getattr(call[0], op)(*call[1:], **kwargs)
            elif op == "clone":
                out.append(call[0].clone(**kwargs))
            else:
                out.append(getattr(torch, op)(*call, **kwargs))
        return None if inplace else out

    run.__name__ = f"_foreach_{op}_fallback"
    return run


def _foreach_clone_fallback(tensors):
    # torch 2.11 has no _foreach_clone: one fused multiply by 1 makes the copies (x * 1 is
    # x exactly in IEEE arithmetic: infinities, NaN and -0.0 too), one launch like the
    # clone it stands for; the per-tensor loop where even that is missing
    mul = getattr(torch, "_foreach_mul", None)
    if mul is None or not tensors:
        return [t.clone() for t in tensors]
    return mul(list(tensors), 1)


for _op in FOREACH_USED:
    # _foreach_clone: torch 2.13 (2.11 lacks it)
    _feature(f"foreach.{_op}", f"torch._foreach_{_op}", "2.13" if _op == "clone" else "2.0",
             f"the fused optimizer update (torch._foreach_{_op})",
             _foreach_clone_fallback if _op == "clone" else _per_tensor(_op))


def foreach(op):
    """``torch._foreach_<op>`` where this torch has it, else the per-tensor loop."""
    return FEATURES[f"foreach.{op}"].get()


# ---------------------------------------------------------------------------------------
# AMP's fused kernels (ops.amp). Fallbacks compute the same on the device, no host sync.

def _unscale_fallback(grads, found_inf, inv_scale):
    for g in grads:
        found_inf.copy_(torch.maximum(found_inf, (~torch.isfinite(g)).any().to(found_inf.dtype)))
        g.mul_(inv_scale)


def _update_scale_fallback(scale, tracker, found_inf, growth, backoff, interval):
    # torch._amp_update_scale_'s rule: overflow -> scale *= backoff, tracker = 0; else
    # tracker += 1, and at ``interval`` clean steps scale *= growth, tracker = 0
    over = found_inf > 0
    grown = tracker + 1
    at = grown >= interval
    scale.copy_(torch.where(over, scale * backoff, torch.where(at, scale * growth, scale)))
    tracker.copy_(torch.where(over | at, torch.zeros_like(tracker), grown))
    return scale


_feature("amp.unscale", "torch._amp_foreach_non_finite_check_and_unscale_", "1.9",
         "fp16 loss scaling (amp_unscale)", _unscale_fallback)
_feature("amp.update_scale", "torch._amp_update_scale_", "1.9",
         "fp16 loss scaling (amp_update_scale)", _update_scale_fallback)


def amp_unscale_(grads, found_inf, inv_scale):
    """Multiply ``grads`` by ``inv_scale`` in place; ``found_inf`` becomes 1 if any is not
    finite (``torch._amp_foreach_non_finite_check_and_unscale_``)."""
    return FEATURES["amp.unscale"].get()(grads, found_inf, inv_scale)


def amp_update_scale_(scale, tracker, found_inf, growth, backoff, interval):
    """The dynamic loss-scale update in place (``torch._amp_update_scale_``)."""
    return FEATURES["amp.update_scale"].get()(scale, tracker, found_inf, growth, backoff,
                                              interval)


# ---------------------------------------------------------------------------------------
# The torch frontend's capture (frontends/torch/capture.py, decompose.py)

_feature("capture.aot_export_module", "torch._functorch.aot_autograd:aot_export_module",
         "2.1", "from_torch (the joint forward and backward capture)")
_feature("capture.fake_tensor_mode", "torch._subclasses.fake_tensor:FakeTensorMode", "2.0",
         "from_torch (fake tensors)")
_feature("capture.shape_env", "torch.fx.experimental.symbolic_shapes:ShapeEnv", "2.0",
         "from_torch (symbolic batch sizes)")
_feature("capture.dim_dynamic", "torch.fx.experimental.symbolic_shapes:DimDynamic", "2.1",
         "from_torch (symbolic batch sizes)")
_feature("capture.stateless_symbolic_context",
         "torch.fx.experimental.symbolic_shapes:StatelessSymbolicContext", "2.1",
         "from_torch (symbolic batch sizes)")
_feature("capture.statically_known_true",
         "torch.fx.experimental.symbolic_shapes:statically_known_true", "2.1",
         "from_torch (symbolic as_strided windows)")
_feature("capture.check", "torch._check", "2.1", "from_torch (one symbol per dimension name)")
_feature("guards.assert_async", "torch._assert_async", "2.1",
         "kernel guards under a compiler (the check as an assertion in the compiled graph)")
_feature("capture.core_aten_decompositions", "torch._decomp:core_aten_decompositions", "2.1",
         "from_torch (core ATen decompositions)")


@contextlib.contextmanager
def _flags_state():
    # the flags torch._export.utils._compiling_state_context sets, set the same way
    comp = torch.compiler
    old = comp._is_compiling_flag, comp._is_exporting_flag
    try:
        comp._is_compiling_flag = comp._is_exporting_flag = True
        yield
    finally:
        comp._is_compiling_flag, comp._is_exporting_flag = old


_feature("capture.export_state", "torch._export.utils:_compiling_state_context", "2.5",
         "from_torch (the state torch.export traces in)", lambda: _flags_state())


def aot_export_module(*args, **kwargs):
    """``torch._functorch.aot_autograd.aot_export_module`` (under ``TRACE_LOCK``)."""
    fn = FEATURES["capture.aot_export_module"].get()
    with TRACE_LOCK:
        return fn(*args, **kwargs)


def fake_tensor_mode(shape_env=None):
    """A ``FakeTensorMode`` (with ``shape_env``)."""
    return FEATURES["capture.fake_tensor_mode"].get()(shape_env=shape_env)


def shape_env():
    """A fresh ``ShapeEnv``."""
    return FEATURES["capture.shape_env"].get()()


def symbolic_context(dynamic):
    """A ``StatelessSymbolicContext`` making dimension ``d`` a symbol where ``dynamic[d]``
    (``DimDynamic.DYNAMIC``: one symbol a dimension, whatever its size) else static."""
    dd = FEATURES["capture.dim_dynamic"].get()
    ctx = FEATURES["capture.stateless_symbolic_context"].get()
    return ctx(dynamic_sizes=[dd.DYNAMIC if d else dd.STATIC for d in dynamic])


def statically_known_true(expr):
    """``torch.fx.experimental.symbolic_shapes.statically_known_true``."""
    return FEATURES["capture.statically_known_true"].get()(expr)


def check(cond):
    """``torch._check(cond)`` (records a fact about symbolic sizes in the shape env)."""
    return FEATURES["capture.check"].get()(cond)


def assert_async(cond, message):
    """``torch._assert_async(cond, message)``: an assertion a traced graph keeps."""
    return FEATURES["guards.assert_async"].get()(cond, message)


def export_state():
    """The state a non-strict ``torch.export`` traces in (``torch.compiler.is_compiling()``
    and ``is_exporting()`` true), as a context manager."""
    return FEATURES["capture.export_state"].get()()


def core_aten_decompositions():
    """``torch._decomp.core_aten_decompositions()`` as a plain dict."""
    return dict(FEATURES["capture.core_aten_decompositions"].get()())


# ---------------------------------------------------------------------------------------
# Inductor (runtime/inductor.py, compiler="inductor") and make_fx

_feature("inductor.compile_fx", "torch._inductor.compile_fx:compile_fx", "2.0",
         "compiler='inductor'")
_feature("inductor.config", "torch._inductor:config", "2.0", "compiler='inductor'")
_feature("inductor.tracing_context", "torch._guards:TracingContext", "2.0",
         "compiler='inductor'")
_feature("inductor.tracing", "torch._guards:tracing", "2.0", "compiler='inductor'")
_feature("fx.make_fx", "torch.fx.experimental.proxy_tensor:make_fx", "2.0",
         "compiler='inductor' (tracing a segment)")
_feature("fx.disable_proxy_modes_tracing",
         "torch.fx.experimental.proxy_tensor:disable_proxy_modes_tracing", "2.0",
         "compiler='inductor' (tracing a segment)")
_feature("fx.get_dispatch_mode", "torch._C:_get_dispatch_mode", "2.1",
         "compiler='inductor' (is make_fx recording)")
_feature("fx.dispatch_mode_key", "torch._C:_TorchDispatchModeKey.PROXY", "2.1",
         "compiler='inductor' (is make_fx recording)")


_feature("inductor.cpp_builder", "torch._inductor.cpp_builder:CppBuilder", "2.5",
         "compiler='auto' (the compile worker says when its C++ build starts)")


@contextlib.contextmanager
def on_cpp_build(callback):
    """Within it, ``callback()`` runs once, as Inductor starts its first C++ build
    (``CppBuilder.build``: its Python lowering is over, and the C++ compiler's seconds
    begin). Process-wide: for the compile worker (``runtime.compile_worker``), which
    compiles one graph at a time. Where this torch has no such class, it never runs."""
    cls = FEATURES["inductor.cpp_builder"].lookup()
    if cls is None or not callable(getattr(cls, "build", None)):
        yield
        return
    build = cls.build
    pending = [callback]

    @functools.wraps(build)
    def first_build(self, *args, **kwargs):
        if pending:
            pending.pop()()
        return build(self, *args, **kwargs)

    cls.build = first_build
    try:
        yield
    finally:
        cls.build = build


def compile_fx(gm, example_inputs, **kwargs):
    """``torch._inductor.compile_fx.compile_fx`` (under ``TRACE_LOCK``)."""
    fn = FEATURES["inductor.compile_fx"].get()
    with TRACE_LOCK:
        return fn(gm, example_inputs, **kwargs)


_feature("inductor.vec_isa", "torch._inductor:cpu_vec_isa", "2.1",
         "compiler='auto' (Inductor's CPU vector ISA, checked once)")
_VEC_ISA_LOCK = threading.Lock()


def vec_isa_first():
    """Inductor's CPU vector ISA, picked by checking only the ISAs it would check first.

    Inductor picks (``pick_vec_isa``) the first ISA of its list whose flags this CPU has and
    which the C++ compiler builds (``valid_vec_isa_list``), but it builds a test program for
    every ISA of the list before taking the first: 5.4 s of a cold compile on the CPU build
    machine, 3 s of it for ISAs it then never uses. This checks them in order and stops at
    the first that passes: the same pick, which leaves Inductor's code and its kernels as
    they were. Only where the pick is the first of the list (no ``ATEN_CPU_CAPABILITY``, no
    ``config.cpp.simdlen``: otherwise torch's full check runs, through the original
    function) and on x86, where torch reads the CPU's flags. Returns the ISA, or None where
    this torch lays it out otherwise (then nothing changes).

    The check of an AVX2 or AVX-512 ISA is ``_vec_isa_light`` where it can be: Inductor's own
    builds a test program against ATen's vector headers (seconds of g++, most of a compile
    worker's start on an empty cache) to learn two things, that the compiler takes the
    ISA's flags and that libtorch exports the Sleef kernels of its width; here a unit of
    intrinsics built with those flags (a fraction of a second) and a look-up of the
    symbol. The ISA's own further checks (VNNI's, AMX's: small builds) run as Inductor
    wrote them. Its compiles then say so (``vec_isa_patch``), so that Inductor does not
    build the test program anyway."""
    mod = FEATURES["inductor.vec_isa"].lookup()
    names = ("supported_vec_isa_list", "valid_vec_isa_list", "x86_isa_checker", "pick_vec_isa")
    if mod is None or not all(hasattr(mod, n) for n in names) or \
            platform.machine() not in ("x86_64", "AMD64"):
        return None
    with _VEC_ISA_LOCK:
        full = mod.valid_vec_isa_list
        if not getattr(full, "ssaexec_first", False):
            config = inductor_config()

            def first_only():
                if os.environ.get("ATEN_CPU_CAPABILITY") or config.cpp.simdlen is not None:
                    return full()
                if not found:
                    flags = mod.x86_isa_checker()
                    pick = None
                    for isa in mod.supported_vec_isa_list:
                        if not all(f in flags for f in str(isa).split()):
                            continue
                        if _vec_isa_light(mod, isa):
                            # the base check done: the ISA's own further checks only
                            with config.patch({"cpp.vec_isa_ok": True}):
                                ok = bool(isa)
                            if ok:
                                _VEC_ISA_LIGHT.append(str(isa))
                        else:
                            ok = bool(isa)  # Inductor's whole check
                        if ok:
                            pick = isa
                            break
                    found.append(pick)
                return [] if found[0] is None else found[:1]

            found = []
            first_only.ssaexec_first = True
            first_only.full = full  # torch's own, every ISA checked
            first_only.cache_clear = getattr(full, "cache_clear", lambda: None)
            mod.valid_vec_isa_list = first_only
        return mod.pick_vec_isa()


_VEC_ISA_LIGHT = []  # the ISA picked on _vec_isa_light's check, once a process
# the Sleef exp of float vectors of each width: what Inductor's test program calls
_SLEEF_EXP = {512: "Sleef_expf16_u10", 256: "Sleef_expf8_u10"}
_INTRINSICS = {512: "__m512 f(__m512 a, __m512 b) { return _mm512_fmadd_ps(a, b, a); }",
               256: "__m256 f(__m256 a, __m256 b) { return _mm256_fmadd_ps(a, b, a); }"}


def _vec_isa_light(mod, isa):
    """Whether Inductor's base check of ``isa`` (``VecISA._avx_code``: ATen's vectorized
    ``exp`` built with the ISA's flags, linked against libtorch and loaded) can be done
    lighter, and passes: the compiler builds the ISA's intrinsics with its flags, and
    libtorch exports the Sleef function of its width. False (Inductor's own check then) for
    another ISA, another layout of torch's module, or any doubt."""
    import ctypes
    import subprocess
    import tempfile
    try:
        if not isinstance(isa, (mod.VecAVX512, mod.VecAVX2)) or \
                not hasattr(inductor_config().cpp, "vec_isa_ok"):
            return False
        width = isa.bit_width()
        if width not in _SLEEF_EXP:
            return False
        lib = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
        if not hasattr(ctypes.CDLL(lib), _SLEEF_EXP[width]):  # loaded already: a look-up
            return False
        cxx = importlib.import_module("torch._inductor.cpp_builder").get_cpp_compiler()
        with tempfile.TemporaryDirectory(prefix="ssaexec-isa-") as d:
            src = os.path.join(d, "isa.cpp")
            with open(src, "w") as f:
                f.write("#include <immintrin.h>\n" + _INTRINSICS[width] + "\n")
            done = subprocess.run([cxx, *isa.build_arch_flags().split(), "-c", src, "-o",
                                   os.path.join(d, "isa.o")], capture_output=True, timeout=60)
        return done.returncode == 0
    except Exception:  # noqa: BLE001 - Inductor's own check decides
        return False


def vec_isa_patch():
    """The Inductor options a compile needs for ``vec_isa_first``'s pick: ``cpp.vec_isa_ok``
    where the pick was checked lighter (Inductor would otherwise build its test program at
    the compile's first ``bool(isa)``), else none. The option is in Inductor's cache key:
    every compile of ours goes through ``runtime.inductor.compile_graph``, so a worker
    process and the process that loads its graph agree."""
    return {"cpp.vec_isa_ok": True} if _VEC_ISA_LIGHT else {}


def inductor_config():
    """``torch._inductor.config`` (its ``patch`` sets options for one compile)."""
    return FEATURES["inductor.config"].get()


@contextlib.contextmanager
def tracing_context(fake_mode):
    """``torch._guards.tracing(TracingContext(fake_mode))``."""
    ctx = FEATURES["inductor.tracing_context"].get()(fake_mode)
    with FEATURES["inductor.tracing"].get()(ctx):
        yield ctx


# what make_fx imports on its first call, whatever it traces (torch 2.11-2.14)
_TRACER_MODULES = ("torch._dynamo", "torch._inductor.config",
                   "torch._inductor.fx_passes.dedupe_symint_uses",
                   "torch._inductor.compiler_bisector")


def preload_tracer():
    """Import what ``make_fx`` imports on its first call (torch's compiler packages: about
    a second), outside ``TRACE_LOCK``, so that a background thread's imports do not hold up
    another thread's trace; then trace one op, for whatever another torch imports
    besides."""
    for name in _TRACER_MODULES:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - moved in another torch: the trace imports it
            pass
    make_fx(lambda x: x * 2, tracing_mode="real")(torch.ones(1))


def make_fx(fn, **kwargs):
    """``torch.fx.experimental.proxy_tensor.make_fx``; its trace runs under ``TRACE_LOCK``."""
    traced = FEATURES["fx.make_fx"].get()(fn, **kwargs)

    @functools.wraps(traced)
    def trace(*args):
        with TRACE_LOCK:
            return traced(*args)
    return trace


def disable_proxy_modes_tracing():
    """``torch.fx.experimental.proxy_tensor.disable_proxy_modes_tracing()``."""
    return FEATURES["fx.disable_proxy_modes_tracing"].get()()


def proxy_tracing():
    """Whether ``make_fx`` records ATen calls now (its proxy dispatch mode is active)."""
    get = FEATURES["fx.get_dispatch_mode"].get()
    return get(FEATURES["fx.dispatch_mode_key"].get()) is not None


# ---------------------------------------------------------------------------------------
# Operator objects, dispatch modes, custom ops

_feature("ops.OpOverload", "torch._ops:OpOverload", "2.0", "operator resolution")
_feature("ops.OpOverloadPacket", "torch._ops:OpOverloadPacket", "2.0", "operator resolution")
_feature("ops.HigherOrderOperator", "torch._ops:HigherOrderOperator", "2.0",
         "compiler='inductor' (C++ wrapper choice)")
_feature("dispatch.TorchDispatchMode", "torch.utils._python_dispatch:TorchDispatchMode", "2.0",
         "operator interception (kernel guards, host-sync detector, error locations)")
_feature("library.custom_op", "torch.library:custom_op", "2.4",
         "seeded random ops under compiler='inductor'")
_feature("nccl.all_reduce", "torch._C:_nccl_all_reduce", "2.0",
         "the torch.cuda.nccl collective", fallback=False)


_feature("nn.BatchNorm", "torch.nn.modules.batchnorm:_BatchNorm", "1.0",
         "from_torch (batch norm's momentum=None check)")
_feature("cuda.sleep", "torch.cuda:_sleep", "1.0", "the simulator's GPU calibration")


# torch.cuda.graph(check_input_liveness=True): torch 2.13 (2.11 lacks the keyword and
# refuses the call). Fallback False: the capture goes ahead without the check.
_feature("cuda.graph_check_input_liveness", "torch.cuda:graph", "2.13",
         "checking a CUDA graph's inputs are alive at each replay (CudaCapture(check_liveness=))",
         fallback=False, keyword="check_input_liveness")


def cuda_graph_kwargs(check_liveness=False):
    """The optional keyword arguments for ``torch.cuda.graph`` this torch accepts.

    ``check_liveness``: ask torch to check, at each replay, that no tensor the graph
    reads from outside was freed (``check_input_liveness``). Where this torch lacks the
    keyword the check is left out: it only checks, it changes nothing the graph
    computes, and ``StepGraphs`` holds every tensor a graph reads anyway."""
    if check_liveness and FEATURES["cuda.graph_check_input_liveness"].get() is not False:
        return {"check_input_liveness": True}
    return {}


def batch_norm_base():
    """``torch.nn.modules.batchnorm._BatchNorm``, the base class of every batch norm."""
    return FEATURES["nn.BatchNorm"].get()


def cuda_sleep(cycles):
    """``torch.cuda._sleep(cycles)``: hold the current stream for ``cycles`` GPU clocks."""
    return FEATURES["cuda.sleep"].get()(cycles)


def op_classes():
    """``(OpOverload, OpOverloadPacket, HigherOrderOperator)`` of ``torch._ops``."""
    return tuple(FEATURES[f"ops.{n}"].get()
                 for n in ("OpOverload", "OpOverloadPacket", "HigherOrderOperator"))


TorchDispatchMode = FEATURES["dispatch.TorchDispatchMode"].get()


def custom_op(name, **kwargs):
    """``torch.library.custom_op(name, **kwargs)`` (a decorator)."""
    return FEATURES["library.custom_op"].get()(name, **kwargs)


def has_torch_nccl():
    """Whether this torch build has ``torch.cuda.nccl``'s all-reduce kernel."""
    return FEATURES["nccl.all_reduce"].get() is not False


# ---------------------------------------------------------------------------------------
# torch.distributed's one-tensor all-gather and reduce-scatter (ZeRO across processes,
# dist/group_collective.py). torch 2.13 names them all_gather_single / reduce_scatter_single
# and deprecates the older all_gather_into_tensor / reduce_scatter_tensor (a FutureWarning
# a call), the only names torch 2.11 has; both forms take the same arguments.

def _all_gather_into_tensor(output, input, group=None, async_op=False):
    import torch.distributed as dist
    return dist.all_gather_into_tensor(output, input, group=group, async_op=async_op)


def _reduce_scatter_tensor(output, input, op=None, group=None, async_op=False):
    import torch.distributed as dist
    op = dist.ReduceOp.SUM if op is None else op
    return dist.reduce_scatter_tensor(output, input, op=op, group=group, async_op=async_op)


_feature("dist.all_gather_single", "torch.distributed.all_gather_single", "2.13",
         "ZeRO's all-gather across processes", _all_gather_into_tensor)
_feature("dist.reduce_scatter_single", "torch.distributed.reduce_scatter_single", "2.13",
         "ZeRO's reduce-scatter across processes", _reduce_scatter_tensor)


def all_gather_single(output, input, group=None, async_op=False):
    """``output`` (world x ``input``'s elements, flat) gets every rank's ``input`` in rank
    order: ``torch.distributed.all_gather_single`` (``all_gather_into_tensor`` before 2.13)."""
    return FEATURES["dist.all_gather_single"].get()(output, input, group=group,
                                                    async_op=async_op)


def reduce_scatter_single(output, input, group=None, async_op=False):
    """``output`` gets rank r's chunk of the sum of every rank's ``input`` (world chunks of
    ``output``'s size): ``torch.distributed.reduce_scatter_single`` (``reduce_scatter_tensor``
    before 2.13), summing."""
    import torch.distributed as dist
    return FEATURES["dist.reduce_scatter_single"].get()(output, input, op=dist.ReduceOp.SUM,
                                                        group=group, async_op=async_op)


# ---------------------------------------------------------------------------------------
# SDPA: the overload a CPU trace of scaled_dot_product_attention records. Programs name
# these types (ops.policy, ops.portable); capture normalises what a torch version traces
# to them (frontends/torch/capture.py).

SDPA_CPU = "aten._scaled_dot_product_flash_attention_for_cpu.default"
SDPA_CPU_BACKWARD = "aten._scaled_dot_product_flash_attention_for_cpu_backward.default"
_feature("sdpa.cpu", "torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default",
         "2.2", "importing models with scaled_dot_product_attention")
_feature("sdpa.cpu_backward",
         "torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default", "2.2",
         "training imported models with scaled_dot_product_attention")
