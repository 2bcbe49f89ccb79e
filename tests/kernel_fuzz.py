"""Kernel fuzzer: every allowlisted ATen overload, driven with hostile values, in a subprocess.

Program files may name any allowlisted ATen operator (``ssaexec.ops.policy``),
and many of torch's CPU kernels trust their inputs: index values, the shapes of
statistics and masks, sizes and strides (``ssaexec.ops.guards``). This module
looks for the next kernel that does, through ssaexec's own call path: every
case is encoded as a program op would be (tensors as ``"X[k]"`` references,
everything else as attributes) and run by the op's kernel
(``aten_op_def(type).kernel``), which calls the guarded overload exactly as the
compiled path does.

Seeds. Small torch workloads (forward and backward of MLPs, CNNs, norms,
attention, losses, indexing, factories ...) run under a dispatch mode that
records every allowlisted ATen call with its arguments; the few overloads that
eager torch does not reach are called directly. Every one of the 241 allowed
overloads gets at least one seed.

Hand-written ops (``--family hand``; issue 46). The registry's own kernels
(``batch_norm``, ``conv2d``, ``lookup_table``, their grads, the auto-grad ``vjp``
kernels ...) call ATen kernels on the program's values too. Their seeds are the
cases of ``tests/op_cases.py`` and, for each, its grad op fed the forward's results and
a gradient per output; each case calls the op's kernel (``get_op_def(type).kernel``),
what both execution paths call. Their mutations change one input slot (statistics,
saved statistics, gradients, ids: the same shape and value mutations, so a 1-element
mean over 8 channels or a gradient of another batch size) or one attribute.
``--family all`` (the default) runs both families.

Mutations, one per case (``mutations``): index tensors set to out-of-range,
negative and huge values; each tensor argument given another shape (one
element short or long, empty, 0-d, flattened, an extra dimension), NaN/inf
values, or (when optional and absent) a tensor of the wrong size; integers and
integer lists set to 0, -1, huge and negative values or lengthened/shortened;
floats to NaN, inf and huge; flags flipped; dtypes and strings swapped.

Oracle. Every case runs twice: on clean copies of its tensors (exact
allocations), and on *poisoned views*: each tensor a view into a larger buffer
whose surroundings hold a sentinel (NaN for floats, the largest value for
integers), laid out padded, strided (poison between elements) or transposed,
by turns. A case fails when

* the process dies (a signal: the worker runs under glibc's checking
  allocator, ``libc_malloc_debug`` with ``MALLOC_CHECK_=3``, so heap
  corruption aborts at the next free) or hangs;
* the poisoned run's results differ from the clean run's (an out-of-bounds
  read picks up the sentinels, or heap garbage);
* a sentinel around an input, or an input itself, was overwritten;
* a result holds more than ``max_tensor_elements`` elements (lowered to
  ``LIMIT``), or an allocation failed (a size guard let it through).

Raising an exception is a pass: a ``ProgramError`` from a guard or policy
("refused"), or torch's own check ("error"). Results of ops whose values are
undefined (``empty``-like ops) are compared by shape only.

Run ``python tests/kernel_fuzz.py [--sample N] [--rounds R] [--family F] [--unguarded]``
to fuzz from the command line (``--unguarded`` drives the raw kernels, which
is how the guards' table was found; for hand-written ops it switches every guard
off); ``tests/ops/test_kernel_fuzz.py`` runs it.
"""

import argparse
import collections
import math
import os
import random
import resource
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 2 ** 22          # max_tensor_elements inside the worker
ADDRESS_SPACE = 6 << 30  # RLIMIT_AS of the worker: a missed size guard fails, not swaps
CASE_SECONDS = 30.0      # per case, generous: a loaded 2-core machine; cases take ms
PAD = 64                 # poison elements on each side of an input
MALLOC_DEBUG = "/usr/lib/x86_64-linux-gnu/libc_malloc_debug.so.0"

# Results whose values are undefined: compared by shape and dtype only.
UNDEFINED_VALUES = frozenset({
    "aten.empty.memory_format", "aten.empty_strided.default", "aten.empty_like.default",
    "aten.new_empty.default",
})
# Results undefined for some arguments: _embedding_bag's max_indices outside max mode.
UNDEFINED_OUTPUTS = {"aten._embedding_bag.default": (3,)}


