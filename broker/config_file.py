"""The TOML config file (`zstalk serve --config zstalk.toml`): where cloud tasks call.

    [functions]
    base_url = "http://127.0.0.1:3000"   # function F is called at base_url/F
    concurrency = 2                      # defaults for every function
    timeout = "10s"

    [functions.closeOrder]               # one table per named function (optional)
    url = "http://orders:3000/closeOrder"   # without base_url, required; with it, optional
    rate = "5/s"

KEYS below is every key of every table, with where it may be written, its type, default,
unit and one line of help: the reader refuses a key it does not list there and takes its
defaults from it, and docs/reference/config.md is made from it (scripts/docs_reference.py;
tests/project/test_docs.py fails when the two differ).

Which names can be called: without base_url, the [functions.NAME] tables.  With it,
those (a table without `url` is NAME at base_url/NAME) and the names in `functions`; and
with neither tables nor a list, or with `base_url_any = true`, any name under base_url (a
misspelled name is then called, and retried until its attempts run out).  A file with
base_url and tables but no base_url_any was "any name" before 0.2: it gets a warning
(TaskConfig.warnings) naming the key, as the upgrade note says.

Durations are strings with a unit (`"500ms"`, `"10s"`, `"2m"`, `"1h"`); sizes are bytes,
or strings with a binary unit (`"512KiB"`, `"4MiB"`), at most MAX_SIZE.  Everything is
checked when the file is read; a `ConfigError` names the file and the key, and nothing
is half applied.  tomllib is Python's own (3.11+).
"""
from __future__ import annotations

import datetime
import os
import re
import tomllib
from typing import Any, NamedTuple

from ..protocol.network.curve import insecure

from .core.tasks.model import requests
from .core.tasks.store import FUNCTION_NAME, ApiPolicy, FunctionSpec
from .core.upstreams import ServerSpec, UpstreamSpec, validate
from .core.upstreams.next import WORDS as NEXT_UPSTREAM_WORDS

