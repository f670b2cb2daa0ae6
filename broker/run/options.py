"""What `zstalk serve` and `zstalkd` were asked for, whichever way they place the actors.

One process (broker/run/serve.py) builds the broker from these fields directly; the
supervisor (`--fronts N`, broker/run/supervisor.py) passes the same fields on to its
`zstalk broker` child as arguments (`broker_args`), and to its HTTP front child its
limits and TLS files as arguments (`http_args`) and the master key in the environment
(MASTER_KEY_ENV, or the name of its file as MASTER_KEY_FILE_ENV).  Nothing heavy is imported here.
"""
import os
from typing import NamedTuple

from ...protocol.network.listen import HealthOptions, HttpLimits, describe_listen

MASTER_KEY_ENV = "ZSTALK_MASTER_KEY"    # --master-key from the environment (out of `ps`)
MASTER_KEY_FILE_ENV = "ZSTALK_MASTER_KEY_FILE"   # --master-key-file (a mounted Secret)


class ServeOptions(NamedTuple):
    fronts: int = 0                     # 0: fronts in the broker's process; N: N front processes
    max_job_size: int = 65535
    max_jobs_bytes: int = 0
    max_connections: int = 0
    counter_max_connections: int = 0
    verbose: int = 0
    stat_interval: int = 86400
    worker_bind: str | None = None      # the ZeroMQ endpoint for native workers, if any
    binlog_dir: str | None = None
    fsync_ms: int = 50
    no_fsync: bool = False
    binlog_size: int = 10485760
    broker_bind: str | None = None      # supervised: where the broker child listens
    announce: bool = True               # say on stderr what listens where (zstalkd: with -V)
    role: str = "serve"                  # who says it (logs.start_line): serve, or zstalkd
    functions: object = None            # cloud tasks: config_file.TaskConfig, if configured
    config_path: str | None = None      # its file, read again on SIGHUP
    http_listeners: tuple = ()          # the HTTP front's bound sockets
    master_key: str | None = None       # required by the HTTP front to enqueue and cancel
    master_key_file: str | None = None  # where master_key was read from, if from a file
    http_limits: HttpLimits = HttpLimits()
    tls_files: tuple[str, str] | None = None    # the HTTP front's --tls-cert and --tls-key
    health: HealthOptions = HealthOptions()     # --health-port ..., --metrics-...
    journal: object = None              # --journal: wal/stream.py's Options (NATS JetStream)

    def broker_args(self) -> list[str]:
        """These options as `zstalk broker` arguments (the supervisor's child)."""
        args = ["--stat-interval", str(self.stat_interval)]
        if self.config_path:
            args += ["--config", os.path.abspath(self.config_path)]
        if self.worker_bind:
            args += ["--also-bind", self.worker_bind]
        if self.binlog_dir:
            args += ["--binlog", os.path.abspath(self.binlog_dir), "--fsync-ms",
                     str(self.fsync_ms), "--binlog-size", str(self.binlog_size),
                     *(["--no-fsync"] if self.no_fsync else [])]
        if self.journal is not None:
            from .journal_flags import journal_args
            args += journal_args(self.journal)
        return args

    def http_args(self) -> list[str]:
        """The HTTP front's limits and TLS files as `zstalk front http` arguments (the
        supervisor's child; the files by name, not their contents)."""
        limits = self.http_limits
        args = ["--header-timeout", str(limits.header_timeout_s),
                "--body-timeout", str(limits.body_timeout_s),
                "--max-connections", str(limits.max_connections),
                "--max-streams", str(limits.max_streams)]
        if self.tls_files:
            cert, key = map(os.path.abspath, self.tls_files)
            args += ["--tls-cert", cert, "--tls-key", key]
        return args

    def http_tls(self):
        """The HTTP front's ssl.SSLContext, or None (the CLI has checked the files)."""
        if not self.tls_files:
            return None
        from ...protocol.network.listen import tls_context
        return tls_context(*self.tls_files)

    def binlog(self):
        """The binlog's Options, or the journal's (--journal), or None (imports the binlog
        only when there is one)."""
        if self.journal is not None:
            return self.journal
        if not self.binlog_dir:
            return None
        from ..wal.binlog import Options
        return Options(self.binlog_dir, self.binlog_size, None if self.no_fsync else self.fsync_ms)


def no_endpoint(spec: str | None) -> bool:
    """`--worker-bind none` (or empty) turns the worker endpoint off."""
    return spec is None or spec.strip().lower() in ("", "none")


def worker_endpoint(spec: str | None) -> str | None:
    """The ZeroMQ endpoint `--worker-bind` names: None for 'none', and HOST:PORT taken as
    tcp://HOST:PORT, the way every other address flag is written."""
    if no_endpoint(spec):
        return None
    spec = spec.strip()
    return spec if "://" in spec else f"tcp://{spec}"


