"""JSON form and program files: exact round trips and located errors."""

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ssaexec.core.errors import ProgramError
from ssaexec.program.desc import BlockRef, ProgramDesc
from ssaexec.program.io import load_program, save_program
from ssaexec.program.serialize import (from_json, program_from_dict, program_to_dict,
                                       to_json)

WEIRD_NAMES = ["0.weight", "layer1.0.conv1.weight", "x@GRAD@RENAME@1", "var", "block",
               "with space", "a->b", "a-", 'quo"te', "ünï", "a:b", "#hash", "1", "-1", "1.5",
               "true", "null", "inf", "@backward", "a/b+c"]


def weird_program():
    """A program exercising every corner of the forms: names, sub-blocks, attrs, roles."""
    p = ProgramDesc(random_seed=7)
    b0 = p.global_block()
    b0.create_var("x", [-1, 3, 224, 224], is_data=True, stop_gradient=True)
    b0.create_var("w", [3, 4], persistable=True, is_parameter=True)
    b0.create_var("unknown_shape", None, "int64")
    b0.create_var("scalar", [], "bool")
    b0.create_var("half", [2], "bfloat16", stop_gradient=True)
    for n in WEIRD_NAMES:
        b0.create_var(n, [1])
    b0.append_op("relu", {"X": ["x"]}, {"Out": ["0.weight"]})
    b0.append_op("sum", {"X": WEIRD_NAMES[:6]}, {"Out": ["var"]})
    b0.append_op("nothing", {}, {})
    b0.append_op("empties", {"X": [], "Y": ["a->b"]}, {"Out": [], "Mask": ["@EMPTY@"]})
    b0.append_op("attrs", {"X": ["x"]}, {"Out": ["a", "b"]}, attrs={
        "i": 1, "f": 1.0, "negzero": -0.0, "small": 1e-05, "big": 1e100, "tiny": 5e-324,
        "inf": math.inf, "ninf": -math.inf, "nan": math.nan, "t": True, "fa": False,
        "none": None, "empty_s": "", "s": 'say "hi"\n# not a comment\tünï', "l": [],
        "nested": [1, 2.5, "a", None, [True, []]], "blocks": [BlockRef(1), BlockRef(2)],
        "with space": 3, "Out@GRAD": 4})
    b0.append_op("conditional_block", {"Input": ["x"]}, {"Out": ["w"]},
                 attrs={"sub_block": BlockRef(1)})
    b0.append_op("mul_grad", {"X": ["x"], "Out@GRAD": ["x@GRAD@RENAME@1"]},
                 {"X@GRAD": ["@EMPTY@"], "Y@GRAD": ["w@GRAD"]}, role="backward",
                 role_var=[("w", "w@GRAD"), ("a->b", "var")])
    b0.append_op("fill_constant", {}, {"Out": ["loss@GRAD"]}, {"value": 1.0}, role="loss")
    b0.append_op("sgd", {"Param": ["w"]}, {"ParamOut": ["w"]}, role="optimize")
    b0.append_op("relu", {"X": ["x"]}, {"Out": ["y"]}, role_var=[("w", "w@GRAD")])
    b1 = p.create_block(0)
    b1.create_var("inner", [2, 2], "float64")
    b1.append_op("scale", {"X": ["x"]}, {"Out": ["inner"]}, {"scale": 2.0})
    b2 = p.create_block(1)
    b2.append_op("relu", {"X": ["inner"]}, {"Out": ["inner"]})
    p.create_block(0)  # an empty block
    p.unique_name("fc")
    p.unique_name("fc")
    p.unique_name("a b")
    return p


def assert_same(a, b):
    """Equal, and with identical Python types for every attr (1 is not 1.0, True not 1)."""
    assert a == b
    for ba, bb in zip(a.blocks, b.blocks, strict=True):
        for oa, ob in zip(ba.ops, bb.ops, strict=True):
            assert list(oa.inputs) == list(ob.inputs)
            assert list(oa.outputs) == list(ob.outputs)
            assert list(oa.attrs) == list(ob.attrs)
            assert _types(oa.attrs) == _types(ob.attrs)
        assert list(ba.vars) == list(bb.vars)