_DURATION = re.compile(r"\s*(\d+)\s*(ms|s|m|h)\s*")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000}
_SIZE = re.compile(r"\s*(\d+)\s*(B|KiB|MiB|GiB)?\s*")
_UNIT_BYTES = {None: 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
MAX_SIZE = 64 << 20         # a body or a result is held whole in memory: keep it sane
DEFAULT_SIZE = 1 << 20
#: nginx's proxy_next_upstream as zstalk takes it (core/upstreams/next.py: the failure
#: classes, which also say what counts as a server's failure, and non_idempotent, off)
NEXT_UPSTREAM = NEXT_UPSTREAM_WORDS
#: an origin as a browser sends it (RFC 6454 section 6.2): scheme "://" host [":" port]
_ORIGIN = re.compile(r"([a-z][a-z0-9+.-]*)://(\[[0-9a-f:.]+\]|[^\s/?#@:\[\]*]+)(?::(\d{1,5}))?")
_DEFAULT_PORT = {"http": "80", "https": "443"}
_RATE = re.compile(r"\s*(\d+)\s*/\s*(s|m|h)\s*")
_PER_S = {"s": 1.0, "m": 60.0, "h": 3600.0}
#: the waiting room's pass key file, as --pass-key-file names it to every process
PASS_KEY_FILE_ENV = "ZSTALK_PASS_KEY_FILE"


# -- the keys ------------------------------------------------------------------------------
API, FUNCTIONS, FUNCTION = "[api]", "[functions]", "[functions.NAME]"
UPSTREAM, SERVER = "[upstreams.NAME]", "[upstreams.NAME] servers"
HEALTH = "[upstreams.NAME] health_check"
EVERY = (FUNCTIONS, FUNCTION)       # a default for every function, or one function's own


class Key(NamedTuple):
    """A key of the file: the tables it may be written in, its TOML type, its default as
    it would be written (None: none, or one the help describes) and the unit of a number."""
    tables: tuple[str, ...]
    name: str
    type: str
    default: Any
    unit: str
    help: str


KEYS: tuple[Key, ...] = (
    Key((API,), "public_enqueue", "boolean", False, "",
        "true: a request without the master key may enqueue (without options)"),
    Key((API,), "private_results", "boolean", False, "",
        "true: reading a task needs the master key too"),
    Key((API,), "trust_forwarded", "boolean", False, "",
        "true: a client's address is the first X-Forwarded-For hop (ip_hash, "
        "max_waiting_per_client)"),
    Key((API,), "max_body", "size", "1MiB", "bytes",
        "a bigger request body answers 413"),
    Key((FUNCTIONS,), "base_url", "URL", None, "",
        "a function F is called at base_url/F"),
    Key((FUNCTIONS,), "base_url_any", "boolean", None, "",
        "with base_url: true, any name may be called; false, only the tables' and "
        "functions' names (unset: any name while there are no tables, with a warning "
        "once there are)"),
    Key((FUNCTIONS,), "functions", "list of names", [], "",
        "with base_url: names that may be called, beside the tables'"),
    Key((FUNCTIONS,), "max_result", "size", "1MiB", "bytes",
        "a bigger 2xx body fails the task (no retry)"),
    Key((FUNCTION,), "url", "URL", None, "",
        "where the function is called (needed without base_url or upstream)"),
    Key(EVERY, "upstream", "string", None, "",
        "an [upstreams.NAME] whose servers take the calls, instead of a url"),
    Key((FUNCTION,), "path", "string", None, "",
        "on an upstream: the path after each server's url (default /NAME)"),
    Key(EVERY, "concurrency", "integer", 1, "calls",
        "calls at once (1 to 100000), across dispatchers; also the counter fn:NAME"),
    Key(EVERY, "timeout", "duration", "15s", "ms, s, m, h",
        "per call, unless a task's timeout option says otherwise"),
    Key(EVERY, "max_timeout", "duration", "15m", "ms, s, m, h",
        "the longest timeout a task may ask for"),
    Key(EVERY, "rate", "rate", None, "calls per s, m or h",
        "\"N/s\", \"N/m\" or \"N/h\": at most N calls start per interval, over every "
        "dispatcher (GCRA)"),
    Key(EVERY, "burst", "integer", 0, "calls",
        "calls that may start at once beyond the rate after a quiet spell"),
    Key(EVERY, "queue_timeout", "duration", None, "ms, s, m, h",
        "a task still queued this long after its enqueue fails, uncalled"),
    Key(EVERY, "expected_duration", "duration", None, "ms, s, m, h",
        "the mean call (online: the mean visit) waitTime uses until 10 holds ended in the "
        "last minute, or the last 10 within the hour; then the measured mean"),
    Key(EVERY, "keep_result_after_read", "duration", None, "ms, s, m, h",
        "a finished task is gone this long after a GET by its own token or the master key "
        "(only ever sooner than keepResult; a listing or a read by id alone does not count)"),
    Key(EVERY, "max_pause", "duration", "60s", "ms, s, m, h",
        "the longest pause after a 429 or 503 without Retry-After"),
    Key(EVERY, "request_headers", "list of header names", [], "",
        "headers a request task may set, beside the safe ones"),
    Key(EVERY, "result_headers", "list of header names", [], "",
        "response headers a task keeps, beside Content-Type"),
    Key(EVERY, "next_upstream", "list of strings", ["error", "timeout"], "",
        "what counts as a server's failure and moves a call to the next server within "
        "its attempt (nginx's proxy_next_upstream): " + ", ".join(NEXT_UPSTREAM)),
    Key(EVERY, "next_upstream_tries", "integer", 0, "",
        "the most servers one attempt tries (0: every server that is not down)"),
    Key(EVERY, "next_upstream_timeout", "duration", "0s", "ms, s, m, h",
        "no move once this long has passed since the attempt's first call (0s: none)"),
    Key(EVERY, "connect_timeout", "duration", "5s", "ms, s, m, h",
        "the longest connect of a call to a server"),
    Key(EVERY, "max_fails", "integer", 1, "calls",
        "a plain url: failures (next_upstream) within fail_timeout that shut its host, its "
        "tasks waiting in place; a call that could not connect spends no attempt (0: "
        "never counted, every failure spends one)"),
    Key(EVERY, "fail_timeout", "duration", "10s", "ms, s, m, h",
        "a plain url: the window of max_fails, and how long a shut host waits for its "
        "probe call"),
    Key(EVERY, "online", "string", "master", "",
        "online tasks (a waiting room): \"public\", \"master\" (with the master key) or "
        "\"only\" (online only, public, no url needed)"),
    Key(EVERY, "pass_ttl", "duration", "5m", "ms, s, m, h",
        "how long an admitted user's pass is good (no renewal)"),
    Key(EVERY, "online_heartbeat", "duration", "5m", "ms, s, m, h",
        "a waiting user who does not look (GET the task) this often loses the place"),
    Key(EVERY, "max_waiting_per_client", "integer", 20, "tasks",
        "online tasks that may wait per client address (IPv6 by /64), 1 to 1000000"),
    Key(EVERY, "max_groups", "integer", 10_000, "groups",
        "named groups (the option group) with queued or running tasks a function may have; "
        "a task of one more is a 429 too_many_groups; 1 to 1000000"),
    Key(EVERY, "group_by", "string", "", "",
        "\"client\": a task enqueued without the option group is in its client address's "
        "group (IPv6 by /64); \"header:NAME\": in the group that request header names "
        "(for a gateway that sets it); the option wins; \"\": in none"),
    Key(EVERY, "group_concurrency", "integer", None, "calls",
        "calls at once per group (1 to 100000), across dispatchers (unset: no limit)"),
    Key(EVERY, "group_rate", "rate", None, "calls per s, m or h",
        "\"N/s\", \"N/m\" or \"N/h\": at most N calls of each group start per interval, "
        "over every dispatcher (GCRA)"),
    Key(EVERY, "group_burst", "integer", 0, "calls",
        "calls of a group that may start at once beyond its group_rate"),
    Key(EVERY, "admit_url", "URL", "", "",
        "where an admitted user goes: admitUrl, with the pass in its fragment"),
    Key((FUNCTION,), "opens_at", "offset date-time", None, "",
        "a room event: before it, visitors join a pre-line, admitted in a random draw "
        "made at the opening, later joiners behind; a TOML offset date-time or an RFC "
        "3339 string with Z or an offset (a local time is refused)"),
    Key((FUNCTION,), "closed", "boolean", False, "",
        "true: the line fills, nobody is admitted (SIGHUP with false opens it)"),
    Key((FUNCTION,), "max_waiting", "integer", 0, "tasks",
        "online tasks that may wait at once; one more is a 429 line_full (0: no cap)"),
    Key(EVERY, "room_template", "path", "", "",
        "the waiting page's HTML (GET /room/NAME, online \"public\" or \"only\"): a file, "
        "relative to this one, with one {{ room }} where the room goes; read at start and "
        "on SIGHUP, where an error keeps the page in use (\"\": the built-in page)"),
    Key(EVERY, "allow_origins", "list of origins", [], "",
        "pages (scheme://host[:port], or \"*\") that may call the API from a browser (CORS)"),
    Key((UPSTREAM,), "balance", "string", "round_robin", "",
        "round_robin, least_conn, ip_hash, hash or random, as nginx's upstream module"),
    Key((UPSTREAM,), "key", "string", None, "",
        "for hash: uniqueId, clientIp or params.NAME"),
    Key((UPSTREAM,), "consistent", "boolean", False, "",
        "for hash: ketama consistent hashing"),
    Key((UPSTREAM,), "two", "boolean", False, "",
        "for random: the less loaded of two picks"),
    Key((UPSTREAM,), "servers", "list of tables", None, "",
        "the servers, each { url = \"http://host:port\", ... } with the keys below"),
    Key((UPSTREAM,), "rate", "rate", None, "calls per s, m or h",
        "a rate every function on the upstream shares"),
    Key((UPSTREAM,), "burst", "integer", 0, "calls",
        "the burst of the upstream's rate"),
    Key((UPSTREAM,), "concurrency", "integer", 0, "calls",
        "calls at once on the upstream, every function's together (0: no limit)"),
    Key((UPSTREAM,), "keepalive", "integer", 32, "connections",
        "idle connections each dispatcher keeps open to the upstream's servers, in a pool "
        "of the upstream's own (nginx's keepalive; 0: a connection per call)"),
    Key((UPSTREAM,), "keepalive_timeout", "duration", "60s", "ms, s, m, h",
        "an idle connection is closed after this long"),
    Key((UPSTREAM,), "keepalive_requests", "integer", 1000, "calls",
        "calls one connection carries: the last says Connection: close"),
    Key((UPSTREAM,), "resolve_interval", "duration", "30s", "ms, s, m, h",
        "how often the names of its servers with resolve are looked up (each server may "
        "say its own)"),
    Key((UPSTREAM,), "health_check", "table", None, "",
        "active health checks (nginx Plus's health_check), { path = \"/health\", ... } with "
        "the keys below: a server failing them is skipped by every dispatcher"),
    Key((HEALTH,), "path", "string", "/", "",
        "the path each server is sent a GET on (after its url)"),
    Key((HEALTH,), "interval", "duration", "5s", "ms, s, m, h",
        "how often each server is checked (stretched when every upstream's checks "
        "together would pass 100 probes a second: the start line says so)"),
    Key((HEALTH,), "fails", "integer", 1, "checks",
        "failed checks in a row that make a server unhealthy"),
    Key((HEALTH,), "passes", "integer", 1, "checks",
        "passed checks in a row that make an unhealthy server healthy again"),
    Key((HEALTH,), "status", "list of statuses", ["200-399"], "",
        "the statuses that pass, each a code (404) or a range (\"200-399\")"),
    Key((HEALTH,), "timeout", "duration", "5s", "ms, s, m, h",
        "a check with no answer within this long fails"),
    Key((HEALTH,), "mandatory", "boolean", False, "",
        "true: a server is unhealthy until its first check passes (at start, or added "
        "by a reload)"),
    Key((SERVER,), "url", "URL", None, "",
        "scheme://host[:port]; host[:port] as written is nginx's server string"),
    Key((SERVER,), "weight", "integer", 1, "",
        "the server's share of the calls"),
    Key((SERVER,), "max_fails", "integer", 1, "calls",
        "failures within fail_timeout that make the server failed"),
    Key((SERVER,), "fail_timeout", "duration", "10s", "ms, s, m, h",
        "the window of max_fails, and how long a failed server is skipped"),
    Key((SERVER,), "max_conns", "integer", 0, "calls",
        "calls at once on this server (0: no limit)"),
    Key((SERVER,), "backup", "boolean", False, "",
        "called only while no other server is usable"),
    Key((SERVER,), "down", "boolean", False, "",
        "never called"),
    Key((SERVER,), "slow_start", "duration", "0s", "ms, s, m, h",
        "after the server recovers from failed, comes back from down or is added by a "
        "reload, its weight ramps up from zero over this long (round_robin and least_conn "
        "only; 0: at once)"),
    Key((SERVER,), "resolve", "boolean", False, "",
        "the url names a host: the broker looks it up every resolve_interval and makes "
        "one server per address, each with these parameters, called with the name as "
        "Host (nginx's resolve)"),
    Key((SERVER,), "resolve_interval", "duration", None, "ms, s, m, h",
        "how often this server's name is looked up (unset: its upstream's)"),
)
_DEFAULT = {(table, key.name): key.default for key in KEYS for table in key.tables}


def keys_of(table: str) -> frozenset[str]:
    """The keys a table may hold (a `table` of KEYS, like FUNCTION)."""
    return frozenset(key.name for key in KEYS if table in key.tables)


def _get(entry: dict, table: str, name: str) -> Any:
    """entry[name], or KEYS' default for it in `table`."""
    return entry.get(name, _DEFAULT[table, name])


class ConfigError(Exception):
    """A config file that cannot be used, with the reason."""


class TaskConfig(NamedTuple):
    """What the config file says."""
    named: tuple[FunctionSpec, ...] = ()
    base: FunctionSpec | None = None     # the template for names under base_url
    api: ApiPolicy = ApiPolicy()
    upstreams: tuple[UpstreamSpec, ...] = ()
    max_result_bytes: int = DEFAULT_SIZE
    max_body_bytes: int = DEFAULT_SIZE
    warnings: tuple[str, ...] = ()       # said at start and on SIGHUP; nothing refused
    online_keys: tuple[str, ...] = ()    # where `online` is set ("[functions.NAME] online")
    # each function's room_template as read (name -> its HTML; "" for [functions]' own):
    # the HTTP fronts' waiting pages (Settings.rooms)
    room_pages: dict = {}


#: a room_template's placeholder, and the most a template may be (it travels in Settings)
ROOM_PLACEHOLDER = "{{ room }}"
ROOM_TEMPLATE_MAX_BYTES = 64 * 1024


def load(path: str, pages_in_use: dict | None = None) -> TaskConfig:
    """The config file at `path`.  `pages_in_use`: the room templates read before (SIGHUP),
    which a template that cannot be read now keeps, with a warning naming its file (at
    start, None: such a template is a ConfigError)."""
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    unknown = sorted(set(doc) - {"functions", "api", "upstreams"})
    if unknown:
        raise ConfigError(f"{path}: unknown table [{unknown[0]}] "
                          "(known: [api], [functions], [upstreams])")
    table = doc.get("api", {})
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [api] must be a table")
    _no_unknown(table, keys_of(API), f"{path}: [api]")
    flags = {k: v for k, v in table.items() if k != "max_body"}
    for key, value in flags.items():
        if type(value) is not bool:
            raise ConfigError(f"{path}: [api] {key} must be true or false")
    max_body = size_bytes(_get(table, API, "max_body"), f"{path}: [api] max_body")
    upstreams = _upstreams(doc.get("upstreams", {}), path)
    api = ApiPolicy(**{k: _get(flags, API, k) for k in ApiPolicy._fields})
    fns = functions(doc.get("functions", {}), path, upstreams)
    pages, kept = room_pages(_room_templates(doc.get("functions", {}), path), pages_in_use)
    return fns._replace(api=api, max_body_bytes=max_body, upstreams=tuple(upstreams.values()),
                        room_pages=pages, warnings=fns.warnings + kept)


def _room_templates(table: dict, path: str) -> dict[str, str]:
    """Each function's room_template (\"\" for [functions]' own, which the named ones
    inherit), as a path: relative to the config file's folder, as written otherwise; ""
    where one says "" (the built-in page, whatever [functions] says)."""
    folder = os.path.dirname(os.path.abspath(path))
    default = table.get("room_template", "")
    named = {name: entry.get("room_template", default) for name, entry in table.items()
             if isinstance(entry, dict)}
    files = {"": default, **named} if default else named
    for name, file in files.items():
        if not isinstance(file, str):
            where = f"[functions.{name}]" if name else "[functions]"
            raise ConfigError(f"{path}: {where} room_template must be a file's path")
    return {name: file and os.path.join(folder, file) for name, file in files.items()}


def room_pages(files: dict[str, str], in_use: dict | None) -> tuple[dict, tuple[str, ...]]:
    """The templates read (name -> HTML), and the warnings of those that kept the page in
    use (`in_use`: SIGHUP; None at start, where a template that cannot be read is a
    ConfigError naming its file)."""
    pages, warnings = {}, []
    for name, file in files.items():
        try:
            pages[name] = file and read_room_template(file)
        except ConfigError as exc:
            if in_use is None:
                raise
            warnings.append(f"{exc}: kept the waiting page in use")
            pages[name] = in_use.get(name, "")
    return pages, tuple(warnings)


def read_room_template(file: str) -> str:
    """A room template's HTML: UTF-8, at most ROOM_TEMPLATE_MAX_BYTES, with
    ROOM_PLACEHOLDER exactly once; or a ConfigError naming the file."""
    try:
        with open(file, "rb") as f:
            raw = f.read(ROOM_TEMPLATE_MAX_BYTES + 1)
        text = raw.decode()
    except OSError as exc:
        raise ConfigError(f"room_template {file}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"room_template {file}: not UTF-8") from None
    if len(raw) > ROOM_TEMPLATE_MAX_BYTES:
        raise ConfigError(f"room_template {file}: over {ROOM_TEMPLATE_MAX_BYTES} bytes")
    if text.count(ROOM_PLACEHOLDER) != 1:
        raise ConfigError(f"room_template {file}: needs {ROOM_PLACEHOLDER} exactly once, "
                          "where the room goes")
    return text


def functions(table: Any, path: str = "config", upstreams: dict | None = None) -> TaskConfig:
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [functions] must be a table")
    where = f"{path}: [functions]"
    upstreams = upstreams or {}
    defaults = {k: v for k, v in table.items() if not isinstance(v, dict)}
    _no_unknown(defaults, keys_of(FUNCTIONS), where)
    if "upstream" in defaults:
        if "base_url" in defaults:
            raise ConfigError(f"{where}: base_url and upstream exclude each other")
        _upstream_name(defaults["upstream"], upstreams, f"{where}: upstream")
        # every name F calls path /F on the upstream, as under base_url
        defaults = {**defaults, "base_url": _UPSTREAM_BASE}
    base_url = defaults.get("base_url")
    spec_keys = {k: v for k, v in defaults.items() if k not in ("functions", "base_url_any")}
    template = _spec("", {**spec_keys, "url": base_url or "http://unset"}, where)
    tables = {name: entry for name, entry in table.items() if isinstance(entry, dict)}
    listed = _listed(_get(defaults, FUNCTIONS, "functions"), base_url, where)
    named = {name: _named(name, entry, spec_keys, base_url, f"{path}: [functions.{name}]")
             for name, entry in tables.items()}
    for name in listed:
        named.setdefault(name, template._replace(name=name, path=f"/{name}")
                         if template.upstream else
                         template._replace(name=name, url=_under(base_url, name)))
    for spec in named.values():
        if spec.upstream is not None:
            _upstream_name(spec.upstream, upstreams, f"{path}: [functions.{spec.name}] upstream")
    any_name = defaults.get("base_url_any")
    if any_name is not None and (type(any_name) is not bool or base_url is None):
        raise ConfigError(f"{where}: base_url_any is true or false, and only with base_url")
    if any_name is None:
        any_name = base_url is not None and not named
    max_result = size_bytes(_get(defaults, FUNCTIONS, "max_result"), f"{where} max_result")
    online_keys = (("[functions] online",) if _asks_a_room(defaults) else ()) + tuple(
        f"[functions.{name}] online" for name, entry in tables.items() if _asks_a_room(entry))
    return TaskConfig(tuple(named.values()), template if any_name else None,
                      max_result_bytes=max_result,
                      warnings=_old_rule(path, base_url, tables, defaults),
                      online_keys=online_keys)


def _asks_a_room(entry: dict) -> bool:
    """`online` set to what opens a waiting room to the public ("master", the default,
    written out or not, lets only the master key enqueue online tasks: check_passes)."""
    return entry.get("online", "master") != "master"


def _named(name: str, entry: dict, defaults: dict, base_url: str | None,
           where: str) -> FunctionSpec:
    if not FUNCTION_NAME.fullmatch(name):
        raise ConfigError(f"{where}: a function name is 1 to 64 of A-Z a-z 0-9 _ . : - "
                          "(not starting with a dot)")
    _no_unknown(entry, keys_of(FUNCTION), where)
    if "url" in entry and "upstream" in entry:
        raise ConfigError(f"{where}: url and upstream exclude each other")
    if "path" in entry and "upstream" not in entry and defaults.get("upstream") is None:
        raise ConfigError(f"{where}: path is for functions on an upstream (give upstream)")
    if "url" in entry:          # (its own url, whatever [functions] says)
        defaults = {k: v for k, v in defaults.items() if k != "upstream"}
    if entry.get("online") == "only" and "url" not in entry and "upstream" not in entry:
        entry = {**entry, "url": _ONLINE_ONLY}      # (never called)
    if "url" not in entry and "upstream" not in entry and base_url is None:
        raise ConfigError(f"{where}: url is missing (or give [functions] base_url, or "
                          "an upstream)")
    return _spec(name, {**defaults, "url": _under(base_url, name), **entry}, where)


def _listed(names: Any, base_url: str | None, where: str) -> list[str]:
    """[functions] functions = [...]: names under base_url."""
    if not isinstance(names, list) or not all(
            isinstance(n, str) and FUNCTION_NAME.fullmatch(n) for n in names):
        raise ConfigError(f"{where}: functions is a list of function names")
    if names and base_url is None:
        raise ConfigError(f"{where}: functions lists names under base_url: give base_url")
    return names


def _under(base_url: str | None, name: str) -> str | None:
    return None if base_url is None else f"{base_url.rstrip('/')}/{name}"


#: the base_url a [functions] upstream stands for while the names are read (never called)
_UPSTREAM_BASE = "http://upstream"
_ONLINE_ONLY = "http://online-only"     # the url of a function of online tasks only
_ONLINE = ("public", "master", "only")


def _upstream_name(name: Any, upstreams: dict, where: str) -> str:
    if not isinstance(name, str) or name not in upstreams:
        known = ", ".join(sorted(upstreams)) or "none"
        raise ConfigError(f"{where}: no [upstreams.{name}] (upstreams: {known})")
    return name


def _upstreams(table: Any, path: str) -> dict[str, UpstreamSpec]:
    """[upstreams.NAME] tables, each checked as nginx checks an upstream block."""
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [upstreams] must hold [upstreams.NAME] tables")
    out = {}
    for name, entry in table.items():
        where = f"{path}: [upstreams.{name}]"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where} must be a table")
        _no_unknown(entry, keys_of(UPSTREAM), where)
        concurrency = _integer(entry, "concurrency", _DEFAULT[UPSTREAM, "concurrency"], 0,
                               100_000, where, "0 (none)")
        rate, per_s = _rate(entry.get("rate"), f"{where}: rate")
        burst = _integer(entry, "burst", _DEFAULT[UPSTREAM, "burst"], 0, 1_000_000, where)
        servers = entry.get("servers")
        if not isinstance(servers, list) or not all(isinstance(s, dict) for s in servers):
            raise ConfigError(f"{where}: servers must be a list of server tables "
                              "({ url = \"http://10.0.0.1:8000\", weight = 5 })")
        interval = _get(entry, UPSTREAM, "resolve_interval")    # (its servers' default)
        if not duration_ms(interval, f"{where}: resolve_interval"):
            raise ConfigError(f"{where}: resolve_interval must be above 0")
        spec = UpstreamSpec(name, tuple(_server({"resolve_interval": interval, **s},
                                                f"{where} servers[{i}]")
                                        for i, s in enumerate(servers)),
                            _get(entry, UPSTREAM, "balance"), _get(entry, UPSTREAM, "key"),
                            _get(entry, UPSTREAM, "consistent"), _get(entry, UPSTREAM, "two"),
                            concurrency, rate, per_s, burst, *_keepalive(entry, where),
                            _health(entry.get("health_check"), f"{where} health_check"))
        errors = validate(spec)
        if errors:
            raise ConfigError(f"{where} {errors[0]}")
        key = spec.key
        if key is not None and key not in ("uniqueId", "clientIp") and not (
                key.startswith("params.") and len(key) > len("params.")):
            raise ConfigError(f"{where} key: uniqueId, clientIp or params.NAME, not {key!r}")
        out[name] = spec
    return out


def _keepalive(entry: dict, where: str) -> tuple[int, float, int]:
    """keepalive, keepalive_timeout (seconds) and keepalive_requests, as UpstreamSpec has
    them (validate checks the numbers)."""
    timeout_ms = duration_ms(_get(entry, UPSTREAM, "keepalive_timeout"),
                             f"{where}: keepalive_timeout")
    return (_get(entry, UPSTREAM, "keepalive"), timeout_ms / 1000,
            _get(entry, UPSTREAM, "keepalive_requests"))


def _health(entry: Any, where: str):
    """An upstream's health_check table (None: no checks); the rules are health.py's."""
    if entry is None:
        return None
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: must be a table ({{ path = \"/health\", interval = \"5s\" }})")
    _no_unknown(entry, keys_of(HEALTH), where)
    from .core.upstreams.health import HealthSpec, status_ranges
    seconds = {k: duration_ms(_get(entry, HEALTH, k), f"{where}.{k}") / 1000
               for k in ("interval", "timeout")}
    status = status_ranges(_get(entry, HEALTH, "status"))
    return HealthSpec(_get(entry, HEALTH, "path"), seconds["interval"],
                      _get(entry, HEALTH, "fails"), _get(entry, HEALTH, "passes"), status,
                      seconds["timeout"], _get(entry, HEALTH, "mandatory"))


def _server(entry: dict, where: str) -> ServerSpec:
    _no_unknown(entry, keys_of(SERVER), where)
    seconds = duration_ms(_get(entry, SERVER, "fail_timeout"), f"{where}: fail_timeout") / 1000
    ramp_s = duration_ms(_get(entry, SERVER, "slow_start"), f"{where}: slow_start") / 1000
    interval_s = duration_ms(entry["resolve_interval"], f"{where}: resolve_interval") / 1000
    return ServerSpec(entry.get("url"), *(_get(entry, SERVER, k) for k in ("weight", "max_fails")),
                      seconds, *(_get(entry, SERVER, k) for k in ("max_conns", "backup", "down")),
                      ramp_s, _get(entry, SERVER, "resolve"), interval_s)


def _old_rule(path: str, base_url, tables: dict, defaults: dict) -> tuple[str, ...]:
    """A file that called any name under base_url before 0.2 and now calls only its tables'."""
    if base_url is None or not tables or "base_url_any" in defaults:
        return ()
    return (f"{path}: [functions] has base_url and [functions.NAME] tables, so only "
            f"{', '.join(sorted(tables))}{' and the names in functions' if defaults.get('functions') else ''} "
            f"can be called (before 0.2: any name under base_url); set base_url_any = true "
            f"to call any name, or base_url_any = false to say this is meant",)


def check_passes(fns: TaskConfig, path: str, env=os.environ) -> tuple[str, ...]:
    """A waiting room (a function that sets `online`) gives its admitted users passes
    signed with the HTTP fronts' pass key file.  Without one (--pass-key-file,
    PASS_KEY_FILE_ENV) the file is refused, naming the key (ConfigError), unless insecure
    is allowed (--insecure, ZSTALK_INSECURE=1): then the warning returned says so.
    (`online` unset or "master": online tasks with the master key only, and no room is
    asked for, so a file of offline functions needs no key file.)"""
    if not fns.online_keys or env.get(PASS_KEY_FILE_ENV):
        return ()
    keys = " and ".join(fns.online_keys)
    if insecure(env):
        return (f"{path}: {keys}: no --pass-key-file ({PASS_KEY_FILE_ENV}), so passes are "
                f"not issued: admitted users get none, and the gateway's verify refuses "
                f"every pass (--insecure)",)
    raise ConfigError(f"{path}: {keys} makes a waiting room, whose admitted users need "
                      f"passes: give --pass-key-file ({PASS_KEY_FILE_ENV}), or --insecure "
                      f"to run it without passes")


def core_fields(fns: TaskConfig | None) -> dict:
    """The broker core Config's fields for a config file read (none: no cloud tasks)."""
    if fns is None:
        return {}
    return {"functions": fns.named, "base_function": fns.base, "api": fns.api,
            "max_body_bytes": fns.max_body_bytes, "max_result_bytes": fns.max_result_bytes,
            "upstreams": fns.upstreams, "room_pages": dict(fns.room_pages)}


def _no_unknown(entry: dict, known: set, where: str) -> None:
    unknown = sorted(set(entry) - known)
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(known))})")


