"""Unit tests for how `pykcm run` reads flag names and values in pflag's order: component-base's
WordSepNormalizeFunc (`_` in a long flag's name is `-`), and the values pflag's Set reads as it meets
them (--bind-address's IP, the string slices' CSV). The expected errors are KCM v1.36.3's for the same line."""

from __future__ import annotations

import re

import pytest

from pykcm.app import cli, kcmflags
from pykcm.app.options import Options
from pykcm.app.pflagvalues import go_csv_record, go_ip
from pykcm.util.log import go_quote


def test_an_underscore_in_a_kcm_flags_name_is_a_dash_and_its_value_is_kept() -> None:
    kept, found = kcmflags.split_kcm_flags(
        ["run", "--concurrent_gc_syncs=5", "--cluster_name", "a_b", "--allocate_node_cidrs", "--", "--cluster_cidr"])
    assert found.ignored == ["--concurrent-gc-syncs", "--cluster-name", "--allocate-node-cidrs"]
    assert kept == ["run", "--", "--cluster_cidr"]  # after `--`, words are arguments


def test_an_underscore_in_pykcms_own_options_is_a_dash(started_options: list[Options]) -> None:
    runs = started_options
    assert cli.main(["run", "--concurrent_replicaset_syncs=3", "--kube_api_qps", "7", "--leader_elect=false",
                     "--leader_elect_resource_name=a_b", "--kubeconfig", "--not_a_flag", "--v=2"]) == 0
    options = runs[0]
    assert (options.concurrent_replicaset_syncs, options.kube_api_qps, options.leader_elect) == (3, 7.0, False)
    assert (options.leader_elect_resource_name, options.kubeconfig) == ("a_b", "--not_a_flag")


