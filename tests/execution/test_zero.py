"""ZeRO stages 1-3 in one process (``BuildStrategy(zero_stage=...)``, ``program.shard``):
every stage trains exactly as the plain all-reduce run, on the readable and compiled
paths, with gradient accumulation, LR schedules, AMP and atomic steps, and holds the
memory it promises (the places' own tensor accounting, ``harness.place_memory``)."""

import functools

import pytest
import torch
import torch.nn.functional as F

import ssaexec as se
from ssaexec.core.errors import OpError, ProgramError
from ssaexec.frontends.torch import from_torch, write_back
from ssaexec.graph.ssa import AllGatherOpHandle, FreeOpHandle, ReduceScatterOpHandle
from ssaexec.harness.place_memory import measure_step
from ssaexec.program.example_models import build_cnn, build_mlp, make_optimizer
from ssaexec.program.lr import StepDecay

STEPS = 3


def _model(name, dtype="float64", opt="sgd", lr=0.05):
    optimizer = make_optimizer(opt, lr) if isinstance(opt, str) else opt
    if name == "mlp":
        return build_mlp(dtype, optimizer, in_dim=12, hidden=(9, 7), classes=5)
    return build_cnn(dtype, optimizer, channels=2, size=8, classes=5, filters=(3, 4))


def _feeds(name, dtype=torch.float64, steps=STEPS, batch=8):
    g = torch.Generator().manual_seed(0)
    shape = (batch, 12) if name == "mlp" else (batch, 2, 8, 8)
    return [{"img": torch.randn(*shape, generator=g, dtype=dtype),
             "label": torch.randint(0, 5, (batch, 1), generator=g)} for _ in range(steps)]


def _train(name, places, stage=0, opt="sgd", dtype="float64", compiled=False, compiler=None,
           amp=None, steps=STEPS, **build):
    main, startup, loss = _model(name, dtype, opt)
    es = se.ExecutionStrategy(compiled=compiled, compiler=compiler, amp=amp)
    with se.ParallelExecutor(se.cpu_places(places), main, startup, loss,
                             se.BuildStrategy(zero_stage=stage, **build), es,
                             scope=se.Scope()) as pe:
        losses = [float(pe.run([loss], feed=f)[0])
                  for f in _feeds(name, getattr(torch, dtype), steps)]
        return losses, pe.gathered_state(), pe.shard_layout()


@functools.cache
def _plain(name, places, opt, dtype="float64", **kw):
    return _train(name, places, 0, opt, dtype, **kw)


def _max_diff(a, b):
    assert set(a) == set(b)
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


# --- exactness ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["mlp", "cnn"])
@pytest.mark.parametrize("opt", ["sgd", "adamw"])
@pytest.mark.parametrize("places", [2, 4])
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_every_stage_trains_as_the_all_reduce_run_float64(name, opt, places, stage):
    ref_losses, ref, none = _plain(name, places, opt)
    losses, got, layout = _train(name, places, stage, opt)
    assert none is None and layout.stage == stage and layout.world == places
    assert len(layout) == len([v for v in _model(name)[0].all_parameters()])
    assert losses == pytest.approx(ref_losses, abs=1e-10, rel=0)
    assert _max_diff(ref, got) <= 1e-10  # every persistable, parameters and moments


def test_stage3_float32_within_1e_5():
    ref_losses, ref, _ = _plain("mlp", 4, "adamw", "float32")
    losses, got, _ = _train("mlp", 4, 3, "adamw", "float32")
    assert losses == pytest.approx(ref_losses, abs=1e-5)
    assert _max_diff(ref, got) <= 1e-5


@pytest.mark.parametrize("stage", [2, 3])
def test_compiled_path_runs_every_stage_exactly(stage):
    ref_losses, ref, _ = _plain("cnn", 2, "adamw")
    losses, got, _ = _train("cnn", 2, stage, "adamw", compiled=True)
    assert losses == pytest.approx(ref_losses, abs=1e-10, rel=0)
    assert _max_diff(ref, got) <= 1e-10


