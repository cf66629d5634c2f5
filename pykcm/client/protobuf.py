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
import sys
from collections.abc import Mapping
from typing import Any, Union

from pykcm.util.apitime import format_time

PROTOBUF = "application/vnd.kubernetes.protobuf"
WATCH_ACCEPT = f"{PROTOBUF};stream=watch"
MAGIC = b"k8s\x00"  # the envelope's prefix before a runtime.Unknown
INTERN_MAX_LENGTH = 64  # as projection.py: short strings repeat across pods

STRING, INT, BOOL, TIME, MAP = "string", "int", "bool", "time", "map"
REPEATED = "repeated"
KEEP_EMPTY = "keep-empty"  # JSON has the field even when empty or zero: no omitempty, or a pointer

Projection = Mapping[str, Union[bool, "Projection"]]  # as informers/projection.py has it

# Field numbers of k8s.io/api core/v1 and apimachinery meta/v1 (their generated.proto): the pod
# fields pykcm's controllers read, by JSON name. Protobuf writes every non-pointer field, JSON
# leaves out the omitempty ones when empty: a field is left out when empty unless KEEP_EMPTY.
# A message listed under COMPLETE has all its fields here and may be kept whole; a projection
# asking for anything else is read as JSON.
SCHEMA: dict[str, dict[str, tuple[Any, ...]]] = {
    "Pod": {"metadata": (1, "ObjectMeta"), "spec": (2, "PodSpec"), "status": (3, "PodStatus")},
    "ObjectMeta": {
        "name": (1, STRING), "generateName": (2, STRING), "namespace": (3, STRING), "uid": (5, STRING),
        "resourceVersion": (6, STRING), "generation": (7, INT), "creationTimestamp": (8, TIME),
        "deletionTimestamp": (9, TIME), "deletionGracePeriodSeconds": (10, INT, KEEP_EMPTY), "labels": (11, MAP),
        "annotations": (12, MAP), "ownerReferences": (13, "OwnerReference", REPEATED),
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
        "type": (1, STRING, KEEP_EMPTY), "status": (2, STRING, KEEP_EMPTY), "lastProbeTime": (3, TIME),
        "lastTransitionTime": (4, TIME), "reason": (5, STRING), "message": (6, STRING), "observedGeneration": (7, INT),
    },
    "ContainerStatus": {"name": (1, STRING, KEEP_EMPTY), "restartCount": (5, INT, KEEP_EMPTY)},
    "Status": {"status": (2, STRING), "message": (3, STRING), "reason": (4, STRING), "code": (6, INT)},
    "TypeMeta": {"apiVersion": (1, STRING), "kind": (2, STRING)},
}
COMPLETE = frozenset({"OwnerReference", "PodCondition", "Status", "TypeMeta"})
TYPE_FIELDS = ("kind", "apiVersion")  # in the envelope, not in the pod's message

# A compiled table: field number -> (name, kind, sub-table, repeated, map keys kept or None, keep empty).
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
    table: Table = {}
    for name, sub in wanted.items():
        if name not in fields:
            continue  # kind and apiVersion: from the envelope
        number, kind, *flags = fields[name]
        inner = compile_table(kind, sub) if kind in SCHEMA else None
        keep = frozenset(sub) if kind == MAP and sub is not True else None  # annotations: {key: True}
        table[number] = (sys.intern(name), kind, inner, REPEATED in flags, keep, KEEP_EMPTY in flags)
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
        except (ValueError, IndexError, OverflowError, OSError) as err:  # UnicodeDecodeError is a ValueError
            raise UndecodableEvent(_key_of(frame), err) from err

    def _event(self, frame: bytes) -> dict[str, Any]:
        # WatchEvent{1 type, 2 RawExtension{1 raw: MAGIC Unknown{1 TypeMeta, 2 raw: the object}}}
        n, pos = _varint(frame, 1)
        kind = frame[pos:pos + n].decode()
        pos += n
        _, pos = _varint(frame, pos + 1)  # into the RawExtension
        _, pos = _varint(frame, pos + 1)  # into its raw bytes
        type_meta, start, end = _envelope(frame, pos)
        table = self._bookmarks if kind == "BOOKMARK" else _STATUS if kind == "ERROR" else self._objects
        obj = Projected(decode(frame, start, end, table))
        for name in self._type_fields if table is self._objects else TYPE_FIELDS:
            obj[name] = type_meta.get(name, "")
        return {"type": kind, "object": obj}


_KEY = compile_table("Pod", {"metadata": {"namespace": True, "name": True}})


def _key_of(frame: bytes) -> str:
    """namespace/name of the object in a frame that did not decode in full, or "an object"."""
    try:
        at = frame.index(MAGIC)
        _, start, end = _envelope(frame, at)
        meta = decode(frame, start, end, _KEY).get("metadata", {})
        return "/".join(part for part in (meta.get("namespace"), meta.get("name")) if part) or "an object"
    except (ValueError, IndexError):
        return "an object"


def decode_status(body: bytes) -> dict[str, Any]:
    """An error response in protobuf: a Status in the envelope."""
    try:
        _, start, end = _envelope(body, 0)
        return {**decode(body, start, end, _STATUS), "kind": "Status"}
    except (ValueError, IndexError):
        return {"kind": "Status", "message": "an error response in protobuf that does not decode"}