def _types(v):
    if isinstance(v, dict):
        return {k: _types(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_types(x) for x in v]
    return type(v).__name__


# --- round trips --------------------------------------------------------------------------
def test_dict_round_trip_is_exact():
    p = weird_program()
    q = program_from_dict(program_to_dict(p))
    assert_same(q, p)
    assert program_to_dict(q) == program_to_dict(p)


def test_json_round_trip_is_exact():
    p = weird_program()
    s = to_json(p)
    q = from_json(s)
    assert_same(q, p)
    assert to_json(q) == s
    assert math.isnan(q.global_block().ops[4].attrs["nan"])
    assert math.copysign(1, q.global_block().ops[4].attrs["negzero"]) == -1
    assert q.global_block().ops[5].attrs["sub_block"] == BlockRef(1)


def test_json_is_standard_and_encodes_specials():
    s = to_json(weird_program())

    def no_constants(name):
        raise AssertionError(f"non-standard JSON constant {name}")
    d = json.loads(s, parse_constant=no_constants)
    assert d["schema"] == "ssaexec.program" and d["version"] == 1
    attrs = d["blocks"][0]["ops"][4]["attrs"]
    assert attrs["inf"] == {"float": "inf"} and attrs["ninf"] == {"float": "-inf"}
    assert attrs["nan"] == {"float": "nan"}
    assert attrs["blocks"] == [{"block": 1}, {"block": 2}]
    assert attrs["f"] == 1.0 and isinstance(attrs["f"], float)
    assert d["name_counts"] == {"fc": 2, "a b": 1}


def test_nan_attrs_compare_equal():
    a, b = ProgramDesc(), ProgramDesc()
    for p in (a, b):
        p.global_block().append_op("scale", {}, {}, {"scale": math.nan})
    assert a == b


def test_reloaded_program_keeps_generating_fresh_names():
    p = weird_program()
    q = from_json(to_json(p))
    assert q.unique_name("fc") == "fc_2" == p.unique_name("fc")
    assert q.unique_name("new") == "new_0"


def test_blocks_keep_parents_and_program_links():
    q = from_json(to_json(weird_program()))
    assert [b.parent_idx for b in q.blocks] == [-1, 0, 1, 0]
    assert all(b.program is q and b.idx == i for i, b in enumerate(q.blocks))
    assert q.block(2).find_var("x").is_data  # ancestor lookup works after loading


def test_empty_program_round_trips():
    p = ProgramDesc()
    assert to_json(from_json(to_json(p))) == to_json(p)


_names = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=8)
_scalars = (st.integers(-2**70, 2**70) | st.floats(allow_nan=True) | st.booleans() | st.none()
            | st.text(max_size=8) | st.builds(BlockRef, st.integers(0, 5)))
_attr_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4), max_leaves=10)


@settings(max_examples=60, deadline=None)
@given(attrs=st.dictionaries(_names, _attr_values, max_size=5),
       names=st.lists(_names, min_size=1, max_size=4, unique=True))
def test_json_round_trip_property(attrs, names):
    p = ProgramDesc()
    for n in names:
        p.global_block().create_var(n, [len(n)])
    p.global_block().append_op("op", {"X": names}, {names[0]: names[-1:]}, attrs)
    s = to_json(p)
    q = from_json(s)
    assert_same(q, p)
    assert to_json(q) == s


# --- malformed input ----------------------------------------------------------------------
def _json_error(text, source="prog.json"):
    with pytest.raises(ProgramError) as info:
        from_json(text, source=source)
    return str(info.value)


def test_bad_json_names_line_and_column():
    text = to_json(ProgramDesc())
    bad = text.replace('"version": 1,', '"version": 1,,')
    msg = _json_error(bad)
    line = bad.splitlines().index('  "version": 1,,') + 1
    assert msg.startswith(f"prog.json:{line}:")
    assert "invalid JSON" in msg


def test_truncated_json():
    msg = _json_error('{"schema": "ssaexec.program",\n  "version": ')
    assert msg.startswith("prog.json:2:")


