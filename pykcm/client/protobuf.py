"""Pods' watch events in protobuf, decoded straight into an informer's projection.

The apiserver encodes a watch event once per wire format for all its watchers (the watch cache's
cachingObject). The scheduler, the kubelets and KCM's own controllers read pods as protobuf, so a
JSON watch of pods costs the apiserver an encoding of every pod change for pykcm alone. Turning a
whole pod into the plain dicts pykcm keeps would cost pykcm far more than JSON does; building only
the fields its informer keeps (the projection, about a tenth of a pod) and stepping over the rest
by their length costs about what `orjson.loads` plus the projection does.

`--kube-api-content-type application/vnd.kubernetes.protobuf` (the default, as KCM's) asks for
it. Only the pods watch whose projection names fields of `SCHEMA` is read so; everything else
stays JSON.
"""

from __future__ import annotations

import codecs
import contextlib
import sys
from collections.abc import Mapping
from typing import Any, Union

from pykcm.util.apitime import format_time

PROTOBUF = "application/vnd.kubernetes.protobuf"
WATCH_ACCEPT = f"{PROTOBUF};stream=watch"
MAGIC = b"k8s\x00"  # the envelope's prefix before a runtime.Unknown
INTERN_MAX_LENGTH = 64  # as projection.py: short strings repeat across pods

STRING, INT, INT32, BOOL, TIME, MAP, SPAN = "string", "int", "int32", "bool", "time", "map", "span"
REPEATED = "repeated"
# JSON has the field even when empty or zero: no omitempty, a pointer, or a struct (which omitempty
# keeps; a zero Time is then null). Else an empty or zero value is left out (omitempty, omitzero).
KEEP_EMPTY = "keep-empty"
WRONG = "wrong"  # in a compiled table only: a tag gogo's Unmarshal refuses (its error in place of a name)
ZERO_TIME = -62_135_596_800  # Timestamp.seconds of Go's zero time.Time (0001-01-01), which JSON writes as null

Projection = Mapping[str, Union[bool, "Projection"]]  # as informers/projection.py has it

# Field numbers of k8s.io/api core/v1 and apimachinery meta/v1 and runtime (their generated.proto):
# the pod fields pykcm's controllers read, by JSON name, then Status and the frame around an object.
# A message listed under COMPLETE has all its fields here and may be kept whole; a projection asking
# for anything else is read as JSON.
SCHEMA: dict[str, dict[str, tuple[Any, ...]]] = {
    "Pod": {"metadata": (1, "ObjectMeta"), "spec": (2, "PodSpec"), "status": (3, "PodStatus")},
    "ObjectMeta": {
        "name": (1, STRING), "generateName": (2, STRING), "namespace": (3, STRING), "uid": (5, STRING),
        "resourceVersion": (6, STRING), "generation": (7, INT), "creationTimestamp": (8, TIME),  # omitzero
        "deletionTimestamp": (9, TIME, KEEP_EMPTY), "deletionGracePeriodSeconds": (10, INT, KEEP_EMPTY),
        "labels": (11, MAP), "annotations": (12, MAP), "ownerReferences": (13, "OwnerReference", REPEATED),
        "finalizers": (14, STRING, REPEATED),
    },
    "OwnerReference": {
        "kind": (1, STRING, KEEP_EMPTY), "name": (3, STRING, KEEP_EMPTY), "uid": (4, STRING, KEEP_EMPTY),
        "apiVersion": (5, STRING, KEEP_EMPTY), "controller": (6, BOOL, KEEP_EMPTY),
        "blockOwnerDeletion": (7, BOOL, KEEP_EMPTY),
    },
    "PodSpec": {"containers": (2, "Container", REPEATED), "nodeName": (10, STRING),
                "initContainers": (20, "Container", REPEATED)},
    "Container": {"name": (1, STRING, KEEP_EMPTY), "restartPolicy": (24, STRING, KEEP_EMPTY)},
    "PodStatus": {"phase": (1, STRING), "conditions": (2, "PodCondition", REPEATED),
                  "containerStatuses": (8, "ContainerStatus", REPEATED),
                  "initContainerStatuses": (10, "ContainerStatus", REPEATED)},
    "PodCondition": {
        "type": (1, STRING, KEEP_EMPTY), "status": (2, STRING, KEEP_EMPTY), "lastProbeTime": (3, TIME, KEEP_EMPTY),
        "lastTransitionTime": (4, TIME, KEEP_EMPTY), "reason": (5, STRING), "message": (6, STRING),
        "observedGeneration": (7, INT),
    },
    "ContainerStatus": {"name": (1, STRING, KEEP_EMPTY), "restartCount": (5, INT32, KEEP_EMPTY)},
    "Status": {"metadata": (1, "ListMeta", KEEP_EMPTY), "status": (2, STRING), "message": (3, STRING),
               "reason": (4, STRING), "details": (5, "StatusDetails", KEEP_EMPTY), "code": (6, INT32)},
    "ListMeta": {"selfLink": (1, STRING), "resourceVersion": (2, STRING), "continue": (3, STRING),
                 "remainingItemCount": (4, INT, KEEP_EMPTY)},
    "StatusDetails": {"name": (1, STRING), "group": (2, STRING), "kind": (3, STRING),
                      "causes": (4, "StatusCause", REPEATED), "retryAfterSeconds": (5, INT32), "uid": (6, STRING)},
    "StatusCause": {"reason": (1, STRING), "message": (2, STRING), "field": (3, STRING)},  # reason: its Type
    "TypeMeta": {"apiVersion": (1, STRING), "kind": (2, STRING)},
    "Timestamp": {"seconds": (1, INT), "nanos": (2, INT32)},
    # WatchEvent{1 type, 2 RawExtension{1 raw: MAGIC, then Unknown{1 TypeMeta, 2 raw: the object}}}
    "WatchEvent": {"type": (1, STRING), "object": (2, "RawExtension")},
    "RawExtension": {"raw": (1, SPAN)},
    "Unknown": {"typeMeta": (1, "TypeMeta"), "raw": (2, SPAN), "contentEncoding": (3, STRING),
                "contentType": (4, STRING)},
}
COMPLETE = frozenset({"OwnerReference", "PodCondition", "Status", "ListMeta", "StatusDetails", "StatusCause",
                      "TypeMeta"})
