# SQL92 property selectors in the style of RocketMQ's message filter.
# Source of the dialect: docs: RocketMQ SQL92 filter (REFERENCE.md).
#
# Grammar (EBNF). Keywords are case-insensitive, identifiers case-sensitive.
#
#   selector   = or_expr EOF ;
#   or_expr    = and_expr { "OR" and_expr } ;
#   and_expr   = not_expr { "AND" not_expr } ;
#   not_expr   = { "NOT" } primary ;
#   primary    = "(" or_expr ")" | operand predicate ;
#   predicate  = cmp_op operand
#              | [ "NOT" ] "BETWEEN" operand "AND" operand
#              | [ "NOT" ] "IN" "(" in_item { "," in_item } ")"
#              | "IS" [ "NOT" ] "NULL"
#              | [ "NOT" ] ( "CONTAINS" | "STARTSWITH" | "ENDSWITH" ) string ;
#   cmp_op     = "=" | "<>" | "!=" | "<" | "<=" | ">" | ">=" ;
#   operand    = identifier | literal ;
#   literal    = string | integer | float | "TRUE" | "FALSE" | "NULL" ;
#   in_item    = string | integer | float ;
#   identifier = ( letter | "_" | "$" ) { letter | digit | "_" | "$" | "." } ;  (not a keyword)
#   integer    = [ "-" ] digit { digit } ;                    (must fit a signed 64-bit integer)
#   float      = [ "-" ] ( digits "." [ digits ] [ exp ] | "." digits [ exp ] | digits exp ) ;
#   exp        = ( "e" | "E" ) [ "+" | "-" ] digits ;
#   string     = "'" { any character but "'" | "''" } "'" ;   ("''" is one quote)
#
# Precedence: NOT binds tighter than AND, AND tighter than OR. TRUE/FALSE only take = and <>.
# BETWEEN with two literal bounds, the lower one greater, is an error (RocketMQ's rule).
#
# Coercion. Properties are strings; a missing property is NULL (the empty string is not NULL).
#   - property vs integer literal: the stripped text must be [+-]digits, else no coercion; it is
#     compared exactly whatever its length (past MAX_INT_DIGITS digits by sign, digit count and
#     digits, never through int(), which is quadratic and refuses more than 4,300 digits);
#   - property vs float literal: the stripped text must be a decimal number (ints qualify; nan/inf
#     do not) whose nearest double is finite; it is compared as that double;
#   - property vs TRUE/FALSE: the stripped text must be 'true' or 'false', any case;
#   - property vs string literal: compared as strings (code point order);
#   - property vs property: numerically when both coerce to numbers, else as strings;
#   - literal vs literal: integers and floats compare numerically; a string literal is coerced
#     like a property; a boolean against a number never compares.
# Three-valued logic (Kleene). A NULL operand, a NULL literal or a failed coercion makes a
# comparison UNKNOWN (None). NOT UNKNOWN = UNKNOWN; FALSE AND x = FALSE; TRUE OR x = TRUE;
# otherwise an UNKNOWN operand makes AND/OR UNKNOWN. Only IS [NOT] NULL tests nullness.
# BETWEEN x AND y is (v >= x AND v <= y). IN is TRUE on any equal element, FALSE when every
# comparison was definitely unequal, else UNKNOWN. CONTAINS/STARTSWITH/ENDSWITH with the empty
# string are FALSE, with or without NOT (RocketMQ's rule). A message matches only on TRUE.
# Every coercion and comparison takes time linear in the text's length: one property, however
# long, cannot stall a consumer.
"""RocketMQ-style SQL92 property selectors compiled once into a tree of closures.

`compile_selector(text)` parses the selector and returns a `Selector` whose `evaluate(props)`
gives True, False or None (UNKNOWN) for a mapping of property name to string value. Nothing is
parsed or evaluated as Python source; evaluation never raises on any property value.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from mqcore._ext.search import SELECTOR_CODES, SelectorProgram
from mqcore.errors import SelectorSyntaxError

__all__ = ["Selector", "compile_selector"]

Props = Mapping[str, object]
Predicate = Callable[[Props], bool | None]
Value = str | int | float | bool | None  # a literal's value
Compare = Callable[[Any, Any], bool]

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
MAX_DEPTH = 64

KEYWORDS = frozenset(
    "AND OR NOT BETWEEN IN IS NULL TRUE FALSE CONTAINS STARTSWITH ENDSWITH".split()
)
STRING_TESTS = ("CONTAINS", "STARTSWITH", "ENDSWITH")
OPERATORS: dict[str, Compare] = {
    "=": operator.eq,
    "<>": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
MIRRORED = {"=": "=", "<>": "<>", "<": ">", "<=": ">=", ">": "<", ">=": "<="}

# --------------------------------------------------------------------------------------------
# Coercion of property text
# --------------------------------------------------------------------------------------------

_INT_TEXT = re.compile(r"[+-]?[0-9]+")
# Unambiguous (each digit can be matched one way only), so a failing match backtracks in
# linear time; "[0-9]+\.?[0-9]*" was quadratic on a long run of digits and a non-digit.
_FLOAT_TEXT = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_BOOL_TEXT = {"true": True, "false": False}
MAX_INT_DIGITS = 400  # past every int64 and every finite double (309 digits)


class HugeInt:
    """An integer of more than MAX_INT_DIGITS significant digits, kept as its sign and digits.

    It lies beyond every int64 and every finite double, so against those its sign decides; two
    of them compare by sign, then digit count, then digits. Comparisons and hashing take linear
    time (int() of such text is quadratic, and refused past 4,300 digits)."""

    __slots__ = ("sign", "digits")

    def __init__(self, sign: int, digits: str) -> None:
        self.sign = sign
        self.digits = digits  # no leading zeros, more than MAX_INT_DIGITS of them

    def _order(self, other: object) -> int | None:
        """-1, 0 or 1 as self is below, equal to or above `other`; None for a non-number."""
        if isinstance(other, HugeInt):
            if self.sign != other.sign:
                return self.sign
            mine, theirs = (len(self.digits), self.digits), (len(other.digits), other.digits)
            return ((mine > theirs) - (mine < theirs)) * self.sign
        if isinstance(other, (int, float)) and not isinstance(other, bool):
            return self.sign
        return None

    def __eq__(self, other: object) -> bool:
        return self._order(other) == 0

    def __hash__(self) -> int:
        return hash((self.sign, self.digits))

    def __lt__(self, other: object) -> bool:
        return self._compared(other) < 0

    def __le__(self, other: object) -> bool:
        return self._compared(other) <= 0

    def __gt__(self, other: object) -> bool:
        return self._compared(other) > 0

    def __ge__(self, other: object) -> bool:
        return self._compared(other) >= 0

    def _compared(self, other: object) -> int:
        order = self._order(other)
        if order is None:
            raise TypeError(f"a HugeInt does not compare with {type(other).__name__}")
        return order


Integer = int | HugeInt


def _fetch(props: Props, name: str) -> str | None:
    """The property's text, or None when it is missing (or has no text form)."""
    raw = props.get(name)
    if raw is None or isinstance(raw, str):
        return raw
    try:
        return str(raw)
    except Exception:
        return None


