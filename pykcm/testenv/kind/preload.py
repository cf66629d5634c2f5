"""The images a kind node finds in its containerd, under the names and tags kubeadm asks for
(`kubeadm config images list`), made here as FROM-scratch docker archives (images.py):

- kube-apiserver, kube-controller-manager, kube-scheduler and etcd: the binaries built from the
  control plane's Go module, in /usr/local/bin as upstream's images keep them, with the C library
  they link (Debian's libc6, from the node's root: the module's builds leave cgo on);
- kube-proxy: the same, plus iptables (kube-proxy programs Services with it): Debian's iptables
  and the packages it depends on, taken from the node's own root filesystem, behind a wrapper that
  picks the backend (legacy or nft) the node's kubelet uses, as upstream's iptables-wrapper does;
- CoreDNS, built from its Go module at the version kubeadm deploys;
- pause, compiled from the pause.c in the Kubernetes module (static, as upstream's).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ..build import APISERVER, ETCD, KCM, KUBE_PROXY, KUBERNETES_VERSION, SCHEDULER
from ..errors import BuildError
from ..gobuild import cache_dir, find_go, is_executable, locked
from ..images import APPLETS, BUSYBOX, layer_tar, write_docker_archive
from ..progress import Log

REGISTRY = "registry.k8s.io"
# kubeadm v1.36.3's constants (cmd/kubeadm/app/constants): what `kubeadm config images list` names.
COREDNS_PACKAGE, COREDNS_VERSION = "github.com/coredns/coredns", "v1.14.2"
ETCD_TAG = "3.6.8-0"  # etcd 3.6.8, the version the control plane's module links
PAUSE_VERSION = "3.10.2"
PAUSE_IMAGE = f"{REGISTRY}/pause:{PAUSE_VERSION}"
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_BASE_DIRS = ("tmp", "etc", "proc", "sys", "dev", "run", "var/run")
_IPTABLES_COMMANDS = ("iptables", "iptables-save", "iptables-restore", "ip6tables", "ip6tables-save",
                      "ip6tables-restore")
# Nothing under these is read by iptables or the C library at run time.
_SKIP = ("usr/share/", "usr/lib/x86_64-linux-gnu/gconv/")

# kube-proxy must write rules where the node's kubelet does (kind's entrypoint picks the host's
# backend for the node): the backend holding kubelet's marker chains wins, else the one with more
# rules, else nft. Decided once per container.
IPTABLES_WRAPPER = """#!/bin/sh
mode_file=/tmp/.iptables-mode
mode=$(cat "$mode_file" 2>/dev/null)
if [ -z "$mode" ]; then
  save() { (xtables-$1-multi iptables-save; xtables-$1-multi ip6tables-save) 2>/dev/null; }
  legacy=$(save legacy | grep -c -E '^:(KUBE-IPTABLES-HINT|KUBE-KUBELET-CANARY)')
  nft=$(save nft | grep -c -E '^:(KUBE-IPTABLES-HINT|KUBE-KUBELET-CANARY)')
  if [ "$legacy" = "$nft" ]; then
    legacy=$(save legacy | grep -c '^-')
    nft=$(save nft | grep -c '^-')
  fi
  mode=nft
  [ "$legacy" -gt "$nft" ] && mode=legacy
  echo "$mode" > "$mode_file" 2>/dev/null
