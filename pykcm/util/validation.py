"""Name checks of apimachinery's util/validation that more than one layer needs."""

from __future__ import annotations

import re

DNS1123_SUBDOMAIN_MAX_LENGTH = 253
_DNS1123_LABEL_FMT = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = re.compile(rf"{_DNS1123_LABEL_FMT}(\.{_DNS1123_LABEL_FMT})*")  # fullmatch: Go's $ is no "\n"


def is_dns1123_subdomain(value: str) -> bool:
    """A lowercase RFC 1123 subdomain: what most object names must be (IsDNS1123Subdomain)."""
    return 0 < len(value) <= DNS1123_SUBDOMAIN_MAX_LENGTH and bool(_DNS1123_SUBDOMAIN.fullmatch(value))