def _as_str(text: str) -> str:
    """String comparison needs no coercion."""
    return text


def _integer(text: str) -> Integer:
    """Checked [+-]digits text as an int, or as a HugeInt past MAX_INT_DIGITS digits."""
    sign = -1 if text.startswith("-") else 1
    digits = text.lstrip("+-").lstrip("0")
    if len(digits) > MAX_INT_DIGITS:
        return HugeInt(sign, digits)
    return sign * int(digits or "0")


def _as_int(text: str) -> Integer | None:
    """`text` as an integer, or None when it is not [+-]digits (after stripping)."""
    if not (text.isascii() and text.isdigit()):  # the common case skips the regex
        text = text.strip()
        if _INT_TEXT.fullmatch(text) is None:
            return None
    return _integer(text)


def _as_float(text: str) -> float | None:
    """`text` as a finite float, or None when it is not a decimal number."""
    stripped = text.strip()
    if _FLOAT_TEXT.fullmatch(stripped) is None:
        return None
    number = float(stripped)  # correctly rounded, in linear time
    return number if math.isfinite(number) else None


def _as_bool(text: str) -> bool | None:
    """`text` as a boolean when it reads 'true' or 'false' in any case, else None."""
    return _BOOL_TEXT.get(text.strip().lower())


def _as_number(text: str) -> Integer | float | None:
    """`text` as an integer if it is one, else as a finite float, else None."""
    number = _as_int(text)
    return number if number is not None else _as_float(text)