TYPE_FIELDS = ("kind", "apiVersion")  # in the envelope, not in the pod's message

# A compiled table: tag (field number << 3 | wire type) -> (name, kind, sub-table, repeated, map keys
# kept or None, keep empty). A field's other wire types, and field 0, are WRONG: the hot path checks none.
Table = dict[int, tuple[str, str, Any, bool, Any, bool]]


def supports(projection: Projection | None, message: str = "Pod") -> bool:
    """Whether every field `projection` keeps of `message` can be read from protobuf."""
    if projection is None:
        return False
    fields = SCHEMA[message]
    for name, sub in projection.items():
        if message == "Pod" and name in TYPE_FIELDS:
            continue
        if name not in fields:
            return False
        kind = fields[name][1]
        if kind in SCHEMA and not (kind in COMPLETE if sub is True else supports(sub, kind)):  # type: ignore[arg-type]
            return False
    return True


def compile_table(message: str, projection: Projection | bool) -> Table:
    """The decode table of `message` keeping `projection` (True: every field of SCHEMA)."""
    fields = SCHEMA[message]
    wanted: Mapping[str, Any] = dict.fromkeys(fields, True) if projection is True else projection  # type: ignore[assignment]
    table: Table = {wire: (f"illegal tag 0 (wire type {wire})", WRONG, None, False, None, False) for wire in range(8)}
    for name, sub in wanted.items():
        if name not in fields:
            continue  # kind and apiVersion: from the envelope
        number, kind, *flags = fields[name]
        inner = compile_table(kind, sub) if kind in SCHEMA else None
        keep = frozenset(sub) if kind == MAP and sub is not True else None  # annotations: {key: True}
        repeated = REPEATED in flags
        name = sys.intern(name)
        for wire in range(8):
            table[number << 3 | wire] = (f"wrong wireType = {wire} for field {name}", WRONG, None, False, None, False)
        # An element of a list is kept even when empty (finalizers: ["", "a/b"]), as JSON has it.
        table[number << 3 | (0 if kind in (INT, INT32, BOOL) else 2)] = (
            name, kind, inner, repeated, keep, KEEP_EMPTY in flags or repeated)
    return table


class Projected(dict):  # type: ignore[type-arg]
    """An object decoded into its informer's projection already: the informer keeps it as it is."""


class UndecodableEvent(ValueError):
    """A watch event this decoder cannot read; `key` is the object's namespace/name where known."""

    def __init__(self, key: str, err: Exception) -> None:
        super().__init__(f"cannot decode the protobuf watch event of {key}: {type(err).__name__}: {err}")
        self.key = key


