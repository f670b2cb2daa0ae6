"""The `zstalk` command: one click group, each subcommand builds one actor and runs it.

    zstalk serve [-l ADDR] [-p PORT] [--fronts N]    broker + fronts, supervised
                 [--counter-port PORT] [--counter-listen ADDR] [--counter-max-connections N]
    zstalk serve [--worker-bind tcp://HOST:PORT]     ... and the endpoint native workers use
    zstalk broker --bind tcp://HOST:PORT             the broker actor alone
    zstalk import-binlog DIR [--into DIR]            a beanstalkd binlog into a zstalk one
    zstalk journal status --journal nats://H:P       leader, epoch, sequence, standbys' lag
    zstalk front beanstalk --broker EP --listen ADDR one beanstalk front
    zstalk front counter --broker EP --listen ADDR   one yrmcds counter front
    zstalk front http --broker EP --listen ADDR      the HTTP cloud-task API
                 [--tls-cert FILE --tls-key FILE] [--max-connections N] ...
    zstalk dispatcher --broker EP                    makes the cloud tasks' calls
    zstalk worker MODULE:WORKER [--processes N]      a native worker pool (zstalk.workers)
    zstalk tasks | functions | schedules ...         an operator's commands over the HTTP
                                                     API (ops/operator.py, loaded when run)
    zstalk stats [--beanstalk H:P] [--counter H:P]   tubes and counters (ops/stats.py)
    zstalk top [--url URL | --beanstalk H:P]         the same, live in the terminal (ops/top.py)

`--broker EP` (ZSTALK_BROKER) may list a journal's instances, `EP,EP,…`: the link goes to
whichever leads (protocol/links/zeromq.py).

Heavy imports (zmq, asyncio) happen inside the subcommands, so `serve` binds its port
before any of them are loaded.
"""
from __future__ import annotations

import functools
import logging
import os
import sys

import click

from ...protocol.network.listen import (HealthOptions, HttpLimits, bind_listen, describe_listen,
                                        parse_listen)
from .. import VERSION
from . import hold_signals
from .journal_flags import journal_options
from .logs import FORMAT_ENV, FORMATS, setup_logging, start_line
from .options import (MASTER_KEY_ENV, MASTER_KEY_FILE_ENV, ServeOptions, binlog_said,
                      checks_said, dashboard_at, health_said, journal_said, where,
                      worker_endpoint)
from .ports import PORT, Endpoint, Endpoints, ListenAddress

MAX_JOB_SIZE_CAP = 1073741824   # beanstalkd's -z cap (1 GiB)
COUNTER_PORT = 11215            # yrmcds' default counter.port
HTTP_PORT = 8080                # the HTTP task API's default port
WORKER_ENDPOINT = "tcp://127.0.0.1:11400"   # where `zstalk worker` looks by default
def hold_default(ctx, param, value):
    """--hold-s: 5 s for one broker; 15 s for a journal's instances, whose failover takes
    up to ~12 s when NATS elects a leader too (docs/ha.md)."""
    if value is not None:
        return value
    return 15.0 if "," in (ctx.params.get("broker_ep") or "") else 5.0


BROKER_HELP = ("The broker's endpoint, or the endpoints of a journal's instances, comma-"
               "separated: the link goes to whichever leads (docs/ha.md).")
BINLOG_EXIT = 10                # beanstalkd's exit code for a wal dir it cannot lock


def binlog_options(f):
    """--binlog/--fsync-ms/--no-fsync/--binlog-size, shared by `serve` and `broker`."""
    for opt in reversed([
        click.option("-b", "--binlog", "binlog_dir", default=None, metavar="DIR",
                     help="Write-ahead log directory: jobs survive restarts and crashes."),
        click.option("-f", "--fsync-ms", default=50, show_default=True, type=click.IntRange(min=0),
                     help="fsync the binlog at most every N ms; 0: reply only once on disk."),
        click.option("-F", "--no-fsync", is_flag=True, help="Never fsync the binlog."),
        click.option("-s", "--binlog-size", default=10485760, show_default=True,
                     type=click.IntRange(min=1), help="Binlog segment size in bytes."),
    ]):
        f = opt(f)
    return f


def health_options(f):
    """--health-port/--health-listen/--health-stall-s and the metrics' --metrics-token-file
    and --metrics-top, given to the command as one `health` argument (a
    listen.HealthOptions; the probes and /metrics are protocol/network/health.py)."""
    @functools.wraps(f)
    def command(*args, health_port, health_listen, health_stall_s, metrics_token_file,
                metrics_top, **kwargs):
        token = None
        if metrics_token_file:
            if not health_port:
                raise click.UsageError("--metrics-token-file protects /metrics on the health "
                                       "port: it needs --health-port")
            token = read_token(metrics_token_file)
        return f(*args, health=HealthOptions(health_port, health_listen, health_stall_s,
                                             token, metrics_top, metrics_token_file), **kwargs)

    for opt in reversed([
        click.option("--health-port", default=0, show_default=True, type=PORT,
                     help="Serve GET /healthz, /readyz and /metrics (plain HTTP) on this "
                          "port; 0: none."),
        click.option("--health-listen", default="0.0.0.0", show_default=True,
                     help="Address of the health port."),
        click.option("--health-stall-s", default=60.0, show_default=True,
                     type=click.FloatRange(min=0, min_open=True),
                     help="/healthz fails once the event loop has not turned for this long."),
        click.option("--metrics-token-file", default=None, metavar="FILE",
                     envvar="ZSTALK_METRICS_TOKEN_FILE",
                     help="/metrics then needs 'Authorization: Bearer <the file's token>' "
                          "(tube and function names are chosen by clients)."),
        click.option("--metrics-top", default=100, show_default=True,
                     type=click.IntRange(min=1),
                     help="Label at most this many of the most active tubes (and as many "
                          "functions) in /metrics; the rest count as \"_other\"."),
    ]):
        command = opt(command)
    return command


