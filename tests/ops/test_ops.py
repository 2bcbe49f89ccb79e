"""Every op against plain PyTorch: forward values, gradients, shape inference.

Kernels are called straight through the registry (no program, no executor), so
a failure here is the op's fault. The oracle is torch itself: each case in
``op_cases.CASES`` carries a reference written with torch ops, and gradients
are checked against ``torch.autograd.grad`` on that reference with a random
cotangent per differentiable output. Everything runs in float64 and must agree
to a relative error below 1e-6 (max |a - b| / max |b|).

Besides values, each call checks the registry's policy: kernels (other than
``inplace`` optimizer ops) neither modify nor alias their inputs, and grad
kernels honour ``wanted`` masks. ``test_every_op_is_covered`` fails when an op
is registered without a forward case (or, if differentiable, a gradient case).

``conditional_block`` needs an executor context (``ctx.run_block``) and is
left to the executor tests (none exercise it yet).
"""

import math
import zlib

import pytest
import torch
from hypothesis import given, settings, strategies as st

from ssaexec.ops.registry import get_op_def, infer_outputs, registered_ops
from ssaexec.program.desc import OpDesc

from op_cases import CASES, EW_REFS, F64, OpCase, ew_ref, rn  # tests/ is on sys.path (conftest)

RTOL = 1e-6

# Ops checked by dedicated tests below rather than by the case table.
_SPECIAL_FORWARD = set()
_SPECIAL_GRAD = set()
# Ops this module deliberately leaves to other test files, with the reason.
NOT_TESTED_HERE = {
    "conditional_block": "needs an executor (ctx.run_block); belongs in the executor tests",
    "assign_bytes": "the torch importer's constants; tested in test_from_torch.py",
    "parallel_do": "runs a sub-block on places (ctx.run_places), forward and gradient; "
                   "tested against torch in test_parallel_do.py",
    "placeable_block": "runs its sub-block in place; tested in test_distribute.py",
    "send": "point to point over a process group; tested in test_distribute.py",
    "recv": "point to point over a process group; tested in test_distribute.py",
    "listen_and_serv": "the parameter server's loop; tested in test_distribute.py",
}


def covers(*types, grad=False):
    """Mark a test as the forward (and gradient, with ``grad``) check of ``types``."""
    _SPECIAL_FORWARD.update(types)
    if grad:
        _SPECIAL_GRAD.update(types)
    return lambda fn: fn


# --- helpers ---------------------------------------------------------------------------------

def rel_err(actual, expected):
    """max |a - b| / max |b| (0 when both are all zeros)."""
    diff = (actual.double() - expected.double()).abs().max().item() if actual.numel() else 0.0
    scale = expected.double().abs().max().item() if expected.numel() else 0.0
    return diff / scale if scale > 0 else diff


def assert_match(actual, expected, what, rtol=RTOL):
    assert isinstance(actual, torch.Tensor), f"{what}: got {type(actual).__name__}"
    assert list(actual.shape) == list(expected.shape), \
        f"{what}: shape {list(actual.shape)} != reference {list(expected.shape)}"
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    if not actual.is_floating_point():
        assert torch.equal(actual, expected), f"{what}: values differ"
        return
    assert torch.isfinite(actual).all(), f"{what}: non-finite values"
    err = rel_err(actual, expected)
    assert err < rtol, f"{what}: relative error {err:.3g} >= {rtol:g}"


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for t in obj if isinstance(t, torch.Tensor)]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _tensors(v)]
    return []


def _storage(t):
    return t.untyped_storage().data_ptr()


def assert_no_alias(outs, ins, what):
    """No output shares memory with an input or with another output.

    The executor may update vars in place (optimizers, in-place all-reduce of
    gradients), so an output that aliases another var would change behind the
    SSA graph's back.
    """
    seen = {_storage(t): "an input" for t in _tensors(ins) if t.numel()}
    for slot, v in outs.items():
        for t in _tensors(v):
            if not t.numel():
                continue
            owner = seen.get(_storage(t))
            assert owner is None, f"{what}: output {slot} shares memory with {owner}"
            seen[_storage(t)] = f"output {slot}"


def _clone(v):
    return v.clone() if isinstance(v, torch.Tensor) else v


def clone_ins(ins):
    return {k: ([_clone(t) for t in v] if isinstance(v, list) else _clone(v))
            for k, v in ins.items()}


def assert_unchanged(before, after, what):
    for k, v in before.items():
        for a, b in zip(_tensors(v), _tensors(after[k]), strict=True):
            assert torch.equal(a, b), f"{what}: kernel modified its input {k}"


