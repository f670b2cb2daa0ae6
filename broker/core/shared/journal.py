"""The journal: all the core tells durability, and all durability gives back.

The core never imports a journal's implementation (tests/project/test_layout.py holds
that); it is handed one (`Journal`), and `NullJournal` stands in when nothing is kept, so
no component asks whether there is one.  How a change reaches it:

    if not journal.room[kind](subject):    # may this change be accepted?  (a full disk,
        return OUT_OF_MEMORY               #  a full stream: refuse, change nothing)
    ... change the state ...
    journal.append[kind](subject)          # the record, as the subject is now

A record is a kind (below) and its subject, the live object it is about (a Job, a Task,
a Schedule, the gates' TATs): the journal encodes it at once, so a later change of the
subject is a later record.  `room[kind]` reserves what the record needs and what it
promises later (a put reserves its delete; a new task its TASK_GONE; a call its start
and its end), so an acknowledged change never waits for space it was not given.  `room`
and `append` are tables of functions by kind, not methods taking the kind, and no object
is made per record: a put costs the journal two calls, whatever the journal.

Once per turn the actor calls `end_turn(now, live)`, which writes the turn's records as
one unit and returns its ticket; `durable` is the highest ticket whose records are
durable (it only grows); when `hold_replies` is true no reply of a turn leaves before its
ticket is durable (`-f 0`, and a replicated journal), and the actor says so with
`wait_for(ticket)`: a journal whose turn without records would otherwise never become
durable (a replicated one: a deposed writer must not answer from memory) appends an
empty barrier then.  `start(loop, on_durable)` lets a
journal work on the actor's loop and call back when `durable` moved.  `maintain(live)`
compacts, reading the state through `live` (a LiveView, read-only by convention).
`close(now)` is a graceful stop: after the held-jobs records the core appends, everything
is made durable.  A broker restarts from `restore()`: the replayed state as images of
jobs, tasks and schedules, in the vocabulary below, so the core rebuilds its objects
without knowing any record's bytes; `state_id` says which state that is.

A replicated journal (wal/jetstream.py) sets `logs_reserves`: every reserve appends the
job's JOB_HELD then, so a broker that takes over keeps the job for its holder (the queue
calls it, `Queue.held`); the binlog logs them only at a graceful stop, as beanstalkd logs
no reserve.  `failed`, once not None, is (exit code, why): the journal can no longer make
anything durable (another writer deposed it, it was unreachable too long); the actor then
drops the replies it holds and stops with that code.

What a second implementation (a replicated log) must provide: the same tables and
methods, each record kind round-tripped into the same images, `room` refusing when it
cannot promise the record, tickets and `durable` as above, `stats`, and a job's `file` (beanstalkd's
stats-job shows it; 0 is fine) kept on the Job.
"""
from typing import Any, Callable, Collection, NamedTuple, Protocol, Sequence

# -- record kinds: (kind, subject) ---------------------------------------------------------
JOB_PUT = 0         # Job: a new job (room: its record and its future delete)
JOB_UPDATE = 1      # Job: bury, kick, release with a delay (beanstalkd logs only these)
JOB_HELD = 2        # Job: a graceful stop: a client holds it (the next broker keeps it)
JOB_DELETE = 3      # Job: gone (its room came with its put)
TASK_NEW = 4        # Task: enqueued (room: its record and its TASK_GONE)
TASK_CALL = 5       # Task: room only: the two states of a call, its start and its end
TASK_STATE = 6      # Task: a start, retry, failure or cancel (room: one state)
TASK_END = 7        # Task: a call's end, a whole record when it carries a result (room:
                    #   that record, in place of the state reserved with the call)
TASK_GONE = 8       # Task: keepResult passed, or cancelled and forgotten
SCHEDULE_NEW = 9    # Schedule: room for its record and its SCHEDULE_GONE (append: SCHEDULE)
SCHEDULE = 10       # Schedule: the whole schedule as it is now (made, fired, paused)
SCHEDULE_GONE = 11  # Schedule: deleted
GATES = 12          # {function: TAT, wall-clock seconds}: the slow rates' last starts
ROOM_DRAW = 13      # RoomDraw: a room event's opening drew its pre-line's order (the
                    #   journal keeps each function's latest for good: there is no GONE)
FUNCTION_PAUSE = 14     # (name, paused): an operator paused a function or resumed it
TASK_WHOLE = 15     # Task: its whole record again, for what no state record carries: an
                    #   operator's retry of a failed or cancelled task, a late report that a
                    #   cancelled task's aborted call may have run (room: that record; its
                    #   TASK_GONE was reserved at enqueue)
KINDS = ("JOB_PUT", "JOB_UPDATE", "JOB_HELD", "JOB_DELETE", "TASK_NEW", "TASK_CALL",
         "TASK_STATE", "TASK_END", "TASK_GONE", "SCHEDULE_NEW", "SCHEDULE", "SCHEDULE_GONE",
         "GATES", "ROOM_DRAW", "FUNCTION_PAUSE", "TASK_WHOLE")

# -- what restore gives back ----------------------------------------------------------------
#: a replayed job is (rec, tube, body, file): `rec` a tuple with these fields at these
#: places (times wall-clock), so a million of them rebuild without a name lookup each, and
#: `file` its stats-job `file`
JOB_ID, JOB_PRI, JOB_DELAY, JOB_TTR, JOB_CREATED, JOB_KEY, JOB_STATE = 1, 2, 3, 4, 5, 6, 7
JOB_COUNTS = slice(8, 13)       # reserves, timeouts, releases, buries, kicks
#: a replayed job's state; its key is the wall-clock time it is delayed until (DELAYED) or
#: its bury sequence (BURIED)
READY, DELAYED, BURIED, HELD = 1, 2, 3, 4


