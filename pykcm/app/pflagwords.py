"""A command line split into flags and values as pflag splits it, under KCM's command (component-base's
cli sets WordSepNormalizeFunc: `_` in a long flag's name is `-`). Which flags exist and what their values
mean is kcmflags.py's; this module only knows where a flag's value is."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

BOOL_SHORTHANDS, VALUE_SHORTHANDS = "h", "v"  # KCM's two: cobra's -h, --help and component-base's -v, --v


@dataclass(frozen=True)
class Word:
    """One flag of a pflag command line with its value, or one other word."""

    flag: str  # `--name` as pflag reads it (`--a_b` is `--a-b`) or `-v`; the word itself where it is no flag
    value: str | None  # after `=`, or the next word for a flag that takes one
    words: list[str]  # as given: one word, or two; everything from a `--` on; a shorthand's rest of group

    @property
    def given(self) -> str:
        """The flag as given, as pflag names one it does not know or that lacks its value."""
        return self.words[0].partition("=")[0]

    def normalized(self) -> list[str]:
        """`words` with a long flag's name as pflag reads it (`--a_b=c_d` → `--a-b=c_d`)."""
        head = self.words[0]
        return [self.flag + head[len(self.flag):], *self.words[1:]] if head.startswith("--") else self.words


def _normalized(flag: str) -> str:
    """component-base's WordSepNormalizeFunc, which KCM's command sets: `_` in a long flag's name is
    `-`, in a name pflag reads as one (not `--`, nor `---x`; `--=x` has no name left of its `=`)."""
    if flag.startswith("--") and flag[2:3] not in ("", "-"):
        return flag.replace("_", "-")
    return flag


def is_shorthand_group(flag: str) -> bool:
    return flag.startswith("-") and not flag.startswith("--") and len(flag) > 1


def group_takes_next_word(flag: str) -> bool:
    """Whether a group of shorthands (`-hv`) ends in one that takes the next word as its value."""
    if not is_shorthand_group(flag):
        return False
    rest = flag[1:]
    while rest[:1] and rest[0] in BOOL_SHORTHANDS:
        rest = rest[1:]
    return len(rest) == 1 and rest in VALUE_SHORTHANDS


def pflag_words(argv: list[str], takes_value: Callable[[str], bool] = lambda _: False) -> Iterator[Word]:
    """`argv` as pflag reads it: a flag that takes a value takes the next word unless it has `=`."""
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            yield Word(arg, None, argv[i:])
            return
        flag, sep, value = arg.partition("=")
        flag = _normalized(flag)
        if sep:
            yield Word(flag, value, [arg])
        elif takes_value(flag) and i + 1 < len(argv):
            yield Word(flag, argv[i + 1], argv[i : i + 2])
            i += 1
        else:
            yield Word(flag, None, [arg])
        i += 1


def shorthands(word: Word) -> Iterator[Word]:
    """A group of shorthands one flag at a time, as pflag reads it (`-hv4` is -h, then -v with "4"):
    `c=value`, a boolean, or one that takes the rest of the group, else the next word. Each Word's
    `words[0]` is the group from its flag on, which pflag names when it does not know the flag."""
    raw = word.words[0]
    if not is_shorthand_group(raw):
        yield word
        return
    rest = raw[1:]
    while rest:
        here, value = f"-{rest}", None
        if len(rest) > 2 and rest[1] == "=":
            value, after = rest[2:], ""
        elif rest[0] in BOOL_SHORTHANDS:
            after = rest[1:]
        elif len(rest) > 1:
            value, after = rest[1:], ""
        else:
            value, after = (word.words[1] if len(word.words) > 1 else None), ""
        yield Word(f"-{rest[0]}", value, [here])
        rest = after
