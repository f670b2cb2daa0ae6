"""The HTTP front's own views of the beanstalk and counter families: tubes, jobs and
counters looked at and acted on by an operator (GET /v1/tubes, ..., GET /v1/counters:
protocol/fronts/http/views.py), as one component of the Broker (core/broker.py).

How it works: the handlers read the beanstalk component's queue and the counters
component's store directly and answer V_PAGE / V_INFO / T_ERROR; they count no beanstalk
`cmd-*` and no counter command, so an operator looking at a server does not change what
`stats` says (beanstalkd counts every command its clients send; these are not theirs).
The actions go through the same methods the beanstalk commands use (`kick_tube`,
`remove`, `Queue.pause`), so the journal and the memory budget see them as any kick,
delete or pause-tube.

Activity (`sort=activity`): a tube's events are the counts the queue keeps anyway
(total-jobs, reserves, deletes: one integer each per event, nothing added to the hot
path); the ranking is sorted on request, at most once every RANK_S, and pages walk
that ranking (`after`: the last name of the previous page: shared/ranking.py).

Peeking (V_PEEK) shows a tube's next ready, delayed and buried job, the ones beanstalk's
peek-ready, peek-delayed and peek-buried would show (beanstalk/commands.py: `next_ready`,
...), with no `cmd-peek-*` counted; the front asks for their bodies only with the master
key (a viewer sees ids, priorities and ages).

The peers (V_PEERS) are the broker's own list of fronts (broker.py's `fronts`, each with
its last word's time), with what their sessions hold: a pool's credits and the jobs it has
reserved, a dispatcher's free slots; nothing is kept for them.

Rules an operator meets (the beanstalk commands' own, with one more): a kick takes up to
`bound` buried jobs of the tube, else delayed ones; a pause of 0 seconds ends one; a
reserved job is not deleted here (its holder is working on it: 409 reserved), which
beanstalkd would not let another client do either.
"""
from __future__ import annotations

from ...protocol.schema import SCHEMA_VERSION, Op, R
from ...protocol.schema.tasks import MAX_PAGE
from .beanstalk import stats
from .beanstalk.jobs import DELAYED, RESERVED
from .shared.ranking import RANK_S, Ranking, by_name  # noqa: F401  (RANK_S: the tests')
#: a tube pause at most this long (beanstalkd's own bound: a 32-bit delay)
MAX_PAUSE_S = 2 ** 32 - 1
SORTS = ("name", "activity")


def camel(key: str) -> str:
    """A beanstalk stats key as the API spells it: current-jobs-ready -> currentJobsReady."""
    head, *rest = key.split("-")
    return head + "".join(part.capitalize() for part in rest)


def oldest_ready_ms(t, now: float) -> int:
    """How long the tube's oldest ready job has been ready, in ms (0: none is).  The same
    FIFOs the metrics' zstalk_tube_oldest_ready_age_seconds reads (jobs.ReadySince): a job
    released, kicked or back from a delay counts from then, as Sidekiq's queue latency
    counts a retried job from its enqueueing again."""
    since = t.ready_since.oldest() if len(t.ready) else None
    return 0 if since is None else max(0, round((now - since) * 1000))


def activity(t) -> int:
    """A tube's events so far: puts, reserves and deletes (the queue's own counts)."""
    return t.total_jobs + t.reserves + t.cmd_delete


