"""ssaexec.core.compat: every private torch API ssaexec uses, one case each, and no other door.

* ``test_feature_works_on_this_torch``: one case per entry of ``compat.FEATURES``: the
  API exists on the running torch, or its fallback is taken (and gives torch's result
  where torch has the API, so the fallback is checked on every torch); a feature
  without a fallback must exist on every supported torch. A new torch release that
  moves an API fails here, one line per API.
* ``test_only_compat_names_private_torch_api``: an AST scan of ssaexec/ and bench/: no
  module but ``ssaexec/core/compat.py`` names ``torch._*``, a private attribute of a torch
  module, ``torch.fx.experimental``, ``torch.library`` or ``torch.utils._*`` (imports
  and attribute chains; docstrings and comments do not count). ``EXCEPTIONS`` lists the
  uses in files other work owns for now.
"""

import ast
import pathlib
import platform
import shutil
import subprocess
import sys

import pytest
import torch

from ssaexec.core import compat
from ssaexec.core.errors import ProgramError

REPO = pathlib.Path(__file__).resolve().parent.parent.parent

# (file, dotted name) still named outside compat, each with why (none today)
EXCEPTIONS = set()


# --- one case per private API --------------------------------------------------------------

def _foreach_case(op):
    a = [torch.tensor([1.0, -2.0]), torch.tensor([[3.0]])]
    b = [torch.tensor([0.5, 4.0]), torch.tensor([[2.0]])]
    args = {"add": (a, b), "add_": (a, b), "addcmul_": (a, b, b), "clone": (a,), "copy_": (a, b),
            "div": (a, b), "mul": (a, b), "mul_": (a, 2.0), "neg": (a,),
            "sqrt": ([x.abs() for x in a],), "sub_": (a, b)}[op]
    return args


@pytest.mark.parametrize("op", compat.FOREACH_USED)
def test_foreach_fallback_equals_torch(op):
    f = compat.FEATURES[f"foreach.{op}"]
    fallback = f.fallback
    args = _foreach_case(op)
    copy = [[t.clone() for t in x] if isinstance(x, list) else x for x in args]
    got = fallback(*copy)
    if op.endswith("_"):
        assert got is None
        got = copy[0]
    native = f.lookup()
    if native is None:  # this torch lacks it: the fallback is what ssaexec runs
        assert compat.foreach(op) is fallback
        return
    ref = [[t.clone() for t in x] if isinstance(x, list) else x for x in args]
    want = native(*ref)
    want = ref[0] if op.endswith("_") else want
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True)), op
    assert compat.foreach(op) is native


def test_amp_fallbacks_equal_torch():
    grads = [torch.tensor([2.0, float("inf")]), torch.tensor([4.0])]
    found = torch.zeros(())
    compat.FEATURES["amp.unscale"].fallback([g.clone() for g in grads], found,
                                            torch.tensor(0.5))
    assert float(found) == 1.0
    ok = [torch.tensor([2.0]), torch.tensor([4.0])]
    found = torch.zeros(())
    compat.FEATURES["amp.unscale"].fallback(ok, found, torch.tensor(0.5))
    assert float(found) == 0.0 and ok[0].item() == 1.0 and ok[1].item() == 2.0
    for found_inf, tracker0, want_scale, want_tracker in [(1.0, 3, 4.0, 0), (0.0, 1, 16.0, 0),
                                                          (0.0, 0, 8.0, 1)]:
        for fn in (compat.FEATURES["amp.update_scale"].fallback,
                   compat.FEATURES["amp.update_scale"].lookup()):
            if fn is None:
                continue
            scale, tracker = torch.tensor(8.0), torch.tensor(tracker0, dtype=torch.int32)
            fn(scale, tracker, torch.tensor(found_inf), 2.0, 0.5, 2)
            assert (float(scale), int(tracker)) == (want_scale, want_tracker), fn


