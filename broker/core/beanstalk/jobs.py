"""Jobs, their states, and tubes: the data the broker core moves around.

Job states and the commands that move a job between them (beanstalkd protocol.txt,
"Job Lifecycle"; for delete, kick-job and reserve-job, prot.c's dispatch_cmd):

    put (delay 0) ---------> READY <--- release(delay 0) / TTR expiry / holder gone --- RESERVED
    put (delay>0) -> DELAYED --(due)--^ ^-- kick / kick-job --- BURIED                    |
    DELAYED, BURIED --kick / kick-job--> READY                                            |
    READY --reserve / reserve-with-timeout--> RESERVED;  READY, DELAYED, BURIED --reserve-job--^
    RESERVED --release(delay>0)--> DELAYED;  RESERVED --bury--> BURIED
    any state --delete--> gone (RESERVED only by its holder)

Ordering keys live here and nowhere else:
  * ready jobs of a tube: a `ReadySet`, the distinct priorities sorted and per priority
    the job ids sorted, so no job carries a key object of its own; a tube's first job is
    published as the int key `pri << 64 | id` (plain int comparison gives beanstalkd's
    (pri, id) order across tubes).
  * delayed jobs: `(deadline, id)` in the tube's SortedList (for peek-delayed and kick)
    and in the broker's global timer list.
  * buried jobs: a dict in bury order (FIFO with O(1) removal), as beanstalkd's list.
"""
from __future__ import annotations

import collections
from collections import deque

from sortedcontainers import SortedList

from ....protocol.codecs.prometheus import WAIT_BUCKETS, Histogram

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


#: where Job.counts keeps the session holding a RESERVED job (a reserved job has counts),
#: and when it was reserved (its run time, for the metrics)
_HOLDER = len(COUNTERS)
RESERVED_AT = _HOLDER + 1
#: (delay_s, ttr_s) pairs shared by every job that has them; past this many distinct
#: pairs new ones are not remembered (each such job then has its own tuple)
_TIMES_MAX = 4096
_times: dict[tuple[int, int], tuple[int, int]] = {}


def shared_times(delay_s: int, ttr_s: int) -> tuple[int, int]:
    pair = (delay_s, ttr_s)
    known = _times.get(pair)
    if known is not None:
        return known
    if len(_times) < _TIMES_MAX:
        _times[pair] = pair
    return pair


class Job:
    """One job.  A million waiting jobs is a normal day and every slot costs 8 MB, so a
    ready job carries only what every job needs (10 slots: 112 bytes with the object
    headers, 12 would round up to 128): the five counters and the holder of a reserved
    job live in one list made on first use (`counts`), and delay and ttr in a pair
    shared by all jobs put with the same ones (`times`)."""
    __slots__ = ("id", "tube", "pri", "times", "body", "state", "created", "deadline",
                 "counts", "file")

    def __init__(self, job_id: int, tube: "Tube", pri: int, delay_s: int, ttr_s: int,
                 body: bytes, now: float) -> None:
        self.id = job_id
        self.tube = tube
        self.pri = pri
        self.times = shared_times(delay_s, ttr_s)
        self.body = body
        self.state = READY
        self.created = now
        # the job's place within its state: due time when DELAYED, TTR expiry when
        # RESERVED, bury sequence number when BURIED (a binlog restores bury order by it)
        self.deadline = 0.0
        # COUNTERS, the holder, when it was reserved (None: all 0, never reserved)
        self.counts: list | None = None
        # beanstalkd's stats-job `file`: the journal's file holding its latest full record
        # (0: none), kept by the journal (a slot, not the journal's own map: 8 bytes a job)
        self.file = 0

    @property
    def delay_s(self) -> int:
        return self.times[0]

    @delay_s.setter
    def delay_s(self, delay_s: int) -> None:
        self.times = shared_times(delay_s, self.times[1])

    @property
    def ttr_s(self) -> int:
        return self.times[1]

    @property
    def holder(self):
        """The Session holding the job while it is RESERVED, else None."""
        counts = self.counts
        return None if counts is None else counts[_HOLDER]

    @holder.setter
    def holder(self, session) -> None:
        if self.counts is None:
            if session is None:
                return
            self.counts = [0] * len(COUNTERS) + [None, 0.0]
        self.counts[_HOLDER] = session

    def hold(self, session, now: float) -> None:
        """Reserved by `session` at `now`: its holder, one more reserve (the holder
        setter and `bump` in one, for the hot path)."""
        counts = self.counts
        if counts is None:
            counts = self.counts = [0] * len(COUNTERS) + [None, 0.0]
        counts[_HOLDER] = session
        counts[RESERVES] += 1
        counts[RESERVED_AT] = now

    def unhold(self):
        """No longer reserved: the session that held it."""
        counts = self.counts
        session, counts[_HOLDER] = counts[_HOLDER], None
        return session

    def set_counts(self, counts) -> None:
        """Counters from a binlog record (never held: nothing is reserved at start)."""
        self.counts = [*counts, None, 0.0]

    def bump(self, counter: int) -> None:
        if self.counts is None:
            self.counts = [0] * len(COUNTERS) + [None, 0.0]
        self.counts[counter] += 1

    def count(self, counter: int) -> int:
        return self.counts[counter] if self.counts else 0


