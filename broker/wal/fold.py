"""The journal's stream folded into the state a restore builds: sans-IO, one message at a
time, so the same fold serves a start (stream.read: the whole stream at once) and a warm
standby (follow.py: each message as the leader appends it, for hours).

`apply(seq, headers, data)` takes one message of the stream (stream.py says what its
headers and payload are) and folds its records into `jobs`, `tasks`, `schedules` and
`draws` (each function's latest room draw) as a binlog's replay does
(format.apply_records: the latest full record of each live thing, its later UPDATEs
folded in, a DELETE or a GONE forgets it), and keeps, per message, the
`Span` compaction's books need (jetstream.py).  Nothing else is kept: a message's bytes
are not (a job's body is its own slice), so a standby holds what a restore would build,
plus one Span per message the stream still has.

Messages must come in order, with no gap: `expects(seq)` says whether `seq` is the next
one.  Stream sequences of the journal have no gaps of their own (one subject, deletes
denied), so a gap means the messages between were purged by compaction while this fold
was not looking, and a purged DELETE would leave a deleted job alive here: the fold is
then thrown away and the stream read again from its first message (follow.py, stream.read;
ha-journal.md G).  Once compaction purged messages this fold already applied, their Spans
go (`forget_below`); what they did to the state stays, as it must.
"""
from __future__ import annotations

import json
import struct
import zlib
from typing import NamedTuple

from . import format as wf

H_STATE, H_NEXT, H_GATES = "Zstalk-State", "Zstalk-Next-Id", "Zstalk-Gates"


class Corrupt(Exception):
    """A message whose frame fails its checksum or whose records do not parse."""


class Span:
    """One message of the stream as compaction knows it: its size, and the full records
    it holds (job ids, task uids, schedule names) and how many of them are still the
    latest of something live."""
    __slots__ = ("seq", "size", "live", "ids", "uids", "names", "cursor", "task_cursor",
                 "name_cursor")

    def __init__(self, seq: int, size: int) -> None:
        self.seq = seq
        self.size = size
        self.live = 0
        self.ids: list[int] = []
        self.uids: list[str] = []
        self.names: list[str] = []
        self.cursor = self.task_cursor = self.name_cursor = 0


class Read(NamedTuple):
    replayed: wf.Replayed
    spans: dict             # seq -> Span, oldest first
    last_seq: int
    gates_seq: int          # the message that holds the latest gates (0: none)
    fold: "Fold | None" = None      # what it came from: a read goes on from it


def headers_size(headers: dict) -> int:
    return sum(len(k) + len(v) + 4 for k, v in headers.items()) + 12


class Fold:
    """The state of the stream's messages 1..last_seq (or first..last_seq: the fold
    began at the stream's first message then)."""

    def __init__(self) -> None:
        self.jobs: dict = {}
        self.tasks: dict = {}
        self.schedules: dict = {}
        self.draws: dict = {}
        self.functions: dict = {}   # paused functions -> the message that paused them
        self.tubes: dict = {}
        self.spans: dict[int, Span] = {}
        self.gates: dict = {}
        self.state_id = self.next_id = self.gates_seq = 0
        self.last_seq = 0           # the last message applied (0: none yet)
        self.applied = 0            # messages applied by this fold

    def expects(self, seq: int) -> bool:
        """Whether message `seq` is the next to apply (any first one is, for a new fold)."""
        return seq == self.last_seq + 1 or not self.last_seq

    def apply(self, seq: int, headers: dict | None, data: bytes) -> None:
        """Fold message `seq` in; Corrupt if it fails its checksum (the fold is then
        not to be used)."""
        headers = headers or {}
        span = self.spans[seq] = Span(seq, len(data) + headers_size(headers))
        if H_STATE in headers:
            self.state_id = int(headers[H_STATE])
        if H_NEXT in headers:
            self.next_id = max(self.next_id, int(headers[H_NEXT]))
        if H_GATES in headers:
            self.gates = json.loads(headers[H_GATES])
            self.gates_seq = seq
        if data:
            self._records(seq, data, span)
        self.last_seq = seq
        self.applied += 1

    def _records(self, seq: int, data: bytes, span: Span) -> None:
        length, crc = wf.FRAME.unpack_from(data, 0)
        if length != len(data) - wf.FRAME.size or zlib.crc32(data[wf.FRAME.size:]) != crc:
            raise Corrupt(f"message {seq} of the journal fails its checksum")
        try:
            wf.apply_records(data, wf.FRAME.size, len(data), seq, self.jobs, span.ids,
                             self.tubes, self.tasks, span.uids, self.schedules, span.names,
                             self.draws, self.functions)
        except (wf.BadSegment, struct.error) as exc:
            raise Corrupt(f"message {seq} of the journal: {exc}") from None

    def forget_below(self, first_seq: int) -> int:
        """Compaction purged the messages before `first_seq`: their Spans go (what they
        did stays).  How many went."""
        gone = []
        for seq in self.spans:          # (oldest first: only the purged are walked)
            if seq >= first_seq:
                break
            gone.append(seq)
        for seq in gone:
            del self.spans[seq]
        return len(gone)

    def read(self) -> Read:
        """The state as a restore takes it (the dicts themselves: the fold is spent)."""
        top = max(self.jobs, default=0)
        replayed = wf.Replayed(self.jobs, max(self.next_id, top + 1, 1), self.state_id, [],
                               self.tasks, self.schedules, self.gates, self.draws,
                               self.functions)
        return Read(replayed, self.spans, self.last_seq, self.gates_seq, self)
