"""`zstalk import-binlog DIR`: carry a beanstalkd binlog over into a zstalk one.

beanstalkd.py replays beanstalkd's files exactly as a restarted beanstalkd would;
this module writes the jobs it finds as full records of a fresh zstalk binlog, keeping
ids, tubes, priorities, delays (absolute due times), TTRs, ages, counters, bodies and
the order beanstalkd would re-bury them in, and the next id.

In place (no --into): zstalk's segments are written and fsynced beside beanstalkd's
files, a marker file says so, then beanstalkd's files move into DIR/beanstalkd-imported/,
so `-b DIR` keeps working for whoever switches.  A crash in between leaves both kinds in
DIR and the broker refuses to start on that; running the import again starts it over if
the marker is missing, or only finishes the moves if it is there.  A beanstalkd
still running on DIR (it holds DIR/lock) is refused: its binlog is still changing.
"""
from __future__ import annotations

import fcntl
import os
from typing import NamedTuple

from . import format as wf
from .beanstalkd import BeanstalkdBinlog, binlog_numbers, read_beanstalkd_binlog
from .binlog import SEGMENT_SIZE, Binlog, BinlogError, Options

IMPORTED_DIR = "beanstalkd-imported"
#: in place, set once zstalk's binlog is complete and before any beanstalkd file moves
WRITTEN_MARKER = "zstalk.import-written"
_STATES = {"ready": wf.S_READY, "delayed": wf.S_DELAYED, "buried": wf.S_BURIED}


class Imported(NamedTuple):
    jobs: int
    by_state: dict
    next_id: int
    files: list
    warnings: list
    into: str


def import_beanstalkd(src: str, into: str | None = None, max_job_size: int = 1 << 30,
                      segment_size: int = SEGMENT_SIZE) -> Imported:
    """Read beanstalkd's binlog in `src` and write it as a zstalk binlog in `into` (or src)."""
    src = os.path.abspath(src)
    in_place = into is None or os.path.abspath(into) == src
    dst = src if in_place else os.path.abspath(into)
    if not binlog_numbers(src):
        raise BinlogError(f"{src} holds no beanstalkd binlog.N files")
    _refuse_running_beanstalkd(src)
    marker = os.path.join(src, WRITTEN_MARKER)
    if in_place and os.path.exists(marker):
        # an earlier run wrote everything and died moving beanstalkd's files: finish that
        _set_aside(src, [])
        os.unlink(marker)
        _sync_dir(src)
        return _summary(read_beanstalkd_binlog(os.path.join(src, IMPORTED_DIR), max_job_size), dst)
    old = read_beanstalkd_binlog(src, max_job_size)
    _clear_target(dst, in_place)
    _write(dst, old, segment_size)
    if in_place:
        _mark_written(marker, src)
        _set_aside(src, old.files)
        os.unlink(marker)
        _sync_dir(src)
    return _summary(old, dst)


def _summary(old: BeanstalkdBinlog, dst: str) -> Imported:
    by_state: dict[str, int] = {}
    for job in old.jobs:
        by_state[job.state] = by_state.get(job.state, 0) + 1
    return Imported(len(old.jobs), by_state, old.next_id, old.files, old.warnings, dst)


def _refuse_running_beanstalkd(src: str) -> None:
    lock = os.path.join(src, "lock")
    if not os.path.exists(lock):
        return
    fd = os.open(lock, os.O_RDWR)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)   # beanstalkd's waldirlock lock
    except OSError:
        raise BinlogError(f"a beanstalkd is still running on {src} (it holds {lock}); "
                          "stop it first") from None
    finally:
        os.close(fd)


def _clear_target(dst: str, in_place: bool) -> None:
    """The target must hold no zstalk binlog, except an interrupted in-place import's."""
    os.makedirs(dst, exist_ok=True)
    ours = [n for n in os.listdir(dst) if n.startswith("zstalk.") and n.endswith(".wal")]
    if ours and not in_place:
        raise BinlogError(f"{dst} already holds a zstalk binlog; import into an empty directory")
    for name in ours:                   # left by an import that did not finish
        os.unlink(os.path.join(dst, name))


def _write(dst: str, old: BeanstalkdBinlog, segment_size: int) -> None:
    wal = Binlog(Options(dst, segment_size, None))
    wal.open(1 << 30, beside_beanstalkd=True)
    wal.mark_next_id(old.next_id)      # ids go on after beanstalkd's, deleted ones too
    rank = {job_id: i + 1 for i, job_id in enumerate(old.buried_order)}
    try:
        for job in old.jobs:
            if not wal.log_image(_image(job, rank)):
                raise BinlogError(f"{dst}: no space left for the imported jobs")
            if len(wal.pending) >= 4096:
                wal.write({}, old.next_id)
        wal.write({}, old.next_id)
        wal.sync_all()
    finally:
        wal.close()


def _image(job, rank: dict) -> wf.Image:
    state = _STATES[job.state]
    key = job.deadline_wall if state == wf.S_DELAYED else float(rank.get(job.id, 0))
    if state == wf.S_READY:
        key = 0.0
    return wf.Image(job.id, job.tube, job.pri, job.delay_s, job.ttr_s, job.created_wall,
                    state, key, tuple(job.counts), job.body)


def _set_aside(src: str, files: list[str]) -> None:
    aside = os.path.join(src, IMPORTED_DIR)
    os.makedirs(aside, exist_ok=True)
    names = {*files, *(f"binlog.{n}" for n in binlog_numbers(src)), "lock"}
    for name in names:
        path = os.path.join(src, name)
        if os.path.exists(path):
            os.rename(path, os.path.join(aside, name))
    _sync_dir(src)


def _mark_written(marker: str, src: str) -> None:
    with open(marker, "wb") as f:
        f.write(b"zstalk's binlog is complete; beanstalkd's files are moving aside\n")
        f.flush()
        os.fsync(f.fileno())
    _sync_dir(src)


def _sync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
