"""Local base images for building pykcm's image where no registry can be pulled from.

The project's Dockerfile defaults to the official slim Python image; here it gets a stand-in made
from Debian itself: `debootstrap --variant=minbase bookworm` with Debian's python3 and venv,
imported into the private Docker engine. A second image, for the Dockerfile's build stage only,
adds this machine's CA bundle on top so pip can reach PyPI through a TLS-inspecting proxy; the
final image never derives from it.

Both are cached: the root filesystem as a tarball under the pykcm cache, the images by a tag
that is a digest of their inputs (suite, mirror, packages, recipe; the CA bundle's content), so
they are made again only when one of those changes.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from . import hostnet
from .docker import DockerEngine
from .errors import BuildError
from .gobuild import cache_dir, locked
from .progress import Log, format_duration, run_with_progress

SUITE = "bookworm"
PACKAGES = ("python3", "python3-venv")  # python3-venv brings ensurepip, hence pip inside a venv
DEFAULT_MIRROR = "http://deb.debian.org/debian"
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
BASE_REPOSITORY = "pykcm-local/python"
BUILD_REPOSITORY = "pykcm-local/python-build"
_RECIPE = "1: minbase, docs/man/apt lists removed, LANG=C.UTF-8"
# What the root filesystem does not need at run time; the official slim image drops the same.
_PRUNE = ("usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/lintian", "var/lib/apt/lists",
          "var/cache/apt", "var/cache/debconf/templates.dat-old", "var/log")


def missing_prerequisites() -> list[str]:
    return [] if shutil.which("debootstrap") else ["debootstrap is not on PATH: apt-get install debootstrap"]


def debian_mirror(sources_dir: Path = Path("/etc/apt")) -> str:
    """The Debian mirror apt on this machine uses for the main suite (deb822 or one-line format)."""
    texts = [p.read_text(errors="replace") for p in sorted(sources_dir.glob("sources.list.d/*.sources"))]
    for text in texts:
        for stanza in re.split(r"\n\s*\n", text):
            uris = re.search(r"^URIs:\s*(\S+)", stanza, re.MULTILINE)
            suites = re.search(r"^Suites:(.*)$", stanza, re.MULTILINE)
            if uris and suites and SUITE in suites.group(1).split():
                return uris.group(1)
    one_line = [sources_dir / "sources.list", *sorted(sources_dir.glob("sources.list.d/*.list"))]
    for path in one_line:
        if path.is_file():
            match = re.search(rf"^deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+{SUITE}\s", path.read_text(), re.MULTILINE)
            if match:
                return match.group(1)
    return DEFAULT_MIRROR


def _digest(*parts: str | bytes) -> str:
    sha = hashlib.sha256()
    for part in parts:
        sha.update(part.encode() if isinstance(part, str) else part)
        sha.update(b"\0")
    return sha.hexdigest()[:12]


def ensure_base_image(engine: DockerEngine, *, log: Log, mirror: str | None = None) -> str:
    """The local stand-in for the official slim Python image, made if missing; returns its name."""
    return ensure_debian_image(
        engine, BASE_REPOSITORY, PACKAGES, recipe=_RECIPE, log=log, mirror=mirror,
        changes=("ENV LANG=C.UTF-8", 'CMD ["python3"]'), rootfs_name="python",
    )


def ensure_debian_image(
    engine: DockerEngine,
    repository: str,
    packages: Sequence[str],
    *,
    recipe: str,
    log: Log,
    mirror: str | None = None,
    changes: Sequence[str] = (),
    prepare: Callable[[Path], None] | None = None,
    rootfs_name: str = "",
) -> str:
    """`repository:<digest of its inputs>`, a Debian minbase root with `packages`, changed by
    `prepare(rootfs)`, imported with `docker import --change CHANGE...`; `recipe` names what
    `prepare` and `changes` do (its digest is the tag, so a new recipe makes a new image)."""
    mirror = mirror or debian_mirror()
    name = f"{repository}:{_digest(SUITE, mirror, *packages, recipe)}"
    if engine.image_exists(name):
        return name
    rootfs_tar = ensure_rootfs_tarball(packages, recipe=recipe, log=log, mirror=mirror, prepare=prepare,
                                       name=rootfs_name or repository.rsplit("/", 1)[-1])
    started = time.monotonic()
    change_args = [arg for change in changes for arg in ("--change", change)]
    engine.docker("import", *change_args, "--message", f"debootstrap {SUITE} minbase + {' '.join(packages)}",
                  str(rootfs_tar), name, timeout=900)
    log(f"imported {name} in {format_duration(time.monotonic() - started)}")
    return name


def ensure_rootfs_tarball(
    packages: Sequence[str],
    *,
    recipe: str,
    log: Log,
    mirror: str | None = None,
    prepare: Callable[[Path], None] | None = None,
    name: str = "debian",
) -> Path:
    """The cached tarball of a Debian minbase root with `packages`, made (debootstrap) if missing."""
    mirror = mirror or debian_mirror()
    rootfs_tar = cache_dir() / "images" / f"debian-{SUITE}-{name}-{_digest(SUITE, mirror, *packages, recipe)}.tar"
    with locked(rootfs_tar.with_suffix(".lock"), log=log):
        if not rootfs_tar.is_file():
            _debootstrap_tarball(rootfs_tar, mirror, packages, log, prepare)
    return rootfs_tar


def ensure_build_image(engine: DockerEngine, base: str, *, log: Log, ca_bundle: Path = HOST_CA_BUNDLE) -> str:
    """`base` plus this machine's CA bundle, trusted by pip: for the Dockerfile's build stage only."""
    if not ca_bundle.is_file():
        raise BuildError(f"{ca_bundle} does not exist: apt-get install ca-certificates")
    bundle = ca_bundle.read_bytes()
    name = f"{BUILD_REPOSITORY}:{_digest(base, bundle)}"
    if engine.image_exists(name):
        return name
    with tempfile.TemporaryDirectory(prefix="pykcm-build-base-") as tmp:
        context = Path(tmp)
        (context / "ca-certificates.crt").write_bytes(bundle)
        (context / "Dockerfile").write_text(
            f"FROM {base}\n"
            f"COPY ca-certificates.crt {HOST_CA_BUNDLE}\n"
            f"ENV PIP_CERT={HOST_CA_BUNDLE} SSL_CERT_FILE={HOST_CA_BUNDLE}\n"
        )
        engine.docker("build", "--quiet", "--tag", name, str(context))
    log(f"made {name}: {base} trusting {ca_bundle}, for build stages only")
    return name


def _debootstrap_tarball(
    target: Path, mirror: str, packages: Sequence[str], log: Log, prepare: Callable[[Path], None] | None
) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    log_path = target.with_suffix(".debootstrap.log")
    log(f"making a Debian {SUITE} root filesystem with {', '.join(packages)} from {mirror} "
        f"(one-time, a minute or two); log: {log_path}")
    started = time.monotonic()
    counts = {"fetched": 0, "unpacked": 0}

    def count(line: str) -> None:
        if line.startswith("I: Retrieving "):
            counts["fetched"] += 1
        elif line.startswith(("I: Unpacking ", "I: Configuring ")):
            counts["unpacked"] += 1

    # Not TemporaryDirectory: its cleanup would recurse into a /proc or /sys that an interrupted
    # debootstrap left mounted in the target (and chmod host sysfs entries); remove_tree unmounts first.
    tmp = Path(tempfile.mkdtemp(prefix=".rootfs-", dir=target.parent))
    try:
        rootfs = tmp / "rootfs"
        run_with_progress(
            ["debootstrap", "--variant=minbase", f"--include={','.join(packages)}", SUITE, str(rootfs), mirror],
            what="debootstrap", log_path=log_path, log=log, on_line=count,
            status=lambda: f"{counts['fetched']} packages fetched, {counts['unpacked']} unpacked or configured",
        )
        for relative in _PRUNE:
            path = rootfs / relative
            if path.is_dir():
                shutil.rmtree(path)
                path.mkdir()
        if prepare is not None:
            prepare(rootfs)
        partial = tmp / "rootfs.tar"
        subprocess.run(["tar", "--numeric-owner", "-C", str(rootfs), "-cf", str(partial), "."], check=True)
        partial.replace(target)
    finally:
        hostnet.remove_tree(tmp)
    log(f"made the Debian {SUITE} root filesystem in {format_duration(time.monotonic() - started)} "
        f"({target.stat().st_size / 2**20:.0f} MiB) -> {target}")
