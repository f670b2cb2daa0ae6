"""One pool process's session with the broker: subscribe, run pushed jobs, ack, give credit.

The pool is a front of kind "pool" with one session (conn 1) over a BrokerLink, which
owns Hello/Welcome, heartbeats, batching and reconnects.  After Welcome the pool OPENs
and SUBSCRIBEs with its tubes and credits = capacity - jobs it holds (capacity is
concurrency + prefetch; by default the prefetch adapts to the handlers' run time, see
`_adapt`), so it never holds more than capacity jobs.  The broker pushes
`R.JOB`s, each reserved by this session; a finished job is answered DELETE / RELEASE /
BURY and its slot given back with CREDIT, all in the loop turn that collected the
results, so the link sends them as one Batch.

Replies come in op order and pushed jobs are not replies, so `awaiting` is a FIFO of
(op, callback) for every op that gets a reply.  When the link loses the broker, acks
in flight are kept to send again after Welcome (a job id is never reused within one
broker state, so a second DELETE is harmless) and the session state re-registered lists
them as still held.  A broker with another state (restarted without a binlog) numbers
its jobs afresh: then nothing held or in flight is acked there (see _forget_state).

Shutdown (SIGTERM): SUBSCRIBE with 0 credits, release every job not started yet, let
running handlers finish for grace_s (their acks go out as usual), release the rest.

`metrics` counts each handler's run by what became of it, from the ack's reply (so an ack
kept for resending keeps its callback), and its run time (metrics.py says what each
outcome means); jobs handed back unrun (`_release`) are not counted there.
"""
from __future__ import annotations

import asyncio
import collections
import inspect
import logging
import math
import threading
import time
from typing import Any, Callable, Protocol

import zmq

from ..protocol.codecs.prometheus import Sample
from ..protocol.links.zeromq import BrokerLink
from ..protocol.links.owner import READY, LinkOwner
from ..protocol.schema import SILENT_OPS, WORKER_VERSIONS, Op, R, SessionState, Welcome
from .codecs import Codec
from .errors import Bury, Retry, WorkerVersionError, ZstalkError
from .job import BURY, DELETE, EXPIRED, RELEASE, Backoff, Job, Outcome, decide
from .metrics import BURIED, DELETED, LOST, REFUSED, RELEASED, PoolMetrics
from .runners import AsyncRunner, Result, ThreadRunner

CONN = 1
#: auto prefetch (Worker(prefetch=None)): work held beyond the running handlers, in
#: seconds of handler time, between 1 and AUTO_MAX jobs; the run time average's weight
AUTO_BUFFER_S = 0.02
AUTO_MAX = 256
AUTO_WEIGHT = 0.2
GOODBYE_LINGER_MS = 200
#: ops submitted while the broker is away wait for it (acks must not turn into errors)
HOLD_FOREVER_S = 10.0 ** 9
_ACKS = frozenset({Op.DELETE, Op.RELEASE, Op.BURY})
_DONE_CODES = {R.DELETED: DELETED, R.RELEASED: RELEASED, R.BURIED: BURIED}   # counts' keys
Callback = Callable[[tuple, tuple], None]
_CHOSEN = (Retry, Bury)       # the handler chose the outcome itself: not a failure


class Settings(Protocol):
    """What a pool reads of the worker.Worker that runs it (its constructor's arguments
    and its handlers by tube)."""
    handlers: dict[str, Callable[..., Any]]
    concurrency: int
    prefetch: int | None
    codec: Codec
    max_attempts: int
    backoff: Backoff
    grace_s: float
    auto_touch: bool
    keys: Any
    logger: logging.Logger


