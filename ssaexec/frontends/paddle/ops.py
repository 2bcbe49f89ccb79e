"""Paddle op types, slots and attribute conventions mapped onto ssaexec's ops.

``MAPPINGS`` maps a Paddle op type to a ``Mapping``: the ssaexec op(s) it becomes
(for the table in docs/paddle.md, ``mapping_table()``) and a function
``fn(ctx, op)`` that emits them through ``ctx`` (``convert.Converter``). Most
entries are one op with renamed slots and converted attributes (``Simple``); a few
take several ops to keep Paddle's numbers:

* ``batch_norm`` in training updates the running variance with the *biased* batch
  variance (Paddle's CPU kernel); ssaexec's kernel, like torch, uses the unbiased
  one. The mapping lets our op update a scratch var and writes Paddle's update
  from the batch itself (3 extra elementwise ops and a reduction);
* ``adam`` keeps Paddle's beta-power accumulators, which hold ``beta**t`` *before*
  step ``t`` (ours hold it after): two ``scale`` ops shift it each way, so the
  accumulators in the scope (and in saved parameter files) are Paddle's;
* ``dropout`` with ``downgrade_in_infer`` (Paddle's default) masks without
  rescaling in training and scales by ``1 - p`` at inference.

Gradient ops (``*_grad``, written by Paddle's ``append_backward``) map through
their forward op (``GradOf``): ``ctx.forward(op)`` finds the forward op whose vars
the grad op names, and the grad op becomes ssaexec's grad op of the op the forward
mapped to, reading the forward values by our slot names. So a grad op needs no
table of its own, and its numbers are those of ssaexec's grad kernels.

Attributes: each mapping reads the attributes it needs, converting Paddle's
encodings (``dtype`` codes, 4-element ``paddings``, ``padding_algorithm``) and
refusing values it cannot honour (``data_format='NHWC'``, ``use_softmax=False``,
a ``ShapeTensor`` input ...) with ``Unsupported``. Other attributes (``op_role``,
``use_mkldnn``, ``op_callstack``, fusion hints ...) do not change the result and
are ignored.

Layout: the machinery (``Mapping``, ``MAPPINGS``, the attribute readers,
``Simple``, ``GradOf``, ``mapping_table``) is ``paddle/mapping.py``; the table is
split by op family, each module registering its entries, with each multi-op mapping
beside its entry, when imported: ``ops_math`` (feed/fetch, math, losses),
``ops_tensor`` (creation, shapes), ``ops_nn`` (neural-network layers) and
``ops_optim`` (optimizers). This module imports them, in that order (the order of
``MAPPINGS``); they import ``mapping``, never this module (no cycle).
"""

from .mapping import MAPPINGS, Mapping, Unsupported, grad_forward_type, mapping_table
from . import ops_math, ops_tensor, ops_nn, ops_optim  # noqa: F401  (register, in table order)

__all__ = ["MAPPINGS", "Mapping", "Unsupported", "mapping_table", "grad_forward_type"]
