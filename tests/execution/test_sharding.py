"""ZeRO-sharded optimizer state and compressed all-reduce (BuildStrategy), against all-reduce.

(The exactness of every ZeRO stage is tests/execution/test_zero.py's; here, the memory
each place keeps and the options.)"""

import pytest
import torch

import ssaexec as se
from ssaexec.core.errors import SSAExecError
from ssaexec.program.example_models import build_mlp, make_optimizer

STEPS = 30


def _data():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(32, 10, generator=g)
    return {"img": x, "label": x[:, :4].argmax(1, keepdim=True)}


def _train(opt, places, steps=STEPS, **build):
    lr = 0.01 if opt == "adam" else 0.1
    main, startup, loss = build_mlp("float32", make_optimizer(opt, lr), in_dim=10,
                                    hidden=(16, 8), classes=4)
    feed = _data()
    with se.ParallelExecutor(se.cpu_places(places), main, startup, loss,
                             se.BuildStrategy(**build), scope=se.Scope()) as pe:
        losses = [float(pe.run([loss], feed=feed)[0]) for _ in range(steps)]
        params = {p.name: [pe.get_var(p.name, i) for i in range(places)]
                  for p in main.all_parameters()}
        state = [sum(t.numel() * t.element_size() for n, t in s.vars.items()
                     if _is_state(main, n)) for s in pe.local_scopes]
        return losses, params, state, pe.shard_layout()


def _is_state(main, name):
    # optimizer state as the plain program declares it, or its ZeRO shard
    name = name[:-len("@SHARD")] if name.endswith("@SHARD") else name
    var = main.global_block().find_var(name)
    return var is not None and var.persistable and not var.is_parameter and \
        name != "learning_rate_0"


@pytest.mark.parametrize("opt", ["momentum", "adam"])
@pytest.mark.parametrize("places", [2, 4])
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_gives_the_all_reduce_parameters_and_shards_the_state(opt, places, stage):
    _, ref, ref_state, none = _train(opt, places, steps=10)
    _, got, state, layout = _train(opt, places, steps=10, zero_stage=stage)
    assert none is None and layout.world == places and len(layout) == 6
    for name, vals in ref.items():
        for a, b in zip(vals, got[name], strict=True):
            assert torch.allclose(a, b, rtol=1e-6, atol=1e-7), name
    # every place kept the whole state before; now each keeps its 1/W slice (padded up
    # by less than one element per rank and sharded var), replicated beta powers aside
    assert all(s == ref_state[0] for s in ref_state)
    assert all(s == state[0] for s in state) and state[0] * places >= ref_state[0] * 0.9
    assert state[0] < ref_state[0] / places + 4 * 64


def test_bf16_compressed_all_reduce_trains_like_fp32_within_a_bf16_distance():
    ref_losses, ref, _, _ = _train("momentum", 2)
    losses, got, _, _ = _train("momentum", 2, allreduce_dtype="bf16")
    assert abs(losses[-1] - ref_losses[-1]) / ref_losses[-1] < 0.01
    diffs = [(a - b).abs().max().item() / max(a.abs().max().item(), 1e-6)
             for name in ref for a, b in zip(ref[name], got[name], strict=True)]
    assert 0 < max(diffs) < 0.05  # compressed (it differs) by about bf16's precision
    # replicas stay identical: every place got the same compressed sum
    for vals in got.values():
        assert all(torch.equal(vals[0], v) for v in vals[1:])


def test_fused_buckets_count_compressed_bytes():
    main, _, _ = build_mlp("float32", make_optimizer("sgd", 0.1), in_dim=10, hidden=(16, 8),
                           classes=4)
    # 0.0006 MiB ~ 629 bytes: fp32 gradients of 10x16 (640 B) fill a bucket alone,
    # bf16 ones (320 B) share one
    count = {}
    for dtype in (None, "bf16"):
        bs = se.BuildStrategy(fuse_all_reduce_ops=True, fuse_bucket_mb=0.0006,
                              allreduce_dtype=dtype)
        g = se.build_ssa_graph(main, se.cpu_places(2), bs)
        count[dtype] = len(g.collectives)
        assert all(h.details().get("wire_dtype") == ({"bf16": "bfloat16"}.get(dtype))
                   for h in g.collectives)
    assert count["bf16"] < count[None]


def test_sharding_options_are_checked():
    with pytest.raises(SSAExecError, match="zero_stage"):
        se.BuildStrategy(zero_stage=4)
    with pytest.raises(SSAExecError, match="zero_stage=1"):
        se.BuildStrategy(zero_stage=1, reduce_strategy="reduce")
    with pytest.raises(SSAExecError, match="zero_prefetch"):
        se.BuildStrategy(zero_prefetch=-1)
    with pytest.raises(SSAExecError, match="reshard_after_forward"):
        se.BuildStrategy(reshard_after_forward="yes")
    with pytest.raises(SSAExecError, match="zero_gather_dtype"):
        se.BuildStrategy(zero_gather_dtype="int8")
    with pytest.raises(SSAExecError, match="allreduce_dtype"):
        se.BuildStrategy(allreduce_dtype="int8")


def test_customized_gradient_scale_takes_the_fed_seed_and_one_sums():
    main, startup, loss = build_mlp("float64", make_optimizer("sgd", 0.1), in_dim=10,
                                    hidden=(8,), classes=4)
    feed = {k: (v.double() if v.is_floating_point() else v) for k, v in _data().items()}
    params = {}
    for scale, seed in (("coeff_num_device", None), ("customized", 0.5), ("one", None),
                        ("customized", 1.0)):
        f = dict(feed) if seed is None else dict(feed, **{loss + "@GRAD": torch.tensor(
            seed, dtype=torch.float64)})
        bs = se.BuildStrategy(gradient_scale_strategy=scale)
        with se.ParallelExecutor(se.cpu_places(2), main, startup, loss, bs,
                                 scope=se.Scope()) as pe:
            pe.run([loss], feed=f)
            params[(scale, seed)] = pe.local_scopes[0].find_var("fc_0.w_0").clone()
    assert torch.equal(params[("coeff_num_device", None)], params[("customized", 0.5)])
    assert torch.equal(params[("one", None)], params[("customized", 1.0)])
    assert not torch.equal(params[("one", None)], params[("customized", 0.5)])
