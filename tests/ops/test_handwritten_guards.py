"""Hand-written ops call their kernels through the guard layer (issue 46, class 1).

The red-team's programs: a ``batch_norm`` over 8 (or 256) channels whose Scale, Bias,
Mean and Variance hold 1 element validated and then crashed ``ssaexec run`` (SIGSEGV),
or returned heap garbage; in training it wrote C values into the 1-element copies of
the running statistics (a heap overflow; ``MALLOC_CHECK_=3`` aborts). ``batch_norm_grad``
with a short saved mean and ``conv2d_grad`` with a gradient of another batch size read
past their buffers too. The hand-written kernels called ``torch.ops.aten.*`` unguarded.

Acceptance, in every program-file form (native ``.ssa`` and JSON, Paddle PIR
``.json`` + ``.pdiparams``, legacy ``.pdmodel`` + ``.pdiparams``): ``ssaexec run``, in a
subprocess under glibc's checking allocator, exits 2 (the file is refused: declared
shapes break the guard, in validation) or 1 (an ``OpError`` naming the op: values the
declarations did not bound), with one clean line naming the op, never a signal or an
internal error. And no module outside the guard layer calls ``torch.ops``.
"""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import ssaexec as se
from ssaexec.ops import guards, guards_hand
from ssaexec.ops.registry import get_op_def
from ssaexec.program.text import program_from_text

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
MALLOC_DEBUG = "/usr/lib/x86_64-linux-gnu/libc_malloc_debug.so.0"
BN = "aten.native_batch_norm.default"


# --- no torch.ops outside the guard layer -----------------------------------------------------
# Modules that may name ``torch.ops``, and why. Everywhere else an ATen overload is reached
# through ``ssaexec.ops.aten`` (program ops, guarded by ``guards.guarded``) or
# ``ssaexec.ops.guards_hand.kernel`` (hand-written ops), which decide on the guard.
ALLOWED_TORCH_OPS = {
    "ssaexec/ops/guards.py": "the guard layer itself",
    "ssaexec/ops/guards_hand.py": "the guard layer's door for hand-written ops",
    "ssaexec/ops/aten.py": "resolves a program's aten.<name>.<overload> (binds it behind its "
                           "guard)",
    "ssaexec/ops/schema.py": "resolve_overload: the one lookup of an overload by name, for "
                             "aten.py and guards_hand.py; it calls nothing",
    "ssaexec/core/compat.py": "the one door to torch internals: feature probes that name "
                         "overloads, never called on a program's values",
    "ssaexec/frontends/torch/decompose.py": "decompositions traced while capturing the "
                                            "caller's own module (fake tensors), and "
                                            "overloads as dict keys",
    "ssaexec/frontends/torch/capture.py": "capture of the caller's own module: overloads "
                                          "as keys of what it records",
    "ssaexec/runtime/inductor.py": "overloads as keys to recognise nodes of a traced graph, "
                                   "and a node target it builds; never called on values",
}