def run_kernel(type, ins, attrs=None):
    """Run op ``type``'s kernel on copies of ``ins``; returns (outs, full attrs)."""
    op_def = get_op_def(type)
    full = op_def.full_attrs(attrs or {})
    work = clone_ins(ins)
    outs = op_def.kernel(work, full)
    if not op_def.inplace:
        assert_unchanged(ins, work, type)
        assert_no_alias(outs, work, type)
    return outs, full


def case_gen(key):
    return torch.Generator().manual_seed(zlib.crc32(key.encode()))


def diff_entries(op_def, ins):
    """(slot, index or None) of every input entry that gets a gradient."""
    entries = []
    for s in op_def.inputs:
        if s.no_grad:
            continue
        v = ins.get(s.name)
        if v is None:
            continue
        if s.duplicable:
            entries.extend((s.name, i) for i, t in enumerate(v) if t.is_floating_point())
        elif v.is_floating_point():
            entries.append((s.name, None))
    return entries


# --- forward -----------------------------------------------------------------------------------

@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_forward(case):
    check_forward(case)


def check_forward(case):
    outs, attrs = run_kernel(case.type, case.inputs, case.attrs)
    with torch.no_grad():
        expected = case.ref(clone_ins(case.inputs), attrs)
    op_def = get_op_def(case.type)
    for s in op_def.outputs:
        if s.name in case.unchecked:
            continue
        assert s.name in expected, f"reference of {case.id} does not model output {s.name}"
        assert s.name in outs, f"{case.id}: kernel did not produce {s.name}"
        if s.duplicable:
            assert len(outs[s.name]) == len(expected[s.name]), f"{case.id}: {s.name} count"
            for i, (a, e) in enumerate(zip(outs[s.name], expected[s.name], strict=True)):
                assert_match(a, e, f"{case.id} {s.name}[{i}]")
        else:
            assert_match(outs[s.name], expected[s.name], f"{case.id} {s.name}")


# --- gradients ---------------------------------------------------------------------------------

def _grad_params():
    params = []
    for c in CASES:
        if not c.grad or get_op_def(c.type + "_grad", missing_ok=True) is None:
            continue
        fwd = get_op_def(c.type)
        modes = ["all"]
        if len(diff_entries(fwd, c.inputs)) > 1:
            modes += ["first", "last"]
        if any(s.duplicable and not s.no_grad for s in fwd.outputs):
            modes.append("drop_cotangent")
        params.extend(pytest.param(c, m, id=f"{c.id}-{m}") for m in modes)
    return params


GRAD_PARAMS = _grad_params()


@pytest.mark.parametrize("case,mode", GRAD_PARAMS)
def test_grad(case, mode):
    check_grad(case, mode)


