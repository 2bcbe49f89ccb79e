"""validate_program: every check fires, and its message names block, op, type and var."""

import pytest

from ssaexec.core.errors import ProgramError
from ssaexec.program.desc import BlockRef, ProgramDesc
from ssaexec.program.validate import validate_program


def linear_program():
    """loss = mean(mul(x, w)); backward; sgd. Ops: 0 mul, 1 mean, 2 fill_constant,
    3 mean_grad, 4 mul_grad, 5 sgd."""
    p = ProgramDesc()
    b = p.global_block()
    b.create_var("x", [-1, 13], is_data=True, stop_gradient=True)
    b.create_var("w", [13, 1], persistable=True, is_parameter=True)
    b.create_var("lr", [], persistable=True, stop_gradient=True)
    b.create_var("h", [-1, 1])
    b.create_var("loss", [])
    b.create_var("loss@GRAD", [])
    b.create_var("h@GRAD", [-1, 1])
    b.create_var("w@GRAD", [13, 1])
    b.append_op("mul", {"X": ["x"], "Y": ["w"]}, {"Out": ["h"]}, {"x_num_col_dims": 1})
    b.append_op("mean", {"X": ["h"]}, {"Out": ["loss"]})
    b.append_op("fill_constant", {}, {"Out": ["loss@GRAD"]}, {"shape": [], "value": 1.0},
                role="loss")
    b.append_op("mean_grad", {"X": ["h"], "Out@GRAD": ["loss@GRAD"]}, {"X@GRAD": ["h@GRAD"]},
                role="backward")
    b.append_op("mul_grad", {"X": ["x"], "Y": ["w"], "Out@GRAD": ["h@GRAD"]},
                {"X@GRAD": ["@EMPTY@"], "Y@GRAD": ["w@GRAD"]}, role="backward",
                role_var=[("w", "w@GRAD")])
    b.append_op("sgd", {"Param": ["w"], "Grad": ["w@GRAD"], "LearningRate": ["lr"]},
                {"ParamOut": ["w"]}, role="optimize")
    return p


def with_sub_block(reads="h"):
    """linear_program plus block 1 (parent 0) run by a conditional_block at op 2."""
    p = linear_program()
    b0 = p.global_block()
    b0.create_var("c", [-1, 1])
    sub = p.create_block(0)
    sub.create_var("t", [-1, 1])
    sub.append_op("relu", {"X": [reads]}, {"Out": ["t"]})
    sub.append_op("scale", {"X": ["t"]}, {"Out": ["c"]}, {"scale": 2.0})
    b0.insert_op(2, b0.ops[0].__class__("conditional_block", {"Input": ["h"]},
                                         {"Out": ["c"]}, {"sub_block": BlockRef(1)}))
    return p


def fails(p, *fragments):
    with pytest.raises(ProgramError) as info:
        validate_program(p)
    msg = str(info.value)
    for f in fragments:
        assert f in msg, f"{f!r} not in {msg!r}"
    assert "hint:" in msg, msg
    return msg


def op(p, i, block=0):
    return p.blocks[block].ops[i]


# --- valid programs -----------------------------------------------------------------------
def test_valid_program_passes():
    p = linear_program()
    assert validate_program(p) is None
    assert p.validate() is p


def test_valid_sub_block_reads_parent_vars_written_before_the_owner():
    validate_program(with_sub_block())


def test_empty_marker_and_empty_optional_slot_are_allowed():
    p = linear_program()
    p.global_block().create_var("h2@GRAD", [-1, 1])
    p.global_block().append_op("relu_grad", {"Out": [], "Out@GRAD": ["h@GRAD"]},
                               {"X@GRAD": ["h2@GRAD"]}, role="backward")
    validate_program(p)


def test_unreferenced_block_sees_every_ancestor_write():
    p = linear_program()
    sub = p.create_block(0)
    sub.create_var("t", [-1, 1])
    sub.append_op("relu", {"X": ["h"]}, {"Out": ["t"]})
    validate_program(p)


# --- 1. op types --------------------------------------------------------------------------
def test_unknown_op_type_suggests_close_ones():
    p = linear_program()
    op(p, 0).type = "mull"
    fails(p, "block 0, op 0 (mull): unknown op type 'mull'", "did you mean mul")


