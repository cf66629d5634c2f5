"""Unit tests for the KCM number and duration flags pykcm acts on: read as pflag reads them (Go's strconv),
refused in KCM's words whatever typer's version, handed to typer in decimal; and the checks of
--logging-format and of the booleans' `=value` form."""

from __future__ import annotations

import math

import pytest

from pykcm.app import cli, kcmflags
from pykcm.app.options import Options

# What the built KCM v1.36.3 says of each, after "Error: " (or, for --logging-format, its "command failed" err).
BAD_VALUES = [
    (["--concurrent-replicaset-syncs=abc"],
     'invalid argument "abc" for "--concurrent-replicaset-syncs" flag: strconv.ParseInt: parsing "abc": '
     "invalid syntax"),
    (["--concurrent-namespace-syncs", "abc"],
     'invalid argument "abc" for "--concurrent-namespace-syncs" flag: strconv.ParseInt: parsing "abc": '
     "invalid syntax"),
    (["--kube-api-qps=abc"],
     'invalid argument "abc" for "--kube-api-qps" flag: strconv.ParseFloat: parsing "abc": invalid syntax'),
    (["--kube-api-qps="],
     'invalid argument "" for "--kube-api-qps" flag: strconv.ParseFloat: parsing "": invalid syntax'),
    (["--kube-api-burst=0x1_0g"],
     'invalid argument "0x1_0g" for "--kube-api-burst" flag: strconv.ParseInt: parsing "0x1_0g": invalid syntax'),
    (["--kube-api-burst=99999999999"],
     'invalid argument "99999999999" for "--kube-api-burst" flag: strconv.ParseInt: parsing "99999999999": '
     "value out of range"),
    (["--secure-port=abc"],
     'invalid argument "abc" for "--secure-port" flag: strconv.ParseInt: parsing "abc": invalid syntax'),
    (["--secure-port=99999999999999999999"],  # a Go int: 64 bits
     'invalid argument "99999999999999999999" for "--secure-port" flag: strconv.ParseInt: parsing '
     '"99999999999999999999": value out of range'),
    (["--secure-port=1", "--secure-port=x"],  # each one is parsed
     'invalid argument "x" for "--secure-port" flag: strconv.ParseInt: parsing "x": invalid syntax'),
    (["-v=abc"], 'invalid argument "abc" for "-v, --v" flag: strconv.ParseUint: parsing "abc": invalid syntax'),
    (["-v=0x2"], 'invalid argument "0x2" for "-v, --v" flag: strconv.ParseUint: parsing "0x2": invalid syntax'),
    (["--v=abc"], 'invalid argument "abc" for "-v, --v" flag: strconv.ParseUint: parsing "abc": invalid syntax'),
    (["-vabc"], 'invalid argument "abc" for "-v, --v" flag: strconv.ParseUint: parsing "abc": invalid syntax'),
    (["-v="], 'invalid argument "=" for "-v, --v" flag: strconv.ParseUint: parsing "=": invalid syntax'),
    (["-v", ""], 'invalid argument "" for "-v, --v" flag: strconv.ParseUint: parsing "": invalid syntax'),
    (["-v=+1"], 'invalid argument "+1" for "-v, --v" flag: strconv.ParseUint: parsing "+1": invalid syntax'),
    (["-v=99999999999"],
     'invalid argument "99999999999" for "-v, --v" flag: strconv.ParseUint: parsing "99999999999": value out of range'),
    (["--namespace-sync-period=abc"],
     'invalid argument "abc" for "--namespace-sync-period" flag: time: invalid duration "abc"'),
    (["--min-resync-period", "5"],
     'invalid argument "5" for "--min-resync-period" flag: time: missing unit in duration "5"'),
    (["--controller-shutdown-timeout=1x"],
     'invalid argument "1x" for "--controller-shutdown-timeout" flag: time: unknown unit "x" in duration "1x"'),
    (["--leader-elect-renew-deadline="],
     'invalid argument "" for "--leader-elect-renew-deadline" flag: time: invalid duration ""'),
    (["--leader-elect-retry-period=abc"],
     'invalid argument "abc" for "--leader-elect-retry-period" flag: time: invalid duration "abc"'),
    (["--kube-api-qps"], "flag needs an argument: --kube-api-qps"),
    (["--secure-port"], "flag needs an argument: --secure-port"),
    (["-v"], "flag needs an argument: 'v' in -v"),
    (["--v"], "flag needs an argument: --v"),
    (["--leader-elect=maybe"],  # and the booleans pykcm acts on
     'invalid argument "maybe" for "--leader-elect" flag: strconv.ParseBool: parsing "maybe": invalid syntax'),
    (["--profiling="], 'invalid argument "" for "--profiling" flag: strconv.ParseBool: parsing "": invalid syntax'),
    (["--version=maybe"],
     'invalid argument "maybe" for "--version" flag: strconv.ParseBool: parsing "maybe": invalid syntax'),
    (["--logging-format=xml"], 'format: Invalid value: "xml": Unsupported log format'),
    (["--logging-format", "JSON"], 'format: Invalid value: "JSON": Unsupported log format'),
    (["--logging-format="], 'format: Invalid value: "": Unsupported log format'),
    (["--logging-format=xml", "--secure-port=abc"],  # KCM checks the format once the flags parse
     'invalid argument "abc" for "--secure-port" flag: strconv.ParseInt: parsing "abc": invalid syntax'),
    (["--secure-port=abc", "--leader-elect=maybe"],  # pflag stops at the first bad flag, whatever its type
     'invalid argument "abc" for "--secure-port" flag: strconv.ParseInt: parsing "abc": invalid syntax'),
    (["--leader-elect=maybe", "--secure-port=abc"],
     'invalid argument "maybe" for "--leader-elect" flag: strconv.ParseBool: parsing "maybe": invalid syntax'),
]