# every feature without a fallback must be there on every supported torch
_REQUIRED = sorted(n for n, f in compat.FEATURES.items() if f.fallback is None)
_WITH_FALLBACK = sorted(n for n, f in compat.FEATURES.items() if f.fallback is not None)


@pytest.mark.parametrize("name", _REQUIRED)
def test_required_feature_exists_on_this_torch(name):
    f = compat.FEATURES[name]
    assert f.native, (f"torch {torch.__version__} lacks {f.path} ({f.why}); a supported "
                      "torch must have it: give it a fallback or narrow the supported range")
    assert f.get() is f.lookup()


@pytest.mark.parametrize("name", _WITH_FALLBACK)
def test_feature_with_a_fallback_works_on_this_torch(name):
    f = compat.FEATURES[name]
    got = f.get()
    assert got is (f.lookup() if f.native else f.fallback)


def test_a_missing_feature_is_refused_naming_feature_torch_and_minimum():
    f = compat.Feature("test.missing", "torch._no_such_api_in_any_torch", "9.9",
                       "the test feature")
    with pytest.raises(compat.TorchFeatureError) as e:
        f.get()
    msg = str(e.value)
    assert isinstance(e.value, ProgramError)
    assert "torch._no_such_api_in_any_torch" in msg and "torch >= 9.9" in msg
    assert f"torch {torch.__version__}" in msg and "the test feature" in msg
    assert compat.SUPPORTED[0] in msg
    compat.FEATURES["test.missing"] = f
    try:
        assert not compat.available("test.missing")
        with pytest.raises(compat.TorchFeatureError):
            compat.require("test.missing")
    finally:
        del compat.FEATURES["test.missing"]


def test_foreach_clone_is_native_or_falls_back():
    # torch 2.11 has no _foreach_clone (issue 47): the fused fp16 update clones per tensor
    ts = [torch.arange(3.0), torch.ones(2, 2)]
    out = compat.foreach("clone")(ts)
    assert all(torch.equal(a, b) and a.data_ptr() != b.data_ptr()
               for a, b in zip(out, ts, strict=True))
    assert compat.FEATURES["foreach.clone"].native == hasattr(torch, "_foreach_clone")


def test_supported_range_matches_pyproject():
    text = (REPO / "pyproject.toml").read_text()
    lo, hi = compat.SUPPORTED
    assert f'"torch>={lo},<{hi}"' in text
    for doc in ("README.md", "docs/torch_versions.md"):
        body = (REPO / doc).read_text()
        assert f"torch>={lo},<{hi}" in body, doc
    v = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    assert tuple(map(int, lo.split("."))) <= v < tuple(map(int, hi.split("."))), (
        f"the running torch {torch.__version__} is outside the supported range")


# --- no other door ---------------------------------------------------------------------------

def _dotted(node):
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _private(dotted):
    """Whether a dotted name rooted at ``torch`` is private or version-dependent API."""
    parts = dotted.split(".")
    if parts[0] != "torch" or len(parts) < 2:
        return False
    if any(p.startswith("_") and not (p.startswith("__") and p.endswith("__"))
           for p in parts[1:]):
        return True
    return dotted.startswith(("torch.fx.experimental", "torch.library"))


def private_uses(path):
    """``{(dotted name, line)}`` of private torch API a source file names."""
    tree = ast.parse(path.read_text(), str(path))
    found = set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.Attribute):
            d = _dotted(node)
            names = [d] if d else []
        for n in names:
            if _private(n):
                found.add((n, node.lineno))
    # report the longest chain once per line (torch._C._get_dispatch_mode, not torch._C)
    keep = {(n, ln) for n, ln in found
            if not any(m != n and m.startswith(n + ".") and lm == ln for m, lm in found)}
    return keep


def _sources():
    for root in ("ssaexec", "bench"):
        for p in sorted((REPO / root).rglob("*.py")):
            yield p.relative_to(REPO).as_posix(), p


