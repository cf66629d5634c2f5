"""KCM flag values that pflag's Set parses as it reads the flag, besides numbers and durations: an IP
address (pflag's IP flag: net.ParseIP), a string slice (one record of Go's encoding/csv), and the
values of flags pykcm ignores whose Set can fail (vmodule, SNI certificate, string map, int32 slice,
resource quantity). Read here as Go reads them, so that a bad one is refused in Go's words where
pflag meets it, and a good one reaches typer as KCM reads it."""

from __future__ import annotations

import ipaddress
import re

from pykcm.util.gostrconv import go_int, go_uint
from pykcm.util.log import go_quote

# Go's unicode.IsSpace, which strings.TrimSpace trims (Python's str.strip() also trims \x1c-\x1f).
_GO_SPACE = ("\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
             "\u2028\u2029\u202f\u205f\u3000")


def go_ip(text: str) -> str:
    """pflag's IP flag: net.ParseIP of the trimmed value, written as Go's net.IP writes it (an
    IPv4-mapped address as IPv4); "" leaves the flag as it was. ValueError in pflag's words."""
    if not text:
        return ""
    trimmed = text.strip(_GO_SPACE)
    try:
        if "%" in trimmed:  # a zone: Go's ParseIP has none, Python's ip_address takes one
            raise ValueError(trimmed)
        ip = ipaddress.ip_address(trimmed)
    except ValueError:
        raise ValueError(f"failed to parse IP: {go_quote(text)}") from None
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    return str(mapped or ip)


_BARE_QUOTE = 'bare " in non-quoted-field'
_QUOTE = 'extraneous or missing " in quoted-field'


class _Lines:
    """The value's lines as Go's csv.Reader reads them: each with its \\n (\\r\\n read as \\n, a last
    line's \\r dropped), the line count going up at every read, at the end too."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at, self.number = data, 0, 0

    def read(self) -> bytes | None:
        """The next line, or None at the end."""
        self.number += 1
        if self.at >= len(self.data):
            return None
        end = self.data.find(b"\n", self.at)
        stop = len(self.data) if end < 0 else end + 1
        line, self.at = self.data[self.at : stop], stop
        if end < 0 and line.endswith(b"\r"):
            line = line[:-1]
        return line[:-2] + b"\n" if line.endswith(b"\r\n") else line


def _parse_error(start: int, line: int, column: int, reason: str) -> ValueError:
    """Go's csv.ParseError: the record's first line too where the error is on another."""
    where = f"parse error on line {line}, column {column}: {reason}"
    return ValueError(where if start == line else f"record on line {start}; {where}")


def go_csv_record(text: str) -> list[str]:
    """pflag's string slice: the fields of the value's first CSV record (Go's csv.Reader, its
    defaults: `,`, quotes not lazy, columns in bytes); "" is no field. ValueError in Go's words."""
    if not text:
        return []
    lines = _Lines(text.encode("utf-8", "surrogateescape"))
    line = lines.read()
    while line in (b"", b"\n"):  # empty lines are skipped
        line = lines.read()
    if line is None:
        raise ValueError("EOF")
    start = row = lines.number
    column = 1
    fields: list[bytes] = []
    while True:
        if not line.startswith(b'"'):
            comma = line.find(b",")
            value = line[:comma] if comma >= 0 else line.removesuffix(b"\n")
            if (quote := value.find(b'"')) >= 0:
                raise _parse_error(start, lines.number, column + quote, _BARE_QUOTE)
            fields.append(value)
            if comma < 0:
                break
            line, column = line[comma + 1 :], column + comma + 1
            continue
        line, column, value = line[1:], column + 1, b""
        while True:  # a quoted field, over as many lines as it takes
            if (quote := line.find(b'"')) >= 0:
                value, line, column = value + line[:quote], line[quote + 1 :], column + quote + 1
                if line.startswith(b'"'):  # `""`: a quote
                    value, line, column = value + b'"', line[1:], column + 1
                    continue
                if line.startswith(b",") or line in (b"", b"\n"):
                    break
                raise _parse_error(start, lines.number, column - 1, _QUOTE)
            if not line:
                raise _parse_error(start, row, column, _QUOTE)  # the value ended inside quotes
            value, column = value + line, column + len(line)
            line = lines.read() or b""
            if line:
                row, column = row + 1, 1
        fields.append(value)
        if not line.startswith(b","):
            break
        line, column = line[1:], column + 1
    return [field.decode("utf-8", "surrogateescape") for field in fields]