@pytest.mark.parametrize(("argv", "message"), BAD_VALUES)
def test_a_bad_value_is_refused_in_kcms_words(argv: list[str], message: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", *argv]) == 2
    assert capsys.readouterr().err.splitlines() == [f"pykcm: error: {message}"]


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Options, int]]:
    """What `run` would start with: its options and -v."""
    runs: list[tuple[Options, int]] = []
    verbosity: list[int] = []
    monkeypatch.setattr(cli.logging_setup, "setup", lambda level, *_: verbosity.append(level))
    monkeypatch.setattr(cli, "_run_manager",
                        lambda options, classes, watch=None: runs.append((options, verbosity[-1])))
    return runs


def test_go_number_forms_give_kcms_numbers(started: list[tuple[Options, int]]) -> None:
    # The built KCM v1.36.3 logs these values (FLAG: lines at -v=1): 32, 8, 1000, 16, 15, 10.
    assert cli.main(["run", "--concurrent-replicaset-syncs=0x20", "--concurrent-namespace-syncs", "010",
                     "--kube-api-burst=1_000", "--kube-api-qps=0x1p4", "--secure-port=0o17", "-v=010"]) == 0
    options, verbosity = started[0]
    assert (options.concurrent_replicaset_syncs, options.concurrent_namespace_syncs) == (32, 8)
    assert (options.kube_api_burst, options.kube_api_qps, options.secure_port, verbosity) == (1000, 16.0, 15, 10)


def test_more_go_number_forms(started: list[tuple[Options, int]]) -> None:
    # KCM: 7, -16 (with a negative QPS: no client-side limit), -1050, 10, -v 7.
    assert cli.main(["run", "--concurrent-replicaset-syncs=+7", "--kube-api-burst", "-0x10",
                     "--kube-api-qps=-1_0.5e2", "--secure-port=0b1010", "-v", "0007"]) == 0
    options, verbosity = started[0]
    assert (options.concurrent_replicaset_syncs, options.kube_api_burst, options.kube_api_qps) == (7, -16, -1050.0)
    assert (options.secure_port, verbosity) == (10, 7)
    assert cli.main(["run", "--kube-api-qps=1e3", "-v4"]) == 0
    assert (started[1][0].kube_api_qps, started[1][1]) == (1000.0, 4)


@pytest.mark.parametrize(("argv", "kept"), [
    (["--kube-api-burst=0x20"], ["--kube-api-burst=32"]),
    (["--concurrent-namespace-syncs", "010"], ["--concurrent-namespace-syncs=8"]),
    (["--kube-api-qps", "1e3"], ["--kube-api-qps=1000.0"]),
    (["--kube-api-qps=-Inf"], ["--kube-api-qps=-inf"]),
    (["--secure-port=-0"], ["--secure-port=0"]),
    (["-v=010", "--v", "3", "-v2"], ["-v", "10", "--v=3", "-v", "2"]),
    (["--min-resync-period", "1h30m"], ["--min-resync-period=1h30m"]),  # a duration as given: typer's is a str
])
def test_typer_gets_the_number_in_decimal(argv: list[str], kept: list[str]) -> None:
    assert kcmflags.split_kcm_flags(["run", *argv]) == (["run", *kept], kcmflags.KcmFlags())


