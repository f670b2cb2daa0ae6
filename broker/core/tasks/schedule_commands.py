"""The broker's side of cron schedules: the ops an HTTP front sends about them, and the
firing of due schedules into ordinary tasks (mixed into the Broker like task_commands.py).

A fire enqueues through the task store exactly as a request would, with the schedule's
params and options, priority = the fire time in ms (unless the options set one) and the
fire's own uniqueId (schedules.fire_id): a fire the binlog already holds, replayed after
a restart, is a duplicate and enqueues nothing more.  A fire that cannot enqueue (its
function gone from the config, draining, memory or disk full) is skipped and says why
in the schedule's lastError; the schedule moves on either way.
"""
from __future__ import annotations

import logging

from ....protocol.schema import R
from .schedules import Fire, fire_id
from .store import MAX_PAGE, Task, TaskError

log = logging.getLogger("zstalk.broker")
#: a wall clock that moved this much against the monotonic one was stepped
WALL_STEP_S = 1.0


class ScheduleCommands:
    def t_schedule(self, s, op, now):
        _, conn, name, expr, zone, function, params, options = op
        if type(params) is not bytes:
            return (conn, R.T_ERROR, "bad_request", "malformed schedule")
        made = self.schedules.create(name, expr, zone, function, params, options, now)
        if isinstance(made, TaskError):
            return (conn, R.T_ERROR, *made)
        return (conn, R.T_SCHEDULE, self.schedules.info(made))

    def t_schedules(self, s, op, now):
        _, conn, after, limit = op
        if type(after) is not str or type(limit) is not int or not 1 <= limit <= MAX_PAGE:
            return (conn, R.T_ERROR, "bad_request", f"limit is 1 to {MAX_PAGE}")
        infos, more = self.schedules.page(after, limit)
        return (conn, R.T_SCHEDULES, infos, more)

    def t_schedule_info(self, s, op, now):
        found = self.schedules.by_name.get(op[2]) if type(op[2]) is str else None
        if found is None:
            return (s.conn, R.T_ERROR, "not_found", f"no schedule {op[2]!r}")
        return (s.conn, R.T_SCHEDULE, self.schedules.info(found))

    def t_unschedule(self, s, op, now):
        return self._schedule_reply(s, self.schedules.delete(op[2], now))

    def t_schedule_pause(self, s, op, now):
        return self._schedule_reply(s, self.schedules.pause(op[2], op[3], now))

    def _schedule_reply(self, s, result):
        if isinstance(result, TaskError):
            return (s.conn, R.T_ERROR, *result)
        return (s.conn, R.T_SCHEDULE, self.schedules.info(result))

    def observe_wall(self, wall: float, now: float) -> None:
        """The wall clock read at monotonic `now`.  A step (WALL_STEP_S or more) makes every
        schedule compute its next fire again from the new time (no burst, no repeat);
        a smaller difference (NTP slewing) just moves the fires with it."""
        offset = wall - now
        drift = offset - self.schedules.wall_offset
        if abs(drift) >= WALL_STEP_S:
            log.warning("the wall clock moved %+.3f s: schedules recomputed", drift)
            self.schedules.reclock(offset, now)
        elif drift:
            self.schedules.wall_offset = offset

    # -- firing ----------------------------------------------------------------------------
    def _fire_schedules(self, fires: list[Fire], now: float) -> None:
        for fire in fires:
            sched = fire.schedule
            logged = self.wal is None or self.wal.reserve_schedule(sched)
            error = self._fire(fire, now) if logged else "the binlog's disk is full"
            self.schedules.fired(fire, error, now, log=logged)
        if fires:
            self._feed_dispatchers(now)

    def _fire(self, fire: Fire, now: float) -> str | None:
        """Enqueue the fire's task; None, or why it enqueued nothing."""
        sched = fire.schedule
        refused = self._admit(len(sched.params))
        if refused is not None:
            return refused[1]
        at_ms = round(fire.at * 1000)
        options = {"priority": at_ms, **sched.options, "uniqueId": fire_id(sched.name, fire.at)}
        task = self.tasks.enqueue(sched.function, sched.params, options, now)
        if isinstance(task, Task) or task.code == "duplicate":     # (replayed: already in)
            return None
        return task.message
