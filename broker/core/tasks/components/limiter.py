"""Whether a function may start a call now, and when it may: its concurrency (calls in
flight, and the slots counter clients hold through fn:NAME, counters.py), its gate (a
rate and the pauses a 429 or 503 asked for: limits.py's Gate, GCRA), its upstream's own
concurrency and rate (upstream_calls.py), and whether its upstream has a usable server at
all (`blocked`).  `opens_at` folds them into one answer for the lines (lines.py): now, a
time (the limiter's timer says when that comes: `opened`), or None (the function is
offered again when a call ends: a slot frees, a server comes back; an operator's pause,
`stopped`, until it is lifted).  How a call ended
feeds them: `slow_down` pauses a function a 429 or 503 came from, `server_done` does the
server's accounting and says which functions may look for a server again, `host_done`
the same of a plain url's host (hosts.py: while it fails, `host_pick` blocks its
functions until its probe may go), and `server_aborted` frees a server's call that was
aborted, counting nothing against it.

It also keeps what the estimates read (`recent`: starts and ends of the last minutes,
limits.Recent), the most in use per counters' interval (`peaks`), and which slow rates'
TATs must survive a restart (`durable_gates`, DURABLE_RATE_S: a crash loop must not
exceed a rate of one call a minute; the journal keeps them, core/shared/journal.py GATES).
A new rate (SIGHUP) keeps the TAT and applies from the next start; a gate no task uses is
dropped once it holds nothing back.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable, NamedTuple

from .....protocol.schema.outcome import Outcome
from ..model.outcomes import SLOW_DOWN
from ..model.spec import DEFAULTS, FunctionSpec
from .deadlines import Deadlines
from .hosts import Hosts
from .limits import Gate, Recent
from .upstream_calls import UpstreamCalls, failed as server_failed

if TYPE_CHECKING:
    from ...upstreams.peer import Peer

#: a rate this slow or slower (its T, seconds) keeps its TAT across a restart
DURABLE_RATE_S = 1.0


def counts_against(spec: FunctionSpec, result: Outcome) -> bool:
    """Whether a call's end counts as its server's (or host's) failure: as the function's
    next_upstream says; never a success, nor the broker's own verdict (failure "": a
    dispatcher gone, no report in time), which is no server's fault."""
    return result.kind != "success" and result.failure != "" and server_failed(
        spec.next_upstream, result.kind, result.status_code)


class Seen(NamedTuple):
    """What the views read of one function's limits (None: it has none yet)."""
    gate: Gate | None
    recent: Recent | None
    running: int                # calls in flight and admitted online tasks
    held: int                   # slots counter clients hold