def with_health(text: str, health: HealthOptions) -> str:
    """A role's start line: `text`, and its health port when it has one (every port a
    role listens on is said)."""
    said = health_said(health)
    return f"{text}; {said}" if said else text


def read_token(path: str) -> str:
    """--metrics-token-file's token (a usage error, naming the file, if it cannot be read)."""
    from ...protocol.network.secret import SecretError, read_secret_file
    try:
        return read_secret_file(path, "--metrics-token-file").decode("latin-1")
    except SecretError as exc:
        raise click.UsageError(str(exc)) from None


def http_options(prefix: str):
    """--tls-cert/--tls-key and the HTTP front's limits, shared by `serve` (the limits
    named --http-..., as its other fronts' are named by front) and `front http`."""
    limits = HttpLimits()
    seconds = click.FloatRange(min=0, min_open=True)

    def decorate(f):
        for opt in reversed([
            click.option("--tls-cert", metavar="FILE", default=None,
                         help="Serve the HTTP API over TLS: this certificate chain (PEM, "
                              "the server's certificate first), with --tls-key."),
            click.option("--tls-key", metavar="FILE", default=None,
                         help="The certificate's private key (PEM, unencrypted)."),
            click.option(f"--{prefix}header-timeout", "header_timeout", type=seconds,
                         default=limits.header_timeout_s, show_default=True,
                         help="Seconds a request's headers may take, from connecting or "
                              "the previous response (an idle connection closes then too)."),
            click.option(f"--{prefix}body-timeout", "body_timeout", type=seconds,
                         default=limits.body_timeout_s, show_default=True,
                         help="Seconds a request's body may take; past it 408."),
            click.option(f"--{prefix}max-connections", "http_max_connections",
                         type=click.IntRange(min=0), default=limits.max_connections,
                         show_default=True,
                         help="HTTP connections; beyond it accepted, then closed (0: no limit). "
                              "Event streams are apart."),
            click.option(f"--{prefix}max-streams", "http_max_streams",
                         type=click.IntRange(min=0), default=limits.max_streams,
                         show_default=True,
                         help="Event streams (GET /v1/tasks/{id}/events) open at once; beyond "
                              "it 503 (0: as many as the open files allow)."),
        ]):
            f = opt(f)
        return f
    return decorate


def http_settings(tls_cert: str | None, tls_key: str | None, header_timeout: float,
                  body_timeout: float, max_connections: int, max_streams: int):
    """The HTTP front's (HttpLimits, ssl.SSLContext or None) from http_options; TLS needs
    both files (a usage error names the missing one), and a file that cannot be used
    ends the command with exit 2, naming it."""
    if bool(tls_cert) != bool(tls_key):
        missing = "--tls-key" if tls_cert else "--tls-cert"
        raise click.UsageError(f"{missing} is missing: give --tls-cert and --tls-key together")
    tls = None
    if tls_cert:
        from ...protocol.network.listen import TlsError, tls_context
        try:
            tls = tls_context(tls_cert, tls_key)
        except TlsError as exc:
            click.echo(f"zstalk: {exc}", err=True)
            sys.exit(2)
    return HttpLimits(header_timeout, body_timeout, max_connections, max_streams), tls


PASS_KEY_FILE_ENV = "ZSTALK_PASS_KEY_FILE"


def key_file_option(option: str, env: str, check, help_text: str):
    """An option naming a file of keys that `check(path)` reads (raising OSError,
    ValueError or SecretError: exit 2, naming it): checked as the option is parsed, then
    named to the HTTP front (and any process serve starts) by the environment `env`."""
    def use(ctx, param, value):
        if value:
            from ...protocol.network.secret import SecretError
            try:
                check(value)
            except (OSError, ValueError, SecretError) as exc:
                raise click.BadParameter(f"{value}: {exc}") from None
            os.environ[env] = os.path.abspath(value)
        return value
    return click.option(option, metavar="FILE", default=None, envvar=env, expose_value=False,
                        callback=use, help=help_text)


def _pass_keys(path: str) -> None:
    """The waiting room's pass keys (protocol/fronts/http/room.py)."""
    from ...workers.signing import as_pass_keys
    as_pass_keys(path)


def _viewer_key(path: str) -> None:
    """The dashboard's read-only key (protocol/fronts/http/access.py): not empty."""
    from ...protocol.network.secret import read_secret_file
    read_secret_file(path, f"--viewer-key-file ({VIEWER_KEY_FILE_ENV})")


VIEWER_KEY_FILE_ENV = "ZSTALK_VIEWER_KEY_FILE"     # (protocol/fronts/http/access.py reads it)
pass_key_option = key_file_option(
    "--pass-key-file", PASS_KEY_FILE_ENV, _pass_keys,
    "The waiting room's pass keys, 'kid:key' lines (the first signs, all verify; "
    "read again when the file changes). A --config with `online` set needs it.")