class WatchDecoder:
    """Turns the frames of a protobuf watch of pods into watch events ({"type", "object"})."""

    def __init__(self, projection: Projection) -> None:
        self._objects = compile_table("Pod", projection)
        self._type_fields = tuple(name for name in TYPE_FIELDS if projection.get(name))  # as project() keeps them
        self._bookmarks = compile_table("Pod", {"metadata": {"resourceVersion": True, "annotations": True}})

    def event(self, frame: bytes) -> dict[str, Any]:
        try:
            return self._event(frame)
        except Exception as err:  # whatever bad bytes raise: the reflector reads the watch as JSON then
            raise UndecodableEvent(_key_of(frame), err) from err

    def _event(self, frame: bytes) -> dict[str, Any]:
        kind, type_meta, start, end = _parts(frame)
        table = self._bookmarks if kind == "BOOKMARK" else _STATUS if kind == "ERROR" else self._objects
        obj = Projected(decode(frame, start, end, table))
        for name in self._type_fields if table is self._objects else TYPE_FIELDS:
            obj[name] = type_meta.get(name, "")
        return {"type": kind, "object": obj}


def _key_of(frame: bytes) -> str:
    """namespace/name of the object in a frame that did not decode in full, or "an object"."""
    pod: dict[str, Any] = {}
    with contextlib.suppress(Exception):  # it only names the object in the error
        _, _, start, end = _parts(frame)
        decode(frame, start, end, _KEY, pod)  # fields before the bad bytes are in `pod`
    meta = pod.get("metadata", {})
    return "/".join(part for part in (meta.get("namespace"), meta.get("name")) if part) or "an object"


def decode_status(body: bytes) -> dict[str, Any]:
    """An error response in protobuf: a Status in the envelope."""
    try:
        type_meta, start, end = _envelope(body, 0, len(body))
        return {**decode(body, start, end, _STATUS), "apiVersion": type_meta.get("apiVersion", ""), "kind": "Status"}
    except Exception:
        return {"kind": "Status", "message": "an error response in protobuf that does not decode"}


def _parts(frame: bytes) -> tuple[str, dict[str, Any], int, int]:
    """A WatchEvent's type, its object's TypeMeta, and where the object's own bytes lie."""
    size = len(frame)
    try:  # the bytes as gogo writes them, at a glance:
        # 0A type 12 RawExtension{0A raw: MAGIC Unknown{0A TypeMeta 12 object 1A "" 22 ""}}
        at = frame[1] + 2
        if frame[0] == 0x0A and frame[1] < 0x80 and frame[at] == 0x12:
            length, raw = _varint(frame, at + 1)
            if raw + length == size and frame[raw] == 0x0A:
                length, raw = _varint(frame, raw + 1)
                meta_end = raw + 6 + frame[raw + 5]
                if raw + length == size and frame[raw : raw + 5] == MAGIC + b"\x0a" and frame[meta_end] == 0x12 \
                        and frame[raw + 5] < 0x80:
                    length, start = _varint(frame, meta_end + 1)
                    if start + length + 4 == size and frame[start + length :] == b"\x1a\x00\x22\x00":
                        return (frame[2:at].decode("utf-8", AS_GO_JSON), decode(frame, raw + 6, meta_end, _TYPE_META),
                                start, start + length)
    except (IndexError, ValueError):
        pass
    event = decode(frame, 0, size, _WATCH_EVENT)  # else read in full
    return event.get("type", ""), *_envelope(frame, *event.get("object", {}).get("raw", (0, 0)))


def _envelope(buf: bytes, start: int, end: int) -> tuple[dict[str, Any], int, int]:
    """buf[start:end] is MAGIC, then Unknown{1 TypeMeta, 2 raw}: the TypeMeta, and where the object lies."""
    if end - start <= len(MAGIC) or buf[start : start + len(MAGIC)] != MAGIC:
        raise ValueError("protobuf object without its envelope")
    unknown = decode(buf, start + len(MAGIC), end, _UNKNOWN)
    return unknown.get("typeMeta", {}), *unknown.get("raw", (end, end))


def _one_replacement_per_byte(err: UnicodeError) -> tuple[str, int]:
    """Go's JSON writes invalid UTF-8 as one U+FFFD for each bad byte (Python's "replace" writes
    one per bad sequence); protobuf carries the bytes as they are, and the cache must hold the same."""
    if not isinstance(err, UnicodeDecodeError):
        raise err
    return "\ufffd" * (err.end - err.start), err.end


AS_GO_JSON = "pykcm-as-go-json"  # the decode error handler for strings
codecs.register_error(AS_GO_JSON, _one_replacement_per_byte)