def _torch_ops_uses(tree):
    """Line numbers where ``tree`` names ``torch.ops`` (attribute, import, or alias)."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("ops", "_ops") and \
                isinstance(node.value, ast.Name) and node.value.id == "torch":
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module and (
                node.module.startswith(("torch.ops", "torch._ops")) or
                (node.module == "torch" and any(a.name in ("ops", "_ops") for a in node.names))):
            lines.append(node.lineno)
        elif isinstance(node, ast.Import) and any(
                a.name.startswith(("torch.ops", "torch._ops")) for a in node.names):
            lines.append(node.lineno)
    return sorted(lines)


def test_no_module_outside_the_guard_layer_names_torch_ops():
    found = {}
    for path in sorted((ROOT / "ssaexec").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        lines = _torch_ops_uses(ast.parse(path.read_text(), rel))
        if lines:
            found[rel] = lines
    outside = {rel: lines for rel, lines in found.items() if rel not in ALLOWED_TORCH_OPS}
    assert not outside, (
        "torch.ops named outside the guard layer (take the overload from "
        f"ssaexec.ops.guards_hand.kernel, or add the module to ALLOWED_TORCH_OPS with why): "
        f"{outside}")
    # the check sees what it looks for: the resolution by name is still found
    assert "ssaexec/ops/schema.py" in found
    assert _torch_ops_uses(ast.parse("import torch\ntorch.ops.aten.add.Tensor(x, y)")) == [2]
    assert _torch_ops_uses(ast.parse("from torch.ops import aten")) == [1]


def test_hand_written_ops_hold_the_guarded_kernels():
    from ssaexec.ops import math, nn, sparse
    held = {
        nn._BATCH_NORM: BN, nn._BATCH_NORM_BACKWARD: "aten.native_batch_norm_backward.default",
        nn._CONVOLUTION: "aten.convolution.default",
        nn._CONVOLUTION_BACKWARD: "aten.convolution_backward.default",
        sparse._EMBEDDING_BACKWARD: "aten.embedding_backward.default",
    }
    for fn, op_type in held.items():
        assert guards_hand.HAND_WRITTEN[op_type] is fn
        assert isinstance(fn, guards.HandWrittenOverload) and fn.op_type == op_type
    # a kernel that checks for itself is the bare overload: no cost
    assert math._THRESHOLD_BACKWARD is torch.ops.aten.threshold_backward.default
    # the guards of the overloads only hand-written ops call are in the table
    assert {BN, "aten.embedding_backward.default"} <= guards.HAND_WRITTEN_ONLY
    assert "training writes" in guards.TRUSTS[BN][1]


# --- the kernels, called as the executor calls them -------------------------------------------
def _bn_ins(c=8, stats=1, batch=2):
    return {"X": torch.randn(batch, c, 4, 4), "Scale": torch.ones(stats),
            "Bias": torch.zeros(stats), "Mean": torch.zeros(stats),
            "Variance": torch.ones(stats)}


@pytest.mark.parametrize("is_test", [False, True])
@pytest.mark.parametrize("slot", ["Scale", "Bias", "Mean", "Variance"])
def test_batch_norm_refuses_statistics_of_the_wrong_size(slot, is_test):
    od = get_op_def("batch_norm")
    attrs = od.full_attrs({"is_test": is_test})
    ins = _bn_ins(stats=8)
    ins[slot] = ins[slot][:1]
    arg = {"Scale": "weight", "Bias": "bias", "Mean": "running_mean",
           "Variance": "running_var"}[slot]
    with pytest.raises(guards.GuardError, match=rf"'{BN}': argument '{arg}' has 1 elements "
                                                r"\(\[1\]\), not 8"):
        od.kernel(ins, attrs)
    # on meta tensors (validation) too
    meta = {k: v.to("meta") for k, v in ins.items()}
    with pytest.raises(guards.GuardError, match=f"argument '{arg}' has 1 elements"):
        od.kernel(meta, attrs)
    good = _bn_ins(stats=8)  # the right sizes: torch's result
    ok = od.kernel(dict(good), attrs)
    ref = torch.nn.functional.batch_norm(good["X"], good["Mean"].clone(),
                                         good["Variance"].clone(), good["Scale"],
                                         good["Bias"], not is_test, 0.1, 1e-5)
    torch.testing.assert_close(ok["Y"], ref)


def _bn_grad_ins(c=8, batch=2):
    od = get_op_def("batch_norm")
    fwd_ins = _bn_ins(c, stats=c, batch=batch)
    out = od.kernel(fwd_ins, od.full_attrs({}))
    return {"X": fwd_ins["X"], "Scale": fwd_ins["Scale"], "Mean": fwd_ins["Mean"],
            "Variance": fwd_ins["Variance"], "SavedMean": out["SavedMean"],
            "SavedVariance": out["SavedVariance"], "Y@GRAD": torch.randn_like(out["Y"])}


@pytest.mark.parametrize("slot, bad, arg", [
    ("SavedMean", torch.zeros(1), "save_mean"), ("SavedVariance", torch.ones(3), "save_invstd"),
    ("Y@GRAD", torch.randn(1, 8, 4, 4), "grad_out"), ("Scale", torch.ones(1), "weight")])
def test_batch_norm_grad_refuses_short_statistics_and_other_batches(slot, bad, arg):
    od = get_op_def("batch_norm_grad")
    wanted = {"X@GRAD": [True], "Scale@GRAD": [True], "Bias@GRAD": [True]}
    ins = _bn_grad_ins()
    good = od.kernel(dict(ins), od.full_attrs({}), wanted)
    assert good["X@GRAD"].shape == (2, 8, 4, 4)
    ins[slot] = bad
    with pytest.raises(guards.GuardError, match=rf"native_batch_norm_backward.default': "
                                                rf"argument '{arg}'"):
        od.kernel(ins, od.full_attrs({}), wanted)


def test_conv2d_grad_refuses_a_gradient_of_another_batch_size():
    od = get_op_def("conv2d_grad")
    x, w = torch.randn(2, 3, 6, 6), torch.randn(4, 3, 3, 3)
    wanted = {"Input@GRAD": [True], "Filter@GRAD": [True]}
    attrs = od.full_attrs({})
    good = od.kernel({"Input": x, "Filter": w, "Output@GRAD": torch.randn(2, 4, 4, 4)}, attrs,
                     wanted)
    assert good["Filter@GRAD"].shape == w.shape
    for g in (torch.randn(1, 4, 4, 4), torch.randn(0, 4, 4, 4), torch.randn(2, 4, 3, 4)):
        with pytest.raises(guards.GuardError, match=r"convolution_backward.default': argument "
                                                    r"'grad_output' has shape"):
            od.kernel({"Input": x, "Filter": w, "Output@GRAD": g}, attrs, wanted)


def test_conv2d_refuses_a_result_over_the_limit_before_allocating():
    od = get_op_def("conv2d")
    with pytest.raises(guards.GuardError, match=r"convolution.default': .*max_tensor_elements"):
        od.kernel({"Input": torch.randn(1, 1, 2, 2), "Filter": torch.randn(1, 1, 1, 1)},
                  od.full_attrs({"paddings": [2 ** 20, 2 ** 20]}))


@pytest.mark.parametrize("sparse", [False, True])
def test_lookup_table_grad_refuses_ids_past_the_table(sparse):
    od = get_op_def("lookup_table_grad")
    attrs = od.full_attrs({"is_sparse": sparse})
    w = torch.randn(10, 4)
    good = od.kernel({"W": w, "Ids": torch.tensor([1, 9]), "Out@GRAD": torch.ones(2, 4)},
                     attrs, {"W@GRAD": [True]})
    assert good["W@GRAD"].to_dense()[9].eq(1).all()
    for ids in ([1, 10], [-1, 2], [10 ** 8, 0]):
        with pytest.raises(guards.GuardError, match=r"embedding_backward.default': argument "
                                                    r"'indices' holds"):
            od.kernel({"W": w, "Ids": torch.tensor(ids), "Out@GRAD": torch.ones(2, 4)}, attrs,
                      {"W@GRAD": [True]})
    with pytest.raises(guards.GuardError, match="argument 'grad'"):
        od.kernel({"W": w, "Ids": torch.tensor([1, 2]), "Out@GRAD": torch.ones(3, 4)}, attrs,
                  {"W@GRAD": [True]})


# --- programs ----------------------------------------------------------------------------------
def _bn_program(channels, stats, mode="train"):
    """``(main, startup)`` text: data [-1, C, 4, 4] -> batch_norm -> mean, SGD.

    ``stats``: ``"declared"``: Scale/Bias/Mean/Variance declared and made with 1 element;
    ``"undeclared"``: declared without a shape (inference skips the op), made with 1;
    ``"whole"``: as the builder made them, C elements.
    """
    main, startup = se.Program(), se.Program()
    with se.program_guard(main, startup):
        x = se.layers.data("x", shape=[-1, channels, 4, 4], dtype="float32")
        y = se.layers.batch_norm(x, is_test=mode == "test")
        se.optimizer.SGD(learning_rate=0.01).minimize(se.layers.mean(y))
    if stats == "whole":
        return str(main), str(startup)
    new = "float32[1]" if stats == "declared" else "float32"
    main_text = str(main).replace(f"float32[{channels}] persistable", f"{new} persistable")
    if stats == "declared":  # the saved statistics too, as the statistics make them
        main_text = main_text.replace(f"float32[{channels}] stop_gradient",
                                      "float32[1] stop_gradient")
    start_text = str(startup).replace(f"float32[{channels}] persistable",
                                      f"{new} persistable").replace(f"shape=[{channels}]",
                                                                    "shape=[1]")
    assert main_text.count(f"{new} persistable") == 4
    return main_text, start_text


def test_validation_refuses_declared_statistics_that_break_the_guard():
    main, _ = _bn_program(8, "declared")
    with pytest.raises(se.ProgramError, match=r"op 0 \(batch_norm\).*native_batch_norm.default"
                                              r"': argument 'weight' has 1 elements"):
        program_from_text(main).validate()


@pytest.mark.parametrize("path", ["sequential", "compiled", "inductor"])
def test_values_the_declarations_did_not_bound_are_an_op_error_on_every_path(path):
    # the compiled path emits a call of the op's kernel (runtime/codegen.py), which holds
    # the guarded overload; Inductor traces that kernel, and the guard refuses while tracing
    main_text, start_text = _bn_program(8, "undeclared")
    main, startup = program_from_text(main_text), program_from_text(start_text)
    main.validate()  # nothing declared to check: only the run sees the values
    xs = torch.randn(4, 8, 4, 4)
    loss = main.global_block().ops[1].output("Out")[0]
    if path != "sequential":
        if path == "inductor":
            from ssaexec.runtime.inductor import check_compiler
            try:
                check_compiler("inductor", [se.CPUPlace(0)])
            except se.SSAExecError as e:
                pytest.skip(str(e))
        st = se.ExecutionStrategy(compiler="inductor" if path == "inductor" else None)
        pe = se.ParallelExecutor(places=se.cpu_places(2), main_program=main,
                                 startup_program=startup, loss_name=loss, scope=se.Scope(),
                                 exec_strategy=st)
        run = lambda: pe.run(feed={"x": xs}, fetch_list=[loss])  # noqa: E731
    else:
        exe, scope = se.Executor(se.CPUPlace()), se.Scope()
        exe.run(startup, scope=scope)
        run = lambda: exe.run(main, feed={"x": xs}, fetch_list=[loss], scope=scope)  # noqa: E731
    with pytest.raises(se.OpError, match=r"op #0 'batch_norm'.*native_batch_norm.default': "
                                         r"argument 'weight' has 1 elements") as info:
        run()
    assert isinstance(info.value.__cause__, guards.GuardError)


def _env():
    env = dict(os.environ, PYTHONPATH=str(ROOT), MALLOC_CHECK_="3", MALLOC_PERTURB_="204")
    if os.path.exists(MALLOC_DEBUG):
        env["LD_PRELOAD"] = MALLOC_DEBUG
    return env


def _ssaexec_run(cwd, *args):
    """``ssaexec run ...`` in a subprocess under glibc's checking allocator."""
    return subprocess.run([sys.executable, "-m", "ssaexec", "run", *map(str, args),
                           "--places", "cpu:1", "--steps", "2", "--no-progress"],
                          cwd=cwd, env=_env(), capture_output=True, text=True, timeout=300)


