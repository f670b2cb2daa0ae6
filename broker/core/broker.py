"""The broker core: fronts, sessions and the routing of every op to its family, with no
I/O and no clock.

`Broker.handle(peer, message, now)` takes one decoded schema message from a front (peer
is that front's ZeroMQ routing id); `expire(now)` fires due timers; `flush()` returns
the messages to send, one `Replies` per front with everything produced since the last
flush (the batching half of the schema's design); `next_deadline()` tells the event
loop how long it may sleep, and `next_wake(armed)` whether a turn set a deadline before
the timer it has armed: a turn of beanstalk ops sets them only in the queue, which keeps
the earliest it set (`Queue.soonest`), so such a turn is done without asking every
component (that was a tenth of a one-at-a-time put's cost).  The actor (broker/actor.py)
is the only caller that owns a clock and a socket, so every timer rule here is tested
with a fake clock.

Components: each protocol family's state and rules live in a component of its own, and
`handle` routes each op to one through one table (op code -> handler):

    beanstalk   beanstalk/commands.py   tubes, jobs, beanstalk sessions, the `cmd-*` ops
    pools       beanstalk/pools.py      SUBSCRIBE / CREDIT, jobs pushed to worker pools
    counters    counters.py             the yrmcds counters and their sessions
    tasks       tasks/commands.py       cloud tasks, HTTP fronts' and dispatchers' sessions
    schedules   schedules/commands.py   cron schedules, fired as tasks
    views       views.py                the HTTP front's looks at tubes, jobs and counters
                                        (built with the task family: its front's)

A component takes (session, op, now) and returns the reply, and opens, closes and
restores the sessions of the front kinds it owns.  The task family (tasks, schedules)
may be built after the start (`Config.tasks_later`, `build_tasks`): a server with no
function configured answers its first beanstalk command without its modules, and the
per-turn paths ask `tasks_built` before they look at it.  Components share only what
shared/ lists (the out-queue, the admission gate, the journal, the clock as
`now`), handed to them here.

Fronts: a front introduces itself with Hello (its incarnation `front_id`) and must then
be heard from every PEER_TIMEOUT_S; a silent front is declared dead, its sessions close
(reserved jobs back to ready, blocked reserves dropped) and its incarnation is fenced:
anything it sends later gets `Fenced`, and it has to start over with a new incarnation.

Ordering: while a session waits in reserve, its later ops are held in `Session.behind`
(`_hold`) and run in order, in the same turn, once the reserve is answered (`_resume`):
the front forwards a pipeline without waiting, and the session still sees beanstalkd's
order, ids and counters.

Command semantics follow beanstalkd 1.13 (https://github.com/beanstalkd/beanstalkd: its
doc/protocol.txt, and prot.c where the two differ), and yrmcds 1.1.9's counter extension.
"""
from __future__ import annotations

import collections
import logging
import math
import random
from typing import Callable, NamedTuple

from ...protocol.schema import (PEER_TIMEOUT_S, SESSION_BYTES_MAX, SESSION_OPS_MAX,
                                SILENT_OPS, Batch, Fenced, Hello, Heartbeat, Op, R, Replies,
                                Settings, Welcome)
from ...protocol.schema.ops import CODE, CONN, PUT_BODY
from ...protocol.schema.version import VERSION
from .beanstalk import stats
from .beanstalk.checks import NATIVE_KINDS, check
from .beanstalk.commands import BeanstalkCommands
from .beanstalk.pools import POOL_OPS, PoolCommands
from .counters import CounterCommands
from .shared.journal import GATES, Journal, NullJournal, Restored
from .shared import Admission, Identity, Out
from .tasks.model.spec import ApiPolicy, FunctionSpec

log = logging.getLogger("zstalk.broker")
#: which protocol an op belongs to: 0 beanstalk (and the connection ops every front
#: sends), 1 counters, 2 cloud tasks; a session takes only its own (its `family`)
_FAMILY = [0 if code < Op.C_NOOP else 1 if code < Op.T_ENQUEUE else 2
           for code in range(max(Op.codes()) + 1)]
