"""ZeRO's collectives on the places of one process (``LocalCollective.all_gather`` and
``reduce_scatter``, the interface ``dist.group_collective`` implements across processes)
and the handle calls that use them (``runtime.handle_calls``)."""

import pytest
import torch

from ssaexec.core.errors import SSAExecError
from ssaexec.runtime.collective import LocalCollective
from ssaexec.runtime.handle_calls import gather_into, padded_flat
from ssaexec.runtime.scope import Scope


def test_all_gather_joins_every_ranks_shard_in_rank_order():
    coll = LocalCollective()
    assert coll.processes == 1 and coll.process_rank == 0
    shards = [torch.full((3,), float(r)) for r in range(4)]
    outs = [torch.empty(12) for _ in range(4)]
    coll.all_gather(shards, outs)
    want = torch.tensor([0.0] * 3 + [1.0] * 3 + [2.0] * 3 + [3.0] * 3)
    assert all(torch.equal(o, want) for o in outs)


def test_reduce_scatter_sums_like_the_all_reduce_to_the_last_bit():
    g = torch.Generator().manual_seed(0)
    grads = [torch.randn(10, dtype=torch.float32, generator=g) * 10 ** k for k in range(3)]
    fulls = [padded_flat(t, 3) for t in grads]
    assert fulls[0].numel() == 12 and not fulls[0][10:].any()  # zero-padded to W*S
    shards = [torch.empty(4) for _ in range(3)]
    LocalCollective().reduce_scatter(fulls, shards)
    reduced = [t.clone() for t in grads]
    LocalCollective().all_reduce(reduced)  # the same order: places in order
    joined = torch.cat(shards)[:10]
    assert torch.equal(joined, reduced[0])  # bit-identical, not merely close


def test_shapes_that_do_not_fit_are_refused_naming_the_collective():
    coll = LocalCollective()
    with pytest.raises(SSAExecError, match="all_gather\\(w\\): full buffers must be 1-D of 6"):
        coll.all_gather([torch.zeros(3), torch.zeros(3)], [torch.zeros(6), torch.zeros(5)],
                        label="all_gather(w)")
    with pytest.raises(SSAExecError, match="shards must be 1-D of 3 elements"):
        coll.reduce_scatter([torch.zeros(6), torch.zeros(6)], [torch.zeros(3), torch.zeros(2)])
    with pytest.raises(SSAExecError, match="2 shards for 1 full buffers"):
        coll.all_gather([torch.zeros(3), torch.zeros(3)], [torch.zeros(6)])


def test_a_gathered_parameter_rewrites_the_one_a_place_holds_else_is_bound_anew():
    kept, fresh = Scope(), Scope()
    old = torch.zeros(2, 2)
    kept.vars["w"] = old
    outs = [torch.arange(6.0), torch.arange(6.0)]
    gather_into([kept, fresh], [0, 1], "w", outs, [2, 2])
    assert kept.vars["w"] is old and torch.equal(old, torch.arange(4.0).reshape(2, 2))
    assert torch.equal(fresh.vars["w"], old) and fresh.vars["w"].shape == (2, 2)