viewer_key_option = key_file_option(
    "--viewer-key-file", VIEWER_KEY_FILE_ENV, _viewer_key,
    "A read-only key for the dashboard and the API's views: counts, never job bodies, "
    "no actions (needs a master key).")


def master_key_options(help_key: str):
    """--master-key (ZSTALK_MASTER_KEY) and --master-key-file (ZSTALK_MASTER_KEY_FILE),
    shared by `serve` and `front http`; `master_key_from` reads them."""
    def decorate(f):
        f = click.option("--master-key-file", metavar="FILE", default=None,
                         envvar=MASTER_KEY_FILE_ENV,
                         help="Read the master key from this file (less one trailing "
                              "newline), e.g. a mounted Secret.")(f)
        return click.option("--master-key", default=None, envvar=MASTER_KEY_ENV,
                            help=help_key)(f)
    return decorate


def master_key_from(value: str | None, path: str | None) -> str | None:
    """The master key given, or read from its file; both is a usage error, and a file
    that is empty, unreadable or not UTF-8 ends the command with exit 2, naming it."""
    from ...protocol.network.secret import SecretError, read_secret_file
    if value and path:
        raise click.UsageError(f"give --master-key ({MASTER_KEY_ENV}) or --master-key-file "
                               f"({MASTER_KEY_FILE_ENV}), not both")
    if not path:
        return value or None
    name = f"--master-key-file ({MASTER_KEY_FILE_ENV})"
    try:
        return read_secret_file(path, name).decode("utf-8")
    except UnicodeDecodeError:
        click.echo(f"zstalk: {name} names {path}, which is not UTF-8 text", err=True)
    except SecretError as exc:
        click.echo(f"zstalk: {exc}", err=True)
    sys.exit(2)


def viewer_needs_master(master_key: str | None) -> None:
    """A viewer key without a master key is a usage error: the dashboard's cookies are
    signed with a key derived from the master key, and without one everything is open."""
    if os.environ.get(VIEWER_KEY_FILE_ENV) and not master_key:
        raise click.UsageError("--viewer-key-file needs a master key (--master-key or "
                               "--master-key-file)")


def exit_with_parent() -> None:
    """A supervised child whose supervisor is already gone exits (the prctl races start-up)."""
    parent = os.environ.get("ZSTALK_SUPERVISOR_PID")
    if parent and os.getppid() != int(parent):
        sys.exit(0)


def bind_or_exit(spec: str, port: int, listen: bool = True, what: str = ""):
    """A listening socket, or exit 111 naming the address and the port, and `what` they
    are for ("beanstalk (-l, -p)"), so a port in use says which flag to change."""
    try:
        return bind_listen(spec, port, listen)
    except OSError as exc:
        click.echo(f"zstalk: bind {describe_listen(spec, port)}"
                   f"{f' for {what}' if what else ''}: {exc.strerror}", err=True)
        sys.exit(111)       # beanstalkd's exit code for a socket it cannot bind


def front_sockets(fds: tuple[int, ...], listens: tuple[str, ...], default_port: int,
                  default: list[str] = ()) -> list:
    """A front's listening sockets: inherited (--fd, from the supervisor) and
    bound here (--listen, else `default`)."""
    import socket
    sockets = [socket.socket(fileno=fd) for fd in fds]
    sockets += [bind_or_exit(spec, default_port) for spec in listens or ([] if fds else default)]
    if not sockets:
        raise click.UsageError("give --listen or --fd")
    return sockets


def counter_host(addr: str) -> str:
    """The -l host without a port, for the counter front (a unix -l keeps it on loopback)."""
    kind, host, _ = parse_listen(addr, 0)
    if kind == "unix":
        return "127.0.0.1"
    return f"[{host}]" if host and ":" in host else host or ""


#: commands in modules of their own, loaded only when one runs (never on serve's start
#: path): name -> (module of this package, its click command); the operator's are in ops/
LAZY = {"tasks": ("ops.operator", "tasks_group"),
        "functions": ("ops.operator", "functions_group"),
        "schedules": ("ops.operator", "schedules_group"),
        "stats": ("ops.stats", "stats_command"), "top": ("ops.top", "top_command")}


