"""Container images made from local files, with no registry and no docker: a one-layer
FROM-scratch image written as a docker-archive tarball, which `ctr images import` reads.

The real node's images are Debian's static busybox with a few applet links: the sandbox
("pause") image runs `sleep`, and test pods use the same image for shells, `nc` and `wget`.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Mapping, Sequence
from pathlib import Path

BUSYBOX = Path("/bin/busybox")
BUSYBOX_PACKAGE = "busybox-static"
BUSYBOX_IMAGE = "pykcm.local/busybox:1"
PAUSE_IMAGE = "pykcm.local/pause:1"
APPLETS = ("sh", "sleep", "cat", "ls", "echo", "env", "nc", "wget", "test", "true", "grep", "head")
_MTIME = 1_700_000_000  # fixed mtime: the same files give the same layer digest


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def layer_tar(files: Mapping[str, bytes], links: Mapping[str, str] | None = None, dirs: Sequence[str] = ()) -> bytes:
    """An uncompressed layer: `files` (path -> content, executable), symlinks `links` (path -> target), `dirs`."""
    links = links or {}
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        # Every ancestor gets an entry of its own: an importer need not create missing parents.
        parents = {str(a) for p in (*files, *links, *dirs) for a in Path(p).parents} - {"."}
        for directory in sorted(parents | set(dirs)):
            info = tarfile.TarInfo(directory)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o1777 if directory == "tmp" else 0o755, _MTIME
            tar.addfile(info)
        for path, content in sorted(files.items()):
            info = tarfile.TarInfo(path)
            info.size, info.mode, info.mtime = len(content), 0o755, _MTIME
            tar.addfile(info, io.BytesIO(content))
        for path, target in sorted(links.items()):
            info = tarfile.TarInfo(path)
            info.type, info.linkname, info.mode, info.mtime = tarfile.SYMTYPE, target, 0o777, _MTIME
            tar.addfile(info)
    return out.getvalue()


def write_docker_archive(
    path: Path,
    name: str,
    layer: bytes,
    command: Sequence[str],
    entrypoint: Sequence[str] = (),
    env: Sequence[str] = ("PATH=/bin",),
) -> None:
    """A docker-archive (`docker save` format) of one image `name` with one layer."""
    image_config = {"Cmd": list(command), "Env": list(env), "WorkingDir": "/"}
    if entrypoint:
        image_config["Entrypoint"] = list(entrypoint)
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": image_config,
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{_sha256(layer)}"]},
        "history": [{"created_by": "pykcm testenv images.py"}],
    }
    config_bytes = json.dumps(config, sort_keys=True).encode()
    config_name = f"{_sha256(config_bytes)}.json"
    layer_name = f"{_sha256(layer)}/layer.tar"
    manifest = [{"Config": config_name, "RepoTags": [name], "Layers": [layer_name]}]
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w") as tar:
        for member, data in (
            (config_name, config_bytes),
            (layer_name, layer),
            ("manifest.json", json.dumps(manifest).encode()),
        ):
            info = tarfile.TarInfo(member)
            info.size, info.mode, info.mtime = len(data), 0o644, _MTIME
            tar.addfile(info, io.BytesIO(data))


def busybox_layer(busybox: Path = BUSYBOX) -> bytes:
    links = {f"bin/{applet}": "busybox" for applet in APPLETS}
    return layer_tar({"bin/busybox": busybox.read_bytes()}, links, dirs=("tmp", "etc", "proc", "sys", "dev"))


def write_node_images(directory: Path, busybox: Path = BUSYBOX) -> list[Path]:
    """The real node's images as archives in `directory`: the sandbox image and the busybox image."""
    layer = busybox_layer(busybox)
    pause, tools = directory / "pause.tar", directory / "busybox.tar"
    # The sandbox only has to hold the pod's namespaces open; containerd kills it on StopPodSandbox.
    write_docker_archive(pause, PAUSE_IMAGE, layer, ["/bin/sleep", "2147483647"])
    write_docker_archive(tools, BUSYBOX_IMAGE, layer, ["/bin/sh"])
    return [pause, tools]


def is_static(path: Path) -> bool:
    """An ELF file without an interpreter (PT_INTERP): it runs in an image holding nothing else."""
    data = path.read_bytes()[:4096]
    if data[:4] != b"\x7fELF" or data[4] != 2:  # 64-bit only
        return False
    phoff, phentsize, phnum = int.from_bytes(data[32:40], "little"), data[54] | data[55] << 8, data[56] | data[57] << 8
    return all(int.from_bytes(data[phoff + i * phentsize : phoff + i * phentsize + 4], "little") != 3
               for i in range(phnum))
