"""A broker on a NATS journal leads only once the lease is its own (broker/wal/lease.py;
docs/ha.md), whichever command runs it: `zstalk serve` and `zstalk broker`.

The order, ha-journal.md C.3: stand by (the lease's thread looks at the key) until the
lease is claimed; then read the stream to its end and append the EPOCH message right
after it (wal/jetstream.py's restore, given the epoch); only then is the core built, so
the grace timers of a takeover (counters refused while fronts return, calls that were
running reclaimable, held jobs kept for their holders, no burst credit for the time
before) count from the takeover, not from the process's start, and `recovering` is set
when an epoch came before ours.  While it leads, the actor's loop stamps the time each
RENEW_S (`_turn`), and the lease is not renewed while that stamp is older than
--journal-stall-ms (a stuck loop lets a standby take over); a lease found lost deposes the
journal on the actor's loop (the broker exits 12, answering nothing more); at a graceful
stop, once the held jobs are appended and acknowledged, the lease is released so that a
standby takes over at once.

A standby is warm: from its start it follows the stream (wal/follow.py) and keeps the
state folded in, and at takeover the journal's options hand that fold to the restore
(`journal_options`: opts.warm), which reads only the tail after it before the fence.
Meanwhile its peers are told where the leader is (`pointer`, for broker/standby.py's
NotLeader answers).
"""
from __future__ import annotations

import asyncio
import logging
import random
import signal
import time

from ..wal import stream as S
from ..wal.follow import Follower
from ..wal.lease import RENEW_S, Lease

#: a lease not renewed for this long names no leader to a standby's peers (pointer)
FRESH_S = 4 * RENEW_S

log = logging.getLogger("zstalk.journal")


class Leadership:
    """One instance's lease on `opts`' journal, from standing by to handing over."""

    def __init__(self, opts: S.Options, max_job_size: int) -> None:
        self.opts = opts
        self.max_job_size = max_job_size
        self.instance = f"{random.getrandbits(64):016x}"
        self.lease = Lease(opts, self.instance, opts.advertise)
        self.follower: Follower | None = None   # the standby's, until the takeover takes it
        self.journal = None             # the leader's, once built
        self.turned_at = 0.0            # (monotonic) the actor's loop's latest turn, leading
        self._ticker: asyncio.TimerHandle | None = None

    def start(self) -> None:
        """Connect and stand by, following the stream (blocking; stream.JournalError as a
        start without a lease)."""
        self.lease.start(self.max_job_size)
        if not self.lease.won.done():   # (won at once: nothing to follow first)
            self.follower = Follower(self.opts, self.instance)
            self.follower.start()

    def standing_by(self) -> str | None:
        """/readyz and /leader before the core is built: why not ready, not leading."""
        h = self.lease.watch.holder
        if self.lease.won.done():
            return "taking over: reading the stream"
        f = self.follower
        following = f"; {f.said()}" if f is not None else ""
        if h is None:
            return "standby: claiming the lease" + following
        return f"standby: instance {h.instance} leads (epoch {h.epoch}){following}"

    def metrics(self) -> bytes:
        """/metrics while standing by (the leader's replace them at the takeover): that it
        does not lead, the epoch it saw last, and how far its fold is behind the stream."""
        from ...protocol.codecs.prometheus import Sample, render
        from ..metrics import build_info
        samples = [build_info("serve"), Sample("zstalk_journal_leading", (), 0),
                   Sample("zstalk_journal_epoch", (), self.lease.watch.epoch)]
        if self.follower is not None:
            samples.append(Sample("zstalk_journal_standby_lag_messages", (self.instance,),
                                  self.follower.lag))
        return render(samples)

    def pointer(self) -> tuple[str, int]:
        """Where the leader is reached, for a standby's NotLeader (broker/standby.py): its
        --advertise address and epoch; "" while none is known: no lease seen, none
        advertised, this instance taking over, or no renewal seen for FRESH_S (it is
        likely gone, and its address would send a link back to a dead broker)."""
        w = self.lease.watch
        h = w.holder
        if self.lease.won.done() or h is None or h.instance == self.instance \
                or not h.advertise or time.monotonic() - w.changed > FRESH_S:
            return "", w.epoch
        return h.advertise, h.epoch

    def leading(self) -> str | None:
        """/leader once the core is built: None while this one leads."""
        if self.journal is not None and self.journal.failed is not None:
            return "deposed" if self.journal.failed[0] == S.DEPOSED_EXIT else "stopped"
        return self.lease.lost and "deposed"

    async def until_leading(self, stop: asyncio.Event) -> int | None:
        """The epoch claimed, or None if `stop` was set first."""
        won = asyncio.wrap_future(self.lease.won)
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait({won, stopped}, return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        return won.result() if won.done() and not won.cancelled() else None

    def wait_leading(self) -> int | None:
        """The epoch claimed, blocking (`zstalk broker`, no loop yet); None after a
        SIGTERM or SIGINT meanwhile (a standby holds nothing: it just goes)."""
        def stop(signum, frame):
            raise _Stopped
        before = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            return self.lease.won.result()
        except _Stopped:
            return None
        finally:
            for sig, handler in before.items():
                signal.signal(sig, handler)

    def journal_options(self, epoch: int) -> S.Options:
        """The options the leader's journal is built with: its epoch, and the standby's
        fold to take over from (called once, by the journal's restore)."""
        return self.opts._replace(epoch=epoch, instance=self.instance, warm=self._warm)

    def _warm(self):
        follower, self.follower = self.follower, None
        return follower.take() if follower is not None else None

    def keep(self, actor, loop: asyncio.AbstractEventLoop) -> None:
        """The built broker leads: the lease's value carries its acknowledged sequence,
        and a lease lost deposes its journal on `loop` (the actor's)."""
        journal = self.journal = actor.journal
        journal.took_over_s = time.monotonic() - self.lease.won_at
        journal.standbys = self.lease.heard
        log.info("journal: took over in %.2f s (from the lease claimed to the broker built)",
                 journal.took_over_s)
        self.lease.seq = lambda: journal.acked_seq
        self._turn(loop)
        self.lease.turned = lambda: self.turned_at
        self.lease.on_lost(lambda why: loop.call_soon_threadsafe(journal.depose, why))

    def _turn(self, loop: asyncio.AbstractEventLoop) -> None:
        """Stamp the time on the actor's loop, again every RENEW_S (read by the lease's
        thread: a stamp too old means the loop is stuck)."""
        self.turned_at = time.monotonic()
        self._ticker = loop.call_later(RENEW_S, self._turn, loop)

    def hand_over(self, actor) -> None:
        """The end: a broker that stopped well releases the lease (a standby leads at
        once); a deposed one, or one that never led, only lets go of its thread."""
        self._warm()                    # (a standby that stops: no more following)
        if self._ticker is not None:
            self._ticker.cancel()
        if actor is not None and actor.exit_code is None and self.journal is not None \
                and self.journal.failed is None:
            self.lease.release()
        self.lease.close()


class _Stopped(Exception):
    """A signal to stop while standing by, blocking."""