@pytest.mark.parametrize(("argv", "kcm_error"), [
    # pflag names a flag by its normalized name where it has read it, and as given where it has not.
    (["--concurrent_gc_syncs=x"],
     'invalid argument "x" for "--concurrent-gc-syncs" flag: strconv.ParseInt: parsing "x": invalid syntax'),
    (["--concurrent_gc_syncs"], "flag needs an argument: --concurrent_gc_syncs"),
    (["--bind_address"], "flag needs an argument: --bind_address"),
    (["--foo_bar"], "unknown flag: --foo_bar"),
    (["--concurrent__gc-syncs=1"], "unknown flag: --concurrent__gc-syncs"),
    (["--_concurrent-gc-syncs=1"], "unknown flag: --_concurrent-gc-syncs"),
    (["--he_lp"], "unknown flag: --he_lp"),
    (["--vmodule_=x", "--bind-address=bad"], "unknown flag: --vmodule_"),
    (["--leader_elect=maybe", "--foo"],
     'invalid argument "maybe" for "--leader-elect" flag: strconv.ParseBool: parsing "maybe": invalid syntax'),
    (["--leader_elect", "--foo_x"], "unknown flag: --foo_x"),
    # pflag sets each flag as it reads it: a bad value before an unknown flag is the one named.
    (["--bind-address=bad", "--foo"], 'invalid argument "bad" for "--bind-address" flag: failed to parse IP: "bad"'),
    (["--bind_address=bad", "--foo"], 'invalid argument "bad" for "--bind-address" flag: failed to parse IP: "bad"'),
    (["--bind-address", "bad", "--foo"],
     'invalid argument "bad" for "--bind-address" flag: failed to parse IP: "bad"'),
    (["--bind-address=fe80::1%eth0", "--foo"],
     'invalid argument "fe80::1%eth0" for "--bind-address" flag: failed to parse IP: "fe80::1%eth0"'),
    (["--bind-address=01.2.3.4", "--foo"],
     'invalid argument "01.2.3.4" for "--bind-address" flag: failed to parse IP: "01.2.3.4"'),
    (["--foo", "--bind-address=bad"], "unknown flag: --foo"),
    (["--controllers=a,,b", "--foo"], "unknown flag: --foo"),  # KCM checks the names once the flags parse
    (['--controllers="a', "--foo"], 'invalid argument "\\"a" for "--controllers" flag: parse error on line 1, '
                                    'column 3: extraneous or missing " in quoted-field'),
    (['--controllers=a"b', "--foo"],
     'invalid argument "a\\"b" for "--controllers" flag: parse error on line 1, column 2: bare " in non-quoted-field'),
    (["--controllers=a", '--controllers="b', "--foo"],  # each repeat is read as given, not joined
     'invalid argument "\\"b" for "--controllers" flag: parse error on line 1, column 3: extraneous or missing " '
     "in quoted-field"),
    (["--controllers=a", "--foo", '--controllers="b'], "unknown flag: --foo"),
    (['--tls-cipher-suites="a', "--foo"], 'invalid argument "\\"a" for "--tls-cipher-suites" flag: parse error on '
                                          'line 1, column 3: extraneous or missing " in quoted-field'),
    (['--authorization_always_allow_paths="a', "--foo"],
     'invalid argument "\\"a" for "--authorization-always-allow-paths" flag: parse error on line 1, column 3: '
     'extraneous or missing " in quoted-field'),
    # cobra: help is a boolean flag; arguments are refused after the flags parse, unless help is asked.
    (["--help=maybe", "--foo"],
     'invalid argument "maybe" for "-h, --help" flag: strconv.ParseBool: parsing "maybe": invalid syntax'),
    (["-h=maybe"],
     'invalid argument "maybe" for "-h, --help" flag: strconv.ParseBool: parsing "maybe": invalid syntax'),
    (["--help=false", "--foo"], "unknown flag: --foo"),
    (["-h=false", "--foo"], "unknown flag: --foo"),
    (["--help=1", "--foo"], "unknown flag: --foo"),
    (["", "--foo"], "unknown flag: --foo"),
    (["foo", "bar", "--foo"], "unknown flag: --foo"),
    (["foo", "--bind-address=bad"], 'invalid argument "bad" for "--bind-address" flag: failed to parse IP: "bad"'),
    (["foo", "", "bar"], '"pykcm run" does not take any arguments, got ["foo" "" "bar"]'),  # all named
    (["", "foo"], '"pykcm run" does not take any arguments, got ["" "foo"]'),
    (["--", "", "foo"], '"pykcm run" does not take any arguments, got ["" "foo"]'),
    (["--help", "--help=false", "foo"], '"pykcm run" does not take any arguments, got ["foo"]'),  # the last counts
    (["-h", "-h=false", "foo"], '"pykcm run" does not take any arguments, got ["foo"]'),
    # pflag reads a group of shorthands one at a time, naming an unknown one with the rest of the group.
    (["-hx"], "unknown shorthand flag: 'x' in -x"),
    (["-hv"], "flag needs an argument: 'v' in -v"),
    (["-hv", "--zzz"],
     'invalid argument "--zzz" for "-v, --v" flag: strconv.ParseUint: parsing "--zzz": invalid syntax'),
    (["-xh"], "unknown shorthand flag: 'x' in -xh"),
    (["--", "foo"], '"pykcm run" does not take any arguments, got ["foo"]'),
    (["--", "--help"], '"pykcm run" does not take any arguments, got ["--help"]'),
    (["--help=0", "foo"], '"pykcm run" does not take any arguments, got ["foo"]'),
    (["--logging-format=x", "foo"], '"pykcm run" does not take any arguments, got ["foo"]'),
])
def test_the_first_error_is_kcms(argv: list[str], kcm_error: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", *argv]) == 2
    assert capsys.readouterr().err == f"pykcm: error: {kcm_error}\n"


@pytest.mark.parametrize(("text", "error"), [  # KCM v1.36.3's --controllers with each
    ('"a\nb', 'record on line 1; parse error on line 2, column 2: extraneous or missing " in quoted-field'),
    ('"a\nb"x', 'record on line 1; parse error on line 2, column 2: extraneous or missing " in quoted-field'),
    ("\n", "EOF"),
    ('\r\n\n"a"b', 'parse error on line 3, column 3: extraneous or missing " in quoted-field'),
    ('"a""b",c"', 'parse error on line 1, column 9: bare " in non-quoted-field'),
    ('é"', 'parse error on line 1, column 3: bare " in non-quoted-field'),  # columns count bytes
])
def test_a_list_value_go_csv_refuses_is_refused_in_its_words(text: str, error: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(error)}$"):
        go_csv_record(text)


@pytest.mark.parametrize(("text", "fields"), [
    ("", []), ("a,,b", ["a", "", "b"]), ('"a,b",c', ["a,b", "c"]), ('"a""b"', ['a"b']), ("a\nb", ["a"]),
    ('"a\nb",c\nd', ["a\nb", "c"]), ("a\r", ["a"]), ("\n\na", ["a"]), ("a,", ["a", ""]),
])
def test_a_list_value_is_read_as_one_go_csv_record(text: str, fields: list[str]) -> None:
    assert go_csv_record(text) == fields


@pytest.mark.parametrize(("text", "ip"), [
    ("", ""), (" 127.0.0.1 ", "127.0.0.1"), ("::ffff:127.0.0.1", "127.0.0.1"), ("0:0::1", "::1"), ("::", "::"),
])
def test_an_ip_value_is_read_as_net_parse_ip_reads_it(text: str, ip: str) -> None:
    assert go_ip(text) == ip


def test_the_values_read_are_the_ones_run_gets(started_options: list[Options]) -> None:
    runs = started_options
    assert cli.main(["run", "--bind-address= ::ffff:127.0.0.1 ", '--controllers="replicaset",namespace',
                     "--controllers", '"-serviceaccount-token"']) == 0
    assert runs[0].bind_address == "127.0.0.1" and runs[0].flagz["bind-address"] == "127.0.0.1"
    assert runs[0].controllers == ["replicaset-controller", "namespace-controller", "-serviceaccount-token-controller"]


@pytest.mark.parametrize("value", ["--leader-elect=false", "--controllers=a", "--version=raw"])
def test_a_value_options_next_word_is_its_value_whatever_it_looks_like(
        started_options: list[Options], value: str) -> None:
    runs = started_options  # pflag's value flag takes the next word as it is: KCM reads this file name
    assert cli.main(["run", "--kubeconfig", value, "--controllers=replicaset"]) == 0
    assert (runs[0].kubeconfig, runs[0].leader_elect, len(runs[0].controllers)) == (value, True, 1)


_QUANTITY_FORMAT = "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
_QUANTITY_SUFFIX, _QUANTITY_NUMBER = "unable to parse quantity's suffix", "unable to parse numeric part of quantity"
_CSV_QUOTE = 'parse error on line 1, column 3: extraneous or missing " in quoted-field'


@pytest.mark.parametrize(("flag", "value", "kcm_reason"), [  # KCM v1.36.3 with `--flag=value --foo`: its error
    # component-base's vmodule: comma-separated pattern=N, N a strconv.ParseUint(N, 10, 31)
    ("--vmodule", "bad", '"bad" does not have the pattern=N format'),
    ("--vmodule", "a=x", 'parsing verbosity in "a=x": strconv.ParseUint: parsing "x": invalid syntax'),
    ("--vmodule", "=1", '"=1" does not have the pattern=N format'),
    ("--vmodule", "a=", '"a=" does not have the pattern=N format'),
    ("--vmodule", "a=1=2", '"a=1=2" does not have the pattern=N format'),
    ("--vmodule", "a=2147483648",
     'parsing verbosity in "a=2147483648": strconv.ParseUint: parsing "2147483648": value out of range'),
    ("--vmodule", "a=-1", 'parsing verbosity in "a=-1": strconv.ParseUint: parsing "-1": invalid syntax'),
    ("--vmodule", "a= 1", 'parsing verbosity in "a= 1": strconv.ParseUint: parsing " 1": invalid syntax'),
    ("--vmodule", "a=1,bad", '"bad" does not have the pattern=N format'),
    ("--vmodule", "a=1,,b=2", None), ("--vmodule", "", None), ("--vmodule", " a=1", None),
    # apiserver's NamedCertKey: "cert,key" or "cert,key:name,name"
    ("--tls-sni-cert-key", "a", "expected comma separated certificate and key file paths"),
    ("--tls-sni-cert-key", "", "expected comma separated certificate and key file paths"),
    ("--tls-sni-cert-key", "a,b,c", "expected comma separated certificate and key file paths"),
    ("--tls-sni-cert-key", "a:b", "expected comma separated certificate and key file paths"),
    ("--tls-sni-cert-key", "a,b:", "empty names list is not allowed"),
    ("--tls-sni-cert-key", "a,b: ", "empty names list is not allowed"),
    ("--tls-sni-cert-key", "a,b", None), ("--tls-sni-cert-key", "a,b:x,y", None),
    ("--tls-sni-cert-key", "a,b:x:y", None), ("--tls-sni-cert-key", "a,b:,", None),
    # pflag's stringToString: one key=value as it is, more read as one CSV record
    ("--allow-metric-labels", "bad", "bad must be formatted as key=value"),
    ("--allow-metric-labels", "", " must be formatted as key=value"),
    ("--allow-metric-labels", 'a=1,"b=2', 'parse error on line 1, column 9: extraneous or missing " in quoted-field'),
    ("--allow-metric-labels", 'a=1,b=2"', 'parse error on line 1, column 8: bare " in non-quoted-field'),
    ("--allow-metric-labels", "a=1,\nb=2", " must be formatted as key=value"),
    ("--allow-metric-labels", "a=1", None), ("--allow-metric-labels", '"a=1"', None),
    ("--allow-metric-labels", "a=1,b", None), ("--allow-metric-labels", "x,y=a,b", None),
    ("--allow-metric-labels", "=", None), ("--allow-metric-labels", "a=1,=2", None),
    # apimachinery's resource.Quantity
    ("--log-text-info-buffer-size", "bad", _QUANTITY_FORMAT), ("--log-text-info-buffer-size", "", _QUANTITY_FORMAT),
    ("--log-json-info-buffer-size", "bad", _QUANTITY_FORMAT), ("--log-text-info-buffer-size", "1x", _QUANTITY_FORMAT),
    ("--log-text-info-buffer-size", " 1", _QUANTITY_FORMAT), ("--log-text-info-buffer-size", "1 ", _QUANTITY_FORMAT),
    ("--log-text-info-buffer-size", "1.2.3", _QUANTITY_FORMAT),
    ("--log-text-info-buffer-size", "0x10", _QUANTITY_FORMAT),
    ("--log-text-info-buffer-size", "1_000", _QUANTITY_FORMAT), ("--log-json-info-buffer-size", "..", _QUANTITY_FORMAT),
    ("--log-text-info-buffer-size", "1KK", _QUANTITY_SUFFIX), ("--log-text-info-buffer-size", "1e", _QUANTITY_SUFFIX),
    ("--log-text-info-buffer-size", "1e-", _QUANTITY_SUFFIX), ("--log-text-info-buffer-size", "1ei3", _QUANTITY_SUFFIX),
    ("--log-text-info-buffer-size", "1k+1", _QUANTITY_SUFFIX),
    ("--log-text-info-buffer-size", "1e99999999999999999999", _QUANTITY_SUFFIX),
    ("--log-json-info-buffer-size", "1e9223372036854775808", _QUANTITY_SUFFIX),
    # no digit where Go takes its slow path (inf.Dec's SetString): 2^50 and up, or a scale under nano
    ("--log-text-info-buffer-size", "Pi", _QUANTITY_NUMBER), ("--log-text-info-buffer-size", "Ei", _QUANTITY_NUMBER),
    ("--log-text-info-buffer-size", "-Ei", _QUANTITY_NUMBER), ("--log-json-info-buffer-size", "-.Pi", _QUANTITY_NUMBER),
    ("--log-text-info-buffer-size", "e-10", _QUANTITY_NUMBER),
    ("--log-text-info-buffer-size", ".e-10", _QUANTITY_NUMBER),
    ("--log-json-info-buffer-size", "E-10", _QUANTITY_NUMBER),
    ("--log-json-info-buffer-size", "e4294967286", _QUANTITY_NUMBER),  # an int32 exponent: -10
    ("--log-json-info-buffer-size", "e" + "0" * 30 + "4294967286", _QUANTITY_NUMBER),  # leading zeros read
    *(("--log-text-info-buffer-size", good, None) for good in (
        "1", "1Ki", "1.5Ki", ".", "-", "+", "Ki", "1Ei", "0e-10", ".n", "1e3", "1e-3", "1E", "1m", "1.0n", "1e-10",
        "12345678901234567890", "1.Ki", "e-9", ".5e-9", "+Ti", "1e+3", "e-9223372036854775808", "e4294967296",
        "00.e-10", "0Pi", "1e-00000000000000000000000001")),
    # pflag's string slices: one CSV record
    *((flag, '"a', _CSV_QUOTE) for flag in (
        "--disabled-metrics", "--emulated-version", "--min-compatibility-version", "--requestheader-allowed-names",
        "--requestheader-extra-headers-prefix", "--requestheader-group-headers", "--requestheader-uid-headers",
        "--requestheader-username-headers")),
    ("--disabled-metrics", "a", None), ("--emulated-version", "bad", None),  # versions are checked later
    # pflag's int32Slice: strconv.ParseInt(each, 0, 32); a good one is refused by pykcm after the flags
    ("--tls-curve-preferences", "x", 'strconv.ParseInt: parsing "x": invalid syntax'),
    ("--tls-curve-preferences", "", 'strconv.ParseInt: parsing "": invalid syntax'),
    ("--tls-curve-preferences", "1,x", 'strconv.ParseInt: parsing "x": invalid syntax'),
    ("--tls-curve-preferences", "1, 2", 'strconv.ParseInt: parsing " 2": invalid syntax'),
    ("--tls-curve-preferences", "4294967296", 'strconv.ParseInt: parsing "4294967296": value out of range'),
    # values KCM's Set does not check: the feature gates (after the flags), strings checked later
    *((flag, value, None) for flag, value in (
        ("--feature-gates", "foo"), ("--feature-gates", ""), ("--feature-gates", ":"), ("--feature-gates", ",,"),
        ("--show-hidden-metrics-for-version", "bad"), ("--logging-format", "bad"), ("--tls-min-version", "bad"),
        ("--cluster-cidr", "bad"), ("--service-cluster-ip-range", "bad"), ("--cidr-allocator-type", "bad"),
        ("--leader-elect-resource-lock", "bad"), ("--kube-api-content-type", "bad"))),
])
def test_a_kcm_flags_value_is_refused_where_kcm_refuses_it(
        flag: str, value: str, kcm_reason: str | None, capsys: pytest.CaptureFixture[str]) -> None:
    kcm_error = f"invalid argument {go_quote(value)} for {go_quote(flag)} flag: {kcm_reason}" if kcm_reason else (
        "unknown flag: --foo")
    assert cli.main(["run", f"{flag}={value}", "--foo"]) == 2
    assert capsys.readouterr().err == f"pykcm: error: {kcm_error}\n"


@pytest.mark.parametrize(("argv", "kcm_error"), [  # KCM v1.36.3 with each, then `--foo`
    (["--vmodule", "a=x"], 'invalid argument "a=x" for "--vmodule" flag: parsing verbosity in "a=x": '
                           'strconv.ParseUint: parsing "x": invalid syntax'),
    (["--vmodule=a=1", "--vmodule=a=x"], 'invalid argument "a=x" for "--vmodule" flag: parsing verbosity in "a=x": '
                                         'strconv.ParseUint: parsing "x": invalid syntax'),
    (["--log_text_info_buffer_size=x"],
     f'invalid argument "x" for "--log-text-info-buffer-size" flag: {_QUANTITY_FORMAT}'),
    (["--tls_sni_cert_key", "a"],
     'invalid argument "a" for "--tls-sni-cert-key" flag: expected comma separated certificate and key file paths'),
    (["--allow-metric-labels=a=1", "--allow-metric-labels=b"],
     'invalid argument "b" for "--allow-metric-labels" flag: b must be formatted as key=value'),
])
def test_each_ignored_value_is_read_where_it_stands(
        argv: list[str], kcm_error: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", *argv, "--foo"]) == 2
    assert capsys.readouterr().err == f"pykcm: error: {kcm_error}\n"


def test_good_values_of_the_flags_pykcm_ignores_are_ignored() -> None:
    kept, found = kcmflags.split_kcm_flags(["run", "--vmodule=a=1", "--tls-sni-cert-key", "a,b:x",
                                            "--allow-metric-labels", "a=1", "--log-text-info-buffer-size=1Ki",
                                            "--disabled-metrics=a,b"])
    assert kept == ["run"]
    assert found.ignored == ["--vmodule", "--tls-sni-cert-key", "--allow-metric-labels", "--log-text-info-buffer-size",
                             "--disabled-metrics"]


@pytest.mark.parametrize("argv", [["--help=true"], ["-h=1"], ["foo", "--help"], ["--help", "foo"], ["-hv4"], ["-hh"],
                                  ["--logging-format=xml", "--help"], ["-hv4", "--logging-format=xml"],
                                  ["--tls-curve-preferences=1", "--help"], ["--help=false", "--help"]])
def test_help_asked_by_a_true_value_or_beside_arguments_is_help(
        argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", *argv]) == 0  # the built KCM prints its help for each
    assert "--kubeconfig" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["--help=false"], ["-h=f"], [""], ["--", ""], ["--help", "--help=false"]])
def test_no_help_and_empty_arguments_run(started_options: list[Options], argv: list[str]) -> None:
    runs = started_options
    assert cli.main(["run", *argv]) == 0
    assert len(runs) == 1


def test_an_empty_bind_address_leaves_the_one_before(started_options: list[Options]) -> None:
    runs = started_options  # pflag's IP flag: Set("") changes nothing
    assert cli.main(["run", "--bind-address=1.2.3.4", "--bind-address="]) == 0
    assert cli.main(["run", "--bind-address", ""]) == 0
    assert [options.bind_address for options in runs] == ["1.2.3.4", "0.0.0.0"]