_STATUS = compile_table("Status", True)
_TYPE_META = compile_table("TypeMeta", True)
_TIMESTAMP = compile_table("Timestamp", True)
_WATCH_EVENT = compile_table("WatchEvent", True)
_UNKNOWN = compile_table("Unknown", True)
_KEY = compile_table("Pod", {"metadata": {"namespace": True, "name": True}})
_times: dict[int, str] = {}


def _time(seconds: int) -> str:
    """metav1.Time as its JSON has it (memoised: pods share them)."""
    text = _times.get(seconds)
    if text is None:
        if len(_times) > 100_000:
            _times.clear()
        text = _times[seconds] = format_time(seconds)
    return text


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    """The varint at `pos`, cut to 64 bits as gogo's Unmarshal cuts it, and where it ends; more
    than ten bytes is gogo's "integer overflow" (and no quadratic work on a hostile one)."""
    value = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return (value & 0xFFFF_FFFF_FFFF_FFFF if shift == 63 else value), pos
        if shift == 63:  # the tenth byte
            raise ValueError("proto: integer overflow")
        shift += 7


def _tag(buf: bytes, pos: int) -> tuple[int, int]:
    """A tag of two or more bytes at `pos`, its field number cut to an int32 as gogo's is."""
    tag, pos = _varint(buf, pos)
    number = tag >> 3 & 0xFFFF_FFFF
    if not 0 < number < 1 << 31:
        raise ValueError(f"proto: illegal tag (field number {number} as an int32 is not positive)")
    return number << 3 | tag & 7, pos


def _skip(buf: bytes, pos: int, end: int, wire: int) -> int:
    """Where a field not in the table ends (its tag read at `pos`), as gogo's skipGenerated: a group
    (wire types 3 and 4, whatever their field numbers) whole, wire types 6 and 7 an error."""
    depth = 0
    while True:
        if wire == 0:
            pos = _varint(buf, pos)[1]
        elif wire == 2:
            size, pos = _varint(buf, pos)
            pos += size
        elif wire == 1 or wire == 5:
            pos += 8 if wire == 1 else 4
        elif wire == 3:
            depth += 1
        elif wire == 4 and depth:
            depth -= 1
        else:
            raise ValueError("proto: unexpected end of group" if wire == 4 else f"proto: illegal wireType {wire}")
        if depth == 0 and pos <= end:
            return pos
        if depth == 0 or pos >= end:
            raise ValueError("unexpected EOF")
        tag, pos = _varint(buf, pos)
        wire = tag & 7


def _map_entry(buf: bytes, pos: int, stop: int, end: int) -> tuple[int, int, int, int]:
    """Where the key and value of a map entry buf[pos:stop] lie, however written (either missing,
    repeated or second). As gogo's generated code: their wire type is not checked, and their bytes
    may pass the entry's end, not the map's message's `end`."""
    key = value = (stop, stop)  # "" when missing
    while pos < stop:
        tag, pos = _varint(buf, pos)
        number = tag >> 3 & 0xFFFF_FFFF
        if number == 1 or number == 2:
            size, pos = _varint(buf, pos)
            span, pos = (pos, pos + size), pos + size
            if pos > end:
                raise ValueError("unexpected EOF")
            if number == 1:
                key = span
            else:
                value = span
        elif (pos := _skip(buf, pos, end, tag & 7)) > stop:
            raise ValueError("unexpected EOF")
    if pos > end:
        raise ValueError("unexpected EOF")
    return *key, *value