def check_grad(case, mode):
    """The grad kernel against autograd on ``case.ref``, with the ``mode`` wanted mask."""
    fwd = get_op_def(case.type)
    gdef = get_op_def(case.type + "_grad")
    fwd_outs, attrs = run_kernel(case.type, case.inputs, case.attrs)
    gen = case_gen(f"{case.id}-{mode}")

    entries = diff_entries(fwd, case.inputs)
    assert entries, f"{case.id}: no differentiable input"
    selected = {"all": entries, "first": entries[:1], "last": entries[-1:],
                "drop_cotangent": entries}[mode]

    # a random cotangent for every differentiable output (one entry left out
    # in drop_cotangent mode: the grad op must treat a missing one as zeros)
    cots = {}
    for s in fwd.outputs:
        if s.no_grad:
            continue
        vals = fwd_outs[s.name]
        if s.duplicable:
            cs = [torch.randn(v.shape, generator=gen, dtype=v.dtype) for v in vals]
            if mode == "drop_cotangent":
                cs[-1] = None
            cots[s.name] = cs
        else:
            cots[s.name] = torch.randn(vals.shape, generator=gen, dtype=vals.dtype)

    # reference gradients: autograd through the case's torch reference
    ref_ins = clone_ins(case.inputs)
    leaves = []
    for name, i in entries:
        t = ref_ins[name][i] if i is not None else ref_ins[name]
        leaf = t.detach().requires_grad_()
        if i is not None:
            ref_ins[name][i] = leaf
        else:
            ref_ins[name] = leaf
        leaves.append(leaf)
    with torch.enable_grad():
        ref_outs = case.ref(ref_ins, attrs)
    ys, gs = [], []
    for name, c in cots.items():
        for y, g in zip(ref_outs[name] if isinstance(c, list) else [ref_outs[name]],
                        c if isinstance(c, list) else [c], strict=True):
            if g is not None and y.requires_grad:
                ys.append(y)
                gs.append(g)
    expected = torch.autograd.grad(ys, leaves, gs, allow_unused=True)
    expected = {e: (g if g is not None else torch.zeros_like(l))
                for e, g, l in zip(entries, expected, leaves, strict=True)}

    # the grad kernel: forward inputs/outputs it uses, cotangents, and the wanted mask
    g_ins = {}
    for s in gdef.inputs:
        if s.name.endswith("@GRAD"):
            g_ins[s.name] = cots.get(s.name[: -len("@GRAD")])
        elif fwd.input_slot(s.name) is not None:
            g_ins[s.name] = case.inputs.get(s.name)
        else:
            g_ins[s.name] = fwd_outs[s.name]
    wanted = {}
    for s in fwd.inputs:
        if s.no_grad:
            continue
        v = case.inputs.get(s.name)
        n = len(v) if s.duplicable else 1
        wanted[s.name + "@GRAD"] = [(s.name, i if s.duplicable else None) in selected
                                    for i in range(n)]
    work = clone_ins(g_ins)
    got = gdef.kernel(work, attrs, wanted)
    assert_unchanged(g_ins, work, gdef.type)
    assert_no_alias(got, work, gdef.type)

    for name, i in selected:
        key = name + "@GRAD"
        assert key in got, f"{case.id}: wanted {key} was not produced"
        val = got[key][i] if i is not None else got[key]
        assert val is not None, f"{case.id}: wanted {key}[{i}] is None"
        assert_match(val, expected[(name, i)], f"{case.id} {key}" + ("" if i is None else f"[{i}]"))


# --- broadcasting, property-based ----------------------------------------------------------------

@st.composite
def _broadcast_case(draw):
    """X of rank 1-4; Y a run of X's dims starting at ``axis`` with some dims set to 1."""
    x_shape = draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
    start = draw(st.integers(0, len(x_shape) - 1))
    stop = draw(st.integers(start + 1, len(x_shape)))
    y_shape = [d if draw(st.booleans()) else 1 for d in x_shape[start:stop]]
    numpy_style = stop == len(x_shape) and draw(st.booleans())
    op = draw(st.sampled_from(["elementwise_add", "elementwise_sub", "elementwise_mul",
                               "elementwise_div"]))
    seed = draw(st.integers(0, 2 ** 31))
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(x_shape, generator=gen, dtype=F64)
    y = torch.rand(y_shape, generator=gen, dtype=F64) + 0.5
    return OpCase(op, {"X": x, "Y": y}, ew_ref(EW_REFS[op]),
                  {"axis": -1 if numpy_style else start}, f"{x_shape}-{y_shape}-{start}")


@settings(max_examples=60, deadline=None, derandomize=True)
@given(_broadcast_case())
def test_elementwise_broadcast_property(case):
    check_forward(case)
    check_grad(case, "all")


# --- dropout -----------------------------------------------------------------------------------

def _dropout(x, **attrs):
    outs, _ = run_kernel("dropout", {"X": x}, attrs)
    return outs["Out"], outs["Mask"]


@covers("dropout", grad=True)
def test_dropout_seeded_mask_and_scaling():
    x = torch.randn(40, 50, generator=case_gen("dropout"), dtype=F64)
    p = 0.3
    out, mask = _dropout(x, dropout_prob=p, seed=7)
    assert mask.dtype == torch.uint8 and set(mask.unique().tolist()) <= {0, 1}
    assert_match(out, x * mask.to(F64) / (1 - p), "dropout Out")
    keep = mask.double().mean().item()
    assert abs(keep - (1 - p)) < 0.05, f"kept fraction {keep:.3f}, expected about {1 - p}"
    # same seed, same mask; another seed, another mask
    out2, mask2 = _dropout(x, dropout_prob=p, seed=7)
    assert torch.equal(mask, mask2) and torch.equal(out, out2)
    _, mask3 = _dropout(x, dropout_prob=p, seed=8)
    assert not torch.equal(mask, mask3)


@covers("dropout", grad=True)
@pytest.mark.parametrize("attrs", [{"is_test": True, "dropout_prob": 0.4},
                                   {"dropout_prob": 0.0}], ids=["is_test", "p0"])
