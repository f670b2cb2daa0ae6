"""--journal and its flags, shared by `zstalk serve` and `zstalk broker` (zstalkd takes
none): the journal on NATS JetStream (broker/wal/jetstream.py, docs/ha.md).

They reach the command as one `journal` argument, a wal/stream.py Options or None.
--journal-lease-ms, --journal-stall-ms and --advertise are the lease's (wal/lease.py,
run/leading.py): how long a standby lets the leader's lease go unrenewed, how long the
leader's loop may be stuck before it stops renewing, and what the lease says of where
the leader is reached (default: the worker endpoint).
Refused with exit 2 (a usage error naming the flag): --journal with --binlog (one journal),
a --journal-* flag without --journal, a bad URL or name, and a NATS beyond this host
without credentials (--journal-creds or --journal-user-file) unless --insecure, as CURVE is
for ZeroMQ: whoever reaches an open NATS can append to the journal.  Nothing here imports
nats; wal/stream.py loads only when --journal is given.
"""
from __future__ import annotations

import functools
import os

import click

_FLAGS = ("journal_name", "journal_creds", "journal_user_file", "journal_tls_ca",
          "journal_timeout", "journal_replicas", "journal_monitor", "journal_lease_ms",
          "journal_stall_ms", "advertise")


def journal_options(f):
    @functools.wraps(f)
    def command(*args, journal_urls, journal_name, journal_creds, journal_user_file,
                journal_tls_ca, journal_timeout, journal_replicas, journal_monitor,
                journal_lease_ms, journal_stall_ms, advertise, **kwargs):
        ctx = click.get_current_context()
        given = [name for name in _FLAGS
                 if ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT]
        journal = None
        if journal_urls:
            if kwargs.get("binlog_dir"):
                raise click.UsageError("--journal and --binlog are two journals: give one")
            journal = journal_from(journal_urls, journal_name, journal_creds,
                                   journal_user_file, journal_tls_ca, journal_timeout,
                                   journal_replicas, journal_monitor)
            if 0 < journal_stall_ms < 1000:
                raise click.BadParameter(f"{journal_stall_ms}: 0 (never) or 1000 and more",
                                         param_hint="--journal-stall-ms")
            journal = journal._replace(lease_s=journal_lease_ms / 1000,
                                       stall_s=journal_stall_ms / 1000,
                                       advertise=advertise or "")
        elif given:
            flag = "--" + given[0].replace("_", "-")
            raise click.UsageError(f"{flag} is for the journal on NATS: it needs --journal")
        return f(*args, journal=journal, **kwargs)

    for opt in reversed([
        click.option("--journal", "journal_urls", default=None, metavar="nats://H:P[,H:P…]",
                     envvar="ZSTALK_JOURNAL",
                     help="Keep every change in a NATS JetStream stream (replicated) instead "
                          "of a local binlog; every reply waits for its append's "
                          "acknowledgement. Excludes --binlog."),
        click.option("--journal-name", default="zstalk", show_default=True, metavar="NAME",
                     help="The journal's name: stream ZSTALK_NAME, subject zstalk.NAME.journal."),
        click.option("--journal-creds", default=None, metavar="FILE",
                     help="NATS credentials file (.creds) for the journal."),
        click.option("--journal-user-file", default=None, metavar="FILE",
                     help="A file holding USER:PASSWORD for NATS (a mounted Secret)."),
        click.option("--journal-tls-ca", default=None, metavar="FILE",
                     help="Verify the NATS servers' TLS certificates with this CA (PEM)."),
        click.option("--journal-timeout", default=30.0, show_default=True,
                     type=click.FloatRange(min=1),
                     help="Exit (code 13) when no append is acknowledged for this many "
                          "seconds; replies wait meanwhile."),
        click.option("--journal-replicas", default=3, show_default=True,
                     type=click.IntRange(1, 5),
                     help="Replicas of a stream zstalk makes, and what it requires of one "
                          "it finds (1: a local try, with a warning)."),
        click.option("--journal-monitor", default=None, metavar="URL[,URL…]",
                     help="NATS monitoring endpoints (http://H:8222): sync_interval "
                          "'always' is checked there (else the start line says it is not)."),
        click.option("--journal-lease-ms", default=1500, show_default=True,
                     type=click.IntRange(min=500, max=60000),
                     help="A standby takes over once the leader's lease has not been renewed "
                          "(every 250 ms) for this long, on the standby's own clock."),
        click.option("--journal-stall-ms", default=5000, show_default=True,
                     type=click.IntRange(min=0, max=600000),
                     help="The leader stops renewing its lease (so a standby takes over) once "
                          "its event loop has not turned for this long; 0: never."),
        click.option("--advertise", default=None, metavar="tcp://HOST:PORT",
                     help="Where others reach this instance's worker endpoint, published in "
                          "the lease while it leads (default: the worker endpoint)."),
    ]):
        command = opt(command)
    return command


