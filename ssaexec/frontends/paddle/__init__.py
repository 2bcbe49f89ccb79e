"""``from_paddle``: run Paddle programs: Paddle 3's PIR JSON (``model.json``) and the legacy
``ProgramDesc`` (``.pdmodel``, serialized programs), and fine-tune what they hold.

    model = se.from_paddle("model.pdmodel", params="model.pdiparams")
    exe = se.Executor(se.CPUPlace())
    exe.run(model.startup)
    out, = exe.run(model.main, feed={model.feed[0]: x}, fetch_list=model.fetch)

The modules, one step each:

* ``pir_reader``: PIR program JSON -> ``PirProgram`` (SSA checked, every error
  located by line, column and JSON path); ``pir_convert``: ``PirProgram`` -> the
  legacy ``PaddleProgram``, so both formats share the op table below;
* ``schema``: the message classes of our ``framework.proto`` (the fields we read
  of Paddle's format), made by the ``protobuf`` package at first use;
* ``reader``: bytes -> ``PaddleProgram`` (blocks, vars, ops, decoded attributes),
  every malformed input a ``ProgramError`` with its position (``wire`` finds the
  byte where a message stops being protobuf);
* ``ops``: the table of Paddle op types and how each becomes ssaexec ops,
  forward, gradient and optimizer ops alike;
* ``convert``: ``PaddleProgram`` -> ssaexec ``Program`` through the ``BlockDesc``
  API, with the feed vars, fetch targets and loss the file implies;
* ``params``: Paddle's parameter files (``.pdiparams`` and per-var directories),
  read into tensors and written back in the same format;
* ``evalmode``: ``clone(for_test=True)`` of an imported training program undoes
  the training-only ops the import adds (registered with ``register_test_rewrite``);
* ``finetune``: a label, a loss and an optimizer on an imported inference program.

Policy: Paddle files are untrusted data (docs/security.md). Reading one parses it
and nothing else: no code from the file runs, no file but the ones named is
opened (a parameter directory is only read at ``DIR/<var name>`` for plain var
names), sizes are bounded by ``ssaexec.core.limits`` before anything is allocated, and
the converted program goes through ``validate()`` and so the operator policy.
``protobuf`` is an optional dependency (``pip install 'ssaexec[paddle]'``); it is
imported when the first Paddle file is read.

Importing this package registers readers with ``ssaexec.program.io.load_program``
(``register_reader``), so ``se.load_program`` and every CLI command take Paddle
files: ``.pdmodel``/``.pdprog`` read as the converted program, a ``.json`` file whose
content is a PIR program too (``register_sniffer``: ssaexec's own JSON programs stay
ssaexec's), ``.pdiparams`` as a startup program that sets the parameters (its program
is the one ``.pdmodel``, ``.pdprog`` or PIR ``.json`` file of the same stem next to it;
two such files are ambiguous, and refused).

Values. A parameter file is decoded against the program it is loaded with and every
value checked against that program's declarations (``runtime.boundary``); a tool that
runs a program with a parameter file decodes it against the program being run
(``params_startup``), never against another file that happens to lie beside it.
"""

import collections
import os
from pathlib import Path

from ...core.errors import ProgramError
from ...ops.aten import encode_bytes
from ...program.desc import Program, register_test_rewrite
from ...program.io import register_reader, register_sniffer
from ...runtime.boundary import check_value
from ...core.safe_files import NotRegularFile, open_regular, read_regular
from .convert import convert_program, unsupported_ops
from .evalmode import to_inference
from .finetune import finetune
from .ops import MAPPINGS, mapping_table
from .params import load_params, save_params
from .pir_convert import to_legacy
from .pir_reader import decode_pir, is_pir
from .reader import PaddleProgram, decode_program

__all__ = ["from_paddle", "PaddleModel", "finetune", "read_program", "load_params",
           "params_startup", "is_program_file",
           "save_params", "persistable_names", "decode_program", "convert_program",
           "unsupported_ops", "mapping_table", "MAPPINGS", "SUFFIXES", "PARAMS_SUFFIX",
           "is_paddle_file"]