def test_unsupported_version_names_supported_one_with_location():
    text = to_json(ProgramDesc()).replace('"version": 1', '"version": 2')
    msg = _json_error(text)
    assert msg.startswith("prog.json:3:14: version: unsupported version 2")
    assert "version 1" in msg


def test_wrong_schema():
    msg = _json_error('{"schema": "something.else", "version": 1}')
    assert msg.startswith("prog.json:1:12: schema:") and "not an ssaexec program" in msg
    assert "not an ssaexec program" in _json_error("[1, 2]")


def _mutate(fn):
    """JSON text of a small program after ``fn`` edits its dict form."""
    p = ProgramDesc()
    b = p.global_block()
    b.create_var("x", [2])
    b.create_var("y", [2])
    b.append_op("relu", {"X": ["x"]}, {"Out": ["y"]}, {"k": 1})
    b.append_op("relu", {"X": ["y"]}, {"Out": ["x"]})
    d = program_to_dict(p)
    fn(d)
    return json.dumps(d, indent=1)


@pytest.mark.parametrize("edit, path, words", [
    (lambda d: d["blocks"][0]["ops"][1].__setitem__("inputs", ["y"]),
     "blocks[0].ops[1].inputs", "an object"),
    (lambda d: d["blocks"][0]["ops"][1]["inputs"].__setitem__("X", "y"),
     "blocks[0].ops[1].inputs.X", "array of non-empty strings"),
    (lambda d: d["blocks"][0]["ops"][1].pop("role"), "blocks[0].ops[1]", "missing key 'role'"),
    (lambda d: d["blocks"][0]["ops"][0].__setitem__("extra", 1),
     "blocks[0].ops[0].extra", "unknown key 'extra'"),
    (lambda d: d["blocks"][0]["ops"][0].__setitem__("role", "sideways"),
     "blocks[0].ops[0].role", "one of forward"),
    (lambda d: d["blocks"][0]["ops"][0].__setitem__("role_var", [["w"]]),
     "blocks[0].ops[0].role_var[0]", "pair"),
    (lambda d: d["blocks"][0]["ops"][0]["attrs"].__setitem__("k", {"tensor": 1}),
     "blocks[0].ops[0].attrs.k", '{"block": INDEX}'),
    (lambda d: d["blocks"][0]["ops"][0]["attrs"].__setitem__("k", [1, {"float": "big"}]),
     "blocks[0].ops[0].attrs.k[1]", '{"float"'),
    (lambda d: d["blocks"][0]["vars"][1].__setitem__("dtype", "float33"),
     "blocks[0].vars[1].dtype", "dtype name"),
    (lambda d: d["blocks"][0]["vars"][1].__setitem__("shape", [2, 1.5]),
     "blocks[0].vars[1].shape", "array of integers"),
    (lambda d: d["blocks"][0]["vars"][1].__setitem__("is_data", 1),
     "blocks[0].vars[1].is_data", "true or false"),
    (lambda d: d["blocks"][0]["vars"][1].__setitem__("name", "x"),
     "blocks[0].vars[1].name", "declared twice"),
    (lambda d: d["blocks"][0].__setitem__("idx", 3), "blocks[0].idx", "the integer 0"),
    (lambda d: d["blocks"][0].__setitem__("parent_idx", 0), "blocks[0].parent_idx", "-1"),
    (lambda d: d["blocks"].append({"idx": 1, "parent_idx": 1, "vars": [], "ops": []}),
     "blocks[1].parent_idx", "earlier block"),
    (lambda d: d.__setitem__("blocks", []), "blocks", "non-empty array"),
    (lambda d: d.__setitem__("random_seed", "0"), "random_seed", "an integer"),
    (lambda d: d["name_counts"].__setitem__("fc", 1.5), "name_counts.fc", "an integer"),
])
def test_structural_errors_name_path_line_and_column(edit, path, words):
    text = _mutate(edit)
    msg = _json_error(text)
    assert f": {path}: " in msg, msg
    assert words in msg, msg
    src, line, col = msg.split(":")[:3]
    assert src == "prog.json" and int(line) > 1 and int(col) >= 1, msg