def _spec(name: str, entry: dict, where: str) -> FunctionSpec:
    upstream = entry.get("upstream")
    url, path = entry["url"], ""
    if upstream is not None:
        url = ""                        # the server the broker picks for each call
        path = entry.get("path", f"/{name}")
        problem = requests.path_problem(path) if isinstance(path, str) else "not a string"
        if problem or not path:
            raise ConfigError(f"{where}: path must be a URL path like \"/generate\" "
                              f"({problem or 'empty'})")
    elif not isinstance(url, str) or not re.match(r"https?://[^/\s]+", url):
        raise ConfigError(f"{where}: url must be an http:// or https:// URL, not {url!r}")
    concurrency = _integer(entry, "concurrency", _DEFAULT[FUNCTION, "concurrency"], 1, 100_000,
                           where)
    max_timeout = duration_ms(_get(entry, FUNCTION, "max_timeout"), f"{where}: max_timeout")
    timeout = duration_ms(_get(entry, FUNCTION, "timeout"), f"{where}: timeout")
    if not 0 < timeout <= max_timeout:
        raise ConfigError(f"{where}: timeout must be above 0 and at most max_timeout")
    rate, per_s = _rate(entry.get("rate"), f"{where}: rate")
    burst = _integer(entry, "burst", _DEFAULT[FUNCTION, "burst"], 0, 1_000_000, where)
    queue_timeout = entry.get("queue_timeout")
    queue_timeout_ms = 0 if queue_timeout is None else duration_ms(
        queue_timeout, f"{where}: queue_timeout")
    max_pause_ms = duration_ms(_get(entry, FUNCTION, "max_pause"), f"{where}: max_pause")
    if queue_timeout is not None and not queue_timeout_ms or not max_pause_ms:
        raise ConfigError(f"{where}: queue_timeout and max_pause must be above 0")
    request_headers = _header_names(_get(entry, FUNCTION, "request_headers"),
                                    f"{where}: request_headers", requests.header_problem)
    result_headers = _header_names(_get(entry, FUNCTION, "result_headers"),
                                   f"{where}: result_headers", _token_problem)
    next_upstream = _next_upstream(entry, where)
    connect_ms = duration_ms(_get(entry, FUNCTION, "connect_timeout"),
                             f"{where}: connect_timeout")
    online = _get(entry, FUNCTION, "online")
    if online not in _ONLINE:
        raise ConfigError(f"{where}: online is \"public\", \"master\" or \"only\", not {online!r}")
    pass_ttl = duration_ms(_get(entry, FUNCTION, "pass_ttl"), f"{where}: pass_ttl")
    heartbeat = duration_ms(_get(entry, FUNCTION, "online_heartbeat"),
                            f"{where}: online_heartbeat")
    if not pass_ttl or not heartbeat:
        raise ConfigError(f"{where}: pass_ttl and online_heartbeat must be above 0")
    most_waiting = _integer(entry, "max_waiting_per_client",
                            _DEFAULT[FUNCTION, "max_waiting_per_client"], 1, 1_000_000, where)
    admit_url = _get(entry, FUNCTION, "admit_url")
    if admit_url and (not isinstance(admit_url, str) or not re.match(r"https?://[^/\s]+", admit_url)
                      or "#" in admit_url):
        raise ConfigError(f"{where}: admit_url must be an http:// or https:// URL without a "
                          f"fragment (the pass goes there), not {admit_url!r}")
    origins = _origins(_get(entry, FUNCTION, "allow_origins"), f"{where}: allow_origins")
    return FunctionSpec(name, url, concurrency, timeout, max(max_timeout, 1), rate, per_s,
                        burst, queue_timeout_ms, max_pause_ms, request_headers, result_headers,
                        online, pass_ttl, heartbeat, most_waiting, admit_url,
                        upstream, path, next_upstream[0], max(connect_ms, 1), origins,
                        *_groups(entry, where), *_lifecycle(entry, where), *next_upstream[1:],
                        *_room_event(entry, where), *_host_failures(entry, where))


