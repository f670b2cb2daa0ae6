"""Servers from DNS (nginx's `server ... resolve`; broker/core/upstreams/group.py
`resolved`) on a fake clock: a resolved name is one peer per address, each a copy of the
server's parameters with the address as its url and the name as its server string (so
the peers of one name share its hash points); addresses that stay keep their state, new
ones start fresh (in slow start, unless it is the name's first lookup), gone ones leave
the picks at once and are shown draining while their calls run; a lookup that found
nothing keeps the last set; the config file and validate take and refuse the keys."""
from __future__ import annotations

import collections

import pytest

from zstalk.broker.config_file import ConfigError, load
from zstalk.broker.core.upstreams import ServerSpec, UpstreamGroup, UpstreamSpec, validate
from zstalk.broker.core.upstreams.hashing import Ring

NAME = "http://api.internal:8000"


def group(*servers: ServerSpec, balance: str = "round_robin", **options) -> UpstreamGroup:
    return UpstreamGroup(UpstreamSpec("g", servers, balance, **options))


def named(**options) -> ServerSpec:
    return ServerSpec(NAME, resolve=True, **options)


def urls(g: UpstreamGroup) -> list[str]:
    return [peer.url for peer in g.peers]


def test_a_name_not_yet_looked_up_is_one_server_at_its_url_as_written():
    g = group(named())
    assert urls(g) == [NAME]
    assert g.peers[0].spec.host is None         # (its own url's Host)


def test_a_lookup_makes_one_peer_per_address_with_the_servers_parameters():
    g = group(named(weight=3, max_fails=2, max_conns=7), ServerSpec("http://10.9.9.9:1"))
    g = g.resolved(NAME, ("10.0.0.5", "10.0.0.6", "fd00::1"), now=1.0)
    assert urls(g) == ["http://10.0.0.5:8000", "http://10.0.0.6:8000", "http://[fd00::1]:8000",
                       "http://10.9.9.9:1"]
    for peer in g.peers[:3]:
        assert (peer.weight, peer.max_fails, peer.max_conns) == (3, 2, 7)
        assert peer.server == "api.internal:8000"       # nginx's server string: the name
        assert peer.spec.host == "api.internal:8000"    # ... and the Host its calls send
    assert g.peers[3].spec.host is None


def test_calls_spread_over_the_addresses_by_weight():
    g = group(named()).resolved(NAME, ("10.0.0.5", "10.0.0.6"), now=0.0)
    seen = collections.Counter()
    for _ in range(10):
        peer = g.pick(None, 0.0)
        g.done(peer, False, 0.0)
        seen[peer.url] += 1
    assert seen == {"http://10.0.0.5:8000": 5, "http://10.0.0.6:8000": 5}


def test_an_address_that_stays_keeps_its_state_and_a_gone_one_leaves_the_picks():
    g = group(named(max_fails=1)).resolved(NAME, ("10.0.0.5", "10.0.0.6"), now=0.0)
    five = g.peers[0]
    g.done(g.pick(None, 0.0), True, 0.0)            # 10.0.0.5 fails
    g = g.resolved(NAME, ("10.0.0.5", "10.0.0.7"), now=1.0)
    assert urls(g) == ["http://10.0.0.5:8000", "http://10.0.0.7:8000"]
    assert g.peers[0] is five and five.failed(1.0)
    picked = [g.pick(None, 1.0 + i) for i in range(3)]      # (10.0.0.5 shut until 10)
    assert [peer.url for peer in picked] == ["http://10.0.0.7:8000"] * 3


def test_a_gone_address_with_calls_in_flight_is_shown_draining_until_they_end():
    g = group(named()).resolved(NAME, ("10.0.0.5", "10.0.0.6"), now=0.0)
    on_five = g.pick(None, 0.0)
    assert on_five.url == "http://10.0.0.5:8000"
    g = g.resolved(NAME, ("10.0.0.6",), now=1.0)
    states = {(v.url, v.state, v.name) for v in g.view(1.0)}
    assert ("http://10.0.0.5:8000", "draining", NAME) in states
    on_five.conns -= 1          # (its call ends: upstream_calls.done, for a peer gone)
    assert [v.url for v in g.view(2.0)] == ["http://10.0.0.6:8000"]


def test_new_addresses_start_in_slow_start_but_not_at_the_names_first_lookup():
    g = group(named(slow_start_s=10.0), ServerSpec("http://10.9.9.9:1"))
    g = g.resolved(NAME, ("10.0.0.5",), now=5.0)
    assert g.peers[0].share(5.0) == 1.0             # the first lookup: as at the start
    g = g.resolved(NAME, ("10.0.0.5", "10.0.0.6"), now=20.0)
    assert g.peers[0].share(20.0) == 1.0 and g.peers[1].share(25.0) == pytest.approx(0.5)


def test_a_lookup_that_found_nothing_or_the_same_keeps_the_group():
    g = group(named()).resolved(NAME, ("10.0.0.5",), now=0.0)
    assert g.resolved(NAME, (), now=1.0) is g
    assert g.resolved(NAME, ("10.0.0.5",), now=1.0) is g
    assert g.resolved("http://other:1", ("10.0.0.6",), now=1.0) is g


def test_a_reload_keeps_the_last_lookup_and_the_peers_state():
    spec = UpstreamSpec("g", (named(weight=1),))
    g = UpstreamGroup(spec).resolved(NAME, ("10.0.0.5", "10.0.0.6"), now=0.0)
    five = g.peers[0]
    g = g.reload(spec._replace(servers=(named(weight=4),)), now=1.0)
    assert g.peers[0] is five and five.weight == 4 and len(g.peers) == 2
    g = g.reload(spec._replace(servers=(ServerSpec(NAME),)), now=2.0)
    assert urls(g) == [NAME]            # (resolve off: the name again)