def test_dropout_identity(attrs):
    x = torch.randn(3, 4, generator=case_gen("dropout-id"), dtype=F64)
    out, mask = _dropout(x, **attrs)
    assert_match(out, x, "dropout Out")
    g = torch.randn(3, 4, generator=case_gen("dropout-id-g"), dtype=F64)
    ins = {"Mask": mask, "Out@GRAD": g}
    got = get_op_def("dropout_grad").kernel(ins, get_op_def("dropout").full_attrs(attrs),
                                            {"X@GRAD": [True]})
    assert_match(got["X@GRAD"], g, "dropout X@GRAD")
    assert_no_alias(got, ins, "dropout_grad")


@covers("dropout", grad=True)
def test_dropout_grad_is_mask_over_keep_prob():
    x = torch.randn(6, 7, generator=case_gen("dropout-g"), dtype=F64)
    p = 0.6
    attrs = get_op_def("dropout").full_attrs({"dropout_prob": p, "seed": 3})
    out, mask = _dropout(x, **attrs)
    g = torch.randn(6, 7, generator=case_gen("dropout-gg"), dtype=F64)
    gdef = get_op_def("dropout_grad")
    assert {s.name for s in gdef.inputs} == {"Mask", "Out@GRAD"}
    got = gdef.kernel({"Mask": mask, "Out@GRAD": g}, attrs, {"X@GRAD": [True]})
    xl = x.clone().requires_grad_()
    (expected,) = torch.autograd.grad(xl * mask.to(F64) / (1 - p), xl, g)
    assert_match(got["X@GRAD"], expected, "dropout X@GRAD")
    assert_match(got["X@GRAD"], g * mask.to(F64) / (1 - p), "dropout X@GRAD formula")


@covers("dropout", grad=True)
def test_dropout_prob_one_drops_everything():
    x = torch.randn(3, 4, dtype=F64)
    out, mask = _dropout(x, dropout_prob=1.0, seed=1)
    assert_match(out, torch.zeros_like(x), "dropout p=1 Out")
    got = get_op_def("dropout_grad").kernel(
        {"Mask": mask, "Out@GRAD": torch.ones_like(x)},
        get_op_def("dropout").full_attrs({"dropout_prob": 1.0}), {"X@GRAD": [True]})
    assert_match(got["X@GRAD"], torch.zeros_like(x), "dropout p=1 X@GRAD")


# --- cast across float types -------------------------------------------------------------------

@covers("cast", grad=True)
def test_cast_f64_to_f32_and_grad_dtype():
    x = torch.randn(3, 4, generator=case_gen("cast"), dtype=F64)
    outs, attrs = run_kernel("cast", {"X": x}, {"out_dtype": "float32"})
    assert outs["Out"].dtype == torch.float32
    assert torch.equal(outs["Out"], x.float())
    g = torch.randn(3, 4, generator=case_gen("cast-g"), dtype=torch.float32)
    got = get_op_def("cast_grad").kernel({"X": x, "Out@GRAD": g}, attrs, {"X@GRAD": [True]})
    assert got["X@GRAD"].dtype == F64, "the gradient has the dtype of the forward input"
    assert torch.equal(got["X@GRAD"], g.double())


# --- random initialisers -----------------------------------------------------------------------

_RANDOM = {
    "uniform_random": {"shape": [100, 60], "min": -0.5, "max": 2.0, "dtype": "float64"},
    "gaussian_random": {"shape": [100, 60], "mean": 1.5, "std": 0.5, "dtype": "float64"},
}


@covers("uniform_random", "gaussian_random")
@pytest.mark.parametrize("type", sorted(_RANDOM))
def test_random_seeded(type):
    attrs = _RANDOM[type]
    a = run_kernel(type, {}, dict(attrs, seed=11))[0]["Out"]
    b = run_kernel(type, {}, dict(attrs, seed=11))[0]["Out"]
    c = run_kernel(type, {}, dict(attrs, seed=12))[0]["Out"]
    assert a.shape == (100, 60) and a.dtype == F64
    assert torch.equal(a, b), "same seed must give the same values"
    assert not torch.equal(a, c), "different seeds must give different values"
    n = a.numel()
    if type == "uniform_random":
        assert a.min() >= -0.5 and a.max() < 2.0
        assert abs(a.mean().item() - 0.75) < 4 * 2.5 / (12 * n) ** 0.5
    else:
        assert abs(a.mean().item() - 1.5) < 4 * 0.5 / n ** 0.5
        assert abs(a.std().item() - 0.5) < 0.05
    # seed 0 draws from torch's global generator
    torch.manual_seed(123)
    d = run_kernel(type, {}, dict(attrs, seed=0))[0]["Out"]
    torch.manual_seed(123)
    e = run_kernel(type, {}, dict(attrs, seed=0))[0]["Out"]
    assert torch.equal(d, e)