def _next_upstream(entry: dict, where: str) -> tuple[frozenset, int, int]:
    """next_upstream (`off` alone or not at all, as nginx's merge makes `off` clear the
    rest), next_upstream_tries and next_upstream_timeout (ms), as FunctionSpec has them."""
    words = _get(entry, FUNCTION, "next_upstream")
    if not isinstance(words, list) or not all(
            isinstance(n, str) and n in NEXT_UPSTREAM for n in words):
        raise ConfigError(f"{where}: next_upstream is a list of {', '.join(NEXT_UPSTREAM)}")
    if "off" in words and len(set(words)) > 1:
        raise ConfigError(f"{where}: next_upstream = [\"off\"] stands alone (it turns "
                          "every other word off)")
    tries = _integer(entry, "next_upstream_tries", 0, 0, 1_000_000, where)
    timeout_ms = duration_ms(_get(entry, FUNCTION, "next_upstream_timeout"),
                             f"{where}: next_upstream_timeout")
    return frozenset(words), tries, timeout_ms


def _host_failures(entry: dict, where: str) -> tuple[int, float]:
    """max_fails and fail_timeout (seconds), as FunctionSpec has them (a plain url's host:
    components/hosts.py)."""
    max_fails = _integer(entry, "max_fails", _DEFAULT[FUNCTION, "max_fails"], 0, 1_000_000,
                         where)
    fail_timeout_ms = duration_ms(_get(entry, FUNCTION, "fail_timeout"),
                                  f"{where}: fail_timeout")
    if max_fails and not fail_timeout_ms:
        raise ConfigError(f"{where}: fail_timeout must be above 0 (or max_fails 0)")
    return max_fails, fail_timeout_ms / 1000