def test_pykcms_own_ranges_stay(capsys: pytest.CaptureFixture[str]) -> None:
    # KCM would start with these; pykcm refuses them on purpose, after reading them as KCM does.
    assert cli.main(["run", "--concurrent-replicaset-syncs=0x0"]) == 2
    assert "--concurrent-replicaset-syncs" in capsys.readouterr().err
    assert cli.main(["run", "--secure-port=0x10000"]) == 2
    assert "--secure-port 65536 must be between 0 (disabled) and 65535" in capsys.readouterr().err


# Go 1.26's strconv.ParseInt(s, 0, 32), ParseUint(s, 10, 31) and ParseFloat(s, 32/64) of each text, by a
# Go program; an int is the value, a str the error after `strconv.ParseX: parsing "text": `.
@pytest.mark.parametrize(("text", "int32", "uint31"), [
    ("0x20", 32, "invalid syntax"), ("010", 8, 10), ("0o17", 15, "invalid syntax"), ("0B101", 5, "invalid syntax"),
    ("0_7", 7, "invalid syntax"), ("1_000", 1000, "invalid syntax"), ("0x_1f", 31, "invalid syntax"),
    ("_1", "invalid syntax", "invalid syntax"), ("1_", "invalid syntax", "invalid syntax"),
    ("1__0", "invalid syntax", "invalid syntax"), ("0x", "invalid syntax", "invalid syntax"),
    ("08", "invalid syntax", 8), ("-0x80000000", -2147483648, "invalid syntax"),
    ("0x80000000", "value out of range", "invalid syntax"), ("2147483648", "value out of range", "value out of range"),
    ("2147483647", 2147483647, 2147483647), ("-2147483649", "value out of range", "invalid syntax"),
    ("5000000000x", "value out of range", "value out of range"),  # Go's loop overflows before it sees the x
    ("3000000000x", "invalid syntax", "value out of range"), ("\u0661\u0662", "invalid syntax", "invalid syntax"),
    (" 5", "invalid syntax", "invalid syntax"), ("", "invalid syntax", "invalid syntax"),
    ("+", "invalid syntax", "invalid syntax"), ("++1", "invalid syntax", "invalid syntax"),
])
def test_go_int_and_go_uint_are_gos_strconv(text: str, int32: int | str, uint31: int | str) -> None:
    for parse, bits, func, expected in ((kcmflags.go_int, 32, "ParseInt", int32),
                                        (kcmflags.go_uint, 31, "ParseUint", uint31)):
        if isinstance(expected, int):
            assert parse(text, bits) == expected
        else:
            with pytest.raises(ValueError) as err:
                parse(text, bits)
            assert str(err.value) == f'strconv.{func}: parsing "{text}": {expected}'


@pytest.mark.parametrize(("text", "float32", "float64"), [
    ("1e3", 1000.0, 1000.0), ("0x1p4", 16.0, 16.0), ("0X1.8P1", 3.0, 3.0), ("0x.8p1", 1.0, 1.0),
    ("0x_1p0", 1.0, 1.0), ("1_0.5", 10.5, 10.5), (".5", 0.5, 0.5), ("5.", 5.0, 5.0), ("1e1_0", 1e10, 1e10),
    ("-Inf", -math.inf, -math.inf), ("+Infinity", math.inf, math.inf), ("1e-400", 0.0, 0.0),
    ("0x1", "invalid syntax", "invalid syntax"), ("0x1p", "invalid syntax", "invalid syntax"),
    ("0x1_p0", "invalid syntax", "invalid syntax"), ("1_.5", "invalid syntax", "invalid syntax"),
    ("1e_5", "invalid syntax", "invalid syntax"), ("1e", "invalid syntax", "invalid syntax"),
    ("+nan", "invalid syntax", "invalid syntax"), ("infin", "invalid syntax", "invalid syntax"),
    ("\u0661", "invalid syntax", "invalid syntax"), (".", "invalid syntax", "invalid syntax"),
    ("1e39", "value out of range", 1e39), ("0x1p128", "value out of range", 2.0**128),
    ("0x1.ffffffp127", "value out of range", 3.4028235677973366e38),  # the midpoint rounds to even: up
    ("3.4028235677973366e38", 3.4028234663852886e38, 3.4028235677973366e38),  # just below it: the largest float32
    ("1e400", "value out of range", "value out of range"), ("0x1p1024", "value out of range", "value out of range"),
])
def test_go_float_is_gos_strconv(text: str, float32: float | str, float64: float | str) -> None:
    assert math.isnan(kcmflags.go_float("NaN", 32))
    for bits, expected in ((32, float32), (64, float64)):
        if isinstance(expected, float):
            assert kcmflags.go_float(text, bits) == expected
        else:
            with pytest.raises(ValueError) as err:
                kcmflags.go_float(text, bits)
            assert str(err.value) == f'strconv.ParseFloat: parsing "{text}": {expected}'
