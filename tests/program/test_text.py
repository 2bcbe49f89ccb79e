"""Text form: what print(program) shows, exact round trips, located syntax errors."""

import math
import re

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from ssaexec.core.errors import ProgramError
from ssaexec.program.desc import BlockRef, ProgramDesc
from ssaexec.program.text import program_from_text, program_to_text
from tests.program.test_serialize import (
    WEIRD_NAMES, _attr_values, _builder_programs, _names, assert_same, weird_program
)


def round_trip(p):
    text = program_to_text(p)
    q = program_from_text(text)
    assert_same(q, p)
    assert program_to_text(q) == text
    return text


def small_program():
    p = ProgramDesc()
    b = p.global_block()
    b.create_var("x", [-1, 13], is_data=True, stop_gradient=True)
    b.create_var("fc_0.w_0", [13, 1], persistable=True, is_parameter=True)
    b.create_var("fc_0.tmp_0", [-1, 1])
    b.append_op("mul", {"X": ["x"], "Y": ["fc_0.w_0"]}, {"Out": ["fc_0.tmp_0"]},
                {"x_num_col_dims": 1, "y_num_col_dims": 1})
    p.unique_name("fc")
    return p


# --- printing -----------------------------------------------------------------------------
def test_small_program_text_is_readable():
    assert program_to_text(small_program()) == """\
ssaexec-program v1 random_seed=0
names fc=1

block 0 parent=-1 {
  var x : float32[-1, 13] data stop_gradient
  var fc_0.w_0 : float32[13, 1] persistable parameter
  var fc_0.tmp_0 : float32[-1, 1]
  fc_0.tmp_0 = mul(X=x, Y=fc_0.w_0) {x_num_col_dims=1, y_num_col_dims=1}
}
"""


def test_print_shows_the_text_form(capsys):
    p = small_program()
    print(p)
    assert capsys.readouterr().out == program_to_text(p) + "\n"


def test_weird_program_round_trips_exactly():
    text = round_trip(weird_program())
    assert "block 3 parent=0 {\n}" in text


def _line_of(p, op_index, block=0):
    text = program_to_text(p)
    body = text.split(f"block {block} parent=")[1].splitlines()
    ops = [ln.strip() for ln in body[1:] if ln.startswith("  ") and not ln.startswith("  var ")]
    return ops[op_index]


def test_output_shorthand_only_for_a_single_out():
    p = ProgramDesc()
    b = p.global_block()
    b.append_op("relu", {"X": ["a"]}, {"Out": ["b"]})
    b.append_op("split", {"X": ["a"]}, {"Out": ["b", "c"]})
    b.append_op("dropout", {"X": ["a"]}, {"Out": ["b"], "Mask": ["m"]})
    b.append_op("conv2d", {"Input": ["a"]}, {"Output": ["b"]})
    b.append_op("weird", {"X": []}, {"Out": []})
    b.append_op("none", {}, {})
    assert _line_of(p, 0) == "b = relu(X=a)"
    assert _line_of(p, 1) == "{Out=[b, c]} = split(X=a)"
    assert _line_of(p, 2) == "{Out=b, Mask=m} = dropout(X=a)"
    assert _line_of(p, 3) == "{Output=b} = conv2d(Input=a)"
    assert _line_of(p, 4) == "{Out=[]} = weird(X=[])"
    assert _line_of(p, 5) == "{} = none()"
    round_trip(p)


@pytest.mark.parametrize("name, shown", [
    ("0.weight", "0.weight"), ("layer1.0.conv1.weight", "layer1.0.conv1.weight"),
    ("x@GRAD@RENAME@1", "x@GRAD@RENAME@1"), ("@EMPTY@", "@EMPTY@"), ("a/b+c-d", "a/b+c-d"),
    ("var", '"var"'), ("block", '"block"'), ("with space", '"with space"'),
    ("a->b", '"a->b"'), ("a:b", '"a:b"'), ("#x", '"#x"'), ('q"', '"q\\""'), ("ünï", '"ünï"'),
])
def test_names_are_bare_only_when_simple(name, shown):
    p = ProgramDesc()
    p.global_block().create_var(name, [1])
    p.global_block().append_op("relu", {"X": [name]}, {"Out": [name]})
    assert _line_of(p, 0) == f"{shown} = relu(X={shown})"
    assert f"  var {shown} : float32[1]\n" in program_to_text(p)
    round_trip(p)