# --- seeds ------------------------------------------------------------------------------------
def _workloads(torch, F):
    """Small forward/backward programs; their ATen calls become the seeds."""
    def g(*s):
        return torch.randn(*s, requires_grad=True)

    def conv_pool():
        x = g(2, 3, 8, 8)
        y = F.conv2d(x, g(4, 3, 3, 3), g(4), padding=1)
        F.avg_pool2d(F.max_pool2d(y, 2), 2).sum().backward()
        F.adaptive_avg_pool2d(g(2, 3, 8, 8), (3, 3)).sum().backward()
        F.conv_transpose2d(g(1, 2, 4, 4), g(2, 3, 3, 3), stride=2).sum().backward()
        F.max_pool3d(g(1, 1, 4, 4, 4), 2).sum().backward()
        F.avg_pool3d(g(1, 1, 4, 4, 4), 2).sum().backward()
        F.adaptive_avg_pool3d(g(1, 2, 4, 4, 4), 2).sum().backward()
        torch.ops.aten.avg_pool1d(g(1, 2, 8), [2])
        torch.ops.aten.adaptive_avg_pool1d(g(1, 2, 8), [3])

    def norms():
        bn = torch.nn.BatchNorm2d(3)
        bn(g(2, 3, 4, 4)).sum().backward()
        bn.eval()
        bn(g(2, 3, 4, 4)).sum().backward()
        F.group_norm(g(2, 4, 3, 3), 2, g(4), g(4)).sum().backward()
        F.layer_norm(g(2, 3, 5), (5,), g(5), g(5)).sum().backward()
        x, w, b = torch.randn(2, 3, 4, 4), torch.randn(3), torch.randn(3)
        rm, rv = torch.randn(3), torch.rand(3) + 0.5
        aten = torch.ops.aten
        aten._native_batch_norm_legit.no_stats(x, w, b, True, 0.1, 1e-5)
        aten._native_batch_norm_legit_functional(x, w, b, rm, rv, True, 0.1, 1e-5)
        aten._native_batch_norm_legit_no_training(x, w, b, rm, rv, 0.1, 1e-5)

    def embeddings_losses():
        e = g(10, 4)
        F.embedding(torch.tensor([[1, 2], [3, 9]]), e).sum().backward()
        F.embedding_bag(torch.tensor([1, 2, 3, 4]), e, torch.tensor([0, 2]),
                        mode="sum").sum().backward()
        F.embedding_bag(torch.tensor([1, 2, 3, 4]), e, torch.tensor([0, 2]), mode="max")
        F.cross_entropy(g(4, 5), torch.tensor([0, 1, 4, 2])).backward()
        F.nll_loss(torch.log_softmax(g(4, 5), 1), torch.tensor([0, 1, 4, 2]),
                   weight=torch.rand(5)).backward()
        t = torch.randn(3, 4)
        F.mse_loss(g(3, 4), t).backward()
        F.huber_loss(g(3, 4), t).backward()
        F.smooth_l1_loss(g(3, 4), t).backward()
        F.binary_cross_entropy(torch.rand(3, 4, requires_grad=True), torch.rand(3, 4)).backward()
        F.binary_cross_entropy_with_logits(g(3, 4), torch.rand(3, 4)).backward()

    def attention_activations():
        F.scaled_dot_product_attention(g(1, 2, 4, 8), g(1, 2, 4, 8), g(1, 2, 4, 8)).sum().backward()
        F.scaled_dot_product_attention(g(1, 2, 4, 8), g(1, 2, 4, 8), g(1, 2, 4, 8),
                                       attn_mask=torch.rand(4, 4) > 0.3).sum().backward()
        F.softmax(g(3, 4), -1).sum().backward()
        F.log_softmax(g(3, 4), -1).sum().backward()
        F.dropout(g(3, 4), 0.5, True).sum().backward()
        for fn in [F.relu, F.gelu, F.silu, torch.tanh, torch.sigmoid, F.softplus, F.elu,
                   F.leaky_relu, F.hardtanh, F.hardswish, F.hardsigmoid, F.mish, F.logsigmoid]:
            fn(g(3, 4)).sum().backward()
        F.prelu(g(2, 3, 4), g(3)).sum().backward()
        aten = torch.ops.aten
        x = torch.randn(3, 4)
        out, mask = aten.native_dropout(x, 0.5, True)
        aten.native_dropout_backward(x, mask, 2.0)
        aten._safe_softmax(x, -1)

    def indexing():
        idx = torch.tensor([[0, 1], [2, 3], [4, 0]])
        torch.gather(g(3, 5), 1, idx).sum().backward()
        z = torch.zeros(3, 5)
        z.scatter(1, idx, torch.ones(3, 2))
        z.scatter(1, idx, 2.0)
        z.scatter_add(1, idx, torch.ones(3, 2))
        z.scatter_reduce(1, idx, torch.ones(3, 2), "amax")
        x = g(4, 5)
        x[torch.tensor([0, 3])].sum().backward()
        torch.index_select(g(4, 5), 0, torch.tensor([1, 3])).sum().backward()
        torch.zeros(4, 5).index_put((torch.tensor([0, 2]),), torch.ones(2, 5), accumulate=True)
        aten = torch.ops.aten
        aten._unsafe_index.Tensor(torch.randn(4, 5), [torch.tensor([0, 3]), None])
        aten._unsafe_index_put(torch.zeros(4, 5), [torch.tensor([0, 2])], torch.ones(2, 5), True)
        torch.zeros(3, 4).masked_fill(torch.rand(3, 4) > 0.5, 1.0)
        torch.zeros(3, 4).masked_scatter(torch.rand(3, 4) > 0.5, torch.ones(12))
        aten.select_backward(torch.rand(4), [3, 4], 0, 1)
        aten.slice_backward(torch.rand(2, 4), [3, 4], 0, 1, 3, 1)
        aten.select_scatter(torch.zeros(3, 4), torch.ones(4), 0, 1)
        aten.slice_scatter(torch.zeros(3, 4), torch.ones(2, 4), 0, 1, 3)

    def shapes():
        F.pad(g(1, 2, 5), (2, 2), mode="reflect").sum().backward()
        F.pad(g(1, 2, 5, 5), (2, 2, 1, 1), mode="reflect").sum().backward()
        F.pad(g(1, 1, 3, 3, 3), (1,) * 6, mode="reflect").sum().backward()
        F.pad(g(1, 2, 5, 5), (2, 2, 1, 1), mode="replicate").sum().backward()
        F.pad(g(1, 1, 3, 3, 3), (1,) * 6, mode="replicate").sum().backward()
        F.pad(g(2, 3), (1, 2), value=3.0).sum().backward()
        F.interpolate(g(1, 2, 4, 4), scale_factor=2, mode="bilinear").sum().backward()
        F.interpolate(g(1, 2, 4, 4), size=(6, 6), mode="nearest").sum().backward()
        F.grid_sample(g(1, 2, 4, 4), torch.rand(1, 3, 3, 2) * 2 - 1,
                      align_corners=False).sum().backward()
        F.fold(g(1, 12, 9), (4, 4), 2).sum().backward()
        torch.cdist(g(3, 4), g(5, 4)).sum().backward()
        F.pdist(g(4, 3)).sum().backward()
        torch.fft.irfft(torch.fft.rfft(g(8)), 8).sum().backward()
        torch.cumsum(g(3, 4), 1).sum().backward()
        x = torch.randn(3, 4)
        torch.sort(x, 1), torch.topk(x, 2), torch.max(x, 1), torch.min(x, 1)
        torch.argmax(x), torch.argmin(x, 1), torch.nonzero(x > 0.5), torch.flip(x, [0])
        g(3, 4).repeat(2, 1).sum().backward()
        g(3, 1).expand(3, 4).sum().backward()
        torch.cat([g(2, 3), g(2, 3)]).sum().backward()
        torch.stack([g(2, 3), g(2, 3)]).sum().backward()
        torch.split(torch.randn(6, 3), 2), torch.unbind(torch.randn(2, 3))
        x = g(3, 4)
        (x[1].sum() + x[:, 1:3].sum() + x.t().sum() + x.transpose(0, 1).sum()
         + x.unsqueeze(0).sum() + x.squeeze().sum() + x.view(12).sum()).backward()
        aten = torch.ops.aten
        y = torch.randn(3, 1, 5)
        aten.alias(y), aten.diagonal(y), aten.permute(y, [2, 0, 1]), aten.squeeze.dims(y, [1])
        aten.split_with_sizes(y, [1, 2]), aten._unsafe_view(y, [15]), aten.copy(y, y + 1)
        aten.upsample_bilinear2d.vec(torch.randn(1, 2, 4, 4), [6, 6], False, None)
        aten.upsample_nearest2d.vec(torch.randn(1, 2, 4, 4), None, [2.0, 2.0])
        aten.var.dim(torch.randn(3, 4), [1])

    def factories_math():
        torch.arange(5), torch.arange(1, 10, 2), torch.full((2, 3), 1.5), torch.zeros(2, 3)
        torch.empty(2, 3), torch.empty_strided((2, 3), (3, 1)), torch.rand(2, 3)
        torch.randn(2, 3), torch.randperm(5), torch.scalar_tensor(3.0)
        o = torch.ones(2)
        o.new_empty((2,)), o.new_zeros((3,)), torch.empty_like(o), torch.full_like(o, 2)
        torch.bernoulli(torch.rand(3), 0.5)
        x = g(3, 4)
        (x.abs() + x.exp() + x.expm1() + x.sin() + x.cos() + x.tan() + x.sinh() + x.cosh()
         + x.atan() + x.asinh() + x.erf() + x.neg() + x.reciprocal() + x.sign() + x.sgn()
         + x.round() + x.floor() + x.ceil() + x.trunc()).sum().backward()
        x = torch.rand(3, 4) * 0.5 + 0.1
        x.log(), x.log10(), x.log1p(), x.log2(), x.sqrt(), x.rsqrt(), x.acos(), x.asin()
        x.atanh(), (x + 1).acosh()
        a, b = torch.rand(3, 4), torch.rand(3, 4) + 0.1
        for op in [torch.add, torch.sub, torch.mul, torch.div, torch.atan2, torch.fmod,
                   torch.remainder, torch.maximum, torch.minimum, torch.pow, torch.eq, torch.ne,
                   torch.lt, torch.le, torch.gt, torch.ge, torch.xlogy]:
            op(a, b)
            try:
                op(a, 2.0)
            except (RuntimeError, TypeError):
                pass
        aten = torch.ops.aten
        aten.div.Scalar(a, 2.0), aten.div.Scalar_mode(a, 2.0, rounding_mode="floor")
        aten.sub.Scalar(a, 1.0)
        torch.div(a, b, rounding_mode="floor"), torch.pow(2.0, a)
        i, j = torch.tensor([1, 2, 3]), torch.tensor([3, 1, 2])
        i & j, i | j, i ^ j, ~i, i & 1, i | 1, i ^ 1
        m, n = torch.rand(3) > 0.5, torch.rand(3) > 0.5
        torch.logical_and(m, n), torch.logical_or(m, n), torch.logical_xor(m, n)
        torch.logical_not(m), torch.isinf(a), torch.isnan(a)
        torch.where(m, torch.rand(3), torch.rand(3)), torch.clamp(a, 0.2, 0.8)
        torch.clamp(a, torch.zeros(3, 4), torch.ones(3, 4))
        a.amax(1), a.amin(1), a.any(), (a > 0.5).any(1), (a > 0.5).any((0, 1)), a.mean()
        a.mean(1), a.prod(), a.prod(1), a.sum(), a.sum(1), a.var(1)
        torch.mm(a, b.t()), torch.bmm(torch.rand(2, 3, 4), torch.rand(2, 4, 5))
        torch.addmm(torch.rand(3), a, b.t()), a.clone(), a.to(torch.float64), torch.fill(a, 1.0)

    return [conv_pool, norms, embeddings_losses, attention_activations, indexing, shapes,
            factories_math]


