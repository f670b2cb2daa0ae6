"""The journal on NATS JetStream (`--journal nats://…`): the core's records in a replicated
stream, one message per turn, every reply held until an append made in or after its turn
is acknowledged, and a writer that another one has replaced stops.

How it is used: it is the core's journal (core/shared/journal.py), as the binlog is; the
records are the binlog's own bytes (records.py, format.py), a message's payload is a
binlog frame of them, and stream.py says what else a message carries and what a start
checks.  Per record kind `append` encodes the record at once into `pending` (`_tables`);
`end_turn` gives the turn a ticket and sends what is pending as one append, or leaves it
to accumulate while `inflight` appends are already out (group commit: later turns ride
on the next); a turn with no records sends an empty one (a barrier) when nothing is in
flight, else rides on the next too.  `durable` is the ticket of the last append whose
acknowledgement came with every earlier one's; the actor holds a turn's replies until it
covers them (`hold_replies`), so a broker that lost the journal to another writer has
answered nothing from memory the stream does not hold: not a put, not a reserve, not a
stats.  A reserve appends the job's JOB_HELD (`logs_reserves`), so the next broker keeps
it from other clients for its holder's front, as after a graceful stop.

Fencing (Temporal's range_id, with JetStream as the database): every append carries
Nats-Expected-Last-Sequence = the sequence before its own (the k-th in flight: last + k),
so an append is stored only if nothing else was appended since, and Nats-Msg-Id
`<writer>-<sequence>`, so an append retried after its acknowledgement was lost (a
reconnect, a timeout) is answered as the duplicate it is.  A refusal as out of sequence
is read: when the message at our sequence is ours (a retry outside the duplicate
window), it counts as acknowledged; when an earlier append of ours is missing, ours go
again in order; when the message is another writer's, we are deposed: what is held is
dropped (never acknowledged), nothing more is sent, and the broker exits DEPOSED_EXIT.
No acknowledgement for --journal-timeout while an append waits: exit UNAVAILABLE_EXIT
(held replies meanwhile are bounded by the fronts' credit per connection).

Takeover: an instance that claimed the lease (lease.py) is given its epoch in the
options, and its restore reads the stream to its end (only the tail, on from the fold a
warm standby kept while it stood by: opts.warm, follow.py) and fences it there before the
core is built (takeover.py); every later
append carries Zstalk-Epoch; `depose()` is the lease's way to stop us when the key says
another leads.

Compaction as the binlog's: each message is a Span (stream.py) that knows the full records
it holds and how many are still the latest of something live; while the stream holds
more than twice the live records' bytes plus COMPACT_SLACK, live records of the oldest
messages are copied forward, a few thousand per turn (a function's latest room draw,
ROOM_DRAW, from this journal's own books: it has no GONE and stays live for good), and
once the copies are
acknowledged the stream is purged up to the first message still holding something live
(never the last, whose Zstalk-Next-Id header keeps ids going up; the slow rates' TATs go
again in a later message first).
"""
from __future__ import annotations

import asyncio
import collections
import json
import logging
import random
import time

from . import format as wf, records, stream as S, takeover
from ..core.shared import journal as J
from ..core.beanstalk.jobs import RESERVED, Job
from ..core.schedules.schedules import Schedule
from ..core.tasks.store import Task
from ...protocol.codecs.prometheus import LATENCY_BUCKETS, Histogram, Sample

log = logging.getLogger("zstalk.journal")
_MIGRATE_SCAN_PER_TURN = 4096
#: compaction starts once the stream holds this much beyond twice the live records
COMPACT_SLACK = 8 * 1024 * 1024
#: an append not acknowledged this long is sent again (same id: NATS answers a duplicate)
RESEND_S = 1.0
#: what a pending record is: nobody's latest full record, or a job's, a task's, a
#: schedule's, a function's room draw's, a paused function's (binlog.py's own)
_NOWHERE, _JOB, _TASK, _SCHEDULE, _DRAW, _FUNCTION = 0, 1, 2, 3, 4, 5


class Append:
    """One message: what it is, where it must land, which turns it covers."""
    __slots__ = ("seq", "covers", "headers", "payload", "sent", "acked", "tries")

    def __init__(self, seq: int, covers: int, headers: dict, payload: bytes) -> None:
        self.seq = seq
        self.covers = covers
        self.headers = headers
        self.payload = payload
        self.sent = 0.0
        self.acked = False
        self.tries = 0


