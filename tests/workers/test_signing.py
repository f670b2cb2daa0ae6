"""Call signatures (workers/signing.py): what verifies, each reason a signature is refused,
and where a process finds its key."""
from __future__ import annotations

import hashlib
import hmac

import pytest
from hypothesis import given, settings, strategies as st

from zstalk.workers import signing
from zstalk.workers.signing import sign, signing_key, verify

KEY = b"k" * 32
BODY = b'{"id":1234}'
NOW = 1_700_000_000.0


def test_a_signed_call_verifies() -> None:
    assert verify(KEY, sign(KEY, "t1", BODY, NOW), "t1", BODY, NOW) is None


def test_the_header_is_a_timestamp_and_an_hmac_sha256_over_it_the_task_id_and_the_body() -> None:
    mac = hmac.new(KEY, b"1700000000.t1." + BODY, hashlib.sha256).hexdigest()
    assert sign(KEY, "t1", BODY, NOW + 0.9) == f"t=1700000000,v1={mac}"


def test_a_tampered_body_is_a_bad_signature() -> None:
    header = sign(KEY, "t1", BODY, NOW)
    assert verify(KEY, header, "t1", b'{"id":4321}', NOW) == signing.BAD_SIGNATURE


def test_a_signature_for_another_task_is_a_bad_signature() -> None:
    assert verify(KEY, sign(KEY, "t1", BODY, NOW), "t2", BODY, NOW) == signing.BAD_SIGNATURE


def test_a_signature_made_with_another_key_is_a_bad_signature() -> None:
    header = sign(b"other", "t1", BODY, NOW)
    assert verify(KEY, header, "t1", BODY, NOW) == signing.BAD_SIGNATURE


def test_a_moved_timestamp_is_a_bad_signature_not_a_fresh_one() -> None:
    header = sign(KEY, "t1", BODY, NOW - 3600).replace(f"t={int(NOW) - 3600}", f"t={int(NOW)}")
    assert verify(KEY, header, "t1", BODY, NOW) == signing.BAD_SIGNATURE


@pytest.mark.parametrize("age_s, reason", [
    (300, None), (301, signing.TOO_OLD), (3600, signing.TOO_OLD),
    (-300, None), (-301, signing.TOO_NEW), (-3600, signing.TOO_NEW),
])
def test_a_signature_is_good_only_within_the_window_either_way(age_s: int, reason) -> None:
    assert verify(KEY, sign(KEY, "t1", BODY, NOW - age_s), "t1", BODY, NOW) == reason


def test_the_window_is_a_parameter() -> None:
    header = sign(KEY, "t1", BODY, NOW - 10)
    assert verify(KEY, header, "t1", BODY, NOW, window_s=5) == signing.TOO_OLD
    assert verify(KEY, header, "t1", BODY, NOW, window_s=10) is None


@pytest.mark.parametrize("header", [None, ""])
def test_no_header_is_a_missing_signature(header) -> None:
    assert verify(KEY, header, "t1", BODY, NOW) == signing.MISSING


GOOD_MAC = signing.mac(KEY, int(NOW), "t1", BODY)


@pytest.mark.parametrize("header", [
    "garbage", "t=1700000000", f"v1={GOOD_MAC}", f"t=,v1={GOOD_MAC}",
    f"t=soon,v1={GOOD_MAC}", f"t=-1,v1={GOOD_MAC}", f"t=1.5,v1={GOOD_MAC}",
    f"t=١٢٣,v1={GOOD_MAC}", f"t={'9' * 5000},v1={GOOD_MAC}",
    f"t=1700000000,t=1700000000,v1={GOOD_MAC}", "t=1700000000,v1=abc",
    "t=1700000000,v1=" + "g" * 64, f"t=1700000000,v1={GOOD_MAC},", f"t=1700000000;v1={GOOD_MAC}",
])
def test_a_header_not_of_the_form_t_v1_is_malformed(header: str) -> None:
    assert verify(KEY, header, "t1", BODY, NOW) == signing.MALFORMED


def test_spaces_an_uppercase_mac_and_unknown_entries_are_accepted() -> None:
    header = f" t=1700000000 , v0=whatever , v1={GOOD_MAC.upper()} "
    assert verify(KEY, header, "t1", BODY, NOW) is None


def test_one_matching_v1_among_several_is_enough_while_keys_rotate() -> None:
    old = signing.mac(b"old key", int(NOW), "t1", BODY)
    assert verify(KEY, f"t={int(NOW)},v1={old},v1={GOOD_MAC}", "t1", BODY, NOW) is None
    assert verify(KEY, f"t={int(NOW)},v1={old}", "t1", BODY, NOW) == signing.BAD_SIGNATURE


def test_a_task_id_no_signer_could_send_is_a_bad_signature_not_an_exception() -> None:
    # aiohttp decodes a header's non-UTF-8 bytes to lone surrogates, which do not encode
    assert verify(KEY, sign(KEY, "t1", BODY, NOW), "t1\udcff", BODY, NOW) == \
        signing.BAD_SIGNATURE


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_any_header_gives_a_reason_and_never_an_exception(header: str) -> None:
    assert verify(KEY, header, "t1", BODY, NOW) in (
        signing.MISSING, signing.MALFORMED, signing.BAD_SIGNATURE)


