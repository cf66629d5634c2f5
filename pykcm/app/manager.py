"""Builds the shared informer factory and the enabled controllers, runs them, stops them cleanly.

Order of a run: wait for the apiserver (10 s, as KCM's controller context), start the HTTPS
server, then either run the controllers or, with leader election, stand by until this process
holds the Lease and run them while it keeps renewing. Controllers start independently, each once
its own informers have synced (runner.py), as KCM's do. A standby starts no informers and writes
nothing but the Lease. Losing the Lease stops everything at once and is an error (KCM exits 1);
a signal drains the workers, then releases the Lease so a standby takes over without waiting
for it to expire.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import time
from dataclasses import replace
from datetime import UTC, datetime

from pykcm import __version__
from pykcm.app import featuregates, metrics
from pykcm.app.clientbuilder import ServiceAccountClientBuilder
from pykcm.app.configz import configz
from pykcm.app.leaderelection import LeaderElectionConfig, new_identity
from pykcm.app.leasethread import ThreadedElector
from pykcm.app.looplag import BlockedLoopWatch, LoopHeartbeat, measure_event_loop_lag
from pykcm.app.options import Options
from pykcm.app.runner import MANAGER_NAME, ControllerRunner
from pykcm.client.config import ClientConfig, load_config
from pykcm.client.errors import ApiError, TransportError
from pykcm.client.events import EventRecorder
from pykcm.client.fence import WriteFence
from pykcm.client.kubeconfig import in_cluster
from pykcm.client.rest import RestClient
from pykcm.controller import Controller, ControllerContext, find_controllers
from pykcm.informers.factory import SharedInformerFactory
from pykcm.serving import zpages
from pykcm.serving.authn import DelegatingAuthenticator
from pykcm.serving.authz import DelegatingAuthorizer
from pykcm.serving.certs import ServingError, cert_dir_pair, lookup_client_ca, read_client_ca
from pykcm.serving.dynamiccerts import DynamicServingTLS
from pykcm.serving.healthz import HealthCheck
from pykcm.serving.server import LISTED_PATHS, SecureServer
from pykcm.serving.tlspolicy import tls_policy
from pykcm.util import memory
from pykcm.util.durations import go_duration
from pykcm.util.errors import described_with_type
from pykcm.util.hostport import redacted
from pykcm.util.log import get_logger, one_line
from pykcm.util.process import process_start_time

log = get_logger("controller-manager")

EVENT_COMPONENT = "pykcm"  # source of the LeaderElection events (KCM: kube-controller-manager)
APISERVER_HEALTH_TIMEOUT = 10.0  # KCM gives up building its controller context after 10 s
# On SIGTERM no new sync starts and in-flight ones get --controller-shutdown-timeout (5 s by default,
# KCM's 10 s: KCM cancels everything at once and waits that long for its controllers to return),
# then queued events up to EVENTS_FLUSH_TIMEOUT but no longer than that timeout (0: queued events are
# dropped): well inside a pod's 30 s grace, so the Lease is released before the kubelet kills the
# process. Work cut short is redone by the next leader.
EVENTS_FLUSH_TIMEOUT = 2.0
DELEGATED_AUTH_QPS, DELEGATED_AUTH_BURST = 200.0, 400  # KCM's TokenReview/SubjectAccessReview clients
# The level of a controller's "Event occurred" lines: its KCM broadcaster's StartStructuredLogging, 3 for
# every KCM controller that has one (replica_set.go); KCM's namespace and service account controllers have
# none (they record no Events), so nothing for them.
EVENT_LOG_VERBOSITY = 3
NO_EVENT_LOG = frozenset({"namespace-controller", "serviceaccount-controller"})


class ManagerError(Exception):
    """A failure the user must see as one line (and exit 1)."""


class Manager:
    def __init__(self, options: Options, config: ClientConfig, controllers: list[type[Controller]]) -> None:
        self.options = options
        # Armed once leading: every client derived from this one (controllers', their ServiceAccounts')
        # refuses writes when the Lease may have expired (leasethread.py).
        self.fence = WriteFence()
        self.heartbeat = LoopHeartbeat()
        config = replace(config, write_fence=self.fence, content_type=options.kube_api_content_type)
        self.client = RestClient(config.with_limits(options.kube_api_qps, options.kube_api_burst))
        self.factory = SharedInformerFactory(self.client.named("shared-informers"), options.min_resync_period,
                                             watch_list=options.feature_enabled(featuregates.WATCH_LIST_CLIENT))
        self.controller_classes = controllers
        self.controllers: list[Controller] = []
        self.runners: list[ControllerRunner] = []
        self.synced = asyncio.Event()  # every controller has synced its caches and runs
        self.identity = new_identity()
        self.elector: ThreadedElector | None = None
        self.server: SecureServer | None = None
        self._tls_refresh: asyncio.Task | None = None
        # What /healthz reports: leaderElection (when electing), then one per started controller.
        self.health_checks: list[HealthCheck] = []
        self._drain_timeout = options.controller_shutdown_timeout
        self._extra_clients: list[RestClient] = []
        self._service_accounts: ServiceAccountClientBuilder | None = None

    async def run(self, stop: asyncio.Event) -> None:
        log.info("Starting", version=f"v{__version__}")  # KCM's first line; its version's GitVersion form
        memory.tune()
        raise_open_files_limit()
        lag = asyncio.create_task(measure_event_loop_lag(on_tick=self.heartbeat.beat), name="event-loop lag")
        loop_watch = BlockedLoopWatch(self.heartbeat)
        loop_watch.start()
        try:
            # Serving files first, as KCM reads them from its flags: a missing one is said at once, not
            # after the apiserver answers. A pair made in memory waits (nothing of it can be missing),
            # so an unreachable apiserver is still the start's one line.
            opts = self.options
            files = opts.tls_cert_file or opts.tls_private_key_file or opts.cert_dir or opts.client_ca_file
            tls = await self._serving_tls() if opts.secure_port and files else None
            if not await self._wait_for_apiserver(stop):
                return  # stopped while waiting: nothing started yet
            if opts.secure_port and tls is None:
                tls = await self._serving_tls()
            await self._start_server(tls)
            if self.options.leader_elect:
                await self._run_leader_elected(stop)
            else:
                await self._run_controllers(stop)
        finally:
            lag.cancel()
            loop_watch.stop()
            if self._tls_refresh is not None:
                self._tls_refresh.cancel()
                await asyncio.gather(self._tls_refresh, return_exceptions=True)
            if self.server is not None:
                await self.server.stop()
            for client in (*self._extra_clients, self.client):
                await client.close()

    async def _wait_for_apiserver(self, stop: asyncio.Event) -> bool:
        """Until the apiserver answers /healthz (True), or a signal asks to stop meanwhile (False)."""
        deadline = time.monotonic() + APISERVER_HEALTH_TIMEOUT
        last_error = ""
        while time.monotonic() < deadline:
            try:
                await self.client.request("GET", "/healthz", accept="text/plain")
                return True
            except (ApiError, TransportError, ValueError) as err:
                last_error = one_line(err)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)
            if stop.is_set():
                return False
        host = redacted(self.client.config.host)  # a password in --master is not printed
        raise ManagerError(f"failed to wait for apiserver being healthy at {host}: {last_error}")

    # -- serving --------------------------------------------------------------------------------------

    def _delegated_client(self, kubeconfig: str | None, name: str) -> RestClient:
        """The TokenReview/SubjectAccessReview client: its own kubeconfig, or the main credentials."""
        if not kubeconfig:
            return self.client.named(name, DELEGATED_AUTH_QPS, DELEGATED_AUTH_BURST)
        client = RestClient(load_config(kubeconfig).with_limits(DELEGATED_AUTH_QPS, DELEGATED_AUTH_BURST), name)
        self._extra_clients.append(client)
        return client

    async def _start_server(self, tls: DynamicServingTLS | None) -> None:
        opts = self.options
        if tls is None:
            log.info("Secure serving is disabled (--secure-port=0)")
            return
        authn_client = self._delegated_client(opts.authentication_kubeconfig, "authentication-delegator")
        authz_client = self._delegated_client(opts.authorization_kubeconfig, "authorization-delegator")
        # KCM's client CA: --client-ca-file alone if given, else the ConfigMap unless --authentication-skip-lookup
        # (then no client certificate is trusted).
        lookup = not opts.client_ca_file and not opts.authentication_skip_lookup
        try:
            if lookup:
                # Fatal as in KCM where it has a delegated client: --authentication-kubeconfig, or in a
                # pod its service account. Out of a pod without one KCM looks nothing up, and pykcm
                # (asking with its main credentials) only warns.
                delegated = bool(opts.authentication_kubeconfig) or in_cluster() is not None
                tolerate = opts.authentication_tolerate_lookup_failure or not delegated
                tls.set_client_ca(await lookup_client_ca(authn_client, tolerate))
            server = SecureServer(
                opts.bind_address,
                opts.secure_port,
                tls.context,
                lambda: list(self.health_checks),
                DelegatingAuthenticator(authn_client),
                DelegatingAuthorizer(authz_client, opts.authorization_always_allow_paths),
                debug_flags=opts.profiling,
                component=zpages.Component(
                    name="pykcm", start_time=datetime.fromtimestamp(process_start_time(), UTC),
                    binary_version=__version__, flags=opts.flagz, config=configz(opts),
                    paths=[p for p in LISTED_PATHS if p != zpages.FLAGZ_PATH or opts.feature_enabled("ComponentFlagz")],
                    statusz=opts.feature_enabled("ComponentStatusz"), flagz=opts.feature_enabled("ComponentFlagz"),
                ),
            )
            await server.start()
        except ServingError as err:
            raise ManagerError(str(err)) from None
        self.server = server
        # Certificate files and the client CA are re-read while serving, as KCM's dynamic content.
        fetch = (lambda: read_client_ca(authn_client)) if lookup else None
        self._tls_refresh = asyncio.create_task(tls.run(fetch), name="serving tls")
        self._tls_refresh.add_done_callback(_say_tls_refresh_crashed)

    async def _serving_tls(self) -> DynamicServingTLS:
        """The serving pair: --tls-cert-file's, else --cert-dir's (made there if missing), else one in
        memory; --client-ca-file's CA, or none until the lookup. RSA keys and files: off the loop."""
        opts = self.options

        def load() -> DynamicServingTLS:
            cert_file, key_file = opts.tls_cert_file, opts.tls_private_key_file
            if not (cert_file or key_file) and opts.cert_dir:
                cert_file, key_file = cert_dir_pair(opts.cert_dir, opts.bind_address)
            return DynamicServingTLS(cert_file, key_file, opts.bind_address, None,
                                     tls_policy(opts.tls_min_version, opts.tls_cipher_suites), opts.client_ca_file)

        try:
            return await asyncio.to_thread(load)
        except ServingError as err:
            raise ManagerError(str(err)) from None

    # -- leader election ------------------------------------------------------------------------------

    def _build_elector(self) -> ThreadedElector:
        """Leader election on its own thread and connection; the fence guards this process's writes."""
        opts = self.options
        config = LeaderElectionConfig(
            opts.leader_elect_lease_duration, opts.leader_elect_renew_deadline, opts.leader_elect_retry_period
        )
        return ThreadedElector(
            self.client.config, opts.leader_elect_resource_namespace, opts.leader_elect_resource_name,
            self.identity, config, self.fence, self.heartbeat, EVENT_COMPONENT,
        )

    async def _run_leader_elected(self, stop: asyncio.Event) -> None:
        elector = self.elector = self._build_elector()
        self.health_checks.insert(0, HealthCheck("leaderElection", elector.check))
        try:
            if await elector.acquire(stop):
                await self._lead(elector, stop)
        finally:
            await elector.close()

    async def _lead(self, elector: ThreadedElector, stop: asyncio.Event) -> None:
        """Run the controllers while renewing; lost lease → abort and raise, signal → drain and release,
        cancelled (a second signal) → stop at once, unreleased."""
        stop_renewing, stop_controllers = asyncio.Event(), asyncio.Event()
        renewing = asyncio.create_task(elector.renew(stop_renewing), name="leader-election renew")
        running = asyncio.create_task(self._run_controllers(stop_controllers), name="controllers")
        signalled = asyncio.create_task(stop.wait())
        lost = cancelled = False
        try:
            await asyncio.wait({renewing, running, signalled}, return_when=asyncio.FIRST_COMPLETED)
            lost = renewing.done() and not _succeeded(renewing)
            if lost:
                # Another process may lead as soon as the lease expires: stop now, don't drain.
                _say_lost(elector, renewing)
                self._drain_timeout = 0.0
            stop_controllers.set()
            await running  # re-raises a controller crash after shutting the rest down
        except asyncio.CancelledError:
            cancelled = True  # a second signal: exit now, the renew task cancelled with us
            raise
        finally:
            signalled.cancel()
            if not running.done():  # we are being cancelled ourselves
                stop_controllers.set()
                self._drain_timeout = 0.0
                await asyncio.gather(running, return_exceptions=True)
            if not (lost or cancelled) and renewing.done() and not _succeeded(renewing):
                lost = True  # during the drain: no release, and said as at any other time
                _say_lost(elector, renewing)
            stop_renewing.set()
            if cancelled:  # no time to release: a standby waits out the lease
                renewing.cancel()
                if not lost:
                    log.info("Exiting now without releasing the leader lease", lock=elector.lock.describe())
            still_leading = await _result_or_false(renewing)
            if still_leading and not (lost or cancelled):
                await elector.release()
        if lost:
            raise ManagerError("leaderelection lost")

    # -- controllers ----------------------------------------------------------------------------------

    async def _controller_client(self, name: str, qps: float, burst: int) -> RestClient:
        """The controller's own client: named after it, and with its own ServiceAccount if asked."""
        if not self.options.use_service_account_credentials:
            return self.client.named(name, qps, burst)
        if self._service_accounts is None:
            self._service_accounts = ServiceAccountClientBuilder(self.client)
        try:
            client = await self._service_accounts.client_for(name, qps, burst)
        except (ApiError, TransportError) as err:
            raise ManagerError(f"cannot get credentials of service account kube-system/{name}: {err}") from None
        self._extra_clients.append(client)
        return client

    async def _build_controllers(self) -> None:
        enabled = {cls.name for cls in self.controller_classes}
        for name in find_controllers().controllers:  # KCM's line for each it has but does not run
            if name not in enabled:
                log.info("Warning: controller is disabled", controller=name)
        for cls in self.controller_classes:
            # A plugin cannot add flags: a workers_option naming none of pykcm's would fail only as its workers start.
            if cls.workers_option is not None and not hasattr(self.options, cls.workers_option):
                raise ManagerError(f"controller {cls.name!r} cannot be built: its workers_option "
                                   f"{cls.workers_option!r} is not a pykcm option (see `pykcm run --help`)")
            try:
                qps, burst = cls.client_limits(self.options.kube_api_qps, self.options.kube_api_burst)
            except Exception as err:  # a plugin's own code: one line, not a traceback
                raise _cannot_build(cls, err) from None
            client = await self._controller_client(cls.client_name or cls.name, qps, burst)
            # Events are sourced from the controller's canonical name, e.g. "replicaset-controller".
            events = EventRecorder(client, cls.name, None if cls.name in NO_EVENT_LOG else EVENT_LOG_VERBOSITY,
                                   log_name=cls.name)
            ctx = ControllerContext(client=client, informers=self.factory, options=self.options, events=events)
            with self.factory.recording() as informers:
                try:
                    controller = cls(ctx)
                except Exception as err:  # an abstract sync() is a TypeError here
                    raise _cannot_build(cls, err) from None
            self.controllers.append(controller)
            self.runners.append(ControllerRunner(controller, informers))
            # Present, and 0, until it runs: a controller that cannot start shows on the dashboard.
            metrics.running_managed_controllers.labels(cls.name, MANAGER_NAME).set(0)
            log.info("Controller built", controller=cls.name)

    async def _run_controllers(self, stop: asyncio.Event) -> None:
        """Start every controller at once; each runs as soon as its own informers have synced."""
        await self._build_controllers()
        for runner in self.runners:  # as KCM, checked from the moment controllers are built
            self.health_checks.extend(runner.health_checks())
        self.factory.start()
        tasks = [asyncio.create_task(r.run(), name=f"controller {r.name}") for r in self.runners]
        all_started = asyncio.create_task(self._all_started(), name="controllers started")
        waiter = asyncio.create_task(stop.wait())
        try:
            done, _ = await asyncio.wait({waiter, *tasks}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
            all_started.cancel()
        names = {task: runner.name for task, runner in zip(tasks, self.runners, strict=True)}
        crashed = [(names[t], err) for t in done if t is not waiter and not t.cancelled() and (err := t.exception())]
        for name, err in crashed:  # before "Shutting down controllers", which it causes
            log.error(described_with_type(err), "Controller stopped unexpectedly", controller=name)
        await self._shutdown(tasks)
        if crashed:
            name, err = crashed[0]
            raise ManagerError(f"controller {name!r} stopped unexpectedly: {described_with_type(err)}")

    async def _all_started(self) -> None:
        await asyncio.gather(*(r.started.wait() for r in self.runners))
        log.info("All controllers started", controllers=[r.name for r in self.runners])
        self.synced.set()

    async def _shutdown(self, tasks: list[asyncio.Task]) -> None:
        log.info("Shutting down controllers", controllers=[c.name for c in self.controllers])
        for controller in self.controllers:
            controller.queue.shutdown()
        # Those still waiting for caches have nothing to drain; the others finish in-flight syncs.
        waiting = [t for t, r in zip(tasks, self.runners, strict=True) if not r.started.is_set()]
        for task in waiting:
            task.cancel()
        cut = False
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=self._drain_timeout)
            if (cut := bool(pending)) and self._drain_timeout > 0:  # as KCM's RunControllers gives up
                running = sorted(c.name for t, c in zip(tasks, self.controllers, strict=True) if t in pending)
                log.info("Controller shutdown timeout reached", timeout=go_duration(self._drain_timeout),
                         runningControllers=running)
            for task, controller in zip(tasks, self.controllers, strict=True):
                if task in pending:
                    self._cut_short(controller)
                    task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        if tasks and not cut:  # only when every controller ended on its own, as KCM's
            log.info("All controllers terminated")
        # After a lost lease the fence refuses every write: nothing to flush.
        flush = min(EVENTS_FLUSH_TIMEOUT, self._drain_timeout)
        await asyncio.gather(*(c.events.close(timeout=flush) for c in self.controllers))
        if self._service_accounts is not None:
            await self._service_accounts.close()
        await self.factory.shutdown()
        log.info("Stopped")

    def _cut_short(self, controller: Controller) -> None:
        """Say which syncs the stop cancels: their work is redone by the next leader."""
        if not (keys := sorted(map(str, controller.queue.in_flight()))):
            return
        if self._drain_timeout > 0:
            log.info("Shutdown cut syncs short", controller=controller.name, keys=keys,
                     after=f"{self._drain_timeout:g}s")
        else:  # a lost lease, or --controller-shutdown-timeout=0: there was no drain to outlast
            log.info("Stopped without a drain, syncs cut short", controller=controller.name, keys=keys)


