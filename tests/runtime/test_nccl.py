"""NCCL collective backends and the policy choosing one (runtime/nccl.py).

On CPU: the decision (``plan_backend``) from device indices and a table of
which backends can be used, the dtype table, the install hints and the
messages, and ``choose_local_collective`` on CPU places and on CUDA places that
exist only as descriptions (``CUDAPlace(i, device_index=d)``), which it must
handle without touching a GPU. Marked ``cuda``: a 1-GPU communicator
(``initAll([0])``) with each NCCL backend forced, against ``LocalCollective``.

Issue 30: sparse gradients take ``LocalCollective``'s row gathering on the NCCL
backends too (NCCL moves dense buffers only), and the executor's ``close`` closes
its collective (cupy's communicators are destroyed).
"""

import importlib.util

import pytest
import torch

import ssaexec as se
from ssaexec.core.errors import SSAExecError
from ssaexec.runtime.collective import LocalCollective, is_sparse_collective
from ssaexec.runtime.nccl import (
    BACKENDS, NCCL_DTYPES, CupyNcclCollective, Plan, TorchNcclCollective,
    choose_local_collective, communicator_buffers, cupy_unavailable, cupy_wheel,
    describe_plan, device_indices, install_hint, nccl_dtype, plan_backend,
    torch_nccl_unavailable)

ALL = {}  # every backend usable
NO_CUPY = {"cupy": "cupy is not installed"}
NONE = {"cupy": "cupy is not installed", "torch-nccl": "no NCCL in this torch"}


def _gpus(*ds):
    return [se.CUDAPlace(i, device_index=d) for i, d in enumerate(ds)]


class _Asked(dict):
    """A why-not table that records which backends the decision asked about."""

    def __init__(self, table):
        super().__init__(table)
        self.asked = []

    def __call__(self, name):
        self.asked.append(name)
        return self.get(name)


# --- the decision -------------------------------------------------------------------------
@pytest.mark.parametrize("indices, table, backend", [
    ([0, 1], ALL, "cupy"),
    ([0, 1, 2, 3], NO_CUPY, "torch-nccl"),
    ([2, 5], NONE, "local"),
    ([None, None], ALL, "local"),
    ([0, 0], ALL, "local"),
    ([0, 0, 1, 1], ALL, "local"),
    ([0, 1, 1], ALL, "local"),
    ([None, 0], ALL, "local"),
    ([0], ALL, "local"),
    ([], ALL, "local"),
])
def test_plan_backend_policy(indices, table, backend):
    assert plan_backend(indices, table.get).backend == backend


def test_plan_asks_about_libraries_only_for_distinct_gpus():
    for indices in ([None, None], [0, 0], [0, 1, 1], [None, 0], [3]):
        why = _Asked(ALL)
        plan_backend(indices, why)
        assert why.asked == [], indices
    why = _Asked(NO_CUPY)
    assert plan_backend([0, 1], why) == Plan("torch-nccl", "cupy NCCL: cupy is not installed")
    assert why.asked == ["cupy", "torch-nccl"]
    why = _Asked(ALL)
    assert plan_backend([0, 1], why) == Plan("cupy", "")
    assert why.asked == ["cupy"]  # torch.cuda.nccl is not probed once cupy serves


def test_plan_reasons_name_the_situation():
    assert plan_backend([None] * 3, ALL.get).reason == "CPU places"
    assert plan_backend([None, 1], ALL.get).reason == "CPU and CUDA places mixed"
    assert plan_backend([0, 0], ALL.get).reason == "all 2 places on cuda:0"
    r = plan_backend([0, 0, 1, 2, 2], ALL.get).reason
    assert "cuda:0 holds places 0, 1" in r and "cuda:2 holds places 3, 4" in r
    assert "NCCL refuses two ranks on one device" in r
    r = plan_backend([0, 1], NONE.get).reason
    assert r == "no NCCL backend: cupy NCCL: cupy is not installed; " \
                "torch.cuda.nccl: no NCCL in this torch"


