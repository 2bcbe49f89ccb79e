"""Fuzzing the program readers: any file gives a program or a ``ProgramError``, nothing else.

A hypothesis-driven mutator takes valid programs in both formats (the example
programs of ``examples/``, a small ATen program with size expressions, and the
file-writing ``aten.from_file`` program of issue 14), two Paddle programs
(protobuf, tests/paddle_models.py) and three Paddle 3 PIR programs (JSON,
tests/fixtures/paddle/pir) and truncates them, flips,
inserts and deletes bytes, copies spans, grows numbers to thousands of digits,
nests brackets thousands deep and splices in tokens that matter (denied ATen
ops, size-expression bombs, surrogates, NaN, huge shapes). Each case, in a
fresh working directory:

* ``load_program`` and ``validate`` return or raise ``ProgramError``, nothing else;
* a program that loads prints and reads back in both formats;
* ``ssaexec dump`` (which also builds the SSA graph) exits 0 or 2 with one line
  on stderr, never "internal error";
* a program that validates runs one step on small fed tensors, or fails with
  an ``SSAExecError``;
* no file appears, the case takes bounded time, and the process's peak memory
  stays bounded (``max_tensor_elements`` is lowered to 2**22 for the run).

The normal suite runs a short budget (``SSAEXEC_FUZZ_EXAMPLES``, default 60
cases); ``make fuzz`` runs a long one and prints the number of cases tried.
"""

import contextlib
import io
import os
import re
import resource
import shutil
import tempfile
import time
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ssaexec as se
from ssaexec import cli
from ssaexec.core.limits import limits
from ssaexec.core.dtypes import torch_dtype
from ssaexec.program.io import load_program
from ssaexec.program.serialize import from_json, to_json
from ssaexec.program.text import program_from_text

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ["uci_housing.json", "uci_housing.ssa", "uci_housing.startup.ssa",
            "seed_mlp.json", "seed_mlp.ssa", "seed_mlp.startup.json", "mnist_mlp.json"]
MAX_EXAMPLES = int(os.environ.get("SSAEXEC_FUZZ_EXAMPLES", "60"))
CASE_SECONDS = 20.0  # per case, generous: a loaded 2-core machine; typical cases take ms
MAX_RSS_GROWTH_KIB = 2 * 1024 * 1024

ATEN_SEED = """ssaexec-program v1 random_seed=0

block 0 parent=-1 {
  var x : float32[-1, 4] data
  var w : float32[3, 4] persistable parameter
  var wt : float32[4, 3]
  var h : float32[-1, 3]
  var f : float32[-1]
  var z : float32[-1, 3]
  wt = aten.t.default(X=w) {self="X[0]"}
  h = aten.mm.default(X=[x, wt]) {self="X[0]", mat2="X[1]"}
  f = aten.view.default(X=h) {self="X[0]", size=["3*s0"], "@sym"=[["s0", 0, 0]]}
  z = aten.zeros.default(X=[x]) {size=["s0", 3], dtype="float32", "@sym"=[["s0", 0, 0]]}
}
"""

EVIL_SEED = """ssaexec-program v1 random_seed=0

block 0 parent=-1 {
  var x : float32[-1, 4] data
  var y : float32[16]
  y = aten.from_file.default(X=x) {filename="pwned", shared=true, size=16}
}
"""


def _seeds():
    seeds = [((ROOT / "examples" / name).read_bytes(), Path(name).suffix) for name in EXAMPLES]
    seeds.append((ATEN_SEED.encode(), ".ssa"))
    seeds.append((to_json(program_from_text(ATEN_SEED)).encode(), ".json"))
    seeds.append((EVIL_SEED.encode(), ".ssa"))
    evil_json = to_json(program_from_text(EVIL_SEED.replace("aten.from_file.default",
                                                            "aten.relu.default")))
    seeds.append((evil_json.replace("aten.relu.default", "aten.from_file.default").encode(),
                  ".json"))
    # Paddle 3 PIR programs (JSON, told from ours by content): written by Paddle 3.3.1
    pir = ROOT / "tests" / "fixtures" / "paddle" / "pir"
    seeds += [((pir / name).read_bytes(), ".json")
              for name in ("static_mlp.json", "cnn.json", "ops.json")]
    try:  # Paddle programs (protobuf): a training program and an inference model
        import paddle_models
        seeds += [(paddle_models.mlp("adam").main, ".pdprog"),
                  (paddle_models.cnn_inference().main, ".pdmodel")]
    except ImportError:  # no protobuf: no Paddle seeds
        pass
    return seeds