def test_only_compat_names_private_torch_api():
    bad, seen = [], set()
    for rel, path in _sources():
        if rel == "ssaexec/core/compat.py":
            continue
        for name, line in sorted(private_uses(path)):
            key = (rel, name)
            if key in EXCEPTIONS:
                seen.add(key)
                continue
            bad.append(f"{rel}:{line}: {name}")
    assert not bad, ("private torch API outside ssaexec/core/compat.py (add a feature there and "
                     "call it):\n" + "\n".join(bad))
    stale = EXCEPTIONS - seen
    assert not stale, f"EXCEPTIONS no longer needed (delete them): {sorted(stale)}"


def test_the_scan_finds_what_it_must(tmp_path):
    src = tmp_path / "m.py"
    src.write_text('"""torch._foreach_add in a docstring does not count."""\n'
                   "import torch\n"
                   "from torch._functorch.aot_autograd import aot_export_module\n"
                   "import torch.fx.experimental.symbolic_shapes\n"
                   "x = torch._C._get_dispatch_mode\n"
                   "y = torch.__version__\n"
                   "z = torch.ops.aten.add.Tensor\n"
                   "@torch.library.custom_op('a::b', mutates_args=())\n"
                   "def f(t: torch.Tensor) -> torch.Tensor: ...\n")
    names = {n for n, _ in private_uses(src)}
    assert "torch._functorch.aot_autograd.aot_export_module" in names
    assert "torch.fx.experimental.symbolic_shapes" in names
    assert "torch._C._get_dispatch_mode" in names
    assert "torch.library.custom_op" in names
    assert not any("__version__" in n or "ops.aten" in n or "_foreach" in n for n in names)


# --- keyword features: a newer parameter of a public torch API ----------------------------

def test_cuda_graph_liveness_keyword_is_passed_only_where_torch_has_it():
    # torch 2.11's torch.cuda.graph has no check_input_liveness and refuses the call
    # (TypeError; found on the first GPU run, docs/gpu.md): compat decides, from the
    # signature, whether to pass it; torch.cuda.graph is plain Python, so this runs on CPU
    import inspect
    has = "check_input_liveness" in inspect.signature(torch.cuda.graph).parameters
    f = compat.FEATURES["cuda.graph_check_input_liveness"]
    assert f.native == has
    assert compat.cuda_graph_kwargs(True) == ({"check_input_liveness": True} if has else {})
    assert compat.cuda_graph_kwargs(False) == {}
    # whatever it returns, torch.cuda.graph accepts: binding the call never raises TypeError
    inspect.signature(torch.cuda.graph).bind(None, pool=None, stream=None,
                                             capture_error_mode="relaxed",
                                             **compat.cuda_graph_kwargs(True))


def test_a_keyword_feature_is_native_only_when_the_signature_names_it():
    there = compat.Feature("test.kw", "torch.cuda:graph", "2.0", "the test", fallback=False,
                           keyword="capture_error_mode")
    missing = compat.Feature("test.kw", "torch.cuda:graph", "9.9", "the test",
                             fallback=False, keyword="no_such_keyword_in_any_torch")
    assert there.native and there.get() is torch.cuda.graph
    assert not missing.native and missing.get() is False
    refused = compat.Feature("test.kw", "torch.cuda:graph", "9.9", "the test",
                             keyword="no_such_keyword_in_any_torch")
    with pytest.raises(compat.TorchFeatureError) as e:
        refused.get()
    assert "torch.cuda.graph(no_such_keyword_in_any_torch=...)" in str(e.value)
    assert "torch >= 9.9" in str(e.value)


@pytest.mark.parametrize("entry", ["make_fx", "aot_export_module"])
def test_traces_wait_for_trace_lock(entry):
    # torch's tracers keep process-wide state: a trace in another thread (compiler="auto"'s
    # background compile) while this one held it broke from_torch (KeyError 'custom' in
    # torch.fx). Every ssaexec trace goes through compat under TRACE_LOCK: none starts
    # while another thread holds it (never a false failure: with the lock working, the
    # trace cannot end before the release)
    import threading

    def f(x):
        return (x * 2).sum()

    class M(torch.nn.Module):
        def forward(self, x):
            return (x * 2,)

    def trace():
        if entry == "make_fx":
            compat.make_fx(f)(torch.ones(3))
        else:
            compat.aot_export_module(M(), [torch.ones(3)], trace_joint=False)
        done.set()

    done = threading.Event()
    with compat.TRACE_LOCK:
        t = threading.Thread(target=trace)
        t.start()
        assert not done.wait(0.3)
    t.join(timeout=120)
    assert done.is_set()