# -- v2: the request line too ------------------------------------------------------------
LINE = {"method": "GET", "path": "/fn/report/daily", "query": "day=2026-11-26"}


def signed_v2(task_id: str = "t1", body: bytes = BODY, at: float = NOW, key: bytes = KEY,
              **line) -> str:
    return sign(key, task_id, body, at, **{**LINE, **line})


def test_a_call_signed_with_its_request_line_verifies_by_v2() -> None:
    assert verify(KEY, signed_v2(), "t1", BODY, NOW, **LINE) is None


def test_v2_is_an_hmac_sha256_over_its_version_the_time_task_id_request_line_and_body() -> None:
    message = b"v2\n1700000000\nt1\nGET\n/fn/report/daily\nday=2026-11-26\n" + BODY
    v2 = hmac.new(KEY, message, hashlib.sha256).hexdigest()
    assert signing.mac_v2(KEY, 1700000000, "t1", "GET", "/fn/report/daily", "day=2026-11-26",
                          BODY) == v2
    assert signed_v2(at=NOW + 0.9) == f"t=1700000000,v1={GOOD_MAC},v2={v2}"


def test_without_a_path_a_call_is_signed_by_v1_alone() -> None:
    assert sign(KEY, "t1", BODY, NOW) == f"t=1700000000,v1={GOOD_MAC}"
    assert signing.parse(sign(KEY, "t1", BODY, NOW, method="GET")).v2 == []


@pytest.mark.parametrize("tampered", [
    {"method": "POST"}, {"method": "get"}, {"path": "/fn/report/weekly"},
    {"path": "/fn/report/daily/"}, {"path": "/fn/report%2Fdaily"},
    {"query": "day=2026-11-27"}, {"query": ""}, {"query": "day=2026-11-26&day=2026-11-27"},
], ids=lambda tampered: "-".join(f"{k}={v!r}" for k, v in tampered.items()))
def test_a_request_line_other_than_the_signed_one_is_a_bad_signature(tampered: dict) -> None:
    assert verify(KEY, signed_v2(), "t1", BODY, NOW, **{**LINE, **tampered}) == \
        signing.BAD_SIGNATURE


def test_v2_refuses_a_tampered_body_or_task_id() -> None:
    assert verify(KEY, signed_v2(), "t1", b'{"id":4321}', NOW, **LINE) == signing.BAD_SIGNATURE
    assert verify(KEY, signed_v2(), "t2", BODY, NOW, **LINE) == signing.BAD_SIGNATURE


def test_v2_refuses_a_moved_timestamp_and_one_outside_the_window() -> None:
    moved = signed_v2(at=NOW - 3600).replace(f"t={int(NOW) - 3600}", f"t={int(NOW)}")
    assert verify(KEY, moved, "t1", BODY, NOW, **LINE) == signing.BAD_SIGNATURE
    assert verify(KEY, signed_v2(at=NOW - 301), "t1", BODY, NOW, **LINE) == signing.TOO_OLD
    assert verify(KEY, signed_v2(at=NOW + 301), "t1", BODY, NOW, **LINE) == signing.TOO_NEW


def test_a_v1_only_header_still_verifies_when_the_verifier_passes_no_method() -> None:
    assert verify(KEY, f"t=1700000000,v1={GOOD_MAC}", "t1", BODY, NOW) is None


def test_a_verifier_that_passes_no_method_checks_v1_even_when_v2_is_there() -> None:
    assert verify(KEY, signed_v2(), "t1", BODY, NOW) is None    # a proxy rewrote the path
    assert verify(KEY, signed_v2(body=b"{}"), "t1", BODY, NOW) == signing.BAD_SIGNATURE


def test_a_v1_only_header_is_checked_by_v1_even_when_the_verifier_knows_the_method() -> None:
    # (a dispatcher that signs only v1; cutting v2 off a header downgrades it to this)
    assert verify(KEY, f"t=1700000000,v1={GOOD_MAC}", "t1", BODY, NOW, **LINE) is None


def test_with_v2_in_the_header_and_a_method_given_a_good_v1_alone_is_not_enough() -> None:
    other_line = signed_v2(path="/fn/other")    # its v1 is good for this call, its v2 not
    assert verify(KEY, other_line, "t1", BODY, NOW, **LINE) == signing.BAD_SIGNATURE


def test_a_header_with_v2_alone_parses_and_verifies_by_v2_only() -> None:
    v2_only = ",".join(part for part in signed_v2().split(",") if not part.startswith("v1="))
    assert signing.parse(v2_only).v1 == [] and len(signing.parse(v2_only).v2) == 1
    assert verify(KEY, v2_only, "t1", BODY, NOW, **LINE) is None
    assert verify(KEY, v2_only, "t1", BODY, NOW) == signing.BAD_SIGNATURE     # no v1 to check


