"""A worker pool's probes: `zstalk worker --health-port` (protocol/network/health.py serves them).

One process: the pool's own loop answers, as a front's does.  Ready while its link to
the broker is READY or has been down for less than READY_HOLD_S (the pool's link holds
acks forever, so its own hold time says nothing here); live while its loop turns.

N processes (`--processes N`): the supervising parent answers, on an asyncio loop that
its watch loop runs while it waits (worker.py, `_watch`), so /healthz fails when the
parent stops watching.  The parent has no link of its own; each child writes its slot
of a shared array every BEAT_S (`SlotReporter`): when its loop last turned, and since
when its link has not been READY (NaN: READY).  time.monotonic is CLOCK_MONOTONIC, one
clock for every process of the host, so the parent compares the slots with its own now.

* ready: every child is connected, or has waited for a broker for less than
  READY_HOLD_S.  A child that died counts as down from its restart until a replacement
  connects, so one restart leaves the pod ready and a child failing for longer does not.
* live: the parent's loop turns, and every child's loop turned within stall_s.  A dead
  child is no liveness failure, the parent starts another one (its slot's beat starts
  again then); a child whose loop is stuck is, as a one-process pool's would be.

The same beat writes the child's row of `Slots.counts`, the counts its /metrics would show,
which the parent's /metrics sums (workers/metrics.py).
"""
from __future__ import annotations

import asyncio
import math
import time
from typing import Any, Callable, NamedTuple

from ..protocol.network.health import BEAT_S, health_state, link_state
from .metrics import WIDTH, PoolMetrics, publish

READY_HOLD_S = 5.0      # as a front's --hold-s: a broker restart is not an outage
_UP = math.nan


class Slot(NamedTuple):
    """What a pool process is given at its start: the shared arrays and its index."""
    values: Any
    index: int
    counts: Any


class Slots:
    """Per pool process (index i): `values` [2i] its loop's last turn, [2i+1] since when
    its link has not been READY (NaN: READY); `counts` its row of metrics (metrics.py, from
    i * WIDTH).  Shared memory, given to each child at its start (`slot`)."""

    def __init__(self, processes: int, mp: Any) -> None:
        self.values = mp.RawArray("d", 2 * processes)
        self.counts = mp.RawArray("d", WIDTH * processes)      # zeros
        now = time.monotonic()
        for i in range(processes):      # never connected yet: not ready (health.link_state)
            self.values[2 * i], self.values[2 * i + 1] = now, -math.inf

    def starting(self, i: int, now: float) -> None:
        """Process i is (re)started: it turns from now on, and is down since it was last
        up (or, never connected, still not ready)."""
        self.values[2 * i] = now
        if math.isnan(self.values[2 * i + 1]):
            self.values[2 * i + 1] = now

    def slot(self, i: int) -> Slot:
        return Slot(self.values, i, self.counts)

    def read(self) -> list[tuple[float, float]]:
        values = self.values[:]
        return list(zip(values[0::2], values[1::2]))


def pool_ready(slots: list[tuple[float, float]], now: float, hold_s: float) -> str | None:
    """None while every process is connected or waiting for less than hold_s."""
    for i, (_, down_since) in enumerate(slots):
        problem = link_state("down", None if math.isnan(down_since) else down_since, now,
                             hold_s)
        if problem:
            return f"pool process {i + 1} of {len(slots)}: {problem}"
    return None


def pool_live(slots: list[tuple[float, float]], now: float, stall_s: float) -> str | None:
    """None while every process's loop turns."""
    for i, (beat, _) in enumerate(slots):
        problem = health_state(beat, now, stall_s)
        if problem:
            return f"pool process {i + 1} of {len(slots)}: {problem}"
    return None


def parent_checks(slots: Slots, stall_s: float) -> tuple[Callable[[], str | None],
                                                         Callable[[], str | None]]:
    """The parent's (ready, alive) functions for protocol/network/health.py."""
    return (lambda: pool_ready(slots.read(), time.monotonic(), READY_HOLD_S),
            lambda: pool_live(slots.read(), time.monotonic(), stall_s))


class SlotReporter:
    """In a pool process: writes its slot and its row of counts every BEAT_S from the
    running loop, and its counts once more when closed (a clean stop)."""

    def __init__(self, slot: Slot, link, metrics: PoolMetrics) -> None:
        self.values, self.index, self.counts = slot
        self.link = link
        self.metrics = metrics
        self.handle: asyncio.TimerHandle | None = None

    def start(self) -> None:
        publish(self.metrics, self.counts, self.index)
        i, down_since = self.index, self.link.down_since
        self.values[2 * i] = time.monotonic()
        if down_since is None:
            self.values[2 * i + 1] = _UP
        elif not down_since >= self.values[2 * i + 1]:    # (NaN: up until now)
            self.values[2 * i + 1] = down_since             # (else: down since a death)
        self.handle = asyncio.get_running_loop().call_later(BEAT_S, self.start)

    def close(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
        publish(self.metrics, self.counts, self.index)
