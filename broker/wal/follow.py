"""A warm standby (issue 43; ha-journal.md C.1, G): while an instance stands by, it follows
the journal's stream and folds each message in as the leader appends it, so that a
takeover reads only the tail it had not seen yet, fences, and builds the core from the
fold: the time to take over no longer grows with the stream's length.

How it follows: on a thread of its own, with its own loop and NATS connection, as the
lease runs (lease.py): the lease's looks every 100 ms must not wait behind a burst of
messages being folded, and the main thread stays free to take the fold over.  An
ordered consumer (stream.subscribe: what nats-py's KV watch and object store read with,
flow-controlled, made again by nats-py from the next sequence when its node goes) starts
at the fold's next message, and each message is folded in (fold.py: the same fold a
start's replay does).  Every LOOK_S the stream's info is read: its last sequence says
how far the fold is behind (`lag`), its first which messages compaction purged (their
Spans go); and the sequence folded in is published in the lease's bucket under
`standby.<instance>` (lease.py's Standby), for `zstalk journal status`.

A message that is not the one after the fold's last is a gap.  If the stream's first
message is past the fold's next, compaction purged what the fold had not seen, and a
fold missing a purged DELETE would keep a deleted job: the fold is dropped and the
stream folded again from its first message (`rebuilds`).  Otherwise the consumer lost a
message (a slow consumer's drop) and is made again from the fold's next.  A corrupt
message stops the following, fold dropped: the takeover then reads the stream from its
start and refuses it as a start would.  NATS away: the client reconnects for ever, and
the fold waits where it is.

`take()`, at takeover (leading.py, through the journal's options: opts.warm): the
following stops between two messages, the standby's key goes, and the fold is handed
to the restore (jetstream.py), which reads on from its last message.  This module keeps
nothing after that.

Memory: the fold is what a restore builds (the live jobs with their bodies, tasks,
schedules), plus one Span per message the stream still holds, as the leader's books;
messages delivered and not yet folded are bounded by the consumer's flow control (and at
worst stream.PENDING_BYTES).
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time

from . import stream as S
from .fold import Fold
from .lease import Standby, bucket_name

log = logging.getLogger("zstalk.journal")
#: the stream's info is read, and the standby's sequence published, this often
LOOK_S = 2.0
#: after a failure (NATS away, a request unanswered), the wait before following again
RETRY_S = 0.5
#: take() waits this long for the following to stop between two messages
TAKE_S = 5.0


class Follower:
    """One standby's fold of the stream, kept on a thread of its own (module comment)."""

    def __init__(self, opts: S.Options, instance: str) -> None:
        self.opts = opts
        self.instance = instance
        self.fold: Fold | None = Fold()
        self.stream_first = self.stream_last = 0    # as the last look saw them
        self.rebuilds = 0
        self.error: str | None = None       # a corrupt message: following stopped
        self.nc = None
        self.kv = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._task: asyncio.Task | None = None
        self._stopping = False          # (take(): no message is folded in after it)

    @property
    def applied(self) -> int:
        return self.fold.last_seq if self.fold is not None else 0

    @property
    def lag(self) -> int:
        """Messages the stream had at the last look that the fold has not (0: caught up)."""
        return max(0, self.stream_last - self.applied)

    def start(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="zstalk-follow",
                                        daemon=True)
        self._thread.start()
        self._loop.call_soon_threadsafe(self._begin)

    def _begin(self) -> None:           # (before take()'s _halt, whenever that comes)
        self._task = self._loop.create_task(self._run())

    def take(self) -> Fold | None:
        """Stop following: the fold (None when it cannot be used: a corrupt message, or
        the following did not stop in time).  The standby's key is deleted and the
        connection closed afterwards, on the follower's thread: a takeover does not wait
        for NATS (its stream leader may be the node that went)."""
        if self._loop is None or self.fold is None:     # (never started, or taken)
            return None
        stopped = True
        try:
            asyncio.run_coroutine_threadsafe(self._halt(), self._loop).result(TAKE_S)
        except Exception as exc:
            log.warning("journal: the standby's following did not stop (%s): the takeover "
                        "reads the stream from its start", exc)
            stopped = False
        asyncio.run_coroutine_threadsafe(self._leave(), self._loop)
        fold, self.fold = self.fold, None
        return fold if stopped and self.error is None else None

    close = take        # (a standby that stops: the fold is dropped with it)

    def said(self) -> str:
        """What /leader says of it on a standby."""
        if self.error is not None:
            return "not following: " + self.error
        again = f", folded again from the stream's first {self.rebuilds} times" \
            if self.rebuilds else ""
        return f"folded in through {self.applied}, {self.lag} behind{again}"

    # -- on the follower's loop ---------------------------------------------------------------
    async def _halt(self) -> None:
        """The following stopped at an await, between two messages.  Cancelled again until
        it is: nats-py's next_msg runs asyncio.wait_for in a task of its own, and on
        Python 3.11 a wait_for whose message arrives as it is cancelled returns the
        message and loses the cancellation (seen: the takeover then waited TAKE_S)."""
        self._stopping = True
        while self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.wait({self._task}, timeout=0.05)

    async def _leave(self) -> None:
        """The standby's key deleted, the connection closed, the thread's loop ended."""
        try:
            if self.kv is not None:
                await asyncio.wait_for(self.kv.delete(Standby.key(self.instance)), 2.0)
            if self.nc is not None:
                await asyncio.wait_for(self.nc.close(), 2.0)
        except Exception:
            pass
        finally:
            asyncio.get_running_loop().call_soon(asyncio.get_running_loop().stop)

    async def _run(self) -> None:
        while self.error is None and not self._stopping:
            try:
                await self._follow()
            except asyncio.CancelledError:
                raise
            except S.JournalError as exc:       # (a corrupt message)
                self.error = str(exc)
                log.error("journal: the standby stops following the stream: %s", exc)
                return
            except Exception as exc:            # (NATS away, a request unanswered)
                log.debug("journal: following the stream: %s", exc)
                await asyncio.sleep(RETRY_S)

    async def _follow(self) -> None:
        """Fold messages in until a gap (then the caller comes back: a new consumer)."""
        if self.nc is None:
            self.nc = await S.connect(self.opts, retry=True)
        js = self.nc.jetstream(timeout=5)
        await self._look(js)
        sub = await S.subscribe(self.nc, self.opts, self.applied + 1)
        try:
            await self._fold_until_a_gap(sub, js)
        finally:
            try:
                await sub.unsubscribe()
            except Exception:
                pass

    async def _fold_until_a_gap(self, sub, js) -> None:
        next_look = time.monotonic() + LOOK_S
        while not self._stopping:
            try:
                msg = await sub.next_msg(timeout=max(0.01, next_look - time.monotonic()))
            except (asyncio.TimeoutError, TimeoutError):
                msg = None
            if msg is not None:
                seq = msg.metadata.sequence.stream
                if not self.fold.expects(seq):
                    log.info("journal: the standby's next message is %d, not %d: following "
                             "again", seq, self.applied + 1)
                    return
                S.apply(self.fold, msg)
            if time.monotonic() >= next_look:
                if not await self._look(js):
                    return
                next_look = time.monotonic() + LOOK_S

    async def _look(self, js) -> bool:
        """The stream's first and last sequences; False when the fold had to start again
        (compaction purged messages it had not folded in)."""
        info = await js.stream_info(self.opts.stream)
        self.stream_first, self.stream_last = info.state.first_seq, info.state.last_seq
        if not S.continues(self.fold, info):
            log.warning("journal: messages after %d were purged before the standby folded "
                        "them in: folding the stream again from its first", self.applied)
            self.fold = Fold()
            self.rebuilds += 1
            return False
        self.fold.forget_below(info.state.first_seq)
        await self._publish(js)
        return True

    async def _publish(self, js) -> None:
        """The standby's sequence in the lease's bucket (best effort: status reads it)."""
        try:
            if self.kv is None:
                self.kv = await js.key_value(bucket_name(self.opts))
            value = Standby(self.instance, self.applied, self.stream_last, time.time())
            await asyncio.wait_for(self.kv.put(Standby.key(self.instance), value.encode()),
                                   1.0)
        except Exception as exc:
            log.debug("journal: publishing the standby's sequence: %s", exc)
