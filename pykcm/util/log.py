"""Structured logging in the klog style KCM uses.

    log = get_logger("replicaset")
    log.v(2).info("Too few replicas", replicaSet=kobj(rs), need=3, creating=3)
    log.v(4).info("Finished syncing", kind="ReplicaSet", key="ns/web", duration="3ms")
    log.error(err, "Error syncing", key="ns/web")

Text: `I1121 14:56:00.123456   4242 controller.py:212] "Too few replicas" replicaSet="ns/web" need=3`,
values as klog's text writes them: strings and the message quoted as Go's strconv.Quote, None as
null, numbers, lists and dicts as Go's JSON (map keys sorted), an object reference (`kobj`, `kref`)
as "ns/name", a list of them (`kobj_slice`) as ["ns/a","b"]. One difference, on purpose: a value
with line breaks stays on its line, escaped, where klog writes a `key=<` block of lines (one line
per action).
JSON (`--logging-format json`): one object a line with ts, logger (a named logger's line only),
caller, msg, v (not on errors) and the key/values, which never replace the entry's own ts, caller,
msg, v or level; an object reference is {"name": ..., "namespace": ...}, as klog.KObj through zapr,
a `kobj_slice` a list of them. `log.named("replicaset-controller")` is klog.LoggerWithName: its
lines carry logger="replicaset-controller" first, as KCM's controllers' event handlers' do.
A key may be named like a method's parameter (`msg=`, `err=`). Other loggers' warnings and errors
(asyncio, urllib3, Python's warnings) come out in the same format.
"""

from __future__ import annotations

import logging
import math
import os
import re
import sys
import time
from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any

import orjson

from pykcm.util.errors import described_with_type, one_line  # one_line re-exported: most callers log the one line

_verbosity = 0


class Logger:
    def __init__(
        self, name: str, level: int = 0, logger: logging.Logger | None = None, klog_name: str = ""
    ) -> None:
        self._logger = logger or logging.getLogger(f"pykcm.{name}")
        self._name = name
        self._level = level
        self._klog_name = klog_name  # named(): its lines' logger=
        # v() is called on hot paths (per pod, per sync): one Logger per level, made once, since
        # logging.getLogger takes a lock.
        self._levels: dict[int, Logger] = {level: self}

    def v(self, level: int) -> Logger:
        leveled = self._levels.get(level)
        if leveled is None:
            leveled = self._levels[level] = Logger(self._name, level, self._logger, self._klog_name)
        return leveled

    def named(self, name: str) -> Logger:
        """klog.LoggerWithName: lines with logger="<name>" first (klog's WithName prepends it; names
        join with "."), as KCM's from the logger a controller's constructor gets. An unnamed logger's
        lines (KCM's Run and sync) have no logger key, in text or JSON."""
        return Logger(self._name, self._level, self._logger, f"{self._klog_name}.{name}" if self._klog_name else name)

    @property
    def named_as(self) -> str:
        """The name named() gave ("" for none)."""
        return self._klog_name

    def enabled(self) -> bool:
        return self._level <= _verbosity

    # msg and err are positional-only: a key/value may be named `msg` or `err` (logr's are a list).
    def info(self, msg: str, /, **kv: Any) -> None:
        if self._level <= _verbosity:
            if self._klog_name:
                kv = {"logger": self._klog_name, **kv}
            self._logger.info(msg, extra={"kv": kv, "v": self._level}, stacklevel=2)

    def warning(self, msg: str, /, **kv: Any) -> None:
        if self._klog_name:
            kv = {"logger": self._klog_name, **kv}
        self._logger.warning(msg, extra={"kv": kv, "v": 0}, stacklevel=2)

    def error(self, err: BaseException | str | None, msg: str, /, **kv: Any) -> None:
        if self._klog_name:
            kv = {"logger": self._klog_name, **kv}
        if err is not None:
            kv = {**kv, "err": one_line(err)}
        self._logger.error(msg, extra={"kv": kv, "v": 0}, stacklevel=2)


def get_logger(name: str) -> Logger:
    return Logger(name)