#: fronts of a broker that went away notice within PEER_TIMEOUT_S (at once if they get
#: Fenced) and re-register; until then new Acquires could overcommit, so they are refused
RECOVERY_GRACE_S = PEER_TIMEOUT_S + 1.0
_FENCE_MEMORY = 4096          # how many dead front incarnations we remember
_PUT, _CLOSE, _HALF_CLOSE = Op.PUT, Op.CLOSE, Op.HALF_CLOSE


class Config(NamedTuple):
    max_job_size: int = 65535
    max_jobs_bytes: int = 0           # 0: no limit
    version: str = VERSION            # (the package's: protocol/schema/version.py)
    binlog_max_size: int = 10485760
    stat_interval_s: int = 86400      # counters: zero counters are collected at these boundaries
    recovering: bool = False          # started again after a crash: refuse Acquire for a grace period
    functions: tuple = ()             # cloud tasks: the FunctionSpecs of the config file
    upstreams: tuple = ()             # ... and its upstream groups (core/upstreams)
    base_function: FunctionSpec | None = None     # any other name, under the base URL
    api: ApiPolicy = ApiPolicy()      # what a request without the master key may do
    max_body_bytes: int = 1 << 20     # HTTP fronts: a request body (Settings)
    max_result_bytes: int = 1 << 20   # dispatchers: a function's result (Settings)
    # HTTP fronts: each function's waiting-page template, as the config file's reader read
    # it (broker/config_file.py: room_pages; the core reads no file)
    room_pages: dict = {}
    # build the task family when first used, not at start (Broker._build_tasks): a server
    # whose config names no function (zstalkd) answers its first command without it
    tasks_later: bool = False


class Front:
    __slots__ = ("peer", "front_id", "kind", "pid", "sessions", "last_seen")

    def __init__(self, peer: bytes, hello: Hello, now: float) -> None:
        self.peer = peer
        self.front_id = hello.front_id
        self.kind = hello.kind
        self.pid = hello.pid
        self.sessions: dict[int, object] = {}
        self.last_seen = now


