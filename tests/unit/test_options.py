"""Unit tests for pykcm.app.options and the flag handling in pykcm.app.cli: duration flags, --controllers,
leader-election and serving flags, KCM's `--flag=false` form."""

from __future__ import annotations

import dataclasses
import socket

import pytest

from pykcm.app import cli, kcmflags
from pykcm.app.options import ControllerInfo, Options, OptionsError, parse_bool, resolve_controllers

KNOWN = [
    ControllerInfo("serviceaccount-token-controller", ("serviceaccount-token",)),
    ControllerInfo("namespace-controller", ("namespace",)),
    ControllerInfo("replicaset-controller", ("replicaset",)),
    ControllerInfo("bootstrap-signer-controller", ("bootstrapsigner",), enabled_by_default=False),
]


@pytest.mark.parametrize(
    ("spec", "enabled"),
    [
        (["*"], ["serviceaccount-token-controller", "namespace-controller", "replicaset-controller"]),
        (["*", "-replicaset-controller"], ["serviceaccount-token-controller", "namespace-controller"]),
        (["*", "-replicaset"], ["serviceaccount-token-controller", "namespace-controller"]),  # alias
        (["replicaset"], ["replicaset-controller"]),
        (["-namespace", "namespace"], []),  # first match wins: namespace stays disabled
        (["namespace", "-namespace"], ["namespace-controller"]),
        (["-replicaset", "*"], ["serviceaccount-token-controller", "namespace-controller"]),
        (["*", "-namespace", "namespace"], ["serviceaccount-token-controller", "replicaset-controller"]),
        (["*", "bootstrapsigner"], [c.name for c in KNOWN]),  # an explicit entry beats `*` wherever it is
        (["bootstrapsigner"], ["bootstrap-signer-controller"]),
        ([], []),
    ],
)
def test_resolve_controllers_first_explicit_match_wins(spec: list[str], enabled: list[str]) -> None:
    assert resolve_controllers(spec, KNOWN) == enabled


@pytest.mark.parametrize("spec", [["nope"], ["*", "-nope"], ["-*"], ["namespace", "", "replicaset"], ["*", "-"]])
def test_resolve_controllers_rejects_unknown_names(spec: list[str]) -> None:
    with pytest.raises(OptionsError):
        resolve_controllers(spec, KNOWN)


def test_an_empty_controllers_entry_is_refused_as_kcm_refuses_it(capsys: pytest.CaptureFixture[str]) -> None:
    # KCM v1.36.3: `--controllers=namespace,,replicaset` -> "\"\" is not in the list of known controllers"
    assert cli.main(["run", "--controllers=namespace,,replicaset"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith('pykcm: error: Invalid value for --controllers: "" is not in the list')


@pytest.mark.parametrize(("text", "value"), [("true", True), ("1", True), ("T", True), ("False", False), ("0", False)])
def test_parse_bool_is_go_strconv(text: str, value: bool) -> None:
    assert parse_bool(text) is value


def test_parse_bool_rejects_other_words() -> None:
    with pytest.raises(OptionsError):
        parse_bool("yes")


def test_defaults_are_kcm_defaults() -> None:
    opts = Options()
    assert opts.leader_elect is True
    assert (opts.leader_elect_lease_duration, opts.leader_elect_renew_deadline, opts.leader_elect_retry_period) == (
        15.0, 10.0, 2.0,
    )
    assert opts.leader_elect_resource_lock == "leases"
    assert opts.leader_elect_resource_namespace == "kube-system"
    assert opts.leader_elect_resource_name == "pykcm"
    assert (opts.secure_port, opts.bind_address) == (10257, "0.0.0.0")
    assert opts.authorization_always_allow_paths == ["/healthz", "/readyz", "/livez"]
    opts.validate()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"leader_elect_lease_duration": 10.0}, "must be greater than --leader-elect-renew-deadline"),
        ({"leader_elect_renew_deadline": 2.4}, "must be greater than 1.2 x --leader-elect-retry-period"),
        ({"leader_elect_retry_period": 0.0}, "must be greater than 0"),
        ({"leader_elect_resource_lock": "endpoints"}, '"leases"'),
        ({"leader_elect_resource_lock": "configmapsleases", "leader_elect": False}, '"leases"'),
        ({"leader_elect_resource_name": ""}, "must not be empty"),
        ({"secure_port": 70000}, "--secure-port"),
        ({"secure_port": -1}, "--secure-port"),
        ({"bind_address": "localhost"}, "--bind-address"),
        ({"tls_cert_file": "/tmp/cert.pem"}, "together"),
        ({"kube_api_content_type": "application/yaml"}, "--kube-api-content-type must be application/json or"),
    ],
)
def test_validate_rejects(changes: dict, message: str) -> None:
    with pytest.raises(OptionsError, match=message.replace(".", r"\.")):
        dataclasses.replace(Options(), **changes).validate()


