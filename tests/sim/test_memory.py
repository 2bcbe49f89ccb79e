"""The per-device memory prediction under ZeRO (ssaexec.sim.memory, ``ssaexec stats --zero``).

* the formula against the ZeRO paper's example (7.5B parameters, 64 GPUs, Adam in mixed
  precision: 120 / 31.4 / 16.6 / 1.9 GB per device for stages 0-3);
* ``stats --zero`` on an example program against the runtime's own tensor accounting
  (``harness.place_memory``) of the same step on 4 CPU places, stages 0, 1 and 3:
  parameters and optimizer state exactly, the parts the prediction bounds (gradients,
  gathered parameters, activations) from above and within 10 %;
* the activation walk: views share storage, checkpointing drops and recomputes.
"""

import json
import math

import pytest

import ssaexec as se
from ssaexec.cli import main as cli_main
from ssaexec.core.errors import SSAExecError
from ssaexec.data.synthetic import synthetic_feed
from ssaexec.harness.place_memory import measure_step
from ssaexec.program import layers as L
from ssaexec.program.builder import program_guard
from ssaexec.program.defaults import loss_var
from ssaexec.program.desc import Program
from ssaexec.sim.memory import activation_peak, predict_memory, zero_bytes

EXAMPLES = __import__("pathlib").Path(__file__).resolve().parents[2] / "examples"


# --- the formula -------------------------------------------------------------------------------