SEEDS = _seeds()
# SSAEXEC_FUZZ_SEEDS=pir: only the Paddle 3 PIR seeds (a long run on the PIR reader)
if os.environ.get("SSAEXEC_FUZZ_SEEDS") == "pir":
    SEEDS = [s for s in SEEDS if s[1] == ".json" and b'"magic":"pir"' in s[0][:200]]

# Tokens worth splicing in: denied and allowed ATen ops, bombs, odd literals.
TOKENS = [s.encode() for s in [
    "aten.from_file.default", "aten._copy_from.default", "aten.set_.source_Storage",
    "aten.resize_.default", "aten._local_scalar_dense.default", "aten.add_.Tensor",
    "aten.empty.memory_format", "aten.full.default", "aten.zeros.default",
    "aten.arange.default", "aten.expand.default", "aten.repeat.default",
    "aten.bernoulli.p", "aten.native_dropout.default", "aten.view.default",
    'filename="pwned"', '"filename": "pwned"', "shared=true", "pin_memory=true",
    '"generator": "cpu"', 'device="cuda:0"', '"9**9**9*s0"', '"s0*s0*s0*s0*s0*s0*s0*s0"',
    '"FloorDiv(s0, 0)"', '"Max(s0)"', '"(((((((s0)))))))"', '"@sym"=[["s0", 0, 0]]',
    '"@sym": [["s0", 0, 0]]', "size=[2147483648, 2147483648]", '"size": [2147483647, 3]',
    "[-1, 100000, 100000]", "[-2]", "NaN", "Infinity", "-Infinity", "1e999", "nan", "inf",
    '"\\ud800"', '"\\udfff"', '"\\u0000"', "\x00", "\xff", "\ufeff", "block(99)",
    '{"block": 99}', '{"float": "nan"}', "persistable", "data", "@backward", "->",
    "{", "}", "[", "]", "(", ")", ",", "=", ":", '"', "\\", "\n", "#",
    '{"%":0}', '{"%":99999}', '"9.conv2d"', '"1.while"', '"0.t_vec"', '"0.a_scalar"',
    '{"#":"0.t_f32"}', '"version":99', '[4294967296,4294967296]', '"regions":[{}]',
    '"num"', '"SAME"', '{"#":"0.a_i32","D":2097152}',
]]


# Whole words and strings to put in place of others: op types (allowed, denied, made
# up), attribute and slot names, flags, dtypes, keywords.
WORDS = [s.encode() for s in [
    "aten.from_file.default", "aten._copy_from.default", "aten.resize_.default",
    "aten.add_.Tensor", "aten.add.out", "aten.set_.source_Tensor", "aten.item.default",
    "aten.as_strided.default", "aten._print.default", "aten.sym_size.int",
    "aten.full.default", "aten.zeros.default", "aten.arange.default", "aten.expand.default",
    "aten.repeat.default", "aten.new_empty.default", "aten.empty.memory_format",
    "aten.bernoulli.p", "aten.native_dropout.default", "aten.view.default", "aten.t.default",
    "aten.mm.default", "aten.relu.default", "aten.no_such.default", "aten.__class__.default",
    "relu", "mul", "fill_constant", "gaussian_random", "conditional_block", "while",
    "size", "self", "other", "filename", "generator", "pin_memory", "device", "dtype", "shape",
    "value", "seed", "X", "Y", "Out", "persistable", "parameter", "data", "stop_gradient",
    "float64", "int64", "bool", "float16", "var", "block", "parent", "names", "true", "null",
    "nan", "inf", "-inf", "1e999", "-1", "0", "9" * 5000,
    "pd_op", "builtin", "p", "TT", "OA", "magic", "pir", "t_dtensor", "a_intarray",
]]
STRINGS = [s.encode() for s in [
    '"X[0]"', '"X[7]"', '"X[-1]"', '"s0"', '"3*s0"', '"9**9**9*s0"', '"FloorDiv(s0, 0)"',
    '"Max(s0, 2147483648)"', '"s0*s0*s0*s0*s0*s0*s0*s0*s0*s0*s0*s0*s0*s0*s0*s0"',
    '"' + "(" * 50 + "s0" + ")" * 50 + '"', '"__import__(\"os\")"', '"pwned"',
    '"/tmp/pwned"', '"\\ud800"', '"@sym"', '"filename"', '"generator"',
    '"aten.from_file.default"', '"ssaexec.program"', '""', '"float32"', '"contiguous_format"',
    '"strided"', '"cpu"',
]]


