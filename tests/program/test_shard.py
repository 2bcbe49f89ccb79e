"""ZeRO's program rewrite (``program.shard``): what is sharded, how, and what is refused."""

import pytest
import torch

import ssaexec as se
from ssaexec.core.errors import ProgramError
from ssaexec.program.example_models import build_mlp, make_optimizer
from ssaexec.program.serialize import from_json as program_from_json, to_json as program_to_json
from ssaexec.program.shard import (SHARD_SUFFIX, ShardLayout, ShardedParam, is_sharded,
                                   layout_of, shard_like, shard_program)


def _mlp(opt="adamw"):
    return build_mlp("float32", make_optimizer(opt, 0.1), in_dim=5, hidden=(7,), classes=3)


def test_layout_slices_evenly_and_joins_back():
    layout = ShardLayout(4, 3, [ShardedParam("w", "w@GRAD", [3, 5], "float32", 15, 4)])
    full = torch.arange(15.0).reshape(3, 5)
    shards = [layout.shard_of(full.reshape(-1), r) for r in range(4)]
    assert [s.tolist() for s in shards[2:]] == [[8, 9, 10, 11], [12, 13, 14, 0]]  # padded
    assert torch.equal(layout.unshard(shards, [3, 5]), full)
    with pytest.raises(ProgramError, match="rank 4 is not in a world of 4"):
        layout.shard_of(full, 4)
    with pytest.raises(ProgramError, match="needs 4 shards"):
        layout.unshard(shards[:3])


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_the_update_runs_on_shards_and_full_state_leaves_the_program(stage):
    main, _, _ = _mlp()
    before = program_to_json(main)
    run, layout = shard_program(main, stage, 3)
    assert program_to_json(main) == before  # the caller's program is not changed
    block = run.global_block()
    assert [sp.name for sp in layout] == ["fc_1.b_0", "fc_1.w_0", "fc_0.b_0", "fc_0.w_0"]
    for sp in layout:
        assert sp.shard_size == -(-sp.numel // 3)
        assert block.var(sp.shard_name).shape == [sp.shard_size]
        assert block.var(sp.shard_name).persistable
        assert block.var(sp.grad + SHARD_SUFFIX).shape == [sp.shard_size]
        assert block.var(sp.name).persistable == (stage != 3)
        assert [full for full, _ in sp.state] and all(
            block.find_var(full) is None and block.var(shard).persistable
            for full, shard in sp.state)  # the moments are shards only
        (upd,) = [op for op in block.ops if op.role == "optimize" and op.role_var
                  and op.role_var[0][0] == sp.name]
        assert upd.input("Param") == [sp.shard_name] == upd.output("ParamOut")
        assert upd.input("Grad") == [sp.grad + SHARD_SUFFIX]
        assert upd.input("Beta1Pow")[0].endswith(SHARD_SUFFIX) is False  # replicated
    # (the run program is the graph's input: the collectives write its gradient shards
    # and stage 3's parameters, so it does not validate alone)
    # idempotent, and the layout is a function of the program: it survives a file
    assert shard_program(run, stage, 3)[0] is run
    again = layout_of(program_from_json(program_to_json(run)), 3, stage)
    assert [(p.name, p.shard_size, p.state) for p in again] == \
        [(p.name, p.shard_size, p.state) for p in layout]
    assert is_sharded(run) and not is_sharded(main)


def test_a_run_program_checks_its_world_and_stage():
    run, _ = shard_program(_mlp()[0], 3, 4)
    with pytest.raises(ProgramError, match="another world size"):
        layout_of(run, 2)
    with pytest.raises(ProgramError, match="sharded for zero_stage=3, not 1"):
        shard_program(run, 1, 4)
    with pytest.raises(ProgramError, match="stage must be 1, 2 or 3"):
        shard_program(run, 0, 4)
    with pytest.raises(ProgramError, match="world must be a positive integer"):
        shard_program(run, 3, 0)


def test_what_does_not_run_on_slices_stays_replicated():
    # an embedding with a sparse gradient: rows, not slices
    main, startup = se.Program(), se.Program()
    with se.program_guard(main, startup):
        ids = se.layers.data("ids", shape=[-1, 4], dtype="int64")
        y = se.layers.data("y", shape=[-1, 1], dtype="float32")
        emb = se.layers.embedding(ids, size=[50, 8], is_sparse=True)
        pred = se.layers.fc(se.layers.reduce_mean(emb, dim=1), size=1)
        loss = se.layers.mean(se.layers.square_error_cost(pred, y))
        se.optimizer.SGD(learning_rate=0.5).minimize(loss)
    _, layout = shard_program(main, 3, 2)
    emb_w = [v.name for v in main.all_parameters() if v.shape == [50, 8]]
    assert emb_w and emb_w[0] not in layout.params and len(layout) == 2


def test_accumulation_micro_batches_hold_the_same_shards():
    from ssaexec.program.accumulate import accumulation_programs
    acc, apply = accumulation_programs(_mlp()[0])
    run, layout = shard_program(apply, 3, 2)
    assert all(sp.grad.endswith("@ACC") for sp in layout)  # the accumulator is scattered
    micro = shard_like(acc, layout)
    block = micro.global_block()
    assert all(block.var(sp.shard_name).persistable and not block.var(sp.name).persistable
               for sp in layout)
    assert [p.name for p in layout_of(micro, 2, 3)] == [p.name for p in layout]


def test_a_sharded_program_needs_the_stage_and_world_it_was_sharded_for(tmp_path):
    # a run program saved to a file and loaded back: it validates as no program file
    # does (its gradient shards are written by the graph alone), is refused by a plain
    # build, and runs only where its shards fit
    run, _ = shard_program(_mlp()[0], 2, 2)
    path = tmp_path / "run.json"
    se.save_program(run, path)
    with pytest.raises(ProgramError, match=r"fc_\d\.\w_0@GRAD@SHARD.*never written"):
        se.load_program(path, validate=True)
    loaded = se.load_program(path)
    with pytest.raises(se.GraphError, match="sharded .* zero_stage=0"):
        se.build_ssa_graph(loaded, se.cpu_places(2))
    with pytest.raises(ProgramError, match="another world size"):
        se.build_ssa_graph(loaded, se.cpu_places(3), se.BuildStrategy(zero_stage=2))
    g = se.build_ssa_graph(loaded, se.cpu_places(2), se.BuildStrategy(zero_stage=1))
    assert g.program is loaded and len(g.shard_layout) == 4
    # a var that merely ends in @SHARD, not a parameter's, is no shard
    main = _mlp()[0]
    main.global_block().create_var("x@SHARD", shape=[3])
    assert not is_sharded(main) and len(shard_program(main, 3, 2)[1]) == 4
