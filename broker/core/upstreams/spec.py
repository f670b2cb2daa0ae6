"""An upstream group as configured: its servers, its balancing method, and nginx's rules
for both, checked into errors as data.

A server is `scheme://host[:port]` with no path.  Its `host[:port]`, exactly as written,
plays the part of nginx's server string (`server 10.0.0.1:8000;`): the consistent hash
builds its points from it (ngx_http_upstream_hash_module.c, ngx_http_upstream_update_chash),
so `http://a:80` and `http://a` are different points, as `a:80` and `a` are in nginx.

Defaults and refusals follow nginx's `server` directive (ngx_http_upstream.c,
ngx_http_upstream_server): weight=1 max_fails=1 fail_timeout=10s, max_conns=0 (no limit);
weight=0 is invalid; `backup` is a parameter only round robin and least_conn accept
(the hash, ip_hash and random modules leave NGX_HTTP_UPSTREAM_BACKUP out of their flags),
and so is nginx Plus's `slow_start` ("cannot be used along with the hash, ip_hash, and
random load balancing methods", its `server` directive's documentation);
an upstream needs a server that is not a backup (ngx_http_upstream_init_round_robin:
"no servers in upstream").  `consistent` belongs to `hash`, `two` to `random`, as they
are arguments of those directives.

zstalk's own rules: a url appears once per upstream (a server keeps its state across a
reload by its url as written, so two servers may not share one; nginx accepts a repeated
`server` line), and a DNS name is one server (nginx expands it to every address).

An upstream's `health_check` (nginx Plus's active checks) is checked in health.py.

`validate` returns every problem as a `SpecError` naming the key; the config-file layer
prefixes the file and the table.
"""
from __future__ import annotations

import re
from typing import NamedTuple

BALANCES = ("round_robin", "least_conn", "ip_hash", "hash", "random")
BACKUP_BALANCES = ("round_robin", "least_conn")     # (and slow_start's)
SCHEMES = ("http", "https")
# host: a name or IPv4 address, or an IPv6 address in brackets; then an optional :port
_HOST_PORT = re.compile(r"(?:[A-Za-z0-9_.-]+|\[[0-9A-Fa-f:.]+\])(?::(\d{1,5}))?")


class ServerSpec(NamedTuple):
    """One `server` line: nginx's parameters with its defaults."""
    url: str
    weight: int = 1
    max_fails: int = 1              # 0: failures are never counted against the server
    fail_timeout_s: float = 10.0
    max_conns: int = 0              # 0: no limit
    backup: bool = False
    down: bool = False
    slow_start_s: float = 0.0       # nginx Plus's slow_start (peer.py: the ramp); 0: none

    @property
    def server(self) -> str:
        """`host[:port]` exactly as written: nginx's server string for hash points."""
        return self.url.partition("://")[2]


class UpstreamSpec(NamedTuple):
    """One `upstream` block: a name, a balancing method and the servers in order."""
    name: str
    servers: tuple[ServerSpec, ...]
    balance: str = "round_robin"
    key: str | None = None          # balance="hash": the key selector, opaque here
    consistent: bool = False        # balance="hash": ketama (`hash $key consistent`)
    two: bool = False               # balance="random": least_conn of two draws
    # zstalk's, not nginx's: limits every function on the upstream shares (0: none)
    concurrency: int = 0
    rate: int = 0                   # calls per `per_s` seconds
    per_s: float = 1.0
    burst: int = 0
    health_check: object = None     # nginx Plus's active checks: a health.HealthSpec


class SpecError(NamedTuple):
    """A refusal: the key it names ("balance", "servers[2].weight") and why."""
    key: str
    message: str

    def __str__(self) -> str:
        return f"{self.key}: {self.message}"


