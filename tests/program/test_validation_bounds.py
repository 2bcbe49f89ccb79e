"""Validation is linear in the file (issue 46, class 3): ranks and counts are capped first.

A 12.8 KB file with one var of rank 2000 cost 240 s in validation (torch's elementwise
meta kernels are cubic in the rank), a 562-byte ``split`` with ``num=2**21`` 66 s and
3.5 GB, and the same through a PIR parameter or ``split_with_num``. Now every shape is
capped at ``max_rank`` where it is read (``ssaexec.core.limits``), every per-dimension
attribute list too (``ssaexec.program.bounds``), and a count attribute must match the
outputs the op names before any kernel runs. These tests count torch kernel calls
(every ATen call, meta ones included, through a dispatch mode), never seconds: a bomb
is refused after none, and the work of validation grows with the file, not faster.
"""

import json
from pathlib import Path

import pytest
from torch.utils._python_dispatch import TorchDispatchMode

import ssaexec as se
import ssaexec.core.limits
from ssaexec import cli
from ssaexec.frontends.paddle import read_program_bytes
from ssaexec.frontends.paddle.convert import convert_program
from ssaexec.core.limits import DEFAULTS, get_limit, limits
from ssaexec.program.bounds import count_problem, rank_attr_problem
from ssaexec.program.serialize import from_json
from ssaexec.program.text import program_from_text

ROOT = Path(__file__).resolve().parents[2]
PIR = ROOT / "tests" / "fixtures" / "paddle" / "pir"


