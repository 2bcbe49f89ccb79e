"""Paddle 3's PIR format (issue 35): ``model.json`` + ``model.pdiparams`` imported, run on 1
and 2 places against Paddle's own outputs, fine-tuned against Paddle's dygraph losses, written
back, and hostile files refused with one located line.

The fixtures under tests/fixtures/paddle/pir/ were written by PaddlePaddle 3.3.1
(``make_pir_fixtures.py``); nothing here needs Paddle, but
``test_paddle_loads_what_ssaexec_wrote`` runs where Paddle is importable or
``SSAEXEC_PADDLE_PYTHON`` names a Python that has it.
"""

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import ssaexec as se
from ssaexec import cli
from ssaexec.frontends import paddle as sp
from ssaexec.frontends.paddle.pir_reader import decode_pir, is_pir

REPO = Path(__file__).resolve().parents[3]
PIR = REPO / "tests" / "fixtures" / "paddle" / "pir"
MODELS = ("cnn", "encoder", "static_mlp", "heldout", "ops")


def _npz(path):
    with np.load(path) as data:
        return {k: torch.from_numpy(data[k]) for k in data.files}


def _model(name, params=None):
    return se.from_paddle(PIR / f"{name}.json", params=params or PIR / f"{name}.pdiparams")


def _infer(model, x, places=1, every=False):
    with se.ParallelExecutor(se.cpu_places(places), model.main, model.startup,
                             scope=se.Scope()) as pe:
        outs = pe.run(model.fetch, feed={model.feed[0]: x})
    return outs if every else outs[0]


# --- inference equals Paddle's ------------------------------------------------------------------

@pytest.mark.parametrize("places", [1, 2])
@pytest.mark.parametrize("name", MODELS)
def test_inference_equals_paddle(name, places):
    model = _model(name)
    x = next(iter(_npz(PIR / f"{name}.feed.npz").values()))
    want = _npz(PIR / f"{name}.out.npz")  # out, and out1 for a second output
    got = _infer(model, x, places, every=True)
    assert model.fetch == [f"fetch_name_{k}" for k in range(len(want))]
    for k, g in enumerate(got):
        torch.testing.assert_close(g, want["out" + (str(k) if k else "")], rtol=1e-5,
                                   atol=1e-5)


@pytest.mark.parametrize("version", [1, 2, 3])
def test_older_format_versions(version):
    # the CNN as Paddle 3.0, 3.1 and 3.2 write it (make_pir_old.py): versions 1 to 3
    name = f"cnn_v{version}"
    assert decode_pir((PIR / f"{name}.json").read_bytes(), name).version == version
    x = _npz(PIR / "cnn.feed.npz")["img"]
    want = _npz(PIR / f"{name}.out.npz")["out"]
    torch.testing.assert_close(_infer(_model(name), x), want, rtol=1e-5, atol=1e-5)


def test_dropout_reads_its_probability_and_mode():
    # heldout's Dropout(0.2) is upscale_in_train (identity at inference); the same program
    # with downgrade_in_infer scales by 1 - p at inference, as Paddle does
    doc = json.loads((PIR / "heldout.json").read_text())
    drop = next(o for o in _ops(doc) if o["#"] == "1.dropout")
    for a in drop["A"]:
        if a["N"] == "mode":
            a["AT"]["D"] = "downgrade_in_infer"
    pp = sp.read_program(json.dumps(doc).encode())
    main = sp.convert_program(pp).program
    scales = [op.attrs["scale"] for op in main.global_block().ops if op.type == "scale"]
    assert scales == [pytest.approx(0.8)]


def test_the_reader_knows_the_format():
    data = (PIR / "cnn.json").read_bytes()
    assert is_pir(data) and not is_pir((REPO / "examples" / "mnist_mlp.json").read_bytes())
    pir = decode_pir(data, "cnn.json")
    assert pir.version == 4
    names = [n for n, _ in pir.parameters()]
    params = json.loads((PIR / "cnn.params.json").read_text())
    assert names == params["json_order"]  # program order of the parameter ops
    # the .pdiparams records are the parameters sorted by name
    assert pir.persistable_names() == [p["name"] for p in params["params"]]
    assert sp.persistable_names(PIR / "cnn.json") == pir.persistable_names()
    versions = json.loads((PIR / "versions.json").read_text())
    assert set(versions["pir_version"].values()) == {4}


