"""The binlog's directory: its segment files, its lock, the replay that reads them back,
and the side file of the slow rates' last starts.  binlog.py owns what is written and
when; this module what is on disk and what a start finds there.

Replay (`replay`): segments are read oldest first, each frame checked (format.py's scan),
its records applied to the live jobs, tasks, schedules and room draws; a spare allocated but never
written (its header may never have reached the disk) is removed; a torn tail (a crash
mid-write) is truncated in the newest segment that has data, and anything unreadable
elsewhere is skipped with a warning, since what follows it is not lost only if nothing
depended on it.  The segments read stay open (`Segment`), kept while they hold the latest
full record of something live.

Slow rates (a function's rate of one call a second or slower, limits.py) keep their GCRA
TAT across a restart, so a crash loop cannot exceed them: it is not a record but a small
file beside the segments, GATES_NAME, {function: TAT as wall-clock seconds}, replaced
whole (written to a temporary name, then renamed) in the turn a slow function starts a
call, before that call leaves (the core appends a GATES record then, `save_gates` at
end_turn; such a function starts at most one call a second, or its burst in one turn).  It is not fsynced: a killed process loses nothing
the kernel holds; after a power loss the last second of it may be lost (one more call
then).  A missing or unreadable file means no TAT to keep (a warning); a TAT further
ahead than the rate allows (a clock stepped back, a hand edit) is cut to what it allows.
"""
from __future__ import annotations

import fcntl
import json
import logging
import math
import os
import re
import struct
from typing import NamedTuple

from . import format as wf

log = logging.getLogger("zstalk.binlog")
SEGMENT_SIZE = 10 * 1024 * 1024        # beanstalkd's -s default
LOCK_NAME = "zstalk.lock"
GATES_NAME = "zstalk.gates.json"
_SEGMENT_RE = re.compile(r"zstalk\.(\d{8,})\.wal")


