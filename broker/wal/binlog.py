"""The broker's write-ahead log: a directory of preallocated segments (format.py).

How it is used: it is the broker core's journal (core/shared/journal.py).  The core asks
`room(kind, subject)` before a change it will log (a refusal is beanstalkd's disk-full
answer), then `append(kind, subject)`, which encodes the record at once and only adds
its bytes to a pending list (`reserve_*` and `log_*` below do the work, one pair per
record kind: `_tables`).  At the end of each event-loop turn the actor calls `maintain`
(compaction) and `end_turn(now)`: `write()` (one frame per segment touched, written
before any reply of that turn leaves), then `after_write(now)` to start an fsync on the
sync thread when the policy says so; the ticket is the write's number.  Under
`fsync_ms == 0` (`hold_replies`) the actor holds every reply until `durable` (`synced`)
covers the write that preceded it: one fsync covers a whole batch (group commit), and no
other session can see a job before its record is on disk.  `restore()` replays the
directory into the core's images (journal.TaskImage, ...); this module and format.py own
every record's bytes both ways, and the books on where each live record is: a job's
segment is its `file` (stats-job shows it), a task's and a schedule's are kept here.

Space (disk full must never cost an acknowledged change): segments are preallocated
with posix_fallocate, so writes into them cannot fail for space.  Every record reserves
twice its size plus a frame header before it is accepted - the second half pays for the
tail a record can leave unused when it does not fit in a segment - and a put reserves
its future delete as well, so deletes always find room.  When the reserve runs short a
new segment is allocated; if that fails, put answers OUT_OF_MEMORY until space returns.
Such an episode is logged once, as it begins (the directory, its free bytes, what a new
segment needs), and once more when an allocation succeeds again; a start that cannot
allocate its first segment exits saying the same and what the operator can change.

Compaction (beanstalkd #599/#570/#622): a segment lives while a live job's latest full
record is in it.  Segments are removed oldest first (a newer one may hold the delete
of a job in an older one).  While the directory exceeds twice the live records plus two
segments, live jobs of the oldest segment are copied forward as full records, a few
thousand per turn; updates never pin a segment, so a job released with a delay again
and again costs nothing once its segment is compacted.  A segment is unlinked only
after an fsync covers the copies that replaced it.

Cloud tasks (tasks.py) are logged the same way: a TASK record (the whole task) pins its
segment like a job's JOB record, TASK_STATE records (start, retry, failure, cancel) pin
nothing, TASK_GONE ends it, and compaction copies live tasks forward.  A task's space is
reserved in steps: its record and its TASK_GONE at enqueue, two states (the start and the
call's end) when a dispatcher takes it; a success whose result needs a whole record
reserves that when it comes (see `log_task_end`).  Cron schedules (schedules.py) are
logged whole each time they change or fire (SCHEDULE, SCHEDULE_GONE), pinning their
segment the same way; each record is reserved when it is made, the GONE with the first.

Slow rates (a function's rate of one call a second or slower, limits.py) keep their GCRA
TAT across a restart, so a crash loop cannot exceed them: it is not a record but a small
file beside the segments, GATES_NAME, {function: TAT as wall-clock seconds}, replaced
whole (written to a temporary name, then renamed) in the turn a slow function starts a
call, before that call leaves (the core appends a GATES record then, `save_gates` at
end_turn; such a function starts at most one call a second, or its burst in one turn).  It is not fsynced: a killed process loses nothing
the kernel holds; after a power loss the last second of it may be lost (one more call
then).  A missing or unreadable file means no TAT to keep (a warning); a TAT further
ahead than the rate allows (a clock stepped back, a hand edit) is cut to what it allows.

Ids: each segment header carries the broker's next id when it became the one being
written, and the segment being written is never removed, so recovery continues after
the largest id ever issued even when every record of it was compacted away.
"""
from __future__ import annotations

import collections
import errno
import fcntl
import json
import math
import logging
import os
import random
import re
import struct
import time
from typing import NamedTuple

from . import format as wf
from .beanstalkd import is_beanstalkd_dir
from .fsync import Syncer, preallocate
from ..core.shared import journal as J
from ..core.beanstalk.jobs import BURIED, COUNTERS, DELAYED, Job
from ..core.tasks.schedules import Schedule
from ..core.tasks.store import TASK_ERROR_CHARS, Task
from ...protocol.codecs.prometheus import LATENCY_BUCKETS, Histogram, Sample

log = logging.getLogger("zstalk.binlog")
SEGMENT_SIZE = 10 * 1024 * 1024        # beanstalkd's -s default
LOCK_NAME = "zstalk.lock"
GATES_NAME = "zstalk.gates.json"
_SEGMENT_RE = re.compile(r"zstalk\.(\d{8,})\.wal")
_MIGRATE_SCAN_PER_TURN = 4096
_NO_COUNTS = (0,) * len(COUNTERS)
# what the core reads of a replayed job is the JOB record's own fields, in its own places
# (journal.py): a JOB record unpacks to kind, id, pri, delay, ttr, created, key, state, and
# the five counts; its state codes are the core's
assert (J.JOB_ID, J.JOB_PRI, J.JOB_DELAY, J.JOB_TTR, J.JOB_CREATED, J.JOB_KEY, J.JOB_STATE,
        J.JOB_COUNTS) == (1, 2, 3, 4, 5, 6, 7, slice(8, 13))
assert (wf.S_READY, wf.S_DELAYED, wf.S_BURIED, wf.S_RESERVED) == (J.READY, J.DELAYED, J.BURIED,
                                                                J.HELD)