def _lifecycle(entry: dict, where: str) -> tuple[int, int | None]:
    """expected_duration (0: unset) and keep_result_after_read (None: unset; "0s": gone
    right after the read), as FunctionSpec has them."""
    expected, keep = entry.get("expected_duration"), entry.get("keep_result_after_read")
    expected_ms = 0 if expected is None else duration_ms(expected, f"{where}: expected_duration")
    if expected is not None and not expected_ms:
        raise ConfigError(f"{where}: expected_duration must be above 0")
    return expected_ms, None if keep is None else duration_ms(
        keep, f"{where}: keep_result_after_read")


def _room_event(entry: dict, where: str) -> tuple[float | None, bool, int]:
    """opens_at as wall-clock seconds (None: unset), closed and max_waiting, as
    FunctionSpec has them (room.py says what they do)."""
    closed = _get(entry, FUNCTION, "closed")
    if type(closed) is not bool:
        raise ConfigError(f"{where}: closed must be true or false")
    max_waiting = _integer(entry, "max_waiting", 0, 0, 100_000_000, where, "0 (no cap)")
    opens_at = entry.get("opens_at")
    return (None if opens_at is None else offset_time(opens_at, f"{where}: opens_at"),
            closed, max_waiting)


def offset_time(value: Any, where: str) -> float:
    """A TOML offset date-time (tomllib: an aware datetime) or an RFC 3339 string with
    "Z" or an offset, as POSIX seconds.  A local date-time or a date is refused: the
    opening would depend on the server's timezone (TOML 1.0 section "Local Date-Time":
    it "cannot be converted to an instant in time without additional information")."""
    when = value
    if isinstance(value, str):
        try:
            when = datetime.datetime.fromisoformat(value.strip())
        except ValueError:
            raise ConfigError(f"{where}: {value!r} is not an RFC 3339 date-time, like "
                              f"\"2026-12-24T18:00:00Z\"") from None
    if not isinstance(when, datetime.datetime):
        raise ConfigError(f"{where}: an offset date-time, like 2026-12-24T18:00:00Z or "
                          f"2026-12-24T19:00:00+01:00, not {value!r}")
    if when.tzinfo is None or when.utcoffset() is None:
        raise ConfigError(f"{where}: {when.isoformat()} has no offset (a local time would "
                          f"open at the server's idea of it): give Z or ±hh:mm, like "
                          f"{when.isoformat()}Z")
    return when.timestamp()