# --- 2. sub-blocks ------------------------------------------------------------------------
@pytest.mark.parametrize("ref, words", [
    (7, "refers to block 7, but the program has 2 blocks"),
    (0, "refers to block 0 (the global block)"),
])
def test_bad_sub_block_reference(ref, words):
    p = with_sub_block()
    op(p, 2).attrs["sub_block"] = BlockRef(ref)
    fails(p, "block 0, op 2 (conditional_block): ", words, "create_block(parent_idx=0)")


def test_sub_block_referring_to_its_own_block():
    p = with_sub_block()
    p.blocks[1].append_op("conditional_block", {"Input": []}, {"Out": []},
                          {"sub_block": BlockRef(1)})
    fails(p, "block 1, op 2 (conditional_block): refers to its own block 1")


def test_sub_block_with_another_parent():
    p = with_sub_block()
    p.create_block(0)
    p.blocks[1].append_op("conditional_block", {"Input": []}, {"Out": []},
                          {"sub_block": BlockRef(2)})
    fails(p, "block 1, op 2 (conditional_block): refers to block 2, whose parent is block 0, "
             "not block 1")


def test_bad_block_parent():
    p = with_sub_block()
    p.blocks[1].parent_idx = 5
    fails(p, "block 1: parent_idx is 5, expected an earlier block")


# --- 3. slots -----------------------------------------------------------------------------
def test_missing_required_input_slot():
    p = linear_program()
    del op(p, 0).inputs["Y"]
    fails(p, "block 0, op 0 (mul): missing required input slot 'Y'")


def test_missing_required_output_slot():
    p = linear_program()
    op(p, 1).outputs.clear()
    fails(p, "block 0, op 1 (mean): missing required output slot 'Out'")


def test_unknown_slot_lists_the_known_ones():
    p = linear_program()
    op(p, 0).inputs["Z"] = ["x"]
    fails(p, "block 0, op 0 (mul): unknown input slot 'Z'", "input slots X, Y")
    p = linear_program()
    op(p, 5).outputs["Out"] = ["w"]
    fails(p, "block 0, op 5 (sgd): unknown output slot 'Out'", "ParamOut")


def test_non_duplicable_slot_takes_exactly_one_name():
    p = linear_program()
    op(p, 0).inputs["X"] = ["x", "h"]
    fails(p, "block 0, op 0 (mul): input slot 'X' holds 2 vars ['x', 'h']")
    p = linear_program()
    op(p, 1).outputs["Out"] = []
    fails(p, "block 0, op 1 (mean): output slot 'Out' holds 0 vars")


# --- 4. attrs -----------------------------------------------------------------------------
def test_attr_of_wrong_type():
    p = linear_program()
    op(p, 0).attrs["x_num_col_dims"] = 1.0
    fails(p, "block 0, op 0 (mul): attribute 'x_num_col_dims' must be int, got float 1.0")


def test_unknown_attr():
    p = linear_program()
    op(p, 1).attrs["keepdim"] = True
    fails(p, "block 0, op 1 (mean): unknown attribute 'keepdim'")


def test_missing_required_attr():
    p = linear_program()
    del op(p, 2).attrs["shape"]
    fails(p, "block 0, op 2 (fill_constant): missing required attribute 'shape' (ints)")


# --- 5. declarations ----------------------------------------------------------------------
def test_undefined_input_var():
    p = linear_program()
    op(p, 0).inputs["X"] = ["nope"]
    fails(p, "block 0, op 0 (mul): input slot 'X' names var 'nope', which is not declared in "
             "block 0", "create_var('nope'")


def test_undefined_output_var():
    p = linear_program()
    op(p, 4).outputs["Y@GRAD"] = ["w@GRAD@RENAME@1"]
    fails(p, "block 0, op 4 (mul_grad): output slot 'Y@GRAD' names var 'w@GRAD@RENAME@1'")


def test_sub_block_var_is_not_visible_in_the_parent():
    p = with_sub_block()
    op(p, 1).inputs["X"] = ["t"]
    fails(p, "block 0, op 1 (mean): input slot 'X' names var 't', which is not declared")


