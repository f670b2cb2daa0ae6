"""A task, and the one table of how its status moves.

Everything that changes a task's status is in MOVES, in the manner of h11's state table:
(status, event) -> the next status, and nothing else is allowed (`move` raises on a pair
that is not there, which is a bug of the ledger, the only caller: ledger.py).  The statuses are the
task API's (protocol/schema/tasks.py):

    enqueue --> queued --take--> running --succeed--> success
                  ^  |              |---- queue (a failure with attempts left, a call
                  |  |              |      declined, a 429, a call that never reached its
                  |  |              |      host: back in line) ---> queued
                  |  |              |---- fail (none left, fatal, unknown atMostOnce) --> failed
                  |  |              |---- time out (a retry due after its queueTimeout) -> failed
                  |  |              '---- cancel (its call is aborted) --> cancelled
                  |  |-- cancel, abandon (an online task nobody looked at) --> cancelled
                  |  |-- time out (still queued at its queueTimeout) ---------> failed
                  |  '-- admit (an online task whose turn came) --> admitted
                  |                    admitted --done, expire--> success
                  '------------------- admitted --cancel--> cancelled
    success, failed, cancelled --keepResult--> forgotten (the uniqueId is free again)
    failed, cancelled --retry (an operator's: POST /v1/tasks/{id}/retry)--> queued

A task keeps its place in its function's line by `key`, (-level, priority, seq); `seq`
is the enqueue order, so equal priorities run first come, first served.
"""
from typing import Callable, NamedTuple

from .....protocol.schema.outcome import Outcome  # noqa: F401  (the store's, the dispatcher's)
from .....protocol.schema.tasks import (ADMITTED, AT_LEAST_ONCE, CANCELLED, DEFAULT_ATTEMPTS,
                                        DEFAULT_BACKOFF_MS, DEFAULT_KEEP_RESULT_MS,
                                        DEFAULT_TIMEOUT_MS, FAILED, MAX_DURATION_MS, QUEUED,
                                        RUNNING, SUCCESS, TASK_ERROR_CHARS)
from .....protocol.schema.tasks import client_net  # noqa: F401  (the room's, and the front's)
from .requests import Request

#: how long past its timeout a running task waits for its dispatcher's report
CALL_GRACE_S = 5.0
#: after a restart, how long a call that was running waits for its dispatcher to claim it
#: (dispatchers notice a restarted broker within a heartbeat timeout, 2 s, and re-register)
CLAIM_S = 5.0
#: the holder of a call the broker was running when it stopped, until it is claimed
RESTARTED = "restarted"
#: what one task costs beyond its params and result, for --max-jobs-bytes (the object,
#: its id, its places in the index and the timer lists)
TASK_OVERHEAD_BYTES = 512
ABANDONED = "abandoned"     # the error of an online task not looked at within its heartbeat

MOVES: dict[tuple[str, str], str] = {
    (QUEUED, "queue"): QUEUED,          # (queued again: a restart, an attempt no server took)
    (QUEUED, "take"): RUNNING,
    (QUEUED, "admit"): ADMITTED,
    (QUEUED, "cancel"): CANCELLED,
    (QUEUED, "abandon"): CANCELLED,
    (QUEUED, "time out"): FAILED,
    (QUEUED, "fail"): FAILED,           # (its upstream had no live server, none left)
    (RUNNING, "queue"): QUEUED,         # a retry, a declined call, a 429
    (RUNNING, "succeed"): SUCCESS,
    (RUNNING, "fail"): FAILED,
    (RUNNING, "time out"): FAILED,      # a retry due after its queueTimeout
    (RUNNING, "cancel"): CANCELLED,     # a DELETE: its call is aborted (store.cancel)
    (ADMITTED, "done"): SUCCESS,
    (ADMITTED, "expire"): SUCCESS,
    (ADMITTED, "cancel"): CANCELLED,
    (FAILED, "retry"): QUEUED,          # an operator's retry: its attempts start again
    (CANCELLED, "retry"): QUEUED,
}


def move(task: "Task", event: str) -> None:
    """The one way a task's status changes (KeyError: a move MOVES does not have)."""
    task.status = MOVES[task.status, event]


class TaskError(NamedTuple):
    code: str           # a stable machine-readable name (http/front.py's STATUS gives its status)
    message: str