def _groups(entry: dict, where: str) -> tuple:
    """The keys of tenant groups: max_groups, group_by, and each group's own limits
    (group_concurrency; group_rate as (N, per_s); group_burst), as FunctionSpec has them."""
    max_groups = _integer(entry, "max_groups", _DEFAULT[FUNCTION, "max_groups"], 1, 1_000_000,
                          where)
    group_by = _get(entry, FUNCTION, "group_by")
    header = group_by[7:] if isinstance(group_by, str) and group_by.startswith("header:") \
        else None
    if group_by not in ("", "client") and not requests.is_token(header):
        raise ConfigError(f"{where}: group_by is \"client\", \"header:NAME\" (NAME a header "
                          f"name, like X-Tenant) or \"\", not {group_by!r}")
    concurrency = entry.get("group_concurrency")
    concurrency = 0 if concurrency is None else _integer(
        entry, "group_concurrency", None, 1, 100_000, where)
    rate, per_s = _rate(entry.get("group_rate"), f"{where}: group_rate")
    burst = _integer(entry, "group_burst", _DEFAULT[FUNCTION, "group_burst"], 0, 1_000_000,
                     where)
    return max_groups, group_by, concurrency, rate, per_s, burst


def _origins(value: Any, where: str) -> tuple[str, ...]:
    """allow_origins: origins as a browser's Origin header spells them (lower case, no
    default port, an IDN host in punycode), or "*" for any; "null" never (any page can
    be a sandboxed iframe, whose origin is null)."""
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where}: a list of origins, like [\"https://shop.example\"] "
                          f"(or [\"*\"]: any), not {value!r}")
    return tuple(dict.fromkeys(_origin(v, where) for v in value))


