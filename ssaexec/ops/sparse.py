"""Sparse gradients: an embedding's gradient as the rows a batch touched.

``lookup_table`` with ``is_sparse`` (``se.layers.embedding(..., is_sparse=True)``)
makes ``W@GRAD`` a coalesced ``torch.sparse_coo`` tensor: ``indices()[0]`` the
distinct ids of the batch, ``values()`` their summed gradient rows. Its memory is
(rows touched) x (dim + 1) numbers instead of vocabulary x dim. Without
``is_sparse`` the gradient is the dense table ``torch.func.vjp`` would give (the
same kernel, ``embedding_backward``).

What handles a sparse gradient on its way:

* the graph's all-reduce of it gathers rows and values from every place
  (``runtime.collective``, and across processes ``dist.group_collective``) and
  coalesces them: the sum, still sparse; buckets of fused all-reduces leave sparse
  gradients out (``graph.build``); ``BuildStrategy(sparse_gradients=False)`` makes
  every ``is_sparse`` lookup produce a dense gradient instead;
* ``sum`` (an embedding read twice) adds sparse tensors as they are;
* the optimizers (``ops.optim``): ``sgd`` updates the touched rows only, which is
  exactly the dense update (weight decay scales the whole table first); ``adam``
  with ``lazy_mode`` updates the moments and rows of the touched rows only (as
  ``torch.optim.SparseAdam`` and Paddle's lazy mode do: rows not in the batch keep
  their moments), and without it, like ``momentum``, applies the dense update to
  the densified gradient, so the result equals dense training.
"""

import torch

from .guards_hand import kernel
from .registry import register_grad

# its dense kernel adds rows at the ids unchecked, its sparse one makes a sparse tensor of
# them: behind the guard of the ids (and the gradient's shape), ssaexec.ops.guards
_EMBEDDING_BACKWARD = kernel("aten.embedding_backward.default")

__all__ = ["sgd_rows", "adam_rows", "dense", "nbytes", "sum_rows", "rows_of"]


@register_grad("lookup_table", uses=["W", "Ids"])
def lookup_table_grad(ins, attrs, wanted):
    """W@GRAD: the summed Out@GRAD rows per id, sparse (coalesced) with ``is_sparse``."""
    g = ins.get("Out@GRAD")
    if g is None or not wanted.get("W@GRAD", [True])[0]:
        return {}
    w, sparse = ins["W"], attrs["is_sparse"]
    pad = attrs["padding_idx"]
    grad = _EMBEDDING_BACKWARD(g, ins["Ids"], w.shape[0], pad if pad >= 0 else -1, False,
                               sparse)
    return {"W@GRAD": grad.coalesce() if sparse else grad}


def sum_rows(tensors):
    """The sum of sparse tensors, made by gathering their rows and values in order (so
    memory stays proportional to the rows touched); coalesced, on the first's device."""
    dev = tensors[0].device
    parts = [t.coalesce() for t in tensors]
    return torch.sparse_coo_tensor(torch.cat([t.indices().to(dev) for t in parts], 1),
                                   torch.cat([t.values().to(dev) for t in parts]),
                                   tensors[0].shape, check_invariants=False).coalesce()


def rows_of(indices, values, shape):
    """The coalesced sparse tensor of ``shape`` whose rows ``indices`` hold ``values``."""
    return torch.sparse_coo_tensor(indices.reshape(1, -1), values, tuple(shape),
                                   check_invariants=False).coalesce()


def dense(g):
    """``g`` as a dense tensor (a sparse one is densified)."""
    return g.to_dense() if g.is_sparse else g


def nbytes(t):
    """Bytes a tensor holds: a sparse one counts its indices and values."""
    if t.is_sparse:
        t = t.coalesce() if not t.is_coalesced() else t
        return t.indices().numel() * t.indices().element_size() + \
            t.values().numel() * t.values().element_size()
    return t.numel() * t.element_size()


def sgd_rows(p, g, lr, wd):
    """``p -= lr * (g + wd * p)`` for a sparse ``g``: only ``g``'s rows move (plus decay)."""
    g = g.coalesce()
    if wd:
        p.mul_(1 - lr * wd)
    p.index_add_(0, g.indices()[0], g.values() * -lr)


def adam_rows(p, g, lr, m1, m2, b1p, b2p, attrs):
    """Lazy Adam: the touched rows' moments and values, with the dense rule's arithmetic."""
    g = g.coalesce()
    rows, v = g.indices()[0], g.values()
    b1, b2, wd = attrs["beta1"], attrs["beta2"], attrs["weight_decay"]
    if attrs["decoupled"]:
        if wd:
            p.mul_(1 - lr * wd)
    elif wd:
        v = v.add(p.index_select(0, rows), alpha=wd)
    b1p.mul_(b1)
    b2p.mul_(b2)
    r1 = m1.index_select(0, rows).mul_(b1).add_(v, alpha=1 - b1)
    r2 = m2.index_select(0, rows).mul_(b2).addcmul_(v, v, value=1 - b2)
    m1.index_copy_(0, rows, r1)
    m2.index_copy_(0, rows, r2)
    denom = (r2.sqrt() / torch.sqrt(1 - b2p)).add_(attrs["epsilon"])
    p.index_add_(0, rows, (r1 / denom * (lr / (1 - b1p))).neg_())
