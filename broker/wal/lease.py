"""The lease (issue 43; ha-journal.md C): which of the instances on one journal leads.

There is no standby flag.  Every instance runs the same `zstalk serve --journal …`, and a
NATS KV key decides: bucket `zstalk_<name>`, key `leader`, its value JSON `{epoch,
instance, advertise, seq}` (`Holder`).  The leader renews it every RENEW_S with a
compare-and-set on the key's revision (`kv.update(last=)`); an instance standing by
looks at it every POLL_S and claims it (compare-and-set to epoch + 1; create, when there
is no key or it was deleted) once it is vacant, or once its revision has not moved for
`--journal-lease-ms` on the standby's *own* monotonic clock (`Watch`: NATS's message TTL
counts in whole seconds, too coarse, and no two machines' clocks are compared).  Losing
the race leaves it standing by.

The lease is for liveness and for finding the leader, not for safety: a leader whose
lease lapsed while it was stopped may still append, and what fences it is the stream's
own compare-and-set (Nats-Expected-Last-Sequence, jetstream.py), behind the EPOCH message
the new leader appends at takeover.  The lease is the second detector: a renewal refused
because the key moved, and not to a value of ours (a renewal whose acknowledgement was
lost and came back as a refusal of its retry), means deposed (`lost`), even for a leader
that has no traffic to append.  A renewal that fails for want of NATS is tried again;
the journal's --journal-timeout decides when NATS has been gone too long.

Beside `leader`, each warm standby keeps a key `standby.<instance>` (`Standby`): the
sequence it has folded in (follow.py), which `zstalk journal status` reads, and the
leader watches (`standbys`: its metrics give each one's lag).  A standby killed leaves its
key, and a standby started again is a new instance, so the leader purges a key it has not
seen refreshed for FORGET_S on its own clock (`forgotten`: from its watch's start, for the
keys it found there).

At a graceful stop the leader deletes the key with a compare-and-set (`release`), so a
standby claims it at its next look instead of after the lease.

The lease runs on a thread of its own, with its own loop and NATS connection, from the
first look to the process's end: at takeover the stream's replay and the core's build
hold the main thread for as long as the state is large, and the lease must be renewed
meanwhile (the GIL switches to this thread every 5 ms).  The other side of it: a
thread of its own would renew for a leader whose event loop is stuck (a blocking call, a
loop that never yields, a stderr nobody reads), and every client would wait on a broker
that never answers while the lease says it leads.  So once the broker is built, its loop
stamps the time each RENEW_S (`turned`, run/leading.py), and a renewal is skipped while
that stamp is older than --journal-stall-ms (`stalled_for`): the lease lapses and a
standby takes over; a stuck loop that turns again finds the key moved and is deposed.
`Watch`, `Holder` and `stalled_for` are pure; `Lease` is their I/O.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import math
import threading
import time
from typing import Callable, NamedTuple

from . import stream as S

log = logging.getLogger("zstalk.journal")
KEY = "leader"
#: the leader renews this often (a standby's default lapse, 1.5 s, is six renewals)
RENEW_S = 0.25
#: a standby looks at the key this often (a released lease is claimed within it)
POLL_S = 0.1
#: a NATS request of the lease waits this long for its answer
REQUEST_S = 1.0
#: how long a graceful stop tries to release the lease (Lease.release)
RELEASE_S = 4.0
#: a bucket being made while the cluster forms is given this long
MAKE_S = 15.0
#: the start (connect, check the stream, the bucket) is given this long in all
OPEN_S = 60.0
#: a standby's key not refreshed this long (it says every 2 s, follow.py) is a silent one's
SILENT_S = 10.0
#: the leader purges a standby's key it has not seen refreshed for this long (a standby
#: killed leaves its key, and each start is a new instance: keys would pile up)
FORGET_S = 600.0


class Holder(NamedTuple):
    """The lease's value: who leads, under which epoch, where it is reached, and the
    stream sequence it had made durable at its last renewal."""
    epoch: int
    instance: str
    advertise: str = ""
    seq: int = 0

    def encode(self) -> bytes:
        return json.dumps(self._asdict(), separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes | None) -> "Holder | None":
        """The value read back; None for one that is not ours to read (it is still timed)."""
        try:
            d = json.loads(data or b"")
            return cls(int(d["epoch"]), str(d["instance"]), str(d.get("advertise", "")),
                       int(d.get("seq", 0)))
        except (ValueError, TypeError, KeyError, AttributeError):
            return None


def bucket_name(opts: S.Options) -> str:
    return f"zstalk_{opts.name}"


class Standby(NamedTuple):
    """What a standby publishes in the bucket, under `standby.<instance>`, every few
    seconds while it follows the stream (follow.py): the sequence it folded in, the
    stream's last as it saw it, and when (wall clock: read on another machine, only to
    say how long ago; a standby gone leaves its key, growing old)."""
    instance: str
    applied: int
    stream_last: int
    wall: float

    PREFIX = "standby."

    @classmethod
    def key(cls, instance: str) -> str:
        return cls.PREFIX + instance

    def encode(self) -> bytes:
        return json.dumps(self._asdict(), separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes | None) -> "Standby | None":
        try:
            d = json.loads(data or b"")
            return cls(str(d["instance"]), int(d["applied"]), int(d["stream_last"]),
                       float(d["wall"]))
        except (ValueError, TypeError, KeyError, AttributeError):
            return None


class Watch:
    """What a standby has seen of the lease, on its own clock.  `seen` each look;
    `lapsed(now)` says whether to claim: the key is vacant (never made, or deleted), or
    its revision has not moved for `lease_s` since this standby first saw it so."""

    def __init__(self, lease_s: float) -> None:
        self.lease_s = lease_s
        self.revision: int | None = None    # the key's (or its delete marker's); None: not looked
        self.changed = -math.inf            # when we saw `revision` first
        self.holder: Holder | None = None
        self.vacant = False
        self.epoch = 0                      # the highest epoch seen

    def seen(self, revision: int, holder: Holder | None, now: float,
             vacant: bool = False) -> None:
        if revision != self.revision:
            self.revision, self.changed = revision, now
        self.holder, self.vacant = holder, vacant
        if holder is not None:
            self.epoch = max(self.epoch, holder.epoch)

    def lapsed(self, now: float) -> bool:
        if self.revision is None:
            return False
        return self.vacant or now - self.changed >= self.lease_s

    def unsure(self, now: float) -> None:
        """A claim NATS could not take (no answer, no stream leader while it elects one):
        the leader may have been as unable to renew, so its lease runs again from now
        (else every NATS election longer than the lease would depose a healthy leader)."""
        self.changed = now


def stalled_for(turned: float | None, now: float, stall_s: float) -> float:
    """How long the leader's loop has not turned, once that is longer than `stall_s`; 0
    while it turns, or when nothing is watched (`turned` None: the broker not built yet;
    `stall_s` 0: --journal-stall-ms 0)."""
    if turned is None or not stall_s:
        return 0.0
    return now - turned if now - turned > stall_s else 0.0


def forgotten(said_at: dict, now: float, forget_s: float) -> list[str]:
    """The standbys (instance -> when the leader last saw its key refreshed, on the
    leader's monotonic clock) silent for longer than `forget_s`, sorted."""
    return sorted(instance for instance, at in said_at.items() if now - at > forget_s)


async def _quietly(coro) -> None:
    """Await `coro`, its failure ignored (an unsubscribe from a NATS that is gone)."""
    try:
        await asyncio.wait_for(coro, REQUEST_S)
    except Exception:
        pass


def ours(holder: Holder | None, instance: str, epoch: int) -> bool:
    return holder is not None and holder.instance == instance and holder.epoch == epoch


class Lease:
    """The lease of one journal, on a thread of its own (module comment).

    `start()` connects, checks (or makes) the stream and the bucket, and starts standing
    by; `won` is a concurrent Future of the epoch claimed; from then on the lease is
    renewed, with `seq()` as the value's seq, until `release()` (a graceful stop) or
    `close()`, except while `turned()` (when the leader's loop last turned) is older than
    the options' stall_s.  `lost` is None, or why another instance leads now;
    `on_lost(why)` is called, on the lease's thread, once it is known."""

    def __init__(self, opts: S.Options, instance: str, advertise: str = "") -> None:
        self.opts = opts
        self.instance = instance
        self.advertise = advertise
        self.bucket = bucket_name(opts)
        self.epoch = 0
        self.revision = 0
        self.seq: Callable[[], int] = lambda: 0
        self.turned: Callable[[], float] | None = None     # (monotonic; run/leading.py)
        self.lost: str | None = None
        self._on_lost: Callable[[str], None] | None = None
        self.won: concurrent.futures.Future = concurrent.futures.Future()
        self.won_at = 0.0                   # (monotonic) when it was claimed
        self.standbys: dict[str, Standby] = {}  # while leading: instance -> its word
        self._said_at: dict[str, float] = {}    # while leading: instance -> seen (monotonic)
        self.watch = Watch(opts.lease_s)
        self.nc = None
        self.kv = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._task: asyncio.Task | None = None
        self._stopping = False

    # -- the thread -------------------------------------------------------------------------
    def start(self, max_job_size: int) -> None:
        """Connect and stand by; raises stream.JournalError (NATS out of reach, a stream
        refused: the same exits as at a start without a lease)."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="zstalk-lease",
                                        daemon=True)
        self._thread.start()
        try:
            self._call(self._open(max_job_size), OPEN_S)
        except concurrent.futures.TimeoutError:
            self.close()
            raise S.JournalError(f"NATS at {', '.join(self.opts.urls)}: the lease's start "
                                 f"took over {OPEN_S:g} s") from None
        except BaseException:
            self.close()
            raise
        self._loop.call_soon_threadsafe(self._begin)

    def _begin(self) -> None:
        self._task = self._loop.create_task(self._run())

    def _call(self, coro, timeout_s: float | None):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    def heard(self) -> list:
        """While leading: the standbys that said where they are lately (a standby gone
        leaves its key behind, silent)."""
        now = time.time()
        return [said for _, said in sorted(self.standbys.items())
                if now - said.wall < SILENT_S]

    def on_lost(self, callback: Callable[[str], None]) -> None:
        """Call `callback(why)` once the lease is lost (at once if it already is)."""
        self._on_lost = callback
        if self.lost is not None:
            callback(self.lost)

    def release(self, timeout_s: float = RELEASE_S) -> bool:
        """A graceful stop: no more renewals, and the key deleted if it is still ours, so
        a standby claims it at its next look.  Whether it was."""
        if self._loop is None or not self.won.done() or self.lost is not None:
            return False
        try:
            return self._call(self._release(time.monotonic() + timeout_s), timeout_s + 1.0)
        except Exception as exc:
            log.warning("journal: the lease was not released (%s): a standby takes over "
                        "once it lapses", exc)
            return False

    def close(self) -> None:
        """End the thread (a deposed or standby instance: nothing released)."""
        if self._loop is None or self._loop.is_closed():
            return
        self._stopping = True
        try:
            self._call(self._close(), 3.0)
        except Exception:
            pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(3.0)
        if not self._thread.is_alive():
            self._loop.close()
        if not self.won.done():
            self.won.cancel()

    # -- on the lease's loop ------------------------------------------------------------------
    async def _open(self, max_job_size: int) -> None:
        self.nc = await S.connect(self.opts)
        await S.open_stream(self.nc, self.opts, max_job_size, warn=False)
        self.kv = await self._bucket()

    async def _bucket(self):
        from nats.js import api
        from nats.js.errors import BucketNotFoundError
        js = self.nc.jetstream(timeout=REQUEST_S * 5)
        until = time.monotonic() + MAKE_S
        while True:
            try:
                return await js.key_value(self.bucket)
            except BucketNotFoundError:
                pass
            try:
                return await js.create_key_value(api.KeyValueConfig(
                    bucket=self.bucket, history=1, replicas=self.opts.replicas,
                    storage=api.StorageType.FILE,
                    description="zstalk's lease: which instance leads the journal"))
            except Exception as exc:
                if time.monotonic() > until:
                    raise S.JournalError(f"NATS at {', '.join(self.opts.urls)}: cannot make "
                                         f"the lease's bucket {self.bucket}: {exc}") from None
                await asyncio.sleep(0.25)       # (made meanwhile by another, or forming)

    async def _close(self) -> None:
        if self._task is not None and self._task is not asyncio.current_task():
            self._task.cancel()
            await asyncio.wait({self._task}, timeout=1.0)
        if self.nc is not None:
            try:
                await self.nc.close()
            except Exception:
                pass

    async def _run(self) -> None:
        try:
            epoch = await self._stand_by()
        except asyncio.CancelledError:
            return
        self.epoch = epoch
        self.won_at = time.monotonic()
        self.won.set_result(epoch)
        watching = [asyncio.ensure_future(self._watch_standbys()),
                    asyncio.ensure_future(self._forget_silent())]
        try:
            await self._renew()
        finally:
            for task in watching:
                task.cancel()
            await asyncio.wait(watching, timeout=1.0)

    async def _watch_standbys(self) -> None:
        """While leading: each standby's latest word (its key, pushed to a KV watch as it
        publishes it) in `standbys`, a dict replaced whole (read on another thread)."""
        while not self._stopping:
            watcher = None
            try:
                watcher = await self.kv.watch(Standby.PREFIX + "*")
                async for entry in watcher:
                    if entry is None:           # (the keys there were: now the updates)
                        continue
                    instance = entry.key[len(Standby.PREFIX):]
                    said = Standby.decode(entry.value) if entry.operation in (None, "PUT") \
                        else None
                    rest = {k: v for k, v in self.standbys.items() if k != instance}
                    self.standbys = {**rest, instance: said} if said else rest
                    if said:
                        self._said_at[instance] = time.monotonic()
                    else:
                        self._said_at.pop(instance, None)
            except asyncio.CancelledError:
                raise
            except Exception as exc:            # (NATS away: watched again)
                log.debug("journal: watching the standbys: %s", exc)
            finally:        # (its consumer's timers end with it, not as pending tasks)
                if watcher is not None:
                    await _quietly(watcher.stop())
            await asyncio.sleep(1.0)

    async def _forget_silent(self) -> None:
        """While leading, every FORGET_S / 10: purge the keys of standbys long silent."""
        while not self._stopping:
            await asyncio.sleep(FORGET_S / 10)
            for instance in forgotten(self._said_at, time.monotonic(), FORGET_S):
                try:
                    await asyncio.wait_for(self.kv.purge(Standby.key(instance)), REQUEST_S)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:        # (NATS away: the next round)
                    log.debug("journal: forgetting standby %s: %s", instance, exc)
                    continue
                self._said_at.pop(instance, None)
                log.info("journal: standby %s said nothing for %.0f s: its key is purged",
                         instance, FORGET_S)

    async def _stand_by(self) -> int:
        """Look every POLL_S until the lease is ours: the epoch claimed."""
        said = False
        while not self._stopping:
            looked = await self._look()
            h = self.watch.holder
            if looked and h is not None and h.instance == self.instance:
                self.revision = self.watch.revision     # (a claim whose answer was lost)
                return h.epoch
            if looked and self.watch.lapsed(time.monotonic()):
                epoch = await self._claim()
                if epoch:
                    return epoch
            elif looked and not said and h is not None:
                said = True
                log.info("journal: standing by: instance %s leads (epoch %d%s)", h.instance,
                         h.epoch, f", {h.advertise}" if h.advertise else "")
            await asyncio.sleep(POLL_S)
        raise asyncio.CancelledError

    async def _look(self) -> bool:
        """The key now, into the watch; False when NATS did not answer."""
        from nats.js.errors import KeyNotFoundError
        try:
            entry = await asyncio.wait_for(self.kv.get(KEY), REQUEST_S)
        except KeyNotFoundError as exc:            # never made, or deleted
            entry = getattr(exc, "entry", None)
            self.watch.seen(entry.revision if entry else 0, None, time.monotonic(), True)
            return True
        except Exception as exc:                   # (a timeout: NATS away or electing)
            log.debug("journal: the lease could not be read: %s", exc)
            return False
        self.watch.seen(entry.revision, Holder.decode(entry.value), time.monotonic())
        return True

    async def _claim(self) -> int:
        """Compare-and-set the key to the next epoch: it, or 0 (another was faster)."""
        from nats.js.errors import KeyWrongLastSequenceError
        epoch = max(self.watch.epoch, await self._stream_epoch()) + 1
        value = Holder(epoch, self.instance, self.advertise, 0).encode()
        try:        # (last=0: the key must not exist; a deleted one's: its marker's)
            revision = await asyncio.wait_for(
                self.kv.update(KEY, value, last=self.watch.revision), REQUEST_S)
        except KeyWrongLastSequenceError:
            log.info("journal: another instance claimed the lease first: standing by")
            return 0
        except Exception as exc:        # (its answer lost: the next look may show it ours)
            log.debug("journal: claiming the lease: %s", exc)
            self.watch.unsure(time.monotonic())
            return 0
        self.revision = revision
        log.info("journal: the lease is ours (epoch %d)", epoch)
        return epoch

    async def _stream_epoch(self) -> int:
        """The epoch the stream's last message was appended under (a lease released
        leaves none behind it to read)."""
        try:
            js = self.nc.jetstream(timeout=REQUEST_S)
            msg = await js.get_msg(self.opts.stream, subject=self.opts.subject)
            return int((msg.headers or {}).get(S.H_EPOCH, 0))
        except Exception:               # (an empty stream)
            return 0

    async def _renew(self) -> None:
        """Every RENEW_S: compare-and-set the key to our value (module comment)."""
        from nats.js.errors import KeyWrongLastSequenceError
        stalled = 0.0
        while not self._stopping:
            await asyncio.sleep(RENEW_S)
            if self._stopping:
                return
            stalled = self._stalled(stalled)
            if stalled:
                continue
            value = Holder(self.epoch, self.instance, self.advertise, self.seq()).encode()
            try:
                self.revision = await asyncio.wait_for(
                    self.kv.update(KEY, value, last=self.revision), REQUEST_S)
            except KeyWrongLastSequenceError:
                if not await self._still_ours():
                    return
            except asyncio.CancelledError:
                raise
            except Exception as exc:    # NATS away: the journal's timeout decides
                log.debug("journal: renewing the lease: %s", exc)

    def _stalled(self, before: float) -> float:
        """How long the leader's loop has been stuck (0: it turns), saying when that
        starts and ends (`before`: what the last renewal's turn found)."""
        turned = self.turned() if self.turned is not None else None
        stalled = stalled_for(turned, time.monotonic(), self.opts.stall_s)
        if stalled and not before:
            log.warning("journal: the broker's loop has not turned for %.1f s "
                        "(--journal-stall-ms %d): the lease is no longer renewed, so a "
                        "standby takes over; this instance is deposed if its loop turns "
                        "again after that", stalled, round(self.opts.stall_s * 1000))
        elif before and not stalled:
            log.warning("journal: the broker's loop turns again after %.1f s or more: "
                        "renewing the lease, if it is still ours", before)
        return stalled

    async def _still_ours(self) -> bool:
        """A renewal refused: ours after all (a retry of one that was stored), or lost."""
        if not await self._look():
            return True                 # (not read: the next renewal says)
        if ours(self.watch.holder, self.instance, self.epoch):
            self.revision = self.watch.revision
            return True
        h = self.watch.holder
        who = f"instance {h.instance} leads (epoch {h.epoch})" if h else "it was deleted"
        self._lose(f"journal: the lease is no longer ours ({who}): this one is deposed "
                   f"and stops without answering")
        return False

    def _lose(self, why: str) -> None:
        self.lost = why
        if self._on_lost is not None:
            self._on_lost(why)

    async def _release(self, deadline: float) -> bool:
        """Delete the key while it is ours, trying again until `deadline` (monotonic): a
        NATS electing the bucket's leader (a node restarted a moment ago) answers nothing
        for a second or two, and a lease not released costs a whole lease of waiting.  A
        delete whose answer was lost shows as the key gone at the next look."""
        from nats.js.errors import KeyWrongLastSequenceError
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        while (left := deadline - time.monotonic()) > 0:
            try:
                await asyncio.wait_for(self.kv.delete(KEY, last=self.revision),
                                       min(left, REQUEST_S))
                log.info("journal: the lease is released (epoch %d)", self.epoch)
                return True
            except KeyWrongLastSequenceError:
                if not await self._look():
                    continue
                if self.watch.holder is None:       # (our delete went through, unanswered)
                    log.info("journal: the lease is released (epoch %d)", self.epoch)
                    return True
                if not ours(self.watch.holder, self.instance, self.epoch):
                    return False
                self.revision = self.watch.revision
            except asyncio.TimeoutError:
                log.debug("journal: releasing the lease: no answer yet, asking again")
            except Exception as exc:                # (NATS reconnecting: asked again)
                log.debug("journal: releasing the lease: %s", exc)
                await asyncio.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))
        raise TimeoutError(f"no answer from NATS at {', '.join(self.opts.urls)} in the "
                           f"time a stop gives it")
