"""Secret bytes behind a path, for APIs that read only paths (ssl's load_cert_chain), kept off disk.

client-go builds TLS material from memory (tls.X509KeyPair); Python's ssl module loads a client
certificate and key only from paths. On Linux the bytes go to an anonymous memory file
(memfd_create), read through /proc/self/fd/<fd>: nothing is left behind on any exit, SIGKILL
and OOM kills included. The fd is close-on-exec, so no exec'd child (an exec plugin) inherits it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator


def memory_file(content: bytes, name: str) -> tuple[int, str] | None:
    """An anonymous memory file holding `content`: its fd (the caller closes it) and a path that
    reads it while the fd is open. None where the system has none (not Linux, no /proc)."""
    create = getattr(os, "memfd_create", None)
    if create is None:
        return None
    try:
        fd = create(name, os.MFD_CLOEXEC)
    except OSError:  # ENOSYS: an old kernel, or a seccomp profile refusing it
        return None
    try:
        view = memoryview(content)
        while view:
            view = view[os.write(fd, view):]
        path = f"/proc/self/fd/{fd}"
        if os.path.exists(path):
            return fd, path
    except OSError:
        pass
    os.close(fd)  # /proc not mounted: the path would not read it
    return None


@contextlib.contextmanager
def transient_path(content: bytes, name: str) -> Iterator[str]:
    """A path holding `content` for the `with` block only (for a reader that reads it once).

    An anonymous memory file where there is one. Elsewhere a 0600 file in a 0700 temporary
    directory, removed as soon as the block ends: the reader has loaded it by then, and nothing
    reads it again (the caller keeps the bytes for the next load), so only a kill inside the block
    could leave it behind."""
    memory = memory_file(content, name)
    if memory is not None:
        fd, path = memory
        try:
            yield path
        finally:
            os.close(fd)
        return
    directory = tempfile.mkdtemp(prefix=f"{name}-")
    try:
        yield private_file(directory, content)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def private_file(directory: str, content: bytes) -> str:
    """A new 0600 file in `directory` holding `content` (where there is no memory file); its path."""
    fd, path = tempfile.mkstemp(dir=directory)
    with os.fdopen(fd, "wb") as f:
        f.write(content)
    return path
