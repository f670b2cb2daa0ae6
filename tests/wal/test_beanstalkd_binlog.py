"""The beanstalkd binlog reader, checked against beanstalkd itself.

Two kinds of test:
  * crafted binlog files (struct-packed below from dat.h's layout, independently of the
    module's own structs): the reader alone, and the same directory given to a real
    beanstalkd, whose recovered state must match the reader's answer;
  * a real beanstalkd run with a small -s (several files, compaction) through puts,
    reserves, releases, buries, kicks and deletes, stopped by SIGTERM or kill -9, then
    read by the reader and restarted on a copy: stats-job, peek bodies, peek-buried
    order under kick-job, NOT_FOUND for everything else, and the next put id must agree.
beanstalkd missing: skipped, or failed when CI=true (conftest.require_beanstalkd).
"""
from __future__ import annotations

import random
import shutil
import socket
import struct
import time
from pathlib import Path

import greenstalk
import pytest
from hypothesis import given, settings, strategies as st

from zstalk.broker.wal.beanstalkd import (BeanstalkdBinlog, BinlogFormatError, End, Record,
                                          Replay, is_beanstalkd_dir, parse_records,
                                          read_beanstalkd_binlog)

INVALID, READY, RESERVED, BURIED, DELAYED, COPY = range(6)
NS = 1_000_000_000
# dat.h `struct Jobrec` as gcc lays it out on x86_64: 80 bytes with padding
JOBREC = struct.Struct("<Q I 4x q q i 4x q q I I I I I B 3x")
JOBREC5 = struct.Struct("<Q I 4x Q Q i 4x Q Q I I I I I B")      # 77 bytes, usec
SEGMENT_SIZE = 70_000


# -- crafted binlogs ---------------------------------------------------------------


def jobrec(job_id: int, state: int = READY, body_size: int = 2, pri: int = 10, delay_s: int = 0,
           ttr_s: int = 60, created_ns: int | None = None, deadline_ns: int = 0,
           counts: tuple = (0, 0, 0, 0, 0)) -> bytes:
    created_ns = time.time_ns() if created_ns is None else created_ns
    return JOBREC.pack(job_id, pri, delay_s * NS, ttr_s * NS, body_size, created_ns,
                       deadline_ns, *counts, state)


def full(job_id: int, tube: str = "default", body: bytes = b"x", **fields) -> bytes:
    stored = body + b"\r\n"
    name = tube.encode()
    return (struct.pack("<i", len(name)) + name
            + jobrec(job_id, body_size=len(stored), **fields) + stored)


def short(job_id: int, state: int, body_size: int = 3, **fields) -> bytes:
    """An update record; its body_size must repeat the job's (3 for full()'s b"x")."""
    return struct.pack("<i", 0) + jobrec(job_id, state, body_size, **fields)


def binlog(*records: bytes, zeros: int = 4096, version: int = 7) -> bytes:
    return struct.pack("<i", version) + b"".join(records) + bytes(zeros)


def write_dir(directory: Path, *files: bytes, first: int = 1) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for n, data in enumerate(files, start=first):
        (directory / f"binlog.{n}").write_bytes(data)
    return directory


def by_id(result: BeanstalkdBinlog) -> dict:
    return {job.id: job for job in result.jobs}


# -- comparing with a restarted beanstalkd ---------------------------------------------


def expected_stats(job, now: float) -> dict:
    state = job.state
    if state == "delayed" and job.deadline_wall <= now:
        state = "ready"                 # prot_replay enqueues an overdue job as ready
    reserves, timeouts, releases, buries, kicks = job.counts
    return {"tube": job.tube, "state": state, "pri": job.pri, "delay": job.delay_s,
            "ttr": job.ttr_s, "reserves": reserves, "timeouts": timeouts,
            "releases": releases, "buries": buries, "kicks": kicks}


