"""The binlog under the pure broker core: real files in a temporary directory, a fake
clock, and "restarts" that open the same directory in a new Broker.

Each harness turn does what the actor does after a batch: compaction, one write,
and (as under --no-fsync) treats what is written as synced.
"""
from __future__ import annotations

import os
import random

import pytest

from test_broker_core import FRONT, Harness, codes
from zstalk.broker.wal import format as wf
from zstalk.broker.wal.binlog import Binlog, BinlogError, Options, segment_name
from zstalk.broker.core.broker import Broker, Config
from zstalk.protocol.schema import Op, R

WALL_OFFSET = 1_700_000_000.0


class Node(Harness):
    """A broker core over a binlog directory, written like the actor writes it."""

    def __init__(self, path, now: float = 1000.0, segment_size: int = 1 << 20,
                 max_job_size: int = 65535) -> None:
        self.now = now
        self.path = str(path)
        self.wal = Binlog(Options(self.path, segment_size, None))
        self.replayed = self.wal.restore(max_job_size)
        self.broker = Broker(Config(max_job_size=max_job_size), now, wall_offset=WALL_OFFSET,
                             journal=self.wal, restored=self.replayed)
        self.hello(FRONT, random.getrandbits(32) + 1)
        self.open(1, 2)

    def send(self, *ops, peer: bytes = FRONT) -> list[tuple]:
        replies = super().send(*ops, peer=peer)
        self.turn()
        return replies

    def turn(self) -> None:
        jobs = self.broker.queue.jobs
        self.wal.compact(jobs)
        self.wal.write(jobs, self.broker.next_id)

    def restart(self, later_s: float = 0.0) -> "Node":
        self.wal.close()
        return Node(self.path, self.now + later_s, self.wal.opts.segment_size)

    def job(self, job_id: int):
        return self.broker.queue.jobs.get(job_id)

    def reserve(self, conn: int = 1) -> tuple:
        [reply] = self.send((Op.RESERVE, conn, 0))
        return reply

    def dir_bytes(self) -> int:
        return sum(os.path.getsize(os.path.join(self.path, n)) for n in os.listdir(self.path))


@pytest.fixture
def node(tmp_path) -> Node:
    n = Node(tmp_path / "wal")
    yield n
    n.wal.close()


def test_jobs_in_every_state_come_back_after_a_restart(node):
    ready = node.put(1, b"ready\r\nbody", pri=7)
    delayed = node.put(1, b"later", delay=300)
    node.send((Op.USE, 1, "mail"))
    reserved = node.put(1, b"held", pri=3)
    node.send((Op.WATCH, 2, "mail"), (Op.IGNORE, 2, "default"))
    assert node.reserve(2)[2] == reserved
    gone = node.put(1, b"deleted")
    node.send((Op.DELETE, 1, gone))

    after = node.restart(later_s=100)
    assert after.job(ready).state == "ready" and after.job(ready).body == b"ready\r\nbody"
    assert after.job(ready).pri == 7
    assert after.job(reserved).state == "ready" and after.job(reserved).tube.name == "mail"
    assert after.job(gone) is None
    stats = after.job_stats(delayed)
    assert stats["state"] == "delayed"
    assert 195 <= stats["time-left"] <= 200      # the due time is absolute: 100 s passed
    assert stats["file"] >= 1
    after.wal.close()


def test_buried_jobs_keep_their_bury_order_and_priority(node):
    ids = [node.put(1, b"j%d" % i) for i in range(4)]
    for job_id in ids:
        node.send((Op.RESERVE_JOB, 1, job_id))
    for job_id, pri in ((ids[2], 5), (ids[0], 6), (ids[3], 7)):
        assert codes(node.send((Op.BURY, 1, job_id, pri))) == [R.BURIED]
    node.send((Op.DELETE, 1, ids[1]))

    after = node.restart()
    kicked = []
    for _ in range(3):
        [(_, code, job_id, _)] = after.send((Op.PEEK_BURIED, 1))
        kicked.append((job_id, after.job(job_id).pri))
        after.send((Op.KICK_JOB, 1, job_id))
    assert kicked == [(ids[2], 5), (ids[0], 6), (ids[3], 7)]
    after.wal.close()


