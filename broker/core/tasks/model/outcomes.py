"""What a call's outcome does to its task: one pure rule, `decide`, in the manner of
workers/job.py's (the store carries it out).

    declined                    back in line as it was, due now, no attempt spent
    never sent (a plain url     back in its place, due now, no attempt spent: its host
    whose function counts       is counted (hosts.py), and while it is shut the
    failures: `waits`)          function's tasks wait
    success                     succeed, keeping the result
    a 429                       back in its place, no attempt spent; the function pauses
    a 503 (a failure)           the function pauses; the attempt is spent as any failure's
    fatal                       fail: the call ran, its result cannot be kept, so calling
                                again would run the function again
    unknown, atMostOnce         fail, saying the outcome was unknown
    a failure or unknown with   retry: after its backoff, or the server's Retry-After if
    attempts left               that is later (`attempts` counts retries)
    otherwise                   fail

A 429 or 503 on a function behind an upstream pauses that server, not the function
(upstream_calls.py), when it came with a Retry-After.  The report of a call aborted by a
cancel changes nothing but `possibly_executed` (`after_abort`).
"""
from __future__ import annotations

from typing import Callable, NamedTuple

from .....protocol.schema.tasks import AT_MOST_ONCE, FAILED
from .task import TASK_ERROR_CHARS, Outcome, Task

#: status codes that say "slow down": the function pauses (see the module's comment)
SLOW_DOWN = frozenset({429, 503})
#: the outcomes of a call that did not succeed ("declined": it was never made)
FAILED_KINDS = frozenset({"failure", "unknown", "fatal"})
#: what `decide` says to do
SUCCEED, REQUEUE, RETRY, FAIL = "succeed", "requeue", "retry", "fail"


class Action(NamedTuple):
    do: str                     # SUCCEED, REQUEUE (no attempt spent), RETRY or FAIL
    error: str | None = None    # the task's error from now on
    wait_ms: int = 0            # RETRY: after this long
    pause: bool = False         # the function (or its server) was told to slow down


def decide(result: Outcome, task: Task, rand: Callable[[], float],
           waits: bool = False) -> Action:
    """What `result` of `task`'s current call does to it (`rand`: a backoff's jitter;
    `waits`: a call that never reached its host puts the task back in its place)."""
    if result.kind == "declined":
        return Action(REQUEUE, task.error)
    if result.kind == "success":
        return Action(SUCCEED)
    error = (result.error or "the call failed")[:TASK_ERROR_CHARS]
    if waits and never_sent(result):
        return Action(REQUEUE, error)
    pause = result.status_code in SLOW_DOWN and result.kind == "failure"
    if pause and result.status_code == 429:
        return Action(REQUEUE, error, pause=True)
    if result.kind == "fatal":
        return Action(FAIL, error, pause=pause)
    if result.kind == "unknown" and task.delivery == AT_MOST_ONCE:
        return Action(FAIL, f"outcome unknown, not retried (atMostOnce): {error}"[
            :TASK_ERROR_CHARS], pause=pause)
    if task.attempt <= task.attempts:
        wait_ms = max(task.backoff.wait_ms(task.attempt, rand), max(result.retry_after_ms, 0))
        return Action(RETRY, error, wait_ms, pause)
    return Action(FAIL, error, pause=pause)


def never_sent(result: Outcome) -> bool:
    """Whether a call's request surely never reached its host: a failure with no status
    that the dispatcher says is a connection's error or timeout (it reports one only when
    aiohttp could not connect: workers/upstream/dispatcher.py; a dispatcher before schema 4 says
    no such thing, and its calls spend attempts as they did)."""
    return result.kind == "failure" and result.status_code is None and bool(result.failure)


def after_abort(task: Task, result: Outcome) -> None:
    """A report on the aborted call of cancelled `task` (store.cancel): it stays cancelled,
    but a success says the function ran, and for an atMostOnce task any report but one of
    a call that never reached its host says it may have (`possibly_executed`, journaled
    by the store as a whole record; a restart forgets which call was aborted)."""
    task.aborted = 0                    # (one report per call: a resent one is the same)
    if result.kind == "success" or task.delivery == AT_MOST_ONCE and not (
            result.kind == "declined" or never_sent(result)):
        task.possibly_executed = True


def failed_call(task: Task, attempt: int, result: Outcome, url: str, now: float) -> tuple:
    """The log line of a call that did not succeed, as (format, *args), once its outcome
    was applied: its function, URL, status or error, and what became of the task."""
    if task.status == FAILED:
        then = "the task failed"
    elif result.status_code == 429:
        then = "the task keeps its place while the function pauses"
    elif task.attempt < attempt:
        then = "it never reached the host: the task keeps its place, no attempt spent"
    else:
        then = f"retried in {round(max(0.0, task.due - now), 3):g} s"
    return ("function %s: a call to %s failed: %s (task %s, attempt %d: %s)", task.function,
            url, result.error or f"HTTP {result.status_code}", task.uid, attempt, then)
