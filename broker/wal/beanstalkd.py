"""Read a beanstalkd binlog directory (`beanstalkd -b DIR`) the way beanstalkd recovers it.

How it works (beanstalkd 1.12/1.13 `walg.c` walread, `file.c` fileread/readrec, `prot.c`
prot_replay):

  * Files are `binlog.N`.  beanstalkd reads every N from the smallest to the largest
    present, skipping numbers that are missing.  Each file starts with an `int` version:
    7 (1.10 and later) or 5 (1.4.x).
  * A v7 record is `int namelen`, the tube name, a raw `Jobrec` struct, then (full records
    only) `body_size` bytes of body, CRLF included.  namelen 0 makes a short record: an
    update (bury, kick, delayed release) or, with state Invalid, a delete.  v5 records
    have a `size_t` namelen, a packed 77-byte Jobrec5 and microsecond times.
  * `parse_records` is pure: bytes of one file in, `Record`s out, then one `End` saying
    why reading stopped.  `Replay` applies records to a dict that plays beanstalkd's
    replay list: a job joins it at its first record and keeps that place (job_insert
    does nothing for a job already listed), a later full record (a compaction copy)
    replaces the Jobrec and body but never the tube, a short record replaces the Jobrec,
    a delete removes the job, a short record for an unknown id is ignored (its full
    record was compacted away).
  * Like readrec, an error stops reading that file only (the next file is still read):
    a name too long or negative, a record cut short, a new job bigger than -z, a state
    beanstalkd does not know (Copy included).  When the error hits a job already known
    (a torn compaction copy, a bad state), beanstalkd drops that job, and so does this.
  * prot_replay then re-queues the list in order: Reserved comes back Ready, a buried
    job is buried again (bury_ct + 1, and per tube the list order is the kick order),
    a delayed job keeps its absolute deadline.
  * The layout is beanstalkd's native struct on x86_64 / little-endian LP64 (what
    Debian's amd64 package writes); files from other ABIs fail the version check.
"""
from __future__ import annotations

import os
import re
import struct
from pathlib import Path
from typing import Iterator, NamedTuple

WALVER = 7
WALVER5 = 5
MAX_TUBE_NAME_LEN = 201           # dat.h; a name is at most 200 bytes
NS_PER_S = 1_000_000_000

# struct Jobrec (dat.h): u64 id, u32 pri, i64 delay, i64 ttr, i32 body_size, i64 created_at,
# i64 deadline_at, u32 reserve/timeout/release/bury/kick counts, u8 state; C alignment pads
# after pri and body_size and at the end: sizeof(Jobrec) == 80 (checked against real files).
JOBREC = struct.Struct("<QI4xqqi4xqqIIIIIB3x")
# struct Jobrec5 (file.c): same fields, unsigned times in microseconds, read as
# offsetof(Jobrec5, pad) == 77 bytes, after a size_t namelen.
JOBREC5 = struct.Struct("<QI4xQQi4xQQIIIIIB")
NAMELEN = {WALVER: struct.Struct("<i"), WALVER5: struct.Struct("<Q")}
VERSION = struct.Struct("<i")

# enum Jobrec.state (dat.h)
INVALID, READY, RESERVED, BURIED, DELAYED, COPY = range(6)
LIVE_STATES = {READY: "ready", BURIED: "buried", DELAYED: "delayed"}


class BinlogFormatError(Exception):
    """The path is not a readable beanstalkd binlog directory."""


class Jobrec(NamedTuple):
    """One Jobrec as stored, times in nanoseconds (v5 records are converted)."""
    id: int
    pri: int
    delay_ns: int
    ttr_ns: int
    body_size: int
    created_ns: int
    deadline_ns: int
    reserve_ct: int
    timeout_ct: int
    release_ct: int
    bury_ct: int
    kick_ct: int
    state: int