def test_one_matching_v2_among_several_is_enough_while_keys_rotate() -> None:
    t, v1, new = signed_v2().split(",")
    old = signed_v2(key=b"old key").split(",")[2]
    assert verify(KEY, ",".join([t, v1, old, new]), "t1", BODY, NOW, **LINE) is None
    assert verify(KEY, ",".join([t, v1, old]), "t1", BODY, NOW, **LINE) == signing.BAD_SIGNATURE


def test_parse_gives_the_v1_and_v2_entries_in_order_lowercased() -> None:
    v2 = signing.mac_v2(KEY, int(NOW), "t1", "GET", "/", "", BODY)
    parsed = signing.parse(f"t=1700000000,v2={v2.upper()},v1={GOOD_MAC},v2={'0' * 64}")
    assert parsed == signing.Signature(1700000000, [GOOD_MAC], [v2, "0" * 64])


@pytest.mark.parametrize("header", [
    "t=1700000000,v2=abc", "t=1700000000,v2=" + "g" * 64, "t=1700000000,v2=" + "0" * 65,
    "t=1700000000,v2=", f"t=1700000000,v1={GOOD_MAC},v2=abc", f"v2={GOOD_MAC}",
    f"t=1700000000,v2={GOOD_MAC},", f"t=1700000000,v2={GOOD_MAC} {GOOD_MAC}",
])
def test_a_v2_entry_that_is_not_64_hex_digits_is_malformed(header: str) -> None:
    assert verify(KEY, header, "t1", BODY, NOW, **LINE) == signing.MALFORMED


def test_a_request_line_no_signer_could_send_is_a_bad_signature_not_an_exception() -> None:
    assert verify(KEY, signed_v2(), "t1", BODY, NOW, **{**LINE, "path": "/fn/\udcff"}) == \
        signing.BAD_SIGNATURE


@settings(max_examples=300, deadline=None)
@given(st.text(), st.text(), st.text(), st.text())
def test_any_header_and_request_line_give_a_reason_and_never_an_exception(
        header: str, method: str, path: str, query: str) -> None:
    assert verify(KEY, header, "t1", BODY, NOW, method=method, path=path, query=query) in (
        signing.MISSING, signing.MALFORMED, signing.BAD_SIGNATURE)


# -- the key ---------------------------------------------------------------------------------
@pytest.fixture
def no_key_env(monkeypatch):
    monkeypatch.delenv(signing.ENV_KEY, raising=False)
    monkeypatch.delenv(signing.ENV_KEY_FILE, raising=False)
    return monkeypatch


def test_an_explicit_key_comes_first(no_key_env) -> None:
    no_key_env.setenv(signing.ENV_KEY, "from env")
    assert signing_key(b"given") == b"given"
    assert signing_key("given as text") == b"given as text"


def test_the_key_comes_from_the_environment(no_key_env) -> None:
    no_key_env.setenv(signing.ENV_KEY, "s3cret")
    assert signing_key() == b"s3cret"


def test_the_key_comes_from_the_file_the_environment_names_less_one_trailing_newline(
        no_key_env, tmp_path) -> None:
    path = tmp_path / "key"
    path.write_bytes(b"s3cret\n")
    no_key_env.setenv(signing.ENV_KEY_FILE, str(path))
    assert signing_key() == b"s3cret"
    path.write_bytes(b" s3cret \n\n")     # the rest is the key's: a host reads it the same
    assert signing_key() == b" s3cret \n"
    no_key_env.setenv(signing.ENV_KEY, "env first")
    assert signing_key() == b"env first"


def test_without_a_key_anywhere_there_is_none(no_key_env) -> None:
    assert signing_key() is None
    no_key_env.setenv(signing.ENV_KEY, "")      # empty counts as unset
    assert signing_key() is None


def test_an_empty_or_missing_key_file_is_an_error_not_an_unsigned_start(no_key_env,
                                                                       tmp_path) -> None:
    path = tmp_path / "key"
    path.write_bytes(b"\n")
    no_key_env.setenv(signing.ENV_KEY_FILE, str(path))
    with pytest.raises(ValueError, match="empty"):
        signing_key()
    no_key_env.setenv(signing.ENV_KEY_FILE, str(tmp_path / "nosuch"))
    with pytest.raises(ValueError, match=f"{signing.ENV_KEY_FILE} names .*nosuch"):
        signing_key()


def test_an_explicit_empty_key_is_an_error(no_key_env) -> None:
    with pytest.raises(ValueError, match="empty"):
        signing_key(b"")


def test_requiring_v2_refuses_a_header_whose_v2_was_cut_off() -> None:
    stripped = f"t=1700000000,v1={GOOD_MAC}"
    assert verify(KEY, stripped, "t1", BODY, NOW, **LINE, require_v2=True) == signing.NO_V2
    assert verify(KEY, signed_v2(), "t1", BODY, NOW, **LINE, require_v2=True) is None
