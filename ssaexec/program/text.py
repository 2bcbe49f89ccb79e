"""The text form of a program: ``program_to_text`` / ``program_from_text``.

What ``print(program)`` shows, readable in the spirit of Paddle's docs::

    ssaexec-program v1 random_seed=0
    names fc=1 tmp=3

    block 0 parent=-1 {
      var x : float32[-1, 13] data stop_gradient
      var w : float32[13, 1] persistable parameter
      var h : float32[-1, 1]
      h = mul(X=x, Y=w) {x_num_col_dims=1, y_num_col_dims=1}
      {X@GRAD=@EMPTY@, Y@GRAD=w@GRAD} = mul_grad(X=x, Y=w, Out@GRAD=h@GRAD) @backward [w -> w@GRAD]
    }

Grammar (one statement per line; newlines inside ``()``, ``[]`` and the ``{}``
of an op do not end it; ``#`` starts a comment outside strings)::

    program  := header [names] block*
    header   := 'ssaexec-program' 'v1' 'random_seed' '=' INT
    names    := 'names' (name '=' INT)*                      # ProgramDesc.name_counts
    block    := 'block' INT 'parent' '=' INT '{' (var | op)* '}'
    var      := 'var' name ':' DTYPE ['[' INT, ... ']'] FLAG*  # no brackets: shape unknown
    FLAG     := 'persistable' | 'parameter' | 'data' | 'stop_gradient'
    op       := outs '=' name '(' slot, ... ')' ['{' name '=' value, ... '}']
                ['@' ROLE] ['[' name '->' name, ... ']']     # role only when not forward
    outs     := name                                         # exactly {"Out": [name]}
              | '{' slot, ... '}'
    slot     := name '=' (name | '[' name, ... ']')          # one name bare, else a list
    value    := INT | FLOAT | inf | -inf | nan | true | false | null | STRING
              | 'block' '(' INT ')' | '[' value, ... ']'
    name     := WORD | JSON string    # WORD: [A-Za-z0-9_.@/+-]+, not var/block/names

Invariants: ``program_from_text(program_to_text(p)) == p`` and text written by
``program_to_text`` reads back and re-prints identically (floats use ``repr``, so
they round-trip bit for bit; ints and floats stay distinct because a float
always prints with ``.``, ``e``, ``inf`` or ``nan``). The parser is a regex
tokenizer plus recursive descent; every syntax error raises ``ProgramError``
``"SOURCE:LINE:COL: expected ..., found ..."``. Nothing is ever evaluated.
Every op keeps the position of its first token (``OpDesc.pos``), so that
validation errors name ``SOURCE:LINE:COL`` too.

Reading is bounded, because files are untrusted (docs/security.md): brackets
nested deeper than ``max_nesting``, integers longer than ``max_int_digits``
digits, numbers that overflow a float (``1e999``), blocks nested deeper than
``max_block_depth``, repeated keys (slots, attributes, name counts) and strings
holding unpaired surrogates are errors at their line and column; so are declared
shapes above ``max_tensor_elements`` and ops the operator policy refuses
(``ssaexec.ops.policy``).

The printer is ``ssaexec.program.text_write`` (below ``ProgramDesc``, which prints with
it); this module, the parser, builds programs and so imports ``ssaexec.program.desc``.
"""

import json
import math
import re

from ..core.errors import ProgramError
from ..core.limits import depth_problem, get_limit, shape_problem
from ..ops.policy import op_problem
from .bounds import rank_attr_problem
from .desc import DTYPES, ROLES, BlockRef, OpDesc, ProgramDesc, VarDesc
from .json_write import VERSION
from .text_write import MAGIC, VAR_FLAGS, WORD, program_to_text

__all__ = ["program_to_text", "program_from_text"]

_FLAG_WORDS = {word: attr for attr, word in VAR_FLAGS}
_INT = re.compile(r"[-+]?[0-9]+\Z")
_FLOAT = re.compile(r"[-+]?(?:[0-9]+\.[0-9]*|\.[0-9]+|[0-9]+)(?:[eE][-+]?[0-9]+)?\Z")
_NONFINITE = {"inf": math.inf, "+inf": math.inf, "-inf": -math.inf, "nan": math.nan}
_SURROGATE = re.compile("[\ud800-\udfff]")