class JetStreamJournal:
    hold_replies = True
    logs_reserves = True

    def __init__(self, opts: S.Options) -> None:
        self.opts = opts._replace(warm=None)    # (the fold is taken once, at restore)
        self._warm = opts.warm
        self.writer = opts.instance or f"{random.getrandbits(64):016x}"
        self.epoch = opts.epoch             # the lease's, 0 without one (lease.py)
        self.state_id = 0
        self.wall_offset = 0.0
        self.next_id = 1                    # the core's, as the last append said it
        self.pending: list = []             # (record bytes, _NOWHERE/_JOB/..., subject)
        self.turn = 0                       # tickets given
        self.durable = 0
        self.sent_turn = 0                  # the last ticket an append sent covers
        self.wanted = 0                     # the last ticket replies wait for
        self.inflight: collections.deque[Append] = collections.deque()
        self.last_seq = 0                   # the last sequence given to an append
        self.acked_seq = 0                  # the last one acknowledged with all before it
        self.failed: tuple[int, str] | None = None   # (exit code, why): stop
        self.gates: dict | None = None      # to send with the next append
        self.last_gates: dict = {}
        self.gates_seq = 0
        # compaction's books (stream.Span per message, oldest first)
        self.spans: dict[int, S.Span] = {}
        self.first_seq = 1
        self.stream_bytes = 0
        self.live_bytes = 0
        self.task_file: dict[str, int] = {}
        self.task_size: dict[str, int] = {}
        self.task_extra: dict[str, dict] = {}
        self.schedule_file: dict[str, int] = {}
        self.schedule_size: dict[str, int] = {}
        self.draws = records.DrawBooks()    # each function's latest room draw
        self.draws_pending: set[str] = set()    # draws whose latest record is not sent yet
        # paused functions -> the message holding the record that paused them (0: unsent)
        self.function_file: dict[str, int] = {}
        self._tube_bytes: dict[str, bytes] = {}
        self.purging = False
        self.max_bytes = -1                 # the stream's max_bytes (-1: no limit)
        self.max_payload = 1 << 20
        self.records_written = 0
        self.records_migrated = 0
        self.appends = 0
        self.ack_seconds = Histogram(LATENCY_BUCKETS)
        self.sync_said = ""                 # the start line's word on sync_interval
        self.took_over_s = 0.0              # the lease claimed -> the broker built (leading.py)
        self.standbys = list                # () -> the standbys heard lately (lease.py)
        self.nc = None
        self.js = None
        self.inbox = ""
        self.loop: asyncio.AbstractEventLoop | None = None
        self.on_durable = None
        self._tick: asyncio.TimerHandle | None = None
        self._retry: asyncio.TimerHandle | None = None
        self._outbox: collections.deque[Append] = collections.deque()   # to publish
        self._wake: asyncio.Event | None = None
        self._tasks: list[asyncio.Task] = []
        self._progress = time.monotonic()   # the last acknowledgement (or the wait's start)
        self._tables()

    # -- the start ----------------------------------------------------------------------
    def restore(self, max_job_size: int = 65535) -> J.Restored:
        """Check (or make) the stream and replay it, on a loop of its own (the actor's
        does not run yet); the connection the actor's loop uses is made at start()."""
        return S.run_on_a_loop_of_its_own(self._restore(max_job_size))

    async def _restore(self, max_job_size: int) -> J.Restored:
        nc = await S.connect(self.opts)
        try:
            info = await S.open_stream(nc, self.opts, max_job_size)
            self.max_payload = nc.max_payload
            self.max_bytes = info.config.max_bytes or -1
            self.sync_said = S.sync_checked(self.opts, taking_over=bool(self.epoch))
            fold, self._warm = (self._warm() if self._warm else None), None
            if fold is not None:
                log.info("journal: taking over warm: %d messages folded in while standing "
                         "by, through %d of %d", fold.applied, fold.last_seq,
                         info.state.last_seq)
            read = await S.read(nc, self.opts, info, max_job_size, fold)
            if self.epoch:
                read, info = await takeover.fence(nc, self.opts, self.writer, self.epoch,
                                                  read, info, max_job_size)
        finally:
            await nc.close()
        return self._account(read, info)

    def _account(self, read: S.Read, info) -> J.Restored:
        replayed = read.replayed
        self.spans = read.spans
        self.last_seq = self.acked_seq = read.last_seq
        self.first_seq = min(self.spans, default=0) or info.state.first_seq \
            or read.last_seq + 1
        self.stream_bytes = sum(span.size for span in self.spans.values())
        self.gates_seq = read.gates_seq
        self.last_gates = dict(replayed.gates)
        self.state_id = replayed.state_id or random.getrandbits(63) or 1
        self.next_id = replayed.next_id
        spans = self.spans
        for rec, tube, body, seq in replayed.jobs.values():
            self._span(seq).live += 1
            self.live_bytes += wf.JOB_FIXED_SIZE + rec[13] + rec[14]
        tasks = []
        for uid, (fields, seq) in replayed.tasks.items():
            tasks.append(records.task_image(fields))
            self._restored(self.task_file, self.task_size, uid, seq, wf.encode_task(fields))
            extra = records.unknown_optional(fields)
            if extra:
                self.task_extra[uid] = extra
        schedules = []
        for name, (fields, seq) in replayed.schedules.items():
            schedules.append(records.schedule_image(fields))
            self._restored(self.schedule_file, self.schedule_size, name, seq,
                           wf.encode_schedule(fields))
        draws = self.draws.restore(replayed.draws)
        for name, seq in self.draws.file.items():
            self.live_bytes += self.draws.size[name]
            self._span(seq).live += 1
        for name, seq in replayed.functions.items():
            self.function_file[name] = seq
            self._span(seq).live += 1
        return J.Restored(replayed.jobs.values(), replayed.next_id, tasks, schedules,
                          replayed.gates, replayed.warnings, draws, sorted(replayed.functions))

    def _restored(self, files: dict, sizes: dict, key: str, seq: int, record: bytes) -> None:
        """A replayed task's or schedule's latest full record: in message `seq`, live."""
        files[key], sizes[key] = seq, len(record)
        self.live_bytes += len(record)
        self._span(seq).live += 1

    def _span(self, seq: int) -> S.Span:
        """The message `seq`'s Span; one of no size if a fold forgot it (never expected:
        compaction purges no message that still holds the latest of something live)."""
        span = self.spans.get(seq)
        if span is None:
            span = self.spans[seq] = S.Span(seq, 0)
        return span

    def start(self, loop, on_durable) -> None:
        """Connect on the actor's loop and append a barrier: once it is acknowledged we
        are the stream's writer (a broker that wrote before us is deposed at its next
        append)."""
        self.loop = loop
        self.on_durable = on_durable
        if self.failed is not None:     # (deposed by the lease before the loop ran)
            loop.call_soon(on_durable)
            return
        self._wake = asyncio.Event()
        self._progress = time.monotonic()
        self.turn += 1
        self._send_next(self.turn, None)
        self._tasks.append(loop.create_task(self._publisher()))
        self._arm_tick()

    async def _connect(self) -> None:
        async def disconnected() -> None:
            if self.failed is None:
                log.warning("journal: NATS connection lost; reconnecting (replies wait)")

        async def reconnected() -> None:
            log.info("journal: NATS reconnected to %s", self.nc.connected_url.netloc
                     if self.nc and self.nc.connected_url else "?")
            self._resend_all()

        async def error(exc) -> None:
            log.debug("journal: NATS: %s", exc)
        while self.nc is None and self.failed is None:
            try:
                self.nc = await S.connect(self.opts, retry=True, error_cb=error,
                                          disconnected_cb=disconnected,
                                          reconnected_cb=reconnected)
            except S.JournalError as exc:
                log.warning("journal: %s; trying again", exc)
                await asyncio.sleep(S.RETRY_S)
        if self.nc is None:
            return
        self.inbox = self.nc.new_inbox()
        await self.nc.subscribe(self.inbox + ".*", cb=self._on_ack)
        self.js = self.nc.jetstream(timeout=5)

    # -- sending --------------------------------------------------------------------------
    async def _publisher(self) -> None:
        """Publish what _send_next queued, in order (the one coroutine that does)."""
        await self._connect()
        wake, outbox = self._wake, self._outbox
        while self.failed is None:
            while outbox and self.failed is None:
                a = outbox.popleft()
                if a.acked:
                    continue
                try:
                    await self.nc.publish(self.opts.subject, a.payload,
                                          reply=f"{self.inbox}.{a.seq}", headers=a.headers)
                except Exception as exc:     # (disconnected: the tick sends it again)
                    log.debug("journal: publish of %d failed: %s", a.seq, exc)
            wake.clear()
            await wake.wait()

    def _send_next(self, covers: int, live) -> None:
        """Make the pending records (or a barrier) an append covering ticket `covers`."""
        if self.pending:
            for part in self._parts():
                self._queue(self._append(part, covers if part is None else self.sent_turn,
                                         live))
        else:
            self._queue(self._append([], covers, live))
        self.sent_turn = covers

    def _parts(self):
        """The pending records in messages within max_payload: usually one (None means
        'the rest'); a turn above it is split between records."""
        limit = self.max_payload - S.MESSAGE_OVERHEAD
        total = sum(len(r) for r, _, _ in self.pending)
        if total <= limit:
            yield None
            return
        part, size = [], 0
        pending, self.pending = self.pending, []
        for item in pending:
            if part and size + len(item[0]) > limit:
                yield part
                part, size = [], 0
            part.append(item)
            size += len(item[0])
        self.pending = part
        yield None

    def _append(self, part, covers: int, live) -> Append:
        items = self.pending if part is None else part
        seq = self.last_seq + 1
        self.last_seq = seq
        headers = {S.H_ID: f"{self.writer}-{seq}", S.H_EXPECT: str(seq - 1),
                   S.H_STATE: str(self.state_id)}
        if self.epoch:
            headers[S.H_EPOCH] = str(self.epoch)
        if live is not None:
            self.next_id = live.next_id
        headers[S.H_NEXT] = str(self.next_id)
        if self.gates is not None:
            headers[S.H_GATES] = json.dumps(self.gates)
            self.last_gates, self.gates, self.gates_seq = self.gates, None, seq
        payload = wf.encode_frame(b"".join([r for r, _, _ in items])) if items else b""
        span = self.spans[seq] = S.Span(seq, len(payload) + S._headers_size(headers))
        self.stream_bytes += span.size
        if items:
            self._place(items, span, live)
            self.records_written += len(items)
        if part is None:
            self.pending = []
        return Append(seq, covers, headers, payload)

    def _place(self, items, span: S.Span, live) -> None:
        """Full records of what is still live: their latest is in this message now."""
        jobs = live.jobs if live is not None else {}
        tasks = live.tasks if live is not None else {}
        schedules = live.schedules if live is not None else {}
        spans = self.spans
        for _, place, owner in items:
            if not place:
                continue
            if place == _JOB:
                if jobs.get(owner.id) is owner:
                    if owner.file in spans:
                        spans[owner.file].live -= 1
                    owner.file = span.seq
                    span.live += 1
                    span.ids.append(owner.id)
            elif place == _TASK:
                if tasks.get(owner.uid) is owner:
                    self._moved(self.task_file, owner.uid, span)
                    span.uids.append(owner.uid)
            elif place == _DRAW:
                self._moved(self.draws.file, owner, span)   # (`owner`: the function)
                self.draws_pending.discard(owner)
            elif place == _FUNCTION:
                if owner in self.function_file:     # (still paused: not resumed since)
                    self._moved(self.function_file, owner, span)
            elif schedules.get(owner.name) is owner:
                self._moved(self.schedule_file, owner.name, span)
                span.names.append(owner.name)

    def _moved(self, files: dict, key: str, span: S.Span) -> None:
        old = files.get(key, 0)
        if old in self.spans:
            self.spans[old].live -= 1
        files[key] = span.seq
        span.live += 1

    def _queue(self, a: Append) -> None:
        a.sent = time.monotonic()
        a.tries += 1
        if not self.inflight:
            self._progress = a.sent     # (the wait for an acknowledgement starts now)
        self.inflight.append(a)
        self._outbox.append(a)
        self.appends += 1
        if self._wake is not None:
            self._wake.set()

    def _resend_all(self) -> None:
        """Every append not acknowledged goes again, in order (same ids: NATS answers a
        stored one as a duplicate)."""
        if self.failed is not None:
            return
        now = time.monotonic()
        for a in self.inflight:
            if not a.acked:
                a.sent = now
                a.tries += 1
                self._outbox.append(a)
        if self._wake is not None:
            self._wake.set()

    # -- acknowledgements -------------------------------------------------------------------
    async def _on_ack(self, msg) -> None:
        """A PubAck, or a refusal, for the append whose sequence ends the subject."""
        try:
            seq = int(msg.subject.rsplit(".", 1)[1])
            answer = json.loads(msg.data)
        except (ValueError, IndexError):
            return
        a = self._find(seq)
        if a is None or a.acked or self.failed is not None:
            return
        error = answer.get("error")
        if error is None:
            if answer.get("seq") != seq:
                self._fail(S.DEPOSED_EXIT, f"journal: append {seq} was stored as "
                           f"{answer.get('seq')}: another writer")
            else:
                self._acked(a)
            return
        code = error.get("err_code")
        if code == S.WRONG_SEQUENCE:
            self.loop.create_task(self._out_of_sequence(a, error.get("description", "")))
        elif code in S.CANNOT_STORE:
            self._fail(S.UNAVAILABLE_EXIT, f"journal: stream {self.opts.stream} refused an "
                       f"append: {S.CANNOT_STORE[code]} ({error.get('description')})")
        else:           # (no responders while NATS elects a leader, and the like)
            log.debug("journal: append %d refused for now: %s", seq, error)
            self._retry_soon()

    def _find(self, seq: int) -> Append | None:
        if not self.inflight:
            return None
        i = seq - self.inflight[0].seq
        return self.inflight[i] if 0 <= i < len(self.inflight) else None

    def _acked(self, a: Append) -> None:
        a.acked = True
        moved = False
        now = time.monotonic()
        while self.inflight and self.inflight[0].acked:
            done = self.inflight.popleft()
            self.durable = max(self.durable, done.covers)
            self.acked_seq = done.seq
            self.ack_seconds.observe(now - done.sent)
            moved = True
        if moved:
            self._progress = now
            if self.pending and len(self.inflight) < self.opts.inflight:
                self._send_next(self.turn, self._live)
            elif self.wanted > self.sent_turn and not self.inflight:
                self._send_next(self.wanted, self._live)    # (a barrier, coalesced)
            self.on_durable()

    async def _out_of_sequence(self, a: Append, why: str) -> None:
        """Refused as out of sequence: ours after all, ours to send again, or deposed."""
        try:
            last = int(why.rsplit(":", 1)[1])
        except (ValueError, IndexError):
            last = -1
        if 0 <= last < a.seq:           # an earlier append of ours is not stored yet
            self._retry_soon()
            return
        try:
            stored = await self.js.get_msg(self.opts.stream, a.seq)
            writer = (stored.headers or {}).get(S.H_ID, "")
        except Exception as exc:
            log.warning("journal: cannot read message %d to see whose it is (%s); "
                        "trying again", a.seq, exc)
            self._retry_soon()
            return
        if self.failed is not None or a.acked:
            return
        if writer == a.headers[S.H_ID]:
            self._acked(a)              # ours: stored, its acknowledgement lost
            return
        self._fail(S.DEPOSED_EXIT, f"journal: another broker appended to stream "
                   f"{self.opts.stream} (message {a.seq} is {writer or 'not ours'}): "
                   f"this one is deposed and stops without answering")

    def _retry_soon(self) -> None:
        if self._retry is None and self.loop is not None and self.failed is None:
            self._retry = self.loop.call_later(S.RETRY_S, self._retry_now)

    def _retry_now(self) -> None:
        self._retry = None
        self._resend_all()

    def _arm_tick(self) -> None:
        self._tick = self.loop.call_later(RESEND_S / 2, self._on_tick)

    def _on_tick(self) -> None:
        """Appends unanswered for RESEND_S go again; none answered for --journal-timeout
        while one waits: we stop."""
        self._tick = None
        if self.failed is not None:
            return
        now = time.monotonic()
        if self.inflight:
            if now - self._progress > self.opts.timeout_s:
                self._fail(S.UNAVAILABLE_EXIT, f"journal: no append acknowledged by NATS "
                           f"at {', '.join(self.opts.urls)} for {self.opts.timeout_s:g} s "
                           f"(--journal-timeout): stopping, replies held are dropped")
                return
            if now - self.inflight[0].sent > RESEND_S:
                self._resend_all()
        self._arm_tick()

    def _fail(self, code: int, why: str) -> None:
        """Stop: nothing more is appended or acknowledged; the actor drops what it holds."""
        if self.failed is not None:
            return
        self.failed = (code, why)
        self.pending = []
        self._outbox.clear()
        if self._wake is not None:
            self._wake.set()
        for handle in (self._tick, self._retry):
            if handle is not None:
                handle.cancel()
        self._tick = self._retry = None
        if self.on_durable is not None:
            self.on_durable()

    # -- the turn ---------------------------------------------------------------------------
    _live = None

    def end_turn(self, now: float, live: J.LiveView) -> int:
        """The turn's ticket; its records go now if fewer than opts.inflight (2) appends
        are out, else with the next; a turn without records rides on an append in flight
        or sends a barrier."""
        self.turn += 1
        self._live = live
        if self.pending and self.failed is None and len(self.inflight) < self.opts.inflight:
            self._send_next(self.turn, live)
        return self.turn

    def wait_for(self, ticket: int) -> None:
        """Replies wait for `ticket`: a turn without records sends a barrier, unless an
        append is in flight (then the next one, sent at its acknowledgement, covers it)."""
        self.wanted = max(self.wanted, ticket)
        if not self.inflight and self.sent_turn < ticket and self.failed is None:
            self._send_next(ticket, self._live)

    def due(self) -> float | None:
        return None

    # -- records (the core's, by kind) --------------------------------------------------------
    def _tables(self) -> None:
        self.room = J.by_kind(J.accept, {
            J.JOB_PUT: self._room_put, J.TASK_NEW: self._room_record,
            J.SCHEDULE_NEW: self._room_record, J.ROOM_DRAW: self._room_record,
            J.TASK_WHOLE: self._room_record, J.FUNCTION_PAUSE: self._room_record})
        self.append = J.by_kind(J.ignore, {
            J.JOB_PUT: self.log_put, J.JOB_UPDATE: self.log_update, J.JOB_HELD: self.log_held,
            J.JOB_DELETE: self.log_delete, J.TASK_NEW: self.log_task,
            J.TASK_STATE: self.log_task_state, J.TASK_END: self.log_task_end,
            J.TASK_GONE: self.log_task_gone, J.SCHEDULE: self.log_schedule,
            J.SCHEDULE_GONE: self.log_schedule_gone, J.GATES: self._keep_gates,
            J.ROOM_DRAW: self.log_draw, J.FUNCTION_PAUSE: self.log_function,
            J.TASK_WHOLE: self.log_task})

    def _room_put(self, job: Job) -> bool:
        """A full stream refuses new work as a full disk does (OUT_OF_MEMORY); what is
        promised (deletes, states) has the slack beyond."""
        return self.failed is None and (
            self.max_bytes < 0 or self.stream_bytes + COMPACT_SLACK // 8 < self.max_bytes)

    def _room_record(self, subject) -> bool:
        return self._room_put(subject)

    def _tube(self, tube: str) -> bytes:
        encoded = self._tube_bytes.get(tube)
        if encoded is None:
            encoded = self._tube_bytes[tube] = tube.encode()
        return encoded

    def log_put(self, job: Job) -> None:
        record = records.new_job(job, self._tube(job.tube.name), self.wall_offset)
        self.live_bytes += len(record)
        self.pending.append((record, _JOB, job))

    def log_update(self, job: Job) -> None:
        i = records.job_image(job, self.wall_offset)
        self.pending.append((wf.encode_update(i.id, i.state, i.pri, i.delay_s, i.key,
                                              i.counts), _NOWHERE, None))

    def log_held(self, job: Job) -> None:
        """A reserve (and a graceful stop): the job is held by a client."""
        i = records.job_image(job, self.wall_offset)
        self.pending.append((wf.encode_update(i.id, wf.S_RESERVED, i.pri, i.delay_s, 0.0,
                                              i.counts), _NOWHERE, None))

    def log_delete(self, job: Job) -> None:
        self.live_bytes -= wf.job_record_size(job.tube.name, len(job.body))
        span = self.spans.get(job.file)
        if span is not None:
            span.live -= 1
        job.file = 0
        self.pending.append((wf.encode_delete(job.id), _NOWHERE, None))

    def _task_record(self, task: Task) -> bytes:
        return records.task_record(task, task.result, self.task_extra.get(task.uid),
                                   self.wall_offset)

    def log_task(self, task: Task) -> None:
        record = self._task_record(task)
        self.live_bytes += len(record) - self.task_size.get(task.uid, 0)
        self.task_size[task.uid] = len(record)
        self.pending.append((record, _TASK, task))

    def log_task_state(self, task: Task) -> None:
        self.pending.append((wf.encode_task_state(task.uid, records.task_state(
            task, self.wall_offset)), _NOWHERE, None))

    def log_task_end(self, task: Task) -> None:
        if task.result is not None or task.result_headers:
            self.log_task(task)
        else:
            self.log_task_state(task)

    def log_task_gone(self, task: Task) -> None:
        uid = task.uid
        self.live_bytes -= self.task_size.pop(uid, 0)
        self._unplace(self.task_file.pop(uid, 0))
        self.task_extra.pop(uid, None)
        self.pending.append((wf.encode_task_gone(uid), _NOWHERE, None))

    def log_schedule(self, s: Schedule) -> None:
        record = wf.encode_schedule(records.schedule_fields(s))
        self.live_bytes += len(record) - self.schedule_size.get(s.name, 0)
        self.schedule_size[s.name] = len(record)
        self.pending.append((record, _SCHEDULE, s))

    def log_schedule_gone(self, s: Schedule) -> None:
        self.live_bytes -= self.schedule_size.pop(s.name, 0)
        self._unplace(self.schedule_file.pop(s.name, 0))
        self.pending.append((wf.encode_schedule_gone(s.name), _NOWHERE, None))

    def log_draw(self, draw: J.RoomDraw) -> None:
        self._log_draw(records.draw_fields(draw))

    def _log_draw(self, fields: list) -> None:
        record, grown = self.draws.logged(fields)
        self.live_bytes += grown
        self.pending.append((record, _DRAW, fields[0]))
        self.draws_pending.add(fields[0])

    def log_function(self, change: tuple) -> None:
        """(name, paused): a pause is live while in force (_place); a resume ends it."""
        name, paused = change
        if paused:
            self.function_file.setdefault(name, 0)
            self.pending.append((wf.encode_function_state(name, True), _FUNCTION, name))
        else:
            self._unplace(self.function_file.pop(name, 0))
            self.pending.append((wf.encode_function_state(name, False), _NOWHERE, None))

    def _unplace(self, seq: int) -> None:
        span = self.spans.get(seq)
        if span is not None:
            span.live -= 1

    def _keep_gates(self, tats: dict) -> None:
        self.gates = dict(tats)

    # -- compaction -------------------------------------------------------------------------
    def maintain(self, live: J.LiveView) -> None:
        """Copy live records of the oldest messages forward while the stream is more than
        twice the live state; purge what no longer holds anything live."""
        if self.failed is not None or self.loop is None:
            return
        self._purge_if_possible()
        if self.stream_bytes <= 2 * self.live_bytes + COMPACT_SLACK:
            return
        budget = _MIGRATE_SCAN_PER_TURN
        for span in self.spans.values():
            if span.seq > self.acked_seq or budget <= 0:
                break
            if span.live > 0:
                budget = self._migrate(span, live, budget)
        if self.gates_seq and self.gates_seq < self.acked_seq and self.gates is None \
                and self.last_gates and self._first_live() > self.gates_seq:
            self.gates = dict(self.last_gates)      # (so the purge can pass them)

    def _migrate(self, span: S.Span, live: J.LiveView, budget: int) -> int:
        jobs, tasks, schedules = live.jobs, live.tasks, live.schedules
        while span.cursor < len(span.ids) and budget > 0:
            job = jobs.get(span.ids[span.cursor])
            if job is not None and job.file == span.seq:
                self.pending.append((wf.encode_job(records.job_image(job, self.wall_offset)),
                                     _JOB, job))
                if job.state == RESERVED:       # (still held: the copy says so too)
                    self.log_held(job)
                self.records_migrated += 1
            span.cursor += 1
            budget -= 1
        while span.task_cursor < len(span.uids) and budget > 0:
            task = tasks.get(span.uids[span.task_cursor])
            if task is not None and self.task_file.get(task.uid) == span.seq:
                self.pending.append((self._task_record(task), _TASK, task))
                self.records_migrated += 1
            span.task_cursor += 1
            budget -= 1
        while span.name_cursor < len(span.names) and budget > 0:
            s = schedules.get(span.names[span.name_cursor])
            if s is not None and self.schedule_file.get(s.name) == span.seq:
                self.log_schedule(s)
                self.records_migrated += 1
            span.name_cursor += 1
            budget -= 1
        for name in self.draws.placed_in(span.seq):
            if name not in self.draws_pending and budget > 0:
                self._log_draw(self.draws.fields[name])
                self.records_migrated += 1
                budget -= 1
        for name in [n for n, seq in self.function_file.items() if seq == span.seq]:
            self.log_function((name, True))         # (a pause still in force: a few)
            self.records_migrated += 1
        return budget

    def _first_live(self) -> int:
        """The first message that still holds the latest record of something live (or
        is not yet acknowledged): nothing before it is needed."""
        for span in self.spans.values():
            if span.live > 0 or span.seq >= self.acked_seq:
                return span.seq
        return self.acked_seq

    def _purge_if_possible(self) -> None:
        if self.purging or self.js is None:
            return
        cut = self._first_live()
        if self.gates_seq and self.last_gates:
            cut = min(cut, self.gates_seq)
        if cut <= self.first_seq:
            return
        if cut - self.first_seq < 64 and self.stream_bytes <= 2 * self.live_bytes + COMPACT_SLACK:
            return          # (a purge a few messages long is not worth its request)
        self.purging = True
        self.loop.create_task(self._purge(cut))

    async def _purge(self, cut: int) -> None:
        try:
            await self.js.purge_stream(self.opts.stream, seq=cut)
        except Exception as exc:
            log.warning("journal: purging stream %s below %d failed: %s (tried again)",
                        self.opts.stream, cut, exc)
            return
        finally:
            self.purging = False
        for seq in [s for s in self.spans if s < cut]:
            self.stream_bytes -= self.spans.pop(seq).size
        self.first_seq = max(self.first_seq, cut)

    # -- the end ------------------------------------------------------------------------------
    def close(self, now: float | None = None, live: J.LiveView | None = None) -> None:
        """A graceful stop: what is pending (the held jobs) and every append not yet
        acknowledged are appended again on a connection of their own (same ids: what was
        stored is answered as a duplicate) and waited for, so the held replies can leave."""
        for handle in (self._tick, self._retry):
            if handle is not None:
                handle.cancel()
        self._tick = self._retry = None
        if self.failed is None and live is not None and self.loop is not None:
            if self.pending:
                self.turn += 1
                self._send_next(self.turn, live)
            waiting = [a for a in self.inflight if not a.acked]
            if waiting:
                try:
                    S.run_on_a_loop_of_its_own(self._flush(waiting),
                                               min(self.opts.timeout_s, 10.0))
                except Exception as exc:
                    log.warning("journal: the last appends were not acknowledged (%s): "
                                "their replies are not sent", exc)
                else:
                    self.durable = self.turn
                    self.inflight.clear()
        for task in self._tasks:
            task.cancel()
        self._tasks = []
        if self.nc is not None and self.loop is not None and not self.loop.is_closed():
            nc, self.nc = self.nc, None
            self.loop.create_task(_close(nc))

    async def _flush(self, waiting: list[Append]) -> None:
        nc = await S.connect(self.opts)
        try:
            js = nc.jetstream(timeout=5)
            for a in waiting:
                while True:
                    try:
                        await js.publish(self.opts.subject, a.payload, headers=dict(a.headers))
                        break
                    except Exception as exc:
                        if getattr(exc, "err_code", None) == S.WRONG_SEQUENCE:
                            stored = await js.get_msg(self.opts.stream, a.seq)
                            if (stored.headers or {}).get(S.H_ID) == a.headers[S.H_ID]:
                                break
                            raise
                        if getattr(exc, "err_code", None) in S.CANNOT_STORE:
                            raise
                        await asyncio.sleep(S.RETRY_S)
        finally:
            await nc.close()

    # -- what it says -----------------------------------------------------------------------
    def stats(self) -> J.JournalStats:
        """The binlog-* keys; and with a lease, journal-role (a journal that runs leads:
        a standby has none yet), journal-epoch and journal-seq (acknowledged)."""
        return J.JournalStats(self.first_seq, self.last_seq, self.records_written,
                              self.records_migrated, self.max_payload,
                              "leader" if self.epoch else "", self.epoch, self.acked_seq)

    def depose(self, why: str) -> None:
        """Another instance leads now (the lease said so, lease.py): stop as a refused
        append would stop us (on the actor's loop)."""
        self._fail(S.DEPOSED_EXIT, why)

    def samples(self) -> list[Sample]:
        return [Sample("zstalk_journal_bytes", (), self.live_bytes),
                Sample("zstalk_journal_stream_bytes", (), self.stream_bytes),
                Sample("zstalk_journal_ack_seconds", (), self.ack_seconds),
                Sample("zstalk_journal_appends_in_flight", (), len(self.inflight)),
                Sample("zstalk_journal_compaction_copies_total", (), self.records_migrated),
                Sample("zstalk_journal_leading", (), 1),
                Sample("zstalk_journal_epoch", (), self.epoch),
                Sample("zstalk_journal_takeover_seconds", (), self.took_over_s),
                *[Sample("zstalk_journal_standby_lag_messages", (said.instance,),
                         max(0, self.acked_seq - said.applied)) for said in self.standbys()]]


async def _close(nc) -> None:
    try:
        await nc.close()
    except Exception:
        pass