class _Main(click.Group):
    """Keys that cannot be used, or a non-local endpoint without them, end any command
    with the reason and exit status 2 (protocol/network/curve.py).  The LAZY commands are
    found by name and imported then."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *LAZY])

    def get_command(self, ctx: click.Context, name: str):
        if name in LAZY:
            import importlib
            module, attr = LAZY[name]
            return getattr(importlib.import_module(f"{__package__}.{module}"), attr)
        return super().get_command(ctx, name)

    def invoke(self, ctx: click.Context):
        from ...protocol.network.curve import CurveError
        try:
            return super().invoke(ctx)
        except CurveError as exc:
            click.echo(f"zstalk: {exc}", err=True)
            sys.exit(2)


def log_format_option(f):
    """--log-format text|json ($ZSTALK_LOG_FORMAT), on every role: the root logger is set
    up again in it as the option is parsed, before the role says or logs anything."""
    def configure(ctx, param, value):
        setup_logging(ctx.find_root().obj or 0, value)
        return value
    return click.option("--log-format", type=click.Choice(FORMATS, case_sensitive=False),
                        default="text", show_default=True, envvar=FORMAT_ENV, show_envvar=True,
                        expose_value=False, is_eager=True, callback=configure,
                        help="stderr as text lines, or one JSON object a line (ts, level, "
                             "logger, msg, pid and the record's fields).")(f)


def insecure_option(f):
    """--insecure: allow a non-local ZeroMQ endpoint without CURVE keys, a waiting room
    without pass keys, and a NATS journal beyond this host without credentials (children
    inherit it through the environment, as they do the keys)."""
    def allow(ctx, param, value):
        if value:
            os.environ["ZSTALK_INSECURE"] = "1"
        return value
    return click.option("--insecure", is_flag=True, expose_value=False, callback=allow,
                        is_eager=True, help="Allow a ZeroMQ endpoint beyond this host without "
                        "CURVE keys (ZSTALK_CURVE_KEY ...; see zstalk keygen), and a waiting "
                        "room (--config, `online`) without --pass-key-file: no passes, and a --journal "
                        "NATS beyond this host without --journal-creds or --journal-user-file.")(f)


@click.group(cls=_Main)
@click.option("-V", "--verbose", count=True, help="More logging (repeat for more).")
@click.version_option(VERSION, prog_name="zstalk")
@click.pass_context
def main(ctx: click.Context, verbose: int) -> None:
    """zstalk: a beanstalkd-compatible job broker on a ZeroMQ actor cluster."""
    ctx.obj = verbose
    setup_logging(verbose)


@main.command()
@click.option("-l", "--listen", "addr", default="0.0.0.0", show_default=True,
              type=ListenAddress(), help="Address to listen on, or unix:/path.")
@click.option("-p", "--port", default=11300, show_default=True, type=PORT)
@click.option("--fronts", default=0, show_default=True, type=click.IntRange(min=0),
              help="0: the fronts run in the broker's process; N: N beanstalk front "
                   "processes share the port (supervised, as are the broker, the counter "
                   "front, the HTTP task API and a dispatcher then).")
@click.option("-z", "--max-job-size", default=65535, show_default=True)
@click.option("--max-jobs-bytes", default=0, help="Memory for jobs; past it put answers OUT_OF_MEMORY (0: no limit).")
@click.option("--max-connections", default=0, help="Per beanstalk front; 0: no limit.")
@click.option("--counter-port", default=COUNTER_PORT, show_default=True, type=PORT,
              help="Port of the yrmcds counter front; 0: no counter front.")
@click.option("--counter-listen", default=None, type=ListenAddress(),
              help="Address of the counter front (HOST, HOST:PORT or unix:/path). "
                   "Default: the -l address, or 127.0.0.1 when -l is a unix socket.")
@click.option("--counter-max-connections", default=0,
              help="Counter connections; beyond it accepted, then closed (0: no limit).")
@click.option("--stat-interval", default=86400, show_default=True,
              help="Counters: seconds between epoch-aligned collections of zero counters.")
@click.option("--worker-bind", default=WORKER_ENDPOINT, show_default=True,
              envvar="ZSTALK_WORKER_BIND", type=Endpoint(bare=True),
              help="ZeroMQ endpoint (tcp://HOST:PORT, HOST:PORT or ipc://PATH) where native "
                   "workers and producers (zstalk.workers) reach the broker; 'none': no such "
                   "endpoint.")
@click.option("--config", "config_path", default=None, metavar="FILE",
              help="TOML config file: the functions cloud tasks call ([functions]).")
@click.option("--http-port", default=None, type=PORT,
              help="Port of the HTTP task API (default 8080 when --config names functions; "
                   "0: none).")
@master_key_options("Bearer key the HTTP API requires to enqueue and cancel; without one "
                    "it listens on loopback only.")
@viewer_key_option
@pass_key_option
@http_options("http-")
@binlog_options
@journal_options
@health_options
@log_format_option
@click.pass_obj
@insecure_option
def serve(verbose, addr, port, fronts, max_job_size, max_jobs_bytes, max_connections,
          counter_port, counter_listen, counter_max_connections, stat_interval, worker_bind,
          config_path, http_port, master_key, master_key_file, tls_cert, tls_key,
          header_timeout, body_timeout, http_max_connections, http_max_streams, binlog_dir,
          fsync_ms, no_fsync, binlog_size, journal, health):
    """Run a broker, beanstalk fronts (port 11300), a counter front (port 11215) and, with
    --config, the HTTP task API (port 8080) and a dispatcher."""
    http_limits, _ = http_settings(tls_cert, tls_key, header_timeout, body_timeout,
                                   http_max_connections,
                                   http_max_streams)   # (TLS: the files are checked)
    master_key = master_key_from(master_key, master_key_file)
    viewer_needs_master(master_key)
    functions = load_config_or_exit(config_path)
    # a standby's client ports are bound, not listening, until it leads (docs/ha.md)
    listen = journal is None or fronts > 0
    if journal is not None and not journal.advertise:   # (--advertise's default)
        journal = journal._replace(advertise=worker_endpoint(worker_bind) or "")
    hold_signals()                  # (a SIGHUP from now waits for the loop's handler)
    listener = bind_or_exit(addr, port, listen, "beanstalk (-l, -p)")
    counter_listeners = []
    if counter_port:
        where = counter_listen or counter_host(addr)
        counter_listeners.append(bind_or_exit(where, counter_port, listen,
                                              "counters (--counter-port)"))
    http_listeners = []
    if http_port is None and functions is not None:
        http_port = HTTP_PORT
    if master_key and not http_port:
        raise click.UsageError("--master-key (ZSTALK_MASTER_KEY, --master-key-file) is the "
                               "HTTP API's: give --http-port, or --config with [functions]")
    if http_port:
        http_host = counter_host(addr) if master_key else "127.0.0.1"
        http_listeners.append(bind_or_exit(http_host, http_port, listen,
                                           "the HTTP API (--http-port)"))
    opts = ServeOptions(fronts=fronts, max_job_size=min(max_job_size, MAX_JOB_SIZE_CAP),
                        max_jobs_bytes=max_jobs_bytes, max_connections=max_connections,
                        counter_max_connections=counter_max_connections, verbose=verbose,
                        stat_interval=stat_interval,
                        worker_bind=worker_endpoint(worker_bind),
                        binlog_dir=binlog_dir, fsync_ms=fsync_ms, no_fsync=no_fsync,
                        binlog_size=binlog_size, functions=functions, config_path=config_path,
                        http_listeners=http_listeners, master_key=master_key,
                        master_key_file=master_key_file,
                        http_limits=http_limits,
                        tls_files=(tls_cert, tls_key) if tls_cert else None,
                        health=health, journal=journal)
    from .serve import run_server
    sys.exit(run_server([listener], opts, counter_listeners))


def load_config_or_exit(path: str | None):
    """The --config file read and checked (a waiting room needs --pass-key-file, or
    --insecure: config_file.check_passes), or exit 2 naming the file and the key; its
    warnings are logged (by the supervisor only, not again by its broker child)."""
    if path is None:
        return None
    from ..config_file import ConfigError, check_passes, load
    try:
        loaded = load(path)
        warnings = loaded.warnings + check_passes(loaded, path)
    except ConfigError as exc:
        click.echo(f"zstalk: {exc}", err=True)
        sys.exit(2)
    if not os.environ.get("ZSTALK_SUPERVISOR_PID"):
        for warning in warnings:
            logging.getLogger("zstalk.config").warning("%s", warning)
    return loaded


@main.command()
@click.option("--bind", default="tcp://127.0.0.1:11400", show_default=True, type=Endpoint(),
              help="ZeroMQ endpoint for fronts (tcp://HOST:PORT or ipc://PATH).")
@click.option("-z", "--max-job-size", default=65535, show_default=True)
@click.option("--max-jobs-bytes", default=0, help="0: no limit.")
@click.option("--drain", is_flag=True, help="Start in drain mode (as after SIGUSR1).")
@click.option("--stat-interval", default=86400, show_default=True,
              type=click.IntRange(min=10), help="Counters: zero counters are collected at "
              "these epoch-aligned boundaries; Dump's maximum is the peak within one.")
@click.option("--recovering", is_flag=True,
              help="Started again after a crash: Acquire answers 0x21 until fronts had "
                   "time to re-register their holdings.")
@click.option("--ready-fd", type=int, default=None,
              help="Write a byte to this fd once the binlog is replayed and the socket bound "
                   "(then, with a binlog, ' JOBS TASKS SCHEDULES' it restored); with "
                   "--journal, 's' before that once it stands by, its endpoint bound.")
@click.option("--also-bind", multiple=True, metavar="ENDPOINT", type=Endpoint(),
              help="Another endpoint of the same socket (e.g. TCP for workers; repeatable).")
@click.option("--config", "config_path", default=None, metavar="FILE",
              help="TOML config file: the functions cloud tasks call ([functions]).")
@pass_key_option
@binlog_options
@journal_options
@health_options
@log_format_option
@insecure_option
def broker(bind, max_job_size, max_jobs_bytes, drain, stat_interval, recovering, ready_fd,
           also_bind, config_path, binlog_dir, fsync_ms, no_fsync, binlog_size, journal,
           health):
    """Run the broker actor: all tube, job, session and task state."""
    from ...protocol.network.curve import CurveError
    from . import tune_gc
    tune_gc()
    from ..actor import BrokerActor
    from ..wal.binlog import BinlogError, Options
    from ..config_file import core_fields
    from ..core.broker import Config

    exit_with_parent()
    fns = load_config_or_exit(config_path)
    config = Config(max_job_size=min(max_job_size, MAX_JOB_SIZE_CAP),
                    max_jobs_bytes=max_jobs_bytes, version=VERSION,
                    binlog_max_size=binlog_size,
                    stat_interval_s=stat_interval, recovering=recovering,
                    **core_fields(fns))
    wal = journal
    if binlog_dir:
        wal = Options(binlog_dir, binlog_size, None if no_fsync else fsync_ms)
    lead = door = None

    def standing() -> None:     # (a supervisor may start its fronts now: they follow)
        if ready_fd is not None:
            from .supervisor import STANDING
            os.write(ready_fd, STANDING)
    if journal is not None:     # it stands by until the lease is its own (leading.py)
        lead, wal, config, door = stand_by(
            journal._replace(advertise=journal.advertise or bind), config, [bind, *also_bind],
            standing)
    try:
        actor = BrokerActor(None if door else bind, config, binlog=wal,
                            also_bind=() if door else tuple(also_bind),
                            config_path=config_path, metrics_top=health.metrics_top)
        if door is not None:        # (its socket, and the peers that came meanwhile)
            actor.adopt(*door.hand_over())
    except BinlogError as exc:
        click.echo(f"zstalk broker: {exc}", err=True)
        sys.exit(BINLOG_EXIT)
    except CurveError:
        raise                     # (said by _Main: exit 2)
    except Exception as exc:      # BindError: address in use, bad endpoint
        code = journal_exit(exc)
        click.echo(f"zstalk broker: {'' if code else 'cannot bind '}{exc}", err=True)
        sys.exit(code or 111)
    actor.core.draining = drain
    if ready_fd is not None:
        counts = "" if actor.restored is None else " %d %d %d" % actor.restored
        os.write(ready_fd, b"1" + counts.encode())     # (one write: the reader takes it whole)
        os.close(ready_fd)
    from ...protocol.network.loop import run
    said = "; ".join(part for part in (
        "listening on " + ", ".join(actor.endpoints), health_said(health),
        checks_said(actor.core.config.upstreams), binlog_said(binlog_dir, actor.restored),
        journal_said(wal if journal is not None else None, actor.restored,
                     getattr(actor.journal, "sync_said", "")),
        f"config {config_path}" if config_path else "",
        "CURVE" if actor.keys is not None else "", "draining" if drain else "") if part)
    run(serve_with_probes(actor, health, said, lead))
    actor.let_last_replies_leave()
    if lead is not None:
        lead.hand_over(actor)
    if actor.exit_code is not None:
        sys.exit(actor.exit_code)


def stand_by(journal, config, endpoints: list[str], standing=lambda: None):
    """`zstalk broker --journal`: wait (blocking) until the lease is ours, `endpoints`
    telling peers where the leader is meanwhile (broker/standby.py; the supervised
    fronts of `zstalk serve --fronts N` too, so they follow it: `standing()` once the
    door is bound tells the supervisor it may start them); then (the leadership, the
    journal's options with its epoch, the config, recovering after an earlier leader,
    the door whose socket the actor adopts)."""
    from .leading import Leadership
    from ..actor import BindError
    from ..standby import Door
    from ..wal.stream import JournalError
    lead = Leadership(journal, config.max_job_size)
    try:
        lead.start()
    except JournalError as exc:
        click.echo(f"zstalk broker: {exc}", err=True)
        sys.exit(exc.code)
    try:
        door = Door(endpoints, lead.pointer).start()
    except BindError as exc:
        lead.hand_over(None)
        click.echo(f"zstalk broker: cannot bind {exc}", err=True)
        sys.exit(111)
    standing()
    epoch = lead.wait_leading()
    if epoch is None:
        door.close()
        lead.hand_over(None)
        sys.exit(0)
    return lead, lead.journal_options(epoch), config._replace(
        recovering=config.recovering or epoch > 1), door


def journal_exit(exc: BaseException) -> int | None:
    """The exit code for a journal on NATS that cannot be used at start (stream.py's
    JournalError: 10, or 2 for refused settings), else None."""
    from ..wal.stream import JournalError
    return exc.code if isinstance(exc, JournalError) else None


async def serve_with_probes(actor, health: HealthOptions, said: str, lead=None) -> None:
    """The broker actor until stopped; its probes listen only now that the binlog is
    replayed and the endpoint bound, so a broker still replaying answers no probe; `lead`:
    its lease on a journal (leading.py)."""
    from ...protocol.network.health import HealthBindError, start_health
    from ..metrics import build_info
    if lead is not None:
        import asyncio
        lead.keep(actor, asyncio.get_running_loop())
    try:
        probes = await start_health(
            health, metrics=lambda: actor.render_metrics([build_info("broker")]),
            leader=lead.leading if lead is not None else lambda: None)
    except HealthBindError as exc:
        actor.close()
        click.echo(f"zstalk broker: {exc}", err=True)
        sys.exit(111)
    start_line("broker", said)
    try:
        await actor.serve()
    finally:
        if probes is not None:
            probes.close()


@main.group("journal")
def journal_group():
    """The journal on NATS JetStream (--journal): who leads it, how far it goes."""


@journal_group.command("status")
@click.option("--journal", "journal_urls", required=True, envvar="ZSTALK_JOURNAL",
              metavar="nats://H:P[,H:P…]", help="The NATS servers the journal is on.")
@click.option("--journal-name", default="zstalk", show_default=True, metavar="NAME",
              help="The journal's name: stream ZSTALK_NAME, lease bucket zstalk_NAME.")
@click.option("--journal-creds", default=None, metavar="FILE",
              help="NATS credentials file (.creds).")
@click.option("--journal-user-file", default=None, metavar="FILE",
              help="A file holding USER:PASSWORD for NATS.")
@click.option("--journal-tls-ca", default=None, metavar="FILE",
              help="Verify the NATS servers' TLS certificates with this CA (PEM).")
@insecure_option
def journal_status(journal_urls, journal_name, journal_creds, journal_user_file,
                   journal_tls_ca):
    """Print the leader, its epoch, the stream's last sequence and each standby's lag;
    exit 1 when no instance holds the lease, 10 when NATS or the stream cannot be read."""
    import asyncio
    import time
    from ..wal import status
    from ..wal.stream import JournalError
    from .journal_flags import journal_from
    journal = journal_from(journal_urls, journal_name, journal_creds, journal_user_file,
                           journal_tls_ca, 30.0, 3, None)
    try:
        said = asyncio.run(asyncio.wait_for(status.read(journal), 30))
    except (JournalError, asyncio.TimeoutError) as exc:
        click.echo(f"zstalk journal status: {exc or 'NATS did not answer in 30 s'}", err=True)
        sys.exit(getattr(exc, "code", BINLOG_EXIT))
    for line in status.lines(said, time.time()):
        click.echo(line)
    sys.exit(0 if said.leader is not None else 1)


@main.command("import-binlog")
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
@click.option("--into", default=None, type=click.Path(file_okay=False),
              help="Write the zstalk binlog here and leave DIRECTORY untouched "
                   "(default: in place, beanstalkd's files move to DIRECTORY/beanstalkd-imported).")
@click.option("-s", "--binlog-size", default=10485760, show_default=True,
              type=click.IntRange(min=1), help="Segment size of the new binlog.")
def import_binlog(directory, into, binlog_size):
    """Import a beanstalkd binlog directory (`beanstalkd -b DIR`, 1.12/1.13) into zstalk's."""
    from ..wal.beanstalkd import BinlogFormatError
    from ..wal.binlog import BinlogError
    from ..wal.importer import import_beanstalkd

    try:
        done = import_beanstalkd(directory, into, segment_size=binlog_size)
    except (BinlogError, BinlogFormatError) as exc:
        click.echo(f"zstalk import-binlog: {exc}", err=True)
        sys.exit(BINLOG_EXIT)
    for warning in done.warnings:
        click.echo(f"warning: {warning}", err=True)
    states = ", ".join(f"{n} {state}" for state, n in sorted(done.by_state.items())) or "none"
    click.echo(f"imported {done.jobs} jobs ({states}) from {len(done.files)} beanstalkd "
               f"file(s) into {done.into}; the next id is {done.next_id}")
    click.echo(f"start with: zstalk serve --binlog {done.into}  (or zstalkd -b {done.into})")