def test_structural_error_points_at_the_offending_value():
    text = _mutate(lambda d: d["blocks"][0]["vars"][1].__setitem__("dtype", "float33"))
    msg = _json_error(text)
    line, col = map(int, msg.split(":")[1:3])
    assert text.splitlines()[line - 1][col - 1:].startswith('"float33"')


def test_program_from_dict_errors_name_source_and_path():
    d = program_to_dict(ProgramDesc())
    d["blocks"][0]["ops"] = [{"type": "relu"}]
    with pytest.raises(ProgramError, match=r"^cfg: blocks\[0\]\.ops\[0\]: missing key 'inputs'"):
        program_from_dict(d, source="cfg")
    d["blocks"][0]["ops"] = [{"type": "x", "inputs": {"Out@GRAD": [""]}, "outputs": {},
                              "attrs": {}, "role": "forward", "role_var": []}]
    with pytest.raises(ProgramError, match=r'inputs\["Out@GRAD"\]'):
        program_from_dict(d)


# --- files --------------------------------------------------------------------------------
@pytest.mark.parametrize("suffix", [".json", ".txt", ".prog", ".ssa", ".JSON"])
def test_save_and_load_round_trip(tmp_path, suffix):
    p = weird_program()
    path = save_program(p, tmp_path / f"p{suffix}")
    q = load_program(path)
    assert_same(q, p)
    first = path.read_text(encoding="utf-8")
    save_program(q, path)
    assert path.read_text(encoding="utf-8") == first
    assert first.lstrip().startswith("{") == (suffix.lower() == ".json")


def test_unknown_suffix_lists_the_known_ones(tmp_path):
    with pytest.raises(ProgramError, match=r"\.json, \.txt, \.prog, \.ssa"):
        save_program(ProgramDesc(), tmp_path / "p.pkl")
    with pytest.raises(ProgramError, match="unknown program file suffix"):
        load_program(tmp_path / "p")


def test_missing_file_names_the_path(tmp_path):
    path = tmp_path / "nope.json"
    with pytest.raises(ProgramError, match="nope.json: no such program file"):
        load_program(path)


def test_load_errors_carry_the_file_name(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text("{\n  oops\n}\n")
    with pytest.raises(ProgramError, match=r"bad\.json:2:3: invalid JSON"):
        load_program(str(path))
    path = tmp_path / "bad.txt"
    path.write_text("ssaexec-program v9 random_seed=0\n")
    with pytest.raises(ProgramError, match=r"bad\.txt:1:17: unsupported version 9"):
        load_program(path)


def test_load_with_validate(tmp_path):
    p = ProgramDesc()
    p.global_block().create_var("x", [2])
    p.global_block().append_op("relu", {"X": ["x"]}, {"Out": ["y"]})
    path = save_program(p, tmp_path / "p.json")
    assert load_program(path) == p  # parsing alone does not validate
    with pytest.raises(ProgramError, match=r"block 0, op 0 \(relu\).*'y'"):
        load_program(path, validate=True)


def test_top_level_api_exposes_save_and_load(tmp_path):
    se = pytest.importorskip("ssaexec")
    p = weird_program()
    se.save_program(p, tmp_path / "p.ssa")
    assert se.load_program(tmp_path / "p.ssa") == p


# --- builder-made programs ----------------------------------------------------------------
_BUILT = []


def _builder_programs():
    """MLP and CNN training programs (main and startup) from the builder, built once."""
    pytest.importorskip("ssaexec.program.layers")
    models = pytest.importorskip("ssaexec.program.example_models")
    if not _BUILT:
        for build in (models.build_mlp, models.build_cnn):
            for opt in ("sgd", "adam"):
                main, startup, _ = build(optimizer=models.make_optimizer(opt))
                _BUILT.extend([main, startup])
    return [p.clone() for p in _BUILT]


def test_builder_programs_round_trip_through_json():
    for p in _builder_programs():
        s = to_json(p)
        q = from_json(s)
        assert_same(q, p)
        assert to_json(q) == s
        assert q.all_parameters() == p.all_parameters()