def assert_beanstalkd_recovers(start_beanstalkd, directory: Path, result: BeanstalkdBinlog,
                               tmp_path: Path, max_job_size: int | None = None) -> None:
    """Restart a real beanstalkd on a copy of `directory`; it must hold exactly `result`."""
    copy = tmp_path / f"restart-{time.monotonic_ns()}"
    shutil.copytree(directory, copy)
    server = start_beanstalkd(max_job_size=max_job_size,
                              extra_args=["-b", str(copy), "-s", str(SEGMENT_SIZE)])
    client = greenstalk.Client(server.address, encoding=None)
    try:
        for job in result.jobs:
            stats = client.stats_job(job.id)
            now = time.time()
            assert {key: stats[key] for key in expected_stats(job, now)} == \
                expected_stats(job, now), f"job {job.id}"
            assert abs(stats["age"] - (now - job.created_wall)) <= 2
            if stats["state"] == "delayed":
                assert abs(stats["time-left"] - (job.deadline_wall - now)) <= 2
            assert client.peek(job.id).body == job.body
        live = {job.id for job in result.jobs}
        for job_id in range(1, result.next_id + 3):
            if job_id not in live:
                with pytest.raises(greenstalk.NotFoundError):
                    client.peek(job_id)
        assert kick_order(client, {job.tube for job in result.jobs}) == \
            {tube: [i for i in result.buried_order if by_id(result)[i].tube == tube]
             for tube in {job.tube for job in result.jobs}}
        assert client.put(b"after restart") == result.next_id
    finally:
        client.close()
        server.stop()


def kick_order(client, tubes) -> dict[str, list[int]]:
    """Per tube, the buried ids in the order peek-buried serves them (kick-job each)."""
    order = {}
    for tube in tubes:
        client.use(tube)
        order[tube] = []
        while True:
            try:
                job = client.peek_buried()
            except greenstalk.NotFoundError:
                break
            order[tube].append(job.id)
            client.kick_job(job.id)
    client.use("default")
    return order


@pytest.fixture
def recovers(beanstalkd_factory, tmp_path):
    def check(directory: Path, result: BeanstalkdBinlog, max_job_size: int | None = None):
        assert_beanstalkd_recovers(beanstalkd_factory, directory, result, tmp_path, max_job_size)
    return check


# -- the record layout ------------------------------------------------------------------


def test_a_jobrec_is_80_bytes_with_c_padding():
    assert JOBREC.size == 80
    assert JOBREC5.size == 77


def test_a_full_record_gives_back_every_field_and_the_body_without_its_crlf(tmp_path):
    created = 1_795_000_000 * NS + 123_456_789
    record = full(9, "alpha", b"a\r\nb\0", pri=4294967295, delay_s=3600, ttr_s=86400,
                  created_ns=created, deadline_ns=created + 3600 * NS, state=DELAYED,
                  counts=(1, 2, 3, 4, 5))
    result = read_beanstalkd_binlog(write_dir(tmp_path / "d", binlog(record)))
    (job,) = result.jobs
    assert job.id == 9 and job.tube == "alpha" and job.pri == 4294967295
    assert (job.delay_s, job.ttr_s, job.state) == (3600, 86400, "delayed")
    assert job.created_wall == pytest.approx(1_795_000_000.123456789)
    assert job.deadline_wall == pytest.approx(1_795_003_600.123456789)
    assert job.counts == (1, 2, 3, 4, 5)
    assert job.body == b"a\r\nb\0"
    assert (result.next_id, result.files, result.warnings) == (10, ["binlog.1"], [])


# -- crafted files: the reader, then a real beanstalkd on the same bytes --------------------


@pytest.mark.reference
def test_the_preallocated_zero_tail_ends_a_file_quietly(tmp_path, recovers):
    directory = write_dir(tmp_path / "d", binlog(full(1), full(2), zeros=65536))
    result = read_beanstalkd_binlog(directory)
    assert [job.id for job in result.jobs] == [1, 2] and result.warnings == []
    recovers(directory, result)


@pytest.mark.reference
def test_a_zero_tail_shorter_than_a_record_loses_nothing(tmp_path, recovers):
    directory = write_dir(tmp_path / "d", binlog(full(1), zeros=50))
    result = read_beanstalkd_binlog(directory)
    assert [job.id for job in result.jobs] == [1]
    assert any("zero tail of 50 bytes" in warning for warning in result.warnings)
    recovers(directory, result)