class Record(NamedTuple):
    offset: int             # where the record starts in its file
    tube: str | None        # None: a short (update or delete) record
    jobrec: Jobrec
    body: bytes | None      # a full record's body; None when the file ends inside it


class End(NamedTuple):
    """Why reading a file stopped.  `error` is beanstalkd's `*err = 1`."""
    offset: int
    error: bool
    warning: str | None     # None: a clean end (end of file, the preallocated zero tail)


class BeanstalkdJob(NamedTuple):
    id: int
    tube: str
    pri: int
    delay_s: int            # Jobrec.delay // 1e9, as stats-job shows it
    ttr_s: int
    created_wall: float     # time.time() scale
    state: str              # "ready" | "delayed" | "buried"
    deadline_wall: float    # delayed: absolute due time (may be past); else 0.0
    counts: tuple[int, int, int, int, int]   # reserves, timeouts, releases, buries, kicks
    body: bytes             # the body_size - 2 bytes `peek` sends: the stored CRLF dropped


class BeanstalkdBinlog(NamedTuple):
    """What a beanstalkd restarted on the directory would hold.

    jobs: every live job, sorted by id.
    next_id: the id a restarted beanstalkd gives the next put: 1 + the largest id of any
        full record it read, deleted jobs included (never below 1).
    files: the binlog.N names read, oldest first.
    warnings: what went wrong, prefixed with the file and offset (torn tail, job bigger
        than max_job_size, unknown version or state, missing file ...).
    buried_order: ids of the buried jobs in the order beanstalkd re-buries them, which is
        the order of each job's first surviving record (not the order of the bury
        commands); filtered to one tube it is the order `kick` / `peek-buried` serve.
    """
    jobs: list[BeanstalkdJob]
    next_id: int
    files: list[str]
    warnings: list[str]
    buried_order: list[int]


# -- one file: bytes to records (pure) --------------------------------------------


def read_version(data: bytes) -> int | None:
    """The file's format version, or None when the file is shorter than an int."""
    return VERSION.unpack_from(data)[0] if len(data) >= VERSION.size else None


def parse_records(data: bytes, version: int = WALVER) -> Iterator[Record | End]:
    """Records of one whole binlog file, then exactly one End (readrec / readrec5)."""
    namelen_struct = NAMELEN[version]
    rec_struct = JOBREC if version == WALVER else JOBREC5
    pos = VERSION.size
    while True:
        start = pos
        if len(data) - pos < namelen_struct.size:
            # readrec stops quietly when it cannot read a whole namelen
            stray = data[pos:].strip(b"\0")
            yield End(pos, False, f"{len(data) - pos} stray bytes at the end" if stray else None)
            return
        (namelen,) = namelen_struct.unpack_from(data, pos)
        pos += namelen_struct.size
        if not 0 <= namelen < MAX_TUBE_NAME_LEN:
            yield End(start, True, f"namelen {namelen} is out of range")
            return
        tube_bytes = data[pos:pos + namelen]
        rec_bytes = data[pos + namelen:pos + namelen + rec_struct.size]
        if len(tube_bytes) < namelen or len(rec_bytes) < rec_struct.size:
            yield _cut_record(start, data)
            return
        pos += namelen + rec_struct.size
        jobrec = _jobrec(rec_struct.unpack(rec_bytes), version)
        if jobrec.id == 0:
            yield End(start, False, None)        # the preallocated zero tail
            return
        tube = _tube_name(tube_bytes) if namelen else None
        if tube is None or jobrec.state == INVALID:
            yield Record(start, tube, jobrec, None)   # readrec reads no body for these
            continue
        if jobrec.state not in (READY, RESERVED, BURIED, DELAYED):
            yield Record(start, tube, jobrec, None)
            yield End(start, True, f"job {jobrec.id} has unknown state {jobrec.state}")
            return
        body = data[pos:pos + jobrec.body_size] if jobrec.body_size >= 0 else b""
        if jobrec.body_size < 0 or len(body) < jobrec.body_size:
            yield Record(start, tube, jobrec, None)
            yield End(start, True, f"file ends inside the body of job {jobrec.id}")
            return
        pos += jobrec.body_size
        yield Record(start, tube, jobrec, body)


