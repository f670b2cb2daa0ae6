"""Next upstream within an attempt: a failed call on a server of an upstream moves to
another server for the same attempt (core/upstreams/next.py has nginx's rule), so a
server that refuses or times out costs its tasks no attempt.

The store asks `after(task, peer, result, now)` once the call's end was counted against
its server; True means the call goes on:

- at once: a server the attempt has not tried is picked (group.py `pick(..., tried)`), the
  call takes the function's and the upstream's rate turns (not its group's: a group's
  limits count attempts), keeps the concurrency slot it had (the function's `running`
  never drops; the upstream's own count drops with the failed call and rises with the
  move) and its dispatcher, and gets a fresh
  deadline (calls.py: its timeout anew); the task waits in `ready` for its T_CALL, which
  says the move's number (task_messages.Call "move") so a late report of an earlier
  server's call is told apart;
- later: a rate gate is shut, so the move waits, holding its slot, until the gate opens;
  if that is not before `next_upstream_timeout` after the attempt's first call, it does
  not wait and the attempt ends now.  When the time comes (`due`) the gates are asked
  again, and a move that finds no server then ends its attempt with the outcome that
  started it (the store does that: `due` hands the outcome back).

False: the attempt ends as it would have without moves (outcomes.py decides).  The task's
`tried` holds every server of its current attempt in order, shown as `upstreamAddr`
("a, b, c", nginx's $upstream_addr).  Nothing of a move is journaled: the attempt is
the same, and a restart finds the task running as it finds any call.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from ....protocol.schema.tasks import AT_MOST_ONCE, RUNNING
from ..upstreams.next import failure_class, may_move
from .components.deadlines import Deadlines

if TYPE_CHECKING:
    from ....protocol.schema.outcome import Outcome
    from .components.calls import Calls
    from .components.limiter import Limiter
    from .components.upstream_calls import UpstreamCalls
    from .model.spec import FunctionSpec
    from .model.task import Task


class Moves:
    __slots__ = ("upstream", "limits", "inflight", "function", "timers", "waiting", "ready")

    def __init__(self, upstream: UpstreamCalls, limits: Limiter, inflight: Calls,
                 function: Callable[[str], FunctionSpec | None]) -> None:
        self.upstream, self.limits, self.inflight = upstream, limits, inflight
        self.function = function
        self.timers = Deadlines("moves")
        # seq -> (when, (upstream, the server that failed), its outcome)
        self.waiting: dict[int, tuple[float, tuple, Outcome]] = {}
        self.ready: list[Task] = []         # moved: their T_CALLs go out next

    def after(self, task: Task, peer: tuple, result: Outcome, now: float) -> bool:
        """Whether `task`'s failed call on `peer` (upstream, server) goes on to another
        server."""
        spec = self.function(task.function)
        upstream = peer[0]
        group = self.upstream.groups.get(upstream)
        if spec is None or group is None or task.started is None:
            return False
        klass = failure_class(result.kind, result.failure, result.status_code)
        if not may_move(spec.next_upstream, klass, result.sent, task.delivery == AT_MOST_ONCE,
                        len(task.tried), group.tries(spec.next_upstream_tries), task.started,
                        spec.next_upstream_timeout_ms / 1000, now):
            return False
        return self._when_open(task, spec, peer, result, now)

    def _when_open(self, task: Task, spec: FunctionSpec, peer: tuple, result: Outcome,
                   now: float) -> bool:
        opens = self.limits.move_opens_at(task.function, spec, now)
        if opens <= now:
            return self._go(task, spec, peer[0], now)
        timeout_s = spec.next_upstream_timeout_ms / 1000
        if timeout_s and opens >= task.started + timeout_s:
            return False
        self.waiting[task.seq] = (opens, peer, result)
        self.timers.add("moves", opens, task.seq)
        holder = task.holder                # (its deadline: the timeout from when it goes)
        self.inflight.end(task)
        self.inflight.start(task, holder, opens)
        return True

    def _go(self, task: Task, spec: FunctionSpec, upstream: str, now: float) -> bool:
        group = self.upstream.groups.get(upstream)
        if group is None:
            return False
        tried = [peer for peer in group.peers if peer.url in task.tried]
        peer = group.pick(task.balance_key, now, tried)
        if peer is None:
            return False
        self.limits.moved(task.function, spec, now)
        self.upstream.started(upstream, now)
        task.peer, task.tried = (upstream, peer), (*task.tried, peer.url)
        holder = task.holder
        self.inflight.end(task)
        self.inflight.start(task, holder, now)
        self.ready.append(task)
        return True

    def due(self, now: float, by_seq: dict) -> list[tuple[Task, Outcome, tuple]]:
        """The waiting moves whose time came: each goes now, waits again, or is handed
        back with the outcome that ends its attempt and the server it came from."""
        ended = []
        while self.timers.due("moves", now):
            _, seq = self.timers.pop("moves")
            task = by_seq.get(seq)
            waiting = self.waiting.pop(seq, None)
            if task is None or waiting is None or task.status != RUNNING:
                continue
            _, peer, result = waiting
            spec = self.function(task.function)
            if spec is None or not self._when_open(task, spec, peer, result, now):
                ended.append((task, result, peer))
        return ended

    def is_waiting(self, task: Task) -> bool:
        return task.seq in self.waiting

    def drop(self, task: Task) -> None:
        """`task`'s call ended otherwise (its dispatcher went away, its deadline passed)."""
        waiting = self.waiting.pop(task.seq, None)
        if waiting is not None:
            self.timers.discard("moves", waiting[0], task.seq)

    def take_ready(self) -> list[Task]:
        ready, self.ready = self.ready, []
        return [task for task in ready if task.status == RUNNING and task.peer is not None]

    def next_deadline(self) -> float | None:
        return self.timers.next_deadline()
