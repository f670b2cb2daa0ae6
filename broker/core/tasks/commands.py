"""The broker's side of cloud tasks: the sessions of HTTP fronts and dispatchers, and the
handlers of their ops, as one component of the Broker (core/broker.py).

An HTTP front sends T_ENQUEUE / T_INFO / T_CANCEL / T_LIST on one session and gets
T_TASK, T_LIST or T_ERROR back (and T_POSITIONS, the places its event streams follow,
answered T_POSITIONS; V_FUNCTIONS, an operator's page of functions searched and sorted
across all of them, answered V_PAGE); a dispatcher's session has `slots`, the calls it can
take now: T_SUBSCRIBE sets them (or says it is stopping: outcomes free none), each pushed
T_CALL takes one and each T_OUTCOME gives it back.  The task store (store.py) decides
everything else; whatever frees a function's slot or makes a task due feeds the
dispatchers, one call each in turn.

Request tasks (requests.py) come in T_ENQUEUE's ext as {"request": {...}}, from the
master key only; their T_CALL carries an ext with the method and headers, and a
dispatcher of a schema older than 4 (which would POST the body instead) is never handed
one: `old_peers`, filled by the actor as it decodes, says who speaks what.  Nor does a
dispatcher older than NEXT_UPSTREAM_SINCE get a failed call moved to the next server of
its upstream (moves.py): the T_CALL of a move goes to the dispatcher whose call failed,
in the slot that call held (its T_OUTCOME frees none).

A T_CANCEL of a running task cancels it at once and pushes R.T_ABORT to the dispatcher
making its call (schema ABORT_SINCE or later; an older one is sent nothing and its call
runs on): the dispatcher's slot comes back with that call's T_OUTCOME, as always.

Active health checks (components/health_probes.py): each checked server is given to one
live dispatcher of schema HEALTH_CHECKS_SINCE or later, not stopping; whenever the
dispatchers or the config change, each dispatcher whose servers changed is pushed
R.T_CHECKS with its whole list, and its T_CHECKED reports (silent) move the servers'
state; one that made a server healthy again feeds the dispatchers.
"""
from __future__ import annotations

from ....protocol.schema import MAX_POSITIONS, OPERATOR_SINCE, Op, R
from ....protocol.schema.messages import (ABORT_SINCE, HEALTH_CHECKS_SINCE, KEEPALIVE_SINCE,
                                       NEXT_UPSTREAM_SINCE)
from ....protocol.schema.outcome import Outcome
from ....protocol.schema.task_messages import TaskEnqueue, digest
from ....protocol.schema.tokens import matches
from ....protocol.schema.tasks import OUTCOME_KINDS
from ..shared import Admission, Out
from ..shared.ranking import Ranking, by_name
from . import enqueue, views
from .components.health_probes import HealthProbes
from .model import requests
from .store import MAX_PAGE, MOVED, RUNNING, STATUSES, ApiPolicy, Task, TaskError, Tasks

#: the schema version from which a dispatcher makes request tasks' calls (T_CALL's ext)
REQUEST_TASKS_SCHEMA = 4
#: a dispatcher cannot ask for more calls than this at once (bounds one push turn)
MAX_SLOTS = 1 << 16
#: a task token that is not the task's own (another task's, a wrong one; or the task has
#: none: enqueued before tokens, or by a schedule)
WRONG_TOKEN = TaskError("forbidden", "this token is not the task's own")
#: an operator's op from a front of a schema before OPERATOR_SINCE
TOO_OLD = TaskError("bad_request", f"an operator's op needs schema version {OPERATOR_SINCE}")


def token_of(op: tuple, at: int) -> bytes | None | TaskError:
    """The task token's digest an op carries at `at` (None: none, the key decides); a
    malformed one is refused like a wrong one."""
    sent = op[at] if len(op) > at else None
    if sent is None:
        return None
    return digest(sent) or WRONG_TOKEN


def refusal(task: Task | None, uid, token: bytes) -> TaskError | None:
    """Why a request with task token `token` may not act on task `uid` (None: it may)."""
    if task is None:
        return TaskError("not_found", f"no task {uid!r}")
    return None if matches(task.token, token) else WRONG_TOKEN