def _cut_record(start: int, data: bytes) -> End:
    rest = data[start:]
    if not rest.strip(b"\0"):
        # beanstalkd warns "unexpected EOF" here, but a zero tail shorter than a record
        # holds nothing: its reservations are kept in whole delete records (walg.c)
        return End(start, False, f"zero tail of {len(rest)} bytes is shorter than a record")
    return End(start, True, f"record cut short: {len(rest)} bytes left")


def _jobrec(fields: tuple, version: int) -> Jobrec:
    if version == WALVER:
        return Jobrec(*fields)
    (id_, pri, delay, ttr, size, created, deadline, *counts_and_state) = fields
    return Jobrec(id_, pri, delay * 1000, ttr * 1000, size, created * 1000, deadline * 1000,
                  *counts_and_state)


def _tube_name(raw: bytes) -> str:
    # the C string ends at the first NUL; names are ASCII, latin-1 keeps any byte
    return raw.split(b"\0", 1)[0].decode("latin-1")


# -- records to jobs (pure) -----------------------------------------------------------


class _Live(NamedTuple):
    tube: str
    jobrec: Jobrec
    body: bytes


class Replay:
    """beanstalkd's replay list, fed one record at a time (readrec's switch)."""

    def __init__(self, max_job_size: int = 65535) -> None:
        self.max_job_size = max_job_size
        self.jobs: dict[int, _Live] = {}    # insertion order == beanstalkd's list order
        self.next_id = 1
        self.errors = False
        self.warnings: list[str] = []

    def apply(self, record: Record, where: str = "") -> bool:
        """Apply one record; False means stop reading this file (an error)."""
        jr = record.jobrec
        known = self.jobs.get(jr.id)
        if known is None and record.tube is None:
            return True                     # its full record was compacted away
        if jr.state == INVALID:
            self.jobs.pop(jr.id, None)
            return True
        if jr.state == RESERVED:
            jr = jr._replace(state=READY)   # reservations are never durable
        if jr.state not in LIVE_STATES:
            return self._fail(jr.id, f"{where}job {jr.id} has unknown state {jr.state}")
        if known is None:
            if jr.body_size & 0xFFFFFFFFFFFFFFFF > self.max_job_size:   # (size_t) cast
                return self._fail(None, f"{where}job {jr.id} is too big "
                                        f"({jr.body_size} > {self.max_job_size})")
            self.next_id = max(self.next_id, jr.id + 1)
            known = _Live(record.tube, jr, b"")
        if record.tube is not None and record.body is None:
            return self._fail(jr.id, f"{where}file ends inside the body of job {jr.id}")
        if record.tube is None and jr.body_size != known.jobrec.body_size:
            # an update replaces the whole Jobrec, body_size included: beanstalkd then
            # announces body_size - 2 bytes of the body it holds (past it: stray memory)
            self.warnings.append(f"{where}job {jr.id}: an update changes body_size from "
                                 f"{known.jobrec.body_size} to {jr.body_size}")
        body = known.body if record.tube is None else record.body
        self.jobs[jr.id] = _Live(known.tube, jr, body)
        return True

    def end(self, end: End, where: str = "") -> None:
        if end.warning is not None:
            self.warnings.append(f"{where}{end.warning}")
        self.errors |= end.error

    def _fail(self, job_id: int | None, warning: str) -> bool:
        self.errors = True
        self.warnings.append(warning)
        if job_id is not None:
            self.jobs.pop(job_id, None)
        return False

    def result(self, files: list[str]) -> BeanstalkdBinlog:
        """prot_replay: re-queue the list in order."""
        jobs = [_recovered(live) for live in self.jobs.values()]
        buried = [job.id for job in jobs if job.state == "buried"]
        warnings = list(self.warnings)
        if self.errors:
            warnings.append("errors reading one or more binlog files: "
                            "beanstalkd would continue, but data may be missing")
        return BeanstalkdBinlog(sorted(jobs), self.next_id, files, warnings, buried)


