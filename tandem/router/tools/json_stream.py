"""Reading a tool call while it is written: its head (the name) and its arguments, piece by
piece, without holding the whole output.

    {"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}
    '------- read_call_head -------------''---- JsonScanner ----------''- JsonScanner(in_object)

``read_call_head`` answers as soon as the head is complete (a ``CallHead``), cannot be one
(``Head.NO``: the format's whole-call reading takes over), or may still be one (``Head.MORE``).
``JsonScanner`` then checks the arguments' JSON one character at a time and writes it back
minified (no whitespace outside strings; raw control characters inside strings escaped, as
``dump_arguments`` does), so the streamed pieces concatenate to compact JSON text. It stops
where the value ends (DONE) or where the JSON breaks (BROKEN: the pieces so far are what the
model wrote, up to the first character that cannot continue a JSON value).

Both only ever look at the text they were given: an answer for a prefix holds for every longer
text, so a call read from one piece or from a thousand reads the same.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from enum import Enum

OPEN, DONE, BROKEN = "open", "done", "broken"

_PLAIN = re.compile(r'[^"\\\x00-\x1f]+')  # string characters that need no attention
_WS = re.compile(r"[ \t\n\r]+")
_ESCAPES = frozenset('"\\/bfnrtu')
_HEX = frozenset("0123456789abcdefABCDEF")
_LITERALS = {"t": "rue", "f": "alse", "n": "ull"}
_CONTROL = {"\n": "\\n", "\t": "\\t", "\r": "\\r", "\b": "\\b", "\f": "\\f"}

# What the scanner expects next.
_VALUE, _FIRST_ITEM, _FIRST_KEY, _KEY, _COLON, _AFTER = range(6)
_STRING, _ESCAPE, _UNICODE, _NUMBER, _LITERAL = range(6, 11)

# The number grammar, -?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?, as states: the next state for a
# character class, and the states a number may end in.
_DIGIT, _DOT, _EXP, _SIGN = "digit", "dot", "exp", "sign"
_NUMBER_STEPS: dict[str, dict[str, str]] = {
    "minus": {"0": "zero", _DIGIT: "int"},
    "zero": {_DOT: "dot", _EXP: "exp"},
    "int": {_DIGIT: "int", "0": "int", _DOT: "dot", _EXP: "exp"},
    "dot": {_DIGIT: "frac", "0": "frac"},
    "frac": {_DIGIT: "frac", "0": "frac", _EXP: "exp"},
    "exp": {_SIGN: "exp_sign", _DIGIT: "exp_digits", "0": "exp_digits"},
    "exp_sign": {_DIGIT: "exp_digits", "0": "exp_digits"},
    "exp_digits": {_DIGIT: "exp_digits", "0": "exp_digits"},
}
_NUMBER_ENDS = frozenset({"zero", "int", "frac", "exp_digits"})


def _number_class(c: str) -> str:
    if c == "0":
        return "0"
    if "1" <= c <= "9":
        return _DIGIT
    if c == ".":
        return _DOT
    if c in "eE":
        return _EXP
    if c in "+-":
        return _SIGN
    return ""


class JsonScanner:
    """One JSON value read a piece at a time: ``feed`` checks and minifies, ``take`` hands
    over the text minified so far, ``state`` says OPEN, DONE or BROKEN.

    ``in_object=True`` starts inside an object just after one of its values: it reads the rest
    of a call object (``, "id": 3}`` or just ``}``) once the arguments have been read.
    """

    __slots__ = ("state", "_stack", "_expect", "_key", "_out", "_literal", "_hex", "_number")

    def __init__(self, in_object: bool = False) -> None:
        self.state = OPEN
        self._stack: list[str] = ["{"] if in_object else []  # open containers: "{" or "["
        self._expect = _AFTER if in_object else _VALUE
        self._key = False  # the open string is an object's key
        self._out: list[str] = []
        self._literal = ""  # what is left of true / false / null
        self._hex = 0  # \\u digits still to read
        self._number = ""  # the number grammar's state

    def take(self) -> str:
        """The minified text read since the last ``take``."""
        text = "".join(self._out)
        self._out.clear()
        return text

    def feed(self, text: str, i: int = 0) -> int:
        """Read ``text[i:]``; returns where reading stopped: ``len(text)`` while OPEN, just
        past the value when DONE, at the offending character when BROKEN."""
        n = len(text)
        out = self._out
        while i < n and self.state == OPEN:
            e = self._expect
            c = text[i]
            if e == _STRING:
                plain = _PLAIN.match(text, i)
                if plain is not None:
                    out.append(plain.group())
                    i = plain.end()
                elif c == '"':
                    out.append(c)
                    i += 1
                    if self._key:
                        self._key, self._expect = False, _COLON
                    else:
                        self._value_done()
                elif c == "\\":
                    out.append(c)
                    i += 1
                    self._expect = _ESCAPE
                else:  # a raw control character: models write them, JSON needs them escaped
                    out.append(_CONTROL.get(c) or f"\\u{ord(c):04x}")
                    i += 1
                continue
            if e == _ESCAPE:
                if c not in _ESCAPES:
                    break
                out.append(c)
                i += 1
                if c == "u":
                    self._hex, self._expect = 4, _UNICODE
                else:
                    self._expect = _STRING
                continue
            if e == _UNICODE:
                if c not in _HEX:
                    break
                out.append(c)
                i += 1
                self._hex -= 1
                if not self._hex:
                    self._expect = _STRING
                continue
            if e == _NUMBER:
                step = _NUMBER_STEPS[self._number].get(_number_class(c))
                if step is None:  # the number ends here, or it is broken
                    if self._number not in _NUMBER_ENDS:
                        break
                    self._value_done()  # c is read again, after the value
                    continue
                self._number = step
                out.append(c)
                i += 1
                continue
            if e == _LITERAL:
                if c != self._literal[0]:
                    break
                out.append(c)
                i += 1
                self._literal = self._literal[1:]
                if not self._literal:
                    self._value_done()
                continue
            if c in " \t\n\r":  # insignificant whitespace: dropped
                ws = _WS.match(text, i)
                assert ws is not None
                i = ws.end()
                continue
            if not self._structural(e, c):
                break
            out.append(c)
            i += 1
        if self.state == OPEN and i < n:
            self.state = BROKEN
        return i

    def _structural(self, e: int, c: str) -> bool:
        """Whether ``c`` is what ``e`` allows (and take it); False: the JSON is broken."""
        if e == _FIRST_ITEM and c == "]" or e == _FIRST_KEY and c == "}":
            self._close()
            return True
        if e in (_VALUE, _FIRST_ITEM):
            return self._start_value(c)
        if e in (_FIRST_KEY, _KEY):
            if c != '"':
                return False
            self._key, self._expect = True, _STRING
            return True
        if e == _COLON:
            if c != ":":
                return False
            self._expect = _VALUE
            return True
        # _AFTER: a value inside a container ended
        top = self._stack[-1]
        if c == ",":
            self._expect = _KEY if top == "{" else _VALUE
            return True
        if c == ("}" if top == "{" else "]"):
            self._close()
            return True
        return False

    def _start_value(self, c: str) -> bool:
        if c in "{[":
            self._stack.append(c)
            self._expect = _FIRST_KEY if c == "{" else _FIRST_ITEM
        elif c == '"':
            self._expect = _STRING
        elif c == "-" or "0" <= c <= "9":
            self._number = "minus" if c == "-" else ("zero" if c == "0" else "int")
            self._expect = _NUMBER
        elif c in _LITERALS:
            self._literal, self._expect = _LITERALS[c], _LITERAL
        else:
            return False
        return True

    def _close(self) -> None:
        self._stack.pop()
        self._value_done()

    def _value_done(self) -> None:
        if self._stack:
            self._expect = _AFTER
        else:
            self.state = DONE


class Head(Enum):
    """``read_call_head``'s answers other than a head."""

    MORE = "more"  # the text ends inside what may still be a head
    NO = "no"  # the text is not a call object with the name first and arguments second


