"""Slow start (nginx Plus's `slow_start`; broker/core/upstreams/peer.py) on a fake clock:
a server's weight ramps from (almost) zero to its weight over the period after its probe
succeeds, after a reload adds it or brings it back from down, and under least_conn its
conns are weighed by the ramped weight; a group of one and the broker's start never ramp;
hash, ip_hash and random refuse it as nginx Plus does."""
from __future__ import annotations

import pytest

from zstalk.broker.core.upstreams import ServerSpec, UpstreamGroup, UpstreamSpec, validate
from zstalk.broker.core.upstreams.peer import MIN_SHARE


def spec(*servers: ServerSpec, balance: str = "round_robin") -> UpstreamSpec:
    return UpstreamSpec("g", servers, balance)


def server(name: str, **options) -> ServerSpec:
    return ServerSpec(f"http://{name}:1", **options)


def share_of(g: UpstreamGroup, name: str, start: float, end: float, calls: int) -> float:
    """The share of `calls` picks spread evenly over [start, end) that went to `name`."""
    got = 0
    for i in range(calls):
        now = start + (end - start) * i / calls
        peer = g.pick(None, now)
        g.done(peer, False, now)
        got += peer.url == f"http://{name}:1"
    return got / calls


def recovered_at_10(g: UpstreamGroup) -> None:
    """Server a fails at 0 (fail_timeout 10 s), and its probe at 10 succeeds."""
    a = g.peers[0]
    while (peer := g.pick(None, 0)) is not a:
        g.done(peer, False, 0)
    g.done(a, True, 0)
    while (peer := g.pick(None, 10)) is not a:
        g.done(peer, False, 10)
    g.done(a, False, 10)


def test_a_recovered_servers_share_of_calls_grows_over_its_slow_start_then_is_its_weights():
    g = UpstreamGroup(spec(server("a", weight=10, slow_start_s=10.0), server("b", weight=10)))
    recovered_at_10(g)
    windows = [share_of(g, "a", t, t + 2.5, 400) for t in (10, 12.5, 15, 17.5, 20, 22.5)]
    # (a's weight at t is 10 (t - 10) / 10: its expected share s/(1+s) climbs from 0 to 1/2)
    assert windows[:4] == sorted(windows[:4]), windows
    assert windows[0] < 0.15 and 0.35 < windows[3] < 0.5, windows
    assert all(abs(w - 0.5) <= 0.01 for w in windows[4:]), windows


def test_without_slow_start_a_recovered_server_takes_its_full_share_at_once():
    g = UpstreamGroup(spec(server("a", weight=10), server("b", weight=10)))
    recovered_at_10(g)
    assert abs(share_of(g, "a", 10, 12.5, 400) - 0.5) <= 0.01


def test_a_reload_starts_the_slow_start_of_a_server_it_adds_or_brings_back_from_down():
    first = spec(server("a", slow_start_s=10.0), server("b", slow_start_s=10.0, down=True))
    g = UpstreamGroup(first)
    assert [p.share(0) for p in g.peers] == [1.0, 1.0]      # (the broker's start: no ramp)
    again = spec(server("a", slow_start_s=10.0), server("b", slow_start_s=10.0),
                 server("c", slow_start_s=10.0))
    g = g.reload(again, now=100)
    a, b, c = g.peers
    assert a.share(100) == 1.0                              # (kept, and up: no ramp)
    assert b.share(105) == c.share(105) == pytest.approx(0.5)
    assert b.share(110) == c.share(110) == 1.0
    view = {v.url: v for v in g.view(105)}
    assert view["http://a:1"].ramp_until is None
    assert view["http://c:1"].ramp_until == 110 and view["http://c:1"].share == pytest.approx(0.5)


def test_a_ramp_starts_near_zero_never_at_it():
    g = UpstreamGroup(spec(server("a", slow_start_s=10.0), server("b")))
    g.peers[0].ramp_up(50)
    assert g.peers[0].share(50) == MIN_SHARE and g.peers[0].weight_at(50) > 0


def test_least_conn_weighs_a_ramping_servers_conns_by_its_ramped_weight():
    g = UpstreamGroup(spec(server("a", slow_start_s=10.0), server("b"), balance="least_conn"))
    a, b = g.peers
    a.ramp_up(0)
    a.conns, b.conns = 1, 5             # (a at 1/10 of its weight: 1 call weighs as 10)
    assert g.pick(None, 1) is b
    a.conns, b.conns = 1, 5
    assert g.pick(None, 5) is a         # (at 1/2: 1 call weighs as 2, fewer than 5)


def test_a_group_of_one_ignores_slow_start():
    g = UpstreamGroup(spec(server("a", slow_start_s=10.0)))
    g = g.reload(spec(server("a", slow_start_s=10.0)), now=0)
    assert g.view(1)[0].ramp_until is None


@pytest.mark.parametrize("balance", ["hash", "ip_hash", "random"])
def test_slow_start_is_refused_with_the_methods_nginx_plus_refuses_it_with(balance):
    bad = UpstreamSpec("g", (server("a", slow_start_s=5.0), server("b")), balance,
                       key="uniqueId" if balance == "hash" else None)
    assert [str(e) for e in validate(bad)] == [
        f"servers[0].slow_start: balance = {balance!r} does not support slow_start (only "
        "round_robin and least_conn do)"]


def write(tmp_path, balance: str, slow_start: str):
    path = tmp_path / "zstalk.toml"
    path.write_text(f"""
[upstreams.api]
balance = "{balance}"
servers = [{{ url = "http://127.0.0.1:3101", slow_start = "{slow_start}" }},
           {{ url = "http://127.0.0.1:3102" }}]
[functions.hello]
upstream = "api"
""")
    return str(path)


def test_the_config_files_slow_start_is_a_duration_on_a_server(tmp_path):
    from zstalk.broker import config_file
    loaded = config_file.load(write(tmp_path, "least_conn", "30s"))
    (api,) = loaded.upstreams
    servers = api.servers
    assert [s.slow_start_s for s in servers] == [30.0, 0.0]


@pytest.mark.parametrize("balance, slow_start, said", [
    ("random", "30s", "[upstreams.api] servers[0].slow_start: balance = 'random' does not "
                      "support slow_start"),
    ("round_robin", "soon", "[upstreams.api] servers[0]: slow_start: a duration is a string "
                            "with a unit"),
])
def test_a_bad_slow_start_is_refused_naming_the_file_and_the_key(tmp_path, balance,
                                                                 slow_start, said):
    from zstalk.broker import config_file
    path = write(tmp_path, balance, slow_start)
    with pytest.raises(config_file.ConfigError) as refused:
        config_file.load(path)
    assert str(refused.value).startswith(path) and said in str(refused.value), refused.value