# --- 6. data flow -------------------------------------------------------------------------
def test_use_before_definition():
    p = linear_program()
    b = p.global_block()
    b.ops = [b.ops[1], b.ops[0], *b.ops[2:]]
    fails(p, "block 0, op 0 (mean): input slot 'X' reads var 'h' before any op writes it "
             "(use before definition)")


def test_never_written():
    p = linear_program()
    p.global_block().create_var("y", [-1, 13])
    op(p, 0).inputs["X"] = ["y"]
    fails(p, "block 0, op 0 (mul): input slot 'X' reads var 'y', which no op ever writes "
             "(never written)", "is_data=True")


def test_sub_block_read_of_a_var_written_after_the_owner():
    p = with_sub_block(reads="h@GRAD")  # written by mean_grad, after the conditional_block
    fails(p, "block 1, op 0 (relu): input slot 'X' reads var 'h@GRAD' before any op writes it")


def test_sub_block_var_shadowing_a_parent_var_is_a_different_var():
    p = with_sub_block()
    p.blocks[1].create_var("h", [-1, 1])  # shadows block 0's h, and nothing writes it
    fails(p, "block 1, op 0 (relu): input slot 'X' reads var 'h', which no op ever writes")


def test_sub_block_writes_reach_the_parent_only_through_the_owner_outputs():
    p = with_sub_block()
    op(p, 2).outputs["Out"] = []
    p.global_block().create_var("c2", [-1, 1])
    p.global_block().append_op("relu", {"X": ["c"]}, {"Out": ["c2"]})
    fails(p, "block 0, op 7 (relu): input slot 'X' reads var 'c' before any op writes it")


# --- 7. shapes and dtypes -----------------------------------------------------------------
def test_shape_inference_failure_shows_input_shapes():
    p = linear_program()
    p.global_block().var("w").shape = [12, 1]
    msg = fails(p, "block 0, op 0 (mul): shape inference failed for inputs X=[-1, 13] float32, "
                   "Y=[12, 1] float32")
    assert "RuntimeError" in msg or "Error" in msg


def test_declared_output_shape_disagrees():
    p = linear_program()
    p.global_block().var("h").shape = [-1, 2]
    fails(p, "block 0, op 0 (mul): output slot 'Out' var 'h' is declared with shape [-1, 2] "
             "but the op produces [-1, 1]")


def test_declared_output_rank_disagrees():
    p = linear_program()
    p.global_block().var("loss").shape = [1]
    fails(p, "block 0, op 1 (mean): output slot 'Out' var 'loss' is declared with shape [1] "
             "but the op produces []")


def test_unknown_and_batch_dims_match_anything():
    p = linear_program()
    p.global_block().var("h").shape = None
    p.global_block().var("h@GRAD").shape = [-1, -1]
    validate_program(p)


def test_declared_output_dtype_disagrees():
    p = linear_program()
    p.global_block().var("loss@GRAD").dtype = "float64"
    fails(p, "block 0, op 2 (fill_constant): output slot 'Out' var 'loss@GRAD' is declared "
             "float64 but the op produces float32", "dtype='float32'")


def test_output_count_disagrees():
    p = ProgramDesc()
    b = p.global_block()
    b.create_var("x", [6, 4], is_data=True)
    for n in "abc":
        b.create_var(n, [3, 4])
    b.append_op("split", {"X": ["x"]}, {"Out": ["a", "b", "c"]}, {"num": 2, "axis": 0})
    fails(p, "block 0, op 0 (split): output slot 'Out' lists 3 vars ['a', 'b', 'c'] but the op "
             "produces 2")


# --- builder-made programs ----------------------------------------------------------------
def test_builder_programs_validate():
    from tests.program.test_serialize import _builder_programs
    for p in _builder_programs():
        validate_program(p)
        validate_program(p.clone(for_test=True))


@pytest.mark.parametrize("op_index", [0, 1, 3])
def test_role_loss_is_only_for_the_loss_gradient_seed(op_index):
    # the graph builder swaps a 'loss' op for the seed of loss@GRAD: any other op under
    # that role would silently never run
    p = linear_program()
    op(p, op_index).role = "loss"
    fails(p, f"block 0, op {op_index} ({op(p, op_index).type}): role 'loss' marks the "
             "loss-gradient seed", "hint: give it the role of the pass")