PaddleModel = collections.namedtuple("PaddleModel", ["main", "startup", "feed", "fetch"])
PaddleModel.__doc__ = """What ``from_paddle`` returns.

main : Program
    The converted program.
startup : Program
    Initialises every persistable var of ``main``.
feed : list of str
    The data vars to feed.
fetch : list of str
    An inference model's fetch targets, or ``[loss]`` of a training program.
"""

# Suffixes of Paddle program files: an inference model, a serialized program
SUFFIXES = (".pdmodel", ".pdprog")
PARAMS_SUFFIX = ".pdiparams"


def is_paddle_file(path):
    """True when ``path`` names a Paddle program or parameter file by its suffix."""
    return Path(path).suffix.lower() in SUFFIXES + (PARAMS_SUFFIX,)


def _bytes_of(value, what):
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value), f"<{what} bytes>"
    path = Path(value)
    try:
        return read_regular(path), str(path)  # a FIFO or a device: refused, not waited on
    except FileNotFoundError:
        raise ProgramError(f"{path}: no such {what} file") from None
    except NotRegularFile as e:  # a folder, a FIFO, a device
        raise ProgramError(f"{path}: is {e.kind}, not a {what} file") from None
    except OSError as e:
        raise ProgramError(f"{path}: cannot read {what} file: {e.strerror or e}") from None


def read_program(program):
    """Decode a Paddle program from a path or bytes into a ``PaddleProgram``: a legacy
    ``ProgramDesc`` (``.pdmodel``), or a PIR program JSON (``.json``, told apart by its
    content), translated to the legacy form (``pir_convert``)."""
    data, source = _bytes_of(program, "Paddle program")
    return read_program_bytes(data, source)


def _read_main(data, source):
    """``load_program``'s reader of ``.pdmodel``/``.pdprog`` files (and PIR ``.json``
    ones): the converted program."""
    return convert_program(read_program_bytes(data, source)).program


def read_program_bytes(data, source):
    """``read_program`` of bytes already read: PIR JSON or a legacy ProgramDesc."""
    if is_pir(data):
        return to_legacy(decode_pir(data, source))
    return decode_program(data, source)


def _read_params(data, source):
    """``load_program``'s reader of ``.pdiparams`` files: a startup program setting them.

    The records carry no names, so the program they belong to is read from the file
    next to them with the same stem (``model.pdmodel``, ``model.pdprog``, or a PIR
    ``model.json``).
    """
    path = Path(source)
    siblings = [s for s in (path.with_suffix(x) for x in SUFFIXES + (".json",))
                if s.is_file() and is_program_file(s)]
    if len(siblings) > 1:
        # records carry no names: decoded against the wrong one they would set other
        # vars, or values of other shapes
        raise ProgramError(f"{source}: {' and '.join(s.name for s in siblings)} are both "
                           "next to it; say which program it belongs to (ssaexec run "
                           f"PROGRAM --startup {path.name}, or from_paddle(PROGRAM, "
                           "params=...))")
    if siblings:
        return from_paddle(siblings[0], params=path).startup  # errors name the file
    raise ProgramError(f"{source}: a parameter file is read with its program, "
                       f"{path.with_suffix(SUFFIXES[0]).name}, which is not there")


def is_program_file(path):
    """True when ``path`` is a Paddle program file: ``.pdmodel``/``.pdprog``, or a
    ``.json`` file whose content is a PIR program."""
    path = Path(path)
    suffix = path.suffix.lower()
    return suffix in SUFFIXES or (suffix == ".json" and _sniff_file(path))


def params_startup(params, program):
    """The startup program setting the values of ``params`` (a ``.pdiparams`` file),
    decoded against ``program``, the Paddle program file being run, and checked
    against its declarations.

    Raises
    ------
    ProgramError
        When ``program`` is not a Paddle program file (the records carry no names:
        only their own program says which var each one is), or the file does not fit it.
    """
    if not is_program_file(program):
        raise ProgramError(f"{params}: a Paddle parameter file is decoded against the Paddle "
                           f"program it belongs to, and the program being run, {program}, is "
                           "not one (a PIR .json, .pdmodel or .pdprog file)")
    return from_paddle(program, params=params).startup


