"""nginx's balancing methods, on a fake clock, against sequences worked out from its
source (ngx_http_upstream_round_robin.c and the hash, ip_hash, least_conn and random
modules).  Servers are http://a:1, http://b:1, ...; a pick is named by its host."""
from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, strategies as st

from zstalk.broker.core.upstreams import ServerSpec, UpstreamGroup, UpstreamSpec, validate
from zstalk.broker.core.upstreams.hashing import Ring, ip_hash_steps, ip_key, memcached_steps


def group(*weights: int, balance: str = "round_robin", rand=random.randrange, **options) -> UpstreamGroup:
    """Servers a, b, c, ... with these weights; `down`/`backup`/`max_conns` options are
    strings of the hosts they apply to, e.g. down="b"."""
    flags = {name: options.pop(name, "") for name in ("down", "backup", "max_conns")}
    servers = tuple(
        ServerSpec(f"http://{host}:1", weight=w, down=host in flags["down"],
                   backup=host in flags["backup"], max_conns=1 if host in flags["max_conns"] else 0)
        for host, w in zip("abcdefghij", weights))
    spec = UpstreamSpec("g", servers, balance, **options)
    assert validate(spec) == []
    return UpstreamGroup(spec, rand)


def host(peer) -> str | None:
    return None if peer is None else peer.url[7]


def sequence(g: UpstreamGroup, n: int, key: str | None = None, now: float = 0) -> str:
    """n calls one at a time (each ends well before the next): the hosts picked."""
    picked = []
    for _ in range(n):
        peer = g.pick(key, now)
        picked.append(host(peer) or "-")
        if peer is not None:
            g.done(peer, False, now)
    return "".join(picked)


def peer(g: UpstreamGroup, name: str):
    return next(p for p in g.peers if host(p) == name)


@pytest.mark.parametrize("weights, expected", [
    ((5, 1, 1), "aabacaa"), ((4, 2, 1), "abacaba"), ((3, 2), "ababa"), ((1, 1, 1), "abc"),
])
def test_smooth_weighted_round_robin_sequences(weights, expected):
    g = group(*weights)
    assert sequence(g, 3 * len(expected)) == expected * 3


@given(st.lists(st.integers(1, 8), min_size=2, max_size=6))
def test_any_window_of_total_weight_picks_takes_each_server_weight_times(weights):
    g = group(*weights)
    total = sum(weights)
    picks = sequence(g, 3 * total)
    for start in range(0, 2 * total + 1):
        window = picks[start:start + total]
        assert [window.count(h) for h in "abcdef"[:len(weights)]] == weights


def test_a_down_server_is_never_picked_and_the_others_keep_their_sequence():
    with_down = sequence(group(5, 1, 1, 1, down="c"), 16)
    assert "c" not in with_down
    assert with_down == sequence(group(5, 1, 1), 16).replace("c", "d")


def test_backups_serve_only_while_no_primary_is_usable():
    g = group(1, 1, 2, 1, backup="cd")
    assert sequence(g, 4) == "abab"
    a, b = peer(g, "a"), peer(g, "b")
    g.done(g.pick(None, 0), True, 0)            # a fails: b alone
    assert sequence(g, 2) == "bb"
    g.done(g.pick(None, 0), True, 0)            # b fails too: the backups, by weight
    assert sequence(g, 6) == "cdccdc"
    # fail_timeout passed: both usable again, their effective weights 0 and climbing one
    # a pass; current weights a -1, b 1 from before: b, b, then a (its probe), b
    assert sequence(g, 4, now=10) == "bbab"
    assert a.fails == b.fails == 0


def test_a_server_at_max_conns_is_skipped_until_a_call_ends():
    g = group(1, 1, max_conns="ab")
    first, second = g.pick(None, 0), g.pick(None, 0)
    assert (host(first), host(second)) == ("a", "b")
    assert g.pick(None, 0) is None
    g.done(first, False, 0)
    assert host(g.pick(None, 0)) == "a"


def test_least_conn_one_call_at_a_time_is_smooth_round_robin():
    assert sequence(group(5, 1, 1, balance="least_conn"), 14) == "aabacaa" * 2


