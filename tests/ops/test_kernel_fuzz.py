"""The kernel fuzzer (``tests/kernel_fuzz.py``): no allowlisted ATen kernel misbehaves (issue
29), nor any hand-written op (issue 46).

Every allowlisted overload, and every hand-written op with tensor inputs (batch_norm,
conv2d, lookup_table ... and their grads, with their statistics, saved statistics,
gradients and ids mutated against the primary input's shape), is driven through
ssaexec's guarded call path with hostile values, in worker processes, against the
oracle of poisoned views (see the fuzzer's docstring). A crash, hang, out-of-bounds
read or write, unsound result, allocation over ``max_tensor_elements``, or a guard
refusing a call torch's own models make fails the test.

``make test`` runs the seeds and 10 random mutations per op (about 3,800 cases, 2,700
of them ATen calls, 1,100 hand-written ops; some 20 s). ``make fuzz`` sets
``SSAEXEC_KERNEL_FUZZ=long``: every mutation under each of the three layouts and 10
random pairs of mutations per seed (about 86,000 cases, a few minutes);
``SSAEXEC_KERNEL_FUZZ_SEED`` varies the random draws. Both print the counts.
"""

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import kernel_fuzz  # noqa: E402

from ssaexec.ops.policy import ALLOWED, is_allowed  # noqa: E402
from ssaexec.ops.schema import resolve_overload  # noqa: E402

LONG = os.environ.get("SSAEXEC_KERNEL_FUZZ", "") == "long"
SEED = os.environ.get("SSAEXEC_KERNEL_FUZZ_SEED", "0")
ARGS = (["--rounds", "3", "--pairs", "10", "--seed", SEED] if LONG
        else ["--sample", "10", "--seed", SEED])


def _allowed_overloads():
    return {t for t in ALLOWED if resolve_overload(t) is not None and is_allowed(t)}


def test_no_allowlisted_kernel_misbehaves_under_the_fuzzer():
    report = kernel_fuzz.drive(ARGS)  # ATen overloads and hand-written ops (--family all)
    print(f"\nkernel fuzz ({'long' if LONG else 'short'} run): {report.summary()}")
    hand = set(kernel_fuzz.record_hand_seeds())
    # every allowed overload, and every hand-written op the fuzzer seeds, ran
    assert report.ops == len(_allowed_overloads()) + len(hand)
    assert {"batch_norm", "batch_norm_grad", "conv2d", "conv2d_grad", "lookup_table",
            "lookup_table_grad", "relu_grad", "layer_norm_grad", "pool2d_grad"} <= hand
    assert hand <= report.ops_ok  # each ran clean at least as recorded
    assert not report.failures, "\n".join(
        f"{kind} {case[1] if case else '?'}: {detail}" for kind, case, detail in
        report.failures[:20])


@pytest.mark.timeout(300)
def test_the_oracle_finds_the_known_bugs_of_the_bare_kernels():
    # Without guards, the fuzzer finds issue 29's bugs: the heap write of max-pool
    # backward (a crash) and layer-norm backward's read past a short 'mean'.
    report = kernel_fuzz.drive([
        "--unguarded", "--match", "max_pool2d_with_indices_backward.default seed 0 "
        "indices:last=-100000000 (", "--match", "native_layer_norm_backward.default seed 0 "
        "mean:shape=[1] ("])
    kinds = {(kind.split("(")[0], case[1].split(" ")[0]) for kind, case, _ in report.failures}
    assert ("FAIL:crash", "aten.max_pool2d_with_indices_backward.default") in kinds, kinds
    assert ("FAIL:oob-read", "aten.native_layer_norm_backward.default") in kinds, kinds


@pytest.mark.timeout(300)
def test_the_oracle_finds_class_1_in_the_bare_hand_written_ops():
    # Issue 46: with every guard off (--unguarded), hand-written ops hand torch's kernels
    # what a program gives them. batch_norm in training writes 3 values into a 1-element
    # running mean (a heap write: the checking allocator aborts); batch_norm_grad reads past
    # a short saved mean; conv2d_grad reads past a gradient of another batch size.
    report = kernel_fuzz.drive([
        "--family", "hand", "--unguarded",
        "--match", "batch_norm seed 0 Mean:shape=[1] (",
        "--match", "batch_norm_grad seed 0 SavedMean:shape=[1] (",
        "--match", "conv2d_grad seed 0 Output@GRAD:shape=[1, 4, 4, 4] ("])
    kinds = {(kind, case[1].split(" ")[0]) for kind, case, _ in report.failures}
    assert ("FAIL:crash", "batch_norm") in kinds, kinds
    assert ("FAIL:oob-read", "batch_norm_grad") in kinds, kinds
    assert ("FAIL:oob-read", "conv2d_grad") in kinds, kinds
    # guarded, the same cases are refused, each naming its kernel
    report = kernel_fuzz.drive([
        "--family", "hand", "--match", "batch_norm seed 0 Mean:shape=[1] (",
        "--match", "batch_norm_grad seed 0 SavedMean:shape=[1] (",
        "--match", "conv2d_grad seed 0 Output@GRAD:shape=[1, 4, 4, 4] ("])
    assert not report.failures and report.status == {"refused": 3}, report.summary()