@pytest.mark.reference
def test_a_record_cut_inside_its_body_is_dropped_but_still_counts_for_the_next_id(
        tmp_path, recovers):
    data = binlog(full(1), full(2, body=b"y" * 100), zeros=0)[:-30]
    directory = write_dir(tmp_path / "d", data, binlog(full(3)))
    result = read_beanstalkd_binlog(directory)
    assert [job.id for job in result.jobs] == [1, 3]
    assert any("binlog.1" in w and "body of job 2" in w for w in result.warnings)
    assert result.warnings[-1].startswith("errors reading one or more binlog files")
    recovers(directory, result)
    cut_last = write_dir(tmp_path / "e", binlog(full(1), full(2, body=b"y" * 100), zeros=0)[:-30])
    assert read_beanstalkd_binlog(cut_last).next_id == 3      # make_job_with_id ran first


@pytest.mark.reference
def test_a_record_cut_inside_its_jobrec_stops_the_file(tmp_path, recovers):
    directory = write_dir(tmp_path / "d", binlog(full(1), zeros=0) + full(2)[:40])
    result = read_beanstalkd_binlog(directory)
    assert [job.id for job in result.jobs] == [1] and result.next_id == 2
    assert any("cut short" in warning for warning in result.warnings)
    recovers(directory, result)


@pytest.mark.reference
def test_a_job_bigger_than_max_job_size_stops_its_file_but_not_the_next(tmp_path, recovers):
    directory = write_dir(tmp_path / "d",
                          binlog(full(1), full(5, body=b"b" * 70_000), full(3)),
                          binlog(short(5, BURIED), full(2, "alpha")))
    result = read_beanstalkd_binlog(directory, max_job_size=65535)
    assert [job.id for job in result.jobs] == [1, 2]
    assert result.next_id == 3                          # the big job never got made
    assert any("job 5 is too big (70002 > 65535)" in w for w in result.warnings)
    recovers(directory, result, max_job_size=65535)
    assert [job.id for job in read_beanstalkd_binlog(directory, 70_002).jobs] == [1, 2, 3, 5]


@pytest.mark.reference
def test_short_records_for_unknown_jobs_are_ignored_and_deletes_remove(tmp_path, recovers):
    directory = write_dir(tmp_path / "d",
                          binlog(short(7, BURIED), full(1), full(4), short(4, INVALID),
                                 short(8, INVALID)))
    result = read_beanstalkd_binlog(directory)
    assert [job.id for job in result.jobs] == [1]
    assert result.next_id == 5 and result.warnings == []
    recovers(directory, result)


@pytest.mark.reference
def test_buried_jobs_come_back_in_first_record_order_with_one_more_bury(tmp_path, recovers):
    directory = write_dir(tmp_path / "d",
                          binlog(full(1, "alpha"), full(2, "alpha"), full(3, "alpha"),
                                 full(4, "beta"), short(3, BURIED, counts=(1, 0, 0, 1, 0))),
                          binlog(short(1, BURIED, counts=(1, 0, 0, 1, 0)),
                                 short(4, BURIED, counts=(1, 0, 0, 1, 0)),
                                 short(2, BURIED, counts=(2, 0, 1, 1, 0))))
    result = read_beanstalkd_binlog(directory)
    assert result.buried_order == [1, 2, 3, 4]
    assert by_id(result)[2].counts == (2, 0, 1, 2, 0)
    recovers(directory, result)


@pytest.mark.reference
def test_a_compaction_copy_replaces_the_job_but_keeps_its_tube_and_place(tmp_path, recovers):
    directory = write_dir(tmp_path / "d",
                          binlog(full(1, "alpha"), full(2, "alpha"), short(2, BURIED)),
                          binlog(full(1, "gamma", pri=3, state=BURIED, counts=(1, 0, 0, 1, 0)),
                                 short(9, BURIED), full(9, "alpha", state=BURIED)))
    result = read_beanstalkd_binlog(directory)
    assert result.buried_order == [1, 2, 9]
    assert by_id(result)[1].pri == 3 and by_id(result)[1].counts[3] == 2
    assert by_id(result)[1].tube == "alpha"               # the copy's name is not used
    recovers(directory, result)