class TaskBackoff(NamedTuple):
    kind: str = "fixed"         # "fixed" | "exponential"
    delay_ms: int = DEFAULT_BACKOFF_MS
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
                 "status_code", "result", "error", "holder", "level",
                 "queue_deadline", "key", "request", "result_headers", "peer",
                 "balance_key", "client_ip", "online", "last_seen", "pass_exp", "ended_by",
                 "group", "token", "tried", "aborted", "possibly_executed")

    def __init__(self, uid: str, function: str, params: bytes, priority: int, seq: int,
                 now: float) -> None:
        self.uid = uid
        self.function = function
        self.params = params            # the JSON body to POST, as received
        self.priority = priority
        self.seq = seq
        self.level = 0                  # 0-9, higher first
        self.key = (0, priority, seq)   # its place in its function's queue (`place`)
        self.group = ""                 # its tenant: the rotation serves groups in turn
        self.token: bytes | None = None     # its own token's SHA-256 (schema/tokens.py)
        self.queue_deadline = 0.0       # fails if still queued then (0: no queueTimeout)
        self.request = None             # a request task's method, path, ... (requests.py)
        self.result_headers: dict | None = None
        self.peer = None                # running on an upstream: the server it was given
        self.tried: tuple[str, ...] = ()    # the urls its latest attempt went to (moves.py)
        self.balance_key: str | None = None     # what its calls are hashed by (upstreams)
        self.client_ip: str | None = None       # who enqueued it (ip_hash, clientIp)
        self.online = False             # a waiting-room task: admitted, never called
        self.last_seen = 0.0            # online, queued: when its user last looked
        self.pass_exp = 0.0             # admitted: when its pass expires
        self.ended_by: str | None = None    # an admitted task's end: "done" or "expired"
        self.status = QUEUED
        self.attempt = 0                # calls made so far
        self.attempts = DEFAULT_ATTEMPTS    # retries allowed after the first call
        self.backoff = TaskBackoff()
        self.timeout_ms = DEFAULT_TIMEOUT_MS
        self.delivery = AT_LEAST_ONCE
        self.keep_result_ms = DEFAULT_KEEP_RESULT_MS
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
        self.aborted = 0                # cancelled while running: the call aborted (attempt)
        self.possibly_executed = False  # ... and a later report says it may have run

    def place(self, level: int, priority: int) -> None:
        self.level, self.priority = level, priority
        self.key = (-level, priority, self.seq)


def held_bytes(task: Task) -> int:
    """What a task holds in memory, as --max-jobs-bytes counts it."""
    size = TASK_OVERHEAD_BYTES + len(task.params) + len(task.result or b"")
    if task.request is not None:
        size += task.request.size()
    if task.result_headers:
        size += sum(len(k) + len(v) for k, v in task.result_headers.items())
    return size


def client_group(ip: str | None) -> str:
    """The group `group_by = "client"` puts a task in: its client's address as the waiting
    room counts it (IPv6 by its /64, shown as the network's address), in the characters
    a group may have ("" without an address; an IPv4-mapped address is its IPv4's)."""
    if ip and ip[:7].lower() == "::ffff:" and "." in ip:
        ip = ip[7:]
    net = client_net(ip)
    if not net:
        return ""
    return "".join(c if c.isalnum() or c in "_.:@-" else "_" for c in net.split("/")[0])[:64]


def restored(image, wall: float, max_level: int) -> Task:
    """A task as a journal kept it (core/shared/journal.py TaskImage), our clock's times;
    its status is the ledger's to set (ledger.resume)."""
    task = Task(image.uid, image.function, image.params, image.priority, image.seq,
                image.created - wall)
    task.place(image.level if 0 <= image.level <= max_level else 0, image.priority)
    task.request = Request.from_fields(image.request)
    task.balance_key, task.client_ip, task.ended_by = (image.balance_key, image.client_ip,
                                                       image.ended_by)
    task.online, task.group, task.token = image.online, image.group, image.token_sha256
    task.possibly_executed = image.possibly_executed
    task.pass_exp = image.pass_exp - wall if image.pass_exp is not None else 0.0
    kept = image.result_headers
    if isinstance(kept, dict) and all(type(k) is str and type(v) is str for k, v in kept.items()):
        task.result_headers = kept
    if image.queue_deadline is not None:
        task.queue_deadline = image.queue_deadline - wall
    task.attempts, task.backoff = image.attempts, TaskBackoff(*image.backoff)
    task.timeout_ms, task.delivery = image.timeout_ms, image.delivery
    task.keep_result_ms, task.attempt = image.keep_result_ms, image.attempt
    task.started = None if image.started is None else image.started - wall
    task.finished = None if image.finished is None else image.finished - wall
    task.status_code, task.error, task.result = image.status_code, image.error, image.result
    return task
