"""Issue 46: values are checked against their declarations at run time (``runtime.boundary``).

Every declared shape may be right and a value still contradict its declaration on its
way into a step: a startup program that fills batch-norm statistics with one element, a
parameter file decoded against another program, a checkpoint, ``set_var``. One rule,
checked once per load, refuses each before any kernel sees it. One test per route
(feed; startup programs as native JSON and text files, as a legacy Paddle program, and
beside a PIR program; parameter files; checkpoints; ``set_var`` and ``Scope.set_var``),
then the command line in subprocesses under ``MALLOC_CHECK_=3``: exit 2 and one clean
line, never a signal.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import ssaexec as se
from ssaexec import cli
from ssaexec.state.checkpoint import load_checkpoint, save_checkpoint
from ssaexec.core.errors import FeedError, OpError, ProgramError
from ssaexec.frontends import paddle as sp
from ssaexec.frontends.paddle.params import encode_record, save_combined
from ssaexec.frontends.paddle.schema import messages
from ssaexec.core.place import MetaPlace
from ssaexec.program.io import save_program

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import paddle_models as pm  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
PIR = REPO / "tests" / "fixtures" / "paddle" / "pir"
EXAMPLES = REPO / "examples"
MEAN = "batch_norm_0.w_1"  # the running mean of the first batch norm


def _bn_programs():
    """A batch norm trained by SGD: (main, startup); the statistics are declared [3]."""
    main, startup = se.Program(), se.Program()
    with se.program_guard(main, startup):
        x = se.layers.data("x", [-1, 3, 4, 4], "float32")
        loss = se.layers.mean(se.layers.batch_norm(x))
        se.optimizer.SGD(0.1).minimize(loss)
    return main, startup, loss.name


def _one_element_mean(startup):
    """``startup`` filling the running mean with one element (declared so: it validates)."""
    bad = startup.clone()
    bad.global_block().var(MEAN).shape = [1]
    for op in bad.global_block().ops:
        if op.output_names() == [MEAN]:
            op.attrs["shape"] = [1]
    bad.validate()
    return bad


def _feed(batch=4):
    return {"x": torch.randn(batch, 3, 4, 4)}


def _cli(capsys, *argv):
    status = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return status, out, err


# --- feed -----------------------------------------------------------------------------------

def test_a_feed_that_contradicts_its_declaration_is_refused():
    main, startup, loss = _bn_programs()
    scope = se.Scope()
    exe = se.Executor()
    exe.run(startup, scope=scope)
    cases = [
        (torch.randn(4, 3, 5, 4), r"feed 'x' has shape \[4, 3, 5, 4\] but the program declares "
                                  r"\[-1, 3, 4, 4\]"),
        (torch.randn(4, 3, 4, 4, dtype=torch.float64),
         r"feed 'x' has dtype float64 but the program declares float32"),
        (torch.randn(4, 3, 4, 4).to_sparse(), r"feed 'x' has layout sparse_coo, not a dense"),
        (torch.empty(4, 3, 4, 4, device="meta"), r"feed 'x' is on the meta device"),
    ]
    for value, message in cases:
        with pytest.raises(FeedError, match=message):
            exe.run(main, feed={"x": value}, fetch_list=[loss], scope=scope)
    with se.ParallelExecutor(se.cpu_places(2), main, startup, loss, scope=se.Scope()) as pe:
        for value, message in cases:
            with pytest.raises(FeedError, match=message):
                pe.run([loss], feed={"x": value})
        assert pe.run([loss], feed=_feed())[0].shape == ()  # the refusals changed nothing


# --- startup programs -----------------------------------------------------------------------

@pytest.mark.parametrize("suffix", ["json", "ssa"])
def test_a_startup_file_with_misfit_statistics_is_refused_naming_its_op(suffix, tmp_path):
    main, startup, loss = _bn_programs()
    path = save_program(_one_element_mean(startup), tmp_path / f"bn.startup.{suffix}")
    bad = se.load_program(path)
    expected = (rf"var '{MEAN}' from the startup program \(op #2 'fill_constant' at "
                rf".*bn\.startup\.{suffix}:\d+:\d+\) has shape \[1\] but the program "
                r"declares \[3\]")
    with pytest.raises(ProgramError, match=expected):
        se.ParallelExecutor(se.cpu_places(2), main, bad, loss, scope=se.Scope())
    # the sequential executor: the startup writes its scope, main's first step reads it
    scope = se.Scope()
    exe = se.Executor()
    exe.run(bad, scope=scope)
    for compiled in (True, False):
        with pytest.raises(ProgramError, match=rf"var '{MEAN}' from the scope .* has shape "
                                               r"\[1\] but the program declares \[3\]"):
            se.Executor(compiled=compiled).run(main, feed=_feed(), fetch_list=[loss],
                                               scope=scope)


def _legacy_startup_with_one_element_mean(model):
    msg = messages().ProgramDesc.FromString(model.startup)
    for var in msg.blocks[0].vars:
        if var.name == MEAN:
            del var.type.lod_tensor.tensor.dims[:]
            var.type.lod_tensor.tensor.dims.append(1)
    for op in msg.blocks[0].ops:
        if [a for o in op.outputs for a in o.arguments] == [MEAN]:
            for attr in op.attrs:
                if attr.name == "shape":
                    del attr.longs[:]
                    attr.longs.append(1)
    return msg.SerializeToString()


def test_a_legacy_paddle_startup_program_with_misfit_statistics_is_refused():
    m = pm.cnn("sgd")
    model = se.from_paddle(m.main, startup=_legacy_startup_with_one_element_mean(m))
    with pytest.raises(ProgramError, match=rf"var '{MEAN}' from the startup program \(op #\d+ "
                                           r"'fill_constant'\) has shape \[1\] but the "
                                           r"program declares \[4\]"):
        se.ParallelExecutor(se.cpu_places(1), model.main, model.startup, model.fetch[0],
                            scope=se.Scope())
    good = se.from_paddle(m.main, startup=m.startup)
    xs, ys = pm.feed_for(m, 4)
    with se.ParallelExecutor(se.cpu_places(1), good.main, good.startup, good.fetch[0],
                             scope=se.Scope()) as pe:
        assert torch.isfinite(pe.run(good.fetch, feed={"img": xs, "label": ys})[0])


def test_a_native_startup_beside_a_pir_program_is_checked_against_it(tmp_path, capsys):
    shutil.copy(PIR / "cnn.json", tmp_path / "m.json")
    start = se.Program()
    block = start.global_block()
    block.create_var("layer_norm_0.w_0", [1], "float32", persistable=True)
    block.append_op("fill_constant", {}, {"Out": ["layer_norm_0.w_0"]},
                    {"shape": [1], "value": 1.0, "dtype": "float32"})
    save_program(start, tmp_path / "m.startup.json")  # found next to m.json
    status, _, err = _cli(capsys, "run", tmp_path / "m.json", "--finetune", "cross_entropy",
                          "--steps", "1", "--places", "cpu:1", "--batch", "2", "--no-progress")
    assert status == 2, err
    assert "var 'layer_norm_0.w_0' from the startup program (op #0 'fill_constant' at " in err
    assert "m.startup.json" in err and "has shape [1] but the program declares [8]" in err


# --- parameter files ------------------------------------------------------------------------

def _sibling_pdmodel(directory, names, shape=(1,)):
    """``m.pdmodel`` declaring ``names`` as ``shape`` and a matching ``m.pdiparams``."""
    b = pm.ProgramBuilder()
    b.var("feed", [], kind=pm.FEED_MINIBATCH, persistable=True)
    b.var("fetch", [], kind=pm.FETCH_LIST, persistable=True)
    x = b.var("img", [-1, 1], need_check_feed=True, stop_gradient=True)
    b.op("feed", {"X": ["feed"]}, {"Out": [x]}, {"col": 0})
    for n in names:
        b.var(n, list(shape), persistable=True, is_parameter=True)
    y = b.var("y", [-1, 1])
    b.op("scale", {"X": [x]}, {"Out": [y]}, {"scale": 1.0, "bias": 0.0,
                                             "bias_after_scale": True})
    b.op("fetch", {"X": [y]}, {"Out": ["fetch"]}, {"col": 0})
    (directory / "m.pdmodel").write_bytes(b.bytes())
    save_combined(directory / "m.pdiparams", {n: torch.ones(shape) for n in names})


def test_a_parameter_file_is_decoded_against_the_program_being_run(tmp_path, capsys):
    shutil.copy(PIR / "cnn.json", tmp_path / "m.json")
    _sibling_pdmodel(tmp_path, sp.persistable_names(PIR / "cnn.json"))
    status, _, err = _cli(capsys, "run", tmp_path / "m.json", "--startup",
                          tmp_path / "m.pdiparams", "--finetune", "cross_entropy", "--steps",
                          "1", "--places", "cpu:1", "--no-progress")
    assert status == 2, err
    assert "var 'conv2d_0.b_0' from parameter file " in err and "m.pdiparams has shape [1] " \
        "but the program declares [4]" in err
    # read alone (no program being run), two programs could own it: neither is guessed
    status, _, err = _cli(capsys, "convert", tmp_path / "m.pdiparams", tmp_path / "s.ssa")
    assert status == 2 and "m.pdmodel and m.json are both next to it" in err, err
    # a program that is not Paddle's cannot say which var each record is
    ours = save_program(se.load_program(tmp_path / "m.json"), tmp_path / "ours.json")
    status, _, err = _cli(capsys, "run", ours, "--startup", PIR / "cnn.pdiparams",
                          "--finetune", "cross_entropy", "--steps", "1", "--no-progress")
    assert status == 2 and "the program being run" in err and "is not one" in err, err


def test_a_parameter_record_of_another_dtype_is_refused():
    names = sp.persistable_names(PIR / "cnn.json")
    params = sp.load_params(PIR / "cnn.pdiparams", names)
    params["linear_0.b_0"] = params["linear_0.b_0"].to(torch.float64)
    data = b"".join(encode_record(params[n]) for n in names)
    with pytest.raises(ProgramError, match=r"var 'linear_0.b_0' from the parameter bytes has "
                                           r"dtype float64 but the program declares float32"):
        se.from_paddle(PIR / "cnn.json", params=data)


# --- checkpoints ----------------------------------------------------------------------------

def test_a_checkpoint_value_that_contradicts_its_declaration_is_refused(tmp_path):
    pytest.importorskip("safetensors")
    main, startup, loss = _bn_programs()
    scope = se.Scope()
    se.Executor().run(_one_element_mean(startup), scope=scope)
    path = tmp_path / "c.safetensors"
    save_checkpoint(path, scope, program=main)  # saves what the scope holds, as it is
    target = se.Scope()
    with pytest.raises(ProgramError, match=rf"var '{MEAN}' from checkpoint .*c\.safetensors has "
                                           r"shape \[1\] but the program declares \[3\]"):
        load_checkpoint(path, target, program=main)
    assert target.find_var(MEAN) is None  # nothing was written


# --- set_var and the scope --------------------------------------------------------------------

def test_set_var_and_scope_writes_are_checked_before_the_next_step():
    main, startup, loss = _bn_programs()
    with se.ParallelExecutor(se.cpu_places(2), main, startup, loss, scope=se.Scope()) as pe:
        pe.run([loss], feed=_feed())
        with pytest.raises(ProgramError, match=rf"var '{MEAN}' from set_var has shape \[1\] "
                                               r"but the program declares \[3\]"):
            pe.set_var(MEAN, torch.zeros(1))
        with pytest.raises(ProgramError, match=rf"var '{MEAN}' from set_var is on the meta"):
            pe.set_var(MEAN, torch.zeros(3, device="meta"))
        pe.local_scopes[1].set_var(MEAN, torch.zeros(1))
        with pytest.raises(ProgramError, match=rf"var '{MEAN}' from the scope .* has shape "
                                               r"\[1\] but the program declares \[3\]"):
            pe.run([loss], feed=_feed())
        pe.local_scopes[1].set_var(MEAN, torch.zeros(3, dtype=torch.float64))
        with pytest.raises(ProgramError, match="has dtype float64 but the program declares "
                                               "float32"):
            pe.run([loss], feed=_feed())
        pe.set_var(MEAN, torch.zeros(3))  # a fitting value: steps run again
        assert torch.isfinite(pe.run([loss], feed=_feed())[0])
    scope = se.Scope()
    se.Executor().run(startup, scope=scope)
    scope.set_var(MEAN, torch.zeros(3, device="meta"))
    with pytest.raises(ProgramError, match=rf"var '{MEAN}' from the scope .* is on meta but "
                                           r"the program reads it on cpu"):
        se.Executor().run(main, feed=_feed(), fetch_list=[loss], scope=scope)


def test_a_value_only_a_sub_block_reads_is_checked_too():
    from ssaexec.program.desc import BlockRef
    prog = se.Program()
    g = prog.global_block()
    g.create_var("x", [-1, 3], "float32", is_data=True)
    g.create_var("w", [3], "float32", persistable=True)  # read by the sub-block alone
    g.create_var("y", [-1, 3], "float32")
    g.append_op("scale", {"X": ["x"]}, {"Out": ["y"]}, {"scale": 1.0})
    sub = prog.create_block(parent_idx=0)
    sub.append_op("elementwise_mul", {"X": ["y"], "Y": ["w"]}, {"Out": ["y"]}, {"axis": -1})
    g.append_op("conditional_block", {"Input": ["y"]}, {"Out": ["y"]},
                {"sub_block": BlockRef(1)})
    prog.validate()
    scope = se.Scope()
    scope.set_var("w", torch.full((3,), 2.0))
    x = torch.ones(2, 3)
    y, = se.Executor().run(prog, feed={"x": x}, fetch_list=["y"], scope=scope)
    assert torch.equal(y, 2 * x)
    scope.set_var("w", torch.full((5,), 2.0))
    with pytest.raises(ProgramError, match=r"var 'w' from the scope .* has shape \[5\] but the "
                                           r"program declares \[3\]"):
        se.Executor().run(prog, feed={"x": x}, fetch_list=["y"], scope=scope)


def test_the_scope_is_checked_once_per_load_not_at_every_step():
    main, startup, loss = _bn_programs()
    scope = se.Scope()
    exe = se.Executor()
    exe.run(startup, scope=scope)
    exe.run(main, feed=_feed(), fetch_list=[loss], scope=scope)
    # written behind the stamp's back (the runtime's own path, Scope.vars): the next step
    # does not look again, so the kernel meets the value (and torch's own check refuses it)
    scope.vars["batch_norm_0.w_0"] = torch.ones(2)
    with pytest.raises(OpError, match="batch_norm"):
        exe.run(main, feed=_feed(), fetch_list=[loss], scope=scope)
    # the same value through Scope.set_var renews the stamp: checked before the step
    scope.set_var("batch_norm_0.w_0", torch.ones(2))
    with pytest.raises(ProgramError, match=r"'batch_norm_0.w_0' from the scope"):
        exe.run(main, feed=_feed(), fetch_list=[loss], scope=scope)


def test_meta_places_take_meta_values_as_their_own():
    main, startup, loss = _bn_programs()
    places = [MetaPlace(0), MetaPlace(1)]
    with se.ParallelExecutor(places, main, startup, loss, scope=se.Scope()) as pe:
        pe.run([], feed=_feed())
        pe.set_var(MEAN, torch.zeros(3))  # copied onto the places
        assert pe.local_scopes[1].find_var(MEAN).device.type == "meta"
        pe.run([], feed=_feed())


# --- the command line: exit 2, one clean line, never a signal -----------------------------------

def _small_resnet_with_one_element_statistics(tmp_path):
    import json
    doc = json.loads((EXAMPLES / "small_resnet.startup.json").read_text())
    block = doc["blocks"][0]
    for op in block["ops"]:
        if op["type"] == "fill_constant" and op["outputs"]["Out"][0].startswith("batch_norm"):
            op["attrs"]["shape"] = [1]
    for var in block["vars"]:
        if var["name"].startswith("batch_norm"):
            var["shape"] = [1]
    (tmp_path / "m.startup.json").write_text(json.dumps(doc))
    shutil.copy(EXAMPLES / "small_resnet.json", tmp_path / "m.json")
    return ["run", "m.json"], "'batch_norm_0.w_0' from the startup program"


def _legacy_pdmodel_with_a_misfit_startup(tmp_path):
    m = pm.cnn("sgd")
    (tmp_path / "m.pdmodel").write_bytes(m.main)
    (tmp_path / "s.pdprog").write_bytes(_legacy_startup_with_one_element_mean(m))
    return ["run", "m.pdmodel", "--startup", "s.pdprog"], f"'{MEAN}' from the startup program"


def _pir_program_with_a_sibling_pdmodel(tmp_path):
    shutil.copy(PIR / "cnn.json", tmp_path / "m.json")
    _sibling_pdmodel(tmp_path, sp.persistable_names(PIR / "cnn.json"))
    return (["run", "m.json", "--startup", "m.pdiparams", "--finetune", "cross_entropy"],
            "'conv2d_0.b_0' from parameter file m.pdiparams")


@pytest.mark.parametrize("case", [_small_resnet_with_one_element_statistics,
                                  _legacy_pdmodel_with_a_misfit_startup,
                                  _pir_program_with_a_sibling_pdmodel],
                         ids=["native-startup", "legacy-startup", "pir-params"])
def test_the_command_line_refuses_misfit_values_with_exit_2(case, tmp_path):
    argv, expected = case(tmp_path)
    env = dict(os.environ, MALLOC_CHECK_="3", PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", "ssaexec", *argv, "--steps", "1", "--places",
                           "cpu:1", "--batch", "4", "--no-progress"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)  # not -11 / -6 (a signal)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ssaexec: error: "), proc.stderr
    assert expected in lines[0] and "internal error" not in lines[0], lines[0]


# --- what steps write passes the same check (no false refusals) ----------------------------------

def _checked_at_every_step(main, startup, loss, feed, places, compiled, **strategy):
    build = se.BuildStrategy(**strategy.pop("build", {}))
    es = se.ExecutionStrategy(compiled=compiled, **strategy)
    with se.ParallelExecutor(places, main, startup, loss, scope=se.Scope(), exec_strategy=es,
                             build_strategy=build) as pe:
        for _ in range(2):
            pe.run([], feed=feed)
            for scope in pe.local_scopes:
                scope.touch()  # as if written: the next step checks every entering value
    scope = se.Scope()
    exe = se.Executor(compiled=compiled)
    exe.run(startup, scope=scope)
    for _ in range(2):
        exe.run(main, feed=feed, scope=scope)
        scope.touch()


def _mlp_case(k):
    from ssaexec.program.example_models import build_mlp
    from ssaexec.program import lr
    opt = [lambda: se.optimizer.SGD(lr.StepDecay(0.1, step_size=1)),
           lambda: se.optimizer.Momentum(lr.CosineAnnealing(0.1, T_max=4), momentum=0.9),
           lambda: se.optimizer.Adam(lr.LinearWarmup(0.1, warmup_steps=2, start_lr=0.0,
                                                     end_lr=0.1)),
           lambda: se.optimizer.AdamW(0.1, weight_decay=0.01)][k]()
    main, startup, loss = build_mlp(in_dim=6, hidden=(5,), optimizer=opt)
    strategy = [{}, {"amp": "fp16"}, {"build": {"gradient_accumulation_steps": 2}},
                {"build": {"zero_stage": 1}}][k]
    return main, startup, getattr(loss, "name", loss), 6, strategy


def _example_case(name):
    main = se.load_program(EXAMPLES / f"{name}.json")
    return main, se.load_program(EXAMPLES / f"{name}.startup.json"), "mean_0.tmp_0", 2, {}


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "readable"])
@pytest.mark.parametrize("case", ["sgd-step", "momentum-cosine-fp16", "adam-warmup-accumulate",
                                  "adamw-zero1", "small_resnet"])
def test_what_steps_write_fits_the_declarations_on_meta_places(case, compiled):
    # a value a kernel leaves on the host, or of another shape or dtype than declared,
    # would be refused at the next check: optimizers, LR schedules, AMP, gradient
    # accumulation, ZeRO and the batch-norm example, on meta places (a GPU's stand-in)
    from ssaexec.data.synthetic import synthetic_feed
    cases = ["sgd-step", "momentum-cosine-fp16", "adam-warmup-accumulate", "adamw-zero1"]
    main, startup, loss, batch, strategy = _mlp_case(cases.index(case)) if case in cases \
        else _example_case(case)
    _checked_at_every_step(main, startup, loss, synthetic_feed(main, batch),
                           [MetaPlace(0), MetaPlace(1)], compiled, **strategy)