def _origin(text: str, where: str) -> str:
    if text == "*":
        return text
    if text.strip().lower() == "null":
        raise ConfigError(f"{where}: \"null\" is the origin of sandboxed pages and local "
                          "files, which any site can make: it is never allowed")
    scheme, _, rest = text.partition("://")
    host_port, sep, tail = rest.partition("/")
    if sep or "?" in rest or "#" in rest:
        raise ConfigError(f"{where}: an origin has no path, query or fragment (not even "
                          f"\"/\"): {scheme}://{host_port}, not {text!r}")
    if "*" in host_port:
        raise ConfigError(f"{where}: {text!r}: a wildcard is \"*\" alone (any origin); "
                          "list each site's origin")
    try:
        host_port = host_port.encode("idna").decode("ascii")   # (as browsers send it)
    except UnicodeError:
        pass
    match = _ORIGIN.fullmatch(f"{scheme}://{host_port}".lower())
    if match is None or (match[3] is not None and not 0 < int(match[3]) < 65536):
        raise ConfigError(f"{where}: {text!r} is not an origin: scheme://host[:port], "
                          "like \"https://shop.example\" or \"http://127.0.0.1:8000\"")
    scheme, host, port = match.groups()
    return f"{scheme}://{host}" if port in (None, _DEFAULT_PORT.get(scheme)) else \
        f"{scheme}://{host}:{int(port)}"