@pytest.mark.parametrize("prefer", ["cupy", "torch-nccl"])
def test_prefer_forces_an_nccl_backend(prefer):
    assert plan_backend([0, 1], ALL.get, prefer) == Plan(prefer, "forced")
    # one place on one GPU: a 1-rank communicator, used only when asked for
    assert plan_backend([0], ALL.get, prefer) == Plan(prefer, "forced")
    with pytest.raises(SSAExecError, match=f"'{prefer}' cannot be used: nope"):
        plan_backend([0, 1], {prefer: "nope"}.get, prefer)
    for indices, why in [([0, 0], "all 2 places on cuda:0"), ([None, None], "CPU places"),
                         ([0, 1, 1], "cuda:1 holds places 1, 2"), ([None, 0], "mixed")]:
        with pytest.raises(SSAExecError, match=why) as e:
            plan_backend(indices, ALL.get, prefer)
        assert "NCCL needs one place per GPU" in str(e.value)


def test_prefer_local_and_auto_and_unknown():
    why = _Asked(ALL)
    assert plan_backend([0, 1], why, "local") == Plan("local", "forced")
    assert why.asked == []
    assert plan_backend([0, 1], ALL.get, "auto") == plan_backend([0, 1], ALL.get)
    with pytest.raises(SSAExecError, match="unknown collective backend 'nccl'.*cupy, "
                                           "torch-nccl, local"):
        plan_backend([0, 1], ALL.get, "nccl")
    assert BACKENDS == ("cupy", "torch-nccl", "local")


def test_notice_is_one_line():
    assert describe_plan(Plan("cupy", ""), [0, 1]) == \
        "collective backend: cupy NCCL over cuda:0, cuda:1"
    assert describe_plan(Plan("torch-nccl", "cupy NCCL: missing"), [0, 3]) == \
        "collective backend: torch.cuda.nccl over cuda:0, cuda:3 (cupy NCCL: missing)"
    assert describe_plan(Plan("local", "CPU places"), [None, None]) == \
        "collective backend: local (CPU places)"
    for indices in ([0, 0, 1], [0, 1], [None]):
        text = describe_plan(plan_backend(indices, NONE.get), indices)
        assert "\n" not in text and text.startswith("collective backend: ")


def test_device_indices_touch_no_gpu():
    assert device_indices(se.cpu_places(2)) == [None, None]
    assert device_indices(_gpus(0, 0, 3)) == [0, 0, 3]
    assert device_indices([torch.device("cuda", 2), "cuda:1", "cpu", torch.device("cuda")]) \
        == [2, 1, None, 0]


# --- dtypes and install hints -------------------------------------------------------------
def test_dtype_table():
    assert NCCL_DTYPES == {
        torch.float32: "NCCL_FLOAT32", torch.float16: "NCCL_FLOAT16",
        torch.bfloat16: "NCCL_BFLOAT16", torch.float64: "NCCL_FLOAT64",
        torch.int32: "NCCL_INT32", torch.int64: "NCCL_INT64",
        torch.uint8: "NCCL_UINT8", torch.int8: "NCCL_INT8"}
    assert nccl_dtype(torch.bfloat16) == "NCCL_BFLOAT16"

    class FakeModule:  # stands for cupy.cuda.nccl's constants (ncclDataType_t values)
        NCCL_INT64 = 4
    assert nccl_dtype(torch.int64, FakeModule) == 4
    with pytest.raises(SSAExecError, match="do not take bool tensors.*float32, float16"):
        nccl_dtype(torch.bool)
    with pytest.raises(SSAExecError, match="complex64"):
        nccl_dtype(torch.complex64)


def test_install_hints_match_torch_cuda_version():
    assert cupy_wheel("12.8") == "cupy-cuda12x"
    assert cupy_wheel("13.0") == "cupy-cuda13x"
    assert cupy_wheel(None) is None and cupy_wheel("") is None
    h = install_hint("13.0")
    assert "`pip install cupy-cuda13x`" in h and "torch.version.cuda 13.0" in h
    assert "ssaexec[cuda13]" in h
    assert "`pip install cupy-cuda12x`" in install_hint("12.6")
    h = install_hint(None)
    assert "torch.version.cuda is None" in h and "cupy-cuda13x" in h and "cupy-cuda12x" in h