class Broker:
    def __init__(self, config: Config, now: float,
                 sysinfo: Callable[[], stats.SysInfo] = stats.no_sysinfo,
                 wall_offset: float = 0.0, journal: Journal | None = None,
                 restored: Restored | None = None) -> None:
        """`journal`: what keeps the changes (journal.py; None: nothing kept), and
        `restored` what it gave back, to rebuild from."""
        self.config = config
        self.wall_offset = wall_offset    # wall clock = now + offset (counter intervals)
        self.started = now
        self.broker_id = random.getrandbits(64)
        # the components only ask the journal for room and append records to it
        self.journal = journal if journal is not None else NullJournal(config.binlog_max_size)
        self.journal.wall_offset = wall_offset
        # a restored state keeps its id: fronts' reservations survive our restart
        self.state_id = self.journal.state_id or random.getrandbits(64) or 1
        self.fronts: dict[bytes, Front] = {}
        self.fronts_added = True        # a front's silence deadline is new (next_wake)
        # peer -> the older schema version it speaks: the actor fills it as it decodes
        # (a dispatcher older than version 4 is handed no request task)
        self.old_peers: dict[bytes, int] = {}
        self.fenced: collections.OrderedDict[int, None] = collections.OrderedDict()
        self.out = Out()
        self.control: list[tuple[bytes, object]] = []
        # the actor's word to a front right after its Welcome, or None: a broker stopping
        # tells a front welcomed meanwhile to hold (actor.py), and owns that stop, not us
        self.after_welcome: Callable[[Front], object | None] | None = None
        self.resumed: collections.deque = collections.deque()  # sessions whose reserve was answered
        self.admission = Admission(config.max_jobs_bytes)
        self._build(config, now, sysinfo)
        if not config.tasks_later:
            self.build_tasks()
        self.live = _Live(self)
        if restored is not None:
            self.beanstalk.load(restored.jobs, restored.next_id, now, wall_offset)
            self.tasks.restore_gates(restored.gates, now)
            self.tasks.restore_paused(restored.paused)     # (before its tasks are offered)
            self.tasks.restore(restored.tasks, now, restored.draws)
            # a time missed while we were down fires once, now
            self.scheduling.fire(self.schedules.restore(restored.schedules, now), now)

    def _build(self, config: Config, now: float, sysinfo) -> None:
        """The components, what they share, and the one op table."""
        me = Identity(self.broker_id, now, sysinfo, config.version, config.max_job_size,
                      config.binlog_max_size)
        out, admission, journal = self.out, self.admission, self.journal
        self.beanstalk = BeanstalkCommands(out, admission, journal, me, self._answered, now)
        self.pools = PoolCommands(self.beanstalk, out)
        # after a restart, Acquire waits until the fronts had time to re-register holdings
        self.counting = CounterCommands(now, self.wall_offset, config.stat_interval_s,
                                        now + RECOVERY_GRACE_S if config.recovering else 0.0)
        admission.holders = (self.beanstalk,)
        #: the session owner of each family (Session.family) and of each front kind
        self._families = [self.beanstalk, self.counting]
        self._kinds = {"counter": self.counting}
        table: list = [None] * (max(Op.codes()) + 1)
        table[Op.OPEN], table[Op.CLOSE] = self._open_again, self._close_op
        for component in (self.beanstalk, self.pools, self.counting):
            for code, handler in component.handlers().items():
                table[code] = handler
        self._handlers = table
        self.tasks_built, self.label_room = False, 0
        for code in range(Op.T_ENQUEUE, len(table)):     # (the task family's ops)
            table[code] = self._task_op

    def build_tasks(self) -> None:
        """The task family: cloud tasks and schedules, their sessions and ops.  Built at
        start, or with `tasks_later` at first use (a front of theirs says Hello, one of
        their ops comes, anything reads them) or when the server says (serve.py: its
        modules are a tenth of zstalkd's start-up, imported on a thread after its first
        answers)."""
        if self.tasks_built:
            return
        from .tasks.commands import TaskCommands
        from .schedules.commands import ScheduleCommands
        from .schedules.schedules import Schedules
        from .tasks.store import Tasks
        from .views import OperatorViews        # (the HTTP front's: with the task family)
        config, out, admission, journal = self.config, self.out, self.admission, self.journal
        tasks = Tasks({f.name: f for f in config.functions}, self.wall_offset,
                      base=config.base_function, started_at=self.started,
                      upstreams=config.upstreams)
        schedules = Schedules(tasks, self.wall_offset)
        tasks.journal = schedules.journal = journal
        self.tasking = TaskCommands(tasks, config.api, out, admission, self.old_peers)
        self.scheduling = ScheduleCommands(schedules, self.tasking, journal)
        self.views = OperatorViews(self.beanstalk, self.counting, self.fronts, self.old_peers)
        self.counting.functions = self.tasking      # fn:NAME counters (core/counters.py)
        admission.holders = (self.beanstalk, tasks, schedules)
        self._families.append(self.tasking)
        self._kinds.update(http=self.tasking, dispatcher=self.tasking)
        self._handlers[Op.T_ENQUEUE:] = [None] * (len(self._handlers) - Op.T_ENQUEUE)
        for component in (self.tasking, self.scheduling, self.views):
            for code, handler in component.handlers().items():
                self._handlers[code] = handler
        tasks.counts.room = self.label_room
        self.tasks_built = True

    def set_label_room(self, top: int) -> None:
        """How many tube and function names the metrics label from their first count on
        (shared/labels.py), in the family built later too."""
        self.label_room = self.queue.metrics.room = top
        if self.tasks_built:
            self.tasks.counts.room = top

    def __getattr__(self, name: str):
        """`tasking` and `scheduling` before the task family is built (`tasks_later`):
        build it, then they are plain attributes."""
        if name in ("tasking", "scheduling") and not self.__dict__.get("tasks_built", True):
            self.build_tasks()
            return self.__dict__[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def _task_op(self, s, op, now):
        """A task family's op before the family is built: build it, then handle the op."""
        self.build_tasks()
        return self._handlers[op[CODE]](s, op, now)

    # -- what the actor and the journal read -------------------------------------------
    @property
    def queue(self):
        return self.beanstalk.queue

    @property
    def tasks(self):
        """The task store (tasks/store.py)."""
        return self.tasking.store

    @property
    def schedules(self):
        """The schedule store (schedules/schedules.py)."""
        return self.scheduling.store

    @property
    def counter_store(self):
        return self.counting.store

    @property
    def next_id(self) -> int:
        return self.beanstalk.next_id

    @property
    def draining(self) -> bool:
        return self.admission.draining

    @draining.setter
    def draining(self, on: bool) -> None:
        self.admission.draining = on

    # -- messages --------------------------------------------------------------------
    def handle(self, peer: bytes, msg, now: float) -> None:
        front = self.fronts.get(peer)
        if type(msg) is Batch and front is not None:    # (the everyday message first)
            front.last_seen = now
            self._batch(front, msg.ops, now)
        elif isinstance(msg, Hello):
            self._hello(peer, front, msg, now)
        elif front is None:
            # a front from before our time (we restarted) or one we declared dead
            self.control.append((peer, Fenced(int.from_bytes(peer[:8], "big"), self.broker_id)))
        else:
            front.last_seen = now

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
            self.fronts_added = True
            restored = hello.state_id == self.state_id
            if hello.kind in ("http", "dispatcher") and not self.tasks_built:
                self.build_tasks()
            if hello.kind == "counter":
                # holdings are known exactly by the fronts, so they always come back; a
                # front of an earlier broker means others may still be on their way
                restored = True
                if hello.state_id not in (0, self.state_id):
                    self.counting.refuse_acquire_while_fronts_return(
                        self.started + RECOVERY_GRACE_S)
        else:
            front.last_seen = now
            restored = True
        if restored:
            self._reconcile(front, hello.sessions, now)
        self.control.append((peer, Welcome(self.broker_id, self.state_id, self.settings(),
                                           restored)))
        if self.after_welcome is not None:
            word = self.after_welcome(front)
            if word is not None:
                self.control.append((peer, word))

    def settings(self) -> Settings:
        """What every front is told at Welcome; before the task family is built no
        function is configured (`tasks_later`), so no origin may call one."""
        c = self.config
        sizes = (c.max_job_size, c.max_body_bytes, c.max_result_bytes)
        if not self.tasks_built:        # (the task fields' defaults: no origins, no headers)
            return Settings(*sizes, c.api.public_enqueue, c.api.private_results,
                            trust_forwarded=c.api.trust_forwarded)
        api = self.tasking.api
        return Settings(*sizes, api.public_enqueue, api.private_results,
                        *self.tasking.cross_origin(), self.tasking.group_headers(),
                        api.trust_forwarded, self.tasking.rooms(c.room_pages))

    def configure_functions(self, functions, now: float) -> None:
        """A config read again (config_file.TaskConfig): calls go where it says now, and
        HTTP fronts and dispatchers get the new Settings."""
        self.config = self.config._replace(max_body_bytes=functions.max_body_bytes,
                                           max_result_bytes=functions.max_result_bytes,
                                           room_pages=dict(functions.room_pages))
        self.tasking.configure({f.name: f for f in functions.named}, functions.base,
                               functions.api, now, functions.upstreams)
        settings = self.settings()
        for peer, front in self.fronts.items():
            if front.kind in ("http", "dispatcher"):
                self.control.append((peer, settings))

    def resolving(self) -> list:
        """(upstream, server) of each server whose name the actor looks up (`resolve`,
        core/upstreams/spec.py); none until the task family is built (nothing is
        called before, and a name not yet looked up is called by its name)."""
        return self.tasking.store.upstream.names() if self.tasks_built else []

    def resolved(self, upstream: str, url: str, addresses, now: float) -> bool:
        """The actor's lookup of a resolved name (sorted addresses; none: the last set
        stays): its upstream's peers follow; whether they changed."""
        changed = self.tasks_built and self.tasking.store.upstream.resolved(
            upstream, url, addresses, now)
        if changed:         # (new addresses are probed too, gone ones no more)
            self.tasking.assign_checks()
        return changed

    def observe_wall(self, wall: float, now: float) -> None:
        self.scheduling.observe_wall(wall, now)

    def log_holdings(self) -> None:
        self.beanstalk.log_holdings()

    def end_turn(self, now: float) -> None:
        """The turn's last record, before the journal ends the turn: the slow rates' TATs,
        once a turn, when one moved (its calls leave with the turn's replies)."""
        if self.tasks_built and self.tasking.store.gates_changed:
            self.journal.append[GATES](self.tasks.durable_gates(now))

    def _reconcile(self, front: Front, states, now: float) -> None:
        """Make the front's sessions what it says they are (after either side lost the
        other): sessions it no longer lists close, listed ones are restored by the
        component that owns their kind."""
        listed = {s.conn: s for s in states}
        for conn in [c for c in front.sessions if c not in listed]:
            self._close(front.sessions[conn], now)
        owner = self._kinds.get(front.kind, self.beanstalk)
        for conn, st in listed.items():
            front.sessions[conn] = owner.restore(front, front.sessions.get(conn), st, now)

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
        out = self.out.get(front.peer)
        if out is None:
            out = self.out[front.peer] = []
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
                            out.append((op[CONN], refused))
                        continue
                code = op[CODE]
                s = sessions.get(op[CONN])
                if s is None:
                    if code == Op.OPEN:
                        self._open(front, op[CONN])
                    elif code not in SILENT_OPS:
                        out.append((op[CONN], R.INTERNAL_ERROR))
                    continue
                if (code > _HALF_CLOSE and _FAMILY[code] != s.family
                        or s.is_pool and code not in POOL_OPS):
                    out.append((op[CONN], R.INTERNAL_ERROR))   # an op for the other protocol
                    continue
                if s.behind is not None and code != _CLOSE and code != _HALF_CLOSE:
                    self._hold(s, op, out)
                    continue
                reply = handlers[code](s, op, now)
            except Exception as exc:
                # a malformed op from a buggy front must not take the broker down
                log.warning("bad op %.60r from front %016x: %r", op, front.front_id, exc)
                reply = _error_reply(op)
            if reply is not None:
                out.append(reply)
        if self.resumed:        # after the whole batch: beanstalkd also finishes what it
            self._resume(now)   # read from one client before a woken one reads on

    # -- ordering behind a waiting reserve ------------------------------------------
    def _hold(self, s, op, out: list) -> None:
        """Keep `op` until the session's waiting reserve is answered (schema: "Ordering")."""
        behind = s.behind
        behind.append(op)
        if op[CODE] == _PUT:
            s.behind_bytes += len(op[PUT_BODY])
        if (len(behind) > SESSION_OPS_MAX
                or s.behind_bytes > SESSION_BYTES_MAX + self.config.max_job_size):
            log.warning("front %016x sent more than a connection may have in flight: "
                        "answering its held commands INTERNAL_ERROR", s.front.front_id)
            if s.waiting:
                self.beanstalk.queue.stop_waiting(s)
                out.append((s.conn, R.INTERNAL_ERROR))      # the reserve
            out.extend((s.conn, R.INTERNAL_ERROR) for o in behind if o[0] not in SILENT_OPS)
            s.behind, s.behind_bytes = None, 0

    def _answered(self, s) -> None:
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
                if op[CODE] == _PUT:
                    s.behind_bytes -= len(op[PUT_BODY])
                try:
                    reply = handlers[op[CODE]](s, op, now)
                except Exception as exc:
                    log.warning("bad op %.60r from front %016x: %r", op, s.front.front_id, exc)
                    reply = _error_reply(op)
                if reply is not None:
                    out.append(reply)
            if not s.waiting:
                s.behind, s.behind_bytes = None, 0

    # -- timers ----------------------------------------------------------------------
    def next_wake(self, armed: float | None) -> float | None:
        """The next deadline when one set since the last call may come before `armed`, the
        timer the actor has armed (math.inf: none), else None; `armed` None (that timer
        fired): the next deadline, whatever it is.  Only the queue's deadlines are told
        apart: a front's silence deadline only moves later once it is known, the counters'
        collection moves only in `expire`, and with tasks or schedules every turn looks
        at them all."""
        queue = self.beanstalk.queue
        if (armed is not None and queue.soonest >= armed and not self.fronts_added
                and (not self.tasks_built or not self.tasking.store.tasks
                     and not self.scheduling.store.by_name)):
            return None
        queue.soonest, self.fronts_added = math.inf, False
        return self.next_deadline()

    def next_deadline(self) -> float | None:
        # (called after every turn of the actor: plain comparisons, and the task and
        # schedule stores asked only when they hold something)
        d = self.counting.next_deadline()
        t = self.beanstalk.queue.next_deadline()
        if t is not None and t < d:
            d = t
        if self.tasks_built:
            if self.tasking.store.tasks:
                t = self.tasking.next_deadline()
                if t is not None and t < d:
                    d = t
            if self.scheduling.store.timers:
                t = self.scheduling.next_deadline()
                if t is not None and t < d:
                    d = t
        for f in self.fronts.values():
            silent_at = f.last_seen + PEER_TIMEOUT_S
            if silent_at < d:
                d = silent_at
        return d

    def expire(self, now: float) -> None:
        self.beanstalk.expire(now)
        if self.tasks_built:
            self.tasking.expire(now)
            self.scheduling.expire(now)
        if self.resumed:
            self._resume(now)
        self.counting.expire(now)
        for front in [f for f in self.fronts.values() if now - f.last_seen > PEER_TIMEOUT_S]:
            self.drop_front(front, now)

    # -- sessions --------------------------------------------------------------------
    def _open(self, front: Front, conn: int):
        s = front.sessions[conn] = self._kinds.get(front.kind, self.beanstalk).open(front, conn)
        return s

    def _open_again(self, s, op, now):
        return None  # already open: a duplicate OPEN changes nothing

    def _close_op(self, s, op, now):
        self._close(s, now)

    def _close(self, s, now: float) -> None:
        """A connection went away: the component of its family lets go of what it held."""
        del s.front.sessions[s.conn]
        self._families[s.family].close(s, now)


def _error_reply(op) -> tuple | None:
    """INTERNAL_ERROR for an op that failed, if it is shaped like one that gets a reply."""
    try:
        if len(op) > 1 and type(op[CONN]) is int and op[CODE] not in SILENT_OPS:
            return (op[CONN], R.INTERNAL_ERROR)
    except TypeError:       # not a sequence, or an unhashable opcode
        pass
    return None


class _Live:
    """The core's state as the journal reads it (journal.LiveView): the same dicts the
    components hold (made once, never replaced), never copied; the task family's are
    asked for when read (it may be built later: Config.tasks_later)."""
    __slots__ = ("jobs", "_broker", "_beanstalk")

    def __init__(self, broker: Broker) -> None:
        self.jobs = broker.beanstalk.queue.jobs
        self._broker = broker
        self._beanstalk = broker.beanstalk

    @property
    def tasks(self) -> dict:
        return self._broker.tasks.tasks

    @property
    def schedules(self) -> dict:
        return self._broker.schedules.by_name

    @property
    def next_id(self) -> int:
        return self._beanstalk.next_id