@main.group()
def front():
    """Run a protocol front."""


@front.command()
@click.option("--broker", "broker_ep", default="tcp://127.0.0.1:11400", show_default=True,
              envvar="ZSTALK_BROKER", type=Endpoints(), help=BROKER_HELP)
@click.option("--listen", "listens", multiple=True, type=ListenAddress(),
              help="HOST:PORT or unix:/path (repeatable).")
@click.option("--fd", "fds", multiple=True, type=int, help="Inherited listening socket.")
@click.option("--max-connections", default=0, help="0: no limit.")
@click.option("-z", "--max-job-size", default=65535, help="Until the broker says otherwise.")
@click.option("--hold-s", default=None, type=float, callback=hold_default,
              help="How long commands wait for an unreachable broker before INTERNAL_ERROR. "
                   "[default: 5, or 15 with several --broker endpoints]")
@health_options
@log_format_option
@insecure_option
def beanstalk(broker_ep, listens, fds, max_connections, max_job_size, hold_s, health):
    """Serve the beanstalkd text protocol to TCP / unix-socket clients."""
    exit_with_parent()
    sockets = front_sockets(fds, listens, 11300)
    from .fronts import run_beanstalk_front
    start_line("front beanstalk", with_health(f"listening on {', '.join(map(where, sockets))}; "
                                              f"broker {broker_ep}", health))
    run_beanstalk_front(broker_ep, sockets, max_connections, max_job_size, hold_s, health)