@covers("uniform_random", "gaussian_random")
def test_random_float32_default_dtype():
    out = run_kernel("uniform_random", {}, {"shape": [4, 3], "seed": 1})[0]["Out"]
    assert out.dtype == torch.float32 and out.shape == (4, 3)
    assert out.min() >= -1.0 and out.max() < 1.0


# --- optimizers: five steps against torch.optim --------------------------------------------------

STEPS = 5


def _opt_data(key, shape=(3, 4)):
    gen = case_gen(key)
    p0 = torch.randn(shape, generator=gen, dtype=F64)
    grads = [torch.randn(shape, generator=gen, dtype=F64) for _ in range(STEPS)]
    return p0, grads


def _torch_steps(make_opt, p0, grads):
    p = torch.nn.Parameter(p0.clone())
    opt = make_opt([p])
    history = []
    for g in grads:
        p.grad = g.clone()
        opt.step()
        history.append(p.detach().clone())
    return history, opt.state[p]


@covers("sgd")
@pytest.mark.parametrize("wd", [0.0, 0.1])
def test_sgd_matches_torch(wd):
    p0, grads = _opt_data(f"sgd{wd}")
    lr = 0.05
    expected, _ = _torch_steps(lambda ps: torch.optim.SGD(ps, lr=lr, weight_decay=wd), p0, grads)
    op_def = get_op_def("sgd")
    attrs = op_def.full_attrs({"weight_decay": wd})
    p, lr_t = p0.clone(), torch.tensor([lr], dtype=F64)
    for step, (g, e) in enumerate(zip(grads, expected, strict=True)):
        g_before = g.clone()
        outs = op_def.kernel({"Param": p, "Grad": g, "LearningRate": lr_t}, attrs)
        assert outs["ParamOut"] is p, "sgd updates Param in place"
        assert torch.equal(g, g_before), "sgd must not change Grad"
        assert_match(p, e, f"sgd step {step + 1}")


@covers("momentum")
@pytest.mark.parametrize("nesterov", [False, True], ids=["plain", "nesterov"])
@pytest.mark.parametrize("wd", [0.0, 0.05])
def test_momentum_matches_torch(nesterov, wd):
    p0, grads = _opt_data(f"momentum{nesterov}{wd}")
    lr, mu = 0.1, 0.9
    expected, state = _torch_steps(
        lambda ps: torch.optim.SGD(ps, lr=lr, momentum=mu, nesterov=nesterov, weight_decay=wd),
        p0, grads)
    op_def = get_op_def("momentum")
    attrs = op_def.full_attrs({"mu": mu, "use_nesterov": nesterov, "weight_decay": wd})
    p, v, lr_t = p0.clone(), torch.zeros_like(p0), torch.tensor([lr], dtype=F64)
    for step, (g, e) in enumerate(zip(grads, expected, strict=True)):
        outs = op_def.kernel({"Param": p, "Grad": g, "Velocity": v, "LearningRate": lr_t},
                             attrs)
        assert outs["ParamOut"] is p and outs["VelocityOut"] is v
        assert_match(p, e, f"momentum step {step + 1}")
    assert_match(v, state["momentum_buffer"], "momentum velocity")