COERCERS: dict[type, Callable[[str], object]] = {
    str: _as_str,
    int: _as_int,
    float: _as_float,
    bool: _as_bool,
}

# --------------------------------------------------------------------------------------------
# Predicate builders (each returns a closure over pre-coerced literals)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ident:
    """A property reference in the parsed selector."""

    name: str
    column: int


@dataclass(frozen=True)
class Lit:
    """A literal in the parsed selector, already converted to its Python value."""

    value: Value
    column: int


Operand = Ident | Lit


# A kernel instruction before linking (see _link): (opcode, cmp, neg, property name or None,
# arg, ival, fval, text). Opcodes and cmp are names from _ext/search.pyx's SELECTOR_CODES.
Instr = tuple[str, str, bool, str | None, int, int, float, bytes | None]
Code = tuple[Instr, ...] | None  # None: the kernel cannot evaluate this part (Python does)
KLEENE_CODE = {False: 0, True: 1, None: 2}  # the kernel's FALSE, TRUE, UNKNOWN


class Part(NamedTuple):
    """A parsed piece of a selector: the reference closure, and the same test as kernel code."""

    predicate: Predicate
    code: Code


def _op(
    opcode: str,
    name: str | None = None,
    cmp: str = "=",
    *,
    arg: int = 0,
    ival: int = 0,
    fval: float = 0.0,
    text: bytes | None = None,
    neg: bool = False,
) -> Instr:
    return (opcode, cmp, neg, name, arg, ival, fval, text)


def _text(value: str) -> bytes:
    """A string literal as the bytes the kernel compares: UTF-8 keeps code point order (a lone
    surrogate, which no property can hold, keeps its place in that order too)."""
    return value.encode("utf-8", "surrogatepass")


def _constant(result: bool | None) -> Part:
    """A predicate whose answer does not depend on the properties."""
    return Part(lambda props: result, (_op("const", arg=KLEENE_CODE[result]),))


def _compare_literals(compare: Compare, left: Value, right: Value) -> bool | None:
    """Compare two literal values under the coercion rules (used for folding constants)."""
    a: object = left
    b: object = right
    if isinstance(left, str) and not isinstance(right, str) and right is not None:
        a = COERCERS[type(right)](left)
    elif isinstance(right, str) and not isinstance(left, str) and left is not None:
        b = COERCERS[type(left)](right)
    elif isinstance(left, bool) != isinstance(right, bool):
        return None
    if a is None or b is None:
        return None
    return bool(compare(a, b))


def _literal_op(op: str, name: str, literal: Value) -> Instr:
    """The kernel's `name <op> literal` for a non-NULL literal, by the literal's type."""
    if isinstance(literal, bool):
        return _op("cmp_bool", name, op, ival=int(literal))
    if isinstance(literal, int):
        return _op("cmp_int", name, op, ival=literal)
    if isinstance(literal, float):
        return _op("cmp_float", name, op, fval=literal)
    return _op("cmp_str", name, op, text=_text(str(literal)))


def _compare_property(op: str, name: str, literal: Value) -> Part:
    """`name <op> literal`: the property is coerced to the literal's type."""
    if literal is None:
        return _constant(None)
    coerce = COERCERS[type(literal)]
    compare = OPERATORS[op]

    def predicate(props: Props) -> bool | None:
        text = _fetch(props, name)
        if text is None:
            return None
        value = coerce(text)
        return None if value is None else compare(value, literal)

    return Part(predicate, (_literal_op(op, name, literal),))


def _compare_properties(op: str, left: str, right: str) -> Part:
    """`a <op> b`: numerically when both are numbers, else as strings. Python only: two
    properties of any length compare as exact integers or as int against float."""
    compare = OPERATORS[op]

    def predicate(props: Props) -> bool | None:
        a = _fetch(props, left)
        b = _fetch(props, right)
        if a is None or b is None:
            return None
        x = _as_number(a)
        y = _as_number(b)
        if x is not None and y is not None:
            return compare(x, y)
        return compare(a, b)

    return Part(predicate, None)


