"""The program IR changes only through its API (issue 31): every edit bumps the version
inside ``ssaexec.program.desc``, an outside write of ``_version`` is refused, ``block.ops``
is read-only, and programs compare by value but hash by identity."""

import pathlib
import re

import pytest
import torch

import ssaexec as se
from ssaexec.core.errors import ProgramError
from ssaexec.program.desc import OpDesc, OpList


def _scale_program(factor=2.0):
    main, startup = se.Program(), se.Program()
    with se.program_guard(main, startup):
        x = se.layers.data("x", shape=[-1, 3], dtype="float32")
        out = se.layers.scale(x, scale=factor)
    return main, out.name


def test_an_outside_write_of_the_version_is_caught():
    main, _ = _scale_program()
    before = main.version
    with pytest.raises(AttributeError, match=r"_version is read-only: edit the program through "
                                             r"its ProgramDesc/BlockDesc methods"):
        main._version = 3
    with pytest.raises(AttributeError, match="read-only"):
        main._version += 1
    with pytest.raises(AttributeError):
        main.version = 3
    assert main.version == main._version == before


def test_every_edit_through_the_api_bumps_the_version():
    main, out = _scale_program()
    block = main.global_block()
    op = block.ops[-1]
    extra = OpDesc("scale", {"X": [out]}, {"Out": [out]}, {"scale": 1.0})
    edits = [
        lambda: block.set_attr(op, "scale", 3.0),
        lambda: block.set_input(op, "X", ["x"]),
        lambda: block.set_output(op, "Out", [out]),
        lambda: block.add_op(extra),
        lambda: block.remove_op(extra),
        lambda: block.insert_op(0, extra),
        lambda: block.replace_op(extra, []),
        lambda: setattr(block, "ops", list(block.ops)),
        lambda: block.create_var("y", [1]),
        lambda: block.update_var("y", dtype="float64"),
        lambda: block.add_role_var(op, "x", "y"),
        lambda: block.remove_role_var(op, "x", "y"),
        lambda: block.remove_var("y"),
        lambda: main.create_block(0),
        lambda: main.keep_blocks([0]),
    ]
    for edit in edits:
        before = main.version
        edit()
        assert main.version > before, edit
    assert block.vars["x"].dtype == "float32" and op.attrs["scale"] == 3.0
    assert [o.type for o in block.ops] == ["scale"] and main.num_blocks == 1


def test_block_ops_is_a_live_read_only_view():
    main, out = _scale_program()
    block = main.global_block()
    ops = block.ops
    assert isinstance(ops, OpList) and ops == list(ops) and ops == tuple(ops)
    ops[:].append(ops[0])  # a slice is a copy, like a list's
    assert len(ops) == 1
    for refused in (lambda: ops.append(ops[0]), lambda: ops.pop(), ops.clear,
                    lambda: ops.insert(0, ops[0]), lambda: ops.__setitem__(0, ops[0]),
                    lambda: ops.__delitem__(0)):
        with pytest.raises(TypeError, match="BlockDesc.ops is read-only"):
            refused()
    added = block.append_op("scale", {"X": [out]}, {"Out": [out]}, {"scale": 1.0})
    assert ops[-1] is added and ops.index(added) == len(ops) - 1 and added in ops


def test_the_executor_sees_an_edit_made_through_the_api():
    main, out = _scale_program(2.0)
    exe, xs = se.Executor(se.CPUPlace()), torch.ones(2, 3)
    got, = exe.run(main, feed={"x": xs}, fetch_list=[out])
    assert torch.equal(torch.as_tensor(got), xs * 2)
    main.global_block().set_attr(main.global_block().ops[-1], "scale", 5.0)
    got, = exe.run(main, feed={"x": xs}, fetch_list=[out])
    assert torch.equal(torch.as_tensor(got), xs * 5)  # the cached plan was rebuilt


def test_switch_block_restores_the_current_block_even_on_error():
    main, _ = _scale_program()
    sub = main.create_block(0)
    with main.switch_block(sub.idx) as block:
        assert block is sub and main.current_block() is sub
    with pytest.raises(ValueError), main.switch_block(sub.idx):
        raise ValueError("boom")
    assert main.current_block().idx == 0
    with pytest.raises(ProgramError, match="no block 7"), main.switch_block(7):
        pass


def test_name_counters_change_only_through_methods_and_survive_a_reload(tmp_path):
    main, _ = _scale_program()
    counts = main.name_counts
    with pytest.raises(TypeError):
        counts["scale"] = 9
    assert main.next_count("@seed") == 0 and main.next_count("@seed") == 1
    assert main.name_counts["@seed"] == 2
    for suffix in ("json", "ssa"):
        se.save_program(main, tmp_path / f"p.{suffix}")
        loaded = se.load_program(tmp_path / f"p.{suffix}")
        assert dict(loaded.name_counts) == dict(main.name_counts) and loaded == main


def test_programs_compare_by_value_and_hash_by_identity():
    a, _ = _scale_program()
    b = a.clone()
    assert a == b and a is not b
    assert hash(a) == object.__hash__(a) and hash(b) == object.__hash__(b)
    assert len({a: 1, b: 2}) == 2  # keys stay apart however their contents change
    b.global_block().set_attr(b.global_block().ops[-1], "scale", 7.0)
    assert a != b


def test_only_desc_writes_the_programs_private_state():
    # the version, the name counters and the current block are desc.py's alone
    root = pathlib.Path(se.__file__).parent
    write = re.compile(r"\.(_version|_edits|_name_counts|_current_block)\b\s*"
                       r"(\[[^]]*\]\s*)?([-+*/]?=(?!=)|\.(pop|update|clear|setdefault)\()"
                       r"|,\s*[\w.]+\.(_current_block|_version)\s*=(?!=)")
    offenders = [f"{path.relative_to(root)}:{n}" for path in sorted(root.rglob("*.py"))
                 if path.name != "desc.py" or path.parent.name != "program"
                 for n, line in enumerate(path.read_text().splitlines(), 1)
                 if write.search(line)]
    assert offenders == []
