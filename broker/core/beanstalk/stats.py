"""The `stats`, `stats-job` and `stats-tube` records, keys spelled and ordered as beanstalkd
emits them (prot.c's STATS_FMT, STATS_JOB_FMT and STATS_TUBE_FMT: the emitted order, not
protocol.txt's).

Records are ordered lists of (key, value) pairs with plain values (int, float seconds,
bool, str); the front that serves a protocol decides how to print them (beanstalk: YAML
with 1.13 quoting).  Process facts (pid, rusage, uname) come from a `SysInfo` the actor
passes in, which keeps the core free of I/O.
"""
from __future__ import annotations

from typing import NamedTuple

from .jobs import COUNTERS, DELAYED, RESERVED, Job, Tube

CMD_KEYS = (
    "cmd-put", "cmd-peek", "cmd-peek-ready", "cmd-peek-delayed", "cmd-peek-buried",
    "cmd-reserve", "cmd-reserve-with-timeout", "cmd-delete", "cmd-release", "cmd-use",
    "cmd-watch", "cmd-ignore", "cmd-bury", "cmd-kick", "cmd-touch", "cmd-stats",
    "cmd-stats-job", "cmd-stats-tube", "cmd-list-tubes", "cmd-list-tube-used",
    "cmd-list-tubes-watched", "cmd-pause-tube",
)
#: counted by beanstalkd but never reported
HIDDEN_KEYS = ("cmd-reserve-job", "cmd-kick-job")


class SysInfo(NamedTuple):
    pid: int
    utime_s: float
    stime_s: float
    hostname: str
    os: str
    platform: str


def no_sysinfo() -> SysInfo:
    return SysInfo(0, 0.0, 0.0, "", "", "")




def new_counters() -> dict[str, int]:
    return dict.fromkeys(CMD_KEYS + HIDDEN_KEYS, 0)


def server_stats(b, now: float) -> list[tuple[str, object]]:
    """beanstalkd's 51 `stats` keys for the beanstalk component `b` (commands.py), and
    the journal's own after them (journal_stats)."""
    tubes = b.queue.tubes.values()
    sessions = b.sessions
    me = b.identity
    si = me.sysinfo()
    pairs = [
        ("current-jobs-urgent", sum(t.urgent for t in tubes)),
        ("current-jobs-ready", sum(len(t.ready) for t in tubes)),
        ("current-jobs-reserved", sum(t.reserved for t in tubes)),
        ("current-jobs-delayed", sum(len(t.delayed) for t in tubes)),
        ("current-jobs-buried", sum(len(t.buried) for t in tubes)),
    ]
    pairs += [(k, b.counters[k]) for k in CMD_KEYS]
    pairs += [
        ("job-timeouts", b.queue.job_timeouts),
        ("total-jobs", b.total_jobs),
        ("max-job-size", me.max_job_size),
        ("current-tubes", len(b.queue.tubes)),
        ("current-connections", len(sessions)),
        ("current-producers", sum(1 for s in sessions if s.producer)),
        ("current-workers", sum(1 for s in sessions if s.worker)),
        ("current-waiting", b.queue.waiting_count),
        ("total-connections", b.total_connections),
        ("pid", si.pid),
        ("version", me.version),
        ("rusage-utime", si.utime_s),
        ("rusage-stime", si.stime_s),
        ("uptime", int(now - me.started)),
        *binlog_stats(b.journal),
        ("draining", b.admission.draining),
        ("id", f"{me.broker_id:016x}"),
        ("hostname", si.hostname),
        ("os", si.os),
        ("platform", si.platform),
    ]
    return pairs + journal_stats(b.journal)


def binlog_stats(journal) -> list[tuple[str, object]]:
    """beanstalkd's binlog-* fields, as the journal counts them (journal.JournalStats)."""
    j = journal.stats()
    return [("binlog-oldest-index", j.oldest_index), ("binlog-current-index", j.current_index),
            ("binlog-records-migrated", j.records_migrated),
            ("binlog-records-written", j.records_written), ("binlog-max-size", j.max_size)]


def journal_stats(journal) -> list[tuple[str, object]]:
    """zstalk's own keys after beanstalkd's, with a replicated journal only (docs/ha.md):
    this instance's role, the lease's epoch, the stream's last acknowledged sequence."""
    j = journal.stats()
    if not j.role:
        return []
    return [("journal-role", j.role), ("journal-epoch", j.epoch), ("journal-seq", j.seq)]


def seconds_left(deadline: float, now: float) -> int:
    """Whole seconds until `deadline` as beanstalkd prints them, in its integer nanoseconds:
    its clock has always moved on since the deadline was set, so a whole number reads one
    less (a pipelined `reserve` + `stats-job` answered in one turn shows ttr - 1, as
    beanstalkd).  Rounded to nanoseconds first: `now + 10 - now` in floats may come out a
    hair above 10 (1 time in ~1,000 at an uptime of an hour), which read as 10."""
    return max(0, (round((deadline - now) * 1e9) - 1) // 1_000_000_000)


def job_stats(job: Job, now: float) -> list[tuple[str, object]]:
    time_left = 0
    if job.state in (RESERVED, DELAYED):
        time_left = seconds_left(job.deadline, now)
    return [
        ("id", job.id), ("tube", job.tube.name), ("state", job.state), ("pri", job.pri),
        ("age", int(now - job.created)), ("delay", job.delay_s), ("ttr", job.ttr_s),
        ("time-left", time_left), ("file", job.file),
    ] + [(name, job.count(i)) for i, name in enumerate(COUNTERS)]


def tube_stats(t: Tube, now: float) -> list[tuple[str, object]]:
    paused_left = seconds_left(t.unpause_at, now) if t.unpause_at else 0
    return [
        ("name", t.name),
        ("current-jobs-urgent", t.urgent),
        ("current-jobs-ready", len(t.ready)),
        ("current-jobs-reserved", t.reserved),
        ("current-jobs-delayed", len(t.delayed)),
        ("current-jobs-buried", len(t.buried)),
        ("total-jobs", t.total_jobs),
        ("current-using", t.using),
        ("current-watching", t.watching),
        ("current-waiting", len(t.waiting)),
        ("cmd-delete", t.cmd_delete),
        ("cmd-pause-tube", t.cmd_pause_tube),
        ("pause", t.pause_s),
        ("pause-time-left", paused_left),
    ]


__all__ = ["server_stats", "job_stats", "tube_stats", "SysInfo"]