def _comparison(op: str, left: Operand, right: Operand) -> Part:
    """Dispatch a comparison on whether each side is a property or a literal."""
    if isinstance(left, Ident):
        if isinstance(right, Ident):
            return _compare_properties(op, left.name, right.name)
        return _compare_property(op, left.name, right.value)
    if isinstance(right, Ident):
        return _compare_property(MIRRORED[op], right.name, left.value)
    return _constant(_compare_literals(OPERATORS[op], left.value, right.value))


def _any_of(results: list[bool | None]) -> bool | None:
    """Kleene OR of already computed results."""
    if True in results:
        return True
    return None if None in results else False


def _membership(left: Operand, items: list[Lit]) -> Part:
    """`left IN (items)`: set lookups per literal type, UNKNOWN when a coercion fails."""
    if isinstance(left, Lit):
        return _constant(
            _any_of([_compare_literals(operator.eq, left.value, i.value) for i in items])
        )
    name = left.name
    strings = frozenset(i.value for i in items if isinstance(i.value, str))
    ints = frozenset(i.value for i in items if isinstance(i.value, int))
    floats = frozenset(i.value for i in items if isinstance(i.value, float))

    def predicate(props: Props) -> bool | None:
        text = _fetch(props, name)
        if text is None:
            return None
        if text in strings:
            return True
        unknown = False
        if ints:
            number = _as_int(text)
            if number is not None and number in ints:
                return True
            unknown = number is None
        if floats:
            real = _as_float(text)
            if real is not None and real in floats:
                return True
            unknown = unknown or real is None
        return None if unknown else False

    items_code = (
        [_op("in_str", text=_text(str(s))) for s in sorted(strings)]
        + [_op("in_int", ival=int(i)) for i in sorted(ints)]
        + [_op("in_float", fval=float(f)) for f in sorted(floats)]
    )
    return Part(predicate, (_op("in", name, arg=len(items_code)), *items_code))


def _contains(text: str, needle: str) -> bool:
    """Substring test with the argument order of str.startswith."""
    return needle in text


STRING_CHECKS: dict[str, Callable[[str, str], bool]] = {
    "CONTAINS": _contains,
    "STARTSWITH": str.startswith,
    "ENDSWITH": str.endswith,
}


def _string_test(keyword: str, left: Operand, needle: str, negated: bool) -> Part:
    """`left [NOT] CONTAINS|STARTSWITH|ENDSWITH 'needle'`; UNKNOWN on NULL or a non-string
    literal. The empty needle is FALSE, negated or not (RocketMQ's ContainsExpression and
    NotContainsExpression both answer FALSE for it; NOT (x CONTAINS '') is then TRUE)."""
    if not needle:
        return _constant(False)
    check = STRING_CHECKS[keyword]
    if isinstance(left, Lit):
        value = left.value
        result = check(value, needle) if isinstance(value, str) else None
        return _constant(None if result is None else result != negated)
    name = left.name

    def predicate(props: Props) -> bool | None:
        text = _fetch(props, name)
        return None if text is None else check(text, needle) != negated

    return Part(predicate, (_op("str_test", name, keyword, text=_text(needle), neg=negated),))


def _is_null(left: Operand) -> Part:
    """`left IS NULL` (the only test that is never UNKNOWN)."""
    if isinstance(left, Lit):
        return _constant(left.value is None)
    name = left.name
    return Part(lambda props: props.get(name) is None, (_op("is_null", name),))


def _negate(inner: Part) -> Part:
    """Kleene NOT: UNKNOWN stays UNKNOWN."""
    test = inner.predicate

    def predicate(props: Props) -> bool | None:
        result = test(props)
        return None if result is None else not result

    code = None if inner.code is None else (*inner.code, _op("not"))
    return Part(predicate, code)