def _recovered(live: _Live) -> BeanstalkdJob:
    jr = live.jobrec
    state = LIVE_STATES[jr.state]
    bury_ct = jr.bury_ct + (state == "buried")      # bury_job() counts the re-bury
    deadline = jr.deadline_ns / NS_PER_S if state == "delayed" else 0.0
    body = live.body[:max(jr.body_size - 2, 0)]    # what `peek` announces: no CRLF
    return BeanstalkdJob(jr.id, live.tube, jr.pri, jr.delay_ns // NS_PER_S,
                         jr.ttr_ns // NS_PER_S, jr.created_ns / NS_PER_S, state, deadline,
                         (jr.reserve_ct, jr.timeout_ct, jr.release_ct, bury_ct, jr.kick_ct),
                         body)


# -- the directory (thin IO) ----------------------------------------------------------

# walscandir: "binlog." then what strtol reads as a whole number
_BINLOG_NAME = re.compile(r"binlog\.([ \t\n\v\f\r]*[+-]?[0-9]+)")


def binlog_numbers(path: str | os.PathLike) -> list[int]:
    """The N of every binlog.N in the directory, sorted."""
    numbers = {int(m.group(1)) for name in os.listdir(path)
               if (m := _BINLOG_NAME.fullmatch(name))}
    return sorted(numbers)


def is_beanstalkd_dir(path: str | os.PathLike) -> bool:
    """Whether `path` is a directory holding beanstalkd binlog.N files."""
    try:
        return bool(binlog_numbers(path))
    except OSError:
        return False


def read_beanstalkd_binlog(path: str | os.PathLike,
                           max_job_size: int = 65535) -> BeanstalkdBinlog:
    """Replay a beanstalkd binlog directory as `beanstalkd -b path -z max_job_size` would.

    Raises BinlogFormatError when path is not a readable directory, or when the oldest
    binlog file has a version beanstalkd does not know (another program's files, or a
    binlog written on another architecture).  Everything else becomes a warning.
    """
    if not os.path.isdir(path):
        raise BinlogFormatError(f"{path}: not a directory")
    try:
        numbers = binlog_numbers(path)
    except OSError as error:
        raise BinlogFormatError(f"{path}: {error}") from error
    replay, files = Replay(max_job_size), []
    for before, n in zip([None, *numbers], numbers):
        if before is not None and n - before > 1:   # walread tries each number in between
            replay.warnings.append(f"binlog.{before + 1} to binlog.{n - 1} are missing")
        name = f"binlog.{n}"
        try:
            data = Path(path, name).read_bytes()
        except OSError as error:
            replay.warnings.append(f"{name}: {error.strerror or error}")
            continue
        _read_file(replay, name, data, oldest=not files)
        files.append(name)
    if not numbers:
        replay.warnings.append(f"{path}: no binlog.N files")
    return replay.result(files)


def _read_file(replay: Replay, name: str, data: bytes, oldest: bool) -> None:
    version = read_version(data)
    if version is None:
        replay.end(End(0, True, f"file too short for a version ({len(data)} bytes)"), f"{name}: ")
        return
    if version not in NAMELEN:
        if oldest:
            raise BinlogFormatError(f"{name}: unknown version {version} "
                                    f"(beanstalkd writes {WALVER}, reads {WALVER} and {WALVER5})")
        replay.end(End(0, True, f"unknown version: {version}"), f"{name}: ")
        return
    for item in parse_records(data, version):
        if isinstance(item, End):
            replay.end(item, f"{name}:{item.offset}: ")
        elif not replay.apply(item, f"{name}:{item.offset}: "):
            return
