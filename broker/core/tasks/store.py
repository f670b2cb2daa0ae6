"""Cloud tasks: function calls queued in the broker and made over HTTP by dispatchers.

Pure, like the rest of the core: every method that depends on time takes `now`
(monotonic seconds); wall-clock values (createdAt, the default priority) are
`now + wall_offset`.  The HTTP front turns requests into calls of this store and its
answers into JSON; dispatchers are handed tasks with `take` and report each call with
`outcome`.  Nothing here knows HTTP or sockets.

A task's life (the statuses of LeanCloud's Cloud Queue):

    enqueue --> queued --take--> running --2xx--> success
                  ^  |              |---- failed call, retries left ----> queued (retryAt)
     cancelled <--'  |              |---- failed call, none left -------> failed
                     |              '---- outcome unknown, atMostOnce ---> failed
                     '-- delay / backoff: queued but not due yet
    success, failed, cancelled --keepResult--> forgotten (the uniqueId is free again)

    an online task (the waiting room): queued --its turn--> admitted --done, or its pass
    expires--> success; queued or admitted --cancel--> cancelled; queued, nobody looking
    --online_heartbeat--> cancelled (abandoned)

A "fatal" outcome (the call ran but its result cannot be kept: over the size limit)
fails the task at once, since calling again would run the function again.  A "declined"
one (a stopping dispatcher did not make the call) puts the task back as it was, due at
once, without using an attempt.

`attempts` counts *retries* (the Cloud Queue's 最大重试次数): with the default 1 a failing
task is called twice.  An outcome is "unknown" when the request may have reached the
function (a timeout after sending, a connection lost mid-call, a dispatcher that
vanished): `atLeastOnce` (the default) retries it, `atMostOnce` fails the task saying so.

Queues: per function, due tasks in `(-level, priority, seq)` order (level 0-9, higher
first; seq is the enqueue order, so equal priorities run first come, first served);
`waitNum` is a task's rank there, and `waitTime` the time it should wait to start
(views.py, which also makes the API's TaskInfo and function stats).  Tasks not due
yet (delay, backoff) wait in a timer list.  Running tasks count against their
function's `concurrency`, which holds across every dispatcher because only the broker
hands tasks out.  A running task also has a deadline (its
timeout plus CALL_GRACE_S): a dispatcher that dies mid-call gives an unknown outcome then.

Limits (limits.py): a function may have a rate (GCRA, `rate` and `burst`) and be paused
by a server that answered 429 or 503.  A function over its rate or paused keeps its
tasks in their places: none is taken out, put back or rescheduled, and no attempt is
spent; its gate says when it opens and the store's timer fires then.  `take` hands out
the best head among the functions that may start a call now, from a heap of candidate
heads (`heads`, lazily cleaned: an entry is good while it is still its function's head
and the function may start), so a hand-out does not cost O(functions); a function is
offered to that heap whenever its head or what holds it back changes (`_offer`).

A 429 puts the task back in its place without spending an attempt and pauses the
function (its Retry-After, else an exponential backoff); a 503 pauses it too, but spends
the attempt as any failure does, so a server answering 503 forever cannot hold tasks
forever.  A task still queued `queueTimeout` after its createdAt fails ("queue timeout")
and is never called.

Every call that did not succeed (a failure, fatal or unknown outcome, also one the broker
decides: no report in time, a dispatcher gone) is logged with its function, URL, status or
error and the task's fate, at most once per FAILED_CALL_LOG_S per function with the count
since (protocol/ratelog.py): only the broker knows a call's function, and it sees every
dispatcher's outcomes, so the limit holds across them.

Errors are data: `TaskError(code, message)`, a stable name and a sentence for people;
nothing is changed when an error is returned.  The HTTP front maps each code to its
status in one table (protocol/fronts/http/front.py, STATUS).

Durability: every change is appended to the journal as it is made (broker/core/shared/journal.py),
its room asked for before (enqueue and cancel answer 503 when the disk is full; a task
is not handed out then).  `restore` rebuilds the tasks a journal restored.  A call that
was running when the broker stopped may still be running: its dispatcher, re-registering
within CLAIM_S, claims it (`claim`) and reports as usual; an unclaimed one has an unknown
outcome then, decided by its deliveryMode.
"""
from __future__ import annotations

import heapq
import ipaddress
import logging
import math
import random
from typing import Any, Callable, NamedTuple

from sortedcontainers import SortedDict, SortedList

from ....protocol.ratelog import RateLog
from ....protocol.schema.tasks import (ADMITTED, AT_LEAST_ONCE, AT_MOST_ONCE, CANCELLED, FAILED,
                                       FINISHED, FUNCTION_NAME, INT64, MAX_ATTEMPTS,
                                       MAX_DURATION_MS, MAX_LEVEL, MAX_PAGE, MAX_TIMEOUT_MS,
                                       OPTIONS, QUEUE_TIMEOUT, QUEUED, RUNNING, STATUSES,
                                       SUCCESS, UNIQUE_ID)
from ..shared.journal import (TASK_CALL, TASK_END, TASK_GONE, TASK_NEW, TASK_STATE, Journal,
                              NullJournal)
from ..shared.labels import Labelled
from . import requests
from .limits import Gate, Recent
from .requests import Request
from .upstream_calls import UpstreamCalls, failed as server_failed
from ..upstreams import NO_LIVE_UPSTREAMS, Unavailable
from .stats import FunctionCounts, Queued


ABANDONED = "abandoned"     # the error of an online task not looked at within its heartbeat

#: how long past its timeout a running task waits for its dispatcher's report
CALL_GRACE_S = 5.0
#: after a restart, how long a call that was running waits for its dispatcher to claim it
#: (dispatchers notice a restarted broker within a heartbeat timeout, 2 s, and re-register)
CLAIM_S = 5.0
#: the holder of a call the broker was running when it stopped, until it is claimed
RESTARTED = "restarted"
PAGE_SCAN = 10_000          # tasks one listing request may look at (see views.page)
#: what one task costs beyond its params and result, for --max-jobs-bytes (the object,
#: its id, its places in the index and the timer lists)
TASK_OVERHEAD_BYTES = 512
TASK_ERROR_CHARS = 1000      # a task's error text is cut to this (it travels and is logged)
PER_UNIT = {1.0: "s", 60.0: "m", 3600.0: "h"}
#: a rate this slow or slower (its T, seconds) keeps its TAT across a restart (binlog.py)
DURABLE_RATE_S = 1.0
#: a function's failed calls are logged at most this often (each line counts those not
#: logged since): a misspelled name under base_url fails every call, and said nothing
FAILED_CALL_LOG_S = 10.0
#: the outcomes of a call that did not succeed ("declined": it was never made)
FAILED_KINDS = frozenset({"failure", "unknown", "fatal"})

log = logging.getLogger("zstalk.tasks")


class TaskError(NamedTuple):
    code: str           # a stable machine-readable name (http_front.STATUS gives its status)
    message: str


