"""Unit tests for how `pykcm run` reads flag names and values in pflag's order: component-base's
WordSepNormalizeFunc (`_` in a long flag's name is `-`), and the values pflag's Set reads as it meets
them (--bind-address's IP, the string slices' CSV). The expected errors are KCM v1.36.3's for the same line."""

from __future__ import annotations

import re

import pytest

from pykcm.app import cli, kcmflags
from pykcm.app.options import Options
from pykcm.app.pflagvalues import go_csv_record, go_ip


def _runs(monkeypatch: pytest.MonkeyPatch) -> list[Options]:
    runs: list[Options] = []
    monkeypatch.setattr(cli.logging_setup, "setup", lambda *_: None)
    monkeypatch.setattr(cli, "_run_manager", lambda options, classes, watch=None: runs.append(options))
    return runs


def test_an_underscore_in_a_kcm_flags_name_is_a_dash_and_its_value_is_kept() -> None:
    kept, found = kcmflags.split_kcm_flags(
        ["run", "--concurrent_gc_syncs=5", "--cluster_name", "a_b", "--allocate_node_cidrs", "--", "--cluster_cidr"])
    assert found.ignored == ["--concurrent-gc-syncs", "--cluster-name", "--allocate-node-cidrs"]
    assert kept == ["run", "--", "--cluster_cidr"]  # after `--`, words are arguments


def test_an_underscore_in_pykcms_own_options_is_a_dash(monkeypatch: pytest.MonkeyPatch) -> None:
    runs = _runs(monkeypatch)
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


def test_the_values_read_are_the_ones_run_gets(monkeypatch: pytest.MonkeyPatch) -> None:
    runs = _runs(monkeypatch)
    assert cli.main(["run", "--bind-address= ::ffff:127.0.0.1 ", '--controllers="replicaset",namespace',
                     "--controllers", '"-serviceaccount-token"']) == 0
    assert runs[0].bind_address == "127.0.0.1" and runs[0].flagz["bind-address"] == "127.0.0.1"
    assert runs[0].controllers == ["replicaset-controller", "namespace-controller", "-serviceaccount-token-controller"]


@pytest.mark.parametrize("value", ["--leader-elect=false", "--controllers=a", "--version=raw"])
def test_a_value_options_next_word_is_its_value_whatever_it_looks_like(
        monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    runs = _runs(monkeypatch)  # pflag's value flag takes the next word as it is: KCM reads this file name
    assert cli.main(["run", "--kubeconfig", value, "--controllers=replicaset"]) == 0
    assert (runs[0].kubeconfig, runs[0].leader_elect, len(runs[0].controllers)) == (value, True, 1)
