"""Client certificate files are re-read, as client-go's dynamicClientCert (transport/cert_rotation.go).

A kubeconfig that names `client-certificate`/`client-key` files (kubelet-style rotation,
cert-manager, a projected volume) gets them re-read every 5 minutes; when their content changed
and the new pair is valid, later connections present it and the pooled ones are dropped. A pair
that does not load (the certificate written, the key not yet) is logged and the old one stays.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable

from pykcm.client.config import ConfigError
from pykcm.util.log import get_logger

CLIENT_CERT_REFRESH = 5 * 60.0  # client-go's CertCallbackRefreshDuration

log = get_logger("cert-rotation")


class ClientCertRotation:
    def __init__(
        self, cert_file: str, key_file: str, build: Callable[[], ssl.SSLContext], now: float,
        refresh: float = CLIENT_CERT_REFRESH,
    ) -> None:
        self.cert_file, self.key_file = cert_file, key_file
        self._build = build  # a client TLS context from the files as they are now
        self._refresh = refresh
        self._loaded = self._read()  # what the current context was built from
        self._next_check = now + refresh

    def rotated(self, now: float) -> ssl.SSLContext | None:
        """A context for a changed, valid pair if a check is due and found one; else None."""
        if now < self._next_check:
            return None
        self._next_check = now + self._refresh
        content = self._read()
        if content is None or content == self._loaded:
            return None
        try:
            context = self._build()
        except ConfigError as err:
            log.error(err, "Cannot load the rotated client certificate, keeping the current one",
                      cert=self.cert_file, key=self.key_file)
            return None
        self._loaded = content
        log.info("Certificate rotation detected, shutting down client connections to start using new credentials",
                 cert=self.cert_file)
        return context

    def _read(self) -> tuple[bytes, bytes] | None:
        try:
            with open(self.cert_file, "rb") as cert, open(self.key_file, "rb") as key:
                return cert.read(), key.read()
        except OSError as err:
            log.error(err, "Cannot read the client certificate", cert=self.cert_file, key=self.key_file)
            return None