def test_attr_values_print_and_round_trip():
    p = ProgramDesc()
    p.create_block(0)
    p.global_block().append_op("a", {}, {}, {
        "i": 1, "f": 1.0, "e": 1e-05, "big": 1e100, "inf": math.inf, "ninf": -math.inf,
        "nan": math.nan, "t": True, "n": None, "s": 'a "b"\n#c', "l": [], "b": BlockRef(1),
        "mix": [1, [2.5, "x"], [BlockRef(1)]]})
    line = _line_of(p, 0)
    assert line == ('{} = a() {i=1, f=1.0, e=1e-05, big=1e+100, inf=inf, ninf=-inf, nan=nan, '
                    't=true, n=null, s="a \\"b\\"\\n#c", l=[], b=block(1), '
                    'mix=[1, [2.5, "x"], [block(1)]]}')
    q = program_from_text(program_to_text(p))
    attrs = q.global_block().ops[0].attrs
    assert type(attrs["i"]) is int and type(attrs["f"]) is float and attrs["t"] is True
    assert math.isnan(attrs["nan"]) and attrs["ninf"] == -math.inf
    round_trip(p)


def test_role_printed_only_when_not_forward_and_role_var_when_present():
    p = ProgramDesc()
    b = p.global_block()
    b.append_op("relu", {"X": ["a"]}, {"Out": ["b"]})
    b.append_op("relu_grad", {"Out": ["b"]}, {"X@GRAD": ["a@GRAD"]}, role="backward",
                role_var=[("w", "w@GRAD"), ("v", "v@GRAD")])
    b.append_op("sgd", {"Param": ["w"]}, {"ParamOut": ["w"]}, {"weight_decay": 0.0},
                role="optimize")
    b.append_op("relu", {"X": ["a"]}, {"Out": ["b"]}, role_var=[("w", "g")])
    assert "@" not in _line_of(p, 0)
    assert _line_of(p, 1) == ("{X@GRAD=a@GRAD} = relu_grad(Out=b) @backward "
                              "[w -> w@GRAD, v -> v@GRAD]")
    assert _line_of(p, 2).endswith("{weight_decay=0.0} @optimize")
    assert _line_of(p, 3) == "b = relu(X=a) [w -> g]"
    round_trip(p)


def test_shape_none_prints_without_brackets():
    p = ProgramDesc()
    p.global_block().create_var("u", None, "int64")
    p.global_block().create_var("s", [], "bool")
    text = round_trip(p)
    assert "  var u : int64\n" in text and "  var s : bool[]\n" in text


# --- hand-written text --------------------------------------------------------------------
def test_hand_written_text_with_comments_and_line_breaks():
    text = """
# a comment before the header
ssaexec-program v1 random_seed=3   # trailing comment

block 0 parent=-1 {   # the global block
  var x : float32[-1, 2] stop_gradient data
  var "y z" : float32[-1, 2]

  {Out="y z"} = scale(    # wrapped over lines
      X=[x,],
  ) {scale=2.0, bias=-1, s="# not a comment",}
}
"""
    p = program_from_text(text, source="hand.ssa")
    assert p.random_seed == 3
    assert p.global_block().var("x").is_data and p.global_block().var("x").stop_gradient
    op = p.global_block().ops[0]
    assert op.outputs == {"Out": ["y z"]} and op.inputs == {"X": ["x"]}
    assert op.attrs == {"scale": 2.0, "bias": -1, "s": "# not a comment"}
    assert p.global_block().ops[0].attrs["bias"].__class__ is int
    round_trip(p)


# --- syntax errors ------------------------------------------------------------------------
HEADER = "ssaexec-program v1 random_seed=0\n"


def _error(text):
    with pytest.raises(ProgramError) as info:
        program_from_text(text, source="p.ssa")
    msg = str(info.value)
    assert re.match(r"p\.ssa:\d+:\d+: ", msg), msg
    return msg


