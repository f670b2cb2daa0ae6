"""`zstalk tasks | functions | schedules`: an operator's commands, over the HTTP API only.

    zstalk tasks list [--function F] [--status S] [--limit N]   a page, oldest first
    zstalk tasks get ID | retry ID | cancel ID
    zstalk functions list | show NAME | pause NAME | resume NAME
    zstalk schedules list | show NAME | pause NAME | resume NAME

How it works: each command is one request (a listing of functions or schedules follows
the pages' `next` to the end) to the API at `--url` (ZSTALK_URL; the local HTTP front,
http://127.0.0.1:8080, by default) with the master key as its bearer token when one is
given (--master-key / ZSTALK_MASTER_KEY, or --master-key-file / ZSTALK_MASTER_KEY_FILE,
as `zstalk serve` takes it).  The answer is printed as a table for people, or as the
API's own JSON with `--json` for scripts.  The commands know nothing of the broker: what
the API answers is what they show, and urllib (the standard library) carries it.

Exit codes (EXIT): 0 ok; 1 refused, the API's status and error code printed (`zstalk: 409
not_retryable: ...`); 2 a usage error (click's own, and a --url that is no http(s) URL);
3 the API could not be reached, its address and port named.

These modules load only when one of their commands runs (cli.py's `_Main` finds them by
name): `zstalk serve` and `zstalkd` never import them (tests/end_to_end/test_start_path.py).
"""
from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from typing import Any, Callable, NamedTuple
from urllib.parse import quote, urlencode, urlsplit

import click

from ....protocol.schema.tasks import STATUSES
from ..cli import master_key_from, master_key_options

#: the local HTTP front (cli.py's HTTP_PORT, on loopback)
DEFAULT_URL = "http://127.0.0.1:8080"
URL_ENV = "ZSTALK_URL"
OK, REFUSED, USAGE, UNREACHABLE = 0, 1, 2, 3
TIMEOUT_S = 30.0
#: pages of functions or schedules followed at most (100 a page: 100,000 names)
MAX_PAGES = 1000


class Unreachable(Exception):
    """A server did not answer, or not as one (the API, or stats.py's beanstalk and
    counter servers): exit 3."""


class Api(NamedTuple):
    """Where the API is, and the master key to show it (None: none)."""
    url: str
    key: str | None = None

    @property
    def address(self) -> str:
        """host:port of the API, as an error names it."""
        parts = urlsplit(self.url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        host = parts.hostname or ""
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """(HTTP status, decoded JSON) of one request; Unreachable when none came."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url.rstrip("/") + path, data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if self.key:
            request.add_header("Authorization", f"Bearer {self.key}")
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
                return response.status, _decoded(response.read())
        except urllib.error.HTTPError as err:
            return err.code, _decoded(err.read())
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise Unreachable(f"cannot reach the HTTP API at {self.address} ({self.url}): "
                              f"{reason}") from None


def _decoded(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return {"error": "not_json", "message": raw[:200].decode("utf-8", "replace")}


def checked_url(ctx, param, value: str) -> str:
    """--url as given, if it is an http(s) URL with a host (else a usage error: 2)."""
    try:
        parts = urlsplit(value)
        parts.port                      # (a port that is no number raises here)
    except ValueError as exc:
        raise click.BadParameter(f"{value!r}: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise click.BadParameter(f"{value!r} is not an http:// or https:// URL with a host")
    return value


def api_options(f):
    """--url, the master key and --json: every command of this module has them."""
    f = click.option("--json", "as_json", is_flag=True,
                     help="Print the API's JSON answer (for scripts), not a table.")(f)
    f = master_key_options("The master key, if the server has one (else reading and "
                           "acting need none: only loopback is answered then).")(f)
    return click.option("--url", default=DEFAULT_URL, envvar=URL_ENV, show_default=True,
                        show_envvar=True, callback=checked_url,
                        help="The zstalk HTTP API (`zstalk serve --config` serves it).")(f)


def api_from(url: str, master_key: str | None, master_key_file: str | None) -> Api:
    return Api(url, master_key_from(master_key, master_key_file))


def ask(api: Api, method: str, path: str, body: Any = None) -> Any:
    """The answer's JSON, or the command ends: 1 refused (status and code said), 3 not
    reached."""
    try:
        status, doc = api.call(method, path, body)
    except Unreachable as exc:
        click.echo(f"zstalk: {exc}", err=True)
        sys.exit(UNREACHABLE)
    if status >= 400:
        doc = doc if isinstance(doc, dict) else {}
        click.echo(f"zstalk: {status} {doc.get('error', 'error')}: {doc.get('message', '')}",
                   err=True)
        sys.exit(REFUSED)
    return doc


def pages(api: Api, path: str, key: str) -> list:
    """Every item of a listing by name (`next` followed to the end)."""
    items: list = []
    after = ""
    for _ in range(MAX_PAGES):
        doc = ask(api, "GET", f"{path}?{urlencode({'after': after, 'limit': 100})}")
        items.extend(doc[key])
        if doc.get("next") is None:
            break
        after = doc["next"]
    return items


# -- printing ------------------------------------------------------------------------------
def cell(value: Any) -> str:
    """One value as a table shows it ("-": none)."""
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def table(rows: list[dict], columns: list[tuple[str, str]]) -> str:
    """Rows as aligned columns under their headers ((header, key) each)."""
    lines = [[header for header, _ in columns]]
    lines += [[cell(row.get(key)) for _, key in columns] for row in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(columns))]
    return "\n".join("  ".join(text.ljust(width) for text, width in zip(line, widths)).rstrip()
                     for line in lines)


def fields(doc: dict) -> str:
    """One object as `key  value` lines, in the API's order."""
    width = max((len(k) for k in doc), default=0)
    return "\n".join(f"{k.ljust(width)}  {cell(v)}" for k, v in doc.items())


def show(doc: Any, as_json: bool, as_table: Callable[[Any], str]) -> None:
    click.echo(json.dumps(doc, indent=2) if as_json else as_table(doc))


TASK_COLUMNS = [("UNIQUE ID", "uniqueId"), ("FUNCTION", "function"), ("STATUS", "status"),
                ("ATTEMPT", "attempt"), ("CREATED", "createdAt"), ("ERROR", "error")]
FUNCTION_COLUMNS = [("NAME", "name"), ("PAUSED", "paused"), ("QUEUED", "queued"),
                    ("RUNNING", "running"), ("CONCURRENCY", "concurrency"),
                    ("PAUSED UNTIL", "pausedUntil")]
SCHEDULE_COLUMNS = [("NAME", "name"), ("CRON", "cron"), ("TIMEZONE", "timezone"),
                    ("FUNCTION", "function"), ("PAUSED", "paused"), ("NEXT FIRE", "nextFireAt")]


def _named(kind: str, name: str) -> str:
    return f"/v1/{kind}/{quote(name, safe='')}"


# -- zstalk tasks --------------------------------------------------------------------------
@click.group("tasks")
def tasks_group():
    """Cloud tasks: list, look at one, retry a failed one, cancel one."""


@tasks_group.command("list")
@click.option("--function", default=None, help="Only this function's tasks.")
@click.option("--status", default=None,
              type=click.Choice(sorted(STATUSES)), help="Only tasks in this status.")
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1, 1000),
              help="At most this many, oldest first.")
