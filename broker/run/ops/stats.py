"""`zstalk stats`: tubes and counters as tables, from the HTTP API or from the plain protocols.

    zstalk stats [--url URL]                          GET /v1/tubes and /v1/counters
    zstalk stats --beanstalk HOST:PORT [--counter HOST:PORT]   where no HTTP front runs

How it works: with neither --beanstalk nor --counter, the HTTP API at --url (as the other
operator's commands, operator.py) gives the tubes, busiest first, and the counters; the
broker counts no beanstalk command for them.  With --beanstalk, a beanstalk server
(zstalk's own or beanstalkd: nothing zstalk-only is asked) is read with `list-tubes` and
one `stats-tube` per tube, over one connection, as any client would (those commands are
then counted, as beanstalkd counts them); with --counter, a yrmcds counter server with one
Dump (yrmcds' counter.md).  The stats-tube keys are shown as the API spells them
(camelCase, core/views.py's `camel`), so `--json` has one shape whatever the source:
{"tubes": [...], "counters": [{"name", "current", "max"}]}.  Exit codes as operator.py's:
3 when a server cannot be reached, naming its address and port.
"""
from __future__ import annotations

import json
import socket
import sys
from urllib.parse import urlencode

import click

from ....protocol.codecs import yrmcds
from ...core.views import camel
from .operator import UNREACHABLE, Api, Unreachable, api_from, api_options, ask, table

TIMEOUT_S = 10.0
TUBE_COLUMNS = [("TUBE", "name"), ("READY", "currentJobsReady"),
                ("RESERVED", "currentJobsReserved"), ("DELAYED", "currentJobsDelayed"),
                ("BURIED", "currentJobsBuried"), ("TOTAL", "totalJobs"),
                ("WAITING", "currentWaiting"), ("PAUSE LEFT", "pauseTimeLeft")]
COUNTER_COLUMNS = [("COUNTER", "name"), ("CURRENT", "current"), ("MAX", "max")]


def host_port(ctx, param, value: str | None) -> tuple[str, int] | None:
    """HOST:PORT (an IPv6 host in brackets) as (host, port), else a usage error."""
    if value is None:
        return None
    host, _, port = value.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not host or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        raise click.BadParameter(f"{value!r} is not HOST:PORT")
    return host, int(port)


# -- the sources -----------------------------------------------------------------------------
def over_http(api: Api) -> dict:
    tubes, after = [], ""
    while True:                     # (every page: a server has as many tubes as it has)
        doc = ask(api, "GET", "/v1/tubes?" + urlencode(
            {"sort": "activity", "after": after, "limit": 1000}))
        tubes += doc["tubes"]
        if doc["next"] is None:
            break
        after = doc["next"]
    return {"tubes": tubes, "counters": ask(api, "GET", "/v1/counters")["counters"]}