# --- tokenizing ---------------------------------------------------------------------------
_TOKEN = re.compile(r"""
    (?P<SKIP>[ \t\r\f]+|\#[^\n]*)
  | (?P<NL>\n)
  | (?P<STRING>"(?:[^"\\\n]|\\.)*")
  | (?P<ARROW>->)
  | (?P<WORD>""" + WORD + r""")
  | (?P<PUNCT>[{}()\[\],=:])
""", re.VERBOSE)


class _Token:
    __slots__ = ("ttype", "value", "line", "col")

    def __init__(self, ttype, value, line, col):
        self.ttype = ttype
        self.value = value
        self.line = line
        self.col = col

    def describe(self):
        if self.ttype == "NL":
            return "end of line"
        if self.ttype == "EOF":
            return "end of input"
        if self.ttype == "STRING":
            return f"string {json.dumps(self.value, ensure_ascii=False)}"
        return f"'{self.value}'"


def _tokenize(text, source):
    tokens = []
    pos, line, line_start = 0, 1, 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        col = pos - line_start + 1
        if m is None:
            what = "unterminated string" if text[pos] == '"' else f"character {text[pos]!r}"
            raise ProgramError(f"{source}:{line}:{col}: unexpected {what}")
        ttype, raw = m.lastgroup, m.group()
        if ttype == "NL":
            tokens.append(_Token("NL", raw, line, col))
            line, line_start = line + 1, m.end()
        elif ttype == "STRING":
            try:
                value = json.loads(raw)
            except ValueError as e:
                raise ProgramError(f"{source}:{line}:{col}: bad string {_clip(raw)}: "
                                   f"{e}") from None
            if _SURROGATE.search(value):
                raise ProgramError(f"{source}:{line}:{col}: string {_clip(raw)} holds an "
                                   "unpaired surrogate (not valid Unicode text)")
            tokens.append(_Token("STRING", value, line, col))
        elif ttype != "SKIP":
            tokens.append(_Token(ttype, raw, line, col))
        pos = m.end()
    tokens.append(_Token("EOF", "", line, len(text) - line_start + 1))
    return tokens


def _clip(text):
    return text if len(text) <= 60 else text[:57] + "..."


# --- parsing ------------------------------------------------------------------------------
def program_from_text(text, source="<string>"):
    """Parse the text form of a program.

    Parameters
    ----------
    text : str
        Text as written by ``program_to_text`` (hand edits welcome).
    source : str
        File name (or other label) used in error messages.

    Returns
    -------
    ProgramDesc

    Raises
    ------
    ProgramError
        ``"SOURCE:LINE:COL: expected ..., found ..."`` on any syntax error.
    """
    return _Parser(text, source).program()


