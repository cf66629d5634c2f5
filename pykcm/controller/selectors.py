"""Label selectors: `metav1.LabelSelector` parsed into something that matches label sets.

Follows apimachinery's `LabelSelectorAsSelector` and `labels.Requirement`:

- a missing (None) selector matches nothing; an empty one (`{}`) matches everything;
- `matchLabels` entries become equality requirements, `matchExpressions` use the operators
  `In`, `NotIn`, `Exists` and `DoesNotExist`;
- keys must be qualified names, values valid label values; `In`/`NotIn` need at least one
  value, `Exists`/`DoesNotExist` none. Anything else raises `SelectorError`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pykcm.util.validation import is_dns1123_subdomain

IN, NOT_IN, EXISTS, DOES_NOT_EXIST, EQUALS = "In", "NotIn", "Exists", "DoesNotExist", "Equals"
_EXPRESSION_OPERATORS = (IN, NOT_IN, EXISTS, DOES_NOT_EXIST)

_NAME_FMT = r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_NAME = re.compile(_NAME_FMT)  # used with fullmatch: Python's $ also matches before a final "\n", Go's not
_VALUE = re.compile(f"({_NAME_FMT})?")
NAME_MAX_LENGTH = 63
VALUE_MAX_LENGTH = 63

Labels = Mapping[str, str]


class SelectorError(ValueError):
    """A label selector that cannot be converted; the message says which part is wrong."""


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: str
    values: frozenset[str] = frozenset()

    def matches(self, labels: Labels) -> bool:
        if self.operator in (IN, EQUALS):
            return self.key in labels and labels[self.key] in self.values
        if self.operator == NOT_IN:
            return self.key not in labels or labels[self.key] not in self.values
        if self.operator == EXISTS:
            return self.key in labels
        return self.key not in labels  # DOES_NOT_EXIST


@dataclass(frozen=True)
class Selector:
    """All requirements must hold. `nothing` is the selector of a nil LabelSelector."""

    requirements: tuple[Requirement, ...] = ()
    nothing: bool = False

    def matches(self, labels: Labels | None) -> bool:
        if self.nothing:
            return False
        labels = labels or {}
        return all(r.matches(labels) for r in self.requirements)

    def empty(self) -> bool:
        """True for the match-everything selector (labels.Selector.Empty)."""
        return not self.nothing and not self.requirements


EVERYTHING = Selector()
NOTHING = Selector(nothing=True)


def selector_from_label_selector(label_selector: Mapping[str, Any] | None) -> Selector:
    """Convert an API `LabelSelector`; raises SelectorError if it is invalid."""
    if label_selector is None:
        return NOTHING
    match_labels = label_selector.get("matchLabels") or {}
    expressions = label_selector.get("matchExpressions") or []
    if not match_labels and not expressions:
        return EVERYTHING
    requirements = [_requirement(key, EQUALS, [value]) for key, value in match_labels.items()]
    for expr in expressions:
        operator = expr.get("operator")
        if operator not in _EXPRESSION_OPERATORS:
            raise SelectorError(f"{operator!r} is not a valid label selector operator")
        requirements.append(_requirement(expr.get("key", ""), operator, expr.get("values") or []))
    return Selector(tuple(requirements))


def selector_from_set(labels: Labels | None) -> Selector:
    """Equality on every pair, no validation (labels.Set.AsSelectorPreValidated); empty matches all."""
    return Selector(tuple(Requirement(k, EQUALS, frozenset([v])) for k, v in (labels or {}).items()))


def _requirement(key: str, operator: str, values: list[str]) -> Requirement:
    errors = _key_errors(key)
    if operator in (IN, NOT_IN) and not values:
        errors.append("values: for 'in', 'notin' operators, values set can't be empty")
    elif operator == EQUALS and len(values) != 1:
        errors.append("values: exact-match compatibility requires one single value")
    elif operator in (EXISTS, DOES_NOT_EXIST) and values:
        errors.append("values: values set must be empty for exists and does not exist")
    errors.extend(f"values[{key}]: Invalid value: {v!r}: {msg}" for v in values if (msg := _value_error(v)))
    if errors:
        raise SelectorError("; ".join(errors))
    return Requirement(key, operator, frozenset(values))


def _key_errors(key: str) -> list[str]:
    parts = key.split("/")
    if len(parts) > 2:
        return [f"key: Invalid value: {key!r}: a valid label key must be a name with an optional DNS subdomain prefix"]
    errors = []
    if len(parts) == 2:
        prefix = parts[0]
        if not is_dns1123_subdomain(prefix):
            errors.append(f"key: Invalid value: {key!r}: prefix part must be a lowercase RFC 1123 subdomain")
    name = parts[-1]
    if len(name) > NAME_MAX_LENGTH:
        errors.append(f"key: Invalid value: {key!r}: name part must be no more than {NAME_MAX_LENGTH} characters")
    if not _NAME.fullmatch(name):
        errors.append(
            f"key: Invalid value: {key!r}: name part must consist of alphanumeric characters, '-', '_' or '.', "
            "and must start and end with an alphanumeric character"
        )
    return errors


def _value_error(value: Any) -> str:
    if not isinstance(value, str):
        return "must be a string"
    if len(value) > VALUE_MAX_LENGTH:
        return f"must be no more than {VALUE_MAX_LENGTH} characters"
    if not _VALUE.fullmatch(value):
        return (
            "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
            "and must start and end with an alphanumeric character"
        )
    return ""