def record_seeds(per_op=2):
    """``{op type: [(args, kwargs), ...]}``: allowlisted ATen calls of the workloads."""
    import torch
    import torch.nn.functional as F
    from torch.utils._python_dispatch import TorchDispatchMode
    from ssaexec.ops.policy import ALLOWED, is_allowed

    seeds = collections.defaultdict(list)
    signatures = collections.defaultdict(set)

    def keep(v):
        if isinstance(v, torch.Tensor):
            return v.detach().clone()
        if isinstance(v, (list, tuple)):
            return type(v)(keep(x) for x in v)
        return v

    def signature(v):
        if isinstance(v, torch.Tensor):
            return (tuple(v.shape), v.dtype)
        if isinstance(v, (list, tuple)):
            return tuple(signature(x) for x in v)
        return type(v).__name__

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = "aten." + func.__name__ if "." in func.__name__ else None
            if name in ALLOWED and len(seeds[name]) < per_op:
                sig = signature((args, sorted(kwargs.items())))
                if sig not in signatures[name]:
                    signatures[name].add(sig)
                    seeds[name].append((keep(args), keep(kwargs)))
            return func(*args, **kwargs)

    torch.manual_seed(0)
    with Record():
        for work in _workloads(torch, F):
            work()
    # CompositeImplicit overloads decompose before a dispatch mode sees them: seeded by hand
    x3, x4 = torch.randn(1, 2, 8), torch.randn(1, 2, 4, 4)
    direct = {
        "aten.adaptive_avg_pool1d.default": ((x3, [3]), {}),
        "aten.avg_pool1d.default": ((x3, [2], [2], [0], False, True), {}),
        "aten.upsample_bilinear2d.vec": ((x4, [6, 6], False, None), {}),
        "aten.upsample_nearest2d.vec": ((x4, None, [2.0, 2.0]), {}),
        "aten.var.dim": ((torch.randn(3, 4), [1], True, False), {}),
    }
    for name, call in direct.items():
        if not seeds[name]:
            seeds[name].append(call)
    return {t: seeds[t] for t in sorted(seeds) if is_allowed(t)}


# --- mutations --------------------------------------------------------------------------------
# 2**23 passes the allocator but not max_tensor_elements (LIMIT): a missed size guard
# shows as a result over the limit; the larger ones as a failed allocation
_HUGE = [2 ** 23, 2 ** 31, 2 ** 40, 2 ** 62, -(2 ** 62)]
_INTS = [0, -1, -2, 1] + _HUGE
_FLOATS = [float("nan"), float("inf"), -float("inf"), 0.0, -1.0, 1e300, 1e10, 8388608.5]
_NOT_PROGRAM = frozenset({"device", "pin_memory", "generator", "layout"})  # policy refuses


