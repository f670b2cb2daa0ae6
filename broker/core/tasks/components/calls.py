"""The calls in flight: who holds each, and when it is given up on.

A running task's call is held by the dispatcher session it was handed to (`task.holder`),
or by RESTARTED when the broker found it running at a restart, until that dispatcher
re-registers and claims it.  Its deadline is its timeout plus CALL_GRACE_S (a dispatcher
that dies mid-call gives an unknown outcome then); a restarted call's is CLAIM_S after
the restart; a claimed one keeps the deadline it had (its timeout from when it started),
with at least the time a report takes to come back.

One timer lane, (deadline, seq); nothing here reads a clock or changes a task's status:
`overdue` names the first call whose time is up and `why`, `of` the calls a lost
dispatcher held, and the store ends them with an unknown outcome.
"""
from __future__ import annotations

from ..model.task import CALL_GRACE_S, CLAIM_S, RESTARTED, Task
from .deadlines import Deadlines


class Calls:
    __slots__ = ("timers",)

    def __init__(self) -> None:
        self.timers = Deadlines("calls")

    def start(self, task: Task, holder, now: float) -> None:
        task.holder = holder
        task.deadline = now + task.timeout_ms / 1000 + CALL_GRACE_S
        self.timers.add("calls", task.deadline, task.seq)

    def restarted(self, task: Task, now: float) -> None:
        """A call the journal says was running: it waits CLAIM_S for its dispatcher."""
        task.holder, task.deadline = RESTARTED, now + CLAIM_S
        self.timers.add("calls", task.deadline, task.seq)

    def claim(self, task: Task, holder, now: float) -> bool:
        """A re-registered dispatcher's claim of a restarted call (False: not one)."""
        if task.holder != RESTARTED:
            return False
        self.timers.remove("calls", task.deadline, task.seq)
        task.holder = holder
        # (a call that ended while we were down has its report on the way: it gets the
        # time a report takes to come back, as an unclaimed call gets to be claimed)
        task.deadline = max(now + CLAIM_S, task.started + task.timeout_ms / 1000 + CALL_GRACE_S)
        self.timers.add("calls", task.deadline, task.seq)
        return True

    def end(self, task: Task) -> None:
        self.timers.remove("calls", task.deadline, task.seq)
        task.holder = None

    def of(self, holder, by_seq) -> list[Task]:
        """The calls `holder` holds (`by_seq`: the tasks by seq)."""
        return [task for seq in self.timers.keys("calls")
                if (task := by_seq[seq]).holder is holder]

    def overdue(self, now: float) -> int | None:
        """The seq of the first call whose time is up (it stays until `end`)."""
        return self.timers.first("calls")[1] if self.timers.due("calls", now) else None

    @staticmethod
    def why(task: Task) -> str:
        """The error of a call given up on."""
        if task.holder != RESTARTED:
            return f"no report within the timeout ({task.timeout_ms} ms)"
        return ("the broker stopped during the call, and no dispatcher claimed it within "
                f"{CLAIM_S:g} s of the restart")

    def next_deadline(self) -> float | None:
        return self.timers.next_deadline()
