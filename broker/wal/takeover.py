"""Takeover: the fencing point a new leader appends before it replays the stream.

An instance that claimed the lease (lease.py) with epoch E reads the stream to its last
sequence L (stream.read: only the tail after what a warm standby already folded in,
follow.py), then appends the EPOCH message (no records; Zstalk-Epoch E,
Zstalk-Leader its writer id) with Nats-Expected-Last-Sequence L.  Stored, it is the
fence: the old leader's next append expects a sequence before it and is refused, so the
old leader finds itself deposed (jetstream.py).  Refused as out of sequence, the old
leader appended meanwhile: the stream is read on from L and the EPOCH tried after the
new end, for TAKEOVER_S at most (then the instance does not take over: DEPOSED_EXIT).
The design is Temporal's range_id with JetStream as the database (ha-journal.md C.3).
"""
from __future__ import annotations

import asyncio
import logging
import time

from . import stream as S

log = logging.getLogger("zstalk.journal")
#: how long the EPOCH message is tried again while another broker's appends beat it: an
#: old leader still appending finds the lease taken at its next renewal (lease.RENEW_S,
#: 250 ms) and stops.  A time, not a count of tries: a read on from a fold takes only the
#: messages since the last try, so five tries used to pass in milliseconds, before the
#: old leader could have stopped
TAKEOVER_S = 5.0
#: the pause between two tries (it is the old leader's renewal that needs the time)
PAUSE_S = 0.05


async def fence(nc, opts: S.Options, writer: str, epoch: int, read: S.Read, info,
                max_job_size: int) -> tuple[S.Read, object]:
    """Append the EPOCH message after `read`'s end, reading on while another broker's
    appends beat it; the read with the EPOCH message as its last, and the stream's info."""
    until = time.monotonic() + TAKEOVER_S
    tries = 0
    while True:
        tries += 1
        headers = epoch_headers(writer, epoch, read.last_seq)
        seq = await _append(nc, opts, headers, read.last_seq)
        if seq:
            read.spans[seq] = S.Span(seq, S._headers_size(headers))    # (nothing live)
            return read._replace(last_seq=seq), info
        if time.monotonic() > until:
            break
        await asyncio.sleep(PAUSE_S)
        info = await nc.jetstream(timeout=10).stream_info(opts.stream)
        read = await S.read(nc, opts, info, max_job_size, read.fold)   # (on from its end)
    raise S.JournalError(f"journal: stream {opts.stream} was appended to by another broker "
                         f"through {tries} reads of it in {TAKEOVER_S:g} s: this one does not "
                         f"take over", S.DEPOSED_EXIT)


def epoch_headers(writer: str, epoch: int, last: int) -> dict:
    """The EPOCH message's headers, to follow sequence `last`."""
    return {S.H_ID: f"{writer}-{last + 1}", S.H_EXPECT: str(last),
            S.H_EPOCH: str(epoch), S.H_LEADER: writer}


async def _append(nc, opts: S.Options, headers: dict, last: int) -> int:
    """The EPOCH message's sequence, or 0 when another broker appended after `last`."""
    js = nc.jetstream(timeout=S.ASK_S)     # (unanswered while NATS elects: sent again, and
    until = time.monotonic() + opts.timeout_s   # a duplicate of a stored one says its seq)
    while True:
        try:
            ack = await js.publish(opts.subject, b"", headers=headers)
        except Exception as exc:
            code = getattr(exc, "err_code", None)
            if code == S.WRONG_SEQUENCE:
                log.info("journal: another broker appended after sequence %d: reading the "
                         "stream again", last)
                return 0
            if code in S.CANNOT_STORE or time.monotonic() > until:
                raise S.JournalError(f"journal: stream {opts.stream} took no EPOCH message: "
                                     f"{exc}", S.UNAVAILABLE_EXIT) from None
            await asyncio.sleep(S.RETRY_S)      # (no responders while NATS elects)
            continue
        return ack.seq if ack.seq == last + 1 else 0