def _sniff_file(path):
    try:  # a FIFO is not opened (it would wait for a writer): the reader names it
        with os.fdopen(open_regular(path), "rb") as f:
            return is_pir(f.read(4096))
    except OSError:
        return False


register_test_rewrite(to_inference)
for _suffix in SUFFIXES:
    register_reader(_suffix, _read_main)
register_reader(PARAMS_SUFFIX, _read_params)
register_sniffer(".json", is_pir, _read_main)  # Paddle 3's PIR JSON, by its content


def persistable_names(program):
    """The vars of a Paddle program's combined parameter file, in file order."""
    pp = program if isinstance(program, PaddleProgram) else read_program(program)
    return pp.persistable_names()


def from_paddle(program, params=None, startup=None, *, validate=True):
    """Import a Paddle program (and its parameters) as ssaexec programs.

    Parameters
    ----------
    program : str, os.PathLike or bytes
        A PIR program JSON file (``model.json``, Paddle 3's default), a ``.pdmodel`` /
        ``__model__`` file or ``program.desc.serialize_to_string()``.
    params : str, os.PathLike or bytes, optional
        A combined parameter file (``.pdiparams``, or its bytes) or a directory of
        per-var files (``save_persistables``). Its values initialise the vars it holds.
    startup : str, os.PathLike or bytes, optional
        Paddle's startup program, converted to initialise the persistables that
        ``params`` does not hold (its random initialisers draw from ssaexec's
        generator, so their values differ from Paddle's).
    validate : bool
        Validate both programs before returning.

    Returns
    -------
    PaddleModel
        ``(main, startup, feed, fetch)``.

    Raises
    ------
    ProgramError
        For malformed files (with the byte or block/op position), unsupported ops
        (all of them, with counts), parameter files that do not fit the program, and
        persistable vars that nothing initialises.
    """
    pp = read_program(program)
    conv = convert_program(pp, validate=validate)
    main = conv.program
    block = main.global_block()
    values = {}
    if params is not None:
        source = "<params bytes>" if isinstance(params, (bytes, bytearray, memoryview)) else None
        loaded = load_params(params, pp.persistable_names(), source)
        values = _check_values(loaded, block, params)
    if startup is not None:
        start = convert_program(read_program(startup), validate=False).program
        sblock = start.global_block()
        for op in list(sblock.ops):
            outs = op.output_names()
            if outs and all(n in values for n in outs):
                sblock.remove_op(op)
    else:
        start = Program()
        sblock = start.global_block()
    for name, var in block.vars.items():
        if name not in values:
            continue
        if not sblock.has_var(name):
            sblock.create_var(name, var.shape, var.dtype, persistable=True,
                              is_parameter=var.is_parameter, stop_gradient=var.stop_gradient)
        tensor = values[name]
        sblock.append_op("assign_bytes", {}, {"Out": [name]},
                         {"shape": list(tensor.shape), "dtype": var.dtype,
                          "data": encode_bytes(tensor)})
    written = {n for op in sblock.ops for n in op.output_names()}
    missing = [n for n, v in block.vars.items() if v.persistable and n not in written]
    if missing:
        shown = ", ".join(repr(n) for n in missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise ProgramError(f"{pp.source}: nothing initialises {len(missing)} persistable vars "
                           f"({shown}); pass params= (a .pdiparams file or a directory) or "
                           "startup= (Paddle's startup program)")
    if validate:
        start.validate()
    return PaddleModel(main, start, conv.feed, conv.fetch)


def _check_values(loaded, block, params):
    """The decoded values, each checked against ``block``'s declaration (the boundary
    rule); a one-element value of a var declared ``[]`` or ``[1]`` takes that shape
    (Paddle stores scalars either way)."""
    source = f"parameter file {params}" if not isinstance(
        params, (bytes, bytearray, memoryview)) else "the parameter bytes"
    out = {}
    for name, tensor in loaded.items():
        var = block.find_var(name)
        if var is None:
            continue  # a persistable of a sub-block or a non-tensor var: nothing reads it here
        if var.shape in ([], [1]) and tensor.numel() == 1 and list(tensor.shape) != var.shape:
            tensor = tensor.reshape(var.shape)
        out[name] = check_value(var, tensor, source)
    return out
