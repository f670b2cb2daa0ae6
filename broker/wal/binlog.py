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
reserves that when it comes (TASK_END's room, `_room_task_end`).  Cron schedules (schedules.py) are
logged whole each time they change or fire (SCHEDULE, SCHEDULE_GONE), pinning their
segment the same way; each record is reserved when it is made, the GONE with the first.
A room event's draw (ROOM_DRAW) is kept the same way, each function's latest for good
(there is no GONE): it pins its segment, and compaction copies it forward from this
journal's own books (`draws`, records.DrawBooks), so a restart long after the opening still has it.

An operator's pause of a function (format 5's FUNCTION_STATE) pins its segment while the
function stays paused, as a schedule's record does; its resume unpins it, and compaction
copies a pause still in force forward (`function_file`: the journal's own book).

Slow rates keep their last start across a restart in a side file (directory.py).

Ids: each segment header carries the broker's next id when it became the one being
written, and the segment being written is never removed, so recovery continues after
the largest id ever issued even when every record of it was compacted away.
"""
from __future__ import annotations

import collections
import errno
import logging
import os
import random
import time

from . import directory, format as wf, records
from .beanstalkd import is_beanstalkd_dir
from .directory import (GATES_NAME, LOCK_NAME, SEGMENT_SIZE, BinlogError, Options,  # noqa: F401
                        Segment, round_segment, segment_name)
from .fsync import Syncer, preallocate
from ..core.shared import journal as J
from ..core.beanstalk.jobs import Job
from ..core.schedules.schedules import Schedule
from ..core.tasks.store import Task
from ...protocol.codecs.prometheus import LATENCY_BUCKETS, Histogram, Sample

log = logging.getLogger("zstalk.binlog")
_MIGRATE_SCAN_PER_TURN = 4096
# what the core reads of a replayed job is the JOB record's own fields, in its own places
# (journal.py): a JOB record unpacks to kind, id, pri, delay, ttr, created, key, state, and
# the five counts; its state codes are the core's
assert (J.JOB_ID, J.JOB_PRI, J.JOB_DELAY, J.JOB_TTR, J.JOB_CREATED, J.JOB_KEY, J.JOB_STATE,
        J.JOB_COUNTS) == (1, 2, 3, 4, 5, 6, 7, slice(8, 13))
assert (wf.S_READY, wf.S_DELAYED, wf.S_BURIED, wf.S_RESERVED) == (J.READY, J.DELAYED, J.BURIED,
                                                                J.HELD)
#: what a pending record is: nobody's latest full record, or a job's, a task's, a
#: schedule's, a function's room draw's, a paused function's
_NOWHERE, _JOB, _TASK, _SCHEDULE, _DRAW, _FUNCTION = 0, 1, 2, 3, 4, 5
_FRAME = wf.FRAME.size
_DELETE_ROOM = 2 * (wf.DELETE_SIZE + _FRAME)     # a put reserves its DELETE too (_reservation)


class Binlog:
    def __init__(self, opts: Options) -> None:
        self.opts = opts
        # grows past -s only when a record would not fit in one segment (a big -z)
        self.seg_size = round_segment(opts.segment_size)
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
        self.disk_full = directory.DiskFull(opts.path)     # an episode, logged once
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
        self.draws = records.DrawBooks()    # each function's latest room draw
        self.wholly: set[str] = set()       # tasks whose call ends with a whole record
        # paused functions -> the segment of the record that paused them (0: not written yet)
        self.function_file: dict[str, int] = {}
        self.whole_room: dict[str, int] = {}    # a TASK_WHOLE's reservation, until logged
        self.gates: dict | None = None      # the gates' TATs to write this turn (GATES)
        self.hold_replies = opts.fsync_ms == 0
        self.logs_reserves = False          # (held jobs only at a graceful stop, JOB_HELD)
        self.failed = None                  # (a write or fsync that fails raises instead)
        self.room = self.append = ()        # by record kind: _tables
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
        self._lock_fd = directory.lock(path)
        try:
            return self._open_locked(path, max_job_size)
        except BaseException:
            self.close()
            raise

    def _open_locked(self, path: str, max_job_size: int) -> wf.Replayed:
        self._dir_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        found = directory.replay(path, max_job_size)
        self.segments, self.last_seq = found.segments, found.last_seq
        self.by_seq = {seg.seq: seg for seg in found.segments}
        replayed = found.replayed
        self._account(replayed)
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

    def save_gates(self, gates: dict[str, float]) -> None:
        directory.save_gates(self.opts.path, gates)

    def _restore_reserve(self) -> None:
        """Back the deletes promised to the replayed jobs with allocated space."""
        try:
            while self._capacity() < self.promised:
                self.spares.append(self._allocate(0))
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            self.disk_full.refused(os.strerror(exc.errno), self.seg_size, self.seg_size)
            log.warning("binlog: disk full at start: deletes of recovered jobs may fail")

    def _account(self, replayed: wf.Replayed) -> None:
        """What the replayed records hold and promise: each segment's live records, the
        live bytes, the room their ends need (a job's delete, a task's TASK_GONE and the
        end of a call a restart cut short, a schedule's SCHEDULE_GONE), and the segment
        size the largest of them needs."""
        jobs, tasks, schedules = replayed.jobs, replayed.tasks, replayed.schedules
        for seq, live in collections.Counter(j[3] for j in jobs.values()).items():
            self.by_seq[seq].live = live
        for seq, live in collections.Counter(
                t[1] for t in [*tasks.values(), *schedules.values(),
                               *replayed.draws.values()]).items():
            self.by_seq[seq].live += live
        self.live_bytes = sum(wf.JOB_FIXED_SIZE + j[0][13] + j[0][14] for j in jobs.values())
        self.promised = len(jobs) * self._reservation(wf.DELETE_SIZE)
        biggest = max((wf.JOB_FIXED_SIZE + j[0][13] + j[0][14] for j in jobs.values()), default=0)
        for fields, _ in tasks.values():
            size = len(wf.encode_task(fields))
            self.live_bytes += size
            biggest = max(biggest, size)
            self.promised += self._reservation(wf.encode_task_gone(fields[wf.T_UID]).__len__())
            if fields[wf.T_STATUS] in ("running", "admitted"):     # (its end, reserved)
                self.promised += self._task_state_reservation(fields[wf.T_UID])
        for name, seq in replayed.functions.items():
            self.by_seq[seq].live += 1
            self.function_file[name] = seq
        for fields, _ in schedules.values():
            size = len(wf.encode_schedule(fields))
            self.live_bytes += size
            biggest = max(biggest, size)
            self.promised += self._reservation(len(wf.encode_schedule_gone(fields[0])))
        for fields, _ in replayed.draws.values():
            self.live_bytes += len(wf.encode_room_draw(fields))
        self.least_seg_size = wf.HEADER_SIZE + _FRAME + biggest
        self.seg_size = max(self.seg_size, self.least_seg_size)

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
        if self.disk_full.refusals >= 0:
            self.disk_full.ended()
        return seg

    # -- disk full -----------------------------------------------------------------------
    def _no_room_to_start(self, exc: OSError) -> str:
        return directory.no_room_to_start(self.opts.path, os.strerror(exc.errno), self.seg_size,
                                          self.least_seg_size,
                                          max(directory.free_bytes(self.opts.path), 0))

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
                self.disk_full.refused(os.strerror(exc.errno), self.seg_size, self.seg_size)
                return False
        self.promised += amount
        self.headroom = self._capacity() - self.promised
        return True

    def _tube_size(self, tube: str) -> int:
        encoded = self._tube_bytes.get(tube)
        if encoded is None:
            encoded = self._tube_bytes[tube] = tube.encode()
        return len(encoded)

    def _room_put(self, job: Job) -> bool:
        """A put's JOB record and its DELETE, reserved (one call a put: the core's room)."""
        size = wf.JOB_FIXED_SIZE + self._tube_size(job.tube.name) + len(job.body)
        if size > self.seg_size - wf.HEADER_SIZE - _FRAME and not self._fits(size):
            return False
        return self.reserve(2 * (size + _FRAME) + _DELETE_ROOM)   # (_reservation's, inline)

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
            self.disk_full.refused(os.strerror(exc.errno), need, self.seg_size)
            return False
        self.seg_size = need
        self.headroom = self._capacity() - self.promised
        return True

    def reserve_update(self) -> bool:
        return self.reserve(self._reservation(wf.UPDATE_SIZE))

    # -- records (called by the core) -------------------------------------------------
    def image(self, job: Job) -> wf.Image:
        return records.job_image(job, self.wall_offset)

    def log_put(self, job: Job) -> None:
        """A new job (its space was reserved by _room_put, which encoded its tube)."""
        record = records.new_job(job, self._tube_bytes[job.tube.name], self.wall_offset)
        self.live_bytes += len(record)
        self.pending.append((record, _JOB, job))
        self.pending_reserve += 2 * (len(record) + _FRAME)

    def log_update(self, job: Job) -> None:
        """bury / kick / release with a delay (space reserved by reserve_update)."""
        i = self.image(job)
        self.pending.append((wf.encode_update(i.id, i.state, i.pri, i.delay_s, i.key, i.counts),
                             _NOWHERE, None))
        self.pending_reserve += self._reservation(wf.UPDATE_SIZE)

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
    def task_optional(self, task: Task) -> dict:
        """What a TASK record of `task` holds in its optional map (for the tests)."""
        return records.task_optional(task, self.task_extra.get(task.uid), self.wall_offset)

    def _task_record(self, task: Task, result: bytes | None) -> bytes:
        return records.task_record(task, result, self.task_extra.get(task.uid),
                                   self.wall_offset)

    def _task_state_reservation(self, uid: str) -> int:
        """Room for any TASK_STATE of this task (records.task_state_max)."""
        return self._reservation(records.task_state_max(uid))

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
        self.pending.append((wf.encode_task_state(task.uid, records.task_state(
            task, self.wall_offset)), _NOWHERE, None))
        self.pending_reserve += self._task_state_reservation(task.uid)

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
    def reserve_schedule(self, s: Schedule, first: bool = False) -> bool:
        """Room for the schedule's next record (and, `first`, its SCHEDULE_GONE)."""
        size = records.schedule_max(s)
        if size > self.seg_size - wf.HEADER_SIZE - _FRAME and not self._fits(size):
            return False
        gone = self._reservation(len(wf.encode_schedule_gone(s.name))) if first else 0
        return self.reserve(self._reservation(size) + gone)

    def log_schedule(self, s: Schedule) -> None:
        """The whole schedule, as it is now (reserved by reserve_schedule)."""
        record = wf.encode_schedule(records.schedule_fields(s))
        self.live_bytes += len(record) - self.schedule_size.get(s.name, 0)
        self.schedule_size[s.name] = len(record)
        self.pending.append((record, _SCHEDULE, s))
        self.pending_reserve += self._reservation(records.schedule_max(s))

    def log_schedule_gone(self, s: Schedule) -> None:
        self.live_bytes -= self.schedule_size.pop(s.name, 0)
        seq = self.schedule_file.pop(s.name, 0)
        if seq:
            self._segment(seq).live -= 1
        record = wf.encode_schedule_gone(s.name)
        self.pending.append((record, _NOWHERE, None))
        self.pending_reserve += self._reservation(len(record))

    # -- room draws (called by the waiting room, waiting.py) ---------------------------------
    def reserve_draw(self, draw: J.RoomDraw) -> bool:
        return self.reserve(self._reservation(len(wf.encode_room_draw(
            records.draw_fields(draw)))))

    def log_draw(self, draw: J.RoomDraw) -> None:
        """A function's latest draw (reserved by reserve_draw, or by compaction)."""
        self._log_draw(records.draw_fields(draw))

    def _log_draw(self, fields: list) -> None:
        record, grown = self.draws.logged(fields)
        self.live_bytes += grown
        self.pending.append((record, _DRAW, fields[0]))
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
                elif place == _DRAW:
                    self._place(self.draws.file, owner)     # (`owner`: the function)
                elif place == _FUNCTION:
                    if owner in self.function_file:     # (still paused: not resumed since)
                        self._place(self.function_file, owner)
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
            self._migrate_draws(oldest)
            self._migrate_functions(oldest)
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

    def _migrate_draws(self, seg: Segment) -> None:
        for name in self.draws.placed_in(seg.seq):
            fields = self.draws.fields[name]
            if not self.reserve(self._reservation(len(wf.encode_room_draw(fields)))):
                return                      # disk full: try again next turn
            self._log_draw(fields)
            self.records_migrated += 1

    def _migrate_functions(self, seg: Segment) -> None:
        """The pauses still in force whose record is in `seg`, copied forward (a few)."""
        for name in [n for n, seq in self.function_file.items() if seq == seg.seq]:
            if not self._room_function((name, True)):
                return                      # disk full: try again next turn
            self._log_function((name, True))
            self.records_migrated += 1

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
        """`room` and `append` by record kind (journal.py: a put costs two calls)."""
        self.room = J.by_kind(J.accept, {
            J.JOB_PUT: self._room_put, J.JOB_UPDATE: self._room_update,
            J.JOB_HELD: self._room_update, J.TASK_NEW: self.reserve_task,
            J.TASK_CALL: self.reserve_call, J.TASK_STATE: self.reserve_task_state,
            J.TASK_END: self._room_task_end, J.SCHEDULE_NEW: self._room_new_schedule,
            J.SCHEDULE: self.reserve_schedule, J.ROOM_DRAW: self.reserve_draw,
            J.FUNCTION_PAUSE: self._room_function, J.TASK_WHOLE: self._room_task_whole})
        self.append = J.by_kind(J.ignore, {
            J.JOB_PUT: self.log_put, J.JOB_UPDATE: self.log_update, J.JOB_HELD: self._log_held,
            J.JOB_DELETE: self.log_delete, J.TASK_NEW: self.log_task,
            J.TASK_STATE: self.log_task_state, J.TASK_END: self._log_task_end,
            J.TASK_GONE: self.log_task_gone, J.SCHEDULE: self.log_schedule,
            J.SCHEDULE_GONE: self.log_schedule_gone, J.GATES: self._keep_gates,
            J.ROOM_DRAW: self.log_draw, J.FUNCTION_PAUSE: self._log_function,
            J.TASK_WHOLE: self._log_whole})

    def _room_update(self, job: Job) -> bool:
        return self.reserve(self._reservation(wf.UPDATE_SIZE))

    def _room_new_schedule(self, s: Schedule) -> bool:
        return self.reserve_schedule(s, first=True)

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

    def _room_task_whole(self, task: Task) -> bool:
        """Room for a task's whole TASK record again (TASK_WHOLE): the record as the task
        is now without its result, which an operator's retry never outgrows (it drops the
        result, the error, the times and the queue deadline), and which a cancelled task
        marked possibly executed fills exactly (it has no result); what is reserved is
        what `_log_whole` consumes, so nothing stays promised."""
        size = len(self._task_record(task, None))
        amount = self._reservation(size)
        if not self._fits(size) or not self.reserve(amount):
            return False
        self.whole_room[task.uid] = amount
        return True

    def _log_whole(self, task: Task) -> None:
        amount = self.whole_room.pop(task.uid)
        self.log_task(task)
        self.pending_reserve += amount - self._reservation(self.task_size[task.uid])

    def _room_function(self, change: tuple) -> bool:
        return self.reserve(self._reservation(len(wf.encode_function_state(*change))))

    def _log_function(self, change: tuple) -> None:
        """(name, paused): a pause pins the segment it goes to (write places it); a
        resume unpins the pause's."""
        name, paused = change
        record = wf.encode_function_state(name, paused)
        if paused:
            self.function_file.setdefault(name, 0)
            self.pending.append((record, _FUNCTION, name))
        else:
            seq = self.function_file.pop(name, 0)
            if seq:
                self._segment(seq).live -= 1
            self.pending.append((record, _NOWHERE, None))
        self.pending_reserve += self._reservation(len(record))

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
        jobs = replayed.jobs.values()       # (rec, tube, body, seq): as the core reads them
        tasks = []
        for uid, (fields, seq) in replayed.tasks.items():
            tasks.append(records.task_image(fields))
            self.task_file[uid], self.task_size[uid] = seq, len(wf.encode_task(fields))
            extra = records.unknown_optional(fields)
            if extra:
                self.task_extra[uid] = extra
        schedules = []
        for name, (fields, seq) in replayed.schedules.items():
            schedules.append(records.schedule_image(fields))
            self.schedule_file[name] = seq
            self.schedule_size[name] = len(wf.encode_schedule(fields))
        return J.Restored(jobs, replayed.next_id, tasks, schedules, replayed.gates,
                          replayed.warnings, self.draws.restore(replayed.draws),
                          sorted(replayed.functions))

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

    def wait_for(self, ticket: int) -> None:
        """(Replies wait for `ticket`: the write that holds their turn's records, or the
        one before, is on its way to the disk already.)"""

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