@pytest.mark.reference
def test_a_reserved_job_comes_back_ready_with_its_logged_counts(tmp_path, recovers):
    directory = write_dir(tmp_path / "d",
                          binlog(full(1, state=RESERVED, counts=(3, 1, 1, 0, 0))))
    (job,) = read_beanstalkd_binlog(directory).jobs
    assert (job.state, job.counts) == ("ready", (3, 1, 1, 0, 0))
    recovers(directory, read_beanstalkd_binlog(directory))


@pytest.mark.reference
def test_delayed_jobs_keep_their_absolute_deadline(tmp_path, recovers):
    now = time.time_ns()
    directory = write_dir(tmp_path / "d", binlog(
        full(1, state=DELAYED, delay_s=7200, deadline_ns=now + 3600 * NS),
        full(2, state=DELAYED, delay_s=5, deadline_ns=now - 60 * NS)))
    result = read_beanstalkd_binlog(directory)
    assert [job.state for job in result.jobs] == ["delayed", "delayed"]
    assert by_id(result)[1].deadline_wall == pytest.approx(now / NS + 3600)
    recovers(directory, result)               # job 2 is overdue: beanstalkd makes it ready


@pytest.mark.reference
def test_a_copy_state_drops_a_known_job_and_stops_the_file(tmp_path, recovers):
    directory = write_dir(tmp_path / "d",
                          binlog(full(1), full(2), short(1, COPY), full(3)))
    result = read_beanstalkd_binlog(directory)
    assert [job.id for job in result.jobs] == [2] and result.next_id == 3
    assert any("unknown state 5" in warning for warning in result.warnings)
    recovers(directory, result)


@pytest.mark.reference
def test_a_version_5_file_is_read_with_microsecond_times(tmp_path, recovers):
    now_us = time.time_ns() // 1000
    body = b"old\r\n"
    record = (struct.pack("<Q", 5) + b"tube5"
              + JOBREC5.pack(1, 7, 0, 30_000_000, len(body), now_us, 0, 0, 0, 0, 0, 0, READY)
              + body)
    buried = struct.pack("<Q", 0) + JOBREC5.pack(1, 7, 0, 30_000_000, len(body), now_us, 0,
                                                 1, 0, 0, 1, 0, BURIED)
    directory = write_dir(tmp_path / "d", binlog(record, buried, version=5))
    (job,) = read_beanstalkd_binlog(directory).jobs
    assert (job.tube, job.ttr_s, job.state, job.body) == ("tube5", 30, "buried", b"old")
    assert job.created_wall == pytest.approx(now_us / 1e6)
    recovers(directory, read_beanstalkd_binlog(directory))


@pytest.mark.reference
def test_an_update_record_that_shrinks_body_size_cuts_the_body_as_beanstalkd_serves_it(
        tmp_path, beanstalkd_factory):
    directory = write_dir(tmp_path / "d", binlog(full(1, body=b"abcdef"),
                                                 short(1, BURIED, body_size=5)))
    result = read_beanstalkd_binlog(directory)
    assert result.jobs[0].body == b"abc"
    assert any("body_size from 8 to 5" in warning for warning in result.warnings)
    copy = tmp_path / "copy"
    shutil.copytree(directory, copy)
    server = beanstalkd_factory(extra_args=["-b", str(copy)])
    with socket.create_connection(server.address, timeout=5) as sock:
        sock.sendall(b"peek 1\r\n")
        reply = b""
        while len(reply) < len(b"FOUND 1 3\r\nabcde"):
            reply += sock.recv(100)
    assert reply.startswith(b"FOUND 1 3\r\nabc")       # then "de" where CRLF belongs


def test_a_missing_file_between_others_is_a_warning(tmp_path):
    directory = write_dir(tmp_path / "d", binlog(full(1)), binlog(full(2)), binlog(full(3)))
    (directory / "binlog.2").unlink()
    result = read_beanstalkd_binlog(directory)
    assert [job.id for job in result.jobs] == [1, 3]
    assert result.files == ["binlog.1", "binlog.3"]
    assert any("binlog.2" in warning for warning in result.warnings)