class FunctionSpec(NamedTuple):
    """A function tasks may call (from the config file)."""
    name: str
    url: str
    concurrency: int = 1
    timeout_ms: int = 15000
    max_timeout_ms: int = MAX_TIMEOUT_MS
    rate: int = 0                   # calls per `per_s` seconds (0: no rate)
    per_s: float = 1.0
    burst: int = 0
    queue_timeout_ms: int = 0       # 0: none
    max_pause_ms: int = 60000
    request_headers: tuple[str, ...] = ()   # request tasks may set these too (requests.py)
    result_headers: tuple[str, ...] = ()    # response headers a task keeps (resultHeaders)
    # the waiting room (online tasks, Tasks.admit): who may enqueue them ("public",
    # "master" or "only": online tasks only, public), how long a pass lasts, how often a waiting
    # user must look, how many may wait per client address
    online: str = "master"
    pass_ttl_ms: int = 300_000
    heartbeat_ms: int = 300_000
    max_waiting_per_client: int = 20
    admit_url: str = ""
    upstream: str | None = None     # its calls go to a server of this upstream (url unused)
    path: str = ""                  # ... at this path
    next_upstream: frozenset = frozenset({"error", "timeout"})  # what fails a server
    connect_timeout_ms: int = 5000
    # origins ("https://shop.example", or "*") whose pages may enqueue, read and end its
    # tasks from the browser (CORS, protocol/fronts/http/cors.py); () none, as before
    allow_origins: tuple[str, ...] = ()

    @property
    def interval(self) -> float:
        """GCRA's T: seconds between calls at the rate (0: no rate)."""
        return self.per_s / self.rate if self.rate else 0.0


class ApiPolicy(NamedTuple):
    """What a request without the master key may do (the config's [api] table)."""
    public_enqueue: bool = False    # enqueue, without options (the Cloud Queue's client enqueue)
    private_results: bool = False   # False: a task's id is enough to read it
    trust_forwarded: bool = False   # clientIp: the first X-Forwarded-For hop, not the peer


class TaskBackoff(NamedTuple):
    kind: str = "fixed"         # "fixed" | "exponential"
    delay_ms: int = 60000
    max_delay_ms: int = MAX_DURATION_MS
    jitter: bool = False

    def wait_ms(self, retry: int, rand: Callable[[], float]) -> int:
        """Before retry number `retry` (1 for the first)."""
        wait = self.delay_ms if self.kind == "fixed" else self.delay_ms * 2 ** (retry - 1)
        wait = min(wait, self.max_delay_ms)
        return int(wait * rand()) if self.jitter else int(wait)    # "full jitter"


class Task:
    __slots__ = ("uid", "function", "params", "priority", "seq", "status", "attempt",
                 "attempts", "backoff", "timeout_ms", "delivery", "keep_result_ms",
                 "created", "started", "finished", "due", "deadline", "expires",
                 "status_code", "result", "error", "holder", "seg", "logged", "level",
                 "queue_deadline", "key", "extra", "request", "result_headers", "peer",
                 "balance_key", "client_ip", "online", "last_seen", "pass_exp", "ended_by")

    def __init__(self, uid: str, function: str, params: bytes, priority: int, seq: int,
                 now: float) -> None:
        self.uid = uid
        self.function = function
        self.params = params            # the JSON body to POST, as received
        self.priority = priority
        self.seq = seq
        self.level = 0                  # 0-9, higher first
        self.key = (0, priority, seq)   # its place in its function's queue (`place`)
        self.queue_deadline = 0.0       # fails if still queued then (0: no queueTimeout)
        self.request: Request | None = None     # a request task's method, path, ... (params: body)
        self.result_headers: dict | None = None
        self.peer = None                # running on an upstream: the server it was given
        self.balance_key: str | None = None     # what its calls are hashed by (upstreams)
        self.client_ip: str | None = None       # who enqueued it (ip_hash, clientIp)
        self.online = False             # a waiting-room task: admitted, never called
        self.last_seen = 0.0            # online, queued: when its user last looked
        self.pass_exp = 0.0             # admitted: when its pass expires
        self.ended_by: str | None = None    # an admitted task's end: "done" or "expired"
        self.status = QUEUED
        self.attempt = 0                # calls made so far
        self.attempts = 1               # retries allowed after the first call
        self.backoff = TaskBackoff()
        self.timeout_ms = 15000
        self.delivery = AT_LEAST_ONCE
        self.keep_result_ms = 300000
        self.created = now
        self.started: float | None = None
        self.finished: float | None = None
        self.due = now                  # queued: when it may run (delay, backoff)
        self.deadline = 0.0             # running: when its dispatcher is given up on
        self.expires = 0.0              # finished: when it is forgotten
        self.status_code: int | None = None
        self.result: bytes | None = None    # the function's response body
        self.error: str | None = None
        self.holder = None              # the dispatcher session running it

    def place(self, level: int, priority: int) -> None:
        self.level, self.priority = level, priority
        self.key = (-level, priority, self.seq)


#: status codes that say "slow down": the function pauses (see the module's comment)
SLOW_DOWN = frozenset({429, 503})


class Outcome(NamedTuple):
    """What a dispatcher reports for one call."""
    kind: str                   # "success" | "failure" | "unknown" | "fatal" | "declined"
    status_code: int | None = None
    result: bytes | None = None
    error: str | None = None
    retry_after_ms: int = -1    # a 429 / 503's Retry-After, ms (-1: none was sent)
    result_headers: dict | None = None  # a success's kept response headers (resultHeaders)
    # how the call failed, as the dispatcher says: "error" (no connection, or it broke),
    # "timeout"; None: not said (an older dispatcher: judged by kind and status); "": the
    # broker's own verdict (a dispatcher gone, no report in time): not the server's fault
    failure: str | None = None


