"""Size expressions: a tiny arithmetic language over batch symbols, parsed and bounded.

A program imported with a dynamic batch carries sizes that depend on it, such
as the ``[s0, 512]`` of a flatten: the string ``"s0"`` or ``"16*s0"``, over
symbols that the op's ``@sym`` attribute binds to input dimensions (see
``ssaexec.ops.aten``). The language, and nothing else::

    expr  := term (('+' | '-') term)*
    term  := unary (('*' | '//') unary)*
    unary := ('-' | '+') unary | atom
    atom  := INT | FLOAT | SYMBOL | FUNC '(' expr (',' expr)* ')' | '(' expr ')'

``FUNC`` is one of ``FUNCS``, sympy's spelling of integer division, rounding,
min/max and the like (what torch's symbolic shapes print). There is no ``**``,
no ``/``, no attribute access and no other call: the text is tokenized and
parsed here, never handed to ``eval`` or ``ast``.

Policy: parsing and evaluation are bounded, because the text comes from an
untrusted program file. An expression has at most ``max_expr_chars``
characters and nests at most 32 deep; integer literals have at most 19
digits; every intermediate value must stay within ``max_size_value`` (2**62,
see ``ssaexec.core.limits``) and be finite, and the result within
``max_tensor_elements`` (it is a size, or a scalar computed from sizes);
dividing by zero or a function outside its domain is an error. Every failure is
a ``ProgramError`` quoting the text.
"""

import math
import re
import threading

from ..core.errors import ProgramError
from ..core.limits import get_limit

__all__ = ["FUNCS", "parse_size_expr"]

_MAX_DEPTH = 32
_MAX_LITERAL_DIGITS = 19


def _floordiv(a, b):
    if b == 0:
        raise ZeroDivisionError("division by zero")
    return a // b


def _ceildiv(a, b):
    return -_floordiv(-a, b)


def _mod(a, b):
    if b == 0:
        raise ZeroDivisionError("modulo by zero")
    return a % b


def _truediv(a, b):
    if b == 0:
        raise ZeroDivisionError("division by zero")
    return a / b


def _sqrt(a):
    if a < 0:
        raise ValueError("square root of a negative number")
    return math.sqrt(a)


# name -> (function, least number of arguments, most (None: any))
FUNCS = {
    "FloorDiv": (_floordiv, 2, 2), "CleanDiv": (_floordiv, 2, 2), "CeilDiv": (_ceildiv, 2, 2),
    "Mod": (_mod, 2, 2), "PythonMod": (_mod, 2, 2),
    "IntTrueDiv": (_truediv, 2, 2), "FloatTrueDiv": (_truediv, 2, 2),
    "Max": (max, 2, None), "Min": (min, 2, None), "Abs": (abs, 1, 1),
    "ToFloat": (float, 1, 1),
    "TruncToInt": (lambda a: int(math.trunc(a)), 1, 1),
    "TruncToFloat": (lambda a: float(math.trunc(a)), 1, 1),
    "FloorToInt": (lambda a: int(math.floor(a)), 1, 1),
    "CeilToInt": (lambda a: int(math.ceil(a)), 1, 1),
    "OpaqueUnaryFn_sqrt": (_sqrt, 1, 1),
}

_TOKEN = re.compile(r"""
    (?P<SKIP>[ \t]+)
  | (?P<FLOAT>(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|[0-9]+[eE][-+]?[0-9]+)
  | (?P<INT>[0-9]+)
  | (?P<NAME>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<POW>\*\*)
  | (?P<OP>//|[-+*(),])
""", re.VERBOSE)


class _Fail(Exception):
    """A parse or evaluation problem; ``parse_size_expr`` adds the expression text."""


def _check(v):
    # bool is an int: a comparison never reaches here, but keep values numeric
    if isinstance(v, float):
        if not math.isfinite(v) or abs(v) > get_limit("max_size_value"):
            raise _Fail(f"a value ({v}) is out of range")
    elif abs(v) > get_limit("max_size_value"):
        raise _Fail(f"a value exceeds the limit max_size_value={get_limit('max_size_value')}")
    return v


