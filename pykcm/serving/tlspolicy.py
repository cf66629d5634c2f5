"""KCM's --tls-min-version and --tls-cipher-suites for the secure port, in OpenSSL's terms.

The names are Go's (component-base's cli/flag: crypto/tls's suites, secure and insecure, and two
legacy ChaCha20 names). As in Go, the suites apply to TLS 1.2 and below: TLS 1.3's own suites are
accepted and change nothing. A suite this OpenSSL was built without (RC4, 3DES) is not offered,
which refuses a client rather than serving it something weaker than asked.
"""

from __future__ import annotations

import functools
import ssl
from dataclasses import dataclass

TLS_VERSIONS = {
    "VersionTLS10": ssl.TLSVersion.TLSv1,
    "VersionTLS11": ssl.TLSVersion.TLSv1_1,
    "VersionTLS12": ssl.TLSVersion.TLSv1_2,
    "VersionTLS13": ssl.TLSVersion.TLSv1_3,
}
DEFAULT_MIN_VERSION = ssl.TLSVersion.TLSv1_2  # component-base's DefaultTLSVersion

TLS13_SUITES = frozenset({"TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256"})
# Go's name → OpenSSL's (`openssl ciphers -stdname`).
OPENSSL_SUITES = {
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_RSA_WITH_RC4_128_SHA": "RC4-SHA",
    "TLS_RSA_WITH_3DES_EDE_CBC_SHA": "DES-CBC3-SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA256": "AES128-SHA256",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_RC4_128_SHA": "ECDHE-ECDSA-RC4-SHA",
    "TLS_ECDHE_RSA_WITH_RC4_128_SHA": "ECDHE-RSA-RC4-SHA",
    "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA": "ECDHE-RSA-DES-CBC3-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256": "ECDHE-ECDSA-AES128-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256": "ECDHE-RSA-AES128-SHA256",
}

# Go's default suites that OpenSSL's default list (Python's) leaves out: ECDHE with AES-CBC and SHA-1.
GO_DEFAULT_CBC_SUITES = ("ECDHE-ECDSA-AES128-SHA", "ECDHE-RSA-AES128-SHA", "ECDHE-ECDSA-AES256-SHA",
                         "ECDHE-RSA-AES256-SHA")


@dataclass(frozen=True)
class TLSPolicy:
    min_version: ssl.TLSVersion = DEFAULT_MIN_VERSION
    suites: tuple[str, ...] = ()  # OpenSSL names for TLS 1.2 and below; () with `limited`: none of them
    limited: bool = False  # --tls-cipher-suites was given

    def apply(self, ctx: ssl.SSLContext) -> None:
        ctx.minimum_version = self.min_version
        # OpenSSL 3 refuses TLS 1.0 and 1.1 below security level 0 (SHA-1 signatures): asked for, as Go serves them.
        legacy = self.min_version < ssl.TLSVersion.TLSv1_2
        level = ":@SECLEVEL=0" if legacy else ""
        if not self.limited:
            if legacy:  # the default list, and the CBC suites Go offers by default, which TLS 1.0/1.1 need
                names = [c["name"] for c in ctx.get_ciphers() if c["protocol"] != "TLSv1.3"]
                ctx.set_ciphers(":".join(dict.fromkeys([*names, *GO_DEFAULT_CBC_SUITES])) + level)
            return
        offered = [s for s in self.suites if s in _openssl_suites()]
        if offered:
            try:
                ctx.set_ciphers(":".join(offered) + level)
                return
            except ssl.SSLError:  # none allowed at OpenSSL's security level
                pass
        # Only TLS 1.3 suites (or none this OpenSSL serves) were asked: no TLS 1.2, as in Go.
        ctx.minimum_version = max(self.min_version, ssl.TLSVersion.TLSv1_3)


def tls_policy(min_version: str = "", cipher_suites: list[str] | tuple[str, ...] = ()) -> TLSPolicy:
    """The policy for KCM's two flags; ValueError with component-base's message for a bad name."""
    version = DEFAULT_MIN_VERSION
    if min_version:
        if min_version not in TLS_VERSIONS:
            raise ValueError(f'unknown tls version "{min_version}"')
        version = TLS_VERSIONS[min_version]
    suites: list[str] = []
    for name in cipher_suites:
        if name not in OPENSSL_SUITES and name not in TLS13_SUITES:
            raise ValueError(f"Cipher suite {name} not supported or doesn't exist")
        if name in OPENSSL_SUITES and OPENSSL_SUITES[name] not in suites:
            suites.append(OPENSSL_SUITES[name])
    return TLSPolicy(version, tuple(suites), limited=bool(cipher_suites))


@functools.cache
def _openssl_suites() -> frozenset[str]:
    """Every TLS 1.2 suite this OpenSSL has, whatever its default list leaves out."""
    probe = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    probe.set_ciphers("ALL:@SECLEVEL=0")
    return frozenset(c["name"] for c in probe.get_ciphers())
