"""What the components of one Broker share, and nothing more.

The Broker (broker.py) routes each op to the component of its protocol family
(beanstalk, pools, counters, tasks, schedules); each component owns that family's state
and rules.  They share only these, each handed to the components that need it when the
Broker builds them:

* `Out`, the out-queue: the replies of one turn, gathered per front (`flush` sends them
  as one Replies message each); a component appends a reply that answers no op of this
  batch (a waiting reserve's job, a pushed call) with `reply(session, code, ...)`;
* `Admission`: whether new work may come in at all: drain mode (SIGUSR1) and the memory
  budget of --max-jobs-bytes, one limit over what jobs, tasks and schedules hold;
* the journal (broker/core/shared/journal.py: a binlog, or the null journal), passed as it is;
* the clock: `now`, a parameter of every call, never read here.
"""
from __future__ import annotations

from typing import NamedTuple


class Out(dict):
    """peer -> the replies gathered for that front this turn, each (conn, code, *values)."""
    __slots__ = ()

    def reply(self, s, *reply) -> None:
        """Answer session `s` outside the batch being handled."""
        items = self.get(s.front.peer)
        if items is None:
            items = self[s.front.peer] = []
        items.append((s.conn, *reply))


class Admission:
    """Drain mode and the jobs-bytes budget.  `holders` are the components (or stores)
    whose `bytes` count against the limit; 0 is no limit."""
    __slots__ = ("draining", "limit", "holders")

    def __init__(self, limit: int) -> None:
        self.draining = False
        self.limit = limit
        self.holders: tuple = ()

    def used(self) -> int:
        return sum(h.bytes for h in self.holders)

    def room_for(self, cost: int) -> bool:
        return not self.limit or self.used() + cost <= self.limit


class Identity(NamedTuple):
    """What a broker says about itself (beanstalk's `stats`)."""
    broker_id: int
    started: float                      # the broker's clock when it started
    sysinfo: object                     # () -> beanstalk.stats.SysInfo
    version: str
    max_job_size: int
    binlog_max_size: int
