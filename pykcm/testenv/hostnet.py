"""The host-side network and mounts of the local cluster's real node, and their removal.

Everything here is undone by `pykcm testenv stop`: the dummy interface holding the node's
address, the pod veths, the node's iptables chain, the KUBE-* chains kubelet and kube-proxy
add, the ip_forward setting the CNI plugin turns on, and the mounts under the node's dirs.
remove_tree() is the dev tooling's too: a directory something may have mounted into (dockerd's
runtime directory, a debootstrap target) is removed without ever recursing into a mount.
"""

from __future__ import annotations

import ipaddress
import json
import re
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path

from .errors import ControlPlaneError

DUMMY_INTERFACE = "pykcm0"
CHAIN = "PYKCM-REALNODE"
IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")
IPTABLES = {4: "iptables", 6: "ip6tables"}
TABLES = ("filter", "nat", "mangle", "raw")
_CHAIN_LINE = re.compile(r"^:(\S+) ")


def run(argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a host tool; a failure is one line naming the command and its complaint."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ControlPlaneError(f"{' '.join(argv)} failed: {exc}") from None
    if check and done.returncode != 0:
        reason = (done.stderr or done.stdout).strip().splitlines()
        raise ControlPlaneError(f"{' '.join(argv)} failed: {reason[-1] if reason else f'exit {done.returncode}'}")
    return done


# ----- the node's address


def add_dummy_address(address: str) -> None:
    """Give the host `address` on an interface of its own: routable from the pods' network
    namespaces (unlike 127.0.0.1) and reachable from nowhere else."""
    # Kernels without the dummy module (no modules at all in some VMs) have bridges: one
    # without ports holds a local address just as well.
    exists = run(["ip", "link", "show", DUMMY_INTERFACE], check=False).returncode == 0
    if not exists and run(["ip", "link", "add", DUMMY_INTERFACE, "type", "dummy"], check=False).returncode != 0:
        run(["ip", "link", "add", DUMMY_INTERFACE, "type", "bridge"])
    run(["ip", "addr", "replace", f"{address}/32", "dev", DUMMY_INTERFACE])
    run(["ip", "link", "set", DUMMY_INTERFACE, "up"])


def remove_interfaces(pod_cidr: str) -> list[str]:
    """Delete the dummy interface and every leftover veth holding an address in `pod_cidr` (the
    host end of a pod's ptp pair); the names removed."""
    network = ipaddress.ip_network(pod_cidr)
    links = json.loads(run(["ip", "-j", "addr", "show"]).stdout or "[]")
    doomed = []
    for link in links:
        name = link.get("ifname", "")
        addresses = [a.get("local", "") for a in link.get("addr_info", []) if a.get("family") == "inet"]
        if name == DUMMY_INTERFACE or any(ipaddress.ip_address(a) in network for a in addresses if a):
            doomed.append(name)
    for name in doomed:
        run(["ip", "link", "delete", name], check=False)
    return doomed


# ----- iptables


def chains(family: int) -> dict[str, set[str]]:
    """table -> chain names, of one address family."""
    found: dict[str, set[str]] = {}
    for table in TABLES:
        done = run([f"{IPTABLES[family]}-save", "-t", table], check=False)
        found[table] = {m[1] for line in done.stdout.splitlines() if (m := _CHAIN_LINE.match(line))}
    return found


def install_forward_guard(pod_cidr: str) -> None:
    """Pods may talk to each other and to this host, never beyond: the CNI plugin turns on
    forwarding, and test traffic must stay on this machine."""
    install_chain(4, CHAIN, [["-s", pod_cidr, "-d", pod_cidr, "-j", "RETURN"], ["-s", pod_cidr, "-j", "DROP"]])


def install_chain(family: int, chain: str, rules: Sequence[Sequence[str]]) -> None:
    """`chain` in filter holding exactly `rules`, jumped to first from FORWARD."""
    ipt = IPTABLES[family]
    if run([ipt, "-t", "filter", "-n", "-L", chain], check=False).returncode != 0:
        run([ipt, "-t", "filter", "-N", chain])
    run([ipt, "-t", "filter", "-F", chain])
    for rule in rules:
        run([ipt, "-t", "filter", "-A", chain, *rule])
    if run([ipt, "-t", "filter", "-C", "FORWARD", "-j", chain], check=False).returncode != 0:
        run([ipt, "-t", "filter", "-I", "FORWARD", "1", "-j", chain])


def remove_chain(family: int, chain: str) -> None:
    """Undo install_chain (nothing if it is not there)."""
    ipt = IPTABLES[family]
    while run([ipt, "-t", "filter", "-D", "FORWARD", "-j", chain], check=False).returncode == 0:
        pass
    run([ipt, "-t", "filter", "-F", chain], check=False)
    run([ipt, "-t", "filter", "-X", chain], check=False)


def remove_chains(family: int, before: dict[str, Iterable[str]]) -> list[str]:
    """Remove this node's chains of one family: ours, and the KUBE-* ones (kubelet's, kube-proxy's)
    that did not exist before the node started; first every rule jumping to them."""
    ipt = IPTABLES[family]
    removed = []
    for table in TABLES:
        saved = run([f"{ipt}-save", "-t", table], check=False).stdout.splitlines()
        existing = {m[1] for line in saved if (m := _CHAIN_LINE.match(line))}
        ours = {c for c in existing - set(before.get(table, ())) if c.startswith("KUBE-") or c == CHAIN}
        if not ours:
            continue
        for line in saved:
            words = line.split()
            if len(words) > 2 and words[0] == "-A" and words[1] not in ours and _jumps_to(words, ours):
                run([ipt, "-t", table, "-D", *words[1:]], check=False)
        for chain in sorted(ours):
            run([ipt, "-t", table, "-F", chain], check=False)
        for chain in sorted(ours):
            run([ipt, "-t", table, "-X", chain], check=False)
            removed.append(f"{family}/{table}/{chain}")
    return removed


def _jumps_to(words: list[str], targets: set[str]) -> bool:
    return any(w in ("-j", "-g") and i + 1 < len(words) and words[i + 1] in targets for i, w in enumerate(words))


# ----- forwarding


def ip_forward() -> str:
    return IP_FORWARD.read_text().strip()


def restore_ip_forward(value: str) -> None:
    if value and ip_forward() != value:
        IP_FORWARD.write_text(value + "\n")


# ----- mounts


def mounts_under(*roots: Path) -> list[str]:
    """Mount points at or below `roots`, deepest first (the order to unmount them in)."""
    prefixes = [str(root.resolve()) for root in roots]
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if any(point == p or point.startswith(p + "/") for p in prefixes):
            found.append(point)
    return sorted(set(found), key=lambda p: p.count("/"), reverse=True)


def unmount_all(*roots: Path) -> list[str]:
    """Unmount (lazily, so a busy one still goes) everything at or below `roots`."""
    points = mounts_under(*roots)
    for point in points:
        run(["umount", "-l", point], check=False)
    return points


def remove_tree(root: Path) -> None:
    """Remove `root` and everything below it, after lazily unmounting whatever is mounted there.
    A mount that stays (umount failed) is never recursed into: removing through it would delete
    what it shows (a host /sys, a bind-mounted directory), so that raises instead, naming it."""
    if root.is_symlink():  # only the link is ours: its target's mounts and files are not
        root.unlink()
        return
    if not root.exists():
        return
    unmount_all(root)
    if left := mounts_under(root):
        raise ControlPlaneError(f"{left[-1]} is still mounted: not removing {root}")
    shutil.rmtree(root)