class Beanstalk:
    """One connection to a beanstalk server, reading replies whole (protocol.txt)."""

    def __init__(self, address: tuple[str, int]) -> None:
        self.address = address
        try:
            self.sock = socket.create_connection(address, timeout=TIMEOUT_S)
        except OSError as exc:
            raise Unreachable(_cannot("beanstalk", address, exc)) from None
        self.buf = b""

    def ask(self, command: bytes) -> bytes:
        """The YAML body of an OK reply (b"" for NOT_FOUND: a tube gone meanwhile)."""
        try:
            self.sock.sendall(command + b"\r\n")
            line = self._until(b"\r\n")
            if line == b"NOT_FOUND":
                return b""
            if not line.startswith(b"OK "):
                raise Unreachable(f"{_where('beanstalk', self.address)} answered "
                                  f"{line[:60]!r} to {command.decode()}")
            body = self._exactly(int(line[3:]) + 2)
        except (OSError, ValueError) as exc:
            raise Unreachable(_cannot("beanstalk", self.address, exc)) from None
        return body[:-2]

    def _until(self, end: bytes) -> bytes:
        while end not in self.buf:
            self._more()
        line, self.buf = self.buf.split(end, 1)
        return line

    def _exactly(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._more()
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def _more(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        self.buf += chunk

    def close(self) -> None:
        self.sock.close()


def yaml_list(body: bytes) -> list[str]:
    return [line[2:] for line in body.decode().splitlines() if line.startswith("- ")]


def yaml_map(body: bytes) -> dict:
    out = {}
    for line in body.decode().splitlines():
        key, sep, value = line.partition(": ")
        if sep:
            value = value.strip('"')
            digits = value.lstrip("-")
            out[camel(key)] = int(value) if digits.isascii() and digits.isdigit() else value
    return out


def over_beanstalk(address: tuple[str, int]) -> list[dict]:
    """Every tube's stats-tube, busiest first as the API sorts them: by the events
    stats-tube counts (puts and deletes: it has no reserves), then by name."""
    conn = Beanstalk(address)
    try:
        stats = (yaml_map(conn.ask(b"stats-tube " + name.encode()))
                 for name in yaml_list(conn.ask(b"list-tubes")))
        return sorted((s for s in stats if s), key=lambda s: (
            -_count(s, "totalJobs") - _count(s, "cmdDelete"), str(s.get("name", ""))))
    finally:
        conn.close()


def _count(tube: dict, key: str) -> int:
    value = tube.get(key)
    return value if type(value) is int else 0


def over_yrmcds(address: tuple[str, int]) -> list[dict]:
    """The counters of one Dump (one frame a counter, then an empty one)."""
    counters, buf = [], bytearray()
    try:
        with socket.create_connection(address, timeout=TIMEOUT_S) as sock:
            sock.sendall(yrmcds.request(yrmcds.Opcode.DUMP, 1))
            while True:
                reply = yrmcds.next_reply(buf)
                if reply is None:
                    chunk = sock.recv(65536)
                    if not chunk:
                        raise ConnectionError("the server closed the connection")
                    buf += chunk
                    continue
                if not reply.body:
                    return counters
                current, most, size = yrmcds.DUMP_FIXED.unpack_from(reply.body)
                name = reply.body[yrmcds.DUMP_FIXED.size:yrmcds.DUMP_FIXED.size + size]
                counters.append({"name": name.decode("utf-8", "replace"),
                                 "current": current, "max": most})
    except (OSError, ValueError) as exc:
        raise Unreachable(_cannot("counter", address, exc)) from None


def _where(kind: str, address: tuple[str, int]) -> str:
    host, port = address
    return f"the {kind} server at {f'[{host}]' if ':' in host else host}:{port}"


def _cannot(kind: str, address: tuple[str, int], exc: Exception) -> str:
    return f"cannot reach {_where(kind, address)}: {exc}"


# -- the command -----------------------------------------------------------------------------
@click.command("stats")
@click.option("--beanstalk", "beanstalk", default=None, metavar="HOST:PORT", callback=host_port,
              help="Read tubes from this beanstalk server (zstalk or beanstalkd) with "
                   "list-tubes and stats-tube, not from the HTTP API.")
@click.option("--counter", "counter", default=None, metavar="HOST:PORT", callback=host_port,
              help="Read counters from this yrmcds counter server with Dump.")
@api_options
def stats_command(beanstalk, counter, url, master_key, master_key_file, as_json):
    """Tubes and counters as tables: from the HTTP API, or from beanstalk and counter
    servers where no HTTP front runs."""
    try:
        if beanstalk is None and counter is None:
            said = over_http(api_from(url, master_key, master_key_file))
        else:
            said = {"tubes": over_beanstalk(beanstalk) if beanstalk else [],
                    "counters": over_yrmcds(counter) if counter else []}
    except Unreachable as exc:
        click.echo(f"zstalk: {exc}", err=True)
        sys.exit(UNREACHABLE)
    if as_json:
        click.echo(json.dumps(said, indent=2))
        return
    click.echo(table(said["tubes"], TUBE_COLUMNS))
    if said["counters"] or counter is not None or beanstalk is None:
        click.echo()
        click.echo(table(said["counters"], COUNTER_COLUMNS))
