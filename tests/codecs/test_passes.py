"""The waiting room's signed passes (issue 31): the format (protocol/codecs/passes.py), each
reason a pass is refused and the order they are checked in, every one-byte change of a
good pass refused, key files and rotation, the SDK's verify_pass (workers/signing.py) and
the verify endpoint's decisions (protocol/fronts/http/pass_check.py).  Hypothesis: any str,
bytes or other object given as a pass only ever gets a PassError."""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import re

import pytest
from hypothesis import given, settings, strategies as st
from multidict import CIMultiDict

import zstalk.workers
from zstalk.broker.core.tasks import store
from zstalk.protocol.codecs import passes
from zstalk.protocol.codecs.passes import (MAX_PASS_LENGTH, PassError, PassKeyError, PassKeys,
                                           check_pass as verify_pass, parse_pass_keys, sign_pass)
from zstalk.protocol.fronts.http.pass_check import check_request, settle
from zstalk.protocol.network.pass_keys import read_pass_keys
from zstalk.protocol.network.secret import SecretError

KEY1 = b"k1-0123456789abcdef0123456789abcdef"
KEY2 = b"k2-fedcba9876543210fedcba9876543210"
KEYS = PassKeys([("k1", KEY1), ("k2", KEY2)])
NOW = 1_700_000_000
EXP = NOW + 300
UID = "4f1c2a9be0d34c7f8a61b2c3d4e5f607"
PASS = sign_pass(KEYS, UID, "checkout", EXP)

ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
REFUSED_BEFORE_THE_MAC_HOLDS = {"malformed", "unknown_kid", "forged"}


def reason(token, keys=KEYS, now=NOW, function=None) -> str:
    with pytest.raises(PassError) as refused:
        verify_pass(token, keys, now, function)
    return refused.value.reason


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


# -- the format ------------------------------------------------------------------------

def test_a_signed_pass_verifies_and_names_its_task():
    assert verify_pass(PASS, KEYS, NOW) == UID
    assert verify_pass(PASS.encode(), KEYS, NOW, "checkout") == UID


def test_a_pass_is_six_dotted_fields_whose_mac_is_an_hmac_sha256_over_the_other_five():
    signed = f"zp1.k1.{b64(UID.encode())}.{b64(b'checkout')}.{EXP}"
    mac = b64(hmac.new(KEY1, signed.encode(), hashlib.sha256).digest())
    assert PASS == f"{signed}.{mac}"


def test_ids_holding_the_separator_are_encoded_and_the_longest_pass_fits_the_bound():
    uid, function = "a.b:c-" + "." * 26, "f" + ".:_-" * 15 + "xyz"
    token = sign_pass(KEYS, uid, function, 10 ** 11 - 1)
    assert token.count(".") == 5
    long_kid = PassKeys({"k" * 16: KEY1})
    longest = sign_pass(long_kid, "u" * 32, "f" * 64, 10 ** 11 - 1)
    assert len(longest) == 207 <= MAX_PASS_LENGTH
    assert verify_pass(token, KEYS, NOW, function) == uid
    assert verify_pass(longest, long_kid, NOW) == "u" * 32


def test_the_codec_accepts_exactly_the_ids_the_task_store_accepts():
    assert passes.UNIQUE_ID.pattern == store.UNIQUE_ID.pattern
    assert passes.FUNCTION_NAME.pattern == store.FUNCTION_NAME.pattern


@pytest.mark.parametrize("uid, function, exp", [
    ("", "f", EXP), ("u" * 33, "f", EXP), ("a b", "f", EXP), ("u", ".f", EXP),
    ("u", "f" * 65, EXP), ("u", "f", -1), ("u", "f", 10 ** 11), ("u", "f", 1.5), ("u", "f", True),
])
def test_signing_refuses_ids_and_expiries_zstalk_would_not_accept(uid, function, exp):
    with pytest.raises(ValueError):
        sign_pass(KEYS, uid, function, exp)


def test_the_first_key_signs():
    assert PASS.startswith("zp1.k1.")
    assert sign_pass(PassKeys([("k2", KEY2), ("k1", KEY1)]), UID, "checkout", EXP).startswith("zp1.k2.")


