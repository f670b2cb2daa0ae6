"""The job state machine: tubes, jobs, waiting sessions and the timers that move jobs.

Pure: every method that depends on time takes `now` (monotonic seconds) and nothing here
reads a clock or does I/O.  When a job is handed to a session that was blocked in
reserve, the queue calls `grant(session, job)`; the broker turns that into a reply.

Invariant kept after every public call: no waiting session watches an unpaused tube
that has a ready job.  So a job that becomes ready only has to be offered to the waiters
of its own tube, and a new reserve never competes with a waiter.

Timers (SortedLists, so a cancelled timer is removed exactly and nothing stale piles up,
but for the one every reserve and delete touches):
  * `delayed_due` (deadline, id): DELAYED jobs becoming READY;
  * `ttr_due` (deadline, id): RESERVED jobs whose time-to-run runs out, a `Deadlines`
    heap: a reserve pushes in C, a delete only marks its entry stale (the entry no longer
    matches its job's state and deadline), and stale entries are dropped when they come
    to the top or, once they outnumber the live ones, all at once;
  * `wakes` (when, seq): waiting sessions to look at again (reserve timeout, or the
    start of the DEADLINE_SOON margin of a job they hold);
  * `paused` (unpause_at, name): paused tubes.
`soonest` is the earliest deadline any of them was given since the broker last looked
(core/broker.py next_wake): a turn that set none before the timer the actor has armed
need not look at them all again (-inf: look, as after a restore).
`tops` holds (top ready key, tube) for every unpaused tube with ready jobs, so reserve
across many watched tubes looks at the best candidates first instead of every tube.  It
is brought up to date only when such a reserve looks at it: a change of a tube's top
(every reserve of its best job, most puts) only marks the tube in `stale_tops`, and
`_refresh_tops` moves the marked tubes' entries then (`Tube.listed` is the key a tube
has in `tops`).  Sessions watching a few tubes, the common case, never pay for it.
"""
from __future__ import annotations

import heapq
import itertools
import math
from bisect import bisect_left
from typing import Callable

from sortedcontainers import SortedList

from ....protocol.codecs.prometheus import WAIT_BUCKETS
from ..shared.labels import Labelled

from .jobs import (BURIED, DELAYED, KICKS, READY, RESERVED, RESERVED_AT, TIMEOUTS,
                   URGENT_PRI, Job, Session, Tube, TubeMetrics, key_id)

SAFETY_MARGIN_S = 1.0   # beanstalkd's DEADLINE_SOON margin
_STALE_SLACK = 1024     # stale Deadlines entries kept beyond the live ones before compacting
_FEW_TUBES = 8          # watch lists up to this size are scanned directly


DEFAULT_TUBE = "default"