class Tasks:
    def __init__(self, functions: dict[str, FunctionSpec], wall_offset: float = 0.0,
                 rand: Callable[[], float] = random.random,
                 base: FunctionSpec | None = None, started_at: float = -math.inf,
                 upstreams: tuple = ()) -> None:
        self.functions = dict(functions)
        # when the broker started: a gate gets no burst credit for the time before it, so
        # a crash loop cannot exceed a rate (limits.py)
        self.started_at = started_at
        self.gates_changed = False      # a slow rate's TAT moved since durable_gates()
        # functions on an upstream (upstream_calls.py): its servers' shared state, and the
        # functions held back because no server is usable: until when (inf: until a call
        # on that upstream ends)
        self.upstream = UpstreamCalls(upstreams, started_at=started_at)
        # the waiting room: admitted tasks by pass expiry, queued online tasks by when they
        # are next checked for liveness, and the online tasks waiting per (function, client)
        self.passes = SortedList()      # (pass expires, seq)
        self.liveness = SortedList()    # (look again at, seq)
        self.waiting_by: dict[tuple[str, str], int] = {}
        self.room: dict[str, list[int]] = {}    # function -> [online waiting, admitted]
        self.blocked: dict[str, float] = {}
        self.base = base        # any other name F is called at base.url/F (config base_url)
        self.wall_offset = wall_offset
        self.rand = rand
        self.tasks: dict[str, Task] = {}
        self.ready: dict[str, SortedList] = {}      # function -> due queued task keys
        self.by_key: dict[tuple, Task] = {}
        # function -> its calls in flight; with `held`, the slots counter clients hold
        # (fn:NAME), what counts against its concurrency (`in_use`); later issues add
        # calls being moved to another server and admitted online tasks
        self.running: dict[str, int] = {}
        self.held: dict[str, int] = {}
        self.peaks: dict[str, int] = {}     # most in use since the counters' interval began
        # limits (limits.py): each function's gate, and the candidates take() looks at
        self.gates: dict[str, Gate] = {}
        self.recent: dict[str, Recent] = {}
        self.heads: list[tuple[tuple, str]] = []    # heap of (head key, function)
        self.offered: dict[str, tuple] = {}         # function -> the key it has in heads
        self.shut: list[tuple[float, str]] = []     # heap of (opens at, function)
        self.shut_at: dict[str, float] = {}         # function -> its entry in `shut`
        self.timeouts = SortedList()    # (queue deadline, seq) of queued or running tasks
        self.idle_gates: list[tuple[float, str]] = []   # heap of (drop at, function)
        # function -> its spec while tasks use it; None: gone from the config (its tasks
        # wait, not called, until it comes back or they are cancelled)
        self.specs: dict[str, FunctionSpec | None] = {}
        self.uses: dict[str, int] = {}              # function -> tasks held
        self.waiting = SortedList()     # (due, seq) of queued tasks not due yet
        self.calls = SortedList()       # (deadline, seq) of running tasks
        self.keeping = SortedList()     # (expires, seq) of finished tasks
        self.by_seq: SortedDict = SortedDict()     # seq -> task: enqueue order (listing)
        self.next_seq = 1               # the enqueue order of the next task
        self.bytes = 0                  # tasks held, with params and results (--max-jobs-bytes)
        self.journal: Journal = NullJournal()     # what is kept of changes (set by the core)
        # the metrics' counts by function (core/labels.py), and the queued tasks by function
        self.counts: Labelled[FunctionCounts] = Labelled(FunctionCounts)
        self.queued = Queued(self._still_queued)
        self.activity: dict[str, int] = {}          # events per function since last asked
        self.failed_calls = RateLog(log, FAILED_CALL_LOG_S, "failed")   # by function

    def _still_queued(self, seq: int) -> bool:
        task = self.by_seq.get(seq)
        return task is not None and task.status == QUEUED

    def _counted(self, function: str) -> FunctionCounts:
        self.activity[function] = self.activity.get(function, 0) + 1
        return self.counts.of(function)

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
        if request is not None:
            checked = request if isinstance(request, tuple) else requests.parse(
                request, spec.request_headers)      # (a tuple: checked by the caller)
            if isinstance(checked, str):
                return _bad(checked)
            request, params = checked
        parsed = parse_options(options, spec)
        if isinstance(parsed, TaskError):
            return parsed
        refused = self._room_refusal(spec, parsed, online, client_ip)
        if refused is not None:
            return refused
        uid = parsed.get("uniqueId", uid)
        if uid is None:
            return TaskError("bad_request", "a uniqueId is needed")
        if uid in self.tasks:
            return TaskError("duplicate", f"a task with uniqueId {uid!r} exists")
        priority = parsed.get("priority", int((now + self.wall_offset) * 1000))
        queue_timeout_ms = parsed.get("queueTimeout", spec.queue_timeout_ms)
        if queue_timeout_ms and parsed.get("delay", 0) >= queue_timeout_ms:
            return _bad(f"delay ({parsed['delay']} ms) must be below queueTimeout "
                        f"({queue_timeout_ms} ms): the task would time out before it ran")
        task = Task(uid, function, params, priority, self.next_seq, now)
        task.request = request
        task.client_ip = client_ip
        if online:
            task.online, task.last_seen = True, now
        if spec.upstream in self.upstream.keyed:
            task.balance_key = self.upstream.balance_key(spec.upstream, uid, params, client_ip)
        task.place(parsed.get("level", 0), priority)
        if queue_timeout_ms:
            task.queue_deadline = now + queue_timeout_ms / 1000
        task.attempts = parsed.get("attempts", 1)
        task.backoff = parsed.get("backoff", TaskBackoff())
        task.timeout_ms = parsed.get("timeout", spec.timeout_ms)
        task.delivery = parsed.get("deliveryMode", AT_LEAST_ONCE)
        task.keep_result_ms = parsed.get("keepResult", 300000)
        task.due = now + parsed.get("delay", 0) / 1000
        if not self.journal.room[TASK_NEW](task):
            return _NO_SPACE            # (the record it sized is the one log_task writes)
        self.next_seq += 1
        self._add(task, spec)
        self._counted(function).enqueued += 1
        if online:
            self._join_line(task, spec, now)
        if task.queue_deadline:
            self.timeouts.add((task.queue_deadline, task.seq))
        self._queue(task, task.due, now)
        self.journal.append[TASK_NEW](task)
        return task

    def _add(self, task: Task, spec: FunctionSpec | None) -> None:
        self.specs[task.function] = spec
        self.uses[task.function] = self.uses.get(task.function, 0) + 1
        self.tasks[task.uid] = task
        self.by_seq[task.seq] = task
        self.bytes += held_bytes(task)

    def function(self, name: str) -> FunctionSpec | None:
        """The function `name`: configured by name, or under the base URL (made when
        asked for, and kept in `specs` while tasks use the name: made per lookup, a base
        URL's spec took an eighth of the broker's CPU per enqueue)."""
        spec = self.functions.get(name)
        if spec is None and self.base is not None:
            spec = self.specs.get(name) or self._made(name)
        return spec

    def _made(self, name: str) -> FunctionSpec | None:
        spec = self.functions.get(name)
        if spec is None and self.base is not None and FUNCTION_NAME.fullmatch(name):
            spec = (self.base._replace(name=name, path=f"/{name}") if self.base.upstream
                    else self.base._replace(name=name, url=f"{self.base.url.rstrip('/')}/{name}"))
        return spec

    def configure(self, functions: dict[str, FunctionSpec], base: FunctionSpec | None,
                  now: float, upstreams: tuple | None = None) -> None:
        """A new config (SIGHUP): every function tasks use takes its new spec, or None; a
        gate keeps its TAT, and a new rate applies from the next start; a server keeps its
        state while its upstream lists its url as written."""
        self.functions, self.base = dict(functions), base
        if upstreams is not None:
            self.upstream.reload(upstreams)
        self.blocked.clear()
        for name in self.specs:
            self.specs[name] = self._made(name)
        for name, gate in self.gates.items():
            spec = self.function(name)
            if spec is not None:
                gate.configure(spec.interval, spec.burst)
        for name in list(self.ready):
            self.offered.pop(name, None)
            self._offer(name, now)

    def _queue(self, task: Task, due: float, now: float, restoring: bool = False) -> None:
        """Queue `task` (due at `due`); one past its queue deadline fails instead (after a
        restart it is queued, and `expire` fails it, logging that)."""
        if task.queue_deadline and now >= task.queue_deadline and not restoring:
            task.error = QUEUE_TIMEOUT          # (a retry after its time ran out)
            self._finish(task, FAILED, now)
            return
        task.status = QUEUED
        task.due = due
        self.queued.add(task.function, task.seq)
        if due > now:
            self.queued.delay(task.function, 1)
            self.waiting.add((due, task.seq))
        else:
            self._make_due(task, now)

    def _make_due(self, task: Task, now: float) -> None:
        ready = self.ready.get(task.function)
        if ready is None:
            ready = self.ready[task.function] = SortedList()
        ready.add(task.key)
        self.by_key[task.key] = task
        if ready[0] == task.key:                # a new head: take() must see it
            self._offer(task.function, now)

    # -- limits --------------------------------------------------------------------------
    def gate(self, name: str, now: float) -> Gate:
        gate = self.gates.get(name)
        if gate is None:
            spec = self.function(name)
            interval, burst = (spec.interval, spec.burst) if spec else (0.0, 0)
            gate = self.gates[name] = Gate(interval, burst, now,
                                           tat=self.started_at + interval * burst)
        return gate

    def restore_gates(self, saved: dict[str, float], now: float) -> None:
        """The slow rates' TATs a binlog kept (function -> wall-clock seconds), before
        `restore`: each function still rated gets its gate from there, so a restart
        gives no call its rate would not (a gate no task uses is dropped once it has
        nothing to hold back, as in `expire`)."""
        for name, tat in saved.items():
            spec = self.function(name)
            if spec is None or not spec.rate:
                continue
            gate = self.gate(name, now)
            most = now + spec.interval * (spec.burst + 1)   # the furthest GCRA can set it
            gate.tat = max(gate.tat, min(tat - self.wall_offset, most))
            heapq.heappush(self.idle_gates, (gate.holds_until(spec.max_pause_ms / 1000), name))

    def durable_gates(self, now: float) -> dict[str, float]:
        """What the binlog keeps of the gates (`restore_gates`): each slow rate's TAT
        (T >= DURABLE_RATE_S) still ahead of now, as wall-clock seconds."""
        self.gates_changed = False
        wall = self.wall_offset
        return {name: gate.tat + wall for name, gate in self.gates.items()
                if gate.interval >= DURABLE_RATE_S and gate.tat > now}

    def _offer(self, name: str, now: float) -> None:
        """Put function `name` where take() will find it: its head in `heads` if it may
        start a call now, or its opening time in `shut` if only its gate holds it back
        (a function at its concurrency is offered again when a call ends)."""
        ready = self.ready.get(name)
        spec = self.specs.get(name)
        if not ready or spec is None or self.in_use(name) >= spec.concurrency:
            return
        gate = self.gates.get(name)
        opens = gate.opens_at() if gate is not None else 0.0
        if spec.upstream is not None and spec.upstream in self.upstream.limited:
            if self.upstream.full(spec.upstream):       # its upstream's own limits
                self.upstream.waiting.setdefault(spec.upstream, set()).add(name)
                return                          # (offered again when a call there ends)
            opens = max(opens, self.upstream.opens_at(spec.upstream, now))
        if self.blocked:                        # no server of its upstream is usable
            blocked = self.blocked.get(name, 0.0)
            if blocked > now:
                if blocked == math.inf:
                    return                      # (offered again when a call there ends)
                opens = max(opens, blocked)
            else:
                self.blocked.pop(name, None)
        if opens > now:
            if self.shut_at.get(name, math.inf) > opens:
                self.shut_at[name] = opens
                heapq.heappush(self.shut, (opens, name))
            return
        head = ready[0]
        if self.offered.get(name) != head:
            self.offered[name] = head
            heapq.heappush(self.heads, (head, name))

    def _top(self, now: float) -> tuple[tuple, str] | None:
        """The best head in `heads` that is still its function's offered head and may
        start now, stale entries dropped on the way (their functions offered again: their
        real head, or their opening time); None when none is left."""
        heads, offered = self.heads, self.offered
        while heads:
            key, name = heads[0]
            ready = self.ready.get(name)
            if offered.get(name) == key and ready and ready[0] == key and (
                    self._may_start(name, now)):
                return key, name
            heapq.heappop(heads)
            if offered.get(name) == key:
                del offered[name]
                self._offer(name, now)
        return None

    def _may_start(self, name: str, now: float) -> bool:
        spec = self.specs.get(name)
        if spec is None or self.in_use(name) >= spec.concurrency:
            return False
        if spec.upstream is not None and spec.upstream in self.upstream.limited and (
                self.upstream.full(spec.upstream)
                or self.upstream.opens_at(spec.upstream, now) > now):
            return False
        gate = self.gates.get(name)
        return gate is None or gate.opens_at() <= now

    # -- concurrency -----------------------------------------------------------------------
    def in_use(self, name: str) -> int:
        """What counts against a function's concurrency: its calls in flight and the
        slots counter clients hold (fn:NAME, counters.py)."""
        used = self.running.get(name, 0)
        return used + self.held.get(name, 0) if self.held else used

    def hold(self, name: str, slots: int) -> bool:
        """A counter client takes `slots` of function `name` (Acquire on fn:NAME): all of
        them if its concurrency has room, else none (nothing waits)."""
        spec = self.function(name)
        if spec is None or self.in_use(name) + slots > spec.concurrency:
            return False
        self.rehold(name, slots)
        return True

    def rehold(self, name: str, slots: int) -> None:
        """Slots a counter client holds, unchecked (its front re-registered them)."""
        self.held[name] = self.held.get(name, 0) + slots
        self._peak(name)

    def unhold(self, name: str, slots: int, now: float) -> None:
        """A counter client gave `slots` back (Release, or its connection closed): a task
        waiting for one may start now."""
        left = self.held.get(name, 0) - slots
        if left > 0:
            self.held[name] = left
        else:
            self.held.pop(name, None)
        self._offer(name, now)

    def _peak(self, name: str) -> None:
        used = self.in_use(name)
        if used > self.peaks.get(name, 0):
            self.peaks[name] = used

    # -- the waiting room: online tasks ------------------------------------------------
    def _room_refusal(self, spec: FunctionSpec, options: dict, online: bool,
                      client_ip: str | None) -> TaskError | None:
        if not online:
            return _bad(f"{spec.name!r} takes online tasks only (\"type\": \"online\")") \
                if spec.online == "only" else None
        if "uniqueId" in options:
            return _bad("an online task gets a server-made uniqueId (its id is its user's "
                        "key to it): give none")
        group = client_group(client_ip)
        if group is not None and self.waiting_by.get((spec.name, group), 0) >= (
                spec.max_waiting_per_client):
            return TaskError("too_many_waiting", f"at most {spec.max_waiting_per_client} "
                             f"online tasks of {spec.name!r} may wait per client address")
        return None

    def _room_count(self, name: str, which: int, change: int) -> None:
        counts = self.room.setdefault(name, [0, 0])
        counts[which] += change
        if counts == [0, 0]:
            del self.room[name]

    def _join_line(self, task: Task, spec: FunctionSpec | None, now: float) -> None:
        self._room_count(task.function, 0, 1)
        heartbeat_ms = spec.heartbeat_ms if spec is not None else FunctionSpec.heartbeat_ms
        self.liveness.add((now + heartbeat_ms / 1000, task.seq))
        group = client_group(task.client_ip)
        if group is not None:
            self.waiting_by[task.function, group] = self.waiting_by.get(
                (task.function, group), 0) + 1

    def _leave_line(self, task: Task) -> None:
        self._room_count(task.function, 0, -1)
        group = client_group(task.client_ip)
        key = (task.function, group)
        if group is not None and key in self.waiting_by:
            self.waiting_by[key] -= 1
            if not self.waiting_by[key]:
                del self.waiting_by[key]

    def seen(self, task: Task, now: float) -> None:
        """Its user looked at a queued online task (a GET): it keeps its place."""
        if task.online and task.status == QUEUED:
            task.last_seen = now

    def admit(self, now: float) -> int:
        """Admit every online task whose turn has come (the best heads that may start,
        as take() finds them, skipping offline heads a dispatcher will take): each holds
        a slot of its function and a pass until done, cancelled or expired."""
        self._open_gates(now)
        heads, offered, passed, admitted = self.heads, self.offered, [], 0
        try:
            while (top := self._top(now)) is not None:
                key, name = top
                task = self.by_key[key]
                if not task.online:
                    passed.append(heapq.heappop(heads))
                    continue
                if not self.journal.room[TASK_CALL](task):
                    break                   # (the disk is full: it waits, queued)
                heapq.heappop(heads)
                del offered[name]
                self._admit(task, now)
                admitted += 1
        finally:
            for entry in passed:
                heapq.heappush(heads, entry)
        return admitted

    def _admit(self, task: Task, now: float) -> None:
        name, spec = task.function, self.specs[task.function]
        del self.by_key[task.key]
        self._unready(task)
        self.queued.discard(name)
        self._leave_line(task)
        self._counted(name).started += 1
        if name in self.gates or spec.rate:
            gate = self.gate(name, now)
            gate.start(now)
            if gate.interval >= DURABLE_RATE_S:
                self.gates_changed = True
        self._recent(name).started(now)
        task.status, task.attempt, task.started = ADMITTED, task.attempt + 1, now
        task.pass_exp = now + spec.pass_ttl_ms / 1000
        self.passes.add((task.pass_exp, task.seq))
        self._room_count(name, 1, 1)
        self.running[name] = self.running.get(name, 0) + 1
        self._peak(name)
        self.journal.append[TASK_STATE](task)
        self._offer(name, now)

    def done(self, uid: str, now: float) -> Task | TaskError:
        """POST /v1/tasks/{id}/done: an admitted task's user is through; it ends as a
        success and its slot goes to the next in line."""
        task = self.tasks.get(uid)
        if task is None:
            return TaskError("not_found", f"no task {uid!r}")
        if task.status != ADMITTED:
            return TaskError("not_admitted", f"task {uid!r} is {task.status}, not admitted")
        self._end_admission(task, now)      # (its end was reserved when it was admitted)
        task.ended_by = "done"
        self._finish(task, SUCCESS, now)
        self.journal.append[TASK_STATE](task)
        return task

    def _end_admission(self, task: Task, now: float) -> None:
        """An admitted task's slot is free (done, its pass expired, cancelled).  How long
        it was held goes into the record a call's end feeds (limits.Recent), so waitTime
        behind a full concurrency knows how fast the slots turn over; a cancel counts too,
        as it frees the slot as early as a done would."""
        self.passes.discard((task.pass_exp, task.seq))
        self._room_count(task.function, 1, -1)
        self.running[task.function] -= 1
        if not self.running[task.function]:
            del self.running[task.function]
        if task.started is not None:
            self._recent(task.function).ended(now, now - task.started, admission=True)
        self._offer(task.function, now)

    def _room_expire(self, now: float) -> None:
        """Passes that expired end their tasks; online tasks nobody looked at within their
        heartbeat are cancelled as abandoned, and everyone behind them moves up."""
        while self.passes and self.passes[0][0] <= now:
            task = self.by_seq[self.passes[0][1]]
            self._end_admission(task, now)      # (its end was reserved at admission)
            task.ended_by = "expired"
            self._finish(task, SUCCESS, now)
            self.journal.append[TASK_STATE](task)
        while self.liveness and self.liveness[0][0] <= now:
            _, seq = self.liveness.pop(0)
            task = self.by_seq.get(seq)
            if task is None or task.status != QUEUED:
                continue
            spec = self.function(task.function)
            heartbeat = (spec.heartbeat_ms if spec else 300_000) / 1000
            if task.last_seen + heartbeat > now:        # looked at since: check again then
                self.liveness.add((task.last_seen + heartbeat, seq))
                continue
            if not self.journal.room[TASK_STATE](task):
                self.liveness.add((now + 1.0, seq))
                break
            self._dequeue(task, now)
            task.error = ABANDONED
            self._counted(task.function).abandoned += 1
            self._recent(task.function).abandoned(now)
            self._finish(task, CANCELLED, now)
            self.journal.append[TASK_STATE](task)

    # -- upstreams -------------------------------------------------------------------------
    def _unavailable(self, task: Task, why: Unavailable, now: float) -> None:
        """No server of its upstream for `task`, the head of its function: every one down
        fails this attempt; otherwise the function waits, its tasks in their places."""
        name = task.function
        if why.reason == NO_LIVE_UPSTREAMS:
            if self.journal.room[TASK_STATE](task):
                del self.by_key[task.key]
                self._unready(task)
                self.queued.discard(name)
                task.attempt += 1
                task.started = now
                self._apply(task, Outcome("failure", error=NO_LIVE_UPSTREAMS), now)
                self.journal.append[TASK_STATE](task)
                self._offer(name, now)
                return
            why = Unavailable(why.reason, now + 1.0)    # (disk full: look again later)
        until = math.inf if why.until is None else max(why.until, now + 0.001)
        self.blocked[name] = until
        self._offer(name, now)                  # (arms the timer for a finite wait)

    def _server_done(self, task: Task, result: Outcome, now: float) -> None:
        """nginx's accounting for the server `task` ran on; a 429 / 503 with Retry-After
        pauses that server (not the function); the functions waiting for a server of
        this upstream may look again."""
        (upstream, peer), task.peer = task.peer, None      # (where it went, whatever since)
        counted = False
        if result.kind != "success" and result.failure != "":
            spec = self.function(task.function)
            counted = spec is not None and server_failed(
                spec.next_upstream, result.kind, result.status_code)
        if result.status_code in SLOW_DOWN and result.retry_after_ms >= 0:
            self.upstream.pause(upstream, peer, now + result.retry_after_ms / 1000)
        again = self.upstream.done(upstream, peer, counted,
                                   result.error if counted else None, now)
        if self.blocked:
            again = {*again, *(n for n in self.blocked
                               if getattr(self.function(n), "upstream", None) == upstream)}
        for name in again:
            self.blocked.pop(name, None)
            self._offer(name, now)

    def call_url(self, task: Task, spec: FunctionSpec) -> str:
        """Where a call of running `task` goes: its function's url or its server's and
        the function's path; then a request task's path and query."""
        return self._url(task, spec, task.peer)

    @staticmethod
    def _url(task: Task, spec: FunctionSpec, peer) -> str:
        base = spec.url if peer is None else peer[1].url + spec.path
        return base if task.request is None else requests.url(base, task.request)

    # -- looking -------------------------------------------------------------------------
    def wait_num(self, task: Task) -> int:
        """Tasks of its function that run before it (if it were due now)."""
        ready = self.ready.get(task.function)
        return ready.bisect_left(task.key) if ready else 0

    # -- dispatch ------------------------------------------------------------------------
    def take(self, holder, now: float, plain_only: bool = False) -> Task | None:
        """The next task a dispatcher may call: the best due one, by (-level, priority,
        seq), among the functions that may start a call now (below their concurrency,
        their gate open).  `plain_only` (a dispatcher too old for request tasks): among
        the functions whose head is not a request task."""
        self._open_gates(now)       # (an op may come in a turn before its timer fires)
        heads, offered = self.heads, self.offered
        passed = []                 # good heads of request tasks, for plain_only
        try:
            while True:
                while (top := self._top(now)) is not None:
                    key, name = top
                    head = self.by_key[key]
                    if not head.online and (not plain_only or head.request is None):
                        break                   # (online heads are admitted: `admit`)
                    passed.append(heapq.heappop(heads))
                else:
                    return None
                task = self.by_key[key]
                peer = None
                upstream = self.specs[name].upstream
                if upstream is not None:
                    peer = self.upstream.pick(upstream, task.balance_key, now)
                    if type(peer) is Unavailable:   # held back, or its attempt fails
                        heapq.heappop(heads)
                        del offered[name]
                        self._unavailable(task, peer, now)
                        continue
                if not self.journal.room[TASK_CALL](task):
                    if peer is not None:
                        peer.conns -= 1
                    return None             # the binlog's disk is full: it waits, queued
                heapq.heappop(heads)        # ours, the top before the passed go back
                if upstream is not None:
                    self.upstream.started(upstream, now)
                break
        finally:
            for entry in passed:
                heapq.heappush(heads, entry)
        task.peer = (upstream, peer) if peer is not None else None
        del self.offered[name]
        del self.by_key[key]
        self._unready(task)
        self.queued.discard(task.function)
        self._counted(task.function).started += 1
        if name in self.gates or self.specs[name].rate:
            gate = self.gate(name, now)
            gate.start(now)
            if gate.interval >= DURABLE_RATE_S:
                self.gates_changed = True
        self._recent(name).started(now)
        task.status = RUNNING
        task.status_code = task.error = None        # (the last attempt's: they no longer apply)
        task.attempt += 1
        task.started = now
        task.holder = holder
        task.deadline = now + task.timeout_ms / 1000 + CALL_GRACE_S
        self.calls.add((task.deadline, task.seq))
        self.running[task.function] = self.running.get(task.function, 0) + 1
        self._peak(task.function)
        self.journal.append[TASK_STATE](task)
        self._offer(name, now)                  # its next head, if it may go on
        return task

    def _recent(self, name: str) -> Recent:
        recent = self.recent.get(name)
        if recent is None:
            recent = self.recent[name] = Recent()
        return recent

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
        peer = task.peer                        # (where the call went: for the log)
        if peer is not None:
            self._server_done(task, result, now)
        self._end_call(task, now)
        if result.kind != "declined":           # (a declined call was never made)
            took = now - task.started
            self.counts.of(task.function).calls.observe(took)
            self._recent(task.function).ended(now, took)
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

    def _say_failed(self, task: Task, attempt: int, result: Outcome, peer, now: float) -> None:
        """A failed call: its function, URL, status or error, and what happens to the task
        (logged at most once per FAILED_CALL_LOG_S per function)."""
        spec = self.function(task.function)
        url = "(its function is no longer configured)" if spec is None else \
            self._url(task, spec, peer)
        if task.status == FAILED:
            then = "the task failed"
        elif result.status_code == 429:
            then = "the task keeps its place while the function pauses"
        else:
            then = f"retried in {round(max(0.0, task.due - now), 3):g} s"
        self.failed_calls.say(
            task.function, now, "function %s: a call to %s failed: %s (task %s, attempt %d: %s)",
            task.function, url, result.error or f"HTTP {result.status_code}", task.uid,
            attempt, then)

    def _apply(self, task: Task, result: Outcome, now: float) -> None:
        if result.kind == "declined":
            task.attempt -= 1
            self._queue(task, now, now)
            return
        task.status_code = result.status_code
        if result.kind == "success":
            task.error = None
            self._set_result(task, result.result, result.result_headers)
            self._finish(task, SUCCESS, now)
            gate = self.gates.get(task.function)
            if gate is not None:
                gate.succeeded()
            return
        task.error = (result.error or "the call failed")[:TASK_ERROR_CHARS]
        if result.status_code in SLOW_DOWN and result.kind == "failure":
            self._slow_down(task, result, now)
            if result.status_code == 429:       # back in its place, no attempt spent
                task.attempt -= 1
                self._queue(task, now, now)
                return
        if result.kind == "fatal":
            self._finish(task, FAILED, now)
        elif result.kind == "unknown" and task.delivery == AT_MOST_ONCE:
            task.error = (f"outcome unknown, not retried (atMostOnce): "
                          f"{task.error}")[:TASK_ERROR_CHARS]
            self._finish(task, FAILED, now)
        elif task.attempt <= task.attempts:
            self.counts.of(task.function).retries += 1
            wait_ms = max(task.backoff.wait_ms(task.attempt, self.rand),
                          max(result.retry_after_ms, 0))
            self._queue(task, now + wait_ms / 1000, now)
        else:
            self._finish(task, FAILED, now)

    def _slow_down(self, task: Task, result: Outcome, now: float) -> None:
        """A 429 or 503: the function pauses (limits.Gate.pause)."""
        spec = self.function(task.function)
        max_pause_s = (spec.max_pause_ms if spec else 60000) / 1000
        retry_after = None if result.retry_after_ms < 0 else result.retry_after_ms / 1000
        if spec is not None and spec.upstream is not None and retry_after is not None:
            return                      # that server is paused, not the function (_server_done)
        said = "" if retry_after is None else f", Retry-After {retry_after:g} s"
        self.gate(task.function, now).pause(now, task.started, retry_after, max_pause_s,
                                            f"the function answered {result.status_code}{said}")

    def lost(self, holder, now: float) -> None:
        """A dispatcher went away: its calls' outcomes are unknown."""
        for task in [self.by_seq[seq] for _, seq in self.calls]:
            if task.holder is not holder:
                continue
            self.outcome(task.uid, task.attempt,
                         Outcome("unknown", error="the dispatcher went away during the call",
                                 failure=""),
                         now)

    def _unready(self, task: Task, now: float | None = None) -> None:
        """Take a due task out of its function's queue (`now`: offer its new head, when
        the head was not taken by take(), which offers it itself)."""
        ready = self.ready[task.function]
        was_head = ready[0] == task.key
        ready.remove(task.key)
        if not ready:
            del self.ready[task.function]       # take() looks only at functions with work
        elif was_head and now is not None:
            self._offer(task.function, now)

    def _end_call(self, task: Task, now: float) -> None:
        self.calls.remove((task.deadline, task.seq))
        self.running[task.function] -= 1
        if not self.running[task.function]:
            del self.running[task.function]
        task.holder = None
        self._offer(task.function, now)         # a free slot: it may start its next call

    def _set_result(self, task: Task, result: bytes | None,
                    headers: dict | None = None) -> None:
        self.bytes -= held_bytes(task)
        task.result, task.result_headers = result, headers
        self.bytes += held_bytes(task)

    def _finish(self, task: Task, status: str, now: float) -> None:
        if task.online and task.status == QUEUED:
            self._leave_line(task)
        if task.queue_deadline:
            self.timeouts.discard((task.queue_deadline, task.seq))
        finished = self._counted(task.function).finished
        finished[status] = finished.get(status, 0) + 1
        task.status = status
        task.finished = now
        task.expires = now + task.keep_result_ms / 1000
        self.keeping.add((task.expires, task.seq))

    # -- cancel --------------------------------------------------------------------------
    def cancel(self, uid: str, now: float) -> Task | TaskError:
        task = self.tasks.get(uid)
        if task is None:
            return TaskError("not_found", f"no task {uid!r}")
        if task.status not in (QUEUED, ADMITTED):
            return TaskError("not_cancellable", f"task {uid!r} is {task.status}")
        if task.status == QUEUED and not self.journal.room[TASK_STATE](task):
            # (an admission's end is reserved)
            return _NO_SPACE
        if task.status == ADMITTED:         # (its pass is revoked: the verify check asks)
            self._end_admission(task, now)
        else:
            self._dequeue(task, now)
        self._finish(task, CANCELLED, now)
        self.journal.append[TASK_STATE](task)
        return task

    def _open_gates(self, now: float) -> None:
        """Offer again the functions whose gate has opened."""
        while self.shut and self.shut[0][0] <= now:
            _, name = heapq.heappop(self.shut)
            if self.shut_at.get(name, 0) <= now:
                self.shut_at.pop(name, None)
                self._offer(name, now)

    def _time_out(self, now: float) -> None:
        """Fail the tasks still queued past their queue deadline (never called)."""
        while self.timeouts and self.timeouts[0][0] <= now:
            _, seq = self.timeouts.pop(0)
            task = self.by_seq[seq]         # (finished tasks leave `timeouts`: _finish)
            if task.status != QUEUED:
                continue                    # running: a retry would fail instead (_queue)
            if not self.journal.room[TASK_STATE](task):
                task.queue_deadline = now + 1.0     # the binlog's disk is full: try again
                self.timeouts.add((task.queue_deadline, seq))
                return
            self._dequeue(task, now)
            task.error = QUEUE_TIMEOUT
            self._finish(task, FAILED, now)
            self.journal.append[TASK_STATE](task)

    def _dequeue(self, task: Task, now: float) -> None:
        """Take a queued task out of its queue (cancel, queue timeout)."""
        if task.key in self.by_key:
            del self.by_key[task.key]
            self._unready(task, now)
        else:
            self.waiting.remove((task.due, task.seq))
            self.queued.delay(task.function, -1)
        self.queued.discard(task.function)

    # -- timers --------------------------------------------------------------------------
    def next_deadline(self) -> float | None:
        heads = [s[0][0] for s in (self.waiting, self.calls, self.keeping, self.timeouts,
                                   self.passes, self.liveness) if s]
        for timer in (self.shut, self.idle_gates):
            if timer:
                heads.append(timer[0][0])
        return min(heads) if heads else None

    def expire(self, now: float) -> None:
        while self.waiting and self.waiting[0][0] <= now:
            due, seq = self.waiting.pop(0)
            task = self.by_seq[seq]
            self.queued.delay(task.function, -1)
            self._make_due(task, now)
        self._open_gates(now)
        self._time_out(now)
        if self.passes or self.liveness:
            self._room_expire(now)
        while self.idle_gates and self.idle_gates[0][0] <= now:
            _, name = heapq.heappop(self.idle_gates)
            gate = self.gates.get(name)
            if name not in self.specs and gate is not None:
                spec = self.function(name)
                if gate.holds_until((spec.max_pause_ms if spec else 60000) / 1000) <= now:
                    del self.gates[name]
        while self.calls and self.calls[0][0] <= now:
            task = self.by_seq[self.calls[0][1]]
            why = (f"no report within the timeout ({task.timeout_ms} ms)"
                   if task.holder != RESTARTED else "the broker stopped during the call, "
                   f"and no dispatcher claimed it within {CLAIM_S:g} s of the restart")
            self.outcome(task.uid, task.attempt, Outcome("unknown", error=why, failure=""), now)
        while self.keeping and self.keeping[0][0] <= now:
            _, seq = self.keeping.pop(0)
            task = self.by_seq.pop(seq)
            del self.tasks[task.uid]
            self.uses[task.function] -= 1
            if not self.uses[task.function]:
                self._forget_function(task.function, now)
            self.bytes -= held_bytes(task)
            self.journal.append[TASK_GONE](task)

    def _forget_function(self, name: str, now: float) -> None:
        """No task uses `name` any more: drop what is kept for it, but a gate that still
        holds something back (a TAT ahead of now, a pause, a backoff to double)."""
        spec = self.specs.pop(name)
        del self.uses[name]
        self.recent.pop(name, None)
        if name not in self.held:
            self.peaks.pop(name, None)
        gate = self.gates.get(name)
        if gate is not None:
            until = gate.holds_until((spec.max_pause_ms if spec else 60000) / 1000)
            if until <= now:
                del self.gates[name]
            else:                           # (dropped then, unless used again: expire)
                heapq.heappush(self.idle_gates, (until, name))

    # -- restart -------------------------------------------------------------------------
    def restore(self, images: list, now: float) -> None:
        """The tasks a journal restored (journal.TaskImage each), wall-clock times back to
        our clock.  A call running when the broker stopped waits CLAIM_S for its
        dispatcher to claim it, then ends with an unknown outcome."""
        wall = self.wall_offset
        for i in sorted(images, key=lambda image: image.seq):
            task = Task(i.uid, i.function, i.params, i.priority, i.seq, i.created - wall)
            level = i.level
            task.place(level if 0 <= level <= MAX_LEVEL else 0, i.priority)
            task.request = requests.Request.from_fields(i.request)
            task.balance_key, task.client_ip, task.ended_by = (i.balance_key, i.client_ip,
                                                               i.ended_by)
            task.online = i.online
            task.pass_exp = i.pass_exp - wall if i.pass_exp is not None else 0.0
            kept = i.result_headers
            if isinstance(kept, dict) and all(type(k) is str and type(v) is str
                                              for k, v in kept.items()):
                task.result_headers = kept
            status = i.status
            if i.queue_deadline is not None:
                task.queue_deadline = i.queue_deadline - wall
                if status in (QUEUED, RUNNING):
                    self.timeouts.add((task.queue_deadline, i.seq))
            task.attempts, task.backoff = i.attempts, TaskBackoff(*i.backoff)
            task.timeout_ms = i.timeout_ms
            task.delivery, task.keep_result_ms, task.attempt = (i.delivery, i.keep_result_ms,
                                                                i.attempt)
            task.started = None if i.started is None else i.started - wall
            task.finished = None if i.finished is None else i.finished - wall
            task.status_code, task.error, task.result = i.status_code, i.error, i.result
            function, seq = i.function, i.seq
            self._add(task, self.function(function))
            if status == QUEUED:
                self._queue(task, i.due - wall, now, restoring=True)
                if task.online:             # (last seen: the restart)
                    task.last_seen = now
                    self._join_line(task, self.specs.get(function), now)
            elif status == ADMITTED:        # its pass still holds a slot until it expires
                task.status = ADMITTED
                if not task.pass_exp:       # (a TASK_STATE logged the admission: from then)
                    spec = self.function(function)
                    task.pass_exp = (task.started or now) + (
                        spec.pass_ttl_ms if spec else 300_000) / 1000
                self.passes.add((task.pass_exp, seq))
                self._room_count(function, 1, 1)
                self.running[function] = self.running.get(function, 0) + 1
            elif status == RUNNING:         # its dispatcher may claim it (see `claim`)
                task.status, task.holder = RUNNING, RESTARTED
                task.deadline = now + CLAIM_S
                self.calls.add((task.deadline, seq))
                self.running[function] = self.running.get(function, 0) + 1
            else:
                task.status, task.expires = status, i.expires - wall
                self.keeping.add((task.expires, seq))
        if images:
            self.next_seq = max(t.seq for t in self.by_seq.values()) + 1

    def claim(self, uid: str, attempt: int, holder, now: float) -> bool:
        """A re-registered dispatcher says it is making call `attempt` of task `uid`, or
        has its report: the call is its own again, with the deadline it had (its timeout
        from when it started, wall clock).  False if we restarted without that call."""
        task = self.tasks.get(uid)
        if task is None or task.status != RUNNING or task.attempt != attempt or (
                task.holder != RESTARTED):
            return False
        self.calls.remove((task.deadline, task.seq))
        task.holder = holder
        # (a call that ended while we were down has its report on the way: it gets the
        # time a report takes to come back, as an unclaimed call gets to be claimed)
        task.deadline = max(now + CLAIM_S, task.started + task.timeout_ms / 1000 + CALL_GRACE_S)
        self.calls.add((task.deadline, task.seq))
        return True


