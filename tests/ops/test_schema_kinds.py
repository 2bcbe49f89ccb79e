"""Schema argument kinds: an argument ssaexec cannot encode is an ``Unsupported`` value,
not a string prefix (issue 31)."""

import copy

import pytest
import torch

from ssaexec.core.errors import ProgramError
from ssaexec.ops.aten import CompiledCall
from ssaexec.ops.schema import Unsupported, arg_kinds


def test_an_unencodable_argument_is_an_unsupported_value():
    kinds = {name: kind for name, kind, _ in arg_kinds(torch.ops.aten.add.t)}
    assert kinds["a"] == Unsupported("List[t]")
    assert isinstance(kinds["a"], Unsupported) and kinds["a"].type == "List[t]"
    assert repr(kinds["a"]) == "Unsupported('List[t]')"


def test_unsupported_is_immutable_and_never_a_string_kind():
    kind = Unsupported("Storage")
    with pytest.raises(AttributeError, match="immutable"):
        kind.type = "Tensor"
    assert kind != "unsupported:Storage" and kind not in ("tensor", "size", "generator")
    assert copy.deepcopy(kind) == kind and hash(copy.copy(kind)) == hash(kind)
    assert {Unsupported("Storage"), kind} == {kind}


def test_compiled_call_names_the_unsupported_type_and_accepts_null():
    kinds = [("src", Unsupported("Storage"), False)]
    with pytest.raises(ProgramError, match=r"^aten\.x\.y: argument 'src' has schema type "
                                           r"Storage, which ssaexec cannot encode$"):
        CompiledCall("aten.x.y", kinds, {"src": 1})
    assert len(CompiledCall("aten.x.y", kinds, {"src": None}).steps) == 1