# -- each reason, and the order --------------------------------------------------------

def test_a_pass_is_good_until_its_exp_second_and_expired_from_it():
    assert verify_pass(PASS, KEYS, EXP - 0.001) == UID
    assert reason(PASS, now=EXP) == "expired"
    assert reason(PASS, now=float("nan")) == "expired"


def test_a_pass_for_another_function_is_wrong_function_and_no_function_means_any():
    assert reason(PASS, function="refund") == "wrong_function"
    assert reason(PASS, function="") == "wrong_function"
    assert verify_pass(PASS, KEYS, NOW, None) == UID


def test_a_pass_of_a_kid_the_server_does_not_hold_is_unknown_kid():
    assert reason(PASS, keys=PassKeys({"k3": KEY1})) == "unknown_kid"


def test_a_pass_signed_with_another_key_under_the_same_kid_is_forged():
    assert reason(PASS, keys=PassKeys({"k1": KEY2})) == "forged"


def test_an_expired_pass_for_another_function_is_expired():
    assert reason(PASS, now=EXP + 1, function="refund") == "expired"


def test_a_pass_whose_expiry_or_function_was_rewritten_is_forged_never_expired_or_wrong():
    fields = PASS.split(".")
    later = ".".join(fields[:4] + [str(EXP + 10 ** 6)] + fields[5:])
    other = ".".join(fields[:3] + [b64(b"refund")] + fields[4:])
    assert reason(later, now=EXP + 1) == "forged"
    assert reason(other, function="refund") == "forged"


def test_changing_any_one_byte_of_a_pass_anywhere_gets_it_refused_before_the_mac_holds():
    token = PASS.encode()
    for position in range(len(token)):
        for byte in range(256):
            if byte == token[position]:
                continue
            changed = token[:position] + bytes([byte]) + token[position + 1:]
            assert reason(changed) in REFUSED_BEFORE_THE_MAC_HOLDS, (position, byte)


def test_a_last_character_that_differs_only_in_unused_bits_is_refused():
    # 32 MAC bytes are 43 characters whose last carries 2 unused bits, so two spellings
    # decode to the same MAC: it is compared as text.  An id must be its canonical encoding.
    def flip_unused_bit(text: str) -> str:
        return text[:-1] + ALPHABET[ALPHABET.index(text[-1]) ^ 1]
    mac = PASS.rsplit(".", 1)[1]
    assert base64.urlsafe_b64decode(flip_unused_bit(mac) + "=") == base64.urlsafe_b64decode(mac + "=")
    assert reason(flip_unused_bit(PASS)) == "forged"
    token = sign_pass(KEYS, "ab", "checkout", EXP)        # "ab" is "YWI": 2 unused bits
    assert reason(token.replace(".YWI.", ".YWJ.")) == "malformed"


@pytest.mark.parametrize("token", [
    "", "zp1", "zp1.....", PASS + ".", "." + PASS, PASS.replace("zp1", "zp2", 1),
    PASS.replace("zp1", "ZP1", 1), PASS[:-1], PASS + "A", PASS.replace(f".{EXP}.", f".0{EXP}."),
    PASS.replace(f".{EXP}.", f".+{EXP}."), PASS.replace(f".{EXP}.", f".{EXP}.0.", 1),
    PASS.replace(".", "..", 1), PASS + "\n", " " + PASS, PASS.replace("k", "\u212a", 1),
    "zp1.k1." + b64(b"a b") + "." + b64(b"f") + f".{EXP}." + "A" * 43,
    "zp1.k1." + b64("é".encode()) + "." + b64(b"f") + f".{EXP}." + "A" * 43,
    "zp1.k1.YQ.ZmZm.1." + "A" * 43 + "A" * 300, PASS * 1000, "é" * 10 ** 5,
    PASS.encode() + b"\xff", b"\x00" * 300, bytearray(PASS.encode()) + b" ",
    None, 12345, ["zp1"], object(),
])
def test_a_malformed_pass_of_any_shape_is_refused_as_malformed(token):
    assert reason(token) == "malformed"


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(), st.text(alphabet="zp1k.ABCDEFYWI0123456789_-", max_size=260),
                 st.binary(), st.binary(min_size=1, max_size=300).map(lambda b: PASS.encode() + b)))