@pytest.mark.parametrize(("qps", "burst"), [(0.0, 0), (-1.0, 0), (-1.0, -1)])
def test_client_gos_zero_and_negative_limits_are_accepted(qps: float, burst: int) -> None:
    dataclasses.replace(Options(), kube_api_qps=qps, kube_api_burst=burst).validate()


def test_durations_are_not_checked_without_leader_election() -> None:
    dataclasses.replace(Options(), leader_elect=False, leader_elect_lease_duration=1.0).validate()


def test_renew_deadline_just_above_jittered_retry_period_is_valid() -> None:
    dataclasses.replace(Options(), leader_elect_renew_deadline=2.5, leader_elect_retry_period=2.0).validate()


@pytest.mark.parametrize(
    ("argv", "translated"),
    [
        (["run", "--leader-elect=false"], ["run", "--no-leader-elect"]),
        (["run", "--leader-elect=true"], ["run", "--leader-elect"]),
        (["run", "--leader-elect=0"], ["run", "--no-leader-elect"]),
        (["run", "--leader-elect"], ["run", "--leader-elect"]),
        (["run", "--profiling=false"], ["run", "--no-profiling"]),
        (["run", "--leader-elect-resource-name=x"], ["run", "--leader-elect-resource-name=x"]),
        (["run", "--", "--leader-elect=false"], ["run", "--", "--leader-elect=false"]),
    ],
)
def test_kcm_boolean_flag_form_is_translated(argv: list[str], translated: list[str]) -> None:
    assert kcmflags.translate_pflag_forms(argv) == translated


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run", "--leader-elect=maybe"], "--leader-elect"),
        (["run", "--leader-elect-lease-duration=15"],  # KCM v1.36.3's words, as for every KCM flag's syntax
         'invalid argument "15" for "--leader-elect-lease-duration" flag: time: missing unit in duration "15"'),
        (["run", "--leader-elect-renew-deadline=20s"], "must be greater than --leader-elect-renew-deadline"),
        (["run", "--leader-elect-resource-lock=endpoints"], '"leases"'),
        (["run", "--secure-port=99999"], "--secure-port"),
        (["run", "--controllers=nope"], "not in the list of known controllers"),
        (["run", "--kube-api-content-type=protobuf"], "--kube-api-content-type must be"),
        (["run", "--local-nodes=2"], "--local-nodes applies only with --local"),
        (["run", "--v=-1"],  # component-base's level is not negative
         'invalid argument "-1" for "-v, --v" flag: strconv.ParseUint: parsing "-1": invalid syntax'),
        (["run", "--controller-shutdown-timeout=-1s"], "--controller-shutdown-timeout must not be negative"),
        (["run", "--kube-api-burst=-1", "--kube-api-qps=0"], "--kube-api-burst must not be negative"),  # fails all
        (["run", "--kube-api-burst=0"],  # client-go's NewForConfig, as KCM says it
         "burst is required to be greater than 0 when RateLimiter is not set and QPS is set to greater than 0"),
        (["run", "--leader-elect-lease-duration=99999999999h"],  # more than Go's maximum
         'invalid argument "99999999999h" for "--leader-elect-lease-duration" flag: time: invalid duration '
         '"99999999999h"'),
        (["run", "--min-resync-period= 1h"],
         'invalid argument " 1h" for "--min-resync-period" flag: time: invalid duration " 1h"'),
        (["run", "--leader-elect-lease-duration=3000000000s"],
         "--leader-elect-lease-duration (833333h20m0s) is more than a Lease holds: its leaseDurationSeconds is an "
         "int32, at most 2147483647s"),
        (["run", "--local", "--local-nodes=100000"],
         "Invalid value for '--local-nodes': 100000 is not in the range 0<=x<=8192."),
        (["run", "--local", "--local-nodes=-1"], "Invalid value for '--local-nodes'"),
        # pflag reads left to right: an unknown flag before a malformed value is the one it names.
        (["run", "--foo", "--concurrent-replicaset-syncs=abc"], "pykcm: error: unknown flag: --foo"),
        (["run", "--concurrent-replicaset-syncs=abc", "--foo"], 'invalid argument "abc" for'),
        (["run", "-x"], "pykcm: error: unknown shorthand flag: 'x' in -x"),
        (["run", "-xyz", "-v=abc"], "pykcm: error: unknown shorthand flag: 'x' in -xyz"),
        (["run", "--kubeconfig", "--foo", "--bar"], "pykcm: error: unknown flag: --bar"),  # --foo: the file's name
        (["run", "--=x", "--concurrent-gc-syncs=abc"], "pykcm: error: bad flag syntax: --=x"),
        (["run", "---foo"], "pykcm: error: bad flag syntax: ---foo"),
        (["run", "-x=1"], "pykcm: error: unknown shorthand flag: 'x' in -x=1"),
        (["run", "--kubeconfig"], "pykcm: error: flag needs an argument: --kubeconfig"),
    ],
)
def test_bad_flags_are_usage_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("pykcm: error:") and message in err[0]


