"""The kind node's Debian root: debootstrap's minbase with what a kind node runs (systemd,
containerd, iptables, CNI plugins, the tools kind's entrypoint and hooks call), trimmed the way
kind's base image is, so that systemd in a container starts only what a node needs."""

from __future__ import annotations

from pathlib import Path

from .. import baseimage
from ..docker import DockerEngine
from ..progress import Log

REPOSITORY = "pykcm-local/kind-base"
PACKAGES = (
    "systemd",  # the node's init: kind's entrypoint execs /sbin/init
    "containerd",  # 1.6.20, as the real node; Debian's runc comes along unused (runc v1.5.2 replaces it)
    "containernetworking-plugins",  # ptp, host-local, portmap, loopback
    "iptables",  # legacy and nft; kind's entrypoint picks the one the host uses
    "conntrack",
    "iproute2",
    "kmod",
    "libseccomp2",  # runc v1.5.2 links it
    "ca-certificates",
    "jq",  # kind's createContainer hook (mount-product-files.sh) reads the OCI state with it
    "procps",
)
# What prepare_root does; a change here makes a new root (its digest is the base image's tag).
RECIPE = "kind-base 1: no units wanted but the node's, journald without kmsg, /sbin/init is systemd"
_UNWANTED = (  # as kind's base image: nothing starts unless the node needs it
    "lib/systemd/system/multi-user.target.wants",
    "lib/systemd/system/local-fs.target.wants",
    "lib/systemd/system/basic.target.wants",
)


def ensure_base(engine: DockerEngine, *, log: Log) -> str:
    """The node's Debian root as an image in `engine` (debootstrap once, then cached)."""
    return baseimage.ensure_debian_image(
        engine, REPOSITORY, PACKAGES, recipe=RECIPE, log=log, prepare=prepare_root, rootfs_name="kind-node",
    )


def rootfs_tarball(log: Log) -> Path:
    """The cached tarball behind ensure_base's image (kube-proxy's image takes iptables from it)."""
    return baseimage.ensure_rootfs_tarball(PACKAGES, recipe=RECIPE, log=log, prepare=prepare_root,
                                           name="kind-node")


def prepare_root(rootfs: Path) -> None:
    for wants in _UNWANTED:
        _empty(rootfs / wants)
    for wants in (rootfs / "etc/systemd/system").glob("*.wants"):
        _empty(wants)
    sysinit = rootfs / "lib/systemd/system/sysinit.target.wants"
    (sysinit / "systemd-tmpfiles-setup.service").unlink(missing_ok=True)
    sockets = rootfs / "lib/systemd/system/sockets.target.wants"
    for socket in [*sockets.glob("*udev*"), *sockets.glob("*initctl*")]:
        socket.unlink()
    # The kernel log is the host's: a node's journal should not repeat it.
    with open(rootfs / "etc/systemd/journald.conf", "a") as conf:
        conf.write("ReadKMsg=no\n")
    init = rootfs / "usr/sbin/init"
    init.unlink(missing_ok=True)
    init.symlink_to("/usr/lib/systemd/systemd")


def _empty(directory: Path) -> None:
    if directory.is_dir():
        for entry in directory.iterdir():
            entry.unlink()