@front.command()
@click.option("--broker", "broker_ep", default="tcp://127.0.0.1:11400", show_default=True,
              envvar="ZSTALK_BROKER", type=Endpoints(), help=BROKER_HELP)
@click.option("--listen", "listens", multiple=True, type=ListenAddress(),
              help="HOST, HOST:PORT or unix:/path (repeatable; port 11215 by default).")
@click.option("--fd", "fds", multiple=True, type=int, help="Inherited listening socket.")
@click.option("--max-connections", default=0,
              help="Beyond it a connection is accepted, then closed (as yrmcds); 0: no limit.")
@click.option("--hold-s", default=None, type=float, callback=hold_default,
              help="How long requests wait for an unreachable broker (Acquire never waits). "
                   "[default: 5, or 15 with several --broker endpoints]")
@health_options
@log_format_option
@insecure_option
def counter(broker_ep, listens, fds, max_connections, hold_s, health):
    """Serve yrmcds' counter protocol; the counters live in the broker."""
    exit_with_parent()
    sockets = front_sockets(fds, listens, COUNTER_PORT)
    from .fronts import run_counter_front
    start_line("front counter", with_health(f"listening on {', '.join(map(where, sockets))}; "
                                            f"broker {broker_ep}", health))
    run_counter_front(broker_ep, sockets, max_connections, hold_s, health)


