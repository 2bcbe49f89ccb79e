"""Where a malformed protobuf message goes wrong: byte offset, field path, problem.

The protobuf package only says that a message "was corrupt". On that error path
(never when a file parses) ``locate`` walks the bytes again by the wire-format rules,
guided by the schema's descriptors, and reports the first problem as
``byte 1234 (blocks[0].ops[3].attrs[2]): length 4000000 runs past the end of its
enclosing message (12 bytes left)``.

The walk is bounded: it reads each byte at most once per enclosing message level,
and groups (a wire type our schema never uses) nest at most ``MAX_DEPTH`` deep.
"""

__all__ = ["locate", "MAX_DEPTH"]

MAX_DEPTH = 100  # the protobuf library's own recursion limit


class _Bad(Exception):
    def __init__(self, offset, path, problem):
        super().__init__(problem)
        self.offset, self.path, self.problem = offset, path, problem


def _varint(data, pos, end, path, what):
    result = shift = 0
    start = pos
    while True:
        if pos >= end:
            raise _Bad(start, path, f"{what} is cut off by the end of its enclosing message")
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise _Bad(start, path, f"{what} is longer than 10 bytes")


def _walk(data, pos, end, desc, path, depth, group=None):
    counts = {}
    while pos < end:
        start = pos
        key, pos = _varint(data, pos, end, path, "a field tag")
        number, wire = key >> 3, key & 7
        if key > 0xFFFFFFFF or number == 0:
            raise _Bad(start, path, f"field number {number} is not valid")
        field = desc.fields_by_number.get(number) if desc is not None else None
        here = path
        if field is not None:
            k = counts.get(number, 0)
            counts[number] = k + 1
            sep = "." if path else ""
            here = f"{path}{sep}{field.name}" + (f"[{k}]" if _repeated(field) else "")
        if wire == 0:
            _, pos = _varint(data, pos, end, here, "a varint")
        elif wire == 1 or wire == 5:
            size = 8 if wire == 1 else 4
            if pos + size > end:
                raise _Bad(start, here, f"a {size * 8}-bit value is cut off by the end of its "
                                        "enclosing message")
            pos += size
        elif wire == 2:
            length, body = _varint(data, pos, end, here, "a length")
            if length > end - body:
                raise _Bad(start, here, f"length {length} runs past the end of its enclosing "
                                        f"message ({end - body} bytes left)")
            pos = body + length
            if field is not None and field.message_type is not None:
                _walk(data, body, pos, field.message_type, here, depth + 1)
        elif wire == 3:
            if depth >= MAX_DEPTH:
                raise _Bad(start, here, f"groups nest more than {MAX_DEPTH} deep")
            pos = _walk(data, pos, end, None, here, depth + 1, group=number)
        elif wire == 4:
            if group != number:
                raise _Bad(start, here, f"an end-group tag for field {number} closes no group")
            return pos
        else:
            raise _Bad(start, here, f"wire type {wire} does not exist (field {number})")
    if group is not None:
        raise _Bad(end, path, f"group of field {group} is not closed")
    return pos


def _repeated(field):
    if hasattr(field, "is_repeated"):  # protobuf >= 6 (``label`` is gone in 7)
        return field.is_repeated
    return field.label == field.LABEL_REPEATED


def locate(data, descriptor):
    """The first wire-format problem of ``data`` as a message of ``descriptor``.

    Parameters
    ----------
    data : bytes
    descriptor : google.protobuf.descriptor.Descriptor

    Returns
    -------
    (int, str, str) or None
        ``(byte offset, field path, problem)``, or None when the walk finds nothing
        wrong (the protobuf library refused the bytes for a reason outside the wire
        rules).
    """
    try:
        _walk(data, 0, len(data), descriptor, "", 0)
    except _Bad as e:
        return e.offset, e.path, e.problem
    return None
