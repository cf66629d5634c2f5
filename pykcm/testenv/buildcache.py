"""Which cached Kubernetes binaries are still good for the Go module in `gomod/`.

Binaries are cached one per file in a directory per Kubernetes version, each beside a stamp
(`<name>.stamp`, JSON) holding the hash of its wrapper (`gomod/<name>/*.go`) and the module
versions it was linked from, read from the Go build information inside the binary. A binary is
reused while its wrapper is unchanged and go.mod still selects every module it was linked from.
So adding a wrapper, or a requirement that only a new binary needs, rebuilds nothing else.

Binaries built before stamps existed (directories named `<version>-<hash of all module files>`)
are adopted the same way: hard-linked in and stamped if their build information matches go.mod.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import mmap
import os
import re
import shutil
from pathlib import Path

from .gobuild import is_built, is_executable, publish

STAMP_SUFFIX = ".stamp"
_BUILDINFO_MAGIC = b"\xff Go buildinf:"
_MODINFO_START = bytes.fromhex("3077af0c9274080241e1c107e6d618e6")
_MODINFO_END = bytes.fromhex("f932433186182072008242104116d8f2")


def wrapper_hash(gomod: Path, name: str) -> str:
    digest = hashlib.sha256()
    for path in sorted((gomod / name).glob("*.go")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def selected_modules(go_mod: str) -> dict[str, str]:
    """module path -> 'version' or 'version => replacement [version]', as go.mod selects them."""
    required: dict[str, str] = {}
    replaced: dict[str, str] = {}
    block = ""
    for raw in go_mod.splitlines():
        line = raw.split("//", 1)[0].strip()
        if not line:
            continue
        if line.endswith("("):
            block = line[:-1].strip()
            continue
        if line == ")":
            block = ""
            continue
        words = line.split()
        directive = block or words[0]
        entry = words if block else words[1:]
        if directive == "require" and len(entry) == 2:
            required[entry[0]] = entry[1]
        elif directive == "replace" and "=>" in entry:
            old, new = " ".join(entry).split("=>")
            replaced[old.split()[0]] = new.strip()
    return {path: f"{version} => {replaced[path]}" if path in replaced else version
            for path, version in required.items()}


def linked_modules(binary: Path) -> dict[str, str] | None:
    """The modules a Go binary was linked from (as `go version -m` shows them), None if unreadable."""
    try:
        with open(binary, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
            at = data.find(_BUILDINFO_MAGIC)
            start = data.find(_MODINFO_START, at) if at >= 0 else -1
            end = data.find(_MODINFO_END, start) if start >= 0 else -1
            if end < 0:
                return None
            text = data[start + len(_MODINFO_START) : end].decode(errors="replace")
    except (OSError, ValueError):
        return None
    modules: dict[str, str] = {}
    last = ""
    for line in text.splitlines():
        fields = line.split("\t")
        if fields[0] == "dep" and len(fields) >= 3:
            last = fields[1]
            modules[last] = fields[2]
        elif fields[0] == "=>" and last and len(fields) >= 2:
            modules[last] += " => " + " ".join(f for f in fields[1:3] if f)
    return modules


def _stamp_path(binary: Path) -> Path:
    return binary.with_name(binary.name + STAMP_SUFFIX)


def is_current(binary: Path, wrapper: str, selection: dict[str, str]) -> bool:
    """Whether `binary` exists, was built from this wrapper and from modules go.mod still selects."""
    if not is_built(binary):
        return False
    try:
        stamp = json.loads(_stamp_path(binary).read_text())
    except (OSError, ValueError):
        return False
    return stamp.get("wrapper") == wrapper and _matches(stamp.get("modules") or {}, selection)


def _matches(linked: dict[str, str], selection: dict[str, str]) -> bool:
    return bool(linked) and all(selection.get(path) == version for path, version in linked.items())


def write_stamp(binary: Path, wrapper: str) -> None:
    """Stamp a freshly built binary; raises OSError when its build information is unreadable."""
    modules = linked_modules(binary)
    if not modules:
        raise OSError(f"{binary} carries no Go build information")
    tmp = _stamp_path(binary).with_suffix(".tmp")
    tmp.write_text(json.dumps({"wrapper": wrapper, "modules": modules}, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, _stamp_path(binary))


def adopt_legacy(target: Path, name: str, wrapper: str, selection: dict[str, str]) -> bool:
    """Link `name` into `target` from a pre-stamp cache directory beside it (`<target>-<hash>`)
    when its build information matches go.mod; True if it is now current in `target`."""
    pattern = re.compile(re.escape(target.name) + r"-[0-9a-f]{12}")
    candidates = sorted(p for p in target.parent.glob(f"{target.name}-*") if pattern.fullmatch(p.name))
    for legacy in candidates:
        source = legacy / name
        modules = linked_modules(source) if is_executable(source) else None
        if modules is None or not _matches(modules, selection):
            continue
        target.mkdir(parents=True, exist_ok=True)
        tmp = target / f".{name}.adopt"
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        try:
            os.link(source, tmp)  # no copy of ~100 MB when on one filesystem
        except OSError:
            shutil.copy2(source, tmp)
        publish(tmp, target / name)
        write_stamp(target / name, wrapper)
        return True
    return False
