"""KCM flag values that pflag's Set parses as it reads the flag, besides numbers and durations: an IP
address (pflag's IP flag: net.ParseIP) and a string slice (one record of Go's encoding/csv). Read here
as Go reads them, so that a bad one is refused in Go's words where pflag meets it, and a good one
reaches typer as KCM reads it."""

from __future__ import annotations

import ipaddress

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