def test_arbitrary_text_or_bytes_as_a_pass_only_ever_gets_a_pass_error(token):
    assert reason(token) in passes.REASONS


@settings(max_examples=300, deadline=None)
@given(st.from_regex(r"zp1\.k[12]\.[A-Za-z0-9_-]{2,43}\.[A-Za-z0-9_-]{2,86}\.[1-9][0-9]{0,10}"
                     r"\.[A-Za-z0-9_-]{43}", fullmatch=True))
def test_a_pass_in_the_grammar_that_no_key_signed_is_refused_before_the_mac_holds(token):
    assert reason(token) in REFUSED_BEFORE_THE_MAC_HOLDS


# -- keys and key files ----------------------------------------------------------------

def test_pass_keys_keep_their_order_and_never_show_a_key():
    assert list(KEYS) == ["k1", "k2"] and KEYS.signing_kid == "k1" and KEYS["k2"] == KEY2
    assert repr(KEYS) == "PassKeys(kids=['k1', 'k2'])"
    assert PassKeys({"a": KEY1.decode()})["a"] == KEY1


@pytest.mark.parametrize("keys", [{}, {"k1": b"short"}, {"k.1": KEY1}, {"k" * 17: KEY1},
                                  {"k1": KEY1 + b" x"}, [("k1", KEY1), ("k1", KEY2)], {"k1": 5}])
def test_pass_keys_refuse_short_keys_bad_kids_and_duplicates(keys):
    with pytest.raises(ValueError) as refused:
        PassKeys(keys)
    assert KEY1.decode() not in str(refused.value)


def test_a_key_file_holds_kid_key_lines_with_comments_blank_lines_and_crlf():
    text = (f"# rotated 2025-01-01\r\n\r\n  k2 : {KEY2.decode()}  \r\n"
            f"\t# the old key, until its passes expire\nk1:{KEY1.decode()}\n\n")
    keys = parse_pass_keys(text, "/etc/zstalk/pass-keys")
    assert list(keys.items()) == [("k2", KEY2), ("k1", KEY1)]


def test_a_key_is_its_text_as_written_not_decoded_and_may_hold_colons():
    key = "bWFueSBiYXNlNjQgY2hhcmFjdGVycw:==:" + "x" * 8
    assert parse_pass_keys(f"k1:{key}", "f")["k1"] == key.encode()


@pytest.mark.parametrize("text, line, says", [
    ("k1 " + KEY1.decode(), 1, "expected kid:key"),
    ("# keys\n\nk.1:" + KEY1.decode(), 3, "kid 'k.1'"),
    ("k1:" + KEY1.decode() + "\nk2:" + "x" * 31, 2, "31 bytes, and at least 32"),
    ("k1:", 1, "the key is empty"),
    ("k1:" + KEY1.decode()[:20] + " " + KEY1.decode()[20:], 1, "printable ASCII without blanks"),
    ("k1:" + "é" * 32, 1, "printable ASCII without blanks"),
    ("k1:" + KEY1.decode() + "\n#\nk1:" + KEY2.decode(), 3, "kid 'k1' is already on line 1"),
])
def test_a_bad_key_file_line_is_refused_naming_the_file_and_the_line_and_never_the_key(text, line, says):
    with pytest.raises(PassKeyError) as refused:
        parse_pass_keys(text, "/run/secrets/pass-keys")
    message = str(refused.value)
    assert message.startswith(f"/run/secrets/pass-keys, line {line}: ") and says in message
    assert KEY1.decode() not in message and KEY2.decode() not in message


def test_a_key_file_with_no_keys_is_refused():
    with pytest.raises(PassKeyError, match=r"^keys holds no keys"):
        parse_pass_keys("# nothing yet\n\n", "keys")