#: what a pending record is: nobody's latest full record, or a job's, a task's, a schedule's
_NOWHERE, _JOB, _TASK, _SCHEDULE = 0, 1, 2, 3
_FRAME = wf.FRAME.size
# a TASK_STATE without its uid and error: the longest status, an attempt, four times, a
# status code, as msgpack encodes them at most (see _task_state_reservation)
_TASK_STATE_FIXED = len(wf.encode_task_state("", ["cancelled", 1 << 62, 1e18, 1e18, 1e18, 1e18,
                                                  1 << 62, ""]))


def _round_segment(size: int) -> int:
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


class Binlog:
    def __init__(self, opts: Options) -> None:
        self.opts = opts
        # grows past -s only when a record would not fit in one segment (a big -z)
        self.seg_size = _round_segment(opts.segment_size)
        self.segments: list[Segment] = []   # oldest first; [-1] is the one being written
        self.by_seq: dict[int, Segment] = {}
        self.spares: list[Segment] = []     # preallocated, not yet written
        self.pending: list = []             # (record bytes, _PLACE_*, subject) not written
        self.pending_reserve = 0            # reservation the pending records consume
        self.promised = 0                   # reserved, not yet written
        self.live_bytes = 0
        # headroom = capacity - promised, kept up to date so reserving is one comparison; it
        # only shrinks between recomputations (writes and rolls never raise it)
        self.headroom = 0
        self._tube_bytes: dict[str, bytes] = {}
        self.records_written = 0
        self.records_migrated = 0
        self.fsync_seconds = Histogram(LATENCY_BUCKETS)     # (for /metrics)
        self.wall_offset = 0.0
        self.write_seq = 0                  # counts write() calls that wrote something
        self.synced = 0                     # the last write_seq known to be on disk
        self.last_sync = float("-inf")
        self.doomed: list[tuple[int, Segment]] = []   # (write_seq, segment) to unlink
        self.dir_dirty = False
        # segments written (or created) since the last fsync request, wherever they are
        # now (being written, full, or doomed): the next fsync must cover every one
        self.dirty: dict[int, Segment] = {}
        self.state_id = 0
        self.last_seq = 0                   # the highest segment number ever seen here
        self.syncer = Syncer() if opts.fsync_ms is not None else None
        self._lock_fd = -1
        self._dir_fd = -1
        # a disk-full episode: reservations refused since an allocation failed (-1: none)
        self.refused = -1
        self.least_seg_size = 0             # what the largest record replayed needs
        # the journal's own books on tasks and schedules: the segment of each one's latest
        # full record, that record's size, and a task's optional fields this zstalk does not
        # know (kept and written again, so a compaction here loses nothing a newer one wrote);
        # a job's segment is its `file` (beanstalkd's stats-job shows it), set here
        self.task_file: dict[str, int] = {}
        self.task_size: dict[str, int] = {}
        self.task_extra: dict[str, dict] = {}
        self.schedule_file: dict[str, int] = {}
        self.schedule_size: dict[str, int] = {}
        self.wholly: set[str] = set()       # tasks whose call ends with a whole record
        self.gates: dict | None = None      # the gates' TATs to write this turn (GATES)
        self.hold_replies = opts.fsync_ms == 0
        self._room = self._appends = None   # (tables by record kind: _tables)
        self._loop = None
        self._tables()

    # -- opening -------------------------------------------------------------------
    def open(self, max_job_size: int, beside_beanstalkd: bool = False) -> wf.Replayed:
        """Lock the directory, replay it, and start a fresh segment for writing.

        A directory with beanstalkd's binlog.N files is refused (never start empty
        beside them), except by the importer (`beside_beanstalkd`)."""
        path = self.opts.path
        os.makedirs(path, exist_ok=True)
        if is_beanstalkd_dir(path) and not beside_beanstalkd:
            raise BinlogError(
                f"{path} holds a beanstalkd binlog (binlog.N files), not a zstalk one; "
                f"import it first with: zstalk import-binlog {path}")
        self._lock(path)
        try:
            return self._open_locked(path, max_job_size)
        except BaseException:
            self.close()
            raise

    def _open_locked(self, path: str, max_job_size: int) -> wf.Replayed:
        self._dir_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        replayed = self._replay(path, max_job_size)._replace(gates=self._load_gates(path))
        self.state_id = replayed.state_id or random.getrandbits(63) or 1
        try:
            first = self._allocate(replayed.next_id)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            raise BinlogError(self._no_room_to_start(exc)) from None
        self.segments.append(first)
        self.by_seq[first.seq] = first
        self._restore_reserve()
        # what we replayed may be page cache never synced (kill -9 mid-sync): make it, and
        # the new segment's next id, durable before anything is unlinked or replied to
        self.sync_all()
        return replayed

    @staticmethod
    def _load_gates(path: str) -> dict[str, float]:
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

    def save_gates(self, gates: dict[str, float]) -> None:
        """Replace GATES_NAME with `gates` (function -> wall-clock TAT); a failure (disk
        full) is logged and costs only the TATs, not the broker."""
        full = os.path.join(self.opts.path, GATES_NAME)
        try:
            with open(full + ".tmp", "w", encoding="utf-8") as f:
                json.dump(gates, f)
            os.replace(full + ".tmp", full)
        except OSError as exc:
            log.warning("binlog: %s could not be written (%s): a restart would forget the "
                        "slow rates' last starts", full, exc)

    def _restore_reserve(self) -> None:
        """Back the deletes promised to the replayed jobs with allocated space."""
        try:
            while self._capacity() < self.promised:
                self.spares.append(self._allocate(0))
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            self._out_of_space(exc, self.seg_size)
            log.warning("binlog: disk full at start: deletes of recovered jobs may fail")

    def _lock(self, path: str) -> None:
        fd = os.open(os.path.join(path, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise BinlogError(f"{path} is locked by another zstalk broker (pid {holder})") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd

    def _replay(self, path: str, max_job_size: int) -> wf.Replayed:
        names = sorted((int(m.group(1)), n) for n in os.listdir(path)
                       if (m := _SEGMENT_RE.fullmatch(n)))
        jobs: dict = {}
        tasks: dict = {}
        schedules: dict = {}
        tubes: dict = {}
        warnings: list[str] = []
        next_id = state_id = 0
        last_with_data = self._last_with_data(path, names)
        self.last_seq = names[-1][0] if names else 0
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
            seg = self._adopt(seq, full, len(data))
            spans, end, why = wf.scan(data)
            try:
                for start, stop in spans:
                    top = wf.apply_records(data, start, stop, seq, jobs, seg.ids, tubes,
                                           tasks, seg.uids, schedules, seg.names)
                    next_id = max(next_id, top + 1)
            except (wf.BadSegment, struct.error) as exc:   # a checked frame we cannot read
                raise BinlogError(f"{full}: {exc}") from None
            if why:
                self._torn(seg, end, why, seq == last_with_data, warnings)
        for w in warnings:
            log.warning("binlog: %s", w)
        for seq, live in collections.Counter(j[3] for j in jobs.values()).items():
            self.by_seq[seq].live = live
        for seq, live in collections.Counter(
                t[1] for t in [*tasks.values(), *schedules.values()]).items():
            self.by_seq[seq].live += live
        self.live_bytes = sum(wf.JOB_FIXED_SIZE + j[0][13] + j[0][14] for j in jobs.values())
        self.promised = len(jobs) * self._reservation(wf.DELETE_SIZE)
        biggest = max((wf.JOB_FIXED_SIZE + j[0][13] + j[0][14] for j in jobs.values()), default=0)
        for fields, _ in tasks.values():
            size = len(wf.encode_task(fields))
            self.live_bytes += size
            biggest = max(biggest, size)
            # its TASK_GONE, and the end of a call the restart cut short (tasks.py)
            self.promised += self._reservation(wf.encode_task_gone(fields[wf.T_UID]).__len__())
            if fields[wf.T_STATUS] in ("running", "admitted"):     # (its end, reserved)
                self.promised += self._task_state_reservation(fields[wf.T_UID])
        for fields, _ in schedules.values():
            size = len(wf.encode_schedule(fields))
            self.live_bytes += size
            biggest = max(biggest, size)
            self.promised += self._reservation(len(wf.encode_schedule_gone(fields[0])))
        self.least_seg_size = wf.HEADER_SIZE + _FRAME + biggest
        self.seg_size = max(self.seg_size, self.least_seg_size)
        return wf.Replayed(jobs, max(next_id, 1), state_id, warnings, tasks, schedules)

    @staticmethod
    def _last_with_data(path: str, names) -> int:
        """The newest segment that has at least one frame (spares after it are empty)."""
        for seq, name in reversed(names):
            with open(os.path.join(path, name), "rb") as f:
                f.seek(wf.HEADER_SIZE)
                if f.read(4) not in (b"", b"\0\0\0\0"):
                    return seq
        return 0

    def _adopt(self, seq: int, full: str, size: int) -> Segment:
        """An existing segment: kept for its live jobs, never written again."""
        seg = Segment(seq, full, os.open(full, os.O_RDWR), size, size)
        self.segments.append(seg)
        self.by_seq[seq] = seg
        return seg

    def _torn(self, seg: Segment, end: int, why: str, is_tail: bool, warnings: list) -> None:
        name = os.path.basename(seg.path)
        if is_tail:
            warnings.append(f"{name}: {why}: torn tail truncated at {end}")
            os.ftruncate(seg.fd, end)
            os.fsync(seg.fd)
            seg.size = seg.pos = end
        else:
            warnings.append(f"{name}: {why}: the rest of this segment is skipped; "
                            "you may be missing data")

    def _close_files(self) -> None:
        if self.syncer is not None:
            self.syncer.stop()
        for seg in self.segments + self.spares + [seg for _, seg in self.doomed]:
            os.close(seg.fd)
        self.segments, self.spares, self.doomed, self.dirty = [], [], [], {}
        for fd in (self._dir_fd, self._lock_fd):
            if fd >= 0:
                os.close(fd)
        self._dir_fd = self._lock_fd = -1

    # -- space ---------------------------------------------------------------------
    def _allocate(self, next_id: int) -> Segment:
        """A new preallocated segment; raises OSError (ENOSPC) when the disk is full."""
        self.last_seq += 1
        seq = self.last_seq
        full = os.path.join(self.opts.path, segment_name(seq))
        fd = os.open(full, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            preallocate(fd, self.seg_size)
            os.pwrite(fd, wf.encode_header(wf.Header(self.state_id, next_id, seq)), 0)
        except OSError:
            os.close(fd)
            os.unlink(full)
            raise
        self.dir_dirty = True
        seg = Segment(seq, full, fd, self.seg_size, wf.HEADER_SIZE)
        self.dirty[seq] = seg           # its header must reach the disk too
        if self.refused >= 0:
            self._space_back()
        return seg

    # -- disk full -----------------------------------------------------------------------
    def free_bytes(self) -> int:
        """What the directory's filesystem lets us allocate now (-1: it cannot say)."""
        try:
            st = os.statvfs(self.opts.path)
        except OSError:
            return -1
        return st.f_bavail * st.f_frsize

    def _out_of_space(self, exc: OSError, need: int) -> None:
        """An allocation of `need` bytes failed: a disk-full episode begins (logged once)
        or goes on (counted)."""
        if self.refused >= 0:
            self.refused += 1
            return
        self.refused = 1
        log.warning("binlog: %s is out of space (%s): %d bytes free, and a put needs a new "
                    "segment of %d bytes (%s); puts answer OUT_OF_MEMORY and task enqueues "
                    "503 out_of_space until space returns", self.opts.path,
                    os.strerror(exc.errno), self.free_bytes(), need,
                    "-s/--binlog-size sets it" if need == self.seg_size else
                    "a record bigger than -s/--binlog-size")

    def _space_back(self) -> None:
        log.info("binlog: %s has space again (%d bytes free): puts are accepted again "
                 "(%d reservations were refused for space meanwhile)", self.opts.path,
                 self.free_bytes(), self.refused)
        self.refused = -1

    def _no_room_to_start(self, exc: OSError) -> str:
        """Why a start cannot allocate its first segment, and what the operator can do:
        free space, move the directory, or lower -s (not below what the largest record
        replayed needs: `seg_size` never is)."""
        least = _round_segment(self.least_seg_size)
        why = "what the largest record here needs" if least > 4096 else "the least it takes"
        lower = (f", or lower -s/--binlog-size (not below {least}, {why})"
                 if self.seg_size > least else
                 " (-s/--binlog-size cannot lower it: the largest record here needs it)")
        return (f"{self.opts.path}: no space to start the binlog ({os.strerror(exc.errno)}): "
                f"its first segment needs {self.seg_size} bytes and "
                f"{max(self.free_bytes(), 0)} are free there; free some space there, move "
                f"the directory to a disk with room (-b/--binlog){lower}")

    @staticmethod
    def _reservation(record_size: int) -> int:
        return 2 * (record_size + _FRAME)

    def _capacity(self) -> int:
        """Bytes still writable: the rest of the segment being written, and the spares."""
        return self.segments[-1].free + sum(s.free for s in self.spares)

    def reserve(self, amount: int) -> bool:
        """Promise `amount` bytes of log space, allocating a segment if needed."""
        if self.headroom >= amount:           # the common case, no arithmetic over segments
            self.headroom -= amount
            self.promised += amount
            return True
        while self._capacity() - self.promised < amount:
            try:
                self.spares.append(self._allocate(0))
            except OSError as exc:
                if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                self._out_of_space(exc, self.seg_size)
                return False
        self.promised += amount
        self.headroom = self._capacity() - self.promised
        return True

    def _tube_size(self, tube: str) -> int:
        encoded = self._tube_bytes.get(tube)
        if encoded is None:
            encoded = self._tube_bytes[tube] = tube.encode()
        return len(encoded)

    def reserve_put(self, tube: str, body_len: int) -> bool:
        size = wf.JOB_FIXED_SIZE + self._tube_size(tube) + body_len
        if size > self.seg_size - wf.HEADER_SIZE - _FRAME and not self._fits(size):
            return False
        return self.reserve(self._reservation(size) + self._reservation(wf.DELETE_SIZE))

    def _fits(self, record_size: int) -> bool:
        """Make every segment to come big enough for this record (spares grow too)."""
        need = wf.HEADER_SIZE + _FRAME + record_size
        if need <= self.seg_size:
            return True
        try:
            for seg in self.spares:
                preallocate(seg.fd, need)
                seg.size = need
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            self._out_of_space(exc, need)
            return False
        self.seg_size = need
        self.headroom = self._capacity() - self.promised
        return True

    def reserve_update(self) -> bool:
        return self.reserve(self._reservation(wf.UPDATE_SIZE))

    # -- records (called by the core) -------------------------------------------------
    def image(self, job: Job) -> wf.Image:
        state, key = wf.S_READY, 0.0
        if job.state == DELAYED:
            state, key = wf.S_DELAYED, job.deadline + self.wall_offset
        elif job.state == BURIED:
            state, key = wf.S_BURIED, job.deadline
        return wf.Image(job.id, job.tube.name, job.pri, job.delay_s, job.ttr_s,
                        job.created + self.wall_offset, state, key,
                        tuple(job.counts[:len(COUNTERS)]) if job.counts else _NO_COUNTS,
                        job.body)

    def log_put(self, job: Job) -> None:
        """A new job (its space was reserved by reserve_put)."""
        tube = job.tube.name
        self._tube_size(tube)
        record = wf.encode_new_job(job.id, self._tube_bytes[tube], job.pri, job.delay_s,
                                   job.ttr_s, job.created + self.wall_offset,
                                   job.deadline + self.wall_offset if job.state == DELAYED else 0.0,
                                   job.body)
        self.live_bytes += len(record)
        self.pending.append((record, _JOB, job))
        self.pending_reserve += 2 * (len(record) + _FRAME)

    def log_update(self, job: Job) -> None:
        """bury / kick / release with a delay (space reserved by reserve_update)."""
        i = self.image(job)
        self.pending.append((wf.encode_update(i.id, i.state, i.pri, i.delay_s, i.key, i.counts),
                             _NOWHERE, None))
        self.pending_reserve += self._reservation(wf.UPDATE_SIZE)

    def log_reserved(self, job: Job) -> bool:
        """A graceful stop: `job` is held by a client (format.py's S_RESERVED); False
        when the disk has no room for the record (the job then comes back ready)."""
        if not self.reserve_update():
            return False
        i = self.image(job)
        self.pending.append((wf.encode_update(i.id, wf.S_RESERVED, i.pri, i.delay_s, 0.0,
                                              i.counts), _NOWHERE, None))
        self.pending_reserve += self._reservation(wf.UPDATE_SIZE)
        return True

    def log_delete(self, job: Job) -> None:
        """The job is gone (its space was reserved when it was put)."""
        self.live_bytes -= wf.job_record_size(job.tube.name, len(job.body))
        if job.file:
            self._segment(job.file).live -= 1
            job.file = 0
        self.pending.append((wf.encode_delete(job.id), _NOWHERE, None))
        self.pending_reserve += self._reservation(wf.DELETE_SIZE)

    def _segment(self, seq: int) -> Segment:
        return self.by_seq[seq]

    def log_image(self, image: wf.Image) -> bool:
        """A job from elsewhere (import-binlog) as a full record; False without space."""
        size = wf.job_record_size(image.tube, len(image.body))
        if not self._fits(size) or not self.reserve(self._reservation(size)):
            return False
        self.pending.append((wf.encode_job(image), _NOWHERE, None))
        self.pending_reserve += self._reservation(size)
        return True

    # -- task records (called by tasks.Tasks) ----------------------------------------------
    def task_fields(self, task: Task) -> list:
        """A TASK record's list (wall-clock times), without the result."""
        wall = self.wall_offset
        b = task.backoff
        return [task.uid, task.function, task.params, task.priority, task.seq, task.attempts,
                [b.kind, b.delay_ms, b.max_delay_ms, b.jitter], task.timeout_ms, task.delivery,
                task.keep_result_ms, task.created + wall, *self._task_state(task)]

    def task_optional(self, task: Task) -> dict:
        """A TASK record's map of optional fields (format 4): only what is not a default,
        and what a newer zstalk wrote that this one does not know, as it was."""
        extra = self.task_extra.get(task.uid)
        out = dict(extra) if extra else {}
        if task.level:
            out["level"] = task.level
        if task.queue_deadline:
            out["queue_deadline"] = task.queue_deadline + self.wall_offset
        if task.request is not None:
            out["request"] = task.request.fields()
        if task.result_headers:
            out["result_headers"] = task.result_headers
        if task.balance_key is not None:
            out["balance_key"] = task.balance_key
        if task.client_ip is not None:
            out["client_ip"] = task.client_ip
        if task.online:
            out["online"] = True
            if task.pass_exp:
                out["pass_exp"] = task.pass_exp + self.wall_offset
            if task.ended_by:
                out["ended_by"] = task.ended_by
        return out

    def _task_record(self, task: Task, result: bytes | None) -> bytes:
        return wf.encode_task([*self.task_fields(task), result, self.task_optional(task)])

    def _task_state(self, task: Task) -> list:
        wall = self.wall_offset
        return [task.status, task.attempt,
                None if task.started is None else task.started + wall,
                None if task.finished is None else task.finished + wall,
                task.due + wall, task.expires + wall, task.status_code, task.error]

    def _task_state_reservation(self, uid: str) -> int:
        """Room for any TASK_STATE of this task (its error text is cut to TASK_ERROR_CHARS)."""
        return self._reservation(_TASK_STATE_FIXED + len(uid.encode()) + 4 * TASK_ERROR_CHARS)

    def reserve_task(self, task: Task) -> bool:
        """Room for a new task's TASK record and its TASK_GONE."""
        size = len(self._task_record(task, None))
        if size > self.seg_size - wf.HEADER_SIZE - _FRAME and not self._fits(size):
            return False
        gone = len(wf.encode_task_gone(task.uid))
        return self.reserve(self._reservation(size) + self._reservation(gone))

    def reserve_call(self, task: Task) -> bool:
        """Room for the TASK_STATEs of a call: its start and its end."""
        return self.reserve(2 * self._task_state_reservation(task.uid))

    def reserve_task_state(self, task: Task) -> bool:
        return self.reserve(self._task_state_reservation(task.uid))

    def log_task(self, task: Task) -> None:
        """The whole task (enqueue; its space was reserved by reserve_task)."""
        record = self._task_record(task, task.result)
        self.live_bytes += len(record) - self.task_size.get(task.uid, 0)
        self.task_size[task.uid] = len(record)
        self.pending.append((record, _TASK, task))
        self.pending_reserve += self._reservation(len(record))

    def log_task_state(self, task: Task) -> None:
        """A start, retry, failure or cancel (reserved by reserve_call / reserve_task_state)."""
        self.pending.append((wf.encode_task_state(task.uid, self._task_state(task)), _NOWHERE,
                             None))
        self.pending_reserve += self._task_state_reservation(task.uid)

    def log_task_end(self, task: Task) -> bool:
        """The end of a call, reserved as a TASK_STATE by reserve_call.  A result needs the
        whole record: False if there is no room for it (then nothing is logged, and the
        reserved state is still there for the caller to log without the result)."""
        if task.result is None and not task.result_headers:
            self.log_task_state(task)
            return True
        size = len(self._task_record(task, task.result))
        if not self._fits(size) or not self.reserve(self._reservation(size)):
            return False
        self.log_task(task)
        # the TASK_STATE reserved for this end was not needed
        self.promised -= self._task_state_reservation(task.uid)
        self.headroom += self._task_state_reservation(task.uid)
        return True

    def log_task_gone(self, task: Task) -> None:
        """keepResult passed (its space was reserved with the task)."""
        uid = task.uid
        self.live_bytes -= self.task_size.pop(uid, 0)
        seq = self.task_file.pop(uid, 0)
        if seq:
            self._segment(seq).live -= 1
        self.task_extra.pop(uid, None)
        record = wf.encode_task_gone(uid)
        self.pending.append((record, _NOWHERE, None))
        self.pending_reserve += self._reservation(len(record))

    # -- schedule records (called by schedules.Schedules) -----------------------------------
    def schedule_fields(self, s: Schedule) -> list:
        return [s.name, s.expr, s.zone.key, s.function, s.params, s.options, s.paused,
                s.next_fire, s.last_fire, s.last_error, s.created]

    @staticmethod
    def _schedule_max(s: Schedule) -> int:
        """The largest record the schedule can have: what changes (times, the last error,
        cut to TASK_ERROR_CHARS) at its largest, so a reservation made before a change covers
        the record written after it."""
        fixed = wf.encode_schedule([s.name, s.expr, s.zone.key, s.function, s.params,
                                    s.options, False, 1.0, 1.0, None, s.created])
        return len(fixed) + 4 * TASK_ERROR_CHARS + 5

    def reserve_schedule(self, s: Schedule, first: bool = False) -> bool:
        """Room for the schedule's next record (and, `first`, its SCHEDULE_GONE)."""
        size = self._schedule_max(s)
        if size > self.seg_size - wf.HEADER_SIZE - _FRAME and not self._fits(size):
            return False
        gone = self._reservation(len(wf.encode_schedule_gone(s.name))) if first else 0
        return self.reserve(self._reservation(size) + gone)

    def log_schedule(self, s: Schedule) -> None:
        """The whole schedule, as it is now (reserved by reserve_schedule)."""
        record = wf.encode_schedule(self.schedule_fields(s))
        self.live_bytes += len(record) - self.schedule_size.get(s.name, 0)
        self.schedule_size[s.name] = len(record)
        self.pending.append((record, _SCHEDULE, s))
        self.pending_reserve += self._reservation(self._schedule_max(s))

    def log_schedule_gone(self, s: Schedule) -> None:
        self.live_bytes -= self.schedule_size.pop(s.name, 0)
        seq = self.schedule_file.pop(s.name, 0)
        if seq:
            self._segment(seq).live -= 1
        record = wf.encode_schedule_gone(s.name)
        self.pending.append((record, _NOWHERE, None))
        self.pending_reserve += self._reservation(len(record))

    def mark_next_id(self, next_id: int) -> None:
        """Record `next_id` as the high-water mark in the segment being written."""
        seg = self.segments[-1]
        os.pwrite(seg.fd, wf.encode_header(wf.Header(self.state_id, next_id, seg.seq)), 0)

    def sync_all(self) -> None:
        """fsync every segment written or made and the directory now, on this thread
        (start and shutdown: no sync thread is running then)."""
        for seg in [*self.segments, *self.dirty.values()]:
            os.fsync(seg.fd)
        self.dirty = {}
        os.fsync(self._dir_fd)
        self.dir_dirty = False
        self.synced = self.write_seq

    # -- writing (called by the actor, once per turn) -----------------------------------
    def write(self, jobs: dict, next_id: int, tasks: dict | None = None,
              schedules: dict | None = None) -> bool:
        """Write the pending records, one frame per segment; True if anything was written.
        `jobs` and `tasks` are the live ones: a full record of one gone since is not placed."""
        if not self.pending:
            return False
        chunk: list[bytes] = []
        size = 0
        for record, place, owner in self.pending:
            if _FRAME + size + len(record) > self.segments[-1].free:
                self._write_frame(chunk, size)
                chunk, size = [], 0
                self._roll(next_id)
            chunk.append(record)
            size += len(record)
            if place:           # a full record: its segment holds the owner's latest one
                if place == _JOB:
                    if jobs.get(owner.id) is owner:
                        self._place_job(owner)
                elif place == _TASK:
                    if tasks is not None and tasks.get(owner.uid) is owner:
                        self._place(self.task_file, owner.uid).uids.append(owner.uid)
                elif schedules is not None and schedules.get(owner.name) is owner:
                    self._place(self.schedule_file, owner.name).names.append(owner.name)
        self._write_frame(chunk, size)
        self.records_written += len(self.pending)
        self.promised -= self.pending_reserve
        self.pending.clear()
        self.pending_reserve = 0
        self.write_seq += 1
        if self.syncer is None:         # --no-fsync: written is as good as it gets
            self.synced = self.write_seq
            self.dirty = {}
        return True

    def _place_job(self, job: Job) -> None:
        """`job`'s latest full record went to the segment being written."""
        cur = self.segments[-1]
        if job.file:
            self._segment(job.file).live -= 1
        job.file = cur.seq
        cur.live += 1
        cur.ids.append(job.id)

    def _place(self, files: dict, key: str) -> Segment:
        """A task's or schedule's latest full record went to the segment being written."""
        cur = self.segments[-1]
        seq = files.get(key, 0)
        if seq:
            self._segment(seq).live -= 1
        files[key] = cur.seq
        cur.live += 1
        return cur

    def _write_frame(self, chunk: list[bytes], size: int) -> None:
        if not chunk:
            return
        seg = self.segments[-1]
        frame = wf.encode_frame(b"".join(chunk))
        # a failed write leaves us unable to promise anything: the caller dies before
        # replying, and the restarted broker recovers what reached the disk
        os.pwrite(seg.fd, frame, seg.pos)
        seg.pos += len(frame)
        self.dirty[seg.seq] = seg

    def _roll(self, next_id: int) -> None:
        """The segment being written is full: continue in a spare (reserved space)."""
        seg = self.spares.pop(0) if self.spares else self._allocate(next_id)
        # the header's next id is the high-water mark of everything logged before it
        os.pwrite(seg.fd, wf.encode_header(wf.Header(self.state_id, next_id, seg.seq)), 0)
        self.dirty[seg.seq] = seg
        self.segments.append(seg)
        self.by_seq[seg.seq] = seg

    # -- fsync ---------------------------------------------------------------------------
    @property
    def notify_fd(self) -> int | None:
        return self.syncer.read_fd if self.syncer else None

    def sync_due(self) -> float | None:
        """When an fsync should start (fsync_ms > 0 with unsynced writes), else None."""
        if self.syncer is None or self.synced >= self.write_seq or self.syncer.busy:
            return None
        return self.last_sync + self.opts.fsync_ms / 1000.0

    def after_write(self, now: float) -> None:
        """Start an fsync if the policy allows one now (group commit: it covers all writes)."""
        due = self.sync_due()
        if due is not None and now >= due:
            fds = [s.fd for s in self.dirty.values()]
            self.dirty = {}
            dir_fd = self._dir_fd if self.dir_dirty else -1
            self.dir_dirty = False
            self.last_sync = now
            self.syncer.request(self.write_seq, fds, dir_fd)

    def on_synced(self, now: float) -> None:
        """The sync thread finished: advance `synced` and start the next one if due."""
        done, error, took = self.syncer.take_done()
        for seconds in took:
            self.fsync_seconds.observe(seconds)
        if error is not None:
            # the kernel may have dropped the pages it failed to write: a retry would
            # report success over lost data, so the broker must stop (and recover)
            raise OSError(f"binlog fsync failed: {error}")
        self.synced = max(self.synced, done)
        self.after_write(now)

    # -- compaction ------------------------------------------------------------------------
    def disk_bytes(self) -> int:
        return sum(s.size for s in self.segments) + sum(s.size for s in self.spares)

    def compact(self, jobs: dict, tasks: dict | None = None,
                schedules: dict | None = None) -> None:
        """Unlink dead segments oldest first; copy live jobs forward when the log is 2x live."""
        self._unlink_doomed()
        while len(self.segments) > 1:
            oldest = self.segments[0]
            if oldest.live == 0:
                self.segments.pop(0)
                self.doomed.append((self.write_seq + bool(self.pending), oldest))
                continue
            if self.disk_bytes() <= 2 * self.live_bytes + 2 * self.seg_size:
                break
            self._migrate(oldest, jobs)
            if tasks:
                self._migrate_tasks(oldest, tasks)
            if schedules:
                self._migrate_schedules(oldest, schedules)
            break
        self._unlink_doomed()

    def _migrate(self, seg: Segment, jobs: dict) -> None:
        stop = min(len(seg.ids), seg.cursor + _MIGRATE_SCAN_PER_TURN)
        while seg.cursor < stop:
            job = jobs.get(seg.ids[seg.cursor])
            if job is not None and job.file == seg.seq:
                size = wf.job_record_size(job.tube.name, len(job.body))
                if not self._fits(size) or not self.reserve(self._reservation(size)):
                    return                  # disk full: try again next turn
                self.pending.append((wf.encode_job(self.image(job)), _JOB, job))
                self.pending_reserve += self._reservation(size)
                self.records_migrated += 1
            seg.cursor += 1

    def _migrate_tasks(self, seg: Segment, tasks: dict) -> None:
        stop = min(len(seg.uids), seg.task_cursor + _MIGRATE_SCAN_PER_TURN)
        while seg.task_cursor < stop:
            task = tasks.get(seg.uids[seg.task_cursor])
            if task is not None and self.task_file.get(task.uid) == seg.seq:
                record = self._task_record(task, task.result)
                if not self._fits(len(record)) or not self.reserve(self._reservation(len(record))):
                    return                  # disk full: try again next turn
                self.pending.append((record, _TASK, task))
                self.pending_reserve += self._reservation(len(record))
                self.records_migrated += 1
            seg.task_cursor += 1

    def _migrate_schedules(self, seg: Segment, schedules: dict) -> None:
        stop = min(len(seg.names), seg.name_cursor + _MIGRATE_SCAN_PER_TURN)
        while seg.name_cursor < stop:
            s = schedules.get(seg.names[seg.name_cursor])
            if s is not None and self.schedule_file.get(s.name) == seg.seq:
                if not self.reserve_schedule(s):
                    return                  # disk full: try again next turn
                self.log_schedule(s)
                self.records_migrated += 1
            seg.name_cursor += 1

    def _unlink_doomed(self) -> None:
        busy = self.syncer is not None and self.syncer.busy
        keep = []
        for seq, seg in self.doomed:
            if seq <= self.synced and not busy and seg.seq not in self.dirty:
                del self.by_seq[seg.seq]
                os.close(seg.fd)
                os.unlink(seg.path)
                self.dir_dirty = True
            else:
                keep.append((seq, seg))
        self.doomed = keep

    # -- stats ---------------------------------------------------------------------------
    def oldest_index(self) -> int:
        return self.segments[0].seq if self.segments else 0

    def current_index(self) -> int:
        return self.segments[-1].seq if self.segments else 0

    # -- the journal the core is handed (broker/core/shared/journal.py) -------------------------
    def _tables(self) -> None:
        """`room` and `append` by record kind (a list lookup: a put costs two calls)."""
        ok = _always
        room = [ok] * len(J.KINDS)
        room[J.JOB_PUT] = lambda job: self.reserve_put(job.tube.name, len(job.body))
        room[J.JOB_UPDATE] = room[J.JOB_HELD] = lambda job: self.reserve_update()
        room[J.TASK_NEW] = self.reserve_task
        room[J.TASK_CALL] = self.reserve_call
        room[J.TASK_STATE] = self.reserve_task_state
        room[J.TASK_END] = self._room_task_end
        room[J.SCHEDULE_NEW] = lambda s: self.reserve_schedule(s, first=True)
        room[J.SCHEDULE] = self.reserve_schedule
        appends = [None] * len(J.KINDS)
        appends[J.JOB_PUT] = self.log_put
        appends[J.JOB_UPDATE] = self.log_update
        appends[J.JOB_HELD] = self._log_held
        appends[J.JOB_DELETE] = self.log_delete
        appends[J.TASK_NEW] = self.log_task
        appends[J.TASK_STATE] = self.log_task_state
        appends[J.TASK_END] = self._log_task_end
        appends[J.TASK_GONE] = self.log_task_gone
        appends[J.SCHEDULE] = self.log_schedule
        appends[J.SCHEDULE_GONE] = self.log_schedule_gone
        appends[J.GATES] = self._keep_gates
        self._room, self._appends = room, appends

    def room(self, kind: int, subject) -> bool:
        return self._room[kind](subject)

    def append(self, kind: int, subject) -> None:
        self._appends[kind](subject)

    def _log_held(self, job: Job) -> None:
        """A graceful stop: `job` is held by a client (its room: JOB_HELD's)."""
        i = self.image(job)
        self.pending.append((wf.encode_update(i.id, wf.S_RESERVED, i.pri, i.delay_s, 0.0,
                                              i.counts), _NOWHERE, None))
        self.pending_reserve += self._reservation(wf.UPDATE_SIZE)

    def _room_task_end(self, task: Task) -> bool:
        """A call's end was reserved as a TASK_STATE with the call; a result needs the
        whole record: its room now, the reserved state given back (False: no room, and
        the state is still there for the caller to log without the result)."""
        if task.result is None and not task.result_headers:
            return True
        size = len(self._task_record(task, task.result))
        if not self._fits(size) or not self.reserve(self._reservation(size)):
            return False
        self.promised -= self._task_state_reservation(task.uid)
        self.headroom += self._task_state_reservation(task.uid)
        self.wholly.add(task.uid)
        return True

    def _log_task_end(self, task: Task) -> None:
        if task.uid in self.wholly:
            self.wholly.discard(task.uid)
            self.log_task(task)
        else:
            self.log_task_state(task)

    def _keep_gates(self, tats: dict) -> None:
        self.gates = tats               # (the side file is replaced once, at end_turn)

    @property
    def durable(self) -> int:
        return self.synced

    def stats(self) -> J.JournalStats:
        return J.JournalStats(self.oldest_index(), self.current_index(), self.records_written,
                              self.records_migrated, self.opts.segment_size)

    def samples(self) -> list[Sample]:
        return [Sample("zstalk_binlog_bytes", (), self.live_bytes),
                Sample("zstalk_binlog_fsync_seconds", (), self.fsync_seconds),
                Sample("zstalk_binlog_compaction_copies_total", (), self.records_migrated)]

    def restore(self, max_job_size: int = 65535) -> J.Restored:
        """Lock and replay the directory (open), as the core's images; this journal keeps
        its own books (segments, sizes, unknown fields) from the same replay."""
        replayed = self.open(max_job_size)
        jobs = [(rec, tube, body, seq) for rec, tube, body, seq in replayed.jobs.values()]
        tasks = []
        for uid, (fields, seq) in replayed.tasks.items():
            tasks.append(self._task_image(fields))
            self.task_file[uid], self.task_size[uid] = seq, len(wf.encode_task(fields))
            optional = fields[wf.T_OPTIONAL] if len(fields) > wf.T_OPTIONAL else {}
            extra = {k: v for k, v in optional.items() if k not in wf.TASK_OPTIONAL}
            if extra:
                self.task_extra[uid] = extra
        schedules = []
        for name, (fields, seq) in replayed.schedules.items():
            schedules.append(J.ScheduleImage(*fields))
            self.schedule_file[name] = seq
            self.schedule_size[name] = len(wf.encode_schedule(fields))
        return J.Restored(jobs, replayed.next_id, tasks, schedules, replayed.gates,
                          replayed.warnings)

    @staticmethod
    def _task_image(fields: list) -> J.TaskImage:
        """A TASK record's list (its result after the fields, format 4's optional map after
        that) as the core's image: what it cannot be is left at the image's default."""
        optional = fields[wf.T_OPTIONAL] if len(fields) > wf.T_OPTIONAL else {}
        named = {k: optional[k] for k in wf.TASK_OPTIONAL if k in optional}
        for name in ("balance_key", "client_ip", "ended_by"):
            if type(named.get(name)) is not str:
                named.pop(name, None)
        named["online"] = optional.get("online") is True
        for name in ("queue_deadline", "pass_exp"):
            if not isinstance(named.get(name), (int, float)) or isinstance(named[name], bool):
                named.pop(name, None)
        if type(named.get("level")) is not int:
            named.pop("level", None)
        return J.TaskImage(*fields[:wf.T_OPTIONAL], **named)

    def start(self, loop, on_durable) -> None:
        """Watch the sync thread from `loop`: each finished fsync moves `durable` on."""
        if self.notify_fd is None:
            return
        self._loop = loop

        def synced() -> None:
            self.on_synced(time.monotonic())
            on_durable()
        loop.add_reader(self.notify_fd, synced)

    def end_turn(self, now: float, live: J.LiveView) -> int:
        """The turn's records as one write, an fsync started if the policy says so, and the
        gates' side file replaced if they changed (before the turn's calls leave); the
        ticket is the write that holds them."""
        self.write(live.jobs, live.next_id, live.tasks, live.schedules)
        self.after_write(now)
        if self.gates is not None:
            self.save_gates(self.gates)
            self.gates = None
        return self.write_seq

    def due(self) -> float | None:
        return self.sync_due()

    def maintain(self, live: J.LiveView) -> None:
        self.compact(live.jobs, live.tasks, live.schedules)

    def close(self, now: float | None = None, live: J.LiveView | None = None) -> None:
        """A graceful stop with `live`: what the turn appended last (the held jobs) is
        written and every segment made durable on this thread; then the files close."""
        if live is not None and self.segments:
            self.write(live.jobs, live.next_id, live.tasks, live.schedules)
            if self.gates is not None:
                self.save_gates(self.gates)
                self.gates = None
            if self.syncer is not None:
                self.syncer.stop()      # no fsync of ours may run beside the last one
                self.syncer = None
            self.sync_all()
        if self._loop is not None and self.notify_fd is not None:
            self._loop.remove_reader(self.notify_fd)
        self._loop = None
        self._close_files()


def _always(subject) -> bool:
    return True
