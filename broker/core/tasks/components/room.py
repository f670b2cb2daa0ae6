"""The waiting room: online tasks, whose users wait in their function's line until their
turn, then hold a slot of its concurrency and a signed pass until they are done or the
pass expires (the HTTP front signs it: protocol/fronts/http/room.py).  This component
counts who waits and who is admitted per function, bounds how many online tasks one
client address may keep waiting (`refusal`), and keeps two timers per task: when its pass
expires, and when to look again whether its user still looks (an online task nobody
looked at within its function's heartbeat is abandoned).  It ends no task itself: `expired`
and `abandoned` return the tasks whose time is up, and the waiting room's flow (waiting.py)
ends them.
"""
from __future__ import annotations

from typing import Callable, Iterator

from ..model.options import bad
from ..model.spec import DEFAULTS, FunctionSpec
from ..model.task import Task, TaskError, client_net
from .deadlines import Deadlines

#: a liveness check waiting.py could not log (the journal is full): looked at again after
LOOK_AGAIN_S = 1.0


class Room:
    def __init__(self) -> None:
        self.timers = Deadlines("passes", "liveness")   # (pass expires | look at, seq)
        self.waiting_by: dict[tuple[str, str], int] = {}    # (function, client) -> waiting
        self.counts: dict[str, list[int]] = {}  # function -> [online waiting, admitted]

    def refusal(self, spec: FunctionSpec, options: dict, online: bool,
                client_ip: str | None) -> TaskError | None:
        """Why an enqueue may not join (or skip) `spec`'s room; None: it may."""
        if not online:
            return bad(f"{spec.name!r} takes online tasks only (\"type\": \"online\")") \
                if spec.online == "only" else None
        if "uniqueId" in options:
            return bad("an online task gets a server-made uniqueId (its id is its user's "
                       "key to it): give none")
        net = client_net(client_ip)
        if net is not None and self.waiting_by.get((spec.name, net), 0) >= (
                spec.max_waiting_per_client):
            return TaskError("too_many_waiting", f"at most {spec.max_waiting_per_client} "
                             f"online tasks of {spec.name!r} may wait per client address")
        return None

    def _count(self, name: str, which: int, change: int) -> None:
        counts = self.counts.setdefault(name, [0, 0])
        counts[which] += change
        if counts == [0, 0]:
            del self.counts[name]

    def join(self, task: Task, spec: FunctionSpec | None, now: float) -> None:
        """A queued online task waits (a new one, or one a restart brought back)."""
        self._count(task.function, 0, 1)
        self.timers.add("liveness", now + (spec or DEFAULTS).heartbeat_ms / 1000, task.seq)
        net = client_net(task.client_ip)
        if net is not None:
            key = (task.function, net)
            self.waiting_by[key] = self.waiting_by.get(key, 0) + 1

    def leave(self, task: Task) -> None:
        """It waits no more (admitted, cancelled, abandoned, failed)."""
        self._count(task.function, 0, -1)
        net = client_net(task.client_ip)
        key = (task.function, net)
        if net is not None and key in self.waiting_by:
            self.waiting_by[key] -= 1
            if not self.waiting_by[key]:
                del self.waiting_by[key]

    def admitted(self, task: Task) -> None:
        """Its turn came: it holds a slot until its pass expires (task.pass_exp)."""
        self.timers.add("passes", task.pass_exp, task.seq)
        self._count(task.function, 1, 1)

    def released(self, task: Task) -> None:
        """An admitted task's slot is free (done, its pass expired, cancelled)."""
        self.timers.discard("passes", task.pass_exp, task.seq)
        self._count(task.function, 1, -1)

    @staticmethod
    def seen(task: Task, now: float) -> None:
        """Its user looked at a queued online task: it keeps its place."""
        task.last_seen = now

    def expired(self, now: float) -> Iterator[int]:
        """The seqs of admitted tasks whose pass has expired (their slots: `released`)."""
        while self.timers.due("passes", now):
            yield self.timers.pop("passes")[1]

    def abandoned(self, now: float, queued: Callable[[int], Task | None],
                  spec_of: Callable[[str], FunctionSpec | None]) -> Iterator[Task]:
        """The queued online tasks nobody looked at within their heartbeat, one at a time
        (a caller that stops leaves the rest for later); one looked at since is checked
        again a heartbeat after that.  `queued(seq)` is the task if it is still queued."""
        while self.timers.due("liveness", now):
            _, seq = self.timers.pop("liveness")
            task = queued(seq)
            if task is None:
                continue
            heartbeat = (spec_of(task.function) or DEFAULTS).heartbeat_ms / 1000
            if task.last_seen + heartbeat > now:        # looked at since: check again then
                self.timers.add("liveness", task.last_seen + heartbeat, seq)
                continue
            yield task

    def look_again(self, task: Task, now: float) -> None:
        """`abandoned` returned it, but waiting.py could not end it now (the journal is
        full): it is looked at again a little later."""
        self.timers.add("liveness", now + LOOK_AGAIN_S, task.seq)

    def next_deadline(self) -> float | None:
        return self.timers.next_deadline()