@front.command()
@click.option("--broker", "broker_ep", default="tcp://127.0.0.1:11400", show_default=True,
              envvar="ZSTALK_BROKER", type=Endpoints(), help=BROKER_HELP)
@click.option("--listen", "listens", multiple=True, type=ListenAddress(),
              help="HOST, HOST:PORT or unix:/path (repeatable; port 8080 by default; "
                   "127.0.0.1 without --listen or --fd).")
@click.option("--fd", "fds", multiple=True, type=int, help="Inherited listening socket.")
@master_key_options("Bearer key required to enqueue and cancel; without one, loopback only.")
@viewer_key_option
@pass_key_option
@http_options("")
@click.option("--hold-s", default=None, type=float, callback=hold_default,
              help="How long requests wait for an unreachable broker before a 503. "
                   "[default: 5, or 15 with several --broker endpoints]")
@health_options
@log_format_option
@insecure_option
def http(broker_ep, listens, fds, master_key, master_key_file, tls_cert, tls_key,
         header_timeout, body_timeout, http_max_connections, http_max_streams, hold_s, health):
    """Serve the HTTP/JSON cloud-task API; the tasks live in the broker."""
    from ...protocol.network.files import stream_capacity
    from ...protocol.network.listen import is_loopback
    exit_with_parent()
    master_key = master_key_from(master_key, master_key_file)
    viewer_needs_master(master_key)
    limits, tls = http_settings(tls_cert, tls_key, header_timeout, body_timeout,
                                http_max_connections, http_max_streams)
    sockets = front_sockets(fds, listens, HTTP_PORT, ["127.0.0.1"])
    if not master_key and not all(is_loopback(s) for s in sockets):
        raise click.UsageError("without --master-key the HTTP API listens on loopback only")
    from .fronts import run_http_front
    start_line("front http", with_health(
        f"{'https' if tls else 'http'} on {', '.join(map(where, sockets))}"
        f"{'' if master_key else ' (no --master-key: loopback only)'}; "
        f"{dashboard_at(sockets[0], bool(tls))}; "
        f"{stream_capacity(limits.max_streams, limits.max_connections)[1]}; broker {broker_ep}",
        health))
    run_http_front(broker_ep, sockets, master_key, limits, tls, health, hold_s)


