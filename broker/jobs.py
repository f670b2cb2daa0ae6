"""Jobs, their states, and tubes: the data the broker core moves around.

Job states and the commands that move a job between them (beanstalkd protocol.txt,
"Job Lifecycle"; ../shared/reference/beanstalkd.md §1.2):

    put (delay 0) ---------> READY <--- release(delay 0) / TTR expiry / holder gone --- RESERVED
    put (delay>0) -> DELAYED --(due)--^ ^-- kick / kick-job --- BURIED                    |
    DELAYED, BURIED --kick / kick-job--> READY                                            |
    READY --reserve / reserve-with-timeout--> RESERVED;  READY, DELAYED, BURIED --reserve-job--^
    RESERVED --release(delay>0)--> DELAYED;  RESERVED --bury--> BURIED
    any state --delete--> gone (RESERVED only by its holder)

Ordering keys live here and nowhere else:
  * ready jobs of a tube: an int key `pri << 64 | id`, so plain int comparison gives
    beanstalkd's (pri, id) order; kept in a SortedList.
  * delayed jobs: `(deadline, id)` in the tube's SortedList (for peek-delayed and kick)
    and in the broker's global timer list.
  * buried jobs: a dict in bury order (FIFO with O(1) removal), as beanstalkd's list.
"""
from __future__ import annotations

from sortedcontainers import SortedList

READY = "ready"
DELAYED = "delayed"
RESERVED = "reserved"
BURIED = "buried"

URGENT_PRI = 1024  # pri below this counts as urgent in stats
JOB_OVERHEAD_BYTES = 256  # what one job costs beyond its body, for --max-jobs-bytes
_ID_BITS = 64
_ID_MASK = (1 << _ID_BITS) - 1


def ready_key(pri: int, job_id: int) -> int:
    return (pri << _ID_BITS) | job_id


def key_id(key: int) -> int:
    return key & _ID_MASK


#: per-job counters as stats-job names them, kept in Job.counts in this order
COUNTERS = ("reserves", "timeouts", "releases", "buries", "kicks")
RESERVES, TIMEOUTS, RELEASES, BURIES, KICKS = range(len(COUNTERS))


class Job:
    # A million waiting jobs is a normal day: every slot costs 8 MB. The five counters
    # live in one list made on first use, so a job that only waits costs one slot.
    __slots__ = ("id", "tube", "pri", "delay_s", "ttr_s", "body", "state", "created",
                 "deadline", "holder", "counts", "seg")

    def __init__(self, job_id: int, tube: "Tube", pri: int, delay_s: int, ttr_s: int,
                 body: bytes, now: float) -> None:
        self.id = job_id
        self.tube = tube
        self.pri = pri
        self.delay_s = delay_s
        self.ttr_s = ttr_s
        self.body = body
        self.state = READY
        self.created = now
        # the job's place within its state: due time when DELAYED, TTR expiry when
        # RESERVED, bury sequence number when BURIED (a binlog restores bury order by it)
        self.deadline = 0.0
        self.holder = None      # the Session holding it when RESERVED
        self.counts: list[int] | None = None
        self.seg = 0            # binlog segment holding its latest full record (0: none)

    def bump(self, counter: int) -> None:
        if self.counts is None:
            self.counts = [0] * len(COUNTERS)
        self.counts[counter] += 1

    def count(self, counter: int) -> int:
        return self.counts[counter] if self.counts else 0


class Tube:
    """One tube: its job containers, the sessions waiting on it, and its counters."""
    __slots__ = ("name", "ready", "delayed", "buried", "urgent", "reserved", "total_jobs",
                 "using", "watching", "waiting", "cmd_delete", "cmd_pause_tube",
                 "pause_s", "unpause_at")

    def __init__(self, name: str) -> None:
        self.name = name
        self.ready = SortedList()       # ready_key ints
        self.delayed = SortedList()     # (deadline, id)
        self.buried: dict[int, Job] = {}
        self.urgent = 0                 # ready jobs with pri < URGENT_PRI
        self.reserved = 0
        self.total_jobs = 0
        self.using = 0                  # sessions that `use` it
        self.watching = 0               # sessions that watch it
        self.waiting: dict = {}         # sessions blocked in reserve watching it, FIFO
        self.cmd_delete = 0
        self.cmd_pause_tube = 0
        self.pause_s = 0
        self.unpause_at = 0.0           # > 0 while paused

    @property
    def job_count(self) -> int:
        return len(self.ready) + len(self.delayed) + len(self.buried) + self.reserved

    def is_unreferenced(self) -> bool:
        """A tube lives while a session uses or watches it or a job is in it."""
        return not (self.using or self.watching or self.job_count)


class Session:
    """One client connection of one front, as the broker sees it (beanstalkd's Conn).

    `watch` keeps beanstalkd's order: append on watch, swap-remove on ignore, which is
    what list-tubes-watched shows.
    """
    __slots__ = ("front", "conn", "use", "watch", "watched", "reserved", "due", "waiting", "wait_until",
                 "wake", "producer", "worker", "behind", "behind_bytes", "half_closed")
    is_counter = False
    is_pool = False

    def __init__(self, front, conn: int, default: Tube) -> None:
        self.front = front
        self.conn = conn
        self.use = default
        self.watch: list[Tube] = [default]
        self.watched: set[Tube] = {default}    # the same tubes, for membership tests
        self.reserved: dict[int, Job] = {}
        self.due = SortedList()                # (deadline, id) of the reserved jobs
        self.waiting = False
        self.wait_until: float | None = None   # reserve timeout; None waits forever
        self.wake: tuple | None = None         # this session's entry in the broker's wake list
        self.producer = False                  # ever sent put
        self.worker = False                    # ever sent a reserve command
        # ops that arrived while a reserve waited, run in order once it is answered
        # (None: nothing held, ops run as they come; see core.Broker._hold)
        self.behind = None
        self.behind_bytes = 0                  # put body bytes among them
        self.half_closed = False               # a reserve that would wait times out at once

    def add_watch(self, t: Tube) -> bool:
        if t in self.watched:
            return False
        self.watch.append(t)
        self.watched.add(t)
        return True

    def remove_watch(self, t: Tube) -> None:
        """Swap-remove, as beanstalkd's ms_remove: the last tube takes the freed place."""
        i = self.watch.index(t)
        last = self.watch.pop()
        if last is not t:
            self.watch[i] = last
        self.watched.discard(t)

    def soonest_deadline(self) -> float | None:
        return self.due[0][0] if self.due else None