# Values of another shape: objects, lists, the JSON form's encodings, bad @sym entries.
VALUES = [s.encode() for s in [
    "{}", "[]", '{"block": 3}', '{"block": -1}', '{"float": "nan"}', '{"float": 1}',
    '{"x": 1}', "null", "true", "false", "[null]", "[[]]", '[["s0", 0, 9]]', '[["s0", 5, 0]]',
    '[["s1", 0, 0]]', '["s0", 0]', '"X[0]"', '"X[1]"', "[1, 2.5, \"a\"]", "-1", "2.5",
    "[-1, 4]", "[2147483648]", "block(1)", "block(0)", "[block(1)]",
    # PIR attribute values and types of the wrong kind (issue 46: these once ended in
    # internal errors): an int where a list goes, a list where a string goes ...
    '{"#":"0.a_i32","D":0}', '{"#":"0.a_str","D":"SAME"}', '{"#":"0.a_array","D":[]}',
    '{"#":"0.a_array","D":[{"#":"0.a_str","D":"a"}]}', '{"#":"1.a_intarray","D":[0,0]}',
    '{"#":"NULL"}', '{"#":"0.t_vec","D":[]}', '{"%":0}', "[" + ", ".join(["1"] * 65) + "]",
]]
_VALUE = re.compile(rb'-?[0-9][0-9.eE+-]*|"(?:[^"\\]|\\.)*"|\btrue\b|\bfalse\b|\bnull\b')
_WORD = re.compile(rb"[A-Za-z_][A-Za-z0-9_.@]*")
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')


def _cut(data, i):
    return min(i, len(data))


@st.composite
def mutated(draw):
    """(file bytes, suffix): a seed after 1 to 4 mutations."""
    data, suffix = draw(st.sampled_from(SEEDS))
    for _ in range(draw(st.sampled_from([1, 1, 1, 2, 3, 4]))):
        # byte-level mutations break the syntax; token-level ones mostly keep it, so
        # cases also get past the parser into the policy, validation, dump and a run
        kind = draw(st.sampled_from(["truncate", "flip", "insert", "delete", "copy", "nest",
                                     "token"] + ["number", "word", "string", "value"] * 4))
        i = _cut(data, draw(st.integers(0, max(len(data) - 1, 0))))
        if kind in ("word", "string", "value"):
            pattern = {"word": _WORD, "string": _STRING, "value": _VALUE}[kind]
            spans = [m.span() for m in pattern.finditer(data)]
            if spans:
                a, b = draw(st.sampled_from(spans))
                new = draw(st.sampled_from({"word": WORDS, "string": STRINGS,
                                            "value": VALUES}[kind]))
                data = data[:a] + new + data[b:]
        elif kind == "truncate":
            data = data[:i]
        elif kind == "flip":
            if data:
                i = min(i, len(data) - 1)
                data = data[:i] + bytes([draw(st.integers(0, 255))]) + data[i + 1:]
        elif kind == "insert":
            data = data[:i] + draw(st.binary(min_size=1, max_size=8)) + data[i:]
        elif kind == "delete":
            data = data[:i] + data[i + draw(st.integers(1, 64)):]
        elif kind == "copy":
            j = _cut(data, draw(st.integers(0, max(len(data) - 1, 0))))
            span = data[i:i + draw(st.integers(1, 200))]
            data = data[:j] + span + data[j:]
        elif kind == "number":
            runs = [m.span() for m in re.finditer(rb"-?[0-9]+", data)]
            if runs:
                a, b = draw(st.sampled_from(runs))
                big = draw(st.sampled_from([b"9" * draw(st.integers(19, 6000)),
                                            b"-1", b"0", b"-2", b"2147483648",
                                            b"9223372036854775808", b"1e308",
                                            str(2 ** draw(st.integers(31, 200))).encode()]))
                data = data[:a] + big + data[b:]
        elif kind == "nest":
            depth = draw(st.integers(2, 20000))
            data = data[:i] + b"[" * depth + b"1" + b"]" * depth + data[i:]
        else:
            data = data[:i] + draw(st.sampled_from(TOKENS)) + data[i:]
    return data, suffix