@pytest.mark.parametrize("keep", [False, True])
def test_reshard_after_forward_and_prefetch_change_the_schedule_not_the_result(keep):
    ref_losses, ref, _ = _plain("mlp", 2, "adamw")
    losses, got, _ = _train("mlp", 2, 3, "adamw", reshard_after_forward=not keep,
                            zero_prefetch=0 if keep else 3)
    assert losses == ref_losses and _max_diff(ref, got) == 0


def test_low_precision_gather_rounds_the_parameters_it_sends():
    ref_losses, ref, _ = _plain("mlp", 2, "sgd", "float32")
    losses, got, _ = _train("mlp", 2, 3, "sgd", "float32", zero_gather_dtype="bf16")
    # the shards (master weights) stay fp32; forward and backward see bf16-rounded ones
    assert 0 < abs(losses[-1] - ref_losses[-1]) < 0.02 * abs(ref_losses[-1])
    assert _max_diff(ref, got) < 0.01


@pytest.mark.parametrize("stage", [2, 3])
def test_gradient_accumulation_reduce_scatters_on_the_applying_step_only(stage):
    main, startup, loss = _model("mlp", opt="adamw")
    feeds = _feeds("mlp", steps=4)
    out = {}
    for zero in (0, stage):
        bs = se.BuildStrategy(zero_stage=zero, gradient_accumulation_steps=2)
        with se.ParallelExecutor(se.cpu_places(2), main, startup, loss, bs,
                                 scope=se.Scope()) as pe:
            out[zero] = ([float(pe.run([loss], feed=f)[0]) for f in feeds],
                         pe.gathered_state())
            if zero:
                acc, app = pe.graph([loss], "accumulate"), pe.graph([loss], "apply")
                assert not acc.ops_of_kind(ReduceScatterOpHandle)
                # one a layer: fc_i's weight and bias gradients in one call
                assert len(app.ops_of_kind(ReduceScatterOpHandle)) == 3
                # stage 3's micro-batches still gather the parameters they read
                assert bool(acc.ops_of_kind(AllGatherOpHandle)) == (stage == 3)
    assert out[stage][0] == pytest.approx(out[0][0], abs=1e-10, rel=0)
    assert _max_diff(out[0][1], out[stage][1]) <= 1e-10


def test_lr_schedule_and_bf16_amp_run_under_stage3():
    def run(stage, amp=None):
        main, startup, loss = _model("mlp", "float32", se.optimizer.SGD(StepDecay(0.1, 2)))
        es = se.ExecutionStrategy(amp=amp)
        with se.ParallelExecutor(se.cpu_places(2), main, startup, loss,
                                 se.BuildStrategy(zero_stage=stage), es,
                                 scope=se.Scope()) as pe:
            losses = [float(pe.run([loss], feed=f)[0])
                      for f in _feeds("mlp", torch.float32, 4)]
            return losses, pe.gathered_state(), pe.get_lr()
    for amp in (None, "bf16"):
        ref_losses, ref, ref_lr = run(0, amp)
        losses, got, lr = run(3, amp)
        assert lr == ref_lr == pytest.approx(0.1 * 0.1)  # decayed after the 2nd step
        assert losses == pytest.approx(ref_losses, abs=1e-5)
        assert _max_diff(ref, got) <= 1e-5


def test_a_failed_step_changes_no_shard():
    main, startup, loss = _model("mlp", opt="adamw")
    with se.ParallelExecutor(se.cpu_places(2), main, startup, loss,
                             se.BuildStrategy(zero_stage=3), scope=se.Scope()) as pe:
        feed = _feeds("mlp", steps=1)[0]
        pe.run([loss], feed=feed)
        before = pe.gathered_state()
        bad = dict(feed, label=torch.full((8, 1), 99))  # out of range: cross_entropy fails
        with pytest.raises(OpError):
            pe.run([loss], feed=bad)
        assert _max_diff(before, pe.gathered_state()) == 0
        pe.run([loss], feed=feed)  # and the executor goes on
        assert _max_diff(before, pe.gathered_state()) > 0


