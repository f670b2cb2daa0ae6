"""The beanstalk component: tubes, jobs and sessions, and one handler per beanstalk op.

It owns the job queue (queue.py) and every beanstalk-family session (a beanstalk front's
connections, the SDK's producer Client, worker pools' sessions), the `cmd-*` counters,
the job ids and the bytes its jobs hold.  The Broker (core/broker.py) routes each op of
the family here and passes the shared pieces in (core/shared.py): the out-queue for
replies to waiting sessions, the admission gate, the binlog writer.

Each handler takes (session, op, now), where op is the schema tuple `(opcode, conn,
*args)` already checked for format by the front's parser, and returns the reply tuple
`(conn, code, *values)`, or None when it has no reply (yet).  Counting follows
beanstalkd: a `cmd-*` counter moves for every well-formed command, found or not
(prot.c's dispatch_cmd bumps `op_ct` once the arguments parse).  Rules that differ by job
state are in the comments of each handler, with the beanstalkd source they follow (that
command's case in prot.c's dispatch_cmd unless named otherwise).

A session whose reserve waits holds its later ops until the reserve is answered; the
Broker does the holding (the schema's "Ordering" rule) and this component says when a
waiting session got its answer (`answered`).
"""
from __future__ import annotations

import collections
from typing import Callable

from ....protocol.schema import Op, R
from ....protocol.schema.ops import ARG, ARG2
from ..shared.journal import (DELAYED as J_DELAYED, HELD as J_HELD, JOB_COUNTS, JOB_CREATED,
                              JOB_DELAY, JOB_DELETE, JOB_HELD, JOB_ID, JOB_KEY, JOB_PRI,
                              JOB_PUT, JOB_STATE, JOB_TTR, JOB_UPDATE, READY as J_READY,
                              Journal)
from ..shared import Admission, Identity, Out
from . import stats
from .jobs import (BURIED, BURIES, DELAYED, JOB_OVERHEAD_BYTES, READY, RELEASES, RESERVED,
                   Job, Session, Tube, key_id)
from .pools import PoolSession
from .queue import Queue

DEFAULT_TUBE = "default"
#: a job its holder had when the broker stopped gracefully (the journal's JOB_HELD) is kept
#: from other clients this long after the restart, for the holder's front to re-register
#: it: fronts say Hello again within PEER_TIMEOUT_S of the broker's return
RECLAIM_S = 5.0


assert JOB_COUNTS == slice(8, 13)       # (load reads them one by one: a million jobs)