class _Parser:
    """Recursive descent over the token list; ``depth`` > 0 means newlines are blanks."""

    __slots__ = ("source", "tokens", "pos", "depth", "depths")

    def __init__(self, text, source):
        self.source = source
        self.tokens = _tokenize(text, source)
        self.pos = 0
        self.depth = 0
        self.depths = []  # per block read so far: how deep it nests (block 0: 0)

    # -- token helpers
    def peek(self):
        if self.depth:
            while self.tokens[self.pos].ttype == "NL":
                self.pos += 1
        return self.tokens[self.pos]

    def advance(self):
        tok = self.peek()
        if tok.ttype != "EOF":
            self.pos += 1
        return tok

    def fail(self, tok, message):
        raise ProgramError(f"{self.source}:{tok.line}:{tok.col}: {message}")

    def expected(self, what, tok=None):
        tok = tok or self.peek()
        self.fail(tok, f"expected {what}, found {tok.describe()}")

    def at(self, ttype, value=None):
        tok = self.peek()
        return tok.ttype == ttype and (value is None or tok.value == value)

    def expect(self, ttype, value=None, what=None):
        if not self.at(ttype, value):
            self.expected(what or f"'{value}'")
        return self.advance()

    def skip_blank_lines(self):
        while self.tokens[self.pos].ttype == "NL":
            self.pos += 1

    def end_of_line(self):
        if not (self.at("NL") or self.at("EOF")):
            self.expected("end of line")
        self.advance()

    def open(self, char):
        tok = self.expect("PUNCT", char)
        self.depth += 1
        if self.depth > get_limit("max_nesting"):
            self.fail(tok, f"nested more than {get_limit('max_nesting')} deep (the limit "
                           "max_nesting)")

    def close(self, char, what):
        if not self.at("PUNCT", char):
            self.expected(f"{what} or '{char}'")
        self.depth -= 1
        self.advance()

    def comma_list(self, close, item, what):
        """``item`` repeated, separated by commas (trailing comma allowed), then ``close``."""
        items = []
        while not self.at("PUNCT", close):
            items.append(item())
            if not self.at("PUNCT", ","):
                break
            self.advance()
        self.close(close, "','" if items else what)
        return items

    def integer(self, what="an integer"):
        tok = self.peek()
        if tok.ttype != "WORD" or not _INT.match(tok.value):
            self.expected(what)
        self.advance()
        return self.to_int(tok)

    def to_int(self, tok):
        # int() of a long digit string is quadratic and CPython refuses over 4300 digits
        digits = len(tok.value.lstrip("+-"))
        if digits > get_limit("max_int_digits"):
            self.fail(tok, f"an integer of {digits} digits is out of range (the limit "
                           f"max_int_digits={get_limit('max_int_digits')})")
        return int(tok.value)

    def name(self, what="a name", allow_empty=False):
        tok = self.peek()
        if tok.ttype not in ("WORD", "STRING") or not (tok.value or allow_empty):
            self.expected(what)
        return self.advance().value

    # -- grammar
    def program(self):
        self.skip_blank_lines()
        if not self.at("WORD", MAGIC):
            self.expected(f"the header '{MAGIC} v{VERSION} random_seed=N'")
        self.advance()
        tok = self.peek()
        m = re.fullmatch(r"v([0-9]+)", tok.value) if tok.ttype == "WORD" else None
        if m is None:
            self.expected(f"a version like 'v{VERSION}'")
        if m.group(1).lstrip("0") != str(VERSION):
            self.fail(tok, f"unsupported version {_clip(m.group(1))}; this ssaexec reads version "
                           f"{VERSION} only")
        self.advance()
        self.expect("WORD", "random_seed")
        self.expect("PUNCT", "=")
        program = ProgramDesc(self.integer("the random seed (an integer)"))
        self.end_of_line()
        self.skip_blank_lines()
        counts = {}
        if self.at("WORD", "names"):
            self.advance()
            while not (self.at("NL") or self.at("EOF")):
                tok = self.peek()
                key = self.name("a name prefix", allow_empty=True)
                if key in counts:
                    self.fail(tok, f"name prefix {key!r} appears twice")
                self.expect("PUNCT", "=")
                counts[key] = self.integer("a name count (an integer)")
            self.end_of_line()
        program.set_name_counts(counts)
        self.skip_blank_lines()
        read = 0  # blocks read so far (block 0 exists in a new program already)
        while not self.at("EOF"):
            self.block(program, read)
            read += 1
            self.skip_blank_lines()
        if not read:
            self.expected("'block 0 parent=-1 {'")
        return program

    def block(self, program, idx):
        self.expect("WORD", "block", "'block'" if idx else "'block 0 parent=-1 {'")
        tok = self.peek()
        if self.integer("a block index") != idx:
            self.expected(f"block index {idx} (blocks are listed in order)", tok)
        self.expect("WORD", "parent")
        self.expect("PUNCT", "=")
        tok = self.peek()
        parent = self.integer("a parent block index")
        if not (parent == -1 if idx == 0 else -1 <= parent < idx):
            self.expected("-1 (block 0 has no parent)" if idx == 0 else
                          f"a parent index from -1 to {idx - 1} (an earlier block)", tok)
        # the nesting bound, before anything walks the blocks recursively
        self.depths.append(0 if parent < 0 else self.depths[parent] + 1)
        problem = depth_problem(self.depths[idx], f"block {idx}")
        if problem:
            self.fail(tok, problem)
        self.expect("PUNCT", "{")
        self.end_of_line()
        block = program.global_block() if idx == 0 else program.create_block(parent_idx=parent)
        while True:
            self.skip_blank_lines()
            if self.at("PUNCT", "}"):
                break
            if self.at("EOF"):
                self.expected(f"a var, an op or '}}' closing block {idx}")
            if self.at("WORD", "var"):
                self.var(block)
            else:
                block.add_op(self.op())
            self.end_of_line()
        self.advance()
        self.end_of_line()
        return block

    def var(self, block):
        self.advance()
        tok = self.peek()
        name = self.name("a var name")
        if name in block.vars:
            self.fail(tok, f"var {name!r} is declared twice in block {block.idx}")
        self.expect("PUNCT", ":")
        tok = self.peek()
        if tok.ttype != "WORD" or tok.value not in DTYPES:
            self.expected(f"a dtype ({', '.join(DTYPES)})")
        dtype = self.advance().value
        shape = None
        if self.at("PUNCT", "["):
            bracket = self.peek()
            self.open("[")
            shape = self.comma_list("]", lambda: self.integer("a dimension (an integer)"),
                                    "a dimension")
            problem = shape_problem(shape, f"var {name!r}: shape")
            if problem:
                self.fail(bracket, problem)
        flags = {}
        while self.at("WORD") and self.peek().value in _FLAG_WORDS:
            flags[_FLAG_WORDS[self.advance().value]] = True
        if not (self.at("NL") or self.at("EOF")):
            self.expected(f"a var flag ({', '.join(_FLAG_WORDS)}) or end of line")
        block.add_var(VarDesc(name, shape, dtype, **flags))

    def slots(self, close):
        def slot():
            tok = self.peek()
            key = self.name("a slot name", allow_empty=True)
            self.expect("PUNCT", "=")
            if self.at("PUNCT", "["):
                self.open("[")
                names = self.comma_list("]", lambda: self.name("a var name"), "a var name")
            else:
                names = [self.name("a var name or '['")]
            return tok, key, names
        return self._unique(self.comma_list(close, slot, "a slot"), "slot")

    def _unique(self, items, what):
        out = {}
        for tok, key, value in items:
            if key in out:
                self.fail(tok, f"{what} {key!r} appears twice")
            out[key] = value
        return out

    def op(self):
        first = self.peek()
        if self.at("PUNCT", "{"):
            self.open("{")
            outputs = self.slots("}")
        elif first.ttype in ("WORD", "STRING"):
            outputs = {"Out": [self.name()]}
        else:
            self.expected("'var', an op ('out = type(...)' or '{Slot=out, ...} = type(...)') "
                          "or '}'")
        self.expect("PUNCT", "=")
        type_tok = self.peek()
        op_type = self.name("an op type")
        self.open("(")
        inputs = self.slots(")")
        attrs = {}
        attr_toks = {}
        if self.at("PUNCT", "{"):
            self.open("{")

            def attr():
                tok = self.peek()
                key = self.name("an attribute name", allow_empty=True)
                self.expect("PUNCT", "=")
                attr_toks.setdefault(key, tok)
                return tok, key, self.value()
            attrs = self._unique(self.comma_list("}", attr, "an attribute"), "attribute")
        # the operator policy and the rank of per-dimension lists (program.bounds), at load time
        bad = op_problem(op_type, attrs, inputs) or rank_attr_problem(attrs)
        if bad is not None:
            self.fail(attr_toks.get(bad[0], type_tok), bad[1])
        role = "forward"
        tok = self.peek()
        if tok.ttype == "WORD" and tok.value.startswith("@"):
            if tok.value[1:] not in ROLES:
                self.expected(f"a role (@{', @'.join(ROLES)})")
            role = self.advance().value[1:]
        role_var = []
        if self.at("PUNCT", "["):
            self.open("[")

            def pair():
                param = self.name("a parameter name")
                self.expect("ARROW", what="'->'")
                return param, self.name("a gradient name")
            role_var = self.comma_list("]", pair, "a 'param -> grad' pair")
        try:
            op = OpDesc(op_type, inputs, outputs, attrs, role, role_var)
        except ProgramError as e:  # pragma: no cover - the grammar already rules these out
            self.fail(first, str(e))
        op.pos = (self.source, first.line, first.col)  # for validation errors
        return op

    def value(self):
        tok = self.peek()
        if tok.ttype == "STRING":
            return self.advance().value
        if self.at("PUNCT", "["):
            self.open("[")
            return self.comma_list("]", self.value, "a value")
        if tok.ttype == "WORD":
            word = tok.value
            if word == "block":
                self.advance()
                self.open("(")
                idx = self.integer("a block index")
                self.close(")", "a block index")
                return BlockRef(idx)
            constant = {"true": True, "false": False, "null": None}
            if word in constant:
                self.advance()
                return constant[word]
            if _INT.match(word):
                self.advance()
                return self.to_int(tok)
            if word in _NONFINITE:
                self.advance()
                return _NONFINITE[word]
            if _FLOAT.match(word):
                value = float(word)
                if math.isinf(value):  # 1e999 would silently become inf
                    self.fail(tok, f"the number {_clip(word)} is out of range (it overflows "
                                   "a float); write inf or -inf for an infinite value")
                self.advance()
                return value
        self.expected("an attribute value (number, true, false, null, \"string\", [list] or "
                      "block(N))")
