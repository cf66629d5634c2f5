"""A real local control plane: etcd + kube-apiserver (+ kube-controller-manager, kube-scheduler and
kwok when the cluster has nodes, see cluster.py).

Processes run in their own sessions with logs in DIR/logs, so they outlive the process that
started them; DIR/testenv.json records each PID with its kernel start time so that `stop` never
signals an unrelated process that reused the PID.
"""

from __future__ import annotations

import base64
import json
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from .build import KUBERNETES_VERSION, Binaries, ensure_binaries
from .certs import FRONT_PROXY_CN, Pki, ensure_pki, kubeconfig
from .errors import ControlPlaneError
from .processes import (
    LOOPBACK,
    STOP_TIMEOUT,
    ManagedProcess,
    free_port,
    http_get,
    retry_on_port_clash,
    spawn,
    stop_all,
    unverified_context,
    wait_ready,
    write_private_file,
)

STATE_FILE = "testenv.json"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"
ETCD, APISERVER, KCM = "etcd", "kube-apiserver", "kube-controller-manager"
PORTS = ("etcd_client", "etcd_peer", "apiserver")
ETCD_READY_TIMEOUT = 30.0
APISERVER_READY_TIMEOUT = 60.0
KCM_READY_TIMEOUT = 60.0

Log = Callable[[str], None]