class ReadySet:
    """The ready jobs of one tube, (pri, id) smallest first, at no cost per job beyond a
    pointer: the ids stored are the jobs' own int objects (a million ready jobs would
    otherwise carry a million 32-48 byte keys).

    `pris` holds the distinct priorities; `by_pri[pri]` is a bare id while one job has
    that priority, then the ids in order in a deque, as long as each comes in at either
    end: a put has the highest id yet, a reserve takes the lowest, and a job released
    again mostly goes back before the first.  The first id that would go in the middle,
    or come out of it (delete, reserve-job, kick-job of a ready job), turns that deque
    into a SortedList, kept until the priority empties: one O(n) copy, paid for by the n
    cheap appends before it.  A deque or a SortedList costs about 8 bytes per id;
    `top` is the key of the first job, or None when empty."""
    __slots__ = ("pris", "by_pri", "n", "top")

    def __init__(self) -> None:
        self.pris = SortedList()
        self.by_pri: dict[int, int | deque | SortedList] = {}
        self.n = 0
        self.top: int | None = None

    def __len__(self) -> int:
        return self.n

    def add(self, pri: int, job_id: int) -> bool:
        """Add a job; True if it is the new first one."""
        by_pri = self.by_pri
        ids = by_pri.get(pri)
        if ids is None:
            by_pri[pri] = job_id
            self.pris.add(pri)
        elif type(ids) is deque:
            if job_id > ids[-1]:
                ids.append(job_id)
            elif job_id < ids[0]:
                ids.appendleft(job_id)
            else:
                by_pri[pri] = SortedList(ids)
                by_pri[pri].add(job_id)
        elif type(ids) is int:
            by_pri[pri] = deque((ids, job_id) if ids < job_id else (job_id, ids))
        else:
            ids.add(job_id)
        self.n += 1
        key = (pri << _ID_BITS) | job_id     # (ready_key, inlined: every put)
        if self.top is None or key < self.top:
            self.top = key
            return True
        return False

    def remove(self, pri: int, job_id: int) -> bool:
        """Remove a job; True if it was the first one (`top` has moved on)."""
        by_pri = self.by_pri
        ids = by_pri[pri]
        if type(ids) is int or len(ids) == 1:
            del by_pri[pri]
            self.pris.remove(pri)
        elif type(ids) is not deque:
            ids.remove(job_id)
        elif job_id == ids[0]:
            ids.popleft()
        elif job_id == ids[-1]:
            ids.pop()
        else:
            by_pri[pri] = SortedList(ids)
            by_pri[pri].remove(job_id)
        self.n -= 1
        if self.top != (pri << _ID_BITS) | job_id:
            return False
        if not self.n:
            self.top = None
            return True
        ids = by_pri.get(pri)       # (the first priority still, unless it just emptied)
        if ids is None:
            pri = self.pris[0]
            ids = by_pri[pri]
        self.top = (pri << _ID_BITS) | (ids if type(ids) is int else ids[0])
        return True

    def fill(self, jobs: list) -> None:
        """Bulk-add jobs to an empty set (a binlog replay): one sort, no inserts."""
        groups: dict[int, list[int]] = {}
        for job in jobs:
            groups.setdefault(job.pri, []).append(job.id)
        for pri, ids in groups.items():
            ids.sort()
            self.by_pri[pri] = ids[0] if len(ids) == 1 else deque(ids)
        self.pris.update(groups)
        self.n = len(jobs)
        if jobs:
            first = self.pris[0]
            ids = self.by_pri[first]
            self.top = ready_key(first, ids if type(ids) is int else ids[0])


class TubeMetrics:
    """What the metrics count of a tube's jobs (protocol/codecs/prometheus.py): one per
    labelled tube name, kept while the name is labelled (a tube emptied and made again has
    the same), and one shared by every tube never labelled (`tube="_other"`).  `puts`
    holds what live tubes settled (their total-jobs since their `puts_mark`, settled when
    a tube goes or changes labels: Queue.settle_puts), so a put costs nothing here."""
    __slots__ = ("puts", "wait", "run")

    def __init__(self) -> None:
        self.puts = 0
        self.wait = Histogram(WAIT_BUCKETS)     # ready -> reserve
        self.run = Histogram(WAIT_BUCKETS)      # reserve -> delete


