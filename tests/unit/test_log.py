"""klog-style text and JSON log lines, and verbosity."""

import json
import logging
import re
import time

from pykcm.util import log


def emit(capsys, fmt: str, verbosity: int = 0) -> list[str]:
    root = logging.getLogger("pykcm")
    saved = root.handlers[:], root.propagate, root.level
    log.setup(verbosity, fmt)
    try:
        logger = log.get_logger("replicaset")
        logger.info("Too few replicas", replicaSet="ns/web", need=3)
        logger.v(4).info("Finished syncing", replicaSet="ns/web")
        logger.error(ValueError("quota\nexceeded"), "Error syncing", replicaSet="ns/web")
    finally:  # setup() is process-wide; other tests rely on propagation to pytest's caplog
        root.handlers[:], root.propagate, root.level = saved
        log.set_verbosity(0)
    return capsys.readouterr().err.strip().splitlines()


def test_text_lines_look_like_klog(capsys):
    lines = emit(capsys, "text")
    assert len(lines) == 2  # the V(4) line is filtered at -v 0
    assert re.fullmatch(
        r'I\d{4} \d\d:\d\d:\d\d\.\d{6} +\d+ replicaset\] "Too few replicas" replicaSet="ns/web" need=3', lines[0]
    )
    assert lines[1].startswith("E") and lines[1].endswith('replicaSet="ns/web" err="quota exceeded"')


def test_json_lines_carry_key_values_and_verbosity(capsys):
    lines = [json.loads(line) for line in emit(capsys, "json", verbosity=4)]
    assert [entry["msg"] for entry in lines] == ["Too few replicas", "Finished syncing", "Error syncing"]
    assert lines[0]["replicaSet"] == "ns/web" and lines[0]["v"] == 0 and lines[1]["v"] == 4
    assert lines[2]["level"] == "error" and lines[2]["err"] == "quota exceeded"
    # As KCM's JSON: milliseconds since the epoch, and where the line was logged from.
    assert abs(lines[0]["ts"] - time.time() * 1000) < 60_000
    assert lines[0]["logger"] == "replicaset" and re.fullmatch(r"unit/test_log\.py:\d+", lines[0]["caller"])
    assert list(lines[0])[:5] == ["ts", "logger", "caller", "msg", "v"]


def test_a_verbosity_level_logger_is_made_once() -> None:
    logger = log.get_logger("demo")
    assert logger.v(4) is logger.v(4)
    assert logger.v(0) is logger
    assert not logger.v(9).enabled()
