"""When a function may start its next call (its rate and its pause), and what its calls did
over the last minute.  Pure: every method takes `now` (monotonic seconds).

`Gate` is one function's limit, the Generic Cell Rate Algorithm (ATM Forum TM 4.0; the
"virtual scheduling" form): with T = period / N (the emission interval of a rate of N
per period) and tau = T * burst, a call may start at `now` iff now >= TAT - tau, and
starting it sets TAT = max(TAT, now) + T.  So in any interval of length t at most
burst + 1 + floor(t / T) calls start, however many dispatchers take them, and a
function over its rate loses nothing: its tasks wait in their places until the moment
`opens_at` names, which the store arms its timer for.  A gate has its burst at once
(TAT = now), but for the time before the broker started: the store makes its gates with
TAT at least its start + tau, so right after a restart there is no burst credit.  A slow
rate's TAT (T of a second or more) is kept across a restart by the journal, so a crash
loop cannot exceed it (store.durable_gates, a GATES record).  A new rate (SIGHUP)
keeps the TAT and applies from the next start.

One allowance for the event loop: its timer fires a little after the moment `opens_at`
names (epoll counts in milliseconds, and a loaded machine's scheduler adds more), and with
GCRA's TAT = max(TAT, now) + T every late start would push the whole schedule back, so
the mean rate fell short by the lateness per start (0.76x of 1,000/s with one dispatcher,
measured; 384 admissions of 400 at 20/s on a machine at load 3).  A start up to L late is
counted at its exact time (TAT = max(TAT, now - L) + T), with L = max(LATE_S,
min(T / 4, MAX_LATE_S)): 2 ms at 1,000/s, 12.5 ms at 20/s, 25 ms at 10/s and slower.  The
mean rate is exact, calls due in the same turn start together, and any interval of
length t holds at most burst + 1 + floor((t + L) / T) starts.  As L < T once T is
over 2 ms (below 500/s), an interval of a whole number of T (at N/s: any second, any
minute) holds no more than strict GCRA lets through; only a shorter one may see one
call more.  On a clock that fires on time (the tests'
fake one) nothing changes.

A function whose server says "slow down" (429, or 503) is paused: no call of it starts
before `paused_until`.  With the server's Retry-After the pause is what it asked for;
without one it is an exponential backoff from 1 s, doubled by each such answer from a
call started after it last doubled (so many calls in flight when the server started
refusing double it once, not once each), capped by the function's max_pause, and reset
by the next success (a pause is kept in memory only: a restart ends it).  No pause is
shorter than max(1 s, T): `Retry-After: 0` must not become a tight loop.

`Recent` keeps the last minute of a function's starts and slot holds in six 10-second
slots of fixed buckets (bounded memory whatever the rate): the measured start rate, the
mean hold (the ETA's d, with at least MIN_SAMPLES holds ended), and the p50 / p90 of the
calls and, apart, of the admissions.  Where fewer than MIN_SAMPLES holds ended in the
last minute, the mean is that of the last MIN_SAMPLES holds, kept apart, if they all
ended within the last HOLDS_HORIZON_S: a room of 20 slots whose users stay 5 minutes ends
4 holds a minute, and its line should still get an ETA.  A hold is a dispatcher's call,
or an admitted online task from its admission to done, its pass's expiry or a cancel
(the waiting room).  The
mean takes both: offline and online tasks of a function wait in one line for one set of
slots, and a task in it waits for slots to turn over, whoever holds them (by Little's law
the slots turn over at concurrency / the mean hold per end, of whatever kind).  The
quantiles keep them apart: a call's p90 is the function's latency, an admission's is how
long users stay, minutes perhaps, and one figure of both would say neither.
"""
from __future__ import annotations

import math
from bisect import bisect_left
from collections import deque

from .....protocol.codecs.prometheus import CALL_BUCKETS

#: how late the broker's timer may fire and still have a start counted at its exact time:
#: at least LATE_S, up to a quarter of T but at most MAX_LATE_S (the module's text)
LATE_S = 0.002
MAX_LATE_S = 0.025
MIN_PAUSE_S = 1.0
FIRST_BACKOFF_S = 1.0
SLOT_S = 10.0
SLOTS = 6                   # x SLOT_S: the last minute
MIN_SAMPLES = 10            # holds ended before their mean is trusted
HOLDS_HORIZON_S = 3600.0    # how old the last MIN_SAMPLES holds may be, the minute short


def late_allowance(interval: float) -> float:
    """L, how late a start may be and still count at its exact time, for T = `interval`."""
    return max(LATE_S, min(interval / 4, MAX_LATE_S))


