"""Every record of the journal, both ways: the core's objects (a Job, a Task, a Schedule)
as the lists and images format.py packs into bytes, and what a replay read back as the
core's images (core/shared/journal.py: TaskImage, ScheduleImage; a job's record tuple is
read in place).  binlog.py decides when and where a record goes; this module only what is
in it, so a second journal writes the same records.

Times: the core's are monotonic, a record's wall-clock, `wall` being the offset between
them (the core's `wall_offset`).  A task's optional fields (format 4's map) hold only what
is not a default, and what a newer zstalk wrote that this one does not know, as it was
(`extra`: the journal keeps it per task, so a compaction here loses nothing).
"""
from __future__ import annotations

from . import format as wf
from ..core.beanstalk.jobs import BURIED, COUNTERS, DELAYED, Job
from ..core.shared import journal as J
from ..core.schedules.schedules import Schedule
from ..core.tasks.store import TASK_ERROR_CHARS, Task
from ...protocol.schema.task_messages import digest

_NO_COUNTS = (0,) * len(COUNTERS)


# -- jobs --------------------------------------------------------------------------------
def job_image(job: Job, wall: float) -> wf.Image:
    """A job as a full JOB record holds it (its state, and where in it: due time or bury
    order)."""
    state, key = wf.S_READY, 0.0
    if job.state == DELAYED:
        state, key = wf.S_DELAYED, job.deadline + wall
    elif job.state == BURIED:
        state, key = wf.S_BURIED, job.deadline
    return wf.Image(job.id, job.tube.name, job.pri, job.delay_s, job.ttr_s, job.created + wall,
                    state, key, tuple(job.counts[:len(COUNTERS)]) if job.counts else _NO_COUNTS,
                    job.body)


def new_job(job: Job, tube: bytes, wall: float) -> bytes:
    """A put's JOB record (`tube` encoded once per tube by the caller)."""
    return wf.encode_new_job(job.id, tube, job.pri, job.delay_s, job.ttr_s, job.created + wall,
                             job.deadline + wall if job.state == DELAYED else 0.0, job.body)


# -- tasks -------------------------------------------------------------------------------
def task_state(task: Task, wall: float) -> list:
    """What a TASK_STATE holds (after the uid), and a TASK record from `status` on."""
    return [task.status, task.attempt,
            None if task.started is None else task.started + wall,
            None if task.finished is None else task.finished + wall,
            task.due + wall, task.expires + wall, task.status_code, task.error]


def task_fields(task: Task, wall: float) -> list:
    """A TASK record's list, without the result."""
    b = task.backoff
    return [task.uid, task.function, task.params, task.priority, task.seq, task.attempts,
            [b.kind, b.delay_ms, b.max_delay_ms, b.jitter], task.timeout_ms, task.delivery,
            task.keep_result_ms, task.created + wall, *task_state(task, wall)]


def task_optional(task: Task, extra: dict | None, wall: float) -> dict:
    """A TASK record's map of optional fields (format 4)."""
    out = dict(extra) if extra else {}
    if task.level:
        out["level"] = task.level
    if task.queue_deadline:
        out["queue_deadline"] = task.queue_deadline + wall
    if task.request is not None:
        out["request"] = task.request.fields()
    if task.result_headers:
        out["result_headers"] = task.result_headers
    if task.balance_key is not None:
        out["balance_key"] = task.balance_key
    if task.client_ip is not None:
        out["client_ip"] = task.client_ip
    if task.group:
        out["group"] = task.group
    if task.token is not None:
        out["token_sha256"] = task.token
    if task.possibly_executed:
        out["possibly_executed"] = True
    if task.online:
        out["online"] = True
        if task.pass_exp:
            out["pass_exp"] = task.pass_exp + wall
        if task.ended_by:
            out["ended_by"] = task.ended_by
    return out


def task_record(task: Task, result: bytes | None, extra: dict | None, wall: float) -> bytes:
    """The whole task, with `result` (its own, or None to size one without it)."""
    return wf.encode_task([*task_fields(task, wall), result, task_optional(task, extra, wall)])


#: a TASK_STATE without its uid and error: the longest status, an attempt, four times, a
#: status code, as msgpack encodes them at most (state_room)
_TASK_STATE_FIXED = len(wf.encode_task_state("", ["cancelled", 1 << 62, 1e18, 1e18, 1e18, 1e18,
                                                  1 << 62, ""]))