def url_error(url: object) -> str | None:
    """Why `url` is not `http[s]://host[:port]`, or None."""
    if not isinstance(url, str):
        return "must be a string like \"http://10.0.0.1:8000\""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in SCHEMES:
        return f"must start with http:// or https://, not {url!r}"
    match = _HOST_PORT.fullmatch(rest)
    if match is None:
        return f"must be scheme://host[:port] with no path, query or user, not {url!r}"
    if match[1] is not None and not 1 <= int(match[1]) <= 65535:
        return f"has a port out of 1-65535: {url!r}"
    return None


def _is_int(value: object, least: int) -> bool:
    return type(value) is int and value >= least


def server_errors(server: ServerSpec, where: str, balance: str) -> list[SpecError]:
    """nginx's checks of one `server` line (`where` is its key, e.g. "servers[1]")."""
    errors = []
    problem = url_error(server.url)
    if problem:
        errors.append(SpecError(f"{where}.url", problem))
    if not _is_int(server.weight, 1):
        errors.append(SpecError(f"{where}.weight", "must be an integer of at least 1"))
    for name in ("max_fails", "max_conns"):
        if not _is_int(getattr(server, name), 0):
            errors.append(SpecError(f"{where}.{name}", "must be an integer of at least 0"))
    for name, value in (("fail_timeout", server.fail_timeout_s),
                        ("slow_start", server.slow_start_s)):
        if type(value) not in (int, float) or not 0 <= value < float("inf"):
            errors.append(SpecError(f"{where}.{name}", "must be a duration of at least 0"))
    for name in ("backup", "down"):
        if type(getattr(server, name)) is not bool:
            errors.append(SpecError(f"{where}.{name}", "must be true or false"))
    if server.backup is True and balance not in BACKUP_BALANCES:
        errors.append(SpecError(f"{where}.backup", f"balance = {balance!r} does not support "
                                "backup servers (only round_robin and least_conn do)"))
    if server.slow_start_s and balance not in BACKUP_BALANCES:
        errors.append(SpecError(f"{where}.slow_start", f"balance = {balance!r} does not "
                                "support slow_start (only round_robin and least_conn do)"))
    return errors


def _method_errors(spec: UpstreamSpec) -> list[SpecError]:
    """The balancing method and the arguments that belong to it."""
    if spec.balance not in BALANCES:
        return [SpecError("balance", f"must be one of {', '.join(BALANCES)}, "
                                     f"not {spec.balance!r}")]
    errors = []
    if spec.balance == "hash" and (not isinstance(spec.key, str) or not spec.key):
        errors.append(SpecError("key", "balance = \"hash\" needs a key"))
    if spec.balance != "hash" and spec.key is not None:
        errors.append(SpecError("key", "is only for balance = \"hash\""))
    if type(spec.consistent) is not bool or spec.consistent and spec.balance != "hash":
        errors.append(SpecError("consistent", "is true or false, and only for "
                                              "balance = \"hash\""))
    if type(spec.two) is not bool or spec.two and spec.balance != "random":
        errors.append(SpecError("two", "is true or false, and only for balance = \"random\""))
    return errors


def validate(spec: UpstreamSpec) -> list[SpecError]:
    """Every reason nginx (or zstalk, for repeated urls) would refuse `spec`; [] if none."""
    errors = _method_errors(spec)
    servers = spec.servers
    if not isinstance(servers, (tuple, list)) or not servers:
        return errors + [SpecError("servers", "must list at least one server")]
    seen: dict[str, int] = {}
    for i, server in enumerate(servers):
        where = f"servers[{i}]"
        if not isinstance(server, ServerSpec):
            errors.append(SpecError(where, "must be a server table"))
            continue
        errors += server_errors(server, where, spec.balance)
        if server.url in seen:
            errors.append(SpecError(f"{where}.url", f"repeats servers[{seen[server.url]}] "
                                    "(give one server a higher weight instead)"))
        seen.setdefault(server.url, i)
    if all(isinstance(s, ServerSpec) and s.backup is True for s in servers):
        errors.append(SpecError("servers", "needs a server that is not a backup"))
    if spec.health_check is not None:
        from .health import health_errors      # (loads only for an upstream with checks)
        errors += [SpecError(*error) for error in health_errors(spec.health_check)]
    return errors