class TaskImage(NamedTuple):
    """A replayed task (times wall-clock; None where it has none)."""
    uid: str
    function: str
    params: bytes
    priority: int
    seq: int
    attempts: int
    backoff: tuple              # (kind, delay_ms, max_delay_ms, jitter)
    timeout_ms: int
    delivery: str
    keep_result_ms: int
    created: float
    status: str
    attempt: int
    started: float | None
    finished: float | None
    due: float
    expires: float
    status_code: int | None
    error: str | None
    result: bytes | None
    level: int = 0
    queue_deadline: float | None = None
    request: Any = None         # a request task's fields (tasks/requests.py reads them)
    result_headers: dict | None = None
    balance_key: str | None = None
    client_ip: str | None = None
    online: bool = False
    pass_exp: float | None = None
    ended_by: str | None = None
    group: str = ""             # its tenant ("": none; older journals have none)
    token_sha256: bytes | None = None   # its own token's digest (older journals: none)
    possibly_executed: bool = False     # a cancelled task's aborted call may have run


class ScheduleImage(NamedTuple):
    """A replayed schedule (times wall-clock)."""
    name: str
    cron: str
    timezone: str
    function: str
    params: bytes
    options: Any
    paused: bool
    next_fire: float | None
    last_fire: float | None
    last_error: str | None
    created: float


class RoomDraw(NamedTuple):
    """A room event's draw (core/tasks/components/room.py), the record and its image: the
    function, the opening it was made for and the seed that orders its pre-line (the
    online tasks that joined before `opens_at`, wall-clock seconds)."""
    function: str
    opens_at: float
    seed: int


class Restored(NamedTuple):
    jobs: Collection            # (rec, tube, body, file) of each live job (a million: not copied)
    next_id: int                # ids continue from here
    tasks: list                 # TaskImage of each live task
    schedules: list             # ScheduleImage of each live schedule
    gates: dict                 # function -> the wall-clock TAT of its slow rate
    warnings: list = []         # what the journal found amiss (and logged), for tests
    draws: list = []            # RoomDraw: each function's latest (older journals: none)
    paused: list = []           # the functions an operator paused (FUNCTION_PAUSE)


class LiveView(Protocol):
    """The core's state as a journal may read it, never changes (compaction copies live
    records forward; a record of something gone since is not placed).  The Broker's
    `live` is one, over its own dicts."""
    jobs: dict                  # id -> Job
    next_id: int
    tasks: dict                 # uid -> Task
    schedules: dict             # name -> Schedule


class JournalStats(NamedTuple):
    """beanstalkd's binlog-* stats (zeros without -b; max_size is -s as given); and a
    replicated journal's role (leader, standby; '': no such keys), epoch and sequence."""
    oldest_index: int
    current_index: int
    records_written: int
    records_migrated: int
    max_size: int
    role: str = ""
    epoch: int = 0
    seq: int = 0


class Journal(Protocol):
    state_id: int               # the state restored (0: a fresh one: the core picks one)
    wall_offset: float          # wall clock = monotonic + this (set by the core)
    hold_replies: bool
    logs_reserves: bool         # a reserve appends JOB_HELD (a replicated journal)
    durable: int
    failed: tuple[int, str] | None  # (exit code, why): it can make nothing durable now

    room: Sequence[Callable[[Any], bool]]       # by record kind: may it be accepted?
    append: Sequence[Callable[[Any], None]]     # by record kind: the record
    def stats(self) -> JournalStats: ...
    def samples(self) -> list: ...         # what /metrics shows of it (codecs/prometheus)
    def restore(self, max_job_size: int) -> Restored: ...
    def start(self, loop, on_durable: Callable[[], None]) -> None: ...
    def end_turn(self, now: float, live: LiveView) -> int: ...
    def wait_for(self, ticket: int) -> None: ...    # replies wait for `ticket`
    def due(self) -> float | None: ...
    def maintain(self, live: LiveView) -> None: ...
    def close(self, now: float | None = None, live: LiveView | None = None) -> None: ...


def accept(subject) -> bool:
    """A room entry for a record that needs none."""
    return True


def ignore(subject) -> None:
    """An append entry for a record a journal does not keep."""


def by_kind(default, entries: dict) -> tuple:
    """A `room` or `append` table: `entries` by record kind, `default` for the others."""
    table = [default] * len(KINDS)
    for kind, entry in entries.items():
        table[kind] = entry
    return tuple(table)


class NullJournal:
    """No durability: every change is accepted and nothing is kept; every turn is durable
    at once, so no reply waits.  `max_size` is what `stats` says of -s."""
    state_id = 0
    wall_offset = 0.0
    hold_replies = False
    logs_reserves = False
    durable = 0
    failed = None

    def __init__(self, max_size: int = 10485760) -> None:
        self.max_size = max_size

    room = by_kind(accept, {})
    append = by_kind(ignore, {})

    def stats(self) -> JournalStats:
        return JournalStats(0, 0, 0, 0, self.max_size)

    def samples(self) -> list:
        return []

    def restore(self, max_job_size: int = 65535) -> Restored:
        return Restored([], 1, [], [], {})

    def start(self, loop, on_durable: Callable[[], None]) -> None:
        pass

    def end_turn(self, now: float, live: LiveView) -> int:
        return 0

    def wait_for(self, ticket: int) -> None:
        pass

    def due(self) -> float | None:
        return None

    def maintain(self, live: LiveView) -> None:
        pass

    def close(self, now: float | None = None, live: LiveView | None = None) -> None:
        pass

