"""The beanstalk commands, one handler per schema op, mixed into the Broker.

Each handler takes (session, op, now), where op is the schema tuple `(opcode, conn,
*args)` already checked for format by the front's parser, and returns the reply tuple
`(conn, code, *values)`, or None when it has no reply (yet).  Counting follows
beanstalkd: a `cmd-*` counter moves for every well-formed command, found or not
(prot.c's dispatch_cmd bumps `op_ct` once the arguments parse).  Rules that differ by job
state are in the comments of each handler, with the beanstalkd source they follow (that
command's case in prot.c's dispatch_cmd unless named otherwise).
"""
from __future__ import annotations

import collections

from ....protocol.schema import R
from . import stats
from .jobs import (BURIED, BURIES, DELAYED, JOB_OVERHEAD_BYTES, RELEASES, RESERVED, Job,
                   Session, key_id)

class Commands:
    # -- connection bookkeeping (no reply) ---------------------------------------------
    def open(self, s: Session, op, now):
        return None  # already open: a duplicate OPEN changes nothing

    def close(self, s: Session, op, now):
        self._close(s, now)

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
            self._answered(s)
            return (s.conn, R.TIMED_OUT)

    # -- producing ---------------------------------------------------------------------
    def put(self, s: Session, op, now):
        _, conn, pri, delay_s, ttr_s, body = op
        self.counters["cmd-put"] += 1
        s.producer = True
        if self.draining:
            self.next_id += 1     # the job was made before the body was read (prot.c)
            return (conn, R.DRAINING)
        cost = len(body) + JOB_OVERHEAD_BYTES
        limit = self.config.max_jobs_bytes
        if limit and self.jobs_bytes + self.tasks.bytes + cost > limit:
            return (conn, R.OUT_OF_MEMORY)
        wal = self.wal
        if wal is not None and not wal.reserve_put(s.use.name, len(body)):
            return (conn, R.OUT_OF_MEMORY)       # binlog space (disk full), as beanstalkd
        job_id = self.next_id
        self.next_id += 1
        self.jobs_bytes += cost
        self.total_jobs += 1
        job = Job(job_id, s.use, pri, delay_s, ttr_s or 1, body, now)   # ttr 0 is 1 (prot.c)
        self.queue.add(job, delay_s, now)
        if wal is not None:
            wal.log_put(job)
        return (conn, R.INSERTED, job_id)

    def use(self, s: Session, op, now):
        self.counters["cmd-use"] += 1
        old, new = s.use, self.queue.tube(op[2])
        if new is not old:
            new.using += 1
            old.using -= 1
            s.use = new
            self.queue.maybe_free(old)
        return (s.conn, R.USING, new.name)

    # -- consuming ---------------------------------------------------------------------
    def reserve(self, s: Session, op, now):
        timeout_s = op[2]
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
        job = self.queue.jobs.get(op[2])
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
        job = self.queue.jobs.get(op[2])
        if job is None or (job.state == RESERVED and job.holder is not s):
            return (s.conn, R.NOT_FOUND)
        job.tube.cmd_delete += 1
        self.jobs_bytes -= len(job.body) + JOB_OVERHEAD_BYTES
        if self.wal is not None:
            self.wal.log_delete(job)    # its space was reserved by its put
        self.queue.delete(job)
        return (s.conn, R.DELETED)

    def release(self, s: Session, op, now):
        _, conn, job_id, pri, delay_s = op
        self.counters["cmd-release"] += 1
        job = self._held(s, job_id)
        if job is None:
            return (conn, R.NOT_FOUND)
        logged = delay_s > 0 and self.wal is not None    # beanstalkd logs only these (prot.c)
        if logged and not self.wal.reserve_update():
            return (conn, R.OUT_OF_MEMORY)
        self.queue.take(job)
        job.pri = pri
        job.delay_s = delay_s
        job.bump(RELEASES)
        self.queue.place(job, delay_s, now)
        if logged:
            self.wal.log_update(job)
        return (conn, R.RELEASED)

    def bury(self, s: Session, op, now):
        self.counters["cmd-bury"] += 1
        job = self._held(s, op[2])
        if job is None:
            return (s.conn, R.NOT_FOUND)
        if self.wal is not None and not self.wal.reserve_update():
            return (s.conn, R.INTERNAL_ERROR)     # no binlog space: beanstalkd's answer
        self.queue.take(job)
        job.pri = op[3]
        job.bump(BURIES)
        self.queue.bury(job)
        if self.wal is not None:
            self.wal.log_update(job)
        return (s.conn, R.BURIED)

    def touch(self, s: Session, op, now):
        self.counters["cmd-touch"] += 1
        job = self._held(s, op[2])
        if job is None:
            return (s.conn, R.NOT_FOUND)
        self.queue.touch(job, now)
        return (s.conn, R.TOUCHED)

    # -- watch list --------------------------------------------------------------------
    def watch(self, s: Session, op, now):
        self.counters["cmd-watch"] += 1
        t = self.queue.tube(op[2])
        if s.add_watch(t):
            t.watching += 1
        return (s.conn, R.WATCHING, len(s.watch))

    def ignore(self, s: Session, op, now):
        """NOT_IGNORED only for the last watched tube; an unwatched name is fine (prot.c)."""
        self.counters["cmd-ignore"] += 1
        t = self.queue.tubes.get(op[2])
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
        return self._found(s, self.queue.jobs.get(op[2]))

    def peek_ready(self, s: Session, op, now):
        """peek-* look at the used tube only, paused or not (prot.c, OP_PEEK_READY)."""
        self.counters["cmd-peek-ready"] += 1
        t = s.use
        top = t.ready.top
        return self._found(s, None if top is None else self.queue.jobs[key_id(top)])

    def peek_delayed(self, s: Session, op, now):
        self.counters["cmd-peek-delayed"] += 1
        t = s.use
        return self._found(s, self.queue.jobs[t.delayed[0][1]] if t.delayed else None)

    def peek_buried(self, s: Session, op, now):
        self.counters["cmd-peek-buried"] += 1
        t = s.use
        return self._found(s, next(iter(t.buried.values())) if t.buried else None)

    # -- kicking -----------------------------------------------------------------------
    def kick(self, s: Session, op, now):
        self.counters["cmd-kick"] += 1
        kicked = 0
        for job in self.queue.kick_victims(s.use, op[2]):
            if not self._kick_logged(job, now):
                break               # no binlog space: the rest stay where they are
            kicked += 1
        return (s.conn, R.KICKED, kicked)

    def kick_job(self, s: Session, op, now):
        """Only buried or delayed jobs, in any tube (prot.c, OP_KICKJOB)."""
        self.counters["cmd-kick-job"] += 1
        job = self.queue.jobs.get(op[2])
        if job is None or job.state not in (BURIED, DELAYED) or not self._kick_logged(job, now):
            return (s.conn, R.NOT_FOUND)
        return (s.conn, R.KICKED_JOB)

    def _kick_logged(self, job: Job, now) -> bool:
        if self.wal is not None and not self.wal.reserve_update():
            return False
        self.queue.kick_job(job, now)
        if self.wal is not None:
            self.wal.log_update(job)
        return True

    # -- stats and lists ---------------------------------------------------------------
    def stats(self, s: Session, op, now):
        self.counters["cmd-stats"] += 1
        return (s.conn, R.STATS, stats.server_stats(self, now))

    def stats_job(self, s: Session, op, now):
        self.counters["cmd-stats-job"] += 1
        job = self.queue.jobs.get(op[2])
        if job is None:
            return (s.conn, R.NOT_FOUND)
        return (s.conn, R.STATS, stats.job_stats(job, now))

    def stats_tube(self, s: Session, op, now):
        self.counters["cmd-stats-tube"] += 1
        t = self.queue.tubes.get(op[2])
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
        t = self.queue.tubes.get(op[2])
        if t is None:
            return (s.conn, R.NOT_FOUND)
        t.cmd_pause_tube += 1
        self.queue.pause(t, op[3], now)
        return (s.conn, R.PAUSED)