class Pool(LinkOwner):
    def __init__(self, worker: Settings, endpoint: str, ctx: zmq.Context | None = None) -> None:
        self.worker = worker
        self.endpoint = endpoint
        self.ctx = ctx
        self.log: logging.Logger = worker.logger
        self.tubes = list(worker.handlers)
        self.fixed_prefetch = worker.prefetch          # None: adapt (see _adapt)
        self.capacity = worker.concurrency + (worker.concurrency if worker.prefetch is None
                                              else worker.prefetch)
        self.granted = 0                   # credits the broker holds for us, by our count
        self.handler_s: float | None = None    # moving average of handler run time
        self.held: dict[int, Job] = {}     # reserved by our session: the latest delivery
        self.busy = 0                      # deliveries taking a slot: pushed, not finished
        self.awaiting: collections.deque[tuple[tuple, Callback | None]] = collections.deque()
        self.resend: list[tuple[tuple, Callback | None]] = []    # (ack, its callback)
        self.touch_timers: dict[int, asyncio.TimerHandle] = {}
        self.counts: collections.Counter[str] = collections.Counter()
        self.metrics = PoolMetrics()
        self.jobs = self.metrics.jobs      # handler runs by outcome (metrics.py)
        self.had_session = False
        self.state_id = 0                  # the broker state our job ids belong to
        self.subscribed = False
        self.stopping = False
        self.hurry = False                 # a second SIGTERM / SIGINT: no more grace
        self.stop_task: asyncio.Task | None = None

    # -- life cycle --------------------------------------------------------------------
    def start(self) -> None:
        if not self.tubes:
            raise ValueError("this worker has no handlers: register one with @worker.handler(tube)")
        self.loop = asyncio.get_running_loop()
        self.loop_thread = threading.get_ident()
        self.done: asyncio.Future = self.loop.create_future()
        decider = self._decider()
        handlers = self.worker.handlers
        any_sync = not all(inspect.iscoroutinefunction(h) for h in handlers.values())
        self.threads = ThreadRunner(self.worker.concurrency if any_sync else 0, decider,
                                    self._finished)
        self.tasks = AsyncRunner(self.worker.concurrency, decider, self._finished)
        self.routes = {tube: (h, self.tasks if inspect.iscoroutinefunction(h) else self.threads)
                       for tube, h in handlers.items()}
        self.link = BrokerLink(self.endpoint, "pool", self, hold_s=HOLD_FOREVER_S, ctx=self.ctx,
                               keys=self.worker.keys)
        self.link.start()

    def _decider(self) -> Callable[[Job, BaseException | None], Outcome]:
        max_attempts, backoff = self.worker.max_attempts, self.worker.backoff
        return lambda job, exc: decide(job, exc, max_attempts, backoff)

    def close(self) -> None:
        for timer in self.touch_timers.values():
            timer.cancel()
        self.threads.stop()
        self.tasks.stop()
        if self.link.state is READY:     # say goodbye: the broker closes our session now
            self.link.submit((Op.CLOSE, CONN))
            self.link.flush_now()
        self.link.close(linger_ms=GOODBYE_LINGER_MS)

    def request_stop(self) -> None:
        """SIGTERM / SIGINT: shut down gracefully, then resolve `done`; a second signal
        cuts the grace period short (running jobs are released at once)."""
        if self.stop_task is not None:
            self.hurry = True
            self.log.warning("stopping now: running jobs are released")
        else:
            self.stop_task = self.loop.create_task(self._stop_and_finish())

    async def _stop_and_finish(self) -> None:
        await self.shutdown()
        if not self.done.done():
            self.done.set_result(None)

    def fail(self, exc: BaseException) -> None:
        if not self.done.done():
            self.done.set_exception(exc)

    async def shutdown(self) -> None:
        if self.stopping:
            return
        self.stopping = True
        self.log.info("stopping: no new jobs, %d held", len(self.held))
        self._subscribe(0)
        for job in self.threads.take_pending() + self.tasks.take_pending():
            self.busy -= 1
            self._release(job)
        await _until(lambda: not self.busy or self.hurry, self.worker.grace_s)
        for job in list(self.held.values()):
            self.log.warning("job %d still running after %.1f s: released", job.id,
                             self.worker.grace_s, extra=_fields(job, RELEASE))
            self._release(job)
        await _until(lambda: not self._acks_in_flight(), 2.0)

    # -- ops ---------------------------------------------------------------------------
    def _submit(self, op: tuple, callback: Callback | None = None) -> None:
        if self.link.state is not READY:
            self._while_away(op, callback)
            return
        if op[0] not in SILENT_OPS:
            self.awaiting.append((op, callback))
        self.link.submit(op)

    def _while_away(self, op: tuple, callback: Callback | None) -> None:
        """The broker is away: an ack waits in `resend` (and its job is listed as held
        when we say Hello again); credits, touches and subscriptions are made afresh
        by on_welcome's SUBSCRIBE; a question gets INTERNAL_ERROR now."""
        if op[0] in _ACKS:
            self.resend.append((op, callback))
        elif callback is not None and op[0] not in (Op.SUBSCRIBE, Op.TOUCH):
            callback(op, (CONN, R.INTERNAL_ERROR))

    def _subscribe(self, credits: int) -> None:
        self.granted = max(0, credits)
        self._submit((Op.SUBSCRIBE, CONN, list(WORKER_VERSIONS), self.tubes, max(0, credits)),
                     self._subscribed)

    def query(self, op: tuple) -> asyncio.Future:
        """Send any beanstalk op on the pool's session; the future gets its reply."""
        fut = self.loop.create_future()

        def answer(_op: tuple, reply: tuple) -> None:
            if not fut.done():
                fut.set_result(reply)
        self._submit(op, answer)
        return fut

    def samples(self) -> list[Sample]:
        """/metrics (protocol/codecs/prometheus.py METRICS, role pool)."""
        return self.metrics.samples()

    def _acks_in_flight(self) -> bool:
        return bool(self.resend) or any(op[0] in _ACKS for op, _ in self.awaiting)

    # -- LinkOwner ---------------------------------------------------------------------
    def on_replies(self, items: list) -> None:
        awaiting, job_code = self.awaiting, R.JOB
        for item in items:
            if item[1] == job_code:
                self._pushed(item)
            elif awaiting:
                op, callback = awaiting.popleft()
                if callback is not None:
                    callback(op, item)
            else:
                self.log.warning("reply with no op waiting for it: %r", item[:2])

    def on_welcome(self, w: Welcome) -> None:
        if not (w.restored and self.had_session):
            self._submit((Op.OPEN, CONN))
        self.had_session = True
        resend, self.resend = self.resend, []
        if w.state_id == self.state_id or not self.state_id:
            for op, callback in resend:
                self._submit(op, callback)
        else:
            self._forget_state(resend)
        self.state_id = w.state_id
        self._subscribe(0 if self.stopping else self.capacity - self.busy)

    def _forget_state(self, acks: list[tuple[tuple, Callback | None]]) -> None:
        """A broker with other state (restarted without a binlog): our job ids may now
        name its new jobs, so nothing we hold may be acked there."""
        self.log.warning("the broker's state changed: %d jobs held and %d acks dropped",
                         len(self.held), len(acks))
        self.counts["lost"] += len(acks) + len(self.held)
        self.jobs[LOST] += sum(callback == self._acked for _, callback in acks)
        for job_id in list(self.held):
            self._untouch(job_id)
        self.held.clear()

    def on_lost(self) -> None:
        """Ops sent to the lost broker get no reply: acks go again after Welcome."""
        self.subscribed = False
        awaiting, self.awaiting = self.awaiting, collections.deque()
        for op, callback in awaiting:
            if op[0] in _ACKS:
                self.resend.append((op, callback))
            elif callback is not None:
                callback(op, (CONN, R.INTERNAL_ERROR))

    def on_fenced(self) -> None:
        """The broker dropped this incarnation (and released our jobs): start afresh."""
        self.on_lost()
        self.had_session = False

    def session_states(self) -> list[SessionState]:
        if not self.had_session:
            return []
        held = list(self.held) + [op[2] for op, _ in self.resend]
        return [SessionState(CONN, self.tubes[0], self.tubes, held)]

    # -- replies -----------------------------------------------------------------------
    def _subscribed(self, op: tuple, reply: tuple) -> None:
        code = reply[1]
        if code == R.SUBSCRIBED:
            self.subscribed = True
            self.log.info("subscribed to %s with %d credits (worker protocol %d)",
                          ", ".join(op[3]), op[4], reply[2])
        elif code == R.BAD_VERSION:
            self.fail(WorkerVersionError(WORKER_VERSIONS, (reply[2], reply[3])))
        elif self.link.state is READY:
            self.fail(ZstalkError(R.name(code), "SUBSCRIBE refused: does this broker "
                                                "serve worker pools?"))

    def _acked(self, op: tuple, reply: tuple, ran: bool = True) -> None:
        """The reply to an ack: a handler's answer (`ran`), or a job handed back unrun."""
        done = _DONE_CODES.get(reply[1])
        if done is not None:
            self.counts[done] += 1
            if ran:
                self.jobs[done] += 1
        elif reply[1] == R.NOT_FOUND:
            self.counts["lost"] += 1
            self.jobs[LOST] += ran
            self.log.warning("job %d was no longer ours at %s (its TTR ran out?)",
                             op[2], Op.name(op[0]), extra={"job_id": op[2]})
        else:
            self.counts["failed"] += 1
            self.jobs[REFUSED] += ran
            self.log.error("%s of job %d answered %s", Op.name(op[0]), op[2],
                           R.name(reply[1]), extra={"job_id": op[2]})

    # -- jobs --------------------------------------------------------------------------
    def _pushed(self, item: tuple) -> None:
        _, _, job_id, raw, tube, pri, ttr_s, reserves = item[:8]
        job = Job(job_id, raw, tube, pri, ttr_s, reserves, self.worker.codec, self.touch)
        job.pushed_at = time.monotonic()
        if self.granted:
            self.granted -= 1
        self.held[job_id] = job     # a job whose TTR ran out can come back while it runs
        route = self.routes.get(tube)
        if self.stopping or route is None:
            self._release(job)
            return
        self.busy += 1
        if self.worker.auto_touch:
            self._schedule_touch(job)
        route[1].submit(job, route[0])

    def _finished(self, results: list[Result]) -> None:
        """Handlers are done: ack each job, and give their slots back in the same batch.

        A delivery that is no longer the job's latest (its TTR ran out and the broker gave
        it to us again) or that shutdown released already is not acked: the reservation
        is not its own any more.  Its slot comes back all the same."""
        held, jobs, handler = self.held, self.jobs, self.metrics.handler
        self.busy -= len(results)
        ran = []
        for r in results:
            expired = r.outcome.action == EXPIRED
            if not expired:
                handler.observe(r.duration_s)
            if held.get(r.job.id) is not r.job:
                self.counts["stale"] += 1
                jobs[EXPIRED if expired else LOST] += 1
                continue
            del held[r.job.id]
            self._untouch(r.job.id)
            if expired:                           # never ran: no ack, it is not ours
                self.counts["expired"] += 1
                jobs[EXPIRED] += 1
                self.log.warning("job %d waited its whole TTR (%d s) here: not run",
                                 r.job.id, r.job.ttr_s, extra=_fields(r.job, EXPIRED))
                continue
            ran.append(r)
            self._ack(r.job.id, r.outcome)
            self._log(r)
        if self.fixed_prefetch is None and ran:
            self._adapt(ran)
        if not self.stopping:
            self._top_up()

    def _top_up(self) -> None:
        """Give the broker the credits that bring held + promised jobs back to capacity
        (never more: pushes already on their way were counted off `granted`)."""
        want = self.capacity - self.busy - self.granted
        if want > 0:
            self.granted += want
            self._submit((Op.CREDIT, CONN, want))

    def _adapt(self, results: list[Result]) -> None:
        """Auto prefetch: hold about AUTO_BUFFER_S of work beyond the running handlers.

        Fast handlers then never wait a round trip for their next job, while slow ones
        keep few jobs away from other pools (a prefetched job's TTR is already running).
        The capacity only shrinks by not giving credits back, so nothing is taken back."""
        avg = self.handler_s
        for r in results:
            avg = r.duration_s if avg is None else avg + (r.duration_s - avg) * AUTO_WEIGHT
        self.handler_s = avg
        slots = self.worker.concurrency
        prefetch = math.ceil(slots * AUTO_BUFFER_S / max(avg or 0.0, 1e-6))
        self.capacity = slots + min(max(prefetch, 1), AUTO_MAX)

    def _ack(self, job_id: int, outcome: Outcome) -> None:
        if outcome.action == DELETE:
            op: tuple = (Op.DELETE, CONN, job_id)
        elif outcome.action == RELEASE:
            op = (Op.RELEASE, CONN, job_id, outcome.pri, outcome.delay_s)
        else:
            op = (Op.BURY, CONN, job_id, outcome.pri)
        self._submit(op, self._acked)

    def _release(self, job: Job) -> None:
        """Hand a job back now, untouched: its own priority, no delay."""
        if self.held.pop(job.id, None) is not None:
            self._untouch(job.id)
            self._submit((Op.RELEASE, CONN, job.id, job.pri, 0), self._handed_back)

    def _handed_back(self, op: tuple, reply: tuple) -> None:
        self._acked(op, reply, ran=False)

    def _log(self, r: Result) -> None:
        job, action = r.job, r.outcome.action
        log = self.log
        if r.error is None or isinstance(r.error, _CHOSEN):
            if log.isEnabledFor(logging.INFO):
                log.info("job %d %s in %.3f s", job.id, action, r.duration_s,
                         extra=_fields(job, action, r.duration_s))
            return
        level = logging.ERROR if action == BURY else logging.WARNING
        log.log(level, "job %d failed (attempt %d): %s", job.id, job.attempt, action,
                exc_info=r.error, extra=_fields(job, action, r.duration_s))

    # -- touch -------------------------------------------------------------------------
    def touch(self, job_id: int) -> None:
        """Restart a held job's TTR; callable from handler threads too."""
        if threading.get_ident() == self.loop_thread:
            self._touch(job_id)
        else:
            self.loop.call_soon_threadsafe(self._touch, job_id)

    def _touch(self, job_id: int) -> None:
        job = self.held.get(job_id)
        if job is not None:
            job.pushed_at = time.monotonic()    # its TTR runs from here now (may_start)
            self._submit((Op.TOUCH, CONN, job_id))

    def _schedule_touch(self, job: Job) -> None:
        self._untouch(job.id)       # a job back from its TTR: one timer chain per id
        interval_s = max(0.5, job.ttr_s / 2)
        self.touch_timers[job.id] = self.loop.call_later(interval_s, self._auto_touch, job)

    def _auto_touch(self, job: Job) -> None:
        if self.held.get(job.id) is job:
            self._touch(job.id)
            self._schedule_touch(job)

    def _untouch(self, job_id: int) -> None:
        timer = self.touch_timers.pop(job_id, None)
        if timer is not None:
            timer.cancel()

    # -- idleness (testing) ------------------------------------------------------------
    async def until_idle(self, timeout_s: float, wait_delayed: bool = False) -> bool:
        """True once this pool holds nothing and its tubes have no ready or reserved job."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            await asyncio.sleep(0.02)
            if self.busy or self.held or not self.subscribed or self._acks_in_flight():
                continue
            if await self._tubes_idle(wait_delayed) and not self.held:
                return True
        return False

    async def _tubes_idle(self, wait_delayed: bool) -> bool:
        keys = ("current-jobs-ready", "current-jobs-reserved") + (
            ("current-jobs-delayed",) if wait_delayed else ())
        for tube in self.tubes:
            reply = await self.query((Op.STATS_TUBE, CONN, tube))
            if reply[1] == R.NOT_FOUND:
                continue
            if reply[1] != R.STATS:
                return False
            stats = dict(reply[2])
            if any(stats.get(k) for k in keys):
                return False
        return True


async def _until(predicate: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate() and time.monotonic() < deadline:
        await asyncio.sleep(0.01)


def _fields(job: Job, outcome: str, duration_s: float | None = None) -> dict[str, Any]:
    return {"job_id": job.id, "tube": job.tube, "attempt": job.attempt, "outcome": outcome,
            "duration_s": duration_s}