def _chain(parts: list[Part], combine: str, jump: str) -> Code:
    """Kernel code of a Kleene AND/OR chain: each part after the first is combined with the
    result so far, and a result that decides the chain (FALSE for AND, TRUE for OR) jumps
    to its end. Jump args are relative here (_link makes them absolute)."""
    if any(p.code is None for p in parts):
        return None
    code: list[Instr] = list(parts[0].code or ())
    jumps = []
    for part in parts[1:]:
        jumps.append(len(code))
        code.append(_op(jump))
        code += part.code or ()
        code.append(_op(combine))
    for at in jumps:
        code[at] = _op(jump, arg=len(code) - at)
    return tuple(code)


def _all_of(parts: list[Part]) -> Part:
    """Kleene AND over `parts`, stopping at the first FALSE."""
    if len(parts) == 1:
        return parts[0]
    chain = tuple(p.predicate for p in parts)

    def predicate(props: Props) -> bool | None:
        outcome: bool | None = True
        for part in chain:
            result = part(props)
            if result is False:
                return False
            if result is None:
                outcome = None
        return outcome

    return Part(predicate, _chain(parts, "and", "jump_false"))


def _either_of(parts: list[Part]) -> Part:
    """Kleene OR over `parts`, stopping at the first TRUE."""
    if len(parts) == 1:
        return parts[0]
    chain = tuple(p.predicate for p in parts)

    def predicate(props: Props) -> bool | None:
        outcome: bool | None = False
        for part in chain:
            result = part(props)
            if result is True:
                return True
            if result is None:
                outcome = None
        return outcome

    return Part(predicate, _chain(parts, "or", "jump_true"))


# --------------------------------------------------------------------------------------------
# Kernel programs
# --------------------------------------------------------------------------------------------

STACK_EFFECT = {"not": 0, "jump_false": 0, "jump_true": 0, "and": -1, "or": -1}
ITEM_OPS = ("in_str", "in_int", "in_float")


def _link(code: Code, properties: set[str]) -> tuple[SelectorProgram | None, tuple[str, ...]]:
    """The kernel program for `code` and the names its slots stand for: every name of the
    selector (`properties`, even one a folded constant no longer tests, so the scan can say
    which ones no message carried) plus "tag" behind TAGS as selector_view adds it; jumps
    made absolute, the stack's depth counted. None when the kernel cannot run it: a part it
    does not evaluate, or more names than it holds."""
    if code is None:
        return None, ()
    names = sorted(properties)
    if "TAGS" in names and "tag" not in names:
        names.append("tag")  # a hidden slot: its bit in properties_seen is not reported
    if len(names) > SELECTOR_CODES["max_names"]:
        return None, ()
    ops = []
    depth = top = 0
    for at, (opcode, cmp, neg, name, arg, ival, fval, text) in enumerate(code):
        if opcode in ("jump_false", "jump_true"):
            arg += at
        if opcode not in ITEM_OPS:
            top += STACK_EFFECT.get(opcode, 1)
            depth = max(depth, top)
        slot = 0 if name is None else names.index(name)
        ops.append((SELECTOR_CODES[opcode], SELECTOR_CODES[cmp], neg, slot, arg, ival, fval, text))
    program = SelectorProgram(
        ops,
        [None if n == "uid" else n.encode("ascii") for n in names],
        depth,
        names.index("TAGS") if "TAGS" in names else -1,
        names.index("tag") if "TAGS" in names else -1,
    )
    return program, tuple(names)


# --------------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------------

EOF, IDENT, KEYWORD, INT, FLOAT, STRING, OP, PUNCT = (
    "eof",
    "ident",
    "keyword",
    "int",
    "float",
    "string",
    "op",
    "punct",
)

_EXP = r"(?:[eE][+-]?[0-9]+)"
_LEXEME = re.compile(
    rf"(?P<space>\s+)"
    rf"|(?P<float>-?(?:[0-9]+\.[0-9]*{_EXP}?|\.[0-9]+{_EXP}?|[0-9]+{_EXP}))"
    r"|(?P<int>-?[0-9]+)"
    r"|(?P<name>[A-Za-z_$][A-Za-z0-9_$.]*)"
    r"|(?P<op><>|!=|<=|>=|=|<|>)"
    r"|(?P<punct>[(),])"
)
_NAME_CHAR = re.compile(r"[A-Za-z0-9_$.]")


