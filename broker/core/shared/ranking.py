"""Names ranked by activity for an operator's pages (the tubes, broker/core/views.py; the
functions, tasks/commands.py): sorted again at most once every RANK_S, and walked a page
at a time.

Why at most once a second: sorting 10,000 names for every look of every dashboard would
cost the broker what the looks are for, and a ranking a second old is one a person
cannot tell from a fresh one.  A page walks the ranking after the last name of the page
before (`after`); a name that moved between two looks may show twice or not at all, as
in any list that changes while it is read.  A page by name walks the names after `after`
in order, which nothing reorders.
"""
from __future__ import annotations

import math
from typing import Callable, Iterable

#: a ranking is sorted again at most this often (seconds)
RANK_S = 1.0


class Ranking:
    """The names `names()` gives, least `key(name, now)` first (the busiest: a key
    starts with minus its activity; ties by name)."""

    def __init__(self, names: Callable[[], Iterable[str]],
                 key: Callable[[str, float], tuple]) -> None:
        self.names, self.key = names, key
        self.order: list[str] = []
        self.ranked_at = -math.inf

    def ranked(self, now: float) -> list[str]:
        if now - self.ranked_at >= RANK_S:
            self.order = sorted(self.names(), key=lambda name: self.key(name, now))
            self.ranked_at = now
        return self.order

    def page(self, keep: Callable[[str], bool], after: str, limit: int,
             now: float) -> tuple[list[str], str | None]:
        """The names `keep` takes after `after` in the ranking ("": from the first)."""
        order = [name for name in self.ranked(now) if keep(name)]
        names = order[order.index(after) + 1:] if after in order else ([] if after else order)
        return cut(names, limit)


def by_name(names: Iterable[str], keep: Callable[[str], bool], after: str,
            limit: int) -> tuple[list[str], str | None]:
    """The names `keep` takes after `after`, by name."""
    return cut(sorted(name for name in names if name > after and keep(name)), limit)


def cut(names: list[str], limit: int) -> tuple[list[str], str | None]:
    """The first `limit` names, and the `after` of the next page (None: no more)."""
    shown = names[:limit]
    return shown, (shown[-1] if len(names) > limit else None)