def test_sharded_vars_are_fetched_read_and_written_whole():
    main, startup, loss = _model("mlp", opt="adamw")
    with se.ParallelExecutor(se.cpu_places(4), main, startup, loss,
                             se.BuildStrategy(zero_stage=3), scope=se.Scope()) as pe:
        layout = pe.shard_layout()
        sp = layout.params["fc_0.w_0"]
        moment = sp.state[0][0]
        feed = _feeds("mlp", steps=1)[0]
        w, m, _ = pe.run(["fc_0.w_0", moment, loss], feed=feed)
        state = pe.gathered_state()
        assert torch.equal(w, state["fc_0.w_0"]) and list(w.shape) == sp.shape
        assert torch.equal(m, state[moment]) and m.abs().sum() > 0
        assert all(torch.equal(pe.get_var("fc_0.w_0", i), w) for i in range(4))
        # no place holds the full parameter between steps: each its 1/4
        assert all(s.find_var("fc_0.w_0") is None for s in pe.local_scopes)
        assert all(s.find_var(sp.shard_name).numel() == sp.shard_size
                   for s in pe.local_scopes)
        new = torch.arange(w.numel(), dtype=w.dtype).reshape(w.shape)
        pe.set_var("fc_0.w_0", new)
        assert torch.equal(pe.get_var("fc_0.w_0"), new)
        with pytest.raises(se.SSAExecError, match="cannot fetch 'fc_0.w_0@GRAD' under "
                                                  "zero_stage=3"):
            pe.run(["fc_0.w_0@GRAD"], feed=feed)
        part, = pe.run(["fc_0.w_0@GRAD@SHARD"], feed=feed, return_merged=False)
        assert [p.numel() for p in part] == [sp.shard_size] * 4


def test_ops_that_read_every_gradient_are_refused_from_stage_2():
    main, startup, loss = _model("mlp", opt="sgd")
    block = main.global_block()
    grad = block.ops[-1].input("Grad")[0]
    norm = block.create_var("grad_norm", shape=[], dtype="float64")
    first_update = next(i for i, op in enumerate(block.ops) if op.role == "optimize")
    block.insert_op(first_update, se.OpDesc("reduce_sum", {"X": [grad]}, {"Out": [norm.name]},
                                            {"dim": [], "keep_dim": False,
                                             "reduce_all": True}, role="optimize"))
    for stage in (2, 3):
        with pytest.raises(ProgramError, match=r"zero_stage=\d: op #\d+ 'reduce_sum' reads "
                                               "the gradient"):
            se.build_ssa_graph(main, se.cpu_places(2), se.BuildStrategy(zero_stage=stage))
    # stage 1 keeps that parameter replicated (all-reduced), the others sharded
    g = se.build_ssa_graph(main, se.cpu_places(2), se.BuildStrategy(zero_stage=1))
    assert len(g.shard_layout) == 5 and block.ops[-1].input("Param")[0] not in \
        g.shard_layout.params
    g.lint()


# --- memory -----------------------------------------------------------------------------------
def test_stage3_holds_a_quarter_of_the_model_plus_what_one_layer_gathers():
    # eight equal layers (a transformer's shape): the places' own tensor accounting,
    # sampled after every op, on one thread (a deterministic order)
    main, startup, loss = build_mlp("float32", make_optimizer("adamw", 0.01), in_dim=128,
                                    hidden=(128,) * 8, classes=16)
    g = torch.Generator().manual_seed(0)
    feed = {"img": torch.randn(8, 128, generator=g),
            "label": torch.randint(0, 16, (8, 1), generator=g)}
    peaks, kinds = {}, {}
    for stage in (0, 1, 2, 3):
        with se.ParallelExecutor(se.cpu_places(4), main, startup, loss,
                                 se.BuildStrategy(zero_stage=stage),
                                 se.ExecutionStrategy(num_threads=1), scope=se.Scope()) as pe:
            places = measure_step(pe, main, [loss], feed)["places"]
            top = max(places, key=lambda p: p["peak_model"])
            peaks[stage], kinds[stage] = top["peak_model"], top["at_model_peak"]
            if stage == 3:
                layer = max(sp.numel * 4 for sp in pe.shard_layout())
                # shards are padded to W equal slices: < W elements per sharded var
                # (parameter, two moments, gradient)
                pad = sum(sp.shard_size * 4 - sp.numel for sp in pe.shard_layout()) * 4 * 4
                gathered = max(p["peak_kind"]["gathered"] for p in places)
    assert peaks[0] > peaks[1] > peaks[2] > peaks[3]
    assert kinds[1]["optimizer"] * 4 <= kinds[0]["optimizer"] * 1.01  # stage 1: state/4
    assert kinds[2]["grads"] < kinds[1]["grads"] / 2  # stage 2: gradients too
    # stage 3: the parameters too; what it holds beyond a quarter of the plain run is the
    # gathered layer(s) (zero_prefetch=1: this one and the next) and the unsharded
    # gradient of the layer in backward, as FSDP2 holds them
    assert gathered <= 2 * layer + 4096
    # (+ the replicated scalars every place keeps whole: beta powers, learning rate)
    scalars = 4 * (2 * 18 + 1)
    assert peaks[3] <= peaks[0] / 4 + gathered + layer + pad + scalars * 3 / 4