def _assert_clean_refusal(r, status, *names):
    """Exit ``status`` (1 or 2, never a signal) with one clean line naming one of ``names``."""
    assert r.returncode == status, (r.returncode, r.stderr[-3000:])
    assert "internal error" not in r.stderr and "Traceback" not in r.stderr, r.stderr[-3000:]
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("ssaexec: error:"), r.stderr[-3000:]
    assert any(n in last for n in names), last
    return last


@pytest.mark.parametrize("form, channels, stats, mode", [
    ("ssa", 8, "declared", "train"), ("json", 256, "declared", "test"),
    ("ssa", 256, "undeclared", "train"), ("json", 8, "undeclared", "test")])
def test_native_files_with_one_element_statistics(tmp_path, form, channels, stats, mode):
    main_text, start_text = _bn_program(channels, stats, mode)
    main, startup = program_from_text(main_text), program_from_text(start_text)
    se.save_program(main, tmp_path / f"m.{form}")
    se.save_program(startup, tmp_path / f"m.startup.{form}")
    r = _ssaexec_run(tmp_path, f"m.{form}", "--batch", "2")
    if stats == "declared":  # refused when validated: exit 2, at the op
        last = _assert_clean_refusal(r, 2, "(batch_norm)")
    else:  # only the run sees the values: an OpError of the op, exit 1
        last = _assert_clean_refusal(r, 1, "op #0 'batch_norm'")
    assert f"'{BN}': argument 'weight' has 1 elements ([1]), not {channels}" in last