def round_segment(size: int) -> int:
    """-s as beanstalkd takes it: up to whole 4 KiB blocks, never below one."""
    return max(4096, -(-size // 4096) * 4096)


class BinlogError(Exception):
    """The directory cannot be used (locked, beanstalkd's, damaged header): exit 10."""


class Options(NamedTuple):
    path: str
    segment_size: int = SEGMENT_SIZE
    fsync_ms: int | None = 50           # None: never fsync (-F)


def segment_name(seq: int) -> str:
    return f"zstalk.{seq:08d}.wal"


class Segment:
    __slots__ = ("seq", "path", "fd", "size", "pos", "live", "ids", "cursor", "uids",
                 "task_cursor", "names", "name_cursor")

    def __init__(self, seq: int, path: str, fd: int, size: int, pos: int) -> None:
        self.seq = seq
        self.path = path
        self.fd = fd
        self.size = size            # bytes allocated on disk
        self.pos = pos              # where the next frame goes
        self.live = 0               # live jobs and tasks whose latest full record is here
        self.ids: list[int] = []    # ids of the full records written here, in order
        self.cursor = 0             # compaction's progress through `ids`
        self.uids: list[str] = []   # the same for tasks
        self.task_cursor = 0
        self.names: list[str] = []  # and for schedules
        self.name_cursor = 0

    @property
    def free(self) -> int:
        return self.size - self.pos


class Found(NamedTuple):
    """What a replay found: the live state, and the segments it was read from (open)."""
    replayed: wf.Replayed
    segments: list          # Segment, oldest first, each with its record ids
    last_seq: int           # the highest segment number ever seen there


def replay(path: str, max_job_size: int) -> Found:
    """Read every segment of `path` (see the module comment)."""
    names = sorted((int(m.group(1)), n) for n in os.listdir(path)
                   if (m := _SEGMENT_RE.fullmatch(n)))
    jobs: dict = {}
    tasks: dict = {}
    schedules: dict = {}
    draws: dict = {}
    functions: dict = {}
    tubes: dict = {}
    warnings: list[str] = []
    segments: list[Segment] = []
    next_id = state_id = 0
    last_with_data = _last_with_data(path, names)
    for seq, name in names:
        full = os.path.join(path, name)
        with open(full, "rb") as f:
            data = f.read()
        try:
            header = wf.decode_header(data)
        except wf.BadSegment as exc:
            if seq > last_with_data:      # a spare whose header never reached the disk
                warnings.append(f"{name}: {exc}; an empty segment, removed")
                os.unlink(full)
                continue
            raise BinlogError(f"{full}: {exc}") from None
        state_id = header.state_id
        next_id = max(next_id, header.next_id)
        if seq > last_with_data:          # a spare never written: nothing to keep
            os.unlink(full)
            continue
        seg = Segment(seq, full, os.open(full, os.O_RDWR), len(data), len(data))
        segments.append(seg)
        spans, end, why = wf.scan(data)
        try:
            for start, stop in spans:
                top = wf.apply_records(data, start, stop, seq, jobs, seg.ids, tubes,
                                       tasks, seg.uids, schedules, seg.names, draws, functions)
                next_id = max(next_id, top + 1)
        except (wf.BadSegment, struct.error) as exc:   # a checked frame we cannot read
            raise BinlogError(f"{full}: {exc}") from None
        if why:
            _torn(seg, end, why, seq == last_with_data, warnings)
    for w in warnings:
        log.warning("binlog: %s", w)
    return Found(wf.Replayed(jobs, max(next_id, 1), state_id, warnings, tasks, schedules,
                             load_gates(path), draws, functions),
                 segments, names[-1][0] if names else 0)


def _last_with_data(path: str, names) -> int:
    """The newest segment that has at least one frame (spares after it are empty)."""
    for seq, name in reversed(names):
        with open(os.path.join(path, name), "rb") as f:
            f.seek(wf.HEADER_SIZE)
            if f.read(4) not in (b"", b"\0\0\0\0"):
                return seq
    return 0

def _torn(seg: Segment, end: int, why: str, is_tail: bool, warnings: list) -> None:
    name = os.path.basename(seg.path)
    if is_tail:
        warnings.append(f"{name}: {why}: torn tail truncated at {end}")
        os.ftruncate(seg.fd, end)
        os.fsync(seg.fd)
        seg.size = seg.pos = end
    else:
        warnings.append(f"{name}: {why}: the rest of this segment is skipped; "
                        "you may be missing data")

def load_gates(path: str) -> dict[str, float]:
    """The slow rates' last starts (function -> wall-clock TAT); {} when there are none
    or the file cannot be used (a warning says which)."""
    full = os.path.join(path, GATES_NAME)
    try:
        with open(full, encoding="utf-8") as f:
            gates = json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        log.warning("binlog: %s could not be read (%s): slow rates start afresh", full, exc)
        return {}
    if not isinstance(gates, dict):
        log.warning("binlog: %s is not an object: slow rates start afresh", full)
        return {}
    kept = {k: float(v) for k, v in gates.items()
            if type(v) in (int, float) and abs(v) < 1e15 and math.isfinite(v)}
    if len(kept) < len(gates):
        log.warning("binlog: %s: %d entries are not times, their rates start afresh",
                    full, len(gates) - len(kept))
    return kept

def save_gates(path: str, gates: dict[str, float]) -> None:
    """Replace GATES_NAME with `gates` (function -> wall-clock TAT); a failure (disk
    full) is logged and costs only the TATs, not the broker."""
    full = os.path.join(path, GATES_NAME)
    try:
        with open(full + ".tmp", "w", encoding="utf-8") as f:
            json.dump(gates, f)
        os.replace(full + ".tmp", full)
    except OSError as exc:
        log.warning("binlog: %s could not be written (%s): a restart would forget the "
                    "slow rates' last starts", full, exc)

def lock(path: str) -> int:
    """Lock the directory for this process (its pid in the lock file): the fd."""
    fd = os.open(os.path.join(path, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise BinlogError(f"{path} is locked by another zstalk broker (pid {holder})") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def no_room_to_start(path: str, why: str, seg_size: int, least: int, free: int) -> str:
    """Why a start cannot allocate its first segment (`seg_size` bytes), and what the
    operator can do: free space, move the directory, or lower -s (not below `least`, what
    the largest record replayed needs)."""
    least = round_segment(least)
    what = "what the largest record here needs" if least > 4096 else "the least it takes"
    lower = (f", or lower -s/--binlog-size (not below {least}, {what})" if seg_size > least
             else " (-s/--binlog-size cannot lower it: the largest record here needs it)")
    return (f"{path}: no space to start the binlog ({why}): its first segment needs "
            f"{seg_size} bytes and {free} are free there; free some space there, move the "
            f"directory to a disk with room (-b/--binlog){lower}")


def free_bytes(path: str) -> int:
    """What the directory's filesystem lets us allocate now (-1: it cannot say)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return -1
    return st.f_bavail * st.f_frsize


class DiskFull:
    """A disk-full episode of the directory: logged once as it begins (the directory, its
    free bytes, what a put needs), the refusals counted, and once more when an allocation
    succeeds again (`ended`: only then, or the pair would repeat while the disk is full)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.refusals = -1          # reservations refused in this episode (-1: none)

    def refused(self, why: str, need: int, seg_size: int) -> None:
        if self.refusals >= 0:
            self.refusals += 1
            return
        self.refusals = 1
        log.warning("binlog: %s is out of space (%s): %d bytes free, and a put needs a new "
                    "segment of %d bytes (%s); puts answer OUT_OF_MEMORY and task enqueues "
                    "503 out_of_space until space returns", self.path, why,
                    free_bytes(self.path), need,
                    "-s/--binlog-size sets it" if need == seg_size else
                    "a record bigger than -s/--binlog-size")

    def ended(self) -> None:
        log.info("binlog: %s has space again (%d bytes free): puts are accepted again "
                 "(%d reservations were refused for space meanwhile)", self.path,
                 free_bytes(self.path), self.refusals)
        self.refusals = -1
