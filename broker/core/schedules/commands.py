"""The broker's side of cron schedules: the ops an HTTP front sends about them, and the
firing of due schedules into ordinary tasks, as one component of the Broker
(core/broker.py).

A fire enqueues through the task store exactly as a request would, with the schedule's
params and options, priority = the fire time in ms (unless the options set one) and the
fire's own uniqueId (schedules.fire_id): a fire the binlog already holds, replayed after
a restart, is a duplicate and enqueues nothing more.  A fire that cannot enqueue (its
function gone from the config, draining, memory or disk full) is skipped and says why
in the schedule's lastError; the schedule moves on either way.
"""
from __future__ import annotations

import logging

from ....protocol.codecs.prometheus import LATENCY_BUCKETS, Histogram
from ....protocol.schema import Op, R
from ..shared.journal import SCHEDULE, Journal
from .schedules import Fire, Schedules, fire_id
from ..tasks.store import MAX_PAGE, Task, TaskError

log = logging.getLogger("zstalk.broker")
#: a wall clock that moved this much against the monotonic one was stepped
WALL_STEP_S = 1.0
#: a smaller difference than this is the spread of reading the two clocks, not a clock
#: that moved (both are slewed alike by NTP; only a step moves one against the other)
WALL_JITTER_S = 0.001


class ScheduleCommands:
    """The schedules component: the schedule store, its ops, and the firing of due
    schedules into tasks through the tasks component, as a request would enqueue them."""

    def __init__(self, store: Schedules, tasks, journal: Journal) -> None:
        self.store = store
        self.tasks = tasks              # commands.TaskCommands: admit, the store, feed
        self.journal = journal
        self.fires = 0                  # (the metrics)
        self.lateness = Histogram(LATENCY_BUCKETS)

    def handlers(self) -> dict:
        return {Op.T_SCHEDULE: self.t_schedule, Op.T_SCHEDULES: self.t_schedules,
                Op.T_SCHEDULE_INFO: self.t_schedule_info, Op.T_UNSCHEDULE: self.t_unschedule,
                Op.T_SCHEDULE_PAUSE: self.t_schedule_pause}

    def t_schedule(self, s, op, now):
        _, conn, name, expr, zone, function, params, options = op
        if type(params) is not bytes:
            return (conn, R.T_ERROR, "bad_request", "malformed schedule")
        made = self.store.create(name, expr, zone, function, params, options, now)
        if isinstance(made, TaskError):
            return (conn, R.T_ERROR, *made)
        return (conn, R.T_SCHEDULE, self.store.info(made))

    def t_schedules(self, s, op, now):
        _, conn, after, limit = op
        if type(after) is not str or type(limit) is not int or not 1 <= limit <= MAX_PAGE:
            return (conn, R.T_ERROR, "bad_request", f"limit is 1 to {MAX_PAGE}")
        infos, more = self.store.page(after, limit)
        return (conn, R.T_SCHEDULES, infos, more)

    def t_schedule_info(self, s, op, now):
        found = self.store.by_name.get(op[2]) if type(op[2]) is str else None
        if found is None:
            return (s.conn, R.T_ERROR, "not_found", f"no schedule {op[2]!r}")
        return (s.conn, R.T_SCHEDULE, self.store.info(found))

    def t_unschedule(self, s, op, now):
        return self._schedule_reply(s, self.store.delete(op[2], now))

    def t_schedule_pause(self, s, op, now):
        return self._schedule_reply(s, self.store.pause(op[2], op[3], now))

    def _schedule_reply(self, s, result):
        if isinstance(result, TaskError):
            return (s.conn, R.T_ERROR, *result)
        return (s.conn, R.T_SCHEDULE, self.store.info(result))

    def observe_wall(self, wall: float, now: float) -> None:
        """The wall clock read at monotonic `now` (the two read together).  A step
        (WALL_STEP_S or more) makes every schedule compute its next fire again from the
        new time (no burst, no repeat); a smaller move just moves the fires with it; under
        WALL_JITTER_S nothing moves, so while the clock keeps its offset a schedule fires
        on the offset its task's createdAt is counted with: never before its fire time."""
        offset = wall - now
        drift = offset - self.store.wall_offset
        if abs(drift) >= WALL_STEP_S:
            log.warning("the wall clock moved %+.3f s: schedules recomputed", drift)
            self.store.reclock(offset, now)
        elif abs(drift) >= WALL_JITTER_S:
            self.store.wall_offset = offset

    # -- timers and firing ---------------------------------------------------------------
    def next_deadline(self) -> float | None:
        return self.store.next_deadline() if self.store.timers else None

    def expire(self, now: float) -> None:
        if self.store.timers:
            self.fire(self.store.due(now), now)

    def fire(self, fires: list[Fire], now: float) -> None:
        for fire in fires:
            self.fires += 1
            self.lateness.observe(max(0.0, now + self.store.wall_offset - fire.at))
            sched = fire.schedule
            logged = self.journal.room[SCHEDULE](sched)
            error = self._fire(fire, now) if logged else "the binlog's disk is full"
            self.store.fired(fire, error, now, log=logged)
        if fires:
            self.tasks.feed(now)

    def _fire(self, fire: Fire, now: float) -> str | None:
        """Enqueue the fire's task; None, or why it enqueued nothing."""
        sched = fire.schedule
        refused = self.tasks.admit(len(sched.params))
        if refused is not None:
            return refused[1]
        at_ms = round(fire.at * 1000)
        options = {"priority": at_ms, **sched.options, "uniqueId": fire_id(sched.name, fire.at)}
        task = self.tasks.store.enqueue(sched.function, sched.params, options, now)
        if isinstance(task, Task) or task.code == "duplicate":     # (replayed: already in)
            return None
        return task.message