fi
exec "xtables-$mode-multi" "${0##*/}" "$@"
"""


@dataclass(frozen=True)
class Preload:
    """One image of the node: its reference and the files of its single layer."""

    reference: str
    files: Mapping[str, bytes]
    links: Mapping[str, str]
    command: tuple[str, ...] = ()
    entrypoint: tuple[str, ...] = ()


def kubeadm_images(version: str = KUBERNETES_VERSION) -> tuple[str, ...]:
    """The references `kubeadm config images list --kubernetes-version VERSION` prints, in its order."""
    return (
        *(f"{REGISTRY}/{name}:{version}" for name in (APISERVER, KCM, SCHEDULER, KUBE_PROXY)),
        f"{REGISTRY}/coredns/coredns:{COREDNS_VERSION}",
        PAUSE_IMAGE,
        f"{REGISTRY}/etcd:{ETCD_TAG}",
    )


def binary_image(reference: str, binary: Path, extra: Mapping[str, bytes] | None = None,
                 links: Mapping[str, str] | None = None) -> Preload:
    """An image holding `binary` in /usr/local/bin (kubeadm's manifests run it by name or that path)."""
    files = {f"usr/local/bin/{binary.name}": binary.read_bytes(), **(extra or {})}
    return Preload(reference, files, dict(links or {}))


def kube_proxy_image(reference: str, kube_proxy: Path, rootfs_tar: Path) -> Preload:
    files, links = debian_files(rootfs_tar, "iptables")  # libc6 comes along
    files["usr/bin/busybox"] = BUSYBOX.read_bytes()  # the wrapper's shell, grep and cat
    files["usr/sbin/iptables-wrapper"] = IPTABLES_WRAPPER.encode()
    links.update({f"usr/bin/{applet}": "busybox" for applet in APPLETS})
    links.update({f"usr/sbin/{command}": "iptables-wrapper" for command in _IPTABLES_COMMANDS})
    return binary_image(reference, kube_proxy, files, links)


def all_images(binaries: Mapping[str, Path], coredns: Path, pause: Path, rootfs_tar: Path) -> list[Preload]:
    """Every image of kubeadm_images(), made from the given binaries and the node's root."""
    apiserver, kcm, scheduler, proxy, dns, pause_ref, etcd = kubeadm_images()
    libc, libc_links = debian_files(rootfs_tar, "libc6")
    return [
        binary_image(apiserver, binaries[APISERVER], libc, libc_links),
        binary_image(kcm, binaries[KCM], libc, libc_links),
        binary_image(scheduler, binaries[SCHEDULER], libc, libc_links),
        kube_proxy_image(proxy, binaries[KUBE_PROXY], rootfs_tar),
        Preload(dns, {"coredns": coredns.read_bytes()}, {}, entrypoint=("/coredns",)),  # static (cgo off)
        Preload(pause_ref, {"pause": pause.read_bytes()}, {}, entrypoint=("/pause",)),  # static
        binary_image(etcd, binaries[ETCD], libc, libc_links),
    ]


def write_archive(image: Preload, directory: Path) -> Path:
    """`image` as a docker archive (what `ctr images import` reads) in `directory`."""
    layer = layer_tar(image.files, image.links, dirs=_BASE_DIRS)
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", image.reference) + ".tar"
    path = directory / name
    write_docker_archive(path, image.reference, layer, image.command, image.entrypoint, env=(PATH_ENV,))
    return path


# ----- Debian packages from the node's root


def debian_files(rootfs_tar: Path, root: str) -> tuple[dict[str, bytes], dict[str, str]]:
    """Files and symlinks of the Debian package `root` and every package it depends on, read
    from `rootfs_tar` (a debootstrap root), with paths through the merged-/usr links resolved."""
    with tarfile.open(rootfs_tar) as tar:
        members = {_normal(m.name): m for m in tar.getmembers()}
        top_links = {name: m.linkname.strip("/") for name, m in members.items() if m.issym() and "/" not in name}
        status = _read(tar, members, "var/lib/dpkg/status").decode()
        packages = dependency_closure(parse_dpkg_status(status), root)
        files: dict[str, bytes] = {}
        links: dict[str, str] = {}
        for package in sorted(packages):
            for listed in _package_list(tar, members, package):
                path = _resolve_top(listed, top_links)
                member = members.get(path)
                if member is None or member.isdir() or path.startswith(_SKIP):
                    continue
                if member.issym():
                    links[path] = member.linkname
                elif member.isfile():
                    files[path] = _read(tar, members, path)
    for name, target in top_links.items():  # /lib64/ld-linux-x86-64.so.2, the ELF interpreter, is found through them
        links[name] = target
    return files, links


def parse_dpkg_status(text: str) -> dict[str, list[list[str]]]:
    """Installed package -> its Pre-Depends and Depends, each a list of alternatives."""
    installed: dict[str, list[list[str]]] = {}
    for stanza in re.split(r"\n\s*\n", text):
        fields = dict(re.findall(r"^([A-Za-z-]+):\s*(.*(?:\n[ \t].*)*)", stanza, re.MULTILINE))
        if "Package" not in fields or "install ok installed" not in fields.get("Status", ""):
            continue
        relations = ", ".join(v for k, v in fields.items() if k in ("Pre-Depends", "Depends"))
        depends = [[re.sub(r"[\s(:].*", "", alt.strip(), flags=re.DOTALL) for alt in group.split("|")]
                   for group in relations.split(",") if group.strip()]
        installed[fields["Package"].strip()] = depends
    return installed


def dependency_closure(installed: Mapping[str, list[list[str]]], root: str) -> set[str]:
    """`root` and everything it needs, taking for each dependency the first installed alternative."""
    seen: set[str] = set()
    todo = [root]
    while todo:
        package = todo.pop()
        if package in seen or package not in installed:
            continue
        seen.add(package)
        for alternatives in installed[package]:
            todo.extend(next(([alt] for alt in alternatives if alt in installed), []))
    return seen


def _normal(name: str) -> str:
    return str(PurePosixPath(name.removeprefix("./"))).lstrip("/")


def _resolve_top(listed: str, top_links: Mapping[str, str]) -> str:
    path = listed.lstrip("/")
    first, _, rest = path.partition("/")
    return f"{top_links[first]}/{rest}" if first in top_links and rest else path


def _read(tar: tarfile.TarFile, members: Mapping[str, tarfile.TarInfo], path: str) -> bytes:
    handle = tar.extractfile(members[path])
    if handle is None:
        raise BuildError(f"{path} is not a regular file in the node's root")
    return handle.read()


def _package_list(tar: tarfile.TarFile, members: Mapping[str, tarfile.TarInfo], package: str) -> Iterable[str]:
    for name in (f"var/lib/dpkg/info/{package}.list", f"var/lib/dpkg/info/{package}:amd64.list"):
        if name in members:
            return _read(tar, members, name).decode().split("\n")
    return []


# ----- pause


def pause_source() -> Path:
    """pause.c of the Kubernetes module (the module cache holds it once the control plane is built)."""
    go = find_go()
    out = subprocess.run([go, "env", "GOMODCACHE"], capture_output=True, text=True, check=True).stdout.strip()
    source = Path(out) / f"k8s.io/kubernetes@{KUBERNETES_VERSION}" / "build/pause/linux/pause.c"
    if not source.is_file():
        raise BuildError(f"{source} is missing: build the control plane first (pykcm testenv start)")
    return source


# (Debian package, a file it installs) that compiling pause needs: gcc, and libc.a for -static.
PAUSE_BUILD_PACKAGES = (("gcc", "/usr/bin/gcc"), ("libc6-dev", "/usr/lib/x86_64-linux-gnu/libc.a"))


def cached_pause() -> bool:
    """A compiled pause of PAUSE_VERSION is cached (by its name: finding its source needs Go and the
    Kubernetes module, which a prerequisite check should not)."""
    return any(is_executable(p / "pause") for p in (cache_dir() / "images").glob(f"pause-{PAUSE_VERSION}-*"))


def ensure_pause(log: Log) -> Path:
    """A static pause binary compiled from the module's pause.c, cached by its source."""
    source = pause_source()
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:12]
    target = cache_dir() / "images" / f"pause-{PAUSE_VERSION}-{digest}"
    if is_executable(target / "pause"):
        return target / "pause"
    if shutil.which("gcc") is None:
        raise BuildError("gcc is not on PATH (the pause binary is compiled): apt-get install gcc libc6-dev")
    with locked(target.with_name(target.name + ".lock"), what="pause", log=log):
        if not is_executable(target / "pause"):
            target.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(prefix=".build-", dir=target.parent) as tmp:
                out = Path(tmp) / "pause"
                # Upstream's flags (build/pause/Makefile).
                argv = ["gcc", "-Os", "-Wall", "-Werror", "-static", f"-DVERSION=v{PAUSE_VERSION}", "-o", str(out),
                        str(source)]
                result = subprocess.run(argv, capture_output=True, text=True)
                if result.returncode != 0:
                    last = (result.stderr.strip() or "no output").splitlines()[-1]
                    raise BuildError(f"compiling pause failed: {last} (apt-get install gcc libc6-dev)")
                target.mkdir(exist_ok=True)
                os.replace(out, target / "pause")
            log(f"compiled pause {PAUSE_VERSION} -> {target / 'pause'}")
    return target / "pause"
