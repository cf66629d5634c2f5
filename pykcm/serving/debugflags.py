"""/debug/flags, as KCM serves it with --profiling (its default): PUT a number to /debug/flags/v
to change the log verbosity of the running process, without a restart.

Go's /debug/pprof, which --profiling also serves in KCM, has no Python counterpart; SIGQUIT
(pykcm/app/stackdump.py) gives the stacks instead.
"""

from __future__ import annotations

import orjson

from pykcm.serving.messages import Request, Response
from pykcm.util.log import get_logger, set_verbosity

log = get_logger("server")

FLAGS_PATH = "/debug/flags"
VERBOSITY_PATH = "/debug/flags/v"
_UINT32_MAX, _INT32_MAX = 2**32 - 1, 2**31 - 1

# component-base's index of the flags it lets one set, byte for byte.
_INDEX = b"""<html>
<head>
<title>/debug/flags/</title>
</head>
<body>
/debug/flags/<br>
<br>
flags:<br>
<table>
<tr>v<br>
</table>
<br>
full flags configurable<br>
</body>
</html>
"""


def is_debug_flags_path(path: str) -> bool:
    return path == FLAGS_PATH or path.startswith(FLAGS_PATH + "/")


async def serve(request: Request) -> Response:
    """The index for any path under /debug/flags but /debug/flags/v, which takes a PUT only."""
    if request.path != VERBOSITY_PATH:
        return Response(200, _INDEX, {"Content-Type": "text/html; charset=utf-8"})
    if request.method != "PUT":
        return _plain(406, "unsupported http method")
    value = request.body.decode("utf-8", "replace")
    try:
        verbosity = parse_verbosity(value)
    except ValueError as err:
        return _plain(400, str(err))
    set_verbosity(verbosity)
    log.info("Log verbosity changed", verbosity=verbosity)  # not `v`: the JSON line's own "v" is its level
    return _plain(200, f"successfully set klog.logging.verbosity to {value}")


def parse_verbosity(value: str) -> int:
    """klog's -v from a request body, with component-base's errors (ParseUint, then klog.Level.Set)."""
    quoted = orjson.dumps(value).decode()
    if not value.isascii() or not value.isdigit():
        raise ValueError(f"strconv.ParseUint: parsing {quoted}: invalid syntax")
    verbosity = int(value)
    if verbosity > _UINT32_MAX:
        raise ValueError(f"strconv.ParseUint: parsing {quoted}: value out of range")
    if verbosity > _INT32_MAX:
        raise ValueError(f"failed set klog.logging.verbosity {value}: strconv.ParseInt: parsing {quoted}: "
                         "value out of range")
    return verbosity


def _plain(status: int, text: str) -> Response:
    return Response(status, f"{text}\n".encode(), {"Content-Type": "text/plain", "X-Content-Type-Options": "nosniff"})