def client_group(ip: str | None) -> str | None:
    """A client address as the waiting room counts it: IPv6 by its /64 (one user often
    has a whole /64), IPv4 as it is."""
    if not ip or ":" not in ip:
        return ip or None
    try:
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    except ValueError:
        return ip


def held_bytes(task: Task) -> int:
    """What a task holds in memory, as --max-jobs-bytes counts it."""
    size = TASK_OVERHEAD_BYTES + len(task.params) + len(task.result or b"")
    if task.request is not None:
        size += task.request.size()
    if task.result_headers:
        size += sum(len(k) + len(v) for k, v in task.result_headers.items())
    return size


# -- options ---------------------------------------------------------------------------------
def parse_options(options: Any, spec: FunctionSpec) -> dict | TaskError:
    """The enqueue options, checked; names and units as in the API (durations in ms)."""
    if options is None:
        return {}
    if not isinstance(options, dict):
        return _bad("options must be an object")
    out: dict[str, Any] = {}
    for name, value in options.items():
        if name not in OPTIONS:
            return _bad(f"unknown option {name!r}; options are {', '.join(OPTIONS)}")
        checked = _CHECKS[name](value, spec)
        if isinstance(checked, TaskError):
            return checked
        out[name] = checked
    return out


_NO_SPACE = TaskError("out_of_space", "the binlog's disk is full")


