"""The secure port's TLS content, reloaded while serving, as the apiserver's dynamiccertificates
package does it for KCM:

- the serving pair from --tls-cert-file/--tls-private-key-file (DynamicCertKeyPairContent):
  re-read when the files change (their stat is checked every second, where Go uses fsnotify)
  and at least every minute; a pair that does not load is logged and the old one is served;
- the client CA from --client-ca-file (DynamicFileCAContent): re-read as the serving files are;
  a file that does not load is logged and the old CA is trusted;
- else the client CA from kube-system/extension-apiserver-authentication (ConfigMapCAController):
  re-read every minute; a failed read keeps the current CA.

Every handshake takes the current content: the listening context's SNI callback, which OpenSSL
calls with or without a server name, swaps in a context built from it. The verify mode is the
listening context's (OpenSSL keeps it per connection), so it follows whether a CA is known.
"""

from __future__ import annotations

import asyncio
import os
import ssl
import time
from collections.abc import Awaitable, Callable

from pykcm.client.errors import ApiError, TransportError
from pykcm.serving.certs import ServingError, load_in_memory_pair, read_client_ca_file, self_signed_certificate
from pykcm.serving.tlspolicy import TLSPolicy
from pykcm.util.errors import os_error_message
from pykcm.util.log import get_logger, one_line
from pykcm.util.pem import pem_pair_problem

FILE_CHECK = 1.0  # seconds between stats of the serving files and the client CA file
FILE_REFRESH = 60.0  # the files are re-read at least this often (Go's FileRefreshDuration)
CLIENT_CA_REFRESH = 60.0  # the client CA ConfigMap is re-read this often

log = get_logger("dynamic-serving")

FetchCA = Callable[[], Awaitable[str | None]]
FileStat = tuple[tuple[int, int, int], ...]


