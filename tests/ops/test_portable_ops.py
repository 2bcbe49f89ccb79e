"""CPU-only ATen overloads run off the CPU (``ssaexec.ops.portable``).

``se.from_torch`` traces attention on the CPU as
``aten._scaled_dot_product_flash_attention_for_cpu``, which has no CUDA kernel. Off
the CPU the executor runs a composition of device-generic ops instead; here that
composition runs on CPU tensors (called directly) and must equal the CPU kernel,
values and strides (a later ``view`` in the program relies on the strides).
"""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import ssaexec as se
from ssaexec.ops.aten import aten_op_def
from ssaexec.ops.portable import PORTABLE, PortableOverload
from ssaexec.core.place import MetaPlace

FWD = "aten._scaled_dot_product_flash_attention_for_cpu.default"
BWD = "aten._scaled_dot_product_flash_attention_for_cpu_backward.default"
aten = torch.ops.aten


def _qkv(dtype, lq=5, lk=6, transposed=False):
    g = torch.Generator().manual_seed(0)
    if transposed:  # as a model's heads arrive: batch, length, heads in memory
        return [torch.randn(2, n, 3, 4, generator=g).to(dtype).transpose(1, 2)
                for n in (lq, lk, lk)]
    return [torch.randn(2, 3, n, 4, generator=g).to(dtype) for n in (lq, lk, lk)]


CASES = [
    pytest.param({}, id="plain"),
    pytest.param({"is_causal": True}, id="causal"),
    pytest.param({"scale": 0.3}, id="scale"),
    pytest.param({"attn_mask": "float"}, id="float-mask"),
]


@pytest.mark.parametrize("transposed", [False, True], ids=["dense", "transposed"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", CASES)
def test_the_composition_equals_the_cpu_kernel(case, dtype, transposed):
    q, k, v = _qkv(dtype, transposed=transposed)
    kw = dict(case)
    if kw.get("attn_mask") == "float":
        kw["attn_mask"] = torch.randn(5, 6).to(dtype)
    causal = kw.pop("is_causal", False)
    out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, **kw)
    out2, lse2 = PORTABLE[FWD](q, k, v, 0.0, causal, **kw)
    tol = {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {}
    for a, b in ((out, out2), (lse, lse2)):
        assert a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
        torch.testing.assert_close(b, a, **tol)
    grad = torch.randn_like(out)
    want = aten._scaled_dot_product_flash_attention_for_cpu_backward(
        grad, q, k, v, out, lse, 0.0, causal, **kw)
    got = PORTABLE[BWD](grad, q, k, v, out, lse, 0.0, causal, **kw)
    for a, b in zip(want, got, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
        torch.testing.assert_close(b, a, **tol)


def test_what_the_cpu_kernel_refuses_is_refused_off_the_cpu():
    q, k, v = _qkv(torch.float32)
    for fn in (aten._scaled_dot_product_flash_attention_for_cpu, PORTABLE[FWD]):
        with pytest.raises(RuntimeError, match="dropout"):
            fn(q, k, v, 0.5)
        with pytest.raises(RuntimeError, match="head size"):
            fn(q, k, v[..., :3])


def test_the_op_def_calls_the_kernel_on_cpu_and_the_composition_elsewhere():
    op_def = aten_op_def(FWD)
    portable = op_def.bare_overload  # the guard wraps it for program files
    assert isinstance(portable, PortableOverload) and portable.overload is \
        aten._scaled_dot_product_flash_attention_for_cpu.default
    q, k, v = (t.to("meta") for t in _qkv(torch.float32))
    out, lse = op_def.overload(q, k, v)  # no meta kernel is needed for the composition
    assert out.device.type == "meta" and out.shape == (2, 3, 5, 4) and lse.shape == (2, 3, 5)


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "readable"])
def test_an_imported_transformer_trains_on_a_non_cpu_place(compiled):
    # traced on the CPU, its attention is the CPU-only overload; on meta places (a GPU's
    # stand-in) every step must take the composition, on both paths
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    model = nn.Sequential(nn.TransformerEncoder(layer, 1, enable_nested_tensor=False),
                          nn.Flatten(), nn.Linear(32, 3))
    feed = {"input": torch.randn(4, 4, 8), "target": torch.randint(0, 3, (4,))}
    main, startup, loss = se.from_torch(model, feed, loss_fn=F.cross_entropy,
                                        optimizer=se.optimizer.SGD(0.1))
    assert any(op.type == FWD for op in main.global_block().ops)
    strategy = se.ExecutionStrategy(compiled=compiled)
    with se.ParallelExecutor([MetaPlace(0), MetaPlace(1)], main, startup, loss,
                             scope=se.Scope(), exec_strategy=strategy) as pe:
        for _ in range(2):
            pe.run([], feed=feed)
        w = pe.local_scopes[1].find_var(main.all_parameters()[0].name)
    assert w.device.type == "meta"


@pytest.mark.cuda
def test_an_imported_transformer_matches_eager_on_a_gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    model = nn.Sequential(nn.TransformerEncoder(layer, 1, enable_nested_tensor=False),
                          nn.Flatten(), nn.Linear(32, 3)).double()
    feed = {"input": torch.randn(4, 4, 8, dtype=torch.float64),
            "target": torch.randint(0, 3, (4,))}
    main, startup, loss = se.from_torch(model, feed, loss_fn=F.cross_entropy,
                                        optimizer=se.optimizer.SGD(0.1))
    want = F.cross_entropy(model.cuda()(feed["input"].cuda()), feed["target"].cuda())
    with se.ParallelExecutor([se.CUDAPlace(0)], main, startup, loss, scope=se.Scope()) as pe:
        got, = pe.run([loss], feed=feed)
    torch.testing.assert_close(torch.as_tensor(got).double().cpu(), want.detach().cpu())
