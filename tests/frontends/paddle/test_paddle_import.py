"""Paddle programs and parameter files: reading, converting, training, writing back.

The programs come from tests/paddle_models.py, which writes them the way Paddle's
static graph does, with our own schema; no Paddle is needed. Numbers are checked
against the same networks in PyTorch. ``test_live_paddle`` compares with a real
PaddlePaddle where one is installed (marked ``paddle``, skipped otherwise).
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("google.protobuf")

import paddle_models as pm  # noqa: E402
import ssaexec as se  # noqa: E402
from ssaexec.frontends import paddle as sp  # noqa: E402
from ssaexec.frontends.paddle.params import encode_record, read_combined, save_combined  # noqa
from ssaexec.frontends.paddle.schema import messages  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent.parent.parent
LOCATED = re.compile(r"(byte \d+|block \d+|record \d+|var '|attribute)")


def _params_bytes(model):
    return b"".join(encode_record(torch.tensor(v)) for v in model.params.values())


def _losses_exe(model, xs, ys, steps):
    exe = se.Executor(se.CPUPlace())
    scope = se.Scope()
    exe.run(model.startup, scope=scope)
    feed = {model.feed[0]: xs, model.feed[1]: ys}
    return [exe.run(model.main, feed=feed, fetch_list=model.fetch, scope=scope)[0].item()
            for _ in range(steps)], scope


def _pe(model, places):
    return se.ParallelExecutor(places=se.cpu_places(places), main_program=model.main,
                               startup_program=model.startup, loss_name=model.fetch[0],
                               scope=se.Scope())


def _losses_pe(model, xs, ys, steps, places):
    pe = _pe(model, places)
    feed = {model.feed[0]: xs, model.feed[1]: ys}
    try:
        return [pe.run(fetch_list=model.fetch, feed=feed)[0].item() for _ in range(steps)], pe
    except BaseException:
        pe.close()
        raise


# --- the schema ---------------------------------------------------------------------------------

def test_schema_field_numbers_are_paddles():
    # the public numbers of Paddle's framework.proto, written out once more
    m = messages()
    expect = {
        "ProgramDesc": {"blocks": 1, "version": 4, "op_version_map": 5},
        "BlockDesc": {"idx": 1, "parent_idx": 2, "vars": 3, "ops": 4, "forward_block_idx": 5},
        "VarDesc": {"name": 1, "type": 2, "persistable": 3, "need_check_feed": 4,
                    "is_parameter": 5, "stop_gradient": 6},
        "OpDesc": {"inputs": 1, "outputs": 2, "type": 3, "attrs": 4, "is_target": 5},
        "OpDesc.Attr": {"name": 1, "type": 2, "i": 3, "f": 4, "s": 5, "ints": 6, "floats": 7,
                        "strings": 8, "b": 10, "bools": 11, "block_idx": 12, "l": 13,
                        "blocks_idx": 14, "longs": 15, "float64s": 16, "var_name": 17,
                        "vars_name": 18, "float64": 19, "scalar": 20, "scalars": 21},
        "VarType": {"type": 1, "selected_rows": 2, "lod_tensor": 3, "tensor_array": 4},
        "VarType.TensorDesc": {"data_type": 1, "dims": 2},
        "OpVersionMap.OpVersionPair": {"op_name": 1, "op_version": 2},
    }
    for message, fields in expect.items():
        desc = m.descriptor(message)
        assert {f.name: f.number for f in desc.fields if f.name in fields} == fields, message


@pytest.mark.slow
def test_reading_without_protobuf_says_how_to_install_it():
    code = ("import sys; sys.modules['google.protobuf'] = None\n"
            "import ssaexec as se\n"
            "try:\n    se.from_paddle(b'\\x0a\\x00')\n"
            "except se.ProgramError as e:\n    print('ERR', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert "ERR" in out.stdout and "ssaexec[paddle]" in out.stdout, out.stdout + out.stderr


# --- training programs --------------------------------------------------------------------------

@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "adam"])
@pytest.mark.parametrize("scalar_loss", [True, False], ids=["0d-loss", "1-elem-loss"])
def test_mlp_trains_like_torch(optimizer, scalar_loss):
    m = pm.mlp(optimizer, scalar_loss)
    model = se.from_paddle(m.main, params=_params_bytes(m))
    assert model.feed == ["x", "label"] and model.fetch == ["mean_0.tmp_0"]
    xs, ys = pm.feed_for(m, 8)
    ref, final = m.torch_steps(xs, ys, 5)
    got, scope = _losses_exe(model, xs, ys, 5)
    np.testing.assert_allclose(got, ref, rtol=1e-5)
    for name, value in final.items():
        torch.testing.assert_close(scope.find_var(name), value, rtol=1e-5, atol=1e-6)
    for places in (1, 2):
        got, pe = _losses_pe(model, xs, ys, 5, places)
        with pe:
            np.testing.assert_allclose(got, ref, rtol=1e-5)
            torch.testing.assert_close(pe.get_var("fc_0.w_0"), final["fc_0.w_0"], rtol=1e-5,
                                       atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("places", [1, 2])
def test_cnn_with_batch_norm_and_adam_trains_like_torch(places):
    m = pm.cnn("adam")
    model = se.from_paddle(m.main, params=_params_bytes(m))
    xs, ys = pm.feed_for(m, 8)
    ref, final = m.torch_steps(xs, ys, 5, places=places)
    got, pe = _losses_pe(model, xs, ys, 5, places)
    with pe:
        np.testing.assert_allclose(got, ref, rtol=2e-5)
        # Paddle's running variance: the biased batch variance (place 0's half of the batch).
        # (Not the running mean: the conv bias before batch norm gets a zero gradient, which
        # Adam turns into steps of size lr in the direction of rounding noise.)
        for name in ("batch_norm_0.w_2", "conv2d_0.w_0", "fc_0.w_0"):
            torch.testing.assert_close(pe.get_var(name), final[name], rtol=1e-4, atol=1e-5)
        # Paddle's beta-power accumulators: beta**(t+1) after t steps
        b1 = pe.get_var("conv2d_0.w_0_beta1_pow_acc_0")
        torch.testing.assert_close(b1, torch.tensor([0.9 ** 6]), rtol=1e-6, atol=0)


def test_cnn_on_the_sequential_executor():
    m = pm.cnn("momentum")
    model = se.from_paddle(m.main, params=_params_bytes(m))
    xs, ys = pm.feed_for(m, 6)
    ref, _ = m.torch_steps(xs, ys, 3)
    got, _ = _losses_exe(model, xs, ys, 3)
    np.testing.assert_allclose(got, ref, rtol=1e-5)


def test_roles_loss_seed_and_all_reduce_points():
    m = pm.mlp("momentum")
    main = se.from_paddle(m.main, params=_params_bytes(m)).main
    ops = main.global_block().ops
    seed = [op for op in ops if op.role == "loss"]
    assert [op.type for op in seed] == ["fill_constant"]
    assert seed[0].output("Out") == ["mean_0.tmp_0@GRAD"]
    pairs = {p: op.type for op in ops if op.role == "backward" for p, _ in op.role_var}
    assert pairs == {"fc_0.w_0": "mul_grad", "fc_0.b_0": "elementwise_add_grad",
                     "fc_1.w_0": "mul_grad", "fc_1.b_0": "elementwise_add_grad"}
    assert {op.type for op in ops if op.role == "optimize"} == {"momentum"}
    g = se.build_ssa_graph(main, se.cpu_places(2))
    g.lint()
    assert len(g.collectives) == 4


def test_startup_program_is_converted_when_no_params():
    m = pm.cnn("adam")
    model = se.from_paddle(m.main, startup=m.startup)
    scope = se.Scope()
    se.Executor(se.CPUPlace()).run(model.startup, scope=scope)
    # fill_constant initialisers keep Paddle's values
    torch.testing.assert_close(scope.find_var("batch_norm_0.w_2"), torch.ones(4))
    torch.testing.assert_close(scope.find_var("conv2d_0.w_0_beta1_pow_acc_0"),
                               torch.tensor([0.9]))
    xs, ys = pm.feed_for(m, 4)
    losses, _ = _losses_exe(model, xs, ys, 2)
    assert all(np.isfinite(losses))
    assert [op.type for op in model.startup.global_block().ops].count("uniform_random") == 2


def test_params_override_the_startup_values():
    m = pm.mlp("sgd")
    values = dict(m.params)
    model = se.from_paddle(m.main, params=_params_bytes(m), startup=m.startup)
    types = [op.type for op in model.startup.global_block().ops]
    assert set(types) == {"assign_bytes"} and len(types) == len(values)


def test_missing_initialisers_are_named():
    m = pm.mlp("sgd")
    with pytest.raises(se.ProgramError, match=r"nothing initialises 5 persistable vars "
                                              r"\('fc_0.w_0'"):
        se.from_paddle(m.main)


# --- inference models ---------------------------------------------------------------------------

def test_inference_model_matches_torch(tmp_path):
    m = pm.cnn_inference()
    (tmp_path / "model.pdmodel").write_bytes(m.main)
    save_combined(tmp_path / "model.pdiparams", {k: torch.tensor(v) for k, v in m.params.items()})
    model = se.from_paddle(tmp_path / "model.pdmodel", params=tmp_path / "model.pdiparams")
    assert model.feed == ["img"] and model.fetch == ["softmax_0.tmp_0"]
    assert not model.main.global_block().has_var("feed")
    xs, _ = pm.feed_for(m, 5)
    exe = se.Executor(se.CPUPlace())
    scope = se.Scope()
    exe.run(model.startup, scope=scope)
    out, = exe.run(model.main, feed={"img": xs}, fetch_list=model.fetch, scope=scope)
    torch.testing.assert_close(out, m.torch_forward(xs), rtol=1e-5, atol=1e-6)
    with se.ParallelExecutor(places=se.cpu_places(2), main_program=model.main,
                             startup_program=model.startup, scope=se.Scope()) as pe:
        out2, = pe.run(fetch_list=model.fetch, feed={"img": xs})
    torch.testing.assert_close(out2, m.torch_forward(xs), rtol=1e-5, atol=1e-6)


def test_persistable_names_are_sorted_and_skip_feed_fetch():
    m = pm.cnn_inference()
    names = sp.persistable_names(m.main)
    assert names == sorted(m.params) and "feed" not in names


# --- parameter files ----------------------------------------------------------------------------

def test_params_round_trip(tmp_path):
    values = {"b": torch.arange(6, dtype=torch.float32).reshape(2, 3),
              "a": torch.tensor([1, -2, 3], dtype=torch.int64),
              "c": torch.tensor(2.5, dtype=torch.float64), "d": torch.zeros(0, 4)}
    path = save_combined(tmp_path / "p.pdiparams", values)
    data = path.read_bytes()
    back = read_combined(data, sorted(values))
    for k, v in values.items():
        assert back[k].dtype == v.dtype
        torch.testing.assert_close(back[k], v)
    # rewriting gives the same bytes: the format is Paddle's, field for field
    assert save_combined(tmp_path / "q.pdiparams", back).read_bytes() == data
    # the documented layout: versions, no LoD, TensorDesc size, desc, raw data
    first = encode_record(values["a"])
    assert first[:16] == bytes(16)  # LoDTensor version, 0 LoD levels, tensor version
    size = int.from_bytes(first[16:20], "little")
    assert first[20:20 + size] == b"\x08\x03\x10\x03"  # data_type INT64, dims [3]
    assert first[-24:] == values["a"].numpy().tobytes()
    sp.save_params(tmp_path / "dir", values, sorted(values), combined=False)
    assert sorted(p.name for p in (tmp_path / "dir").iterdir()) == sorted(values)
    got = sp.load_params(tmp_path / "dir", sorted(values))
    for k, v in values.items():
        torch.testing.assert_close(got[k], v)


def test_trained_values_are_written_back_for_paddle(tmp_path):
    m = pm.mlp("momentum")
    model = se.from_paddle(m.main, params=_params_bytes(m))
    xs, ys = pm.feed_for(m, 8)
    names = sp.persistable_names(m.main)
    _, pe = _losses_pe(model, xs, ys, 3, 2)
    with pe:
        path = sp.save_params(tmp_path / "trained.pdiparams", pe, names)
        back = sp.load_params(path, names)
        for n in names:
            torch.testing.assert_close(back[n], pe.get_var(n).reshape(back[n].shape))
    # and the saved file initialises a fresh import, which goes on from there
    again = se.from_paddle(m.main, params=path)
    losses, _ = _losses_exe(again, xs, ys, 1)
    assert losses[0] < _losses_exe(model, xs, ys, 1)[0][0]


def test_parameter_directory_import(tmp_path):
    m = pm.mlp("sgd")
    sp.save_params(tmp_path / "persistables", {k: torch.tensor(v) for k, v in m.params.items()},
                   list(m.params), combined=False)
    model = se.from_paddle(m.main, params=tmp_path / "persistables")
    xs, ys = pm.feed_for(m, 8)
    ref, _ = m.torch_steps(xs, ys, 2)
    np.testing.assert_allclose(_losses_exe(model, xs, ys, 2)[0], ref, rtol=1e-5)


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d[:-3], r"record 4 \(learning_rate_0\): byte \d+: float32\[1\] needs 4 bytes"),
    (lambda d: d + b"\x00", r"1 bytes are left after"),
    (lambda d: b"\x07" + d[1:], r"record 0 \(fc_0.b_0\): byte 0: LoDTensor version 7"),
    (lambda d: d[:16] + b"\xff\xff\xff\x7f" + d[20:], r"record 0 .*: byte 16: tensor "
                                                       r"description size 2147483647"),
    (lambda d: d[:12] + b"\x01" + d[13:], r"record 0 .*: byte 12: tensor version 1"),
    (lambda d: d[:4] + b"\xff" * 8 + d[12:], r"LoD levels cannot fit"),
    (lambda d: d[:150], r"record 1 \(fc_0.w_0\): byte 114: float32\[8, 16\] needs 512"),
    (lambda d: d[:len(encode_record(torch.zeros(16)))],
     r"holds 1 tensors, but the program has 5 persistable vars \(the next is 'fc_0.w_0'\)"),
])
def test_malformed_parameter_files_are_located(mutate, message):
    m = pm.mlp("sgd")
    data = _params_bytes(m)
    with pytest.raises(se.ProgramError, match=message):
        se.from_paddle(m.main, params=mutate(data))


def test_parameter_directory_names_cannot_leave_it(tmp_path):
    (tmp_path / "secret").write_bytes(encode_record(torch.ones(2)))
    (tmp_path / "params").mkdir()
    with pytest.raises(se.ProgramError, match=r"var name '../secret' cannot be a file name"):
        sp.load_params(tmp_path / "params", ["../secret"])


def test_stored_shape_must_match_the_program():
    m = pm.mlp("sgd")
    params = dict(m.params)
    params["fc_0.w_0"] = np.zeros((3, 3), np.float32)
    data = b"".join(encode_record(torch.tensor(v)) for v in params.values())
    with pytest.raises(se.ProgramError, match=r"'fc_0.w_0' from the parameter bytes has shape "
                                              r"\[3, 3\] but the program declares \[8, 16\]"):
        se.from_paddle(m.main, params=data)


# --- what is not supported ----------------------------------------------------------------------

def _with_ops(*types):
    b = pm.ProgramBuilder()
    b.var("x", [-1, 4], need_check_feed=True)
    for k, t in enumerate(types):
        b.var(f"y{k}", [-1, 4])
        b.op(t, {"X": ["x"]}, {"Out": [f"y{k}"]})
    return b.bytes()


def test_unsupported_ops_are_listed_in_one_line():
    data = _with_ops("relu", "lstm", "while", "lstm", "relu")
    with pytest.raises(se.ProgramError) as e:
        se.from_paddle(data)
    text = str(e.value)
    assert "\n" not in text
    assert "3 ops of 2 types are not supported: 'lstm' (x2, first at op 1), 'while' (x1, " \
           "first at op 2)" in text


@pytest.mark.parametrize("op, attrs, message", [
    ("conv2d", {"data_format": "NHWC"}, r"data_format='NHWC' is not supported"),
    ("conv2d", {"paddings": [0, 1, 0, 0]}, r"asymmetric paddings"),
    ("softmax_with_cross_entropy", {"use_softmax": False}, r"use_softmax=False"),
    ("pool2d", {"adaptive": True, "ksize": [3, 3]}, r"adaptive pooling"),
    ("lookup_table_v2", {"padding_idx": ("long", 0)}, r"padding_idx is not supported"),
])
def test_unsupported_attributes_name_the_op(op, attrs, message):
    b = pm.ProgramBuilder()
    b.var("x", [-1, 2, 4, 4], need_check_feed=True)
    b.var("w", [2, 2, 3, 3], persistable=True)
    b.var("ids", [-1, 1], pm.INT64, need_check_feed=True)
    b.var("label", [-1, 1], pm.INT64, need_check_feed=True)
    b.var("o", [-1, 2, 4, 4])
    b.var("o2", [-1, 2, 4, 4])
    slots = {"conv2d": ({"Input": ["x"], "Filter": ["w"]}, {"Output": ["o"]}),
             "softmax_with_cross_entropy": ({"Logits": ["x"], "Label": ["label"]},
                                            {"Softmax": ["o"], "Loss": ["o2"]}),
             "pool2d": ({"X": ["x"]}, {"Out": ["o"]}),
             "lookup_table_v2": ({"W": ["w"], "Ids": ["ids"]}, {"Out": ["o"]})}[op]
    b.op(op, *slots, attrs=attrs)
    with pytest.raises(se.ProgramError, match=r"block 0, op 0 \(" + op + r"\): " + message):
        se.from_paddle(b.bytes(), validate=False)


# --- malformed programs -------------------------------------------------------------------------

def _cases():
    good = pm.mlp("momentum").main
    yield "truncated", good[: len(good) // 2]
    yield "truncated-tail", good[:-1]
    # field 1 (blocks) with wire type 0 instead of 2: skipped, so there are no blocks
    yield "wrong-wire-type", b"\x08\x05" + good[:0]
    # a block whose length runs far past the end
    yield "huge-length", b"\x0a\xff\xff\xff\xff\x0f" + good[6:40]
    yield "huge-varint", b"\x0a" + b"\xff" * 11
    yield "wire-type-7", b"\x0f\x00"
    yield "field-zero", b"\x00\x00"
    yield "end-group", b"\x0c"
    yield "empty", b""
    yield "not-protobuf", b"PK\x03\x04 this is a zip file"
    m = messages()

    def prog(edit):
        p = m.ProgramDesc()
        p.ParseFromString(good)
        edit(p)
        return p.SerializeToString()

    yield "bad-utf8-name", prog(lambda p: setattr(p.blocks[0].vars[0], "name",
                                                  "\udcff".encode("utf-8", "surrogatepass")
                                                  .decode("latin-1")))
    yield "no-var-type", prog(lambda p: p.blocks[0].vars[0].ClearField("type"))
    yield "no-op-type", prog(lambda p: p.blocks[0].ops[0].ClearField("type"))
    yield "attr-type-99", prog(lambda p: setattr(p.blocks[0].ops[0].attrs[0], "type", 99))
    yield "bad-parent", prog(lambda p: setattr(p.blocks[0], "parent_idx", 3))
    yield "bad-block-ref", prog(lambda p: (setattr(p.blocks[0].ops[0].attrs[0], "type", 8),
                                           setattr(p.blocks[0].ops[0].attrs[0], "block_idx", 7)))
    yield "huge-shape", prog(lambda p: p.blocks[0].vars[0].type.lod_tensor.tensor.dims.extend(
        [1 << 40, 1 << 40]))
    yield "undeclared-var", prog(lambda p: setattr(p.blocks[0].ops[0].inputs[0], "arguments",
                                                   ["nowhere"]) if False else
                                 p.blocks[0].ops[0].inputs[0].arguments.append("nowhere"))
    yield "dup-var", prog(lambda p: p.blocks[0].vars.add().CopyFrom(p.blocks[0].vars[0]))
    yield "attr-wrong-kind", prog(lambda p: [
        (setattr(a, "type", 2), setattr(a, "s", "wide")) for o in p.blocks[0].ops
        for a in o.attrs if a.name == "x_num_col_dims"])


@pytest.mark.parametrize("name, data", list(_cases()), ids=[c[0] for c in _cases()])
def test_malformed_programs_are_located_program_errors(name, data):
    with pytest.raises(se.ProgramError) as e:
        se.from_paddle(data)
    text = str(e.value)
    assert text.startswith("<Paddle program bytes>: "), text
    assert "\n" not in text
    if name not in ("empty", "wrong-wire-type"):
        assert LOCATED.search(text), text


def test_byte_offsets_point_at_the_problem():
    with pytest.raises(se.ProgramError, match=r"byte 0 \(blocks\[0\]\): length 4294967295 "
                                              r"runs past the end"):
        se.from_paddle(b"\x0a\xff\xff\xff\xff\x0f\x00")
    # block 0 holds 4 bytes: a var (field 3) claiming 5 bytes, of which 2 are there
    with pytest.raises(se.ProgramError, match=r"byte 2 \(blocks\[0\]\.vars\[0\]\): length 5 "
                                              r"runs past the end of its enclosing message "
                                              r"\(2 bytes left\)"):
        se.from_paddle(b"\x0a\x04\x1a\x05ab")
    with pytest.raises(se.ProgramError, match=r"byte 4 \(blocks\[0\]\.ops\[0\]\.inputs\[0\]\): wire type "
                                              r"7 does not exist \(field 1\)"):
        se.from_paddle(b"\x0a\x04\x22\x02\x0f\x00")


def test_random_damage_is_always_a_program_error():
    good = pm.cnn("adam").main
    rng = np.random.default_rng(7)
    outcomes = {"ok": 0, "error": 0}
    for _ in range(150):
        data = bytearray(good)
        for _ in range(int(rng.integers(1, 4))):
            kind = rng.integers(0, 3)
            at = int(rng.integers(0, len(data)))
            if kind == 0:
                data[at] = int(rng.integers(0, 256))
            elif kind == 1:
                del data[at: at + int(rng.integers(1, 20))]
            else:
                data[at:at] = bytes(rng.integers(0, 256, int(rng.integers(1, 8))).tolist())
        try:
            se.from_paddle(bytes(data), startup=None, params=None)
        except se.ProgramError:
            outcomes["error"] += 1
        else:
            outcomes["ok"] += 1  # pragma: no cover - damage that misses every checked field
    assert outcomes["error"] > 100


# --- the command line ---------------------------------------------------------------------------

def _cli(*args):
    import contextlib
    import io
    from ssaexec import cli
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = cli.main([str(a) for a in args])
    return status, out.getvalue(), err.getvalue()


@pytest.fixture
def paddle_files(tmp_path):
    m = pm.cnn_inference()
    (tmp_path / "model.pdmodel").write_bytes(m.main)
    save_combined(tmp_path / "model.pdiparams", {k: torch.tensor(v) for k, v in m.params.items()})
    t = pm.mlp("momentum")
    (tmp_path / "train.pdprog").write_bytes(t.main)
    save_combined(tmp_path / "train.pdiparams", {k: torch.tensor(v) for k, v in t.params.items()})
    return tmp_path


def test_cli_dump_viz_convert_and_run_take_paddle_files(paddle_files):
    d = paddle_files
    status, out, _ = _cli("dump", d / "model.pdmodel", "--places", "cpu:2")
    assert status == 0 and "conv2d#0@cpu:1" in out
    status, out, err = _cli("viz", d / "train.pdprog", "-o", d / "g.dot")
    assert status == 0, err
    assert (d / "g.dot").read_text().count("all_reduce") >= 4
    assert _cli("convert", d / "model.pdmodel", d / "model.ssa")[0] == 0
    assert _cli("convert", d / "model.pdiparams", d / "model.startup.json")[0] == 0
    main, start = se.load_program(d / "model.ssa"), se.load_program(d / "model.startup.json")
    assert main == sp.convert_program(sp.read_program(d / "model.pdmodel")).program
    assert {op.type for op in start.global_block().ops} == {"assign_bytes"}
    status, out, err = _cli("run", d / "train.pdprog", "--startup", d / "train.pdiparams",
                            "--places", "cpu:2", "--steps", "2", "--batch", "8")
    assert status == 0, err
    assert "loss" in out


def test_cli_errors_are_one_line(paddle_files):
    d = paddle_files
    (d / "bad.pdmodel").write_bytes((d / "model.pdmodel").read_bytes()[:50])
    (d / "lstm.pdmodel").write_bytes(_with_ops("lstm", "relu"))
    (d / "alone.pdiparams").write_bytes(b"")
    for name, message in (("bad.pdmodel", r"bad.pdmodel: byte 0 \(blocks\[0\]\): length"),
                          ("lstm.pdmodel", r"1 ops of 1 types are not supported: 'lstm'"),
                          ("alone.pdiparams", r"read with its program, alone.pdmodel")):
        status, _, err = _cli("dump", d / name)
        assert status == 2 and len(err.strip().splitlines()) == 1, err
        assert re.search(message, err), err
    status, _, err = _cli("convert", d / "model.ssa", d / "x.pdmodel")
    assert status == 2


# --- docs ---------------------------------------------------------------------------------------

def test_docs_table_lists_every_mapped_op():
    text = (ROOT / "docs" / "paddle.md").read_text(encoding="utf-8")
    assert sp.mapping_table() in text, "regenerate the table: sp.mapping_table()"


# --- fixtures written by Paddle -----------------------------------------------------------------

FIXTURES = ROOT / "tests" / "fixtures" / "paddle"


def _check_fixtures():
    sys.path.insert(0, str(FIXTURES))
    try:
        import check_fixtures
    finally:
        sys.path.pop(0)
    return check_fixtures


@pytest.mark.slow
def test_committed_fixtures():
    data = FIXTURES / "data"
    if not (data / "cnn.losses.json").is_file():
        pytest.skip("no Paddle-written fixtures committed: run "
                    "tests/fixtures/paddle/make_fixtures.py where paddlepaddle is installed")
    _check_fixtures().check_all(data)
    for name in ("cnn_infer.pdmodel", "cnn.main.pdprog"):
        status, out, err = _cli("dump", data / name, "--places", "cpu:2")
        assert status == 0 and "conv2d" in out, err


# --- a live Paddle ------------------------------------------------------------------------------

@pytest.mark.paddle
@pytest.mark.slow
def test_live_paddle(tmp_path):
    pytest.importorskip("paddle", reason="PaddlePaddle is not installed")
    script = FIXTURES / "make_fixtures.py"
    out = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True,
                         text=True, timeout=600, env={**os.environ, "FLAGS_enable_pir_api": "0"})
    assert out.returncode == 0, out.stderr[-3000:]
    _check_fixtures().check_all(tmp_path, live=True)


def test_clone_for_test_gives_paddles_inference():
    m = pm.cnn("momentum")
    model = se.from_paddle(m.main, params=_params_bytes(m))
    xs, ys = pm.feed_for(m, 8)
    _, pe = _losses_pe(model, xs, ys, 2, 1)
    test = model.main.clone(for_test=True)
    assert [op.type for op in test.global_block().ops] == [
        "conv2d", "elementwise_add", "batch_norm", "relu", "pool2d", "mul", "elementwise_add",
        "softmax_with_cross_entropy", "reduce_mean"]
    with pe, se.ParallelExecutor(se.cpu_places(1), test, share_vars_from=pe) as tpe:
        before = pe.get_var("batch_norm_0.w_2").clone()
        logits_name = test.global_block().ops[6].output("Out")[0]
        out, = tpe.run([logits_name], feed={"img": xs, "label": ys})
        w = {k: pe.get_var(k) for k in ("conv2d_0.w_0", "conv2d_0.b_0", "batch_norm_0.w_0",
                                        "batch_norm_0.b_0", "fc_0.w_0", "fc_0.b_0")}
        stats = (pe.get_var("batch_norm_0.w_1"), before)
        expect, _ = pm._torch_cnn(w, torch.tensor(xs), stats, training=False)
        torch.testing.assert_close(out, expect, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(pe.get_var("batch_norm_0.w_2"), before)  # not updated


def test_clone_for_test_of_downgrade_dropout_scales():
    b = pm.ProgramBuilder()
    b.var("x", [-1, 4], need_check_feed=True)
    b.var("y", [-1, 4])
    b.var("mask", [-1, 4], dtype=20)
    b.op("dropout", {"X": ["x"]}, {"Out": ["y"], "Mask": ["mask"]},
         {"dropout_prob": 0.25, "is_test": False, "fix_seed": True, "seed": 3,
          "dropout_implementation": "downgrade_in_infer"})
    main = sp.convert_program(sp.decode_program(b.bytes())).program
    x = torch.randn(6, 4)
    exe = se.Executor(se.CPUPlace())
    y, mask = exe.run(main, feed={"x": x}, fetch_list=["y", "mask"], scope=se.Scope())
    torch.testing.assert_close(y, x * mask.float())  # no rescaling in training
    test = main.clone(for_test=True)
    assert [op.type for op in test.global_block().ops] == ["scale"]
    y, = exe.run(test, feed={"x": x}, fetch_list=["y"], scope=se.Scope())
    torch.testing.assert_close(y, x * 0.75)


@pytest.mark.parametrize("op, attrs, expect", [
    ("conv2d", {"padding_algorithm": "SAME", "paddings": [0, 0]},
     lambda x, w: torch.nn.functional.conv2d(x, w, padding=1)),
    ("conv2d", {"padding_algorithm": "VALID", "paddings": [3, 3]},
     lambda x, w: torch.nn.functional.conv2d(x, w)),
    ("conv2d", {"paddings": [1, 1, 2, 2], "strides": [2, 2]},
     lambda x, w: torch.nn.functional.conv2d(x, w, stride=2, padding=(1, 2))),
    ("depthwise_conv2d", {"groups": 2, "paddings": [1, 1]},
     lambda x, w: torch.nn.functional.conv2d(x, w[:, :1], padding=1, groups=2)),
    ("pool2d", {"pooling_type": "avg", "adaptive": True, "ksize": [1, 1]},
     lambda x, w: x.mean(dim=(2, 3), keepdim=True)),
    ("pool2d", {"pooling_type": "max", "ksize": [3, 3], "strides": [2, 2],
                "paddings": [1, 1, 1, 1]},
     lambda x, w: torch.nn.functional.max_pool2d(x, 3, 2, 1)),
])
def test_padding_conventions(op, attrs, expect):
    b = pm.ProgramBuilder()
    b.var("x", [-1, 2, 5, 5], need_check_feed=True)
    w_shape = [2, 1, 3, 3] if op == "depthwise_conv2d" else [2, 2, 3, 3]
    b.var("w", w_shape, persistable=True)
    b.var("o", [-1, 2, -1, -1])
    if op == "pool2d":
        b.op(op, {"X": ["x"]}, {"Out": ["o"]}, attrs)
    else:
        b.op(op, {"Input": ["x"], "Filter": ["w"]}, {"Output": ["o"]}, attrs)
    main = sp.convert_program(sp.decode_program(b.bytes()), validate=False).program
    x, w = torch.randn(3, 2, 5, 5), torch.randn(*w_shape)
    scope = se.Scope()
    scope.set_var("w", w)
    out, = se.Executor(se.CPUPlace()).run(main, feed={"x": x}, fetch_list=["o"], scope=scope)
    ref_w = w if op != "depthwise_conv2d" else torch.cat([w, w], 1)
    torch.testing.assert_close(out, expect(x, ref_w))