# --- the probes and choose_local_collective, for real, on this machine --------------------
def test_probes_say_why_in_one_line():
    for probe in (cupy_unavailable, torch_nccl_unavailable):
        why = probe()
        assert why is None or (why and "\n" not in why)
    if importlib.util.find_spec("cupy") is None:
        why = cupy_unavailable()
        assert why.startswith("cupy is not installed") and "pip install cupy-cuda" in why
    if torch.version.cuda is None:
        assert "torch.version.cuda is None" in torch_nccl_unavailable()


def test_choose_keeps_local_for_cpu_and_shared_gpu_places():
    for places, reason in [(se.cpu_places(3), "CPU places"),
                           (_gpus(0, 0), "all 2 places on cuda:0"),
                           (_gpus(0, 1, 1), "cuda:1 holds places 1, 2"),
                           (_gpus(4), "one place"),
                           ([se.CPUPlace(0), se.CUDAPlace(1)], "mixed")]:
        coll, name, notice = choose_local_collective(places)
        assert type(coll) is LocalCollective and name == "local"
        assert notice.startswith("collective backend: local (") and reason in notice


def test_choose_forced_local_on_distinct_gpus():
    coll, name, notice = choose_local_collective(_gpus(0, 1), prefer="local")
    assert type(coll) is LocalCollective and name == "local"
    assert notice == "collective backend: local (forced)"


def test_choose_local_collective_result_is_usable_on_cpu():
    coll, _, _ = choose_local_collective(se.cpu_places(2))
    ts = [torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0])]
    coll.all_reduce(ts, average=True)
    assert all(torch.equal(t, torch.tensor([2.0, 3.0])) for t in ts)


@pytest.mark.skipif(cupy_unavailable() is None or torch_nccl_unavailable() is None,
                    reason="an NCCL backend is usable here")
def test_choose_falls_back_to_local_without_nccl():
    # distinct GPUs described, no NCCL library usable: local, and the notice says why
    coll, name, notice = choose_local_collective(_gpus(0, 1))
    assert type(coll) is LocalCollective and name == "local"
    assert notice.startswith("collective backend: local (no NCCL backend: cupy NCCL: ")
    assert "torch.cuda.nccl: " in notice and "\n" not in notice
    with pytest.raises(SSAExecError, match="'cupy' cannot be used: .*pip install"):
        choose_local_collective(_gpus(0, 1), prefer="cupy")
    with pytest.raises(SSAExecError, match="'torch-nccl' cannot be used"):
        choose_local_collective(_gpus(0, 1), prefer="torch-nccl")


def test_nccl_collectives_refuse_shared_devices():
    for kind in (CupyNcclCollective, TorchNcclCollective):
        with pytest.raises(SSAExecError, match="NCCL refuses two ranks on one device"):
            kind([0, 0])
        with pytest.raises(SSAExecError, match="need CUDA devices"):
            kind(["cpu"])


# --- on a GPU: a 1-GPU communicator with each backend forced ------------------------------
GPU_BACKENDS = [
    pytest.param("cupy", marks=pytest.mark.skipif(
        importlib.util.find_spec("cupy") is None, reason="cupy is not installed")),
    "torch-nccl",
]
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32,
          torch.int64, torch.uint8, torch.int8]


def _values(dtype, shape, seed):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    return torch.randint(0, 50, shape, generator=g).to(dtype)


def _forced(backend, devices=(0,)):
    coll, name, notice = choose_local_collective([torch.device("cuda", d) for d in devices],
                                                 prefer=backend)
    assert name == backend and type(coll) is {"cupy": CupyNcclCollective,
                                              "torch-nccl": TorchNcclCollective}[backend]
    title = "cupy NCCL" if backend == "cupy" else "torch.cuda.nccl"
    over = ", ".join(f"cuda:{d}" for d in devices)
    assert notice == f"collective backend: {title} over {over} (forced)"
    return coll