def task_state_max(uid: str) -> int:
    """The largest TASK_STATE this task can have (its error text is cut to
    TASK_ERROR_CHARS)."""
    return _TASK_STATE_FIXED + len(uid.encode()) + 4 * TASK_ERROR_CHARS


def task_image(fields: list) -> J.TaskImage:
    """A replayed TASK record's list (its result after the fields, format 4's optional map
    after that) as the core's image: an optional field that is not what it should be is
    left at the image's default."""
    optional = fields[wf.T_OPTIONAL] if len(fields) > wf.T_OPTIONAL else {}
    named = {k: optional[k] for k in wf.TASK_OPTIONAL if k in optional}
    for name in ("balance_key", "client_ip", "ended_by", "group"):
        if type(named.get(name)) is not str:
            named.pop(name, None)
    named["online"] = optional.get("online") is True
    named["possibly_executed"] = optional.get("possibly_executed") is True
    for name in ("queue_deadline", "pass_exp"):
        if not isinstance(named.get(name), (int, float)) or isinstance(named[name], bool):
            named.pop(name, None)
    if type(named.get("level")) is not int:
        named.pop("level", None)
    if digest(named.get("token_sha256")) is None:    # (a wrong one: no token, refuse all)
        named.pop("token_sha256", None)
    return J.TaskImage(*fields[:wf.T_OPTIONAL], **named)


def unknown_optional(fields: list) -> dict:
    """What a replayed TASK record's optional map holds that this zstalk does not know."""
    optional = fields[wf.T_OPTIONAL] if len(fields) > wf.T_OPTIONAL else {}
    return {k: v for k, v in optional.items() if k not in wf.TASK_OPTIONAL}


# -- schedules ---------------------------------------------------------------------------
def schedule_fields(s: Schedule) -> list:
    return [s.name, s.expr, s.zone.key, s.function, s.params, s.options, s.paused,
            s.next_fire, s.last_fire, s.last_error, s.created]


def schedule_max(s: Schedule) -> int:
    """The largest record the schedule can have: what changes (times, the last error, cut
    to TASK_ERROR_CHARS) at its largest, so a reservation made before a change covers the
    record written after it."""
    fixed = wf.encode_schedule([s.name, s.expr, s.zone.key, s.function, s.params,
                                s.options, False, 1.0, 1.0, None, s.created])
    return len(fixed) + 4 * TASK_ERROR_CHARS + 5


def schedule_image(fields: list) -> J.ScheduleImage:
    return J.ScheduleImage(*fields)


# -- room draws --------------------------------------------------------------------------
def draw_fields(draw: J.RoomDraw) -> list:
    return [draw.function, draw.opens_at, draw.seed]


def draw_image(fields: list) -> J.RoomDraw:
    return J.RoomDraw(fields[0], float(fields[1]), fields[2])


class DrawBooks:
    """A journal's own books on the room draws, each function's latest: its record's
    list, size and place (`file`: a binlog segment, a stream message; the journal moves
    it as it writes).  A draw has no live object in the core's LiveView, so compaction
    copies it forward from here, and never drops it (there is no GONE)."""
    __slots__ = ("fields", "size", "file")

    def __init__(self) -> None:
        self.fields: dict[str, list] = {}
        self.size: dict[str, int] = {}
        self.file: dict[str, int] = {}

    def logged(self, fields: list) -> tuple[bytes, int]:
        """The ROOM_DRAW record of `fields`, now its function's latest, and how much the
        live records' bytes grow by it."""
        name, record = fields[0], wf.encode_room_draw(fields)
        grown = len(record) - self.size.get(name, 0)
        self.size[name], self.fields[name] = len(record), fields
        return record, grown

    def restore(self, replayed: dict) -> list[J.RoomDraw]:
        """A replay's draws (function -> (list, place)) in the books, as the core's images."""
        for name, (fields, seq) in replayed.items():
            self.fields[name], self.file[name] = fields, seq
            self.size[name] = len(wf.encode_room_draw(fields))
        return [draw_image(fields) for fields, _ in replayed.values()]

    def placed_in(self, seq: int) -> list[str]:
        """The functions whose latest draw is in segment or message `seq`."""
        return [name for name, at in self.file.items() if at == seq]
