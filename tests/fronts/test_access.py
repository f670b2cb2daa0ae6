"""Who a request is (protocol/fronts/http/access.py): bearer keys, the dashboard's signed
cookie and its action header, and the keyless front's loopback rule, on a fake clock."""
from __future__ import annotations

from zstalk.protocol.fronts.http.access import (COOKIE, COOKIE_TTL_S, MASTER, NOBODY, VIEWER,
                                                Keys, keyless_refusal)

KEYS = Keys(b"master-secret", b"viewer-secret")
NOW = 1_000_000.0


def cookie(keys: Keys, role: str, now: float = NOW) -> dict:
    return {"Cookie": f"{COOKIE}={keys.cookie(role, now)}"}


def test_bearer_keys_name_the_master_and_the_viewer_and_a_wrong_one_is_refused():
    assert KEYS.who("GET", {"Authorization": "Bearer master-secret"}, NOW) == MASTER
    assert KEYS.who("POST", {"Authorization": "Bearer viewer-secret"}, NOW) == VIEWER
    assert KEYS.who("GET", {"Authorization": "Bearer guess"}, NOW).status == 403
    assert KEYS.who("GET", {}, NOW) == NOBODY


def test_without_a_master_key_everyone_is_the_master():
    assert Keys().who("DELETE", {}, NOW) == MASTER


def test_a_cookie_proves_its_role_until_it_ends():
    assert KEYS.who("GET", cookie(KEYS, VIEWER), NOW + 10) == VIEWER
    assert KEYS.who("GET", cookie(KEYS, MASTER), NOW + COOKIE_TTL_S - 1) == MASTER
    assert KEYS.who("GET", cookie(KEYS, MASTER), NOW + COOKIE_TTL_S) == NOBODY


def test_an_action_with_the_cookie_needs_the_action_header():
    headers = cookie(KEYS, MASTER)
    assert KEYS.who("POST", headers, NOW).status == 403
    assert KEYS.who("POST", {**headers, "X-Zstalk-Action": "1"}, NOW) == MASTER


def test_a_forged_or_altered_cookie_proves_nothing():
    value = KEYS.cookie(VIEWER, NOW)
    role, expires, signature = value.split(".")
    for forged in (f"master.{expires}.{signature}", f"viewer.{int(expires) + 9}.{signature}",
                   f"viewer.{expires}.x", "master", "", "a.b.c.d"):
        assert KEYS.who("GET", {"Cookie": f"{COOKIE}={forged}"}, NOW) == NOBODY


def test_rotating_the_master_key_logs_everyone_out_and_the_viewer_key_its_viewers():
    master, viewer = cookie(KEYS, MASTER), cookie(KEYS, VIEWER)
    rotated = Keys(b"new-master", b"viewer-secret")
    assert rotated.who("GET", master, NOW) == NOBODY and rotated.who("GET", viewer, NOW) == NOBODY
    new_viewer = Keys(b"master-secret", b"new-viewer")
    assert new_viewer.who("GET", master, NOW) == MASTER
    assert new_viewer.who("GET", viewer, NOW) == NOBODY
    assert Keys(b"master-secret").who("GET", viewer, NOW) == NOBODY


def test_a_cookie_made_by_one_front_is_taken_by_another_with_the_same_keys():
    other = Keys(b"master-secret", b"viewer-secret")
    assert other.who("GET", cookie(KEYS, MASTER), NOW) == MASTER


def test_log_in_names_the_role_of_a_key():
    assert (KEYS.login("master-secret"), KEYS.login("viewer-secret"), KEYS.login("x")) == (
        MASTER, VIEWER, None)


def test_a_keyless_dashboard_answers_loopback_peers_that_name_no_proxy():
    assert keyless_refusal(None, "127.0.0.1", {}) is None
    assert keyless_refusal(None, "::1", {}) is None
    assert keyless_refusal(None, "::ffff:127.0.0.1", {}) is None
    assert keyless_refusal(None, None, {}) is None                  # (a unix socket)
    assert keyless_refusal(None, "192.0.2.7", {}).status == 403
    for header in ("X-Forwarded-For", "Forwarded"):
        assert keyless_refusal(None, "127.0.0.1", {header: "for=192.0.2.7"}).status == 403
    assert keyless_refusal(b"k", "192.0.2.7", {"Forwarded": "x"}) is None


def test_wrong_keys_are_counted_per_address_over_a_sliding_minute():
    from zstalk.protocol.fronts.http.ui import MAX_FAILURES, WINDOW_S, Failures
    failures = Failures()
    for i in range(MAX_FAILURES):
        assert failures.allowed("192.0.2.1", i)
        failures.failed("192.0.2.1", i)
    assert not failures.allowed("192.0.2.1", MAX_FAILURES)
    assert failures.allowed("192.0.2.2", MAX_FAILURES)
    assert failures.allowed("192.0.2.1", WINDOW_S + 0.5)        # (the first went out of it)
