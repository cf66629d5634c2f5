"""Go's strconv.ParseInt, ParseUint and ParseFloat, as pflag reads KCM's numeric flags.

A number flag means what it means to KCM only if read as Go reads it (base prefixes, underscores
between digits, hexadecimal floats, float32's range), and a bad one is refused in Go's words.
"""

from __future__ import annotations

import math
import re
import struct
from decimal import Decimal

from pykcm.util.log import go_quote

FLOAT32_LIMIT = 3.4028235677973366e38  # from here a float32 rounds to infinity: Go's "value out of range"


def go_int(text: str, bits: int) -> int:
    """Go's strconv.ParseInt(text, 0, bits), as pflag parses an int flag; ValueError in Go's words."""
    negative = text[:1] == "-"
    magnitude, out_of_range = _parse_uint(text[1:] if text[:1] in ("+", "-") else text, 0, bits, text, "ParseInt")
    if out_of_range or magnitude > 2 ** (bits - 1) - (0 if negative else 1):
        raise ValueError(f"strconv.ParseInt: parsing {go_quote(text)}: value out of range")
    return -magnitude if negative else magnitude


def go_uint(text: str, bits: int) -> int:
    """Go's strconv.ParseUint(text, 10, bits), as component-base's -v reads it; ValueError in Go's words."""
    value, out_of_range = _parse_uint(text, 10, bits, text, "ParseUint")
    if out_of_range:
        raise ValueError(f"strconv.ParseUint: parsing {go_quote(text)}: value out of range")
    return value


def _parse_uint(digits: str, base: int, bits: int, text: str, func: str) -> tuple[int, bool]:
    """Go's ParseUint loop: the value, and whether it overflowed `bits` before any bad character (Go
    says "out of range" then, whatever follows); `text` and `func` name the syntax error."""
    syntax = ValueError(f"strconv.{func}: parsing {go_quote(text)}: invalid syntax")
    base0, rest = base == 0, digits
    if base0:
        base = 10
        if digits[:1] == "0":
            prefix = {"b": 2, "o": 8, "x": 16}.get(digits[1:2].lower()) if len(digits) >= 3 else None
            base, rest = (prefix, digits[2:]) if prefix else (8, digits[1:])
    if not digits:
        raise syntax
    value, underscores = 0, False
    for char in rest:
        if char == "_" and base0:
            underscores = True
            continue
        digit = int(char, 36) if char.isascii() and char.isalnum() else 99
        if digit >= base:
            raise syntax
        value = value * base + digit
        if value >= 2**bits:
            return 2**bits - 1, True
    if underscores and not _underscore_ok(digits):
        raise syntax
    return value, False


def _underscore_ok(text: str) -> bool:
    """Go's strconv.underscoreOK: each `_` between digits (a base prefix counts as one)."""
    number = text[1:] if text[:1] in ("+", "-") else text
    saw, start, hex_digits = "^", 0, False
    if len(number) >= 2 and number[0] == "0" and number[1].lower() in ("b", "o", "x"):
        saw, start, hex_digits = "0", 2, number[1].lower() == "x"
    for char in number[start:]:
        if "0" <= char <= "9" or (hex_digits and "a" <= char.lower() <= "f"):
            saw = "0"
        elif char == "_":
            if saw != "0":
                return False
            saw = "_"
        elif saw == "_":
            return False
        else:
            saw = "!"
    return saw != "_"


def go_float(text: str, bits: int) -> float:
    """Go's strconv.ParseFloat(text, bits), hexadecimal floats too; ValueError in Go's words."""
    quoted = go_quote(text)
    if special := _GO_FLOAT_SPECIAL.fullmatch(text):
        return float(special[0])
    number = _GO_FLOAT.fullmatch(text)
    if number is None or ("_" in text and not _underscore_ok(text)):
        raise ValueError(f"strconv.ParseFloat: parsing {quoted}: invalid syntax")
    plain = text.replace("_", "")
    try:
        value = float.fromhex(plain) if number["hex"] else float(plain)
    except OverflowError:
        value = math.inf
    out_of_range = ValueError(f"strconv.ParseFloat: parsing {quoted}: value out of range")
    if math.isinf(value):
        raise out_of_range
    if bits == 32 and abs(value) >= FLOAT32_LIMIT:
        # From the midpoint of the largest float32 and 2**128 on, the exact value rounds (half to even)
        # to infinity; a text just below it may read as the midpoint in float64.
        if number["hex"] or Decimal(plain).copy_abs() >= Decimal(FLOAT32_LIMIT):
            raise out_of_range
        return math.copysign(_FLOAT32_MAX, value)  # Go's value
    if bits == 32 and value and not struct.unpack("f", struct.pack("f", value))[0]:
        return math.copysign(0.0, value)  # below float32's least: Go's 0, and a client's QPS 0 is the default
    return value


# Go's float syntax (strconv.readFloat): a decimal or hexadecimal mantissa with at least one digit, a
# `p` exponent for a hexadecimal one; signed Inf or Infinity, unsigned NaN, in any case.
_GO_FLOAT = re.compile(r"[+-]?(?:(?=[0-9_]*\.?[0-9_]*[0-9])[0-9_]*\.?[0-9_]*(?:[eE][+-]?[0-9][0-9_]*)?"
                       r"|(?P<hex>0[xX](?=[0-9a-fA-F_]*\.?[0-9a-fA-F_]*[0-9a-fA-F])[0-9a-fA-F_]*\.?[0-9a-fA-F_]*"
                       r"[pP][+-]?[0-9][0-9_]*))")
_FLOAT32_MAX = 3.4028234663852886e38
_GO_FLOAT_SPECIAL = re.compile(r"[+-]?inf(?:inity)?|nan", re.IGNORECASE)
