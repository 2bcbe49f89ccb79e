"""Fused optimizer updates on the GPU's terms, checked on the CPU (issue 30, item 10).

* fp16 updates (dynamic loss scaling: ``SkipUpdate``) fuse like bf16 ones: one
  ``_foreach_clone`` snapshot and one select per updated tensor, not a clone, a
  ``where`` and a copy per tensor around unfused per-parameter kernels. A real
  ``TorchDispatchMode`` counts the ATen calls of one step.
* the learning rate reaches torch's foreach ops through their ``Tensor`` overload
  (one 0-dim tensor), not a list ``[lr] * n``, which CUDA runs one kernel per tensor.
  The ``meta`` device stands in for the GPU (``_minus_lr`` reads a CPU lr on the host).

Numerics: a skipped update leaves every tensor bit-identical, an unskipped one equals
the plain update bit for bit, with inf and NaN gradients too.
"""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import ssaexec as se
from ssaexec.core import compat
from ssaexec.program.example_models import build_cnn, make_optimizer
from ssaexec.ops import optim as optim_ops
from ssaexec.ops.registry import get_op_def


class _Calls(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def _cnn(opt):
    main, startup, loss = build_cnn("float32", make_optimizer(opt, 0.01), size=8, filters=(4, 6))
    g = torch.Generator().manual_seed(1)
    feed = {"img": torch.randn(16, 1, 8, 8, generator=g),
            "label": torch.randint(0, 10, (16, 1), generator=g)}
    return main, startup, loss, feed


def _step_calls(opt, amp):
    """ATen calls of one steady step (one place, one thread: the mode is thread-local)."""
    main, startup, loss, feed = _cnn(opt)
    st = se.ExecutionStrategy(amp=amp, num_threads=1)
    with se.ParallelExecutor(se.cpu_places(1), main, startup, loss, exec_strategy=st,
                             scope=se.Scope()) as pe:
        for _ in range(2):
            pe.run([loss], feed=feed)
        with _Calls() as calls:
            pe.run([loss], feed=feed)
    return calls.names, len(main.all_parameters())


@pytest.mark.parametrize("opt, state", [("sgd", 1), ("momentum", 2), ("adam", 5)])
def test_fp16_updates_fuse_like_bf16(opt, state):
    bf16, n = _step_calls(opt, "bf16")
    fp16, _ = _step_calls(opt, "fp16")
    # loss scaling's own ops (scale the seed, unscale, update the scale: 7 calls) plus,
    # for the skip, one snapshot, one comparison and one select per updated tensor. Before
    # the fix the Adam step made 386 calls against 109 under bf16; now 158 (sgd 110 / 93,
    # momentum 120 / 95)
    assert len(fp16) <= len(bf16) + 10 + state * n, (len(fp16), len(bf16), n)
    # the one snapshot: torch's _foreach_clone, or on a torch without it (2.11) compat's
    # fallback, one fused multiply by 1
    snap = "aten._foreach_clone.default" if compat.FEATURES["foreach.clone"].native \
        else "aten._foreach_mul.Scalar"
    assert fp16.count(snap) - bf16.count(snap) == 1
    assert fp16.count("aten.clone.default") == bf16.count("aten.clone.default")
    assert fp16.count("aten.where.self_out") - bf16.count("aten.where.self_out") == state * n
    fused = {"sgd": "aten._foreach_add_.List", "momentum": "aten._foreach_mul_.Scalar",
             "adam": "aten._foreach_addcmul_.Scalar"}[opt]
    assert fp16.count(fused) == bf16.count(fused) >= 1


def _cols(op_type, shapes, device="cpu", bad=None):
    torch.manual_seed(2)
    cols = {"Param": [torch.randn(s) for s in shapes], "Grad": [torch.randn(s) for s in shapes]}
    if op_type == "momentum":
        cols["Velocity"] = [torch.randn(s) for s in shapes]
    if op_type == "adam":
        cols["Moment1"] = [torch.randn(s) for s in shapes]
        cols["Moment2"] = [torch.rand(s) for s in shapes]
        cols["Beta1Pow"] = [torch.tensor(0.9 ** (k + 1)) for k in range(len(shapes))]
        cols["Beta2Pow"] = [torch.tensor(0.999 ** (k + 1)) for k in range(len(shapes))]
    if bad is not None:  # an fp16 overflow: inf and NaN in the gradients
        cols["Grad"][0].view(-1)[0] = float("inf")
        cols["Grad"][-1].view(-1)[-1] = bad
    return {s: [t.to(device) for t in v] for s, v in cols.items()}


KINDS = {"sgd": ("sgd", {}), "momentum": ("momentum", {"mu": 0.9}),
         "nesterov": ("momentum", {"mu": 0.9, "use_nesterov": True}),
         "adam": ("adam", {}), "adamw": ("adam", {"decoupled": True})}
SHAPES = [(3, 4), (4,), (2, 2, 3), ()]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "per-parameter"])
def test_a_skipped_update_changes_nothing_and_an_unskipped_one_is_the_plain_update(
        kind, fused, device):
    # on CUDA the lr stays a tensor (the Tensor overloads): the same check covers them
    op_type, attrs = KINDS[kind]
    attrs = get_op_def(op_type).full_attrs({**attrs, "weight_decay": 0.01})
    kernel = get_op_def(op_type).kernel
    lr = torch.tensor(0.1, device=device)

    def update(cols, skip):
        if fused:
            optim_ops.FUSED[op_type](cols, lr, attrs, skip)
            return
        for k in range(len(SHAPES)):
            ins = {s: v[k] for s, v in cols.items()}
            kernel({**ins, "LearningRate": lr, "SkipUpdate": skip}, attrs)

    plain = _cols(op_type, SHAPES, device)
    for k in range(len(SHAPES)):
        kernel({**{s: v[k] for s, v in plain.items()}, "LearningRate": lr}, attrs)
    kept = _cols(op_type, SHAPES, device)
    update(kept, torch.tensor(0.0, device=device))
    for slot in plain:
        for a, b in zip(plain[slot], kept[slot], strict=True):
            assert torch.equal(a, b) and a.view(-1).tolist() == b.view(-1).tolist(), slot
    for bad in (float("nan"), float("-inf")):
        before = _cols(op_type, SHAPES, device, bad=bad)
        skipped = _cols(op_type, SHAPES, device, bad=bad)
        update(skipped, torch.tensor(1.0, device=device))
        for slot in before:
            for a, b in zip(before[slot], skipped[slot], strict=True):
                assert torch.equal(a.nan_to_num(), b.nan_to_num()), slot
                assert torch.equal(a.isnan(), b.isnan()), slot


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_learning_rate_reaches_foreach_through_the_tensor_overload(kind):
    op_type, attrs = KINDS[kind]
    attrs = get_op_def(op_type).full_attrs({**attrs, "weight_decay": 0.01})
    # on a device that is not the host the update multiplies by the lr tensor itself
    cols = _cols(op_type, SHAPES, device="meta")
    with _Calls() as calls:
        optim_ops.FUSED[op_type](cols, torch.tensor(0.1, device="meta"), attrs)
    names = calls.names
    # every list op whose second list would be [lr] * n beside tensors of other shapes
    mixed = [n for n in names if n.startswith("aten._foreach_mul") and
             n.endswith((".List", ".ScalarList"))]
    if op_type == "adam":
        # the one mixed-shape product left: m1 / denom times each parameter's own
        # 0-dim step size lr / (1 - beta1 ** t), which differs per parameter
        assert mixed == ["aten._foreach_mul.List"], names
        if attrs["decoupled"]:
            assert "aten._foreach_mul_.Tensor" in names, names
    else:
        assert not mixed, names
        assert "aten._foreach_mul.Tensor" in names, names


def test_fp16_fused_training_equals_the_readable_path_bit_for_bit():
    main, startup, loss, feed = _cnn("adam")
    got = {}
    for compiled in (True, False):
        st = se.ExecutionStrategy(amp="fp16", compiled=compiled)
        with se.ParallelExecutor(se.cpu_places(2), main, startup, loss, exec_strategy=st,
                                 scope=se.Scope()) as pe:
            for i in range(6):
                if i == 3:  # an overflowing step, skipped on both paths
                    for ls in pe.local_scopes:
                        ls.find_var("@AMP.loss_scale").fill_(2.0 ** 120)
                pe.run([loss], feed=feed)
            got[compiled] = {p.name: pe.local_scopes[1].find_var(p.name).clone()
                             for p in main.all_parameters()}
            got[compiled]["skipped"] = pe.local_scopes[1].find_var("@AMP.skipped_steps")
    assert int(got[True]["skipped"]) >= 1
    for name, value in got[False].items():
        assert torch.equal(got[True][name], value), name