def _bad(message: str) -> TaskError:
    return TaskError("bad_request", message)


def _int(name: str, value: Any, low: int, high: int) -> int | TaskError:
    if type(value) is not int:          # (a bool is an int to Python, not to JSON)
        return _bad(f"{name} must be an integer")
    if not low <= value <= high:
        return _bad(f"{name} must be between {low} and {high}")
    return value


def _backoff(value: Any, spec: FunctionSpec) -> TaskBackoff | TaskError:
    if not isinstance(value, dict):
        ms = _int("backoff", value, 0, MAX_DURATION_MS)
        return ms if isinstance(ms, TaskError) else TaskBackoff("fixed", ms)
    unknown = set(value) - {"type", "delay", "maxDelay", "jitter"}
    if unknown:
        return _bad(f"unknown backoff field {sorted(unknown)[0]!r}")
    kind = value.get("type", "fixed")
    if kind not in ("fixed", "exponential"):
        return _bad("backoff type must be 'fixed' or 'exponential'")
    delay = _int("backoff delay", value.get("delay", 60000), 0, MAX_DURATION_MS)
    cap = _int("backoff maxDelay", value.get("maxDelay", MAX_DURATION_MS), 0, MAX_DURATION_MS)
    jitter = value.get("jitter", False)
    if type(jitter) is not bool:
        return _bad("backoff jitter must be true or false")
    for checked in (delay, cap):
        if isinstance(checked, TaskError):
            return checked
    return TaskBackoff(kind, delay, cap, jitter)