def _pir_bn(channels, stats):
    """A Paddle PIR program (cut from the heldout fixture): data [-1, C, 4, 4] ->
    batch_norm_ -> fetch, its four statistics declared and stored with ``stats`` elements."""
    import copy
    import json
    doc = json.loads((ROOT / "tests/fixtures/paddle/pir/heldout.json").read_text())
    ops = doc["program"]["regions"][0]["blocks"][0]["ops"]
    params = {o["A"][3]: o for o in ops if o["#"] == "p" and o["A"][3].startswith("batch_norm")}
    data = copy.deepcopy(next(o for o in ops if o["#"] == "1.data"))
    bn = next(o for o in ops if o["#"] == "1.batch_norm_")
    fetch = next(o for o in ops if o["#"] == "1.fetch")
    assert len(params) == 4 and bn["A"][0]["N"] == "is_test"
    for p in params.values():
        p["O"]["TT"]["D"][1] = [stats]
    shape = [-1, channels, 4, 4]
    data["A"][1]["AT"]["D"] = data["O"][0]["TT"]["D"][1] = shape
    bn["I"][0]["%"] = data["O"][0]["%"]
    bn["O"][0]["TT"]["D"][1] = fetch["O"][0]["TT"]["D"][1] = shape
    for k in range(1, 5):  # the updated and saved statistics, as the statistics make them
        bn["O"][k]["TT"]["D"][1] = [stats]
    fetch["I"][0]["%"] = bn["O"][0]["%"]
    doc["program"]["regions"][0]["blocks"][0]["ops"] = list(params.values()) + [data, bn, fetch]
    return json.dumps(doc), {n: torch.ones(stats) for n in sorted(params)}


