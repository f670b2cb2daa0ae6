"""Active health checks (nginx Plus's `health_check`; broker/core/upstreams/health.py) on a
fake clock: the state machine of one server's checks, what an unhealthy server does to
picks, slow start on recovery, the assignment of each server to one dispatcher and its
reassignment when a dispatcher leaves, and the bound on probes per second."""
from __future__ import annotations

import pytest

from zstalk.broker.core.upstreams import ServerSpec, UpstreamGroup, UpstreamSpec, validate
from zstalk.broker.core.upstreams.health import (MAX_PROBES_PER_S, HealthSpec, assign,
                                                 status_ranges, stretch)
from zstalk.broker.core.upstreams.unavailable import NO_LIVE_UPSTREAMS


def group(health: HealthSpec, *names: str, **server) -> UpstreamGroup:
    servers = tuple(ServerSpec(f"http://{n}:1", **server) for n in names)
    return UpstreamGroup(UpstreamSpec("g", servers, health_check=health))


def picks(g: UpstreamGroup, now: float, n: int = 6) -> set[str]:
    got = set()
    for _ in range(n):
        peer = g.pick(None, now)
        if peer is not None:
            g.done(peer, False, now)
            got.add(peer.url)
    return got


def test_a_server_failing_fails_checks_in_a_row_is_skipped_until_it_passes_passes_in_a_row():
    g = group(HealthSpec(fails=2, passes=3), "a", "b")
    a = g.peers[0]
    g.checked(a, False, 1.0)
    assert picks(g, 1.0) == {"http://a:1", "http://b:1"}    # (one fail of two)
    g.checked(a, False, 2.0)
    assert picks(g, 2.0) == {"http://b:1"}
    assert g.view(2.0)[0].state == "unhealthy" and g.view(2.0)[0].last_check == 2.0
    g.checked(a, True, 3.0)
    g.checked(a, False, 4.0)        # (a fail breaks the run of passes)
    for t in (5.0, 6.0):
        assert not g.checked(a, True, t)
    assert picks(g, 6.0) == {"http://b:1"}
    assert g.checked(a, True, 7.0)
    assert picks(g, 7.0) == {"http://a:1", "http://b:1"}


def test_a_new_server_starts_healthy_unless_the_check_is_mandatory():
    assert group(HealthSpec(), "a").view(0.0)[0].up is True
    g = group(HealthSpec(mandatory=True), "a", "b")
    assert [v.state for v in g.view(0.0)] == ["unhealthy", "unhealthy"]
    assert g.pick(None, 0.0) is None
    assert g.unavailable(0.0).reason == NO_LIVE_UPSTREAMS
    g.checked(g.peers[1], True, 1.0)
    assert picks(g, 1.0) == {"http://b:1"}


def test_a_server_back_from_unhealthy_starts_its_slow_start():
    g = group(HealthSpec(), "a", "b", slow_start_s=10.0)
    a = g.peers[0]
    g.checked(a, False, 1.0)
    g.checked(a, True, 5.0)
    view = g.view(6.0)[0]
    assert view.ramp_until == 15.0 and view.share == pytest.approx(0.1)


def test_a_reload_keeps_each_servers_check_state_and_without_checks_all_are_healthy():
    g = group(HealthSpec(), "a", "b")
    g.checked(g.peers[0], False, 1.0)
    again = g.reload(g.spec, 2.0)
    assert again.peers[0].up is False and again.peers[0].check.last_check == 1.0
    plain = g.reload(g.spec._replace(health_check=None), 3.0)
    assert plain.peers[0].up is True and plain.view(3.0)[0].up is None


@pytest.mark.parametrize("health, key", [
    (HealthSpec(path="health"), "health_check.path"),
    (HealthSpec(interval_s=0.0), "health_check.interval"),
    (HealthSpec(fails=0), "health_check.fails"),
    (HealthSpec(passes=1.5), "health_check.passes"),
    (HealthSpec(status=None), "health_check.status"),
    (HealthSpec(mandatory="yes"), "health_check.mandatory"),
])
def test_a_bad_health_check_is_refused_naming_its_key(health, key):
    spec = UpstreamSpec("g", (ServerSpec("http://a:1"),), health_check=health)
    assert [e.key for e in validate(spec)] == [key]


def test_statuses_are_codes_or_inclusive_ranges_within_100_to_599():
    assert status_ranges(["200-399", 404]) == ((200, 399), (404, 404))
    for bad in ([], ["2xx"], ["399-200"], [700], "200"):
        assert status_ranges(bad) is None


def test_each_server_goes_to_one_dispatcher_spread_and_a_joining_one_takes_only_its_share():
    servers = [f"s{i}" for i in range(6)]
    first = assign(servers, ["d1", "d2"], {})
    assert sorted(first.values()) == ["d1"] * 3 + ["d2"] * 3
    joined = assign(servers, ["d1", "d2", "d3"], first)
    assert sorted(joined.values()) == ["d1"] * 2 + ["d2"] * 2 + ["d3"] * 2
    assert sum(joined[s] != first[s] for s in servers) == 2     # (only what d3 took moved)


def test_a_leaving_dispatchers_servers_are_shared_out_and_with_none_no_probes_run():
    servers = [f"s{i}" for i in range(6)]
    first = assign(servers, ["d1", "d2", "d3"], {})
    after = assign(servers, ["d1", "d3"], first)
    assert set(after.values()) == {"d1", "d3"}
    assert all(after[s] == first[s] for s in servers if first[s] != "d2")
    assert sorted(after.values()).count("d1") == 3
    assert assign(servers, [], after) == {}


def test_probes_over_the_bound_stretch_every_interval_by_one_factor():
    assert stretch([1.0] * 50) == 1.0
    factor = stretch([0.5] * 100)           # (200 probes a second)
    assert factor == 2.0
    assert sum(1 / (0.5 * factor) for _ in range(100)) == pytest.approx(MAX_PROBES_PER_S)


def test_the_start_line_says_the_bound_and_a_stretch_when_the_configs_ask_more():
    from zstalk.broker.core.upstreams.health import describe
    servers = tuple(ServerSpec(f"http://s{i}:1") for i in range(300))
    fast = UpstreamSpec("g", servers, health_check=HealthSpec(interval_s=1.0))
    line = describe([fast, UpstreamSpec("plain", servers[:1])])
    assert "300 servers of 1 upstream," in line and f"at most {MAX_PROBES_PER_S} probes/s" in line
    assert "stretched 3.00 times" in line
    assert describe([UpstreamSpec("plain", servers[:1])]) is None


def test_a_group_of_one_unhealthy_server_has_no_live_upstream_and_no_slow_start():
    g = group(HealthSpec(), "a", slow_start_s=10.0)
    g.checked(g.peers[0], False, 1.0)
    assert g.pick(None, 1.0) is None and g.unavailable(1.0).reason == NO_LIVE_UPSTREAMS
    assert g.checked(g.peers[0], True, 2.0)
    assert g.pick(None, 2.0) is g.peers[0] and g.view(2.0)[0].ramp_until is None


def test_the_start_line_counts_one_server_and_one_upstream_in_the_singular():
    from zstalk.broker.core.upstreams.health import counted
    assert [counted(n, "server") for n in (0, 1, 2)] == ["0 servers", "1 server", "2 servers"]
