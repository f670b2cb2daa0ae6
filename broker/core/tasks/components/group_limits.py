"""Each group's own limits within its function (issue 44): `group_concurrency`, the calls
one group (tenant) may have at once, and `group_rate` / `group_burst`, a gate per group,
the function's own GCRA (limits.py's Gate: T = period / N, tau = T x burst, a start at
`now` iff now >= TAT - tau, then TAT = max(TAT, now) + T).  The broker is their one
owner, beside the function's own limits (limiter.py), so they hold across every
dispatcher.  A task without a group is in the group "", one group like the others.

A group is held back (`held`) while it has group_concurrency calls (calls in flight and
admitted online tasks) or its gate is shut; the rotation (rotation.py) passes it over
then, and it keeps its place.  A task's waitNum does not see them: it stays the number of
due tasks handed out before it if every group could start now (issue 44).  The ledger tells the lines when that changes: `started`
says whether a start held the group back, `ended` whether an end freed it, `opened` which
groups' gates opened by now (the "shut" timers, as the limiter's for a function's gate:
the broker's timer wakes then).  Only the functions whose spec has group limits are
counted, so one without them pays a truth test; a new config (SIGHUP) or a restart counts
the calls in flight again (`recount`).

What is kept stays bounded by the groups that have calls or started one lately: a count
goes at zero, and a gate whose TAT has passed (the "idle" timer, one per gate) is dropped,
since a fresh gate would be the same (GCRA's full burst; after a restart a fresh gate has
no burst credit for the time before the broker started, as the function's).  Group gates
are not kept across a restart.
"""
from __future__ import annotations

import math
from typing import Callable, Iterable

from ..model.spec import FunctionSpec
from .deadlines import Deadlines
from .limits import Gate

Key = tuple[str, str]               # (function, group)


class GroupLimits:
    def __init__(self, spec_of: Callable[[str], FunctionSpec | None],
                 started_at: float = -math.inf) -> None:
        self.spec_of = spec_of              # name -> its spec now (None: not configured)
        self.started_at = started_at        # (a fresh gate's burst: limiter.py)
        self.running: dict[Key, int] = {}   # calls in flight and admitted tasks
        self.gates: dict[Key, Gate] = {}
        self.shut_at: dict[Key, float] = {}  # when a shut gate opens (its "shut" timer)
        self.timers = Deadlines("shut", "idle")     # (opens at | TAT, key)

    def held(self, name: str, group: str) -> bool:
        """Whether `group` of function `name` may not start a call now."""
        if not self.running and not self.shut_at:
            return False
        key = (name, group)
        if key in self.shut_at:
            return True
        running = self.running.get(key)
        if not running:
            return False
        spec = self.spec_of(name)
        return spec is not None and 0 < spec.group_concurrency <= running

    def started(self, name: str, group: str, spec: FunctionSpec, now: float) -> bool:
        """A call of `group` starts (or an online task of it is admitted): it takes a slot
        and its gate's turn; True if the group is held back now."""
        if not spec.group_concurrency and not spec.group_rate:
            return False
        key = (name, group)
        self.running[key] = self.running.get(key, 0) + 1
        if spec.group_rate:
            gate = self.gates.get(key)
            fresh = gate is None
            if fresh:
                tau = spec.group_interval * spec.group_burst
                gate = self.gates[key] = Gate(spec.group_interval, spec.group_burst, now,
                                              tat=self.started_at + tau)
            gate.start(now)
            if fresh:                       # (one "idle" timer per gate: drop_idle)
                self.timers.add("idle", gate.tat, key)
            opens = gate.opens_at()
            if opens > now:
                self._shut(key, opens)
        return self.held(name, group)

    def _shut(self, key: Key, opens: float) -> None:
        old = self.shut_at.get(key)
        if old is not None:
            self.timers.discard("shut", old, key)
        self.shut_at[key] = opens
        self.timers.add("shut", opens, key)

    def ended(self, name: str, group: str) -> bool:
        """A call of `group` ended (or an admitted task's slot is free); True if the group
        may start again (it may not have been held back)."""
        if not self.running:
            return False                    # (not counted: no group limits)
        key = (name, group)
        running = self.running.get(key)
        if running is None:
            return False
        if running > 1:
            self.running[key] = running - 1
        else:
            del self.running[key]
        return not self.held(name, group)

    def opened(self, now: float) -> list[Key]:
        """The groups whose gate has opened by `now` and that may start now."""
        keys = []
        while self.timers.due("shut", now):
            _, key = self.timers.pop("shut")
            del self.shut_at[key]
            if not self.held(*key):
                keys.append(key)
        return keys

    def drop_idle(self, now: float) -> None:
        """Drop the gates whose TAT has passed (a fresh one would be the same)."""
        while self.timers.due("idle", now):
            _, key = self.timers.pop("idle")
            gate = self.gates.get(key)
            if gate is not None:
                if gate.tat <= now:
                    del self.gates[key]
                else:
                    self.timers.add("idle", gate.tat, key)

    def recount(self, running: Iterable[Key], now: float) -> set[Key]:
        """A new config or a restart: the calls in flight counted again (`running`: the
        (function, group) of each, whatever its spec), each gate takes its function's new
        group rate (keeping its TAT), shut gates open or shut anew; the groups whose being
        held back may have changed."""
        changed = {*self.running, *self.shut_at}
        self.running = {}
        for name, group in running:
            spec = self.spec_of(name)
            if spec is not None and (spec.group_concurrency or spec.group_rate):
                self.running[name, group] = self.running.get((name, group), 0) + 1
        for key, gate in self.gates.items():
            spec = self.spec_of(key[0])
            rated = spec is not None and spec.group_rate
            gate.configure(spec.group_interval if rated else 0.0,
                           spec.group_burst if rated else 0)
        for key in list(self.shut_at):
            self.timers.discard("shut", self.shut_at.pop(key), key)
            gate = self.gates.get(key)
            if gate is not None and gate.opens_at() > now:
                self._shut(key, gate.opens_at())
        return changed | set(self.running)

    def seen(self, name: str, group: str) -> tuple[int, Gate | None]:
        """A group's calls at once and its gate, as the views read them."""
        return self.running.get((name, group), 0), self.gates.get((name, group))

    def next_deadline(self) -> float | None:
        return self.timers.next_deadline()
