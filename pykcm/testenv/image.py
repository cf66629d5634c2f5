"""pykcm's container image, built here: the checkout's Dockerfile with BASE_IMAGE pointed at the
local Debian stand-in for the official slim Python image (see baseimage.py), built by the private
Docker engine (docker.py), and saved with `docker save` as a tarball a node's containerd imports
(`ctr -n k8s.io images import FILE`)."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from . import baseimage, docker
from .docker import DockerEngine
from .errors import BuildError
from .progress import Log, format_duration, run_with_progress

DEFAULT_NAME = "docker.io/library/pykcm:dev"  # the full name a pod's `image:` uses for `pykcm:dev`
BUILD_STAGE = "pykcm-local/pykcm-build-stage:latest"


@dataclass(frozen=True)
class Layer:
    size: int  # bytes
    created_by: str


@dataclass(frozen=True)
class Image:
    name: str
    id: str
    size: int  # bytes, uncompressed, as `docker images` counts it
    base: str
    layers: tuple[Layer, ...]

    def describe(self) -> str:
        return f"{self.name} ({self.id[7:19]}, {self.size / 1e6:.1f} MB, on {self.base})"


def missing_prerequisites() -> list[str]:
    """One line per missing prerequisite (root, docker.io, debootstrap); empty when all are there."""
    return docker.missing_prerequisites() + baseimage.missing_prerequisites()


def build(engine: DockerEngine, checkout: Path, *, log: Log, name: str = DEFAULT_NAME) -> Image:
    """Build the checkout's Dockerfile into `name` on the local base images; returns what was built."""
    _check_checkout(checkout)
    base = baseimage.ensure_base_image(engine, log=log)
    build_base = baseimage.ensure_build_image(engine, base, log=log)
    log_dir = engine.directory / "logs"  # the engine's: a build on another engine writes its own
    log(f"building {name} from {checkout} on {base}; logs: {log_dir}/pykcm-*.build.log")
    started = time.monotonic()
    args = [f"--build-arg=BASE_IMAGE={base}", f"--build-arg=BUILD_IMAGE={build_base}", str(checkout)]
    # The build stage gets a tag of its own, so that pruning what a rebuild left dangling (the
    # previous image, the previous build stage's last layers) keeps the cache of its dependencies.
    for tag, target, log_name in ((BUILD_STAGE, ["--target=build"], "pykcm-build-stage"), (name, [], "pykcm-image")):
        _docker_build([docker.docker_cli(), "build", "--network=host", "--force-rm", f"--tag={tag}", *target, *args],
                      f"docker build {tag}", engine, log_dir / f"{log_name}.build.log", log)
    engine.docker("image", "prune", "--force")
    image = inspect(engine, name, base=base)
    log(f"built {image.describe()} in {format_duration(time.monotonic() - started)}")
    return image


def _check_checkout(checkout: Path) -> None:
    if not (checkout / "Dockerfile").is_file() or not (checkout / "pyproject.toml").is_file():
        raise BuildError(f"{checkout} has no Dockerfile and pyproject.toml: pass the root of a pykcm checkout")


def _docker_build(argv: list[str], what: str, engine: DockerEngine, log_path: Path, log: Log) -> None:
    steps = {"done": 0, "cached": 0}

    def count(line: str) -> None:
        if line.startswith("Step "):
            steps["done"] += 1
        elif "Using cache" in line:
            steps["cached"] += 1

    run_with_progress(argv, what=what, log_path=log_path, log=log, env=engine.env(), on_line=count,
                      status=lambda: f"step {steps['done']} ({steps['cached']} from cache)")


def inspect(engine: DockerEngine, name: str, *, base: str = "") -> Image:
    info = json.loads(engine.docker("image", "inspect", name).stdout)[0]
    history = engine.docker("history", "--no-trunc", "--human=false", "--format", "{{json .}}", name).stdout
    entries = [json.loads(line) for line in history.splitlines() if line.strip()]
    layers = tuple(Layer(int(entry["Size"]), entry["CreatedBy"]) for entry in entries)
    return Image(name, info["Id"], int(info["Size"]), base, layers)


def check_save_target(target: Path) -> None:
    """Refuse, in one line, a `--save` path that save() could not write: before minutes of building."""
    if target.is_dir():
        raise BuildError(f"--save {target} is a directory: pass the tarball's file name")
    existing = next(p for p in (target.parent.absolute(), *target.parent.absolute().parents) if p.exists())
    if not existing.is_dir():
        raise BuildError(f"--save {target}: {existing} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise BuildError(f"--save {target}: {existing} is not writable")


def save(engine: DockerEngine, name: str, target: Path, *, log: Log) -> Path:
    """`docker save` the image to `target` (written atomically): the tarball a containerd imports."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    started = time.monotonic()
    engine.docker("save", "--output", str(partial), name, timeout=600)
    partial.replace(target)
    log(f"saved {name} to {target} ({target.stat().st_size / 2**20:.0f} MiB) in "
        f"{format_duration(time.monotonic() - started)}")
    return target


def layer_table(image: Image) -> str:
    """The image's layers, newest first, as `docker history` shows them: size and instruction."""
    rows = []
    for layer in image.layers:
        instruction = layer.created_by.removeprefix("/bin/sh -c ").removeprefix("#(nop) ").strip()
        rows.append(f"{layer.size / 1e6:8.1f} MB  {' '.join(instruction.split())[:100]}")
    return "\n".join(rows)


@contextlib.contextmanager
def built(checkout: Path, *, log: Log, directory: Path | None = None, name: str = DEFAULT_NAME, wait: float = 0.0
          ) -> Iterator[tuple[DockerEngine, Image]]:
    """A private engine holding pykcm's freshly built image, stopped on exit (`wait`: see docker.start)."""
    missing = missing_prerequisites()
    if missing:
        raise BuildError("; ".join(missing))
    _check_checkout(checkout)
    with docker.running(directory, log=log, wait=wait) as engine:
        yield engine, build(engine, checkout, log=log, name=name)