@pytest.mark.parametrize("stage,paper_gb", [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_the_zero_papers_example(stage, paper_gb):
    # Rajbhandari et al. 2020, figure 1: Psi = 7.5B, N_d = 64, K = 12 (fp32 master
    # copy, momentum, variance), fp16 parameters and gradients
    per_device = sum(zero_bytes(7_500_000_000, 64, stage, 2, 2, 12))
    assert round(per_device / 1e9, 1) == paper_gb


def test_the_formula_shards_each_part_from_its_stage():
    n, w = 1001, 4  # ceil(1001 / 4) = 251: the last rank's slice is padded
    assert zero_bytes(n, w, 0, 4, 4, 8) == (4004, 4004, 8008)
    assert zero_bytes(n, w, 1, 4, 4, 8) == (4004, 4004, 251 * 8)
    assert zero_bytes(n, w, 2, 4, 4, 8) == (4004, 251 * 4, 251 * 8)
    assert zero_bytes(n, w, 3, 4, 4, 8) == (251 * 4, 251 * 4, 251 * 8)
    with pytest.raises(SSAExecError, match="zero stage"):
        zero_bytes(n, w, 4, 4, 4, 8)


# --- stats --zero against the runtime's accounting ------------------------------------------

def _stats(capsys, *argv):
    assert cli_main(["stats", str(EXAMPLES / "mnist_mlp.json"), "--format", "json"]
                    + list(argv)) == 0
    return json.loads(capsys.readouterr().out)["zero_memory"]


@pytest.mark.parametrize("stage", [0, 1, 3])
def test_stats_zero_against_the_runtime_accounting(capsys, stage):
    predicted = _stats(capsys, "--places", "cpu:4", "--zero", str(stage), "--batch", "8")
    assert (predicted["world"], predicted["places"], predicted["processes"]) == (4, 4, 1)
    prog = se.load_program(str(EXAMPLES / "mnist_mlp.json"))
    startup = se.load_program(str(EXAMPLES / "mnist_mlp.startup.json"))
    loss = loss_var(prog)
    # one thread: the places' ops one at a time, so each sample (after every op) sees
    # every place between two ops. With the pool, a sample could land while another
    # place's op held its old and new gradient at once: 612 bytes over the bound, now and
    # then (stage 1)
    pe = se.ParallelExecutor(places=[se.CPUPlace(i) for i in range(4)], main_program=prog,
                             startup_program=startup, loss_name=loss,
                             build_strategy=se.BuildStrategy(zero_stage=stage),
                             exec_strategy=se.ExecutionStrategy(num_threads=1))
    try:  # a feed per place: each place's batch its own storage (8 samples)
        rep = measure_step(pe, prog, [loss], [synthetic_feed(prog, 8, i) for i in range(4)])
    finally:
        pe.close()
    b = predicted["bytes"]
    for place in rep["places"]:
        got = place["peak_kind"]
        assert got["params"] == b["parameters"]
        assert got["optimizer"] == b["optimizer_state"] + b["other"]
        for kind, part in (("grads", "gradients"), ("gathered", "gathered"),
                           ("activations", "activations")):
            assert got[kind] <= b[part] <= max(1.1 * got[kind], got[kind] + 1024), kind


def test_stats_zero_says_the_world_it_assumes(capsys):
    assert cli_main(["stats", str(EXAMPLES / "mnist_mlp.json"), "--places", "cpu:2",
                     "--processes", "3", "--zero", "3"]) == 0
    out = capsys.readouterr().out
    assert "ZeRO stage 3, world 6 = 2 places x 3 processes" in out
    plain = _stats(capsys, "--places", "cpu:2", "--processes", "3", "--zero", "0")
    three = _stats(capsys, "--places", "cpu:2", "--processes", "3", "--zero", "3")
    # stage 3 keeps about a sixth of the parameters and of the optimizer state
    assert three["bytes"]["parameters"] == pytest.approx(plain["bytes"]["parameters"] / 6,
                                                         rel=0.01)
    assert three["bytes"]["optimizer_state"] == pytest.approx(
        plain["bytes"]["optimizer_state"] / 6, rel=0.01)


def test_stats_zero_refuses_a_bad_prefetch(capsys):
    assert cli_main(["stats", str(EXAMPLES / "mnist_mlp.json"), "--zero", "3",
                     "--zero-prefetch", "-1"]) == 2
    assert "--zero-prefetch" in capsys.readouterr().err


# --- the activation walk --------------------------------------------------------------------

def test_views_share_their_inputs_storage():
    main, startup = Program(0), Program(0)
    with program_guard(main, startup):
        x = L.data("x", [-1, 256])
        a = L.relu(x)                                   # 1 KiB per sample
        v = L.reshape(L.reshape(a, [0, 16, 16]), [0, 256])  # views of a: no bytes
        L.mean(L.elementwise_add(a, v))
    # at the addition a (and its views) and the sum live, x is dead: 2 KiB a sample;
    # counting the views as values of their own would make it 3 or 4
    assert activation_peak(main, 4) == 2 * 4 * 256 * 4


def test_checkpointing_drops_what_it_does_not_save():
    main, startup = Program(0), Program(0)
    with program_guard(main, startup):
        x = L.data("x", [-1, 256])
        first = len(main.global_block().ops)
        h = L.fc(x, 256, act="relu")
        last = len(main.global_block().ops)
        loss = L.mean(L.fc(h, 1))
        se.program.optimizer.SGD(0.1).minimize(loss)
    plain = predict_memory(main, 1, batch=64).parts["activations"]
    kept = predict_memory(main, 1, batch=64, checkpoint=[(first, last, {h.name})])
    # the block's inner values (the product before the bias and the relu) die after
    # forward and come back in backward: the peak cannot grow, and here it shrinks
    assert kept.parts["activations"] < plain
    saved_all = predict_memory(main, 1, batch=64, checkpoint=[
        (first, last, set(main.global_block().vars))])
    assert saved_all.parts["activations"] == plain


def test_gathered_buffers_follow_prefetch_and_resharding():
    prog = se.load_program(str(EXAMPLES / "mnist_mlp.json"))
    full = sum(v.numel * 4 for v in prog.all_parameters())
    groups = predict_memory(prog, 4, 3, prefetch=0).parts["gathered"]
    two = predict_memory(prog, 4, 3, prefetch=1).parts["gathered"]
    kept = predict_memory(prog, 4, 3, reshard_after_forward=False).parts["gathered"]
    half = predict_memory(prog, 4, 3, gather_dtype="bf16").parts["gathered"]
    assert groups < two <= kept == full
    assert half * 2 == two
    assert math.isclose(predict_memory(prog, 4, 2).parts["gathered"], 0)