def go_vmodule(text: str) -> None:
    """component-base's --vmodule: comma-separated pattern=N, N a ParseUint(N, 10, 31); ValueError in
    Go's words."""
    for pattern in text.split(","):
        if not pattern:  # a trailing comma
            continue
        parts = pattern.split("=")
        if len(parts) != 2 or not parts[0] or not parts[1]:
            raise ValueError(f"{go_quote(pattern)} does not have the pattern=N format")
        try:
            go_uint(parts[1], 31)
        except ValueError as err:
            raise ValueError(f"parsing verbosity in {go_quote(pattern)}: {err}") from None


def go_named_cert_key(text: str) -> None:
    """component-base's NamedCertKey (--tls-sni-cert-key): `cert,key` or `cert,key:name,...`;
    ValueError in Go's words."""
    pair, colon, names = text.partition(":")
    if colon and not names.strip(_GO_SPACE):
        raise ValueError("empty names list is not allowed")
    if pair.count(",") != 1:
        raise ValueError("expected comma separated certificate and key file paths")


def go_string_to_string(text: str) -> None:
    """pflag's stringToString: one key=value as given (quotes trimmed), more as one CSV record of
    key=value fields; ValueError in Go's words."""
    equals = text.count("=")
    pairs = [text] if equals < 2 else go_csv_record(text)
    for pair in pairs:
        if "=" not in pair:
            raise ValueError(f"{pair} must be formatted as key=value")


def go_int32_slice(text: str) -> None:
    """pflag's int32Slice: each comma-separated item a strconv.ParseInt(item, 0, 32)."""
    for item in text.split(","):
        go_int(item, 32)


# apimachinery's resource.ParseQuantity: its scanner (sign, number, suffix letters, exponent digits),
# its suffixes and its three errors.
_QUANTITY = re.compile(r"[+-]?(0*)([0-9]*)(?:\.([0-9]*))?([eEinumkKMGTP]*[-+]?[0-9]*)")
_QUANTITY_FORMAT = r"quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
_DECIMAL_SUFFIXES = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY_SUFFIXES = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_NANO = -9


def go_quantity(text: str) -> None:
    """resource.QuantityValue's Set as far as it accepts or refuses (ParseQuantity); ValueError in
    Go's words. A number without a digit ("", "-", ".") is refused only where Go leaves its int64
    fast path for inf.Dec, which needs a digit: a scale under nano, or 2^50 and up."""
    match = _QUANTITY.fullmatch(text)
    if not text or match is None:
        raise ValueError(_QUANTITY_FORMAT)
    zeros, digits, fraction, suffix = match.group(1), match.group(2), match.group(3) or "", match.group(4)
    exponent = _DECIMAL_SUFFIXES.get(suffix, _BINARY_SUFFIXES.get(suffix))
    if exponent is None and len(suffix) > 1 and suffix[0] in "eE" and re.fullmatch(r"[+-]?[0-9]+", suffix[1:]):
        magnitude = suffix[1:].lstrip("+-").lstrip("0") or "0"  # leading zeros taken, as Go's
        parsed = int(magnitude) * (-1 if suffix[1] == "-" else 1) if len(magnitude) <= 19 else 2**63
        if -(2**63) <= parsed < 2**63:  # strconv.ParseInt(s, 10, 64), then int32(...)
            exponent = (parsed + 2**31) % 2**32 - 2**31
    if exponent is None:
        raise ValueError("unable to parse quantity's suffix")
    number = digits or "0"
    if suffix in _BINARY_SUFFIXES:
        fast = not fraction and 15 - len(number) - exponent * 3 // 10 - 1 >= 0
    else:
        fast = 18 - len(number) - len(fraction) >= 0 and exponent - len(fraction) >= _NANO
    if not fast and not (zeros or digits or fraction):
        raise ValueError("unable to parse numeric part of quantity")
