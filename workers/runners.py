"""Where handlers run: sync handlers on N threads, async handlers as tasks on the loop.

Threads (ThreadRunner): the pool puts `(job, handler)` on one `queue.SimpleQueue` that N
threads pull from; each thread decides the outcome itself (job.decide) and appends it
to a shared list.  Only the first result of a burst wakes the loop
(`call_soon_threadsafe`); the loop then takes the whole list at once, so a busy pool
costs one wake-up per burst, not one per job, and its acks leave as one batch.

Tasks (AsyncRunner): at most N lanes, each a task awaiting handlers one after the
other while jobs wait in a deque; results of one loop turn go back together.
Both runners can hand back the jobs nobody started (`take_pending`, for shutdown).
"""
from __future__ import annotations

import asyncio
import collections
import queue
import threading
import time
from typing import Any, Awaitable, Callable, NamedTuple

from .job import EXPIRED, Job, Outcome, may_start


class Result(NamedTuple):
    job: Job
    outcome: Outcome
    duration_s: float
    error: BaseException | None


Decide = Callable[[Job, BaseException | None], Outcome]
Finish = Callable[[list[Result]], None]


def run_sync(job: Job, handler: Callable[[Job], Any], decide: Decide) -> Result:
    job.started_at = started = time.monotonic()
    if not may_start(job, started):
        return Result(job, Outcome(EXPIRED), 0.0, None)
    try:
        handler(job)
        error = None
    except BaseException as exc:     # the handler's failure is the job's outcome, not
        error = exc                  # ours (SystemExit too: it must not end the thread)
    return Result(job, decide(job, error), time.monotonic() - started, error)


class ThreadRunner:
    def __init__(self, threads: int, decide: Decide, finish: Finish) -> None:
        self.loop = asyncio.get_running_loop()
        self.decide = decide
        self.finish = finish
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.results: list[Result] = []
        self.lock = threading.Lock()
        self.wake_pending = False
        self.threads = [threading.Thread(target=self._work, name=f"zstalk-worker-{i}",
                                         daemon=True) for i in range(threads)]
        for t in self.threads:
            t.start()

    def submit(self, job: Job, handler: Callable[[Job], Any]) -> None:
        self.inbox.put((job, handler))

    def take_pending(self) -> list[Job]:
        pending: list[Job] = []
        while True:
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                return pending
            if item is None:            # keep a stop marker where it was
                self.inbox.put(None)
                return pending
            pending.append(item[0])

    def stop(self) -> None:
        """Threads end after their current handler (daemon threads: none blocks exit)."""
        for _ in self.threads:
            self.inbox.put(None)

    def _work(self) -> None:
        inbox, decide = self.inbox, self.decide
        while (item := inbox.get()) is not None:
            self._hand_back(run_sync(item[0], item[1], decide))

    def _hand_back(self, result: Result) -> None:
        with self.lock:
            self.results.append(result)
            if self.wake_pending:
                return
            self.wake_pending = True
        try:
            self.loop.call_soon_threadsafe(self._collect)
        except RuntimeError:          # the loop is closed: the pool is gone
            pass

    def _collect(self) -> None:
        with self.lock:
            results, self.results = self.results, []
            self.wake_pending = False
        self.finish(results)


class AsyncRunner:
    """At most `limit` lanes: each lane is one task that awaits handlers one after the
    other while jobs wait, so a burst costs no task per job; results of one loop turn
    go back together (one `finish` call per turn)."""

    def __init__(self, limit: int, decide: Decide, finish: Finish) -> None:
        self.limit = limit
        self.decide = decide
        self.finish = finish
        self.waiting: collections.deque = collections.deque()
        self.lanes: set[asyncio.Task] = set()
        self.results: list[Result] = []
        self._flush_scheduled = False

    def submit(self, job: Job, handler: Callable[[Job], Awaitable[Any]]) -> None:
        self.waiting.append((job, handler))
        if len(self.lanes) < self.limit:
            self.lanes.add(asyncio.get_running_loop().create_task(self._lane()))

    def take_pending(self) -> list[Job]:
        pending = [job for job, _ in self.waiting]
        self.waiting.clear()
        return pending

    def stop(self) -> None:
        """Cancel the handlers still running (their jobs were released already)."""
        for task in list(self.lanes):
            task.cancel()

    async def _lane(self) -> None:
        waiting, decide = self.waiting, self.decide
        try:
            while waiting:
                job, handler = waiting.popleft()
                job.started_at = started = time.monotonic()
                if not may_start(job, started):
                    self._hand_back(Result(job, Outcome(EXPIRED), 0.0, None))
                    continue
                try:
                    await handler(job)
                    error = None
                except asyncio.CancelledError as exc:
                    if asyncio.current_task().cancelling():     # type: ignore[union-attr]
                        raise           # this lane is being stopped
                    error = exc         # the handler awaited something cancelled
                except BaseException as exc:     # SystemExit too: a job's failure, not
                    error = exc                  # the pool's (asyncio would re-raise it)
                self._hand_back(Result(job, decide(job, error), time.monotonic() - started,
                                       error))
        finally:
            # at once, not in a done callback: a submit() right after must see the room
            self.lanes.discard(asyncio.current_task())  # type: ignore[arg-type]

    def _hand_back(self, result: Result) -> None:
        self.results.append(result)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        results, self.results = self.results, []
        self.finish(results)
