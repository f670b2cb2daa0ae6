"""The broker core: fronts, sessions and the beanstalk commands, with no I/O and no clock.

`Broker.handle(peer, message, now)` takes one decoded schema message from a front (peer
is that front's ZeroMQ routing id); `expire(now)` fires due timers; `flush()` returns
the messages to send, one `Replies` per front with everything produced since the last
flush (the batching half of the schema's design); `next_deadline()` tells the event
loop how long it may sleep.  The actor (actor.py) is the only caller that owns a clock
and a socket, so every timer rule here is tested with a fake clock.

Fronts: a front introduces itself with Hello (its incarnation `front_id`) and must then
be heard from every PEER_TIMEOUT_S; a silent front is declared dead, its sessions close
(reserved jobs back to ready, blocked reserves dropped) and its incarnation is fenced:
anything it sends later gets `Fenced`, and it has to start over with a new incarnation.

Ordering: while a session waits in reserve, its later ops are held in `Session.behind`
(`_hold`) and run in order, in the same turn, once the reserve is answered (`_resume`):
the front forwards a pipeline without waiting, and the session still sees beanstalkd's
order, ids and counters.

Command semantics follow beanstalkd 1.13 (https://github.com/beanstalkd/beanstalkd: its
doc/protocol.txt, and prot.c where the two differ):
the handlers below are named after the protocol and count `cmd-*` as beanstalkd does.
"""
from __future__ import annotations

import collections
import logging
import random
from typing import Callable, NamedTuple

from ...protocol.schema import (PEER_TIMEOUT_S, SESSION_BYTES_MAX, SESSION_OPS_MAX, SILENT_OPS,
                                Batch, Fenced, Hello, Heartbeat, Op, R, Replies, Settings,
                                Welcome)
from .beanstalk import stats
from .beanstalk.checks import NATIVE_KINDS, check
from .beanstalk.commands import Commands
from .counters import CounterCommands, Counters, CounterSession
from .beanstalk.jobs import BURIED, DELAYED, JOB_OVERHEAD_BYTES, READY, RESERVED, Job, Session
from .beanstalk.pools import POOL_OPS, PoolCommands, PoolSession
from .beanstalk.queue import Queue
from .tasks.commands import TaskCommands, TaskSession
from .tasks.schedule_commands import ScheduleCommands
from .tasks.schedules import Schedules
from .tasks.store import ApiPolicy, FunctionSpec, Tasks
from ..wal.format import S_DELAYED, S_READY, S_RESERVED

log = logging.getLogger("zstalk.broker")
#: which protocol an op belongs to: 0 beanstalk (and the connection ops every front
#: sends), 1 counters, 2 cloud tasks; a session takes only its own (its `family`)
_FAMILY = [0 if code < Op.C_NOOP else 1 if code < Op.T_ENQUEUE else 2
           for code in range(max(Op) + 1)]
_TASK_KINDS = frozenset({"http", "dispatcher"})
#: fronts of a broker that went away notice within PEER_TIMEOUT_S (at once if they get
#: Fenced) and re-register; until then new Acquires could overcommit, so they are refused
RECOVERY_GRACE_S = PEER_TIMEOUT_S + 1.0
#: a job its holder had when the broker stopped gracefully (walformat S_RESERVED) is kept
#: from other clients this long after the restart, for the holder's front to re-register
#: it: fronts say Hello again within PEER_TIMEOUT_S of the broker's return
RECLAIM_S = 5.0
DEFAULT_TUBE = "default"
_FENCE_MEMORY = 4096          # how many dead front incarnations we remember
_PUT, _CLOSE, _HALF_CLOSE = int(Op.PUT), int(Op.CLOSE), int(Op.HALF_CLOSE)