def test_a_release_without_delay_is_not_logged_as_in_beanstalkd(node):
    a = node.put(1, b"a", pri=10)
    b = node.put(1, b"b", pri=10)
    node.send((Op.RESERVE_JOB, 1, a), (Op.RESERVE_JOB, 1, b))
    node.send((Op.RELEASE, 1, a, 99, 0), (Op.RELEASE, 1, b, 42, 60))

    after = node.restart()
    assert after.job(a).pri == 10 and after.job(a).state == "ready"     # not logged
    assert after.job(b).pri == 42 and after.job(b).state == "delayed"   # logged
    assert after.job_stats(b)["releases"] == 1
    after.wal.close()


def test_ids_continue_after_the_largest_id_even_when_compaction_erased_it(tmp_path):
    node = Node(tmp_path / "wal", segment_size=4096)
    keep = node.put(1, b"k" * 100)
    node.send((Op.RESERVE_JOB, 1, keep), (Op.BURY, 1, keep, 1))
    for _ in range(300):                 # enough to roll and compact many segments
        node.send((Op.DELETE, 1, node.put(1, b"x" * 100)))
    largest = node.broker.next_id - 1
    assert node.wal.oldest_index() > 1, "the segments holding the early ids were removed"

    after = node.restart()
    assert after.put(1, b"next") == largest + 1
    assert after.job(keep).state == "buried"
    after.wal.close()


def _fill(node: Node, count: int, rng=random) -> dict[int, bytes]:
    bodies = {}
    for i in range(count):
        body = rng.randbytes(rng.randrange(0, 300))
        bodies[node.put(1, body, pri=i)] = body
    return bodies


def _tail_segment(path: str) -> str:
    names = sorted(n for n in os.listdir(path) if n.endswith(".wal"))
    return os.path.join(path, names[-1])


@pytest.mark.parametrize("seed", range(8))
def test_a_torn_tail_is_cut_off_and_every_surviving_job_is_whole(tmp_path, seed):
    rng = random.Random(seed)
    node = Node(tmp_path / "wal")
    bodies = _fill(node, 60, rng)
    node.wal.close()
    tail = _tail_segment(node.path)
    with open(tail, "rb") as f:
        data = f.read()
    spans, end, _ = wf.scan(data)
    boundaries = {wf.HEADER_SIZE} | {stop for _, stop in spans}
    # a cut exactly between two frames is a clean (shorter) log, not a torn one
    cut = rng.choice([c for c in range(wf.HEADER_SIZE + 1, end) if c not in boundaries])
    with open(tail, "r+b") as f:
        f.truncate(cut)

    after = Node(node.path)
    jobs = after.broker.queue.jobs
    survivors = sorted(jobs)
    assert survivors == list(range(1, len(survivors) + 1)), "a prefix of the puts survives"
    assert len(survivors) < len(bodies)
    for job_id in survivors:
        assert jobs[job_id].body == bodies[job_id]
    assert any("torn tail truncated" in w for w in after.replayed.warnings)
    assert os.path.getsize(tail) < cut + 1
    after.wal.close()


def test_a_damaged_frame_is_never_taken_for_data(tmp_path):
    node = Node(tmp_path / "wal")
    bodies = _fill(node, 20)
    node.wal.close()
    tail = _tail_segment(node.path)
    with open(tail, "rb") as f:
        data = bytearray(f.read())
    _, end, _ = wf.scan(bytes(data))
    data[end - 3] ^= 0xFF                  # inside the last frame (the last put)
    with open(tail, "wb") as f:
        f.write(data)

    after = Node(node.path)
    assert sorted(after.broker.queue.jobs) == sorted(bodies)[:-1]
    assert any("checksum" in w for w in after.replayed.warnings)
    after.wal.close()


def test_a_second_broker_on_the_same_directory_is_refused(node):
    with pytest.raises(BinlogError, match="locked by another zstalk broker"):
        Binlog(Options(node.path)).open(65535)


def test_a_beanstalkd_directory_is_refused_naming_the_import_command(tmp_path):
    (tmp_path / "binlog.1").write_bytes(b"\x07\0\0\0")
    with pytest.raises(BinlogError, match=f"zstalk import-binlog {tmp_path}"):
        Binlog(Options(str(tmp_path))).open(65535)
    assert sorted(os.listdir(tmp_path)) == ["binlog.1"], "nothing written beside it"


