"""What the task store counts per function, for the metrics (and, later, function stats).

`FunctionCounts` are the counters and the call-duration histogram of one function, held
by name through core/labels.py (a labelled name has its own, the rest share `_other`).
`Queued` indexes each function's queued tasks by enqueue order, so the oldest one's age
is read without a scan: a heap of seqs per function whose removals are lazy (a seq is
live while its task is still queued), rebuilt when stale entries outnumber live ones.
`delayed` counts the queued tasks that are not due yet, by function.
"""
from __future__ import annotations

import heapq
from typing import Callable

from .....protocol.codecs.prometheus import CALL_BUCKETS, Histogram

_STALE_SLACK = 64


class FunctionCounts:
    __slots__ = ("enqueued", "started", "finished", "retries", "calls", "abandoned")

    def __init__(self) -> None:
        self.enqueued = 0
        self.started = 0                # calls started, and online tasks admitted
        self.abandoned = 0              # online tasks cancelled: nobody looked in time
        self.finished: dict[str, int] = {}      # outcome (a final status) -> tasks
        self.retries = 0
        self.calls = Histogram(CALL_BUCKETS)    # call durations, seconds


class Queued:
    """Per function, the seqs of its queued tasks, oldest first (lazily)."""

    def __init__(self, live: Callable[[int], bool]) -> None:
        self.live = live                        # seq -> whether that task is still queued
        self.heaps: dict[str, list[int]] = {}
        self.counts: dict[str, int] = {}        # live entries per function
        self.delayed: dict[str, int] = {}       # queued, not due yet, per function

    def add(self, function: str, seq: int) -> None:
        heapq.heappush(self.heaps.setdefault(function, []), seq)
        self.counts[function] = self.counts.get(function, 0) + 1

    def discard(self, function: str) -> None:
        left = self.counts[function] - 1
        if left:
            self.counts[function] = left
            heap = self.heaps[function]
            if len(heap) > 2 * left + _STALE_SLACK:
                self.heaps[function] = [s for s in heap if self.live(s)]
                heapq.heapify(self.heaps[function])
        else:
            del self.counts[function], self.heaps[function]

    def oldest(self, function: str) -> int | None:
        heap = self.heaps.get(function)
        while heap and not self.live(heap[0]):
            heapq.heappop(heap)
        return heap[0] if heap else None

    def delay(self, function: str, n: int) -> None:
        left = self.delayed.get(function, 0) + n
        if left:
            self.delayed[function] = left
        else:
            self.delayed.pop(function, None)