def mutations(torch, overload, args, kwargs):
    """``[(label, fn)]``: each fn maps (args, kwargs) to a mutated copy (one change)."""
    schema = overload._schema
    out = []
    bound = {}
    for i, a in enumerate(schema.arguments):
        if i < len(args):
            bound[a.name] = args[i]
        elif a.name in kwargs:
            bound[a.name] = kwargs[a.name]
    # the largest dimension among the tensor arguments: the edge of most index ranges
    dims = [d for v in bound.values() for t in _tensors(torch, v) for d in t.shape]
    edge = max(dims, default=1)

    def setter(name, make):
        def fn(a, k):
            a, k = list(a), dict(k)
            pos = [x.name for x in schema.arguments].index(name)
            if pos < len(a):
                a[pos] = make(a[pos])
            else:
                k[name] = make(k.get(name))
            return a, k
        return fn

    for a in schema.arguments:
        t = str(a.real_type)
        v = bound.get(a.name)
        if a.name in _NOT_PROGRAM:
            continue
        if isinstance(v, torch.Tensor):
            for label, make in _tensor_mutations(torch, v, edge):
                out.append((f"{a.name}:{label}", setter(a.name, make)))
        elif isinstance(v, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in v):
            for j, x in enumerate(v):
                if isinstance(x, torch.Tensor):
                    for label, make in _tensor_mutations(torch, x, edge):
                        out.append((f"{a.name}[{j}]:{label}",
                                    setter(a.name, _item_setter(j, make))))
        elif v is None and "Tensor" in t and "[]" not in t:
            # an absent optional tensor (weight, mask, bias, statistics) given a wrong size
            shape = next((list(x.shape) for x in _tensors(torch, list(bound.values()))), [3])
            for label, shp in (("given[1]", [1]), ("given[2,2]", [2, 2]),
                               ("given_like_first", shape)):
                out.append((f"{a.name}:{label}", setter(a.name, _const(torch.randn(shp)))))
        elif isinstance(v, bool) or t == "bool":
            out.append((f"{a.name}:flip", setter(a.name, lambda x: not x)))
        elif t in ("int", "SymInt", "Optional[int]", "Optional[SymInt]") and \
                (v is None or isinstance(v, int)):
            vals = _INTS + ([v - 1, v + 1, v + edge] if isinstance(v, int) else [edge, edge + 1])
            for x in dict.fromkeys(vals):
                out.append((f"{a.name}={x}", setter(a.name, _const(x))))
        elif t in ("float", "number", "Optional[float]", "Optional[number]"):
            for x in _FLOATS + (_HUGE if isinstance(v, int) else []):
                out.append((f"{a.name}={x}", setter(a.name, _const(x))))
        elif isinstance(v, (list, tuple)) and all(isinstance(x, (int, float)) for x in v):
            is_bool = t.startswith("List[bool]") or "bool[" in t
            for j, x in enumerate(v):
                vals = [not x] if is_bool else [0, -1, x + 1] + _HUGE
                for y in vals:
                    out.append((f"{a.name}[{j}]={y}", setter(a.name, _item_setter(j, _const(y)))))
            if not is_bool:
                out.append((f"{a.name}:shorter", setter(a.name, lambda x: list(x)[:-1])))
                out.append((f"{a.name}:longer", setter(a.name, lambda x: list(x) + [2])))
                out.append((f"{a.name}:empty", setter(a.name, _const([]))))
        elif t in ("ScalarType", "Optional[ScalarType]"):
            for dt in (torch.int64, torch.bool, torch.float16, torch.uint8):
                out.append((f"{a.name}={dt}", setter(a.name, _const(dt))))
        elif t in ("str", "Optional[str]") and v is not None:
            out.append((f"{a.name}=bogus", setter(a.name, _const("bogus"))))
    return out


def _tensors(torch, v):
    if isinstance(v, torch.Tensor):
        return [v]
    if isinstance(v, (list, tuple)):
        return [t for x in v for t in _tensors(torch, x)]
    return []


def _const(x):
    return lambda old: x


def _item_setter(j, make):
    def fn(old):
        new = list(old)
        new[j] = make(new[j])
        return new
    return fn


def _tensor_mutations(torch, v, edge):
    out = []
    shape = list(v.shape)
    if v.dtype in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8) and v.numel():
        info = torch.iinfo(v.dtype)
        vals = [edge, edge + 1, 10 ** 8, -1, -edge - 1, -(10 ** 8), info.max, info.min]
        for x in dict.fromkeys(vals):
            if info.min <= x <= info.max:
                out.append((f"all={x}", lambda t, x=x: torch.full_like(t, x)))
                out.append((f"last={x}", lambda t, x=x: _set_last(t, x)))
    elif v.dtype.is_floating_point and v.numel():
        for x in (float("nan"), float("inf"), 1e30, -1e30):
            out.append((f"all={x}", lambda t, x=x: torch.full_like(t, x)))
    elif v.dtype == torch.bool and v.numel():
        out.append(("all=True", lambda t: torch.ones_like(t)))
        out.append(("all=False", lambda t: torch.zeros_like(t)))
    # another dtype: kernels with mixed-dtype paths read a buffer at the wrong width
    others = ((torch.float64, torch.float16, torch.bfloat16) if v.dtype.is_floating_point
              else (torch.int32, torch.float32) if v.dtype == torch.int64 else ())
    for dt in others:
        if dt != v.dtype:
            out.append((f"dtype={str(dt)[6:]}", lambda t, dt=dt: t.to(dt)))

    def reshaped(new_shape):
        return lambda t: _resized(torch, t, new_shape)

    candidates = []
    if shape:
        candidates.append(("short_last", shape[:-1] + [max(shape[-1] - 1, 0)]))
        candidates.append(("long_last", shape[:-1] + [shape[-1] + 1]))
        candidates.append(("first=1", [1] + shape[1:]))
        candidates.append(("first+2", [shape[0] + 2] + shape[1:]))
        candidates.append(("drop_dim", shape[1:]))
        candidates.append(("empty", [0] + shape[1:]))
        candidates.append(("flat", [max(v.numel(), 1)]))
    candidates.append(("scalar", []))
    candidates.append(("extra_dim", [1] + shape))
    candidates.append(("one", [1]))
    candidates.append(("big", [2] + (shape or [1])))
    seen = {tuple(shape)}
    for label, s in candidates:
        if tuple(s) not in seen:
            seen.add(tuple(s))
            out.append((f"shape={s}", reshaped(s)))
    return out


def _set_last(t, x):
    t = t.clone()
    t.view(-1)[-1] = x
    return t


