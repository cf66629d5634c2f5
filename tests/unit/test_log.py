"""klog-style text and JSON log lines, and verbosity."""

import json
import logging
import re
import time
import warnings

import pytest

from pykcm.app import cli
from pykcm.serving import debugflags
from pykcm.serving.messages import Headers, Query, Request
from pykcm.util import log


@pytest.fixture
def restored_logging():
    """setup() is process-wide: put back the "pykcm" and root loggers (other tests rely on
    propagation to pytest's caplog) and Python's warnings."""
    loggers = [logging.getLogger("pykcm"), logging.getLogger()]
    saved = [(logger.handlers[:], logger.propagate, logger.level) for logger in loggers]
    logging.captureWarnings(False)  # a cli.main test before may have left it on
    yield
    for logger, (handlers, propagate, level) in zip(loggers, saved, strict=True):
        logger.handlers[:], logger.propagate, logger.level = handlers, propagate, level
    logging.captureWarnings(False)
    log.set_verbosity(0)


def emit(capsys, fmt: str, verbosity: int = 0) -> list[str]:
    log.setup(verbosity, fmt)
    logger = log.get_logger("replicaset")
    logger.info("Too few replicas", replicaSet="ns/web", need=3)
    logger.v(4).info("Finished syncing", replicaSet="ns/web")
    logger.error(ValueError("quota\nexceeded"), "Error syncing", replicaSet="ns/web")
    logger.warning("Ignoring flags", flags=["--cert-dir"])
    return capsys.readouterr().err.strip().splitlines()


def json_lines(capsys) -> list[dict]:
    return [json.loads(line) for line in capsys.readouterr().err.strip().splitlines()]


def test_text_lines_look_like_klog(capsys, restored_logging):
    lines = emit(capsys, "text")
    assert len(lines) == 3  # the V(4) line is filtered at -v 0
    assert re.fullmatch(
        r'I\d{4} \d\d:\d\d:\d\d\.\d{6} +\d+ test_log\.py:\d+\] "Too few replicas" replicaSet="ns/web" need=3', lines[0]
    )
    # klog's ErrorS (KCM's text lines): err right after the message, then the key-values.
    assert lines[1].startswith("E") and lines[1].endswith('"Error syncing" err="quota exceeded" replicaSet="ns/web"')


def test_json_lines_carry_key_values_and_verbosity(capsys, restored_logging):
    lines = [json.loads(line) for line in emit(capsys, "json", verbosity=4)]
    messages = ["Too few replicas", "Finished syncing", "Error syncing", "Ignoring flags"]
    assert [entry["msg"] for entry in lines] == messages
    assert lines[0]["replicaSet"] == "ns/web" and lines[0]["v"] == 0 and lines[1]["v"] == 4
    assert lines[2]["level"] == "error" and lines[2]["err"] == "quota exceeded"
    # component-base's JSON (zapr): an error is the line without "v"; klog writes a warning through Info, "v":0.
    assert "v" not in lines[2] and list(lines[2])[:3] == ["ts", "caller", "msg"]
    assert list(lines[2])[-1] == "err"  # zapr's Error adds it after the key-values
    assert lines[3]["v"] == 0 and lines[3]["level"] == "warning"
    # As KCM's JSON: milliseconds since the epoch, and where the line was logged from.
    assert abs(lines[0]["ts"] - time.time() * 1000) < 60_000
    assert re.fullmatch(r"unit/test_log\.py:\d+", lines[0]["caller"])
    # zap writes "logger" only for a named logger: KCM's Run and sync lines have none.
    assert list(lines[0])[:4] == ["ts", "caller", "msg", "v"]


