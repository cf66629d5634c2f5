"""`pykcm`: run the controller manager, manage the local control plane, list controllers."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from pykcm.app import eventloop, featuregates, flagz, kcmflags, localrun, stackdump, versioninfo
from pykcm.app.configz import canonical_controllers
from pykcm.app.options import Options, OptionsError, resolve_controllers
from pykcm.util import log as logging_setup
from pykcm.util.durations import DurationError, go_duration, parse_duration
from pykcm.util.errors import os_error_message

# Recent typer vendors click as the private `typer._click`, whose exceptions are not click's: typer reports
# only its own as usage errors (a `click.UsageError` would end in a traceback). So both classes are taken
# from the bases of typer's public BadParameter, which works whichever click typer uses.
UsageError = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")
ClickException = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")

app = typer.Typer(
    name="pykcm",
    help="A standalone kube-controller-manager in Python.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},  # pflag's -h, which KCM has
)
testenv_app = typer.Typer(help="Local test environments: start and stop a real local control plane (etcd + kube-apiserver, with simulated or real nodes), and build pykcm's container image and a kind node image here, with no registry, on a private Docker engine (root).", no_args_is_help=True)
app.add_typer(testenv_app, name="testenv")

log = logging_setup.get_logger("cli")

if TYPE_CHECKING:
    from pykcm.testenv.controlplane import ControlPlane

_defaults = Options()


class LogFormat(enum.StrEnum):
    text = "text"
    json = "json"


def _duration(flag: str, text: str) -> float:
    try:
        return parse_duration(text)
    except DurationError as err:
        raise typer.BadParameter(str(err), param_hint=flag) from None


def _feature_gates(text: str) -> dict[str, bool]:
    try:
        return featuregates.parse(text)
    except featuregates.FeatureGateError as err:
        raise UsageError(f"--feature-gates: {err}") from None


def _local_nodes(ctx: typer.Context, param: typer.CallbackParam, value: int) -> int:
    """--local-nodes' upper bound, kwok's (read only when the flag is given: it imports the testenv)."""
    if (source := ctx.get_parameter_source(param.name or "")) is not None and source.name != "DEFAULT":
        from pykcm.testenv.kwok import MAX_NODES

        if value > MAX_NODES:
            raise typer.BadParameter(f"{value} is not in the range 0<=x<={MAX_NODES}.")
    return value


# KCM has no subcommands: its `--version` works before any; `pykcm --version` does the same.
@app.callback()
def _top_level(
    show_version: Annotated[bool, typer.Option("--version", is_eager=True, callback=versioninfo.print_version,
                                               help="Print the version and exit (KCM's --version=raw also works).")] = False,
    show_raw_version: Annotated[bool, typer.Option(kcmflags.VERSION_RAW, is_eager=True, hidden=True,
                                                   callback=versioninfo.print_raw_version)] = False,
) -> None:
    pass


@app.command()
def run(
    ctx: typer.Context,
    kubeconfig: Annotated[str | None, typer.Option(help="Path to a kubeconfig file with authorization and master location.")] = None,
    master: Annotated[str | None, typer.Option(help="The address of the Kubernetes API server (overrides any value in kubeconfig).")] = None,
    controllers: Annotated[str, typer.Option(help="Controllers to enable: 'foo' enables 'foo', '-foo' disables 'foo' (the first entry naming a controller wins), '*' enables every other on-by-default controller.")] = "*",
    concurrent_replicaset_syncs: Annotated[int, typer.Option(help="ReplicaSets allowed to sync concurrently.")] = _defaults.concurrent_replicaset_syncs,
    concurrent_namespace_syncs: Annotated[int, typer.Option(help="Namespace objects allowed to sync concurrently.")] = _defaults.concurrent_namespace_syncs,
    namespace_sync_period: Annotated[str, typer.Option(help="Period for re-checking terminating namespaces.")] = go_duration(_defaults.namespace_sync_period),
    kube_api_qps: Annotated[float, typer.Option(help="QPS to use while talking with the Kubernetes API server; 0 is client-go's default (5), negative turns client-side limiting off.")] = _defaults.kube_api_qps,
    kube_api_burst: Annotated[int, typer.Option(help="Burst to use while talking with the Kubernetes API server; 0, with --kube-api-qps=0 only, is client-go's default (10).")] = _defaults.kube_api_burst,
    kube_api_content_type: Annotated[str, typer.Option(help="Content type of requests sent to the API server: application/vnd.kubernetes.protobuf reads the pods watch as protobuf (every other request stays JSON), application/json reads everything as JSON.")] = _defaults.kube_api_content_type,
    controller_shutdown_timeout: Annotated[str, typer.Option(help="On SIGTERM, how long syncs already running may finish (no new one starts) before the Lease is released; KCM's default is 10s.")] = go_duration(_defaults.controller_shutdown_timeout),
    min_resync_period: Annotated[str, typer.Option(help="Resync period of informers: random between this and twice this.")] = go_duration(_defaults.min_resync_period),
    local: Annotated[bool, typer.Option("--local", help="Start a real local cluster (etcd, kube-apiserver, kube-controller-manager with every other controller, kube-scheduler, simulated nodes) and run against it; pykcm then serves on 127.0.0.1 unless --bind-address is given.")] = False,
    local_nodes: Annotated[int, typer.Option(min=0, callback=_local_nodes, help="Simulated nodes of the --local cluster; 0 for a bare apiserver without scheduler or KCM.")] = 3,
    use_service_account_credentials: Annotated[bool, typer.Option("--use-service-account-credentials/--no-use-service-account-credentials", help="Run each controller as its own ServiceAccount in kube-system (tokens from TokenRequest); shared informers keep the main credentials.")] = False,
    leader_elect: Annotated[bool, typer.Option("--leader-elect/--no-leader-elect", help="Run leader election (a Lease) and start controllers only while leading. KCM's --leader-elect=false also works.")] = _defaults.leader_elect,
    leader_elect_lease_duration: Annotated[str, typer.Option(help="How long a standby waits after the last observed renewal before taking over.")] = go_duration(_defaults.leader_elect_lease_duration),
    leader_elect_renew_deadline: Annotated[str, typer.Option(help="How long the leader keeps retrying a renewal before it gives up leading (and exits).")] = go_duration(_defaults.leader_elect_renew_deadline),
    leader_elect_retry_period: Annotated[str, typer.Option(help="How long candidates wait between attempts to acquire or renew.")] = go_duration(_defaults.leader_elect_retry_period),
    leader_elect_resource_lock: Annotated[str, typer.Option(help="The lock object type; only 'leases' exists.")] = _defaults.leader_elect_resource_lock,
    leader_elect_resource_name: Annotated[str, typer.Option(help="Name of the Lease used for leader election.")] = _defaults.leader_elect_resource_name,
    leader_elect_resource_namespace: Annotated[str, typer.Option(help="Namespace of the Lease used for leader election.")] = _defaults.leader_elect_resource_namespace,
    secure_port: Annotated[int, typer.Option(help="HTTPS port for /healthz, /livez, /readyz and /metrics; 0 disables serving.")] = _defaults.secure_port,
    bind_address: Annotated[str, typer.Option(help="IP address to listen on. If blank or an unspecified address (0.0.0.0 or ::), all interfaces and IP address families are used, as in KCM. With --local the default is 127.0.0.1.")] = _defaults.bind_address,
    tls_cert_file: Annotated[str | None, typer.Option(help="Serving certificate (PEM); if omitted, a self-signed one (RSA, as KCM's) is read from --cert-dir, or generated there or in memory.")] = None,
    tls_private_key_file: Annotated[str | None, typer.Option(help="Private key for --tls-cert-file (PEM).")] = None,
    tls_min_version: Annotated[str, typer.Option(help="Minimum TLS version served: VersionTLS10, VersionTLS11, VersionTLS12 (the default) or VersionTLS13.")] = "",
    tls_cipher_suites: Annotated[str, typer.Option(help="Comma-separated cipher suites (Go's names) served for TLS 1.2 and below; TLS 1.3's suites are not configurable, as in KCM. Empty: OpenSSL's default list.")] = "",
    cert_dir: Annotated[str, typer.Option(help="Directory of the self-signed serving pair kube-controller-manager.crt/.key, generated there if missing; ignored with --tls-cert-file. Empty: generated in memory.")] = "",
    client_ca_file: Annotated[str | None, typer.Option(help="CA bundle (PEM) that client certificates must be signed by, re-read when it changes; the only one trusted when set (the ConfigMap's client CA is then not read).")] = None,
    authentication_skip_lookup: Annotated[bool, typer.Option("--authentication-skip-lookup/--no-authentication-skip-lookup", help="Do not read kube-system/extension-apiserver-authentication: without --client-ca-file no client certificate is trusted.")] = False,
    authentication_tolerate_lookup_failure: Annotated[bool, typer.Option("--authentication-tolerate-lookup-failure/--no-authentication-tolerate-lookup-failure", help="Start even if that ConfigMap cannot be read with --authentication-kubeconfig or, in a pod, its service account (elsewhere a failure only warns); client certificates then do not work.")] = False,
    authentication_kubeconfig: Annotated[str | None, typer.Option(help="kubeconfig allowed to create tokenreviews; defaults to the main credentials.")] = None,
    authorization_kubeconfig: Annotated[str | None, typer.Option(help="kubeconfig allowed to create subjectaccessreviews; defaults to the main credentials.")] = None,
    authorization_always_allow_paths: Annotated[str, typer.Option(help="Comma-separated HTTP paths served without authorization (exact, or prefix ending in '*', as KCM's: the leading / is optional, '*' alone is every path).")] = ",".join(_defaults.authorization_always_allow_paths),
    feature_gates: Annotated[str, typer.Option(help=featuregates.HELP)] = "",
    profiling: Annotated[bool, typer.Option("--profiling/--no-profiling", help="Serve /debug/flags/v: PUT a number there to change -v while running, as KCM's --profiling (Go's /debug/pprof has no Python counterpart; SIGQUIT dumps the stacks). KCM's --profiling=false also works.")] = _defaults.profiling,
    uvloop: Annotated[bool, typer.Option("--uvloop/--no-uvloop", help="Run on uvloop's event loop where it is installed (less CPU per request); --no-uvloop runs on asyncio's own.")] = _defaults.uvloop,
    verbosity: Annotated[int, typer.Option("-v", "--v", min=0, max=2**31 - 1, help="Log level verbosity (0 info, 2 more, 4 debug).")] = 0,
    show_version: Annotated[bool, typer.Option("--version", is_eager=True, callback=versioninfo.print_version,
                                               help="Print the version and exit (KCM's --version=raw also works).")] = False,
    show_raw_version: Annotated[bool, typer.Option(kcmflags.VERSION_RAW, is_eager=True, hidden=True,
                                                   callback=versioninfo.print_raw_version)] = False,
    logging_format: Annotated[LogFormat, typer.Option(
        help="Log format: text (klog) or json (KCM's keys: ts in milliseconds, logger where named, caller, msg, v).")] = LogFormat.text,
) -> None:
    """Run the controller manager."""
    options = Options(
        kubeconfig=kubeconfig,
        master=master,
        controllers=controllers.split(",") if controllers else [],  # pflag's empty list
        concurrent_replicaset_syncs=concurrent_replicaset_syncs,
        concurrent_namespace_syncs=concurrent_namespace_syncs,
        namespace_sync_period=_duration("--namespace-sync-period", namespace_sync_period),
        kube_api_qps=kube_api_qps,
        kube_api_burst=kube_api_burst,
        kube_api_content_type=kube_api_content_type,
        min_resync_period=_duration("--min-resync-period", min_resync_period),
        controller_shutdown_timeout=_duration("--controller-shutdown-timeout", controller_shutdown_timeout),
        local=local,
        use_service_account_credentials=use_service_account_credentials,
        leader_elect=leader_elect,
        leader_elect_lease_duration=_duration("--leader-elect-lease-duration", leader_elect_lease_duration),
        leader_elect_renew_deadline=_duration("--leader-elect-renew-deadline", leader_elect_renew_deadline),
        leader_elect_retry_period=_duration("--leader-elect-retry-period", leader_elect_retry_period),
        leader_elect_resource_lock=leader_elect_resource_lock,
        leader_elect_resource_name=leader_elect_resource_name,
        leader_elect_resource_namespace=leader_elect_resource_namespace,
        secure_port=secure_port,
        bind_address=bind_address or _defaults.bind_address,  # pflag leaves an IP flag set to "" as it was
        tls_cert_file=tls_cert_file,
        tls_private_key_file=tls_private_key_file,
        tls_min_version=tls_min_version,
        tls_cipher_suites=[c.strip() for c in tls_cipher_suites.split(",") if c.strip()],
        cert_dir=cert_dir, client_ca_file=client_ca_file, authentication_skip_lookup=authentication_skip_lookup,
        authentication_tolerate_lookup_failure=authentication_tolerate_lookup_failure,
        authentication_kubeconfig=authentication_kubeconfig,
        authorization_kubeconfig=authorization_kubeconfig,
        authorization_always_allow_paths=[p.strip() for p in authorization_always_allow_paths.split(",") if p.strip()],
        profiling=profiling,
        uvloop=uvloop,
        flagz=flagz.flag_values(ctx.command.params, ctx.params),
        feature_gates=_feature_gates(feature_gates),
    )
    try:
        options.validate()
    except OptionsError as err:
        raise UsageError(str(err)) from None
    source = ctx.get_parameter_source("local_nodes")  # click's ParameterSource; typer may vendor click
    if not local and source is not None and source.name != "DEFAULT":
        raise UsageError("--local-nodes applies only with --local")
    logging_setup.setup(verbosity, logging_format.value)
    ctx.ensure_object(dict)["log_format"] = logging_format.value  # main's last line follows it

    from pykcm.controller import controllers_for

    for gate, value in featuregates.ga_settings(options.feature_gates):
        log.info("Warning: setting GA feature gate. It will be removed in a future release.",
                 featureGate=gate, value=value)
    ignored = {"flags": (ctx.obj or {}).get("kcm_ignored"), "featureGates": featuregates.ignored(options.feature_gates)}
    if ignored := {key: names for key, names in ignored.items() if names}:
        log.warning("Ignoring kube-controller-manager flags for what pykcm does not run or serve", **ignored)
    # A broken plugin this run leaves off is only a warning, its `-name` dropped from the list.
    registry, options.controllers = controllers_for(options.controllers)
    ours = {name for info in registry.values() for name in (info.name, *info.aliases)}
    given = options.controllers
    options.controllers, left = kcmflags.left_to_kcm(options.controllers, ours)
    if left:
        log.warning("Leaving to kube-controller-manager the controllers pykcm does not have", controllers=left)
    try:
        enabled = resolve_controllers(options.controllers, registry.values())
    except OptionsError as err:
        raise typer.BadParameter(str(err), param_hint="--controllers") from None
    classes = [registry[name] for name in enabled]
    # As /configz shows them: KCM's controllers too, as KCM would name them.
    options.controllers = canonical_controllers(given, registry.values(), kcmflags.KCM_CONTROLLER_ALIASES)

    if options.local:
        if getattr(ctx.get_parameter_source("bind_address"), "name", "") == "DEFAULT":  # not given
            options.bind_address = "127.0.0.1"  # a developer's machine: serve on loopback like the control plane
            options.flagz["bind-address"] = options.bind_address  # /flagz shows the address served on
        localrun.run_local(options, classes, local_nodes, _run_manager, lambda text, plain: _last_line(ctx.obj, text, plain))
    else:
        _run_manager(options, classes)


def _run_manager(options: Options, classes: list, watch: ControlPlane | None = None) -> None:
    from pykcm.app.manager import Manager
    from pykcm.client.config import load_config

    eventloop.exit_on_sigterm()
    config = load_config(options.kubeconfig, options.master)
    eventloop.run(_serve(Manager(options, config, classes), watch), options.uvloop)


async def _serve(manager, watch: ControlPlane | None = None) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    log.v(2).info("Event loop", implementation=eventloop.implementation(loop))

    def on_signal(signum: int) -> None:
        if stop.is_set():  # a second signal means "now": exit 1, as KCM's SetupSignalContext does
            sys.exit(1)
        log.info("Received signal, shutting down", signal=signal.Signals(signum).name)
        stop.set()

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        if not (signum == signal.SIGHUP and signal.getsignal(signum) == signal.SIG_IGN):  # nohup: as Go leaves it
            loop.add_signal_handler(signum, on_signal, signum)
    stackdump.install(loop)
    watchdog = asyncio.create_task(localrun.watch_cluster(watch, stop)) if watch else None
    try:
        await manager.run(stop)
    except Exception:
        if not (watch and watch.dead_processes()):
            raise  # else the cause is the process that died, before the watchdog saw it
    finally:
        if watchdog:
            watchdog.cancel()
    if watch and (dead := watch.dead_processes()):
        raise localrun.LocalClusterFailed(dead)


@app.command("controllers")
def list_controllers() -> None:
    """List registered controllers and whether they are on by default."""
    from pykcm.controller import find_controllers

    plugins = find_controllers()
    for cls in sorted(plugins.controllers.values(), key=lambda c: c.name):
        state = "on" if cls.enabled_by_default else "off"
        aliases = f" (aliases: {', '.join(cls.aliases)})" if cls.aliases else ""
        typer.echo(f"{cls.name}\t{state}{aliases}")
    for bad in plugins.broken:  # the others are still listed: this command is how one finds the broken one
        typer.echo(f"pykcm: error: {bad.error}", err=True)
    if plugins.broken:
        raise typer.Exit(1)


@app.command()
def version() -> None:
    """Print the pykcm version."""
    typer.echo(versioninfo.version_line())


@testenv_app.command("start")
def testenv_start(
    ctx: typer.Context,
    directory: Annotated[Path, typer.Option("--dir", help="Directory for state, certificates, logs and kubeconfig.")],
    kcm_controllers: Annotated[str | None, typer.Option(help="Also start the real kube-controller-manager with --controllers=LIST.")] = None,
    nodes: Annotated[int, typer.Option(min=0, help="Simulated nodes (kwok), with kube-scheduler and kube-controller-manager running every controller pykcm does not; 0 for a bare apiserver.")] = 0,
    real_node: Annotated[bool, typer.Option("--real-node", help="Also a real node (containerd, runc, CNI, kubelet, kube-proxy; root and Debian packages needed); the apiserver then listens on the node's address 10.200.0.1.")] = False,
) -> None:
    """Start etcd and kube-apiserver on 127.0.0.1 (and with --nodes or --real-node a whole cluster); returns once it is ready."""
    from pykcm.testenv.cluster import start

    def progress(msg: str) -> None:
        typer.echo(msg, err=True)

    with localrun.interrupted_exit(lambda text, plain: _last_line(ctx.obj, text, plain)):
        plane = start(directory, kcm_controllers=kcm_controllers, nodes=nodes, real_node=real_node, log=progress)
    typer.echo(str(plane.kubeconfig))


@testenv_app.command("stop")
def testenv_stop(directory: Annotated[Path, typer.Option("--dir", help="Directory given to 'testenv start'.")]) -> None:
    """Stop exactly the processes 'testenv start' started there (safe to call twice)."""
    from pykcm.testenv.cluster import stop

    stop(directory)


_DOCKER_DIR_HELP = "Directory of the private Docker engine (images, containerd, logs, sockets): a new or empty one, or one pykcm made (a pykcm-docker-engine file marks it); default: {}."


@testenv_app.command("image")
def testenv_image(
    ctx: typer.Context,
    checkout: Annotated[Path, typer.Option(help="The pykcm checkout whose Dockerfile is built.")] = Path("."),
    save: Annotated[Path | None, typer.Option(help="Also save the image to this tarball (`docker load`, `ctr -n k8s.io images import`).")] = None,
    docker_dir: Annotated[Path | None, typer.Option(help=_DOCKER_DIR_HELP.format("~/.cache/pykcm/docker"))] = None,
) -> None:
    """Build pykcm's container image here, with no registry: the checkout's Dockerfile on a local Debian base made with debootstrap, by a private Docker engine. Needs root, the Debian packages docker.io and debootstrap, a Debian mirror, and PyPI for the build stage's pip. Prints the image's name and size."""
    from pykcm.testenv import image

    def progress(message: str) -> None:
        typer.echo(message, err=True)

    # SIGTERM and SIGHUP as Ctrl-C: the engine is stopped and the temp dirs removed (as testenv start).
    with localrun.interrupted_exit(lambda text, plain: _last_line(ctx.obj, text, plain)):
        if save is not None:
            image.check_save_target(save)  # before minutes of building
        with image.built(checkout.resolve(), log=progress, directory=docker_dir) as (engine, built):
            progress(f"layers, newest first:\n{image.layer_table(built)}")
            if save is not None:
                image.save(engine, built.name, save, log=progress)
    typer.echo(f"{built.name}\t{built.size / 1e6:.1f} MB")


@testenv_app.command("kind-image")
def testenv_kind_image(
    ctx: typer.Context,
    docker_dir: Annotated[Path | None, typer.Option(help=_DOCKER_DIR_HELP.format("~/.cache/pykcm/docker-kind"))] = None,
) -> None:
    """Assemble a kind node image here, with no registry (Kubernetes binaries, CoreDNS, pause and runc built from their sources, Debian's packages), in a private Docker engine, and build kind; print the image's reference and size. Needs root, Go, the Debian packages docker.io, debootstrap, busybox-static, and until the C builds are cached gcc, libseccomp-dev and pkg-config (runc), libc6-dev (pause), the Go module proxy and a Debian mirror (the tools and packages are checked before any work). With registry access, use the official kindest/node instead."""
    from pykcm.testenv import docker
    from pykcm.testenv.errors import BuildError
    from pykcm.testenv.kind import nodeimage

    def progress(message: str) -> None:
        typer.echo(message, err=True)

    if missing := nodeimage.missing_prerequisites():  # before the engine starts or anything is built
        raise BuildError("; ".join(missing))
    with localrun.interrupted_exit(lambda text, plain: _last_line(ctx.obj, text, plain)):  # as in testenv image
        with docker.running(docker_dir or nodeimage.default_docker_directory(), log=progress) as engine:
            reference = nodeimage.ensure_node_image(progress, engine)
            size = nodeimage.image_size(engine, reference)
        progress(f"kind: {nodeimage.ensure_kind(progress)}")
    typer.echo(f"{reference}\t{size / 1e6:.1f} MB")


def _user_errors() -> tuple[type[BaseException], ...]:
    """Failures the user can act on: printed as one line, exit 1, no traceback."""
    from pykcm.app.manager import ManagerError
    from pykcm.client.config import ConfigError
    from pykcm.controller import PluginError

    errors: list[type[BaseException]] = [
        ConfigError, ManagerError, PluginError, localrun.LocalClusterFailed, localrun.PortUnavailable, OSError,
    ]
    with contextlib.suppress(ImportError):
        from pykcm.testenv.errors import ControlPlaneError  # BuildError is one of these

        errors.append(ControlPlaneError)
    return tuple(errors)


@functools.cache
def _command() -> Any:
    """The click command typer builds from `app`, built once (each build walks every option: ~15 ms)."""
    return typer.main.get_command(app)


def _value_options(command: str) -> frozenset[str]:
    """The options of `command` that take a value: their value is the next word, whatever it looks
    like (`--kubeconfig -v4` names a file, for pflag as for click)."""
    params = _command().commands[command].params
    return frozenset(name for param in params if not getattr(param, "is_flag", True) for name in param.opts)


def _option_names(command: str) -> frozenset[str]:
    """Every option name of `command`, its help's too."""
    group = _command()
    names = {name for param in group.commands[command].params for name in (*param.opts, *param.secondary_opts)}
    return frozenset(names | set(group.context_settings["help_option_names"]))  # a command's help: the group's


def _bare_group_help(args: list[str]) -> str | None:
    """The help of a command group given without a command (`pykcm`, `pykcm testenv`): answered here,
    as a usage error, because click before 8.2 exits 0 there and later ones 2."""
    group = _command()
    for word in args:
        group = getattr(group, "commands", {}).get(word)
        if group is None:
            return None
    if not hasattr(group, "commands"):
        return None
    with group.make_context(" ".join(["pykcm", *args]), [], resilient_parsing=True) as ctx:
        return ctx.get_help()


def main(argv: list[str] | None = None) -> int:
    obj: dict = {}  # what the command tells main: the ignored KCM flags, and how logs are written
    try:
        args, kcm = sys.argv[1:] if argv is None else list(argv), kcmflags.KcmFlags()
        try:  # `run`'s flags read left to right as pflag reads them, then respelled for click
            if args[:1] == ["run"]:
                args, kcm = kcmflags.split_kcm_flags(args, _value_options("run"), _option_names("run"))
            else:
                kcmflags.check_version_values(args)
            args = kcmflags.translate_pflag_forms(args, _value_options("run") if args[:1] == ["run"] else frozenset())
        except kcmflags.FlagError as err:
            raise UsageError(str(err)) from None
        if kcm.refused and not kcm.help:  # cobra prints the help first
            refused = ", ".join(kcm.refused)
            raise UsageError(f"pykcm does not implement {refused}: refused, pykcm cannot honour it and would serve other TLS than asked")
        obj["kcm_ignored"] = kcm.ignored
        if (bare := _bare_group_help(args)) is not None:
            typer.echo(bare, err=True)
            return 2
        result = _command().main(args=args, prog_name="pykcm", standalone_mode=False, obj=obj)
    except UsageError as err:
        hint = f" (see '{err.ctx.command_path} --help')" if err.ctx and err.ctx.command.name != "pykcm" else ""
        print(f"pykcm: error: {err.format_message()}{hint}", file=sys.stderr)
        return 2
    except ClickException as err:
        print(f"pykcm: error: {err.format_message()}", file=sys.stderr)
        return err.exit_code
    except (typer.Abort, KeyboardInterrupt):
        return 130
    except _user_errors() as err:
        # Errors may carry a log tail on later lines; the user gets the summary line.
        text = os_error_message(err) if isinstance(err, OSError) else str(err).strip()
        first_line = text.splitlines()[0] if text else type(err).__name__
        _last_line(obj, first_line, f"pykcm: error: {first_line}")
        return 1
    return result if isinstance(result, int) else 0


def _last_line(obj: dict | None, text: str, plain: str) -> None:
    """The run's last word: `plain` on stderr, or once logs are JSON, KCM's "command failed" line."""
    if (obj or {}).get("log_format") == "json":
        log.error(text, "command failed")
    else:
        print(plain, file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