def _delivery(value: Any, spec: FunctionSpec) -> str | TaskError:
    if value not in (AT_LEAST_ONCE, AT_MOST_ONCE):
        return _bad(f"deliveryMode must be {AT_LEAST_ONCE!r} or {AT_MOST_ONCE!r}")
    return value


def _unique_id(value: Any, spec: FunctionSpec) -> str | TaskError:
    if not isinstance(value, str) or not UNIQUE_ID.fullmatch(value):
        return _bad("uniqueId must be 1 to 32 characters of A-Z a-z 0-9 _ . : -")
    return value


_CHECKS: dict[str, Callable[[Any, FunctionSpec], Any]] = {
    "attempts": lambda v, spec: _int("attempts", v, 0, MAX_ATTEMPTS),
    "backoff": _backoff,
    "delay": lambda v, spec: _int("delay", v, 0, MAX_DURATION_MS),
    "deliveryMode": _delivery,
    "keepResult": lambda v, spec: _int("keepResult", v, 0, MAX_DURATION_MS),
    "level": lambda v, spec: _int("level", v, 0, MAX_LEVEL),
    "priority": lambda v, spec: _int("priority", v, *INT64),
    "queueTimeout": lambda v, spec: _int("queueTimeout", v, 1, MAX_DURATION_MS),
    "timeout": lambda v, spec: _int("timeout", v, 1, spec.max_timeout_ms),
    "uniqueId": _unique_id,
}