def test_a_named_loggers_lines_carry_its_name_first_as_klogs_and_zaprs(capsys, restored_logging):
    # KCM hands a controller's constructor klog.LoggerWithName(logger, "replicaset-controller"): its event
    # handlers' lines carry logger= first (klog's WithName prepends it), after err on an error line.
    handlers = log.get_logger("replicaset").named("replicaset-controller")
    for fmt in ("text", "json"):
        log.setup(4, fmt)
        handlers.v(4).info("Adding", replicaSet=log.kref("ns", "web"))
        handlers.error("boom", "Failed", key="ns/web")
        handlers.named("UnhandledError").error(None, "Unhandled Error")
    text = capsys.readouterr().err.strip().splitlines()
    assert text[0].endswith('] "Adding" logger="replicaset-controller" replicaSet="ns/web"')
    assert text[1].endswith('] "Failed" err="boom" logger="replicaset-controller" key="ns/web"')
    assert text[2].endswith('] "Unhandled Error" logger="replicaset-controller.UnhandledError"')
    adding, failed, unhandled = (json.loads(line) for line in text[3:])
    assert list(adding) == ["ts", "logger", "caller", "msg", "v", "replicaSet"]
    assert adding["logger"] == "replicaset-controller" and adding["v"] == 4
    assert list(failed) == ["ts", "logger", "caller", "msg", "level", "key", "err"]
    assert unhandled["logger"] == "replicaset-controller.UnhandledError"
    assert handlers.v(4).named("x") is not handlers  # a leveled logger keeps its name, and names further
    assert handlers.v(4).enabled() and not log.get_logger("replicaset").named("n").v(9).enabled()


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


def test_a_key_named_like_a_logger_parameter_is_a_key_value(caplog):
    # logr takes key/values as a list: a plugin's line with `msg=` or `err=` is no TypeError.
    logger = log.get_logger("demo")
    with caplog.at_level(logging.INFO, logger="pykcm"):
        logger.info("Synced", msg="m")
        logger.warning("Odd", msg="m")
        logger.error(None, "Failed", msg="m", err="e")
        logger.error("boom", "Failed", err="e")  # the error given wins, as the last of klog's duplicates
    assert [(r.getMessage(), r.kv) for r in caplog.records] == [  # type: ignore[attr-defined]
        ("Synced", {"msg": "m"}), ("Odd", {"msg": "m"}), ("Failed", {"msg": "m", "err": "e"}),
        ("Failed", {"err": "boom"})]


def test_a_json_line_is_written_whatever_its_values(capsys, restored_logging):
    # Text writes these; JSON must not lose the line: a path that was not UTF-8, a map with int keys,
    # an int past 64 bits (klog's "<internal error: ...>" in its place).
    log.setup(0, "json")
    log.get_logger("demo").info("Odd \udcff", path="/tmp/\udcff", counts={200: 1}, n=2**70)
    [line] = json_lines(capsys)
    assert (line["msg"], line["path"], line["counts"]) == ("Odd \ufffd", "/tmp/\ufffd", {"200": 1})
    assert line["n"].startswith("<internal error: ")


def test_json_key_values_do_not_replace_the_entrys_own_fields(capsys, restored_logging):
    log.setup(0, "json")
    logger = log.get_logger("demo")
    logger.info("Synced", ts=1, caller="x", msg="m", v=7, level="error", key="ns/a")
    logger.error(None, "Failed", v=7, level="info", logger="UnhandledError")
    synced, failed = json_lines(capsys)
    assert (synced["msg"], synced["v"], synced["key"]) == ("Synced", 0, "ns/a")
    assert synced["ts"] != 1 and synced["caller"].startswith("unit/test_log.py:") and "level" not in synced
    # "logger" stays the key/values' to name: utilruntime's lines come from the logger "UnhandledError".
    assert (failed["msg"], failed["level"], failed["logger"]) == ("Failed", "error", "UnhandledError")
    assert "v" not in failed


async def test_the_verbosity_change_is_a_v0_line_naming_the_new_verbosity(capsys, restored_logging):
    log.setup(0, "json")
    put = Request("PUT", debugflags.VERBOSITY_PATH, Query(), Headers(), "HTTP/1.1", None, body=b"4")
    assert (await debugflags.serve(put)).status == 200
    [entry] = json_lines(capsys)
    assert (entry["msg"], entry["v"], entry["verbosity"]) == ("Log verbosity changed", 0, 4)


