"""The protobuf pods watch decoder (client/protobuf.py) on bytes gogo's Marshal never writes, each
checked against what client-go v0.36.3's watch decoder makes of them: malformed bytes are refused as
gogo's Unmarshal refuses them (the event is undecodable, and the reflector reads the watch as JSON),
valid but non-canonical ones read as Go reads them; and Status as the JSON watch has it."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from pykcm.client import protobuf
from pykcm.client.config import ClientConfig
from pykcm.client.protobuf import MAGIC, UndecodableEvent, WatchDecoder, decode_status
from pykcm.client.resources import PODS
from pykcm.client.rest import RestClient, watch_decoding_error
from pykcm.informers.delta_queue import DeltaQueue
from pykcm.informers.reflector import Reflector
from tests.protowire import field, number, tag, varint

ZERO_TIME = -62_135_596_800  # Go's zero time.Time, 0001-01-01T00:00:00Z


def timestamp(seconds: int, nanos: int = 0) -> bytes:
    return number(1, seconds) + number(2, nanos)  # as gogo writes it: both, seconds first


def watch_event(pod: bytes, kind: str = "ADDED", object_kind: str = "Pod") -> bytes:
    """WatchEvent{type, RawExtension{MAGIC Unknown{TypeMeta, raw, contentEncoding, contentType}}}."""
    unknown = field(1, field(1, "v1") + field(2, object_kind)) + field(2, pod) + field(3, "") + field(4, "")
    return field(1, kind) + field(2, field(1, MAGIC + unknown))


def pod(meta: bytes = b"", spec: bytes = b"", status: bytes = b"") -> bytes:
    return field(1, meta) + field(2, spec) + field(3, status)


BASE = field(1, "p") + field(3, "ns")
EVERY_FIELD: dict[str, Any] = {  # every field the decoder knows
    "metadata": dict.fromkeys(protobuf.SCHEMA["ObjectMeta"], True),
    "spec": {"containers": {"name": True, "restartPolicy": True}, "nodeName": True},
    "status": {"phase": True, "conditions": True, "containerStatuses": {"name": True, "restartCount": True}},
}


def decoded(pod_bytes: bytes, event: bytes | None = None) -> dict[str, Any]:
    return dict(WatchDecoder(EVERY_FIELD).event(event or watch_event(pod_bytes))["object"])


# -- any error is an undecodable event ----------------------------------------------------------------

RESTART_COUNT_LENGTH_DELIMITED = pod(BASE, status=field(8, field(1, "c") + field(5, b"\x01")))


def test_a_field_of_the_wrong_wire_type_is_an_undecodable_event() -> None:
    # An int sent length-delimited raised AttributeError, which the reflector took for a failed
    # watch: it relisted, on protobuf, the same pod again, for ever.
    with pytest.raises(UndecodableEvent, match="wrong wireType = 2 for field restartCount") as err:
        decoded(RESTART_COUNT_LENGTH_DELIMITED)
    assert err.value.key == "ns/p"


@pytest.mark.parametrize("error", [AttributeError("a"), TypeError("t"), KeyError("k"), RecursionError("r"),
                                   UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad")])
def test_whatever_decoding_raises_is_an_undecodable_event(monkeypatch, error: Exception) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise error

    monkeypatch.setattr(protobuf, "decode", broken)
    with pytest.raises(UndecodableEvent) as raised:
        WatchDecoder({"metadata": {"name": True}}).event(watch_event(pod(BASE)))
    assert raised.value.key == "an object" and raised.value.__cause__ is error


class OneBadPod(RestClient):
    """Lists nothing; a protobuf watch sends the pod the decoder cannot read, a JSON one waits."""

    def __init__(self) -> None:
        super().__init__(ClientConfig(host="https://127.0.0.1:1", ssl_context=None))
        self.decoders: list[WatchDecoder | None] = []

    async def request(self, method: str, path: str, **kw: Any) -> Any:
        return {"metadata": {"resourceVersion": "1"}, "items": []}

    async def watch(self, path: str, params: dict[str, Any], decoder: WatchDecoder | None = None) -> Any:
        self.decoders.append(decoder)
        if decoder is not None:
            yield decoder.event(watch_event(RESTART_COUNT_LENGTH_DELIMITED))
        await asyncio.Event().wait()


class NoDelay:
    def next(self) -> float:
        return 0.001


async def watched_twice(client: OneBadPod) -> tuple[Reflector, WatchDecoder]:
    """A reflector reading `client`'s pods watch as protobuf, run until it has opened two watches."""
    reflector = Reflector(client, PODS, DeltaQueue(), backoff=NoDelay(), watch_list=False)
    decoder = reflector.watch_decoder = WatchDecoder(EVERY_FIELD)
    task = asyncio.create_task(reflector.run())
    try:
        async with asyncio.timeout(5):
            while len(client.decoders) < 2:
                await asyncio.sleep(0.01)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return reflector, decoder


