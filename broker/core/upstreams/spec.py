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

zstalk's own rule: a url appears once per upstream (a server keeps its state across a
reload by its url as written, so two servers may not share one; nginx accepts a repeated
`server` line).

A DNS name is one server, resolved by the dispatcher's HTTP client as it connects,
unless the server says `resolve = true` (nginx's `server ... resolve`, open source since
1.27.3): then the broker resolves the name every `resolve_interval_s` and the group makes
one peer per address (group.py `resolved`), each a copy of the server's parameters whose
url is the address (`http://10.0.0.5:8000`) and whose `written` is the url as written:
its server string, so the peers of one name share its hash points as nginx's do (the
consistent hash's ring drops the repeated points and picks among the peers of a point
by smooth weighted round robin, balance.py), and the Host (and TLS SNI) of its calls.
`resolve` needs a name, not an address.

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
_IPV4 = re.compile(r"\d{1,3}(?:\.\d{1,3}){3}")


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
    resolve: bool = False           # nginx's `resolve`: one peer per address of the name
    resolve_interval_s: float = 30.0    # ... looked up again this often
    written: str = ""               # a peer of a resolved name: the url as written (its
    #                                 `url` is then the address's)

    @property
    def server(self) -> str:
        """`host[:port]` exactly as written: nginx's server string for hash points (a
        resolved name's, for each of its peers)."""
        return (self.written or self.url).partition("://")[2]

    @property
    def host(self) -> str | None:
        """The Host a call to a peer of a resolved name sends (None: its url's own)."""
        return self.server if self.written else None

    def at(self, address: str) -> ServerSpec:
        """The peer of this server (`resolve`) at `address` (an IP address as text)."""
        scheme, _, rest = self.url.partition("://")
        port = _HOST_PORT.fullmatch(rest)[1]
        host = f"[{address}]" if ":" in address else address
        return self._replace(url=f"{scheme}://{host}{':' + port if port else ''}",
                             written=self.url)


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
    # nginx's keepalive (idle connections each dispatcher keeps to the upstream's servers,
    # its default since 1.29.7), keepalive_timeout and keepalive_requests
    keepalive: int = 32
    keepalive_timeout_s: float = 60.0
    keepalive_requests: int = 1000
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


def _is_address(url: str) -> bool:
    """Whether a valid url's host is an IP address (IPv6 in brackets, or IPv4)."""
    rest = url.partition("://")[2]
    return rest.startswith("[") or bool(_IPV4.fullmatch(rest.partition(":")[0]))


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
    if type(server.resolve_interval_s) not in (int, float) or not (
            0 < server.resolve_interval_s < float("inf")):
        errors.append(SpecError(f"{where}.resolve_interval", "must be a duration above 0"))
    if server.resolve is True and not problem and _is_address(server.url):
        errors.append(SpecError(f"{where}.resolve", "needs a url that names a host, not "
                                f"an address: {server.url!r}"))
    for name in ("backup", "down", "resolve"):
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


def _keepalive_errors(spec: UpstreamSpec) -> list[SpecError]:
    errors = []
    if not _is_int(spec.keepalive, 0):
        errors.append(SpecError("keepalive", "must be an integer of at least 0"))
    if not _is_int(spec.keepalive_requests, 1):
        errors.append(SpecError("keepalive_requests", "must be an integer of at least 1"))
    if type(spec.keepalive_timeout_s) not in (int, float) or not (
            0 < spec.keepalive_timeout_s < float("inf")):
        errors.append(SpecError("keepalive_timeout", "must be a duration above 0"))
    return errors


def validate(spec: UpstreamSpec) -> list[SpecError]:
    """Every reason nginx (or zstalk, for repeated urls) would refuse `spec`; [] if none."""
    errors = _method_errors(spec) + _keepalive_errors(spec)
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