@covers("adam")
@pytest.mark.parametrize("decoupled", [False, True], ids=["adam", "adamw"])
@pytest.mark.parametrize("wd", [0.0, 0.1])
def test_adam_matches_torch(decoupled, wd):
    p0, grads = _opt_data(f"adam{decoupled}{wd}")
    lr, b1, b2, eps = 0.01, 0.8, 0.95, 1e-7
    cls = torch.optim.AdamW if decoupled else torch.optim.Adam
    expected, state = _torch_steps(
        lambda ps: cls(ps, lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd), p0, grads)
    op_def = get_op_def("adam")
    attrs = op_def.full_attrs({"beta1": b1, "beta2": b2, "epsilon": eps, "weight_decay": wd,
                               "decoupled": decoupled})
    p, m1, m2 = p0.clone(), torch.zeros_like(p0), torch.zeros_like(p0)
    # Beta*Pow hold beta**step and start at 1.0 (step 0)
    b1p, b2p = torch.ones(1, dtype=F64), torch.ones(1, dtype=F64)
    lr_t = torch.tensor([lr], dtype=F64)
    for step, (g, e) in enumerate(zip(grads, expected, strict=True)):
        ins = {"Param": p, "Grad": g, "LearningRate": lr_t, "Moment1": m1, "Moment2": m2,
               "Beta1Pow": b1p, "Beta2Pow": b2p}
        outs = op_def.kernel(ins, attrs)
        for slot in ("Param", "Moment1", "Moment2", "Beta1Pow", "Beta2Pow"):
            assert outs[slot + "Out"] is ins[slot], f"adam updates {slot} in place"
        assert_match(p, e, f"adam step {step + 1}")
    assert_match(m1, state["exp_avg"], "adam Moment1")
    assert_match(m2, state["exp_avg_sq"], "adam Moment2")
    assert_match(b1p, torch.tensor([b1 ** STEPS], dtype=F64), "adam Beta1Pow")
    assert_match(b2p, torch.tensor([b2 ** STEPS], dtype=F64), "adam Beta2Pow")


@covers("amp_unscale", "amp_update_scale")
def test_loss_scaling_ops_follow_torch_grad_scaler():
    # the same rule as torch.amp.GradScaler (growth 2, backoff 0.5), computed on the device
    unscale, update = get_op_def("amp_unscale"), get_op_def("amp_update_scale")
    attrs = update.full_attrs({"growth_interval": 2})
    scale = torch.tensor(8.0)
    tracker, skipped = torch.zeros((), dtype=torch.int32), torch.zeros((), dtype=torch.int64)
    history = []
    for grads in ([rn(3), rn(2, 2)], [rn(3), rn(2, 2)], [torch.tensor([1.0, float("inf")])],
                  [rn(3)]):
        grads = [g.float() for g in grads]
        want = [g / scale for g in grads]
        out = unscale.kernel({"Grads": grads, "Scale": scale}, {})
        assert out["GradsOut"][0] is grads[0]  # in place
        found = float(out["FoundInf"])
        if not found:
            assert all(torch.equal(a, b) for a, b in zip(grads, want, strict=True))
        update.kernel({"Scale": scale, "GrowthTracker": tracker, "FoundInf": out["FoundInf"],
                       "SkippedSteps": skipped}, attrs)
        history.append((found, float(scale), int(tracker), int(skipped)))
    assert history == [(0.0, 8.0, 1, 0), (0.0, 16.0, 0, 0), (1.0, 8.0, 0, 1), (0.0, 8.0, 1, 1)]


@pytest.mark.parametrize("type", ["sgd", "momentum", "adam"])
def test_a_skipped_update_changes_nothing_and_a_kept_one_matches(type):
    op_def = get_op_def(type)
    attrs = op_def.full_attrs({})
    p0, (g, *_) = _opt_data(f"skip{type}")
    state = {"sgd": [], "momentum": ["Velocity"],
             "adam": ["Moment1", "Moment2", "Beta1Pow", "Beta2Pow"]}[type]

    def fresh():
        ins = {"Param": p0.clone(), "Grad": g, "LearningRate": torch.tensor([0.1], dtype=F64)}
        for s in state:
            ins[s] = torch.full_like(p0, 0.5) if "Pow" not in s else \
                torch.full((1,), 0.9, dtype=F64)
        return ins
    plain, skipped, kept = fresh(), fresh(), fresh()
    before = {k: v.clone() for k, v in skipped.items()}
    op_def.kernel(plain, attrs)
    op_def.kernel(dict(skipped, SkipUpdate=torch.tensor(1.0)), attrs)
    out = op_def.kernel(dict(kept, SkipUpdate=torch.tensor(0.0)), attrs)
    for slot in ["Param"] + state:
        assert torch.equal(skipped[slot], before[slot]), f"{type}: skipped {slot} changed"
        assert torch.equal(kept[slot], plain[slot]), f"{type}: kept {slot} differs"
        assert out[slot + "Out"] is kept[slot]