def test_a_long_lived_buried_job_does_not_pin_the_log(tmp_path):
    """beanstalkd #599/#570: with churn around one buried job, the directory stops growing."""
    node = Node(tmp_path / "wal", segment_size=8192)
    pinned = node.put(1, b"p" * 200)
    node.send((Op.RESERVE_JOB, 1, pinned), (Op.BURY, 1, pinned, 0))
    live = [node.put(1, b"l" * 200) for _ in range(20)]     # a steady live set
    sizes = []
    for cycle in range(40):
        for _ in range(50):
            node.send((Op.DELETE, 1, node.put(1, b"c" * 200)))
        sizes.append(node.dir_bytes())
    seg = node.wal.seg_size
    bound = 2 * node.wal.live_bytes + 6 * seg
    assert max(sizes[10:]) <= bound, (sizes, bound)
    assert node.wal.records_migrated > 0
    after = node.restart()
    assert after.job(pinned).state == "buried"
    assert all(after.job(i).state == "ready" for i in live)
    assert len(after.broker.queue.jobs) == 21
    after.wal.close()


def test_a_job_released_with_a_delay_over_and_over_does_not_grow_the_log(tmp_path):
    """beanstalkd #622: every delayed release is an update record; they must not pile up."""
    node = Node(tmp_path / "wal", segment_size=8192)
    job = node.put(1, b"r" * 100)
    sizes = []
    for cycle in range(3000):
        node.send((Op.RESERVE_JOB, 1, job), (Op.RELEASE, 1, job, 5, 10))
        if cycle % 100 == 99:
            sizes.append(node.dir_bytes())
    assert max(sizes[5:]) <= 2 * node.wal.live_bytes + 6 * node.wal.seg_size, sizes
    after = node.restart()
    assert after.job_stats(job)["releases"] == 3000
    assert after.job(job).state == "delayed"
    after.wal.close()


def test_compaction_keeps_bury_order_across_migration(tmp_path):
    node = Node(tmp_path / "wal", segment_size=8192)
    ids = [node.put(1, b"b%d" % i) for i in range(6)]
    order = [ids[4], ids[1], ids[5], ids[0]]
    for job_id in order:
        node.send((Op.RESERVE_JOB, 1, job_id), (Op.BURY, 1, job_id, 0))
    for _ in range(400):                         # churn until the first segment is compacted
        node.send((Op.DELETE, 1, node.put(1, b"c" * 100)))
    assert not os.path.exists(os.path.join(node.path, segment_name(1)))
    after = node.restart()
    assert list(after.broker.queue.tubes["default"].buried) == order
    after.wal.close()


def test_segments_roll_at_the_size_given_and_stats_report_them(tmp_path):
    node = Node(tmp_path / "wal", segment_size=4096)
    for _ in range(100):
        node.put(1, b"z" * 100)
    stats = node.stats()
    assert stats["binlog-current-index"] > 2
    assert stats["binlog-oldest-index"] == 1
    assert stats["binlog-records-written"] == 100
    assert stats["binlog-max-size"] == 4096
    node.wal.close()


def test_a_job_bigger_than_a_segment_gets_a_segment_big_enough(tmp_path):
    node = Node(tmp_path / "wal", segment_size=4096)
    small = node.put(1, b"s" * 100)
    big = node.put(1, os.urandom(20000))
    body = node.job(big).body
    after_big = node.put(1, b"t" * 100)
    after = node.restart()
    assert after.job(big).body == body
    assert after.job(small) is not None and after.job(after_big) is not None
    after.wal.close()


