"""CPU-only ATen overloads that programs record, made to run on any device.

``se.from_torch`` traces a model on the CPU, so a program can name an overload
that exists for the CPU only: ``scaled_dot_product_attention`` becomes
``aten._scaled_dot_product_flash_attention_for_cpu`` (and its backward), which has
no CUDA kernel. Such a program must still run on a GPU place.

Policy: ``portable(op_type, overload)`` returns ``overload`` itself unless
``PORTABLE`` lists the type; then a ``PortableOverload`` that calls the CPU kernel
when its first tensor argument is on the CPU, and otherwise an exact composition
of device-generic ATen ops (matmul, logsumexp, ...). The composition returns the
same shapes, dtypes and strides as the CPU kernel (later ``view`` ops in the
program rely on the strides), and refuses what the CPU kernel refuses. Both
execution paths call what ``OpDef.overload`` holds, so both get it.

Invariant: on the CPU nothing changes (the kernel is called with the same
arguments); off the CPU the result equals the CPU kernel's to rounding.
"""

import math

import torch

from ..core.compat import SDPA_CPU, SDPA_CPU_BACKWARD

__all__ = ["PORTABLE", "PortableOverload", "portable"]


class PortableOverload:
    """An ATen ``OpOverload`` that runs ``other`` off the CPU (module docstring).

    Keeps ``_schema`` and ``overload`` as ``GuardedOverload`` does, so code that
    reads the schema of what it calls needs no change.
    """

    __slots__ = ("overload", "op_type", "_schema", "_other")

    def __init__(self, op_type, overload, other):
        self.overload = overload
        self.op_type = op_type
        self._schema = overload._schema
        self._other = other

    def __call__(self, *args, **kwargs):
        first = next(a for a in args if isinstance(a, torch.Tensor))
        if first.device.type == "cpu":
            return self.overload(*args, **kwargs)
        return self._other(*args, **kwargs)


def _scores(query, key, is_causal, attn_mask, scale):
    # scores in float32 at least, as the CPU kernel accumulates (float64 stays float64)
    acc = torch.promote_types(query.dtype, torch.float32)
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    s = torch.matmul(query.to(acc), key.to(acc).transpose(-2, -1)) * scale
    if is_causal:
        lq, lk = s.shape[-2], s.shape[-1]
        keep = torch.ones(lq, lk, dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    if attn_mask is not None:
        s = s.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool \
            else s + attn_mask.to(acc)
    return s, acc


def _check(query, key, value, dropout_p):
    # what the CPU kernel refuses, refused the same way off the CPU
    if dropout_p > 0:
        raise RuntimeError("scaled_dot_product_attention_flash_attention: Currently do not "
                           "support dropout > 0")
    if not (query.shape[-1] == key.shape[-1] == value.shape[-1]):
        raise RuntimeError("scaled_dot_product_attention_flash_attention: Q/K/V should have "
                           "the same head size")


def _blhe(x):
    # the CPU kernel's layout: batch, length, heads, embedding in memory, BHLE in shape
    return x.transpose(1, 2).contiguous().transpose(1, 2)


def _flash_attention(query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask=None,
                     scale=None):
    _check(query, key, value, dropout_p)
    s, acc = _scores(query, key, is_causal, attn_mask, scale)
    lse = torch.logsumexp(s, dim=-1)
    out = torch.matmul(torch.exp(s - lse.unsqueeze(-1)), value.to(acc))
    # the CPU kernel's strides: out laid out as query (often a transposed view),
    # logsumexp stored batch, length, heads
    return torch.empty_like(query).copy_(out), lse.transpose(1, 2).contiguous().transpose(1, 2)


def _flash_attention_backward(grad_out, query, key, value, out, logsumexp, dropout_p,
                              is_causal, *, attn_mask=None, scale=None):
    _check(query, key, value, dropout_p)
    s, acc = _scores(query, key, is_causal, attn_mask, scale)
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    p = torch.exp(s - logsumexp.to(acc).unsqueeze(-1))
    do = grad_out.to(acc)
    grad_v = torch.matmul(p.transpose(-2, -1), do)
    dp = torch.matmul(do, value.to(acc).transpose(-2, -1))
    ds = p * (dp - (do * out.to(acc)).sum(dim=-1, keepdim=True))
    grad_q = torch.matmul(ds, key.to(acc)) * scale
    grad_k = torch.matmul(ds.transpose(-2, -1), query.to(acc)) * scale
    return tuple(_blhe(g.to(x.dtype)) for g, x in
                 ((grad_q, query), (grad_k, key), (grad_v, value)))


PORTABLE = {
    SDPA_CPU: _flash_attention,
    SDPA_CPU_BACKWARD: _flash_attention_backward,
}


def portable(op_type, overload):
    """``overload``, or a ``PortableOverload`` when ``PORTABLE`` lists ``op_type``."""
    other = PORTABLE.get(op_type)
    return overload if other is None else PortableOverload(op_type, overload, other)