# --- an imported model, against torch -----------------------------------------------------------
class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(2, 4, 3, padding=1)
        self.fc = torch.nn.Linear(4 * 4 * 4, 5)

    def forward(self, x):
        return self.fc(F.max_pool2d(F.relu(self.conv(x)), 2).flatten(1))


@pytest.mark.parametrize("stage", [1, 3])
def test_imported_cnn_trains_as_torch_and_writes_back(stage):
    model = _Net().double()
    feeds = _feeds("cnn")
    ex = {"x": feeds[0]["img"], "target": feeds[0]["label"][:, 0]}
    main, startup, loss = from_torch(model, ex, loss_fn=F.cross_entropy,
                                     optimizer=se.optimizer.AdamW(0.01, weight_decay=0.1))
    with se.ParallelExecutor(se.cpu_places(2), main, startup, loss,
                             se.BuildStrategy(zero_stage=stage), scope=se.Scope()) as pe:
        losses = [float(pe.run([loss], feed={"x": f["img"], "target": f["label"][:, 0]})[0])
                  for f in feeds]
        trained = _Net().double()
        write_back(pe, trained)
    ref = _Net().double()
    opt = torch.optim.AdamW(ref.parameters(), lr=0.01, weight_decay=0.1)
    for f, got in zip(feeds, losses, strict=True):
        opt.zero_grad()
        lv = F.cross_entropy(ref(f["img"]), f["label"][:, 0])
        lv.backward()
        opt.step()
        assert got == pytest.approx(float(lv), abs=1e-10)
    for (n, a), b in zip(ref.named_parameters(), trained.parameters(), strict=True):
        assert torch.allclose(a, b, rtol=0, atol=1e-10), n


# --- the graph a user sees ----------------------------------------------------------------------
def test_stage3_graph_shows_gathers_and_frees_in_its_dump():
    main, _, loss = _model("mlp")
    g = se.build_ssa_graph(main, se.cpu_places(2), se.BuildStrategy(zero_stage=3), [loss])
    dot = g.to_dot()
    assert "all_gather(" in dot and "reduce_scatter(" in dot and "free(" in dot
    # each parameter freed twice (forward, backward), each layer's gradients once
    assert len(g.ops_of_kind(FreeOpHandle)) == 2 * (12 + 3)
    # one gather a layer and phase, one reduce-scatter a layer (fc_0..fc_2)
    assert len(g.ops_of_kind(AllGatherOpHandle)) == 2 * 3
    assert len(g.ops_of_kind(ReduceScatterOpHandle)) == 3


