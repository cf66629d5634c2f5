"""The upstream e2e tests' container images, made here: no registry is reachable.

The tests that run containers use two images (`e2e.test --list-images` names every one):
agnhost, Kubernetes' test server (serve-hostname, mounttest, inclusterclient,
test-service-account-issuer-discovery), and busybox. agnhost is built from its source in the
e2e module (`gomod-e2e/images/` pins it, so that module's go.sum covers it) with e2e.test's
settings (cgo on), so every package comes from e2e.test's build cache and only the static link
is new (seconds, where a CGO-off build compiled ~780 packages again: 8-9 minutes), and written
as a FROM-scratch image holding the one static binary; busybox is the real node's
FROM-scratch busybox. Both carry the names e2e.test expects, so its pods find them in the real
node's containerd without pulling (their pull policy is IfNotPresent).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from .e2e import E2E_GOMOD_DIR, e2e_source_hash
from .errors import BuildError
from .gobuild import Log, build_dir, built_once, cache_dir, find_go, format_duration, is_executable, publish, run_go
from .images import busybox_layer, layer_tar, write_docker_archive

AGNHOST_PACKAGE = "k8s.io/kubernetes/test/images/agnhost"
AGNHOST_VERSION = "2.63.0"  # test/images/agnhost/VERSION at v1.36.3
# test/utils/image/manifest.go at v1.36.3: the names and tags e2e.test asks for.
AGNHOST_IMAGE = f"registry.k8s.io/e2e-test-images/agnhost:{AGNHOST_VERSION}"
BUSYBOX_IMAGE = "registry.k8s.io/e2e-test-images/busybox:1.37.0-1"


def ensure_agnhost(log: Log = print) -> Path:
    """The path of a static agnhost, building it on first use (seconds once e2e.test is built:
    its packages are e2e.test's)."""
    target = cache_dir() / "images" / f"agnhost-{AGNHOST_VERSION}-{e2e_source_hash()}-static-cgo"
    return built_once(target / "agnhost", lambda directory: _build_agnhost(directory, log), log)


def _build_agnhost(target: Path, log: Log) -> None:
    go = find_go()
    log_path = target.with_name(target.name + ".build.log")
    log(f"building agnhost {AGNHOST_VERSION} from {AGNHOST_PACKAGE} (seconds once e2e.test is built); "
        f"log: {log_path}")
    started = time.monotonic()
    with build_dir(target) as tmp:
        src, out = tmp / "src", tmp / "bin" / "agnhost"
        shutil.copytree(E2E_GOMOD_DIR, src)  # the installed package may be read-only
        env = {"GOFLAGS": "-mod=readonly"}  # e2e.test's settings: its compiled packages are reused
        # Linked statically by the C linker: the image holds nothing else (no libc). Name lookups
        # use Go's resolver (no nsswitch.conf in the image); the tests only dial addresses.
        ldflags = "-s -w -linkmode external -extldflags -static"
        run_go([go, "build", "-v", "-trimpath", "-ldflags", ldflags, "-o", str(out), AGNHOST_PACKAGE],
               what="agnhost", cwd=src, temp=tmp, log_path=log_path, log=log, env=env)
        if not is_executable(out):
            raise BuildError(f"go build finished without producing agnhost; see {log_path}")
        target.mkdir(parents=True, exist_ok=True)
        publish(out, target / "agnhost")
    log(f"built agnhost {AGNHOST_VERSION} in {format_duration(time.monotonic() - started)} -> {target}")


def write_e2e_images(directory: Path, agnhost: Path) -> list[Path]:
    """The e2e tests' images as docker archives in `directory`, for `ctr images import`."""
    agnhost_tar, busybox_tar = directory / "agnhost.tar", directory / "e2e-busybox.tar"
    # As upstream's image: agnhost is the entrypoint and a test's args name the subcommand.
    layer = layer_tar({"agnhost": agnhost.read_bytes()}, dirs=("tmp", "etc", "proc", "sys", "dev"))
    write_docker_archive(agnhost_tar, AGNHOST_IMAGE, layer, ["pause"], entrypoint=["/agnhost"])
    write_docker_archive(busybox_tar, BUSYBOX_IMAGE, busybox_layer(), ["/bin/sh"])
    return [agnhost_tar, busybox_tar]
