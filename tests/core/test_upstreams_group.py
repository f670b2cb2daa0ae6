"""One upstream group's state on a fake clock: nginx's failure accounting
(ngx_http_upstream_free_round_robin_peer_locked and the probe in every get_peer),
zstalk's pauses, when a server is usable again, and reloads."""
from __future__ import annotations

import random

import pytest
from hypothesis import given, settings, strategies as st

from zstalk.broker.core.upstreams import (
    BUSY, NO_LIVE_UPSTREAMS, ServerSpec, Unavailable, UpstreamGroup, UpstreamSpec, reload_groups,
)
from zstalk.broker.core.upstreams.spec import BALANCES


def servers(*specs: str, **common) -> tuple[ServerSpec, ...]:
    """'a' or 'a weight=3 max_fails=2 backup' -> ServerSpec('http://a:1', ...)."""
    out = []
    for text in specs:
        name, *params = text.split()
        options = dict(common)
        for param in params:
            key, _, value = param.partition("=")
            options[key] = True if not value else float(value) if key == "fail_timeout_s" else int(value)
        out.append(ServerSpec(f"http://{name}:1", **options))
    return tuple(out)


def group(*specs: str, balance: str = "round_robin", **common) -> UpstreamGroup:
    return UpstreamGroup(UpstreamSpec("g", servers(*specs, **common), balance))


def by_host(g: UpstreamGroup) -> dict:
    return {p.url[7]: p for p in g.peers}


def call(g: UpstreamGroup, now: float, failed: bool = False) -> str | None:
    peer = g.pick(None, now)
    if peer is None:
        return None
    g.done(peer, failed, now)
    return peer.url[7]


def take(g: UpstreamGroup, name: str, now: float):
    """Calls until `name` is picked (the others end well): that pick, still in flight."""
    for _ in range(100):
        peer = g.pick(None, now)
        if peer.url[7] == name:
            return peer
        g.done(peer, False, now)
    raise AssertionError(f"{name} is never picked")


def test_a_failure_shuts_a_server_for_fail_timeout_then_one_probe_reopens_it():
    g = group("a", "b")
    a = by_host(g)["a"]
    assert g.pick(None, 0) is a
    g.done(a, True, 0)                                  # fails 1 of max_fails 1
    assert (a.fails, a.accessed, a.checked) == (1, 0, 0)
    assert [call(g, t) for t in (1, 5, 9.999)] == ["b", "b", "b"]
    probe = take(g, "a", 10)                            # fail_timeout passed: usable
    assert probe is a and a.checked == 10               # the probe moves `checked`
    assert [call(g, 10.5) for _ in range(3)] == ["b", "b", "b"]     # a shut while probed
    g.done(a, False, 11)                                # accessed 0 < checked 10: fails 0
    assert a.fails == 0 and "a" in [call(g, 11), call(g, 11)]


def test_a_failed_probe_shuts_the_server_for_another_fail_timeout():
    g = group("a", "b", fail_timeout_s=30)
    a = by_host(g)["a"]
    g.done(g.pick(None, 0), True, 0)
    call(g, 1)
    take(g, "a", 30)
    g.done(a, True, 31)
    assert (a.fails, a.checked) == (2, 31)
    assert [call(g, t) for t in (32, 60, 60.9)] == ["b", "b", "b"]
    # usable again, a climbs from effective weight 0: b, b, then a
    assert a.usable(61) and [call(g, 61) for _ in range(3)] == ["b", "b", "a"]


def test_effective_weight_falls_by_weight_over_max_fails_and_climbs_one_a_pass():
    g = group("a weight=6 max_fails=3", "b weight=6 max_fails=3")
    a = by_host(g)["a"]
    g.done(take(g, "a", 0), True, 0)                    # 6 - 6 // 3
    assert (a.fails, a.effective_weight) == (1, 4)
    assert [call(g, 1), a.effective_weight] == ["b", 5]     # a took part in that pass
    assert [call(g, 1), a.effective_weight] == ["b", 6]
    g.done(take(g, "a", 1), True, 1)
    g.done(take(g, "a", 1), True, 1)                    # fails 3 of 3: shut
    assert a.fails == 3 and not a.usable(1)


def test_effective_weight_never_goes_below_zero():
    g = group("a weight=3", "b")
    a = by_host(g)["a"]
    g.done(g.pick(None, 0), True, 0)
    assert a.effective_weight == 0                      # 3 - 3 // 1