def decode(buf: bytes, pos: int, end: int, table: Table, out: dict[str, Any] | None = None) -> dict[str, Any]:
    """The fields of `table` in the message buf[pos:end], into `out` (a message field sent twice is
    merged into its first, as gogo's Unmarshal does; any other field sent twice, the last wins); any
    other field is stepped over. Empty strings and empty messages are left out, as JSON's omitempty
    leaves them. Bytes gogo's Unmarshal refuses raise ValueError (or IndexError past the frame)."""
    if out is None:
        out = {}
    get = table.get
    intern = sys.intern
    while pos < end:
        tag = buf[pos]
        pos += 1
        if tag >= 0x80:  # the hot path is inline: most tags and lengths are one byte, the rest mostly two
            if buf[pos] < 0x80:
                tag = tag & 0x7F | buf[pos] << 7
                pos += 1
            else:
                tag, pos = _tag(buf, pos - 1)
        wire = tag & 7
        if wire == 2:  # length-delimited: strings, messages, map entries
            n = buf[pos]
            pos += 1
            if n >= 0x80:
                n, pos = _varint(buf, pos - 1)
            stop = pos + n
            if stop > end:
                raise ValueError("unexpected EOF")
            entry = get(tag)
            if entry is None:
                pos = stop
                continue
            name, kind, inner, repeated, keep, keep_empty = entry
            if kind is STRING:
                if n == 0 and not keep_empty:
                    out.pop(name, None)  # the last one wins, and JSON leaves an empty one out
                    pos = stop
                    continue
                value = buf[pos:stop].decode("utf-8", AS_GO_JSON)
                if n <= INTERN_MAX_LENGTH:
                    value = intern(value)
            elif inner is not None:  # a message
                if not repeated and (value := out.get(name)) is not None:
                    decode(buf, pos, stop, inner, value)
                    pos = stop
                    continue
                value = decode(buf, pos, stop, inner)
                if not value and not keep_empty:
                    pos = stop
                    continue
            elif kind is MAP:  # an entry: 1 key, 2 value (both strings here)
                size = buf[pos + 1] if n >= 4 and buf[pos] == 0x0A else 0x80
                at = pos + 2 + size
                if size < 0x80 and at + 2 <= stop and buf[at] == 0x12 and buf[at + 1] == stop - at - 2 < 0x80:
                    key_at, key_end, value_at, value_end = pos + 2, at, at + 2, stop  # as gogo writes it
                else:
                    key_at, key_end, value_at, value_end = _map_entry(buf, pos, stop, end)
                key = buf[key_at:key_end].decode("utf-8", AS_GO_JSON)
                if keep is None or key in keep:
                    value = buf[value_at:value_end].decode("utf-8", AS_GO_JSON)
                    entries = out.get(name)
                    if entries is None:
                        entries = out[name] = {}
                    entries[intern(key) if len(key) <= INTERN_MAX_LENGTH else key] = (
                        intern(value) if len(value) <= INTERN_MAX_LENGTH else value
                    )
                pos = stop
                continue
            elif kind is TIME:  # Timestamp{1 seconds, 2 nanos}: JSON has whole seconds, null for zero
                if n and buf[pos] == 0x08:
                    seconds, at = _varint(buf, pos + 1)
                    if at != stop and (at + 2 != stop or buf[at] != 0x10 or buf[at + 1] >= 0x80):  # not 08 s 10 n
                        seconds = decode(buf, pos, stop, _TIMESTAMP).get("seconds", 0)
                    elif seconds >= 1 << 63:  # an int64: before 1970 it is ten bytes of two's complement
                        seconds -= 1 << 64
                else:
                    seconds = decode(buf, pos, stop, _TIMESTAMP).get("seconds", 0) if n else ZERO_TIME
                if seconds == ZERO_TIME and not keep_empty:  # creationTimestamp: omitzero
                    out.pop(name, None)
                    pos = stop
                    continue
                value = None if seconds == ZERO_TIME else _time(seconds)
            elif kind is SPAN:
                value = (pos, stop)
            else:
                raise ValueError(f"proto: {name}")
            pos = stop
        elif wire == 0:
            value = buf[pos]
            pos += 1
            if value >= 0x80:
                value, pos = _varint(buf, pos - 1)
            entry = get(tag)
            if entry is None:
                continue
            name, kind, inner, repeated, keep, keep_empty = entry
            if kind is BOOL:
                value = value != 0
            else:
                if kind is INT:  # an int64 below zero is ten bytes of two's complement
                    value = (value ^ 1 << 63) - (1 << 63)
                elif kind is INT32:  # Go's int32 of the varint: its low 32 bits
                    value = (value & 0xFFFF_FFFF ^ 1 << 31) - (1 << 31)
                else:
                    raise ValueError(f"proto: {name}")
                if value == 0 and not keep_empty:
                    out.pop(name, None)
                    continue
        else:
            if (entry := get(tag)) is not None:
                raise ValueError(f"proto: {entry[0]}")
            pos = _skip(buf, pos, end, wire)
            continue
        if repeated:
            values = out.get(name)
            if values is None:
                out[name] = [value]
            else:
                values.append(value)
        else:
            out[name] = value
    if pos > end:  # a varint ran past the message's end
        raise ValueError("unexpected EOF")
    return out


__all__ = [
    "MAGIC", "PROTOBUF", "WATCH_ACCEPT", "Projected", "UndecodableEvent", "WatchDecoder", "decode_status", "supports",
]
