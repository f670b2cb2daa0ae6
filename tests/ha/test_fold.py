"""The journal's fold (broker/wal/fold.py), pure: messages built as the leader appends them
(a binlog frame of records, the Zstalk-* headers), folded one at a time as a warm standby
does, must give the state a replay of the whole stream gives; a gap is seen, purged
messages' books go and their effect stays, a bad checksum is refused.  stream.continues
decides from a stream's first and last sequences whether a fold can go on; stream.read
reads a fold's tail with a consumer asked for again while NATS elects (a fake NATS)."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from zstalk.broker.wal import format as wf
from zstalk.broker.wal.fold import Corrupt, Fold
from zstalk.broker.wal.stream import JournalError, Options, continues, read


def put(job_id: int, body: bytes = b"body", tube: bytes = b"default") -> bytes:
    return wf.encode_new_job(job_id, tube, 100, 0, 60, 1.0e9, 0.0, body)


def message(*records: bytes, next_id: int = 0, state: int = 7) -> tuple[dict, bytes]:
    headers = {"Zstalk-State": str(state), "Zstalk-Next-Id": str(next_id)}
    return headers, wf.encode_frame(b"".join(records)) if records else b""


def stream() -> list[tuple[int, dict, bytes]]:
    """Jobs 1-3 put, 1 deleted, 2 buried, an empty barrier, 4 put."""
    return [(1, *message(put(1), put(2, b"two"), next_id=3)),
            (2, *message(put(3), wf.encode_delete(1), next_id=4)),
            (3, *message(wf.encode_update(2, wf.S_BURIED, 5, 0, 1.0, (0, 0, 1, 0, 0)),
                         next_id=4)),
            (4, *message(next_id=4)),
            (5, *message(put(4), next_id=5))]


def test_folding_messages_one_at_a_time_gives_the_whole_replay_s_state():
    fold = Fold()
    for seq, headers, data in stream():
        fold.apply(seq, headers, data)
    read = fold.read()
    assert sorted(read.replayed.jobs) == [2, 3, 4]
    rec, tube, body, seq = read.replayed.jobs[2]
    assert (rec[7], rec[2], body, seq, tube) == (wf.S_BURIED, 5, b"two", 1, "default")
    assert read.replayed.next_id == 5 and read.replayed.state_id == 7
    assert read.last_seq == 5 and list(read.spans) == [1, 2, 3, 4, 5]
    assert read.spans[1].ids == [1, 2] and read.fold is fold


def test_a_fold_expects_the_message_after_its_last_and_a_new_one_any():
    fold = Fold()
    assert fold.expects(1) and fold.expects(40)      # (a stream whose first was purged)
    fold.apply(40, *message(put(9), next_id=10))
    assert fold.expects(41) and not fold.expects(42) and not fold.expects(40)


def test_forgetting_purged_messages_drops_their_books_and_keeps_what_they_did():
    fold = Fold()
    for seq, headers, data in stream():
        fold.apply(seq, headers, data)
    assert fold.forget_below(3) == 2
    assert list(fold.spans) == [3, 4, 5]
    assert sorted(fold.jobs) == [2, 3, 4]            # (job 2's record was in message 1)
    assert fold.forget_below(3) == 0


def test_a_message_that_fails_its_checksum_is_corrupt_and_not_applied():
    fold = Fold()
    headers, data = message(put(1))
    with pytest.raises(Corrupt, match="message 1 .* checksum"):
        fold.apply(1, headers, data[:-1] + b"?")
    assert fold.last_seq == 0


@pytest.mark.parametrize("applied, first, last, goes_on", [
    (0, 1, 0, True),        # a new fold, an empty stream
    (0, 50, 90, True),      # a new fold reads from the stream's first
    (10, 1, 10, True),      # caught up
    (10, 5, 30, True),      # behind, nothing it needs purged
    (10, 11, 30, True),     # purged exactly up to its next
    (10, 12, 30, False),    # its next was purged: fold again from the start
    (10, 1, 8, False),      # the stream is shorter than what it folded: made again
])
def test_a_fold_goes_on_only_while_its_next_message_is_still_in_the_stream(
        applied, first, last, goes_on):
    fold = Fold()
    if applied:
        fold.apply(applied, *message(next_id=1))
    info = SimpleNamespace(state=SimpleNamespace(first_seq=first, last_seq=last))
    assert continues(fold, info) is goes_on


class ElectingNats:
    """A NATS connection whose requests for a consumer go unanswered `unanswered` times (as
    while it elects the stream's leader), then deliver `messages` (seq, headers, data)."""

    def __init__(self, unanswered: int, messages: list) -> None:
        self.unanswered, self.messages, self.asked = unanswered, list(messages), 0

    def jetstream(self, timeout: float) -> "ElectingNats":
        return self

    async def subscribe(self, subject: str, **options):
        self.asked += 1
        if self.asked <= self.unanswered:
            raise TimeoutError              # (nats-py's nats.errors.TimeoutError is one)
        return self

    async def next_msg(self, timeout=None):
        seq, headers, data = self.messages.pop(0)
        return SimpleNamespace(metadata=SimpleNamespace(sequence=SimpleNamespace(stream=seq)),
                               headers=headers, data=data)

    async def unsubscribe(self) -> None:
        pass


def test_a_fold_behind_reads_its_tail_once_nats_has_elected_instead_of_failing():
    fold, messages = Fold(), stream()
    for seq, headers, data in messages[:2]:
        fold.apply(seq, headers, data)
    nc = ElectingNats(2, messages[2:])
    info = SimpleNamespace(state=SimpleNamespace(first_seq=1, last_seq=5))
    got = asyncio.run(read(nc, Options(("nats://n1:4222",)), info, 65535, fold))
    assert nc.asked == 3 and got.last_seq == 5 and sorted(got.replayed.jobs) == [2, 3, 4]


def test_a_consumer_never_made_within_the_journal_timeout_is_a_journal_error():
    fold, messages = Fold(), stream()
    fold.apply(*messages[0])
    info = SimpleNamespace(state=SimpleNamespace(first_seq=1, last_seq=5))
    with pytest.raises(JournalError, match="cannot read stream ZSTALK_zstalk from sequence 2"):
        asyncio.run(read(ElectingNats(1000, []), Options(("nats://n1:4222",), timeout_s=0.3),
                         info, 65535, fold))


def test_a_functions_operator_pause_folds_in_and_its_resume_folds_it_out():
    fold = Fold()
    fold.apply(1, *message(wf.encode_function_state("f", True),
                           wf.encode_function_state("g", True)))
    fold.apply(2, *message(wf.encode_function_state("g", False)))
    fold.apply(3, *message(wf.encode_function_state("f", True)))     # (compaction's copy)
    assert fold.read().replayed.functions == {"f": 3}


def test_the_nats_journal_carries_an_operators_pause_and_a_restore_gives_it_back():
    """The JetStream journal's own appends (no NATS: the messages it would send), folded
    as a restore folds the stream: the pause comes back, a resume takes it away, and a
    pause still in force is copied forward by compaction."""
    from zstalk.broker.core.shared import journal as J
    from zstalk.broker.wal.jetstream import JetStreamJournal
    live = SimpleNamespace(jobs={}, tasks={}, schedules={}, next_id=1)
    writer = JetStreamJournal(Options(("nats://127.0.0.1:4222",)))
    fold = Fold()
    for change in (("f", True), ("g", True), ("g", False)):
        assert writer.room[J.FUNCTION_PAUSE](change)
        writer.append[J.FUNCTION_PAUSE](change)
        a = writer._append(None, 1, live)
        fold.apply(a.seq, a.headers, a.payload)
    assert writer.function_file == {"f": 1} and writer.spans[1].live == 1
    read = fold.read()
    assert read.replayed.functions == {"f": 1}
    info = SimpleNamespace(state=SimpleNamespace(first_seq=1))
    restored = JetStreamJournal(Options(("nats://127.0.0.1:4222",)))._account(read, info)
    assert restored.paused == ["f"]
    writer.acked_seq, writer.loop = 3, object()     # (acknowledged, as compaction asks)
    writer._migrate(writer.spans[1], live, 100)
    a = writer._append(None, 2, live)
    assert writer.function_file == {"f": 4} and writer.spans[1].live == 0
    fold.apply(a.seq, a.headers, a.payload)
    assert fold.read().replayed.functions == {"f": 4}