def test_an_os_error_is_one_line_with_the_path(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    # Python's own form is "[Errno 20] Not a directory: '/x'".
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    assert cli.main(["testenv", "start", "--dir", str(not_a_dir / "sub")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"pykcm: error: Not a directory: {not_a_dir / 'sub'}"


@pytest.mark.parametrize(
    ("argv", "translated"),
    [
        (["run", "--controllers=replicaset", "-v", "2", "--controllers", "namespace"],
         ["run", "--controllers=replicaset,namespace", "-v", "2"]),
        (["run", "--authorization-always-allow-paths=/a", "--authorization-always-allow-paths=/b"],
         ["run", "--authorization-always-allow-paths=/a,/b"]),
        (["run", "--controllers"], ["run", "--controllers"]),  # no value: click's error
    ],
)
def test_repeated_list_flags_are_joined_as_pflag_appends_them(argv: list[str], translated: list[str]) -> None:
    assert kcmflags.translate_pflag_forms(argv) == translated


def test_pflag_short_verbosity_with_equals_is_read_as_kcm_reads_it() -> None:
    # click would read `-v=4` as the value "=4", and `-v4` is pflag's too.
    argv = kcmflags.translate_pflag_forms(["run", "-v=4", "--v=2", "-v3"])
    assert kcmflags.split_kcm_flags(argv) == (["run", "-v", "4", "--v=2", "-v", "3"], kcmflags.KcmFlags())


def test_dash_h_and_version_work_as_kcms(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", "-h"]) == 0 and "--concurrent-replicaset-syncs" in capsys.readouterr().out
    assert cli.main(["run", "--version"]) == 0 and capsys.readouterr().out.startswith("pykcm ")


def test_kcm_flags_pykcm_does_not_act_on_are_taken_out_with_their_values() -> None:
    argv = ["run", "--allocate-node-cidrs", "--cluster-cidr", "10.244.0.0/16", "--contention-profiling=false",
            "-v", "2", "--vmodule=x=2", "--cluster-cidr=x", "--tls-curve-preferences", "23",
            "--tls-min-version", "VersionTLS13", "--", "--cluster-name"]
    kept, found = kcmflags.split_kcm_flags(argv)
    assert kept == ["run", "-v", "2", "--tls-min-version", "VersionTLS13", "--", "--cluster-name"]
    assert found.ignored == ["--allocate-node-cidrs", "--cluster-cidr", "--contention-profiling", "--vmodule"]
    assert found.refused == ["--tls-curve-preferences"]


def test_kcm_only_controllers_are_left_to_kcm() -> None:
    spec = ["*", "bootstrapsigner", "-tokencleaner", "-replicaset", "deployment-controller", "nope"]
    kept, left = kcmflags.left_to_kcm(spec, {"replicaset", "replicaset-controller", "namespace"})
    assert kept == ["*", "-replicaset", "nope"]  # an unknown name stays, for the usual error
    assert left == ["bootstrapsigner", "tokencleaner", "deployment-controller"]


def test_a_tls_flag_pykcm_cannot_honour_is_refused_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", "--tls-curve-preferences=23,29", "--tls-min-version", "VersionTLS13"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["pykcm: error: pykcm does not implement --tls-curve-preferences: refused, pykcm cannot honour it "
                   "and would serve other TLS than asked"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["run", "--tls-min-version=VersionTLS9"], '--tls-min-version: unknown tls version "VersionTLS9"'),
     (["run", "--tls-cipher-suites=TLS_AES_128_GCM_SHA256", "--tls-cipher-suites", "RC4"],
      "--tls-cipher-suites: Cipher suite RC4 not supported or doesn't exist")],
)
def test_bad_tls_names_are_usage_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == 2
    assert capsys.readouterr().err.strip() == f"pykcm: error: {message} (see 'pykcm run --help')"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run", "--enable-garbage-collector=maybe"],
         'invalid argument "maybe" for "--enable-garbage-collector" flag: strconv.ParseBool: parsing "maybe": '
         "invalid syntax"),
        (["run", "--allocate-node-cidrs="],
         'invalid argument "" for "--allocate-node-cidrs" flag: strconv.ParseBool: parsing "": invalid syntax'),
        (["run", "--controllers=namespace", "--vmodule"], "flag needs an argument: --vmodule"),
        (["run", "--root-ca-file"], "flag needs an argument: --root-ca-file"),
        (["run", "--tls-curve-preferences"], "flag needs an argument: --tls-curve-preferences"),
        (["run", "--log-flush-frequency=abc"],
         'invalid argument "abc" for "--log-flush-frequency" flag: time: invalid duration "abc"'),
        (["run", "--log-flush-frequency", "5"],
         'invalid argument "5" for "--log-flush-frequency" flag: time: missing unit in duration "5"'),
        (["run", "--log-flush-frequency=1h1"],
         'invalid argument "1h1" for "--log-flush-frequency" flag: time: missing unit in duration "1h1"'),
        (["run", "--log-flush-frequency=1h2x3s"],
         'invalid argument "1h2x3s" for "--log-flush-frequency" flag: time: unknown unit "x" in duration "1h2x3s"'),
        (["run", "--concurrent-gc-syncs=99999999999"],
         'invalid argument "99999999999" for "--concurrent-gc-syncs" flag: strconv.ParseInt: parsing "99999999999": '
         "value out of range"),
        (["run", "--concurrent-gc-syncs= 5"],
         'invalid argument " 5" for "--concurrent-gc-syncs" flag: strconv.ParseInt: parsing " 5": invalid syntax'),
        (["run", "--node-eviction-rate=1e39"],
         'invalid argument "1e39" for "--node-eviction-rate" flag: strconv.ParseFloat: parsing "1e39": '
         "value out of range"),
        (["run", "--horizontal-pod-autoscaler-tolerance=1e400"],
         'invalid argument "1e400" for "--horizontal-pod-autoscaler-tolerance" flag: strconv.ParseFloat: parsing '
         '"1e400": value out of range'),
        (["run", "--controllers=replicaset, namespace"],
         'Invalid value for --controllers: " namespace" is not in the list of known controllers: '),
    ],
)
def test_ignored_kcm_flags_are_refused_where_kcm_refuses_their_syntax(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # The built KCM v1.36.3's words, after "Error: ".
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"pykcm: error: {message}")


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--concurrent-gc-syncs", "010"), ("--concurrent-gc-syncs", "0x1f"), ("--concurrent-gc-syncs", "1_000"),
     ("--http2-max-streams-per-connection", "-3000000000"), ("--node-eviction-rate", "1_0.5"),
     ("--node-eviction-rate", "Inf"), ("--horizontal-pod-autoscaler-tolerance", "1e300"),
     ("--log-flush-frequency", "1h2m0.5s"), ("--cluster-name", "any text")],
)
def test_ignored_kcm_flags_take_the_values_pflag_takes(flag: str, value: str) -> None:
    # Each one checked on the built KCM v1.36.3: it starts.
    assert kcmflags.split_kcm_flags(["run", f"{flag}={value}"]) == (["run"], kcmflags.KcmFlags(ignored=[flag]))


