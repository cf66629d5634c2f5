"""Field projections: the parts of an object an informer keeps in its cache.

A projection is a nested mapping of field names; `True` keeps the field's whole value, a nested
projection keeps only those fields of it (applied to each element of a list of objects), and
`FULL` (None) keeps the whole object. Each controller declares the projection it reads for each
resource; an informer shared by several controllers keeps the union, and one controller asking
for `FULL` gives every sharer full objects.

Kept strings are interned: label keys and values, namespaces, node names, owner references,
condition types and the like repeat across thousands of pods and are then held once.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any, Union

Projection = Mapping[str, Union[bool, "Projection"]]
FULL: Projection | None = None

INTERN_MAX_LENGTH = 64  # longer strings (a container's command line, say) rarely repeat


def union(a: Projection | None, b: Projection | None) -> Projection | None:
    """The projection keeping every field `a` or `b` keeps."""
    if a is None or b is None:
        return None
    merged: dict[str, Any] = dict(a)
    for name, sub in b.items():
        mine = merged.get(name)
        if mine is None:
            merged[name] = sub
        elif mine is True or sub is True:
            merged[name] = True
        else:
            merged[name] = union(mine, sub)  # type: ignore[arg-type]
    return merged


def covers(wide: Projection | None, narrow: Projection | None) -> bool:
    """Whether `wide` keeps every field `narrow` does."""
    if wide is None:
        return True
    if narrow is None:
        return False
    for name, sub in narrow.items():
        have = wide.get(name)
        if have is None or (have is not True and (sub is True or not covers(have, sub))):  # type: ignore[arg-type]
            return False
    return True


def project(obj: dict[str, Any], projection: Projection) -> dict[str, Any]:
    """A new object with only the projected fields, its short strings interned. A nested object
    left with none of its projected fields is left out, as if absent."""
    kept: dict[str, Any] = {}
    for name, sub in projection.items():
        if name not in obj:
            continue
        value = obj[name]
        if sub is True:
            kept[sys.intern(name)] = interned(value)
        elif isinstance(value, dict):
            if inner := project(value, sub):  # an empty remainder (no annotation asked for) is left out
                kept[sys.intern(name)] = inner
        elif isinstance(value, list):
            kept[sys.intern(name)] = [project(v, sub) if isinstance(v, dict) else interned(v) for v in value]
        else:
            kept[sys.intern(name)] = interned(value)
    return kept


def interned(value: Any) -> Any:
    """`value` with every short string in it (keys and values) interned."""
    if isinstance(value, str):
        return sys.intern(value) if len(value) <= INTERN_MAX_LENGTH else value
    if isinstance(value, dict):
        return {interned(k): interned(v) for k, v in value.items()}
    if isinstance(value, list):
        return [interned(v) for v in value]
    return value
