"""Native worker pools: jobs pushed to subscribed sessions, bounded by credits.

A pool is a front of kind "pool" (one process of a `zstalk worker`), and each of its
sessions is a `PoolSession`: a beanstalk session whose watch list is its subscription and
which, instead of asking with `reserve`, is handed jobs as long as it has credits.
The schema's "Worker pools" comment gives the wire view; here is how the queue does it.

A pool with credits is a *waiting* session on its tubes, exactly like a client blocked in
`reserve` with no timeout, so the queue's one invariant (no waiter watches an unpaused
tube with a ready job) and its FIFO of waiters give both rules of the issue:
  * order: every push is what `reserve` would answer at that moment, `(pri, id)` across
    the subscribed unpaused tubes (`_feed` asks `best_ready`; a job that becomes ready
    goes to the first waiter of its tube, and the invariant says no other watched tube
    has a ready job);
  * fairness: after each push a pool that still has credits waits again at the END of
    its tubes' waiter lists, so pools and blocked beanstalk clients take turns job by job.
A pushed job is RESERVED by the pool session: TTR, touch, delete, release and bury are
the beanstalk handlers (and so the binlog records them), and a vanished pool's jobs go
back to ready when the broker drops its front (heartbeats, PEER_TIMEOUT_S).
Pools get no DEADLINE_SOON: a pool is never blocked, its SDK touches long jobs itself.
"""
from __future__ import annotations

from ....protocol.schema import WORKER_VERSIONS, Op, R
from ....protocol.schema.ops import ARG
from .jobs import RESERVES, Job, Session

#: what a pool session may send: its subscription, and answers to the jobs it holds
POOL_OPS = frozenset({Op.OPEN, Op.CLOSE, Op.SUBSCRIBE, Op.CREDIT, Op.DELETE, Op.RELEASE,
                      Op.BURY, Op.TOUCH, Op.PEEK, Op.STATS_JOB, Op.STATS_TUBE, Op.STATS})
#: a pool cannot ask for more jobs than this at once (bounds what one push turn builds)
MAX_CREDITS = 1 << 20


class PoolSession(Session):
    __slots__ = ("credits", "version")
    is_pool = True

    def __init__(self, front, conn: int, default) -> None:
        super().__init__(front, conn, default)
        self.credits = 0
        self.version = 0

    def soonest_deadline(self) -> float | None:
        return None         # no DEADLINE_SOON wake-ups for a pool (see above)


def negotiate(versions) -> int:
    """The highest worker-protocol version both sides speak, or 0 for none."""
    low, high = versions
    best = min(high, WORKER_VERSIONS[1])
    return best if best >= max(low, WORKER_VERSIONS[0]) else 0


class PoolCommands:
    """The pools component: SUBSCRIBE and CREDIT, and pushing jobs to pools with credits.
    Pool sessions are beanstalk sessions (the beanstalk component opens and closes them,
    and handles what they answer each job with); this component works on its queue."""

    def __init__(self, beanstalk, out) -> None:
        self.beanstalk = beanstalk          # commands.BeanstalkCommands: the queue, watch lists
        self.queue = beanstalk.queue
        self.out = out
        beanstalk.pool_granted = self._granted

    def handlers(self) -> dict:
        return {Op.SUBSCRIBE: self.subscribe, Op.CREDIT: self.credit}

    def subscribe(self, s: Session, op, now):
        _, conn, versions, tubes, credits = op
        if not s.is_pool:
            return (conn, R.INTERNAL_ERROR)
        # (arguments were checked on arrival: checks.py)
        version = negotiate(versions)
        if not version:
            return (conn, R.BAD_VERSION, *WORKER_VERSIONS)
        self.queue.stop_waiting(s)
        self.beanstalk.set_watch(s, tubes)
        s.version = version
        s.worker = True
        s.credits = max(0, min(credits, MAX_CREDITS))
        self.out.reply(s, R.SUBSCRIBED, version)    # before the jobs it lets through
        self._feed(s, now)

    def credit(self, s: Session, op, now):
        if not s.is_pool:
            return None
        s.credits = max(0, min(s.credits + op[ARG], MAX_CREDITS))
        if s.credits == 0:
            self.queue.stop_waiting(s)
        elif not s.waiting and s.version:
            self._feed(s, now)
        return None

    # -- pushing ---------------------------------------------------------------------
    def _feed(self, s: PoolSession, now: float) -> None:
        """Push what `reserve` would hand out while credits last, then wait for more."""
        q = self.queue
        while s.credits > 0:
            job = q.best_ready(s)
            if job is None:
                q.wait(s, None, now)
                return
            q.take(job)
            q.reserve(s, job, now)
            self._push(s, job)

    def _push(self, s: PoolSession, job: Job) -> None:
        s.credits -= 1
        self.out.reply(s, R.JOB, job.id, job.body, job.tube.name, job.pri, job.ttr_s,
                       job.count(RESERVES))

    def _granted(self, s: PoolSession, job: Job) -> None:
        """The queue handed a waiting pool a job: push it, and queue up again (at the end)."""
        self._push(s, job)
        if s.credits > 0:
            self.queue.wait(s, None, 0.0)     # no timeout: the clock is not read
