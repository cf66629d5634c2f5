"""KCM's --tls-min-version and --tls-cipher-suites on the secure port's contexts: a handshake in
memory between a client limited to one version and the served context."""

from __future__ import annotations

import ssl

import pytest

from pykcm.serving.dynamiccerts import DynamicServingTLS
from pykcm.serving.tlspolicy import tls_policy


def handshake(server: ssl.SSLContext, max_version: ssl.TLSVersion) -> tuple[str, str] | None:
    """(version, cipher) the client and server agree on, or None when they cannot."""
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.check_hostname, client.verify_mode = False, ssl.CERT_NONE
    client.maximum_version = max_version
    if max_version < ssl.TLSVersion.TLSv1_2:  # as `openssl s_client -tls1 -cipher DEFAULT@SECLEVEL=0`
        client.minimum_version = ssl.TLSVersion.TLSv1
        client.set_ciphers("DEFAULT:@SECLEVEL=0")
    c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    c = client.wrap_bio(c_in, c_out)
    s = server.wrap_bio(s_in, s_out, server_side=True)
    done = {"client": False, "server": False}
    for _ in range(10):
        for name, side in (("client", c), ("server", s)):
            if not done[name]:
                try:
                    side.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
                except ssl.SSLError:
                    return None
            s_in.write(c_out.read())
            c_in.write(s_out.read())
        if all(done.values()):
            return c.version() or "", (c.cipher() or ("",))[0]
    return None


def served(min_version: str = "", suites: tuple[str, ...] = ()) -> ssl.SSLContext:
    return DynamicServingTLS(None, None, "127.0.0.1", None, tls_policy(min_version, suites)).context


def test_the_default_serves_tls_1_2_and_1_3() -> None:
    assert handshake(served(), ssl.TLSVersion.TLSv1_2)[0] == "TLSv1.2"
    assert handshake(served(), ssl.TLSVersion.TLSv1_3)[0] == "TLSv1.3"


def test_a_minimum_of_tls_1_3_refuses_1_2() -> None:
    assert handshake(served("VersionTLS13"), ssl.TLSVersion.TLSv1_2) is None
    assert handshake(served("VersionTLS13"), ssl.TLSVersion.TLSv1_3)[0] == "TLSv1.3"


@pytest.mark.parametrize(
    ("suite", "openssl"),
    [("TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384", "ECDHE-RSA-AES256-GCM-SHA384"),
     ("TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305", "ECDHE-RSA-CHACHA20-POLY1305")],  # Go's legacy name
)
def test_only_the_named_suites_are_served_for_tls_1_2(suite: str, openssl: str) -> None:
    # RSA suites on the self-signed certificate, as KCM's RSA one serves them (an ECDSA key could not).
    assert handshake(served(suites=(suite,)), ssl.TLSVersion.TLSv1_2) == ("TLSv1.2", openssl)


def test_the_hardening_guides_rsa_suites_serve_tls_1_2() -> None:
    suites = ("TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256", "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384")
    assert handshake(served(suites=suites), ssl.TLSVersion.TLSv1_2)[0] == "TLSv1.2"


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1:DeprecationWarning")  # what is asked of it here
@pytest.mark.parametrize(
    ("min_version", "version"),
    [("VersionTLS10", ssl.TLSVersion.TLSv1), ("VersionTLS11", ssl.TLSVersion.TLSv1_1)],
)
def test_a_minimum_below_tls_1_2_really_serves_it(min_version: str, version: ssl.TLSVersion) -> None:
    # OpenSSL 3 refuses TLS 1.0 and 1.1 at its default security level; Go serves them when asked.
    expected = "TLSv1" if version == ssl.TLSVersion.TLSv1 else "TLSv1.1"
    assert handshake(served(min_version), version)[0] == expected
    suites = ("TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA",)
    assert handshake(served(min_version, suites), version) == (expected, "ECDHE-RSA-AES256-SHA")
    assert handshake(served(), version) is None  # the default minimum still refuses them


def test_tls_1_3_suites_alone_leave_no_tls_1_2_as_in_go() -> None:
    context = served(suites=("TLS_AES_128_GCM_SHA256",))
    assert handshake(context, ssl.TLSVersion.TLSv1_2) is None
    assert handshake(context, ssl.TLSVersion.TLSv1_3)[0] == "TLSv1.3"


@pytest.mark.parametrize(
    ("min_version", "suites", "message"),
    [("VersionTLS14", (), 'unknown tls version "VersionTLS14"'),
     ("", ("TLS_NOPE",), "Cipher suite TLS_NOPE not supported or doesn't exist")],
)
def test_bad_names_get_component_bases_messages(min_version: str, suites: tuple[str, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        tls_policy(min_version, suites)
