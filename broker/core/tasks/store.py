"""Cloud tasks: function calls queued in the broker and made over HTTP by dispatchers.

Pure, like the rest of the core: every method that depends on time takes `now`
(monotonic seconds); wall-clock values (createdAt, the default priority) are
`now + wall_offset`.  The HTTP front turns requests into calls of this store and its
answers into JSON; dispatchers are handed tasks with `take` and report each call with
`outcome`; nothing here knows HTTP or sockets.

This is the top coordinator: the ops come in here, and it calls down, never up.  It
holds the journal (the core sets it) and passes it down where a change below is kept,
logs the calls that failed, and orders the timers' expiry.  Who owns what beneath it:

    ledger.py       the tasks (by uid and by enqueue order, their bytes, their counts),
                    their results' and queue timeouts' timers, and every status move
                    (task.py: the statuses, their moves, what a task is); what is on offer
    waiting.py      the waiting room's flow: admissions, done, passes that expire,
                    online tasks abandoned (room.py: who waits, the passes' timers)
    restart.py      a journal's tasks back where their statuses say
    moves.py        a failed call moved to the next server of its upstream within its
                    attempt (nginx's next upstream), at once or when its gates open

The coordinators call down into the ledger, and it into the components, which own the
rest, return data and call nothing back: functions.py knows the functions and the specs
in use; enqueue.py checks an enqueue (options.py its options); lines.py keeps each
function's line and the order of hand-outs (rotation.py: a function's groups served in
turn); limiter.py says whether and when a function may start a call (concurrency,
rates and pauses, its upstream's limits, counter clients' slots, its plain url's host:
hosts.py) and hears how calls ended, group_limits.py the same of each group of a
function (its group_concurrency and group_rate); upstream_calls.py picks a call's
server; calls.py keeps the calls in flight; room.py the waiting room; outcomes.py says
what a call's outcome does; deadlines.py is every component's timers.  The store keeps
the names it always exported and, read only, the components' state the views and tests
read.

A running task has a deadline (calls.py): a dispatcher that dies mid-call gives an
unknown outcome then.  Cancelled while running, it is cancelled at once and its slots
freed (`cancel`; commands.py tells its dispatcher to abort the call), and the call's
report is read only for possiblyExecuted.  A task still queued `queueTimeout` after its
createdAt fails ("queue timeout") and is never called.  Every call that did not succeed
(a failure, fatal or unknown outcome, also one the broker decides) is logged with its
function, URL, status or error and the task's fate, at most once per FAILED_CALL_LOG_S
per function with the count since (protocol/ratelog.py): only the broker knows a call's
function, and it sees every dispatcher's outcomes, so the limit holds across them.

Errors are data: `TaskError(code, message)`, a stable name and a sentence for people;
nothing is changed when an error is returned (the HTTP front's STATUS table gives each
its status).  Every change is appended to the journal as it is made (core/shared/journal.py),
its room asked for first (enqueue and cancel answer 503 when the disk is full; a task is
not handed out then).  `restore` rebuilds the tasks a journal kept; a call running when
the broker stopped may still be running: its dispatcher, re-registering within CLAIM_S,
claims it (`claim`), else its outcome is unknown, decided by its deliveryMode.
"""
from __future__ import annotations

import logging
import math
import random
import secrets
from typing import Any, Callable

from ....protocol.ratelog import RateLog
from ....protocol.schema.tasks import (ADMITTED, AT_LEAST_ONCE, AT_MOST_ONCE, CANCELLED,  # noqa: F401
                                       FAILED, FINISHED, FUNCTION_NAME, INT64, MAX_ATTEMPTS,
                                       MAX_DURATION_MS, MAX_LEVEL, MAX_PAGE, MAX_TIMEOUT_MS,
                                       OPTIONS, QUEUE_TIMEOUT, QUEUED, RUNNING, STATUSES,
                                       SUCCESS, UNIQUE_ID)