class ControlPlane:
    """Handle on a local control plane living in `directory`."""

    def __init__(
        self,
        directory: Path,
        binaries: Binaries,
        ports: dict[str, int],
        processes: dict[str, ManagedProcess] | None = None,
        log: Log = print,
        apiserver_args: Sequence[str] = (),
        host: str = LOOPBACK,
    ) -> None:
        self.directory = directory.resolve()
        # The apiserver's address: loopback, or the real node's address that pods can route to.
        self.host = host
        self.binaries = binaries
        self.ports = ports
        self.processes: dict[str, ManagedProcess] = processes or {}
        self.apiserver_args = list(apiserver_args)
        self.pki = Pki.at(self.directory / "pki")
        self.kubeconfig = self.directory / "kubeconfig"
        self.kcm_kubeconfig = self.directory / "kcm.kubeconfig"
        self.scheduler_kubeconfig = self.directory / "scheduler.kubeconfig"
        self._log = log

    # ----- addresses and credentials

    @property
    def apiserver_url(self) -> str:
        return f"https://{self.host}:{self.ports['apiserver']}"

    @property
    def etcd_url(self) -> str:
        return f"http://{LOOPBACK}:{self.ports['etcd_client']}"

    @property
    def logs_dir(self) -> Path:
        return self.directory / "logs"

    def ssl_context(self) -> ssl.SSLContext:
        """Client TLS context for the apiserver, authenticated as the admin (system:masters)."""
        ctx = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        ctx.load_cert_chain(str(self.pki.admin_cert), str(self.pki.admin_key))
        return ctx

    # ----- state file

    @classmethod
    def load(cls, directory: Path, log: Log = print) -> ControlPlane:
        """Attach to a control plane started earlier (possibly by another process)."""
        plane = cls.from_state(directory, log)
        if not plane.processes.get(APISERVER) or not plane.processes[APISERVER].alive():
            raise ControlPlaneError(f"no running control plane in {directory} (start one first)")
        return plane

    @classmethod
    def from_state(cls, directory: Path, log: Log = print) -> ControlPlane:
        path = directory / STATE_FILE
        try:
            state = json.loads(path.read_text())
            binaries = Binaries(**{k: Path(v) if v else None for k, v in state["binaries"].items()})
            processes = {n: ManagedProcess.from_json(n, p) for n, p in state["processes"].items()}
            ports = {name: int(state["ports"][name]) for name in PORTS}
            apiserver_args, host = list(state.get("apiserver_args", ())), str(state.get("host", LOOPBACK))
        except FileNotFoundError:
            raise ControlPlaneError(f"no control plane state in {directory} ({STATE_FILE} is missing)") from None
        except (OSError, ValueError) as exc:
            raise ControlPlaneError(f"unreadable control plane state {path}: {exc}") from None
        except (KeyError, TypeError, AttributeError) as exc:  # valid JSON, but not what _save writes
            what = f"no {exc}" if isinstance(exc, KeyError) else f"not what a start writes ({exc})"
            raise ControlPlaneError(f"unreadable control plane state {path}: {what}") from None
        return cls(directory, binaries, ports, processes, log, apiserver_args, host)

    def _save(self, running: bool = True) -> None:
        state = {
            "state": "running" if running else "stopped",
            "version": KUBERNETES_VERSION,
            "apiserver_url": self.apiserver_url,
            "etcd_url": self.etcd_url,
            "kubeconfig": str(self.kubeconfig),
            "ports": self.ports,
            "host": self.host,
            "apiserver_args": self.apiserver_args,
            "binaries": {k: str(v) if v else None for k, v in vars(self.binaries).items()},
            "processes": {n: p.to_json() for n, p in self.processes.items()},
        }
        write_private_file(self.directory / STATE_FILE, json.dumps(state, indent=2) + "\n")

    # ----- etcd

    def _start_etcd(self) -> None:
        client, peer = self.ports["etcd_client"], self.ports["etcd_peer"]
        peer_url = f"http://{LOOPBACK}:{peer}"
        argv = [
            str(self.binaries.etcd),
            "--name=default",
            f"--data-dir={self.directory / 'etcd'}",
            f"--listen-client-urls={self.etcd_url}",
            f"--advertise-client-urls={self.etcd_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=default={peer_url}",
            "--unsafe-no-fsync",
        ]
        proc = spawn(ETCD, argv, self.logs_dir, client)
        self.processes[ETCD] = proc
        self._save()  # before the wait: a start killed meanwhile (SIGKILL) still leaves it to `stop`
        wait_ready(proc, self._etcd_healthy, ETCD_READY_TIMEOUT)

    def _etcd_healthy(self) -> bool:
        status, body = http_get(f"{self.etcd_url}/health", None)
        return status == 200 and b'"true"' in body

    def _etcd_post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(
            f"{self.etcd_url}{path}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            raise ControlPlaneError(f"etcd {path} failed: HTTP {exc.code} {detail}") from None
        except OSError as exc:
            raise ControlPlaneError(f"etcd {path} failed: {exc}") from None

    def compact_etcd(self) -> int:
        """Compact etcd up to its current revision and return it.

        The apiserver's watch cache keeps serving older resourceVersions (watches, exact-RV lists
        and continue tokens) from memory; follow with `restart_apiserver()` to make all of them
        fail with 410 Expired ("too old resource version"), or start with `--watch-cache=false`.
        """
        # Any key will do: the response header carries the store's current revision.
        header = self._etcd_post("/v3/kv/range", {"key": base64.b64encode(b"/").decode(), "keys_only": True})
        revision = int(header["header"]["revision"])
        try:
            self._etcd_post("/v3/kv/compaction", {"revision": str(revision), "physical": True})
        except ControlPlaneError as exc:
            if "required revision has been compacted" not in str(exc):  # nothing written since the last one
                raise
        return revision

    # ----- kube-apiserver

    def _apiserver_argv(self) -> list[str]:
        pki = self.pki
        return [
            str(self.binaries.apiserver),
            f"--etcd-servers={self.etcd_url}",
            f"--secure-port={self.ports['apiserver']}",
            f"--bind-address={self.host}",
            f"--advertise-address={self.host}",
            f"--tls-cert-file={pki.apiserver_cert}",
            f"--tls-private-key-file={pki.apiserver_key}",
            f"--client-ca-file={pki.ca_cert}",
            f"--requestheader-client-ca-file={pki.ca_cert}",
            f"--requestheader-allowed-names={FRONT_PROXY_CN}",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={pki.front_proxy_cert}",
            f"--proxy-client-key-file={pki.front_proxy_key}",
            *self._default_issuer(),
            f"--service-account-key-file={pki.sa_pub}",
            f"--service-account-signing-key-file={pki.sa_key}",
            f"--api-audiences={SERVICE_ACCOUNT_ISSUER}",
            *self._default_authorization_mode(),
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
            "--allow-privileged=true",
            # The `kubernetes` Endpoints may not point at a loopback address; the reconciler would
            # only log that validation error every 10 s.
            *(["--endpoint-reconciler-type=none"] if self.host == LOOPBACK else []),
            *self.apiserver_args,
        ]

    def _default_issuer(self) -> list[str]:
        # A list flag too (the first signs, all are accepted): one in apiserver_args replaces this.
        if any(arg.startswith("--service-account-issuer") for arg in self.apiserver_args):
            return []
        return [f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}"]

    def _default_authorization_mode(self) -> list[str]:
        # A list flag: a mode list in apiserver_args would add to this one, so it replaces it.
        if any(arg.startswith("--authorization-mode") for arg in self.apiserver_args):
            return []
        return ["--authorization-mode=RBAC"]

    def start_apiserver(self) -> None:
        if (proc := self.processes.get(APISERVER)) and proc.alive():
            raise ControlPlaneError(f"kube-apiserver is already running (pid {proc.pid})")
        proc = spawn(APISERVER, self._apiserver_argv(), self.logs_dir, self.ports["apiserver"])
        self.processes[APISERVER] = proc
        self._save()
        context = self.ssl_context()
        wait_ready(
            proc,
            lambda: http_get(f"{self.apiserver_url}/readyz", context)[0] == 200,
            APISERVER_READY_TIMEOUT,
        )

    def stop_apiserver(self) -> None:
        if proc := self.processes.get(APISERVER):
            proc.stop()

    def restart_apiserver(self, down_seconds: float = 0) -> None:
        """Stop the apiserver, stay down for `down_seconds`, start it again on the same port."""
        self.stop_apiserver()
        if down_seconds > 0:
            time.sleep(down_seconds)
        self.start_apiserver()

    def _write_kubeconfigs(self) -> None:
        pki = self.pki
        for path, cert, key, user in (
            (self.kubeconfig, pki.admin_cert, pki.admin_key, "pykcm-admin"),
            (self.kcm_kubeconfig, pki.kcm_cert, pki.kcm_key, "kube-controller-manager"),
            (self.scheduler_kubeconfig, pki.scheduler_cert, pki.scheduler_key, "kube-scheduler"),
        ):
            config = kubeconfig(self.apiserver_url, pki.ca_cert, cert, key, user)
            write_private_file(path, yaml.safe_dump(config, sort_keys=False))

    # ----- kube-controller-manager

    def _kcm_name(self) -> str:
        taken = set(self.processes)
        return next(n for i in range(1, 1000) if (n := KCM if i == 1 else f"{KCM}-{i}") not in taken)

    def start_kcm(self, controllers: str, extra_args: Sequence[str] = ()) -> ManagedProcess:
        """Start a real kube-controller-manager (several may run at once, e.g. with
        `--leader-elect=true` in `extra_args`; later flags win) and wait until /healthz is ok."""
        if self.binaries.kcm is None:
            self.binaries = ensure_binaries(need_kcm=True, log=self._log)
        return retry_on_port_clash(lambda: self._start_kcm_once(controllers, extra_args), lambda: None)

    def _start_kcm_once(self, controllers: str, extra_args: Sequence[str]) -> ManagedProcess:
        name, port = self._kcm_name(), free_port()
        url, context = f"https://{LOOPBACK}:{port}/healthz", unverified_context()
        return self.start_component(
            name,
            self._kcm_argv(controllers, port, extra_args),
            lambda: http_get(url, context)[0] == 200,
            KCM_READY_TIMEOUT,
            port,
        )

    def start_component(
        self, name: str, argv: Sequence[str], ready: Callable[[], bool], timeout: float, port: int | None = None
    ) -> ManagedProcess:
        """Start one more process of the cluster, record it in the state file and wait until
        `ready()`; a process that fails to start is stopped and forgotten again."""
        proc = spawn(name, argv, self.logs_dir, port)
        self.processes[name] = proc
        self._save()
        try:
            wait_ready(proc, ready, timeout)
        except BaseException:
            proc.stop(timeout=5.0)
            del self.processes[name]
            self._save()
            raise
        return proc

    def adopt(self, proc: ManagedProcess) -> None:
        """Record a process started elsewhere (kwok) so that `stop` stops it too."""
        self.processes[proc.name] = proc
        self._save()

    def dead_processes(self) -> list[ManagedProcess]:
        """Processes of this cluster that have exited (a crashed scheduler, kwok, KCM ...)."""
        return [proc for proc in self.processes.values() if not proc.alive()]

    def revive(self) -> list[str]:
        """Start etcd and the apiserver again, on their ports and data, if they have exited; return
        the names restarted. Lets a shared test cluster outlive one test that broke it."""
        revived = []
        if (etcd := self.processes.get(ETCD)) is not None and not etcd.alive():
            self._start_etcd()
            revived.append(ETCD)
        if (apiserver := self.processes.get(APISERVER)) is not None and not apiserver.alive():
            self.start_apiserver()
            revived.append(APISERVER)
        return revived

    def _kcm_argv(self, controllers: str, port: int, extra_args: Sequence[str]) -> list[str]:
        return [
            str(self.binaries.kcm),
            f"--kubeconfig={self.kcm_kubeconfig}",
            # Delegated authn/authz let the admin client cert read /metrics, as in a real cluster.
            f"--authentication-kubeconfig={self.kcm_kubeconfig}",
            f"--authorization-kubeconfig={self.kcm_kubeconfig}",
            f"--controllers={controllers}",
            "--leader-elect=false",
            f"--bind-address={LOOPBACK}",
            f"--secure-port={port}",
            f"--root-ca-file={self.pki.ca_cert}",
            f"--service-account-private-key-file={self.pki.sa_key}",
            # As kubeadm runs it: each controller acts as its own ServiceAccount with the bootstrap
            # roles; KCM's own identity may not, for example, write pods or ReplicaSets.
            "--use-service-account-credentials=true",
            *extra_args,
        ]

    def kcm_processes(self) -> list[ManagedProcess]:
        return [p for n, p in self.processes.items() if n == KCM or n.startswith(f"{KCM}-")]

    def stop_kcm(self, process: ManagedProcess | None = None) -> None:
        """Stop one kube-controller-manager, or all of them."""
        targets = [process] if process else self.kcm_processes()
        stop_all(targets)
        for proc in targets:
            self.processes.pop(proc.name, None)
        self._save()

    # ----- whole control plane

    def boot(self, kcm_controllers: str | None = None, kcm_args: Sequence[str] = ()) -> None:
        """Start etcd and the apiserver (and a KCM running `kcm_controllers`), re-picking ports that
        another process took first."""
        ensure_pki(self.pki.ca_cert.parent, extra_ips=(self.host,))
        retry_on_port_clash(self._start_etcd, lambda: self._repick("etcd_client", "etcd_peer"))
        retry_on_port_clash(self._start_apiserver_fresh, lambda: self._repick("apiserver"))
        if kcm_controllers:
            self.start_kcm(kcm_controllers, kcm_args)

    def _start_apiserver_fresh(self) -> None:
        # The port is part of both kubeconfigs, so they follow a re-picked port.
        self._write_kubeconfigs()
        self.start_apiserver()

    def _repick(self, *names: str) -> None:
        for name in names:
            self.ports[name] = free_port()

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """Stop every process this cluster started: its clients first (kwok, the scheduler, KCMs),
        then the apiserver, then etcd."""
        clients = [p for n, p in self.processes.items() if n not in (APISERVER, ETCD)]
        stop_all(clients, timeout)
        stop_all([p for n, p in self.processes.items() if n == APISERVER], timeout)
        stop_all([p for n, p in self.processes.items() if n == ETCD], timeout)
        self._save(running=False)