def _resized(torch, t, shape):
    # values cycled from the original (index tensors keep plausible values)
    n = math.prod(shape)
    flat = t.reshape(-1)
    if flat.numel() == 0:
        flat = torch.zeros(1, dtype=t.dtype)
    reps = -(-n // flat.numel()) if n else 0
    return flat.repeat(reps)[:n].reshape(shape).clone()


# --- hand-written ops ---------------------------------------------------------------------------
# Hand-written ops (``ssaexec.ops.registry``: batch_norm, conv2d, lookup_table and their
# grads ...) call ATen kernels on the program's values too, with secondary inputs (running
# and saved statistics, gradients, ids) whose shapes a program chooses. Their seeds are the
# cases of tests/op_cases.py (forward), and for each, its grad op fed the forward's own
# results and a gradient of each differentiable output. Left out: control and
# communication ops (they run sub-blocks or talk to peers), ops without tensor inputs
# (initialisers: their sizes are validation's), and ops that update their inputs in place
# (optimizers: the oracle's input-write check does not apply).
HAND_PER_OP = 3


def _hand_ops_skipped(od):
    return od.is_control or od.inplace or not od.inputs or od.type in ("send", "recv")


def record_hand_seeds(per_op=HAND_PER_OP):
    """``{op type: [(ins, attrs, wanted), ...]}``: hand-written ops and their grads."""
    import torch
    sys.path.insert(0, str(ROOT / "tests"))
    import op_cases
    from ssaexec.ops.registry import get_op_def

    seeds = collections.defaultdict(list)
    extra = [  # ops op_cases leaves out, or a mode it does not reach
        ("dropout", {"X": torch.randn(3, 4, dtype=torch.float64)},
         {"dropout_prob": 0.5, "seed": 7}),
        ("lookup_table", {"W": torch.randn(10, 4, dtype=torch.float64),
                          "Ids": torch.tensor([[1, 9], [0, 3]])}, {"is_sparse": True}),
        ("accuracy", {"X": torch.randn(4, 5), "Label": torch.tensor([[0], [4], [2], [1]])},
         {"k": 2}),
        ("argmax", {"X": torch.randn(3, 4)}, {"axis": 1}),
    ]
    forward = extra + [(c.type, c.inputs, c.attrs) for c in op_cases.CASES]
    for k, (op_type, ins, attrs) in enumerate(forward):
        od = get_op_def(op_type)
        if _hand_ops_skipped(od) or (k >= len(extra) and len(seeds[op_type]) >= per_op):
            continue
        ins = _swap_tensors(torch, dict(ins), lambda t: t.clone())
        seeds[op_type].append((ins, dict(attrs), None))
        gdef = get_op_def(op_type + "_grad", missing_ok=True)
        if gdef is None or (k >= len(extra) and len(seeds[gdef.type]) >= per_op):
            continue
        torch.manual_seed(0)
        outs = od.kernel(_swap_tensors(torch, ins, lambda t: t.clone()), od.full_attrs(attrs))
        gins = {}
        for slot in gdef.inputs:
            name = slot.name
            if name.endswith("@GRAD"):
                out = outs.get(name[:-5])
                if out is None:
                    continue
                gins[name] = _swap_tensors(
                    torch, out, lambda t: torch.randn(t.shape, dtype=t.dtype)
                    if t.dtype.is_floating_point else t.clone())
            elif name in ins:
                gins[name] = ins[name]
            elif name in outs:
                gins[name] = _swap_tensors(torch, outs[name], lambda t: t.detach().clone())
        wanted = {}
        for slot in gdef.outputs:
            fwd = ins.get(slot.name[:-5])
            if isinstance(fwd, torch.Tensor) and fwd.is_floating_point():
                wanted[slot.name] = [True]
            elif isinstance(fwd, list):
                wanted[slot.name] = [x.is_floating_point() for x in fwd]
        seeds[gdef.type].append((gins, dict(attrs), wanted))
    return {t: seeds[t] for t in sorted(seeds)}


def hand_mutations(torch, od, ins, attrs):
    """``[(label, fn)]``: each fn maps (ins, attrs) to a mutated copy (one change)."""
    out = []
    tensors = [t for v in ins.values() for t in _tensors(torch, v)]
    edge = max((d for t in tensors for d in t.shape), default=1)
    first = next((list(t.shape) for t in tensors), [3])

    def slot_setter(name, make, j=None):
        def fn(i, a):
            i = dict(i)
            i[name] = make(i.get(name)) if j is None else _item_setter(j, make)(i[name])
            return i, a
        return fn

    def attr_setter(name, make):
        def fn(i, a):
            a = dict(a)
            a[name] = make(a.get(name))
            return i, a
        return fn

    for slot in od.inputs:
        v = ins.get(slot.name)
        if isinstance(v, torch.Tensor):
            for label, make in _tensor_mutations(torch, v, edge):
                out.append((f"{slot.name}:{label}", slot_setter(slot.name, make)))
        elif isinstance(v, list):
            for j, x in enumerate(v):
                for label, make in _tensor_mutations(torch, x, edge):
                    out.append((f"{slot.name}[{j}]:{label}", slot_setter(slot.name, make, j)))
        elif slot.optional and not slot.duplicable:
            # an absent optional input (a layer norm's scale, a saved statistic) given
            for label, shp in (("given[1]", [1]), ("given[2,2]", [2, 2]),
                               ("given_like_first", first)):
                out.append((f"{slot.name}:{label}",
                            slot_setter(slot.name, _const(torch.randn(shp, dtype=torch.float64)))))
    full = od.full_attrs(attrs)
    for name, (atype, _) in od.attrs.items():
        v = full.get(name)
        if atype == "bool":
            out.append((f"{name}:flip", attr_setter(name, lambda x: not x)))
        elif atype == "int" and isinstance(v, int):
            for x in dict.fromkeys(_INTS + [v - 1, v + 1, v + edge]):
                out.append((f"{name}={x}", attr_setter(name, _const(x))))
        elif atype == "float" and isinstance(v, (int, float)):
            for x in _FLOATS:
                out.append((f"{name}={x}", attr_setter(name, _const(x))))
        elif atype == "ints" and isinstance(v, list):
            for j, x in enumerate(v):
                for y in [0, -1, x + 1] + _HUGE:
                    out.append((f"{name}[{j}]={y}", attr_setter(name, _item_setter(j, _const(y)))))
            out.append((f"{name}:shorter", attr_setter(name, lambda x: list(x)[:-1])))
            out.append((f"{name}:longer", attr_setter(name, lambda x: list(x) + [2])))
            out.append((f"{name}:empty", attr_setter(name, _const([]))))
        elif atype == "str" and isinstance(v, str):
            out.append((f"{name}=bogus", attr_setter(name, _const("bogus"))))
    return out


# --- the cases --------------------------------------------------------------------------------
class Case:
    """One call: an op type, a seed and at most one mutation, and a layout for poisoned views."""

    __slots__ = ("op_type", "seed", "mutation", "layout")

    def __init__(self, op_type, seed, mutation, layout):
        self.op_type = op_type
        self.seed = seed
        self.mutation = mutation
        self.layout = layout

    def __repr__(self):
        return f"{self.op_type} seed {self.seed} {self.mutation or 'as recorded'} ({self.layout})"


LAYOUTS = ("padded", "strided", "transposed")


def build_cases(seeds, torch, sample=None, rounds=1, pairs=0, rng_seed=0, match=()):
    """The cases, in a fixed order (a worker restarted after a crash rebuilds the same list).

    Every seed unmutated, then each of its mutations (``sample``: that many per op,
    drawn at random), then ``pairs`` random pairs of mutations per seed. ``rounds``
    repeats it all with the layouts shifted, so a long run tries each case under
    every layout. ``match``: keep only cases whose text contains one of these.
    """
    rng = random.Random(rng_seed)
    cases = []
    for r in range(rounds):
        for op_type, calls in seeds.items():
            head, rest = [], []
            for s, call in enumerate(calls):
                head.append(Case(op_type, s, None, LAYOUTS[(s + r) % 3]))
                labels = [label for label, _ in _mutations_of(torch, op_type, call)]
                rest += [Case(op_type, s, label, LAYOUTS[(m + s + r) % 3])
                         for m, label in enumerate(labels)]
                for m in range(pairs if len(labels) > 1 else 0):
                    two = " + ".join(rng.sample(labels, 2))
                    rest.append(Case(op_type, s, two, LAYOUTS[(m + r) % 3]))
            if sample is not None:
                rest = rng.sample(rest, min(sample, len(rest)))
            cases += [c for c in head + rest if not match or any(m in repr(c) for m in match)]
    return cases


def _mutations_of(torch, op_type, call):
    """The mutations of one seed: an ATen call ``(args, kwargs)`` or a hand-written op's
    ``(ins, attrs, wanted)``."""
    if op_type.startswith("aten."):
        from ssaexec.ops.schema import resolve_overload
        return mutations(torch, resolve_overload(op_type), *call)
    from ssaexec.ops.registry import get_op_def
    return hand_mutations(torch, get_op_def(op_type), call[0], call[1])


# --- running one case -------------------------------------------------------------------------
def poison_value(torch, dtype, which):
    """Poison ``which`` (0 or 1) for ``dtype``: NaN or 7e30 for floats, the extremes for ints."""
    if dtype.is_floating_point or dtype.is_complex:
        return float("nan") if which == 0 else 7e30 if dtype.itemsize > 2 else 7e3
    if dtype == torch.bool:
        return which == 0
    info = torch.iinfo(dtype)
    return info.max if which == 0 else info.min


def poisoned_view(torch, t, layout, poison):
    """``(view, buffer, mask)``: ``t``'s values in a view of a ``poison``-filled ``buffer``.

    ``mask`` marks the buffer elements that belong to the view; everything else
    must still hold the poison after the call.
    """
    n = t.numel()
    shape = list(t.shape)
    step = 2 if layout == "strided" else 1
    buf = torch.full([PAD * 2 + max(n, 1) * step], poison, dtype=t.dtype)
    if layout == "transposed" and t.dim() >= 2:
        perm = list(range(t.dim()))
        perm[-1], perm[-2] = perm[-2], perm[-1]
        inner = buf[PAD:PAD + n].view([shape[p] for p in perm])
        inner.copy_(t.permute(perm))
        view = inner.permute(perm)
    else:
        strides = []
        acc = step
        for d in reversed(shape):
            strides.append(acc)
            acc *= max(d, 1)
        view = buf.as_strided(shape, list(reversed(strides)), PAD)
        view.copy_(t)
    mask = torch.zeros(buf.shape, dtype=torch.bool)
    if n:
        mask[PAD:PAD + n * step:step] = True
    return view, buf, mask


def _holds_poison(torch, buf, mask, poison):
    rest = buf[~mask]
    if isinstance(poison, float) and math.isnan(poison):
        return bool(torch.isnan(rest).all())
    return bool((rest == poison).all())


def _swap_tensors(torch, v, fn):
    if isinstance(v, torch.Tensor):
        return fn(v)
    if isinstance(v, (list, tuple)):
        return type(v)(_swap_tensors(torch, x, fn) for x in v)
    if isinstance(v, dict):
        return {k: _swap_tensors(torch, x, fn) for k, x in v.items()}
    return v


def encode(torch, overload, args, kwargs):
    """``(xs, attrs)``: a call as a program op (``ssaexec.ops.aten``'s encoding), or None."""
    from ssaexec.core.dtypes import DTYPES
    from ssaexec.ops.schema import LAYOUTS as LAYOUT_NAMES, MEMORY_FORMATS
    names = {v: k for k, v in DTYPES.items()}
    formats = {v: k for k, v in MEMORY_FORMATS.items()}
    layouts = {v: k for k, v in LAYOUT_NAMES.items()}
    xs, attrs = [], {}

    def value(v):
        if isinstance(v, torch.Tensor):
            xs.append(v)
            return f"X[{len(xs) - 1}]"
        if isinstance(v, (list, tuple)):
            return [value(x) for x in v]
        if isinstance(v, torch.dtype):
            if v not in names:
                raise LookupError(v)
            return names[v]
        if isinstance(v, torch.memory_format):
            return formats[v]
        if isinstance(v, torch.layout):
            return layouts[v]
        if isinstance(v, torch.device):
            return None
        return v

    for i, a in enumerate(overload._schema.arguments):
        if i < len(args):
            v = args[i]
        elif a.name in kwargs:
            v = kwargs[a.name]
        else:
            continue
        if a.name in ("device", "generator") or isinstance(v, torch.device):
            continue  # programs cannot pass them (ssaexec.ops.policy)
        try:
            attrs[a.name] = value(v)
        except LookupError:
            return None
    return xs, attrs


class Runner:
    """Runs cases in this process (the worker): the seeds, the kernels, the oracle.

    ``families``: ``aten`` (the allowlisted overloads), ``hand`` (hand-written ops) or
    both. ``guarded=False`` drives the bare kernels: ATen ops through their raw
    ``OpOverload``, hand-written ops with every guard of the layer switched off.
    """

    def __init__(self, guarded=True, families=("aten", "hand")):
        import torch
        from ssaexec.core.limits import set_limits
        from ssaexec.ops.aten import aten_op_def
        self.torch = torch
        torch.set_num_threads(1)  # reductions in one order: clean and poisoned runs agree
        set_limits(max_tensor_elements=LIMIT)
        self.seeds = record_seeds() if "aten" in families else {}
        if "hand" in families:
            self.seeds.update(record_hand_seeds())
        self.aten_op_def = aten_op_def
        self.guarded = guarded
        if not guarded:
            from ssaexec.ops.guards import HandWrittenOverload
            HandWrittenOverload.__call__ = lambda self, *a, **k: self.overload(*a, **k)

    def kernel(self, op_type):
        op_def = self.aten_op_def(op_type)
        if self.guarded:
            return op_def.kernel
        from ssaexec.ops.aten import _make_kernel
        from ssaexec.ops.schema import arg_kinds
        raw = op_def.overload
        raw = getattr(raw, "overload", raw)  # the torch OpOverload under a guard
        return _make_kernel(op_type, raw, arg_kinds(raw))

    def random(self, op_type):
        from ssaexec.ops.schema import resolve_overload
        if not op_type.startswith("aten."):
            from ssaexec.ops.registry import get_op_def
            return get_op_def(op_type).is_random
        return self.torch.Tag.nondeterministic_seeded in resolve_overload(op_type).tags

    def call(self, case):
        """The seed of ``case`` with its mutation applied: ``args, kwargs`` of an ATen call,
        ``ins, attrs, wanted`` of a hand-written op."""
        torch = self.torch
        call = self.seeds[case.op_type][case.seed]
        fresh = _swap_tensors(torch, call, lambda t: t.clone())
        head, tail = fresh[:2], fresh[2:]
        if case.mutation is not None:
            found = dict(_mutations_of(torch, case.op_type, call))
            for label in case.mutation.split(" + "):
                head = found[label](*head)
        return (*head, *tail)

    def run(self, case):
        """``(status, detail)``; status ``ok``, ``refused``, ``error``, ``skip`` or ``FAIL:<kind>``."""
        try:
            call = self.call(case)
        except Exception as e:  # noqa: BLE001 - two mutations that do not compose
            return "skip", f"mutation does not apply: {type(e).__name__}"
        if case.op_type.startswith("aten."):
            from ssaexec.ops.schema import resolve_overload
            encoded = encode(self.torch, resolve_overload(case.op_type), *call)
            if encoded is None:
                return "skip", "not encodable"
            xs, attrs = encoded
            kernel = self.kernel(case.op_type)

            def invoke(inputs):
                return kernel({"X": inputs}, dict(attrs))["Out"]
            return self.oracle(case, xs, invoke, attrs, inplace=False)
        return self._run_hand(case, *call)

    def _run_hand(self, case, ins, attrs, wanted):
        from ssaexec.ops.registry import get_op_def
        torch = self.torch
        od = get_op_def(case.op_type)
        try:
            full = od.full_attrs(attrs)
        except Exception as e:  # noqa: BLE001 - a required attr mutated away
            return "skip", f"attrs: {type(e).__name__}"
        # every tensor of ins, in slot order, and where it goes back
        where, xs = [], []
        for slot, v in ins.items():
            for j, t in enumerate(v if isinstance(v, list) else [v]):
                if isinstance(t, torch.Tensor):
                    where.append((slot, j if isinstance(v, list) else None))
                    xs.append(t)

        def invoke(inputs):
            given = {k: (list(v) if isinstance(v, list) else v) for k, v in ins.items()}
            for (slot, j), t in zip(where, inputs, strict=True):
                if j is None:
                    given[slot] = t
                else:
                    given[slot][j] = t
            outs = od.kernel(given, dict(full), wanted) if od.wants_mask else \
                od.kernel(given, dict(full))
            flat = []
            for s in od.outputs:
                v = outs.get(s.name)
                flat.extend(v if isinstance(v, list) else [v])
            # a sparse gradient compared as the dense table it stands for (made here: an
            # index past the table writes out of bounds now, where the oracle sees it)
            return [t.to_dense() if isinstance(t, torch.Tensor) and t.is_sparse else t
                    for t in flat]
        return self.oracle(case, xs, invoke, full, inplace=od.inplace)

    def oracle(self, case, xs, invoke, attrs, inplace):
        """Run ``invoke(inputs) -> [results]`` on clean tensors and poisoned views of ``xs``."""
        from ssaexec.core.errors import ProgramError
        from ssaexec.ops.guards import GuardError
        torch = self.torch
        originals = [x.clone() for x in xs]

        def attempt(inputs):
            torch.manual_seed(0)
            try:
                return None, invoke(inputs)
            except (ProgramError, GuardError) as e:
                return ("refused", str(e)), None
            except MemoryError as e:
                return ("FAIL:alloc", f"MemoryError {e}"), None
            except Exception as e:  # noqa: BLE001 - torch's own checks: a pass
                text = f"{type(e).__name__}: {e}"
                if "can't allocate memory" in text or "not enough memory" in text:
                    return ("FAIL:alloc", text[:300]), None
                return ("error", text.splitlines()[0][:200] if text else "?"), None

        runs = [attempt([x.clone() for x in xs])]
        for which in (0, 1):
            views = [poisoned_view(torch, x, case.layout, poison_value(torch, x.dtype, which))
                     for x in xs]
            runs.append(attempt([v for v, _, _ in views]))
            for k, ((view, buf, mask), orig) in enumerate(zip(views, originals, strict=True)):
                if not _holds_poison(torch, buf, mask, poison_value(torch, buf.dtype, which)):
                    return "FAIL:oob-write", f"the poison around input {k} was overwritten"
                if not inplace and not _equal(torch, view, orig):
                    return "FAIL:input-write", f"input {k} was changed"
        for err, outs in runs:
            if err is not None and err[0].startswith("FAIL"):
                return err
            for j, o in enumerate(outs or []):
                bad = _bad_result(torch, o)
                if bad:
                    return bad[0], f"result {j}: {bad[1]}"
        errors = [err for err, _ in runs if err is not None]
        if errors:
            return errors[0]
        (_, clean), (_, first), (_, second) = runs
        # the two poisoned runs differ only in what lies outside the inputs: any difference
        # is a read out of bounds. The clean run may take another code path (contiguous
        # inputs), so it is compared where every input is finite.
        try:
            bad = _differs(torch, case, first, second)
        except RuntimeError as e:  # a result torch itself cannot read
            return "FAIL:bad-result", f"comparing results: {e}"
        if bad:
            return "FAIL:oob-read", bad + " between the two poisons"
        # Not compared: random ops (a non-contiguous input draws in another order), and
        # values that overflow (another code path rounds differently)
        tame = not self.random(case.op_type) and all(
            bool((x.abs() < 1e15).all()) for x in originals
            if x.numel() and (x.dtype.is_floating_point or x.dtype.is_complex)) and all(
            math.isfinite(v) and abs(v) < 1e15 for v in _numbers(attrs))
        coarse = any(x.dtype.itemsize <= 2 and x.dtype.is_floating_point for x in originals)
        bad = _differs(torch, case, clean, first, coarse) if tame else None
        if bad:
            return "FAIL:mismatch", bad + " between clean and poisoned inputs"
        return "ok", ""


def _bad_result(torch, o):
    """``(kind, why)`` when result ``o`` is over the limit or not a sound tensor, else None."""
    if not isinstance(o, torch.Tensor):
        return None
    shape, stride = list(o.shape), o.stride()
    if any(d < 0 for d in shape):
        return "FAIL:bad-result", f"negative dimension in {shape}"
    if math.prod(max(d, 1) for d in shape) > LIMIT:
        return "FAIL:over-limit", f"{shape} (max_tensor_elements={LIMIT})"
    if o.numel():
        # the view must lie inside its storage
        last = o.storage_offset() + sum((d - 1) * abs(s) for d, s in zip(shape, stride))
        if (last + 1) * o.element_size() > o.untyped_storage().nbytes():
            return "FAIL:bad-result", f"{shape} stride {stride} runs past its storage"
    if o.untyped_storage().nbytes() > LIMIT * 16:
        return "FAIL:over-limit", f"storage of {o.untyped_storage().nbytes()} bytes"
    return None


def _numbers(v):
    if isinstance(v, float):
        yield v
    elif isinstance(v, (list, tuple)):
        for x in v:
            yield from _numbers(x)
    elif isinstance(v, dict):
        for x in v.values():
            yield from _numbers(x)


def _differs(torch, case, a_outs, b_outs, coarse=False):
    """Why two runs' results differ, or None (undefined values are not compared).

    ``coarse``: an input was half precision, so another code path rounds at that width.
    """
    if len(a_outs) != len(b_outs):
        return "different numbers of results"
    skip = UNDEFINED_OUTPUTS.get(case.op_type, ())
    for j, (a, b) in enumerate(zip(a_outs, b_outs, strict=True)):
        if a is None or b is None:
            if (a is None) != (b is None):
                return f"result {j} undefined in one run only"
            continue
        if a.shape != b.shape or a.dtype != b.dtype:
            return f"result {j}: {list(a.shape)} {a.dtype} vs {list(b.shape)} {b.dtype}"
        if case.op_type in UNDEFINED_VALUES or j in skip:
            continue
        if not _close(torch, a, b, coarse):
            return f"result {j} differs"
    return None


def _equal(torch, a, b):
    if a.dtype.is_floating_point or a.dtype.is_complex:
        return bool(torch.equal(torch.nan_to_num(a), torch.nan_to_num(b))) and bool(
            (torch.isnan(a) == torch.isnan(b)).all())
    return bool(torch.equal(a, b))


def _close(torch, a, b, coarse=False):
    """Equal (integers), or close (floats; ``coarse``: to half precision)."""
    if a.dtype.is_floating_point or a.dtype.is_complex:
        a64, b64 = a.to(torch.complex128 if a.is_complex() else torch.float64), \
            b.to(torch.complex128 if b.is_complex() else torch.float64)
        tol = 2e-2 if coarse or a.dtype.itemsize <= 2 else 1e-4
        return bool(torch.allclose(a64, b64, rtol=tol, atol=tol / 10, equal_nan=True))
    return bool(torch.equal(a, b))


# --- the worker and its driver ----------------------------------------------------------------
def _options(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sample", type=int, default=None,
                   help="mutations per op, drawn at random (default: all of them)")
    p.add_argument("--rounds", type=int, default=1, help="repeat with layouts shifted")
    p.add_argument("--pairs", type=int, default=0, help="random pairs of mutations per seed")
    p.add_argument("--seed", type=int, default=0, help="for the random draws")
    p.add_argument("--match", action="append", default=[],
                   help="only cases whose text contains this (repeatable)")
    p.add_argument("--unguarded", action="store_true",
                   help="drive the bare kernels, without ssaexec.ops.guards")
    p.add_argument("--family", choices=("all", "aten", "hand"), default="all",
                   help="allowlisted ATen overloads, hand-written ops, or both (default)")
    p.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def worker_main(argv):
    o = _options(argv)
    import faulthandler
    faulthandler.enable()
    runner = Runner(guarded=not o.unguarded,
                    families=("aten", "hand") if o.family == "all" else (o.family,))
    cases = build_cases(runner.seeds, runner.torch, o.sample, o.rounds, o.pairs, o.seed,
                        o.match)
    out = sys.stdout
    out.write(f"N {len(cases)} {len({c.op_type for c in cases})}\n")
    out.flush()
    for i in range(o.start, len(cases)):
        case = cases[i]
        out.write(f"B {i} {case!r}\n")
        out.flush()
        status, detail = runner.run(case)
        if case.mutation is None and status == "refused":
            status = "FAIL:false-refusal"  # a guard refused a call torch's own models make
        out.write(f"E {i} {status} {' '.join(str(detail).split())[:300]}\n")
        out.flush()


class Report:
    """What a fuzz run saw: case counts by status and op, and the failures."""

    __slots__ = ("total", "ops", "status", "ops_ok", "failures", "seconds")

    def __init__(self):
        self.total = 0
        self.ops = 0
        self.status = collections.Counter()
        self.ops_ok = set()
        self.failures = []
        self.seconds = 0.0

    def summary(self):
        counts = ", ".join(f"{k} {v}" for k, v in sorted(self.status.items()))
        return (f"{sum(self.status.values())} cases of {self.total}, {self.ops} ops "
                f"({len(self.ops_ok)} with a case that ran clean), {self.seconds:.0f} s: "
                f"{counts}; {len(self.failures)} failures")


def _limit_worker():
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def drive(argv=(), log=None):
    """Run the cases in worker processes, restarting after a crash or hang; a ``Report``.

    ``argv``: the options of ``python tests/kernel_fuzz.py`` (``--sample``, ``--rounds``,
    ``--pairs``, ``--seed``, ``--match``, ``--unguarded``, ``--family``).
    """
    _options(list(argv))  # fail here, not in the worker
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1",
               MALLOC_PERTURB_="204", MALLOC_CHECK_="3")
    if os.path.exists(MALLOC_DEBUG):
        env["LD_PRELOAD"] = MALLOC_DEBUG
    report = Report()
    start = 0
    t0 = time.monotonic()
    while True:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", *argv,
               "--start", str(start)]
        # stderr to a file: torch's warnings would fill a pipe nobody reads and block it
        errfile = tempfile.TemporaryFile("w+")
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=errfile, env=env,
                                text=True, preexec_fn=_limit_worker)
        current = None
        finished = hung = False
        while True:
            ready, _, _ = select.select([proc.stdout], [], [], CASE_SECONDS)
            if not ready:
                proc.kill()
                hung = True
                break
            line = proc.stdout.readline()
            if not line:
                break
            kind, _, rest = line.rstrip("\n").partition(" ")
            if kind == "N":
                report.total, report.ops = map(int, rest.split())
            elif kind == "B":
                num, _, text = rest.partition(" ")
                current = (int(num), text)
            elif kind == "E":
                num, status, *detail = rest.split(" ", 2)
                report.status[status] += 1
                if status == "ok":
                    report.ops_ok.add(current[1].split(" ")[0])
                if status.startswith("FAIL"):
                    report.failures.append((status, current, detail[0] if detail else ""))
                    if log:
                        log(f"{status} {current[1]}: {detail[0] if detail else ''}")
                finished = int(num) == report.total - 1
                current = None
        proc.wait()
        errfile.seek(0)
        err = errfile.read()[-20000:]
        errfile.close()
        if finished or (current is None and report.total and not hung and proc.returncode == 0):
            break
        if current is None:
            raise RuntimeError(f"kernel fuzz worker failed outside a case (rc {proc.returncode}):"
                               f"\n{err[-3000:]}")
        status = "FAIL:hang" if hung else "FAIL:crash"
        note = "no answer in time" if hung else f"rc {proc.returncode}: {_crash_note(err)}"
        report.status[status] += 1
        report.failures.append((status, current, note))
        if log:
            log(f"{status} {current[1]}: {note}")
        start = current[0] + 1
        if start >= report.total:
            break
    report.seconds = time.monotonic() - t0
    return report


def _crash_note(err):
    lines = [ln for ln in err.splitlines() if ln.strip()]
    head = next((ln for ln in lines if "Fatal Python error" in ln or "malloc" in ln.lower()
                 or "free()" in ln), lines[0] if lines else "")
    return head.strip()[:200]


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--worker":
        return worker_main(argv[1:])
    _options(argv)
    report = drive(argv, log=lambda s: print(s, flush=True))
    print(report.summary())
    by_op = collections.Counter(f[1][1].split(" ")[0] for f in report.failures if f[1])
    for op, n in by_op.most_common():
        print(f"  {n:5d}  {op}")
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