def test_least_conn_compares_conns_per_weight_crosswise():
    g = group(3, 1, balance="least_conn")
    held = [g.pick(None, 0) for _ in range(4)]
    # a 0/3 = b 0/1: a tie, SWRR: a; a 1/3 > b 0/1: b; a 1/3 < b 1/1: a; a 2/3 < b 1/1: a
    assert [host(p) for p in held] == ["a", "b", "a", "a"]
    assert host(g.pick(None, 0)) == "a"             # a 3/3 = b 1/1: tie, SWRR decides


def test_least_conn_ties_go_to_smooth_round_robin_over_the_tied_peers_only():
    g = group(1, 1, 1, balance="least_conn")
    a = g.pick(None, 0)                              # a: tie of three, SWRR: a
    currents = [p.current_weight for p in g.peers]
    assert host(a) == "a" and currents == [-2, 1, 1]
    # b and c tie at 0 conns; a (1 conn) is left out of the second pass
    assert host(g.pick(None, 0)) == "b"
    assert [p.current_weight for p in g.peers] == [-2, 0, 2]


def test_least_conn_without_a_tie_leaves_the_weights_alone():
    g = group(2, 2, balance="least_conn")
    b = peer(g, "b")
    held = g.pick(None, 0)
    assert host(held) == "a"
    b.effective_weight = 0                           # as after failures (max_fails=1: -2)
    assert host(g.pick(None, 0)) == "b"              # b has fewer conns: no second pass
    assert b.effective_weight == 0                   # so it did not recover


def test_ip_hash_walks_the_weights_with_the_hash_of_three_octets():
    assert sequence(group(1, 1, 1, balance="ip_hash"), 3, key="192.168.1.200") == "bbb"
    # 154 % 4 = 2: past a (weight 2), b
    assert sequence(group(2, 1, 1, balance="ip_hash"), 1, key="192.168.1.9") == "b"
    # IPv6: 2600 % 3 = 2, 2601 % 3 = 0
    assert sequence(group(1, 1, 1, balance="ip_hash"), 1, key="2001:db8::1") == "c"
    assert sequence(group(1, 1, 1, balance="ip_hash"), 1, key="2001:db8::2") == "a"


def test_ip_hash_rehashes_past_a_down_server_and_keeps_the_map_of_the_others():
    # 192.168.1.x: 154 % 3 = 1 (b, down), then 5654 % 3 = 2: c
    assert sequence(group(1, 1, 1, balance="ip_hash", down="b"), 1, key="192.168.1.1") == "c"
    # a client mapped to a still goes to a
    client = next(f"10.{i}.0.1" for i in range(256)
                  if next(ip_hash_steps(ip_key(f"10.{i}.0.1"))) % 3 == 0)
    assert sequence(group(1, 1, 1, balance="ip_hash", down="b"), 1, key=client) == "a"


def walk(value: int, weights: list[int]) -> int:
    """The index nginx's walk lands on: value % total, less each weight in turn."""
    w = value % sum(weights)
    for i, weight in enumerate(weights):
        if w < weight:
            return i
        w -= weight
    raise AssertionError


def key_landing(candidate, weights: list[int], server: int, tries: int) -> str:
    """A key (candidate(i) gives a key and its hash steps) whose first `tries` hashes
    all walk to server index `server`."""
    for i in range(65536):
        key, steps = candidate(i)
        if all(walk(h, weights) == server for h in itertools.islice(steps, tries)):
            return key
    raise AssertionError("no such key")


@pytest.mark.parametrize("balance, make", [
    ("ip_hash", lambda i: (f"10.{i // 256}.{i % 256}.1",
                           ip_hash_steps(ip_key(f"10.{i // 256}.{i % 256}.1")))),
    ("hash", lambda i: (f"k{i}", memcached_steps(f"k{i}".encode()))),
])
def test_after_21_unusable_hashes_round_robin_decides(balance, make):
    options = {"key": "uniqueId"} if balance == "hash" else {}
    g = group(1000, 1, 1, balance=balance, down="a", **options)
    stuck = key_landing(make, [1000, 1, 1], 0, 21)
    assert sequence(g, 3, key=stuck) == "bcb"            # round robin's turns
    assert [p.current_weight for p in g.peers] == [0, -1, 1]
    lucky = key_landing(make, [1000, 1, 1], 2, 1)
    assert sequence(g, 3, key=lucky) == "ccc"            # the hash: weights untouched
    assert [p.current_weight for p in g.peers] == [0, -1, 1]