def test_an_object_reference_is_ns_name_in_text_and_an_object_in_json(capsys, restored_logging):
    # klog.KObj/KRef: a string in klog's text, {"name","namespace"} through zapr (namespace omitted when empty).
    rs = {"metadata": {"namespace": "ns", "name": "web"}}
    for fmt in ("text", "json"):
        log.setup(0, fmt)
        log.get_logger("replicaset").info("Too few replicas", replicaSet=log.kobj(rs), node=log.kref("", "n1"))
    text, entry = capsys.readouterr().err.strip().splitlines()
    assert text.endswith('] "Too few replicas" replicaSet="ns/web" node="n1"')
    assert json.loads(entry)["replicaSet"] == {"name": "web", "namespace": "ns"}
    assert json.loads(entry)["node"] == {"name": "n1"}
    assert log.kobj(rs) == log.kref("ns", "web") and str(log.kobj(rs)) == "ns/web"
    assert str(log.kobj(None)) == ""  # klog.KObj(nil)


def test_an_object_slice_is_a_list_of_references_in_text_and_json(capsys, restored_logging):
    # klog.KObjSlice: ["ns/a","b"] in klog's text (its WriteText), a list of {"name","namespace"} through zapr.
    pods = [{"metadata": {"namespace": "ns", "name": "a"}}, {"metadata": {"name": "b"}}]
    for fmt in ("text", "json"):
        log.setup(0, fmt)
        log.get_logger("replicaset").info("Found related pods", pods=log.kobj_slice(pods), none=log.kobj_slice([]))
    text, entry = capsys.readouterr().err.strip().splitlines()
    assert text.endswith('] "Found related pods" pods=["ns/a","b"] none=[]')
    assert json.loads(entry)["pods"] == [{"name": "a", "namespace": "ns"}, {"name": "b"}]
    assert json.loads(entry)["none"] == []
    assert log.kobj_slice(pods) == log.kobj_slice(iter(pods)) != log.kobj_slice(pods[:1])


def raise_and_log_from_asyncio() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        logging.getLogger("asyncio").error("Task exception was never retrieved\nfuture: <Task>", exc_info=True)


def test_other_loggers_warnings_and_errors_come_out_once_in_json(capsys, caplog, restored_logging):
    log.setup(0, "json")
    raise_and_log_from_asyncio()
    logging.getLogger("urllib3.connectionpool").info("Starting new HTTPS connection")  # below WARNING
    logging.getLogger("urllib3.connectionpool").warning("Retrying")
    warnings.warn("old API", UserWarning, stacklevel=1)
    log.get_logger("replicaset").info("Synced")
    entries = json_lines(capsys)  # each a line of JSON: json.loads would fail on a bare traceback line
    # Another library's line names its logger (there is no KCM line to be like); pykcm's unnamed one none.
    assert [(e.get("logger"), e["msg"].splitlines()[0]) for e in entries] == [
        ("asyncio", "Task exception was never retrieved"), ("urllib3.connectionpool", "Retrying"),
        ("py.warnings", entries[2]["msg"].splitlines()[0]), (None, "Synced")]
    assert "UserWarning: old API" in entries[2]["msg"]
    failed = entries[0]
    assert failed["level"] == "error" and "v" not in failed and failed["msg"].endswith("future: <Task>")
    assert failed["err"].startswith("Traceback (most recent call last):") and failed["err"].endswith("ValueError: boom")
    assert entries[1]["level"] == "warning"
    # setup() adds its handler to the root logger's, and pytest's caplog keeps seeing other loggers.
    assert [r.getMessage() for r in caplog.records if r.name == "urllib3.connectionpool"] == ["Retrying"]


def test_another_loggers_error_is_one_klog_line_with_err_in_text(capsys, restored_logging):
    log.setup(0, "text")
    raise_and_log_from_asyncio()
    [line] = capsys.readouterr().err.strip().splitlines()
    assert re.fullmatch(r'E\d{4} [\d:.]+ +\d+ test_log\.py:\d+\] "Task exception was never retrieved\\nfuture: <Task>"'
                        r' err="ValueError: boom \(at test_log\.py:\d+ in raise_and_log_from_asyncio\)"', line)


def test_setting_up_twice_leaves_one_handler_on_the_root_logger(restored_logging):
    before = logging.getLogger().handlers[:]
    log.setup(0, "text")
    log.setup(0, "json")
    added = [h for h in logging.getLogger().handlers if h not in before]
    assert len(added) == 1 and isinstance(added[0].formatter, log.JsonFormatter)