def _header_names(value: Any, where: str, problem) -> tuple[str, ...]:
    """A list of header names, each checked by `problem` (None: fine)."""
    if not isinstance(value, list):
        raise ConfigError(f"{where}: a list of header names")
    for name in value:
        why = problem(name)
        if why is not None:
            raise ConfigError(f"{where}: {why}")
    return tuple(value)


def _token_problem(name: Any) -> str | None:
    return None if requests.is_token(name) else f"{name!r} is not a header name"


def _integer(entry: dict, key: str, default: int, low: int, high: int, where: str,
             low_words: str = "") -> int:
    """entry[key] (or `default`): an integer from `low` to `high`, else a ConfigError."""
    value = entry.get(key, default)
    if type(value) is not int or not low <= value <= high:
        raise ConfigError(f"{where}: {key} must be an integer from {low_words or low} "
                          f"to {high}")
    return value


def _rate(value: Any, where: str) -> tuple[int, float]:
    """"300/s" -> (300, 1.0); absent -> (0, 1.0): no rate."""
    if value is None:
        return 0, 1.0
    match = _RATE.fullmatch(value) if isinstance(value, str) else None
    if match is None or not 1 <= int(match[1]) <= 1_000_000:
        raise ConfigError(f"{where}: a rate is \"N/s\", \"N/m\" or \"N/h\" with N from 1 "
                          f"to 1000000 (got {value!r})")
    return int(match[1]), _PER_S[match[2]]


def duration_ms(value: Any, where: str) -> int:
    match = _DURATION.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise ConfigError(f"{where}: a duration is a string with a unit: \"500ms\", \"10s\", "
                          f"\"2m\", \"1h\" (got {value!r})")
    return int(match[1]) * _UNIT_MS[match[2]]


def size_bytes(value: Any, where: str) -> int:
    match = _SIZE.fullmatch(value) if isinstance(value, str) else None
    size = value if type(value) is int else int(match[1]) * _UNIT_BYTES[match[2]] if match else None
    if size is None or not 1 <= size <= MAX_SIZE:
        raise ConfigError(f"{where}: a size is bytes or a string with a unit (\"512KiB\", "
                          f"\"4MiB\"), from 1 byte to {MAX_SIZE >> 20}MiB (got {value!r})")
    return size