class DynamicServingTLS:
    def __init__(
        self, cert_file: str | None, key_file: str | None, bind_address: str, client_ca: str | None,
        policy: TLSPolicy | None = None, client_ca_file: str | None = None,
    ) -> None:
        """`client_ca_file` (--client-ca-file), when given, is the only client CA: `client_ca` is not used.
        Without a serving pair a self-signed one is made: two RSA keys, so not on the event loop."""
        self._policy = policy or TLSPolicy()  # --tls-min-version and --tls-cipher-suites, on every context
        self.cert_file = cert_file if cert_file and key_file else None
        self.key_file = key_file if cert_file and key_file else None
        self.client_ca_file = client_ca_file or None
        if self.client_ca_file is not None:
            try:  # KCM's NewDynamicCAContentFromFile: a file that does not load stops the start
                client_ca = read_client_ca_file(self.client_ca_file)
            except (OSError, ValueError) as err:
                reason = os_error_message(err) if isinstance(err, OSError) else str(err)
                raise ServingError(f"unable to load client CA provider: {reason}") from None
        try:
            if self.cert_file is None:
                self._pair = self_signed_certificate(bind_address)
                log.info("Generated self-signed cert in-memory")
            else:
                self._pair = self._read_pair()
            self._client_ca = client_ca
            self._current = self._build(self._pair, client_ca)
            self.context = self._listening_context()
        except (OSError, ValueError) as err:  # ssl.SSLError is an OSError
            reason = os_error_message(err) if isinstance(err, OSError) else str(err)
            raise ServingError(f"invalid serving certificate: {reason}") from None
        self._stat = _file_stat(self.cert_file, self.key_file)
        self._ca_stat = _file_stat(self.client_ca_file)

    # -- content --------------------------------------------------------------------------------------

    def reload_pair(self) -> bool:
        """Re-read the serving files; True if a new, valid pair is now served."""
        if self.cert_file is None:
            return False
        try:
            pair = self._read_pair()
            if pair == self._pair:
                return False
            current = self._build(pair, self._client_ca)
        except (OSError, ssl.SSLError, ValueError) as err:
            log.error(err, "Cannot load the serving certificate, still serving the previous one",
                      cert=self.cert_file, key=self.key_file)
            return False
        self._pair, self._current = pair, current
        log.info("Loaded a new serving certificate", cert=self.cert_file, key=self.key_file)
        return True

    def set_client_ca(self, client_ca: str | None) -> bool:
        """Trust `client_ca` for client certificates from the next handshake; True if it changed."""
        if client_ca == self._client_ca:
            return False
        try:
            current = self._build(self._pair, client_ca)
        except (ssl.SSLError, ValueError) as err:
            log.error(err, "Cannot load the new client CA, keeping the previous one")
            return False
        self._client_ca, self._current = client_ca, current
        self.context.verify_mode = ssl.CERT_OPTIONAL if client_ca else ssl.CERT_NONE
        log.v(2).info("Loaded a new client CA", present=bool(client_ca))  # KCM: "Loaded a new CA Bundle" at V(2)
        return True

    def reload_client_ca_file(self) -> bool:
        """Re-read --client-ca-file; True if a new CA is now trusted (one that does not load: logged, old CA kept)."""
        if self.client_ca_file is None:
            return False
        try:
            client_ca = read_client_ca_file(self.client_ca_file)
        except (OSError, ValueError) as err:
            log.error(err, "Cannot load the client CA file, keeping the previous CA", file=self.client_ca_file)
            return False
        return self.set_client_ca(client_ca)

    # -- refresh loop ---------------------------------------------------------------------------------

    async def run(self, fetch_client_ca: FetchCA | None) -> None:
        """Until cancelled: files on change (or every minute), the client CA ConfigMap every minute."""
        next_files = next_ca_file = next_ca = time.monotonic()
        watched = self.cert_file is not None or self.client_ca_file is not None
        while True:
            now = time.monotonic()
            stat = _file_stat(self.cert_file, self.key_file)
            if self.cert_file is not None and (stat != self._stat or now >= next_files):
                self._stat = stat
                next_files = now + FILE_REFRESH
                self.reload_pair()
            ca_stat = _file_stat(self.client_ca_file)
            if self.client_ca_file is not None and (ca_stat != self._ca_stat or now >= next_ca_file):
                self._ca_stat = ca_stat
                next_ca_file = now + FILE_REFRESH
                self.reload_client_ca_file()
            if fetch_client_ca is not None and now >= next_ca:
                next_ca = now + CLIENT_CA_REFRESH
                await self._refresh_client_ca(fetch_client_ca)
            waits = [FILE_CHECK] if watched else []
            if fetch_client_ca is not None:
                waits.append(max(next_ca - time.monotonic(), 0.0))
            if not waits:
                return  # a self-signed pair and no CA to follow: nothing ever changes
            await asyncio.sleep(min(waits))

    async def _refresh_client_ca(self, fetch: FetchCA) -> None:
        try:
            client_ca = await fetch()
        except (ApiError, TransportError) as err:
            log.v(2).info("Cannot re-read the client CA, keeping the current one", err=one_line(err))
            return
        self.set_client_ca(client_ca)

    # -- helpers --------------------------------------------------------------------------------------

    def _read_pair(self) -> tuple[bytes, bytes]:
        assert self.cert_file is not None and self.key_file is not None
        with open(self.cert_file, "rb") as cert, open(self.key_file, "rb") as key:
            pair = cert.read(), key.read()
        if not pair[0] or not pair[1]:
            raise ValueError(f"missing content for serving cert {self.cert_file}::{self.key_file}")
        if problem := pem_pair_problem(*pair, self.cert_file, self.key_file):
            raise ValueError(problem)
        return pair

    def _build(self, pair: tuple[bytes, bytes], client_ca: str | None) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._policy.apply(ctx)
        load_in_memory_pair(ctx, *pair)
        if client_ca:
            ctx.load_verify_locations(cadata=client_ca)
            # A certificate is one way to authenticate, not required. (Python reports the peer
            # certificate by the verify mode of the context a connection ends up with.)
            ctx.verify_mode = ssl.CERT_OPTIONAL
        return ctx

    def _listening_context(self) -> ssl.SSLContext:
        ctx = self._build(self._pair, None)
        # OpenSSL takes the verify mode of each connection from this context.
        ctx.verify_mode = ssl.CERT_OPTIONAL if self._client_ca else ssl.CERT_NONE

        def use_current(conn: ssl.SSLObject | ssl.SSLSocket, _name: str | None, _ctx: ssl.SSLContext) -> None:
            conn.context = self._current

        ctx.sni_callback = use_current
        return ctx


def _file_stat(*paths: str | None) -> FileStat:
    """What tells a changed file (Go watches with fsnotify): mtime, size and inode of each path given."""
    stats = []
    for path in paths:
        if path is None:
            continue
        try:
            st = os.stat(path)
        except OSError:
            stats.append((0, 0, 0))
            continue
        stats.append((st.st_mtime_ns, st.st_size, st.st_ino))
    return tuple(stats)
