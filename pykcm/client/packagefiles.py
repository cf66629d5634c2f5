"""The `kubernetes` package's files of inline TLS material, kept in memory.

For exec and auth-provider users the package turns inline material into files: an exec plugin's
clientCertificateData/clientKeyData, the kubeconfig's *-data, an OIDC issuer's CA. It writes them
with `_create_temp_file_with_content` to /tmp/tmpXXXXXXXX, removed only by its atexit, so a killed
pykcm left the client key there. client-go keeps them in memory. That function is replaced (once
per process) by `PackageFiles`, which gives the package paths to anonymous memory files instead;
after a load pykcm takes the bytes (`content`) and releases the files it took (`release`).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile
import threading
from types import ModuleType

from pykcm.util.log import get_logger
from pykcm.util.memfile import memory_file, private_file

log = get_logger("client-config")
_FUNCTION = "_create_temp_file_with_content"  # kubernetes/config/kube_config.py


class PackageFiles:
    """Stands in for the package's `_create_temp_file_with_content(content, temp_file_path, force_recreate)`.

    Like it, one file per distinct content, reused until released. Where there are no memory
    files (not Linux), a 0600 file in this process's 0700 temporary directory, as the package's
    own; `release` removes it at once, pykcm keeping the bytes (the package re-creates a file
    it finds missing), and the directory goes at exit."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._paths: dict[bytes, str] = {}  # content -> path
        self._files: dict[str, tuple[bytes, int | None]] = {}  # path -> content, the memory file's fd
        self._holders: dict[str, int] = {}  # path -> how many calls handed it out and were not released
        self._directory: str | None = None

    def __call__(self, content: str | bytes, temp_file_path: str | None = None, force_recreate: bool = False) -> str:
        data = content.encode() if isinstance(content, str) else bytes(content)
        with self._lock:
            if not force_recreate and data in self._paths:
                path = self._paths[data]
                self._holders[path] += 1  # shared: released only when every holder has released it
                return path
            memory = memory_file(data, "pykcm-kubeconfig")
            fd, path = memory if memory is not None else (None, self._disk_file(data))
            self._paths[data] = path
            self._files[path] = (data, fd)
            self._holders[path] = 1
            return path

    def content(self, path: str | None) -> bytes | None:
        """The bytes behind `path` if this made it, else None (a file the kubeconfig names)."""
        with self._lock:
            entry = self._files.get(path) if path else None
            return entry[0] if entry else None

    def release(self, *paths: str | None) -> None:
        """Close (or remove) the files at `paths` that this made, once no other holder has them: their
        bytes were taken."""
        with self._lock:
            for path in paths:
                if path is None or path not in self._files:
                    continue
                self._holders[path] -= 1
                if self._holders[path] > 0:  # another load still reads it: its fd number must not be reused
                    continue
                del self._holders[path]
                data, fd = self._files.pop(path)
                if self._paths.get(data) == path:
                    del self._paths[data]
                if fd is not None:
                    os.close(fd)
                else:
                    with contextlib.suppress(OSError):
                        os.remove(path)

    def _disk_file(self, data: bytes) -> str:
        if self._directory is None:
            self._directory = tempfile.mkdtemp(prefix="pykcm-kubeconfig-")
            atexit.register(shutil.rmtree, self._directory, True)
        return private_file(self._directory, data)


_installed: PackageFiles | None = None
_installing = threading.Lock()


def package_files(kube_config: ModuleType) -> PackageFiles | None:
    """The `PackageFiles` the package's `kube_config` module writes through, installed on first use.
    None if the package has no such function (a release that changed it): it then writes as it will."""
    global _installed
    with _installing:
        if _installed is None:
            if not callable(getattr(kube_config, _FUNCTION, None)):
                log.warning("The kubernetes package may write inline TLS material to temporary files",
                            function=_FUNCTION)
                return None
            _installed = PackageFiles()
        if getattr(kube_config, _FUNCTION, None) is not _installed:
            setattr(kube_config, _FUNCTION, _installed)
        return _installed