class ReadySince:
    """When a tube's ready jobs became ready, oldest first, for the metrics' oldest ready
    age.  Two FIFOs, each in the order its jobs became ready (the clock only moves
    forward), both holding references to the jobs' own objects, so an entry costs no
    allocation:
    * `fresh`, the ids of jobs put with no delay, the common case: 8 bytes an entry, as
      such a job is ready since it was made (its `created`) for as long as it stays ready
      and has never been reserved (a reserve gives it its `counts`);
    * `again_ids` and `again_sinces` (16 bytes an entry), jobs made ready any other way,
      with when (a delay that ran out, a release, a kick, a TTR, a restart).
    Nothing is done when a job stops being ready, so the hot path pays one append per
    job put: an entry is stale once its job is gone, not READY, or ready since another
    time (while READY, a job's `deadline` is when it became so).  Stale entries go from
    the fronts when the oldest is asked for, and in a sweep once the FIFOs hold more than
    twice the tube's ready jobs plus SLACK (`limit` is that bound as of the last look:
    below it nothing is checked), so a sweep drops at least half of what it looks at."""
    __slots__ = ("fresh", "again_ids", "again_sinces", "limit", "jobs", "ready")
    SLACK = 64

    def __init__(self, jobs: dict, ready) -> None:
        self.fresh: collections.deque = collections.deque()
        self.again_ids: collections.deque = collections.deque()
        self.again_sinces: collections.deque = collections.deque()
        self.limit = self.SLACK
        self.jobs = jobs                # the queue's: id -> Job
        self.ready = ready              # the tube's ReadySet (its len: the live bound)

    def add(self, job: "Job") -> None:
        """`job` has just become READY (its `deadline` says since when)."""
        if job.counts is None and job.deadline == job.created:
            self.fresh.append(job.id)           # put ready: ready since it was made
        else:
            self.again_ids.append(job.id)
            self.again_sinces.append(job.deadline)
        if len(self.fresh) + len(self.again_ids) > self.limit:
            self.sweep()

    def _fresh_since(self, job_id: int) -> float | None:
        """When a `fresh` entry's job became ready, None if the entry is stale."""
        job = self.jobs.get(job_id)
        if job is None or job.state != READY or job.counts is not None:
            return None
        return job.created

    def _again_live(self, job_id: int, since: float) -> bool:
        job = self.jobs.get(job_id)
        return job is not None and job.state == READY and job.deadline == since

    def sweep(self) -> None:
        bound = 2 * len(self.ready) + self.SLACK
        if len(self) > bound:                   # (else: a tube filling up, nothing stale)
            fresh_since, live = self._fresh_since, self._again_live
            self.fresh = collections.deque(i for i in self.fresh if fresh_since(i) is not None)
            kept = [(i, t) for i, t in zip(self.again_ids, self.again_sinces) if live(i, t)]
            self.again_ids = collections.deque(i for i, _ in kept)
            self.again_sinces = collections.deque(t for _, t in kept)
        self.limit = max(bound, 2 * len(self) + self.SLACK)

    def oldest(self) -> float | None:
        """When the oldest ready job became ready (None: none is)."""
        fresh, ids, sinces = self.fresh, self.again_ids, self.again_sinces
        while fresh and self._fresh_since(fresh[0]) is None:
            fresh.popleft()
        while ids and not self._again_live(ids[0], sinces[0]):
            ids.popleft()
            sinces.popleft()
        first = self._fresh_since(fresh[0]) if fresh else None
        if ids and (first is None or sinces[0] < first):
            return sinces[0]
        return first

    def __len__(self) -> int:
        return len(self.fresh) + len(self.again_ids)


class Tube:
    """One tube: its job containers, the sessions waiting on it, and its counters."""
    __slots__ = ("name", "ready", "delayed", "buried", "urgent", "reserved", "total_jobs",
                 "using", "watching", "waiting", "cmd_delete", "cmd_pause_tube",
                 "pause_s", "unpause_at", "reserves", "ready_since", "metrics", "puts_mark",
                 "listed")

    def __init__(self, name: str, metrics: TubeMetrics | None = None,
                 jobs: dict | None = None) -> None:
        self.name = name
        self.reserves = 0               # jobs reserved from it (with puts and deletes: activity)
        self.ready = ReadySet()
        self.ready_since = ReadySince({} if jobs is None else jobs, self.ready)
        self.metrics = metrics or TubeMetrics()
        self.delayed = SortedList()     # (deadline, id)
        self.buried: dict[int, Job] = {}
        self.urgent = 0                 # ready jobs with pri < URGENT_PRI
        self.reserved = 0
        self.total_jobs = 0
        self.puts_mark = 0              # total_jobs when its puts were last settled
        self.listed = None              # its key in Queue.tops (None: not there)
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
    __slots__ = ("front", "conn", "use", "watch", "watched", "reserved", "waiting", "wait_until",
                 "wake", "producer", "worker", "behind", "behind_bytes", "half_closed")
    family = 0          # ops it may send: the beanstalk ones (core.Broker._batch)
    is_counter = False
    is_pool = False

    def __init__(self, front, conn: int, default: Tube) -> None:
        self.front = front
        self.conn = conn
        self.use = default
        self.watch: list[Tube] = [default]
        self.watched: set[Tube] = {default}    # the same tubes, for membership tests
        self.reserved: dict[int, Job] = {}
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
        """The earliest TTR expiry of the jobs it holds: looked at only when it waits in
        reserve, so it is found then (as beanstalkd's conn_soonestjob walks its list)
        rather than kept in order on every reserve, touch and delete."""
        reserved = self.reserved
        if not reserved:
            return None
        return min(job.deadline for job in reserved.values())