class KernelCalls(TorchDispatchMode):
    """Counts every ATen call made inside it (meta-tensor inference included)."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls += 1
        return func(*args, **(kwargs or {}))


def _load_and_validate(text, suffix):
    """(kernel calls, the ProgramError or None) of reading and validating ``text``."""
    with KernelCalls() as counter:
        try:
            if suffix == ".json" and '"magic"' in text[:200]:
                convert_program(read_program_bytes(text.encode(), "bomb.json"))
            elif suffix == ".json":
                from_json(text, "bomb.json").validate()
            else:
                program_from_text(text, "bomb.ssa").validate()
        except se.ProgramError as e:
            return counter.calls, e
    return counter.calls, None


# --- native programs --------------------------------------------------------------------------

def _var(name, shape, data=False):
    return {"name": name, "shape": shape, "dtype": "float32", "persistable": False,
            "is_parameter": False, "stop_gradient": True, "is_data": data}


def _op(type, inputs, outputs, attrs):
    return {"type": type, "inputs": inputs, "outputs": outputs, "attrs": attrs,
            "role": "forward", "role_var": []}


def _program(vars, ops):
    return json.dumps({"schema": "ssaexec.program", "version": 1, "random_seed": 0,
                       "name_counts": {}, "blocks": [{"idx": 0, "parent_idx": -1,
                                                       "vars": vars, "ops": ops}]})


def _rank_bomb(rank):
    # issue 46: two rank-`rank` vars and one elementwise_add (5 on one axis: the slow path)
    shape = [5] + [1] * (rank - 1)
    return _program([_var("x", shape, True), _var("y", shape, True), _var("z", shape)],
                    [_op("elementwise_add", {"X": ["x"], "Y": ["y"]}, {"Out": ["z"]}, {})])


def _split(num, rows=2 ** 21, outs=2):
    names = [f"o{k}" for k in range(outs)]
    return _program([_var("x", [rows], True)] + [_var(n, [rows // max(outs, 1)]) for n in names],
                    [_op("split", {"X": ["x"]}, {"Out": names}, {"num": num, "axis": 0})])


def test_max_rank_is_a_limit_like_the_others(monkeypatch):
    assert DEFAULTS["max_rank"] == 64 and get_limit("max_rank") >= 1
    monkeypatch.setenv("SSAEXEC_MAX_RANK", "128")
    assert ssaexec.core.limits._from_env()["max_rank"] == 128


def test_a_rank_over_the_cap_is_refused_before_any_kernel_runs():
    calls, err = _load_and_validate(_rank_bomb(2000), ".json")
    assert err is not None and calls == 0
    assert "has 2000 dimensions" in str(err) and "max_rank=64" in str(err)
    assert "bomb.json:1:" in str(err) and "blocks[0].vars[0].shape" in str(err)
    # the text form, the same
    text = ("ssaexec-program v1 random_seed=0\n\nblock 0 parent=-1 {\n"
            f"  var x : float32[{', '.join(['1'] * 65)}] data\n}}\n")
    calls, err = _load_and_validate(text, ".ssa")
    assert err is not None and calls == 0 and "65 dimensions" in str(err)
    # at the cap it validates, with a handful of kernel calls (none once elementwise_add's
    # shape rule has its dtypes cached)
    calls, err = _load_and_validate(_rank_bomb(64), ".json")
    assert err is None and calls < 50


def test_a_program_built_in_python_is_capped_by_validation():
    main = se.Program()
    block = main.global_block()
    block.create_var("x", [1] * 70, "float32", is_data=True)
    with pytest.raises(se.ProgramError, match="70 dimensions, more than a tensor may have"):
        main.validate()
    with limits(max_rank=80):
        main.validate()


@pytest.mark.parametrize("attr, value, message", [
    ("shape", [1] * 65, "attribute 'shape'"),
    ("axis", list(range(65)), "attribute 'axis'"),
])
def test_a_per_dimension_attribute_over_the_cap_is_refused_when_read(attr, value, message):
    op_type = "reshape" if attr == "shape" else "transpose"
    text = _program([_var("x", [1], True), _var("y", [1])],
                    [_op(op_type, {"X": ["x"]}, {"Out": ["y"]}, {attr: value})])
    calls, err = _load_and_validate(text, ".json")
    assert err is not None and calls == 0
    assert message in str(err) and "max_rank" in str(err) and f"attrs.{attr}" in str(err)


def test_the_rank_rule_reads_per_dimension_lists_only():
    assert rank_attr_problem({"shape": [1] * 64, "values": [0.0] * 10000}) is None
    assert rank_attr_problem({"sections": [1] * 1000, "tensors": ["X[0]"] * 100}) is None
    assert rank_attr_problem({"paddings": [0] * 128}) is None  # two per dimension
    name, message = rank_attr_problem({"paddings": [0] * 130})
    assert name == "paddings" and "65 dimensions" in message
    name, _ = rank_attr_problem({"shapes": [[1, 2], [1] * 65]})
    assert name == "shapes"


@pytest.mark.parametrize("op_type, attrs, shape, outs, message", [
    ("split", {"num": 2 ** 21, "axis": 0}, [2 ** 21], 2, "produces 2097152 (num=2097152)"),
    ("split", {"num": 2 ** 31, "axis": 0}, [-1], 2, "produces 2147483648 (num=2147483648)"),
    ("split", {"num": 3, "axis": 0}, [2], 3, "larger than the size 2 of axis 0"),
    ("split", {"num": 0, "axis": 0}, [4], 2, "split needs num >= 1"),
    ("split", {"sections": [1, 1, 1], "axis": 0}, [3], 2,
     "lists 2 vars ['o0', 'o1'] but the op produces 3 (3 sections)"),
    ("aten.unbind.int", {"self": "X[0]", "dim": 0}, [2 ** 21], 2, "unbinding a dimension of "
                                                                   "size 2097152"),
    ("aten.split.Tensor", {"self": "X[0]", "split_size": 1}, [2 ** 21], 2, "split_size=1"),
    ("aten.split_with_sizes.default", {"self": "X[0]", "split_sizes": [1] * 5}, [5], 2,
     "produces 5 (5 split_sizes)"),
])
def test_a_count_over_its_outputs_is_refused_before_inference(op_type, attrs, shape, outs,
                                                              message):
    names = [f"o{k}" for k in range(outs)]
    text = _program([_var("x", shape, True)] + [_var(n, None) for n in names],
                    [_op(op_type, {"X": ["x"]}, {"Out": names}, attrs)])
    calls, err = _load_and_validate(text, ".json")
    assert err is not None and calls == 0, err
    assert message in str(err) and "block 0, op 0" in str(err) and "bomb.json:" in str(err)
    assert "hint:" in str(err)


def test_a_count_bomb_in_the_text_form_is_refused_before_inference():
    text = ("ssaexec-program v1 random_seed=0\n\nblock 0 parent=-1 {\n"
            "  var x : float32[2097152] data\n  var a : float32[1]\n  var b : float32[1]\n"
            "  {Out=[a, b]} = split(X=x) {num=2097152, axis=0}\n}\n")
    calls, err = _load_and_validate(text, ".ssa")
    assert err is not None and calls == 0, err
    assert "(split) at bomb.ssa:7:3: " in str(err) and "produces 2097152 (num=2097152)" in str(err)


def test_counts_that_fit_still_validate():
    names = ["a", "b", "c", "d"]
    text = _program([_var("x", [8, 3], True)] + [_var(n, [2, 3]) for n in names],
                    [_op("split", {"X": ["x"]}, {"Out": names}, {"num": 4, "axis": 0})])
    calls, err = _load_and_validate(text, ".json")
    assert err is None and calls > 0
    assert count_problem("aten.split.Tensor", {"self": "X[0]", "split_size": 3}, {"X": [[8]]},
                         {"Out": ["a", "b", "c"]}) is None
    assert count_problem("aten.unbind.int", {"self": "X[0]"}, {"X": [[-1, 4]]},
                         {"Out": ["a"]}) is None  # unknown size: probed as 5 and 7


def test_validation_work_grows_with_the_file_not_faster():
    # kernel calls per byte stay flat from 10 to 1,000 outputs of one split, and from 10 to
    # 400 distinct transposes (no cache hit: each has its own shape)
    def split_file(n):
        names = [f"o{k}" for k in range(n)]
        return _program([_var("x", [n, 3], True)] + [_var(m, [1, 3]) for m in names],
                        [_op("split", {"X": ["x"]}, {"Out": names}, {"num": n, "axis": 0})])

    def chain_file(n):
        vars, ops = [], []
        for k in range(n):
            # (an op the meta probe infers: relu's shape rule runs no kernel at all)
            vars += [_var(f"x{k}", [k + 1, 3], True), _var(f"y{k}", [3, k + 1])]
            ops.append(_op("transpose", {"X": [f"x{k}"]}, {"Out": [f"y{k}"]}, {"axis": [1, 0]}))
        return _program(vars, ops)

    for make, sizes in ((split_file, (10, 100, 1000)), (chain_file, (10, 100, 400))):
        ratios = []
        for n in sizes:
            text = make(n)
            calls, err = _load_and_validate(text, ".json")
            assert err is None, err
            ratios.append(calls / len(text))
        assert max(ratios) <= 1.5 * min(ratios) and max(ratios) < 0.1, ratios


# --- many distinct ops of a slow kind (issue 46, acceptance 3) ---------------------------------

def _distinct_ops(op_type, n):
    """``n`` ops of ``op_type``, each on inputs of its own shape [-1, k] (no cache hit)."""
    x = lambda k: ([-1, k + 2], "float32")
    stats = lambda k: ([k + 2], "float32")
    label = lambda k: ([-1, 1], "int64")
    one = lambda k: ([1], "float32")
    ins = {"batch_norm": {"X": x, "Scale": stats, "Bias": stats, "Mean": stats,
                          "Variance": stats},
           "cross_entropy": {"X": x, "Label": label},
           "softmax_with_cross_entropy": {"Logits": x, "Label": label},
           "matmul": {"X": x, "Y": lambda k: ([k + 2, 3], "float32")},
           "sum": {"X": x},
           "sgd": {"Param": x, "Grad": x, "LearningRate": one},
           "momentum": {"Param": x, "Grad": x, "Velocity": x, "LearningRate": one},
           "adam": {"Param": x, "Grad": x, "LearningRate": one, "Moment1": x, "Moment2": x,
                    "Beta1Pow": one, "Beta2Pow": one}}.get(
               op_type, {"X": x, "Y": lambda k: ([1], "float32")}
                                if op_type.startswith("elementwise") or
                                op_type == "square_error_cost" else {"X": x})
    outs = {"dropout": {"Out": "float32", "Mask": "uint8"},
            "batch_norm": {s: "float32" for s in ("Y", "MeanOut", "VarianceOut", "SavedMean",
                                                  "SavedVariance")},
            "cross_entropy": {"Y": "float32"},
            "softmax_with_cross_entropy": {"Softmax": "float32", "Loss": "float32"},
            "layer_norm": {"Y": "float32"},
            "sgd": {"ParamOut": "float32"},
            "momentum": {"ParamOut": "float32", "VelocityOut": "float32"},
            "adam": {s: "float32" for s in ("ParamOut", "Moment1Out", "Moment2Out",
                                             "Beta1PowOut", "Beta2PowOut")}}.get(
                                                 op_type, {"Out": "float32"})
    vars = [dict(_var(f"o_{slot}", None), dtype=dt) for slot, dt in outs.items()]
    ops = []
    for k in range(n):
        inputs = {}
        for slot, spec in ins.items():
            shape, dtype = spec(k)
            name = f"{slot}{k}"
            vars.append(dict(_var(name, shape, True), dtype=dtype))
            inputs[slot] = [name, name, name] if op_type == "sum" else [name]
        ops.append(_op(op_type, inputs, {s: [f"o_{s}"] for s in outs}, {}))
    return _program(vars, ops)


SLOW = ["gelu", "relu", "square", "abs", "exp", "softmax", "log_softmax", "scale", "dropout",
        "mean", "fill_zeros_like", "elementwise_add", "elementwise_pow", "square_error_cost",
        "sum", "concat", "matmul", "reduce_mean", "reduce_max", "layer_norm", "batch_norm",
        "cross_entropy", "softmax_with_cross_entropy", "sgd", "momentum", "adam"]
# ATen calls per further distinct op: a shape rule runs no kernel (its dtypes come from one
# run on one-element tensors, cached), batch_norm's guard reads meta tensors of both batch
# sizes (5 inputs x 2); the meta probe it replaced made 4 to 16 an op, each a slow decomposition
PER_OP = {"batch_norm": 10}


@pytest.mark.parametrize("op_type", SLOW)
def test_distinct_slow_ops_cost_no_kernel_run_each(op_type):
    calls = []
    for n in (20, 60):
        count, err = _load_and_validate(_distinct_ops(op_type, n), ".json")
        assert err is None, err
        calls.append(count)
    per_op = (calls[1] - calls[0]) / 40
    assert per_op <= PER_OP.get(op_type, 0), (op_type, calls)


@pytest.mark.parametrize("op_type, attr", [("sgd", "weight_decay"), ("momentum", "mu"),
                                           ("adam", "beta1")])
def test_distinct_optimizer_attrs_cost_no_kernel_run_each(op_type, attr):
    # one set of inputs, a float attr that differs per op: the dtype run keys on its class
    calls = []
    for n in (20, 60):
        doc = json.loads(_distinct_ops(op_type, 1))
        block = doc["blocks"][0]
        block["ops"] = [dict(block["ops"][0], attrs={attr: k + n + 0.5}) for k in range(n)]
        count, err = _load_and_validate(json.dumps(doc), ".json")
        assert err is None, err
        calls.append(count)
    assert calls[1] <= calls[0], (op_type, calls)


def test_one_run_probes_inputs_without_a_batch_dim():
    # an op without a rule (transpose) and no -1 in its inputs runs its kernel once, not twice
    text = _program([_var("x", [2, 3], True), _var("y", [3, 2])],
                    [_op("transpose", {"X": ["x"]}, {"Out": ["y"]}, {"axis": [1, 0]})])
    batched = _program([_var("x", [-1, 3], True), _var("y", [3, -1])],
                       [_op("transpose", {"X": ["x"]}, {"Out": ["y"]}, {"axis": [1, 0]})])
    once, err = _load_and_validate(text, ".json")
    twice, err2 = _load_and_validate(batched, ".json")
    assert err is None and err2 is None and 0 < once and twice == 2 * once


# --- Paddle: PIR and legacy --------------------------------------------------------------------

def _pir(change):
    doc = json.loads((PIR / "ops.json").read_text())
    ops = doc["program"]["regions"][0]["blocks"][0]["ops"]
    change(ops)
    return json.dumps(doc)


def _set_rank(ops, rank):
    param = next(o for o in ops if o["#"] == "p")
    param["O"]["TT"]["D"][1] = [1] * rank


def _set_num(ops, num):
    next(o for o in ops if o["#"] == "1.split_with_num")["A"][0]["AT"]["D"] = num


def test_pir_rank_and_split_bombs_are_refused_at_once():
    calls, err = _load_and_validate(_pir(lambda ops: _set_rank(ops, 1000)), ".json")
    assert err is not None and calls == 0 and "1000 dimensions" in str(err)
    assert "bomb.json:1:" in str(err) and "ops[0].O.TT.D[1]" in str(err)
    calls, err = _load_and_validate(_pir(lambda ops: _set_num(ops, 2 ** 20)), ".json")
    assert err is not None and calls == 0
    assert "num=1048576 makes 1048576 parts, but the result lists 2 tensor types" in str(err)
    assert "op 14 (pd_op.split_with_num)" in str(err)


def _legacy_split(num=None, rank=None):
    paddle_models = pytest.importorskip("paddle_models")
    b = paddle_models.ProgramBuilder()
    shape = [1] * rank if rank else [2 ** 21]
    b.var("x", shape, need_check_feed=True, stop_gradient=True)
    b.var("a", [1])
    b.var("b", [1])
    b.op("split", {"X": ["x"]}, {"Out": ["a", "b"]}, {"num": num or 2, "axis": 0,
                                                      "sections": []})
    return b.bytes()


def test_legacy_rank_and_split_bombs_are_refused_at_once():
    for data, message in ((_legacy_split(num=2 ** 21), "produces 2097152 \\(num=2097152\\)"),
                          (_legacy_split(rank=2000), "2000 dimensions")):
        with KernelCalls() as counter:
            with pytest.raises(se.ProgramError, match=message) as info:
                convert_program(read_program_bytes(data, "bomb.pdmodel"))
        assert counter.calls == 0 and "bomb.pdmodel" in str(info.value)


def test_paddle_per_dimension_lists_over_the_cap_are_refused_at_the_op():
    def long_shape(ops):
        const = next(o for o in ops if o["#"] == "1.full_int_array")  # the reshape's shape
        const["A"][0]["AT"]["D"] = [{"#": "0.a_i64", "D": 1}] * 65
    calls, err = _load_and_validate(_pir(long_shape), ".json")
    assert err is not None and calls == 0
    assert "op 7 (pd_op.reshape)" in str(err) and "attribute 'shape'" in str(err)
    assert "65 dimensions" in str(err)
    paddle_models = pytest.importorskip("paddle_models")
    b = paddle_models.ProgramBuilder()
    b.var("x", [-1, 4], need_check_feed=True, stop_gradient=True)
    b.var("y", [-1, 4])
    b.op("transpose2", {"X": ["x"]}, {"Out": ["y"]}, {"axis": list(range(70))})
    with KernelCalls() as counter:
        with pytest.raises(se.ProgramError, match=r"bomb\.pdmodel: block 0, op 0 \(transpose2\): "
                                                  r"attribute 'axis' \(70 entries"):
            convert_program(read_program_bytes(b.bytes(), "bomb.pdmodel"))
    assert counter.calls == 0


def test_the_command_line_refuses_bombs_with_exit_2(tmp_path, capsys):
    files = {"rank.json": _rank_bomb(2000), "split.json": _split(2 ** 21),
             "pir.json": _pir(lambda ops: _set_num(ops, 2 ** 20))}
    for name, text in files.items():
        path = tmp_path / name
        path.write_text(text)
        status = cli.main(["dump", str(path)])
        err = capsys.readouterr().err
        lines = err.strip().splitlines()
        assert status == 2 and len(lines) == 1, err
        assert str(path) in lines[0] and "internal error" not in err and "Traceback" not in err


# --- trace files (ssaexec viz --trace) ----------------------------------------------------------

@pytest.mark.parametrize("text, message", [
    ('{"traceEvents": [{"ph": "X", "name": "a", "ts": 0, "dur": NaN, "args": {"op_id": 0}}]}',
     "traceEvents[0].dur: NaN is not standard JSON"),
    ('{"traceEvents": [' + "[" * 100000 + "]" * 100000 + "]}",
     "nested more than 64 deep (the limit max_nesting)"),
    ('{"traceEvents": [{"ph": "X", "ts": 1e999, "dur": 1}]}', "1e999 is out of range"),
    ('{"traceEvents": [{"ph": "X", "ts": ' + "9" * 100 + ', "dur": 1}]}', "100 digits"),
])
def test_a_hostile_trace_is_a_clean_exit_2(tmp_path, capsys, text, message):
    trace = tmp_path / "trace.json"
    trace.write_text(text)
    status = cli.main(["viz", str(ROOT / "examples" / "seed_mlp.json"), "-o",
                       str(tmp_path / "g.html"), "--trace", str(trace)])
    err = capsys.readouterr().err
    assert status == 2 and len(err.strip().splitlines()) == 1, err
    assert message in err and f"{trace}:1:" in err and "internal error" not in err
    assert not (tmp_path / "g.html").exists()


def test_simulate_reads_a_hostile_profile_as_cleanly(tmp_path, capsys):
    trace = tmp_path / "trace.json"
    trace.write_text('{"traceEvents": [' + "[" * 100000 + "]" * 100000 + "]}")
    status = cli.main(["simulate", str(ROOT / "examples" / "seed_mlp.json"), "--profile",
                       str(trace), "--no-plot"])
    err = capsys.readouterr().err
    assert status == 2 and "nested more than 64 deep" in err and "internal error" not in err