class ObjectRef:
    """klog's ObjectRef (KObj, KRef): an object named in a line, "ns/name" (or "name") in text,
    {"name": ..., "namespace": ...} in JSON, the namespace left out when empty."""

    __slots__ = ("name", "namespace")

    def __init__(self, namespace: str, name: str) -> None:
        self.namespace, self.name = namespace, name

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}" if self.namespace else self.name

    def __repr__(self) -> str:
        return f"kref({self.namespace!r}, {self.name!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ObjectRef) and (other.namespace, other.name) == (self.namespace, self.name)

    def __hash__(self) -> int:
        return hash((self.namespace, self.name))

    def as_json(self) -> dict[str, str]:
        return {"name": self.name, "namespace": self.namespace} if self.namespace else {"name": self.name}


def kref(namespace: str, name: str) -> ObjectRef:
    return ObjectRef(namespace, name)


def kobj(obj: Mapping[str, Any] | None) -> ObjectRef:
    """The reference to an object (klog.KObj; None gives the empty one, as KObj(nil))."""
    meta = (obj or {}).get("metadata") or {}
    return ObjectRef(meta.get("namespace") or "", meta.get("name") or "")


class _GoEscapes(dict[int, str]):
    """str.translate's table for go_quote, each character's form worked out when first met."""

    def __missing__(self, code: int) -> str:
        if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8 (surrogateescape): Go writes the byte
            escaped = f"\\x{code - 0xDC00:02x}"
        elif chr(code).isprintable():  # Python's printable is Go's strconv.IsPrint
            escaped = chr(code)
        elif code < 0x80:
            escaped = f"\\x{code:02x}"
        else:
            escaped = f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
        if len(self) < 4096:  # bounded: a flood of distinct characters must not grow it for good
            self[code] = escaped
        return escaped


_GO_QUOTED = _GoEscapes(str.maketrans({"\a": r"\a", "\b": r"\b", "\f": r"\f", "\n": r"\n", "\r": r"\r",
                                      "\t": r"\t", "\v": r"\v", "\\": "\\\\", '"': '\\"'}))


def go_quote(text: str) -> str:
    """Go's strconv.Quote, as klog quotes messages and string values: printable characters as they
    are, `"` and `\\` backslashed, the others escaped (\\n, \\x1b, \\u2028)."""
    if text.isprintable():  # the common case, at C speed
        if '"' in text or "\\" in text:
            text = text.replace("\\", "\\\\").replace('"', '\\"')
        return f'"{text}"'
    return f'"{text.translate(_GO_QUOTED)}"'


class ObjectRefSlice:
    """klog's KObjSlice: the references to a list of objects, ["ns/a","b"] in text (its WriteText),
    a list of {"name", "namespace"} in JSON."""

    __slots__ = ("refs",)

    def __init__(self, refs: list[ObjectRef]) -> None:
        self.refs = refs

    def __repr__(self) -> str:
        return f"kobj_slice({self.refs!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ObjectRefSlice) and other.refs == self.refs

    def write_text(self) -> str:
        return "[" + ",".join(f'"{ref}"' for ref in self.refs) + "]"

    def as_json(self) -> list[dict[str, str]]:
        return [ref.as_json() for ref in self.refs]


def kobj_slice(objs: Iterable[Mapping[str, Any]]) -> ObjectRefSlice:
    """klog.KObjSlice. It reads every object when called, where KCM's defers that to the write:
    behind a `v(n).enabled()` check for a long list (a ReplicaSet's 10,000 pods)."""
    return ObjectRefSlice([kobj(obj) for obj in objs])


class NilStringer:
    """A nil pointer to a type with a String method as a value (a pod's DeletionTimestamp when it has
    none): klog's text writes the panic its String() raises, recovered; zap's JSON writes "<nil>"."""

    __slots__ = ()
    TEXT = '"<panic: runtime error: invalid memory address or nil pointer dereference>"'

    def __repr__(self) -> str:
        return "NIL_STRINGER"

    def as_json(self) -> str:
        return "<nil>"


NIL_STRINGER = NilStringer()


def _json_default(value: Any) -> Any:
    return value.as_json() if isinstance(value, ObjectRef | ObjectRefSlice | NilStringer) else str(value)