# not slow: the matrix's fast suites run it on every supported torch (seconds cold: torch's
# own check builds a test program for every ISA)
@pytest.mark.skipif(not compat.available("inductor.vec_isa"), reason="no Inductor here")
def test_the_first_vec_isa_is_torchs_own_pick(monkeypatch):
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    mod = compat.FEATURES["inductor.vec_isa"].get()
    picked = compat.vec_isa_first()
    if picked is None:  # not x86, or another layout: torch's own code, untouched
        assert not getattr(mod.valid_vec_isa_list, "ssaexec_first", False)
        return
    # torch's own pick, every ISA checked its own way, in a process this one never patched
    # (here the lighter check's answers are in the ISAs' own caches)
    own = subprocess.run([sys.executable, "-c", "from torch._inductor import cpu_vec_isa as m\n"
                          "print(m.pick_vec_isa())"],
                         capture_output=True, text=True, timeout=600)
    assert own.returncode == 0, own.stderr
    assert str(picked) == own.stdout.strip().splitlines()[-1]
    assert str(mod.pick_vec_isa()) == str(picked)
    # a pick the lighter way vouches for was checked that way, and its compiles are told so
    light = compat._vec_isa_light(mod, type(picked)())
    assert light == (str(picked).split()[0] in ("avx512", "avx2"))  # as on every x86 torch
    assert compat.vec_isa_patch() == ({"cpp.vec_isa_ok": True} if light else {})
    # a capability named in the environment: torch's full list, its own choice among them
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    assert mod.valid_vec_isa_list() == mod.valid_vec_isa_list.full()


@pytest.mark.skipif(not compat.available("inductor.vec_isa") or
                    platform.machine() not in ("x86_64", "AMD64"), reason="no x86 Inductor")
def test_the_lighter_vec_isa_check_refuses_what_it_cannot_vouch_for(monkeypatch):
    """``_vec_isa_light`` stands in for Inductor's test program only where both of its
    checks pass: flags the compiler refuses, or a Sleef function libtorch lacks, leave the
    decision to Inductor's own check (False)."""
    mod = compat.FEATURES["inductor.vec_isa"].get()
    isa = mod.VecAVX2()
    assert compat._vec_isa_light(mod, isa) is (shutil.which("g++") is not None
                                                or shutil.which("c++") is not None)
    monkeypatch.setattr(type(isa), "build_arch_flags", lambda self: "-mno-such-isa-flag")
    assert compat._vec_isa_light(mod, isa) is False
    monkeypatch.undo()
    monkeypatch.setitem(compat._SLEEF_EXP, 256, "Sleef_no_such_function_u10")
    assert compat._vec_isa_light(mod, isa) is False
    assert compat._vec_isa_light(mod, mod.VecNEON()) is False  # not one it knows: Inductor's


def test_on_cpp_build_wraps_inductors_build_and_puts_it_back():
    """``on_cpp_build`` (the compile worker's word as its C++ build starts) replaces
    Inductor's ``CppBuilder.build`` only within it; the callback runs end to end in
    tests/runtime/test_tiered.py (a worker's cold compile)."""
    cls = compat.FEATURES["inductor.cpp_builder"].get()
    original = cls.build
    with compat.on_cpp_build(lambda: None):
        assert cls.build is not original and cls.build.__wrapped__ is original
    assert cls.build is original
    with pytest.raises(KeyError), compat.on_cpp_build(lambda: None):
        raise KeyError("restored on errors too")
    assert cls.build is original
