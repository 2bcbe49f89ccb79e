"""Guards of ATen kernels that trust their arguments (issue 29, ``ssaexec.ops.guards``).

Acceptance: the program whose ``max_pool2d_with_indices_backward`` wrote at a
program-given index (SIGSEGV; a silent write before the buffer with a negative
index) ends with a clean error naming the op, through the CLI and on both
execution paths; statistics, attention results and offsets of the wrong shape
are refused, by validation where shapes are declared and at run time where they
are not; strided statistics reach the kernel contiguous; factory ops, padding,
upsampling, ``expand`` and friends refuse an allocation above
``max_tensor_elements`` before it happens; and the guards refuse nothing that
torch's own models produce (the fuzzer's seeds, tests/ops/test_kernel_fuzz.py).
"""

import resource
import subprocess
import sys

import pytest
import torch

import ssaexec as se
from ssaexec.core.limits import limits
from ssaexec.ops import guards, guards_hand
from ssaexec.ops.aten import aten_op_def
from ssaexec.ops.policy import ALLOWED
from ssaexec.program.text import program_from_text

HEADER = "ssaexec-program v1 random_seed=0\n\n"


def ssa(*lines):
    """A one-block text program from var and op lines."""
    return HEADER + "block 0 parent=-1 {\n" + "".join(f"  {ln}\n" for ln in lines) + "}\n"


POOL = "aten.max_pool2d_with_indices_backward.default"


def pool_program(index):
    """The program of issue 29: max-pool backward at a program-given index."""
    return ssa(
        "var x : float32[1, 1, 4, 4]",
        "var pooled : float32[1, 1, 2, 2]",
        "var idx : int64[1, 1, 2, 2]",
        "var g : float32[1, 1, 4, 4]",
        "var loss : float32[]",
        "x = aten.full.default(X=[]) {size=[1, 1, 4, 4], fill_value=1.0}",
        "pooled = aten.full.default(X=[]) {size=[1, 1, 2, 2], fill_value=1.0}",
        f"idx = aten.full.default(X=[]) {{size=[1, 1, 2, 2], fill_value={index}, "
        'dtype="int64"}',
        f'g = {POOL}(X=[pooled, x, idx]) {{grad_output="X[0]", self="X[1]", '
        "kernel_size=[2, 2], stride=[2, 2], padding=[0, 0], dilation=[1, 1], ceil_mode=false, "
        'indices="X[2]"}',
        'loss = aten.sum.default(X=g) {self="X[0]"}')


def op(op_type):
    """What both execution paths call for ``op_type``: the overload behind its guard."""
    return aten_op_def(op_type).overload


# --- the table --------------------------------------------------------------------------------
def test_every_guarded_op_is_allowed_and_bound_to_its_guard():
    # a guarded overload off the program allowlist is one only hand-written ops call
    assert set(guards.TRUSTS) <= ALLOWED | guards.HAND_WRITTEN_ONLY
    assert not guards.HAND_WRITTEN_ONLY & ALLOWED
    assert guards.HAND_WRITTEN_ONLY <= set(guards_hand.HAND_WRITTEN)
    kinds = {"index", "shape", "layout", "size", "value"}
    for op_type, (trusts, note) in guards.TRUSTS.items():
        assert trusts and set(trusts) <= kinds and note, op_type
        bound = guards_hand.kernel(op_type) if op_type in guards.HAND_WRITTEN_ONLY else \
            op(op_type)
        assert isinstance(bound, guards.GuardedOverload), op_type
        assert bound._schema is bound.overload._schema
    # an op nothing is trusted of costs nothing: its OpOverload is called directly
    assert op("aten.add.Tensor") is torch.ops.aten.add.Tensor
    assert POOL in guards.TRUSTS and "index" in guards.TRUSTS[POOL][0]


