"""Message classes for Paddle's program format, built from our ``framework.proto``.

``framework.proto`` (next to this module) is the one statement of the fields we read.
This module parses it into a ``FileDescriptorProto`` and lets the ``protobuf``
package make the message classes, so no generated ``_pb2`` module (tied to the
protobuf version that generated it) is kept in the tree.

The parser knows the proto2 subset the file uses: ``syntax``, ``package``, nested
``message`` and ``enum`` blocks, fields ``optional|required|repeated TYPE name = N;``
with scalar or message types, and comments. Anything else in the file is a
``ValueError``: the file is ours, so that is a bug here, not bad input.

``protobuf`` is an optional dependency (``pip install ssaexec[paddle]``); without
it ``messages()`` raises ``ProgramError`` saying so. Nothing is imported until the
first Paddle file is read, so ``import ssaexec`` does not need protobuf.
"""

import functools
import re
from pathlib import Path

from ...core.errors import ProgramError

__all__ = ["SCHEMA_PATH", "messages", "parse_proto", "enum_values"]

SCHEMA_PATH = Path(__file__).with_name("framework.proto")

_SCALARS = {
    "double": "TYPE_DOUBLE", "float": "TYPE_FLOAT", "int64": "TYPE_INT64",
    "uint64": "TYPE_UINT64", "int32": "TYPE_INT32", "uint32": "TYPE_UINT32",
    "bool": "TYPE_BOOL", "string": "TYPE_STRING", "bytes": "TYPE_BYTES",
    "sint32": "TYPE_SINT32", "sint64": "TYPE_SINT64", "fixed32": "TYPE_FIXED32",
    "fixed64": "TYPE_FIXED64",
}
_TOKEN = re.compile(r'\s+|//[^\n]*|/\*.*?\*/|"[^"]*"|[A-Za-z_][A-Za-z0-9_.]*|-?\d+|[{}=;\[\],]',
                    re.S)


def _tokens(text):
    pos = 0
    out = []
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise ValueError(f"framework.proto: cannot read {text[pos:pos + 20]!r}")
        tok = m.group()
        pos = m.end()
        if not (tok.isspace() or tok.startswith("//") or tok.startswith("/*")):
            out.append(tok)
    return out


def parse_proto(text, name="framework.proto"):
    """``FileDescriptorProto`` of the proto2 subset described in the module docstring."""
    from google.protobuf import descriptor_pb2

    toks = _tokens(text)
    fdp = descriptor_pb2.FileDescriptorProto(name=name, syntax="proto2")
    pending = []  # (FieldDescriptorProto, type name, scope) resolved once all names are known
    messages, enums = set(), set()
    i = 0

    def expect(tok):
        nonlocal i
        if toks[i] != tok:
            raise ValueError(f"framework.proto: expected {tok!r}, got {toks[i]!r}")
        i += 1

    def enum_body(enum, scope):
        nonlocal i
        enums.add(f"{scope}.{enum.name}")
        expect("{")
        while toks[i] != "}":
            value = enum.value.add(name=toks[i])
            i += 1
            expect("=")
            value.number = int(toks[i])
            i += 1
            expect(";")
        i += 1

    def message_body(msg, scope):
        nonlocal i
        full = f"{scope}.{msg.name}"
        messages.add(full)
        expect("{")
        while toks[i] != "}":
            kw = toks[i]
            if kw == "message":
                sub = msg.nested_type.add(name=toks[i + 1])
                i += 2
                message_body(sub, full)
            elif kw == "enum":
                sub = msg.enum_type.add(name=toks[i + 1])
                i += 2
                enum_body(sub, full)
            elif kw in ("optional", "required", "repeated"):
                field = msg.field.add(name=toks[i + 2],
                                      label=getattr(descriptor_pb2.FieldDescriptorProto,
                                                    "LABEL_" + kw.upper()))
                type_name = toks[i + 1]
                i += 3
                expect("=")
                field.number = int(toks[i])
                i += 1
                expect(";")
                pending.append((field, type_name, full))
            else:
                raise ValueError(f"framework.proto: unexpected {kw!r} in message {msg.name}")
        i += 1

    scope = ""
    while i < len(toks):
        kw = toks[i]
        if kw in ("syntax", "package"):
            value = toks[i + 2] if kw == "syntax" else toks[i + 1]
            i += 4 if kw == "syntax" else 3
            if kw == "package":
                fdp.package = value
                scope = "." + value
            elif value != '"proto2"':
                raise ValueError(f"framework.proto: syntax {value} is not proto2")
        elif kw == "message":
            msg = fdp.message_type.add(name=toks[i + 1])
            i += 2
            message_body(msg, scope)
        elif kw == "enum":
            enum = fdp.enum_type.add(name=toks[i + 1])
            i += 2
            enum_body(enum, scope)
        else:
            raise ValueError(f"framework.proto: unexpected {kw!r} at top level")

    for field, type_name, where in pending:
        if type_name in _SCALARS:
            field.type = getattr(descriptor_pb2.FieldDescriptorProto, _SCALARS[type_name])
            continue
        # proto scoping: the innermost enclosing scope that declares the name wins
        parts = where.split(".")
        for k in range(len(parts), 0, -1):
            cand = ".".join(parts[:k]) + "." + type_name
            if cand in messages or cand in enums:
                field.type_name = cand
                field.type = (descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE
                              if cand in messages else descriptor_pb2.FieldDescriptorProto.TYPE_ENUM)
                break
        else:
            raise ValueError(f"framework.proto: unknown type {type_name!r} in {where}")
    return fdp


class _Messages:
    """The message classes of ``framework.proto`` as attributes (``ProgramDesc``, ...)."""

    def __init__(self, pool, package):
        self._pool = pool
        self._package = package

    def __getattr__(self, name):
        from google.protobuf import message_factory
        desc = self._pool.FindMessageTypeByName(f"{self._package}.{name}")
        cls = message_factory.GetMessageClass(desc)
        setattr(self, name, cls)
        return cls

    def descriptor(self, name):
        """The ``Descriptor`` of message ``name`` (dotted for nested ones)."""
        return self._pool.FindMessageTypeByName(f"{self._package}.{name}")


@functools.lru_cache(maxsize=1)
def messages():
    """The message classes (``messages().ProgramDesc`` ...); ``ProgramError`` without protobuf."""
    try:
        from google.protobuf import descriptor_pool
    except ImportError:
        raise ProgramError("reading Paddle programs needs the protobuf package: "
                           "pip install 'ssaexec[paddle]' (or pip install protobuf)") from None
    fdp = parse_proto(SCHEMA_PATH.read_text(encoding="utf-8"))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return _Messages(pool, fdp.package)


def enum_values(enum_name):
    """name -> number of enum ``enum_name`` of the schema (``"VarType.Type"``, ``"AttrType"``)."""
    pool = messages()._pool
    desc = pool.FindEnumTypeByName(f"{messages()._package}.{enum_name}")
    return {v.name: v.number for v in desc.values}