class OperatorViews:
    """The V_* ops: the tubes, jobs and counters as an operator sees them."""

    def __init__(self, beanstalk, counting, fronts: dict, old_peers: dict) -> None:
        self.beanstalk = beanstalk          # beanstalk/commands.py: the queue, kick, remove
        self.counting = counting            # counters.py: dump
        self.fronts = fronts                # the broker's: peer -> broker.Front (V_PEERS)
        self.old_peers = old_peers          # peer -> the older schema version it speaks
        # the tubes by activity, most first, name for ties (the queue's own counts)
        self.ranking = Ranking(lambda: self.beanstalk.queue.tubes, lambda name, now: (
            -activity(self.beanstalk.queue.tubes[name]), name))

    def handlers(self) -> dict:
        return {Op.V_TUBES: self.v_tubes, Op.V_TUBE: self.v_tube, Op.V_KICK: self.v_kick,
                Op.V_PAUSE_TUBE: self.v_pause_tube, Op.V_JOB: self.v_job,
                Op.V_DELETE_JOB: self.v_delete_job, Op.V_COUNTERS: self.v_counters,
                Op.V_PEEK: self.v_peek, Op.V_PEERS: self.v_peers}

    # -- looking ---------------------------------------------------------------------------
    def tube_info(self, t, now: float) -> dict:
        info = {camel(k): v for k, v in stats.tube_stats(t, now)}
        info["paused"] = t.unpause_at > now
        info["activity"] = activity(t)
        info["oldestReadyAgeMs"] = oldest_ready_ms(t, now)
        return info

    def v_tubes(self, s, op, now):
        _, conn, q, sort, after, limit = op
        if (type(q) is not str or sort not in SORTS or type(after) is not str
                or type(limit) is not int or not 1 <= limit <= MAX_PAGE):
            return (conn, R.T_ERROR, "bad_request",
                    f"sort is name or activity, limit 1 to {MAX_PAGE}")
        tubes = self.beanstalk.queue.tubes
        shown, more = (by_name(tubes, lambda n: q in n, after, limit) if sort == "name" else
                       self.ranking.page(lambda n: n in tubes and q in n, after, limit, now))
        return (conn, R.V_PAGE, [self.tube_info(tubes[n], now) for n in shown], more)

    def _tube(self, conn: int, name):
        t = self.beanstalk.queue.tubes.get(name) if type(name) is str else None
        return t if t is not None else (conn, R.T_ERROR, "not_found", f"no tube {name!r}")

    def v_tube(self, s, op, now):
        t = self._tube(op[1], op[2])
        return t if type(t) is tuple else (op[1], R.V_INFO, self.tube_info(t, now))

    def v_job(self, s, op, now):
        _, conn, job_id, with_body = op
        job = self.beanstalk.queue.jobs.get(job_id) if type(job_id) is int else None
        if job is None:
            return (conn, R.T_ERROR, "not_found", f"no job {job_id!r}")
        info = {camel(k): v for k, v in stats.job_stats(job, now)}
        if with_body is True:
            info["body"] = job.body
        return (conn, R.V_INFO, info)

    def v_peek(self, s, op, now):
        """A tube's next ready, delayed and buried job (what peek-ready, peek-delayed and
        peek-buried would show a client using it), each None when there is none: its id,
        priority, age and delay left; its body only `with_body`."""
        _, conn, name, with_body = op
        t = self._tube(conn, name)
        if type(t) is tuple:
            return t
        b = self.beanstalk
        peeked = {"tube": t.name}
        for state, job in (("ready", b.next_ready(t)), ("delayed", b.next_delayed(t)),
                           ("buried", b.next_buried(t))):
            peeked[state] = None if job is None else self.peeked(job, with_body is True, now)
        return (conn, R.V_INFO, peeked)

    @staticmethod
    def peeked(job, with_body: bool, now: float) -> dict:
        info = {"id": job.id, "pri": job.pri, "age": int(now - job.created),
                "delayLeft": stats.seconds_left(job.deadline, now) if job.state == DELAYED else 0}
        if with_body:
            info["body"] = job.body
        return info

    def v_peers(self, s, op, now):
        """Every front the broker knows (the HTTP, beanstalk and counter fronts, worker
        pools, native clients and dispatchers), by kind then process id: at most MAX_PAGE,
        with how many there are."""
        fronts = sorted(self.fronts.values(), key=lambda f: (f.kind, f.pid, f.front_id))
        return (op[1], R.V_INFO, {"peers": [self.peer_info(f, now) for f in fronts[:MAX_PAGE]],
                                  "total": len(fronts)})

    def peer_info(self, front, now: float) -> dict:
        """One front: its sessions (client connections; one for a pool or a dispatcher),
        the jobs they hold, a pool's credits (jobs it can take now), a dispatcher's free
        slots (calls it can take now) and whether it is stopping, and how long ago it last
        spoke (a heartbeat at least every HEARTBEAT_S)."""
        sessions = list(front.sessions.values())
        info = {"kind": front.kind, "frontId": front.front_id, "pid": front.pid,
                "version": self.old_peers.get(front.peer, SCHEMA_VERSION),
                "sessions": len(sessions),
                "lastSeenMs": max(0, round((now - front.last_seen) * 1000))}
        if front.kind not in ("http", "dispatcher", "counter"):    # (beanstalk sessions)
            info["reserved"] = sum(len(x.reserved) for x in sessions)
        if front.kind == "pool":
            info["credits"] = sum(x.credits for x in sessions if x.is_pool)
            info["tubes"] = sorted({t.name for x in sessions for t in x.watch})
        elif front.kind == "dispatcher":
            info["slots"] = sum(x.slots for x in sessions)
            info["stopping"] = any(x.draining for x in sessions)
        return info

    def v_counters(self, s, op, now):
        counters = [{"name": name.decode("utf-8", "replace"), "current": current, "max": peak}
                    for name, current, peak in sorted(self.counting.dump(now))]
        return (op[1], R.V_INFO, {"counters": counters,
                                  "stats": dict(self.counting.store.stats())})

    # -- acting ----------------------------------------------------------------------------
    def v_kick(self, s, op, now):
        _, conn, name, bound = op
        if type(bound) is not int or not 0 <= bound < 2 ** 32:
            return (conn, R.T_ERROR, "bad_request", "bound is an integer, 0 to 2^32-1")
        t = self._tube(conn, name)
        if type(t) is tuple:
            return t
        return (conn, R.V_INFO, {"tube": t.name,
                                 "kicked": self.beanstalk.kick_tube(t, bound, now)})

    def v_pause_tube(self, s, op, now):
        _, conn, name, seconds = op
        if type(seconds) is not int or not 0 <= seconds <= MAX_PAUSE_S:
            return (conn, R.T_ERROR, "bad_request",
                    f"pausedFor is whole seconds, 0 (resume) to {MAX_PAUSE_S}")
        t = self._tube(conn, name)
        if type(t) is tuple:
            return t
        self.beanstalk.queue.pause(t, seconds, now)
        return (conn, R.V_INFO, self.tube_info(t, now))

    def v_delete_job(self, s, op, now):
        _, conn, job_id = op
        job = self.beanstalk.queue.jobs.get(job_id) if type(job_id) is int else None
        if job is None:
            return (conn, R.T_ERROR, "not_found", f"no job {job_id!r}")
        if job.state == RESERVED:
            return (conn, R.T_ERROR, "reserved",
                    f"job {job_id} is reserved: its holder deletes or releases it")
        info = {camel(k): v for k, v in stats.job_stats(job, now)}
        self.beanstalk.remove(job, now)
        return (conn, R.V_INFO, info)