def _envelope(buf: bytes, pos: int) -> tuple[dict[str, Any], int, int]:
    """MAGIC, then runtime.Unknown{1 TypeMeta, 2 raw} to the end of `buf`: the TypeMeta, and
    where the object's own bytes lie."""
    if buf[pos : pos + len(MAGIC)] != MAGIC:
        raise ValueError("protobuf object without its envelope")
    pos += len(MAGIC)
    type_meta: dict[str, Any] = {}
    while pos < len(buf):
        tag = buf[pos]
        n, start = _varint(buf, pos + 1)
        if tag == 0x0A:
            type_meta = decode(buf, start, start + n, _TYPE_META)
        elif tag == 0x12:
            return type_meta, start, start + n
        pos = start + n
    raise ValueError("protobuf envelope without an object")


def _one_replacement_per_byte(err: UnicodeError) -> tuple[str, int]:
    """Go's JSON writes invalid UTF-8 as one U+FFFD for each bad byte (Python's "replace" writes
    one per bad sequence); protobuf carries the bytes as they are, and the cache must hold the same."""
    if not isinstance(err, UnicodeDecodeError):
        raise err
    return "\ufffd" * (err.end - err.start), err.end


AS_GO_JSON = "pykcm-as-go-json"  # the decode error handler for strings
codecs.register_error(AS_GO_JSON, _one_replacement_per_byte)

_TYPE_META = compile_table("TypeMeta", True)
_STATUS = compile_table("Status", True)
_times: dict[int, str] = {}


def _time(seconds: int) -> str:
    """metav1.Time as its JSON has it (memoised: pods share them)."""
    text = _times.get(seconds)
    if text is None:
        if len(_times) > 100_000:
            _times.clear()
        text = _times[seconds] = format_time(seconds)
    return text


def _seconds(buf: bytes, pos: int) -> int:
    """Timestamp.seconds at `pos`: an int64, so a time before 1970 is ten bytes of two's complement."""
    value = _varint(buf, pos)[0]
    return value - (1 << 64) if value >= 1 << 63 else value


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7


def decode(buf: bytes, pos: int, end: int, table: Table) -> dict[str, Any]:
    """The fields of `table` in the message buf[pos:end]; any other field is stepped over. Empty
    strings and empty messages are left out, as JSON's omitempty leaves them."""
    out: dict[str, Any] = {}
    get = table.get
    intern = sys.intern
    while pos < end:
        tag = buf[pos]
        pos += 1
        if tag >= 0x80:  # the hot path is inline: most tags and lengths are one byte
            rest, pos = _varint(buf, pos)
            tag = (tag & 0x7F) | (rest << 7)
        wire = tag & 7
        entry = get(tag >> 3)
        if wire == 2:  # length-delimited: strings, messages, map entries
            n = buf[pos]
            pos += 1
            if n >= 0x80:
                rest, pos = _varint(buf, pos)
                n = (n & 0x7F) | (rest << 7)
            stop = pos + n
            if entry is None:
                pos = stop
                continue
            name, kind, inner, repeated, keep, keep_empty = entry
            if kind == MAP:  # an entry: 1 key, 2 value (both strings here)
                size, at = _varint(buf, pos + 1)
                key = buf[at:at + size].decode("utf-8", AS_GO_JSON)
                at += size
                if keep is None or key in keep:
                    value = ""
                    if at < stop:
                        size, at = _varint(buf, at + 1)
                        value = buf[at:at + size].decode("utf-8", AS_GO_JSON)
                    entries = out.get(name)
                    if entries is None:
                        entries = out[name] = {}
                    entries[intern(key) if len(key) <= INTERN_MAX_LENGTH else key] = (
                        intern(value) if len(value) <= INTERN_MAX_LENGTH else value
                    )
                pos = stop
                continue
            if kind == STRING:
                if n == 0 and not keep_empty:
                    pos = stop
                    continue
                value = buf[pos:stop].decode("utf-8", AS_GO_JSON)
                if n <= INTERN_MAX_LENGTH:
                    value = intern(value)
            elif kind == TIME:  # {1 seconds, 2 nanos}: JSON has whole seconds, and null for the zero time
                value = _time(_seconds(buf, pos + 1) if buf[pos] == 0x08 else 0) if n else None
            else:
                value = decode(buf, pos, stop, inner)
                if not value and not repeated:
                    pos = stop
                    continue
            pos = stop
        elif wire == 0:
            value, pos = _varint(buf, pos)
            if entry is None:
                continue
            name, kind, inner, repeated, keep, keep_empty = entry
            if kind == BOOL:
                value = bool(value)
            elif value >= 1 << 63:  # int64 and int32 below zero are ten bytes of two's complement
                value -= 1 << 64
            elif value == 0 and not keep_empty:
                continue
        else:  # fixed 64 or 32 bits: none in SCHEMA
            pos += 8 if wire == 1 else 4
            continue
        if repeated:
            values = out.get(name)
            if values is None:
                out[name] = [value]
            else:
                values.append(value)
        else:
            out[name] = value
    return out


__all__ = [
    "MAGIC", "PROTOBUF", "WATCH_ACCEPT", "Projected", "UndecodableEvent", "WatchDecoder", "decode_status", "supports",
]
