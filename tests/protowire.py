"""Hand-encoded protobuf for the tests of pykcm's decoder: what gogo-generated Go code writes."""

from __future__ import annotations


def varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative int32 and int64: ten bytes of two's complement
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes([*out, value])


def tag(number: int, wire: int) -> bytes:
    return varint(number << 3 | wire)


def field(number: int, payload: bytes | str) -> bytes:
    """A length-delimited field: a message, a string or bytes."""
    data = payload.encode() if isinstance(payload, str) else payload
    return tag(number, 2) + varint(len(data)) + data


def number(field_number: int, value: int) -> bytes:
    """A varint field: an int, an enum or a bool."""
    return tag(field_number, 0) + varint(value)
