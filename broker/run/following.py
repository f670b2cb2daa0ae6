"""A `zstalk serve --journal` instance while it stands by: its door, and fronts that reach
the leader wherever it runs (issue 43; docs/ha.md), so a client may connect to any
instance (a Kubernetes Service in front of them all).

While the instance stands by (leading.py):
  * its `Door` (broker/standby.py) binds --worker-bind and tells every peer that says
    Hello where the leader is (NotLeader, its --advertise address from the lease);
  * its beanstalk, counter and HTTP fronts listen on the client ports already (its
    dispatcher starts only once it leads), and their links
    (protocol/links/zeromq.py) ask this instance's own --advertise address first: the door
    sends them on to the leader, and after losing that leader they ask it again, so they
    follow every later one too.  While none answers, what clients send is held up to
    JOURNAL_HOLD_S (a failover with NATS electing takes up to ~12 s; the 5 s of a
    lone broker's fronts would fail commands during an ordinary one).

At takeover (`take_over`), in this order: the fronts move to the broker beside them
(protocol/links `relink`: what the lost leader had and never answered is failed, as when
any broker is lost, INTERNAL_ERROR or a 503 with Retry-After; what was held goes to the
new one, once; the sessions re-register, the journal's state_id being the same); then
the actor adopts the door's socket, so that no Hello a front's old link had sent can
reach the actor before its new one.  From then on the fronts' links are the in-process
mailbox's, and a command costs what it costs on any leader.

An instance that cannot follow (no --worker-bind, so no address to advertise; CURVE
keys missing for a link beyond this host) stands by as before: client ports bound, not
listening.  A link left HOLDING at takeover (the old leader stopping on SIGTERM) is
given until HOLDING_WAIT_S for its final Stopping, so what never ran there goes to the
new leader rather than failing.
"""
from __future__ import annotations

import asyncio
import logging

from .fronts import RunningFront, beanstalk_front, counter_front, start_front
from .options import ServeOptions, no_endpoint
from ...protocol.links import relink
from ...protocol.links.owner import READY
from ...protocol.network import curve

log = logging.getLogger("zstalk.broker")
#: how long fronts hold commands while no leader answers, in journal mode
JOURNAL_HOLD_S = 15.0
#: at takeover, a front still holding for a leader that is stopping waits this long
HOLDING_WAIT_S = 2.0
_HOLDING = "holding"        # (protocol/links/zeromq.py's state)


def cannot_follow(opts: ServeOptions) -> str | None:
    """Why this instance's fronts cannot follow the leader while it stands by, or None."""
    if no_endpoint(opts.worker_bind) or not opts.journal.advertise:
        return "no --worker-bind (nor --advertise): no leader's address to reach"
    try:
        curve.check_local(opts.journal.advertise, curve.given_or_env(curve.FROM_ENV), "front")
    except curve.CurveError as exc:
        return str(exc)
    return None


class Following:
    """The door and the fronts of an instance standing by (module comment): `fronts` the
    beanstalk and counter ones with their servers, `http` the HTTP front (or None)."""

    def __init__(self, door, fronts: list[RunningFront], http=None) -> None:
        self.door = door
        self.fronts = fronts
        self.http = http

    async def take_over(self, actor, address: str) -> list[RunningFront]:
        """This instance leads: the fronts go to `address` (its broker's mailbox), the
        actor serves on the door's socket; the fronts, for serve.py."""
        owners = [running.front for running in self.fronts] + [self.http] * bool(self.http)
        await _until_not_holding(owners)
        for owner in owners:
            relink(owner, address, JOURNAL_HOLD_S)
        if self.door is not None:
            actor.adopt(*self.door.hand_over())
        return self.fronts

    def ready(self, standing_by):
        """/readyz while standing by: ready once the beanstalk front reaches the leader
        (clients can be served here: a Service may send them), else `standing_by()`'s
        reason."""
        def ready() -> str | None:
            if self.fronts and self.fronts[0].front.link.state is READY:
                return None
            return standing_by()
        return ready

    async def close(self) -> None:
        """It stops without having led."""
        for running in self.fronts:
            running.close()
        if self.http is not None:
            await self.http.close()
        if self.door is not None:
            self.door.close()


async def stand_by(opts: ServeOptions, pointer, listeners, counter_listeners) -> Following:
    """Open the door (raises actor.BindError), and start the fronts when they can follow."""
    from ..standby import Door
    door = None
    if not no_endpoint(opts.worker_bind):
        door = Door([opts.worker_bind], pointer).start()
    why = cannot_follow(opts)
    if why is not None:         # (no worker endpoint is a choice; missing keys a mistake)
        (log.info if door is None else log.warning)(
            "standing by: clients are refused until this instance leads (%s)", why)
        return Following(door, [])
    leader = opts.journal.advertise
    fronts = [await start_front(beanstalk_front(leader, opts.max_connections,
                                                opts.max_job_size, JOURNAL_HOLD_S), listeners)]
    if counter_listeners:
        fronts.append(await start_front(counter_front(
            leader, opts.counter_max_connections, JOURNAL_HOLD_S), counter_listeners))
    http = None
    if opts.http_listeners:
        from ...protocol.fronts.http.front import HttpFront
        http = HttpFront(leader, master_key=opts.master_key, limits=opts.http_limits,
                         tls=opts.http_tls(), hold_s=JOURNAL_HOLD_S)
        await http.start(opts.http_listeners)
    log.info("standing by: clients are served through the leader (asking %s)", leader)
    return Following(door, fronts, http)


async def _until_not_holding(owners: list) -> None:
    """Give a link that holds for a stopping leader its final Stopping (bounded)."""
    loop = asyncio.get_running_loop()
    until = loop.time() + HOLDING_WAIT_S
    while loop.time() < until and any(
            getattr(owner.link, "state", None) == _HOLDING for owner in owners):
        await asyncio.sleep(0.02)