@main.command()
@click.option("--broker", "broker_ep", default="tcp://127.0.0.1:11400", show_default=True,
              envvar="ZSTALK_BROKER", type=Endpoints(), help=BROKER_HELP)
@click.option("--slots", default=64, show_default=True, type=click.IntRange(min=1),
              help="Calls made at once by this process.")
@health_options
@log_format_option
@insecure_option
def dispatcher(broker_ep, slots, health):
    """Make the broker's cloud-task calls over HTTP until SIGTERM."""
    exit_with_parent()
    from .fronts import run_dispatcher
    start_line("dispatcher", with_health(f"connecting to {broker_ep}; {slots} calls at once",
                                         health))
    run_dispatcher(broker_ep, slots, health)


@main.command()
@click.argument("spec", metavar="MODULE:WORKER")
@click.option("--concurrency", type=click.IntRange(min=1), default=None,
              help="Handlers running at once per process (default: the Worker's).")
@click.option("--processes", type=click.IntRange(min=1), default=1, show_default=True,
              help="Pool processes, each with its own connection (supervised).")
@click.option("--broker", "broker_ep", default=None, envvar="ZSTALK_BROKER", type=Endpoints(),
              help="Broker endpoint, or the endpoints of a journal's instances, comma-"
                   "separated (default: the Worker's, tcp://127.0.0.1:11400).")
@click.option("--prefetch", type=click.IntRange(min=0), default=None,
              help="Jobs held beyond those running (default: the Worker's).")
@health_options
@log_format_option
@insecure_option
def worker(spec, concurrency, processes, broker_ep, prefetch, health):
    """Run the native worker MODULE:WORKER (a zstalk.workers.Worker) until SIGTERM."""
    from ...protocol.network.health import HealthBindError
    from ...workers.errors import WorkerVersionError
    from ...workers.worker import VERSION_EXIT, load_worker

    try:
        w = load_worker(spec)       # the cwd is importable, as with celery and rq
    except (ImportError, AttributeError, TypeError, ValueError) as exc:
        raise click.UsageError(f"cannot load {spec}: {exc}")
    if concurrency is not None:
        w.concurrency = concurrency
    if prefetch is not None:
        w.prefetch = prefetch
    if broker_ep is not None:
        w.broker = broker_ep
    start_line("worker", with_health(f"connecting to {w.broker}; {spec}, {processes} process"
                                     f"{'es' if processes > 1 else ''} of {w.concurrency} "
                                     f"handlers", health))
    try:
        w.run(processes=processes, spec=spec, health=health)
    except WorkerVersionError as exc:
        click.echo(f"zstalk worker: {exc}", err=True)
        sys.exit(VERSION_EXIT)
    except HealthBindError as exc:
        click.echo(f"zstalk worker: {exc}", err=True)
        sys.exit(111)



@main.command()
@click.argument("directory")
@click.argument("name")
def keygen(directory, name):
    """Write a CURVE key pair: DIRECTORY/NAME.key (public) and NAME.key_secret (0600)."""
    from ...protocol.network.curve import keygen as write_keys
    public, secret = write_keys(directory, name)
    click.echo(f"public key {public} (give it to the broker's ZSTALK_CURVE_CLIENTS directory, "
               f"or to clients as ZSTALK_CURVE_SERVER)\nsecret key {secret} (ZSTALK_CURVE_KEY of "
               f"this process only)")


if __name__ == "__main__":
    main()