# -- directories and versions ----------------------------------------------------------------


def test_an_unknown_version_in_the_oldest_file_is_a_format_error(tmp_path):
    directory = write_dir(tmp_path / "d", binlog(full(1), version=8))
    with pytest.raises(BinlogFormatError, match="unknown version 8"):
        read_beanstalkd_binlog(directory)
    big_endian = write_dir(tmp_path / "e", struct.pack(">i", 7) + bytes(100))
    with pytest.raises(BinlogFormatError):
        read_beanstalkd_binlog(big_endian)


def test_an_unknown_version_in_a_later_file_skips_only_that_file(tmp_path):
    directory = write_dir(tmp_path / "d", binlog(full(1)), binlog(full(2), version=9),
                          binlog(full(3)))
    result = read_beanstalkd_binlog(directory)
    assert [job.id for job in result.jobs] == [1, 3]
    assert any("unknown version: 9" in warning for warning in result.warnings)


def test_a_path_that_is_not_a_directory_is_a_format_error(tmp_path):
    (tmp_path / "file").write_bytes(b"")
    for path in (tmp_path / "file", tmp_path / "missing"):
        with pytest.raises(BinlogFormatError):
            read_beanstalkd_binlog(path)


def test_only_a_directory_with_binlog_files_is_a_beanstalkd_directory(tmp_path):
    assert is_beanstalkd_dir(write_dir(tmp_path / "b", binlog(full(1)), first=12))
    (tmp_path / "z").mkdir()
    (tmp_path / "z" / "zstalk.00000001.wal").write_bytes(b"")
    (tmp_path / "z" / "binlog.x").write_bytes(b"")
    (tmp_path / "z" / "lock").write_bytes(b"")
    assert not is_beanstalkd_dir(tmp_path / "z")
    assert not is_beanstalkd_dir(tmp_path / "missing")
    result = read_beanstalkd_binlog(tmp_path / "z")
    assert (result.jobs, result.next_id, result.files) == ([], 1, [])


# -- properties of the pure parser -------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600), st.sampled_from([5, 7]))
def test_arbitrary_bytes_only_ever_give_records_then_one_end(data, version):
    items = list(parse_records(struct.pack("<i", version) + data, version))
    assert isinstance(items[-1], End)
    assert all(isinstance(item, Record) for item in items[:-1])
    replay = Replay(max_job_size=1000)
    for item in items[:-1]:
        if not replay.apply(item):
            break
    replay.result([])


VALID = binlog(full(1, "alpha", b"one"), full(2, "beta", b"two" * 20), short(1, BURIED),
               full(3, "alpha", b""), short(2, INVALID), zeros=0)


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=4, max_value=len(VALID)))
def test_cutting_a_file_anywhere_keeps_every_whole_record_before_the_cut(cut):
    items = list(parse_records(VALID[:cut]))
    records = [item for item in items if isinstance(item, Record) and
               (item.tube is None or item.body is not None)]
    whole = list(parse_records(VALID))[:len(records)]
    assert records == whole
    end = items[-1]
    assert isinstance(end, End)
    if cut in record_ends(VALID):
        assert end.warning is None
    else:                               # only a cut inside a zero namelen goes unnoticed
        assert end.warning is not None or not VALID[end.offset:cut].strip(b"\0")


def record_ends(data: bytes) -> set[int]:
    ends, items = {4}, list(parse_records(data))
    for item, after in zip(items, items[1:]):
        ends.add(after.offset)
    return ends | {len(data)}


# -- a real beanstalkd: workload, stop, read, restart -----------------------------------------


TUBES = ["default", "alpha", "beta-2", "t" * 200]