class Config(NamedTuple):
    max_job_size: int = 65535
    max_jobs_bytes: int = 0           # 0: no limit
    version: str = "0.1.0"
    binlog_max_size: int = 10485760
    stat_interval_s: int = 86400      # counters: zero counters are collected at these boundaries
    recovering: bool = False          # started again after a crash: refuse Acquire for a grace period
    functions: tuple = ()             # cloud tasks: the FunctionSpecs of the config file
    base_function: FunctionSpec | None = None     # any other name, under the base URL
    api: ApiPolicy = ApiPolicy()      # what a request without the master key may do
    max_body_bytes: int = 1 << 20     # HTTP fronts: a request body (Settings)
    max_result_bytes: int = 1 << 20   # dispatchers: a function's result (Settings)


class Front:
    __slots__ = ("peer", "front_id", "kind", "pid", "sessions", "last_seen")

    def __init__(self, peer: bytes, hello: Hello, now: float) -> None:
        self.peer = peer
        self.front_id = hello.front_id
        self.kind = hello.kind
        self.pid = hello.pid
        self.sessions: dict[int, Session] = {}
        self.last_seen = now


class Broker(ScheduleCommands, TaskCommands, PoolCommands, CounterCommands, Commands):
    def __init__(self, config: Config, now: float,
                 sysinfo: Callable[[], stats.SysInfo] = stats.no_sysinfo,
                 wall_offset: float = 0.0, wal=None, recovered=None) -> None:
        self.config = config
        self.wall_offset = wall_offset    # wall clock = now + offset (counter intervals)
        self.counter_store = Counters(now + wall_offset, config.stat_interval_s)
        # after a restart, Acquire waits until the fronts had time to re-register holdings
        self.refuse_acquire_until = now + RECOVERY_GRACE_S if config.recovering else 0.0
        self.sysinfo = sysinfo
        self.started = now
        self.broker_id = random.getrandbits(64)
        self.state_id = random.getrandbits(64) or 1
        self.queue = Queue(self._granted, self._deadline_soon, self._timed_out)
        self.tasks = Tasks({f.name: f for f in config.functions}, wall_offset,
                           base=config.base_function)
        self.schedules = Schedules(self.tasks, wall_offset)
        self.dispatchers: dict = {}       # dispatcher sessions, in the order they came
        self.api = config.api
        self.fronts: dict[bytes, Front] = {}
        self.fenced: collections.OrderedDict[int, None] = collections.OrderedDict()
        self.out: dict[bytes, list] = {}
        self.control: list[tuple[bytes, object]] = []
        self.resumed: collections.deque = collections.deque()  # sessions whose reserve was answered
        self.next_id = 1
        self.jobs_bytes = 0
        self.draining = False
        self.counters = stats.new_counters()
        self.total_connections = 0
        self.total_jobs = 0
        self._handlers = self._handler_table()
        # the binlog (binlog.Binlog) or None; the core only appends records to it
        self.wal = wal
        if wal is not None:
            wal.wall_offset = wall_offset
            self.state_id = wal.state_id    # fronts' reservations survive our restart
            self.tasks.wal = self.schedules.wal = wal
        self.reclaimable: set[int] = set()     # ids of jobs kept for their holders ...
        self.reclaim_until = now + RECLAIM_S   # ... until then (after that: plain delayed)
        if recovered is not None:
            self._restore(recovered.jobs.values(), recovered.next_id, now)
            self.tasks.restore(recovered.tasks, now)
            # a time missed while we were down fires once, now
            self._fire_schedules(self.schedules.restore(recovered.schedules, now), now)

    def _restore(self, lives, next_id: int, now: float) -> None:
        """Rebuild the jobs a binlog replayed (wall-clock times back to our clock).

        Written for a million jobs: plain loops over walformat's replay tuples."""
        q, off = self.queue, self.wall_offset
        tubes: dict = {}
        jobs = []
        size = 0
        for rec, name, body, seq in lives:
            t = tubes.get(name) or tubes.setdefault(name, q.tube(name))
            job = Job(rec[1], t, rec[2], rec[3], rec[4], body, rec[5] - off)
            state = rec[7]
            if state != S_READY:            # (most are: one compare for them)
                if state == S_DELAYED:
                    # (one already due is ready now, before a front re-registering a
                    # session that reserved it since can ask for it: see _reconcile)
                    if rec[6] - off > now:
                        job.state, job.deadline = DELAYED, rec[6] - off
                elif state == S_RESERVED:   # held when we stopped: kept for its holder
                    job.state, job.deadline = DELAYED, now + RECLAIM_S
                    self.reclaimable.add(job.id)
                else:
                    job.state, job.deadline = BURIED, rec[6]
            job.seg = seq
            if rec[8] or rec[9] or rec[10] or rec[11] or rec[12]:
                job.set_counts(rec[8:13])
            size += len(body)
            jobs.append(job)
        q.load(jobs)
        self.jobs_bytes += size + len(jobs) * JOB_OVERHEAD_BYTES
        self.next_id = max(self.next_id, next_id)

    # -- messages --------------------------------------------------------------------
    def handle(self, peer: bytes, msg, now: float) -> None:
        front = self.fronts.get(peer)
        if isinstance(msg, Hello):
            self._hello(peer, front, msg, now)
        elif front is None:
            # a front from before our time (we restarted) or one we declared dead
            self.control.append((peer, Fenced(int.from_bytes(peer[:8], "big"), self.broker_id)))
        else:
            front.last_seen = now
            if isinstance(msg, Batch):
                self._batch(front, msg.ops, now)

    def flush(self) -> list[tuple[bytes, object]]:
        msgs, out = self.control, self.out
        self.control = []
        if out:
            for peer, items in out.items():
                if items:
                    msgs.append((peer, Replies(items)))
            out.clear()
        return msgs

    def heartbeats(self) -> list[tuple[bytes, object]]:
        return [(peer, Heartbeat(self.broker_id)) for peer in self.fronts]

    def _hello(self, peer: bytes, front: Front | None, hello: Hello, now: float) -> None:
        if hello.front_id in self.fenced:
            self.control.append((peer, Fenced(hello.front_id, self.broker_id)))
            return
        if front is None or front.front_id != hello.front_id:
            if front is not None:
                self.drop_front(front, now)
            front = self.fronts[peer] = Front(peer, hello, now)
            restored = hello.state_id == self.state_id
            if hello.kind == "counter":
                # holdings are known exactly by the fronts, so they always come back; a
                # front of an earlier broker means others may still be on their way
                restored = True
                if hello.state_id not in (0, self.state_id):
                    self.refuse_acquire_until = max(self.refuse_acquire_until,
                                                    self.started + RECOVERY_GRACE_S)
        else:
            front.last_seen = now
            restored = True
        if restored:
            self._reconcile(front, hello.sessions, now)
        settings = self.settings()
        self.control.append((peer, Welcome(self.broker_id, self.state_id, settings, restored)))

    def settings(self) -> Settings:
        c = self.config
        return Settings(c.max_job_size, c.max_body_bytes, c.max_result_bytes,
                        self.api.public_enqueue, self.api.private_results)

    def _reconcile(self, front: Front, states, now: float) -> None:
        """Make the front's sessions what it says they are (after either side lost the other).

        Sessions it no longer lists close; listed ones are created if missing, and the
        jobs they hold are kept, or restored with a fresh TTR when a restarted broker
        still has them ready; jobs we think they hold but they do not list go back to
        ready (their reserve was answered INTERNAL_ERROR by the front).
        """
        listed = {s.conn: s for s in states}
        for conn in [c for c in front.sessions if c not in listed]:
            self._close(front.sessions[conn], now)
        for conn, st in listed.items():
            if front.kind == "counter":
                s = front.sessions.get(conn) or self._open(front, conn)
                self.counter_store.restore(s.holds, st.holds, self.wall(now))
                continue
            if front.kind in _TASK_KINDS:
                s = front.sessions.get(conn) or self._open(front, conn)
                if front.kind == "dispatcher" and st.holds:
                    self.claim_calls(s, st.holds, now)
                continue
            s = front.sessions.get(conn)
            if s is None:
                s = self._open(front, conn)
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

    def log_holdings(self) -> None:
        """A graceful stop: log which jobs clients hold (walformat S_RESERVED), so the
        next broker keeps them for their holders; with no room they come back ready, as
        after a crash."""
        for job in self.queue.jobs.values():
            if job.state == RESERVED and not self.wal.log_reserved(job):
                return

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
            self._set_watch(s, st.watch)

    def _set_watch(self, s: Session, names: list[str]) -> None:
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

    def drop_front(self, front: Front, now: float) -> None:
        """A front died (heartbeat) or was replaced: close its sessions and fence it."""
        for s in list(front.sessions.values()):
            self._close(s, now)
        self.fronts.pop(front.peer, None)
        self.out.pop(front.peer, None)
        self.fenced[front.front_id] = None
        if len(self.fenced) > _FENCE_MEMORY:
            self.fenced.popitem(last=False)

    def _batch(self, front: Front, ops: list, now: float) -> None:
        out = self.out.setdefault(front.peer, [])
        sessions = front.sessions
        handlers = self._handlers
        native = front.kind in NATIVE_KINDS       # ops not built by a beanstalk parser
        max_job_size = self.config.max_job_size
        for op in ops:
            try:
                if native:
                    refused = check(op, max_job_size)
                    if refused is not None:
                        if refused:
                            out.append((op[1], refused))
                        continue
                s = sessions.get(op[1])
                if s is None:
                    if op[0] == Op.OPEN:
                        self._open(front, op[1])
                    elif op[0] not in SILENT_OPS:
                        out.append((op[1], R.INTERNAL_ERROR))
                    continue
                if (op[0] > _HALF_CLOSE and _FAMILY[op[0]] != s.family
                        or s.is_pool and op[0] not in POOL_OPS):
                    out.append((op[1], R.INTERNAL_ERROR))   # an op for the other protocol
                    continue
                if s.behind is not None and op[0] != _CLOSE and op[0] != _HALF_CLOSE:
                    self._hold(s, op, out)
                    continue
                reply = handlers[op[0]](s, op, now)
            except Exception as exc:
                # a malformed op from a buggy front must not take the broker down
                log.warning("bad op %.60r from front %016x: %r", op, front.front_id, exc)
                reply = _error_reply(op)
            if reply is not None:
                out.append(reply)
        if self.resumed:        # after the whole batch: beanstalkd also finishes what it
            self._resume(now)   # read from one client before a woken one reads on

    # -- ordering behind a waiting reserve ------------------------------------------
    def _hold(self, s: Session, op, out: list) -> None:
        """Keep `op` until the session's waiting reserve is answered (schema: "Ordering")."""
        behind = s.behind
        behind.append(op)
        if op[0] == _PUT:
            s.behind_bytes += len(op[5])
        if (len(behind) > SESSION_OPS_MAX
                or s.behind_bytes > SESSION_BYTES_MAX + self.config.max_job_size):
            log.warning("front %016x sent more than a connection may have in flight: "
                        "answering its held commands INTERNAL_ERROR", s.front.front_id)
            if s.waiting:
                self.queue.stop_waiting(s)
                out.append((s.conn, R.INTERNAL_ERROR))      # the reserve
            out.extend((s.conn, R.INTERNAL_ERROR) for o in behind if o[0] not in SILENT_OPS)
            s.behind, s.behind_bytes = None, 0

    def _answered(self, s: Session) -> None:
        """A session's waiting reserve got its reply: what it held runs next."""
        if s.behind is not None:
            self.resumed.append(s)

    def _resume(self, now: float) -> None:
        """Run held ops in order, until each session waits again or has nothing held.

        Ops run here may answer other sessions' reserves; those join the same loop."""
        resumed, handlers = self.resumed, self._handlers
        while resumed:
            s = resumed.popleft()
            behind = s.behind
            if behind is None or s.front.sessions.get(s.conn) is not s:
                continue
            out = self.out.setdefault(s.front.peer, [])
            while behind and not s.waiting:
                op = behind.popleft()
                if op[0] == _PUT:
                    s.behind_bytes -= len(op[5])
                try:
                    reply = handlers[op[0]](s, op, now)
                except Exception as exc:
                    log.warning("bad op %.60r from front %016x: %r", op, s.front.front_id, exc)
                    reply = _error_reply(op)
                if reply is not None:
                    out.append(reply)
            if not s.waiting:
                s.behind, s.behind_bytes = None, 0

    # -- timers ----------------------------------------------------------------------
    def wall(self, now: float) -> float:
        return now + self.wall_offset

    def next_deadline(self) -> float | None:
        # (called after every turn of the actor: plain comparisons, no generators)
        d = self.counter_store.next_gc() - self.wall_offset
        q = self.queue.next_deadline()
        if q is not None and q < d:
            d = q
        if self.tasks.tasks:
            t = self.tasks.next_deadline()
            if t is not None and t < d:
                d = t
        if self.schedules.timers:
            t = self.schedules.next_deadline()
            if t < d:
                d = t
        for f in self.fronts.values():
            silent_at = f.last_seen + PEER_TIMEOUT_S
            if silent_at < d:
                d = silent_at
        return d

    def expire(self, now: float) -> None:
        self.queue.expire(now)
        if self.tasks.tasks:
            self.tasks.expire(now)
            self._feed_dispatchers(now)
        if self.schedules.timers:
            self._fire_schedules(self.schedules.due(now), now)
        if self.resumed:
            self._resume(now)
        self.counter_store.expire(self.wall(now))
        for front in [f for f in self.fronts.values() if now - f.last_seen > PEER_TIMEOUT_S]:
            self.drop_front(front, now)

    # -- queue callbacks (a waiting session got its answer) ---------------------------
    def _reply(self, s: Session, *reply) -> None:
        self.out.setdefault(s.front.peer, []).append((s.conn, *reply))

    def _granted(self, s: Session, job: Job) -> None:
        if s.is_pool:
            self._pool_granted(s, job)
        else:
            self._reply(s, R.RESERVED, job.id, job.body)
            self._answered(s)

    def _deadline_soon(self, s: Session) -> None:
        self._reply(s, R.DEADLINE_SOON)
        self._answered(s)

    def _timed_out(self, s: Session) -> None:
        self._reply(s, R.TIMED_OUT)
        self._answered(s)

    # -- sessions --------------------------------------------------------------------
    def _open(self, front: Front, conn: int):
        if front.kind in _TASK_KINDS:
            s = front.sessions[conn] = TaskSession(front, conn)
            return s
        if front.kind == "counter":
            s = front.sessions[conn] = CounterSession(front, conn)
            self.counter_store.curr_connections += 1
            self.counter_store.total_connections += 1
            return s
        default = self.queue.tube(DEFAULT_TUBE)
        cls = PoolSession if front.kind == "pool" else Session
        s = front.sessions[conn] = cls(front, conn, default)
        default.using += 1
        default.watching += 1
        self.total_connections += 1
        return s

    def _close(self, s, now: float) -> None:
        """A connection went away: its jobs go back to ready at once, counters unchanged;
        a counter session's holdings go back too."""
        if s.family == 2:
            self._close_task_session(s, now)
            return
        if s.is_counter:
            self.counter_store.release_all(s.holds, self.wall(now))
            self.counter_store.curr_connections -= 1
            del s.front.sessions[s.conn]
            return
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
        del s.front.sessions[s.conn]

    def _handler_table(self) -> list:
        """Op code -> bound handler; handlers are named after the op (commands.py)."""
        table: list = [None] * (max(Op) + 1)
        for op in Op:
            table[op] = getattr(self, op.name.lower())
        return table

    def sessions(self):
        """The beanstalk sessions of every front (what beanstalk's stats count)."""
        for f in self.fronts.values():
            if f.kind != "counter" and f.kind not in _TASK_KINDS:
                yield from f.sessions.values()


def _error_reply(op) -> tuple | None:
    """INTERNAL_ERROR for an op that failed, if it is shaped like one that gets a reply."""
    try:
        if len(op) > 1 and type(op[1]) is int and op[0] not in SILENT_OPS:
            return (op[1], R.INTERNAL_ERROR)
    except TypeError:       # not a sequence, or an unhashable opcode
        pass
    return None