# Go's encoding/json (klog's text values) escapes these; orjson writes them as they are.
_GO_JSON_UNSAFE = re.compile("[<>&\u2028\u2029]")


def _go_json_escape(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def _go_json(value: Any) -> str:
    """A list, dict or other value as Go's encoding/json writes it in klog's text: map keys sorted."""
    try:
        text = orjson.dumps(value, default=_json_default, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)
    except orjson.JSONEncodeError as err:  # klog writes what went wrong in place of the value
        return go_quote(f"<internal error: {err}>")
    return _GO_JSON_UNSAFE.sub(_go_json_escape, text.decode())


def _go_float(value: float) -> str:
    """A float as Go's encoding/json writes it: 3, 0.5, 1e+21, 1e-7 (the shortest digits, without
    exponent from 1e-6 to 1e21); NaN and ±Inf as klog writes json's error for them."""
    if not math.isfinite(value):
        name = "NaN" if math.isnan(value) else "+Inf" if value > 0 else "-Inf"
        return f'"<internal error: json: unsupported value: {name}>"'
    if value == 0 or 1e-6 <= abs(value) < 1e21:
        return format(Decimal(repr(value)).normalize(), "f")
    return repr(value).replace("e-0", "e-")  # Go's exponent has no leading zero


def _render(value: Any) -> str:
    """A value as klog's text format writes it (serialize.KVFormat), the common kinds first."""
    if isinstance(value, str):
        return go_quote(value)
    if isinstance(value, ObjectRef):
        return f'"{value}"'  # klog's ObjectRef.WriteText: quoted, unescaped (names need no escape)
    if isinstance(value, ObjectRefSlice):
        return value.write_text()
    if value is None or isinstance(value, bool):
        return "null" if value is None else "true" if value else "false"
    if isinstance(value, int):
        return int.__repr__(value)  # an IntEnum too: as the number, as Go's JSON
    if isinstance(value, float):
        return _go_float(value)
    if value is NIL_STRINGER:
        return NilStringer.TEXT
    return _go_json(value)


class KlogFormatter(logging.Formatter):
    _LETTER = {logging.DEBUG: "I", logging.INFO: "I", logging.WARNING: "W", logging.ERROR: "E", logging.CRITICAL: "F"}

    def format(self, record: logging.LogRecord) -> str:
        micros = int(record.created % 1 * 1_000_000)  # LogRecord.msecs has whole milliseconds only
        ts = time.strftime("%m%d %H:%M:%S", time.localtime(record.created)) + f".{micros:06d}"
        kv = getattr(record, "kv", {})
        error = _logged_exception(record)
        if error is not None and "err" not in kv:  # another logger's (asyncio's "Task exception was never retrieved")
            kv = {**kv, "err": described_with_type(error)}
        if "err" in kv and record.levelno >= logging.ERROR:  # klog's ErrorS writes err first, zapr's JSON last
            kv = {"err": kv["err"], **kv}
        pairs = "".join(f" {k}={_render(v)}" for k, v in kv.items())
        letter = self._LETTER.get(record.levelno, "I")
        # klog's header ends with the caller's file:line, which klog parsers read (`(\S+):(\d+)\]`).
        header = f"{letter}{ts} {os.getpid():>7} {record.filename}:{record.lineno}]"
        line = f"{header} {go_quote(record.getMessage())}{pairs}"
        if record.exc_info and _verbosity >= 4:
            line += "\n" + self.formatException(record.exc_info)
        return line


# The entry's own fields: a key/value of the same name is left out ("logger" is the key/values' to
# name, as utilruntime's lines come from the logger "UnhandledError").
_OWN_FIELDS = frozenset({"ts", "caller", "msg", "v", "level"})


class JsonFormatter(logging.Formatter):
    """KCM's JSON lines (component-base's zap encoder, through zapr): "ts" in milliseconds since the
    epoch, "logger" for a named logger's line only (zap's LoggerKey; the key/value `logger`, as
    `named()` and utilruntime's "UnhandledError" lines give it), "caller" as dir/file:line, "msg",
    "v", then the key-values. An error has no "v" (zapr's Error writes none: that is how a reader
    tells errors from info); a warning has "v":0 (klog logs it through Info). pykcm adds "level" to
    warnings and errors. Another library's line names its Python logger; its exception is its
    "err", traceback and all, in the one line."""

    def format(self, record: logging.LogRecord) -> str:
        caller = f"{os.path.basename(os.path.dirname(record.pathname))}/{record.filename}:{record.lineno}"
        entry: dict[str, Any] = {"ts": record.created * 1000}
        kv = getattr(record, "kv", None)
        if kv is None:  # another library's line (asyncio's, urllib3's)
            entry["logger"] = record.name
            kv = {}
        elif "logger" in kv:
            entry["logger"] = kv["logger"]
        entry["caller"], entry["msg"] = caller, record.getMessage()
        if record.levelno >= logging.ERROR:
            entry["level"] = "error"
        else:
            entry["v"] = getattr(record, "v", 0)
            if record.levelno == logging.WARNING:
                entry["level"] = "warning"
        if not _OWN_FIELDS.isdisjoint(kv):
            kv = {k: v for k, v in kv.items() if k not in _OWN_FIELDS}
        entry.update(kv)
        if record.exc_info and _logged_exception(record) is not None and "err" not in kv:
            entry["err"] = self.formatException(record.exc_info)
        try:
            return orjson.dumps(entry, default=_json_default, option=orjson.OPT_NON_STR_KEYS).decode()
        except orjson.JSONEncodeError:  # a value JSON cannot hold: the line is still written, as zap's
            return orjson.dumps({k: _json_value(v) for k, v in entry.items()}, default=_json_default,
                                option=orjson.OPT_NON_STR_KEYS).decode()


def _json_value(value: Any) -> Any:
    """`value` where orjson can write it; a string with bytes that were not UTF-8 with U+FFFD in their
    place; otherwise klog's "<internal error: ...>" (an int past 64 bits, say)."""
    try:
        orjson.dumps(value, default=_json_default, option=orjson.OPT_NON_STR_KEYS)
    except orjson.JSONEncodeError as err:
        if isinstance(value, str):
            return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
        return f"<internal error: {err}>"
    return value


def _logged_exception(record: logging.LogRecord) -> BaseException | None:
    return record.exc_info[1] if record.exc_info else None


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to sys.stderr as it is at each line (as logging's lastResort does), not as it was when
    set up: a test's captured stderr is gone once the test ends."""

    def __init__(self, formatter: logging.Formatter, level: int = logging.NOTSET) -> None:
        logging.Handler.__init__(self, level)
        self.setFormatter(formatter)

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr


_PYKCM = logging.Filter("pykcm")


def _not_pykcms(record: logging.LogRecord) -> bool:
    return not _PYKCM.filter(record)  # they have their own handler: never written twice


def setup(verbosity: int = 0, fmt: str = "text") -> None:
    """Send pykcm's logs to stderr in the chosen format; called once by the CLI. Other loggers'
    warnings and errors (asyncio's "Task exception was never retrieved", urllib3's, Python's
    warnings) go through the same format from the root logger: a parser of KCM's lines meets no
    bare text, and the root keeps the handlers others put there (pytest's caplog)."""
    global _verbosity
    _verbosity = verbosity
    formatter = JsonFormatter() if fmt == "json" else KlogFormatter()
    pykcm = logging.getLogger("pykcm")
    pykcm.handlers[:] = [_StderrHandler(formatter)]
    pykcm.setLevel(logging.INFO)
    pykcm.propagate = False  # its lines go out once, through its own handler
    root = logging.getLogger()
    root.handlers[:] = [h for h in root.handlers if not isinstance(h, _StderrHandler)]  # set up again: one
    others = _StderrHandler(formatter, logging.WARNING)
    others.addFilter(_not_pykcms)
    root.addHandler(others)
    logging.captureWarnings(True)  # Python's warnings as log lines (logger py.warnings), not bare text


def set_verbosity(verbosity: int) -> None:
    global _verbosity
    _verbosity = verbosity