class Limiter:
    def __init__(self, upstream: UpstreamCalls, spec_of: Callable[[str], FunctionSpec | None],
                 started_at: float = -math.inf) -> None:
        self.upstream = upstream
        self.spec_of = spec_of              # name -> its spec now (None: not configured)
        # when the broker started: a gate gets no burst credit for the time before it, so
        # a crash loop cannot exceed a rate (limits.py)
        self.started_at = started_at
        self.gates: dict[str, Gate] = {}
        self.recent: dict[str, Recent] = {}
        self.running: dict[str, int] = {}   # function -> calls in flight, admitted tasks
        self.held: dict[str, int] = {}      # function -> slots counter clients hold
        self.peaks: dict[str, int] = {}     # most in use since the counters' interval began
        # functions no server of their upstream can take now: until when (inf: until a
        # call on that upstream ends)
        self.blocked: dict[str, float] = {}
        self.gates_changed = False          # a slow rate's TAT moved since durable_gates()
        self.timers = Deadlines("shut", "idle")     # (opens at | drop at, function)
        self.shut_at: dict[str, float] = {}         # function -> its timer in "shut"
        self.hosts = Hosts()                # plain urls' hosts that fail (hosts.py)
        # functions an operator paused (PATCH /v1/functions/{name}): none starts a call
        # until resumed, which offers it again (store.pause_function); durable, unlike a
        # gate's pause (the journal's FUNCTION_PAUSE)
        self.stopped: set[str] = set()

    def seen(self, name: str) -> Seen:
        """A function's limits as the views read them, creating nothing."""
        return Seen(self.gates.get(name), self.recent.get(name), self.running.get(name, 0),
                    self.held.get(name, 0))

    # -- what holds a function back ------------------------------------------------------
    def in_use(self, name: str) -> int:
        """What counts against a function's concurrency: its calls in flight (and admitted
        online tasks) and the slots counter clients hold."""
        used = self.running.get(name, 0)
        return used + self.held.get(name, 0) if self.held else used

    def opens_at(self, name: str, spec: FunctionSpec, now: float) -> float | None:
        """When function `name` may start a call: now or earlier (0: no gate), a later
        time, or None when only a call's end (a slot, a server) or a resume can open it."""
        if self.in_use(name) >= spec.concurrency or self.stopped and name in self.stopped:
            return None
        gate = self.gates.get(name)
        opens = gate.opens_at() if gate is not None else 0.0
        upstream = spec.upstream
        if upstream is not None and upstream in self.upstream.limited:
            if self.upstream.full(upstream):        # its upstream's own limits
                self.upstream.waiting.setdefault(upstream, set()).add(name)
                return None                         # (offered again when a call there ends)
            opens = max(opens, self.upstream.opens_at(upstream, now))
        if self.blocked:                            # no server of its upstream is usable
            blocked = self.blocked.get(name, 0.0)
            if blocked > now:
                if blocked == math.inf:
                    return None
                opens = max(opens, blocked)
            else:
                self.blocked.pop(name, None)
        return opens

    def may_start(self, name: str, spec: FunctionSpec | None, now: float) -> bool:
        if spec is None or self.in_use(name) >= spec.concurrency or (
                self.stopped and name in self.stopped):
            return False
        upstream = spec.upstream
        if upstream is not None and upstream in self.upstream.limited and (
                self.upstream.full(upstream) or self.upstream.opens_at(upstream, now) > now):
            return False
        gate = self.gates.get(name)
        return gate is None or gate.opens_at() <= now

    def shut(self, name: str, opens: float) -> None:
        """`name` waits for its gate to open at `opens` (the earliest such time is kept)."""
        if self.shut_at.get(name, math.inf) > opens:
            old = self.shut_at.get(name)
            if old is not None:
                self.timers.discard("shut", old, name)
            self.shut_at[name] = opens
            self.timers.add("shut", opens, name)

    def opened(self, now: float) -> list[str]:
        """The functions whose gate has opened by `now` (to be offered again)."""
        names = []
        while self.timers.due("shut", now):
            _, name = self.timers.pop("shut")
            self.shut_at.pop(name, None)
            names.append(name)
        return names

    def block(self, name: str, until: float) -> None:
        """No server of its upstream can take `name` until then (inf: until a call ends)."""
        self.blocked[name] = until

    # -- calls -----------------------------------------------------------------------------
    def gate(self, name: str, now: float) -> Gate:
        gate = self.gates.get(name)
        if gate is None:
            spec = self.spec_of(name)
            interval, burst = (spec.interval, spec.burst) if spec else (0.0, 0)
            gate = self.gates[name] = Gate(interval, burst, now,
                                           tat=self.started_at + interval * burst)
        return gate

    def started(self, name: str, spec: FunctionSpec, now: float) -> None:
        """A call of `name` starts (or an online task is admitted): it takes a slot, its
        gate's turn, and counts as a start."""
        self.moved(name, spec, now)
        self.recent_of(name).started(now)
        self.running[name] = self.running.get(name, 0) + 1
        self._peak(name)

    def moved(self, name: str, spec: FunctionSpec, now: float) -> None:
        """A call of `name` goes to a server (it starts, or moves to the next one within
        its attempt: tasks/moves.py): its gate's turn.  A move keeps its slot."""
        if name in self.gates or spec.rate:
            gate = self.gate(name, now)
            gate.start(now)
            if gate.interval >= DURABLE_RATE_S:
                self.gates_changed = True

    def move_opens_at(self, name: str, spec: FunctionSpec, now: float) -> float:
        """When a call of `name` may move to the next server: its gate and its upstream's
        rate (its slot it keeps: concurrency does not hold it back)."""
        gate = self.gates.get(name)
        opens = gate.opens_at() if gate is not None else 0.0
        if spec.upstream is not None:
            opens = max(opens, self.upstream.opens_at(spec.upstream, now))
        return opens

    def ended(self, name: str) -> None:
        """A call of `name` ended (or an admitted task's slot is free)."""
        self.running[name] -= 1
        if not self.running[name]:
            del self.running[name]

    def succeeded(self, name: str) -> None:
        gate = self.gates.get(name)
        if gate is not None:
            gate.succeeded()

    def pause(self, name: str, spec: FunctionSpec | None, now: float, started: float,
              retry_after_s: float | None, why: str) -> None:
        """A 429 or 503: the function pauses (limits.Gate.pause)."""
        self.gate(name, now).pause(now, started, retry_after_s,
                                   (spec or DEFAULTS).max_pause_ms / 1000, why)

    def slow_down(self, name: str, spec: FunctionSpec | None, started: float,
                  result: Outcome, now: float) -> None:
        """A 429 or 503 from a call of `name` started at `started`: the function pauses,
        or, behind an upstream and with a Retry-After, only that server (server_done)."""
        retry_after = None if result.retry_after_ms < 0 else result.retry_after_ms / 1000
        if spec is not None and spec.upstream is not None and retry_after is not None:
            return
        said = "" if retry_after is None else f", Retry-After {retry_after:g} s"
        self.pause(name, spec, now, started, retry_after,
                   f"the function answered {result.status_code}{said}")

    def server_done(self, upstream: str, peer: Peer, spec: FunctionSpec | None,
                    result: Outcome, now: float) -> set[str]:
        """A call on `peer` of `upstream` ended: nginx's accounting (whether it counts as
        the server's failure is the function's `next_upstream`), a 429 / 503 with
        Retry-After pauses that server; the functions that may look for a server again
        (held back by the upstream's limits, or blocked with none usable)."""
        counted = spec is not None and counts_against(spec, result)
        if result.status_code in SLOW_DOWN and result.retry_after_ms >= 0:
            self.upstream.pause(upstream, peer, now + result.retry_after_ms / 1000)
        again = self.upstream.done(upstream, peer, counted,
                                   result.error if counted else None, now)
        blocked = self.blocked
        if blocked:
            again = {*again, *(n for n in blocked
                               if getattr(self.spec_of(n), "upstream", None) == upstream)}
            for name in again:
                blocked.pop(name, None)
        return again

    def server_aborted(self, upstream: str, peer: Peer) -> set[str]:
        """A call on `peer` was aborted (its task cancelled while it ran): one call fewer on
        the server and its upstream, and nothing counted for or against the server (it
        did not answer, nor fail to); the functions that may look for a server again."""
        group = self.upstream.groups.get(upstream)
        if group is not None and peer in group.peers:
            group.release(peer)
        else:
            peer.conns = max(0, peer.conns - 1)     # (a server reloaded away meanwhile)
        return self.unblock(lambda spec: spec.upstream == upstream,
                            self.upstream.ended(upstream))

    # -- a plain url's host (hosts.py) ------------------------------------------------------
    def host_pick(self, name: str, spec: FunctionSpec, now: float) -> bool:
        """Whether a call of `name` may go to its host now (on a failing host: the probe);
        if not, the function is blocked until the host's probe may go (the caller offers
        it again, which arms the timer).  Asked only while some host fails (store.take)."""
        if not spec.max_fails:
            return True
        until = self.hosts.pick(spec, now)
        if until is None:
            return True
        self.block(name, until)
        return False

    def host_done(self, spec: FunctionSpec, result: Outcome, now: float) -> set[str] | tuple:
        """A call on a plain url's host ended: its accounting; the functions that host
        blocked, if it is usable again.  A failure counts as next_upstream says; a call
        the host answered is a good one; any other end says nothing of the host (declined,
        never made; the broker's own verdict, a dispatcher gone; a report that does not
        say how it failed, from a dispatcher before schema 4, which spends its attempt
        and shuts nothing, as before)."""
        if result.kind == "success" and not self.hosts.failing:
            return ()                       # (the hot path: every host is well)
        answered = result.kind == "success" or result.status_code is not None
        failed = counts_against(spec, result) and (answered or bool(result.failure))
        if not (failed or answered):
            return ()
        origin = self.hosts.done(spec, failed, now)
        if origin is None or not self.blocked:
            return ()
        hosts = self.hosts
        return self.unblock(lambda other: other.upstream is None and other.max_fails > 0
                            and hosts.origin(other.url) == origin)

    def unblock(self, on: Callable[[FunctionSpec], bool], also=()) -> set[str]:
        """The blocked functions whose spec `on` says may look for a server again (and
        `also`), no longer blocked."""
        again = set(also)
        if self.blocked:
            for name in [n for n in self.blocked if (s := self.spec_of(n)) is not None and on(s)]:
                del self.blocked[name]
                again.add(name)
        return again

    def recent_of(self, name: str) -> Recent:
        recent = self.recent.get(name)
        if recent is None:
            recent = self.recent[name] = Recent()
        return recent

    # -- counter clients (fn:NAME) ---------------------------------------------------------
    def hold(self, name: str, slots: int) -> bool:
        """A counter client takes `slots` of function `name`: all of them if its
        concurrency has room, else none (nothing waits)."""
        spec = self.spec_of(name)
        if spec is None or self.in_use(name) + slots > spec.concurrency:
            return False
        self.rehold(name, slots)
        return True

    def rehold(self, name: str, slots: int) -> None:
        """Slots a counter client holds, unchecked (its front re-registered them)."""
        self.held[name] = self.held.get(name, 0) + slots
        self._peak(name)

    def unhold(self, name: str, slots: int) -> None:
        left = self.held.get(name, 0) - slots
        if left > 0:
            self.held[name] = left
        else:
            self.held.pop(name, None)

    def _peak(self, name: str) -> None:
        used = self.in_use(name)
        if used > self.peaks.get(name, 0):
            self.peaks[name] = used

    # -- config, restarts, idle gates ------------------------------------------------------
    def configure(self) -> None:
        """A new config: every gate takes its function's new rate (keeping its TAT)."""
        self.blocked.clear()
        for name, gate in self.gates.items():
            spec = self.spec_of(name)
            if spec is not None:
                gate.configure(spec.interval, spec.burst)

    def restore_gates(self, saved: dict[str, float], wall_offset: float, now: float) -> None:
        """The slow rates' TATs a journal kept (function -> wall-clock seconds): each
        function still rated gets its gate from there, so a restart gives no call its rate
        would not (a gate no task uses is dropped once it has nothing to hold back)."""
        for name, tat in saved.items():
            spec = self.spec_of(name)
            if spec is None or not spec.rate:
                continue
            gate = self.gate(name, now)
            most = now + spec.interval * (spec.burst + 1)   # the furthest GCRA can set it
            gate.tat = max(gate.tat, min(tat - wall_offset, most))
            self.timers.add("idle", gate.holds_until(spec.max_pause_ms / 1000), name)

    def durable_gates(self, wall_offset: float, now: float) -> dict[str, float]:
        """What the journal keeps of the gates: each slow rate's TAT (T >= DURABLE_RATE_S)
        still ahead of now, as wall-clock seconds."""
        self.gates_changed = False
        return {name: gate.tat + wall_offset for name, gate in self.gates.items()
                if gate.interval >= DURABLE_RATE_S and gate.tat > now}

    def forget(self, name: str, spec: FunctionSpec | None, now: float) -> None:
        """No task uses `name` any more: drop what is kept for it, but a gate that still
        holds something back (a TAT ahead of now, a pause, a backoff to double)."""
        self.recent.pop(name, None)
        if name not in self.held:
            self.peaks.pop(name, None)
        gate = self.gates.get(name)
        if gate is not None:
            until = gate.holds_until((spec or DEFAULTS).max_pause_ms / 1000)
            if until <= now:
                del self.gates[name]
            else:                           # (dropped then, unless used again: expire)
                self.timers.add("idle", until, name)

    def drop_idle(self, now: float, in_use: Callable[[str], bool]) -> None:
        """Drop the gates whose time to go has come, of functions no task uses now."""
        while self.timers.due("idle", now):
            _, name = self.timers.pop("idle")
            gate = self.gates.get(name)
            if not in_use(name) and gate is not None:
                spec = self.spec_of(name)
                if gate.holds_until((spec or DEFAULTS).max_pause_ms / 1000) <= now:
                    del self.gates[name]

    def next_deadline(self) -> float | None:
        return self.timers.next_deadline()
