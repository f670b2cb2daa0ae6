"""A job as a handler sees it, and the pure rule that turns a handler's result into
the op that answers the broker.

Outcomes (decide): a handler that returns -> DELETE; `raise Retry` -> RELEASE with its
delay; `raise Bury` -> BURY; any other exception -> RELEASE after an exponential
backoff (`Backoff`), or BURY once the job has been tried `max_attempts` times.  The
attempt number is the broker's reserve count for the job (1 on first delivery), so it
survives worker restarts.  Everything here is pure and runs in the handler's thread.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

from .codecs import Codec
from .errors import Bury, Retry

DELETE, RELEASE, BURY = "delete", "release", "bury"
#: not run: the job waited in the pool for its whole TTR, so it is the broker's again
EXPIRED = "expired"


class Backoff(NamedTuple):
    """Release delay for attempt k: min(max_s, base_s * factor ** (k - 1)), whole seconds."""
    base_s: float = 1
    factor: float = 2
    max_s: int = 3600

    def delay_s(self, attempt: int) -> int:
        return int(min(self.max_s, self.base_s * self.factor ** max(0, attempt - 1)))


class Outcome(NamedTuple):
    action: str          # DELETE, RELEASE or BURY
    pri: int = 0
    delay_s: int = 0


class Job:
    """One job pushed to this pool.  `body` is decoded by the worker's codec on first use;
    `touch()` restarts its TTR and may be called from any thread."""
    __slots__ = ("id", "tube", "pri", "ttr_s", "attempt", "raw", "_codec", "_body",
                 "_touch", "started_at", "pushed_at")

    def __init__(self, job_id: int, raw: bytes, tube: str, pri: int, ttr_s: int,
                 attempt: int, codec: Codec, touch: Callable[[int], None]) -> None:
        self.id = job_id
        self.raw = raw
        self.tube = tube
        self.pri = pri
        self.ttr_s = ttr_s
        self.attempt = attempt
        self._codec = codec
        self._body: Any = _UNDECODED
        self._touch = touch
        self.started_at = 0.0
        self.pushed_at = 0.0        # monotonic time its TTR started: push, or last touch

    @property
    def body(self) -> Any:
        if self._body is _UNDECODED:
            self._body = self._codec.decode(self.raw)
        return self._body

    def touch(self) -> None:
        """Ask the broker to restart this job's TTR (fire and forget)."""
        self._touch(self.id)

    def __repr__(self) -> str:
        return f"Job(id={self.id}, tube={self.tube!r}, attempt={self.attempt})"


_UNDECODED: Any = object()


def decide(job: Job, exc: BaseException | None, max_attempts: int, backoff: Backoff) -> Outcome:
    """What to tell the broker about `job` after its handler returned (exc None) or raised."""
    if exc is None:
        return Outcome(DELETE)
    if isinstance(exc, Retry):
        return Outcome(RELEASE, job.pri if exc.pri is None else exc.pri, max(0, exc.delay_s))
    if isinstance(exc, Bury):
        return Outcome(BURY, job.pri if exc.pri is None else exc.pri)
    if job.attempt >= max_attempts:
        return Outcome(BURY, job.pri)
    return Outcome(RELEASE, job.pri, backoff.delay_s(job.attempt))


def may_start(job: Job, now: float) -> bool:
    """Whether a job taken from the pool's queue may still run: its TTR started when it
    was pushed, so one that waited all of it is the broker's again (skip it) and one
    that waited over half gets its TTR restarted first."""
    waited = now - job.pushed_at
    if waited >= job.ttr_s:
        return False
    if waited > job.ttr_s / 2:
        job.touch()
    return True