def where(sock) -> str:
    """A listening socket's address as a user would type it (HOST:PORT or unix:/path)."""
    addr = sock.getsockname()
    if isinstance(addr, str):
        return f"unix:{addr}"
    host, port = addr[0], addr[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def announcement(listeners, counter_listeners, worker_endpoint: str | None,
                 http_listeners=(), master_key: str | None = None, tls: bool = False,
                 functions: bool = True, health: str = "", binlog: str = "",
                 http_limits: HttpLimits = HttpLimits(), checks: str = "") -> str:
    """What `zstalk serve` says it listens on, once everything listens (logs.start_line);
    `health`, `binlog` and `checks`: health_said's, binlog_said's and checks_said's parts,
    if any; with the HTTP API, how many event streams fit (its open-files limit raised:
    network/files.py)."""
    parts = ["beanstalk on " + ", ".join(where(s) for s in listeners)]
    if counter_listeners:
        parts.append("counters on " + ", ".join(where(s) for s in counter_listeners))
    if http_listeners:
        parts.append(("https on " if tls else "http on ")
                     + ", ".join(where(s) for s in http_listeners)
                     + _http_notes(master_key, functions))
        parts.append(dashboard_at(http_listeners[0], tls))
        from ...protocol.network.files import stream_capacity
        said = stream_capacity(http_limits.max_streams, http_limits.max_connections)[1]
        parts += [said] if said else []
    parts.append(f"workers on {worker_endpoint}" if worker_endpoint else "no worker endpoint")
    return "; ".join(parts + [p for p in (health, binlog, checks) if p])


def checks_said(upstreams) -> str:
    """A start line's part for the upstreams' active health checks ('' with none): how
    many servers, the bound on probes a second and any stretch (core/upstreams/health.py)."""
    if not any(spec.health_check is not None for spec in upstreams):
        return ""
    from ..core.upstreams.health import describe
    return describe(upstreams)


def health_said(health: HealthOptions, children: dict[str, int] | None = None) -> str:
    """A start line's part for --health-port ('' without one); `children`: a supervisor's
    children's own health ports on loopback (broker/run/probes.py), by child."""
    if not health.port:
        return ""
    said = f"health on {describe_listen(health.host, health.port)}"
    if children:
        said += " (children's on 127.0.0.1: " + ", ".join(
            f"{name} {port}" for name, port in children.items()) + ")"
    return said


def journal_said(journal, restored, sync: str = "") -> str:
    """A start line's part: the journal, what it restored, its sync check and timeout."""
    if journal is None:
        return ""
    said = f"journal {','.join(journal.urls)} stream {journal.stream}"
    if restored is not None:
        jobs, tasks, schedules = restored
        said += f" (restored {jobs:,} jobs, {tasks:,} tasks" + (
            f", {schedules:,} schedules)" if schedules else ")")
    said += f"; {sync}" if sync else ""
    if getattr(journal, "epoch", 0):
        stall = getattr(journal, "stall_s", 0)
        let_go = f"let go after a {stall:g} s loop stall" if stall else \
            "kept through any loop stall"
        said += f"; leads under epoch {journal.epoch} (lease {journal.lease_s:g} s, {let_go})"
    return said + f"; replies wait for NATS, exit after {journal.timeout_s:g} s without it"


def binlog_said(directory: str | None, restored: tuple[int, int, int] | None) -> str:
    """A start line's part for the binlog ('' without one), with what its replay brought
    back: 'binlog /var/lib/zstalk (restored 12 jobs, 3 tasks)' (and schedules, if any)."""
    if not directory:
        return ""
    if restored is None:
        return f"binlog {directory}"
    jobs, tasks, schedules = restored
    counts = [_count(jobs, "job"), _count(tasks, "task")] + (
        [_count(schedules, "schedule")] if schedules else [])
    return f"binlog {directory} (restored {', '.join(counts)})"


def _count(n: int, what: str) -> str:
    return f"{n:,} {what}{'' if n == 1 else 's'}"


def dashboard_at(listener, tls: bool) -> str:
    """Where the web dashboard is (protocol/fronts/http/ui.py): on the first HTTP socket,
    as a browser on this host opens it (a socket on every address: its loopback one)."""
    at = where(listener)
    if at.startswith("0.0.0.0:"):
        at = "127.0.0.1:" + at.partition(":")[2]
    elif at.startswith("[::]:"):
        at = "[::1]:" + at.rpartition(":")[2]
    return f"dashboard at {'https' if tls else 'http'}://{at}/ui/"


def _http_notes(master_key: str | None, functions: bool) -> str:
    notes = ([] if master_key else ["no --master-key: loopback only"]) + (
        [] if functions else ["no --config: no functions, every task answers 404"])
    return f" ({'; '.join(notes)})" if notes else ""