class Token(NamedTuple):
    """One lexeme: its kind, converted value, 1-based column and source text."""

    kind: str
    value: Value
    column: int
    source: str


def _fail(message: str, text: str, column: int) -> SelectorSyntaxError:
    """The error for `message` at `column` of `text`."""
    return SelectorSyntaxError(message, text, column)


def _scan_string(text: str, start: int) -> tuple[str, int]:
    """The string literal opening at `start` (its value, the index after it); '' is a quote."""
    parts = []
    position = start + 1
    while True:
        end = text.find("'", position)
        if end < 0:
            raise _fail("unterminated string", text, start + 1)
        parts.append(text[position:end])
        if not text.startswith("'", end + 1):
            return "".join(parts), end + 1
        parts.append("'")
        position = end + 2


def _double_quote_hint(text: str, start: int) -> str:
    """What to say of a double quote: SQL92 strings are single-quoted (a shell user's habit,
    `--where "name = "x""`, or JSON's); the value as it should be written, when it closes."""
    end = text.find('"', start + 1)
    message = "unexpected character '\"': SQL92 strings are single-quoted"
    if end < 0:
        return message + " ('text', with '' for a quote inside)"
    value = text[start + 1 : end].replace("'", "''")
    return message + f": write '{value}'"


def _number_token(kind: str, source: str, text: str, start: int) -> Token:
    """An INT or FLOAT token, rejecting values outside int64 / the finite doubles."""
    column = start + 1
    if kind == INT:
        integer = _integer(source)  # by digit count first: never int() of a long literal
        if isinstance(integer, HugeInt) or not INT64_MIN <= integer <= INT64_MAX:
            raise _fail("integer literal out of range", text, column)
        return Token(INT, integer, column, source)
    real = float(source)
    if not math.isfinite(real):
        raise _fail("float literal out of range", text, column)
    return Token(FLOAT, real, column, source)


def _word_token(source: str, start: int) -> Token:
    """A KEYWORD (value upper-cased) or an IDENT token."""
    upper = source.upper()
    if upper in KEYWORDS:
        return Token(KEYWORD, upper, start + 1, source)
    return Token(IDENT, source, start + 1, source)


def _lex_one(text: str, start: int) -> tuple[Token | None, int]:
    """The token at `start` (None for whitespace) and the index after it."""
    if text[start] == "'":
        value, end = _scan_string(text, start)
        return Token(STRING, value, start + 1, text[start:end]), end
    match = _LEXEME.match(text, start)
    if match is None:
        if text[start] == '"':
            raise _fail(_double_quote_hint(text, start), text, start + 1)
        raise _fail(f"unexpected character {text[start]!r}", text, start + 1)
    kind, source, end = match.lastgroup, match.group(), match.end()
    if kind == "space":
        return None, end
    if kind in (INT, FLOAT):
        if end < len(text) and _NAME_CHAR.match(text, end):
            raise _fail("malformed number literal", text, start + 1)
        return _number_token(str(kind), source, text, start), end
    if kind == "name":
        return _word_token(source, start), end
    value = "<>" if source == "!=" else source
    return Token(str(kind), value, start + 1, source), end


def tokenize(text: str) -> list[Token]:
    """All tokens of `text`, ending with an EOF token one column past the last character."""
    tokens = []
    position = 0
    while position < len(text):
        token, position = _lex_one(text, position)
        if token is not None:
            tokens.append(token)
    tokens.append(Token(EOF, None, len(text) + 1, ""))
    return tokens


# --------------------------------------------------------------------------------------------
# Parser
# --------------------------------------------------------------------------------------------


def _describe(token: Token) -> str:
    """How an error message names `token`."""
    if token.kind == EOF:
        return "end of selector"
    if token.kind == STRING:
        return "string literal"
    if token.kind == IDENT:
        return f"identifier {token.source!r}"
    if token.kind == KEYWORD:
        return str(token.value)
    return repr(token.source)


