"""Ops owning sub-blocks (conditional_block) run in both executors and agree."""

import torch

import ssaexec as se
from ssaexec.program.desc import BlockRef


def _program():
    prog = se.Program()
    g = prog.global_block()
    g.create_var("x", [-1, 3], "float64", is_data=True)
    g.create_var("flag", [1], "bool", is_data=True)
    g.create_var("y", [-1, 3], "float64")
    g.create_var("z", [-1, 3], "float64")
    g.append_op("scale", {"X": ["x"]}, {"Out": ["y"]}, {"scale": 2.0})
    sub = prog.create_block(parent_idx=0)
    sub.append_op("relu", {"X": ["y"]}, {"Out": ["y"]})
    sub.append_op("scale", {"X": ["y"]}, {"Out": ["y"]}, {"scale": 10.0})
    g.append_op("conditional_block", {"Cond": ["flag"], "Input": ["y"]}, {"Out": ["y"]},
                {"sub_block": BlockRef(1)})
    g.append_op("elementwise_add", {"X": ["y"], "Y": ["x"]}, {"Out": ["z"]})
    return prog


def test_conditional_block_in_both_executors():
    prog = _program()
    prog.validate()
    x = torch.randn(4, 3, dtype=torch.float64)
    for flag, expect in ((True, torch.relu(2 * x) * 10 + x), (False, 2 * x + x)):
        feed = {"x": x, "flag": torch.tensor([flag])}
        z, = se.Executor().run(prog, feed=feed, fetch_list=["z"], scope=se.Scope())
        assert torch.allclose(z, expect)
        with se.ParallelExecutor(se.cpu_places(2), prog, scope=se.Scope()) as pe:
            zp, = pe.run(["z"], feed=feed)
        assert torch.allclose(zp, expect)
    graph = se.build_ssa_graph(prog, se.cpu_places(2))
    graph.lint()
    cond = [op for op in graph.ops_of_kind("compute") if op.op.type == "conditional_block"]
    assert len(cond) == 2 and all(any(v.name == "y" for v in op.outputs) for op in cond)
