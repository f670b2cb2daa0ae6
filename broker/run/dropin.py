"""`zstalkd`: `zstalk serve` under beanstalkd's command line, for anything that launches beanstalkd.

Flags are parsed the way beanstalkd's optparse does (util.c): each argument is a group
of one-letter flags (`-VV`, `-Vu user`), a flag that takes a value uses the rest of its
argument or the next one (`-p11300`, `-p 11300`), an unknown flag or a stray argument
prints the usage and exits 5, `-h` prints it and exits 0, `-v` prints the version.
The binlog flags mean what they mean to beanstalkd: -b DIR the write-ahead log,
-f MS fsync at most every MS ms (default 50), -F never fsync, -s BYTES segment size.
$ZSTALK_LOG_FORMAT=json makes its stderr lines JSON (broker/run/logs.py), as it is the
default of every `zstalk` role's --log-format; the usage text stays beanstalkd's.

Start-up order keeps the port promise: bind (or take systemd's LISTEN_FDS socket),
drop privileges (-u), then start the actors; nothing heavy is imported before the bind.
"""
from __future__ import annotations

import os
import sys

from . import hold_signals, tune_gc

USAGE = """\
Use: {prog} [OPTIONS]

Options:
 -l ADDR  listen on address (default is 0.0.0.0), or unix:/path
 -p PORT  listen on port (default is 11300)
 -u USER  become user and group
 -b DIR   write-ahead log directory
 -f MS    fsync at most once every MS milliseconds (default is 50ms);
          use -f0 for "always fsync"
 -F       never fsync
 -s BYTES set the size of each write-ahead log file (default is 10485760);
          will be rounded up to a multiple of 4096 bytes
 -z BYTES set the maximum job size in bytes (default is 65535);
          max allowed is 1073741824 bytes
 -v       show version information
 -V       increase verbosity
 -h       show this help
"""
WITH_VALUE = set("lpuzbfs")
MAX_JOB_SIZE_CAP = 1073741824


class Usage(Exception):
    def __init__(self, message: str | None, code: int = 5) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def parse_args(argv: list[str]) -> dict:
    opts = {"addr": "0.0.0.0", "port": 11300, "user": None, "max_job_size": 65535,
            "verbose": 0, "version": False, "binlog": None, "fsync_ms": 50,
            "no_fsync": False, "binlog_size": 10485760}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("-") or arg == "-":
            raise Usage(f"unknown argument: {arg}")
        j = 1
        while j < len(arg):
            flag = arg[j]
            if flag in WITH_VALUE:
                value = arg[j + 1:]
                if not value:
                    i += 1
                    if i >= len(argv):
                        raise Usage(f"flag requires an argument: -{flag}")
                    value = argv[i]
                _apply(opts, flag, value)
                break
            _apply(opts, flag, None)
            j += 1
        i += 1
    return opts


def _apply(opts: dict, flag: str, value: str | None) -> None:
    if flag == "h":
        raise Usage(None, 0)
    if flag == "v":
        opts["version"] = True
    elif flag == "V":
        opts["verbose"] += 1
    elif flag == "l":
        opts["addr"] = value
    elif flag == "u":
        opts["user"] = value
    elif flag == "b":
        opts["binlog"] = value
    elif flag == "F":
        opts["no_fsync"] = True
    elif flag in "pzfs":
        try:
            n = int(value)
        except ValueError:
            raise Usage(f"invalid value for -{flag}: {value}") from None
        if flag == "p":
            opts["port"] = n
        elif flag == "z":
            opts["max_job_size"] = min(n, MAX_JOB_SIZE_CAP)
        elif flag == "f":
            opts["fsync_ms"] = max(0, n)
        else:
            opts["binlog_size"] = max(1, n)
    else:
        raise Usage(f"unknown flag: -{flag}")


#: beanstalkd's exit codes when -u fails (main.c's su): getpwnam failed, no such user,
#: setgid or setuid failed
GETPWNAM_EXIT, NO_SUCH_USER_EXIT, SETID_EXIT = 32, 33, 34


def become_user(name: str) -> tuple[int, str] | None:
    """Drop root for `name` as beanstalkd's su() does; None, or (exit code, message)."""
    import pwd
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        return NO_SUCH_USER_EXIT, f'getpwnam("{name}"): no such user'
    except OSError as exc:
        return GETPWNAM_EXIT, f'getpwnam("{name}"): {exc.strerror}'
    try:
        os.setgroups([])
        os.setgid(pw.pw_gid)
    except OSError as exc:
        return SETID_EXIT, f'setgid({pw.pw_gid} "{name}"): {exc.strerror}'
    try:
        os.setuid(pw.pw_uid)
    except OSError as exc:
        return SETID_EXIT, f'setuid({pw.pw_uid} "{name}"): {exc.strerror}'
    return None


def main(argv: list[str] | None = None) -> int:
    prog = "zstalkd"
    tune_gc()
    try:
        opts = parse_args(sys.argv[1:] if argv is None else argv)
    except Usage as u:
        if u.message:
            print(f"{prog}: {u.message}", file=sys.stderr)
        print(USAGE.format(prog=prog), file=sys.stderr if u.code else sys.stdout, end="")
        return u.code
    if opts["version"]:
        from .. import VERSION      # (the schema package: 8 ms not spent before the bind)
        print(f"{prog} {VERSION}")
        return 0
    from ...protocol.network.listen import bind_listen, describe_listen, systemd_sockets
    hold_signals()                  # (a SIGHUP from now waits for the loop's handler)
    listeners = systemd_sockets()
    if not listeners:
        try:
            listeners = [bind_listen(opts["addr"], opts["port"])]
        except OSError as exc:
            where = describe_listen(opts["addr"], opts["port"])
            print(f"{prog}: bind {where}: {exc.strerror}", file=sys.stderr)
            return 111
    from .logs import format_from_env, setup_logging
    try:
        log_format = format_from_env()      # (beanstalkd's flags have no room for it)
    except ValueError as exc:
        print(f"{prog}: $ZSTALK_LOG_FORMAT: {exc}", file=sys.stderr)
        return 5
    from .options import ServeOptions
    from .serve import run_server   # (and the rest of the server, before giving up root)
    if opts["user"]:
        refused = become_user(opts["user"])
        if refused is not None:
            print(f"{prog}: {refused[1]}", file=sys.stderr)
            return refused[0]
    setup_logging(opts["verbose"], log_format)
    return run_server(listeners, ServeOptions(
        max_job_size=opts["max_job_size"], verbose=opts["verbose"], binlog_dir=opts["binlog"],
        fsync_ms=opts["fsync_ms"], no_fsync=opts["no_fsync"], binlog_size=opts["binlog_size"],
        announce=opts["verbose"] > 0, role="zstalkd"))


if __name__ == "__main__":
    sys.exit(main())
