"""klog-style text and JSON log lines, and verbosity."""

import json
import logging
import re
import time

import pytest

from pykcm.app import cli
from pykcm.util import log


@pytest.fixture
def restored_logging():
    root = logging.getLogger("pykcm")
    saved = root.handlers[:], root.propagate, root.level
    yield
    # setup() is process-wide; other tests rely on propagation to pytest's caplog
    root.handlers[:], root.propagate, root.level = saved
    log.set_verbosity(0)


def emit(capsys, fmt: str, verbosity: int = 0) -> list[str]:
    root = logging.getLogger("pykcm")
    saved = root.handlers[:], root.propagate, root.level
    log.setup(verbosity, fmt)
    try:
        logger = log.get_logger("replicaset")
        logger.info("Too few replicas", replicaSet="ns/web", need=3)
        logger.v(4).info("Finished syncing", replicaSet="ns/web")
        logger.error(ValueError("quota\nexceeded"), "Error syncing", replicaSet="ns/web")
        logger.warning("Ignoring flags", flags=["--cert-dir"])
    finally:  # setup() is process-wide; other tests rely on propagation to pytest's caplog
        root.handlers[:], root.propagate, root.level = saved
        log.set_verbosity(0)
    return capsys.readouterr().err.strip().splitlines()


def test_text_lines_look_like_klog(capsys):
    lines = emit(capsys, "text")
    assert len(lines) == 3  # the V(4) line is filtered at -v 0
    assert re.fullmatch(
        r'I\d{4} \d\d:\d\d:\d\d\.\d{6} +\d+ test_log\.py:\d+\] "Too few replicas" replicaSet="ns/web" need=3', lines[0]
    )
    # klog's ErrorS (KCM's text lines): err right after the message, then the key-values.
    assert lines[1].startswith("E") and lines[1].endswith('"Error syncing" err="quota exceeded" replicaSet="ns/web"')


def test_json_lines_carry_key_values_and_verbosity(capsys):
    lines = [json.loads(line) for line in emit(capsys, "json", verbosity=4)]
    messages = ["Too few replicas", "Finished syncing", "Error syncing", "Ignoring flags"]
    assert [entry["msg"] for entry in lines] == messages
    assert lines[0]["replicaSet"] == "ns/web" and lines[0]["v"] == 0 and lines[1]["v"] == 4
    assert lines[2]["level"] == "error" and lines[2]["err"] == "quota exceeded"
    # component-base's JSON (zapr): an error is the line without "v"; klog writes a warning through Info, "v":0.
    assert "v" not in lines[2] and list(lines[2])[:4] == ["ts", "logger", "caller", "msg"]
    assert list(lines[2])[-1] == "err"  # zapr's Error adds it after the key-values
    assert lines[3]["v"] == 0 and lines[3]["level"] == "warning"
    # As KCM's JSON: milliseconds since the epoch, and where the line was logged from.
    assert abs(lines[0]["ts"] - time.time() * 1000) < 60_000
    assert lines[0]["logger"] == "replicaset" and re.fullmatch(r"unit/test_log\.py:\d+", lines[0]["caller"])
    assert list(lines[0])[:5] == ["ts", "logger", "caller", "msg", "v"]


def test_a_verbosity_level_logger_is_made_once() -> None:
    logger = log.get_logger("demo")
    assert logger.v(4) is logger.v(4)
    assert logger.v(0) is logger
    assert not logger.v(9).enabled()


def test_the_last_error_is_kcms_command_failed_line_once_logs_are_json(capsys, restored_logging, tmp_path):
    # KCM (component-base's cli.Run): `"msg":"command failed","err":"..."` through its logger.
    missing = tmp_path / "nope"
    assert cli.main(["run", "--logging-format", "json", "--kubeconfig", str(missing)]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    last = json.loads(lines[-1])
    assert (last["msg"], last["level"]) == ("command failed", "error")
    assert last["err"] == f"kubeconfig '{missing}' does not exist"
    assert "v" not in last and all(line.startswith("{") for line in lines)


def test_the_last_error_is_plain_before_logging_is_set_up_and_in_text(capsys, restored_logging, tmp_path):
    missing = tmp_path / "nope"
    assert cli.main(["run", "--kubeconfig", str(missing)]) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"pykcm: error: kubeconfig '{missing}' does not exist"
    assert cli.main(["run", "--logging-format", "json", "--secure-port", "70000"]) == 2  # a flag: before logging
    assert capsys.readouterr().err.strip().startswith("pykcm: error: --secure-port 70000")