@pytest.mark.parametrize("text, where, words", [
    ("", "1:1", "expected the header"),
    ("hello v1\n", "1:1", "expected the header 'ssaexec-program v1 random_seed=N', found 'hello'"),
    ("ssaexec-program v2 random_seed=0\n", "1:17", "unsupported version 2; this ssaexec reads "
                                                   "version 1"),
    ("ssaexec-program 1 random_seed=0\n", "1:17", "expected a version like 'v1', found '1'"),
    ("ssaexec-program v1 random_seed=x\n", "1:32", "expected the random seed (an integer)"),
    (HEADER, "2:1", "expected 'block 0 parent=-1 {', found end of input"),
    (HEADER + "block 1 parent=-1 {\n}\n", "2:7", "expected block index 0"),
    (HEADER + "block 0 parent=0 {\n}\n", "2:16", "expected -1"),
    (HEADER + "block 0 parent=-1 {\n}\nblock 1 parent=1 {\n}\n", "4:16", "earlier block"),
    (HEADER + "block 0 parent=-1 {\n  var x : float33[1]\n}\n", "3:11", "expected a dtype"),
    (HEADER + "block 0 parent=-1 {\n  var x float32\n}\n", "3:9", "expected ':', found "
                                                              "'float32'"),
    (HEADER + "block 0 parent=-1 {\n  var x : float32[1 2]\n}\n", "3:21", "expected ',' or "),
    (HEADER + "block 0 parent=-1 {\n  var x : float32 persisted\n}\n", "3:19",
     "expected a var flag"),
    (HEADER + "block 0 parent=-1 {\n  var x : float32\n  var x : int64\n}\n", "4:7",
     "var 'x' is declared twice"),
    (HEADER + "block 0 parent=-1 {\n  y relu(X=x)\n}\n", "3:5", "expected '=', found 'relu'"),
    (HEADER + "block 0 parent=-1 {\n  y = relu(X=x\n}\n", "4:1", "or ')', found '}'"),
    (HEADER + "block 0 parent=-1 {\n  y = relu(X=x) {k=@}\n}\n", "3:20",
     "expected an attribute value"),
    (HEADER + "block 0 parent=-1 {\n  y = relu(X=x) {k=1} @sideways\n}\n", "3:23",
     "expected a role (@forward, @backward, @optimize, @loss)"),
    (HEADER + "block 0 parent=-1 {\n  y = relu(X=x) [w w@GRAD]\n}\n", "3:20", "expected '->'"),
    (HEADER + "block 0 parent=-1 {\n  y = relu(X=x, X=z)\n}\n", "3:17", "slot 'X' appears twice"),
    (HEADER + "block 0 parent=-1 {\n  y = relu(X=x) {a=1, a=2}\n}\n", "3:23",
     "attribute 'a' appears twice"),
    (HEADER + "block 0 parent=-1 {\n  y = relu(X=x) z\n}\n", "3:17", "expected end of line"),
    (HEADER + 'block 0 parent=-1 {\n  y = relu(X="x)\n}\n', "3:14", "unterminated string"),
    (HEADER + "block 0 parent=-1 {\n  y = relu(X=x) ; \n}\n", "3:17", "unexpected character ';'"),
    (HEADER + 'block 0 parent=-1 {\n  y = relu(X="\\q")\n}\n', "3:14", "bad string"),
    (HEADER + 'block 0 parent=-1 {\n  y = relu(X="")\n}\n', "3:14", "expected a var name"),
    (HEADER + "block 0 parent=-1 {\n  y = relu(X=x)\n", "4:1", "closing block 0, found end of "
                                                          "input"),
    (HEADER + "block 0 parent=-1 {\n  ) = relu()\n}\n", "3:3", "expected 'var', an op"),
    (HEADER + "names fc=x\n", "2:10", "expected a name count"),
])
def test_syntax_errors_give_line_column_expected_and_found(text, where, words):
    msg = _error(text)
    assert msg.startswith(f"p.ssa:{where}: "), msg
    assert words in msg, msg


# --- properties and builder programs ------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(names=st.lists(_names, min_size=1, max_size=5, unique=True),
       attrs=st.dictionaries(_names, _attr_values, max_size=5),
       role=st.sampled_from(["forward", "backward", "optimize", "loss"]))
def test_text_round_trip_property(names, attrs, role):
    # op types in the aten namespace must name a real, allowed overload (docs/security.md)
    assume(not names[0].startswith("aten."))
    p = ProgramDesc()
    b = p.global_block()
    for n in names:
        b.create_var(n, [len(n), -1])
    b.append_op(names[0], {names[-1]: names}, {"Out": names[:1]}, attrs, role=role,
                role_var=[(names[0], names[-1])])
    b.append_op("op", {}, {names[0]: names[1:]}, role=role)
    p.unique_name(names[-1])
    round_trip(p)


def test_every_weird_name_survives_as_op_type_slot_and_attr_name():
    p = ProgramDesc()
    for n in WEIRD_NAMES:
        p.global_block().append_op(n, {n: [n]}, {"Out": [n]}, {n: n}, role_var=[(n, n)])
    round_trip(p)


def test_builder_programs_round_trip_through_text():
    for p in _builder_programs():
        round_trip(p)