from ..shared.journal import (FUNCTION_PAUSE, TASK_CALL, TASK_END, TASK_NEW, TASK_WHOLE,
                              TASK_STATE, Journal, NullJournal)
from ..upstreams.unavailable import NO_LIVE_UPSTREAMS, Unavailable
from . import restart
from .components.calls import Calls
from .components.group_limits import GroupLimits
from .components.limiter import DURABLE_RATE_S, Limiter  # noqa: F401 (the core's names, as before)
from .components.room import Room
from .components.upstream_calls import UpstreamCalls
from .enqueue import new_task
from .ledger import AGAIN_S, Ledger
from .model import requests
from .model.functions import Functions
from .model.options import bad, parse_options  # noqa: F401
from .model.outcomes import (FAIL, FAILED_KINDS, REQUEUE, RETRY, SUCCEED, after_abort, decide,
                             failed_call)
from .model.spec import DEFAULTS, PER_UNIT, ApiPolicy, FunctionSpec  # noqa: F401
from .model.task import (ABANDONED, CALL_GRACE_S, CLAIM_S, RESTARTED,  # noqa: F401
                         TASK_ERROR_CHARS, TASK_OVERHEAD_BYTES, Outcome, Task, TaskBackoff,
                         TaskError, client_net)
from .moves import Moves
from .waiting import WaitingRoom

#: what `outcome` answers when a failed call moved on to another server (a truthy "taken")
MOVED = "moved"
PAGE_SCAN = 10_000          # tasks one listing request may look at (see views.page)
#: a function's failed calls are logged at most this often (each line counts those not
#: logged since): a misspelled name under base_url fails every call, and said nothing
FAILED_CALL_LOG_S = 10.0

log = logging.getLogger("zstalk.tasks")
_NO_SPACE = TaskError("out_of_space", "the binlog's disk is full")


def _seed() -> int:
    """A room event's draw seed: 64 bits of the system's CSPRNG (nobody can guess the
    order from the time of the opening)."""
    return secrets.randbits(64)


