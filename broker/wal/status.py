"""`zstalk journal status`: who leads a journal, under which epoch, how far its stream goes,
and how far behind each warm standby is, read from NATS alone: the stream's info, and the
lease's bucket (lease.py: the `leader` key, which the leader renews every 250 ms with the
sequence it had acknowledged, and each standby's `standby.<instance>` key, which it
publishes every few seconds with the sequence it has folded in, follow.py).

A standby's lag is the stream's last sequence now less what it last said it had folded
in, so it includes up to follow.LOOK_S of the leader's appends since; a key not
refreshed for lease.SILENT_S belongs to a standby that is gone (killed: nothing deleted
it, until the leader purges it after lease.FORGET_S) or cut off from NATS, and is shown so.  `read` is the I/O; `lines` is pure.
"""
from __future__ import annotations

import asyncio
from typing import NamedTuple

from . import stream as S
from .lease import KEY, SILENT_S, Holder, Standby, bucket_name


class Status(NamedTuple):
    stream: str
    first_seq: int
    last_seq: int
    messages: int
    bytes: int
    leader: Holder | None       # None: the lease is vacant (released, or never taken)
    standbys: list              # Standby, by instance


async def read(opts: S.Options) -> Status:
    """The journal's status; JournalError when NATS or the stream cannot be read."""
    from nats.js.errors import BucketNotFoundError, KeyNotFoundError, NotFoundError
    nc = await S.connect(opts)
    try:
        js = nc.jetstream(timeout=5)
        try:
            info = await js.stream_info(opts.stream)
        except NotFoundError:
            raise S.JournalError(f"NATS at {', '.join(opts.urls)} has no stream "
                                 f"{opts.stream} (--journal-name {opts.name})") from None
        leader, standbys = None, []
        try:
            kv = await js.key_value(bucket_name(opts))
        except BucketNotFoundError:
            kv = None
        if kv is not None:
            try:
                leader = Holder.decode((await kv.get(KEY)).value)
            except KeyNotFoundError:
                pass
            for key in await _standby_keys(js, bucket_name(opts)):
                try:
                    standby = Standby.decode((await kv.get(key)).value)
                except KeyNotFoundError:        # (gone meanwhile)
                    continue
                if standby is not None:
                    standbys.append(standby)
        st = info.state
        return Status(opts.stream, st.first_seq, st.last_seq, st.messages, st.bytes,
                      leader, standbys)
    finally:
        await asyncio.wait_for(nc.close(), 2.0)


async def _standby_keys(js, bucket: str) -> list[str]:
    """The bucket's `standby.*` keys, sorted, from its stream's state: the subjects the
    server holds a message for.  (Not `kv.keys()`: that lists through an ordered consumer
    whose first pass ends when it sees no pending message, and under load it could end
    before a key being rewritten at that moment came round again, so a standby went
    missing from the listing (CI saw it under a CPU hog).  The stream's state is one
    answer of the server's, taken at once.)  A deleted key still has its tombstone
    message: the `kv.get` after this skips it."""
    prefix = f"$KV.{bucket}."
    info = await js.stream_info(f"KV_{bucket}", subjects_filter=f"{prefix}{Standby.PREFIX}>")
    return sorted(subject[len(prefix):] for subject in (info.state.subjects or {}))


def lines(s: Status, wall: float) -> list[str]:
    """What the command prints, `wall` being now (time.time())."""
    out = [f"stream {s.stream}: sequences {s.first_seq}..{s.last_seq} "
           f"({s.messages} messages, {s.bytes} bytes)"]
    h = s.leader
    if h is None:
        out.append("leader: none (the lease is vacant: released, or never taken)")
    else:
        where = f" at {h.advertise}" if h.advertise else ""
        out.append(f"leader: instance {h.instance}{where}, epoch {h.epoch}, acknowledged "
                   f"through {h.seq}")
    if not s.standbys:
        out.append("standbys: none has said where it is")
    for sb in s.standbys:
        ago = max(0.0, wall - sb.wall)
        silent = f", silent for {ago:.0f} s (gone?)" if ago >= SILENT_S else ""
        out.append(f"standby: instance {sb.instance}, folded in through {sb.applied}, "
                   f"lag {max(0, s.last_seq - sb.applied)} messages "
                   f"(said {ago:.1f} s ago{silent})")
    return out