def test_ignored_kcm_flags_take_what_pflag_takes() -> None:
    kept, found = kcmflags.split_kcm_flags(
        ["run", "--enable-garbage-collector=F", "--cluster-name", "--", "--allocate-node-cidrs", "--root-ca-file="])
    assert kept == ["run"]  # `--cluster-name --`: pflag takes the next word as the value, whatever it is
    assert found.ignored == ["--enable-garbage-collector", "--cluster-name", "--allocate-node-cidrs", "--root-ca-file"]


@pytest.mark.parametrize(
    ("argv", "translated"),
    [
        (["run", "--controllers=", "--controllers=namespace"], ["run", "--controllers=namespace"]),
        (["run", "--controllers=namespace", "--controllers="], ["run", "--controllers=namespace"]),
        (["run", "--controllers=a,,b", "--controllers=c"], ["run", "--controllers=a,,b,c"]),  # within one: kept
    ],
)
def test_an_empty_list_flag_adds_nothing_as_pflag_appends_it(argv: list[str], translated: list[str]) -> None:
    assert kcmflags.translate_pflag_forms(argv) == translated


def test_an_empty_controllers_flag_is_the_empty_list(started_options: list[Options]) -> None:
    runs = started_options
    assert cli.main(["run", "--controllers="]) == 0
    assert runs[0].controllers == []