def journal_from(urls: str, name: str, creds: str | None, user_file: str | None,
                 tls_ca: str | None, timeout_s: float, replicas: int, monitor: str | None):
    """The flags as a wal/stream.py Options (a usage error naming what is wrong)."""
    import importlib.util
    if importlib.util.find_spec("nats") is None:
        raise click.UsageError("--journal needs the NATS client, nats-py: install zstalk "
                               "with its ha extra (pip install 'zstalk[ha]')")
    from ..wal import stream
    try:
        parsed = stream.parse_urls(urls)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--journal") from None
    if not stream.NAME_RE.fullmatch(name):
        raise click.BadParameter(f"{name!r}: letters, digits, - and _ only (64 at most)",
                                 param_hint="--journal-name")
    if creds and user_file:
        raise click.UsageError("give --journal-creds or --journal-user-file, not both")
    for flag, path in (("--journal-creds", creds), ("--journal-tls-ca", tls_ca)):
        if path and not os.path.isfile(path):
            raise click.BadParameter(f"{path} is not a file", param_hint=flag)
    user = password = None
    if user_file:
        user, password = read_user_file(user_file)
    if not (creds or user) and not stream.loopback_only(parsed) \
            and not os.environ.get("ZSTALK_INSECURE"):
        raise click.UsageError(
            f"--journal {urls}: a NATS beyond this host needs credentials "
            f"(--journal-creds FILE or --journal-user-file FILE): whoever reaches it could "
            f"append to the journal; --insecure allows it without")
    monitors = tuple(m.strip() for m in (monitor or "").split(",") if m.strip())
    return stream.Options(parsed, name, creds=creds and os.path.abspath(creds), user=user,
                          password=password, user_file=user_file and os.path.abspath(user_file),
                          tls_ca=tls_ca and os.path.abspath(tls_ca), timeout_s=timeout_s,
                          replicas=replicas, monitor=monitors)


def read_user_file(path: str) -> tuple[str, str]:
    """USER:PASSWORD from --journal-user-file (less one trailing newline)."""
    from ...protocol.network.secret import SecretError, read_secret_file
    try:
        text = read_secret_file(path, "--journal-user-file").decode("utf-8")
    except (SecretError, UnicodeDecodeError) as exc:
        raise click.BadParameter(str(exc), param_hint="--journal-user-file") from None
    user, sep, password = text.partition(":")
    if not sep or not user:
        raise click.BadParameter(f"{path} does not hold USER:PASSWORD",
                                 param_hint="--journal-user-file")
    return user, password


def journal_args(journal) -> list[str]:
    """The journal's flags for a supervised `zstalk broker` child (files by name)."""
    if journal is None:
        return []
    args = ["--journal", ",".join(journal.urls), "--journal-name", journal.name,
            "--journal-timeout", str(journal.timeout_s),
            "--journal-replicas", str(journal.replicas)]
    for flag, value in (("--journal-creds", journal.creds),
                        ("--journal-user-file", journal.user_file),
                        ("--journal-tls-ca", journal.tls_ca)):
        if value:
            args += [flag, value]
    if journal.monitor:
        args += ["--journal-monitor", ",".join(journal.monitor)]
    args += ["--journal-lease-ms", str(round(journal.lease_s * 1000)),
             "--journal-stall-ms", str(round(journal.stall_s * 1000))]
    if journal.advertise:
        args += ["--advertise", journal.advertise]
    return args
