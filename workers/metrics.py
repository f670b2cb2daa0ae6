"""A worker pool's /metrics: the jobs its handlers ran, by outcome, and how long they ran.

The pool (pool.py) counts on its hot path into one `PoolMetrics`: `jobs`, a dict of
OUTCOMES to counts, and `handler`, a Histogram of handler run times (one `bisect` per
job).  A handler's run is counted once, where its fate is known:

* deleted, released, buried: the broker took the pool's answer (the ack's reply);
* lost: the handler ran, but the job was no longer this pool's when it finished (its
  TTR had run out: the broker answered NOT_FOUND or had given it out again; the pool
  had handed it back on stopping; or the broker came back with other state);
* refused: the broker refused the answer (no binlog space left): the job stays
  reserved until its TTR runs out;
* expired: not run: it waited its whole TTR in the pool before a handler was free.

Every outcome but expired is in the histogram, so once the acks are answered its count
is the sum of the others.

One process (`--health-port` without --processes): its health port renders
`PoolMetrics.samples()`.
"""
from __future__ import annotations

from ..broker import VERSION
from ..protocol.codecs.prometheus import CALL_BUCKETS, Histogram, Sample
from .job import EXPIRED

DELETED, RELEASED, BURIED, LOST, REFUSED = "deleted", "released", "buried", "lost", "refused"
OUTCOMES = (DELETED, RELEASED, BURIED, LOST, REFUSED, EXPIRED)


class PoolMetrics:
    """One process's counts."""
    __slots__ = ("jobs", "handler")

    def __init__(self) -> None:
        self.jobs = dict.fromkeys(OUTCOMES, 0)      # mutated in place: the pool aliases it
        self.handler = Histogram(CALL_BUCKETS)

    def samples(self) -> list[Sample]:
        """/metrics (protocol/codecs/prometheus.py METRICS, role pool)."""
        out = [Sample("zstalk_build_info", (VERSION, "pool"), 1)]
        out += [Sample("zstalk_pool_jobs_total", (outcome,), n)
                for outcome, n in self.jobs.items()]
        out.append(Sample("zstalk_pool_handler_seconds", (), self.handler))
        return out