def _pdmodel_bn(channels, stats, declared):
    """A legacy Paddle inference model (tests/paddle_models.py's CNN, conv2d over
    ``channels`` filters) whose batch norm statistics are stored with ``stats`` elements,
    and declared so when ``declared``."""
    import paddle_models as pm
    from ssaexec.frontends.paddle.schema import messages
    m = pm.cnn_inference(out_channels=channels)
    prog = messages().ProgramDesc()
    prog.ParseFromString(m.main)
    bn = {"batch_norm_0.w_0", "batch_norm_0.b_0", "batch_norm_0.w_1", "batch_norm_0.w_2"}
    saved = {"batch_norm_0.tmp_0", "batch_norm_0.tmp_1"}  # as the statistics make them
    for v in prog.blocks[0].vars:
        if declared and v.name in bn | saved:
            del v.type.lod_tensor.tensor.dims[:]
            v.type.lod_tensor.tensor.dims.extend([stats])
    params = {k: torch.tensor(v)[:stats] if k in bn else torch.tensor(v)
              for k, v in m.params.items()}
    return prog.SerializeToString(), params


@pytest.mark.parametrize("channels", [8, 64])
def test_paddle_pir_file_with_one_element_statistics(tmp_path, channels):
    from ssaexec.frontends.paddle.params import save_combined
    doc, params = _pir_bn(channels, 1)
    (tmp_path / "m.json").write_text(doc)
    save_combined(tmp_path / "m.pdiparams", params)
    # the command line
    r = _ssaexec_run(tmp_path, "m.json", "--startup", "m.pdiparams", "--finetune",
                     "mse:fetch_name_0", "--batch", "1")
    last = _assert_clean_refusal(r, 2, "(batch_norm)")
    assert f"argument 'weight' has 1 elements ([1]), not {channels}" in last
    if channels != 8:
        return
    # the same file with its statistics whole runs
    doc, params = _pir_bn(channels, channels)
    (tmp_path / "m.json").write_text(doc)
    save_combined(tmp_path / "m.pdiparams", params)
    r = _ssaexec_run(tmp_path, "m.json", "--startup", "m.pdiparams", "--finetune",
                     "mse:fetch_name_0", "--batch", "1")
    assert r.returncode == 0, r.stderr[-3000:]


