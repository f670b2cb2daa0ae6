"""The broker's lookups of resolved names: each server with `resolve = true` (nginx's
`server ... resolve`; core/upstreams/spec.py) is looked up every `resolve_interval`, off
the core, and each answer goes to the core as a sorted set of addresses, where its
upstream's peers follow it (core/upstreams/group.py `resolved`).

The lookup is the system's resolver, getaddrinfo(3) on the loop's default executor (a
thread: the call blocks), so a name is found as every other program on the host finds
it: /etc/hosts first (in a network namespace, `ip netns exec` binds /etc/netns/NAME/hosts
over it), then DNS, as nsswitch.conf says.  A Kubernetes headless Service's name gives
the addresses of its ready pods (docs/kubernetes.md).  The addresses are sorted (IPv4
before IPv6, each by value), because resolvers rotate their answers and a hash method
walks the peers in order: the map must not move with the rotation.

A lookup that fails or finds nothing keeps the last set (the core leaves the peers
alone) and is warned about once per outage, naming the upstream and the name; the first
answer after it is said at info.  Which names to look up is asked of the core before
every round (`names`), so a reload that adds, drops or changes a server is followed
within RECHECK_S without telling us; a name's first lookup runs at once.

The rounds run as one asyncio task beside the actor, started when the config has a
server with `resolve` (`start`) and cancelled at close.  State here is one deadline and
one outage flag per name the core still lists: names it drops are forgotten.
"""
from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import time
from typing import Callable

log = logging.getLogger("zstalk.broker")

#: how often the list of names is asked for again when no lookup is due sooner (a
#: reload, or the task family built on the first dispatcher's Hello, adds names)
RECHECK_S = 1.0
_PORTS = {"http": 80, "https": 443}

Names = Callable[[], list]          # () -> [(upstream, ServerSpec)]
Found = Callable[[str, str, tuple], bool]   # (upstream, url, addresses) -> changed


def host_port(url: str) -> tuple[str, int]:
    """The name and port a server's url as written connects to."""
    scheme, _, rest = url.partition("://")
    host, colon, port = rest.rpartition(":")
    if not colon or not port.isdigit():
        return rest, _PORTS[scheme]
    return host, int(port)


def lookup(host: str, port: int) -> tuple[str, ...]:
    """The sorted addresses getaddrinfo gives for `host` (blocking; none on an error)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return ()
    found = {info[4][0].partition("%")[0] for info in infos
             if info[0] in (socket.AF_INET, socket.AF_INET6)}
    addresses = map(ipaddress.ip_address, found)
    return tuple(str(a) for a in sorted(addresses, key=lambda a: (a.version, a)))


class Resolver:
    """The rounds of lookups of one broker actor."""

    def __init__(self, names: Names, found: Found, look=lookup) -> None:
        self.names = names
        self.found = found
        self.look = look
        self.due: dict[tuple[str, str], float] = {}     # (upstream, url) -> next lookup
        self.out: set[tuple[str, str]] = set()          # ... whose last lookup failed
        self.task: asyncio.Task | None = None

    def start(self) -> None:
        """Run the rounds on the running loop (again after `stop`: a no-op if running)."""
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self.run())

    def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            self.task = None

    async def run(self) -> None:
        while True:
            try:
                await self.round(time.monotonic())
            except Exception:       # (a bug: say it, and keep the lookups going)
                log.exception("looking up the upstreams' names failed")
            wait = min((*self.due.values(), time.monotonic() + RECHECK_S)) - time.monotonic()
            await asyncio.sleep(max(wait, 0.01))

    async def round(self, now: float) -> None:
        """Look up every name whose time has come, together."""
        live = {(upstream, server.url): server for upstream, server in self.names()}
        self.due = {key: at for key, at in self.due.items() if key in live}
        self.out &= live.keys()
        due = [(key, server) for key, server in live.items()
               if self.due.get(key, now) <= now]
        for key, server in due:
            self.due[key] = now + server.resolve_interval_s
        loop = asyncio.get_running_loop()
        answers = await asyncio.gather(*(loop.run_in_executor(None, self.look,
                                                              *host_port(server.url))
                                         for _, server in due))
        for (key, _), addresses in zip(due, answers):
            self._tell(key, addresses)

    def _tell(self, key: tuple[str, str], addresses: tuple[str, ...]) -> None:
        upstream, url = key
        if not addresses:
            if key not in self.out:
                self.out.add(key)
                log.warning("upstream %s: %s resolves to no address; its servers stay as "
                            "last found", upstream, url)
            return
        if key in self.out:
            self.out.discard(key)
            log.info("upstream %s: %s resolves again", upstream, url)
        if self.found(upstream, url, addresses):
            log.info("upstream %s: %s is now %s", upstream, url, ", ".join(addresses))
