"""Metrics by name, for names clients choose (tubes, functions), with a bounded label set.

A tube or function name becomes a metric label only while it is among the most active
(broker/metrics.py decides which, once a minute). `Labelled` holds what the core counts
for names: one object per labelled name, kept while it stays labelled, so its counters
never appear to reset; one object shared by every name never labelled, shown as
`_other`; and a sink for names labelled once and no longer (shown nowhere, so `_other`
sums only names that were never labelled). The core increments whatever `of(name)`
gives; the metrics read `by_name` and `other`.  While fewer than `room` names are
labelled, a name is labelled when first seen, so a light load shows every name from its
first count on (the metrics set `room` to their top N; 0: only they label).
"""
from __future__ import annotations

from typing import Callable, Generic, TypeVar

T = TypeVar("T")
#: names remembered as labelled once; past this, the oldest count as never labelled again
RETIRED_MAX = 10_000
OTHER = "_other"


class Labelled(Generic[T]):
    def __init__(self, make: Callable[[], T]) -> None:
        self.make = make
        self.by_name: dict[str, T] = {}
        self.other: T = make()
        self.sink: T = make()
        self.retired: dict[str, None] = {}
        self.room = 0

    def of(self, name: str) -> T:
        found = self.by_name.get(name)
        if found is not None:
            return found
        if name in self.retired:
            return self.sink
        if len(self.by_name) < self.room:
            return self.label(name)
        return self.other

    def label(self, name: str) -> T:
        """A name's own counts from now on (from zero: what came before stays in _other
        or the sink)."""
        found = self.by_name.get(name)
        if found is None:
            found = self.by_name[name] = self.make()
            self.retired.pop(name, None)
        return found

    def unlabel(self, name: str) -> None:
        if self.by_name.pop(name, None) is not None:
            self.retired[name] = None
            if len(self.retired) > RETIRED_MAX:
                del self.retired[next(iter(self.retired))]