class _Parser:
    __slots__ = ("tokens", "pos", "depth", "symbols")

    def __init__(self, text):
        self.tokens = []
        pos = 0
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if m is None:
                raise _Fail(f"unexpected character {text[pos]!r} at column {pos + 1}; use "
                            "integers, symbols, + - * // ( ) and " + ", ".join(sorted(FUNCS)))
            if m.lastgroup == "POW":
                raise _Fail(f"'**' (power) at column {pos + 1} is not in the language; "
                            "write the product out")
            if m.lastgroup != "SKIP":
                self.tokens.append((m.lastgroup, m.group(), pos + 1))
            pos = m.end()
        self.tokens.append(("END", "", len(text) + 1))
        self.pos = 0
        self.depth = 0
        self.symbols = set()

    def peek(self):
        return self.tokens[self.pos]

    def take(self):
        tok = self.tokens[self.pos]
        self.pos += 1
        return tok

    def fail(self, want):
        tok, value, col = self.peek()
        found = "the end" if tok == "END" else repr(value)
        raise _Fail(f"expected {want} at column {col}, found {found}")

    def expect(self, value):
        if self.peek()[1] != value or self.peek()[0] != "OP":
            self.fail(repr(value))
        self.take()

    def enter(self):
        self.depth += 1
        if self.depth > _MAX_DEPTH:
            raise _Fail(f"nested more than {_MAX_DEPTH} deep")

    def parse(self):
        fn = self.expr()
        if self.peek()[0] != "END":
            self.fail("an operator (+ - * //) or the end")
        return fn

    def expr(self):
        fn = self.term()
        while self.peek()[0] == "OP" and self.peek()[1] in "+-":
            op = self.take()[1]
            fn = _binary(fn, self.term(), _add if op == "+" else _sub)
        return fn

    def term(self):
        fn = self.unary()
        while self.peek()[0] == "OP" and self.peek()[1] in ("*", "//"):
            op = self.take()[1]
            fn = _binary(fn, self.unary(), _mul if op == "*" else _floordiv)
        return fn

    def unary(self):
        tok, value, _ = self.peek()
        if tok == "OP" and value in "+-":
            self.take()
            self.enter()
            inner = self.unary()
            self.depth -= 1
            return inner if value == "+" else (lambda env: -inner(env))
        return self.atom()

    def atom(self):
        tok, value, col = self.peek()
        if tok == "INT":
            self.take()
            if len(value) > _MAX_LITERAL_DIGITS:
                raise _Fail(f"the integer at column {col} has more than {_MAX_LITERAL_DIGITS} "
                            "digits")
            v = _check(int(value))
            return lambda env: v
        if tok == "FLOAT":
            self.take()
            v = _check(float(value))
            return lambda env: v
        if tok == "NAME":
            self.take()
            if self.peek()[1] == "(" and self.peek()[0] == "OP":
                return self.call(value, col)
            if value in FUNCS:
                self.fail(f"'(' after function {value}")
            self.symbols.add(value)
            return _symbol(value)
        if tok == "OP" and value == "(":
            self.take()
            self.enter()
            fn = self.expr()
            self.expect(")")
            self.depth -= 1
            return fn
        self.fail("a number, a symbol, a function or '('")
        return None  # pragma: no cover - fail raises

    def call(self, name, col):
        entry = FUNCS.get(name)
        if entry is None:
            raise _Fail(f"{name!r} at column {col} is not a function of the language (those "
                        f"are {', '.join(sorted(FUNCS))})")
        func, least, most = entry
        self.take()  # '('
        self.enter()
        args = [self.expr()]
        while self.peek()[1] == "," and self.peek()[0] == "OP":
            self.take()
            args.append(self.expr())
        self.expect(")")
        self.depth -= 1
        if len(args) < least or (most is not None and len(args) > most):
            want = str(least) if least == most else f"at least {least}"
            raise _Fail(f"{name} takes {want} argument{'s' if want != '1' else ''}, "
                        f"got {len(args)}")
        return lambda env: _check(func(*(a(env) for a in args)))


def _symbol(name):
    def fn(env):
        try:
            return env[name]
        except (KeyError, TypeError):
            raise _Fail(f"symbol {name!r} has no value") from None
    return fn


def _add(a, b):
    return a + b


def _sub(a, b):
    return a - b


def _mul(a, b):
    return a * b


def _binary(left, right, op):
    # Both operands are within max_size_value before op runs, so one product is at most
    # 2**124: cheap to compute, then refused by _check if too large.
    return lambda env: _check(op(left(env), right(env)))


# Kernels compile their attrs on first use, on scheduler threads: the cache is shared.
_LOCK = threading.Lock()
_PARSED = {}
_CACHE_MAX = 4096


def parse_size_expr(text):
    """Compile size expression ``text`` into ``(fn(env) -> number, symbols)``.

    Parameters
    ----------
    text : str
        The expression (module docstring).

    Returns
    -------
    fn : callable
        ``fn(env)`` evaluates the expression with ``env`` mapping each symbol to
        its value; it raises ``ProgramError`` when a value leaves the bounds.
    symbols : set of str
        The symbols the expression uses.

    Raises
    ------
    ProgramError
        When ``text`` is not in the language or is too long or too deep.
    """
    with _LOCK:
        hit = _PARSED.get(text)
    if hit is None:
        hit = _compile(text)
        with _LOCK:
            if len(_PARSED) >= _CACHE_MAX:  # bounded: texts come from files
                _PARSED.clear()
            _PARSED[text] = hit
    return hit[0], set(hit[1])


def _shown(v):
    return str(v) if isinstance(v, float) or v.bit_length() <= 64 else "<huge>"


def _quote(text):
    return repr(text) if len(text) <= 80 else repr(text[:77]) + "..."


def _compile(text):
    if not isinstance(text, str):
        raise ProgramError(f"size expression {text!r} is not a string")
    if len(text) > get_limit("max_expr_chars"):
        raise ProgramError(f"size expression {_quote(text)} is longer than "
                           f"{get_limit('max_expr_chars')} characters")
    try:
        parser = _Parser(text)
        body = parser.parse()
    except _Fail as e:
        raise ProgramError(f"size expression {_quote(text)}: {e}") from None

    def fn(env):
        try:
            value = body(env)
            # The value is a size, or a scalar computed from sizes: never more than a
            # tensor may hold. This bounds what a factory op allocates at run time, where
            # the batch (the symbols' values) is known.
            if abs(value) > get_limit("max_tensor_elements"):
                raise _Fail(f"its value {_shown(value)} is above the limit "
                            f"max_tensor_elements={get_limit('max_tensor_elements')}")
            return value
        except _Fail as e:
            raise ProgramError(f"size expression {_quote(text)}: {e}") from None
        except (ZeroDivisionError, ValueError, OverflowError, TypeError) as e:
            raise ProgramError(f"size expression {_quote(text)}: {e}") from None

    return fn, frozenset(parser.symbols)
