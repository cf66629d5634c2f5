"""Structured logging in the klog style KCM uses.

    log = get_logger("replicaset")
    log.info("Too few replicas", replicaSet="ns/web", need=3, creating=3)
    log.v(4).info("Finished syncing", replicaSet="ns/web", duration="3ms")
    log.error(err, "Error syncing", replicaSet="ns/web")

Text: `I1121 14:56:00.123456   4242 controller.py:212] "Too few replicas" replicaSet="ns/web" need=3`.
JSON (`--logging-format json`): one object a line with ts, logger, caller, msg, v (not on errors)
and the key/values.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any

import orjson

from pykcm.util.errors import one_line  # re-exported: most callers log the one line

_verbosity = 0


class Logger:
    def __init__(self, name: str, level: int = 0, logger: logging.Logger | None = None) -> None:
        self._logger = logger or logging.getLogger(f"pykcm.{name}")
        self._name = name
        self._level = level
        # v() is called on hot paths (per pod, per sync): one Logger per level, made once, since
        # logging.getLogger takes a lock.
        self._levels: dict[int, Logger] = {level: self}

    def v(self, level: int) -> Logger:
        leveled = self._levels.get(level)
        if leveled is None:
            leveled = self._levels[level] = Logger(self._name, level, self._logger)
        return leveled

    def enabled(self) -> bool:
        return self._level <= _verbosity

    def info(self, msg: str, **kv: Any) -> None:
        if self._level <= _verbosity:
            self._logger.info(msg, extra={"kv": kv, "v": self._level}, stacklevel=2)

    def warning(self, msg: str, **kv: Any) -> None:
        self._logger.warning(msg, extra={"kv": kv, "v": 0}, stacklevel=2)

    def error(self, err: BaseException | str | None, msg: str, **kv: Any) -> None:
        if err is not None:
            kv = {**kv, "err": one_line(err)}
        self._logger.error(msg, extra={"kv": kv, "v": 0}, stacklevel=2)


def get_logger(name: str) -> Logger:
    return Logger(name)


def _render(value: Any) -> str:
    if isinstance(value, str):
        return orjson.dumps(value).decode()
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)) or value is None:
        return "<nil>" if value is None else str(value)
    return orjson.dumps(value, default=str).decode()


class KlogFormatter(logging.Formatter):
    _LETTER = {logging.DEBUG: "I", logging.INFO: "I", logging.WARNING: "W", logging.ERROR: "E", logging.CRITICAL: "F"}

    def format(self, record: logging.LogRecord) -> str:
        micros = int(record.created % 1 * 1_000_000)  # LogRecord.msecs has whole milliseconds only
        ts = time.strftime("%m%d %H:%M:%S", time.localtime(record.created)) + f".{micros:06d}"
        kv = getattr(record, "kv", {})
        if "err" in kv and record.levelno >= logging.ERROR:  # klog's ErrorS writes err first, zapr's JSON last
            kv = {"err": kv["err"], **kv}
        pairs = "".join(f" {k}={_render(v)}" for k, v in kv.items())
        letter = self._LETTER.get(record.levelno, "I")
        # klog's header ends with the caller's file:line, which klog parsers read (`(\S+):(\d+)\]`).
        line = f"{letter}{ts} {os.getpid():>7} {record.filename}:{record.lineno}] {_render(record.getMessage())}{pairs}"
        if record.exc_info and _verbosity >= 4:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    """KCM's JSON lines (component-base's zap encoder, through zapr): "ts" in milliseconds since the
    epoch, the logger's name, "caller" as dir/file:line, "msg", "v", then the key-values. An error has
    no "v" (zapr's Error writes none: that is how a reader tells errors from info); a warning has
    "v":0 (klog logs it through Info). pykcm adds "level" to warnings and errors."""

    def format(self, record: logging.LogRecord) -> str:
        caller = f"{os.path.basename(os.path.dirname(record.pathname))}/{record.filename}:{record.lineno}"
        entry: dict[str, Any] = {"ts": record.created * 1000, "logger": record.name.removeprefix("pykcm."),
                                 "caller": caller, "msg": record.getMessage()}
        if record.levelno >= logging.ERROR:
            entry["level"] = "error"
        else:
            entry["v"] = getattr(record, "v", 0)
            if record.levelno == logging.WARNING:
                entry["level"] = "warning"
        entry.update(getattr(record, "kv", {}))
        return orjson.dumps(entry, default=str).decode()


def setup(verbosity: int = 0, fmt: str = "text") -> None:
    """Send pykcm's logs to stderr in the chosen format; called once by the CLI."""
    global _verbosity
    _verbosity = verbosity
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else KlogFormatter())
    root = logging.getLogger("pykcm")
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    root.propagate = False


def set_verbosity(verbosity: int) -> None:
    global _verbosity
    _verbosity = verbosity
