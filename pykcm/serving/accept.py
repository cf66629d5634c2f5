"""An HTTP Accept header as Go's goautoneg reads it, which both the apiserver's content negotiation
(/statusz, /flagz) and prometheus/common's (/metrics) use: KCM answers by its order."""

from __future__ import annotations

import re


def parse_accept(header: str) -> list[tuple[str, str, dict[str, str]]]:
    """goautoneg.ParseAccept: spaces trimmed (nothing else), values kept quoted, q as Go's ParseFloat."""
    clauses: list[tuple[float, str, str, dict[str, str]]] = []
    for part in header.split(","):
        media, _, rest = part.strip(" ").partition(";")
        typ, _, sub = media.partition("/")
        if (not sub and typ.strip(" ") != "*") or "/" in sub:
            continue
        q, params = 1.0, {}
        for key, _, value in (param.partition("=") for param in rest.split(";") if rest):
            if value and "=" not in value:
                if key.strip(" ") == "q":
                    q = _go_float(value)
                else:
                    params[key.strip(" ")] = value.strip(" ")
        clauses.append((q, typ.strip(" "), sub.strip(" ") if sub else "*", params))
    for i in range(1, len(clauses)):  # Go's sort.Sort (an insertion sort up to 12 clauses), with its odd Less
        j = i
        while j > 0 and (clauses[j][0] > clauses[j - 1][0] or clauses[j - 1][1] == "*" != clauses[j][1]
                         or clauses[j - 1][2] == "*" != clauses[j][2]):
            clauses[j], clauses[j - 1] = clauses[j - 1], clauses[j]
            j -= 1
    return [(typ, sub, params) for _, typ, sub, params in clauses]


def _go_float(text: str) -> float:
    """strconv.ParseFloat, but for hex floats and float32's range: 0 on a syntax error, as Go's."""
    ok = re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?|[+-]?(?i:inf|infinity|nan)", text)
    return float(text) if ok else 0.0