@pytest.mark.cuda
@pytest.mark.parametrize("backend", GPU_BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_one_gpu_communicator_matches_local(backend, dtype):
    coll = _forced(backend)
    local = LocalCollective()
    comm = torch.cuda.Stream()
    cases = [("all_reduce", (), {}), ("reduce", (0,), {}), ("broadcast", (0,), {})]
    if dtype.is_floating_point:
        cases += [("all_reduce", (), {"average": True}), ("reduce", (0,), {"average": True})]
    for shape, seed in [((7, 3), 1), ((1000,), 2), ((), 3)]:
        x = _values(dtype, shape, seed).cuda()
        torch.cuda.synchronize()
        with torch.cuda.stream(comm):  # as the runtime does: the comm stream is current
            for op, args, kw in cases:
                mine, ref = [x.clone()], [x.clone()]
                getattr(coll, op)(mine, *args, label=op, **kw)
                getattr(local, op)(ref, *args, **kw)
                comm.synchronize()
                assert torch.equal(mine[0], ref[0]), (op, kw, shape)
            out = coll.all_gather([x.clone()])
            comm.synchronize()
            assert out[0].shape == (1, *x.shape) and torch.equal(out[0][0], x)
    torch.cuda.synchronize()


@pytest.mark.cuda
@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_one_gpu_non_contiguous_tensor_in_place(backend):
    coll = _forced(backend)
    base = torch.arange(12.0, device="cuda").reshape(3, 4)
    view = base.t()  # not contiguous: reduced in a copy, written back into the view
    assert not view.is_contiguous()
    coll.all_reduce([view])
    coll.broadcast([view], 0)
    torch.cuda.synchronize()
    assert torch.equal(base, torch.arange(12.0, device="cuda").reshape(3, 4))


@pytest.mark.cuda
@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_one_gpu_checks_devices_and_dtypes(backend):
    coll = _forced(backend)
    with pytest.raises(SSAExecError, match="x: tensors on devices \\[None\\], the communicator"):
        coll.all_reduce([torch.ones(2)], label="x")  # a CPU tensor
    if backend == "cupy":
        with pytest.raises(SSAExecError, match="do not take bool"):
            coll.all_reduce([torch.ones(2, dtype=torch.bool, device="cuda")])


@pytest.mark.cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_distinct_gpus_match_local(backend):
    n = torch.cuda.device_count()
    coll = _forced(backend, range(n))
    xs = [_values(torch.float64, (5, 6), seed) for seed in range(n)]
    for op, args in [("all_reduce", ()), ("reduce", (n - 1,)), ("broadcast", (1,))]:
        mine = [x.to(f"cuda:{d}") for d, x in enumerate(xs)]
        ref = [x.clone() for x in xs]
        getattr(coll, op)(mine, *args)
        getattr(LocalCollective(), op)(ref, *args)
        torch.cuda.synchronize()
        for m, r in zip(mine, ref, strict=True):
            torch.testing.assert_close(m.cpu(), r, rtol=1e-12, atol=1e-12)
    _, name, notice = choose_local_collective(_gpus(*range(n)))
    assert name in ("cupy", "torch-nccl") and "over cuda:0, cuda:1" in notice


# --- sparse gradients and close (issue 30) --------------------------------------------------
def _sparse_grads(n, device="cpu"):
    """One embedding gradient per place: rows touched by that place's batch, repeated."""
    out = []
    for k in range(n):
        g = torch.Generator().manual_seed(k)
        rows = torch.tensor([k, 3, 3, 7 - k])
        vals = torch.randn(4, 5, generator=g, dtype=torch.float64)
        out.append(torch.sparse_coo_tensor(rows.reshape(1, -1), vals, (10, 5)).to(device))
    return out


def test_what_reaches_nccl_is_dense_and_contiguous():
    base = torch.arange(12.0).reshape(3, 4)
    x, y = base, base.t()
    bufs = communicator_buffers([x, y])
    assert bufs[0] is x and bufs[1].is_contiguous() and torch.equal(bufs[1], y)
    with pytest.raises(SSAExecError, match="w@GRAD: sparse tensors have no dense buffer"):
        communicator_buffers(_sparse_grads(2), label="w@GRAD")
    assert is_sparse_collective(_sparse_grads(2)) and not is_sparse_collective([x, x])
    with pytest.raises(SSAExecError, match="w@GRAD: sparse and dense tensors mixed"):
        is_sparse_collective([_sparse_grads(1)[0], x], label="w@GRAD")


@pytest.mark.parametrize("kind", [CupyNcclCollective, TorchNcclCollective])
def test_nccl_collectives_gather_sparse_gradients_by_rows(kind):
    # A communicator that never starts (no NCCL on a CPU machine) over places whose
    # tensors this machine holds: the sparse path must not reach NCCL at all, and would
    # raise AttributeError on the unset library slot ("nccl" / "tnccl") if it did.
    coll = object.__new__(kind)
    coll.devices = [None, None, None]
    for op, args, kw in [("all_reduce", (), {}), ("all_reduce", (), {"average": True}),
                         ("reduce", (1,), {}), ("broadcast", (2,), {})]:
        mine, ref = _sparse_grads(3), _sparse_grads(3)
        getattr(coll, op)(mine, *args, label="emb@GRAD", **kw)
        getattr(LocalCollective(), op)(ref, *args, **kw)
        for m, r in zip(mine, ref, strict=True):
            assert m.is_sparse and torch.equal(m.to_dense(), r.to_dense()), (op, kw)
    dense = sum(g.to_dense() for g in _sparse_grads(3))
    got = _sparse_grads(3)
    coll.all_reduce(got)
    torch.testing.assert_close(got[0].to_dense(), dense, rtol=0, atol=1e-12)


class _ClosingCollective(LocalCollective):
    """A real local collective that also counts the executor's calls to ``close``."""

    __slots__ = ("closed",)

    def __init__(self):
        self.closed = 0

    def close(self):
        self.closed += 1


def test_closing_the_executor_closes_its_collective():
    main, startup = se.Program(), se.Program()
    with se.program_guard(main, startup):
        x = se.layers.data("x", [-1, 4])
        loss = se.layers.mean(se.layers.fc(x, 2))
        se.optimizer.SGD(0.1).minimize(loss)
    pe = se.ParallelExecutor(se.cpu_places(2), main, startup, loss, scope=se.Scope())
    coll = pe._collective = _ClosingCollective()  # used from the first step's graph on
    pe.run([loss], feed={"x": torch.ones(4, 4)})
    assert coll.closed == 0
    pe.close()
    assert coll.closed == 1
    LocalCollective().close()  # every backend has it


@pytest.mark.cuda
@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_one_gpu_sparse_gradient_matches_local(backend):
    coll = _forced(backend)
    mine = _sparse_grads(1, "cuda")
    ref = _sparse_grads(1)
    coll.all_reduce(mine, average=True)
    LocalCollective().all_reduce(ref, average=True)
    torch.cuda.synchronize()
    assert mine[0].is_sparse and torch.equal(mine[0].to_dense().cpu(), ref[0].to_dense())


@pytest.mark.cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_distinct_gpus_sparse_gradients_match_local(backend):
    n = torch.cuda.device_count()
    coll = _forced(backend, range(n))
    mine = [g.to(f"cuda:{d}") for d, g in enumerate(_sparse_grads(n))]
    ref = _sparse_grads(n)
    coll.all_reduce(mine)
    LocalCollective().all_reduce(ref)
    torch.cuda.synchronize()
    for d, (m, r) in enumerate(zip(mine, ref, strict=True)):
        assert m.is_sparse and m.device == torch.device("cuda", d)
        torch.testing.assert_close(m.to_dense().cpu(), r.to_dense(), rtol=1e-12, atol=1e-12)


@pytest.mark.cuda
@pytest.mark.skipif(importlib.util.find_spec("cupy") is None, reason="cupy is not installed")
def test_cupy_communicators_are_destroyed_by_close():
    coll = _forced("cupy")
    comms = list(coll.comms)
    coll.all_reduce([torch.ones(3, device="cuda")])
    coll.close()
    coll.close()  # idempotent
    assert coll.comms == [] and all(c.comm == 0 for c in comms)  # ncclCommDestroy ran
    with pytest.raises(SSAExecError, match="communicators are closed"):
        coll.all_reduce([torch.ones(3, device="cuda")])