def test_max_fails_0_never_shuts_a_server_nor_lowers_its_weight():
    g = group("a weight=2 max_fails=0", "b")
    a = by_host(g)["a"]
    for _ in range(6):
        peer = g.pick(None, 0)
        g.done(peer, peer is a, 0)
    assert a.fails == 4 and a.effective_weight == 2 and a.usable(0)


def test_a_success_resets_fails_only_after_a_probe_moved_checked():
    g = group("a max_fails=3", "b max_fails=3")
    a = by_host(g)["a"]
    g.done(g.pick(None, 0), True, 0)                    # a: fails 1, accessed = checked = 0
    call(g, 1)                                          # b
    assert call(g, 2) == "a" and a.fails == 1           # checked 0 = accessed: no reset
    picks = [call(g, 10) for _ in range(2)]             # fail_timeout passed: a probe
    assert "a" in picks and a.fails == 0 and a.checked == 10


def test_a_group_of_one_server_never_counts_failures():
    g = group("a max_fails=1")
    a = by_host(g)["a"]
    for t in range(5):
        assert g.pick(None, t) is a
        g.done(a, True, t)
        assert a.fails == 0 and a.effective_weight == 1
    assert g.next_usable(5) == 5


def test_one_primary_with_a_backup_is_not_a_group_of_one():
    g = group("a", "b backup")
    assert [call(g, 0, failed=True), call(g, 1), call(g, 2)] == ["a", "b", "b"]
    assert call(g, 10) == "a"


def test_the_probe_happens_on_any_pick_after_fail_timeout_not_only_after_failures():
    g = group("a", "b")
    a = by_host(g)["a"]
    assert [call(g, t) for t in (0, 5, 7, 8)] == ["a", "b", "a", "b"]
    assert a.checked == 0                               # 7 is within fail_timeout of 0
    assert call(g, 12) == "a" and a.checked == 12


def test_a_paused_server_is_skipped_until_its_time_and_is_not_failed():
    g = group("a", "b", "c")
    a, b, c = by_host(g).values()
    g.pause(a, 30)
    g.pause(a, 20)                                      # of two answers, the later end
    assert [call(g, t) for t in (0, 1, 2, 3)] == ["b", "c", "b", "c"]
    assert a.fails == 0 and a.paused_until == 30
    assert call(g, 30) == "a"


def test_when_every_server_is_down_there_are_no_live_upstreams():
    g = group("a down", "b down backup")
    assert g.pick(None, 0) is None
    assert g.unavailable(0) == Unavailable(NO_LIVE_UPSTREAMS, None)


def test_when_every_server_is_failed_or_paused_the_group_is_busy_until_the_first_returns():
    g = group("a fail_timeout_s=30", "b", "c down")
    a, b, _ = by_host(g).values()
    g.done(g.pick(None, 0), True, 0)                    # a until 30
    g.pause(b, 12)
    assert g.pick(None, 5) is None
    assert g.unavailable(5) == Unavailable(BUSY, 12)
    assert g.pick(None, 11.9) is None and g.pick(None, 12) is b
    g.done(b, True, 12)                                 # b failed at 12: until 22
    assert g.unavailable(13) == Unavailable(BUSY, 22)


def test_when_every_server_is_at_max_conns_no_time_is_known():
    g = group("a max_conns=1", "b max_conns=1 fail_timeout_s=5")
    held = [g.pick(None, 0), g.pick(None, 0)]
    assert g.pick(None, 0) is None
    assert g.unavailable(0) == Unavailable(BUSY, None)
    g.done(held[1], True, 0)                            # b: free again, but failed to 5
    assert g.unavailable(1) == Unavailable(BUSY, 5)


def test_pause_and_failure_together_last_until_the_later():
    g = group("a fail_timeout_s=10", "b down")
    a = by_host(g)["a"]
    g.done(g.pick(None, 0), True, 0)                    # failed until 10
    g.pause(a, 5)
    assert g.next_usable(0) == 10
    g.pause(a, 15)
    assert g.next_usable(0) == 15


def test_view_shows_each_servers_state():
    g = group("a", "b max_conns=1", "c", "d down", "e backup")
    a, b, c, _, _ = by_host(g).values()
    g.done(g.pick(None, 0), True, 0)                    # a failed
    held = g.pick(None, 0)                              # b full
    g.pause(c, 9)
    views = g.view(1)
    assert [v.state for v in views] == ["failed", "full", "paused", "down", "usable"]
    assert views[0].usable_at == 10 and views[1].conns == 1 and views[4].backup
    g.done(held, False, 1)


