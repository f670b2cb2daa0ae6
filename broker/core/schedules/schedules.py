"""Cron schedules: the broker fires function tasks on 6-field cron expressions (cron.py).

Pure, like the task store it feeds: every method that depends on time takes `now`
(monotonic seconds); wall-clock values are `now + wall_offset`, and a schedule's fire
times are wall-clock (UTC epoch seconds), since that is what cron means.

A schedule is a name, a cron expression in an IANA time zone, and the task to enqueue
(function, params, options, checked as a task's when the schedule is made).  `due`
hands the core each schedule whose next fire time has come, with that time; the core
enqueues one ordinary task for it, with priority = the fire time in ms (unless the
options set one) and a uniqueId derived from the name and the fire time (`fire_id`), so
one fire can never be enqueued twice, not even by a broker replaying its binlog; then
`fired` moves the schedule on to its first fire time after both that fire and the wall
clock now.  So a broker that was down fires a missed time once when it comes back, not
once per missed time, and a paused schedule that is resumed starts from now.

The wall clock may be stepped (NTP, an operator): `reclock` takes the new offset and
recomputes every next fire from the new wall time; nothing fires in a burst for the
times the step skipped, and nothing fires twice for the times it repeats.

Errors are data: TaskError(code, message), as the task store's (tasks.py).
"""
from __future__ import annotations

from typing import Any, NamedTuple

from sortedcontainers import SortedList

from ....protocol.schema.tasks import SCHEDULE_NAME
from ..shared.journal import SCHEDULE, SCHEDULE_GONE, SCHEDULE_NEW, Journal, NullJournal
from ..tasks.store import TASK_ERROR_CHARS, TaskError, Tasks, parse_options

#: a schedule's name: the characters of a task's uniqueId, up to 64
NAME = SCHEDULE_NAME
MAX_SCHEDULES = 100_000
#: what one schedule costs beyond its params, for --max-jobs-bytes
SCHEDULE_OVERHEAD_BYTES = 1024


class Schedule:
    __slots__ = ("name", "expr", "cron", "zone", "function", "params", "options", "paused",
                 "next_fire", "last_fire", "last_error", "created")

    def __init__(self, name: str, expr: str, parsed, zone, function: str, params: bytes,
                 options: dict, created: float) -> None:
        self.name = name
        self.expr = expr                # as given
        self.cron = parsed              # cron.parse(expr)
        self.zone = zone                # a ZoneInfo
        self.function = function
        self.params = params            # the JSON body of every task it enqueues
        self.options = options          # the tasks' options, as given (checked)
        self.paused = False
        self.next_fire: float | None = None     # wall clock; None: paused, or never again
        self.last_fire: float | None = None
        self.last_error: str | None = None      # why the last fire enqueued nothing
        self.created = created          # wall clock


class Fire(NamedTuple):
    schedule: Schedule
    at: float                   # the fire time (wall clock)


def fire_id(name: str, at: float) -> str:
    """The uniqueId of the task a fire enqueues: the same fire, the same id."""
    import hashlib          # (here and cron below: a broker without schedules starts faster)
    return hashlib.sha256(f"{name}\0{round(at * 1000)}".encode()).hexdigest()[:32]