@dataclass(frozen=True, slots=True)
class CallHead:
    """A call object's name, and where its arguments object starts (its ``{``)."""

    name: str
    start: int


ARGUMENT_KEYS = ('"arguments"', '"parameters"')
_MAX_NAME = 256  # characters: a longer "name" is no function's
_STRING_AT = re.compile(r'"(?:[^"\\\x00-\x1f]|\\.)*"')
_OPEN_STRING_AT = re.compile(r'"(?:[^"\\\x00-\x1f]|\\.)*\\?\Z')


def read_call_head(
    text: str, i: int, keys: tuple[str, ...] = ARGUMENT_KEYS
) -> CallHead | Head:
    """``{"name": "<name>", "<key>": {`` at ``text[i]`` (any whitespace between), ``<key>``
    one of ``keys``; the head when it is complete up to the arguments' ``{``."""
    name = ""
    for step in (("{",), ('"name"',), (":",), None, (",",), keys, (":",)):
        i = _skip_ws(text, i)
        if i == len(text):
            return Head.MORE
        if step is None:  # the name's string
            found = _string(text, i)
            if isinstance(found, Head):
                return found
            name, i = found
            continue
        matched = _literal(text, i, step)
        if isinstance(matched, Head):
            return matched
        i = matched
    i = _skip_ws(text, i)
    if i == len(text):
        return Head.MORE
    return CallHead(name, i) if text[i] == "{" else Head.NO


def _skip_ws(text: str, i: int) -> int:
    ws = _WS.match(text, i)
    return i if ws is None else ws.end()


def _literal(text: str, i: int, options: tuple[str, ...]) -> int | Head:
    for option in options:
        if text.startswith(option, i):
            return i + len(option)
    rest = text[i:]
    if any(len(rest) < len(o) and o.startswith(rest) for o in options):
        return Head.MORE
    return Head.NO


def _string(text: str, i: int) -> tuple[str, int] | Head:
    """A non-empty name string at ``text[i]``: its value and the index past it."""
    found = _STRING_AT.match(text, i, i + _MAX_NAME + 2)
    if found is None:
        if len(text) - i <= _MAX_NAME and _OPEN_STRING_AT.match(text, i):
            return Head.MORE
        return Head.NO
    try:
        name = json.loads(found.group())
    except ValueError:  # a bad escape
        return Head.NO
    return (name, found.end()) if name else Head.NO
