"""Values in text lines as klog writes them (serialize.KVFormat): strings and messages through Go's
strconv.Quote, everything else as Go's encoding/json; one line always (klog's multi-line `key=<`
block is not copied)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from pykcm.util.log import NIL_STRINGER, JsonFormatter, KlogFormatter, _render, go_quote, kobj_slice, kref


@pytest.mark.parametrize(("text", "quoted"), [
    ("plain ns/web-1", '"plain ns/web-1"'),
    ('say "hi" \\ bye', '"say \\"hi\\" \\\\ bye"'),
    ("a\nb\tc\rd\ae\bf\fg\vh", '"a\\nb\\tc\\rd\\ae\\bf\\fg\\vh"'),  # klog: one line, not a `key=<` block
    ("\x00\x1b[0m\x7f", '"\\x00\\x1b[0m\\x7f"'),
    ("\x85\u00a0\u2028\u2029\ufeff", '"\\u0085\\u00a0\\u2028\\u2029\\ufeff"'),  # C1, no-break space, separators
    ("é 日本 \U0001f600", '"é 日本 \U0001f600"'),  # printable: as it is
    ("\U000e0001", '"\\U000e0001"'),
    ("bad \udc80 byte", '"bad \\x80 byte"'),  # a byte that was not UTF-8 (surrogateescape): Go writes the byte
    ("", '""'),
])
def test_strings_are_quoted_as_go_strconv_quote(text: str, quoted: str) -> None:
    assert go_quote(text) == quoted
    assert _render(text) == quoted


@pytest.mark.parametrize(("value", "rendered"), [
    (None, "null"),  # klog: an untyped nil is JSON's null, not <nil>
    (True, "true"),
    (3, "3"),
    (-(2**70), str(-(2**70))),
    (3.0, "3"),  # Go's JSON: an integral float has no ".0"
    (0.5, "0.5"),
    (-0.0, "-0"),
    (1e20, "100000000000000000000"),
    (1.2345678901234568e17, "123456789012345680"),
    (1e21, "1e+21"),
    (1e-6, "0.000001"),
    (1e-7, "1e-7"),
    (1.5e-10, "1.5e-10"),
    (float("nan"), '"<internal error: json: unsupported value: NaN>"'),
    (float("-inf"), '"<internal error: json: unsupported value: -Inf>"'),
    ({"b": "1", "a": "x<y&z"}, '{"a":"x\\u003cy\\u0026z","b":"1"}'),  # map keys sorted, HTML escaped
    (["ns/a", "b\u2028"], '["ns/a","b\\u2028"]'),
    (("a", 1), '["a",1]'),
    ({1: "one"}, '{"1":"one"}'),
    (kref("ns", "web"), '"ns/web"'),
    (kref("", "node-1"), '"node-1"'),
    ([kref("ns", "a"), kref("", "b")], '[{"name":"a","namespace":"ns"},{"name":"b"}]'),
    # klog.KObjSlice's WriteText (klog v2.140.0): the references quoted, comma-separated.
    (kobj_slice([{"metadata": {"namespace": "ns", "name": "a"}}, {"metadata": {"name": "b"}}]), '["ns/a","b"]'),
    (kobj_slice([]), "[]"),
    ([2**70], '"<internal error: Integer exceeds 64-bit range>"'),
])
def test_values_render_as_klog_text(value: Any, rendered: str) -> None:
    assert _render(value) == rendered


def test_the_message_is_quoted_as_go_and_stays_on_one_line() -> None:
    record = logging.LogRecord("pykcm.demo", logging.INFO, "x.py", 1, 'Pod "a"\nb\x1b', None, None)
    record.kv = {"err": None}  # type: ignore[attr-defined]
    assert KlogFormatter().format(record).endswith('] "Pod \\"a\\"\\nb\\x1b" err=null')


def test_a_nil_stringer_is_klogs_recovered_panic_in_text_and_zaps_nil_in_json() -> None:
    # A nil *metav1.Time (a pod's DeletionTimestamp): klog calls String(), which panics on the nil
    # pointer, and writes the recovered panic; zap's Stringer encoder writes "<nil>" for a nil pointer.
    record = logging.LogRecord("pykcm.demo", logging.INFO, "x.py", 1, "Pod deleted", None, None)
    record.kv = {"deletion_timestamp": NIL_STRINGER}  # type: ignore[attr-defined]
    assert KlogFormatter().format(record).endswith(
        '] "Pod deleted" deletion_timestamp="<panic: runtime error: invalid memory address or nil pointer'
        ' dereference>"')
    assert '"deletion_timestamp":"<nil>"' in JsonFormatter().format(record)
