"""TLS files are re-read, as client-go re-reads them (transport/cert_rotation.go, ca_rotation.go).

A kubeconfig that names `client-certificate`/`client-key` files (kubelet-style rotation,
cert-manager, a projected volume) gets them re-read every 5 minutes; when their content changed
and the new pair is valid, later connections present it and the pooled ones are dropped. A pair
that does not load (the certificate written, the key not yet) is logged and the old one stays.
The CA file (a kubeconfig's, or the pod's `ca.crt`) is re-read as often, as KCM 1.36 does with
ClientsAllowCARotation (beta, on): a changed CA is trusted by later connections, and only idle
ones are dropped, so watches go on.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from dataclasses import dataclass

from pykcm.client.config import ConfigError
from pykcm.util.log import get_logger

CLIENT_CERT_REFRESH = 5 * 60.0  # client-go's CertCallbackRefreshDuration (and its CA refresh)

log = get_logger("cert-rotation")


@dataclass(frozen=True)
class Rotated:
    context: ssl.SSLContext
    client_certificate: bool  # the pair changed (close every connection), not only the CA (close idle ones)


class TLSFileRotation:
    def __init__(
        self, ca_file: str | None, cert_file: str | None, key_file: str | None, build: Callable[[], ssl.SSLContext],
        now: float, refresh: float = CLIENT_CERT_REFRESH,
    ) -> None:
        self.ca_file = ca_file
        self.cert_file, self.key_file = (cert_file, key_file) if cert_file and key_file else (None, None)
        self._build = build  # a client TLS context from the files as they are now
        self._refresh = refresh
        self._ca, self._pair = self._read_ca(), self._read_pair()  # what the current context was built from
        self._next_check = now + refresh

    def rotated(self, now: float) -> Rotated | None:
        """A context for changed, valid files if a check is due and found them; else None."""
        if now < self._next_check:
            return None
        self._next_check = now + self._refresh
        ca, pair = self._read_ca(), self._read_pair()
        ca_changed = ca is not None and ca != self._ca
        pair_changed = pair is not None and pair != self._pair
        if not (ca_changed or pair_changed):
            return None
        try:
            context = self._build()
        except ConfigError as err:
            what = "client certificate" if pair_changed else "CA"
            log.error(err, f"Cannot load the rotated {what}, keeping the current one", ca=self.ca_file,
                      cert=self.cert_file, key=self.key_file)
            return None
        if ca_changed:
            self._ca = ca
            log.info("CA content changed, updating transport", caFile=self.ca_file)
        if pair_changed:
            self._pair = pair
            log.info("Certificate rotation detected, shutting down client connections to start using new "
                     "credentials", cert=self.cert_file)
        return Rotated(context, pair_changed)

    def _read_ca(self) -> bytes | None:
        if self.ca_file is None:
            return None
        try:
            with open(self.ca_file, "rb") as f:
                content = f.read()
        except OSError as err:
            log.error(err, "Failed to read CA data from file", caFile=self.ca_file)
            return None
        if not content:
            log.info("CA file empty, skipping transport rotation", caFile=self.ca_file)
            return None
        return content

    def _read_pair(self) -> tuple[bytes, bytes] | None:
        if self.cert_file is None or self.key_file is None:
            return None
        try:
            with open(self.cert_file, "rb") as cert, open(self.key_file, "rb") as key:
                return cert.read(), key.read()
        except OSError as err:
            log.error(err, "Cannot read the client certificate", cert=self.cert_file, key=self.key_file)
            return None
