"""What mixed precision keeps for the backward pass (ssaexec.program.amp), counted on CPU.

The first GPU run (ResNet-50 b32, docs/gpu.md) measured ssaexec's bf16 and fp16 steps at
2.55x eager's peak memory and 0.52-0.56x its speed: batch norm was in the fp32 list, so
each conv-BN-ReLU block cast the conv's low output up to fp32 for batch norm, and the
batch norm and ReLU outputs stayed fp32 until the next conv cast them down again; every
one of those copies lived until the backward pass. Autocast runs batch norm on its
input's type. These tests count, from the rewritten program alone, the bytes of the
activations the backward pass reads and the casts a step makes, so a policy change that
brings the copies back fails here without a GPU.
"""

import collections
import math

import pytest

from ssaexec.program.example_models import build_resnet, make_optimizer
from ssaexec.program.amp import AMP_DTYPES, amp_program

SIZE = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}


def _resnet():
    main, _, _ = build_resnet(depth=18, image_size=32, classes=10,
                              optimizer=make_optimizer("sgd", 0.01))
    return main


def kept_for_backward(program):
    """Bytes a sample's activations keep from the forward pass to the backward pass: each
    non-persistable value with a batch dimension that a forward op makes and a backward
    op reads (shapes from the program; the batch dimension counts 1)."""
    block = program.global_block()
    made = {n for op in block.ops if op.role in ("forward", "loss") for n in op.output_names()}
    read = {n for op in block.ops if op.role == "backward" for n in op.input_names()}
    total = 0
    for n in made & read:
        v = block.var(n)
        if not v.persistable and v.dtype in SIZE and -1 in tuple(v.shape):
            total += math.prod(abs(d) for d in v.shape) * SIZE[v.dtype]
    return total


@pytest.mark.parametrize("amp", sorted(AMP_DTYPES))
def test_amp_keeps_about_half_the_activation_bytes_of_fp32(amp):
    main = _resnet()
    fp32, low = kept_for_backward(main), kept_for_backward(amp_program(main, amp))
    # every kept activation in 2 bytes instead of 4 is 0.5; fp32 copies of them (the
    # first GPU run's policy) made it 1.19
    assert low <= 0.52 * fp32, (amp, low, fp32, low / fp32)


@pytest.mark.parametrize("amp", sorted(AMP_DTYPES))
def test_batch_norm_runs_on_the_low_type_as_under_autocast(amp):
    low = AMP_DTYPES[amp]
    block = amp_program(_resnet(), amp).global_block()
    norms = [op for op in block.ops if op.type == "batch_norm"]
    assert norms
    for op in norms:
        assert block.var(op.input("X")[0]).dtype == low
        assert block.var(op.output("Y")[0]).dtype == low
        # its statistics and parameters stay fp32 (master state)
        assert {block.var(op.input(s)[0]).dtype
                for s in ("Scale", "Bias", "Mean", "Variance")} == {"float32"}


def test_a_resnet_step_casts_each_weight_once_and_no_activation_up():
    main = _resnet()
    block = amp_program(main, "bf16").global_block()
    casts = collections.Counter()
    for op in block.ops:
        if op.type == "cast":
            casts[(op.role, block.var(op.input("X")[0]).dtype, op.attrs["out_dtype"])] += 1
    weights = sum(1 for op in main.global_block().ops if op.type in ("conv2d", "mul"))
    # forward: each conv/fc weight and the image, down to bf16; nothing goes back up
    assert casts[("forward", "float32", "bfloat16")] == weights + 1
    assert not any(k for k in casts if k[0] == "forward" and k[2] == "float32"), casts
    # backward: each weight gradient back to fp32 (fp32 all-reduce, fp32 master weights)
    # and the mixed-type adds' gradients to the type inference gives them; 113 casts in
    # all before batch norm ran on the low type, 60 now (ResNet-18)
    assert casts[("backward", "bfloat16", "float32")] == weights
    assert sum(casts.values()) <= 60, casts