def test_a_rotation_signs_with_the_new_first_key_and_old_passes_verify_while_their_line_stays():
    before = parse_pass_keys(f"k1:{KEY1.decode()}\n", "keys")
    old = sign_pass(before, UID, "checkout", EXP)
    during = parse_pass_keys(f"k2:{KEY2.decode()}\nk1:{KEY1.decode()}\n", "keys")
    new = sign_pass(during, UID, "checkout", EXP)
    assert new.startswith("zp1.k2.") and old.startswith("zp1.k1.")
    assert verify_pass(old, during, NOW) == verify_pass(new, during, NOW) == UID
    after = parse_pass_keys(f"k2:{KEY2.decode()}\n", "keys")
    assert reason(old, keys=after) == "unknown_kid"
    assert verify_pass(new, after, NOW) == UID


def test_reading_a_key_file_that_is_missing_empty_not_utf8_or_bad_names_it(tmp_path):
    cases = {"missing": None, "empty": b"", "latin1": b"k1:" + KEY1 + b"\n# \xe9\n",
             "bad": b"k1:" + KEY1 + b"\nk2 " + KEY2 + b"\n"}
    for name, data in cases.items():
        if data is not None:
            (tmp_path / name).write_bytes(data)
        with pytest.raises(SecretError, match=re.escape(str(tmp_path / name))):
            read_pass_keys(str(tmp_path / name))
    with pytest.raises(SecretError, match=r"bad, line 2: expected kid:key$"):
        read_pass_keys(str(tmp_path / "bad"))


# -- the SDK ---------------------------------------------------------------------------

def test_verify_pass_from_zstalk_workers_takes_a_key_file_path(tmp_path):
    path = tmp_path / "pass-keys"
    path.write_text(f"k1:{KEY1.decode()}\n")
    assert zstalk.workers.verify_pass(PASS, str(path), "checkout", now=NOW) == UID
    assert zstalk.workers.verify_pass(PASS, path, now=NOW) == UID
    with pytest.raises(zstalk.workers.PassError) as refused:
        zstalk.workers.verify_pass(PASS, path, "refund", now=NOW)
    assert refused.value.reason == "wrong_function" and zstalk.workers.PassError is PassError


def test_the_sdk_reads_a_key_file_again_once_it_is_replaced(tmp_path):
    path = tmp_path / "pass-keys"
    path.write_text(f"k1:{KEY1.decode()}\n")
    assert zstalk.workers.verify_pass(PASS, path, now=NOW) == UID
    (tmp_path / "next").write_text(f"k2:{KEY2.decode()}\n")
    os.replace(tmp_path / "next", path)           # how a mounted Secret changes
    with pytest.raises(PassError, match="unknown_kid"):
        zstalk.workers.verify_pass(PASS, path, now=NOW)


def test_the_sdk_takes_a_mapping_of_keys_and_reads_the_clock_itself():
    fresh = sign_pass(KEYS, UID, "checkout", 10 ** 11 - 1)
    assert zstalk.workers.verify_pass(fresh, {"k1": KEY1.decode()}) == UID
    with pytest.raises(PassError, match="expired"):
        zstalk.workers.verify_pass(sign_pass(KEYS, UID, "checkout", 1), {"k1": KEY1})


def test_the_sdk_docstring_gateway_lets_good_passes_through_and_refuses_the_rest(tmp_path):
    from zstalk.workers import signing as sdk
    code = "\n".join(line[4:] for line in sdk.__doc__.split("(WSGI):\n", 1)[1].splitlines())
    namespace: dict = {}
    exec(code, namespace)
    path = tmp_path / "pass-keys"
    path.write_text(f"k1:{KEY1.decode()}\n")
    fresh = sign_pass(KEYS, UID, "checkout", 10 ** 11 - 1)
    app = namespace["passes_only"](lambda environ, start: [environ["zstalk.task_id"].encode()],
                                   str(path), "checkout")
    statuses = []
    assert app({"HTTP_X_ZSTALK_PASS": fresh}, lambda s, h: statuses.append(s)) == [UID.encode()]
    assert app({}, lambda s, h: statuses.append(s)) == [b"malformed"]
    assert app({"HTTP_X_ZSTALK_PASS": PASS}, lambda s, h: statuses.append(s)) == [b"expired"]
    assert statuses == ["403 Forbidden", "403 Forbidden"]