# --- index values -----------------------------------------------------------------------------
@pytest.mark.parametrize("index", [100000000, -3])
def test_pool_backward_at_a_bad_index_is_a_clean_cli_error(tmp_path, index):
    (tmp_path / "x.ssa").write_text(pool_program(index))
    r = subprocess.run([sys.executable, "-m", "ssaexec", "run", "x.ssa", "--loss", "loss",
                        "--steps", "1", "--places", "cpu:1"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode in (1, 2), (r.returncode, r.stderr[-2000:])  # not -11 (SIGSEGV)
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("ssaexec: error:") and POOL in last, r.stderr[-2000:]
    assert f"argument 'indices' holds {index}, outside [0, 16)" in last
    assert "internal error" not in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("index", [16, -1])
def test_pool_backward_index_is_checked_on_both_execution_paths(index):
    prog = program_from_text(pool_program(index))
    prog.validate()  # values are data: only the run can see them
    with pytest.raises(se.ProgramError, match=rf"'{POOL}': argument 'indices' holds {index}"):
        se.Executor(se.CPUPlace()).run(prog, fetch_list=["loss"], scope=se.Scope())
    pe = se.ParallelExecutor(places=se.cpu_places(1), main_program=prog, loss_name="loss")
    with pytest.raises(se.ProgramError, match=rf"'{POOL}': argument 'indices' holds {index}"):
        pe.run(fetch_list=["loss"])
    # in range, it is the kernel's result
    good = program_from_text(pool_program(5))
    loss, = se.Executor(se.CPUPlace()).run(good, fetch_list=["loss"], scope=se.Scope())
    assert float(loss) == 4.0


def test_embedding_backward_and_bag_indices_are_checked():
    grad = torch.ones(2, 3)
    with pytest.raises(se.ProgramError, match="argument 'indices' holds 10, outside"):
        op("aten.embedding_dense_backward.default")(grad, torch.tensor([1, 10]), 10, -1, False)
    w, idx = torch.randn(10, 3), torch.tensor([1, 2, 3, 4])
    bag = op("aten._embedding_bag.default")
    bag(w, idx, torch.tensor([0, 2]))
    with pytest.raises(se.ProgramError, match="'offsets' decreases"):
        bag(w, idx, torch.tensor([0, 3, 1]))
    with pytest.raises(se.ProgramError, match="'offsets' holds -1"):
        bag(w, idx, torch.tensor([-1, 2]))
    with pytest.raises(se.ProgramError, match="'offsets' is empty"):
        bag(w, idx, torch.tensor([], dtype=torch.int64))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_index_ops_are_checked_before_a_device_side_assert():
    x = torch.randn(3, 5, device="cuda")
    bad = torch.tensor([[0, 7]], device="cuda")
    with pytest.raises(se.ProgramError, match="argument 'index' holds 7"):
        op("aten.gather.default")(x, 1, bad)
    with pytest.raises(se.ProgramError, match=r"argument 'indices\[0\]' holds 7"):
        op("aten.index.Tensor")(x, [bad.view(-1)])
    op("aten.gather.default")(x, 1, torch.tensor([[0, 4]], device="cuda"))


# --- shapes of statistics and other secondary inputs ------------------------------------------
def _layer_norm_case():
    x = torch.randn(2, 3, 5)
    out, mean, rstd = torch.ops.aten.native_layer_norm(x, [5], torch.ones(5), torch.zeros(5),
                                                       1e-5)
    return [torch.ones_like(out), x, [5], mean, rstd, torch.ones(5), torch.zeros(5),
            [True, True, True]]


def _batch_norm_case():
    x = torch.randn(2, 3, 4, 4)
    return [x, torch.ones(3), torch.zeros(3), torch.zeros(3), torch.ones(3), 0.1, 1e-5]


def _attention_backward_case():
    q, k, v = (torch.randn(1, 2, 4, 8) for _ in range(3))
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v)
    return [torch.ones_like(out), q, k, v, out, lse, 0.0, False]


HOSTILE = [
    # (op, make the good arguments, position to replace, bad value, message)
    ("aten.native_layer_norm_backward.default", _layer_norm_case, 3, torch.zeros(1),
     "argument 'mean' has 1 elements"),
    ("aten.native_layer_norm_backward.default", _layer_norm_case, 4, torch.zeros(2, 3, 0),
     "argument 'rstd' has 0 elements"),
    ("aten.native_layer_norm_backward.default", _layer_norm_case, 0, torch.ones(1, 3, 5),
     "argument 'grad_out' has shape"),
    ("aten._native_batch_norm_legit_no_training.default", _batch_norm_case, 4, torch.ones(1),
     "argument 'running_var' has 1 elements"),
    ("aten._native_batch_norm_legit_no_training.default", _batch_norm_case, 3, torch.ones(0),
     "argument 'running_mean' has 0 elements"),
    ("aten._scaled_dot_product_flash_attention_for_cpu_backward.default",
     _attention_backward_case, 5, torch.zeros(1, 2, 3), "argument 'logsumexp' has shape"),
    ("aten._scaled_dot_product_flash_attention_for_cpu_backward.default",
     _attention_backward_case, 1, torch.zeros(3, 2, 4, 8), "argument 'key' has shape"),
]


@pytest.mark.parametrize("op_type,make,pos,bad,message", HOSTILE,
                         ids=[f"{h[0].split('.')[1]}-{h[4].split(chr(39))[1]}" for h in HOSTILE])
def test_hostile_statistics_shapes_are_refused(op_type, make, pos, bad, message):
    args = make()
    op(op_type)(*args)  # the good call runs
    args[pos] = bad
    with pytest.raises(se.ProgramError, match=rf"op '{op_type}': {message}"):
        op(op_type)(*args)
    # on meta tensors too: shape inference (validation) refuses what the run would
    meta = [a.to("meta") if isinstance(a, torch.Tensor) else a for a in args]
    with pytest.raises(se.ProgramError, match=message):
        op(op_type)(*meta)


def test_batch_norm_backward_needs_the_statistics_its_mode_reads():
    x, w = torch.randn(2, 3, 4), torch.ones(3)
    s = torch.zeros(3)
    bnb = op("aten.native_batch_norm_backward.default")
    bnb(x, x, w, s, s + 1, None, None, False, 1e-5, [True, True, True])  # eval: running stats
    with pytest.raises(se.ProgramError, match="'running_mean' is absent, but train=False"):
        bnb(x, x, w, None, None, s, s, False, 1e-5, [True, True, True])
    with pytest.raises(se.ProgramError, match="'save_invstd' has 2 elements"):
        bnb(x, x, w, None, None, s, torch.ones(2), True, 1e-5, [True, True, True])
    no_stats = op("aten._native_batch_norm_legit.no_stats")
    with pytest.raises(se.ProgramError, match="'training' is false"):
        no_stats(x, w, w, False, 0.1, 1e-5)


def test_validation_refuses_statistics_of_the_wrong_declared_shape():
    def program(mean_shape):
        return program_from_text(ssa(
            "var x : float32[-1, 3, 5] data", "var g : float32[-1, 3, 5] data",
            f"var m : float32{mean_shape}", "var r : float32[-1, 3, 1]",
            "var y : float32[-1, 3, 5]", "var dx : float32[-1, 3, 5]",
            "var dw : float32[5]", "var db : float32[5]",
            '{Out=[y, m, r]} = aten.native_layer_norm.default(X=x) {input="X[0]", '
            'normalized_shape=[5], eps=0.00001}',
            "{Out=[dx, dw, db]} = aten.native_layer_norm_backward.default(X=[g, x, m, r]) "
            '{grad_out="X[0]", input="X[1]", normalized_shape=[5], mean="X[2]", rstd="X[3]", '
            "output_mask=[true, false, false]}"))
    program("[-1, 3, 1]").validate()
    text = ssa("var x : float32[-1, 3, 5] data", "var g : float32[-1, 3, 5] data",
               "var m : float32[1] data", "var r : float32[-1, 3, 1] data",
               "var dx : float32[-1, 3, 5]",
               "{Out=[dx, @EMPTY@, @EMPTY@]} = aten.native_layer_norm_backward.default(X=[g, x, m, r]) "
               '{grad_out="X[0]", input="X[1]", normalized_shape=[5], mean="X[2]", '
               'rstd="X[3]", output_mask=[true, false, false]}')
    with pytest.raises(se.ProgramError, match=r"block 0, op 0 .*argument 'mean' has 1 elements"):
        program_from_text(text).validate()


def test_strided_statistics_reach_the_kernel_contiguous():
    args = _layer_norm_case()
    want = torch.ops.aten.native_layer_norm_backward(*args)
    gapped = torch.full([2 * args[4].numel()], float("nan"))[::2].view(args[4].shape)
    gapped.copy_(args[4])
    assert not gapped.is_contiguous()
    args[4] = gapped
    got = op("aten.native_layer_norm_backward.default")(*args)
    for a, b in zip(want, got, strict=True):
        torch.testing.assert_close(a, b)


# --- sizes: every allocation checked before it happens ----------------------------------------
LIMIT = 2 ** 20
BIG = LIMIT * 2


def _allocating_calls():
    x4, x3 = torch.ones(1, 1, 4, 4), torch.ones(1, 2, 8)
    return [
        ("aten.arange.default", (BIG,), {}),
        ("aten.arange.start_step", (0, LIMIT, 0.25), {}),  # end within bounds, 4x as many
        ("aten.empty_strided.default", ([4], [2 ** 30]), {}),  # 4 elements, 4 GiB storage
        ("aten.empty.memory_format", ([BIG],), {}),
        ("aten.full.default", ([1024, 2048], 1.0), {}),
        ("aten.zeros.default", ([BIG],), {}),
        ("aten.rand.default", ([BIG],), {}),
        ("aten.randn.default", ([BIG],), {}),
        ("aten.randperm.default", (BIG,), {}),
        ("aten.new_empty.default", (x3, [BIG]), {}),
        ("aten.new_zeros.default", (x3, [BIG]), {}),
        ("aten.expand.default", (torch.ones(1), [BIG]), {}),
        ("aten.repeat.default", (x3, [1, 1, BIG]), {}),
        ("aten.constant_pad_nd.default", (x3, [0, BIG]), {}),
        ("aten.replication_pad2d.default", (x4, [0, BIG, 0, 0]), {}),
        ("aten.upsample_nearest2d.vec", (x4, None, [1000.0, 1000.0]), {}),
        ("aten.upsample_bilinear2d.vec", (x4, [2048, 1024], False, None), {}),
        ("aten._adaptive_avg_pool2d.default", (x4, [2048, 1024]), {}),
        ("aten.select_backward.default", (torch.ones(4), [BIG, 4], 0, 0), {}),
        ("aten.slice_backward.default", (torch.ones(1, 4), [BIG, 4], 0, 0, 1, 1), {}),
        ("aten.embedding_dense_backward.default", (torch.ones(2, 4), torch.tensor([0, 1]),
                                                   BIG, -1, False), {}),
        ("aten.convolution.default", (x4, torch.ones(1, 1, 1, 1), None, [1, 1], [1024, 1024],
                                      [1, 1], False, [0, 0], 1), {}),
        ("aten._fft_c2r.default", (torch.ones(3, dtype=torch.complex64), [0], 0, BIG), {}),
    ]


@pytest.mark.parametrize("op_type,args,kwargs", _allocating_calls(),
                         ids=[c[0][5:] for c in _allocating_calls()])
def test_allocations_are_checked_against_the_limit_first(op_type, args, kwargs):
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with limits(max_tensor_elements=LIMIT):
        with pytest.raises(se.ProgramError, match=rf"op '{op_type}': .*more than one tensor "
                                                  r"may hold .*max_tensor_elements=1048576"):
            op(op_type)(*args, **kwargs)
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss
    assert grown_kib < 4 * LIMIT // 1024 * 4, grown_kib  # nothing of BIG elements was made


def test_arange_past_the_limit_through_a_program_is_refused():
    # end is a size expression (its value within bounds), step a fraction: 4x the elements
    text = ssa("var x : float32[-1, 4] data", "var a : float32",
               'a = aten.arange.start_step(X=[x]) {start=0, end="s0*65536", step=0.25, '
               '"@sym"=[["s0", 0, 0]], dtype="float32"}')
    prog = program_from_text(text)
    with limits(max_tensor_elements=LIMIT):
        with pytest.raises(se.ProgramError, match="aten.arange.start_step.*more than one "
                                                  "tensor may hold"):
            prog.validate()
        with pytest.raises(se.ProgramError, match="aten.arange.start_step.*more than one "
                                                  "tensor may hold"):
            se.Executor(se.CPUPlace()).run(prog, feed={"x": torch.ones(8, 4)},
                                           fetch_list=["a"], scope=se.Scope())
    a, = se.Executor(se.CPUPlace()).run(prog, feed={"x": torch.ones(1, 4)}, fetch_list=["a"],
                                        scope=se.Scope())
    assert a.shape == (262144,)


# --- programs built in this process -----------------------------------------------------------
def test_only_programs_built_in_this_process_skip_the_guards(tmp_path):
    # from_torch builds a program from the caller's own module: its ATen ops call the bare
    # kernels (the guards cost time). The same program read back from a file, and anything
    # copied from that, runs guarded; copies of the trusted one stay trusted.
    from ssaexec.runtime.op_call import OpCall
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3, padding=1), torch.nn.MaxPool2d(2),
                                torch.nn.Flatten(), torch.nn.Linear(2 * 2 * 2, 3))
    feeds = {"input": torch.randn(4, 1, 4, 4), "target": torch.randint(0, 3, (4,))}
    main, startup, loss = se.from_torch(
        model, feeds, loss_fn=lambda out, y: torch.nn.functional.cross_entropy(out, y),
        optimizer=se.optimizer.SGD(0.1))
    se.save_program(main, tmp_path / "main.json")
    se.save_program(startup, tmp_path / "startup.json")
    fmain = se.load_program(tmp_path / "main.json", validate=True)
    fstartup = se.load_program(tmp_path / "startup.json")
    assert main.trusted and main.clone().trusted
    assert not fmain.trusted and not fmain.clone().trusted

    pool = [op for op in main.global_block().ops if op.type == POOL]
    assert pool, [op.type for op in main.global_block().ops]
    od = aten_op_def(POOL)
    assert OpCall(pool[0], 0, main).kernel is od.bare_kernel
    assert OpCall(pool[0], 0, fmain).kernel is od.kernel
    assert od.overload_for(main) is od.bare_overload is od.overload.overload
    assert isinstance(od.overload_for(fmain), guards.GuardedOverload)

    # guards change no value: the same losses, trusted or from the file, both paths
    def losses(m, s, parallel):
        if parallel:
            pe = se.ParallelExecutor(se.cpu_places(1), m, s, loss, scope=se.Scope())
            try:
                return [float(pe.run([loss], feed=feeds)[0]) for _ in range(3)]
            finally:
                pe.close()
        exe, scope = se.Executor(se.CPUPlace()), se.Scope()
        exe.run(s, scope=scope)
        return [float(exe.run(m, feed=feeds, fetch_list=[loss], scope=scope)[0])
                for _ in range(3)]
    for parallel in (False, True):
        assert losses(main, startup, parallel) == losses(fmain, fstartup, parallel)