@pytest.mark.parametrize("channels, declared", [(8, True), (64, False)])
def test_paddle_pdmodel_with_one_element_statistics(tmp_path, channels, declared):
    from ssaexec.frontends.paddle.params import save_combined
    main, params = _pdmodel_bn(channels, 1, declared)
    (tmp_path / "m.pdmodel").write_bytes(main)
    save_combined(tmp_path / "m.pdiparams", params)
    r = _ssaexec_run(tmp_path, "m.pdmodel", "--startup", "m.pdiparams", "--finetune",
                     "mse:softmax_0.tmp_0", "--batch", "1")
    if declared:  # the program agrees with its file, and validation refuses both
        last = _assert_clean_refusal(r, 2, "(batch_norm)")
        assert f"argument 'weight' has 1 elements ([1]), not {channels}" in last
    else:  # a value that contradicts its declaration is refused where it enters
        _assert_clean_refusal(r, 2, "batch_norm_0.")


def _with_short_input(main_text, start_text, op_type, slot, shape):
    """The program with ``op_type``'s input ``slot`` read from a new persistable var,
    declared without a shape and made by the startup program with ``shape``."""
    lines = main_text.splitlines()
    at = next(k for k, ln in enumerate(lines) if f"= {op_type}(" in ln)
    old = lines[at].split(f"{slot}=")[1].split(",")[0].split(")")[0]
    lines[at] = lines[at].replace(f"{slot}={old}", f"{slot}=short")
    head = next(k for k, ln in enumerate(lines) if ln.startswith("block 0"))
    lines.insert(head + 1, "  var short : float32 persistable")
    start = start_text.splitlines()
    head = next(k for k, ln in enumerate(start) if ln.startswith("block 0"))
    start.insert(head + 1, "  var short : float32 persistable")
    start.insert(len(start) - 1, f'  short = fill_constant() {{shape={shape}, value=0.5, '
                                 'dtype="float32"}')
    return "\n".join(lines) + "\n", "\n".join(start) + "\n"


def _conv_program():
    main, startup = se.Program(), se.Program()
    with se.program_guard(main, startup):
        x = se.layers.data("x", shape=[-1, 3, 6, 6], dtype="float32")
        y = se.layers.conv2d(x, num_filters=4, filter_size=3)
        se.optimizer.SGD(learning_rate=0.01).minimize(se.layers.mean(y))
    return str(main), str(startup)


@pytest.mark.parametrize("case", ["batch_norm_grad SavedMean", "conv2d_grad Output@GRAD"])
def test_grads_with_short_statistics_or_another_batch_are_an_op_error(tmp_path, case):
    op_type, slot = case.split()
    if op_type == "batch_norm_grad":
        main, start = _with_short_input(*_bn_program(8, "whole"), op_type, slot, [1])
        want = "native_batch_norm_backward.default': argument 'save_mean' has 1 elements"
    else:
        main, start = _with_short_input(*_conv_program(), op_type, slot, [1, 4, 4, 4])
        want = "convolution_backward.default': argument 'grad_output' has shape [1, 4, 4, 4]"
    (tmp_path / "m.ssa").write_text(main)
    (tmp_path / "m.startup.ssa").write_text(start)
    r = _ssaexec_run(tmp_path, "m.ssa", "--batch", "2")
    last = _assert_clean_refusal(r, 1, f"'{op_type}'")
    assert want in last