async def test_the_reflector_reads_the_watch_as_json_after_such_an_event() -> None:
    client = OneBadPod()
    reflector, decoder = await watched_twice(client)
    assert client.decoders == [decoder, None] and reflector.watch_decoder is None


class OneEmptyFrame(OneBadPod):
    """A protobuf watch ends as client-go's StreamWatcher ends one on an empty frame; the next waits."""

    async def watch(self, path: str, params: dict[str, Any], decoder: WatchDecoder | None = None) -> Any:
        self.decoders.append(decoder)
        if len(self.decoders) == 1:
            yield watch_decoding_error("empty data")
        await asyncio.Event().wait()


async def test_the_reflector_stays_on_protobuf_after_a_frame_it_cannot_read() -> None:
    # As client-go: the watch ends with an internal error, and the reflector lists and watches again.
    client = OneEmptyFrame()
    reflector, decoder = await watched_twice(client)
    assert client.decoders == [decoder, decoder] and reflector.watch_decoder is decoder


# -- malformed bytes: refused as gogo's Unmarshal refuses them -----------------------------------------

MALFORMED = {
    "varint of 11 bytes": pod(BASE + tag(7, 0) + b"\xff" * 10 + b"\x01"),
    "string past its message": field(1, field(1, "p") + tag(3, 2) + varint(50) + b"ns") + field(2, b"") * 20,
    "label past the frame": pod(BASE + tag(11, 2) + varint(200) + field(1, "k")),
    "varint past its message": field(1, BASE + tag(7, 0) + b"\xff") + field(2, b"") + field(3, b""),
    "fixed64 past its message": field(1, BASE + tag(99, 1) + b"abc") + field(2, b"12345678"),
    "wire type 6": pod(BASE + tag(99, 6) + b"abcd"),
    "wire type 7": pod(BASE + tag(99, 7) + b"abcd"),
    "end of a group never started": pod(BASE + tag(99, 4)),
    "group never ended": pod(BASE + tag(99, 3) + number(1, 1)),
    "field number 0": pod(BASE + field(0, "x")),
    "field number negative as an int32": pod(BASE + tag(1 << 31, 2) + varint(1) + b"x"),
    "name as a varint": pod(number(1, 5)),
    "labels as a varint": pod(BASE + number(11, 5)),
    "creationTimestamp as a varint": pod(BASE + number(8, 5)),
    "generation length-delimited": pod(BASE + field(7, b"\x01")),
    "ownerReferences as fixed32": pod(BASE + tag(13, 5) + b"abcd"),
    "Timestamp seconds length-delimited": pod(BASE + field(8, field(1, b"\x01"))),
    "map entry's unknown field past the entry": pod(field(11, field(1, "k") + tag(9, 2) + varint(9) + b"ab") + BASE),
    "a pod without its envelope": field(1, "ADDED") + field(2, field(1, b"k8s\x01" + field(2, b""))),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_malformed_bytes_are_an_undecodable_event(case: str) -> None:
    data = MALFORMED[case]
    event = data if data.startswith(field(1, "ADDED")) else watch_event(data)
    with pytest.raises(UndecodableEvent):
        decoded(b"", event)


def test_a_long_varint_is_refused_at_its_eleventh_byte() -> None:
    # Read whole, a hostile varint cost quadratic time on the event loop: 400 kB took 5 s.
    started = time.monotonic()
    with pytest.raises(UndecodableEvent, match="integer overflow"):
        decoded(pod(BASE + tag(7, 0) + b"\xff" * 200_000 + b"\x01"))
    assert time.monotonic() - started < 0.1


def test_varints_are_cut_to_64_bits_as_go_cuts_them() -> None:
    # The tenth byte's high bits fall off (Go reads generation -1), and int32 keeps its low 32 bits.
    meta = BASE + tag(7, 0) + b"\xff" * 9 + b"\x7f"
    status = field(8, field(1, "c") + number(5, (1 << 32) + 5)) + field(8, field(1, "d") + number(5, 1 << 31))
    got = decoded(pod(meta, status=status))
    assert got["metadata"]["generation"] == -1
    assert got["status"]["containerStatuses"] == [{"name": "c", "restartCount": 5},
                                                  {"name": "d", "restartCount": -(1 << 31)}]


def test_groups_are_stepped_over_as_go_steps_over_them() -> None:
    group = tag(99, 3) + number(1, 1) + field(2, "zz") + tag(98, 3) + tag(98, 4) + tag(97, 4)  # any end number
    assert decoded(pod(field(1, "p") + group + field(3, "ns")))["metadata"] == {"name": "p", "namespace": "ns"}


# -- valid, not as gogo writes it: read as Go reads it ----------------------------------------------------

LABEL = field(11, field(1, "app") + field(2, "x"))


def labelled(entry: bytes) -> bytes:
    """A pod with one label entry between its name and namespace (a misread entry swallows the latter)."""
    return pod(field(1, "p") + field(11, entry) + field(3, "ns"))


CONDITION = field(2, field(1, "Ready") + field(2, "True") + field(3, b"") + field(4, timestamp(1_767_225_600)))
NON_CANONICAL = {
    "metadata twice: merged": (field(1, field(1, "p") + LABEL) + field(1, field(3, "ns") + field(11, field(1, "b"))),
                               {"metadata": {"name": "p", "namespace": "ns", "labels": {"app": "x", "b": ""}}}),
    "status twice: merged": (field(1, BASE) + field(3, field(1, "Running")) + field(3, CONDITION), {
        "metadata": {"name": "p", "namespace": "ns"}, "status": {"phase": "Running", "conditions": [
            {"type": "Ready", "status": "True", "lastProbeTime": None,
             "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}),
    "the last scalar wins, even empty": (pod(BASE + field(1, "") + number(7, 5) + number(7, 0)),
                                         {"metadata": {"namespace": "ns"}}),
    "map entry: no key": (labelled(field(2, "v")), {"labels": {"": "v"}}),
    "map entry: value first": (labelled(field(2, "v") + field(1, "k")), {"labels": {"k": "v"}}),
    "map entry: empty": (labelled(b""), {"labels": {"": ""}}),
    "map entry: no value": (labelled(field(1, "k")), {"labels": {"k": ""}}),
    "map entry: key twice, unknown field": (labelled(field(1, "a") + number(9, 1) + field(1, "k") + field(2, "v")),
                                            {"labels": {"k": "v"}}),
    "map entry: key as a varint, read as gogo reads it": (labelled(number(1, 3) + b"abc" + field(2, "v")),
                                                          {"labels": {"abc": "v"}}),
    "Timestamp: nanos first": (pod(BASE + field(8, number(2, 5) + number(1, 1_767_225_600))),
                               {"creationTimestamp": "2026-01-01T00:00:00Z"}),
    "Timestamp: seconds twice": (pod(BASE + field(8, number(1, 5) + number(1, 1_767_225_600))),
                                 {"creationTimestamp": "2026-01-01T00:00:00Z"}),
    "Timestamp: nanos alone": (pod(BASE + field(8, number(2, 5))), {"creationTimestamp": "1970-01-01T00:00:00Z"}),
    "an empty finalizer": (pod(BASE + field(14, "") + field(14, "a/b")), {"finalizers": ["", "a/b"]}),
    "a field number past an int32": (pod(tag((1 << 32) + 1, 2) + varint(1) + b"q" + field(3, "ns")), {"name": "q"}),
}


@pytest.mark.parametrize("case", NON_CANONICAL)
def test_valid_bytes_not_as_gogo_writes_them_read_as_go_reads_them(case: str) -> None:
    data, expected = NON_CANONICAL[case]
    got = decoded(data)
    if "metadata" in expected:  # (Go's JSON also has spec.containers null: no pod is without them)
        assert {key: got.get(key) for key in expected} == expected
    else:
        assert got["metadata"] == {"name": "p", "namespace": "ns", **expected}


def test_an_envelope_in_another_order_reads_the_same() -> None:
    unknown = field(2, pod(BASE)) + field(1, field(2, "Pod")) + field(1, field(1, "v1"))  # TypeMeta merged
    event = field(2, field(1, MAGIC + unknown)) + field(1, "MODIFIED")
    decoder = WatchDecoder({"kind": True, "apiVersion": True, "metadata": {"name": True}})
    assert decoder.event(event) == {"type": "MODIFIED", "object": {"kind": "Pod", "apiVersion": "v1",
                                                                   "metadata": {"name": "p"}}}


# -- zero times ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("zero", [b"", timestamp(ZERO_TIME), timestamp(ZERO_TIME, 5)])
def test_a_zero_time_is_what_the_json_has(zero: bytes) -> None:
    # creationTimestamp is omitzero in 1.36: JSON leaves it out; other times are null.
    condition = field(2, field(1, "Ready") + field(2, "True") + field(3, zero) + field(4, zero))
    got = decoded(pod(BASE + field(8, zero) + field(9, zero), status=condition))
    assert got["metadata"] == {"name": "p", "namespace": "ns", "deletionTimestamp": None}
    assert got["status"]["conditions"] == [{"type": "Ready", "status": "True", "lastProbeTime": None,
                                            "lastTransitionTime": None}]


# -- Status -------------------------------------------------------------------------------------------------

# A 504's ERROR event as the apiserver writes it (Go's protobuf serializer, k8s.io/api v0.36.3), and its JSON.
GO_ERROR_EVENT = bytes.fromhex(
    "0a054552524f521285010a82016b3873000a0c0a0276311206537461747573126a0a0f0a022f78120234321a03746f6b2000120746"
    "61696c7572651a016d220754696d656f75742a3f0a016e1201671a016b22270a175265736f7572636556657273696f6e546f6f4c61"
    "7267651209746f6f206c617267651a016622060a0012001a00280332017530f8031a002200"
)
JSON_ERROR_STATUS = {
    "kind": "Status", "apiVersion": "v1", "status": "Failure", "message": "m", "reason": "Timeout", "code": 504,
    "metadata": {"selfLink": "/x", "resourceVersion": "42", "continue": "tok", "remainingItemCount": 0},
    "details": {"name": "n", "group": "g", "kind": "k", "uid": "u", "retryAfterSeconds": 3,
                "causes": [{"reason": "ResourceVersionTooLarge", "message": "too large", "field": "f"}, {}]},
}


def test_a_status_reads_as_the_json_watch_has_it() -> None:
    event = WatchDecoder({"metadata": {"name": True}}).event(GO_ERROR_EVENT)
    assert event == {"type": "ERROR", "object": JSON_ERROR_STATUS}
    assert decode_status(GO_ERROR_EVENT[GO_ERROR_EVENT.index(MAGIC):]) == JSON_ERROR_STATUS
    empty = field(1, b"") + field(2, "Failure") + field(5, b"") + number(6, 410)
    assert decode_status(MAGIC + field(1, field(1, "v1") + field(2, "Status")) + field(2, empty)) == {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "details": {}, "code": 410}