class Schedules:
    def __init__(self, tasks: Tasks, wall_offset: float = 0.0) -> None:
        self.tasks = tasks              # where fires go, and whose functions they name
        self.wall_offset = wall_offset
        self.by_name: dict[str, Schedule] = {}
        self.timers = SortedList()      # (next_fire, name) of schedules that will fire
        self.bytes = 0
        self.journal: Journal = NullJournal()     # what is kept of changes (set by the core)

    # -- making and changing -------------------------------------------------------------
    def create(self, name: Any, expr: Any, zone_name: Any, function: Any, params: bytes,
               options: Any, now: float) -> Schedule | TaskError:
        """A new schedule, or why not (then nothing changed)."""
        if not isinstance(name, str) or not NAME.fullmatch(name):
            return _bad("name must be 1 to 64 characters of A-Z a-z 0-9 _ . : -")
        if not isinstance(expr, str):
            return _bad("cron must be a string of 6 fields, seconds first")
        from . import cron
        parsed = cron.parse(expr)
        if isinstance(parsed, cron.CronError):
            return _bad(f"cron: {parsed.message}")
        if not isinstance(zone_name, str):
            return _bad("timezone must be a string (an IANA name such as Europe/Berlin)")
        zone = cron.zone(zone_name)
        if isinstance(zone, cron.CronError):
            return _bad(zone.message)
        spec = self.tasks.function(function) if isinstance(function, str) else None
        if spec is None:
            return TaskError("unknown_function", f"no function named {function!r}")
        checked = parse_options(options, spec)
        if isinstance(checked, TaskError):
            return checked
        if "uniqueId" in checked:
            return _bad("a schedule's options may not set uniqueId: each fire makes its own")
        if name in self.by_name:
            return TaskError("duplicate", f"a schedule named {name!r} exists")
        if len(self.by_name) >= MAX_SCHEDULES:
            return TaskError("out_of_memory", f"{MAX_SCHEDULES} schedules at most")
        s = Schedule(name, expr, parsed, zone, function, params, options or {},
                     now + self.wall_offset)
        if not self.journal.room[SCHEDULE_NEW](s):
            return _NO_SPACE
        self._add(s)
        self._arm(s, now + self.wall_offset)
        self._log(s)
        return s

    def _add(self, s: Schedule) -> None:
        self.by_name[s.name] = s
        self.bytes += SCHEDULE_OVERHEAD_BYTES + len(s.params)

    def delete(self, name: Any, now: float) -> Schedule | TaskError:
        s = self.by_name.get(name) if isinstance(name, str) else None
        if s is None:
            return TaskError("not_found", f"no schedule {name!r}")
        self._disarm(s)
        del self.by_name[s.name]
        self.bytes -= SCHEDULE_OVERHEAD_BYTES + len(s.params)
        self.journal.append[SCHEDULE_GONE](s)
        return s

    def pause(self, name: Any, paused: Any, now: float) -> Schedule | TaskError:
        s = self.by_name.get(name) if isinstance(name, str) else None
        if s is None:
            return TaskError("not_found", f"no schedule {name!r}")
        if type(paused) is not bool:
            return _bad("paused must be true or false")
        if paused == s.paused:
            return s
        if not self.journal.room[SCHEDULE](s):
            return _NO_SPACE
        s.paused = paused
        self._disarm(s)
        if not paused:
            self._arm(s, now + self.wall_offset)
        self._log(s)
        return s

    def _arm(self, s: Schedule, after: float) -> None:
        """Set the next fire time: the first one after `after` (wall clock)."""
        from . import cron
        s.next_fire = None if s.paused else cron.next_fire(s.cron, s.zone, after)
        if s.next_fire is not None:
            self.timers.add((s.next_fire, s.name))

    def _disarm(self, s: Schedule) -> None:
        if s.next_fire is not None:
            self.timers.remove((s.next_fire, s.name))
            s.next_fire = None

    def _log(self, s: Schedule) -> None:
        self.journal.append[SCHEDULE](s)

    # -- looking ---------------------------------------------------------------------------
    def info(self, s: Schedule) -> dict:
        out: dict[str, Any] = {"name": s.name, "cron": s.expr, "timezone": s.zone.key,
                               "function": s.function, "params": s.params,
                               "options": s.options, "paused": s.paused,
                               "createdAt": s.created}
        if s.next_fire is not None:
            out["nextFireAt"] = s.next_fire
        if s.last_fire is not None:
            out["lastFireAt"] = s.last_fire
        if s.last_error is not None:
            out["lastError"] = s.last_error
        return out

    def page(self, after: str, limit: int) -> tuple[list[dict], str | None]:
        """Schedules by name after `after`; the name to go on from (None: no more)."""
        names = sorted(n for n in self.by_name if n > after)
        page = names[:limit]
        more = page[-1] if len(names) > limit else None
        return [self.info(self.by_name[n]) for n in page], more

    # -- firing ------------------------------------------------------------------------------
    def next_deadline(self) -> float | None:
        """When the next schedule fires (monotonic), if any will."""
        return self.timers[0][0] - self.wall_offset if self.timers else None

    def due(self, now: float) -> list[Fire]:
        """The schedules whose fire time has come, each with that time (taken off the
        timer list: call `fired` or `missed` for each)."""
        wall = now + self.wall_offset
        out = []
        while self.timers and self.timers[0][0] <= wall:
            at, name = self.timers.pop(0)
            s = self.by_name[name]
            s.next_fire = None
            out.append(Fire(s, at))
        return out

    def fired(self, fire: Fire, error: str | None, now: float, log: bool = True) -> None:
        """`fire` enqueued its task (error None) or could not: either way the schedule
        moves on to its first time after the fire and after now.  `log` False: there was
        no room in the binlog to say so (the fire enqueued nothing then)."""
        s = fire.schedule
        s.last_fire, s.last_error = fire.at, None if error is None else error[:TASK_ERROR_CHARS]
        self._arm(s, max(fire.at, now + self.wall_offset))
        if log:
            self._log(s)

    def reclock(self, wall_offset: float, now: float) -> None:
        """The wall clock was stepped: every next fire is computed again from it."""
        self.wall_offset = wall_offset
        self.timers.clear()
        wall = now + wall_offset
        for s in self.by_name.values():
            s.next_fire = None
            after = wall if s.last_fire is None else max(wall, s.last_fire)
            self._arm(s, after)

    # -- restart ---------------------------------------------------------------------------
    def restore(self, images: list, now: float) -> list[Fire]:
        """The schedules a journal restored (journal.ScheduleImage each); returns the
        fires missed while the broker was down: at most one per schedule, at the first
        time it missed, for the core to fire now (`fired` then moves it past now)."""
        from . import cron
        missed = []
        wall = now + self.wall_offset
        for i in images:
            s = Schedule(i.name, i.cron, cron.parse(i.cron), cron.zone(i.timezone), i.function,
                         i.params, i.options, i.created)
            s.paused, s.last_fire, s.last_error = i.paused, i.last_fire, i.last_error
            self._add(s)
            if i.paused or i.next_fire is None:
                continue
            if i.next_fire > wall:
                s.next_fire = i.next_fire
                self.timers.add((i.next_fire, i.name))
                continue
            missed.append(Fire(s, i.next_fire))  # the first time it missed, once
        return missed


_NO_SPACE = TaskError("out_of_space", "the binlog's disk is full")


def _bad(message: str) -> TaskError:
    return TaskError("bad_request", message)