class Gate:
    __slots__ = ("interval", "tau", "slack", "tat", "paused_until", "pause_reason",
                 "backoff_s", "backoff_at")

    def __init__(self, interval: float, burst: int, now: float,
                 tat: float | None = None) -> None:
        self.configure(interval, burst)     # T (seconds, 0: no rate), tau and L
        self.tat = now if tat is None else max(now, tat)
        self.paused_until = 0.0
        self.pause_reason = ""
        self.backoff_s = 0.0                # the last backoff without Retry-After (0: none)
        self.backoff_at = -math.inf         # when it last doubled

    def configure(self, interval: float, burst: int) -> None:
        """A new rate: the TAT stays, T, tau and L change from the next start."""
        self.interval, self.tau = interval, interval * burst
        self.slack = late_allowance(interval)

    def opens_at(self) -> float:
        """The earliest time a call may start (rate and pause)."""
        at = self.tat - self.tau if self.interval else 0.0
        return at if at > self.paused_until else self.paused_until

    def start(self, now: float) -> None:
        """A call starts at `now`: TAT = max(TAT, now - L) + T (see the module's text on
        the timer's lateness)."""
        if self.interval:
            late = now - self.slack
            self.tat = (self.tat if self.tat > late else late) + self.interval

    # -- pauses ----------------------------------------------------------------------------
    def pause(self, now: float, started: float, retry_after_s: float | None, max_pause_s: float,
              reason: str) -> None:
        """A call started at `started` was answered "slow down" at `now`."""
        floor = max(MIN_PAUSE_S, self.interval)
        if retry_after_s is not None:
            seconds = retry_after_s
        elif started > self.backoff_at or not self.backoff_s:     # a new refusal: double
            self.backoff_s = min(max_pause_s, self.backoff_s * 2 if self.backoff_s
                                 else FIRST_BACKOFF_S)
            self.backoff_at = now
            seconds = self.backoff_s
        else:                       # in flight when the backoff last doubled: once only
            seconds = self.backoff_s
        until = now + max(seconds, floor)
        if until > self.paused_until:
            self.paused_until, self.pause_reason = until, reason

    def succeeded(self) -> None:
        self.backoff_s = 0.0

    def paused(self, now: float) -> bool:
        return self.paused_until > now

    def holds_until(self, max_pause_s: float) -> float:
        """Until when this gate still knows something a fresh one would not: its TAT, its
        pause, and a backoff to double (kept max_pause after the pause ends)."""
        backoff_until = self.paused_until + max_pause_s if self.backoff_s else 0.0
        return max(self.tat, self.paused_until, backoff_until)


class Recent:
    """The last minute of one function's starts and slot holds (calls, admissions), and
    its last MIN_SAMPLES holds whenever they ended."""
    __slots__ = ("slots", "last")

    def __init__(self) -> None:
        # slot index (time // SLOT_S) -> [starts, holds ended, sum of their durations,
        # calls' bucket counts, online tasks abandoned, admissions' bucket counts]
        self.slots: dict[int, list] = {}
        self.last: deque[tuple[float, float]] = deque(maxlen=MIN_SAMPLES)  # (ended, held)

    def _slot(self, now: float) -> list:
        i = int(now // SLOT_S)
        slot = self.slots.get(i)
        if slot is None:
            slot = self.slots[i] = [0, 0, 0.0, [0] * (len(CALL_BUCKETS) + 1), 0,
                                    [0] * (len(CALL_BUCKETS) + 1)]
            for old in [k for k in self.slots if k <= i - SLOTS]:
                del self.slots[old]
        return slot

    def started(self, now: float) -> None:
        self._slot(now)[0] += 1

    def ended(self, now: float, seconds: float, admission: bool = False) -> None:
        """A slot held `seconds` is free again: a call ended, or an admission did."""
        slot = self._slot(now)
        slot[1] += 1
        slot[2] += seconds
        slot[5 if admission else 3][bisect_left(CALL_BUCKETS, seconds)] += 1
        self.last.append((now, seconds))

    def _live(self, now: float) -> list[list]:
        first = int(now // SLOT_S) - SLOTS + 1
        return [slot for i, slot in self.slots.items() if i >= first]

    def abandoned(self, now: float) -> None:
        self._slot(now)[4] += 1

    def abandon_rate(self, now: float) -> float:
        """Online tasks abandoned per second over the last minute."""
        return sum(slot[4] for slot in self._live(now)) / (SLOT_S * SLOTS)

    def start_rate(self, now: float) -> float:
        """Calls started per second over the last minute."""
        return sum(slot[0] for slot in self._live(now)) / (SLOT_S * SLOTS)

    def mean_s(self, now: float) -> float | None:
        """The mean hold, calls and admissions together, over the last minute; with under
        MIN_SAMPLES ended in it, over the last MIN_SAMPLES if none is older than
        HOLDS_HORIZON_S (None: no such basis)."""
        live = self._live(now)
        ends = sum(slot[1] for slot in live)
        if ends >= MIN_SAMPLES:
            return sum(slot[2] for slot in live) / ends
        last = self.last
        if len(last) < MIN_SAMPLES or last[0][0] < now - HOLDS_HORIZON_S:
            return None
        return sum(held for _, held in last) / MIN_SAMPLES

    def quantile_s(self, now: float, q: float, admissions: bool = False) -> float | None:
        """The q-quantile of the last minute's call durations (`admissions`: of the
        admissions' holds), interpolated within its bucket (None: none ended)."""
        counts = [0] * (len(CALL_BUCKETS) + 1)
        which = 5 if admissions else 3
        for slot in self._live(now):
            for i, n in enumerate(slot[which]):
                counts[i] += n
        total = sum(counts)
        if not total:
            return None
        rank, seen = q * total, 0
        for i, n in enumerate(counts):
            if n and seen + n >= rank:
                low = CALL_BUCKETS[i - 1] if i else 0.0
                high = CALL_BUCKETS[i] if i < len(CALL_BUCKETS) else low * 2 or 1.0
                return low + (high - low) * (rank - seen) / n
            seen += n
        return CALL_BUCKETS[-1]