def test_a_reload_keeps_the_state_of_a_server_whose_url_is_unchanged():
    g = group("a weight=4 max_fails=2", "b", "c")
    a, b, c = by_host(g).values()
    held = g.pick(None, 0)
    assert held is a
    g.done(take(g, "b", 0), True, 0)                    # b failed once
    spec = UpstreamSpec("g", servers("a weight=2", "b", "d"))
    g2 = g.reload(spec)
    a2, b2, d2 = g2.peers
    assert a2 is a and a.conns == 1 and a.weight == 2 and a.max_fails == 1
    assert a.effective_weight <= 2
    assert b2 is b and b.fails == 1 and not b.usable(1)
    assert d2.fails == 0 and d2.conns == 0
    g2.done(held, False, 1)                             # a call from before the reload
    assert a.conns == 0


def test_a_changed_url_is_a_new_server():
    g = group("a", "b")
    g.done(g.pick(None, 0), True, 0)
    moved = UpstreamSpec("g", (ServerSpec("http://a:2"), ServerSpec("http://b:1")))
    assert all(p.fails == 0 for p in g.reload(moved).peers)


def test_reload_groups_keeps_state_by_upstream_and_url():
    old = {"x": group("a", "b")}
    a = old["x"].peers[0]
    specs = [UpstreamSpec("x", servers("a")), UpstreamSpec("y", servers("a"))]
    new = reload_groups(old, specs)
    assert new["x"].peers[0] is a and new["y"].peers[0] is not a
    assert sorted(new) == ["x", "y"]


OPERATIONS = st.lists(st.tuples(st.sampled_from(["pick", "done", "fail", "pause", "tick"]),
                                st.integers(0, 7)), max_size=60)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(BALANCES + ("consistent", "two")), OPERATIONS, st.randoms())
def test_any_run_keeps_nginx_invariants(balance, operations, rng):
    """conns count the calls in flight, effective weights stay in 0..weight, a pick is
    always usable, None only when no server is, and the time next_usable names works."""
    options = {"hash": {"key": "k"}, "consistent": {"key": "k", "consistent": True},
               "two": {"two": True}}.get(balance, {})
    method = {"consistent": "hash", "two": "random"}.get(balance, balance)
    backup = " backup" if method in ("round_robin", "least_conn") else ""
    spec = UpstreamSpec("g", servers("a weight=3 max_fails=2 max_conns=2", "b weight=2",
                                     "c max_fails=1 fail_timeout_s=3", "d down",
                                     f"e weight=2{backup}"), method, **options)
    g = UpstreamGroup(spec, rng.randrange)
    now, in_flight = 0.0, []
    for op, n in operations:
        if op == "pick":
            usable = [p for p in g.peers if p.usable(now)]
            peer = g.pick(f"10.0.{n}.1", now)
            assert peer is None or peer in usable
            if peer is None:
                assert not any(p.usable(now) for p in g.peers)
                until = g.unavailable(now).until
                assert until is None or until > now
            else:
                in_flight.append(peer)
        elif op in ("done", "fail") and in_flight:
            g.done(in_flight.pop(n % len(in_flight)), op == "fail", now)
        elif op == "pause":
            g.pause(g.peers[n % 5], now + n)
        elif op == "tick":
            now += n * 0.75
        for p in g.peers:
            assert p.conns == in_flight.count(p) and 0 <= p.effective_weight <= p.weight
    until = g.next_usable(now)
    if until is not None:
        assert any(p.usable(until) for p in g.peers)
        assert g.pick(None, until) is not None


def test_random_uses_the_rand_it_is_given():
    spec = UpstreamSpec("g", servers("a", "b", "c"), "random")
    picks = [UpstreamGroup(spec, random.Random(7).randrange).pick(None, 0).url for _ in range(2)]
    assert picks[0] == picks[1]


@pytest.mark.parametrize("balance", BALANCES)
def test_every_method_takes_a_single_server_whatever_its_failures(balance):
    options = {"key": "k"} if balance == "hash" else {}
    g = UpstreamGroup(UpstreamSpec("g", servers("a"), balance, **options))
    for t in range(3):
        peer = g.pick("10.0.0.1", t)
        assert peer is not None
        g.done(peer, True, t)
