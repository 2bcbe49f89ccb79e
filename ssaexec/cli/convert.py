"""``ssaexec convert``: rewrite a program file in the JSON or the text form.

OUT's suffix picks the form, and an unknown suffix fails before anything is read.
The input is validated as it is loaded. A startup program stored next to IN
(``STEM.startup.EXT``, ``ssaexec.program.defaults.find_startup``) is converted
along with it, next to OUT, unless ``--no-startup``.
"""

from pathlib import Path

from ..core.errors import ProgramError
from ..program.defaults import find_startup
from ..program.io import FORMATS, save_program
from .common import EXIT_OK, load_program_file

__all__ = ["register"]

EPILOG = """\
The output form follows OUT's suffix: .json, or .ssa/.txt/.prog (text). When
IN has a startup program next to it (STEM.startup.EXT), it is converted too.

examples:
  ssaexec convert examples/seed_mlp.json seed_mlp.ssa
  ssaexec convert seed_mlp.ssa seed_mlp.json
"""


def register(add):
    """Add the ``convert`` subcommand through ``add(name, help, epilog, parents)``."""
    p = add("convert", "convert a program between the JSON and text forms", EPILOG)
    p.add_argument("input", metavar="IN", help="program to read (.json or .ssa/.txt/.prog)")
    p.add_argument("output", metavar="OUT", help="program to write; its suffix picks the form")
    p.add_argument("--no-startup", action="store_true",
                   help="do not convert IN's startup program along with it")
    p.set_defaults(func=cmd_convert)


def cmd_convert(args):
    if Path(args.output).suffix.lower() not in FORMATS:  # fail before reading anything
        raise ProgramError(f"{args.output}: unknown program file suffix "
                           f"{Path(args.output).suffix!r}; use one of {', '.join(FORMATS)}")
    program = load_program_file(args.input)
    save_program(program, args.output)
    form = "JSON" if Path(args.output).suffix.lower() == ".json" else "text"
    print(f"wrote {args.output} ({form} form)")
    if not args.no_startup:
        startup = find_startup(args.input)
        if startup is not None:
            out = Path(args.output)
            target = out.with_name(out.stem + ".startup" + out.suffix)
            save_program(load_program_file(startup), target)
            print(f"wrote {target} (its startup program, from {startup})")
    return EXIT_OK
