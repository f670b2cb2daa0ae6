"""Timers in lanes, in the manner of trio's Deadlines: each timer is (when, key), kept
earliest first in its lane; nothing here reads a clock.  A component owns one Deadlines
of its lanes (the ledger: kept results, queue timeouts; calls.py: calls; the lines: tasks not due
yet; the room: passes and liveness checks; the limits: gates that open, gates to drop),
and its `expire(now)` takes from each lane what is due, in the order it chooses.
`next_deadline` is the earliest of all its lanes.
"""
from __future__ import annotations

from sortedcontainers import SortedList


class Deadlines:
    __slots__ = ("lanes",)

    def __init__(self, *lanes: str) -> None:
        self.lanes: dict[str, SortedList] = {name: SortedList() for name in lanes}

    def add(self, lane: str, when: float, key) -> None:
        self.lanes[lane].add((when, key))

    def discard(self, lane: str, when: float, key) -> None:
        self.lanes[lane].discard((when, key))

    def remove(self, lane: str, when: float, key) -> None:
        """As discard, for a timer that must be there (ValueError if it is not)."""
        self.lanes[lane].remove((when, key))

    def first(self, lane: str) -> tuple | None:
        timers = self.lanes[lane]
        return timers[0] if timers else None

    def pop(self, lane: str) -> tuple:
        return self.lanes[lane].pop(0)

    def due(self, lane: str, now: float) -> bool:
        """Whether the lane's first timer is due at `now`."""
        timers = self.lanes[lane]
        return bool(timers) and timers[0][0] <= now

    def keys(self, lane: str) -> list:
        """The keys of a lane, earliest first (a copy: the caller may change the lane)."""
        return [key for _, key in self.lanes[lane]]

    def __bool__(self) -> bool:
        return any(self.lanes.values())

    def next_deadline(self) -> float | None:
        heads = [timers[0][0] for timers in self.lanes.values() if timers]
        return min(heads) if heads else None