class BeanstalkCommands:
    def __init__(self, out: Out, admission: Admission, journal: Journal, identity: Identity,
                 answered: Callable[[Session], None], now: float) -> None:
        self.out = out
        self.admission = admission
        self.journal = journal
        self.identity = identity
        self.answered = answered            # a waiting session got its reply
        self.pool_granted: Callable | None = None   # set by the pools component
        self.queue = Queue(self._granted, self._deadline_soon, self._timed_out)
        if getattr(journal, "logs_reserves", False):    # (a replicated journal: every
            self.queue.held = journal.append[JOB_HELD]  # reserve is kept for its holder)
        self.counters = stats.new_counters()
        self.sessions: dict[Session, None] = {}
        self.next_id = 1
        self.total_jobs = 0
        self.total_connections = 0
        self.bytes = 0                      # what jobs hold (--max-jobs-bytes)
        self.reclaimable: set[int] = set()     # ids of jobs kept for their holders ...
        self.reclaim_until = now + RECLAIM_S   # ... until then (after that: plain delayed)

    def handlers(self) -> dict:
        """Op code -> handler, for the Broker's table (named after the op)."""
        return {op: getattr(self, Op.name(op).lower()) for op in Op.codes()
                if op in (Op.COUNT, Op.HALF_CLOSE) or Op.PUT <= op <= Op.PAUSE_TUBE}

    # -- sessions ----------------------------------------------------------------------
    def open(self, front, conn: int) -> Session:
        default = self.queue.tube(DEFAULT_TUBE)
        cls = PoolSession if front.kind == "pool" else Session
        s = cls(front, conn, default)
        default.using += 1
        default.watching += 1
        self.total_connections += 1
        self.sessions[s] = None
        return s

    def close(self, s: Session, now: float) -> None:
        """A connection went away: its jobs go back to ready at once, counters unchanged."""
        q = self.queue
        q.stop_waiting(s)
        s.behind = None
        for job in list(s.reserved.values()):
            q.take(job)
            q.make_ready(job, now)
        s.use.using -= 1
        q.maybe_free(s.use)
        for t in s.watch:
            t.watching -= 1
            q.maybe_free(t)
        self.sessions.pop(s, None)

    def restore(self, front, s: Session | None, st, now: float) -> Session:
        """Make a session what its front re-registers (after either side lost the other):
        created if missing, with its tubes; the jobs it lists are kept, or restored with a
        fresh TTR when a restarted broker still has them ready; jobs we think it holds
        but it does not list go back to ready (their reserve was answered INTERNAL_ERROR
        by the front)."""
        if s is None:
            s = self.open(front, st.conn)
            self._restore_tubes(s, st)
        # a reserve it was blocked in, and what it sent after, was answered by the front
        # when it lost us (and a pool subscribes again): a job handed over now would
        # answer the wrong command
        self.queue.stop_waiting(s)
        s.behind = None
        if s.is_pool:
            s.credits = 0
        held = set(st.held)
        for job in [j for j in s.reserved.values() if j.id not in held]:
            self.queue.take(job)
            self.queue.make_ready(job, now)
        for job_id in held - s.reserved.keys():
            job = self.queue.jobs.get(job_id)
            if job is not None and (job.state == READY or self._reclaimable(job, now)):
                self.queue.take(job)
                self.queue.reserve(s, job, now)
        return s

    def _reclaimable(self, job, now: float) -> bool:
        """A job kept since our restart for the session that held it (S_RESERVED)."""
        if job.id not in self.reclaimable or now >= self.reclaim_until:
            return False
        self.reclaimable.discard(job.id)
        return job.state == DELAYED

    def _restore_tubes(self, s: Session, st) -> None:
        """Give a re-registered session the used tube and watch list its front remembers."""
        q = self.queue
        new_use = q.tube(st.use)
        new_use.using += 1
        s.use.using -= 1
        old_use, s.use = s.use, new_use
        q.maybe_free(old_use)
        if st.watch:
            self.set_watch(s, st.watch)

    def set_watch(self, s: Session, names: list[str]) -> None:
        """Replace a session's watch list (a re-registration, a pool's SUBSCRIBE)."""
        q = self.queue
        old = s.watch
        s.watch = [q.tube(n) for n in dict.fromkeys(names)]
        s.watched = set(s.watch)
        for t in s.watch:
            t.watching += 1
        for t in old:
            t.watching -= 1
            q.maybe_free(t)

    # -- the binlog ----------------------------------------------------------------------
    def load(self, lives, next_id: int, now: float, wall_offset: float) -> None:
        """Rebuild the jobs a journal restored, (rec, tube, body, file) each, `rec`'s
        fields where journal.py places them (wall-clock times back to our clock).

        Written for a million jobs: plain loops over tuples, no name looked up per job."""
        q, off = self.queue, wall_offset
        tubes: dict = {}
        jobs = []
        size = 0
        for rec, name, body, file in lives:
            t = tubes.get(name) or tubes.setdefault(name, q.tube(name))
            job = Job(rec[JOB_ID], t, rec[JOB_PRI], rec[JOB_DELAY], rec[JOB_TTR], body,
                      rec[JOB_CREATED] - off)
            state = rec[JOB_STATE]
            if state != J_READY:            # (most are: one compare for them)
                if state == J_DELAYED:
                    # (one already due is ready now, before a front re-registering a
                    # session that reserved it since can ask for it: see restore)
                    if rec[JOB_KEY] - off > now:
                        job.state, job.deadline = DELAYED, rec[JOB_KEY] - off
                elif state == J_HELD:       # held when we stopped: kept for its holder
                    job.state, job.deadline = DELAYED, now + RECLAIM_S
                    self.reclaimable.add(job.id)
                else:
                    job.state, job.deadline = BURIED, rec[JOB_KEY]
            job.file = file
            if rec[8] or rec[9] or rec[10] or rec[11] or rec[12]:   # (JOB_COUNTS, unsliced)
                job.set_counts(rec[JOB_COUNTS])
            size += len(body)
            jobs.append(job)
        q.load(jobs, now)
        self.bytes += size + len(jobs) * JOB_OVERHEAD_BYTES
        self.next_id = max(self.next_id, next_id)

    def log_holdings(self) -> None:
        """A graceful stop: log which jobs clients hold (JOB_HELD), so the next broker
        keeps them for their holders; with no room they come back ready, as after a
        crash."""
        journal = self.journal
        for job in self.queue.jobs.values():
            if job.state == RESERVED:
                if not journal.room[JOB_HELD](job):
                    return
                journal.append[JOB_HELD](job)

    # -- timers, and the queue's answers to waiting sessions ----------------------------
    def next_deadline(self) -> float | None:
        return self.queue.next_deadline()

    def expire(self, now: float) -> None:
        self.queue.expire(now)

    def _granted(self, s: Session, job: Job) -> None:
        if s.is_pool:
            self.pool_granted(s, job)
        else:
            self.out.reply(s, R.RESERVED, job.id, job.body)
            self.answered(s)

    def _deadline_soon(self, s: Session) -> None:
        self.out.reply(s, R.DEADLINE_SOON)
        self.answered(s)

    def _timed_out(self, s: Session) -> None:
        self.out.reply(s, R.TIMED_OUT)
        self.answered(s)

    # -- connection bookkeeping (no reply) ---------------------------------------------
    def count(self, s: Session, op, now):
        """A command the front answered itself that beanstalkd still counts (prot.c)."""
        _, _, cmd, consumes_id = op
        key = "cmd-" + cmd
        if key in self.counters:
            self.counters[key] += 1
        if consumes_id:           # EXPECTED_CRLF: make_job took the id before the body
            self.next_id += 1
            s.producer = True

    def half_close(self, s: Session, op, now):
        """The client shut its write side: a reserve that waits, now or later, answers
        TIMED_OUT (beanstalkd sees the hang-up while the connection waits, prot.c's
        STATE_WAIT, and the hang-up stays seen); commands held behind it then run."""
        s.half_closed = True
        if s.waiting:
            self.queue.stop_waiting(s)
            self.answered(s)
            return (s.conn, R.TIMED_OUT)

    # -- producing ---------------------------------------------------------------------
    def put(self, s: Session, op, now):
        _, conn, pri, delay_s, ttr_s, body = op
        self.counters["cmd-put"] += 1
        s.producer = True
        admission = self.admission
        if admission.draining:
            self.next_id += 1     # the job was made before the body was read (prot.c)
            return (conn, R.DRAINING)
        cost = len(body) + JOB_OVERHEAD_BYTES
        if admission.limit and not admission.room_for(cost):
            return (conn, R.OUT_OF_MEMORY)
        job_id = self.next_id
        job = Job(job_id, s.use, pri, delay_s, ttr_s or 1, body, now)   # ttr 0 is 1 (prot.c)
        journal = self.journal
        if not journal.room[JOB_PUT](job):
            return (conn, R.OUT_OF_MEMORY)       # binlog space (disk full), as beanstalkd
        self.next_id = job_id + 1
        self.bytes += cost
        self.total_jobs += 1
        self.queue.add(job, delay_s, now)
        journal.append[JOB_PUT](job)
        return (conn, R.INSERTED, job_id)

    def use(self, s: Session, op, now):
        self.counters["cmd-use"] += 1
        old, new = s.use, self.queue.tube(op[ARG])
        if new is not old:
            new.using += 1
            old.using -= 1
            s.use = new
            self.queue.maybe_free(old)
        return (s.conn, R.USING, new.name)

    # -- consuming ---------------------------------------------------------------------
    def reserve(self, s: Session, op, now):
        timeout_s = op[ARG]
        self.counters["cmd-reserve" if timeout_s < 0 else "cmd-reserve-with-timeout"] += 1
        s.worker = True
        q = self.queue
        job = q.best_ready(s)
        if job is None and q.in_margin(s, now):
            return (s.conn, R.DEADLINE_SOON)
        if job is not None:
            q.take(job)
            q.reserve(s, job, now)
            return (s.conn, R.RESERVED, job.id, job.body)
        if timeout_s == 0 or s.half_closed:
            return (s.conn, R.TIMED_OUT)
        q.wait(s, None if timeout_s < 0 else timeout_s, now)
        if s.behind is None:
            s.behind = collections.deque()      # later ops of this session wait their turn
        return None

    def reserve_job(self, s: Session, op, now):
        """Reserve one job by id from any state but reserved, any tube, paused or not (prot.c)."""
        self.counters["cmd-reserve-job"] += 1
        job = self.queue.jobs.get(op[ARG])
        if job is None or job.state == RESERVED:
            return (s.conn, R.NOT_FOUND)
        s.worker = True          # only once it succeeds (prot.c, OP_RESERVE_JOB)
        self.queue.take(job)
        self.queue.reserve(s, job, now)
        return (s.conn, R.RESERVED, job.id, job.body)

    def _held(self, s: Session, job_id: int) -> Job | None:
        return s.reserved.get(job_id)

    def delete(self, s: Session, op, now):
        """Deletes a job this session holds, or any ready, delayed or buried job (prot.c)."""
        self.counters["cmd-delete"] += 1
        job = self.queue.jobs.get(op[ARG])
        if job is None or (job.state == RESERVED and job.holder is not s):
            return (s.conn, R.NOT_FOUND)
        job.tube.cmd_delete += 1
        # (`remove`'s lines, inline: a delete is on the hot path, and a call costs)
        self.bytes -= len(job.body) + JOB_OVERHEAD_BYTES
        self.journal.append[JOB_DELETE](job)    # (its room came with its put)
        self.queue.delete(job, now)
        return (s.conn, R.DELETED)

    def remove(self, job: Job, now: float) -> None:
        """`job` is gone, as `delete` does it (the HTTP front's delete, core/views.py,
        which counts no command)."""
        self.bytes -= len(job.body) + JOB_OVERHEAD_BYTES
        self.journal.append[JOB_DELETE](job)    # (its room came with its put)
        self.queue.delete(job, now)

    def release(self, s: Session, op, now):
        _, conn, job_id, pri, delay_s = op
        self.counters["cmd-release"] += 1
        job = self._held(s, job_id)
        if job is None:
            return (conn, R.NOT_FOUND)
        logged = delay_s > 0                # beanstalkd logs only these (prot.c)
        if logged and not self.journal.room[JOB_UPDATE](job):
            return (conn, R.OUT_OF_MEMORY)
        self.queue.take(job)
        job.pri = pri
        job.delay_s = delay_s
        job.bump(RELEASES)
        self.queue.place(job, delay_s, now)
        if logged:
            self.journal.append[JOB_UPDATE](job)
        return (conn, R.RELEASED)

    def bury(self, s: Session, op, now):
        self.counters["cmd-bury"] += 1
        job = self._held(s, op[ARG])
        if job is None:
            return (s.conn, R.NOT_FOUND)
        if not self.journal.room[JOB_UPDATE](job):
            return (s.conn, R.INTERNAL_ERROR)     # no binlog space: beanstalkd's answer
        self.queue.take(job)
        job.pri = op[ARG2]
        job.bump(BURIES)
        self.queue.bury(job)
        self.journal.append[JOB_UPDATE](job)
        return (s.conn, R.BURIED)

    def touch(self, s: Session, op, now):
        self.counters["cmd-touch"] += 1
        job = self._held(s, op[ARG])
        if job is None:
            return (s.conn, R.NOT_FOUND)
        self.queue.touch(job, now)
        return (s.conn, R.TOUCHED)

    # -- watch list --------------------------------------------------------------------
    def watch(self, s: Session, op, now):
        self.counters["cmd-watch"] += 1
        t = self.queue.tube(op[ARG])
        if s.add_watch(t):
            t.watching += 1
        return (s.conn, R.WATCHING, len(s.watch))

    def ignore(self, s: Session, op, now):
        """NOT_IGNORED only for the last watched tube; an unwatched name is fine (prot.c)."""
        self.counters["cmd-ignore"] += 1
        t = self.queue.tubes.get(op[ARG])
        if t is not None and t in s.watched:
            if len(s.watch) < 2:
                return (s.conn, R.NOT_IGNORED)
            s.remove_watch(t)
            t.watching -= 1
            self.queue.maybe_free(t)
        return (s.conn, R.WATCHING, len(s.watch))

    # -- looking -----------------------------------------------------------------------
    def _found(self, s: Session, job: Job | None):
        if job is None:
            return (s.conn, R.NOT_FOUND)
        return (s.conn, R.FOUND, job.id, job.body)

    def peek(self, s: Session, op, now):
        self.counters["cmd-peek"] += 1
        return self._found(s, self.queue.jobs.get(op[ARG]))

    def peek_ready(self, s: Session, op, now):
        """peek-* look at the used tube only, paused or not (prot.c, OP_PEEK_READY)."""
        self.counters["cmd-peek-ready"] += 1
        return self._found(s, self.next_ready(s.use))

    def peek_delayed(self, s: Session, op, now):
        self.counters["cmd-peek-delayed"] += 1
        return self._found(s, self.next_delayed(s.use))

    def peek_buried(self, s: Session, op, now):
        self.counters["cmd-peek-buried"] += 1
        return self._found(s, self.next_buried(s.use))

    # (what peek-ready, peek-delayed and peek-buried show: also the operator's peek,
    # views.py, which counts no command)
    def next_ready(self, t: Tube) -> Job | None:
        top = t.ready.top
        return None if top is None else self.queue.jobs[key_id(top)]

    def next_delayed(self, t: Tube) -> Job | None:
        return self.queue.jobs[t.delayed[0][1]] if t.delayed else None

    def next_buried(self, t: Tube) -> Job | None:
        return next(iter(t.buried.values())) if t.buried else None

    # -- kicking -----------------------------------------------------------------------
    def kick(self, s: Session, op, now):
        self.counters["cmd-kick"] += 1
        return (s.conn, R.KICKED, self.kick_tube(s.use, op[ARG], now))

    def kick_tube(self, t: Tube, bound: int, now: float) -> int:
        """Kick up to `bound` jobs of `t` (buried first, else delayed): how many were."""
        kicked = 0
        for job in self.queue.kick_victims(t, bound):
            if not self._kick_logged(job, now):
                break               # no binlog space: the rest stay where they are
            kicked += 1
        return kicked

    def kick_job(self, s: Session, op, now):
        """Only buried or delayed jobs, in any tube (prot.c, OP_KICKJOB)."""
        self.counters["cmd-kick-job"] += 1
        job = self.queue.jobs.get(op[ARG])
        if job is None or job.state not in (BURIED, DELAYED) or not self._kick_logged(job, now):
            return (s.conn, R.NOT_FOUND)
        return (s.conn, R.KICKED_JOB)

    def _kick_logged(self, job: Job, now) -> bool:
        if not self.journal.room[JOB_UPDATE](job):
            return False
        self.queue.kick_job(job, now)
        self.journal.append[JOB_UPDATE](job)
        return True

    # -- stats and lists ---------------------------------------------------------------
    def stats(self, s: Session, op, now):
        self.counters["cmd-stats"] += 1
        return (s.conn, R.STATS, stats.server_stats(self, now))

    def stats_job(self, s: Session, op, now):
        self.counters["cmd-stats-job"] += 1
        job = self.queue.jobs.get(op[ARG])
        if job is None:
            return (s.conn, R.NOT_FOUND)
        return (s.conn, R.STATS, stats.job_stats(job, now))

    def stats_tube(self, s: Session, op, now):
        self.counters["cmd-stats-tube"] += 1
        t = self.queue.tubes.get(op[ARG])
        if t is None:
            return (s.conn, R.NOT_FOUND)
        return (s.conn, R.STATS, stats.tube_stats(t, now))

    def list_tubes(self, s: Session, op, now):
        self.counters["cmd-list-tubes"] += 1
        return (s.conn, R.LIST, [t.name for t in self.queue.tube_list])

    def list_tube_used(self, s: Session, op, now):
        self.counters["cmd-list-tube-used"] += 1
        return (s.conn, R.USING, s.use.name)

    def list_tubes_watched(self, s: Session, op, now):
        self.counters["cmd-list-tubes-watched"] += 1
        return (s.conn, R.LIST, [t.name for t in s.watch])

    def pause_tube(self, s: Session, op, now):
        self.counters["cmd-pause-tube"] += 1
        t = self.queue.tubes.get(op[ARG])
        if t is None:
            return (s.conn, R.NOT_FOUND)
        t.cmd_pause_tube += 1
        self.queue.pause(t, op[ARG2], now)
        return (s.conn, R.PAUSED)
