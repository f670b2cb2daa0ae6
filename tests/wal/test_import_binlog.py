"""`zstalk import-binlog`: a binlog written by Debian's beanstalkd, imported, then served by
zstalk; every job must match what a beanstalkd restarted on a copy of the same files holds.
"""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from servers import RawClient, find_zstalk, self_check
from test_binlog_end_to_end import job_map, run_script

pytestmark = [pytest.mark.skipif(self_check(), reason="tests zstalk's own importer"),
              pytest.mark.reference]


def import_binlog(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([find_zstalk(), "import-binlog", *args],
                          capture_output=True, text=True, timeout=60)


def beanstalkd_binlog(beanstalkd_factory, path) -> None:
    """Let a real beanstalkd write a binlog with every kind of record, then kill -9 it."""
    os.makedirs(path)
    server = beanstalkd_factory(extra_args=["-b", str(path), "-s", "20000"])
    run_script(server.address)
    with RawClient(server.address, 10) as c:
        for i in range(120):                  # enough to roll files and compact
            body = b"churn-%d" % i
            c.send(b"use t%d\r\nput %d 0 60 %d\r\n%s\r\n" % (i % 3, i, len(body), body))
            c.read_replies(2)
        for job_id in range(20, 100, 3):
            c.send(b"delete %d\r\n" % job_id)
            c.read_reply()
        for job_id in (101, 30, 105, 60):
            c.send(b"reserve-job %d\r\nbury %d 9\r\n" % (job_id, job_id))
            c.read_replies(2)
    server.kill()


def buried_order(address, tubes) -> dict:
    """Per tube, the order peek-buried / kick-job serve its buried jobs (kicks them all)."""
    order = {}
    with RawClient(address, 10) as c:
        for tube in tubes:
            c.send(b"use " + tube + b"\r\n")
            c.read_reply()
            seq = []
            while True:
                c.send(b"peek-buried\r\n")
                reply = c.read_reply()
                if reply.startswith(b"NOT_FOUND"):
                    break
                job_id = int(reply.split()[1])
                seq.append(job_id)
                c.send(b"kick-job %d\r\n" % job_id)
                c.read_reply()
            order[tube] = seq
    return order


def test_an_imported_beanstalkd_binlog_serves_the_same_jobs(beanstalkd_factory, zstalk_factory,
                                                           tmp_path):
    src = tmp_path / "var-lib-beanstalkd"
    beanstalkd_binlog(beanstalkd_factory, src)
    ref_dir = tmp_path / "reference-copy"
    shutil.copytree(src, ref_dir)
    reference = beanstalkd_factory(extra_args=["-b", str(ref_dir)])

    done = import_binlog(str(src))
    assert done.returncode == 0, done.stderr
    assert "imported" in done.stdout
    assert os.path.isdir(src / "beanstalkd-imported")
    assert not [n for n in os.listdir(src) if n.startswith("binlog.")]
    zstalk = zstalk_factory(extra_args=["-b", str(src)])

    expected = job_map(reference.address, 300)
    assert len(expected) > 80
    assert job_map(zstalk.address, 300) == expected
    tubes = sorted({job[0] for job in expected.values()})
    assert buried_order(zstalk.address, tubes) == buried_order(reference.address, tubes)
    put = b"put 0 0 60 3\r\nnew\r\n"
    with RawClient(reference.address) as r, RawClient(zstalk.address) as z:
        r.send(put)
        z.send(put)
        assert z.read_reply() == r.read_reply(), "ids go on where beanstalkd's would"


def test_import_into_another_directory_leaves_beanstalkds_files_alone(beanstalkd_factory,
                                                                     zstalk_factory, tmp_path):
    src = tmp_path / "old"
    beanstalkd_binlog(beanstalkd_factory, src)
    before = sorted(os.listdir(src))
    done = import_binlog(str(src), "--into", str(tmp_path / "new"))
    assert done.returncode == 0, done.stderr
    assert sorted(os.listdir(src)) == before
    zstalk = zstalk_factory(extra_args=["-b", str(tmp_path / "new")])
    assert len(job_map(zstalk.address, 300)) > 80


def test_import_refuses_a_directory_a_running_beanstalkd_holds(beanstalkd_factory, tmp_path):
    src = tmp_path / "live"
    src.mkdir()
    server = beanstalkd_factory(extra_args=["-b", str(src)])
    run_script(server.address)
    done = import_binlog(str(src))
    assert done.returncode == 10
    assert "still running" in done.stderr
    assert not [n for n in os.listdir(src) if n.endswith(".wal")]