class TaskSession:
    """One session of an HTTP front (kind "http") or of a dispatcher ("dispatcher")."""
    __slots__ = ("front", "conn", "slots", "draining")
    family = 2          # ops it may send: the T_* ones (broker.Broker._batch)
    is_counter = False
    is_pool = False
    is_task = True
    behind = None       # task ops never wait behind one another

    def __init__(self, front, conn: int) -> None:
        self.front = front
        self.conn = conn
        self.slots = 0  # a dispatcher: calls it may be handed now
        self.draining = False   # it subscribed as stopping: outcomes free none


class TaskCommands:
    """The tasks component: the task store, the sessions of HTTP fronts and dispatchers,
    and the handlers of their ops.  Each answers T_TASK or T_ERROR, except the
    dispatchers' silent T_SUBSCRIBE and their T_OUTCOME (T_NOTED); whatever frees a
    function's slot or makes a task due feeds the dispatchers."""

    def __init__(self, store: Tasks, api: ApiPolicy, out: Out, admission: Admission,
                 old_peers: dict | None = None) -> None:
        self.store = store
        # peer -> the older schema version it speaks (the actor's, shared)
        self.old_peers: dict[bytes, int] = {} if old_peers is None else old_peers
        self.api = api                      # what a request without the master key may do
        self.out = out
        self.admission = admission
        self.dispatchers: dict = {}         # dispatcher sessions, in the order they came
        self.probes = HealthProbes(store.upstream)  # who probes which server
        # the functions by activity, for an operator's pages (V_FUNCTIONS)
        self.ranking = Ranking(lambda: store.fns.names(),
                               lambda name, now: views.function_activity(store, name, now))

    def handlers(self) -> dict:
        return {Op.T_ENQUEUE: self.t_enqueue, Op.T_INFO: self.t_info, Op.T_CANCEL: self.t_cancel,
                Op.T_SUBSCRIBE: self.t_subscribe, Op.T_OUTCOME: self.t_outcome,
                Op.T_LIST: self.t_list, Op.T_FUNCTIONS: self.t_functions,
                Op.T_FUNCTION: self.t_function, Op.T_DONE: self.t_done,
                Op.T_FUNCTION_PAUSE: self.t_function_pause, Op.T_RETRY: self.t_retry,
                Op.T_POSITIONS: self.t_positions, Op.T_CHECKED: self.t_checked,
                Op.V_FUNCTIONS: self.v_functions}

    # -- sessions ----------------------------------------------------------------------
    def open(self, front, conn: int) -> TaskSession:
        return TaskSession(front, conn)

    def close(self, s: TaskSession, now: float) -> None:
        self.dispatchers.pop(s, None)
        self.store.lost(s, now)
        if s in self.probes.sent:
            self.assign_checks()        # (its servers go to the others)
        self.feed(now)

    def restore(self, front, s: TaskSession | None, st, now: float) -> TaskSession:
        """A re-registered session; a dispatcher lists the calls it is making or has
        reports on ([unique_id, attempt]), so a restarted broker gives them back to it."""
        s = s or self.open(front, st.conn)
        if front.kind == "dispatcher" and st.holds:
            self.claim_calls(s, st.holds, now)
        return s

    def claim_calls(self, s, claims, now: float) -> None:
        """The calls a dispatcher re-registered after our restart is making: its own
        again (store.claim)."""
        for claim in claims:
            if (isinstance(claim, (list, tuple)) and len(claim) == 2
                    and type(claim[0]) is str and type(claim[1]) is int):
                self.store.claim(claim[0], claim[1], s, now)

    def configure(self, functions: dict, base, api: ApiPolicy, now: float,
                  upstreams: tuple | None = None) -> None:
        """A config read again: calls go where it says now."""
        self.store.configure(functions, base, now, upstreams)
        self.api = api
        self.assign_checks()
        self.feed(now)

    # -- timers --------------------------------------------------------------------------
    def next_deadline(self) -> float | None:
        store = self.store      # (a room event opens, and draws, before anyone came)
        return store.next_deadline() if store.tasks or store.room.openings else None

    def expire(self, now: float) -> None:
        if self.store.tasks or self.store.room.openings:
            self.store.expire(now)
            self.feed(now)

    # -- ops -----------------------------------------------------------------------------
    def t_enqueue(self, s, op, now):
        order = TaskEnqueue.read(op)        # (the checks it passes: enqueue.py)
        if order is None:
            return (op[1], R.T_ERROR, "bad_request", "malformed enqueue")
        order = enqueue.allowed(order, self.store.function, self.api, self.admission)
        if isinstance(order, TaskError):
            return (op[1], R.T_ERROR, *order)
        task = self.store.enqueue(order.function, order.params, order.options, now,
                                  uid=order.unique_id, request=order.request,
                                  client_ip=enqueue.client_ip(order, self.api),
                                  online=order.online, headers=order.headers,
                                  token=order.token_sha256)
        if isinstance(task, TaskError):
            return (op[1], R.T_ERROR, *task)
        self.feed(now)      # (first: an online task admitted now answers with its pass)
        return (op[1], R.T_TASK, views.enqueued(self.store, task, now))

    def cross_origin(self) -> tuple[dict[str, list[str]], list[str]]:
        """What the HTTP fronts' CORS needs (Settings): each function's allow_origins
        ("" for any other name under base_url), and the origins a page may enqueue from,
        those of the functions a request without the master key may enqueue to (a
        preflight names no function, so the front answers it from these)."""
        specs, base = dict(self.store.functions), self.store.base
        if base is not None:
            specs[""] = base
        # with origins for "", a function not listed would be taken for a name under it
        every = base is not None and bool(base.allow_origins)
        origins = {name: list(spec.allow_origins) for name, spec in specs.items()
                   if spec.allow_origins or every}
        enqueue = [origin for spec in specs.values() if self._keyless_enqueue(spec)
                   for origin in spec.allow_origins]
        return origins, list(dict.fromkeys(enqueue))

    def rooms(self, pages: dict[str, str]) -> dict[str, list]:
        """The waiting pages the HTTP fronts serve (Settings): each function the public
        may join (online "public" or "only"; "" for names under base_url) -> [its
        template's HTML, as `pages` has it, else [functions]' own ("": the built-in
        page), online_heartbeat ms]."""
        specs = {**self.store.functions, **({"": self.store.base} if self.store.base else {})}
        return {name: [pages.get(name, pages.get("", "")), spec.heartbeat_ms]
                for name, spec in specs.items() if spec.online in enqueue.PUBLIC_ONLINE}

    def group_headers(self) -> list[str]:
        """The request headers some function groups by (group_by = "header:NAME"), lower
        case: an HTTP front sends their values with each enqueue (Settings)."""
        specs = [*self.store.functions.values(), self.store.base]
        return sorted({spec.group_header for spec in specs
                       if spec is not None and spec.group_header})

    def _keyless_enqueue(self, spec) -> bool:
        return enqueue.keyless_enqueue(spec, self.api)

    def admit(self, params_len: int) -> TaskError | None:
        """Why no new task may come in now, if so (a schedule's fire asks too)."""
        return enqueue.room_for(self.admission, params_len)

    def t_info(self, s, op, now):
        """A task's info: by the master key, by the task's own token (a wrong one is
        refused even where a keyless read is not), or as the [api] policy lets any."""
        token = token_of(op, 4)
        task = self.store.tasks.get(op[2]) if type(op[2]) is str else None
        if token is not None:
            refused = token if isinstance(token, TaskError) else refusal(task, op[2], token)
            if refused is not None:
                return (s.conn, R.T_ERROR, *refused)
        elif op[3] is not True and self.api.private_results:
            return (s.conn, R.T_ERROR, *enqueue.NEEDS_KEY)
        if task is not None:
            self.store.seen(task, now)      # (a waiting user looked: it keeps its place)
        info = views.info(self.store, op[2], now, keyed=op[3] is True) \
            if type(op[2]) is str else None
        if info is None:
            return (s.conn, R.T_ERROR, "not_found", f"no task {op[2]!r}")
        if token is not None or op[3] is True:  # (its owner read it: keep_result_after_read)
            self.store.read(task, now)
        return (s.conn, R.T_TASK, info)

    def t_positions(self, s, op, now):
        """The places of many tasks at once (views.place, None for a task not kept), for
        an HTTP front's event streams, once a second; each waiting online task among them
        counts as looked at, so an open stream keeps its user's place.  The front checked
        who may follow each task when its stream opened (its T_INFO), so none is asked
        here; at most MAX_POSITIONS ids, each a string."""
        uids = op[2]
        if not isinstance(uids, (list, tuple)) or len(uids) > MAX_POSITIONS:
            return (s.conn, R.T_ERROR, "bad_request",
                    f"positions take a list of at most {MAX_POSITIONS} task ids")
        store, places = self.store, []
        for uid in uids:
            task = store.tasks.get(uid) if type(uid) is str else None
            if task is not None:
                store.seen(task, now)
            places.append(None if task is None else views.place(store, task, now))
        return (s.conn, R.T_POSITIONS, places)

    def t_cancel(self, s, op, now):
        """Cancel a queued task, or end an admitted online one; a waiting visitor leaves
        its line at once, and everyone behind moves up.  With a task token (else the
        front checked the master key), that task only."""
        token = token_of(op, 3)
        if token is not None:
            refused = token if isinstance(token, TaskError) else refusal(
                self.store.tasks.get(op[2]) if type(op[2]) is str else None, op[2], token)
            if refused is not None:
                return (s.conn, R.T_ERROR, *refused)
        running = self.store.tasks.get(op[2]) if type(op[2]) is str else None
        holder, attempt = (running.holder, running.attempt) if running is not None \
            and running.status == RUNNING else (None, 0)
        # (a move waiting for its rate holds its dispatcher's slot with no call running)
        moving = holder is not None and self.store.moves.is_waiting(running)
        task = self.store.cancel(op[2], now) if type(op[2]) is str else None
        if task is None:
            return (s.conn, R.T_ERROR, "not_found", f"no task {op[2]!r}")
        if isinstance(task, TaskError):
            return (s.conn, R.T_ERROR, *task)
        if moving:
            if holder in self.dispatchers and not holder.draining:
                holder.slots = min(holder.slots + 1, MAX_SLOTS)
        elif holder is not None:
            self.abort(holder, task.uid, attempt)
        self.feed(now)                  # (an admitted task's or a call's slot is free again)
        return (s.conn, R.T_TASK, views.info(self.store, task.uid, now))

    def abort(self, holder, uid: str, attempt: int) -> None:
        """Tell the dispatcher making call `attempt` of cancelled task `uid` to abort it
        (R.T_ABORT), if it is one that takes it: a dispatcher session still here, of
        schema ABORT_SINCE or later (an older one's call runs to its end; a call the
        broker found running at a restart has no dispatcher until claimed, and a claim
        of a cancelled task fails, so its report is only read for possiblyExecuted)."""
        if holder not in self.dispatchers:
            return
        if self.old_peers and self.old_peers.get(holder.front.peer, ABORT_SINCE) < ABORT_SINCE:
            return
        self.out.reply(holder, R.T_ABORT, uid, attempt)

    def t_done(self, s, op, now):
        """An admitted online task's user is through (the front checked the pass or the
        key): its slot goes to the next in line."""
        return self._changed(s, self.store.done(op[2], now) if type(op[2]) is str else None,
                             op[2], now)

    def _changed(self, s, task: Task | TaskError | None, uid, now):
        """The reply to an op that changed task `uid` (the store's answer: the task, why
        not, or None: no such task); a change fed the dispatchers first."""
        if task is None:
            return (s.conn, R.T_ERROR, "not_found", f"no task {uid!r}")
        if isinstance(task, TaskError):
            return (s.conn, R.T_ERROR, *task)
        self.feed(now)
        return (s.conn, R.T_TASK, views.info(self.store, task.uid, now))

    def t_list(self, s, op, now):
        _, conn, function, status, limit, after = op
        if not (function is None or type(function) is str) or not (
                status is None or status in STATUSES) or type(limit) is not int or not (
                1 <= limit <= MAX_PAGE) or type(after) is not int:
            return (conn, R.T_ERROR, "bad_request",
                    f"status is one of {', '.join(sorted(STATUSES))}, limit 1 to {MAX_PAGE}")
        infos, cursor = views.page(self.store, function, status, limit, after, now)
        return (conn, R.T_LIST, infos, cursor)

    def t_functions(self, s, op, now):
        _, conn, after, limit = op
        if type(after) is not str or type(limit) is not int or not 1 <= limit <= MAX_PAGE:
            return (conn, R.T_ERROR, "bad_request", f"limit is 1 to {MAX_PAGE}")
        infos, more = views.function_page(self.store, after, limit, now)
        return (conn, R.T_FUNCTIONS, infos, more)

    def v_functions(self, s, op, now):
        """An operator's page of functions (the dashboard's): those whose name holds `q`,
        among all of them, by name or busiest first (views.function_activity, ranked at
        most once every RANK_S: shared/ranking.py)."""
        _, conn, q, sort, after, limit = op
        if (type(q) is not str or sort not in ("name", "activity") or type(after) is not str
                or type(limit) is not int or not 1 <= limit <= MAX_PAGE):
            return (conn, R.T_ERROR, "bad_request",
                    f"sort is name or activity, limit 1 to {MAX_PAGE}")
        names = self.store.fns.names()
        shown, more = (by_name(names, lambda n: q in n, after, limit) if sort == "name" else
                       self.ranking.page(lambda n: n in names and q in n, after, limit, now))
        return (conn, R.V_PAGE, [views.function_stats(self.store, n, now) for n in shown], more)

    def t_function(self, s, op, now):
        info = views.function_stats(self.store, op[2], now) if type(op[2]) is str else None
        if info is None:
            return (s.conn, R.T_ERROR, "not_found", f"no function {op[2]!r}")
        return (s.conn, R.T_FUNCTION, info)

    def t_function_pause(self, s, op, now):
        """An operator pauses a function or resumes it (the front checked the master key);
        the answer is the function as GET shows it."""
        _, conn, name, paused = op
        if self._too_old(s):
            return (conn, R.T_ERROR, *TOO_OLD)
        if type(name) is not str or type(paused) is not bool:
            return (conn, R.T_ERROR, "bad_request", "a function's name and paused: a boolean")
        refused = self.store.pause_function(name, paused, now)
        if refused is not None:
            return (conn, R.T_ERROR, *refused)
        if not paused:
            self.feed(now)          # (its tasks go to the dispatchers with free slots)
        return (conn, R.T_FUNCTION, views.function_stats(self.store, name, now))

    def t_retry(self, s, op, now):
        """An operator runs a failed or cancelled task again (the front checked the key)."""
        if self._too_old(s):
            return (s.conn, R.T_ERROR, *TOO_OLD)
        return self._changed(s, self.store.retry(op[2], now) if type(op[2]) is str else None,
                             op[2], now)

    def _too_old(self, s) -> bool:
        """A front older than OPERATOR_SINCE has no operator's ops: one such op from it is
        not what it seems (its codes meant nothing then)."""
        return bool(self.old_peers) and self.old_peers.get(
            s.front.peer, OPERATOR_SINCE) < OPERATOR_SINCE

    def t_subscribe(self, s, op, now):
        _, _, slots, stopping = op
        if type(slots) is int and s.is_task:
            # stopping: it finishes the calls it has and takes none; a dispatcher busy on
            # every slot after a reconnect subscribes with 0 and is not stopping
            s.draining = stopping is True
            s.slots = 0 if s.draining else max(0, min(slots, MAX_SLOTS))
            self.dispatchers[s] = None
            if not s.draining:      # (a reconnect stopped its probes: send them again)
                self.probes.sent.pop(s, None)
            self.assign_checks()
            self.feed(now)

    def t_outcome(self, s, op, now):
        _, conn, uid, attempt, *fields = op
        noted = (conn, R.T_NOTED, uid, attempt)
        if s not in self.dispatchers or fields[0] not in OUTCOME_KINDS:
            return noted
        # (fields after ext, from a newer dispatcher, are not ours to read)
        outcome = Outcome.read(*fields[:6]) if len(fields) >= 5 else None
        taken = False
        if type(uid) is str and type(attempt) is int and outcome is not None:
            moves = not s.draining and (not self.old_peers or self.old_peers.get(
                s.front.peer, NEXT_UPSTREAM_SINCE) >= NEXT_UPSTREAM_SINCE)
            taken = self.store.outcome(uid, attempt, outcome, now, holder=s, moves=moves)
        if not s.draining and taken != MOVED:   # (a move keeps the slot for its call)
            s.slots = min(s.slots + 1, MAX_SLOTS)   # the call is over for the dispatcher
        self.feed(now)
        return noted

    # -- active health checks ------------------------------------------------------------
    def assign_checks(self) -> None:
        """Give every checked server to one prober; push R.T_CHECKS to each dispatcher
        whose list changed (none with no health checks configured: no cost)."""
        probes = self.probes
        if not probes.sent and not any(g.spec.health_check is not None
                                       for g in self.store.upstream.groups.values()):
            return
        old = self.old_peers
        probers = [d for d in self.dispatchers if not d.draining and not (old and old.get(
            d.front.peer, HEALTH_CHECKS_SINCE) < HEALTH_CHECKS_SINCE)]
        for d, checks in probes.assign(probers).items():
            if d in self.dispatchers:       # (not one whose session just closed)
                self.out.reply(d, R.T_CHECKS, checks)

    def t_checked(self, s, op, now):
        """A probe's result (silent): from the dispatcher that probes that server only."""
        if len(op) >= 6 and self.probes.checked(s, op[2], op[3], op[4], op[5], now):
            self.store.server_back(op[2], now)  # (healthy again: calls may go to it)
            self.feed(now)

    # -- fn:NAME, a function's concurrency as a counter (core/counters.py asks) ----------
    def counted(self) -> bool:
        """Whether functions are configured (then the counter names fn:* are theirs)."""
        return bool(self.store.functions) or self.store.base is not None

    def is_function(self, name: str) -> bool:
        return self.store.function(name) is not None

    def in_use(self, name: str) -> int:
        return self.store.limits.in_use(name)

    def hold(self, name: str, slots: int) -> bool:
        return self.store.limits.hold(name, slots)

    def rehold(self, name: str, slots: int) -> None:
        self.store.limits.rehold(name, slots)

    def unhold(self, name: str, slots: int, now: float, feed: bool = True) -> None:
        self.store.unhold(name, slots, now)
        if feed:
            self.feed(now)          # a task waiting for the slot is handed out at once

    def slots_dump(self) -> list[tuple[str, int, int]]:
        """(function, in use, most in use this interval) of the configured functions and
        those in use."""
        store = self.store
        limits = store.limits
        names = sorted({*store.functions, *limits.running, *limits.held})
        return [(n, limits.in_use(n), max(limits.peaks.get(n, 0), limits.in_use(n)))
                for n in names]

    def reset_peaks(self) -> None:
        """A new counter interval: the most in use starts from what is in use now."""
        self.store.limits.peaks = {}

    def feed(self, now: float) -> None:
        """Admit the online tasks whose turn came; hand due tasks to dispatchers with free
        slots, one each in turn; one that got a call goes to the back, so calls spread
        over dispatchers."""
        old = self.old_peers
        for task in self.store.moves.take_ready():  # (in the slots their calls held)
            self._call(task.holder, task)
        while True:
            while self.store.has_online() and self.store.admit(now):   # (online tasks wait)
                pass
            handed = False
            for d in list(self.dispatchers):
                if d.slots <= 0:
                    continue
                plain_only = bool(old) and old.get(
                    d.front.peer, REQUEST_TASKS_SCHEMA) < REQUEST_TASKS_SCHEMA
                task = self.store.take(d, now, plain_only)
                if task is None:
                    if plain_only:          # (a newer dispatcher may take what it did not)
                        continue
                    return
                d.slots -= 1
                handed = True
                del self.dispatchers[d]
                self.dispatchers[d] = None
                self._call(d, task)
            if not handed:
                return

    def _call(self, d: TaskSession, task: Task) -> None:
        """Push running `task`'s call to dispatcher `d` (a move says which it is)."""
        spec = self.store.specs[task.function]
        self.out.reply(d, R.T_CALL, task.uid, task.attempt,
                       self.store.call_url(task, spec), task.params, task.timeout_ms,
                       requests.call_ext(task.request, spec.result_headers,
                                         spec.connect_timeout_ms, max(0, len(task.tried) - 1),
                                         *self._server_ext(d, task)))

    def _server_ext(self, d: TaskSession, task: Task) -> tuple:
        """A call on an upstream's server: the Host of a resolved name's address, and the
        upstream's pool (none for a dispatcher older than KEEPALIVE_SINCE)."""
        if task.peer is None:
            return None, None
        upstream, peer = task.peer
        pool = None
        if not self.old_peers or self.old_peers.get(
                d.front.peer, KEEPALIVE_SINCE) >= KEEPALIVE_SINCE:
            pool = self.store.upstream.pool(upstream)
        return peer.spec.host, pool