@covers("lr_schedule")
@pytest.mark.parametrize("attrs, rule", [
    ({"kind": "step", "step_size": 3, "gamma": 0.5}, lambda t: 0.5 ** (t // 3)),
    ({"kind": "multistep", "milestones": [2, 5], "gamma": 0.1},
     lambda t: 0.1 ** ((t >= 2) + (t >= 5))),
    ({"kind": "exponential", "gamma": 0.9}, lambda t: 0.9 ** t),
    ({"kind": "cosine", "T_max": 6, "eta_min": 0.01},
     lambda t: (0.01 + (2.0 - 0.01) * (1 + math.cos(math.pi * t / 6)) / 2) / 2.0),
    ({"kind": "piecewise", "boundaries": [3], "values": [4.0, 1.0]},
     lambda t: (4.0 if t < 3 else 1.0) / 2.0),
    ({"kind": "warmup", "warmup_steps": 4, "start_lr": 0.0, "end_lr": 2.0},
     lambda t: min(t, 4) / 4),
], ids=lambda v: v["kind"] if isinstance(v, dict) else "")
def test_lr_schedule_rules(attrs, rule):
    op_def = get_op_def("lr_schedule")
    a = op_def.full_attrs(dict(attrs, base_lr=2.0, dtype="float64"))
    for t in range(9):
        got = op_def.kernel({"Step": torch.tensor(float(t), dtype=F64)}, a)["LearningRate"]
        assert got.dtype == F64 and got.dim() == 0
        assert math.isclose(float(got), 2.0 * rule(t), rel_tol=1e-12), (attrs, t)
    table = op_def.full_attrs({"kind": "table", "base_lr": 2.0, "dtype": "float32"})
    vals = torch.tensor([1.0, 0.5, 0.25], dtype=F64)
    got = [float(op_def.kernel({"Step": torch.tensor(float(t), dtype=F64), "Table": vals},
                               table)["LearningRate"]) for t in range(5)]
    assert got == [2.0, 1.0, 0.5, 0.5, 0.5]


@covers("accuracy", "argmax", "argmin")
@pytest.mark.parametrize("k", [1, 3])
def test_metric_ops(k):
    x, label = rn(12, 5), torch.randint(0, 5, (12, 1))
    out = get_op_def("accuracy").kernel({"X": x, "Label": label}, {"k": k})
    want = (x.topk(k, dim=1).indices == label).any(1).sum()
    assert int(out["Correct"]) == int(want) and int(out["Total"]) == 12
    assert float(out["Accuracy"]) == pytest.approx(int(want) / 12)
    for name, fn in (("argmax", torch.argmax), ("argmin", torch.argmin)):
        got = get_op_def(name).kernel({"X": x}, {"axis": 0, "keepdim": True})["Out"]
        assert torch.equal(got, fn(x, dim=0, keepdim=True))


# --- shape inference with a -1 batch dimension ---------------------------------------------------

def _infer(type, inputs, outputs, attrs=None):
    """inputs: slot -> list of (shape, dtype); outputs: slot -> number of vars."""
    op = OpDesc(type,
                {k: [f"{k.lower()}{i}" for i in range(len(v))] for k, v in inputs.items()},
                {k: [f"{k.lower()}_out{i}" for i in range(n)] for k, n in outputs.items()},
                attrs or {})
    return infer_outputs(get_op_def(type), op, inputs)


F32, I64 = "float32", "int64"

INFER_CASES = [
    ("mul", {"X": [([-1, 13], F32)], "Y": [([13, 4], F32)]}, {}, {"Out": [([-1, 4], F32)]}),
    ("elementwise_add", {"X": [([-1, 3, 4], F32)], "Y": [([3], F32)]}, {"axis": 1},
     {"Out": [([-1, 3, 4], F32)]}),
    ("matmul", {"X": [([-1, 3, 4], F32)], "Y": [([4, 5], F32)]}, {"transpose_Y": False},
     {"Out": [([-1, 3, 5], F32)]}),
    ("conv2d", {"Input": [([-1, 3, 8, 8], F32)], "Filter": [([4, 3, 3, 3], F32)]},
     {"paddings": [1, 1]}, {"Output": [([-1, 4, 8, 8], F32)]}),
    ("pool2d", {"X": [([-1, 4, 8, 8], F32)]}, {"ksize": [2, 2], "strides": [2, 2]},
     {"Out": [([-1, 4, 4, 4], F32)]}),
    ("reshape", {"X": [([-1, 3, 4], F32)]}, {"shape": [0, -1]}, {"Out": [([-1, 12], F32)]}),
    ("reshape", {"X": [([-1, 12], F32)]}, {"shape": [-1, 3, 4]}, {"Out": [([-1, 3, 4], F32)]}),
    ("transpose", {"X": [([-1, 3, 4], F32)]}, {"axis": [0, 2, 1]}, {"Out": [([-1, 4, 3], F32)]}),
    ("reduce_sum", {"X": [([-1, 3, 4], F32)]}, {"dim": [1]}, {"Out": [([-1, 4], F32)]}),
    ("mean", {"X": [([-1, 4], F32)]}, {}, {"Out": [([], F32)]}),
    ("concat", {"X": [([-1, 3], F32), ([-1, 4], F32)]}, {"axis": 1}, {"Out": [([-1, 7], F32)]}),
    ("split", {"X": [([-1, 6], F32)]}, {"num": 3, "axis": 1},
     {"Out": [([-1, 2], F32)] * 3}),
    ("sum", {"X": [([-1, 5], F32)] * 3}, {}, {"Out": [([-1, 5], F32)]}),
    ("cast", {"X": [([-1, 3], "float64")]}, {"out_dtype": F32}, {"Out": [([-1, 3], F32)]}),
    ("lookup_table", {"W": [([100, 8], F32)], "Ids": [([-1], I64)]}, {},
     {"Out": [([-1, 8], F32)]}),
    ("softmax_with_cross_entropy", {"Logits": [([-1, 10], F32)], "Label": [([-1, 1], I64)]}, {},
     {"Softmax": [([-1, 10], F32)], "Loss": [([-1, 1], F32)]}),
    ("cross_entropy", {"X": [([-1, 10], F32)], "Label": [([-1, 1], I64)]}, {},
     {"Y": [([-1, 1], F32)]}),
    ("batch_norm", {"X": [([-1, 3, 4, 4], F32)], "Scale": [([3], F32)], "Bias": [([3], F32)],
                    "Mean": [([3], F32)], "Variance": [([3], F32)]}, {},
     {"Y": [([-1, 3, 4, 4], F32)], "MeanOut": [([3], F32)], "VarianceOut": [([3], F32)],
      "SavedMean": [([3], F32)], "SavedVariance": [([3], F32)]}),
    ("layer_norm", {"X": [([-1, 3, 4], F32)], "Scale": [([12], F32)], "Bias": [([12], F32)]}, {},
     {"Y": [([-1, 3, 4], F32)]}),
    ("dropout", {"X": [([-1, 5], F32)]}, {"dropout_prob": 0.5},
     {"Out": [([-1, 5], F32)], "Mask": [([-1, 5], "uint8")]}),
    ("fill_constant", {}, {"shape": [2, 3], "dtype": I64}, {"Out": [([2, 3], I64)]}),
    ("uniform_random", {}, {"shape": [4, 5]}, {"Out": [([4, 5], F32)]}),
    ("elementwise_add_grad", {"X": [([-1, 3], F32)], "Y": [([3], F32)],
                              "Out@GRAD": [([-1, 3], F32)]}, {},
     {"X@GRAD": [([-1, 3], F32)], "Y@GRAD": [([3], F32)]}),
]


@pytest.mark.parametrize("type,inputs,attrs,expected", INFER_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(INFER_CASES)])
def test_infer_outputs(type, inputs, attrs, expected):
    got = _infer(type, inputs, {k: len(v) for k, v in expected.items()}, attrs)
    for slot, specs in expected.items():
        got_specs = [(list(sh), dt) for sh, dt in got[slot]]
        assert got_specs == [(list(sh), dt) for sh, dt in specs], f"{type} {slot}"


def test_infer_unknown_shape_gives_none():
    assert _infer("relu", {"X": [(None, F32)]}, {"Out": 1}) is None


# --- coverage ------------------------------------------------------------------------------------

def test_every_op_is_covered():
    forward = {c.type for c in CASES} | _SPECIAL_FORWARD
    grad = {p.values[0].type for p in GRAD_PARAMS} | _SPECIAL_GRAD
    # ops whose names start with "_" are registered by other test modules for their own use
    ops = [t for t in registered_ops() if not get_op_def(t).is_grad and not t.startswith("_")]
    missing_fwd = [t for t in ops if t not in forward and t not in NOT_TESTED_HERE]
    assert not missing_fwd, f"ops without a forward test in test_ops.py: {missing_fwd}"
    differentiable = [t for t in ops if get_op_def(t + "_grad", missing_ok=True) is not None]
    missing_grad = [t for t in differentiable if t not in grad and t not in NOT_TESTED_HERE]
    assert not missing_grad, f"differentiable ops without a gradient test: {missing_grad}"
    for t in NOT_TESTED_HERE:
        assert get_op_def(t, missing_ok=True) is not None, f"stale NOT_TESTED_HERE entry {t}"