def test_stage3_under_inductor_compiles_every_segment_and_equals_the_plain_run():
    ref_losses, ref, _ = _plain("mlp", 2, "adamw")
    main, startup, loss = _model("mlp", opt="adamw")
    with se.ParallelExecutor(se.cpu_places(2), main, startup, loss,
                             se.BuildStrategy(zero_stage=3),
                             se.ExecutionStrategy(compiler="inductor"), scope=se.Scope()) as pe:
        losses = [float(pe.run([loss], feed=f)[0]) for f in _feeds("mlp")]
        runner = pe._runner((loss,))
        got = pe.gathered_state()
    lowering = runner.lowering
    assert lowering.fallbacks == [] and lowering.compiles >= 2
    # the segments are cut at the gathers and reduce-scatters, the frees inside them
    kinds = {type(h).__name__ for seg in runner.segments for h in seg.handles}
    assert "FreeOpHandle" in kinds
    assert losses == pytest.approx(ref_losses, abs=1e-10)
    assert _max_diff(ref, got) <= 1e-10


def test_a_free_after_a_reduce_scatter_keeps_backward_from_waiting_for_it():
    main, startup, loss = _model("mlp", opt="adamw")
    # (a zero_prefetch beyond the model's depth: no back-pressure edge either)
    with se.ParallelExecutor(se.cpu_places(2), main, startup, loss,
                             se.BuildStrategy(zero_stage=2, zero_prefetch=100),
                             scope=se.Scope()) as pe:
        runner = pe._runner((loss,))
    nodes = runner.nodes
    frees = [n for n in nodes if n.handles[0].bookkeeping and len(n.handles) == 1
             and not hasattr(n, "lowered")]
    assert len(frees) == 2 * 3  # each layer's gradients' free on each place: its own node
    for seg in runner.segments:
        assert not isinstance(seg.handles[0], FreeOpHandle)
        # a segment of backward compute starts after no reduce-scatter
        if all(getattr(h, "op", None) is not None and h.op.role == "backward"
               for h in seg.handles):
            assert not any(isinstance(p.handles[0], ReduceScatterOpHandle)
                           for p in seg.producers() if len(p.handles) == 1)


@pytest.mark.parametrize("stage", [1, 3])
def test_the_executors_scope_keeps_no_whole_copy_of_what_the_places_shard(stage):
    main, startup, loss = _model("mlp", opt="adamw")
    scope = se.Scope()
    with se.ParallelExecutor(se.cpu_places(2), main, startup, loss,
                             se.BuildStrategy(zero_stage=stage), scope=scope) as pe:
        layout = pe.shard_layout()
        moments = [full for sp in layout for full, _ in sp.state]
        assert len(moments) == 2 * len(layout)  # AdamW's two moments a parameter
        assert not any(n in scope.vars for n in moments)
        for sp in layout:
            if stage == 3:
                assert sp.name not in scope.vars
            else:  # the parameter place 0 holds whole and updates: the same tensor
                assert scope.vars[sp.name] is pe.local_scopes[0].vars[sp.name]
        pe.run([loss], feed=_feeds("mlp", steps=1)[0])
        # what the places hold is still readable whole
        state = pe.gathered_state()
        assert all(n in state for n in moments) and all(sp.name in state for sp in layout)
        assert torch.equal(pe.get_var(moments[0]), state[moments[0]])


def test_an_evaluation_executor_shares_a_stage_3_run_and_keeps_nothing_whole():
    # share_vars_from on stage 3: each evaluation run borrows the whole parameters it
    # reads (joined from the shards) and gives them back after; its results equal those
    # of sharing the plain run
    from tests.execution.test_eval import _data, _program
    accuracy = {}
    for stage in (0, 3):
        main, startup, loss, test, (acc, *_rest) = _program()
        feed = _data()
        with se.ParallelExecutor(se.cpu_places(2), main, startup, loss, scope=se.Scope(),
                                 build_strategy=se.BuildStrategy(zero_stage=stage)) as train:
            with se.ParallelExecutor(se.cpu_places(2), test, share_vars_from=train) as ev:
                for _ in range(5):
                    train.run([loss], feed=feed)
                got = [float(ev.run([acc], feed=feed)[0]) for _ in range(2)]
                assert got[0] == got[1]
                # nothing whole kept between runs, here or (stage 3) on the places shared
                assert not any("fc_0.w_0" in s.vars for s in ev.local_scopes)
                if stage == 3:
                    assert all(s.parent.find_var("fc_0.w_0") is None for s in ev.local_scopes)
        accuracy[stage] = got[0]
    assert accuracy[3] == accuracy[0]