def test_run_local_with_the_secure_port_taken_fails_before_its_cluster_starts(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from pykcm.testenv import cluster

    def no_cluster(**_: object) -> None:
        raise AssertionError("the local cluster was started")

    monkeypatch.setattr(cluster, "running", no_cluster)
    monkeypatch.setattr(cli.logging_setup, "setup", lambda *_: None)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        # --local serves on 127.0.0.1 unless told otherwise; KCM's words for a taken port.
        assert cli.main(["run", "--local", "--secure-port", str(port)]) == 1
        assert capsys.readouterr().err.strip().splitlines()[-1] == (
            f"pykcm: error: failed to listen on 127.0.0.1:{port}: address already in use")
        assert cli.main(["run", "--local", "--secure-port", str(port), "--bind-address", "::"]) == 1
        assert capsys.readouterr().err.strip().splitlines()[-1] == (
            f"pykcm: error: failed to listen on [::]:{port}: address already in use")


def test_help_says_local_serves_on_loopback(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "With --local the default is 127.0.0.1." in text
    assert "pykcm then serves on 127.0.0.1 unless" in text


@pytest.mark.parametrize(("argv", "address"), [([], "127.0.0.1"), (["--bind-address", "::1"], "::1"),
                                                (["--bind-address=0.0.0.0"], "0.0.0.0")])  # given: as given
def test_local_serves_on_loopback_and_flagz_says_so(monkeypatch: pytest.MonkeyPatch, argv: list[str],
                                                    address: str) -> None:
    seen: list[tuple[str, str]] = []
    monkeypatch.setattr(cli.localrun, "run_local",
                        lambda options, *_: seen.append((options.bind_address, options.flagz["bind-address"])))
    assert cli.main(["run", "--local", *argv]) == 0
    assert seen == [(address, address)]


def test_kcms_client_ca_and_cert_dir_flags_are_options_not_ignored(started_options: list[Options]) -> None:
    runs = started_options
    argv = ["run", "--client-ca-file=/etc/ca.crt", "--authentication-skip-lookup",
            "--authentication-tolerate-lookup-failure=true", "--cert-dir", "/var/run/kcm"]
    assert kcmflags.split_kcm_flags(argv)[1].ignored == []
    assert cli.main(argv) == 0
    opts = runs[0]
    assert (opts.client_ca_file, opts.authentication_skip_lookup, opts.authentication_tolerate_lookup_failure,
            opts.cert_dir) == ("/etc/ca.crt", True, True, "/var/run/kcm")
    assert cli.main(["run", "--authentication-skip-lookup=false"]) == 0
    assert runs[1].authentication_skip_lookup is False


@pytest.mark.parametrize("paths", ["healthz,metrics", "*", "/debug/*,", ""])
def test_always_allow_paths_as_kcms_path_authorizer_takes_them(paths: str) -> None:
    dataclasses.replace(Options(), authorization_always_allow_paths=paths.split(",")).validate()


@pytest.mark.parametrize(("paths", "bad"), [(["/foo*bar"], "foo*bar"), (["/ok", "**"], "**")])
def test_a_star_not_at_the_end_is_refused_in_path_gos_words(paths: list[str], bad: str,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(OptionsError) as err:
        dataclasses.replace(Options(), authorization_always_allow_paths=paths).validate()
    assert str(err.value) == f'only trailing * allowed in "{bad}"'
    assert cli.main(["run", f"--authorization-always-allow-paths={','.join(paths)}"]) == 2
    hint = "(see 'pykcm run --help')"
    assert capsys.readouterr().err.strip() == f'pykcm: error: only trailing * allowed in "{bad}" {hint}'


@pytest.mark.parametrize(("argv", "out"), [(["--version=true"], "pykcm "), (["--version=raw"], 'version.Info{Major:"'),
                                           (["--version"], "pykcm ")])
def test_kcms_version_values_are_taken(argv: list[str], out: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", *argv]) == 0
    assert capsys.readouterr().out.startswith(out)


@pytest.mark.parametrize(("argv", "out"), [(["--version"], "pykcm "), (["--version=raw"], 'version.Info{Major:"'),
                                           (["--version=true", "run"], "pykcm ")])
def test_version_works_before_any_command_as_kcms_which_has_none(argv: list[str], out: str,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == 0
    assert capsys.readouterr().out.startswith(out)


def test_a_bad_version_value_before_any_command_is_refused_in_pflags_words(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--version=maybe"]) == 2
    assert capsys.readouterr().err == ('pykcm: error: invalid argument "maybe" for "--version" flag: '
                                       'strconv.ParseBool: parsing "maybe": invalid syntax\n')


@pytest.mark.parametrize("argv", [[], ["testenv"]])
def test_a_group_without_a_command_prints_its_help_as_a_usage_error(argv: list[str],
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == 2  # whichever click typer runs on (click before 8.2 exits 0 by itself)
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith(f"Usage: {' '.join(['pykcm', *argv])} [OPTIONS] COMMAND")


def test_version_false_runs_and_a_zero_namespace_sync_period_is_no_resync(started_options: list[Options]) -> None:
    # KCM v1.36.3 starts with both: 0 is no periodic resync of terminating namespaces.
    runs = started_options
    assert cli.main(["run", "--version=false", "--namespace-sync-period=0"]) == 0
    assert runs[0].namespace_sync_period == 0


def test_a_value_of_pykcms_own_options_is_taken_whole_even_where_it_looks_like_a_flag(
        started_options: list[Options]) -> None:
    # pflag and click alike take the next word as the value: `-v4` is a file here, not -v 4.
    runs = started_options
    assert cli.main(["run", "--kubeconfig", "-v4", "--leader-elect-resource-name", "-v=2", "-v", "3"]) == 0
    assert (runs[0].kubeconfig, runs[0].leader_elect_resource_name) == ("-v4", "-v=2")


def test_a_qps_below_float32s_least_is_kcms_zero_the_default_rate(started_options: list[Options]) -> None:
    # KCM's flag is a float32: 1e-50 reads as 0, and client-go's QPS 0 is its default, not a stalled client.
    runs = started_options
    assert cli.main(["run", "--kube-api-qps=1e-50"]) == 0
    assert runs[0].kube_api_qps == 0


@pytest.mark.parametrize(("argv", "message"), [
    (["--kube-api-qps=nan"], "--kube-api-qps: nan is out of range"),
    (["--kube-api-qps=1e39"],  # KCM's flag is a float32
     'invalid argument "1e39" for "--kube-api-qps" flag: strconv.ParseFloat: parsing "1e39": value out of range'),
    (["--kube-api-qps=inf"], "--kube-api-qps: inf is out of range"),
    (["--kube-api-qps=-inf"], "--kube-api-qps: -inf is out of range"),
    (["-v=2147483648"],  # component-base's level: 31 bits, klog's int32 without the negatives
     'invalid argument "2147483648" for "-v, --v" flag: strconv.ParseUint: parsing "2147483648": value out of range'),
])
def test_numbers_kcm_cannot_hold_or_pykcm_does_not_take_are_refused(
        argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", *argv]) == 2
    assert message in capsys.readouterr().err


def test_an_infinite_qps_is_no_client_side_limit() -> None:
    from pykcm.util.flowcontrol import client_rate_limiter

    assert client_rate_limiter(float("inf"), 10) is None  # Go's rate.Inf: every request allowed


def test_a_shorthand_group_starting_with_h_is_help_as_pflag_reads_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", "-hv4"]) == 0
    assert capsys.readouterr().out.startswith("Usage: pykcm run")


# kubeadm's KCM static pod (cmd/kubeadm/app/phases/controlplane/manifests.go), kind's additions, and
# KCM's two deprecated flags its --help hides.
KUBEADM_KCM_ARGS = [
    "--authentication-kubeconfig=/etc/kubernetes/controller-manager.conf",
    "--authorization-kubeconfig=/etc/kubernetes/controller-manager.conf", "--bind-address=127.0.0.1",
    "--client-ca-file=/etc/kubernetes/pki/ca.crt", "--cluster-name=kubernetes",
    "--cluster-signing-cert-file=/etc/kubernetes/pki/ca.crt", "--cluster-signing-key-file=/etc/kubernetes/pki/ca.key",
    "--controllers=*,bootstrapsigner,tokencleaner", "--kubeconfig=/etc/kubernetes/controller-manager.conf",
    "--leader-elect=true", "--requestheader-client-ca-file=/etc/kubernetes/pki/front-proxy-ca.crt",
    "--root-ca-file=/etc/kubernetes/pki/ca.crt", "--service-account-private-key-file=/etc/kubernetes/pki/sa.key",
    "--use-service-account-credentials=true", "--allocate-node-cidrs=true", "--cluster-cidr=10.244.0.0/16",
    "--enable-hostpath-provisioner=true", "--allow-untagged-cloud", "--node-sync-period=10s",
]


def test_kubeadms_whole_kcm_command_line_has_no_flag_pykcm_calls_unknown() -> None:
    args = kcmflags.translate_pflag_forms(["run", *KUBEADM_KCM_ARGS])
    kept, found = kcmflags.split_kcm_flags(args, cli._value_options("run"), cli._option_names("run"))
    assert "--allow-untagged-cloud" in found.ignored and "--node-sync-period" in found.ignored
    assert "--kubeconfig=/etc/kubernetes/controller-manager.conf" in kept and not found.refused