# --- fine-tuning against Paddle's dygraph training -------------------------------------------------

@pytest.mark.parametrize("places", [1, 2])
def test_finetune_cnn_gives_paddles_losses_and_weights(places, tmp_path):
    ref = json.loads((PIR / "cnn_train.losses.json").read_text())
    feed = _npz(PIR / "cnn_train.feed.npz")
    model = sp.finetune(_model("cnn"), loss="cross_entropy",
                        optimizer=se.optimizer.SGD(0.1))
    assert model.feed == ["img", "label"] and len(model.fetch) == 1
    with se.ParallelExecutor(se.cpu_places(places), model.main, model.startup,
                             scope=se.Scope(), loss_name=model.fetch[0]) as pe:
        losses = [float(pe.run(model.fetch, feed=feed)[0]) for _ in range(ref["steps"])]
        out = tmp_path / "trained.pdiparams"
        sp.save_params(out, pe, sp.persistable_names(PIR / "cnn.json"))
    assert losses == pytest.approx(ref["losses"], abs=1e-4)
    names = sp.persistable_names(PIR / "cnn.json")
    ours, paddle = sp.load_params(out, names), sp.load_params(
        PIR / "cnn_train.after.pdiparams", names)
    for n in names:
        torch.testing.assert_close(ours[n], paddle[n], rtol=1e-4, atol=1e-5)
    # the written file is what the program reads back: its outputs, Paddle's trained model's
    x = _npz(PIR / "cnn.feed.npz")["img"]
    torch.testing.assert_close(_infer(_model("cnn", out), x),
                               _infer(_model("cnn", PIR / "cnn_train.after.pdiparams"), x),
                               rtol=1e-4, atol=1e-5)


def test_finetune_refuses_what_it_cannot_do():
    model = _model("static_mlp")
    with pytest.raises(se.ProgramError, match="unknown loss 'hinge'"):
        sp.finetune(model, loss="hinge")
    with pytest.raises(se.ProgramError, match="output 'nope' is not a var"):
        sp.finetune(model, output="nope")
    trained = sp.finetune(model)
    with pytest.raises(se.ProgramError, match="already has a loss"):
        sp.finetune(trained)
    # a loss of one's own, built with the layers
    mse = sp.finetune(model, loss=lambda out, label: se.layers.mean(
        se.layers.square(se.layers.elementwise_sub(out, label))))
    assert mse.main.global_block().var("label").shape == [-1, 4]


def _paddle_python():
    if importlib.util.find_spec("paddle") is not None:
        return sys.executable
    return os.environ.get("SSAEXEC_PADDLE_PYTHON")