def raise_open_files_limit() -> None:
    """The soft RLIMIT_NOFILE raised to the hard one, as Go's runtime does at start for KCM: the secure
    port has no connection cap (nor has Go's), and systemd's soft 1024 would let a thousand idle
    clients take every descriptor, those to the apiserver included. Where it cannot be raised, as is."""
    with contextlib.suppress(OSError, ValueError):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _cannot_build(cls: type[Controller], err: Exception) -> ManagerError:
    return ManagerError(f"controller {cls.name!r} cannot be built: {described_with_type(err)}")


def _say_lost(elector: ThreadedElector, renewing: asyncio.Task[bool]) -> None:
    """The lost lease, preceded by the exception that ended the renewal if it crashed: a bug in
    pykcm, which would otherwise pass as a lost lease with no cause."""
    if not renewing.cancelled() and (err := renewing.exception()) is not None:
        log.error(described_with_type(err), "Lease renewal crashed", lock=elector.lock.describe())
    log.error(None, "leaderelection lost/stopped", lock=elector.lock.describe())  # lock: pykcm's addition


def _say_tls_refresh_crashed(task: asyncio.Task[None]) -> None:
    """DynamicServingTLS.run catches the failures it expects; anything else ends the reloading of the
    serving pair and client CA for good, and is said here (a cancellation at shutdown is not)."""
    if not task.cancelled() and (err := task.exception()) is not None:
        log.error(described_with_type(err), "Serving certificate reloading stopped unexpectedly")


def _succeeded(task: asyncio.Task[bool]) -> bool:
    return not task.cancelled() and task.exception() is None and bool(task.result())


async def _result_or_false(task: asyncio.Task[bool]) -> bool:
    """A finished renew loop's answer; False if it failed or was cancelled."""
    with contextlib.suppress(Exception, asyncio.CancelledError):
        return await task
    return False
