"""One "did you mean" for names a user types (algorithms, models, tasks, keys): a name that differs
only in case (`FedACT`, the class name, for `fedact`) is the one offered, else the closest spellings."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def close_names(name: str, known: Iterable[str], n: int = 2) -> list[str]:
    """The known names closest to `name`, compared case-insensitively."""
    by_lower: dict[str, str] = {}
    for k in known:
        by_lower.setdefault(k.lower(), k)
    if name.lower() in by_lower:  # the same name in other case: that one, alone
        return [by_lower[name.lower()]]
    return [by_lower[c] for c in difflib.get_close_matches(name.lower(), list(by_lower), n=n)]


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """` (did you mean 'fedact'?)`, or "" when nothing is close."""
    close = close_names(name, known)
    return f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""