class Queue:
    def __init__(self, grant: Callable[[Session, Job], None],
                 deadline_soon: Callable[[Session], None],
                 timed_out: Callable[[Session], None]) -> None:
        self.grant = grant
        self.deadline_soon = deadline_soon
        self.timed_out = timed_out
        self.jobs: dict[int, Job] = {}
        self.tubes: dict[str, Tube] = {}
        self.tube_list: list[Tube] = []     # creation order with swap-remove (list-tubes)
        self.tops = SortedList()
        self.stale_tops: dict[Tube, None] = {}  # tubes whose top may differ from `listed`
        self.delayed_due = SortedList()
        self.ttr_due = Deadlines(self._reserved_until)
        self.wakes = SortedList()
        self.wake_sessions: dict[int, Session] = {}
        self.paused = SortedList()
        self.soonest = -math.inf
        self.waiting_count = 0
        self.job_timeouts = 0
        self.bury_seq = 0           # orders buried jobs across restarts (see Job.deadline)
        # what the metrics count by tube name (core/labels.py; broker/metrics.py labels)
        self.metrics: Labelled[TubeMetrics] = Labelled(TubeMetrics)
        self._seq = itertools.count(1)
        #: a replicated journal's JOB_HELD, told of every reserve (journal.logs_reserves)
        self.held: Callable[[Job], None] | None = None

    def _reserved_until(self, deadline: float, job_id: int) -> bool:
        """Whether a ttr_due entry is live: its job is still reserved until then."""
        job = self.jobs.get(job_id)
        return job is not None and job.state == RESERVED and job.deadline == deadline

    # -- tubes ---------------------------------------------------------------------
    def label(self, name: str) -> None:
        """The metrics show this tube by name from now on."""
        counted = self.metrics.label(name)
        t = self.tubes.get(name)
        if t is not None:
            self.settle_puts(t)
            t.metrics = counted

    def unlabel(self, name: str) -> None:
        self.metrics.unlabel(name)
        t = self.tubes.get(name)
        if t is not None:
            self.settle_puts(t)
            t.metrics = self.metrics.of(name)

    @staticmethod
    def settle_puts(t: Tube) -> None:
        """Count the tube's puts since its mark into its metrics (jobs.TubeMetrics)."""
        t.metrics.puts += t.total_jobs - t.puts_mark
        t.puts_mark = t.total_jobs

    def tube(self, name: str) -> Tube:
        t = self.tubes.get(name)
        if t is None:
            t = self.tubes[name] = Tube(name, self.metrics.of(name), self.jobs)
            self.tube_list.append(t)
        return t

    def maybe_free(self, t: Tube) -> None:
        # beanstalkd holds a reference to `default` for its whole life (tube.c's
        # default_tube): it is listed and answers stats-tube even when nobody uses it
        if t.name != DEFAULT_TUBE and t.is_unreferenced() and self.tubes.get(t.name) is t:
            self.settle_puts(t)
            del self.tubes[t.name]
            i = self.tube_list.index(t)
            last = self.tube_list.pop()
            if last is not t:
                self.tube_list[i] = last
            if t.unpause_at:
                self.paused.remove((t.unpause_at, t.name))

    # -- ready set -----------------------------------------------------------------
    def _ready_add(self, job: Job) -> None:
        t = job.tube
        ready = t.ready
        if job.pri < URGENT_PRI:
            t.urgent += 1
        job.state = READY
        t.ready_since.add(job)                  # (make_ready set its deadline: since when)
        if ready.add(job.pri, job.id):
            self.stale_tops[t] = None

    def _ready_remove(self, job: Job) -> None:
        t = job.tube
        if job.pri < URGENT_PRI:
            t.urgent -= 1
        if t.ready.remove(job.pri, job.id):
            self.stale_tops[t] = None

    def _refresh_tops(self) -> None:
        """Move the entries of the tubes whose top changed (see the module's comment)."""
        tops = self.tops
        for t in self.stale_tops:
            want = None if t.unpause_at else t.ready.top
            if want != t.listed:
                if t.listed is not None:
                    tops.remove((t.listed, t))
                if want is not None:
                    tops.add((want, t))
                t.listed = want
        self.stale_tops.clear()

    def make_ready(self, job: Job, now: float) -> None:
        """Enter READY and hand the job to a waiter of its tube if there is one."""
        t = job.tube
        job.state = READY
        job.deadline = now          # while READY: since when (Tube.ready_since, the metrics)
        if t.waiting and not t.unpause_at and t.ready.top is None:
            # by the invariant a tube with waiters has no ready job, so this one is what
            # _serve_waiters would pick: hand it over without the sorted containers
            session = next(iter(t.waiting))
            self.stop_waiting(session)
            self.reserve(session, job, now)
            self.grant(session, job)
            return
        self._ready_add(job)
        if t.waiting and not t.unpause_at:
            self._serve_waiters(t, now)

    def _serve_waiters(self, t: Tube, now: float) -> None:
        while t.waiting and t.ready.top is not None and not t.unpause_at:
            session = next(iter(t.waiting))
            job = self.jobs[key_id(t.ready.top)]
            self.stop_waiting(session)
            self._ready_remove(job)
            self.reserve(session, job, now)
            self.grant(session, job)

    # -- leaving a state -----------------------------------------------------------
    def take(self, job: Job) -> None:
        """Remove a job from the container of its current state."""
        t = job.tube
        if job.state == READY:
            self._ready_remove(job)
        elif job.state == DELAYED:
            t.delayed.remove((job.deadline, job.id))
            self.delayed_due.remove((job.deadline, job.id))
        elif job.state == BURIED:
            del t.buried[job.id]
        elif job.state == RESERVED:
            self.ttr_due.discard()
            del job.unhold().reserved[job.id]
            t.reserved -= 1

    # -- entering a state ----------------------------------------------------------
    def add(self, job: Job, delay_s: int, now: float) -> None:
        """A new job enters its tube (put)."""
        self.jobs[job.id] = job
        job.tube.total_jobs += 1
        if delay_s > 0:
            self.place(job, delay_s, now)
        else:
            self.make_ready(job, now)       # (what place does, one call fewer per put)

    def load(self, jobs: list[Job], now: float) -> None:
        """Bulk-enter recovered jobs (binlog) into an empty queue, each in its state and key.

        Sorted containers are filled with one `update` each (a sort) instead of a
        million inserts.  Delayed jobs already due become ready at the first expire;
        buried jobs keep their bury order (their key)."""
        ready: dict[Tube, list] = {}
        delayed = []
        buried = []
        for job in jobs:
            self.jobs[job.id] = job
            t = job.tube
            if job.state == READY:
                ready.setdefault(t, []).append(job)
                t.urgent += job.pri < URGENT_PRI
                job.deadline = now      # (ready since the restart, as far as we know)
            elif job.state == DELAYED:
                delayed.append((job.deadline, job.id))
            else:
                buried.append(job)
        for t, tube_jobs in ready.items():
            t.ready.fill(tube_jobs)
            for job in tube_jobs:
                t.ready_since.add(job)
            self.stale_tops[t] = None
        for key in delayed:
            self.jobs[key[1]].tube.delayed.add(key)
        self.delayed_due.update(delayed)
        self.soonest = -math.inf
        buried.sort(key=lambda j: j.deadline)
        for job in buried:
            job.tube.buried[job.id] = job
        self.bury_seq = max(self.bury_seq, int(buried[-1].deadline) if buried else 0)

    def place(self, job: Job, delay_s: int, now: float) -> None:
        """Make a job READY, or DELAYED for delay_s seconds."""
        if delay_s > 0:
            job.state = DELAYED
            job.deadline = now + delay_s
            job.tube.delayed.add((job.deadline, job.id))
            self.delayed_due.add((job.deadline, job.id))
            if job.deadline < self.soonest:
                self.soonest = job.deadline
        else:
            self.make_ready(job, now)

    def reserve(self, session: Session, job: Job, now: float) -> None:
        """Give `job` (already taken from its container) to `session`."""
        t = job.tube
        if job.state == READY:                  # (reserve-job also takes delayed and buried)
            waited, h = now - job.deadline, t.metrics.wait      # (Histogram.observe inlined:
            h.counts[bisect_left(WAIT_BUCKETS, waited)] += 1    # the call was half its cost)
            h.sum += waited
        job.state = RESERVED
        job.hold(session, now)
        job.deadline = now + job.times[1]       # (its ttr_s)
        t.reserved += 1
        t.reserves += 1
        session.reserved[job.id] = job
        self.ttr_due.add(job.deadline, job.id)
        if job.deadline < self.soonest:
            self.soonest = job.deadline
        if self.held is not None:
            self.held(job)

    def bury(self, job: Job) -> None:
        self.bury_seq += 1
        job.state = BURIED
        job.deadline = float(self.bury_seq)
        job.tube.buried[job.id] = job

    def delete(self, job: Job, now: float) -> None:
        if job.state == RESERVED:
            ran, h = now - job.counts[RESERVED_AT], job.tube.metrics.run
            h.counts[bisect_left(WAIT_BUCKETS, ran)] += 1       # (Histogram.observe, inlined)
            h.sum += ran
        self.take(job)
        del self.jobs[job.id]
        self.maybe_free(job.tube)

    def touch(self, job: Job, now: float) -> None:
        self.ttr_due.discard()
        job.deadline = now + job.ttr_s
        self.ttr_due.add(job.deadline, job.id)
        if job.deadline < self.soonest:
            self.soonest = job.deadline

    # -- reserve -------------------------------------------------------------------
    def best_ready(self, session: Session) -> Job | None:
        """The (pri, id)-smallest ready job across the session's unpaused watched tubes."""
        if len(session.watch) <= _FEW_TUBES:
            best = None
            for t in session.watch:
                k = t.ready.top
                if k is not None and not t.unpause_at:
                    if best is None or k < best:
                        best = k
            return None if best is None else self.jobs[key_id(best)]
        watched = session.watched
        if self.stale_tops:
            self._refresh_tops()
        for key, t in self.tops:          # best first: stop at the first watched tube
            if t in watched:
                return self.jobs[key_id(key)]
        return None

    def in_margin(self, session: Session, now: float) -> bool:
        d = session.soonest_deadline()
        return d is not None and now >= d - SAFETY_MARGIN_S

    def wait(self, session: Session, timeout_s: float | None, now: float) -> None:
        """Block `session` in reserve until a job, its timeout, or DEADLINE_SOON."""
        session.waiting = True
        session.wait_until = None if timeout_s is None else now + timeout_s
        for t in session.watch:
            t.waiting[session] = None
        self.waiting_count += 1
        self._schedule_wake(session)

    def _schedule_wake(self, session: Session) -> None:
        when = session.wait_until
        soonest = session.soonest_deadline()
        if soonest is not None:
            margin = soonest - SAFETY_MARGIN_S
            when = margin if when is None else min(when, margin)
        if when is not None:
            seq = next(self._seq)
            session.wake = (when, seq)
            self.wakes.add(session.wake)
            if when < self.soonest:
                self.soonest = when
            self.wake_sessions[seq] = session

    def stop_waiting(self, session: Session) -> None:
        if not session.waiting:
            return
        session.waiting = False
        for t in session.watch:
            t.waiting.pop(session, None)
        self.waiting_count -= 1
        if session.wake is not None:
            self.wakes.remove(session.wake)
            del self.wake_sessions[session.wake[1]]
            session.wake = None

    # -- kick ----------------------------------------------------------------------
    def kick_victims(self, t: Tube, bound: int) -> list[Job]:
        """What `kick bound` moves: up to `bound` buried jobs of `t`, or if none is
        buried, delayed ones (in bury order / due order)."""
        if t.buried:
            return list(itertools.islice(t.buried.values(), bound))
        return [self.jobs[i] for _, i in t.delayed.islice(0, bound)]

    def kick_job(self, job: Job, now: float) -> None:
        self.take(job)
        job.bump(KICKS)
        self.make_ready(job, now)

    # -- pause ---------------------------------------------------------------------
    def pause(self, t: Tube, delay_s: int, now: float) -> None:
        if t.unpause_at:
            self.paused.remove((t.unpause_at, t.name))
        self.stale_tops[t] = None
        t.pause_s = delay_s
        # pause 0 ends at the next expire (beanstalkd: 1 ns), waking waiters at once
        t.unpause_at = now + delay_s
        self.paused.add((t.unpause_at, t.name))
        if t.unpause_at < self.soonest:
            self.soonest = t.unpause_at

    def _unpause(self, t: Tube, now: float) -> None:
        self.paused.remove((t.unpause_at, t.name))
        t.unpause_at = 0.0
        t.pause_s = 0
        self.stale_tops[t] = None
        if t.ready.top is not None:
            self._serve_waiters(t, now)

    # -- timers --------------------------------------------------------------------
    def next_deadline(self) -> float | None:
        # (after every turn: unrolled, with no tuple or generator built each time)
        d = self.delayed_due[0][0] if self.delayed_due else None
        ttr = self.ttr_due.first()
        if ttr is not None and (d is None or ttr[0] < d):
            d = ttr[0]
        if self.wakes and (d is None or self.wakes[0][0] < d):
            d = self.wakes[0][0]
        if self.paused and (d is None or self.paused[0][0] < d):
            d = self.paused[0][0]
        return d

    def expire(self, now: float) -> None:
        """Fire every timer due at `now`, in beanstalkd's order: delays, pauses, sessions."""
        while self.delayed_due and self.delayed_due[0][0] <= now:
            job = self.jobs[self.delayed_due[0][1]]
            self.take(job)
            self.make_ready(job, now)
        while self.paused and self.paused[0][0] <= now:
            self._unpause(self.tubes[self.paused[0][1]], now)
        while (ttr := self.ttr_due.first()) is not None and ttr[0] <= now:
            self._time_out(self.jobs[ttr[1]], now)
        while self.wakes and self.wakes[0][0] <= now:
            self._wake(self.wake_sessions[self.wakes[0][1]], now)

    def _time_out(self, job: Job, now: float) -> None:
        holder = job.holder
        self.take(job)
        job.bump(TIMEOUTS)
        self.job_timeouts += 1
        if holder.waiting:            # its DEADLINE_SOON time may have moved
            self._reschedule(holder)
        self.make_ready(job, now)

    def _reschedule(self, session: Session) -> None:
        if session.wake is not None:
            self.wakes.remove(session.wake)
            del self.wake_sessions[session.wake[1]]
            session.wake = None
        self._schedule_wake(session)

    def _wake(self, session: Session, now: float) -> None:
        if self.in_margin(session, now):
            self.stop_waiting(session)
            self.deadline_soon(session)
        elif session.wait_until is not None and now >= session.wait_until:
            self.stop_waiting(session)
            self.timed_out(session)
        else:
            self._reschedule(session)


class Deadlines:
    """(deadline, id) timers, soonest first, as a binary heap with lazy removal: `add`
    pushes, `discard` only counts an entry as stale (the caller has changed its job so that
    `live(deadline, id)` no longer holds), `first` drops stale entries from the top. Once
    stale entries outnumber live ones by _STALE_SLACK the heap is rebuilt from the live
    ones, so it never holds much more than twice what is live."""
    __slots__ = ("heap", "live_count", "live")

    def __init__(self, live: Callable[[float, int], bool]) -> None:
        self.heap: list[tuple[float, int]] = []
        self.live_count = 0
        self.live = live

    def __len__(self) -> int:
        return self.live_count

    def add(self, deadline: float, job_id: int) -> None:
        heapq.heappush(self.heap, (deadline, job_id))
        self.live_count += 1

    def discard(self) -> None:
        self.live_count -= 1
        if len(self.heap) > 2 * self.live_count + _STALE_SLACK:
            live = self.live
            self.heap = [entry for entry in self.heap if live(*entry)]
            heapq.heapify(self.heap)

    def first(self) -> tuple[float, int] | None:
        heap, live = self.heap, self.live
        while heap and not live(*heap[0]):
            heapq.heappop(heap)
        return heap[0] if heap else None

