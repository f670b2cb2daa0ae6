"""Cloud tasks: function calls queued in the broker and made over HTTP by dispatchers.

Pure, like the rest of the core: every method that depends on time takes `now`
(monotonic seconds); wall-clock values (createdAt, the default priority) are
`now + wall_offset`.  The HTTP front turns requests into calls of this store and its
answers into JSON; dispatchers are handed tasks with `take` and report each call with
`outcome`; nothing here knows HTTP or sockets.

This is the coordinator: it owns the tasks (by uid and by enqueue order, their bytes),
their results' and queue timeouts' timers, and it is the only writer of a task's status
(task.py: the statuses, their moves, what a task is).  What it coordinates owns the rest,
returns data and calls nothing back: functions.py knows the functions and the specs in
use; enqueue.py checks an enqueue (options.py its options); lines.py keeps each
function's line and the order of hand-outs; limiter.py says whether and when a function
may start a call (concurrency, rates and pauses, its upstream's limits, counter clients'
slots) and hears how calls ended; upstream_calls.py picks a call's server; calls.py
keeps the calls in flight; room.py the waiting room; outcomes.py says what a call's
outcome does; deadlines.py is every component's timers.

A running task has a deadline (calls.py): a dispatcher that dies mid-call gives an
unknown outcome then.  A task still queued `queueTimeout` after its
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

import heapq
import logging
import math
import random
from typing import Any, Callable

from sortedcontainers import SortedDict

from ....protocol.ratelog import RateLog
from ....protocol.schema.tasks import (ADMITTED, AT_LEAST_ONCE, AT_MOST_ONCE, CANCELLED,  # noqa: F401
                                       FAILED, FINISHED, FUNCTION_NAME, INT64, MAX_ATTEMPTS,
                                       MAX_DURATION_MS, MAX_LEVEL, MAX_PAGE, MAX_TIMEOUT_MS,
                                       OPTIONS, QUEUE_TIMEOUT, QUEUED, RUNNING, STATUSES,
                                       SUCCESS, UNIQUE_ID)
from ..shared.journal import (TASK_CALL, TASK_END, TASK_GONE, TASK_NEW, TASK_STATE, Journal,
                              NullJournal)
from ..shared.labels import Labelled
from ..upstreams import NO_LIVE_UPSTREAMS, Unavailable
from . import requests
from .calls import Calls
from .deadlines import Deadlines
from .enqueue import new_task
from .functions import Functions
from .limiter import DURABLE_RATE_S, Limiter  # noqa: F401 (the core's names, as before)
from .lines import Lines
from .options import bad, parse_options  # noqa: F401
from .outcomes import FAIL, FAILED_KINDS, REQUEUE, RETRY, SUCCEED, decide, failed_call
from .room import Room
from .spec import DEFAULTS, PER_UNIT, ApiPolicy, FunctionSpec  # noqa: F401
from .stats import FunctionCounts
from .task import (ABANDONED, CALL_GRACE_S, CLAIM_S, RESTARTED, TASK_ERROR_CHARS,  # noqa: F401
                   TASK_OVERHEAD_BYTES, Outcome, Task, TaskBackoff, TaskError, client_group,
                   held_bytes, move, restored)
from .upstream_calls import UpstreamCalls

PAGE_SCAN = 10_000          # tasks one listing request may look at (see views.page)
#: a function's failed calls are logged at most this often (each line counts those not
#: logged since): a misspelled name under base_url fails every call, and said nothing
FAILED_CALL_LOG_S = 10.0
#: a change the journal had no room for is tried again after this
AGAIN_S = 1.0

log = logging.getLogger("zstalk.tasks")
_NO_SPACE = TaskError("out_of_space", "the binlog's disk is full")


class Tasks:
    def __init__(self, functions: dict[str, FunctionSpec], wall_offset: float = 0.0,
                 rand: Callable[[], float] = random.random,
                 base: FunctionSpec | None = None, started_at: float = -math.inf,
                 upstreams: tuple = ()) -> None:
        self.fns = Functions(functions, base)     # the functions, their specs in use
        self.function = self.fns.function           # name -> its spec (None: no such)
        self.specs = self.fns.specs                 # (the same dict for the store's life)
        self.wall_offset = wall_offset
        self.rand = rand
        self.tasks: dict[str, Task] = {}
        self.by_seq: SortedDict = SortedDict()     # seq -> task: enqueue order (listing)
        self.next_seq = 1               # the enqueue order of the next task
        self.bytes = 0                  # tasks held, with params and results (--max-jobs-bytes)
        self.journal: Journal = NullJournal()     # what is kept of changes (set by the core)
        self.timers = Deadlines("keeping", "timeouts")  # (expires | queue deadline, seq)
        self.inflight = Calls()                 # the calls in flight, their deadlines
        self.upstream = UpstreamCalls(upstreams, started_at=started_at)
        self.limits = Limiter(self.upstream, self.function, started_at)
        self.lines = Lines(self._still_queued)
        self.room = Room()
        # the metrics' counts by function (core/shared/labels.py)
        self.counts: Labelled[FunctionCounts] = Labelled(FunctionCounts)
        self.activity: dict[str, int] = {}          # events per function since last asked
        self.failed_calls = RateLog(log, FAILED_CALL_LOG_S, "failed")   # by function

    def _still_queued(self, seq: int) -> bool:
        task = self.by_seq.get(seq)
        return task is not None and task.status == QUEUED

    def _counted(self, function: str) -> FunctionCounts:
        self.activity[function] = self.activity.get(function, 0) + 1
        return self.counts.of(function)

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
        if upstreams is not None:
            self.upstream.reload(upstreams)
        self.limits.configure()
        for name in list(self.lines.ready):
            self.lines.forget_offer(name)
            self._offer(name, now)

    # -- enqueue -------------------------------------------------------------------------
    def enqueue(self, function: str, params: bytes, options: Any, now: float,
                uid: str | None = None, request: Any = None,
                client_ip: str | None = None, online: bool = False) -> Task | TaskError:
        """A new task, or the error that refused it (then nothing changed).  `uid` is a
        random id the caller made (the core has no randomness of its own for ids).
        `request`: a request task's request object (requests.py), whose body becomes the
        params: unchecked, or as `requests.parse` made it."""
        spec = self.function(function)
        if spec is None:
            return TaskError("unknown_function", f"no function named {function!r}")
        task = new_task(spec, params, options, now, uid, request, client_ip, online,
                        seq=self.next_seq, wall_offset=self.wall_offset, taken=self.tasks,
                        room=self.room, upstream=self.upstream)
        if isinstance(task, TaskError):
            return task
        if not self.journal.room[TASK_NEW](task):
            return _NO_SPACE            # (the record it sized is the one it appends)
        self.next_seq += 1
        self._add(task, spec)
        self._counted(function).enqueued += 1
        if online:
            self.room.join(task, spec, now)
        if task.queue_deadline:
            self.timers.add("timeouts", task.queue_deadline, task.seq)
        self._queue(task, task.due, now)
        self.journal.append[TASK_NEW](task)
        return task

    def _add(self, task: Task, spec: FunctionSpec | None) -> None:
        self.fns.use(task.function, spec)
        self.tasks[task.uid] = task
        self.by_seq[task.seq] = task
        self.bytes += held_bytes(task)

    def _queue(self, task: Task, due: float, now: float, restoring: bool = False) -> None:
        """Queue `task` (due at `due`); one past its queue deadline fails instead (after a
        restart it is queued, and `expire` fails it, logging that)."""
        if task.queue_deadline and now >= task.queue_deadline and not restoring:
            task.error = QUEUE_TIMEOUT          # (a retry after its time ran out)
            self._finish(task, "time out", now)
            return
        move(task, "queue")
        task.due = due
        if self.lines.queue(task, now):         # a new head: take() must see it
            self._offer(task.function, now)

    # -- handing out ---------------------------------------------------------------------
    def _offer(self, name: str, now: float) -> None:
        """Put function `name` where take() will find it: its head among the candidates
        if it may start a call now, or its opening time on the limiter's timer if only
        that holds it back (one at its limits is offered again when a call ends)."""
        head = self.lines.head(name)
        spec = self.specs.get(name)
        if head is None or spec is None:
            return
        opens = self.limits.opens_at(name, spec, now)
        if opens is None:
            return
        if opens > now:
            self.limits.shut(name, opens)
            return
        self.lines.offer(name, head)

    def _top(self, now: float) -> tuple[tuple, str] | None:
        return self.lines.top(lambda name: self.limits.may_start(name, self.specs.get(name), now),
                              lambda name: self._offer(name, now))

    def _open_gates(self, now: float) -> None:
        """Offer again the functions whose gate has opened."""
        for name in self.limits.opened(now):
            self._offer(name, now)

    def take(self, holder, now: float, plain_only: bool = False) -> Task | None:
        """The next task a dispatcher may call: the best due one, by (-level, priority,
        seq), among the functions that may start a call now (below their concurrency,
        their gate open).  `plain_only` (a dispatcher too old for request tasks): among
        the functions whose head is not a request task."""
        self._open_gates(now)       # (an op may come in a turn before its timer fires)
        lines = self.lines
        with lines.passing() as passed:
            while True:
                while (top := self._top(now)) is not None:
                    key, name = top
                    head = lines.by_key[key]
                    if not head.online and (not plain_only or head.request is None):
                        break                   # (online heads are admitted: `admit`)
                    passed.pop()
                else:
                    return None
                task, peer = lines.by_key[key], None
                upstream = self.specs[name].upstream
                if upstream is not None:
                    peer = self.upstream.pick(upstream, task.balance_key, now)
                    if type(peer) is Unavailable:   # held back, or its attempt fails
                        passed.drop()
                        self._unavailable(task, peer, now)
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
        self._start(task, "take", now)
        task.status_code = task.error = None        # (the last attempt's: they no longer apply)
        task.attempt += 1
        self.inflight.start(task, holder, now)
        self.journal.append[TASK_STATE](task)
        self._offer(name, now)                  # its next head, if it may go on
        return task

    def _start(self, task: Task, event: str, now: float) -> None:
        """`task` leaves its line to run or to be admitted: its function's slot, gate and
        counts (the start of a call, one block for both)."""
        name = task.function
        self.lines.started(task)
        self._counted(name).started += 1
        self.limits.started(name, self.specs[name], now)
        move(task, event)
        task.started = now

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
                self.lines.unready(task)
                self.lines.queued.discard(name)
                task.attempt += 1
                task.started = now
                self._apply(task, Outcome("failure", error=NO_LIVE_UPSTREAMS), now)
                self.journal.append[TASK_STATE](task)
                self._offer(name, now)
                return
            why = Unavailable(why.reason, now + AGAIN_S)    # (disk full: look again later)
        self.limits.block(name, math.inf if why.until is None else max(why.until, now + 0.001))
        self._offer(name, now)                  # (arms the timer for a finite wait)

    # -- outcomes ------------------------------------------------------------------------
    def outcome(self, uid: str, attempt: int, result: Outcome, now: float,
                holder=None) -> bool:
        """A dispatcher's report of call `attempt`; False if that call is no longer the
        task's current one (a late report after a timeout gave up on it), or `holder` is
        given and is not the dispatcher the call was handed to."""
        task = self.tasks.get(uid)
        if task is None or task.status != RUNNING or task.attempt != attempt:
            return False
        if holder is not None and task.holder is not holder and task.holder != RESTARTED:
            return False
        peer, task.peer = task.peer, None       # (where the call went: for the log)
        if peer is not None:                    # (its server's accounting: limiter.py)
            for name in self.limits.server_done(*peer, self.function(task.function),
                                                result, now):
                self._offer(name, now)
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
            self._set_result(task, None)
            task.error = "the call succeeded but its result was not kept: the binlog's disk is full"
            self.journal.append[TASK_STATE](task)   # (its room came with the call)
        return True

    def _apply(self, task: Task, result: Outcome, now: float) -> None:
        """Carry out what the outcome does to the task (outcomes.decide)."""
        action = decide(result, task, self.rand)
        if result.kind != "declined":
            task.status_code = result.status_code
            task.error = action.error
        if action.pause:
            self.limits.slow_down(task.function, self.function(task.function), task.started,
                                  result, now)
        if action.do == SUCCEED:
            self._set_result(task, result.result, result.result_headers)
            self._finish(task, "succeed", now)
            self.limits.succeeded(task.function)
        elif action.do == REQUEUE:              # declined, 429: no attempt spent
            task.attempt -= 1
            self._queue(task, now, now)
        elif action.do == RETRY:
            self.counts.of(task.function).retries += 1
            self._queue(task, now + action.wait_ms / 1000, now)
        elif action.do == FAIL:
            self._finish(task, "fail", now)

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
        self.limits.ended(task.function)
        self._offer(task.function, now)         # a free slot: it may start its next call

    def _set_result(self, task: Task, result: bytes | None,
                    headers: dict | None = None) -> None:
        self.bytes -= held_bytes(task)
        task.result, task.result_headers = result, headers
        self.bytes += held_bytes(task)

    def _finish(self, task: Task, event: str, now: float) -> None:
        if task.online and task.status == QUEUED:
            self.room.leave(task)
        if task.queue_deadline:
            self.timers.discard("timeouts", task.queue_deadline, task.seq)
        move(task, event)
        finished = self._counted(task.function).finished
        finished[task.status] = finished.get(task.status, 0) + 1
        task.finished = now
        task.expires = now + task.keep_result_ms / 1000
        self.timers.add("keeping", task.expires, task.seq)

    # -- cancel --------------------------------------------------------------------------
    def cancel(self, uid: str, now: float) -> Task | TaskError:
        task = self.tasks.get(uid)
        if task is None:
            return TaskError("not_found", f"no task {uid!r}")
        if task.status not in (QUEUED, ADMITTED):
            return TaskError("not_cancellable", f"task {uid!r} is {task.status}")
        # (an admission's end was reserved when it was admitted)
        if task.status == QUEUED and not self.journal.room[TASK_STATE](task):
            return _NO_SPACE
        if task.status == ADMITTED:         # (its pass is revoked: the verify check asks)
            self._release(task, now)
        else:
            self._dequeue(task, now)
        self._finish(task, "cancel", now)
        self.journal.append[TASK_STATE](task)
        return task

    def _dequeue(self, task: Task, now: float) -> None:
        """Take a queued task out of its line (cancel, queue timeout, abandoned)."""
        if self.lines.dequeue(task):
            self._offer(task.function, now)

    # -- the waiting room ------------------------------------------------------------------
    def has_online(self) -> bool:
        """Whether any online task waits (feed admits them first)."""
        return bool(self.room.timers.lanes["liveness"])

    def seen(self, task: Task, now: float) -> None:
        """Its user looked at a queued online task (a GET): it keeps its place."""
        if task.online and task.status == QUEUED:
            self.room.seen(task, now)

    def admit(self, now: float) -> int:
        """Admit every online task whose turn has come (the best heads that may start,
        as take() finds them, skipping offline heads a dispatcher will take): each holds
        a slot of its function and a pass until done, cancelled or expired."""
        self._open_gates(now)
        admitted = 0
        with self.lines.passing() as passed:
            while (top := self._top(now)) is not None:
                task = self.lines.by_key[top[0]]
                if not task.online:
                    passed.pop()
                    continue
                if not self.journal.room[TASK_CALL](task):
                    break                   # (the disk is full: it waits, queued)
                passed.drop(keep_offer=True)
                self._admit(task, now)
                admitted += 1
        return admitted

    def _admit(self, task: Task, now: float) -> None:
        self.room.leave(task)
        self._start(task, "admit", now)
        task.attempt += 1
        task.pass_exp = now + self.specs[task.function].pass_ttl_ms / 1000
        self.room.admitted(task)
        self.journal.append[TASK_STATE](task)
        self._offer(task.function, now)

    def done(self, uid: str, now: float) -> Task | TaskError:
        """POST /v1/tasks/{id}/done: an admitted task's user is through; it ends as a
        success and its slot goes to the next in line."""
        task = self.tasks.get(uid)
        if task is None:
            return TaskError("not_found", f"no task {uid!r}")
        if task.status != ADMITTED:
            return TaskError("not_admitted", f"task {uid!r} is {task.status}, not admitted")
        self._release(task, now)            # (its end was reserved when it was admitted)
        task.ended_by = "done"
        self._finish(task, "done", now)
        self.journal.append[TASK_STATE](task)
        return task

    def _release(self, task: Task, now: float) -> None:
        """An admitted task's slot is free (done, its pass expired, cancelled).  How long
        it was held goes into the record a call's end feeds (limits.Recent), so waitTime
        behind a full concurrency knows how fast the slots turn over; a cancel counts too,
        as it frees the slot as early as a done would."""
        self.room.released(task)
        self.limits.ended(task.function)
        if task.started is not None:
            self.limits.recent_of(task.function).ended(now, now - task.started,
                                                       admission=True)
        self._offer(task.function, now)

    def _room_expire(self, now: float) -> None:
        """Passes that expired end their tasks; online tasks nobody looked at within their
        heartbeat are cancelled as abandoned, and everyone behind them moves up."""
        for seq in self.room.expired(now):
            task = self.by_seq[seq]
            self._release(task, now)        # (its end was reserved at admission)
            task.ended_by = "expired"
            self._finish(task, "expire", now)
            self.journal.append[TASK_STATE](task)
        queued = lambda seq: (t if (t := self.by_seq.get(seq)) is not None  # noqa: E731
                              and t.status == QUEUED else None)
        for task in self.room.abandoned(now, queued, self.function):
            if not self.journal.room[TASK_STATE](task):
                self.room.look_again(task, now)
                break
            self._dequeue(task, now)
            task.error = ABANDONED
            self._counted(task.function).abandoned += 1
            self.limits.recent_of(task.function).abandoned(now)
            self._finish(task, "abandon", now)
            self.journal.append[TASK_STATE](task)

    # -- counter clients (fn:NAME, counters.py: the limiter's slots) ----------------------
    def unhold(self, name: str, slots: int, now: float) -> None:
        """A counter client gave `slots` back: a task waiting for one may start now."""
        self.limits.unhold(name, slots)
        self._offer(name, now)

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
        heads = [d for d in (self.timers.next_deadline(), self.inflight.next_deadline(),
                             self.lines.next_deadline(), self.room.next_deadline(),
                             self.limits.next_deadline()) if d is not None]
        return min(heads) if heads else None

    def expire(self, now: float) -> None:
        for seq in self.lines.due(now):
            task = self.by_seq[seq]
            self.lines.queued.delay(task.function, -1)
            if self.lines.make_due(task):
                self._offer(task.function, now)
        self._open_gates(now)
        self._time_out(now)
        self._room_expire(now)
        self.limits.drop_idle(now, lambda name: name in self.specs)
        while (seq := self.inflight.overdue(now)) is not None:     # (outcome ends it)
            task = self.by_seq[seq]
            self.outcome(task.uid, task.attempt,
                         Outcome("unknown", error=Calls.why(task), failure=""), now)
        while self.timers.due("keeping", now):
            _, seq = self.timers.pop("keeping")
            self._forget(self.by_seq.pop(seq), now)

    def _time_out(self, now: float) -> None:
        """Fail the tasks still queued past their queue deadline (never called)."""
        while self.timers.due("timeouts", now):
            _, seq = self.timers.pop("timeouts")
            task = self.by_seq[seq]         # (finished tasks leave `timeouts`: _finish)
            if task.status != QUEUED:
                continue                    # running: a retry would fail instead (_queue)
            if not self.journal.room[TASK_STATE](task):
                task.queue_deadline = now + AGAIN_S     # the binlog's disk is full: again
                self.timers.add("timeouts", task.queue_deadline, seq)
                return
            self._dequeue(task, now)
            task.error = QUEUE_TIMEOUT
            self._finish(task, "time out", now)
            self.journal.append[TASK_STATE](task)

    def _forget(self, task: Task, now: float) -> None:
        """keepResult passed: the task is gone (its uniqueId is free again)."""
        del self.tasks[task.uid]
        name = task.function
        spec = self.specs[name]
        if self.fns.unuse(name):            # its last task: what was kept for it may go
            self.limits.forget(name, spec, now)
        self.bytes -= held_bytes(task)
        self.journal.append[TASK_GONE](task)

    # -- restart -------------------------------------------------------------------------
    def restore(self, images: list, now: float) -> None:
        """The tasks a journal restored (journal.TaskImage each), wall-clock times back to
        our clock, each where its status says (restoring sets it, no move: the journal
        holds what it was)."""
        for image in sorted(images, key=lambda image: image.seq):
            task = restored(image, self.wall_offset, MAX_LEVEL)
            self._add(task, self.function(task.function))
            self._resume(task, image, now)
        if images:
            self.next_seq = max(t.seq for t in self.by_seq.values()) + 1

    def _resume(self, task: Task, image, now: float) -> None:
        """A restored task back in the state its status says.  A call running when the
        broker stopped waits CLAIM_S for its dispatcher to claim it, then ends with an
        unknown outcome; an admitted task's pass holds its slot until it expires."""
        status, seq, function = image.status, task.seq, task.function
        if task.queue_deadline and status in (QUEUED, RUNNING):
            self.timers.add("timeouts", task.queue_deadline, seq)
        if status == QUEUED:
            self._queue(task, image.due - self.wall_offset, now, restoring=True)
            if task.online:             # (last seen: the restart)
                task.last_seen = now
                self.room.join(task, self.specs.get(function), now)
        elif status in (ADMITTED, RUNNING):
            task.status = status
            self.limits.running[function] = self.limits.running.get(function, 0) + 1
            if status == ADMITTED:
                if not task.pass_exp:       # (a TASK_STATE logged the admission: from then)
                    task.pass_exp = (task.started or now) + (
                        self.specs.get(function) or DEFAULTS).pass_ttl_ms / 1000
                self.room.admitted(task)
            else:
                self.inflight.restarted(task, now)
        else:
            task.status, task.expires = status, image.expires - self.wall_offset
            self.timers.add("keeping", task.expires, seq)

    def claim(self, uid: str, attempt: int, holder, now: float) -> bool:
        """A re-registered dispatcher says it is making call `attempt` of task `uid`, or
        has its report: the call is its own again (calls.py).  False if we restarted
        without that call."""
        task = self.tasks.get(uid)
        return (task is not None and task.status == RUNNING and task.attempt == attempt
                and self.inflight.claim(task, holder, now))