@pytest.mark.paddle
@pytest.mark.skipif(_paddle_python() is None, reason="needs Paddle (or SSAEXEC_PADDLE_PYTHON)")
def test_paddle_loads_what_ssaexec_wrote(tmp_path):
    feed = _npz(PIR / "cnn_train.feed.npz")
    model = sp.finetune(_model("cnn"), optimizer=se.optimizer.SGD(0.1))
    with se.ParallelExecutor(se.cpu_places(2), model.main, model.startup, scope=se.Scope(),
                             loss_name=model.fetch[0]) as pe:
        for _ in range(5):
            pe.run(model.fetch, feed=feed)
        sp.save_params(tmp_path / "t.pdiparams", pe, sp.persistable_names(PIR / "cnn.json"))
    x = _npz(PIR / "cnn.feed.npz")["img"]
    np.savez(tmp_path / "ours.npz", out=_infer(_model("cnn", tmp_path / "t.pdiparams"), x).numpy())
    r = subprocess.run([_paddle_python(), str(REPO / "tests/fixtures/paddle/check_pir_writeback.py"),
                        str(PIR / "cnn.json"), str(tmp_path / "t.pdiparams"),
                        str(PIR / "cnn.feed.npz"), str(tmp_path / "ours.npz")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "outputs equal ssaexec's" in r.stdout


@pytest.mark.paddle
@pytest.mark.skipif(_paddle_python() is None, reason="needs Paddle (or SSAEXEC_PADDLE_PYTHON)")
@pytest.mark.timeout(600)
def test_live_paddle_writes_the_committed_fixtures(tmp_path):
    # the fixture script, run again with the live Paddle: the same outputs and losses
    r = subprocess.run([_paddle_python(), str(REPO / "tests/fixtures/paddle/make_pir_fixtures.py"),
                        str(tmp_path)], capture_output=True, text=True, timeout=540)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    for name in MODELS:
        new, old = _npz(tmp_path / f"{name}.out.npz"), _npz(PIR / f"{name}.out.npz")
        for k in old:
            torch.testing.assert_close(new[k], old[k], rtol=1e-5, atol=1e-6)
        # and ssaexec on the new files gives the new outputs
        x = next(iter(_npz(tmp_path / f"{name}.feed.npz").values()))
        model = se.from_paddle(tmp_path / f"{name}.json", params=tmp_path / f"{name}.pdiparams")
        torch.testing.assert_close(_infer(model, x), new["out"], rtol=1e-5, atol=1e-5)
    losses = json.loads((tmp_path / "cnn_train.losses.json").read_text())["losses"]
    want = json.loads((PIR / "cnn_train.losses.json").read_text())["losses"]
    assert losses == pytest.approx(want, abs=1e-6)


# --- the command line ---------------------------------------------------------------------------

def _cli(capsys, *argv):
    status = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return status, out, err


def test_every_command_reads_a_pir_json(tmp_path, capsys):
    for name in ("json", "pdiparams", "feed.npz"):
        src = PIR / f"cnn.{name}"
        (tmp_path / f"cnn.{name}").write_bytes(src.read_bytes())
    prog = tmp_path / "cnn.json"
    status, out, _ = _cli(capsys, "dump", prog, "--places", "cpu:2")
    assert status == 0 and "conv2d" in out
    status, out, _ = _cli(capsys, "stats", prog)
    assert status == 0 and "op handles" in out
    status, _, _ = _cli(capsys, "viz", prog, "-o", tmp_path / "cnn.html")
    assert status == 0 and (tmp_path / "cnn.html").stat().st_size > 0
    status, _, _ = _cli(capsys, "convert", prog, tmp_path / "cnn.ssa")
    assert status == 0 and "conv2d" in (tmp_path / "cnn.ssa").read_text()
    status, _, _ = _cli(capsys, "convert", tmp_path / "cnn.pdiparams", tmp_path / "start.ssa")
    assert status == 0 and "assign_bytes" in (tmp_path / "start.ssa").read_text()
    # training an inference model: a label, a loss, SGD; Paddle's losses; Paddle's file
    shutil_feed = PIR / "cnn_train.feed.npz"
    status, out, err = _cli(capsys, "run", prog, "--startup", tmp_path / "cnn.pdiparams",
                            "--finetune", "cross_entropy", "--lr", "0.1", "--feed", shutil_feed,
                            "--steps", "5", "--places", "cpu:2", "--no-progress",
                            "--save", tmp_path / "trained.pdiparams")
    assert status == 0, err
    ref = json.loads((PIR / "cnn_train.losses.json").read_text())["losses"]
    got = [float(x) for x in re.findall(r"step +\d+/5 +loss ([0-9.]+)", out)]
    assert got == pytest.approx(ref, abs=1e-4), out
    assert (tmp_path / "trained.pdiparams").stat().st_size == \
        (PIR / "cnn.pdiparams").stat().st_size
    # an inference model without --finetune says how to train it
    status, _, err = _cli(capsys, "run", prog, "--steps", "1")
    assert status == 2 and "--finetune cross_entropy" in err


def test_our_own_json_programs_stay_ours():
    prog = se.load_program(REPO / "examples" / "mnist_mlp.json")
    assert prog.global_block().ops[0].type != "feed"
    assert se.load_program(PIR / "static_mlp.json").global_block().find_var("x") is not None


# --- hostile files ------------------------------------------------------------------------------

def _mutate(change):
    doc = json.loads((PIR / "static_mlp.json").read_text())
    change(doc)
    return json.dumps(doc)


def _ops(doc):
    return doc["program"]["regions"][0]["blocks"][0]["ops"]


def _first(doc, name):
    return next(o for o in _ops(doc) if o["#"] == name)


def _deep(n):
    x = [1]
    for _ in range(n):
        x = [x]
    return x


HOSTILE = {
    "huge dims": (lambda d: _first(d, "1.data")["O"][0]["TT"]["D"].__setitem__(
        1, [2 ** 40, 2 ** 40]), "more than one tensor may hold"),
    "unknown dialect": (lambda d: _first(d, "1.relu").__setitem__("#", "9.relu"),
                        'unknown dialect "9"'),
    "unknown op": (lambda d: _first(d, "1.relu").__setitem__("#", "1.frobnicate"),
                   "'pd_op.frobnicate' (x1, first at op"),
    "a cycle": (lambda d: _first(d, "1.relu")["I"].__setitem__(0, {"%": 99}),
                "uses value %99, which no earlier op defines"),
    "a value defined twice": (lambda d: _first(d, "1.relu")["O"][0].__setitem__("%", 1),
                              "value %1 is defined twice"),
    "deep nesting": (lambda d: _first(d, "1.relu").__setitem__("A", _deep(100)),
                     "deep (the limit max_nesting)"),
    "dims of the wrong type": (lambda d: _first(d, "1.data")["O"][0]["TT"]["D"].__setitem__(
        1, "big"), "dims must be a list, found string"),
    "operands of the wrong type": (lambda d: _first(d, "1.relu").__setitem__("I", {"%": 1}),
                                   "operands must be a list"),
    "an attribute of the wrong type": (lambda d: _first(d, "1.softmax")["A"][0]["AT"].__setitem__(
        "D", "minus one"), "a a_i32 attribute holds string"),
    "an unknown element type": (lambda d: _first(d, "1.data")["O"][0]["TT"]["D"].__setitem__(
        0, {"#": "0.t_f8"}), 'element type "0.t_f8" has no ssaexec dtype'),
    "a newer version": (lambda d: d["base_code"].__setitem__("version", 99),
                        "PIR format version 99 is not supported"),
    "control flow": (lambda d: _first(d, "1.relu").__setitem__("regions", [{"blocks": []}]),
                     "ops with regions (control flow) are not supported"),
    "a path in a parameter name": (lambda d: _first(d, "p")["A"].__setitem__(3, "../../etc"),
                                   "is not a plain name"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_json_is_a_clean_exit_2(case, tmp_path, capsys):
    change, message = HOSTILE[case]
    path = tmp_path / "bad.json"
    path.write_text(_mutate(change))
    assert is_pir(path.read_bytes())
    status, _, err = _cli(capsys, "dump", path)
    lines = err.strip().splitlines()
    assert status == 2 and len(lines) == 1, err
    assert message in err and "Traceback" not in err and "internal error" not in err
    assert str(path) in lines[0]


def test_hostile_files_from_python_name_the_spot():
    with pytest.raises(se.ProgramError, match=r"bad\.json:\d+:\d+: program\.regions\[0\]"
                                              r"\.blocks\[0\]\.ops\[\d+\]\.I\[0\]\[\"%\"\]"):
        decode_pir(_mutate(HOSTILE["a cycle"][0]), "bad.json")
    with pytest.raises(se.ProgramError, match="not a Paddle PIR program: magic"):
        decode_pir('{"base_code": {"magic": "xyz", "version": 4}, "program": {}}', "x.json")
    with pytest.raises(se.ProgramError, match="not UTF-8"):
        decode_pir(b'{"base_code": {"magic": "pir"\xff', "x.json")
    # parameters that do not fit the program: named
    with pytest.raises(se.ProgramError, match="params|stored with shape|runs past|record"):
        se.from_paddle(PIR / "static_mlp.json", params=PIR / "cnn.pdiparams")


def test_the_docs_list_the_pir_ops():
    from ssaexec.frontends.paddle.pir_convert import pir_table
    text = (REPO / "docs" / "paddle.md").read_text()
    assert pir_table() in text, "regenerate the table: pir_convert.pir_table()"