def test_the_peers_of_one_name_share_its_hash_points_as_nginx_does():
    g = group(named(), ServerSpec("http://other:9"), balance="hash", key="uniqueId",
              consistent=True).resolved(NAME, ("10.0.0.5", "10.0.0.6"), now=0.0)
    ring = g._set.ring
    assert len(ring.hashes) == len(Ring([("api.internal:8000", 1), ("other:9", 1)]).hashes)
    # a key whose point is the name's goes to either address, by smooth weighted round robin
    key = next(k for k in map(str, range(1000))
               if ring.server_at(ring.find(k.encode())) == "api.internal:8000")
    seen = set()
    for _ in range(4):
        peer = g.pick(key, 0.0)
        g.done(peer, False, 0.0)
        seen.add(peer.url)
    assert seen == {"http://10.0.0.5:8000", "http://10.0.0.6:8000"}


def test_resolve_needs_a_name_and_a_positive_interval():
    bad = validate(UpstreamSpec("g", (ServerSpec("http://10.0.0.1:80", resolve=True),
                                      ServerSpec("http://[::1]", resolve=True),
                                      ServerSpec("http://a", resolve=True, resolve_interval_s=0))))
    assert [e.key for e in bad] == ["servers[0].resolve", "servers[1].resolve",
                                    "servers[2].resolve_interval"]


def test_the_config_file_takes_resolve_and_an_interval_per_upstream_or_server(tmp_path):
    path = tmp_path / "zstalk.toml"
    path.write_text('[upstreams.api]\nresolve_interval = "5s"\nservers = [\n'
                    '  { url = "http://api.internal:8000", resolve = true },\n'
                    '  { url = "http://b.internal", resolve = true, resolve_interval = "1m" },\n'
                    ']\n')
    servers = load(str(path)).upstreams[0].servers
    assert [(s.resolve, s.resolve_interval_s) for s in servers] == [(True, 5.0), (True, 60.0)]
    path.write_text('[upstreams.api]\nservers = [{ url = "http://10.0.0.1", resolve = true }]\n')
    with pytest.raises(ConfigError, match=r"zstalk.toml: \[upstreams.api\] servers\[0\].resolve"):
        load(str(path))
    path.write_text('[upstreams.api]\nresolve_interval = "0s"\nservers = [{ url = "http://a" }]\n')
    with pytest.raises(ConfigError, match=r"\[upstreams.api\]: resolve_interval"):
        load(str(path))


# -- the actor's lookups (broker/resolver.py), with a lookup the test answers -------------
def test_the_resolver_looks_each_name_up_when_due_and_warns_once_per_outage(caplog):
    import asyncio
    from zstalk.broker.resolver import Resolver, host_port

    answers = {"api.internal": ("10.0.0.5",)}
    names = [("g", named(resolve_interval_s=5.0))]
    told, asked = [], []

    def look(host: str, port: int) -> tuple:
        asked.append((host, port))
        return answers.get(host, ())

    resolver = Resolver(lambda: names, lambda *a: told.append(a) or True, look)

    async def main() -> None:
        await resolver.round(0.0)
        await resolver.round(4.0)           # not due
        answers.clear()
        await resolver.round(5.0)
        await resolver.round(10.0)          # still out: said once
        answers["api.internal"] = ("10.0.0.6",)
        await resolver.round(15.0)
        names.clear()
        await resolver.round(20.0)          # dropped by a reload: forgotten
    with caplog.at_level("INFO", logger="zstalk.broker"):
        asyncio.run(main())
    assert asked == [("api.internal", 8000)] * 4
    assert told == [("g", NAME, ("10.0.0.5",)), ("g", NAME, ("10.0.0.6",))]
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == [f"upstream g: {NAME} resolves to no address; its servers stay as "
                        "last found"]
    assert resolver.due == {} and resolver.out == set()
    assert host_port("https://a.b") == ("a.b", 443) and host_port("http://a:81") == ("a", 81)


def test_lookup_gives_each_address_once_sorted_ipv4_first():
    from zstalk.broker.resolver import lookup
    found = lookup("localhost", 80)         # (/etc/hosts: no DNS server asked)
    assert found[0] == "127.0.0.1" and len(set(found)) == len(found)


def test_the_broker_shows_each_address_with_its_name_and_forgets_gone_addresses_errors():
    from zstalk.broker.core.tasks.components.upstream_calls import UpstreamCalls
    calls = UpstreamCalls([UpstreamSpec("g", (named(),))])
    assert calls.names() == [("g", named())]
    assert calls.resolved("g", NAME, ("10.0.0.5", "10.0.0.6"), 0.0)
    peer = calls.pick("g", None, 0.0)
    calls.done("g", peer, True, "HTTP 502", 0.0)
    assert calls.servers("g", 0.0, 0.0)[0] == {
        "url": "http://10.0.0.5:8000", "name": NAME, "state": "failed", "inFlight": 0,
        "fails": 1, "usableAt": 10.0, "lastError": "HTTP 502"}
    assert not calls.resolved("g", NAME, ("10.0.0.5", "10.0.0.6"), 1.0)     # (the same)
    assert calls.resolved("g", NAME, ("10.0.0.6",), 1.0)
    assert calls.last_error == {} and calls.pool("g") == ("g", 32, 60_000, 1000)