def run_workload(address) -> dict[int, bytes]:
    """Put, reserve, release, bury, kick and delete across several files; the bodies put."""
    rng = random.Random(20261122)
    producer = greenstalk.Client(address, encoding=None)
    bodies: dict[int, bytes] = {}

    def put(tube: str, body: bytes, pri: int = 100, delay: int = 0, ttr: int = 60) -> int:
        producer.use(tube)
        job_id = producer.put(body, priority=pri, delay=delay, ttr=ttr)
        bodies[job_id] = body
        return job_id

    put("default", b"")
    put("alpha", b"\r\n", pri=0)
    put("alpha", b"bin\r\n\0\xff\r\nary\r\n", pri=2**32 - 1, ttr=1)
    put("beta-2", rng.randbytes(60 * 1024), pri=5)
    put(TUBES[3], b"long tube name", delay=3600)
    put("beta-2", b"due soon", delay=1)
    bulk = [put(rng.choice(TUBES), rng.randbytes(rng.randrange(100, 3000)),
                pri=rng.randrange(0, 2000), delay=rng.choice([0, 0, 0, 3600]),
                ttr=rng.choice([1, 60, 86400])) for _ in range(200)]
    for job_id in rng.sample(bulk, 150):
        producer.delete(job_id)

    worker = greenstalk.Client(address, encoding=None, watch=TUBES)
    reserved = [worker.reserve(timeout=5) for _ in range(16)]
    to_bury = reserved[:8]
    rng.shuffle(to_bury)                        # bury in an order that is not id order
    for job in to_bury:
        worker.bury(job, priority=rng.randrange(0, 2000))
    worker.release(reserved[8], priority=7, delay=3600)
    worker.release(reserved[9], delay=1)
    worker.release(reserved[10])                # not logged: releases 1 is lost
    worker.delete(reserved[11])
    for tube in ("alpha", "beta-2"):
        producer.use(tube)
        producer.kick(1)                        # the first buried job of the tube
    producer.use("default")
    still_buried = [job.id for job in to_bury
                    if producer.stats_job(job.id)["state"] == "buried"]
    producer.kick_job(still_buried[len(still_buried) // 2])
    # more traffic so the head files are compacted away under the buried jobs
    churn = [put("default", rng.randbytes(2000)) for _ in range(60)]
    for job_id in churn:
        producer.delete(job_id)
    put("alpha", b"last")
    # reserved[12:16] and one more are held until the stop (reservations are not logged);
    # the wait makes the delay-1 jobs overdue, and the ttr-1 reservations time out
    worker.reserve(timeout=5)
    time.sleep(1.2)
    stats = producer.stats()
    assert stats["binlog-records-migrated"] > 0, stats
    worker.close()
    producer.close()
    return bodies


@pytest.mark.reference
@pytest.mark.parametrize("stop", ["sigterm", "kill -9"])
def test_a_restarted_beanstalkd_holds_exactly_the_jobs_the_reader_returns(
        stop, beanstalkd_factory, tmp_path, recovers):
    directory = tmp_path / "wal"
    directory.mkdir()
    server = beanstalkd_factory(extra_args=["-b", str(directory), "-s", str(SEGMENT_SIZE)])
    bodies = run_workload(server.address)
    server.stop() if stop == "sigterm" else server.kill()
    assert is_beanstalkd_dir(directory)
    result = read_beanstalkd_binlog(directory)

    assert len(result.files) >= 3 and result.warnings == []
    assert int(result.files[0].split(".")[1]) > 1          # compaction removed the first file
    assert all(job.body == bodies[job.id] for job in result.jobs)
    assert {job.state for job in result.jobs} == {"ready", "delayed", "buried"}
    assert len(result.buried_order) >= 4
    assert any(len(job.body) == 60 * 1024 for job in result.jobs)
    recovers(directory, result)


@pytest.mark.reference
def test_a_job_too_big_for_the_new_limit_is_missing_after_restart_too(
        beanstalkd_factory, tmp_path, recovers):
    directory = tmp_path / "wal"
    directory.mkdir()
    server = beanstalkd_factory(max_job_size=70_000,
                                extra_args=["-b", str(directory), "-s", str(SEGMENT_SIZE)])
    client = greenstalk.Client(server.address, encoding=None)
    ids = [client.put(body) for body in (b"small", b"B" * 66_000, b"after")]
    client.close()
    server.kill()
    result = read_beanstalkd_binlog(directory, max_job_size=65535)
    assert any(f"job {ids[1]} is too big (66002 > 65535)" in w for w in result.warnings)
    recovers(directory, result, max_job_size=65535)