class Tasks:
    def __init__(self, functions: dict[str, FunctionSpec], wall_offset: float = 0.0,
                 rand: Callable[[], float] = random.random,
                 base: FunctionSpec | None = None, started_at: float = -math.inf,
                 upstreams: tuple = (), seeds: Callable[[], int] = _seed) -> None:
        """`rand` (retries' jitter) and `seeds` (a room event's draw) are the randomness
        the core takes as input, so a test gives its own."""
        self.fns = Functions(functions, base)     # the functions, their specs in use
        self.function = self.fns.function           # name -> its spec (None: no such)
        self.specs = self.fns.specs                 # (the same dict for the store's life)
        self.wall_offset = wall_offset
        self.rand, self.seeds = rand, seeds
        self.journal: Journal = NullJournal()     # what is kept of changes (set by the core)
        self.inflight = Calls()                 # the calls in flight, their deadlines
        self.upstream = UpstreamCalls(upstreams, started_at=started_at)
        self.limits = Limiter(self.upstream, self.function, started_at)
        self.group_limits = GroupLimits(self.function, started_at)
        self.room = Room()
        self.room.plan(self.fns.functions, wall_offset)     # (room events to draw)
        self.ledger = ledger = Ledger(self.fns, self.limits, self.room, self.group_limits)
        self.waiting_room = WaitingRoom(ledger)
        self.moves = Moves(self.upstream, self.limits, self.inflight, self.function)
        # the ledger's, the same for the store's life (the views and the tests read them)
        self.tasks, self.by_seq, self.lines = ledger.tasks, ledger.by_seq, ledger.lines
        self.counts = ledger.counts
        self.failed_calls = RateLog(log, FAILED_CALL_LOG_S, "failed")   # by function
        self.has_online, self.seen = self.waiting_room.has_online, self.waiting_room.seen

    bytes = property(lambda self: self.ledger.bytes)
    activity = property(lambda self: self.ledger.activity,      # (the metrics take it)
                        lambda self, activity: setattr(self.ledger, "activity", activity))

    # the config's functions, and the spec of any other name under its base_url
    functions = property(lambda self: self.fns.functions)
    base = property(lambda self: self.fns.base,
                    lambda self, base: setattr(self.fns, "base", base))
    uses = property(lambda self: self.fns.uses)

    def configure(self, functions: dict[str, FunctionSpec], base: FunctionSpec | None,
                  now: float, upstreams: tuple | None = None) -> None:
        """A new config (SIGHUP): every function tasks use takes its new spec, or None; a
        gate keeps its TAT, and a new rate applies from the next start; a server keeps its
        state while its upstream lists its url as written."""
        self.fns.configure(functions, base)
        self.room.plan(self.fns.functions, self.wall_offset)
        if upstreams is not None:
            self.upstream.reload(upstreams, now)
        self.limits.configure()
        self.ledger.regroup(now)
        for name in list(self.lines.ready):
            self.lines.forget_offer(name)
            self.ledger.offer(name, now)

    # -- enqueue -------------------------------------------------------------------------
    def enqueue(self, function: str, params: bytes, options: Any, now: float,
                uid: str | None = None, request: Any = None,
                client_ip: str | None = None, online: bool = False,
                headers: dict | None = None,
                token: bytes | None = None) -> Task | TaskError:
        """A new task, or the error that refused it (then nothing changed).  `uid` is a
        random id the caller made (the core has no randomness of its own for ids).
        `request`: a request task's request object (requests.py), whose body becomes the
        params: unchecked, or as `requests.parse` made it; `headers`: the group headers'
        values the HTTP front saw (TaskEnqueue); `token`: the SHA-256 of the task's own
        token (protocol/schema/tokens.py), kept with it."""
        spec = self.function(function)
        if spec is None:
            return TaskError("unknown_function", f"no function named {function!r}")
        task = new_task(spec, params, options, now, uid, request, client_ip, online,
                        seq=self.ledger.next_seq, wall_offset=self.wall_offset, taken=self.tasks,
                        room=self.room, upstream=self.upstream,
                        groups=self.ledger.groups.get(function), headers=headers,
                        token=token)
        if isinstance(task, TaskError):
            return task
        if not self.journal.room[TASK_NEW](task):
            return _NO_SPACE            # (the record it sized is the one it appends)
        self.ledger.enqueue(task, spec, now)
        self.journal.append[TASK_NEW](task)
        return task

    # -- handing out ---------------------------------------------------------------------
    def take(self, holder, now: float, plain_only: bool = False) -> Task | None:
        """The next task a dispatcher may call: the best due one, by (-level, priority,
        seq), among the functions that may start a call now (below their concurrency,
        their gate open).  `plain_only` (a dispatcher too old for request tasks): among
        the functions whose head is not a request task."""
        self.ledger.open_gates(now)       # (an op may come in a turn before its timer fires)
        lines = self.lines
        with lines.passing() as passed:
            while True:
                while (top := self.ledger.top(now)) is not None:
                    key, name = top
                    head = lines.by_key[key]
                    if not head.online and (not plain_only or head.request is None):
                        break                   # (online heads are admitted: `admit`)
                    passed.pop()
                else:
                    return None
                task, peer = lines.by_key[key], None
                spec = self.specs[name]
                upstream = spec.upstream
                if upstream is not None:
                    peer = self.upstream.pick(upstream, task.balance_key, now)
                    if type(peer) is Unavailable:   # held back, or its attempt fails
                        passed.drop()
                        self._unavailable(task, peer, now)
                        continue
                elif self.limits.hosts.failing and not self.limits.host_pick(name, spec, now):
                    passed.drop()               # its host is shut: its tasks wait in
                    self.ledger.offer(name, now)    # place until the probe may go
                    continue
                if not self.journal.room[TASK_CALL](task):
                    if peer is not None:
                        peer.conns -= 1
                    return None             # the binlog's disk is full: it waits, queued
                passed.drop(keep_offer=True)    # ours, the top before the passed go back
                if upstream is not None:
                    self.upstream.started(upstream, now)
                break
        task.peer = (upstream, peer) if peer is not None else None
        task.tried = (peer.url,) if peer is not None else ()
        self.ledger.start(task, "take", now)
        task.status_code = task.error = None        # (the last attempt's: they no longer apply)
        task.attempt += 1
        self.inflight.start(task, holder, now)
        self.journal.append[TASK_STATE](task)
        self.ledger.offer(name, now)                  # its next head, if it may go on
        return task

    def call_url(self, task: Task, spec: FunctionSpec) -> str:
        """Where a call of running `task` goes: its function's url or its server's and
        the function's path; then a request task's path and query."""
        return self._url(task, spec, task.peer)

    @staticmethod
    def _url(task: Task, spec: FunctionSpec, peer) -> str:
        base = spec.url if peer is None else peer[1].url + spec.path
        return base if task.request is None else requests.url(base, task.request)

    def _unavailable(self, task: Task, why: Unavailable, now: float) -> None:
        """No server of its upstream for `task`, the head of its function: every one down
        fails this attempt; otherwise the function waits, its tasks in their places."""
        name = task.function
        if why.reason == NO_LIVE_UPSTREAMS:
            if self.journal.room[TASK_STATE](task):
                self.lines.unready(task, turn=True)
                self.lines.queued.discard(name)
                task.attempt += 1
                task.started = now
                self._apply(task, Outcome("failure", error=NO_LIVE_UPSTREAMS), now)
                self.journal.append[TASK_STATE](task)
                self.ledger.offer(name, now)
                return
            why = Unavailable(why.reason, now + AGAIN_S)    # (disk full: look again later)
        self.limits.block(name, math.inf if why.until is None else max(why.until, now + 0.001))
        self.ledger.offer(name, now)                  # (arms the timer for a finite wait)

    # -- outcomes ------------------------------------------------------------------------
    def outcome(self, uid: str, attempt: int, result: Outcome, now: float,
                holder=None, moves: bool = False) -> bool | str:
        """A dispatcher's report of call `attempt`; False if that call is no longer the
        task's current one (a late report after a timeout gave up on it, or of a server
        its attempt moved on from), or `holder` is given and is not the dispatcher the
        call was handed to.  `moves`: the dispatcher can take a move (moves.py): MOVED
        when the call went on to another server."""
        task = self.tasks.get(uid)
        if task is None or task.attempt != attempt:
            return False
        if task.status != RUNNING:
            if task.aborted == attempt:         # the report of an aborted call
                self._after_abort(task, result)
            return False
        # (a restart forgets `tried`: a claimed call's report is then taken whatever its move)
        if holder is not None and (task.holder is not holder and task.holder != RESTARTED
                                   or task.tried and result.move != len(task.tried) - 1
                                   or self.moves.is_waiting(task)):
            return False
        peer, task.peer = task.peer, None       # (where the call went: for the log)
        spec = self.function(task.function)
        if peer is not None:                    # (its server's accounting: limiter.py)
            for name in self.limits.server_done(*peer, spec, result, now):
                self.ledger.offer(name, now)
            if moves and result.kind in FAILED_KINDS and self.moves.after(
                    task, peer, result, now):
                return MOVED
        elif spec is not None and spec.max_fails and spec.upstream is None:
            for name in self.limits.host_done(spec, result, now):   # (its host's: hosts.py)
                self.ledger.offer(name, now)
        self.moves.drop(task)
        self._ended(task, attempt, result, peer, now)
        return True

    def _ended(self, task: Task, attempt: int, result: Outcome, peer, now: float) -> None:
        """Call `attempt` of running `task` is over: its outcome decides what follows."""
        self._end_call(task, now)
        if result.kind != "declined":           # (a declined call was never made)
            took = now - task.started
            self.counts.of(task.function).calls.observe(took)
            self.limits.recent_of(task.function).ended(now, took)
        self._apply(task, result, now)
        if result.kind in FAILED_KINDS and self.failed_calls.due(task.function, now):
            self._say_failed(task, attempt, result, peer, now)
        if self.journal.room[TASK_END](task):
            self.journal.append[TASK_END](task)
        else:
            self.ledger.set_result(task, None)
            task.error = "the call succeeded but its result was not kept: the binlog's disk is full"
            self.journal.append[TASK_STATE](task)   # (its room came with the call)

    def _apply(self, task: Task, result: Outcome, now: float) -> None:
        """Carry out what the outcome does to the task (outcomes.decide; a call that never
        reached a plain url's host waits in place when its function counts failures: an
        error or a timeout always counts against the host, which then holds the next try
        back, so a refused host is not called again and again)."""
        spec = self.function(task.function)
        action = decide(result, task, self.rand, waits=spec is not None and spec.max_fails > 0
                        and spec.upstream is None)
        if result.kind != "declined":
            task.status_code = result.status_code
            task.error = action.error
        if action.pause:
            self.limits.slow_down(task.function, spec, task.started, result, now)
        if action.do == SUCCEED:
            self.ledger.set_result(task, result.result, result.result_headers)
            self.ledger.finish(task, "succeed", now)
            self.limits.succeeded(task.function)
        elif action.do == REQUEUE:              # declined, 429: no attempt spent
            task.attempt -= 1
            self.ledger.queue(task, now, now)
        elif action.do == RETRY:
            self.counts.of(task.function).retries += 1
            self.ledger.queue(task, now + action.wait_ms / 1000, now)
        elif action.do == FAIL:
            self.ledger.finish(task, "fail", now)

    def _say_failed(self, task: Task, attempt: int, result: Outcome, peer, now: float) -> None:
        """A failed call, logged (at most once per FAILED_CALL_LOG_S per function)."""
        spec = self.function(task.function)
        url = "(its function is no longer configured)" if spec is None else \
            self._url(task, spec, peer)
        self.failed_calls.say(task.function, now, *failed_call(task, attempt, result, url, now))

    def lost(self, holder, now: float) -> None:
        """A dispatcher went away: its calls' outcomes are unknown."""
        for task in self.inflight.of(holder, self.by_seq):
            self.outcome(task.uid, task.attempt,
                         Outcome("unknown", error="the dispatcher went away during the call",
                                 failure=""), now)

    def _end_call(self, task: Task, now: float) -> None:
        self.inflight.end(task)
        self.ledger.slot_freed(task)
        self.ledger.offer(task.function, now)         # a free slot: it may start its next call

    # -- cancel --------------------------------------------------------------------------
    def cancel(self, uid: str, now: float) -> Task | TaskError:
        """Cancel a queued task, end an admitted one, or abort a running one's call: it is
        cancelled at once, its slot free (the caller tells its dispatcher to abort the
        call: commands.py)."""
        task = self.tasks.get(uid)
        if task is None:
            return TaskError("not_found", f"no task {uid!r}")
        if task.status not in (QUEUED, ADMITTED, RUNNING):
            return TaskError("not_cancellable", f"task {uid!r} is {task.status}")
        # (an admission's end was reserved when it was admitted, a call's with its start)
        if task.status == QUEUED and not self.journal.room[TASK_STATE](task):
            return _NO_SPACE
        if task.status == ADMITTED:         # (its pass is revoked: the verify check asks)
            self.waiting_room.release(task, now)
        elif task.status == RUNNING:
            self._abort(task, now)
        else:
            self.ledger.dequeue(task, now)
        self.ledger.finish(task, "cancel", now)
        self.journal.append[TASK_STATE](task)
        return task

    def server_back(self, upstream: str, now: float) -> None:
        """A server of `upstream` passed its health checks again: the functions on it that
        waited for a usable server look again now (not at the time their wait was for)."""
        for name in self.limits.unblock(lambda spec: spec.upstream == upstream):
            self.ledger.offer(name, now)

    def _abort(self, task: Task, now: float) -> None:
        """The call of running `task` is aborted: its slots are free now (its function's,
        its group's, its server's with nothing counted for or against it: limiter.py);
        a report on it that comes later is only read for `possibly_executed`
        (outcomes.after_abort)."""
        peer, task.peer = task.peer, None
        if peer is not None:
            for name in self.limits.server_aborted(*peer):
                self.ledger.offer(name, now)
        self.moves.drop(task)               # (a move waiting for its gate: no call runs)
        task.aborted = task.attempt
        task.error = "cancelled during its call (the call was aborted)"
        self._end_call(task, now)

    def _after_abort(self, task: Task, result: Outcome) -> None:
        """A report on the aborted call of cancelled `task`: when it says the call may have
        run, the task's whole record again (TASK_WHOLE), so a restart still says so (with
        no room left in the journal, memory alone says it, and the log)."""
        was = task.possibly_executed
        after_abort(task, result)
        if task.possibly_executed and not was:
            if self.journal.room[TASK_WHOLE](task):
                self.journal.append[TASK_WHOLE](task)
            else:
                log.warning("task %s: its aborted call may have run; the journal is full, "
                            "so only memory keeps that", task.uid)

    # -- an operator's hand (PATCH /v1/functions/{name}, POST /v1/tasks/{id}/retry) --------
    def retry(self, uid: str, now: float) -> Task | TaskError:
        """Queue a failed or cancelled task again, its attempts from the start and its
        error cleared (ledger.retry); journalled whole (TASK_WHOLE), as it drops its result
        and queue timeout.  An online task is not retried: its user has left the line."""
        task = self.tasks.get(uid)
        if task is None:
            return TaskError("not_found", f"no task {uid!r}")
        if task.status not in (FAILED, CANCELLED) or task.online:
            return TaskError("not_retryable", f"task {uid!r} is {task.status}" + (
                "" if task.status in (FAILED, CANCELLED) else "; only a failed or cancelled "
                "task is retried") + (", and online" if task.online else ""))
        if self.function(task.function) is None:
            return TaskError("unknown_function", f"no function named {task.function!r}")
        if not self.journal.room[TASK_WHOLE](task):
            return _NO_SPACE
        self.ledger.retry(task, now)
        self.journal.append[TASK_WHOLE](task)
        return task

    def pause_function(self, name: str, paused: bool, now: float) -> TaskError | None:
        """An operator's pause of function `name` (no call starts, no online task is
        admitted, until resumed), or its end; kept by the journal (FUNCTION_PAUSE), so a
        restart keeps it.  Pausing what is paused changes nothing and appends nothing."""
        if self.function(name) is None:
            return TaskError("unknown_function", f"no function named {name!r}")
        stopped = self.limits.stopped
        if (name in stopped) == paused:
            return None
        if not self.journal.room[FUNCTION_PAUSE]((name, paused)):
            return _NO_SPACE
        if paused:
            stopped.add(name)
            self.lines.forget_offer(name)       # (its head is no longer a candidate)
        else:
            stopped.discard(name)
            self.ledger.offer(name, now)
        self.journal.append[FUNCTION_PAUSE]((name, paused))
        return None

    def restore_paused(self, names: list) -> None:
        """The functions an operator paused, as a journal kept them."""
        self.limits.stopped.update(n for n in names if type(n) is str)

    # -- reading -------------------------------------------------------------------------
    def read(self, task: Task, now: float) -> None:
        """A read by the task's own token or the master key (commands.t_info; not a
        listing, not a read by id alone) returned finished `task`: it is kept at most
        its function's keep_result_after_read longer, never longer than it was.  The
        new expiry is a TASK_STATE record (it holds `expires`), so a restart keeps it;
        with the disk full the read is answered and the longer keep stays."""
        spec = self.specs.get(task.function)
        keep_ms = None if spec is None else spec.keep_result_after_read_ms
        if task.status not in FINISHED or keep_ms is None:
            return
        expires = now + keep_ms / 1000
        if expires >= task.expires or not self.journal.room[TASK_STATE](task):
            return
        self.ledger.keep_until(task, expires)
        self.journal.append[TASK_STATE](task)

    # -- the waiting room (waiting.py) ---------------------------------------------------
    def admit(self, now: float) -> int:
        return self.waiting_room.admit(now, self.journal)

    def done(self, uid: str, now: float) -> Task | TaskError:
        return self.waiting_room.done(uid, now, self.journal)

    # -- counter clients (fn:NAME, counters.py: the limiter's slots) ----------------------
    def unhold(self, name: str, slots: int, now: float) -> None:
        """A counter client gave `slots` back: a task waiting for one may start now."""
        self.limits.unhold(name, slots)
        self.ledger.offer(name, now)

    # -- the gates a restart keeps --------------------------------------------------------
    @property
    def gates_changed(self) -> bool:
        return self.limits.gates_changed

    def restore_gates(self, saved: dict[str, float], now: float) -> None:
        self.limits.restore_gates(saved, self.wall_offset, now)

    def durable_gates(self, now: float) -> dict[str, float]:
        return self.limits.durable_gates(self.wall_offset, now)

    # -- looking -------------------------------------------------------------------------
    def wait_num(self, task: Task) -> int:
        return self.lines.wait_num(task)

    # the components' state as the tests look at it (read only; the views ask them)
    gates = property(lambda self: self.limits.gates)
    recent = property(lambda self: self.limits.recent)
    running = property(lambda self: self.limits.running)
    held = property(lambda self: self.limits.held)
    ready = property(lambda self: self.lines.ready)
    by_key = property(lambda self: self.lines.by_key)
    calls = property(lambda self: self.inflight.timers.lanes["calls"])
    waiting = property(lambda self: self.lines.timers.lanes["waiting"])

    # -- timers --------------------------------------------------------------------------
    def next_deadline(self) -> float | None:
        heads = [d for d in (self.ledger.timers.next_deadline(), self.inflight.next_deadline(),
                             self.lines.next_deadline(), self.room.next_deadline(),
                             self.limits.next_deadline(), self.group_limits.next_deadline(),
                             self.moves.next_deadline())
                 if d is not None]
        return min(heads) if heads else None

    def expire(self, now: float) -> None:
        self.waiting_room.open_rooms(now, self.journal, self.seeds, self.wall_offset)
        self.ledger.make_due(now)
        self.ledger.open_gates(now)
        self.ledger.time_out(now, self.journal)
        self.waiting_room.expire(now, self.journal)
        self.limits.drop_idle(now, lambda name: name in self.specs)
        self.group_limits.drop_idle(now)
        for task, result, peer in self.moves.due(now, self.by_seq):    # (no server left)
            self._ended(task, task.attempt, result, peer, now)
        while (seq := self.inflight.overdue(now)) is not None:     # (outcome ends it)
            task = self.by_seq[seq]
            self.outcome(task.uid, task.attempt,
                         Outcome("unknown", error=Calls.why(task), failure=""), now)
        self.ledger.forget(now, self.journal)

    # -- restart -------------------------------------------------------------------------
    def restore(self, images: list, now: float, draws: list = ()) -> None:
        """The tasks a journal restored (journal.TaskImage each), wall-clock times back to
        our clock, each where its status says (restoring sets it, no move: the journal
        holds what it was); `draws` (journal.RoomDraw, each function's latest) put the
        members of each in their drawn places, and an event drawn is not drawn again."""
        for draw in draws:                  # (first: the lines they opened are offered)
            self.room.drawn(draw)
        self.room.plan(self.fns.functions, self.wall_offset)
        restart.restore(self.ledger, self.inflight, images, self.wall_offset, now, draws)
        self.ledger.regroup(now)            # (the groups' calls in flight)

    def claim(self, uid: str, attempt: int, holder, now: float) -> bool:
        """A re-registered dispatcher says it is making call `attempt` of task `uid`, or
        has its report: the call is its own again (calls.py).  False if we restarted
        without that call."""
        task = self.tasks.get(uid)
        return (task is not None and task.status == RUNNING and task.attempt == attempt
                and self.inflight.claim(task, holder, now))