def test_hash_follows_cache_memcached():
    # crc32("foo"): 3187 % 3 = 1 -> b; with b down: 3187 + 6881 = 10068, % 3 = 0 -> a
    assert sequence(group(1, 1, 1, balance="hash", key="k"), 2, key="foo") == "bb"
    assert sequence(group(1, 1, 1, balance="hash", key="k", down="b"), 1, key="foo") == "a"


@pytest.mark.parametrize("balance", ["hash", "ip_hash"])
def test_without_a_key_hashing_is_round_robin(balance):
    options = {"key": "uniqueId"} if balance == "hash" else {}
    assert sequence(group(2, 1, balance=balance, **options), 6, key=None) == "abaaba"
    if balance == "hash":
        assert sequence(group(2, 1, balance=balance, **options), 3, key="") == "aba"


def ring_owner(ring: Ring, index: int) -> str:
    return ring.owners[index % len(ring.owners)]


def test_consistent_hash_picks_the_owner_of_the_first_point_at_or_after_the_key():
    g = group(1, 2, 1, balance="hash", key="k", consistent=True)
    ring = Ring([("a:1", 1), ("b:1", 2), ("c:1", 1)])
    for i in range(300):
        key = f"user{i}"
        assert host(g.pick(key, 0)) == ring_owner(ring, ring.find(key.encode()))[0]


def test_consistent_hash_moves_only_the_keys_of_a_down_server_to_the_next_point():
    up = group(1, 1, 1, 1, balance="hash", key="k", consistent=True)
    down = group(1, 1, 1, 1, balance="hash", key="k", consistent=True, down="c")
    ring = Ring([(f"{h}:1", 1) for h in "abcd"])
    for i in range(500):
        key = f"user{i}"
        before, after = host(up.pick(key, 0)), host(down.pick(key, 0))
        if before != "c":
            assert after == before
        else:
            start = ring.find(key.encode())
            assert after == next(o[0] for o in (ring_owner(ring, start + j) for j in range(21))
                                 if o != "c:1")


class Script:
    """A rand that answers from a list and counts its calls."""
    def __init__(self, *values: int) -> None:
        self.values, self.calls = itertools.cycle(values), 0

    def __call__(self, n: int) -> int:
        self.calls += 1
        value = next(self.values)
        assert 0 <= value < n
        return value


def test_random_maps_a_draw_to_cumulative_weight_ranges():
    script = Script(0, 1, 2, 3, 4, 5)
    assert sequence(group(2, 1, 3, balance="random", rand=script), 6) == "aabccc"


def test_random_draws_again_past_an_unusable_server_21_times_then_round_robin():
    script = Script(0)                               # always a, which is down
    g = group(1, 1, 1, balance="random", rand=script, down="a")
    assert sequence(g, 2) == "bc"
    assert script.calls == 42


def test_random_follows_the_weights():
    g = group(5, 3, 2, balance="random", rand=random.Random(30).randrange)
    picks = sequence(g, 10000)
    assert [round(picks.count(h) / 1000) for h in "abc"] == [5, 3, 2]


def test_random_two_keeps_the_draw_with_fewer_conns_per_weight_ties_to_the_second():
    script = Script(0, 1)
    g = group(1, 1, balance="random", two=True, rand=script)
    assert host(g.pick(None, 0)) == "b"              # 0 = 0: the second draw
    assert host(g.pick(None, 0)) == "a"              # a: 0 conns, b: 1
    script.values = iter([1, 1, 0])                  # b twice: the repeat is one more try
    assert host(g.pick(None, 0)) == "a"              # a and b both hold 1: a, drawn second
    assert script.calls == 7


def test_random_two_compares_crosswise_by_weight():
    g = group(3, 1, balance="random", two=True, rand=Script(0, 3))
    for _ in range(2):
        g.pick(None, 0)                              # a (3) vs b (1): b, then a
    # a: 1 conn of weight 3, b: 1 conn of weight 1: a, though b came second
    assert host(g.pick(None, 0)) == "a"
