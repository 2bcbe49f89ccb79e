"""Hostile files of issue 46's classes that the issue did not list (its acceptance 2).

A red-team pass after the issue's fixes, as a user would attack: program files of every
form, feed files, ``--save`` and ``--resume`` targets. What broke, and is held here:

* **Validation bombs** (class 3). The Paddle converter's 0-d pass inferred each distinct
  op once, but its key held the op's output *names*, so every op was distinct: a 1 MB
  PIR file of 4,200 identical ``relu`` ops took 13.6 s to load (10 s in the pass). What
  inference reads of the outputs is which are wanted, so that is the key now.
* **Lost work** (class 6). ``ssaexec run --save`` into a folder that takes no new file
  (``/proc``, a read-only mount) trained every step and then ended in ``ssaexec:
  internal error: FileNotFoundError``, nothing saved; a save failing at the end for any
  other reason (a full disk) did the same. ``--save /dev/null`` (or a FIFO, a socket)
  *replaced* the node with a regular file: run as root, it replaced the system's
  ``/dev/null``. Now the folder is tried and the target's kind checked before the first
  step (exit 2), ``safe_files.atomic_write`` never replaces a FIFO, socket or device, and
  a save that fails at the end is one clean line naming ``--save`` (exit 2).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ssaexec.frontends.paddle import convert as paddle_convert
from ssaexec.frontends.paddle import read_program_bytes
from ssaexec.core.safe_files import NotRegularFile, atomic_write, replace_problem
from tests.cli.test_cli import PLACES, assert_clean_error, cli, example  # noqa: F401 - cli: a fixture

ROOT = Path(__file__).resolve().parents[2]
PIR = ROOT / "tests/fixtures/paddle/pir"


# --- class 3: the converter's inference grows with distinct ops, not with ops --------------
def _pir_with_relus(n):
    """The heldout PIR fixture with ``n`` more ``relu`` ops, each reading what the first
    reads and writing a value of its own (the same op, over and over)."""
    doc = json.loads((PIR / "heldout.json").read_text())
    ops = doc["program"]["regions"][0]["blocks"][0]["ops"]
    relu = next(o for o in ops if o["#"] == "1.relu")
    for i in range(n):
        extra = json.loads(json.dumps(relu))
        extra["O"][0]["%"] = 100000 + i
        ops.insert(-1, extra)
    return json.dumps(doc).encode()


def test_identical_paddle_ops_are_inferred_once_when_converted(monkeypatch):
    calls = []

    def counted(*args, **kw):
        calls.append(args[1].type)
        return real(*args, **kw)
    real = paddle_convert.infer_outputs
    monkeypatch.setattr(paddle_convert, "infer_outputs", counted)

    def relu_inferences(n):
        calls.clear()
        program = paddle_convert.convert_program(
            read_program_bytes(_pir_with_relus(n), "m.json")).program
        assert sum(op.type == "relu" for op in program.global_block().ops) == n + 1
        return calls.count("relu")
    assert relu_inferences(0) == 1
    assert relu_inferences(300) == 1  # was 301: one per op, each with its own output name


# --- class 6: --save never replaces a node, never fails after training ------------------------
def test_atomic_write_refuses_a_fifo_or_device_at_the_target(tmp_path):
    fifo = tmp_path / "run.safetensors"
    os.mkfifo(fifo)
    assert replace_problem(fifo) == "a FIFO (named pipe)"
    with pytest.raises(NotRegularFile, match="is a FIFO"):
        atomic_write(fifo, lambda tmp: Path(tmp).write_bytes(b"x"))
    assert fifo.is_fifo() and not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
    if os.path.exists("/dev/null"):  # never written, only looked at
        assert replace_problem("/dev/null") == "a character device"
    # what the writer may replace: nothing, a file, a symlink (never followed)
    (tmp_path / "f").write_bytes(b"old")
    os.symlink(tmp_path / "f", tmp_path / "link")
    for name in ("new", "f", "link"):
        assert replace_problem(tmp_path / name) is None
        atomic_write(tmp_path / name, lambda tmp: Path(tmp).write_bytes(b"new"))
        assert (tmp_path / name).read_bytes() == b"new"
    assert not (tmp_path / "link").is_symlink()


def test_a_save_that_could_only_fail_is_refused_before_training(cli, tmp_path):
    fifo = tmp_path / "run.safetensors"
    os.mkfifo(fifo)
    targets = [(fifo, "is a FIFO (named pipe), not a file")]
    if os.path.isdir("/proc/self"):  # a folder that takes no new file, even for root
        targets.append(("/proc/self/run.safetensors", "cannot write a file in /proc/self"))
    for target, why in targets:
        res = cli(["run", example("uci_housing.json"), "--places", PLACES, "--steps", 2,
                   "--save", target])
        assert_clean_error(res, f"--save {target}: ", why, "nothing was trained")
        assert "step " not in res.out and "internal error" not in res.err
    assert fifo.is_fifo()


_FULL_DISK = """
import resource, signal, sys
from ssaexec.cli.main import main
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (256, resource.RLIM_INFINITY))
sys.exit(main(sys.argv[1:]))
"""


def test_a_save_that_fails_after_training_is_a_clean_error(tmp_path):
    out = tmp_path / "run.safetensors"
    proc = subprocess.run(
        [sys.executable, "-c", _FULL_DISK, "run", str(example("uci_housing.json")),
         "--places", PLACES, "--steps", "2", "--no-progress", "--save", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
        env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 2, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"ssaexec: error: --save {out}: cannot be written after 2 steps"), last
    assert "internal error" not in proc.stderr and not out.exists()
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]


# --- class 3: building the SSA graph is linear in the file ---------------------------------
class _ScanCount(list):
    """A list that counts the elements each ``in`` and each iteration walks over."""

    walked = 0

    def __contains__(self, x):
        _ScanCount.walked += len(self)
        return list.__contains__(self, x)

    def __iter__(self):
        _ScanCount.walked += len(self)
        return list.__iter__(self)


def _fan_program(n):
    """``w`` read by ``n`` ops, then written again (``n`` write-after-read edges)."""
    from ssaexec.program.text import program_from_text
    lines = ["ssaexec-program v1 random_seed=0", "", "block 0 parent=-1 {",
             "  var x : float32[-1, 4] data stop_gradient", "  var w : float32[-1, 4]"]
    lines += [f"  var y{i} : float32[-1, 4]" for i in range(n)]
    lines += ["  w = relu(X=x)"] + [f"  y{i} = relu(X=w)" for i in range(n)]
    lines += ["  w = relu(X=x)", "}"]
    return program_from_text("\n".join(lines) + "\n")


def test_a_var_read_by_many_ops_builds_its_graph_in_linear_work(monkeypatch):
    # a 1 MB file whose var is read by 20,000 ops and then written: 9.5 s to build its
    # graph (every read scanned the var's readers, every hazard edge the writer's inputs)
    import ssaexec as se
    from ssaexec.graph import handles
    var_init, op_init = handles.VarHandle.__init__, handles.OpHandle.__init__

    def var_counted(self, *a, **kw):
        var_init(self, *a, **kw)
        self.pending_ops = _ScanCount()

    def op_counted(self, *a, **kw):
        op_init(self, *a, **kw)
        self.inputs = _ScanCount()
    monkeypatch.setattr(handles.VarHandle, "__init__", var_counted)
    monkeypatch.setattr(handles.OpHandle, "__init__", op_counted)

    def walked(n):
        program = _fan_program(n)
        _ScanCount.walked = 0
        graph = se.build_ssa_graph(program, se.cpu_places(2), se.BuildStrategy())
        war = [d for d in graph.dummies if d.reason == "war"]
        assert len(war) == 2 * n  # every reader of w still runs before its rewrite
        return _ScanCount.walked
    small, big = walked(200), walked(800)
    assert big <= 6 * max(small, 1), (small, big)  # linear: 4x; it was 16x


# --- class 6: a FIFO or a device where a file is read: refused, never waited on ---------------
@pytest.mark.timeout(60)  # a regression would block on the FIFO's open: fail, not hang
def test_a_fifo_or_device_named_as_any_input_file_is_refused_not_waited_on(cli, tmp_path):
    # ``ssaexec dump FIFO.json`` (or --startup, a .pdiparams, viz --trace, simulate
    # --profile/--cluster) blocked forever opening it; /dev/zero was read without end
    import ssaexec as se
    from ssaexec.core.errors import ProgramError, SSAExecError
    from ssaexec.frontends.paddle.params import load_params
    from ssaexec.graph.explorer import load_trace
    from ssaexec.sim.cluster import get_cluster
    from ssaexec.sim.profile import Profile
    for name in ("m.json", "m.ssa", "m.pdmodel", "m.pdiparams", "trace.json"):
        os.mkfifo(tmp_path / name)
    for name in ("m.json", "m.ssa", "m.pdmodel"):
        with pytest.raises(ProgramError, match=r"is a FIFO \(named pipe\), not a program file"):
            se.load_program(tmp_path / name)
    with pytest.raises(ProgramError, match="is a FIFO .*not a parameter file"):
        load_params(tmp_path / "m.pdiparams", ["w"])
    fifo = tmp_path / "trace.json"
    for read in (load_trace, Profile.from_trace, get_cluster):
        with pytest.raises(SSAExecError, match="is a FIFO"):
            read(str(fifo))
    if os.path.exists("/dev/zero"):
        os.symlink("/dev/zero", tmp_path / "zero.json")
        with pytest.raises(ProgramError, match="is a character device, not a program file"):
            se.load_program(tmp_path / "zero.json")
    res = cli(["run", example("uci_housing.json"), "--places", PLACES, "--steps", 1,
               "--startup", tmp_path / "m.json"])
    assert_clean_error(res, "m.json: is a FIFO (named pipe), not a program file")
    assert all(Path(tmp_path / n).is_fifo() for n in ("m.json", "trace.json"))


def test_a_cluster_file_is_read_as_strictly_as_a_program(tmp_path):
    # json.load: 100,000 nested brackets were a RecursionError (an internal error)
    from ssaexec.core.errors import SSAExecError
    from ssaexec.sim.cluster import get_cluster
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(SSAExecError, match="not a cluster description .*max_nesting"):
        get_cluster(str(deep))
    nan = tmp_path / "nan.json"
    nan.write_text('{"a": NaN}')
    with pytest.raises(SSAExecError, match="not a cluster description .*NaN"):
        get_cluster(str(nan))


def test_a_saved_program_replaces_a_symlink_never_writes_through_it(tmp_path):
    # ``ssaexec convert IN OUT.ssa`` (se.save_program) wrote through a symlink at OUT:
    # the file it pointed at was overwritten, as .pdiparams files were before issue 46
    import ssaexec as se
    from ssaexec.core.errors import ProgramError
    program = se.load_program(example("uci_housing.json"))
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    os.symlink(victim, tmp_path / "out.ssa")
    se.save_program(program, tmp_path / "out.ssa")
    assert victim.read_text() == "keep me" and not (tmp_path / "out.ssa").is_symlink()
    assert se.load_program(tmp_path / "out.ssa") == program
    os.mkfifo(tmp_path / "pipe.json")
    with pytest.raises(ProgramError, match=r"pipe.json: is a FIFO \(named pipe\), not a program"):
        se.save_program(program, tmp_path / "pipe.json")
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]


# --- class 2: an attribute outside what the op means is refused at validation ---------------
def _one_op(var_lines, op_line):
    """A one-block program of ``var_lines`` and the op ``op_line``, parsed, not validated."""
    from ssaexec.program.text import program_from_text
    lines = ["ssaexec-program v1 random_seed=0", "", "block 0 parent=-1 {"]
    lines += [f"  {v}" for v in var_lines] + [f"  {op_line}", "}"]
    return program_from_text("\n".join(lines) + "\n")


def _refused(var_lines, op_line, match):
    from ssaexec.core.errors import ProgramError
    from ssaexec.program.validate import validate_program
    with pytest.raises(ProgramError, match=match):
        validate_program(_one_op(var_lines, op_line))


def test_flatten_refuses_an_axis_past_the_rank():
    # axis=10**6 flattened all of X into the rows: [3, 4] gave a [12, 1] result
    x = ["var x : float32[3, 4] data stop_gradient"]
    for axis, shape in ((0, "[1, 12]"), (1, "[3, 4]"), (2, "[12, 1]")):  # Paddle's [0, rank]
        from ssaexec.program.validate import validate_program
        validate_program(_one_op(x + [f"var y : float32{shape}"],
                                 f"y = flatten(X=x) {{axis={axis}}}"))
    for axis in (10**6, 3, -1):
        _refused(x + ["var y : float32[12, 1]"], f"y = flatten(X=x) {{axis={axis}}}",
                 rf"flatten.*axis {axis} is outside \[0, 2\]")


def test_accuracy_refuses_k_below_one_and_labels_of_other_rows():
    # k=0 scored 0; a 1-row X against 1000 labels broadcast to an accuracy of 1.0
    outs = ["var a : float32[]", "var c : int64[]", "var t : int64[]"]
    op = "{{Accuracy=a, Correct=c, Total=t}} = accuracy(X=x, Label=l) {{k={k}}}"
    ok = ["var x : float32[-1, 5] data stop_gradient",
          "var l : int64[-1, 1] data stop_gradient"] + outs
    from ssaexec.program.validate import validate_program
    validate_program(_one_op(ok, op.format(k=1)))
    _refused(ok, op.format(k=0), "accuracy: k is 0; it must be at least 1")
    rows = ["var x : float32[1, 5] data stop_gradient",
            "var l : int64[1000, 1] data stop_gradient"] + outs
    _refused(rows, op.format(k=1), "Label holds 1000 labels .* but X has 1 rows")
    # -1 rows are checked when the op runs (the feeds already refuse unequal batches); the
    # kernel's ValueError becomes an OpError naming the op
    from ssaexec.ops.registry import get_op_def
    with pytest.raises(ValueError, match="Label holds 1000 labels"):
        get_op_def("accuracy").kernel({"X": torch.randn(1, 5),
                                       "Label": torch.zeros(1000, 1, dtype=torch.int64)},
                                      {"k": 1})


@pytest.mark.parametrize("p", ["2.0", "-0.5", "nan", "inf"])
def test_dropout_refuses_a_probability_outside_0_1(p):
    x = ["var x : float32[-1, 4] data stop_gradient", "var y : float32[-1, 4]",
         "var m : uint8[-1, 4]"]
    op = "{{Out=y, Mask=m}} = dropout(X=x) {{dropout_prob={p}, is_test={t}}}"
    from ssaexec.program.validate import validate_program
    validate_program(_one_op(x, op.format(p="1.0", t="false")))  # the bounds are Paddle's
    for test in ("false", "true"):
        _refused(x, op.format(p=p, t=test), rf"dropout_prob is {p}; it must be in \[0, 1\]")


def test_assign_value_refuses_a_value_count_other_than_the_shape():
    # 150,000 values for a [2, 2] passed validation and failed on the first run
    op = "y = assign_value() {{shape=[2, 2], dtype=\"float32\", values=[{v}]}}"
    y = ["var y : float32[2, 2]"]
    from ssaexec.program.validate import validate_program
    validate_program(_one_op(y, op.format(v="1.0, 2.0, 3.0, 4.0")))
    _refused(y, op.format(v=", ".join(["1.0"] * 150000)),
             r"assign_value: 150000 values do not fill shape \[2, 2\] \(4 elements\)")
    _refused(y, op.format(v="1.0, 2.0, 3.0"), r"3 values do not fill shape \[2, 2\]")


def test_assign_bytes_refuses_a_byte_count_other_than_the_shape_at_validation():
    from ssaexec.core.errors import ProgramError
    from ssaexec.ops.aten import _bytes_infer, encode_bytes
    good = encode_bytes(torch.arange(4, dtype=torch.float32))
    assert _bytes_infer({}, {"shape": [2, 2], "dtype": "float32", "data": good}) == \
        {"Out": ([2, 2], "float32")}
    for shape, data in (([3, 3], good), ([2, 2], good[:-4]), ([2, 2], good + "A"),
                        ([-1, 4], good)):
        with pytest.raises(ProgramError, match="assign_bytes"):
            _bytes_infer({}, {"shape": shape, "dtype": "float32", "data": data})
    for n in range(0, 7):  # every padding length agrees with the decoder
        data = encode_bytes(torch.arange(n, dtype=torch.uint8))
        assert _bytes_infer({}, {"shape": [n], "dtype": "uint8", "data": data})


def test_a_skip_update_that_would_resize_the_parameter_is_refused():
    # torch.where(skip, old, new, out=new) resized Param and its state to the broadcast
    from ssaexec.ops.registry import get_op_def
    sgd = get_op_def("sgd")
    for shape in ([2, 1], [1, 1], [3]):
        p = torch.ones(4)
        ins = {"Param": p, "Grad": torch.ones(4), "LearningRate": torch.tensor(0.1),
               "SkipUpdate": torch.zeros(shape, dtype=torch.bool)}
        with pytest.raises(ValueError, match=r"SkipUpdate has shape .* one value"):
            sgd.kernel(ins, sgd.full_attrs({}))
        assert p.shape == (4,) and torch.equal(p, torch.ones(4))
    ins = {"Param": torch.ones(4), "Grad": torch.ones(4), "LearningRate": torch.tensor(0.1),
           "SkipUpdate": torch.ones((), dtype=torch.bool)}
    out = sgd.kernel(ins, sgd.full_attrs({}))["ParamOut"]
    assert torch.equal(out, torch.ones(4))  # skipped: unchanged