def test_under_fsync_0_replies_wait_for_the_fsync_that_covers_them(tmp_path):
    """Group commit: the INSERTED, and a later peek by another session, leave only once an
    fsync covering the put's record has finished (the sync thread is held back here by
    taking its lock, so the fsync cannot start)."""
    import select
    import time

    from zstalk.broker.actor import BrokerActor
    from zstalk.protocol.schema import Batch, Hello

    actor = BrokerActor("inproc://fsync-hold", Config(), binlog=Options(str(tmp_path), 1 << 20, 0))
    core, wal = actor.core, actor.journal
    try:
        core.handle(FRONT, Hello(7, "beanstalk", 1, 0, []), time.monotonic())
        with wal.syncer._cond:
            core.handle(FRONT, Batch([(Op.OPEN, 1), (Op.PUT, 1, 0, 0, 60, b"x")]), time.monotonic())
            actor._commit(core.flush(), time.monotonic())
            core.handle(FRONT, Batch([(Op.OPEN, 2), (Op.PEEK, 2, 1)]), time.monotonic())
            actor._commit(core.flush(), time.monotonic())
            assert wal.write_seq == 1 and wal.synced == 0
            held = [type(m).__name__ for _, msgs in actor.held for _, m in msgs]
            assert held == ["Welcome", "Replies", "Replies"], "INSERTED and FOUND both wait"
        assert select.select([wal.notify_fd], [], [], 10)[0], "the fsync finished"
        wal.on_synced(time.monotonic())
        actor._commit([], time.monotonic())
        assert wal.synced == 1 and not actor.held
    finally:
        wal.close()
        actor.sock.close(linger=0)


def test_empty_segments_whose_header_never_reached_the_disk_are_dropped(tmp_path):
    node = Node(tmp_path / "wal")
    bodies = _fill(node, 5)
    node.wal.close()
    last = max(int(n.split(".")[1]) for n in os.listdir(node.path) if n.endswith(".wal"))
    for seq in (last + 1, last + 2):        # spares made before a power loss: zeros
        with open(os.path.join(node.path, segment_name(seq)), "wb") as f:
            f.write(bytes(8192))
    after = Node(node.path)
    assert {i: after.job(i).body for i in bodies} == bodies
    after.wal.close()


def test_a_restart_allocates_the_space_promised_to_the_recovered_jobs_deletes(tmp_path):
    node = Node(tmp_path / "wal", segment_size=4096)
    ids = [node.put(1, b"d" * 50) for _ in range(500)]
    after = node.restart()
    assert after.wal._capacity() >= after.wal.promised > 0
    for job_id in ids:
        assert codes(after.send((Op.DELETE, 1, job_id))) == [R.DELETED]
    after.wal.close()


def test_a_delayed_job_reserved_after_it_came_due_goes_back_to_its_holder(tmp_path):
    """Its log says DELAYED (becoming ready is not logged): after a broker restart it must
    still be restorable to the session a front re-registers as holding it."""
    from zstalk.protocol.schema import Hello, SessionState

    node = Node(tmp_path / "wal")
    job = node.put(1, b"later", delay=10)
    node.advance(11)
    assert node.reserve(2)[2] == job
    after = node.restart(later_s=1)
    state = after.broker.state_id
    after.broker.handle(b"front-b", Hello(99, "beanstalk", 1, state,
                                          [SessionState(7, "default", ["default"], [job])]),
                        after.now)
    after.broker.flush()
    assert after.job(job).state == "reserved"
    assert after.job(job).holder.conn == 7
    after.wal.close()


def test_segment_sizes_round_up_to_whole_blocks_as_beanstalkd_does(tmp_path):
    node = Node(tmp_path / "wal", segment_size=1)
    node.put(1, b"x")
    assert node.wal.seg_size == 4096
    assert node.stats()["binlog-max-size"] == 1, "reported as given, like beanstalkd"
    node.wal.close()


def test_an_fsync_error_is_reported_to_the_loop_not_swallowed(tmp_path):
    import select

    from zstalk.broker.wal.fsync import Syncer

    syncer = Syncer()
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    os.close(fd)                             # fsync of a closed fd: EBADF
    syncer.request(1, [fd], -1)
    assert select.select([syncer.read_fd], [], [], 10)[0]
    done, error, took = syncer.take_done()
    assert done == 0 and isinstance(error, OSError) and took == []
    syncer.stop()


def test_the_fsync_thread_says_how_long_each_sync_took(tmp_path):
    import select

    from zstalk.broker.wal.fsync import Syncer

    syncer = Syncer()
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    try:
        os.write(fd, b"x" * 4096)
        syncer.request(7, [fd], -1)
        assert select.select([syncer.read_fd], [], [], 10)[0]
        done, error, took = syncer.take_done()
        assert (done, error, len(took)) == (7, None, 1) and 0 <= took[0] < 10
        assert syncer.take_done()[2] == []      # handed over once
    finally:
        syncer.stop()
        os.close(fd)