class _Parser:
    """Recursive descent over the token list, building predicates as it goes."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = tokenize(text)
        self.index = 0
        self.depth = 0
        self.names: set[str] = set()

    def error(self, message: str, token: Token) -> SelectorSyntaxError:
        return _fail(message, self.text, token.column)

    def peek(self) -> Token:
        return self.tokens[self.index]

    def advance(self) -> Token:
        token = self.tokens[self.index]
        if token.kind != EOF:
            self.index += 1
        return token

    def accept(self, kind: str, *values: str) -> Token | None:
        """Consume and return the next token if it has `kind` (and one of `values`)."""
        token = self.peek()
        if token.kind == kind and (not values or token.value in values):
            return self.advance()
        return None

    def expect(self, kind: str, value: str, message: str) -> Token:
        """Consume the next token, which must be `kind`/`value`, else raise `message`."""
        token = self.accept(kind, value)
        if token is None:
            found = self.peek()
            raise self.error(f"{message}, found {_describe(found)}", found)
        return token

    def parse(self) -> Part:
        predicate = self.parse_or()
        token = self.peek()
        if token.kind != EOF:
            raise self.error(
                f"unexpected {_describe(token)}; expected AND, OR or the end of the selector",
                token,
            )
        return predicate

    def parse_or(self) -> Part:
        parts = [self.parse_and()]
        while self.accept(KEYWORD, "OR"):
            parts.append(self.parse_and())
        return _either_of(parts)

    def parse_and(self) -> Part:
        parts = [self.parse_not()]
        while self.accept(KEYWORD, "AND"):
            parts.append(self.parse_not())
        return _all_of(parts)

    def parse_not(self) -> Part:
        negations = 0
        while self.accept(KEYWORD, "NOT"):
            negations += 1
        predicate = self.parse_primary()
        return _negate(predicate) if negations % 2 else predicate

    def parse_primary(self) -> Part:
        opening = self.accept(PUNCT, "(")
        if opening is None:
            return self.parse_predicate(self.parse_operand())
        if self.depth >= MAX_DEPTH:
            raise self.error(f"parentheses nested deeper than {MAX_DEPTH}", opening)
        self.depth += 1
        predicate = self.parse_or()
        self.expect(PUNCT, ")", "expected ')'")
        self.depth -= 1
        return predicate

    def parse_operand(self) -> Operand:
        token = self.advance()
        if token.kind == IDENT:
            self.names.add(str(token.value))
            return Ident(str(token.value), token.column)
        if token.kind in (STRING, INT, FLOAT):
            return Lit(token.value, token.column)
        if token.kind == KEYWORD and token.value in ("TRUE", "FALSE", "NULL"):
            literal = {"TRUE": True, "FALSE": False, "NULL": None}[str(token.value)]
            return Lit(literal, token.column)
        raise self.error(
            f"unexpected {_describe(token)}; expected an identifier or a literal", token
        )

    def parse_predicate(self, left: Operand) -> Part:
        token = self.peek()
        if token.kind == OP:
            self.advance()
            return self.parse_comparison(str(token.value), left)
        if self.accept(KEYWORD, "IS"):
            return self.parse_is_null(left)
        negated = self.accept(KEYWORD, "NOT") is not None
        return self.parse_keyword_predicate(left, negated)

    def parse_keyword_predicate(self, left: Operand, negated: bool) -> Part:
        """BETWEEN, IN or a string test after `left` (and NOT when `negated`)."""
        token = self.advance()
        if token.kind == KEYWORD and token.value == "BETWEEN":
            predicate = self.parse_between(left)
            return _negate(predicate) if negated else predicate
        if token.kind == KEYWORD and token.value == "IN":
            predicate = self.parse_in(left)
            return _negate(predicate) if negated else predicate
        if token.kind == KEYWORD and token.value in STRING_TESTS:
            return self.parse_string_test(str(token.value), left, negated)
        if negated:
            raise self.error(
                "expected BETWEEN, IN, CONTAINS, STARTSWITH or ENDSWITH after NOT, "
                f"found {_describe(token)}",
                token,
            )
        raise self.error(
            f"unexpected {_describe(token)}; expected a comparison operator, BETWEEN, IN, IS, "
            "CONTAINS, STARTSWITH or ENDSWITH",
            token,
        )

    def reject_boolean(self, operand: Operand, message: str) -> None:
        """Raise `message` at `operand` when it is TRUE or FALSE (they are not ordered)."""
        if isinstance(operand, Lit) and isinstance(operand.value, bool):
            raise _fail(message, self.text, operand.column)

    def parse_comparison(self, op: str, left: Operand) -> Part:
        right = self.parse_operand()
        if op not in ("=", "<>"):
            for side in (left, right):
                self.reject_boolean(side, "TRUE/FALSE can only be compared with = or <>")
        return _comparison(op, left, right)

    def parse_between(self, left: Operand) -> Part:
        low = self.parse_operand()
        self.expect(KEYWORD, "AND", "expected AND in BETWEEN")
        high = self.parse_operand()
        for side in (left, low, high):
            self.reject_boolean(side, "TRUE/FALSE cannot be used with BETWEEN")
        if (
            isinstance(low, Lit)
            and isinstance(high, Lit)
            and _compare_literals(operator.gt, low.value, high.value)
        ):
            raise _fail(
                f"BETWEEN's lower bound {self.source_of(low)} is greater than its upper bound "
                f"{self.source_of(high)}",
                self.text,
                low.column,
            )
        return _all_of([_comparison(">=", left, low), _comparison("<=", left, high)])

    def source_of(self, literal: Lit) -> str:
        """The text of `literal` as written in the selector."""
        return next(t.source for t in self.tokens if t.column == literal.column)

    def parse_in(self, left: Operand) -> Part:
        self.expect(PUNCT, "(", "expected '(' after IN")
        items = [self.parse_in_item()]
        while not self.accept(PUNCT, ")"):
            self.expect(PUNCT, ",", "expected ',' or ')' in the IN list")
            items.append(self.parse_in_item())
        return _membership(left, items)

    def parse_in_item(self) -> Lit:
        token = self.advance()
        if token.kind not in (STRING, INT, FLOAT):
            raise self.error(
                f"expected a string or numeric literal in the IN list, found {_describe(token)}",
                token,
            )
        return Lit(token.value, token.column)

    def parse_is_null(self, left: Operand) -> Part:
        negated = self.accept(KEYWORD, "NOT") is not None
        message = "expected NULL after IS NOT" if negated else "expected NULL after IS"
        self.expect(KEYWORD, "NULL", message)
        predicate = _is_null(left)
        return _negate(predicate) if negated else predicate

    def parse_string_test(self, keyword: str, left: Operand, negated: bool) -> Part:
        token = self.advance()
        if token.kind != STRING:
            raise self.error(
                f"expected a string literal after {keyword}, found {_describe(token)}", token
            )
        return _string_test(keyword, left, str(token.value), negated)


# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------


class Selector:
    """A compiled selector: `evaluate` gives True/False/None, `matches` only True.

    `program` is the same selector for the scan kernel (_ext/search.pyx scan_records), None
    when the kernel cannot evaluate it (docs/query.md); `program_names` are the names its
    `properties_seen` bits stand for, in bit order."""

    __slots__ = ("text", "properties", "_predicate", "program", "program_names")

    def __init__(
        self,
        text: str,
        properties: frozenset[str],
        predicate: Predicate,
        program: SelectorProgram | None = None,
        program_names: tuple[str, ...] = (),
    ) -> None:
        self.text = text
        self.properties = properties
        self._predicate = predicate
        self.program = program
        self.program_names = program_names

    def evaluate(self, props: Mapping[str, str]) -> bool | None:
        """TRUE, FALSE or None (UNKNOWN) for `props`; a missing name is NULL."""
        return self._predicate(props)

    def matches(self, props: Mapping[str, str]) -> bool:
        """Whether the selector is TRUE for `props` (FALSE and UNKNOWN do not match)."""
        return self._predicate(props) is True

    def __repr__(self) -> str:
        return f"Selector({self.text!r})"


def compile_selector(text: str) -> Selector:
    """Parse `text` once into a `Selector`; SelectorSyntaxError names the mistake and column."""
    if not isinstance(text, str):
        raise SelectorSyntaxError(f"selector must be a str, not {type(text).__name__}", "", 1)
    if not text.strip():
        raise SelectorSyntaxError("selector is empty", text, 1)
    parser = _Parser(text)
    part = parser.parse()
    program, names = _link(part.code, parser.names)
    return Selector(text, frozenset(parser.names), part.predicate, program, names)