# -- GET /v1/passes/verify's decisions -------------------------------------------------

def verdict(headers, query=None, now=NOW):
    return check_request(headers, query or {}, KEYS, now)


def test_no_pass_is_401_asking_for_a_bearer_token():
    answer = verdict({"Authorization": "Basic dXNlcjpwdw=="})
    assert (answer.status, answer.headers["WWW-Authenticate"], answer.uid_to_check) == (401, "Bearer", None)
    assert json.loads(answer.body)["error"] == "missing"


def test_a_malformed_pass_is_401_invalid_token():
    answer = verdict({"X-Zstalk-Pass": "zp1.nope"})
    assert answer.status == 401 and answer.headers["WWW-Authenticate"] == 'Bearer error="invalid_token"'
    assert answer.headers["X-Zstalk-Pass-Error"] == "malformed"


def test_a_good_pass_in_either_header_is_a_204_that_still_asks_the_broker():
    for headers in ({"authorization": f"bearer  {PASS} "}, {"X-ZSTALK-PASS": PASS},
                    CIMultiDict([("Authorization", f"Bearer {PASS}"), ("X-Zstalk-Pass", PASS)])):
        answer = verdict(headers, {"function": "checkout"})
        assert (answer.status, answer.body, answer.uid_to_check) == (204, b"", UID)
        assert answer.headers["X-Zstalk-Task-Id"] == UID


def test_two_passes_that_differ_are_malformed():
    other = sign_pass(KEYS, "another", "checkout", EXP)
    for headers in ({"Authorization": f"Bearer {PASS}", "X-Zstalk-Pass": other},
                    CIMultiDict([("X-Zstalk-Pass", PASS), ("X-Zstalk-Pass", other)])):
        assert json.loads(verdict(headers).body)["error"] == "malformed"


@pytest.mark.parametrize("token, query, now, why", [
    (PASS, {}, EXP, "expired"),
    (PASS[:-2] + ("AA" if PASS[-2:] != "AA" else "BA"), {}, NOW, "forged"),
    (PASS, {"function": "refund"}, NOW, "wrong_function"),
    (PASS, {"function": ""}, NOW, "wrong_function"),
    (sign_pass(PassKeys({"old": KEY1}), UID, "checkout", EXP), {}, NOW, "unknown_kid"),
])
def test_a_pass_that_is_no_good_here_is_403_with_its_reason(token, query, now, why):
    answer = verdict({"X-Zstalk-Pass": token}, query, now)
    assert (answer.status, answer.uid_to_check) == (403, None)
    assert json.loads(answer.body) == {"error": why, "message": passes.REASONS[why]}
    assert answer.headers["X-Zstalk-Pass-Error"] == why and answer.headers["Cache-Control"] == "no-store"
    assert token not in answer.body.decode()


def test_the_broker_decides_revocation_and_its_absence_falls_back_to_the_signature():
    pending = verdict({"X-Zstalk-Pass": PASS})
    assert settle(pending, True)[:3] == (204, b"", {"Cache-Control": "no-store", "X-Zstalk-Task-Id": UID,
                                                    "X-Zstalk-Pass-Check": "broker"})
    assert settle(pending, None).headers["X-Zstalk-Pass-Check"] == "offline"
    assert settle(pending, True).uid_to_check is None
    revoked = settle(pending, False)
    assert (revoked.status, json.loads(revoked.body)["error"]) == (403, "revoked")
    refused = verdict({})
    assert settle(refused, True) is refused


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["Authorization", "X-Zstalk-Pass", "Host"]),
                       st.text(max_size=300)), st.dictionaries(st.just("function"), st.text()))
def test_any_headers_and_query_get_a_204_401_or_403(headers, query):
    answer = verdict(headers, query)
    assert answer.status in (204, 401, 403)
