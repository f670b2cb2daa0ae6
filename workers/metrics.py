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
`PoolMetrics.samples()`.  N processes: each child owns a row of a shared array of doubles
(`Slots.counts`, workers/probes.py), its cumulative counts laid out as `row()`; it writes
the row whole every BEAT_S and when it stops cleanly (probes.SlotReporter), and the parent
sums the rows when scraped (`totals`).  A row outlives its process: a child started in its
place first adds the row's values to its own (`resume`), so the parent's totals never go
down.  A child killed with SIGKILL loses at most the last BEAT_S of counts (what it counted
after its last write).  Doubles hold counts exactly up to 2**53.
"""
from __future__ import annotations

from typing import Any, Sequence

from ..protocol.schema.version import VERSION
from ..protocol.codecs.prometheus import CALL_BUCKETS, Histogram, Sample, render
from .job import EXPIRED

DELETED, RELEASED, BURIED, LOST, REFUSED = "deleted", "released", "buried", "lost", "refused"
OUTCOMES = (DELETED, RELEASED, BURIED, LOST, REFUSED, EXPIRED)
#: a row: the outcomes' counts, the histogram's buckets (the last +Inf), its sum
WIDTH = len(OUTCOMES) + len(CALL_BUCKETS) + 2


class PoolMetrics:
    """One process's counts, or the sum of several processes' rows."""
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

    def row(self) -> list[float]:
        return [*self.jobs.values(), *self.handler.counts, self.handler.sum]

    def add_row(self, row: Sequence[float]) -> None:
        jobs, counts = self.jobs, self.handler.counts
        for outcome, n in zip(OUTCOMES, row):
            jobs[outcome] += int(n)
        for i, n in enumerate(row[len(OUTCOMES):-1]):
            counts[i] += int(n)
        self.handler.sum += row[-1]


def publish(metrics: PoolMetrics, counts: Any, index: int) -> None:
    """Write a child's row (`counts`: the shared array)."""
    counts[index * WIDTH:(index + 1) * WIDTH] = metrics.row()


def resume(metrics: PoolMetrics, counts: Any, index: int) -> None:
    """A child starting in row `index`: carry on from what its predecessors published."""
    metrics.add_row(counts[index * WIDTH:(index + 1) * WIDTH])


def totals(counts: Any) -> PoolMetrics:
    """Every child's row summed (the parent's view)."""
    values = counts[:]
    total = PoolMetrics()
    for start in range(0, len(values), WIDTH):
        total.add_row(values[start:start + WIDTH])
    return total


def render_totals(counts: Any) -> bytes:
    return render(totals(counts).samples())