def _small(shape):
    return [2 if d < 0 else min(d, 8) for d in shape]


def _run_one_step(program):
    """Feed every data var a small tensor and run the program once (``SSAExecError`` ok)."""
    feed = {}
    for var in program.global_block().vars.values():
        if var.is_data:
            if var.shape is None:
                return
            feed[var.name] = torch.zeros(_small(var.shape), dtype=torch_dtype(var.dtype))
    scope = se.Scope()
    for var in program.global_block().vars.values():
        if var.persistable and var.shape is not None and -1 not in var.shape:
            scope.set_var(var.name, torch.zeros(var.shape, dtype=torch_dtype(var.dtype)))
    try:
        se.Executor().run(program, feed=feed, scope=scope)
    except se.SSAExecError:
        pass


def check_case(data, suffix, workdir):
    """The properties of one case (module docstring); raises AssertionError on a violation."""
    path = workdir / ("case" + suffix)
    path.write_bytes(data)
    before = sorted(os.listdir(workdir))
    t0 = time.perf_counter()
    program = None
    try:
        program = load_program(path)
    except se.ProgramError as e:
        assert str(e), "an empty message"
    if program is not None:
        # what loads, prints, and reads back in both formats
        assert from_json(to_json(program), "again.json") == program
        assert program_from_text(str(program), "again.ssa") == program
        valid = True
        try:
            program.validate()
        except se.ProgramError:
            valid = False
        if valid:
            _run_one_step(program)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = cli.main(["dump", str(path), "--places", "cpu:2"])
    lines = err.getvalue().strip().splitlines()
    assert status in (0, 2), (status, err.getvalue())
    assert "internal error" not in err.getvalue(), err.getvalue()
    assert status == 0 or len(lines) == 1, err.getvalue()
    seconds = time.perf_counter() - t0
    assert seconds < CASE_SECONDS, f"a case took {seconds:.1f} s"
    assert sorted(os.listdir(workdir)) == before, "a file appeared"
    assert not (workdir / "pwned").exists()
    return program is not None


class _Tally:
    cases = 0
    loaded = 0


@pytest.fixture(scope="module")
def workdir():
    d = Path(tempfile.mkdtemp(prefix="ssaexec-fuzz-"))
    old = os.getcwd()
    os.chdir(d)  # relative paths a program names would land here
    try:
        yield d
    finally:
        os.chdir(old)
        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.timeout(max(600, MAX_EXAMPLES * 2))
def test_fuzz_readers_validate_and_cli(workdir):
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()

    @settings(max_examples=MAX_EXAMPLES, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=mutated())
    def run(case):
        data, suffix = case
        with limits(max_tensor_elements=2 ** 22):
            loaded = check_case(data, suffix, workdir)
        _Tally.cases += 1
        _Tally.loaded += loaded

    run()
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss
    print(f"\nfuzz: {_Tally.cases} cases ({_Tally.loaded} loaded) in "
          f"{time.perf_counter() - t0:.1f} s, peak RSS grew {grown // 1024} MiB")
    assert grown < MAX_RSS_GROWTH_KIB
    assert _Tally.cases >= min(MAX_EXAMPLES, 10)


def test_seeds_are_valid_programs(workdir):
    # the mutator starts from programs that load (and but for the file-writing one, validate)
    for data, suffix in SEEDS:
        path = workdir / ("seed" + suffix)
        path.write_bytes(data)
        if b"from_file" in data:
            with pytest.raises(se.ProgramError, match="is not allowed"):
                load_program(path)
        else:
            load_program(path).validate()
        path.unlink()