@api_options
def tasks_list(function, status, limit, url, master_key, master_key_file, as_json):
    """A page of tasks, oldest first."""
    query = {k: v for k, v in (("function", function), ("status", status),
                               ("limit", limit)) if v is not None}
    doc = ask(api_from(url, master_key, master_key_file), "GET", f"/v1/tasks?{urlencode(query)}")
    show(doc, as_json, lambda d: table(d["tasks"], TASK_COLUMNS))


def not_empty(ctx, param, value: str) -> str:
    """An id or a name of at least one character (an empty one, from an unset shell
    variable, would ask for another route: a usage error, exit 2)."""
    if not value:
        raise click.BadParameter("is empty")
    return value


def _task_command(name: str, method: str, suffix: str, help_text: str):
    @tasks_group.command(name, help=help_text)
    @click.argument("unique_id", metavar="ID", callback=not_empty)
    @api_options
    def command(unique_id, url, master_key, master_key_file, as_json):
        doc = ask(api_from(url, master_key, master_key_file), method,
                  _named("tasks", unique_id) + suffix)
        show(doc, as_json, fields)
    return command


tasks_get = _task_command("get", "GET", "", "A task: its status, attempts, result or error.")
tasks_retry = _task_command("retry", "POST", "/retry", "Run a failed or cancelled task again, "
                            "its attempts from the first (else refused: 409).")
tasks_cancel = _task_command("cancel", "DELETE", "", "Cancel a queued task, one waiting for "
                             "a retry, or a running one (its call is aborted).")


# -- zstalk functions and zstalk schedules ---------------------------------------------------
def named_group(kind: str, columns: list, help_text: str) -> click.Group:
    """`list`, `show NAME`, `pause NAME` and `resume NAME` of functions or schedules (the
    same four routes: GET a listing, GET and PATCH {"paused"} one by name)."""
    group = click.Group(kind, help=help_text)

    @group.command("list", help=f"Every {kind[:-1]}, by name.")
    @api_options
    def listing(url, master_key, master_key_file, as_json):
        items = pages(api_from(url, master_key, master_key_file), f"/v1/{kind}", kind)
        show(items, as_json, lambda rows: table(rows, columns))

    @group.command("show", help=f"One {kind[:-1]}, every field.")
    @click.argument("name", callback=not_empty)
    @api_options
    def one(name, url, master_key, master_key_file, as_json):
        doc = ask(api_from(url, master_key, master_key_file), "GET", _named(kind, name))
        show(doc, as_json, fields)

    for verb, paused in (("pause", True), ("resume", False)):
        group.add_command(_pause_command(kind, verb, paused))
    return group


def _pause_command(kind: str, verb: str, paused: bool) -> click.Command:
    @click.command(verb, help=f"{verb.capitalize()} a {kind[:-1]} (kept across restarts).")
    @click.argument("name", callback=not_empty)
    @api_options
    def command(name, url, master_key, master_key_file, as_json):
        doc = ask(api_from(url, master_key, master_key_file), "PATCH", _named(kind, name),
                  {"paused": paused})
        show(doc, as_json, fields)
    return command


functions_group = named_group("functions", FUNCTION_COLUMNS,
                              "Functions: their queues, limits and pauses; pause or resume one.")
schedules_group = named_group("schedules", SCHEDULE_COLUMNS,
                              "Cron schedules: list, look at one, pause or resume one.")
